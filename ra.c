/* ra.c - attention for ra: full attention (Eq. 1), RetrievalAttention's index, search and
 * merge (§3, App. B), the baselines, and the ./ra program.
 * Paper: Liu et al., 2024, "RetrievalAttention: Accelerating Long-Context LLM Inference via
 * Vector Retrieval". Equation and algorithm numbers below are the paper's. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ra.h"

/* ======================================================================== */
/* Full attention, Eq. (1):                                                 */
/*   z_i = q_t . k_i / sqrt(d),  a_t,i = e^z_i / sum_j e^z_j,  o_t = sum_i a_t,i v_i */
/* Causal: the token at position p attends to positions 0..p.               */
/* ======================================================================== */

static float vdot(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[j + k] * b[j + k];
    float s = 0;
    for (; j < n; j++) s += a[j] * b[j];
    for (int k = 0; k < 16; k++) s += acc[k];
    return s;
}

/* o = sum_i a_i v_i over positions 0..n-1 of one head's K, V (rows of d floats) */
void attn_full(const float *q, const float *K, const float *V, int n, int d, float *scores, float *out) {
    float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < n; i++) scores[i] = vdot(q, K + (size_t)i * d, d) * scale;   /* z_i */
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = scores[i] > mx ? scores[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        scores[i] = expf(scores[i] - mx);
        sum += scores[i];
    }
    for (int j = 0; j < d; j++) out[j] = 0;
    for (int i = 0; i < n; i++) {
        const float *v = V + (size_t)i * d;
        float a = (float)(scores[i] / sum);   /* a_t,i */
        for (int j = 0; j < d; j++) out[j] += a * v[j];
    }
}

/* ======================================================================== */
/* Causal attention over the cache, in tiles                                */
/* Eq. (1) for a block of queries: the GQA group's query heads for up to    */
/* ATT_QB consecutive tokens share one pass over the keys, ATT_KT keys at a */
/* time, with the running max and sum of FlashAttention (the same algebra   */
/* as Eq. (4)-(5): a partial result rescaled by e^(old max - new max)).     */
/* Memory stays linear in the context; attn_full above is its oracle.      */
/* ======================================================================== */

#define ATT_QB 16   /* tokens per block */
#define ATT_KT 64   /* keys per tile */

typedef struct { const Model *m; State *s; int layer, n, pos0; } AttnTask;

/* acc[r] = acc[r] * corr[r] + sum_j P[r][j] v_j for 4 rows at once, so each value row is
 * loaded once per 4 rows */
static void pv_4rows(float *acc, const float *P, const float *V, int nk, int hd) {
    for (int j = 0; j < nk; j++) {
        const float *v = V + (size_t)j * hd;
        float p0 = P[j], p1 = P[ATT_KT + j], p2 = P[2 * ATT_KT + j], p3 = P[3 * ATT_KT + j];
        float *o0 = acc, *o1 = acc + hd, *o2 = acc + 2 * hd, *o3 = acc + 3 * hd;
        for (int d = 0; d < hd; d++) {
            float x = v[d];
            o0[d] += p0 * x, o1[d] += p1 * x, o2[d] += p2 * x, o3[d] += p3 * x;
        }
    }
}

