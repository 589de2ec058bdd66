"""Both draft-selection paths on every platform profile, the tie contract on tie-heavy FP8 rows,
and the reality check that gates the argmax fast path."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specverify import dtypes, ops
from specverify.platform import available_profiles, get_profile
from specverify.conformance import strategies as S

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
    if not profile.supports_fp8(dtype):
        # A profile refuses an FP8 format it does not serve, as build_models and generate do.
        with pytest.raises(ValueError, match=f"not an FP8 format of platform profile '{profile_name}'"):
            ops.select_draft_topk(values, 1, platform=profile, scale=scale)
        return
    p, index = ops.select_draft_topk(values, 1, platform=profile, scale=scale)
    assert torch.equal(index[:, 0].cpu(), first_max(values).cpu())
    if fast:
        assert torch.all(p == 1.0)
    p4, index4 = ops.select_draft_topk(values, 4, platform=profile, scale=scale)
    for row, idx in zip(up.cpu(), index4.cpu()):
        want = sorted(range(row.numel()), key=lambda i: (-row[i].item(), i))[:4]
        assert idx.tolist() == want


# ------------------------------------------------------------------------------------------------
# The gate of the argmax fast path, held against what the shipped ops do on the live device.
#
# What the gate means. `argmax_fast_path` lets topk == 1 replace what engines ship,
# `torch.topk(torch.softmax(x, -1), 1)`, by `torch.argmax(x, -1)` (x the float32 upcast logits).
# The replacement is allowed on a device only if argmax there honours the tie contract
# (docs/semantics.md 3: the first maximal upcast logit) on the rows where it matters: tie-heavy FP8
# rows and ulp-adjacent float32 rows. Where the two shipped ops disagree, one of them breaks the
# contract, and the contract (computed here in plain Python on the CPU) says which:
#   - argmax wrong (the seed: ROCm's argmax on tie-heavy FP8 logits, GSM8K 0.975 -> 0.035): the
#     fast path would introduce the error -> the profile must NOT allow it;
#   - softmax+topk wrong (a float32 softmax merges 0.49999997 and 0.5 into one probability, and
#     torch.topk's order among equal values is unspecified): the fast path is the faithful one; that is the softmax path's own defect, which
#     specverify's softmax path avoids by ordering by the upcast logits (6.1). It does not forbid
#     the fast path.
# So: profile allows the fast path  =>  the device's argmax meets the contract on every probe row.
# The converse is not required (a profile may keep the softmax path by policy, as ROCm does).


@dataclasses.dataclass(frozen=True)
class GateFinding:
    rows: int
    disagree: int        # rows where argmax and softmax+topk differ
    argmax_wrong: int    # rows where argmax breaks the contract
    softmax_wrong: int   # rows where softmax+topk breaks the contract


def shipped_top1(up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two ops engines ship, nothing of specverify in between: (argmax, topk of softmax)."""
    fast = torch.argmax(up, dim=-1)
    soft = torch.topk(torch.softmax(up, dim=-1), 1, dim=-1).indices[:, 0]
    return fast, soft


def contract_top1(up: torch.Tensor) -> list[int]:
    """First maximal index of each row, in plain Python (no torch reduction)."""
    out = []
    for row in up.cpu().tolist():
        best = 0
        for i, x in enumerate(row):
            if x > row[best]:
                best = i
        out.append(best)
    return out


def gate_finding(fast: list[int], soft: list[int], contract: list[int]) -> GateFinding:
    return GateFinding(rows=len(contract),
                       disagree=sum(a != b for a, b in zip(fast, soft)),
                       argmax_wrong=sum(a != c for a, c in zip(fast, contract)),
                       softmax_wrong=sum(b != c for b, c in zip(soft, contract)))


def gate_consistent(allows_fast_path: bool, finding: GateFinding) -> bool:
    """The gate's meaning (above): allowing the fast path requires argmax to meet the contract."""
    return not allows_fast_path or finding.argmax_wrong == 0


def ulp_adjacent_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """float32 rows whose two largest logits are one ulp apart (or equal), placed at random
    positions, values below 1 in magnitude so that a float32 softmax merges them."""
    x = torch.rand((rows, vocab), generator=gen) * 2.0 - 1.5              # [-1.5, 0.5): below every top
    tops = torch.tensor([0.5, 0.75, 0.9, 0.3125], dtype=torch.float32)
    for r in range(rows):
        hi = tops[r % len(tops)]
        lo = torch.nextafter(hi, torch.tensor(-1.0)) if r % 5 else hi    # every 5th row: an exact tie
        i, j = torch.randperm(vocab, generator=gen)[:2].tolist()
        x[r, i], x[r, j] = lo, hi
    return x


