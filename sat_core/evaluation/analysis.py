"""Summaries of ``evaluation.evaluate`` records for error analysis: per word kind and per slice of images.

The records themselves are computed in ``evaluation.evaluate`` (the one place); this module only groups them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sat_core.evaluation.confidence import ConfidenceReference
from sat_core.evaluation.evaluate import NAMING_KINDS, correctness_by_kind, mean_of_known


def word_type_correctness(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table rows per word kind over ``evaluation.evaluate`` records: words matched to one object, mean α
    share on it, mean uniform baseline, mean α entropy against the mean entropy of the objects' masks (α spread
    over the object as its mask covers the cells), mean α shares on the scene's other objects and on the background
    beside the named one (None in records from before they were kept), and whether the kind enters the headline
    attention correctness."""
    by_kind = correctness_by_kind([w for r in records for w in r.get("words") or []])
    return [{"kind": kind, "words": row["n"], "attention_on_object": row["correctness"],
             "uniform_baseline": row["baseline"], "alpha_entropy": row["entropy"],
             "mask_entropy": row["mask_entropy"], "on_other_objects": row["on_other_objects"],
             "beside_object": row["beside_object"], "in_attention_correctness": kind in NAMING_KINDS}
            for kind, row in by_kind.items()]


@dataclass
class Slice:
    name: str
    records: list[Mapping[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "slice": self.name, "images": len(self.records),
            "CIDEr": mean_of_known([r["scores"].get("CIDEr") for r in self.records]),
            "BLEU-4": mean_of_known([r["scores"].get("BLEU-4") for r in self.records]),
            "attention_correctness": mean_of_known([r.get("attention_correctness") for r in self.records]),
        }


def slice_metrics(records: Sequence[Mapping[str, Any]],
                  reference: ConfidenceReference | None = None) -> list[dict[str, Any]]:
    """Mean per-image CIDEr, BLEU-4 and attention correctness over slices: all images, no error, the captions the
    model is unsure of and the others (with a ``confidence.ConfidenceReference``), each error label, and each
    number of objects in the scene."""
    slices = [Slice("all images", list(records)),
              Slice("no error", [r for r in records if not r.get("errors")])]
    if reference is not None:
        scored = [r for r in records if r.get("logprob") is not None]
        slices += [Slice("unsure captions", [r for r in scored if reference.unsure(r["logprob"])]),
                   Slice("the other captions", [r for r in scored if not reference.unsure(r["logprob"])])]
    labels = sorted({label for r in records for label in r.get("errors") or []})
    slices += [Slice(f"error: {label}", [r for r in records if label in (r.get("errors") or [])]) for label in labels]
    counts = sorted({r["n_objects"] for r in records if r.get("n_objects") is not None})
    slices += [Slice(f"{n} object{'s' * (n != 1)}", [r for r in records if r.get("n_objects") == n]) for n in counts]
    return [s.summary() for s in slices if s.records]


def count_table(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """How the captions' scored counts (``scenes_grounding.CountItem``) compare with the scenes: one row
    per number of identical objects in the scene, one column per thing said ("1" for a group named one
    object at a time or in part, "2"…, "plural" for a plural without a number), and the share right.
    Empty where the records hold no counts (the shapes world, or records written before counts were kept)."""
    items = [c for r in records for c in ((r.get("grounding") or {}).get("counts") or [])]
    said = lambda c: "plural" if c["said"] is None else str(c["said"])  # noqa: E731
    columns = sorted({said(c) for c in items}, key=lambda k: (k == "plural", k))
    rows = []
    for n in sorted({c["scene"] for c in items}):
        here = [c for c in items if c["scene"] == n]
        row: dict[str, Any] = {"in the scene": n, "counts scored": len(here)}
        row.update({f"said {k}": sum(said(c) == k for c in here) for k in columns})
        row["right"] = sum(c["right"] for c in here) / len(here)
        rows.append(row)
    return rows


def count_table_by_groups(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Count accuracy by the kind of scene: one row per list of group sizes ("2 + 1": two identical objects
    and one other), with its scenes, the counts scored in their captions and the share right. A scene of
    one pair alone counts well and "2 + 1" badly when the model knows how many but not of which kind.
    Rows by counts scored, most first; empty where the records hold no counts or no scene groups."""
    by_kind: dict[str, list[int]] = {}  # "2 + 1" -> [scenes, counts scored, right]
    for r in records:
        g = r.get("grounding") or {}
        if not g.get("groups") or "counts" not in g:
            continue
        row = by_kind.setdefault(" + ".join(map(str, g["groups"])), [0, 0, 0])
        row[0] += 1
        row[1] += len(g["counts"])
        row[2] += sum(c["right"] for c in g["counts"])
    rows = [{"the scene's groups": kind, "scenes": n, "counts scored": scored, "right": right / scored}
            for kind, (n, scored, right) in by_kind.items() if scored]
    return sorted(rows, key=lambda row: (-row["counts scored"], row["the scene's groups"]))
