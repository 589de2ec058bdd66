"""The fused layer ops (docs/semantics.md 6.12, 6.21): residual add + RMSNorm, the same norm
fused into the matmul it feeds, rotary embedding + paged K/V write, SiLU-gated activation.

Records of the op registry (specverify/conformance/registry/__init__.py). The torch records go
through the public op (the unfused torch maths the CPU model runs), float32 and float64; the
Triton records through the kernel wrapper (interpreted on the CPU), float32, float16 and
bfloat16. Each op rounds its float32 result once to the output dtype, so the outputs compare by
the float16 entry of the tolerance table (1e-2 absolute and relative: above one bfloat16 rounding,
2**-8 relative, and far below what a wrong divisor, pairing, sign, slot or head makes). Cache
entries no token writes must keep their values exactly: the caches compare in full.
"""

from __future__ import annotations

import torch

import reference
from specverify import dtypes, ops
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import CLOSE, EXACT, ErrorInput, OpSpec, SampleInput, only
from specverify.kernels.fused_layers import add_rmsnorm_impl, rotary_kv_write_impl, silu_mul_impl
from specverify.kernels.norm_matmul import norm_matmul_triton

TORCH_DTYPES = only("float32", "float64")
TRITON_DTYPES = only("float32", "float16", "bfloat16")
LAYER_TOLERANCE = "float16"
SILU_TRITON_BLOCK = 16      # the Triton record's column block: the samples' rows span several, with a tail
SPECIALS = (float("nan"), float("inf"), -float("inf"), -0.0)


def _torch_dtype(name: str) -> torch.dtype:
    return dtypes.dtype_info(name).torch_dtype


def _grid(gen, shape, lo: int = -1024, hi: int = 1025, denom: int = 256) -> torch.Tensor:
    """float64 multiples of 1 / denom in [lo, hi) / denom: exact in every dtype's cast."""
    return torch.randint(lo, hi, shape, generator=gen).double() / denom


def _with_specials(gen, x: torch.Tensor, fraction: float) -> torch.Tensor:
    pick = torch.randint(0, len(SPECIALS), x.shape, generator=gen)
    hit = S.coins(gen, x.shape, fraction)
    return torch.where(hit, torch.tensor(SPECIALS, dtype=torch.float64)[pick], x)


