"""A cache-free reference naive-EAGLE decoder (docs/semantics.md 6.7), with its trace.

Naive EAGLE is the two-node chain (D = 2, S = 1, topk = 1) whose draft token is chosen by the
sampling mode. Everything is recomputed from token lists in float64 at every cycle, one request at
a time, with the machinery of `reference/eagle.py`: its target forward, its cache-free draft head
and `draft_logits_hook`, its logits intervals, sampling rows, penalties, audit and trace records.

- **prefill**: the first token as `reference/eagle.py` takes it (greedy, or sampled with
  u(seed, r, P - 1, 0); penalized by the prompt when penalties are on);
- **draft**: for the sequence x_0..x_n (the root x_n at position n) the draft head runs over the
  rows (x_t, h_{t-1}) at positions t = 1..n (the hook applied to its logits); its last row z_d
  proposes the draft token d:
  - greedy and `inexact_shortcut`: the first maximal index of the converted row (6.1, k = 1);
  - `exact`: a draw from q, section 4's distribution of z_d (the request's temperature, top-k,
    top-p, min-p; the draft is never penalized), with u(seed, r, n, 0);
- **verify**: the target's rows at the root (p_0; its context is the output so far) and after d
  (p_1; the output so far and d), the second computed only when the walk reaches it:
  - greedy: d is accepted iff it equals t_0, the root's greedy token (the first maximum of the
    penalized float64 row when penalties are on); emitted [d, t_1] (t_1: the greedy token of the
    row after d) or [t_0];
  - `exact`: accepted iff u(seed, r, n, 1) < p_0(d) / q(d) (float64 division); then t_1 is drawn
    from p_1, else t_0 from the residual max(p_0 - q, 0), both with u(seed, r, n, 2);
  - `inexact_shortcut`: q_d = the float64 softmax of the dequantized z_d at d (temperature 1, no
    filters); accepted iff u(seed, r, n, 1) < p_0(d) / q_d; then t_1 ~ p_1, else t_0 ~ p_0
    itself (no residual: the shortcut's bias), both with u(seed, r, n, 2);
  every draw after the prefill is 6.4's inverse CDF: the first index whose left-to-right running
  sum exceeds u times the row's total (the last value of that sum); if none does, the last
  positive entry; if none is positive, V - 1 (what `specverify`'s `inverse_cdf` falls back to);
- **emit**: the EOS / max_new_tokens cut of section 5, as `reference/eagle.py` does.

The trace of a cycle is `CycleTrace(tree_tokens=[x_n, d], tree_parents=[-1, 0], accepted=[0, 1] or
[0, -1], emitted)`. In greedy mode it is `reference.eagle.generate(spec_num_steps=1, topk=1)`'s.

Audit (reference/eagle.py states the thresholds these build on; both sides compute in float64).
Decision kinds: prefill, draft_topk, target_greedy, filter, draft_draw, accept, bonus, residual.

- **Orders** (draft_topk, target_greedy, prefill): the interval rule of reference/eagle.py on the
  converted logits (penalized intervals when penalties are on).
- **Sampling rows** (filter): every distribution the cycle reads (q in exact mode, p_0, p_1 when
  reached) has its top-k / top-p / min-p boundaries audited by `_sampling_row`, which also gives
  the row's relative uncertainty eps (each probability moves by a factor within 1 +- eps).
- **Draws from a distribution** (draft_draw from q, bonus from p_1 or the shortcut's p_0): the
  inverse-CDF rule audited as the prefill's draw is: a gap between the threshold and the running
  sums on either side of the drawn index, relative to the total, must exceed 2 eps.
- **The coin** (accept): rho = p_0(d) / q(d) with p_0(d) uncertain by eps_p and q(d) by eps_q
  moves by a factor within [(1 - eps_p) / (1 + eps_q), (1 + eps_p) / (1 - eps_q)], so the coin
  u < rho is a near-tie unless |rho - u| / max(rho, u) > (1 + eps_p) / (1 - eps_q) - 1 + REL_PROB
  (REL_PROB for the division's rounding). A p_0(d) that is exactly 0 (d filtered out of p_0, a
  decision the filter audit covers) rejects on both sides and is not a near-tie. The shortcut's
  q_d is a float64 softmax on both sides (not the float32 draft p of 6.1, so REL_DRAFT_P does not
  apply): eps_q = expm1(2w) + REL_PROB with w the dequantized spread of the draft row (T = 1).
- **The residual draw** (residual): its entries r_i = max(p_0i - q_i, 0) are differences, so a
  relative uncertainty does not carry over (where p_0i is close to q_i, all of r_i is in doubt).
  Each entry moves by at most a_i = eps_p p_0i + eps_q q_i (max(., 0) is 1-Lipschitz; an entry
  that is 0 because p_0i <= q_i may turn positive within it). The draw picks the first i with
  C_i > u C_V (C the running sum, C_V the total); C_i - u C_V = (1 - u) C_i - u (C_V - C_i) moves
  by at most (1 - u) A_i + u (A_V - A_i), A the running sum of a. Both gaps (at the drawn index and
  the one before it) must exceed that movement, plus REL_PROB * C_V for the sums' rounding;
  margins and tolerances are reported relative to C_V. A fallback (no running sum above the
  threshold) is always a near-tie.
"""

