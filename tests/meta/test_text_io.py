"""The locale is not an input (issue 21 item 6): every text file the project reads or writes, and
every child process's text output, is UTF-8 whatever the machine's locale, and the command line
prints its reports under an ASCII-only one.

Without `encoding=`, Python decodes with the locale's encoding: a runner with LANG=C and
PYTHONUTF8=0 (or a Latin-1 locale) reads README.md's arrows as an error, or as other text.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("specverify", "reference", "tests", "conftest.py")
NOT_BUILTIN_OPEN = {"os", "gzip", "zipfile", "tarfile", "webbrowser", "np", "numpy", "io", "mmap", "bz2", "lzma"}
# An ASCII-only locale: no PEP 538 coercion, no PEP 540 UTF-8 mode.
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _mode(call: ast.Call, position: int) -> str | None:
    """The constant mode of an open call ('r' when none is given), None when not a constant."""
    node = call.args[position] if len(call.args) > position else None
    for k in call.keywords:
        if k.arg == "mode":
            node = k.value
    if node is None:
        return "r"
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def text_io_without_encoding(source: str) -> list[int]:
    """Lines of calls that read or write text with the locale's encoding: Path.read_text /
    write_text, builtin or Path open in a text mode, subprocess calls with text=True, none of them
    passing encoding=."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("read_text", "write_text"):
            lines.append(node.lineno)
        elif isinstance(f, ast.Name) and f.id == "open" or (
                isinstance(f, ast.Attribute) and f.attr == "open"
                and not (isinstance(f.value, ast.Name) and f.value.id in NOT_BUILTIN_OPEN)):
            mode = _mode(node, 1 if isinstance(f, ast.Name) else 0)
            if mode is not None and "b" not in mode:
                lines.append(node.lineno)
        elif any(k.arg in ("text", "universal_newlines") and isinstance(k.value, ast.Constant) and k.value.value is True
                 for k in node.keywords):
            lines.append(node.lineno)
    return sorted(lines)


def test_every_text_read_and_write_names_its_encoding():
    files = []
    for name in SCANNED:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in files
                 for line in text_io_without_encoding(path.read_text(encoding="utf-8"))]
    assert not offenders, f"text I/O with the locale's encoding (pass encoding='utf-8'): {offenders}"


@pytest.mark.parametrize("source, lines", [
    ("p.read_text()\np.read_text(encoding='utf-8')\n", [1]),
    ("open(f, 'w')\nopen(f, 'rb')\nopen(f)\nopen(f, mode='a', encoding='utf-8')\nos.open(f, 0)\n", [1, 3]),
    ("Path(f).open()\nPath(f).open('wb')\n", [1]),
    ("subprocess.run(c, text=True)\nsubprocess.run(c, capture_output=True)\nsubprocess.run(c, text=True, encoding='utf-8')\n",
     [1]),
    ("open(f, mode)\n", []),            # not a constant: cannot tell, left to review
])
def test_the_scan_finds_what_it_should(source, lines):
    assert text_io_without_encoding(source) == lines


def test_a_slice_runs_under_an_ascii_only_locale():
    """The README and docs tests (non-ASCII text), the environment tests and the command line's
    reports, in a process whose locale encoding is ASCII."""
    env = {**os.environ, **ASCII_LOCALE, "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([sys.executable, "-c", "import locale, sys; print(locale.getpreferredencoding(False), "
                            "sys.flags.utf8_mode)"], env=env, capture_output=True, encoding="utf-8", timeout=60)
    assert probe.stdout.split() == ["ANSI_X3.4-1968", "0"], f"not an ASCII locale: {probe.stdout!r}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "tests/meta/test_readme.py", "tests/meta/test_docs.py", "tests/meta/test_environment.py"],
                          cwd=ROOT, env=env, capture_output=True, encoding="utf-8", errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for command in (["mutants", "--list"], ["golden", "list", "--filter", "ops/draft_tree"]):
        out = subprocess.run([sys.executable, "-m", "specverify", *command], cwd=ROOT, env=env, capture_output=True,
                             encoding="utf-8", errors="replace", timeout=300)
        assert out.returncode == 0 and "UnicodeEncodeError" not in out.stderr, (command, out.stderr[-2000:])
