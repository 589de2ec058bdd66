"""The conformance machinery itself, in-process (tests/meta/test_conformance_plugin.py runs it as a
user does, in subprocesses; these are the cheap checks of the parts those runs only pass through).

- conventions: how `conventions` and `op_conventions` merge, which declared values are named
  differences, and the hint a failing engine gets;
- the reference variants the conventions select (keep_tied, accept le, nan_ignored) do what
  conventions.DIFFERENCES says, and every one of them is witnessed by a registry sample (else a
  declared difference could never be shown, nor an undeclared one caught);
- law tests: N has the stated power against every stated alternative, the alternatives are what
  their labels say, validity and support are checked, an engine's generator is reseeded per test,
  and an engine taking probabilities gets the tempered softmax;
- the generated differential test: its verdicts (differs / fails / unsupported), the smallest
  counterexample, real engine errors never hidden as 'unsupported';
- the report (every differential row, `conformance diff`) and the plugin's configure hook.
"""

from __future__ import annotations

import math
import os
import types

import numpy as np
import pytest
import torch

from reference import logits as rlogits
from reference import sampling as rsampling
from reference import spec as rspec
from specverify.conformance import conventions as C
from specverify.conformance import laws, plugin, report, stats, suite
from specverify.conformance.adapters import Unsupported
from specverify.conformance.adapters.example import ExampleImpl, _filter
from specverify.conformance.registry import REGISTRY, compare_outputs
from specverify.platform import get_profile, native_platform
from tests.support import broken_impls


# ---------------------------------------------------------------------------------------------
# conventions


class _Declares:
    conventions = {"randomness": "own", "topk_ties": "keep_tied"}
    op_conventions = {"verify_naive": {"randomness": "counter"}}


def test_conventions_per_op_override_the_engine_wide_ones():
    impl = _Declares()
    assert C.conventions_for(impl, "verify_naive") == {**C.SPECVERIFY, "topk_ties": "keep_tied"}
    assert C.conventions_for(impl, "sample_filtered") == {**C.SPECVERIFY, "randomness": "own",
                                                          "topk_ties": "keep_tied"}
    assert C.conventions_for(None, "verify_naive") == C.SPECVERIFY


@pytest.mark.parametrize("declared, match", [({"tie_rule": "index"}, "unknown convention 'tie_rule'"),
                                             ({"accept_rule": "leq"}, "'accept_rule' = 'leq'"),
                                             (["topk_ties"], "expected a dict")])
def test_conventions_unknown_keys_and_values_are_refused(declared, match):
    impl = types.SimpleNamespace(conventions=declared)
    with pytest.raises(C.ConventionError, match=match):
        C.conventions_for(impl, "sampling_probs")


def test_conventions_every_declared_semantic_difference_the_op_knows_is_named():
    everything = {**C.SPECVERIFY, **{k: C.CONVENTIONS[k][1] for k in C.SEMANTIC}}
    for op in REGISTRY.values():
        want = [(k, C.CONVENTIONS[k][1]) for k in op.conventions]
        assert C.named_differences(op, everything) == want, op.name
        assert C.named_differences(op, C.SPECVERIFY) == []
        ref = C.reference_for(op, everything)
        assert (ref.keywords if want else {}) == dict(want), op.name


def _sampling_witness():
    """A sampling_probs sample on which topk keep_tied and topp keep_tied both change the output."""
    op = REGISTRY["sampling_probs"]
    ref_k = C.reference_for(op, {**C.SPECVERIFY, "topk_ties": "keep_tied"})
    ref_p = C.reference_for(op, {**C.SPECVERIFY, "topp_ties": "keep_tied"})
    for sample in op.samples("float32", 0):
        if not (_matches(op, ref_k(sample), op.ref(sample)) or _matches(op, ref_p(sample), op.ref(sample))):
            return op, sample
    raise AssertionError("no sampling_probs sample is tied at both cuts")


def _matches(op, got, want) -> bool:
    try:
        compare_outputs(op, got, want, op.name)
    except AssertionError:
        return False
    return True


