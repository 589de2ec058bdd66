"""The compile check itself (tests/support/compile_kernels.py, run by tests/test_kernels_compile.py):
a launch the target refuses is a failure of its kernel, whether the refusal comes from the
launch options (a num_warps that is no power of two) or from the compiler (a block that is
none), and a good launch compiles. Run in a child process without TRITON_INTERPRET, on a tiny
kernel of its own: no GPU needed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n, other=0), mask=i < n)
'''

CHILD = '''
import json, sys
import torch
from triton.runtime.jit import JITFunction
from tests.support import compile_kernels as ck
JITFunction.run = ck._compile_only
import tiny_kernel
x = torch.zeros(8)
for block, warps in ((8, 2), (8, 3), (6, 1), (8, 0)):
    tiny_kernel._copy_kernel[(1,)](x, x, 5, BLOCK=block, num_warps=warps)
print(json.dumps({"compiled": {k: len(v) for k, v in ck.compiled.items()}, "failures": ck.failures}))
'''


@pytest.mark.kernels
def test_a_launch_the_target_refuses_is_its_kernels_failure(tmp_path):
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip("this triton build has no nvidia backend to compile with")
    (tmp_path / "tiny_kernel.py").write_text(KERNEL, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "specverify-triton-cache"))
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                         encoding="utf-8", errors="replace", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["compiled"] == {"tiny_kernel._copy_kernel": 2}, out      # (8, 2) and (6, 1) reach the compiler
    fails = out["failures"]
    assert len(fails) == 3, fails
    assert "'num_warps': 3}: the launch does not bind" in fails[0] and "num_warps must be a power of 2" in fails[0]
    assert "CompilationError" in fails[1] and "arange's range must be a power of 2" in fails[1]  # the compiler's
    assert "'num_warps': 0}: the launch does not bind" in fails[2]
