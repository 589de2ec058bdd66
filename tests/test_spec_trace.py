"""Trace equality (DESIGN invariant 8, docs/semantics.md 6.5): `generate(spec=..., trace=True)`
equals the cache-free reference speculative decoder `reference.eagle.generate` cycle by cycle —
tree tokens, tree parents, accepted nodes, emitted tokens — and in its final tokens, for greedy
and for sampling (the same explicit uniforms on both sides).

The matrix is all-pairs over topk x steps x draft width x page size x batch x logits dtype (FP8
formats included) x logits scale (static 1, static != 1, per row) x sampling parameters x draft
(the plain head, and the head steered by `tests/support/steering.py`, the same `steer_logits`
applied on the reference side through `draft_logits_hook`) x EOS. Plain-head acceptance is near
zero; the steered drafts give deep accepted paths, so a draft-side bug shows in the trace even
where the tokens stay lossless.

The optimized models compute in float64: the reference's near-tie thresholds (module docstring
of `reference/eagle.py`) assume float64 arithmetic on both sides, so a float32 optimized model
would turn ordinary rounding into "near-ties" everywhere. Where the reference reports a near-tie
for a request, the comparison of that request stops at that cycle (earlier cycles and the tokens
they emitted are still compared); the skips are counted, reported as a `TraceNearTieWarning`
(shown in pytest's warnings summary, with or without -s) and in the test's user properties, and
a case fails when more than `MAX_SKIPPED_FRACTION` of its requests stop early, or when it
compares no cycle at all.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

import reference
import specverify
from specverify import SpecConfig
from tests.support.allpairs import all_pairs, case_id, draft_tokens, uncovered_pairs
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts
from tests.support import traces
from tests.support.steering import SteeredDraft, steer_logits, steered_models
from tests.support.traces import TraceNearTieWarning, compare_traces, fields

pytestmark = pytest.mark.e2e

MAX_SKIPPED_FRACTION = 0.5    # of a case's requests whose comparison a near-tie stops early

SCALES = {"1": ("static", 1.0), "0.37": ("static", 0.37), "3.5": ("static", 3.5), "per_row": ("per_row", None)}
SAMPLING = {
    "greedy": dict(),
    "t0.3-topk20": dict(temperature=0.3, top_k=20),    # low temperatures: the steered (greedy)
    "t1.0-topp0.9": dict(temperature=1.0, top_p=0.9),
    "t0.4-minp0.1": dict(temperature=0.4, min_p=0.1),    # drafts get accepted under sampling too
}
DRAFTS = {"plain": None, "right": 1.0, "partial": 0.6}
FACTORS = {
    "topk": [1, 2, 4],
    "steps": [1, 2, 3],
    "draft": ["chain", "two", "wide"],      # D = S+1 / 2 / up to 8 (topk == 1 always uses S+1)
    "page_size": [1, 4],
    "bs": [1, 3],
    "logits_dtype": ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"],
    "scale": list(SCALES),
    "sampling": list(SAMPLING),
    "head": list(DRAFTS),
    "eos": [False, True],
}


# The case data (prompts, budgets, sampling seed) is keyed by the case id and this salt. Salt 1:
# re-keyed when the sampling uniforms became counter-based (docs/semantics.md 4); under salt 0 one
# bs=1 bfloat16 case met a draft near-tie in its first cycle and compared nothing.
CASE_KEY_SALT = 1

PAIRWISE = all_pairs(FACTORS)
_SLOW_AXES = ("topk", "steps", "draft", "sampling", "head")
SLOW = [dict(zip(_SLOW_AXES, values)) for values in itertools.product(*(FACTORS[a] for a in _SLOW_AXES))]
for _i, _c in enumerate(SLOW):   # the remaining factors rotate through their values
    for _name in FACTORS:
        if _name not in _c:
            _c[_name] = FACTORS[_name][_i % len(FACTORS[_name])]


def build_case(c: dict):
    """(models, reference draft hook, prompts, budgets, spec, generate kwargs) of one case."""
    mode, scale = SCALES[c["scale"]]
    models = cached_models(compute_dtype="float64", logits_dtype=c["logits_dtype"], logits_scale=scale,
                           logits_scale_mode=mode, hybrid=c.get("hybrid", False))
    key = zlib.crc32(f"{case_id(c)}/{CASE_KEY_SALT}".encode())
    prompts = ragged_prompts(key, c["bs"], models.config.vocab_size, max_len=8)
    budgets = ragged_budgets(key, c["bs"], low=6, high=12)
    if c["bs"] > 1:
        budgets[0] = 2          # a request that finishes after one cycle, beside longer ones
    spec = SpecConfig(num_steps=c["steps"], topk=c["topk"], page_size=c["page_size"],
                      num_draft_tokens=draft_tokens(c["topk"], c["steps"], c["draft"]))
    hook = None
    if DRAFTS[c["head"]] is not None:
        models = steered_models(models, prompts, budgets, agreement=DRAFTS[c["head"]], spec=spec)
        hook = reference_hook(models.draft)
    kwargs = dict(SAMPLING[c["sampling"]], seed=key % 1000)
    if c["eos"]:
        # An EOS the run meets: the token the last request emits third (or last) without one.
        free = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, **kwargs).tokens[-1]
        kwargs["eos_token_id"] = free[min(2, len(free) - 1)]
    return models, hook, prompts, budgets, spec, kwargs


def reference_hook(draft: SteeredDraft):
    """The steering rule of the optimized side's draft wrapper, applied to the reference's rows."""
    def hook(r, positions, tokens, logits):
        return steer_logits(logits, torch.tensor([r]), positions, tokens, draft.oracle, draft.agreement, draft.seed)
    return hook


def compare(c: dict, nodeid: str) -> dict:
    models, hook, prompts, budgets, spec, kwargs = build_case(c)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True, **kwargs)
    ref = reference.eagle.generate(models, prompts, spec_num_steps=spec.num_steps, topk=spec.topk,
                                   num_draft_tokens=spec.draft_tokens, max_new_tokens=budgets,
                                   draft_logits_hook=hook, **kwargs)
    what = f"trace {case_id(c)}"
    stats, compared = compare_traces(out, ref, prompts, budgets, what, nodeid)
    depths = [sum(1 for j in cycle.accepted if j >= 0) - 1 for _, cycle in compared]
    stats.update(accepted_drafts=sum(depths), deepest=max(depths, default=0))
    return stats


def report(stats: dict, c: dict, record_property) -> None:
    traces.report(stats, case_id(c), record_property, max_skipped_fraction=MAX_SKIPPED_FRACTION, min_compared=1)


def test_pairwise_design_covers_every_pair():
    assert uncovered_pairs(FACTORS, PAIRWISE) == []
    assert len(PAIRWISE) <= 40, f"{len(PAIRWISE)} pairwise cases: keep the CPU run short"


@pytest.mark.fp8
@pytest.mark.parametrize("c", PAIRWISE, ids=case_id)
def test_trace_equals_reference(c, request, record_property):
    report(compare(c, request.node.nodeid), c, record_property)


@pytest.mark.slow
@pytest.mark.parametrize("c", SLOW, ids=case_id)
def test_trace_equals_reference_product(c, request, record_property):
    report(compare(c, request.node.nodeid), c, record_property)


def test_steered_drafts_reach_deep_paths():
    """The steered factor is what makes accepted paths deep: an always-right draft accepts up to
    S drafts per greedy cycle (fewer only where max_new_tokens cuts), so the matrix compares
    deep walks, not only rejected roots."""
    c = dict(topk=2, steps=3, draft="wide", page_size=4, bs=3, logits_dtype="float8_e4m3fn", scale="0.37",
             sampling="greedy", head="right", eos=False)
    stats = compare(c, None)
    assert not stats["skipped"], stats["skipped"]
    assert stats["accepted_drafts"] >= stats["cycles_compared"], stats
    assert stats["deepest"] == 3, stats


@pytest.mark.parametrize("head", ["right", "partial"])
def test_per_row_scales_in_a_ragged_batch(head):
    """A pinned cell the all-pairs design need not meet: per-row FP8 scales (rows differ), a ragged
    batch (the last live column is not the padded one), a wide tree over S = 3 steps (p0 decides
    which candidates make the D-1 best). A draft that takes the scale of the wrong column gives
    other trees while the output stays lossless, so only the trace shows it."""
    c = dict(topk=2, steps=3, draft="wide", page_size=1, bs=3, logits_dtype="float8_e4m3fn", scale="per_row",
             sampling="greedy", head=head, eos=False)
    stats = compare(c, None)
    assert not stats["skipped"], stats["skipped"]
    assert stats["cycles_compared"] > 0, stats


HYBRID = [
    dict(topk=1, steps=3, draft="chain", page_size=1, bs=3, logits_dtype="float32", scale="1", sampling="greedy",
         head="partial", eos=False, hybrid=True),
    dict(topk=2, steps=3, draft="wide", page_size=4, bs=3, logits_dtype="bfloat16", scale="1", sampling="greedy",
         head="partial", eos=True, hybrid=True),
    dict(topk=2, steps=2, draft="wide", page_size=1, bs=2, logits_dtype="float8_e4m3fn", scale="0.37",
         sampling="t0.3-topk20", head="right", eos=False, hybrid=True),
    dict(topk=1, steps=2, draft="chain", page_size=4, bs=2, logits_dtype="float32", scale="1",
         sampling="t1.0-topp0.9", head="partial", eos=False, hybrid=True),
]


@pytest.mark.parametrize("c", HYBRID, ids=case_id)
def test_hybrid_trace_equals_reference(c, request, record_property):
    """The hybrid model (two recurrent layers with conv windows, an attention layer between):
    the verify runs each tree node's recurrence and conv window along its own ancestry, and each
    cycle commits the last accepted node's states; a wrong node or a stale window shows in the
    next cycle's logits, so in the trace. Steered drafts make paths deep, trees make branches."""
    stats = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    if c["head"] != "plain" and c["sampling"] == "greedy":
        assert stats["accepted_drafts"] > 0, f"{case_id(c)}: no draft accepted: {stats}"


