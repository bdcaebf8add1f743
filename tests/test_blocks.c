/* tests/test_blocks.c - equation-level checks of each block against direct double-precision
 * formulas: RMSNorm, RoPE (both pair layouts, and its relative-position property), softmax,
 * Eq. (1) attention, SwiGLU, and the threaded matmul (any thread count, same bits). */
#define TESTING
#include "../model.c"
#include "../ra.c"
#include "check.h"
#include "graphs.h"
#include "ref_data.h"
#include <sys/wait.h>

static uint64_t rng = 42;
static float frand(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) / 16777216.0 * 2 - 1);
}
static double rel_err(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_rmsnorm(void) {
    int n = 576;
    float x[576], w[576], out[576];
    double ref[576], ss = 0;
    for (int i = 0; i < n; i++) x[i] = 3 * frand(), w[i] = frand(), ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) ref[i] = x[i] / sqrt(ss / n + 1e-5) * w[i];
    rmsnorm(out, x, w, n, 1e-5f);
    CHECK(rel_err(out, ref, n) < 1e-6, "rmsnorm rel err %g", rel_err(out, ref, n));
}

/* RoPE: pair (a, b) of head h rotated by angle pos * theta_i, theta_i = base^(-2i/d) */
static void rope_ref(double *v, const float *in, int hd, int rot, int pos, double base, int neox) {
    for (int j = 0; j < hd; j++) v[j] = in[j];
    for (int i = 0; i < rot / 2; i++) {
        double th = pos * pow(base, -2.0 * i / rot);
        int a = neox ? i : 2 * i, b = neox ? i + rot / 2 : 2 * i + 1;
        v[a] = in[a] * cos(th) - in[b] * sin(th);
        v[b] = in[a] * sin(th) + in[b] * cos(th);
    }
}

static void test_rope(void) {
    int hd = 64, nh = 3;
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = (float)pow(10000.0, -2.0 * i / hd);
    for (int neox = 0; neox <= 1; neox++) {
        for (int rot = 32; rot <= 64; rot += 32) {
            float v[192], in[192];
            double ref[64];
            for (int i = 0; i < nh * hd; i++) in[i] = v[i] = frand();
            float invr[32];
            for (int i = 0; i < rot / 2; i++) invr[i] = (float)pow(10000.0, -2.0 * i / rot);
            rope_apply(v, nh, hd, rot, 37, invr, neox ? ROPE_NEOX : ROPE_NORM);
            double worst = 0;
            for (int h = 0; h < nh; h++) {
                rope_ref(ref, in + h * hd, hd, rot, 37, 10000.0, neox);
                double e = rel_err(v + h * hd, ref, hd);
                worst = e > worst ? e : worst;
            }
            CHECK(worst < 1e-5, "rope %s rot %d rel err %g", neox ? "neox" : "norm", rot, worst);
        }
        /* relative position: q(m) . k(n) depends only on m - n */
        float q[64], k[64], q1[64], k1[64], q2[64], k2[64];
        for (int i = 0; i < hd; i++) q[i] = frand(), k[i] = frand();
        memcpy(q1, q, sizeof q), memcpy(k1, k, sizeof k), memcpy(q2, q, sizeof q), memcpy(k2, k, sizeof k);
        rope_apply(q1, 1, hd, hd, 100, inv, neox), rope_apply(k1, 1, hd, hd, 90, inv, neox);
        rope_apply(q2, 1, hd, hd, 1010, inv, neox), rope_apply(k2, 1, hd, hd, 1000, inv, neox);
        float d1 = dot8(q1, k1, hd), d2 = dot8(q2, k2, hd);
        CHECK(fabsf(d1 - d2) < 1e-3f * (fabsf(d1) + 1), "rope %s relative position: %g vs %g", neox ? "neox" : "norm", d1, d2);
    }
}

static void test_softmax(void) {
    float x[100];
    double ref[100], mx = -1e30, sum = 0;
    for (int i = 0; i < 100; i++) x[i] = 50 * frand() + 500, mx = x[i] > mx ? x[i] : mx;   /* large: needs the shift */
    for (int i = 0; i < 100; i++) sum += exp(x[i] - mx);
    for (int i = 0; i < 100; i++) ref[i] = exp(x[i] - mx) / sum;
    softmax(x, 100);
    CHECK(rel_err(x, ref, 100) < 1e-6, "softmax rel err %g", rel_err(x, ref, 100));
}

/* Eq. (1) directly in double */
static void test_eq1(void) {
    int n = 300, d = 64;
    float *K = malloc(n * d * 4), *V = malloc(n * d * 4), q[64], out[64];
    double ref[64] = {0}, z[300], mx = -1e30, sum = 0;
    for (int i = 0; i < n * d; i++) K[i] = frand(), V[i] = frand();
    for (int j = 0; j < d; j++) q[j] = 4 * frand();
    for (int i = 0; i < n; i++) {
        z[i] = 0;
        for (int j = 0; j < d; j++) z[i] += (double)q[j] * K[i * d + j];
        z[i] /= sqrt(d);
        mx = z[i] > mx ? z[i] : mx;
    }
    for (int i = 0; i < n; i++) sum += exp(z[i] - mx);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) ref[j] += exp(z[i] - mx) / sum * V[i * d + j];
    attn_full(q, rows_f32(K, d), rows_f32(V, d), n, d, 1.0f / sqrtf((float)d), out);
    CHECK(rel_err(out, ref, d) < 1e-5, "Eq. (1) rel err %g", rel_err(out, ref, d));
    /* one key: the output is its value */
    attn_full(q, rows_f32(K, d), rows_f32(V, d), 1, d, 1.0f / sqrtf((float)d), out);
    double v0[64];
    for (int j = 0; j < d; j++) v0[j] = V[j];
    CHECK(rel_err(out, v0, d) < 1e-7, "Eq. (1) with one key");
    free(K), free(V);
}

static void test_swiglu(void) {
    float g[64], u[64], out[64];
    double ref[64];
    for (int i = 0; i < 64; i++) g[i] = 8 * frand(), u[i] = frand(), ref[i] = g[i] / (1 + exp(-g[i])) * u[i];
    swiglu(out, g, u, 64);
    CHECK(rel_err(out, ref, 64) < 1e-6, "swiglu rel err %g", rel_err(out, ref, 64));
}

/* the threaded matmul equals a double-precision product, and its bits do not depend on the
 * thread count; batch sizes 1 (fused matvec) and 7 (4-token kernel + tail) */
static void test_matmul(void) {
    int rows = 96, cols = 128;
    float *W = malloc(rows * cols * 4);
    for (int i = 0; i < rows * cols; i++) W[i] = frand();
    Mat M = {W, GGML_F32, rows, cols, cols * 4};
    float X[7 * 128], Y1[7 * 96], Y3[7 * 96], wrow[3 * 4 * 128];
    double ref[7 * 96];
    for (int i = 0; i < 7 * cols; i++) X[i] = frand();
    for (int t = 0; t < 7; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int j = 0; j < cols; j++) s += (double)W[r * cols + j] * X[t * cols + j];
            ref[t * rows + r] = s;
        }
    Pool *p1 = build_pool(1), *p3 = build_pool(3);
    for (int nt = 1; nt <= 7; nt += 6) {
        matmul(p1, Y1, X, &M, nt, wrow);
        matmul(p3, Y3, X, &M, nt, wrow);
        CHECK(rel_err(Y1, ref, nt * rows) < 1e-6, "matmul batch %d rel err %g", nt, rel_err(Y1, ref, nt * rows));
        CHECK(!memcmp(Y1, Y3, (size_t)nt * rows * 4), "matmul batch %d: 1 and 3 threads differ", nt);
    }
    free_pool(p1), free_pool(p3);
    free(W);
}

/* the prefill's blocked kernel (4 rows x MM_T tokens, model.c dot_4xT) gives dot8's bits for
 * every element, whatever the block: batch sizes around MM_T, rows that leave a block of fewer
 * than 4, and rows whose length leaves a tail past the 8 lanes */
static void test_matmul_bits(void) {
    int shapes[][2] = {{13, 128}, {12, 132}, {5, 7}};
    for (int sh = 0; sh < 3; sh++) {
        int rows = shapes[sh][0], cols = shapes[sh][1], bad = 0;
        float *W = malloc((size_t)rows * cols * 4), *X = malloc((size_t)9 * cols * 4);
        float *Y = malloc((size_t)9 * rows * 4), *wrow = malloc((size_t)2 * 4 * cols * 4);
        for (int i = 0; i < rows * cols; i++) W[i] = frand();
        for (int i = 0; i < 9 * cols; i++) X[i] = frand();
        Mat M = {W, GGML_F32, rows, cols, cols * 4};
        Pool *p = build_pool(2);
        for (int nt = 2; nt <= 9; nt++) {
            matmul(p, Y, X, &M, nt, wrow);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < rows; r++) {
                    float want = dot8(W + (size_t)r * cols, X + (size_t)t * cols, cols);
                    bad += memcmp(&want, &Y[(size_t)t * rows + r], 4) != 0;
                }
        }
        CHECK(bad == 0, "matmul %d x %d, batches 2..9: %d elements differ from dot8's bits (MM_T %d)", rows, cols, bad, MM_T);
        free_pool(p);
        free(W), free(X), free(Y), free(wrow);
    }
}

/* attn_causal, the tiled causal attention of model.c (blocks of queries, tiles of keys, GQA
 * groups), equals Eq. (1) computed per query by attn_full, for a batch that starts mid-cache; at head dims that fill
 * the kernels' steps of ATT_C vectors (64), need the one-vector steps (32 and 80 with
 * AVX-512's 16 floats, 24 with AVX2's 8) and leave dims over (20, and 24 with AVX-512) */
static int case_cache_type;   /* attention_case's State.cache_type */

/* the random cache of a test State: n elements of keys and of values, as s->cache_type holds them */
static void fill_cache(State *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float k = 2 * frand(), v = frand();
        if (s->cache_type & CACHE_K_F16) ((uint16_t *)s->k)[i] = fp32_to_fp16(k);
        else ((float *)s->k)[i] = k;
        if (s->cache_type & CACHE_V_F16) ((uint16_t *)s->v)[i] = fp32_to_fp16(v);
        else ((float *)s->v)[i] = v;
    }
}

static void test_tiled_attention_hd(int hd, int cache_type) {
    Model m;
    memset(&m, 0, sizeof m);
    m.c.n_layers = 2, m.c.n_heads = 6, m.c.n_kv_heads = 2, m.c.head_dim = hd, m.c.dim = 6 * hd;
    const Config *c = &m.c;
    int ctx = 260, n = 150, pos0 = 70, qd = c->n_heads * hd;
    Pool *p = build_pool(3);
    State s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx, s.pool = p, s.cache_type = cache_type;
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
    s.k = malloc(cache * 4), s.v = malloc(cache * 4), s.q = malloc((size_t)n * qd * 4), s.att = malloc((size_t)n * qd * 4);
    s.att_work_stride = attn_work_floats(c);
    s.att_work = malloc(3 * s.att_work_stride * 4);
    fill_cache(&s, cache);
    for (int i = 0; i < n * qd; i++) s.q[i] = 2 * frand();
    attn_causal(&m, &s, 1, n, pos0);
    float *out = malloc((size_t)hd * 4);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < c->n_heads; h++) {
            attn_full(s.q + (size_t)t * qd + h * hd, cache_rows(&s, c, 0, 1, h / 3), cache_rows(&s, c, 1, 1, h / 3), pos0 + t + 1,
                      hd, 1.0f / sqrtf((float)hd), out);
            for (int d = 0; d < hd; d++) {
                double e = fabs(out[d] - s.att[(size_t)t * qd + h * hd + d]);
                worst = e > worst ? e : worst;
            }
        }
    CHECK(worst < 1e-5, "attn_causal vs Eq. (1) per query (attn_full), head dim %d, keys %s, values %s: max |diff| %g", hd,
          cache_type & CACHE_K_F16 ? "f16" : "f32", cache_type & CACHE_V_F16 ? "f16" : "f32", worst);
    free(s.k), free(s.v), free(s.q), free(s.att), free(s.att_work), free(out);
    free_pool(p);
}

static void test_tiled_attention(void) {
    int dims[] = {64, 32, 80, 20, 24};
    for (int i = 0; i < 5; i++) test_tiled_attention_hd(dims[i], 0);
    for (int t = 1; t <= 3; t++) test_tiled_attention_hd(64, t);   /* -ctk f16, -ctv f16, both */
    test_tiled_attention_hd(20, CACHE_K_F16 | CACHE_V_F16);
}

/* A sliding layer (gemma3's) keeps a ring of window + max_batch keys (kv_rows) and each query
 * attends to its last `window` keys: a prompt in batches of up to 64 tokens, then decoding
 * steps, against Eq. (1) by attn_full over the window of a copy that keeps every position; the
 * global layer beside it over every key before the query. Windows of 37 and 70 keys, rings of
 * 101 and 134 rows, so tiles (ATT_KT) meet the ring's end; head dims 64 and 20. */
static void test_sliding_window(void) {
    int windows[] = {37, 70}, dims[] = {64, 20};
    for (int wi = 0; wi < 2; wi++) {
        Model m;
        memset(&m, 0, sizeof m);
        int hd = dims[wi], W = windows[wi];
        m.c.n_layers = 2, m.c.n_heads = 4, m.c.n_kv_heads = 2, m.c.head_dim = hd, m.c.dim = 4 * hd;
        m.c.ffn_dim = 8, m.c.vocab_size = 8, m.c.swa_window = W, m.c.swa_pattern = 2;   /* layer 0 slides */
        const Config *c = &m.c;
        int ctx = 400, B = 64, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, n_prompt = 300, bad = 0;
        Pool *p = build_pool(3);
        State s;
        char err[ERR_LEN];
        int r = build_state(&s, &m, ctx, B, 0, p, err);
        CHECK(r == 0, "build_state: %s", err);
        if (r) return free_pool(p);
        CHECK(s.kv_cap[0] == W + B && s.kv_cap[1] == ctx, "kv_rows: the sliding layer holds %d rows (window %d + "
              "batch %d), the global one %d (ctx %d)", s.kv_cap[0], W, B, s.kv_cap[1], ctx);
        /* every position's keys and values, as (position, KV head, hd) */
        float *K = malloc((size_t)ctx * kvd * 4), *V = malloc((size_t)ctx * kvd * 4);
        float *Kh = malloc((size_t)ctx * hd * 4), *Vh = malloc((size_t)ctx * hd * 4), *out = malloc((size_t)hd * 4);
        for (size_t i = 0; i < (size_t)ctx * kvd; i++) K[i] = 2 * frand(), V[i] = frand();
        double worst = 0;
        for (int pos0 = 0, nb; pos0 < n_prompt + 30; pos0 += nb) {
            nb = pos0 >= n_prompt ? 1 : pos0 % 3 == 0 ? 64 : 41;   /* batches of 64 and 41, then steps */
            nb = nb < n_prompt - pos0 || pos0 >= n_prompt ? nb : n_prompt - pos0;
            for (int l = 0; l < 2; l++) {
                for (int t = 0; t < nb; t++)
                    cache_store(&s, c, l, pos0 + t, K + (size_t)(pos0 + t) * kvd, V + (size_t)(pos0 + t) * kvd);
                for (int i = 0; i < nb * qd; i++) s.q[i] = 2 * frand();
                attn_causal(&m, &s, l, nb, pos0);
                for (int h = 0; h < c->n_heads; h++) {
                    int g = h / 2;
                    for (int j = 0; j < ctx; j++)
                        memcpy(Kh + (size_t)j * hd, K + (size_t)j * kvd + g * hd, (size_t)hd * 4),
                            memcpy(Vh + (size_t)j * hd, V + (size_t)j * kvd + g * hd, (size_t)hd * 4);
                    for (int t = 0; t < nb; t++) {
                        int q = pos0 + t, lo = l == 0 && q + 1 - W > 0 ? q + 1 - W : 0;
                        attn_full(s.q + (size_t)t * qd + h * hd, rows_f32(Kh + (size_t)lo * hd, hd), rows_f32(Vh + (size_t)lo * hd, hd),
                                  q + 1 - lo, hd, 1.0f / sqrtf((float)hd), out);
                        for (int d = 0; d < hd; d++) {
                            double e = fabs(out[d] - s.att[(size_t)t * qd + h * hd + d]);
                            worst = e > worst ? e : worst;
                            bad += !(e < 1e-5);
                        }
                    }
                }
            }
        }
        CHECK(bad == 0, "sliding window %d (ring of %d rows), head dim %d: attn_causal vs Eq. (1) over the window, "
              "prompt in batches then decoding steps: max |diff| %g, %d off", W, W + B, hd, worst, bad);
        free(K), free(V), free(Kh), free(Vh), free(out);
        free_state(&s);
        free_pool(p);
    }
}