def _ulp_pairs(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype with every odd entry of the last dim the next value above its even neighbour."""
    y = S.cast(x, dtype).clone()
    pairs = y.shape[-1] // 2
    y[..., 1::2] = torch.nextafter(y[..., 0:2 * pairs:2], torch.tensor(float("inf"), dtype=dtype))
    return y


# ---------------------------------------------------------------------------------------------
# add_rmsnorm: sum = x + residual (rounded to x's dtype), normed = sum * rsqrt(mean(sum^2) + eps) * w

def _arn_sample(name, seed, dtype, *, rows, hidden, residual=True, eps=1e-6, kind="plain") -> SampleInput:
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    x = S.normalish(gen, (rows, hidden))
    r = S.normalish(gen, (rows, hidden))
    if kind == "nan":
        x = _with_specials(gen, x, 0.05)
    elif kind == "tiny":            # mean(x^2) near eps: where eps sits decides the result
        x, r = x / 1024, r / 1024
    w = 0.5 + _grid(gen, (hidden,), 0, 385, 256)                      # weights in [0.5, 2)
    xs = _ulp_pairs(x, t) if kind == "ulp" else S.cast(x, t)
    args = {"x": xs, "weight": S.cast(w, t), "residual": S.cast(r, t) if residual else None, "eps": eps}
    return SampleInput(name, args, seed)


def _arn_lanes_sample(name, seed, dtype, *, bs, lanes, hidden, residual=True) -> SampleInput:
    """x / residual [bs, lanes, H] with one lane per request picked (`at`: the first, the last and
    lanes between, a lane picked twice over the batch); every lane not picked holds NaN and inf, so
    a read of the wrong lane shows in the result."""
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    x = S.normalish(gen, (bs, lanes, hidden))
    r = S.normalish(gen, (bs, lanes, hidden))
    at = torch.tensor([(0, lanes - 1, lanes // 2, lanes - 1)[b % 4] for b in range(bs)], dtype=torch.int64)
    picked = torch.zeros((bs, lanes), dtype=torch.bool)
    picked[torch.arange(bs), at] = True
    x[~picked], r[~picked] = float("nan"), float("inf")
    w = 0.5 + _grid(gen, (hidden,), 0, 385, 256)
    args = {"x": S.cast(x, t), "weight": S.cast(w, t), "residual": S.cast(r, t) if residual else None,
            "eps": 1e-6, "at": at}
    return SampleInput(name, args, seed)


def _arn_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        if which == "triton":
            normed, total = add_rmsnorm_impl(a["x"], a["residual"], a["weight"], a["eps"], "triton", at=a.get("at"))
        else:
            normed, total = ops.add_rmsnorm(a["x"], a["weight"], residual=a["residual"], eps=a["eps"],
                                            at=a.get("at"), impl="torch")
        return {"normed": normed, "sum": total}
    return impl


def _arn_ref(s: SampleInput) -> dict:
    a = s.args
    normed, total = reference.add_rmsnorm(x=a["x"].double().numpy(), weight=a["weight"].double().numpy(),
                                          residual=None if a["residual"] is None else a["residual"].double().numpy(),
                                          eps=a["eps"], at=None if a.get("at") is None else a["at"].numpy())
    return {"normed": torch.from_numpy(normed), "sum": torch.from_numpy(total)}


def _arn_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _arn_sample("empty-batch", seed, dtype, rows=0, hidden=8)
        yield _arn_sample("boundary-hidden-1", seed + 1, dtype, rows=3, hidden=1)
        yield _arn_sample("boundary-hidden-not-pow2", seed + 2, dtype, rows=4, hidden=40)
        yield _arn_sample("no-residual", seed + 3, dtype, rows=3, hidden=32, residual=False)
        yield _arn_sample("nan-inf-signed-zero", seed + 4, dtype, rows=6, hidden=24, kind="nan")
        yield _arn_sample("ulp-adjacent-entries", seed + 5, dtype, rows=3, hidden=33, kind="ulp")
        yield _arn_sample("tiny-rows-eps-matters", seed + 6, dtype, rows=3, hidden=16, kind="tiny", eps=1e-5)
        yield _arn_sample("eps-zero", seed + 7, dtype, rows=2, hidden=16, eps=0.0)
        # one lane per request (`at`): a draft head's last norm on the row it reads
        yield _arn_lanes_sample("lanes-one-per-request", seed + 9, dtype, bs=5, lanes=4, hidden=24)
        yield _arn_lanes_sample("lanes-no-residual", seed + 10, dtype, bs=3, lanes=3, hidden=17, residual=False)
        yield _arn_lanes_sample("lanes-single-lane", seed + 11, dtype, bs=2, lanes=1, hidden=8)
        yield _arn_lanes_sample("lanes-empty-batch", seed + 12, dtype, bs=0, lanes=2, hidden=8)
        if not small:
            yield _arn_sample("large-rows", seed + 8, dtype, rows=9, hidden=300)
    return samples


def _arn_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 70), st.booleans(),
                     st.sampled_from(("plain", "nan", "ulp", "tiny"))).map(
        lambda t: _arn_sample(f"hyp-{t[4]}", t[0], dtype, rows=t[1], hidden=t[2], residual=t[3], kind=t[4]))


def _arn_errors(which: str):
    base = _arn_sample("base", 0, "float32", rows=2, hidden=8).args

    def call(**changes):
        a = {**base, **changes}
        return lambda: ops.add_rmsnorm(a["x"], a["weight"], residual=a["residual"], eps=a["eps"], impl=which)

    def errors():
        x, w = base["x"], base["weight"]
        yield ErrorInput("x-list", call(x=x.tolist()), TypeError, "x must be a torch.Tensor", "x")
        yield ErrorInput("x-int", call(x=x.long()), ValueError, "x dtype torch.int64 is not a layer dtype", "x")
        yield ErrorInput("x-empty-hidden", call(x=x[:, :0], weight=w[:0], residual=None), ValueError,
                         r"x must be \[..., H\] with H >= 1", "x")
        yield ErrorInput("weight-length", call(weight=w[:5]), ValueError, r"weight must be \[H\] = \[8\]", "weight")
        yield ErrorInput("weight-device", call(weight=w.to("meta")), ValueError, "weight is on meta", "weight")
        yield ErrorInput("residual-shape", call(residual=base["residual"][:1]), ValueError,
                         "residual must have x's shape", "residual")
        yield ErrorInput("residual-dtype", call(residual=base["residual"].double()), ValueError,
                         "residual must have x's shape .* and dtype", "residual")
        yield ErrorInput("eps-negative", call(eps=-1e-6), ValueError, "eps must be a finite float >= 0", "eps")
        yield ErrorInput("eps-nan", call(eps=float("nan")), ValueError, "eps must be a finite float >= 0", "eps")
        yield ErrorInput("bad-impl", lambda: ops.add_rmsnorm(x, w, impl="cuda"), ValueError, "impl must be one of",
                         "impl")
        lanes = _arn_lanes_sample("lanes", 0, "float32", bs=2, lanes=3, hidden=8).args

        def with_at(at, x=lanes["x"]):
            return lambda: ops.add_rmsnorm(x, lanes["weight"], residual=None, at=at, impl=which)
        yield ErrorInput("at-int32", with_at(lanes["at"].int()), ValueError, r"at must be \[bs\] int64", "at")
        yield ErrorInput("at-shape", with_at(lanes["at"][:1]), ValueError, r"at must be \[bs\] int64", "at")
        yield ErrorInput("at-2d-x", with_at(lanes["at"], x=lanes["x"][:, 0]), ValueError, r"for x \[bs, q, H\]", "at")
        yield ErrorInput("at-past-lanes", with_at(torch.tensor([0, 3])), ValueError, r"at must be in \[0, 3\)", "at")
        yield ErrorInput("at-negative", with_at(torch.tensor([-1, 0])), ValueError, r"at must be in \[0, 3\)", "at")
        yield ErrorInput("at-list", with_at([0, 1]), TypeError, "at must be a torch.Tensor", "at")
        yield ErrorInput("at-4d-x", with_at(lanes["at"], x=lanes["x"][:, :, None]), ValueError,
                         r"for x \[bs, q, H\]", "at")
        yield ErrorInput("at-device", with_at(lanes["at"].to("meta")), ValueError, "at is on meta", "at")
    return errors


# ---------------------------------------------------------------------------------------------
# norm_matmul: add_rmsnorm's (normed, sum), then out = normed @ weight_t^T, normed rounded to x's dtype

def _nm_weight_scale(hidden: int) -> int:
    """2**floor(log2(H) / 2), a power of two near sqrt(H): W^T's entries divided by it keep each
    output O(1) (a sum of H products of O(1) normed entries)."""
    return 1 << ((hidden.bit_length() - 1) // 2)


def _nm_sample(name, seed, dtype, *, rows, hidden, cols, lanes=None, residual=True, eps=1e-6,
               kind="plain", gated=False) -> SampleInput:
    """x (and residual) [rows, H], or [rows, lanes, H] when lanes is given; weight_t [cols, H] of
    multiples of 1/256 in [-1, 1) over `_nm_weight_scale` (exact in every dtype); the norm weight
    as add_rmsnorm's samples draw it. gated: weight_t is [2 cols, H], a gate's then an up's."""
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    shape = (rows, hidden) if lanes is None else (rows, lanes, hidden)
    x = S.normalish(gen, shape)
    r = S.normalish(gen, shape)
    if kind == "nan":
        x = _with_specials(gen, x, 0.05)
    elif kind == "tiny":            # mean(x^2) near eps: where eps sits decides the result
        x, r = x / 1024, r / 1024
    g = 0.5 + _grid(gen, (hidden,), 0, 385, 256)                      # norm weights in [0.5, 2)
    wt = _grid(gen, (cols * (2 if gated else 1), hidden), -256, 256, 256) / _nm_weight_scale(hidden)
    xs = _ulp_pairs(x, t) if kind == "ulp" else S.cast(x, t)
    args = {"x": xs, "norm_weight": S.cast(g, t), "weight_t": S.cast(wt, t),
            "residual": S.cast(r, t) if residual else None, "eps": eps, "gated": gated}
    return SampleInput(name, args, seed)


def _nm_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        if which == "triton":
            out, total = norm_matmul_triton(a["x"], a["residual"], a["norm_weight"], a["weight_t"], a["eps"],
                                            a["gated"])
        else:
            out, total = ops.norm_matmul(a["x"], a["norm_weight"], a["weight_t"], residual=a["residual"],
                                         eps=a["eps"], gated=a["gated"], impl="torch")
        return {"out": out, "sum": total}
    return impl


def _nm_ref(s: SampleInput) -> dict:
    """The reference with the op's rounding of the sum and the normed to x's dtype (`round_to`):
    unrounded, the normed's rounding would add up over the H terms of each output."""
    a = s.args
    out, total = reference.norm_matmul(x=a["x"].double().numpy(), norm_weight=a["norm_weight"].double().numpy(),
                                       weight_t=a["weight_t"].double().numpy(),
                                       residual=None if a["residual"] is None else a["residual"].double().numpy(),
                                       eps=a["eps"], round_to=dtypes.dtype_info(a["x"].dtype).name, gated=a["gated"])
    return {"out": torch.from_numpy(out), "sum": torch.from_numpy(total)}


def _nm_samples(small: bool):
    def samples(dtype: str, seed: int):
        def one(name, i, **kw):
            return _nm_sample(name, seed + i, dtype, **kw)
        yield one("empty-batch", 0, rows=0, hidden=8, cols=5)
        yield one("boundary-hidden-1", 1, rows=3, hidden=1, cols=4)
        yield one("boundary-hidden-not-pow2", 2, rows=4, hidden=40, cols=12)
        yield one("boundary-cols-1", 3, rows=3, hidden=16, cols=1)
        yield one("boundary-cols-40", 4, rows=5, hidden=24, cols=40)
        yield one("boundary-cols-33", 5, rows=2, hidden=12, cols=33)
        # rows past one and two blocks of 16 (the kernel's row block), each with a tail
        yield one("rows-20", 6, rows=20, hidden=24, cols=17)
        yield one("rows-37", 7, rows=37, hidden=9, cols=33)
        yield one("no-residual", 8, rows=3, hidden=32, cols=8, residual=False)
        yield one("nan-inf-signed-zero", 9, rows=6, hidden=24, cols=10, kind="nan")
        yield one("nan-inf-signed-zero-no-residual", 10, rows=5, hidden=20, cols=6, residual=False, kind="nan")
        yield one("ulp-adjacent-entries", 11, rows=3, hidden=33, cols=9, kind="ulp")
        yield one("tiny-rows-eps-matters", 12, rows=3, hidden=16, cols=8, kind="tiny", eps=1e-5)
        yield one("eps-zero", 13, rows=2, hidden=16, cols=8, eps=0.0)
        yield one("lanes-3d-x", 14, rows=3, lanes=4, hidden=24, cols=20)
        # the SiLU-gated MLP's gate|up (out: silu(gate) * up): column tails, rows past a block,
        # no residual, NaN / inf (silu(-inf) * up is NaN, silu(inf) * up inf)
        yield one("gated-cols-1", 16, rows=3, hidden=16, cols=1, gated=True)
        yield one("gated-cols-17-rows-20", 17, rows=20, hidden=24, cols=17, gated=True)
        yield one("gated-no-residual", 18, rows=4, hidden=40, cols=12, residual=False, gated=True)
        yield one("gated-nan-inf-signed-zero", 19, rows=6, hidden=24, cols=10, kind="nan", gated=True)
        yield one("gated-ulp-adjacent-entries", 20, rows=3, hidden=33, cols=9, kind="ulp", gated=True)
        if not small:
            yield one("large-rows", 15, rows=9, hidden=300, cols=70)
            yield one("gated-large-rows", 21, rows=9, hidden=300, cols=40, gated=True)
    return samples


def _nm_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 20), st.integers(1, 70), st.integers(1, 40), st.booleans(),
                     st.sampled_from(("plain", "nan", "ulp", "tiny")), st.booleans()).map(
        lambda t: _nm_sample(f"hyp-{t[5]}{'-gated' if t[6] else ''}", t[0], dtype, rows=t[1], hidden=t[2], cols=t[3],
                             residual=t[4], kind=t[5], gated=t[6]))


