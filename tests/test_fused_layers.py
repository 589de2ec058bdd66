"""The model's fused path (issue 25): the Triton layer kernels (`ops.add_rmsnorm`,
`ops.rotary_kv_write`, `ops.silu_mul`) wired into the target and the draft head, against the
float64 reference model; and the memory-bound `medium` preset.

On the CPU the fused path runs only here, with the kernels interpreted (a model on CUDA takes it
by itself): the forward of the tiny model, dense and hybrid, prefill / decode / tree verify,
against `reference.forward`, and a speculative generation whose tokens equal the unfused one's.
On a GPU the `medium` preset's greedy speculative decoding (EAGLE, MTP, DFlash, steered) equals
its target-only decoding token for token up to the first near-tie of the target's logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
import specverify
from specverify.kernels import fused_layers, token_slots
from specverify.models import layers
from tests.support.asserts import assert_close
from tests.test_draft_head import assert_write_kv_writes_the_forwards_kv
from tests.test_model_forward import PROMPTS, TREE_PARENTS, chain, run


# Where the fused models live: a CUDA device takes the fused path by itself; on the CPU the fixture
# below routes the model through the (interpreted) kernels.
FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """Models built inside take the fused path on the CPU (the Triton kernels, interpreted: the
    layer kernels and the slot plan's); on a CUDA machine nothing is patched (the models there are
    built on the GPU)."""
    if FUSED_DEVICE == "cpu":
        monkeypatch.setattr(layers, "fused_path", lambda device, dtype: dtype != torch.float64)
        monkeypatch.setattr(fused_layers, "runs_triton",
                            lambda impl, device, dtype: impl in ("auto", "triton") and dtype != torch.float64)
        monkeypatch.setattr(layers, "token_slots_impl", lambda *args: token_slots.token_slots_impl(*args, impl="triton"))


@pytest.mark.kernels
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("head", ["draft", "mtp1"])
def test_write_kv_on_the_fused_path_writes_the_forwards_kv(fused_on_cpu, compute_dtype, head, seed):
    """`DraftHead.write_kv` through the fused rotary kernel (an MTP head's context rows on a GPU)
    writes the K/V the head's whole fused forward writes, bit for bit, and nothing else
    (tests/test_draft_head.py runs the torch path)."""
    models = specverify.build_models("tiny", seed=seed % 1000, compute_dtype=compute_dtype, device=FUSED_DEVICE)
    draft, other = (models.draft, models.mtp[0]) if head == "draft" else (models.mtp[1], models.mtp[2])
    assert "layer.w_gate_up" in draft.w, "the head must be built on the fused path"
    assert_write_kv_writes_the_forwards_kv(models, draft, seed, FUSED_DEVICE, shared_with=other)


@pytest.mark.kernels
@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_fused_forward_matches_reference(fused_on_cpu, compute_dtype, hybrid, request):
    models = specverify.build_models("tiny", seed=11, compute_dtype=compute_dtype, hybrid=hybrid, device=FUSED_DEVICE)
    cfg, w, model = models.config, models.target_weights, models.target
    assert "layers.0.w_gate_up" in model.w, "the fused path did not engage"
    cache = model.new_cache(max_requests=4, page_size=4)
    rows = [cache.table.alloc_row() for _ in PROMPTS]
    nodeid = request.node.nodeid
    out = run(model, cache, rows, [0, 0, 0], PROMPTS, [chain(len(p)) for p in PROMPTS])
    for b, p in enumerate(PROMPTS):
        ref_logits, ref_hidden = reference.forward(cfg, w, p)
        assert_close(out.hidden[b, :len(p)].cpu(), ref_hidden, compute_dtype, f"prefill hidden, request {b}", nodeid)
        assert_close(out.logits[b, :len(p)].double().cpu(), ref_logits, compute_dtype, f"prefill logits, request {b}", nodeid)
    seqs = [list(p) + [t] for p, t in zip(PROMPTS, (7, 301, 2))]
    out = run(model, cache, rows, [len(p) for p in PROMPTS], [[s[-1]] for s in seqs], [chain(1)] * 3)
    for b, s in enumerate(seqs):
        assert_close(out.logits[b, 0].double().cpu(), reference.forward(cfg, w, s)[0][-1], compute_dtype,
                     f"decode logits, request {b}", nodeid)
    trees = [[60, 61, 62, 63, 64, 65, 66], [70, 71, 72], [80, 81, 82, 83, 84, 85, 86]]
    parents = [TREE_PARENTS, TREE_PARENTS[:3], TREE_PARENTS]
    out = run(model, cache, rows, [len(s) for s in seqs], trees, parents, commit=False)
    for b, (toks, par) in enumerate(zip(trees, parents)):
        ref = reference.tree_node_logits(cfg, w, seqs[b], toks, par)
        assert_close(out.logits[b, :len(toks)].double().cpu(), ref, compute_dtype, f"tree verify logits, request {b}", nodeid)


@pytest.mark.kernels
@pytest.mark.parametrize("spec", [specverify.SpecConfig(num_steps=3, topk=2, num_draft_tokens=5),
                                  specverify.SpecConfig(algorithm="mtp", num_steps=2)], ids=["eagle-k2", "mtp"])
def test_fused_speculative_generation_equals_unfused(fused_on_cpu, monkeypatch, spec):
    """float32: the fused kernels round differently from the torch ops by a few float32 ulps, far
    below this model's greedy margins, so the tokens and accept lengths agree exactly."""
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [300, 2]]
    fused = specverify.generate(specverify.build_models("tiny", seed=3, device=FUSED_DEVICE), prompts,
                                max_new_tokens=10, spec=spec)
    monkeypatch.undo()
    unfused_models = specverify.build_models("tiny", seed=3, device="cpu")
    assert "layers.0.w_gate_up" not in unfused_models.target.w
    plain = specverify.generate(unfused_models, prompts, max_new_tokens=10, spec=spec)
    assert fused.tokens == plain.tokens
    assert fused.accept_lengths == plain.accept_lengths


