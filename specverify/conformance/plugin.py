"""The conformance suite's pytest plugin (entry point `pytest11`), inert unless asked.

Loaded in every pytest session of an environment where specverify is installed, it only adds its
options (`--sv-impl`, `--sv-sample`, `--sv-report`) until a run asks for it: `--sv-impl`,
`--sv-report`, or `--pyargs specverify.conformance`. Then it sets what the conformance tests need
(the Triton interpreter when there is no GPU, its markers) and, with `--sv-report PATH`, writes
PATH.md and PATH.json (specverify/conformance/report.py). This module imports only the standard
library and pytest at load time.
"""

from __future__ import annotations

import os

import pytest

IMPL_ENV = "SPECVERIFY_IMPL"
IMPL_OPTION = "--sv-impl"
SAMPLE_OPTION = "--sv-sample"
REPORT_OPTION = "--sv-report"
MARKERS = {
    "kernels": "runs Triton kernels or the op registry",
    "fp8": "exercises FP8 logits or quantization",
    "cuda": "needs a native CUDA device",
    "rocm": "needs a native ROCm device",
}


def pytest_addoption(parser):
    group = parser.getgroup("specverify", "specverify conformance (docs/conformance.md)")
    group.addoption(IMPL_OPTION, default=None, metavar="MODULE:OBJECT",
                    help=f"the implementation the conformance tests check (as {IMPL_ENV}=MODULE:OBJECT), e.g. "
                         "specverify.conformance.adapters.example:IMPL")
    group.addoption(SAMPLE_OPTION, default=None, metavar="NAME",
                    help="test_differential: run only the registry sample called NAME (a failure prints it)")
    group.addoption(REPORT_OPTION, default=None, metavar="PATH",
                    help="write the conformance report to PATH.md and PATH.json")


def asked(config) -> bool:
    """Whether this session is a conformance run (otherwise the plugin does nothing)."""
    if config.getoption(IMPL_OPTION) or config.getoption(REPORT_OPTION):
        return True
    return any("specverify.conformance" in str(a) or "specverify/conformance" in str(a) for a in config.args)


def pytest_configure(config):
    impl = config.getoption(IMPL_OPTION)
    if impl:
        os.environ[IMPL_ENV] = impl
    if not asked(config):
        return
    if "TRITON_INTERPRET" not in os.environ:
        import torch       # only now: a session that does not ask pays nothing
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"     # before anything imports triton
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    path = config.getoption(REPORT_OPTION)
    if path and not hasattr(config, "workerinput"):         # the xdist controller (or a plain run) writes it
        from specverify.conformance.report import ReportCollector
        config.pluginmanager.register(ReportCollector(config, path), "specverify-conformance-report")


def implementation_under_test():
    """The object `--sv-impl` / SPECVERIFY_IMPL names (None: specverify's own ops)."""
    from specverify.conformance.registry import load_impl
    return load_impl()


@pytest.fixture
def sv_impl():
    """The implementation under test (None: specverify's own ops)."""
    return implementation_under_test()
