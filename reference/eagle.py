"""A cache-free reference speculative decoder, EAGLE (docs/semantics.md 6.5), MTP (6.10) and DFlash
(6.11), with its trace.

Everything is recomputed from token lists in float64 at every cycle; nothing is cached between
forwards. One request at a time:

- **target**: `reference.model.forward` over the whole sequence gives the root's logits and the
  hidden states h_t (before the final norm) that feed the draft head; a tree node's logits are
  the last row of the forward over the sequence + the tokens on its path (position L + depth);
- **draft head**: its own float64 forward (`draft_row`) over the master weights
  `models.draft_weights`, sharing the target's `embed` and `lm_head`. The draft "sequence" of a
  request whose tokens are x_0..x_n is the rows (x_t, h_{t-1}) at position t, t = 1..n; a tree
  beam of step i >= 1 is one more row (its token, the draft hidden of its parent's row, position
  n + i) after the rows of its ancestor beams, and it sees all of them and itself;
- **MTP** (6.10, `algorithm="mtp"`): one head per draft step, head j with its own masters
  `models.mtp_weights[j]` (the EAGLE head's network). Each head's context is the same
  draft-extend rows (x_t, h_{t-1}, t), t = 1..n; step 0 is head 0's root row, step i >= 1 head
  i's row (d_i, the hidden of the row that produced d_i, n + i) over head i's context rows and
  itself. A chain (topk 1);
- **DFlash** (6.11, `algorithm="dflash"`): the head `models.dflash_weights`, whose token table is
  the target's `embed` plus `mask_embed` as id vocab_size. The context rows give g, the hidden of
  the root's row; the B - 1 block rows (mask, g, n + i) each see all context rows and all block
  rows (`draft_row(..., query=...)`: any row of the list can be the query). A chain; the greedy
  verify also runs `reference/dflash.py`'s block op, which must agree with the chain walk;
- **selection / tree / verify**: 6.1 (top-k of the upcast logits, float64 softmax of the
  dequantized row as p, float32 for the scores), 6.2 (beams chosen step by step), 6.3 / 6.4 with
  the explicit uniforms of 6.5; EOS / max_new_tokens cut as section 5;
- **penalties** (section 7): a target row is penalized by the prompt and the output its logits
  follow: the tokens emitted before the cycle and, for a tree node, the drafts on the walk's path
  down to it (the walk is the path: a node's row is computed when the walk reaches it). The draft
  head is never penalized.

The trace of a request is one `CycleTrace` per speculative cycle: the tree's tokens and parents,
the accepted nodes, the tokens emitted (after the cut). Every decision is also audited for how
far it is from flipping (its margin); a decision that could flip under the rounding differences
of a float64 optimized decoder is a **near-tie**, recorded with the cycle whose trace it shapes.
A test compares traces only up to a request's first near-tie.

Margins and thresholds (the optimized decoder is assumed to compute in float64 too):

- **Logits** (float64, then converted to the logits dtype): a float64 forward computed in another
  order (paged cache, batched matmuls, masked softmax) differs from this one by ~1e-14 of the
  row's scale. `REL_LOGIT = 1e-10` leaves four orders of magnitude on top and is still far below
  a float32 ulp (6e-8), so a converted logit is rarely in doubt. Every logit is widened to
  [z - d, z + d], d = REL_LOGIT * max|finite z| (the per-row FP8 scale with it: both scales of the
  widened row max), converted at the interval's ends (conversion is monotone); an order
  decision (greedy token, draft top-k) is a near-tie unless it comes out the same for every
  value in the intervals. Equal float64 values are structural ties (the index rule decides them
  the same way on both sides), not near-ties.
- **Sampling probabilities** (float64 from the dequantized logits): when the widened logits
  convert to dequantized values that differ by up to `w`, every probability of a (filtered,
  renormalized) softmax at temperature T moves by a factor within exp(+-2w/T); with float64
  rounding on top, relative uncertainty `eps = expm1(2w/T) + REL_PROB`, REL_PROB = 1e-10. A sum
  of probabilities compared with a constant (u < acc, top-p mass) needs a relative gap > eps; two
  probabilities compared with each other (top-k boundary, min-p threshold, the inverse-CDF
  draw) need > 2 eps.
- **Penalized rows**: the penalties are monotone in each logit, so a penalized interval is the
  penalties of the dequantized interval's ends; the greedy rule over penalized values is a near-tie
  unless its winner stays first over those intervals (equal logits with the same penalties are
  structural ties). A repetition penalty r stretches a spread of dequantized values by at most
  max(r, 1/r), and the sampling uncertainty above uses the stretched width.
- **Draft probabilities and scores**: the optimized decoder takes draft p from a float32
  softmax, which differs from the float64 softmax rounded to float32 by up to V * 2^-24
  (~2.3e-5 for the tiny vocab of 389; 1.3e-6 measured on random rows). `REL_DRAFT_P = 3e-5` per
  factor (plus expm1(2w) from the conversion); a score with m factors has uncertainty m times
  that, and two scores compared need a relative gap above the sum of theirs. Exactly equal
  float32 scores are structural ties (flat index decides).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch

from reference.dflash import dflash_correct_drafts_and_bonus
from reference.logits import FP8_FORMATS, convert_logits, row_scale
from reference.model import forward, rmsnorm, rope, silu
from reference.sampling import (
    apply_penalties,
    check_penalties,
    counter_uniform,
    draw,
    filtered_probs,
    first_max_index,
    order_desc,
    penalties_active,
    softmax,
)
from reference.spec import topk_order
from reference.generate import MIN_TEMPERATURE

F64 = torch.float64

REL_LOGIT = 1e-10
REL_PROB = 1e-10
REL_DRAFT_P = 3e-5


# ---------------------------------------------------------------------------------------------
# outputs


@dataclass(frozen=True)
class NearTie:
    cycle: int        # the cycle whose trace the decision shapes; -1: the prefill token
    decision: str     # prefill | draft_topk | beam | keep | target_greedy | filter | accept | bonus
                      # (reference/naive_eagle.py adds draft_draw | residual)
    detail: str       # where, in words
    margin: float     # the decision's relative gap
    tolerance: float  # what the gap had to exceed (0 for interval tests on converted logits)

    def __str__(self) -> str:
        return f"cycle {self.cycle} {self.decision} ({self.detail}): margin {self.margin:.3g} <= {self.tolerance:.3g}"


@dataclass
class CycleTrace:
    tree_tokens: list     # [D] root first
    tree_parents: list    # [D] -1 for the root and orphans
    accepted: list        # [S+1] accepted node indices, root first, padded with -1
    emitted: list         # tokens emitted this cycle, after the EOS / max_new_tokens cut
    margins: dict = field(default_factory=dict)   # decision kind -> smallest margin this cycle


@dataclass
class RequestTrace:
    tokens: list                                      # every emitted token, the prefill token first
    cycles: list = field(default_factory=list)        # [CycleTrace]
    near_ties: list = field(default_factory=list)     # [NearTie], in decision order

    @property
    def first_near_tie(self) -> int | None:
        """The first cycle a near-tie shapes (-1: the prefill token), or None."""
        return min((t.cycle for t in self.near_ties), default=None)


@dataclass
class SpecReferenceOutput:
    tokens: list   # list[list[int]] per request
    traces: list   # list[RequestTrace] per request


# ---------------------------------------------------------------------------------------------
# logits rows: conversion, its uncertainty interval, ordered selection


@dataclass(frozen=True)
class _StaticScale:
    """A config-like object that converts with one fixed FP8 scale."""
    logits_dtype: str
    logits_scale: float
    logits_scale_mode: str = "static"


@dataclass
class _Row:
    z: np.ndarray          # [V] float64 logits as computed
    upcast: np.ndarray     # [V] float32, what orders compare
    dequant: np.ndarray    # [V] float64, what probabilities read
    lo: np.ndarray         # [V] smallest upcast value within the uncertainty interval
    hi: np.ndarray         # [V] largest
    width: float           # largest spread of a dequantized value over the interval
    scale: float           # |finite z| max (1 if none): the unit of logit margins
    dlo: np.ndarray        # [V] smallest dequantized value within the uncertainty interval
    dhi: np.ndarray        # [V] largest


def _row(config, z) -> _Row:
    z = np.asarray(torch.as_tensor(z, dtype=F64).cpu().numpy(), dtype=np.float64)
    finite = np.isfinite(z)
    big = float(np.abs(z[finite]).max()) if finite.any() else 0.0
    d = REL_LOGIT * big
    nominal = convert_logits(config, z)
    if config.logits_dtype in FP8_FORMATS:
        if config.logits_scale_mode == "per_row":
            # the scale follows the row's largest |logit|, itself uncertain by d
            scales = {float(row_scale(np.array([m], dtype=np.float32), config.logits_dtype))
                      for m in (big - d, big + d)}
        else:
            scales = {float(np.float32(config.logits_scale))}
        convs = [convert_logits(_StaticScale(config.logits_dtype, s), z + e) for s in scales for e in (-d, d)]
    else:
        convs = [convert_logits(config, z + e) for e in (-d, d)]
    convs.append(nominal)
    ups = np.stack([c.upcast for c in convs])
    deq = np.stack([c.dequant for c in convs])
    with np.errstate(invalid="ignore"):   # -inf - -inf where a draft row was steered to -inf
        spread = np.where(np.isfinite(deq).all(0), deq.max(0) - deq.min(0), 0.0)
    return _Row(z, nominal.upcast, nominal.dequant, ups.min(0), ups.max(0), float(spread.max()), big or 1.0,
                deq.min(0), deq.max(0))


def _before(row: _Row, a: int, b) -> tuple[np.ndarray, np.ndarray]:
    """Does `a` stay ordered before each of `b` (int array) over the whole interval?
    Returns (stable [len(b)] bool, relative float64 gap [len(b)])."""
    b = np.asarray(b, dtype=np.int64)
    structural = row.z[b] == row.z[a]
    stable = structural | (row.lo[a] > row.hi[b]) | ((row.lo[a] == row.hi[b]) & (a < b))
    with np.errstate(invalid="ignore"):
        gap = (row.z[a] - row.z[b]) / row.scale
    return stable, np.where(structural, np.inf, gap)


def _ordered(row: _Row, k: int) -> tuple[list[int], bool, float]:
    """The first k indices in the order (upcast value descending, index ascending); whether that
    selection and order is stable over the interval; the smallest relative gap that decides it."""
    order = topk_order(row.upcast, k)
    stable, margin = True, math.inf
    for i in range(k - 1):
        s, g = _before(row, order[i], [order[i + 1]])
        stable, margin = stable and bool(s[0]), min(margin, float(g[0]))
    rest = np.setdiff1d(np.arange(len(row.z)), order)
    if len(rest):
        s, g = _before(row, order[-1], rest)
        stable, margin = stable and bool(s.all()), min(margin, float(g.min()))
    return order, stable, margin


# ---------------------------------------------------------------------------------------------
# the draft head, cache-free


def draft_row(config, target_w: dict, draft_w: dict, tokens: list, features: torch.Tensor, positions: list,
              query: int = -1):
    """The draft head over a list of rows; returns row `query`'s (logits [V], hidden [H]), float64
    (default: the last row).

    Row t is (tokens[t], features[t] [H], positions[t]); the query row attends to every row of the
    list, itself included (callers list exactly what the row sees: for EAGLE and MTP the query is
    the last row and the list is causal; a DFlash block row sees rows after it too). The head has
    one layer, so a row's K/V depend on that row's input only. hidden is the residual stream before
    the final norm. A head whose masters hold `mask_embed` (DFlash) has one more token: id
    vocab_size embeds as mask_embed.
    """
    def w(name):
        return draft_w[name].to(device="cpu", dtype=F64)

    eps, nh, nkv, hd = config.norm_eps, config.num_heads, config.num_kv_heads, config.head_dim
    embed = target_w["embed"].to(dtype=F64)
    if "mask_embed" in draft_w:
        embed = torch.cat([embed, w("mask_embed")[None, :]], dim=0)                 # [V + 1, H]
    x = torch.cat([embed[list(tokens)], features.to(F64)], dim=1) @ w("fc")        # [T, H]
    n = rmsnorm(x, w("layer.attn_norm"), eps)
    q = n[[query]] @ w("layer.wq")                                                  # [1, nh*hd]
    k = n @ w("layer.wk")                                                           # [T, nkv*hd]
    v = n @ w("layer.wv")
    heads = []
    for g in range(nh):
        kvh = g // (nh // nkv)
        q_g = rope(q[:, g * hd:(g + 1) * hd], [positions[query]], config.rope_theta)[0]  # [hd]
        k_g = rope(k[:, kvh * hd:(kvh + 1) * hd], positions, config.rope_theta)       # [T, hd]
        probs = torch.softmax(k_g @ q_g / math.sqrt(hd), dim=0)                       # [T]
        heads.append(probs @ v[:, kvh * hd:(kvh + 1) * hd])
    h = x[query] + torch.cat(heads) @ w("layer.wo")                                # [H]
    m = rmsnorm(h[None], w("layer.mlp_norm"), eps)
    h = h + ((silu(m @ w("layer.w_gate")) * (m @ w("layer.w_up"))) @ w("layer.w_down"))[0]
    logits = rmsnorm(h[None], w("final_norm"), eps)[0] @ target_w["lm_head"].to(dtype=F64)
    return logits, h


# ---------------------------------------------------------------------------------------------
# the decoder


@dataclass
class _Params:
    k: int
    S: int
    D: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    eos: int | None
    hook: object
    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    algorithm: str = "eagle"     # eagle | mtp | dflash (docs/semantics.md 6.5, 6.10, 6.11)

    @property
    def penalized(self) -> bool:
        return penalties_active(self.repetition, self.frequency, self.presence)

    def penalize(self, z, context) -> list:
        """Section 7 on a dequantized row; context = (prompt tokens, output tokens so far)."""
        return apply_penalties(z, context[0], context[1], self.repetition, self.frequency, self.presence)


@dataclass
class _Cand:
    flat: int
    score: np.float32     # float32 product of draft probabilities along the path
    unc: float            # its relative uncertainty
    token: int
    parent_flat: int      # -1: a step-0 candidate (its parent is the root)
    feature: torch.Tensor  # the draft hidden of the row that proposed it (its feature if it becomes a beam)
    path_rows: list       # (token, feature, position) of the beams on its path, before it


class _Audit:
    """Collects the margins and near-ties of one request."""

    def __init__(self, trace: RequestTrace):
        self.trace, self.cycle, self.margins = trace, -1, {}

    def note(self, decision: str, detail: str, margin: float, tolerance: float, stable: bool | None = None):
        if stable is None:
            stable = margin > tolerance
        self.margins[decision] = min(self.margins.get(decision, math.inf), margin)
        if not stable:
            self.trace.near_ties.append(NearTie(self.cycle, decision, detail, margin, tolerance))


def _desc(c: _Cand) -> tuple:
    return (-float(c.score), c.flat)


def _audit_order(audit: _Audit, decision: str, ranked: list, n: int, keep_order: bool) -> None:
    """Candidates ranked by (score desc, flat asc): is the choice of the first n (and their order,
    if keep_order) stable under the scores' uncertainty?"""
    pairs = [(ranked[i], ranked[i + 1]) for i in range(n - 1)] if keep_order else []
    if n < len(ranked):
        pairs += [(ranked[n - 1], c) for c in ranked[n:]]
    for a, b in pairs:
        if a.score == b.score:
            continue   # structural tie: the flat index decides on both sides
        gap = float(a.score - b.score) / float(max(a.score, b.score))
        audit.note(decision, f"flat {a.flat} before {b.flat}", gap, a.unc + b.unc)


