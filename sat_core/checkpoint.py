"""Save and load checkpoints as safetensors weights + JSON config. Nothing here ever unpickles.

A checkpoint is a directory::

    model.safetensors   the state dict (fp32, or fp16 to ship small files)
    config.json         {"format": "sat-explorer/1", "model", "vocab", "preprocess", "training", "metrics"}
    metrics.json        optional, written by evaluation
    MODEL_CARD.md       optional

Every write goes to a temporary name next to the target, is fsynced, then renamed into place, so a
crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sat_core.config import DecodeConfig, ModelConfig, OptimConfig, PreprocessConfig, TrainConfig
from sat_core.errors import CheckpointError, RetiredOptionError, SatError
from sat_core.io import atomic_write, fsync_dir, read_tensors, save_tensors_atomic, write_json_atomic
from sat_core.paths import CHECKPOINT_FILES, CONFIG_FILE, WEIGHTS_FILE, find_checkpoint, resolve_checkpoint_path
from sat_core.data.vocab import Vocab

FORMAT = "sat-explorer/1"
METRICS_FILE, CARD_FILE = CHECKPOINT_FILES[2:]
PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt"}


# ---- saving ---------------------------------------------------------------------------------------

def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    *,
    model_config: ModelConfig,
    vocab: Vocab,
    preprocess: PreprocessConfig,
    training: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    model_card: str | None = None,
    extra_json: dict[str, Any] | None = None,
    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write a checkpoint directory atomically, replacing an existing checkpoint there.

    ``dtype=torch.float16`` stores floating tensors in half precision (loading casts them back).
    ``extra_json`` / ``extra_tensors`` ({file name: content}) land in the same atomic swap, e.g. the
    trainer's resumable state, so the weights and that state can never come from different steps.
    """
    directory = Path(directory)
    extra_json, extra_tensors = extra_json or {}, extra_tensors or {}
    extras = {**extra_json, **extra_tensors}
    bad = [n for n in extras if n in CHECKPOINT_FILES or Path(n).name != n or n.startswith(".")]
    if bad or len(extras) != len(extra_json) + len(extra_tensors):
        raise ValueError(f"extra file names must be distinct plain names, not {bad or sorted(extras)}")
    if model_config.vocab_size != len(vocab):
        raise ValueError(
            f"model_config.vocab_size={model_config.vocab_size} but the vocabulary has {len(vocab)} words"
        )
    state = {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    config = {
        "format": FORMAT,
        "model": model_config.to_dict(),
        "vocab": vocab.to_dict(),
        "preprocess": preprocess.to_dict(),
        "training": training or {},
        "metrics": metrics or {},
        "weights_dtype": str(dtype or torch.float32).removeprefix("torch."),
    }
    json.dumps(config)  # fail on a non-JSON value before anything touches the disk
    _check_replaceable(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
        _write_files(staging, state, config, metrics, model_card, extra_json, extra_tensors)
        _swap_into_place(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _write_files(staging: Path, state: dict[str, torch.Tensor], config: dict[str, Any],
                 metrics: dict[str, Any] | None, model_card: str | None, extra_json: dict[str, Any],
                 extra_tensors: dict[str, dict[str, torch.Tensor]]) -> None:
    """Every file of the checkpoint into the staging folder, each written atomically, then the folder synced."""
    # One metadata key: safetensors writes its metadata map in no fixed order, so with two keys the same
    # weights could be saved as different bytes (the stored dtype is each tensor's own, and in config.json).
    save_tensors_atomic(staging / WEIGHTS_FILE, state, {"format": FORMAT})
    write_json_atomic(staging / CONFIG_FILE, config)
    if metrics:
        write_json_atomic(staging / METRICS_FILE, metrics)
    if model_card is not None:
        atomic_write(staging / CARD_FILE, lambda tmp: tmp.write_text(model_card, encoding="utf-8"))
    for name, obj in extra_json.items():
        write_json_atomic(staging / name, obj)
    for name, tensors in extra_tensors.items():
        save_tensors_atomic(staging / name, tensors)
    fsync_dir(staging)


def _check_replaceable(directory: Path) -> None:
    """Only a missing path, an empty folder or an earlier checkpoint may be replaced."""
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise CheckpointError(
            f"Cannot save a checkpoint at {str(directory)!r}: a file or link is there. Choose another path."
        )
    if directory.is_dir() and any(directory.iterdir()) and not (directory / CONFIG_FILE).is_file():
        raise CheckpointError(
            f"Cannot save a checkpoint into {str(directory)!r}: the folder holds other files and no "
            f"{CONFIG_FILE}, and saving replaces the whole folder. Choose a new or empty folder."
        )


def _swap_into_place(staging: Path, directory: Path) -> None:
    """Rename the finished staging folder to ``directory``; an old checkpoint is moved away first."""
    if not directory.exists():
        os.rename(staging, directory)
    else:
        old = directory.parent / f".{directory.name}.{uuid.uuid4().hex[:8]}.old"
        os.rename(directory, old)
        try:
            os.rename(staging, directory)
        except BaseException:
            os.rename(old, directory)  # put the previous checkpoint back
            raise
        fsync_dir(directory.parent)
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(directory.parent)


# ---- reading ------------------------------------------------------------------------------------

def read_checkpoint(
    path: str | Path, *, device: str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read (state dict, config dict) from a checkpoint folder, its model.safetensors or config.json.

    A pickle-based weights file (.pt/.pth/.bin …) is read only with ``torch.load(weights_only=True)``,
    only when it holds plain tensors and only with a config.json beside it; nothing is ever unpickled
    in a way that could run code.
    """
    weights, config_path = _locate(Path(path))
    config = _read_config(config_path)
    if _is_pickle_file(weights):
        return _read_pickle_weights(weights, device), config
    return read_tensors(weights, device=device)[0], config


def _locate(path: Path) -> tuple[Path, Path]:
    """The (weights file, config.json) a user path points at, or a CheckpointError saying why not."""
    if not path.exists():
        raise CheckpointError(
            f"No checkpoint at {str(path)!r}: the path does not exist. Give a checkpoint folder "
            f"(holding {WEIGHTS_FILE} and {CONFIG_FILE}) or the path of its {WEIGHTS_FILE}."
        )
    if path.is_dir():
        missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not (path / name).is_file()]
        if missing:
            others = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
            hint = (f" It holds {', '.join(others)}: pass that file's path to read it as plain tensors."
                    if others else "")
            raise CheckpointError(
                f"{str(path)!r} is not a checkpoint folder: it has no {' and no '.join(missing)}.{hint} "
                f"A checkpoint folder holds {WEIGHTS_FILE} and {CONFIG_FILE}, as written by training."
            )
        return path / WEIGHTS_FILE, path / CONFIG_FILE
    if path.name == CONFIG_FILE:
        weights = path.parent / WEIGHTS_FILE
        if not weights.is_file():
            raise CheckpointError(
                f"{str(path)!r} has no {WEIGHTS_FILE} beside it; copy the whole checkpoint folder."
            )
        return weights, path
    if path.suffix != ".safetensors" and not _is_pickle_file(path):
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint: give a checkpoint folder, its {WEIGHTS_FILE} "
            f"or its {CONFIG_FILE}."
        )
    config = path.parent / CONFIG_FILE
    if not config.is_file():
        raise CheckpointError(
            f"{str(path)!r} has no {CONFIG_FILE} beside it: weights alone do not say which model, "
            "vocabulary and preprocessing they belong to. Copy the whole checkpoint folder."
        )
    return path, config


def _is_pickle_file(path: Path) -> bool:
    """Pickle or torch-zip by content, or a pickle-style suffix on anything not safetensors."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if len(head) >= 9 and head[8:9] == b"{":  # safetensors: u64 header length, then JSON
        return False
    pickle_protocol_2_to_5 = head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")
    if head.startswith(b"PK\x03\x04") or pickle_protocol_2_to_5:  # torch.save zip, or a raw pickle
        return True
    return path.suffix.lower() in PICKLE_SUFFIXES


def _read_pickle_weights(path: Path, device: str) -> dict[str, torch.Tensor]:
    try:
        # weights_only=True: the restricted unpickler refuses any global that is not a tensor type,
        # so a crafted file cannot run code here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "pickle protocol N" notices
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"{str(path)!r} is a pickle-based file that is not plain tensors ({_unpickler_reason(exc)}), "
            "so it was refused without running it: unpickling it could execute arbitrary code. "
            f"Convert it to {WEIGHTS_FILE} with the trusted code that wrote it."
        ) from exc
    plain = isinstance(obj, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )
    if not plain:
        raise CheckpointError(
            f"{str(path)!r} does not hold a plain state dict (names -> tensors); "
            f"convert it to {WEIGHTS_FILE} with the code that wrote it."
        )
    return {k: v.to(device) for k, v in obj.items()}


def _unpickler_reason(exc: Exception) -> str:
    """torch's specific complaint, without its advice to retry with weights_only=False."""
    text = str(exc)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (rest if marker else text).splitlines() if line.strip()]
    if not marker and lines and "weights_only" in lines[0]:
        return type(exc).__name__
    return lines[0][:200] if lines else type(exc).__name__


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{str(path)!r} is not readable JSON ({exc}); the checkpoint's config is damaged. "
            "Copy the checkpoint folder again."
        ) from exc
    found = config.get("format") if isinstance(config, dict) else None
    if found != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} has format {found!r}, not {FORMAT!r}: it is not a SAT Explorer checkpoint "
            "config (or was written by an incompatible version)."
        )
    missing = [k for k in ("model", "vocab", "preprocess") if not isinstance(config.get(k), dict)]
    if missing:
        raise CheckpointError(
            f"{str(path)!r} lacks the section(s) {missing}; the checkpoint's config is damaged."
        )
    return config


