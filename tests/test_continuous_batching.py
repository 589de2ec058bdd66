"""Continuous batching (issue 23; docs/semantics.md section 8): requests join and leave a running
`Engine` at chosen cycle boundaries, and every request decodes as if it were alone.

For each case (algorithm x dense / hybrid model x sampling, with page sizes 1 and 4, FP8 and
bfloat16 logits, penalties and logprobs rotating through them) hypothesis draws arrival / abort
schedules over a fixed pool of six requests (`tests/support/schedules.py`): bursts and spread
arrivals, `max_running` 1..4, requests finishing on their first token, aborts before admission,
mid-run and after the end, tight page pools that make admissions wait, padded and live shapes.
Each request's tokens, per-cycle trace (speculative) and logprobs must equal those of the same
request decoded alone by the cache-free reference (`reference.generate`, `reference.eagle`,
`reference.naive_eagle`), greedy and sampled alike: its uniforms are keyed by its index in the
submission. An aborted request's output is a prefix of its reference run. After every boundary
the page pool is consistent, and after the schedule every row, page and promise is back.

The models compute in float64 and the drafts are steered (deep accepted paths, so a row's stale
draft state shows); as in `tests/test_spec_trace.py`, a request is compared up to the reference's
first near-tie, and a case whose near-ties stop more than half its requests fails.
"""

from __future__ import annotations

import functools
import warnings
import zlib

import pytest
import torch
from hypothesis import example, given, settings

import reference
import reference.naive_eagle
import specverify
from specverify import Engine, SpecConfig
from specverify.engine.spec_config import cache_entries
from tests.support.cases import cached_models, ragged_prompts
from tests.support.schedules import Schedule, assert_pool_at_rest, drive, pool_pages, schedules
from tests.support.steering import steered_models
from tests.support.traces import TraceNearTieWarning, fields
from tests.test_logprobs_e2e import assert_records_match, reference_records
from tests.test_spec_trace import reference_hook
from tests.test_cuda_graphs import sync_errors
from specverify.kernels.cuda_graph import bucket_for

pytestmark = pytest.mark.e2e

