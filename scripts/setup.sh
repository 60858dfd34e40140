#!/usr/bin/env bash
# Fresh Debian machine to a first result: install dependencies, build the release preset,
# then run `magiattn run` on its default problem (16k-token document-packed causal mask,
# forward + backward checked against the fp64 oracle). Extra arguments go to `magiattn run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
build/release/bin/magiattn run "$@"
