"""Both draft-selection paths on every platform profile, the tie contract on tie-heavy FP8 rows,
and the reality check that gates the argmax fast path."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specverify import dtypes, ops
from specverify.platform import available_profiles, get_profile
from tests.support import strategies as S

FP8 = [pytest.param(d, id=d, marks=pytest.mark.fp8) for d in dtypes.FP8_DTYPES]


def forced(profile, fast: bool):
    return dataclasses.replace(profile, argmax_fast_path=fast)


def tie_heavy_fp8(dtype: str, seed: int, rows: int = 64, vocab: int = 389):
    gen = torch.Generator().manual_seed(seed)
    x = S.tie_heavy_rows(gen, rows, vocab) * 0.37 + S.grid_logits(gen, rows, vocab) * 0.01
    return S.as_logits_dtype(x, dtype)


def first_max(values: torch.Tensor) -> torch.Tensor:
    up = values.float()
    hit = up == up.max(-1, keepdim=True).values
    return hit.int().argmax(-1)            # first True


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("profile_name", sorted(available_profiles()))
@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "softmax-path"])
def test_every_path_honours_the_tie_contract(profile_name, fast, dtype, seed):
    profile = forced(available_profiles()[profile_name], fast)
    values, scale = tie_heavy_fp8(dtype, seed)
    values, scale = values.to(profile.device), scale.to(profile.device)
    up = values.float()
    assert ((up == up.max(-1, keepdim=True).values).sum(-1) > 1).float().mean() > 0.5, "rows must tie at the top"
    p, index = ops.select_draft_topk(values, 1, platform=profile, scale=scale)
    assert torch.equal(index[:, 0].cpu(), first_max(values).cpu())
    if fast:
        assert torch.all(p == 1.0)
    p4, index4 = ops.select_draft_topk(values, 4, platform=profile, scale=scale)
    for row, idx in zip(up.cpu(), index4.cpu()):
        want = sorted(range(row.numel()), key=lambda i: (-row[i].item(), i))[:4]
        assert idx.tolist() == want


@pytest.mark.fp8
def test_live_platform_gate_matches_reality(seed):
    """If, on this machine, the argmax path and the softmax path disagree on tie-heavy FP8 input,
    the live profile must not allow the fast path."""
    profile = get_profile()
    disagree = False
    for dtype in profile.fp8_formats:
        values, scale = tie_heavy_fp8(dtype, seed, rows=256, vocab=4099)
        values, scale = values.to(profile.device), scale.to(profile.device)
        _, fast_index = ops.select_draft_topk(values, 1, platform=forced(profile, True), scale=scale)
        _, soft_index = ops.select_draft_topk(values, 1, platform=forced(profile, False), scale=scale)
        disagree |= not torch.equal(fast_index, soft_index)
    assert not (disagree and profile.argmax_fast_path), (
        f"profile {profile.name} allows the argmax fast path, but argmax and softmax+topk disagree on "
        f"tie-heavy FP8 logits here")


def test_fast_path_computes_no_softmax(monkeypatch):
    """The fast path must not call softmax at all (that is the optimisation)."""
    calls = []
    real = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    values, scale = tie_heavy_fp8("float8_e4m3fn", 1)
    ops.select_draft_topk(values, 1, platform=forced(get_profile("cpu"), True), scale=scale)
    assert calls == []
    ops.select_draft_topk(values, 1, platform=forced(get_profile("cpu"), False), scale=scale)
    assert calls == [1]


def test_rocm_profiles_keep_the_softmax_path():
    assert not get_profile("rocm-emulated").argmax_fast_path
    assert get_profile("cuda-emulated").argmax_fast_path
