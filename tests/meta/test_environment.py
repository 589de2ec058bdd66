"""specverify/environment.py and the supported-version statements around it: one range, stated
alike in pyproject.toml, constraints/oldest-triton.txt and the README; the version arithmetic; and
the set-up's two functions that use it (scripts/env.sh: refuse a torch outside the range instead of
letting pip replace it; install the oldest supported triton as the second environment)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specverify import environment

ROOT = Path(__file__).resolve().parents[2]
ENV_SH = ROOT / "scripts" / "env.sh"


def pyproject_range(name: str) -> tuple[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    spec = next(d for d in deps if re.match(rf"{name}\b", d))
    m = re.fullmatch(rf"{name}>=([\d.]+),<([\d.]+)", spec.replace(" ", ""))
    assert m, f"pyproject.toml states {spec!r}: expected {name}>=LOW,<HIGH"
    return m.group(1), m.group(2)


@pytest.mark.parametrize("name", sorted(environment.SUPPORTED))
def test_pyproject_states_the_supported_range(name):
    assert pyproject_range(name) == environment.SUPPORTED[name]


def test_the_oldest_triton_pin_is_the_lower_bound():
    pins = [line.strip() for line in (ROOT / "constraints" / "oldest-triton.txt").read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    assert len(pins) == 1
    m = re.fullmatch(r"triton==([\d.]+)", pins[0])
    assert m and environment.release(m.group(1))[:2] == environment.release(environment.SUPPORTED["triton"][0])


def test_readme_states_the_ranges():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, (low, high) in environment.SUPPORTED.items():
        assert f"`{name}>={low},<{high}`" in text, f"README does not state {name}>={low},<{high}"


@pytest.mark.parametrize("text, want", [
    ("2.13.0+cpu", (2, 13, 0)), ("2.11.0", (2, 11, 0)), ("3.6.0rc1", (3, 6, 0)), ("2.16.0.dev20261101", (2, 16, 0)),
    ("3.10", (3, 10)), ("absent", ()),
])
def test_release(text, want):
    assert environment.release(text) == want


@pytest.mark.parametrize("torch_version, triton_version, flagged", [
    ("2.11.0", "3.6.0", []), ("2.15.9+cu130", "3.9.1", []), ("2.10.1", "3.6.0", ["torch"]),
    ("2.16.0", "3.5.1", ["torch", "triton"]), ("2.13.0+cpu", "absent", []), ("2.13.0", "3.10.0", ["triton"]),
    ("2.9.1", "3.6.0", ["torch"]), ("2.15.0", "3.9.0", []),    # by release numbers, not as strings ("2.9" > "2.11")
])
def test_unsupported_versions(torch_version, triton_version, flagged):
    lines = environment.unsupported_versions({"torch": torch_version, "triton": triton_version})
    assert [line.split()[0] for line in lines] == flagged
    for line in lines:
        low, high = environment.SUPPORTED[line.split()[0]]
        assert f">={low},<{high}" in line


def test_the_running_libraries_are_supported():
    """The suite itself runs inside the range it states (CI: the pinned torch, both trions)."""
    assert environment.unsupported_versions() == []


def test_capability_is_read_and_a_refused_request_named(monkeypatch):
    have = environment.cpu_capability()
    assert have == have.lower() and have
    monkeypatch.delenv(environment.CAPABILITY_ENV, raising=False)
    assert environment.capability_problem() is None
    monkeypatch.setenv(environment.CAPABILITY_ENV, have.upper())
    assert environment.capability_problem() is None
    monkeypatch.setenv(environment.CAPABILITY_ENV, "avx9000")
    assert "ATEN_CPU_CAPABILITY='avx9000'" in environment.capability_problem()


# -- scripts/env.sh ---------------------------------------------------------------------------------

def bash(script: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "SPECVERIFY_ENV_FUNCTIONS_ONLY": "1", **env}
    return subprocess.run(["bash", "-c", f'source "{ENV_SH}"; {script}'], env=full, capture_output=True, text=True,
                          timeout=120, encoding="utf-8")


def test_env_sh_flags_a_torch_outside_the_range(tmp_path):
    """A fake torch 2.10 first on the path: the set-up's check names it and the range."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.10.0"\n', encoding="utf-8")
    proc = bash(f'sv_outside_supported_range "{sys.executable}"', PYTHONPATH=str(tmp_path / "fake"))
    assert proc.returncode == 0, proc.stderr
    low, high = environment.SUPPORTED["torch"]
    assert proc.stdout.strip().splitlines() == [f"torch 2.10.0 is outside the supported range >={low},<{high}"]
    proc = bash(f'sv_outside_supported_range "{sys.executable}"')
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


FAKE_PIP = """#!/usr/bin/env bash
# `python -m pip install ... --target DIR PIN`: record the call, make DIR/triton/__init__.py.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "$@" >> "$PIP_LOG"
  while [ $# -gt 0 ]; do
    if [ "$1" = "--target" ]; then mkdir -p "$2/triton"; echo '__version__ = "3.6.0"' > "$2/triton/__init__.py"; fi
    shift
  done
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def test_env_sh_installs_the_oldest_triton_once(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(FAKE_PIP, encoding="utf-8")
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    env = dict(PIP_LOG=str(log), REAL_PYTHON=sys.executable)
    first = bash(f'sv_oldest_triton "{venv}"', **env)
    second = bash(f'sv_oldest_triton "{venv}"', **env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.strip() == second.stdout.strip() == str(venv / "oldest-triton")
    calls = log.read_text(encoding="utf-8").splitlines()
    assert len(calls) == 1, calls                       # the second call finds it installed
    assert "--no-deps" in calls[0] and calls[0].endswith("triton==3.6.0")
    assert (venv / "oldest-triton" / "triton" / "__init__.py").is_file()
