"""Every Triton kernel compiles for an H100 (sm_90), on every machine the suite runs on.

Under the Triton interpreter (the CPU suite) a kernel's Python runs and the compiler is never
met, so a kernel can pass every interpreted test and fail to compile on a GPU (a Python builtin
applied to a tensor, a type only the compiler checks). `tests/support/compile_kernels.py`, in a
process without TRITON_INTERPRET, drives every Triton record of the op registry through Triton's own
argument binding and specialization and compiles each launch for sm_90 (PTX and cubin; ptxas ships
with triton); it launches nothing, so no GPU is needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _has_nvidia_backend() -> bool:
    from triton.backends import backends
    return "nvidia" in backends


@pytest.mark.kernels
@pytest.mark.skipif(not _has_nvidia_backend(), reason="this triton build has no NVIDIA backend to compile with")
def test_every_triton_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # Triton's compile cache in the system temp dir: writable on any runner, kept between runs.
    env.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specverify-triton-cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, "-m", "tests.support.compile_kernels"], cwd=ROOT, env=env,
                         capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=900)
    out = run.stdout + run.stderr
    summary = re.search(r"target sm_90: (\d+) kernel\(s\), (\d+) specialization\(s\), (\d+) failure", out)
    assert run.returncode == 0 and summary, f"compiling the kernels for sm_90 failed:\n{out[-6000:]}"
    assert int(summary.group(1)) >= 18, f"fewer kernels compiled than the suite has:\n{out[-3000:]}"
