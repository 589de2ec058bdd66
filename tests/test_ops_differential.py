"""Differential, property, law and error-input tests generated from the op registry.

The test functions are specverify.conformance.suite's, the same the installed conformance plugin
runs against another engine: here against specverify's own ops, or against the implementation
`SPECVERIFY_IMPL=module:object` (or `--sv-impl`) names. Test ids are `op-profile-dtype`; a failure
names the sample, its seed and a command that re-runs just that sample (`--sv-sample NAME`).

Platform-dependent ops run on every available profile, or, when `SPECVERIFY_PLATFORM` names one
(a `specverify matrix` run per profile), on that profile only; the others run once, natively.
Expected failures and skips are data (tests/expectations/, applied by the conftest)."""

from specverify.conformance.plugin import implementation_under_test
from specverify.conformance.suite import conformance_tests

globals().update(conformance_tests(implementation_under_test()))
