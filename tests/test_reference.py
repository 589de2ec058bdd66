"""The reference against hand-built facts, independent of specverify.

Each test builds its own tiny config (SimpleNamespace) and float64 weights, and checks the
reference against a second, differently written computation or a hand-derived number.
Re-run one test: python -m pytest tests/test_reference.py -q -p no:cacheprovider -k NAME
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import reference
from reference.logits import convert_logits, greedy_token, row_scale
from reference.model import forward, forward_logits, recurrent_states, rope, tree_node_logits
from reference.sampling import counter_uniform, draw, filtered_probs, keep_min_p, keep_top_k, keep_top_p

from reference import fp8 as ref_fp8  # noqa: F401  (an import error fails the module, never skips it)

pytestmark = pytest.mark.bitexact

# Skip only where the FP8 dtypes are genuinely absent from this torch (the tests cast with them).
_FP8_ABSENT = [n for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
               if not isinstance(getattr(torch, n, None), torch.dtype)]
needs_fp8 = pytest.mark.skipif(bool(_FP8_ABSENT), reason=f"this torch has no {', '.join(_FP8_ABSENT)}")


# ---------------------------------------------------------------------------------------------
# tiny models


def make_config(layer_kinds=("attention",), **overrides):
    fields = dict(
        vocab_size=13,
        hidden_size=8,
        num_layers=len(layer_kinds),
        num_heads=4,
        num_kv_heads=2,
        head_dim=4,
        intermediate_size=12,
        rope_theta=10000.0,
        norm_eps=1e-6,
        num_rec_heads=2,
        rec_key_dim=3,
        rec_value_dim=4,
        rec_conv_width=3,
        max_context=32,
        layer_kinds=tuple(layer_kinds),
        logits_dtype="float32",
        logits_scale=1.0,
        logits_scale_mode="static",
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def make_weights(c, seed=0):
    g = torch.Generator("cpu").manual_seed(seed)

    def rnd(*shape, scale=0.5):
        return torch.randn(*shape, dtype=torch.float64, generator=g) * scale

    H, V, I = c.hidden_size, c.vocab_size, c.intermediate_size
    w = {"embed": rnd(V, H, scale=1.0), "final_norm": 1 + rnd(H, scale=0.1), "lm_head": rnd(H, V)}
    for i, kind in enumerate(c.layer_kinds):
        w[f"layers.{i}.attn_norm"] = 1 + rnd(H, scale=0.1)
        w[f"layers.{i}.mlp_norm"] = 1 + rnd(H, scale=0.1)
        w[f"layers.{i}.w_gate"] = rnd(H, I)
        w[f"layers.{i}.w_up"] = rnd(H, I)
        w[f"layers.{i}.w_down"] = rnd(I, H)
        if kind == "attention":
            nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
            w[f"layers.{i}.wq"] = rnd(H, nh * hd)
            w[f"layers.{i}.wk"] = rnd(H, nkv * hd)
            w[f"layers.{i}.wv"] = rnd(H, nkv * hd)
            w[f"layers.{i}.wo"] = rnd(nh * hd, H)
        else:
            nr, dk, dv = c.num_rec_heads, c.rec_key_dim, c.rec_value_dim
            w[f"layers.{i}.wq"] = rnd(H, nr * dk)
            w[f"layers.{i}.wk"] = rnd(H, nr * dk)
            w[f"layers.{i}.wv"] = rnd(H, nr * dv)
            w[f"layers.{i}.conv"] = rnd(c.rec_conv_width, nr * (2 * dk + dv))
            w[f"layers.{i}.wa"] = rnd(H, nr)
            w[f"layers.{i}.ba"] = rnd(nr)
            w[f"layers.{i}.wo"] = rnd(nr * dv, H)
    return w


def make_models(layer_kinds=("attention",), seed=0, **overrides):
    c = make_config(layer_kinds, **overrides)
    return SimpleNamespace(config=c, target_weights=make_weights(c, seed))


def norm(x, w, eps):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * w


def mlp(x, w, i, eps):
    n = norm(x, w[f"layers.{i}.mlp_norm"], eps)
    return (torch.nn.functional.silu(n @ w[f"layers.{i}.w_gate"]) * (n @ w[f"layers.{i}.w_up"])) @ w[f"layers.{i}.w_down"]


def rotation(pos, hd, theta):
    """RoPE as a [hd, hd] matrix R with rope(x) = R @ x (rotate-half pairs j, j + hd/2)."""
    R = torch.zeros(hd, hd, dtype=torch.float64)
    half = hd // 2
    for j in range(half):
        ang = pos * theta ** (-2 * j / hd)
        R[j, j], R[j, j + half] = math.cos(ang), -math.sin(ang)
        R[j + half, j], R[j + half, j + half] = math.sin(ang), math.cos(ang)
    return R


# ---------------------------------------------------------------------------------------------
# the forward


def test_attention_forward_matches_matrix_form():
    m = make_models(("attention",), seed=1)
    c, w = m.config, m.target_weights
    tokens = [3, 0, 12, 7, 7, 5]
    T, nh, nkv, hd = len(tokens), c.num_heads, c.num_kv_heads, c.head_dim
    h = w["embed"][tokens]
    n = norm(h, w["layers.0.attn_norm"], c.norm_eps)
    q = (n @ w["layers.0.wq"]).reshape(T, nh, hd)
    k = (n @ w["layers.0.wk"]).reshape(T, nkv, hd)
    v = (n @ w["layers.0.wv"]).reshape(T, nkv, hd)
    Rs = torch.stack([rotation(t, hd, c.rope_theta) for t in range(T)])  # [T, hd, hd]
    q = torch.einsum("tij,thj->thi", Rs, q)
    k = torch.einsum("tij,thj->thi", Rs, k)
    k = k.repeat_interleave(nh // nkv, dim=1)  # query head g -> kv head g // (nh/nkv)
    v = v.repeat_interleave(nh // nkv, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    scores = scores.masked_fill(~mask, float("-inf"))
    att = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v).reshape(T, nh * hd)
    h = h + att @ w["layers.0.wo"]
    h = h + mlp(h, w, 0, c.norm_eps)
    expected_logits = norm(h, w["final_norm"], c.norm_eps) @ w["lm_head"]

    logits, hidden = forward(c, w, tokens)
    assert logits.dtype == torch.float64 and logits.shape == (T, c.vocab_size)
    assert hidden.shape == (T, c.hidden_size)
    torch.testing.assert_close(hidden, h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-12, atol=1e-12)


def test_recurrent_forward_matches_closed_form_t2():
    m = make_models(("recurrent",), seed=2)
    c, w = m.config, m.target_weights
    tokens = [4, 9]
    nr, dk, dv = c.num_rec_heads, c.rec_key_dim, c.rec_value_dim
    h = w["embed"][tokens]
    n = norm(h, w["layers.0.attn_norm"], c.norm_eps)
    u = torch.cat([n @ w["layers.0.wq"], n @ w["layers.0.wk"], n @ w["layers.0.wv"]], 1)
    taps = w["layers.0.conv"]            # [3, C], oldest first: token t sees taps[-1] u_t + taps[-2] u_{t-1}
    conv = torch.nn.functional.silu(torch.stack([taps[-1] * u[0], taps[-2] * u[0] + taps[-1] * u[1]]))
    q, k, v = conv[:, :nr * dk], conv[:, nr * dk:2 * nr * dk], conv[:, 2 * nr * dk:]
    a = torch.sigmoid(n @ w["layers.0.wa"] + w["layers.0.ba"])
    ys = torch.zeros(2, nr * dv, dtype=torch.float64)
    for r in range(nr):
        qs, ks, vs = q[:, r * dk:(r + 1) * dk], k[:, r * dk:(r + 1) * dk], v[:, r * dv:(r + 1) * dv]
        # y_0 = (q_0 . k_0 / sqrt(dk)) v_0 ; y_1 = a_1 (q_1 . k_0 / sqrt(dk)) v_0 + (q_1 . k_1 / sqrt(dk)) v_1
        ys[0, r * dv:(r + 1) * dv] = (qs[0] @ ks[0]) / math.sqrt(dk) * vs[0]
        ys[1, r * dv:(r + 1) * dv] = (a[1, r] * (qs[1] @ ks[0]) * vs[0] + (qs[1] @ ks[1]) * vs[1]) / math.sqrt(dk)
    h = h + ys @ w["layers.0.wo"]
    h = h + mlp(h, w, 0, c.norm_eps)
    expected = norm(h, w["final_norm"], c.norm_eps) @ w["lm_head"]
    logits, hidden = forward(c, w, tokens)
    torch.testing.assert_close(hidden, h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits, expected, rtol=1e-12, atol=1e-12)


def test_rope_at_position_zero_is_identity():
    x = torch.randn(1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rope(x, [0], 10000.0), x)


def test_rope_matches_rotation_matrix():
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = rope(x, [0, 5, 17], 500.0)
    for t, pos in enumerate([0, 5, 17]):
        torch.testing.assert_close(got[t], rotation(pos, 6, 500.0) @ x[t], rtol=1e-13, atol=1e-13)


def test_attention_depends_on_relative_positions_only():
    m = make_models(("attention", "attention"), seed=5)
    tokens = [1, 2, 3, 4, 5]
    base = forward_logits(m.config, m.target_weights, tokens)
    shifted = forward_logits(m.config, m.target_weights, tokens, positions=[p + 11 for p in range(5)])
    torch.testing.assert_close(base, shifted, rtol=1e-9, atol=1e-9)
    moved = forward_logits(m.config, m.target_weights, tokens, positions=[0, 1, 2, 3, 9])
    assert not torch.allclose(base[-1], moved[-1])


def test_logits_are_final_norm_of_hidden():
    m = make_models(("attention", "recurrent"), seed=6)
    logits, hidden = forward(m.config, m.target_weights, [0, 5, 2])
    w = m.target_weights
    torch.testing.assert_close(logits, norm(hidden, w["final_norm"], m.config.norm_eps) @ w["lm_head"])


@pytest.mark.parametrize("kinds", [("attention",), ("recurrent",), ("recurrent", "attention")])
def test_forward_is_causal(kinds):
    m = make_models(kinds, seed=7)
    short = forward_logits(m.config, m.target_weights, [6, 1, 8])
    long = forward_logits(m.config, m.target_weights, [6, 1, 8, 0, 12])
    torch.testing.assert_close(long[:3], short, rtol=1e-12, atol=1e-12)


def test_forward_rejects_bad_input():
    m = make_models()
    with pytest.raises(ValueError, match="tokens"):
        forward(m.config, m.target_weights, [])
    with pytest.raises(ValueError, match=r"outside \[0, 13\)"):
        forward(m.config, m.target_weights, [13])
    with pytest.raises(ValueError, match="positions"):
        forward(m.config, m.target_weights, [1, 2], positions=[0])
    bad = make_config(("convolution",))
    with pytest.raises(ValueError, match="layer_kinds"):
        forward(bad, m.target_weights, [1])


# ---------------------------------------------------------------------------------------------
# tree queries


def test_tree_node_logits_match_per_path_forward():
    m = make_models(("attention", "recurrent"), seed=8)
    c, w = m.config, m.target_weights
    prefix = [2, 7, 1]
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    node_tokens = [9, 4, 4, 0, 11, 6]
    parents = [-1, 0, 0, 1, 1, 2]
    got = tree_node_logits(c, w, prefix, node_tokens, parents)
    paths = [[9], [9, 4], [9, 4], [9, 4, 0], [9, 4, 11], [9, 4, 6]]
    assert got.shape == (6, c.vocab_size)
    for i, path in enumerate(paths):
        torch.testing.assert_close(got[i], forward_logits(c, w, prefix + path)[-1], rtol=0, atol=0)
    # nodes 1 and 2 carry the same token at the same depth: same logits
    torch.testing.assert_close(got[1], got[2], rtol=0, atol=0)


def test_tree_chain_equals_one_forward():
    m = make_models(("attention",), seed=9)
    c, w = m.config, m.target_weights
    prefix, chain = [5, 5], [1, 2, 3, 4]
    got = tree_node_logits(c, w, prefix, chain, [-1, 0, 1, 2])
    torch.testing.assert_close(got, forward_logits(c, w, prefix + chain)[2:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "node_tokens, parents, match",
    [([], [], "root"), ([1, 2], [-1], "length"), ([1, 2], [0, 0], r"parents\[0\]"),
     ([1, 2], [-1, 5], r"parents\[1\]"), ([1, 2, 3], [-1, 2, 1], "cycle"), ([1, 2], [-1, 1], r"parents\[1\]")],
)
def test_tree_rejects_bad_parents(node_tokens, parents, match):
    m = make_models()
    with pytest.raises(ValueError, match=match):
        tree_node_logits(m.config, m.target_weights, [1], node_tokens, parents)


# ---------------------------------------------------------------------------------------------
# logits dtypes and the greedy tie rule


def test_greedy_picks_first_max():
    assert greedy_token(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)) == 1
    assert greedy_token(np.array([-5.0, -5.0], dtype=np.float32)) == 0
    assert greedy_token(np.array([0.0, -1.0, 7.5], dtype=np.float32)) == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_creates_tie_and_first_index_wins(dtype):
    # 1 + 2**-12 rounds to 1 in both float16 and bfloat16; in float64 index 2 is larger
    row = torch.tensor([-3.0, 1.0, 1.0 + 2.0**-12, 0.5], dtype=torch.float64)
    conv = convert_logits(make_config(logits_dtype=dtype), row)
    assert conv.upcast.dtype == np.float32 and conv.dequant.dtype == np.float64
    assert conv.upcast[1] == conv.upcast[2] == 1.0
    assert greedy_token(conv.upcast) == 1
    assert conv.scale is None


def test_float32_conversion_is_rounding():
    row = torch.tensor([0.1, 1.0 / 3.0, -2.5], dtype=torch.float64)
    conv = convert_logits(make_config(logits_dtype="float32"), row)
    np.testing.assert_array_equal(conv.upcast, row.numpy().astype(np.float32))
    np.testing.assert_array_equal(conv.dequant, row.numpy().astype(np.float32).astype(np.float64))


def test_convert_rejects_unknown_dtype_and_mode():
    with pytest.raises(ValueError, match="logits_dtype"):
        convert_logits(make_config(logits_dtype="int8"), torch.zeros(3, dtype=torch.float64))
    for bad_scale in (0.0, -1.0, float("inf"), 1e-50):
        with pytest.raises(ValueError, match="logits_scale: must be finite and > 0"):
            convert_logits(make_config(logits_dtype="float8_e5m2", logits_scale=bad_scale), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits_scale_mode"):
        convert_logits(make_config(logits_dtype="float8_e4m3fn", logits_scale_mode="batch"), torch.zeros(3, dtype=torch.float64))


TORCH_FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
             "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2fnuz": torch.float8_e5m2fnuz}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "float8_e4m3fnuz": 240.0, "float8_e5m2fnuz": 57344.0}


@needs_fp8
@pytest.mark.parametrize("fmt", list(TORCH_FP8))
def test_fp8_static_scale_matches_torch_rounding(fmt):
    # in-range values: torch's float8 cast is round-to-nearest-even, an independent oracle
    scale = 0.37
    row = torch.tensor([0.0, 1.3, -2.71, 10.0, 0.05, -0.4, 3.3, 3.31], dtype=torch.float64)
    conv = convert_logits(make_config(logits_dtype=fmt, logits_scale=scale), row)
    y = row.to(torch.float32) / torch.tensor(scale, dtype=torch.float32)
    expected = y.to(TORCH_FP8[fmt]).to(torch.float32).numpy()
    np.testing.assert_array_equal(conv.upcast, expected)
    s32 = np.float64(np.float32(scale))
    np.testing.assert_array_equal(conv.dequant, expected.astype(np.float64) * s32)
    assert conv.scale == float(np.float32(scale))


@needs_fp8
@pytest.mark.parametrize("fmt", list(TORCH_FP8))
def test_fp8_saturates_and_ties_pick_first_index(fmt):
    big = 4 * FP8_MAX[fmt]
    row = torch.tensor([1.0, big, 2 * big, -big], dtype=torch.float64)
    conv = convert_logits(make_config(logits_dtype=fmt, logits_scale=1.0), row)
    np.testing.assert_array_equal(conv.upcast, np.array([1.0, FP8_MAX[fmt], FP8_MAX[fmt], -FP8_MAX[fmt]], np.float32))
    assert greedy_token(conv.upcast) == 1  # the saturated tie goes to the first index


@needs_fp8
@pytest.mark.parametrize("fmt", list(TORCH_FP8))
def test_fp8_per_row_scale(fmt):
    row = torch.tensor([3.0, -12.5, 7.0, 0.25], dtype=torch.float64)
    conv = convert_logits(make_config(logits_dtype=fmt, logits_scale_mode="per_row", logits_scale=99.0), row)
    expected_scale = np.float32(12.5) / np.float32(FP8_MAX[fmt])
    assert conv.scale == float(expected_scale)
    assert conv.upcast[1] == -FP8_MAX[fmt]  # the largest magnitude maps to the format's max
    assert abs(conv.dequant[1] + 12.5) <= 12.5 * 2.0**-22  # -max * scale, up to float32 rounding
    zero = convert_logits(make_config(logits_dtype=fmt, logits_scale_mode="per_row"), torch.zeros(4, dtype=torch.float64))
    assert zero.scale == 1.0
    np.testing.assert_array_equal(zero.upcast, np.zeros(4, np.float32))


@needs_fp8
def test_row_scale_of_zero_row_is_one_and_skips_non_finite():
    assert row_scale(np.zeros(5, np.float32), "float8_e4m3fn") == np.float32(1.0)
    row = np.array([np.inf, -2.0, np.nan, 1.0, -np.inf], np.float32)
    assert row_scale(row, "float8_e4m3fn") == np.float32(2.0) / np.float32(448.0)


@needs_fp8
def test_fp8_per_row_scale_depends_on_the_row_only():
    cfg = make_config(logits_dtype="float8_e4m3fn", logits_scale_mode="per_row")
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    b = torch.tensor([100.0, 2.0, 3.0], dtype=torch.float64)
    assert convert_logits(cfg, a).scale == float(np.float32(3.0) / np.float32(448.0))
    assert convert_logits(cfg, b).scale == float(np.float32(100.0) / np.float32(448.0))


# ---------------------------------------------------------------------------------------------
# sampling


def test_filtered_probs_is_softmax_of_z_over_t():
    z = [0.0, 1.0, -2.0, 0.5]
    p = filtered_probs(z, temperature=0.7)
    e = [math.exp(x / 0.7) for x in z]
    assert p == pytest.approx([x / sum(e) for x in e], rel=1e-14)


def test_top_k_keeps_k_best_ties_by_index():
    p = keep_top_k([0.1, 0.3, 0.3, 0.2, 0.1], 2)
    assert p == pytest.approx([0, 0.5, 0.5, 0, 0])
    p = keep_top_k([0.1, 0.3, 0.3, 0.2, 0.1], 4)
    assert [x > 0 for x in p] == [True, True, True, True, False]  # tie at 0.1: index 0 kept
    p = keep_top_k([0.25, 0.25, 0.25, 0.25], 3)
    assert p == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])


def test_top_p_keep_rule():
    # order: idx1 (0.4), idx3 (0.3), idx0 (0.2), idx2 (0.1); mass before: 0, 0.4, 0.7, 0.9
    p = [0.2, 0.4, 0.1, 0.3]
    assert [x > 0 for x in keep_top_p(p, 0.5)] == [False, True, False, True]  # 0.4 < 0.5, 0.7 not
    assert [x > 0 for x in keep_top_p(p, 0.4)] == [False, True, False, False]  # 0.4 < 0.4 is false
    assert [x > 0 for x in keep_top_p(p, 0.05)] == [False, True, False, False]  # first always stays
    assert [x > 0 for x in keep_top_p(p, 0.95)] == [True, True, True, True]
    assert keep_top_p(p, 0.5) == pytest.approx([0, 4 / 7, 0, 3 / 7])


def test_top_p_ties_by_index():
    p = [0.25, 0.25, 0.25, 0.25]
    assert [x > 0 for x in keep_top_p(p, 0.3)] == [True, True, False, False]


def test_min_p_keep_rule():
    p = [0.5, 0.25, 0.125, 0.125]
    assert keep_min_p(p, 0.25) == pytest.approx(p)  # threshold 0.125: p == threshold is kept
    assert keep_min_p(p, 0.3) == pytest.approx([2 / 3, 1 / 3, 0, 0])


def test_filters_apply_in_order():
    z = [math.log(x) for x in [0.1, 0.4, 0.2, 0.3]]
    # top_k=3 keeps {1, 3, 2} -> [0, 4/9, 2/9, 3/9]; top_p=0.6: mass before 2 is 7/9 -> dropped
    # -> [0, 4/7, 0, 3/7]; min_p=0.8: 3/7 < 0.8 * 4/7 -> only token 1 remains
    assert filtered_probs(z, 1.0, top_k=3, top_p=0.6) == pytest.approx([0, 4 / 7, 0, 3 / 7])
    assert filtered_probs(z, 1.0, top_k=3, top_p=0.6, min_p=0.8) == pytest.approx([0, 1, 0, 0])


def test_draw_inverse_cdf_in_vocabulary_order():
    p = [0.0, 0.25, 0.0, 0.5, 0.25]
    assert draw(p, 0.0) == 1  # u = 0: the first positive token
    assert draw(p, 0.2499) == 1
    assert draw(p, 0.25) == 3  # cumulative must exceed u
    assert draw(p, 0.75) == 4
    assert draw(p, 0.999999) == 4


def test_draw_fallback_last_positive():
    # the cumulative sum never exceeds u (rounding): the last index with p > 0
    assert draw([0.3, 0.3, 0.0], 0.7) == 1
    assert draw([0.2, 0.0, 0.3, 0.0, 0.0], 0.9999) == 2
    with pytest.raises(ValueError):
        draw([0.0, 0.0], 0.5)


def documented_uniform(seed, r, position, draw_index):
    """docs/semantics.md section 4's u(seed, r, position, draw), transcribed with 32-bit masks."""
    def mix(x):
        x &= 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x7A9D5587) & 0xFFFFFFFF
        x ^= x >> 14
        x = (x * 0x29BAE531) & 0xFFFFFFFF
        return x ^ (x >> 16)
    h0, h1 = (mix(mix(mix(mix(seed ^ salt) ^ r) ^ position) ^ draw_index) for salt in (0xA5C31F27, 0x3D8EB46C))
    return ((h0 >> 5) * 2**26 + (h1 >> 6)) / 2**53


