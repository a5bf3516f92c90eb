#!/usr/bin/env bash
# Runs what pack.sh packed, on a machine without qkv's build tools: the CPU probe, every C++ test binary (8 at a
# time), the CPU-probe test under each QKV_ISA, the AMX tile tests oversubscribed (4 threads on 2 cores), then
# the low-precision benchmarks pinned to two physical cores: lowp_bench, bench/lowp_torch_bench.py and, where
# openvino.tar.xz was packed and torch, transformers and sentence-transformers are installed, bench/minilm_bench.py
# on MiniLM's shapes with random weights (speeds only). Run from the source tree's root:
#
#   [PY=python3] [RESULTS=out/prebuilt-results] PACK_DIR/run.sh
#
# RESULTS gets run.log, test_logs.tgz and the benchmarks' JSON. Needs the Python peers only for the last two steps.
set -u
PACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" SRC="$PWD" PY="${PY:-python3}"
RESULTS="${RESULTS:-$SRC/out/prebuilt-results}" D="$(mktemp -d)"
mkdir -p "$RESULTS" "$D/logs" && tar -C "$D" -xJf "$PACK/qkv-prebuilt.tar.xz" || exit 1
exec > >(tee "$RESULTS/run.log") 2>&1
export LD_LIBRARY_PATH="$D/lib:$D/libcxx"  # qkv's binaries; Python below gets $D/lib only
T0=$(date +%s)
el() { echo "[t+$(($(date +%s) - T0))s]"; }

echo "== cpu $(el)"
lscpu | grep -E "Model name|CPU family|^Model:|Thread|Core\(s\)|Socket|L2|L3|NUMA node0|Hypervisor"
grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16|avx512_vnni|avx_vnni|avx512f|avx512_fp16' /proc/cpuinfo | sort | uniq -c
# Two CPUs on distinct physical cores (not CPU 0) for the two-thread runs.
PAIR=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | sed -n '2p;3p' | paste -sd,)
[ -n "$PAIR" ] || PAIR=0,1
echo "two-core runs pinned to CPUs $PAIR"
"$D/bin/qkv" info

echo "== every C++ test binary, 8 at a time, OMP_NUM_THREADS=2 $(el)"
ls "$D"/bin/*_test | xargs -P 8 -I{} bash -c 'n=$(basename {}); s=$(date +%s%N);
  OMP_NUM_THREADS=2 timeout 300 {} > '"$D"'/logs/$n.log 2>&1; rc=$?
  echo "$n rc $rc $(( ($(date +%s%N) - s) / 1000000 ))ms $(grep -h -o "\[  PASSED  \] [0-9]* tests\?" '"$D"'/logs/$n.log)"' |
  sort > "$D/logs/summary.txt"
cat "$D/logs/summary.txt"
echo "binaries failing: $(grep -vc ' rc 0 ' "$D/logs/summary.txt") of $(wc -l < "$D/logs/summary.txt")"
grep -h "^\[  FAILED  \]\|^\[ paths    \]\|^\[ cpu\|^\[ QKV_ISA" "$D"/logs/*.log | sort -u | head -80

echo "== CpuProbe.DispatchersFollowQkvIsa under each QKV_ISA $(el)"
for isa in portable avx2 avx2vnni avx512 avx512vnni avx512bf16 amx bogus; do
  QKV_ISA=$isa OMP_NUM_THREADS=2 "$D/bin/kernels_isa_test" --gtest_filter=CpuProbe.DispatchersFollowQkvIsa \
    > "$D/logs/isa_$isa.log" 2>&1
  echo "QKV_ISA=$isa rc $? $(grep -h -o '\[  PASSED  \].*\|\[  FAILED  \].*\|\[ QKV_ISA  \].*' \
    "$D/logs/isa_$isa.log" | head -3 | paste -sd' ')"
done

echo "== the tile tests oversubscribed: 4 threads on CPUs $PAIR $(el)"
taskset -c "$PAIR" env OMP_NUM_THREADS=4 "$D/bin/precision_fronts_test" \
  --gtest_filter='PrecisionFronts.AmxAttentionKeepsItsBitsOversubscribed' --gtest_repeat=40 > "$D/logs/oversub.log" 2>&1
echo "attention x40 rc $? $(grep -c '^\[       OK \]' "$D/logs/oversub.log") ok; $(grep -m1 'paths' "$D/logs/oversub.log")"
for t in precision_test precision_fronts_test bf16_training_test attention_flash_isa_test; do
  taskset -c "$PAIR" env OMP_NUM_THREADS=4 timeout 200 "$D/bin/$t" > "$D/logs/oversub_$t.log" 2>&1
  echo "$t, OMP 4 threads on 2 CPUs: rc $? $(grep -h -o '\[  PASSED  \] [0-9]* tests' "$D/logs/oversub_$t.log")"
done
(cd "$D/logs" && tar czf "$RESULTS/test_logs.tgz" ./*.log summary.txt)

echo "== lowp_bench, 2 threads on CPUs $PAIR $(el)"
taskset -c "$PAIR" env OMP_NUM_THREADS=2 timeout 240 "$D/bin/lowp_bench" --repeats 5 --json "$RESULTS/lowp.json"
echo "rc $?"
echo "== lowp_torch_bench, 2 threads on CPUs $PAIR $(el)"
taskset -c "$PAIR" env LD_LIBRARY_PATH="$D/lib" OMP_NUM_THREADS=2 PYTHONPATH="$D/python" PYTHONUNBUFFERED=1 \
  timeout 240 "$PY" bench/lowp_torch_bench.py --repeats 5 --json "$RESULTS/lowp_torch.json"
echo "rc $? $(el)"

[ -f "$PACK/openvino.tar.xz" ] || { echo "no openvino.tar.xz packed: MiniLM skipped"; exit 0; }
echo "== MiniLM's shapes, random weights: qkv fp32/bf16/int8, sentence-transformers fp32/bf16, OpenVINO $(el)"
mkdir -p "$D/site" && tar -C "$D/site" -xJf "$PACK/openvino.tar.xz"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cp -r "$PACK/minilm" "$D/minilm" && LD_LIBRARY_PATH= "$PY" "$PACK/random_minilm.py" "$D/minilm" 2>&1 | tail -1
taskset -c "$PAIR" env LD_LIBRARY_PATH="$D/lib" OMP_NUM_THREADS=2 PYTHONPATH="$D/site:$D/python" PYTHONUNBUFFERED=1 \
  timeout 300 "$PY" bench/minilm_bench.py --model "$D/minilm" --repeats 5 --json "$RESULTS/minilm.json" \
  --sides qkv,qkv-bf16,qkv-int8,torch,torch-bf16,openvino 2>&1 | grep -v "Loading weights"
echo "rc ${PIPESTATUS[0]} $(el)"
