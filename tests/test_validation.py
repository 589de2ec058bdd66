"""The argument checks every public entry point shares (specverify/validation.py), pinned
exactly: what they return and the bound each message names. Written for the survivors of the
first generated-mutant campaign (docs/mutation/seed-0.md): every public API test went through
these checks, but none pinned the returned type or the wording of each kind of bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specverify.validation import check_choice, check_int, check_real, import_named


def test_check_int_returns_a_python_int():
    got = check_int("n", np.int64(3), 0, 5)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("lo, hi, value, bound", [
    (0, 3, 4, "in [0, 3]"), (0, None, -1, ">= 0"), (None, 3, 4, "<= 3"),
])
def test_check_int_names_the_bound_it_broke(lo, hi, value, bound):
    with pytest.raises(ValueError) as e:
        check_int("n", value, lo, hi)
    assert str(e.value) == f"n must be {bound}, got {value}"


def test_check_int_without_bounds_takes_any_int():
    assert check_int("n", -(2**70)) == -(2**70)


@pytest.mark.parametrize("kwargs, value, message", [
    (dict(), math.nan, "x must be a finite number, got nan"),
    (dict(lo=0.0), -1.0, "x must be >= 0, got -1.0"),
    (dict(lo=0.0, lo_open=True), 0.0, "x must be > 0, got 0.0"),
    (dict(hi=1.0), 2.0, "x must be <= 1, got 2.0"),
    (dict(hi=1.0, hi_open=True), 1.0, "x must be < 1, got 1.0"),
    (dict(lo=0.0, hi=1.0, lo_open=True), 0.0, "x must be in (0, 1], got 0.0"),
    (dict(lo=0.0, hi=1.0, hi_open=True), 1.0, "x must be in [0, 1), got 1.0"),
])
def test_check_real_names_the_interval(kwargs, value, message):
    with pytest.raises(ValueError) as e:
        check_real("x", value, **kwargs)
    assert str(e.value) == message


def test_check_choice_returns_the_choice():
    assert check_choice("mode", "b", ("a", "b")) == "b"
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        check_choice("mode", "c", ("a", "b"))


@pytest.mark.parametrize("spec", ["math", ":pi", "math:", ""])
def test_import_named_refuses_a_malformed_path(spec):
    with pytest.raises(ValueError, match=r"^--opt: expected module:object, e\.g\. pkg\.mod:NAME$"):
        import_named(spec, label="--opt", example="pkg.mod:NAME")


def test_import_named_follows_dotted_attributes():
    assert import_named("math:pi", label="--opt", example="x:y") is math.pi
    assert import_named("os:path.join", label="--opt", example="x:y").__name__ == "join"
    with pytest.raises(ValueError, match=r"--opt: module 'math' has no attribute 'nope'"):
        import_named("math:nope", label="--opt", example="x:y")
    with pytest.raises(ValueError, match=r"--opt: cannot import module 'no_such_module_x'"):
        import_named("no_such_module_x:y", label="--opt", example="x:y")
