/* tests/gguf_writer.h - a small GGUF writer for the tests: valid files built in memory,
 * which the tests then corrupt, and tiny random-weight Llama models.
 * Included by test programs after ra.h; not part of ./ra. */
#ifndef GGUF_WRITER_H
#define GGUF_WRITER_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint8_t *b; size_t n, cap; } Buf;

static inline void buf_put(Buf *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->b = realloc(w->b, w->cap);
    }
    if (n) memcpy(w->b + w->n, p, n);
    w->n += n;
}
static inline void w_u32(Buf *w, uint32_t v) { buf_put(w, &v, 4); }
static inline void w_u64(Buf *w, uint64_t v) { buf_put(w, &v, 8); }
static inline void w_str(Buf *w, const char *s) { w_u64(w, strlen(s)), buf_put(w, s, strlen(s)); }

/* A GGUF under construction: metadata bytes, tensor-info bytes and tensor data kept apart,
 * joined by gw_finish. */
typedef struct {
    Buf kv, info, data;
    uint64_t n_kv, n_tensors;
    uint32_t version, alignment;
} GW;

static inline void gw_init(GW *g) { memset(g, 0, sizeof *g), g->version = 3, g->alignment = 32; }
static inline void gw_free(GW *g) { free(g->kv.b), free(g->info.b), free(g->data.b); }

static inline void gw_key(GW *g, const char *k, uint32_t type) { w_str(&g->kv, k), w_u32(&g->kv, type), g->n_kv++; }
static inline void gw_u32(GW *g, const char *k, uint32_t v) { gw_key(g, k, GGUF_U32), w_u32(&g->kv, v); }
static inline void gw_f32(GW *g, const char *k, float v) { gw_key(g, k, GGUF_F32), buf_put(&g->kv, &v, 4); }
static inline void gw_bool(GW *g, const char *k, int v) { uint8_t b = (uint8_t)v; gw_key(g, k, GGUF_BOOL), buf_put(&g->kv, &b, 1); }
static inline void gw_string(GW *g, const char *k, const char *v) { gw_key(g, k, GGUF_STRING), w_str(&g->kv, v); }
static inline void gw_arr_header(GW *g, const char *k, uint32_t elem, uint64_t n) {
    gw_key(g, k, GGUF_ARRAY), w_u32(&g->kv, elem), w_u64(&g->kv, n);
}

/* a tensor of type `type`, dims ne[0..n_dims), bytes copied from data */
static inline void gw_tensor(GW *g, const char *name, uint32_t type, int n_dims, const int64_t *ne, const void *data, size_t nbytes) {
    while (g->data.n % g->alignment) buf_put(&g->data, "", 1);
    w_str(&g->info, name);
    w_u32(&g->info, (uint32_t)n_dims);
    for (int d = 0; d < n_dims; d++) w_u64(&g->info, (uint64_t)ne[d]);
    w_u32(&g->info, type);
    w_u64(&g->info, g->data.n);
    buf_put(&g->data, data, nbytes);
    g->n_tensors++;
}

/* the whole file; *size gets its length. Caller frees. */
static inline uint8_t *gw_finish(GW *g, size_t *size) {
    Buf out = {0};
    buf_put(&out, "GGUF", 4);
    w_u32(&out, g->version);
    w_u64(&out, g->n_tensors);
    w_u64(&out, g->n_kv);
    buf_put(&out, g->kv.b, g->kv.n);
    buf_put(&out, g->info.b, g->info.n);
    while (out.n % g->alignment) buf_put(&out, "", 1);
    buf_put(&out, g->data.b, g->data.n);
    *size = out.n;
    return out.b;
}

static inline int write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* ---- tiny Llama-shaped models with random weights ------------------------ */

