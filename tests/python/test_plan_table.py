"""bench/plan_table.py against the command line it parses (its output format once drifted
away from the parser unnoticed). Needs the release build's `magiattn` (scripts/test.sh builds
it before the Python tests)."""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plan_table  # noqa: E402

BINARY = os.path.join(ROOT, "build", "release", "bin", "magiattn")


@pytest.mark.skipif(not os.path.exists(BINARY), reason="no build/release/bin/magiattn")
def test_plan_table_reads_the_plan_command():
    r = plan_table.plan(BINARY, "causal", 2, "refined", per_rank=2048)
    assert r["slices"] == 1 and r["area"] == 4096 * 4097 // 2
    assert r["stages"] >= 1 and 0 <= r["imbalance"] < 1
    assert r["predicted"] > 0 and r["seconds"] >= 0
    # Causal over 2 ranks: ours moves less than ring, which moves as much as all-gather.
    assert 0 < r["ours"] < r["ring"] == pytest.approx(r["ag"])
