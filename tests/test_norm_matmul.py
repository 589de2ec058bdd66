"""`ops.norm_matmul` (docs/semantics.md 6.21) where the registry's samples cannot look: the
registry records compare every dtype by the float16 entry of the tolerance table, which a missing
rounding, a float32 float64-path or TF32 products pass. Here inputs are built so that every product
and every float32 sum is exact and the op's bits are its roundings alone (nearest even, once each),
and the float64 reference's own rounding helper is held to torch's casts. Also: strided operands bit
for bit against contiguous copies, the residual stream of a matmul of no columns, a float32 overflow
of the mean square, the hidden bound under "auto", the argument checks' devices and eps.
(A reviewer's planted bugs that survived the first tests: tests/mutants/norm_matmul.toml.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reference
import specverify
from reference.layers import round_to_format
from specverify import ops
from specverify.models import layers
from specverify.models.config import preset
from specverify.models.draft import NORM_MATMUL_HIDDEN
from tests.support.asserts import assert_close

pytestmark = pytest.mark.kernels

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("layout", ["column-slices", "column-major"])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_norm_matmul_reads_strided_operands(impl, layout):
    """x, residual and weight_t each a column slice of a wider tensor (row strides 2H, 3H, H + 8),
    or each column-major (a transpose: unit row stride, columns apart; the kernel reads its rows
    densely, so the wrapper must copy such an operand, never keep it because some stride is 1):
    the residual stream bit for bit what contiguous copies give, the output by float32's tolerance
    (bit for bit under the interpreter; on a GPU another stride is another compiled specialization of
    the kernel, and cuBLAS picks its algorithm by layout, so the order of the K sum may move: the H100
    showed it). A stride read wrong reads other entries, far past the tolerance."""
    g = torch.Generator().manual_seed(4)
    rows, hidden, cols = 20, 24, 17
    # Sliced or transposed on the device: `.to` of a view makes a contiguous copy.
    if layout == "column-slices":
        x = torch.randn((rows, 2 * hidden), generator=g).to(DEV)[:, :hidden]
        r = torch.randn((rows, 3 * hidden), generator=g).to(DEV)[:, hidden:2 * hidden]
        wt = torch.randn((cols, hidden + 8), generator=g).to(DEV)[:, 8:]
        assert x.stride(0) != hidden and r.stride(0) != x.stride(0) and wt.stride(0) != hidden
    else:
        x, r = (torch.randn((hidden, rows), generator=g).to(DEV).T for _ in range(2))
        wt = torch.randn((hidden, cols), generator=g).to(DEV).T
        assert x.stride() == r.stride() == (1, rows) and wt.stride() == (1, cols)
    w = (torch.rand(hidden, generator=g) + 0.5).to(DEV)
    got = ops.norm_matmul(x, w, wt, residual=r, impl=impl)
    want = ops.norm_matmul(x.contiguous(), w, wt.contiguous(), residual=r.contiguous(), impl=impl)
    assert torch.equal(got[1], want[1]), f"{impl}: the residual stream of strided operands differs"
    assert_close(got[0].cpu(), want[0].cpu(), "float32", f"{impl}: out of strided operands")
    if DEV == "cpu" and (impl == "triton" or layout == "column-slices"):
        # (torch's matmul of a column-major W^T is another BLAS kernel on the CPU too: its order of
        # the K sum is the library's, so that case is held to the tolerance alone)
        assert torch.equal(got[0], want[0]), f"{impl}: out of strided operands differs under the interpreter"


def _exact_case(dtype):
    """Rows whose mean square is exactly 4 (one entry +-7, fifteen +-1; eps 0: rstd 0.5), a
    residual that halves them, gains with a full significand, W^T on multiples of 1/16: the
    normed needs one rounding to dtype and every float32 sum of products is exact, so the op's
    bits are those of the two roundings alone."""
    g = torch.Generator().manual_seed(11)
    rows, hidden, cols = 19, 16, 21
    s = torch.where(torch.rand((rows, hidden), generator=g) < 0.5, -1.0, 1.0).double()
    s[torch.arange(rows), torch.randint(0, hidden, (rows,), generator=g)] *= 7
    gain = (1 + torch.randint(0, 128, (hidden,), generator=g).double() / 128).to(dtype)
    wt = (torch.randint(-16, 16, (cols, hidden), generator=g).double() / 16).to(dtype)
    normed = (s * 0.5 * gain.double()).to(torch.float32).to(dtype)              # one rounding (3.5 * gain is exact in float32)
    exact = normed.double() @ wt.double().T                                      # exact: < 2**7, on multiples of 2**-16
    return (s / 2).to(dtype), (s / 2).to(dtype), gain, wt, normed, exact


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_matmul_rounds_normed_and_out_once_to_nearest_even(dtype):
    x, r, gain, wt, _, exact = _exact_case(dtype)
    out, total = ops.norm_matmul(x.to(DEV), gain.to(DEV), wt.to(DEV), residual=r.to(DEV), eps=0.0, impl="triton")
    want = exact.to(torch.float32).to(dtype)
    assert torch.equal(total.cpu(), x + r)
    bad = int((out.cpu() != want).sum())
    assert bad == 0, f"{bad} of {want.numel()} outputs are not the nearest-even rounding of the exact sum"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("residual", [True, False])
def test_gated_norm_matmul_is_the_product_then_silu_mul_bit_for_bit(dtype, residual):
    """gated=True (the draft head's gate|up projection with its SiLU gate): out [..., I] is
    `silu_mul`'s arithmetic on the product's gate and up halves, each rounded to the dtype first,
    then rounded once: bit for bit the kernel's own ungated product fed to `silu_mul`'s kernel in
    float32 and rounded by torch's cast (the same float32 expression on the same device). The
    float64 reference agrees by the tolerance table. Rows past a row block, a column tail."""
    g = torch.Generator().manual_seed(21)
    rows, hidden, inter = 19, 40, 21
    x, r = (torch.randn((rows, hidden), generator=g).to(dtype) for _ in range(2))
    gain = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    wt = (torch.randn((2 * inter, hidden), generator=g) / 6).to(dtype)
    x[3, 5], r[7] = float("inf"), 0.0                   # a row of NaN (no scale), a residual of zeros
    args = (x.to(DEV), gain.to(DEV), wt.to(DEV))
    res = r.to(DEV) if residual else None
    out, total = ops.norm_matmul(*args, residual=res, eps=1e-5, gated=True, impl="triton")
    gate_up, total_ungated = ops.norm_matmul(*args, residual=res, eps=1e-5, impl="triton")
    want = ops.silu_mul(gate_up.float(), impl="triton").to(dtype)
    assert out.shape == (rows, inter) and torch.equal(total, total_ungated)
    assert torch.equal(out.isnan(), want.isnan()) and out.isnan()[3].all()
    bad = int((out.nan_to_num() != want.nan_to_num()).sum())
    assert bad == 0, f"{bad} of {want.numel()} outputs differ from silu_mul of the rounded product"
    name = str(dtype).removeprefix("torch.")
    ref, _ = reference.norm_matmul(x=x.double().numpy(), norm_weight=gain.double().numpy(), weight_t=wt.double().numpy(),
                                   residual=r.double().numpy() if residual else None, eps=1e-5, round_to=name,
                                   gated=True)
    assert_close(out.cpu().double(), torch.from_numpy(ref), (name, "float16"), "gated out against the reference")


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_gated_norm_matmul_refuses_an_odd_weight_and_a_non_bool(impl):
    x, w, wt = torch.ones((2, 8)), torch.ones(8), torch.ones((5, 8))
    with pytest.raises(ValueError, match=r"weight_t must be \[2I, H\] .* when gated, got N = 5"):
        ops.norm_matmul(x.to(DEV), w.to(DEV), wt.to(DEV), gated=True, impl=impl)
    with pytest.raises(TypeError, match="gated must be a bool, got str"):
        ops.norm_matmul(x.to(DEV), w.to(DEV), wt[:4].to(DEV), gated="yes", impl=impl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_norm_matmul_rounds_the_normed(dtype):
    x, r, gain, wt, _, exact = _exact_case(dtype)
    out, _ = reference.norm_matmul(x=x.double().numpy(), residual=r.double().numpy(), norm_weight=gain.double().numpy(),
                                   weight_t=wt.double().numpy(), eps=0.0, round_to=str(dtype).split(".")[-1])
    assert np.array_equal(out, exact.numpy())


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_round_to_format_is_torchs_cast(fmt):
    """Normal values, ties, subnormals, the overflow midpoint from both sides, signed zeros, NaN,
    inf: round_to_format(v, fmt) == float64(torch's cast of v) (values exact in float32 for the
    16-bit formats, so torch's double -> float -> half rounds once)."""
    t = getattr(torch, fmt)
    fi = torch.finfo(t)
    nmant = {"float32": 23, "float16": 10, "bfloat16": 7}[fmt]
    big = fi.max
    ulp_top = 2.0 ** (int(np.floor(np.log2(big))) - nmant)
    g = torch.Generator().manual_seed(2)
    rand = torch.randn(2000, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-30, 30, (2000,), generator=g).double())
    sub = fi.smallest_normal * torch.tensor([0.3, 0.5, 0.75, 1.0 - 2 ** -12, 1.5 / 2 ** nmant, 2.5 / 2 ** nmant])
    edges = torch.tensor([big, big + ulp_top / 4, big + ulp_top / 2 - ulp_top / 64, big + ulp_top / 2,
                          1 + fi.eps / 2, 1 + 1.5 * fi.eps, 0.0, -0.0, float("inf"), -float("inf")], dtype=torch.float64)
    v = torch.cat([rand, sub, -sub, edges, -edges])
    if fmt != "float32":
        v = v.float().double()
    want = v.to(t).double()
    got = torch.from_numpy(round_to_format(v.numpy(), fmt))
    same = (got == want) & (got.signbit() == want.signbit())
    assert bool(same.all()), [(float(a), float(b), float(c)) for a, b, c in zip(v[~same][:5], got[~same][:5], want[~same][:5])]


@pytest.mark.parametrize("impl,dtype", [("triton", torch.bfloat16), ("triton", torch.float32), ("torch", torch.float32)])
def test_norm_matmul_float32_overflow_of_the_mean_square_is_nan(impl, dtype):
    """docs/semantics.md 6.12 / 6.21: a row whose float32 mean square overflows (finite entries of
    2**64) has no scale: NaN throughout in out; the other rows stay finite."""
    x = torch.ones((3, 8), dtype=dtype)
    x[1] = 2.0 ** 64
    out, _ = ops.norm_matmul(x.to(DEV), torch.ones(8, dtype=dtype, device=DEV), torch.ones((5, 8), dtype=dtype, device=DEV),
                             impl=impl)
    out = out.cpu()
    assert bool(out[1].isnan().all()) and bool(out[[0, 2]].isfinite().all()), out


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_norm_matmul_zero_columns_still_return_the_sum(impl):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn((5, 16), generator=g).to(DEV) for _ in range(2))
    out, total = ops.norm_matmul(x, torch.ones(16, device=DEV), torch.empty((0, 16), device=DEV), residual=r, impl=impl)
    assert out.shape == (5, 0) and torch.equal(total, x + r)