def test_counter_uniform_is_the_documented_recipe():
    keys = [(0, 0, 0, 0), (7, 3, 4, 0), (123, 1, 1, 5), (2**32 - 1, 2**32 - 1, 2**31, 2**32 - 1)]
    for key in keys:
        got = counter_uniform(*key)
        assert type(got) is float and 0.0 <= got < 1.0
        assert got == documented_uniform(*key), key
    assert counter_uniform(0, 0, 0, 0) == 0.7302188104272684   # a vector of docs/semantics.md
    # a request's uniforms are its own: neighbouring requests, seeds and positions differ
    row = [counter_uniform(1, 0, p, 0) for p in range(4)]
    assert row != [counter_uniform(1, 1, p, 0) for p in range(4)]
    assert row != [counter_uniform(2, 0, p, 0) for p in range(4)]
    assert len(set(row)) == 4


# ---------------------------------------------------------------------------------------------
# generation


def greedy_by_hand(m, prompt, n):
    seq = list(prompt)
    out = []
    for _ in range(n):
        row = forward_logits(m.config, m.target_weights, seq)[-1].to(torch.float32)
        tok = int(torch.argmax(row))  # float64 logits here have no exact ties
        out.append(tok)
        seq.append(tok)
    return out


@pytest.fixture(scope="module")
def hybrid():
    return make_models(("attention", "recurrent"), seed=11)


