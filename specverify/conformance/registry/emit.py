"""The emit of a decode step: the EOS / max_new_tokens cut and the request state it moves
(docs/semantics.md 6.15), the candidate tokens a verify's accepted path makes (6.17), where the
draft phase after it runs (6.18), and the rows a chain cycle verifies (6.19).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations

import torch

import reference
from specverify import ops
from specverify.conformance.registry.core import EXACT, ErrorInput, OpSpec, SampleInput, only

STATE = ("seq_len", "pending", "emitted", "budget", "finished")


def _emit_sample(name, seed, *, bs, width, rows_total, eos=None, dead=(), pad_row=None, eos_at=(), room=None,
                 counts=None, index_dtype=torch.int64, vocab=32000, strided=False, zeros_at=()) -> SampleInput:
    """Lanes on a permutation of bs of rows_total state rows (or, with pad_row, the lanes of
    `dead` all on that one finished row, as a graph's padded lanes are); counts in [1, width];
    tokens drawn below `vocab` and never equal to eos unless planted (eos_at: (lane, position) of
    each planted EOS, inside or past the lane's count); room: per lane budget - emitted (None:
    drawn in [1, 2 * width]); counts: per lane (None: drawn); zeros_at: (lane, position) of planted
    token-0 candidates; strided: the state vectors are columns of one [R, 3] tensor and produced every
    other column of a wider one (the op reads and writes through strides). The pad row holds
    budget = emitted = 0, as a decoder's does."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(rows_total, generator=gen)[:bs]
    if pad_row is not None:
        rows[list(dead)] = pad_row
    count = torch.randint(1, width + 1, (bs,), generator=gen)
    if counts is not None:
        count = torch.tensor(counts, dtype=torch.int64)
    produced = torch.randint(0, vocab, (bs, width), generator=gen)
    if eos is not None:
        produced = torch.where(produced == eos, (produced + 1) % vocab, produced)
        for lane, at in eos_at:
            produced[lane, at] = eos
    for lane, at in zeros_at:
        produced[lane, at] = 0
    seq_len = torch.randint(1, 2**20, (rows_total,), generator=gen)
    pending = torch.randint(0, vocab, (rows_total,), generator=gen)
    emitted = torch.randint(0, 50, (rows_total,), generator=gen)
    lane_room = torch.randint(1, 2 * width + 1, (bs,), generator=gen) if room is None else torch.tensor(room)
    budget = emitted + torch.randint(1, 2 * width + 1, (rows_total,), generator=gen)
    budget[rows] = emitted[rows] + lane_room
    finished = torch.zeros(rows_total, dtype=torch.bool)
    finished[rows[list(dead)]] = True
    if pad_row is not None:
        finished[pad_row] = True
        budget[pad_row] = emitted[pad_row] = 0
    if strided:
        produced = _columns(produced)
        seq_len, pending, emitted, budget = (_column(v) for v in (seq_len, pending, emitted, budget))
        finished = _column(finished)
    args = {"produced": produced, "count": count.to(index_dtype), "rows": rows.to(index_dtype), "seq_len": seq_len,
            "pending": pending, "emitted": emitted, "budget": budget, "finished": finished, "eos_token_id": eos}
    return SampleInput(f"{name}-bs{bs}-W{width}", args, seed)


def _column(v: torch.Tensor) -> torch.Tensor:
    """v as the middle column of a fresh [R, 3] tensor (stride 3)."""
    out = torch.zeros((v.shape[0], 3), dtype=v.dtype)
    out[:, 1] = v
    return out[:, 1]


def _strided(v: torch.Tensor, stride: int) -> torch.Tensor:
    """v [n] as column 0 of a fresh [n, stride] tensor (stride `stride`): strided inputs of one
    sample each get their own stride, so a kernel reading one through another's stride is seen."""
    out = torch.zeros((v.shape[0], stride), dtype=v.dtype)
    out[:, 0] = v
    return out[:, 0]


def _columns(m: torch.Tensor) -> torch.Tensor:
    """m [bs, W] as every other column of a fresh [bs, 2W] tensor (strides (2W, 2))."""
    out = torch.zeros((m.shape[0], 2 * m.shape[1]), dtype=m.dtype)
    out[:, ::2] = m
    return out[:, ::2]


def _same_strides(v: torch.Tensor) -> torch.Tensor:
    """A copy of a state vector v with v's stride (clone() makes a strided view contiguous)."""
    if v.is_contiguous():
        return v.clone()
    out = torch.zeros((v.shape[0], v.stride(0)), dtype=v.dtype)[:, 0]
    out.copy_(v)
    return out


EMIT_EDGE_EXEMPT = (("nan", "token ids and counts in, token ids and counts out: no float anywhere"),
                    ("ulp", "token ids and counts in, token ids and counts out: no float anywhere"))


def _emit_samples(dtype: str, seed: int):
    yield _emit_sample("empty-batch", seed, bs=0, width=4, rows_total=3)
    yield _emit_sample("ragged-no-eos", seed + 1, bs=5, width=4, rows_total=7)
    yield _emit_sample("eos-inside-and-past-count", seed + 2, bs=4, width=4, rows_total=6, eos=2,
                       eos_at=((0, 0), (1, 2), (2, 3), (3, 1)))
    yield _emit_sample("eos-only-past-count", seed + 10, bs=3, width=4, rows_total=4, eos=9, counts=(1, 2, 3),
                       eos_at=((0, 1), (1, 3), (2, 3)), room=(8, 8, 8))
    yield _emit_sample("boundary-eos-id-zero", seed + 11, bs=3, width=4, rows_total=5, eos=0, counts=(4, 3, 4),
                       eos_at=((0, 1), (1, 0), (2, 3)), room=(9, 9, 9))
    yield _emit_sample("no-eos-token-zero-candidates", seed + 12, bs=3, width=3, rows_total=4, counts=(3, 3, 2),
                       zeros_at=((0, 1), (1, 0), (2, 1)), room=(9, 9, 9))
    yield _emit_sample("strided-state-and-produced", seed + 13, bs=4, width=4, rows_total=6, eos=4, eos_at=((1, 1),),
                       dead=(2,), strided=True)
    yield _emit_sample("boundary-budget-exactly-met", seed + 3, bs=4, width=3, rows_total=4, room=(1, 2, 3, 3))
    yield _emit_sample("boundary-eos-at-the-budget", seed + 4, bs=3, width=3, rows_total=5, eos=0,
                       eos_at=((0, 0), (1, 1), (2, 2)), room=(1, 2, 2))
    yield _emit_sample("boundary-finished-and-padded-lanes", seed + 5, bs=6, width=4, rows_total=8, eos=31999,
                       dead=(1, 4, 5), pad_row=7, eos_at=((0, 1),))
    yield _emit_sample("boundary-finished-rows", seed + 6, bs=4, width=2, rows_total=6, dead=(0, 2))
    yield _emit_sample("boundary-one-token-steps", seed + 7, bs=5, width=1, rows_total=5, eos=7, eos_at=((2, 0),),
                       room=(1, 1, 4, 2, 9))
    yield _emit_sample("int32-rows-and-counts", seed + 8, bs=4, width=5, rows_total=9, eos=3, eos_at=((1, 4),),
                       index_dtype=torch.int32)
    yield _emit_sample("boundary-eos-vocab-edge", seed + 9, bs=3, width=4, rows_total=3, eos=31999,
                       eos_at=((0, 3), (2, 0)), vocab=32000)


def _emit_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, width, extra, with_eos, dead_count, padded = t
        eos = 5 if with_eos else None
        dead = tuple(range(min(dead_count, bs)))
        planted = tuple((lane, (seed + lane) % width) for lane in range(bs) if (seed >> lane) & 1) if with_eos else ()
        return _emit_sample("hyp", seed, bs=bs, width=width, rows_total=bs + extra + (1 if padded else 0), eos=eos,
                            dead=dead, pad_row=bs + extra if padded else None, eos_at=planted, vocab=12)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 6), st.integers(0, 3), st.booleans(),
                     st.integers(0, 3), st.booleans()).map(build)


