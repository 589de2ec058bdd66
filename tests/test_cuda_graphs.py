"""CUDA graphs of the decode cycle (issue 9): the bucket runner, and the captured cycle on the device.

CPU: `BucketGraphRunner` without graphs, the path CPU CI runs: inputs land in one static buffer
per bucket, rows past the live batch get the pad row again on every call (a smaller call never
sees an earlier call's rows), an input is copied only when it changed (another tensor, or either
written since; under `torch.inference_mode`, which keeps no version counters, every call), unknown inputs and wrong row shapes raise, `pad_batches=False` calls
the function at the live shape, graphs without padding are refused; the rows a captured step reads
by address without holding them (a chain's mask, parents and offsets, a lone draft query's mask,
a chain tree's shared rows, the unit logits scale) stay allocated whatever is made after them,
and a prefill's long chain gets fresh rows that are not kept.

`cuda` (skipped elsewhere; the CPU checks of the padded path are tests/test_device_cycle.py):
- a capture survives an earlier runner's graph turning into cyclic garbage inside it (the
  collector stays off while the runner captures: the root cause of the old capture failure);
- the captured cycle runs under `torch.cuda.set_sync_debug_mode("error")` with exactly one
  readback per step (speculative, greedy and sampled, topk 1 and 4, naive EAGLE exact and shortcut,
  and target-only), in a
  steady batch and in one where a request finishes inside the checked steps;
- graph == eager bit for bit over many cycles while the live batch shrinks inside and across
  buckets: tokens, traces, the device state of every running row, the target and draft K/V at
  each running request's cached indices; one capture per bucket; the rows of a bucket change
  between replays;
- an abort on the graph path leaves the other requests' outputs as an un-aborted run's;
- decoders started, captured and stepped under `torch.inference_mode` emit what they emit outside;
- the trace of a captured run equals the reference speculative decoder's
  (`tests/test_spec_trace.py`'s comparison, run on device models);
- float64 models (the precision mode whose attention reads the device) still decode.

The device runs compute in float32 (or bfloat16): float64 attention takes the torch path, which
reads a length back and so cannot be captured. The trace comparison therefore widens the
reference's logit near-tie threshold from float64's to float32's rounding (FLOAT32_REL_LOGIT).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import types
import zlib

import pytest
import torch

import reference
import specverify
from specverify.engine import serving, speculative
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecConfig
from specverify.engine.target_only import TargetOnlyDecoder
from specverify.kernels.cuda_graph import BucketGraphRunner, bucket_for
from tests.support.allpairs import draft_tokens
from tests.support.asserts import assert_tokens_equal
from tests.support.cases import ragged_budgets, ragged_prompts
from tests.support.steering import steered_models
from tests.test_device_cycle import EXACT, assert_pad_row_maps_to_sink, assert_same_live_state, start_decoder

VOCAB = 389
SEED = 19
SAMPLING = {"greedy": SamplingParams(), "t0.7-topk20": SamplingParams(temperature=0.7, top_k=20)}
GPU_SPECS = {"topk1": SpecConfig(num_steps=3, topk=1), "topk4": SpecConfig(num_steps=3, topk=4, num_draft_tokens=8),
             "naive": SpecConfig(algorithm="naive_eagle"),
             "naive-shortcut": SpecConfig(algorithm="naive_eagle", naive_sampling="inexact_shortcut"),
             "mtp": SpecConfig(algorithm="mtp"), "dflash": SpecConfig(algorithm="dflash")}
# float32 forwards differ from the reference's float64 by ~5e-7 of a row's largest logit (measured
# on the tiny preset); the float64 threshold (1e-10) would call none of that a near-tie.
FLOAT32_REL_LOGIT = 1e-5


# -- CPU: the runner without graphs ---------------------------------------------------------------

PAD = {"x": torch.tensor(-1.0), "ids": torch.tensor([7, 7])}


def recording_fn(seen: list):
    def fn(buf):
        seen.append({"x": buf["x"].clone(), "ids": buf["ids"].clone(), "ptr": buf["x"].data_ptr(),
                     "rows": buf["x"].shape[0]})
        return {"y": buf["x"] * 2, "s": buf["ids"].sum(1)}
    return fn


def call(runner, xs):
    n = len(xs)
    return runner.run({"x": torch.tensor(xs, dtype=torch.float32), "ids": torch.arange(2 * n).view(n, 2)})


def test_runner_bucket_choice_and_errors():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert bucket_for(3, (4, 16)) == 4 and bucket_for(5, (4, 16)) == 16
    with pytest.raises(ValueError, match="exceeds the largest CUDA-graph bucket 256"):
        bucket_for(257)


def test_runner_pads_with_the_pad_row_and_refills_between_calls():
    seen = []
    runner = BucketGraphRunner(recording_fn(seen), PAD, use_graphs=False)
    out = call(runner, [1, 2, 3, 4, 5, 6, 7])                     # bucket 8, one pad lane
    assert seen[-1]["x"].tolist() == [1, 2, 3, 4, 5, 6, 7, -1]
    assert out["y"].tolist() == [2, 4, 6, 8, 10, 12, 14] and out["s"].tolist() == [1, 5, 9, 13, 17, 21, 25]
    out = call(runner, [10, 20, 30, 40, 50])                      # bucket 8 again, fewer live rows
    assert seen[-1]["x"].tolist() == [10, 20, 30, 40, 50, -1, -1, -1], "rows 5, 6 of the last call survived"
    assert seen[-1]["ids"][5:].tolist() == [[7, 7]] * 3
    assert out["y"].tolist() == [20, 40, 60, 80, 100] and out["s"].shape == (5,)
    assert seen[-1]["ptr"] == seen[-2]["ptr"], "one static buffer per bucket (what a graph replays on)"
    call(runner, [9, 9, 9, 9])                                    # bucket 4, full
    call(runner, [3, 3, 3])                                       # bucket 4, one pad lane again
    assert seen[-1]["x"].tolist() == [3, 3, 3, -1] and seen[-1]["ids"][3].tolist() == [7, 7]
    out = call(runner, [5])                                       # bucket 1
    assert seen[-1]["x"].tolist() == [5] and out["y"].tolist() == [10]
    assert [s["rows"] for s in seen] == [8, 8, 4, 4, 1]
    assert runner.captures == 0


def copies_made(fn) -> int:
    """How many tensor copies fn() makes (the torch profiler's `aten::copy_` events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name == "aten::copy_")


def test_runner_copies_its_inputs_only_when_they_change():
    """A decoder passes the same rows tensor every step until its running set changes: the runner
    copies it into the bucket's buffer once, and again only when it is another tensor (of the same
    shape too), was written in place, or the buffer was."""
    seen = []

    def fn(buf):                                                       # reads its inputs, copies nothing
        seen.append({"x": buf["x"].tolist(), "ids": buf["ids"].tolist()})
        return {"y": buf["x"]}

    runner = BucketGraphRunner(fn, PAD, use_graphs=False)
    x, ids = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1, 2], [3, 4], [5, 6]])
    inputs = {"x": x, "ids": ids}
    runner.run(inputs)                                                 # the bucket's buffers made and filled
    assert copies_made(lambda: runner.run(inputs)) == 0
    assert seen[-1]["x"] == [1, 2, 3, -1] and seen[-1]["ids"][3] == [7, 7]
    other = {"x": torch.tensor([4.0, 5.0, 6.0]), "ids": ids}           # another tensor, same shape and version
    assert copies_made(lambda: runner.run(other)) == 2                 # its live rows and the pad lane
    assert seen[-1]["x"] == [4, 5, 6, -1] and seen[-1]["ids"][:3] == ids.tolist()
    runner.run(inputs)                                                 # back to the first: copied again
    assert seen[-1]["x"] == [1, 2, 3, -1]
    x[1] = 20.0                                                        # written in place: copied again
    assert copies_made(lambda: runner.run(inputs)) == 2
    assert seen[-1]["x"] == [1, 20, 3, -1]
    runner.static[4]["x"][0] = 99.0                                    # the buffer written: refilled
    runner.run(inputs)
    assert seen[-1]["x"] == [1, 20, 3, -1]
    runner.run({"x": x, "ids": ids + 10})                              # only the second input changes
    assert seen[-1]["x"] == [1, 20, 3, -1] and seen[-1]["ids"][:3] == (ids + 10).tolist()
    runner.run({"x": x[:2], "ids": ids[:2]})                           # a view of fewer rows: bucket 2
    assert seen[-1]["x"] == [1, 20]
    assert copies_made(lambda: runner.run(inputs)) == 2                # bucket 4 still holds x (not the
    assert copies_made(lambda: runner.run(inputs)) == 0                # bucket-2 view): only ids is copied
    four = torch.tensor([7.0, 8.0, 9.0, 10.0])
    runner.run({"x": four, "ids": torch.ones((4, 2), dtype=torch.int64)})
    runner.run({"x": four[:3], "ids": ids})                            # same address and version, 3 rows
    assert seen[-1]["x"] == [7, 8, 9, -1], "a view of the held tensor is another input"


