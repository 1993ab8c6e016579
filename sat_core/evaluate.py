"""Evaluate a checkpoint on a dataset split: caption metrics, grounded accuracy, attention statistics.

    python -m sat_core.evaluate --checkpoint checkpoints/shapes_soft --data data/world/dataset.json \
        --images data/world --split test --beam 3 --out metrics.json [--records records.json]
    python -m sat_core.evaluate --checkpoint runs/mine/best --data data/scenes/dataset.json --images data/scenes \
        --split val --generalisation data/scenes_val_suite --no-shifted --out val.json   # choosing on validation

The work is ``sat_core.evaluation.evaluate.evaluate`` (and ``evaluation.generalisation`` for the sets off the
scenes generator); this module reads the flags, runs it and prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from typing import Any

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.checkpoint import load_checkpoint
from sat_core.data.karpathy import load_karpathy
from sat_core.decoding import pick_device
from sat_core.errors import SatError
from sat_core.evaluation import generalisation
from sat_core.evaluation.evaluate import evaluate
from sat_core.evaluation.metrics import TOKENIZERS, coco_results
from sat_core.io import write_json_atomic


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A compact human summary of ``evaluate``'s result."""
    lines = [f"{result['n_images']} {result['split']} images, beam {result['beam']} ({result['checkpoint']})"
             + (f", {len(result['skipped'])} skipped" if result["skipped"] else "")]
    lines.append("  ".join(f"{k} {v:.3f}" for k, v in result["corpus"].items()))
    g = result["grounded"]
    if g:
        keys = [k for k in ("precision", "recall", "category_accuracy", "colour_accuracy", "shape_accuracy",
                            "size_accuracy", "count_accuracy", "relation_accuracy", "place_accuracy") if k in g]
        lines.append("grounded: " + "  ".join(f"{k.removesuffix('_accuracy')} {_fmt(g.get(k))}" for k in keys))
        if "relations_stated" in g:
            lines.append(f"relations stated in {g['relations_stated']:.0%} of captions")
    a = result["attention"]
    if a.get("correctness") is not None:
        lines.append(f"attention correctness {_fmt(a['correctness'])} vs uniform {_fmt(a['baseline'])} "
                     f"({_fmt(a['ratio'])}x) over {a['n_grounded_words']} words"
                     + (f"; the most any α on this grid could reach: {_fmt(a['ceiling'])}" if a.get("ceiling") else ""))
    if a.get("on_other_objects") is not None:
        rest = 1 - a["correctness"] - a["on_other_objects"] - a["beside_object"]
        lines.append(f"the rest of α on those words: on the scene's other objects {_fmt(a['on_other_objects'])}, "
                     f"on the background beside the named one {_fmt(a['beside_object'])}, farther {_fmt(rest)}")
    lines.append(f"α entropy per word {_fmt(a['entropy_nats'])} nats "
                 f"({_fmt(a['entropy_normalised'])} of log L, L={a['regions']}) over {a['n_words']} words")
    if a.get("mask_entropy") is not None:
        lines.append(f"α entropy on those words {_fmt(a['naming_entropy'])} nats; α spread over each named object "
                     f"as its mask covers the cells: {_fmt(a['mask_entropy'])} nats")
    if result["beta_by_kind"]:
        lines.append("β by kind: " + "  ".join(f"{k} {v['mean']:.3f}" for k, v in result["beta_by_kind"].items()))
    search = result.get("search")
    if search:
        worst = sorted(search["by_label"].items(), key=lambda kv: -kv[1]["n"])[:4]
        lines.append(f"search errors (a reference outscores the caption): {_fmt(search['search_error_rate'])} of "
                     f"{search['n']} images; by label: "
                     + "  ".join(f"{k} {_fmt(v['search_error_rate'])} (n={v['n']})" for k, v in worst))
    unsure = result.get("confidence")
    if unsure and unsure["unsure"] is not None:
        lines.append(f"unsure captions (log p under {unsure['threshold']:.2f}, the {unsure['share']:.0%} mark of the "
                     f"checkpoint's validation captions): {unsure['unsure']:.1%} of {unsure['n']}; mean CIDEr "
                     f"{_fmt(unsure['CIDEr_unsure'])} against {_fmt(unsure['CIDEr_others'])} for the others")
    lines += [f"note: {n}" for n in result["notes"]]
    return lines