static void attn_block(AttnTask *t, int kvh, int tok0, int thread) {
    const Config *c = &t->m->c;
    State *s = t->s;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, qd = c->n_heads * hd;
    int nt = t->n - tok0 < ATT_QB ? t->n - tok0 : ATT_QB, rows = nt * group, rows4 = (rows + 3) & ~3;
    float scale = 1.0f / sqrtf((float)hd);
    size_t base = ((size_t)t->layer * c->n_kv_heads + kvh) * s->ctx * hd;
    const float *K = s->k + base, *V = s->v + base;
    float *S = s->att_work + (size_t)thread * s->att_work_stride;   /* (rows4, ATT_KT) scores, then weights */
    float *acc = S + (size_t)rows4 * ATT_KT;                       /* (rows4, hd) running sum of p v */
    float *Qb = acc + (size_t)rows4 * hd;                           /* (rows4, hd) the queries, scaled */
    float *mx = Qb + (size_t)rows4 * hd, *sum = mx + rows4;         /* (rows4) running max, sum of p */
    int *pos = (int *)(sum + rows4);                                /* (rows4) position of each row */
    for (int r = 0; r < rows4; r++) {
        int ok = r < rows, tok = tok0 + (ok ? r : rows - 1) / group, h = kvh * group + (ok ? r : rows - 1) % group;
        const float *q = s->q + (size_t)tok * qd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) Qb[(size_t)r * hd + d] = ok ? q[d] * scale : 0;
        pos[r] = ok ? t->pos0 + tok : -1;   /* padding rows see no key */
        mx[r] = -INFINITY, sum[r] = 0;
    }
    memset(acc, 0, (size_t)rows4 * hd * sizeof(float));
    int last = t->pos0 + tok0 + nt - 1;   /* the last key any row may see */
    for (int j0 = 0; j0 <= last; j0 += ATT_KT) {
        int nk = last + 1 - j0 < ATT_KT ? last + 1 - j0 : ATT_KT;
        /* S = Qb . K^T for this tile: z_j of Eq. (1) */
        for (int r = 0; r < rows4; r += 4) {
            int j = 0;
            for (; j + 4 <= nk; j += 4) {
                float o[4][4];
                dot_4x4(Qb + (size_t)r * hd, K + (size_t)(j0 + j) * hd, hd, o);
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++) S[(size_t)(r + a) * ATT_KT + j + b] = o[a][b];
            }
            for (; j < nk; j++)
                for (int a = 0; a < 4; a++) S[(size_t)(r + a) * ATT_KT + j] = vdot(Qb + (size_t)(r + a) * hd, K + (size_t)(j0 + j) * hd, hd);
        }
        /* causal mask, running max, weights p = e^(z - max), rescale what came before */
        for (int r = 0; r < rows4; r++) {
            float *Sr = S + (size_t)r * ATT_KT, m = mx[r], l = 0;
            int nv = pos[r] + 1 - j0 < nk ? pos[r] + 1 - j0 : nk;
            if (nv < 0) nv = 0;
            for (int j = 0; j < nv; j++) m = Sr[j] > m ? Sr[j] : m;
            for (int j = 0; j < nk; j++) {
                Sr[j] = j < nv ? expf(Sr[j] - m) : 0;
                l += Sr[j];
            }
            float corr = m == -INFINITY ? 1 : expf(mx[r] - m), *o = acc + (size_t)r * hd;
            if (corr != 1)
                for (int d = 0; d < hd; d++) o[d] *= corr;
            sum[r] = sum[r] * corr + l;
            mx[r] = m;
        }
        for (int r = 0; r < rows4; r += 4) pv_4rows(acc + (size_t)r * hd, S + (size_t)r * ATT_KT, V + (size_t)j0 * hd, nk, hd);
    }
    for (int r = 0; r < rows; r++) {
        int tok = tok0 + r / group, h = kvh * group + r % group;
        float *out = s->att + (size_t)tok * qd + (size_t)h * hd, inv = 1.0f / sum[r];
        for (int d = 0; d < hd; d++) out[d] = acc[(size_t)r * hd + d] * inv;
    }
}

static void attn_causal_task(void *arg, int64_t i0, int64_t i1, int thread) {
    AttnTask *t = arg;
    int nblocks = (t->n + ATT_QB - 1) / ATT_QB;
    for (int64_t i = i0; i < i1; i++) attn_block(t, (int)(i / nblocks), (int)(i % nblocks) * ATT_QB, thread);
}

/* scratch floats per thread for attn_block */
size_t attn_work_floats(const Config *c) {
    size_t rows = ((size_t)ATT_QB * (c->n_heads / c->n_kv_heads) + 3) & ~(size_t)3;
    return rows * (ATT_KT + 2 * (size_t)c->head_dim + 3);
}

void attention_layer(const Model *m, State *s, int layer, int n, int pos0) {
    AttnTask t = {m, s, layer, n, pos0};
    pool_for(s->pool, (int64_t)m->c.n_kv_heads * ((n + ATT_QB - 1) / ATT_QB), attn_causal_task, &t);
}