def _emit_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        state = {k: _same_strides(s.args[k]) for k in STATE}                  # the op writes the state in place
        head, taken, done = ops.emit_tokens(**{**s.args, **state}, impl=which)
        for name, t, dtype in (("head", head, torch.int64), ("taken", taken, torch.int64), ("finished", done, torch.bool)):
            if t.dtype != dtype:     # EXACT compares values: the contract's dtypes are checked here
                raise AssertionError(f"emit_tokens must return {name} as {dtype}, got {t.dtype}")
        return {"head": head, "taken": taken, "finished": done, "seq_len": state["seq_len"],
                "pending": state["pending"], "emitted": state["emitted"], "budget": state["budget"],
                "finished_rows": state["finished"]}
    return impl


def _emit_ref(s: SampleInput) -> dict:
    a = s.args
    out = reference.emit_tokens(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in a.items()})
    bs, width = a["produced"].shape
    return {"head": torch.tensor(out["head"], dtype=torch.int64).view(bs, width + 2),
            "taken": torch.tensor(out["taken"], dtype=torch.int64),
            "finished": torch.tensor(out["finished"], dtype=torch.bool),
            "seq_len": torch.tensor(out["seq_len"], dtype=torch.int64),
            "pending": torch.tensor(out["pending"], dtype=torch.int64),
            "emitted": torch.tensor(out["emitted"], dtype=torch.int64),
            "budget": a["budget"].clone(),
            "finished_rows": torch.tensor(out["finished_rows"], dtype=torch.bool)}


def _emit_errors(which: str):
    base = _emit_sample("base", 0, bs=3, width=4, rows_total=5, eos=1).args

    def call(**changes):
        return lambda: ops.emit_tokens(**{**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in base.items()},
                                          "impl": which, **changes})
    produced, rows, count = base["produced"], base["rows"], base["count"]
    yield ErrorInput("produced-1d", call(produced=produced[0]), ValueError, r"produced must be \[bs, W\]", "produced")
    yield ErrorInput("produced-int32", call(produced=produced.int()), ValueError, "produced must be torch.int64",
                     "produced")
    yield ErrorInput("produced-list", call(produced=produced.tolist()), TypeError, "produced must be a torch.Tensor",
                     "produced")
    yield ErrorInput("count-short", call(count=count[:2]), ValueError, r"count must be \[bs\] = \[3\]", "count")
    yield ErrorInput("rows-float", call(rows=rows.float()), ValueError, "rows must be int32 or int64", "rows")
    yield ErrorInput("finished-int", call(finished=base["finished"].long()), ValueError,
                     "finished must be torch.bool", "finished")
    yield ErrorInput("budget-2d", call(budget=base["budget"][:, None]), ValueError,
                     r"budget must be a 1-D request-state vector \[R\]", "budget")
    yield ErrorInput("seq-len-other-length", call(seq_len=base["seq_len"][:4]), ValueError,
                     "seq_len, pending, emitted, budget and finished must have one length R: seq_len has 4", "seq_len")
    yield ErrorInput("budget-other-length", call(budget=base["budget"][:3]), ValueError,
                     "must have one length R: seq_len has 5, budget 3", "budget")
    yield ErrorInput("eos-negative", call(eos_token_id=-1), ValueError, "eos_token_id must be an int >= 0",
                     "eos_token_id")
    yield ErrorInput("eos-float", call(eos_token_id=2.0), TypeError, "eos_token_id must be an int >= 0", "eos_token_id")
    yield ErrorInput("checked-not-bool", call(checked="yes"), TypeError, "checked must be True, False or None",
                     "checked")
    yield ErrorInput("row-past-state", call(rows=torch.tensor([0, 1, 5])), ValueError,
                     r"rows must be rows of the request state, in \[0, 5\)", "rows")
    yield ErrorInput("count-zero", call(count=torch.tensor([1, 0, 2])), ValueError, r"count must lie in \[1, W = 4\]",
                     "count")
    yield ErrorInput("count-past-width", call(count=torch.tensor([1, 5, 2])), ValueError,
                     r"count must lie in \[1, W = 4\]", "count")
    yield ErrorInput("row-negative", call(rows=torch.tensor([-1, 0, 1])), ValueError,
                     r"rows must be rows of the request state, in \[0, 5\)", "rows")
    yield ErrorInput("one-row-two-live-lanes", call(rows=torch.tensor([2, 2, 0])), ValueError,
                     "must not name one unfinished row on two lanes", "rows")
    yield ErrorInput("one-row-on-lanes-apart", call(rows=torch.tensor([2, 0, 2])), ValueError,
                     "must not name one unfinished row on two lanes", "rows")
    yield ErrorInput("live-row-without-room", call(budget=base["emitted"].clone()), ValueError,
                     "budget must exceed emitted on every unfinished row", "budget")
    yield ErrorInput("bad-impl", call(impl="cuda"), ValueError, "impl must be one of", "impl")


EMIT_COMPARE = {k: EXACT for k in ("head", "taken", "finished", "seq_len", "pending", "emitted", "budget",
                                   "finished_rows")}

