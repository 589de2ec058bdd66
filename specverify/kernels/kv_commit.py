"""The K/V commit after a tree verify (docs/semantics.md 6.16), in one kernel.

A verify writes its D tree nodes' K/V at cache indices [n, n + D) of each request's row; the
accepted path (node accept[j] at depth j, -1 after the path) must then sit at [n, n + j]: node
accept[j]'s K/V moves to index n + j, in every layer. A path never moves a node up (accept[j] >= j:
a node at depth j sits at tree position j or later), so the moves done in ascending j never read
a slot an earlier move wrote (a later move may only write a slot an earlier one read: the same
thread holds each element across the moves, so program order keeps the read first), and a move
with accept[j] == j (every move of a chain) is no move at all. A live move never touches the sink
slot (`ops.commit_accepted_kv` checks), so the torch path's no-ops, sink onto sink, never meet one.

The torch path is the gather / where / flatten and the one gather + one scatter over every layer a
cycle used to run (about fifteen kernels on a GPU); the Triton kernel is one launch, one program per
(lane, K or V plane of a layer), which copies only the nodes that move.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl

MAX_BLOCK = 256        # elements of one slot's (heads x head_dim) copied per inner step


def _commit_kv_torch(kv, req_to_token, rows, seq_lens, accept, live, sink):
    last_cell = req_to_token.shape[1] - 1
    j = torch.arange(accept.shape[1], device=accept.device)[None, :]
    keep = (accept >= 0) & live[:, None]
    src = req_to_token[rows[:, None], (seq_lens[:, None] + accept.clamp(min=0)).clamp(max=last_cell)]
    dst = req_to_token[rows[:, None], (seq_lens[:, None] + j).clamp(max=last_cell)]
    src, dst = torch.where(keep, src, sink).flatten(), torch.where(keep, dst, sink).flatten()   # the rest: sink to sink
    kv[:, dst] = kv[:, src]           # every source read before any destination is written
    return kv


@triton.jit
def _commit_kv_kernel(kv_ptr, table_ptr, rows_ptr, seq_ptr, acc_ptr, live_ptr, last_cell,
                      s_kv0, s_kv1, s_t0, s_t1, s_r, s_s, s_a0, s_a1, s_l,
                      W: tl.constexpr, ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    plane = kv_ptr + tl.program_id(1).to(tl.int64) * s_kv0
    live = tl.load(live_ptr + b * s_l) != 0
    row = tl.load(rows_ptr + b * s_r).to(tl.int64)
    n = tl.load(seq_ptr + b * s_s).to(tl.int64)
    e = tl.arange(0, BLOCK)
    for j in range(W):
        a = tl.load(acc_ptr + b * s_a0 + j * s_a1).to(tl.int64)
        if live & (a >= 0) & (a != j):
            src = tl.load(table_ptr + row * s_t0 + tl.minimum(n + a, last_cell) * s_t1).to(tl.int64)
            dst = tl.load(table_ptr + row * s_t0 + tl.minimum(n + j, last_cell) * s_t1).to(tl.int64)
            for off in range(0, ELEMS, BLOCK):
                m = off + e < ELEMS
                x = tl.load(plane + src * s_kv1 + off + e, mask=m, other=0.0)
                tl.store(plane + dst * s_kv1 + off + e, x, mask=m)


def commit_kv_impl(kv: torch.Tensor, req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                   accept: torch.Tensor, live: torch.Tensor, sink: int, impl: str = "auto") -> torch.Tensor:
    """kv [P, slots, heads, head_dim], moved in place and returned (no argument checks:
    `ops.commit_accepted_kv` checks)."""
    if pick_impl(impl, kv.device) == "torch":
        return _commit_kv_torch(kv, req_to_token, rows, seq_lens, accept, live, sink)
    check_launchable(_commit_kv_kernel, kv.device)
    bs, w = accept.shape
    if bs == 0 or w == 0 or kv.shape[0] == 0:
        return kv
    elems = kv.shape[2] * kv.shape[3]
    block = min(max(triton.next_power_of_2(elems), 16), MAX_BLOCK)
    _commit_kv_kernel[(bs, kv.shape[0])](
        kv, req_to_token, rows, seq_lens, accept, live.view(torch.int8), req_to_token.shape[1] - 1,
        kv.stride(0), kv.stride(1), *req_to_token.stride(), rows.stride(0), seq_lens.stride(0), *accept.stride(),
        live.stride(0), W=w, ELEMS=elems, BLOCK=block, num_warps=2 if block >= 256 else 1)
    return kv