# ---- loading a model ----------------------------------------------------------------------------

@dataclass
class LoadedCheckpoint:
    """A ready model in eval mode with everything needed to caption with it."""

    model: nn.Module
    vocab: Vocab
    model_config: ModelConfig  # as built: pretrained=False, since the weights came from the file
    preprocess: PreprocessConfig
    config: dict[str, Any]  # config.json as stored
    metrics: dict[str, Any] | None
    path: Path  # the checkpoint folder

    @property
    def length_norm(self) -> float:
        """The length normalisation its metrics were measured with (DecodeConfig's default if unknown)."""
        value = (self.metrics or {}).get("length_norm")
        return float(value) if isinstance(value, (int, float)) else DecodeConfig().length_norm

    @property
    def beam_size(self) -> int:
        """The beam its metrics were measured with (DecodeConfig's default if unknown)."""
        value = (self.metrics or {}).get("beam")
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else DecodeConfig().beam_size

    @property
    def max_len(self) -> int:
        """The length cap its metrics were measured with (DecodeConfig's default if unknown)."""
        value = (self.metrics or {}).get("max_len")
        usable = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        return value if usable else DecodeConfig().max_len

    @property
    def evaluated(self) -> tuple[int, float, int]:
        """(beam, length normalisation, length cap) of the decoding its metrics were measured with."""
        return self.beam_size, self.length_norm, self.max_len

    @property
    def optim(self) -> OptimConfig | None:
        """The objective's settings it was trained with (None when the checkpoint does not record them)."""
        stored = (self.config.get("training") or {}).get("train_config")
        if not stored:
            return None
        try:
            return TrainConfig.from_dict(stored).optim
        except (SatError, TypeError, KeyError, ValueError):
            return None

    def decode_defaults(self) -> DecodeConfig:
        """DecodeConfig's defaults with the beam, length normalisation and length cap its figures were measured with
        (what the CLI and the explorer start from)."""
        return DecodeConfig(beam_size=self.beam_size, length_norm=self.length_norm, max_len=self.max_len)


