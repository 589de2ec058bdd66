"""The draft tree (6.2), greedy and stochastic verify (6.3, 6.4), the naive-EAGLE accept step (6.7) and DFlash's block verify (6.9).

Records of the op registry (specverify/conformance/registry/__init__.py)."""

from __future__ import annotations


import numpy as np
import torch

import reference
from reference import spec as rspec
from specverify import ops
from specverify.kernels.tree import build_tree
from specverify.kernels.verify import target_predict, verify_greedy, verify_naive, verify_stochastic
from specverify.spec.eagle import expand_search, finish_search, start_search
from specverify.conformance import strategies as S
from specverify.conformance.registry.core import EXACT, LOGITS_BY_POLICY, ErrorInput, OpSpec, SampleInput, only


# ---------------------------------------------------------------------------------------------
# draft tree


def _tree_inputs(seed, bs, topk, steps, d, vocab, kind: str = "tree") -> SampleInput:
    """kind: "tree" (softmax-like distributions of grid levels: exact ties), "nan" (some
    probabilities NaN), "ulp" (the best probabilities float32 neighbours), "boundary" (the best
    token at index 0 or V-1)."""
    gen = torch.Generator().manual_seed(seed)
    dists = [S.probs_from(gen, (bs, 1 if i == 0 else topk), vocab) for i in range(steps)]
    for dist in dists:
        flat = dist.view(-1, vocab)
        for r in range(flat.shape[0]):
            if kind == "nan" and r % 2 == 0:
                flat[r, torch.randint(0, vocab, (1,), generator=gen)] = float("nan")
            elif kind == "ulp":
                top = flat[r].max()
                flat[r, torch.randperm(vocab, generator=gen)[:2]] = torch.stack([top, torch.nextafter(top, top + 1)])
            elif kind == "boundary":
                flat[r, (0, vocab - 1)[r % 2]] = 1.0
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    seq_lens = torch.randint(0, 50, (bs,), generator=gen)
    return SampleInput(f"{kind}-k{topk}-S{steps}-D{d}-bs{bs}", {"dists": dists, "roots": roots, "seq_lens": seq_lens,
                                                                "topk": topk, "steps": steps, "d": d}, seed)


def tree_impl(impl: str):
    """The whole search (start, each step's `expand_search`, finish) and `build_tree`, with `impl`
    for the search steps and the tree build ("auto": torch on the CPU, the Triton kernels on a GPU)."""
    def run(s: SampleInput, profile) -> dict:
        a = s.args
        k, steps = a["topk"], a["steps"]
        bs, _, vocab = a["dists"][0].shape
        p0, i0 = ops.topk_stable(a["dists"][0][:, 0], k)
        search = start_search(p0, i0, steps)
        for step in range(1, steps):
            p, idx = ops.topk_stable(a["dists"][step].reshape(bs * k, vocab), k)
            expand_search(search, step, p.view(bs, k, k), idx.view(bs, k, k), impl=impl)
        kept_flat, kept_tokens, beam_flat = finish_search(search, a["d"], impl=impl)
        tree = build_tree(a["roots"], kept_flat, kept_tokens, beam_flat, a["seq_lens"], topk=k, num_steps=steps,
                          impl=impl)
        return {f: getattr(tree, f) for f in TREE_FIELDS} | {"kept_flat": kept_flat}
    return run


TREE_FIELDS = ("tokens", "parents", "positions", "mask", "first_child", "next_sibling", "flat_index")


def _tree_ref(s: SampleInput) -> dict:
    a = s.args
    trees = rspec.build_tree([d.numpy() for d in a["dists"]], a["roots"].tolist(), a["seq_lens"].tolist(),
                             topk=a["topk"], num_steps=a["steps"], num_draft_tokens=a["d"])
    bs, d = len(trees), a["d"]
    shapes = {f: (bs, d, d) if f == "mask" else (bs, d) for f in TREE_FIELDS}
    out = {f: torch.tensor([getattr(t, f) for t in trees], dtype=torch.bool if f == "mask" else torch.int64)
           .view(shapes[f]) for f in TREE_FIELDS}
    out["kept_flat"] = torch.tensor([t.kept_flat for t in trees], dtype=torch.int64).view(bs, d - 1)
    return out


