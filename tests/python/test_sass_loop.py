"""scripts/sass_loop.py on a small hand-written SASS listing (docs/benchmarks.md quotes its
counts): which loop it picks, which way it sends each branch, and its argument errors."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "sass_loop.py")


def listing(body):
    """cuobjdump's line format: /*address*/ instruction ; /* encoding */"""
    lines = ["\t\tFunction : kernel"]
    for i, insn in enumerate(body):
        lines.append(f"        /*{0x100 + 16 * i:04x}*/                   {insn} ;"
                     "                      /* 0x0000000000000000 */")
    return "\n".join(lines) + "\n"


# A producer-like loop (0x100..0x1b0) with two TMA copies and a wait, after a consumer-like loop
# of 12 HGMMA (0x1c0..0x2e0) with a skipped masking branch.
BODY = (
    ["IADD3 R1, R1, 0x1, RZ",                         # 0x100 producer loop start
     "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ], R3",  # 0x110
     "@!P0 BRA 0x400",                                  # 0x120 retry: not taken
     "@P1 BRA 0x160",                                   # 0x130 not taken unless --taken
     "UTMALDG.3D [UR8], [UR4], desc[UR14]",             # 0x140
     "UTMALDG.3D [UR8], [UR4], desc[UR14]",             # 0x150
     "IADD3 R4, R4, 0x1, RZ",                           # 0x160
     "NOP",                                             # 0x170
     "NOP",                                             # 0x180
     "NOP",                                             # 0x190
     "ISETP.GE.AND P2, PT, R4, R5, PT",                 # 0x1a0
     "@!P2 BRA 0x100"]                                  # 0x1b0 back edge
    + ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24"] * 6  # 0x1c0..0x210 consumer loop
    + ["@P3 BRA 0x250",                                 # 0x220 over the masking: taken
       "FSEL R6, R6, -INF , P4",                        # 0x230
       "FSEL R7, R7, -INF , P4",                        # 0x240
       "FMUL R8, R8, R9"]                               # 0x250
    + ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24"] * 6  # 0x260..0x2b0
    + ["ISETP.GE.AND P2, PT, R4, R5, PT",               # 0x2c0
       "@!P2 BRA 0x1c0",                                # 0x2d0 back edge
       "EXIT"]                                          # 0x2e0
)


def run(tmp_path, *args):
    path = tmp_path / "k.sass"
    path.write_text(listing(BODY))
    return subprocess.run([sys.executable, SCRIPT, str(path), *args], capture_output=True,
                          text=True)


def test_default_walks_the_hgmma_loop_and_skips_the_masking(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "220: @P3 BRA 0x250  -> taken" in r.stdout
    # 0x1c0..0x2d0 without the two FSEL: 16 instructions, one key block (12 HGMMA) a round.
    assert "loop 1c0..2d0, 1 key block(s) a round: 16.0 instructions a block" in r.stdout


def test_around_picks_the_producer_loop(tmp_path):
    r = run(tmp_path, "--around", "UTMALDG:2")
    assert r.returncode == 0, r.stderr
    assert "120: @!P0 BRA 0x400  -> not taken" in r.stdout  # the wait succeeded
    assert "loop 100..1b0, 1 key block(s) a round: 12.0 instructions a block" in r.stdout
    r = run(tmp_path, "--around", "UTMALDG:2", "--taken", "130")
    assert "loop 100..1b0, 1 key block(s) a round: 10.0 instructions a block" in r.stdout


def test_around_errors_name_the_value(tmp_path):
    r = run(tmp_path, "--around", "UTMALDG")
    assert r.returncode != 0 and "--around 'UTMALDG'" in r.stderr
    r = run(tmp_path, "--around", "UTMALDG:0")
    assert r.returncode != 0 and "--around 'UTMALDG:0'" in r.stderr
    r = run(tmp_path, "--around", "UTMALDG:3")
    assert r.returncode != 0 and "no loop with 3 or more UTMALDG" in r.stderr
