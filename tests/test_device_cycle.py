"""The speculative cycle on the device (issue 9), its padded-bucket path checked on the CPU.

On CUDA a cycle runs at the shape of a batch-size bucket: the running rows, then lanes of the pad
row up to the bucket. `SpecDecoder(pad_batches=True)` runs that same padded path eagerly on the
CPU, so CPU CI checks what the graphs rely on:

- the padded path decodes as the live-shape path: per-request tokens, accept lengths and the
  per-cycle traces (tree, accepted nodes, emitted tokens) exactly, greedy and sampled, chain and
  tree drafts, page sizes 1 and 4, with requests finishing at different cycles (budgets, an EOS),
  so the live batch shrinks across and inside buckets;
- padded lanes never leak: padded runs whose pad lanes hold zeros, garbage or NaN
  (tests/support/pad_contents.py, refilled before every step) leave every running request's K/V
  at its cached indices (target and draft caches, read through its slot-table row), its device
  state row and its recurrent state bit for bit the same; the pad row's table row maps only to the
  sink slot;
- under `torch.inference_mode` (where engines run their decode loop; its tensors keep no version
  counter for the runner to trust) the padded path decodes the same tokens as outside it.

What is exact and what is not. Runs at the same shapes do the same arithmetic in the same order,
so the padded runs are compared with torch.equal. A live-shape run does its matrix products at
other row counts than a padded one, and a CPU GEMM may round those apart (the AVX-512 kernels do;
the AVX2 ones happen not to), so live against padded compares integers (tokens, counts, lengths,
flags) exactly and floats (K/V, recurrent states, draft probabilities) by the tolerance table.
The steered drafts of tests/support/steering.py make accepted paths deep.

The helpers here (`start_decoder`, `assert_same_live_state`) are shared with
tests/test_cuda_graphs.py, which runs the graph-vs-eager versions of these checks on the device
(same bucket shapes on both sides: exact).
"""

from __future__ import annotations

import dataclasses

import functools

import pytest
import torch

from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecConfig, SpecDecoder
from specverify.kernels.cuda_graph import bucket_for
from specverify.models.kv_cache import SINK_SLOT
from tests.support.asserts import assert_close
from tests.support.cases import ragged_prompts, steered_cached_models
from tests.support.pad_contents import PAD_CONTENTS, fill_pad_contents

VOCAB = 389                       # the tiny preset
PROMPTS = ragged_prompts(23, 5, VOCAB, max_len=8)
BUDGETS = [2, 11, 7, 10, 5]       # 5 requests (bucket 8) that finish at different cycles
EOS_FROM = (1, 5)                 # the EOS: the token request 1 emits 6th in a run without one
SEED = 11
AGREEMENT = 0.8
SAMPLING = {"greedy": SamplingParams(), "t0.7-topk20": SamplingParams(temperature=0.7, top_k=20)}
SPECS = {(k, p): SpecConfig(num_steps=3, topk=k, num_draft_tokens=4 if k == 1 else 5, page_size=p)
         for k in (1, 2) for p in (1, 4)}


# -- helpers (also used by tests/test_cuda_graphs.py) --------------------------------------------

def start_decoder(models, spec, params, prompts, budgets, *, eos, pad_batches, seed=SEED):
    """A SpecDecoder after its prefill, recording traces; returns (decoder, requests)."""
    reqs = new_requests(prompts, budgets)
    dec = SpecDecoder(models, spec, params, seed=seed, eos_token_id=eos, pad_batches=pad_batches)
    dec.traces = [[] for _ in reqs]
    dec.start(reqs)
    return dec, reqs


def kv_at_cached(dec, req) -> list[torch.Tensor]:
    """K and V of every layer, target then draft, at the request's cache indices [0, cached)."""
    slots = dec.cache.table.req_to_token[req.row, :req.cached]
    buffers = dec.cache.kv.k + dec.cache.kv.v + dec.cache.draft_kv.k + dec.cache.draft_kv.v
    return [buf[slots] for buf in buffers]


