"""A matrix run: one pytest process per profile (its command, environment and live progress),
each turned into a column, then the reports written and the exit status."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from specverify.matrix.checks import (check_capabilities, check_label, check_names, check_profiles, check_workers,
                                      default_root)
from specverify.matrix.columns import _now, assign_columns
from specverify.matrix.errors import ALGORITHMS, NO_DTYPE, SCHEMA, MatrixError
from specverify.matrix.junit import count, has_failures, parse_junit
from specverify.matrix.report import render_text, write_reports
from specverify import environment
from specverify.environment import CAPABILITY_ENV

DEFAULT_INTERVAL_S = 10.0     # seconds between two progress lines of one profile
OK_RETURNCODES = (0, 1, 5)    # pytest: all passed, some failed, nothing collected


PROGRESS_LINE = re.compile(r"[.FEsxX]+(\s+\[\s*\d+%\])?\s*")
PROGRESS_PARTIAL = re.compile(r"[.FEsxX]+")


class ProgressCounter:
    """Counts finished tests from pytest's -q progress lines ("..F.s  [ 40%]") as output streams
    in; lines of any other shape are ignored, so a header or a traceback never counts."""

    def __init__(self):
        self._done = self._failed = 0
        self._partial = ""
        self._lock = threading.Lock()

    def feed(self, text: str) -> None:
        with self._lock:
            lines = (self._partial + text.replace("\r", "\n")).split("\n")
            self._partial = lines.pop()
            for line in lines:
                if PROGRESS_LINE.fullmatch(line):
                    marks = line.split("[")[0].strip()
                    self._done += len(marks)
                    self._failed += marks.count("F") + marks.count("E")

    def counts(self) -> tuple[int, int]:
        """(tests finished, of which failed or errored), the unfinished line included."""
        with self._lock:
            done, failed = self._done, self._failed
            if PROGRESS_PARTIAL.fullmatch(self._partial):
                done += len(self._partial)
                failed += self._partial.count("F") + self._partial.count("E")
            return done, failed


def pytest_command(stem: str, out: Path, workers: str, dtypes, algorithms, expectations: Path | None,
                   pytest_args: list[str]) -> list[str]:
    """The child's pytest command; its JUnit XML and expectations report are named after `stem`
    (the profile, with the CPU capability when a run has several)."""
    cmd = [sys.executable, "-m", "pytest", "-n", workers, "-p", "no:cacheprovider", "-q",
           f"--junitxml={out / f'junit-{stem}.xml'}",
           f"--sv-expectations-report={out / f'expectations-{stem}.json'}"]
    if dtypes:
        cmd.append(f"--sv-dtypes={','.join(dtypes)}")
    if algorithms:
        cmd.append(f"--sv-algorithms={','.join(algorithms)}")
    if expectations is not None:
        cmd.append(f"--sv-expectations={expectations}")
    return cmd + list(pytest_args)


def child_env(profile: str, capability: str | None = None) -> dict:
    """The child's environment: the profile, and ATEN_CPU_CAPABILITY = `capability` (None: unset,
    the machine's own instruction set)."""
    # A matrix started from inside a pytest run (its own tests) must not hand the child the
    # parent's per-test or xdist-worker variables.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", CAPABILITY_ENV) and not k.startswith("PYTEST_XDIST_")}
    env["SPECVERIFY_PLATFORM"] = profile
    if capability is not None:
        env[CAPABILITY_ENV] = capability
    return env


