"""The catalogue's records (GoldenCase, AcceptScenario, BaselineSet) and the loader of a
catalogue named `module:attr`."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Mapping

from specverify import dtypes
from specverify.golden.errors import RULES, ROOT, check_name
from specverify.validation import import_named

DEFAULT_CATALOGUE = "tests.support.golden_catalogue:CATALOGUE"


def _always(profile) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    """One golden: how to build its inputs, the two sides that must reproduce its outputs, and how
    to compare them.

    build() -> (inputs tree, meta dict of JSON values); reference(inputs) -> outputs tree;
    optimized(inputs, profile) -> outputs tree (None: no optimized side); rules: output field ->
    EXACT | CLOSE (a leaf takes the rule of the nearest enclosing dict key named here, EXACT when
    none is); applies(profile): whether the optimized side runs on that profile; views(got, want,
    side) -> (got, want, notes): what is compared (e.g. a near-tie cut), None = everything;
    check_inputs(inputs) -> None, or why the stored inputs no longer rebuild what they did (a model
    builder drift): reported as status "drift" with an InputDrift message. platform_dependent=False:
    the optimized side does not read the profile's policies (the test suite then runs it on the
    native profile only, as test_ops_differential does)."""
    name: str
    build: Callable[[], tuple[Any, dict]]
    reference: Callable[[Any], Any]
    optimized: Callable[[Any, Any], Any] | None
    rules: Mapping[str, str]
    tolerance_dtype: str = "float64"
    applies: Callable[[Any], bool] = _always
    marks: tuple[str, ...] = ()
    views: Callable[[Any, Any, str], tuple[Any, Any, list]] | None = None
    check_inputs: Callable[[Any], str | None] | None = None
    platform_dependent: bool = True

    def __post_init__(self):
        check_name(self.name)
        bad = {k: v for k, v in self.rules.items() if v not in RULES}
        if bad:
            raise ValueError(f"golden {self.name}: rules {bad} are not one of {RULES}")
        if self.tolerance_dtype not in dtypes.TOLERANCES:
            raise ValueError(f"golden {self.name}: tolerance_dtype {self.tolerance_dtype!r} has no entry in "
                             f"specverify.dtypes.TOLERANCES")


@dataclasses.dataclass(frozen=True)
class AcceptScenario:
    """One accept-length scenario: measure(profile) -> {"mean": float, "cycles": int, "tokens": int}."""
    name: str
    params: Mapping[str, Any]
    measure: Callable[[Any], dict]


@dataclasses.dataclass(frozen=True)
class BaselineSet:
    """Accept-length baselines per platform profile: `<root>/<name>/<profile>.json`."""
    name: str
    scenarios: tuple[AcceptScenario, ...]
    tolerance: float
    marks: tuple[str, ...] = ()

    def __post_init__(self):
        check_name(self.name)
        if not (isinstance(self.tolerance, float) and 0.0 <= self.tolerance < 1.0):
            raise ValueError(f"baseline set {self.name}: tolerance must be a float in [0, 1), got {self.tolerance!r}")
        names = [s.name for s in self.scenarios]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"baseline set {self.name}: scenario names must be unique and non-empty: {names}")

    def file_name(self, profile_name: str) -> str:
        return f"{self.name}/{profile_name}"


def load_catalogue(spec: str = DEFAULT_CATALOGUE) -> list:
    """The catalogue `module:attr` names, imported with the repository root on sys.path."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    obj = import_named(spec, label=f"--catalogue {spec!r}", example=DEFAULT_CATALOGUE)
    items = list(obj)
    names = [i.name for i in items if isinstance(i, GoldenCase)]
    bad = [type(i).__name__ for i in items if not isinstance(i, (GoldenCase, BaselineSet))]
    if bad:
        raise ValueError(f"--catalogue {spec!r}: holds {bad}; expected GoldenCase and BaselineSet records")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"--catalogue {spec!r}: golden names used twice: {dup}")
    return items
