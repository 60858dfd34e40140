# Sourced by setup.sh and test.sh after python_env.sh: makes torch importable in $python for
# the examples and the torch tests, installing it from PyPI (~2 min, ~5.4 GB) when it is
# missing and at least 10 GB are free; otherwise says why not and how to get it.
if $python -c 'import torch' 2>/dev/null; then
  echo "[torch] torch $($python -c 'import torch; print(torch.__version__)') found"
else
  site=$($python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  free_gb=$(df -Pk "$site" | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$free_gb" -ge 10 ]; then
    echo "[torch] installing torch from PyPI (${free_gb} GB free; needs ~5.4 GB, ~2 min)"
    $python -m pip install -q --no-cache-dir torch ||
      echo "[torch] torch could not be installed: the examples and torch tests need it" \
           "($python -m pip install torch)"
  else
    echo "[torch] torch is not installed and only ${free_gb} GB is free where it would go" \
         "(it takes ~5.4 GB): the examples and torch tests need it ($python -m pip install torch)"
  fi
fi
