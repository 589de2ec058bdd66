"""Logprobs on their way out: the decoder computes each emitted token's row (its logprob, rank and
top alternatives), packs a step's rows into the packed logprob message, and the output processor
turns the message stream back into per-request results. `generate(logprobs=N)` returns what the
processor saw, so every algorithm goes through the same protocol."""

from __future__ import annotations

import torch

from specverify.kernels.order import topk_stable     # n is checked here: the unchecked top-k
from specverify.protocol.message import TARGET_TOKENS, Capacity, MessageWriter, read_message
from specverify.protocol.output import OutputProcessor, RequestResult


def logprob_rows(logits: torch.Tensor, scale: torch.Tensor, tokens: torch.Tensor, n: int):
    """Rows of the message for emitted tokens.

    logits: [M, V]; scale: [M, 1]; tokens: [M] emitted ids. Returns ids [M, n+1] (column 0 the
    emitted token, then the n best in the order logprob descending, index ascending), logprobs
    [M, n+1] float64 (log-softmax of the raw dequantized logits) and ranks [M] (1 + the number of
    tokens with a strictly greater logprob). The token check reads the device: the logprob path
    copies its rows to the host anyway, and it never runs inside a graph capture.
    """
    if logits.dim() != 2 or scale.shape != (logits.shape[0], 1) or tokens.shape != (logits.shape[0],):
        raise ValueError(f"logits [M, V], scale [M, 1] and tokens [M] must agree, got {list(logits.shape)}, "
                         f"{list(scale.shape)} and {list(tokens.shape)}")
    vocab = logits.shape[1]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= vocab:
        raise ValueError(f"n (top logprobs) must be an int in [0, {vocab}] (the vocab size), got {n!r}")
    if tokens.numel() and not bool(((tokens >= 0) & (tokens < vocab)).all()):
        raise ValueError(f"tokens must lie in [0, {vocab}) (the vocab size)")
    lp = torch.log_softmax(logits.to(torch.float64) * scale.to(torch.float64), dim=-1)
    chosen = lp.gather(-1, tokens[:, None])
    ranks = 1 + (lp > chosen).sum(-1)
    if n == 0:
        return tokens[:, None], chosen, ranks
    top_lp, top_ids = topk_stable(lp, n)
    return torch.cat([tokens[:, None], top_ids], 1), torch.cat([chosen, top_lp], 1), ranks


class LogprobChannel:
    """Engine side of the stream: one target-token message per decoding step."""

    def __init__(self, num_requests: int, num_logprobs: int, max_rows: int, max_requests: int = 0):
        """num_requests now; the stream's slots (one per request index) may grow to
        max(512, num_requests, max_requests) with `add_request`."""
        self.capacity = Capacity(max_bsz=max(512, num_requests, max_requests), k=max(20, num_logprobs),
                                 max_draft_tokens=max(6, max_rows))
        self.writer = MessageWriter(self.capacity)
        self.processor = OutputProcessor(num_requests)
        self.num_requests, self.n, self.max_rows = num_requests, num_logprobs, max_rows

    def add_request(self) -> None:
        """One more request joins the stream; it takes the next slot (its request index)."""
        if self.num_requests >= self.capacity.max_bsz:
            raise ValueError(f"the logprob stream carries at most {self.capacity.max_bsz} requests "
                             f"(max_requests); request {self.num_requests} does not fit")
        self.processor.add_request()
        self.num_requests += 1

    def send(self, req_indices: list[int], rows_per_request: list[int], logits: torch.Tensor,
             scale: torch.Tensor, tokens: torch.Tensor) -> None:
        """One step: request req_indices[r] emitted rows_per_request[r] tokens, whose logits rows
        are stacked in order in logits [M, V] / scale [M, 1] / tokens [M]."""
        ids, lps, ranks = (x.cpu().numpy() for x in logprob_rows(logits, scale, tokens, self.n))
        bsz, width = self.num_requests, self.n + 1
        counts = torch.zeros(bsz, dtype=torch.int64)
        counts[req_indices] = torch.tensor(rows_per_request, dtype=torch.int64)
        # Row m goes to (its request, its position among that request's rows).
        req = torch.repeat_interleave(torch.tensor(req_indices), torch.tensor(rows_per_request))
        first = torch.cumsum(torch.tensor(rows_per_request), 0) - torch.tensor(rows_per_request)
        pos = torch.arange(len(req)) - torch.repeat_interleave(first, torch.tensor(rows_per_request))
        rows = max(rows_per_request, default=0) or 1
        token_ids = torch.zeros((bsz, rows, width), dtype=torch.int64)
        logprobs = torch.zeros((bsz, rows, width), dtype=torch.float32)
        rank = torch.zeros((bsz, rows), dtype=torch.int64)
        token_ids[req, pos] = torch.from_numpy(ids)
        logprobs[req, pos] = torch.from_numpy(lps).float()
        rank[req, pos] = torch.from_numpy(ranks)
        self._deliver(counts, token_ids, logprobs, rank, keep_running=True)

    def signal(self, req_index: int, code: int) -> None:
        """Tell the processor that a request ended without tokens: PREEMPTED (-9, an abort) or
        RECOVERY_STOP (-3)."""
        counts = torch.zeros(self.num_requests, dtype=torch.int64)
        counts[req_index] = code
        self._deliver_counts(counts, keep_running=True)

    def close(self) -> list[RequestResult]:
        """End the stream (a message with a negative id) and return the per-request results."""
        self._deliver_counts(torch.zeros(self.num_requests, dtype=torch.int64), keep_running=False)
        return self.processor.results

    def _deliver_counts(self, counts, *, keep_running: bool) -> None:
        """A message of counts only (signals or the end of the stream): no rows to carry."""
        bsz, width = self.num_requests, self.n + 1
        self._deliver(counts, torch.zeros((bsz, 1, width), dtype=torch.int64), torch.zeros((bsz, 1, width)),
                      torch.zeros((bsz, 1), dtype=torch.int64), keep_running=keep_running)

    def _deliver(self, counts, token_ids, logprobs, ranks, *, keep_running: bool) -> None:
        wire = self.writer.write(msg_id=1, keep_running=keep_running, flag=TARGET_TOKENS, counts=counts,
                                 token_ids=token_ids, logprobs=logprobs, ranks=ranks)
        self.processor.process(read_message(bytes(wire), capacity=self.capacity))
