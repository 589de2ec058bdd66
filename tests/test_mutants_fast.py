"""The CI subset of the bug zoo: every `fast = true` mutant of tests/mutants/ is planted in a copy
of the tree and killed by its slice, and every slice passes unmutated (else a kill means nothing).
The whole zoo: `python -m specverify mutants` (docs/mutants.md)."""

from __future__ import annotations

from pathlib import Path

from specverify import mutants

ROOT = Path(__file__).resolve().parents[1]
MAX_FAST = 4        # the subset runs inside the CPU suite: a few mutants with small slices


def fast_mutants() -> list[mutants.Mutant]:
    return mutants.select(mutants.load_zoo(ROOT / "tests" / "mutants", ROOT), fast=True)


def test_fast_subset_stays_small():
    names = [m.name for m in fast_mutants()]
    assert 2 <= len(names) <= MAX_FAST, f"fast = true on {len(names)} mutants {names}: keep 2..{MAX_FAST}"


def test_fast_mutants_are_killed_and_their_slices_pass_unmutated():
    zoo = fast_mutants()
    log: list[str] = []
    results = mutants.run_zoo(zoo, ROOT, baseline=True, timeout=300, progress=log.append)
    report = mutants.format_table(results) + "\n" + "\n".join(log)
    assert all(r.killed for r in results), report
    assert len(results) == len(zoo) and sum(line.startswith("[baseline]") for line in log) >= 1, report
