"""What a CUDA graph's launch costs per node (issue 25): graphs of N tiny kernels (an in-place add
on 256 floats), for each N the host time of one `replay()` call on an idle device, one replay then
a sync, and replays back to back; the slope over N is the per-node cost a step pays when it must
wait for its result before the next launch.

    PYTHONPATH=. python3 benchmarks/experiments/graph_launch.py
"""

from __future__ import annotations

import torch

from host_gap import launch_host_ms, timed_ms     # this folder: the same two clocks as host_gap.py

REPS = 50


def main() -> None:
    x = torch.zeros(256, device="cuda")
    print("| nodes | replay() host ms | replay + sync ms | back to back ms |\n|---|---|---|---|")
    for n in (1, 25, 50, 100, 200, 400):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for _ in range(3):
                for _ in range(n):
                    x.add_(1.0)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                x.add_(1.0)
        graph.replay()
        torch.cuda.synchronize()
        host = launch_host_ms(graph, REPS)
        synced = timed_ms(lambda: (graph.replay(), torch.cuda.synchronize()), REPS)
        b2b = timed_ms(graph.replay, REPS)
        print(f"| {n} | {host:.3f} | {synced:.3f} | {b2b:.3f} |")


if __name__ == "__main__":
    main()
