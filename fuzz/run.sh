#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 and runs each for a bounded time on its seed corpus.
# Usage: fuzz/run.sh [seconds=60] [target ...]   targets: safetensors mo tsv wordpiece json gguf (default: all)
# env: FUZZ_BUILD=build-fuzz, JOBS=2. Exit status != 0 on any crash, leak, sanitizer report or broken invariant.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TOTAL="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(safetensors mo tsv wordpiece json gguf)
BUILD="${FUZZ_BUILD:-$ROOT/build-fuzz}"
CXX_FUZZ="${CXX_FUZZ:-clang++-14}"

cmake -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"${JOBS:-2}" --target $(printf '%s_fuzzer ' "${TARGETS[@]}")

failed=0
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/fuzz/corpus_$t"
  [ "$t" = safetensors ] && seeds="$ROOT/fuzz/corpus"
  dict=()
  [ -f "$ROOT/fuzz/$t.dict" ] && dict=(-dict="$ROOT/fuzz/$t.dict")
  # New inputs go to $BUILD/<target>/corpus; the checked-in seeds are only read.
  work="$BUILD/$t"
  mkdir -p "$work/corpus" "$work/artifacts"
  set +e
  "$BUILD/${t}_fuzzer" \
    -max_total_time="$SECONDS_TOTAL" -timeout=30 -rss_limit_mb=2048 -max_len=4096 "${dict[@]}" \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
    "$work/corpus" "$seeds" >"$work/fuzz.log" 2>&1
  status=$?
  set -e
  runs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$work/fuzz.log" | grep -Eo '[0-9]+$' || echo 0)"
  if [ "$status" -ne 0 ]; then
    grep -E "ERROR|SUMMARY|invariant|prefix" "$work/fuzz.log" | head -5 >&2 || true
    echo "fuzz $t: FAILED after $runs executions (exit $status); see $work/fuzz.log and $work/artifacts/" >&2
    failed=1
  else
    echo "fuzz $t: $runs executions ran clean in ${SECONDS_TOTAL}s (log: $work/fuzz.log)"
  fi
done
exit "$failed"
