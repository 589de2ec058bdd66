"""Comparison of obtained outputs with a golden's: leaf by leaf under the exact / close rules,
with the statistics a failure reports."""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from specverify import dtypes
from specverify.golden.errors import CLOSE, EXACT
from specverify.golden.trees import _dtype_name, _join

FIRST_MISMATCHES = 5


@dataclasses.dataclass
class LeafDiff:
    """One output leaf that differs: a structural problem, or values outside its rule."""
    path: str
    rule: str
    problem: str | None = None
    differ: int = 0
    total: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    firsts: tuple[str, ...] = ()
    tolerance: str = ""

    def message(self) -> str:
        where = self.path or "<output>"
        if self.problem:
            return f"{where}: {self.problem}"
        rule = f"{self.rule}, {self.tolerance}" if self.tolerance else self.rule
        return (f"{where} ({rule}): {self.differ} of {self.total} values differ; max abs err {self.max_abs:.6g}, "
                f"max rel err {self.max_rel:.6g}; first (index: got vs want): {'; '.join(self.firsts)}")


@dataclasses.dataclass
class Comparison:
    leaves: int = 0
    values: int = 0
    declined: list[str] = dataclasses.field(default_factory=list)
    diffs: list[LeafDiff] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diffs

    def message(self, limit: int = 12) -> str:
        lines = [d.message() for d in self.diffs[:limit]]
        if len(self.diffs) > limit:
            lines.append(f"... and {len(self.diffs) - limit} more differing leaves")
        head = f"{len(self.diffs)} of {self.leaves} output leaves differ ({self.values} values compared)"
        return head + "".join(f"\n  {ln}" for ln in lines)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _array_like(x) -> bool:
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)) or _is_number(x):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(_is_number(v) for v in x)


def _as_array(x) -> tuple[np.ndarray, str]:
    """(values as int64 / float64 / bool / complex128 numpy, kind 'b' 'i' 'f' 'c')."""
    if isinstance(x, torch.Tensor):
        t = x.detach().to("cpu")
        if t.dtype == torch.bool:
            return t.numpy().copy(), "b"
        if t.is_complex():
            return t.to(torch.complex128).numpy(), "c"
        if t.is_floating_point():
            return t.to(torch.float64).numpy(), "f"
        return t.to(torch.int64).numpy(), "i"
    arr = np.asarray(x)
    kind = arr.dtype.kind
    if kind == "b":
        return arr, "b"
    if kind in "iu":
        return arr.astype(np.int64), "i"
    if kind == "f":
        return arr.astype(np.float64), "f"
    if kind == "c":
        return arr.astype(np.complex128), "c"
    raise TypeError(f"not a numeric array: {arr.dtype}")


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (np.bool_, bool)):
        return str(bool(v))
    if isinstance(v, (complex, np.complexfloating)):
        return repr(complex(v))
    return str(int(v))


