"""The output processor: a stream of decoded messages -> per-request results.

Slot i of a message is request i of the batch the processor was built for. Target-token messages
(flag 3) append tokens with their logprob, rank and top alternatives; draft-token messages
(flag 4) attach their rows to the latest target step of the same request. Counts 0 (chunked
prefill) add nothing, -9 marks a request preempted and -3 a recovery stop; neither takes tokens
afterwards. A message whose id is negative ends the stream.
"""

from __future__ import annotations

import dataclasses

from specverify.protocol.message import DRAFT_TOKENS, PREEMPTED, RECOVERY_STOP, TARGET_TOKENS, Message


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float                   # log-softmax of the raw (temperature-free) dequantized logits
    rank: int                        # 1 + number of tokens with a strictly greater logprob
    top: tuple[tuple[int, float], ...]  # N best (token, logprob): logprob descending, index ascending


class StreamError(ValueError):
    """A message that does not fit the stream so far (wrong slot count, tokens after a stop)."""


@dataclasses.dataclass
class RequestResult:
    """One request's accumulated output. Rows are kept as the receiver delivered them and turned
    into TokenLogprob records only when asked for, so the hot path stays a list append."""
    tokens: list[int] = dataclasses.field(default_factory=list)
    status: str = "running"          # running | preempted | recovery_stop
    _steps: list = dataclasses.field(default_factory=list)   # per target step: (token_ids, logprobs, ranks)
    _drafts: list = dataclasses.field(default_factory=list)  # per target step: draft rows or None

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return [rec for step in self._steps for rec in _records(*step)]

    @property
    def draft_logprobs(self) -> list[list[TokenLogprob]]:
        return [[] if d is None else _records(*d) for d in self._drafts]


def _records(token_ids, logprobs, ranks) -> list[TokenLogprob]:
    return [TokenLogprob(ids[0], lps[0], rank, tuple(zip(ids[1:], lps[1:])))
            for ids, lps, rank in zip(token_ids, logprobs, ranks)]


class OutputProcessor:
    def __init__(self, num_requests: int):
        self.results = [RequestResult() for _ in range(num_requests)]
        self.finished = False
        self._steps: list[int] = [0] * num_requests     # target steps with tokens, per request

    def add_request(self) -> None:
        """A request joins the stream: the next slot is its own from now on."""
        self.results.append(RequestResult())
        self._steps.append(0)

    def process(self, msg: Message) -> None:
        if self.finished:
            raise StreamError(f"message {msg.msg_id} arrived after the stream ended")
        if msg.bsz > len(self.results):
            raise StreamError(f"message {msg.msg_id} has bsz {msg.bsz}, the processor serves "
                              f"{len(self.results)} requests")
        if msg.flag == TARGET_TOKENS:
            self._target(msg)
        elif msg.flag == DRAFT_TOKENS:
            self._draft(msg)
        else:
            raise StreamError(f"message {msg.msg_id}: flag {msg.flag} is neither target (3) nor draft (4) tokens")
        self.finished = not msg.keep_running

    def _target(self, msg: Message) -> None:
        for i, count in enumerate(msg.counts):
            r = self.results[i]
            if count == 0:
                continue
            if r.status != "running":
                raise StreamError(f"request {i} got count {count} after it ended ({r.status})")
            if count == PREEMPTED:
                r.status = "preempted"
            elif count == RECOVERY_STOP:
                r.status = "recovery_stop"
            else:
                rows = msg.token_ids[i]
                r.tokens.extend(row[0] for row in rows)
                r._steps.append((rows, msg.logprobs[i], msg.ranks[i]))
                r._drafts.append(None)
                self._steps[i] += 1

    def _draft(self, msg: Message) -> None:
        for i, count in enumerate(msg.counts):
            if count <= 0:
                continue
            if self._steps[i] == 0:
                raise StreamError(f"request {i}: draft tokens before any target step")
            self.results[i]._drafts[-1] = (msg.token_ids[i], msg.logprobs[i], msg.ranks[i])
