"""End-to-end greedy losslessness of EAGLE speculative decoding: `generate(spec=...)` equals
`reference.generate` token for token over topk x steps x draft tokens x page size x batch x logits
dtype x draft agreement. The CPU suite covers the matrix with an all-pairs design; the full product
runs under the `slow` marker. Draft agreement is the test-side steering wrapper of
`tests/support/steering.py` (the engine sees only a draft model)."""

from __future__ import annotations

import functools
import itertools

import pytest

import reference
import specverify
from specverify import dtypes
from specverify.engine.speculative import SpecConfig
from specverify.models import preset_config
from tests.support.allpairs import all_pairs, case_id, draft_tokens, uncovered_pairs
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import cached_models, ragged_budgets, ragged_prompts, steered_cached_models

pytestmark = pytest.mark.e2e

AGREEMENT = {"right": 1.0, "wrong": 0.0, "partial": 0.5}
FACTORS = {
    "topk": [1, 2, 4],
    "steps": [1, 2, 4],
    "draft": ["chain", "two", "wide"],      # D = S+1 / 2 / up to 8 (topk == 1 always uses S+1)
    "page_size": [1, 4],
    "bs": [1, 3, 8],
    "logits_dtype": list(dtypes.LOGITS_DTYPES),
    "agreement": list(AGREEMENT),
}


# Every SpecConfig of the matrix: the steering pre-run covers the largest draft region, so the
# cases of one workload share one pre-run.
ALL_SPECS = [SpecConfig(num_steps=s, topk=k, num_draft_tokens=draft_tokens(k, s, d))
             for k in FACTORS["topk"] for s in FACTORS["steps"] for d in FACTORS["draft"]]
VOCAB = preset_config("tiny").vocab_size

PAIRWISE = all_pairs(FACTORS)
FULL = [dict(zip(FACTORS, values)) for values in itertools.product(*FACTORS.values())]


@functools.lru_cache(maxsize=64)
def reference_tokens(logits_dtype: str, bs: int) -> tuple:
    models = cached_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts, budgets = workload(bs, models.config.vocab_size)
    return tuple(map(tuple, reference.generate(models, prompts, max_new_tokens=budgets).tokens))


def workload(bs: int, vocab: int):
    return ragged_prompts(1000 + bs, bs, vocab, max_len=10), ragged_budgets(1000 + bs, bs, high=14)


def run_case(c: dict, nodeid: str) -> None:
    d = draft_tokens(c["topk"], c["steps"], c["draft"])
    prompts, budgets = workload(c["bs"], VOCAB)
    models = steered_cached_models(AGREEMENT[c["agreement"]], prompts, budgets, ALL_SPECS,
                                   compute_dtype="float64", logits_dtype=c["logits_dtype"])
    spec = SpecConfig(num_steps=c["steps"], topk=c["topk"], num_draft_tokens=d, page_size=c["page_size"])
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets)
    want = [list(t) for t in reference_tokens(c["logits_dtype"], c["bs"])]
    assert_tokens_equal(out.tokens, want, f"speculative greedy {case_id(c)}", nodeid)
    best = min(d, c["steps"] + 1)
    for r, lengths in enumerate(out.accept_lengths):
        assert sum(lengths) == len(out.tokens[r]) - 1, "accept lengths must account for every token after prefill"
        full_steps = lengths[:-1]                     # the last step may be cut by max_new_tokens
        if c["agreement"] == "right":
            assert full_steps == [best] * len(full_steps), f"request {r}: always-right drafts gave {lengths}"
        elif c["agreement"] == "wrong":
            assert lengths == [1] * len(lengths), f"request {r}: always-wrong drafts gave {lengths}"
        else:
            assert all(1 <= n <= best for n in lengths)


@pytest.mark.parametrize("case", PAIRWISE, ids=[case_id(c) for c in PAIRWISE])
def test_greedy_lossless_pairwise(case, request):
    run_case(case, request.node.nodeid)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=[case_id(c) for c in FULL])
def test_greedy_lossless_full_product(case, request):
    run_case(case, request.node.nodeid)


def test_pairwise_design_covers_every_pair():
    assert uncovered_pairs(FACTORS, PAIRWISE) == []
    assert len(PAIRWISE) < len(FULL) / 50


def test_partial_agreement_accepts_some_but_not_all():
    prompts, _ = workload(8, VOCAB)
    spec = SpecConfig(num_steps=3, topk=1)
    models = steered_cached_models(0.5, prompts, 14, spec, compute_dtype="float64")
    out = specverify.generate(models, prompts, spec=spec, max_new_tokens=[14] * 8)
    lengths = [n for req in out.accept_lengths for n in req[:-1]]
    assert 1 in lengths and 4 in lengths and any(1 < n < 4 for n in lengths)