def test_conventions_hint_names_the_combination_a_failing_engine_follows():
    op, sample = _sampling_witness()
    follows = {**C.SPECVERIFY, "topk_ties": "keep_tied", "topp_ties": "index"}
    got = C.reference_for(op, follows)(sample)
    alternatives = dict(C.alternatives(op, C.SPECVERIFY))
    assert sorted(alternatives) == ["topk_ties=index, topp_ties=keep_tied", "topk_ties=keep_tied, topp_ties=index",
                                    "topk_ties=keep_tied, topp_ties=keep_tied"]
    assert [label for label, alt in alternatives.items() if _matches(op, got, alt(sample))] == [
        "topk_ties=keep_tied, topp_ties=index"]


# ---------------------------------------------------------------------------------------------
# the reference variants


def test_reference_variant_keep_tied_keeps_every_token_tied_at_the_cut():
    p = [0.4, 0.2, 0.2, 0.2]
    assert rsampling.keep_top_k(p, 2, "index") == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    assert rsampling.keep_top_k(p, 2, "value") == pytest.approx(p)
    assert rsampling.keep_top_k(p, 1, "value") == pytest.approx([1.0, 0.0, 0.0, 0.0])
    # top-p 0.5 keeps tokens 0 and 1 (mass before token 2: 0.6); the value rule keeps 1's ties too
    assert rsampling.keep_top_p(p, 0.5, "index") == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    assert rsampling.keep_top_p(p, 0.5, "value") == pytest.approx(p)
    assert rsampling.keep_top_p([0.5, 0.3, 0.2, 0.0], 0.6, "value") == pytest.approx([0.625, 0.375, 0.0, 0.0])


def test_reference_variant_accept_le_accepts_a_coin_equal_to_the_threshold():
    p0, p1, q = [0.5, 0.5], [0.25, 0.75], [1.0, 0.0]           # ratio p0(0) / q(0) = 0.5 exactly
    assert rspec.naive_verify([p0, p1], 0, 0.5, 0.9, draft_q=q, accept="lt") == ([0, -1], 0, 1)
    assert rspec.naive_verify([p0, p1], 0, 0.5, 0.9, draft_q=q, accept="le") == ([0, 1], 1, 1)
    assert rspec.naive_verify([p0, p1], 0, 0.4999, 0.1, draft_q=q, accept="lt") == ([0, 1], 1, 0)
    # the tree: root 0 with one child (token 1, p 0.25 at the root); the coin at the child's
    # cumulative 0.25 is rejected by "lt", accepted by "le"
    probs = [[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]]
    lt = rspec.stochastic_verify([0, 1], [-1, 0], probs, [0.25, 0.0], 0.1, num_steps=1, accept="lt")
    le = rspec.stochastic_verify([0, 1], [-1, 0], probs, [0.25, 0.0], 0.1, num_steps=1, accept="le")
    assert lt[:2] == ([0, -1], 0) and le == ([0, 1], 1, 2)


def test_reference_variant_nan_ignored_reads_nan_as_minus_1e30():
    nan, inf = math.nan, math.inf
    assert rlogits.greedy_token([nan, -3.0, -2.0]) == 0
    assert rlogits.greedy_token([nan, -3.0, -2.0], "nan_ignored") == 2
    assert rlogits.greedy_token([-5e29, nan, -2e30], "nan_ignored") == 0
    assert rlogits.greedy_token([-inf, nan, -inf], "nan_ignored") == 1
    assert rlogits.greedy_token([nan, nan], "nan_ignored") == 0
    assert rlogits.greedy_token([1.0, inf, nan], "nan_ignored") == 1


def _variants():
    for op in REGISTRY.values():
        for key in op.conventions:
            for value in C.CONVENTIONS[key][1:]:
                yield pytest.param(op, key, value, id=f"{op.name}-{key}-{value}")