def run_profile(profile: str, cmd: list[str], root: Path, log: Path, interval: float, say,
                capability: str | None = None) -> tuple[int, float]:
    """Run one profile's pytest (under ATEN_CPU_CAPABILITY = capability, None: unset), its output
    into `log`; progress lines through `say`. Returns (pytest's exit status, seconds)."""
    counter = ProgressCounter()
    start = time.monotonic()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=root, env=child_env(profile, capability), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def pump():
            while chunk := proc.stdout.read1(65536):
                sink.write(chunk)
                sink.flush()
                counter.feed(chunk.decode("utf-8", "replace"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while True:
                reader.join(timeout=interval)
                if not reader.is_alive():
                    break
                done, failed = counter.counts()
                say(f"  {profile}: {done} test(s) done, {failed} failed, {time.monotonic() - start:.0f} s")
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    return rc, time.monotonic() - start


# ---------------------------------------------------------------------------------------------
# the run


def run(*, profiles, dtypes, algorithms, out: Path, label, workers, expectations, root, pytest_args,
        interval: float = DEFAULT_INTERVAL_S, say=None, capabilities=None) -> int:
    """One pytest run per (profile, CPU capability): capabilities are ATEN_CPU_CAPABILITY names
    ('native' = the machine's own; None = one run keeping the caller's variable)."""
    say = say or (lambda line: print(line, flush=True))
    from specverify.dtypes import DTYPES
    from specverify.platform import get_profile
    profiles = check_profiles(profiles)
    dtypes = check_names("--dtypes", dtypes, [*DTYPES, NO_DTYPE])
    algorithms = check_names("--algorithms", algorithms, ALGORITHMS)
    workers = check_workers(workers)
    label = check_label(label)
    capabilities = check_capabilities(capabilities)
    if not interval > 0:
        raise MatrixError(f"--interval: expected seconds > 0, got {interval}")
    root = (root or default_root()).resolve()
    if not root.is_dir():
        raise MatrixError(f"--root: {root} is not a directory")
    if expectations is not None and not expectations.is_dir():
        raise MatrixError(f"--expectations: {expectations} is not a directory")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    versions = environment.versions()
    several = len(capabilities) > 1
    say(f"specverify matrix: {len(profiles)} profile(s) {', '.join(profiles)}; CPU capabilities "
        f"{', '.join(have + ('' if want else ' (native)') for want, have in capabilities)}; label {label!r}; "
        f"workers {workers}; output {out}")
    runs = [(p, want, have) for want, have in capabilities for p in profiles]
    columns = []
    for i, (profile, want, have) in enumerate(runs, 1):
        # Files of a forced capability carry its name, so two capabilities never share a file.
        stem = f"{profile}-{have}" if several else profile
        junit, sidecar = out / f"junit-{stem}.xml", out / f"expectations-{stem}.json"
        for stale_file in (junit, sidecar):
            stale_file.unlink(missing_ok=True)
        cmd = pytest_command(stem, out, workers, dtypes, algorithms,
                             expectations.resolve() if expectations is not None else None, pytest_args)
        shown = (f"SPECVERIFY_PLATFORM={profile} " + (f"{CAPABILITY_ENV}={want} " if want else "")
                 + shlex.join(["python", *cmd[1:]]))
        name = f"{profile} [{have}]" if several else profile
        say(f"[{i}/{len(runs)}] {name}: {shown}")
        log = out / f"pytest-{stem}.log"
        rc, seconds = run_profile(profile, cmd, root, log, interval, say, capability=want)
        column = _column(profile, label, get_profile(profile), versions, shown, rc, seconds, junit, sidecar, log)
        # The child's own record of its capability (the expectations report) is the truth; the
        # probe made before the run must agree with it.
        ran = ((column.get("expectations") or {}).get("environment") or {}).get("cpu_capability")
        column.update(argv=cmd, cpu_capability=ran or have, capability=want or "")
        if ran and ran != have:
            column["status"] = "broken"
            column["note"] = (column["note"] + "; " if column["note"] else "") + \
                f"the run used CPU capability {ran!r}, not the {have!r} it was started for"
        columns.append(column)
        c = column["counts"]
        say(f"[{i}/{len(runs)}] {name}: {column['status']} in {seconds:.1f} s: {c['passed']} passed, "
            f"{c['failed']} failed, {c['error']} error(s), {c['skipped']} skipped, {c['xfailed']} xfailed, "
            f"{c['xpassed']} xpassed (pytest exit {rc}){': ' + column['note'] if column['note'] else ''}")
    doc = {"schema": SCHEMA, "label": label, "created": _now(), "root": str(root),
           "filters": {"dtypes": dtypes, "algorithms": algorithms, "pytest_args": list(pytest_args),
                       "workers": workers, "expectations": str(expectations) if expectations else None},
           "sources": [], "columns": columns}
    assign_columns(doc["columns"])
    paths = write_reports(doc, out)
    failed = [c["column"] for c in doc["columns"] if has_failures(c)]
    say(render_text(doc))
    say(f"wrote {', '.join(str(p) for p in paths)}")
    say(f"FAILED: {', '.join(failed)}" if failed else "no failures")
    return 1 if failed else 0


def _column(profile, label, prof, versions, shown, rc, seconds, junit: Path, sidecar: Path, log: Path) -> dict:
    records, note = [], ""
    if junit.exists():
        try:
            records = parse_junit(junit)
        except MatrixError as e:
            note = str(e)
    counts = count(records)
    if rc not in OK_RETURNCODES:
        status = "broken"
        note = note or f"pytest exited {rc}; see {log.name}: {_log_tail(log)}"
    elif not junit.exists() or note:
        status = "broken"
        note = note or f"pytest wrote no JUnit XML; see {log.name}: {_log_tail(log)}"
    elif rc == 1 and not (counts["failed"] or counts["error"]):
        status = "broken"
        note = f"pytest exited 1 but its JUnit XML holds no failure; see {log.name}: {_log_tail(log)}"
    elif counts["failed"] or counts["error"]:
        status = "failed"
    elif rc == 5:
        status, note = "empty", "no test collected"
    else:
        status = "passed"
    expectations = None
    if sidecar.exists():
        try:
            expectations = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            note = (note + "; " if note else "") + f"{sidecar.name} unreadable: {e}"
    return {"column": profile, "profile": profile, "label": label, "platform": prof.policy, "native": prof.native,
            "device": prof.device if prof.device == "cpu" else f"{prof.device} ({label})", **versions,
            "duration_s": round(seconds, 2), "command": shown, "returncode": rc, "status": status, "note": note,
            "counts": counts, "records": records, "expectations": expectations}


def _log_tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace", encoding="utf-8").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"
