/* tests/fuzz_seeds.c - writes the fuzzers' seed corpus: small valid inputs to start from.
 *   DIR/gguf/  tiny models (llama and qwen2; F32, F16 and quantized weights), and metadata-only
 *              files with a SentencePiece and a merge-based BPE vocabulary and every value type
 *   DIR/tok/   the texts of llama.cpp's tokenizer tests (each .inp file given, split at its
 *              separator), one input per text and vocabulary: first byte = vocabulary and flags
 * usage: fuzz_seeds DIR [VOCAB.inp ...] */
#define TESTING
#include "../model.c"
#include "../ra.c"
#include "gguf_writer.h"

static char dir[512];

static void put(const char *sub, const char *name, const void *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    if (write_file(path, b, n)) fprintf(stderr, "fuzz_seeds: cannot write %s\n", path), exit(1);
}

static void put_model(const char *name, TinySpec sp) {
    size_t n;
    uint8_t *b = tiny_model(&sp, &n);
    put("gguf", name, b, n);
    free(b);
}

/* a SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, and a few pieces with scores */
static void put_spm(void) {
    static const char *pieces[] = {"\xe2\x96\x81", "\xe2\x96\x81" "the", "\xe2\x96\x81" "a", "he", "ll", "o", "\xe2\x96\x81" "h", "e", "l"};
    int np = sizeof pieces / sizeof pieces[0], n = 3 + 256 + np;
    GW g;
    gw_init(&g);
    gw_string(&g, "general.architecture", "llama");
    gw_string(&g, "tokenizer.ggml.model", "llama");
    gw_arr_header(&g, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)n);
    w_str(&g.kv, "<unk>"), w_str(&g.kv, "<s>"), w_str(&g.kv, "</s>");
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        w_str(&g.kv, t);
    }
    for (int i = 0; i < np; i++) w_str(&g.kv, pieces[i]);
    gw_arr_header(&g, "tokenizer.ggml.scores", GGUF_F32, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        float s = i < 259 ? 0.0f : -(float)(i - 259);
        buf_put(&g.kv, &s, 4);
    }
    gw_arr_header(&g, "tokenizer.ggml.token_type", GGUF_I32, (uint64_t)n);
    for (int i = 0; i < n; i++) w_u32(&g.kv, i == 0 ? 2u : i < 3 ? 3u : i < 259 ? 6u : 1u);
    gw_u32(&g, "tokenizer.ggml.bos_token_id", 1);
    gw_u32(&g, "tokenizer.ggml.eos_token_id", 2);
    gw_u32(&g, "tokenizer.ggml.unknown_token_id", 0);
    gw_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    size_t sz;
    uint8_t *b = gw_finish(&g, &sz);
    put("gguf", "spm_vocab.gguf", b, sz);
    free(b);
    gw_free(&g);
}

/* a byte-level BPE vocabulary with merges, under a given pre-tokenizer name */
static void put_bpe(const char *pre) {
    static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 t", "\xc4\xa0t h", "\xc4\xa0th e"};
    static const char *extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0t", "\xc4\xa0th", "\xc4\xa0the", "<|endoftext|>", "<|im_start|>"};
    int nm = sizeof merges / sizeof merges[0], ne = sizeof extra / sizeof extra[0];
    GW g;
    gw_init(&g);
    gw_string(&g, "general.architecture", "llama");
    gw_string(&g, "tokenizer.ggml.model", "gpt2");
    gw_string(&g, "tokenizer.ggml.pre", pre);
    gw_arr_header(&g, "tokenizer.ggml.tokens", GGUF_STRING, 256 + (uint64_t)ne);
    int k = 0;
    for (int b = 0; b < 256; b++) {   /* GPT-2 bytes_to_unicode */
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k++;
        char t[4] = {0};
        if (cp < 0x80) t[0] = (char)cp;
        else t[0] = (char)(0xC0 | (cp >> 6)), t[1] = (char)(0x80 | (cp & 0x3F));
        w_str(&g.kv, t);
    }
    for (int i = 0; i < ne; i++) w_str(&g.kv, extra[i]);
    gw_arr_header(&g, "tokenizer.ggml.token_type", GGUF_I32, 256 + (uint64_t)ne);
    for (int i = 0; i < 256 + ne; i++) w_u32(&g.kv, i >= 256 + ne - 2 ? 3u : 1u);
    gw_arr_header(&g, "tokenizer.ggml.merges", GGUF_STRING, (uint64_t)nm);
    for (int i = 0; i < nm; i++) w_str(&g.kv, merges[i]);
    gw_u32(&g, "tokenizer.ggml.eos_token_id", 256 + ne - 2);
    size_t sz;
    uint8_t *b = gw_finish(&g, &sz);
    char name[64];
    snprintf(name, sizeof name, "bpe_%s.gguf", pre);
    put("gguf", name, b, sz);
    free(b);
    gw_free(&g);
}

