#!/usr/bin/env python3
"""Instructions per key block on a kernel's common path, from its SASS (no GPU needed).

    cuobjdump -sass fwd.cubin > fwd.sass
    python3 scripts/sass_loop.py fwd.sass --function 0 [--taken 9990,d4f0]
    python3 scripts/sass_loop.py fwd.sass --around UTMALDG:2 --taken ...   # the producer's loop

Finds the innermost loop (a backward conditional branch) that encloses at least 12 HGMMA (one
or two key blocks of the attention loop: 16 or 12 HGMMA a block; --around OP:N picks the loop
around N of another opcode, one key block a round), then walks one round of it:

- a wait that succeeds: after a TRYWAIT/PHASECHK that sets predicate P, `@P BRA` is taken and
  `@!P BRA` (the retry) is not;
- masking and NaN/inf poisoning are skipped: a forward branch over code holding an
  `FSEL ... -INF` (masking) or an `FLO` (the flag walk) is taken;
- any other conditional branch is not taken, unless its address is given with --taken (print
  the branches, read the code, say which way the common case goes).

Prints each branch and its direction, then the count per key block and a histogram of opcodes.
The walk is a model of one path, not a measurement: ncu's source view counts what ran.

--check-under-pv reports the forward's overlap on that path: whether every exponential
(MUFU.EX2) issues while a wgmma group is still in flight, i.e. not between a
`WARPGROUP.DEPBAR.LE gsb0, 0x0` (all products done) and the next HGMMA; exit status 1 names the
first that does not. ptxas hoists that wait to the top of its basic block. A diagnostic, not a
rule: the forward passes it at D 128, 192 and 256, and fails it at D 64, where the wait at the
softmax's top measured 7-10 % faster (docs/benchmarks.md, fourteenth session).
"""
import argparse
import collections
import re
import sys

