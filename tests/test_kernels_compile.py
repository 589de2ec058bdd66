"""Every Triton kernel compiles for an H100 (sm_90) and an MI300 (gfx942), on every machine the
suite runs on.

Under the Triton interpreter (the CPU suite) a kernel's Python runs and the compiler is never
met, so a kernel can pass every interpreted test and fail to compile on a GPU (a Python builtin
applied to a tensor, a type only the compiler checks). `tests/support/compile_kernels.py`, in a
process without TRITON_INTERPRET, drives every Triton record of the op registry (the dtypes of the
target's platform policy) through Triton's own argument binding and specialization and compiles
each launch: for CUDA to PTX and cubin (ptxas ships with triton), for HIP to AMDGCN and an hsaco.
It launches nothing, so no GPU is needed: the ROCm kernels get a real compile here too, where no
ROCm device exists.
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
TARGETS = {"cuda": ("nvidia", "cuda 90"), "rocm": ("amd", "hip gfx942")}


def _backends() -> set:
    from triton.backends import backends
    return set(backends)


@pytest.mark.kernels
@pytest.mark.parametrize("policy", list(TARGETS))
def test_every_triton_kernel_compiles(policy):
    backend, target = TARGETS[policy]
    if backend not in _backends():
        pytest.skip(f"this triton build has no {backend} backend to compile with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # Triton's compile cache in the system temp dir: writable on any runner, kept between runs.
    env.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specverify-triton-cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, "-m", "tests.support.compile_kernels", policy], cwd=ROOT, env=env,
                         capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=900)
    out = run.stdout + run.stderr
    summary = re.search(rf"target {target}: (\d+) kernel\(s\), (\d+) specialization\(s\), (\d+) failure", out)
    assert run.returncode == 0 and summary, f"compiling the kernels for {target} failed:\n{out[-6000:]}"
    assert int(summary.group(1)) >= 22, f"fewer kernels compiled than the suite has:\n{out[-3000:]}"
