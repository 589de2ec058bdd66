"""The counter-based uniforms u(seed, request, position, draw) (docs/semantics.md section 4).

`specverify.engine.uniforms.counter_uniforms` (int64 torch ops) and
`reference.sampling.counter_uniform` (Python ints) must agree bit for bit; a third witness written
here in numpy uint32 (native wrap-around instead of masks) checks that both read "mod 2**32" the
same way. Then the documented test vectors, the statistics of the stream, the argument checks and
a CUDA graph capture.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from reference.sampling import counter_uniform
from specverify.engine.uniforms import counter_uniforms
from specverify.conformance.stats import chi_square_pvalue

pytestmark = pytest.mark.bitexact

ROOT = Path(__file__).resolve().parents[1]
TOP = 2**32 - 1
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# docs/semantics.md section 4, copied by hand: (seed, request, position, draw) -> repr(u)
VECTORS = [
    ((0, 0, 0, 0), "0.7302188104272684"),
    ((0, 0, 0, 1), "0.9353448157834489"),
    ((42, 3, 17, 5), "0.8777317926051164"),
    ((TOP, TOP, TOP, TOP), "0.4571178497898125"),
]


def i64(values, device="cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def bits(x: torch.Tensor) -> torch.Tensor:
    """The float64 bit patterns, on the CPU."""
    return x.detach().to("cpu", torch.float64).view(torch.int64)


def python_grid(seed, requests, positions, draws) -> torch.Tensor:
    """counter_uniform over the outer product [R, P, D], as a float64 tensor (exact)."""
    return torch.tensor([[[counter_uniform(seed, r, p, d) for d in draws] for p in positions] for r in requests],
                        dtype=torch.float64)


def numpy_uniform(seed, requests, positions, draws) -> np.ndarray:
    """The documented rule in uint32 arrays: products wrap natively instead of being masked."""
    def mix(x):
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x7A9D5587)
        x = x ^ (x >> np.uint32(14))
        x = x * np.uint32(0x29BAE531)
        return x ^ (x >> np.uint32(16))
    lanes = []
    with np.errstate(over="ignore"):    # 0-d operands warn on the wrap-around the rule relies on
        for salt in (0xA5C31F27, 0x3D8EB46C):
            h = mix(np.asarray(seed, dtype=np.uint32) ^ np.uint32(salt))
            for counter in (requests, positions, draws):
                h = mix(h ^ np.asarray(counter, dtype=np.uint32))
            lanes.append(h.astype(np.uint64))
    n = (lanes[0] >> np.uint64(5)) * np.uint64(2**26) + (lanes[1] >> np.uint64(6))
    return n.astype(np.float64) / 2.0**53


# ---------------------------------------------------------------------------------------------
# (a) torch == Python == numpy, bit for bit


GRID_SEEDS = [0, 1, TOP, 0xA5C31F27, 0x3D8EB46C]   # the salts: seed ^ salt == 0 for one lane
GRID_REQUESTS = [0, 1, TOP]
GRID_POSITIONS = [0, 1, 2**31 - 1, 2**31, TOP]
GRID_DRAWS = list(range(41))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", GRID_SEEDS, ids=lambda s: f"seed{s:#x}")
def test_grid_torch_equals_python_bit_for_bit(device, seed):
    want = python_grid(seed, GRID_REQUESTS, GRID_POSITIONS, GRID_DRAWS)              # [R, P, D]
    r, p, d = i64(GRID_REQUESTS, device), i64(GRID_POSITIONS, device), i64(GRID_DRAWS, device)
    for s in (seed, torch.tensor(seed, dtype=torch.int64, device=device)):
        got = counter_uniforms(s, r[:, None, None], p[None, :, None], d[None, None, :])
        assert got.dtype == torch.float64 and tuple(got.shape) == tuple(want.shape)
        mismatch = (bits(got) != bits(want)).nonzero().tolist()
        assert not mismatch, (f"seed {seed} ({type(s).__name__}): {len(mismatch)} mismatches, first at "
                              f"[request, position, draw] index {mismatch[0]}")
    witness = numpy_uniform(seed, np.array(GRID_REQUESTS)[:, None, None], np.array(GRID_POSITIONS)[None, :, None],
                            np.array(GRID_DRAWS)[None, None, :])
    assert torch.equal(bits(torch.from_numpy(witness)), bits(want))


@pytest.mark.parametrize("device", DEVICES)
def test_random_keys_torch_equals_python_bit_for_bit(device):
    """2000 random keys: 20 random seeds (one call each, the seed a Python int and a 0-d tensor)
    times 100 random (request, position, draw)."""
    rng = np.random.default_rng(20240611)
    seeds = rng.integers(0, 2**32, size=20, dtype=np.int64)
    rest = rng.integers(0, 2**32, size=(20, 100, 3), dtype=np.int64)
    for seed, keys in zip(seeds.tolist(), rest):
        want = torch.tensor([counter_uniform(seed, *k) for k in keys.tolist()], dtype=torch.float64)
        cols = [torch.from_numpy(keys[:, i].copy()).to(device) for i in range(3)]
        for s in (seed, i64(seed, device)):
            got = counter_uniforms(s, *cols)
            bad = (bits(got) != bits(want)).nonzero().flatten().tolist()
            assert not bad, f"seed {seed}: key (request, position, draw) {keys[bad[0]].tolist()} differs"
        witness = numpy_uniform(seed, keys[:, 0], keys[:, 1], keys[:, 2])
        assert torch.equal(bits(torch.from_numpy(witness)), bits(want)), f"seed {seed}: numpy witness differs"


def test_broadcast_shapes_follow_the_inputs():
    r = i64([[0], [1], [2]])            # [3, 1]
    p = i64([5, 6, 7, 8])               # [4]
    d = i64(0)                          # []
    got = counter_uniforms(7, r, p, d)
    assert tuple(got.shape) == (3, 4)
    assert got[2, 1].item() == counter_uniform(7, 2, 6, 0)
    assert tuple(counter_uniforms(7, i64(1), i64(2), i64(3)).shape) == ()
    assert counter_uniforms(7, i64([]), p[:1], d).shape == (0,)


# ---------------------------------------------------------------------------------------------
# (b) the documented test vectors


def test_documented_vectors():
    doc = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    for (seed, r, p, d), text in VECTORS:
        listed = re.search(rf"^\s*{seed}, {r}, {p}, {d}\s+->\s+(\S+)\s*$", doc, re.M)
        assert listed and listed.group(1) == text, f"docs/semantics.md does not list {seed, r, p, d} -> {text}"
        assert repr(counter_uniform(seed, r, p, d)) == text
        got = counter_uniforms(seed, i64(r), i64(p), i64(d))
        assert repr(got.item()) == text, (seed, r, p, d)


# ---------------------------------------------------------------------------------------------
# (c) statistics of 200,000 uniforms over consecutive positions and draws

ALPHA = 1e-6
N_REQ, N_POS, N_DRAW = 4, 1000, 50


@pytest.fixture(scope="module")
def sample() -> np.ndarray:
    """u(12345, r, p, d) for r < 4, p < 1000, d < 50: float64 [4, 1000, 50], 200,000 values."""
    r = torch.arange(N_REQ)[:, None, None]
    p = torch.arange(N_POS)[None, :, None]
    d = torch.arange(N_DRAW)[None, None, :]
    return counter_uniforms(12345, r, p, d).numpy()


def chi_square_256(counts: np.ndarray) -> float:
    n = int(counts.sum())
    return chi_square_pvalue(counts.tolist(), [n / 256] * 256)[1]


def test_values_in_unit_interval_and_distinct(sample):
    assert sample.min() >= 0.0 and sample.max() < 1.0
    assert np.unique(sample).size == sample.size          # 53 bits: a collision here has p ~ 2e-6
    # for a fixed (seed, request, position) lane 0 is a bijection of the draw: never a repeat
    lane0 = np.floor(sample * 2**27)
    assert all(np.unique(lane0[r, p]).size == N_DRAW for r in range(N_REQ) for p in range(0, N_POS, 97))


def test_chi_square_uniform_256_bins_high_and_low_bits(sample):
    """Top 8 bits (from lane 0) and bottom 8 bits (from lane 1) of the 53-bit integer."""
    n53 = (sample.reshape(-1) * 2.0**53).astype(np.int64)          # exact: u is k / 2**53
    for name, cell in (("high", n53 >> 45), ("low", n53 & 255)):
        p = chi_square_256(np.bincount(cell, minlength=256))
        assert p > ALPHA, f"chi-square over the {name} 8 bits: p = {p:.3g}"


def test_kolmogorov_smirnov_dkw_bound(sample):
    """D_n = sup |F_n(x) - x|. The Dvoretzky-Kiefer-Wolfowitz inequality with Massart's constant,
    P(D_n > eps) <= 2 exp(-2 n eps^2) for every n, gives the critical value
    eps = sqrt(ln(2 / alpha) / (2 n)) (a test of level at most alpha, no table or scipy needed;
    for alpha = 1e-6 and n = 200,000 it is 0.00602)."""
    x = np.sort(sample.reshape(-1))
    n = x.size
    i = np.arange(1, n + 1)
    d = max(np.max(i / n - x), np.max(x - (i - 1) / n))
    eps = math.sqrt(math.log(2.0 / ALPHA) / (2.0 * n))
    assert d < eps, f"KS distance {d:.3g} >= {eps:.3g} (alpha {ALPHA})"


def lag_correlation(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    a, b = a.reshape(-1), b.reshape(-1)
    return float(np.corrcoef(a, b)[0, 1]), a.size


@pytest.mark.parametrize("axis", [1, 2], ids=["positions", "draws"])
def test_lag_one_serial_correlation(sample, axis):
    """|rho| < 5 / sqrt(N): under independence rho is about N(0, 1/N), so 5 sigma (p ~ 6e-7)."""
    head = np.take(sample, range(sample.shape[axis] - 1), axis=axis)
    tail = np.take(sample, range(1, sample.shape[axis]), axis=axis)
    rho, n = lag_correlation(head, tail)
    assert abs(rho) < 5 / math.sqrt(n), f"lag-1 correlation over consecutive {['', 'positions', 'draws'][axis]}: {rho:.3g}"


def test_neighbouring_seeds_and_requests_are_different_sequences(sample):
    p = torch.arange(N_POS)[:, None]
    d = torch.arange(N_DRAW)[None, :]
    base = sample[0]                                                   # seed 12345, request 0
    for name, other in (("seed 12346", counter_uniforms(12346, torch.tensor(0), p, d).numpy()),
                        ("seed 12344", counter_uniforms(12344, torch.tensor(0), p, d).numpy()),
                        ("request 1", sample[1])):
        assert not np.any(base == other), f"{name} shares values with seed 12345 request 0"
        rho, n = lag_correlation(base, other)
        assert abs(rho) < 5 / math.sqrt(n), f"{name}: correlation {rho:.3g} with its neighbour"


# ---------------------------------------------------------------------------------------------
# (d) argument checks


@pytest.mark.parametrize("index,name", list(enumerate(["seed", "request", "position", "draw"])))
@pytest.mark.parametrize("bad,error", [(-1, ValueError), (2**32, ValueError), (2**64, ValueError),
                                       (1.0, TypeError), (True, TypeError), ("3", TypeError), (None, TypeError)])
def test_reference_refuses_bad_counters(index, name, bad, error):
    args = [1, 2, 3, 4]
    args[index] = bad
    with pytest.raises(error, match=name):
        counter_uniform(*args)


def test_reference_accepts_integer_types_at_the_bounds():
    assert counter_uniform(np.uint32(TOP), np.int64(0), 2**32 - 1, 0) == counter_uniform(TOP, 0, TOP, 0)


@pytest.mark.parametrize("args,error,match", [
    ((1, [0], i64(0), i64(0)), TypeError, "requests"),
    ((1, i64(0), torch.zeros(2, dtype=torch.int32), i64(0)), TypeError, "positions"),
    ((1, i64(0), i64(0), torch.zeros(2)), TypeError, "draws"),
    ((1, i64([0, 1]), i64([0, 1, 2]), i64(0)), ValueError, "broadcast"),
    ((1.5, i64(0), i64(0), i64(0)), TypeError, "seed"),
    ((True, i64(0), i64(0), i64(0)), TypeError, "seed"),
    ((-1, i64(0), i64(0), i64(0)), ValueError, "seed"),
    ((2**32, i64(0), i64(0), i64(0)), ValueError, "seed"),
    ((i64([1]), i64(0), i64(0), i64(0)), TypeError, "seed"),
    ((torch.tensor(1, dtype=torch.int32), i64(0), i64(0), i64(0)), TypeError, "seed"),
], ids=["requests-list", "positions-int32", "draws-float", "shapes", "seed-float", "seed-bool", "seed-negative",
        "seed-2**32", "seed-1d", "seed-int32"])
def test_torch_side_checks_types_and_shapes(args, error, match):
    with pytest.raises(error, match=match):
        counter_uniforms(*args)


# ---------------------------------------------------------------------------------------------
# (e) a CUDA graph replays the rule with fresh counters


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    dev = "cuda"
    seed = i64(0, dev)
    req = i64([[0], [1], [2]], dev)             # [bs, 1]
    pos = i64([[5], [9], [2**31]], dev)         # [bs, 1]
    draw = i64(list(range(6)), dev)[None, :]    # [1, D + 1]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        counter_uniforms(seed, req, pos, draw)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = counter_uniforms(seed, req, pos, draw)
    for s, positions in ((77, [11, 12, 13]), (TOP, [TOP, 0, 40])):
        seed.fill_(s)
        pos.copy_(i64(positions, dev)[:, None])
        graph.replay()
        want = torch.tensor([[counter_uniform(s, r, p, d) for d in range(6)] for r, p in enumerate(positions)],
                            dtype=torch.float64)
        assert torch.equal(bits(out), bits(want)), f"seed {s}, positions {positions}"
