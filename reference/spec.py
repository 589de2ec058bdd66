"""Speculative ops (docs/semantics.md, section 6), one request at a time, with plain loops.

- `topk_order` / `select_draft_topk`: draft selection (6.1), order (value descending, index ascending);
- `build_tree`: the EAGLE draft tree (6.2) from the draft distributions of every step;
- `expand_beams`: one step of its search (6.13), with the beams' ancestor rows and hidden states;
- `greedy_verify`: greedy tree verification (6.3);
- `stochastic_verify`: target-only tree sampling (6.4) with explicit uniforms;
- `first_token_distribution` / `emitted_path_probability`: the exact law of what
  `stochastic_verify` emits, by enumerating its acceptance events (not by sampling), so tests can
  prove the scheme lossless.

Scores are float32 products (np.float32), as the contract says; probabilities of the verify side
are float64. Nothing here is fast; everything reads as the contract does.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from reference.logits import greedy_token
from reference.sampling import draw, softmax

# ---------------------------------------------------------------------------------------------
# 6.1 draft selection


def _desc_key(value: float, index: int) -> tuple:
    """Sort key for the order (value descending, index ascending).

    NaN ranks above every number (ties among NaNs by index), as np.argmax / torch.topk treat it;
    with this rule topk_order(row, 1)[0] == greedy_token(row) on every row. -0.0 ties with +0.0.
    """
    value = float(value)
    if math.isnan(value):
        return (0, 0.0, index)
    return (1, -value, index)


def topk_order(values, k: int) -> list[int]:
    """The first k indices of `values` [V] in the order (value descending, index ascending)."""
    values = [float(x) for x in values]
    if not _is_int(k) or not 1 <= k <= len(values):
        raise ValueError(f"k: must be an int in [1, V={len(values)}], got {k!r}")
    order = sorted(range(len(values)), key=lambda i: _desc_key(values[i], i))
    return order[:k]


def selection_softmax(z) -> list[float]:
    """Softmax of one row (float64) with its limits, as section 6.1 defines them: a row holding NaN
    is NaN everywhere; a row whose maximum is +inf or -inf (all -inf) shares the mass evenly among
    the entries equal to that maximum; otherwise the plain softmax."""
    z = [float(x) for x in z]
    if any(math.isnan(x) for x in z):
        return [math.nan] * len(z)
    m = max(z)
    if math.isinf(m):
        at_max = [1.0 if x == m else 0.0 for x in z]
        return [x / sum(at_max) for x in at_max]
    return softmax(z)


def select_draft_topk(logits_upcast_row, k: int, dequant_row) -> tuple[list[float], list[int]]:
    """Draft selection of one row (6.1).

    logits_upcast_row [V] float32: what the order compares (FP8: upcast fp8 values), NaN first;
    dequant_row [V]: what the softmax reads (float32(logits) * scale, the product in float32).
    Returns p [k] (the float64 `selection_softmax` of the dequantized row at the selected
    indices) and index [k].
    """
    upcast = np.asarray(logits_upcast_row, dtype=np.float32)
    dequant = [float(x) for x in np.asarray(dequant_row, dtype=np.float64)]
    if upcast.ndim != 1 or len(dequant) != upcast.shape[0]:
        raise ValueError(f"dequant_row: expected shape [{upcast.shape}] like logits_upcast_row, got [{len(dequant)}]")
    index = topk_order(upcast, k)
    probs = selection_softmax(dequant)  # float64, over the whole row
    p = [probs[i] for i in index]
    return p, index


# ---------------------------------------------------------------------------------------------
# 6.2 draft tree


@dataclass
class RefTree:
    """The draft tree of one request (node 0 is the root; D nodes)."""

    tokens: list  # [D] int: root token, then the kept candidates' tokens
    parents: list  # [D] int: parent node, -1 for the root and for orphans
    positions: list  # [D] int: L + depth (orphans: L + 1)
    mask: list  # [D][D] bool: mask[j][j'] = node j sees node j'
    first_child: list  # [D] int, -1 = none
    next_sibling: list  # [D] int, -1 = none
    flat_index: list  # [D] int: b*D + j
    kept_flat: list = field(default_factory=list)  # [D-1] flat indices of the kept candidates, ascending
    beam_flat: list = field(default_factory=list)  # [S-1][k] flat index of each beam of steps 0..S-2


@dataclass
class _Candidate:
    flat: int  # index in the score list
    score: np.float32  # product of draft probabilities along the path (float32)
    token: int
    parent_flat: int  # flat index of the parent beam, -1 for a step-0 candidate (parent = root)


def _best(candidates: list, n: int) -> list:
    """The n best candidates, order (score descending, flat index ascending)."""
    return sorted(candidates, key=lambda c: _desc_key(c.score, c.flat))[:n]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate_tree_args(step_dists, root_tokens, seq_lens, topk, num_steps, num_draft_tokens):
    """Check the arguments; return (bs, V) and the step arrays as float32 numpy arrays."""
    for name, value, low in (("topk", topk, 1), ("num_steps", num_steps, 1), ("num_draft_tokens", num_draft_tokens, 2)):
        if not _is_int(value) or value < low:
            raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")
    k, S, D = topk, num_steps, num_draft_tokens
    n_candidates = k + (S - 1) * k * k
    if D - 1 > n_candidates:
        raise ValueError(
            f"num_draft_tokens: D - 1 = {D - 1} exceeds the number of candidates "
            f"topk + (num_steps - 1) * topk**2 = {n_candidates}")
    if k == 1 and D != S + 1:
        raise ValueError(f"num_draft_tokens: topk == 1 requires num_draft_tokens == num_steps + 1 = {S + 1}, got {D}")
    if len(step_dists) != S:
        raise ValueError(f"step_dists: expected num_steps = {S} arrays, got {len(step_dists)}")
    arrays = []
    for i, dist in enumerate(step_dists):
        a = np.asarray(dist)
        if a.dtype != np.float32:
            raise ValueError(f"step_dists[{i}]: expected float32, got {a.dtype}")
        beams = 1 if i == 0 else k
        if a.ndim != 3 or a.shape[1] != beams:
            raise ValueError(f"step_dists[{i}]: expected shape [bs, {beams}, V], got {list(a.shape)}")
        arrays.append(a)
    bs, V = arrays[0].shape[0], arrays[0].shape[2]
    for i, a in enumerate(arrays):
        if a.shape[0] != bs or a.shape[2] != V:
            raise ValueError(f"step_dists[{i}]: shape {list(a.shape)} disagrees with step_dists[0] (bs={bs}, V={V})")
    if k > V:
        raise ValueError(f"topk: must be <= vocab size V = {V}, got {k}")
    if len(root_tokens) != bs:
        raise ValueError(f"root_tokens: expected bs = {bs} entries, got {len(root_tokens)}")
    if len(seq_lens) != bs:
        raise ValueError(f"seq_lens: expected bs = {bs} entries, got {len(seq_lens)}")
    return bs, V, arrays


def _request_candidates(dists: list, k: int, S: int):
    """Every candidate of one request and the beams of each step (section 6.2, the scoring part).

    dists[i]: [beams_i, V] float32 for step i. Returns (candidates in flat order, beam_flat).
    """
    candidates = []
    # step 0: the top-k of the single draft-extend distribution
    row = dists[0][0]
    beams = []  # the current beams, best first
    for c, token in enumerate(topk_order(row, k)):
        cand = _Candidate(flat=c, score=np.float32(row[token]), token=token, parent_flat=-1)
        candidates.append(cand)
        beams.append(cand)
    beam_flat = []
    for i in range(1, S):
        beam_flat.append([b.flat for b in beams])
        step = []
        for p in range(k):  # row p of step i is the distribution of beam p of step i-1
            row = dists[i][p]
            for c, token in enumerate(topk_order(row, k)):
                score = np.float32(beams[p].score * np.float32(row[token]))  # float32 product
                flat = k + (i - 1) * k * k + p * k + c
                step.append(_Candidate(flat=flat, score=score, token=token, parent_flat=beams[p].flat))
        candidates.extend(step)
        beams = _best(step, k)  # beam p of step i is the p-th best candidate of step i
    return candidates, beam_flat


def build_tree(step_dists, root_tokens, seq_lens, *, topk: int, num_steps: int, num_draft_tokens: int) -> list[RefTree]:
    """The EAGLE draft tree of every request (section 6.2).

    step_dists[i]: [bs, beams_i, V] float32 draft distributions of step i (beams_0 = 1, later topk;
    row p of step i >= 1 belongs to beam p of step i-1, its p-th best candidate).
    root_tokens [bs]: the last verified token of each request; seq_lens [bs]: L, the root's position.
    """
    bs, _V, arrays = _validate_tree_args(step_dists, root_tokens, seq_lens, topk, num_steps, num_draft_tokens)
    k, S, D = topk, num_steps, num_draft_tokens
    trees = []
    for b in range(bs):
        dists = [a[b] for a in arrays]
        candidates, beam_flat = _request_candidates(dists, k, S)
        kept = sorted(_best(candidates, D - 1), key=lambda c: c.flat)  # the D-1 best, by flat index
        node_of_flat = {c.flat: j + 1 for j, c in enumerate(kept)}

        tokens = [int(root_tokens[b])] + [c.token for c in kept]
        parents = [-1]
        for c in kept:
            if c.parent_flat == -1:
                parents.append(0)  # a step-0 candidate hangs from the root
            elif c.parent_flat in node_of_flat:
                parents.append(node_of_flat[c.parent_flat])
            else:
                parents.append(-1)  # orphan: its parent beam was not kept
        trees.append(_tree_from_parents(tokens, parents, int(seq_lens[b]), b, D, [c.flat for c in kept], beam_flat))
    return trees


def expand_beams(beam_scores, child_probs, child_tokens, ancestors, hidden, *, step: int) -> dict:
    """One step >= 1 of the search (section 6.13), request by request.

    beam_scores [bs][k], child_probs [bs][k][k] (float32 values), child_tokens [bs][k][k],
    ancestors [bs][k][R] (bools), hidden [bs][k][H]. Candidate p*k + c of a request scores the
    float32 product beam_scores[p] * child_probs[p][c]; new beam q is the q-th best candidate
    (score descending, index ascending, NaN first); it inherits its parent beam's ancestor row,
    adds its own entry step*k + q (when inside the row), and its parent's hidden state.
    Returns lists: scores, tokens, flat, parent [bs][k], ancestors [bs][k][R], hidden [bs][k][H],
    cand_scores [bs][k*k].
    """
    if not _is_int(step) or step < 1:
        raise ValueError(f"step: must be an int >= 1, got {step!r}")
    out = {name: [] for name in ("scores", "tokens", "flat", "parent", "ancestors", "hidden", "cand_scores")}
    for b in range(len(beam_scores)):
        k = len(beam_scores[b])
        with np.errstate(invalid="ignore"):                  # inf * 0 is NaN, as the contract says
            cand = [np.float32(np.float32(beam_scores[b][p]) * np.float32(child_probs[b][p][c]))
                    for p in range(k) for c in range(k)]
        chosen = topk_order(cand, k)
        parents = [i // k for i in chosen]
        row_len = len(ancestors[b][0]) if k else 0
        out["cand_scores"].append(cand)
        out["scores"].append([cand[i] for i in chosen])
        out["tokens"].append([int(child_tokens[b][i // k][i % k]) for i in chosen])
        out["flat"].append([k + (step - 1) * k * k + i for i in chosen])
        out["parent"].append(parents)
        out["ancestors"].append([[bool(ancestors[b][p][r]) or r == step * k + q for r in range(row_len)]
                                 for q, p in enumerate(parents)])
        out["hidden"].append([list(hidden[b][p]) for p in parents])
    return out


def keep_candidates(scores, tokens, *, keep: int) -> dict:
    """The end of the search (section 6.13), request by request: the `keep` best of a request's
    candidates (scores [bs][M] float32 values, in the order of 6.1), their flat indices ascending
    and their tokens. Returns lists kept_flat, kept_tokens [bs][keep]."""
    if not _is_int(keep) or keep < 0:
        raise ValueError(f"keep: must be an int >= 0, got {keep!r}")
    out = {"kept_flat": [], "kept_tokens": []}
    for row, row_tokens in zip(scores, tokens):
        kept = sorted(topk_order([np.float32(v) for v in row], keep)) if keep else []
        out["kept_flat"].append(kept)
        out["kept_tokens"].append([int(row_tokens[i]) for i in kept])
    return out


def _tree_from_parents(tokens, parents, L, b, D, kept_flat, beam_flat) -> RefTree:
    """Positions, mask and links of one request from its parents list."""
    depth = [0] * D
    for j in range(1, D):
        if parents[j] == -1:
            depth[j] = 1  # orphan: counted at depth 1
        else:
            if parents[j] >= j:
                raise AssertionError(f"node {j}: parent {parents[j]} is not an earlier node")
            depth[j] = depth[parents[j]] + 1
    positions = [L + d for d in depth]

    mask = []
    for j in range(D):
        row = [False] * D
        row[j] = True
        a = parents[j]
        while a != -1:  # every ancestor
            row[a] = True
            a = parents[a]
        row[0] = True  # the root: an ancestor of every node (an orphan sees it too)
        mask.append(row)

    children = children_of(parents)
    first_child = [-1] * D
    next_sibling = [-1] * D
    for n in range(D):
        if children[n]:
            first_child[n] = children[n][0]
        for s in range(len(children[n]) - 1):
            next_sibling[children[n][s]] = children[n][s + 1]
    flat_index = [b * D + j for j in range(D)]
    return RefTree(tokens=tokens, parents=parents, positions=positions, mask=mask, first_child=first_child,
                   next_sibling=next_sibling, flat_index=flat_index, kept_flat=kept_flat, beam_flat=beam_flat)


# ---------------------------------------------------------------------------------------------
# 6.3 / 6.4 verify


def children_of(parents) -> list[list[int]]:
    """children[n] = the nodes j >= 1 whose parent is n, ascending. Orphans (parent -1) are nobody's child."""
    D = len(parents)
    children = [[] for _ in range(D)]
    for j in range(1, D):
        if parents[j] != -1:
            children[parents[j]].append(j)
    return children


