"""Torch ops launched by one eager EAGLE cycle (small preset, bs 8), most frequent first."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
from torch.profiler import profile, ProfilerActivity
from specverify.models import build_models
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecDecoder
from specverify.engine.spec_config import SpecConfig

topk = int(sys.argv[1]) if len(sys.argv) > 1 else 1
m = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
cfg = SpecConfig(num_steps=3, topk=topk, num_draft_tokens=4 if topk == 1 else 8, cuda_graph=False)
dec = SpecDecoder(m, cfg, SamplingParams(), seed=0, eos_token_id=None)
dec.start(new_requests([[(i * 7 + j) % 1000 + 1 for j in range(32)] for i in range(8)], [200] * 8))
dec.step()
buf = dec.runner._fill(8, {})
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as prof:
    dec.runner.fn(buf)
    torch.cuda.synchronize()
rows = sorted((e for e in prof.key_averages() if e.key.startswith("aten::") and e.device_time_total > 0),
              key=lambda e: -e.count)
for e in rows[:30]:
    print(f"{e.key:32s} calls {e.count:4d}  device {e.device_time_total / 1e3:.3f} ms")