def probe_rows(profile, seed: int) -> list[torch.Tensor]:
    """The upcast probe rows on the profile's device: tie-heavy FP8 rows of each of its formats
    and ulp-adjacent float32 rows."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for dtype in profile.fp8_formats:
        values, _ = tie_heavy_fp8(dtype, seed, rows=256, vocab=4099)
        out.append(values.to(profile.device).float())                     # the upcast, on the device
    out.append(ulp_adjacent_rows(gen, 256, 1031).to(profile.device))
    return out


@pytest.mark.fp8
def test_live_platform_gate_matches_reality(seed):
    """The live profile's `argmax_fast_path` against the shipped ops on its own device (CPU here,
    CUDA on a GPU runner): if torch.argmax breaks the tie contract on a tie-heavy FP8 or an
    ulp-adjacent float32 row there, the profile must not allow the fast path (meaning above).
    Deterministic: seeded rows, exact comparisons."""
    profile = get_profile()
    findings = []
    for up in probe_rows(profile, seed):
        # The rows are hard: most FP8 rows tie at the top; the float32 rows carry ulp-adjacent tops.
        top2 = up.topk(2, dim=-1).values
        assert ((top2[:, 0] == top2[:, 1]) | (torch.nextafter(top2[:, 1], top2[:, 0]) == top2[:, 0])).float().mean() > 0.5
        fast, soft = shipped_top1(up)
        findings.append(gate_finding(fast.cpu().tolist(), soft.cpu().tolist(), contract_top1(up)))
    assert all(gate_consistent(profile.argmax_fast_path, f) for f in findings), (
        f"profile {profile.name} (device {profile.device}) allows the argmax fast path, but torch.argmax breaks "
        f"the first-maximal-index contract here: {findings}")


def test_gate_check_fails_on_a_wrong_argmax():
    """The check above can fail: a (fake) device whose argmax picks a later tied index."""
    contract = [0, 3, 1]
    honest = gate_finding(fast=[0, 3, 1], soft=[0, 2, 1], contract=contract)    # softmax merged row 1
    assert honest == GateFinding(rows=3, disagree=1, argmax_wrong=0, softmax_wrong=1)
    assert gate_consistent(True, honest), "a softmax merge does not forbid the fast path"
    broken = gate_finding(fast=[0, 3, 2], soft=[0, 3, 1], contract=contract)    # argmax took a later tie
    assert broken.argmax_wrong == 1 and broken.disagree == 1
    assert not gate_consistent(True, broken)
    assert gate_consistent(False, broken), "a profile without the fast path is never contradicted"
    # contract_top1 is the first maximal index, ties included.
    assert contract_top1(torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [0.0, -1.0, 0.5]])) == [1, 0, 2]


def test_shipped_softmax_path_merges_ulp_adjacent_logits_on_the_cpu():
    """Why the gate is about argmax and not about agreement: on the CPU the shipped softmax merges
    ulp-adjacent logits (0.49999997 and 0.5 can get one probability) and topk then breaks the
    contract on some of the probe rows, while argmax does not. The CPU profile rightly allows the
    fast path. (Whether one given pair merges depends on the last bit of the CPU's vectorized exp,
    so the test counts over 256 probe rows instead of asserting one pair's equality; argmax
    compares the logits themselves and is exact everywhere.)"""
    up = torch.tensor([[0.49999997, 0.5, -1.0, -2.0]], dtype=torch.float32)
    assert torch.argmax(up, dim=-1).item() == 1
    rows = ulp_adjacent_rows(torch.Generator().manual_seed(3), 256, 1031)
    fast, soft = shipped_top1(rows)
    finding = gate_finding(fast.tolist(), soft.tolist(), contract_top1(rows))
    assert finding.argmax_wrong == 0 and finding.softmax_wrong > 0, finding
    assert gate_consistent(get_profile("cpu").argmax_fast_path, finding)


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


def test_draft_token_follows_the_gate(monkeypatch):
    """`ops.draft_token` (a chain draft's top-1, without its probability) takes the path the
    profile's gate allows: no softmax on the fast path, the softmax path where the gate is off,
    and the first maximal index of the upcast either way, on tie-heavy FP8 rows."""
    calls = []
    real = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    values, scale = tie_heavy_fp8("float8_e4m3fn", 2)
    fast = ops.draft_token(values, forced(get_profile("cpu"), True), scale)
    assert calls == []
    soft = ops.draft_token(values, forced(get_profile("cpu"), False), scale)
    assert calls == [1]
    assert fast.shape == soft.shape == (values.shape[0], 1) and fast.dtype == soft.dtype == torch.int64
    want = first_max(values).tolist()
    assert fast[:, 0].tolist() == want and soft[:, 0].tolist() == want


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "softmax-path"])
def test_draft_token_keeps_its_index_in_the_state_row_on_either_path(fast):
    """`ops.draft_token(..., keep=(column, rows))` writes row n's index to column[rows[n]] on the
    gate's either path (the softmax path is a ROCm profile's), on tie-heavy FP8 rows, and touches
    no other entry; a bad keep raises the same ValueError on either path."""
    values, scale = tie_heavy_fp8("float8_e4m3fn", 3)
    n = values.shape[0]
    table = torch.full((n + 3, 4), -7, dtype=torch.int64)
    rows = torch.arange(n + 2, 1, -1)[:n]                  # reversed, past the lanes' own indices
    profile = forced(get_profile("cpu"), fast)
    index = ops.draft_token(values, profile, scale, (table[:, 2], rows))
    want = torch.full((n + 3, 4), -7, dtype=torch.int64)
    want[rows, 2] = torch.tensor(first_max(values).tolist())
    assert index[:, 0].tolist() == first_max(values).tolist() and torch.equal(table, want)
    with pytest.raises(ValueError, match=rf"keep's rows must lie in \[0, {n + 3}\)"):
        ops.draft_token(values, profile, scale, (table[:, 2], rows + 3))
    with pytest.raises(ValueError, match=rf"keep's rows must be \[{n}\] int64"):
        ops.draft_token(values, profile, scale, (table[:, 2], rows.int()))
