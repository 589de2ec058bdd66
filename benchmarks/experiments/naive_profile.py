"""Where the naive-EAGLE cycle's time goes at a batch size (default 64), next to target-only:
step vs graph replay alone (host share), and the kernels of one eager cycle."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from specverify.models import build_models  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

bs = int(sys.argv[1]) if len(sys.argv) > 1 else 64
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 25
m = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
prompts = [[(i * 7 + j) % 1000 + 1 for j in range(32)] for i in range(bs)]
naive = SpecConfig(algorithm="naive_eagle")
steered = steered_models(m, prompts, 200, agreement=0.7, spec=naive)
runs = [("naive plain", lambda: SpecDecoder(m, naive, SamplingParams(), seed=0, eos_token_id=None)),
        ("naive steered", lambda: SpecDecoder(steered, naive, SamplingParams(), seed=0, eos_token_id=None)),
        ("target", lambda: TargetOnlyDecoder(m, SamplingParams(), seed=0, eos_token_id=None))]
for name, make in runs:
    dec = make()
    reqs = new_requests(prompts, [200] * bs)
    dec.start(reqs)
    for _ in range(3):
        dec.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    n0 = sum(len(r.output) for r in reqs)
    for _ in range(20):
        dec.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / 20 * 1e3
    tokens = (sum(len(r.output) for r in reqs) - n0) / 20
    g = next(iter(dec.runner.graphs.values()))
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    replay_ms = (time.perf_counter() - t) / 20 * 1e3
    print(f"{name} bs{bs}: step {step_ms:.3f} ms, replay alone {replay_ms:.3f} ms, host share "
          f"{step_ms - replay_ms:.3f} ms, {tokens:.1f} tokens/step -> {tokens / step_ms * 1e3:.0f} tok/s")
    bucket = [b for b in dec.runner.buckets if b >= bs][0]
    buf = dec.runner._fill(bucket, {})
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        dec.runner.fn(buf)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"  kernels in one eager cycle: {len(events)}, device time {sum(e.device_time for e in events) / 1e3:.3f} ms")
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name.replace(' ', '_')}_bs{bs}.txt"), "w") as f:
            f.write(table)
    else:
        print(table)
    del dec
