"""`Engine`: the optimized decoder as a server, with requests that join and leave a running batch.

A request waits in a queue until a cycle boundary admits it; admission is in submission order (the
head of the queue waits for room even when a later, smaller request would fit) and needs a free
row (at most `max_running` requests run) and pages for the request's whole run on top of what the
running requests were promised, so a running request never meets an empty pool. The newcomers'
prefill runs, then they join the captured cycle (or step) in free lanes of the current bucket,
or the bucket grows. A finished or aborted request gives its row, pages, state and tracking
slots and penalty counts back at once, and the next request to take them finds nothing of its
predecessor (docs/semantics.md section 8). A request's uniforms are keyed by its index in the
submission order, so every request's tokens, logprobs and trace equal those of the same request
decoded alone (greedy and sampled alike).

`generate(..., max_running=N)` is the batch form of this loop; `Engine.add_request`, `step` and
`abort` are the form a server (or a test that chooses arrival and abort cycles) drives.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specverify.engine.arguments import check_generate_args, check_spec_fit
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.requests import GenerationOutput, Request, check_prompts, pages_needed
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import SpecDecoder
from specverify.engine.target_only import TargetOnlyDecoder
from specverify.kernels.cuda_graph import DEFAULT_BUCKETS
from specverify.protocol.message import PREEMPTED
from specverify.validation import check_int

MAX_RUNNING = DEFAULT_BUCKETS[-1]     # the largest CUDA-graph bucket: the bound where steps run padded

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


class Engine:
    """Continuous batching over the optimized decoder.

    engine = Engine(models, spec=SpecConfig(...), max_running=4, temperature=..., seed=...)
    rid = engine.add_request(prompt, max_new_tokens)     # any time; ids count up from 0
    engine.step()                                        # one cycle boundary: admit, then one cycle
    engine.abort(rid)                                    # between steps; frees at once
    engine.output()                                      # GenerationOutput over every request so far

    max_running: requests decoded at once (>= 1; <= 256 where steps run at bucket shapes,
    as on CUDA). num_pages: the page pool (page 0 reserved);
    default: room for max_running requests of max_context each, so admission never waits for
    pages. A request whose own run needs more pages than the pool has is refused by add_request.
    max_requests: with logprobs, the stream's request slots (default 512). The other arguments
    are `generate`'s; pad_batches runs the padded (bucket) path on the CPU (None: on CUDA only);
    cuda_graph=False runs the padded steps eagerly on CUDA (what a captured run must equal).
    """

    def __init__(self, models, *, spec=None, max_running: int, num_pages: int | None = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 seed: int = 0, eos_token_id: int | None = None, logprobs: int = 0, page_size: int = 1,
                 platform=None, trace: bool = False, repetition_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, max_requests: int = 0,
                 pad_batches: bool | None = None, cuda_graph: bool = True):
        if not isinstance(trace, bool):
            raise TypeError(f"trace must be a bool, got {type(trace).__name__} {trace!r}")
        if trace and spec is None:
            raise ValueError("trace=True records speculative cycles; it needs spec=SpecConfig(...)")
        if pad_batches is not None and not isinstance(pad_batches, bool):
            raise TypeError(f"pad_batches must be None or a bool, got {type(pad_batches).__name__}")
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"cuda_graph must be a bool, got {type(cuda_graph).__name__}")
        self.config = check_generate_args(models, spec=spec, seed=seed, logprobs=logprobs,
                                          eos_token_id=eos_token_id, page_size=page_size, platform=platform)
        self.max_running = check_int("max_running", max_running, 1, why="requests decoded at once")
        check_int("max_requests", max_requests, 0)
        params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty,
                                presence_penalty)
        self.spec = spec
        seed, logprobs = int(seed), int(logprobs)      # numpy integers pass the checks
        eos = None if eos_token_id is None else int(eos_token_id)
        page = spec.page_size if spec is not None else int(page_size)
        most = pages_needed([self.config.max_context] * self.max_running, page)
        self.num_pages = most if num_pages is None else check_int(
            "num_pages", num_pages, 2, why="the page pool, page 0 reserved")
        rows = 1 if spec is None else spec.num_steps + 1
        self.channel = LogprobChannel(0, logprobs, max_rows=rows, max_requests=max_requests) if logprobs else None
        if spec is None:
            self.decoder = TargetOnlyDecoder(models, params, seed=seed, eos_token_id=eos, channel=self.channel,
                                             page_size=page, platform=platform, pad_batches=pad_batches,
                                             cuda_graph=cuda_graph)
        else:
            if not cuda_graph:
                spec = dataclasses.replace(spec, cuda_graph=False)
            self.decoder = SpecDecoder(models, spec, params, seed=seed, eos_token_id=eos, channel=self.channel,
                                       platform=platform, pad_batches=pad_batches)
            if trace:
                self.decoder.traces = []
        if self.decoder.pad_batches and self.max_running > MAX_RUNNING:
            raise ValueError(f"max_running must be <= {MAX_RUNNING} (the largest CUDA-graph bucket) where steps "
                             f"run at bucket shapes, got {self.max_running}")
        self.decoder.allocate(max_running=self.max_running, num_pages=self.num_pages)
        self.requests: list[Request] = []
        self.waiting: list[Request] = []

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, prompt: Sequence[int], max_new_tokens: int) -> int:
        """Queue a request; returns its id (its index in the submission order, which keys its
        uniforms). Refused here (ValueError) when its run needs more pages than the pool holds."""
        label = lambda i: "prompt"          # noqa: E731 -- one request: name the argument itself
        budget = check_prompts([prompt], [max_new_tokens], self.config.vocab_size, self.config.max_context,
                               label=label, budget=lambda i: "max_new_tokens")[0]
        if self.spec is not None:
            check_spec_fit(self.config, self.spec, [prompt], [budget], label=label)
        r = Request(len(self.requests), [int(t) for t in prompt], budget)
        need = self.decoder.pages_for(r)
        if need > self.num_pages - 1:
            raise ValueError(f"the request needs {need} pages of {self.decoder.page_size} tokens for its "
                             f"{self.decoder.request_length(r)} cache entries; num_pages={self.num_pages} "
                             f"holds {self.num_pages - 1} (page 0 is reserved), so it could never run")
        if self.channel is not None:
            self.channel.add_request()
        if self.decoder.traces is not None:
            self.decoder.traces.append([])
        self.requests.append(r)
        self.waiting.append(r)
        return r.index

    def abort(self, request_id: int) -> bool:
        """End a waiting or running request now (its row and pages are free for the next
        admission); its tokens so far stay in the output. False if it had already ended."""
        r = self._request(request_id)
        if r.finished:
            return False
        if r in self.waiting:
            self.waiting.remove(r)
            r.finished = True
            if self.channel is not None:
                self.channel.signal(r.index, PREEMPTED)
        else:
            self.decoder.abort(r)
        r.aborted = True
        return True

    def status(self, request_id: int) -> str:
        """"waiting", "running", "finished" (EOS or max_new_tokens) or "aborted"."""
        r = self._request(request_id)
        if r.aborted:
            return ABORTED
        if r.finished:
            return FINISHED
        return WAITING if r in self.waiting else RUNNING

    def _request(self, request_id) -> Request:
        check_int("request_id", request_id)
        if not 0 <= request_id < len(self.requests):
            raise ValueError(f"request_id {request_id} is not a request of this engine "
                             f"(ids 0..{len(self.requests) - 1})")
        return self.requests[request_id]

    # -- the loop --------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """One cycle boundary: admit what fits (in submission order), then one decode step or
        speculative cycle of the running requests. Returns the ids that ended in it."""
        live = self.decoder.running()
        n = self.decoder.admissible(self.waiting)
        admitted, self.waiting = self.waiting[:n], self.waiting[n:]
        self.decoder.admit(admitted)
        if self.decoder.running():
            self.decoder.step()
        return [r.index for r in live + admitted if r.finished]

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or bool(self.decoder.running())

    def run(self) -> GenerationOutput:
        """Step until every request has ended; returns `output()`."""
        while self.has_unfinished():
            self.step()
        return self.output()

    def resources(self) -> dict[str, int]:
        """What the pool holds now: free rows and pages (at rest: max_running and num_pages - 1),
        the pages promised to running requests, and the running and waiting counts."""
        table = self.decoder.cache.table
        return {"free_rows": table.num_free_rows, "free_pages": table.num_free_pages,
                "committed_pages": self.decoder.committed, "running": len(self.decoder.running()),
                "waiting": len(self.waiting)}

    def output(self) -> GenerationOutput:
        """Every submitted request's tokens so far (logprobs, accept lengths, trace as asked)."""
        reqs = self.requests
        logprobs = None if self.channel is None else [res.logprobs for res in self.channel.processor.results]
        if self.spec is None:
            return GenerationOutput([r.output for r in reqs], logprobs)
        return GenerationOutput([r.output for r in reqs], logprobs, [r.accept_lengths for r in reqs],
                                trace=self.decoder.traces)

    def close(self) -> GenerationOutput:
        """End the logprob stream (a final message) and return `output()`."""
        if self.channel is not None:
            self.channel.close()
        return self.output()
