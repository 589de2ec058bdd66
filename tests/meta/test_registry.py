"""The op registry's own invariants: every record is well formed and complete (edge cases of every
kind, error inputs), malformed records are refused, sample summaries never print tensor contents,
the replay command re-runs exactly one sample, and the conformance interface (SPECVERIFY_IMPL)
passes a correct third implementation and fails a broken one."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specverify import dtypes
from specverify.platform import get_profile, native_platform
from tests.support import registry as R

ROOT = Path(__file__).resolve().parents[2]
OPS = list(R.REGISTRY.values())
IDS = list(R.REGISTRY)


def _first_dtype(op: R.OpSpec) -> str:
    return op.dtypes_for("cpu")[0]


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_record_validates_and_outputs_match_compare_keys(op):
    R.validate_record(op)
    assert op.dtypes_for("cpu"), f"{op.name} runs on no CPU dtype"
    for policy, names in op.dtypes.items():
        assert all(n in dtypes.DTYPES for n in names)
    sample = next(iter(op.samples(_first_dtype(op), 0)))
    got = R.run_impl(op, sample, get_profile(native_platform()))
    want = op.ref(sample)
    assert set(got) == set(op.compare) == set(want), (
        f"{op.name}: impl outputs {sorted(got)}, reference outputs {sorted(want)}, compare {sorted(op.compare)}")


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_every_op_has_edge_cases_and_error_inputs(op):
    exempt = dict(op.edge_exempt)
    for dtype in sorted({d for names in op.dtypes.values() for d in names}):
        names = [s.name for s in op.samples(dtype, 0)]
        assert len(names) == len(set(names)), f"{op.name}/{dtype}: sample names repeat (replay needs unique names)"
        for kind in R.EDGE_KINDS:
            assert kind in exempt or any(kind in n for n in names), (
                f"{op.name}/{dtype}: no edge case named with {kind!r} (and no edge_exempt reason)")
    errors = list(op.errors())
    assert errors, f"{op.name} has no error input"
    assert len({e.name for e in errors}) == len(errors), f"{op.name}: error input names repeat"
    for e in errors:
        assert issubclass(e.exc, Exception) and e.match and e.arg, f"{op.name}/{e.name}: incomplete ErrorInput"


def _good(**changes) -> R.OpSpec:
    base = R.REGISTRY["row_argmax"]
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return R.OpSpec(**(fields | changes))


BAD_RECORDS = {
    "hyphen-in-name": dict(name="row-argmax"),
    "no-compare": dict(compare={}),
    "unknown-comparison": dict(compare={"index": "roughly"}),
    "unknown-dtype": dict(dtypes={"cpu": ("float12",)}),
    "unknown-policy": dict(dtypes={"tpu": ("float32",)}),
    "no-dtypes": dict(dtypes={}),
    "unknown-tolerance": dict(tolerance_dtype="int8"),
    "impl-not-callable": dict(impl=None),
    "max-examples-0": dict(max_examples=0),
    "edge-exempt-unknown-kind": dict(edge_exempt=(("weird", "because"),)),
    "edge-exempt-no-reason": dict(edge_exempt=(("nan", ""),)),
}


def test_a_good_record_builds():
    assert _good().name == "row_argmax"


@pytest.mark.parametrize("changes", BAD_RECORDS.values(), ids=list(BAD_RECORDS))
def test_validation_rejects_bad_records(changes):
    with pytest.raises(ValueError, match=r"^op "):
        _good(**changes)


SENTINEL = 98765.4321


def test_summary_shows_shapes_and_dtypes_never_contents():
    s = R.SampleInput("probe", {"t": torch.full((2, 3), SENTINEL), "a": np.full((4,), SENTINEL),
                                "d": {"inner": torch.full((1,), SENTINEL)}, "l": [torch.full((2,), SENTINEL)] * 3,
                                "b": b"\x01" * 9, "k": 3}, seed=5)
    text = s.summary()
    assert "98765" not in text
    for part in ("t=(2, 3):float32", "a=(4,):np.float64", "inner: (1,):float32", "l=[3 items]", "b=<9 bytes>",
                 "k=3", "seed=5", "probe"):
        assert part in text, (part, text)
    assert repr(s) == text


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_real_sample_summaries_hold_no_tensor_contents(op):
    for sample in op.samples(_first_dtype(op), 0):
        text = sample.summary()
        assert not re.search(r"tensor\(|array\(|\[\[|nan,|inf,", text), text
        assert len(text) < 400, text


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_every_sample_name_selects_exactly_one_sample(op):
    dtype = _first_dtype(op)
    samples = R.select_samples(op, dtype, 11)
    assert len({s.name for _, s in samples}) == len(samples), f"{op.name}: sample names repeat"
    for i, s in (samples[0], samples[len(samples) // 2], samples[-1]):
        assert [j for j, _ in R.select_samples(op, dtype, 11, s.name)] == [i]
    assert R.select_samples(op, dtype, 11, "no-such-sample") == []


def test_replay_command_names_the_test_id_and_the_sample():
    s = next(iter(R.REGISTRY["row_argmax"].samples("float32", 0)))
    cmd = R.replay_command("test_differential", "row_argmax", "cpu", "float32", s)
    assert "tests/test_ops_differential.py::test_differential[row_argmax-cpu-float32]" in cmd
    assert f"{R.SAMPLE_OPTION}='{s.name}'" in cmd


def test_load_impl_errors_are_clear():
    assert R.load_impl("") is None
    with pytest.raises(ValueError, match="expected module:object"):
        R.load_impl("tests.support.example_impl")
    with pytest.raises(ValueError, match="cannot import module"):
        R.load_impl("no_such_module_xyz:IMPL")
    with pytest.raises(ValueError, match="has no attribute 'NOPE'"):
        R.load_impl("tests.support.example_impl:NOPE")
    impl = R.load_impl("tests.support.example_impl:IMPL")
    assert R.missing_op(impl, R.REGISTRY["row_argmax"]) is None
    assert "'draft_tree'" in R.missing_op(impl, R.REGISTRY["draft_tree"])


# ---------------------------------------------------------------------------------------------
# End to end, in subprocesses: the conformance interface and the replay command.

PLUGGED_OPS = "test_differential and (select_draft_topk or sample_from_probs or row_argmax or draft_tree)"


def _pytest(args: list[str], impl: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != R.IMPL_ENV and not k.startswith("PYTEST_")}
    if impl:
        env[R.IMPL_ENV] = impl
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
                           "-o", "addopts=-ra", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_example_impl_passes_and_missing_ops_are_reported():
    r = _pytest(["tests/test_ops_differential.py", "-k", PLUGGED_OPS, "-rs"], "tests.support.example_impl:IMPL")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"\b[1-9]\d* passed", out), out[-2000:]
    assert "has no attribute 'draft_tree'" in out and "has no attribute 'row_argmax_triton'" in out, out[-2000:]


def test_broken_impl_fails_and_its_replay_command_reruns_one_sample():
    impl = "tests.support.example_impl:BROKEN"
    r = _pytest(["tests/test_ops_differential.py", "-k", "test_differential and select_draft_topk", "-x"], impl)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    m = re.search(r"replay: (\S+=\S+ )?python -m pytest (.+)$", out, re.MULTILINE)
    assert m, out[-3000:]
    assert m.group(1) and m.group(1).strip() == f"{R.IMPL_ENV}={impl}", m.group(0)
    args = shlex.split(m.group(2))
    sample = re.search(rf"{R.SAMPLE_OPTION}=(\S+)", m.group(2)).group(1).strip("'")
    replay = _pytest([*args, "-s"], impl)
    rout = replay.stdout + replay.stderr
    assert replay.returncode == 1 and "1 failed" in rout, rout[-3000:]
    assert re.search(rf"sample \d+: {re.escape(sample)}\(", rout), rout[-3000:]
    # The same command with the correct implementation runs exactly that one sample, and passes.
    ok = _pytest([*args, "-s"], "tests.support.example_impl:IMPL")
    oout = ok.stdout + ok.stderr
    assert ok.returncode == 0 and "1 passed" in oout and f"ran 1 sample: {sample}(" in oout, oout[-3000:]