#ifndef TESTING
/* ======================================================================== */
/* Sampling: greedy at temperature 0, else temperature + nucleus (top-p)    */
/* ======================================================================== */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct { float p; int id; } ProbId;

static uint64_t rng_next(uint64_t *st) {   /* xorshift64* */
    *st ^= *st >> 12, *st ^= *st << 25, *st ^= *st >> 27;
    return *st * 0x2545F4914F6CDD1DULL;
}
static float rng_float(uint64_t *st) { return (rng_next(st) >> 40) / 16777216.0f; }

static int cmp_prob_desc(const void *a, const void *b) {
    const ProbId *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

static int sample(float *logits, int n, float temp, float top_p, uint64_t *rng, ProbId *buf) {
    if (temp <= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++) logits[i] /= temp;
    softmax(logits, n);
    /* keep the smallest set of most likely tokens whose mass reaches top_p */
    int m = 0;
    float cut = top_p < 1 ? (1 - top_p) / (n - 1) : 0;   /* tokens below this can never be in the nucleus */
    for (int i = 0; i < n; i++)
        if (logits[i] >= cut) buf[m].p = logits[i], buf[m].id = i, m++;
    qsort(buf, (size_t)m, sizeof *buf, cmp_prob_desc);
    float cum = 0;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        cum += buf[i].p;
        if (cum >= top_p) {
            last = i;
            break;
        }
    }
    float r = rng_float(rng) * cum, acc = 0;
    for (int i = 0; i <= last; i++) {
        acc += buf[i].p;
        if (r < acc) return buf[i].id;
    }
    return buf[last].id;
}

/* ======================================================================== */
/* The ./ra program                                                         */
/* ======================================================================== */

typedef struct {
    const char *model, *prompt, *prompt_file, *stats;
    int n_predict, ctx, threads, batch, chat, ignore_eos;
    float temp, top_p;
    long long seed;
    AttnParams attn;
} Args;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ra: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ra -m MODEL.gguf (-p TEXT | -f FILE) [options]\n"
            "  -m, --model FILE     GGUF model (llama or qwen2 architecture)\n"
            "  -p, --prompt TEXT    prompt text\n"
            "  -f, --file FILE      read the prompt from a UTF-8 file\n"
            "  -n, --n-predict N    tokens to generate (default 128)\n"
            "  -c, --ctx-size N     context size (default: prompt + n, capped at the trained context)\n"
            "  -t, --threads N      CPU threads (default: all cores)\n"
            "  -b, --batch-size N   prefill batch (default 256)\n"
            "      --temp T         temperature, 0 = greedy (default 0.8)\n"
            "      --top-p P        nucleus sampling (default 0.95)\n"
            "      --seed N         random seed (default: from the clock)\n"
            "      --chat           wrap the prompt in the model's chat format\n"
            "      --ignore-eos     keep generating past end-of-generation tokens\n"
            "      --attn MODE      full (default)\n"
            "      --stats FILE     write run statistics as one JSON object\n"
            "  -h, --help           this text\n");
}

/* strict numbers: the whole argument, no trailing garbage, no overflow, in range */
static long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    if (!s) die("%s needs a value", flag);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) die("%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi) die("%s: %lld is out of range [%lld, %lld]", flag, v, lo, hi);
    return v;
}

static float parse_float(const char *flag, const char *s, float lo, float hi) {
    if (!s) die("%s needs a value", flag);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v) die("%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi) die("%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    return (float)v;
}

static int flag_is(const char *f, const char *a, const char *b) { return !strcmp(f, a) || (b && !strcmp(f, b)); }

static const char *need_value(const char *flag, const char *v) {
    if (!v) die("%s needs a value", flag);
    return v;
}

