"""The conformance suite, as `pytest --pyargs specverify.conformance --sv-impl MODULE:OBJECT` collects it.

The implementation comes from `--sv-impl` (or SPECVERIFY_IMPL); without one, specverify's own ops
are checked (the project's tests/test_ops_differential.py runs the same functions). The tests are
made by specverify.conformance.suite; docs/conformance.md describes the interface and the report.
"""

from specverify.conformance.plugin import implementation_under_test
from specverify.conformance.suite import conformance_tests

globals().update(conformance_tests(implementation_under_test(), errors=False))