INSN = re.compile(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')
BRA = re.compile(r'BRA (0x[0-9a-f]+)')


def functions(path):
    return open(path).read().split('Function :')[1:]


def name_of(text):
    return text.split('\n', 1)[0].strip()


def parse(text):
    ins = {}
    for line in text.splitlines():
        m = INSN.match(line)
        if m:
            ins[int(m.group(1), 16)] = m.group(2)
    return ins


def opcode(insn):
    words = insn.split()
    op = words[1] if words[0].startswith('@') else words[0]
    return op.split('.')[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('sass')
    ap.add_argument('--function', default='0',
                    help='index of the Function in the dump, or a part of its name: every such '
                         'Function then, one after the other')
    ap.add_argument('--taken', default='', help='hex addresses of branches to take, comma separated')
    ap.add_argument('--list', action='store_true', help='print the walked path, numbered')
    ap.add_argument('--check-under-pv', action='store_true',
                    help='fail unless every MUFU.EX2 of the walk issues with a wgmma in flight')
    ap.add_argument('--around', default='HGMMA:12', metavar='OP:N',
                    help='walk the innermost loop around N instructions of opcode OP (default '
                         'HGMMA:12, the consumers\' loop; UTMALDG:2 is the producer\'s)')
    args = ap.parse_args()
    op, _, least = args.around.partition(':')
    if not (op and least.isdigit() and int(least) > 0):
        sys.exit(f'--around {args.around!r}: want OPCODE:N with N > 0, e.g. UTMALDG:2')
    least = int(least)
    funcs = functions(args.sass)
    if args.function.isdigit():
        if int(args.function) >= len(funcs):
            sys.exit(f'--function {args.function}: the dump has {len(funcs)} functions')
        chosen = [funcs[int(args.function)]]
    else:
        chosen = [f for f in funcs if args.function in name_of(f)]
        if not chosen:
            sys.exit(f'--function {args.function!r}: no function of that name in the dump')
    failed = 0
    for text in chosen:
        if len(chosen) > 1:
            print(f'== {name_of(text)}')
        failed += walk_function(text, args, op, least)
    sys.exit(1 if failed else 0)


def walk_function(text, args, op, least):
    """Walks one function's loop, prints it; 1 where --check-under-pv fails, else 0."""
    ins = parse(text)
    addrs = sorted(ins)
    after = dict(zip(addrs, addrs[1:]))
    taken = {int(x, 16) for x in args.taken.split(',') if x}

    loop = None  # (start, branch address, OP inside)
    for a in addrs:
        m = BRA.search(ins[a])
        if not (m and ins[a].startswith('@')):
            continue
        t = int(m.group(1), 16)
        n = sum(opcode(ins[x]) == op for x in addrs if t <= x <= a)
        if t < a and n >= least and (loop is None or a - t < loop[1] - loop[0]):
            loop = (t, a, n)
    if loop is None:
        sys.exit(f'no loop with {least} or more {op}')
    start, back, found = loop
    taken.add(back)

    path, wait_pred, a = [], None, start
    while len(path) < 5000:
        insn = ins[a]
        path.append((a, insn))
        m = BRA.search(insn)
        nxt = after[a]
        if 'TRYWAIT' in insn or 'PHASECHK' in insn:
            wait_pred = insn.split()[-3].rstrip(',')  # the predicate it sets
        elif not m and 'NANOSLEEP' not in insn:
            wait_pred = None
        if m:
            t = int(m.group(1), 16)
            go = not insn.startswith('@') or a in taken
            guard = insn.split()[0]
            if insn.startswith('@') and a not in taken:
                if wait_pred and guard in ('@' + wait_pred, '@!' + wait_pred):
                    go = guard == '@' + wait_pred  # the wait succeeded: no retry
                elif a < t < a + 0x3000 and any(
                        'FLO' in ins[x] or ('FSEL' in ins[x] and '-INF' in ins[x])
                        for x in addrs if a < x < t):
                    go = True  # masking / poisoning skipped
            print(f'  {a:x}: {insn}  -> {"taken" if go else "not taken"}')
            if go:
                nxt = t
            wait_pred = None
        a = nxt
        if a == start:
            break
    if args.list:
        for i, (x, insn) in enumerate(path):
            print(f'{i:5d}  {x:x} {insn}')
    blocks = max(1, found // (16 if found % 16 == 0 else 12)) if op == 'HGMMA' else 1
    hist = collections.Counter(opcode(insn) for _, insn in path)
    print(f'loop {start:x}..{back:x}, {blocks} key block(s) a round: {len(path) / blocks:.1f} '
          f'instructions a block')
    print(' '.join(f'{k}:{v}' for k, v in hist.most_common()))
    if not args.check_under_pv:
        return 0
    bad = exposed_exponentials(path)
    if bad:
        a, insn = bad[0]
        exps = sum('MUFU.EX2' in insn for _, insn in path)
        print(f'{len(bad)} of {exps} MUFU.EX2 issue with no wgmma in flight, the first at '
              f'{a:x} ({insn}), after a WARPGROUP.DEPBAR.LE gsb0, 0x0', file=sys.stderr)
        return 1
    print('every MUFU.EX2 of the walk issues with a wgmma in flight')
    return 0


def exposed_exponentials(path):
    """The MUFU.EX2 of a loop round (walked cyclically) that issue after a wait for every wgmma
    group (DEPBAR.LE gsb0, 0x0) and before the next HGMMA."""
    def walk(in_flight, out=None):
        for a, insn in path:
            if opcode(insn) == 'HGMMA':
                in_flight = True
            elif 'DEPBAR.LE gsb0, 0x0' in insn:
                in_flight = False
            elif out is not None and not in_flight and 'MUFU.EX2' in insn:
                out.append((a, insn))
        return in_flight
    out = []
    walk(walk(True), out)  # the state at the round's end is the state at its start
    return out


if __name__ == '__main__':
    main()