@pytest.mark.parametrize("op, key, value", list(_variants()))
def test_every_declared_convention_is_witnessed_by_a_registry_sample(op, key, value):
    """The suite can show a declared difference (and catch an undeclared one) only on a sample where
    the two references disagree: one of the op's samples, in some dtype, must be one."""
    ref = C.reference_for(op, {**C.SPECVERIFY, key: value})
    for dtype in op.dtypes_for("cpu"):
        for sample in op.samples(dtype, suite.seed_for(f"{op.name}-{dtype}")):
            if not _matches(op, ref(sample), op.ref(sample)):
                return
    raise AssertionError(f"no {op.name} sample tells {key}={value} from {C.SPECVERIFY[key]}")


# ---------------------------------------------------------------------------------------------
# law tests


def _law_cases(conv=None):
    conv = conv or C.SPECVERIFY
    for spec in laws.LAWS.values():
        for case in spec.cases(conv):
            yield pytest.param(spec, case, id=f"{spec.op}-{case.name}")


@pytest.mark.parametrize("spec, case", list(_law_cases()))
def test_law_draws_have_the_stated_power_against_every_alternative(spec, case):
    n, info = case.draws()
    assert n <= laws.MAX_DRAWS and set(info) == set(case.alternatives) and info
    for label, alt in case.alternatives.items():
        assert stats.power_at(case.law, alt, n, alpha=laws.ALPHA) >= laws.POWER, label
        assert info[label][1] >= laws.POWER, label


def test_law_alternatives_are_what_their_labels_say():
    for case in laws.LAWS["sample_from_probs"].cases(C.SPECVERIFY):
        p = case.args["p"][0].tolist()
        hot = rsampling.softmax([math.log(x) / 1.1 if x > 0 else -math.inf for x in p])
        assert case.alternatives["temperature x 1.1"] == pytest.approx(laws._as_law(hot), rel=1e-12), case.name
    for case, (name, vocab, (t, k, top_p, min_p)) in zip(laws.LAWS["sample_filtered"].cases(C.SPECVERIFY),
                                                        laws.FILTER_CASES):
        z = case.args["logits"][0].tolist()
        hot = rsampling.filtered_probs(z, t * 1.1, k, top_p, min_p)
        assert case.alternatives["temperature x 1.1"] == pytest.approx(laws._as_law(hot), rel=1e-12), name
        assert case.law == pytest.approx(laws._as_law(rsampling.filtered_probs(z, t, k, top_p, min_p)), rel=1e-12)


def _case(op: str, name: str, conv=None):
    [case] = [c for c in laws.LAWS[op].cases(conv or C.SPECVERIFY) if c.name == name]
    return case


class _CountsDisagreeWithNodes(ExampleImpl):
    """The chain's nodes say 'rejected' on every row, whatever the count says."""

    def verify_naive(self, probs, draft, mode):
        out = super().verify_naive(probs, draft, mode)
        out["accept_nodes"][:, 1] = -1
        return out


def test_law_validity_ties_the_accepted_nodes_to_the_counts():
    spec, case = laws.LAWS["verify_naive"], _case("verify_naive", "reject-often-V6")
    good, bad = ExampleImpl(), _CountsDisagreeWithNodes()
    conv = C.conventions_for(good, "verify_naive")
    assert laws.emit(spec, case, 2000, good, conv, "cpu", 1)[1] is None
    counts, problem = laws.emit(spec, case, 2000, bad, conv, "cpu", 1)
    assert problem and "accepted counts disagree with the accepted nodes" in problem
    # the cells of an invalid chunk are not counted: the problem is named, not blurred into the law
    assert not counts


class _OneTokenOutsideTheSupport(ExampleImpl):
    """sample_filtered emits, once per call, a token the filters removed."""

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        out = super().sample_filtered(logits, scale, temperature, top_k, top_p, min_p)
        p = self.sampling_probs(logits, scale, temperature, top_k, top_p, min_p)["p"]
        out["token"][0] = int(np.argmin(p[0]))
        return out


def test_law_support_a_draw_outside_the_law_is_named():
    spec, case = laws.LAWS["sample_filtered"], _case("sample_filtered", "top-k-V96")
    impl = _OneTokenOutsideTheSupport()
    counts, problem = laws.emit(spec, case, 5000, impl, C.conventions_for(impl, "sample_filtered"), "cpu", 3)
    assert problem and "outside the law's support" in problem, problem


