"""The unsure flag's reference: the quantile of the validation captions' log-probabilities, kept in a
checkpoint and read back, refused when malformed."""

from __future__ import annotations

import numpy as np
import pytest

from sat_core.errors import SatError
from sat_core.evaluation.confidence import (
    UNSURE_SHARE, ConfidenceReference, kept_reference, stored_reference, summary,
)
from sat_core.evaluation.generalisation import warning_figures


def test_the_mark_flags_the_share_of_the_validation_captions_it_was_measured_on():
    logprobs = -np.arange(1, 201, dtype=float) / 10  # −0.1 … −20.0
    ref = ConfidenceReference.from_logprobs(logprobs)
    assert ref.share == UNSURE_SHARE and ref.captions == 200 and ref.split == "val"
    assert sum(ref.unsure(x) for x in logprobs) == 20
    assert ref.unsure(-25.0) and not ref.unsure(-1.0)
    assert ConfidenceReference.from_logprobs([-1.0, float("nan"), -3.0], share=0.5).captions == 2


def test_no_caption_no_reference():
    with pytest.raises(SatError, match="at least one validation caption"):
        ConfidenceReference.from_logprobs([float("-inf")])


def test_a_kept_reference_reads_back_and_a_malformed_one_is_refused():
    ref = ConfidenceReference.from_logprobs([-3.0, -4.0, -9.0], share=0.2, split="dev")
    assert ConfidenceReference.from_dict(ref.to_dict()) == ConfidenceReference(round(ref.threshold, 4), 0.2, 3, "dev")
    assert stored_reference({"training": {"confidence": ref.to_dict()}}).split == "dev"
    assert stored_reference({"training": {}}) is None and stored_reference({}) is None
    for bad in ({"threshold": "high", "share": 0.1, "captions": 3}, {"share": 0.1, "captions": 3}, [1, 2],
                {"threshold": float("nan"), "share": 0.1, "captions": 3},
                {"threshold": -4.0, "share": 1.5, "captions": 3}, {"threshold": -4.0, "share": 0.1, "captions": 0}):
        with pytest.raises(SatError, match="package the checkpoint again"):
            stored_reference({"training": {"confidence": bad}})


def test_the_unsure_figures_use_their_own_names():
    records = [{"image_id": i, "grounding": {"recall": r, "precision": 1.0}} for i, r in enumerate((1.0, 0.5, 0.0))]
    figures = warning_figures({0: False, 1: True, 2: False}, records, "unsure")
    assert figures == {"unsure": pytest.approx(1 / 3), "erring": pytest.approx(2 / 3),
                       "unsure_erring": pytest.approx(1 / 2), "unsure_right": 0.0}


def test_the_summary_compares_the_cider_of_the_unsure_captions_with_the_others():
    records = [{"logprob": lp, "scores": {"CIDEr": c}}
               for lp, c in ((-1.0, 3.0), (-9.0, 0.5), (-8.0, 1.5), (-2.0, 2.0))]
    figures = summary(records, ConfidenceReference(-5.0, 0.1, 400))
    assert figures == {"threshold": -5.0, "share": 0.1, "n": 4, "unsure": 0.5, "CIDEr_unsure": 1.0,
                       "CIDEr_others": 2.5}
    assert summary(records, None) is None
    assert summary(records, ConfidenceReference(-50.0, 0.1, 400))["CIDEr_unsure"] is None
    assert kept_reference({"training": {"confidence": {"threshold": "x"}}}) is None