def _penalized_greedy(row: _Row, prm: _Params, context) -> tuple[int, bool, float]:
    """Greedy over the penalized dequantized row (section 7): (token, whether every value in the
    penalized intervals keeps it first, the smallest relative gap to another token)."""
    nominal, lo, hi = (prm.penalize(values, context) for values in (row.dequant, row.dlo, row.dhi))
    a = first_max_index(nominal)
    counts = {}
    for t in context[1]:
        counts[t] = counts.get(t, 0) + 1
    prompt = set(context[0])
    stable, margin = True, math.inf
    for b in range(len(nominal)):
        same_penalty = (b in prompt) == (a in prompt) and counts.get(b, 0) == counts.get(a, 0)
        if b == a or (row.z[b] == row.z[a] and same_penalty):
            continue   # structural: equal values on both sides, the index decides
        stable = stable and (lo[a] > hi[b] or (lo[a] == hi[b] and a < b))
        with np.errstate(invalid="ignore"):
            margin = min(margin, float((nominal[a] - nominal[b]) / row.scale))
    return a, stable, margin


def _select(audit: _Audit, cfg, prm: _Params, z: torch.Tensor, where: str):
    """6.1 on one draft logits row: (tokens [k], p [k] float32, uncertainty of each p)."""
    row = _row(cfg, z)
    order, stable, margin = _ordered(row, prm.k)
    audit.note("draft_topk", where, margin, 0.0, stable)
    probs = softmax([float(x) for x in row.dequant])
    return order, [np.float32(probs[i]) for i in order], REL_DRAFT_P + math.expm1(2 * row.width)


