#!/usr/bin/env python3
"""Planning table of docs/benchmarks.md: runs `magiattn plan` for every docs/semantics.md §4 mask
family at the given cp values (8k tokens per rank unless told) with both dispatch algorithms and
prints markdown rows.
Usage: bench/plan_table.py [path/to/magiattn] [cp ...] [--per-rank TOKENS] [--masks NAME ...]"""

import argparse
import re
import subprocess

FAMILIES = ["full", "causal", "varlen-full", "varlen-causal", "sliding-window",
            "varlen-block-causal", "shared-prefix", "block-sparse"]


def plan(binary, family, cp, algorithm, per_rank=8192):
    out = subprocess.run([binary, "plan", "--mask", family, "--seqlen", str(per_rank * cp), "--cp",
                          str(cp), "--algorithm", algorithm, "--max-ranks", "0"],
                         check=True, capture_output=True, text=True).stdout
    field = lambda pattern: re.search(pattern, out).group(1)
    return {"slices": int(field(r"slices\s+([\d,]+)").replace(",", "")),
            "stages": int(field(r"stages (\d+)")),
            "imbalance": float(field(r"dispatch imbalance ([\d.e+-]+)%")),
            "seconds": float(field(r"planning time ([\d.e+-]+) s")),
            "predicted": float(field(r"predicted ([\d.]+) us")),
            "ours": float(field(r"ours ([\d.]+) GB")), "ring": float(field(r"ring \(zigzag\) ([\d.]+) GB")),
            "ag": float(field(r"all-gather ([\d.]+) GB"))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", nargs="?", default="build/release/bin/magiattn")
    ap.add_argument("cps", nargs="*", type=int, default=[8, 64])
    ap.add_argument("--per-rank", type=int, default=8192, help="tokens per rank")
    ap.add_argument("--masks", nargs="+", default=FAMILIES, choices=FAMILIES)
    args = ap.parse_args()
    binary, cps = args.binary, args.cps
    print("| mask | cp | slices | imbalance min-heap / refined | stages | KV GB ours / ring / "
          "all-gather | ours / ring | planning s (refined) | predicted fwd µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family in args.masks:
        for cp in cps:
            heap, ref = (plan(binary, family, cp, a, args.per_rank) for a in ("minheap", "refined"))
            print(f"| {family} | {cp} | {ref['slices']:,} | {heap['imbalance']:.3f}% / "
                  f"{ref['imbalance']:.3f}% | {ref['stages']} | {ref['ours']:.3f} / {ref['ring']:.3f}"
                  f" / {ref['ag']:.3f} | {ref['ours'] / ref['ring']:.3f} | {ref['seconds']:.4f} | "
                  f"{ref['predicted']:.0f} |")


if __name__ == "__main__":
    main()