def test_law_an_engine_generator_is_reseeded_per_test():
    spec, case = laws.LAWS["sample_filtered"], _case("sample_filtered", "all-filters-V40")
    impl = ExampleImpl()
    conv = C.conventions_for(impl, "sample_filtered")
    first = laws.emit(spec, case, 3000, impl, conv, "cpu", 11)[0]
    assert laws.emit(spec, case, 3000, impl, conv, "cpu", 11)[0] == first         # same seed: same draws
    assert laws.emit(spec, case, 3000, impl, conv, "cpu", 12)[0] != first


class _TakesProbs(ExampleImpl):
    """An engine whose sampler takes the (tempered) probabilities, as FlashInfer's does."""

    op_conventions = {"sample_filtered": {"randomness": "own", "inputs": "probs"}}

    def sample_filtered(self, probs, top_k, top_p, min_p):
        rows = [_filter(row / row.sum(), top_k, top_p, min_p) for row in probs.double().numpy()]
        cumulative = np.cumsum(np.array(rows), axis=1)
        u = self.rng.random(len(rows)) * cumulative[:, -1]
        return {"token": (cumulative > u[:, None]).argmax(axis=1).astype(np.int64)}


@pytest.mark.parametrize("name", [c[0] for c in laws.FILTER_CASES])
def test_law_an_engine_taking_probs_gets_the_softmax_at_the_temperature(name):
    impl = _TakesProbs()
    conv = C.conventions_for(impl, "sample_filtered")
    spec, case = laws.LAWS["sample_filtered"], _case("sample_filtered", name, conv)
    assert set(case.args) == {"probs", "top_k", "top_p", "min_p"}
    n, _ = case.draws()
    counts, problem = laws.emit(spec, case, n, impl, conv, "cpu", suite.seed_for(name))
    stat, pvalue, df = stats.pooled_chi_square(counts, case.law, n)
    assert problem is None and pvalue >= laws.ALPHA, (stat, df, pvalue)


class _TokensAsAColumn(ExampleImpl):
    """sample_filtered answers its tokens as [N, 1] (the engine's own layout), not [N]."""

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        out = super().sample_filtered(logits, scale, temperature, top_k, top_p, min_p)
        return {"token": out["token"].reshape(-1, 1)}


def test_law_a_token_output_of_the_wrong_shape_is_a_validity_problem():
    spec, case = laws.LAWS["sample_filtered"], _case("sample_filtered", "top-p-V48")
    impl = _TokensAsAColumn()
    counts, problem = laws.emit(spec, case, 1000, impl, C.conventions_for(impl, "sample_filtered"), "cpu", 1)
    assert problem and "shape" in problem, problem


# ---------------------------------------------------------------------------------------------
# the generated differential test, called in-process with a stand-in for pytest's request


def _request(name: str):
    node = types.SimpleNamespace(name=name, path="tests/x.py", user_properties=[])
    return types.SimpleNamespace(node=node, config=types.SimpleNamespace(getoption=lambda option: None))


def _differential(impl, op_name: str, dtype: str = "float32"):
    """(outcome, exception, record) of test_differential for `impl` on one op."""
    test = suite.conformance_tests(impl, errors=False, missing="omit")["test_differential"]
    request = _request(f"test_differential[{op_name}-{dtype}]")
    try:
        test(REGISTRY[op_name], get_profile(native_platform()), dtype, request)
        outcome, err = "passed", None
    except AssertionError as e:
        outcome, err = "failed", e
    except pytest.skip.Exception as e:
        outcome, err = "skipped", e
    records = [v for k, v in request.node.user_properties if k == suite.RECORD_KEY]
    return outcome, err, (records[-1] if records else None), request


def test_declared_differences_are_named_with_their_witnesses():
    outcome, err, record, _ = _differential(broken_impls.KEEP_TIED_DECLARED, "sampling_probs")
    assert outcome == "passed", err
    assert record["verdict"] == "differs", record
    assert [d.split(":")[0] for d in record["differences"]] == ["topk_ties=keep_tied", "topp_ties=keep_tied"]
    assert record["witnesses"] and record["sample"] in record["witnesses"]