@pytest.mark.kernels
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_draft_head_norms_ride_in_their_matmuls_against_the_reference(fused_on_cpu, monkeypatch, compute_dtype, seed):
    """On the fused path at the tiny hidden size the draft head's attention norm runs inside its
    q|k|v projection and its MLP norm and SiLU gate inside its gate|up projection (`ops.norm_matmul`:
    two launches a forward, the final norm the only `add_rmsnorm`, no `silu_mul`), and every row's logits and hidden state equal
    the float64 reference head's (`reference.eagle.draft_row`) by the dtype's tolerance: a norm
    that reads the wrong row, weight or residual, or a projection that skips the norm, moves them
    far past it. A batch past NORM_MATMUL_ROWS rows (a prefill's draft-extend) takes the separate
    kernels and agrees with the reference as well."""
    from reference.eagle import draft_row
    from specverify.kernels import norm_matmul
    from specverify.models import draft as draft_module
    from tests.test_draft_head import batch_on, draft_batch

    models = specverify.build_models("tiny", seed=seed % 1000, compute_dtype=compute_dtype, device=FUSED_DEVICE)
    cfg, head = models.config, models.draft
    assert head.norm_matmul, "the head must put its norms in its matmuls on the fused path"
    cfg = head.config = dataclasses.replace(cfg, norm_eps=1e-2)     # not the default: every eps is the config's
    launches = {"norm_matmul": 0, "add_rmsnorm": 0, "silu_mul": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            launches[name] += 1
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(norm_matmul, "norm_matmul_triton", counted("norm_matmul", norm_matmul.norm_matmul_triton))
    monkeypatch.setattr(layers, "add_rmsnorm_impl", counted("add_rmsnorm", layers.add_rmsnorm_impl))
    monkeypatch.setattr(layers, "silu_mul_impl", counted("silu_mul", layers.silu_mul_impl))
    g = torch.Generator().manual_seed(seed)
    most = draft_module.NORM_MATMUL_ROWS          # the last fused batch, then the first one past it
    for bs, q in ((2, 5), (4, most // 4), (5, most // 5 + 1)):
        tokens = torch.randint(0, cfg.vocab_size, (bs, q), generator=g)
        feats = torch.randn((bs, q, cfg.hidden_size), generator=g, dtype=torch.float64)
        cache = models.target.new_cache(max_requests=bs)
        rows = [cache.table.alloc_row() for _ in range(bs)]
        for r in rows:
            cache.table.reserve(r, q)
        batch = batch_on(draft_batch(rows, [0] * bs, tokens), FUSED_DEVICE)
        launches.update(norm_matmul=0, add_rmsnorm=0, silu_mul=0)
        out = head.forward(cache, batch, feats.to(head.w["fc"].dtype).to(FUSED_DEVICE))
        fused = bs * q <= draft_module.NORM_MATMUL_ROWS
        # Fused, the SiLU gate rides in the gate|up projection too (`norm_matmul(..., gated=True)`).
        assert launches == ({"norm_matmul": 2, "add_rmsnorm": 1, "silu_mul": 0} if fused else
                            {"norm_matmul": 0, "add_rmsnorm": 3, "silu_mul": 1})
        for b in range(bs):
            for j in (0, q // 2, q - 1):
                seen = feats[b, :j + 1].to(head.w["fc"].dtype).double()          # the features the head read
                want_logits, want_hidden = draft_row(cfg, models.target_weights, models.draft_weights,
                                                     tokens[b, :j + 1].tolist(), seen, list(range(j + 1)))
                where = f"bs {bs} q {q}: request {b} row {j}"
                assert_close(out.hidden[b, j].double().cpu(), want_hidden, compute_dtype, f"draft hidden, {where}")
                assert_close(out.logits[b, j].double().cpu(), want_logits, compute_dtype, f"draft logits, {where}")


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_matmul_sum_is_torchs_add_bit_for_bit(dtype, seed):
    """The residual stream `ops.norm_matmul` returns is x + residual rounded once to x's dtype, the
    bits torch's own add gives (float32 sum, nearest even), on the Triton path (interpreted on the
    CPU, where a float32 -> bfloat16 store truncates unless the kernel rounds itself) and the torch
    path alike: ulp-adjacent pairs, ties, exponents 2**20 apart, NaN, inf and signed zeros, over
    several row blocks and column blocks."""
    dev = FUSED_DEVICE
    g = torch.Generator().manual_seed(seed)
    rows, hidden = 37, 48
    x = (torch.randint(-4096, 4096, (rows, hidden), generator=g).double() / 64).to(dtype)
    r = (torch.randint(-4096, 4096, (rows, hidden), generator=g).double() / 64).to(dtype)
    x[0] = torch.nextafter(r[0], torch.tensor(float("inf"), dtype=dtype))          # ulp-adjacent to the residual
    r[1] = -x[1] / 2 ** 20                                                         # far apart: the sum rounds
    x[2, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    r[2, :4] = torch.tensor([1.0, 2.0, -3.0, -0.0])
    low = torch.finfo(dtype).eps / 2                                                # halfway between two values
    x[3], r[3] = torch.ones(hidden, dtype=dtype), torch.full((hidden,), low, dtype=dtype)
    weight_t = (torch.randint(-64, 64, (40, hidden), generator=g).double() / 512).to(dtype)
    norm_w = torch.ones(hidden, dtype=dtype)
    want = x + r
    for impl in ("triton", "torch"):
        _, total = specverify.ops.norm_matmul(x.to(dev), norm_w.to(dev), weight_t.to(dev), residual=r.to(dev),
                                              impl=impl)
        total = total.cpu()
        same = (total == want) | (total.isnan() & want.isnan())
        signed = ~want.isnan()                                     # a NaN's sign is no part of the contract
        assert bool(same.all()) and torch.equal(total.signbit()[signed], want.signbit()[signed]), \
            f"{impl}: the residual stream is not x + residual rounded once ({int((~same).sum())} entries differ)"


def test_medium_preset_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match="preset 'medium' is for GPU benchmarks.*device is 'cpu'"):
        specverify.build_models("medium", device="cpu")


def test_medium_preset_is_memory_bound_by_construction():
    """About 2.4 GB of bfloat16 weights a forward reads, and a draft forward (one layer, the fc and
    the shared lm_head) about a tenth of that: the ratio the speculative speed-up rests on."""
    cfg = specverify.models.config.preset("medium")
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = h * (q + 2 * kv) + q * h + 3 * h * i
    target = 2 * (cfg.num_layers * layer + cfg.vocab_size * h)
    draft = 2 * (layer + 2 * h * h + cfg.vocab_size * h)
    assert 2.0e9 < target < 3.0e9
    assert draft / target < 0.11


@pytest.mark.cuda
def test_medium_preset_greedy_speculation_is_lossless_on_the_gpu():
    from tests.support.steering import steered_models
    models = specverify.build_models("medium", seed=0, compute_dtype="float32", logits_dtype="float32", device="cuda")
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, models.config.vocab_size, (n,), generator=gen).tolist() for n in (9, 23, 40, 16)]
    target = specverify.generate(models, prompts, max_new_tokens=24)
    specs = [specverify.SpecConfig(num_steps=3, topk=1), specverify.SpecConfig(num_steps=3, topk=4, num_draft_tokens=8),
             specverify.SpecConfig(algorithm="mtp", num_steps=3), specverify.SpecConfig(algorithm="dflash", num_steps=3)]
    steered = steered_models(models, prompts, 24, agreement=0.7, spec=specs)
    for spec in specs:
        out = specverify.generate(steered, prompts, max_new_tokens=24, spec=spec)
        for r, (got, want) in enumerate(zip(out.tokens, target.tokens)):
            assert got == want, f"{spec.algorithm} topk {spec.topk}: request {r} diverges from target-only"
        accepted = [a for lens in out.accept_lengths for a in lens]
        assert sum(accepted) / len(accepted) > 1.5, f"{spec.algorithm}: the steered draft was never accepted"


@pytest.mark.cuda
def test_cuda_silu_mul_rows_past_int32():
    """A long prefill of a big MLP passes 2**31 elements of gate_up: the kernel's row offsets are
    int64 (an int32 row * stride wraps negative there and reads another row). Three rows of a 4 GiB
    bfloat16 buffer whose row stride is 2**30 elements, against the reference."""
    dev = torch.device("cuda")
    stride, inter = 2 ** 30, 64
    storage = torch.zeros(2 * stride + 2 * inter, dtype=torch.bfloat16, device=dev)
    gate_up = storage.as_strided((3, 2 * inter), (stride, 1))
    rows = (torch.randint(-16, 17, (3, 2 * inter), generator=torch.Generator().manual_seed(5)) / 4).to(torch.bfloat16)
    gate_up.copy_(rows.to(dev))
    got = fused_layers.silu_mul_impl(gate_up, impl="triton").cpu()
    del storage, gate_up
    torch.cuda.empty_cache()
    want = torch.as_tensor(reference.silu_mul(gate_up=rows.double().numpy()))
    assert_close(got, want, "bfloat16", "silu_mul of rows past element 2**31")


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_rotary_kv_write_reads_the_tables_at_clamped_positions(impl):
    """The forward hands the rotary op its positions unclamped (a padded lane may sit past the
    RoPE table) and the op reads the tables at them clamped to [0, P): exactly what the in-range
    positions give, also through a strided positions vector (a draft step's column of the plan)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    tokens, hq, hkv, dim, rows, slots_total = 6, 4, 2, 16, 7, 10
    qkv = torch.randn((tokens, hq + 2 * hkv, dim), generator=gen).to(dev)
    cos, sin = (torch.randn((rows, dim // 2), generator=gen).to(dev) for _ in range(2))
    wild = torch.tensor([-3, -1, 0, 6, 7, 1000])
    strided = torch.stack([wild, torch.zeros_like(wild)], 1)[:, 0]        # stride 2
    slots = torch.tensor([1, 2, 3, 4, 5, 6], device=dev)

    def run_at(positions):
        k, v = (torch.zeros((slots_total, hkv, dim), device=dev) for _ in range(2))
        q = specverify.ops.rotary_kv_write(qkv=qkv, positions=positions.to(dev), cos=cos, sin=sin, k_cache=k,
                                           v_cache=v, slots=slots, num_q_heads=hq, impl=impl, checked=False)
        return q, k, v

    want = run_at(wild.clamp(0, rows - 1))
    for positions in (wild, strided):
        for got, expected in zip(run_at(positions), want):
            assert torch.equal(got, expected), f"positions {positions.tolist()} not read clamped to [0, {rows})"


@pytest.mark.kernels
@pytest.mark.parametrize("layout", ["rows-apart", "sin-rows-apart", "sin-every-second-column",
                                    "cos-every-second-column", "sin-column-major"])
def test_rotary_kv_write_reads_tables_of_any_layout(layout):
    """cos and sin as views of other layouts (the kernel reads both through cos's row stride and
    their columns densely, so the wrapper copies the tables when either's columns are apart or
    their row strides differ): whatever each table's layout, the rotated queries and the cache
    writes are bit for bit those of contiguous tables, on both paths."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(6)
    tokens, hq, hkv, dim, rows, slots_total = 5, 2, 1, 16, 9, 8
    qkv = torch.randn((tokens, hq + 2 * hkv, dim), generator=gen).to(dev)
    cos, sin = (torch.randn((rows, dim // 2), generator=gen).to(dev) for _ in range(2))
    positions = torch.tensor([0, 8, 3, 3, 5], device=dev)
    slots = torch.tensor([1, 2, 3, 6, 7], device=dev)

    def viewed(t, how):                  # the same values, another layout (taken on the device)
        if how == "every-second-column":
            wide = torch.zeros((rows, dim), device=dev)
            wide[:, ::2] = t
            return wide[:, ::2]
        if how == "column-major":
            return t.T.contiguous().T
        wide = torch.zeros((rows, dim), device=dev)             # rows apart: a column slice of a wider table
        wide[:, 1:dim // 2 + 1] = t
        return wide[:, 1:dim // 2 + 1]

    c, s = {"rows-apart": (viewed(cos, "rows"), viewed(sin, "rows")),
            "sin-every-second-column": (viewed(cos, "rows"), viewed(sin, "every-second-column")),
            "sin-rows-apart": (cos, viewed(sin, "rows")),
            "cos-every-second-column": (viewed(cos, "every-second-column"), viewed(sin, "rows")),
            "sin-column-major": (cos, viewed(sin, "column-major"))}[layout]
    assert torch.equal(c, cos) and torch.equal(s, sin) and not (c.is_contiguous() and s.is_contiguous())

    def run(impl, c, s):
        k, v = (torch.zeros((slots_total, hkv, dim), device=dev) for _ in range(2))
        q = specverify.ops.rotary_kv_write(qkv=qkv, positions=positions, cos=c, sin=s, k_cache=k, v_cache=v,
                                           slots=slots, num_q_heads=hq, impl=impl)
        return q, k, v
    for impl in ("torch", "triton"):
        for got, want in zip(run(impl, c, s), run(impl, cos, sin)):
            assert torch.equal(got, want), f"{impl}: rotary_kv_write with {layout} tables differs"


@pytest.mark.kernels
@pytest.mark.parametrize("layout", ["contiguous", "row-padded", "column-major", "every-second-column"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_concat_reads_any_table_layout(layout, dtype):
    """The embedding table as a view of any layout: rows padded apart, column-major (a transpose:
    unit row stride), every second column. The kernel reads a row's columns densely, so the
    wrapper copies a table whose columns are apart, whatever its other stride. The result is a
    gather and a copy: bit for bit `[table[ids] | features]`, on both paths, ids at both ends of
    the vocabulary and repeated."""
    g = torch.Generator().manual_seed(7)
    vocab, hidden = 11, 6
    def base(*shape):                    # the view is taken on the device: `.to` of a view copies it
        return torch.randn(shape, generator=g).to(dtype).to(FUSED_DEVICE)
    table = {"contiguous": lambda: base(vocab, hidden),
             "row-padded": lambda: base(vocab, hidden + 3)[:, 1:hidden + 1],
             "column-major": lambda: base(hidden, vocab).T,
             "every-second-column": lambda: base(vocab, 2 * hidden)[:, ::2]}[layout]()
    assert table.shape == (vocab, hidden) and table.is_contiguous() == (layout == "contiguous")
    ids = torch.tensor([[0, vocab - 1, 3], [3, 0, vocab - 1]], device=FUSED_DEVICE)
    features = base(2, 3, hidden)
    want = torch.cat([table[ids], features], dim=-1)
    for impl in ("torch", "triton"):
        got = specverify.ops.embed_concat(ids=ids, table=table, features=features, impl=impl)
        assert torch.equal(got, want), f"{impl}: embed_concat of a {layout} table differs"


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_add_rmsnorm_reads_one_lane_per_request_through_a_strided_at(impl):
    """`at` as the engine may hand it: a column of a packed tensor (stride 2). The op reads each
    request's lane through it, bit for bit what a contiguous copy gives and what the gather then the
    plain norm give; the other lanes hold NaN."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(5)
    bs, q, hidden = 4, 3, 40
    x, r = (torch.randn((bs, q, hidden), generator=gen) for _ in range(2))
    at = torch.tensor([2, 0, 1, 2])
    picked = x[torch.arange(bs), at][:, None], r[torch.arange(bs), at][:, None]
    x[torch.arange(q)[None, :] != at[:, None]] = float("nan")
    w = torch.rand(hidden, generator=gen) + 0.5
    strided = torch.stack([torch.zeros_like(at), at], 1).to(dev)[:, 1]
    x, r, w = x.to(dev), r.to(dev), w.to(dev)
    want = specverify.ops.add_rmsnorm(picked[0].to(dev), w, residual=picked[1].to(dev), impl=impl)
    assert strided.stride() == (2,)
    for lanes in (strided, at.to(dev)):
        got = specverify.ops.add_rmsnorm(x, w, residual=r, at=lanes, impl=impl)
        for a, b in zip(got, want):
            assert a.shape == (bs, 1, hidden) and torch.equal(a, b), f"at {lanes.tolist()} (stride {lanes.stride()})"


@pytest.mark.kernels
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("lanes", [False, True], ids=["every-row", "one-lane"])
@pytest.mark.parametrize("columns", ["dense", "every-second"])
def test_add_rmsnorm_reads_a_residual_strided_apart_from_x(impl, lanes, columns):
    """A residual whose rows lie 2H apart (a slice of a wider tensor) while x's lie H apart, its
    columns dense or every second one (which the kernel cannot read: the wrapper copies it): bit
    for bit what a contiguous copy gives."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(8)
    bs, q, hidden = 3, 4, 24
    x = torch.randn((bs, q, hidden), generator=gen).to(dev)
    wide = torch.randn((bs, q, 2 * hidden), generator=gen).to(dev)
    r = wide[..., :hidden] if columns == "dense" else wide[..., ::2]
    w = (torch.rand(hidden, generator=gen) + 0.5).to(dev)
    at = torch.tensor([3, 0, 2], device=dev) if lanes else None
    got = specverify.ops.add_rmsnorm(x, w, residual=r, at=at, impl=impl)
    want = specverify.ops.add_rmsnorm(x, w, residual=r.contiguous(), at=at, impl=impl)
    for a, b in zip(got, want):
        assert torch.equal(a, b), "the residual read through x's row stride"


def test_add_rmsnorm_reads_no_lane_back_inside_a_capture(monkeypatch):
    """The lanes' range check reads the device, so inside a CUDA-graph capture it is skipped (the
    op is then the engine's unchecked call): no host sync, whatever `at` holds."""
    monkeypatch.setattr(specverify.ops, "capturing", lambda device=None: True)
    monkeypatch.setattr(specverify.ops, "add_rmsnorm_impl", lambda *args, **kwargs: "launched")
    x = torch.randn((2, 3, 8))
    assert specverify.ops.add_rmsnorm(x, torch.ones(8), at=torch.tensor([0, 7])) == "launched"


def test_lane_rows_names_a_bad_at():
    x = torch.randn((3, 4, 5))
    for bad in (torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 1])):
        with pytest.raises(ValueError, match=r"at must be an int64 \[3\] tensor"):
            layers.lane_rows(x, bad)
