"""The vocab-split Triton argmax (interpreted on the CPU, native on CUDA) against the reference's
first-maximal-index rule, over every logits dtype, tie-heavy rows and block boundaries."""

from __future__ import annotations

import pytest
import torch

from reference.logits import greedy_token
from specverify import dtypes
from specverify.kernels.argmax import row_argmax
from tests.support import strategies as S


def triton_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", dtypes.LOGITS_DTYPES)
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100])
def test_triton_argmax_takes_the_first_maximum(dtype, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.cat([S.tie_heavy_rows(gen, 3, vocab), S.grid_logits(gen, 2, vocab)])
    values, _ = S.as_logits_dtype(x, dtype)
    got = row_argmax(values.to(triton_device()), impl="triton", block_v=32).cpu()
    want = [greedy_token(row.float().numpy()) for row in values]
    assert got[:, 0].tolist() == want


@pytest.mark.parametrize("dtype", ["float32", "float8_e4m3fn"])
def test_triton_argmax_edge_rows(dtype):
    x = torch.full((4, 70), float("-inf"))
    x[1, 69] = 1.0                      # max at the last column, in the last (partial) block
    x[2, [5, 40]] = 2.0                 # a tie across blocks goes to the lower index
    x[3, :] = 0.0                       # all equal: index 0
    values, _ = S.as_logits_dtype(x, dtype)
    got = row_argmax(values.to(triton_device()), impl="triton", block_v=32).cpu()
    assert got[:, 0].tolist() == [0, 69, 5, 0]


def test_argmax_errors():
    with pytest.raises(ValueError, match=r"x must be \[N, V\]"):
        row_argmax(torch.zeros(3))
    with pytest.raises(ValueError, match="impl must be one of"):
        row_argmax(torch.zeros(2, 3), impl="cuda")