def test_runner_under_inference_mode_copies_every_call():
    """Tensors made under `torch.inference_mode` (how an engine often runs its decode loop) keep no
    version counter: the runner cannot tell an edit from none, so it copies them every call, and
    an edit in place still reaches the function."""
    seen = []
    with torch.inference_mode():
        runner = BucketGraphRunner(lambda buf: seen.append(buf["x"].tolist()) or {"y": buf["x"]}, PAD,
                                   use_graphs=False)
        x, ids = torch.tensor([1.0, 2.0]), torch.tensor([[1, 2], [3, 4]])
        runner.run({"x": x, "ids": ids})
        x[0] = 5.0
        runner.run({"x": x, "ids": ids})
    assert seen == [[1.0, 2.0], [5.0, 2.0]]
    # Mixed: buffers made outside the mode with inputs made inside it, and the other way round.
    outside = BucketGraphRunner(lambda buf: seen.append(buf["x"].tolist()) or {"y": buf["x"]}, PAD,
                                use_graphs=False)
    outside.run({"x": torch.tensor([1.0]), "ids": torch.tensor([[1, 2]])})
    with torch.inference_mode():
        inner = torch.tensor([6.0])
        outside.run({"x": inner, "ids": torch.tensor([[1, 2]])})
        inner[0] = 7.0
        outside.run({"x": inner, "ids": torch.tensor([[1, 2]])})
    assert seen[-2:] == [[6.0], [7.0]]
    with torch.inference_mode():
        made_inside = BucketGraphRunner(lambda buf: seen.append(buf["x"].tolist()) or {"y": buf["x"]}, PAD,
                                        use_graphs=False)
    plain = torch.tensor([2.0])
    with torch.inference_mode():
        made_inside.run({"x": plain, "ids": torch.tensor([[1, 2]])})
        made_inside.run({"x": plain, "ids": torch.tensor([[1, 2]])})
    assert seen[-2:] == [[2.0], [2.0]]


