"""One step of the EAGLE draft-tree search (docs/semantics.md 6.2, 6.13) as one kernel: expand every
beam by its top-k children, score them, select the k best as the next beams, and gather what the
next draft forward needs (the new beams' tokens, their ancestor rows, their parents' hidden states).

The torch implementation is the search's original sequence of tensor ops (a dozen kernels and more
per step on a GPU); the Triton kernel does the same integer and float32 work in one launch, one
program per request. Both compute the same bits: the path products are single float32
multiplications, the selection is an exact ranking (value descending, index ascending, -0 == +0,
NaN above every number) and everything else is a copy.

Shapes (bs requests, k = topk, R draft-region columns, H hidden size):
    beam_scores  [bs, k] float32      path score of each current beam
    child_probs  [bs, k, k] float32   each beam's top-k draft probabilities (row p: beam p)
    child_tokens [bs, k, k] int64     their tokens
    ancestors    [bs, k, R] bool      each current beam's draft-region entries
    hidden       [bs, k, H] float     each current beam's draft hidden state output
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specverify.kernels.draft_select import LOWEST_KEY, packed_order_key
from specverify.kernels.launch import check_launchable, pick_impl
from specverify.kernels.order import topk_stable

# The Triton kernel ranks the k^2 candidates against each other in one [k^2, k^2] tile: up to
# topk 16 (a 256 x 256 tile). A larger topk takes the torch path under "auto".
MAX_TRITON_TOPK = 16
HIDDEN_BLOCK = 256


@dataclass
class BeamStep:
    scores: torch.Tensor        # [bs, k] float32, the new beams' path scores (descending)
    tokens: torch.Tensor        # [bs, k] int64, their tokens
    flat: torch.Tensor          # [bs, k] int64, their flat candidate indices k + (step-1)k^2 + chosen
    parent: torch.Tensor        # [bs, k] int64, the beam each one expands
    ancestors: torch.Tensor     # [bs, k, R] bool, the parent's row plus the beam's own entry step*k + p
    hidden: torch.Tensor        # [bs, k, H], the parent's hidden state
    cand_scores: torch.Tensor   # [bs, k*k] float32, every candidate's path score, flat order


def candidate_base(topk: int, step: int) -> int:
    """Flat index of step `step`'s first candidate (step >= 1): k + (step-1) k^2."""
    return topk + (step - 1) * topk * topk


# --------------------------------------------------------------------------------------------
# torch: the search's tensor ops


def _expand_torch(beam_scores, child_probs, child_tokens, ancestors, hidden, step: int) -> BeamStep:
    bs, k = beam_scores.shape
    region = ancestors.shape[2]
    cand = (beam_scores[:, :, None] * child_probs).reshape(bs, k * k)          # float32 path products
    scores, chosen = topk_stable(cand, k)                                        # chosen in [0, k*k)
    parent = torch.div(chosen, k, rounding_mode="floor")
    own = torch.arange(region, device=ancestors.device)[None, :] == (step * k + torch.arange(k, device=ancestors.device))[:, None]
    inherited = ancestors.gather(1, parent[:, :, None].expand(-1, -1, region))
    return BeamStep(
        scores=scores,
        tokens=child_tokens.reshape(bs, k * k).gather(1, chosen),
        flat=candidate_base(k, step) + chosen,
        parent=parent,
        ancestors=inherited | own,
        hidden=hidden.gather(1, parent[:, :, None].expand(-1, -1, hidden.shape[2])),
        cand_scores=cand,
    )


# --------------------------------------------------------------------------------------------
# Triton: one program per request


