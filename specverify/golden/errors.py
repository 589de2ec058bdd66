"""What a golden is called and where it lives: the shared constants, golden names and paths, the
regen command a message points at, and the errors of a golden that cannot be used."""

from __future__ import annotations

import re
from pathlib import Path

EXACT = "exact"
CLOSE = "close"
RULES = (EXACT, CLOSE)
ROOT = Path(__file__).resolve().parents[2]          # the repository root (parent of the package)
GOLDEN_DIR = ROOT / "golden"
OBTAINED = ".obtained"
REFERENCE = "reference"
OPTIMIZED = "optimized"
_NAME_PART = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]*")


def regen_command(name: str | None = None, root: Path | str | None = None) -> str:
    """The command that (re)makes golden `name` (all goldens when None)."""
    cmd = "python -m specverify golden regen"
    if root is not None and Path(root).resolve() != GOLDEN_DIR.resolve():
        cmd += f" --root {root}"
    return cmd + (f" --filter {name}" if name else "")


class GoldenError(Exception):
    """A golden that cannot be used. The message names the file and the command that makes it."""

    def __init__(self, path, problem: str, name: str | None = None, root=None, command: str | None = None):
        self.path, self.problem, self.name = Path(path), problem, name
        super().__init__(f"{path}: {problem}; make it with: {command or regen_command(name, root)}")


class GoldenMissing(GoldenError):
    """The golden's file does not exist."""


class GoldenCorrupt(GoldenError):
    """The file exists but cannot be read: truncated, corrupted, or not what its JSON says."""


class GoldenFieldMissing(GoldenCorrupt):
    """The JSON parses but lacks a field the format requires."""


class GoldenVersionUnknown(GoldenError):
    """The file names a format version this specverify does not know."""


class InputDrift(GoldenError):
    """The stored inputs no longer rebuild what they did (a model builder changed its weights, an op
    registry changed its samples)."""


def check_name(name: str) -> str:
    """A golden name: '/'-joined parts of [A-Za-z0-9_.+-], none '.' or '..' or ending '.obtained'."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"golden name must be a non-empty str, got {name!r}")
    parts = name.split("/")
    if any(not _NAME_PART.fullmatch(p) or p in (".", "..") for p in parts) or name.endswith(OBTAINED):
        raise ValueError(f"golden name {name!r}: parts must match {_NAME_PART.pattern} and the name must not end "
                         f"with {OBTAINED!r}")
    return name


def golden_paths(root, name: str) -> tuple[Path, Path]:
    base = Path(root) / check_name(name)
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".npz")


def obtained_paths(root, name: str, side: str) -> tuple[Path, Path]:
    base = Path(root) / check_name(name)
    stem = f"{base.name}.{side}{OBTAINED}"
    return base.with_name(stem + ".json"), base.with_name(stem + ".npz")