def test_an_undeclared_convention_fails_with_the_hint_it_matches():
    outcome, err, record, _ = _differential(broken_impls.KEEP_TIED_UNDECLARED, "sampling_probs")
    assert outcome == "failed" and record["verdict"] == "fails", record
    assert "topk_ties=keep_tied, topp_ties=keep_tied" in record["matches"], record["matches"]
    assert not any(m == "topk_ties=index, topp_ties=index" for m in record["matches"])
    assert "(declare it)" in str(err)


def test_the_smallest_counterexample_is_the_smallest_failing_sample():
    impl, op = broken_impls.LAST_MAXIMAL_INDEX, REGISTRY["row_argmax"]
    outcome, err, record, request = _differential(impl, "row_argmax")
    assert outcome == "failed" and record["verdict"] == "fails"
    samples = {s.name: s for s in op.samples("float32", suite.seed_for(request.node.name))}
    sizes = {name: suite._numel(samples[name].args) for name in record["failing"]}
    shown = record["sample"]
    assert sizes[shown] == min(sizes.values()), (shown, sizes)
    assert shown != record["failing"][0] or len(set(sizes.values())) == 1     # the first is not the smallest here
    assert record["replay"].endswith(f"--sv-sample='{shown}'"), record["replay"]
    assert f"'{request.node.path}::{request.node.name}'" in record["replay"]


