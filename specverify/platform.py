"""Platform profiles: which device runs, and which policies hold there.

A profile is data. Native profiles describe the machine we are on (`cpu`, `cuda`, `rocm`);
emulated profiles (`cuda-emulated`, `rocm-emulated`) run on the CPU but carry another platform's
policies (its FP8 formats, whether the topk==1 argmax fast path is allowed), so ROCm-class
behaviour is exercised where no ROCm device exists. Every platform predicate of the package lives
in this file.
"""

from __future__ import annotations

import dataclasses
import os

import torch

ENV_VAR = "SPECVERIFY_PLATFORM"

CUDA_FP8 = ("float8_e4m3fn", "float8_e5m2")
ROCM_FP8 = ("float8_e4m3fnuz", "float8_e5m2fnuz")


@dataclasses.dataclass(frozen=True)
class PlatformProfile:
    name: str                    # profile name, e.g. "rocm-emulated"
    policy: str                  # whose policies apply: "cpu" | "cuda" | "rocm"
    device: str                  # torch device type the tensors live on: "cpu" | "cuda"
    native: bool                 # True when the policies' platform is the machine itself
    fp8_formats: tuple[str, ...]  # FP8 logits dtypes this platform serves
    argmax_fast_path: bool       # topk==1 may skip softmax and take argmax of the logits
    cuda_graphs: bool            # CUDA-graph capture and replay exist here
    triton_interpreted: bool     # Triton kernels run under TRITON_INTERPRET=1 (always on CPU tensors)

    def supports_fp8(self, dtype_name: str) -> bool:
        return dtype_name in self.fp8_formats

    def __str__(self) -> str:
        return self.name


def capturing(device: torch.device | str | None = None) -> bool:
    """True inside a CUDA-graph capture on the current stream: no host syncs may happen then.
    device: only a CUDA device can be capturing (None = ask CUDA if it is present)."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def native_platform() -> str:
    """The platform of this machine: "rocm" (a HIP build with a device), "cuda", or "cpu"."""
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    return "cpu"


def _profiles(native: str) -> dict[str, PlatformProfile]:
    profiles = {
        # The CPU is the neutral host: every FP8 format can be cast there, argmax is first-index.
        "cpu": PlatformProfile("cpu", "cpu", "cpu", native == "cpu", CUDA_FP8 + ROCM_FP8,
                               argmax_fast_path=True, cuda_graphs=False, triton_interpreted=True),
        "cuda-emulated": PlatformProfile("cuda-emulated", "cuda", "cpu", False, CUDA_FP8,
                                         argmax_fast_path=True, cuda_graphs=False,
                                         triton_interpreted=True),
        # ROCm keeps the softmax path for topk==1 (the FP8 tie-break regression of the seeds).
        "rocm-emulated": PlatformProfile("rocm-emulated", "rocm", "cpu", False, ROCM_FP8,
                                         argmax_fast_path=False, cuda_graphs=False,
                                         triton_interpreted=True),
    }
    if native == "cuda":
        profiles["cuda"] = PlatformProfile("cuda", "cuda", "cuda", True, CUDA_FP8,
                                           argmax_fast_path=True, cuda_graphs=True,
                                           triton_interpreted=False)
    if native == "rocm":
        profiles["rocm"] = PlatformProfile("rocm", "rocm", "cuda", True, ROCM_FP8,
                                           argmax_fast_path=False, cuda_graphs=True,
                                           triton_interpreted=False)
    return profiles


ALL_PROFILE_NAMES = ("cpu", "cuda", "rocm", "cuda-emulated", "rocm-emulated")


class ProfileUnavailable(ValueError, RuntimeError):
    """A known profile whose device this machine lacks (a ValueError of the argument, and a
    RuntimeError for callers that catch environment problems)."""


def _gpu_absence(kind: str) -> str:
    """Why this machine has no `kind` ("cuda" / "rocm") device, in a few words for an error."""
    native = native_platform()
    if native != "cpu":                     # a GPU of the other kind
        build = "HIP" if kind == "rocm" else "CUDA"
        return f"torch drives {native} devices here; a {kind} device needs a {build} build of torch"
    if torch.version.cuda is None and torch.version.hip is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return "torch.cuda.is_available() is False: no GPU is visible (driver, CUDA_VISIBLE_DEVICES)"


DEVICE_TYPES = ("cpu", "cuda")   # torch device types the models run on (a ROCm GPU is "cuda" to torch)


def check_device(device, *, name: str = "device") -> torch.device:
    """`device` (a str or a torch.device) as a torch.device this machine has, else the error that
    names `name`: TypeError for another type, ValueError for a string torch does not parse or a
    device type other than DEVICE_TYPES, ProfileUnavailable for a CUDA device that is absent (no
    GPU at all, or an index past torch.cuda.device_count())."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be None, a str or a torch.device, got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name} {device!r} is not a torch device ('cpu', 'cuda', 'cuda:0', ...)") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"{name} must be a 'cpu' or 'cuda' device (a ROCm GPU is 'cuda' to torch), got {device!r}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ProfileUnavailable(f"{name} {str(dev)!r} is absent: this machine has no CUDA device "
                                     f"({_gpu_absence('cuda')}); pass {name}='cpu' (platform='cuda-emulated' "
                                     f"or 'rocm-emulated' keeps a GPU's policies on the CPU)")
        if dev.index is not None and dev.index >= count:
            raise ProfileUnavailable(f"{name} {str(dev)!r} is absent: this machine has {count} CUDA device(s), "
                                     f"indices 0 to {count - 1} (torch.cuda.device_count() is {count})")
    return dev