typedef struct {
    const char *arch;       /* "llama", "qwen2" or "gemma3" */
    int n_layers, dim, n_heads, n_kv_heads, ffn, vocab, ctx;
    uint32_t wtype;         /* GGML_F32 or GGML_F16 for the matrices */
    int tied;               /* no output.weight */
    uint64_t seed;
    int claim_layers, claim_ffn;   /* when non-zero, metadata that disagrees with the tensors */
    const char *chat_template;     /* tokenizer.chat_template, or NULL for none */
    const char *token256;          /* the text of token 256 (a filler otherwise), or NULL */
    float eps, freq_base;          /* when non-zero: these instead of 1e-5 and 10000 */
    float rope_factor;             /* when non-zero: linear RoPE scaling by this factor */
    int no_merges;                 /* no tokenizer.ggml.merges at all (an empty array otherwise) */
    const char *name;              /* general.name, or NULL for "tiny test model" */
    int rope_freqs;                /* 1: rope_freqs.weight = 1, 2, 3, ... (Llama 3.1's divisors); -1: with a 0 */
    /* files the loader must refuse or read a certain way (test_model's test_refused, test_rope_keys) */
    const char *extra_tensor;      /* when set: an F32 tensor [dim] of this name, after the others */
    int no_bias;                   /* qwen2 without its Q, K and V biases */
    int n_tokens;                  /* when non-zero: the tokenizer's count of tokens (the embedding keeps vocab rows) */
    const char *rope_type;         /* with rope_factor: this rope.scaling.type, "" for no type key ("linear" else) */
    float scale_linear;            /* when non-zero: the older key rope.scale_linear */
    int rope_dim;                  /* when non-zero: rope.dimension_count */
    const char *u32_key;           /* general.name, tokenizer.ggml.pre or rope.scaling.type, written as a u32 (7) */
    int nul_model;                 /* tokenizer.ggml.model "gpt2\0junk": a NUL byte inside */
    uint32_t alignment;            /* when non-zero: general.alignment, and the data laid out to it */
    int swa;                       /* gemma3: attention.sliding_window (its four norms are written) */
    float softcap;                 /* when non-zero: final_logit_softcapping (Gemma 2's, refused) */
    int head_dim;                  /* when non-zero: attention.key_length and value_length (else dim / n_heads) */
} TinySpec;

static inline float tiny_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((*s >> 40) / 16777216.0f - 0.5f);
}

static inline void tiny_tensor(GW *g, const char *name, uint32_t type, int64_t cols, int64_t rows, float scale, float bias, uint64_t *rng) {
    int64_t n = cols * rows;
    int64_t ne[2] = {cols, rows};
    if (type != GGML_F32 && type != GGML_F16) {   /* any other type: random blocks */
        int64_t rb = type_row_bytes(type, cols);
        uint8_t *q = malloc((size_t)(rb * rows));
        for (int64_t i = 0; i < rb * rows; i++) q[i] = (uint8_t)(tiny_rand(rng) * 256);
        gw_tensor(g, name, type, rows > 1 ? 2 : 1, ne, q, (size_t)(rb * rows));
        free(q);
    } else if (type == GGML_F16) {
        uint16_t *h = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) h[i] = fp32_to_fp16(bias + scale * tiny_rand(rng));
        gw_tensor(g, name, type, rows > 1 ? 2 : 1, ne, h, (size_t)n * 2);
        free(h);
    } else {
        float *f = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) f[i] = bias + scale * tiny_rand(rng);
        gw_tensor(g, name, GGML_F32, rows > 1 ? 2 : 1, ne, f, (size_t)n * 4);
        free(f);
    }
}

/* A byte-level BPE vocabulary of the 256 byte symbols plus a few merges: enough for the tokenizer
 * to run. Token i < 256 is the GPT-2 unicode symbol of byte i. */
