"""Deterministic case builders: prompts, budgets, models shared across a test module."""

from __future__ import annotations

import functools

import torch

from specverify import build_models


def ragged_prompts(seed: int, bs: int, vocab: int, min_len: int = 1, max_len: int = 24) -> list[list[int]]:
    """`bs` prompts of random lengths in [min_len, max_len] and random ids, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (bs,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def ragged_budgets(seed: int, bs: int, low: int = 1, high: int = 16) -> list[int]:
    """Per-request max_new_tokens in [low, high]; the first request always gets exactly `low`."""
    g = torch.Generator().manual_seed(seed + 1)
    budgets = torch.randint(low, high + 1, (bs,), generator=g).tolist()
    budgets[0] = low
    return budgets


@functools.lru_cache(maxsize=32)
def cached_models(preset: str = "tiny", **kwargs):
    """Models are deterministic from their arguments, so tests may share one build."""
    return build_models(preset, device="cpu", **kwargs)


_ORACLES: dict[tuple, torch.Tensor] = {}


def steered_cached_models(agreement: float, prompts, max_new_tokens, spec, *, seed: int | None = None,
                          preset: str = "tiny", **kwargs):
    """`cached_models(preset, **kwargs)` with its draft steered for this workload
    (`tests/support/steering.py`). The pre-run's oracle is cached per (models, prompts, pre-run
    budgets), so tests that share a workload share one pre-run; spec may be several SpecConfigs
    (the largest draft region sets the pre-run budget)."""
    from tests.support.steering import lookahead, oracle_sequences, steered_models

    models = cached_models(preset, **kwargs)
    budgets = lookahead(models, prompts, max_new_tokens, spec)
    key = (preset, tuple(sorted(kwargs.items())), tuple(map(tuple, prompts)), tuple(budgets))
    if key not in _ORACLES:
        _ORACLES[key] = oracle_sequences(models, prompts, budgets)
    return steered_models(models, prompts, max_new_tokens, agreement=agreement, spec=spec, seed=seed,
                          oracle=_ORACLES[key])
