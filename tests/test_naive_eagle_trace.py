"""Sampled naive-EAGLE trace equality (DESIGN invariant 8, docs/semantics.md 6.7): with
`SpecConfig(algorithm="naive_eagle")`, `generate(spec=..., trace=True)` equals the cache-free
reference `reference.naive_eagle.generate` cycle by cycle (tree tokens [root, d], parents,
accepted [0, 1] / [0, -1], emitted tokens) and in its final tokens, for both sampling modes
(`exact`, `inexact_shortcut`), with the same explicit uniforms u(seed, r, n, 0 / 1 / 2) on both
sides.

The matrix is all-pairs over sampling mode x logits dtype (FP8 formats included) x logits scale x
sampling parameters (temperature, top-k, top-p, min-p) x page size x batch (ragged) x draft x EOS.
The drafts: the plain head (its proposals are mostly rejected), the head steered by
`tests/support/steering.py` (right always, or 60% of the time; the reference applies the same
`steer_logits` through `draft_logits_hook`), and a "soft" one: the always-right steering with the
logits then divided by SOFTEN, on both sides, so that q is spread over several tokens and the
shortcut's q(d) moves with the temperature (the steered peak alone makes q one-hot, where a draw
that takes the wrong uniform, or a q(d) that takes the wrong filter, changes nothing). The
steering oracle is the target-only greedy continuation (penalized like the run when penalties are
on); a sampled run follows it only while it samples the greedy token, hence the low temperatures.
Pinned cases add greedy (the reference's greedy traces equal
`reference.eagle.generate(spec_num_steps=1, topk=1)`'s, and the decoder's equal both) and the
sampling penalties (greedy, exact, shortcut).

The optimized models compute in float64 (the reference's near-tie thresholds assume it). As in
`tests/test_spec_trace.py`, a request is compared only up to its first near-tie (reported as a
`TraceNearTieWarning`); a case fails when more than `MAX_SKIPPED_FRACTION` of its requests stop
early or when it compares fewer than `MIN_COMPARED` cycles. Power: a pinned case per mode
compares at least 5 accepted and 5 rejected drafts (the bonus draw after an accepted draft, the
residual or p_0 draw after a rejected one), the plain-head cases compare rejections, the greedy and
penalty cases acceptances (and rejections where the draft is partly wrong); the mutants of
`tests/mutants/naive_trace.toml` show what that power kills.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

import reference
import reference.naive_eagle
import specverify
from specverify import SpecConfig
from tests.support.allpairs import all_pairs, case_id, uncovered_pairs
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts
from tests.support import traces
from tests.support.steering import lookahead, steer_logits, steered_models
from tests.support.traces import TraceNearTieWarning, compare_traces, fields

pytestmark = pytest.mark.e2e

MAX_SKIPPED_FRACTION = 0.5    # of a case's requests whose comparison a near-tie stops early
MIN_COMPARED = 3              # cycles a case must compare
SOFTEN = 4.0                  # the soft draft divides its (steered) float64 logits by this

SCALES = {"1": ("static", 1.0), "0.37": ("static", 0.37), "per_row": ("per_row", None)}
# Mostly low temperatures: a steered draft proposes the target's greedy continuation, which a
# sampled run follows (and the target's flat rows accept) only at low temperature; T = 1 spreads the
# plain draft's q, so the draft draw's uniform matters.
SAMPLING = {
    "t0.1": dict(temperature=0.1),
    "t0.15-topk20": dict(temperature=0.15, top_k=20),
    "t0.25-topp0.9-minp0.05": dict(temperature=0.25, top_p=0.9, min_p=0.05),
    "t1.0-minp0.02": dict(temperature=1.0, min_p=0.02),
}
DRAFTS = {"plain": None, "right": 1.0, "partial": 0.6, "soft": 1.0}
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)
FACTORS = {
    "mode": ["exact", "inexact_shortcut"],
    "logits_dtype": ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"],
    "sampling": list(SAMPLING),
    "head": list(DRAFTS),
    "scale": list(SCALES),
    "page_size": [1, 4],
    "bs": [1, 3],
    "eos": [False, True],
}
CASE_KEY_SALT = 1
PAIRWISE = all_pairs(FACTORS)


class SoftDraft:
    """A draft model whose (steered) compute-dtype logits are divided by SOFTEN before delivery."""

    def __init__(self, inner):
        self.inner = inner

    def compute_logits(self, cache, batch, features, *, at=None):
        logits, hidden = self.inner.compute_logits(cache, batch, features, at=at)
        return logits / SOFTEN, hidden

    def forward(self, cache, batch, features, *, at=None):
        return self.inner.deliver(*self.compute_logits(cache, batch, features, at=at))


def reference_hook(draft, soft: bool):
    """The optimized side's draft wrapper, applied to the reference's float64 draft rows."""
    steered = draft.inner if soft else draft

    def hook(r, positions, tokens, logits):
        out = steer_logits(logits, torch.tensor([r]), positions, tokens, steered.oracle, steered.agreement,
                           steered.seed)
        return out / SOFTEN if soft else out
    return hook


def greedy_oracle(models, prompts, budgets, spec, penalties: dict) -> torch.Tensor:
    """The steering oracle of `tests/support/steering.py` (prompt + the target-only greedy
    continuation, -1 beyond), the continuation penalized as the run will be: with penalties on,
    the unpenalized one leaves the run's path at once."""
    oracle = torch.full((len(prompts), models.config.max_context + 1), -1, dtype=torch.int64)
    lengths = lookahead(models, prompts, budgets, spec)
    out = specverify.generate(models, prompts, max_new_tokens=lengths, **penalties)
    for r, (prompt, tokens) in enumerate(zip(prompts, out.tokens)):
        oracle[r, :len(prompt) + len(tokens)] = torch.tensor(list(prompt) + tokens)
    return oracle


