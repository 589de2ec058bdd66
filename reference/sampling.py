"""Sampling (docs/semantics.md, section 4), one row at a time, in float64 with plain loops.

`filtered_probs` applies temperature, top-k, top-p and min-p in that order; `draw` is the
inverse-CDF draw in vocabulary order; `counter_uniform` is the uniform u(seed, request, position,
draw) that every sampled decision uses (sections 4 and 6.5). `apply_penalties` is section 7: the
repetition, frequency and presence penalties of a row, computed from the token lists of its
context (prompt, output so far) before any of the above; `first_max_index` is greedy over the
penalized values.
"""

from __future__ import annotations

import math
import numbers


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


# The tie rule at a top-k / top-p cut. "index": the cut keeps exactly the tokens before it in the
# order (p descending, index ascending): specverify's semantics. "value": the cut is a probability
# value and every token whose p equals the last kept token's p is kept too (an engine that filters
# by `p >= pivot`); docs/conformance.md, "Conventions".
TIE_RULES = ("index", "value")


def _keep_ties(p: list[float], keep: set, ties: str) -> set:
    if ties not in TIE_RULES:
        raise ValueError(f"ties: one of {TIE_RULES}, got {ties!r}")
    if ties == "index" or not keep:
        return keep
    cut = min(p[i] for i in keep)
    return {i for i in range(len(p)) if p[i] >= cut and p[i] > 0.0}


def keep_top_k(p: list[float], top_k: int, ties: str = "index") -> list[float]:
    keep = _keep_ties(p, set(order_desc(p)[:top_k]), ties)
    return renormalize([p[i] if i in keep else 0.0 for i in range(len(p))])


def keep_top_p(p: list[float], top_p: float, ties: str = "index") -> list[float]:
    """Keep a kept token when the mass of the kept tokens before it (p desc, index asc) < top_p."""
    keep = set()
    mass_before = 0.0
    for rank, i in enumerate(order_desc(p)):
        if p[i] <= 0.0:
            break  # tokens already zeroed are not "kept tokens"
        if rank == 0 or mass_before < top_p:
            keep.add(i)
        mass_before = mass_before + p[i]
    keep = _keep_ties(p, keep, ties)
    return renormalize([p[i] if i in keep else 0.0 for i in range(len(p))])


def keep_min_p(p: list[float], min_p: float) -> list[float]:
    threshold = min_p * max(p)
    return renormalize([x if x >= threshold else 0.0 for x in p])


def filtered_probs(z, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, *,
                   topk_ties: str = "index", topp_ties: str = "index") -> list[float]:
    """The sampling distribution of one row of dequantized logits z (temperature > 0). The tie
    rules at the top-k and top-p cuts are TIE_RULES ("index" is section 4's)."""
    if not temperature > 0:
        raise ValueError(f"temperature: filtered_probs needs temperature > 0, got {temperature!r}")
    z = [float(x) for x in z]
    if any(math.isnan(x) or x == math.inf for x in z) or all(x == -math.inf for x in z):
        return [math.nan] * len(z)  # no distribution: NaN everywhere (section 4)
    p = softmax([x / temperature for x in z])  # 1.
    if top_k > 0:
        p = keep_top_k(p, top_k, topk_ties)  # 2.
    if top_p < 1.0:
        p = keep_top_p(p, top_p, topp_ties)  # 3.
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


# The counter-based uniform, restated from docs/semantics.md section 4 (this module shares no code
# with the optimized decoder). All arithmetic is on Python ints; the result is exact.
WORD = 2**32                       # every counter and every hash value lies in [0, WORD)
MIX_STEPS = ((15, 0x7A9D5587), (14, 0x29BAE531), (16, None))   # xor-shift right, then multiply
SALTS = (0xA5C31F27, 0x3D8EB46C)   # lane 0, lane 1


