"""What every kernel wrapper shares: argument checks, the choice of implementation, and the
check that a Triton kernel can launch on the tensors' device."""

from __future__ import annotations

import torch

IMPLS = ("auto", "triton", "torch")


def check_tensor(name: str, t, shape: tuple, dtype: torch.dtype, device: torch.device | None) -> None:
    """Raise a ValueError naming `name` unless t is a tensor of this shape, dtype and device."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all inputs on one device)")


def pick_impl(impl: str, device: torch.device) -> str:
    """"auto" is Triton for GPU tensors and torch on the CPU (where Triton is only interpreted)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return impl


def check_launchable(kernel, device: torch.device) -> None:
    """CPU tensors can only go to an interpreted kernel (TRITON_INTERPRET=1 before triton loads)."""
    if device.type != "cuda" and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            f"impl='triton' on {device} tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
            f"before triton is imported, or pass CUDA tensors, or use impl='torch'")
