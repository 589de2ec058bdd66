"""Float comparison by the per-dtype tolerance table (specverify.dtypes.TOLERANCES): the one place
the registry, the goldens and the project's tests compare floats that need not be bit-equal."""

from __future__ import annotations

import torch

from specverify import dtypes


def rerun_hint(nodeid: str | None) -> str:
    return f"\nre-run: pytest '{nodeid}'" if nodeid else ""


def combined_tolerance(*dtype_names: str) -> dtypes.Tolerance:
    """The loosest table entry among the dtypes a value passed through."""
    tols = [dtypes.tolerance(n) for n in dtype_names]
    return dtypes.Tolerance(atol=max(t.atol for t in tols), rtol=max(t.rtol for t in tols))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype_name: str | tuple[str, ...], what: str,
                 nodeid: str | None = None) -> None:
    """Float comparison by the tolerance table: one dtype name, or every dtype the value passed
    through (the loosest entry applies)."""
    names = (dtype_name,) if isinstance(dtype_name, str) else tuple(dtype_name)
    tol = combined_tolerance(*names)
    dtype_name = "+".join(names)
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(e.shape)}{rerun_hint(nodeid)}")
    bad = ~torch.isclose(a, e, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
    if bad.any():
        err = (a - e).abs()
        idx = bad.nonzero()[:5].tolist()
        firsts = ", ".join(f"{tuple(i)}: {a[tuple(i)].item():.6g} vs {e[tuple(i)].item():.6g}" for i in idx)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements outside {dtype_name} tolerance "
            f"(atol {tol.atol:g}, rtol {tol.rtol:g}); max abs err {err.max().item():.3g}; first: {firsts}"
            f"{rerun_hint(nodeid)}")
