"""The fused layer ops read as plain maths (float64 numpy, one loop per row / token / head): the
contracts of `add_rmsnorm`, `rotary_kv_write` and `silu_mul` (docs/semantics.md 6.12).

- add_rmsnorm: s = x + residual; y_i = s_i / sqrt(sum_j s_j^2 / H + eps) * w_i over the H entries
  of each row; a row whose mean square is not finite (an inf or NaN in it) is NaN throughout.
- rotary_kv_write: token t at position p = positions[t]; in every query and key head, entries i and
  i + D/2 form the pair (a, b) -> (a cos_pi - b sin_pi, b cos_pi + a sin_pi); the query heads are
  returned, the rotated key heads and the unchanged value heads land in slot slots[t] of the caches
  (the later token wins a slot two tokens name; slots no token names keep their entries).
- silu_mul: the row's first half is the gate g, the second the up projection u: y = g / (1 + e^-g) * u.
- embed_concat: the draft head's input row of a token: its embedding row, then its feature.
"""

from __future__ import annotations

import math

import numpy as np


def add_rmsnorm(*, x, weight, residual=None, eps=1e-6, at=None) -> tuple[np.ndarray, np.ndarray]:
    """-> (normed, sum), float64 arrays of x's shape. Array-likes in; values read as float64.
    at: one lane index per request of x [bs, q, H]: only row x[b, at[b]] of each request (plus the
    residual's), the results [bs, 1, H]."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    if at is not None:
        picked = [int(j) for j in np.asarray(at)]
        x = np.stack([x[b, j] for b, j in enumerate(picked)])[:, None] if picked else x[:, :1]
        if residual is not None:
            r = np.asarray(residual, dtype=np.float64)
            residual = np.stack([r[b, j] for b, j in enumerate(picked)])[:, None] if picked else r[:, :1]
    s = x if residual is None else x + np.asarray(residual, dtype=np.float64)
    rows = s.reshape(-1, s.shape[-1])
    out = np.empty_like(rows)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for m, row in enumerate(rows):
            mean_sq = sum(float(v) * float(v) for v in row) / len(row)
            if not math.isfinite(mean_sq):          # an inf or NaN in the row: it has no scale
                out[m] = float("nan")
                continue
            root = math.sqrt(mean_sq + eps)
            inv = 1.0 / root if root > 0 else float("inf")
            out[m] = [float(v) * inv * float(g) for v, g in zip(row, w)]
    return out.reshape(s.shape), s


def rotary_kv_write(*, qkv, positions, cos, sin, k_cache, v_cache, slots, num_q_heads):
    """-> (q [T, Hq, D], k_cache, v_cache) float64 arrays: the rotated queries and the caches after
    the writes. Array-likes in; values read as float64."""
    qkv = np.asarray(qkv, dtype=np.float64)
    cos, sin = np.asarray(cos, dtype=np.float64), np.asarray(sin, dtype=np.float64)
    k_out = np.array(k_cache, dtype=np.float64)
    v_out = np.array(v_cache, dtype=np.float64)
    tokens, heads, dim = qkv.shape
    half, nkv = dim // 2, (heads - num_q_heads) // 2
    q = np.empty((tokens, num_q_heads, dim), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(tokens):
            p, slot = int(positions[t]), int(slots[t])
            for h in range(heads):
                head = qkv[t, h]
                if h < num_q_heads + nkv:
                    rotated = np.empty(dim)
                    for i in range(half):
                        a, b, c, s = head[i], head[i + half], cos[p, i], sin[p, i]
                        rotated[i], rotated[i + half] = a * c - b * s, b * c + a * s
                    if h < num_q_heads:
                        q[t, h] = rotated
                    else:
                        k_out[slot, h - num_q_heads] = rotated
                else:
                    v_out[slot, h - num_q_heads - nkv] = head
    return q, k_out, v_out


def silu_mul(*, gate_up) -> np.ndarray:
    """-> float64 array [..., I] of gate_up [..., 2I]."""
    gu = np.asarray(gate_up, dtype=np.float64)
    inter = gu.shape[-1] // 2
    rows = gu.reshape(-1, 2 * inter)
    out = np.empty((rows.shape[0], inter))
    with np.errstate(invalid="ignore", over="ignore"):
        for m, row in enumerate(rows):
            for i in range(inter):
                g, u = float(row[i]), float(row[inter + i])
                sig = 1.0 / (1.0 + math.exp(-g)) if g > -700 else 0.0
                out[m, i] = (g * sig if math.isfinite(g) else (g if g > 0 else float("nan"))) * u
    return out.reshape(*gu.shape[:-1], inter)


def embed_concat(*, ids, table, features) -> np.ndarray:
    """-> float64 array [bs, q, 2H]: for each token, its embedding row then its feature (a copy)."""
    table = np.asarray(table, dtype=np.float64)
    feats = np.asarray(features, dtype=np.float64)
    bs, q = feats.shape[:2]
    out = np.empty((bs, q, 2 * table.shape[1]))
    for b in range(bs):
        for j in range(q):
            out[b, j] = np.concatenate([table[ids[b][j]], feats[b, j]])
    return out