def _validate_tree(tokens, parents, num_steps) -> int:
    D = len(tokens)
    if D < 1:
        raise ValueError("tokens: the tree needs at least the root")
    if len(parents) != D:
        raise ValueError(f"parents: expected D = {D} entries like tokens, got {len(parents)}")
    if parents[0] != -1:
        raise ValueError(f"parents: node 0 is the root and must have parent -1, got {parents[0]}")
    for j in range(1, D):
        if not (parents[j] == -1 or 0 <= parents[j] < D) or parents[j] == j:
            raise ValueError(f"parents[{j}]: must be -1 or another node in [0, {D}), got {parents[j]}")
    if not _is_int(num_steps) or num_steps < 1:
        raise ValueError(f"num_steps: must be an int >= 1, got {num_steps!r}")
    return D


def _pad(path: list[int], width: int) -> list[int]:
    return path + [-1] * (width - len(path))


def greedy_verify(tokens, parents, target_upcast, *, num_steps: int) -> tuple[list[int], int, int]:
    """Greedy verify of one request (section 6.3).

    tokens [D], parents [D] (-1: root or orphan); target_upcast [D, V] float32, row j the target's
    logits after node j. Returns (accept_nodes [S+1] padded with -1, num_correct, bonus).
    """
    D = _validate_tree(tokens, parents, num_steps)
    target_upcast = np.asarray(target_upcast, dtype=np.float32)
    if target_upcast.ndim != 2 or target_upcast.shape[0] != D:
        raise ValueError(f"target_upcast: expected shape [D={D}, V], got {list(target_upcast.shape)}")
    predict = [greedy_token(target_upcast[j]) for j in range(D)]
    children = children_of(parents)

    path = [0]
    cur = 0
    while len(path) - 1 < num_steps:
        accepted = -1
        for child in children[cur]:  # sibling order
            if tokens[child] == predict[cur]:
                accepted = child
                break
        if accepted == -1:
            break
        path.append(accepted)
        cur = accepted
    return _pad(path, num_steps + 1), len(path) - 1, predict[cur]


