"""Token choice from logits: greedy (the tie contract) and seeded sampling (docs/semantics.md 3-4),
with the sampling penalties of section 7 when asked for (`engine/penalties.py`).

Vectorized over rows; no Python loop over requests or the vocabulary.
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.engine.penalties import active, penalize
from specverify.kernels.argmax import row_argmax
from specverify.validation import check_int, check_real

# The smallest positive temperature (docs/semantics.md section 4). Dequantized logits are bounded
# by |z| <= 57344 * float32 max < 2**145 (the largest FP8 value times the largest float32 scale),
# so for temperature >= 1e-200 every z / temperature, and every difference of two, stays below
# 2**145 * 2 * 1e200 < 1e244: finite in float64. Below it (subnormal temperatures included) the
# quotient can overflow to inf and the softmax to NaN, so such temperatures are refused.
MIN_TEMPERATURE = 1e-200

# Bounds of repetition_penalty (docs/semantics.md section 7): with max(r, 1/r) <= 1e18 a penalized
# logit stays below 2**145 * 1e18 + 2 * 2**31 < 2**206, so the bound above on z / temperature still
# leaves every quotient (and difference of two) finite in float64.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-18, 1e18
MAX_ADDITIVE_PENALTY = 2.0          # frequency_penalty and presence_penalty lie in [-2, 2]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self):
        temperature = check_real("temperature", self.temperature, 0.0, why="0 = greedy")
        if 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g} (below it z / temperature "
                             f"can overflow float64; docs/semantics.md section 4), got {temperature!r}")
        top_k = check_int("top_k", self.top_k, 0, why="0 = off")
        top_p = check_real("top_p", self.top_p, 0.0, 1.0, lo_open=True, why="1 = off")
        min_p = check_real("min_p", self.min_p, 0.0, 1.0, hi_open=True, why="0 = off")
        repetition = check_real("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY,
                                MAX_REPETITION_PENALTY, why="1 = off")
        frequency = check_real("frequency_penalty", self.frequency_penalty, -MAX_ADDITIVE_PENALTY,
                               MAX_ADDITIVE_PENALTY, why="0 = off")
        presence = check_real("presence_penalty", self.presence_penalty, -MAX_ADDITIVE_PENALTY,
                              MAX_ADDITIVE_PENALTY, why="0 = off")
        for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                            ("repetition_penalty", repetition), ("frequency_penalty", frequency),
                            ("presence_penalty", presence)):
            object.__setattr__(self, name, value)      # plain Python numbers from here on

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Some penalty is active (the decoders then keep per-request token counts)."""
        return active(self)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """First maximal index of the float32-upcast logits (NaN first). logits: [N, V] any registry
    dtype -> [N] int64: the vocab-split Triton argmax on CUDA (the upcast inside the kernel, no
    float32 copy of the rows), torch.argmax elsewhere."""
    return row_argmax(logits)[:, 0]


def _check_rows(name: str, t, dim: int, *, shape: tuple | None = None) -> None:
    """Shape checks only (no device read, so safe on the hot path and inside a graph capture)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim or (shape is not None and tuple(t.shape) != tuple(shape)):
        want = list(shape) if shape is not None else f"a {dim}-D tensor"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")


def _renorm(p: torch.Tensor) -> torch.Tensor:
    return p / p.sum(-1, keepdim=True)


def dequantize(logits: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 [N, V] dequantized logits. logits: [N, V] logits-dtype values; scale: [N, 1] float32."""
    _check_rows("logits", logits, 2)
    _check_rows("scale", scale, 2, shape=(logits.shape[0], 1))
    return logits.to(torch.float64) * scale.to(torch.float64)


def sampling_probs(logits: torch.Tensor, scale: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 [N, V] distribution after temperature, top-k, top-p and min-p.

    logits: [N, V] logits-dtype values; scale: [N, 1] float32 dequantization scale.
    """
    _check_rows("logits", logits, 2)
    _check_rows("scale", scale, 2, shape=(logits.shape[0], 1))
    z = logits.to(torch.float64) * scale.to(torch.float64) / params.temperature
    return _filtered(torch.softmax(z, dim=-1), params)


def probs_from_z(z: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution of sampling_probs from float64 [N, V] dequantized logits z (the penalized
    ones of section 7): the same float64 operations in the same order."""
    _check_rows("z", z, 2)
    return _filtered(torch.softmax(z / params.temperature, dim=-1), params)


def _filtered(p: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Steps 2-4 of section 4 (top-k, top-p, min-p) on the softmax p [N, V] float64."""
    if params.top_k > 0 or params.top_p < 1.0:
        # Stable descending sort: equal probabilities keep ascending index order. Renormalizing
        # after top-k keeps this order, so one sort serves both filters.
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    if params.top_k > 0:
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(p.shape[-1], device=p.device).expand_as(order))
        p = _renorm(torch.where(rank < params.top_k, p, torch.zeros_like(p)))
    if params.top_p < 1.0:
        sorted_p = torch.gather(p, -1, order)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = before < params.top_p
        keep_sorted[..., 0] = True
        keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
        p = _renorm(torch.where(keep, p, torch.zeros_like(p)))
    if params.min_p > 0.0:
        p = _renorm(torch.where(p >= params.min_p * p.amax(-1, keepdim=True), p, torch.zeros_like(p)))
    return p


def sample_from_probs(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw in vocabulary order. p: [N, V] float64; u: [N] float64 in [0, 1) -> [N]."""
    _check_rows("p", p, 2)
    _check_rows("u", u, 1, shape=(p.shape[0],))
    v = p.shape[-1]
    idx = torch.arange(v, device=p.device).expand_as(p)
    over = torch.cumsum(p, dim=-1) > u[:, None]
    first_over = torch.where(over, idx, torch.full_like(idx, v)).amin(-1)
    last_positive = torch.where(p > 0, idx, torch.full_like(idx, -1)).amax(-1)
    return torch.where(first_over < v, first_over, last_positive)


def choose_tokens(logits: torch.Tensor, scale: torch.Tensor, params: SamplingParams,
                  u: torch.Tensor | None, penalty: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Next token per row: [N] int64. u: [N] float64 uniforms (ignored when greedy).

    penalty: (counts [N, V], prompt [N, V]) of each row's context when params.penalized (section
    7): the penalties apply to the float64 dequantized logits, and greedy is the first maximal
    index of the penalized values."""
    if penalty is None:
        if params.greedy:
            return greedy_tokens(logits)
        return sample_from_probs(sampling_probs(logits, scale, params), u.to(logits.device))
    z = penalize(dequantize(logits, scale), *penalty, params)
    if params.greedy:
        return torch.argmax(z, dim=-1)
    return sample_from_probs(probs_from_z(z, params), u.to(logits.device))