def _draft_runner(models, prm: _Params, r: int, weights: dict | None = None):
    """A draft head of request r over a list of (token, feature, position) rows, the hook applied
    to its logits: (rows, query=-1) -> (row `query`'s logits [V], its hidden [H]), float64.
    weights: the head's float64 masters (default `models.draft_weights`, the EAGLE head). The hook
    sees the query row's token and position (a DFlash block row: the mask id vocab_size)."""
    cfg, tw = models.config, models.target_weights
    dw = models.draft_weights if weights is None else weights

    def run(rows, query: int = -1):
        tokens, positions = [t for t, _, _ in rows], [p for _, _, p in rows]
        logits, h = draft_row(cfg, tw, dw, tokens, torch.stack([f for _, f, _ in rows]), positions, query)
        if prm.hook is not None:
            logits = torch.as_tensor(prm.hook(r, torch.tensor([positions[query]]), torch.tensor([tokens[query]]),
                                              logits[None].clone()), dtype=F64).reshape(-1)
        return logits, h
    return run


def _prefix_rows(seq: list, hidden: torch.Tensor) -> list:
    """The draft-extend rows of `seq` (root = seq[-1] at position n): (x_t, h_{t-1}, t), t = 1..n;
    the last one drafts for the root."""
    return [(seq[t], hidden[t - 1], t) for t in range(1, len(seq))]