def test_trace_is_opt_in_and_needs_spec():
    models = cached_models(compute_dtype="float64")
    out = specverify.generate(models, [[1, 2, 3]], spec=SpecConfig(num_steps=2, topk=1), max_new_tokens=4)
    assert out.trace is None
    with pytest.raises(ValueError, match="trace"):
        specverify.generate(models, [[1, 2, 3]], max_new_tokens=4, trace=True)


def test_a_planted_draft_bug_shows_in_the_trace_not_in_the_tokens():
    """Greedy tokens are lossless whatever the draft proposes; the trace is not. A reference
    whose draft sees the wrong features must disagree with the decoder in its trees."""
    c = dict(topk=2, steps=2, draft="wide", page_size=1, bs=1, logits_dtype="float32", scale="1",
             sampling="greedy", head="plain", eos=False)
    models, _, prompts, budgets, spec, kwargs = build_case(c)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True)
    fc, h = models.draft_weights["fc"], models.config.hidden_size
    zeroed = dict(models.draft_weights, fc=torch.cat([fc[:h], torch.zeros_like(fc[h:])]))   # features ignored
    broken = type("M", (), dict(config=models.config, target_weights=models.target_weights, draft_weights=zeroed))
    ref = reference.eagle.generate(broken, prompts, spec_num_steps=2, topk=2, num_draft_tokens=spec.draft_tokens,
                                   max_new_tokens=budgets)
    assert out.tokens == ref.tokens
    assert [fields(cy) for cy in out.trace[0]] != [fields(cy) for cy in ref.traces[0].cycles]