/* 2 layers, 6 query heads on 2 KV heads of head dim hd: the shape of the decoding kernels' tests */
static Model gqa_shape(int hd) {
    Model m;
    memset(&m, 0, sizeof m);
    m.c.n_layers = 2, m.c.n_heads = 6, m.c.n_kv_heads = 2, m.c.head_dim = hd, m.c.dim = 6 * hd;
    return m;
}

/* a decoding step (one token) over a long cache: its keys are split into runs of ATT_SPLIT
 * (1024) merged by Eq. (4)-(5). Against Eq. (1) per query head by attn_full, at positions with
 * one run, a run and one key, whole runs, and a last run of a few keys, at head dims 64 and 20;
 * the same bits with 1 and 3 threads (the runs do not depend on the thread count); and
 * attn_split_decode called directly gives attention_layer's bits past one run (so the split is
 * what ran) and is within 1e-5 of the one-pass form it replaces. */
static void test_split_decode(void) {
    int dims[] = {64, 20}, at[] = {1023, 1024, 2047, 2050, 3000};
    for (int di = 0; di < 2; di++) {
        int hd = dims[di];
        Model m = gqa_shape(hd);
        const Config *c = &m.c;
        int ctx = 3001, qd = c->n_heads * hd;
        Pool *p1 = build_pool(1), *p3 = build_pool(3);
        State s;
        memset(&s, 0, sizeof s);
        s.ctx = ctx, s.cache_type = di ? CACHE_K_F16 | CACHE_V_F16 : 0;   /* head dim 20 on halves */
        size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
        s.k = malloc(cache * 4), s.v = malloc(cache * 4), s.q = malloc((size_t)qd * 4), s.att = malloc((size_t)qd * 4);
        s.att_work_stride = attn_work_floats(c);
        s.att_work = malloc(3 * s.att_work_stride * 4);
        float *one = malloc((size_t)qd * 4), *out = malloc((size_t)hd * 4);
        fill_cache(&s, cache);
        for (int i = 0; i < qd; i++) s.q[i] = 2 * frand();
        for (int a = 0; a < 5; a++) {
            int pos0 = at[a];
            s.pool = p1;
            attention_layer(&m, &s, 1, 1, pos0);
            memcpy(one, s.att, (size_t)qd * 4);
            s.pool = p3;
            attention_layer(&m, &s, 1, 1, pos0);
            double worst = 0;
            for (int h = 0; h < c->n_heads; h++) {
                attn_full(s.q + h * hd, cache_rows(&s, c, 0, 1, h / 3), cache_rows(&s, c, 1, 1, h / 3), pos0 + 1, hd,
                          1.0f / sqrtf((float)hd), out);
                for (int d = 0; d < hd; d++) {
                    double e = fabs(out[d] - s.att[h * hd + d]);
                    worst = e > worst ? e : worst;
                }
            }
            CHECK(worst < 1e-5, "decoding step at position %d, head dim %d, %s cache, vs Eq. (1): max |diff| %g", pos0, hd,
                  s.cache_type ? "f16" : "f32", worst);
            CHECK(!memcmp(one, s.att, (size_t)qd * 4), "decoding step at position %d, head dim %d: 1 and 3 threads differ", pos0, hd);
            /* the runs themselves, called directly: what attention_layer gave past one run, and
               within 1e-5 of the one-pass form (attn_causal_task) it replaces */
            AttnTask t = {&m, &s, 1, 1, pos0, 0};
            memset(s.att, 0xff, (size_t)qd * 4);   /* NaN: every output must be written */
            CHECK(attn_split_decode(&t), "decoding step at position %d: the split was refused", pos0);
            if (pos0 >= ATT_SPLIT)
                CHECK(!memcmp(one, s.att, (size_t)qd * 4), "decoding step at position %d, head dim %d: attention_layer did not split", pos0, hd);
            memcpy(one, s.att, (size_t)qd * 4);
            pool_for(s.pool, c->n_kv_heads, attn_causal_task, &t);
            worst = 0;
            for (int i = 0; i < qd; i++) {   /* a NaN left unwritten makes worst NaN, which fails */
                double e = fabs(one[i] - s.att[i]);
                worst = e <= worst ? worst : e;
            }
            CHECK(worst < 1e-5, "decoding step at position %d, head dim %d: runs vs one pass: max |diff| %g", pos0, hd, worst);
        }
        free(s.k), free(s.v), free(s.q), free(s.att), free(s.att_work), free(one), free(out);
        free_pool(p1), free_pool(p3);
    }
}

/* attn_window, the fast path of o_W (Alg. 1 line 6), against attn_partial over [0, sink) and
 * [w0, pos] merged by attn_merge: within 1e-5 (output, sum relative), maxima equal; empty sink;
 * head dims 64 and 20; f32 and f16 caches; W across tiles; 1 and 3 threads give the same bits */
static void test_attn_window(void) {
    int dims[] = {64, 20}, sinks[] = {0, 4, 128}, pos_at[] = {700, 1500, 2999}, win[] = {16, 512, 1000};
    for (int di = 0; di < 2; di++) {
        int hd = dims[di];
        Model m = gqa_shape(hd);
        const Config *c = &m.c;
        int ctx = 3001, nh = c->n_heads, qd = nh * hd;
        Pool *p1 = build_pool(1), *p3 = build_pool(3);
        for (int ct = 0; ct < 2; ct++) {
            State s;
            memset(&s, 0, sizeof s);
            s.ctx = ctx, s.cache_type = ct ? CACHE_K_F16 | CACHE_V_F16 : 0;
            size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
            s.k = malloc(cache * 4), s.v = malloc(cache * 4), s.q = malloc((size_t)qd * 4);
            s.att_work_stride = attn_work_floats(c), s.att_work = malloc(3 * s.att_work_stride * 4);
            float *w1 = malloc((size_t)nh * (hd + 2) * 4), *w3 = malloc((size_t)nh * (hd + 2) * 4);
            float *part = malloc((size_t)2 * nh * (hd + 2) * 4);
            float *o1 = malloc((size_t)hd * 4), *o2 = malloc((size_t)hd * 4), *ref = malloc((size_t)hd * 4);
            fill_cache(&s, cache);
            double worst = 0;
            int same = 1, maxima = 1;
            for (int a = 0; a < 3; a++)
                for (int si = 0; si < 3; si++) {
                    int pos = pos_at[a], sink = sinks[si], w0 = pos + 1 - win[a];
                    for (int i = 0; i < qd; i++) s.q[i] = 2 * frand();
                    s.pool = p1, attn_window(&m, &s, 1, pos, sink, w0, w1, part);
                    s.pool = p3, attn_window(&m, &s, 1, pos, sink, w0, w3, part);
                    same &= !memcmp(w1, w3, (size_t)nh * (hd + 2) * 4);
                    for (int h = 0; h < nh; h++) {
                        Rows K = cache_rows(&s, c, 0, 1, h / 3), V = cache_rows(&s, c, 1, 1, h / 3);
                        float m1, s1, m2, s2, mr, sr, scale = 1.0f / sqrtf((float)hd);
                        attn_partial(s.q + h * hd, K, V, NULL, sink, hd, scale, o1, &m1, &s1);
                        attn_partial(s.q + h * hd, rows_from(K, w0), rows_from(V, w0), NULL, pos + 1 - w0, hd, scale, o2,
                                     &m2, &s2);
                        attn_merge(o1, m1, s1, o2, m2, s2, hd, ref, &mr, &sr);
                        for (int d = 0; d < hd; d++) worst = fmax(worst, fabs(ref[d] - w1[h * hd + d]));
                        worst = fmax(worst, fabs(sr - w1[nh * hd + nh + h]) / sr);
                        maxima &= fabsf(mr - w1[nh * hd + h]) <= 1e-6f * fabsf(mr);
                    }
                }
            CHECK(worst < 1e-5 && maxima && same, "attn_window, head dim %d, %s cache: against attn_partial over W, max "
                  "|diff| %g, maxima equal: %s; 1 and 3 threads the same bits: %s", hd, ct ? "f16" : "f32", worst,
                  maxima ? "yes" : "NO", same ? "yes" : "NO");
            free(s.k), free(s.v), free(s.q), free(s.att_work), free(w1), free(w3), free(part), free(o1), free(o2),
                free(ref);
        }
        free_pool(p1), free_pool(p3);
    }
}

/* exp_neg, the tiled attention's e^x, against expf over the softmax's range [-87, 0] (a grid of
 * 4M points, and the 100K floats just below 0): within 2 ulp; below -87 it gives e^-87; NaN
 * stays NaN */
static int ulps(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
    return ia > ib ? ia - ib : ib - ia;
}

static void test_exp_neg(void) {
    int worst = 0;
    for (int i = 0; i <= 4000000; i++) {
        float x = -87.0f * (float)i / 4000000.0f;
        int u = ulps(exp_neg(x), expf(x));
        worst = u > worst ? u : worst;
    }
    float x = 0;
    for (int i = 0; i < 100000; i++, x = nextafterf(x, -1)) {
        int u = ulps(exp_neg(x), expf(x));
        worst = u > worst ? u : worst;
    }
    int ok = exp_neg(-200.0f) == exp_neg(-87.0f) && exp_neg(-87.0f) > 0 && isnan(exp_neg(NAN));
    CHECK(worst <= 2 && ok, "exp_neg vs expf on [-87, 0]: worst %d ulp (2 allowed); below -87: e^-87; NaN: NaN", worst);
}

/* o_W handed in from outside (attention_w_source), as the GPU path hands it, gives the decoding
 * outputs of W attended on the host. Here o_W is computed by attn_partial over a copy of W kept
 * as the device keeps it: a ring of sink + window slots per layer (position p in slot p below
 * sink, else in slot sink + (p - sink) % window), loaded at the first step, then one store a
 * step; enough steps that the window turns over twice. Checks too that attention_w names the W
 * attend_task uses, and says no for a prefill position. In flat mode and in streaming mode (W
 * alone: nothing retrieved, so the merge must not read o_Omega's unwritten scratch, filled with
 * NaN here before each step). */
typedef struct { const float *out; } WSource;
static const float *w_source_wait(void *arg) { return ((WSource *)arg)->out; }

static int ring_slot(int p, int sink, int window) { return p < sink ? p : sink + (p - sink) % window; }

/* a model with only the shape the attention state reads: 2 layers, 2 KV heads */
static void attention_shape(Model *m, int n_heads, int head_dim) {
    memset(m, 0, sizeof *m);
    m->c.n_layers = 2, m->c.n_heads = n_heads, m->c.n_kv_heads = 2, m->c.head_dim = head_dim;
    m->c.dim = n_heads * head_dim;
}

static void test_w_source(int mode) {
    Model m;
    attention_shape(&m, 6, 32);
    const Config *c = &m.c;
    int n_prompt = 100, n_dec = 40, ctx = n_prompt + n_dec, hd = c->head_dim, nh = c->n_heads, qd = nh * hd;
    int sink = 8, window = 16, n_w = sink + window, group = nh / c->n_kv_heads;
    AttnParams ap = {0};
    ap.mode = mode, ap.sink = sink, ap.window = window, ap.topk = 10, ap.ef = 20;
    Pool *p = build_pool(3);
    State s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx, s.pool = p;
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd, ring = (size_t)c->n_layers * c->n_kv_heads * n_w * hd;
    s.k = malloc(cache * 4), s.v = malloc(cache * 4), s.q = malloc((size_t)qd * 4), s.att = malloc((size_t)qd * 4);
    s.att_work_stride = attn_work_floats(c), s.att_work = malloc(3 * s.att_work_stride * 4);   /* attn_window */
    float *rk = malloc(ring * 4), *rv = malloc(ring * 4), *ref = malloc((size_t)qd * 4);
    float *w = malloc((size_t)nh * (hd + 2) * 4);   /* o_W (nh, hd), maxima (nh), sums (nh) */
    for (size_t i = 0; i < cache; i++) ((float *)s.k)[i] = 2 * frand(), ((float *)s.v)[i] = frand();
    char err[ERR_LEN];
    Attention *A = NULL;
    if (build_attention(&A, &m, &ap, ctx, n_prompt, 3, err)) {
        CHECK(0, "o_W from a source: build_attention: %s", err);
        return;
    }
    attach_attention(&s, A);
    int s0 = 0, w0 = 0, named = !attention_w(A, n_prompt - 1, &s0, &w0), used = 1;
    double worst = 0;
    WSource src = {w};
    for (int pos = n_prompt; pos < ctx; pos++)
        for (int l = 0; l < c->n_layers; l++) {
            for (int i = 0; i < qd; i++) s.q[i] = 2 * frand();
            attention_w_source(A, NULL, NULL);
            attention_layer(&m, &s, l, 1, pos);                 /* W on the host */
            memcpy(ref, s.att, (size_t)qd * 4);
            named &= attention_w(A, pos, &s0, &w0) && s0 == sink && w0 == pos + 1 - window && w0 == A->idx_end;
            int wr = pos + 1 - window;   /* the window's first position, as the device keeps it */
            for (int h = 0; h < c->n_kv_heads; h++) {
                const float *K = (float *)s.k + ((size_t)l * c->n_kv_heads + h) * ctx * hd, *V = (float *)s.v + ((size_t)l * c->n_kv_heads + h) * ctx * hd;
                float *RK = rk + ((size_t)l * c->n_kv_heads + h) * n_w * hd, *RV = rv + ((size_t)l * c->n_kv_heads + h) * n_w * hd;
                for (int q = pos == n_prompt ? 0 : pos; q <= pos; q++)   /* first step: load; then: store */
                    if (q < sink || q >= wr) {
                        memcpy(RK + (size_t)ring_slot(q, sink, window) * hd, K + (size_t)q * hd, (size_t)hd * 4);
                        memcpy(RV + (size_t)ring_slot(q, sink, window) * hd, V + (size_t)q * hd, (size_t)hd * 4);
                    }
            }
            for (int h = 0; h < nh; h++) {
                size_t r = ((size_t)l * c->n_kv_heads + h / group) * n_w * hd;
                attn_partial(s.q + (size_t)h * hd, rows_f32(rk + r, hd), rows_f32(rv + r, hd), NULL, n_w, hd, 1.0f / sqrtf((float)hd),
                             w + (size_t)h * hd, &w[(size_t)nh * hd + h], &w[(size_t)nh * hd + nh + h]);
            }
            attention_w_source(A, w_source_wait, &src);
            for (size_t i = 0; i < (size_t)A->nthreads * A->work_stride; i++) A->work[i] = NAN;
            attention_layer(&m, &s, l, 1, pos);                 /* o_W from the source */
            for (int i = 0; i < qd; i++) worst = isfinite(s.att[i]) ? fmax(worst, fabs(s.att[i] - ref[i])) : INFINITY;
            memset(w, 0, (size_t)qd * 4);                       /* a wrong o_W must show */
            attention_layer(&m, &s, l, 1, pos);
            double moved = 0;
            for (int i = 0; i < qd; i++) moved = fmax(moved, fabs(s.att[i] - ref[i]));
            used &= moved > 1e-3;
        }
    const char *mname = mode == ATTN_STREAMING ? "streaming" : "flat";
    CHECK(named, "%s: attention_w: W = [0, sink) and [pos + 1 - window, pos] at every decoding step, none at a prefill position", mname);
    CHECK(worst < 1e-5 && used && attention_w_external(A) == 2L * n_dec * c->n_layers,
          "%s: o_W from a source over a ring of W (window turned over %d times): outputs as W on the host, max |diff| %g; "
          "a zeroed o_W moves every step's output: %s; %ld of %d layer steps took it", mname, n_dec / window, worst,
          used ? "yes" : "NO", attention_w_external(A), 2 * n_dec * c->n_layers);
    free_attention(A);
    free(s.k), free(s.v), free(s.q), free(s.att), free(s.att_work), free(rk), free(rv), free(ref), free(w);
    free_pool(p);
}