def _draft_tree(audit: _Audit, models, prm: _Params, r: int, seq: list, hidden: torch.Tensor):
    """Draft-extend and the S-step search for the sequence `seq` (root = seq[-1] at position n).
    Returns the tree's tokens and parents."""
    cfg = models.config
    n, k, S = len(seq) - 1, prm.k, prm.S
    run = _draft_runner(models, prm, r)
    prefix_rows = _prefix_rows(seq, hidden)
    logits, h = run(prefix_rows)
    tokens, p, unc = _select(audit, cfg, prm, logits, "draft-extend row")
    beams = [_Cand(c, p[c], unc, tokens[c], -1, h, []) for c in range(k)]
    candidates = list(beams)
    for i in range(1, S):
        step = []
        for b, beam in enumerate(beams):   # row b of step i belongs to beam b of step i-1
            own = (beam.token, beam.feature, n + i)
            logits, h = run(prefix_rows + beam.path_rows + [own])
            tokens, p, unc = _select(audit, cfg, prm, logits, f"step {i} beam {b}")
            for c in range(k):
                score = np.float32(beam.score * p[c])
                step.append(_Cand(k + (i - 1) * k * k + b * k + c, score, beam.unc + unc, tokens[c], beam.flat,
                                  h, beam.path_rows + [own]))
        candidates += step
        ranked = sorted(step, key=_desc)
        if k > 1:
            _audit_order(audit, "beam", ranked, k, keep_order=True)
        beams = ranked[:k]   # beam b of step i is the b-th best candidate of step i
    ranked = sorted(candidates, key=_desc)
    if k > 1:
        _audit_order(audit, "keep", ranked, prm.D - 1, keep_order=False)
    kept = sorted(ranked[:prm.D - 1], key=lambda c: c.flat)
    node_of = {c.flat: j + 1 for j, c in enumerate(kept)}
    parents = [-1] + [0 if c.parent_flat == -1 else node_of.get(c.parent_flat, -1) for c in kept]
    return [seq[-1]] + [c.token for c in kept], parents