from __future__ import annotations

import math
import numbers

from reference import eagle
from reference.eagle import (
    CycleTrace,
    RequestTrace,
    SpecReferenceOutput,
    _Audit,
    _audit_draw,
    _check_requests,
    _draft_runner,
    _emit,
    _first_token,
    _is_int,
    _ordered,
    _Params,
    _penalized_greedy,
    _prefix_rows,
    _row,
    _sampling_row,
)
from reference.model import forward
from reference.sampling import check_penalties, counter_uniform, softmax

NAIVE_SAMPLING = ("exact", "inexact_shortcut")
DRAFT_DRAW, COIN_DRAW, FINAL_DRAW = 0, 1, 2     # the draw index of u(seed, r, n, draw) (6.7)


# ---------------------------------------------------------------------------------------------
# draws and their audit


def _running_sum(xs) -> float:
    """Left-to-right float64 sum (builtin sum() compensates rounding since Python 3.12)."""
    total = 0.0
    for x in xs:
        total = total + x
    return total


def _inverse_cdf(p: list, u: float) -> tuple[int, float, float]:
    """6.4's draw from p (any non-negative row): (index, the threshold u * total, total)."""
    total = _running_sum(p)
    target = u * total
    cum = 0.0
    for i, x in enumerate(p):
        cum = cum + x
        if cum > target:
            return i, target, total
    positive = [i for i, x in enumerate(p) if x > 0.0]
    return (positive[-1] if positive else len(p) - 1), target, total


def _audit_residual(audit: _Audit, where: str, residual: list, slack: list, u: float, target: float, total: float):
    """The inverse-CDF draw from `residual`, each entry uncertain by the absolute `slack`."""
    slack_total = _running_sum(slack)
    cum = prev = slack_cum = slack_prev = 0.0
    for x, a in zip(residual, slack):
        cum, slack_cum = cum + x, slack_cum + a
        if cum > target:
            moves_hi = (1 - u) * slack_cum + u * (slack_total - slack_cum)
            moves_lo = (1 - u) * slack_prev + u * (slack_total - slack_prev)
            audit.note("residual", f"{where}: running sum above the threshold", (cum - target) / total,
                       moves_hi / total + eagle.REL_PROB)
            audit.note("residual", f"{where}: running sum below the threshold", (target - prev) / total,
                       moves_lo / total + eagle.REL_PROB)
            return
        prev, slack_prev = cum, slack_cum
    audit.note("residual", f"{where}: fallback (no running sum above the threshold)", 0.0, eagle.REL_PROB)


def _ratio_tolerance(eps_p: float, eps_q: float) -> float:
    """Relative uncertainty of p / q when p is uncertain by eps_p and q by eps_q (relative)."""
    return math.inf if eps_q >= 1.0 else (1.0 + eps_p) / (1.0 - eps_q) - 1.0 + eagle.REL_PROB


# ---------------------------------------------------------------------------------------------
# one cycle


def _greedy(audit: _Audit, cfg, prm: _Params, z, context, where: str) -> int:
    """The target's greedy token of a row (section 3, or section 7's penalized first maximum)."""
    row = _row(cfg, z)
    if context is None:
        (token,), stable, margin = _ordered(row, 1)
    else:
        token, stable, margin = _penalized_greedy(row, prm, context)
    audit.note("target_greedy", where, margin, 0.0, stable)
    return token


