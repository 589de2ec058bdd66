"""Draft steering: a test-side draft-model wrapper that makes acceptance a knob.

A draft head with random weights almost never agrees with the target, so acceptance would be
"never". Tests and benchmarks steer it towards the target's greedy continuation instead, with a
wrapper the engine sees as just another draft model (`forward(cache, batch, features, at=None)`); the engine
itself holds no oracle and no knob.

The oracle. `oracle [R, max_context + 1]` int64: row r is request r's prompt followed by the
target-only greedy continuation (the pre-run), -1 beyond what is known; the last column is always
-1. `steered_models` runs the pre-run with the optimized target-only decoder and enough budget for
the speculative run: `max_new_tokens + region + 1` tokens (capped by max_context), where
`region = max(num_draft_tokens, (num_steps - 1) * topk)` is what a cycle uses past the prefix.

The rule (`steer_logits`, applied to the compute-dtype logits before they are delivered in the
logits dtype). For a draft-head row whose input token `tau` sits at position `p` of request `r`
(`r` = `Batch.req_ids`, the request's index in the prompt list):

- the row is **on the oracle path** iff `oracle[r, p] == tau` and `oracle[r, p + 1] >= 0`
  (and `p + 1 <= max_context`); rows off the path are left unchanged;
- on the path, with `key = r * (max_context + 1) + p + 1` and `u = agreement_draw(seed, key)`
  (a deterministic 32-bit mixing hash, uniform in [0, 1)): if `u < agreement` the token
  `oracle[r, p + 1]` gets the logit `amax(row) + 8` (the unambiguous top choice), otherwise it
  gets `-inf` (never proposed).

A DFlash block row (docs/semantics.md 6.11) has the mask token `V` (= vocab_size, the logits' last
dimension) as its input: a row whose input token is `V` at position `p` is steered as if its input
were `oracle[r, p - 1]` at position `p - 1`, so it proposes the oracle's token at `p` with the
agreement drawn for `p`.

So `agreement = 1` is the always-right draft (a verify accepts `min(D, S + 1)` tokens per greedy
cycle), `0` the always-wrong one (1 token per cycle), and the same (request, position) meets the
same fate in every run. A row is steered on its own token only: no ancestor tracking, so a tree
node whose token happens to equal the oracle's at its position is steered too. The function is
pure torch on any float dtype and device, with no host syncs, so it runs inside captured CUDA
graphs; the reference speculative decoder applies the same function to its own logits.

On a GPU `SteeredDraft` runs the rule as two Triton kernels, `steer_logits_fused`, equal to the
tensor rule bit for bit (tests/test_draft_head.py, interpreted on the CPU; mutants in
tests/mutants/steering.toml). The tensor rule is some 30 small kernels per draft forward: with it
the benchmarked EAGLE S3 k1 cycle took 0.899 ms on an H100, with one kernel 0.629 ms (the same engine
and target step; issue 25). That time was the knob's, not the engine's. The kernels steer the
head's fresh logits in place: one program per (row, block of STEER_BLOCK logits) for the parts of
each row's maximum, then one program per row merges them and stores its one entry. (A first form
copied every row, ~18 us a draft forward on an H100, step_anatomy.py; the next, one program per
row walking the whole vocabulary, cost the steered k1 cycle 61-72 us on an H100, host_gap.py.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch
import triton
import triton.language as tl

from specverify.kernels.rounding import bfloat16_nearest_even
from specverify.models.layers import lane_rows

PEAK_MARGIN = 8.0   # logit margin that makes the steered token the unambiguous top choice
_MARGIN = tl.constexpr(PEAK_MARGIN)
STEER_BLOCK = 2048  # vocabulary entries per program of the fused steering's max pass
STEER_WARPS = 4

_M32 = 0xFFFFFFFF


def check_agreement(agreement) -> float:
    """`agreement` as a float in [0, 1], or a ValueError naming the argument and the bound."""
    if isinstance(agreement, bool) or not isinstance(agreement, (int, float)) or math.isnan(agreement) \
            or not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement must be a number in [0, 1], got {agreement!r}")
    return float(agreement)


def agreement_draw(seed: int, keys: torch.Tensor) -> torch.Tensor:
    """Deterministic uniform in [0, 1) per int64 key (a small 32-bit mixing hash); float64."""
    x = (keys.to(torch.int64) * 0x9E3779B1 + (seed & 0x7FFF) * 0x632BE5AB) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    return x.to(torch.float64) / 2.0 ** 32


def steering_plan(oracle: torch.Tensor, agreement: float, seed: int) -> torch.Tensor:
    """The rule's per-(request, position) decisions, computed once: [R, max_context + 1] int64,
    entry p of row r = the token oracle[r, p + 1] to steer to (agreement drawn), or -2 - that token
    (steered to -inf), or -1 (the next token is unknown: the row is left alone)."""
    agreement = check_agreement(agreement)
    reqs, width = oracle.shape
    ctx = width - 1
    r = torch.arange(reqs, device=oracle.device)[:, None]
    p = torch.arange(width, device=oracle.device)[None, :]
    nxt = torch.cat([oracle[:, 1:], torch.full_like(oracle[:, :1], -1)], 1)      # oracle[r, p + 1]
    agree = agreement_draw(seed, r * (ctx + 1) + p + 1) < agreement
    return torch.where(nxt < 0, -1, torch.where(agree, nxt, -2 - nxt))


def _request_of_each_row(req_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """req_ids broadcast from the left to positions' shape (a view: [bs] ids for [bs, q] rows)."""
    return req_ids.reshape(tuple(req_ids.shape) + (1,) * (positions.dim() - req_ids.dim())).expand_as(positions)


