"""Semantic profiles: the conventions an implementation declares, and the reference each one selects.

An implementation says how it behaves where engines legitimately disagree (docs/conformance.md,
"Conventions"): `conventions` (a dict, for every op) and `op_conventions` (op name -> dict, for one
op). Each key has a closed set of values; the first is specverify's own semantics. An op is checked
against the reference under the conventions it declares; every declared value that differs from
specverify's and that the op's record knows (`OpSpec.conventions`) is a named difference, reported
with the smallest sample on which the two semantics give different outputs.

Four keys are not semantics but calling conventions, read by the runner: `randomness` (an op
drawing its own uniforms is judged by law, specverify.conformance.laws), `inputs` (probabilities
instead of logits for the law op that samples), `outputs` (an op writing into its arguments) and
`precision` (float outputs compared by the float32 tolerance entry).
"""

from __future__ import annotations

import functools

CONVENTIONS: dict[str, tuple[str, ...]] = {
    "topk_ties": ("index", "keep_tied"),
    "topp_ties": ("index", "keep_tied"),
    "accept_rule": ("lt", "le"),
    "argmax_nan": ("nan_is_max", "nan_ignored"),
    "randomness": ("counter", "own"),
    "inputs": ("logits", "probs"),
    "outputs": ("returned", "in_place"),
    "precision": ("float64", "float32"),
}
SPECVERIFY = {key: values[0] for key, values in CONVENTIONS.items()}

# What each non-default value means, in the words the report uses.
DIFFERENCES: dict[tuple[str, str], str] = {
    ("topk_ties", "keep_tied"): "top-k cuts at a probability value: every token tied with the k-th is kept "
                                "(specverify keeps exactly k, ties broken by index)",
    ("topp_ties", "keep_tied"): "top-p cuts at a probability value: every token tied with the last one kept is "
                                "kept (specverify cuts in the order p descending, index ascending)",
    ("accept_rule", "le"): "a draft is accepted when u <= threshold (specverify: u < threshold)",
    ("argmax_nan", "nan_ignored"): "NaN logits are read as float32(-1e30), then the first maximum wins (NaN beats "
                                   "-inf, ties with -1e30; an all-NaN row gives 0) (specverify: the first NaN is "
                                   "the maximum, as torch.argmax)",
    ("randomness", "own"): "draws its own uniforms: judged by law against the exact distribution",
    ("inputs", "probs"): "takes probabilities (the temperature softmax of the logits) instead of logits",
    ("outputs", "in_place"): "writes its outputs into its argument tensors",
    ("precision", "float32"): "computes probabilities in float32: its floats are compared by the float32 "
                              "tolerance entry (token ids and indices still exactly)",
}
SEMANTIC = ("topk_ties", "topp_ties", "accept_rule", "argmax_nan")


class ConventionError(ValueError):
    """An implementation declared a convention key or value this suite does not know."""


def _checked(where: str, declared) -> dict:
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise ConventionError(f"{where}: expected a dict of convention -> value, got {type(declared).__name__}")
    for key, value in declared.items():
        if key not in CONVENTIONS:
            raise ConventionError(f"{where}: unknown convention {key!r}; known: {sorted(CONVENTIONS)}")
        if value not in CONVENTIONS[key]:
            raise ConventionError(f"{where}: convention {key!r} = {value!r}; expected one of {CONVENTIONS[key]}")
    return dict(declared)


def conventions_for(impl, op_name: str) -> dict[str, str]:
    """The conventions `impl` follows for `op_name` (specverify's own where it declares nothing)."""
    if impl is None:
        return dict(SPECVERIFY)
    merged = dict(SPECVERIFY)
    merged.update(_checked(f"{type(impl).__name__}.conventions", getattr(impl, "conventions", None)))
    per_op = getattr(impl, "op_conventions", None) or {}
    unknown = sorted(set(per_op) - known_ops())
    if unknown:
        raise ConventionError(f"{type(impl).__name__}.op_conventions names no registry or law op: {unknown}")
    merged.update(_checked(f"{type(impl).__name__}.op_conventions[{op_name!r}]", per_op.get(op_name)))
    return merged


def known_ops() -> set:
    from specverify.conformance.laws import LAWS
    from specverify.conformance.registry import REGISTRY
    return set(REGISTRY) | set(LAWS)


def named_differences(op, conventions: dict) -> list[tuple[str, str]]:
    """(key, value) of the declared semantic conventions that differ from specverify's and that the
    op's reference knows: the differences a conformance run names for this op."""
    return [(key, conventions[key]) for key in op.conventions if conventions[key] != SPECVERIFY[key]]


def reference_for(op, conventions: dict):
    """The op's reference under the declared conventions (its own `ref` when none differs)."""
    chosen = {key: value for key, value in named_differences(op, conventions)}
    return functools.partial(op.ref, **chosen) if chosen else op.ref


def alternatives(op, conventions: dict):
    """(label, reference) for every other combination of the op's semantic conventions: what a
    failing implementation may follow instead of what it declared (the report's hint)."""
    keys = list(op.conventions)
    combos = [{}]
    for key in keys:
        combos = [{**c, key: v} for c in combos for v in CONVENTIONS[key]]
    declared = {key: conventions[key] for key in keys}
    for combo in combos:
        if combo == declared:
            continue
        label = ", ".join(f"{k}={v}" for k, v in combo.items())
        yield label, functools.partial(op.ref, **combo)


def tolerance(op, conventions: dict):
    """The tolerance table entries an op's CLOSE outputs are compared by under the conventions."""
    if conventions.get("precision") == "float32":
        return (op.tolerance_dtype, "float32")          # the loosest of the two applies
    return op.tolerance_dtype


def describe(key: str, value: str) -> str:
    return f"{key}={value}: {DIFFERENCES.get((key, value), 'specverify semantics')}"
