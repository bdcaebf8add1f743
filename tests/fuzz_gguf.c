/* tests/fuzz_gguf.c - libFuzzer target: a model file made of arbitrary bytes.
 *
 * Each input goes through what `./ra -m FILE` does with a file: the GGUF reader (header,
 * metadata, tensor infos), every metadata value through the typed getters, the tokenizer built
 * from the metadata (then used on a fixed text), and the model loader (shapes, weights); when
 * that succeeds and the model is small, a forward pass over a few tokens. Any crash, leak,
 * hang or sanitizer report is a bug.
 *
 *   make fuzz                  both targets, FUZZ_TIME seconds each (tests/fuzz.sh)
 *   make test                  replays tests/fuzz/gguf/ (kept inputs) and the seed corpus with
 *                              the standalone driver (tests/fuzz_main.h), no libFuzzer needed */
#define TESTING
#include "../model.c"
#include "../ra.c"

/* a tokenizer from the metadata, used as ./ra uses it: encode a fixed text, decode every id */
static void exercise_tokenizer(const Tokenizer *t) {
    static const char text[] = "Hello world! <|im_start|>user\n  caf\xc3\xa9 12345 \xe4\xbd\xa0\xe5\xa5\xbd <s></s>";
    int32_t ids[256];
    for (int special = 0; special < 2; special++) {
        int n = tokenizer_encode(t, text, sizeof text - 1, special, special, ids, 256);
        for (int i = 0; i < n && i < 256; i++) {
            if (ids[i] < 0 || ids[i] >= t->n_vocab) abort();   /* an id outside the vocabulary */
            char buf[64];
            tokenizer_decode_piece(t, ids[i], special, buf, sizeof buf);
            tokenizer_is_eog(t, ids[i]);
        }
    }
}

/* a forward pass over a few tokens, for models small enough to run in a moment */
static void exercise_forward(const Model *m) {
    const Config *c = &m->c;
    double params = (double)c->n_layers * ((double)c->dim * c->ffn_dim * 3 + (double)c->dim * c->dim * 4) +
                    (double)c->vocab_size * c->dim;
    if (params > 4e6 || c->n_heads * c->head_dim > 4096 || m->tok.n_vocab < 1) return;
    State s;
    char err[ERR_LEN];
    if (build_state(&s, m, 8, 4, 0, NULL, err)) return;
    int32_t tokens[3] = {0, m->tok.n_vocab / 2, m->tok.n_vocab - 1};
    float *logits = forward(m, &s, tokens, 3);
    if (logits) logits = forward(m, &s, tokens, 1);   /* and one decoding step */
    free_state(&s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[ERR_LEN];
    Model m;
    memset(&m, 0, sizeof m);
    if (build_gguf_from_memory(&m.gguf, data, size, "fuzz.gguf", err)) return 0;
    for (uint64_t i = 0; i < m.gguf.n_kv; i++) {   /* every value through every getter */
        const GGUFKV *kv = &m.gguf.kv[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 255 ? kv->key.len : 255), kv->key.s);
        int64_t iv;
        float fv;
        Str sv;
        int bv;
        gguf_get_int(&m.gguf, key, &iv), gguf_get_float(&m.gguf, key, &fv);
        gguf_get_str(&m.gguf, key, &sv), gguf_get_bool(&m.gguf, key, &bv);
    }
    Tokenizer tok;
    if (build_tokenizer_from_gguf(&tok, &m.gguf, err) == 0) {
        exercise_tokenizer(&tok);
        free_tokenizer(&tok);
    }
    if (load_config(&m, err) == 0 && load_weights(&m, err) == 0 && load_tokenizer(&m, err) == 0) exercise_forward(&m);
    free_model(&m);   /* a GGUF in the caller's memory is not unmapped */
    return 0;
}

#ifdef FUZZ_STANDALONE
#include "fuzz_main.h"
#endif