def _check_uniform(name: str, u) -> float:
    u = float(u)
    if not 0.0 <= u < 1.0:
        raise ValueError(f"{name}: a uniform must be in [0, 1), got {u!r}")
    return u


# How a uniform u accepts against a threshold t: "lt" is u < t (section 6.4 and 6.7); "le" is
# u <= t, an engine's alternative rule (docs/conformance.md, "Conventions").
ACCEPT_RULES = {"lt": lambda u, t: u < t, "le": lambda u, t: u <= t}


def _accept_rule(accept: str):
    if accept not in ACCEPT_RULES:
        raise ValueError(f"accept: one of {sorted(ACCEPT_RULES)}, got {accept!r}")
    return ACCEPT_RULES[accept]


def stochastic_verify(tokens, parents, target_probs, coins, final, *, num_steps: int,
                      accept: str = "lt") -> tuple[list[int], int, int]:
    """Target-only tree sampling of one request (section 6.4).

    tokens [D], parents [D]; target_probs [D, V] float64 (row j: the sampling distribution after
    node j); coins [D] and final: uniforms in [0, 1). Returns (accept_nodes [S+1], num_correct, bonus).
    accept: the comparison of ACCEPT_RULES ("lt" is section 6.4's).
    """
    accepts = _accept_rule(accept)
    D = _validate_tree(tokens, parents, num_steps)
    probs = _probs_rows(target_probs, D)
    if len(coins) != D:
        raise ValueError(f"coins: expected D = {D} uniforms, got {len(coins)}")
    coins = [_check_uniform(f"coins[{j}]", c) for j, c in enumerate(coins)]
    final = _check_uniform("final", final)
    children = children_of(parents)

    path = [0]
    cur = 0
    u = coins[0]
    rejected = []  # tokens of cur's children that were visited and not accepted
    while len(path) - 1 < num_steps:
        accepted = -1
        acc = 0.0
        for child in children[cur]:  # sibling order
            acc = acc + probs[cur][tokens[child]]
            if accepts(u, acc):
                accepted = child
                break
            rejected.append(tokens[child])  # removed from cur's residual
        if accepted == -1:
            break
        path.append(accepted)
        cur = accepted
        u = coins[accepted]
        rejected = []

    residual = [0.0 if t in rejected else probs[cur][t] for t in range(len(probs[cur]))]
    total = _running_sum(residual)
    if not total > 0.0:
        raise ValueError(f"target_probs: the residual at node {cur} has no positive mass left; nothing can be drawn")
    bonus = draw(residual, final * total)  # inverse CDF against u * sum(residual), last-positive fallback
    return _pad(path, num_steps + 1), len(path) - 1, bonus


