"""Trace equality for the MTP (docs/semantics.md 6.10) and DFlash (6.11) drafts: with
`SpecConfig(algorithm="mtp" | "dflash")`, `generate(spec=..., trace=True)` equals the cache-free
reference `reference.eagle.generate(algorithm=...)` cycle by cycle (the chain's tokens and parents,
the accepted nodes, the emitted tokens) and in its final tokens, greedy and sampled (the same
counter uniforms on both sides), as `tests/test_spec_trace.py` does for EAGLE.

The matrix is all-pairs over steps x sampling (temperature with top-k / top-p) x model
(dense, hybrid) x logits dtype (FP8 included) x page size x batch x EOS, each case run for both
algorithms; every case steers the
drafts (`tests/support/steering.py`, the same rule on the reference side through
`draft_logits_hook`: the DFlash block rows by 6.11's mask-token rule) at agreement PARTIAL, so
cycles both accept drafts and reject them, and each case must compare both kinds. Pinned cases add
the always-right draft (deep chains, FP8 e5m2 with per-row scales), sampling at a high temperature
(FP8 at a static scale != 1, top-p and min-p), and the plain heads (a planted draft bug shows in
the trace, not in the tokens).

The optimized models compute in float64 (the reference's near-tie thresholds assume it). A request
is compared up to its first near-tie (a `TraceNearTieWarning`); a case fails when more than
MAX_SKIPPED_FRACTION of its requests stop early or when it compares fewer than MIN_COMPARED cycles,
so skipping cannot hide everything (`test_skipping_cannot_hide_everything`).

Stochastic losslessness of DFlash's sampled chain: the law of the first speculative tokens over
many requests (each its own uniform stream) against target-only sampling's exact law, by the
chi-square harness of tests/test_spec_stochastic.py (false-positive rate ALPHA each).
"""

from __future__ import annotations

import collections
import functools
import zlib

import pytest
import torch

import reference
import specverify
from specverify import SpecConfig
from tests.support import traces
from tests.support.allpairs import all_pairs, case_id, uncovered_pairs
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts, steered_cached_models
from specverify.conformance.stats import pooled_chi_square
from tests.support.steering import SteeredDraft, steer_logits, steered_models
from tests.support.traces import TraceNearTieWarning, compare_traces, fields

pytestmark = pytest.mark.e2e

MAX_SKIPPED_FRACTION = 0.5    # of a case's requests whose comparison a near-tie stops early
MIN_COMPARED = 2              # cycles a case must compare
PARTIAL = 0.7                 # the matrix's steering agreement: cycles accept and reject

SAMPLING = {
    "greedy": dict(),
    # Low temperatures: the steering oracle is the greedy path, and a sampled run that leaves it
    # meets no right draft any more (a DFlash block row keeps proposing the oracle's tokens, which
    # the target then rarely samples); at these temperatures every case still accepts some drafts.
    "t0.08-topk20": dict(temperature=0.08, top_k=20),
    "t0.12-topp0.9": dict(temperature=0.12, top_p=0.9),
}
PINNED_SAMPLING = {"t0.8-topp0.9-minp0.05": dict(temperature=0.8, top_p=0.9, min_p=0.05)}
SCALES = {"1": ("static", 1.0), "0.37": ("static", 0.37), "per_row": ("per_row", None)}
ALGORITHMS = ["mtp", "dflash"]
FACTORS = {
    "algorithm": ALGORITHMS,
    "steps": [2, 3],
    "sampling": list(SAMPLING),
    "model": ["dense", "hybrid"],
    "logits_dtype": ["float32", "bfloat16", "float8_e4m3fn"],
    "page_size": [1, 4],
    "bs": [2, 3],
    "eos": [False, True],
}
CASE_KEY_SALT = 0
# All pairs of the other factors, each case run with both drafts: every cell is met by MTP and DFlash alike.
PAIRWISE = [dict(algorithm=a, **c) for c in all_pairs({k: v for k, v in FACTORS.items() if k != "algorithm"})
            for a in ALGORITHMS]


