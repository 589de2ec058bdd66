"""What padded lanes hold, filled from outside: zeros, garbage or NaN.

A decoder that runs at bucket shapes (`pad_batches=True`, what CUDA graphs replay) fills the lanes
past the live batch with its pad row. Those lanes read and write only what no running request
owns: the pad row's device state (its pending token, its draft, its recurrent / conv / tracking
slots, its penalty rows) and the sink page of every K/V buffer. `fill_pad_contents` overwrites all
of that, so a test can run the same padded workload with different pad contents and require every
running request's results to be bit-identical: same shapes and same kernels on both sides, so the
equality is exact on every machine, and any value that crosses from a pad lane into a live one
(NaN above all) shows.

Left alone, because they are the pad row's structure rather than its contents: its finished flag
(a pad lane never runs as a request), its lengths and budget, and its draft-tree indices
(`kept_flat`, `beam_flat`: a decoder never holds an invalid tree, so garbage there would test the
tree kernels' bounds, not the padding).
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.models.kv_cache import SINK_SLOT

PAD_CONTENTS = ("zeros", "garbage", "nan")

# Integer state fields that hold token ids (filled with in-vocabulary garbage); every other
# integer field is structure and left alone.
TOKEN_FIELDS = frozenset({"pending", "kept_tokens", "draft"})


def fill_pad_contents(dec, kind: str, seed: int) -> list[str]:
    """Overwrite the pad contents of a started decoder `dec` with `kind` (one of PAD_CONTENTS):
    zeros; garbage (seeded: tokens in [0, vocab), floats of magnitude up to 1e3, counts and flags
    at random); or NaN in every float and the last vocabulary id (the boundary) in every token.
    Returns the names of what was filled (a test asserts it reached the caches and states)."""
    if kind not in PAD_CONTENTS:
        raise ValueError(f"kind must be one of {PAD_CONTENTS}, got {kind!r}")
    gen = torch.Generator().manual_seed(seed)
    vocab = dec.models.target.config.vocab_size
    row, filled = dec.pad_row, []

    def fill(name: str, view: torch.Tensor, token: bool = False) -> None:
        if view.numel() == 0:
            return
        view.copy_(_contents(kind, view, token, vocab, gen).to(view.device))
        filled.append(name)

    rs = dec.state.requests
    fill("pending", rs.pending[row:row + 1], token=True)
    for field in dataclasses.fields(dec.state):
        value = getattr(dec.state, field.name)
        if field.name == "requests" or not isinstance(value, torch.Tensor):
            continue
        if value.is_floating_point() or field.name in TOKEN_FIELDS:
            fill(field.name, value[row:row + 1], token=field.name in TOKEN_FIELDS)
    if rs.penalty is not None:
        fill("penalty counts", rs.penalty.counts[row:row + 1])
        fill("penalty prompt", rs.penalty.prompt[row:row + 1])
    states = dec.cache.states
    if states is not None:
        tracking = int(states.tracking_slot(torch.tensor(row)))
        for name, stacked in (("recurrent", states.stacked), ("conv", states.conv_stacked)):
            fill(f"{name} slot", stacked[:, row:row + 1])
            fill(f"tracking {name} slot", stacked[:, tracking:tracking + 1])
    sink = slice(SINK_SLOT, SINK_SLOT + dec.cache.table.page_size)     # the whole sink page
    caches = [("target", dec.cache.kv)] + ([("draft", dec.cache.draft_kv)] if dec.cache.draft_kv is not None else [])
    for owner, kv in caches:
        for i, (k, v) in enumerate(zip(kv.k, kv.v)):
            fill(f"{owner} K sink [{i}]", k[sink])
            fill(f"{owner} V sink [{i}]", v[sink])
    return filled


def _contents(kind: str, like: torch.Tensor, token: bool, vocab: int, gen: torch.Generator) -> torch.Tensor:
    shape = like.shape
    if kind == "zeros":
        return torch.zeros(shape, dtype=like.dtype)
    if token:
        if kind == "nan":
            return torch.full(shape, vocab - 1, dtype=like.dtype)
        return torch.randint(0, vocab, shape, generator=gen).to(like.dtype)
    if like.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool() if kind == "garbage" else torch.ones(shape, dtype=torch.bool)
    if not like.is_floating_point():
        return torch.randint(0, 7, shape, generator=gen).to(like.dtype) if kind == "garbage" else \
            torch.full(shape, torch.iinfo(like.dtype).max // 2, dtype=like.dtype)
    if kind == "nan":
        return torch.full(shape, float("nan"), dtype=like.dtype)
    # Integer draws scaled by a power of two: exact, the same bits on every machine.
    return (torch.randint(-2**20, 2**20, shape, generator=gen, dtype=torch.int64).double() / 2**10).to(like.dtype)
