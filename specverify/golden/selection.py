"""Which goldens a command works on: name patterns, the catalogue's records by kind, and the
goldens on disk that are unused or missing (and their removal)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from specverify.golden.catalogue import BaselineSet, GoldenCase
from specverify.golden.errors import OBTAINED, golden_paths


def matches(name: str, patterns) -> bool:
    if not patterns:
        return True
    return any((fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else p in name) for p in patterns)


def _golden_cases(catalogue) -> list[GoldenCase]:
    return [c for c in catalogue if isinstance(c, GoldenCase)]


def _baseline_sets(catalogue) -> list[BaselineSet]:
    return [c for c in catalogue if isinstance(c, BaselineSet)]


def files_on_disk(root) -> list[str]:
    """Names of every golden-like file under root (json or npz; .obtained and temporaries excluded)."""
    root = Path(root)
    if not root.is_dir():
        return []
    names = set()
    for p in root.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".npz") and not p.stem.endswith(OBTAINED):
            names.add(p.relative_to(root).as_posix()[:-len(p.suffix)])
    return sorted(names)


def find_unused(catalogue, root) -> list[str]:
    """Goldens on disk (json or npz) that no catalogue record uses."""
    from specverify.platform import ALL_PROFILE_NAMES
    used = {c.name for c in _golden_cases(catalogue)}
    for b in _baseline_sets(catalogue):
        used |= {b.file_name(p) for p in ALL_PROFILE_NAMES}
    root = Path(root)
    out = []
    for name in files_on_disk(root):
        if name not in used:
            out.append(name)
        elif not (root / f"{name}.json").exists():
            out.append(name)       # an npz without its JSON
    return out


def find_missing(catalogue, root) -> list[str]:
    """Catalogue goldens whose JSON or npz is not on disk."""
    return [c.name for c in _golden_cases(catalogue) if not all(p.exists() for p in golden_paths(root, c.name))]


def remove_golden(root, name: str) -> list[Path]:
    removed = []
    for suffix in (".json", ".npz"):
        p = Path(root) / f"{name}{suffix}"
        if p.exists():
            p.unlink()
            removed.append(p)
    return removed