def build_case(c: dict):
    """(models, reference draft hook, prompts, budgets, spec, generate kwargs) of one case."""
    mode, scale = SCALES[c.get("scale", "1")]
    models = cached_models(compute_dtype="float64", logits_dtype=c["logits_dtype"], logits_scale=scale,
                           logits_scale_mode=mode, hybrid=c.get("hybrid", False))
    key = zlib.crc32(f"{case_id(c)}/{CASE_KEY_SALT}".encode())
    prompts = ragged_prompts(key, c["bs"], models.config.vocab_size, max_len=8)
    budgets = ragged_budgets(key, c["bs"], low=10, high=16)
    if c["bs"] > 1:
        budgets[0] = 2          # a request that finishes after one cycle, beside longer ones
    naive_sampling = "exact" if c["mode"] == "greedy" else c["mode"]
    spec = SpecConfig(algorithm="naive_eagle", naive_sampling=naive_sampling, page_size=c["page_size"])
    penalties = PENALTIES if c.get("penalties") else {}
    hook = None
    if DRAFTS[c["head"]] is not None:
        models = steered_models(models, prompts, budgets, agreement=DRAFTS[c["head"]], spec=spec,
                                oracle=greedy_oracle(models, prompts, budgets, spec, penalties))
        if c["head"] == "soft":
            models = dataclasses.replace(models, draft=SoftDraft(models.draft))
        hook = reference_hook(models.draft, c["head"] == "soft")
    kwargs = dict(SAMPLING.get(c["sampling"], {}), seed=key % 1000, **penalties)
    if c["eos"]:
        # An EOS the run meets: a token the last request emits for the first time, in the second
        # half of its run without an EOS if it can (else anywhere after its first token).
        free = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, **kwargs).tokens[-1]
        fresh = [i for i in range(1, len(free)) if free[i] not in free[:i]]
        late = [i for i in fresh if i >= max(2, len(free) // 2)]
        if late or fresh:
            kwargs["eos_token_id"] = free[(late or fresh)[0]]
    return models, hook, prompts, budgets, spec, kwargs


def compare(c: dict, nodeid: str | None) -> tuple[dict, dict]:
    """Run one case on both sides and compare the traces; returns (stats, the reference run)."""
    models, hook, prompts, budgets, spec, kwargs = build_case(c)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True, **kwargs)
    ref = reference.naive_eagle.generate(models, prompts, naive_sampling=spec.naive_sampling, max_new_tokens=budgets,
                                         draft_logits_hook=hook, **kwargs)
    what = f"naive trace {case_id(c)}"
    run = dict(ref=ref, hook=hook, models=models, prompts=prompts, budgets=budgets, kwargs=kwargs)
    stats, compared = compare_traces(out, ref, prompts, budgets, what, nodeid, context=f", kwargs {kwargs}")
    stats["accepted"] = sum(1 for _, cycle in compared if cycle.accepted[1] == 1)
    stats["rejected"] = len(compared) - stats["accepted"]
    for got in out.trace:
        assert all(cy.tree_parents == [-1, 0] and cy.accepted in ([0, 1], [0, -1]) for cy in got)
    return stats, run


def report(stats: dict, c: dict, record_property) -> None:
    traces.report(stats, case_id(c), record_property, max_skipped_fraction=MAX_SKIPPED_FRACTION,
                  min_compared=MIN_COMPARED)


def test_pairwise_design_covers_every_pair():
    assert uncovered_pairs(FACTORS, PAIRWISE) == []
    assert len(PAIRWISE) <= 32, f"{len(PAIRWISE)} pairwise cases: keep the CPU run short"


@pytest.mark.fp8
@pytest.mark.parametrize("c", PAIRWISE, ids=case_id)
def test_naive_trace_equals_reference(c, request, record_property):
    stats, _ = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    if c["head"] == "plain":
        assert stats["rejected"] > 0, f"{case_id(c)}: the plain draft was never rejected: {stats}"


@pytest.mark.parametrize("mode", ["exact", "inexact_shortcut"])
def test_both_decisions_are_compared_many_times(mode):
    """Power: in one pinned case per mode, many accepted and many rejected drafts are compared
    (the bonus after an accepted draft, and the residual or p_0 draw after a rejected one)."""
    c = dict(mode=mode, logits_dtype="bfloat16", sampling="t0.1", head="soft", scale="1", page_size=4, bs=6,
             eos=False)
    stats, _ = compare(c, None)
    assert not stats["skipped"], stats["skipped"]
    assert stats["accepted"] >= 5 and stats["rejected"] >= 5, {k: stats[k] for k in ("accepted", "rejected")}


@pytest.mark.parametrize("c", [
    dict(mode="greedy", logits_dtype="float32", sampling="greedy", head="partial", page_size=1, bs=3, eos=False,
         hybrid=True),
    dict(mode="exact", logits_dtype="bfloat16", sampling="t0.1", head="soft", page_size=4, bs=3, eos=False,
         hybrid=True),
], ids=case_id)
def test_hybrid_naive_trace_equals_reference(c, request, record_property):
    """Naive EAGLE on the hybrid model: the verify's two nodes run the recurrence and conv window
    from the committed state, and the commit keeps the state after the draft only when it is accepted."""
    stats, _ = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    assert stats["accepted"] > 0 and stats["rejected"] > 0, f"{case_id(c)}: {stats}"


# -- greedy: the EAGLE chain ----------------------------------------------------------------------

@pytest.mark.parametrize("logits_dtype, head, penalties", [
    ("float32", "partial", False), ("float8_e5m2", "right", False), ("bfloat16", "partial", True),
    ("float8_e4m3fnuz", "partial", True)])
def test_greedy_equals_the_eagle_reference_chain(logits_dtype, head, penalties, request, record_property):
    """In greedy mode the naive reference is the EAGLE reference with S = 1, topk = 1 (the trace,
    the tokens and the near-ties), and the decoder's trace equals it."""
    c = dict(mode="greedy", logits_dtype=logits_dtype, sampling="greedy", head=head, page_size=1, bs=3, eos=False,
             penalties=penalties)
    stats, run = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    ref = run["ref"]
    chain = reference.eagle.generate(run["models"], run["prompts"], spec_num_steps=1, topk=1,
                                     max_new_tokens=run["budgets"], draft_logits_hook=run["hook"], **run["kwargs"])
    assert chain.tokens == ref.tokens
    for want, got in zip(chain.traces, ref.traces):
        assert [fields(cy) for cy in got.cycles] == [fields(cy) for cy in want.cycles]
        assert [(t.cycle, t.decision) for t in got.near_ties] == [(t.cycle, t.decision) for t in want.near_ties]
    assert stats["accepted"] > 0, stats
    if head == "partial":
        assert stats["rejected"] > 0, stats


# -- penalties ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, logits_dtype, head", [
    ("exact", "float32", "soft"), ("exact", "float8_e4m3fn", "right"), ("inexact_shortcut", "bfloat16", "soft")])
