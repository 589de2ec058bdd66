"""Serving under continuous batching (issue 23 item 6): Poisson arrivals into a running `Engine`,
throughput and per-request latency (TTFT, TPOT) for target-only and EAGLE decoding.

The `small` preset (V=32000, H=512, 8 layers; float32 compute and logits), greedy, page size 16,
`max_running` 64. Requests: seeded random prompts of 16-63 tokens, 64 new tokens each (no EOS),
arriving as a Poisson process (seeded exponential gaps) at each `--rates` value, plus `burst` (all
at time 0, the offline case). EAGLE is S=3, topk 1 (D=4) with the draft steered to agree with the
target 70% of the time (`tests/support/steering.py`; mean accept length about 2.5), so its figures
show what speculation buys at a realistic acceptance; the steering's pre-run is not timed. Float32,
not bfloat16: the steering's oracle is the target's greedy continuation from a pre-run at other
batch compositions, and bfloat16 GEMMs differ with the batch shape (benchmarks/results/
batch_variance-*.md) often enough that the oracle leaves the run's own path after a few tokens and
acceptance falls to ~1.2 (measured on the H200 at 5e506b0 + this change); float32 keeps it on path.

The loop is a server's: at each iteration the requests whose arrival time has passed are added,
then `Engine.step()` runs one cycle boundary (admission and prefill of the newcomers, then one
step or cycle of the running requests, which ends in the step's single readback, so the host
clock after it is the device's). When nothing runs the loop waits for the next arrival.
- TTFT = the end of the step that prefilled the request (its first token is read back there)
  minus its arrival time; queueing included.
- TPOT = (finish time - first-token time) / (tokens - 1).
- throughput = tokens emitted / (last finish - first arrival); achieved rate = requests / that.
Before the measured runs a warm-up through the same engine captures every CUDA-graph bucket
(budgets 1..64, so the running set passes through every size) and meets every prefill width alone
alone and in groups (the first measured try, on a fresh machine, compiled Triton variants inside
its first Poisson run: steps of 4-10 s, TTFT of 9-14 s; rerun with a warm cache it was 10 ms);
captures during a measured run are counted (expected 0: a newcomer joins the captured cycle, it
never recaptures), and the slowest step is reported.

    PYTHONPATH=. python3 benchmarks/bench_serving.py            # a few minutes on an H100
    PYTHONPATH=. python3 benchmarks/bench_serving.py --quick    # fewer requests and rates
    python3 benchmarks/bench_serving.py --cpu-smoke --out /tmp/x
"""

from __future__ import annotations

import statistics
import time

from _common import base_parser, device_and_preset, header, out_dir, table, write_results  # puts the repo root on sys.path

import torch  # noqa: E402

import specverify  # noqa: E402
from specverify import Engine, SpecConfig  # noqa: E402
from specverify.engine.spec_config import cache_entries  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

ALGORITHMS = {"target-only": None, "EAGLE S3 k1": SpecConfig(num_steps=3, topk=1, page_size=16)}
RATES = (100.0, 400.0, 1600.0)         # requests per second; plus the burst
QUICK_RATES = (400.0,)
MAX_RUNNING = 64
NEW_TOKENS = 64
AGREEMENT = 0.7


def poisson_arrivals(n: int, rate: float | None, gen: torch.Generator) -> list[float]:
    """n arrival times (seconds from the start): exponential gaps of mean 1 / rate; None = burst."""
    if rate is None:
        return [0.0] * n
    gaps = torch.empty(n, dtype=torch.float64).exponential_(rate, generator=gen)
    return torch.cumsum(gaps, 0).tolist()


def serve(engine: Engine, prompts, arrivals: list[float], first_id: int) -> dict:
    """Play the arrivals on `engine` in real time; per-request (arrival, first token, finish, tokens)."""
    n = len(prompts)
    first_token: dict[int, float] = {}
    finish: dict[int, float] = {}
    unseen: set[int] = set()           # submitted, first token not read back yet
    nxt, slowest = 0, 0.0
    captures = engine.decoder.runner.captures
    start = time.perf_counter()
    while nxt < n or engine.has_unfinished():
        now = time.perf_counter() - start
        if nxt < n and not engine.has_unfinished() and arrivals[nxt] > now:
            time.sleep(arrivals[nxt] - now)
            now = arrivals[nxt]
        while nxt < n and arrivals[nxt] <= now:
            unseen.add(engine.add_request(prompts[nxt], NEW_TOKENS))
            nxt += 1
        before = time.perf_counter()
        ended = engine.step()
        t = time.perf_counter() - start
        slowest = max(slowest, time.perf_counter() - before)
        for i in [i for i in unseen if engine.requests[i].output]:
            first_token[i] = t
            unseen.discard(i)
        for i in ended:
            finish[i] = t
    ids = range(first_id, first_id + n)
    tokens = [len(engine.requests[i].output) for i in ids]
    ttft = [first_token[i] - arrivals[i - first_id] for i in ids]
    tpot = [(finish[i] - first_token[i]) / (k - 1) for i, k in zip(ids, tokens) if k > 1]
    span = max(finish.values()) - arrivals[0]
    accepts = [a for i in ids for a in engine.requests[i].accept_lengths]
    return dict(tokens=sum(tokens), span=span, ttft=ttft, tpot=tpot, requests=n, slowest=slowest,
                captures=engine.decoder.runner.captures - captures,
                accept=statistics.fmean(accepts) if accepts else None)