static Args parse_args(int argc, char **argv) {
    Args a;
    memset(&a, 0, sizeof a);
    a.n_predict = 128;
    a.batch = 256;
    a.temp = 0.8f;
    a.top_p = 0.95f;
    a.seed = -1;
    a.attn.mode = ATTN_FULL;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    a.threads = nc > 0 ? (int)nc : 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (flag_is(f, "-h", "--help")) usage(stdout), exit(0);
        else if (flag_is(f, "-m", "--model")) a.model = need_value(f, v), i++;
        else if (flag_is(f, "-p", "--prompt")) a.prompt = need_value(f, v), i++;
        else if (flag_is(f, "-f", "--file")) a.prompt_file = need_value(f, v), i++;
        else if (flag_is(f, "-n", "--n-predict")) a.n_predict = (int)parse_int(f, v, 1, 1 << 24), i++;
        else if (flag_is(f, "-c", "--ctx-size")) a.ctx = (int)parse_int(f, v, 1, 1 << 24), i++;
        else if (flag_is(f, "-t", "--threads")) a.threads = (int)parse_int(f, v, 1, 1024), i++;
        else if (flag_is(f, "-b", "--batch-size")) a.batch = (int)parse_int(f, v, 1, 1 << 16), i++;
        else if (flag_is(f, "--temp", NULL)) a.temp = parse_float(f, v, 0, 100), i++;
        else if (flag_is(f, "--top-p", NULL)) a.top_p = parse_float(f, v, 0, 1), i++;
        else if (flag_is(f, "--seed", NULL)) a.seed = parse_int(f, v, -1, (long long)1 << 62), i++;
        else if (flag_is(f, "--chat", NULL)) a.chat = 1;
        else if (flag_is(f, "--ignore-eos", NULL)) a.ignore_eos = 1;
        else if (flag_is(f, "--stats", NULL)) a.stats = need_value(f, v), i++;
        else if (flag_is(f, "--attn", NULL)) {
            v = need_value(f, v), i++;
            if (!strcmp(v, "full")) a.attn.mode = ATTN_FULL;
            else die("--attn: unknown mode '%s' (full)", v);
        } else die("unknown option '%s' (see ra --help)", f);
    }
    if (!a.model) die("no model given (-m MODEL.gguf)");
    if (!a.prompt && !a.prompt_file) die("no prompt given (-p TEXT or -f FILE)");
    if (a.prompt && a.prompt_file) die("give -p or -f, not both");
    return a;
}

/* 1 when buf[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF) */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        unsigned cp = len == 1 ? c : c & (0x7F >> len);
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

static char *read_prompt_file(const char *path, size_t *len) {
    struct stat st;
    if (stat(path, &st) != 0) die("%s: cannot open prompt file: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) die("%s: is a directory, not a prompt file", path);
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open prompt file: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0) break;
        n += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) die("%s: read error", path);
    if (n == 0) die("%s: prompt file is empty", path);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* the model's chat format around one user message (llama.cpp's chatml and llama3 templates) */
