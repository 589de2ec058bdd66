"""Golden files (DESIGN "Golden files"; the catalogue is tests/support/golden_catalogue.py, the
tool specverify/golden/): both the reference and the optimized decoder are held against the
stored truth of `golden/`, so a reference drift fails as well as an optimized regression, and a
GPU run answers to the same goldens as the CPU run.

- `test_reference_matches_golden[name]`: the reference on the stored inputs == the golden;
- `test_optimized_matches_golden[name-profile]`: the optimized side on every platform profile the
  case applies to (every available profile, or the one SPECVERIFY_PLATFORM selects; a case whose
  optimized side does not read the profile, on the native profile only);
- `test_accept_length_baseline[profile-scenario]`: the mean accept length per cycle, one-sided
  against `golden/accept_lengths/<profile>.json` (a drop fails, a rise is a warning);
- `test_goldens_in_sync`: every catalogue case has its golden, no golden is unused or stale.

A mismatch prints per output leaf how many values differ, the largest absolute and relative error
and the first mismatches, and writes `<name>.<side>.obtained.json/.npz` beside the golden. These
tests never write goldens: `python -m specverify golden regen` does.
"""

from __future__ import annotations

import os
import warnings

import pytest

from specverify import dtypes, golden
from specverify.platform import ALL_PROFILE_NAMES, ENV_VAR, available_profiles, get_profile
from tests.support import golden_catalogue as cat
from specverify.conformance.registry import REGISTRY

pytestmark = [pytest.mark.golden, pytest.mark.kernels, pytest.mark.bitexact]

ROOT = golden.GOLDEN_DIR
CASES = [c for c in cat.CATALOGUE if isinstance(c, golden.GoldenCase)]
BASELINES = [c for c in cat.CATALOGUE if isinstance(c, golden.BaselineSet)]
PROFILES = [get_profile()] if os.environ.get(ENV_VAR) else list(available_profiles().values())
MAX_GOLDEN_BYTES = 20 * 1024 * 1024      # the bound on the whole of golden/


class AcceptLengthRiseWarning(UserWarning):
    """The optimized decoder accepts more than its recorded baseline: record the new one."""


def _marks(case, profile=None) -> list:
    marks = [getattr(pytest.mark, m) for m in case.marks]
    if profile is not None and profile.native and profile.policy in ("cuda", "rocm"):
        marks.append(getattr(pytest.mark, profile.policy))
    return marks


def _assert_side(result: golden.SideResult, record_property) -> None:
    for note in result.notes:
        record_property("golden_note", note)
    if not result.ok:
        raise AssertionError(result.report())
    assert result.comparison is not None and result.comparison.values > 0, \
        f"golden {result.name}, {result.side}: nothing was compared"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=_marks(c)) for c in CASES])
def test_reference_matches_golden(case, record_property):
    _assert_side(golden.run_side(case, golden.REFERENCE, ROOT), record_property)


def _profiles_for(case) -> list:
    """A case whose optimized side does not read the profile runs on the native profile only
    (or the one SPECVERIFY_PLATFORM selects), as test_ops_differential runs its op."""
    if case.platform_dependent or os.environ.get(ENV_VAR):
        return PROFILES
    return [p for p in PROFILES if p.native]


def _optimized_params():
    for c in CASES:
        for p in _profiles_for(c):
            if c.optimized is not None and c.applies(p):
                yield pytest.param(c, p, id=f"{c.name}-{p.name}", marks=_marks(c, p))


@pytest.mark.parametrize("case,profile", list(_optimized_params()))
def test_optimized_matches_golden(case, profile, record_property):
    _assert_side(golden.run_side(case, golden.OPTIMIZED, ROOT, profile), record_property)


def _baseline_params():
    for b in BASELINES:
        for p in PROFILES:
            for s in b.scenarios:
                yield pytest.param(b, s, p, id=f"{p.name}-{s.name}", marks=[pytest.mark.e2e] + _marks(b, p))


@pytest.mark.parametrize("bset,scenario,profile", list(_baseline_params()))
def test_accept_length_baseline(bset, scenario, profile, record_property):
    result = golden.check_accept(bset, scenario, profile, ROOT)
    if result.status == "missing":
        pytest.skip(result.message)     # only for a profile nobody recorded yet; the reason says how
    record_property("accept_length", f"{result.measured} (baseline {result.baseline})")
    if result.status == "rise":
        warnings.warn(AcceptLengthRiseWarning(result.message))
    assert result.ok, result.message


