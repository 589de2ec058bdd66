"""The golden files' tree codec (specverify/golden/trees.py), pinned where the first generated-
mutant campaign found it unpinned (docs/mutation/seed-0.md): a tensor dtype without a numpy twin
travels as its bits, and a malformed node is a ValueError naming the file and the node, never a
TypeError or KeyError from inside the decoder."""

from __future__ import annotations

import pytest
import torch

from specverify.golden.trees import decode, encode


@pytest.mark.parametrize("dtype", [torch.uint32, torch.bfloat16, torch.float8_e4m3fn, torch.uint16])
def test_a_dtype_without_a_numpy_twin_round_trips_as_its_bits(dtype):
    x = torch.tensor([0, 1, 3, 100], dtype=torch.int64).to(dtype)
    skeleton, arrays = encode({"x": x})
    back = decode(skeleton, arrays)["x"]
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("skeleton, message", [
    ({"$dict": 5}, r"^golden: malformed \$dict node at the root \(TypeError: "),
    ({"$pairs": [[1]]}, r"^golden: the root: not enough values to unpack"),
    ({"$dict": {"k": {"$pairs": [[1]]}}, "order": ["k"]}, r"^golden: k: not enough values to unpack"),
])
def test_a_malformed_node_is_a_value_error_naming_it(skeleton, message):
    with pytest.raises(ValueError, match=message):
        decode(skeleton, {})
