"""Receiver + output processor throughput: the packed logprob message vs the legacy layout.

Legacy (the layout before the packing): the header carries the flag only, every row carries all
K+1 columns (unused ones padded with -1 / 0.0), and the receiver converts all MAX_DRAFT_TOKENS x
(K+1) entries of every request before cutting rows to the count and columns to the requested
top_logprobs. Packed: the header carries the width, and the receiver gathers only `count` rows of
`width` columns. Both feed the same output processor. CPU only; not a test.

    python benchmarks/bench_logprob_message.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specverify.protocol.message import TARGET_TOKENS, Capacity, Message, MessageWriter, read_message  # noqa: E402
from specverify.protocol.output import OutputProcessor  # noqa: E402

BSZ, K, MAX_DRAFT = 256, 20, 6
TOP_LOGPROBS = (0, 1, 5, 20)


def workload(seed: int, bsz: int, cap: Capacity):
    gen = np.random.default_rng(seed)
    counts = gen.integers(1, cap.max_draft_tokens + 1, bsz)
    ids = gen.integers(0, 128256, (bsz, cap.max_draft_tokens, cap.k + 1))
    lps = -gen.random((bsz, cap.max_draft_tokens, cap.k + 1), dtype=np.float32) * 10
    ranks = gen.integers(1, 50, (bsz, cap.max_draft_tokens))
    return counts, ids, lps, ranks


def legacy_bytes(counts, ids, lps, ranks, cap: Capacity) -> bytes:
    """The legacy message: flag-only header, all K+1 columns of every used row, padding elsewhere."""
    bsz = len(counts)
    meta = np.zeros(3 + cap.max_bsz, dtype="<i4")
    meta[:3] = (1, TARGET_TOKENS, bsz)
    meta[3:3 + bsz] = counts
    block = np.dtype([("tokens", "<i4", (cap.max_draft_tokens * (cap.k + 1),)),
                      ("scores", "<f4", (cap.max_draft_tokens * (cap.k + 1),)),
                      ("ranks", "<i4", (cap.max_draft_tokens,))])
    blocks = np.zeros(bsz, dtype=block)
    used = np.arange(cap.max_draft_tokens)[None, :] < counts[:, None]            # [bsz, rows]
    blocks["tokens"] = np.where(used[..., None], ids, -1).reshape(bsz, -1)
    blocks["scores"] = np.where(used[..., None], lps, 0.0).reshape(bsz, -1)
    blocks["ranks"] = np.where(used, ranks, 0)
    return meta.tobytes() + blocks.tobytes()


def legacy_read(buf: bytes, top_logprobs: int, cap: Capacity) -> Message:
    """The pre-packing receiver: decode everything, convert everything, then cut."""
    meta = np.frombuffer(buf, dtype="<i4", count=3 + cap.max_bsz)
    bsz = int(meta[2])
    block = np.dtype([("tokens", "<i4", (cap.max_draft_tokens, cap.k + 1)),
                      ("scores", "<f4", (cap.max_draft_tokens, cap.k + 1)),
                      ("ranks", "<i4", (cap.max_draft_tokens,))])
    blocks = np.frombuffer(buf, dtype=block, count=bsz, offset=4 * (3 + cap.max_bsz))
    counts = meta[3:3 + bsz].tolist()
    tokens, scores, ranks = blocks["tokens"].tolist(), blocks["scores"].tolist(), blocks["ranks"].tolist()
    w = top_logprobs + 1
    return Message(1, True, int(meta[1]), w, bsz, counts,
                   [[row[:w] for row in tokens[i][:c]] for i, c in enumerate(counts)],
                   [[row[:w] for row in scores[i][:c]] for i, c in enumerate(counts)],
                   [ranks[i][:c] for i, c in enumerate(counts)])


def timed(fn, repeats: int, inner: int) -> float:
    """Median microseconds per call."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for the results file (default: print only)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    repeats, inner = (3, 5) if args.quick else (7, 20)
    cap = Capacity(max_bsz=512, k=K, max_draft_tokens=MAX_DRAFT)
    counts, ids, lps, ranks = workload(0, BSZ, cap)
    legacy = legacy_bytes(counts, ids, lps, ranks, cap)
    rows = int(counts.sum())
    lines = ["# Logprob message: receiver + output processor, packed vs legacy", "",
             f"- Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
             f"numpy {np.__version__}; CPU only",
             f"- bsz {BSZ}, K {K}, MAX_DRAFT_TOKENS {MAX_DRAFT}, {rows} token rows per message (counts 1..6, seeded)",
             f"- Timing: median of {repeats} x {inner} calls of (receive + OutputProcessor.process)",
             "- Command: `python benchmarks/bench_logprob_message.py" + (" --quick" if args.quick else "") + "`", "",
             "| top_logprobs | width | legacy us/msg | packed us/msg | packed msgs/s | speed-up | same results |",
             "|---|---|---|---|---|---|---|"]
    writer = MessageWriter(cap)
    for top in TOP_LOGPROBS:
        w = top + 1
        packed = bytes(writer.write(msg_id=1, keep_running=True, flag=TARGET_TOKENS, counts=counts,
                                    token_ids=ids[:, :, :w], logprobs=lps[:, :, :w], ranks=ranks))
        same = legacy_read(legacy, top, cap).token_ids == read_message(packed, capacity=cap).token_ids

        def run_legacy():
            OutputProcessor(BSZ).process(legacy_read(legacy, top, cap))

        def run_packed():
            OutputProcessor(BSZ).process(read_message(packed, capacity=cap))
        t_legacy, t_packed = timed(run_legacy, repeats, inner), timed(run_packed, repeats, inner)
        lines.append(f"| {top} | {w} | {t_legacy:.0f} | {t_packed:.0f} | {1e6 / t_packed:.0f} | "
                     f"{t_legacy / t_packed:.2f}x | {'yes' if same else 'NO'} |")
    lines += ["", "The original PR claimed +10% end to end for MTP with top_logprobs 0; the aim here is >= 2x "
              "for the receiver + output processor."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "logprob_message-cpu.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
