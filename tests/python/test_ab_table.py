"""bench/ab_table.py on outputs in bench/gpu_attention_bench.py's row format (its header and
row_line, which the bench prints with), without a GPU."""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import ab_table  # noqa: E402


def row(name, seqlen, magi, ffa=None, cudnn=None, check="-"):
    tflops = {"magiattn": magi, "ffa": ffa, "cudnn": cudnn}
    return ab_table.row_line(name, seqlen, 100.0,
                             {k: v for k, v in tflops.items() if v is not None}, check)


OLD = "\n".join([
    "# NVIDIA H200, torch 2.11, bf16, Hq 32, Hkv 8, D 128; TFLOP/s ...",
    ab_table.header(),
    row("full", 65536, 599.0, ffa=620.0, cudnn=590.0, check="1.9e-03 cudnn"),
    "  flash: No available kernel",
    row("varlen-full", 65536, 570.0, ffa=550.0),
])
NEW = "\n".join([
    row("full", 65536, 629.0, ffa=624.0, cudnn=594.0, check="2.0e-03 cudnn"),
    row("shared-prefix", 16384, 504.0, ffa=424.0, check="9.8e-04 ffa"),
])


def test_rows_are_parsed_with_their_check():
    rows = ab_table.parse(OLD)
    assert set(rows) == {("full", 65536), ("varlen-full", 65536)}
    assert rows[("full", 65536)]["magiattn"] == 599.0 and rows[("full", 65536)]["ffa"] == 620.0
    assert "cudnn" not in rows[("varlen-full", 65536)]
    assert rows[("full", 65536)]["check"] == "1.9e-03 cudnn"
    assert rows[("varlen-full", 65536)]["check"] == "-"


def test_table_compares_the_last_build_with_the_first_and_the_baselines():
    text = ab_table.table([("main", ab_table.parse(OLD)), ("branch", ab_table.parse(NEW))])
    lines = text.splitlines()
    assert lines[0] == ("| mask | tokens | main | branch | branch vs main | FFA | cuDNN | "
                        "branch / FFA | branch / cuDNN | max|diff| |")
    # FFA and cuDNN: the mean of both files' timings (620, 624 -> 622; 590, 594 -> 592).
    assert lines[2] == "| full | 64k | 599 | 629 | +5.0 % | 622 | 592 | 1.01 | 1.06 | 2.0e-03 cudnn |"
    assert lines[3] == "| varlen-full | 64k | 570 | - | - | 550 | - | - | - | - |"
    assert lines[4] == "| shared-prefix | 16k | - | 504 | - | 424 | - | 1.19 | - | 9.8e-04 ffa |"


def test_arguments_that_name_nothing_are_errors(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("# no rows\n")
    for bad, says in (["main"], "want LABEL=FILE"), ([f"main={empty}"], "no rows"), \
                     ([f"main={tmp_path / 'missing.txt'}"], "missing.txt"):
        with pytest.raises(SystemExit):
            ab_table.main(bad)
        assert says in capsys.readouterr().err
