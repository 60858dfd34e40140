"""Seeds for the Python suite, as in the C++ tests: MAGI_TEST_SEED replays a failure (each test
mixes it with its own name), MAGI_TEST_LEVEL=full widens the random sweeps. The installed
magiattn is what gets imported: nothing here touches sys.path."""

import os
import zlib

import numpy as np
import pytest

SEED = int(os.environ.get("MAGI_TEST_SEED") or 20261129)
FULL = os.environ.get("MAGI_TEST_LEVEL") == "full"


def seed_note(seed: int = SEED) -> str:
    return f"seed {seed} (replay with MAGI_TEST_SEED={seed})"


def pytest_report_header(config):
    import magiattn

    return [f"magiattn {magiattn.__version__} from {os.path.dirname(magiattn.__file__)}",
            f"{seed_note()}, level {'full' if FULL else 'quick'}"]


@pytest.fixture
def rng(request):
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("magiattn seed", seed_note()))
