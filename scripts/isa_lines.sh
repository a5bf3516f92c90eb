#!/usr/bin/env bash
# Counts the ISA-specific lines of the kernels at a commit (default HEAD): non-blank lines that are not only a
# comment, in src/kernels files named *_avx2*, *_avx512*, *_avxvnni*, *_amx*, *_simd.h or micro*.h, or that include
# <immintrin.h>; then, on a second line, how many of those lines name intrinsics (_mm*_, __m128 / __m256 / __m512,
# __mmask, _tile_*). Usage: scripts/isa_lines.sh [commit] [-v]   (-v lists both per file)
set -euo pipefail
rev=${1:-HEAD}
verbose=${2:-}
cd "$(git rev-parse --show-toplevel)"

# The lines left once blank lines, // comment lines and /* ... */ comment blocks are dropped.
code_lines() {
  awk '
    { line = $0 }
    in_block { if (index(line, "*/")) { line = substr(line, index(line, "*/") + 2); in_block = 0 } else next }
    { while (match(line, /\/\*/)) {
        rest = substr(line, RSTART + 2)
        if (index(rest, "*/")) line = substr(line, 1, RSTART - 1) substr(rest, index(rest, "*/") + 2)
        else { line = substr(line, 1, RSTART - 1); in_block = 1 }
      }
      sub(/^[ \t]*\/\/.*/, "", line)
      if (line ~ /[^ \t]/) print line }'
}
# Of those, the lines naming an intrinsic, a vector or mask type or a tile intrinsic (a trailing // comment
# dropped first).
intrinsic_lines() {
  sed 's|//.*||' | grep -cE '_mm[0-9]*_|__m(128|256|512)|__mmask|_tile_' || true
}

total=0
named=0
while read -r path; do
  base=${path##*/}
  text=$(git show "$rev:$path")
  if [[ $base =~ _avx2|_avx512|_avxvnni|_amx|_simd\.h$|^micro.*\.h$ ]] || grep -q '#include <immintrin.h>' <<<"$text"; then
    code=$(code_lines <<<"$text")
    n=$(grep -c . <<<"$code" || true)
    i=$(intrinsic_lines <<<"$code")
    total=$((total + n))
    named=$((named + i))
    [[ $verbose == -v ]] && printf '%6d %5d  %s\n' "$n" "$i" "$path"
  fi
done < <(git ls-tree -r --name-only "$rev" -- src/kernels | grep -E '\.(h|cpp)$')
printf '%d\n' "$total"
printf '%d lines name intrinsics\n' "$named"
