"""Where a captured cycle's time goes: host step vs replay, and the kernels of one eager cycle."""
import sys, os, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
from specverify.models import build_models
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.speculative import SpecDecoder
from specverify.engine.spec_config import SpecConfig
from specverify.engine.target_only import TargetOnlyDecoder

m = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
bs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
prompts = [[(i * 7 + j) % 1000 + 1 for j in range(32)] for i in range(bs)]
for name, dec in [("spec k1", SpecDecoder(m, SpecConfig(num_steps=3, topk=1), SamplingParams(), seed=0, eos_token_id=None)),
                  ("spec k4", SpecDecoder(m, SpecConfig(num_steps=3, topk=4, num_draft_tokens=8), SamplingParams(), seed=0, eos_token_id=None)),
                  ("target", TargetOnlyDecoder(m, SamplingParams(), seed=0, eos_token_id=None))]:
    dec.start(new_requests(prompts, [200] * bs))
    for _ in range(3):
        dec.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        dec.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / 20 * 1e3
    g = next(iter(dec.runner.graphs.values()))
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    replay_ms = (time.perf_counter() - t) / 20 * 1e3
    print(f"{name} bs{bs}: step {step_ms:.3f} ms, replay alone {replay_ms:.3f} ms")
    fn = dec.runner.fn
    buf = dec.runner._fill(dec.runner.buckets[0] if bs == 1 else [b for b in dec.runner.buckets if b >= bs][0], {})
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn(buf)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"  kernels in one eager cycle: {len(events)}, device time {sum(e.device_time for e in events) / 1e3:.3f} ms")
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print("\n".join(table.splitlines()[:32]))
