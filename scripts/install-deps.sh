#!/usr/bin/env bash
# Installs what qkv needs on a fresh Debian 12 machine, and nothing that is already there.
# Idempotent: a second run checks, finds everything present, and returns in about a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

# --- Debian packages -------------------------------------------------------
# libopenblas-openmp-dev : CBLAS built on OpenMP, so BLAS threads never nest inside ours
# libgtest-dev           : GoogleTest (C++ tests)
# libbenchmark-dev       : Google Benchmark (bench/)
# libcli11-dev           : CLI11, header-only argument parser for the `qkv` command
# clang-14, libclang-rt-14-dev, libfuzzer-14-dev, libomp-14-dev : libFuzzer target, ThreadSanitizer build
# libcpp-httplib-dev     : HTTP server of `qkv serve`
# chromium, chromium-driver : the headless browser of the viewer tests (driven by Selenium, never downloaded)
# fonts-wqy-microhei     : a CJK font, so that the browser and the PNG figures draw Chinese tokens and labels
# libfreetype-dev        : FreeType, which draws the figures' non-ASCII text with that font
# openmpi-bin, libopenmpi-dev : Open MPI (mpirun, the C library): data-parallel training and ring attention
# libpcre2-dev           : PCRE2, the Unicode regexes of the language-model tokenizers (src/text/)
# git                    : its French and Simplified Chinese .mo catalogs are the translation experiment's corpus
APT_PACKAGES=(
  git
  build-essential pkg-config
  libopenblas-openmp-dev
  libgtest-dev
  libbenchmark-dev
  libcli11-dev
  zlib1g-dev
  ccache
  clang-14 libclang-rt-14-dev libfuzzer-14-dev libomp-14-dev
  libcpp-httplib-dev
  chromium chromium-driver fonts-wqy-microhei libfreetype-dev
  openmpi-bin libopenmpi-dev
  libpcre2-dev
)
command -v cmake >/dev/null 2>&1 || APT_PACKAGES+=(cmake)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python virtualenv -----------------------------------------------------
REQ="$ROOT/scripts/requirements.txt"
# Packages installed without their dependencies (a test asset whose __init__ imports packages qkv does not use).
REQ_NODEPS="$ROOT/scripts/requirements-nodeps.txt"
STAMP="$VENV/.qkv-requirements"
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-deps: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if ! cat "$REQ" "$REQ_NODEPS" | cmp -s - "$STAMP"; then
  echo "install-deps: pip install -r scripts/requirements.txt -r scripts/requirements-nodeps.txt"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -r "$REQ"
  "$VENV/bin/python" -m pip install -q --no-deps -r "$REQ_NODEPS"
  cat "$REQ" "$REQ_NODEPS" > "$STAMP"
fi
