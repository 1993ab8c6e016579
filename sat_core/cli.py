"""Command-line flags read from the config dataclasses: one flag per field, the field's default shown.

``add_flags(parser, TrainConfig())`` adds ``--lr``, ``--attention``, ``--hard-entropy-weight``,
``--val-beam-size`` … (a section's prefix, then the field's name or its ``flag``); every flag's
default is ``None`` so that only the flags a user gave override a config file, and the help text
shows the dataclass default as ``[default: …]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from sat_core.config import Config, DecodeConfig


def prog(module: str) -> str:
    """The command's name in its usage line: the installed script's (``sat-ship``) when it was started as one,
    else ``python -m <module>``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("sat-") else f"python -m {module}"


def add_flags(parser: argparse.ArgumentParser, config: Config, *, prefix: str = "",
              path: tuple[str, ...] = ()) -> None:
    """One flag per field of ``config`` (recursing into sections); dest is the dotted field path."""
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value, meta = getattr(config, f.name), f.metadata
        if isinstance(value, Config):
            add_flags(parser, value, prefix=prefix + meta.get("prefix", ""), path=(*path, f.name))
            continue
        if meta.get("derived"):
            continue
        names = [meta.get("flag") or f.name, *meta.get("aliases", ())]
        flags = ["--" + (prefix + n).replace("_", "-") for n in names]
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
        kwargs: dict[str, Any] = {"dest": ".".join((*path, f.name)), "default": None,
                                  "metavar": names[0].upper(),
                                  "help": f"{meta.get('help', '')} [default: {shown}]"}
        if isinstance(value, bool):
            kwargs.update(action=argparse.BooleanOptionalAction, metavar=None)
        elif isinstance(value, tuple):
            kwargs.update(type=type(value[0]), nargs="+")
        else:
            kwargs.update(type=type(value), choices=meta.get("choices"))
            if meta.get("choices"):
                kwargs["metavar"] = "{" + ",".join(map(str, meta["choices"])) + "}"
        parser.add_argument(*flags, **kwargs)


def field_paths(config: Config, path: tuple[str, ...] = ()) -> list[str]:
    """Dotted paths of the fields ``add_flags`` makes flags for."""
    paths: list[str] = []
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if isinstance(value, Config):
            paths += field_paths(value, (*path, f.name))
        elif not f.metadata.get("derived"):
            paths.append(".".join((*path, f.name)))
    return paths


def given(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    """The values the user gave on the command line, by dotted path (flags left out are None)."""
    return {p: getattr(args, p) for p in field_paths(config) if getattr(args, p, None) is not None}


def apply(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Nested dict ``values`` with each dotted path in ``changes`` set (lists become tuples later)."""
    out = _copy(values)
    for dotted, value in changes.items():
        node = out
        *parents, last = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
    return out


def _copy(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in values.items()}


def add_decode_flags(parser: argparse.ArgumentParser, defaults: DecodeConfig | None = None) -> None:
    """The DecodeConfig flags every decoding CLI shares (``--beam-size``/``--beam``, ``--max-len`` …)."""
    add_flags(parser, defaults or DecodeConfig(), path=("decode",))


def decoding_follows_checkpoint(parser: argparse.ArgumentParser) -> None:
    """Say in the help of ``--beam``, ``--length-norm`` and ``--max-len`` that, when not given, the checkpoint's own
    value is used (``LoadedCheckpoint.decode_defaults``)."""
    for action in parser._actions:
        if action.dest in ("decode.beam_size", "decode.length_norm", "decode.max_len"):
            text, _, default = (action.help or "").rpartition(" [default:")
            action.help = (f"{text}; when not given, the value the checkpoint's metrics were measured with, "
                           f"else [default:{default}")


def decode_config(args: argparse.Namespace, defaults: DecodeConfig | None = None) -> DecodeConfig:
    """The DecodeConfig the flags of ``add_decode_flags`` describe (SatError for a bad value)."""
    changes = {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("decode.") and v is not None}
    return dataclasses.replace(defaults or DecodeConfig(), **changes)