@triton.jit
def _expand_beams_kernel(
    scores_ptr, probs_ptr, tokens_ptr, anc_ptr, hidden_ptr,
    out_scores_ptr, out_tokens_ptr, out_flat_ptr, out_parent_ptr, out_anc_ptr, out_hidden_ptr, out_cand_ptr,
    topk, region, hidden_size, base, own_offset,
    s_sc0, s_sc1, s_pr0, s_pr1, s_pr2, s_tk0, s_tk1, s_tk2, s_an0, s_an1, s_an2, s_hd0, s_hd1, s_hd2,
    s_os0, s_ot0, s_of0, s_op0, s_oa0, s_oa1, s_oh0, s_oh1, s_oc0,
    BLOCK_K: tl.constexpr, BLOCK_KK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kk = topk * topk
    i = tl.arange(0, BLOCK_KK)                           # candidate i = beam (i // k), child (i % k)
    live = i < kk
    s = tl.load(scores_ptr + b * s_sc0 + (i // topk) * s_sc1, mask=live, other=0.0)
    p = tl.load(probs_ptr + b * s_pr0 + (i // topk) * s_pr1 + (i % topk) * s_pr2, mask=live, other=0.0)
    cand = s * p
    tl.store(out_cand_ptr + b * s_oc0 + i, cand, mask=live)

    # Rank of candidate i: the candidates before it in (value descending, index ascending), NaN on
    # top (NaNs tie), -0 == +0 (a float compare). The ranks of the live candidates are 0..k^2-1.
    ci = cand[:, None]
    cj = cand[None, :]
    nan_i = ci != ci
    nan_j = cj != cj
    tie = (cj == ci) | (nan_j & nan_i)
    before = (nan_j & ~nan_i) | (cj > ci) | (tie & (i[None, :] < i[:, None]))
    rank = tl.sum(tl.where(before & live[None, :], 1, 0), axis=1)

    q = tl.arange(0, BLOCK_K)                            # new beam q: the candidate of rank q
    beam_live = q < topk
    pick = (rank[None, :] == q[:, None]) & live[None, :]
    chosen = tl.sum(tl.where(pick, i[None, :], 0), axis=1)
    parent = chosen // topk
    child = chosen % topk
    # The chosen score read again and multiplied again: the same bits as `cand` at `chosen`.
    new_s = tl.load(scores_ptr + b * s_sc0 + parent * s_sc1, mask=beam_live, other=0.0) * \
        tl.load(probs_ptr + b * s_pr0 + parent * s_pr1 + child * s_pr2, mask=beam_live, other=0.0)
    tok = tl.load(tokens_ptr + b * s_tk0 + parent * s_tk1 + child * s_tk2, mask=beam_live, other=0)
    tl.store(out_scores_ptr + b * s_os0 + q, new_s, mask=beam_live)
    tl.store(out_tokens_ptr + b * s_ot0 + q, tok, mask=beam_live)
    tl.store(out_flat_ptr + b * s_of0 + q, (base + chosen).to(tl.int64), mask=beam_live)
    tl.store(out_parent_ptr + b * s_op0 + q, parent.to(tl.int64), mask=beam_live)

    r = tl.arange(0, BLOCK_R)
    cell = beam_live[:, None] & (r < region)[None, :]
    inherited = tl.load(anc_ptr + b * s_an0 + parent[:, None] * s_an1 + r[None, :] * s_an2, mask=cell, other=0)
    anc = (inherited != 0) | (r[None, :] == own_offset + q[:, None])
    tl.store(out_anc_ptr + b * s_oa0 + q[:, None] * s_oa1 + r[None, :], anc, mask=cell)

    # (A while loop, not range(hidden_size): see "Loop bounds" in launch.py.)
    h0 = 0
    while h0 < hidden_size:
        h = h0 + tl.arange(0, BLOCK_H)
        tile = beam_live[:, None] & (h < hidden_size)[None, :]
        x = tl.load(hidden_ptr + b * s_hd0 + parent[:, None] * s_hd1 + h[None, :] * s_hd2, mask=tile, other=0.0)
        tl.store(out_hidden_ptr + b * s_oh0 + q[:, None] * s_oh1 + h[None, :], x, mask=tile)
        h0 += BLOCK_H


def _expand_triton(beam_scores, child_probs, child_tokens, ancestors, hidden, step: int,
                   hidden_block: int = HIDDEN_BLOCK) -> BeamStep:
    bs, k = beam_scores.shape
    region, hs = ancestors.shape[2], hidden.shape[2]
    device = beam_scores.device
    check_launchable(_expand_beams_kernel, device)
    out = BeamStep(
        scores=torch.empty((bs, k), dtype=torch.float32, device=device),
        tokens=torch.empty((bs, k), dtype=torch.int64, device=device),
        flat=torch.empty((bs, k), dtype=torch.int64, device=device),
        parent=torch.empty((bs, k), dtype=torch.int64, device=device),
        ancestors=torch.empty((bs, k, region), dtype=torch.bool, device=device),
        hidden=torch.empty((bs, k, hs), dtype=hidden.dtype, device=device),
        cand_scores=torch.empty((bs, k * k), dtype=torch.float32, device=device),
    )
    if bs == 0:
        return out
    block_kk = max(triton.next_power_of_2(k * k), 2)
    _expand_beams_kernel[(bs,)](
        beam_scores, child_probs, child_tokens, ancestors, hidden,
        out.scores, out.tokens, out.flat, out.parent, out.ancestors, out.hidden, out.cand_scores,
        k, region, hs, candidate_base(k, step), step * k,
        *beam_scores.stride(), *child_probs.stride(), *child_tokens.stride(), *ancestors.stride(), *hidden.stride(),
        out.scores.stride(0), out.tokens.stride(0), out.flat.stride(0), out.parent.stride(0),
        out.ancestors.stride(0), out.ancestors.stride(1), out.hidden.stride(0), out.hidden.stride(1),
        out.cand_scores.stride(0),
        BLOCK_K=max(triton.next_power_of_2(k), 2), BLOCK_KK=block_kk,
        BLOCK_R=max(triton.next_power_of_2(region), 2), BLOCK_H=hidden_block,
        num_warps=4 if block_kk <= 64 else 8,
    )
    return out


def expand_beams_impl(beam_scores, child_probs, child_tokens, ancestors, hidden, step: int,
                      impl: str = "auto", hidden_block: int = HIDDEN_BLOCK) -> BeamStep:
    """The step without argument checks (the engine's hot path; `ops.expand_beams` checks).
    "auto": Triton on CUDA tensors up to MAX_TRITON_TOPK, torch elsewhere."""
    choice = pick_impl(impl, beam_scores.device)
    if choice == "triton" and (impl == "triton" or beam_scores.shape[1] <= MAX_TRITON_TOPK):
        return _expand_triton(beam_scores, child_probs, child_tokens, ancestors, hidden, step, hidden_block)
    return _expand_torch(beam_scores, child_probs, child_tokens, ancestors, hidden, step)


# -- the end of the search: the D-1 best candidates, by flat index (docs/semantics.md 6.13) --------

@triton.jit
def _keep_candidates_kernel(scores_ptr, tokens_ptr, flat_ptr, kept_tokens_ptr, m, keep,
                            s_sc, s_tk, s_fl, s_kt, BLOCK_M: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_M)
    live = j < m
    x = tl.load(scores_ptr + b * s_sc + j, mask=live, other=0.0)
    packed = tl.where(live, packed_order_key(x, j, m), LOWEST_KEY)
    # The keep-th best key: the best taken away keep - 1 times (a while loop: "Loop bounds", launch.py).
    rest = packed
    n = 1
    while n < keep:
        rest = tl.where(rest == tl.max(rest, axis=0), LOWEST_KEY, rest)
        n += 1
    kept = live & (packed >= tl.max(rest, axis=0))
    pos = tl.cumsum(kept.to(tl.int32), axis=0) - 1          # the kept candidates in flat order
    tl.store(flat_ptr + b * s_fl + pos, j.to(tl.int64), mask=kept)
    tl.store(kept_tokens_ptr + b * s_kt + pos, tl.load(tokens_ptr + b * s_tk + j, mask=kept, other=0), mask=kept)


def _keep_torch(scores: torch.Tensor, tokens: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, best = topk_stable(scores, keep)
    kept_flat = torch.sort(best, dim=1).values
    return kept_flat, tokens.gather(1, kept_flat)


def keep_candidates_impl(scores: torch.Tensor, tokens: torch.Tensor, keep: int,
                         impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(kept_flat [bs, keep], kept_tokens [bs, keep]): the wrapper behind `ops.keep_candidates`
    (inputs already checked). "auto": one Triton kernel on CUDA tensors (one program per request),
    torch's stable top-k and sort elsewhere."""
    bs, m = scores.shape
    if bs and keep and pick_impl(impl, scores.device) != "triton":
        return _keep_torch(scores, tokens, keep)
    kept_flat = torch.empty((bs, keep), dtype=torch.int64, device=scores.device)
    kept_tokens = torch.empty((bs, keep), dtype=torch.int64, device=scores.device)
    if bs == 0 or keep == 0:
        return kept_flat, kept_tokens
    check_launchable(_keep_candidates_kernel, scores.device)
    block_m = max(triton.next_power_of_2(m), 2)
    _keep_candidates_kernel[(bs,)](scores, tokens, kept_flat, kept_tokens, m, keep, scores.stride(0), tokens.stride(0),
                                   kept_flat.stride(0), kept_tokens.stride(0), BLOCK_M=block_m,
                                   num_warps=4 if block_m <= 256 else 8)
    return kept_flat, kept_tokens