static inline void tiny_vocab(GW *g, int vocab, const char *token256, int no_merges, int pre_u32, int nul_model) {
    static char sym[256][4];
    int n = 0;
    for (int b = 0; b < 256; b++) {   /* GPT-2 bytes_to_unicode */
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
        if (cp < 0x80) sym[b][0] = (char)cp, sym[b][1] = 0;
        else sym[b][0] = (char)(0xC0 | (cp >> 6)), sym[b][1] = (char)(0x80 | (cp & 0x3F)), sym[b][2] = 0;
    }
    if (nul_model) gw_key(g, "tokenizer.ggml.model", GGUF_STRING), w_u64(&g->kv, 9), buf_put(&g->kv, "gpt2\0junk", 9);
    else gw_string(g, "tokenizer.ggml.model", "gpt2");
    if (pre_u32) gw_u32(g, "tokenizer.ggml.pre", 7);
    else gw_string(g, "tokenizer.ggml.pre", "gpt-2");
    gw_arr_header(g, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) {
        char t[32];
        if (i < 256) memcpy(t, sym[i], 4);
        else if (i == 256 && token256) snprintf(t, sizeof t, "%s", token256);
        else if (i == vocab - 1) snprintf(t, sizeof t, "<|endoftext|>");
        else snprintf(t, sizeof t, "<unused%d>", i);
        w_str(&g->kv, t);
    }
    gw_arr_header(g, "tokenizer.ggml.token_type", GGUF_I32, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) w_u32(&g->kv, i == vocab - 1 ? 3u : 1u);
    if (!no_merges) gw_arr_header(g, "tokenizer.ggml.merges", GGUF_STRING, 0);
    gw_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)vocab - 1);
}