def state_rows(dec, req) -> dict[str, torch.Tensor]:
    """Everything the decoder keeps on the device for the request's row."""
    st, rs, row = dec.state, dec.state.requests, req.row
    rows = {name: getattr(rs, name)[row] for name in ("seq_len", "pending", "emitted", "budget", "finished", "req_id")}
    for field in dataclasses.fields(st):       # the algorithm's own state (EagleState, NaiveState)
        if field.name != "requests":
            rows[field.name] = getattr(st, field.name)[row]
    if rs.penalty is not None:
        rows.update(penalty_counts=rs.penalty.counts[row], penalty_prompt=rs.penalty.prompt[row])
    states = dec.cache.states
    for i, (buf, conv) in enumerate(zip(states.state, states.conv)):
        rows[f"recurrent[{i}]"] = buf[row]
        rows[f"conv[{i}]"] = conv[row]
        rows[f"tracking recurrent[{i}]"] = buf[states.tracking_slot(row)]
        rows[f"tracking conv[{i}]"] = conv[states.tracking_slot(row)]
    return rows


EXACT = "exact"


def assert_same_live_state(a, reqs_a, b, reqs_b, what: str, *, floats: str) -> None:
    """Two decoders of the same requests at the same point: the same requests run, with the same
    outputs so far, and every running request's cached K/V and state rows are equal: integers
    exactly; floats bit for bit when floats=EXACT (only for two runs at the same shapes, which do
    the same arithmetic in the same order on every machine), else by the tolerance table entry of
    the dtype `floats` names (two runs at other shapes, which a CPU GEMM may round apart). The
    caller must say which: there is no default."""
    assert [r.finished for r in reqs_a] == [r.finished for r in reqs_b], f"{what}: different requests finished"
    for ra, rb in zip(reqs_a, reqs_b):
        assert ra.output == rb.output, f"{what}: request {ra.index} output {ra.output} != {rb.output}"
        if ra.finished:
            continue
        assert ra.cached == rb.cached, f"{what}: request {ra.index} cached {ra.cached} != {rb.cached}"
        pairs = {f"K/V buffer {i} (target K, V, then draft) at cached indices": xy
                 for i, xy in enumerate(zip(kv_at_cached(a, ra), kv_at_cached(b, rb)))}
        sa, sb = state_rows(a, ra), state_rows(b, rb)
        pairs.update({f"state {name}": (sa[name], sb[name]) for name in sa})
        for name, (x, y) in pairs.items():
            label = f"{what}: request {ra.index}: {name}"
            if floats != EXACT and x.is_floating_point():
                assert_close(x, y, floats, label)
            else:
                assert torch.equal(x, y), f"{label} differs: {x.flatten()[:8].tolist()} != {y.flatten()[:8].tolist()}"


def assert_pad_row_maps_to_sink(dec, what: str) -> None:
    row = dec.cache.table.req_to_token[dec.pad_row]
    assert bool((row == SINK_SLOT).all()), \
        f"{what}: the pad row's table row maps cache indices {(row != SINK_SLOT).nonzero().flatten().tolist()} " \
        f"to slots other than the sink"


# -- the workload --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def steered(hybrid: bool = False):
    """float32 models, their draft steered for the workload (one pre-run covers every spec)."""
    return steered_cached_models(AGREEMENT, PROMPTS, BUDGETS, list(SPECS.values()), compute_dtype="float32",
                                 hybrid=hybrid)


@functools.lru_cache(maxsize=None)
def eos_for(sampling: str, topk: int, hybrid: bool) -> int:
    """An EOS the run meets: the token request EOS_FROM[0] emits at index EOS_FROM[1] without one."""
    dec, reqs = start_decoder(steered(hybrid), SPECS[topk, 1], SAMPLING[sampling], PROMPTS, BUDGETS, eos=None,
                              pad_batches=False)
    while dec.running():
        dec.step()
    r, i = EOS_FROM
    return reqs[r].output[i]


