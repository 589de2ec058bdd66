"""Differential, property and error-input tests generated from the op registry.

Test ids are `op-profile-dtype`; a failure names the sample, its seed and a command that re-runs
just that case."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from specverify import dtypes
from specverify.platform import available_profiles
from tests.support.registry import REGISTRY, compare_outputs, replay_command, run_impl

PROFILES = available_profiles()


def _cases(test: str):
    for op in REGISTRY.values():
        for pname, profile in PROFILES.items():
            for dtype in op.dtypes_for(profile.policy):
                marks = [pytest.mark.fp8] if dtypes.dtype_info(dtype).is_fp8 else []
                if profile.native and profile.policy in ("cuda", "rocm"):
                    marks.append(getattr(pytest.mark, profile.policy))
                e = op.expectation(test, profile.policy, dtype)
                if e is not None and e.kind == "xfail":
                    marks.append(pytest.mark.xfail(reason=e.reason, raises=e.raises, strict=True))
                if e is not None and e.kind == "skip":
                    marks.append(pytest.mark.skip(reason=e.reason))
                yield pytest.param(op, profile, dtype, id=f"{op.name}-{pname}-{dtype}", marks=marks)


@pytest.mark.parametrize("op,profile,dtype", list(_cases("test_differential")))
def test_differential(op, profile, dtype, seed):
    """Named edge cases and seeded random samples: optimized == reference."""
    for i, sample in enumerate(op.samples(dtype, seed)):
        got, want = run_impl(op, sample, profile), op.ref(sample)
        try:
            compare_outputs(op, got, want, f"{op.name} sample {i}")
        except AssertionError as err:
            raise AssertionError(f"{err}\nsample {i}: {sample.summary()}\n"
                                 f"replay: {replay_command('test_differential', op.name, profile.name, dtype, sample)}") from None


@pytest.mark.parametrize("op,profile,dtype", list(_cases("test_property")))
@given(data=st.data())
def test_property(op, profile, dtype, data):
    """Hypothesis inputs: optimized == reference."""
    sample = data.draw(op.recipe(dtype), label="sample")
    compare_outputs(op, run_impl(op, sample, profile), op.ref(sample), f"{op.name} {sample.summary()}")


@pytest.mark.parametrize("op", list(REGISTRY.values()), ids=list(REGISTRY))
def test_error_inputs(op):
    """Bad input raises a clear error naming the argument, never an IndexError from inside."""
    for e in op.errors():
        with pytest.raises(e.exc, match=e.match):
            e.call()