def _accepted_sample(name, seed, *, bs, width, nodes, counts=None, index_dtype=torch.int64, vocab=32000,
                     zeros_at=(), junk_past_path=False, strided=False, bonus=None) -> SampleInput:
    """Each lane a tree of `nodes` tokens below vocab (zeros_at: (lane, node) of planted token-0
    nodes) and an accepted path of counts[b] (drawn in [0, width - 1] when None) draft nodes,
    strictly increasing in [1, nodes) as a tree's are; past the path -1, or (junk_past_path) junk
    the op must not read (node ids, ids past the tree, negative ids). bonus: per lane (None: drawn below vocab). strided: tree_tokens and
    accept every other column of wider tensors, num_correct and bonus columns of [bs, 3] ones."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (bs, nodes), generator=gen)
    for lane, node in zeros_at:
        tokens[lane, node] = 0
    n = torch.randint(0, width, (bs,), generator=gen) if counts is None else torch.tensor(counts, dtype=torch.int64)
    accept = torch.full((bs, width), -1, dtype=torch.int64)
    if junk_past_path:
        # Node ids, ids past the tree and negative ones: nothing past the path may be read.
        accept = torch.randint(-3, nodes + 3, (bs, width), generator=gen)
    accept[:, 0] = 0
    for lane in range(bs):
        path = torch.randperm(nodes - 1, generator=gen)[:int(n[lane])].sort().values + 1
        accept[lane, 1:1 + path.numel()] = path
    extra = torch.randint(0, vocab, (bs,), generator=gen) if bonus is None else torch.tensor(bonus, dtype=torch.int64)
    accept, n = accept.to(index_dtype), n.to(index_dtype)
    if strided:
        tokens, accept = _columns(tokens), _columns(accept)
        n, extra = _column(n), _column(extra)
    args = {"tree_tokens": tokens, "accept": accept, "num_correct": n, "bonus": extra}
    return SampleInput(f"{name}-bs{bs}-W{width}-D{nodes}", args, seed)


def _accepted_samples(dtype: str, seed: int):
    yield _accepted_sample("empty-batch", seed, bs=0, width=4, nodes=4)
    yield _accepted_sample("random-paths", seed + 1, bs=6, width=4, nodes=8)
    yield _accepted_sample("boundary-none-and-all-accepted", seed + 2, bs=4, width=4, nodes=6, counts=(0, 3, 0, 3))
    yield _accepted_sample("boundary-one-column", seed + 3, bs=3, width=1, nodes=1, counts=(0, 0, 0))
    yield _accepted_sample("boundary-token-zero-and-bonus-zero", seed + 4, bs=4, width=4, nodes=5, counts=(2, 1, 3, 0),
                           zeros_at=((0, 1), (0, 2), (1, 3), (2, 4)), bonus=(0, 0, 7, 0))
    yield _accepted_sample("boundary-vocab-edge", seed + 5, bs=3, width=3, nodes=4, counts=(2, 2, 1), vocab=32000,
                           bonus=(31999, 0, 31999))
    yield _accepted_sample("junk-past-the-path", seed + 6, bs=5, width=5, nodes=9, junk_past_path=True)
    yield _accepted_sample("int32-accept-and-counts", seed + 7, bs=4, width=4, nodes=6, index_dtype=torch.int32)
    yield _accepted_sample("strided-inputs", seed + 8, bs=4, width=4, nodes=7, counts=(1, 3, 0, 2), strided=True)
    yield _accepted_sample("wide-tree", seed + 9, bs=2, width=9, nodes=64, counts=(8, 5))


def _accepted_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, width, spare, junk, int32 = t
        return _accepted_sample("hyp", seed, bs=bs, width=width, nodes=width + spare, vocab=5, junk_past_path=junk,
                                index_dtype=torch.int32 if int32 else torch.int64)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 6), st.integers(0, 4), st.booleans(),
                     st.booleans()).map(build)


def _accepted_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        produced, count = ops.accepted_tokens(**s.args, impl=which)
        for name, t in (("produced", produced), ("count", count)):
            if t.dtype != torch.int64:     # EXACT compares values: the contract's dtypes are checked here
                raise AssertionError(f"accepted_tokens must return {name} as torch.int64, got {t.dtype}")
        return {"produced": produced, "count": count}
    return impl


def _accepted_ref(s: SampleInput) -> dict:
    out = reference.accepted_tokens(**{k: v.tolist() for k, v in s.args.items()})
    bs, width = s.args["accept"].shape
    return {"produced": torch.tensor(out["produced"], dtype=torch.int64).view(bs, width),
            "count": torch.tensor(out["count"], dtype=torch.int64)}


def _accepted_errors(which: str):
    base = _accepted_sample("base", 0, bs=3, width=4, nodes=6, counts=(1, 3, 0)).args

    def call(**changes):
        return lambda: ops.accepted_tokens(**{**{k: v.clone() for k, v in base.items()}, "impl": which, **changes})
    accept, tokens, n, bonus = base["accept"], base["tree_tokens"], base["num_correct"], base["bonus"]
    yield ErrorInput("accept-1d", call(accept=accept[0]), ValueError, r"accept must be 2-D \[bs, W\]", "accept")
    yield ErrorInput("accept-float", call(accept=accept.float()), ValueError, "accept must be int32 or int64", "accept")
    yield ErrorInput("accept-list", call(accept=accept.tolist()), TypeError, "accept must be a torch.Tensor", "accept")
    yield ErrorInput("accept-no-columns", call(accept=accept[:, :0]), ValueError, "accept must be .* with W >= 1",
                     "accept")
    yield ErrorInput("tree-tokens-int32", call(tree_tokens=tokens.int()), ValueError, "tree_tokens must be torch.int64",
                     "tree_tokens")
    yield ErrorInput("tree-tokens-other-lanes", call(tree_tokens=tokens[:2]), ValueError,
                     r"tree_tokens must be \[bs, D\] = \[3, D >= 1\]", "tree_tokens")
    yield ErrorInput("num-correct-short", call(num_correct=n[:2]), ValueError, r"num_correct must be \[bs\] = \[3\]",
                     "num_correct")
    yield ErrorInput("num-correct-float", call(num_correct=n.float()), ValueError, "num_correct must be int32 or int64",
                     "num_correct")
    yield ErrorInput("tree-tokens-1d", call(tree_tokens=tokens[:, 0]), ValueError,
                     r"tree_tokens must be \[bs, D\] = \[3, D >= 1\]", "tree_tokens")
    yield ErrorInput("tree-tokens-no-nodes", call(tree_tokens=tokens[:, :0]), ValueError,
                     r"tree_tokens must be \[bs, D\] = \[3, D >= 1\]", "tree_tokens")
    yield ErrorInput("bonus-short", call(bonus=bonus[:2]), ValueError, r"bonus must have shape \[3\]", "bonus")
    yield ErrorInput("bonus-int32", call(bonus=bonus.int()), ValueError, "bonus must be torch.int64", "bonus")
    yield ErrorInput("bonus-list", call(bonus=bonus.tolist()), TypeError, "bonus must be a torch.Tensor", "bonus")
    yield ErrorInput("num-correct-negative", call(num_correct=torch.tensor([1, -1, 0])), ValueError,
                     r"num_correct must lie in \[0, W - 1 = 3\]", "num_correct")
    yield ErrorInput("num-correct-past-width", call(num_correct=torch.tensor([1, 4, 0])), ValueError,
                     r"num_correct must lie in \[0, W - 1 = 3\]", "num_correct")
    yield ErrorInput("path-node-missing", call(num_correct=torch.tensor([2, 3, 0])), ValueError,
                     r"accept\[b, 1..num_correct\[b\]\] must be draft nodes, in \[1, D = 6\)", "accept")
    yield ErrorInput("path-node-is-the-root", call(accept=torch.tensor([[0, 0, -1, -1], *accept[1:].tolist()])),
                     ValueError, r"must be draft nodes, in \[1, D = 6\)", "accept")
    yield ErrorInput("path-node-past-the-tree", call(accept=torch.tensor([[0, 6, -1, -1], *accept[1:].tolist()])),
                     ValueError, r"must be draft nodes, in \[1, D = 6\)", "accept")
    yield ErrorInput("checked-not-bool", call(checked=1), TypeError, "checked must be True, False or None", "checked")
    yield ErrorInput("checked-not-bool-empty-batch", lambda: ops.accepted_tokens(
        **{k: v[:0] for k, v in base.items()}, impl=which, checked=1), TypeError, "checked must be True, False or None",
        "checked")
    yield ErrorInput("bad-impl", call(impl="gpu"), ValueError, "impl must be one of", "impl")

PLAN_FIELDS = ("q_lens", "positions", "last", "root", "ahead", "live")


def _plan_sample(name, seed, *, bs, width, num_steps, q_lens=None, kv_lens=None, finished=None,
                 strided=False) -> SampleInput:
    """q_lens drawn in [0, width], kv_lens in [0, 2**20), finished with probability 1/3, unless
    given per lane. strided: every input a column of a wider tensor, each with its own stride (the
    op reads through strides)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, width + 1, (bs,), generator=gen) if q_lens is None else torch.tensor(q_lens, dtype=torch.int64)
    kv = torch.randint(0, 2**20, (bs,), generator=gen) if kv_lens is None else torch.tensor(kv_lens, dtype=torch.int64)
    done = (torch.randint(0, 3, (bs,), generator=gen) == 0) if finished is None else torch.tensor(finished, dtype=torch.bool)
    if strided:
        q, kv, done = _strided(q, 3), _strided(kv, 2), _strided(done, 5)
    args = {"q_lens": q, "kv_lens": kv, "finished": done, "width": width, "num_steps": num_steps}
    return SampleInput(f"{name}-bs{bs}-q{width}-S{num_steps}", args, seed)