def _chain(root: int, drafts: list) -> tuple[list, list]:
    """A topk-1 tree: tokens [root, d_1..d_S], parents [-1, 0, 1, ..., S-1] (6.2)."""
    return [root] + list(drafts), list(range(-1, len(drafts)))


def _draft_mtp(audit: _Audit, models, prm: _Params, r: int, seq: list, hidden: torch.Tensor):
    """The MTP chain (6.10) for `seq` (root = seq[-1] at position n): head j runs with its own masters
    `models.mtp_weights[j]` over the draft-extend rows (x_t, h_{t-1}, t), t = 1..n. Step 0 is head
    0's root row; step i >= 1 is head i's row (d_i, hidden of the row that produced d_i, n + i),
    which sees head i's context rows and itself. Returns the chain's tokens and parents."""
    cfg = models.config
    n = len(seq) - 1
    prefix_rows = _prefix_rows(seq, hidden)
    logits, g = _draft_runner(models, prm, r, models.mtp_weights[0])(prefix_rows)
    (d,), _, _ = _select(audit, cfg, prm, logits, "mtp head 0 root row")
    drafts = [d]
    for i in range(1, prm.S):
        logits, g = _draft_runner(models, prm, r, models.mtp_weights[i])(prefix_rows + [(d, g, n + i)])
        (d,), _, _ = _select(audit, cfg, prm, logits, f"mtp head {i} step {i}")
        drafts.append(d)
    return _chain(seq[-1], drafts)


def _draft_dflash(audit: _Audit, models, prm: _Params, r: int, seq: list, hidden: torch.Tensor):
    """The DFlash block (6.11) for `seq` (root = seq[-1] at position n), with `models.dflash_weights`:
    the draft-extend rows (x_t, h_{t-1}, t), t = 1..n, give g = the hidden of the root's row (their
    logits are not used: no hook, no selection); the B - 1 block rows (mask, g, n + i), i = 1..B-1,
    each see every context row and every block row (bidirectional); d_i = row i's 6.1 top-1.
    Returns the chain's tokens and parents."""
    cfg, tw = models.config, models.target_weights
    n, mask = len(seq) - 1, cfg.vocab_size
    prefix_rows = _prefix_rows(seq, hidden)
    _, g = draft_row(cfg, tw, models.dflash_weights, [t for t, _, _ in prefix_rows],
                     torch.stack([f for _, f, _ in prefix_rows]), [p for _, _, p in prefix_rows])
    rows = prefix_rows + [(mask, g, n + i) for i in range(1, prm.D)]
    run = _draft_runner(models, prm, r, models.dflash_weights)
    drafts = []
    for i in range(1, prm.D):
        logits, _ = run(rows, query=n - 1 + i)      # block row i: index n - 1 + i of the list
        (d,), _, _ = _select(audit, cfg, prm, logits, f"dflash block row {i}")
        drafts.append(d)
    return _chain(seq[-1], drafts)


DRAFTS = {"eagle": _draft_tree, "mtp": _draft_mtp, "dflash": _draft_dflash}


