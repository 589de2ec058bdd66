"""The speculative decoder's host loop: prefill, then one captured cycle per step.

The host's work per cycle: replay the cycle (`engine/eagle_cycle.py`, `engine/naive_cycle.py`, or
`engine/block_drafts.py` for the MTP and DFlash chains) on
the running rows, reserve the next cycle's pages while the device runs it (queued table edits,
one transfer), copy the packed result back once, and append the emitted tokens. A finished or aborted request's row and pages
go back to the pool from that readback.
"""

from __future__ import annotations

import os

import torch

from specverify.engine.block_drafts import DFlashCycle, MtpCycle
from specverify.engine.device_decoder import DeviceDecoder
from specverify.engine.eagle_cycle import EagleCycle, EagleState
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.naive_cycle import NaiveCycle, NaiveState
from specverify.engine.prefill import prefill
from specverify.engine.requests import CycleTrace, Request
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig, cache_entries
from specverify.models import Models
from specverify.platform import PlatformProfile

DEBUG_CHECKS_ENV = "SPECVERIFY_DEBUG_CHECKS"    # "1": value checks of the tree / verify kernels every cycle


CYCLES = {"eagle": EagleCycle, "mtp": MtpCycle, "dflash": DFlashCycle}   # the tree / chain cycles


def check_draft_models(models: Models, config: SpecConfig) -> None:
    """The models carry the draft the algorithm runs: MTP one head per draft step (num_steps at
    most models.config.mtp_heads), DFlash its block head."""
    if config.algorithm == "mtp":
        heads = models.config.mtp_heads
        if config.num_steps > heads:
            raise ValueError(f"SpecConfig.num_steps={config.num_steps} exceeds the models' mtp_heads={heads}: "
                             f"mtp runs one head per draft step, so num_steps must be <= mtp_heads")
        if len(models.mtp) < config.num_steps:
            raise ValueError(f"models.mtp holds {len(models.mtp)} heads; mtp with num_steps={config.num_steps} "
                             f"needs one per draft step")
    elif config.algorithm == "dflash" and models.dflash is None:
        raise ValueError("models.dflash is None: algorithm='dflash' needs the DFlash block head")


