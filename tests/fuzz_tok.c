/* tests/fuzz_tok.c - libFuzzer target: tokenizer encode and decode on arbitrary bytes.
 *
 * The tokenizers are those of real vocabularies: the default model's (SmolLM2, byte-level BPE)
 * and llama.cpp's test vocabularies that make test fetches (SentencePiece and several BPE
 * pre-tokenizers), whichever are present. The first byte of an input picks the vocabulary and
 * the flags; the rest is the text. Checked besides memory safety: every id is in the
 * vocabulary, the count is exact when the output buffer is too small, and for byte-level BPE
 * without special-token parsing, decoding the ids gives back exactly the bytes of a valid UTF-8
 * text whose bytes all have tokens. */
#define TESTING
#include "../model.c"
#include "../ra.c"

static const char *vocab_paths[] = {
    "data/SmolLM2-135M-Instruct.Q4_1.gguf",
    "tests/data/vocab/ggml-vocab-llama-spm.gguf",
    "tests/data/vocab/ggml-vocab-llama-bpe.gguf",
    "tests/data/vocab/ggml-vocab-qwen2.gguf",
    "tests/data/vocab/ggml-vocab-gpt-2.gguf",
    "tests/data/vocab/ggml-vocab-falcon.gguf",
    "tests/data/vocab/ggml-vocab-command-r.gguf",
    "tests/data/vocab/ggml-vocab-phi-3.gguf",
};
enum { MAX_VOCABS = sizeof vocab_paths / sizeof vocab_paths[0] };
static Tokenizer toks[MAX_VOCABS];
static int n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[ERR_LEN];
    for (int i = 0; i < MAX_VOCABS; i++) {
        GGUF g;
        if (build_gguf(&g, vocab_paths[i], err)) continue;   /* not fetched: fuzz the others */
        if (build_tokenizer_from_gguf(&toks[n_toks], &g, err) == 0) n_toks++;
        else fprintf(stderr, "fuzz_tok: %s\n", err);
        free_gguf(&g);   /* the tokenizer keeps its own copies */
    }
    if (!n_toks) {
        fprintf(stderr, "fuzz_tok: no vocabulary found (run from the repository root after make test)\n");
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 16) return 0;
    const Tokenizer *t = &toks[data[0] % n_toks];
    int add_special = data[0] >> 4 & 1, parse_special = data[0] >> 5 & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int cap = (int)len / 2 + 1;   /* often too small: the count is still exact, only cap are written */
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = tokenizer_encode(t, text, len, add_special, parse_special, ids, cap);
    if (n > cap) {   /* again with room for all: the same count */
        free(ids);
        ids = malloc((size_t)n * sizeof *ids);
        if (tokenizer_encode(t, text, len, add_special, parse_special, ids, n) != n) abort();
    }
    size_t outcap = (size_t)(n > 0 ? n : 0) * 64 + 16, o = 0;
    char *out = malloc(outcap);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) abort();
        char small[3];
        tokenizer_decode_piece(t, ids[i], 1, small, sizeof small);   /* a buffer too small: truncated */
        int k = tokenizer_decode_piece(t, ids[i], 0, out + o, (int)(outcap - o));
        if (k > 0 && o + (size_t)k <= outcap) o += (size_t)k;
    }
    /* byte-level BPE is lossless where the vocabulary has a token for each byte of the text (a
     * byte without one is dropped, as llama.cpp drops it): a valid UTF-8 text comes back byte
     * for byte */
    int all_bytes = 1;
    for (size_t i = 0; i < len; i++) all_bytes &= t->byte_tok[(unsigned char)text[i]] < t->n_vocab;
    if (t->kind == TOK_BPE && all_bytes && !add_special && !parse_special && n >= 0 &&
        utf8_valid((const unsigned char *)text, len) && (o != len || memcmp(out, text, len) != 0)) {
        fprintf(stderr, "fuzz_tok: BPE round trip lost bytes (%zu in, %zu out)\n", len, o);
        abort();
    }
    free(out);
    free(ids);
    return 0;
}

#ifdef FUZZ_STANDALONE
#include "fuzz_main.h"
#endif