def test_near_tie_rule_on_converted_logits():
    """The interval rule of reference/eagle.py: a gap float64 rounding could close is a near-tie;
    equal float64 values and values one FP8 code holds whatever the rounding are not."""
    from reference import eagle

    f32 = cached_models(compute_dtype="float64").config
    # 2 + 2**-23 is the midpoint of two float32 values: it rounds to 2.0 (a tie the index rule
    # gives to index 1), but a rounding difference of 1e-15 can send it up, to the winner's place.
    row = torch.tensor([1.0, 2.0, 2.0 + 2.0 ** -23, -3.0], dtype=torch.float64)
    assert eagle._ordered(eagle._row(f32, row), 1)[:2] == ([1], False)
    # 2 and 2 - 2e-13 both round to 2.0 whatever the rounding: the index rule decides, stably.
    row = torch.tensor([1.0, 2.0, 2.0 * (1 - 1e-13), -3.0], dtype=torch.float64)
    assert eagle._ordered(eagle._row(f32, row), 1)[:2] == ([1], True)
    assert eagle._ordered(eagle._row(f32, torch.tensor([1.0, 2.0, 2.0, -3.0], dtype=torch.float64)), 2)[1]
    assert eagle._ordered(eagle._row(f32, torch.tensor([1.0, 2.0, 1.5, -3.0], dtype=torch.float64)), 2)[1]
    fp8 = cached_models(compute_dtype="float64", logits_dtype="float8_e4m3fn").config
    tied = torch.tensor([1.0, 2.01, 2.02, -3.0], dtype=torch.float64)     # both quantize to 2.0
    order, stable, _ = eagle._ordered(eagle._row(fp8, tied), 2)
    assert order == [1, 2] and stable


@pytest.mark.parametrize("threshold, sampling, decisions", [
    ("REL_LOGIT", "greedy", {"prefill", "draft_topk", "target_greedy"}),
    ("REL_PROB", "t1.0-topp0.9", {"prefill", "filter", "accept", "bonus"}),
    ("REL_DRAFT_P", "greedy", {"beam", "keep"}),
])
def test_skipping_cannot_hide_everything(monkeypatch, threshold, sampling, decisions):
    """With a threshold so wide that every decision of its kind is a near-tie, the comparison
    stops early everywhere, and the case fails instead of passing on nothing."""
    from reference import eagle

    monkeypatch.setattr(eagle, threshold, 0.2 if threshold == "REL_LOGIT" else 0.5)
    c = dict(topk=2, steps=2, draft="wide", page_size=1, bs=1, logits_dtype="bfloat16", scale="1",
             sampling=sampling, head="plain", eos=False)
    stats = compare(c, None)
    assert len(stats["skipped"]) == stats["requests"]
    assert {s.split(" (")[0].split()[-1] for s in stats["skipped"]} <= decisions, stats["skipped"]
    with pytest.warns(TraceNearTieWarning), pytest.raises(AssertionError, match="near-ties stopped"):
        report(stats, c, lambda *a: None)
