/* tests/gen_fixtures.c - writes the model files the bad-input table uses into a folder:
 *   tiny.gguf        a valid tiny llama model (random weights, byte-level vocabulary)
 *   arch.gguf        architecture "falcon"
 *   iq2xxs.gguf      weights of type IQ2_XXS (not supported: a grid type)
 *   shape.gguf       feed_forward_length disagrees with the tensors
 *   truncated.gguf   tiny.gguf cut in the middle of its tensor data
 *   notgguf.gguf     bytes that are not a GGUF file
 *   mistral.gguf     tiny.gguf with a chat template llama.cpp reads as mistral-v3
 *   zephyr.gguf      tiny.gguf with a chat template llama.cpp reads as zephyr (ra does not write it)
 *   imstart.gguf     tiny.gguf without a chat template, with a token "<|im_start|>" (ChatML's)
 *   eps.gguf         an RMS-norm epsilon of inf
 *   base.gguf        a RoPE base of -1
 *   factor.gguf      linear RoPE scaling by a factor of inf
 *   ctx.gguf         a context length of 2^32 - 1
 *   blocks.gguf      block_count 1 over tensors of 2 blocks
 *   nomerges.gguf    a gpt2 tokenizer without tokenizer.ggml.merges
 *   archnl.gguf      an architecture name with a newline in it
 *   namenl.gguf      tiny.gguf named "tiny\nmodel" (general.name)
 *   ref_*.gguf       the tiny models test_model checks against llama.cpp (TINY_REFS)
 * usage: gen_fixtures DIR */
#define TESTING
#include "../model.c"
#include "../ra.c"
#include "gguf_writer.h"

static void put(const char *dir, const char *name, TinySpec sp, size_t cut) {
    char path[512];
    size_t n;
    uint8_t *b = tiny_model(&sp, &n);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (write_file(path, b, cut ? cut : n)) fprintf(stderr, "gen_fixtures: cannot write %s\n", path), exit(1);
    free(b);
}

int main(int argc, char **argv) {
    if (argc != 2) return fprintf(stderr, "usage: gen_fixtures DIR\n"), 2;
    TinySpec ok = {.arch = "llama", .n_layers = 2, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .ffn = 96, .vocab = 300,
        .ctx = 256, .wtype = GGML_F32, .seed = 7}, sp;
    put(argv[1], "tiny.gguf", ok, 0);
    sp = ok, sp.arch = "falcon", put(argv[1], "arch.gguf", sp, 0);
    sp = ok, sp.wtype = GGML_IQ2_XXS, sp.dim = 256, sp.ffn = 256, put(argv[1], "iq2xxs.gguf", sp, 0);
    sp = ok, sp.claim_ffn = 128, put(argv[1], "shape.gguf", sp, 0);
    sp = ok, sp.chat_template = "[AVAILABLE_TOOLS]{{ '[INST] ' + message['content'] + '[/INST]' }}";
    put(argv[1], "mistral.gguf", sp, 0);
    sp = ok, sp.chat_template = "{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' }}";
    put(argv[1], "zephyr.gguf", sp, 0);
    sp = ok, sp.token256 = "<|im_start|>", put(argv[1], "imstart.gguf", sp, 0);
    sp = ok, sp.eps = INFINITY, put(argv[1], "eps.gguf", sp, 0);
    sp = ok, sp.freq_base = -1, put(argv[1], "base.gguf", sp, 0);
    sp = ok, sp.rope_factor = INFINITY, put(argv[1], "factor.gguf", sp, 0);
    sp = ok, sp.ctx = -1, put(argv[1], "ctx.gguf", sp, 0);
    sp = ok, sp.claim_layers = 1, put(argv[1], "blocks.gguf", sp, 0);
    sp = ok, sp.no_merges = 1, put(argv[1], "nomerges.gguf", sp, 0);
    sp = ok, sp.arch = "fal\ncon", put(argv[1], "archnl.gguf", sp, 0);
    sp = ok, sp.name = "tiny\nmodel", put(argv[1], "namenl.gguf", sp, 0);
    for (int i = 0; i < N_TINY_REFS; i++) put(argv[1], TINY_REFS[i].file, TINY_REFS[i].spec, 0);
    size_t n;
    free(tiny_model(&ok, &n));
    put(argv[1], "truncated.gguf", ok, n / 2);
    char path[512];
    snprintf(path, sizeof path, "%s/notgguf.gguf", argv[1]);
    write_file(path, "this is not a model, just some text padding it out past 24 bytes\n", 66);
    return 0;
}
