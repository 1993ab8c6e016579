"""Import checkpoints written by other implementations into this project's checkpoint format.

    python -m sat_core.convert sgrvinod BEST_checkpoint_coco_5_cap_per_img_5_min_word_freq.pth.tar \\
        WORDMAP_coco_5_cap_per_img_5_min_word_freq.json --out checkpoints/sgrvinod_coco

``sgrvinod``: sgrvinod's a-PyTorch-Tutorial-to-Image-Captioning saves a dict holding whole ``Encoder``
and ``DecoderWithAttention`` modules (a torchvision ResNet without its last two children, average-pooled
to 14×14; ReLU attention, linear f_init, a vector gate f_β of size D and logits = fc(h_t)) plus their
optimizers. The file is read by ``sat_core.safe_unpickle`` (nothing in it is run), the weights are
renamed to this project's ``Captioner`` with the ModelConfig variants that model needs, and the
vocabulary is reordered to <pad> <start> <end> <unk> first (embedding and output rows permuted).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sat_core import cli
from sat_core.checkpoint import save_checkpoint
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.errors import CheckpointError, SatError
from sat_core.models.encoder import FEATURE_DIMS
from sat_core.safe_unpickle import ModuleRecord, flat_state, safe_load
from sat_core.data.vocab import SPECIALS, Vocab

SOURCE_URL = "https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning"
# Blocks per stage (layer1..layer4) and whether they are bottlenecks -> torchvision depth.
RESNETS = {((2, 2, 2, 2), False): 18, ((3, 4, 6, 3), False): 34, ((3, 4, 6, 3), True): 50,
           ((3, 4, 23, 3), True): 101, ((3, 8, 36, 3), True): 152}
FIRST_STAGE = 4  # children of torchvision's ResNet: conv1 bn1 relu maxpool layer1..layer4


@dataclass
class Converted:
    """Everything a checkpoint folder needs, in this project's terms."""

    model_config: ModelConfig
    vocab: Vocab
    state: dict[str, torch.Tensor]  # Captioner state dict
    training: dict[str, Any]  # where it came from: file names, epoch, validation BLEU-4


# ---- the word map ---------------------------------------------------------------------------------

def read_wordmap(path: str | Path, vocab_size: int) -> tuple[Vocab, torch.Tensor]:
    """(our Vocab, perm (V,)) with perm[new id] = the tutorial's id of the same word."""
    path = Path(path)
    if not path.is_file():
        raise SatError(f"No word map at {str(path)!r}: give the WORDMAP_*.json written beside the checkpoint.")
    try:
        wordmap = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SatError(f"{str(path)!r} is not a readable JSON word map ({exc}).") from exc
    if not isinstance(wordmap, dict) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 for i in wordmap.values()):
        raise SatError(f"{str(path)!r} is not a word map: expected a JSON object of word -> id.")
    missing = [w for w in SPECIALS if w not in wordmap]
    if missing:
        raise SatError(f"{str(path)!r} lacks {missing}: it is not a word map written by the tutorial.")
    if sorted(wordmap.values()) != list(range(vocab_size)):
        raise SatError(
            f"{str(path)!r} has {len(wordmap)} words (ids {min(wordmap.values())}..{max(wordmap.values())}) but "
            f"the checkpoint's embedding has {vocab_size} rows: this word map belongs to another checkpoint. "
            "Use the WORDMAP_<name>.json whose <name> matches BEST_checkpoint_<name>.pth.tar."
        )
    others = sorted((i, w) for w, i in wordmap.items() if w not in SPECIALS)
    vocab = Vocab([*SPECIALS, *(w for _, w in others)])
    perm = torch.tensor([wordmap[w] for w in vocab.itos])  # (V,)
    return vocab, perm


# ---- the modules ------------------------------------------------------------------------------------

def _state(obj: Any, what: str, path: Path) -> dict[str, torch.Tensor]:
    try:
        state = flat_state(obj)
    except CheckpointError as exc:
        raise CheckpointError(f"{str(path)!r}: the {what!r} entry is not usable ({exc}).") from exc
    if state and all(k.startswith("module.") for k in state):  # saved from nn.DataParallel
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def resnet_name(encoder: dict[str, torch.Tensor]) -> str:
    """resnet18 … resnet152 from the encoder's keys (blocks per stage, bottleneck or basic blocks)."""
    blocks = []
    for stage in range(FIRST_STAGE, FIRST_STAGE + 4):
        found = {int(m.group(1)) for k in encoder if (m := re.match(rf"resnet\.{stage}\.(\d+)\.", k))}
        blocks.append(len(found))
    bottleneck = any(re.match(rf"resnet\.{FIRST_STAGE}\.0\.conv3\.", k) for k in encoder)
    depth = RESNETS.get((tuple(blocks), bottleneck))
    if depth is None:
        raise CheckpointError(
            f"The encoder is not a torchvision ResNet (blocks per stage {blocks}, "
            f"{'bottleneck' if bottleneck else 'basic'} blocks); only ResNet encoders can be converted."
        )
    return f"resnet{depth}"


