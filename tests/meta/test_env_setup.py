"""scripts/env.sh asks for the CPU build of torch only where the configured index would install a
CUDA one. Its decision functions run here against fake pip reports (offline, no install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_SH = ROOT / "scripts" / "env.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def report(*names: str) -> dict:
    return {"version": "1", "install": [{"metadata": {"name": n, "version": "1"}} for n in names]}


CUDA_TORCH = report("torch", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton", "sympy")
CPU_TORCH = report("torch", "sympy", "networkx", "filelock")


def bash(script: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "SPECVERIFY_ENV_FUNCTIONS_ONLY": "1", "SV_PYTHON": sys.executable, **env}
    full_env.pop("SPECVERIFY_TORCH_INDEX", None)
    return subprocess.run(["bash", "-c", f'source "{ENV_SH}"; {script}'], env=full_env, capture_output=True,
                          text=True, timeout=60, encoding="utf-8")


@pytest.mark.parametrize("content, verdict", [
    (CUDA_TORCH, 0),
    (report("torch", "NVIDIA_cuda_runtime"), 0),
    (CPU_TORCH, 1),
    (report("numpy"), 2),          # no torch in the report: no verdict
    ("not json", 2),
    ({"install": [{"nometadata": 1}]}, 2),
], ids=["cuda-torch", "cuda-name-spelling", "cpu-torch", "no-torch", "garbage", "bad-shape"])
def test_report_decision(tmp_path, content, verdict):
    path = tmp_path / "report.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    proc = bash(f'rc=0; sv_report_needs_cuda "{path}" || rc=$?; echo "rc=$rc"')
    assert f"rc={verdict}" in proc.stdout, proc.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# pip's dry run writes the fake report (or fails); anything else goes to the real interpreter.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = "--report" ]; then cp "$FAKE_REPORT" "$2"; fi
    shift
  done
  exit "${FAKE_PIP_RC:-0}"
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize("content, pip_rc, expected", [
    (CUDA_TORCH, 0, f"--extra-index-url {CPU_INDEX}"),
    (CPU_TORCH, 0, ""),                    # this machine's index: a local CPU wheel, nothing added
    (CUDA_TORCH, 1, ""),                   # pip cannot resolve (offline): the plain set-up decides
], ids=["public-index-cuda-wheel", "index-serves-cpu-wheel", "pip-fails"])
def test_torch_index_args(tmp_path, content, pip_rc, expected):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON, encoding="utf-8")
    fake.chmod(0o755)
    (tmp_path / "report.json").write_text(json.dumps(content), encoding="utf-8")
    proc = bash(f'sv_torch_index_args "{fake}" "{ROOT / "constraints" / "cpu.txt"}"',
                FAKE_REPORT=str(tmp_path / "report.json"), FAKE_PIP_RC=str(pip_rc), REAL_PYTHON=sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


def test_cpu_pin_is_an_exact_version():
    pins = [line for line in (ROOT / "constraints" / "cpu.txt").read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    assert pins == ["torch==2.13.0"]
