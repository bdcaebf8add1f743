/* tests/gen_model.c - writes a random-weight Llama (or Gemma 3) GGUF of any shape, so ra can be timed at a
 * real model's scale without downloading weights. The file is streamed: the header (metadata,
 * byte-level vocabulary, tensor infos with precomputed offsets) first, then each tensor's data in
 * order, generated in chunks of rows by worker threads and written by the main thread; memory
 * stays at a few MB per thread whatever the model size.
 *
 *   gcc -O2 -march=native -std=gnu11 -Wall -Wextra -pthread tests/gen_model.c -lm -o tests/bin/gen_model
 *   tests/bin/gen_model l8b.gguf --preset llama3-8b          (8.5 GB)
 *   ./ra -m l8b.gguf -p hi -n 2 -c 64
 *
 * Weights: every value is mean + sigma * z, z an approximate N(0, 1) (a sum of four uniform bytes
 * of a counter-based hash), quantized by the reference quantizers of ggml (Q8_0, Q4_0, Q4_1) or
 * rounded (F16, BF16). sigma = 1/sqrt(fan_in) for the projections and 1/sqrt(dim) for the token
 * embedding (so tied logits have unit scale); norm weights are 1 + 0.05 z, F32. The values of a
 * row depend only on the seed, the tensor's name and the row number: the same seed gives the same
 * file for any thread count, and a tensor's values do not depend on the other tensors.
 * The vocabulary is tiny_vocab()'s (tests/gguf_writer.h): the 256 byte tokens, fillers, and
 * <|endoftext|> last as EOS; no merges, so text tokenizes to one token per byte. */
#define TESTING
#include "../model.c"
#include "../ra.c"
#include "gguf_writer.h"
#include <signal.h>
#include <sys/statvfs.h>

/* ---- errors ------------------------------------------------------------------------------ */

static const char *gm_unlink_path;   /* the output while it is partial: removed on failure */

static void gm_die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gen_model: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (gm_unlink_path) unlink(gm_unlink_path);
    exit(code);
}