@pytest.mark.parametrize("topk,steps,d", [(1, 3, 4), (2, 3, 6)])
def test_eos_in_the_middle_of_an_accepted_run(topk, steps, d, request):
    prompts, _ = workload(3, VOCAB)
    spec = SpecConfig(num_steps=steps, topk=topk, num_draft_tokens=d)
    models = steered_cached_models(1.0, prompts, 12, spec, compute_dtype="float64")
    free = reference.generate(models, prompts, max_new_tokens=12).tokens
    eos = free[2][5]
    got = specverify.generate(models, prompts, spec=spec, max_new_tokens=12, eos_token_id=eos)
    want = reference.generate(models, prompts, max_new_tokens=12, eos_token_id=eos)
    assert_tokens_equal(got.tokens, want.tokens, "speculative greedy with EOS", request.node.nodeid)
    assert got.tokens[2][-1] == eos


def test_abort_mid_flight_frees_pages_and_spares_the_others(request):
    from specverify.engine.requests import new_requests
    from specverify.engine.sampling import SamplingParams
    from specverify.engine.speculative import SpecDecoder

    prompts, _ = workload(3, VOCAB)
    spec = SpecConfig(num_steps=2, topk=2, num_draft_tokens=4, page_size=4)
    models = steered_cached_models(0.5, prompts, 14, spec, compute_dtype="float64")
    reqs = new_requests(prompts, [14] * 3)
    decoder = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None)
    decoder.start(reqs)
    decoder.step()
    free_before = decoder.cache.table.num_free_pages
    decoder.abort(reqs[1])
    assert decoder.cache.table.num_free_pages > free_before
    while decoder.running():
        decoder.step()
    want = reference.generate(models, prompts, max_new_tokens=14).tokens
    assert reqs[0].output == want[0] and reqs[2].output == want[2]
    assert reqs[1].output == want[1][:len(reqs[1].output)]
    assert decoder.cache.table.num_free_pages == decoder.cache.table.num_pages - 1


@pytest.mark.parametrize("platform", ["cpu", "cuda-emulated", "rocm-emulated"])
def test_every_profile_is_lossless_on_tie_heavy_fp8(platform, request):
    """The fast path (cpu, cuda) and the softmax path (rocm) both honour the tie contract."""
    fmt = "float8_e5m2fnuz" if platform == "rocm-emulated" else "float8_e5m2"
    prompts, budgets = workload(3, VOCAB)
    spec = SpecConfig(num_steps=3, topk=1)
    models = steered_cached_models(0.5, prompts, budgets, spec, compute_dtype="float64", logits_dtype=fmt)
    got = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, platform=platform)
    assert_tokens_equal(got.tokens, [list(t) for t in reference_tokens(fmt, 3)], f"{platform} {fmt}",
                        request.node.nodeid)


def test_spec_config_validation():
    with pytest.raises(ValueError, match=r"topk == 1 needs num_draft_tokens == num_steps \+ 1"):
        SpecConfig(num_steps=3, topk=1, num_draft_tokens=3)
    with pytest.raises(ValueError, match=r"num_draft_tokens must be in \[2, 7\]"):
        SpecConfig(num_steps=2, topk=2, num_draft_tokens=8)
    with pytest.raises(ValueError, match=r"algorithm must be one of \('eagle', 'naive_eagle', 'mtp', 'dflash'\)"):
        SpecConfig(algorithm="medusa")
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        SpecConfig(num_steps=0)


@pytest.mark.parametrize("topk,steps,d", [(1, 3, 4), (2, 3, 6), (4, 2, 7)])
@pytest.mark.parametrize("page_size", [1, 4])
def test_hybrid_model_is_lossless(topk, steps, d, page_size, request):
    """Recurrent layers: the verify keeps a state per tree node and the commit keeps the last
    accepted node's state; any mistake there changes later tokens."""
    prompts, budgets = workload(3, VOCAB)
    spec = SpecConfig(num_steps=steps, topk=topk, num_draft_tokens=d, page_size=page_size)
    models = steered_cached_models(0.6, prompts, budgets, spec, compute_dtype="float64", hybrid=True)
    got = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets)
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    assert_tokens_equal(got.tokens, want, f"hybrid speculative greedy k={topk} S={steps} D={d}", request.node.nodeid)
    assert any(n > 1 for lengths in got.accept_lengths for n in lengths), "some drafts must be accepted"
