"""CUDA-graph runner: capture a tensor function once per batch-size bucket, replay it after.

The function takes a dict of static input tensors (leading dim = bucket size) and returns a dict
of tensors. A live batch smaller than its bucket is padded with the pad row given at construction
(written into the static buffers before every replay, so stale padding never carries over), and
only the live rows of the outputs are returned, copied out of the graph's memory.
The eager path calls the same function on the same padded buffers, so the two match bit for bit.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

CAPTURE_ERRORS = (RuntimeError,) + ((torch.AcceleratorError,) if hasattr(torch, "AcceleratorError") else ())
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(bs: int, buckets=DEFAULT_BUCKETS) -> int:
    for b in buckets:
        if b >= bs:
            return b
    raise ValueError(f"batch size {bs} exceeds the largest CUDA-graph bucket {buckets[-1]}")


class BucketGraphRunner:
    def __init__(self, fn: Callable[[dict], dict], pad: dict[str, torch.Tensor], *, use_graphs: bool,
                 buckets=DEFAULT_BUCKETS, warmup: int = 2):
        """pad: one row per input name (no batch dim) used to fill rows past the live batch."""
        self.fn, self.pad, self.use_graphs, self.buckets, self.warmup = fn, pad, use_graphs, buckets, warmup
        self.static: dict[int, dict] = {}
        self.outputs: dict[int, dict] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.captures = 0
        self.capture_retries = 0

    def _buffers(self, bucket: int) -> dict:
        if bucket not in self.static:
            self.static[bucket] = {k: v.unsqueeze(0).expand(bucket, *v.shape).clone() for k, v in self.pad.items()}
        return self.static[bucket]

    def _fill(self, bucket: int, inputs: dict) -> dict:
        buf = self._buffers(bucket)
        for name, value in inputs.items():
            if name not in buf:
                raise ValueError(f"input {name!r} has no pad row; known inputs: {sorted(buf)}")
            live = value.shape[0]
            target = buf[name]
            if value.shape[1:] != target.shape[1:]:
                raise ValueError(f"input {name!r}: row shape {tuple(value.shape[1:])}, the runner was "
                                 f"built for {tuple(target.shape[1:])}")
            target[:live].copy_(value)
            target[live:].copy_(self.pad[name].expand_as(target[live:]))
        return buf

    def _capture(self, bucket: int, buf: dict) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(buf)
        torch.cuda.current_stream().wait_stream(side)
        # Settle every pending allocator event before capturing, so nothing has to be queried
        # while the stream captures.
        torch.cuda.synchronize()
        try:
            graph = self._capture_once(buf, bucket)
        except CAPTURE_ERRORS as first:
            warnings.warn(f"CUDA-graph capture of bucket {bucket} failed ({str(first).splitlines()[0]}); "
                          "retrying once from an emptied cache")
            # Seen once on an H200 (bs=1, after many eager calls): the capture was invalidated by
            # an earlier call. One retry from an emptied cache; a second failure is raised.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.capture_retries += 1
            try:
                graph = self._capture_once(buf, bucket)
            except CAPTURE_ERRORS as second:
                raise RuntimeError(f"CUDA-graph capture of bucket {bucket} failed twice: {second}") from first
        self.pool = graph.pool()
        self.graphs[bucket] = graph
        self.captures += 1

    def _capture_once(self, buf: dict, bucket: int) -> "torch.cuda.CUDAGraph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self.outputs[bucket] = self.fn(buf)
        return graph

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        live = next(iter(inputs.values())).shape[0]
        bucket = bucket_for(live, self.buckets)
        buf = self._fill(bucket, inputs)
        if not self.use_graphs:
            out = self.fn(buf)
        else:
            if bucket not in self.graphs:
                self._capture(bucket, buf)
                buf = self._fill(bucket, inputs)      # warm-up runs wrote to the caches: refill
            self.graphs[bucket].replay()
            out = self.outputs[bucket]
        return {k: v[:live].clone() for k, v in out.items()}
