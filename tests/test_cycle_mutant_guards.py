"""Guards for the device-cycle bug classes of issue 9 that the CPU suite must see without a GPU:
the padded-bucket path of both decoders (`pad_batches=True` runs the bucket shapes eagerly on the
CPU) with a batch that shrinks inside a bucket, and the sink page that padded lanes write.

- A runner that replays a stale input buffer (live rows not refreshed once a bucket was filled)
  hands a running request's lane another row's state: the decoders then emit a wrong token or
  none (the speculative decoder raises), so the tokens, accept lengths and traces differ from the
  unpadded run and from the reference.
- Padded lanes (and every lane past a request's live length) write the sink slot, slot 0 of page
  0: a slot table that hands page 0 to a request lets those writes overwrite that request's K/V.

The bucket of a batch of b live requests is the smallest of 1, 2, 4, 8, ... >= b, so the batches
here start at 4 or 8 requests and lose their requests one by one: 4 -> 3 and 8 -> 7 -> 6 -> 5 stay
in one bucket, where a stale buffer would survive.
"""

from __future__ import annotations

import pytest
import torch

import reference
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import SpecDecoder
from specverify.engine.target_only import TargetOnlyDecoder
from specverify.kernels.cuda_graph import bucket_for
from specverify.models.kv_cache import SINK_SLOT, CacheFullError, SlotTable
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import cached_models, ragged_prompts, steered_cached_models

SPECS = {"S3-k1-D4": (3, 1, 4), "S2-k2-D4": (2, 2, 4), "S3-k4-D8": (3, 4, 8)}
CONFIGS = [SpecConfig(num_steps=s, topk=k, num_draft_tokens=d, page_size=2) for s, k, d in SPECS.values()]
# Budgets that make the requests finish one at a time, early ones first and not in row order, so
# the live rows of a later step are not a prefix of an earlier step's rows.
BUDGETS = {4: [14, 3, 9, 14], 8: [14, 2, 5, 13, 7, 14, 9, 11]}


def run_spec(models, prompts, budgets, spec, params, *, pad_batches, seed=3):
    """Decode with SpecDecoder; returns (requests, traces, live batch size of every step)."""
    reqs = new_requests(prompts, budgets)
    dec = SpecDecoder(models, spec, params, seed=seed, eos_token_id=None, pad_batches=pad_batches)
    dec.traces = [[] for _ in reqs]
    dec.start(reqs)
    sizes = []
    while dec.running():
        sizes.append(len(dec.running()))
        dec.step()
    return reqs, dec.traces, sizes


def run_target(models, prompts, budgets, params, *, pad_batches, seed=3, page_size=1):
    reqs = new_requests(prompts, budgets)
    dec = TargetOnlyDecoder(models, params, seed=seed, eos_token_id=None, page_size=page_size,
                            pad_batches=pad_batches)
    dec.start(reqs)
    sizes = []
    while dec.running():
        sizes.append(len(dec.running()))
        dec.step()
    return reqs, sizes


def shrinks_inside_a_bucket(sizes: list[int]) -> bool:
    return any(a > b and bucket_for(a) == bucket_for(b) for a, b in zip(sizes, sizes[1:]))


@pytest.mark.parametrize("bs", [4, 8])
@pytest.mark.parametrize("cfg", CONFIGS, ids=list(SPECS))
def test_padded_spec_cycle_with_a_shrinking_batch_equals_the_reference(cfg, bs, request):
    prompts = ragged_prompts(40 + bs, bs, cached_models().config.vocab_size, max_len=9)
    budgets = BUDGETS[bs]
    # One steering pre-run per workload, shared by the three specs (the largest draft region).
    models = steered_cached_models(0.7, prompts, budgets, CONFIGS, compute_dtype="float64")
    reqs, _, sizes = run_spec(models, prompts, budgets, cfg, SamplingParams(), pad_batches=True)
    assert shrinks_inside_a_bucket(sizes), f"the batch never shrank inside a bucket: {sizes}"
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    assert_tokens_equal([r.output for r in reqs], want, f"padded speculative greedy {cfg} bs={bs}",
                        request.node.nodeid)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=30)],
                         ids=["greedy", "t0.8-topk30"])
def test_padded_and_unpadded_spec_runs_are_identical(params):
    """Padding adds lanes, never changes a live one: the same tokens, accept lengths and traces."""
    cfg = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
    prompts = ragged_prompts(51, 8, cached_models().config.vocab_size, max_len=9)
    budgets = BUDGETS[8]
    models = steered_cached_models(0.6, prompts, budgets, cfg, compute_dtype="float64")
    padded, padded_traces, sizes = run_spec(models, prompts, budgets, cfg, params, pad_batches=True)
    plain, plain_traces, _ = run_spec(models, prompts, budgets, cfg, params, pad_batches=False)
    assert shrinks_inside_a_bucket(sizes), f"the batch never shrank inside a bucket: {sizes}"
    for p, q in zip(padded, plain):
        assert p.output == q.output, f"request {p.index}: padded {p.output} vs unpadded {q.output}"
        assert p.accept_lengths == q.accept_lengths, f"request {p.index}: accept lengths differ"
        assert padded_traces[p.index] == plain_traces[q.index], f"request {p.index}: traces differ"


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)],
                         ids=["greedy", "t1.0-topp0.9"])
@pytest.mark.parametrize("page_size", [1, 3])
def test_padded_target_only_with_a_shrinking_batch_equals_the_reference(params, page_size, request):
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(61, 8, models.config.vocab_size, max_len=12)
    budgets = BUDGETS[8]
    reqs, sizes = run_target(models, prompts, budgets, params, pad_batches=True, page_size=page_size)
    assert shrinks_inside_a_bucket(sizes), f"the batch never shrank inside a bucket: {sizes}"
    want = reference.generate(models, prompts, max_new_tokens=budgets, temperature=params.temperature,
                              top_k=params.top_k, top_p=params.top_p, min_p=params.min_p, seed=3).tokens
    assert_tokens_equal([r.output for r in reqs], want, f"padded target-only {params}", request.node.nodeid)


@pytest.mark.parametrize("page_size", [1, 4, 5])
def test_the_sink_page_is_never_handed_out(page_size):
    """Page 0 holds the sink slot every padded lane writes: no request may own it, however many
    rows and pages are taken, and a request's whole reservation maps to slots of its own pages."""
    table = SlotTable(max_requests=4, max_context=40, num_pages=9, page_size=page_size)
    rows = [table.alloc_row() for _ in range(4)]
    with pytest.raises(CacheFullError):
        for length in range(1, 41):
            for row in rows:
                table.reserve(row, length)
    slots = table.req_to_token
    mapped = torch.cat([slots[row, :table.capacity(row)] for row in rows])
    assert not (mapped // page_size == SINK_SLOT // page_size).any(), "a request owns the sink page"
    assert table.num_free_pages == 0 and mapped.numel() == (table.num_pages - 1) * page_size
    assert sorted(mapped.tolist()) == list(range(page_size, table.num_slots)), "pages must not be shared"
