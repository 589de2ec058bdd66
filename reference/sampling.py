"""Sampling (docs/semantics.md, section 4), one row at a time, in float64 with plain loops.

`filtered_probs` applies temperature, top-k, top-p and min-p in that order; `draw` is the
inverse-CDF draw in vocabulary order; `uniform_stream` is the per-request uniform stream.
"""

from __future__ import annotations

import math

import torch


def softmax(z: list[float]) -> list[float]:
    """Softmax of a list of float64 values (shifted by the max; -inf entries get 0)."""
    m = max(z)
    e = [math.exp(x - m) for x in z]
    total = sum(e)
    return [x / total for x in e]


def renormalize(p: list[float]) -> list[float]:
    total = sum(p)
    return [x / total for x in p]


def order_desc(p: list[float]) -> list[int]:
    """Token indices ordered by (p descending, index ascending)."""
    return sorted(range(len(p)), key=lambda i: (-p[i], i))


def keep_top_k(p: list[float], top_k: int) -> list[float]:
    keep = set(order_desc(p)[:top_k])
    return renormalize([p[i] if i in keep else 0.0 for i in range(len(p))])


def keep_top_p(p: list[float], top_p: float) -> list[float]:
    """Keep a kept token when the mass of the kept tokens before it (p desc, index asc) < top_p."""
    keep = set()
    mass_before = 0.0
    for rank, i in enumerate(order_desc(p)):
        if p[i] <= 0.0:
            break  # tokens already zeroed are not "kept tokens"
        if rank == 0 or mass_before < top_p:
            keep.add(i)
        mass_before = mass_before + p[i]
    return renormalize([p[i] if i in keep else 0.0 for i in range(len(p))])


def keep_min_p(p: list[float], min_p: float) -> list[float]:
    threshold = min_p * max(p)
    return renormalize([x if x >= threshold else 0.0 for x in p])


def filtered_probs(z, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> list[float]:
    """The sampling distribution of one row of dequantized logits z (temperature > 0)."""
    if not temperature > 0:
        raise ValueError(f"temperature: filtered_probs needs temperature > 0, got {temperature!r}")
    z = [float(x) for x in z]
    if any(math.isnan(x) or x == math.inf for x in z) or all(x == -math.inf for x in z):
        return [math.nan] * len(z)  # no distribution: NaN everywhere (section 4)
    p = softmax([x / temperature for x in z])  # 1.
    if top_k > 0:
        p = keep_top_k(p, top_k)  # 2.
    if top_p < 1.0:
        p = keep_top_p(p, top_p)  # 3.
    if min_p > 0.0:
        p = keep_min_p(p, min_p)  # 4.
    return p


def draw(p: list[float], u: float) -> int:
    """First index whose cumulative sum exceeds u; if none does, the last index with p > 0."""
    cumulative = 0.0
    for i, x in enumerate(p):
        cumulative = cumulative + x
        if cumulative > u:
            return i
    last_positive = -1
    for i, x in enumerate(p):
        if x > 0.0:
            last_positive = i
    if last_positive < 0:
        raise ValueError("p: no token has positive probability")
    return last_positive


def sample_token(z, u: float, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> int:
    """Section 4 for one row: filtered_probs then draw with the uniform u."""
    return draw(filtered_probs(z, temperature, top_k, top_p, min_p), u)


def uniform_stream(seed: int, request_index: int, n: int) -> torch.Tensor:
    """The n uniforms [n] float64 of request `request_index` in a call with `seed`."""
    g = torch.Generator("cpu").manual_seed(seed * 1_000_003 + request_index)
    return torch.rand(n, dtype=torch.float64, generator=g)
