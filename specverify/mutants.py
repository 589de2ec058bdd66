"""`python -m specverify mutants`: plant each mutant of the bug zoo into a temporary copy of the
tree, run the slice of the suite it names there, and report whether the slice fails (killed).

The zoo is data: every `tests/mutants/*.toml` file, one `[[mutant]]` table per mutant (format in
tests/mutants/README.md). A mutant whose target text is not found exactly once in its file is
refused, so a mutant cannot rot silently when the code moves.

The working tree is never written. One run copies the tree once per job; each mutant rewrites one
file of a copy and restores it afterwards. pytest runs in the copy with PYTHONPATH = the copy, and
a guard plugin records where `specverify`, `reference` and `tests` were imported from: a result
whose imports resolved outside the copy (an editable install shadowing it, say) is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COPY_ENTRIES = ("specverify", "reference", "tests", "conftest.py", "pyproject.toml", "docs", "golden",
                "README.md", "constraints", "scripts")
IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", "*.pyc",
                                "*.obtained*", "*.egg-info")
REQUIRED = {"name": str, "file": str, "target": str, "replacement": str, "why": str, "source": str,
            "tests": list}
OPTIONAL = {"keyword": str, "fast": bool, "needs": str}
DEVICES = ("cuda",)          # what `needs` may name: a slice whose killing tests run only there
NAME_RULE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
GUARDED_PACKAGES = ("specverify", "reference", "tests")
GUARD_MODULE = "_specverify_mutant_guard"
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-p", GUARD_MODULE, "-rfE", "--tb=line")
DEFAULT_TIMEOUT_S = 600.0

KILLED, SURVIVED, REFUSED, NOT_RUN = "killed", "survived", "refused", "not run"


class ZooError(ValueError):
    """The zoo's data is malformed: a file, a record or a selection the harness cannot use."""


class ImportLeak(RuntimeError):
    """`specverify` / `reference` / `tests` resolved outside the copy under test."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted bug: replace `target` (exactly once) by `replacement` in `file`."""

    name: str
    file: str               # relative to the repository root
    target: str
    replacement: str
    why: str
    source: str
    tests: tuple[str, ...]  # the slice: paths or node ids relative to the root
    keyword: str | None = None
    fast: bool = False
    needs: str | None = None  # "cuda": the slice can only kill it on a CUDA machine
    origin: str = ""        # the zoo file it came from, for messages

    def slice_args(self) -> list[str]:
        """The pytest arguments that select this mutant's slice."""
        return [*self.tests, *(["-k", self.keyword] if self.keyword else [])]


@dataclasses.dataclass
class Result:
    """What one mutant (or one baseline slice) did: status killed / survived / refused."""

    name: str
    status: str
    test: str = ""          # killed: the first failing test id; refused: empty
    seconds: float = 0.0
    detail: str = ""        # why refused / a note on a survivor

    @property
    def killed(self) -> bool:
        return self.status == KILLED


# ------------------------------------------------------------------------------------------
# the zoo: load and validate


def _read_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:                     # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ZooError("reading the zoo needs Python >= 3.11 (tomllib) or the tomli package") from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ZooError(f"{path}: not valid TOML: {e}") from None