def test_generate_greedy_matches_hand_loop(hybrid):
    out = reference.generate(hybrid, [[1, 2, 3], [12]], max_new_tokens=5)
    assert out.tokens == [greedy_by_hand(hybrid, [1, 2, 3], 5), greedy_by_hand(hybrid, [12], 5)]
    assert out.logprobs is None


def test_generate_per_request_max_new_tokens_and_independence(hybrid):
    out = reference.generate(hybrid, [[1, 2, 3], [12], [4, 4]], max_new_tokens=[2, 5, 1])
    assert [len(t) for t in out.tokens] == [2, 5, 1]
    alone = reference.generate(hybrid, [[12]], max_new_tokens=5)
    assert alone.tokens[0] == out.tokens[1]


def test_generate_stops_after_eos(hybrid):
    full = reference.generate(hybrid, [[5, 6]], max_new_tokens=6).tokens[0]
    eos = full[2]
    cut = full.index(eos) + 1
    out = reference.generate(hybrid, [[5, 6], [5, 6]], max_new_tokens=[6, 2], eos_token_id=eos)
    assert out.tokens[0] == full[:cut]  # EOS is part of the output, nothing after it
    assert out.tokens[1] == full[: min(2, cut)]


def test_generate_sampling_uses_counter_uniforms(hybrid):
    kwargs = dict(max_new_tokens=4, temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=3)
    out = reference.generate(hybrid, [[1, 2], [1, 2]], **kwargs)
    assert out.tokens == reference.generate(hybrid, [[1, 2], [1, 2]], **kwargs).tokens
    for r in range(2):
        seq = [1, 2]
        for t in range(4):
            z = forward_logits(hybrid.config, hybrid.target_weights, seq)[-1].to(torch.float32).double().tolist()
            u = counter_uniform(3, r, 2 - 1 + t, 0)    # token t follows position P - 1 + t
            tok = draw(filtered_probs(z, 0.8, 5, 0.9, 0.05), u)
            assert out.tokens[r][t] == tok
            seq.append(tok)


