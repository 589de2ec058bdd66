"""`golden regen`: make the selected goldens (and the running profile's accept baselines), write
only what changed, report unused goldens and prune them."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from specverify.golden.baselines import render_baselines
from specverify.golden.errors import GOLDEN_DIR, golden_paths
from specverify.golden.files import _write, environment, render
from specverify.golden.selection import _baseline_sets, _golden_cases, find_unused, matches, remove_golden


@dataclasses.dataclass
class RegenReport:
    created: list[str] = dataclasses.field(default_factory=list)
    changed: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    kept_other_versions: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)
    pruned: list[str] = dataclasses.field(default_factory=list)


def _same_but_versions(old_json: bytes, new_json: bytes) -> bool:
    try:
        old, new = json.loads(old_json), json.loads(new_json)
    except (ValueError, UnicodeDecodeError):
        return False
    old.pop("made_with", None)
    new.pop("made_with", None)
    return old == new


def _store(root: Path, name: str, files: list[tuple[Path, bytes]], report: RegenReport, force: bool) -> None:
    old = [p.read_bytes() if p.exists() else None for p, _ in files]
    if all(o == data for o, (_, data) in zip(old, files)):
        report.unchanged.append(name)
        return
    if any(o is None for o in old):
        status = report.created if all(o is None for o in old) else report.changed
    elif not force and all(o == d for o, (p, d) in zip(old, files) if p.suffix != ".json") \
            and _same_but_versions(old[0], files[0][1]):
        report.kept_other_versions.append(name)
        return
    else:
        status = report.changed
    for p, data in reversed(files):    # npz first: a JSON always names the npz beside it
        _write(p, data)
    status.append(name)


def regen(catalogue, root=GOLDEN_DIR, *, patterns=(), prune: bool = False, profile=None, force: bool = False,
          out=None) -> RegenReport:
    """Make the selected goldens with the reference (and the running profile's accept baselines
    with the optimized decoder); write only what changed; report unused goldens, remove them
    with prune."""
    from specverify.platform import get_profile
    out = sys.stdout if out is None else out
    profile = get_profile() if profile is None else profile
    root = Path(root)
    made_with = environment(profile)
    report = RegenReport()
    for case in _golden_cases(catalogue):
        if not matches(case.name, patterns):
            continue
        inputs, meta = case.build()
        outputs = case.reference(inputs)
        text, npz = render(case.name, inputs, outputs, meta, case.rules, case.tolerance_dtype, made_with)
        jpath, zpath = golden_paths(root, case.name)
        _store(root, case.name, [(jpath, text), (zpath, npz)], report, force)
    for bset in _baseline_sets(catalogue):
        name = bset.file_name(profile.name)
        if not matches(name, patterns):
            continue
        measured = {s.name: s.measure(profile) for s in bset.scenarios}
        _store(root, name, [(root / f"{name}.json", render_baselines(bset, profile, measured, made_with))], report,
               force)
    report.unused = find_unused(catalogue, root)
    if prune:
        for name in report.unused:
            remove_golden(root, name)
            report.pruned.append(name)
    _print_regen(report, root, out, prune)
    return report


def _print_regen(r: RegenReport, root: Path, out, prune: bool) -> None:
    print(f"golden regen in {root}: {len(r.created)} created, {len(r.changed)} changed, "
          f"{len(r.unchanged) + len(r.kept_other_versions)} left alone", file=out)
    for label, names in (("created", r.created), ("changed", r.changed)):
        for n in names:
            print(f"  {label}: {n}", file=out)
    for n in r.kept_other_versions:
        print(f"  left alone: {n} (same content; made with other library versions; --force rewrites it)", file=out)
    if r.unused:
        verb = "removed" if prune else "unused (no catalogue record uses it; --prune removes it)"
        for n in r.unused:
            print(f"  {verb}: {n}", file=out)
