"""One side (the reference, or the optimized decoder on a profile) run on a golden's stored
inputs and held against its outputs; `.obtained` files written on a mismatch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specverify.golden.catalogue import GoldenCase
from specverify.golden.comparison import Comparison, compare
from specverify.golden.errors import (GOLDEN_DIR, OPTIMIZED, REFERENCE, GoldenError, GoldenMissing, InputDrift,
                                      obtained_paths, regen_command)
from specverify.golden.files import Golden, _write, environment, load_golden, render, tolerance_entry, version_notes


@dataclasses.dataclass
class SideResult:
    name: str
    side: str                    # "reference" | "optimized-<profile>"
    status: str                  # ok | mismatch | missing | corrupt | stale | drift | error
    message: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    obtained: Path | None = None
    comparison: Comparison | None = None
    root: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def report(self) -> str:
        lines = [f"golden {self.name}, {self.side}: {self.status}"]
        if self.message:
            lines.append(self.message)
        lines += [f"note: {n}" for n in self.notes]
        if self.obtained is not None:
            lines.append(f"obtained outputs written to {self.obtained} (and .npz); if the change is intended: "
                         f"{regen_command(self.name, self.root)}")
        return "\n".join(lines)


def stale_reasons(case: GoldenCase, golden: Golden) -> list[str]:
    """How the stored comparison rules differ from the catalogue's (a golden to regenerate)."""
    out = []
    if dict(case.rules) != golden.rules:
        out.append(f"rules {golden.rules} stored, the catalogue says {dict(sorted(case.rules.items()))}")
    if case.tolerance_dtype != golden.tolerance_dtype:
        out.append(f"tolerance dtype {golden.tolerance_dtype} stored, the catalogue says {case.tolerance_dtype}")
    return out


def side_name(side: str, profile=None) -> str:
    return REFERENCE if side == REFERENCE else f"{OPTIMIZED}-{profile.name}"


def run_side(case: GoldenCase, side: str, root=GOLDEN_DIR, profile=None, *, write_obtained: bool = True) -> SideResult:
    """Load the golden of `case`, run one side on its STORED inputs, compare. side: "reference"
    or "optimized" (on `profile`, default the running one). Writes `.obtained` on a mismatch and
    removes a stale one on a match. Exceptions of the side itself propagate (their traceback)."""
    from specverify.platform import get_profile
    if side not in (REFERENCE, OPTIMIZED):
        raise ValueError(f"side must be {REFERENCE!r} or {OPTIMIZED!r}, got {side!r}")
    if side == OPTIMIZED:
        profile = get_profile() if profile is None else profile
        if case.optimized is None or not case.applies(profile):
            raise ValueError(f"golden {case.name}: the optimized side does not apply on profile {profile.name}")
    label = side_name(side, profile)
    try:
        golden = load_golden(root, case.name)
    except GoldenError as e:
        return SideResult(case.name, label, "missing" if isinstance(e, GoldenMissing) else "corrupt", str(e))
    notes = version_notes(golden.made_with)
    stored, table = golden.meta["tolerance"], tolerance_entry(golden.tolerance_dtype)
    if any(stored.get(k) != table[k] for k in ("atol", "rtol")):
        notes.append(f"the tolerance table's {golden.tolerance_dtype} entry changed since the golden was made "
                     f"(atol {stored.get('atol')} rtol {stored.get('rtol')} then, atol {table['atol']} rtol "
                     f"{table['rtol']} applied now)")
    stale = stale_reasons(case, golden)
    if stale:
        return SideResult(case.name, label, "stale", "; ".join(stale) + f"; make it with: "
                          f"{regen_command(case.name, root)}", notes)
    drift = case.check_inputs(golden.inputs) if case.check_inputs is not None else None
    if drift:
        return SideResult(case.name, label, "drift", str(InputDrift(golden.path, drift, case.name, root)), notes)
    got = case.reference(golden.inputs) if side == REFERENCE else case.optimized(golden.inputs, profile)
    got_view, want_view, view_notes = (case.views(got, golden.outputs, side) if case.views is not None
                                       else (got, golden.outputs, []))
    notes += list(view_notes)
    cmp = compare(got_view, want_view, rules=golden.rules, tolerance_dtype=golden.tolerance_dtype,
                  allow_declined=side == OPTIMIZED)
    if cmp.declined:
        notes.append(f"{len(cmp.declined)} output(s) declared not comparable by the implementation: "
                     f"{', '.join(cmp.declined[:4])}{' ...' if len(cmp.declined) > 4 else ''}")
    jpath, zpath = obtained_paths(root, case.name, label)
    if cmp.ok:
        for p in (jpath, zpath):
            p.unlink(missing_ok=True)
        return SideResult(case.name, label, "ok", "", notes, None, cmp)
    result = SideResult(case.name, label, "mismatch", cmp.message(), notes, None, cmp, Path(root))
    if write_obtained:
        text, npz = render(case.name, golden.inputs, got, {k: v for k, v in golden.meta.items()
                                                            if k not in ("rules", "tolerance")},
                           golden.rules, golden.tolerance_dtype, environment(profile),
                           extra={"obtained": {"side": label, "report": [d.message() for d in cmp.diffs[:50]]}})
        _write(zpath, npz)
        _write(jpath, text)
        result.obtained = jpath
    return result
