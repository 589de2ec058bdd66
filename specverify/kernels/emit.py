"""The emit of a decode step (docs/semantics.md 6.15): the EOS / max_new_tokens cut of section 5
and the request state it moves, in one kernel; and, before it in a speculative cycle, the candidate
tokens a verify's accepted path makes (6.17), in another.

A step hands each lane's candidate tokens in order (`produced [bs, W]`, `count [bs]` of them
real: a cycle's accepted drafts and its bonus, a target step's one token) and the rows of the
request state. A live lane (its row not finished) takes the tokens up to and including the first
EOS among its `count`, at most what its budget still allows; it stops when it took its last
allowed token or an EOS. Its row then holds: emitted + taken, finished = stop, seq_len + count (the
cycle's K/V are cached whether or not the cut kept them: a finished request's length is never read
again), pending = its last candidate. A lane whose row is already finished (a padded lane, a request
that stopped earlier) takes nothing and writes nothing. The packed head a host reads back per lane:
the taken tokens (-1 after them), taken, finished.

The torch path is the gather / compare / where / scatter sequence a step used to run (about thirty
kernels on a GPU, every step); it writes every lane's row, a finished row's values unchanged. The
Triton kernel is one launch of one program per lane and leaves finished rows untouched. Both assume
count >= 1 (`ops.emit_tokens` checks it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl


def stop_mask(tokens: torch.Tensor, count: torch.Tensor, room: torch.Tensor,
              eos: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The EOS / max_new_tokens cut of section 5 in torch ops.

    tokens [bs, W]: a request's candidate tokens in order, `count [bs]` of them produced;
    room [bs]: tokens its budget still allows. Returns (taken [bs], stop [bs]): the tokens
    appended (up to and including the first EOS, at most room) and whether the request stops."""
    w = tokens.shape[1]
    j = torch.arange(w, device=tokens.device)[None, :]
    stop_at = torch.full_like(count, w)
    if eos is not None:
        stop_at = torch.where((tokens == eos) & (j < count[:, None]), j, w).amin(1)
    taken = torch.minimum(torch.minimum(count, room), stop_at + 1)
    return taken, (taken >= room) | (stop_at < taken)


def _emit_torch(produced, count, rows, seq_len, pending, emitted, budget, finished, eos):
    live = ~finished[rows]
    n, before = seq_len[rows], emitted[rows]
    taken, stop = stop_mask(produced, count, budget[rows] - before, eos)
    taken = torch.where(live, taken, 0)
    done = ~live | stop
    last = produced.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
    emitted[rows] = before + taken
    finished[rows] = done
    seq_len[rows] = torch.where(live, n + count, n)
    pending[rows] = torch.where(live, last, pending[rows])
    j = torch.arange(produced.shape[1], device=produced.device)[None, :]
    head = torch.cat([torch.where(j < taken[:, None], produced, -1), taken[:, None], done.long()[:, None]], 1)
    return head, taken, done


@triton.jit
def _emit_kernel(prod_ptr, count_ptr, rows_ptr, seq_ptr, pend_ptr, emit_ptr, budget_ptr, fin_ptr,
                 head_ptr, taken_ptr, done_ptr, width, eos,
                 s_p0, s_p1, s_c, s_r, s_h0, s_seq, s_pend, s_emit, s_budget, s_fin,
                 HAS_EOS: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_W)
    in_w = j < width
    row = tl.load(rows_ptr + b * s_r).to(tl.int64)
    count = tl.load(count_ptr + b * s_c).to(tl.int64)
    live = tl.load(fin_ptr + row * s_fin) == 0
    before = tl.load(emit_ptr + row * s_emit)
    room = tl.load(budget_ptr + row * s_budget) - before
    tokens = tl.load(prod_ptr + b * s_p0 + j * s_p1, mask=in_w, other=0)
    # Both branches make stop_at a tensor (a width of 1 is specialized to a constant when compiled).
    if HAS_EOS:
        hit = in_w & (j < count) & (tokens == eos)
    else:
        hit = j < 0
    stop_at = tl.min(tl.where(hit, j, width), axis=0)
    taken = tl.minimum(tl.minimum(count, room), stop_at + 1)
    stop = (taken >= room) | (stop_at < taken)
    taken = tl.where(live, taken, 0)
    done = (live == 0) | stop
    last = tl.sum(tl.where(j == count - 1, tokens, 0), axis=0)
    tl.store(head_ptr + b * s_h0 + j, tl.where(j < taken, tokens, -1), mask=in_w)
    tl.store(head_ptr + b * s_h0 + width, taken)
    tl.store(head_ptr + b * s_h0 + width + 1, done.to(tl.int64))
    tl.store(taken_ptr + b, taken)
    tl.store(done_ptr + b, done.to(tl.int8))
    # The request state: live lanes only (a finished row, the pad row of every padded lane among
    # them, is left as it is, so lanes sharing it never race).
    tl.store(emit_ptr + row * s_emit, before + taken, mask=live)
    tl.store(fin_ptr + row * s_fin, done.to(tl.int8), mask=live)
    tl.store(seq_ptr + row * s_seq, tl.load(seq_ptr + row * s_seq) + count, mask=live)
    tl.store(pend_ptr + row * s_pend, last, mask=live)