class SpecDecoder(DeviceDecoder):
    """Runs speculative cycles over a batch of requests; requests may finish or be aborted."""

    with_draft = True

    def __init__(self, models: Models, config: SpecConfig, params: SamplingParams, *, seed: int,
                 eos_token_id: int | None, channel: LogprobChannel | None = None,
                 platform: PlatformProfile | None = None, pad_batches: bool | None = None,
                 debug_checks: bool | None = None, fused: bool = True):
        """pad_batches: run cycles at bucket shapes (None = on CUDA only; True on the CPU tests the
        padded path). Graphs are used on CUDA when config.cuda_graph and the platform allow.
        debug_checks: validate the kernels' internal tensors every cycle (reads the device;
        default from SPECVERIFY_DEBUG_CHECKS).
        fused: naive EAGLE only; False runs its verify and draft-extend as two steps with the
        accept counts read back in between (the unfused form the fused cycle must equal)."""
        super().__init__(models, params, seed=seed, eos_token_id=eos_token_id, channel=channel,
                         page_size=config.page_size, platform=platform, cuda_graph=config.cuda_graph,
                         pad_batches=pad_batches)
        self.config = config
        self.k, self.S, self.D = config.topk, config.num_steps, config.draft_tokens
        check_draft_models(models, config)
        if config.algorithm == "mtp":
            self.draft_layers = max(1, self.S)     # head j writes its own K/V layer j
        # Cache entries a cycle may write past n: the verify's D nodes, or the draft-extend of up to
        # S + 1 tokens followed by what the draft writes past its prefix (EAGLE's (S - 1) * k beams,
        # MTP's step rows at the prefix index, DFlash's S block rows).
        self.ahead = max(self.D, self.S + 1 + config.draft_reach)
        self.advance = self.S + 1              # a cycle emits at most S + 1 tokens
        self.debug_checks = os.environ.get(DEBUG_CHECKS_ENV) == "1" if debug_checks is None else debug_checks
        self.naive = config.algorithm == "naive_eagle"
        self.fused = fused
        if not fused and not self.naive:
            raise ValueError("fused=False applies to algorithm='naive_eagle' only")
        if not fused:
            self.use_graphs = False            # the unfused form reads the device back mid-cycle

    def request_length(self, r: Request) -> int:
        return cache_entries(self.config, len(r.prompt), r.max_new_tokens)

    def new_state(self, rows: int) -> EagleState | NaiveState:
        if self.naive:
            keep_q = not self.params.greedy and self.config.naive_sampling == "exact"
            return NaiveState.empty(rows, self.models.config.vocab_size, keep_q, self.dev)
        return EagleState.empty(rows, self.config, self.dev)

    def step_fn(self, inp: dict) -> dict:
        return self.cycle(inp)

    @property
    def request_state(self):
        return self.state.requests

    def setup(self) -> None:
        # The cycle over the opened cache and state (the runner calls it through step_fn).
        if self.naive:
            self.cycle = NaiveCycle(self.models, self.cache, self.state, self.config, self.params, seed=self.seed,
                                    eos_token_id=self.eos, profile=self.profile,
                                    with_logits=self.channel is not None, fused=self.fused)
        else:
            cycle = CYCLES[self.config.algorithm]
            self.cycle = cycle(self.models, self.cache, self.state, self.config, self.params, seed=self.seed,
                               eos_token_id=self.eos, profile=self.profile,
                               with_logits=self.channel is not None, checked=self.debug_checks)

    def prepare_rows(self, reqs: list[Request]) -> None:
        # A prompt shorter than the tracking interval tracks nothing at its prefill: its tracking
        # slots must read zeros, not the previous owner's tracked state.
        if self.config.state_track_interval is not None:
            rows = torch.tensor([r.row for r in reqs], dtype=torch.int64).to(self.dev)
            self.cache.states.clear_tracking(rows)

    def prefill(self, reqs: list[Request]) -> None:
        out, batch, first, finished = prefill(self.models, self.cache, self.state.requests, reqs, self.params,
                                              seed=self.seed, eos_token_id=self.eos, channel=self.channel,
                                              track_interval=self.config.state_track_interval)
        # Draft-extend over x_1..x_P (the prompt without its first token, then the first token),
        # paired with the target features h_0..h_{P-1}.
        ar = torch.arange(len(reqs), device=self.dev)
        tokens = torch.cat([batch.input_ids[:, 1:], torch.zeros_like(batch.input_ids[:, :1])], 1)
        tokens[ar, batch.q_lens - 1] = first
        draft_args = (batch.rows, tokens, batch.q_lens, out.hidden, torch.zeros_like(batch.q_lens), batch.req_ids)
        if self.naive:
            self.cycle.draft(*draft_args, finished, batch.q_lens - 1)    # the next draft from the last row
        else:
            self.cycle.draft(*draft_args, finished)
        self.take_first_tokens(reqs, first, finished)

    # -- one cycle -------------------------------------------------------------------------------
    def step(self) -> None:
        """One speculative cycle over the running requests."""
        reqs = self.running()
        if not reqs:
            return
        lanes, out = self.run_step(reqs)
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
                self.finish(r)

    def _send_logprobs(self, reqs, lanes, taken, out) -> None:
        """Row j of a lane's accepted nodes predicts its emitted token j: one message row each."""
        b = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor(taken)).to(self.dev)
        j = torch.cat([torch.arange(n) for n in taken]).to(self.dev)
        tokens = torch.tensor([t for lane, n in zip(lanes, taken) for t in lane[:n]], device=self.dev)
        self.channel.send([r.index for r in reqs], taken, out["logits"][b, j], out["scale"][b, j], tokens)
