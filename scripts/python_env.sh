# Sourced by setup.sh and test.sh: picks the Python that `pip install .` goes into and sets
# $python. That is the python3 on PATH, given Debian's pip and headers when it lacks them; a
# Python that Debian marks externally managed (PEP 668) gets a virtualenv in build/venv
# instead, so nothing is forced into the system's site-packages.
apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "[python] installing: $*"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}
command -v python3 >/dev/null || apt_install python3
has_headers='import os, sysconfig as s; assert os.path.exists(s.get_paths()["include"] + "/Python.h")'
pep668='import os, sys, sysconfig as s
sys.exit(not os.path.exists(os.path.join(s.get_path("stdlib"), "EXTERNALLY-MANAGED")))'
missing=()
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
python3 -c "$has_headers" 2>/dev/null || missing+=(python3-dev)
if python3 -c "$pep668"; then
  python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
fi
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
python=python3
if python3 -c "$pep668"; then
  [ -x build/venv/bin/python ] || python3 -m venv build/venv
  python=build/venv/bin/python
  echo "[python] the system Python is externally managed: using the virtualenv build/venv"
fi
# Same cap as build.sh: one compile job per 3 GB of RAM.
jobs=$(nproc)
mem_gb=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
[ $((mem_gb / 3)) -lt "$jobs" ] && jobs=$((mem_gb / 3))
[ "$jobs" -ge 1 ] || jobs=1
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
# pip runs as root on CI and fresh machines; its warning about that is noise here.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