def _propose(audit: _Audit, cfg, prm: _Params, mode: str, z_d, seed: int, r: int, n: int):
    """The draft token of the cycle whose root sits at position n, from the draft row z_d.
    Returns (d, q [V] with its eps) in exact mode, (d, (q_d, eps)) in the shortcut, (d, None) greedy."""
    if mode == "exact":
        q, eps_q = _sampling_row(audit, cfg, prm, z_d, "draft row")       # never penalized
        u = counter_uniform(seed, r, n, DRAFT_DRAW)
        d, target, total = _inverse_cdf(q, u)
        _audit_draw(audit, "draft_draw", "draft row", q, target, total, eps_q)
        return d, (q, eps_q)
    row = _row(cfg, z_d)
    (d,), stable, margin = _ordered(row, 1)
    audit.note("draft_topk", "draft-extend row", margin, 0.0, stable)
    if mode == "greedy":
        return d, None
    q_d = softmax([float(x) for x in row.dequant])[d]        # temperature 1, no filters
    return d, (q_d, math.expm1(2 * row.width) + eagle.REL_PROB)


def _verify(audit: _Audit, models, prm: _Params, mode: str, seq: list, root_z, d: int, draft, u: list,
            prompt: list, output: list) -> tuple[bool, int]:
    """6.7's accept step: (whether d is accepted, the token emitted after the accepted nodes).
    output: the tokens emitted before this cycle (the root included), the penalties' context."""
    cfg, tw = models.config, models.target_weights
    ctx0 = (prompt, output) if prm.penalized else None
    ctx1 = (prompt, output + [d]) if prm.penalized else None

    def node1_z():
        return forward(cfg, tw, seq + [d])[0][-1]

    if mode == "greedy":
        t0 = _greedy(audit, cfg, prm, root_z, ctx0, "node 0")
        if d != t0:
            return False, t0
        return True, _greedy(audit, cfg, prm, node1_z(), ctx1, "node 1")

    coin, final = u[COIN_DRAW], u[FINAL_DRAW]
    p0, eps_p = _sampling_row(audit, cfg, prm, root_z, "node 0", ctx0)
    if mode == "exact":
        q, eps_q = draft
        q_d = q[d]
    else:
        q_d, eps_q = draft
    ratio = p0[d] / q_d if q_d > 0.0 else (math.inf if p0[d] > 0.0 else math.nan)   # IEEE float64 division
    if p0[d] > 0.0:
        gap = 1.0 if math.isinf(ratio) else abs(ratio - coin) / max(ratio, coin)
        audit.note("accept", f"node 0 draft {d}", gap, _ratio_tolerance(eps_p, eps_q))
    if coin < ratio:
        p1, eps1 = _sampling_row(audit, cfg, prm, node1_z(), "node 1", ctx1)
        t1, target, total = _inverse_cdf(p1, final)
        _audit_draw(audit, "bonus", "node 1", p1, target, total, eps1)
        return True, t1
    if mode == "exact":
        residual = [max(a - b, 0.0) for a, b in zip(p0, q)]
        t0, target, total = _inverse_cdf(residual, final)
        slack = [eps_p * a + eps_q * b for a, b in zip(p0, q)]
        _audit_residual(audit, "node 0", residual, slack, final, target, total)
        return False, t0
    t0, target, total = _inverse_cdf(p0, final)              # the shortcut: p_0 itself
    _audit_draw(audit, "bonus", "node 0", p0, target, total, eps_p)
    return False, t0


