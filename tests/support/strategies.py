"""Domain-named input generators, one module: logits rows (grid-valued, tie-heavy FP8 rows,
all-equal rows, -inf masks, max at the vocab edges), draft step distributions, and the hypothesis
strategies built on them. Sizes are capped so interpreted kernels stay quick."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from specverify import dtypes

MAX_VOCAB = 300          # hypothesis cap; named edge cases go past kernel block sizes explicitly
MAX_ROWS = 9


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
    """float32 distributions with exact ties: softmax of grid logits."""
    x = torch.randint(0, levels, (*shape, vocab), generator=gen).float() / 2
    return torch.softmax(x, dim=-1)


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
    if kind == "per-row":
        return (0.25 + 3.75 * torch.rand((rows, 1), generator=gen)).float()
    return torch.full((rows, 1), float(kind), dtype=torch.float32)


def with_scale(x: torch.Tensor, dtype_name: str, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits x [N, V] in a registry dtype with a scale of `kind`: (values, scale [N, 1]).

    FP8: quantized with that static scale, or the per-row rule of docs/semantics.md section 2.
    Other dtypes (at the op level a scale can accompany any logits dtype): x.to(dtype) and the scale.
    """
    if dtype_name == "float64":
        return x.double(), row_scales(gen, x.shape[0], kind)
    if dtypes.dtype_info(dtype_name).is_fp8:
        if kind == "per-row":
            return dtypes.to_logits_dtype(x, dtype_name, scale_mode="per_row")
        return dtypes.to_logits_dtype(x, dtype_name, scale_mode="static", static_scale=float(kind))
    return x.to(dtypes.dtype_info(dtype_name).torch_dtype), row_scales(gen, x.shape[0], kind)


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