def _sampling_row(audit: _Audit, cfg, prm: _Params, z, where: str, context=None):
    """Section 4's distribution of one target row (float64) and its relative uncertainty; audits
    the filters' boundaries. context: (prompt, output so far) when penalties are on (section 7)."""
    row = _row(cfg, z)
    T = prm.temperature
    width = row.width
    d = [float(x) for x in row.dequant]
    if context is not None:
        d = prm.penalize(d, context)
        width = width * max(prm.repetition, 1.0 / prm.repetition)
    eps = math.expm1(2 * width / T) + REL_PROB
    p = softmax([x / T for x in d])
    V = len(p)
    if 0 < prm.top_k < V:
        order = order_desc(p)
        a, b = order[prm.top_k - 1], order[prm.top_k]
        if p[a] != p[b]:
            audit.note("filter", f"{where}: top_k boundary", (p[a] - p[b]) / p[a], 2 * eps)
        p = filtered_probs(d, T, prm.top_k)
    if prm.top_p < 1.0:
        mass, last_kept, first_out = 0.0, None, None
        for rank, i in enumerate(order_desc(p)):
            if p[i] <= 0.0:
                break
            if rank == 0 or mass < prm.top_p:
                last_kept = (i, mass)
            else:
                first_out = (i, mass)
                break
            mass = mass + p[i]
        i, before = last_kept
        if before > 0.0:
            audit.note("filter", f"{where}: top_p keeps {i}", (prm.top_p - before) / prm.top_p, eps)
        if first_out is not None:
            j, before_j = first_out
            audit.note("filter", f"{where}: top_p drops {j}", (before_j - prm.top_p) / prm.top_p, eps)
            if p[i] != p[j]:
                audit.note("filter", f"{where}: top_p order {i} {j}", (p[i] - p[j]) / p[i], 2 * eps)
        p = filtered_probs(d, T, prm.top_k, prm.top_p)
    if prm.min_p > 0.0:
        threshold = prm.min_p * max(p)
        gaps = [abs(x - threshold) / max(x, threshold) for x in p if x > 0.0]
        audit.note("filter", f"{where}: min_p threshold", min(gaps), 2 * eps)
    return filtered_probs(d, T, prm.top_k, prm.top_p, prm.min_p), eps


def _audit_draw(audit: _Audit, decision: str, where: str, p: list, target: float, total: float, eps: float):
    """The inverse-CDF draw `draw(p, target)`: first index whose cumulative sum exceeds target."""
    cum, prev = 0.0, 0.0
    for x in p:
        cum = cum + x
        if cum > target:
            audit.note(decision, where, min(cum - target, target - prev) / total, 2 * eps)
            return
        prev = cum
    audit.note(decision, f"{where}: fallback to the last positive", 0.0, 2 * eps)


def _verify(audit: _Audit, models, prm: _Params, seq: list, root_z, tokens: list, parents: list, u,
            prompt: list, output: list, rows: dict | None = None):
    """6.3 / 6.4 from the root; node rows computed as the walk reaches them. prompt, output: the
    request's prompt and the tokens it emitted before this cycle (the root included), the context
    of the penalties (section 7), to which a node adds the drafts on its path.
    rows: filled with the target logits of the nodes the walk computes (node -> [V]).
    Returns (accepted nodes [S+1], the bonus token)."""
    cfg, tw = models.config, models.target_weights
    children = [[j for j in range(1, len(tokens)) if parents[j] == i] for i in range(len(tokens))]
    rows = {} if rows is None else rows
    path = [0]
    rows[0] = root_z
    greedy = prm.temperature == 0
    coin = None if greedy else float(u[0])
    while True:
        cur = path[-1]
        if cur not in rows:
            rows[cur] = forward(cfg, tw, seq + [tokens[j] for j in path[1:]])[0][-1]
        where = f"node {cur}"
        context = (prompt, output + [tokens[j] for j in path[1:]]) if prm.penalized else None
        if greedy:
            row = _row(cfg, rows[cur])
            if context is None:
                (predict,), stable, margin = _ordered(row, 1)
            else:
                predict, stable, margin = _penalized_greedy(row, prm, context)
            audit.note("target_greedy", where, margin, 0.0, stable)
        else:
            probs, eps = _sampling_row(audit, cfg, prm, rows[cur], where, context)
        accepted, rejected, acc = -1, [], 0.0
        if len(path) - 1 < prm.S:
            for child in children[cur]:   # sibling order
                if greedy:
                    if tokens[child] == predict:
                        accepted = child
                        break
                    continue
                acc = acc + probs[tokens[child]]
                if probs[tokens[child]] > 0.0:   # else u < acc repeats the previous comparison
                    audit.note("accept", f"{where} child {child}", abs(acc - coin) / max(acc, coin), eps)
                if coin < acc:
                    accepted = child
                    break
                rejected.append(tokens[child])
        if accepted == -1:
            break
        path.append(accepted)
        if not greedy:
            coin = float(u[accepted])
    if greedy:
        bonus = predict
    else:
        residual = [0.0 if t in rejected else x for t, x in enumerate(probs)]
        total = 0.0
        for x in residual:
            total = total + x
        final = float(u[len(tokens)])
        bonus = draw(residual, final * total)
        _audit_draw(audit, "bonus", f"node {cur}", residual, final * total, total, eps)
    return path + [-1] * (prm.S + 1 - len(path)), bonus