def _tree_samples(dtype: str, seed: int):
    for shape in ((2, 1, 3, 4), (3, 2, 3, 5), (2, 4, 3, 8), (1, 3, 4, 10), (4, 2, 1, 3), (2, 4, 2, 7)):
        bs, k, steps, d = shape
        yield _tree_inputs(seed + sum(shape), bs, k, steps, d, 17)
    for kind in ("nan", "ulp", "boundary"):
        for shape in ((3, 2, 3, 5), (2, 4, 2, 7)):
            yield _tree_inputs(seed + len(kind), *shape, 17, kind)
    yield _tree_inputs(seed, 2, 4, 2, 7, 4, "boundary-V-eq-k")
    yield _tree_inputs(seed, 0, 2, 3, 5, 17, "empty-batch")


def _tree_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _tree_inputs(*t))


def _tree_errors():
    roots, lens = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    beams = torch.zeros((1, 1, 2), dtype=torch.int64)

    def call(kept, topk=2, steps=2, beam_flat=beams):
        return lambda: build_tree(roots, kept, kept, beam_flat, lens, topk=topk, num_steps=steps)
    # k=2, S=2 has 2 + 4 = 6 candidates: flat indices live in [0, 6).
    yield ErrorInput("flat-out-of-range", call(torch.tensor([[0, 1, 6]])), ValueError, "kept_flat", "kept_flat")
    yield ErrorInput("flat-negative", call(torch.tensor([[-1, 1, 2]])), ValueError, "kept_flat", "kept_flat")
    yield ErrorInput("too-many-kept", call(torch.arange(7)[None]), ValueError, "kept", "kept_flat")
    yield ErrorInput("chain-needs-D-eq-S+1", call(torch.tensor([[0, 1, 2]]), topk=1, steps=2,
                                                  beam_flat=torch.zeros((1, 1, 1), dtype=torch.int64)),
                     ValueError, "more than the 2 candidates of topk=1, num_steps=2", "topk")


# ---------------------------------------------------------------------------------------------
# greedy and stochastic verify (trees built by the reference from random distributions)


def _ref_trees(seed, bs, topk, steps, d, vocab):
    s = _tree_inputs(seed, bs, topk, steps, d, vocab)
    return _tree_ref(s), s


def _verify_sample(name, seed, shape, dtype, vocab=19, plant=True, kind="plain"):
    """kind: "plain"; "nan" (NaN entries in some target rows); "ulp" (a planted token only one
    float32 ulp above a rival); "boundary" (tokens 0 and V-1 planted). The target probabilities
    follow the logits: p ∝ 2**x (`S.pow2_probs`, softmax-like; a row holding a NaN is NaN); for
    "boundary" tokens 0 and V-1 each get the whole row's weight on top of their own."""
    bs, topk, steps, d = shape
    tree, s = _ref_trees(seed, bs, topk, steps, d, vocab)
    gen = torch.Generator().manual_seed(seed + 1)
    x = S.tie_heavy_rows(gen, bs * d, vocab).view(bs, d, vocab)
    if kind == "boundary":
        tree["tokens"] = torch.where(tree["tokens"] % 2 == 0, 0, vocab - 1)
        tree["tokens"][:, 0] = 1
    if plant:
        # Make the target agree with some drafts so paths of every length get accepted.
        for b in range(bs):
            for j in range(1, d):
                par = int(tree["parents"][b, j])
                if par >= 0 and bool(S.coins(gen, (), 0.6)):
                    x[b, par, :] = torch.where(x[b, par] >= 3.0, 2.0, x[b, par])
                    x[b, par, int(tree["tokens"][b, j])] = 3.5
                    if kind == "ulp":
                        rival = (int(tree["tokens"][b, j]) + 1) % vocab
                        x[b, par, rival] = 3.5
                        x[b, par, int(tree["tokens"][b, j])] = float(torch.nextafter(torch.tensor(3.5), torch.tensor(4.0)))
    if kind == "nan":
        x[:, ::2, torch.randint(0, vocab, (1,), generator=gen)] = float("nan")
    values, scale = S.as_logits_dtype(x.reshape(bs * d, vocab), dtype)
    coins = S.unit_floats(gen, (bs, d))
    final = S.unit_floats(gen, (bs,))
    if kind == "boundary":
        w = S.pow2_weights(x)
        total = w.sum(-1)
        w[..., 0] += total
        w[..., -1] += total
        probs = S.probs_from_weights(w)
    else:
        probs = S.pow2_probs(x)
    return SampleInput(name, {"tree": tree, "logits": values.view(bs, d, vocab), "steps": steps,
                              "probs": probs, "coins": coins, "final": final}, seed)