def test_runner_rejects_unknown_inputs_and_wrong_row_shapes():
    runner = BucketGraphRunner(recording_fn([]), PAD, use_graphs=False)
    with pytest.raises(ValueError, match="input 'z' has no pad row"):
        runner.run({"z": torch.tensor([1.0])})
    with pytest.raises(ValueError, match="input 'ids': row shape \\(3,\\)"):
        runner.run({"x": torch.tensor([1.0]), "ids": torch.zeros((1, 3), dtype=torch.int64)})


def test_runner_without_padding_calls_fn_at_live_shape():
    seen = []
    runner = BucketGraphRunner(recording_fn(seen), PAD, use_graphs=False, pad_batches=False)
    out = call(runner, [1, 2, 3, 4, 5])
    assert seen[-1]["rows"] == 5 and seen[-1]["x"].tolist() == [1, 2, 3, 4, 5]
    assert out["y"].tolist() == [2, 4, 6, 8, 10]
    call(runner, [4, 2, 1])
    assert seen[-1]["rows"] == 3 and runner.captures == 0


def test_runner_graphs_need_padded_buckets():
    with pytest.raises(ValueError, match="use_graphs=True needs pad_batches=True"):
        BucketGraphRunner(recording_fn([]), PAD, use_graphs=True, pad_batches=False)


# -- CUDA ----------------------------------------------------------------------------------------

def doubling(buf):
    return {"y": buf["x"] * 2, "s": buf["ids"].sum(1)}