def naive_verify(target_probs, draft: int, coin, final, *, draft_q=None, draft_p=None,
                 accept: str = "lt") -> tuple[list[int], int, int]:
    """The naive-EAGLE accept step of one request (section 6.7): the chain [root, draft].

    target_probs [2, V] float64: p_0 (at the root), p_1 (after the draft token); draft: d;
    coin, final: uniforms in [0, 1). Exactly one of draft_q [V] (exact sampling: d was drawn from
    q; a rejection draws from max(p_0 - q, 0)) and draft_p (the shortcut: q(d) = draft_p; a
    rejection draws from p_0). d is accepted iff coin < p_0(d) / q(d) in IEEE float64 (q(d) = 0:
    the ratio is +inf, or NaN when p_0(d) = 0 too, which rejects). The bonus after an accepted d is
    drawn from p_1. Returns (accept_nodes [2], num_correct, bonus). accept: the comparison of
    ACCEPT_RULES ("lt" is section 6.7's).
    """
    accepts = _accept_rule(accept)
    if (draft_q is None) == (draft_p is None):
        raise ValueError("draft_q / draft_p: give exactly one (exact sampling / the shortcut)")
    probs = _probs_rows(target_probs, 2)
    V = len(probs[0])
    if not (isinstance(draft, (int, np.integer)) and 0 <= draft < V):
        raise ValueError(f"draft: a token id in [0, {V}), got {draft!r}")
    coin, final = _check_uniform("coin", coin), _check_uniform("final", final)
    if draft_q is not None:
        q = [float(x) for x in np.asarray(draft_q, dtype=np.float64)]
        if len(q) != V:
            raise ValueError(f"draft_q: expected {V} probabilities, got {len(q)}")
        q_d = q[draft]
    else:
        q_d = float(draft_p)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.float64(probs[0][draft]) / np.float64(q_d)
    accepted = bool(accepts(coin, ratio))
    if accepted:
        row = probs[1]
    elif draft_q is not None:
        row = [max(a - b, 0.0) for a, b in zip(probs[0], q)]
    else:
        row = probs[0]
    total = _running_sum(row)
    if not total > 0.0:
        raise ValueError("target_probs: the row to draw from has no positive mass; nothing can be drawn")
    return [0, 1 if accepted else -1], int(accepted), draw(row, final * total)