def mix(x: int) -> int:
    """The 32-bit mix of section 4: xor-shift / multiply mod 2**32, twice, then an xor-shift."""
    x = x % WORD
    for shift, multiplier in MIX_STEPS:
        x = x ^ (x >> shift)
        if multiplier is not None:
            x = (x * multiplier) % WORD
    return x


def counter_uniform(seed: int, request: int, position: int, draw: int) -> float:
    """u(seed, request, position, draw) in [0, 1): a float64 with 53 random bits.

    Each argument is an int in [0, 2**32); anything else raises (TypeError for a non-int or a
    bool, ValueError naming the argument and its bound for an out-of-range int).
    """
    counters = (("seed", seed), ("request", request), ("position", position), ("draw", draw))
    for name, value in counters:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}: counter_uniform needs an int, got {type(value).__name__} {value!r}")
        if not 0 <= value < WORD:
            raise ValueError(f"{name}: must be an int in [0, 2**32), got {value!r}")
    lanes = []
    for salt in SALTS:
        h = mix(int(seed) ^ salt)
        for value in (request, position, draw):
            h = mix(h ^ int(value))
        lanes.append(h)
    high = lanes[0] // 2**5        # the top 27 bits of lane 0
    low = lanes[1] // 2**6         # the top 26 bits of lane 1
    return (high * 2**26 + low) / 2**53


# ---------------------------------------------------------------------------------------------
# Penalties (docs/semantics.md section 7), restated here from the page.

REPETITION_BOUNDS = (1e-18, 1e18)   # max(r, 1/r) <= 1e18 keeps every penalized logit finite
ADDITIVE_BOUND = 2.0                # frequency and presence penalties lie in [-2, 2]


def check_penalties(repetition_penalty, frequency_penalty, presence_penalty) -> tuple[float, float, float]:
    """The three penalties as floats, or a ValueError naming the argument and its bound."""
    lo, hi = REPETITION_BOUNDS
    bounds = (("repetition_penalty", repetition_penalty, lo, hi, "1 = off"),
              ("frequency_penalty", frequency_penalty, -ADDITIVE_BOUND, ADDITIVE_BOUND, "0 = off"),
              ("presence_penalty", presence_penalty, -ADDITIVE_BOUND, ADDITIVE_BOUND, "0 = off"))
    values = []
    for name, value, low, high, off in bounds:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name}: must be a real number in [{low:g}, {high:g}] ({off}), got {value!r}")
        if not low <= float(value) <= high:   # NaN fails both comparisons
            raise ValueError(f"{name}: must be in [{low:g}, {high:g}] ({off}), got {value!r}")
        values.append(float(value))
    return values[0], values[1], values[2]


def penalties_active(repetition_penalty: float, frequency_penalty: float, presence_penalty: float) -> bool:
    return repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0


def apply_penalties(z, prompt, output, repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
                    presence_penalty: float = 0.0) -> list[float]:
    """One row of dequantized logits z, penalized by its context.

    prompt: the prompt's token ids; output: every token generated so far (the context's tokens after
    the prompt). A token seen in either is divided by the repetition penalty when its logit is > 0,
    multiplied by it otherwise (a presence test: how often it occurs does not matter). A token the
    output holds c > 0 times then loses frequency_penalty * c, and presence_penalty once."""
    counts = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    seen = set(prompt) | set(counts)
    row = []
    for i, x in enumerate(z):
        x = float(x)
        if i in seen and repetition_penalty != 1.0:
            x = x / repetition_penalty if x > 0 else x * repetition_penalty
        c = counts.get(i, 0)
        if c > 0:
            x = x - frequency_penalty * c
            x = x - presence_penalty
        row.append(x)
    return row


def first_max_index(values) -> int:
    """Greedy over float64 values: the first index of the maximum, a NaN ranking above everything
    (the first NaN wins), as for the upcast logits of section 3."""
    best = None
    for i, x in enumerate(values):
        x = float(x)
        if math.isnan(x):
            return i
        if best is None or x > values[best]:
            best = i
    return best
