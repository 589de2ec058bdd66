"""The speculative-decoding configuration: which algorithm, how wide and deep the draft is."""

from __future__ import annotations

import dataclasses

from specverify.validation import check_bool, check_choice, check_int


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    algorithm: str = "eagle"
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int | None = None   # D, root included; default S + 1 (the chain)
    page_size: int = 1
    cuda_graph: bool = True

    def __post_init__(self):
        # Types first (an int is an int: not a bool, not a float), then ranges.
        check_choice("SpecConfig.algorithm", self.algorithm, ("eagle",))
        for name, lo in (("num_steps", 1), ("topk", 1), ("num_draft_tokens", None), ("page_size", 1)):
            value = getattr(self, name)
            if name != "num_draft_tokens" or value is not None:
                object.__setattr__(self, name, check_int(f"SpecConfig.{name}", value, lo))
        object.__setattr__(self, "cuda_graph", check_bool("SpecConfig.cuda_graph", self.cuda_graph))
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
