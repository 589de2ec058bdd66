"""The rows a chain cycle verifies (docs/semantics.md 6.19): each lane's request state and draft
chain read from its row, in one kernel.

A chain cycle (EAGLE with topk 1, MTP, DFlash) verifies, on lane b with row r = rows[b], the tree
root -> draft 0 -> ... -> draft S-1: tokens [pending[r], drafts[r, 0..S-1]] at positions
seq_len[r] + j, all D = S + 1 of them live unless the row is finished. The tree's other fields
(parents, mask, sibling links) are the same for every lane (`kernels.tree.chain_tree`).

Given the slot table, the same kernel reads the cache slots the verify's nodes write (6.14's rule:
node j at cache index seq_len[r] + j of table row r, clamped to the row; a finished row's, the
sink), so the verify forward plans none of its own.

The torch path is the gather / not / concatenate / add / where sequence the cycle ran (about ten
kernels on a GPU, every cycle); the Triton kernel is one launch of one program per lane.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl
from specverify.kernels.token_slots import token_slots_torch


class ChainRows(NamedTuple):
    """Per lane, contiguous, on the inputs' device."""
    tokens: torch.Tensor      # [bs, D] int64: the root (the row's pending token), then its S drafts
    positions: torch.Tensor   # [bs, D] int64: seq_len + j
    seq_lens: torch.Tensor    # [bs] int64: the row's cached length (the root's position)
    req_ids: torch.Tensor     # [bs] int64: the row's request id
    live: torch.Tensor        # [bs] bool: the row is not finished
    q_lens: torch.Tensor      # [bs] int64: D on a live lane, 0 on a finished one
    slots: torch.Tensor | None = None   # [bs, D] int64 the nodes' cache slots (given the slot table)


def _chain_verify_rows_torch(rows, seq_len, pending, finished, req_id, drafts, table) -> ChainRows:
    d = drafts.shape[1] + 1
    live = ~finished[rows]
    n = seq_len[rows]
    tokens = torch.cat([pending[rows][:, None], drafts[rows]], 1)
    positions = n[:, None] + torch.arange(d, device=rows.device)[None, :]
    q_lens = torch.where(live, d, 0)
    chain = ChainRows(tokens, positions, n, req_id[rows], live, q_lens)
    if table is None:
        return chain
    req_to_token, sink = table
    return chain._replace(slots=token_slots_torch(req_to_token, rows, n, q_lens, d, 0, sink))


@triton.jit
def _chain_verify_rows_kernel(rows_ptr, seq_ptr, pend_ptr, fin_ptr, rid_ptr, drafts_ptr,
                              tok_out, pos_out, n_out, rid_out, live_out, q_out, d,
                              s_rows, s_seq, s_pend, s_fin, s_rid, s_d0, s_d1,
                              table_ptr, slots_out, last_cell, sink, s_t0, s_t1,
                              BLOCK_D: tl.constexpr, SLOTS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = tl.load(rows_ptr + b * s_rows).to(tl.int64)
    n = tl.load(seq_ptr + r * s_seq)
    live = tl.load(fin_ptr + r * s_fin) == 0
    j = tl.arange(0, BLOCK_D)
    # Node j >= 1 is draft j - 1 of the row; node 0 the pending root.
    draft = tl.load(drafts_ptr + r * s_d0 + (j - 1) * s_d1, mask=(j >= 1) & (j < d), other=0)
    token = tl.where(j == 0, tl.load(pend_ptr + r * s_pend), draft)
    tl.store(tok_out + b * d + j, token, mask=j < d)
    tl.store(pos_out + b * d + j, n + j, mask=j < d)
    tl.store(n_out + b, n)
    tl.store(rid_out + b, tl.load(rid_ptr + r * s_rid))
    tl.store(live_out + b, live)
    q = tl.where(live, d, 0).to(tl.int64)
    tl.store(q_out + b, q)
    if SLOTS:
        # 6.14: node j at cache index n + j of the lane's row, clamped to the row; none on a finished one.
        runs = j < q
        slot = tl.load(table_ptr + r * s_t0 + tl.minimum(n + j, last_cell) * s_t1, mask=runs, other=sink)
        tl.store(slots_out + b * d + j, tl.where(runs, slot, sink).to(tl.int64), mask=j < d)


def chain_verify_rows_impl(rows: torch.Tensor, seq_len: torch.Tensor, pending: torch.Tensor, finished: torch.Tensor,
                           req_id: torch.Tensor, drafts: torch.Tensor, table: tuple[torch.Tensor, int] | None = None,
                           impl: str = "auto") -> ChainRows:
    """The chain verify's per-lane rows, with the nodes' slots when `table` (the slot table, the
    sink) is given (no argument checks: `ops.chain_verify_rows` checks)."""
    if pick_impl(impl, rows.device) == "torch":
        return _chain_verify_rows_torch(rows, seq_len, pending, finished, req_id, drafts, table)
    check_launchable(_chain_verify_rows_kernel, rows.device)
    bs, d = rows.shape[0], drafts.shape[1] + 1
    i64 = dict(dtype=torch.int64, device=rows.device)
    out = ChainRows(torch.empty((bs, d), **i64), torch.empty((bs, d), **i64), torch.empty(bs, **i64),
                    torch.empty(bs, **i64), torch.empty(bs, dtype=torch.bool, device=rows.device),
                    torch.empty(bs, **i64), None if table is None else torch.empty((bs, d), **i64))
    if bs == 0:
        return out
    if table is None:   # the slot arguments unread: any tensor stands in for the pointers
        slot_args = (rows, rows, 0, 0, 0, 0)
    else:
        req_to_token, sink = table
        slot_args = (req_to_token, out.slots, req_to_token.shape[1] - 1, sink, *req_to_token.stride())
    _chain_verify_rows_kernel[(bs,)](
        rows, seq_len, pending, finished, req_id, drafts, *out[:6], d,
        rows.stride(0), seq_len.stride(0), pending.stride(0), finished.stride(0), req_id.stride(0),
        drafts.stride(0), drafts.stride(1), *slot_args,
        BLOCK_D=max(triton.next_power_of_2(d), 2), SLOTS=table is not None, num_warps=1)
    return out