def compare_arrays(got, want, rule: str, tolerance_dtype: str, path: str = "") -> LeafDiff | None:
    """None when `got` matches `want` under `rule`; else the LeafDiff with its statistics."""
    g, gk = _as_array(got)
    w, wk = _as_array(want)
    if gk != wk:
        names = {"b": "bool", "i": "integer", "f": "float", "c": "complex"}
        return LeafDiff(path, rule, f"dtype kind {names[gk]} ({_describe(got)}), want {names[wk]} ({_describe(want)})")
    if g.shape != w.shape:
        return LeafDiff(path, rule, f"shape {list(g.shape)}, want {list(w.shape)}")
    tol_text = ""
    if gk == "f":
        gn, wn = np.isnan(g), np.isnan(w)
        if rule == CLOSE:
            tol = dtypes.TOLERANCES[tolerance_dtype]
            tol_text = f"{tolerance_dtype} tolerance atol {tol.atol:g} rtol {tol.rtol:g}"
            with np.errstate(invalid="ignore", over="ignore"):
                same = np.isclose(g, w, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        else:
            same = (g.view(np.int64) == w.view(np.int64)) | (gn & wn)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(g - w)
        err = np.where((g == w) | (gn & wn), 0.0, np.where(np.isnan(err), np.inf, err))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(err == 0, 0.0, err / np.abs(w))
        rel = np.where(np.isnan(rel), np.inf, rel)
    elif gk == "c":
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        err = np.where(same, 0.0, np.abs(g - w))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(err == 0, 0.0, err / np.abs(w))
    else:
        same = g == w
        err = np.abs(g.astype(np.float64) - w.astype(np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(err == 0, 0.0, err / np.abs(w.astype(np.float64)))
    if bool(np.all(same)):
        return None
    bad = np.argwhere(~np.asarray(same))
    firsts = tuple(f"{list(int(i) for i in idx)}: {_fmt(g[tuple(idx)])} vs {_fmt(w[tuple(idx)])}"
                   for idx in bad[:FIRST_MISMATCHES])
    return LeafDiff(path, rule, None, int(bad.shape[0]), int(np.size(same)), float(np.max(err, initial=0.0)),
                    float(np.max(rel, initial=0.0)), firsts, tol_text)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {_dtype_name(x.dtype)}"
    if isinstance(x, np.ndarray):
        return f"ndarray {x.dtype}"
    return type(x).__name__


def compare(got, want, *, rules: Mapping[str, str], tolerance_dtype: str, allow_declined: bool = False) -> Comparison:
    """Every leaf of `want` against `got`. allow_declined: a None where the golden holds a value is
    an output the implementation declared not comparable (counted in `declined`, not compared) —
    the registry's convention for the optimized side, never allowed for the reference."""
    result = Comparison()

    def leaf(g, w, path, rule):
        result.leaves += 1
        if allow_declined and g is None and w is not None:
            result.declined.append(path or "<output>")
            return
        ga, wa = _array_like(g), _array_like(w)
        if ga and wa:
            diff = compare_arrays(g, w, rule, tolerance_dtype, path)
            result.values += int(np.size(_as_array(w)[0]))
            if diff:
                result.diffs.append(diff)
            return
        result.values += 1
        if ga or wa or type(g) is not type(w):
            result.diffs.append(LeafDiff(path, rule, f"got a {_describe(g)} ({_short(g)}), want a {_describe(w)} "
                                                     f"({_short(w)})"))
        elif g != w:
            result.diffs.append(LeafDiff(path, rule, f"got {_short(g)}, want {_short(w)}"))

    def walk(g, w, path, rule):
        if isinstance(w, dict) or isinstance(g, dict):
            if not (isinstance(w, dict) and isinstance(g, dict)):
                result.diffs.append(LeafDiff(path, rule, f"got a {type(g).__name__}, want a {type(w).__name__}"))
                return
            keys = list(w) + [k for k in g if k not in w]
            for k in keys:
                sub = _join(path, k)
                if k not in g:
                    result.diffs.append(LeafDiff(sub, rule, "in the golden, missing from the obtained outputs"))
                elif k not in w:
                    result.diffs.append(LeafDiff(sub, rule, "in the obtained outputs, not in the golden"))
                else:
                    walk(g[k], w[k], sub, rules.get(k, rule) if isinstance(k, str) else rule)
            return
        seq = (list, tuple)
        if isinstance(w, seq) and isinstance(g, seq) and not (_array_like(g) and _array_like(w)):
            if len(g) != len(w):
                result.diffs.append(LeafDiff(path, rule, f"{len(g)} items, want {len(w)}"))
                return
            for i, (a, b) in enumerate(zip(g, w)):
                walk(a, b, f"{path}[{i}]", rule)
            return
        leaf(g, w, path, rule)

    walk(got, want, "", EXACT)
    return result


def _short(x) -> str:
    text = repr(x) if not isinstance(x, torch.Tensor) else f"tensor{list(x.shape)}"
    return text if len(text) <= 60 else text[:57] + "..."