def _running_sum(xs: list[float]) -> float:
    """Left-to-right float64 sum: the last value of the cumulative sum `draw` walks (builtin sum()
    compensates rounding since Python 3.12, and could land above it)."""
    total = 0.0
    for x in xs:
        total = total + x
    return total


def _probs_rows(target_probs, D: int) -> list[list[float]]:
    rows = np.asarray(target_probs, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] != D:
        raise ValueError(f"target_probs: expected shape [D={D}, V], got {list(rows.shape)}")
    return [[float(x) for x in rows[j]] for j in range(D)]


# ---------------------------------------------------------------------------------------------
# the exact law of stochastic_verify's output (for losslessness proofs)


def _node_events(probs_row: list[float], child_tokens: list[int]):
    """The acceptance events at one node, for u uniform on [0, 1).

    The walk accepts child i iff acc_{i-1} <= u < acc_i (acc as the walk computes it, float64, in
    sibling order), so P(child i) = min(acc_i, 1) - min(acc_{i-1}, 1), P(none) = 1 - min(acc_m, 1).
    Returns (P(child i) for each i, P(none), the bonus law given none: residual / sum(residual),
    or None when the residual has no mass: stochastic_verify then raises).
    """
    accept = []
    acc_prev = 0.0
    acc = 0.0
    for t in child_tokens:
        acc = acc + probs_row[t]
        accept.append(max(0.0, min(acc, 1.0) - min(acc_prev, 1.0)))
        acc_prev = acc
    p_none = 1.0 - min(acc, 1.0)
    residual = [0.0 if t in child_tokens else probs_row[t] for t in range(len(probs_row))]
    total = _running_sum(residual)
    bonus_law = [x / total for x in residual] if total > 0.0 else None
    return accept, p_none, bonus_law