ALGORITHMS = {
    "target": None,
    "eagle-chain": SpecConfig(num_steps=3, topk=1, page_size=4),
    "eagle-tree": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6),
    "naive": SpecConfig(algorithm="naive_eagle", page_size=4),
    "mtp": SpecConfig(algorithm="mtp", num_steps=2),
    "dflash": SpecConfig(algorithm="dflash", num_steps=3, page_size=4),
}
SAMPLING = {"greedy": {}, "sampled": dict(temperature=0.3, top_k=20)}
# What rotates through the cases: logits dtype and scale, penalties, logprobs, the target-only page size.
ROTATION = [
    dict(logits_dtype="float32"),
    dict(logits_dtype="float8_e4m3fn", logits_scale=0.37, repetition_penalty=1.3, frequency_penalty=0.2),
    dict(logits_dtype="bfloat16", logprobs=2, page_size=4),
    dict(logits_dtype="float8_e5m2", logits_scale=2.5, presence_penalty=0.4, logprobs=1),
]
CASES = [(a, m, s) for a in ALGORITHMS for m in ("dense", "hybrid") for s in SAMPLING]
BUDGETS = [1, 9, 4, 12, 2, 7]        # request 0 finishes on its first token, request 4 after one step
POOL = len(BUDGETS)
MAX_SKIPPED_FRACTION = 0.5
SCHEDULES_PER_CASE = max(4, settings.default.max_examples // 5)


def case_id(case) -> str:
    return "-".join(case)


@functools.lru_cache(maxsize=None)
def build(case: tuple[str, str, str]) -> dict:
    """The case's models (steered drafts), pool, engine arguments and the reference's runs."""
    algorithm, model, sampling = case
    spec = ALGORITHMS[algorithm]
    key = zlib.crc32(case_id(case).encode())
    extra = dict(ROTATION[CASES.index(case) % len(ROTATION)])    # each algorithm meets every rotation
    logits = {k: extra.pop(k) for k in ("logits_dtype", "logits_scale") if k in extra}
    models = cached_models(compute_dtype="float64", hybrid=model == "hybrid", **logits)
    prompts = ragged_prompts(key, POOL, models.config.vocab_size, max_len=10)
    hook = None
    if spec is not None:
        models = steered_models(models, prompts, BUDGETS, agreement=0.75, spec=spec)
        hook = reference_hook(models.draft)
    page_size = extra.pop("page_size", 1)
    logprobs = extra.pop("logprobs", 0)
    kwargs = dict(SAMPLING[sampling], seed=key % 997, **extra)
    if key % 3 == 0:
        # An EOS the pool meets: the third token request 3 emits when decoded without one.
        free = specverify.generate(models, prompts, spec=spec, max_new_tokens=BUDGETS, **kwargs).tokens[3]
        kwargs["eos_token_id"] = free[2]
    ref = run_reference(models, hook, spec, prompts, kwargs)
    cut = [None if spec is None else t.first_near_tie for t in (ref.traces if spec is not None else [None] * POOL)]
    skipped = [i for i, c in enumerate(cut) if c is not None]
    if skipped:
        warnings.warn(TraceNearTieWarning(f"{case_id(case)}: requests {skipped} compared up to a near-tie"))
    assert len(skipped) <= MAX_SKIPPED_FRACTION * POOL, f"{case_id(case)}: near-ties stop requests {skipped}"
    lengths = [cache_entries(spec, len(p), n) for p, n in zip(prompts, BUDGETS)]
    page = page_size if spec is None else spec.page_size
    return dict(models=models, spec=spec, prompts=prompts, kwargs=kwargs, ref=ref, cut=cut, logprobs=logprobs,
                page_size=page_size, page=page, lengths=lengths)


def run_reference(models, hook, spec, prompts, kwargs, budgets=tuple(BUDGETS)):
    budgets = list(budgets)
    if spec is None:
        return reference.generate(models, prompts, max_new_tokens=budgets, **kwargs)
    if spec.algorithm == "naive_eagle":
        return reference.naive_eagle.generate(models, prompts, naive_sampling=spec.naive_sampling,
                                              max_new_tokens=budgets, draft_logits_hook=hook, **kwargs)
    return reference.eagle.generate(models, prompts, spec_num_steps=spec.num_steps, topk=spec.topk,
                                    num_draft_tokens=spec.draft_tokens, algorithm=spec.algorithm,
                                    max_new_tokens=budgets, draft_logits_hook=hook, **kwargs)


def new_engine(c: dict, schedule: Schedule) -> tuple[Engine, int]:
    num_pages = pool_pages(c["lengths"], c["page"], schedule.spare_pages)
    engine = Engine(c["models"], spec=c["spec"], max_running=schedule.max_running, num_pages=num_pages,
                    page_size=c["page_size"], logprobs=c["logprobs"], trace=c["spec"] is not None,
                    pad_batches=schedule.pad_batches, **c["kwargs"])
    return engine, engine.num_pages


def check_request(c: dict, out, i: int, status: str, what: str) -> None:
    """Request i's output against its reference run: all of it (finished) or a prefix (aborted),
    up to the reference's first near-tie."""
    want_tokens = c["ref"].tokens[i]
    got_tokens = out.tokens[i]
    full = status == "finished"
    where = f"{what}: request {i} ({status}), prompt {c['prompts'][i]}, budget {BUDGETS[i]}"
    if c["spec"] is not None:
        want = c["ref"].traces[i]
        got = out.trace[i]
        cut = c["cut"][i]
        upto = len(want.cycles) if cut is None else max(cut, 0)
        for k in range(min(upto, len(got))):
            assert fields(got[k]) == fields(want.cycles[k]), \
                f"{where}: cycle {k}\n  engine:    {fields(got[k])}\n  reference: {fields(want.cycles[k])}"
        if cut is not None:
            n = 0 if cut < 0 else 1 + sum(len(cy.emitted) for cy in want.cycles[:cut])
            got_tokens, want_tokens, full = got_tokens[:n], want_tokens[:n], False
        elif full:
            assert len(got) == len(want.cycles), f"{where}: {len(got)} cycles, reference {len(want.cycles)}"
        assert [len(cy.emitted) for cy in got] == out.accept_lengths[i], f"{where}: accept lengths"
    if full:
        assert got_tokens == want_tokens, f"{where}: tokens {got_tokens}, reference {want_tokens}"
    else:
        assert got_tokens == want_tokens[:len(got_tokens)], \
            f"{where}: tokens {got_tokens} are not a prefix of the reference's {want_tokens}"
    if c["logprobs"] and out.tokens[i]:
        want_records = reference_records(c["models"], c["prompts"][i], out.tokens[i], c["logprobs"])
        assert_records_match(out.logprobs[i], want_records, where)


def run_schedule(case, schedule: Schedule) -> dict:
    c = build(case)
    engine, num_pages = new_engine(c, schedule)
    statuses = drive(engine, c["prompts"], BUDGETS, schedule)
    out = engine.close()
    what = f"{case_id(case)} {schedule.describe()}"
    for i, status in statuses.items():
        check_request(c, out, i, status, what)
        if engine.channel is not None:       # the stream says which requests were preempted
            streamed = engine.channel.processor.results[i].status
            assert (streamed == "preempted") == (status == "aborted"), f"{what}: request {i} {status}, stream {streamed}"
    assert_pool_at_rest(engine, num_pages)
    return statuses


# Pinned schedules every case runs (hypothesis adds its own draws): all at once; one at a time; a
# burst into a full engine; aborts before admission, mid-run and after the end with arrivals
# landing on the freed rows at the same boundary; a tight pool that makes admissions wait; the
# padded path with the batch shrinking inside a bucket while rows are refilled.
PINNED = [
    Schedule(4, (0,) * POOL, (None,) * POOL),
    Schedule(1, (0,) * POOL, (None,) * POOL, pad_batches=True),
    Schedule(2, (0, 0, 0, 1, 1, 1), (None, None, 2, None, 3, None), pad_batches=True),
    Schedule(3, (0, 0, 1, 2, 2, 4), (0, 1, 3, 3, None, 20), spare_pages=0),
    Schedule(4, (0, 0, 0, 0, 2, 3), (None, 2, None, None, None, 4), spare_pages=2, pad_batches=True),
    Schedule(2, (0, 1, 2, 3, 4, 5), (None, None, 5, None, None, None), spare_pages=1),
]


@pytest.mark.fp8
@pytest.mark.parametrize("case", CASES, ids=case_id)
@settings(max_examples=SCHEDULES_PER_CASE)
@given(schedule=schedules(POOL))
@example(schedule=PINNED[0])
@example(schedule=PINNED[1])
@example(schedule=PINNED[2])
@example(schedule=PINNED[3])
@example(schedule=PINNED[4])
@example(schedule=PINNED[5])
def test_every_request_decodes_as_if_alone(case, schedule):
    run_schedule(case, schedule)


def test_pinned_schedules_reuse_rows_wait_for_pages_and_abort():
    """The pinned schedules do what they are there for: rows are refilled, a tight pool makes an
    admission wait while a row is free, aborts land on waiting and running requests."""
    c = build(("eagle-tree", "hybrid", "greedy"))
    seen = {"reused": 0, "waited": 0, "aborted_waiting": 0, "aborted_running": 0}

    def watch(engine):
        rows = [r.row for r in engine.requests if r.row >= 0]
        seen["reused"] = max(seen["reused"], len(rows) - len(set(rows)))
        res = engine.resources()
        if res["waiting"] and res["running"] < engine.max_running:
            seen["waited"] += 1

    for schedule in PINNED:
        engine, _ = new_engine(c, schedule)
        statuses = drive(engine, c["prompts"], BUDGETS, schedule, after_step=watch)
        for i, s in statuses.items():
            if s == "aborted":
                seen["aborted_running" if engine.output().tokens[i] else "aborted_waiting"] += 1
    assert all(seen.values()), seen


def test_generate_max_running_equals_all_at_once():
    """`generate(max_running=N)` gives every N the all-at-once call's tokens, trace and logprobs."""
    c = build(("eagle-chain", "hybrid", "sampled"))
    kwargs = dict(c["kwargs"], logprobs=2)
    runs = [specverify.generate(c["models"], c["prompts"], spec=c["spec"], max_new_tokens=BUDGETS, trace=True,
                                max_running=n, **kwargs) for n in (None, 1, 2, 5)]
    for n, run in zip((1, 2, 5), runs[1:]):
        assert run.tokens == runs[0].tokens, f"max_running={n}"
        assert [[fields(cy) for cy in t] for t in run.trace] == [[fields(cy) for cy in t] for t in runs[0].trace]
        assert run.logprobs == runs[0].logprobs, f"max_running={n}: logprobs"


@pytest.mark.parametrize("algorithm", ["target", "eagle-tree"])
def test_a_bucket_that_shrinks_runs_each_row_once(algorithm):
    """Padded steps, four requests, two finish together and one newcomer takes a freed row: the
    bucket of four now has three live lanes. A lane that kept a row of the earlier batch runs that
    request twice in one step; the lanes compute the same values, so most of it is idempotent, but
    the penalty counts are a scatter-add: every running request's counts must equal the tokens it
    emitted, after every step, and its tokens its reference run's."""
    spec = ALGORITHMS[algorithm]
    models = cached_models(compute_dtype="float64")
    prompts = ragged_prompts(23, 5, models.config.vocab_size, max_len=6)
    budgets = [3, 3, 10, 10, 6]
    kwargs = dict(frequency_penalty=0.7, presence_penalty=0.5)
    hook = None
    if spec is not None:
        models = steered_models(models, prompts, budgets, agreement=0.0, spec=spec)
        hook = reference_hook(models.draft)
    engine = Engine(models, spec=spec, max_running=4, pad_batches=True, **kwargs)
    for p, n in zip(prompts, budgets):
        engine.add_request(p, n)
    shrunk = False
    while engine.has_unfinished():
        before = len(engine.decoder.running())
        engine.step()
        shrunk |= 0 < len(engine.decoder.running()) < before
        counts = engine.decoder.request_state.penalty.counts
        for r in engine.decoder.running():
            want = torch.bincount(torch.tensor(r.output), minlength=counts.shape[1]).to(counts.dtype)
            assert torch.equal(counts[r.row].cpu(), want), f"request {r.index}: penalty counts != its output"
    assert engine.output().tokens == run_reference(models, hook, spec, prompts, kwargs, budgets).tokens
    assert shrunk, "the bucket never ran with fewer live lanes than before"


def test_a_short_prompt_on_a_reused_row_tracks_nothing():
    """The tracking slot of a row whose new owner's prompt is shorter than the interval holds
    zeros (it tracks nothing yet), not its predecessor's tracked state; a longer prompt's tracking
    slot holds the state at its last multiple of the interval. Three requests through one row, so
    the rows (0 for all after the pad row) and the request indices (0, 1, 2) differ."""
    spec = SpecConfig(num_steps=2, topk=1, state_track_interval=4)
    models = cached_models(compute_dtype="float64", hybrid=True)
    engine = Engine(models, spec=spec, max_running=1)
    for prompt in ([5, 6], list(range(3, 14)), [5, 6]):    # short, long (tracked at 8), short
        engine.add_request(prompt, 1)                     # each ends on its prefill token
    states = engine.decoder.cache.states
    tracked = []
    for i in range(3):
        assert engine.step() == [i]
        row = engine.requests[i].row
        slot = states.tracking_slot(torch.tensor([row]))
        tracked.append(all(buf[slot].any() for buf in states.state + states.conv))
        assert all(not buf[slot].any() for buf in states.state + states.conv) or i == 1, \
            f"request {i} on row {row}: its tracking slot holds its predecessor's state"
    assert tracked == [False, True, False], tracked
    assert {r.row for r in engine.requests} == {engine.requests[0].row}, "the requests did not share the row"
    assert engine.requests[0].row != 0 and engine.requests[2].index == 2


def test_admission_keeps_submission_order_and_the_head_waits_for_pages():
    """The head of the queue waits for pages even when a later, smaller request would fit now:
    admission is in submission order (docs/semantics.md section 8), so no request starves."""
    models = cached_models(compute_dtype="float64")
    engine = Engine(models, max_running=3, num_pages=20, page_size=1)
    engine.add_request(list(range(1, 9)), 4)        # 12 pages of the 19
    engine.add_request(list(range(1, 10)), 4)       # 13: waits for the first
    engine.add_request([7], 1)                      # 2: would fit beside the first, must not overtake
    engine.step()
    assert [engine.status(i) for i in range(3)] == ["running", "waiting", "waiting"]
    assert engine.resources()["committed_pages"] == 12 and engine.resources()["waiting"] == 2
    engine.run()
    assert [engine.status(i) for i in range(3)] == ["finished"] * 3


def test_status_abort_and_step_report_what_happened():
    """`status`, `abort`'s answer and `step`'s list of ended ids, through one row."""
    models = cached_models(compute_dtype="float64")
    engine = Engine(models, max_running=1, logprobs=1)
    assert engine.add_request([1, 2, 3], 1) == 0        # ends on its prefill token
    assert engine.add_request([4, 5], 6) == 1
    assert engine.add_request([6], 6) == 2
    assert [engine.status(i) for i in range(3)] == ["waiting"] * 3
    assert engine.step() == [0]                          # admitted, prefilled, finished at once
    assert [engine.status(i) for i in range(3)] == ["finished", "waiting", "waiting"]
    assert engine.step() == []                           # request 1 runs
    assert [engine.status(i) for i in range(3)] == ["finished", "running", "waiting"]
    assert engine.abort(2) is True and engine.status(2) == "aborted"      # waiting: leaves the queue
    assert engine.abort(2) is False and engine.abort(0) is False          # ended: nothing to do
    assert engine.abort(1) is True and engine.abort(1) is False
    assert not engine.has_unfinished() and engine.step() == []
    results = engine.close() and engine.channel.processor.results
    assert [r.status for r in results] == ["running", "preempted", "preempted"]
    assert engine.output().tokens[2] == [] and len(engine.output().tokens[1]) == 2


def test_a_refused_request_takes_no_id_and_no_stream_slot():
    spec = SpecConfig(num_steps=2, topk=1, page_size=4)
    models = cached_models(compute_dtype="float64")
    engine = Engine(models, spec=spec, max_running=2, num_pages=5, logprobs=1, trace=True)   # 4 pages of 4
    with pytest.raises(ValueError, match="could never run"):
        engine.add_request(list(range(1, 10)), 5)
    assert engine.add_request([1, 2, 3], 2) == 0
    out = engine.run()
    assert len(out.tokens) == len(out.logprobs) == len(out.trace) == len(out.accept_lengths) == 1
    assert len(out.logprobs[0]) == len(out.tokens[0]) == 2


def test_engine_refuses_what_can_never_run_and_bad_arguments():
    models = cached_models(compute_dtype="float64")
    engine = Engine(models, max_running=2, num_pages=3, page_size=4)      # 2 pages of 4 entries
    with pytest.raises(ValueError, match=r"needs 3 pages of 4 tokens.*num_pages=3 holds 2"):
        engine.add_request([1, 2, 3, 4, 5], 5)
    assert engine.add_request([1, 2, 3], 5) == 0
    with pytest.raises(ValueError, match=r"request_id 1 is not a request of this engine \(ids 0..0\)"):
        engine.abort(1)
    with pytest.raises(ValueError, match=r"prompt is empty"):
        engine.add_request([], 3)
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 1"):
        engine.add_request([1], 0)
    with pytest.raises(ValueError, match=r"max_running must be >= 1"):
        Engine(models, max_running=0)
    with pytest.raises(ValueError, match=r"max_running must be <= 256"):
        Engine(models, max_running=257, pad_batches=True)
    with pytest.raises(ValueError, match=r"num_pages must be >= 2"):
        Engine(models, max_running=1, num_pages=1)
    with pytest.raises(ValueError, match=r"max_running must be >= 1"):
        specverify.generate(models, [[1]], max_new_tokens=2, max_running=0)


def test_dtype_rotation_covers_fp8_and_both_page_sizes():
    """The rotation meets FP8 logits, penalties, logprobs and page size 4 on every algorithm."""
    for algorithm in ALGORITHMS:
        rows = [build((algorithm, m, s)) for m in ("dense", "hybrid") for s in SAMPLING]
        dtypes_seen = {r["models"].config.logits_dtype for r in rows}
        assert any(d.startswith("float8") for d in dtypes_seen), f"{algorithm}: no FP8 logits in {dtypes_seen}"
    assert {build(("target", m, s))["page"] for m in ("dense", "hybrid") for s in SAMPLING} == {1, 4}
    assert {spec.page_size for spec in ALGORITHMS.values() if spec is not None} == {1, 4}


# -- on the device ----------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("case", [c for c in CASES if c[2] == "greedy"] + [("eagle-tree", "hybrid", "sampled")],
                         ids=case_id)