/* pool_start: every index once, on the workers alone (thread ids 1 .. n-1); pool_for waits for it
 * first (its inputs are pool_start's outputs); with one thread it runs at once on the caller */
typedef struct { int32_t *who, *runs; float *a, *b; } PoolJob;
static void pool_mark(void *arg, int64_t i0, int64_t i1, int thread) {
    PoolJob *j = arg;
    for (int64_t i = i0; i < i1; i++) j->who[i] = thread, j->runs[i]++, j->a[i] = (float)i;
}
static void pool_double(void *arg, int64_t i0, int64_t i1, int thread) {
    PoolJob *j = arg;
    (void)thread;
    for (int64_t i = i0; i < i1; i++) j->b[i] = 2 * j->a[i];
}

static void test_pool_start(void) {
    enum { N = 1000 };
    static int32_t who[N], runs[N];
    static float a[N], b[N];
    PoolJob j = {who, runs, a, b};
    for (int nt = 1; nt <= 4; nt += 3) {
        Pool *p = build_pool(nt);
        int lo = nt == 1 ? 0 : 1, ok = 1, doubled = 1;   /* the threads that may run a chunk */
        for (int round = 0; round < 20; round++) {
            memset(runs, 0, sizeof runs), memset(a, 0, sizeof a), memset(b, 0, sizeof b);
            pool_start(p, N, pool_mark, &j);
            pool_for(p, N, pool_double, &j);
            for (int i = 0; i < N; i++) ok &= runs[i] == 1 && who[i] >= lo && who[i] < nt, doubled &= b[i] == 2.0f * i;
        }
        /* the chunks: pool_for gives thread t [N t / nt, N (t+1) / nt), the caller's thread 0
         * the first; pool_start gives worker t (1..nt-1) its share of nt - 1 */
        int owned = 1;
        pool_for(p, N, pool_mark, &j);
        for (int t = 0; t < nt; t++)
            for (int i = N * t / nt; i < N * (t + 1) / nt; i++) owned &= who[i] == t;
        pool_start(p, N, pool_mark, &j);
        pool_wait(p);
        for (int t = lo; t < nt; t++) {
            int k = t - lo, w = nt - lo;
            for (int i = N * k / w; i < N * (k + 1) / w; i++) owned &= who[i] == t;
        }
        /* two pool_starts back to back: the second waits for the first, and both run whole */
        static int32_t who2[N], runs2[N];
        static float a2[N], b2[N];
        PoolJob j2 = {who2, runs2, a2, b2};
        int both = 1;
        for (int round = 0; round < 20; round++) {
            memset(runs, 0, sizeof runs), memset(runs2, 0, sizeof runs2);
            pool_start(p, N, pool_mark, &j);
            pool_start(p, N, pool_mark, &j2);
            pool_wait(p);
            for (int i = 0; i < N; i++) both &= runs[i] == 1 && runs2[i] == 1;
        }
        memset(runs, 0, sizeof runs);
        pool_start(p, N, pool_mark, &j);   /* left running: free_pool waits for it */
        free_pool(p);
        int waited = 1;
        for (int i = 0; i < N; i++) waited &= runs[i] == 1;
        CHECK(ok && doubled && owned && both && waited, "pool_start with %d threads: each index once, on threads %d..%d: "
              "%s; the pool_for after it saw its outputs: %s; each thread its own chunk: %s; two starts back to back "
              "both whole: %s; free_pool finished a started job: %s", nt, lo, nt - 1, ok ? "yes" : "NO",
              doubled ? "yes" : "NO", owned ? "yes" : "NO", both ? "yes" : "NO", waited ? "yes" : "NO");
    }
}

/* attention_insert_ahead (the GPU path's Alg. 1 line 5, a step early on the workers) leaves every
 * decoding output and every graph as the insertions at the step do (ra_decode_layer), bit for
 * bit. Keys are written to the cache as decoding writes them, one position a step, and the
 * positions not yet written hold NaN, so reading a key before it exists would show. */
static void test_insert_ahead(void) {
    Model m;
    attention_shape(&m, 4, 16);
    const Config *c = &m.c;
    int n_prompt = 400, n_dec = 48, ctx = n_prompt + n_dec + 1, hd = c->head_dim, nh = c->n_heads, qd = nh * hd;
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 5, ap.topk = 16, ap.ef = 32, ap.warm = 1;   /* window < GUIDE_AHEAD */
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1);
    Pool *p = build_pool(3);
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
    float *k = malloc(cache * 4), *v = malloc(cache * 4), *q = malloc((size_t)qd * 4), *qk = malloc((size_t)n_prompt * qd * 4);
    State s[2];
    Attention *A[2] = {NULL, NULL};
    char err[ERR_LEN];
    for (size_t i = 0; i < cache; i++) k[i] = v[i] = NAN;
    for (int i = 0; i < 2; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].ctx = ctx, s[i].pool = p, s[i].k = k, s[i].v = v, s[i].q = q, s[i].q_keep = qk, s[i].q_keep_n = n_prompt;
        s[i].att = malloc((size_t)qd * 4);
        s[i].att_work_stride = attn_work_floats(c), s[i].att_work = malloc(3 * s[i].att_work_stride * 4);
        if (build_attention(&A[i], &m, &ap, ctx, n_prompt, 3, err)) {
            CHECK(0, "insert ahead: build_attention: %s", err);
            return;
        }
        attach_attention(&s[i], A[i]);
    }
    /* the prefill: keys, values and queries of every layer, the indexes built from them */
    for (int l = 0; l < c->n_layers; l++) {
        for (int h = 0; h < c->n_kv_heads; h++)
            for (size_t i = 0; i < (size_t)n_prompt * hd; i++) {
                size_t at = ((size_t)l * c->n_kv_heads + h) * ctx * hd + i;
                k[at] = 2 * frand(), v[at] = frand();
            }
        for (size_t i = 0; i < (size_t)n_prompt * qd; i++) qk[i] = 2 * frand() + 0.5f;
        for (int i = 0; i < 2; i++) s[i].layer_done(s[i].layer_arg, l, 0, n_prompt);
    }
    for (int i = 0; i < 2; i++) attention_prefill_done(A[i], NULL, NULL), attention_wait_build(A[i]);
    int same = 1, early = 1, graphs = 1, cap = A[1]->ra[0].cap;
    int last = n_prompt + n_dec - 1;   /* the last step taken; the context holds one more */
    for (int pos = n_prompt; pos <= last; pos++)
        for (int l = 0; l < c->n_layers; l++) {
            for (int h = 0; h < c->n_kv_heads; h++)   /* the step's new key and value (cache_store) */
                for (int d = 0; d < hd; d++) {
                    size_t at = (((size_t)l * c->n_kv_heads + h) * ctx + pos) * hd + d;
                    k[at] = 2 * frand(), v[at] = frand();
                }
            for (int i = 0; i < qd; i++) q[i] = 2 * frand() + 0.5f;
            attention_layer(&m, &s[0], l, 1, pos);   /* insertions at the step */
            attention_layer(&m, &s[1], l, 1, pos);
            if (pos == last)   /* both hold the keys up to this step's W, the last step's graphs */
                for (int h = 0; h < nh; h++) {
                    const RAIndex *x = &A[0]->ra[(size_t)l * nh + h], *y = &A[1]->ra[(size_t)l * nh + h];
                    graphs &= same_graph(x, y) && x->cap == cap && y->cap == cap;
                }
            attention_insert_ahead(A[1], &s[1], l, pos);   /* the next step's, now */
            same &= !memcmp(s[0].att, s[1].att, (size_t)qd * 4);
            if (pos == last && l == c->n_layers - 1) continue;   /* left running: free_attention waits for it */
            pool_wait(p);
            for (int h = 0; h < nh; h++)
                early &= A[1]->ra[(size_t)l * nh + h].n == pos + 2 - ap.window - ap.sink &&
                         A[0]->ra[(size_t)l * nh + h].n == pos + 1 - ap.window - ap.sink;
        }
    CHECK(same && graphs && early, "insertions a step ahead (%d steps, window %d): the same outputs bit for bit: %s; "
          "the same graphs, within the planned capacity: %s; each index a key ahead after each step: %s", n_dec, ap.window,
          same ? "yes" : "NO", graphs ? "yes" : "NO", early ? "yes" : "NO");
    /* at the context's last position there is no next step: nothing is inserted (a key past the
       plan would make every index of the layer grow to twice its capacity) */
    int before = A[0]->layer_end[0];
    attention_insert_ahead(A[0], &s[0], 0, ctx - 1);
    CHECK(A[0]->layer_end[0] == before && !A[0]->async.inserting, "no insertion ahead at the context's last position");
    for (int i = 0; i < 2; i++) free_attention(A[i]), free(s[i].att), free(s[i].att_work);
    free(k), free(v), free(q), free(qk);
    free_pool(p);
}

/* An attention state over a random prefill, for the decoding tests below: keys and values of
 * every position, the prefill's queries, the indexes built from them (layer_done). s->q and
 * s->att hold `rows` rows. NULL (and a failed check) when build_attention refuses. */
static Attention *attention_case(State *s, const Model *m, const AttnParams *ap, int ctx, int n_prompt, int rows, Pool *p) {
    const Config *c = &m->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->pool = p, s->cache_type = case_cache_type;
    s->k = malloc(cache * 4), s->v = malloc(cache * 4), s->q = malloc((size_t)rows * qd * 4), s->att = malloc((size_t)rows * qd * 4);
    s->q_keep = malloc((size_t)n_prompt * qd * 4), s->q_keep_n = n_prompt;
    s->att_work_stride = attn_work_floats(c);
    s->att_work = malloc(3 * s->att_work_stride * 4);
    fill_cache(s, cache);
    Attention *A = NULL;
    char err[ERR_LEN];
    if (build_attention(&A, m, ap, ctx, n_prompt, 3, err)) {
        CHECK(0, "build_attention: %s", err);
        return NULL;
    }
    attach_attention(s, A);
    for (int l = 0; l < c->n_layers; l++) {
        for (size_t i = 0; i < (size_t)n_prompt * qd; i++) s->q_keep[i] = 2 * frand() + 0.5f;
        s->layer_done(s->layer_arg, l, 0, n_prompt);
    }
    attention_prefill_done(A, NULL, NULL);
    attention_wait_build(A);   /* every index takes over before the first step */
    return A;
}

static void free_attention_case(State *s, Attention *A) {
    free_attention(A);
    free(s->k), free(s->v), free(s->q), free(s->att), free(s->q_keep), free(s->att_work);
}

/* the largest |difference| of layer l's output rows (n of them, at positions pos..) from
 * Eq. (1) over every key before each; a row left NaN counts as infinite */
static double diff_eq1(const Model *m, const State *s, int l, int n, int pos) {
    const Config *c = &m->c;
    int hd = c->head_dim, nh = c->n_heads, qd = nh * hd, group = nh / c->n_kv_heads;
    float out[256];
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            attn_full(s->q + (size_t)t * qd + h * hd, cache_rows(s, c, 0, l, h / group), cache_rows(s, c, 1, l, h / group),
                      pos + t + 1, hd, 1.0f / sqrtf((float)hd), out);
            for (int d = 0; d < hd; d++) {
                double e = fabs(out[d] - s->att[(size_t)t * qd + h * hd + d]);
                if (isnan(e)) e = INFINITY;
                if (e > worst) worst = e;
            }
        }
    return worst;
}

/* one decoding step of every layer at pos, random queries; the worst difference from Eq. (1) */
static double decode_step_eq1(const Model *m, State *s, int pos) {
    int qd = m->c.n_heads * m->c.head_dim;
    double worst = 0;
    for (int l = 0; l < m->c.n_layers; l++) {
        for (int i = 0; i < qd; i++) s->q[i] = 2 * frand() + 0.5f;
        attention_layer(m, s, l, 1, pos);
        double e = diff_eq1(m, s, l, 1, pos);
        if (e > worst) worst = e;
    }
    return worst;
}

/* Several tokens past the prompt at once (a continuation after decoding steps): each row attends
 * to every key before it exactly (Eq. 1), and the next decoding step inserts the continuation's
 * keys that left the window, so the indexes catch up. A decoding step's search computes row 0
 * only, so a continuation taken for one would leave rows 1.. stale. */
static void test_continuation(void) {
    Model m;
    attention_shape(&m, 4, 16);
    const Config *c = &m.c;
    int n_prompt = 120, n_dec = 3, n_cont = 5, ctx = n_prompt + n_dec + n_cont + 1, qd = c->n_heads * c->head_dim;
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 8, ap.topk = 16, ap.ef = 32, ap.warm = 1;
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1);
    Pool *p = build_pool(3);
    State s;
    Attention *A = attention_case(&s, &m, &ap, ctx, n_prompt, n_cont, p);
    if (!A) return;
    int pos = n_prompt;
    for (; pos < n_prompt + n_dec; pos++) decode_step_eq1(&m, &s, pos);   /* retrieval: not Eq. (1) */
    double worst = 0;   /* the continuation: n_cont tokens at pos, against Eq. (1) per row */
    for (int l = 0; l < c->n_layers; l++) {
        for (int i = 0; i < n_cont * qd; i++) s.q[i] = 2 * frand() + 0.5f, s.att[i] = NAN;
        attention_layer(&m, &s, l, n_cont, pos);
        double e = diff_eq1(&m, &s, l, n_cont, pos);
        if (e > worst) worst = e;
    }
    pos += n_cont;
    decode_step_eq1(&m, &s, pos);   /* one more decoding step: every key that left W is indexed */
    int caught_up = 1, finite = 1;
    for (int i = 0; i < qd; i++) finite &= isfinite(s.att[i]);
    for (int i = 0; i < c->n_layers * c->n_heads; i++) caught_up &= A->ra[i].n == pos + 1 - ap.window - ap.sink;
    CHECK(worst < 1e-5 && caught_up && finite, "%d tokens at once after %d decoding steps (ra): every row as Eq. (1), "
          "max |diff| %g; the next step indexes the keys that left W: %s, its output finite: %s", n_cont, n_dec, worst,
          caught_up ? "yes" : "NO", finite ? "yes" : "NO");
    free_attention_case(&s, A);
    free_pool(p);
}