/* one value of every type, arrays included, and tensors of two types */
static void put_all_types(void) {
    GW g;
    gw_init(&g);
    uint8_t u8 = 7;
    uint16_t u16 = 300;
    uint64_t u64 = 1ull << 40;
    double f64 = 2.5;
    gw_key(&g, "k.u8", GGUF_U8), buf_put(&g.kv, &u8, 1);
    gw_key(&g, "k.u16", GGUF_U16), buf_put(&g.kv, &u16, 2);
    gw_u32(&g, "k.u32", 70000);
    gw_key(&g, "k.u64", GGUF_U64), buf_put(&g.kv, &u64, 8);
    gw_key(&g, "k.f64", GGUF_F64), buf_put(&g.kv, &f64, 8);
    gw_f32(&g, "k.f32", 1.5f);
    gw_bool(&g, "k.bool", 1);
    gw_string(&g, "k.str", "text");
    gw_arr_header(&g, "k.arr", GGUF_I32, 3);
    for (int i = 0; i < 3; i++) w_u32(&g.kv, (uint32_t)i);
    gw_arr_header(&g, "k.strs", GGUF_STRING, 2);
    w_str(&g.kv, "a"), w_str(&g.kv, "bc");
    float f[32] = {1};
    int64_t ne[2] = {32, 1};
    gw_tensor(&g, "t.f32", GGML_F32, 1, ne, f, sizeof f);
    uint8_t q8[34] = {0};
    gw_tensor(&g, "t.q8", GGML_Q8_0, 1, ne, q8, sizeof q8);
    size_t sz;
    uint8_t *b = gw_finish(&g, &sz);
    put("gguf", "all_types.gguf", b, sz);
    free(b);
    gw_free(&g);
}

/* llama.cpp's .inp test files: texts separated by "\n__ggml_vocab_test__\n" */
static void put_texts(const char *inp, int file_no) {
    FILE *f = fopen(inp, "rb");
    if (!f) fprintf(stderr, "fuzz_seeds: cannot open %s\n", inp), exit(1);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *sep = "\n__ggml_vocab_test__\n", *p = buf;
    for (int i = 0; *p; i++) {
        const char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        uint8_t *in = malloc(len + 1);
        in[0] = (uint8_t)(file_no * 3 + i);   /* vocabulary and flags vary over the texts */
        memcpy(in + 1, p, len);
        char name[64];
        snprintf(name, sizeof name, "text_%d_%d", file_no, i);
        put("tok", name, in, len + 1);
        free(in);
        if (!e) break;
        p = e + strlen(sep);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: fuzz_seeds DIR [VOCAB.inp ...]\n"), 2;
    snprintf(dir, sizeof dir, "%s", argv[1]);
    char sub[600];
    mkdir(dir, 0777);
    snprintf(sub, sizeof sub, "%s/gguf", dir), mkdir(sub, 0777);
    snprintf(sub, sizeof sub, "%s/tok", dir), mkdir(sub, 0777);
    TinySpec base = {.arch = "llama", .n_layers = 1, .dim = 32, .n_heads = 2, .n_kv_heads = 1, .ffn = 64, .vocab = 260,
        .ctx = 64, .wtype = GGML_F16, .tied = 1, .seed = 3}, sp;
    put_model("llama_f16.gguf", base);
    sp = base, sp.wtype = GGML_F32, sp.tied = 0, sp.n_layers = 2, put_model("llama_f32.gguf", sp);
    sp = base, sp.arch = "qwen2", sp.wtype = GGML_Q8_0, put_model("qwen2_q8_0.gguf", sp);
    sp = base, sp.wtype = GGML_Q4_0, put_model("llama_q4_0.gguf", sp);
    sp = base, sp.wtype = GGML_Q4_1, put_model("llama_q4_1.gguf", sp);
    sp = base, sp.wtype = GGML_Q5_1, put_model("llama_q5_1.gguf", sp);
    put_spm();
    put_bpe("llama-bpe"), put_bpe("qwen2"), put_bpe("smollm"), put_bpe("gpt-2");
    put_all_types();
    for (int i = 2; i < argc; i++) put_texts(argv[i], i - 2);
    return 0;
}
