"""The model's fused path (issue 25): the Triton layer kernels (`ops.add_rmsnorm`,
`ops.rotary_kv_write`, `ops.silu_mul`) wired into the target and the draft head, against the
float64 reference model; and the memory-bound `medium` preset.

On the CPU the fused path runs only here, with the kernels interpreted (a model on CUDA takes it
by itself): the forward of the tiny model, dense and hybrid, prefill / decode / tree verify,
against `reference.forward`, and a speculative generation whose tokens equal the unfused one's.
On a GPU the `medium` preset's greedy speculative decoding (EAGLE, MTP, DFlash, steered) equals
its target-only decoding token for token up to the first near-tie of the target's logits."""

from __future__ import annotations

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
    draft = models.draft if head == "draft" else models.mtp[1]
    assert "layer.w_gate_up" in draft.w, "the head must be built on the fused path"
    assert_write_kv_writes_the_forwards_kv(models, draft, seed, FUSED_DEVICE)


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
def test_add_rmsnorm_reads_a_residual_strided_apart_from_x(impl, lanes):
    """A residual whose rows lie 2H apart (a slice of a wider tensor) while x's lie H apart: each is
    read through its own row stride, bit for bit what a contiguous copy gives."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(8)
    bs, q, hidden = 3, 4, 24
    x = torch.randn((bs, q, hidden), generator=gen).to(dev)
    r = torch.randn((bs, q, 2 * hidden), generator=gen).to(dev)[..., :hidden]
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