def test_generate_temperature_zero_ignores_sampling_params(hybrid):
    a = reference.generate(hybrid, [[3]], max_new_tokens=4)
    b = reference.generate(hybrid, [[3]], max_new_tokens=4, top_k=1, top_p=0.1, min_p=0.5, seed=9)
    assert a.tokens == b.tokens


def test_generate_spec_is_ignored(hybrid):
    a = reference.generate(hybrid, [[3, 1]], max_new_tokens=3)
    b = reference.generate(hybrid, [[3, 1]], max_new_tokens=3, spec=object())
    assert a == b


def test_generate_logprobs(hybrid):
    out = reference.generate(hybrid, [[7, 1], [2]], max_new_tokens=3, temperature=1.5, seed=4, logprobs=4)
    assert [len(x) for x in out.logprobs] == [len(t) for t in out.tokens]
    for r, prompt in enumerate([[7, 1], [2]]):
        seq = list(prompt)
        for t, rec in enumerate(out.logprobs[r]):
            z = forward_logits(hybrid.config, hybrid.target_weights, seq)[-1].to(torch.float32).double()
            lp = torch.log_softmax(z, -1)  # temperature-free
            assert rec.token == out.tokens[r][t]
            assert rec.logprob == pytest.approx(float(lp[rec.token]), abs=1e-12)
            assert rec.rank == 1 + int((lp > lp[rec.token]).sum())
            assert len(rec.top) == 4
            assert [i for i, _ in rec.top] == torch.argsort(-lp, stable=True)[:4].tolist()
            assert all(a[1] >= b[1] for a, b in zip(rec.top, rec.top[1:]))
            seq.append(rec.token)