def _plan_samples(dtype: str, seed: int):
    yield _plan_sample("empty-batch", seed, bs=0, width=4, num_steps=3)
    yield _plan_sample("random-lanes", seed + 1, bs=7, width=4, num_steps=3)
    yield _plan_sample("boundary-none-and-all-new", seed + 2, bs=4, width=5, num_steps=2, q_lens=(0, 5, 0, 5),
                       finished=(False, False, True, True))
    yield _plan_sample("boundary-empty-prefix", seed + 3, bs=3, width=3, num_steps=1, kv_lens=(0, 0, 0),
                       q_lens=(1, 3, 0), finished=(False, False, False))
    yield _plan_sample("boundary-one-column-one-step", seed + 4, bs=3, width=1, num_steps=1)
    yield _plan_sample("every-lane-finished", seed + 5, bs=4, width=4, num_steps=4,
                       finished=(True, True, True, True))
    yield _plan_sample("long-prefix-past-int32", seed + 6, bs=3, width=4, num_steps=3,
                       kv_lens=(2**31 - 2, 2**33 + 5, 2**31 + 1), q_lens=(4, 1, 2), finished=(False, False, True))
    yield _plan_sample("strided-inputs", seed + 7, bs=5, width=6, num_steps=5, strided=True)
    yield _plan_sample("wide-extend-many-steps", seed + 8, bs=2, width=64, num_steps=9, q_lens=(64, 37))


def _plan_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, width, steps, strided = t
        return _plan_sample("hyp", seed, bs=bs, width=width, num_steps=steps, strided=strided)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 9), st.integers(1, 6),
                     st.booleans()).map(build)


def _plan_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        plan = ops.draft_plan(**s.args, impl=which)
        out = dict(zip(PLAN_FIELDS, plan))
        for name, t in out.items():
            if t.dtype != torch.int64 or not t.is_contiguous():   # EXACT compares values: the contract's layout here
                raise AssertionError(f"draft_plan must return {name} as a contiguous torch.int64 tensor, got {t.dtype}")
        return out
    return impl


def _plan_ref(s: SampleInput) -> dict:
    out = reference.draft_plan(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.args.items()})
    bs = s.args["q_lens"].shape[0]
    shapes = {"positions": (bs, s.args["width"]), "ahead": (bs, s.args["num_steps"])}
    return {k: torch.tensor(v, dtype=torch.int64).view(shapes.get(k, (bs,))) for k, v in out.items()}