static inline uint8_t *tiny_model(const TinySpec *sp, size_t *size) {
    GW g;
    gw_init(&g);
    char key[96], name[96];
    uint64_t rng = sp->seed ? sp->seed : 1;
#define U32_KEY(k) (sp->u32_key && !strcmp(sp->u32_key, k))
    gw_string(&g, "general.architecture", sp->arch);
    if (sp->alignment) gw_u32(&g, "general.alignment", sp->alignment), g.alignment = sp->alignment;
    if (U32_KEY("general.name")) gw_u32(&g, "general.name", 7);
    else gw_string(&g, "general.name", sp->name ? sp->name : "tiny test model");
#define K(s) (snprintf(key, sizeof key, "%s.%s", sp->arch, s), key)
    gw_u32(&g, K("block_count"), (uint32_t)(sp->claim_layers ? sp->claim_layers : sp->n_layers));
    gw_u32(&g, K("context_length"), (uint32_t)sp->ctx);
    gw_u32(&g, K("embedding_length"), (uint32_t)sp->dim);
    gw_u32(&g, K("feed_forward_length"), (uint32_t)(sp->claim_ffn ? sp->claim_ffn : sp->ffn));
    gw_u32(&g, K("attention.head_count"), (uint32_t)sp->n_heads);
    gw_u32(&g, K("attention.head_count_kv"), (uint32_t)sp->n_kv_heads);
    gw_f32(&g, K("attention.layer_norm_rms_epsilon"), sp->eps != 0 ? sp->eps : 1e-5f);
    gw_f32(&g, K("rope.freq_base"), sp->freq_base != 0 ? sp->freq_base : 10000.0f);
    if (sp->rope_factor != 0) {
        const char *type = sp->rope_type ? sp->rope_type : "linear";
        if (U32_KEY("rope.scaling.type")) gw_u32(&g, K("rope.scaling.type"), 7);
        else if (type[0]) gw_string(&g, K("rope.scaling.type"), type);
        gw_f32(&g, K("rope.scaling.factor"), sp->rope_factor);
    }
    if (sp->scale_linear != 0) gw_f32(&g, K("rope.scale_linear"), sp->scale_linear);
    if (sp->rope_dim) gw_u32(&g, K("rope.dimension_count"), (uint32_t)sp->rope_dim);
    if (sp->swa) gw_u32(&g, K("attention.sliding_window"), (uint32_t)sp->swa);
    if (sp->softcap != 0) gw_f32(&g, K("final_logit_softcapping"), sp->softcap);
    if (sp->head_dim) {
        gw_u32(&g, K("attention.key_length"), (uint32_t)sp->head_dim);
        gw_u32(&g, K("attention.value_length"), (uint32_t)sp->head_dim);
    }
#undef K
    tiny_vocab(&g, sp->n_tokens ? sp->n_tokens : sp->vocab, sp->token256, sp->no_merges, U32_KEY("tokenizer.ggml.pre"),
               sp->nul_model);
#undef U32_KEY
    if (sp->chat_template) gw_string(&g, "tokenizer.chat_template", sp->chat_template);
    int hd = sp->head_dim ? sp->head_dim : sp->dim / sp->n_heads;
    int64_t qd = (int64_t)sp->n_heads * hd, kvd = (int64_t)sp->n_kv_heads * hd;
    float ws = 2.0f / sqrtf((float)sp->dim);
    tiny_tensor(&g, "token_embd.weight", sp->wtype, sp->dim, sp->vocab, 1.0f, 0, &rng);
    tiny_tensor(&g, "output_norm.weight", GGML_F32, sp->dim, 1, 0.2f, 1.0f, &rng);
    if (!sp->tied) tiny_tensor(&g, "output.weight", sp->wtype, sp->dim, sp->vocab, ws, 0, &rng);
    if (sp->rope_freqs) {
        float fr[512];
        int64_t ne[1] = {hd / 2};
        for (int i = 0; i < hd / 2 && i < 512; i++) fr[i] = sp->rope_freqs < 0 && i == 1 ? 0 : 1.0f + i;
        gw_tensor(&g, "rope_freqs.weight", GGML_F32, 1, ne, fr, (size_t)(hd / 2) * sizeof(float));
    }
    for (int l = 0; l < sp->n_layers; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        tiny_tensor(&g, N("attn_norm.weight"), GGML_F32, sp->dim, 1, 0.2f, 1.0f, &rng);
        tiny_tensor(&g, N("attn_q.weight"), sp->wtype, sp->dim, qd, ws, 0, &rng);
        tiny_tensor(&g, N("attn_k.weight"), sp->wtype, sp->dim, kvd, ws, 0, &rng);
        tiny_tensor(&g, N("attn_v.weight"), sp->wtype, sp->dim, kvd, ws, 0, &rng);
        if (!strcmp(sp->arch, "qwen2") && !sp->no_bias) {
            tiny_tensor(&g, N("attn_q.bias"), GGML_F32, qd, 1, 0.1f, 0, &rng);
            tiny_tensor(&g, N("attn_k.bias"), GGML_F32, kvd, 1, 0.1f, 0, &rng);
            tiny_tensor(&g, N("attn_v.bias"), GGML_F32, kvd, 1, 0.1f, 0, &rng);
        }
        tiny_tensor(&g, N("attn_output.weight"), sp->wtype, qd, sp->dim, ws, 0, &rng);
        tiny_tensor(&g, N("ffn_norm.weight"), GGML_F32, sp->dim, 1, 0.2f, 1.0f, &rng);
        tiny_tensor(&g, N("ffn_gate.weight"), sp->wtype, sp->dim, sp->ffn, ws, 0, &rng);
        tiny_tensor(&g, N("ffn_up.weight"), sp->wtype, sp->dim, sp->ffn, ws, 0, &rng);
        tiny_tensor(&g, N("ffn_down.weight"), sp->wtype, sp->ffn, sp->dim, 2.0f / sqrtf((float)sp->ffn), 0, &rng);
        if (!strcmp(sp->arch, "gemma3")) {
            tiny_tensor(&g, N("attn_q_norm.weight"), GGML_F32, hd, 1, 0.2f, 1.0f, &rng);
            tiny_tensor(&g, N("attn_k_norm.weight"), GGML_F32, hd, 1, 0.2f, 1.0f, &rng);
            tiny_tensor(&g, N("post_attention_norm.weight"), GGML_F32, sp->dim, 1, 0.2f, 1.0f, &rng);
            tiny_tensor(&g, N("post_ffw_norm.weight"), GGML_F32, sp->dim, 1, 0.2f, 1.0f, &rng);
        }
#undef N
    }
    if (sp->extra_tensor) tiny_tensor(&g, sp->extra_tensor, GGML_F32, sp->dim, 1, 0.1f, 1.0f, &rng);
    uint8_t *out = gw_finish(&g, size);
    gw_free(&g);
    return out;
}