def test_logprob_record_ties_and_rank():
    rec = reference.logprob_record([1.0, 2.0, 2.0, 0.0], token=2, n=3)
    assert rec.rank == 1  # nothing strictly greater
    assert [i for i, _ in rec.top] == [1, 2, 0]  # logprob descending, index ascending
    rec = reference.logprob_record([1.0, 2.0, 2.0, 0.0], token=3, n=1)
    assert rec.rank == 4
    lse = math.log(math.exp(1) + 2 * math.exp(2) + 1)
    assert rec.logprob == pytest.approx(0.0 - lse)


def test_generate_greedy_tie_under_float16():
    # lm_head keeps two columns, 3 and 8, with column 8 = column 3 * (1 + 1e-7): in float64
    # token 8 is the larger, after rounding to float16 they tie and greedy must pick 3
    m = make_models(("attention",), seed=12, logits_dtype="float16")
    w = dict(m.target_weights)
    col = w["lm_head"][:, 3].clone()
    sign = 1.0 if float(forward_logits(m.config, w, [1, 2])[-1][3]) > 0 else -1.0
    w["lm_head"] = torch.zeros_like(w["lm_head"])
    w["lm_head"][:, 3] = sign * col
    w["lm_head"][:, 8] = sign * col * (1 + 1e-7)
    row = forward_logits(m.config, w, [1, 2])[-1]
    assert row[8] > row[3] > 0
    assert row.to(torch.float16)[8] == row.to(torch.float16)[3]
    m = SimpleNamespace(config=m.config, target_weights=w)
    assert reference.generate(m, [[1, 2]], max_new_tokens=1).tokens == [[3]]
    m32 = SimpleNamespace(config=make_config(("attention",)), target_weights=w)
    assert reference.generate(m32, [[1, 2]], max_new_tokens=1).tokens == [[8]]


