"""Expected failures and skips per platform profile, as data (tests/expectations/*.toml).

One file per profile name (`cpu.toml`, `cuda.toml`, `rocm.toml`, `cuda-emulated.toml`,
`rocm-emulated.toml`) plus `all.toml` for every profile; each holds `[[expect]]` tables:

    test   = node-id prefix (a plain string prefix of the test id)        required
    kind   = "xfail" | "skip"                                              required
    reason = why                                                           required
    raises = exception class name (builtin, or dotted path module.Class)   xfail only, required there
    dtype  = dtype name: only tests classified with this dtype             optional
    when   = an environment condition of tests/matrix/conditions.py        optional
             (the entry applies only where that condition holds)

Only the active profile's file and all.toml apply (the profile's own entries first, then all.toml,
each in file order); a test takes the FIRST entry that matches it. An xfail becomes
`pytest.mark.xfail(strict=True, raises=<class>, reason="[<file> #N] <reason>")`, a skip
`pytest.mark.skip(reason="[<file> #N] <reason>")`.

Stale entries are reported (never silently kept):
- "passed": an xfail whose test passed (the strict xfail fails that test, XPASS(strict));
- "unmatched": an entry that matches no collected test, or only tests an earlier entry claims.
  This is judged only when the collection covered the whole suite (see `whole_suite`): a run
  narrowed to some files cannot tell a stale entry from one for a file it did not collect.
  (-k, -m, --deselect, --sv-dtypes and the slow gate do not narrow it: entries are matched
  against every collected test before any deselection.)

Every file of the directory is validated, whichever profile is active, so a typo in rocm.toml
is caught on a CPU box too.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from tests.matrix import conditions as mconditions
from tests.matrix.classify import read_toml

PROFILE_NAMES = ("cpu", "cuda", "rocm", "cuda-emulated", "rocm-emulated")
ALL = "all"
KINDS = ("xfail", "skip")
ENTRY_KEYS = {"test": str, "kind": str, "reason": str, "raises": str, "dtype": str, "when": str}
REQUIRED = ("test", "kind", "reason")
PASSED, UNMATCHED = "passed", "unmatched"


class ExpectationError(ValueError):
    """An expectations file is malformed; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class Entry:
    file: str                    # as shown: relative to the root when inside it
    index: int                   # 1-based position of its [[expect]] table in the file
    scope: str                   # a profile name, or "all"
    test: str
    kind: str
    reason: str
    raises: type | None = None
    raises_name: str | None = None
    dtype: str | None = None
    when: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.file} #{self.index}"

    @property
    def tagged_reason(self) -> str:
        return f"[{self.ref}] {self.reason}"

    def matches(self, nodeid: str, dtype: str) -> bool:
        return nodeid.startswith(self.test) and (self.dtype is None or self.dtype == dtype)

    def as_dict(self) -> dict:
        return {"ref": self.ref, "file": self.file, "index": self.index, "scope": self.scope, "test": self.test,
                "kind": self.kind, "reason": self.reason, "raises": self.raises_name, "dtype": self.dtype,
                "when": self.when}


def resolve_exception(name: str) -> type:
    """A builtin exception class by name, or module.Class; ValueError when it is neither."""
    obj = getattr(builtins, name, None) if "." not in name else None
    if obj is None and "." in name:
        module, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            obj = None
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ValueError(f"raises {name!r} is neither a builtin exception nor an importable exception class "
                         f"(module.Class)")
    return obj


def _entry(record, where: str, file: str, index: int, scope: str, dtypes: Iterable[str]) -> Entry:
    if not isinstance(record, dict):
        raise ExpectationError(f"{where}: expected a table")
    unknown = sorted(set(record) - set(ENTRY_KEYS))
    if unknown:
        raise ExpectationError(f"{where}: unknown key(s) {unknown}; allowed: {list(ENTRY_KEYS)}")
    for key in REQUIRED:
        if key not in record:
            raise ExpectationError(f"{where}: missing key {key!r}")
    for key, kind in ENTRY_KEYS.items():
        if key in record and not isinstance(record[key], kind):
            raise ExpectationError(f"{where}: {key} must be a string, got {record[key]!r}")
    if not record["test"].strip():
        raise ExpectationError(f"{where}: test (a node-id prefix) is empty")
    if record["kind"] not in KINDS:
        raise ExpectationError(f"{where}: kind {record['kind']!r} is not one of {KINDS}")
    if not record["reason"].strip():
        raise ExpectationError(f"{where}: reason is empty")
    raises = None
    if record["kind"] == "xfail":
        if "raises" not in record:
            raise ExpectationError(f"{where}: an xfail must name the exception it expects (raises = \"...\")")
        try:
            raises = resolve_exception(record["raises"])
        except ValueError as e:
            raise ExpectationError(f"{where}: {e}") from None
    elif "raises" in record:
        raise ExpectationError(f"{where}: raises applies to kind = \"xfail\" only (a skip runs nothing)")
    dtype = record.get("dtype")
    known = list(dtypes)
    if dtype is not None and dtype not in known:
        raise ExpectationError(f"{where}: dtype {dtype!r} is not a registered dtype; choose from {known}")
    when = record.get("when")
    if when is not None and when not in mconditions.CONDITIONS:
        raise ExpectationError(f"{where}: when {when!r} is not a known condition; choose from "
                               f"{sorted(mconditions.CONDITIONS)}")
    return Entry(file, index, scope, record["test"], record["kind"], record["reason"], raises,
                 record.get("raises"), dtype, when)