def test_goldens_in_sync():
    """Every catalogue case has its golden on disk, made with the catalogue's rules; no golden
    on disk is unused; every recorded baseline file holds exactly the catalogue's scenarios."""
    problems = [f"missing golden {n}: make it with {golden.regen_command(n)}" for n in golden.find_missing(CASES, ROOT)]
    problems += [f"unused golden {n} (no catalogue record uses it): {golden.regen_command()} --prune removes it"
                 for n in golden.find_unused(cat.CATALOGUE, ROOT)]
    for case in CASES:
        if case.name in golden.find_missing([case], ROOT):
            continue
        try:
            stale = golden.stale_reasons(case, golden.load_golden(ROOT, case.name))
        except golden.GoldenError as e:
            problems.append(str(e))
            continue
        problems += [f"stale golden {case.name}: {s}; make it with {golden.regen_command(case.name)}" for s in stale]
    for b in BASELINES:
        for p in ALL_PROFILE_NAMES:
            if not (ROOT / f"{b.file_name(p)}.json").exists():
                continue
            doc = golden.load_baselines(ROOT, b, p)
            want = {s.name for s in b.scenarios}
            if doc["tolerance"] != b.tolerance:
                problems.append(f"{b.file_name(p)}.json states tolerance {doc['tolerance']}, the catalogue "
                                f"{b.tolerance}: record it with {golden.baseline_command(b, p)}")
            if set(doc["scenarios"]) != want:
                problems.append(f"{b.file_name(p)}.json holds scenarios {sorted(doc['scenarios'])}, the catalogue "
                                f"{sorted(want)}: record it with {golden.baseline_command(b, p)}")
    assert not problems, "\n".join(problems)


def test_golden_dir_stays_small():
    sizes = {p: p.stat().st_size for p in ROOT.rglob("*")
             if p.is_file() and p.suffix in (".json", ".npz") and golden.OBTAINED not in p.name}
    total = sum(sizes.values())
    assert sizes, f"{ROOT} holds no golden"
    assert total < MAX_GOLDEN_BYTES, f"golden/ holds {total} bytes, above {MAX_GOLDEN_BYTES}"


def test_catalogue_covers_the_registry_and_the_scenario_design():
    """One op golden per (registry op, dtype), and e2e scenarios that span what the issue asks."""
    want = {f"ops/{op.name}/{d}" for op in REGISTRY.values() for listed in op.dtypes.values() for d in listed}
    assert {c.name for c in cat.OP_CASES} == want
    sc = cat.SCENARIOS
    fp8 = [s for s in sc if dtypes.dtype_info(s.logits_dtype).is_fp8]
    checks = {
        "greedy and sampled": {s.sampling == "greedy" for s in sc} == {True, False},
        "target-only and EAGLE": {s.speculative for s in sc} == {True, False},
        "EAGLE chain and tree": {s.topk == 1 for s in sc if s.speculative} == {True, False},
        "page size 1 and > 1": {s.page_size > 1 for s in sc if s.speculative} == {True, False},
        "float32 and bfloat16 logits": {"float32", "bfloat16"} <= {s.logits_dtype for s in sc},
        "a CUDA-served FP8": any(s.logits_dtype in ("float8_e4m3fn", "float8_e5m2") for s in fp8),
        "a ROCm-served FP8": any(s.logits_dtype in ("float8_e4m3fnuz", "float8_e5m2fnuz") for s in fp8),
        "a static FP8 scale != 1": any(s.scale not in ("1", "per_row") for s in fp8),
        "a per-row FP8 scale": any(s.scale == "per_row" for s in fp8),
        "plain and steered drafts": {s.agreement is None for s in sc if s.speculative} == {True, False},
        "ragged budgets": all(len(set(cat.BUDGETS[s.bs])) == s.bs for s in sc) and any(s.bs > 1 for s in sc),
        "EOS": any(s.eos for s in sc),
        "EOS in EAGLE": any(s.eos and s.speculative for s in sc),
    }
    assert all(checks.values()), [k for k, v in checks.items() if not v]
    names = [c.name for c in cat.CATALOGUE]
    assert len(names) == len(set(names))
