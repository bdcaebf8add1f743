/* test_cuda.c - the GPU twins of ra_cuda.cu against their CPU functions (ra.c, model.c):
   knn_topk_cuda vs knn_topk (§3.2), attn_partial_cuda vs attn_partial (Eq. 4), attn_causal_cuda
   (the prefill's fused kernel) vs attention_layer's causal attention, the index build with its
   KNN on the GPU vs on the CPU, and forward_cuda vs forward (model.c): prefill (by the fused
   kernel and by the cuBLAS tiles), then decoding steps in the full and ra modes (in ra, o_W on
   the GPU at every layer step), on random-weight models that tests/bin/gen_model writes and on
   the default model when data/ has it.

   make tests/bin/test_cuda && ./tests/bin/test_cuda
   Final line "N passed, N failed", exit 1 on failure. Without a usable CUDA device it prints
   "cuda: skipped: <reason>" and "0 passed, 0 failed" and exits 0.

   Scores from cuBLAS are summed in another order than dot8, so ids may differ from the CPU's
   where two keys score within rounding. The rule: position by position, the GPU's key must
   score (in double, on the host) within 1e-4 relative of the CPU's key at that position; with
   integer data (exact scores in any order) the ids must be identical, ties to the lower id. */

#ifndef RA_CUDA
#define RA_CUDA   /* model.c: no stubs, the twins come from ra_cuda.o */
#endif
#define TESTING
#include "../model.c"
#include "../ra.c"

#include "check.h"
#include "graphs.h"