@contextlib.contextmanager
def _progress_bar():
    """A tqdm bar on a terminal's stderr, fed by ``decode_images``' progress callback."""
    from tqdm import tqdm

    with tqdm(unit="image", desc="decoding", disable=not sys.stderr.isatty(), leave=False) as bar:
        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.evaluate"), description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("--data", required=True, help="Karpathy-format dataset JSON")
    p.add_argument("--images", required=True, help="folder holding the dataset's images")
    p.add_argument("--split", default="test")
    cli.add_decode_flags(p)
    cli.decoding_follows_checkpoint(p)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the split's first N images")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (its JVM takes ~12 s to start)")
    p.add_argument("--tokenizer", choices=TOKENIZERS, default="plain",
                   help="plain: score the captions as the vocabulary writes them (lowercase words); ptb: run the COCO "
                        "server's PTBTokenizer (Java) on captions and references first, for figures comparable with "
                        "COCO server numbers [default: plain]")
    p.add_argument("--results-file", metavar="PATH",
                   help="also write the captions as the COCO evaluation server takes them: "
                        "[{\"image_id\": …, \"caption\": …}], one per image (image_id: the dataset's cocoid/imgid)")
    p.add_argument("--out", required=True, help="where to write the metrics JSON")
    p.add_argument("--records", help="also write the per-image records to this JSON file")
    p.add_argument("--search-errors", action="store_true",
                   help="also score each image's references under the model: a reference scoring above the "
                        "caption is a search error, else the caption's mistakes are the model's (slower)")
    p.add_argument("--card", action="store_true",
                   help="also write metrics.json, eval_records.json and MODEL_CARD.md into the checkpoint folder")
    suite, shifted = generalisation.DEFAULT_SUITE, generalisation.DEFAULT_SHIFTED
    p.add_argument("--generalisation", nargs="?", const=str(suite), metavar="SUITE_DIR",
                   help="also evaluate the shifted split and each set under SUITE_DIR, every SUITE_DIR/NAME/"
                        "dataset.json (python -m sat_core.transforms writes the transformed ones, python -m "
                        f"sat_core.world --shifted-validation a shifted one; default {suite}): the output's "
                        "\"generalisation\", one row per set")
    p.add_argument("--shifted", metavar="PATH",
                   help=f"the shifted split's dataset.json for the generalisation figures (default {shifted}, skipped "
                        "if absent)")
    p.add_argument("--no-shifted", action="store_true",
                   help="leave the shifted split out of the generalisation figures: for a suite written over the "
                        "validation scenes (python -m sat_core.transforms --split val), where choices are made "
                        "without reading the sets kept for measuring")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()
    try:
        if args.limit is not None and args.limit < 1:
            raise SatError(f"--limit must be at least 1, not {args.limit}.")
        if args.no_shifted and args.shifted is not None:
            raise SatError("--no-shifted leaves the shifted split out, so --shifted has nothing to do; pass one of them.")
        cli.decode_config(args)  # bad values are reported before the checkpoint is read
        loaded = load_checkpoint(args.checkpoint, device=pick_device(args.device))
        cfg = cli.decode_config(args, loaded.decode_defaults())
        data = load_karpathy(args.data, args.images)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _progress_bar() as progress:
                result = evaluate(loaded, data, args.split, cfg, limit=args.limit, meteor=not args.no_meteor,
                                  batch_size=args.batch_size, progress=progress, search_errors=args.search_errors,
                                  tokenizer=args.tokenizer)
            if args.generalisation is not None or args.shifted is not None:
                result["generalisation"] = generalisation.report(
                    loaded, cfg, result, data, suite_dir=args.generalisation, shifted=args.shifted, limit=args.limit,
                    batch_size=args.batch_size, skip_shifted=args.no_shifted)
        write_json_atomic(args.out, result)
        if args.records:
            write_json_atomic(args.records, result["records"])
        if args.results_file:
            write_json_atomic(args.results_file, coco_results({r["image_id"]: r["caption"] for r in result["records"]}))
        if args.card:
            from sat_core.evaluation.card import write_card

            written = write_card(loaded, result)
    except (SatError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    for message in result["skipped"]:
        print(f"skipped: {message}", file=sys.stderr)
    print("\n".join(summary_lines(result)))
    if "generalisation" in result:
        print("\n".join(generalisation.table_lines(result["generalisation"])))
    written_files = [args.out, *(f for f in (args.records, args.results_file) if f)]
    print(f"wrote {', '.join(written_files)}")
    if args.card:
        print(f"wrote {', '.join(written)} into {loaded.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
