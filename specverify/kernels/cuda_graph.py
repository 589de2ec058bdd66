"""CUDA-graph runner: a tensor function captured once per batch-size bucket, replayed after.

The function takes a dict of input tensors (leading dim = batch) and returns a dict of tensors.
It may read and write persistent device tensors of its own (caches, request state): that is what
makes one replay a whole decode cycle. Inputs are copied into static buffers before a call:
rows past the live batch get the pad row given at construction, so stale padding never carries
over. An input is copied again only when it changed: another tensor than the one the buffer holds,
or either written since (their version counters); a decoder's rows tensor lives until its running
set changes, so a steady step makes no copy. The eager path (`use_graphs=False`) calls the function on the same padded buffers, so a
replay and an eager call compute the same thing. Without padding (`pad_batches=False`, the CPU
default of the decoders) the function runs at the live batch size.

Capture discipline (a capture is never retried: a failure is a bug to fix, and it is raised):
- the function reads no host data and makes no host read, so nothing in it can synchronize (the
  tests run the captured cycle under torch.cuda.set_sync_debug_mode("error"));
- the warm-up and the capture run on one stream of the runner's own, so every lazily created
  per-stream resource (the cuBLAS workspace of that stream, a kernel's module) exists before the
  capture starts;
- the warm-up runs on pad-row inputs only: it executes every kernel the capture will record
  (they depend on shapes, not values) and touches no live request;
- Python's garbage collector runs before the capture and is off during it. A decoder and its
  runner form a reference cycle, so a finished decoder's graphs are freed by the collector, and
  a graph destroyed while another capture is under way invalidates that capture (global and
  thread-local modes alike). That was the failure the previous runner retried; the evidence is
  benchmarks/results/capture_root_cause-nvidia-h100.md;
- the capture uses the strict (global) mode, so any forbidden call fails loudly, at once.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(bs: int, buckets=DEFAULT_BUCKETS) -> int:
    for b in buckets:
        if b >= bs:
            return b
    raise ValueError(f"batch size {bs} exceeds the largest CUDA-graph bucket {buckets[-1]}")


class BucketGraphRunner:
    def __init__(self, fn: Callable[[dict], dict], pad: dict[str, torch.Tensor], *, use_graphs: bool,
                 pad_batches: bool = True, buckets=DEFAULT_BUCKETS):
        """pad: one row per input name (no batch dim) used to fill rows past the live batch.
        use_graphs needs pad_batches (a graph has one shape per bucket)."""
        if use_graphs and not pad_batches:
            raise ValueError("use_graphs=True needs pad_batches=True: a captured graph has fixed shapes")
        self.fn, self.pad, self.use_graphs, self.buckets = fn, pad, use_graphs, buckets
        self.pad_batches = pad_batches
        self.static: dict[int, dict] = {}
        # (bucket, input name) -> (the tensor last copied in, its version, the buffer's version after)
        self._held: dict[tuple[int, str], tuple[torch.Tensor, int, int]] = {}
        self.outputs: dict[int, dict] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.stream = None
        self.captures = 0

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
            if self._holds(bucket, name, value):
                continue            # the buffer holds these rows already: no copy (a step's host time)
            target[:live].copy_(value, non_blocking=True)
            target[live:].copy_(self.pad[name].expand_as(target[live:]))
            if value.is_inference() or target.is_inference():
                self._held.pop((bucket, name), None)    # no version counter to trust: copy every call
            else:
                self._held[bucket, name] = (value, value._version, target._version)
        return buf

    def _holds(self, bucket: int, name: str, value: torch.Tensor) -> bool:
        """Whether the bucket's buffer `name` still holds exactly `value`'s rows from the last fill:
        the same tensor, and neither it nor the buffer written since (their version counters). A
        decoder passes the same rows tensor every step until its running set changes, and the
        device-to-device copy costs some 50 us of host time a step (step_anatomy.py, H100). Tensors
        made under `torch.inference_mode` keep no version counter: they are copied every call."""
        held = self._held.get((bucket, name))
        return (held is not None and held[0] is value and held[1] == value._version
                and held[2] == self.static[bucket][name]._version)

    def _capture(self, bucket: int) -> None:
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        pads = self._fill(bucket, {})                  # every row the pad row: touches no request
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.fn(pads)
        torch.cuda.current_stream().wait_stream(self.stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="global"):
                self.outputs[bucket] = self.fn(pads)
        finally:
            if was_enabled:
                gc.enable()
        self.pool = graph.pool()
        self.graphs[bucket] = graph
        self.captures += 1

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on `inputs` (live rows only); returns the live rows of the outputs. With graphs the
        outputs are views of the graph's static outputs: read them before the next run."""
        live = next(iter(inputs.values())).shape[0]
        if not self.pad_batches:
            return self.fn(inputs)
        bucket = bucket_for(live, self.buckets)
        if self.use_graphs and bucket not in self.graphs:
            self._capture(bucket)
        buf = self._fill(bucket, inputs)
        if self.use_graphs:
            self.graphs[bucket].replay()
            out = self.outputs[bucket]
        else:
            out = self.fn(buf)
        return {k: v[:live] for k, v in out.items()}
