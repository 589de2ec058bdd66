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
