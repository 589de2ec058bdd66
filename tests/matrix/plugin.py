"""The pytest plugin behind `specverify matrix` (specverify/matrix/): every test's feature, dtype
and algorithm (JUnit properties), the --sv-dtypes / --sv-algorithms filters, and the expected
failures and skips of the active platform profile (tests/expectations/), stale entries reported.
conftest.py registers it and calls it from its collection hook."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specverify import environment
from specverify.dtypes import DTYPES
from specverify.platform import get_profile
from tests.matrix import classify as mclassify
from tests.matrix import expectations as mexpect

FEATURES_FILE = Path("tests", "matrix", "features.toml")        # relative to the rootdir
EXPECTATIONS_DIR = Path("tests", "expectations")                 # relative to the rootdir
EXPECTATIONS_ENV = "SPECVERIFY_EXPECTATIONS"

ROW = pytest.StashKey[tuple]()          # an item's (feature, dtype, algorithm)
WORKER_KEY = "specverify_expectations"  # what an xdist worker sends the controller


class MatrixPlugin:
    """The session's feature map, filters and expectations, and the hooks that report on them."""

    def __init__(self, features, dtypes, algorithms, expect_dir, entries):
        self.features = features              # tests/matrix/features.toml, parsed
        self.dtypes = dtypes                  # --sv-dtypes (None: no filter)
        self.algorithms = algorithms          # --sv-algorithms
        self.expect_dir = expect_dir          # None: no expectations directory
        self.entries = entries                # the active profile's entries, in matching order
        self.matching: mexpect.Matching | None = None   # of the collection (from a worker under xdist)
        self.whole: tuple[bool, str] = (False, "no collection seen")
        self.passed: dict[str, list[str]] = {}           # xfail entry ref -> node ids that passed

    @classmethod
    def from_config(cls, config) -> MatrixPlugin:
        """Parse the feature map, the filters and the expectations; a malformed one is a usage error."""
        root = config.rootpath
        try:
            features = mclassify.load_features(root / FEATURES_FILE)
            dtypes = mclassify.parse_filter("--sv-dtypes", config.getoption("--sv-dtypes"),
                                            [*DTYPES, mclassify.NONE])
            algorithms = mclassify.parse_filter("--sv-algorithms", config.getoption("--sv-algorithms"),
                                                mclassify.ALGORITHMS)
            named = config.getoption("--sv-expectations") or os.environ.get(EXPECTATIONS_ENV)
            expect_dir = Path(named) if named else root / EXPECTATIONS_DIR
            entries = []
            if named or expect_dir.is_dir():
                entries = mexpect.for_profile(mexpect.load_dir(expect_dir, DTYPES, root), get_profile().name)
            else:
                expect_dir = None
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        return cls(features, dtypes, algorithms, expect_dir, entries)

    # collection ------------------------------------------------------------------------------

    def classify_and_expect(self, config, items) -> None:
        """Classify every item (JUnit properties nodeid, feature, dtype, algorithm) and apply the
        active profile's expectations, matched against every collected item."""
        for item in items:
            spec = getattr(item, "callspec", None)
            registry = getattr(getattr(item, "module", None), "REGISTRY", None)
            row = mclassify.classify(item.nodeid, spec.params if spec else {}, self.features, DTYPES,
                                     spec.id if spec else "", registry if isinstance(registry, dict) else None)
            item.stash[ROW] = row
            item.user_properties += [("nodeid", item.nodeid), ("feature", row[0]), ("dtype", row[1]),
                                     ("algorithm", row[2])]
        self.matching = mexpect.match(self.entries, [(item.nodeid, item.stash[ROW][1]) for item in items])
        for item in items:
            entry = self.matching.applied.get(item.nodeid)
            if entry is None:
                continue
            if entry.kind == "xfail":
                item.add_marker(pytest.mark.xfail(strict=True, raises=entry.raises, reason=entry.tagged_reason))
            else:
                item.add_marker(pytest.mark.skip(reason=entry.tagged_reason))
            item.user_properties.append(("expectation", entry.ref))
        narrowing = [flag for flag, dest in (("--ignore", "ignore"), ("--ignore-glob", "ignore_glob"),
                                             ("--lf", "lf"), ("--sw", "stepwise"))
                     if config.getoption(dest, default=None)]
        self.whole = mexpect.whole_suite(config.args, config.invocation_params.dir, config.rootpath,
                                         config.getini("testpaths"), narrowing)
        if hasattr(config, "workeroutput"):     # an xdist worker: the controller reports, and never collects
            m = self.matching
            config.workeroutput[WORKER_KEY] = {"claimed": m.claimed, "candidates": m.candidates,
                                               "applied": {n: e.ref for n, e in m.applied.items()},
                                               "whole": list(self.whole)}

    def filter(self, config, items) -> None:
        """--sv-dtypes / --sv-algorithms deselect what they do not list ('-' is a name like any other)."""
        if self.dtypes is None and self.algorithms is None:
            return
        kept, dropped = [], []
        for item in items:
            _, dtype, algorithm = item.stash[ROW]
            ok = mclassify.keep(dtype, algorithm, self.dtypes, self.algorithms)
            (kept if ok else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    # hooks -----------------------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: the collection-time matching of the first worker that reports one
        (every worker collects the same items)."""
        data = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if data is None or self.matching is not None:
            return
        by_ref = {e.ref: e for e in self.entries}
        self.matching = mexpect.Matching({n: by_ref[r] for n, r in data["applied"].items() if r in by_ref},
                                         data["claimed"], data["candidates"])
        self.whole = (bool(data["whole"][0]), str(data["whole"][1]))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        # A non-strict xfail that passes is an ordinary pass in JUnit: mark it for the matrix. (The
        # teardown report, whose properties JUnit records, copies the item's list.)
        if report.when == "call" and report.passed and hasattr(report, "wasxfail"):
            item.user_properties.append(("outcome", "xpassed"))

    def pytest_runtest_logreport(self, report):
        """An xfail expectation whose test passed (strict: reported failed, XPASS(strict)) is stale."""
        if report.when != "call" or not report.failed or "XPASS(strict)" not in report.longreprtext:
            return
        refs = [value for name, value in report.user_properties if name == "expectation"]
        if refs:
            self.passed.setdefault(refs[0], []).append(report.nodeid)

    def stale(self) -> list[dict]:
        return mexpect.stale(self.entries, self.matching, self.whole[0], self.passed)

    def pytest_terminal_summary(self, terminalreporter):
        rows = self.stale()
        if not self.entries and not rows:
            return
        tr = terminalreporter
        tr.section("specverify expectations")
        applied = len(self.matching.applied) if self.matching else 0
        tr.write_line(f"profile {get_profile().name}: {len(self.entries)} entries from {self.expect_dir}, "
                      f"applied to {applied} test(s)")
        if not self.whole[0]:
            tr.write_line(f"unmatched entries not checked: {self.whole[1]}")
        for line in mexpect.format_stale(rows):
            tr.write_line(f"STALE {line}", yellow=True)

    def pytest_sessionfinish(self, session):
        config = session.config
        path = config.getoption("--sv-expectations-report")
        if not path or hasattr(config, "workerinput"):
            return
        claimed = self.matching.claimed if self.matching else {}
        data = {"profile": get_profile().name, "dir": str(self.expect_dir) if self.expect_dir else None,
                "entries": [{**e.as_dict(), "applied": len(claimed.get(e.ref, []))} for e in self.entries],
                "unmatched_checked": self.whole[0], "unmatched_note": self.whole[1], "stale": self.stale(),
                "environment": environment.describe()}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")


MATRIX = pytest.StashKey[MatrixPlugin]()