def _check_path(root: Path, rel: str, what: str) -> str | None:
    """An error for a path that is absolute, escapes the root, is not copied, or does not exist."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return f"{what} {rel!r} must be a relative path inside the repository"
    if p.parts[0] not in COPY_ENTRIES:
        return f"{what} {rel!r} is outside the copied tree ({', '.join(COPY_ENTRIES)})"
    if not (root / p).exists():
        return f"{what} {rel!r} does not exist under {root}"
    return None


def _record_errors(record: dict, root: Path) -> list[str]:
    """Every problem of one `[[mutant]]` table, as messages without the location prefix."""
    errors = [f"unknown field {k!r} (allowed: {', '.join([*REQUIRED, *OPTIONAL])})"
              for k in record if k not in REQUIRED and k not in OPTIONAL]
    for key, kind in {**REQUIRED, **OPTIONAL}.items():
        if key not in record:
            if key in REQUIRED:
                errors.append(f"missing field {key!r}")
        elif not isinstance(record[key], kind):
            errors.append(f"field {key!r} must be a {kind.__name__}, got {type(record[key]).__name__}")
        elif kind is str and not record[key].strip():
            errors.append(f"field {key!r} is empty")
    if errors:
        return errors
    if not NAME_RULE.fullmatch(record["name"]):
        errors.append(f"name {record['name']!r} must be kebab-case (lower-case letters, digits, single dashes)")
    if "needs" in record and record["needs"] not in DEVICES:
        errors.append(f"field 'needs' must be one of {list(DEVICES)}, got {record['needs']!r}")
    if record.get("needs") and record.get("fast"):
        errors.append("a mutant with 'needs' cannot be fast: CPU CI cannot kill it")
    if record["target"] == record["replacement"]:
        errors.append("replacement equals target: the mutant changes nothing")
    errors += filter(None, [_check_path(root, record["file"], "file")])
    if not record["tests"]:
        errors.append("field 'tests' is empty: a mutant needs a slice of the suite to run")
    for t in record["tests"]:
        if not isinstance(t, str) or not t:
            errors.append(f"tests entry {t!r} must be a non-empty string")
        else:
            errors += filter(None, [_check_path(root, t.split("::")[0], "tests entry")])
    return errors


def _records(path: Path) -> list:
    data = _read_toml(path)
    extra = sorted(set(data) - {"mutant"})
    if extra or not isinstance(data.get("mutant"), list) or not data["mutant"]:
        raise ZooError(f"{path}: a zoo file holds [[mutant]] tables and nothing else "
                       f"(found keys {sorted(data)})")
    return data["mutant"]


def load_zoo(zoo_dir: Path, root: Path) -> list[Mutant]:
    """Every mutant of every `*.toml` in `zoo_dir`, validated; ZooError lists every problem found,
    each naming the file and the mutant."""
    zoo_dir, root = Path(zoo_dir), Path(root)
    files = sorted(zoo_dir.glob("*.toml"))
    if not files:
        raise ZooError(f"no *.toml zoo files in {zoo_dir}")
    errors, mutants, seen = [], [], {}
    for path in files:
        where = _shown(path, root)
        for i, record in enumerate(_records(path), 1):
            label = f"{where}: mutant #{i}"
            if not isinstance(record, dict):
                errors.append(f"{label}: must be a table")
                continue
            if isinstance(record.get("name"), str):
                label = f"{where}: mutant {record['name']!r} (#{i})"
            problems = _record_errors(record, root)
            errors += [f"{label}: {p}" for p in problems]
            if problems:
                continue
            if record["name"] in seen:
                errors.append(f"{label}: duplicate name, already defined in {seen[record['name']]}")
                continue
            seen[record["name"]] = label
            mutants.append(Mutant(**{**record, "tests": tuple(record["tests"])}, origin=where))
    if errors:
        raise ZooError(f"{len(errors)} problem(s) in the zoo {zoo_dir}:\n  " + "\n  ".join(errors))
    return mutants


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def select(mutants: list[Mutant], *, only=None, fast: bool = False) -> list[Mutant]:
    """The mutants named in `only` (all when None), restricted to `fast = true` ones if asked."""
    if only:
        known = {m.name for m in mutants}
        unknown = [n for n in only if n not in known]
        if unknown:
            raise ZooError(f"--only: unknown mutant(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(sorted(known))}")
        mutants = [m for m in mutants if m.name in set(only)]
    if fast:
        mutants = [m for m in mutants if m.fast]
    if not mutants:
        raise ZooError("the selection holds no mutant")
    return mutants


def target_refusal(mutant: Mutant, text: str) -> str | None:
    """Why `mutant` cannot be applied to `text` (its file's content), or None."""
    count = text.count(mutant.target)
    if count == 1:
        return None
    return (f"mutant {mutant.name!r}: target found {count} times in {mutant.file} "
            f"(must be exactly once; from {mutant.origin})")


def apply(mutant: Mutant, text: str) -> str:
    """`text` with the mutant planted; ZooError when the target is not found exactly once."""
    why = target_refusal(mutant, text)
    if why:
        raise ZooError(why)
    return text.replace(mutant.target, mutant.replacement, 1)


# ------------------------------------------------------------------------------------------
# the copies and the import guard

GUARD_SOURCE = '''"""pytest plugin written by specverify.mutants: records where the tree was imported from."""
import json, os, sys

def _files(module):
    f = getattr(module, "__file__", None)
    return [f] if f else list(getattr(module, "__path__", []))

def pytest_sessionfinish(session, exitstatus):
    root = os.path.realpath(os.environ["SPECVERIFY_MUTANT_ROOT"])
    mutated = os.environ.get("SPECVERIFY_MUTANT_FILE")
    mutated = os.path.join(root, mutated) if mutated else None
    outside, loaded, count = [], False, 0
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in %r:
            continue
        for f in _files(module):
            f = os.path.realpath(f)
            count += 1
            loaded = loaded or f == mutated
            if not f.startswith(root + os.sep):
                outside.append(name + ": " + f)
    with open(os.environ["SPECVERIFY_MUTANT_REPORT"], "w") as out:
        json.dump({"outside": outside, "mutated_loaded": loaded, "modules": count}, out)
''' % (GUARDED_PACKAGES,)


def make_copy(root: Path, dest: Path) -> Path:
    """Copy the entries of COPY_ENTRIES that exist under `root` into `dest` (caches skipped)."""
    dest.mkdir(parents=True)
    for entry in COPY_ENTRIES:
        src = root / entry
        if src.is_dir():
            shutil.copytree(src, dest / entry, ignore=IGNORE, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / entry)
    return dest


def child_env(copy: Path, guard_dir: Path, report: Path, mutated_file: str | None) -> dict:
    """The environment of a run in `copy`: only the copy (and the guard) on PYTHONPATH, one thread,
    derandomized hypothesis, no bytecode written (a restored file must never meet a stale .pyc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(copy), str(guard_dir)]), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", CI="1", SPECVERIFY_HYPOTHESIS_PROFILE="ci", PYTHONDONTWRITEBYTECODE="1",
               SPECVERIFY_MUTANT_ROOT=str(copy), SPECVERIFY_MUTANT_REPORT=str(report))
    env.pop("SPECVERIFY_MUTANT_FILE", None)
    if mutated_file:
        env["SPECVERIFY_MUTANT_FILE"] = mutated_file
    return env


def _inside(path: str, root: Path) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def check_imports(copy: Path, guard_dir: Path) -> None:
    """Import specverify and reference the way a run does; ImportLeak unless both come from `copy`."""
    code = "import json, specverify, reference; print(json.dumps([specverify.__file__, reference.__file__]))"
    env = child_env(copy, guard_dir, copy / ".unused-report", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=DEFAULT_TIMEOUT_S, encoding="utf-8")
    if proc.returncode != 0:
        raise ImportLeak(f"importing specverify and reference in the copy {copy} failed:\n{proc.stderr[-2000:]}")
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    leaks = [f for f in files if not _inside(f, copy)]
    if leaks:
        raise ImportLeak(f"in the copy {copy}, imports resolve outside it: {', '.join(leaks)} "
                         f"(an installed package shadows the copy; results would mean nothing)")


class Workspace:
    """A temporary directory with the guard plugin and `jobs` copies of the tree, lent one at a time."""

    def __init__(self, root: Path, jobs: int):
        self._tmp = tempfile.TemporaryDirectory(prefix="specverify-mutants-")
        base = Path(self._tmp.name)
        self.guard_dir = base / "guard"
        self.guard_dir.mkdir()
        (self.guard_dir / f"{GUARD_MODULE}.py").write_text(GUARD_SOURCE, encoding="utf-8")
        self.reports = base / "reports"
        self.reports.mkdir()
        self.copies = [make_copy(root, base / f"copy-{i}") for i in range(jobs)]
        self._free: queue.Queue = queue.Queue()
        for c in self.copies:
            self._free.put(c)
        self._count = 0
        self._lock = threading.Lock()
        self._devices: dict[str, bool] = {}

    def has(self, device: str) -> bool:
        """Whether this machine has `device`; asked once per run."""
        with self._lock:
            if device not in self._devices:
                self._devices[device] = device_available(device)
            return self._devices[device]

    def borrow(self) -> Path:
        return self._free.get()

    def give_back(self, copy: Path) -> None:
        self._free.put(copy)

    def report_path(self) -> Path:
        with self._lock:
            self._count += 1
            return self.reports / f"run-{self._count}.json"

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------
# one run of pytest in a copy


@dataclasses.dataclass
class Outcome:
    """A finished (or timed-out) pytest run and the guard's report (None if it never wrote one)."""

    returncode: int | None      # None: timed out
    output: str
    seconds: float
    report: dict | None


def run_pytest(copy: Path, guard_dir: Path, report: Path, args: list[str], *, mutated_file: str | None,
               timeout: float) -> Outcome:
    """`python -m pytest -x -q ... args` in `copy`; the process group is killed on timeout."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *PYTEST_ARGS, *args], cwd=copy,
                            env=child_env(copy, guard_dir, report, mutated_file), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, encoding="utf-8")
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    seconds = time.perf_counter() - start
    data = json.loads(report.read_text(encoding="utf-8")) if report.exists() else None
    return Outcome(code, output, seconds, data)


def first_failure(output: str) -> str | None:
    """The first `FAILED id` / `ERROR id` of pytest's short summary (-rfE), or None."""
    for line in output.splitlines():
        for word in ("FAILED ", "ERROR "):
            if line.startswith(word):
                return _node_id(line[len(word):])
    return None


def _node_id(rest: str) -> str:
    """The node id at the start of `id - message`: the first ' - ' outside the [parameters]."""
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth == 0 and rest.startswith(" - ", i):
            return rest[:i]
    return rest.strip()


def classify(name: str, out: Outcome) -> Result:
    """Turn a run into a Result; a run whose imports left the copy is refused, whatever it did."""
    res = Result(name, REFUSED, seconds=out.seconds)
    if out.returncode is None:      # killed before the guard could report; the copy passed check_imports
        res.status, res.test = KILLED, f"(timeout after {out.seconds:.0f} s)"
    elif out.report is None:
        res.detail = f"the import guard wrote no report (pytest exit {out.returncode}): {_tail(out.output)}"
    elif out.report["outside"]:
        res.detail = "imports resolved outside the copy: " + "; ".join(out.report["outside"][:5])
    elif out.returncode == 0:
        res.status = SURVIVED
        if not out.report["mutated_loaded"]:
            res.detail = "the slice never imported the mutated file"
    elif out.returncode in (1, 2):
        res.status, res.test = KILLED, first_failure(out.output) or f"(pytest exit {out.returncode})"
    elif out.returncode == 5:
        res.detail = "the slice collected no tests (check its tests and keyword)"
    else:
        res.detail = f"pytest exit {out.returncode} (usage or internal error): {_tail(out.output)}"
    return res


def _tail(output: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:])