def test_pinned_schedules_on_the_device(case):
    """The pinned schedules with the case's models on the GPU (float64: eager, padded steps)."""
    c = dict(build(case))
    c["models"] = device_models(case)
    for schedule in PINNED:
        engine, num_pages = new_engine(c, schedule)
        statuses = drive(engine, c["prompts"], BUDGETS, schedule)
        out = engine.close()
        for i, status in statuses.items():
            check_request(c, out, i, status, f"{case_id(case)} on cuda {schedule.describe()}")
        assert_pool_at_rest(engine, num_pages)


def device_models(case):
    """`build(case)`'s models rebuilt on the GPU, the draft steered alike."""
    c = build(case)
    cfg, spec = c["models"].config, c["spec"]
    models = specverify.build_models("tiny", device="cuda", compute_dtype="float64", hybrid=case[1] == "hybrid",
                                     logits_dtype=cfg.logits_dtype, logits_scale=cfg.logits_scale)
    if spec is None:
        return models
    return steered_models(models, c["prompts"], BUDGETS, agreement=0.75, spec=spec,
                          oracle=c["models"].draft.oracle.to("cuda"))


GRAPH_SPECS = {"target": None, "eagle-topk4": SpecConfig(num_steps=3, topk=4, num_draft_tokens=8),
               "naive": SpecConfig(algorithm="naive_eagle"), "mtp": SpecConfig(algorithm="mtp", num_steps=2),
               "dflash": SpecConfig(algorithm="dflash", num_steps=3, page_size=4)}


