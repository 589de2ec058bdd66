"""The speculative decoder's host loop: prefill, then one captured cycle per step.

The host's work per cycle: reserve pages ahead for the running requests (queued table edits, one
transfer), replay the cycle (`engine/eagle_cycle.py`) on the running rows, copy the packed
result back once, and append the emitted tokens. A finished or aborted request's row and pages
go back to the pool from that readback.
"""

from __future__ import annotations

import os

import torch

from specverify.engine.device_state import Readback, graphs_allowed, rows_tensor
from specverify.engine.eagle_cycle import EagleCycle, EagleState
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.prefill import prefill
from specverify.engine.requests import CycleTrace, Request, pages_needed
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.kernels.cuda_graph import BucketGraphRunner
from specverify.models import Models
from specverify.platform import PlatformProfile, resolve
from specverify.protocol.message import PREEMPTED

DEBUG_CHECKS_ENV = "SPECVERIFY_DEBUG_CHECKS"    # "1": value checks of the tree / verify kernels every cycle


class SpecDecoder:
    """Runs speculative cycles over a batch of requests; requests may finish or be aborted."""

    traces: list[list[CycleTrace]] | None = None   # per request index; set to record (trace=True)

    def __init__(self, models: Models, config: SpecConfig, params: SamplingParams, *, seed: int,
                 eos_token_id: int | None, channel: LogprobChannel | None = None,
                 platform: PlatformProfile | None = None, pad_batches: bool | None = None,
                 debug_checks: bool | None = None):
        """pad_batches: run cycles at bucket shapes (None = on CUDA only; True on the CPU tests the
        padded path). Graphs are used on CUDA when config.cuda_graph and the platform allow.
        debug_checks: validate the kernels' internal tensors every cycle (reads the device;
        default from SPECVERIFY_DEBUG_CHECKS)."""
        self.models, self.config, self.params, self.seed = models, config, params, seed
        self.eos, self.channel = eos_token_id, channel
        self.profile = resolve(platform)
        self.k, self.S, self.D = config.topk, config.num_steps, config.draft_tokens
        # Cache entries a cycle may write past n: the verify's D nodes, or the draft-extend of up to
        # S + 1 tokens followed by (S - 1) * k beams.
        self.ahead = max(self.D, self.S + 1 + (self.S - 1) * self.k)
        self.dev = models.device
        self.pad_batches = self.dev.type == "cuda" if pad_batches is None else pad_batches
        self.use_graphs = graphs_allowed(models, config.cuda_graph, self.profile, self.pad_batches)
        self.debug_checks = os.environ.get(DEBUG_CHECKS_ENV) == "1" if debug_checks is None else debug_checks
        self.readback = Readback(self.dev)

    # -- set-up -------------------------------------------------------------------------------
    def start(self, reqs: list[Request]) -> None:
        self.reqs = reqs
        region = max(self.D, (self.S - 1) * self.k)
        self.limit = {r.index: len(r.prompt) + r.max_new_tokens + region + 1 for r in reqs}
        self.cache = self.models.target.new_cache(
            max_requests=len(reqs) + 1, page_size=self.config.page_size,
            num_pages=pages_needed(list(self.limit.values()), self.config.page_size))
        self.pad_row = self.cache.table.alloc_row()        # owns no page: padded lanes write the sink
        for r in reqs:
            r.row = self.cache.table.alloc_row()
            self.cache.table.reserve(r.row, min(len(r.prompt) + self.ahead, self.limit[r.index]))
        self.state = EagleState.empty(len(reqs) + 1, self.config, self.dev)
        self.cycle = EagleCycle(self.models, self.cache, self.state, self.config, self.params, seed=self.seed,
                                eos_token_id=self.eos, profile=self.profile, with_logits=self.channel is not None,
                                checked=self.debug_checks)
        pad = {"rows": torch.tensor(self.pad_row, dtype=torch.int64, device=self.dev)}
        self.runner = BucketGraphRunner(self.cycle, pad, use_graphs=self.use_graphs, pad_batches=self.pad_batches)
        self._rows = None
        self._prefill(reqs)

    def _prefill(self, reqs: list[Request]) -> None:
        out, batch, first, finished = prefill(self.models, self.cache, self.state.requests, reqs, self.params,
                                              seed=self.seed, eos_token_id=self.eos, channel=self.channel)
        # Draft-extend over x_1..x_P (the prompt without its first token, then the first token),
        # paired with the target features h_0..h_{P-1}.
        ar = torch.arange(len(reqs), device=self.dev)
        tokens = torch.cat([batch.input_ids[:, 1:], torch.zeros_like(batch.input_ids[:, :1])], 1)
        tokens[ar, batch.q_lens - 1] = first
        self.cycle.draft(batch.rows, tokens, batch.q_lens, out.hidden, torch.zeros_like(batch.q_lens),
                         batch.req_ids, ~finished)
        for r, (t, f) in zip(reqs, self.readback.fetch(torch.stack([first, finished.long()], 1))):
            r.output.append(t)
            r.cached = len(r.prompt)
            if f:
                self._finish(r)

    def running(self) -> list[Request]:
        return [r for r in self.reqs if not r.finished]

    def _finish(self, r: Request) -> None:
        r.finished = True
        self.cache.table.free_row(r.row)
        self._rows = None

    def abort(self, r: Request) -> None:
        """Stop a request now; its pages go back to the pool at once, and the logprob stream
        reports it preempted."""
        if not r.finished:
            self.state.requests.finished[r.row] = True
            self._finish(r)
            if self.channel is not None:
                self.channel.signal(r.index, PREEMPTED)

    # -- one cycle -------------------------------------------------------------------------------
    def step(self) -> None:
        """One speculative cycle over the running requests."""
        reqs = self.running()
        if not reqs:
            return
        table = self.cache.table
        for r in reqs:
            if table.capacity(r.row) < min(r.cached + self.ahead, self.limit[r.index]):
                table.reserve(r.row, min(r.cached + 2 * self.ahead, self.limit[r.index]))
        table.flush()
        if self._rows is None:
            self._rows = rows_tensor([r.row for r in reqs], self.dev)
        out = self.runner.run({"rows": self._rows})
        lanes = self.readback.fetch(out["packed"])
        w, d = self.S + 1, self.D
        taken = [lane[w] for lane in lanes]
        if self.channel is not None:
            self._send_logprobs(reqs, lanes, taken, out)
        for r, lane, n in zip(reqs, lanes, taken):
            if n < 1:
                raise RuntimeError(f"cycle emitted no token for running request {r.index} (row {r.row}): "
                                   "the lane read another row's state")
            emitted = lane[:n]
            r.output.extend(emitted)
            r.accept_lengths.append(n)
            r.cached += n
            if self.traces is not None:
                base = w + 2
                self.traces[r.index].append(CycleTrace(lane[base:base + d], lane[base + d:base + 2 * d],
                                                       lane[base + 2 * d:], emitted))
            if lane[w + 1]:
                self._finish(r)

    def _send_logprobs(self, reqs, lanes, taken, out) -> None:
        """Row j of a lane's accepted nodes predicts its emitted token j: one message row each."""
        b = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor(taken)).to(self.dev)
        j = torch.cat([torch.arange(n) for n in taken]).to(self.dev)
        tokens = torch.tensor([t for lane, n in zip(lanes, taken) for t in lane[:n]], device=self.dev)
        self.channel.send([r.index for r in reqs], taken, out["logits"][b, j], out["scale"][b, j], tokens)


def generate_speculative(models: Models, reqs: list[Request], spec: SpecConfig, params: SamplingParams, *,
                         seed: int, eos_token_id, channel: LogprobChannel | None, platform=None,
                         trace: bool = False) -> list[list[CycleTrace]] | None:
    """Speculative decoding of `reqs` (outputs and accept lengths land on the requests); returns
    the per-request traces when `trace`."""
    decoder = SpecDecoder(models, spec, params, seed=seed, eos_token_id=eos_token_id, channel=channel,
                          platform=platform)
    if trace:
        decoder.traces = [[] for _ in reqs]
    decoder.start(reqs)
    while decoder.running():
        decoder.step()
    return decoder.traces