def _plan_errors(which: str):
    base = _plan_sample("base", 0, bs=3, width=4, num_steps=3, q_lens=(1, 4, 0), kv_lens=(5, 0, 9),
                        finished=(False, True, False)).args

    def call(**changes):
        return lambda: ops.draft_plan(**{**base, "impl": which, **changes})
    q, kv, done = base["q_lens"], base["kv_lens"], base["finished"]
    yield ErrorInput("q-lens-2d", call(q_lens=q[None]), ValueError, r"q_lens must be 1-D \[bs\]", "q_lens")
    yield ErrorInput("q-lens-int32", call(q_lens=q.int()), ValueError, "q_lens must be torch.int64", "q_lens")
    yield ErrorInput("q-lens-list", call(q_lens=q.tolist()), TypeError, "q_lens must be a torch.Tensor", "q_lens")
    yield ErrorInput("kv-lens-short", call(kv_lens=kv[:2]), ValueError, r"kv_lens must have shape \[3\]", "kv_lens")
    yield ErrorInput("kv-lens-float", call(kv_lens=kv.float()), ValueError, "kv_lens must be torch.int64", "kv_lens")
    yield ErrorInput("finished-long", call(finished=done.long()), ValueError, "finished must be torch.bool", "finished")
    yield ErrorInput("finished-short", call(finished=done[:1]), ValueError, r"finished must have shape \[3\]",
                     "finished")
    yield ErrorInput("width-zero", call(width=0), ValueError, r"width must be .*>= 1", "width")
    yield ErrorInput("width-float", call(width=4.0), TypeError, "width must be an int", "width")
    yield ErrorInput("num-steps-zero", call(num_steps=0), ValueError, r"num_steps must be .*>= 1", "num_steps")
    yield ErrorInput("q-lens-past-width", call(q_lens=torch.tensor([1, 5, 0])), ValueError,
                     r"q_lens must lie in \[0, width = 4\]", "q_lens")
    yield ErrorInput("q-lens-negative", call(q_lens=torch.tensor([1, -1, 0])), ValueError,
                     r"q_lens must lie in \[0, width = 4\]", "q_lens")
    yield ErrorInput("kv-lens-negative", call(kv_lens=torch.tensor([5, 0, -2])), ValueError, "kv_lens must be >= 0",
                     "kv_lens")
    yield ErrorInput("checked-not-bool", call(checked=1), TypeError, "checked must be True, False or None", "checked")
    yield ErrorInput("bad-impl", call(impl="gpu"), ValueError, "impl must be one of", "impl")


PLAN_COMPARE = {k: EXACT for k in PLAN_FIELDS}


def _slot_table(gen: torch.Generator, rows: int, context: int) -> torch.Tensor:
    """A slot table [rows, context] of distinct random slots, none of them 0 (the sink)."""
    return (torch.randperm(rows * context, generator=gen) + 1).view(rows, context)


# draft_plan with the slot table: the same plan and the slots its tokens write (6.18, 6.14's rule)
SLOT_FIELDS = PLAN_FIELDS + ("slots", "ahead_slots")
PLAN_FIELDS_IN = ("q_lens", "kv_lens", "finished", "width", "num_steps")     # draft_plan's arguments without a table


def _plan_slots_sample(name, seed, *, bs, width, num_steps, context, ahead_tokens=None, sink=0, finished=None,
                       index_dtype=torch.int64, reused_row=False, overhang=False, strided=False) -> SampleInput:
    """A table of bs + 1 rows x context cells of distinct random slots (0 never mapped, the sink
    apart), the lanes' rows a permutation of its rows (reused_row: the last lane reads the first
    lane's row), q_lens in [0, width] and kv_lens with every live extend token inside its row; the
    steps after the root run past the row where the row is short (overhang: every live lane's
    extend ends at its row end, so every step index is clamped). strided: the table every other
    column of a wider one and the per-lane inputs columns of their own widths."""
    gen = torch.Generator().manual_seed(seed)
    table = _slot_table(gen, bs + 1, context)
    rows = torch.randperm(bs + 1, generator=gen)[:bs]
    if reused_row and bs > 1:
        rows[-1] = rows[0]
    q = torch.randint(0, min(width, context) + 1, (bs,), generator=gen)
    room = context - q
    kv = room if overhang else torch.randint(0, 2**20, (bs,), generator=gen) % (room + 1)
    done = (torch.randint(0, 3, (bs,), generator=gen) == 0) if finished is None else torch.tensor(finished, dtype=torch.bool)
    table, rows = table.to(index_dtype), rows.to(index_dtype)
    if strided:
        table, rows, q, kv, done = _columns(table), _strided(rows, 4), _strided(q, 3), _strided(kv, 2), _strided(done, 5)
    args = {"q_lens": q, "kv_lens": kv, "finished": done, "width": width, "num_steps": num_steps,
            "req_to_token": table, "rows": rows, "sink": sink}
    if ahead_tokens is not None:
        args["ahead_tokens"] = ahead_tokens
    return SampleInput(f"{name}-bs{bs}-q{width}-S{num_steps}-C{context}", args, seed)


def _plan_slots_samples(dtype: str, seed: int):
    yield _plan_slots_sample("empty-batch", seed, bs=0, width=4, num_steps=3, context=8)
    yield _plan_slots_sample("random-lanes", seed + 1, bs=6, width=4, num_steps=3, context=24)
    yield _plan_slots_sample("sink-and-finished-lanes", seed + 2, bs=5, width=4, num_steps=3, context=20, sink=7,
                             finished=(True, False, True, False, False))
    yield _plan_slots_sample("boundary-steps-past-the-row", seed + 3, bs=4, width=3, num_steps=4, context=9,
                             overhang=True, finished=(False, False, True, False))
    yield _plan_slots_sample("int32-table-reused-row", seed + 4, bs=4, width=5, num_steps=2, context=16,
                             index_dtype=torch.int32, reused_row=True, finished=(False,) * 4)
    yield _plan_slots_sample("tree-ahead-tokens", seed + 5, bs=3, width=4, num_steps=3, context=40, ahead_tokens=12)
    yield _plan_slots_sample("no-ahead-tokens", seed + 6, bs=3, width=2, num_steps=1, context=6, ahead_tokens=0)
    yield _plan_slots_sample("strided-inputs", seed + 7, bs=5, width=6, num_steps=5, context=30, strided=True)
    yield _plan_slots_sample("wide-extend-one-row", seed + 8, bs=2, width=64, num_steps=9, context=70)


def _plan_slots_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, width, steps, context, ahead, sink, int32, reused, overhang, strided = t
        return _plan_slots_sample("hyp", seed, bs=bs, width=width, num_steps=steps, context=context, ahead_tokens=ahead,
                                  sink=sink, index_dtype=torch.int32 if int32 else torch.int64, reused_row=reused,
                                  overhang=overhang, strided=strided)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(1, 9), st.integers(1, 6), st.integers(1, 40),
                     st.one_of(st.none(), st.integers(0, 12)), st.integers(0, 3), st.booleans(), st.booleans(),
                     st.booleans(), st.booleans()).map(build)


def _plan_slots_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        plan = ops.draft_plan(**s.args, impl=which)
        out = dict(zip(SLOT_FIELDS, plan))
        for name, t in out.items():
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or not t.is_contiguous():
                raise AssertionError(f"draft_plan with a slot table must return {name} as a contiguous torch.int64 "
                                     f"tensor, got {type(t).__name__} {getattr(t, 'dtype', '')}")
        return out
    return impl


