"""Which `Engine.step()` calls of bench_serving's target-only run at 100 req/s are slow, and why:
each slow step is printed with its admissions (count, prompt widths), the running count before it,
and a cProfile of the slowest one. An experiment behind benchmarks/results/serving-*.md."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import bench_serving as bs  # noqa: E402
import specverify  # noqa: E402
from specverify import Engine  # noqa: E402

models = specverify.build_models("small", device="cuda", compute_dtype="float32", logits_dtype="float32")
gen = torch.Generator().manual_seed(0)
V = models.config.vocab_size
warm = [torch.randint(0, V, (int(torch.randint(16, 64, (1,), generator=gen)),), generator=gen).tolist() for _ in range(64)]
widths = [warm[0][:1] * n for n in range(16, 64)]
prompts = [torch.randint(0, V, (int(torch.randint(16, 64, (1,), generator=gen)),), generator=gen).tolist()
           for _ in range(256)]
engine = Engine(models, max_running=64, page_size=16, num_pages=1 + 64 * 9)
first = bs.warm_up(engine, warm, widths)
burst = [torch.randint(0, V, (int(torch.randint(16, 64, (1,), generator=gen)),), generator=gen).tolist()
         for _ in range(512)]
t = time.perf_counter()
print("burst run as bench_serving makes it:", {k: v for k, v in bs.serve(engine, burst, [0.0] * 512, first).items()
                                                if k in ("slowest", "span", "captures")}, flush=True)
arrivals = bs.poisson_arrivals(len(prompts), 100.0, torch.Generator().manual_seed(1))
start, nxt, slow = time.perf_counter(), 0, []
prof = None
while nxt < len(prompts) or engine.has_unfinished():
    now = time.perf_counter() - start
    if nxt < len(prompts) and not engine.has_unfinished() and arrivals[nxt] > now:
        time.sleep(arrivals[nxt] - now)
        now = arrivals[nxt]
    added = []
    while nxt < len(prompts) and arrivals[nxt] <= now:
        engine.add_request(prompts[nxt], 64)
        added.append(len(prompts[nxt]))
        nxt += 1
    waiting = [len(r.prompt) for r in engine.waiting]
    running = len(engine.decoder.running())
    p = cProfile.Profile()
    t0 = time.perf_counter()
    p.enable()
    engine.step()
    p.disable()
    dt = time.perf_counter() - t0
    if dt > 0.05:
        slow.append((dt, running, waiting))
        if prof is None or dt > prof[0]:
            prof = (dt, p)
print(f"{len(slow)} slow steps (> 50 ms); the first 20 (seconds, running before, widths waiting):")
for s in slow[:20]:
    print(f"  {s[0]:.3f} s, running {s[1]}, waiting {s[2]}")
if prof:
    out = io.StringIO()
    pstats.Stats(prof[1], stream=out).sort_stats("cumulative").print_stats(25)
    print(out.getvalue())