def steered_part(models, algorithm: str) -> SteeredDraft:
    """The steered draft wrapper the optimized side runs for `algorithm` (it carries the oracle,
    the agreement and the hash seed the reference's hook must use)."""
    for part in ([models.dflash] if algorithm == "dflash" else list(models.mtp)) + [models.draft]:
        if isinstance(part, SteeredDraft):
            return part
    raise AssertionError(f"{algorithm}: no steered draft in the models")


def reference_hook(steered: SteeredDraft, vocab_size: int):
    """The steering rule on the reference's float64 draft rows. A DFlash block row (input = the mask
    id V at position p) is steered as 6.11 says: as if its input were the oracle's token at p - 1 at
    position p - 1 (it proposes the oracle's token at p, with the agreement drawn for p)."""
    oracle = steered.oracle.cpu()

    def hook(r, positions, tokens, logits):
        if int(tokens[0]) == vocab_size:
            positions = positions - 1
            tokens = oracle[r, positions]
        return steer_logits(logits, torch.tensor([r]), positions, tokens, oracle, steered.agreement, steered.seed)
    return hook


def build_case(c: dict):
    """(models, reference draft hook or None, prompts, budgets, spec, generate kwargs) of one case."""
    mode, scale = SCALES[c.get("scale", "1")]
    models = cached_models(compute_dtype="float64", logits_dtype=c["logits_dtype"], logits_scale=scale,
                           logits_scale_mode=mode, hybrid=c["model"] == "hybrid")
    key = zlib.crc32(f"{case_id(c)}/{CASE_KEY_SALT}".encode())
    prompts = ragged_prompts(key, c["bs"], models.config.vocab_size, max_len=8)
    budgets = ragged_budgets(key, c["bs"], low=6, high=10)
    spec = SpecConfig(algorithm=c["algorithm"], num_steps=c["steps"], page_size=c["page_size"])
    hook = None
    agreement = c.get("agreement", PARTIAL)
    if agreement is not None:
        models = steered_models(models, prompts, budgets, agreement=agreement, spec=spec)
        hook = reference_hook(steered_part(models, c["algorithm"]), models.config.vocab_size)
    kwargs = dict((SAMPLING | PINNED_SAMPLING)[c["sampling"]], seed=key % 1000)
    if c["eos"]:
        # An EOS the run meets: the token the last request emits third (or last) without one.
        free = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, **kwargs).tokens[-1]
        kwargs["eos_token_id"] = free[min(2, len(free) - 1)]
    return models, hook, prompts, budgets, spec, kwargs


def run_reference(models, prompts, budgets, spec, hook, kwargs):
    return reference.eagle.generate(models, prompts, spec_num_steps=spec.num_steps, algorithm=spec.algorithm,
                                    max_new_tokens=budgets, draft_logits_hook=hook, **kwargs)


def compare(c: dict, nodeid: str | None) -> dict:
    models, hook, prompts, budgets, spec, kwargs = build_case(c)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True, **kwargs)
    ref = run_reference(models, prompts, budgets, spec, hook, kwargs)
    stats, compared = compare_traces(out, ref, prompts, budgets, f"trace {case_id(c)}", nodeid)
    depths = [sum(1 for j in cycle.accepted if j >= 0) - 1 for _, cycle in compared]
    # A cycle "rejects" when its walk stops before depth S although the budget did not cut it.
    rejected = [d < spec.num_steps and len(cycle.emitted) == d + 1 for d, (_, cycle) in zip(depths, compared)]
    stats.update(accepted_drafts=sum(depths), deepest=max(depths, default=0), accepting=sum(d > 0 for d in depths),
                 rejecting=sum(rejected))
    return stats


def report(stats: dict, c: dict, record_property) -> None:
    traces.report(stats, case_id(c), record_property, max_skipped_fraction=MAX_SKIPPED_FRACTION,
                  min_compared=MIN_COMPARED)
    for name in ("accepting", "rejecting"):
        record_property(f"trace_{name}_cycles", stats[name])


