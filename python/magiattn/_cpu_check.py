"""The check `import magiattn` makes, by importing this module, before it loads the compiled
modules: this CPU has every instruction-set feature the build was compiled for
(magiattn/_build.py, written by the build), so that a wheel built elsewhere fails with a
message naming what is missing, not with an illegal instruction. Linux only (/proc/cpuinfo);
elsewhere, and without _build.py (a source tree), nothing is checked."""
from __future__ import annotations

from typing import Iterable, Optional


def cpu_flags(path: str = "/proc/cpuinfo") -> Optional[set[str]]:
    """The feature flags of this CPU as the kernel lists them, or None when unknown."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def missing(required: Iterable[str], have: Optional[set[str]]) -> list[str]:
    return [] if have is None else [f for f in required if f not in have]


def check(required: Iterable[str], arch: str, have: Optional[set[str]]) -> None:
    lack = missing(required, have)
    if lack:
        raise ImportError(
            f"magiattn was compiled for -march={arch or 'default'} and this CPU lacks "
            f"{', '.join(lack)}: reinstall it built here (pip install . "
            f"-Ccmake.define.MAGI_CPU_ARCH=native) or for an older target "
            f"(-Ccmake.define.MAGI_CPU_ARCH=x86-64-v2)")


def run() -> None:
    try:
        from . import _build
    except ImportError:  # a source tree without a build
        return
    check(_build.CPU_FLAGS, _build.CPU_ARCH, cpu_flags())


run()
