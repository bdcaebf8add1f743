/* test_cuda.c - the GPU twins of ra_cuda.cu against their CPU functions in ra.c:
   knn_topk_cuda vs knn_topk (§3.2) and attn_partial_cuda vs attn_partial (Eq. 4).

   make tests/bin/test_cuda && ./tests/bin/test_cuda
   Final line "N passed, N failed", exit 1 on failure. Without a usable CUDA device it prints
   "cuda: skipped: <reason>" and "0 passed, 0 failed" and exits 0.

   Scores from cuBLAS are summed in another order than dot8, so ids may differ from the CPU's
   where two keys score within rounding. The rule: position by position, the GPU's key must
   score (in double, on the host) within 1e-4 relative of the CPU's key at that position; with
   integer data (exact scores in any order) the ids must be identical, ties to the lower id. */

#ifndef RA_CUDA
#define RA_CUDA   /* ra.c: no stubs, the twins come from ra_cuda.o */
#endif
#define TESTING
#include "../model.c"
#include "../ra.c"

#include "check.h"

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
    for (size_t i = 0; i < n; i++) gpu[i] = -2;
    double t0 = now_s();
    knn_topk(Q, nq, ldq, K, nk, ld, d, kq, cpu, 8);
    double t1 = now_s();
    int rc = knn_topk_cuda(Q, nq, ldq, K, nk, ld, d, kq, gpu);
    double t2 = now_s();
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
    float q[64] = {0}, k[64] = {0};
    int32_t ids[2] = {7, 7};
    check(knn_topk_cuda(q, 1, 64, k, 1, 64, 64, 1025, ids) == -1, "knn_topk_cuda kq 1025: -1");
    check(knn_topk_cuda(q, 1, 64, k, 1, 64, 64, 0, ids) == 0 && ids[0] == 7, "knn_topk_cuda kq 0: nothing written");
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
        attn_partial(q + (size_t)h * d, K + base, d, V + base, d, NULL, n, d, scale, oc, &mc, &sc);
        double num = 0, den = 0;
        for (int i = 0; i < d; i++) {
            double g = o[(size_t)h * d + i], c = oc[i];
            num += (g - c) * (g - c), den += c * c;
        }
        eo = fmax(eo, n == 0 ? sqrt(num) : sqrt(num / den));
        if (n == 0) { /* the empty set: -inf, 0 */
            if (!(isinf(zm[h]) && zm[h] < 0 && isinf(mc) && mc < 0) || se[h] != 0 || sc != 0) em = es = 1;
            continue;
        }
        em = fmax(em, fabs((double)zm[h] - mc) / fmax(1.0, fabs(mc)));
        es = fmax(es, fabs((double)se[h] - sc) / sc);
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
    ra_cuda_free_all();
    return check_summary();
}
