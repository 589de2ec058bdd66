"""Argument checks shared by the public entry points.

The rule, everywhere in the public API: a value of the wrong *type* raises `TypeError`, a value of
the right type outside its bound raises `ValueError` (modules may raise a subclass of either, such
as `MalformedMessage` or a `TransportError`). Both name the argument and the bound it broke.

- an int is an int: Python `int` or a numpy integer, never a `bool` (nor `numpy.bool_`), a float,
  a string or a 0-d tensor;
- a real number is an `int` or a `float` (numpy floats included), never a `bool` or a string;
  NaN and infinities are values, refused by the bound unless the argument allows them.

Standard library only. The ring transport keeps its own two-line checks of the same rule, because
spawned peers load `transport.py` alone, without the package.
"""

from __future__ import annotations

import importlib
import math
import numbers


def is_int(x) -> bool:
    """True for Python ints and numpy integers; False for bools, floats, strings, tensors."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and type(x).__name__ != "bool_"


def is_real(x) -> bool:
    """True for ints and floats (numpy scalars included); False for bools, strings, tensors."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and type(x).__name__ != "bool_"


def check_int(name: str, value, lo: int | None = None, hi: int | None = None, *, why: str = "") -> int:
    """`value` as a Python int in [lo, hi] (None = unbounded), else TypeError / ValueError."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {_range(lo, hi)}{f' ({why})' if why else ''}, got {value}")
    return value


def check_real(name: str, value, lo: float | None = None, hi: float | None = None, *,
               lo_open: bool = False, hi_open: bool = False, finite: bool = True, why: str = "") -> float:
    """`value` as a Python float, finite unless `finite=False`, in the given interval."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number{_interval(lo, hi, lo_open, hi_open)}, got {value!r}")
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and (value >= hi if hi_open else value > hi)
    if bad_lo or bad_hi:
        raise ValueError(f"{name} must be{_interval(lo, hi, lo_open, hi_open)}"
                         f"{f' ({why})' if why else ''}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_choice(name: str, value, allowed) -> str:
    """A string among `allowed`: TypeError for a non-string, ValueError for an unknown one."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {tuple(allowed)}, got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return "an int"


def _interval(lo, hi, lo_open, hi_open) -> str:
    lo, hi = (None if v is None else f"{v:g}" for v in (lo, hi))
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" {'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f" {'<' if hi_open else '<='} {hi}"
    return f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def import_named(spec: str, *, label: str, example: str):
    """The object a `module:attr` string names (`attr` may be dotted). ValueError, prefixed with
    `label` (the option or variable the string came from), when the string is malformed, the
    module does not import, or it lacks the attribute."""
    module, sep, attr = str(spec).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{label}: expected module:object, e.g. {example}")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{label}: cannot import module {module!r} ({e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{label}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
