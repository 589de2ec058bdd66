"""The host side both decoders share: slot-table rows, page accounting, admission, the bucketed
runner and the one readback per step.

A decoder keeps its requests on the device (`device_state.RequestState` and whatever it adds)
and runs each step as one tensor function of the running rows (`step_fn`). What the host does
around it is the same for target-only and speculative decoding, and lives here:

- `allocate`: the shared resources, sized once: `max_running` rows plus a pad row that owns no page
  (padded lanes write only the sink), a page pool, the device state, the runner;
- `admit`: newcomers at a cycle boundary take free rows and their prompt's pages (plus what a
  step may write), the subclass's prefill runs them, and they join the running lanes. Admission
  promises each request the pages of its whole run (`committed`), so a running request never
  meets an empty pool; `can_admit` says whether the next one fits now;
- `run_step`: rebuild the rows tensor only when the running set changed, run the step, reserve
  the next step's pages in bulk while the device runs this one (queued edits, one transfer), copy
  the packed result back once;
- `finish` / `abort`: a finished or aborted request gives its row, pages and promise back; the
  next request to take the row finds nothing of it (docs/semantics.md section 8).

`start(reqs)` is the all-at-once form: resources for exactly `reqs`, one admission. The
scheduler (`engine/serving.py`) opens once and admits as rows and pages free up.

Subclasses set `ahead` (cache entries a step may write past `r.cached`), `advance` (the most
tokens a step adds to `r.cached`), `with_draft` (and `draft_layers`), and
implement `request_length`, `new_state`, `step_fn` and `prefill` (and `setup`, `prepare_rows`).
"""

from __future__ import annotations

import torch

from specverify.engine.device_state import Readback, graphs_allowed, rows_tensor
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.requests import Request, pages_needed
from specverify.engine.sampling import SamplingParams
from specverify.kernels.cuda_graph import BucketGraphRunner
from specverify.models import Models
from specverify.platform import resolve
from specverify.protocol.message import PREEMPTED

RESERVE_AHEAD = 16      # cache entries reserved past a step's reach, so most steps allocate nothing


