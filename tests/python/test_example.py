"""examples/train_varlen_causal.py runs and its loss goes down (skipped without torch), and
the README shows the same script."""

import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_varlen_causal.py")


def test_train_varlen_causal_example():
    pytest.importorskip("torch")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    run = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr
    losses = [float(x) for x in re.findall(r"loss (\S+)", run.stdout)]
    assert len(losses) == 20 and all(x == x for x in losses), run.stdout
    assert losses[-1] < 0.8 * losses[0], run.stdout
    assert "leaked" not in run.stderr, run.stderr  # nanobind's exit-time leak report


def test_readme_example_is_the_script():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    with open(EXAMPLE) as f:
        script = f.read()
    body = "\n".join(line for line in script.splitlines() if not line.startswith("#"))
    assert body.strip() in readme