static char *apply_chat(const Model *m, const char *prompt) {
    const char *fmt;
    if (tokenizer_find(&m->tok, "<|im_start|>") >= 0)
        fmt = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n";
    else if (tokenizer_find(&m->tok, "<|start_header_id|>") >= 0)
        fmt = "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    else
        die("--chat: no known chat format for this model (ChatML and Llama 3 are known)");
    size_t n = strlen(fmt) + strlen(prompt) + 1;
    char *out = malloc(n);
    snprintf(out, n, fmt, prompt);
    return out;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static const char *attn_mode_name(int mode) {
    static const char *names[] = {"full", "ra", "flat", "ivf", "streaming"};
    return names[mode];
}

static void print_piece(const Model *m, int id) {
    char buf[256];
    int n = tokenizer_decode_piece(&m->tok, id, 0, buf, sizeof buf);
    if (n > (int)sizeof buf) n = sizeof buf;
    if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv) {
    Args a = parse_args(argc, argv);
    char err[ERR_LEN];
    FILE *stats = NULL;
    if (a.stats && !(stats = fopen(a.stats, "w"))) die("--stats: cannot write '%s': %s", a.stats, strerror(errno));

    Model m;
    if (build_model(&m, a.model, err)) die("%s", err);

    /* prompt -> tokens (special-token text is parsed, as llama.cpp does) */
    size_t plen;
    char *text = a.prompt_file ? read_prompt_file(a.prompt_file, &plen) : strdup(a.prompt);
    plen = strlen(text);
    if (a.prompt_file && !utf8_valid((const unsigned char *)text, plen)) die("%s: prompt file is not valid UTF-8", a.prompt_file);
    if (a.chat) {
        char *t = apply_chat(&m, text);
        free(text);
        text = t;
        plen = strlen(text);
    }
    int cap = (int)(plen + 16 > 1 << 30 ? 1 << 30 : plen + 16);
    int32_t *tokens = malloc((size_t)cap * sizeof(int32_t));
    int n_prompt = tokenizer_encode(&m.tok, text, plen, 1, 1, tokens, cap);
    free(text);
    if (n_prompt < 0) die("the prompt could not be tokenized");
    if (n_prompt == 0) die("the prompt is empty");

    /* context: prompt + n, capped at the trained context unless -c raises it */
    int ctx = a.ctx;
    if (!ctx) {
        long long want = (long long)n_prompt + a.n_predict;
        ctx = (int)(want < m.c.ctx_train ? want : m.c.ctx_train);
    }
    if (n_prompt >= ctx)
        die("the prompt is %d tokens, which does not fit the context of %d (%s)", n_prompt, ctx,
            a.ctx ? "raise -c" : "the model's trained context; -c raises it");
    if (a.batch > ctx) a.batch = ctx;

    Pool *pool = build_pool(a.threads);
    State s;
    if (build_state(&s, &m, ctx, a.batch, pool, err)) die("%s", err);

    /* prefill, in batches, with progress on stderr when it lasts more than a moment */
    double t0 = now_s(), last = t0;
    for (int i = 0; i < n_prompt; i += a.batch) {
        int nb = n_prompt - i < a.batch ? n_prompt - i : a.batch;
        forward(&m, &s, tokens + i, nb);
        double t = now_s();
        if (t - t0 > 1.0 && (t - last > 0.5 || i + nb == n_prompt)) {
            double rate = (i + nb) / (t - t0);
            fprintf(stderr, "\rprefill %d/%d tokens, %.1f tok/s, ETA %.0f s   ", i + nb, n_prompt, rate,
                    (n_prompt - i - nb) / rate);
            if (i + nb == n_prompt) fprintf(stderr, "\n");
            last = t;
        }
    }
    double prefill_s = now_s() - t0;

    /* decode */
    uint64_t rng = a.seed >= 0 ? (uint64_t)a.seed * 2654435761u + 1 : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (!rng) rng = 1;
    ProbId *pbuf = malloc((size_t)m.c.vocab_size * sizeof(ProbId));
    int n_gen = 0;
    double t1 = now_s();
    float *logits = s.logits;
    while (n_gen < a.n_predict && s.n < ctx) {
        int next = sample(logits, m.c.vocab_size, a.temp, a.top_p, &rng, pbuf);
        if (!a.ignore_eos && tokenizer_is_eog(&m.tok, next)) break;
        print_piece(&m, next);
        n_gen++;
        if (n_gen == a.n_predict || s.n >= ctx) break;
        logits = forward(&m, &s, &next, 1);
    }
    double decode_s = now_s() - t1;
    printf("\n");
    double ms_tok = n_gen > 1 ? decode_s * 1000 / (n_gen - 1) : 0;
    fprintf(stderr, "ra: %s, %d threads, attention %s\n", m.name, pool_threads(pool), attn_mode_name(a.attn.mode));
    fprintf(stderr, "ra: prompt %d tokens in %.2f s (%.1f tok/s); generated %d tokens, %.2f ms/token\n", n_prompt,
            prefill_s, n_prompt / prefill_s, n_gen, ms_tok);
    if (stats) {
        fprintf(stats, "{\"mode\": \"%s\", \"model\": ", attn_mode_name(a.attn.mode));
        json_string(stats, a.model);
        fprintf(stats,
                ", \"prompt_tokens\": %d, \"generated_tokens\": %d, \"ctx\": %d, \"prefill_s\": %.4f, "
                "\"prefill_tok_s\": %.2f, \"decode_ms_per_token\": %.3f, \"peak_rss_mb\": %.1f, \"threads\": %d}\n",
                n_prompt, n_gen, ctx, prefill_s, n_prompt / prefill_s, ms_tok, peak_rss_mb(), pool_threads(pool));
        fclose(stats);
    }
    free(pbuf);
    free(tokens);
    free_state(&s);
    free_pool(pool);
    free_model(&m);
    return 0;
}
#endif
