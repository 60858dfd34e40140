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


def run_on(path, *args):
    return subprocess.run([sys.executable, SCRIPT, str(path), *args], capture_output=True,
                          text=True)


def run(tmp_path, *args):
    path = tmp_path / "k.sass"
    path.write_text(listing(BODY))
    return run_on(path, *args)


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


def consumer_loop(softmax_first):
    """A consumer-like loop of 12 HGMMA; the wait for every product before or after the two
    exponentials; a reciprocal (a MUFU, not an exponential) after both."""
    wait = ["WARPGROUP.DEPBAR.LE gsb0, 0x0"]
    softmax = ["MUFU.EX2 R24, R24", "MUFU.EX2 R25, R25"]
    body = (["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24"] * 12
            + ["WARPGROUP.DEPBAR.LE gsb0, 0x1"]
            + (softmax + wait if softmax_first else wait + softmax)
            + ["MUFU.RCP R26, R26", "F2FP.BF16.F32.PACK_AB R120, R25, R24",
               "ISETP.GE.AND P2, PT, R4, R5, PT", "@!P2 BRA 0x100", "EXIT"])
    return listing(body)


def test_check_under_pv_names_an_exposed_exponential(tmp_path):
    path = tmp_path / "k.sass"
    path.write_text(consumer_loop(softmax_first=True))
    r = run_on(path, "--check-under-pv")
    assert r.returncode == 0, r.stderr
    assert "every MUFU.EX2 of the walk issues with a wgmma in flight" in r.stdout
    path.write_text(consumer_loop(softmax_first=False))
    r = run_on(path, "--check-under-pv")
    # 0x100 + 16 * 14: the first exponential, right after the wait for every product.
    assert r.returncode == 1
    assert "2 of 2 MUFU.EX2 issue with no wgmma in flight, the first at 1e0 (MUFU.EX2 R24, R24)" \
        in r.stderr


def test_check_under_pv_follows_the_round_around(tmp_path):
    # The exponential opens the round; the wait for every product closed the round before it.
    body = (["MUFU.EX2 R24, R24"] + ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24"] * 12
            + ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "@!P2 BRA 0x100", "EXIT"])
    path = tmp_path / "k.sass"
    path.write_text(listing(body))
    r = run_on(path, "--check-under-pv")
    assert r.returncode == 1 and "the first at 100 (MUFU.EX2 R24, R24)" in r.stderr


def test_function_by_name_walks_each_match_and_names_a_miss(tmp_path):
    path = tmp_path / "k.sass"
    path.write_text(listing(BODY).replace("Function : kernel", "Function : my_fwd_kernel")
                    + consumer_loop(softmax_first=False).replace("Function : kernel",
                                                                 "Function : my_fwd_kernel_2"))
    r = run_on(path, "--function", "fwd_kernel", "--check-under-pv")
    assert "== my_fwd_kernel\n" in r.stdout and "== my_fwd_kernel_2\n" in r.stdout
    assert r.returncode == 1 and "2 of 2 MUFU.EX2 issue with no wgmma in flight" in r.stderr
    r = run_on(path, "--function", "bwd_kernel")
    assert r.returncode != 0 and "--function 'bwd_kernel': no function of that name" in r.stderr
    r = run_on(path, "--function", "5")
    assert r.returncode != 0 and "--function 5: the dump has 2 functions" in r.stderr