def _plan_slots_ref(s: SampleInput) -> dict:
    out = reference.draft_plan(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.args.items()})
    a = s.args
    bs = a["q_lens"].shape[0]
    shapes = {"positions": (bs, a["width"]), "ahead": (bs, a["num_steps"]), "slots": (bs, a["width"]),
              "ahead_slots": (bs, a.get("ahead_tokens", a["num_steps"]))}
    return {k: torch.tensor(v, dtype=torch.int64).view(shapes.get(k, (bs,))) for k, v in out.items()}


def _plan_slots_errors(which: str):
    base = _plan_slots_sample("base", 0, bs=3, width=4, num_steps=3, context=10, finished=(False, True, False)).args
    plain = {k: base[k] for k in PLAN_FIELDS_IN}

    def call(**changes):
        return lambda: ops.draft_plan(**{**base, "impl": which, **changes})
    table, rows = base["req_to_token"], base["rows"]
    yield ErrorInput("rows-without-table", lambda: ops.draft_plan(**plain, rows=rows, impl=which), ValueError,
                     "rows is given without req_to_token", "rows")
    yield ErrorInput("ahead-tokens-without-table", lambda: ops.draft_plan(**plain, ahead_tokens=2, impl=which),
                     ValueError, "ahead_tokens is given without req_to_token", "ahead_tokens")
    yield ErrorInput("sink-without-table", lambda: ops.draft_plan(**plain, sink=3, impl=which), ValueError,
                     "sink is given without req_to_token", "sink")
    yield ErrorInput("table-without-rows", call(rows=None), ValueError, "rows must be given with req_to_token", "rows")
    yield ErrorInput("table-1d", call(req_to_token=table[0]), ValueError, "req_to_token must be 2-D", "req_to_token")
    yield ErrorInput("table-float", call(req_to_token=table.float()), ValueError,
                     "req_to_token must be int32 or int64", "req_to_token")
    yield ErrorInput("table-no-cells", call(req_to_token=table[:, :0]), ValueError, "C >= 1", "req_to_token")
    yield ErrorInput("rows-short", call(rows=rows[:2]), ValueError, r"rows must be \[bs\] = \[3\]", "rows")
    yield ErrorInput("rows-bool", call(rows=rows.bool()), ValueError, "rows must be int32 or int64", "rows")
    yield ErrorInput("row-past-table", call(rows=torch.tensor([0, 1, 4])), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 4\)", "rows")
    yield ErrorInput("live-extend-past-row", call(kv_lens=torch.tensor([8, 0, 0]), q_lens=torch.tensor([3, 0, 1])),
                     ValueError, "an extend token past its row", "kv_lens")
    yield ErrorInput("ahead-tokens-negative", call(ahead_tokens=-1), ValueError, "ahead_tokens must be an int >= 0",
                     "ahead_tokens")
    yield ErrorInput("sink-float", call(sink=0.0), TypeError, "sink must be an int >= 0", "sink")
    yield ErrorInput("row-negative", call(rows=torch.tensor([0, -1, 2])), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 4\)", "rows")
    yield ErrorInput("rows-long", call(rows=torch.tensor([0, 1, 2, 3])), ValueError, r"rows must be \[bs\] = \[3\]",
                     "rows")
    yield ErrorInput("ahead-tokens-zero-without-table", lambda: ops.draft_plan(**plain, ahead_tokens=0, impl=which),
                     ValueError, "ahead_tokens is given without req_to_token", "ahead_tokens")


SLOTS_COMPARE = {k: EXACT for k in SLOT_FIELDS}


CHAIN_FIELDS = ("tokens", "positions", "seq_lens", "req_ids", "live", "q_lens")