def test_norm_matmul_of_no_columns_or_no_rows_launches_nothing(monkeypatch):
    """An empty output (no columns or no rows), with or without a residual, launches no kernel: on
    a GPU an empty W^T may have no address to hand one (the interpreter would run an empty grid
    happily). The results are checked by the tests above; here only that nothing launched."""
    from specverify.kernels import norm_matmul as nm_kernel
    from tests.support.launches import launch_spy
    launched = launch_spy(monkeypatch, nm_kernel, "_norm_matmul_kernel", "HAS_RESIDUAL")
    x, gain = torch.randn((5, 16)), torch.ones(16)
    for rows, cols in ((5, 0), (0, 3)):
        for residual in (None, torch.randn((rows, 16))):
            nm_kernel.norm_matmul_triton(x[:rows], residual, gain, torch.randn((cols, 16)), 1e-6)
    assert launched == []
    nm_kernel.norm_matmul_triton(x, None, gain, torch.randn((3, 16)), 1e-6)
    assert launched == [False]


def test_norm_matmul_bad_devices_and_eps_are_named():
    x, r = torch.randn(2, 8), torch.randn(2, 8)
    w, wt = torch.ones(8), torch.randn(5, 8)
    for kw, name in ((dict(residual=r.to("meta")), "residual is on meta"), (dict(eps=float("inf")), "eps must be a finite"),):
        with pytest.raises(ValueError, match=name):
            ops.norm_matmul(x, w, wt, impl="torch", **kw)
    with pytest.raises(ValueError, match="weight_t is on meta"):
        ops.norm_matmul(x, w, wt.to("meta"), impl="torch")