/* A prompt barely past sink + window, 5 keys indexed: with topk and nprobe over the index, every
 * retrieval mode's decoding steps attend every key, as Eq. (1). (IVF once asked 4 sqrt(n)
 * lists, more than n below 16 keys: the build refused and the indexed keys were never found.) */
static void test_few_keys(void) {
    Model m;
    attention_shape(&m, 4, 16);
    int modes[] = {ATTN_FLAT, ATTN_IVF, ATTN_RA}, n_prompt = 4 + 8 + 5, n_dec = 4, ctx = n_prompt + n_dec;
    const char *names[] = {"flat", "ivf", "ra"};
    Pool *p = build_pool(3);
    for (int i = 0; i < 3 * 4; i++) {   /* each mode with each cache type (-ctk, -ctv) */
        AttnParams ap = {0};
        case_cache_type = i / 3;
        ap.mode = modes[i % 3], ap.sink = 4, ap.window = 8, ap.topk = 16, ap.ef = 32, ap.warm = 1, ap.nprobe = 64;
        ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1);
        State s;
        Attention *A = attention_case(&s, &m, &ap, ctx, n_prompt, 1, p);
        if (!A) continue;
        double worst = 0;
        for (int pos = n_prompt; pos < ctx; pos++) {
            double e = decode_step_eq1(&m, &s, pos);
            if (e > worst) worst = e;
        }
        CHECK(worst < 1e-5, "--attn %s over 5 indexed keys, %d steps, topk and nprobe over them, keys %s, values %s: as Eq. (1) "
              "over the cache, max |diff| %g", names[i % 3], n_dec, case_cache_type & CACHE_K_F16 ? "f16" : "f32",
              case_cache_type & CACHE_V_F16 ? "f16" : "f32", worst);
        free_attention_case(&s, A);
    }
    case_cache_type = 0;
    free_pool(p);
}

/* The tests on the real model: ThreadSanitizer makes its prefills take minutes, and the builds'
 * threads are its subject in test_builds_beside; make test runs them */
static int real_model_skipped(const char *what) {
#ifdef __SANITIZE_THREAD__
    printf("%s: skipped under ThreadSanitizer (make test runs it)\n", what);
    return 1;
#else
    (void)what;
    return 0;
#endif
}

/* the default model and data/passkey.txt's tokens (at most cap) for the tests on a real prompt;
 * the token count, or -1 (a failed check) when the model does not load */
static int load_passkey(Model *m, int32_t *ids, int cap, const char *what) {
    char err[ERR_LEN];
    if (build_model(m, "data/SmolLM2-135M-Instruct.Q4_1.gguf", err)) {
        CHECK(0, "%s: the default model: %s", what, err);
        return -1;
    }
    static char text[65536];
    FILE *f = fopen("data/passkey.txt", "rb");
    size_t len = f ? fread(text, 1, sizeof text, f) : 0;
    if (f) fclose(f);
    return tokenizer_encode(&m->tok, text, len, 1, 0, ids, cap);
}

/* ra on a real prompt, small: W of 16 + 64, topk 50, the build's defaults */
static AttnParams real_prompt_params(int cache_type) {
    AttnParams ap = {0};
    RAParams rd = ra_default_params();
    ap.mode = ATTN_RA, ap.sink = 16, ap.window = 64, ap.topk = 50, ap.warm = 1, ap.cache_type = cache_type;
    ap.nq_knn = rd.nq_knn, ap.max_degree = rd.max_degree, ap.q_stride = rd.q_stride;
    ap.ef_conn = ra_default_ef_conn(rd.q_stride);
    return ap;
}

/* Alg. 1's plain step (ra_step_head) is the oracle of the decoding step (ra_decode_layer and its
 * tasks). On a real prompt, the default model's, every query head of every layer at each step
 * runs both, first scanning exactly (builds held), then each from a copy of the same built index:
 * the same Omega (ids and order), the same graphs, key by key, and the same output within 1e-5
 * relative (o_W: the tiled kernel sums in its own order). */
typedef struct {
    Attention *A;
    HeadStep *hs;               /* (n_layers, n_heads) the oracle's heads */
    int32_t *prev;              /* (n_layers, n_heads, topk) their seeds */
    SearchScratch scratch;
    long heads, same_ids, same_bits;
    double worst;
    /* --trace: the fast path's record of the traced head (trace_hook), and the comparisons */
    StepTrace fast;
    ExactCheck fast_ex;
    int32_t *fast_scored;       /* (ctx) */
    double *audit_prev;         /* (n_layers, n_heads) the audit's recall sums after the last step */
    long traced, same_trace, same_scored, invariants, builds_traced;
    double trace_worst;
} StepOracle;

/* attention_trace's step hook: the fast path's record of the traced head */
static void trace_hook(void *arg, const StepRecord *r) {
    StepOracle *o = arg;
    o->fast = r->st, o->fast_ex = r->ex;
    memcpy(o->fast_scored, r->scored, (size_t)r->st.n_scored * 4);
}

static void trace_build_hook(void *arg, int layer, int head, const RAIndex *ix) {
    (void)layer, (void)head, (void)ix;
    ((StepOracle *)arg)->builds_traced++;
}

static double rel_diff(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1); }

/* The oracle's trace of a step against the fast path's: the same counts, ids and scored keys;
 * the sums within 1e-5 (o_W's order). Its invariants: gamma1 + gamma2 = 1, o_t = Eq. (4) from
 * the partials it reports, the audit's recall for the head and step. */
static void compare_trace(StepOracle *o, const StepTrace *tr, const SearchScratch *s, const HeadView *hv, int hd,
                          double audit_recall) {
    const StepTrace *f = &o->fast;
    int sink = o->A->p.sink, n = 0, same = 1;
    for (int i = 0; i < tr->n_h; i++)   /* the oracle's scored keys: its search's marks, or all of H */
        if (!tr->indexed || s->mark[i] == s->epoch) same &= n < f->n_scored && o->fast_scored[n++] == sink + i;
    o->same_scored += same && n == f->n_scored && n == tr->n_scored;
    double w = 0;
    w = fmax(w, rel_diff(tr->z_w, f->z_w)), w = fmax(w, rel_diff(tr->s_w, f->s_w));
    w = fmax(w, rel_diff(tr->g1, f->g1)), w = fmax(w, rel_diff(tr->g2, f->g2));
    o->trace_worst = fmax(o->trace_worst, w);
    o->same_trace += tr->pos == f->pos && tr->idx_end == f->idx_end && tr->indexed == f->indexed &&
                     tr->ins_first == f->ins_first && tr->n_ins == f->n_ins && tr->ins_out == f->ins_out &&
                     tr->ins_in == f->ins_in && tr->n_w == f->n_w && tr->ef == f->ef && tr->entry == f->entry &&
                     tr->n_seeds == f->n_seeds && tr->hops == f->hops && tr->n_scored == f->n_scored &&
                     tr->n_h == f->n_h && tr->n_omega == f->n_omega && tr->z_omega == f->z_omega &&
                     tr->s_omega == f->s_omega && w <= 1e-5;
    /* Eq. (4) from the fast path's own partials: o_W from the kernel's (z~1, sum) and o_Omega */
    float scale = 1.0f / sqrtf((float)hd), o_w[HEAD_DIM_MAX], o_om[HEAD_DIM_MAX], z, sm, merged[HEAD_DIM_MAX];
    attn_partial(hv->q, hv->K, hv->V, NULL, sink, hd, scale, o_w, &z, &sm);
    float o2[HEAD_DIM_MAX], z2, s2;
    attn_partial(hv->q, rows_from(hv->K, (size_t)f->idx_end), rows_from(hv->V, (size_t)f->idx_end), NULL,
                 f->pos + 1 - f->idx_end, hd, scale, o2, &z2, &s2);
    attn_merge(o_w, z, sm, o2, z2, s2, hd, o_w, &z, &sm);
    attn_partial(hv->q, hv->K, hv->V, o->A->omega + (size_t)o->A->p.trace_head * o->A->p.topk, f->n_omega, hd,
                 scale, o_om, &z2, &s2);
    for (int i = 0; i < hd; i++) merged[i] = f->g1 * o_w[i] + f->g2 * o_om[i];
    double num = 0, den = 0;
    for (int i = 0; i < hd; i++) num += (merged[i] - hv->out[i]) * (merged[i] - hv->out[i]), den += hv->out[i] * hv->out[i];
    o->invariants += fabs(f->g1 + f->g2 - 1) <= 1e-6 && sqrt(num / (den > 0 ? den : 1)) <= 1e-5 &&
                     rel_diff(z, f->z_w) <= 1e-5 && rel_diff(sm, f->s_w) <= 1e-5 && z2 == f->z_omega &&
                     s2 == f->s_omega && fabs(o->fast_ex.recall - audit_recall) <= 1e-9;
    o->traced++;
}

static void step_oracle_layer(void *arg, int layer, int pos0, int n) {
    State *s = arg;
    StepOracle *o = s->progress_arg;
    attention_layer_done(s, layer, pos0, n);
    const Config *c = &o->A->m->c;
    if (n != 1 || layer_sliding(c, layer)) return;
    for (int h = 0; h < c->n_heads; h++) {
        HeadView hv = head_view(&(StepTask){o->A, s, layer, pos0, NULL}, h);
        StepTrace tr;
        int is_traced = traced(o->A, layer, h), same, bits;
        size_t ih = (size_t)layer * c->n_heads + h;
        double audit_recall = o->A->st.audit[ih].recall - o->audit_prev[ih];   /* this step's */
        o->audit_prev[ih] = o->A->st.audit[ih].recall;
        double e = oracle_head(o->A, s, layer, pos0, h, &o->hs[ih], &o->scratch, is_traced ? &tr : NULL, &same, &bits);
        if (is_traced) compare_trace(o, &tr, &o->scratch, &hv, c->head_dim, audit_recall);
        o->heads++, o->same_ids += same, o->same_bits += bits;
        o->worst = e > o->worst ? e : o->worst;
    }
}

/* every index's build counts (BuildTrace) against its graph: 1 when they add up */
static int build_counts_add_up(const Attention *A) {
    const Config *c = &A->m->c;
    int ok = 1, listed = 0;   /* listed: indexes that kept step (d)'s keys (the traced one alone) */
    for (int i = 0; i < c->n_layers * c->n_heads; i++) {
        const RAIndex *ix = &A->ra[i];
        const BuildTrace *b = &ix->bt;
        long edges = 0;
        for (int v = 0; v < ix->n; v++) edges += ix->deg[v];
        int nq = A->p.nq_knn < ix->n ? A->p.nq_knn : ix->n;
        ok &= b->b_edges + b->c_added + b->d_net == edges && b->a_links == (long)ix->n_query * nq &&
              b->a_keys <= ix->n && b->a_keys > 0 && b->b_linked <= ix->n && b->b_deg_max <= ix->M &&
              b->b_edges <= b->b_cand && b->c_added >= 0 && ix->n_searched <= ix->n_repaired;
        int searched = 0;
        for (int j = 0; b->d_keys && j < ix->n_repaired; j++) searched += b->d_keys[j] < 0;
        ok &= !b->d_keys || searched == ix->n_searched;
        listed += b->d_keys != NULL;
    }
    return ok && listed == 1;
}

static void test_step_head(int cache_type) {
    if (real_model_skipped("ra_step_head against the decoding step")) return;
    Model m;
    char err[ERR_LEN] = "";
    int32_t ids[1024];
    int n_prompt = 700, n_dec = 24, n_exact = 6, nt = load_passkey(&m, ids, 1024, "ra_step_head");
    if (nt < 0) return;
    const Config *c = &m.c;
    AttnParams ap = real_prompt_params(cache_type);
    ap.audit = ap.trace = 1;   /* --audit, and --trace of a head that changes at each step */
    Pool *p = build_pool(2);
    State s;
    Attention *A = NULL;
    if (nt < n_prompt + n_dec || build_state(&s, &m, n_prompt + n_dec, 256, cache_type, p, err) ||
        build_attention(&A, &m, &ap, n_prompt + n_dec, n_prompt, 2, err)) {
        CHECK(0, "ra_step_head: data/passkey.txt's %d tokens, or the state: %s", nt, err);
        free_pool(p), free_model(&m);
        return;
    }
    attach_attention(&s, A);
    s.q_keep = malloc((size_t)n_prompt * c->n_heads * c->head_dim * 4), s.q_keep_n = n_prompt;   /* all */
    attention_hold_build(A, 1);   /* the first steps scan exactly, the oracle's too (ix NULL) */
    float *logits = forward(&m, &s, ids, n_prompt);
    attention_prefill_done(A, NULL, NULL);
    StepOracle o = {.A = A, .hs = calloc((size_t)c->n_layers * c->n_heads, sizeof(HeadStep)),
                    .prev = malloc((size_t)c->n_layers * c->n_heads * ap.topk * 4)};
    o.fast_scored = malloc((size_t)(n_prompt + n_dec) * 4);
    o.audit_prev = calloc((size_t)c->n_layers * c->n_heads, sizeof(double));
    attention_trace(A, trace_build_hook, trace_hook, &o);
    build_search_scratch(&o.scratch);
    RAIndex *copies = calloc((size_t)c->n_layers * c->n_heads, sizeof *copies);
    for (int i = 0; i < c->n_layers * c->n_heads; i++)
        o.hs[i].idx_end = A->idx_end, o.hs[i].prev = o.prev + (size_t)i * ap.topk;
    s.layer_done = step_oracle_layer, s.progress_arg = &o;
    int counts = 0;
    for (int t = 0; t < n_dec && logits; t++) {   /* the prompt's text goes on: its tokens are fed */
        A->p.trace_layer = 3, A->p.trace_head = 2;   /* the build traced: (3, 2) */
        if (t == n_exact) {   /* the indexes take over, the oracle's from copies of them */
            attention_hold_build(A, 0);
            attention_wait_build(A);
            counts = build_counts_add_up(A);
            for (int i = 0; i < c->n_layers * c->n_heads; i++)
                if (!layer_sliding(c, i / c->n_heads)) copy_index(&copies[i], &A->ra[i], c->head_dim), o.hs[i].ix = &copies[i];
        }
        A->p.trace_layer = (t * 7 + 3) % c->n_layers, A->p.trace_head = (t * 5 + 1) % c->n_heads;
        logits = forward(&m, &s, ids + n_prompt + t, 1);
    }
    check(o.traced == n_dec && o.same_trace == n_dec && o.same_scored == n_dec,
          "--trace: the step of ra_step_head against the decoding step's, a (layer, head) each step, %d steps: %ld "
          "traced, %ld the same (every count and id; the sums within %.1e, 1e-5), %ld with the same keys scored",
          n_dec, o.traced, o.same_trace, o.trace_worst, o.same_scored);
    check(o.invariants == n_dec,
          "--trace's invariants, %d steps: gamma1 + gamma2 = 1, o_t is Eq. (4) of the partials it reports (their z~ "
          "and sums recomputed), its recall is the audit's: %ld of %d", n_dec, o.invariants, n_dec);
    check(o.builds_traced == 1 && counts,
          "--trace's build: reported once for the traced head (%ld); every index's counts add up: (b) + (c) + (d) "
          "edges = the graph's, (a) links = queries x Nq, degrees within M, the traced one's (d) keys by their way: %s", o.builds_traced, counts ? "yes" : "NO");
    free(o.fast_scored), free(o.audit_prev);
    int graphs = 1;
    for (int i = 0; i < c->n_layers * c->n_heads; i++)
        if (o.hs[i].ix) graphs &= same_graph(o.hs[i].ix, &A->ra[i]) && copies[i].n == n_prompt + n_dec - 1 - ap.window - ap.sink + 1;
    long want = (long)n_dec * c->n_layers * c->n_heads;
    check(logits && o.heads == want && o.same_ids == want && graphs && o.worst <= 1e-5,
          "Alg. 1's plain step (ra_step_head) against the decoding step, the default model on data/passkey.txt's first "
          "%d tokens, %s cache, %d steps (the first %d before the indexes take over): %ld of %ld (step, layer, head) "
          "with the same Omega in the same order, the "
          "graphs grown edge for edge: %s; outputs within %.1e relative (1e-5; bit for bit: %ld)", n_prompt,
          cache_type ? "f16" : "f32", n_dec, n_exact, o.same_ids, o.heads, graphs ? "yes" : "NO", o.worst, o.same_bits);
    for (int i = 0; i < c->n_layers * c->n_heads; i++)
        if (o.hs[i].ix) free_ra_index(&copies[i]);
    free(copies), free(o.hs), free(o.prev), free_search_scratch(&o.scratch);
    free(s.q_keep), s.q_keep = NULL;
    free_attention(A), free_state(&s), free_pool(p), free_model(&m);
}

