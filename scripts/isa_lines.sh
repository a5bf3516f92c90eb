#!/usr/bin/env bash
# Counts the ISA-specific lines of the kernels at a commit (default HEAD): non-blank lines that are not only a
# comment, in src/kernels files named *_avx2*, *_avx512*, *_avxvnni*, *_amx*, *_simd.h or micro*.h, or that include
# <immintrin.h>. Usage: scripts/isa_lines.sh [commit] [-v]   (-v lists the count per file)
set -euo pipefail
rev=${1:-HEAD}
verbose=${2:-}
cd "$(git rev-parse --show-toplevel)"

# Lines left once blank lines, // comment lines and /* ... */ comment blocks are dropped.
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
      if (line ~ /[^ \t]/) n++ }
    END { print n + 0 }'
}

total=0
while read -r path; do
  base=${path##*/}
  text=$(git show "$rev:$path")
  if [[ $base =~ _avx2|_avx512|_avxvnni|_amx|_simd\.h$|^micro.*\.h$ ]] || grep -q '#include <immintrin.h>' <<<"$text"; then
    n=$(code_lines <<<"$text")
    total=$((total + n))
    [[ $verbose == -v ]] && printf '%6d  %s\n' "$n" "$path"
  fi
done < <(git ls-tree -r --name-only "$rev" -- src/kernels | grep -E '\.(h|cpp)$')
printf '%d\n' "$total"