# ------------------------------------------------------------------------------------------
# the run over a selection


def device_available(device: str) -> bool:
    """Whether this machine has `device` (one of DEVICES), asked in a child process so the harness
    itself never initialises a GPU context."""
    probe = {"cuda": "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"}[device]
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def run_mutant(mutant: Mutant, ws: Workspace, timeout: float) -> Result:
    """Plant `mutant` in a borrowed copy, run its slice, restore the file."""
    if mutant.needs and not ws.has(mutant.needs):
        return Result(mutant.name, NOT_RUN, detail=f"needs a {mutant.needs} device; this machine has none")
    copy = ws.borrow()
    path = copy / mutant.file
    original = path.read_text(encoding="utf-8")
    try:
        why = target_refusal(mutant, original)
        if why:
            return Result(mutant.name, REFUSED, detail=why)
        path.write_text(apply(mutant, original), encoding="utf-8")
        out = run_pytest(copy, ws.guard_dir, ws.report_path(), mutant.slice_args(), mutated_file=mutant.file,
                         timeout=timeout)
        return classify(mutant.name, out)
    finally:
        path.write_text(original, encoding="utf-8")
        ws.give_back(copy)


def run_baseline(args: tuple[str, ...], ws: Workspace, timeout: float) -> Result:
    """The slice `args` on the unmutated copy: it must pass for a kill to mean anything."""
    copy = ws.borrow()
    try:
        out = run_pytest(copy, ws.guard_dir, ws.report_path(), list(args), mutated_file=None, timeout=timeout)
    finally:
        ws.give_back(copy)
    res = classify(" ".join(args), out)
    if res.status == SURVIVED:
        return Result(res.name, "passed", seconds=res.seconds)
    if res.status == KILLED:
        return Result(res.name, "failed", test=res.test, seconds=res.seconds)
    return res


