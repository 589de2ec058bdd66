"""specverify's conformance suite: the op registry, its samples and checks, as an installed pytest plugin.

    pytest --pyargs specverify.conformance --sv-impl MODULE:OBJECT

runs the differential, property and law tests of every registry op against the implementation
`MODULE:OBJECT` names (SPECVERIFY_IMPL=MODULE:OBJECT works too); without it, against specverify's own
ops. docs/conformance.md describes the interface and the report.
"""