/* ./ra --reference's decoding (reference_decode_layer: ra_step_head a head at a time) against the
 * default path's: each run greedy from the same prompt, its indexes built alike. The same tokens;
 * the same Omega where the queries are the same bits, and otherwise (o_W's sums in another order
 * change the next layers' queries in their last bits) the same keys in 98% of (step, layer, head)
 * at least, and never more than one key apart. */
enum { REF_STEPS = 16, REF_TOPK = 50 };   /* REF_TOPK: real_prompt_params' topk */
typedef struct {
    Attention *A;
    int32_t *ids;   /* (REF_STEPS, n_layers, n_heads, REF_TOPK) each Omega, sorted */
    int *n;         /* (REF_STEPS, n_layers, n_heads) */
    int step;
} OmegaLog;

static int cmp_id(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

static void omega_log_layer(void *arg, int layer, int pos0, int n) {
    State *s = arg;
    OmegaLog *g = s->progress_arg;
    attention_layer_done(s, layer, pos0, n);
    const Config *c = &g->A->m->c;
    if (n != 1 || layer_sliding(c, layer) || g->step >= REF_STEPS) return;
    for (int h = 0; h < c->n_heads; h++) {
        size_t at = ((size_t)g->step * c->n_layers + layer) * c->n_heads + h;
        g->n[at] = g->A->n_omega[h];
        memcpy(g->ids + at * REF_TOPK, g->A->omega + (size_t)h * REF_TOPK, (size_t)g->n[at] * 4);
        qsort(g->ids + at * REF_TOPK, (size_t)g->n[at], 4, cmp_id);
    }
}

/* greedy decoding of REF_STEPS tokens after the prompt ids[0..n_prompt), every index built first;
 * tokens into out, each Omega into g. 0 when a state could not be built. */
static int reference_run(Model *m, const int32_t *ids, int n_prompt, int reference, int32_t *out, OmegaLog *g) {
    const Config *c = &m->c;
    char err[ERR_LEN] = "";
    AttnParams ap = real_prompt_params(CACHE_K_F16 | CACHE_V_F16);   /* topk REF_TOPK */
    Pool *p = build_pool(2);
    State s;
    if (build_state(&s, m, n_prompt + REF_STEPS + 1, 256, ap.cache_type, p, err) ||
        build_attention(&g->A, m, &ap, n_prompt + REF_STEPS + 1, n_prompt, 2, err)) {
        CHECK(0, "--reference run: %s", err);
        free_pool(p);
        return 0;
    }
    attach_attention(&s, g->A);
    s.q_keep = malloc((size_t)n_prompt * c->n_heads * c->head_dim * 4), s.q_keep_n = n_prompt;   /* all */
    float *logits = forward(m, &s, ids, n_prompt);
    attention_prefill_done(g->A, NULL, NULL);
    attention_wait_build(g->A);
    g->A->p.reference = reference;   /* the builds alike (their KNN's plain twin: test_index) */
    s.layer_done = omega_log_layer, s.progress_arg = g;
    for (g->step = 0; g->step < REF_STEPS && logits; g->step++) {
        out[g->step] = argmax_first(logits, c->vocab_size);
        logits = forward(m, &s, &out[g->step], 1);
    }
    free(s.q_keep), s.q_keep = NULL;
    free_attention(g->A), free_state(&s), free_pool(p);
    return logits != NULL;
}

static void test_reference_run(void) {
    if (real_model_skipped("--reference against the default decoding")) return;
    Model m;
    int32_t ids[1024], tok[2][REF_STEPS];
    int n_prompt = 700, nt = load_passkey(&m, ids, 1024, "--reference");
    if (nt < 0) return;
    size_t sets = (size_t)REF_STEPS * m.c.n_layers * m.c.n_heads;
    OmegaLog g[2];
    int ran = nt >= n_prompt;
    for (int r = 0; r < 2; r++) {
        g[r] = (OmegaLog){NULL, calloc(sets * REF_TOPK, 4), calloc(sets, sizeof(int)), 0};
        ran = ran && reference_run(&m, ids, n_prompt, r, tok[r], &g[r]);
    }
    long same = 0, compared = 0, apart = 0;
    for (size_t i = 0; ran && i < sets; i++) {
        if (layer_sliding(&m.c, (int)(i / m.c.n_heads % m.c.n_layers))) continue;
        const int32_t *a = g[0].ids + i * REF_TOPK, *b = g[1].ids + i * REF_TOPK;
        int na = g[0].n[i], nb = g[1].n[i], common = 0;
        for (int x = 0, y = 0; x < na && y < nb;)   /* both sorted */
            if (a[x] == b[y]) common++, x++, y++;
            else if (a[x] < b[y]) x++;
            else y++;
        compared++;
        same += na == nb && common == na;
        apart = na - common > apart ? na - common : apart;
    }
    int same_text = ran && !memcmp(tok[0], tok[1], sizeof tok[0]);
    check(ran && same_text && compared == (long)REF_STEPS * global_layers(&m.c) * m.c.n_heads && same >= 0.98 * compared &&
              apart <= 1,
          "--reference (ra_step_head a head at a time) against the default decoding, %d greedy tokens after data/"
          "passkey.txt's first %d: the same tokens: %s; the same keys retrieved in %ld of %ld (step, layer, head), "
          "at most %ld apart (98%% and 1)", REF_STEPS, n_prompt, same_text ? "yes" : "NO", same, compared, apart);
    for (int r = 0; r < 2; r++) free(g[r].ids), free(g[r].n);
    free_model(&m);
}

/* --audit's sums after one ra decoding step, against their definitions recomputed here in
 * double from the cache, the step's queries and the set it retrieved (A->omega): the step's
 * output is Eq. (4)-(5), the softmax over W and Omega alone; recall@k is the share of the
 * exact top-k indexed keys (by q.k) in Omega; the attention masses of W and Omega are their
 * shares of the softmax over every key (Eq. 1); the error is ||o - o_exact|| / ||o_exact||. */
static void test_audit(void) {
    Model m;
    attention_shape(&m, 4, 16);
    const Config *c = &m.c;
    int n_prompt = 120, pos = n_prompt, ctx = n_prompt + 1, hd = c->head_dim, nh = c->n_heads, group = nh / c->n_kv_heads;
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 8, ap.topk = 6, ap.ef = 12, ap.warm = 1, ap.audit = 1;
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1);
    Pool *p = build_pool(3);
    State s;
    Attention *A = attention_case(&s, &m, &ap, ctx, n_prompt, 1, p);
    if (!A) return;
    double e_merge = 0, e_recall = 0, e_mass = 0, e_err = 0, err_min = INFINITY;
    double z[128], w[128];
    for (int l = 0; l < c->n_layers; l++) {
        for (int i = 0; i < nh * hd; i++) s.q[i] = 2 * frand() + 0.5f;
        attention_layer(&m, &s, l, 1, pos);
        for (int h = 0; h < nh; h++) {
            const float *q = s.q + (size_t)h * hd, *o = s.att + (size_t)h * hd;
            const float *K = layer_k(&s, c, l, h / group).data, *V = layer_v(&s, c, l, h / group).data;
            const int32_t *f = A->omega + (size_t)h * ap.topk;
            int nf = A->n_omega[h], n_idx = A->idx_end - ap.sink, k = ap.topk < n_idx ? ap.topk : n_idx;
            double mx = -INFINITY, sum = 0, mass_w = 0, mass_o = 0, sum_s = 0;
            for (int i = 0; i <= pos; i++) {
                z[i] = 0;
                for (int d = 0; d < hd; d++) z[i] += (double)q[d] * K[(size_t)i * hd + d];
                z[i] /= sqrt((double)hd);
                mx = z[i] > mx ? z[i] : mx;
            }
            for (int i = 0; i <= pos; i++) sum += w[i] = exp(z[i] - mx);
            int in_s[128] = {0};   /* W and Omega: the set the step attended */
            for (int i = 0; i <= pos; i++) if (i < ap.sink || i >= A->idx_end) in_s[i] = 1, mass_w += w[i] / sum;
            for (int j = 0; j < nf; j++) in_s[f[j]] = 1, mass_o += w[f[j]] / sum;
            int hit = 0;   /* recall@k: indexed keys ranked by score, ties to the lower position */
            for (int i = ap.sink; i < A->idx_end; i++) {
                int rank = 0;
                for (int j = ap.sink; j < A->idx_end; j++) rank += z[j] > z[i] || (z[j] == z[i] && j < i);
                if (rank < k)
                    for (int j = 0; j < nf; j++) hit += f[j] == i;
            }
            double oe[64] = {0}, os[64] = {0}, dm = 0;
            for (int i = 0; i <= pos; i++) {
                if (in_s[i]) sum_s += w[i];
                for (int d = 0; d < hd; d++) {
                    oe[d] += w[i] / sum * V[(size_t)i * hd + d];
                    if (in_s[i]) os[d] += w[i] * V[(size_t)i * hd + d];
                }
            }
            for (int d = 0; d < hd; d++) dm = fmax(dm, fabs(o[d] - os[d] / sum_s));
            AuditSum *a = &A->st.audit[(size_t)l * nh + h];
            double err = rel_err(o, oe, hd);
            e_merge = fmax(e_merge, isnan(dm) ? INFINITY : dm);
            e_recall = fmax(e_recall, a->n == 1 ? fabs(a->recall - (double)hit / k) : INFINITY);
            e_mass = fmax(e_mass, fmax(fabs(a->mass_w - mass_w), fabs(a->mass_omega - mass_o)));
            e_err = fmax(e_err, fabs(a->err - err) / err);
            err_min = fmin(err_min, err);
        }
    }
    CHECK(e_merge < 1e-5 && e_recall < 1e-12 && e_mass < 1e-5 && e_err < 1e-4 && err_min > 1e-3,
          "--audit after an ra step (topk 6 of %d indexed keys): the output as Eq. (4)-(5) over W and Omega "
          "(max |diff| %.1e), recall@k (%.1e), attention masses (%.1e) and output error (rel %.1e; errors from "
          "%.3f) as defined", A->idx_end - ap.sink, e_merge, e_recall, e_mass, e_err, err_min);
    free_attention_case(&s, A);
    free_pool(p);
}

/* s->layer_done(layer 0, a prefill of n tokens) in a child process: 1 when it ended with exit
 * status 1 and one line on stderr containing `names` (line holds that line) */
static int refused_in_child(State *s, int n, const char *names, char *line, size_t cap) {
    int fd[2];
    if (pipe(fd)) return 0;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);   /* not refused, the build would wait on pool workers the child lacks */
        dup2(fd[1], 2);
        close(fd[0]);
        s->layer_done(s->layer_arg, 0, 0, n);
        _exit(0);
    }
    close(fd[1]);
    memset(line, 0, cap);
    ssize_t got = read(fd[0], line, cap - 1);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int one_line = got > 0 && strchr(line, '\n') == line + got - 1;
    if (one_line) line[got - 1] = 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 1 && one_line && strstr(line, names);
}

/* One attention state serves one prefill: a second prefill through it, or one of another length
 * than it was built for, ends the process with a one-line error rather than indexing keys that
 * are stale or never written (the indexes cover idx_end = n_prompt - window keys). Each misuse
 * runs in a child process. */
static void test_one_prefill(void) {
    Model m;
    attention_shape(&m, 2, 16);
    int n_prompt = 40, ctx = n_prompt + 2;
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 8, ap.topk = 16, ap.ef = 32;
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1);
    Pool *p = build_pool(2);
    State s;
    Attention *A = attention_case(&s, &m, &ap, ctx, n_prompt, 1, p);   /* every layer built */
    if (!A) { free_pool(p); return; }
    char line[512], err[ERR_LEN];
    int ok = refused_in_child(&s, n_prompt, "build_attention", line, sizeof line);
    CHECK(ok, "a second prefill through one attention state: exit 1 and one line naming the problem (\"%s\")", line);
    free_attention(A);   /* a new state over the same cache, no layer built yet */
    if (build_attention(&A, &m, &ap, ctx, n_prompt, 2, err)) {
        CHECK(0, "build_attention: %s", err);
        A = NULL;
    } else {
        attach_attention(&s, A);
        ok = refused_in_child(&s, n_prompt - 1, "build_attention", line, sizeof line);
        CHECK(ok, "a prefill of %d tokens for a state built for %d: exit 1 and one line naming the problem (\"%s\")",
              n_prompt - 1, n_prompt, line);
    }
    free_attention_case(&s, A);
    free_pool(p);
}

/* an index build asks for the GPU's KNN only where knn_topk_cuda takes its Nq: with --nq above
 * KNN_GPU_MAX_KQ every head's call failed and printed, and fell back to the CPU one by one */
static void test_gpu_knn_bound(void) {
    AttnParams ap = {0};
    ap.gpu = 1, ap.nq_knn = KNN_GPU_MAX_KQ, ap.max_degree = 35, ap.q_stride = 1, ap.ef_conn = 32;
    int at = head_build_params(&ap).gpu_knn;
    ap.nq_knn = KNN_GPU_MAX_KQ + 1;
    int past = head_build_params(&ap).gpu_knn;
    ap.gpu = 0, ap.nq_knn = 100;
    int cpu = head_build_params(&ap).gpu_knn;
    CHECK(at == 1 && past == 0 && cpu == 0, "the GPU's KNN asked for Nq %d: %d, Nq %d: %d, no GPU: %d (want 1, 0, 0)",
          KNN_GPU_MAX_KQ, at, KNN_GPU_MAX_KQ + 1, past, cpu);
}

