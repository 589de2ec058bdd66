"""Draft selection (docs/semantics.md 6.1), the row argmax (section 3) and the logits dtypes (section 2: FP8 quantization, the conversion).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations

import math
import types

import numpy as np
import torch

import reference
from reference import fp8 as rfp8
from reference import spec as rspec
from specverify import dtypes, ops
from specverify.kernels.argmax import row_argmax
from specverify.kernels.draft_select import select_topk_triton
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import (
    CLOSE, EXACT, FP8_BY_POLICY, LOGITS_BY_POLICY, ErrorInput, OpSpec, SampleInput,
)


# ---------------------------------------------------------------------------------------------
# select_draft_topk


def _select_impl(s: SampleInput, profile) -> dict:
    p, index = ops.select_draft_topk(s.args["logits"], s.args["topk"], platform=profile, scale=s.args["scale"])
    if s.args["topk"] == 1 and profile.argmax_fast_path:
        # The fast path's p is a placeholder: exactly 1.0, and nothing to hold against a softmax.
        if not torch.all(p == 1.0):
            raise AssertionError(f"argmax fast path must return p == 1.0, got {p.flatten()[:4].tolist()}")
        return {"index": index, "p": None}
    return {"index": index, "p": p}


SELECT_TRITON_BLOCK = 128    # the Triton record's vocabulary block: V 389 / 1025 span several, with a tail


# Interpreted on the CPU, where every FP8 format is upcast before the kernel (see draft_select.py):
# one 16-bit and one FP8 format beside float32 there; every logits dtype of the platform on a GPU.
SELECT_TRITON_DTYPES = LOGITS_BY_POLICY | {"cpu": ("float32", "bfloat16", "float8_e4m3fn")}


def _select_triton_impl(s: SampleInput, profile) -> dict:
    """The draft selection kernel (`ops.draft_topk` on a GPU, topk 1 included when a profile has no
    argmax fast path): the softmax path always, p compared too."""
    p, index = select_topk_triton(s.args["logits"], s.args["topk"], s.args["scale"], block_v=SELECT_TRITON_BLOCK)
    return {"index": index, "p": p}


def _dequant32(logits: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """float32(logits) * scale with the product rounded to float32 (section 6.1), as numpy."""
    with np.errstate(invalid="ignore", over="ignore"):
        return logits.float().numpy() * scale.float().numpy()


def _select_ref(s: SampleInput, argmax_nan: str = "nan_is_max") -> dict:
    """Section 6.1; with argmax_nan="nan_ignored" (an engine's convention, topk == 1 only) the
    index is the first maximum with NaN read as -1e30 (reference.greedy_token)."""
    logits, scale, k = s.args["logits"], s.args["scale"], s.args["topk"]
    if argmax_nan != "nan_is_max" and k == 1:      # the argmax path; top-k > 1 keeps section 6.1's order
        out = _select_ref(s)
        index = [reference.greedy_token(row, argmax_nan) for row in logits.float().numpy()]
        return {**out, "index": torch.tensor(index, dtype=torch.int64).view(-1, 1)}
    upcast, deq = logits.float().numpy(), _dequant32(logits, scale)
    ps, idx = [], []
    for row_up, row_dq in zip(upcast, deq):
        p, i = rspec.select_draft_topk(row_up, k, row_dq)
        ps.append(p)
        idx.append(i)
    return {"index": torch.tensor(idx, dtype=torch.int64).view(-1, k),
            "p": torch.tensor(ps, dtype=torch.float64).view(-1, k)}


def _select_sample(name, x, dtype, k, seed, scale_kind="1"):
    gen = torch.Generator().manual_seed(seed)
    values, scale = S.with_scale(x, dtype, scale_kind, gen)
    return SampleInput(f"{name}-scale{scale_kind}", {"logits": values, "scale": scale,
                                                    "topk": min(k, x.shape[1])}, seed)


def _select_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kinds = S.SCALE_KINDS
    for n, vocab in enumerate((2, 63, 64, 65, 389, 1025)):         # around kernel block sizes
        for m, k in enumerate((1, 2, 4)):
            sk = kinds[(n + m) % len(kinds)]
            yield _select_sample(f"grid-V{vocab}-k{k}", S.grid_logits(gen, 3, vocab), dtype, k, seed, sk)
            yield _select_sample(f"tie-heavy-V{vocab}-k{k}", S.tie_heavy_rows(gen, 3, vocab), dtype, k, seed,
                                 kinds[(n + m + 1) % len(kinds)])
    for name, rows in S.edge_logits(70).items():
        for k in (1, 3):
            yield _select_sample(f"{name}-k{k}", rows, dtype, k, seed, "3.5" if k == 1 else "per-row")
    issue = torch.tensor([[0.49999997, 0.5, -1.0, -2.0]])
    for k in (1, 2):
        yield _select_sample(f"ulp-issue-k{k}", issue, dtype, k, seed)
    for k, sk in ((1, "0.37"), (2, "3.5"), (3, "per-row")):
        yield _select_sample(f"ulp-adjacent-k{k}", S.ulp_adjacent_rows(gen, 4, 97), dtype, k, seed, sk)
        yield _select_sample(f"nan-rows-k{k}", S.nan_rows(gen, 4, 33), dtype, k, seed, sk)
        yield _select_sample(f"inf-rows-k{k}", S.inf_rows(gen, 3, 33), dtype, k, seed, sk)
    for k in (1, 3):
        yield _select_sample(f"empty-batch-k{k}", torch.zeros((0, 7)), dtype, k, seed)
    x = S.grid_logits(gen, 2, 129)
    x[0, 0], x[1, 128] = 7.0, 7.0
    for sk in ("0.37", "per-row"):
        yield _select_sample("boundary-V129-k2", x, dtype, 2, seed, sk)
    yield _select_sample("boundary-k-eq-V", S.tie_heavy_rows(gen, 3, 5), dtype, 5, seed, "3.5")
    yield _select_sample("bs1", S.tie_heavy_rows(gen, 1, 389), dtype, 1, seed)
    yield _select_sample("large-bs", S.tie_heavy_rows(gen, 257, 97), dtype, 2, seed, "per-row")


def _select_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(S.hard_logits_rows(), st.integers(1, 4)).map(
        lambda t: _select_sample(f"hyp-{t[0][3]}", S.build_hard_logits(t[0]), dtype, t[1], t[0][0], t[0][4]))


def _select_errors():
    x = torch.zeros((2, 5))
    one = torch.ones((2, 1))

    def call(logits=x, k=1, scale=one):
        return lambda: ops.select_draft_topk(logits, k, platform="cpu", scale=scale)
    yield ErrorInput("topk-0", call(k=0), ValueError, r"topk must be in \[1, 5\]", "topk")
    yield ErrorInput("topk-above-vocab", call(k=6), ValueError, r"topk must be in \[1, 5\]", "topk")
    yield ErrorInput("topk-bool", call(k=True), TypeError, "topk must be an int", "topk")
    yield ErrorInput("topk-float", call(k=2.0), TypeError, "topk must be an int", "topk")
    yield ErrorInput("1-D", call(logits=x[0]), ValueError, "logits must be 2-D", "logits")
    yield ErrorInput("not-a-tensor", call(logits=[[0.0, 1.0]]), TypeError, "logits must be a torch.Tensor", "logits")
    yield ErrorInput("int-logits", call(logits=x.long()), ValueError, "logits dtype torch.int64 is not a logits dtype",
                     "logits")
    yield ErrorInput("scale-shape", call(scale=torch.ones(3, 1)), ValueError, r"scale must have shape \[2, 1\]", "scale")
    yield ErrorInput("scale-float64", call(scale=one.double()), ValueError, "scale must be float32", "scale")
    yield ErrorInput("scale-negative", call(scale=-one), ValueError, "scale must be finite and > 0", "scale")
    yield ErrorInput("scale-nan", call(scale=torch.full((2, 1), float("nan"))), ValueError,
                     "scale must be finite and > 0", "scale")
    yield ErrorInput("scale-zero", call(scale=torch.zeros((2, 1))), ValueError, "scale must be finite and > 0", "scale")




# ---------------------------------------------------------------------------------------------
# FP8 quantization and the logits-dtype conversion (docs/semantics.md section 2)


def _fp8_hard_rows(gen: torch.Generator, dtype: str) -> dict[str, torch.Tensor]:
    """Named float32 rows for the quantizer: every code's neighbourhood, midpoints (ties to even),
    ulp steps around them, saturation, infinities, NaN, signed zeros, subnormals; "random": random
    signs and full float32 significands over every binade from below the smallest subnormal code
    (rounds to 0 or to it) to past the largest finite one (saturates)."""
    info = dtypes.dtype_info(dtype)
    codes = torch.arange(256, dtype=torch.uint8).view(info.torch_dtype).float()
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[1:] + finite[:-1]) / 2                              # exact in float32
    inf = torch.tensor(float("inf"))
    rows = {
        "boundary-codes": codes[torch.isfinite(codes)][None],
        "ulp-midpoints": torch.stack([mids, torch.nextafter(mids, inf), torch.nextafter(mids, -inf)]),
        "boundary-saturate": torch.tensor([[info.max_finite, info.max_finite * 1.07, 1e30, float("inf"),
                                            -info.max_finite * 1.5, float("-inf"), 0.0, -0.0]]),
        "nan-values": torch.tensor([[float("nan"), 1.0, -2.5, float("nan"), 0.0, 3.0, -1e-9, 7.0]]),
        "random": S.binade_rows(gen, 3, 50, math.frexp(float(finite[finite > 0].min()))[1] - 3,
                                math.frexp(info.max_finite)[1]),
    }
    return rows


def _quantize_impl(s: SampleInput, profile) -> dict:
    a = s.args
    return {"codes": dtypes.quantize_fp8(a["x"], a["dtype"], a["scale"]).view(torch.uint8)}


def _quantize_ref(s: SampleInput) -> dict:
    a = s.args
    return {"codes": torch.from_numpy(rfp8.quantize(a["x"].numpy(), a["dtype"], a["scale"].numpy()).astype(np.int64))}


def _quantize_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for i, (name, x) in enumerate(_fp8_hard_rows(gen, dtype).items()):
        for kind in dict.fromkeys((S.SCALE_KINDS[i % 4], "0.37" if i % 2 else "3.5")):
            yield SampleInput(f"{name}-scale{kind}", {"x": x, "dtype": dtype, "scale": S.row_scales(gen, x.shape[0], kind)},
                              seed)
    yield SampleInput("empty-batch", {"x": torch.zeros((0, 4)), "dtype": dtype, "scale": torch.ones((0, 1))}, seed)


def _quantize_recipe(dtype: str):
    return S.hard_logits_rows(max_vocab=64).map(lambda t: SampleInput(
        f"hyp-{t[3]}", {"x": S.build_hard_logits(t) * 40, "dtype": dtype,
                        "scale": S.row_scales(torch.Generator().manual_seed(t[0]), t[1], t[4])}, t[0]))


def _quantize_errors():
    x = torch.zeros((2, 3))

    def call(scale=torch.ones((2, 1)), dtype="float8_e4m3fn", xx=x):
        return lambda: dtypes.quantize_fp8(xx, dtype, scale)
    yield ErrorInput("scale-negative", call(scale=-torch.ones((2, 1))), ValueError, "finite and > 0", "scale")
    yield ErrorInput("scale-nan", call(scale=float("nan")), ValueError, "finite and > 0", "scale")
    yield ErrorInput("scale-shape", call(scale=torch.ones((3, 1))), ValueError, "does not broadcast", "scale")
    yield ErrorInput("dtype-not-fp8", call(dtype="float16"), ValueError, "expected one of the FP8 dtypes", "dtype")
    yield ErrorInput("x-int", call(xx=x.long()), ValueError, "expected a floating-point tensor", "x")


def _convert_impl(s: SampleInput, profile) -> dict:
    a = s.args
    values, scale = dtypes.to_logits_dtype(a["x"], a["dtype"], scale_mode=a["scale_mode"], static_scale=a["static_scale"])
    return {"upcast": values.float(), "scale": scale}


def _convert_ref(s: SampleInput) -> dict:
    a = s.args
    cfg = types.SimpleNamespace(logits_dtype=a["dtype"], logits_scale_mode=a["scale_mode"], logits_scale=a["static_scale"])
    rows = [reference.convert_logits(cfg, row) for row in a["x"].double()]
    n, v = a["x"].shape
    return {"upcast": torch.tensor(np.array([r.upcast for r in rows], dtype=np.float32).reshape(n, v)),
            "scale": torch.tensor([[1.0 if r.scale is None else r.scale] for r in rows], dtype=torch.float32).view(n, 1)}


def _convert_sample(name, x, dtype, mode, static, seed):
    return SampleInput(f"{name}-{mode}{static if mode == 'static' else ''}",
                       {"x": x, "dtype": dtype, "scale_mode": mode, "static_scale": static}, seed)


def _convert_samples(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    fp8 = dtypes.dtype_info(dtype).is_fp8
    rows = _fp8_hard_rows(gen, dtype if fp8 else "float8_e4m3fn")
    rows["ulp-adjacent"] = S.ulp_adjacent_rows(gen, 3, 20)
    rows["boundary-all-zero"] = torch.zeros((2, 6))
    modes = (("static", 0.37), ("static", 3.5), ("per_row", 1.0)) if fp8 else (("static", 1.0),)
    for name, x in rows.items():
        for mode, static in modes:
            yield _convert_sample(name, x, dtype, mode, static, seed)
    yield _convert_sample("empty-batch", torch.zeros((0, 5)), dtype, modes[-1][0], modes[-1][1], seed)


def _convert_recipe(dtype: str):
    from hypothesis import strategies as st
    modes = st.sampled_from([("static", 0.37), ("static", 3.5), ("per_row", 1.0), ("static", 1.0)])
    return st.tuples(S.hard_logits_rows(max_vocab=64), modes).map(lambda t: _convert_sample(
        f"hyp-{t[0][3]}", S.build_hard_logits(t[0]) * 30, dtype, t[1][0], t[1][1], t[0][0]))


def _convert_errors():
    x = torch.zeros((2, 3))
    yield ErrorInput("mode-batch", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", scale_mode="batch"), ValueError,
                     "not one of", "mode")
    yield ErrorInput("static-scale-negative", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", static_scale=-1.0),
                     ValueError, "finite and > 0", "static_scale")
    yield ErrorInput("static-scale-nan", lambda: dtypes.to_logits_dtype(x, "float8_e4m3fn", static_scale=float("nan")),
                     ValueError, "finite and > 0", "static_scale")
    yield ErrorInput("dtype-not-logits", lambda: dtypes.to_logits_dtype(x, "float64"), ValueError,
                     "is not a logits dtype", "dtype")
    yield ErrorInput("empty-vocab", lambda: dtypes.to_logits_dtype(x[:, :0], "float16"), ValueError,
                     "expected shape", "logits")


# ---------------------------------------------------------------------------------------------
# the row argmax (torch path and the Triton kernel, interpreted on the CPU)


def _argmax_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        # Small blocks keep the interpreted kernel quick; one sample runs the engine's default block.
        kw = {"block_v": 32} if which == "triton" and not s.name.startswith("default-block") else {}
        return {"index": row_argmax(s.args["x"], impl=which, **kw)}
    return impl


def _argmax_ref(s: SampleInput, argmax_nan: str = "nan_is_max") -> dict:
    x = s.args["x"]
    return {"index": torch.tensor([reference.greedy_token(row, argmax_nan) for row in x.float().numpy()],
                                  dtype=torch.int64).view(x.shape[0], 1)}


def _argmax_sample(name, x, dtype, seed):
    values, _ = S.as_logits_dtype(x, dtype)
    return SampleInput(name, {"x": values}, seed)


def _argmax_samples(small: bool):
    def samples(dtype: str, seed: int):
        gen = torch.Generator().manual_seed(seed)
        vocabs = (1, 31, 32, 33, 65) if small else (1, 31, 32, 33, 64, 65, 389, 4097)
        rows = 3 if small else 6
        for vocab in vocabs:
            yield _argmax_sample(f"tie-heavy-V{vocab}", S.tie_heavy_rows(gen, rows, vocab), dtype, seed)
        x = torch.zeros((3, 70))
        x[0, 0], x[1, 69], x[2, [5, 40]] = 1.0, 1.0, 2.0          # both edges; a tie across blocks
        yield _argmax_sample("boundary-V70", x, dtype, seed)
        yield _argmax_sample("ulp-adjacent", S.ulp_adjacent_rows(gen, 3, 70), dtype, seed)
        yield _argmax_sample("nan-rows", S.nan_rows(gen, 4, 70), dtype, seed)
        yield _argmax_sample("inf-rows", S.inf_rows(gen, 3, 70), dtype, seed)
        yield _argmax_sample("all-equal", torch.zeros((2, 70)), dtype, seed)
        yield _argmax_sample("empty-batch", torch.zeros((0, 33)), dtype, seed)
        wide, _ = S.as_logits_dtype(S.tie_heavy_rows(gen, 3, 140), dtype)
        yield SampleInput("strided-rows-V70", {"x": wide[:, ::2]}, seed)           # every other column of wider rows
        x = torch.zeros((2, 9000))
        x[0, [5000, 8999]], x[1, [4095, 4096]] = 3.0, 2.0   # ties across the default block's edges (4096)
        yield _argmax_sample("default-block-V9000", x, dtype, seed)
        if not small and dtype == "float32":
            # NaN rows in a batch of more than 64: an engine may reduce small and large batches by
            # different kernels (a NaN rule that holds for one batch size class only). One dtype:
            # an engine's kernel interpreted on a CPU takes most of a minute over 72 rows.
            yield _argmax_sample("nan-rows-bs72", S.nan_rows(gen, 72, 70), dtype, seed)
    return samples


def _argmax_recipe(dtype: str):
    return S.hard_logits_rows(max_vocab=70).map(lambda t: _argmax_sample(f"hyp-{t[3]}", S.build_hard_logits(t), dtype,
                                                                          t[0]))


def _argmax_errors(which: str):
    def errors():
        yield ErrorInput("1-D", lambda: row_argmax(torch.zeros(3), impl=which), ValueError, r"x must be \[N, V\]", "x")
        yield ErrorInput("empty-vocab", lambda: row_argmax(torch.zeros((2, 0)), impl=which), ValueError,
                         r"x must be \[N, V\] with V >= 1", "x")
        yield ErrorInput("bad-impl", lambda: row_argmax(torch.zeros((2, 3)), impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors




RECORDS = (
    OpSpec("select_draft_topk", _select_impl, _select_ref, _select_samples, _select_recipe, _select_errors,
           LOGITS_BY_POLICY, {"index": EXACT, "p": CLOSE}, max_examples=12,
           conventions=("argmax_nan",)),
    OpSpec("select_draft_topk_triton", _select_triton_impl, _select_ref, _select_samples, _select_recipe,
           _select_errors, SELECT_TRITON_DTYPES, {"index": EXACT, "p": CLOSE}, platform_dependent=False, max_examples=4,
           conventions=("argmax_nan",)),
    OpSpec("quantize_fp8", _quantize_impl, _quantize_ref, _quantize_samples, _quantize_recipe, _quantize_errors,
           FP8_BY_POLICY, {"codes": EXACT}, platform_dependent=False, max_examples=10),
    OpSpec("convert_logits", _convert_impl, _convert_ref, _convert_samples, _convert_recipe, _convert_errors,
           LOGITS_BY_POLICY, {"upcast": EXACT, "scale": EXACT}, platform_dependent=False, max_examples=8),
    OpSpec("row_argmax", _argmax_impl("torch"), _argmax_ref, _argmax_samples(False), _argmax_recipe,
           _argmax_errors("torch"), LOGITS_BY_POLICY, {"index": EXACT}, platform_dependent=False, max_examples=10,
           conventions=("argmax_nan",)),
    OpSpec("row_argmax_triton", _argmax_impl("triton"), _argmax_ref, _argmax_samples(True), _argmax_recipe,
           _argmax_errors("triton"), LOGITS_BY_POLICY, {"index": EXACT}, platform_dependent=False, max_examples=3,
           conventions=("argmax_nan",)),
)