def test_pairwise_design_covers_every_pair():
    assert uncovered_pairs(FACTORS, PAIRWISE) == []
    assert len(PAIRWISE) <= 24, f"{len(PAIRWISE)} pairwise cases: keep the CPU run short"


@pytest.mark.fp8
@pytest.mark.parametrize("c", PAIRWISE, ids=case_id)
def test_block_draft_trace_equals_reference(c, request, record_property):
    stats = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    assert stats["accepting"] > 0 and stats["rejecting"] > 0, f"{case_id(c)}: both kinds of cycle needed: {stats}"


@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_always_right_drafts_reach_depth_s(algorithm, request, record_property):
    """Agreement 1: every greedy cycle the budget does not cut accepts all S drafts, on both sides
    (here with per-row FP8 scales)."""
    c = dict(algorithm=algorithm, steps=3, sampling="greedy", model="dense", logits_dtype="float8_e5m2",
             page_size=4, bs=2, eos=False, agreement=1.0, scale="per_row")
    stats = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    assert not stats["skipped"], stats["skipped"]
    assert stats["deepest"] == 3 and stats["rejecting"] == 0, stats


@pytest.mark.fp8
@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_sampled_trace_at_a_high_temperature(algorithm, request, record_property):
    """T = 0.8 with top-p and min-p on FP8 logits at a static scale != 1: the runs leave the
    oracle's path at once, so drafts are mostly rejected and the bonus is drawn from residuals
    of flat rows (the draw's uniform and the residual matter in every cycle)."""
    c = dict(algorithm=algorithm, steps=2, sampling="t0.8-topp0.9-minp0.05", model="dense",
             logits_dtype="float8_e4m3fn", scale="0.37", page_size=4, bs=3, eos=False)
    stats = compare(c, request.node.nodeid)
    report(stats, c, record_property)
    assert stats["rejecting"] >= 5, stats


@pytest.mark.parametrize("algorithm", ["mtp", "dflash"])
def test_a_planted_draft_bug_shows_in_the_trace_not_in_the_tokens(algorithm):
    """Plain (unsteered) heads. A reference that runs the MTP heads in the wrong order, or DFlash
    with another mask embedding, emits the same greedy tokens but disagrees with the decoder in
    its chains: the trace sees the draft."""
    c = dict(algorithm=algorithm, steps=3, sampling="greedy", model="dense", logits_dtype="float32",
             page_size=1, bs=2, eos=False, agreement=None)
    models, _, prompts, budgets, spec, kwargs = build_case(c)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, trace=True)
    good = run_reference(models, prompts, budgets, spec, None, kwargs)
    compare_traces(out, good, prompts, budgets, f"trace {case_id(c)}")
    if algorithm == "mtp":
        planted = dict(mtp_weights=list(reversed(models.mtp_weights[:3])))
    else:
        planted = dict(dflash_weights=dict(models.dflash_weights, mask_embed=-models.dflash_weights["mask_embed"]))
    broken = type("M", (), dict(dict(config=models.config, target_weights=models.target_weights,
                                     draft_weights=models.draft_weights, mtp_weights=models.mtp_weights,
                                     dflash_weights=models.dflash_weights), **planted))
    ref = run_reference(broken, prompts, budgets, spec, None, kwargs)
    assert out.tokens == ref.tokens
    assert [[fields(cy) for cy in t] for t in out.trace] != [[fields(cy) for cy in t.cycles] for t in ref.traces]