/* Tiny models of the architectures users bring, each checked against llama.cpp's logits by
 * test_model (tests/data/logits_tiny.txt, made by tests/ref/make_ref.py --only tiny from the
 * files tests/bin/gen_fixtures writes). F32 weights, so that llama.cpp's matrix products keep
 * float activations, as ra's do (with quantized weights llama.cpp rounds them to 8 bits). */
typedef struct {
    const char *file;       /* the name gen_fixtures writes and logits_tiny.txt names */
    const char *what;       /* the features it carries */
    TinySpec spec;
} TinyRef;

static const TinyRef TINY_REFS[] = {
    {"ref_llama31.gguf", "Llama 3.1: GQA 4/2, RoPE base 5e5 with rope_freqs divisors, an output matrix",
     {.arch = "llama", .n_layers = 2, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .seed = 11, .freq_base = 5e5f, .rope_freqs = 1}},
    {"ref_qwen2.gguf", "Qwen2: q/k/v biases, NeoX RoPE, base 1e6, eps 1e-6, tied output",
     {.arch = "qwen2", .n_layers = 2, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .tied = 1, .seed = 12, .eps = 1e-6f, .freq_base = 1e6f}},
    {"ref_hd128.gguf", "head dim 128 (Llama 3 8B's), two query heads on one KV head",
     {.arch = "llama", .n_layers = 1, .dim = 256, .n_heads = 2, .n_kv_heads = 1, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .seed = 13, .freq_base = 5e5f}},
    {"ref_linear.gguf", "Llama 2: no GQA (4/4), linear RoPE scaling by 4, tied output",
     {.arch = "llama", .n_layers = 2, .dim = 64, .n_heads = 4, .n_kv_heads = 4, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .tied = 1, .seed = 14, .rope_factor = 4}},
    {"ref_gemma3.gguf", "Gemma 3: a window of 8 keys on layers 0-4 and 6, global layer 5, q/k and post norms, GELU",
     {.arch = "gemma3", .n_layers = 7, .dim = 64, .n_heads = 4, .n_kv_heads = 1, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .tied = 1, .seed = 15, .eps = 1e-6f, .freq_base = 1e6f, .swa = 8}},
    {"ref_gemma3_62.gguf", "Gemma 3 with 62 layers (27B's count): queries scaled to 1/sqrt(dim/heads), head dim 32 not 16",
     {.arch = "gemma3", .n_layers = 62, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .ffn = 32, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .tied = 1, .seed = 16, .eps = 1e-6f, .freq_base = 1e6f, .swa = 8, .head_dim = 32}},
    {"ref_gemma3_rope8.gguf", "Gemma 3 with linear RoPE scaling by 8 (4B-27B's): the global layer's alone",
     {.arch = "gemma3", .n_layers = 7, .dim = 64, .n_heads = 4, .n_kv_heads = 1, .ffn = 96, .vocab = 300, .ctx = 256,
      .wtype = GGML_F32, .tied = 1, .seed = 17, .eps = 1e-6f, .freq_base = 1e6f, .swa = 8, .rope_factor = 8}},
};
#define N_TINY_REFS ((int)(sizeof TINY_REFS / sizeof TINY_REFS[0]))

#endif