def emit_impl(produced: torch.Tensor, count: torch.Tensor, rows: torch.Tensor, seq_len: torch.Tensor,
              pending: torch.Tensor, emitted: torch.Tensor, budget: torch.Tensor, finished: torch.Tensor,
              eos: int | None, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(head [bs, W + 2] int64, taken [bs] int64, finished [bs] bool); the state rows written in
    place (no argument checks: `ops.emit_tokens` checks)."""
    if pick_impl(impl, produced.device) == "torch":
        return _emit_torch(produced, count, rows, seq_len, pending, emitted, budget, finished, eos)
    check_launchable(_emit_kernel, produced.device)
    bs, w = produced.shape
    dev = produced.device
    head = torch.empty((bs, w + 2), dtype=torch.int64, device=dev)
    taken = torch.empty(bs, dtype=torch.int64, device=dev)
    done = torch.empty(bs, dtype=torch.bool, device=dev)
    if bs == 0:
        return head, taken, done
    _emit_kernel[(bs,)](
        produced, count, rows, seq_len, pending, emitted, budget, finished.view(torch.int8),
        head, taken, done.view(torch.int8), w, -1 if eos is None else eos,
        produced.stride(0), produced.stride(1), count.stride(0), rows.stride(0), head.stride(0),
        seq_len.stride(0), pending.stride(0), emitted.stride(0), budget.stride(0), finished.stride(0),
        HAS_EOS=eos is not None, BLOCK_W=max(triton.next_power_of_2(w), 2), num_warps=1)
    return head, taken, done


def _accepted_torch(tree_tokens, accept, num_correct, bonus):
    w = accept.shape[1]
    j = torch.arange(w, device=accept.device)[None, :]
    n = num_correct.long()[:, None]
    # Only the path's first n entries are read: past them, node 0 (an entry there may be anything).
    nodes = torch.where(j[:, 1:] <= n, accept[:, 1:].long(), 0)
    drafts = tree_tokens.gather(1, nodes)                                           # [bs, W - 1]
    drafts = torch.cat([drafts, drafts.new_zeros((drafts.shape[0], 1))], 1)       # the bonus's column
    produced = torch.where(j < n, drafts, torch.where(j == n, bonus[:, None], 0))
    return produced, n[:, 0] + 1


@triton.jit
def _accepted_kernel(tok_ptr, acc_ptr, nc_ptr, bonus_ptr, prod_ptr, count_ptr, width,
                     s_t0, s_t1, s_a0, s_a1, s_n, s_b, s_p0,
                     BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_W)
    n = tl.load(nc_ptr + b * s_n).to(tl.int64)
    bonus = tl.load(bonus_ptr + b * s_b)
    # Depth j < n holds the draft at the path's node j + 1 (node 0, the root, is not emitted again).
    draft = (j < n) & (j + 1 < width)
    node = tl.load(acc_ptr + b * s_a0 + (j + 1) * s_a1, mask=draft, other=0).to(tl.int64)
    token = tl.load(tok_ptr + b * s_t0 + node * s_t1, mask=draft, other=0)
    token = tl.where(j == n, bonus, token)
    tl.store(prod_ptr + b * s_p0 + j, token, mask=j < width)
    tl.store(count_ptr + b, n + 1)


def accepted_tokens_impl(tree_tokens: torch.Tensor, accept: torch.Tensor, num_correct: torch.Tensor,
                         bonus: torch.Tensor, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(produced [bs, W] int64, count [bs] int64) of a verify's accepted path (no argument checks:
    `ops.accepted_tokens` checks)."""
    if pick_impl(impl, accept.device) == "torch":
        return _accepted_torch(tree_tokens, accept, num_correct, bonus)
    check_launchable(_accepted_kernel, accept.device)
    bs, w = accept.shape
    produced = torch.empty((bs, w), dtype=torch.int64, device=accept.device)
    count = torch.empty(bs, dtype=torch.int64, device=accept.device)
    if bs == 0:
        return produced, count
    _accepted_kernel[(bs,)](
        tree_tokens, accept, num_correct, bonus, produced, count, w,
        tree_tokens.stride(0), tree_tokens.stride(1), accept.stride(0), accept.stride(1), num_correct.stride(0),
        bonus.stride(0), produced.stride(0),
        BLOCK_W=max(triton.next_power_of_2(w), 2), num_warps=1)
    return produced, count