@pytest.mark.parametrize("threshold", ["REL_LOGIT", "REL_PROB"])
def test_skipping_cannot_hide_everything(monkeypatch, threshold):
    """With a threshold so wide that every decision of its kind is a near-tie, every request stops
    early, and the case fails instead of passing on nothing."""
    from reference import eagle

    monkeypatch.setattr(eagle, threshold, 0.2 if threshold == "REL_LOGIT" else 0.5)
    c = dict(algorithm="dflash", steps=2, sampling="greedy" if threshold == "REL_LOGIT" else "t0.12-topp0.9",
             model="dense", logits_dtype="bfloat16", page_size=1, bs=2, eos=False)
    stats = compare(c, None)
    assert len(stats["skipped"]) == stats["requests"], stats
    with pytest.warns(TraceNearTieWarning), pytest.raises(AssertionError, match="near-ties stopped"):
        report(stats, c, lambda *a: None)
    with pytest.raises(AssertionError, match="cycles compared"):
        traces.report(dict(stats, skipped=[]), case_id(c), lambda *a: None, max_skipped_fraction=1.0,
                      min_compared=MIN_COMPARED + stats["cycles_compared"])


# -- DFlash sampling is lossless -------------------------------------------------------------------

ALPHA = 1e-6
DRAWS = 1500
PROMPT = [17, 250, 3, 99, 41]
PARAMS = dict(temperature=0.7, top_k=5)
RUN_SEED = 20261122
LAW_MODELS = (("compute_dtype", "float64"), ("logits_dtype", "float8_e4m3fn"))


@functools.lru_cache(maxsize=64)
def next_law(context: tuple) -> dict:
    """The target's sampling distribution of the token after `context` (nonzero cells)."""
    models = cached_models(**dict(LAW_MODELS))
    row = reference.forward_logits(models.config, models.target_weights, list(context))[-1]
    p = reference.filtered_probs(reference.convert_logits(models.config, row).dequant, **PARAMS)
    return {t: q for t, q in enumerate(p) if q > 0}


def law_of_token(index: int) -> dict:
    """Exact marginal law of output token `index` (0 = the prefill token), by enumeration."""
    paths = {(): 1.0}
    for _ in range(index):
        paths = {path + (t,): w * q for path, w in paths.items() for t, q in next_law(tuple(PROMPT) + path).items()}
    law = collections.Counter()
    for path, w in paths.items():
        for t, q in next_law(tuple(PROMPT) + path).items():
            law[t] += w * q
    return dict(law)


@functools.lru_cache(maxsize=2)
def dflash_run(temperature: float):
    spec = SpecConfig(algorithm="dflash", num_steps=2)
    prompts = [PROMPT] * DRAWS
    models = steered_cached_models(PARTIAL, prompts, 3, spec, **dict(LAW_MODELS))
    return specverify.generate(models, prompts, spec=spec, max_new_tokens=3, seed=RUN_SEED,
                               **dict(PARAMS, temperature=temperature))


@pytest.mark.parametrize("index", [1, 2])
def test_dflash_sampling_matches_target_law(index):
    """Tokens 1 and 2 (the first cycle's: accepted drafts or bonuses) of DRAWS requests of one
    prompt against target-only sampling's exact law; the run accepts and rejects drafts."""
    out = dflash_run(PARAMS["temperature"])
    counts = collections.Counter(t[index] for t in out.tokens)
    stat, p_value, df = pooled_chi_square(counts, law_of_token(index), DRAWS)
    assert p_value > ALPHA, (f"dflash token {index}: chi-square {stat:.1f} on {df} df, p = {p_value:.3g} < {ALPHA}; "
                             f"run seed {RUN_SEED}")
    first = [lengths[0] for lengths in out.accept_lengths]
    assert any(n == 1 for n in first) and any(n > 1 for n in first), collections.Counter(first)


def test_the_law_check_has_power():
    """The same check fails a DFlash run sampled at temperature 1.0 instead of 0.7 (the exact laws
    give this check power 0.99999 at DRAWS = 1500: specverify/conformance/stats.py power_at)."""
    out = dflash_run(1.0)
    counts = collections.Counter(t[1] for t in out.tokens)
    _, p_value, _ = pooled_chi_square(counts, law_of_token(1), DRAWS)
    assert p_value < ALPHA