def steer_logits(logits: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor,
                 oracle: torch.Tensor, agreement: float, seed: int, plan: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the steering rule of the module docstring; returns new logits (same dtype, device).

    logits: [..., V] float; positions, tokens: [...] int64 (one per logits row);
    req_ids: int64, broadcastable to positions from the left ([bs] for [bs, q] rows, or the
    same shape); oracle: [R, max_context + 1] int64 on the logits' device; plan: the
    `steering_plan` of (oracle, agreement, seed), when the caller keeps it (a captured draft
    forward then runs a few gathers instead of the hash).
    """
    if plan is None:
        plan = steering_plan(oracle, agreement, seed)
    ctx = oracle.shape[1] - 1
    r = _request_of_each_row(req_ids, positions)
    # A DFlash block row (input: the mask id V at position p) is keyed on the oracle's token at p - 1.
    block_row = tokens == logits.shape[-1]
    positions = torch.where(block_row, positions - 1, positions)
    tokens = torch.where(block_row, oracle[r, positions.clamp(0, ctx)], tokens)
    p = positions.clamp(0, ctx)
    decided = plan[r, p]
    on = (oracle[r, p] == tokens) & (decided != -1) & (positions >= 0) & (positions < ctx)
    agree = decided >= 0
    nxt = torch.where(agree, decided, -2 - decided).clamp(min=0)
    # One full pass for the row maxima and one copy; the steered entries (one per row) are then
    # written in place, so a captured draft forward pays little for the knob.
    peak = logits.amax(-1) + PEAK_MARGIN
    value = torch.where(agree, peak, torch.full_like(peak, float("-inf")))
    out = logits.clone(memory_format=torch.contiguous_format)
    flat = out.view(-1, out.shape[-1])
    rows = torch.arange(flat.shape[0], device=logits.device)
    cols = nxt.reshape(-1)
    flat[rows, cols] = torch.where(on.reshape(-1), value.reshape(-1).to(flat.dtype), flat[rows, cols])
    return out


@triton.jit
def _steer_max_kernel(logits_ptr, top_ptr, nan_ptr, s_lr, VOCAB: tl.constexpr, BLOCK: tl.constexpr,
                      WIDE: tl.constexpr):
    """Program (row, blk): the maximum of block blk of the row's logits with NaN left out, and
    whether the block holds a NaN (the row maximum's parts; `_steer_store_kernel` merges them)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    acc_dtype = tl.float64 if WIDE else tl.float32
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * s_lr + cols, mask=cols < VOCAB, other=float("-inf")).to(acc_dtype)
    part = row * tl.num_programs(1) + blk
    tl.store(top_ptr + part, tl.max(tl.where(x != x, float("-inf"), x)))
    tl.store(nan_ptr + part, tl.sum((x != x).to(tl.int32)))


@triton.jit
def _steer_store_kernel(logits_ptr, top_ptr, nan_ptr, req_ptr, pos_ptr, tok_ptr, lanes_ptr, oracle_ptr, plan_ptr,
                        q, ctx, s_lr, s_rb, s_rq, s_pb, s_pq, s_tb, s_tq, s_lane, s_oracle, s_plan,
                        VOCAB: tl.constexpr, BLOCKS: tl.constexpr, SPAN: tl.constexpr, TO_BF16: tl.constexpr,
                        LANES: tl.constexpr):
    """One program per logits row: `steer_logits`'s rule for that row, in place, from the row
    maximum's BLOCKS parts (NaN propagating as amax does); the one steered entry is stored, the
    row's other entries are never written. LANES: logits row b is lane lanes[b] of request b (a
    draft-extend's one row per request)."""
    row = tl.program_id(0)
    if LANES:
        b = row
        j = tl.load(lanes_ptr + b * s_lane)
    else:
        b = row // q
        j = row % q
    r = tl.load(req_ptr + b * s_rb + j * s_rq)
    pos = tl.load(pos_ptr + b * s_pb + j * s_pq)
    tok = tl.load(tok_ptr + b * s_tb + j * s_tq)
    block_row = tok == VOCAB                       # a DFlash block row: keyed on the oracle at p - 1
    pos = tl.where(block_row, pos - 1, pos)
    p = tl.minimum(tl.maximum(pos, 0), ctx)
    known = tl.load(oracle_ptr + r * s_oracle + p)
    tok = tl.where(block_row, known, tok)
    decided = tl.load(plan_ptr + r * s_plan + p)
    on = (known == tok) & (decided != -1) & (pos >= 0) & (pos < ctx)
    agree = decided >= 0
    nxt = tl.maximum(tl.where(agree, decided, -2 - decided), 0)
    blocks = tl.arange(0, SPAN)
    parts = row * BLOCKS + blocks
    top = tl.max(tl.load(top_ptr + parts, mask=blocks < BLOCKS, other=float("-inf")))
    nans = tl.sum(tl.load(nan_ptr + parts, mask=blocks < BLOCKS, other=0))
    peak = tl.where(nans > 0, float("nan"), top + _MARGIN)
    if TO_BF16:    # to nearest even by the bits (the interpreter's own float32 -> bfloat16 truncates)
        peak = bfloat16_nearest_even(peak).to(tl.float32)
    value = tl.where(agree, peak, float("-inf")).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * s_lr + nxt, value, mask=on)


