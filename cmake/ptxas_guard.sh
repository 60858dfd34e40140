#!/usr/bin/env bash
# CUDA compiler launcher of the sm90 kernel library (src/CMakeLists.txt, MAGI_WGMMA_GUARD): runs
# the compile with ptxas's resource report and looks for the one line of it that matters here,
# ptxas serializing a kernel's wgmma instructions ("wgmma.mma_async instructions are serialized
# due to ...", C7512 and kin: register pressure, a call, an ill-formed pipeline). Such a kernel
# is right but runs at half its speed or less (docs/benchmarks.md, the backward's second
# session), and nothing else would say so. Mode "error" fails the compile (and removes its
# object), "warn" prints the line; the rest of the report is dropped.
# Usage: ptxas_guard.sh error|warn <compiler> <arguments...>
set -uo pipefail
mode=$1
shift
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
"$@" -Xptxas=-v 2>"$log"
rc=$?
grep -v -E '^ptxas info *:|^ +[0-9]+ bytes stack frame' "$log" >&2
if [ "$rc" -eq 0 ] && grep -q 'instructions are serialized' "$log"; then
  out=""
  prev=""
  for a in "$@"; do
    [ "$prev" = "-o" ] && out=$a
    prev=$a
  done
  grep 'instructions are serialized' "$log" | sed 's/^/magiattn: /' >&2
  if [ "$mode" = error ]; then
    echo "magiattn: ${out:-the kernel}: ptxas serialized wgmma (MAGI_WGMMA_GUARD=error; =warn" \
         "builds it anyway)" >&2
    [ -n "$out" ] && rm -f "$out"
    exit 1
  fi
  echo "magiattn: ${out:-the kernel} builds, but runs at a fraction of its speed" >&2
fi
exit "$rc"
