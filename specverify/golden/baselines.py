"""Accept-length baselines: the one-sided judgement, and loading, checking and rendering a
profile's baseline file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping

from specverify.golden.catalogue import AcceptScenario, BaselineSet
from specverify.golden.errors import (GOLDEN_DIR, GoldenCorrupt, GoldenError, GoldenFieldMissing, GoldenMissing,
                                      regen_command)
from specverify.golden.files import FORMAT, FORMAT_VERSION, _meta_json, _read_doc, dump_json, version_notes


ACCEPT_RULE = ("one-sided: measured >= baseline * (1 - tolerance) passes; below fails (a drop); above "
               "baseline * (1 + tolerance) is reported (a rise), not failed")


@dataclasses.dataclass
class BaselineResult:
    name: str                    # "<set>/<profile>/<scenario>"
    status: str                  # ok | drop | rise | missing | corrupt | no-scenario
    message: str
    baseline: float | None = None
    measured: float | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "rise")


def judge_accept(scenario: str, baseline: float, measured: float, tolerance: float) -> tuple[str, str]:
    """("ok" | "drop" | "rise", message): a drop below baseline * (1 - tol) fails, a rise above
    baseline * (1 + tol) is reported."""
    floor, ceiling = baseline * (1.0 - tolerance), baseline * (1.0 + tolerance)
    if measured < floor:
        return "drop", (f"{scenario}: mean accept length {measured:.4f} dropped below baseline {baseline:.4f} "
                        f"(floor {floor:.4f} at tolerance {tolerance:g})")
    if measured > ceiling:
        return "rise", (f"{scenario}: mean accept length {measured:.4f} rose above baseline {baseline:.4f} "
                        f"(ceiling {ceiling:.4f} at tolerance {tolerance:g}); record it with regen")
    return "ok", f"{scenario}: mean accept length {measured:.4f}, baseline {baseline:.4f} (tolerance {tolerance:g})"


def baseline_command(bset: BaselineSet, profile_name: str, root=None) -> str:
    return f"{regen_command(bset.file_name(profile_name), root)} --platform {profile_name}"


def load_baselines(root, bset: BaselineSet, profile_name: str) -> dict:
    name = bset.file_name(profile_name)
    path = Path(root) / f"{name}.json"
    if not path.exists():
        raise GoldenMissing(path, f"no accept-length baseline for profile {profile_name} (record it on a machine "
                                  f"of that profile)", name, root, baseline_command(bset, profile_name, root))
    doc = _read_doc(path, name, root)
    for f in ("kind", "profile", "tolerance", "scenarios", "made_with"):
        if f not in doc:
            raise GoldenFieldMissing(path, f"field {f!r} missing", name, root)
    if doc["profile"] != profile_name or doc["kind"] != "accept_lengths":
        raise GoldenCorrupt(path, f"holds {doc['kind']} of profile {doc['profile']!r}, expected accept_lengths of "
                                  f"{profile_name!r}", name, root)
    tol = doc["tolerance"]
    if not isinstance(tol, float) or not 0.0 <= tol < 1.0:
        raise GoldenCorrupt(path, f"tolerance {tol!r} is not a float in [0, 1)", name, root)
    for sname, entry in doc["scenarios"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("mean_accept_length"), float):
            raise GoldenFieldMissing(path, f"scenario {sname!r} lacks a float mean_accept_length", name, root)
    return doc


def check_accept(bset: BaselineSet, scenario: AcceptScenario, profile, root=GOLDEN_DIR,
                 measured: dict | None = None) -> BaselineResult:
    """Measure `scenario` with the optimized decoder on `profile` (unless `measured` is given) and
    judge it against the profile's baseline file."""
    label = f"{bset.file_name(profile.name)}/{scenario.name}"
    try:
        doc = load_baselines(root, bset, profile.name)
    except GoldenError as e:
        return BaselineResult(label, "missing" if isinstance(e, GoldenMissing) else "corrupt", str(e))
    entry = doc["scenarios"].get(scenario.name)
    if entry is None:
        return BaselineResult(label, "no-scenario", f"{label}: the baseline file has no scenario {scenario.name!r}; "
                                                    f"record it with {baseline_command(bset, profile.name, root)}")
    measured = scenario.measure(profile) if measured is None else measured
    status, message = judge_accept(label, entry["mean_accept_length"], float(measured["mean"]), doc["tolerance"])
    notes = version_notes(doc["made_with"])
    if notes:
        message += " (" + "; ".join(notes) + ")"
    return BaselineResult(label, status, message, entry["mean_accept_length"], float(measured["mean"]))


def render_baselines(bset: BaselineSet, profile, measured: Mapping[str, dict], made_with: Mapping) -> bytes:
    scenarios = {}
    for s in bset.scenarios:
        m = measured[s.name]
        scenarios[s.name] = {"params": _meta_json(dict(s.params), s.name), "mean_accept_length": float(m["mean"]),
                             "cycles": int(m["cycles"]), "tokens": int(m["tokens"])}
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": "accept_lengths",
           "name": bset.file_name(profile.name), "profile": profile.name, "device": profile.device,
           "made_with": dict(made_with), "tolerance": float(bset.tolerance), "rule": ACCEPT_RULE,
           "scenarios": scenarios}
    return dump_json(doc)
