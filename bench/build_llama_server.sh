#!/usr/bin/env bash
# Builds llama.cpp's own llama-server, a benchmark peer of bench/serve_compare.py (make bench-serve), from the
# llama.cpp that llama-cpp-python's source package vendors (the version scripts/requirements-bench.txt pins, so both
# peers run the same llama.cpp). Its native CPU build (GGML_NATIVE, as llama-cpp-python builds itself), no web page,
# no TLS, no tests. 15 minutes or more on 2 cores; does nothing when the binary exists.
#   bash bench/build_llama_server.sh [OUT_DIR]      # default build-bench/llama-server; the binary is OUT_DIR/build/bin/llama-server
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build-bench/llama-server}
PY=${PY:-.venv/bin/python}
VERSION=$(sed -n 's/^llama-cpp-python==//p' scripts/requirements-bench.txt)
[ -x "$OUT/build/bin/llama-server" ] && { echo "llama-server: $OUT/build/bin/llama-server"; exit 0; }
mkdir -p "$OUT"
SRC="$OUT/llama_cpp_python-$VERSION"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT"
  tar -xzf "$OUT/llama_cpp_python-$VERSION.tar.gz" -C "$OUT"
fi
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF "${LAUNCHER[@]}" \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF > /dev/null
cmake --build "$OUT/build" --target llama-server -j"${JOBS:-2}"
echo "llama-server: $OUT/build/bin/llama-server"