def load_checkpoint(
    path: str | Path, *, device: str | torch.device = "cpu", allowed_roots: Sequence[Path] | None = None
) -> LoadedCheckpoint:
    """Build the model a checkpoint describes and fill it with its weights, or raise CheckpointError.

    With ``allowed_roots`` the path is first resolved and refused if it lies outside them; without, a path
    that does not exist is looked up by name (``paths.find_checkpoint``: SAT_CHECKPOINT_DIRS, the shipped ones).
    """
    path = resolve_checkpoint_path(str(path), allowed_roots) if allowed_roots is not None else find_checkpoint(path)
    tensors, config = read_checkpoint(path, device="cpu")
    model_config, vocab, preprocess = _parse_config(config, path)
    # The weights come from the file: never fetch ImageNet weights for the encoder.
    model_config = dataclasses.replace(model_config, pretrained=False)
    try:
        model = _build_model(model_config)
    except Exception as exc:
        raise CheckpointError(f"Cannot build the model described by {str(path)!r}'s config ({exc}).") from exc
    state = _matching_state(model, tensors, path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"The weights in {str(path)!r} do not fit the model ({exc}).") from exc
    model.to(device).eval()
    folder = path if path.is_dir() else path.parent
    metrics = _read_metrics(folder, config)
    return LoadedCheckpoint(model, vocab, model_config, preprocess, config, metrics, folder)