def _as_tree(t: dict):
    from specverify.kernels.tree import DraftTree
    return DraftTree(**{f: t[f] for f in TREE_FIELDS})


def _greedy_impl(s: SampleInput, profile) -> dict:
    accept, n, bonus = verify_greedy(_as_tree(s.args["tree"]), target_predict(s.args["logits"]),
                                     num_steps=s.args["steps"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _greedy_ref(s: SampleInput) -> dict:
    t = s.args["tree"]
    out = [rspec.greedy_verify(t["tokens"][b].tolist(), t["parents"][b].tolist(),
                               s.args["logits"][b].float().numpy(), num_steps=s.args["steps"])
           for b in range(t["tokens"].shape[0])]
    return verify_out(out, s.args["steps"] + 1)


def verify_out(out, width: int) -> dict:
    return {"accept_nodes": torch.tensor([o[0] for o in out], dtype=torch.int64).view(len(out), width),
            "num_correct": torch.tensor([o[1] for o in out], dtype=torch.int64),
            "bonus": torch.tensor([o[2] for o in out], dtype=torch.int64)}


def _stochastic_impl(s: SampleInput, profile) -> dict:
    a = s.args
    accept, n, bonus = verify_stochastic(_as_tree(a["tree"]), a["probs"], a["coins"], a["final"],
                                         num_steps=a["steps"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _stochastic_ref(s: SampleInput, accept_rule: str = "lt") -> dict:
    a, t = s.args, s.args["tree"]
    out = [rspec.stochastic_verify(t["tokens"][b].tolist(), t["parents"][b].tolist(), a["probs"][b].numpy(),
                                   a["coins"][b].tolist(), float(a["final"][b]), num_steps=a["steps"],
                                   accept=accept_rule)
           for b in range(t["tokens"].shape[0])]
    return verify_out(out, s.args["steps"] + 1)


VERIFY_SHAPES = ((1, 1, 1, 2), (3, 1, 4, 5), (2, 2, 3, 5), (3, 4, 3, 8), (2, 3, 2, 7))


def _verify_samples(dtype: str, seed: int):
    for i, shape in enumerate(VERIFY_SHAPES):
        yield _verify_sample(f"planted-{shape}", seed + i, shape, dtype)
        yield _verify_sample(f"random-{shape}", seed + 100 + i, shape, dtype, plant=False)
    yield _verify_sample("large-bs", seed, (64, 2, 3, 6), dtype)
    for kind in ("nan", "ulp", "boundary"):
        for i, shape in enumerate(((3, 1, 4, 5), (3, 4, 3, 8))):
            yield _verify_sample(f"{kind}-{shape}", seed + 7 * i, shape, dtype, kind=kind)
    yield _verify_sample("empty-batch", seed, (0, 2, 3, 5), dtype, plant=False)


def _stochastic_samples(dtype: str, seed: int):
    yield from (s for s in _verify_samples(dtype, seed) if not s.name.startswith("nan"))
    # The root's coin exactly on its first child's target probability (a float64 value of the
    # sample, so the equality is exact): u < acc rejects that child, u <= acc (an engine's rule)
    # accepts it.
    s = _verify_sample("boundary-coin-at-the-threshold", seed + 40, (3, 2, 2, 5), dtype)
    tokens, parents = s.args["tree"]["tokens"], s.args["tree"]["parents"]
    coins = s.args["coins"].clone()
    for b in range(tokens.shape[0]):
        first = int((parents[b] == 0).nonzero()[0, 0])
        coins[b, 0] = s.args["probs"][b, 0, int(tokens[b, first])]
    yield SampleInput(s.name, {**s.args, "coins": coins}, s.seed)


def _verify_recipe(dtype: str):
    return S.tree_shapes().map(lambda t: _verify_sample("hyp", t[0], t[1:5], dtype, vocab=max(t[5], 5)))


def _verify_errors():
    tree = _as_tree(_ref_trees(1, 2, 2, 2, 4, 7)[0])
    logits = torch.zeros((2, 4, 7))

    def greedy(predict=None, steps=2, t=tree):
        return lambda: verify_greedy(t, target_predict(logits) if predict is None else predict, num_steps=steps)
    yield ErrorInput("num-steps-0", greedy(steps=0), ValueError, "num_steps must be an int >= 1", "num_steps")
    yield ErrorInput("tree-not-a-tree", greedy(t={"tokens": 1}), ValueError, "tree must be a DraftTree", "tree")
    yield ErrorInput("logits-2-D", lambda: target_predict(logits[0]), ValueError, "logits must be a 3-D tensor", "logits")
    yield ErrorInput("logits-empty-vocab", lambda: target_predict(logits[..., :0]), ValueError,
                     "logits must have a non-empty vocabulary dimension", "logits")


def _stochastic_errors():
    tree = _as_tree(_ref_trees(1, 2, 2, 2, 4, 7)[0])
    probs = torch.full((2, 4, 7), 1 / 7, dtype=torch.float64)
    coins, final = torch.zeros((2, 4), dtype=torch.float64), torch.zeros(2, dtype=torch.float64)

    def call(p=probs, c=coins, f=final, steps=2):
        return lambda: verify_stochastic(tree, p, c, f, num_steps=steps)
    yield ErrorInput("num-steps-0", call(steps=0), ValueError, "num_steps must be an int >= 1", "num_steps")
    yield ErrorInput("probs-2-D", call(p=probs[0]), ValueError, "target_probs must be a 3-D tensor", "target_probs")
    yield ErrorInput("probs-empty-vocab", call(p=probs[..., :0]), ValueError,
                     "target_probs must have a non-empty vocabulary dimension", "target_probs")
    yield ErrorInput("coin-is-1", call(c=torch.ones((2, 4), dtype=torch.float64)), ValueError,
                     r"coins must lie in \[0, 1\)", "coins")


# ---------------------------------------------------------------------------------------------
# the naive-EAGLE accept step (docs/semantics.md 6.7)


def _naive_impl(s: SampleInput, profile) -> dict:
    a = s.args
    accept, n, bonus = verify_naive(a["probs"], a["draft"], a["coin"], a["final"], **a["mode"])
    return {"accept_nodes": accept, "num_correct": n, "bonus": bonus}


def _naive_ref(s: SampleInput, accept_rule: str = "lt") -> dict:
    a = s.args
    out = []
    for b in range(a["draft"].shape[0]):
        mode = ({"draft_q": a["mode"]["draft_q"][b].numpy()} if "draft_q" in a["mode"]
                else {"draft_p": float(a["mode"]["draft_p"][b])})
        out.append(reference.naive_verify(a["probs"][b].numpy(), int(a["draft"][b]), float(a["coin"][b]),
                                          float(a["final"][b]), **mode, accept=accept_rule))
    return verify_out(out, 2)


def _naive_sample(name, seed, probs, draft, coin, final, *, q=None, p=None):
    mode = {"draft_q": q.double()} if q is not None else {"draft_p": torch.as_tensor(p, dtype=torch.float64)}
    return SampleInput(name, {"probs": probs.double(), "draft": torch.as_tensor(draft, dtype=torch.int64),
                              "coin": torch.as_tensor(coin, dtype=torch.float64),
                              "final": torch.as_tensor(final, dtype=torch.float64), "mode": mode}, seed)


def _naive_random(name, seed, bs, vocab, exact: bool, agree: float = 0.5):
    """Target rows from tie-heavy logits x, p ∝ 2**x (`S.pow2_probs`, softmax-like); the draft's q
    the same or a sharper copy of p_0 (q ∝ 2**(t x), t = 1 with probability `agree`, else 2.5), so
    the ratio p_0(d) / q(d) lands on both sides of the coin; d drawn from q (exact inverse CDF)."""
    gen = torch.Generator().manual_seed(seed)
    x = S.tie_heavy_rows(gen, bs * 2, vocab).view(bs, 2, vocab).double()
    probs = S.pow2_probs(x)
    temper = torch.where(S.coins(gen, (bs, 1), agree), 1.0, 2.5).double()
    wq = S.pow2_weights(x[:, 0] * temper)
    q = S.probs_from_weights(wq)
    draft = S.draw_from_weights(gen, wq)
    coin = S.unit_floats(gen, (bs,))
    final = S.unit_floats(gen, (bs,))
    if exact:
        return _naive_sample(name, seed, probs, draft, coin, final, q=q)
    return _naive_sample(name, seed, probs, draft, coin, final, p=q.gather(1, draft[:, None])[:, 0])


def _naive_samples(dtype: str, seed: int):
    for exact in (True, False):
        mode = "exact" if exact else "shortcut"
        for i, (bs, vocab) in enumerate(((1, 2), (3, 5), (5, 19), (4, 389))):
            yield _naive_random(f"{mode}-random-bs{bs}-V{vocab}", seed + i, bs, vocab, exact)
        yield _naive_random(f"{mode}-large-bs", seed + 9, 64, 33, exact)
        yield _naive_random(f"empty-batch-{mode}", seed, 0, 7, exact)
    # p_0(d) / q(d) = 0.5 exactly: a coin of 0.5 rejects (strict <), one ulp below accepts.
    half = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    below = float(np.nextafter(0.5, 0.0))
    probs = torch.stack([half, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)])[None].repeat(2, 1, 1)
    yield _naive_sample("ulp-coin-at-the-ratio", seed, probs, [0, 0], [0.5, below], [0.3, 0.3], q=q[None].repeat(2, 1))
    yield _naive_sample("ulp-coin-at-the-ratio-shortcut", seed, probs, [0, 0], [0.5, below], [0.3, 0.3],
                        p=[0.5, 0.5])
    # q(d) = 0: the ratio is +inf (accept) where p_0(d) > 0, NaN (reject) where p_0(d) = 0 too.
    p0 = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64)
    probs = torch.stack([p0, torch.full((2, 3), 1 / 3, dtype=torch.float64)], 1)
    yield _naive_sample("nan-ratio-q-zero", seed, probs, [0, 0], [0.7, 0.7], [0.5, 0.5],
                        q=torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    # p_0 == q: the ratio is 1, every coin accepts.
    same = S.pow2_probs(torch.arange(6, dtype=torch.float64))
    yield _naive_sample("boundary-p-equals-q", seed, torch.stack([same, same])[None].repeat(3, 1, 1), [5, 0, 3],
                        [0.0, 0.5, float(np.nextafter(1.0, 0.0))], [0.1, 0.6, 0.99], q=same[None].repeat(3, 1))
    # Tokens 0 and V-1; a final landing exactly on a running sum of the residual passes it.
    v = 8
    p0 = torch.zeros(v, dtype=torch.float64)
    p0[0], p0[3], p0[v - 1] = 0.5, 0.25, 0.25
    q = torch.zeros(v, dtype=torch.float64)
    q[0], q[v - 1] = 0.75, 0.25
    probs = torch.stack([p0, torch.flip(p0, (0,))])[None].repeat(3, 1, 1)
    # residual max(p0 - q, 0) = 0.25 at token 3 only; d = 0 rejected at coin 0.9 (ratio 2/3)
    yield _naive_sample("boundary-vocab-edges", seed, probs, [0, v - 1, v - 1], [0.9, 0.2, 0.99], [0.5, 0.5, 0.0],
                        q=q[None].repeat(3, 1))
    yield _naive_sample("boundary-vocab-edges-shortcut", seed, probs, [0, v - 1, v - 1], [0.9, 0.2, 0.99],
                        [0.5, 0.5, 0.0], p=[0.75, 0.25, 0.25])


def _naive_recipe(dtype: str):
    from hypothesis import strategies as st
    return st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 6), st.integers(2, 60), st.booleans(),
                     st.floats(0.0, 1.0)).map(
        lambda t: _naive_random(f"hyp-{'exact' if t[3] else 'shortcut'}-V{t[2]}", t[0], t[1], t[2], t[3], t[4]))


def _naive_errors():
    probs = torch.full((2, 2, 5), 0.2, dtype=torch.float64)
    q = torch.full((2, 5), 0.2, dtype=torch.float64)
    d, u = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float64)

    def call(p=probs, draft=d, coin=u, **mode):
        return lambda: verify_naive(p, draft, coin, u, **(mode or {"draft_q": q}))
    yield ErrorInput("both-modes", call(draft_q=q, draft_p=u), ValueError, "exactly one of draft_q", "draft_q")
    yield ErrorInput("no-mode", lambda: verify_naive(probs, d, u, u), ValueError, "exactly one of draft_q", "draft_q")
    yield ErrorInput("probs-three-nodes", call(p=torch.full((2, 3, 5), 0.2, dtype=torch.float64)), ValueError,
                     r"target_probs must be a 3-D tensor \[bs, 2, V\]", "target_probs")
    yield ErrorInput("draft-past-vocab", call(draft=torch.tensor([0, 5])), ValueError, r"draft must lie in \[0, 5\)",
                     "draft")
    yield ErrorInput("coin-is-1", call(coin=torch.ones(2, dtype=torch.float64)), ValueError,
                     r"coin must lie in \[0, 1\)", "coin")
    yield ErrorInput("draft-q-float32", call(draft_q=q.float()), ValueError, "draft_q", "draft_q")