@pytest.mark.cuda
def test_capture_survives_a_dead_graph_becoming_garbage_inside_it():
    """The root cause of the capture failure the pre-issue-9 runner retried.

    A decoder and its runner form a reference cycle (the runner holds the decoder's bound step
    function), so a finished decoder's captured graphs are freed by the cyclic garbage collector,
    at whatever allocation starts a collection. A graph destroyed while another capture is under
    way invalidates that capture (benchmarks/experiments/capture_probe.py: global and thread-local
    modes alike). The runner keeps the collector off while it captures. Here an earlier runner's
    graph becomes cyclic garbage inside the capture, and the step function then does what an
    automatic collection at that allocation would do: collect, if the collector is enabled."""
    pad = {k: v.cuda() for k, v in PAD.items()}
    earlier = BucketGraphRunner(doubling, pad, use_graphs=True)
    call(earlier, [1.0, 2.0])
    assert earlier.captures == 1
    cycle = {"runner": earlier}
    cycle["self"] = cycle
    keep = [cycle]
    del cycle, earlier
    collections = []

    def step(buf):
        if torch.cuda.is_current_stream_capturing():
            keep.clear()                              # the earlier graph: now cyclic garbage
            if gc.isenabled():
                collections.append(gc.collect())
        return doubling(buf)

    was_enabled = gc.isenabled()
    runner = BucketGraphRunner(step, pad, use_graphs=True)
    out = call(runner, [1.5, -3.0, 4.0])
    torch.cuda.synchronize()
    assert collections == [], "the collector ran inside the capture"
    assert gc.isenabled() == was_enabled, "the runner did not restore the collector"
    assert out["y"].tolist() == [3.0, -6.0, 8.0] and out["s"].tolist() == [1, 5, 9]
    out = call(runner, [0.25, 7.0, 1.0])             # a replay of the same bucket
    assert out["y"].tolist() == [0.5, 14.0, 2.0] and runner.captures == 1


@functools.lru_cache(maxsize=8)
def gpu_models(compute_dtype="float32", logits_dtype="float32", hybrid=False):
    return specverify.build_models("tiny", device="cuda", compute_dtype=compute_dtype, logits_dtype=logits_dtype,
                                   hybrid=hybrid)


