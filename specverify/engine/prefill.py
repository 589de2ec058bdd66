"""The prefill step every decoder starts with: the target runs each prompt, the first token of
each request is chosen (greedy, or sampled with the uniform u(seed, r, P - 1, 0); with a sampling
penalty on, from the logits penalized over the prompt), and the request state rows are written
(with a penalty on, the penalty state too, allocated on first use). Runs eagerly at live shapes
(prefills are not graph-captured); its inputs are built from the prompts on the host once."""

from __future__ import annotations

import torch

from specverify.engine.device_state import RequestState, extend_batch
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.penalties import PenaltyState
from specverify.engine.requests import Request
from specverify.engine.sampling import SamplingParams, choose_tokens
from specverify.engine.state_commit import commit_recurrent_states
from specverify.engine.uniforms import counter_uniforms
from specverify.kernels.emit import stop_mask
from specverify.models import ModelCache, Models


def prefill(models: Models, cache: ModelCache, state: RequestState, reqs: list[Request], params: SamplingParams, *,
            seed: int, eos_token_id: int | None, channel: LogprobChannel | None, track_interval: int | None = None):
    """Run the prompts of `reqs` (rows already reserved); write their state rows. With a
    `track_interval`, each request's tracking slot gets the recurrent state after the last multiple
    of the interval within its prompt (nothing when the prompt is shorter than the interval).

    Returns (target forward output, the batch, first tokens [bs] on the device, finished [bs])."""
    dev = models.device
    bs, width = len(reqs), max(len(r.prompt) for r in reqs)
    ids = torch.zeros((bs, width), dtype=torch.int64)
    for b, r in enumerate(reqs):
        ids[b, :len(r.prompt)] = torch.tensor(r.prompt, dtype=torch.int64)
    host = torch.tensor([[r.row, len(r.prompt), r.max_new_tokens, r.index] for r in reqs], dtype=torch.int64)
    ids, host = ids.to(dev), host.to(dev)
    rows, q_lens, budget, req_ids = (column.contiguous() for column in host.unbind(1))
    batch = extend_batch(rows, torch.zeros_like(rows), ids, q_lens, req_ids)
    out = models.target.forward(cache, batch)
    if track_interval is not None:
        commit_recurrent_states(states=cache.states, recurrent=out.rec_states, conv=out.conv_states,
                                rows=cache.states.tracking_slot(rows), steps=q_lens // track_interval * track_interval - 1)
    ar = torch.arange(bs, device=dev)
    last = q_lens - 1
    logits, scale = out.logits[ar, last], out.scale[ar, last]
    u = None if params.greedy else counter_uniforms(seed, req_ids, last, torch.zeros_like(last))
    penalty = None
    if params.penalized:
        if state.penalty is None:
            state.penalty = PenaltyState.empty(state.seq_len.shape[0], models.config.vocab_size, dev)
        state.penalty.start(rows, ids, q_lens)
        penalty = state.penalty.context(rows)          # the prompt's tokens; no output yet
    first = choose_tokens(logits, scale, params, u, penalty)
    one = torch.ones_like(first)
    if penalty is not None:
        state.penalty.record(rows, first[:, None], one)  # the first token is output from here on
    _, finished = stop_mask(first[:, None], one, budget, eos_token_id)
    if channel is not None:
        channel.send([r.index for r in reqs], [1] * bs, logits, scale, first)
    state.seq_len[rows] = q_lens
    state.pending[rows] = first
    state.emitted[rows] = one
    state.budget[rows] = budget
    state.finished[rows] = finished
    state.req_id[rows] = req_ids
    return out, batch, first, finished
