"""Kernels of one replayed captured step, per case of tests/test_kernel_budget.py (issue 25): what
to write into its MEASURED table when a change moves a count (CUDA only).

    PYTHONPATH=. python3 benchmarks/experiments/kernel_counts.py
"""

from __future__ import annotations

import torch

from tests.test_kernel_budget import MEASURED, SPECS, captured_step_kernels


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("kernel_counts.py: needs a CUDA GPU")
    for name, spec in SPECS.items():
        got = captured_step_kernels(spec)
        print(f"{name}: {got} kernels a captured step (the budget's measured count: {MEASURED[name]})")


if __name__ == "__main__":
    main()
