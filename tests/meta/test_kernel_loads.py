"""Every masked `tl.load` of the Triton kernels names the value of its masked lanes.

A load with `mask=` and no `other=` leaves the masked lanes undefined in Triton (the original
SGLang naive-EAGLE kernel summed such lanes into its prefix sum); the interpreter happens to give
zeros, so no CPU test would notice. This test reads every file under specverify/kernels with `ast`
and names each offending call as file:line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernels

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "specverify" / "kernels"


def _language_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(module aliases of triton.language, names bound to triton.language.load itself)."""
    modules, loads = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "triton.language" and alias.asname:
                    modules.add(alias.asname)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if node.module == "triton" and alias.name == "language":
                    modules.add(alias.asname or "language")
                elif node.module == "triton.language" and alias.name == "load":
                    loads.add(alias.asname or "load")
    return modules, loads


def _is_load(call: ast.Call, modules: set[str], loads: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "load":
        return (isinstance(f.value, ast.Name) and f.value.id in modules) or (
            isinstance(f.value, ast.Attribute) and f.value.attr == "language"
            and isinstance(f.value.value, ast.Name) and f.value.value.id == "triton")
    return isinstance(f, ast.Name) and f.id in loads


def _argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    """The expression passed for `name` (keyword, or positionally at `position` of
    tl.load(pointer, mask, other, ...)); None when absent or passed as the literal None."""
    for kw in call.keywords:
        if kw.arg == name:
            value = kw.value
            break
    else:
        value = call.args[position] if len(call.args) > position else None
    if isinstance(value, ast.Constant) and value.value is None:
        return None
    return value


def masked_loads_without_other(source: str, filename: str) -> list[str]:
    """'file:line' of each triton.language.load call with a mask and no `other`."""
    tree = ast.parse(source, filename=filename)
    modules, loads = _language_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_load(node, modules, loads):
            if _argument(node, "mask", 1) is not None and _argument(node, "other", 2) is None:
                found.append(f"{filename}:{node.lineno}")
    return found


def _kernel_files() -> list[Path]:
    return sorted(KERNELS.rglob("*.py"))


def test_every_masked_kernel_load_names_its_other_value():
    offenders = []
    for path in _kernel_files():
        offenders += masked_loads_without_other(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not offenders, ("tl.load with mask= but no other= (masked lanes are undefined in Triton): "
                           + ", ".join(offenders))


def test_the_scan_sees_the_kernels_loads():
    """Not vacuous: the kernels' masked loads are found (each with its other=)."""
    count = 0
    for path in _kernel_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules, loads = _language_aliases(tree)
        count += sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_load(n, modules, loads)
                     and _argument(n, "mask", 1) is not None)
    assert count >= 20, f"only {count} masked tl.load calls found under specverify/kernels"


def test_the_scan_catches_every_spelling():
    bad = (
        "import triton.language as tl\n"
        "import triton\n"
        "from triton.language import load as ld\n"
        "def k(p, m):\n"
        "    a = tl.load(p, mask=m)\n"                       # 5: keyword mask, no other
        "    b = tl.load(p, m)\n"                            # 6: positional mask
        "    c = triton.language.load(p, mask=m)\n"          # 7: the full name
        "    d = ld(p, mask=m, other=None)\n"                # 8: other=None is no value
        "    e = tl.load(p, mask=m, other=0)\n"              # fine
        "    f = tl.load(p, m, 0.0)\n"                       # fine: positional other
        "    g = tl.load(p)\n"                               # fine: no mask
        "    h = tl.load(p, mask=None)\n"                    # fine: no mask
        "    return a, b, c, d, e, f, g, h\n"
    )
    assert masked_loads_without_other(bad, "k.py") == ["k.py:5", "k.py:6", "k.py:7", "k.py:8"]
    other_alias = "from triton import language as lang\ndef k(p, m):\n    return lang.load(p, mask=m)\n"
    assert masked_loads_without_other(other_alias, "a.py") == ["a.py:3"]
