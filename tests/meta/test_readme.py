"""Every python code block of README.md runs as written (each block is a self-contained script).

A block that raises (a NameError, an out-of-date argument, a failed `assert`) fails its test; the
test id is the block's first line number in README.md. The blocks are kept cheap (the tiny models,
a few tokens), so this stays a few seconds of CPU per block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 2, "README.md lost its python examples (or the fence pattern broke)"


@pytest.mark.parametrize("line, code", python_blocks(), ids=[f"README.md:{line}" for line, _ in python_blocks()])
def test_readme_block_runs(line, code, tmp_path):
    script = tmp_path / f"readme_{line}.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SPECVERIFY_PLATFORM", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, encoding="utf-8")
    assert proc.returncode == 0, f"README.md block at line {line} failed:\n{proc.stderr[-3000:]}"