static float gauss(uint64_t *st) { /* Box-Muller */
    double u1 = ((double)(splitmix64(st) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(splitmix64(st) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* (rows, ld) with the first d of each row N(0, sd^2), the rest of the row NaN (never read) */
static float *gauss_rows(int rows, int ld, int d, float sd, uint64_t seed) {
    float *m = xmalloc((size_t)(rows > 0 ? rows : 1) * ld * sizeof *m);
    for (size_t r = 0; r < (size_t)rows; r++)
        for (int i = 0; i < ld; i++) m[r * ld + i] = i < d ? sd * gauss(&seed) : NAN;
    return m;
}

/* relative L2 distance of a from b */
/* n token ids drawn uniformly from [0, V) by the seed: a prompt for a random-weight model */
static int32_t *random_tokens(int n, int V, uint64_t seed) {
    int32_t *tok = xmalloc((size_t)n * sizeof *tok);
    for (int t = 0; t < n; t++) tok[t] = (int32_t)(splitmix64(&seed) % (uint64_t)V);
    return tok;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* the larger error, NaN the largest (fmax would drop a NaN: a NaN output must fail the bound) */
static double worse(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

static double dot_d(const float *a, const float *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)a[i] * b[i];
    return s;
}

/* ----------------------------------------------------------------------------
   knn_topk_cuda */

/* One shape. exact = 0: Gaussian data, the tolerance rule; exact = 1: small integers and keys
   drawn from 40 distinct rows (many exact ties), identical ids required. */
static void knn_case(int nq, int nk, int d, int kq, int exact, uint64_t seed) {
    int ldq = d + (int)(seed % 3), ld = d + (int)(seed % 5);   /* strides > d in most cases */
    float *Q = gauss_rows(nq, ldq, d, 1.0f, seed), *K = gauss_rows(nk, ld, d, 1.0f, seed + 7);
    if (exact) {
        uint64_t st = seed;
        float *base = xmalloc((size_t)40 * d * sizeof *base);   /* (40, d) the distinct keys */
        for (int r = 0; r < 40 * d; r++) base[r] = (float)((int)(splitmix64(&st) % 7) - 3);
        for (int j = 0; j < nk; j++) memcpy(K + (size_t)j * ld, base + (size_t)(splitmix64(&st) % 40) * d, (size_t)d * sizeof(float));
        for (int r = 0; r < nq; r++)
            for (int i = 0; i < d; i++) Q[(size_t)r * ldq + i] = (float)((int)(splitmix64(&st) % 7) - 3);
        free(base);
    }
    size_t n = (size_t)nq * kq;
    int32_t *cpu = xmalloc(n * sizeof *cpu), *gpu = xmalloc(n * sizeof *gpu);
    int *seen = xcalloc((size_t)(nk > 0 ? nk : 1), sizeof *seen);   /* query+1 that listed a key */
    int32_t *tq_cpu = xmalloc((size_t)(nk + 1) * sizeof *tq_cpu), *tq_gpu = xmalloc((size_t)(nk + 1) * sizeof *tq_gpu);
    for (size_t i = 0; i < n; i++) gpu[i] = -2;
    for (int j = 0; j < nk; j++) tq_gpu[j] = -2;
    double t0 = now_s();
    knn_topk(Q, nq, ldq, K, nk, ld, d, kq, cpu, tq_cpu, 8);
    double t1 = now_s();
    int rc = knn_topk_cuda(Q, nq, ldq, K, nk, ld, d, kq, gpu, tq_gpu);
    double t2 = now_s();
    long tq_bad = 0, tq_swaps = 0;   /* each key's top query: the same, or a near tie when not exact */
    for (int j = 0; j < nk && rc == 0; j++) {
        int32_t c = tq_cpu[j], g = tq_gpu[j];
        if (c == g) continue;
        if (c < 0 || g < 0 || g >= nq || exact) { tq_bad++; continue; }
        double sc = dot_d(Q + (size_t)c * ldq, K + (size_t)j * ld, d), sg = dot_d(Q + (size_t)g * ldq, K + (size_t)j * ld, d);
        if (fabs(sc - sg) <= 1e-4 * fmax(fabs(sc), fabs(sg))) tq_swaps++; else tq_bad++;
    }
    check(rc == 0 && tq_bad == 0, "knn_topk_cuda's top query of each key, nq %d nk %d d %d%s: %ld bad, %ld near-tie swaps",
          nq, nk, d, exact ? " (integer ties)" : "", tq_bad, tq_swaps);
    free(tq_cpu), free(tq_gpu);
    long bad = 0, swaps = 0;
    for (int q = 0; q < nq && rc == 0; q++)
        for (int j = 0; j < kq; j++) {
            int32_t c = cpu[(size_t)q * kq + j], g = gpu[(size_t)q * kq + j];
            if (g >= 0 && g < nk && seen[g] == q + 1) { bad++; continue; }   /* listed twice */
            if (g >= 0 && g < nk) seen[g] = q + 1;
            if (c == g) continue;
            if (c < 0 || g < 0 || g >= nk || exact) { bad++; continue; }    /* padding differs */
            double sc = dot_d(Q + (size_t)q * ldq, K + (size_t)c * ld, d);
            double sg = dot_d(Q + (size_t)q * ldq, K + (size_t)g * ld, d);
            if (fabs(sc - sg) <= 1e-4 * fmax(fabs(sc), fabs(sg))) swaps++; else bad++;
        }
    check(rc == 0 && bad == 0, "knn_topk_cuda nq %d nk %d d %d kq %d%s: %ld bad, %ld near-tie swaps "
          "(cpu %.2fs, gpu %.2fs)", nq, nk, d, kq, exact ? " (integer ties)" : "", bad, swaps, t1 - t0, t2 - t1);
    free(Q); free(K); free(cpu); free(gpu); free(seen);
}

static void test_knn(void) {
    knn_case(1, 1, 64, 1, 0, 1);
    knn_case(1, 1, 64, 100, 0, 2);          /* padding */
    knn_case(7, 90, 128, 130, 0, 3);        /* nk < kq */
    knn_case(333, 4097, 64, 100, 0, 4);     /* a key tile and one key */
    knn_case(4097, 8192, 64, 1, 0, 5);      /* a query tile and one query */
    knn_case(5000, 20000, 128, 130, 0, 6);  /* 2 query tiles, 5 key tiles */
    knn_case(1000, 20000, 64, 100, 0, 7);
    knn_case(64, 3000, 128, 1024, 0, 8);    /* the largest kq */
    knn_case(200, 9000, 64, 130, 1, 9);     /* ties */
    knn_case(50, 5000, 128, 1, 1, 10);
    knn_case(3, 1200, 64, 1024, 1, 11);
    /* a query stride past what a 2D copy's pitch may be (--q-stride on a huge prompt): two
       queries 8 GiB apart in a reserved-but-untouched mapping answer as the same two side by side */
    {
        int d = 64, nk = 3000, kq = 50;
        float *Q2 = gauss_rows(2, d, d, 1.0f, 12), *K2 = gauss_rows(nk, d, d, 1.0f, 13);
        size_t big = ((size_t)2 << 30) + 64, bytes = (big + d) * sizeof(float);
        float *Qbig = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (Qbig == MAP_FAILED)   /* strict overcommit or ulimit -v: the machine's limit, not the GPU path's */
            printf("cuda: the 8 GiB query-stride case skipped: no 8 GiB mapping here (%s)\n", strerror(errno));
        else {
            int32_t *ref = xmalloc(2 * (size_t)kq * sizeof *ref), *got = xmalloc(2 * (size_t)kq * sizeof *got);
            memcpy(Qbig, Q2, (size_t)d * sizeof(float));
            memcpy(Qbig + big, Q2 + d, (size_t)d * sizeof(float));
            int rc0 = knn_topk_cuda(Q2, 2, d, K2, nk, d, d, kq, ref, NULL), rc1 = knn_topk_cuda(Qbig, 2, big, K2, nk, d, d, kq, got, NULL);
            check(rc0 == 0 && rc1 == 0 && !memcmp(ref, got, 2 * (size_t)kq * sizeof *ref),
                  "knn_topk_cuda with a query stride of %zu floats (8 GiB, past a 2D copy's pitch)", big);
            free(ref), free(got);
            munmap(Qbig, bytes);
        }
        free(Q2), free(K2);
    }
    float q[64] = {0}, k[64] = {0};
    int32_t ids[2] = {7, 7};
    check(knn_topk_cuda(q, 1, 64, k, 1, 64, 64, 1025, ids, NULL) == -1, "knn_topk_cuda kq 1025: -1");
    check(knn_topk_cuda(q, 1, 64, k, 1, 64, 64, 0, ids, NULL) == 0 && ids[0] == 7, "knn_topk_cuda kq 0: nothing written");
}

/* ----------------------------------------------------------------------------
   attn_partial_cuda */

static void attn_case(int n_heads, int n_kv, int d, int ctx, int p0, int p1, float qsd, uint64_t seed) {
    int n = p1 - p0, group = n_heads / n_kv;
    float scale = 1.0f / sqrtf((float)d);
    float *q = gauss_rows(n_heads, d, d, qsd, seed);
    float *K = gauss_rows(n_kv * ctx, d, d, 1.0f, seed + 1), *V = gauss_rows(n_kv * ctx, d, d, 1.0f, seed + 2);
    float *o = xmalloc((size_t)n_heads * d * sizeof *o), *zm = xmalloc((size_t)n_heads * sizeof *zm);
    float *se = xmalloc((size_t)n_heads * sizeof *se), *oc = xmalloc((size_t)d * sizeof *oc);
    int rc = attn_partial_cuda(q, n_heads, K, V, n_kv, ctx, p0, p1, d, scale, o, zm, se);
    double eo = 0, em = 0, es = 0;   /* worst relative errors: o (2-norm), zmax, sumexp */
    for (int h = 0; h < n_heads && rc == 0; h++) {
        size_t base = ((size_t)(h / group) * ctx + p0) * d;
        float mc, sc;
        attn_partial(q + (size_t)h * d, rows_f32(K + base, d), rows_f32(V + base, d), NULL, n, d, scale, oc, &mc, &sc);
        double num = 0, den = 0;
        for (int i = 0; i < d; i++) {
            double g = o[(size_t)h * d + i], c = oc[i];
            num += (g - c) * (g - c), den += c * c;
        }
        eo = worse(eo, n == 0 ? sqrt(num) : sqrt(num / den));
        if (n == 0) { /* the empty set: -inf, 0 */
            if (!(isinf(zm[h]) && zm[h] < 0 && isinf(mc) && mc < 0) || se[h] != 0 || sc != 0) em = es = 1;
            continue;
        }
        em = worse(em, fabs((double)zm[h] - mc) / fmax(1.0, fabs(mc)));
        es = worse(es, fabs((double)se[h] - sc) / sc);
    }
    check(rc == 0 && eo < 1e-5 && em < 1e-5 && es < 1e-5, "attn_partial_cuda heads %d/%d d %d [%d, %d) of %d: "
          "rel err o %.2e zmax %.2e sumexp %.2e", n_heads, n_kv, d, p0, p1, ctx, eo, em, es);
    free(q); free(K); free(V); free(o); free(zm); free(se); free(oc);
}

static void test_attn(void) {
    attn_case(4, 4, 64, 100, 0, 100, 1.0f, 21);
    attn_case(1, 1, 64, 1, 0, 1, 1.0f, 22);           /* one key */
    attn_case(9, 3, 128, 5000, 17, 4999, 2.0f, 23);   /* GQA group 3, peaky */
    attn_case(8, 2, 128, 300, 150, 150, 1.0f, 24);    /* empty range */
    attn_case(6, 3, 80, 500, 3, 400, 1.5f, 25);       /* d not a multiple of 32 */
    attn_case(32, 8, 128, 20000, 0, 20000, 1.0f, 26);
    attn_case(14, 2, 64, 1000, 960, 1000, 3.0f, 27);  /* a window at the end */
    float q[600] = {0}, o[600], zm, se;
    check(attn_partial_cuda(q, 1, q, q, 1, 1, 0, 1, 600, 1.0f, o, &zm, &se) == -1, "attn_partial_cuda d 600: -1");
    check(attn_partial_cuda(q, 3, q, q, 2, 1, 0, 1, 64, 1.0f, o, &zm, &se) == -1, "attn_partial_cuda heads 3/2: -1");
}

/* ----------------------------------------------------------------------------
   attn_causal_cuda (the prefill's fused attention kernel) vs attention_layer's causal attention
   on the CPU. The kernel's products take fp16 operands (q, k, the weights p, v) and sum in fp32,
   so outputs differ by about 1e-3 relative (a float model of the kernel gave 3e-4 on such data);
   bound: 5e-3 relative L2 per query head. Sizes: query blocks of 64 cut short, key tiles of 64
   cut short, batches starting mid-cache, GQA, one query, one key.
   big: one key of KV head 0, at position pb, holds 1e5 (past fp16's largest, 65504) in
   dimension 0, where every query holds 1, and its value holds +-7e4 in every other dimension.
   The kernel saturates its fp16 inputs at 65504 (half_sat), so the queries at pb and after
   give that key all their weight (a score of 65504 scale, thousands above the rest) and
   output its saturated value; the CPU computes on copies saturated at 65504. Without the
   saturation the key would be inf in fp16 and the outputs NaN. */

static void causal_case(int n, int p0, int n_heads, int n_kv, int hd, float qsd, int big, uint64_t seed) {
    Model m;
    memset(&m, 0, sizeof m);
    m.c.n_layers = 1, m.c.n_heads = n_heads, m.c.n_kv_heads = n_kv, m.c.head_dim = hd, m.c.dim = n_heads * hd;
    int ctx = p0 + n, qd = n_heads * hd;
    Pool *pool = build_pool(4);
    State s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx, s.pool = pool;
    float *K = gauss_rows(n_kv * ctx, hd, hd, 1.0f, seed), *V = gauss_rows(n_kv * ctx, hd, hd, 1.0f, seed + 1);
    s.k = K, s.v = V;
    s.q = gauss_rows(n, qd, qd, qsd, seed + 2);
    s.att = xmalloc((size_t)n * qd * sizeof(float));
    s.att_work_stride = attn_work_floats(&m.c);
    s.att_work = xmalloc((size_t)pool_threads(pool) * s.att_work_stride * sizeof(float));
    float *out = xmalloc((size_t)n * qd * sizeof(float));
    int pb = p0 + n / 2;
    if (big) {
        for (int t = 0; t < n; t++)
            for (int h = 0; h < n_heads; h++) s.q[(size_t)t * qd + (size_t)h * hd] = 1.0f;
        K[(size_t)pb * hd] = 1e5f;
        for (int i = 1; i < hd; i++) V[(size_t)pb * hd + i] = i % 2 ? 7e4f : -7e4f;
    }
    int rc = attn_causal_cuda(s.q, n, p0, K, V, n_heads, n_kv, ctx, hd, out);
    if (big) {   /* the CPU's inputs as the kernel's half_sat leaves them */
        K[(size_t)pb * hd] = 65504.0f;
        for (int i = 1; i < hd; i++) V[(size_t)pb * hd + i] = i % 2 ? 65504.0f : -65504.0f;
    }
    attention_layer(&m, &s, 0, n, p0);
    double worst = 0;
    for (int t = 0; t < n && rc == 0; t++)
        for (int h = 0; h < n_heads; h++) {
            size_t at = (size_t)t * qd + (size_t)h * hd;
            worst = worse(worst, rel_l2(out + at, s.att + at, (size_t)hd));
        }
    check(rc == 0 && worst < 5e-3, "attn_causal_cuda %d queries at %d, heads %d/%d, d %d%s: worst rel err %.2e per head",
          n, p0, n_heads, n_kv, hd, big ? ", a key and a value past fp16's range (saturated)" : "", worst);
    free(s.k), free(s.v), free(s.q), free(s.att), free(s.att_work), free(out);
    free_pool(pool);
}

static void test_attn_causal(void) {
    causal_case(150, 70, 6, 2, 64, 0.5f, 0, 31);
    causal_case(64, 0, 3, 1, 128, 0.5f, 0, 32);
    causal_case(1, 0, 2, 2, 64, 1.0f, 0, 33);             /* one query, one key */
    causal_case(1, 4000, 32, 8, 128, 0.5f, 0, 34);        /* one query past a long cache */
    causal_case(1000, 1000, 9, 3, 64, 1.0f, 0, 35);       /* the default model's heads */
    causal_case(333, 0, 32, 8, 128, 0.3f, 0, 36);         /* the 8B shape's heads */
    causal_case(200, 50, 6, 2, 64, 0.5f, 1, 37);          /* fp16 saturation */
    causal_case(100, 0, 4, 4, 128, 0.5f, 1, 38);
    float q[64] = {0}, o[64];
    check(attn_causal_cuda(q, 1, 0, q, q, 1, 1, 1, 80, o) == -1, "attn_causal_cuda d 80: -1 (64 and 128 only)");
    check(attn_causal_cuda(q, 2, 0, q, q, 1, 1, 1, 64, o) == -1, "attn_causal_cuda 2 queries in a 1-position cache: -1");
}

/* ----------------------------------------------------------------------------
   build_ra_index with gpu_knn: the CPU KNN's graph. With small integers every score is exact
   on both, so the KNN lists and the graphs are the same bit for bit. With Gaussian data the two
   KNNs may order near ties differently (knn_case's swaps), which moves a few edges only. */

/* edges and entry points of b that differ from a's, over all edges of a */
static long graph_diff(const RAIndex *a, const RAIndex *b, int nk, long *edges) {
    long diff = a->entry != b->entry || a->n_entry != b->n_entry;
    for (int i = 0; i < a->n_entry && i < b->n_entry; i++) diff += a->entries[i] != b->entries[i];
    *edges = 0;
    for (int i = 0; i < nk; i++) {
        diff += a->deg[i] != b->deg[i];
        *edges += a->deg[i];
        for (int j = 0; j < a->deg[i] && j < b->deg[i]; j++) diff += a->adj[(size_t)i * a->M + j] != b->adj[(size_t)i * b->M + j];
    }
    return diff;
}

static void gpu_knn_case(int integers) {
    int nq = 3000, nk = 2500, d = 64;
    float *Q = gauss_rows(nq, d, d, 1.0f, 41), *K = gauss_rows(nk, d, d, 1.0f, 42);
    if (integers) {
        uint64_t st = 43;
        for (size_t i = 0; i < (size_t)nq * d; i++) Q[i] = (float)((int)(splitmix64(&st) % 9) - 4);
        for (size_t i = 0; i < (size_t)nk * d; i++) K[i] = (float)((int)(splitmix64(&st) % 9) - 4);
    }
    RAParams p = ra_default_params();
    p.nthreads = 4;
    RAIndex a, b;
    build_ra_index(&a, Q, nq, d, K, nk, d, d, &p);
    p.gpu_knn = 1;
    build_ra_index(&b, Q, nq, d, K, nk, d, d, &p);
    long edges, diff = graph_diff(&a, &b, nk, &edges);
    /* knn_gpu: a failed knn_topk_cuda falls back to knn_topk_blocked: the CPU against itself */
    int ok = integers ? diff == 0 : diff * 200 <= edges;
    check(ok && b.knn_gpu && !a.knn_gpu, "build_ra_index, KNN on the GPU (%s), %s: the CPU KNN's graph and entry "
          "points %s (%d keys, %ld differences in %ld edges; KNN %.3fs vs %.3fs)",
          b.knn_gpu ? "it ran there" : "IT FELL BACK TO THE CPU", integers ? "integer data" : "Gaussian data",
          integers ? "bit for bit" : "but at most 0.5% of the edges", nk, diff, edges, a.t_knn, b.t_knn);
    free_ra_index(&a), free_ra_index(&b), free(Q), free(K);
}

static void test_index_gpu_knn(void) {
    gpu_knn_case(1);
    gpu_knn_case(0);
}

/* ----------------------------------------------------------------------------
   forward_cuda vs forward

   Tolerances: the GPU rounds weights and GEMM inputs to fp16 (11-bit significand, relative
   rounding 2^-11 = 4.9e-4) and sums in another order; over the layers these errors add up, so a
   model's keys, values and logits may differ by a few 1e-3 relative (L2). Bounds: 2e-2 for
   logits and the cache, and on the trained model the greedy token (argmax) must be the same
   wherever the CPU's top two logits are more than 1% of their range apart. */


static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* does the CPU's argmax stand clear of the runner-up (1% of the logits' range)? */
static int clear_max(const float *x, int n) {
    int b = argmax(x, n);
    float second = -INFINITY, lo = x[0];
    for (int i = 0; i < n; i++) {
        if (i != b && x[i] > second) second = x[i];
        if (x[i] < lo) lo = x[i];
    }
    return x[b] - second > 0.01f * (x[b] - lo);
}

static int case_cache;   /* the cache type of case_state's states (-ctk, -ctv) */

/* the first layer that attends to every key (not sliding) */
static int first_global(const Config *c) {
    int l = 0;
    while (l < c->n_layers - 1 && layer_sliding(c, l)) l++;
    return l;
}

/* rel_l2 of the first n positions of KV head h of layer l, keys (v 0) or values, of two states
 * of one cache type, as floats; of a sliding layer's ring, every row it holds */
static double cache_rel(const State *a, const State *b, const Config *c, int v, int l, int h, int n) {
    int hd = c->head_dim;
    if (n > kv_ring(a, l)) n = kv_ring(a, l);
    float *x = xmalloc((size_t)n * hd * sizeof *x), *y = xmalloc((size_t)n * hd * sizeof *y);
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * hd, *yi = y + (size_t)i * hd;
        const float *ra = row_f32(cache_rows(a, c, v, l, h), i, hd, xi), *rb = row_f32(cache_rows(b, c, v, l, h), i, hd, yi);
        if (ra != xi) memcpy(xi, ra, hd * sizeof *xi);
        if (rb != yi) memcpy(yi, rb, hd * sizeof *yi);
    }
    double e = rel_l2(x, y, (size_t)n * hd);
    free(x), free(y);
    return e;
}

/* a state for ctx positions with the mode's attention attached (queries kept for an ra build) */
static int case_state(State *s, Attention **A, const Model *m, int ctx, int n_prompt, int mode, int topk, int gpu_knn,
                      Pool *pool) {
    char err[ERR_LEN];
    AttnParams ap = {0};
    ap.mode = mode, ap.sink = 16, ap.window = 64, ap.topk = topk, ap.ef = 2 * topk, ap.nq_knn = 100, ap.max_degree = 35;
    ap.q_stride = 1, ap.warm = 1, ap.gpu = gpu_knn, ap.cache_type = case_cache;
    if (build_state(s, m, ctx, 256, case_cache, pool, err) || build_attention(A, m, &ap, ctx, n_prompt, pool_threads(pool), err)) {
        check(0, "forward_cuda: state: %s", err);
        return -1;
    }
    attach_attention(s, *A);
    if (mode == ATTN_RA) {
        s->q_keep = xmalloc((size_t)n_prompt * m->c.n_heads * m->c.head_dim * sizeof(float));
        s->q_keep_n = n_prompt;
    }
    return 0;
}

/* the prefill is over: decoding may begin once every index has taken over (--index-wait) */
static void builds_taken_over(Attention *A) {
    attention_prefill_done(A, NULL, NULL);
    attention_wait_build(A);
}

static void free_case_state(State *s, Attention *A) {
    free(s->q_keep), s->q_keep = NULL;
    free_attention(A);
    free_state(s);
}

/* Alg. 1's plain step (ra_step_head, on the CPU) is the oracle of the GPU path's decoding step
 * too: o_W on the device (attention_w_source) and the insertions a step ahead
 * (attention_insert_ahead). After each global layer of each step, every query head runs
 * ra_step_head on its own copy of the index, from the same query: the same Omega (ids and
 * order) and, once the last insertions are done, the same graphs; outputs within GPU_ORACLE_ERR
 * relative (o_W is the device's sum). The traced head's --trace record is the oracle's. */
enum { GPU_ORACLE_ERR_E6 = 1000 };   /* 1e-3 */
typedef struct {
    Attention *A;
    HeadStep *hs;               /* (n_layers, n_heads) the oracle's heads */
    int32_t *prev;              /* (n_layers, n_heads, topk) their seeds */
    RAIndex *copies;            /* (n_layers, n_heads) their indexes */
    SearchScratch scratch;
    StepTrace fast;             /* the GPU path's record of the traced head */
    long heads, same_ids, traced, same_trace;
    double worst;
} GpuOracle;

static void gpu_trace_hook(void *arg, const StepRecord *r) { ((GpuOracle *)arg)->fast = r->st; }

static void gpu_oracle_layer(void *arg, int layer, int pos0, int n) {
    State *s = arg;
    GpuOracle *o = s->progress_arg;
    attention_layer_done(s, layer, pos0, n);
    const Config *c = &o->A->m->c;
    if (n != 1 || layer_sliding(c, layer)) return;
    for (int h = 0; h < c->n_heads; h++) {
        StepTrace tr;
        int is_traced = traced(o->A, layer, h), same, bits;
        double e = oracle_head(o->A, s, layer, pos0, h, &o->hs[layer * c->n_heads + h], &o->scratch,
                               is_traced ? &tr : NULL, &same, &bits);
        o->heads++, o->same_ids += same;
        o->worst = e > o->worst ? e : o->worst;
        if (is_traced) {
            const StepTrace *f = &o->fast;
            o->traced++;
            o->same_trace += tr.pos == f->pos && tr.idx_end == f->idx_end && tr.indexed == f->indexed &&
                             tr.ins_first == f->ins_first && tr.n_ins == f->n_ins && tr.ef == f->ef &&
                             tr.entry == f->entry && tr.n_seeds == f->n_seeds && tr.hops == f->hops &&
                             tr.n_scored == f->n_scored && tr.n_omega == f->n_omega && tr.z_omega == f->z_omega &&
                             tr.s_omega == f->s_omega && fabs(tr.g1 - f->g1) <= 1e-3;
        }
    }
}

/* the oracle of state s's GPU decoding, from copies of its built indexes */
static void gpu_oracle_start(GpuOracle *o, State *s, Attention *A) {
    const Config *c = &A->m->c;
    size_t n = (size_t)c->n_layers * c->n_heads;
    *o = (GpuOracle){.A = A, .hs = calloc(n, sizeof(HeadStep)), .prev = malloc(n * A->p.topk * 4),
                     .copies = calloc(n, sizeof(RAIndex))};
    build_search_scratch(&o->scratch);
    for (size_t i = 0; i < n; i++) {
        o->hs[i].idx_end = A->idx_end, o->hs[i].prev = o->prev + i * A->p.topk;
        if (!layer_sliding(c, (int)(i / c->n_heads)))
            copy_index(&o->copies[i], &A->ra[i], c->head_dim), o->hs[i].ix = &o->copies[i];
    }
    s->layer_done = gpu_oracle_layer, s->progress_arg = o;
    A->p.trace = 1;
    attention_trace(A, NULL, gpu_trace_hook, o);
}

/* after n_dec steps: the counts, then the graphs once the copies take the keys inserted ahead */
static void gpu_oracle_end(GpuOracle *o, State *s, const char *what, int n_dec) {
    Attention *A = o->A;
    const Config *c = &A->m->c;
    insert_wait(A);
    int graphs = 1;
    for (int i = 0; i < c->n_layers * c->n_heads; i++) {
        if (!o->hs[i].ix) continue;
        Rows KH = rows_from(layer_k(s, c, i / c->n_heads, (i % c->n_heads) / (c->n_heads / c->n_kv_heads)), A->p.sink);
        while (o->copies[i].n < A->ra[i].n) ra_insert(&o->copies[i], KH, c->head_dim, &o->scratch);
        graphs &= same_graph(&o->copies[i], &A->ra[i]);
        free_ra_index(&o->copies[i]);
    }
    long want = (long)n_dec * global_layers(c) * c->n_heads;
    check(o->heads == want && o->same_ids == want && graphs && o->worst <= GPU_ORACLE_ERR_E6 * 1e-6 &&
          o->traced == n_dec && o->same_trace == n_dec,
          "forward_cuda %s, --attn ra: Alg. 1's plain step (ra_step_head) against the GPU path's, %d steps: %ld of %ld "
          "(step, layer, head) with the same Omega, the graphs the same after the insertions ahead: %s; outputs within "
          "%.1e relative (%.0e); the traced head's --trace record the oracle's in %ld of %d steps", what, n_dec,
          o->same_ids, o->heads, graphs ? "yes" : "NO", o->worst, GPU_ORACLE_ERR_E6 * 1e-6, o->same_trace, n_dec);
    free(o->hs), free(o->prev), free(o->copies), free_search_scratch(&o->scratch);
    s->layer_done = NULL, s->progress_arg = NULL;
    A->p.trace = 0;
}

/* One model, one mode. Prefill: n_prompt random tokens by forward (state c) and by forward_cuda
 * (state g, device batches of B, the index builds' KNN on the GPU): logits and the whole cache
 * compared. Decoding: n_dec greedy steps by forward from state c and by forward_cuda from state
 * d, which the CPU prefilled like c, so both steps start from the same cache and indexes and
 * differ only by the GPU's arithmetic. */
static void forward_case(const char *path, const char *what, int n_prompt, int B, int mode, int topk, int n_dec, int trained) {
    Model m;
    char err[ERR_LEN];
    if (build_model(&m, path, err)) {
        check(0, "forward_cuda %s: load: %s", what, err);
        return;
    }
    const Config *c = &m.c;
    int ctx = n_prompt + n_dec + 1, hd = c->head_dim, V = c->vocab_size;
    Pool *pool = build_pool(8);
    State sc, sg, sd;
    Attention *Ac = NULL, *Ag = NULL, *Ad = NULL;
    GpuModel *g = NULL, *gd = NULL;
    if (case_state(&sc, &Ac, &m, ctx, n_prompt, mode, topk, 0, pool) || case_state(&sg, &Ag, &m, ctx, n_prompt, mode, topk, 1, pool) ||
        case_state(&sd, &Ad, &m, ctx, n_prompt, mode, topk, 0, pool))
        return;
    if (build_gpu_model(&g, &m, &sg, n_prompt, B, err) || build_gpu_model(&gd, &m, &sd, n_prompt, B, err)) {
        check(0, "forward_cuda %s: build_gpu_model: %s", what, err);
        return;
    }
    int32_t *tok = random_tokens(n_prompt, V, 77);
    float *lc = xmalloc((size_t)V * sizeof *lc);
    double t0 = now_s();
    memcpy(lc, forward(&m, &sc, tok, n_prompt), (size_t)V * sizeof *lc);
    double t1 = now_s();
    const float *lg = forward_cuda(g, &sg, tok, n_prompt);
    double t2 = now_s();
    forward(&m, &sd, tok, n_prompt);
    builds_taken_over(Ac), builds_taken_over(Ag), builds_taken_over(Ad);
    double sd_attn = sd.prefill_attn_s;   /* the decoding steps below add nothing to it */
    if (!lg) {
        check(0, "forward_cuda %s: prefill returned NULL", what);
        return;
    }
    /* State.prefill_attn_s: device time on the GPU, wall time on the CPU, each within its
     * call's time; a one-token prompt is a decoding step, its attention none of it */
    int timed = n_prompt > 1 ? sg.prefill_attn_s > 0 && sg.prefill_attn_s < t2 - t1 && sc.prefill_attn_s > 0 &&
                                   sc.prefill_attn_s < t1 - t0
                             : sg.prefill_attn_s == 0 && sc.prefill_attn_s == 0;
    check(timed, "forward_cuda %s, prefill %d tokens: its attention took %.3f s of %.3f on the GPU (events), %.3f s of "
          "%.3f on the CPU", what, n_prompt, sg.prefill_attn_s, t2 - t1, sc.prefill_attn_s, t1 - t0);
    double e_logit = rel_l2(lg, lc, (size_t)V), e_k = 0, e_v = 0, e_q = 0;
    int knn_gpu = 1;   /* every index of state g built by the GPU's KNN, none of c's */
    if (mode == ATTN_RA) {   /* the last layer's queries, copied on the second stream */
        e_q = rel_l2(sg.q_keep, sc.q_keep, (size_t)n_prompt * c->n_heads * hd);
        for (size_t i = 0; i < (size_t)c->n_layers * c->n_heads; i++)   /* a sliding layer has no index */
            knn_gpu &= layer_sliding(c, (int)(i / c->n_heads)) || (Ag->ra[i].knn_gpu && !Ac->ra[i].knn_gpu);
    }
    int agree = 1;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            e_k = worse(e_k, cache_rel(&sg, &sc, c, 0, l, h, n_prompt));
            e_v = worse(e_v, cache_rel(&sg, &sc, c, 1, l, h, n_prompt));
        }
    if (clear_max(lc, V)) agree &= argmax(lg, V) == argmax(lc, V);
    check(e_logit < 2e-2 && e_k < 2e-2 && e_v < 2e-2 && e_q < 2e-2 && (!trained || agree) && knn_gpu,
          "forward_cuda %s, prefill %d tokens (batches of %d): rel err logits %.2e, keys %.2e, values %.2e, "
          "kept queries %.2e%s%s (cpu %.2fs, gpu %.2fs)", what, n_prompt, B, e_logit, e_k, e_v, e_q,
          trained ? (agree ? ", same argmax" : ", ARGMAX DIFFERS") : "",
          mode != ATTN_RA ? "" : knn_gpu ? ", every index's KNN on the GPU" : ", A KNN NOT ON THE GPU", t1 - t0, t2 - t1);
    double e_dec = 0;
    agree = 1;
    int ahead_ok = 1;
    GpuOracle oracle;
    if (mode == ATTN_RA) gpu_oracle_start(&oracle, &sd, Ad);
    for (int i = 0; i < n_dec; i++) {
        int32_t next = argmax(lc, V);
        memcpy(lc, forward(&m, &sc, &next, 1), (size_t)V * sizeof *lc);
        int lt = first_global(c) + i % (c->n_layers - first_global(c));   /* the traced (layer, head) */
        Ad->p.trace_layer = layer_sliding(c, lt) ? first_global(c) : lt, Ad->p.trace_head = (5 * i + 1) % c->n_heads;
        lg = forward_cuda(gd, &sd, &next, 1);
        if (!lg) {
            e_dec = INFINITY;
            break;
        }
        e_dec = worse(e_dec, rel_l2(lg, lc, (size_t)V));
        if (clear_max(lc, V)) agree &= argmax(lg, V) == argmax(lc, V);
        /* ra: the GPU's step at pos has started the insertions of step pos + 1 (every layer's
         * indexes reach W's start at pos + 1), after its search saw them reach W's start at pos,
         * where the CPU's step leaves them */
        int pos = n_prompt + i;
        for (int l = 0; mode == ATTN_RA && l < c->n_layers; l++)
            ahead_ok &= layer_sliding(c, l) ||
                        (Ad->layer_end[l] == idx_end_at(Ad, pos + 1) && Ac->layer_end[l] == idx_end_at(Ac, pos));
    }
    if (mode == ATTN_RA) gpu_oracle_end(&oracle, &sd, what, n_dec);
    if (mode == ATTN_RA && e_dec < INFINITY) {   /* the last insertions done, each index holds what layer_end says */
        insert_wait(Ad);
        for (int l = 0; l < c->n_layers; l++)
            for (int h = 0; h < c->n_heads && !layer_sliding(c, l); h++) {
                ahead_ok &= Ad->ra[(size_t)l * c->n_heads + h].n == Ad->layer_end[l] - Ad->p.sink;
                ahead_ok &= Ac->ra[(size_t)l * c->n_heads + h].n == Ac->layer_end[l] - Ac->p.sink;
            }
        int lg0 = first_global(c);
        check(ahead_ok, "forward_cuda %s, --attn ra: each GPU step inserts the next step's keys (the indexes one key "
              "ahead of the CPU's, %d keys each at the end)", what, Ad->layer_end[lg0] - Ad->p.sink);
        /* the graphs themselves: where every key inserted is a prefill key (the CPU computed
         * those for both states), one more CPU step brings c's indexes to d's, graph for graph */
        int prefill_keys = 1;
        for (int l = 0; l < c->n_layers; l++) prefill_keys &= layer_sliding(c, l) || Ad->layer_end[l] <= n_prompt;
        if (prefill_keys) {
            int32_t next = argmax(lc, V);
            forward(&m, &sc, &next, 1);
            int same = 1;
            for (int l = 0; l < c->n_layers; l++) {
                same &= Ac->layer_end[l] == Ad->layer_end[l];
                for (int h = 0; h < c->n_heads && !layer_sliding(c, l); h++)
                    same &= same_graph(&Ac->ra[(size_t)l * c->n_heads + h], &Ad->ra[(size_t)l * c->n_heads + h]);
            }
            check(same, "forward_cuda %s, --attn ra: the GPU steps' insertions a step ahead build the CPU steps' graphs, "
                  "bit for bit (%d keys each)", what, Ad->layer_end[lg0] - Ad->p.sink);
        } else
            printf("cuda: forward_cuda %s, --attn ra: graphs not compared: the decoding steps inserted keys the GPU "
                   "computed (their bits differ from the CPU's)\n", what);
    }
    /* in ra mode every global layer's decoding step takes o_W from the device (W kept there), in
     * full none */
    long w_gpu = attention_w_external(Ad), w_want = mode == ATTN_RA ? (long)n_dec * global_layers(c) : 0;
    check(e_dec < 2e-2 && (!trained || agree) && w_gpu == w_want && sd.prefill_attn_s == sd_attn,
          "forward_cuda %s, %d decoding steps, --attn %s%s: worst rel err logits %.2e%s, o_W on the GPU in %ld of %ld layer steps%s",
          what, n_dec, mode == ATTN_RA ? "ra" : "full", mode != ATTN_RA ? "" : topk >= n_prompt ? " (topk: every key)" : " (topk 32)", e_dec,
          trained ? (agree ? ", same greedy tokens where clear" : ", GREEDY TOKEN DIFFERS") : "", w_gpu, w_want,
          sd.prefill_attn_s == sd_attn ? "" : ", THEIR ATTENTION COUNTED AS THE PREFILL'S");
    free_gpu_model(g), free_gpu_model(gd);
    free(tok), free(lc);
    free_case_state(&sc, Ac), free_case_state(&sg, Ag), free_case_state(&sd, Ad);
    free_pool(pool);
    free_model(&m);
}

/* State.q_keep_row on the GPU (keep_queries_gpu): a prefill in device batches of B keeps the
 * queries ra_query_slots maps for --q-stride S (and, S = 0, the default sample, every 2nd query
 * then all of the last RA_RECENT, for a prompt past RA_RECENT) as forward keeps every query, with
 * batches that start at every offset within a gap and a last batch of one row; the row after the
 * last kept one is not written. */
static void kept_rows_case(const char *path, int n_prompt, int B, int S) {
    Model m;
    char err[ERR_LEN];
    if (build_model(&m, path, err)) {
        check(0, "kept queries: load: %s", err);
        return;
    }
    int qd = m.c.n_heads * m.c.head_dim;
    int32_t *row = xmalloc((size_t)n_prompt * sizeof *row);
    int kept = ra_query_slots(n_prompt, S, row);
    Pool *pool = build_pool(8);
    State sc, sg;
    GpuModel *g = NULL;
    if (build_state(&sc, &m, n_prompt, 256, 0, pool, err) || build_state(&sg, &m, n_prompt, 256, 0, pool, err) ||
        build_gpu_model(&g, &m, &sg, n_prompt, B, err)) {
        check(0, "kept queries: %s", err);
        return;
    }
    sc.q_keep = xmalloc((size_t)n_prompt * qd * sizeof(float)), sc.q_keep_n = n_prompt;
    sg.q_keep = xmalloc((size_t)(kept + 1) * qd * sizeof(float)), sg.q_keep_n = kept;
    sg.q_keep_row = row, sg.q_keep_span = n_prompt;
    for (size_t i = 0; i < (size_t)(kept + 1) * qd; i++) sg.q_keep[i] = -12345.0f;
    int32_t *tok = random_tokens(n_prompt, m.c.vocab_size, 91);
    forward(&m, &sc, tok, n_prompt);
    const float *lg = forward_cuda(g, &sg, tok, n_prompt);
    double e = lg ? 0 : INFINITY;
    for (int j = 0; lg && j < n_prompt; j++)   /* the last layer's queries */
        if (row[j] >= 0) e = worse(e, rel_l2(sg.q_keep + (size_t)row[j] * qd, sc.q_keep + (size_t)j * qd, (size_t)qd));
    int untouched = 1;
    for (int i = 0; i < qd; i++) untouched &= sg.q_keep[(size_t)kept * qd + i] == -12345.0f;
    check(e < 2e-2 && untouched, "forward_cuda, queries kept for --q-stride %d (%d tokens, device batches of %d): rel "
          "err of the %d rows kept %.2e against forward's of every query; the row after them untouched: %s", S,
          n_prompt, B, kept, e, untouched ? "yes" : "NO");
    free(tok), free(sc.q_keep), free(sg.q_keep), free(row);
    sc.q_keep = sg.q_keep = NULL;
    free_gpu_model(g);
    free_state(&sc), free_state(&sg);
    free_pool(pool);
    free_model(&m);
}

/* A prompt's rest on the GPU (a context file's, a -cnv turn): forward_cuda of n_first tokens,
 * then of n_rest more at n_first, which reads the first keys back from the host cache, against
 * forward doing the same: logits and the whole cache. Then n_dec decoding steps, whose W the
 * device loads again after the rest; in ra the top-k is every key, as in forward_case. */
static void rest_case(const char *path, const char *what, int n_first, int n_rest, int B, int mode, int n_dec) {
    Model m;
    char err[ERR_LEN];
    if (build_model(&m, path, err)) {
        check(0, "forward_cuda rest %s: load: %s", what, err);
        return;
    }
    const Config *c = &m.c;
    int n = n_first + n_rest, V = c->vocab_size;
    Pool *pool = build_pool(8);
    State sc, sg;
    Attention *Ac = NULL, *Ag = NULL;
    GpuModel *g = NULL;
    if (case_state(&sc, &Ac, &m, n + n_dec + 1, n_first, mode, n + n_dec, 0, pool) ||
        case_state(&sg, &Ag, &m, n + n_dec + 1, n_first, mode, n + n_dec, 1, pool))
        return;
    if (build_gpu_model(&g, &m, &sg, n_first, B, err)) {
        check(0, "forward_cuda rest %s: build_gpu_model: %s", what, err);
        return;
    }
    int32_t *tok = random_tokens(n, V, 29);
    float *lc = xmalloc((size_t)V * sizeof *lc);
    forward(&m, &sc, tok, n_first);
    const float *lg = forward_cuda(g, &sg, tok, n_first);
    builds_taken_over(Ac), builds_taken_over(Ag);
    free(sc.q_keep), free(sg.q_keep);   /* as ./ra frees them after the prefill */
    sc.q_keep = sg.q_keep = NULL;
    memcpy(lc, forward(&m, &sc, tok + n_first, n_rest), (size_t)V * sizeof *lc);
    long up0 = gpu_rest_layers();
    lg = lg ? forward_cuda(g, &sg, tok + n_first, n_rest) : NULL;
    long up = gpu_rest_layers() - up0;   /* n_layers: the rest ran on the device */
    double e_logit = lg ? rel_l2(lg, lc, (size_t)V) : INFINITY, e_k = 0, e_v = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            e_k = worse(e_k, cache_rel(&sg, &sc, c, 0, l, h, n));
            e_v = worse(e_v, cache_rel(&sg, &sc, c, 1, l, h, n));
        }
    check(lg && e_logit < 2e-2 && e_k < 2e-2 && e_v < 2e-2 && sg.n == n && up == c->n_layers,
          "forward_cuda %s: %d tokens, then %d more at %d (batches of %d), on the device (%ld of %d layers took "
          "their earlier keys up): rel err logits %.2e, keys %.2e, values %.2e, s->n %d", what, n_first, n_rest,
          n_first, B, up, c->n_layers, e_logit, e_k, e_v, sg.n);
    double e_dec = lg ? 0 : INFINITY;
    for (int i = 0; lg && i < n_dec; i++) {
        int32_t next = argmax(lc, V);
        memcpy(lc, forward(&m, &sc, &next, 1), (size_t)V * sizeof *lc);
        lg = forward_cuda(g, &sg, &next, 1);
        e_dec = lg ? worse(e_dec, rel_l2(lg, lc, (size_t)V)) : INFINITY;
    }
    long w_gpu = attention_w_external(Ag), w_want = mode == ATTN_RA ? (long)n_dec * global_layers(c) : 0;
    check(e_dec < 2e-2 && w_gpu == w_want,
          "forward_cuda %s: %d decoding steps after the rest, --attn %s: worst rel err logits %.2e, o_W on the GPU in "
          "%ld of %ld layer steps", what, n_dec, mode == ATTN_RA ? "ra" : "full", e_dec, w_gpu, w_want);
    free_gpu_model(g);
    free(tok), free(lc);
    free_case_state(&sc, Ac), free_case_state(&sg, Ag);
    free_pool(pool);
    free_model(&m);
}

/* State.stop on the GPU (Ctrl-C during a prefill): forward_cuda polls it after every device batch
 * and after every layer, as forward does. A stop that turns non-zero at its k-th poll ends the
 * call there: NULL, s->n unchanged, no layer_done after the stop; the same state and GpuModel
 * then run the whole prompt again, with logits that match forward's, so a stop leaves the device
 * usable (its copies done, no batch half-queued on its streams). */
static int stop_polls, stop_at;
static int stop_after(void) { return ++stop_polls >= stop_at; }
static int layers_done;
static void count_layer(void *arg, int layer, int pos0, int n) { (void)arg, (void)layer, (void)pos0, (void)n, layers_done++; }

static void stop_case(const char *path, int n_prompt, int B) {
    Model m;
    char err[ERR_LEN];
    if (build_model(&m, path, err)) {
        check(0, "forward_cuda stop: load: %s", err);
        return;
    }
    int V = m.c.vocab_size, per_layer = (n_prompt + B - 1) / B + 1;   /* polls a layer: one a batch, one after it */
    Pool *pool = build_pool(4);
    State sc, sg;
    GpuModel *g = NULL;
    if (build_state(&sc, &m, n_prompt, 256, 0, pool, err) || build_state(&sg, &m, n_prompt, 256, 0, pool, err) ||
        build_gpu_model(&g, &m, &sg, n_prompt, B, err)) {
        check(0, "forward_cuda stop: %s", err);
        return;
    }
    int32_t *tok = random_tokens(n_prompt, V, 13);
    float *lc = xmalloc((size_t)V * sizeof *lc);
    memcpy(lc, forward(&m, &sc, tok, n_prompt), (size_t)V * sizeof *lc);
    sg.layer_done = count_layer;
    /* the 2nd batch of layer 1, then the poll after layer 0's last batch: before its layer_done */
    int at[2] = {per_layer + 2, per_layer - 1}, want_done[2] = {1, 0};
    for (int i = 0; i < 2; i++) {
        stop_polls = 0, stop_at = at[i], layers_done = 0, sg.stop = stop_after;
        const float *lg = forward_cuda(g, &sg, tok, n_prompt);
        check(!lg && stop_polls == at[i] && sg.n == 0 && layers_done == want_done[i],
              "forward_cuda stop at poll %d (%d polls a layer: %d tokens, batches of %d): %s after %d polls, s->n %d, "
              "%d layer_done calls (want %d)", at[i], per_layer, n_prompt, B, lg ? "logits" : "NULL", stop_polls,
              sg.n, layers_done, want_done[i]);
    }
    sg.stop = NULL, layers_done = 0;
    const float *lg = forward_cuda(g, &sg, tok, n_prompt);
    double e = lg ? rel_l2(lg, lc, (size_t)V) : INFINITY;
    check(lg && e < 2e-2 && sg.n == n_prompt && layers_done == m.c.n_layers,
          "forward_cuda after two stops: the whole prompt again, rel err logits %.2e against forward's, s->n %d, "
          "%d layer_done calls", e, sg.n, layers_done);
    free(tok), free(lc);
    free_gpu_model(g);
    free_state(&sc), free_state(&sg);
    free_pool(pool);
    free_model(&m);
}

/* a random-weight model from tests/bin/gen_model, NULL (and a failed check) when it cannot run */
static const char *gen(const char *path, const char *flags) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "tests/bin/gen_model %s %s --quiet --no-sync --threads 4", path, flags);
    int rc = system(cmd);
    check(rc == 0, "gen_model %s %s", path, flags);
    return rc == 0 ? path : NULL;
}