def first_token_distribution(tokens, parents, target_probs) -> list[float]:
    """P(the first token stochastic_verify emits == t) for every t [V], exactly (num_steps >= 1).

    The first token is the accepted root child's token, or, when no root child is accepted, the
    bonus drawn from the root's residual. For a lossless scheme this equals target_probs[0]. Mass
    of the event in which stochastic_verify raises (an empty residual) is left out.
    """
    D = _validate_tree(tokens, parents, 1)
    probs = _probs_rows(target_probs, D)
    children = children_of(parents)
    V = len(probs[0])
    child_tokens = [tokens[c] for c in children[0]]
    accept, p_none, bonus_law = _node_events(probs[0], child_tokens)
    out = [0.0] * V
    for t, p in zip(child_tokens, accept):
        out[t] = out[t] + p
    if bonus_law is not None:
        for t in range(V):
            out[t] = out[t] + p_none * bonus_law[t]
    return out


def emitted_path_probability(tokens, parents, target_probs, emitted, *, num_steps: int) -> float:
    """P(stochastic_verify emits exactly `emitted` = accepted draft tokens + [bonus]), exactly.

    Enumerates every walk through the tree whose accepted tokens spell emitted[:-1] (several when
    siblings share a token) and multiplies the acceptance probabilities along it by the bonus's.
    """
    D = _validate_tree(tokens, parents, num_steps)
    probs = _probs_rows(target_probs, D)
    children = children_of(parents)
    emitted = [int(t) for t in emitted]
    if not 1 <= len(emitted) <= num_steps + 1:
        raise ValueError(f"emitted: expected 1 to num_steps + 1 = {num_steps + 1} tokens, got {len(emitted)}")

    def prob(cur: int, depth: int, rest: list[int]) -> float:
        if depth == num_steps:  # no child is visited; the bonus comes from the full distribution
            return probs[cur][rest[0]] if len(rest) == 1 else 0.0
        child_tokens = [tokens[c] for c in children[cur]]
        accept, p_none, bonus_law = _node_events(probs[cur], child_tokens)
        total = 0.0
        if len(rest) == 1:
            if bonus_law is not None:
                total = total + p_none * bonus_law[rest[0]]
        else:
            for child, p in zip(children[cur], accept):
                if tokens[child] == rest[0]:
                    total = total + p * prob(child, depth + 1, rest[1:])
        return total

    return prob(0, 0, emitted)
