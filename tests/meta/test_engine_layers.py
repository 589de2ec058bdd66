"""The engine reads top-down (issue 9 item 6): `engine/generate.py` checks arguments and
hands the requests to the scheduler (`engine/serving.py`), which drives either decoder; nothing below it imports it back, and no module hides an import inside a function to
break a cycle. Checked on the source, so a new cycle fails here before it fails at import time."""

from __future__ import annotations

import ast
import pathlib

ENGINE = pathlib.Path(__file__).resolve().parents[2] / "specverify" / "engine"


def _imports(path: pathlib.Path) -> tuple[set[str], list[str]]:
    """(modules imported at the top level, modules imported inside a function or class)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        else:
            continue
        if node in tree.body:
            top |= names
        else:
            nested += sorted(names)
    return top, nested


def test_no_engine_module_imports_the_dispatcher():
    for path in sorted(ENGINE.glob("*.py")):
        if path.name in ("generate.py", "__init__.py"):
            continue
        top, nested = _imports(path)
        assert "specverify.engine.generate" not in top | set(nested), f"{path.name} imports engine/generate.py"


def test_engine_modules_import_at_the_top_only():
    for path in sorted(ENGINE.glob("*.py")):
        _, nested = _imports(path)
        engine_nested = [m for m in nested if m.startswith("specverify")]
        assert not engine_nested, f"{path.name} imports {engine_nested} inside a function (a hidden import cycle?)"


def test_the_dispatcher_reaches_both_decoders_through_the_scheduler():
    top, _ = _imports(ENGINE / "generate.py")
    assert "specverify.engine.serving" in top
    top, _ = _imports(ENGINE / "serving.py")
    assert {"specverify.engine.speculative", "specverify.engine.target_only"} <= top
