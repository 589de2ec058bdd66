"""The control panel itself: platform skips, the slow gate, per-test seeds, the report header."""

from __future__ import annotations

import pathlib
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

SAMPLE = """
import pytest

@pytest.mark.cuda
def test_cuda(): pass

@pytest.mark.rocm
def test_rocm(): pass

@pytest.mark.gpu
def test_gpu(): pass

@pytest.mark.slow
def test_slow(): pass

def test_plain(seed):
    print("SEED", seed)
"""


# A plugin the sample run loads first (`-p fake_machine`): it makes the subprocess see another
# machine, the way tests/test_platform.py fakes it, so every machine's outcome is checked on any box.
FAKE_MACHINE = """
import torch

MACHINE = {machine!r}
torch.cuda.is_available = lambda: MACHINE != "cpu"
torch.cuda.device_count = lambda: 0 if MACHINE == "cpu" else 1
torch.version.hip = "6.2.0" if MACHINE == "rocm" else None
"""
PLATFORM_MARKED = {"cuda": ("cuda",), "rocm": ("rocm",), "gpu": ("cuda", "rocm")}


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("SPECVERIFY_PLATFORM", raising=False)
    pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester


def machine_args(suite, machine: str) -> tuple[list[str], str]:
    """(extra pytest args, the native platform the sample run sees): "live" is this machine."""
    if machine == "live":
        from specverify.platform import native_platform
        return [], native_platform()
    suite.makepyfile(fake_machine=FAKE_MACHINE.format(machine=machine))
    return ["-p", "fake_machine"], machine


# "live" is this machine (a CPU box in CPU CI, a GPU on a GPU runner); the fakes cover the others.
MACHINES = ["live", "cuda", "rocm"]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: f"machine={m}")
def test_platform_marked_tests_skip_and_slow_ones_deselect(suite, monkeypatch, machine):
    """A platform-marked test runs where its platform is native and is skipped, with a one-line
    reason, elsewhere; a slow test is deselected. Correct on a CPU box and on a GPU runner alike."""
    monkeypatch.delenv("SPECVERIFY_RUN_SLOW", raising=False)
    extra, native = machine_args(suite, machine)
    result = suite.runpytest_subprocess("-rs", "-p", "no:cacheprovider", *extra)
    runs = [m for m, platforms in PLATFORM_MARKED.items() if native in platforms]
    result.assert_outcomes(passed=1 + len(runs), skipped=3 - len(runs), deselected=1)
    result.stdout.fnmatch_lines([f"*{m}-marked: this machine is {native}*" for m in PLATFORM_MARKED if m not in runs])
    for m in runs:
        result.stdout.no_fnmatch_line(f"*{m}-marked*")


def test_run_slow_option_runs_slow_tests(suite):
    extra, native = machine_args(suite, "live")
    result = suite.runpytest_subprocess("--run-slow", "-p", "no:cacheprovider", *extra)
    runs = [m for m, platforms in PLATFORM_MARKED.items() if native in platforms]
    result.assert_outcomes(passed=2 + len(runs), skipped=3 - len(runs))


def test_seed_is_crc32_of_test_id(suite):
    result = suite.runpytest_subprocess("-s", "-k", "plain", "-p", "no:cacheprovider")
    expected = zlib.crc32(b"test_sample.py::test_plain") & 0x7FFFFFFF
    result.stdout.fnmatch_lines([f"*SEED {expected}*"])


def test_report_header_names_platform_and_env(suite, monkeypatch):
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "rocm-emulated")
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*platform profile rocm-emulated*", "*torch *triton *numpy *python*",
                                 "*CPU capability * (ATEN_CPU_CAPABILITY=*), intra-op threads *",
                                 "*SPECVERIFY_PLATFORM*rocm-emulated*"])


def test_report_header_prints_the_cpu_capability_and_flags_one_torch_ignored(suite, monkeypatch):
    """The capability the run really used is printed; a requested one torch did not take (an
    unknown name: torch falls back to the best silently) is a warning line, not a silent run."""
    from specverify.environment import capability_in_a_fresh_process
    best = capability_in_a_fresh_process(None)       # the machine's own, read in a fresh interpreter (this one may run another)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*CPU capability default (ATEN_CPU_CAPABILITY=default)*"])
    result.stdout.no_fnmatch_line("*WARNING*")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "no-such-isa")
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([f"*CPU capability {best} (ATEN_CPU_CAPABILITY=no-such-isa)*",
                                 f"*WARNING: ATEN_CPU_CAPABILITY='no-such-isa' but torch's CPU kernels use '{best}'*"])


def test_this_process_runs_one_thread_and_derandomized_examples():
    """What a verdict must not depend on, pinned in every test process (this one included, under
    xdist or not): the intra-op thread count (a float reduction can round by it) and, under the
    ci / dev hypothesis profiles, the examples drawn (the same on every machine, no example
    database carried from run to run)."""
    import os

    import torch
    from hypothesis import settings

    assert torch.get_num_threads() == int(os.environ.get("SPECVERIFY_THREADS", "1"))
    for name in ("ci", "dev"):
        profile = settings.get_profile(name)
        assert profile.derandomize and profile.database is None, name


def test_one_thread_whatever_the_runner_sets(suite, monkeypatch):
    """A runner that asks OpenMP for 3 threads still gets one per test process (SPECVERIFY_THREADS
    is the only override), reported in the header."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("SPECVERIFY_THREADS", raising=False)
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*intra-op threads 1*"])
    monkeypatch.setenv("SPECVERIFY_THREADS", "2")
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*intra-op threads 2*"])