def test_generate_empty_batch(hybrid):
    assert reference.generate(hybrid, [], max_new_tokens=3).tokens == []


@pytest.mark.parametrize(
    "prompts, kwargs, match",
    [
        ([[]], {}, r"prompts\[0\]: empty"),
        ([[1], [13]], {}, r"prompts\[1\].*outside \[0, 13\)"),
        ([[-1]], {}, r"outside \[0, 13\)"),
        ("abc", {}, "prompts"),
        ([[1]], {"max_new_tokens": 0}, "max_new_tokens.*>= 1"),
        ([[1], [2]], {"max_new_tokens": [1]}, "max_new_tokens: list length 1 != number of prompts 2"),
        ([[1], [2]], {"max_new_tokens": [1, 0]}, "max_new_tokens: request 1"),
        ([[1]], {"max_new_tokens": 1.5}, "max_new_tokens"),
        ([[1] * 30], {"max_new_tokens": 3}, "max_context 32"),
        ([[1]], {"temperature": -0.1}, "temperature: must be >= 0"),
        ([[1]], {"temperature": float("nan")}, "temperature"),
        ([[1]], {"top_p": 0.0}, r"top_p: must be in \(0, 1\]"),
        ([[1]], {"top_p": 1.01}, "top_p"),
        ([[1]], {"min_p": 1.0}, r"min_p: must be in \[0, 1\)"),
        ([[1]], {"min_p": -0.01}, "min_p"),
        ([[1]], {"top_k": -1}, "top_k: must be an int >= 0"),
        ([[1]], {"eos_token_id": 13}, "eos_token_id"),
        ([[1]], {"logprobs": -1}, "logprobs"),
        ([[1]], {"logprobs": 14}, "logprobs"),
        ([[1]], {"seed": 1.5}, "seed"),
    ],
)
def test_generate_validation_errors(hybrid, prompts, kwargs, match):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        reference.generate(hybrid, prompts, **kwargs)


