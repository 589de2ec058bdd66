"""The cache slot each new token of a forward writes (docs/semantics.md 6.14), in one kernel.

Token t of request b (t < num_tokens) sits at cache index kv_lens[b] + region + t of its row
rows[b] of the slot table; a live token (t < q_lens[b]) writes the slot the table maps that index
to (the index clamped to the row's last cell), a padded one the sink slot. The torch path is the
arange / add / clamp / gather / compare / where sequence a forward used to plan with (about ten
kernels on a GPU, once per forward); the Triton kernel is one launch and reads the table only for
the live tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl

TOKEN_BLOCK = 256     # tokens per program: a decode step's few in one, a long prefill's over several


def token_slots_torch(req_to_token, rows, kv_lens, q_lens, num_tokens: int, region: int, sink: int):
    t = torch.arange(num_tokens, device=req_to_token.device)[None, :]
    idx = (kv_lens[:, None] + region + t).clamp(max=req_to_token.shape[1] - 1)
    slots = req_to_token[rows[:, None], idx]
    return torch.where(t < q_lens[:, None], slots, torch.full_like(slots, sink)).to(torch.int64)


@triton.jit
def _token_slots_kernel(table_ptr, rows_ptr, kv_ptr, ql_ptr, out_ptr, num_tokens, region, last_cell, sink,
                        s_t0, s_t1, s_r, s_k, s_q, s_o0,
                        BLOCK_Q: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    in_batch = t < num_tokens
    row = tl.load(rows_ptr + b * s_r).to(tl.int64)
    kv = tl.load(kv_ptr + b * s_k).to(tl.int64)
    live = in_batch & (t < tl.load(ql_ptr + b * s_q))
    idx = tl.minimum(kv + region + t, last_cell)
    slot = tl.load(table_ptr + row * s_t0 + idx * s_t1, mask=live, other=sink)
    tl.store(out_ptr + b * s_o0 + t, tl.where(live, slot, sink).to(tl.int64), mask=in_batch)


def token_slots_impl(req_to_token: torch.Tensor, rows: torch.Tensor, kv_lens: torch.Tensor, q_lens: torch.Tensor,
                     num_tokens: int, region: int, sink: int, impl: str = "auto", block_q: int | None = None) -> torch.Tensor:
    """[bs, num_tokens] int64 (no argument checks: `ops.token_slots` checks)."""
    if pick_impl(impl, req_to_token.device) == "torch":
        return token_slots_torch(req_to_token, rows, kv_lens, q_lens, num_tokens, region, sink)
    check_launchable(_token_slots_kernel, req_to_token.device)
    bs = rows.shape[0]
    out = torch.empty((bs, num_tokens), dtype=torch.int64, device=req_to_token.device)
    if bs == 0 or num_tokens == 0:
        return out
    block_q = block_q or min(max(triton.next_power_of_2(num_tokens), 2), TOKEN_BLOCK)
    _token_slots_kernel[(bs, triton.cdiv(num_tokens, block_q))](
        req_to_token, rows, kv_lens, q_lens, out, num_tokens, region, req_to_token.shape[1] - 1, sink,
        *req_to_token.stride(), rows.stride(0), kv_lens.stride(0), q_lens.stride(0), out.stride(0),
        BLOCK_Q=block_q, num_warps=1 if block_q <= 64 else 4)
    return out
