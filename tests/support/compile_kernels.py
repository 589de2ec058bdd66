"""Compile every Triton kernel of specverify for an H100 (sm_90) or an MI300 (gfx942), on any machine,
GPU or not.

The CPU suite runs the kernels under the Triton interpreter, which executes their Python and
never meets the compiler: a kernel can pass every interpreted test and still fail to compile for
a GPU (a constexpr specialization, a type the interpreter lets through). This script, run in a
process where TRITON_INTERPRET is unset, replaces the launch of every `@triton.jit` kernel with
Triton's own argument binding and specialization (the path `JITFunction.run` takes) followed by a
compile for the target (CUDA sm_90 down to PTX and cubin, ptxas ships with triton; or HIP gfx942
down to AMDGCN and an hsaco), and launches nothing. It drives the launches through the Triton
records of the op registry, every sample of every dtype the target's platform policy runs (cuda or
rocm), so each kernel compiles with the arguments, dtypes and
block sizes its wrapper really passes ("auto" takes the kernel, as on a GPU). It fails when a kernel does not compile or when no record
launched it.

    python -m tests.support.compile_kernels [cuda|rocm]   # one line per kernel, then a summary
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import traceback

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("compile_kernels: unset TRITON_INTERPRET (the interpreter never compiles)")

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, compile as triton_compile, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

TARGETS = {"cuda": GPUTarget("cuda", 90, 32), "rocm": GPUTarget("hip", "gfx942", 64)}
TARGET = TARGETS["cuda"]
compiled: dict[str, set] = {}
failures: list[str] = []


def _compile_only(self, *args, grid, warmup, **kwargs):
    """JITFunction.run up to the compile: bind, specialize, compile for TARGET, launch nothing.
    The binding and the launch options are checked here too (a num_warps the target refuses, an
    argument the kernel has no parameter for): their error is the kernel's failure, never an
    exception the wrapper's caller swallows as a launch that did not run."""
    kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    name = f"{self.fn.__module__}.{self.fn.__name__}"
    try:
        backend = make_backend(TARGET)
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
    except Exception as e:          # noqa: BLE001 - a launch the target refuses is the kernel's failure
        launch = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
        failures.append(f"{name} {launch}: the launch does not bind: {type(e).__name__}: {str(e)[:1500]}")
        return None
    key = repr((signature, sorted(constexprs.items(), key=repr), sorted(attrs.items(), key=repr), options))
    if key in compiled.setdefault(name, set()):
        return None
    compiled[name].add(key)
    try:
        triton_compile(ASTSource(self, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
    except Exception as e:          # noqa: BLE001 - every compile error is reported, with its kernel
        failures.append(f"{name} {signature} {constexprs}: {type(e).__name__}: {str(e)[:1500]}")
    return None


def kernels() -> dict[str, JITFunction]:
    """Every @triton.jit kernel defined in specverify.kernels (a `_kernel` name: the other jit
    functions are device functions the kernels call, compiled inside them)."""
    import specverify.kernels as package
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"specverify.kernels.{info.name}")
        for value in vars(module).values():
            if isinstance(value, JITFunction) and value.fn.__module__ == module.__name__ \
                    and value.fn.__name__.endswith("_kernel"):
                found[f"{module.__name__}.{value.fn.__name__}"] = value
    return found


def main(policy: str = "cuda") -> int:
    global TARGET
    TARGET = TARGETS[policy]
    JITFunction.run = _compile_only
    every = kernels()
    import specverify.kernels as package
    from specverify.kernels import launch
    original, tf32_exact = launch.pick_impl, launch.tf32_exact

    def tf32_exact_on_target(dtype, backend=None):
        return tf32_exact(dtype, TARGET.backend)      # TF32 products where the target backend has them

    def kernel_unless_torch(impl, device):
        original(impl, device)                        # the argument check
        return "torch" if impl == "torch" else "triton"
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"specverify.kernels.{info.name}")
        if hasattr(module, "check_launchable"):       # the wrappers' device check: CPU tensors go on
            module.check_launchable = lambda kernel, device: None
        if hasattr(module, "pick_impl"):              # "auto" takes the kernel, as on a GPU
            module.pick_impl = kernel_unless_torch
        if hasattr(module, "tf32_exact"):
            module.tf32_exact = tf32_exact_on_target
    from specverify.conformance.registry import REGISTRY
    from specverify.platform import get_profile
    profile = get_profile("cpu")
    for op in REGISTRY.values():
        dtypes = sorted(set(op.dtypes_for(policy)) | set(op.dtypes_for("cpu")))
        for dtype in dtypes:
            for sample in op.samples(dtype, 0):
                try:
                    op.impl(sample, profile)
                except Exception:          # noqa: BLE001 - outputs of a launch that never ran are garbage
                    pass
    for name in sorted(compiled):
        print(f"compiled {name}: {len(compiled[name])} specialization(s)")
    missing = sorted(set(every) - set(compiled))
    for name in missing:
        failures.append(f"{name}: no registry record launched it (its wrapper is not covered)")
    for line in failures:
        print("FAIL", line)
    print(f"triton {triton.__version__}, target {TARGET.backend} {TARGET.arch}: {len(compiled)} kernel(s), "
          f"{sum(map(len, compiled.values()))} specialization(s), {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:2]))
    except Exception:                      # noqa: BLE001
        traceback.print_exc()
        sys.exit(2)
