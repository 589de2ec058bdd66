"""The control panel of the suite: markers, platform skips, Triton mode, hypothesis profiles,
per-test seeds and the report header; and for `specverify matrix` (specverify/matrix/): every
test's feature, dtype and algorithm (JUnit properties), the --sv-dtypes / --sv-algorithms filters,
and the expected failures and skips per platform profile (data in tests/expectations/), stale
entries reported. The logic of the last three lives in tests/matrix/ (plugin.py, registered here)."""

from __future__ import annotations

import os
import random
import zlib

import torch

# Triton kernels run on the CPU through the interpreter when no GPU is present. This must be set
# before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from specverify import environment  # noqa: E402
from specverify.platform import ENV_VAR, get_profile, native_platform  # noqa: E402
from tests.matrix.plugin import EXPECTATIONS_DIR, EXPECTATIONS_ENV, MATRIX, MatrixPlugin  # noqa: E402

# The conformance plugin (--sv-impl, --sv-sample, --sv-report) is an entry point of the installed
# package; named here too for a run from the tree without an install (PYTHONPATH=.). Registered
# under its module name, so the entry point of the same name is not loaded twice.
pytest_plugins = ["pytester", "specverify.conformance.plugin"]

THREADS_ENV = "SPECVERIFY_THREADS"

MARKERS = {
    "cuda": "needs a native CUDA device",
    "rocm": "needs a native ROCm device",
    "gpu": "needs a native GPU (CUDA or ROCm)",
    "fp8": "exercises FP8 logits or quantization",
    "golden": "compares against committed golden files",
    "e2e": "end-to-end decoding through generate()",
    "slow": "long; deselected unless --run-slow or SPECVERIFY_RUN_SLOW=1",
    "bitexact": "compares floats bit for bit: must hold on every CPU instruction set (scripts/run-tests re-runs "
                "these under ATEN_CPU_CAPABILITY=default)",
    "kernels": "runs specverify's Triton kernels or the op registry (scripts/run-tests re-runs these under the "
               "oldest supported triton)",
}
PLATFORM_MARKERS = {"cuda": ("cuda",), "rocm": ("rocm",), "gpu": ("cuda", "rocm")}

# ci and dev draw the same examples on every machine and in every run (derandomized, no example
# database: a failure another box stored must not change this box's verdict); thorough explores
# with fresh randomness (each failure prints the blob that replays it).
settings.register_profile("ci", max_examples=40, derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
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
    # One intra-op thread in every test process, under xdist or not: a float reduction split over
    # threads can round by the thread count (a verdict must not depend on the core count), and
    # under `-n auto` every core already runs a worker (torch's default, a thread per core in
    # every worker, made a loaded 2-core box several times slower). SPECVERIFY_THREADS=N overrides.
    threads = os.environ.get(THREADS_ENV, "1")
    if not (threads.isdigit() and int(threads) >= 1):
        raise pytest.UsageError(f"{THREADS_ENV}={threads!r}: expected an int >= 1 (intra-op threads per test process)")
    torch.set_num_threads(int(threads))
    try:
        get_profile()   # a bad SPECVERIFY_PLATFORM: one line, not an INTERNALERROR traceback
    except (TypeError, ValueError) as e:
        raise pytest.UsageError(f"{ENV_VAR}={os.environ.get(ENV_VAR, '')!r}: {e}") from None
    config.stash[MATRIX] = MatrixPlugin.from_config(config)
    config.pluginmanager.register(config.stash[MATRIX], "specverify-matrix")


def pytest_report_header(config):
    profile = get_profile()
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPECVERIFY_")}
    lib = environment.versions()
    lines = [
        f"specverify: platform profile {profile.name} (policy {profile.policy}, device {profile.device}, "
        f"native {native_platform()}), argmax fast path {profile.argmax_fast_path}, "
        f"FP8 {', '.join(profile.fp8_formats)}",
        f"specverify: torch {lib['torch']}, triton {lib['triton']}, numpy {lib['numpy']}, python {lib['python']}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}, "
        f"hypothesis profile {settings._current_profile}",
        f"specverify: CPU capability {environment.cpu_capability()} "
        f"({environment.CAPABILITY_ENV}={environment.requested_capability() or 'unset'}), "
        f"intra-op threads {torch.get_num_threads()}",
        f"specverify: env {env or '{}'}",
    ]
    problems = [environment.capability_problem(), *environment.unsupported_versions()]
    return lines + [f"specverify: WARNING: {p}" for p in problems if p]


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