def steer_logits_fused(logits: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor,
                       oracle: torch.Tensor, plan: torch.Tensor, *, in_place: bool = False,
                       lanes: torch.Tensor | None = None) -> torch.Tensor:
    """`steer_logits` (same arguments, the plan given) in two Triton kernels: what a steered draft
    forward costs on a GPU, where the tensor rule is some 30 small kernels that a benchmark would
    otherwise charge to the engine. positions / tokens: [bs, q] or [n];
    req_ids: [bs] or positions' shape; logits: positions' shape + [V].

    in_place: steer `logits` itself (contiguous; a steered draft's own fresh logits) and return
    it; otherwise a contiguous copy is steered, as the tensor rule returns one.
    lanes: [bs] int64, logits [bs, 1, V] are the rows of lane lanes[b] of positions / tokens
    [bs, q] (a draft head's forward `at`): the rule of `steer_logits` on positions / tokens
    gathered at the lanes, without the gathers."""
    if positions.dim() == 1:
        positions, tokens = positions[:, None], tokens[:, None]
    if lanes is not None and (lanes.dtype != torch.int64 or lanes.shape != positions.shape[:1]
                              or logits.shape[:-1] != (positions.shape[0], 1)):
        raise ValueError(f"lanes must be int64 [{positions.shape[0]}] with logits [{positions.shape[0]}, 1, V], got "
                         f"lanes {lanes.dtype} {tuple(lanes.shape)}, logits {tuple(logits.shape)}")
    r = _request_of_each_row(req_ids, positions)
    if in_place and not logits.is_contiguous():
        raise ValueError(f"steer_logits_fused(in_place=True) needs contiguous logits, got strides {logits.stride()}")
    out = logits if in_place else logits.clone(memory_format=torch.contiguous_format)
    vocab = out.shape[-1]
    flat = out.view(-1, vocab)
    rows, blocks = flat.shape[0], triton.cdiv(vocab, STEER_BLOCK)
    if rows:
        wide = out.dtype == torch.float64
        top = torch.empty((rows, blocks), dtype=torch.float64 if wide else torch.float32, device=out.device)
        nans = torch.empty((rows, blocks), dtype=torch.int32, device=out.device)
        _steer_max_kernel[(rows, blocks)](flat, top, nans, flat.stride(0), VOCAB=vocab, BLOCK=STEER_BLOCK, WIDE=wide,
                                          num_warps=STEER_WARPS)
        _steer_store_kernel[(rows,)](
            flat, top, nans, r, positions, tokens, positions if lanes is None else lanes, oracle, plan,
            positions.shape[1], oracle.shape[1] - 1,
            flat.stride(0), *r.stride(), *positions.stride(), *tokens.stride(), 0 if lanes is None else lanes.stride(0),
            oracle.stride(0), plan.stride(0),
            VOCAB=vocab, BLOCKS=blocks, SPAN=triton.next_power_of_2(blocks), TO_BF16=out.dtype == torch.bfloat16,
            LANES=lanes is not None, num_warps=1)
    return out


