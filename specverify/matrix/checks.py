"""The checks of a run's arguments: profiles, dtype / algorithm names, workers, the label; each
refusal a MatrixError naming the option."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from specverify.environment import CAPABILITY_ENV, capability_in_a_fresh_process

from specverify.matrix.errors import PROFILE_ORDER, MatrixError


def default_root() -> Path:
    return Path(__file__).resolve().parents[2]


def check_profiles(names: list[str] | None) -> list[str]:
    """The profiles to run, in the order given (default: every available one, in column order).
    MatrixError naming an unknown profile (with the choices) or one this machine cannot run."""
    from specverify.platform import ALL_PROFILE_NAMES, ProfileUnavailable, available_profiles, get_profile
    available = available_profiles()
    if names is None:
        return [p for p in PROFILE_ORDER if p in available]
    seen = []
    for name in _split(names):
        if name not in ALL_PROFILE_NAMES:
            raise MatrixError(f"--profiles: unknown profile {name!r}; choose from {', '.join(ALL_PROFILE_NAMES)}")
        if name in seen:
            raise MatrixError(f"--profiles: {name!r} is listed twice")
        try:
            get_profile(name)
        except ProfileUnavailable as e:
            raise MatrixError(f"--profiles: profile {name!r} cannot run on this machine: {e}; profiles "
                              f"available here: {', '.join(p for p in PROFILE_ORDER if p in available)}") from None
        seen.append(name)
    if not seen:
        raise MatrixError("--profiles: no profile named")
    return seen


def _split(values: list[str]) -> list[str]:
    """Space- and comma-separated names, flattened."""
    return [n for v in values for n in (s.strip() for s in v.split(",")) if n]


def check_names(option: str, values: list[str] | None, choices) -> list[str] | None:
    if values is None:
        return None
    names = _split(values)
    if not names:
        raise MatrixError(f"{option}: no name given; choose from {', '.join(choices)}")
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise MatrixError(f"{option}: unknown name(s) {', '.join(map(repr, unknown))}; choose from {', '.join(choices)}")
    return list(dict.fromkeys(names))


def check_workers(text: str) -> str:
    if text == "auto":
        return text
    if not re.fullmatch(r"\d+", str(text)):
        raise MatrixError(f"--workers: expected 'auto' or an int >= 0, got {text!r}")
    return str(int(text))


def device_label() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def check_label(label: str | None) -> str:
    label = device_label() if label is None else label
    if not label.strip() or "@" in label or "\n" in label:
        raise MatrixError(f"--label: {label!r} must be non-empty, on one line and without '@' "
                          f"(merge joins profile@label)")
    return label.strip()


NATIVE = "native"


def check_capabilities(values: list[str] | None) -> list[tuple[str | None, str]]:
    """The CPU capabilities to run, as (ATEN_CPU_CAPABILITY value or None for the machine's own,
    the capability torch really uses there). Default: one run that keeps the caller's variable.
    A name torch does not take here (unknown, or an instruction set this CPU lacks: torch falls
    back silently) is a MatrixError, as is one listed twice or two names that run the same."""
    if values is None:
        inherited = os.environ.get(CAPABILITY_ENV) or None
        return [(inherited, _probe(inherited))]
    names = _split(values)
    if not names:
        raise MatrixError(f"--capabilities: no name given; e.g. {NATIVE} default avx2")
    out, seen = [], {}
    for name in names:
        want = None if name.lower() == NATIVE else name.lower()
        have = _probe(want)
        if want is not None and have != want:
            raise MatrixError(f"--capabilities: torch does not run {want!r} here (it falls back to {have!r}): "
                              f"unknown name or an instruction set this CPU lacks")
        if have in seen:
            raise MatrixError(f"--capabilities: {name!r} runs {have!r}, as {seen[have]!r} does: list it once")
        seen[have] = name
        out.append((want, have))
    return out


def _probe(name: str | None) -> str:
    try:
        return capability_in_a_fresh_process(name)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise MatrixError(f"--capabilities: reading torch's CPU capability failed: {e}") from None
