"""Command line: `python -m specverify demo` (the main job for now).

The demo decodes a ragged batch with the tiny models on the CPU, for every logits dtype the
platform profile serves plus the float ones, greedy and sampled, and checks each result token
for token against the reference decoder. Then it runs EAGLE speculative decoding (a chain and a
tree, greedy and sampled) and checks it too: greedy tokens must equal the reference's target-only
tokens (losslessness); sampled tokens must equal the reference speculative decoder's
(`reference.generate_speculative`, same uniforms), except requests whose reference trace reports a
near-tie, which are counted and shown. It exits 1 on any mismatch; a bad argument (an unknown
`--platform` or SPECVERIFY_PLATFORM) is a one-line `error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time

import reference
from specverify import dtypes, environment, golden, matrix, mutants, mutation_campaign
from specverify.engine import SpecConfig, generate
from specverify.models import build_models
from specverify.platform import get_profile

DEMO_PROMPTS = [[11, 42, 7, 300, 5], [1, 2, 3], [250, 17, 99, 64, 8, 8, 120], [77]]
DEMO_BUDGETS = [24, 1, 16, 9]
SPEC_BUDGETS = [12, 1, 8, 5]
SPEC_CONFIGS = (("chain S3 k1", SpecConfig(num_steps=3, topk=1)),
                ("tree S3 k2 D6", SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)))


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
    failures += demo_speculative(args, profile)
    print("all results equal the reference" if not failures else f"{failures} results differ from the reference")
    return 1 if failures else 0


def demo_speculative(args, profile) -> int:
    """EAGLE chain and tree, greedy and sampled, each checked against the reference; returns failures."""
    print(f"speculative (EAGLE), max_new_tokens {SPEC_BUDGETS}; greedy vs reference target-only, "
          f"sampled vs reference speculative decoder")
    print(f"{'logits dtype':<18}{'config':<15}{'mode':<9}{'tokens':>7}{'accept/cycle':>13}{'ms':>9}  reference")
    failures = 0
    for logits_dtype in ("float32", profile.fp8_formats[0]):     # float and the profile's first FP8 format
        models = build_models("tiny", seed=args.seed, compute_dtype="float64", logits_dtype=logits_dtype,
                              platform=profile)
        for name, spec in SPEC_CONFIGS:
            for mode, kwargs in (("greedy", {}), ("sampled", dict(temperature=0.8, top_p=0.95, seed=args.seed))):
                start = time.perf_counter()
                out = generate(models, DEMO_PROMPTS, max_new_tokens=SPEC_BUDGETS, spec=spec, platform=profile,
                               **kwargs)
                ms = (time.perf_counter() - start) * 1e3
                cycles = [n for per_request in out.accept_lengths for n in per_request]
                if mode == "greedy":
                    want = reference.generate(models, DEMO_PROMPTS, max_new_tokens=SPEC_BUDGETS).tokens
                    skipped = []
                else:
                    ref = reference.generate_speculative(models, DEMO_PROMPTS, spec_num_steps=spec.num_steps,
                                                         topk=spec.topk, num_draft_tokens=spec.draft_tokens,
                                                         max_new_tokens=SPEC_BUDGETS, **kwargs)
                    want = ref.tokens
                    skipped = [r for r, t in enumerate(ref.traces) if t.first_near_tie is not None]
                bad = [r for r in range(len(DEMO_PROMPTS)) if r not in skipped and out.tokens[r] != want[r]]
                failures += bool(bad)
                verdict = "MISMATCH" if bad else "equal"
                if skipped:
                    verdict += f" ({len(skipped)} request(s) with a near-tie not compared: {skipped})"
                rate = sum(cycles) / max(len(cycles), 1)
                print(f"{logits_dtype:<18}{name:<15}{mode:<9}{sum(map(len, out.tokens)):>7}{rate:>13.2f}"
                      f"{ms:>9.1f}  {verdict}")
    return failures


def main(argv=None) -> int:
    environment.readable_output()
    parser = argparse.ArgumentParser(prog="python -m specverify")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="decode with the tiny models and check against the reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--platform", default=None, help="platform profile (default: SPECVERIFY_PLATFORM or native)")
    p.set_defaults(func=demo)
    # mutants: the mutation harness (specverify/mutants.py)
    p = sub.add_parser("mutants", help="plant each mutant of the bug zoo in a copy of the tree; show the suite kills it")
    mutants.add_arguments(p)
    p.set_defaults(func=lambda args: (mutation_campaign.command if args.action == "generate" else mutants.command)(args))
    # golden: regenerate / check the golden files (specverify/golden/)
    p = sub.add_parser("golden", help="regenerate or check the golden files of golden/")
    golden.add_arguments(p)
    p.set_defaults(func=golden.command)
    # matrix: the suite once per platform profile, one feature x dtype x platform table (specverify/matrix/)
    p = sub.add_parser("matrix", help="run the suite per platform profile and report feature x dtype x platform; "
                                      "`matrix merge` joins reports")
    matrix.add_arguments(p)
    p.set_defaults(func=matrix.command)
    # conformance: compare the verdicts of two conformance reports (specverify/conformance/report.py)
    from specverify.conformance import report as conformance_report
    p = sub.add_parser("conformance", help="`conformance diff GOT.json EXPECTED.json`: did an engine's verdicts move?")
    conformance_report.add_arguments(p)
    p.set_defaults(func=conformance_report.command)
    args = parser.parse_args(argv)
    if args.command == "demo":
        # Validate the profile up front: a bad --platform or SPECVERIFY_PLATFORM is one line, no traceback.
        try:
            get_profile(args.platform)
        except (TypeError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return args.func(args)
