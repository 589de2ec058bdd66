"""`golden check`: hold both sides of the selected goldens and the profile's accept baselines
against what is stored, and print the table."""

from __future__ import annotations

import sys
from pathlib import Path

from specverify.golden.baselines import check_accept
from specverify.golden.errors import GOLDEN_DIR, OPTIMIZED, REFERENCE, regen_command
from specverify.golden.files import environment
from specverify.golden.selection import _baseline_sets, _golden_cases, find_unused, matches
from specverify.golden.sides import SideResult, run_side, side_name


def check(catalogue, root=GOLDEN_DIR, *, patterns=(), profile=None, sides: str = "both", out=None) -> int:
    """Hold the selected cases' reference and optimized sides (on `profile`) against their goldens
    and the profile's accept baselines; print a table; 0 when everything matches, else 1."""
    from specverify.platform import get_profile
    out = sys.stdout if out is None else out
    profile = get_profile() if profile is None else profile
    root = Path(root)
    running = environment(profile)
    rows, failures, details, version_lines = [], 0, [], set()
    row_notes: dict[str, list[str]] = {}
    cases = [c for c in _golden_cases(catalogue) if matches(c.name, patterns)]
    for case in cases:
        cells = []
        for side in (REFERENCE, OPTIMIZED):
            if sides not in ("both", side):
                cells.append("-")
                continue
            if side == OPTIMIZED and (case.optimized is None or not case.applies(profile)):
                cells.append("n/a")
                continue
            try:
                r = run_side(case, side, root, profile)
            except Exception as e:        # a side that crashes is a failure of this golden, not of the run
                r = SideResult(case.name, side_name(side, profile), "error", f"{type(e).__name__}: {e}")
            cells.append(r.status)
            for n in r.notes:
                if "compared anyway" in n:
                    version_lines.add(n)
                elif n not in row_notes.setdefault(case.name, []):
                    row_notes[case.name].append(n)
            if not r.ok:
                failures += 1
                details.append(r.report())
        rows.append((case.name, *cells))
    base_rows = []
    for bset in _baseline_sets(catalogue):
        for s in bset.scenarios:
            label = f"{bset.file_name(profile.name)}/{s.name}"
            if not matches(label, patterns) or sides == REFERENCE:
                continue
            r = check_accept(bset, s, profile, root)
            base_rows.append((label, r.status, r.message))
            if r.status in ("drop", "corrupt", "no-scenario"):
                failures += 1
            if r.status == "missing":
                break                     # one line for a missing file, not one per scenario
    unused = find_unused(catalogue, root) if not patterns else []
    failures += len(unused)
    width = max([len(r[0]) for r in rows] + [10]) + 2
    print(f"golden check in {root}: profile {profile.name}, torch {running['torch']}, triton {running['triton']}, "
          f"numpy {running['numpy']}, python {running['python']}", file=out)
    print(f"{'golden':<{width}}{'reference':<12}{'optimized-' + profile.name:<24}note", file=out)
    for name, ref, opt in rows:
        print(f"{name:<{width}}{ref:<12}{opt:<24}{'; '.join(row_notes.get(name, []))}".rstrip(), file=out)
    if base_rows:
        print(f"\naccept-length baselines, profile {profile.name} (one-sided: a drop fails, a rise is reported):",
              file=out)
        for label, status, message in base_rows:
            print(f"  {status:<12}{message}", file=out)
    for line in sorted(version_lines):
        print(f"note: {line}", file=out)
    for name in unused:
        print(f"unused golden: {name} (no catalogue record uses it; {regen_command()} --prune removes it)", file=out)
    for d in details:
        print("\n" + d, file=out)
    ok = sum(1 for r in rows for c in r[1:] if c == "ok")
    print(f"\n{ok} sides match, {failures} failures", file=out)
    return 1 if failures else 0
