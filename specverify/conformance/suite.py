"""The conformance tests, generated from the op registry and the law records for one implementation.

`conformance_tests(impl)` returns the test functions (parametrized, ready for pytest to collect)
that hold `impl` against the reference: `impl` None is specverify's own ops (the project's
tests/test_ops_differential.py), any other object a plugged-in implementation
(specverify/conformance/test_conformance.py, `--sv-impl`). One machinery, one registry.

- test_differential: every named edge case and seeded random sample of an op, compared with the
  reference under the conventions the implementation declares. Each test records its verdict
  (conforms / differs, with the named differences and the smallest sample that shows them / fails,
  with the smallest failing sample and the command that replays it) for the report.
- test_property: hypothesis inputs, the same comparison (derandomized: the same examples everywhere).
- test_law: ops that draw their own uniforms, judged by a chi-square against the exact law.
- test_error_inputs: specverify's own error messages (not part of the conformance interface).

Test ids are `op-profile-dtype`; the seed of a test is a function of its name only (not of where
the package is installed), so a run gives the same samples on every machine.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from specverify import dtypes
from specverify.conformance import conventions as C
from specverify.conformance import laws
from specverify.conformance.adapters import Unsupported
from specverify.conformance.registry import (
    IMPL_ENV, REGISTRY, SAMPLE_OPTION, SampleInput, compare_outputs, missing_op, replay_command, run_impl,
    select_samples,
)
from specverify.platform import ENV_VAR, available_profiles, get_profile

RECORD_KEY = "specverify"          # the user_properties entry a test's verdict travels in (report.py)


def seed_for(name: str) -> int:
    """The seed of a conformance test: crc32 of its name (function and parameter id)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def impl_name(impl) -> str:
    if impl is None:
        import specverify
        return f"specverify {getattr(specverify, '__version__', '')}".strip()
    return str(getattr(impl, "name", type(impl).__name__))