def test_sampled_trace_with_penalties(mode, logits_dtype, head, request, record_property):
    """Section 7 on the naive cycle: both target rows penalized by their own context (the row after
    the draft has the draft in it), the draft never."""
    c = dict(mode=mode, logits_dtype=logits_dtype, sampling="t0.15-topk20", head=head, page_size=4, bs=3,
             eos=False, penalties=True)
    stats, _ = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    assert stats["accepted"] > 0 and stats["rejected"] > 0, stats


def test_penalties_change_the_sampled_trace():
    """The penalty cases test something: the same case without penalties gives other tokens."""
    c = dict(mode="exact", logits_dtype="float32", sampling="t0.25-topp0.9-minp0.05", head="soft", page_size=4, bs=3,
             eos=False)
    models, hook, prompts, budgets, spec, kwargs = build_case(c)
    plain = reference.naive_eagle.generate(models, prompts, max_new_tokens=budgets, draft_logits_hook=hook, **kwargs)
    penalized = reference.naive_eagle.generate(models, prompts, max_new_tokens=budgets, draft_logits_hook=hook,
                                               **kwargs, **PENALTIES)
    assert plain.tokens != penalized.tokens


# -- the near-tie guard and the reference's argument checks ----------------------------------------

@pytest.mark.parametrize("mode", ["exact", "inexact_shortcut"])
def test_skipping_cannot_hide_everything(monkeypatch, mode):
    """With a probability threshold so wide that every sampled decision is a near-tie, every
    request stops at its first cycle (or its prefill), and the case fails instead of passing on
    nothing."""
    from reference import eagle

    monkeypatch.setattr(eagle, "REL_PROB", 0.5)
    c = dict(mode=mode, logits_dtype="bfloat16", sampling="t1.0-minp0.02", head="soft", page_size=1, bs=3, eos=False)
    stats, _ = compare(c, None)
    assert len(stats["skipped"]) == stats["requests"]
    with pytest.warns(TraceNearTieWarning), pytest.raises(AssertionError, match="near-ties stopped"):
        report(stats, c, lambda *a: None)


