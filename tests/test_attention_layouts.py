"""The paged-attention kernel on the input layouts the decoder hands it: per-request vectors that
are strided columns of a packed tensor, and tree masks that are expanded (stride-0) views.

The registry records draw contiguous inputs; the engine's prefill and draft steps do not. Triton
(interpreted on the CPU) is held against the reference attention by loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import reference
from specverify.kernels.attention import paged_attention_impl
from specverify.models import chain_mask

pytestmark = pytest.mark.kernels

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    bs, q, nh, nkv, hd, page, ctx = 4, 3, 4, 2, 16, 2, 24
    num_slots = 1 + bs * ctx
    k_cache = torch.randn((num_slots, nkv, hd), generator=g)
    v_cache = torch.randn((num_slots, nkv, hd), generator=g)
    table = torch.zeros((bs + 1, ctx), dtype=torch.int64)
    perm = torch.randperm(bs * ctx // page, generator=g)
    for b in range(bs):
        pages = perm[b * (ctx // page):(b + 1) * (ctx // page)]
        table[b + 1] = (1 + pages[:, None] * page + torch.arange(page)).flatten()[:ctx].clamp(max=num_slots - 1)
    # Columns of one packed [bs, 3] tensor: each vector has stride 3.
    packed = torch.tensor([[b + 1, kv, ql] for b, (kv, ql) in enumerate([(5, 3), (0, 1), (9, 2), (2, 0)])])
    rows, kv_lens, q_lens = packed.unbind(1)
    mask, _ = chain_mask(bs, q, "cpu")                                  # expanded: batch stride 0
    qh = torch.randn((bs, q, nh, hd), generator=g)
    return qh, k_cache, v_cache, table, rows, kv_lens, q_lens, mask


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_strided_vectors_and_expanded_masks_match_the_reference(impl):
    qh, k_cache, v_cache, table, rows, kv_lens, q_lens, mask = _inputs(7)
    assert rows.stride(0) == 3 and mask.stride(0) == 0              # the layouts under test
    scale = 1.0 / math.sqrt(qh.shape[-1])
    got = paged_attention_impl(*(t.to(DEV) for t in (qh, k_cache, v_cache, table, rows, kv_lens, q_lens, mask)),
                               0, scale, impl=impl).cpu()
    want = reference.paged_attention(q=qh.double().numpy(), k_cache=k_cache.double().numpy(),
                                     v_cache=v_cache.double().numpy(), req_to_token=table.numpy(),
                                     rows=rows.numpy(), kv_lens=kv_lens.numpy(), q_lens=q_lens.numpy(),
                                     tree_mask=mask.numpy(), region=0, scale=scale)
    np.testing.assert_allclose(got.double().numpy(), want, atol=2e-5, rtol=2e-5)
    # Lanes past q_lens and the request with no query produce zeros.
    assert torch.count_nonzero(got[3]) == 0 and torch.count_nonzero(got[1, 1:]) == 0


# -- pinned for the survivors of the first generated-mutant campaign (docs/mutation/seed-0.md) --

def _op_inputs():
    qh, k_cache, v_cache, table, rows, kv_lens, q_lens, mask = _inputs(7)
    return dict(q=qh, k_cache=k_cache, v_cache=v_cache, req_to_token=table, rows=rows.contiguous(),
                kv_lens=kv_lens.contiguous(), q_lens=q_lens.contiguous(), tree_mask=mask.contiguous())


@pytest.mark.parametrize("scale", [0.25, 1.0, 3.0])
def test_an_explicit_scale_is_used_as_given(scale):
    from specverify import ops

    a = _op_inputs()
    got = ops.paged_attention(**a, scale=scale, impl="torch")
    want = reference.paged_attention(**{k: (v.double() if v.is_floating_point() else v).numpy() for k, v in a.items()},
                                     region=0, scale=scale)
    np.testing.assert_allclose(got.double().numpy(), want, atol=2e-5, rtol=2e-5)


def test_a_live_slot_past_the_pool_is_refused():
    from specverify import ops

    a = _op_inputs()
    num_slots = a["k_cache"].shape[0]
    a["req_to_token"] = a["req_to_token"].clone()
    a["req_to_token"][1, 0] = num_slots            # row 1's first cache index is live (kv_len 5)
    with pytest.raises(ValueError, match=rf"req_to_token entries of live cache indices must be slots in \[0, {num_slots}\)"):
        ops.paged_attention(**a, impl="torch")
    for edge in (num_slots - 1, 0):                # the last slot and slot 0 are slots
        a["req_to_token"][1, 0] = edge
        ops.paged_attention(**a, impl="torch")
