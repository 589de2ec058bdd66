"""Every python code block of README.md and of the docs whose examples are scripts
(docs/decoder.md) runs as written (each block is a self-contained script).

A block that raises (a NameError, an out-of-date argument, a failed `assert`) fails its test; the
test id is the file and the block's first line number (README.md:40). The blocks are kept cheap
(the tiny models, a few tokens), so this stays a few seconds of CPU per block. Other docs hold
python fragments that are not scripts (docs/protocol.md, docs/conformance.md); they are not run.
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
SCRIPTED = [README, ROOT / "docs" / "decoder.md"]        # the files whose python blocks are scripts
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path = README) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


BLOCKS = [(f"{path.relative_to(ROOT).as_posix()}:{line}", code) for path in SCRIPTED for line, code in python_blocks(path)]


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 2, "README.md lost its python examples (or the fence pattern broke)"
    assert python_blocks(SCRIPTED[1]), "docs/decoder.md lost its python example (or the fence pattern broke)"


@pytest.mark.parametrize("where, code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_readme_block_runs(where, code, tmp_path):
    script = tmp_path / f"block_{where.replace('/', '_').replace('.', '_').replace(':', '_')}.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SPECVERIFY_PLATFORM", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, encoding="utf-8")
    assert proc.returncode == 0, f"the python block at {where} failed:\n{proc.stderr[-3000:]}"
