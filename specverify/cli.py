"""Command line: `python -m specverify demo` (the main job for now).

The demo decodes a ragged batch with the tiny models on the CPU, for every logits dtype the
platform profile serves plus the float ones, greedy and sampled, and checks each result token
for token against the reference decoder. It exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import time

import reference
from specverify import dtypes
from specverify.engine import generate
from specverify.models import build_models
from specverify.platform import get_profile

DEMO_PROMPTS = [[11, 42, 7, 300, 5], [1, 2, 3], [250, 17, 99, 64, 8, 8, 120], [77]]
DEMO_BUDGETS = [24, 1, 16, 9]


def demo(args) -> int:
    profile = get_profile(args.platform)
    formats = [d for d in dtypes.LOGITS_DTYPES if not dtypes.dtype_info(d).is_fp8 or profile.supports_fp8(d)]
    print(f"specverify demo: profile {profile.name}, device {profile.device}, "
          f"{len(DEMO_PROMPTS)} requests, max_new_tokens {DEMO_BUDGETS}")
    print(f"{'logits dtype':<18}{'mode':<9}{'tokens':>7}{'ms':>9}  reference")
    failures = 0
    for logits_dtype in formats:
        models = build_models("tiny", seed=args.seed, compute_dtype="float64", logits_dtype=logits_dtype,
                              platform=profile)
        for mode, kwargs in (("greedy", {}), ("sampled", dict(temperature=0.8, top_p=0.95, seed=args.seed))):
            start = time.perf_counter()
            got = generate(models, DEMO_PROMPTS, max_new_tokens=DEMO_BUDGETS, **kwargs).tokens
            ms = (time.perf_counter() - start) * 1e3
            want = reference.generate(models, DEMO_PROMPTS, max_new_tokens=DEMO_BUDGETS, **kwargs).tokens
            ok = got == want
            failures += not ok
            print(f"{logits_dtype:<18}{mode:<9}{sum(map(len, got)):>7}{ms:>9.1f}  {'equal' if ok else 'MISMATCH'}")
    print("all results equal the reference" if not failures else f"{failures} results differ from the reference")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specverify")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="decode with the tiny models and check against the reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--platform", default=None, help="platform profile (default: SPECVERIFY_PLATFORM or native)")
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)