def _chain_sample(name, seed, *, bs, rows_total, steps, finished=None, pad_row=None, dead=(), seq_lens=None,
                  rows_dtype=torch.int64, strided=False, vocab=32000, req_ids=None) -> SampleInput:
    """Lanes on a permutation of bs of rows_total state rows (or, with pad_row, the lanes of
    `dead` all on that one finished row, as a graph's padded lanes are); every row a chain of
    `steps` drafts below vocab; finished: per row (None: drawn, 1 in 3); req_ids: per row (None:
    drawn below 2**16). strided: rows and every state vector a column of a wider tensor, each with
    its own stride, and drafts every other column of a wider one."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(rows_total, generator=gen)[:bs]
    if pad_row is not None:
        rows[list(dead)] = pad_row
    seq_len = (torch.randint(0, 2**20, (rows_total,), generator=gen) if seq_lens is None
               else torch.tensor(seq_lens, dtype=torch.int64))
    pending = torch.randint(0, vocab, (rows_total,), generator=gen)
    req_id = (torch.randint(0, 2**16, (rows_total,), generator=gen) if req_ids is None
              else torch.tensor(req_ids, dtype=torch.int64))
    done = ((torch.randint(0, 3, (rows_total,), generator=gen) == 0) if finished is None
            else torch.tensor(finished, dtype=torch.bool))
    if pad_row is not None:
        done[pad_row] = True
    drafts = torch.randint(0, vocab, (rows_total, steps), generator=gen)
    rows = rows.to(rows_dtype)
    if strided:
        rows, seq_len, pending = _strided(rows, 4), _strided(seq_len, 3), _strided(pending, 2)
        req_id, done, drafts = _strided(req_id, 5), _strided(done, 6), _columns(drafts)
    args = {"rows": rows, "seq_len": seq_len, "pending": pending, "finished": done, "req_id": req_id,
            "drafts": drafts}
    return SampleInput(f"{name}-bs{bs}-R{rows_total}-S{steps}", args, seed)


def _chain_samples(dtype: str, seed: int):
    yield _chain_sample("empty-batch", seed, bs=0, rows_total=3, steps=3)
    yield _chain_sample("random-rows", seed + 1, bs=6, rows_total=9, steps=3)
    yield _chain_sample("padded-lanes-on-the-pad-row", seed + 2, bs=5, rows_total=6, steps=2, pad_row=0, dead=(1, 3, 4))
    yield _chain_sample("boundary-root-only", seed + 3, bs=3, rows_total=4, steps=0)
    yield _chain_sample("boundary-every-row-live-and-empty-prefix", seed + 4, bs=4, rows_total=4, steps=4,
                        finished=(False,) * 4, seq_lens=(0, 0, 1, 0))
    yield _chain_sample("long-prefix-past-int32", seed + 5, bs=3, rows_total=3, steps=3, finished=(False, True, False),
                        seq_lens=(2**31 - 2, 2**33 + 5, 2**31))
    yield _chain_sample("int32-rows", seed + 6, bs=4, rows_total=7, steps=3, rows_dtype=torch.int32)
    yield _chain_sample("strided-state", seed + 7, bs=5, rows_total=8, steps=5, strided=True)
    yield _chain_sample("boundary-vocab-edge", seed + 8, bs=3, rows_total=3, steps=2, vocab=2)
    yield _chain_sample("long-chain", seed + 9, bs=2, rows_total=3, steps=15)
    yield _chain_sample("boundary-request-ids-past-int32", seed + 10, bs=3, rows_total=3, steps=2,
                        req_ids=(2**31 + 7, 2**40, 2**31 - 1))


def _chain_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, spare, steps, strided, int32 = t
        return _chain_sample("hyp", seed, bs=bs, rows_total=bs + spare, steps=steps, strided=strided,
                             rows_dtype=torch.int32 if int32 else torch.int64)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(0, 3), st.integers(0, 7), st.booleans(),
                     st.booleans()).map(build)


def _chain_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        out = dict(zip(CHAIN_FIELDS, ops.chain_verify_rows(**s.args, impl=which)))
        for name, t in out.items():
            want = torch.bool if name == "live" else torch.int64
            if t.dtype != want or not t.is_contiguous():   # EXACT compares values: the contract's layout here
                raise AssertionError(f"chain_verify_rows must return {name} as a contiguous {want} tensor, got {t.dtype}")
        return out
    return impl


def _chain_ref(s: SampleInput) -> dict:
    out = reference.chain_verify_rows(**{k: v.tolist() for k, v in s.args.items()})
    bs, d = s.args["rows"].shape[0], s.args["drafts"].shape[1] + 1
    shapes = {"tokens": (bs, d), "positions": (bs, d)}
    return {k: torch.tensor(v, dtype=torch.bool if k == "live" else torch.int64).view(shapes.get(k, (bs,)))
            for k, v in out.items()}


def _chain_errors(which: str):
    base = _chain_sample("base", 0, bs=3, rows_total=4, steps=3, finished=(False, True, False, False)).args

    def call(**changes):
        return lambda: ops.chain_verify_rows(**{**base, "impl": which, **changes})
    rows, seq_len, pending, done, rid, drafts = (base[k] for k in ("rows", "seq_len", "pending", "finished", "req_id",
                                                                   "drafts"))
    yield ErrorInput("rows-2d", call(rows=rows[None]), ValueError, r"rows must be 1-D \[bs\]", "rows")
    yield ErrorInput("rows-float", call(rows=rows.float()), ValueError, "rows must be int32 or int64", "rows")
    yield ErrorInput("rows-list", call(rows=rows.tolist()), TypeError, "rows must be a torch.Tensor", "rows")
    yield ErrorInput("seq-len-2d", call(seq_len=seq_len[:, None]), ValueError, r"seq_len must be a 1-D", "seq_len")
    yield ErrorInput("pending-int32", call(pending=pending.int()), ValueError, "pending must be torch.int64", "pending")
    yield ErrorInput("finished-long", call(finished=done.long()), ValueError, "finished must be torch.bool", "finished")
    yield ErrorInput("req-id-short", call(req_id=rid[:3]), ValueError, r"req_id must have shape \[4\]", "req_id")
    yield ErrorInput("drafts-1d", call(drafts=drafts[:, 0]), ValueError, r"drafts must be \[R, S\] = \[4, S\]", "drafts")
    yield ErrorInput("drafts-other-rows", call(drafts=drafts[:3]), ValueError, r"drafts must be \[R, S\] = \[4, S\]",
                     "drafts")
    yield ErrorInput("drafts-int32", call(drafts=drafts.int()), ValueError, "drafts must be torch.int64", "drafts")
    yield ErrorInput("row-past-the-state", call(rows=torch.tensor([0, 4, 1])), ValueError,
                     r"rows must be rows of the request state, in \[0, 4\)", "rows")
    yield ErrorInput("row-negative", call(rows=torch.tensor([0, -1, 1])), ValueError,
                     r"rows must be rows of the request state, in \[0, 4\)", "rows")
    yield ErrorInput("checked-not-bool", call(checked=1), TypeError, "checked must be True, False or None", "checked")
    yield ErrorInput("bad-impl", call(impl="gpu"), ValueError, "impl must be one of", "impl")


CHAIN_COMPARE = {k: EXACT for k in CHAIN_FIELDS}


# chain_verify_rows with the slot table: the same rows and the cache slots the verify's nodes write
CHAIN_SLOT_FIELDS = CHAIN_FIELDS + ("slots",)


def _chain_slots_sample(name, seed, *, bs, rows_total, steps, context, sink=0, table_dtype=torch.int64,
                        overhang=False, strided=False, **kw) -> SampleInput:
    """`_chain_sample`'s lanes with a slot table of rows_total (+ 1 spare) rows x context cells of
    distinct random slots (0 never mapped, the sink apart) and seq_lens with every live lane's
    nodes inside its row (overhang: a finished row's run past it, where only the sink is written;
    pad-row lanes are finished). strided: the table every other column of a wider one, too."""
    gen = torch.Generator().manual_seed(seed + 7919)
    d = steps + 1
    seq_lens = torch.randint(0, max(context - d, 0) + 1, (rows_total,), generator=gen)
    sample = _chain_sample(name, seed, bs=bs, rows_total=rows_total, steps=steps, seq_lens=seq_lens.tolist(),
                           strided=strided, **kw)
    a = dict(sample.args)
    if overhang:         # the finished rows' nodes would run past the row: only the sink may be written
        a["seq_len"] = torch.where(a["finished"], context - 1, a["seq_len"])
    table = _slot_table(gen, rows_total + 1, context).to(table_dtype)
    a["req_to_token"] = _columns(table) if strided else table
    a["sink"] = sink
    return SampleInput(f"{sample.name}-C{context}", a, seed)


def _chain_slots_samples(dtype: str, seed: int):
    yield _chain_slots_sample("empty-batch", seed, bs=0, rows_total=3, steps=3, context=8)
    yield _chain_slots_sample("random-rows", seed + 1, bs=6, rows_total=9, steps=3, context=20)
    yield _chain_slots_sample("padded-lanes-on-the-pad-row", seed + 2, bs=5, rows_total=6, steps=2, context=12, sink=5,
                              pad_row=0, dead=(1, 3, 4))
    yield _chain_slots_sample("boundary-nodes-end-at-the-row-end", seed + 3, bs=4, rows_total=4, steps=4, context=5,
                              finished=(False,) * 4)
    yield _chain_slots_sample("finished-rows-past-their-end", seed + 4, bs=4, rows_total=5, steps=3, context=10,
                              finished=(True, False, True, False, True), overhang=True)
    yield _chain_slots_sample("int32-table-and-rows", seed + 5, bs=4, rows_total=7, steps=3, context=16,
                              table_dtype=torch.int32, rows_dtype=torch.int32)
    yield _chain_slots_sample("strided-state-and-table", seed + 6, bs=5, rows_total=8, steps=5, context=24,
                              strided=True)
    yield _chain_slots_sample("boundary-root-only", seed + 7, bs=3, rows_total=4, steps=0, context=3)


def _chain_slots_recipe(dtype: str):
    from hypothesis import strategies as st

    def build(t):
        seed, bs, spare, steps, context, sink, strided, int32, overhang = t
        return _chain_slots_sample("hyp", seed, bs=bs, rows_total=bs + spare, steps=steps, context=steps + 1 + context,
                                   sink=sink, strided=strided, overhang=overhang,
                                   table_dtype=torch.int32 if int32 else torch.int64)
    return st.tuples(st.integers(0, 2**16), st.integers(0, 6), st.integers(0, 3), st.integers(0, 7),
                     st.integers(0, 30), st.integers(0, 3), st.booleans(), st.booleans(), st.booleans()).map(build)


def _chain_slots_impl(which: str):
    def impl(s: SampleInput, profile) -> dict:
        out = dict(zip(CHAIN_SLOT_FIELDS, ops.chain_verify_rows(**s.args, impl=which)))
        for name, t in out.items():
            want = torch.bool if name == "live" else torch.int64
            if not isinstance(t, torch.Tensor) or t.dtype != want or not t.is_contiguous():
                raise AssertionError(f"chain_verify_rows with a slot table must return {name} as a contiguous {want} "
                                     f"tensor, got {type(t).__name__} {getattr(t, 'dtype', '')}")
        return out
    return impl


def _chain_slots_ref(s: SampleInput) -> dict:
    out = reference.chain_verify_rows(**{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.args.items()})
    bs, d = s.args["rows"].shape[0], s.args["drafts"].shape[1] + 1
    shapes = {"tokens": (bs, d), "positions": (bs, d), "slots": (bs, d)}
    return {k: torch.tensor(v, dtype=torch.bool if k == "live" else torch.int64).view(shapes.get(k, (bs,)))
            for k, v in out.items()}


def _chain_slots_errors(which: str):
    base = _chain_slots_sample("base", 0, bs=3, rows_total=4, steps=3, context=10,
                               finished=(False, True, False, False)).args
    plain = {k: v for k, v in base.items() if k not in ("req_to_token", "sink")}

    def call(**changes):
        return lambda: ops.chain_verify_rows(**{**base, "impl": which, **changes})
    table = base["req_to_token"]
    yield ErrorInput("sink-without-table", lambda: ops.chain_verify_rows(**plain, sink=2, impl=which), ValueError,
                     "sink is given without req_to_token", "sink")
    yield ErrorInput("table-1d", call(req_to_token=table[0]), ValueError, "req_to_token must be 2-D", "req_to_token")
    yield ErrorInput("table-float", call(req_to_token=table.float()), ValueError,
                     "req_to_token must be int32 or int64", "req_to_token")
    yield ErrorInput("table-no-cells", call(req_to_token=table[:, :0]), ValueError, "C >= 1", "req_to_token")
    yield ErrorInput("row-past-the-table", call(req_to_token=table[:2]), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 2\)", "rows")
    yield ErrorInput("live-node-past-its-row", call(seq_len=torch.tensor([7, 0, 0, 0])), ValueError,
                     "a verified node past its row", "seq_len")
    yield ErrorInput("sink-negative", call(sink=-1), ValueError, "sink must be an int >= 0", "sink")
    # The table's row bound at the bound itself (rows [0, 1, 3] on a table of 3 rows).
    yield ErrorInput("row-at-the-table-end", call(req_to_token=table[:3]), ValueError,
                     r"rows must be rows of req_to_token, in \[0, 3\)", "rows")
    # A row past the state but inside the table (5 rows): the state's bound, never an IndexError.
    yield ErrorInput("row-past-the-state-inside-the-table", call(rows=torch.tensor([0, 4, 1])), ValueError,
                     r"rows must be rows of the request state, in \[0, 4\)", "rows")
    yield ErrorInput("sink-float", call(sink=1.0), TypeError, "sink must be an int >= 0", "sink")
    yield ErrorInput("sink-bool", call(sink=True), TypeError, "sink must be an int >= 0", "sink")
    yield ErrorInput("sink-zero-float-without-table", lambda: ops.chain_verify_rows(**plain, sink=0.0, impl=which),
                     ValueError, "sink is given without req_to_token", "sink")
    yield ErrorInput("table-on-another-device", call(req_to_token=table.to("meta")), ValueError,
                     "req_to_token is on meta", "req_to_token")


CHAIN_SLOTS_COMPARE = {k: EXACT for k in CHAIN_SLOT_FIELDS}


ACCEPTED_COMPARE = {"produced": EXACT, "count": EXACT}

def _twins(name, impl, ref, samples, recipe, errors, compare) -> tuple[OpSpec, OpSpec]:
    """An op's torch record and its `_triton` twin (the same samples, reference and errors; the
    Triton one interpreted on a CPU, so fewer hypothesis examples)."""
    return tuple(OpSpec(name + suffix, impl(which), ref, samples, recipe, lambda which=which: errors(which),
                        only("float32"), compare, platform_dependent=False, max_examples=examples,
                        edge_exempt=EMIT_EDGE_EXEMPT)
                 for suffix, which, examples in (("", "torch", 15), ("_triton", "triton", 5)))


RECORDS = (
    *_twins("emit_tokens", _emit_impl, _emit_ref, _emit_samples, _emit_recipe, _emit_errors, EMIT_COMPARE),
    *_twins("accepted_tokens", _accepted_impl, _accepted_ref, _accepted_samples, _accepted_recipe, _accepted_errors,
            ACCEPTED_COMPARE),
    *_twins("draft_plan", _plan_impl, _plan_ref, _plan_samples, _plan_recipe, _plan_errors, PLAN_COMPARE),
    *_twins("draft_plan_slots", _plan_slots_impl, _plan_slots_ref, _plan_slots_samples, _plan_slots_recipe,
            _plan_slots_errors, SLOTS_COMPARE),
    *_twins("chain_verify_rows", _chain_impl, _chain_ref, _chain_samples, _chain_recipe, _chain_errors,
            CHAIN_COMPARE),
    *_twins("chain_verify_rows_slots", _chain_slots_impl, _chain_slots_ref, _chain_slots_samples, _chain_slots_recipe,
            _chain_slots_errors, CHAIN_SLOTS_COMPARE),
)