def test_reference_near_ties_name_the_naive_decisions(monkeypatch):
    """The audit covers the naive decisions: the draft draw, the coin, the residual draw."""
    from reference import eagle

    monkeypatch.setattr(eagle, "REL_PROB", 1e-3)
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(3, 6, models.config.vocab_size, max_len=8)
    out = reference.naive_eagle.generate(models, prompts, max_new_tokens=8, temperature=0.7, seed=9)
    kinds = {t.decision for tr in out.traces for t in tr.near_ties}
    assert kinds & {"draft_draw", "accept", "residual"}, kinds


def test_reference_residual_draw_and_its_audit():
    """6.4's draw falls back as `inverse_cdf` does, and a residual entry that exists only as the
    difference of two close probabilities is in doubt when the draw lands on it."""
    from reference import naive_eagle
    from reference.eagle import RequestTrace, _Audit

    assert naive_eagle._inverse_cdf([0.2, 0.8, 0.0], 0.5)[0] == 1
    assert naive_eagle._inverse_cdf([0.0, 0.0, 0.0], 0.5)[0] == 2        # nothing positive: V - 1
    eps = 1e-6
    for p0, q, u, tie in [([0.5, 0.3, 0.2], [0.1, 0.5, 0.4], 0.5, False),
                          ([0.5, 0.3, 0.2], [0.5 - 1e-9, 0.1, 0.4 + 1e-9], 1e-12, True)]:
        trace = RequestTrace(tokens=[])
        residual = [max(a - b, 0.0) for a, b in zip(p0, q)]
        token, target, total = naive_eagle._inverse_cdf(residual, u)
        assert token == 0
        naive_eagle._audit_residual(_Audit(trace), "node 0", residual, [eps * a + eps * b for a, b in zip(p0, q)], u,
                                    target, total)
        assert bool(trace.near_ties) == tie, trace.near_ties


@pytest.mark.parametrize("kwargs, match", [
    (dict(naive_sampling="fast"), "naive_sampling"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(min_p=1.0), "min_p"),
    (dict(seed=2**32), "seed"),
    (dict(eos_token_id=10**6), "eos_token_id"),
    (dict(draft_logits_hook=3), "draft_logits_hook"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(frequency_penalty=3.0), "frequency_penalty"),
])
def test_reference_refuses_bad_arguments(kwargs, match):
    models = cached_models(compute_dtype="float64")
    args = dict(max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        reference.naive_eagle.generate(models, [[1, 2, 3]], **args)
    with pytest.raises(ValueError, match="prompts"):
        reference.naive_eagle.generate(models, [[]], max_new_tokens=4)