def _numel(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return sum(_numel(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 1


def show_sample(sample: SampleInput, limit: int = 128) -> str:
    """The sample's summary and, for tensors of at most `limit` elements, their values."""
    parts = [sample.summary()]
    for key, value in sample.args.items():
        if isinstance(value, torch.Tensor) and value.numel() <= limit:
            parts.append(f"  {key} = {value.tolist()}")
    return "\n".join(parts)


def _record(request, **fields) -> None:
    request.node.user_properties.append((RECORD_KEY, fields))


def _cases(impl, missing: str = "skip"):
    profiles = available_profiles()
    selected = get_profile().name if os.environ.get(ENV_VAR) else None
    for op in REGISTRY.values():
        for pname, profile in profiles.items():
            # Ops that do not read the profile (and a plugged-in implementation) run once, natively.
            if (impl is not None or not op.platform_dependent) and not profile.native:
                continue
            if op.platform_dependent and impl is None and selected is not None and pname != selected:
                continue
            for dtype in op.dtypes_for(profile.policy):
                marks = [pytest.mark.fp8] if dtypes.dtype_info(dtype).is_fp8 else []
                if profile.native and profile.policy in ("cuda", "rocm"):
                    marks.append(getattr(pytest.mark, profile.policy))
                why = missing_op(impl, op)
                if why and missing == "omit":
                    continue
                if why:
                    marks.append(pytest.mark.skip(reason=why))
                yield pytest.param(op, profile, dtype, id=f"{op.name}-{pname}-{dtype}", marks=marks)


def _smallest(found):
    return min(found, key=lambda item: (_numel(item[1].args), item[0]))


MAX_SHRINK_ROWS = 64        # rows tried when shrinking a counterexample to one row


def _batch_rows(value, rows=None):
    """The common first dimension of every tensor in an argument tree (None when they disagree)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return rows
        return value.shape[0] if rows in (None, value.shape[0]) else -1
    if isinstance(value, dict):
        for v in value.values():
            rows = _batch_rows(v, rows)
        return rows
    return rows


def _row_of(value, r: int):
    if isinstance(value, torch.Tensor):
        return value[r:r + 1] if value.dim() else value
    if isinstance(value, dict):
        return {k: _row_of(v, r) for k, v in value.items()}
    return value


def one_row(sample: SampleInput, shows) -> SampleInput | None:
    """The first single-row slice of `sample` (every tensor cut to row r of its first dimension,
    where all tensors share that dimension) on which `shows(slice)` is still true: a smaller
    counterexample. None when the sample has no common batch dimension, no row shows it, or a
    slice is not a valid input (it raises)."""
    rows = _batch_rows(sample.args)
    if rows is None or rows < 2:
        return None
    for r in range(min(rows, MAX_SHRINK_ROWS)):
        cut = SampleInput(f"{sample.name}[row {r}]", _row_of(sample.args, r), sample.seed)
        try:
            if shows(cut):
                return cut
        except Exception:                      # a slice the op or the reference refuses: keep the whole sample
            return None
    return None


def _mismatch(op, got, want, tol) -> bool:
    try:
        compare_outputs(op, got, want, op.name, tol)
    except AssertionError:
        return True
    return False


def _shown(sample: SampleInput, row: SampleInput | None) -> str:
    if row is None:
        return show_sample(sample)
    return f"{show_sample(row)}\n  (one row of {sample.name}, which fails as a whole too)"


def _differential(impl):
    def test_differential(op, profile, dtype, request):
        """Named edge cases and seeded random samples: the implementation == the reference under
        its declared conventions; a declared difference is shown on the smallest sample."""
        conv = C.conventions_for(impl, op.name)
        base = dict(engine=impl_name(impl), test="differential", op=op.name, profile=profile.name, dtype=dtype)
        if impl is not None and conv["randomness"] == "own" and op.uniforms:
            if op.name not in laws.LAWS:     # nothing can judge it: say so, never pass it silently
                _record(request, **base, verdict="unsupported", detail="draws its own uniforms and has no law test")
                pytest.skip(f"{op.name} draws its own uniforms (randomness=own) and specverify has no law test "
                            f"for it: not checked")
            _record(request, **base, verdict="law", detail="draws its own uniforms: judged by test_law")
            pytest.skip(f"{op.name} draws its own uniforms (randomness=own): judged by law, test_law")
        only = request.config.getoption(SAMPLE_OPTION)
        seed = seed_for(request.node.name)
        samples = select_samples(op, dtype, seed, only)
        if only is not None and len(samples) != 1:
            names = [s.name for _, s in select_samples(op, dtype, seed)]
            raise pytest.UsageError(f"{SAMPLE_OPTION}={only!r} names {len(samples)} samples of {op.name} "
                                    f"(need exactly 1); its samples: {names}")
        named = C.named_differences(op, conv)
        ref = C.reference_for(op, conv)
        tol = C.tolerance(op, conv)
        fails, witnesses, unsupported = [], [], {}
        for i, sample in samples:
            try:
                got = run_impl(op, sample, profile, impl, conv["outputs"])
            except Unsupported as why:
                unsupported[sample.name] = str(why)
                continue
            except Exception as err:           # the implementation raised: this sample fails, with its error
                if impl is None:
                    raise
                fails.append((i, sample, f"{op.name} sample {i}: raised {type(err).__name__}: {err}", None))
                continue
            try:
                compare_outputs(op, got, ref(sample), f"{op.name} sample {i}", tol)
            except AssertionError as err:
                fails.append((i, sample, str(err), got))
                continue
            if named:
                try:
                    compare_outputs(op, got, op.ref(sample), f"{op.name} sample {i}", tol)
                except AssertionError as err:
                    witnesses.append((i, sample, str(err)))
        node = f"{request.node.path}::{request.node.name}"
        base["unsupported"] = unsupported
        if len(unsupported) == len(samples) and samples:
            _record(request, **base, verdict="unsupported", samples=len(samples))
            pytest.skip(f"{impl_name(impl)} supports none of the {len(samples)} samples of {op.name}: "
                        f"{next(iter(unsupported.values()))}")
        if fails:
            i, sample, err, got = _smallest(fails)
            hint = [label for label, alt in C.alternatives(op, conv)
                    if _matches(op, got, lambda alt=alt: alt(sample), tol)]
            replay = replay_command(node, sample)
            row = one_row(sample, lambda cut: _mismatch(op, run_impl(op, cut, profile, impl, conv["outputs"]),
                                                         ref(cut), tol)) if got is not None else None
            _record(request, **base, verdict="fails", samples=len(samples), failing=[s.name for _, s, _, _ in fails],
                    sample=sample.name, counterexample=_shown(sample, row), error=err, replay=replay, matches=hint)
            also = f"\nits outputs match the reference under: {'; '.join(hint)} (declare it)" if hint else ""
            raise AssertionError(f"{len(fails)} of {len(samples)} samples fail; the smallest:\n{err}\n"
                                 f"sample {i}: {_shown(sample, row)}{also}\nreplay: {replay}") from None
        if witnesses:
            i, sample, err = _smallest(witnesses)

            def differs(cut):
                got_cut = run_impl(op, cut, profile, impl, conv["outputs"])
                return not _mismatch(op, got_cut, ref(cut), tol) and _mismatch(op, got_cut, op.ref(cut), tol)
            _record(request, **base, verdict="differs", samples=len(samples),
                    differences=[C.describe(k, v) for k, v in named],
                    witnesses=[s.name for _, s, _ in witnesses], sample=sample.name,
                    counterexample=_shown(sample, one_row(sample, differs)),
                    error=err, replay=replay_command(node, sample))
        else:
            _record(request, **base, verdict="conforms", samples=len(samples),
                    declared=[C.describe(k, v) for k, v in named])
        if only is not None:
            print(f"ran 1 sample: {samples[0][1].summary()}")
    return test_differential


def _matches(op, got, want, tol) -> bool:
    """Whether `got` equals what the reference `want()` computes; a reference variant that refuses
    the sample (ValueError: it does not apply there) does not match."""
    if got is None:
        return False
    try:
        return not _mismatch(op, got, want(), tol)
    except ValueError:
        return False


def _property(impl):
    def test_property(op, profile, dtype):
        """Hypothesis inputs: the implementation == the reference under its declared conventions.
        Derandomized (the examples depend only on the code), op.max_examples each, unless the
        `thorough` profile asks for more."""
        from hypothesis import HealthCheck, given, settings
        conv = C.conventions_for(impl, op.name)
        if impl is not None and conv["randomness"] == "own" and op.uniforms:
            pytest.skip(f"{op.name} draws its own uniforms (randomness=own): judged by law, test_law")
        ref = C.reference_for(op, conv)
        examples = settings.default.max_examples
        if settings._current_profile != "thorough":
            examples = min(examples, op.max_examples)

        @settings(derandomize=True, database=None, max_examples=examples, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        @given(sample=op.recipe(dtype))
        def check(sample):
            try:
                got = run_impl(op, sample, profile, impl, conv["outputs"])
            except Unsupported:
                return                     # a parameter the engine does not offer (test_differential names it)
            compare_outputs(op, got, ref(sample), f"{op.name} {sample.summary()}", C.tolerance(op, conv))

        check()
    return test_property


def _error_cases(impl):
    for op in REGISTRY.values():
        for e in op.errors():
            marks = []
            if impl is not None:
                marks.append(pytest.mark.skip(reason=f"{IMPL_ENV} is set: error inputs check specverify's own "
                                                     "messages, not part of the conformance interface"))
            elif e.pending:
                marks.append(pytest.mark.xfail(reason=e.pending, raises=e.pending_raises, strict=True))
            yield pytest.param(e, id=f"{op.name}-{e.name}", marks=marks)


def _error_inputs():
    def test_error_inputs(error):
        """Bad input raises a clear error naming the argument, never an IndexError from inside."""
        with pytest.raises(error.exc, match=error.match) as info:
            error.call()
        assert error.arg in str(info.value), (f"the message {str(info.value)!r} does not name the argument "
                                              f"{error.arg!r}")
    return test_error_inputs


def conformance_tests(impl, *, errors: bool = True, missing: str = "skip") -> dict:
    """The test functions for `impl` (None: specverify's own ops), to put in a test module's
    namespace: `globals().update(conformance_tests(impl))`. missing: "skip" lists an op the
    implementation lacks as a skipped test (the report names it), "omit" leaves it out."""
    cases = list(_cases(impl, missing))
    params = pytest.mark.parametrize("op,profile,dtype", cases)
    tests = {"test_differential": pytest.mark.kernels(params(_differential(impl))),
             "test_property": pytest.mark.kernels(params(_property(impl))),
             "test_law": laws.law_test(impl, missing)}
    if errors:
        tests["test_error_inputs"] = pytest.mark.kernels(
            pytest.mark.parametrize("error", list(_error_cases(impl)))(_error_inputs()))
    return tests
