"""Naive EAGLE (issue 10): D = 2, S = 1, topk = 1, the verify and the next draft-extend fused in one
function (`specverify/engine/naive_cycle.py`).

- the configuration: fixed shape, defaults, clear errors;
- greedy losslessness: `generate(spec=naive)` equals `reference.generate` token for token over
  every logits dtype (the four FP8 formats included), page sizes 1 / 4 / 16, ragged batches, a
  steered draft that is right about half the time; accept lengths 1 and 2 both occur;
- trace equality: in greedy mode a naive cycle is the EAGLE chain of S = 1, so each cycle's tree,
  accepted nodes and emitted tokens equal `reference.eagle.generate(spec_num_steps=1, topk=1)`'s;
- fused == unfused: the fused cycle (fixed two-row draft-extend, the save index picks the row)
  equals verify and draft-extend run as separate steps (a draft-extend over exactly the emitted
  tokens, counts read back in between): tokens, accept lengths, traces, greedy and sampled, both
  sampling modes;
- padded buckets == live shapes on the CPU (the path a CUDA graph replays);
- stochastic: the joint law of the first two tokens under exact naive sampling passes a
  chi-square test against target-only sampling at alpha = 1e-6 (its false-positive rate), and the
  original inexact shortcut fails it (asserted: the suite detects that bias);
- EOS, max_new_tokens=1, abort mid-flight.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import reference
import specverify
from specverify import dtypes
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecConfig, SpecDecoder
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts
from specverify.conformance.stats import pooled_chi_square
from tests.support.steering import steered_models
from tests.support.traces import fields
from tests.test_spec_trace import reference_hook

NAIVE = SpecConfig(algorithm="naive_eagle")
ALPHA = 1e-6          # false-positive rate of the goodness-of-fit test


def test_config_is_fixed_at_one_step_one_draft_token():
    assert (NAIVE.num_steps, NAIVE.topk, NAIVE.draft_tokens, NAIVE.naive_sampling) == (1, 1, 2, "exact")
    assert SpecConfig().num_steps == 3, "the eagle default is unchanged"
    for bad, match in [(dict(num_steps=2), "num_steps=2"), (dict(topk=2), "topk=2"),
                       (dict(num_draft_tokens=3), "num_draft_tokens=3")]:
        with pytest.raises(ValueError, match=f"naive_eagle is fixed at num_steps=1, topk=1.*{match}"):
            SpecConfig(algorithm="naive_eagle", **bad)
    with pytest.raises(ValueError, match="naive_sampling='inexact_shortcut' applies to algorithm='naive_eagle'"):
        SpecConfig(naive_sampling="inexact_shortcut")
    with pytest.raises(ValueError, match="SpecConfig.naive_sampling must be one of"):
        SpecConfig(algorithm="naive_eagle", naive_sampling="fast")
    with pytest.raises(ValueError, match="SpecConfig.algorithm must be one of \\('eagle', 'naive_eagle', 'mtp', 'dflash'\\)"):
        SpecConfig(algorithm="medusa")


# -- greedy losslessness ---------------------------------------------------------------------------

def workload(seed: int, bs: int, vocab: int):
    return ragged_prompts(seed, bs, vocab, max_len=9), ragged_budgets(seed, bs, low=3, high=13)


@functools.lru_cache(maxsize=16)
def reference_tokens(logits_dtype: str, seed: int, bs: int) -> tuple:
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts, budgets = workload(seed, bs, models.config.vocab_size)
    return tuple(map(tuple, reference.generate(models, prompts, max_new_tokens=budgets).tokens))


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("logits_dtype", dtypes.LOGITS_DTYPES)
def test_greedy_lossless(logits_dtype, page_size, request):
    seed, bs = 40 + page_size, 5
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts, budgets = workload(seed, bs, models.config.vocab_size)
    spec = SpecConfig(algorithm="naive_eagle", page_size=page_size)
    steered = steered_models(models, prompts, budgets, agreement=0.6, spec=spec)
    out = specverify.generate(steered, prompts, spec=spec, max_new_tokens=budgets)
    assert_tokens_equal(out.tokens, [list(t) for t in reference_tokens(logits_dtype, seed, bs)],
                        f"naive eagle greedy {logits_dtype} page {page_size}", request.node.nodeid)
    lengths = [n for per in out.accept_lengths for n in per]
    assert set(lengths) <= {1, 2}
    assert {1, 2} <= set(lengths), f"a steered draft right ~60% of the time must be accepted and rejected: {lengths}"
    for r, per in enumerate(out.accept_lengths):
        assert sum(per) == len(out.tokens[r]) - 1


# -- trace equality --------------------------------------------------------------------------------

@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2fnuz"])
def test_greedy_trace_equals_the_reference_chain(logits_dtype, request):
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts, budgets = workload(7, 4, models.config.vocab_size)
    steered = steered_models(models, prompts, budgets, agreement=0.6, spec=NAIVE)
    out = specverify.generate(steered, prompts, spec=NAIVE, max_new_tokens=budgets, trace=True)
    ref = reference.eagle.generate(steered, prompts, spec_num_steps=1, topk=1, max_new_tokens=budgets,
                                   draft_logits_hook=reference_hook(steered.draft))
    compared = 0
    for r, (got, want) in enumerate(zip(out.trace, ref.traces)):
        cut = want.first_near_tie
        upto = len(want.cycles) if cut is None else max(cut, 0)
        for i in range(upto):
            assert fields(got[i]) == fields(want.cycles[i]), \
                f"request {r} cycle {i}: {fields(got[i])} != reference {fields(want.cycles[i])} ({request.node.nodeid})"
        compared += upto
        if cut is None:
            assert out.tokens[r] == want.tokens
    assert compared >= 8, f"only {compared} cycles compared"


# -- fused == unfused, padded == live ---------------------------------------------------------------

# Low temperatures: the tiny target's distributions are flat, and a draft steered to the greedy
# continuation is accepted under sampling only where the target is peaked.
SAMPLED = {"greedy": SamplingParams(),
           "exact-t0.3-topk30": SamplingParams(temperature=0.3, top_k=30),
           "exact-t0.4-topp0.9-minp0.05": SamplingParams(temperature=0.4, top_p=0.9, min_p=0.05),
           "shortcut-t0.4": SamplingParams(temperature=0.4)}


def run_decoder(models, spec, params, prompts, budgets, **kw):
    dec = SpecDecoder(models, spec, params, seed=5, eos_token_id=None, **kw)
    dec.traces = [[] for _ in prompts]
    reqs = new_requests(prompts, budgets)
    dec.start(reqs)
    while dec.running():
        dec.step()
    return [r.output for r in reqs], [r.accept_lengths for r in reqs], [[fields(c) for c in t] for t in dec.traces]


@pytest.mark.parametrize("sampling", list(SAMPLED))
def test_fused_cycle_equals_verify_then_draft_extend(sampling):
    models = cached_models(compute_dtype="float32", logits_dtype="bfloat16")
    prompts, budgets = workload(11, 6, models.config.vocab_size)
    spec = SpecConfig(algorithm="naive_eagle", page_size=4,
                      naive_sampling="inexact_shortcut" if sampling.startswith("shortcut") else "exact")
    steered = steered_models(models, prompts, budgets, agreement=0.9, spec=spec)
    fused = run_decoder(steered, spec, SAMPLED[sampling], prompts, budgets)
    unfused = run_decoder(steered, spec, SAMPLED[sampling], prompts, budgets, fused=False)
    padded = run_decoder(steered, spec, SAMPLED[sampling], prompts, budgets, pad_batches=True)
    assert fused == unfused, "the fused cycle differs from verify + draft-extend run apart"
    assert fused == padded, "the padded-bucket path differs from the live-shape path"
    assert any(n == 2 for per in fused[1] for n in per), "no draft was ever accepted: nothing compared"


def test_unfused_form_is_for_naive_eagle_only():
    with pytest.raises(ValueError, match="fused=False applies to algorithm='naive_eagle' only"):
        SpecDecoder(cached_models(), SpecConfig(), SamplingParams(), seed=0, eos_token_id=None, fused=False)


# -- EOS, one token, abort ---------------------------------------------------------------------------

def test_eos_and_single_token_budget():
    models = cached_models(compute_dtype="float64")
    prompts, budgets = workload(3, 4, models.config.vocab_size)
    budgets[1] = 1
    free = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    eos = free[0][2]
    want = reference.generate(models, prompts, max_new_tokens=budgets, eos_token_id=eos).tokens
    steered = steered_models(models, prompts, budgets, agreement=0.8, spec=NAIVE)
    out = specverify.generate(steered, prompts, spec=NAIVE, max_new_tokens=budgets, eos_token_id=eos)
    assert out.tokens == want
    assert out.tokens[0][-1] == eos and len(out.tokens[1]) == 1 and out.accept_lengths[1] == []


def test_abort_mid_flight_leaves_the_others_alone():
    models = cached_models(compute_dtype="float64")
    prompts, budgets = workload(9, 4, models.config.vocab_size)
    budgets = [12] * 4
    steered = steered_models(models, prompts, budgets, agreement=0.7, spec=NAIVE)
    dec = SpecDecoder(steered, NAIVE, SamplingParams(), seed=0, eos_token_id=None)
    reqs = new_requests(prompts, budgets)
    dec.start(reqs)
    dec.step()
    dec.abort(reqs[1])
    while dec.running():
        dec.step()
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    for r in (0, 2, 3):
        assert reqs[r].output == want[r]
    assert reqs[1].output == want[1][:len(reqs[1].output)] and len(reqs[1].output) < 12


# -- stochastic: exact passes, the shortcut is caught ---------------------------------------------------

GOF_PARAMS = dict(temperature=1.0, top_k=4)
GOF_DRAWS = 3000


@functools.lru_cache(maxsize=1)
def target_joint(prompt: tuple) -> dict:
    """The law of the first two sampled tokens under target-only sampling (top-k 4, T = 1)."""
    models = cached_models(compute_dtype="float64")
    first = reference.sampling.filtered_probs(reference_logits(models, list(prompt)), 1.0, 4)
    law = {}
    for a, pa in enumerate(first):
        if pa > 0:
            second = reference.sampling.filtered_probs(reference_logits(models, list(prompt) + [a]), 1.0, 4)
            for b, pb in enumerate(second):
                if pb > 0:
                    law[(a, b)] = pa * pb
    return law


def reference_logits(models, seq: list) -> list:
    z = reference.model.forward(models.config, models.target_weights, seq)[0][-1]
    return [float(x) for x in z]


def joint_counts(naive_sampling: str, prompt: list) -> dict:
    """Counts of (first, second) token over GOF_DRAWS requests of one batch (each request its own
    uniforms). The draft is steered to the greedy continuation, so it proposes tokens the target
    gives mass to: an unsteered tiny draft's proposals mostly fall outside the target's top 4,
    where every mode rejects and draws from p itself, and a wrong residual would go unseen."""
    spec = SpecConfig(algorithm="naive_eagle", naive_sampling=naive_sampling)
    prompts = [prompt] * GOF_DRAWS
    models = steered_models(cached_models(compute_dtype="float64"), prompts, [2] * GOF_DRAWS, agreement=1.0,
                            spec=spec)
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=2, seed=123, **GOF_PARAMS)
    counts = {}
    for t in out.tokens:
        counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    return counts


@pytest.mark.parametrize("mode", ["exact", "inexact_shortcut"])
def test_sampling_law_exact_passes_and_the_shortcut_is_detected(mode):
    prompt = [5, 17, 200, 3]
    law = target_joint(tuple(prompt))
    assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-9)
    stat, pvalue, df = pooled_chi_square(joint_counts(mode, prompt), law, GOF_DRAWS)
    if mode == "exact":
        assert pvalue > ALPHA, f"exact naive sampling fails the goodness of fit: chi2 {stat:.1f}, df {df}, p {pvalue:.3g}"
    else:
        assert pvalue < ALPHA, f"the inexact shortcut passed the goodness of fit (chi2 {stat:.1f}, df {df}, p {pvalue:.3g})"
