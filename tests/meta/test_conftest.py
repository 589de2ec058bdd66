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


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester


def test_platform_marked_tests_skip_and_slow_ones_deselect(suite, monkeypatch):
    monkeypatch.delenv("SPECVERIFY_RUN_SLOW", raising=False)
    result = suite.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=3, deselected=1)
    result.stdout.fnmatch_lines(["*cuda-marked: this machine is cpu*", "*rocm-marked: this machine is cpu*",
                                 "*gpu-marked: this machine is cpu*"])


def test_run_slow_option_runs_slow_tests(suite):
    result = suite.runpytest_subprocess("--run-slow", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=3)


def test_seed_is_crc32_of_test_id(suite):
    result = suite.runpytest_subprocess("-s", "-k", "plain", "-p", "no:cacheprovider")
    expected = zlib.crc32(b"test_sample.py::test_plain") & 0x7FFFFFFF
    result.stdout.fnmatch_lines([f"*SEED {expected}*"])


def test_report_header_names_platform_and_env(suite, monkeypatch):
    monkeypatch.setenv("SPECVERIFY_PLATFORM", "rocm-emulated")
    result = suite.runpytest_subprocess("-k", "plain", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*platform profile rocm-emulated*", "*torch *triton*",
                                 "*SPECVERIFY_PLATFORM*rocm-emulated*"])
