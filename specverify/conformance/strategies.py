"""Domain-named input generators, one module: logits rows (grid-valued, tie-heavy FP8 rows,
all-equal rows, -inf masks, max at the vocab edges), draft step distributions, and the hypothesis
strategies built on them. Sizes are capped so interpreted kernels stay quick.

Every value is exact (see "Exact building blocks" below): the op goldens store what these
generators make, and regeneration must be a pure function of the seed, the catalogue and the
library versions, whatever instruction set torch's CPU kernels dispatch to
(tests/meta/test_golden_portability.py). Integer draws from a torch.Generator (randint, randperm)
are exact everywhere; torch.randn / torch.rand in float, softmax / exp / log / sin and a NaN's bits
after a dtype conversion are not. So floats are built from integer draws with exact arithmetic and
rounded once, to their dtype, by `cast` (tests/meta/test_registry.py refuses the inexact calls)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from specverify import dtypes

MAX_VOCAB = 300          # hypothesis cap; named edge cases go past kernel block sizes explicitly
MAX_ROWS = 9


# ---------------------------------------------------------------------------------------------
# Exact building blocks

# The quiet NaN every generated NaN carries. torch's conversions give a NaN a sign and payload
# that depend on the instruction set (float32 -> bfloat16: 0x7FC0 under ATEN_CPU_CAPABILITY=default,
# 0xFFFF under avx2 / avx512), and a golden stores the bits.
CANONICAL_NAN = {torch.float64: (torch.int64, 0x7FF8000000000000), torch.float32: (torch.int32, 0x7FC00000),
                 torch.float16: (torch.int16, 0x7E00), torch.bfloat16: (torch.int16, 0x7FC0)}


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`: one round-to-nearest-even conversion (finite values and infinities convert
    bit-identically on every instruction set), every NaN given CANONICAL_NAN's bits. FP8 is
    not made here (dtypes.to_logits_dtype quantizes with its scale)."""
    if dtype not in CANONICAL_NAN:
        raise ValueError(f"cast: {dtype} is not one of {sorted(map(str, CANONICAL_NAN))}")
    y = x.to(dtype)
    nan = torch.isnan(y)
    if bool(nan.any()):
        bits_dtype, bits = CANONICAL_NAN[dtype]
        y = y.clone()
        y.view(bits_dtype)[nan] = torch.tensor(bits, dtype=torch.int64).to(bits_dtype)
    return y


