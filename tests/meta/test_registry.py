"""The op registry's own invariants: every record is well formed and complete (edge cases of every
kind, error inputs), malformed records are refused, sample summaries never print tensor contents,
the replay command re-runs exactly one sample, and the conformance interface (SPECVERIFY_IMPL)
passes a correct third implementation and fails a broken one."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specverify import dtypes
from specverify.platform import get_profile, native_platform
from specverify.conformance import registry as R

pytestmark = pytest.mark.kernels

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


def test_replay_command_names_the_test_id_the_implementation_and_the_sample(monkeypatch):
    s = next(iter(R.REGISTRY["row_argmax"].samples("float32", 0)))
    node = "tests/test_ops_differential.py::test_differential[row_argmax-cpu-float32]"
    monkeypatch.delenv(R.IMPL_ENV, raising=False)
    assert R.replay_command(node, s) == f"python -m pytest '{node}' {R.SAMPLE_OPTION}='{s.name}'"
    monkeypatch.setenv(R.IMPL_ENV, "pkg.mod:IMPL")
    assert R.replay_command(node) == f"python -m pytest '{node}' --sv-impl pkg.mod:IMPL"


def test_load_impl_errors_are_clear():
    assert R.load_impl("") is None
    with pytest.raises(ValueError, match="expected module:object"):
        R.load_impl("specverify.conformance.adapters.example")
    with pytest.raises(ValueError, match="cannot import module"):
        R.load_impl("no_such_module_xyz:IMPL")
    with pytest.raises(ValueError, match="has no attribute 'NOPE'"):
        R.load_impl("specverify.conformance.adapters.example:NOPE")
    impl = R.load_impl("specverify.conformance.adapters.example:IMPL")
    assert R.missing_op(impl, R.REGISTRY["row_argmax"]) is None
    assert "'draft_tree'" in R.missing_op(impl, R.REGISTRY["draft_tree"])


# ---------------------------------------------------------------------------------------------
# Golden inputs are a pure function of the seed, the catalogue and the library versions
# (tests/meta/test_golden_portability.py regenerates them under several instruction sets; these
# are the static halves: no inexact call in a generator, no shape from a kernel constant).

GENERATOR_SOURCES = (*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specverify/conformance/registry").glob("*.py")),
                     "specverify/conformance/strategies.py", "tests/support/cases.py",
                     "tests/support/golden_catalogue.py")
UNINITIALIZED = ("empty", "empty_like", "new_empty", "empty_strided")
INEXACT = {
    **{name: "reads uninitialized memory" for name in UNINITIALIZED},
    **{name: "draws floats with vectorized math (Box-Muller, SIMD log / sin / cos): last bits per instruction set"
       for name in ("randn", "randn_like", "rand", "rand_like", "normal", "normal_", "uniform_", "exponential_",
                    "cauchy_", "log_normal_", "standard_normal", "random", "uniform")},
    **{name: "float transcendental: SLEEF SIMD and libm round its last bit differently"
       for name in ("softmax", "log_softmax", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
                    "tan", "tanh", "sigmoid", "pow", "erf", "logsumexp")},
    "get_num_threads": "depends on the machine's thread count",
}


def _inexact_calls(path: str) -> list[str]:
    import ast
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in INEXACT:
                found.append(f"{path}:{node.lineno}: {ast.unparse(func)}(...) {INEXACT[name]}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specverify.kernels"):
            found += [f"{path}:{node.lineno}: imports {node.module}.{a.name}: a kernel tuning constant"
                      for a in node.names if "BLOCK" in a.name]
        elif isinstance(node, ast.Attribute) and "BLOCK" in node.attr and node.attr.isupper():
            found.append(f"{path}:{node.lineno}: reads {ast.unparse(node)}: a kernel tuning constant")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def test_input_generators_make_floats_exactly():
    found = [f for path in GENERATOR_SOURCES for f in _inexact_calls(path)]
    assert not found, ("golden inputs must be a pure function of the seed, the catalogue and the library versions; "
                       "build floats with specverify/conformance/strategies.py's exact building blocks (integer draws, exact "
                       "arithmetic, one rounding by S.cast):\n" + "\n".join(found))


def test_the_scan_sees_what_it_refuses(tmp_path, monkeypatch):
    bad = tmp_path / "gen.py"
    bad.write_text("import torch\nfrom specverify.kernels.attention import BLOCK_N\nfrom specverify.kernels import argmax\n"
                   "x = torch.empty(3)\ny = torch.randn(20, generator=g)\nz = x.softmax(-1)\nb = argmax.ARGMAX_BLOCK\n"
                   "n = torch.get_num_threads()\nok = torch.randint(0, 9, (3,)).double() / 4\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = _inexact_calls("gen.py")
    assert [f.split(":")[1] for f in found] == ["2", "4", "5", "6", "7", "8"], found
    assert "torch.empty(...) reads uninitialized memory" in found[1], found


def _boundary_lengths(op_name: str) -> set[int]:
    """The KV lengths the op's boundary samples hold: live lengths (paged attention), list lengths
    (indexed attention), a request's entries 2 L + 3 (the naive-EAGLE index lists)."""
    out = set()
    for s in R.REGISTRY[op_name].samples(_first_dtype(R.REGISTRY[op_name]), 0):
        if not s.name.startswith("boundary-"):
            continue
        a = s.args
        if "kv_lens" in a:
            out |= {int(k + q) for k, q in zip(a["kv_lens"], a["q_lens"])}
        elif "kv_indptr" in a and "q" in a:
            out |= {int(b - e) for e, b in zip(a["kv_indptr"][:-1], a["kv_indptr"][1:])}
        elif "seq_lens" in a:
            out |= {2 * int(n) + 3 for n in a["seq_lens"]}
    return out