static void gm_on_signal(int sig) {
    if (gm_unlink_path) unlink(gm_unlink_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- shape -------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int layers, dim, heads, kv_heads, ffn, vocab, ctx;
    float rope_base;
    uint32_t type, embd_type;   /* the projections; token_embd (and output) */
    int untied;                 /* a separate output.weight */
    int head_dim;               /* 0: dim / heads */
    int swa;                    /* gemma3: its sliding window (0: a llama) */
} Preset;

static const Preset PRESETS[] = {
    /* name            layers  dim heads kv   ffn   vocab     ctx  rope base  type       embd type  untied hd swa */
    {"tiny",              2,    64,  4,  2,   128,    512,   2048,     1e4f, GGML_Q8_0, GGML_Q8_0, 0, 0,   0},
    {"smollm2-135m",     30,   576,  9,  3,  1536,  49152,   8192,     1e5f, GGML_Q4_1, GGML_Q8_0, 0, 0,   0},
    {"llama3.2-1b",      16,  2048, 32,  8,  8192, 128256, 131072,     5e5f, GGML_Q8_0, GGML_Q8_0, 0, 0,   0},
    {"llama3.2-3b",      28,  3072, 24,  8,  8192, 128256, 131072,     5e5f, GGML_Q8_0, GGML_Q8_0, 0, 0,   0},
    {"llama2-7b",        32,  4096, 32, 32, 11008,  32000,   4096,     1e4f, GGML_Q8_0, GGML_Q8_0, 1, 0,   0},
    {"llama3-8b",        32,  4096, 32,  8, 14336, 128256, 131072,     5e5f, GGML_Q8_0, GGML_Q8_0, 1, 0,   0},
    /* Gemma 3 270M: head dim 256, five sliding layers (window 512) in six, its four norms, GELU */
    {"gemma3-270m",      18,   640,  4,  1,  2048, 262144,  32768,     1e6f, GGML_Q8_0, GGML_Q8_0, 0, 256, 512},
};
#define N_PRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

static const struct { const char *name; uint32_t type; uint32_t ftype; } TYPES[] = {
    {"Q8_0", GGML_Q8_0, 7}, {"Q4_0", GGML_Q4_0, 2}, {"Q4_1", GGML_Q4_1, 3},
    {"F16", GGML_F16, 1},   {"BF16", GGML_BF16, 32}, {"F32", GGML_F32, 0},
};   /* ftype: llama.cpp's general.file_type */
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

static const char *gm_type_name(uint32_t t) {
    for (int i = 0; i < N_TYPES; i++)
        if (TYPES[i].type == t) return TYPES[i].name;
    return "?";
}

typedef struct {
    Preset p;
    float eps;
    uint64_t seed;
    int threads, quiet, no_check, no_sync;
    int custom;                 /* a shape flag changed the preset */
    const char *out, *name;
} Opts;

static void gm_usage(FILE *f) {
    fprintf(f,
            "usage: gen_model OUT.gguf [--preset NAME] [shape flags] [options]\n"
            "Writes a Llama (or Gemma 3) GGUF with random weights, streamed to disk (memory stays small).\n"
            "  --preset NAME      tiny (default), smollm2-135m, llama3.2-1b, llama3.2-3b, llama2-7b,\n"
            "                     llama3-8b, gemma3-270m; the flags below override its values\n"
            "  --layers N         transformer blocks\n"
            "  --dim N            embedding size\n"
            "  --heads N          query heads (head size = dim / heads, even, unless --head-dim)\n"
            "  --head-dim N       head size (even; gemma3-270m: 256)\n"
            "  --swa N            gemma3: the sliding layers' window (gemma3-270m: 512)\n"
            "  --kv-heads N       key/value heads, dividing heads\n"
            "  --ffn N            feed-forward size\n"
            "  --vocab N          vocabulary (>= 257: 256 byte tokens, fillers, <|endoftext|> last)\n"
            "  --ctx N            trained context length (metadata only)\n"
            "  --rope-base F      RoPE base\n"
            "  --eps F            RMSNorm epsilon (default 1e-5)\n"
            "  --type T           projection weights: Q8_0, Q4_0, Q4_1, F16, BF16, F32\n"
            "  --embd-type T      token_embd / output.weight (default: --type; smollm2-135m: Q8_0)\n"
            "  --untied           a separate output.weight (llama2-7b, llama3-8b)\n"
            "  --tied             output shares token_embd (the other presets)\n"
            "  --seed N           weights seed (default 1); same seed, same file\n"
            "  --name TEXT        general.name (default \"random PRESET\")\n"
            "  --threads N        generator threads (default: all cores, at most 8)\n"
            "  --no-sync          skip the final fsync\n"
            "  --no-check         skip loading the written file with ra's loader\n"
            "  --quiet            no progress\n"
            "  -h, --help         this text\n"
            "presets (layers/dim/heads/kv-heads/ffn/vocab/ctx/rope base/type):\n");
    for (int i = 0; i < N_PRESETS; i++) {
        const Preset *p = &PRESETS[i];
        fprintf(f, "  %-14s %2d/%d/%d/%d/%d/%d/%d/%g/%s%s%s%s", p->name, p->layers, p->dim, p->heads, p->kv_heads,
                p->ffn, p->vocab, p->ctx, p->rope_base, gm_type_name(p->type), p->embd_type != p->type ? " (embd " : "",
                p->embd_type != p->type ? gm_type_name(p->embd_type) : "", p->embd_type != p->type ? ")" : "");
        if (p->swa) fprintf(f, ", gemma3: head size %d, window %d", p->head_dim, p->swa);
        fprintf(f, "\n");
    }
}

static const char *gm_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) gm_die(2, "%s needs a value", argv[*i]);
    return argv[++*i];
}

static long long gm_int(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) gm_die(2, "%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi) gm_die(2, "%s: %lld is out of range [%lld, %lld]", flag, v, lo, hi);
    return v;
}

static float gm_float(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v) gm_die(2, "%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi) gm_die(2, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    return (float)v;
}

static uint32_t gm_type(const char *flag, const char *s) {
    for (int i = 0; i < N_TYPES; i++)
        if (!strcasecmp(s, TYPES[i].name)) return TYPES[i].type;
    gm_die(2, "%s: unknown type '%s' (Q8_0, Q4_0, Q4_1, F16, BF16, F32)", flag, s);
    return 0;
}

