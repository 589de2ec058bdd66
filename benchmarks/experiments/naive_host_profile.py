"""Host-side profile (cProfile) of 20 captured naive-EAGLE steps at bs 64, steered and plain."""
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch  # noqa: E402

from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.models import build_models  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

bs = 64
m = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
prompts = [[(i * 7 + j) % 1000 + 1 for j in range(32)] for i in range(bs)]
naive = SpecConfig(algorithm="naive_eagle")
steered = steered_models(m, prompts, 200, agreement=0.7, spec=naive)
for name, models in (("plain", m), ("steered", steered)):
    dec = SpecDecoder(models, naive, SamplingParams(), seed=0, eos_token_id=None)
    reqs = new_requests(prompts, [200] * bs)
    dec.start(reqs)
    for _ in range(3):
        dec.step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        dec.step()
    torch.cuda.synchronize()
    prof.disable()
    print(f"== {name}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