def test_kernel_block_sizes_are_straddled_by_boundary_samples():
    """A kernel's KV block size must sit among the sizes the boundary samples straddle (lengths
    b - 1, b, b + 1), which are data of the registry: a retune fails here instead of rewriting
    golden inputs from the kernel's constant."""
    from specverify.kernels import attention, draft_kv_indices, indexed_attention
    for b in R.attention.KV_BLOCK_SIZES:
        for op in ("paged_attention", "paged_attention_triton", "paged_attention_tensor_cores", "decode_attention_indexed",
                   "decode_attention_indexed_triton"):
            missing = {b - 1, b, b + 1} - _boundary_lengths(op)
            assert not missing, f"{op}: no boundary sample of length {sorted(missing)} around KV block size {b}"
    problems = []
    for module, ops_ in ((attention, ("paged_attention", "paged_attention_triton", "paged_attention_tensor_cores")),
                         (indexed_attention, ("decode_attention_indexed", "decode_attention_indexed_triton"))):
        if module.BLOCK_N not in R.attention.KV_BLOCK_SIZES:
            problems.append(f"{module.__name__}.BLOCK_N = {module.BLOCK_N} is not among the KV block sizes the "
                            f"boundary samples of {', '.join(ops_)} straddle, specverify/conformance/registry/attention.py KV_BLOCK_SIZES "
                            f"= {R.attention.KV_BLOCK_SIZES}: add it there (a group of ATTN_BOUNDARY_LIVE too), then "
                            f"regenerate the goldens (python -m specverify golden regen)")
    copy = draft_kv_indices.BLOCK_N
    if not {copy - 1, copy + 1} <= _boundary_lengths("create_draft_kv_indices_triton"):
        problems.append(f"{draft_kv_indices.__name__}.BLOCK_N = {copy}: the boundary samples of "
                        f"create_draft_kv_indices_triton hold no request of {copy - 1} and {copy + 1} list entries "
                        f"(2 L + 3; sample boundary-list-at-copy-block in specverify/conformance/registry/attention.py)")
    assert not problems, "\n".join(problems)