@contextlib.contextmanager
def sync_errors():
    """Every synchronizing CUDA call raises inside (the decoders lower it for their one readback)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


# Four requests (bucket 4). "finishes": request 0 stops inside the checked steps (its rows leave
# the batch, the bucket stays 4); "steady": nobody stops there.
SYNC_BUDGETS = {"steady": [40, 40, 40, 40], "finishes": [6, 40, 40, 40]}
SYNC_STEPS = 6


def run_under_sync_check(dec, reqs, change):
    """One step outside the check (it captures bucket 4), then SYNC_STEPS inside it."""
    dec.step()
    assert dec.runner.captures == 1 and not any(r.finished for r in reqs)
    added = []
    with sync_errors():
        for _ in range(SYNC_STEPS):
            before = dec.readback.count
            dec.step()
            added.append(dec.readback.count - before)
    assert added == [1] * SYNC_STEPS, f"readbacks per step: {added}"
    assert dec.runner.captures == 1, "a new capture inside the checked steps: the bucket changed"
    assert [r.finished for r in reqs] == [change == "finishes", False, False, False]


@pytest.mark.cuda
@pytest.mark.parametrize("change", list(SYNC_BUDGETS))
@pytest.mark.parametrize("spec_name", list(GPU_SPECS))
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_captured_cycle_syncs_only_for_its_readback(sampling, spec_name, change):
    prompts, budgets, spec = ragged_prompts(31, 4, VOCAB, max_len=10), SYNC_BUDGETS[change], GPU_SPECS[spec_name]
    models = steered_models(gpu_models(), prompts, budgets, agreement=0.7, spec=spec)
    dec, reqs = start_decoder(models, spec, SAMPLING[sampling], prompts, budgets, eos=None, pad_batches=None)
    assert dec.use_graphs and dec.pad_batches
    run_under_sync_check(dec, reqs, change)


@pytest.mark.cuda
@pytest.mark.parametrize("change", list(SYNC_BUDGETS))
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_captured_target_only_step_syncs_only_for_its_readback(sampling, change):
    prompts = ragged_prompts(32, 4, VOCAB, max_len=10)
    budgets = [4 if change == "finishes" else 40, 40, 40, 40]      # 4: stops at the second checked step
    dec = TargetOnlyDecoder(gpu_models(), SAMPLING[sampling], seed=SEED, eos_token_id=None, page_size=4)
    reqs = new_requests(prompts, budgets)
    dec.start(reqs)
    assert dec.use_graphs and dec.pad_batches
    run_under_sync_check(dec, reqs, change)


GRAPH_MODELS = {
    "f32": dict(compute_dtype="float32", logits_dtype="float32", hybrid=False),
    "bf16-fp8logits": dict(compute_dtype="bfloat16", logits_dtype="float8_e4m3fn", hybrid=False),
    "f32-hybrid": dict(compute_dtype="float32", logits_dtype="float32", hybrid=True),
}


@pytest.mark.cuda
@pytest.mark.parametrize("model", list(GRAPH_MODELS.values()), ids=list(GRAPH_MODELS))
@pytest.mark.parametrize("spec_name", list(GPU_SPECS))
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_graph_replay_equals_eager_bit_for_bit(sampling, spec_name, model):
    """Eight requests with ragged budgets: the batch shrinks 8 -> ... -> 1 over the cycles, inside
    buckets (the rows a graph replays on change) and across them (a capture per bucket)."""
    prompts = ragged_prompts(37, 8, VOCAB, max_len=10)
    budgets = [3, 5, 8, 11, 15, 19, 26, 34]
    spec = GPU_SPECS[spec_name]
    models = steered_models(gpu_models(**model), prompts, budgets, agreement=0.7, spec=spec)
    eager_spec = dataclasses.replace(spec, cuda_graph=False)
    params = SAMPLING[sampling]
    graph, greqs = start_decoder(models, spec, params, prompts, budgets, eos=None, pad_batches=None)
    eager, ereqs = start_decoder(models, eager_spec, params, prompts, budgets, eos=None, pad_batches=None)
    assert graph.use_graphs and not eager.use_graphs and eager.pad_batches
    rows_seen: dict[int, set] = {}
    steps = 0
    while graph.running() or eager.running():
        rows = tuple(r.row for r in graph.running())
        rows_seen.setdefault(bucket_for(len(rows)), set()).add(rows)
        graph.step()
        eager.step()
        steps += 1
        assert_same_live_state(graph, greqs, eager, ereqs, f"{model}: after step {steps}", floats=EXACT)
        assert_pad_row_maps_to_sink(graph, f"after step {steps}")
    assert steps >= 12, f"only {steps} cycles"
    assert graph.traces == eager.traces
    assert [r.accept_lengths for r in greqs] == [r.accept_lengths for r in ereqs]
    assert graph.runner.captures == len(rows_seen) and eager.runner.captures == 0, \
        f"{graph.runner.captures} captures for buckets {sorted(rows_seen)}"
    assert any(len(sets) >= 2 for sets in rows_seen.values()), f"no bucket replayed on changed rows: {rows_seen}"
    assert len(rows_seen) >= 3, f"the batch crossed too few buckets: {sorted(rows_seen)}"


@pytest.mark.cuda
@pytest.mark.parametrize("spec_name", ["target-only", "topk1", "naive"])
def test_captured_decoders_under_inference_mode_decode_as_without(spec_name):
    """Engines decode under `torch.inference_mode`: a decoder started and stepped there (its graphs
    captured there, its rows tensors inference tensors the runner copies every step) emits what the
    same captured decoder emits outside it, while the batch shrinks across buckets."""
    prompts = ragged_prompts(43, 6, VOCAB, max_len=10)
    budgets = [3, 6, 9, 13, 17, 22]

    def run():
        if spec_name == "target-only":
            dec = TargetOnlyDecoder(gpu_models(), SamplingParams(), seed=SEED, eos_token_id=None, page_size=4)
            reqs = new_requests(prompts, budgets)
            dec.start(reqs)
        else:
            spec = GPU_SPECS[spec_name]
            models = steered_models(gpu_models(), prompts, budgets, agreement=0.7, spec=spec)
            dec, reqs = start_decoder(models, spec, SamplingParams(), prompts, budgets, eos=None, pad_batches=None)
        assert dec.use_graphs
        while dec.running():
            dec.step()
        return [r.output for r in reqs], dec.runner.captures

    plain, captures = run()
    with torch.inference_mode():
        inside, inside_captures = run()
    assert inside == plain and inside_captures == captures >= 3


@pytest.mark.cuda
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_abort_on_the_graph_path_spares_the_other_requests(sampling):
    prompts, budgets, spec = ragged_prompts(41, 4, VOCAB, max_len=10), [24, 30, 24, 28], GPU_SPECS["topk4"]
    models = steered_models(gpu_models(), prompts, budgets, agreement=0.7, spec=spec)
    params = SAMPLING[sampling]
    cut, creqs = start_decoder(models, spec, params, prompts, budgets, eos=None, pad_batches=None)
    whole, wreqs = start_decoder(models, spec, params, prompts, budgets, eos=None, pad_batches=None)
    assert cut.use_graphs
    for _ in range(2):
        cut.step()
        whole.step()
    assert not creqs[1].finished
    free = cut.cache.table.num_free_pages
    cut.abort(creqs[1])
    assert cut.cache.table.num_free_pages > free, "the aborted request's pages did not go back"
    while cut.running():
        cut.step()
    while whole.running():
        whole.step()
    for r in (0, 2, 3):
        assert creqs[r].output == wreqs[r].output, f"request {r}: {creqs[r].output} != {wreqs[r].output}"
        assert creqs[r].accept_lengths == wreqs[r].accept_lengths
    assert creqs[1].output == wreqs[1].output[:len(creqs[1].output)] and len(creqs[1].output) < budgets[1]
    assert cut.runner.captures >= 1
    assert cut.cache.table.num_free_pages == cut.cache.table.num_pages - 1


# float32 logits only: with float32 forwards an FP8 code is in doubt wherever a logit sits within
# float32 rounding of an FP8 rounding boundary, and the reference (rightly) calls most FP8 rows
# near-ties then. FP8 logits on the device: graph == eager below, and the float64 test.
TRACE_CASES = [
    dict(topk=1, steps=3, draft="chain", page_size=1, logits_dtype="float32", sampling="greedy", eos=False),
    dict(topk=4, steps=3, draft="wide", page_size=4, logits_dtype="float32", sampling="t0.3-topk20", eos=True),
    dict(topk=2, steps=3, draft="wide", page_size=1, logits_dtype="float32", sampling="greedy", eos=True),
    dict(topk=2, steps=2, draft="two", page_size=4, logits_dtype="float32", sampling="t0.4-minp0.1", eos=False),
]


def gpu_trace_case(c: dict, spec_trace):
    """build_case of tests/test_spec_trace.py for device models: steered drafts (agreement 0.6),
    three ragged requests (the first stops after one cycle), an optional EOS the run meets."""
    plain = gpu_models(logits_dtype=c["logits_dtype"])
    key = zlib.crc32(repr(sorted(c.items())).encode())
    prompts = ragged_prompts(key, 3, VOCAB, max_len=8)
    budgets = ragged_budgets(key, 3, low=6, high=12)
    budgets[0] = 2
    spec = SpecConfig(num_steps=c["steps"], topk=c["topk"], page_size=c["page_size"],
                      num_draft_tokens=draft_tokens(c["topk"], c["steps"], c["draft"]))
    models = steered_models(plain, prompts, budgets, agreement=0.6, spec=spec)
    draft = models.draft       # the reference applies the same rule with the oracle on its side
    hook = spec_trace.reference_hook(types.SimpleNamespace(oracle=draft.oracle.cpu(), agreement=draft.agreement,
                                                           seed=draft.seed))
    kwargs = dict(spec_trace.SAMPLING[c["sampling"]], seed=key % 1000)
    if c["eos"]:
        free = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets, **kwargs).tokens[-1]
        kwargs["eos_token_id"] = free[min(2, len(free) - 1)]
    return models, hook, prompts, budgets, spec, kwargs


@pytest.mark.cuda
@pytest.mark.parametrize("c", TRACE_CASES, ids=lambda c: f"topk{c['topk']}-D{c['draft']}-{c['sampling']}")
def test_captured_trace_equals_reference(c, request, record_property, monkeypatch):
    from tests import test_spec_trace as spec_trace

    case = gpu_trace_case(c, spec_trace)
    monkeypatch.setattr(reference.eagle, "REL_LOGIT", FLOAT32_REL_LOGIT)
    monkeypatch.setattr(spec_trace, "build_case", lambda _: case)
    made = []

    class Recorded(speculative.SpecDecoder):
        def allocate(self, **kwargs):
            made.append(self)
            super().allocate(**kwargs)

    monkeypatch.setattr(serving, "SpecDecoder", Recorded)       # the decoder generate's engine builds
    stats = spec_trace.compare(c, request.node.nodeid)
    spec_trace.report(stats, c, record_property)
    assert len(made) == 1 and made[0].use_graphs and made[0].runner.captures >= 1, "the traced run was not captured"


@pytest.mark.cuda
@pytest.mark.parametrize("logits_dtype", ["float32", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("algorithm", ["eagle-tree", "target-only"])
def test_float64_models_decode_on_cuda(algorithm, logits_dtype, request):
    """float64 is the precision mode of the reference comparisons (FP8 logits included); on the
    device its attention takes the torch path, which reads the longest live length back.
    generate() must still decode there (greedy: exactly the reference's tokens), captured or not."""
    models = gpu_models(compute_dtype="float64", logits_dtype=logits_dtype)
    prompts, budgets = ragged_prompts(43, 3, VOCAB, max_len=10), [5, 9, 7]
    spec = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6) if algorithm == "eagle-tree" else None
    got = specverify.generate(models, prompts, spec=spec, max_new_tokens=budgets)
    want = reference.generate(models, prompts, max_new_tokens=budgets).tokens
    assert_tokens_equal(got.tokens, want, f"float64 on cuda, {algorithm}, {logits_dtype} logits", request.node.nodeid)


