# Sourced by setup.sh and test.sh: picks the Python that `pip install .` goes into and sets
# $python and $pip_jobs. That is the python3 on PATH, given Debian's pip and headers when it
# lacks them; a Python that Debian marks externally managed (PEP 668) gets a virtualenv in
# build/venv instead, so nothing is forced into the system's site-packages.
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if ! python3 -m pip --version >/dev/null 2>&1 ||
   ! python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then
  echo "[python] installing: python3-dev python3-pip python3-venv"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    python3-dev python3-pip python3-venv
fi
python=python3
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  [ -x build/venv/bin/python ] || python3 -m venv build/venv
  python=build/venv/bin/python
  echo "[python] the system Python is externally managed: using the virtualenv build/venv"
fi
# Same cap as build.sh: one compile job per 3 GB of RAM.
pip_jobs=$(nproc)
mem_gb=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
[ $((mem_gb / 3)) -lt "$pip_jobs" ] && pip_jobs=$((mem_gb / 3))
[ "$pip_jobs" -ge 1 ] || pip_jobs=1
export CMAKE_BUILD_PARALLEL_LEVEL=$pip_jobs