def test_norm_matmul_hidden_bound_holds_for_auto_on_a_gpu(monkeypatch):
    """H = 1024 is accepted on the Triton path, 1025 refused, whether impl is "triton" or "auto"
    (emulated: ops told the Triton path is taken)."""
    monkeypatch.setattr(ops, "runs_triton", lambda impl, device, dtype: impl in ("auto", "triton"))
    monkeypatch.setattr(ops, "norm_matmul_impl", lambda *a: "launched")
    for impl in ("auto", "triton"):
        assert ops.norm_matmul(torch.ones(1, 1024), torch.ones(1024), torch.ones(1, 1024), impl=impl) == "launched"
        with pytest.raises(ValueError, match="x's H must be <= 1024"):
            ops.norm_matmul(torch.ones(1, 1025), torch.ones(1025), torch.ones(1, 1025), impl=impl)


def test_norm_matmul_float64_torch_path_is_float64():
    """The torch record compares float64 at the float16 tolerance, which a float64 path computing in
    float32 passes. Here float64 against the unrounded reference at float64's tolerance."""
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn((6, 40), generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.rand(40, generator=g, dtype=torch.float64) + 0.5
    wt = torch.randn((12, 40), generator=g, dtype=torch.float64)
    out, total = ops.norm_matmul(x, w, wt, residual=r, impl="auto")
    want_out, want_sum = reference.norm_matmul(x=x.numpy(), norm_weight=w.numpy(), weight_t=wt.numpy(), residual=r.numpy())
    assert_close(out, torch.from_numpy(want_out), "float64", "float64 out")
    assert_close(total, torch.from_numpy(want_sum), "float64", "float64 sum")


def test_draft_head_fuses_at_the_small_preset(monkeypatch):
    """The small preset's head (H 512) puts its norms in its matmuls on the fused path, the medium
    one's (H 2048, where the kernel's whole row spills) does not."""
    monkeypatch.setattr(layers, "fused_path", lambda device, dtype: dtype != torch.float64)
    models = specverify.build_models("small", seed=0, compute_dtype="bfloat16", device="cpu")
    assert models.draft.norm_matmul and preset("medium").hidden_size > NORM_MATMUL_HIDDEN


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_norm_matmul_without_residual_returns_x_as_the_sum(impl):
    x = torch.randn((3, 4, 16)).to(DEV)
    out, total = ops.norm_matmul(x, torch.ones(16, device=DEV), torch.randn((5, 16), device=DEV), impl=impl)
    assert out.shape == (3, 4, 5) and total.shape == x.shape and torch.equal(total, x)


def test_norm_matmul_float32_products_are_ieee():
    """float32: gains with 16 significant bits (TF32 keeps 11), W^T in {-1, -1/2, 0, 1/2}: every
    product and float32 sum exact, so out is the exact sum bit for bit (TF32 would move it)."""
    g = torch.Generator().manual_seed(12)
    rows, hidden, cols = 19, 16, 21
    s = torch.where(torch.rand((rows, hidden), generator=g) < 0.5, -1.0, 1.0).double()
    s[torch.arange(rows), torch.randint(0, hidden, (rows,), generator=g)] *= 7
    gain = 1 + torch.randint(0, 2 ** 15, (hidden,), generator=g).double() / 2 ** 15
    wt = torch.randint(-2, 2, (cols, hidden), generator=g).double() / 2
    exact = (s * 0.5 * gain) @ wt.T
    out, _ = ops.norm_matmul((s / 2).float().to(DEV), gain.float().to(DEV), wt.float().to(DEV),
                             residual=(s / 2).float().to(DEV), eps=0.0, impl="triton")
    assert torch.equal(out.cpu().double(), exact)


@pytest.mark.cuda
def test_cuda_norm_matmul_operands_reaching_past_32_bit_offsets():
    """W^T and x as views of a few rows 2**30 entries apart: tiny tensors whose offsets pass 2**31,
    so the kernel must take 64-bit offsets (its flag follows each operand's row-stride span, not its
    size). Both outputs equal the contiguous copies', bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(5)
    base = torch.randn(2 * 2 ** 30 + 64, device="cuda", dtype=torch.bfloat16, generator=g)    # 4 GiB
    wt = base.as_strided((3, 64), (2 ** 30, 1))
    x = base.as_strided((2, 64), (2 ** 30 + 7, 1), 32)
    gain = torch.rand(64, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
    got = ops.norm_matmul(x, gain, wt, impl="triton")
    want = ops.norm_matmul(x.contiguous(), gain, wt.contiguous(), impl="triton")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_gated_norm_matmul_reads_a_strided_weight(impl):
    """gated=True with weight_t a column slice of a wider tensor (row stride H + 8): the up half's
    rows are found through weight_t's row stride like the gate's (not at I * H entries past the
    start), so out equals a contiguous copy's (bit for bit under the interpreter)."""
    g = torch.Generator().manual_seed(9)
    rows, hidden, inter = 18, 24, 11
    x, r = (torch.randn((rows, hidden), generator=g).to(DEV) for _ in range(2))
    wt = torch.randn((2 * inter, hidden + 8), generator=g).to(DEV)[:, 8:]
    w = (torch.rand(hidden, generator=g) + 0.5).to(DEV)
    assert wt.stride(0) != hidden
    got = ops.norm_matmul(x, w, wt, residual=r, gated=True, impl=impl)
    want = ops.norm_matmul(x, w, wt.contiguous(), residual=r, gated=True, impl=impl)
    assert got[0].shape == (rows, inter) and torch.equal(got[1], want[1])
    assert_close(got[0].cpu(), want[0].cpu(), "float32", f"{impl}: gated out of a strided weight")
    if DEV == "cpu":
        assert torch.equal(got[0], want[0]), f"{impl}: gated out of a strided weight differs under the interpreter"


def test_gated_norm_matmul_long_offsets_follow_the_up_half(monkeypatch):
    """The 64-bit-offset flag follows the whole W^T a gated launch reads: the up rows n + I reach
    past the gate half's span. Here the gate half (rows 0, 1 at stride 2**30) stays below 2**31
    entries and the whole [4, H] reaches past it. Meta tensors: only the launch's arguments are
    read, nothing runs and nothing is allocated."""
    from specverify.kernels import norm_matmul as nm_kernel
    from tests.support.launches import launch_spy
    launched = launch_spy(monkeypatch, nm_kernel, "_norm_matmul_kernel", "LONG_OFFSETS")
    monkeypatch.setattr(nm_kernel, "interpreted", lambda kernel: True)
    hidden = 64
    x = torch.empty((2, hidden), dtype=torch.bfloat16, device="meta")
    gain = torch.empty(hidden, dtype=torch.bfloat16, device="meta")
    wt = torch.empty_strided((4, hidden), (2 ** 30, 1), dtype=torch.bfloat16, device="meta")
    assert nm_kernel._span(wt[:2]) < 2 ** 31 - nm_kernel.BLOCK_SPAN <= nm_kernel._span(wt)
    nm_kernel.norm_matmul_triton(x, None, gain, wt, 1e-6, gated=True)
    nm_kernel.norm_matmul_triton(x, None, gain, wt[:2], 1e-6, gated=True)
    assert launched == [True, False]


def test_norm_matmul_long_offsets_start_below_2_31(monkeypatch):
    """The 64-bit-offset flag is taken once an operand's span comes within the headroom of 2**31
    (a tile's masked offsets reach past its last entry): W^T reaching 2**31 - 100 takes it, one
    ending just before the headroom does not. Meta tensors, as above: nothing runs."""
    from specverify.kernels import norm_matmul as nm_kernel
    from tests.support.launches import launch_spy
    launched = launch_spy(monkeypatch, nm_kernel, "_norm_matmul_kernel", "LONG_OFFSETS")
    monkeypatch.setattr(nm_kernel, "interpreted", lambda kernel: True)
    hidden = 64
    x = torch.empty((2, hidden), dtype=torch.bfloat16, device="meta")
    gain = torch.empty(hidden, dtype=torch.bfloat16, device="meta")
    for end in (2 ** 31 - 100, 2 ** 31 - nm_kernel.BLOCK_SPAN - 1):
        wt = torch.empty_strided((2, hidden), (end - hidden, 1), dtype=torch.bfloat16, device="meta")
        assert nm_kernel._span(wt) == end
        nm_kernel.norm_matmul_triton(x, None, gain, wt, 1e-6)
    assert launched == [True, False]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_gated_norm_matmul_torch_path_is_the_product_then_silu_mul(dtype):
    """The torch path of gated=True is the two ops' torch paths in turn, bit for bit: `silu_mul`'s
    torch path rounds silu(gate) to the dtype before the product (not one float32 rounding)."""
    g = torch.Generator().manual_seed(23)
    rows, hidden, inter = 7, 40, 13
    x, r = (torch.randn((rows, hidden), generator=g).to(dtype) for _ in range(2))
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    wt = (torch.randn((2 * inter, hidden), generator=g) / 4).to(dtype)
    out, total = ops.norm_matmul(x, w, wt, residual=r, eps=1e-5, gated=True, impl="torch")
    gate_up, total_ungated = ops.norm_matmul(x, w, wt, residual=r, eps=1e-5, impl="torch")
    assert torch.equal(total, total_ungated)
    assert torch.equal(out, ops.silu_mul(gate_up, impl="torch"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_gated_norm_matmul_rounds_gate_and_up(dtype):
    """The reference's gated out is silu_mul of the product rounded to the dtype (torch's cast of
    the exact product): the exact case's products need the rounding, so a reference that skips
    it (or rounds to float32) differs."""
    x, r, gain, wt, _, exact = _exact_case(dtype)
    wt, exact = wt[:20], exact[:, :20]                      # an even N: gate 10, up 10
    out, _ = reference.norm_matmul(x=x.double().numpy(), residual=r.double().numpy(), norm_weight=gain.double().numpy(),
                                   weight_t=wt.double().numpy(), eps=0.0, round_to=str(dtype).split(".")[-1],
                                   gated=True)
    want = reference.silu_mul(gate_up=exact.to(dtype).double().numpy())
    assert not np.array_equal(want, reference.silu_mul(gate_up=exact.numpy())), "the case needs the rounding"
    assert np.array_equal(out, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gated_registry_reference_is_the_kernels_bits_rounded(dtype):
    """The registry compares by 1e-2, which a reference without a rounding passes. On its gated
    16-bit samples the kernel's out is the reference's rounded to the dtype at all but a few
    entries (ties of float32's silu against float64's): a reference whose normed or gate / up
    goes unrounded moves most of them."""
    from specverify.conformance.registry import REGISTRY, run_impl
    from specverify.platform import get_profile
    op, t = REGISTRY["norm_matmul_triton"], getattr(torch, dtype)
    bad = total = 0
    for s in op.samples(dtype, 0):
        if not s.args["gated"]:
            continue
        got = run_impl(op, s, get_profile())["out"].cpu()
        want = op.ref(s)["out"].to(t)
        assert torch.equal(got.isnan(), want.isnan()), s.name
        bad += int((got.nan_to_num() != want.nan_to_num()).sum())
        total += got.numel()
    assert total > 100 and bad <= total // 50, f"{bad} of {total} gated outputs are not the reference's rounding"


def test_gated_recipe_draws_gated_samples():
    """The property test's recipe draws the gated case too (hypothesis' find: the first such draw)."""
    from hypothesis import find, settings
    from specverify.conformance.registry import REGISTRY
    s = find(REGISTRY["norm_matmul_triton"].recipe("float32"), lambda s: s.args["gated"],
             settings=settings(database=None, max_examples=200))
    assert s.args["weight_t"].shape[0] % 2 == 0
