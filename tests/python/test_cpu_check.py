"""magiattn/_cpu_check.py: a build for CPU features this machine lacks is refused at import with
a message naming them, not run into an illegal instruction."""
import os

import pytest

import magiattn
from magiattn import _cpu_check


def test_a_cpu_without_a_needed_feature_is_refused_by_name():
    with pytest.raises(ImportError, match=r"-march=x86-64-v4 and this CPU lacks avx512f, "
                                          r"avx512bw: reinstall"):
        _cpu_check.check(("avx2", "avx512f", "avx512bw"), "x86-64-v4", {"avx2", "fma"})


def test_a_cpu_with_every_feature_or_unknown_flags_passes():
    _cpu_check.check(("avx2", "fma"), "x86-64-v3", {"avx2", "fma", "sse4_2"})
    _cpu_check.check(("avx2",), "x86-64-v3", None)  # not Linux: nothing is known


def test_cpuinfo_is_read(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 fma\n\nprocessor\t: 1\n")
    assert _cpu_check.cpu_flags(str(p)) == {"fpu", "sse4_2", "avx2", "fma"}
    assert _cpu_check.cpu_flags(str(tmp_path / "absent")) is None


def test_the_installed_build_records_what_it_needs_and_this_cpu_has_it():
    try:
        from magiattn import _build
    except ImportError:
        pytest.skip("magiattn runs from a source tree without _build.py")
    assert isinstance(_build.CPU_FLAGS, tuple)
    if os.path.exists("/proc/cpuinfo"):
        assert _cpu_check.missing(_build.CPU_FLAGS, _cpu_check.cpu_flags()) == []
    assert magiattn.info()["cpu_isa"].startswith(f"-march={_build.CPU_ARCH}")