/* q_keep may keep only the queries the index build reads (State.q_keep_row from ra_query_slots:
 * for --q-stride 3, the call's queries 0, 3, 6, ...): the indexes built from them are those
 * built from every query, graph for graph. A map that lacks a query the build reads (that of
 * --q-stride 2) is refused: the process ends with a one-line error. */
static void test_kept_rows(void) {
    Model m;
    attention_shape(&m, 4, 16);
    const Config *c = &m.c;
    int n_prompt = 301, ctx = n_prompt + 4, hd = c->head_dim, nh = c->n_heads, qd = nh * hd, S = 3;
    int32_t *row = malloc((size_t)n_prompt * sizeof *row), *row2 = malloc((size_t)n_prompt * sizeof *row2);
    int kept = ra_query_slots(n_prompt, S, row);
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 8, ap.topk = 16, ap.ef = 32, ap.warm = 1;
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = S, ap.ef_conn = ra_default_ef_conn(S);
    Pool *p = build_pool(3);
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
    float *k = malloc(cache * 4), *v = malloc(cache * 4), *q = malloc((size_t)qd * 4);
    float *all = malloc((size_t)n_prompt * qd * 4), *some = malloc((size_t)kept * qd * 4);
    for (size_t i = 0; i < cache; i++) k[i] = 2 * frand(), v[i] = frand();
    State s[2];
    Attention *A[2] = {NULL, NULL};
    char err[ERR_LEN], line[512];
    for (int i = 0; i < 2; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].ctx = ctx, s[i].pool = p, s[i].k = k, s[i].v = v, s[i].q = q;
        s[i].q_keep = i ? some : all, s[i].q_keep_n = i ? kept : n_prompt;
        if (i) s[i].q_keep_row = row, s[i].q_keep_span = n_prompt;
        if (build_attention(&A[i], &m, &ap, ctx, n_prompt, 3, err)) CHECK(0, "kept rows: build_attention: %s", err);
        else attach_attention(&s[i], A[i]);
    }
    int graphs = 1, built = 0;
    for (int l = 0; A[0] && A[1] && l < c->n_layers; l++) {
        for (size_t i = 0; i < (size_t)n_prompt * qd; i++) all[i] = 2 * frand() + 0.5f;
        for (int j = 0; j < n_prompt; j++)
            if (row[j] >= 0) memcpy(some + (size_t)row[j] * qd, all + (size_t)j * qd, (size_t)qd * 4);
        for (int i = 0; i < 2; i++) s[i].layer_done(s[i].layer_arg, l, 0, n_prompt);
    }
    for (int i = 0; A[0] && A[1] && i < 2; i++)
        attention_prefill_done(A[i], NULL, NULL), attention_wait_build(A[i]);
    for (int l = 0; A[0] && A[1] && l < c->n_layers; l++) {
        for (int h = 0; h < nh; h++) {
            const RAIndex *x = &A[0]->ra[(size_t)l * nh + h], *y = &A[1]->ra[(size_t)l * nh + h];
            graphs &= same_graph(x, y), built += x->n == n_prompt - ap.sink - ap.window;
        }
    }
    CHECK(kept == 101 && graphs && built == c->n_layers * nh, "--q-stride %d: indexes from the %d queries kept "
          "(ra_query_slots) and from every query kept: the same graphs: %s (%d of %d indexes over all %d keys)", S,
          kept, graphs ? "yes" : "NO", built, c->n_layers * nh, n_prompt - ap.sink - ap.window);
    for (int i = 0; i < 2; i++) free_attention(A[i]);
    /* the rows of --q-stride 2 for --q-stride 3: queries 3, 9, ... are not there */
    memset(&s[1], 0, sizeof s[1]);
    int kept2 = ra_query_slots(n_prompt, 2, row2);
    s[1].ctx = ctx, s[1].pool = p, s[1].k = k, s[1].v = v, s[1].q = q, s[1].q_keep = some;
    s[1].q_keep_n = kept2 < kept ? kept2 : kept, s[1].q_keep_row = row2, s[1].q_keep_span = n_prompt;
    if (build_attention(&A[1], &m, &ap, ctx, n_prompt, 3, err)) CHECK(0, "kept rows: build_attention: %s", err);
    else {
        attach_attention(&s[1], A[1]);
        int ok = refused_in_child(&s[1], n_prompt, "lack query 3,", line, sizeof line);
        CHECK(ok, "the queries of --q-stride 2 kept for --q-stride 3: exit 1 and one line naming the problem (\"%s\")",
              line);
        free_attention(A[1]);
    }
    free(k), free(v), free(q), free(all), free(some), free(row), free(row2);
    free_pool(p);
}

/* Flat's exact scan as a decoding step runs it (flat_scan_group: a GQA group's heads at once, over
 * runs of keys, merged as exact_merge does) against flat_topk per head, its oracle: the same ids
 * in the same order, for keys in floats and in halves, with tied scores (repeated keys) and NaN
 * scores, any number of runs, and a top-k larger than a run or than all the keys. */
static void test_exact_scan(void) {
    enum { N = 700, D = 24, G = 18, KMAX = 64 };   /* G: past the 16 heads scanned at once */
    static float kf[N * D];
    static uint16_t kh[N * D];
    float q[G * D];
    int same = 1, cases = 0;
    for (int i = 0; i < N * D; i++) kf[i] = frand();
    for (int i = 100; i < 200; i++) memcpy(kf + i * D, kf + (i % 7) * D, D * 4);   /* ties */
    kf[300 * D + 5] = NAN;   /* a NaN score, whatever the query */
    for (int i = 0; i < N * D; i++) kh[i] = fp32_to_fp16(kf[i]);
    for (int i = 0; i < G * D; i++) q[i] = frand();
    static Hit hits[G * 7 * 2 * KMAX], best[KMAX];
    int n_hits[G * 7];
    for (int f16 = 0; f16 < 2; f16++)
        for (int R = 1; R <= 7; R += 3)
            for (int k = 1; k <= KMAX; k = k * 4 + 3) {
                Rows K = f16 ? (Rows){kh, D, 1} : rows_f32(kf, D);
                int lo = 3, hi = k == KMAX ? 3 + KMAX / 2 : N, n = hi - lo;   /* k past the keys */
                for (int r = 0; r < R; r++)
                    flat_scan_group(q, G, K, lo + n * r / R, lo + n * (r + 1) / R, D, k, hits + r * 2 * k,
                                    (size_t)R * 2 * k, n_hits + r, R);
                for (int g = 0; g < G; g++) {
                    int32_t want[KMAX], got[KMAX], ids[N], scored, m = 0;
                    for (int i = 0; i < n; i++) ids[i] = lo + i;
                    int nw = flat_topk(q + g * D, K, ids, n, D, k, want, &scored);
                    for (int r = 0; r < R; r++)
                        for (int i = 0; i < n_hits[g * R + r]; i++) heap_offer(best, &m, k, hits[(g * R + r) * 2 * k + i]);
                    int ng = heap_write(best, m, got);
                    same &= ng == nw && !memcmp(got, want, (size_t)nw * 4);
                    cases++;
                }
            }
    CHECK(same, "the exact scan of a GQA group of %d heads over runs of keys, merged: flat_topk's ids in its order (%d "
          "cases: f32 and f16 keys, ties, a NaN, 1 to 7 runs, top-k past the keys)", G, cases);
}

/* A random prefill through three attention states over one cache: flat, ra with its builds held
 * back (attention_hold_build), and ra whose builds all took over before decoding (--index-wait).
 * Then decoding steps: new keys written to the cache, random queries. */
typedef struct {
    Model m;
    AttnParams ap;
    Pool *p;
    float *k, *v, *q, *keep;
    State s[3];
    Attention *A[3];
    int n_prompt, ctx;
} BuildCase;

static int build_case(BuildCase *b, int n_prompt, int n_dec, int hold, int fail_layer) {
    attention_shape(&b->m, 4, 16);
    b->m.c.n_layers = 4, b->m.c.swa_window = 24, b->m.c.swa_pattern = 2;   /* 0 and 2 slide */
    const Config *c = &b->m.c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    b->n_prompt = n_prompt, b->ctx = n_prompt + n_dec;
    memset(&b->ap, 0, sizeof b->ap);
    b->ap.mode = ATTN_RA, b->ap.sink = 4, b->ap.window = 8, b->ap.topk = 16, b->ap.ef = 32, b->ap.warm = 1;
    b->ap.nq_knn = 20, b->ap.max_degree = 12, b->ap.q_stride = 1, b->ap.ef_conn = ra_default_ef_conn(1);
    b->p = build_pool(3);
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * b->ctx * hd;
    b->k = malloc(cache * 4), b->v = malloc(cache * 4), b->q = malloc((size_t)qd * 4);
    b->keep = malloc((size_t)n_prompt * qd * 4);
    for (size_t i = 0; i < cache; i++) b->k[i] = 2 * frand(), b->v[i] = frand();
    char err[ERR_LEN];
    for (int i = 0; i < 3; i++) {
        AttnParams ap = b->ap;
        if (i == 0) ap.mode = ATTN_FLAT;
        memset(&b->s[i], 0, sizeof b->s[i]);
        b->s[i].ctx = b->ctx, b->s[i].pool = b->p, b->s[i].k = b->k, b->s[i].v = b->v, b->s[i].q = b->q;
        b->s[i].q_keep = b->keep, b->s[i].q_keep_n = n_prompt;
        b->s[i].att = malloc((size_t)qd * 4);
        b->s[i].att_work_stride = attn_work_floats(c), b->s[i].att_work = malloc(3 * b->s[i].att_work_stride * 4);
        if (build_attention(&b->A[i], &b->m, &ap, b->ctx, n_prompt, 3, err)) {
            CHECK(0, "builds: build_attention: %s", err);
            return 0;
        }
        attach_attention(&b->s[i], b->A[i]);
    }
    attention_hold_build(b->A[1], hold);
    attention_fail_build(b->A[1], fail_layer);
    for (int l = 0; l < c->n_layers; l++) {
        for (size_t i = 0; i < (size_t)n_prompt * qd; i++) b->keep[i] = 2 * frand() + 0.5f;
        for (int i = 0; i < 3; i++) b->s[i].layer_done(b->s[i].layer_arg, l, 0, n_prompt);
    }
    for (int i = 0; i < 3; i++) attention_prefill_done(b->A[i], NULL, NULL);
    attention_wait_build(b->A[2]);
    return 1;
}

/* one decoding step at pos through states [0, n): a new key and value a layer, a random query;
 * 1 when states 0 and 1 gave the same output bits at every layer */
static int build_case_step(BuildCase *b, int pos, int n) {
    const Config *c = &b->m.c;
    int hd = c->head_dim, qd = c->n_heads * hd, same = 1;
    for (int l = 0; l < c->n_layers; l++) {
        for (int h = 0; h < c->n_kv_heads; h++)
            for (int d = 0; d < hd; d++) {
                size_t at = (((size_t)l * c->n_kv_heads + h) * b->ctx + pos) * hd + d;
                b->k[at] = 2 * frand(), b->v[at] = frand();
            }
        for (int i = 0; i < qd; i++) b->q[i] = 2 * frand() + 0.5f;
        for (int i = 0; i < n; i++) attention_layer(&b->m, &b->s[i], l, 1, pos);
        same &= !memcmp(b->s[0].att, b->s[1].att, (size_t)qd * 4);
    }
    return same;
}

static void free_build_case(BuildCase *b) {
    for (int i = 0; i < 3; i++) free_attention(b->A[i]), free(b->s[i].att), free(b->s[i].att_work);
    free(b->k), free(b->v), free(b->q), free(b->keep);
    free_pool(b->p);
}

/* Decoding while the indexes are built (section 7): with the builds held back, every step of ra
 * is Flat's, output bit for bit, and counted as exact; once they are let go and have ended, the
 * indexes take over at the next step, the keys that left W meanwhile inserted at once, and each
 * graph is then the one built before decoding and grown a key a step (--index-wait), edge for
 * edge. */
static void test_builds_beside(void) {
    BuildCase b;
    int n_prompt = 300, held = 30, after = 12;
    if (!build_case(&b, n_prompt, held + after, 1, -1)) return;
    const Config *c = &b.m.c;
    int same = 1, pos = n_prompt, left_held = attention_builds_left(b.A[1], NULL);
    for (; pos < n_prompt + held; pos++) same &= build_case_step(&b, pos, 3);
    long exact_held = attention_exact_steps(b.A[1]);
    attention_hold_build(b.A[1], 0);
    attention_wait_build(b.A[1]);
    int left = attention_builds_left(b.A[1], NULL);
    for (; pos < n_prompt + held + after; pos++) build_case_step(&b, pos, 3);
    int graphs = 1, used = 1;
    for (int i = 0; i < c->n_layers * c->n_heads; i++) {
        if (layer_sliding(c, i / c->n_heads)) continue;   /* no index */
        graphs &= same_graph(&b.A[1]->ra[i], &b.A[2]->ra[i]) && b.A[1]->ra[i].n == pos - b.ap.window - b.ap.sink;
        used &= atomic_load(&b.A[1]->ready[i]) == INDEX_READY;
    }
    CHECK(same && exact_held == held && left_held == global_layers(c), "builds held back: %d steps of ra as Flat's, bit "
          "for bit, its sliding layers' too: %s; counted exact: %ld; global layers still to take over: %d of %d", held,
          same ? "yes" : "NO", exact_held, left_held, global_layers(c));
    CHECK(graphs && used && left == 0 && attention_exact_steps(b.A[1]) == held && attention_exact_steps(b.A[2]) == 0,
          "then let go: every index took over (%s), no exact step after (%ld in all), and after %d more steps each graph "
          "is --index-wait's, grown by the same insertions, edge for edge: %s", used ? "yes" : "NO",
          attention_exact_steps(b.A[1]), after, graphs ? "yes" : "NO");
    free_build_case(&b);
}

/* A layer whose builds fail (attention_fail_build, as an allocation that failed) says so in one
 * line on stderr and scans exactly for good: its outputs are Flat's, bit for bit, and the other
 * layer searches its index. The builds then take over with the failed layer counted as ended. */
