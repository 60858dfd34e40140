"""Same-run A/B of several magiattn builds as one markdown table, from the outputs of
bench/gpu_attention_bench.py (one file per build, run one after the other in one session).

    python3 bench/ab_table.py main=d128_old.txt branch=d128_new.txt

Per (mask, tokens) row: each build's magiattn TFLOP/s, the last build's change against the
first, the baselines (FFA, cuDNN: the mean over the files, since each file timed them again),
the last build's ratio to each, and the last build's max|diff| check. A row missing from a
file shows '-'; a file without any row is an error naming it.
"""
from __future__ import annotations

import argparse
import statistics
import sys

# The columns of gpu_attention_bench.py's rows, in order (a '-' where a baseline did not run),
# then the ratios of magiattn to three of them and the max|diff| check: one definition of the
# row format, which the bench writes (header, row_line) and this script reads (parse).
COLUMNS = ["mask", "tokens", "area", "magiattn", "ffa", "cudnn", "flash", "flex"]
RATIOS = ["ffa", "cudnn", "flex"]


def header() -> str:
    return (f"{'mask':<22}{'tokens':>7}{'area%':>7}{'magiattn':>10}{'ffa':>8}{'cudnn':>8}"
            f"{'flash':>8}{'flex':>8}{'/ffa':>8}{'/cudnn':>7}{'/flex':>7}  max|diff| vs")


def row_line(name: str, seqlen: int, area_pct: float, tflops: dict[str, float],
             check: str) -> str:
    """One row: TFLOP/s by column (magiattn always there), '-' for a baseline that did not run."""
    cell = lambda key: f"{tflops[key]:8.1f}" if key in tflops else f"{'-':>8}"
    ratio = lambda key: f"{tflops['magiattn'] / tflops[key]:7.2f}" if key in tflops else f"{'-':>7}"
    return (f"{name:<22}{seqlen:>7}{area_pct:>7.1f}{tflops['magiattn']:>10.1f}"
            + "".join(cell(k) for k in COLUMNS[4:]) + " " + "".join(ratio(k) for k in RATIOS)
            + f"  {check}")


def parse(text: str) -> dict[tuple[str, int], dict[str, float | str]]:
    """The rows of one bench output: (mask, tokens) -> {column: TFLOP/s, 'check': text}."""
    rows = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < len(COLUMNS) or line.startswith("#") or words[0] == "mask":
            continue
        try:
            tokens = int(words[1])
            values = [None if w == "-" else float(w) for w in words[2:len(COLUMNS)]]
        except ValueError:
            continue  # a message line (a baseline that refused the shape)
        row: dict[str, float | str] = {k: v for k, v in zip(COLUMNS[2:], values) if v is not None}
        tail = words[len(COLUMNS) + len(RATIOS):]  # after the ratios: max|diff| and its ref
        row["check"] = " ".join(tail) if tail else "-"
        rows[(words[0], tokens)] = row
    return rows


def table(builds: list[tuple[str, dict]]) -> str:
    first, last = builds[0][0], builds[-1][0]
    keys = []
    for _, rows in builds:
        keys += [k for k in rows if k not in keys]
    head = ["mask", "tokens"] + [label for label, _ in builds]
    if len(builds) > 1:
        head.append(f"{last} vs {first}")
    head += ["FFA", "cuDNN", f"{last} / FFA", f"{last} / cuDNN", "max|diff|"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        got = [rows.get(key, {}).get("magiattn") for _, rows in builds]
        cells = [key[0], f"{key[1] // 1024}k" if key[1] % 1024 == 0 else str(key[1])]
        cells += ["-" if g is None else f"{g:.0f}" for g in got]
        if len(builds) > 1:
            cells.append("-" if None in (got[0], got[-1]) else f"{100 * (got[-1] / got[0] - 1):+.1f} %")
        base = {}
        for name in ("ffa", "cudnn"):
            seen = [rows[key][name] for _, rows in builds if key in rows and name in rows[key]]
            base[name] = statistics.mean(seen) if seen else None
            cells.append("-" if base[name] is None else f"{base[name]:.0f}")
        for name in ("ffa", "cudnn"):
            ok = got[-1] is not None and base[name]
            cells.append(f"{got[-1] / base[name]:.2f}" if ok else "-")
        cells.append(str(builds[-1][1].get(key, {}).get("check", "-")))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs="+", metavar="LABEL=FILE",
                    help="one bench output per build, oldest first")
    args = ap.parse_args(argv)
    builds = []
    for spec in args.builds:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            ap.error(f"{spec!r}: want LABEL=FILE, e.g. main=d128_old.txt")
        try:
            with open(path) as f:
                rows = parse(f.read())
        except OSError as e:
            ap.error(f"{spec!r}: {e.strerror}")
        if not rows:
            ap.error(f"{spec!r}: no rows of bench/gpu_attention_bench.py's output in {path}")
        builds.append((label, rows))
    print(table(builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
