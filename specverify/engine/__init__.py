"""The decoder loop over the models: requests, batching, EOS, max_new_tokens, logprobs."""

from specverify.engine.generate import GenerationOutput, generate
from specverify.engine.serving import Engine
from specverify.protocol.output import TokenLogprob
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig

__all__ = ["generate", "Engine", "GenerationOutput", "TokenLogprob", "SamplingParams", "SpecConfig"]
