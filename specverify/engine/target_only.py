"""Target-only decoding on the device: one prefill, then one decode step per token.

A step is one tensor function of the running rows: the target's forward over each request's
pending token, the token choice (greedy, or sampled with u(seed, r, position, 0)), the EOS /
max_new_tokens cut and the state update. On CUDA it is captured as one graph per batch-size
bucket; elsewhere it runs eagerly at live shapes. The host makes one readback per step (the new
tokens and finished flags), reserves pages ahead in bulk and frees a finished request's row.
"""

from __future__ import annotations

import torch

from specverify.engine.device_state import (Readback, RequestState, extend_batch, graphs_allowed, rows_tensor,
                                            stop_mask)
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.prefill import prefill
from specverify.engine.requests import Request, pages_needed
from specverify.engine.sampling import SamplingParams, choose_tokens
from specverify.engine.uniforms import counter_uniforms
from specverify.kernels.cuda_graph import BucketGraphRunner
from specverify.models import Models
from specverify.platform import resolve

RESERVE_AHEAD = 16      # cache entries reserved past a request's next write, so most steps allocate nothing


class TargetOnlyDecoder:
    def __init__(self, models: Models, params: SamplingParams, *, seed: int, eos_token_id: int | None,
                 channel: LogprobChannel | None = None, page_size: int = 1, platform=None,
                 cuda_graph: bool = True, pad_batches: bool | None = None):
        """pad_batches: run steps at bucket shapes (None = on CUDA only; True on the CPU tests the
        padded path). Graphs are used on CUDA when cuda_graph and the platform allow them."""
        self.models, self.params, self.seed = models, params, seed
        self.eos, self.channel, self.page_size = eos_token_id, channel, page_size
        self.profile = resolve(platform)
        self.dev = models.device
        self.pad_batches = self.dev.type == "cuda" if pad_batches is None else pad_batches
        self.use_graphs = graphs_allowed(models, cuda_graph, self.profile, self.pad_batches)
        self.readback = Readback(self.dev)

    def start(self, reqs: list[Request]) -> None:
        self.reqs = reqs
        self.limit = {r.index: len(r.prompt) + r.max_new_tokens for r in reqs}
        self.cache = self.models.target.new_cache(
            max_requests=len(reqs) + 1, page_size=self.page_size, with_draft=False,
            num_pages=pages_needed(list(self.limit.values()), self.page_size))
        self.pad_row = self.cache.table.alloc_row()        # owns no page: padded lanes write the sink
        for r in reqs:
            r.row = self.cache.table.alloc_row()
            self.cache.table.reserve(r.row, len(r.prompt))
        self.state = RequestState.empty(len(reqs) + 1, self.dev)
        pad = {"rows": torch.tensor(self.pad_row, dtype=torch.int64, device=self.dev)}
        self.runner = BucketGraphRunner(self._decode_fn, pad, use_graphs=self.use_graphs,
                                        pad_batches=self.pad_batches)
        _, _, first, finished = prefill(self.models, self.cache, self.state, reqs, self.params, seed=self.seed,
                                        eos_token_id=self.eos, channel=self.channel)
        for r, (t, f) in zip(reqs, self.readback.fetch(torch.stack([first, finished.long()], 1))):
            r.output.append(t)
            r.cached = len(r.prompt)
            self._finish_if(r, bool(f))
        self._rows = None

    def running(self) -> list[Request]:
        return [r for r in self.reqs if not r.finished]

    def _finish_if(self, r: Request, finished: bool) -> None:
        if finished:
            r.finished = True
            self.cache.table.free_row(r.row)

    def step(self) -> None:
        reqs = self.running()
        if not reqs:
            return
        table = self.cache.table
        for r in reqs:                                      # the step writes cache index r.cached
            if table.capacity(r.row) <= r.cached:
                table.reserve(r.row, min(r.cached + 1 + RESERVE_AHEAD, self.limit[r.index]))
        table.flush()
        if self._rows is None or len(self._rows[0]) != len(reqs):
            self._rows = ([r.row for r in reqs], rows_tensor([r.row for r in reqs], self.dev))
        out = self.runner.run({"rows": self._rows[1]})
        lanes = self.readback.fetch(out["packed"])
        if self.channel is not None:
            self.channel.send([r.index for r in reqs], [1] * len(reqs), out["logits"], out["scale"], out["tokens"])
        for r, (t, f) in zip(reqs, lanes):
            r.output.append(t)
            r.cached += 1
            self._finish_if(r, bool(f))
        if any(r.finished for r in reqs):
            self._rows = None

    def _decode_fn(self, inp: dict) -> dict:
        """One decode step of the lanes `rows` as a pure tensor function (no host reads)."""
        st, rows = self.state, inp["rows"]
        done = st.finished[rows]
        n = st.seq_len[rows]
        tokens = st.pending[rows][:, None]
        batch = extend_batch(rows, n, tokens, (~done).long(), st.req_id[rows])
        out = self.models.target.forward(self.cache, batch)
        logits, scale = out.logits[:, 0], out.scale[:, 0]
        u = None if self.params.greedy else counter_uniforms(self.seed, batch.req_ids, n, torch.zeros_like(n))
        token = choose_tokens(logits, scale, self.params, u)
        emitted = st.emitted[rows]
        _, stop = stop_mask(token[:, None], torch.ones_like(token), st.budget[rows] - emitted, self.eos)
        live = ~done
        st.seq_len[rows] = torch.where(live, n + 1, n)
        st.pending[rows] = torch.where(live, token, st.pending[rows])
        st.emitted[rows] = emitted + live.long()
        st.finished[rows] = done | stop
        out_dict = {"packed": torch.stack([token, (done | stop).long()], 1)}
        if self.channel is not None:
            out_dict.update(logits=logits, scale=scale, tokens=token)
        return out_dict


def generate_target_only(models: Models, reqs: list[Request], params: SamplingParams, *, seed: int,
                         eos_token_id: int | None, channel: LogprobChannel | None, page_size: int,
                         platform=None) -> None:
    decoder = TargetOnlyDecoder(models, params, seed=seed, eos_token_id=eos_token_id, channel=channel,
                                page_size=page_size, platform=platform)
    decoder.start(reqs)
    while decoder.running():
        decoder.step()
