"""reference/ must not import specverify: a bug must not hide in shared code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "reference"


def imported_modules(path: Path) -> list[str]:
    """Every module name an Import / ImportFrom node of `path` names (relative ones included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names.append(base)
            names.extend(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return names


def is_specverify(name: str) -> bool:
    return name == "specverify" or name.startswith("specverify.")


def test_reference_has_python_files():
    assert (REFERENCE / "__init__.py").is_file()


def test_no_reference_file_imports_specverify():
    offenders = []
    for path in sorted(REFERENCE.rglob("*.py")):
        for name in imported_modules(path):
            if is_specverify(name):
                offenders.append(f"{path.relative_to(ROOT)}: imports {name}")
    assert not offenders, "reference/ must not import specverify:\n" + "\n".join(offenders)


def test_scanner_catches_both_import_forms(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport specverify.models as m\nfrom specverify import platform\n", encoding="utf-8")
    assert [n for n in imported_modules(bad) if is_specverify(n)] == [
        "specverify.models", "specverify", "specverify.platform"
    ]
    good = tmp_path / "good.py"
    good.write_text("import specverify_notes\nfrom reference import model\n", encoding="utf-8")
    assert not [n for n in imported_modules(good) if is_specverify(n)]


def test_importing_reference_loads_no_specverify_module():
    code = (
        "import sys\n"
        "assert not any(m == 'specverify' or m.startswith('specverify.') for m in sys.modules)\n"
        "import reference, reference.model, reference.logits, reference.sampling, reference.generate\n"
        "loaded = sorted(m for m in sys.modules if m == 'specverify' or m.startswith('specverify.'))\n"
        "print(','.join(loaded))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, encoding="utf-8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing reference loaded: {proc.stdout.strip()}"
