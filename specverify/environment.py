"""What the machine and the libraries under a run are: the CPU instruction set torch's kernels
use, the library versions and the supported ranges, the intra-op thread count.

A verdict of the suite must not move along any of these (docs/portability.md),
so every report says where it was made: the pytest report header, the matrix columns, the golden
command's summary. `ATEN_CPU_CAPABILITY` makes torch's CPU kernels use a lower instruction set
than the machine's best (`default`, `avx2`, ...); torch silently ignores a value it does not know
or the CPU cannot run, so `capability_problem` says when the requested and the effective one
differ."""

from __future__ import annotations

import os
import platform as _platform
import subprocess
import sys

import torch

CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"

# The supported library ranges, [lowest, first unsupported): the oldest is what engines pin today
# (torch 2.11 ships triton 3.6), the newest the latest release. pyproject.toml states the same
# (tests/meta/test_environment.py holds the two together).
SUPPORTED = {"torch": ("2.11", "2.16"), "triton": ("3.6", "3.10")}


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to on this machine now, lower case:
    'default', 'avx2', 'avx512', ... (what ATEN_CPU_CAPABILITY would name)."""
    return torch.backends.cpu.get_cpu_capability().lower()


def capability_in_a_fresh_process(name: str | None) -> str:
    """The CPU capability torch's kernels use in a new interpreter whose ATEN_CPU_CAPABILITY is
    `name` (None: unset: the machine's own). torch reads the variable once, at import, so this
    process cannot tell. RuntimeError when the child fails (OSError / TimeoutExpired when it
    cannot start or hangs)."""
    env = {k: v for k, v in os.environ.items() if k != CAPABILITY_ENV}
    if name is not None:
        env[CAPABILITY_ENV] = name
    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True,
                          encoding="utf-8", timeout=300)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"python -c {code!r} failed: {done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


def requested_capability() -> str | None:
    value = os.environ.get(CAPABILITY_ENV, "").strip().lower()
    return value or None


def capability_problem() -> str | None:
    """A sentence when ATEN_CPU_CAPABILITY asks for what torch did not take, else None."""
    want = requested_capability()
    have = cpu_capability()
    if want is None or want == have:
        return None
    return (f"{CAPABILITY_ENV}={want!r} but torch's CPU kernels use {have!r}: torch ignores a name it does "
            f"not know or an instruction set this CPU lacks")


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "absent"
    return triton.__version__


def versions() -> dict[str, str]:
    import numpy
    return {"torch": torch.__version__, "triton": triton_version(), "numpy": numpy.__version__,
            "python": _platform.python_version()}


def release(version: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '3.6.0rc1' -> (3, 6, 0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def unsupported_versions(running: dict[str, str] | None = None) -> list[str]:
    """One line per library whose running version lies outside SUPPORTED."""
    running = versions() if running is None else running
    out = []
    for name, (low, high) in SUPPORTED.items():
        have = running.get(name)
        if have in (None, "absent"):
            continue
        if not release(low) <= release(have) < release(high):
            out.append(f"{name} {have} is outside the supported range >={low},<{high}")
    return out


def describe() -> dict[str, str]:
    """Everything above as one flat record (the matrix columns and the golden summary)."""
    return {**versions(), "cpu_capability": cpu_capability(),
            "requested_capability": requested_capability() or "", "threads": str(torch.get_num_threads())}


def readable_output() -> None:
    """The reports print non-ASCII (arrows, x, Greek letters): a terminal or pipe whose locale
    encoding cannot hold them gets an escape (backslashreplace) instead of a UnicodeEncodeError
    half-way through a report."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") != "utf8":
            stream.reconfigure(errors="backslashreplace")