def lockstep(sampling, topk, page_size, *, hybrid=False, abort=None, each_step=None, fills=(None,)):
    """The live-shape run and one padded run per entry of `fills` of the workload, one step each
    at a time. A fill is None (the pad contents the decoder itself leaves) or a kind of
    tests/support/pad_contents.py, refilled so after the prefill and after every step. Returns
    (runs, running): runs["live"] and runs[fill] are (decoder, requests); running is the running
    count before each step. abort: a request index every run aborts after its first step.
    each_step(step, runs) runs after every step, before the refill."""
    models, spec, params = steered(hybrid), SPECS[topk, page_size], SAMPLING[sampling]
    eos = eos_for(sampling, topk, hybrid)
    runs = {"live": start_decoder(models, spec, params, PROMPTS, BUDGETS, eos=eos, pad_batches=False)}
    for fill in fills:
        runs[fill] = start_decoder(models, spec, params, PROMPTS, BUDGETS, eos=eos, pad_batches=True)

    def refill(step):
        for fill in fills:
            if fill is not None:
                fill_pad_contents(runs[fill][0], fill, seed=SEED + step)

    refill(0)
    running, step = [], 0
    while any(dec.running() for dec, _ in runs.values()):
        running.append(len(runs[fills[0]][0].running()))
        for dec, _ in runs.values():
            dec.step()
        step += 1
        if abort is not None and step == 1:
            for dec, reqs in runs.values():
                assert not reqs[abort].finished, "the request to abort finished in the first step"
                dec.abort(reqs[abort])
        if each_step is not None:
            each_step(step, runs)
        refill(step)
    return runs, running


def assert_power(live, running, budgets=BUDGETS) -> None:
    """The workload exercises what the comparison is for."""
    dec, reqs = live
    assert max(n for r in reqs for n in r.accept_lengths) >= 2, "no cycle accepted a draft token"
    eos = dec.eos
    assert any(r.output[-1] == eos and len(r.output) < b for r, b in zip(reqs, budgets)), "no request stopped at EOS"
    shrinks = [(a, b) for a, b in zip(running, running[1:]) if b < a]
    assert any(bucket_for(a) != bucket_for(b) for a, b in shrinks), f"the batch never changed bucket: {running}"
    assert any(bucket_for(a) == bucket_for(b) for a, b in shrinks), f"the batch never shrank inside a bucket: {running}"


# -- tests ---------------------------------------------------------------------------------------

def test_cpu_decoders_run_at_live_shapes_without_graphs_by_default():
    models = steered()
    dec, _ = start_decoder(models, SPECS[1, 1], SamplingParams(), PROMPTS, BUDGETS, eos=None, pad_batches=None)
    assert dec.pad_batches is False and dec.use_graphs is False
    padded, _ = start_decoder(models, SPECS[1, 1], SamplingParams(), PROMPTS, BUDGETS, eos=None, pad_batches=True)
    assert padded.pad_batches is True and padded.use_graphs is False, "graphs exist only on CUDA"