def _nm_errors(which: str):
    base = _nm_sample("base", 0, "float32", rows=2, hidden=8, cols=5).args

    def call(**changes):
        a = {**base, **changes}
        return lambda: ops.norm_matmul(a["x"], a["norm_weight"], a["weight_t"], residual=a["residual"], eps=a["eps"],
                                       gated=a["gated"], impl=which)

    def errors():
        x, g, wt, r = base["x"], base["norm_weight"], base["weight_t"], base["residual"]
        yield ErrorInput("x-list", call(x=x.tolist()), TypeError, "x must be a torch.Tensor", "x")
        yield ErrorInput("x-int", call(x=x.long()), ValueError, "x dtype torch.int64 is not a layer dtype", "x")
        yield ErrorInput("x-empty-hidden", call(x=x[:, :0], norm_weight=g[:0], weight_t=wt[:, :0], residual=None),
                         ValueError, r"x must be \[..., H\] with H >= 1", "x")
        yield ErrorInput("norm-weight-length", call(norm_weight=g[:5]), ValueError,
                         r"norm_weight must be \[H\] = \[8\]", "norm_weight")
        yield ErrorInput("norm-weight-device", call(norm_weight=g.to("meta")), ValueError, "norm_weight is on meta",
                         "norm_weight")
        yield ErrorInput("weight-t-width", call(weight_t=wt[:, :7]), ValueError,
                         r"weight_t must be \[N, H\] = \[N, 8\] of x's dtype", "weight_t")
        yield ErrorInput("weight-t-dtype", call(weight_t=wt.double()), ValueError,
                         r"weight_t must be \[N, H\] = \[N, 8\] of x's dtype torch.float32", "weight_t")
        yield ErrorInput("weight-t-1d", call(weight_t=wt[0]), ValueError, r"weight_t must be \[N, H\]", "weight_t")
        yield ErrorInput("residual-shape", call(residual=r[:1]), ValueError, "residual must have x's shape",
                         "residual")
        yield ErrorInput("residual-dtype", call(residual=r.double()), ValueError,
                         "residual must have x's shape .* and dtype", "residual")
        yield ErrorInput("eps-negative", call(eps=-1e-6), ValueError, "eps must be a finite float >= 0", "eps")
        yield ErrorInput("eps-nan", call(eps=float("nan")), ValueError, "eps must be a finite float >= 0", "eps")
        yield ErrorInput("gated-odd-n", call(gated=True), ValueError,
                         r"weight_t must be \[2I, H\] \(an even N: gate, then up\) when gated, got N = 5", "weight_t")
        yield ErrorInput("gated-not-bool", call(gated=1), TypeError, "gated must be a bool, got int", "gated")
        yield ErrorInput("bad-impl", lambda: ops.norm_matmul(x, g, wt, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
        if which == "triton":       # the kernel holds a row's whole H in one tile
            wide = _nm_sample("wide", 0, "float32", rows=1, hidden=1025, cols=2).args
            yield ErrorInput("hidden-past-the-tile", lambda: ops.norm_matmul(wide["x"], wide["norm_weight"],
                                                                            wide["weight_t"], impl="triton"),
                             ValueError, "x's H must be <= 1024", "x")
    return errors


# ---------------------------------------------------------------------------------------------
# rotary_kv_write: rotate-half RoPE of the query and key heads; keys and values to their slots

def _rkv_sample(name, seed, dtype, *, tokens, q_heads, kv_heads, dim, positions=9, slots=None, num_slots=None,
                kind="plain", table_dtype="float64", index_dtype=torch.int64, strided=False) -> SampleInput:
    """strided: positions and slots each a column of a wider tensor, with strides of their own (a
    draft step's slots are a column of its plan's)."""
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    heads = q_heads + 2 * kv_heads
    qkv = S.normalish(gen, (tokens, heads, dim))
    if kind == "nan":
        qkv = _with_specials(gen, qkv, 0.04)
    cos = _grid(gen, (positions, dim // 2), -256, 257)                 # tables in [-1, 1], scales != 1 too
    sin = _grid(gen, (positions, dim // 2), -256, 257)
    num_slots = num_slots if num_slots is not None else tokens + 3
    if slots is None:
        slots = torch.randperm(num_slots, generator=gen)[:tokens].tolist()
    cache = S.cast(S.normalish(gen, (2, num_slots, kv_heads, dim)), t)   # entries no token writes must stay
    tt = _torch_dtype(table_dtype)
    args = {"qkv": _ulp_pairs(qkv, t) if kind == "ulp" else S.cast(qkv, t),
            "positions": torch.randint(0, positions, (tokens,), generator=gen).to(index_dtype),
            "cos": S.cast(cos, tt), "sin": S.cast(sin, tt), "k_cache": cache[0].clone(), "v_cache": cache[1].clone(),
            "slots": torch.tensor(slots, dtype=index_dtype), "num_q_heads": q_heads}
    if kind == "boundary-positions":
        args["positions"][:] = torch.tensor([0, positions - 1] * tokens)[:tokens].to(index_dtype)
    if strided:
        for key, width in (("positions", 2), ("slots", 3)):
            wide = torch.zeros((tokens, width), dtype=index_dtype)
            wide[:, 0] = args[key]
            args[key] = wide[:, 0]
    return SampleInput(name, args, seed)


def _rkv_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = dict(s.args)
        k, v = a["k_cache"].clone(), a["v_cache"].clone()              # the op writes in place
        if which == "triton":
            q = rotary_kv_write_impl(a["qkv"], a["positions"], a["cos"], a["sin"], k, v, a["slots"],
                                     a["num_q_heads"], "triton")
        else:
            q = ops.rotary_kv_write(**{**a, "k_cache": k, "v_cache": v}, impl="torch")
        return {"q": q, "k_cache": k, "v_cache": v}
    return impl


def _rkv_ref(s: SampleInput) -> dict:
    a = s.args
    q, k, v = reference.rotary_kv_write(qkv=a["qkv"].double().numpy(), positions=a["positions"].tolist(),
                                        cos=a["cos"].double().numpy(), sin=a["sin"].double().numpy(),
                                        k_cache=a["k_cache"].double().numpy(), v_cache=a["v_cache"].double().numpy(),
                                        slots=a["slots"].tolist(), num_q_heads=a["num_q_heads"])
    return {"q": torch.from_numpy(q), "k_cache": torch.from_numpy(k), "v_cache": torch.from_numpy(v)}


def _rkv_samples(small: bool):
    def samples(dtype: str, seed: int):
        def one(name, i, **kw):
            return _rkv_sample(name, seed + i, dtype, **kw)
        yield one("empty-batch", 0, tokens=0, q_heads=2, kv_heads=1, dim=8)
        yield one("gqa-4-to-2", 1, tokens=5, q_heads=4, kv_heads=2, dim=16)
        yield one("mha-heads-not-pow2", 2, tokens=3, q_heads=3, kv_heads=3, dim=8)
        yield one("boundary-dim-2", 3, tokens=4, q_heads=1, kv_heads=1, dim=2)
        yield one("boundary-positions-first-last", 4, tokens=4, q_heads=2, kv_heads=1, dim=8, kind="boundary-positions")
        yield one("boundary-slots-first-last", 5, tokens=2, q_heads=2, kv_heads=1, dim=8, slots=[0, 6], num_slots=7)
        yield one("nan-inf-signed-zero", 6, tokens=4, q_heads=2, kv_heads=2, dim=8, kind="nan")
        yield one("ulp-adjacent-pairs", 7, tokens=3, q_heads=2, kv_heads=1, dim=16, kind="ulp")
        yield one("float32-tables-int32-indices", 8, tokens=3, q_heads=2, kv_heads=1, dim=8, table_dtype="float32",
                  index_dtype=torch.int32)
        yield one("slots-out-of-order", 9, tokens=3, q_heads=1, kv_heads=1, dim=4, slots=[5, 1, 3], num_slots=6)
        yield one("strided-positions-and-slots", 11, tokens=4, q_heads=2, kv_heads=1, dim=8, num_slots=9, strided=True)
        if not small:
            yield one("large-heads", 10, tokens=7, q_heads=8, kv_heads=4, dim=64, positions=40)
    return samples


def _rkv_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 4), st.integers(1, 3),
                     st.sampled_from((2, 4, 8, 16)), st.sampled_from(("plain", "nan", "ulp"))).map(
        lambda t: _rkv_sample(f"hyp-{t[5]}", t[0], dtype, tokens=t[1], q_heads=t[2] * t[3], kv_heads=t[3], dim=t[4],
                              kind=t[5]))


def _rkv_errors(which: str):
    base = _rkv_sample("base", 0, "float32", tokens=3, q_heads=2, kv_heads=1, dim=8).args

    def call(**changes):
        return lambda: ops.rotary_kv_write(**{"checked": True, **base, **changes}, impl=which)

    def errors():
        qkv, k = base["qkv"], base["k_cache"]
        yield ErrorInput("positional-call", lambda: ops.rotary_kv_write(qkv), TypeError,
                         "takes 0 positional arguments", "positional")
        yield ErrorInput("qkv-list", call(qkv=qkv.tolist()), TypeError, "qkv must be a torch.Tensor", "qkv")
        yield ErrorInput("qkv-odd-dim", call(qkv=qkv[..., :7]), ValueError, "qkv must be .* with D even", "qkv")
        yield ErrorInput("heads-mismatch", call(num_q_heads=3), ValueError,
                         "num_q_heads must be >= 1 with qkv's heads = num_q_heads", "num_q_heads")
        yield ErrorInput("num-q-heads-float", call(num_q_heads=2.0), TypeError, "num_q_heads must be an int",
                         "num_q_heads")
        yield ErrorInput("cache-dim", call(k_cache=k[..., :4], v_cache=k[..., :4]), ValueError,
                         r"k_cache must be \[S, Hkv, D\] with qkv's D = 8", "k_cache")
        yield ErrorInput("v-cache-dtype", call(v_cache=base["v_cache"].double()), ValueError,
                         "v_cache must have k_cache's shape", "v_cache")
        yield ErrorInput("cos-width", call(cos=base["cos"][:, :3], sin=base["sin"][:, :3]), ValueError,
                         r"cos must be \[P, D/2\]", "cos")
        yield ErrorInput("sin-dtype", call(sin=base["sin"].float()), ValueError, "sin must have cos's shape", "sin")
        yield ErrorInput("positions-float", call(positions=base["positions"].float()), ValueError,
                         "positions must be int32 or int64", "positions")
        yield ErrorInput("slots-length", call(slots=base["slots"][:2]), ValueError, r"slots must be \[T\] = \[3\]",
                         "slots")
        yield ErrorInput("position-past-table", call(positions=torch.tensor([0, 9, 1])), ValueError,
                         r"positions must be rows of the tables, in \[0, 9\)", "positions")
        yield ErrorInput("slot-negative", call(slots=torch.tensor([0, -1, 2])), ValueError,
                         r"slots must be cache slots, in \[0, 6\)", "slots")
        yield ErrorInput("slot-past-cache", call(slots=torch.tensor([0, 6, 2])), ValueError,
                         r"slots must be cache slots, in \[0, 6\)", "slots")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.rotary_kv_write(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# silu_mul: silu(gate) * up of [..., gate | up]

def _sm_sample(name, seed, dtype, *, rows, inter, kind="plain") -> SampleInput:
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    x = S.normalish(gen, (rows, 2 * inter)) * 2
    if kind == "nan":
        x = _with_specials(gen, x, 0.06)
    elif kind == "wide":            # gates far into both tails: silu ~ 0 and silu ~ g
        x[:, :inter] = _grid(gen, (rows, inter), -40, 41, 1)
    return SampleInput(name, {"gate_up": _ulp_pairs(x, t) if kind == "ulp" else S.cast(x, t)}, seed)


def _sm_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        if which == "triton":
            return {"out": silu_mul_impl(s.args["gate_up"], "triton", block=SILU_TRITON_BLOCK)}
        return {"out": ops.silu_mul(s.args["gate_up"], impl="torch")}
    return impl


def _sm_ref(s: SampleInput) -> dict:
    return {"out": torch.from_numpy(reference.silu_mul(gate_up=s.args["gate_up"].double().numpy()))}


def _sm_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _sm_sample("empty-batch", seed, dtype, rows=0, inter=4)
        yield _sm_sample("boundary-inter-1", seed + 1, dtype, rows=3, inter=1)
        yield _sm_sample("boundary-inter-not-pow2", seed + 2, dtype, rows=2, inter=37)
        yield _sm_sample("nan-inf-signed-zero", seed + 3, dtype, rows=4, inter=16, kind="nan")
        yield _sm_sample("ulp-adjacent-gates", seed + 4, dtype, rows=3, inter=12, kind="ulp")
        yield _sm_sample("wide-gates-both-tails", seed + 5, dtype, rows=3, inter=20, kind="wide")
        if not small:
            yield _sm_sample("large-rows", seed + 6, dtype, rows=9, inter=1100)
    return samples


def _sm_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 80),
                     st.sampled_from(("plain", "nan", "ulp", "wide"))).map(
        lambda t: _sm_sample(f"hyp-{t[3]}", t[0], dtype, rows=t[1], inter=t[2], kind=t[3]))


def _sm_errors(which: str):
    def errors():
        gu = torch.zeros((2, 8))
        yield ErrorInput("gate-up-list", lambda: ops.silu_mul(gu.tolist(), impl=which), TypeError,
                         "gate_up must be a torch.Tensor", "gate_up")
        yield ErrorInput("gate-up-odd", lambda: ops.silu_mul(gu[:, :7], impl=which), ValueError,
                         r"gate_up must be \[..., 2I\] \(an even last dim", "gate_up")
        yield ErrorInput("gate-up-int", lambda: ops.silu_mul(gu.long(), impl=which), ValueError,
                         "gate_up dtype torch.int64 is not a layer dtype", "gate_up")
        yield ErrorInput("bad-impl", lambda: ops.silu_mul(gu, impl="cuda"), ValueError, "impl must be one of", "impl")
    return errors


# ---------------------------------------------------------------------------------------------
# embed_concat: the draft head's input row [table[id] | feature] (a copy)

def _ec_sample(name, seed, dtype, *, bs, q, vocab, hidden, kind="plain", ids=None) -> SampleInput:
    """ids drawn in [0, vocab) (or given), the features of some samples one row broadcast over q
    (stride 0, as a tree draft's parent feature) or every other column of a wider tensor, the
    table of one column-major (a transpose: unit row stride, its columns apart)."""
    gen = torch.Generator().manual_seed(seed)
    t = _torch_dtype(dtype)
    table = S.normalish(gen, (vocab, hidden))
    feats = S.normalish(gen, (bs, q, hidden))
    if kind == "nan":
        table, feats = _with_specials(gen, table, 0.1), _with_specials(gen, feats, 0.1)
    table = _ulp_pairs(table, t) if kind == "ulp" else S.cast(table, t)
    feats = _ulp_pairs(feats, t) if kind == "ulp" else S.cast(feats, t)
    if kind == "broadcast-feature":
        feats = feats[:, :1].expand(bs, q, hidden)
    elif kind == "strided":
        wide = torch.zeros((bs, q, 2 * hidden), dtype=t)
        wide[..., ::2] = feats
        feats = wide[..., ::2]
    elif kind == "column-major-table":
        table = table.T.contiguous().T
    token = torch.randint(0, vocab, (bs, q), generator=gen) if ids is None else torch.tensor(ids, dtype=torch.int64)
    return SampleInput(name, {"ids": token, "table": table, "features": feats}, seed)


def _ec_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        return {"out": ops.embed_concat(**s.args, impl=which)}
    return impl


def _ec_ref(s: SampleInput) -> dict:
    a = s.args
    return {"out": torch.from_numpy(reference.embed_concat(ids=a["ids"].tolist(), table=a["table"].double().numpy(),
                                                          features=a["features"].double().numpy()))}


def _ec_samples(dtype: str, seed: int):
    yield _ec_sample("empty-batch", seed, dtype, bs=0, q=3, vocab=5, hidden=8)
    yield _ec_sample("random-ids", seed + 1, dtype, bs=3, q=4, vocab=11, hidden=24)
    yield _ec_sample("boundary-first-and-last-row", seed + 2, dtype, bs=2, q=3, vocab=7, hidden=8,
                     ids=((0, 6, 0), (6, 6, 0)))
    yield _ec_sample("boundary-hidden-not-pow2", seed + 3, dtype, bs=2, q=2, vocab=5, hidden=37)
    yield _ec_sample("boundary-hidden-one-past-pow2", seed + 8, dtype, bs=1, q=2, vocab=3, hidden=17)
    yield _ec_sample("nan-inf-signed-zero", seed + 4, dtype, bs=2, q=3, vocab=6, hidden=16, kind="nan")
    yield _ec_sample("ulp-adjacent-entries", seed + 5, dtype, bs=2, q=2, vocab=4, hidden=16, kind="ulp")
    yield _ec_sample("broadcast-feature", seed + 6, dtype, bs=3, q=4, vocab=9, hidden=16, kind="broadcast-feature")
    yield _ec_sample("strided-feature", seed + 7, dtype, bs=2, q=3, vocab=9, hidden=12, kind="strided")
    yield _ec_sample("column-major-table", seed + 9, dtype, bs=2, q=3, vocab=7, hidden=12, kind="column-major-table")
    yield _ec_sample("wide-hidden", seed + 10, dtype, bs=1, q=2, vocab=3, hidden=1024)     # the kernel's 4-warp launch


def _ec_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 4), st.integers(1, 5), st.integers(1, 9), st.integers(1, 40),
                     st.sampled_from(("plain", "nan", "ulp", "broadcast-feature", "strided", "column-major-table"))).map(
        lambda t: _ec_sample(f"hyp-{t[5]}", t[0], dtype, bs=t[1], q=t[2], vocab=t[3], hidden=t[4], kind=t[5]))


def _ec_errors(which: str):
    def errors():
        base = _ec_sample("base", 0, "float32", bs=2, q=3, vocab=5, hidden=8).args
        ids, table, feats = base["ids"], base["table"], base["features"]

        def call(**changes):
            return lambda: ops.embed_concat(**{**base, "impl": which, **changes})
        yield ErrorInput("ids-1d", call(ids=ids[0]), ValueError, r"ids must be 2-D \[bs, q\]", "ids")
        yield ErrorInput("ids-float", call(ids=ids.float()), ValueError, "ids must be int32 or int64", "ids")
        yield ErrorInput("ids-list", call(ids=ids.tolist()), TypeError, "ids must be a torch.Tensor", "ids")
        yield ErrorInput("table-1d", call(table=table[0]), ValueError, r"table must be \[V, H\]", "table")
        yield ErrorInput("table-int", call(table=table.long()), ValueError, "table dtype torch.int64 is not a layer dtype",
                         "table")
        yield ErrorInput("features-other-width", call(features=feats[..., :7]), ValueError,
                         r"features must be \[bs, q, H\] = \[2, 3, 8\]", "features")
        yield ErrorInput("features-other-lanes", call(features=feats[:1]), ValueError,
                         r"features must be \[bs, q, H\] = \[2, 3, 8\]", "features")
        yield ErrorInput("features-other-dtype", call(features=feats.double()), ValueError,
                         "features must have table's dtype", "features")
        yield ErrorInput("id-past-the-table", call(ids=torch.tensor([[0, 5, 1], [1, 1, 1]])), ValueError,
                         r"ids must be rows of the table, in \[0, 5\)", "ids")
        yield ErrorInput("id-negative", call(ids=torch.tensor([[0, -1, 1], [1, 1, 1]])), ValueError,
                         r"ids must be rows of the table, in \[0, 5\)", "ids")
        yield ErrorInput("checked-not-bool", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", call(impl="cuda"), ValueError, "impl must be one of", "impl")
    return errors


RECORDS = (
    OpSpec("add_rmsnorm", _arn_impl("torch"), _arn_ref, _arn_samples(False), _arn_recipe, _arn_errors("torch"),
           TORCH_DTYPES, {"normed": CLOSE, "sum": CLOSE}, tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False,
           max_examples=10),
    OpSpec("add_rmsnorm_triton", _arn_impl("triton"), _arn_ref, _arn_samples(True), _arn_recipe,
           _arn_errors("triton"), TRITON_DTYPES, {"normed": CLOSE, "sum": CLOSE}, tolerance_dtype=LAYER_TOLERANCE,
           platform_dependent=False, max_examples=3),
    OpSpec("norm_matmul", _nm_impl("torch"), _nm_ref, _nm_samples(False), _nm_recipe, _nm_errors("torch"),
           TORCH_DTYPES, {"out": CLOSE, "sum": CLOSE}, tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False,
           max_examples=10),
    OpSpec("norm_matmul_triton", _nm_impl("triton"), _nm_ref, _nm_samples(True), _nm_recipe, _nm_errors("triton"),
           TRITON_DTYPES, {"out": CLOSE, "sum": CLOSE}, tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False,
           max_examples=3),
    OpSpec("rotary_kv_write", _rkv_impl("torch"), _rkv_ref, _rkv_samples(False), _rkv_recipe, _rkv_errors("torch"),
           TORCH_DTYPES, {"q": CLOSE, "k_cache": CLOSE, "v_cache": CLOSE}, tolerance_dtype=LAYER_TOLERANCE,
           platform_dependent=False, max_examples=10),
    OpSpec("rotary_kv_write_triton", _rkv_impl("triton"), _rkv_ref, _rkv_samples(True), _rkv_recipe,
           _rkv_errors("triton"), TRITON_DTYPES, {"q": CLOSE, "k_cache": CLOSE, "v_cache": CLOSE},
           tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False, max_examples=3),
    OpSpec("silu_mul", _sm_impl("torch"), _sm_ref, _sm_samples(False), _sm_recipe, _sm_errors("torch"),
           TORCH_DTYPES, {"out": CLOSE}, tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False, max_examples=10),
    OpSpec("silu_mul_triton", _sm_impl("triton"), _sm_ref, _sm_samples(True), _sm_recipe, _sm_errors("triton"),
           TRITON_DTYPES, {"out": CLOSE}, tolerance_dtype=LAYER_TOLERANCE, platform_dependent=False, max_examples=3),
    OpSpec("embed_concat", _ec_impl("torch"), _ec_ref, _ec_samples, _ec_recipe, _ec_errors("torch"), TORCH_DTYPES,
           {"out": EXACT}, platform_dependent=False, max_examples=10),
    OpSpec("embed_concat_triton", _ec_impl("triton"), _ec_ref, _ec_samples, _ec_recipe, _ec_errors("triton"),
           TRITON_DTYPES, {"out": EXACT}, platform_dependent=False, max_examples=3),
)
