"""The package's shape, read from its own imports: no import circle in sat_core, every module imports only
modules of its layer or the layers below, and the paper's model and its decoding know no world.

The graph holds every ``import`` in every sat_core module, function-level (lazy) ones too, each as an arrow
to the module it names (``from sat_core.x import name`` points at ``sat_core.x``; ``from sat_core import x``
at ``sat_core.x`` when that is a module). ARCHITECTURE.md draws the same layers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sat_core"

# Layers, bottom first: a module may import its own layer and the ones below, never one above. Worlds and
# models are side by side and must not import each other (checked below).
LAYERS = [
    ("foundations", ("sat_core", "sat_core.errors", "sat_core.config", "sat_core.io", "sat_core.paths",
                     "sat_core.precision", "sat_core.allocator", "sat_core.native", "sat_core.cli")),
    ("data", ("sat_core.data",)),
    ("models and worlds", ("sat_core.models", "sat_core.worlds")),
    ("decoding, checkpoints, α on the image", ("sat_core.decoding", "sat_core.checkpoint", "sat_core.regions",
                                               "sat_core.viz", "sat_core.safe_unpickle")),
    ("evaluation", ("sat_core.evaluation",)),
    ("training and benchmarks", ("sat_core.training", "sat_core.benchmarks")),
    ("commands", ("sat_core.caption", "sat_core.train", "sat_core.evaluate", "sat_core.world", "sat_core.transforms",
                  "sat_core.ship", "sat_core.pretrain", "sat_core.convert", "sat_core.bench",
                  "sat_core.prepro", "sat_core.scst")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _target(name: str) -> str | None:
    """The sat_core module an import of ``name`` loads (the longest prefix that is a module)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules():
            return candidate
    return None


@cache
def graph() -> dict[str, set[str]]:
    """module -> the sat_core modules it imports anywhere in its body."""
    edges: dict[str, set[str]] = {}
    for name, path in modules().items():
        found: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {t for a in node.names if (t := _target(a.name))}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x import y: relative to this module's package
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    t = _target(f"{base}.{a.name}") if f"{base}.{a.name}" in modules() else _target(base)
                    if t:
                        found.add(t)
        found.discard(name)
        edges[name] = found
    return edges


def layer_of(name: str) -> int:
    best = max(((len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if name == prefix or name.startswith(prefix + ".")), default=None)
    assert best is not None, f"{name} lies in no layer: add it to LAYERS (and to ARCHITECTURE.md)"
    return best[1]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph()[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_sees_the_imports_it_should():
    """Guards the reader itself: known arrows, lazy and relative ones included, are found."""
    edges = graph()
    assert "sat_core.models.decoder" in edges["sat_core.decoding.beam"] | edges["sat_core.decoding.steps"]
    assert "sat_core.worlds.scenes.captions" in edges["sat_core.worlds.scenes.transforms"]  # a lazy import
    assert "sat_core.native" in edges["sat_core.models.attention_fast"]  # from sat_core import native
    assert len(edges) > 60


def test_no_import_circle_anywhere_in_sat_core():
    assert cycles(graph()) == [], "import circles (modules that import each other, directly or around)"


def test_every_module_imports_only_its_layer_or_the_ones_below():
    wrong = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
             for a, targets in graph().items() for b in targets if layer_of(b) > layer_of(a)]
    assert wrong == [], "\n".join(wrong)


def test_the_paper_s_model_and_decoding_know_no_world_nor_anything_above_them():
    for start in [m for m in modules() if m.startswith(("sat_core.models", "sat_core.decoding"))]:
        above = sorted(m for m in reachable(start) | {start}
                       if m.startswith(("sat_core.worlds", "sat_core.evaluation", "sat_core.training")))
        assert above == [], f"{start} reaches {above}"
    models = [m for m in modules() if m.startswith("sat_core.models")]
    assert not any(m.startswith("sat_core.worlds") for start in models for m in reachable(start))
    assert not any(m.startswith("sat_core.models") for start in modules() if start.startswith("sat_core.worlds")
                   for m in reachable(start))


def test_sat_core_never_imports_the_app():
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("explorer", "streamlit") for n in names), name


BLOCKED = """
import importlib, importlib.abc, pkgutil, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[:2] in (["sat_core", "worlds"], ["sat_core", "evaluation"], ["sat_core", "training"]):
            raise ImportError(f"{name} is blocked: the paper's model and decoding must not need it")
        return None

sys.meta_path.insert(0, Blocked())
import sat_core.models, sat_core.decoding
for package in (sat_core.models, sat_core.decoding):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)

import torch
from sat_core.config import DecodeConfig, ModelConfig
from sat_core.data.vocab import Vocab
from sat_core.decoding import DecodeSession, beam_search, score_caption
from sat_core.models.captioner import Captioner

torch.manual_seed(0)
vocab = Vocab.build([["a", "red", "circle"], ["two", "blue", "stars"]], min_count=1)
cfg = ModelConfig(vocab_size=len(vocab), small_channels=(8, 16, 16), feature_dim=16, embed_dim=16, hidden_dim=32,
                  attn_dim=16, dropout=0.0)
model = Captioner(cfg).eval()
images = torch.randn(2, 3, 112, 112)
hyps = beam_search(model, images, vocab, DecodeConfig(beam_size=2, max_len=5))
score_caption(model, vocab, images[0], hyps[0][0].tokens)
DecodeSession(model, vocab, images[0], DecodeConfig(max_len=3)).run()
print("ok", sorted(m for m in sys.modules if m.startswith("sat_core.")))
"""


def test_the_model_trains_and_decodes_with_the_worlds_evaluation_and_training_blocked():
    """Not only the import lines: every models/ and decoding/ module imported, a beam search, a scored caption and a
    session run, in a process where importing sat_core.worlds, sat_core.evaluation or sat_core.training fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCKED], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split("ok", 1)[1]
    assert "sat_core.worlds" not in loaded and "sat_core.models.attention" in loaded