RECORDS = (
    OpSpec("draft_tree", tree_impl("auto"), _tree_ref, _tree_samples, _tree_recipe, _tree_errors, only("float32"),
           {f: EXACT for f in TREE_FIELDS + ("kept_flat",)}, platform_dependent=False, max_examples=20),
    OpSpec("verify_greedy", _greedy_impl, _greedy_ref, _verify_samples, _verify_recipe, _verify_errors,
           LOGITS_BY_POLICY, {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=8),
    OpSpec("verify_stochastic", _stochastic_impl, _stochastic_ref, _stochastic_samples, _verify_recipe,
           _stochastic_errors, only("float64"), {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT},
           platform_dependent=False, max_examples=20, conventions=("accept_rule",), uniforms=("coins", "final"),
           edge_exempt=(("nan", "target_probs come from sampling_probs, which turns a row holding NaN into NaN "
                                "everywhere; the reference refuses to draw from it (ValueError) and the optimized op "
                                "reads no values on its hot path: NaN rows are outside 6.4's contract"),)),
    OpSpec("verify_naive", _naive_impl, _naive_ref, _naive_samples, _naive_recipe, _naive_errors, only("float64"),
           {"accept_nodes": EXACT, "num_correct": EXACT, "bonus": EXACT}, platform_dependent=False, max_examples=20,
           conventions=("accept_rule",), uniforms=("coin", "final")),
)
