"""The speculative-decoding configuration: which algorithm, how wide and deep the draft is."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    algorithm: str = "eagle"
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int | None = None   # D, root included; default S + 1 (the chain)
    page_size: int = 1
    cuda_graph: bool = True

    def __post_init__(self):
        if self.algorithm != "eagle":
            raise ValueError(f"algorithm must be 'eagle', got {self.algorithm!r}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        d = self.draft_tokens
        most = 1 + self.topk + (self.num_steps - 1) * self.topk ** 2
        if not 2 <= d <= most:
            raise ValueError(f"num_draft_tokens must be in [2, {most}] for topk={self.topk}, "
                             f"num_steps={self.num_steps}; got {d}")
        if self.topk == 1 and d != self.num_steps + 1:
            raise ValueError(f"topk == 1 needs num_draft_tokens == num_steps + 1 = {self.num_steps + 1}, got {d}")

    @property
    def draft_tokens(self) -> int:
        return self.num_draft_tokens if self.num_draft_tokens is not None else self.num_steps + 1
