"""The numpy example adapter (specverify.conformance.adapters.example) held to the conformance
suite in-process: the same test functions `pytest --pyargs specverify.conformance --sv-impl
specverify.conformance.adapters.example:IMPL` runs. The example must keep conforming; the zoo's
broken-adapter mutants (tests/mutants/conformance.toml) plant a bug in it and must fail here."""

from specverify.conformance.adapters.example import IMPL
from specverify.conformance.suite import conformance_tests

globals().update(conformance_tests(IMPL, errors=False, missing="omit"))