def run_zoo(mutants: list[Mutant], root: Path, *, jobs: int = 1, baseline: bool = False,
            timeout: float = DEFAULT_TIMEOUT_S, progress=print) -> list[Result]:
    """Run every mutant (and first, with `baseline`, every distinct slice unmutated); results in
    zoo order. ImportLeak when the copy does not import as itself."""
    with Workspace(Path(root), jobs) as ws:
        check_imports(ws.copies[0], ws.guard_dir)
        refused = _baseline_refusals(mutants, ws, jobs, timeout, progress) if baseline else {}
        todo = [m for m in mutants if m.name not in refused]
        done = dict(refused)
        lock, counter = threading.Lock(), [0]

        def one(m: Mutant) -> None:
            res = run_mutant(m, ws, timeout)
            with lock:
                done[m.name] = res
                counter[0] += 1
                progress(f"[{counter[0]}/{len(todo)}] {m.name}: {_verdict(res)} ({res.seconds:.1f} s)")

        _parallel(one, todo, jobs)
    return [done[m.name] for m in mutants]


def _baseline_refusals(mutants, ws, jobs, timeout, progress) -> dict[str, Result]:
    """Refusals for mutants whose slice fails (or is refused) unmutated."""
    slices = sorted({tuple(m.slice_args()) for m in mutants})
    outcome: dict[tuple, Result] = {}
    lock = threading.Lock()

    def one(args: tuple) -> None:
        res = run_baseline(args, ws, timeout)
        with lock:
            outcome[args] = res
            progress(f"[baseline] {' '.join(args)}: {res.status}{' ' + res.test if res.test else ''}"
                     f"{' ' + res.detail if res.detail else ''} ({res.seconds:.1f} s)")

    _parallel(one, slices, jobs)
    refused = {}
    for m in mutants:
        base = outcome[tuple(m.slice_args())]
        if base.status != "passed":
            refused[m.name] = Result(m.name, REFUSED, detail=f"baseline {base.status} unmutated: "
                                                             f"{base.test or base.detail}")
    return refused