/* In ra mode a random-weight model's attention is flat, so a key the CPU's search returns and
 * the GPU's q misses (or the reverse) moves the output by more than rounding; there the top-k
 * covers every indexed key, which checks the hybrid step (GPU projections, host W and Omega,
 * Eq. 4-5 merge, GPU FFN) to rounding. The trained model retrieves 32 keys, as a real run does. */
static void test_forward(void) {
    const char *tiny = gen("tests/bin/cuda_tiny.gguf", "--preset tiny --seed 5");
    if (tiny) {
        forward_case(tiny, "tiny", 300, 64, ATTN_FULL, 32, 4, 0);   /* several batches and tiles */
        forward_case(tiny, "tiny", 300, 1000, ATTN_RA, 300, 70, 0);   /* the window (64) turns over once */
        forward_case(tiny, "tiny", 1, 64, ATTN_FULL, 32, 3, 0);     /* a one-token prompt: n == 1 at 0 */
        /* head dim 16 takes the cuBLAS tiles. At 8,000 bytes a tile holds 1,000 scores a head
         * (a group of 2), so the tiles are capped: the buffer, sized for the last batch (300
         * keys), holds 3 rows (900 scores a head), and a tile of the batch that ends at 192
         * keys would take 5 rows, up to 940 scores a head, unless capped at what it holds
         * (attention_tiles refuses a tile past its buffer, so without the cap this case fails) */
        gpu_attention_tile_bytes(8000);
        forward_case(tiny, "tiny, cuBLAS tiles of 8,000 bytes", 300, 64, ATTN_FULL, 32, 2, 0);
        gpu_attention_tile_bytes(0);
        case_cache = CACHE_K_F16 | CACHE_V_F16;   /* a host cache of halves: head dim 16 has no fused kernel */
        forward_case(tiny, "tiny, f16 cache", 300, 1000, ATTN_RA, 300, 70, 0);
        case_cache = CACHE_K_F16;
        forward_case(tiny, "tiny, f16 keys", 300, 64, ATTN_FULL, 32, 4, 0);
        case_cache = 0;
        kept_rows_case(tiny, 301, 100, 3);   /* batches from rows 0, 100, 200, 300: offsets 0, 2, 1, 0 in the stride */
        kept_rows_case(tiny, RA_RECENT + 301, 1000, 0);   /* every 2nd of the first 301 rows, then all */
        stop_case(tiny, 300, 64);
        rest_case(tiny, "tiny, rest", 200, 100, 64, ATTN_FULL, 3);
        rest_case(tiny, "tiny, rest, ra", 200, 150, 64, ATTN_RA, 4);   /* the window (64) full at 200 */
        case_cache = CACHE_K_F16 | CACHE_V_F16;
        rest_case(tiny, "tiny, rest, f16 cache", 200, 100, 1000, ATTN_RA, 3);
        case_cache = CACHE_K_F16;   /* keys halves, values floats: both upload forms */
        rest_case(tiny, "tiny, rest, f16 keys", 200, 100, 64, ATTN_FULL, 2);
        case_cache = 0;
    }
    const char *smol = gen("tests/bin/cuda_smol.gguf", "--preset smollm2-135m --seed 6");
    if (smol) {
        forward_case(smol, "smollm2-135m shape, random", 1500, 512, ATTN_RA, 1500, 4, 0);
        gpu_fused_attention(0);   /* the prefill's attention by the cuBLAS tiles, the fused kernel's oracle */
        forward_case(smol, "smollm2-135m shape, random, cuBLAS tiles", 1500, 512, ATTN_FULL, 32, 2, 0);
        gpu_fused_attention(1);
        /* head dim 64: the fused kernel reads the halves kv_upload left, copied (f16 cache) or
         * made from floats on the device (f32 cache; with f16 keys, the values) */
        case_cache = CACHE_K_F16 | CACHE_V_F16;
        rest_case(smol, "smollm2-135m shape, random, rest, f16 cache", 1000, 500, 256, ATTN_RA, 3);
        case_cache = CACHE_K_F16;
        rest_case(smol, "smollm2-135m shape, random, rest, f16 keys", 1000, 300, 256, ATTN_FULL, 2);
        case_cache = 0;
        rest_case(smol, "smollm2-135m shape, random, rest, f32 cache", 1000, 300, 512, ATTN_RA, 2);
    }
    /* Gemma 3 (gen_model's gemma3-270m preset, cut down to head dim 16 and a window of 8): five
     * sliding layers in six, whose queries see their last 8 keys (the tiles mask the rest) and
     * whose host cache is a ring of 8 + 256 rows, which a 300-token prompt wraps; the q/k and
     * post norms, GELU, the sliding layers' own RoPE; o_W on the device for the global layer */
    const char *gt = gen("tests/bin/cuda_gemma_tiny.gguf",
                         "--preset gemma3-270m --layers 7 --dim 64 --head-dim 16 --ffn 96 --vocab 512 --swa 8 --seed 7");
    if (gt) {
        forward_case(gt, "gemma3 tiny", 300, 64, ATTN_FULL, 32, 4, 0);
        forward_case(gt, "gemma3 tiny, one batch past the ring", 300, 1000, ATTN_RA, 300, 70, 0);
        case_cache = CACHE_K_F16 | CACHE_V_F16;
        forward_case(gt, "gemma3 tiny, f16 cache", 300, 64, ATTN_RA, 300, 20, 0);
        rest_case(gt, "gemma3 tiny, rest, f16 cache, the prefix within the ring", 200, 100, 64, ATTN_FULL, 3);
        case_cache = 0;
        rest_case(gt, "gemma3 tiny, rest from a wrapped ring", 400, 150, 64, ATTN_RA, 4);
        /* tiles of 8,000 bytes (500 scores a head): many, each from its first query's window */
        gpu_attention_tile_bytes(8000);
        forward_case(gt, "gemma3 tiny, cuBLAS tiles of 8,000 bytes", 300, 64, ATTN_FULL, 32, 2, 0);
        gpu_attention_tile_bytes(0);
    }
    /* head dim 64 (as Gemma 3 27B's 128, a fused kernel's): the global layers take the fused
     * kernel, the sliding ones the tiles, and an f32 cache has halves made on the device */
    const char *g64 = gen("tests/bin/cuda_gemma_64.gguf",
                          "--preset gemma3-270m --layers 7 --dim 128 --head-dim 64 --ffn 96 --vocab 512 --swa 8 --seed 9");
    if (g64) {
        forward_case(g64, "gemma3, head dim 64", 300, 64, ATTN_RA, 300, 8, 0);
        rest_case(g64, "gemma3, head dim 64, rest from a wrapped ring", 400, 100, 64, ATTN_FULL, 2);
    }
    /* its full shape: head dim 256 (no fused kernel: the tiles), a window of 512 */
    const char *gs = gen("tests/bin/cuda_gemma.gguf", "--preset gemma3-270m --seed 8");
    if (gs) {
        forward_case(gs, "gemma3-270m shape, random", 1500, 512, ATTN_RA, 1500, 4, 0);
        case_cache = CACHE_K_F16 | CACHE_V_F16;
        rest_case(gs, "gemma3-270m shape, random, rest, f16 cache", 1000, 600, 256, ATTN_FULL, 3);
        case_cache = 0;
    }
    /* 62 layers, Gemma 3 27B's count: queries scaled to 1/sqrt(dim/heads) (q_scale, folded into
     * the q-norm on the device), with head dim 32 where dim/heads is 16 */
    const char *g62 = gen("tests/bin/cuda_gemma_62.gguf",
                          "--preset gemma3-270m --layers 62 --dim 64 --head-dim 32 --ffn 32 --vocab 512 --swa 8 --seed 10");
    if (g62) forward_case(g62, "gemma3, 62 layers (a query scale)", 100, 64, ATTN_FULL, 32, 4, 0);
    const char *gemma = "data/gemma-3-270m-q4_k_m.gguf";
    if (access(gemma, R_OK) == 0) {
        case_cache = CACHE_K_F16 | CACHE_V_F16;
        forward_case(gemma, "Gemma 3 270M, f16 cache", 1200, 256, ATTN_FULL, 32, 8, 1);
        forward_case(gemma, "Gemma 3 270M, f16 cache", 1200, 1024, ATTN_RA, 32, 8, 1);
        case_cache = 0;
    } else
        printf("cuda: forward on Gemma 3 270M skipped: %s not found (make model-gemma)\n", gemma);
    const char *real = "data/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(real, R_OK) == 0) {
        forward_case(real, "default model", 1200, 256, ATTN_FULL, 32, 8, 1);
        forward_case(real, "default model", 1200, 1024, ATTN_RA, 32, 8, 1);
        case_cache = CACHE_K_F16 | CACHE_V_F16;   /* ./ra's default cache, the fused kernel's halves */
        forward_case(real, "default model, f16 cache", 1200, 1024, ATTN_RA, 32, 8, 1);
        gpu_fused_attention(0);
        forward_case(real, "default model, f16 cache, cuBLAS tiles", 1200, 256, ATTN_FULL, 32, 4, 1);
        gpu_fused_attention(1);
        case_cache = 0;
    } else
        printf("cuda: forward on the default model skipped: %s not found (make model)\n", real);
    unlink("tests/bin/cuda_tiny.gguf"), unlink("tests/bin/cuda_smol.gguf");
    unlink("tests/bin/cuda_gemma_tiny.gguf"), unlink("tests/bin/cuda_gemma.gguf"), unlink("tests/bin/cuda_gemma_64.gguf");
}

int main(void) {
    char msg[ERR_LEN];
    if (!ra_cuda_init(msg, sizeof msg)) {
        printf("cuda: skipped: %s\n", msg);
        printf("0 passed, 0 failed\n");
        return 0;
    }
    printf("cuda: %s\n", msg);
    test_knn();
    test_attn();
    test_attn_causal();
    test_index_gpu_knn();
    test_forward();
    printf("cuda: device memory in use at most %.0f MiB\n", gpu_peak_mb());
    ra_cuda_free_all();
    return check_summary();
}
