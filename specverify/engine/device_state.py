"""What a decoder keeps on the device between steps, and the one way data comes back.

`RequestState` holds, per slot-table row, everything a decode step needs to know about its
request: the cached length, the pending token, the budget, the finished flag, the request's
index, and with a sampling penalty on, its output token counts and prompt tokens
(`penalties.PenaltyState`, set by the prefill). A step reads and writes it in place, so a captured
graph replays a whole step without anything coming from the host. The pad row (padded lanes of a
graph bucket) is finished forever and owns no page: its lanes write only the sink slot.

`Readback` is the single device-to-host transfer of a step: a packed int64 tensor copied into a
pinned host buffer and waited for. Nothing else in a step reads the device.
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.engine.penalties import PenaltyState
from specverify.models import Batch, chain_mask
from specverify.models.layers import chain_offsets


@dataclasses.dataclass
class RequestState:
    seq_len: torch.Tensor       # [R] int64 tokens whose K/V are cached (the pending token's position)
    pending: torch.Tensor       # [R] int64 the last emitted token, not yet cached (the root)
    emitted: torch.Tensor       # [R] int64 tokens emitted so far
    budget: torch.Tensor        # [R] int64 max_new_tokens
    finished: torch.Tensor      # [R] bool
    req_id: torch.Tensor        # [R] int64 index in the prompt list (keys the uniforms)
    penalty: PenaltyState | None = None   # output counts and prompt tokens; only when a penalty is active

    @classmethod
    def empty(cls, rows: int, device) -> "RequestState":
        i64 = dict(dtype=torch.int64, device=device)
        return cls(torch.zeros(rows, **i64), torch.zeros(rows, **i64), torch.zeros(rows, **i64),
                   torch.zeros(rows, **i64), torch.ones(rows, dtype=torch.bool, device=device),
                   torch.zeros(rows, **i64))


def rows_tensor(rows: list[int], device: torch.device) -> torch.Tensor:
    """A batch's slot-table rows as a device tensor, sent without a host sync (pinned memory,
    asynchronous copy): made once per change of the running set, not per step."""
    host = torch.tensor(rows, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def graphs_allowed(models, wanted: bool, profile, pad_batches: bool) -> bool:
    """CUDA graphs when asked for, the profile allows them, the batch is padded and the models
    are on a GPU. float64 compute takes the torch attention path, which reads the longest live
    length back, so it runs eagerly (a precision mode for the tests, not a fast one)."""
    return (wanted and profile.cuda_graphs and models.device.type == "cuda" and pad_batches
            and models.target.dtype != torch.float64)


def extend_batch(rows: torch.Tensor, kv_lens: torch.Tensor, tokens: torch.Tensor, q_lens: torch.Tensor,
                 req_ids: torch.Tensor, positions: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> Batch:
    """A chain of q_lens[b] new tokens per lane appended after kv_lens[b] cached ones, token j at
    position kv_lens[b] + j unless `positions` [bs, q] says otherwise (a draft-extend's, 6.18);
    slots: their cache slots when the caller read them already (the draft plan's)."""
    bs, q = tokens.shape
    mask, parents = chain_mask(bs, q, tokens.device)
    if positions is None:
        positions = kv_lens[:, None] + chain_offsets(q, tokens.device)[None, :]
    return Batch(tokens, positions, rows, kv_lens, q_lens, mask, parents, req_ids=req_ids, slots=slots)


class Readback:
    """The one device-to-host copy of a step (`count` says how many were made)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.count = 0
        self._event = torch.cuda.Event() if device.type == "cuda" else None

    def fetch(self, packed: torch.Tensor) -> list[list[int]]:
        self.count += 1
        if self._event is None:
            return packed.tolist()
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        self._event.record()
        # The step's designated wait: a sync debug mode set by the caller covers everything else.
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            self._event.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        return host.tolist()