class _Crashes(ExampleImpl):
    def row_argmax(self, x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class _SupportsNoNanRows(ExampleImpl):
    def row_argmax(self, x):
        if torch.isnan(x).any():
            raise Unsupported("this engine refuses NaN logits")
        return super().row_argmax(x)


class _SupportsNothing(ExampleImpl):
    def row_argmax(self, x):
        raise Unsupported("no row_argmax for this dtype")


def test_unsupported_samples_are_named_and_an_engine_error_is_never_one():
    outcome, err, record, _ = _differential(_Crashes(), "row_argmax")      # a crash fails, never skips
    assert outcome == "failed" and record["verdict"] == "fails" and not record["unsupported"], (err, record)
    assert "raised RuntimeError: CUDA error: an illegal memory access" in record["error"], record["error"]
    assert len(record["failing"]) == record["samples"]
    outcome, err, record, _ = _differential(_SupportsNoNanRows(), "row_argmax")
    assert outcome == "passed" and record["verdict"] == "conforms", (err, record)
    assert record["unsupported"] and all("NaN" in why for why in record["unsupported"].values())
    assert all("nan" in name for name in record["unsupported"])
    outcome, err, record, _ = _differential(_SupportsNothing(), "row_argmax")
    assert outcome == "skipped" and record["verdict"] == "unsupported", (err, record)


# ---------------------------------------------------------------------------------------------
# the report


META = {"engine": "e 1.0", "impl": "m:e", "device": "cpu", "cuda": None, "versions": {"e": "1.0"},
        "triton_interpret": "1", "command": "pytest --pyargs specverify.conformance"}


def _row(op, verdict, **extra):
    return {"nodeid": f"test_conformance.py::test_differential[{op}-cpu-float32]", "test": "differential",
            "op": op, "profile": "cpu", "dtype": "float32", "verdict": verdict, **extra}


ROWS = [_row("row_argmax", "conforms", samples=7, declared=[]),
        _row("sampling_probs", "differs", samples=9, differences=["topk_ties=keep_tied: ..."], witnesses=["a"],
             counterexample="a(seed=1)", error="p differs", replay="python -m pytest x"),
        _row("select_draft_topk", "fails", samples=9, failing=["b", "c"], counterexample="b(seed=1)",
             error="index differs", replay="python -m pytest y", matches=[]),
        _row("verify_naive", "law", detail="draws its own uniforms: judged by test_law"),
        _row("verify_stochastic", "unsupported", detail="draws its own uniforms and has no law test"),
        {"nodeid": "test_conformance.py::test_differential[draft_tree-cpu-float32]", "verdict": "skipped",
         "reason": "e has no attribute 'draft_tree': op not implemented"}]


def test_report_markdown_has_a_row_for_every_verdict():
    md = report.markdown(META, ROWS)
    table = [line for line in md.splitlines() if line.startswith("| ") and "**" in line]
    assert [line.split("|")[1].strip() for line in table] == [
        "row_argmax", "sampling_probs", "select_draft_topk", "verify_naive", "verify_stochastic"], md
    assert "| test_differential[draft_tree-cpu-float32] | e has no attribute 'draft_tree'" in md
    assert "Summary: 1 conforms, 1 differs, 1 fails, 1 unsupported, 1 law, 1 skipped" in md


def test_report_diff_sees_every_moved_verdict():
    def data(rows):
        return {"meta": META, "results": rows}
    assert report.diff(data(ROWS), data(ROWS)) == []
    moved = [dict(r) for r in ROWS]
    moved[0]["verdict"] = "fails"
    moved[0]["failing"] = ["x"]
    moved[2]["failing"] = ["b"]                       # still failing, on other samples
    del moved[3]
    lines = report.diff(data(moved), data(ROWS))
    assert [line.split(":")[0] for line in lines] == [
        "test_differential[row_argmax-cpu-float32]", "test_differential[select_draft_topk-cpu-float32]",
        "test_differential[verify_naive-cpu-float32]"], lines


def test_report_a_test_that_raised_before_its_verdict_is_still_a_failing_row(tmp_path):
    collector = report.ReportCollector(types.SimpleNamespace(), str(tmp_path / "r"))
    crashed = types.SimpleNamespace(when="call", passed=False, failed=True, skipped=False, user_properties=[],
                                    nodeid="test_conformance.py::test_law[verify_naive-reject-often-V6]",
                                    longrepr="E   TypeError: unhashable type: 'list'")
    collector.pytest_runtest_logreport(crashed)
    assert [r["verdict"] for r in collector.rows] == ["fails"], collector.rows


# ---------------------------------------------------------------------------------------------
# the plugin's configure hook


class _Config:
    def __init__(self, worker: bool = False, **options):
        self.options = {f"--sv-{k}": v for k, v in options.items()}
        self.args = []
        self.registered = []
        self.pluginmanager = types.SimpleNamespace(register=lambda obj, name: self.registered.append(name))
        if worker:
            self.workerinput = {"workerid": "gw0"}

    def getoption(self, name):
        return self.options.get(name)

    def addinivalue_line(self, name, line):
        pass


@pytest.fixture
def clean_env(monkeypatch):
    for name in (plugin.IMPL_ENV, "TRITON_INTERPRET"):
        monkeypatch.setenv(name, "-")        # recorded first, so the test's changes are undone
        monkeypatch.delenv(name)


def test_plugin_configure_sets_the_impl_and_the_interpreter(clean_env, tmp_path):
    plugin.pytest_configure(_Config(impl="m:obj"))
    assert os.environ[plugin.IMPL_ENV] == "m:obj"
    assert os.environ.get("TRITON_INTERPRET") == (None if torch.cuda.is_available() else "1")


def test_plugin_report_is_written_by_the_controller_only(clean_env, tmp_path):
    worker, controller = _Config(worker=True, report=str(tmp_path / "r")), _Config(report=str(tmp_path / "r"))
    plugin.pytest_configure(worker)
    plugin.pytest_configure(controller)
    assert worker.registered == [] and controller.registered == ["specverify-conformance-report"]


class _Float32Probs(ExampleImpl):
    """sampling_probs computed right but returned in float32 (as FlashInfer's renorm is)."""

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        return {"p": super().sampling_probs(logits, scale, temperature, top_k, top_p, min_p)["p"].astype(np.float32)}


class _Float32ProbsDeclared(_Float32Probs):
    conventions = {"precision": "float32"}


def test_precision_float32_is_compared_by_the_float32_tolerance_only_when_declared():
    outcome, err, record, _ = _differential(_Float32ProbsDeclared(), "sampling_probs")
    assert outcome == "passed" and record["verdict"] == "conforms", (err, record)
    outcome, err, record, _ = _differential(_Float32Probs(), "sampling_probs")
    assert outcome == "failed" and "float64 tolerance" in record["error"], (err, record)