def test_generate_accepts_context_exactly_full(hybrid):
    out = reference.generate(hybrid, [[1] * 29], max_new_tokens=3)
    assert len(out.tokens[0]) == 3


def test_recurrent_states_hold_the_conv_window_zero_padded_before_the_first_token():
    m = make_models(("recurrent", "attention", "recurrent"), seed=6)
    c, w = m.config, m.target_weights
    one = recurrent_states(c, w, [5])
    three = recurrent_states(c, w, [5, 2, 11])
    assert len(one) == len(three) == 2       # one (state, window) pair per recurrent layer, in layer order
    for i, ((_, short), (_, long)) in zip((0, 2), zip(one, three)):
        assert short.shape == long.shape == (c.rec_conv_width - 1, c.num_rec_heads * (2 * c.rec_key_dim + c.rec_value_dim))
        assert not short[0].any() and short[1].abs().sum() > 0, f"layer {i}: one token leaves one zero row first"
    # The first layer's window after 3 tokens is its last two q|k|v inputs, oldest first.
    n = norm(w["embed"][[5, 2, 11]], w["layers.0.attn_norm"], c.norm_eps)
    u = torch.cat([n @ w["layers.0.wq"], n @ w["layers.0.wk"], n @ w["layers.0.wv"]], 1)
    torch.testing.assert_close(three[0][1], u[1:], rtol=1e-12, atol=1e-12)