def _parallel(fn, items, jobs: int) -> None:
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for f in [pool.submit(fn, x) for x in items]:
            f.result()


def _verdict(res: Result) -> str:
    if res.status == KILLED:
        return f"killed by {res.test}"
    if res.status == SURVIVED:
        return "SURVIVED" + (f" ({res.detail})" if res.detail else "")
    if res.status == NOT_RUN:
        return f"not run: {res.detail}"
    return f"REFUSED: {res.detail}"


KILLED_CELL = {KILLED: "yes", SURVIVED: "no", NOT_RUN: "not run"}


# ------------------------------------------------------------------------------------------
# output


def format_table(results: list[Result]) -> str:
    """The plain-text table: mutant, killed (yes / no / refused), first failing test, seconds."""
    rows = [(r.name, KILLED_CELL.get(r.status, "REFUSED"),
             r.test if r.status == KILLED else r.detail, f"{r.seconds:.1f}") for r in results]
    head = ("mutant", "killed", "first failing test", "s")
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d:>6}" for a, b, c, d in [head, *rows]]
    killed = sum(r.killed for r in results)
    not_run = sum(r.status == NOT_RUN for r in results)
    lines.append(f"{len(results)} mutants: {killed} killed, {sum(r.status == SURVIVED for r in results)} survived, "
                 f"{sum(r.status == REFUSED for r in results)} refused"
                 + (f", {not_run} not run (they need a device this machine lacks)" if not_run else "")
                 + f"; {sum(r.seconds for r in results):.0f} s")
    return "\n".join(lines)


def markdown_table(results: list[Result], mutants: list[Mutant]) -> str:
    """The table as markdown, one line per mutant with its `why` (for docs/mutants.md's kill table)."""
    why = {m.name: m.why for m in mutants}
    cell = lambda s: s.replace("|", "\\|").replace("\n", " ")   # noqa: E731
    lines = ["| mutant | killed | first failing test | s | why |", "|---|---|---|---:|---|"]
    for r in results:
        killed = {**KILLED_CELL, SURVIVED: "**no**"}.get(r.status, "**refused**")
        by = f"`{r.test}`" if r.status == KILLED else cell(r.detail)
        lines.append(f"| `{r.name}` | {killed} | {cell(by)} | {r.seconds:.1f} | {cell(why.get(r.name, ''))} |")
    return "\n".join(lines) + "\n"


