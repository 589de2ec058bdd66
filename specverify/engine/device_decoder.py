"""The host side both decoders share: slot-table rows, page reservation, the bucketed runner and
the one readback per step.

A decoder keeps its requests on the device (`device_state.RequestState` and whatever it adds)
and runs each step as one tensor function of the running rows (`step_fn`). What the host does
around it is the same for target-only and speculative decoding, and lives here:

- `start`: a cache sized for every request's whole run, a pad row that owns no page (padded
  lanes write only the sink), a row per request with its prompt's pages (plus what a step may
  write) reserved, the device state, the runner, then the subclass's prefill;
- `run_step`: rebuild the rows tensor only when the running set changed, run the step, reserve
  the next step's pages in bulk while the device runs this one (queued edits, one transfer), copy
  the packed result back once;
- `finish`: a finished or aborted request gives its row and pages back.

Subclasses set `ahead` (cache entries a step may write past `r.cached`), `advance` (the most
tokens a step adds to `r.cached`), `with_draft` (and `draft_layers`), and
implement `request_length`, `new_state`, `step_fn` and `prefill`.
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

RESERVE_AHEAD = 16      # cache entries reserved past a step's reach, so most steps allocate nothing


class DeviceDecoder:
    ahead: int              # cache entries a step may write past r.cached
    advance: int            # the most tokens one step adds to r.cached
    with_draft: bool        # the cache holds the draft head's K/V too
    draft_layers: int = 1   # the draft's K/V layers (an MTP draft: one per head it runs)

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
    def start(self, reqs: list[Request]) -> None:
        self.reqs = reqs
        self.limit = {r.index: self.request_length(r) for r in reqs}
        self.cache = self.models.target.new_cache(
            max_requests=len(reqs) + 1, page_size=self.page_size, with_draft=self.with_draft,
            draft_layers=self.draft_layers,
            num_pages=pages_needed(list(self.limit.values()), self.page_size))
        self.pad_row = self.cache.table.alloc_row()        # owns no page: padded lanes write the sink
        for r in reqs:
            r.row = self.cache.table.alloc_row()
            self.cache.table.reserve(r.row, min(len(r.prompt) + self.ahead, self.limit[r.index]))
        self.state = self.new_state(len(reqs) + 1)
        pad = {"rows": torch.tensor(self.pad_row, dtype=torch.int64, device=self.dev)}
        self.runner = BucketGraphRunner(self.step_fn, pad, use_graphs=self.use_graphs, pad_batches=self.pad_batches)
        self._rows = None
        self.prefill(reqs)

    def take_first_tokens(self, reqs: list[Request], first: torch.Tensor, finished: torch.Tensor) -> None:
        """The prefill's readback: each request's first token and whether it already stopped."""
        for r, (t, f) in zip(reqs, self.readback.fetch(torch.stack([first, finished.long()], 1))):
            r.output.append(t)
            r.cached = len(r.prompt)
            if f:
                self.finish(r)

    # -- steps -----------------------------------------------------------------------------------
    def running(self) -> list[Request]:
        return [r for r in self.reqs if not r.finished]

    def finish(self, r: Request) -> None:
        r.finished = True
        self.cache.table.free_row(r.row)
        self._rows = None

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
