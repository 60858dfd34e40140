"""bench/profile_one_call.py's arguments, without a GPU: every benchmark mask is accepted, and
cuDNN on a mask it cannot run is refused by name before anything runs."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "profile_one_call.py")

pytest.importorskip("torch")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_cudnn_on_a_document_mask_is_refused_by_name():
    r = run("--impl", "cudnn", "--mask", "shared-prefix")
    assert r.returncode == 2
    assert "--impl cudnn runs only the full and causal masks, not 'shared-prefix'" in r.stderr


def test_an_unknown_mask_is_refused():
    r = run("--mask", "nope")
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr


@pytest.mark.parametrize("mask", ["shared-prefix", "block-sparse", "causal"])
def test_benchmark_masks_are_accepted(mask):
    r = run("--mask", mask, "--seqlen", "4096")
    assert r.returncode == 0, r.stderr
    assert "no CUDA device: nothing to run" in r.stdout
