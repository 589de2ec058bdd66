"""Differential, property and error-input tests generated from the op registry.

Test ids are `op-profile-dtype`; a failure names the sample, its seed and a command that re-runs
just that sample (`--sv-sample NAME`). With `SPECVERIFY_IMPL=module:object` the ops of that object
are held against the reference instead of specverify's (tests/support/registry.py describes the
interface); an op it lacks is skipped with a reason naming the missing attribute.

Platform-dependent ops run on every available profile, or, when `SPECVERIFY_PLATFORM` names one
(a `specverify matrix` run per profile), on that profile only; the others run once, natively.
Expected failures and skips are data (tests/expectations/, applied by the conftest)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from specverify import dtypes
from specverify.platform import ENV_VAR, available_profiles, get_profile
from tests.support.registry import (
    IMPL_ENV, REGISTRY, SAMPLE_OPTION, compare_outputs, load_impl, missing_op, replay_command, run_impl,
    select_samples,
)

pytestmark = pytest.mark.kernels

PROFILES = available_profiles()
# The profile SPECVERIFY_PLATFORM selects (None when unset): platform-dependent ops run there only.
# (A bad value never gets here: the conftest refuses it at configure time.)
SELECTED = get_profile().name if os.environ.get(ENV_VAR) else None
PLUGIN = load_impl()


def _cases():
    for op in REGISTRY.values():
        for pname, profile in PROFILES.items():
            # Ops that do not read the profile (and a plugged-in implementation) run once, natively.
            if (PLUGIN is not None or not op.platform_dependent) and not profile.native:
                continue
            if op.platform_dependent and PLUGIN is None and SELECTED is not None and pname != SELECTED:
                continue
            for dtype in op.dtypes_for(profile.policy):
                marks = [pytest.mark.fp8] if dtypes.dtype_info(dtype).is_fp8 else []
                if profile.native and profile.policy in ("cuda", "rocm"):
                    marks.append(getattr(pytest.mark, profile.policy))
                why = missing_op(PLUGIN, op)
                if why:
                    marks.append(pytest.mark.skip(reason=why))
                yield pytest.param(op, profile, dtype, id=f"{op.name}-{pname}-{dtype}", marks=marks)


@pytest.mark.parametrize("op,profile,dtype", list(_cases()))
def test_differential(op, profile, dtype, seed, request):
    """Named edge cases and seeded random samples: implementation under test == reference."""
    only = request.config.getoption(SAMPLE_OPTION)
    samples = select_samples(op, dtype, seed, only)
    if only is not None and len(samples) != 1:
        names = [s.name for _, s in select_samples(op, dtype, seed)]
        raise pytest.UsageError(f"{SAMPLE_OPTION}={only!r} names {len(samples)} samples of {op.name} "
                                f"(need exactly 1); its samples: {names}")
    for i, sample in samples:
        try:
            compare_outputs(op, run_impl(op, sample, profile, PLUGIN), op.ref(sample), f"{op.name} sample {i}")
        except AssertionError as err:
            raise AssertionError(f"{err}\nsample {i}: {sample.summary()}\n"
                                 f"replay: {replay_command('test_differential', op.name, profile.name, dtype, sample)}"
                                 ) from None
    if only is not None:
        print(f"ran 1 sample: {samples[0][1].summary()}")


@pytest.mark.parametrize("op,profile,dtype", list(_cases()))
def test_property(op, profile, dtype):
    """Hypothesis inputs: implementation under test == reference. Derandomized (the examples
    depend only on the code), op.max_examples each, unless the `thorough` profile asks for more."""
    examples = settings.default.max_examples
    if settings._current_profile != "thorough":
        examples = min(examples, op.max_examples)

    @settings(derandomize=True, database=None, max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(sample=op.recipe(dtype))
    def check(sample):
        compare_outputs(op, run_impl(op, sample, profile, PLUGIN), op.ref(sample), f"{op.name} {sample.summary()}")

    check()


def _error_cases():
    for op in REGISTRY.values():
        for e in op.errors():
            marks = []
            if PLUGIN is not None:
                marks.append(pytest.mark.skip(reason=f"{IMPL_ENV} is set: error inputs check specverify's own "
                                                     "messages, not part of the conformance interface"))
            elif e.pending:
                marks.append(pytest.mark.xfail(reason=e.pending, raises=e.pending_raises, strict=True))
            yield pytest.param(e, id=f"{op.name}-{e.name}", marks=marks)


@pytest.mark.parametrize("error", list(_error_cases()))
def test_error_inputs(error):
    """Bad input raises a clear error naming the argument, never an IndexError from inside."""
    with pytest.raises(error.exc, match=error.match) as info:
        error.call()
    assert error.arg in str(info.value), f"the message {str(info.value)!r} does not name the argument {error.arg!r}"
