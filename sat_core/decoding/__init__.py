"""Decoding: every caption the project shows comes from here — the CLI, evaluation, validation during
training and the explorer call these functions, which share the decoder's one ``step``.

- ``beam``: batched beam search, THE decode loop (greedy is beam 1); seeded hard-attention samples.
- ``scoring``: teacher forcing — a given caption's log p, α and β; the best reference; sampled paths.
- ``session``: one image word by word, with going back and forcing words.
- ``steps``: what the three share around ``step`` (inputs, banned words, interventions, exact log p).

Decoding knows the paper's model and nothing of any world (tests/test_architecture.py holds that).
"""

from sat_core.decoding.beam import Hypothesis, beam_search, sample_hard
from sat_core.decoding.scoring import (
    ReferenceScore, SampledPaths, ScoredCaption, best_reference, check_search_errors, sample_locations, score_caption,
)
from sat_core.decoding.session import DecodeSession, StepView
from sat_core.decoding.steps import Intervention, encode_images, pick_device

__all__ = [
    "DecodeSession", "Hypothesis", "Intervention", "ReferenceScore", "SampledPaths", "ScoredCaption", "StepView",
    "beam_search", "best_reference", "check_search_errors", "encode_images", "pick_device", "sample_hard",
    "sample_locations", "score_caption",
]
