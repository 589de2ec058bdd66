"""The vocab-split Triton argmax (interpreted on the CPU, native on CUDA) against the reference's
first-maximal-index rule, over every logits dtype, tie-heavy rows and block boundaries."""

from __future__ import annotations

import pytest
import torch

from reference.logits import greedy_token
from specverify import dtypes
from specverify.kernels.argmax import row_argmax
from specverify.conformance import strategies as S

pytestmark = pytest.mark.kernels


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


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_argmax_nan_ranks_above_inf_first_nan_wins(impl, dtype):
    """docs/semantics.md 6.1: NaN ranks above every number, +inf included; the first NaN wins,
    also when it sits in a later block than a +inf (the kernel's cross-block reduction)."""
    x = torch.zeros((4, 70))
    x[0, 3], x[0, 50] = float("inf"), float("nan")     # +inf in block 0, NaN in block 1
    x[1, 40], x[1, 60], x[1, 2] = float("nan"), float("nan"), 9.0
    x[2, 69] = float("nan")                             # NaN in the last, partial block
    x[3, :] = float("nan")
    values, _ = S.as_logits_dtype(x, dtype)
    kw = {"block_v": 32} if impl == "triton" else {}
    got = row_argmax(values.to(triton_device() if impl == "triton" else "cpu"), impl=impl, **kw).cpu()
    want = [greedy_token(row.float().numpy()) for row in values]
    assert got[:, 0].tolist() == want
    assert want[:2] == [50, 40]


@pytest.mark.cuda
def test_cuda_row_offsets_past_int32():
    """A verify's bs x D rows of a big vocabulary pass 2**31 elements: the kernel's row offsets are
    int64 (an int32 row * stride wraps negative there and reads another row). Three rows of a 4 GiB
    bfloat16 buffer whose row stride is 2**30 elements; only their first 64 columns matter."""
    dev = torch.device("cuda")
    stride, vocab = 2 ** 30, 64
    storage = torch.full((2 * stride + vocab,), -1.0, dtype=torch.bfloat16, device=dev)
    x = storage.as_strided((3, vocab), (stride, 1))
    x[0, 5], x[1, 17], x[2, 63] = 2.0, 3.0, 4.0
    x[2, 0] = 4.0                                     # a tie: the first index wins
    got = row_argmax(x, impl="triton").view(-1).tolist()
    del storage, x
    torch.cuda.empty_cache()
    assert got == [5, 17, 0], f"rows past element 2**31 read the wrong row: {got}"


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_argmax_keeps_each_index_in_its_row_of_the_column(impl):
    """keep = (column, rows): row n's index also lands at column[rows[n]], and nowhere else. The
    column is one column of a [R, S] table (stride S, as a chain draft's state rows are); the rows
    are out of order, skip table rows, and include the table's last; ties, NaN and -inf rows
    included. The returned indices are the plain call's."""
    dev = triton_device() if impl == "triton" else "cpu"
    kw = {"block_v": 32} if impl == "triton" else {}
    gen = torch.Generator().manual_seed(7)
    x = torch.cat([S.tie_heavy_rows(gen, 3, 70), torch.full((1, 70), float("-inf"))])
    x[1, 66] = float("nan")
    table = torch.full((9, 3), -5, dtype=torch.int64)
    rows = torch.tensor([8, 2, 5, 0])
    table_dev = table.to(dev)
    strided = torch.stack([rows, rows.flip(0)], 1).to(dev)[:, 0]       # the rows as a strided view
    assert strided.stride(0) == 2
    got = row_argmax(x.to(dev), impl=impl, keep=(table_dev[:, 1], strided), **kw).cpu()
    want = [greedy_token(row.numpy()) for row in x]
    assert got[:, 0].tolist() == want and want[1] == 66
    expected = torch.full((9, 3), -5, dtype=torch.int64)
    expected[rows, 1] = torch.tensor(want)
    assert torch.equal(table_dev.cpu(), expected)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_argmax_keep_of_no_rows_writes_nothing(impl):
    dev = triton_device() if impl == "triton" else "cpu"
    column = torch.full((4,), -5, dtype=torch.int64, device=dev)
    got = row_argmax(torch.zeros((0, 10), device=dev), impl=impl,
                     keep=(column, torch.zeros(0, dtype=torch.int64, device=dev)))
    assert got.shape == (0, 1) and column.tolist() == [-5] * 4


def test_argmax_keep_errors_name_the_argument():
    x, column = torch.zeros((2, 5)), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"keep's rows must lie in \[0, 4\)"):
        row_argmax(x, keep=(column, torch.tensor([0, 4])))
    with pytest.raises(ValueError, match=r"keep's rows must lie in \[0, 4\)"):
        row_argmax(x, keep=(column, torch.tensor([-1, 0])))
    with pytest.raises(ValueError, match=r"keep's rows must be \[2\] int64"):
        row_argmax(x, keep=(column, torch.tensor([0, 1, 2])))
    with pytest.raises(ValueError, match=r"keep's rows must be \[2\] int64"):
        row_argmax(x, keep=(column, torch.tensor([0, 1], dtype=torch.int32)))
    with pytest.raises(ValueError, match="keep's column must be a 1-D int64"):
        row_argmax(x, keep=(column.view(2, 2), torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="keep's column must be a 1-D int64"):
        row_argmax(x, keep=(column.float(), torch.tensor([0, 1])))
    with pytest.raises(TypeError, match=r"keep must be a \(column, rows\) pair"):
        row_argmax(x, keep=[column, torch.tensor([0, 1])])
    # Another device than x's (a meta tensor stands in for a GPU on a CPU-only machine).
    with pytest.raises(ValueError, match="keep's tensors must be on x's device cpu"):
        row_argmax(x, keep=(column.to("meta"), torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="keep's tensors must be on x's device cpu"):
        row_argmax(x, keep=(column, torch.tensor([0, 1], device="meta")))
