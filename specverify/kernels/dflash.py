"""DFlash's greedy verify (docs/semantics.md 6.9): a Triton kernel and a torch fallback.

A DFlash block holds B tokens per request: column 0 is the root (the last verified token),
columns 1..B-1 the drafted tokens. The target predicts a token after every block position, so
draft j (column j + 1) is right when it equals the prediction after column j:

    correct[b] = the length of the leading run of candidates[b, 1:] == target_predict[b, :-1]
    bonus[b]   = target_predict[b, correct[b]]

`correct` counts accepted DRAFT tokens only: a cycle emits correct + 1 tokens, the accepted drafts
and the bonus. A block of one (B = 1) has no draft: correct 0, bonus target_predict[b, 0].

Triton: one program per request. Lane j < B - 1 compares candidates[b, j + 1] with
target_predict[b, j]; lanes past the drafts are masked (loaded as 0 and -1, and counted as
mismatches whatever they hold), so the first mismatching lane is the run's length, at most B - 1.
Nothing is read back to the host: capture-safe. The torch path is the same rule by tensor ops
(a cumulative product of the match mask).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, pick_impl


@triton.jit
def _dflash_verify_kernel(
    cand_ptr, pred_ptr, correct_ptr, bonus_ptr,
    width,
    stride_cb, stride_cj, stride_pb, stride_pj, stride_correct, stride_bonus,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_W)                               # draft j: column j + 1 vs prediction j
    is_draft = j < width - 1
    cand = tl.load(cand_ptr + b * stride_cb + (j + 1) * stride_cj, mask=is_draft, other=0).to(tl.int64)
    pred = tl.load(pred_ptr + b * stride_pb + j * stride_pj, mask=is_draft, other=-1).to(tl.int64)
    hit = (cand == pred) & is_draft
    # The first lane that misses; every lane past the drafts misses, so when all drafts hit the
    # minimum is B - 1 (or BLOCK_W == B - 1 itself when the block fills the lanes exactly).
    correct = tl.min(tl.where(hit, BLOCK_W, j), axis=0)
    bonus = tl.load(pred_ptr + b * stride_pb + correct * stride_pj)
    tl.store(correct_ptr + b * stride_correct, correct.to(tl.int32))
    tl.store(bonus_ptr + b * stride_bonus, bonus.to(tl.int64))


def _triton_dflash_verify(candidates: torch.Tensor, target_predict: torch.Tensor):
    check_launchable(_dflash_verify_kernel, candidates.device)
    bs, width = candidates.shape
    correct = torch.empty((bs,), dtype=torch.int32, device=candidates.device)
    bonus = torch.empty((bs,), dtype=torch.int64, device=candidates.device)
    if bs == 0:
        return correct, bonus
    _dflash_verify_kernel[(bs,)](
        candidates, target_predict, correct, bonus,
        width,
        *candidates.stride(), *target_predict.stride(), correct.stride(0), bonus.stride(0),
        BLOCK_W=triton.next_power_of_2(max(width - 1, 1)))
    return correct, bonus


def _torch_dflash_verify(candidates: torch.Tensor, target_predict: torch.Tensor):
    matches = candidates[:, 1:] == target_predict[:, :-1]                  # [bs, B-1]: draft j is right
    run = torch.cumprod(matches.to(torch.int32), dim=1)                    # 1 while every draft so far is right
    correct = run.sum(dim=1, dtype=torch.int32)                            # [bs] accepted drafts, no bonus
    bonus = torch.gather(target_predict, 1, correct.to(torch.int64)[:, None])[:, 0].to(torch.int64)
    return correct, bonus


def dflash_verify_impl(candidates: torch.Tensor, target_predict: torch.Tensor,
                       impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel wrapper behind `specverify.ops.dflash_correct_drafts_and_bonus` (inputs already
    checked): candidates, target_predict [bs, B] int32/int64, B >= 1 -> (correct [bs] int32,
    bonus [bs] int64). correct excludes the bonus."""
    if pick_impl(impl, candidates.device) == "triton":
        return _triton_dflash_verify(candidates, target_predict)
    return _torch_dflash_verify(candidates, target_predict)