static void test_build_fails(void) {
    BuildCase b;
    char path[] = "/tmp/ra_test_build_fails_XXXXXX", line[512] = "";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    if (fd >= 0) dup2(fd, 2);
    int ok = build_case(&b, 200, 4, 0, 3);
    if (ok) attention_wait_build(b.A[1]);
    fflush(stderr);
    dup2(saved, 2), close(saved);
    ssize_t got = fd >= 0 ? pread(fd, line, sizeof line - 1, 0) : -1;
    if (fd >= 0) close(fd), unlink(path);
    if (!ok) return;
    const Config *c = &b.m.c;
    int one_line = got > 0 && strchr(line, '\n') == line + got - 1 && strstr(line, "layer 3"), flags = 1, same = 1;
    for (int h = 0; h < c->n_heads; h++)
        flags &= atomic_load(&b.A[1]->ready[c->n_heads + h]) == INDEX_READY &&
                 atomic_load(&b.A[1]->ready[3 * c->n_heads + h]) == INDEX_FAILED;
    for (int pos = 200; pos < 204; pos++) {   /* the last layer's outputs against Flat's */
        build_case_step(&b, pos, 2);
        same &= !memcmp(b.s[0].att, b.s[1].att, (size_t)c->n_heads * c->head_dim * 4);
    }
    CHECK(one_line && flags && same && attention_builds_left(b.A[1], NULL) == 0,
          "a layer's builds failed: one line on stderr naming it (\"%.*s\"), its heads on the exact scan and layer 1's on "
          "their indexes: %s, its outputs Flat's bit for bit: %s", got > 0 ? (int)got - 1 : 0, line, flags ? "yes" : "NO",
          same ? "yes" : "NO");
    free_build_case(&b);
}

/* The prefill hands over at most held_layers layers' queries at once: past it, layer_done waits
 * for the builds (the memory plan). A save run by the builds (attention_prefill_done) comes once
 * every layer is built, before any index takes over; after it they all do. Stopped builds are
 * joined, and the heads left scan exactly. */
typedef struct { Attention *A; int calls, left_then, whole; } SaveCheck;
static void save_check(void *arg, int whole) {
    SaveCheck *sc = arg;
    sc->calls++, sc->whole = whole, sc->left_then = attention_builds_left(sc->A, NULL);
}

static void test_builds_control(void) {
    Model m;
    attention_shape(&m, 4, 16);
    m.c.n_layers = 5;
    const Config *c = &m.c;
    int n_prompt = 200, ctx = n_prompt + 2, hd = c->head_dim, qd = c->n_heads * hd;
    AttnParams ap = {0};
    ap.mode = ATTN_RA, ap.sink = 4, ap.window = 8, ap.topk = 16, ap.ef = 32, ap.warm = 1;
    ap.nq_knn = 20, ap.max_degree = 12, ap.q_stride = 1, ap.ef_conn = ra_default_ef_conn(1), ap.held_layers = 1;
    Pool *p = build_pool(3);
    size_t cache = (size_t)c->n_layers * c->n_kv_heads * ctx * hd;
    float *k = malloc(cache * 4), *v = malloc(cache * 4), *keep = malloc((size_t)n_prompt * qd * 4);
    for (size_t i = 0; i < cache; i++) k[i] = 2 * frand(), v[i] = frand();
    char err[ERR_LEN];
    for (int stop = 0; stop < 2; stop++) {
        State s;
        memset(&s, 0, sizeof s);
        s.ctx = ctx, s.pool = p, s.k = k, s.v = v, s.q_keep = keep, s.q_keep_n = n_prompt;
        Attention *A = NULL;
        if (build_attention(&A, &m, &ap, ctx, n_prompt, 3, err)) {
            CHECK(0, "builds: build_attention: %s", err);
            break;
        }
        attach_attention(&s, A);
        SaveCheck sc = {A, 0, -1, 0};
        int most = 0;
        if (stop) attention_hold_build(A, 1);
        for (int l = 0; l < c->n_layers; l++) {
            for (size_t i = 0; i < (size_t)n_prompt * qd; i++) keep[i] = 2 * frand();
            if (stop && l == 1) break;   /* held: a second layer would wait for good */
            s.layer_done(s.layer_arg, l, 0, n_prompt);
            pthread_mutex_lock(&A->b.mu);
            most = A->b.n_held > most ? A->b.n_held : most;
            pthread_mutex_unlock(&A->b.mu);
        }
        attention_prefill_done(A, save_check, &sc);
        if (!stop) {
            attention_wait_build(A);
            CHECK(most == 1 && sc.calls == 1 && sc.whole && sc.left_then == c->n_layers &&
                  attention_builds_left(A, NULL) == 0 && attention_ready_at(A) > 0,
                  "held_layers 1: at most %d layer handed over at a time; the save once (%d), every layer built (%d), "
                  "before any index took over (%d left then), all after (%d left)", most, sc.calls, sc.whole,
                  sc.left_then, attention_builds_left(A, NULL));
        } else {
            attention_stop_build(A);
            CHECK(!A->b.started && sc.calls == 0 && attention_builds_left(A, NULL) == c->n_layers &&
                  attention_ready_at(A) == 0, "builds stopped while held: joined, no save, no index took over");
        }
        free_attention(A);
    }
    free(k), free(v), free(keep);
    free_pool(p);
}

/* make bench-kernels: the prefill's two kernels in GFLOP/s, on 1 thread and on all, no
 * assertions. The matmul of an FFN-sized F32 matrix (1536 x 576) by a batch of 256 tokens
 * (2 FLOP a weight and token), and the causal attention of 2048 tokens over a GQA group of the
 * default model's shape (9 query heads, 3 KV heads, head dim 64; QK^T and PV over the causal
 * half, 4 FLOP a query, key and dim). What they reach depends on the vector ISA: the kernels
 * keep 4 x 4 accumulators with AVX-512, 4 x 2 with AVX2 (MM_T, ATT_C). */
static void bench_kernels(void) {
    int nth = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int rows = 1536, cols = 576, nt = 256;
    float *W = malloc((size_t)rows * cols * 4), *X = malloc((size_t)nt * cols * 4), *Y = malloc((size_t)nt * rows * 4);
    float *wrow = malloc((size_t)nth * 4 * cols * 4);
    for (size_t i = 0; i < (size_t)rows * cols; i++) W[i] = frand();
    for (size_t i = 0; i < (size_t)nt * cols; i++) X[i] = frand();
    Mat M = {W, GGML_F32, rows, cols, (size_t)cols * 4};
    Model m;
    memset(&m, 0, sizeof m);
    m.c.n_layers = 1, m.c.n_heads = 9, m.c.n_kv_heads = 3, m.c.head_dim = 64, m.c.dim = 576;
    int n = 2048, hd = 64, qd = 9 * hd;
    State s;
    memset(&s, 0, sizeof s);
    s.ctx = n;
    size_t cache = (size_t)3 * n * hd;
    s.k = malloc(cache * 4), s.v = malloc(cache * 4), s.q = malloc((size_t)n * qd * 4), s.att = malloc((size_t)n * qd * 4);
    s.att_work_stride = attn_work_floats(&m.c);
    s.att_work = malloc((size_t)nth * s.att_work_stride * 4);
    for (size_t i = 0; i < cache; i++) ((float *)s.k)[i] = frand(), ((float *)s.v)[i] = frand();
    for (size_t i = 0; i < (size_t)n * qd; i++) s.q[i] = frand();
    printf("prefill kernels (MM_T %d, ATT_C %d, vector of %d floats):\n", MM_T, ATT_C, ATT_W);
    int threads[2] = {1, nth};
    for (int k = 0; k < (nth > 1 ? 2 : 1); k++) {   /* the best of a few runs each */
        int th = threads[k];
        Pool *p = build_pool(th);
        s.pool = p;
        double best_mm = 1e9, best_at = 1e9;
        matmul(p, Y, X, &M, nt, wrow);   /* warm */
        for (int r = 0; r < 5; r++) {
            double t0 = now_s();
            matmul(p, Y, X, &M, nt, wrow);
            best_mm = fmin(best_mm, now_s() - t0);
        }
        AttnTask t = {&m, &s, 0, n, 0, 0};
        for (int r = 0; r < 3; r++) {
            double t0 = now_s();
            pool_for(p, (int64_t)3 * ((n + ATT_QB - 1) / ATT_QB), attn_causal_task, &t);
            best_at = fmin(best_at, now_s() - t0);
        }
        printf("  %d thread%s: matmul %d x %d by %d tokens %.2f ms, %.1f GFLOP/s; causal attention %d tokens %.1f ms, %.1f GFLOP/s\n",
               th, th > 1 ? "s" : "", rows, cols, nt, best_mm * 1e3, 2.0 * rows * cols * nt / best_mm / 1e9, n,
               best_at * 1e3, 4.0 * 9 * hd * (double)n * n / 2 / best_at / 1e9);
        free_pool(p);
    }
    free(W), free(X), free(Y), free(wrow);
    free(s.k), free(s.v), free(s.q), free(s.att), free(s.att_work);
}

/* a Sampler of llama.cpp's chain with only top-p on (top-k and min-p off) */
static Sampler nucleus(float temp, float top_p) {
    Sampler sp = {temp, top_p, 0, 0};
    return sp;
}

/* the sampler: greedy at T = 0; the nucleus of top-p, and only it, sampled in proportion; the
   most likely token kept when top-p is below every probability, even when all are equal (the
   cut above every token once left nothing, and the draw read before its buffer) */
static void test_sample(void) {
    int n = 1000;
    float *lg = malloc((size_t)n * sizeof *lg);
    ProbId *mem = malloc((size_t)(n + 1) * sizeof *mem), *buf = mem + 1;
    mem[0].p = 1, mem[0].id = -5;   /* what a read before buf would return */
    uint64_t rng = 7;
    int ok_flat = 1;
    for (int t = 0; t < 3; t++) {
        float top_p[3] = {0, 1e-4f, 0.5f / n};
        for (int i = 0; i < n; i++) lg[i] = 0;
        Sampler sp = nucleus(1, top_p[t]);
        ok_flat &= sample(lg, n, &sp, &rng, buf) == 0;   /* ties: the lowest id is the top */
    }
    for (int i = 0; i < n; i++) lg[i] = (float)(i % 17) * 0.01f;
    lg[123] = 3;
    Sampler g0 = nucleus(0, 0.9f), g1 = nucleus(1, 0);
    int greedy = sample(lg, n, &g0, &rng, buf) == 123 && sample(lg, n, &g1, &rng, buf) == 123;
    /* p = 0.4, 0.3, 0.2, 0.1: top-p 0.5 keeps the first two, drawn 4 : 3 */
    float l4[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    int hits[4] = {0}, draws = 4000;
    Sampler half = nucleus(1, 0.5f);
    for (int k = 0; k < draws; k++) {
        int id = sample(l4, 4, &half, &rng, buf);
        if (id >= 0 && id < 4) hits[id]++;
    }
    double f0 = (double)hits[0] / draws;
    /* four equal tokens: top-p 0.5 is reached by two of them exactly (>=, not >), and top-p 0.3
       needs two as well (the cut must not drop the second) */
    int h5[4] = {0}, h3[4] = {0};
    float e4[4] = {0, 0, 0, 0};
    Sampler p5 = nucleus(1, 0.5f), p3 = nucleus(1, 0.3f);
    for (int k = 0; k < 2000; k++) {
        int a5 = sample(e4, 4, &p5, &rng, buf), a3 = sample(e4, 4, &p3, &rng, buf);
        if (a5 >= 0 && a5 < 4) h5[a5]++;
        if (a3 >= 0 && a3 < 4) h3[a3]++;
    }
    check(h5[2] + h5[3] == 0 && h5[0] > 900 && h5[1] > 900 && h3[2] + h3[3] == 0 && h3[0] > 900 && h3[1] > 900,
          "sample: four equal tokens at top-p 0.5 and 0.3: the first two only, about half each (%d/%d, %d/%d of 2000)",
          h5[0], h5[1], h3[0], h3[1]);
    check(ok_flat, "sample: equal logits, top-p 0, 1e-4 and 0.5/n: the most likely (lowest id) token");
    check(greedy, "sample: T = 0 and top-p 0 give the argmax");
    check(hits[2] == 0 && hits[3] == 0 && hits[0] + hits[1] == draws && fabs(f0 - 4.0 / 7) < 0.03,
          "sample: top-p 0.5 over 0.4/0.3/0.2/0.1 draws only the first two, %.3f of draws the first (4/7 = 0.571)", f0);
    free(lg), free(mem);
}

/* a draw's frequencies over 4 tokens of p = 0.4, 0.3, 0.2, 0.1 under sp, of `draws` */
static void draw4(const Sampler *sp, int draws, uint64_t *rng, ProbId *buf, int hits[4]) {
    float l4[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    for (int i = 0; i < 4; i++) hits[i] = 0;
    for (int k = 0; k < draws; k++) {
        int id = sample(l4, 4, sp, rng, buf);
        if (id >= 0 && id < 4) hits[id]++;
    }
}

static int cmp_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* llama.cpp's chain: top-k, then top-p over the probabilities renormalized to the k kept, then
   min-p, and the temperature last, on what the filters kept */
static void test_sample_chain(void) {
    ProbId buf[5000];
    uint64_t rng = 11;
    int h[4], draws = 4000;
    Sampler k2 = {1, 1, 0, 2};
    draw4(&k2, draws, &rng, buf, h);
    check(h[2] + h[3] == 0 && fabs((double)h[0] / draws - 4.0 / 7) < 0.03,
          "sample: top-k 2 over 0.4/0.3/0.2/0.1 draws the first two, 4 : 3 (%d, %d, %d, %d)", h[0], h[1], h[2], h[3]);
    /* top-k 3 leaves 0.44/0.33/0.22: top-p 0.75 is reached by the first two (0.78). Over the
       model's own probabilities it would take three (0.4 + 0.3 = 0.7 < 0.75) */
    Sampler k3p = {1, 0.75f, 0, 3};
    draw4(&k3p, draws, &rng, buf, h);
    check(h[2] + h[3] == 0 && h[0] > 0 && h[1] > 0,
          "sample: top-p after top-k 3 sees the three renormalized: 0.75 keeps two (%d, %d, %d, %d)", h[0], h[1], h[2], h[3]);
    /* min-p 0.6: 0.3 / 0.4 = 0.75 is kept, 0.2 / 0.4 = 0.5 is not; min-p 0.45 keeps the third */
    Sampler m6 = {1, 1, 0.6f, 0}, m5 = {1, 1, 0.45f, 0};
    draw4(&m6, draws, &rng, buf, h);
    int min6 = h[2] + h[3] == 0 && h[0] > 0 && h[1] > 0;
    draw4(&m5, draws, &rng, buf, h);
    check(min6 && h[2] > 0 && h[3] == 0, "sample: min-p 0.6 keeps 0.4 and 0.3 of 0.4/0.3/0.2/0.1, min-p 0.45 also 0.2");
    /* the temperature comes after the filters: at T = 0.1 top-p 0.5 still keeps two tokens, drawn
       0.4^10 : 0.3^10 (the second 5.3% of draws). Applied first, T = 0.1 would give the first
       token 94.6% of the mass and top-p 0.5 would keep it alone */
    Sampler cold = {0.1f, 0.5f, 0, 0};
    draw4(&cold, draws, &rng, buf, h);
    double f1 = (double)h[1] / draws, want = 1 / (1 + pow(4.0 / 3, 10));
    check(h[2] + h[3] == 0 && fabs(f1 - want) < 0.015,
          "sample: T = 0.1 after top-p 0.5: the second token %.3f of draws (%.3f)", f1, want);
    /* top-k over many tokens: every draw among the k largest, and top-k 1 is the argmax */
    int n = 5000, in_top = 1, argmax = 1;
    float *lg = malloc((size_t)n * sizeof *lg), *sorted = malloc((size_t)n * sizeof *sorted);
    for (int t = 0; t < 20; t++) {
        for (int i = 0; i < n; i++) lg[i] = sorted[i] = rng_float(&rng) * 8 + (i % 7 == 3 ? 1 : 0);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_float_desc);
        Sampler k40 = {2, 1, 0, 40}, k1 = {1, 1, 0, 1};
        for (int d = 0; d < 50; d++) in_top &= lg[sample(lg, n, &k40, &rng, buf)] >= sorted[39];
        int best = 0;
        for (int i = 1; i < n; i++) best = lg[i] > lg[best] ? i : best;
        argmax &= sample(lg, n, &k1, &rng, buf) == best;
    }
    check(in_top && argmax, "sample: top-k 40 of 5,000 draws only among the 40 largest; top-k 1 is the argmax");
    /* equal logits: top-k 2 keeps the two lowest ids */
    for (int i = 0; i < n; i++) lg[i] = 1;
    int low = 1;
    for (int d = 0; d < 200; d++) low &= sample(lg, n, &k2, &rng, buf) < 2;
    check(low, "sample: top-k 2 of equal logits keeps ids 0 and 1");
    free(lg), free(sorted);
}

/* the sampler's edges: top-k keeps exactly the k largest logits (ties to the lower id), for
   every k, as the heap's root must be its weakest; greedy ties go to the lowest id; min-p keeps
   a token exactly min_p times as likely as the first; a non-finite maximum gives that token
   (an inf) or the first (all -inf), never NaN probabilities */
static void test_sample_edges(void) {
    int n = 3000, exact = 1;
    float *lg = malloc((size_t)n * sizeof *lg);
    ProbId *buf = malloc((size_t)n * sizeof *buf), *all = malloc((size_t)n * sizeof *all);
    uint64_t rng = 5;
    for (int t = 0; t < 40; t++) {
        for (int i = 0; i < n; i++) lg[i] = (float)(int)(rng_float(&rng) * (t % 2 ? 50 : 3000)) * 0.01f;   /* odd t: many ties */
        for (int i = 0; i < n; i++) all[i].p = lg[i], all[i].id = i;
        qsort(all, (size_t)n, sizeof *all, cmp_prob_desc);
        int k = 1 + (int)(rng_float(&rng) * (t < 20 ? 64 : n - 1));
        Sampler sp = {1, 1, 0, k};
        int m = sample_probs(lg, n, &sp, buf);
        exact &= m == k;
        for (int i = 0; i < m && i < k; i++) exact &= buf[i].id == all[i].id;
    }
    check(exact, "sample: top-k keeps exactly the k largest logits, ties to the lower id (40 arrays, k from 1 to %d)", n - 1);
    float tie[5] = {1, 3, 2, 3, 3};
    Sampler greedy = {0, 1, 0, 0};
    check(sample(tie, 5, &greedy, &rng, buf) == 1, "sample: greedy ties go to the lowest id");
    float two[2] = {0, logf(0.5f)};
    Sampler half = {1, 1, 0.5f, 0};
    check(sample_probs(two, 2, &half, buf) == 2, "sample: min-p 0.5 keeps a token half as likely as the first");
    float inf[4] = {0, INFINITY, 1, 2}, ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    Sampler hot = {1, 1, 0, 0};
    int mi = sample_probs(inf, 4, &hot, buf), idi = buf[0].id, ok_i = mi == 1 && buf[0].p == 1;
    int mn = sample_probs(ninf, 3, &hot, buf), idn = buf[0].id, ok_n = mn == 1 && buf[0].p == 1;
    check(ok_i && idi == 1 && ok_n && idn == 0, "sample: an inf logit is drawn alone; all -inf give the first token, "
          "probability 1 (not NaN)");
    /* top-p 1 (with no other filter) is no filter: every token stays, even those whose
     * probabilities (down to e^-30) vanish in the running sum's rounding */
    for (int i = 0; i < n; i++) lg[i] = 30 * rng_float(&rng);
    Sampler open_p = {1, 1, 0, 0};
    int m_all = sample_probs(lg, n, &open_p, buf);
    check(m_all == n, "sample: top-p 1 keeps all %d tokens: %d", n, m_all);
    free(lg), free(buf), free(all);
}

/* the IVF result and the unclustered tail merged: the k best of the union by q.k, ties to the
   lower id, best first, as a sort of all of them gives */
static void test_merge_topk(void) {
    int d = 16, nk = 500, ok = 1;
    uint64_t rng = 9;
    float *K = malloc((size_t)nk * d * sizeof *K), q[16], *sc = malloc((size_t)nk * sizeof *sc);
    int32_t *ids = malloc((size_t)nk * sizeof *ids);
    ProbId *all = malloc((size_t)nk * sizeof *all);
    for (int t = 0; t < 30; t++) {
        for (int i = 0; i < nk * d; i++) K[i] = (float)(int)(rng_float(&rng) * 5) - 2;   /* integer keys: ties */
        for (int i = 0; i < d; i++) q[i] = (float)(int)(rng_float(&rng) * 5) - 2;
        int n = 1 + (int)(rng_float(&rng) * (nk - 1)), k = 1 + (int)(rng_float(&rng) * 120);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + t) % nk);   /* distinct, in no order */
        for (int i = 0; i < n; i++) all[i].p = dot8(q, K + (size_t)ids[i] * d, d), all[i].id = ids[i];
        qsort(all, (size_t)n, sizeof *all, cmp_prob_desc);
        int m = merge_topk(q, rows_f32(K, d), d, ids, n, k, sc);
        ok &= m == (n < k ? n : k);
        for (int i = 0; i < m; i++) ok &= ids[i] == all[i].id && sc[i] == all[i].p;
    }
    check(ok, "merge_topk: the k best of the IVF result and the tail by q.k, ties to the lower id (30 cases)");
    free(K), free(sc), free(ids), free(all);
}

