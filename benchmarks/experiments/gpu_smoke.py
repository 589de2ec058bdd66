"""Quick GPU smoke of the device cycle (temporary)."""
import sys, os, time, warnings
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
from specverify import generate, SpecConfig
from specverify.models import build_models
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecDecoder

cpu = build_models("tiny", seed=3, device="cpu")
gpu = build_models("tiny", seed=3, device="cuda")
prompts = [[5, 6, 7], [1], [9, 9, 4, 4, 2], [3, 3], [8, 1, 2]]
budgets = [12, 5, 9, 20, 7]
for cfg in [SpecConfig(num_steps=3, topk=1), SpecConfig(num_steps=3, topk=2, num_draft_tokens=5, page_size=2),
            SpecConfig(num_steps=3, topk=2, num_draft_tokens=5, cuda_graph=False)]:
    for kw in [dict(), dict(temperature=0.8, top_k=20, seed=4)]:
        a = generate(cpu, prompts, spec=cfg, max_new_tokens=budgets, **kw)
        b = generate(gpu, prompts, spec=cfg, max_new_tokens=budgets, **kw)
        print("spec", cfg.topk, cfg.cuda_graph, kw, a.tokens == b.tokens, a.accept_lengths == b.accept_lengths)
for kw in [dict(), dict(temperature=0.8, top_k=20, seed=4)]:
    a = generate(cpu, prompts, max_new_tokens=budgets, **kw)
    b = generate(gpu, prompts, max_new_tokens=budgets, **kw)
    print("target", kw, a.tokens == b.tokens)
# sync debug
dec = SpecDecoder(gpu, SpecConfig(num_steps=3, topk=2, num_draft_tokens=5), SamplingParams(0.7, 20), seed=1, eos_token_id=None)
dec.start(new_requests(prompts, [30] * 5))
dec.step()
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    c0 = dec.readback.count
    for _ in range(5):
        dec.step()
torch.cuda.set_sync_debug_mode(0)
print("sync warnings in 5 steps:", len(w), [str(x.message)[:80] for x in w][:3], "readbacks", dec.readback.count - c0,
      "captures", dec.runner.captures)
small = build_models("small", seed=0, device="cuda")
for graph in [True, False]:
    cfg = SpecConfig(num_steps=3, topk=1, cuda_graph=graph)
    p = [[(i * 7 + j) % 1000 + 1 for j in range(32)] for i in range(8)]
    dec = SpecDecoder(small, cfg, SamplingParams(), seed=0, eos_token_id=None)
    dec.start(new_requests(p, [64] * 8))
    for _ in range(3):
        dec.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        dec.step()
    torch.cuda.synchronize()
    print("small bs8 graph" if graph else "small bs8 eager", (time.perf_counter() - t) / 10 * 1e3, "ms/cycle")
