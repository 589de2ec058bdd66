"""specverify: an optimized speculative decoder and the suite that holds it against a reference.

Public entry points: `build_models`, `generate`, `Engine`, `get_profile`.

The names are resolved on first use (PEP 562), so that importing a submodule alone -- the
conformance plugin, which pytest loads in every session of an environment where specverify is
installed -- does not import torch and the decoder.
"""

import importlib

_PUBLIC = {
    "GenerationOutput": "specverify.engine", "SamplingParams": "specverify.engine", "SpecConfig": "specverify.engine",
    "TokenLogprob": "specverify.engine", "generate": "specverify.engine", "Engine": "specverify.engine",
    "Models": "specverify.models", "build_models": "specverify.models",
    "PlatformProfile": "specverify.platform", "get_profile": "specverify.platform",
}
__all__ = ["build_models", "generate", "Engine", "get_profile", "SpecConfig", "Models", "GenerationOutput", "TokenLogprob",
           "SamplingParams", "PlatformProfile"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specverify' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