def _decode(models, prm: _Params, mode: str, r: int, prompt: list, budget: int, seed: int) -> RequestTrace:
    cfg, tw = models.config, models.target_weights
    trace = RequestTrace(tokens=[])
    audit = _Audit(trace)
    first = _first_token(audit, models, prm, r, prompt, seed)
    trace.tokens.append(first)
    done = len(trace.tokens) >= budget or first == prm.eos
    seq = list(prompt) + [first]
    draft_head = _draft_runner(models, prm, r)
    while not done:
        audit.cycle, audit.margins = len(trace.cycles), {}
        logits, hidden = forward(cfg, tw, seq)       # root row = last; h_0..h_{n-1} feed the draft
        n = len(seq) - 1                              # the root's position
        z_d, _ = draft_head(_prefix_rows(seq, hidden))
        d, draft = _propose(audit, cfg, prm, mode, z_d, seed, r, n)
        u = None if mode == "greedy" else [counter_uniform(seed, r, n, j) for j in (DRAFT_DRAW, COIN_DRAW, FINAL_DRAW)]
        accepted, bonus = _verify(audit, models, prm, mode, seq, logits[-1], d, draft, u, prompt, list(trace.tokens))
        produced = [d, bonus] if accepted else [bonus]
        emitted, done = _emit(trace, produced, budget, prm.eos)
        trace.cycles.append(CycleTrace([seq[-1], d], [-1, 0], [0, 1] if accepted else [0, -1], emitted,
                                       dict(audit.margins)))
        seq = seq + produced
    return trace


# ---------------------------------------------------------------------------------------------
# entry point


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_sampling(naive_sampling, top_k, top_p, min_p, seed, eos_token_id, draft_logits_hook, vocab: int):
    if naive_sampling not in NAIVE_SAMPLING:
        raise ValueError(f"naive_sampling: must be one of {NAIVE_SAMPLING}, got {naive_sampling!r}")
    if not _is_int(top_k) or top_k < 0:
        raise ValueError(f"top_k: must be an int >= 0 (0 = off), got {top_k!r}")
    if not _is_real(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p: must be a real number in (0, 1] (1 = off), got {top_p!r}")
    if not _is_real(min_p) or not 0.0 <= min_p < 1.0:
        raise ValueError(f"min_p: must be a real number in [0, 1) (0 = off), got {min_p!r}")
    if not _is_int(seed) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: must be an int in [0, 2**32), got {seed!r}")
    if eos_token_id is not None and (not _is_int(eos_token_id) or not 0 <= eos_token_id < vocab):
        raise ValueError(f"eos_token_id: must be None or a token id in [0, {vocab}), got {eos_token_id!r}")
    if draft_logits_hook is not None and not callable(draft_logits_hook):
        raise ValueError(f"draft_logits_hook: must be None or callable, got {type(draft_logits_hook).__name__}")


def generate(models, prompts, *, naive_sampling: str = "exact", max_new_tokens, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, eos_token_id: int | None = None,
             draft_logits_hook=None, repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0) -> SpecReferenceOutput:
    """Naive-EAGLE speculative decoding of every prompt, cache-free, with the per-cycle trace.

    models: needs `config`, `target_weights` and `draft_weights` (float64 masters).
    naive_sampling: "exact" (speculative sampling from the draft's q) or "inexact_shortcut" (the
    original path: argmax draft, no residual); ignored when greedy (temperature 0).
    max_new_tokens: int or one per prompt. temperature 0 = greedy, else sampling with the uniforms
    of docs/semantics.md 4 (prefill token) and 6.7 (cycles: u(seed, r, n, 0 / 1 / 2)).
    draft_logits_hook(req_index, positions [1] int64, tokens [1] int64, logits [1, V] float64)
    -> logits: applied to the draft row's float64 logits before their conversion.
    repetition_penalty, frequency_penalty, presence_penalty: section 7, on every target row (the
    prefill's, the root's, the row after the draft with the draft in its context); never on the
    draft. Raises ValueError naming the argument for invalid input.
    """
    budgets = _check_requests(prompts, max_new_tokens, temperature)
    _check_sampling(naive_sampling, top_k, top_p, min_p, seed, eos_token_id, draft_logits_hook,
                    models.config.vocab_size)
    penalties = check_penalties(repetition_penalty, frequency_penalty, presence_penalty)
    prm = _Params(1, 1, 2, float(temperature), top_k, float(top_p), float(min_p), eos_token_id, draft_logits_hook,
                  *penalties)
    mode = "greedy" if prm.temperature == 0 else naive_sampling
    traces = [_decode(models, prm, mode, r, [int(t) for t in p], b, seed)
              for r, (p, b) in enumerate(zip(prompts, budgets))]
    return SpecReferenceOutput([t.tokens for t in traces], traces)