def _shown(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return str(path)


def load_file(path: Path, dtypes: Iterable[str], root: Path | None = None) -> list[Entry]:
    shown = _shown(path, root)
    scope = path.stem
    if path.suffix != ".toml" or scope not in (*PROFILE_NAMES, ALL):
        raise ExpectationError(f"{shown}: unknown expectations file; expected <profile>.toml for a profile of "
                               f"{PROFILE_NAMES}, or {ALL}.toml")
    data = read_toml(path, ExpectationError)
    extra = sorted(set(data) - {"expect"})
    if extra:
        raise ExpectationError(f"{shown}: unknown top-level key(s) {extra}; entries are [[expect]] tables")
    records = data.get("expect", [])
    if not isinstance(records, list):
        raise ExpectationError(f"{shown}: `expect` must be an array of tables ([[expect]])")
    dtypes = list(dtypes)
    return [_entry(r, f"{shown} [[expect]] #{i}", shown, i, scope, dtypes) for i, r in enumerate(records, 1)]


def load_dir(directory: Path, dtypes: Iterable[str], root: Path | None = None) -> list[Entry]:
    """Every entry of every *.toml file of `directory` (validated); other files are ignored."""
    if not directory.is_dir():
        raise ExpectationError(f"{directory}: the expectations directory does not exist")
    entries: list[Entry] = []
    for path in sorted(directory.glob("*.toml")):
        entries += load_file(path, dtypes, root)
    return entries


def for_profile(entries: Sequence[Entry], profile: str,
                holds: Callable[[str], bool] = mconditions.holds) -> list[Entry]:
    """The entries that apply under `profile`: its own file first, then all.toml; an entry with a
    `when` only where `holds(when)` (the others are inactive, never reported stale)."""
    active = [e for e in entries if e.when is None or holds(e.when)]
    return [e for e in active if e.scope == profile] + [e for e in active if e.scope == ALL]


@dataclasses.dataclass
class Matching:
    applied: dict[str, Entry]                 # node id -> the entry it takes
    claimed: dict[str, list[str]]             # entry ref -> node ids it was applied to
    candidates: dict[str, list[str]]          # entry ref -> node ids it matches (applied or not)


def match(entries: Sequence[Entry], items: Iterable[tuple[str, str]]) -> Matching:
    """items: (node id, dtype). Each item takes the first entry that matches it."""
    m = Matching({}, {e.ref: [] for e in entries}, {e.ref: [] for e in entries})
    for nodeid, dtype in items:
        for e in entries:
            if e.matches(nodeid, dtype):
                m.candidates[e.ref].append(nodeid)
                if nodeid not in m.applied:
                    m.applied[nodeid] = e
                    m.claimed[e.ref].append(nodeid)
    return m


def whole_suite(args: Sequence[str], invocation_dir: Path, rootpath: Path, testpaths: Sequence[str],
                narrowing: Sequence[str] = ()) -> tuple[bool, str]:
    """(True, "") when the collection covers the whole suite: every argument is the root or a
    testpaths directory (or none is given); else (False, why). `narrowing`: options in force that
    narrow collection (--ignore, --lf, ...)."""
    if narrowing:
        return False, f"collection narrowed by {', '.join(narrowing)}"
    whole = {rootpath.resolve(), *((rootpath / t).resolve() for t in testpaths)}
    for arg in args:
        if "::" in arg or (invocation_dir / arg).resolve() not in whole:
            return False, f"collection narrowed to {arg!r}"
    return True, ""


def stale(entries: Sequence[Entry], m: Matching | None, whole: bool,
          passed: Mapping[str, Sequence[str]]) -> list[dict]:
    """The stale entries: xfails whose test passed (always), entries no test takes (whole suite only)."""
    out = []
    by_ref = {e.ref: e for e in entries}
    for ref, tests in passed.items():
        if ref in by_ref and tests:
            out.append({**by_ref[ref].as_dict(), "why": PASSED,
                        "detail": f"the expected failure did not happen: {len(tests)} test(s) passed (XPASS(strict))",
                        "tests": sorted(tests)})
    if whole and m is not None:
        for e in entries:
            if m.claimed.get(e.ref):
                continue
            if not m.candidates.get(e.ref):
                detail = "matches no collected test"
            else:
                owners = sorted({m.applied[n].ref for n in m.candidates[e.ref]})
                detail = f"every test it matches takes an earlier entry ({', '.join(owners)})"
            out.append({**e.as_dict(), "why": UNMATCHED, "detail": detail, "tests": []})
    return out


def format_stale(rows: Sequence[dict]) -> list[str]:
    return [f"{r['ref']} ({r['kind']} {r['test']!r}): {r['detail']}"
            + (f": {', '.join(r['tests'][:5])}{' ...' if len(r['tests']) > 5 else ''}" if r["tests"] else "")
            for r in rows]