def _dflash_greedy(models, prm: _Params, seq: list, tokens: list, rows: dict, prompt: list, output: list):
    """DFlash's greedy verify as 6.11 writes it: the target's greedy token after each of the chain's
    B nodes (node j's row follows seq + d_1..d_j, penalized by that context when penalties are on),
    then `dflash_correct_drafts_and_bonus` (reference/dflash.py). rows: the rows the walk already
    computed (the others are computed here; a row past the first mismatch cannot change the result).
    Returns (correct, bonus)."""
    cfg, tw = models.config, models.target_weights
    predict = []
    for j in range(len(tokens)):
        if j not in rows:
            rows[j] = forward(cfg, tw, seq + tokens[1:j + 1])[0][-1]
        row = _row(cfg, rows[j])
        if prm.penalized:
            predict.append(_penalized_greedy(row, prm, (prompt, output + tokens[1:j + 1]))[0])
        else:
            predict.append(_ordered(row, 1)[0][0])
    (correct,), (bonus,) = dflash_correct_drafts_and_bonus(candidates=[tokens], target_predict=[predict])
    return correct, bonus


def _first_token(audit: _Audit, models, prm: _Params, r: int, prompt: list, seed: int) -> int:
    """The prefill token of request r (6.5 step 1): greedy, or sampled with u(seed, r, P - 1, 0);
    penalized by the prompt when penalties are on."""
    cfg, tw = models.config, models.target_weights
    root_z = forward(cfg, tw, list(prompt))[0][-1]
    context = (list(prompt), []) if prm.penalized else None     # the prompt; no output yet
    if prm.temperature == 0:
        if context is None:
            (first,), stable, margin = _ordered(_row(cfg, root_z), 1)
        else:
            first, stable, margin = _penalized_greedy(_row(cfg, root_z), prm, context)
        audit.note("prefill", "greedy token", margin, 0.0, stable)
    else:
        probs, eps = _sampling_row(audit, cfg, prm, root_z, "prefill", context)
        u0 = counter_uniform(seed, r, len(prompt) - 1, 0)   # section 4: the token after position P - 1
        first = draw(probs, u0)
        _audit_draw(audit, "prefill", "sampled token", probs, u0, 1.0, eps)
    return first


def _emit(trace: RequestTrace, produced: list, budget: int, eos) -> tuple[list, bool]:
    """Append a cycle's tokens one by one, cut after the one that reaches the budget or is EOS
    (section 5). Returns (the tokens emitted, whether the request is done)."""
    emitted = []
    for t in produced:
        trace.tokens.append(t)
        emitted.append(t)
        if len(trace.tokens) >= budget or t == eos:
            return emitted, True
    return emitted, False


def _decode(models, prm: _Params, r: int, prompt: list, budget: int, seed: int) -> RequestTrace:
    cfg, tw = models.config, models.target_weights
    trace = RequestTrace(tokens=[])
    audit = _Audit(trace)
    seq = list(prompt)
    first = _first_token(audit, models, prm, r, prompt, seed)
    trace.tokens.append(first)
    done = len(trace.tokens) >= budget or first == prm.eos
    seq.append(first)
    while not done:
        audit.cycle, audit.margins = len(trace.cycles), {}
        logits, hidden = forward(cfg, tw, seq)       # root row = last; h_0..h_{n-1} feed the draft
        tokens, parents = DRAFTS[prm.algorithm](audit, models, prm, r, seq, hidden)
        n = len(seq) - 1                              # 6.5: the root position (K/V cached for 0..n-1)
        u = None if prm.temperature == 0 else [counter_uniform(seed, r, n, j) for j in range(prm.D + 1)]
        rows = {}
        accepted, bonus = _verify(audit, models, prm, seq, logits[-1], tokens, parents, u, prompt, list(trace.tokens),
                                  rows)
        if prm.algorithm == "dflash" and prm.temperature == 0:
            # 6.11's greedy verify is the block op; on a chain it is 6.3's walk (6.9), which audited it.
            correct, block_bonus = _dflash_greedy(models, prm, seq, tokens, rows, prompt, list(trace.tokens))
            if (correct, block_bonus) != (sum(1 for j in accepted if j >= 0) - 1, bonus):
                raise RuntimeError(f"dflash verify: the block op gives correct {correct}, bonus {block_bonus}; "
                                   f"the chain walk accepted {accepted}, bonus {bonus}")
        produced = [tokens[j] for j in accepted[1:] if j >= 0] + [bonus]
        emitted, done = _emit(trace, produced, budget, prm.eos)
        trace.cycles.append(CycleTrace(tokens, parents, accepted, emitted, dict(audit.margins)))
        seq = seq + produced
    return trace


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_requests(prompts, max_new_tokens, temperature) -> list:
    """Validate the prompts, budgets and temperature; return the per-request budgets."""
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(len(p) for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token-id lists")
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    if len(budgets) != len(prompts) or not all(_is_int(b) and b >= 1 for b in budgets):
        raise ValueError(f"max_new_tokens: expected an int >= 1 or one per prompt, got {max_new_tokens!r}")
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature < math.inf):
        raise ValueError(f"temperature: must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE!r}, "
                         f"got {temperature!r}")
    return budgets