static Opts gm_parse(int argc, char **argv) {
    Opts o;
    memset(&o, 0, sizeof o);
    o.p = PRESETS[0];
    o.eps = 1e-5f;
    o.seed = 1;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads = nproc < 1 ? 1 : nproc > 8 ? 8 : (int)nproc;
    /* the preset first, so that the other flags override it wherever they stand */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) gm_usage(stdout), exit(0);
        if (!strcmp(argv[i], "--preset")) {
            const char *v = gm_value(argc, argv, &i);
            int k = 0;
            while (k < N_PRESETS && strcmp(PRESETS[k].name, v)) k++;
            if (k == N_PRESETS)
                gm_die(2, "--preset: unknown preset '%s' (tiny, smollm2-135m, llama3.2-1b, llama3.2-3b, llama2-7b, llama3-8b, "
                       "gemma3-270m)", v);
            o.p = PRESETS[k];
        }
    }
    int embd_set = 0;
    uint32_t embd = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1]) {
            if (o.out) gm_die(2, "more than one output file ('%s', '%s')", o.out, a);
            o.out = a;
        } else if (!strcmp(a, "--preset")) i++;
        else if (!strcmp(a, "--layers")) o.custom = 1, o.p.layers = (int)gm_int(a, gm_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--dim")) o.custom = 1, o.p.dim = (int)gm_int(a, gm_value(argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "--heads")) o.custom = 1, o.p.heads = (int)gm_int(a, gm_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--kv-heads")) o.custom = 1, o.p.kv_heads = (int)gm_int(a, gm_value(argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--head-dim")) o.custom = 1, o.p.head_dim = (int)gm_int(a, gm_value(argc, argv, &i), 2, 1024);
        else if (!strcmp(a, "--swa")) {
            if (!o.p.swa) gm_die(2, "--swa is for the gemma3-270m preset (a llama has no sliding layers)");
            o.custom = 1, o.p.swa = (int)gm_int(a, gm_value(argc, argv, &i), 1, 1 << 24);
        }
        else if (!strcmp(a, "--ffn")) o.custom = 1, o.p.ffn = (int)gm_int(a, gm_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--vocab")) o.custom = 1, o.p.vocab = (int)gm_int(a, gm_value(argc, argv, &i), 257, 1 << 24);
        else if (!strcmp(a, "--ctx")) o.p.ctx = (int)gm_int(a, gm_value(argc, argv, &i), 1, INT32_MAX);
        else if (!strcmp(a, "--rope-base")) o.p.rope_base = gm_float(a, gm_value(argc, argv, &i), 1, 1e9);
        else if (!strcmp(a, "--eps")) o.eps = gm_float(a, gm_value(argc, argv, &i), 1e-12, 1);
        else if (!strcmp(a, "--type")) o.p.type = gm_type(a, gm_value(argc, argv, &i));
        else if (!strcmp(a, "--embd-type")) embd = gm_type(a, gm_value(argc, argv, &i)), embd_set = 1;
        else if (!strcmp(a, "--untied")) o.p.untied = 1;
        else if (!strcmp(a, "--tied")) o.p.untied = 0;
        else if (!strcmp(a, "--seed")) {
            const char *v = gm_value(argc, argv, &i);
            char *end;
            errno = 0;
            o.seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') gm_die(2, "--seed: '%s' is not a non-negative integer", v);
        } else if (!strcmp(a, "--name")) o.name = gm_value(argc, argv, &i);
        else if (!strcmp(a, "--threads")) o.threads = (int)gm_int(a, gm_value(argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--no-sync")) o.no_sync = 1;
        else if (!strcmp(a, "--no-check")) o.no_check = 1;
        else if (!strcmp(a, "--quiet")) o.quiet = 1;
        else gm_die(2, "unknown flag '%s' (gen_model --help lists them)", a);
    }
    if (!o.out) gm_die(2, "no output file (usage: gen_model OUT.gguf [--preset NAME] [flags]; --help for more)");
    /* --type alone sets both, as for the llama3 presets; the smollm2 preset keeps a Q8_0 embedding
       only while --type is not given */
    int type_set = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--type")) type_set = 1;
    if (embd_set) o.p.embd_type = embd;
    else if (type_set) o.p.embd_type = o.p.type;
    const Preset *p = &o.p;
    if (!p->head_dim && p->dim % p->heads) gm_die(2, "--dim %d is not a multiple of --heads %d", p->dim, p->heads);
    int hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    if (hd % 2 || hd > 1024) gm_die(2, "head size %d must be even and <= 1024", hd);
    if (p->kv_heads > p->heads || p->heads % p->kv_heads)
        gm_die(2, "--kv-heads %d does not divide --heads %d", p->kv_heads, p->heads);
    const TypeInfo *ti = type_info(p->type), *te = type_info(p->embd_type);
    if (p->dim % ti->block_elems || p->ffn % ti->block_elems || p->dim % te->block_elems ||
        ((int64_t)p->heads * hd) % ti->block_elems)
        gm_die(2, "type %s needs --dim, --ffn and heads x head size in multiples of %d (dim %d, ffn %d, %d x %d)",
               gm_type_name(p->type), ti->block_elems > te->block_elems ? ti->block_elems : te->block_elems, p->dim,
               p->ffn, p->heads, hd);
    return o;
}

/* ---- tensors ------------------------------------------------------------------------------ */

typedef struct {
    char name[64];
    uint32_t type;
    int64_t cols, rows;         /* ne[0], ne[1] */
    int n_dims;
    float mean, sigma;
    uint32_t name_hash;
    int64_t row_bytes;
    uint64_t offset, nbytes;    /* in the data section */
} TensorSpec;

static uint32_t gm_fnv(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static int gm_tensors(const Preset *p, TensorSpec **out) {
    int n = 2 + p->untied + (p->swa ? 13 : 9) * p->layers, k = 0;
    TensorSpec *t = calloc((size_t)n, sizeof *t);
    if (!t) gm_die(1, "out of memory");
    int hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    int64_t qd = (int64_t)p->heads * hd, kvd = (int64_t)p->kv_heads * hd;
    float sd = 1 / sqrtf((float)p->dim), sf = 1 / sqrtf((float)p->ffn);
#define T(nm, ty, c, r, mu, sg)                                                                          \
    do {                                                                                                 \
        TensorSpec *x = &t[k++];                                                                         \
        snprintf(x->name, sizeof x->name, "%s", nm);                                                     \
        x->type = ty, x->cols = c, x->rows = r, x->n_dims = r > 1 ? 2 : 1, x->mean = mu, x->sigma = sg;  \
    } while (0)
    T("token_embd.weight", p->embd_type, p->dim, p->vocab, 0, sd);
    T("output_norm.weight", GGML_F32, p->dim, 1, 1, 0.05f);
    if (p->untied) T("output.weight", p->embd_type, p->dim, p->vocab, 0, sd);
    for (int l = 0; l < p->layers; l++) {
        char nm[64];
#define B(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
        T(B("attn_norm.weight"), GGML_F32, p->dim, 1, 1, 0.05f);
        T(B("attn_q.weight"), p->type, p->dim, qd, 0, sd);
        T(B("attn_k.weight"), p->type, p->dim, kvd, 0, sd);
        T(B("attn_v.weight"), p->type, p->dim, kvd, 0, sd);
        T(B("attn_output.weight"), p->type, qd, p->dim, 0, 1 / sqrtf((float)qd));
        T(B("ffn_norm.weight"), GGML_F32, p->dim, 1, 1, 0.05f);
        T(B("ffn_gate.weight"), p->type, p->dim, p->ffn, 0, sd);
        T(B("ffn_up.weight"), p->type, p->dim, p->ffn, 0, sd);
        T(B("ffn_down.weight"), p->type, p->ffn, p->dim, 0, sf);
        if (p->swa) {   /* gemma3's norms, stored as llama.cpp's converter writes them (1 + w) */
            T(B("attn_q_norm.weight"), GGML_F32, hd, 1, 1, 0.05f);
            T(B("attn_k_norm.weight"), GGML_F32, hd, 1, 1, 0.05f);
            T(B("post_attention_norm.weight"), GGML_F32, p->dim, 1, 1, 0.05f);
            T(B("post_ffw_norm.weight"), GGML_F32, p->dim, 1, 1, 0.05f);
        }
#undef B
    }
#undef T
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        t[i].name_hash = gm_fnv(t[i].name);
        t[i].row_bytes = type_row_bytes(t[i].type, t[i].cols);
        t[i].nbytes = (uint64_t)t[i].row_bytes * (uint64_t)t[i].rows;
        off = (off + 31) / 32 * 32;
        t[i].offset = off;
        off += t[i].nbytes;
    }
    *out = t;
    return n;
}

/* ---- values: counter-based, so any row can be made alone -------------------------------- */

static inline uint32_t gm_mix32(uint32_t h) {
    h ^= h >> 16, h *= 0x85ebca6bu;
    h ^= h >> 13, h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

static uint32_t gm_row_key(uint64_t seed, uint32_t name_hash, int64_t row) {   /* splitmix64 */
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + ((uint64_t)name_hash << 32 ^ (uint64_t)row);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

/* x[i] = mean + sigma * z_i, z_i = (sum of the 4 bytes of a hash - 510) / 147.8: mean 0, variance 1,
   within +-3.45 (Irwin-Hall of four uniform bytes). 32 at a time, a loop gcc vectorizes at -O2. */
static void gm_values(float *x, int64_t n, uint32_t key, float mean, float sigma) {
    const float s = sigma / 147.80f;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint32_t base = (uint32_t)i * 0x9E3779B9u + key;
        for (int j = 0; j < 32; j++) {
            uint32_t h = gm_mix32(base + (uint32_t)j * 0x9E3779B9u);
            int v = (int)(h & 255) + (int)(h >> 8 & 255) + (int)(h >> 16 & 255) + (int)(h >> 24) - 510;
            x[i + j] = mean + s * (float)v;
        }
    }
    for (; i < n; i++) {
        uint32_t h = gm_mix32((uint32_t)i * 0x9E3779B9u + key);
        int v = (int)(h & 255) + (int)(h >> 8 & 255) + (int)(h >> 16 & 255) + (int)(h >> 24) - 510;
        x[i] = mean + s * (float)v;
    }
}

/* ---- quantizers: ggml's reference ones (quantize_row_*_ref) ------------------------------- */

static inline void gm_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* max |x[j]| of a block, on the bit patterns (the order of non-negative floats), so gcc vectorizes it */
static inline float gm_amax32(const float *x) {
    uint32_t m = 0;
    for (int j = 0; j < 32; j++) {
        uint32_t u;
        memcpy(&u, &x[j], 4);
        u &= 0x7FFFFFFFu;
        m = u > m ? u : m;
    }
    float a;
    memcpy(&a, &m, 4);
    return a;
}

/* min and max of a block, as integers that order like the floats (not NaN): the same, vectorized */
static inline void gm_minmax32(const float *x, float *mn, float *mx) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int j = 0; j < 32; j++) {
        int32_t i;
        memcpy(&i, &x[j], 4);
        i ^= (i >> 31) & 0x7FFFFFFF;
        lo = i < lo ? i : lo, hi = i > hi ? i : hi;
    }
    lo ^= (lo >> 31) & 0x7FFFFFFF, hi ^= (hi >> 31) & 0x7FFFFFFF;
    memcpy(mn, &lo, 4), memcpy(mx, &hi, 4);
}

static void gm_q8_0(const float *x, uint8_t *o, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 34) {
        float d = gm_amax32(x) / 127, id = d ? 1 / d : 0;
        gm_put16(o, fp32_to_fp16(d));
        for (int j = 0; j < 32; j++) {   /* roundf: half away from zero */
            float v = x[j] * id;
            o[2 + j] = (uint8_t)(int8_t)(int)(v + (v < 0 ? -0.5f : 0.5f));
        }
    }
}

static void gm_q4_0(const float *x, uint8_t *o, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 18) {
        float amax = gm_amax32(x), max = 0;   /* the first value of largest magnitude, with its sign */
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        float d = max / -8, id = d ? 1 / d : 0;
        gm_put16(o, fp32_to_fp16(d));
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0, q1 = q1 > 15 ? 15 : q1;
            o[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void gm_q4_1(const float *x, uint8_t *o, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 20) {
        float mn, mx;
        gm_minmax32(x, &mn, &mx);
        float d = (mx - mn) / 15, id = d ? 1 / d : 0;
        gm_put16(o, fp32_to_fp16(d));
        gm_put16(o + 2, fp32_to_fp16(mn));
        for (int j = 0; j < 16; j++) {
            int q0 = (int)((x[j] - mn) * id + 0.5f), q1 = (int)((x[j + 16] - mn) * id + 0.5f);
            q0 = q0 > 15 ? 15 : q0, q1 = q1 > 15 ? 15 : q1;
            o[4 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void gm_quantize(uint32_t type, const float *x, uint8_t *o, int64_t n) {
    switch (type) {
    case GGML_Q8_0: gm_q8_0(x, o, n); break;
    case GGML_Q4_0: gm_q4_0(x, o, n); break;
    case GGML_Q4_1: gm_q4_1(x, o, n); break;
    case GGML_F16:
        for (int64_t i = 0; i < n; i++) gm_put16(o + 2 * i, fp32_to_fp16(x[i]));
        break;
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {   /* round to nearest even; our values are finite */
            uint32_t u;
            memcpy(&u, &x[i], 4);
            gm_put16(o + 2 * i, (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16));
        }
        break;
    default: memcpy(o, x, (size_t)n * 4); break;   /* F32, little-endian */
    }
}

/* ---- the pipeline: workers make chunks of rows in order, the main thread writes them ------ */

typedef struct { int tensor; int64_t r0, r1; } GmJob;

typedef struct {
    const TensorSpec *t;
    const GmJob *jobs;
    int64_t n_jobs, next_job;   /* next_job: the next one a worker claims */
    int n_slots;
    uint8_t **buf;              /* (n_slots) a chunk each */
    int64_t *slot_job;          /* (n_slots) the job a slot holds, -1 = free */
    int *slot_ready;            /* (n_slots) its bytes are made */
    int stop;
    uint64_t seed;
    int64_t max_cols;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Pipe;

static void *gm_worker(void *arg) {
    Pipe *P = arg;
    float *x = malloc((size_t)P->max_cols * sizeof(float));
    if (!x) gm_die(1, "out of memory");
    pthread_mutex_lock(&P->mu);
    while (!P->stop && P->next_job < P->n_jobs) {
        int64_t j = P->next_job;
        int s = (int)(j % P->n_slots);
        if (P->slot_job[s] != -1) {   /* job j - n_slots is not written yet */
            pthread_cond_wait(&P->cv, &P->mu);
            continue;
        }
        P->next_job++;
        P->slot_job[s] = j, P->slot_ready[s] = 0;
        pthread_mutex_unlock(&P->mu);
        const GmJob *jb = &P->jobs[j];
        const TensorSpec *t = &P->t[jb->tensor];
        for (int64_t r = jb->r0; r < jb->r1; r++) {
            gm_values(x, t->cols, gm_row_key(P->seed, t->name_hash, r), t->mean, t->sigma);
            gm_quantize(t->type, x, P->buf[s] + (r - jb->r0) * t->row_bytes, t->cols);
        }
        pthread_mutex_lock(&P->mu);
        P->slot_ready[s] = 1;
        pthread_cond_broadcast(&P->cv);
    }
    pthread_mutex_unlock(&P->mu);
    free(x);
    return NULL;
}

static int gm_write_all(int fd, const void *p, size_t n) {   /* 0, or an errno */
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        b += w, n -= (size_t)w;
    }
    return 0;
}

static void gm_progress(const Opts *o, uint64_t done, uint64_t total, double t0, int final) {
    static double last;
    static int tty = -1;
    if (o->quiet || total < (64u << 20)) return;
    if (tty < 0) tty = isatty(2), last = t0;
    double t = now_s();
    if (!final && t - last < (tty ? 0.5 : 5.0)) return;
    last = t;
    double mb = done / 1e6, rate = mb / (t - t0 > 1e-9 ? t - t0 : 1e-9);
    fprintf(stderr, "%sgen_model: %.0f / %.0f MB (%3.0f%%)  %.0f MB/s  ETA %.0fs   %s", tty ? "\r" : "", mb, total / 1e6,
            100.0 * done / total, rate, rate > 0 ? (total - done) / 1e6 / rate : 0.0, tty && !final ? "" : "\n");
}

static void gm_human(double b, char *s, size_t n) {
    if (b >= 1e9) snprintf(s, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(s, n, "%.1f MB", b / 1e6);
    else snprintf(s, n, "%.0f KB", b / 1e3);
}

int main(int argc, char **argv) {
    Opts o = gm_parse(argc, argv);
    const Preset *p = &o.p;
    TensorSpec *T;
    int nt = gm_tensors(p, &T);
    int hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    const char *arch = p->swa ? "gemma3" : "llama";

    /* header: metadata, vocabulary, tensor infos (offsets precomputed), padded to 32 */
    GW g;
    gw_init(&g);
    char name[128];
    const char *preset_name = o.custom ? arch : p->name;   /* a preset with a changed shape is no longer it */
    snprintf(name, sizeof name, "%s", o.name ? o.name : "");
    if (!o.name) snprintf(name, sizeof name, "random %s", preset_name);
    uint32_t ftype = 0;
    for (int i = 0; i < N_TYPES; i++)
        if (TYPES[i].type == p->type) ftype = TYPES[i].ftype;
    char key[96];
#define K(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    gw_string(&g, "general.architecture", arch);
    gw_string(&g, "general.name", name);
    gw_u32(&g, "general.file_type", ftype);
    gw_u32(&g, "general.quantization_version", 2);
    gw_u32(&g, K("block_count"), (uint32_t)p->layers);
    gw_u32(&g, K("context_length"), (uint32_t)p->ctx);
    gw_u32(&g, K("embedding_length"), (uint32_t)p->dim);
    gw_u32(&g, K("feed_forward_length"), (uint32_t)p->ffn);
    gw_u32(&g, K("attention.head_count"), (uint32_t)p->heads);
    gw_u32(&g, K("attention.head_count_kv"), (uint32_t)p->kv_heads);
    if (p->head_dim) {
        gw_u32(&g, K("attention.key_length"), (uint32_t)hd);
        gw_u32(&g, K("attention.value_length"), (uint32_t)hd);
    }
    if (p->swa) gw_u32(&g, K("attention.sliding_window"), (uint32_t)p->swa);
    gw_f32(&g, K("attention.layer_norm_rms_epsilon"), o.eps);
    gw_f32(&g, K("rope.freq_base"), p->rope_base);
    gw_u32(&g, K("rope.dimension_count"), (uint32_t)hd);
    gw_u32(&g, K("vocab_size"), (uint32_t)p->vocab);
#undef K
    tiny_vocab(&g, p->vocab, NULL, 0, 0, 0);
    for (int i = 0; i < nt; i++) {
        w_str(&g.info, T[i].name);
        w_u32(&g.info, (uint32_t)T[i].n_dims);
        w_u64(&g.info, (uint64_t)T[i].cols);
        if (T[i].n_dims > 1) w_u64(&g.info, (uint64_t)T[i].rows);
        w_u32(&g.info, T[i].type);
        w_u64(&g.info, T[i].offset);
        g.n_tensors++;
    }
    size_t hsize;
    uint8_t *hdr = gw_finish(&g, &hsize);   /* no data added: the header, padded to the alignment */
    gw_free(&g);
    uint64_t data_bytes = T[nt - 1].offset + T[nt - 1].nbytes, total = hsize + data_bytes, params = 0;
    for (int i = 0; i < nt; i++) params += (uint64_t)(T[i].cols * T[i].rows);

    /* jobs: chunks of whole rows of about 4 MB */
    int64_t n_jobs = 0, max_cols = 0;
    uint64_t max_chunk = 0;
    const uint64_t CHUNK = 4u << 20;
    for (int i = 0; i < nt; i++) {
        int64_t per = T[i].row_bytes >= (int64_t)CHUNK ? 1 : (int64_t)CHUNK / T[i].row_bytes;
        n_jobs += (T[i].rows + per - 1) / per;
        if (T[i].cols > max_cols) max_cols = T[i].cols;
        uint64_t c = (uint64_t)(per < T[i].rows ? per : T[i].rows) * (uint64_t)T[i].row_bytes;
        if (c > max_chunk) max_chunk = c;
    }
    GmJob *jobs = malloc((size_t)n_jobs * sizeof *jobs);
    if (!jobs) gm_die(1, "out of memory");
    n_jobs = 0;
    for (int i = 0; i < nt; i++) {
        int64_t per = T[i].row_bytes >= (int64_t)CHUNK ? 1 : (int64_t)CHUNK / T[i].row_bytes;
        for (int64_t r = 0; r < T[i].rows; r += per)
            jobs[n_jobs++] = (GmJob){i, r, r + per < T[i].rows ? r + per : T[i].rows};
    }

    char hs[32];
    gm_human((double)total, hs, sizeof hs);
    if (!o.quiet)
        fprintf(stderr, "gen_model: %s: %s, %d layers, dim %d, heads %d/%d of %d, ffn %d, vocab %d, ctx %d, %s (embd %s), "
                "%s, %.2f%c params, %s, seed %llu\n", o.out, preset_name, p->layers, p->dim, p->heads, p->kv_heads, hd, p->ffn,
                p->vocab, p->ctx, gm_type_name(p->type), gm_type_name(p->embd_type), p->untied ? "untied" : "tied",
                params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? 'B' : 'M', hs, (unsigned long long)o.seed);

    /* the file: refuse early when it cannot fit */
    int fd = open(o.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) gm_die(1, "%s: cannot create: %s", o.out, strerror(errno));
    struct stat st;
    int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regular) {
        gm_unlink_path = o.out;
        signal(SIGINT, gm_on_signal), signal(SIGTERM, gm_on_signal), signal(SIGHUP, gm_on_signal);
        struct statvfs vf;
        char fs[32];
        if (fstatvfs(fd, &vf) == 0 && (double)vf.f_bavail * vf.f_frsize < (double)total) {
            gm_human((double)vf.f_bavail * vf.f_frsize, fs, sizeof fs);
            gm_die(1, "%s: not enough disk space: the file needs %s, %s free", o.out, hs, fs);
        }
        if (fallocate(fd, 0, 0, (off_t)total) != 0 && errno == ENOSPC)   /* other errors: not supported here */
            gm_die(1, "%s: not enough disk space: the file needs %s", o.out, hs);
    }

    double t0 = now_s();
    int e = gm_write_all(fd, hdr, hsize);
    if (e) gm_die(1, "%s: write failed: %s", o.out, strerror(e));
    free(hdr);

    Pipe P;
    memset(&P, 0, sizeof P);
    P.t = T, P.jobs = jobs, P.n_jobs = n_jobs, P.seed = o.seed, P.max_cols = max_cols;
    int nthr = o.threads < n_jobs ? o.threads : (int)n_jobs;
    P.n_slots = 2 * nthr;
    P.buf = calloc((size_t)P.n_slots, sizeof *P.buf);
    P.slot_job = malloc((size_t)P.n_slots * sizeof *P.slot_job);
    P.slot_ready = calloc((size_t)P.n_slots, sizeof *P.slot_ready);
    if (!P.buf || !P.slot_job || !P.slot_ready) gm_die(1, "out of memory");
    for (int s = 0; s < P.n_slots; s++) {
        P.slot_job[s] = -1;
        if (!(P.buf[s] = malloc(max_chunk))) gm_die(1, "out of memory");
    }
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    pthread_t *th = malloc((size_t)nthr * sizeof *th);
    for (int i = 0; i < nthr; i++)
        if (pthread_create(&th[i], NULL, gm_worker, &P)) gm_die(1, "cannot start a thread");

    static const uint8_t zeros[32];
    uint64_t pos = 0;   /* in the data section */
    for (int64_t j = 0; j < n_jobs && !e; j++) {
        int s = (int)(j % P.n_slots);
        pthread_mutex_lock(&P.mu);
        while (!(P.slot_job[s] == j && P.slot_ready[s])) pthread_cond_wait(&P.cv, &P.mu);
        pthread_mutex_unlock(&P.mu);
        const GmJob *jb = &jobs[j];
        const TensorSpec *t = &T[jb->tensor];
        uint64_t at = t->offset + (uint64_t)jb->r0 * (uint64_t)t->row_bytes, n = (uint64_t)(jb->r1 - jb->r0) * (uint64_t)t->row_bytes;
        if (at > pos) e = gm_write_all(fd, zeros, (size_t)(at - pos)), pos = at;   /* alignment padding */
        if (!e) e = gm_write_all(fd, P.buf[s], (size_t)n), pos += n;
        pthread_mutex_lock(&P.mu);
        P.slot_job[s] = -1;
        if (e) P.stop = 1;
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
        gm_progress(&o, hsize + pos, total, t0, 0);
    }
    for (int i = 0; i < nthr; i++) pthread_join(th[i], NULL);
    if (e) {
        if (!o.quiet && total >= (64u << 20) && isatty(2)) fprintf(stderr, "\n");
        gm_die(1, "%s: write failed after %llu of %llu bytes: %s", o.out, (unsigned long long)(hsize + pos),
               (unsigned long long)total, strerror(e));
    }
    if (pos != data_bytes) gm_die(1, "internal error: wrote %llu data bytes, planned %llu", (unsigned long long)pos,
                                  (unsigned long long)data_bytes);
    gm_progress(&o, total, total, t0, 1);
    double t_write = now_s() - t0, t_sync = 0;
    if (regular && !o.no_sync) {
        if (!o.quiet && total >= (64u << 20)) fprintf(stderr, "gen_model: fsync ...\n");
        double t1 = now_s();
        if (fsync(fd) != 0) gm_die(1, "%s: fsync failed: %s", o.out, strerror(errno));
        t_sync = now_s() - t1;
    }
    if (close(fd) != 0) gm_die(1, "%s: close failed: %s", o.out, strerror(errno));

    /* ra's own loader must take it */
    if (regular && !o.no_check) {
        Model m;
        char err[ERR_LEN];
        if (build_model(&m, o.out, err)) gm_die(1, "the written file does not load: %s", err);
        free_model(&m);
    }
    gm_unlink_path = NULL;
    if (!o.quiet) {
        double t = t_write + t_sync > 1e-9 ? t_write + t_sync : 1e-9;
        char sync[48] = "";
        if (regular && !o.no_sync) snprintf(sync, sizeof sync, ", of which fsync %.1fs", t_sync);
        fprintf(stderr, "gen_model: wrote %s: %llu bytes (%s), %d tensors, in %.1fs%s (%.0f MB/s)%s\n", o.out,
                (unsigned long long)total, hs, nt, t, sync, total / 1e6 / t, regular && !o.no_check ? "; ra's loader accepts it" : "");
    }
    for (int s = 0; s < P.n_slots; s++) free(P.buf[s]);
    free(P.buf), free(P.slot_job), free(P.slot_ready), free(th), free(jobs), free(T);
    return 0;
}
