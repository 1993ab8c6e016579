"""Modules of a few hundred lines, functions of a screen: no module of sat_core/ or explorer/ over 600 lines,
no function over 60 (from its ``def`` to its last line, docstring included).

    python -m tests.test_code_size      prints every module and function over the limits (nothing: none)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("sat_core", "explorer")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def offenders() -> list[str]:
    """``path: N lines`` per module and ``path:line name(): N lines`` per function over the limits."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            where = path.relative_to(ROOT)
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                found.append(f"{where}: {lines} lines (module limit {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{where}:{node.lineno} {node.name}(): {length} lines "
                                     f"(function limit {MAX_FUNCTION_LINES})")
    return found


def test_no_module_or_function_over_the_limits():
    found = offenders()
    assert not found, "split these into named steps or modules:\n" + "\n".join(found)


if __name__ == "__main__":
    print("\n".join(offenders()) or f"none over {MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function")