def _check_block_draft(models, algorithm: str, S: int, k: int) -> None:
    """MTP and DFlash draft chains (topk 1); MTP has one head per step, DFlash a mask embedding."""
    if algorithm == "eagle":
        return
    if k != 1:
        raise ValueError(f"topk: {algorithm} drafts a chain, topk must be 1, got {k}")
    if algorithm == "mtp":
        heads = models.config.mtp_heads
        if S > heads:
            raise ValueError(f"spec_num_steps: mtp runs one head per step; spec_num_steps={S} exceeds "
                             f"config.mtp_heads={heads}")
        if len(getattr(models, "mtp_weights", [])) < S:
            raise ValueError(f"models.mtp_weights: {S} heads needed, got {len(getattr(models, 'mtp_weights', []))}")
    elif "mask_embed" not in getattr(models, "dflash_weights", {}):
        raise ValueError("models.dflash_weights: the DFlash head's masters (with mask_embed) are missing")


def generate(models, prompts, *, spec_num_steps: int, topk: int = 1, num_draft_tokens: int | None = None,
             max_new_tokens, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: int = 0, eos_token_id: int | None = None, draft_logits_hook=None, repetition_penalty: float = 1.0,
             frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
             algorithm: str = "eagle") -> SpecReferenceOutput:
    """Speculative decoding of every prompt, cache-free, with the per-cycle trace.

    algorithm: "eagle" (6.5: the EAGLE head's tree), "mtp" (6.10: one head per draft step, a chain)
    or "dflash" (6.11: one bidirectional block of mask rows, a chain). Verify, emit and trace are
    the same for all three (a topk-1 tree is a chain).
    models: needs `config`, `target_weights` and the draft's float64 masters: `draft_weights`
    (eagle), `mtp_weights` (a list, head j = draft step j; mtp), `dflash_weights` (with
    `mask_embed`; dflash).
    spec_num_steps S, topk k, num_draft_tokens D (default S + 1, root included). mtp and dflash
    are chains: topk 1 and D = S + 1; mtp needs S <= config.mtp_heads.
    max_new_tokens: int or one per prompt. temperature 0 = greedy, else sampling with the
    uniforms of docs/semantics.md 4 (prefill token) and 6.5 (cycles).
    draft_logits_hook(req_index, positions [1] int64, tokens [1] int64, logits [1, V] float64)
    -> logits: applied to every draft-head row's float64 logits before their conversion (how a
    test steers the draft, as the optimized side's draft wrapper does), on the rows whose logits
    are used: EAGLE's draft-extend root row and beam rows, every MTP head's row, every DFlash
    block row (token = the mask id vocab_size, position = the row's); not on DFlash's context rows.
    repetition_penalty, frequency_penalty, presence_penalty: section 7, on every target row (the
    prefill's, each tree node's with the drafts on its path); the draft head is not penalized.
    """
    S, k = spec_num_steps, topk
    if not isinstance(algorithm, str) or algorithm not in DRAFTS:
        raise ValueError(f"algorithm: must be one of {sorted(DRAFTS)}, got {algorithm!r}")
    D = S + 1 if num_draft_tokens is None else num_draft_tokens
    for name, value in (("spec_num_steps", S), ("topk", k), ("num_draft_tokens", D)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {value!r}")
    most = 1 + k + (S - 1) * k * k
    if not 2 <= D <= most or (k == 1 and D != S + 1):
        raise ValueError(f"num_draft_tokens: {D} is not valid for topk={k}, num_steps={S} "
                         f"(2..{most}; S + 1 when topk == 1)")
    _check_block_draft(models, algorithm, S, k)
    budgets = _check_requests(prompts, max_new_tokens, temperature)
    penalties = check_penalties(repetition_penalty, frequency_penalty, presence_penalty)
    prm = _Params(k, S, D, float(temperature), top_k, top_p, min_p, eos_token_id, draft_logits_hook, *penalties,
                  algorithm=algorithm)
    traces = [_decode(models, prm, r, [int(t) for t in p], b, seed) for r, (p, b) in enumerate(zip(prompts, budgets))]
    return SpecReferenceOutput([t.tokens for t in traces], traces)