/* the chain against llama.cpp's own (tests/data/sampler_ref.txt, made by tests/ref/make_ref.py
   with llama.cpp's top_k, top_p, min_p, temp and dist samplers): on the default model's logits
   for four prompts, as they are and halved, each case keeps the same tokens with the same
   probabilities. One difference is allowed, where the rule is decided by rounding: llama.cpp
   sums top-p's mass in float, and where the exact mass (double) reaches top-p within 1e-4 one
   token before llama.cpp's float sum does, llama.cpp keeps that one token more; the others
   then have the same probabilities, renormalized without it. */
static void test_sample_reference(void) {
    int np = 0, nv = 0, nt;
    float *lg = NULL, *row;   /* (np, nv) the prompts' logits */
    int32_t *ids;
    while (np < 8 && !read_rlog_prompt("tests/data/logits_ref_kvf32.bin", np, &ids, &nt, &row, &nv)) {
        float *grown = realloc(lg, (size_t)(np + 1) * nv * sizeof *lg);
        if (grown) memcpy(grown + (size_t)np * nv, row, (size_t)nv * sizeof *row), lg = grown, np++;
        free(ids), free(row);
        if (!grown) break;
    }
    if (!np) free(lg), lg = NULL;
    FILE *f = fopen("tests/data/sampler_ref.txt", "r");
    check(lg && f, "sample: tests/data/logits_ref_kvf32.bin and sampler_ref.txt present");
    if (!lg || !f) {
        free(lg);
        if (f) fclose(f);
        return;
    }
    float *z = malloc((size_t)nv * sizeof *z), *ref = malloc((size_t)nv * sizeof *ref);
    ProbId *buf = malloc((size_t)nv * sizeof *buf);
    int cases = 0, same = 0, edge = 0, kept = 0;
    char bad[200] = "";
    int pi, top_k, m;
    float scale, top_p, min_p, temp;
    skip_header_lines(f);
    while (fscanf(f, "%d %f %d %f %f %f %d", &pi, &scale, &top_k, &top_p, &min_p, &temp, &m) == 7) {
        if (pi < 0 || pi >= np || m < 1 || m > nv) break;
        for (int i = 0; i < nv; i++) z[i] = lg[(size_t)pi * nv + i] * scale, ref[i] = -1;
        int ok = 1;
        for (int i = 0; i < m; i++) {   /* llama.cpp's probabilities by id; -1: not kept */
            int id;
            float p;
            if (fscanf(f, " %d:%f", &id, &p) != 2 || id < 0 || id >= nv) {
                ok = 0;
                break;
            }
            ref[id] = p;
        }
        Sampler sp = {temp, top_p, min_p, top_k};
        int ours = sample_probs(z, nv, &sp, buf);
        double norm = 1;   /* llama.cpp's mass on the tokens ours keeps */
        int boundary = 0;
        if (ok && ours == m - 1 && top_k == 0 && min_p == 0) {   /* top-p alone: the rounding case above */
            double mx = z[0], Z = 0, mass = 0;
            for (int i = 1; i < nv; i++) mx = z[i] > mx ? z[i] : mx;
            for (int i = 0; i < nv; i++) Z += exp((double)z[i] - mx);
            norm = 0;
            for (int i = 0; i < ours; i++) {
                mass += exp((double)z[buf[i].id] - mx) / Z;
                norm += ref[buf[i].id] > 0 ? ref[buf[i].id] : 0;
            }
            boundary = mass >= top_p && mass - top_p < 1e-4;
        }
        ok &= ours == m || boundary;
        for (int i = 0; i < ours && ok; i++) {
            float p = ref[buf[i].id];
            ok &= p >= 0 && fabs(buf[i].p - p / norm) <= 1e-6 + 1e-4 * p;
        }
        cases++, same += ok, edge += ok && boundary, kept += m;
        if (!ok && !bad[0])
            snprintf(bad, sizeof bad, "; first differing: prompt %d x %g, top-k %d top-p %g min-p %g T %g: %d kept, llama.cpp %d",
                     pi, scale, top_k, top_p, min_p, temp, ours, m);
    }
    fclose(f);
    check(cases == 64 && same == cases && edge <= 2, "sample: llama.cpp's chain on the default model's logits: %d of %d cases "
          "keep the same tokens (%d in all) with the same probabilities, %d of them but for one token at top-p's "
          "rounding edge%s", same, cases, kept, edge, bad);
    free(lg), free(z), free(ref), free(buf);
}

/* A cache of halves (-ctk/-ctv f16): row_f32 gives each half's float exactly, rows_from moves by
 * rows, and dot_rows' fused loads give dot8's bits on the converted rows, by id or in order, at
 * head dims that fill 8 lanes and leave a tail; and a token stored by cache_store is rounded as
 * fp32_to_fp16 rounds (to nearest even), its f32 twin copied */
static void test_rows_f16(void) {
    int dims[] = {64, 20, 7}, n = 37, ok = 1, bits = 1;
    for (int di = 0; di < 3; di++) {
        int d = dims[di];
        uint16_t *h = malloc((size_t)n * d * 2);
        float *f = malloc((size_t)n * d * 4), q[64], buf[64], got[37], want[37];
        int32_t ids[37];
        for (int i = 0; i < n * d; i++) h[i] = fp32_to_fp16(4 * frand() - 2), f[i] = fp16_to_fp32(h[i]);
        for (int i = 0; i < d; i++) q[i] = 2 * frand() - 1;
        for (int i = 0; i < n; i++) ids[i] = (i * 11 + 5) % n;
        Rows R = {h, (size_t)d, 1};
        for (int i = 0; i < n; i++) ok &= !memcmp(row_f32(R, i, d, buf), f + (size_t)i * d, (size_t)d * 4);
        ok &= !memcmp(row_f32(rows_from(R, 3), 2, d, buf), f + (size_t)5 * d, (size_t)d * 4);
        for (int by_id = 0; by_id < 2; by_id++) {
            dot_rows(q, R, by_id ? ids : NULL, n, d, got);
            for (int j = 0; j < n; j++) want[j] = dot8(q, f + (size_t)(by_id ? ids[j] : j) * d, d);
            bits &= !memcmp(got, want, sizeof got);
            dot_rows(q, rows_f32(f, d), by_id ? ids : NULL, n, d, got);
            bits &= !memcmp(got, want, sizeof got);
        }
        for (int j = 0; j < n; j++) bits &= dot_row(q, R, j, d) == dot8(q, f + (size_t)j * d, d);
        free(h), free(f);
    }
    CHECK(ok, "row_f32 and rows_from on halves: each half's float, the right rows");
    CHECK(bits, "dot_rows and dot_row on halves: dot8's bits on the converted rows (head dims 64, 20, 7; by id, in order)");
    Model m;
    memset(&m, 0, sizeof m);
    m.c.n_layers = 2, m.c.n_heads = 2, m.c.n_kv_heads = 2, m.c.head_dim = 8, m.c.dim = 16;
    const Config *c = &m.c;
    char err[ERR_LEN];
    float k[16], v[16];
    for (int i = 0; i < 16; i++) k[i] = 3 * frand() - 1.5f, v[i] = 1e-6f * (i + 1) + (i == 3 ? 70000.0f : 0);
    int stored = 1;
    for (int t = 0; t < 4; t++) {
        State s;
        if (build_state(&s, &m, 4, 2, t, NULL, err)) {
            CHECK(0, "build_state: %s", err);
            continue;
        }
        cache_store(&s, c, 1, 2, k, v);
        for (int h = 0; h < 2; h++) {
            float kb[8], vb[8];
            const float *kr = row_f32(cache_rows(&s, c, 0, 1, h), 2, 8, kb), *vr = row_f32(cache_rows(&s, c, 1, 1, h), 2, 8, vb);
            for (int i = 0; i < 8; i++) {
                float wk = t & CACHE_K_F16 ? fp16_to_fp32(fp32_to_fp16(k[h * 8 + i])) : k[h * 8 + i];
                float sat = v[h * 8 + i] > 65504.0f ? 65504.0f : v[h * 8 + i];   /* half_sat's rule */
                float wv = t & CACHE_V_F16 ? fp16_to_fp32(fp32_to_fp16(sat)) : v[h * 8 + i];
                stored &= !memcmp(&kr[i], &wk, 4) && !memcmp(&vr[i], &wv, 4);
            }
        }
        stored &= cache_elem(&s, 0) == (t & CACHE_K_F16 ? 2u : 4u) && cache_elem(&s, 1) == (t & CACHE_V_F16 ? 2u : 4u);
        free_state(&s);
    }
    CHECK(stored, "cache_store: f32 rows copied, f16 rows rounded as fp32_to_fp16 (subnormals too), a value past 65504 "
          "saturated as the GPU's copies, for every pairing of -ctk and -ctv");
    CHECK(fabsf(fp16_to_fp32(fp32_to_fp16(1.0f + 1.0f / 2048))) == 1.0f, "fp32_to_fp16 rounds ties to even");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        bench_kernels();
        return 0;
    }
    test_rows_f16();
    test_tiled_attention();
    test_sliding_window();
    test_split_decode();
    test_attn_window();
    test_exp_neg();
    test_w_source(ATTN_FLAT);
    test_w_source(ATTN_STREAMING);
    test_pool_start();
    test_insert_ahead();
    test_continuation();
    test_few_keys();
    test_audit();
    test_one_prefill();
    test_kept_rows();
    test_exact_scan();
    test_step_head(CACHE_K_F16 | CACHE_V_F16);
    test_step_head(0);
    test_reference_run();
    test_builds_beside();
    test_build_fails();
    test_builds_control();
    test_gpu_knn_bound();
    test_rmsnorm();
    test_rope();
    test_softmax();
    test_eq1();
    test_swiglu();
    test_matmul();
    test_matmul_bits();
    test_sample();
    test_sample_chain();
    test_sample_reference();
    test_sample_edges();
    test_merge_topk();
    return check_summary();
}
