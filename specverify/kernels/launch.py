"""What every kernel wrapper shares: argument checks, the choice of implementation, and the
check that a Triton kernel can launch on the tensors' device.

Loop bounds: Triton 3.6's interpreter runs a kernel as Python and holds every scalar (a kernel
argument, a loaded or computed value) as a 1-element NumPy array; range() turns its bound into a
Python int with int(array), which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be converted
to Python scalars"), while a while condition only needs bool(array), which NumPy still allows. So a
loop whose trip count is read at run time is a `while` loop where that is no slower compiled. A
constexpr bound is a Python int in every version, so a loop over one may stay a for loop. Compiled,
Triton software-pipelines for loops only: attention.py's KV loop stays `for ... in range(...)`, as
a while loop there ran 2x slower on an H100, spilling registers. So that one kernel does not run
under Triton 3.6's interpreter with NumPy >= 2.4; its tests are strict xfails there, by
tests/expectations/all.toml, under a condition probed at start-up (tests/matrix/conditions.py).
"""

from __future__ import annotations

import math

import torch

IMPLS = ("auto", "triton", "torch")

# A TF32 tensor-core operand keeps float32's sign, its 8 exponent bits and the top 10 of its 23
# fraction bits; the low 13 fraction bits are these.
TF32_FRACTION_BITS = 10
TF32_LOW_BITS = (1 << (23 - TF32_FRACTION_BITS)) - 1


def gpu_backend() -> str:
    """The GPU backend the kernels are built for: "hip" under a ROCm build of torch, else "cuda"
    (the Triton interpreter stands in for a CUDA GPU)."""
    return "hip" if torch.version.hip else "cuda"


def tf32_exact(dtype: torch.dtype, backend: str | None = None) -> bool:
    """Whether a kernel built for `backend` (default: `gpu_backend()`) can take products of two
    `dtype` values on the TF32 tensor cores and keep each product exact. NVIDIA ("cuda") only: no
    TF32 dot on ROCm. The dtype's significand must fit TF32's (bfloat16 has 7 fraction bits,
    float16 10, float32 23) and its exponent range TF32's (float32's, which both 16-bit ones fit)."""
    fraction_bits = 1 - math.frexp(torch.finfo(dtype).eps)[1]          # eps == 2 ** -fraction_bits
    return (backend or gpu_backend()) == "cuda" and fraction_bits <= TF32_FRACTION_BITS


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


def interpreted(kernel) -> bool:
    """Whether a @triton.jit kernel runs under the interpreter (TRITON_INTERPRET=1 when triton loaded)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_launchable(kernel, device: torch.device) -> None:
    """CPU tensors can only go to an interpreted kernel (TRITON_INTERPRET=1 before triton loads)."""
    if device.type != "cuda" and not interpreted(kernel):
        raise RuntimeError(
            f"impl='triton' on {device} tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
            f"before triton is imported, or pass CUDA tensors, or use impl='torch'")