def format_list(mutants: list[Mutant], root: Path) -> str:
    """`--list`: name, file, why; a target not found exactly once is flagged."""
    lines = []
    for m in mutants:
        flag = target_refusal(m, (root / m.file).read_text(encoding="utf-8"))
        fast = " [fast]" if m.fast else ""
        lines.append(f"{m.name}{fast}  {m.file}  {m.why}" + (f"  -- REFUSED: {flag}" if flag else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# command line (wired into specverify/cli.py)


def default_root() -> Path:
    """The repository this package lives in when it carries the zoo, else the current directory."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "tests" / "mutants").is_dir() else Path.cwd()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be an int >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--timeout must be a finite number of seconds > 0, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("generate",),
                   help="generate: a campaign over mutants generated from specverify/'s AST "
                        "(specverify/mutation_campaign.py; its options are --seed, --per-module, --budget, "
                        "--report, --no-full-suite)")
    p.add_argument("--seed", type=int, default=0, help="generate: the sampling seed")
    p.add_argument("--per-module", type=_positive_int, default=40, metavar="N", help="generate: sites drawn per module")
    p.add_argument("--budget", type=_positive_float, default=60.0, metavar="MINUTES",
                   help="generate: no mutant starts after this many minutes (the rest are reported not run)")
    p.add_argument("--report", metavar="FILE", help="generate: write the markdown report here (and FILE.json)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="PART.json", default=None,
                   help="generate: one report (--report) from the json reports of a campaign run in parts")
    p.add_argument("--rerun", nargs="+", metavar="ID", default=None,
                   help="generate --merge PARTS: re-run these mutants of the parts on --slice, into --part OUT.json")
    p.add_argument("--slice", nargs="+", metavar="TEST", default=None, help="generate --rerun: the tests to run")
    p.add_argument("--part", type=Path, metavar="OUT.json", default=None, help="generate --rerun: where the results go")
    p.add_argument("--modules", nargs="+", metavar="MODULE", default=None,
                   help="generate: only these modules' sites (after the seeded draw; a campaign may run in parts)")
    p.add_argument("--files", nargs="+", metavar="FILE", default=None,
                   help="generate: draw --per-module sites from each of these files instead of from each module "
                        "(the files one change touched, as specverify/kernels/tree.py)")
    p.add_argument("--no-full-suite", action="store_true",
                   help="generate: do not re-run a slice survivor on the whole suite")
    p.add_argument("--only", nargs="+", action="extend", metavar="NAME", help="run only these mutants")
    p.add_argument("--list", action="store_true", help="print name, file and why of each mutant and exit")
    p.add_argument("--fast", action="store_true", help="only the mutants marked fast = true (the CI subset)")
    p.add_argument("--baseline", action="store_true",
                   help="first run every slice unmutated; a mutant whose slice fails unmutated is refused")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as markdown to FILE (the rows of docs/mutants.md's kill table)")
    p.add_argument("--jobs", type=_positive_int, default=1, metavar="N", help="mutants run in parallel (copies)")
    p.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds per slice before it counts as a kill by timeout (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--root", type=Path, default=None, help="repository root (default: this package's repository)")
    p.add_argument("--zoo", type=Path, default=None, help="zoo directory (default: ROOT/tests/mutants)")


def command(args) -> int:
    """Exit status 0 when every selected mutant is killed (a mutant that needs a device this machine
    lacks is reported `not run` and does not count); 1 if any survives or is refused; 2 when the
    zoo or the copy cannot be used."""
    root = (args.root or default_root()).resolve()
    try:
        mutants = select(load_zoo(args.zoo or root / "tests" / "mutants", root), only=args.only, fast=args.fast)
        if args.list:
            print(format_list(mutants, root))
            return 0
        print(f"specverify mutants: {len(mutants)} mutant(s) from {root}, jobs {args.jobs}"
              f"{', baseline first' if args.baseline else ''}", flush=True)
        results = run_zoo(mutants, root, jobs=args.jobs, baseline=args.baseline, timeout=args.timeout,
                          progress=lambda line: print(line, flush=True))
    except (ZooError, ImportLeak) as e:
        print(f"specverify mutants: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(results, mutants), encoding="utf-8")
    return 0 if all(r.killed or r.status == NOT_RUN for r in results) else 1
