"""The golden comparison's reports, pinned (specverify/golden/comparison.py): which side is "got"
and which "want" in every message, the error a complex leaf reports, a dict met on either side.
Written for survivors of the first generated-mutant campaign (docs/mutation/seed-0.md): the golden
tests checked that a difference is found, not what the report says about it."""

from __future__ import annotations

import numpy as np

from specverify.golden.comparison import compare, compare_arrays


def test_a_complex_leaf_reports_the_distance_between_the_values():
    diff = compare_arrays(np.array([1 + 1j, 2 + 0j]), np.array([1 + 2j, 2 + 0j]), "exact", "float32")
    assert (diff.differ, diff.total) == (1, 2)
    assert diff.max_abs == 1.0 and diff.max_rel == 1.0 / abs(1 + 2j)


def test_list_items_keep_got_and_want_apart():
    result = compare({"xs": ["a", "b", "c"]}, {"xs": ["a", "c", "c"]}, rules={}, tolerance_dtype="float32")
    assert [d.message() for d in result.diffs] == ["xs[1]: got 'b', want 'c'"]


def test_a_dict_on_either_side_alone_is_a_structural_difference():
    got_dict = compare({"x": {"a": 1}}, {"x": 5}, rules={}, tolerance_dtype="float32")
    want_dict = compare({"x": 5}, {"x": {"a": 1}}, rules={}, tolerance_dtype="float32")
    assert [d.message() for d in got_dict.diffs] == ["x: got a dict, want a int"]
    assert [d.message() for d in want_dict.diffs] == ["x: got a int, want a dict"]