class DeviceDecoder:
    ahead: int              # cache entries a step may write past r.cached
    advance: int            # the most tokens one step adds to r.cached
    with_draft: bool        # the cache holds the draft head's K/V too
    draft_layers: int = 1   # the draft's K/V layers (an MTP draft: one per head it runs)
    traces: list | None = None   # speculative only: per request index, its CycleTraces (trace=True)

    def __init__(self, models: Models, params: SamplingParams, *, seed: int, eos_token_id: int | None,
                 channel: LogprobChannel | None, page_size: int, platform, cuda_graph: bool,
                 pad_batches: bool | None):
        """pad_batches: run steps at bucket shapes (None = on CUDA only; True on the CPU tests the
        padded path). Graphs are used on CUDA when cuda_graph and the platform allow them."""
        self.models, self.params, self.seed = models, params, seed
        self.eos, self.channel, self.page_size = eos_token_id, channel, page_size
        self.profile = resolve(platform)
        self.dev = models.device
        self.pad_batches = self.dev.type == "cuda" if pad_batches is None else pad_batches
        self.use_graphs = graphs_allowed(models, cuda_graph, self.profile, self.pad_batches)
        self.readback = Readback(self.dev)

    # -- what a decoder supplies -----------------------------------------------------------------
    def request_length(self, r: Request) -> int:
        """Cache entries request r can ever need (its pages are capped there)."""
        raise NotImplementedError

    def new_state(self, rows: int):
        raise NotImplementedError

    def step_fn(self, inp: dict) -> dict:
        raise NotImplementedError

    def prefill(self, reqs: list[Request]) -> None:
        raise NotImplementedError

    # -- set-up ----------------------------------------------------------------------------------
    def allocate(self, *, max_running: int, num_pages: int) -> None:
        """The resources every request shares, sized once: `max_running` slot-table rows (plus the
        pad row, which owns no page: padded lanes write the sink), a pool of `num_pages` pages (page
        0 reserved), the device state and the runner. Requests join with `admit`."""
        self.max_running = max_running
        self.cache = self.models.target.new_cache(
            max_requests=max_running + 1, page_size=self.page_size, with_draft=self.with_draft,
            draft_layers=self.draft_layers, num_pages=num_pages)
        self.pad_row = self.cache.table.alloc_row()
        self.state = self.new_state(max_running + 1)
        pad = {"rows": torch.tensor(self.pad_row, dtype=torch.int64, device=self.dev)}
        self.runner = BucketGraphRunner(self.step_fn, pad, use_graphs=self.use_graphs, pad_batches=self.pad_batches)
        self.limit: dict[int, int] = {}      # request index -> cache entries it can ever need
        self.committed = 0                   # pages promised to the running requests' whole runs
        self._running: list[Request] = []    # in admission order (the order of the step's lanes)
        self._rows = None
        self.setup()

    def setup(self) -> None:
        """What a decoder builds once over the opened cache and state (the speculative cycle)."""

    def start(self, reqs: list[Request]) -> None:
        """All of `reqs` at once: resources sized for exactly them, then one admission."""
        self.allocate(max_running=len(reqs),
                  num_pages=pages_needed([self.request_length(r) for r in reqs], self.page_size))
        self.admit(reqs)

    def pages_for(self, r: Request) -> int:
        """Pages request r holds at most: its whole run's cache entries, rounded up to pages."""
        return -(-self.request_length(r) // self.page_size)

    def admissible(self, queue: list[Request]) -> int:
        """How many requests at the head of `queue` fit now, in order: each needs a free row and,
        on top of the pages promised so far, the pages of its whole run."""
        rows = self.max_running - len(self._running)
        pages = self.cache.table.num_pages - 1 - self.committed
        n = 0
        for r in queue[:max(rows, 0)]:
            pages -= self.pages_for(r)
            if pages < 0:
                break
            n += 1
        return n

    def admit(self, reqs: list[Request]) -> None:
        """Newcomers join at a cycle boundary: each takes a free row and the pages of its prompt
        (plus what a step may write), then one prefill runs them all and they join the running
        lanes. A reused row's state is whatever its predecessor left: the prefill rewrites every
        per-row field (`prepare_rows` first clears what the prefill may leave unwritten)."""
        if not reqs:
            return
        for r in reqs:
            self.limit[r.index] = self.request_length(r)
            self.committed += self.pages_for(r)
            r.row = self.cache.table.alloc_row()
            self.cache.table.reserve(r.row, min(len(r.prompt) + self.ahead, self.limit[r.index]))
        self.prepare_rows(reqs)
        self._running.extend(reqs)
        self._rows = None
        self.prefill(reqs)

    def prepare_rows(self, reqs: list[Request]) -> None:
        """Clear per-row state the prefill does not always rewrite (the tracking slots)."""

    def take_first_tokens(self, reqs: list[Request], first: torch.Tensor, finished: torch.Tensor) -> None:
        """The prefill's readback: each request's first token and whether it already stopped."""
        for r, (t, f) in zip(reqs, self.readback.fetch(torch.stack([first, finished.long()], 1))):
            r.output.append(t)
            r.cached = len(r.prompt)
            if f:
                self.finish(r)

    # -- steps -----------------------------------------------------------------------------------
    def running(self) -> list[Request]:
        return list(self._running)

    def finish(self, r: Request) -> None:
        """A request that stopped (or was aborted) gives its row, pages and page promise back."""
        r.finished = True
        self.cache.table.free_row(r.row)
        self.committed -= self.pages_for(r)
        self._running.remove(r)
        self._rows = None

    def abort(self, r: Request) -> None:
        """Stop a running request now: its row and pages go back to the pool at once, and the
        logprob stream reports it preempted."""
        if not r.finished:
            self.request_state.finished[r.row] = True
            self.finish(r)
            if self.channel is not None:
                self.channel.signal(r.index, PREEMPTED)

    @property
    def request_state(self):
        """The `RequestState` part of the decoder's state."""
        return self.state

    def run_step(self, reqs: list[Request]) -> tuple[list[list[int]], dict]:
        """Reserve, run the step on the rows of `reqs`, read the packed result back once.
        Returns (one list of ints per lane, the step's outputs)."""
        # This step's pages were reserved by `start` (the first step) or while the previous step
        # ran; flushing applies anything still queued (a no-op otherwise).
        self.cache.table.flush()
        if self._rows is None:
            self._rows = rows_tensor([r.row for r in reqs], self.dev)
        out = self.runner.run({"rows": self._rows})
        # The next step's pages, while the device runs this one: its requests will have advanced by
        # at most `advance` tokens. The table edits queue behind this step on the stream.
        self._reserve(reqs, self.advance)
        return self.readback.fetch(out["packed"]), out

    def _reserve(self, reqs: list[Request], advance: int) -> None:
        """Pages for what a step writes once each request has `advance` more cached tokens,
        reserved in bulk (RESERVE_AHEAD more), applied in one queued transfer."""
        table = self.cache.table
        for r in reqs:
            need = min(r.cached + advance + self.ahead, self.limit[r.index])
            if table.capacity(r.row) < need:
                table.reserve(r.row, min(need + RESERVE_AHEAD, self.limit[r.index]))
        table.flush()
