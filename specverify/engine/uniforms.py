"""Counter-based uniforms (docs/semantics.md 4 and 6.5): u(seed, request, position, draw).

Every uniform is a pure function of four 32-bit counters, so a decoder computes the ones a step
needs where it needs them: on the device, vectorized over any shape, inside a CUDA graph, with no
generator state to carry and no host sync. `reference.sampling.counter_uniform` computes the same
values in Python ints, bit for bit.

The rule, for seed, request, position, draw each in [0, 2**32):

    mix(x):  x &= 2**32 - 1
             x ^= x >> 15;  x = (x * 0x7A9D5587) & (2**32 - 1)
             x ^= x >> 14;  x = (x * 0x29BAE531) & (2**32 - 1)
             x ^= x >> 16
    lane L:  h_L = mix(mix(mix(mix(seed ^ SALT_L) ^ request) ^ position) ^ draw)
             SALT_0 = 0xA5C31F27, SALT_1 = 0x3D8EB46C
    u      = ((h_0 >> 5) * 2**26 + (h_1 >> 6)) / 2**53

`mix` is a bijection of [0, 2**32) (an xor-shift right and a product with an odd number mod 2**32
are both invertible), so for a fixed (seed, request, position) the D + 1 draws of a cycle never
share lane 0. u has 53 random bits: an integer below 2**53 times 2**-53, exact in float64, in
[0, 1).

int64 arithmetic: every value entering a product is below 2**32 and both multipliers are odd and
below 2**31, so every product is below 2**63 and int64 never overflows; right shifts only see
non-negative values, where arithmetic and logical shifts agree. The multipliers and shifts were
picked by a small avalanche search (flipping any input bit flips each output bit with
probability 0.5 within sampling noise at 1e5 inputs).

A property to know: the lanes differ only by their salt, so lane 1 of `seed` is lane 0 of
`seed ^ SALT_0 ^ SALT_1`. Uniforms within one seed are unaffected.
"""

from __future__ import annotations

import torch

from specverify.validation import check_int

MASK_32 = 0xFFFFFFFF
SHIFT_1, MUL_1 = 15, 0x7A9D5587
SHIFT_2, MUL_2 = 14, 0x29BAE531
SHIFT_3 = 16
LANE_SALTS = (0xA5C31F27, 0x3D8EB46C)
LANE_0_BITS, LANE_1_BITS = 27, 26          # 27 + 26 = 53: the float64 mantissa
COUNTER_LIMIT = 2**32                      # seed, request, position and draw lie in [0, 2**32)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit mix of int64 values (any shape); the result lies in [0, 2**32)."""
    x = x & MASK_32
    x = x ^ (x >> SHIFT_1)
    x = (x * MUL_1) & MASK_32          # < 2**32 * 2**31 = 2**63 before the mask
    x = x ^ (x >> SHIFT_2)
    x = (x * MUL_2) & MASK_32
    return x ^ (x >> SHIFT_3)


def _check(seed, requests, positions, draws) -> torch.device:
    """Types, dtypes, devices and shapes only: nothing here reads a tensor's values."""
    named = (("requests", requests), ("positions", positions), ("draws", draws))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of int64, got {type(t).__name__}")
        if t.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 tensor, got {t.dtype}")
    device = requests.device
    for name, t in named[1:]:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, requests on {device}: all inputs must be on one device")
    try:
        torch.broadcast_shapes(requests.shape, positions.shape, draws.shape)
    except RuntimeError as e:
        raise ValueError(f"requests {list(requests.shape)}, positions {list(positions.shape)} and draws "
                         f"{list(draws.shape)} do not broadcast together") from e
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or seed.dim() != 0:
            raise TypeError(f"seed must be a Python int or a 0-d int64 tensor, got {seed.dtype} {list(seed.shape)}")
        if seed.device != device:
            raise ValueError(f"seed is on {seed.device}, requests on {device}: all inputs must be on one device")
    else:
        check_int("seed", seed, 0, COUNTER_LIMIT - 1)
    return device


def counter_uniforms(seed, requests: torch.Tensor, positions: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """u(seed, request, position, draw) for every element of the broadcast of the three tensors.

    seed: a Python int in [0, 2**32) or a 0-d int64 tensor on the inputs' device (a tensor seed
      can change between replays of a captured CUDA graph; a Python int is baked into it).
    requests, positions, draws: int64 tensors, broadcastable together, on one device; each value
      in [0, 2**32). Returns float64 [broadcast shape], every value in [0, 1).

    Hot path: the tensors' VALUES are not checked (that would read the device); a value outside
    [0, 2**32) is taken mod 2**32 by the first mask and gives an undocumented uniform. Types,
    dtypes, devices and shapes are checked, and a Python-int seed's range. Only elementwise int64
    ops run, with Python scalars as operands, so the call is capturable in a CUDA graph.
    Measured on an H100, [64, 65] uniforms in a replayed graph: about 63 us eager (some 50
    launches), about 5 us under torch.compile (one fused kernel, the same bits).
    """
    device = _check(seed, requests, positions, draws)
    shape = torch.broadcast_shapes(requests.shape, positions.shape, draws.shape)
    if not isinstance(seed, torch.Tensor):
        seed = torch.full((), int(seed), dtype=torch.int64, device=device)
    # Both lanes at once, on a leading axis of 2 (half the kernel launches of a loop over lanes).
    x = mix32(torch.stack([seed ^ salt for salt in LANE_SALTS])).view(2, *[1] * len(shape))   # [2, 1, ...]
    x = mix32(x ^ requests)
    x = mix32(x ^ positions)
    h = mix32(x ^ draws)                                   # [2, *shape] int64 in [0, 2**32)
    bits = (h[0] >> (32 - LANE_0_BITS)) * 2**LANE_1_BITS + (h[1] >> (32 - LANE_1_BITS))   # [0, 2**53)
    return bits.to(torch.float64) * 2.0**-53
