"""The control panel of the suite: markers, platform skips, Triton mode, hypothesis profiles,
per-test seeds and the report header; and for `specverify matrix` (specverify/matrix/): every
test's feature, dtype and algorithm (JUnit properties), the --sv-dtypes / --sv-algorithms filters,
and the expected failures and skips per platform profile (data in tests/expectations/), stale
entries reported. The logic of the last three lives in tests/matrix/."""

from __future__ import annotations

import json
import os
import random
import zlib
from pathlib import Path

import torch

# Triton kernels run on the CPU through the interpreter when no GPU is present. This must be set
# before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under `-n auto` every core already runs a worker: one intra-op thread per worker, unless the user
# chose a count. Torch's default (a thread per core in every worker) oversubscribes the machine
# and made a loaded 2-core box several times slower.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("OMP_NUM_THREADS"):
    torch.set_num_threads(1)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from specverify.dtypes import DTYPES  # noqa: E402
from specverify.platform import ENV_VAR, get_profile, native_platform  # noqa: E402
from tests.matrix import classify as mclassify  # noqa: E402
from tests.matrix import expectations as mexpect  # noqa: E402

pytest_plugins = ["pytester"]

MARKERS = {
    "cuda": "needs a native CUDA device",
    "rocm": "needs a native ROCm device",
    "gpu": "needs a native GPU (CUDA or ROCm)",
    "fp8": "exercises FP8 logits or quantization",
    "golden": "compares against committed golden files",
    "e2e": "end-to-end decoding through generate()",
    "slow": "long; deselected unless --run-slow or SPECVERIFY_RUN_SLOW=1",
}
PLATFORM_MARKERS = {"cuda": ("cuda",), "rocm": ("rocm",), "gpu": ("cuda", "rocm")}
FEATURES_FILE = Path("tests", "matrix", "features.toml")        # relative to the rootdir
EXPECTATIONS_DIR = Path("tests", "expectations")                 # relative to the rootdir
EXPECTATIONS_ENV = "SPECVERIFY_EXPECTATIONS"

settings.register_profile("ci", max_examples=40, derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--sv-sample", default=None, metavar="NAME",
                     help="tests/test_ops_differential.py::test_differential runs only the sample called NAME "
                          "(the replay command of a failure names it)")
    parser.addoption("--sv-hypothesis-profile", default=None,
                     help="hypothesis profile: ci | dev | thorough (env SPECVERIFY_HYPOTHESIS_PROFILE; "
                          "default ci under CI, else dev)")
    parser.addoption("--sv-dtypes", default=None, metavar="A,B",
                     help="run only the tests classified with these dtypes (names of specverify.dtypes; '-' "
                          "names the tests without a dtype, which a dtype filter drops unless it lists '-')")
    parser.addoption("--sv-algorithms", default=None, metavar="A,B",
                     help="run only the tests of these algorithms: eagle, target, '-' (neither: ops, protocol, ...)")
    parser.addoption("--sv-expectations", default=None, metavar="DIR",
                     help=f"expected failures / skips per platform profile (env {EXPECTATIONS_ENV}; default "
                          f"ROOTDIR/{EXPECTATIONS_DIR.as_posix()}, when it exists)")
    parser.addoption("--sv-expectations-report", default=None, metavar="PATH",
                     help="write the applied expectations and the stale entries as JSON to PATH")


def pytest_configure(config):
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    profile = (config.getoption("--sv-hypothesis-profile")
               or os.environ.get("SPECVERIFY_HYPOTHESIS_PROFILE")
               or ("ci" if os.environ.get("CI") else "dev"))
    settings.load_profile(profile)
    try:
        get_profile()   # a bad SPECVERIFY_PLATFORM: one line, not an INTERNALERROR traceback
    except (TypeError, ValueError) as e:
        raise pytest.UsageError(f"{ENV_VAR}={os.environ.get(ENV_VAR, '')!r}: {e}") from None
    config.stash[MATRIX] = MatrixPlugin.from_config(config)
    config.pluginmanager.register(config.stash[MATRIX], "specverify-matrix")


def pytest_report_header(config):
    profile = get_profile()
    triton_version = _triton_version()
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPECVERIFY_")}
    return [
        f"specverify: platform profile {profile.name} (policy {profile.policy}, device {profile.device}, "
        f"native {native_platform()}), argmax fast path {profile.argmax_fast_path}, "
        f"FP8 {', '.join(profile.fp8_formats)}",
        f"specverify: torch {torch.__version__}, triton {triton_version}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}, "
        f"hypothesis profile {settings._current_profile}",
        f"specverify: env {env or '{}'}",
    ]


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "absent"


@pytest.hookimpl(tryfirst=True)   # before -k / -m / --deselect: expectations are matched against every collected test
def pytest_collection_modifyitems(config, items):
    matrix = config.stash[MATRIX]
    matrix.classify_and_expect(config, items)
    native = native_platform()
    run_slow = config.getoption("--run-slow") or os.environ.get("SPECVERIFY_RUN_SLOW") == "1"
    kept, slow = [], []
    for item in items:
        for marker, platforms in PLATFORM_MARKERS.items():
            if item.get_closest_marker(marker) and native not in platforms:
                item.add_marker(pytest.mark.skip(reason=f"{marker}-marked: this machine is {native}"))
        (slow if item.get_closest_marker("slow") and not run_slow else kept).append(item)
    if slow:
        # Deselected, not skipped: the full factor products are thousands of ids.
        config.hook.pytest_deselected(items=slow)
        items[:] = kept
    matrix.filter(config, items)


# ---------------------------------------------------------------------------------------------
# specverify matrix: classification, filters, expectations (tests/matrix/)

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
                "unmatched_checked": self.whole[0], "unmatched_note": self.whole[1], "stale": self.stale()}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1))


MATRIX = pytest.StashKey[MatrixPlugin]()


# ---------------------------------------------------------------------------------------------
# fixtures


def seed_for(nodeid: str) -> int:
    """A seed that depends only on the test id: same in any order and under any xdist worker."""
    return zlib.crc32(nodeid.encode()) & 0x7FFFFFFF


@pytest.fixture(autouse=True)
def _seed_everything(request):
    seed = seed_for(request.node.nodeid)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    yield


@pytest.fixture
def seed(request) -> int:
    """The per-test seed (crc32 of the test id)."""
    return seed_for(request.node.nodeid)


@pytest.fixture
def platform_profile():
    """The profile SPECVERIFY_PLATFORM selects (native by default)."""
    return get_profile()


@pytest.fixture
def platform_env(monkeypatch):
    """Select a platform profile for one test: `platform_env("rocm-emulated")`."""
    def select(name: str):
        monkeypatch.setenv(ENV_VAR, name)
        return get_profile()
    return select
