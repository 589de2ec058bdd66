"""Every collected test gets a feature, a dtype and an algorithm: the row of `specverify matrix`.

feature, algorithm: from the feature map (tests/matrix/features.toml: node-id prefix -> feature,
algorithm; longest prefix wins). An entry with `per_op = true` takes the registry op's name as the
feature (the `op` parameter's `.name`, else the op whose name starts the parametrization id, for
the error-input tests). A parameter called `algorithm` overrides the entry's algorithm. A test no
entry covers: feature = its file stem, algorithm "-".

dtype: the `logits_dtype` parameter, then `dtype`, then a `logits_dtype` / `dtype` key of a dict
parameter (the all-pairs case dicts), then the first parameter whose value is a dtype name of
specverify.dtypes.DTYPES; a torch.dtype counts by its name. None of these: "-".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

ALGORITHMS = ("eagle", "naive_eagle", "mtp_dflash", "target", "-")   # mtp_dflash: the MTP and DFlash chain drafts
NONE = "-"
ENTRY_KEYS = {"feature": str, "algorithm": str, "per_op": bool}
DTYPE_KEYS = ("logits_dtype", "dtype")


class FeatureMapError(ValueError):
    """features.toml is malformed; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class FeatureEntry:
    prefix: str
    feature: str
    algorithm: str
    per_op: bool = False


@dataclasses.dataclass(frozen=True)
class FeatureMap:
    entries: tuple[FeatureEntry, ...] = ()
    source: str = ""

    def lookup(self, nodeid: str) -> FeatureEntry | None:
        best = None
        for e in self.entries:
            if nodeid.startswith(e.prefix) and (best is None or len(e.prefix) > len(best.prefix)):
                best = e
        return best


def read_toml(path: Path, error: type[ValueError]) -> dict:
    """The parsed file; `error` (a ValueError subclass) naming the file when it cannot be read."""
    try:
        import tomllib
    except ImportError:                     # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise error(f"{path}: reading it needs Python >= 3.11 (tomllib) or the tomli package") from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise error(f"{path}: cannot be read: {e}") from None


def load_features(path: Path) -> FeatureMap:
    """The feature map of `path`; an absent file is an empty map (every test falls back to its stem)."""
    if not path.exists():
        return FeatureMap((), str(path))
    data = read_toml(path, FeatureMapError)
    extra = sorted(set(data) - {"features"})
    if extra:
        raise FeatureMapError(f"{path}: unknown top-level key(s) {extra}; expected only [features]")
    table = data.get("features", {})
    if not isinstance(table, dict):
        raise FeatureMapError(f"{path}: [features] must be a table of prefix = {{ feature, algorithm }}")
    entries = []
    for prefix, spec in table.items():
        where = f"{path}: entry {prefix!r}"
        if not prefix.strip():
            raise FeatureMapError(f"{where}: the node-id prefix is empty")
        if not isinstance(spec, dict):
            raise FeatureMapError(f"{where}: expected an inline table {{ feature = ..., algorithm = ... }}")
        unknown = sorted(set(spec) - set(ENTRY_KEYS))
        if unknown:
            raise FeatureMapError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(ENTRY_KEYS)}")
        for key in ("feature", "algorithm"):
            if key not in spec:
                raise FeatureMapError(f"{where}: missing key {key!r}")
        for key, kind in ENTRY_KEYS.items():
            if key in spec and not isinstance(spec[key], kind):
                raise FeatureMapError(f"{where}: {key} must be a {kind.__name__}, got {spec[key]!r}")
        if not spec["feature"].strip():
            raise FeatureMapError(f"{where}: feature is empty")
        if spec["algorithm"] not in ALGORITHMS:
            raise FeatureMapError(f"{where}: algorithm {spec['algorithm']!r} is not one of {ALGORITHMS}")
        entries.append(FeatureEntry(prefix, spec["feature"], spec["algorithm"], spec.get("per_op", False)))
    return FeatureMap(tuple(entries), str(path))


def _dtype_name(value: Any, known: Mapping[str, Any]) -> str | None:
    if isinstance(value, str):
        return value if value in known else None
    text = str(value)
    if text.startswith("torch."):        # a torch.dtype
        name = text[len("torch."):]
        return name if name in known else None
    return None


def classify_dtype(params: Mapping[str, Any], known: Mapping[str, Any]) -> str:
    """The dtype of a test from its parametrization (`known`: the dtype registry's names)."""
    for key in DTYPE_KEYS:
        if key in params and (name := _dtype_name(params[key], known)):
            return name
    for value in params.values():
        if isinstance(value, dict):
            for key in DTYPE_KEYS:
                if key in value and (name := _dtype_name(value[key], known)):
                    return name
    for value in params.values():
        if isinstance(value, str) and value in known:
            return value
    return NONE


def _algorithm_param(value: Any) -> str | None:
    if isinstance(value, str):
        head = value.split("-")[0]
        if head in ("eagle", "target"):
            return head
    return None


def _op_name(params: Mapping[str, Any], param_id: str, registry: Mapping[str, Any]) -> str | None:
    op = params.get("op")
    name = getattr(op, "name", None)
    if isinstance(name, str) and name:
        return name
    # The error-input tests carry an ErrorInput, and their id starts with "<op name>-".
    matches = [n for n in registry if param_id.startswith(f"{n}-")]
    return max(matches, key=len) if matches else None


def classify(nodeid: str, params: Mapping[str, Any], fmap: FeatureMap, known_dtypes: Mapping[str, Any],
             param_id: str = "", registry: Mapping[str, Any] | None = None) -> tuple[str, str, str]:
    """(feature, dtype, algorithm) of one test."""
    entry = fmap.lookup(nodeid)
    if entry is None:
        feature, algorithm = PurePosixPath(nodeid.split("::")[0]).stem, NONE
    else:
        feature, algorithm = entry.feature, entry.algorithm
        if entry.per_op:
            feature = _op_name(params, param_id, registry or {}) or feature
    algorithm = _algorithm_param(params.get("algorithm")) or algorithm
    return feature, classify_dtype(params, known_dtypes), algorithm


def parse_filter(option: str, text: str | None, choices) -> frozenset[str] | None:
    """`a,b,c` -> the set; None when the option is not given. ValueError naming the option for an
    unknown or empty name."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"{option}={text!r}: expected a comma-separated list of names, e.g. float32,bfloat16")
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise ValueError(f"{option}: unknown name(s) {unknown}; choose from {sorted(choices)}")
    return frozenset(names)


def keep(dtype: str, algorithm: str, dtypes: frozenset[str] | None, algorithms: frozenset[str] | None) -> bool:
    """Whether a test of (dtype, algorithm) survives the filters (None: no filter). "-" is a name
    like any other: a dtype filter keeps the tests without a dtype only when it lists "-", so the
    table shows exactly the rows asked for."""
    return (dtypes is None or dtype in dtypes) and (algorithms is None or algorithm in algorithms)
