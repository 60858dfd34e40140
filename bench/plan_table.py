#!/usr/bin/env python3
"""Planning table of docs/benchmarks.md: runs `magiattn plan` for every docs/semantics.md §4 mask
family at the given cp values (8k tokens per rank unless told) with both dispatch algorithms and
prints markdown rows.
Usage: bench/plan_table.py [path/to/magiattn] [cp ...] [--per-rank TOKENS] [--masks NAME ...]"""

import argparse
import json
import os
import re
import subprocess
import tempfile

FAMILIES = ["full", "causal", "varlen-full", "varlen-causal", "sliding-window",
            "varlen-block-causal", "shared-prefix", "block-sparse"]


# The plan command's units, as seconds and GiB.
UNITS = {"ms": 1e-3, "s": 1.0, "B": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1, "TiB": 2**10}


def plan(binary, family, cp, algorithm, per_rank=8192):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        out = subprocess.run([binary, "plan", "--mask", family, "--seqlen", str(per_rank * cp),
                              "--cp", str(cp), "--algorithm", algorithm, "--max-ranks", "0",
                              "--json", path], check=True, capture_output=True, text=True).stdout
        with open(path) as f:
            predicted = json.load(f)["predicted_seconds"]  # exact; the text rounds to 0.1 ms

    def field(pattern):
        m = re.search(pattern, out)
        if m is None:
            raise RuntimeError(f"`magiattn plan` printed no match for {pattern!r}:\n{out}")
        return m

    def quantity(pattern):  # a number and its unit, in seconds or GiB
        m = field(pattern + r" ([\d.]+) (ms|s|B|KiB|MiB|GiB|TiB)\b")
        return float(m.group(1)) * UNITS[m.group(2)]

    count = lambda pattern: int(field(pattern).group(1).replace(",", ""))  # noqa: E731
    return {"slices": count(r"slices\s+([\d,]+)"), "area": count(r"area\s+([\d,]+)"),
            "stages": int(field(r"(\d+) stages?, dispatch").group(1)),
            "imbalance": float(field(r"imbalance\s+([\d.e+-]+)%").group(1)),
            "seconds": quantity(r"planning\s+"), "predicted": predicted,
            "ours": quantity(r"ours"), "ring": quantity(r"ring \(zigzag\)"),
            "ag": quantity(r"all-gather")}


def flops(area, heads_q=32, head_dim=128):
    """The forward's FLOPs at the cost model's shape (CostModel: 32 q heads, D 128)."""
    return 4.0 * area * heads_q * head_dim


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", nargs="?", default="build/release/bin/magiattn")
    ap.add_argument("cps", nargs="*", type=int, default=[8, 64])
    ap.add_argument("--per-rank", type=int, default=8192, help="tokens per rank")
    ap.add_argument("--masks", nargs="+", default=FAMILIES, choices=FAMILIES)
    args = ap.parse_args()
    print("| mask | cp | slices | imbalance min-heap / refined | stages | KV GiB ours / ring / "
          "all-gather | ours / ring | planning s (refined) | predicted fwd µs | predicted "
          "TFLOP/s per GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for family in args.masks:
        for cp in args.cps:
            heap, ref = (plan(args.binary, family, cp, a, args.per_rank)
                         for a in ("minheap", "refined"))
            tflops = flops(ref["area"]) / ref["predicted"] / cp / 1e12
            print(f"| {family} | {cp} | {ref['slices']:,} | {heap['imbalance']:.3f}% / "
                  f"{ref['imbalance']:.3f}% | {ref['stages']} | {ref['ours']:.3f} / "
                  f"{ref['ring']:.3f} / {ref['ag']:.3f} | {ref['ours'] / ref['ring']:.3f} | "
                  f"{ref['seconds']:.4f} | {ref['predicted'] * 1e6:.0f} | {tflops:.0f} |")


if __name__ == "__main__":
    main()
