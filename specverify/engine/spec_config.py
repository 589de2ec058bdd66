"""The speculative-decoding configuration: which algorithm, how wide and deep the draft is."""

from __future__ import annotations

import dataclasses

from specverify.validation import check_bool, check_choice, check_int

ALGORITHMS = ("eagle", "naive_eagle", "mtp", "dflash")
CHAINS = ("mtp", "dflash")      # draft a chain only: topk 1, num_draft_tokens = num_steps + 1
# How a sampled naive-EAGLE cycle accepts. "exact": the draft token is sampled from the draft's
# distribution q, accepted with probability min(1, p/q), else the token is drawn from the residual
# max(p - q, 0): distributed exactly like target-only sampling. "inexact_shortcut": the original
# naive-EAGLE path (argmax draft, min(1, p/q) with q its draft probability, every row sampled from
# the target, no residual), kept to show that the suite detects its bias.
NAIVE_SAMPLING = ("exact", "inexact_shortcut")
DEFAULT_NUM_STEPS = {"eagle": 3, "naive_eagle": 1, "mtp": 3, "dflash": 3}


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    algorithm: str = "eagle"
    num_steps: int | None = None          # S; default 3 for eagle, mtp and dflash, 1 (the only value) for
                                          # naive_eagle; mtp: at most the models' mtp_heads
    topk: int = 1
    num_draft_tokens: int | None = None   # D, root included; default S + 1 (the chain)
    page_size: int = 1
    cuda_graph: bool = True
    naive_sampling: str = "exact"         # naive_eagle with sampling: one of NAIVE_SAMPLING
    state_track_interval: int | None = None   # hybrid models: keep each request's recurrent state at
                                              # every multiple of this many cached tokens in its tracking
                                              # slot (prefix caching); None = no tracking

    def __post_init__(self):
        # Types first (an int is an int: not a bool, not a float), then ranges.
        check_choice("SpecConfig.algorithm", self.algorithm, ALGORITHMS)
        check_choice("SpecConfig.naive_sampling", self.naive_sampling, NAIVE_SAMPLING)
        if self.num_steps is None:
            object.__setattr__(self, "num_steps", DEFAULT_NUM_STEPS[self.algorithm])
        for name, lo in (("num_steps", 1), ("topk", 1), ("num_draft_tokens", None), ("page_size", 1)):
            value = getattr(self, name)
            if name != "num_draft_tokens" or value is not None:
                object.__setattr__(self, name, check_int(f"SpecConfig.{name}", value, lo))
        object.__setattr__(self, "cuda_graph", check_bool("SpecConfig.cuda_graph", self.cuda_graph))
        if self.state_track_interval is not None:
            object.__setattr__(self, "state_track_interval",
                               check_int("SpecConfig.state_track_interval", self.state_track_interval, 1))
        if self.algorithm == "naive_eagle":
            fixed = {"num_steps": (self.num_steps, 1), "topk": (self.topk, 1), "num_draft_tokens": (self.draft_tokens, 2)}
            for name, (value, want) in fixed.items():
                if value != want:
                    raise ValueError(f"SpecConfig.{name}: naive_eagle is fixed at num_steps=1, topk=1, "
                                     f"num_draft_tokens=2; got {name}={value}")
        elif self.algorithm in CHAINS:
            for name, value, want in (("topk", self.topk, 1), ("num_draft_tokens", self.draft_tokens, self.num_steps + 1)):
                if value != want:
                    raise ValueError(f"SpecConfig.{name}: {self.algorithm} drafts a chain, so {name} must be {want} "
                                     f"(topk=1, num_draft_tokens=num_steps + 1); got {name}={value}")
        if self.algorithm != "naive_eagle" and self.naive_sampling != "exact":
            raise ValueError(f"SpecConfig.naive_sampling={self.naive_sampling!r} applies to algorithm='naive_eagle' "
                             f"only; got algorithm={self.algorithm!r}")
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

    @property
    def draft_reach(self) -> int:
        """Draft cache entries one draft writes past its prefix after the draft-extend: EAGLE's
        (S - 1) * k beams, MTP's step row (each head's at the prefix index), DFlash's S block rows."""
        if self.algorithm == "mtp":
            return 1 if self.num_steps > 1 else 0
        if self.algorithm == "dflash":
            return self.num_steps
        return (self.num_steps - 1) * self.topk


def cache_entries(spec: SpecConfig | None, prompt_len: int, max_new_tokens: int) -> int:
    """Cache entries a request can ever need, its pages capped there: its prompt and output, and
    with speculation the region a cycle writes past them (the verify's D nodes or the draft's
    reach) plus the pending token."""
    if spec is None:
        return prompt_len + max_new_tokens
    return prompt_len + max_new_tokens + max(spec.draft_tokens, spec.draft_reach) + 1
