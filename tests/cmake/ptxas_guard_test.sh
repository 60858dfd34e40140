#!/usr/bin/env bash
# cmake/ptxas_guard.sh with a stand-in compiler: a clean compile passes (its warnings kept, the
# resource report dropped); a report of serialized wgmma fails in "error" mode (object removed)
# and passes with a message in "warn" mode; a failing compile keeps its exit status.
set -euo pipefail
guard=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cc" <<'CC'
#!/usr/bin/env bash
# prints what a compile with -Xptxas=-v prints, per $FAKE; writes the -o file
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
[ -n "$out" ] && echo obj > "$out"
echo "ptxas info    : Used 168 registers, used 3 barriers" >&2
echo "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" >&2
echo "kernel.cu(3): warning: a real warning" >&2
case "$FAKE" in
  serialized) echo "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'k'" >&2 ;;
  fail) exit 3 ;;
esac
exit 0
CC
chmod +x "$dir/cc"
fail() { echo "FAIL: $*"; exit 1; }
FAKE=clean bash "$guard" error "$dir/cc" -c k.cu -o "$dir/k.o" 2>"$dir/err" || fail "clean compile failed"
grep -q "a real warning" "$dir/err" || fail "the compiler's warning was dropped"
grep -q "Used 168 registers\|bytes stack frame" "$dir/err" && fail "the resource report was kept"
if FAKE=serialized bash "$guard" error "$dir/cc" -c k.cu -o "$dir/k.o" 2>"$dir/err"; then
  fail "serialized wgmma passed in error mode"
fi
grep -q "magiattn: .*instructions are serialized" "$dir/err" || fail "no serialization message"
[ -e "$dir/k.o" ] && fail "the object of a failed guard was kept"
FAKE=serialized bash "$guard" warn "$dir/cc" -c k.cu -o "$dir/k.o" 2>"$dir/err" || fail "warn mode failed"
grep -q "runs at a fraction of its speed" "$dir/err" || fail "warn mode said nothing"
set +e
FAKE=fail bash "$guard" error "$dir/cc" -c k.cu -o "$dir/k.o" 2>/dev/null
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "a failing compile's status became $rc"
echo "ptxas guard: all cases pass"
