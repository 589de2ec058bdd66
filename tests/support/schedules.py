"""Arrival / abort schedules for the continuous-batching engine, and the checks every schedule ends
with (issue 23; docs/semantics.md section 8).

A `Schedule` says, for each request of a fixed pool (submitted in pool order, so request i is
the pool's i-th and its uniforms are keyed by i), the cycle boundary it arrives at and the one
it is aborted at (or never), the `max_running` bound, the page pool (roomy: never waits; tight:
the longest request fits with little room beside it, so admissions wait for pages) and whether
steps run padded (bucket shapes, the CUDA path). `drive` plays it on an `Engine`, checking the
pool after every boundary; `assert_pool_consistent` and `assert_pool_at_rest` are the accounting:
every page is free or owned by exactly one row, a row maps exactly the pages it owns (the rest of
its table row is the sink), no padded lane of a bucket's input buffer holds a request's row, and
after the schedule every row and page is back.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from specverify.models.kv_cache import SINK_SLOT

MAX_CYCLES = 400        # a schedule that has not ended by then is a hang


@dataclasses.dataclass(frozen=True)
class Schedule:
    max_running: int
    arrivals: tuple[int, ...]              # per pool request, non-decreasing cycle boundaries
    aborts: tuple[int | None, ...]         # per pool request: abort at this boundary (absolute), or never
    spare_pages: int | None = None         # None: the default (roomy) pool; else the longest request's pages + this
    pad_batches: bool = False

    def describe(self) -> str:
        return (f"Schedule(max_running={self.max_running}, arrivals={self.arrivals}, aborts={self.aborts}, "
                f"spare_pages={self.spare_pages}, pad_batches={self.pad_batches})")


@st.composite
def schedules(draw, n: int, *, most_running: int = 4, most_gap: int = 3, latest_abort: int = 6):
    """Schedules over a pool of n requests: bursts (gap 0) and spread arrivals, aborts before
    admission, mid-run and after the end, roomy and tight page pools, padded and live shapes."""
    gaps = draw(st.lists(st.integers(0, most_gap), min_size=n, max_size=n))
    arrivals, at = [], 0
    for g in gaps:
        at += g
        arrivals.append(at)
    aborts = tuple(None if a is None else arrivals[i] + a for i, a in enumerate(draw(
        st.lists(st.one_of(st.none(), st.none(), st.integers(0, latest_abort)), min_size=n, max_size=n))))
    spare = draw(st.one_of(st.none(), st.integers(0, 6)))
    return Schedule(draw(st.integers(1, most_running)), tuple(arrivals), aborts, spare, draw(st.booleans()))


def pool_pages(lengths: list[int], page_size: int, spare: int | None) -> int | None:
    """num_pages for a schedule: None (the engine's roomy default) or a tight pool where the
    longest request's run fits with `spare` pages beside it (page 0 reserved)."""
    if spare is None:
        return None
    return 1 + max(-(-n // page_size) for n in lengths) + spare


def drive(engine, prompts, budgets, schedule: Schedule, *, after_step=None) -> dict:
    """Play `schedule` on `engine`: at each boundary the arrivals are submitted (in pool order),
    then the aborts land, then `engine.step()`. Returns {request id: "finished" | "aborted"} and
    checks the pool after every step (`after_step(engine)` too, if given)."""
    nxt, cycle = 0, 0
    n = len(prompts)
    while nxt < n or engine.has_unfinished():
        assert cycle < MAX_CYCLES, f"{schedule.describe()}: not done after {MAX_CYCLES} boundaries"
        while nxt < n and schedule.arrivals[nxt] <= cycle:
            assert engine.add_request(prompts[nxt], budgets[nxt]) == nxt
            nxt += 1
        for i in range(nxt):
            if schedule.aborts[i] == cycle:
                before = engine.status(i)
                assert engine.abort(i) == (before in ("waiting", "running")), f"abort of a {before} request"
                assert engine.status(i) == ("aborted" if before in ("waiting", "running") else before)
        engine.step()
        assert_pool_consistent(engine)
        if after_step is not None:
            after_step(engine)
        cycle += 1
    statuses = {i: engine.status(i) for i in range(n)}
    assert set(statuses.values()) <= {"finished", "aborted"}, statuses
    return statuses


def assert_pool_consistent(engine) -> None:
    """Every page is either free or owned by exactly one row; each row's table maps exactly its own
    pages, in order, and the sink everywhere past them; the promised pages are those of the running
    requests."""
    dec = engine.decoder
    table = dec.cache.table
    owners = table.owners()
    free = table.free_page_ids()
    owned = [p for pages in owners.values() for p in pages]
    assert len(set(free)) == len(free), f"a page is in the free pool twice: {sorted(free)}"
    assert len(set(owned)) == len(owned), f"a page is owned by two rows: {owners}"
    assert set(free).isdisjoint(owned), f"a page is free and owned at once: free {sorted(free)}, owners {owners}"
    assert sorted(free + owned) == list(range(1, table.num_pages)), \
        f"pages lost or invented: free {sorted(free)}, owned {sorted(owned)}, pool 1..{table.num_pages - 1}"
    req_to_token = table.req_to_token.cpu()
    size = table.page_size
    for row in range(req_to_token.shape[0]):
        pages = owners.get(row, [])
        want = [p * size + i for p in pages for i in range(size)][:table.max_context]
        got = req_to_token[row].tolist()
        assert got[:len(want)] == want, f"row {row} maps {got[:len(want)]}, it owns pages {pages}"
        assert all(s == SINK_SLOT for s in got[len(want):]), \
            f"row {row} still maps slots past its {len(pages)} pages: {sorted(set(got[len(want):]) - {SINK_SLOT})}"
    for bucket, buf in dec.runner.static.items():
        # A padded lane replays the pad row, never a request's row: a lane left holding a row
        # of an earlier, larger batch runs that row twice (or its new owner's, after a refill).
        lanes = [r for r in buf["rows"].tolist() if r != dec.pad_row]
        assert len(lanes) == len(set(lanes)), f"bucket {bucket}: lanes {buf['rows'].tolist()} repeat a row"
    running = dec.running()
    assert dec.committed == sum(dec.pages_for(r) for r in running), \
        f"{dec.committed} pages promised, the running requests need {sum(dec.pages_for(r) for r in running)}"
    assert len(owners) == 1 + len(running), f"{len(owners)} rows allocated for {len(running)} running (+ the pad row)"
    # What the engine reports is what the pool holds.
    want = {"free_rows": table.num_free_rows, "free_pages": len(free), "committed_pages": dec.committed,
            "running": len(running), "waiting": len(engine.waiting)}
    assert engine.resources() == want, f"resources() {engine.resources()}, the pool holds {want}"


def assert_pool_at_rest(engine, num_pages: int) -> None:
    """After a schedule every row, page and promise is back where it started."""
    want = {"free_rows": engine.max_running, "free_pages": num_pages - 1, "committed_pages": 0, "running": 0,
            "waiting": 0}
    assert engine.resources() == want, f"after the schedule: {engine.resources()}, at rest {want}"
