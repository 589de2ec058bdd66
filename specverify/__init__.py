"""specverify: an optimized speculative decoder and the suite that holds it against a reference.

Public entry points: `build_models`, `generate`, `get_profile`.
"""

from specverify.engine import GenerationOutput, SamplingParams, SpecConfig, TokenLogprob, generate
from specverify.models import Models, build_models
from specverify.platform import PlatformProfile, get_profile

__all__ = ["build_models", "generate", "get_profile", "SpecConfig", "Models", "GenerationOutput", "TokenLogprob",
           "SamplingParams", "PlatformProfile"]
__version__ = "0.1.0"
