"""Work queued beside the current CUDA stream, then joined back (issue 25).

Part of a step whose inputs are ready and whose results nothing reads for a while can run on a
second stream, beside the kernels the current one queues meanwhile: MTP heads 1..'s context K/V,
written while head 0 runs its draft-extend forward (`MtpCycle.draft`). `fork` starts the side
stream after everything the current stream has queued so far; `join` makes whatever the current
stream queues next wait for the side stream's work.

Inside a CUDA graph capture the fork and the join are the capture's own (an event recorded on
one stream and waited on by the other), so the graph holds both branches and a replay runs them
concurrently; the eager step queues the same kernels on the same two streams. Nothing reads the
host. On any other device there is one queue: the forked work runs where it is written, in order.

What crosses the streams lives until the join: the forked work reads tensors its caller holds
past the join, and what it allocates on the side stream only that stream reuses.
"""

from __future__ import annotations

import contextlib

import torch


class SideStream:
    def __init__(self, device):
        device = torch.device(device)
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.forked = False          # work forked since the last join (host state: no device read)

    @contextlib.contextmanager
    def fork(self):
        """The block's work on the side stream, after what the current stream has queued."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        self.forked = True
        with torch.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        """The current stream's next work waits for everything forked since the last join; with
        nothing forked, nothing (inside a capture, a wait on the side stream's work from before
        the capture would invalidate it)."""
        if self.stream is not None and self.forked:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
            self.forked = False
