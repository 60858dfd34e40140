#!/usr/bin/env bash
# The test command of the README and of CI: install dependencies, build the release preset and
# run every CTest test (unit tests and CLI tests). MAGI_TEST_ASAN=1 repeats this under
# AddressSanitizer + UBSan; MAGI_TEST_LEVEL=full and MAGI_TEST_SEED pass through to the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# The published histogram sits beside the project in this workplace; when present, the
# built-in table is checked against it.
csv=../shared/data/doc_length_distribution.csv
[ -f "$csv" ] && export MAGI_DOC_LENGTHS_CSV="${MAGI_DOC_LENGTHS_CSV:-$(readlink -f "$csv")}"
presets=(release)
[ "${MAGI_TEST_ASAN:-0}" = 1 ] && presets+=(asan)
for preset in "${presets[@]}"; do
  scripts/build.sh "$preset"
  ctest --preset "$preset" -j "$(nproc)"
done