@pytest.mark.cuda
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_captured_cycle_under_reuse_equals_eager(name, sampled):
    """Twenty requests through max_running=6 with arrivals every other boundary and aborts: the
    captured engine keeps one graph per bucket while rows are refilled (no capture per
    admission), makes one readback per step (plus one per admission's prefill) and no other sync
    in a step without admissions, and equals the eager engine bit for bit, every step."""
    spec = GRAPH_SPECS[name]
    n = 20
    prompts = ragged_prompts(71, n, 389, max_len=10)
    budgets = [3 + (7 * i) % 17 for i in range(n)]
    models = specverify.build_models("tiny", device="cuda", compute_dtype="float32", hybrid=name != "eagle-topk4")
    if spec is not None:
        models = steered_models(models, prompts, budgets, agreement=0.7, spec=spec)
    kwargs = dict(temperature=0.7, top_k=20, seed=5) if sampled else {}
    trace = spec is not None
    graph = Engine(models, spec=spec, max_running=6, page_size=4, trace=trace, **kwargs)
    eager = Engine(models, spec=spec, max_running=6, page_size=4, trace=trace, cuda_graph=False, **kwargs)
    assert graph.decoder.use_graphs and not eager.decoder.use_graphs and eager.decoder.pad_batches
    aborts = {9: 4, 25: 11, 31: 13}            # boundary -> request aborted there (after it arrived)
    buckets, boundary, quiet, aborted = set(), 0, 0, []
    while boundary < 200 and (boundary < 2 * n or graph.has_unfinished()):
        admitted = False
        if boundary % 2 == 0 and boundary // 2 < n:
            for e in (graph, eager):
                e.add_request(prompts[boundary // 2], budgets[boundary // 2])
            admitted = True
        if boundary in aborts:
            done = graph.abort(aborts[boundary])
            assert eager.abort(aborts[boundary]) == done
            aborted += [aborts[boundary]] * done
        running = len(graph.decoder.running()) + len(graph.waiting)
        reads = graph.decoder.readback.count
        if not admitted and not graph.waiting and running:
            with sync_errors():
                graph.step()
            quiet += 1
            assert graph.decoder.readback.count - reads == 1, "more than one readback in a step"
        else:
            graph.step()
        eager.step()
        if graph.decoder.running():
            buckets.add(bucket_for(len(graph.decoder.running())))
        assert graph.output().tokens == eager.output().tokens, f"boundary {boundary}"
        boundary += 1
    assert not graph.has_unfinished() and not eager.has_unfinished()
    out, ref = graph.output(), eager.output()
    assert out.trace == ref.trace and out.accept_lengths == ref.accept_lengths
    captures = graph.decoder.runner.captures
    assert captures == len(graph.decoder.runner.graphs) <= 4 < n, \
        f"{captures} captures for {n} admissions into a batch of at most 6 (buckets 1, 2, 4, 8)"
    assert len(buckets) >= 3, f"the running set met too few buckets: {sorted(buckets)}"
    assert quiet >= 5, f"only {quiet} steps ran under the sync check"
    assert len(aborted) >= 2, f"only requests {aborted} were still running or waiting at their abort"
    assert [graph.status(i) for i in aborted] == ["aborted"] * len(aborted)
    assert_pool_at_rest(graph, graph.num_pages)
    assert_pool_at_rest(eager, eager.num_pages)
