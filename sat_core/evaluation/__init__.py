"""Evaluation: caption metrics, the evaluation records of a split, grounding, error analysis, model cards."""