def check_fp8_format(subject: str, dtype, profile: PlatformProfile) -> None:
    """The one FP8 policy check of the public API: ValueError when `dtype` (a dtype name or a
    torch.dtype) is an FP8 format that `profile` does not serve. `subject` names the argument
    the dtype came from (`logits_dtype`, `logits`, `models`); non-FP8 dtypes always pass."""
    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name.startswith("float8") and not profile.supports_fp8(dtype_name):
        raise ValueError(f"{subject} {dtype_name!r} is not an FP8 format of platform profile {profile.name!r} "
                         f"(it serves {profile.fp8_formats})")


def available_profiles() -> dict[str, PlatformProfile]:
    """Every profile that can run on this machine, by name."""
    return _profiles(native_platform())


def get_profile(name: str | None = None) -> PlatformProfile:
    """The profile called `name`, else the one `SPECVERIFY_PLATFORM` names, else the native one."""
    source = "platform"
    if name is None:
        name = os.environ.get(ENV_VAR) or native_platform()
        source = ENV_VAR if os.environ.get(ENV_VAR) else "native platform"
    if not isinstance(name, str):
        raise TypeError(f"platform must be None, a profile name or a PlatformProfile, got {type(name).__name__}")
    if name not in ALL_PROFILE_NAMES:
        raise ValueError(f"{source}: platform profile {name!r} is unknown; expected one of {ALL_PROFILE_NAMES}")
    profiles = available_profiles()
    if name not in profiles:
        raise ProfileUnavailable(f"{source}: platform profile {name!r} needs a {name} device, and this machine is "
                                 f"{native_platform()!r} ({_gpu_absence(name)}); emulate it with {name}-emulated")
    return profiles[name]


def resolve(platform: PlatformProfile | str | None) -> PlatformProfile:
    """Accept a profile, a profile name, or None (the default profile); TypeError for anything else."""
    if isinstance(platform, PlatformProfile):
        return platform
    if platform is not None and not isinstance(platform, str):
        raise TypeError(f"platform must be None, a profile name or a PlatformProfile, got {type(platform).__name__}")
    return get_profile(platform)
