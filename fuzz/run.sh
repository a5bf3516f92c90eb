#!/usr/bin/env bash
# Builds the safetensors libFuzzer target with clang-14 and runs it for a bounded time on the seed corpus.
# Usage: fuzz/run.sh [seconds=60]   (env: FUZZ_BUILD=build-fuzz, JOBS=2). Exit status != 0 on any crash.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TOTAL="${1:-60}"
BUILD="${FUZZ_BUILD:-$ROOT/build-fuzz}"
CXX_FUZZ="${CXX_FUZZ:-clang++-14}"

cmake -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"${JOBS:-2}"

# New inputs go to $BUILD/corpus; the checked-in seeds in fuzz/corpus are only read.
mkdir -p "$BUILD/corpus" "$BUILD/artifacts"
set +e
"$BUILD/safetensors_fuzzer" \
  -max_total_time="$SECONDS_TOTAL" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -dict="$ROOT/fuzz/safetensors.dict" -artifact_prefix="$BUILD/artifacts/" -print_final_stats=1 \
  "$BUILD/corpus" "$ROOT/fuzz/corpus" >"$BUILD/fuzz.log" 2>&1
status=$?
set -e
grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|stat::(number_of_executed_units|new_units_added|peak_rss_mb)|ERROR|SUMMARY" \
  "$BUILD/fuzz.log" || true
runs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$BUILD/fuzz.log" | grep -Eo '[0-9]+$' || echo 0)"
if [ "$status" -ne 0 ]; then
  echo "fuzz: FAILED after $runs executions (exit $status); see $BUILD/fuzz.log and $BUILD/artifacts/" >&2
  exit "$status"
fi
echo "fuzz: $runs executions ran clean in ${SECONDS_TOTAL}s (log: $BUILD/fuzz.log)"