class SteeredDraft:
    """A draft model that steers `inner` (a `DraftHead`, or anything with `compute_logits` and
    `deliver`) by `steer_logits` with a fixed oracle. Same `forward` interface as the head."""

    def __init__(self, inner, oracle: torch.Tensor, agreement: float, seed: int, *, fused: bool | None = None):
        """fused: steer by the one-kernel `steer_logits_fused` (None: on CUDA; True on the CPU runs
        it interpreted, as the tests do to check the wiring a GPU runs) or by the tensor rule."""
        self.agreement = check_agreement(agreement)
        self.fused = fused
        if oracle.dtype != torch.int64 or oracle.dim() != 2:
            raise ValueError(f"oracle must be an int64 [requests, max_context + 1] tensor, got "
                             f"{oracle.dtype} {tuple(oracle.shape)}")
        self.inner = inner
        self.seed = int(seed)
        self.oracle = oracle.to(inner.device)
        self.plan = steering_plan(self.oracle, self.agreement, self.seed)

    @property
    def config(self):
        return self.inner.config

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def compute_logits(self, cache, batch, features, *, at=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's `compute_logits` (`at`: its one lane per request), steered."""
        if batch.req_ids is None:
            raise ValueError("SteeredDraft needs Batch.req_ids (the engine fills it in every draft call)")
        logits, hidden = self.inner.compute_logits(cache, batch, features, at=at)
        fused = logits.is_cuda if self.fused is None else self.fused
        if fused:                   # two kernels, in place: the knob should cost a benchmark next to nothing
            return steer_logits_fused(logits, batch.req_ids, batch.positions, batch.input_ids, self.oracle,
                                      self.plan, in_place=logits.is_contiguous(), lanes=at), hidden
        positions, tokens = batch.positions, batch.input_ids
        if at is not None:          # the rows the logits are of
            positions, tokens = lane_rows(positions, at), lane_rows(tokens, at)
        return steer_logits(logits, batch.req_ids, positions, tokens, self.oracle,
                            self.agreement, self.seed, plan=self.plan), hidden

    def deliver(self, logits: torch.Tensor, hidden: torch.Tensor):
        return self.inner.deliver(logits, hidden)

    def hidden_states(self, cache, batch, features) -> torch.Tensor:
        return self.inner.hidden_states(cache, batch, features)      # no logits, nothing to steer

    def context_input(self, cache, batch, features):
        return self.inner.context_input(cache, batch, features)

    def write_kv(self, cache, batch, features, *, context=None) -> None:
        self.inner.write_kv(cache, batch, features, context=context)   # no logits, nothing to steer

    def forward(self, cache, batch, features, *, at=None):
        return self.deliver(*self.compute_logits(cache, batch, features, at=at))


def draft_region(spec) -> int:
    """Cache entries past the prefix that one speculative cycle of `spec` uses."""
    return max(spec.draft_tokens, (spec.num_steps - 1) * spec.topk)


def lookahead(models, prompts, max_new_tokens, spec) -> list[int]:
    """Per request, the tokens of the pre-run: max_new_tokens + region + 1, capped by max_context.

    spec: a SpecConfig, or several (the largest region counts)."""
    specs = [spec] if hasattr(spec, "topk") else list(spec)
    region = max(draft_region(s) for s in specs)
    budgets = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    ctx = models.config.max_context
    return [min(int(n) + region + 1, ctx - len(p)) for p, n in zip(prompts, budgets)]


def oracle_sequences(models, prompts: Sequence[Sequence[int]], budgets: Sequence[int]) -> torch.Tensor:
    """[len(prompts), max_context + 1] int64: prompt + the target-only greedy continuation of
    `budgets[r]` tokens (the optimized decoder's pre-run), -1 beyond."""
    import specverify

    # Run each distinct request once, all in one batch. Its greedy tokens are a run's where the
    # target's matmuls round alike at every row count: true of every CPU path here and in the H100s'
    # runs, not of cuBLAS on an H200 at the medium preset (`oracle_of_outputs`).
    jobs = sorted({(tuple(int(t) for t in p), int(n)) for p, n in zip(prompts, budgets) if n >= 1})
    done = {}
    if jobs:
        out = specverify.generate(models, [list(p) for p, _ in jobs], max_new_tokens=[n for _, n in jobs])
        done = dict(zip(jobs, out.tokens))
    outputs = [done.get((tuple(int(t) for t in p), int(n)), []) for p, n in zip(prompts, budgets)]
    empty = torch.full((len(prompts), models.config.max_context + 1), -1, dtype=torch.int64)
    return oracle_of_outputs(empty, prompts, outputs)


def oracle_of_outputs(oracle: torch.Tensor, prompts: Sequence[Sequence[int]],
                      outputs: Sequence[Sequence[int]]) -> torch.Tensor:
    """`oracle` with row r, for each r < len(outputs), replaced by prompt r + output r and -1
    beyond: the oracle of a run's own greedy tokens.

    A run leaves its pre-run's oracle where its target rounds otherwise than the pre-run's
    (another row count: bench_device_cycle.run_on_path); its drafts are then never steered again.
    Steered by this oracle, the same run stays on it. A new tensor; ValueError when there are
    more outputs than rows, or when a prompt and its output do not fit before the last column."""
    if len(outputs) > oracle.shape[0] or len(prompts) < len(outputs):
        raise ValueError(f"outputs: {len(outputs)} of them, for an oracle of {oracle.shape[0]} rows and "
                         f"{len(prompts)} prompts")
    out = oracle.clone()
    for r, (p, toks) in enumerate(zip(prompts, outputs)):
        seq = [int(t) for t in p] + [int(t) for t in toks]
        if len(seq) >= oracle.shape[1]:
            raise ValueError(f"outputs[{r}]: prompt + output is {len(seq)} tokens, the oracle holds at most "
                             f"{oracle.shape[1] - 1} before its last column")
        out[r] = -1
        out[r, :len(seq)] = torch.tensor(seq, dtype=torch.int64)
    return out


def follows_oracle(oracle: torch.Tensor, prompts: Sequence[Sequence[int]],
                   outputs: Sequence[Sequence[int]]) -> bool:
    """Whether every output r is exactly its oracle row's continuation of prompt r."""
    return all(oracle[r, len(p):len(p) + len(toks)].tolist() == [int(t) for t in toks]
               for r, (p, toks) in enumerate(zip(prompts, outputs)))


def steered_models(models, prompts, max_new_tokens, *, agreement: float, spec, seed: int | None = None,
                   oracle: torch.Tensor | None = None):
    """`models` with its drafts wrapped in `SteeredDraft`s for this workload: the EAGLE head, every
    MTP head and the DFlash head (one oracle, agreement and seed for all).

    Runs the target-only greedy pre-run (unless `oracle` is given, e.g. from a cache) with the
    budget of `lookahead`. seed: the agreement hash seed (default: the models' seed). A draft
    that is already steered is replaced, not wrapped twice."""
    agreement = check_agreement(agreement)
    if oracle is None:
        oracle = oracle_sequences(models, prompts, lookahead(models, prompts, max_new_tokens, spec))
    seed = models.seed if seed is None else seed

    def steer(head):
        inner = head.inner if isinstance(head, SteeredDraft) else head
        return SteeredDraft(inner, oracle, agreement, seed)

    dflash = None if models.dflash is None else steer(models.dflash)
    return dataclasses.replace(models, draft=steer(models.draft), mtp=[steer(h) for h in models.mtp], dflash=dflash)
