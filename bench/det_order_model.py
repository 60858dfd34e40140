"""A model of the deterministic sm90 backward's schedule: how long the dq turns make it wait.

    PYTHONPATH=<magiattn> python3 bench/det_order_model.py --masks causal shared-prefix

Each key tile (128 keys) is a list of steps, one per (query block of 64 rows, q head of the
group), in the order the kernel walks them; a step's dq addition must wait for its turn, the
number of additions to the same (head, block) made before it in the order the persistent
scheduler hands out the items (kv head outer, tiles heavy first, steps in walk order; the
kernel's dq_tickets). One time unit is one block's compute; a CTA computes at most `stages`
blocks ahead of its last addition (the dQ staging ring) and makes one addition per unit.

It models the scheduling only: no memory system, equal cost per block, so it predicts ratios
between walk orders, not TFLOP/s. The pieces of a tile are cut from the slices as
make_work_list cuts them (work_list.cc); the kernel's walk is `desc` (pieces from the last rows
up, each piece's blocks from its last down, q heads inner), the one before it `asc` (q heads
outer, pieces in slice order, blocks from the first up). On the H200 (docs/benchmarks.md,
2026-12-04) the model's ratios matched the measured ones to within about 10 %.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_masks import SPEC_MASKS, build_mask  # noqa: E402

BM, BN = 64, 128  # query rows per block, keys per tile (D <= 128)
BIG = 1 << 40


def band(t: int, q0: int, q1: int, k0: int, k1: int) -> tuple:
    """lo <= k - q <= hi for the slice types FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL."""
    lo = k0 - q0 if t in (2, 3) else -BIG
    hi = k1 - q1 if t in (1, 3) else BIG
    return lo, hi


def joined(pieces: list) -> list:
    """The host's join_pieces along rows (work_list.cc): pieces with the same keys and band
    over adjacent rows become one, in its first member's place."""
    out = {}  # first member's index -> piece
    last = None
    for i in sorted(range(len(pieces)), key=lambda i: (pieces[i][2:], pieces[i][0])):
        p = pieces[i]
        if last is not None and out[last][2:] == p[2:] and out[last][1] == p[0]:
            q = (out[last][0], p[1]) + p[2:]
            del out[last]
            last = min(last, i)
            out[last] = q
        else:
            last = i
            out[i] = p
    return [out[i] for i in sorted(out)]


def key_tiles(mask) -> list:
    """Per key tile, the row ranges (q0, q1) of its pieces, tiles sorted heavy first."""
    nt = (mask.total_seqlen_k + BN - 1) // BN
    per = [[] for _ in range(nt)]
    for (q0, q1), (k0, k1), t in zip(mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()):
        q0, q1, k0, k1, t = int(q0), int(q1), int(k0), int(k1), int(t)
        lo, hi = band(t, q0, q1, k0, k1)
        for ti in range(k0 // BN, (k1 + BN - 1) // BN):
            a = max(ti * BN, k0, q0 + lo)
            b = min((ti + 1) * BN, k1, q1 + hi)
            r0, r1 = max(q0, a - hi), min(q1, b - lo)
            if a < b and hi >= lo and r0 < r1:
                per[ti].append((r0, r1, a, b, lo, hi))
    per = [[p[:2] for p in joined(ps)] for ps in per]
    blocks = lambda ps: sum((r1 - r0 // BM * BM + BM - 1) // BM for r0, r1 in ps)  # noqa: E731
    return sorted(per, key=lambda ps: -blocks(ps))  # stable, as the host's sort


def steps(pieces: list, walk: str, group: int, g: int) -> list:
    def blocks(p):
        return list(range(p[0] // BM, (p[1] + BM - 1) // BM))
    if walk == "asc":
        return [(g * group + h, b) for h in range(group) for p in pieces for b in blocks(p)]
    order = sorted(pieces, key=lambda p: (-p[1], -p[0]))
    return [(g * group + h, b) for p in order for b in blocks(p)[::-1] for h in range(group)]


def simulate(tiles: list, walk: str, heads_kv: int, group: int, ctas: int, stages: int,
             det: bool) -> int:
    items = [steps(t, walk, group, g) for g in range(heads_kv) for t in tiles]
    turns_seen, tickets = {}, []
    for st in items:
        tl = []
        for key in st:
            tl.append(turns_seen.get(key, 0))
            turns_seen[key] = tl[-1] + 1
        tickets.append(tl)
    turn, nxt, done, t = {}, 0, 0, 0
    state = [None] * ctas  # per CTA: [item, computed, added]
    while done < len(items):
        for c in range(ctas):
            s = state[c]
            if s is None:
                if nxt == len(items):
                    continue
                s = state[c] = [nxt, 0, 0]
                nxt += 1
            st, tl = items[s[0]], tickets[s[0]]
            if s[2] < s[1] and (not det or turn.get(st[s[2]], 0) == tl[s[2]]):
                turn[st[s[2]]] = turn.get(st[s[2]], 0) + 1
                s[2] += 1
            if s[1] < len(st) and s[1] - s[2] < stages:
                s[1] += 1
            if s[2] == len(st):
                state[c] = None
                done += 1
        t += 1
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--masks", nargs="+", default=SPEC_MASKS, choices=SPEC_MASKS)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--ctas", type=int, default=132, help="persistent CTAs (SMs)")
    ap.add_argument("--stages", type=int, default=2, help="dQ staging buffers")
    args = ap.parse_args(argv)
    group = args.heads_q // args.heads_kv
    print("mask, walk: time without turns, with turns (block-times), ratio")
    for name in args.masks:
        tiles = key_tiles(build_mask(name, args.seqlen))
        for walk in ("asc", "desc"):
            free, det = (simulate(tiles, walk, args.heads_kv, group, args.ctas, args.stages, d)
                         for d in (False, True))
            print(f"{name:<20} {walk:<5} {free:>7} {det:>7}  {det / free:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
