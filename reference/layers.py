"""The fused layer ops read as plain maths (float64 numpy, one loop per row / token / head): the
contracts of `add_rmsnorm`, `norm_matmul`, `rotary_kv_write` and `silu_mul` (docs/semantics.md 6.12,
6.21).

- add_rmsnorm: s = x + residual; y_i = s_i / sqrt(sum_j s_j^2 / H + eps) * w_i over the H entries
  of each row; a row whose mean square is not finite (an inf or NaN in it) is NaN throughout.
- norm_matmul: add_rmsnorm's (y, s) with s and y rounded to the op's format (x's dtype: `round_to`),
  then out_n = sum_k y_k W^T[n, k], the dot of each row with each row of W^T, as an exact sum
  rounded once to float64.
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

# A binary floating-point format as (fraction bits, least normal exponent, greatest exponent): a
# finite value of it is a multiple of 2**(max(e, emin) - fraction bits) below 2**(emax + 1), e the
# exponent of its leading bit. float64 itself is the identity.
FORMATS = {"float32": (23, -126, 127), "float16": (10, -14, 15), "bfloat16": (7, -126, 127)}


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


def round_to_format(values, fmt: str | None) -> np.ndarray:
    """float64 array of `values` each rounded to nearest, ties to even, in the format `fmt` (a key
    of FORMATS; None or "float64": unchanged), from its float64 value: the format's subnormals
    below its least normal exponent, inf past its greatest finite value (from the midpoint between
    that value and the next power of two up), NaN, inf and signed zeros as they are."""
    out = np.array(values, dtype=np.float64)
    if fmt is None or fmt == "float64":
        return out
    if fmt not in FORMATS:
        raise ValueError(f"round_to_format: unknown format {fmt!r}; known: float64, {', '.join(FORMATS)}")
    fraction, emin, emax = FORMATS[fmt]
    overflow = (2.0 - 2.0 ** -(fraction + 1)) * 2.0 ** emax     # the least magnitude that rounds to inf
    flat = out.reshape(-1)
    for i, v in enumerate(flat):
        v = float(v)
        if not math.isfinite(v) or v == 0.0:
            continue
        if abs(v) >= overflow:
            flat[i] = math.copysign(float("inf"), v)
            continue
        lead = math.frexp(v)[1] - 1                     # |v| in [2**lead, 2**(lead + 1))
        quantum = max(lead, emin) - fraction            # the spacing of the format's values there
        steps = round(math.ldexp(v, -quantum))          # exact scaling; round() ties to even
        flat[i] = math.copysign(math.ldexp(float(steps), quantum), v)
    return out


def _dot(a, b) -> float:
    """sum_k a_k b_k: the exact sum of the float64 products, rounded once (math.fsum); a plain
    running sum where that one has no value (inf - inf: NaN) or passes float64's range (inf)."""
    products = [float(u) * float(v) for u, v in zip(a, b)]
    try:
        return math.fsum(products)
    except (ValueError, OverflowError):
        return sum(products, 0.0)


def norm_matmul(*, x, norm_weight, weight_t, residual=None, eps=1e-6,
                round_to=None, gated=False) -> tuple[np.ndarray, np.ndarray]:
    """-> (out [..., N], sum [..., H]), float64 arrays, for x [..., H], weight_t [N, H] (W^T).
    Array-likes in; values read as float64. round_to: the format the op rounds to (x's dtype:
    "float32", "float16", "bfloat16"; None or "float64" for none): the sum x + residual is rounded
    to it, add_rmsnorm normalizes that sum, and its result is rounded to it before the product;
    out itself is left in float64 (the op's one rounding of out is the comparison's tolerance).
    gated: weight_t's rows are a gate's N/2 then an up's N/2; out [..., N/2] is silu_mul of the
    product, the product rounded to round_to first."""
    x = np.asarray(x, dtype=np.float64)
    s = x if residual is None else x + np.asarray(residual, dtype=np.float64)
    s = round_to_format(s, round_to)
    normed, _ = add_rmsnorm(x=s, weight=norm_weight, eps=eps)
    normed = round_to_format(normed, round_to)
    w = np.asarray(weight_t, dtype=np.float64)
    rows = normed.reshape(-1, normed.shape[-1])
    out = np.empty((rows.shape[0], w.shape[0]))
    with np.errstate(invalid="ignore", over="ignore"):
        for m, row in enumerate(rows):
            for n, column in enumerate(w):
                out[m, n] = _dot(row, column)
    out = out.reshape(*s.shape[:-1], w.shape[0])
    if gated:
        out = silu_mul(gate_up=round_to_format(out, round_to))
    return out, s


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
