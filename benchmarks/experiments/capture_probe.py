"""Which events invalidate a CUDA-graph capture? One probe per mechanism, each in its own process.

The runner before issue 9 captured in torch's default (global) mode, on torch's shared capture
stream, with the garbage collector running; once (H200, bs 1, after eager work) a capture failed
and it was retried. This script asks, mechanism by mechanism, which things that can happen in
the middle of a capture break it:

- a garbage collection that finalizes an object from earlier work (a graph, an event, a pinned
  host buffer, a tensor used on another stream, a stream), forced inside the capture with
  gc.collect(), which is what an automatic collection at an allocation would do;
- the first use of something lazily created (cuBLAS on a stream it never ran on, a Triton
  specialization never compiled, a torch kernel never launched);
- a host call the capture forbids (a pinned host allocation, an event query, a synchronize).

    python benchmarks/experiments/capture_probe.py [--modes global,thread_local] [--out DIR]

Each probe prints `ok` or the first line of the error; the report is a markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import subprocess
import sys


# ---------------------------------------------------------------- probes (run in a child process)

def _cycle(obj) -> None:
    """Leave `obj` reachable only from a dead reference cycle: freed at the next collection."""
    holder = {"obj": obj}
    holder["self"] = holder


def _small_work(torch, x):
    return (x * 2 + 1).sum(0)


def _setup_garbage(torch, kind: str):
    dev = "cuda"
    if kind == "plain":
        _cycle(object())
    elif kind == "device_tensor":
        _cycle(torch.randn(1 << 20, device=dev))
    elif kind == "tensor_used_on_side_stream":
        t = torch.randn(1 << 20, device=dev)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t.mul_(2)
        t.record_stream(side)
        _cycle(t)
    elif kind in ("graph_own_pool", "graph_replay_pending", "graph_sharing_the_capture_pool"):
        x = torch.randn(1 << 20, device=dev)
        _small_work(torch, x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = _small_work(torch, x)
        if kind == "graph_replay_pending":
            for _ in range(50):
                g.replay()
        _cycle((g, x, y))
        if kind == "graph_sharing_the_capture_pool":
            return g.pool()                  # the new capture allocates from the dead graph's pool
    elif kind == "event":
        e = torch.cuda.Event()
        e.record()
        _cycle(e)
    elif kind == "event_pending":
        x = torch.randn(1 << 24, device=dev)
        for _ in range(20):
            x = x * 1.0001
        e = torch.cuda.Event()
        e.record()
        _cycle((e, x))
    elif kind == "pinned_h2d":
        p = torch.randn(1 << 20).pin_memory()
        d = torch.empty(1 << 20, device=dev)
        d.copy_(p, non_blocking=True)
        _cycle(p)
    elif kind == "pinned_d2h":
        d = torch.randn(1 << 20, device=dev)
        p = torch.empty(1 << 20, pin_memory=True)
        p.copy_(d, non_blocking=True)
        _cycle(p)
    elif kind == "stream":
        _cycle(torch.cuda.Stream())
    return None


def _capture_body(torch, kind: str, x):
    """What runs inside the capture besides the small work."""
    if kind.startswith("gc:"):
        gc.collect()
    elif kind == "triton_new_specialization":
        _triton_add(torch, x, 32)            # warmed at n=17: 32 is a new (divisible by 16) specialization
    elif kind == "triton_first_compile":
        _triton_add(torch, x, 17, kernel="fresh")
    elif kind == "torch_first_kernel":
        torch.special.i1e(x[:64])            # a kernel nothing launched before
    elif kind == "pinned_alloc":
        torch.empty(1024, pin_memory=True)
    elif kind == "event_query":
        torch.cuda.Event().query()
    elif kind == "synchronize":
        torch.cuda.synchronize()
    elif kind == "graph_deleted_by_refcount":
        _DEAD.pop()                          # the last reference to a captured graph, no collector
    return None


_DEAD = []


_KERNELS = {}


def _triton_add(torch, x, n: int, kernel: str = "warm"):
    import triton
    import triton.language as tl

    if kernel not in _KERNELS:
        @triton.jit
        def add_one(ptr, n_elements, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n_elements
            tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) + 1.0, mask=mask)
        _KERNELS[kernel] = add_one
    _KERNELS[kernel][(triton.cdiv(n, 64),)](x, n, BLOCK=64)


def run_probe(kind: str, mode: str) -> str:
    import torch
    gc.disable()                               # collections happen only where the probe says
    x = torch.randn(1 << 16, device="cuda")
    _small_work(torch, x)
    if kind in ("triton_new_specialization",):
        _triton_add(torch, x, 17)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    if kind == "cublas_first_use_on_capture_stream":
        a @ a                                # cuBLAS initialised on the default stream
    pool = _setup_garbage(torch, kind[3:]) if kind.startswith("gc:") else None
    if kind == "graph_deleted_by_refcount":
        g0 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g0):
            _small_work(torch, x)
        _DEAD.append(g0)
        del g0
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, pool=pool, capture_error_mode=mode):
            y = _small_work(torch, x)
            if kind in ("cublas_first_use_in_process", "cublas_first_use_on_capture_stream"):
                y = (a @ a).float().sum() + y
            _capture_body(torch, kind, x)
            y = y + 1
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:                      # noqa: BLE001 - the probe reports any failure
        return f"FAIL {type(e).__name__}: {str(e).strip().splitlines()[0][:140]}"
    return "ok"


# ---------------------------------------------------------------- driver

GC_KINDS = ["plain", "device_tensor", "tensor_used_on_side_stream", "graph_own_pool",
            "graph_replay_pending", "graph_sharing_the_capture_pool", "event", "event_pending", "pinned_h2d", "pinned_d2h", "stream"]
OTHER_KINDS = ["graph_deleted_by_refcount", "cublas_first_use_in_process", "cublas_first_use_on_capture_stream", "triton_new_specialization",
               "triton_first_compile", "torch_first_kernel", "pinned_alloc", "event_query",
               "synchronize"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="global,thread_local,relaxed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", nargs=2, metavar=("KIND", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(run_probe(*args.one), flush=True)
        return
    kinds = [f"gc:{k}" for k in GC_KINDS] + OTHER_KINDS
    modes = args.modes.split(",")
    jobs = [(k, m) for k in kinds for m in modes]

    def child(job):
        k, m = job
        r = subprocess.run([sys.executable, __file__, "--one", k, m], capture_output=True, text=True,
                           timeout=300)
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        return job, (lines[-1] if lines else f"CRASH rc={r.returncode}: {r.stderr.strip()[-200:]}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = dict(pool.map(child, jobs))
    import torch
    report = [f"# CUDA-graph capture probes on {torch.cuda.get_device_name()}",
              f"torch {torch.__version__}, CUDA {torch.version.cuda}", "",
              "| what happens inside the capture | " + " | ".join(modes) + " |",
              "|---|" + "---|" * len(modes)]
    for k in kinds:
        label = f"gc finalizes a dead cycle holding: {k[3:]}" if k.startswith("gc:") else k
        report.append(f"| {label} | " + " | ".join(results[(k, m)] for m in modes) + " |")
    text = "\n".join(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "capture_probe.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "capture_probe.json"), "w") as f:
            json.dump({f"{k}|{m}": v for (k, m), v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
