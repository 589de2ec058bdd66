"""Where a draft phase's tokens sit (docs/semantics.md 6.18): the draft-extend's rows after a
verify (or a prefill) and the positions of the draft steps after it, in one kernel.

A lane's draft-extend runs its q_lens[b] new tokens x_t, token j at draft index kv_lens[b] + j and
position kv_lens[b] + 1 + j (x_t sits at position t, its draft entry at t - 1); a finished lane
runs none. The last of them is the root of the next tree, at position root[b] = kv_lens[b] +
q_lens[b] (the draft prefix every draft step sees), in the row last[b] of the extend's output; the
draft steps then sit at positions root[b] + 1 .. root[b] + S. A chain step has one live query on a
live lane (live[b] = 1) and none on a finished one.

Given the slot table, the plan also holds the cache slots those tokens write (6.14's rule, read
once for the whole draft phase): the extend's tokens at draft indices kv_lens[b] + j (padding and
finished lanes: the sink) and the `ahead_tokens` indices root[b] + i after the root (a chain step's
one token, an MTP head's, the DFlash block's rows), so no forward of the phase plans its own.

The torch path is the where / add / sub / clamp sequence each draft ran (about ten kernels on a GPU,
every cycle) and `token_slots`' rule twice; the Triton kernel is one launch of one program per lane.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl
from specverify.kernels.token_slots import token_slots_torch


class DraftPlan(NamedTuple):
    """Per lane (every field int64, contiguous, on the inputs' device)."""
    q_lens: torch.Tensor      # [bs] the extend's live tokens: 0 on a finished lane
    positions: torch.Tensor   # [bs, width] position of extend token j: kv_lens + 1 + j (padding too)
    last: torch.Tensor        # [bs] the extend row of the root (its last live token; 0 when none)
    root: torch.Tensor        # [bs] the root's position: kv_lens + q_lens, the draft steps' prefix
    ahead: torch.Tensor       # [bs, num_steps] the draft steps' positions root + 1 .. root + S
    live: torch.Tensor        # [bs] 1 on a live lane, 0 on a finished one
    # Given the slot table (else None):
    slots: torch.Tensor | None = None        # [bs, width] the extend tokens' slots (padding: the sink)
    ahead_slots: torch.Tensor | None = None  # [bs, ahead_tokens] the slots of cache indices root + i
                                             # (a finished lane: the sink)


class SlotTable(NamedTuple):
    """What the plan reads its slots from: the slot table [R, C] (int32 / int64), each lane's row
    of it [bs], the indices after the root wanted, and the slot padding writes."""
    req_to_token: torch.Tensor
    rows: torch.Tensor
    ahead_tokens: int
    sink: int


def _draft_plan_torch(q_lens, kv_lens, finished, width: int, num_steps: int, table: SlotTable | None) -> DraftPlan:
    device = q_lens.device
    q = torch.where(finished, 0, q_lens)
    positions = kv_lens[:, None] + 1 + torch.arange(width, device=device)[None, :]
    root = kv_lens + q
    ahead = root[:, None] + 1 + torch.arange(num_steps, device=device)[None, :]
    live = (~finished).long()
    plan = DraftPlan(q, positions, (q - 1).clamp(min=0), root, ahead, live)
    if table is None:
        return plan
    r2t, rows, ahead_tokens, sink = table
    return plan._replace(slots=token_slots_torch(r2t, rows, kv_lens, q, width, 0, sink),
                         ahead_slots=token_slots_torch(r2t, rows, root, live * ahead_tokens, ahead_tokens, 0, sink))


@triton.jit
def _draft_plan_kernel(q_ptr, kv_ptr, fin_ptr, q_out, pos_out, last_out, root_out, ahead_out, live_out,
                       width, num_steps, s_q, s_kv, s_fin,
                       table_ptr, rows_ptr, slots_out, ahead_slots_out, ahead_tokens, last_cell, sink, s_t0, s_t1, s_r,
                       BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr, SLOTS: tl.constexpr, BLOCK_A: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    done = tl.load(fin_ptr + b * s_fin) != 0
    kv = tl.load(kv_ptr + b * s_kv)
    q = tl.where(done, 0, tl.load(q_ptr + b * s_q))
    j = tl.arange(0, BLOCK_Q)
    tl.store(pos_out + b * width + j, kv + 1 + j, mask=j < width)
    root = kv + q
    s = tl.arange(0, BLOCK_S)
    tl.store(ahead_out + b * num_steps + s, root + 1 + s, mask=s < num_steps)
    tl.store(q_out + b, q)
    tl.store(last_out + b, tl.maximum(q - 1, 0))
    tl.store(root_out + b, root)
    tl.store(live_out + b, tl.where(done, 0, 1).to(tl.int64))
    if SLOTS:
        # 6.14 at draft index kv + j (the extend) and root + i (after the root), clamped to the row.
        row = table_ptr + tl.load(rows_ptr + b * s_r).to(tl.int64) * s_t0
        runs = j < q
        slot = tl.load(row + tl.minimum(kv + j, last_cell) * s_t1, mask=runs, other=sink)
        tl.store(slots_out + b * width + j, tl.where(runs, slot, sink).to(tl.int64), mask=j < width)
        i = tl.arange(0, BLOCK_A)
        steps = i < tl.where(done, 0, ahead_tokens)          # a finished lane's: none
        slot = tl.load(row + tl.minimum(root + i, last_cell) * s_t1, mask=steps, other=sink)
        tl.store(ahead_slots_out + b * ahead_tokens + i, tl.where(steps, slot, sink).to(tl.int64),
                 mask=i < ahead_tokens)


def draft_plan_impl(q_lens: torch.Tensor, kv_lens: torch.Tensor, finished: torch.Tensor, width: int,
                    num_steps: int, table: SlotTable | None = None, impl: str = "auto") -> DraftPlan:
    """The draft phase's per-lane plan, with its slots when `table` is given (no argument checks:
    `ops.draft_plan` checks)."""
    if pick_impl(impl, q_lens.device) == "torch":
        return _draft_plan_torch(q_lens, kv_lens, finished, width, num_steps, table)
    check_launchable(_draft_plan_kernel, q_lens.device)
    bs = q_lens.shape[0]
    i64 = dict(dtype=torch.int64, device=q_lens.device)
    plan = DraftPlan(torch.empty(bs, **i64), torch.empty((bs, width), **i64), torch.empty(bs, **i64),
                     torch.empty(bs, **i64), torch.empty((bs, num_steps), **i64), torch.empty(bs, **i64))
    ahead_tokens = 0
    if table is not None:
        ahead_tokens = table.ahead_tokens
        plan = plan._replace(slots=torch.empty((bs, width), **i64), ahead_slots=torch.empty((bs, ahead_tokens), **i64))
    if bs == 0:
        return plan
    block_q = max(triton.next_power_of_2(width), 2)          # a prefill's extend is as wide as its prompt
    if table is None:   # the slot arguments unread: any tensor stands in for the pointers
        slot_args = (q_lens, q_lens, q_lens, q_lens, 0, 0, 0, 0, 0, 0)
    else:
        r2t = table.req_to_token
        slot_args = (r2t, table.rows, plan.slots, plan.ahead_slots, ahead_tokens, r2t.shape[1] - 1, table.sink,
                     *r2t.stride(), table.rows.stride(0))
    _draft_plan_kernel[(bs,)](
        q_lens, kv_lens, finished, *plan[:6], width, num_steps, q_lens.stride(0), kv_lens.stride(0), finished.stride(0),
        *slot_args, BLOCK_Q=block_q, BLOCK_S=max(triton.next_power_of_2(num_steps), 2), SLOTS=table is not None,
        BLOCK_A=max(triton.next_power_of_2(ahead_tokens), 2), num_warps=1 if block_q <= 256 else 4)
    return plan