def _pool_grid(encoder: Any) -> int:
    """The side of the encoder's adaptive pool (the tutorial's encoded_image_size, 14 by default)."""
    if isinstance(encoder, ModuleRecord):
        pool = encoder.children().get("adaptive_pool")
        size = pool.state.get("output_size") if isinstance(pool, ModuleRecord) else None
        size = size if size is not None else encoder.state.get("enc_image_size", 14)
        sides = set(size) if isinstance(size, (tuple, list)) else {size}
        if len(sides) != 1 or not all(isinstance(s, int) and s > 0 for s in sides):
            raise CheckpointError(f"The encoder pools to {size!r}; only a square grid can be converted.")
        return sides.pop()
    return 14


def _dropout(decoder: Any) -> float:
    if isinstance(decoder, ModuleRecord):
        layer = decoder.children().get("dropout")
        p = layer.state.get("p") if isinstance(layer, ModuleRecord) else None
        if isinstance(p, float) and 0 <= p < 1:
            return p
    return 0.5


def _decoder_state(dec: dict[str, torch.Tensor], perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tutorial's decoder weights under this project's names, vocabulary rows in our order."""
    take = dec.pop
    enc_att_w, enc_att_b = take("attention.encoder_att.weight"), take("attention.encoder_att.bias")
    dec_att_w, dec_att_b = take("attention.decoder_att.weight"), take("attention.decoder_att.bias")
    lstm = {name: take(f"decode_step.{name}") for name in ("weight_ih", "weight_hh")}
    n = lstm["weight_hh"].shape[1]
    for name in ("bias_ih", "bias_hh"):  # an LSTMCell built with bias=False has none
        lstm[name] = take(f"decode_step.{name}", torch.zeros(4 * n))
    return {
        "decoder.embed.weight": take("embedding.weight")[perm],  # (V, m), rows in our word order
        "decoder.init_h.0.weight": take("init_h.weight"), "decoder.init_h.0.bias": take("init_h.bias"),
        "decoder.init_c.0.weight": take("init_c.weight"), "decoder.init_c.0.bias": take("init_c.bias"),
        # relu(W_e a + b_e + W_d h + b_d): both biases are constant over regions, so W_a carries their sum.
        "decoder.attention.W_a.weight": enc_att_w, "decoder.attention.W_a.bias": enc_att_b + dec_att_b,
        "decoder.attention.W_h.weight": dec_att_w,
        "decoder.attention.w.weight": take("attention.full_att.weight"),
        "decoder.attention.w.bias": take("attention.full_att.bias"),
        "decoder.f_beta.weight": take("f_beta.weight"), "decoder.f_beta.bias": take("f_beta.bias"),
        **{f"decoder.lstm.{name}": t for name, t in lstm.items()},
        "decoder.L_o.weight": take("fc.weight")[perm], "decoder.L_o.bias": take("fc.bias")[perm],  # (V, n)
    }


def _model_config(encoder_name: str, dec: dict[str, torch.Tensor], pool_grid: int, dropout: float) -> ModelConfig:
    attn_dim, feature_dim = dec["attention.encoder_att.weight"].shape
    hidden_dim = dec["attention.decoder_att.weight"].shape[1]
    vocab_size, embed_dim = dec["embedding.weight"].shape
    if feature_dim != FEATURE_DIMS[encoder_name]:
        raise CheckpointError(f"The decoder reads {feature_dim} features but a {encoder_name} gives "
                              f"{FEATURE_DIMS[encoder_name]}: encoder and decoder do not belong together.")
    gate_rows = dec["f_beta.weight"].shape[0]
    if gate_rows not in (1, feature_dim):
        raise CheckpointError(f"f_beta has {gate_rows} outputs; expected {feature_dim} (a vector gate) or 1.")
    return ModelConfig(
        encoder=encoder_name, pretrained=False, finetune_encoder=False, feature_dim=feature_dim,
        vocab_size=vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, attn_dim=attn_dim,
        attention="soft", gate=True, gate_size="vector" if gate_rows > 1 else "scalar", dropout=dropout,
        pool_grid=pool_grid, deep_output=False, attention_activation="relu", init_activation="none",
    )


def convert_sgrvinod(checkpoint: str | Path, wordmap: str | Path) -> Converted:
    """Read a BEST_checkpoint_*.pth.tar + WORDMAP_*.json pair (never running the file's code)."""
    path = Path(checkpoint)
    if not Path(wordmap).is_file():  # say so before reading a large checkpoint
        read_wordmap(wordmap, 0)
    obj = safe_load(path)
    if not isinstance(obj, dict) or not {"encoder", "decoder"} <= set(obj):
        keys = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{str(path)!r} holds {keys}, not the tutorial's dict with 'encoder' and 'decoder'.")
    enc, dec = _state(obj["encoder"], "encoder", path), _state(obj["decoder"], "decoder", path)
    encoder_name = resnet_name(enc)
    try:
        config = _model_config(encoder_name, dec, _pool_grid(obj["encoder"]), _dropout(obj["decoder"]))
        vocab, perm = read_wordmap(wordmap, config.vocab_size)
        state = {f"encoder.body.{k.removeprefix('resnet.')}": v for k, v in enc.items()}
        state.update(_decoder_state(dec, perm))
    except KeyError as exc:
        raise CheckpointError(f"{str(path)!r}'s decoder has no {exc}: it is not the tutorial's "
                              "DecoderWithAttention.") from exc
    if dec:
        raise CheckpointError(f"{str(path)!r}'s decoder has weights the tutorial's model does not "
                              f"({sorted(dec)[:4]}); converting it would change what it computes.")
    training = {"converted_from": SOURCE_URL, "source_checkpoint": path.name, "source_wordmap": Path(wordmap).name,
                **{k: v for k, v in obj.items() if k in ("epoch", "epochs_since_improvement", "bleu-4")
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}}
    return Converted(config, vocab, state, training)


# ---- writing ---------------------------------------------------------------------------------------

def build_model(converted: Converted) -> torch.nn.Module:
    """A Captioner holding the converted weights (CheckpointError if they do not fit)."""
    from sat_core.models.captioner import Captioner

    model = Captioner(converted.model_config)
    expected = model.state_dict()
    state = dict(converted.state)
    for key, value in expected.items():  # torch < 0.4.1 saved no batch-norm step counters
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros_like(value)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"The converted weights do not fit the model ({str(exc)[:400]}).") from exc
    return model.eval()


def model_card(converted: Converted, preprocess: PreprocessConfig) -> str:
    cfg, info = converted.model_config, converted.training
    return "\n".join([
        "# Converted from sgrvinod's a-PyTorch-Tutorial-to-Image-Captioning", "",
        f"- Source: `{info['source_checkpoint']}` + `{info['source_wordmap']}` ({SOURCE_URL})",
        f"- Epoch {info.get('epoch', '?')}, validation BLEU-4 {info.get('bleu-4', '?')} (as the tutorial "
        "measured it, on its own validation split)",
        f"- Encoder: {cfg.encoder}, average-pooled to {cfg.pool_grid}×{cfg.pool_grid}; decoder: LSTM of "
        f"{cfg.hidden_dim}, {cfg.gate_size} gate, ReLU attention, logits from h_t (no deep output layer)",
        f"- Vocabulary: {cfg.vocab_size} words; input {preprocess.image_size} px, ImageNet normalisation "
        "(the tutorial resizes to a square without cropping; here the short side is resized and centre-cropped)",
        "",
    ])


def write_converted(converted: Converted, out: str | Path, *, image_size: int = 256,
                    dtype: torch.dtype | None = None) -> Path:
    """Write a checkpoint folder (sat_core.checkpoint format) from a converted model."""
    preprocess = PreprocessConfig(image_size=image_size)  # ImageNet mean/std are the defaults
    model = build_model(converted)
    return save_checkpoint(out, model, model_config=converted.model_config, vocab=converted.vocab,
                           preprocess=preprocess, training=converted.training, dtype=dtype,
                           model_card=model_card(converted, preprocess))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.convert"), description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    s = sub.add_parser("sgrvinod", help="sgrvinod's a-PyTorch-Tutorial-to-Image-Captioning",
                       description="Convert BEST_checkpoint_*.pth.tar + WORDMAP_*.json (read without running code).")
    s.add_argument("checkpoint", metavar="CKPT", help="BEST_checkpoint_*.pth.tar (or checkpoint_*.pth.tar)")
    s.add_argument("wordmap", metavar="WORDMAP", help="the WORDMAP_*.json of the same dataset")
    s.add_argument("--out", required=True, help="checkpoint folder to write")
    s.add_argument("--image-size", type=int, default=256, help="input side in px [default: 256, as the tutorial]")
    s.add_argument("--half", action="store_true", help="store fp16 weights (half the size)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        converted = convert_sgrvinod(args.checkpoint, args.wordmap)
        out = write_converted(converted, args.out, image_size=args.image_size,
                              dtype=torch.float16 if args.half else None)
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cfg = converted.model_config
    print(f"wrote {out}: {cfg.encoder} encoder pooled to {cfg.pool_grid}×{cfg.pool_grid}, "
          f"{cfg.vocab_size} words. Try: python -m sat_core.caption --checkpoint {out} IMAGE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
