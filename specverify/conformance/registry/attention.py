"""Paged attention, the draft KV index list and decode attention over it (docs/semantics.md 6.6).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations


import torch

import reference
from specverify import dtypes, ops
from specverify.kernels.draft_kv_indices import draft_kv_indices_impl
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import CLOSE, EXACT, ErrorInput, OpSpec, SampleInput, only
from specverify.conformance.registry.state_commit import _mss_bits, _mss_values


# ---------------------------------------------------------------------------------------------
# paged attention over the KV slot pool (torch path and the Triton kernel, interpreted on the CPU)

# The KV block sizes the attention kernels use, or may be tuned to: the boundary samples straddle
# every one (lengths b - 1, b, b + 1). The lengths are data of this file, never read from a kernel:
# a retune must not silently change the golden inputs. tests/meta/test_registry.py fails, naming
# this list, when a kernel's BLOCK_N leaves it.
KV_BLOCK_SIZES = (16, 32, 64, 128)
# (name suffix, live lengths) of the paged-attention boundary samples: b - 1, b, b + 1 of every
# KV_BLOCK_SIZES entry (and a live length of 1), grouped so that a sample's float32 arrays stay under
# the golden size cap (tests/support/golden_catalogue.py MAX_SAMPLE_BYTES; tests/meta/test_registry.py
# checks both).
ATTN_BOUNDARY_LIVE = (("16", (1, 15, 16, 17)), ("32", (31, 32, 33)), ("64", (63, 64, 65)),
                      ("128-below", (127,)), ("128-at", (128,)), ("128-above", (129,)))


def _attn_sample(name, seed, dtype, kv_lens, q_lens, *, region=0, page_size=1, heads=(2, 1), lanes=None,
                 garbage=False, keys=None) -> SampleInput:
    """A real paged layout: each request owns whole pages (shuffled over the pool, page 0 = the
    sink) covering its live indices and one more, reserved-but-unwritten index; the rest of its
    table row maps the sink, as `SlotTable` leaves unowned indices.
    garbage: every slot no live index uses (sink, spare pages, the tail of a request's last page)
    holds NaN; table entries past the live length point at NaN slots (the spare page, the sink) or
    at another request's live slot; padded query lanes are NaN."""
    gen = torch.Generator().manual_seed(seed)
    n, (nh, nkv), hd = len(kv_lens), heads, 16
    lanes = max([1, *q_lens]) if lanes is None else lanes
    live = [k + region + q for k, q in zip(kv_lens, q_lens)]
    max_context = max([1, *live]) + 2
    owned = [-(-(length + 1) // page_size) for length in live]
    num_pages = 1 + sum(owned) + 1
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    first = [sum(owned[:b]) for b in range(n)]
    table = torch.zeros((n + 1, max_context), dtype=torch.int64)
    rows = torch.randperm(n + 1, generator=gen)[:n]
    used = torch.zeros(num_pages * page_size, dtype=torch.bool)
    for b in range(n):
        pages = torch.tensor(order[first[b]:first[b] + owned[b]], dtype=torch.int64)
        slots = torch.zeros(max_context, dtype=torch.int64)
        mine = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:max_context]
        slots[:mine.numel()] = mine
        if garbage:   # past the live length: the spare page, the sink, another request's slot
            spare = [order[-1], 0, order[0]]
            for t in range(live[b], max_context):
                slots[t] = spare[t % 3] * page_size + t % page_size
        table[int(rows[b])] = slots
        used[slots[:live[b]]] = True
    shape = (num_pages * page_size, nkv, hd)
    k = S.normalish(gen, shape) if keys is None else keys(gen, shape)
    v = S.normalish(gen, shape)
    q = S.normalish(gen, (n, lanes, nh, hd))
    mask = S.coins(gen, (n, lanes, region + lanes), 0.5)
    mask[:, torch.arange(lanes), region + torch.arange(lanes)] = True      # every token sees itself
    if garbage:
        k[~used], v[~used] = float("nan"), float("nan")
        q[torch.arange(lanes)[None, :] >= torch.tensor(q_lens, dtype=torch.int64)[:, None]] = float("nan")
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    return SampleInput(name, {"q": S.cast(q, torch_dtype), "k_cache": S.cast(k, torch_dtype),
                              "v_cache": S.cast(v, torch_dtype),
                              "req_to_token": table, "rows": rows, "kv_lens": torch.tensor(kv_lens, dtype=torch.int64),
                              "q_lens": torch.tensor(q_lens, dtype=torch.int64), "tree_mask": mask, "region": region},
                       seed)


def _ulp_keys(gen, shape):
    """Keys that are one float32 ulp apart along the slots (slot s: base * (1 + s * 2**-23), exact
    in float64, rounded once by the cast): scores tie up to an ulp or two."""
    base = S.normalish(gen, shape[1:])
    steps = torch.arange(shape[0], dtype=torch.float64)[:, None, None] * 2.0**-23
    return base[None] * (1 + steps)


def _attn_impl(which: str, tensor_cores: bool = False):
    def impl(s: SampleInput, profile) -> dict:
        return {"out": ops.paged_attention(**s.args, impl=which, tensor_cores=tensor_cores)}
    return impl


def _attn_ref(s: SampleInput) -> dict:
    args = {k: (v.double().numpy() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point
                else v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in s.args.items()}
    return {"out": torch.from_numpy(reference.paged_attention(**args))}


def _attn_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _attn_sample("empty-batch", seed, dtype, [], [])
        yield _attn_sample("decode", seed, dtype, [1, 12], [1, 1])
        yield _attn_sample("prefill-from-empty", seed + 1, dtype, [0, 0], [5, 3])
        yield _attn_sample("kv0-region-only", seed + 2, dtype, [0, 4], [2, 1], region=3)
        yield _attn_sample("page1-one-slot-pages", seed + 3, dtype, [5, 9], [3, 2], region=1, page_size=1)
        yield _attn_sample("page3-partial-last-page", seed + 4, dtype, [4, 2], [3, 2], region=2, page_size=3)
        yield _attn_sample("nan-garbage-past-live", seed + 5, dtype, [6, 3], [2, 3], region=2, page_size=3,
                           lanes=4, garbage=True)
        yield _attn_sample("ulp-adjacent-scores", seed + 6, dtype, [9, 5], [2, 2], keys=_ulp_keys)
        # live lengths around every KV block size (ATTN_BOUNDARY_LIVE); NaN slots right past each live end
        for j, (suffix, live) in enumerate(ATTN_BOUNDARY_LIVE):
            q_lens = [1 + i % 2 if n > 1 else 1 for i, n in enumerate(live)]
            yield _attn_sample(f"boundary-live-len-at-kv-block{suffix}", seed + 30 + j, dtype,
                               [n - q for n, q in zip(live, q_lens)], q_lens, page_size=2, heads=(1, 1), garbage=True)
        yield _attn_sample("gqa-8-to-2", seed + 9, dtype, [6], [2], region=1, heads=(8, 2))
        gen = torch.Generator().manual_seed(seed)
        for i in range(1):
            n = int(torch.randint(1, 4, (1,), generator=gen))
            kv = torch.randint(0, 13, (n,), generator=gen).tolist()
            ql = torch.randint(0, 4, (n,), generator=gen).tolist()
            yield _attn_sample(f"random-{i}", seed + 20 + i, dtype, kv, ql, region=int(torch.randint(0, 3, (1,),
                               generator=gen)), page_size=int(torch.randint(1, 5, (1,), generator=gen)),
                               heads=(2, 1) if small else (2, 2), lanes=3, garbage=True)
    return samples


def _attn_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.tuples(st.integers(0, 34), st.integers(0, 3)), min_size=1, max_size=3)
    return st.tuples(st.integers(0, 2**16), lens, st.integers(0, 2), st.integers(1, 4), st.booleans()).map(
        lambda t: _attn_sample(f"hyp-page{t[3]}", t[0], dtype, [a for a, _ in t[1]], [c for _, c in t[1]],
                               region=t[2], page_size=t[3], lanes=3, garbage=t[4]))


def _attn_errors(which: str, tensor_cores: bool = False):
    def call(**changes):
        s = _attn_sample("base", 0, "float32", [3, 2], [2, 1], region=1, heads=(4, 2))
        return lambda: ops.paged_attention(**{"tensor_cores": tensor_cores, **s.args, **changes}, impl=which)
    base = _attn_sample("base", 0, "float32", [3, 2], [2, 1], region=1, heads=(4, 2)).args

    def errors():
        yield ErrorInput("q-3d", call(q=base["q"][0]), ValueError, r"q must be 4-D", "q")
        yield ErrorInput("q-int", call(q=base["q"].to(torch.int32)), ValueError, "q dtype", "q")
        yield ErrorInput("head-dim-12", call(q=base["q"][..., :12]), ValueError, "head_dim must be a power of two", "q")
        yield ErrorInput("k-dtype", call(k_cache=base["k_cache"].half()), ValueError, "k_cache must have q's dtype",
                         "k_cache")
        yield ErrorInput("v-shape", call(v_cache=base["v_cache"][:5]), ValueError, "v_cache must have", "v_cache")
        yield ErrorInput("gqa-3-heads", call(q=base["q"][:, :, :3]), ValueError, "multiple of", "num_heads")
        yield ErrorInput("kv-lens-int32", call(kv_lens=base["kv_lens"].int()), ValueError, r"kv_lens must be \[2\] int64",
                         "kv_lens")
        yield ErrorInput("kv-lens-negative", call(kv_lens=torch.tensor([-1, 2])), ValueError, "kv_lens must be >= 0",
                         "kv_lens")
        yield ErrorInput("q-lens-over-lanes", call(q_lens=torch.tensor([3, 1])), ValueError, r"q_lens must be in \[0, 2\]",
                         "q_lens")
        yield ErrorInput("live-past-max-context", call(kv_lens=torch.tensor([100, 2])), ValueError,
                         "must be <= ", "kv_lens")
        yield ErrorInput("row-out-of-table", call(rows=torch.tensor([0, 9])), ValueError, "rows must be in", "rows")
        yield ErrorInput("slot-out-of-pool", call(req_to_token=base["req_to_token"] + 10_000), ValueError,
                         "must be slots in", "req_to_token")
        yield ErrorInput("mask-shape", call(tree_mask=base["tree_mask"][:, :, :2]), ValueError,
                         r"tree_mask must be \[2, 2, 3\] bool", "tree_mask")
        yield ErrorInput("region-negative", call(region=-1), ValueError, "region must be >= 0", "region")
        yield ErrorInput("region-float", call(region=1.0), TypeError, "region must be an int", "region")
        yield ErrorInput("scale-zero", call(scale=0.0), ValueError, "scale must be finite and > 0", "scale")
        yield ErrorInput("q-list", call(q=[1.0]), TypeError, "q must be a torch.Tensor", "q")
        yield ErrorInput("bad-impl", lambda: ops.paged_attention(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
        yield ErrorInput("tensor-cores-int", call(tensor_cores=1), TypeError, "tensor_cores must be a bool",
                         "tensor_cores")
    return errors


# ---------------------------------------------------------------------------------------------
# naive EAGLE (docs/semantics.md 6.6): the flat KV index list of the fused verify (torch path and
# the Triton kernel on a padded grid, interpreted on the CPU), and decode attention over it

NKV_SENTINEL = -7          # what the output buffers hold before the op: entries it must not touch
NKV_PAD_PROGRAMS = 3       # the Triton record's grid: bs + 3 programs, the last 3 past the batch


def _nkv_sample(name, seed, lens, page_size, *, spare=0, index_dtypes=(torch.int64,) * 5, sink_lanes=(),
                extra_context=0) -> SampleInput:
    """A slot table as `SlotTable` lays it out: request b owns whole pages (shuffled over the pool,
    page 0 = the sink) covering its L + 2 verify indices, the rest of its row maps the sink; the
    rows are a permutation of the table's rows, one row unused. A lane of `sink_lanes` is an
    engine's padded lane: its row maps only the sink. The output buffers hold NKV_SENTINEL, and
    kv_indices has room for `spare` entries past the total (0: the capacity fits exactly).
    index_dtypes: of (req_to_token, rows, seq_lens, kv_indptr, kv_indices)."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(lens)
    max_context = max([0, *lens]) + 2 + extra_context
    owned = [0 if b in sink_lanes else -(-(length + 2) // page_size) for b, length in enumerate(lens)]
    order = (torch.randperm(sum(owned), generator=gen) + 1).tolist()
    rows = torch.randperm(bs + 1, generator=gen)[:bs]
    table = torch.zeros((bs + 1, max_context), dtype=torch.int64)
    first = 0
    for b in range(bs):
        pages = torch.tensor(order[first:first + owned[b]], dtype=torch.int64)
        first += owned[b]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:max_context]
        table[int(rows[b]), :slots.numel()] = slots
    total = 2 * sum(lens) + 3 * bs
    t_dt, r_dt, l_dt, p_dt, i_dt = index_dtypes
    return SampleInput(name, {"req_to_token": table.to(t_dt), "rows": rows.to(r_dt),
                              "seq_lens": torch.tensor(lens, dtype=l_dt),
                              "kv_indptr": torch.full((2 * bs + 1,), NKV_SENTINEL, dtype=p_dt),
                              "kv_indices": torch.full((total + spare,), NKV_SENTINEL, dtype=i_dt)}, seed)


def _nkv_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        a = s.args
        kv_indptr, kv_indices = a["kv_indptr"].clone(), a["kv_indices"].clone()   # the op writes in place
        if which == "triton":
            # The kernel wrapper on a padded grid: programs past the batch must write nothing.
            draft_kv_indices_impl(a["req_to_token"], a["rows"], a["seq_lens"], kv_indptr, kv_indices, "triton",
                                  num_programs=a["seq_lens"].shape[0] + NKV_PAD_PROGRAMS)
        else:
            got = ops.create_draft_kv_indices(**{**a, "kv_indptr": kv_indptr, "kv_indices": kv_indices}, impl=which)
            if got[0] is not kv_indptr or got[1] is not kv_indices:
                raise AssertionError("create_draft_kv_indices must return the buffers it was given")
        return {"kv_indptr": kv_indptr, "kv_indices": kv_indices}
    return impl


def _nkv_ref(s: SampleInput) -> dict:
    a = s.args
    indptr, indices = reference.create_draft_kv_indices(req_to_token=a["req_to_token"].tolist(),
                                                        rows=a["rows"].tolist(), seq_lens=a["seq_lens"].tolist())
    buffer = a["kv_indices"].tolist()            # entries past the list keep what the buffer held
    buffer[:len(indices)] = indices
    return {"kv_indptr": torch.tensor(indptr, dtype=a["kv_indptr"].dtype),
            "kv_indices": torch.tensor(buffer, dtype=a["kv_indices"].dtype)}


def _nkv_samples(small: bool):
    i32, i64 = torch.int32, torch.int64

    def samples(dtype: str, seed: int):
        yield _nkv_sample("empty-batch", seed, [], 1, spare=3)
        yield _nkv_sample("boundary-bs1-L0", seed + 1, [0], 1)
        yield _nkv_sample("ragged-page1", seed + 2, [5, 0, 12, 3, 0, 7], 1, spare=5)
        yield _nkv_sample("ragged-page4", seed + 3, [9, 0, 1, 6, 14], 4, spare=2)
        yield _nkv_sample("ragged-page16", seed + 4, [17, 0, 30, 2], 16, spare=4, extra_context=5)
        yield _nkv_sample("boundary-capacity-exact-page4", seed + 5, [4, 0, 11], 4)
        # 2s - 1 entries per request = 63, 65, 127, 129: around the kernel's copy block of 64
        yield _nkv_sample("boundary-list-at-copy-block", seed + 6, [30, 31, 62, 63], 16, spare=1)
        yield _nkv_sample("padded-lane-sink-row", seed + 7, [4, 9, 0], 4, spare=2, sink_lanes=(2,))
        yield _nkv_sample("int32-buffers-page4", seed + 8, [3, 0, 8], 4, spare=3, index_dtypes=(i32,) * 5)
        yield _nkv_sample("mixed-int-dtypes-page1", seed + 9, [2, 5], 1, spare=1,
                          index_dtypes=(i32, i64, i32, i64, i32))
        gen = torch.Generator().manual_seed(seed)
        bs = 13 if small else 64                                 # the interpreter runs a program in ~7 ms
        yield _nkv_sample(f"large-bs{bs}-page4", seed + 10, torch.randint(0, 17, (bs,), generator=gen).tolist(), 4,
                          spare=0 if small else 7)
        for i in range(1 if small else 3):
            bs = int(torch.randint(1, 9, (1,), generator=gen))
            lens = torch.randint(0, 40, (bs,), generator=gen).tolist()
            page = (1, 4, 16)[int(torch.randint(0, 3, (1,), generator=gen))]
            yield _nkv_sample(f"random-{i}-page{page}", seed + 20 + i, lens, page,
                              spare=int(torch.randint(0, 4, (1,), generator=gen)))
    return samples


def _nkv_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.integers(0, 40), min_size=0, max_size=6)
    return st.tuples(st.integers(0, 2**16), lens, st.sampled_from((1, 4, 16)), st.integers(0, 4), st.booleans()).map(
        lambda t: _nkv_sample(f"hyp-page{t[2]}", t[0], t[1], t[2], spare=t[3],
                              index_dtypes=((torch.int32 if t[4] else torch.int64),) * 5))


def _nkv_errors(which: str):
    base = _nkv_sample("base", 0, [3, 1], 4).args          # capacity exactly 2*4 + 3*2 = 14

    def call(**changes):
        return lambda: ops.create_draft_kv_indices(**{**base, **changes}, impl=which)

    def errors():
        table, rows, lens = base["req_to_token"], base["rows"], base["seq_lens"]
        yield ErrorInput("req-to-token-1d", call(req_to_token=table[0]), ValueError, "req_to_token must be 2-D",
                         "req_to_token")
        yield ErrorInput("req-to-token-float", call(req_to_token=table.float()), ValueError,
                         "req_to_token must be int32 or int64", "req_to_token")
        yield ErrorInput("rows-list", call(rows=[0, 1]), TypeError, "rows must be a torch.Tensor", "rows")
        yield ErrorInput("rows-length", call(rows=rows[:1]), ValueError, "rows must have one entry per request", "rows")
        yield ErrorInput("seq-lens-int16", call(seq_lens=lens.to(torch.int16)), ValueError,
                         "seq_lens must be int32 or int64", "seq_lens")
        yield ErrorInput("seq-lens-2d", call(seq_lens=lens[None]), ValueError, "seq_lens must be 1-D", "seq_lens")
        yield ErrorInput("indptr-length", call(kv_indptr=base["kv_indptr"][:4]), ValueError,
                         r"kv_indptr must have 2\*bs \+ 1 = 5 entries", "kv_indptr")
        yield ErrorInput("indptr-float", call(kv_indptr=base["kv_indptr"].double()), ValueError,
                         "kv_indptr must be int32 or int64", "kv_indptr")
        yield ErrorInput("indices-2d", call(kv_indices=base["kv_indices"][None]), ValueError,
                         "kv_indices must be 1-D", "kv_indices")
        yield ErrorInput("capacity-one-short", call(kv_indices=base["kv_indices"][:13]), ValueError,
                         r"kv_indices holds 13 entries, the batch needs 14 \(2\*sum\(seq_lens\) \+ 3\*bs\)", "kv_indices")
        yield ErrorInput("seq-lens-negative", call(seq_lens=torch.tensor([3, -1])), ValueError, "seq_lens must be >= 0",
                         "seq_lens")
        yield ErrorInput("seq-len-past-max-context", call(seq_lens=torch.tensor([3, 4])), ValueError,
                         r"seq_lens \+ 2 must be <= 5 \(req_to_token's max_context\)", "seq_lens")
        yield ErrorInput("row-out-of-table", call(rows=torch.tensor([0, 3])), ValueError, r"rows must be in \[0, 3\)",
                         "rows")
        yield ErrorInput("checked-string", call(checked="yes"), TypeError, "checked must be True, False or None",
                         "checked")
        yield ErrorInput("bad-impl", lambda: ops.create_draft_kv_indices(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors


def _ia_sample(name, seed, dtype, lens, *, heads=(2, 1), num_slots=24, start=0, spare=2, garbage=False,
               keys=None, index_dtype=torch.int64, lists=None) -> SampleInput:
    """N = len(lens) decode queries; query i's list has lens[i] entries, slots drawn (with repeats)
    from the pool's slots 1..num_slots-1, or `lists` (kv_indptr, kv_indices) given outright. The
    lists start at kv_indptr[0] = start; kv_indices has `start` entries before them and `spare`
    after them. garbage: slots no list names (the sink among them) hold NaN K/V, and the index
    entries outside the lists name those slots."""
    gen = torch.Generator().manual_seed(seed)
    (nh, nkv), hd = heads, 16
    if lists is None:
        indptr = [start]
        for length in lens:
            indptr.append(indptr[-1] + length)
        listed = torch.randint(1, num_slots, (indptr[-1] - start,), generator=gen)
    else:
        indptr, listed = lists[0], torch.tensor(lists[1], dtype=torch.int64)
        lens = [b - a for a, b in zip(indptr, indptr[1:])]
    n = len(lens)
    used = torch.zeros(num_slots, dtype=torch.bool)
    used[listed] = True
    unused = (~used).nonzero().flatten()
    outside = torch.randint(0, num_slots, (start + spare,), generator=gen)
    if garbage:
        outside = unused[torch.randint(0, unused.numel(), (start + spare,), generator=gen)]
    kv_indices = torch.cat([outside[:start], listed, outside[start:]])
    shape = (num_slots, nkv, hd)
    k = S.normalish(gen, shape) if keys is None else keys(gen, shape)
    v = S.normalish(gen, shape)
    q = S.normalish(gen, (n, nh, hd))
    if garbage:
        k[~used], v[~used] = float("nan"), float("nan")
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    return SampleInput(name, {"q": S.cast(q, torch_dtype), "k_cache": S.cast(k, torch_dtype),
                              "v_cache": S.cast(v, torch_dtype),
                              "kv_indptr": torch.tensor(indptr, dtype=index_dtype), "kv_indices": kv_indices.to(index_dtype),
                              "scale": hd ** -0.5}, seed)


def _naive_lists(lens, page_size, seed):
    """(kv_indptr, kv_indices) of naive EAGLE's verify over a paged table (the reference's lists)."""
    a = _nkv_sample("lists", seed, lens, page_size).args
    return reference.create_draft_kv_indices(req_to_token=a["req_to_token"].tolist(), rows=a["rows"].tolist(),
                                             seq_lens=lens)


def _ia_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        # float16 / bfloat16 queries: the float32 result before the cast to q's dtype, so the record's
        # one tolerance covers every dtype (tests/test_draft_kv_indices.py checks the cast itself).
        low = s.args["q"].dtype in (torch.float16, torch.bfloat16)
        return {"out": ops.decode_attention_indexed(**s.args, impl=which, out_dtype=torch.float32 if low else None)}
    return impl


def _ia_ref(s: SampleInput) -> dict:
    a = s.args
    return {"out": torch.from_numpy(reference.decode_attention_indexed(
        a["q"].double().numpy(), a["k_cache"].double().numpy(), a["v_cache"].double().numpy(),
        a["kv_indptr"].numpy(), a["kv_indices"].numpy(), scale=a["scale"]))}


def _ia_samples(small: bool):
    def samples(dtype: str, seed: int):
        yield _ia_sample("empty-batch", seed, dtype, [])
        if not small:
            yield _ia_sample("decode", seed + 1, dtype, [1, 12, 7])
        yield _ia_sample("empty-kv-lists-give-zeros", seed + 2, dtype, [0, 5, 0, 3], start=2)
        yield _ia_sample("nan-garbage-outside-lists", seed + 3, dtype, [6, 3, 9], start=4, spare=3, garbage=True)
        yield _ia_sample("ulp-adjacent-scores", seed + 4, dtype, [9, 5], keys=_ulp_keys)
        for b in KV_BLOCK_SIZES:          # list lengths around every KV block size
            yield _ia_sample(f"boundary-list-len-at-kv-block{b}", seed + 40 + b, dtype, [b - 1, b, b + 1, 1],
                             heads=(1, 1), num_slots=40, garbage=True)
        yield _ia_sample("gqa-8-to-2", seed + 6, dtype, [6, 2], heads=(8, 2), num_slots=16)
        yield _ia_sample("mha-3-heads", seed + 7, dtype, [4, 7], heads=(3, 3), num_slots=12)
        if not small:
            yield _ia_sample("indptr-start-past-zero", seed + 8, dtype, [3, 0, 4], start=5)
        yield _ia_sample("int32-index-buffers", seed + 9, dtype, [5, 2, 8], index_dtype=torch.int32, garbage=True)
        for page in (4,) if small else (1, 4):
            yield _ia_sample(f"naive-eagle-lists-page{page}", seed + 10 + page, dtype, [], num_slots=48,
                             lists=_naive_lists([5, 0, 9], page, seed + page), garbage=True)
        gen = torch.Generator().manual_seed(seed)
        for i in range(1 if small else 2):
            n = int(torch.randint(1, 5, (1,), generator=gen))
            lens = torch.randint(0, 20, (n,), generator=gen).tolist()
            yield _ia_sample(f"random-{i}", seed + 20 + i, dtype, lens, heads=((2, 1), (4, 2))[i % 2],
                             start=int(torch.randint(0, 3, (1,), generator=gen)), garbage=bool(i % 2 == 0))
    return samples


def _ia_recipe(dtype: str):
    from hypothesis import strategies as st
    lens = st.lists(st.integers(0, 20), min_size=0, max_size=4)
    return st.tuples(st.integers(0, 2**16), lens, st.sampled_from(((2, 1), (4, 2), (1, 1))), st.integers(0, 3),
                     st.booleans()).map(
        lambda t: _ia_sample(f"hyp-heads{t[2][0]}-{t[2][1]}", t[0], dtype, t[1], heads=t[2], start=t[3],
                             garbage=t[4]))


def _ia_errors(which: str):
    base = _ia_sample("base", 0, "float32", [3, 0, 2], heads=(4, 2)).args      # 5 listed entries, 2 spare

    def call(**changes):
        return lambda: ops.decode_attention_indexed(**{**base, **changes}, impl=which)

    def errors():
        q, k, v = base["q"], base["k_cache"], base["v_cache"]
        yield ErrorInput("q-2d", call(q=q[0]), ValueError, r"q must be 3-D", "q")
        yield ErrorInput("q-int", call(q=q.to(torch.int32)), ValueError, "q dtype", "q")
        yield ErrorInput("head-dim-12", call(q=q[..., :12]), ValueError, "head_dim must be a power of two", "q")
        yield ErrorInput("k-dtype", call(k_cache=k.half()), ValueError, "k_cache must have q's dtype", "k_cache")
        yield ErrorInput("v-shape", call(v_cache=v[:5]), ValueError, "v_cache must have", "v_cache")
        yield ErrorInput("gqa-3-heads", call(q=q[:, :3]), ValueError, "multiple of", "num_heads")
        yield ErrorInput("indptr-length", call(kv_indptr=base["kv_indptr"][:3]), ValueError,
                         r"kv_indptr must have N \+ 1 = 4 entries", "kv_indptr")
        yield ErrorInput("indptr-float", call(kv_indptr=base["kv_indptr"].float()), ValueError,
                         "kv_indptr must be int32 or int64", "kv_indptr")
        yield ErrorInput("indices-2d", call(kv_indices=base["kv_indices"][None]), ValueError,
                         "kv_indices must be 1-D", "kv_indices")
        yield ErrorInput("indptr-decreasing", call(kv_indptr=torch.tensor([0, 3, 2, 5])), ValueError,
                         "kv_indptr must be non-decreasing", "kv_indptr")
        yield ErrorInput("indptr-past-indices", call(kv_indptr=torch.tensor([0, 3, 3, 8])), ValueError,
                         r"kv_indptr\[N\] = 8 is past the end of kv_indices \(7 entries\)", "kv_indices")
        yield ErrorInput("slot-out-of-pool", call(kv_indices=base["kv_indices"] + 1000), ValueError,
                         r"must be slots in \[0, 24\)", "kv_indices")
        yield ErrorInput("scale-missing", lambda: ops.decode_attention_indexed(
            *(base[a] for a in ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")), impl=which), TypeError,
            "keyword-only argument: 'scale'", "scale")
        yield ErrorInput("scale-zero", call(scale=0.0), ValueError, "scale must be finite and > 0", "scale")
        yield ErrorInput("scale-bool", call(scale=True), TypeError, "scale must be a float", "scale")
        yield ErrorInput("q-list", call(q=[1.0]), TypeError, "q must be a torch.Tensor", "q")
        yield ErrorInput("out-dtype-float16", lambda: ops.decode_attention_indexed(**base, impl=which,
                                                                                   out_dtype=torch.float16),
                         ValueError, "out_dtype must be None", "out_dtype")
        yield ErrorInput("bad-impl", lambda: ops.decode_attention_indexed(**base, impl="cuda"), ValueError,
                         "impl must be one of", "impl")
    return errors




# An index op: no floating value anywhere, so no NaN and no ulp neighbours to meet.
NKV_EDGE_EXEMPT = (("nan", "an integer index op: no floating value is read or written"),
                   ("ulp", "an integer index op: no floating value is read or written"))


# ---------------------------------------------------------------------------------------------
# token_slots: the slot each new token of a forward writes (docs/semantics.md 6.14)


def _ts_sample(name, seed, *, bs, num_tokens, context, region=0, sink=0, index_dtype=torch.int64,
               overhang=False) -> SampleInput:
    """A table of bs + 1 rows x context cells of distinct random slots (0 = the sink never mapped),
    rows a permutation of the table's rows, kv_lens and q_lens ragged with every live index inside
    its row (overhang: the padded tokens of the last request run past the row end, where the index
    is clamped to the last cell)."""
    gen = torch.Generator().manual_seed(seed)
    table = (torch.randperm((bs + 1) * context, generator=gen) + 1).view(bs + 1, context)
    rows = torch.randperm(bs + 1, generator=gen)[:bs]
    q_lens = torch.randint(0, num_tokens + 1, (bs,), generator=gen)
    room = (context - region - q_lens).clamp(min=0)
    kv_lens = torch.randint(0, 2**20, (bs,), generator=gen) % (room + 1)
    if overhang and bs:
        kv_lens[-1] = room[-1]                 # live tokens end exactly at the row end: padding runs past it
    args = {"req_to_token": table.to(index_dtype), "rows": rows.to(index_dtype), "kv_lens": kv_lens.to(index_dtype),
            "q_lens": q_lens.to(index_dtype), "num_tokens": num_tokens, "region": region, "sink": sink}
    return SampleInput(f"{name}-bs{bs}-q{num_tokens}-C{context}-R{region}", args, seed)


TS_EDGE_EXEMPT = (("nan", "integer indices in, integer slots out: no float anywhere"),
                  ("ulp", "integer indices in, integer slots out: no float anywhere"))


def _ts_samples(dtype: str, seed: int):
    yield _ts_sample("empty-batch", seed, bs=0, num_tokens=4, context=8)
    yield _ts_sample("ragged", seed + 1, bs=5, num_tokens=4, context=20)
    yield _ts_sample("ragged-region", seed + 2, bs=4, num_tokens=3, context=24, region=6, sink=7)
    yield _ts_sample("boundary-row-end-clamped", seed + 3, bs=3, num_tokens=8, context=12, overhang=True)
    yield _ts_sample("boundary-one-token", seed + 4, bs=3, num_tokens=1, context=5)
    yield _ts_sample("boundary-no-tokens", seed + 5, bs=2, num_tokens=0, context=5)
    yield _ts_sample("int32-indices", seed + 6, bs=4, num_tokens=5, context=16, region=2, index_dtype=torch.int32)


def _ts_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(0, 9), st.integers(1, 40),
                     st.integers(0, 5), st.booleans(), st.booleans()).map(
        lambda t: _ts_sample("hyp", t[0], bs=t[1], num_tokens=t[2], context=t[3] + t[4], region=t[4],
                             overhang=t[5], index_dtype=torch.int32 if t[6] else torch.int64))


def _ts_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        slots = ops.token_slots(**s.args, impl=which)
        if slots.dtype != torch.int64:     # EXACT compares integers as int64: the contract's dtype is checked here
            raise AssertionError(f"token_slots must return int64 slots, got {slots.dtype}")
        return {"slots": slots}
    return impl


def _ts_ref(s: SampleInput) -> dict:
    a = s.args
    out = reference.token_slots(**{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in a.items()})
    return {"slots": torch.tensor(out, dtype=torch.int64).view(a["rows"].shape[0], a["num_tokens"])}


def _ts_errors(which: str):
    base = _ts_sample("base", 0, bs=3, num_tokens=4, context=10).args

    def call(**changes):
        return lambda: ops.token_slots(**{**base, "impl": which, **changes})
    table, rows, kv = base["req_to_token"], base["rows"], base["kv_lens"]
    yield ErrorInput("table-1d", call(req_to_token=table[0]), ValueError, "req_to_token must be 2-D", "req_to_token")
    yield ErrorInput("table-float", call(req_to_token=table.float()), ValueError, "req_to_token must be int32 or int64",
                     "req_to_token")
    yield ErrorInput("rows-list", call(rows=rows.tolist()), TypeError, "rows must be a torch.Tensor", "rows")
    yield ErrorInput("kv-lens-short", call(kv_lens=kv[:2]), ValueError, r"kv_lens must be \[bs\] = \[3\]", "kv_lens")
    yield ErrorInput("num-tokens-negative", call(num_tokens=-1), ValueError, "num_tokens must be an int >= 0",
                     "num_tokens")
    yield ErrorInput("region-float", call(region=1.0), TypeError, "region must be an int >= 0", "region")
    yield ErrorInput("checked-not-bool-empty-batch", call(rows=rows[:0], kv_lens=kv[:0], q_lens=base["q_lens"][:0],
                                                          checked="yes"), TypeError, "checked must be True, False or None",
                     "checked")
    yield ErrorInput("row-past-table", call(rows=torch.tensor([0, 1, 4])), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 4\)", "rows")
    yield ErrorInput("q-len-past-num-tokens", call(q_lens=torch.tensor([1, 5, 0])), ValueError,
                     r"q_lens must lie in \[0, num_tokens = 4\]", "q_lens")
    yield ErrorInput("live-token-past-row", call(kv_lens=torch.tensor([0, 9, 0]), q_lens=torch.tensor([1, 2, 1])),
                     ValueError, "a live token past its row", "kv_lens")
    yield ErrorInput("bad-impl", call(impl="cuda"), ValueError, "impl must be one of", "impl")


# ---------------------------------------------------------------------------------------------
# commit_accepted_kv: the accepted path's K/V moved down after a tree verify (docs/semantics.md 6.16)

KVC_BLOCK_EDGE = 256      # elements of a slot one inner step of the kernel copies, or may be tuned to: data here


def _kvc_values(gen, planes, slots, elems, dtype, kind):
    """kv [planes, slots, 1, elems] of `dtype`, values of state_commit's kinds (ulp: slot s holds
    its plane-and-element base plus s ulps, so neighbouring slots differ by one ulp)."""
    x = _mss_values(gen, (planes, elems, slots), dtype, kind)        # kind "ulp" steps along the last dim
    return x.permute(0, 2, 1).contiguous().view(planes, slots, 1, elems)


def _kvc_paths(gen, bs, width, nodes):
    """Accepted paths [bs, width]: node 0, then strictly increasing nodes < `nodes` with node >= depth,
    a random length in [1, width], -1 after."""
    out = torch.full((bs, width), -1, dtype=torch.int64)
    for b in range(bs):
        length = int(torch.randint(1, width + 1, (), generator=gen))
        node = 0
        out[b, 0] = 0
        for j in range(1, length):
            room = nodes - (width - j) - node          # leave room for the deeper nodes: node >= depth
            if room < 1:
                break
            node += int(torch.randint(1, room + 1, (), generator=gen))
            out[b, j] = node
    return out


def _kvc_sample(name, seed, dtype, *, bs, width, nodes, context, elems=8, planes=4, kind="plain", dead=(), padded=0,
                chain=False, at_row_end=False, paths=None, index_dtype=torch.int64, layout="dense") -> SampleInput:
    """A table of bs + 2 rows (the last the pad row) x context cells of distinct slots (slot 0, the
    sink, never mapped), kv of every slot; lane b's tree of `nodes` nodes sits at
    [seq_lens[b], seq_lens[b] + nodes) of its row; its accepted path random (chain: no node moves).
    dead: lanes not live, their paths garbage (nodes before their depth, past the row); padded: more
    lanes on the pad row, not live. at_row_end: the trees end at the row's last cell. paths: the
    accepted paths (None: drawn). layout: "dense"; "strided-indices" (rows, seq_lens, accept and live
    every other entry of wider tensors); "kv-heads-view" / "kv-slots-view" (kv a view of a bigger
    buffer: a subset of its heads, or a range of its slots; the op must write nothing outside it)."""
    gen = torch.Generator().manual_seed(seed)
    torch_dtype = dtypes.dtype_info(dtype).torch_dtype
    rows_total = bs + 2
    table = (torch.randperm(rows_total * context, generator=gen) + 1).view(rows_total, context)
    slots = rows_total * context + 1
    kv = _kvc_values(gen, planes, slots, elems, torch_dtype, kind)
    rows = torch.randperm(rows_total - 1, generator=gen)[:bs]
    room = context - nodes
    seq_lens = torch.full((bs,), room) if at_row_end else torch.randint(0, room + 1, (bs,), generator=gen)
    accept = _kvc_paths(gen, bs, width, nodes) if paths is None else torch.tensor(paths, dtype=torch.int64)
    if chain:
        accept = torch.where(accept >= 0, torch.arange(width)[None, :], -1)
    live = torch.ones(bs, dtype=torch.bool)
    for b in dead:
        live[b] = False
        accept[b] = torch.randint(-1, context + 3, (width,), generator=gen)
    if padded:
        rows = torch.cat([rows, torch.full((padded,), rows_total - 1)])
        seq_lens = torch.cat([seq_lens, torch.zeros(padded, dtype=seq_lens.dtype)])
        accept = torch.cat([accept, torch.randint(-1, nodes, (padded, width), generator=gen)])
        live = torch.cat([live, torch.zeros(padded, dtype=torch.bool)])
    rows, seq_lens, accept = rows.to(index_dtype), seq_lens.to(index_dtype), accept.to(index_dtype)
    if layout == "strided-indices":
        rows, seq_lens, live = (torch.stack([v, v], 1).flatten()[::2] for v in (rows, seq_lens, live))
        accept = torch.stack([accept, accept], 2).flatten(1)[:, ::2]
    elif layout == "kv-heads-view":
        big = _kvc_values(gen, planes, slots, 2 * elems, torch_dtype, kind).view(planes, slots, 2, elems)
        big[:, :, :1] = kv
        kv = big[:, :, :1]
    elif layout == "kv-slots-view":
        big = _kvc_values(gen, planes, slots + 3, elems, torch_dtype, kind)
        big[:, :slots] = kv
        kv = big[:, :slots]
    args = {"kv": kv, "req_to_token": table.to(index_dtype), "rows": rows, "seq_lens": seq_lens, "accept": accept,
            "live": live, "sink": 0}
    return SampleInput(f"{name}-bs{rows.shape[0]}-W{width}-D{nodes}", args, seed)


def _kvc_samples(dtype: str, seed: int):
    yield _kvc_sample("empty-batch", seed, dtype, bs=0, width=3, nodes=4, context=8)
    yield _kvc_sample("tree-paths", seed + 1, dtype, bs=4, width=4, nodes=8, context=14)
    yield _kvc_sample("chain-moves-nothing", seed + 2, dtype, bs=3, width=4, nodes=4, context=9, chain=True)
    yield _kvc_sample("dead-and-padded-lanes", seed + 3, dtype, bs=4, width=3, nodes=6, context=10, dead=(1, 3),
                      padded=2)
    yield _kvc_sample("boundary-trees-at-the-row-end", seed + 4, dtype, bs=3, width=4, nodes=7, context=9,
                      at_row_end=True)
    yield _kvc_sample("nan-inf-signed-zero-moved", seed + 5, dtype, bs=3, width=3, nodes=6, context=8, kind="nan")
    yield _kvc_sample("ulp-adjacent-slots", seed + 6, dtype, bs=3, width=3, nodes=5, context=8, kind="ulp")
    yield _kvc_sample("int32-indices", seed + 7, dtype, bs=3, width=3, nodes=5, context=8, index_dtype=torch.int32)
    yield _kvc_sample("boundary-slot-past-one-block", seed + 8, dtype, bs=1, width=2, nodes=3, context=3,
                      elems=KVC_BLOCK_EDGE + 3, planes=1, paths=[[0, 2]])
    yield _kvc_sample("slot-width-not-a-power-of-two", seed + 10, dtype, bs=2, width=3, nodes=5, context=6, elems=24)
    yield _kvc_sample("strided-index-vectors", seed + 11, dtype, bs=3, width=3, nodes=6, context=8, dead=(1,),
                      layout="strided-indices")
    yield _kvc_sample("kv-a-view-of-more-heads", seed + 12, dtype, bs=2, width=3, nodes=5, context=6,
                      layout="kv-heads-view")
    yield _kvc_sample("kv-a-view-of-more-slots", seed + 13, dtype, bs=2, width=3, nodes=5, context=6,
                      layout="kv-slots-view")
    yield _kvc_sample("boundary-one-node-paths", seed + 9, dtype, bs=3, width=1, nodes=1, context=4)


def _kvc_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, width, extra_nodes, spare, dead, padded, kind = t
        nodes = width + extra_nodes
        return _kvc_sample("hyp", seed, dtype, bs=bs, width=width, nodes=nodes, context=nodes + spare,
                           dead=tuple(range(min(dead, bs))), padded=padded, kind=kind)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 5), st.integers(1, 5), st.integers(0, 4), st.integers(0, 4),
                     st.integers(0, 2), st.integers(0, 2), st.sampled_from(["plain", "nan", "ulp"])).map(build)


def _kvc_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        # The op moves in place: its own copy of kv, with kv's strides and offset into a buffer of
        # its own (a view of a bigger buffer stays one); the rest of that buffer must not change.
        src = s.args["kv"]
        base = src._base if src._base is not None else src
        buffer = base.clone()
        kv = buffer.as_strided(src.shape, src.stride(), src.storage_offset())
        outside = torch.ones(base.shape, dtype=torch.bool, device=base.device)
        outside.as_strided(src.shape, src.stride(), src.storage_offset()).fill_(False)
        if ops.commit_accepted_kv(**{**s.args, "kv": kv}, impl=which) is not kv:
            raise AssertionError("commit_accepted_kv must return the kv it was given")
        if not torch.equal(_mss_bits(buffer)[outside], _mss_bits(base)[outside]):
            raise AssertionError("commit_accepted_kv wrote outside the kv view it was given")
        return {"kv_bits": _mss_bits(kv)}
    return impl


def _kvc_ref(s: SampleInput) -> dict:
    a = s.args
    bits = _mss_bits(a["kv"])
    out = reference.commit_accepted_kv(**{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in a.items()
                                          if k != "kv"}, kv=bits.numpy())
    return {"kv_bits": torch.tensor(out, dtype=bits.dtype).view(bits.shape)}


def _kvc_errors(which: str):
    base = _kvc_sample("base", 0, "float32", bs=3, width=3, nodes=5, context=8).args

    def call(**changes):
        return lambda: ops.commit_accepted_kv(**{**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                                    for k, v in base.items()}, "impl": which, **changes})
    kv, accept, rows = base["kv"], base["accept"], base["rows"]
    yield ErrorInput("kv-3d", call(kv=kv[0]), ValueError, r"kv must be 4-D \[P, slots, heads, head_dim\]", "kv")
    yield ErrorInput("kv-int", call(kv=kv.view(torch.int32)), ValueError, "kv dtype torch.int32 is not a layer dtype",
                     "kv")
    yield ErrorInput("kv-strided-heads", call(kv=kv.expand(-1, -1, 2, -1)), ValueError,
                     "kv must hold each slot's heads x head_dim contiguously", "kv")
    yield ErrorInput("accept-1d", call(accept=accept[0]), ValueError, r"accept must be 2-D \[bs, W\]", "accept")
    yield ErrorInput("rows-short", call(rows=rows[:2]), ValueError, r"rows must be \[bs\] = \[3\]", "rows")
    yield ErrorInput("live-int", call(live=base["live"].long()), ValueError, "live must be torch.bool", "live")
    yield ErrorInput("seq-lens-list", call(seq_lens=base["seq_lens"].tolist()), TypeError,
                     "seq_lens must be a torch.Tensor", "seq_lens")
    yield ErrorInput("sink-past-kv", call(sink=kv.shape[1]), ValueError, "sink must be a slot of kv", "sink")
    yield ErrorInput("checked-not-bool", call(checked=1), TypeError, "checked must be True, False or None", "checked")
    yield ErrorInput("row-past-table", call(rows=torch.tensor([0, 1, 5])), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 5\)", "rows")
    yield ErrorInput("accept-below-minus-one", call(accept=torch.tensor([[0, -2, -1], [0, 1, -1], [0, -1, -1]])),
                     ValueError, "accept must be >= -1", "accept")
    yield ErrorInput("row-negative", call(rows=torch.tensor([-1, 0, 1])), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 5\)", "rows")
    yield ErrorInput("seq-lens-negative", call(seq_lens=torch.tensor([-1, 0, 0])), ValueError, "seq_lens must be >= 0",
                     "seq_lens")
    row0, n0 = int(base["rows"][0]), int(base["seq_lens"][0])
    past = base["req_to_token"].clone()
    past[row0, n0] = kv.shape[1]
    yield ErrorInput("moved-slot-past-kv", call(req_to_token=past), ValueError,
                     rf"req_to_token must map the moved indices to slots of kv, in \[0, {kv.shape[1]}\)", "req_to_token")
    onto_sink = base["req_to_token"].clone()
    onto_sink[row0, n0] = 0
    yield ErrorInput("moved-index-on-the-sink", call(req_to_token=onto_sink), ValueError,
                     "req_to_token must not map a moved index to the sink slot 0", "req_to_token")
    yield ErrorInput("node-moved-up", call(accept=torch.tensor([[0, 2, 1], [0, 1, -1], [0, -1, -1]])), ValueError,
                     "accept must be >= its depth", "accept")
    yield ErrorInput("node-past-row", call(seq_lens=torch.tensor([3, 0, 7]), accept=torch.tensor([[0, 1, 2], [0, -1, -1],
                                                                                                   [0, 1, -1]])),
                     ValueError, "seq_lens \\+ accept must be < C = 8", "seq_lens")
    yield ErrorInput("bad-impl", call(impl="gpu"), ValueError, "impl must be one of", "impl")




RECORDS = (
    OpSpec("paged_attention", _attn_impl("torch"), _attn_ref, _attn_samples(False), _attn_recipe,
           _attn_errors("torch"), only("float32", "float16", "bfloat16"), {"out": CLOSE}, platform_dependent=False,
           max_examples=10),
    OpSpec("paged_attention_triton", _attn_impl("triton"), _attn_ref, _attn_samples(True), _attn_recipe,
           _attn_errors("triton"), only("float32", "float16", "bfloat16"), {"out": CLOSE},
           platform_dependent=False, max_examples=3),
    # The kernel as a draft head calls it: its products on the TF32 tensor cores where they stay
    # exact (bfloat16 / float16 on a GPU; interpreted on the CPU, the same numbers as IEEE products).
    OpSpec("paged_attention_tensor_cores", _attn_impl("triton", tensor_cores=True), _attn_ref, _attn_samples(True),
           _attn_recipe, _attn_errors("triton", tensor_cores=True), only("float32", "float16", "bfloat16"),
           {"out": CLOSE}, platform_dependent=False, max_examples=3),
    OpSpec("create_draft_kv_indices", _nkv_impl("torch"), _nkv_ref, _nkv_samples(False), _nkv_recipe,
           _nkv_errors("torch"), only("float32"), {"kv_indptr": EXACT, "kv_indices": EXACT},
           platform_dependent=False, max_examples=15, edge_exempt=NKV_EDGE_EXEMPT),
    OpSpec("create_draft_kv_indices_triton", _nkv_impl("triton"), _nkv_ref, _nkv_samples(True), _nkv_recipe,
           _nkv_errors("triton"), only("float32"), {"kv_indptr": EXACT, "kv_indices": EXACT},
           platform_dependent=False, max_examples=3, edge_exempt=NKV_EDGE_EXEMPT),
    OpSpec("token_slots", _ts_impl("torch"), _ts_ref, _ts_samples, _ts_recipe, lambda: _ts_errors("torch"),
           only("float32"), {"slots": EXACT}, platform_dependent=False, max_examples=15, edge_exempt=TS_EDGE_EXEMPT),
    OpSpec("token_slots_triton", _ts_impl("triton"), _ts_ref, _ts_samples, _ts_recipe, lambda: _ts_errors("triton"),
           only("float32"), {"slots": EXACT}, platform_dependent=False, max_examples=5, edge_exempt=TS_EDGE_EXEMPT),
    OpSpec("commit_accepted_kv", _kvc_impl("torch"), _kvc_ref, _kvc_samples, _kvc_recipe, lambda: _kvc_errors("torch"),
           only("float32", "bfloat16", "float16", "float64"), {"kv_bits": EXACT}, platform_dependent=False,
           max_examples=10),
    OpSpec("commit_accepted_kv_triton", _kvc_impl("triton"), _kvc_ref, _kvc_samples, _kvc_recipe,
           lambda: _kvc_errors("triton"), only("float32", "bfloat16", "float16", "float64"), {"kv_bits": EXACT},
           platform_dependent=False, max_examples=3),
    OpSpec("decode_attention_indexed", _ia_impl("torch"), _ia_ref, _ia_samples(False), _ia_recipe,
           _ia_errors("torch"), only("float32", "float16", "bfloat16", "float64"), {"out": CLOSE},
           platform_dependent=False, max_examples=10),
    OpSpec("decode_attention_indexed_triton", _ia_impl("triton"), _ia_ref, _ia_samples(True), _ia_recipe,
           _ia_errors("triton"), only("float32", "float16", "bfloat16"), {"out": CLOSE}, platform_dependent=False,
           max_examples=3),
)