def test_shared_rows_stay_allocated_for_the_graphs_that_read_them():
    """A captured step reads the shared read-only rows by address and holds no reference to them:
    a cache that evicted them (a bounded LRU) would free memory a graph still reads. After many
    other shapes, each call must still hand out views of the very rows of the first call, with
    their values; a chain longer than the kept length (a prefill's, run eagerly) is made fresh."""
    from specverify import dtypes
    from specverify.kernels.tree import chain_tree
    from specverify.models.layers import KEPT_CHAIN, chain_mask, chain_offsets, lone_query_mask

    def shared(bs):
        mask, parents = chain_mask(bs, 4, "cpu")
        seen, no_parent = lone_query_mask(bs, 3, "cpu")
        tree = chain_tree(torch.zeros(bs, dtype=torch.int64), torch.zeros((bs, 3), dtype=torch.int64),
                          torch.zeros(bs, dtype=torch.int64))
        scale = dtypes.to_logits_dtype(torch.zeros(bs, 5), "float32", shared_ones=True)[1]
        return (mask, parents, chain_offsets(4, "cpu"), seen, no_parent, tree.parents, tree.mask, tree.flat_index,
                scale)
    first = shared(2)                      # kept alive here: a re-made row cannot take their addresses
    for n in range(1, 3 * KEPT_CHAIN):     # many other shapes, as a long-running engine meets them
        chain_mask(1, n, "cpu")
        lone_query_mask(1, n, "cpu")
        chain_tree(torch.zeros(n, dtype=torch.int64), torch.zeros((n, 1), dtype=torch.int64),   # a new batch size
                   torch.zeros(n, dtype=torch.int64))
    again = shared(2)
    for a, b in zip(first, again):
        assert a.data_ptr() == b.data_ptr() and torch.equal(a, b), "a shared row was made again: the old one was freed"
    want_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(again[0][1], want_mask) and again[1][0].tolist() == [-1, 0, 1, 2]
    assert again[3].all() and again[4].eq(-1).all() and again[8].eq(1.0).all()
    long_a, long_b = chain_mask(1, KEPT_CHAIN + 1, "cpu")[0], chain_mask(1, KEPT_CHAIN + 1, "cpu")[0]
    assert long_a.data_ptr() != long_b.data_ptr(), "a prefill's long chain rows were kept"