def test_the_golden_size_cap_drops_no_edge_case():
    """Every named edge case (nan / empty / ulp / boundary) reaches its op golden: none is left out
    for size (tests/support/golden_catalogue.py MAX_SAMPLE_BYTES)."""
    from tests.support import golden_catalogue as cat
    dropped = []
    for case in cat.OP_CASES:
        skipped = case.build()[1]["skipped_samples"]
        dropped += [f"{case.name}: {s}" for s in skipped if any(k in s.split(":", 1)[1] for k in R.EDGE_KINDS)]
    assert not dropped, "edge cases left out of their goldens for size:\n" + "\n".join(dropped)


def test_half_temperature_hits_the_min_p_boundary_exactly():
    """HALF_TEMPERATURE's (x, T): x * float32(scale) / T is float64's -ln 2, whose exp is 0.5 in
    the reference's math.exp and in torch, so the min-p boundary is met exactly."""
    import math
    for kind, (x, t) in R.sampling.HALF_TEMPERATURE.items():
        q = x * float(np.float32(float(kind))) / t
        assert float(np.float32(x)) == x, f"scale {kind}: x = {x!r} is not a float32 value"
        assert q == -0.6931471805599453, f"scale {kind}: x * scale / T = {q!r}"
        assert math.exp(q) == 0.5 and float(torch.exp(torch.tensor(q, dtype=torch.float64))) == 0.5, \
            f"scale {kind}: exp({q!r}) is not 0.5 here: the min-p boundary sample no longer sits on the boundary"


def test_exact_building_blocks():
    from specverify.conformance import strategies as S
    assert S.QUARTER_POW2 == tuple(round(2**20 * 2 ** (j / 4)) for j in range(4))
    x = torch.tensor([[-8.0, -0.25, 0.0, 0.25, 1.0, 7.75, 8.0, 3.5000002]])
    w = S.pow2_weights(x)
    assert w[0, 2] == 2**28 and w[0, 4] == 2**29 and w[0, 0] == 2**20 and w[0, 6] == 2**36
    assert w[0, 3] == S.QUARTER_POW2[1] << 8 and w[0, 1] == S.QUARTER_POW2[3] << 7
    assert w[0, 7] == S.pow2_weights(torch.tensor([3.5]))[0]            # rounded down to the quarter grid
    with pytest.raises(ValueError, match="finite and in"):
        S.pow2_weights(torch.tensor([8.25]))
    p = S.pow2_probs(torch.tensor([[0.0, 1.0, 1.0, float("nan")], [0.0, 1.0, 1.0, 2.0]]))
    assert torch.isnan(p[0]).all() and p[1].tolist() == [1 / 9, 2 / 9, 2 / 9, 4 / 9]
    gen = torch.Generator().manual_seed(0)
    n = S.normalish(gen, (4000,))
    assert abs(float(n.mean())) < 0.1 and abs(float(n.std()) - 1) < 0.1 and bool((n.float().double() == n).all())
    u = S.unit_floats(gen, (1000,))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    b = S.binade_rows(gen, 2, 500, -11, 9)
    mags = b.abs()
    assert float(mags.min()) >= 2.0**-11 and float(mags.max()) < 2.0**10 and bool((b < 0).any() and (b > 0).any())
    for dt, (bits_dtype, bits) in S.CANONICAL_NAN.items():
        y = S.cast(torch.tensor([float("nan"), -float("nan"), 1.5]), dt)
        assert y.view(bits_dtype)[:2].tolist() == [bits, bits] and float(y[2]) == 1.5
    draws = S.draw_from_weights(gen, torch.tensor([[1, 0, 3]] * 4000))
    assert set(draws.tolist()) == {0, 2} and 0.7 < float((draws == 2).double().mean()) < 0.8