def warm_up(engine: Engine, warm, widths) -> int:
    """Capture every bucket (budgets 1..max_running: the running set passes each size), then meet
    every prefill width alone and in groups of 2, 3, 16 and 17 (Triton specializes integer
    arguments equal to 1 and divisible by 16), so no graph capture or kernel compilation lands in
    a measured run. Returns the next request id."""
    for i, p in enumerate(warm):
        engine.add_request(p, i + 1)
    engine.run()
    for group in (1, 2, 3, 16, 17):
        for i in range(0, len(widths), group):
            for p in widths[i:i + group]:
                engine.add_request(p, 2)
            engine.run()
    return len(engine.requests)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = base_parser(__doc__, quick_help="128 requests, one rate and the burst",
                     smoke_help="the tiny preset on the CPU, 12 requests, no graphs: checks the script")
    ap.add_argument("--requests", type=int, help="measured requests per run (default 512; 128 --quick)")
    ap.add_argument("--rates", help="comma-separated arrival rates in requests/s (default 100,400,1600)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device, preset = device_and_preset(args, "bench_serving.py")
    n = args.requests or (12 if args.cpu_smoke else 128 if args.quick else 512)
    rates = tuple(float(r) for r in args.rates.split(",")) if args.rates else QUICK_RATES if args.quick else RATES
    running = 4 if args.cpu_smoke else MAX_RUNNING
    dtype = "float32"
    models = specverify.build_models(preset, device=device, seed=args.seed, compute_dtype=dtype, logits_dtype=dtype)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = models.config.vocab_size
    runs = [None, *rates]
    # Request ids: the warm-up's first, then each run's, in order (the steering oracle is keyed by id).
    warm = [torch.randint(0, vocab, (int(torch.randint(16, 64, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(running)]
    measured = [[torch.randint(0, vocab, (int(torch.randint(16, 64, (1,), generator=gen)),), generator=gen).tolist()
                 for _ in range(n)] for _ in runs]
    widths = [warm[0][:1] * n for n in range(16, 64)]     # one prompt of each width, for the warm-up
    every = warm + widths * 5 + [p for batch in measured for p in batch]     # in the order of the ids
    rows = []
    for name, spec in ALGORITHMS.items():
        m = models
        if spec is not None:
            m = steered_models(models, every, [NEW_TOKENS] * len(every), agreement=AGREEMENT, spec=spec)
        # A pool for max_running of the longest requests: admission waits for rows, never for pages.
        engine = Engine(m, spec=spec, max_running=running, page_size=16,
                        num_pages=1 + running * -(-cache_entries(spec, 63, NEW_TOKENS) // 16))
        first = warm_up(engine, warm, widths)
        for rate, prompts in zip(runs, measured):
            arrivals = poisson_arrivals(n, rate, torch.Generator().manual_seed(args.seed * 7919 + len(rows)))
            r = serve(engine, prompts, arrivals, first)
            first += n
            rows.append([name, "burst" if rate is None else f"{rate:g}", n, f"{r['requests'] / r['span']:.0f}",
                         f"{r['tokens'] / r['span']:.0f}", f"{1e3 * statistics.median(r['ttft']):.1f}",
                         f"{1e3 * pct(r['ttft'], 0.99):.1f}", f"{1e3 * statistics.median(r['tpot']):.2f}",
                         f"{1e3 * pct(r['tpot'], 0.99):.2f}",
                         "-" if r["accept"] is None else f"{r['accept']:.2f}", f"{1e3 * r['slowest']:.1f}",
                         r["captures"]])
            print(rows[-1], flush=True)
    lines = header("Serving: Poisson arrivals into the continuous-batching engine", args.cpu_smoke, {
        "Preset": f"{preset}, {dtype} compute and logits, greedy, page size 16, max_running {running}",
        "Requests": f"{n} per run, prompts of 16-63 tokens, {NEW_TOKENS} new tokens each, no EOS",
        "EAGLE draft": f"steered, agreement {AGREEMENT} (tests/support/steering.py)",
        "Warm-up": "every CUDA-graph bucket captured and every prefill width met before the measured runs",
    })
    lines += table(["algorithm", "rate (req/s)", "requests", "achieved req/s", "tok/s", "TTFT p50 ms",
                    "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "accept", "slowest step ms", "captures"], rows)
    lines += ["", "TTFT includes queueing (arrival to the readback of the first token); TPOT is per request, "
              "first token to finish over tokens - 1. slowest step: the longest `Engine.step()` of the run (admission and prefill "
              "included). captures: CUDA graphs captured during the measured run."]
    write_results(lines, out_dir(args.out, args.cpu_smoke), "serving", args.cpu_smoke)


if __name__ == "__main__":
    main()
