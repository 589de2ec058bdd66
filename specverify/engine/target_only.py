"""Target-only decoding on the device: one prefill, then one decode step per token.

A step is one tensor function of the running rows: the target's forward over each request's
pending token, the token choice (greedy, or sampled with u(seed, r, position, 0); penalized by the
request's prompt and output counts when a sampling penalty is on), the EOS / max_new_tokens cut
and the state update. On CUDA it is captured as one graph per batch-size bucket; elsewhere it runs
eagerly at live shapes. The host makes one readback per step (the new tokens and finished flags),
reserves the next step's pages in bulk while the device runs this one, and frees a finished
request's row.
"""

from __future__ import annotations

import torch

from specverify.engine.device_decoder import DeviceDecoder
from specverify.engine.device_state import RequestState, extend_batch
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.prefill import prefill
from specverify.engine.requests import Request
from specverify.engine.sampling import SamplingParams, choose_tokens
from specverify.engine.spec_config import cache_entries
from specverify.engine.uniforms import counter_uniforms
from specverify.models import Models
from specverify.ops import emit_tokens


class TargetOnlyDecoder(DeviceDecoder):
    ahead = 1               # a step writes the pending token at index r.cached
    advance = 1             # and emits one token
    with_draft = False

    def __init__(self, models: Models, params: SamplingParams, *, seed: int, eos_token_id: int | None,
                 channel: LogprobChannel | None = None, page_size: int = 1, platform=None,
                 cuda_graph: bool = True, pad_batches: bool | None = None):
        super().__init__(models, params, seed=seed, eos_token_id=eos_token_id, channel=channel, page_size=page_size,
                         platform=platform, cuda_graph=cuda_graph, pad_batches=pad_batches)

    def request_length(self, r: Request) -> int:
        return cache_entries(None, len(r.prompt), r.max_new_tokens)

    def new_state(self, rows: int) -> RequestState:
        return RequestState.empty(rows, self.dev)

    def prefill(self, reqs: list[Request]) -> None:
        _, _, first, finished = prefill(self.models, self.cache, self.state, reqs, self.params, seed=self.seed,
                                        eos_token_id=self.eos, channel=self.channel)
        self.take_first_tokens(reqs, first, finished)

    def step(self) -> None:
        reqs = self.running()
        if not reqs:
            return
        lanes, out = self.run_step(reqs)
        if self.channel is not None:
            self.channel.send([r.index for r in reqs], [1] * len(reqs), out["logits"], out["scale"], out["tokens"])
        for r, (t, _, f) in zip(reqs, lanes):
            r.output.append(t)
            r.cached += 1
            if f:
                self.finish(r)

    def step_fn(self, inp: dict) -> dict:
        """One decode step of the lanes `rows` as a pure tensor function (no host reads)."""
        st, rows = self.state, inp["rows"]
        done = st.finished[rows]
        n = st.seq_len[rows]
        tokens = st.pending[rows][:, None]
        batch = extend_batch(rows, n, tokens, (~done).long(), st.req_id[rows])
        out = self.models.target.forward(self.cache, batch)
        logits, scale = out.logits[:, 0], out.scale[:, 0]
        u = None if self.params.greedy else counter_uniforms(self.seed, batch.req_ids, n, torch.zeros_like(n))
        penalty = None if st.penalty is None else st.penalty.context(rows)
        token = choose_tokens(logits, scale, self.params, u, penalty)
        if st.penalty is not None:
            st.penalty.record(rows, token[:, None], (~done).long())
        # The cut and the state update in one op: per lane (token or -1, taken, finished).
        head, _, _ = emit_tokens(produced=token[:, None], count=torch.ones_like(token), rows=rows, seq_len=st.seq_len,
                                 pending=st.pending, emitted=st.emitted, budget=st.budget, finished=st.finished,
                                 eos_token_id=self.eos, checked=False)
        out_dict = {"packed": head}
        if self.channel is not None:
            out_dict.update(logits=logits, scale=scale, tokens=token)
        return out_dict