def unit_floats(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """float64 uniform on [0, 1): k / 2**53 with k an integer draw (exact)."""
    return torch.randint(0, 2**53, shape, generator=gen).double() / 2**53


def coins(gen: torch.Generator, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """bool [shape], each True with probability p (to 2**-24): an integer draw below ceil(p * 2**24)."""
    return torch.randint(0, 2**24, shape, generator=gen) < math.ceil(p * 2**24)


IRWIN_HALL_BITS = 20


def normalish(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """float64 values close to a standard normal, exactly: the Irwin-Hall sum of 12 uniform
    integers in [0, 2**20), centred and divided by 2**20 (mean 0, variance 1, |x| < 6). Every value
    is a multiple of 2**-20 below 2**23 * 2**-20, so float32 holds it exactly (cast rounds it
    once, to float16 or bfloat16)."""
    draws = torch.randint(0, 2**IRWIN_HALL_BITS, (12, *shape), generator=gen)
    return (draws.sum(0) - 6 * 2**IRWIN_HALL_BITS).double() / 2**IRWIN_HALL_BITS


# round(2**20 * 2**(j / 4)), j = 0..3: 2**x on a quarter grid, as integers (a table, no pow at run time)
QUARTER_POW2 = (1048576, 1246974, 1482910, 1763488)
POW2_RANGE = 8          # pow2_weights takes x in [-8, 8]


def pow2_weights(x: torch.Tensor) -> torch.Tensor:
    """int64 weights proportional to 2**x for finite x in [-8, 8], x rounded down to the quarter
    grid: w = QUARTER_POW2[h % 4] << (h // 4 + 8) with h = floor(4 x). Softmax-like (2**x =
    e**(0.69 x)) and exact: equal x give equal weights; a row of up to 2**12 weights sums below
    2**53, so float64 holds the sum exactly."""
    h = torch.floor(x.double() * 4)
    if not bool(torch.isfinite(h).all()) or bool((h.abs() > 4 * POW2_RANGE).any()):
        raise ValueError(f"pow2_weights: x must be finite and in [-{POW2_RANGE}, {POW2_RANGE}]")
    h = h.to(torch.int64)
    table = torch.tensor(QUARTER_POW2, dtype=torch.int64)
    return torch.bitwise_left_shift(table[torch.remainder(h, 4)], torch.div(h, 4, rounding_mode="floor") + POW2_RANGE)


def probs_from_weights(w: torch.Tensor) -> torch.Tensor:
    """float64 distributions over the last dim of int64 weights: w / sum(w), the sum exact and
    each entry one correctly rounded division."""
    total = w.sum(-1, keepdim=True)
    if bool((total >= 2**53).any()):
        raise ValueError("probs_from_weights: a row's weights sum to 2**53 or more (not exact in float64)")
    return w.double() / total.double()


def pow2_probs(x: torch.Tensor) -> torch.Tensor:
    """float64 distributions p ∝ 2**x over the last dim of logits x (`pow2_weights`): the softmax
    of x * ln 2, built exactly. A row holding NaN is NaN everywhere (as a softmax makes it)."""
    nan_rows = torch.isnan(x).any(-1, keepdim=True)
    p = probs_from_weights(pow2_weights(torch.where(torch.isnan(x), torch.zeros_like(x), x)))
    return cast(p.masked_fill(nan_rows, float("nan")), torch.float64)


def draw_from_weights(gen: torch.Generator, w: torch.Tensor) -> torch.Tensor:
    """int64 [rows]: one index per row of int64 weights [rows, V], drawn with probability
    w_i / sum(w) (to 2**-53) by an exact inverse CDF: the first index whose cumulative weight
    exceeds floor(k * sum / 2**53), k an integer draw."""
    k = torch.randint(0, 2**53, (w.shape[0],), generator=gen).tolist()
    cum = torch.cumsum(w, -1)
    return torch.tensor([int((cum[r] <= (k[r] * int(cum[r, -1])) >> 53).sum()) for r in range(w.shape[0])],
                        dtype=torch.int64)


def binade_rows(gen: torch.Generator, rows: int, cols: int, lo: int, hi: int) -> torch.Tensor:
    """float32 [rows, cols] of random sign and magnitude (1 + m / 2**23) * 2**e, m uniform in
    [0, 2**23), e uniform in [lo, hi]: every binade from 2**lo up to 2**(hi + 1) equally often, full
    24-bit significands (rounding and ulp cases at every scale). Built from the float32 bits."""
    if not -126 <= lo <= hi <= 127:
        raise ValueError(f"binade_rows: need -126 <= lo <= hi <= 127, got {lo}, {hi}")
    m = torch.randint(0, 2**23, (rows, cols), generator=gen)
    e = torch.randint(lo, hi + 1, (rows, cols), generator=gen)
    sign = torch.randint(0, 2, (rows, cols), generator=gen)
    magnitude = (((e + 127) << 23) | m).to(torch.int32).view(torch.float32)
    return torch.where(sign == 1, -magnitude, magnitude)


# ---------------------------------------------------------------------------------------------
# Logits rows and distributions



def grid_logits(gen: torch.Generator, rows: int, vocab: int, *, levels: int = 24) -> torch.Tensor:
    """float32 logits on a coarse grid (multiples of 1/4): exactly tied or clearly apart, so every
    precision orders them the same way."""
    return torch.randint(-levels, levels + 1, (rows, vocab), generator=gen).float() / 4


def tie_heavy_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Logits whose top values repeat: few distinct levels, the maximum shared by several tokens."""
    x = torch.randint(-3, 3, (rows, vocab), generator=gen).float()
    x[:, torch.randint(0, vocab, (max(2, vocab // 7),), generator=gen)] = 3.0
    return x


def as_logits_dtype(x: torch.Tensor, dtype_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Deliver float32 logits in a registry dtype with a static scale of 1: (values, scale [N,1])."""
    if dtype_name == "float64":                 # ops whose inputs are float64 probabilities
        return x.double(), torch.ones((*x.shape[:-1], 1))
    if not dtypes.dtype_info(dtype_name).is_fp8:
        return cast(x, dtypes.dtype_info(dtype_name).torch_dtype), torch.ones((*x.shape[:-1], 1))
    return dtypes.to_logits_dtype(x, dtype_name, scale_mode="static", static_scale=1.0)


def edge_logits(vocab: int) -> dict[str, torch.Tensor]:
    """Named edge rows [N, vocab]."""
    rows = {}
    rows["all-equal"] = torch.zeros((2, vocab))
    x = torch.zeros((3, vocab))
    x[0, 0], x[1, vocab - 1], x[2, [0, vocab - 1]] = 5.0, 5.0, 5.0
    rows["max-at-edges"] = x
    m = torch.full((2, vocab), float("-inf"))
    m[0, vocab // 2] = 1.0
    m[1, [1, vocab - 2, vocab // 3]] = 0.5
    rows["neg-inf-mask"] = m
    return rows


def probs_from(gen: torch.Generator, shape: tuple[int, ...], vocab: int, *, levels: int = 8) -> torch.Tensor:
    """float32 distributions with exact ties: a level in [0, levels) per token, p ∝ 2**(3 level / 4)
    (levels 2**0.75 ~ e**0.5 apart, as a softmax of level / 2), built exactly (`pow2_probs`) and
    rounded once to float32; equal levels give bit-equal probabilities."""
    x = torch.randint(0, levels, (*shape, vocab), generator=gen).double() * 3 / 4
    return cast(pow2_probs(x), torch.float32)


@st.composite
def logits_rows(draw, *, max_vocab: int = MAX_VOCAB):
    """(seed, rows, vocab, kind): a recipe; tensors are built from the seed so shrinking is cheap."""
    seed = draw(st.integers(0, 2**31 - 1))
    rows = draw(st.integers(1, MAX_ROWS))
    vocab = draw(st.integers(2, max_vocab))
    kind = draw(st.sampled_from(["grid", "tie-heavy"]))
    return seed, rows, vocab, kind


def build_logits(recipe) -> torch.Tensor:
    seed, rows, vocab, kind = recipe
    gen = torch.Generator().manual_seed(seed)
    return (grid_logits if kind == "grid" else tie_heavy_rows)(gen, rows, vocab)


@st.composite
def tree_shapes(draw):
    """(seed, bs, topk, num_steps, num_draft_tokens, vocab) of a valid EAGLE tree."""
    seed = draw(st.integers(0, 2**31 - 1))
    bs = draw(st.integers(1, 4))
    topk = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 4))
    if topk == 1:
        d = steps + 1
    else:
        d = draw(st.integers(2, min(1 + topk + (steps - 1) * topk * topk, 10)))
    vocab = draw(st.integers(max(topk, 2), 40))
    return seed, bs, topk, steps, d, vocab


# ---------------------------------------------------------------------------------------------
# The hard cases: ulp-adjacent values, NaN, infinities, scales other than 1.

SCALE_KINDS = ("1", "0.37", "3.5", "per-row")     # static scales and a per-row scale


def ulp_adjacent_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """float32 rows whose top values are float32 neighbours (torch.nextafter): a float32 softmax
    merges them, the upcast logits do not. Row 0 starts with the issue's [0.49999997, 0.5]."""
    x = grid_logits(gen, rows, vocab) - 8.0                     # everything well below the top
    for r in range(rows):
        top = torch.tensor(float(torch.randint(-4, 5, (), generator=gen)) / 8 + 0.5)
        up, down = torch.nextafter(top, torch.tensor(1e9)), torch.nextafter(top, torch.tensor(-1e9))
        cols = torch.randperm(vocab, generator=gen)[:3]
        for c, v in zip(cols.tolist(), (down, top, up)):
            x[r, c] = v
    if vocab >= 2:
        x[0, 0], x[0, 1] = 0.49999997, 0.5
    return x


def nan_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Rows holding NaN: one NaN, several NaNs (ties among NaNs), NaN beside +inf, all NaN."""
    x = grid_logits(gen, rows, vocab)
    for r in range(rows):
        kind = r % 4
        cols = torch.randperm(vocab, generator=gen)[:3].tolist()
        if kind == 0:
            x[r, cols[0]] = float("nan")
        elif kind == 1:
            x[r, cols] = float("nan")
        elif kind == 2:
            x[r, cols[0]] = float("inf")
            x[r, cols[-1]] = float("nan")
        else:
            x[r, :] = float("nan")
    return x


def inf_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """+inf ties, an all -inf row, -inf beside finite values."""
    x = grid_logits(gen, rows, vocab)
    for r in range(rows):
        cols = torch.randperm(vocab, generator=gen)[:2].tolist()
        if r % 3 == 0:
            x[r, cols] = float("inf")
        elif r % 3 == 1:
            x[r, :] = float("-inf")
        else:
            x[r, cols] = float("-inf")
    return x


def row_scales(gen: torch.Generator, rows: int, kind: str) -> torch.Tensor:
    """A scale [rows, 1] float32 of one of SCALE_KINDS: static (every row alike) or per row."""
    if kind == "per-row":    # 0.25 + 3.75 * k / 2**24 for an integer k < 2**24: exact in float64, rounded once
        return cast(0.25 + torch.randint(0, 2**24, (rows, 1), generator=gen).double() * 3.75 / 2**24, torch.float32)
    return torch.full((rows, 1), float(kind), dtype=torch.float32)


def with_scale(x: torch.Tensor, dtype_name: str, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits x [N, V] in a registry dtype with a scale of `kind`: (values, scale [N, 1]).

    FP8: quantized with that static scale, or the per-row rule of docs/semantics.md section 2.
    Other dtypes (at the op level a scale can accompany any logits dtype): cast(x, dtype) and the scale.
    """
    if dtype_name == "float64":
        return x.double(), row_scales(gen, x.shape[0], kind)
    if dtypes.dtype_info(dtype_name).is_fp8:
        if kind == "per-row":
            return dtypes.to_logits_dtype(x, dtype_name, scale_mode="per_row")
        return dtypes.to_logits_dtype(x, dtype_name, scale_mode="static", static_scale=float(kind))
    return cast(x, dtypes.dtype_info(dtype_name).torch_dtype), row_scales(gen, x.shape[0], kind)


ROW_KINDS = {"grid": grid_logits, "tie-heavy": tie_heavy_rows, "ulp": ulp_adjacent_rows, "nan": nan_rows,
             "inf": inf_rows}


def scales():
    """Hypothesis: a scale kind of SCALE_KINDS."""
    return st.sampled_from(SCALE_KINDS)


@st.composite
def hard_logits_rows(draw, *, max_vocab: int = MAX_VOCAB, kinds: tuple[str, ...] = tuple(ROW_KINDS)):
    """(seed, rows, vocab, kind, scale kind): a recipe over every row kind, the hard ones included;
    tensors are built from the seed (`build_hard_logits`), so shrinking is cheap."""
    seed = draw(st.integers(0, 2**31 - 1))
    rows = draw(st.integers(1, MAX_ROWS))
    vocab = draw(st.integers(2, max_vocab))
    return seed, rows, vocab, draw(st.sampled_from(kinds)), draw(scales())


def build_hard_logits(recipe) -> torch.Tensor:
    seed, rows, vocab, kind = recipe[:4]
    return ROW_KINDS[kind](torch.Generator().manual_seed(seed), rows, vocab)


def ulp_rows():
    """Hypothesis: recipes of ulp-adjacent rows."""
    return hard_logits_rows(kinds=("ulp",))


def nan_logits_rows():
    """Hypothesis: recipes of rows holding NaN."""
    return hard_logits_rows(kinds=("nan",))