@pytest.mark.parametrize("page_size", [1, 4], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("topk", [1, 2], ids=lambda k: f"topk{k}")
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_padded_buckets_decode_exactly_as_live_shapes(sampling, topk, page_size):
    """Tokens, accept lengths and traces (integers) equal the live-shape run's exactly."""
    readbacks = []
    runs, running = lockstep(sampling, topk, page_size,
                             each_step=lambda step, runs: readbacks.append(runs[None][0].readback.count))
    (ld, lreqs), (pd, preqs) = runs["live"], runs[None]
    for lr, pr in zip(lreqs, preqs):
        assert pr.output == lr.output, f"request {lr.index}: padded {pr.output} != live {lr.output}"
        assert pr.accept_lengths == lr.accept_lengths, f"request {lr.index}: accept lengths differ"
        assert pd.traces[lr.index] == ld.traces[lr.index], f"request {lr.index}: traces differ"
        assert [len(c.emitted) for c in pd.traces[pr.index]] == pr.accept_lengths
    assert_power(runs["live"], running)
    # One readback per step (the prefill made the first), no graph on the CPU.
    assert readbacks == list(range(2, len(running) + 2))
    assert pd.runner.captures == 0 and pd.runner.pad_batches and not ld.runner.pad_batches


def test_padded_decoder_under_inference_mode_decodes_as_without():
    """Engines run their decode loop under `torch.inference_mode`: the padded path (the runner's
    buffers, its rows tensors made fresh whenever a request finishes) decodes the same tokens there
    as outside it, requests finishing at different cycles included."""
    models = steered()
    dec, reqs = start_decoder(models, SPECS[1, 1], SamplingParams(), PROMPTS, BUDGETS, eos=None, pad_batches=True)
    while dec.running():
        dec.step()
    with torch.inference_mode():
        idec, ireqs = start_decoder(models, SPECS[1, 1], SamplingParams(), PROMPTS, BUDGETS, eos=None,
                                    pad_batches=True)
        while idec.running():
            idec.step()
    assert [r.output for r in ireqs] == [r.output for r in reqs]
    assert [r.accept_lengths for r in ireqs] == [r.accept_lengths for r in reqs]
    assert len({len(r.accept_lengths) for r in reqs}) > 1, "the requests must finish at different cycles"


@pytest.mark.bitexact
@pytest.mark.parametrize("sampling, topk, page_size, hybrid", [
    ("greedy", 2, 4, False),
    ("t0.7-topk20", 1, 1, True),
], ids=["greedy-topk2-page4", "sampled-topk1-page1-hybrid"])
def test_padded_lanes_never_leak_into_live_requests(sampling, topk, page_size, hybrid):
    """Three padded runs whose pad lanes hold zeros, garbage and NaN (refilled before every step;
    request 2 aborted after the first): after every step every running request's cached K/V and
    state rows are bit for bit the same in all three (same shapes: exact on every machine), and
    equal the live-shape run's, integers exactly and floats by the float32 tolerance (other row
    counts: a CPU GEMM may round them apart); the pad row owns no slot."""
    steps = []

    def check(step, runs):
        what = f"after step {step}"
        zeros = runs[PAD_CONTENTS[0]]
        for kind in PAD_CONTENTS[1:]:
            assert_same_live_state(runs[kind][0], runs[kind][1], zeros[0], zeros[1],
                                   f"{what}: pad lanes of {kind} against zeros", floats=EXACT)
        assert_same_live_state(zeros[0], zeros[1], runs["live"][0], runs["live"][1],
                               f"{what}: padded against live shapes", floats="float32")
        for kind in PAD_CONTENTS:
            assert_pad_row_maps_to_sink(runs[kind][0], f"{what} ({kind})")
        steps.append(step)

    runs, running = lockstep(sampling, topk, page_size, hybrid=hybrid, abort=2, each_step=check, fills=PAD_CONTENTS)
    assert len(steps) == len(running) >= 4
    # The fill reaches everything a pad lane reads: the sink page of every cache, the pad row's
    # tokens and, on the hybrid model, its recurrent slots.
    want = {"pending", "kept_tokens", "target K sink [0]", "draft K sink [0]"} | ({"recurrent slot", "conv slot"}
                                                                               if hybrid else set())
    for kind in PAD_CONTENTS:
        filled = fill_pad_contents(runs[kind][0], kind, seed=0)
        assert want <= set(filled), f"{kind}: filled {filled}, missing {sorted(want - set(filled))}"
        table = runs[kind][0].cache.table
        assert table.num_free_pages == table.num_pages - 1, "pages left allocated after every request finished"