def _build_model(config: ModelConfig) -> nn.Module:
    from sat_core.models.captioner import Captioner

    return Captioner(config)


def _parse_config(config: dict[str, Any], path: Path) -> tuple[ModelConfig, Vocab, PreprocessConfig]:
    try:
        model_config = ModelConfig.from_dict(config["model"])
        vocab = Vocab.from_dict(config["vocab"])
        preprocess = PreprocessConfig.from_dict(config["preprocess"])
    except RetiredOptionError as exc:
        folder = path if path.is_dir() else path.parent
        shipped = (Path(__file__).parent / "presets" / f"{folder.name}.json").is_file()  # a ship preset's name
        message = str(exc).replace("sat_core.ship NAME", f"sat_core.ship {folder.name}") if shipped else str(exc)
        raise CheckpointError(f"{str(path)!r}: {message}") from exc
    except (SatError, TypeError, ValueError) as exc:
        raise CheckpointError(f"The config of {str(path)!r} is invalid: {exc}") from exc
    if model_config.vocab_size != len(vocab):
        raise CheckpointError(
            f"The config of {str(path)!r} says vocab_size={model_config.vocab_size} but its vocabulary "
            f"has {len(vocab)} words: the config is inconsistent. Copy the checkpoint folder again."
        )
    return model_config, vocab, preprocess


def _matching_state(
    model: nn.Module, tensors: dict[str, torch.Tensor], path: Path
) -> dict[str, torch.Tensor]:
    """Check names and shapes against the model, then cast floats to the model's dtypes (fp16 -> fp32)."""
    expected = model.state_dict()
    problems = [f"{k} is missing from the file" for k in expected if k not in tensors]
    problems += [f"{k} is in the file but not in the model" for k in tensors if k not in expected]
    problems += [
        f"{k} is {tuple(tensors[k].shape)} in the file but {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    if problems:
        raise CheckpointError(
            f"The config does not match the weights in {str(path)!r} ({len(problems)} mismatch(es); first: "
            f"{'; '.join(problems[:4])}). config.json and {WEIGHTS_FILE} must come from the same checkpoint."
        )
    return {
        k: t.to(expected[k].dtype) if t.is_floating_point() and expected[k].is_floating_point() else t
        for k, t in tensors.items()
    }


def _read_metrics(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """metrics.json when present (evaluation may rewrite it later), else the metrics saved in config."""
    metrics_file = folder / METRICS_FILE
    if metrics_file.is_file():
        try:
            metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
            if isinstance(metrics, dict):
                return metrics
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            pass  # damaged metrics must not stop the model from loading
    return config.get("metrics") or None
