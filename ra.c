/* ra.c - RetrievalAttention (Liu et al., 2024, "RetrievalAttention: Accelerating Long-Context
 * LLM Inference via Vector Retrieval"), to be read alongside the paper.
 *
 * Part 1, the method, in the paper's order: attention over a set of keys and the merge (Eq. 1-5),
 * the attention-aware index (§3.2), its search (Alg. 1 line 7) and insertion (lines 4-5), the
 * decoding step (Alg. 1), then the baselines. Part 2 runs it in the engine, every head of a layer
 * at once, with the index builds beside the prefill; Part 3 is the ./ra program. The engine (GGUF,
 * tokenizer, forward pass, the fast kernels) is model.c; the GPU twins are ra_cuda.cu.
 * Index: Chen et al., "RoarGraph: A Projected Bipartite Graph for Efficient Cross-Modal
 * Approximate Nearest Neighbor Search" (VLDB 2024). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ra.h"

/* ============================================================================================
 * Part 1: the method
 *
 * Keys of one KV head are the rows of K, row i at K + i*ld; a key's id is its row. Indexes hold
 * ids, never copies, so the query heads of a GQA group share one K (App. C). Scores are q.k by
 * dot8 (1/sqrt(d) changes no ranking); every top-k breaks ties by the lower id.
 * ============================================================================================ */

/* ---- 1. Attention over a set of keys (§2.1, §3.1) and the merge (App. B) ------------------- */

/* Eq. (1), literally: z_i = scale q.k_i over keys 0..n-1, a = softmax(z), o_t = sum a_i v_i, in
 * double. The oracle of the partial and merged forms and of every fast kernel. out is (d). */
void attn_full(const float *q, Rows K, Rows V, int n, int d, float scale, float *out) {
    double *a = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *a);   /* (n) z_i, then a_{t,i} */
    double *acc = xcalloc((size_t)(d > 0 ? d : 1), sizeof *acc);   /* (d) o_t */
    float *vb = xmalloc((size_t)(d > 0 ? d : 1) * sizeof *vb);     /* (d) a value row */
    double zmax = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; j++) {
        a[j] = scale * dot_row(q, K, j, d);
        if (a[j] > zmax) zmax = a[j];
    }
    for (int j = 0; j < n; j++) sum += exp(a[j] - zmax);
    for (int j = 0; j < n; j++) a[j] = exp(a[j] - zmax) / sum;   /* softmax, max subtracted */
    for (int j = 0; j < n; j++) {
        const float *v = row_f32(V, j, d, vb);
        for (int i = 0; i < d; i++) acc[i] += a[j] * v[i];   /* o_t = sum a v */
    }
    for (int i = 0; i < d; i++) out[i] = (float)acc[i];
    free(a), free(acc), free(vb);
}

/* Eq. (2), and each partial of Eq. (4): o = sum e^{z_i - zmax} v_i / sum e^{z_i - zmax} over the
 * keys ids[0..n) (NULL: 0..n-1), with the local max zmax (z~) and sumexp = sum e^{z_i - zmax}.
 * One pass with a running max, as FlashAttention. Empty: o = 0, zmax = -INF, sumexp = 0. */
void attn_partial(const float *q, Rows K, Rows V, const int32_t *ids, int n, int d, float scale,
                  float *o, float *zmax, float *sumexp) {
    enum { CHUNK = 128 };
    float z[CHUNK], m = -INFINITY, s = 0.0f;   /* scores of a chunk; running max and sum */
    float vb[HEAD_DIM_MAX];                    /* a value row converted from halves */
    for (int i = 0; i < d; i++) o[i] = 0.0f;   /* running sum of e^{z_i - m} v_i */
    for (int j0 = 0; j0 < n; j0 += CHUNK) {
        int nb = n - j0 < CHUNK ? n - j0 : CHUNK;
        float cm = m;
        dot_rows(q, ids ? K : rows_from(K, (size_t)j0), ids ? ids + j0 : NULL, nb, d, z);
        for (int j = 0; j < nb; j++) {
            z[j] = scale * z[j];
            cm = z[j] > cm ? z[j] : cm;
        }
        if (cm > m) {   /* rescale what is summed so far to the new max */
            float r = m == -INFINITY ? 0.0f : expf(m - cm);
            s *= r;
            for (int i = 0; i < d; i++) o[i] *= r;
            m = cm;
        }
        for (int j = 0; j < nb; j++) {
            size_t id = (size_t)(ids ? ids[j0 + j] : j0 + j);
            float w = expf(z[j] - m);
            const float *v = row_f32(V, id, d, vb);
            s += w;
            for (int i = 0; i < d; i++) o[i] += w * v[i];
        }
    }
    float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < d; i++) o[i] *= inv;
    *zmax = m;
    *sumexp = s;
}

/* Eq. (4)-(5): out = g1 o1 + g2 o2 over the union of two disjoint sets, Eq. (3). An empty side
 * gets g = 0 and is not read; a side whose sum is NaN makes out NaN, as Eq. (1) would be.
 * m_out, s_out (optional) describe the union, so merges chain; out (d) may alias o1 or o2. */
void attn_merge(const float *o1, float m1, float s1, const float *o2, float m2, float s2,
                int d, float *out, float *m_out, float *s_out) {
    float g1, g2;
    double total = attn_gammas(m1, s1, m2, s2, &g1, &g2);   /* sum_I e^{z_i - z~} */
    for (int i = 0; i < d; i++)                             /* Eq. (4) */
        out[i] = (g1 != 0.0f ? g1 * o1[i] : 0.0f) + (g2 != 0.0f ? g2 * o2[i] : 0.0f);
    if (m_out) *m_out = total != 0.0 ? (m1 > m2 ? m1 : m2) : -INFINITY;   /* z~ */
    if (s_out) *s_out = (float)total;
}

/* Eq. (5): gamma_1, gamma_2 of two partials with maxima z~1, z~2 and sums s1, s2, in double;
 * returns sum_I e^{z_i - z~} over their union, z~ the larger maximum. An empty side gets 0. */
double attn_gammas(float m1, float s1, float m2, float s2, float *g1, float *g2) {
    double z = m1 > m2 ? m1 : m2;                      /* z~ */
    double e1 = s1 != 0.0f ? exp(m1 - z) * s1 : 0.0;   /* e^{z~1 - z~} sum_W e^{z_i - z~1} */
    double e2 = s2 != 0.0f ? exp(m2 - z) * s2 : 0.0;   /* e^{z~2 - z~} sum_O e^{z_i - z~2} */
    double total = e1 + e2;
    *g1 = e1 != 0.0 ? (float)(e1 / total) : 0.0f;
    *g2 = e2 != 0.0 ? (float)(e2 / total) : 0.0f;
    return total;
}

/* ---- 2. The attention-aware index (§3.2, Fig. 3b) ------------------------------------------- */

/* Each prefill query is linked to its exact top-Nq keys (step a, the KNN), then projected away
 * (b): keys one query wants are linked to each other; RoarGraph's reverse edges (c) and
 * connectivity (d) complete the graph. Node v is key v. Invariants, kept by every build and
 * insertion: no self loops, no repeated edges, deg <= M, every node reachable from the entry. */

enum { RA_ENTRIES = 16 };               /* RAParams.n_entry's default (other_entries) */

RAParams ra_default_params(void) {
    RAParams p = {.nq_knn = 100, .max_degree = 24, .q_stride = 0, .ef_conn = ra_default_ef_conn(0),
                  .nthreads = 1, .n_guide = 1024, .capacity = 0, .gpu_knn = 0, .conn_seed = 1,
                  .conn_search = 0, .n_entry = RA_ENTRIES, .plain_knn = 0, .trace_keys = 0};
    return p;
}

static void grow_ra_index(RAIndex *ix, int cap);
static int32_t *query_sample_rows(int nq, int q_stride, int *m);
static void sample_rows(const float *Q, size_t ldq, int nh, int d, const int32_t *rows, int m,
                        float *out);
static void project(RAIndex *ix, Rows K, int d, const int32_t *knn, int n_query, int Nq,
                    int nthreads);
static void add_reverse_edges(RAIndex *ix, Rows K, int d, int nthreads);
static void choose_entries(RAIndex *ix, const int32_t *knn, int n_query, int Nq, int nk,
                           int n_entry);
static void connect_unreachable(RAIndex *ix, Rows K, int d, const int32_t *knn, int Nq,
                                const int32_t *top_query, const RAParams *p);
static void keep_guides(RAIndex *ix, const float *Q, size_t ldqs, int n_query, Rows K, int d,
                        const int32_t *knn, int Nq, int n_guide);
static void trace_lists(RAIndex *ix, const int32_t *knn, size_t n);
static long count_edges(const RAIndex *ix, int *linked, int *deg_max);

/* §3.2: the index over keys 0..nk-1 of K from the prefill queries Q (nq x d, stride ldq), steps
 * (a)-(d); the graph is the same for any thread count. Returns 0. Departures: the queries are a
 * sample (ra_query_sample), and each is linked to all the keys, later positions too. */
int build_ra_index(RAIndex *ix, const float *Q, int nq, int ldq, const float *K, int nk,
                   int ld, int d, const RAParams *p) {
    RAParams P = p ? *p : ra_default_params();
    if (P.max_degree < 1) P.max_degree = 1;
    if (P.q_stride < 0) P.q_stride = 0;
    if (P.ef_conn < 1) P.ef_conn = 1;
    memset(ix, 0, sizeof *ix);
    ix->M = P.max_degree;
    ix->entry = -1;
    ix->ef_conn = P.ef_conn;
    grow_ra_index(ix, P.capacity > nk ? P.capacity : nk > 0 ? nk : 1);
    ix->n = nk;
    for (int i = 0; i < nk; i++) ix->deg[i] = 0;
    if (nk == 0) return 0;
    int Nq = P.nq_knn < nk ? P.nq_knn : nk;
    if (Nq < 1) Nq = 1;
    int n_query = nq > 0 ? ra_query_sample(nq, P.q_stride, NULL) : 0;
    float *Qs = n_query < nq ? xmalloc(((size_t)n_query * d + 1) * sizeof *Qs) : NULL;   /* or Q */
    if (Qs) {
        int32_t *rows = query_sample_rows(nq, P.q_stride, &n_query);   /* (n_query) */
        sample_rows(Q, ldq, 1, d, rows, n_query, Qs);
        free(rows);
    }
    const float *Qu = Qs ? Qs : Q;                                   /* the used queries */
    size_t ldu = Qs ? (size_t)d : (size_t)ldq;
    ix->n_query = n_query;

    /* (a) the exact top-Nq keys of every used query (Fig. 3b), and the used query that scores
     * each key highest, on the GPU as §3.2 says, else by knn_topk's fast twin (model.c) */
    double t0 = now_s();
    int32_t *knn = xmalloc(((size_t)n_query * Nq + 1) * sizeof *knn);    /* (n_query, Nq) */
    int32_t *top_query = xmalloc((size_t)nk * sizeof *top_query);    /* (nk) */
    ix->knn_gpu = P.gpu_knn && !knn_topk_cuda(Qu, n_query, ldu, K, nk, ld, d, Nq, knn, top_query);
    if (P.plain_knn) knn_topk(Qu, n_query, ldu, K, nk, ld, d, Nq, knn, top_query, P.nthreads);
    else if (!ix->knn_gpu)
        ix->knn_amx =
            knn_topk_blocked(Qu, n_query, ldu, K, nk, ld, d, Nq, knn, top_query, P.nthreads);
    double t1 = now_s();
    trace_lists(ix, knn, (size_t)n_query * Nq);
    Rows R = rows_f32(K, (size_t)ld);
    project(ix, R, d, knn, n_query, Nq, P.nthreads);                     /* (b) */
    ix->bt.b_edges = count_edges(ix, &ix->bt.b_linked, &ix->bt.b_deg_max);
    add_reverse_edges(ix, R, d, P.nthreads);                         /* (c) */
    ix->bt.c_added = count_edges(ix, NULL, NULL) - ix->bt.b_edges;
    double t2 = now_s();
    choose_entries(ix, knn, n_query, Nq, nk, P.n_entry);   /* where (d) and the searches start */
    connect_unreachable(ix, R, d, knn, Nq, top_query, &P);           /* (d) */
    ix->bt.d_net = count_edges(ix, NULL, NULL) - ix->bt.b_edges - ix->bt.c_added;
    double t3 = now_s();
    keep_guides(ix, Qu, ldu, n_query, R, d, knn, Nq, P.n_guide);         /* for ra_insert */
    free(Qs), free(knn), free(top_query);
    ix->t_knn = t1 - t0;
    ix->t_proj = t2 - t1;
    ix->t_conn = t3 - t2;
    return 0;
}

/* -- (a) exact KNN -- */

typedef struct {
    const float *Q, *K;         /* (nq, ldq) queries, (nk, ld) keys: d of each row used */
    size_t ldq;
    int nq, nk, ld, d, Nq;
    int32_t *out, *top_query;   /* (nq, Nq), (nk) */
} KnnTask;

static void knn_range(void *arg, int lo, int hi, int tid) {   /* queries [lo, hi) */
    (void)tid;
    const KnnTask *J = arg;
    Hit *h = xmalloc((size_t)J->Nq * sizeof *h);   /* (Nq) the best keys so far */
    for (int i = lo; i < hi; i++) {
        const float *q = J->Q + (size_t)i * J->ldq;
        int n = 0;
        for (int j = 0; j < J->nk; j++) {
            float s = dot8(q, J->K + (size_t)j * J->ld, J->d);
            if (s == s) heap_offer(h, &n, J->Nq, (Hit){s, j});   /* a NaN score ranks nowhere */
        }
        int32_t *o = J->out + (size_t)i * J->Nq;
        for (int j = heap_write(h, n, o); j < J->Nq; j++) o[j] = -1;
    }
    free(h);
}

static void top_query_range(void *arg, int lo, int hi, int tid) {   /* keys [lo, hi) */
    (void)tid;
    const KnnTask *J = arg;
    for (int j = lo; j < hi; j++) {
        float best = -INFINITY;
        J->top_query[j] = -1;
        for (int i = 0; i < J->nq; i++) {
            float s = dot8(J->Q + (size_t)i * J->ldq, J->K + (size_t)j * J->ld, J->d);
            if (s > best) best = s, J->top_query[j] = i;   /* ties: the lower query; NaN: never */
        }
    }
}

/* §3.2 (a): the exact top-Nq keys (rows of K, nk x d) of each query (rows of Q, stride ldq) by
 * q.k, best first; rows of ids_out (nq, Nq) padded with -1 when fewer. Also, for step (d), the
 * query that scores each key highest, top_query (nk; -1: none; NULL: not wanted). Plain loops:
 * the oracle of knn_topk_blocked (model.c) and knn_topk_cuda, which the builds run. */
void knn_topk(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
              int Nq, int32_t *ids_out, int32_t *top_query, int nthreads) {
    KnnTask J = {Q, K, ldq, nq, nk, ld, d, Nq, ids_out, top_query};
    for (int j = 0; top_query && (nq <= 0 || Nq <= 0) && j < nk; j++) top_query[j] = -1;
    if (Nq <= 0 || nq <= 0) return;
    parallel_for(nq, nthreads, knn_range, &J);
    if (top_query) parallel_for(nk, nthreads, top_query_range, &J);
}

/* -- (b) projection -- */

/* the beam's order (ties to the lower id), the one sort_cands keeps (model.c) */
int cand_better(Cand a, Cand b) { return a.s > b.s || (a.s == b.s && a.node < b.node); }

typedef struct {
    RAIndex *ix;
    Rows K;
    int d, nq_knn;
    const int32_t *knn;               /* (nq, Nq) step (a) */
    const int32_t *off, *src;         /* (n+1), (off[n]) CSR per node: its queries (b) or its
                                         reverse sources (c) */
    uint32_t *stamp;                  /* (nthreads, n) per-thread dedup stamps */
    int32_t *n_cand;                  /* (n) (b): each pivot's candidates, for --trace */
} GraphTask;

static void project_range(void *arg, int lo, int hi, int tid);
static void group_by(const int32_t *owner, int m, int n, int32_t *off, int32_t *src);

/* (b) Each query gets a pivot: the first key of its list that is no pivot yet (else its top-1).
 * The pivot is linked to the other keys of its queries' lists (project_range). Departure: the
 * pivot (RoarGraph: the top-1 key, shared by many queries, each with only M slots). */
static void project(RAIndex *ix, Rows K, int d, const int32_t *knn, int n_query, int Nq,
                    int nthreads) {
    int nk = ix->n;
    int32_t *off = xmalloc((size_t)(nk + 1) * sizeof *off);                 /* (nk+1) */
    int32_t *pivot = xmalloc((size_t)(n_query > 0 ? n_query : 1) * sizeof *pivot);   /* (n_query) */
    int32_t *src = xmalloc((size_t)(n_query > 0 ? n_query : 1) * sizeof *src);       /* (n_query) */
    uint8_t *taken = xcalloc((size_t)nk, 1);                                /* (nk) a pivot? */
    for (int i = 0; i < n_query; i++) {
        const int32_t *list = knn + (size_t)i * Nq;
        pivot[i] = list[0];   /* -1 when the query has no candidate (a NaN query): no pivot */
        for (int j = 0; j < Nq; j++)
            if (list[j] >= 0 && !taken[list[j]]) { pivot[i] = list[j]; break; }
        if (pivot[i] >= 0) taken[pivot[i]] = 1;
    }
    group_by(pivot, n_query, nk, off, src);
    int nth = nthreads < 1 ? 1 : nthreads > MAX_THREADS ? MAX_THREADS : nthreads;
    uint32_t *stamp = xcalloc((size_t)nth * nk, sizeof *stamp);             /* (nth, nk) */
    int32_t *n_cand = xcalloc((size_t)nk, sizeof *n_cand);                  /* (nk) */
    GraphTask J = {ix, K, d, Nq, knn, off, src, stamp, n_cand};
    parallel_for(nk, nthreads, project_range, &J);
    for (int p = 0; p < nk; p++) ix->bt.b_cand += n_cand[p];
    free(stamp); free(pivot); free(src); free(taken); free(off); free(n_cand);
}

static int prune(Rows K, int d, int o, const int32_t *cand, int nc, int M,
                 int by_owner, int fill, int32_t *out);

/* (b) pivot p walks its queries' lists rank by rank, in the queries' own order, and links the
 * keys the occlusion rule keeps, topped up to M. Departure: the walk order (RoarGraph: by
 * closeness to the pivot). */
static void project_range(void *arg, int lo, int hi, int tid) {
    GraphTask *J = arg;
    RAIndex *ix = J->ix;
    int Nq = J->nq_knn;
    uint32_t *stamp = J->stamp + (size_t)tid * ix->n;
    for (int p = lo; p < hi; p++) {
        int nqp = J->off[p + 1] - J->off[p], nc = 0;
        if (nqp == 0) continue;
        int32_t *cand = xmalloc((size_t)nqp * Nq * sizeof *cand);   /* (nqp * Nq) */
        for (int j = 0; j < Nq; j++)
            for (int t = J->off[p]; t < J->off[p + 1]; t++) {
                int c = J->knn[(size_t)J->src[t] * Nq + j];
                if (c >= 0 && stamp[c] != (uint32_t)p + 1) {
                    stamp[c] = (uint32_t)p + 1;
                    cand[nc++] = c;
                }
            }
        ix->deg[p] =
            prune(J->K, J->d, p, cand, nc, ix->M, 0, 1, ix->adj + (size_t)p * ix->M);
        J->n_cand[p] = nc;
        free(cand);
    }
}

/* The occlusion rule (RoarGraph's, HNSW's in inner-product form): owner o keeps candidate c
 * unless a neighbour s it kept has s.c > o.c, so its M edges spread over directions. Walks cand
 * by o.c if by_owner, else as given; `fill` tops up to M. Writes at most M to out; the count. */
static int prune(Rows K, int d, int o, const int32_t *cand, int nc, int M,
                 int by_owner, int fill, int32_t *out) {
    int nn = nc > 0 ? nc : 1;
    /* (nc) walk order, (nc) sort scratch, (nc) o.c, (nc) ranks */
    Cand *c = xmalloc((size_t)nn * (2 * sizeof *c + sizeof(float) + sizeof(int32_t)));
    float *oc = (float *)(c + 2 * nn);
    int32_t *rank = (int32_t *)(oc + nn);
    float ko[HEAD_DIM_MAX], kb[HEAD_DIM_MAX];   /* rows of halves, as floats */
    int n = 0, m = 0;
    dot_rows(row_f32(K, o, d, ko), K, cand, nc, d, oc);
    for (int i = 0; i < nc; i++)
        if (cand[i] != o) c[n++] = (Cand){oc[i], cand[i], 0};
    if (by_owner) sort_cands(c, n, c + nn, oc, rank);
    for (int i = 0; i < n; i++)   /* a repeat sorts next to its twin: skip it */
        if (by_owner && i > 0 && c[i].node == c[i - 1].node) c[i].done = 1;
    for (int i = 0; i < n && m < M; i++) {
        if (c[i].done) continue;
        const float *kc = row_f32(K, c[i].node, d, kb);
        int occluded = 0;
        for (int t = 0; t < m && !occluded; t++) occluded = dot_row(kc, K, out[t], d) > c[i].s;
        if (!occluded) {
            out[m++] = c[i].node;
            c[i].done = 1;
        }
    }
    for (int i = 0; fill && i < n && m < M; i++)   /* top up */
        if (!c[i].done) out[m++] = c[i].node;
    free(c);
    return m;
}

/* -- (c) reverse edges -- */

static void reverse_range(void *arg, int lo, int hi, int tid);

/* (c) c->p for every edge p->c. Departure: all are collected first, then each node merges its
 * own sources in id order (RoarGraph adds them under locks: the graph depends on timing). */
static void add_reverse_edges(RAIndex *ix, Rows K, int d, int nthreads) {
    int nk = ix->n;
    size_t ne = 0;
    for (int v = 0; v < nk; v++) ne += (size_t)ix->deg[v];
    int32_t *off = xmalloc((size_t)(nk + 1) * sizeof *off);   /* (nk+1) */
    int32_t *etgt = xmalloc((ne + 1) * sizeof *etgt);         /* (ne) target of edge e */
    int32_t *esrc = xmalloc((ne + 1) * sizeof *esrc);         /* (ne) source of edge e */
    int32_t *rsrc = xmalloc((ne + 1) * sizeof *rsrc);         /* (ne) sources by target */
    for (int v = 0, e = 0; v < nk; v++)
        for (int j = 0; j < ix->deg[v]; j++, e++)
            etgt[e] = ix->adj[(size_t)v * ix->M + j], esrc[e] = v;
    group_by(etgt, (int)ne, nk, off, rsrc);
    for (size_t e = 0; e < ne; e++) rsrc[e] = esrc[rsrc[e]];
    GraphTask J = {ix, K, d, 0, NULL, off, rsrc, NULL, NULL};
    parallel_for(nk, nthreads, reverse_range, &J);
    free(etgt); free(esrc); free(rsrc); free(off);
}

/* (c) node c merges its list with its reverse sources; past M the union is pruned from c,
 * walked by c.x and topped up to M, as RoarGraph's reverse pruning */
static void reverse_range(void *arg, int lo, int hi, int tid) {
    (void)tid;
    GraphTask *J = arg;
    RAIndex *ix = J->ix;
    int M = ix->M;
    for (int c = lo; c < hi; c++) {
        int nr = J->off[c + 1] - J->off[c], n = ix->deg[c];
        if (nr == 0) continue;
        int32_t *row = ix->adj + (size_t)c * M;
        int32_t *cand = xmalloc((size_t)(n + nr) * sizeof *cand);   /* (deg + nr) */
        memcpy(cand, row, (size_t)n * sizeof *cand);
        for (int t = J->off[c]; t < J->off[c + 1]; t++) {
            int dup = 0;
            for (int j = 0; j < ix->deg[c] && !dup; j++) dup = row[j] == J->src[t];
            if (!dup) cand[n++] = J->src[t];
        }
        if (n <= M) {
            memcpy(row, cand, (size_t)n * sizeof *cand);
            ix->deg[c] = n;
        } else {
            ix->deg[c] = prune(J->K, J->d, c, cand, n, M, 1, 1, row);
        }
        free(cand);
    }
}

/* the pairs (owner[i], i) grouped by owner: off (n+1), src (m) the i of each owner, ascending;
 * an owner of -1 leaves its i out */
static void group_by(const int32_t *owner, int m, int n, int32_t *off, int32_t *src) {
    memset(off, 0, (size_t)(n + 1) * sizeof *off);
    for (int i = 0; i < m; i++)
        if (owner[i] >= 0) off[owner[i] + 1]++;
    for (int v = 0; v < n; v++) off[v + 1] += off[v];
    int32_t *fill = xmalloc((size_t)(n + 1) * sizeof *fill);   /* (n) next free slot per owner */
    memcpy(fill, off, (size_t)(n + 1) * sizeof *fill);
    for (int i = 0; i < m; i++)
        if (owner[i] >= 0) src[fill[owner[i]]++] = i;
    free(fill);
}

/* -- (d) connectivity -- */

/* step (d)'s beam: a sparser query sample leaves more keys for it, linked better by a wider one */
int ra_default_ef_conn(int q_stride) { return q_stride > 1 ? 48 : 32; }

static int beam_search(BeamWalk *walk, const RAIndex *ix, const float *q, Rows K, int d,
                       int ef, int all, const int32_t *seeds, int n_seeds, int *n_scored,
                       SearchScratch *s);
static void mark_reachable(const RAIndex *ix, int from, uint8_t *seen, int32_t *queue);
static int conn_seeds(const uint8_t *seen, int nk, int u, int32_t *seeds);
static void link_node(RAIndex *ix, Rows K, int d, int u, const int32_t *cand,
                      int nc, int max_in);

/* (d) A BFS from the entry; each key u it misses, in id order, is linked (link_node) to the
 * reachable keys of its top query's list and its reachable neighbours in position; with none (or
 * p->conn_search), to what a search with u finds. Departure: RoarGraph searches from every key,
 * past the bound M. */
static void connect_unreachable(RAIndex *ix, Rows K, int d, const int32_t *knn, int Nq,
                                const int32_t *top_query, const RAParams *p) {
    int nk = ix->n, ef_conn = p->ef_conn;
    memset(ix->indeg, 0, (size_t)nk * sizeof *ix->indeg);
    for (int v = 0; v < nk; v++)
        for (int j = 0; j < ix->deg[v]; j++) ix->indeg[ix->adj[(size_t)v * ix->M + j]]++;
    uint8_t *seen = xcalloc((size_t)nk, 1);                 /* (nk) reachable yet? */
    int32_t *queue = xmalloc((size_t)nk * sizeof *queue);   /* (nk) BFS queue */
    if (p->trace_keys) ix->bt.d_keys = xmalloc((size_t)nk * sizeof *ix->bt.d_keys);
    int nres = (ef_conn > Nq ? ef_conn : Nq) + 2;
    int32_t *res = xmalloc((size_t)nres * sizeof *res);     /* (max(ef_conn, Nq) + 2) the links */
    float ku[HEAD_DIM_MAX];                                 /* key u's halves as floats */
    SearchScratch s;
    build_search_scratch(&s);
    mark_reachable(ix, ix->entry, seen, queue);
    for (int u = 0; u < nk; u++) {
        if (seen[u]) continue;
        int np = 0, ns = 0, searched = 0;
        const int32_t *list =
            top_query[u] >= 0 && !p->conn_search ? knn + (size_t)top_query[u] * Nq : NULL;
        for (int j = 0; list && j < Nq; j++)
            if (list[j] >= 0 && seen[list[j]]) res[np++] = list[j];
        if (np > 0) {   /* and u's reachable neighbours in position; the closest to u first */
            int32_t nb[2];
            for (int i = 0, n_nb = conn_seeds(seen, nk, u, nb); i < n_nb; i++) {
                int dup = 0;
                for (int j = 0; j < np && !dup; j++) dup = res[j] == nb[i];
                if (!dup) res[np++] = nb[i];
            }
            /* as many as a search's beam, in place (flat_topk reads res before it writes);
             * by its fast twin for a few keys (model.c) */
            np = flat_topk_few(row_f32(K, u, d, ku), K, res, np, d, ef_conn, res, NULL);
        } else {   /* none: a search */
            int32_t seeds[2];
            int n_seeds = p->conn_seed ? conn_seeds(seen, nk, u, seeds) : 0;
            np = beam_search(beam_walk_fast, ix, row_f32(K, u, d, ku), K, d, ef_conn, 0, seeds,
                             n_seeds, &ns, &s);
            for (int i = 0; i < np; i++) res[i] = s.pool[i].node;
            ix->n_searched++, searched = 1;
        }
        if (ix->bt.d_keys) ix->bt.d_keys[ix->n_repaired] = searched ? -1 - u : u;   /* --trace */
        link_node(ix, K, d, u, res, np, 1);
        mark_reachable(ix, u, seen, queue);   /* u has an in-link from a reachable node now */
        ix->n_repaired++;
        ix->conn_scored += ns;
    }
    free_search_scratch(&s);
    free(seen); free(queue); free(res);
}

/* marks in seen (n) every node reachable from `from` not marked yet; queue (n) */
static void mark_reachable(const RAIndex *ix, int from, uint8_t *seen, int32_t *queue) {
    int head = 0, tail = 0;
    if (seen[from]) return;
    seen[from] = 1;
    queue[tail++] = from;
    while (head < tail) {
        int v = queue[head++];
        for (int j = 0; j < ix->deg[v]; j++) {
            int w = ix->adj[(size_t)v * ix->M + j];
            if (!seen[w]) { seen[w] = 1; queue[tail++] = w; }
        }
    }
}

/* Step (d)'s seeds for key u: its reachable neighbours in position, u - 1 and u + 1, whose keys
 * are alike (a shared context), so the search starts near u. Departure: RoarGraph's searches
 * start at the entry alone. Writes at most 2; returns the count. */
static int conn_seeds(const uint8_t *seen, int nk, int u, int32_t *seeds) {
    int n = 0;
    if (u > 0 && seen[u - 1]) seeds[n++] = u - 1;
    if (u + 1 < nk && seen[u + 1]) seeds[n++] = u + 1;
    return n;
}

static int has_edge(const RAIndex *ix, int a, int b) {
    const int32_t *r = ix->adj + (size_t)a * ix->M;
    for (int j = 0; j < ix->deg[a]; j++)
        if (r[j] == b) return 1;
    return 0;
}

static void add_edge(RAIndex *ix, int a, int b) {
    ix->adj[(size_t)a * ix->M + ix->deg[a]++] = b;
    ix->indeg[b]++;
}

static void replace_edge(RAIndex *ix, int a, int old, int nu) {
    int32_t *r = ix->adj + (size_t)a * ix->M;
    for (int j = 0; j < ix->deg[a]; j++)
        if (r[j] == old) { r[j] = nu; ix->indeg[old]--; ix->indeg[nu]++; return; }
}

/* the neighbour of a with the most in-links (ties: the lower id): the edge a can give up at the
 * least cost, its target being reached from elsewhere too */
static int most_linked_edge(const RAIndex *ix, int a) {
    int w = -1;
    for (int j = 0; j < ix->deg[a]; j++) {
        int y = ix->adj[(size_t)a * ix->M + j];
        if (w < 0 || ix->indeg[y] > ix->indeg[w] || (ix->indeg[y] == ix->indeg[w] && y < w)) w = y;
    }
    return w;
}

/* Links unreachable node u to cand (nc reachable nodes, best first). (1) Out-edges: u's list and
 * cand, pruned from u. (2) Up to max_in in-edges c->u: a full c hands its most linked edge c->x
 * to u (u->x), so every path survives. Departure: the hand-off keeps every degree within M. */
static void link_node(RAIndex *ix, Rows K, int d, int u, const int32_t *cand,
                      int nc, int max_in) {
    int M = ix->M, n_in = 0;
    int32_t *au = ix->adj + (size_t)u * M;                     /* (M) u's out-list */
    prefetch_lists(ix, cand, nc < max_in ? nc : max_in);       /* (2)'s lists, while (1) runs */
    int32_t *all = xmalloc((size_t)(nc + M) * sizeof *all);   /* (deg + nc) */
    memcpy(all, au, (size_t)ix->deg[u] * sizeof *all);
    memcpy(all + ix->deg[u], cand, (size_t)nc * sizeof *all);
    for (int j = 0; j < ix->deg[u]; j++) ix->indeg[au[j]]--;
    ix->deg[u] = prune(K, d, u, all, ix->deg[u] + nc, M, 1, 0, au);   /* (1), no top-up */
    for (int j = 0; j < ix->deg[u]; j++) ix->indeg[au[j]]++;
    free(all);
    prefetch_indeg(ix, cand, nc < max_in ? nc : max_in);   /* most_linked_edge's reads */
    for (int t = 0; t < nc && n_in < max_in; t++) {   /* (2) */
        int c = cand[t];
        if (has_edge(ix, c, u)) { n_in++; continue; }
        if (ix->deg[c] < M) { add_edge(ix, c, u); n_in++; continue; }
        int x = most_linked_edge(ix, c);
        if (!has_edge(ix, u, x)) {
            if (ix->deg[u] == M && n_in > 0) break;   /* no room for a detour */
            if (ix->deg[u] == M) replace_edge(ix, u, most_linked_edge(ix, u), x);   /* nothing
                                                         reachable depends on u yet */
            else add_edge(ix, u, x);
        }
        replace_edge(ix, c, x, u);
        n_in++;
    }
}

/* -- where searches start, and the guides of the insertions -- */

static void other_entries(RAIndex *ix, const int32_t *count, int nk, int n);

/* The entry: the key in the most KNN lists, i.e. the most in-links of the bipartite graph (ties:
 * the lower id), near many queries' answers. Departure: RoarGraph starts at a medoid. Then the
 * other entry points, from the same counts (other_entries). */
static void choose_entries(RAIndex *ix, const int32_t *knn, int n_query, int Nq, int nk,
                           int n_entry) {
    int32_t *count = xcalloc((size_t)nk, sizeof *count);   /* (nk) lists holding each key */
    for (size_t e = 0; e < (size_t)n_query * Nq; e++)
        if (knn[e] >= 0) count[knn[e]]++;
    ix->entry = 0;
    for (int c = 1; c < nk; c++)
        if (count[c] > count[ix->entry]) ix->entry = c;
    other_entries(ix, count, nk, n_entry);
    free(count);
}

/* The keys cut into n equal runs of positions; each run gives its most-listed key, which a
 * search offers its beam once the walk from the entry is done (beam_search). Departure: decoding
 * queries can want keys far from the entry's neighbourhood (§2.4). entries[0] is the entry. */
static void other_entries(RAIndex *ix, const int32_t *count, int nk, int n) {
    if (n < 1) n = 1;
    if (n > nk) n = nk;
    ix->entries = xmalloc((size_t)n * sizeof *ix->entries);
    ix->entries[0] = ix->entry;
    ix->n_entry = 1;
    for (int r = 0; r < n; r++) {
        int lo = (int)((int64_t)r * nk / n), hi = (int)((int64_t)(r + 1) * nk / n), b = lo;
        for (int c = lo + 1; c < hi; c++)
            if (count[c] > count[b]) b = c;
        if (b != ix->entry && ix->n_entry < n) ix->entries[ix->n_entry++] = b;
    }
}

/* The guide queries of ra_insert: n_guide of the n_query used queries (row i at Q + i*ldqs), evenly
 * spaced, each with the score of its Nq-th key (what a new key must beat to enter its list) and
 * its first GUIDE_TOP keys. */
static void keep_guides(RAIndex *ix, const float *Q, size_t ldqs, int n_query, Rows K, int d,
                        const int32_t *knn, int Nq, int n_guide) {
    ix->n_guide = n_guide < n_query ? (n_guide > 0 ? n_guide : 0) : n_query;
    ix->guide = xmalloc(((size_t)ix->n_guide * d + 1) * sizeof *ix->guide);
    ix->guide_thr = xmalloc(((size_t)ix->n_guide + 1) * sizeof *ix->guide_thr);
    ix->guide_top = xmalloc(((size_t)ix->n_guide * GUIDE_TOP + 1) * sizeof *ix->guide_top);
    for (int g = 0; g < ix->n_guide; g++) {
        int i = (int)((int64_t)g * n_query / ix->n_guide);
        const int32_t *list = knn + (size_t)i * Nq;
        const float *q = Q + (size_t)i * ldqs;
        memcpy(ix->guide + (size_t)g * d, q, (size_t)d * sizeof(float));
        ix->guide_thr[g] =
            list[Nq - 1] >= 0 ? dot_row(q, K, (size_t)list[Nq - 1], d) : -INFINITY;
        for (int j = 0; j < GUIDE_TOP; j++)
            ix->guide_top[(size_t)g * GUIDE_TOP + j] = j < Nq ? list[j] : -1;
    }
}

/* -- the queries a build uses (a departure: a sample) -- */

enum { RA_RECENT = 8192 };              /* ra_query_sample: the last queries all used */

/* The prefill queries a build uses, ascending, into rows (NULL: count only); returns the count.
 * q_stride >= 1: rows 0, S, 2S, ... Else (the default) all of the last RA_RECENT, then every 2nd
 * before them. Departure: the paper uses all; half the older queries keep every key reached. */
int ra_query_sample(int nq, int q_stride, int32_t *rows) {
    int n = 0;
    for (int i = 0; i < nq; i++) {
        int back = nq - 1 - i, step = back < RA_RECENT ? 1 : 2;   /* back: from the last query */
        if (q_stride >= 1) step = q_stride, back = i;
        if (back % step == 0) {
            if (rows) rows[n] = i;
            n++;
        }
    }
    return n;
}

/* ra_query_sample's rows in a new array (m, the caller frees it); their count in *m */
static int32_t *query_sample_rows(int nq, int q_stride, int *m) {
    *m = ra_query_sample(nq, q_stride, NULL);
    int32_t *rows = xmalloc(((size_t)*m + 1) * sizeof *rows);
    ra_query_sample(nq, q_stride, rows);
    return rows;
}

/* slot[i]: query i's row among those ra_query_sample picks, or -1 (State.q_keep_row) */
int ra_query_slots(int nq, int q_stride, int32_t *slot) {
    int m;
    int32_t *rows = query_sample_rows(nq, q_stride, &m);   /* (m) */
    for (int i = 0; i < nq; i++) slot[i] = -1;
    for (int j = 0; j < m; j++) slot[rows[j]] = j;
    free(rows);
    return m;
}

/* Rows rows[0..m) of Q (stride ldq), each cut into nh parts of d floats (query heads): part h
 * of the i-th row goes to out + (h m + i) d, out (nh, m, d) */
static void sample_rows(const float *Q, size_t ldq, int nh, int d, const int32_t *rows, int m,
                        float *out) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < m; i++)
            memcpy(out + ((size_t)h * m + i) * d, Q + (size_t)rows[i] * ldq + (size_t)h * d,
                   (size_t)d * sizeof *out);
}

/* room for cap nodes (the graph's arrays grow; nothing else moves) */
static void grow_ra_index(RAIndex *ix, int cap) {
    if (cap <= ix->cap) return;
    ix->adj = xrealloc(ix->adj, (size_t)cap * ix->M * sizeof *ix->adj);
    ix->deg = xrealloc(ix->deg, (size_t)cap * sizeof *ix->deg);
    ix->indeg = xrealloc(ix->indeg, (size_t)cap * sizeof *ix->indeg);
    ix->cap = cap;
}

/* --trace's counts of step (a): the n entries of the KNN lists, the keys in some list */
static void trace_lists(RAIndex *ix, const int32_t *knn, size_t n) {
    uint8_t *in = xcalloc((size_t)ix->n + 1, 1);   /* (nk) in some list? */
    for (size_t e = 0; e < n; e++)
        if (knn[e] >= 0) ix->bt.a_links++, ix->bt.a_keys += !in[knn[e]], in[knn[e]] = 1;
    free(in);
}

/* the graph's edges; the nodes with out-links, the largest out-degree (NULL: not wanted) */
static long count_edges(const RAIndex *ix, int *linked, int *deg_max) {
    long e = 0;
    int nl = 0, mx = 0;
    for (int v = 0; v < ix->n; v++) {
        e += ix->deg[v], nl += ix->deg[v] > 0;
        mx = ix->deg[v] > mx ? ix->deg[v] : mx;
    }
    if (linked) *linked = nl;
    if (deg_max) *deg_max = mx;
    return e;
}

void free_ra_index(RAIndex *ix) {
    free(ix->adj); free(ix->deg); free(ix->indeg);
    free(ix->guide); free(ix->guide_thr); free(ix->guide_top);
    free(ix->ahead); free(ix->ahead_nc); free(ix->entries); free(ix->bt.d_keys);
    memset(ix, 0, sizeof *ix);
    ix->entry = -1;
}

/* ---- 3. Search: Alg. 1 line 7, Omega <- VectorSearch(q_t) ------------------------------------ */

/* Alg. 1 line 7: the top-`topk` keys of q (ids_out, best first) by a beam of width ef (at least
 * topk), started at the entry and the seeds (NULL, 0: none), then at the other entry points that
 * beat what it found. *n_scored counts every key scored. Threads may search at once, each with
 * its own scratch, while nothing inserts. */
int ra_search(const RAIndex *ix, const float *q, Rows K, int d, int ef,
              const int32_t *seeds, int n_seeds, int topk, int32_t *ids_out, int *n_scored,
              SearchScratch *s) {
    return ra_search_by(beam_walk, ix, q, K, d, ef, seeds, n_seeds, topk, ids_out, n_scored, s);
}

/* ra_search with the walk given: beam_walk, or its fast twin beam_walk_fast (model.c) */
int ra_search_by(BeamWalk *walk, const RAIndex *ix, const float *q, Rows K, int d, int ef,
                 const int32_t *seeds, int n_seeds, int topk, int32_t *ids_out, int *n_scored,
                 SearchScratch *s) {
    if (topk < 0) topk = 0;
    int ns, np = beam_search(walk, ix, q, K, d, ef > topk ? ef : topk, 1, seeds, n_seeds, &ns, s);
    int r = np < topk ? np : topk;
    for (int i = 0; i < r; i++) ids_out[i] = s->pool[i].node;
    if (n_scored) *n_scored = ns;
    return r;
}

/* The beam when --ef is not given, for n keys indexed and out-degree M: topk x RA_EF_KEYS / n,
 * at most 3 topk, then past RA_EF_KEYS keys topk widened by 1/16 per doubling; times
 * RA_EF_DEGREE / M, at least topk. Departure: a small index's top-k, a large graph and a low
 * degree each take a wider beam. */
enum { RA_EF_KEYS = 32768,   /* at this many keys, the narrowest beam ... */
       RA_EF_DEGREE = 35 };  /* ... which is topk at this out-degree */
int ra_auto_ef(int topk, int n, int M) {
    double f = n > 0 ? (double)RA_EF_KEYS / n : 3;
    if (f > 3) f = 3;
    if (f < 1) f = 1 + log2(1 / f) / 16;   /* past RA_EF_KEYS keys: 1/16 wider per doubling */
    int ef = (int)(topk * f * RA_EF_DEGREE / (M > 0 ? M : 1) + 0.5);
    return ef > topk ? ef : topk;
}

static void scratch_fit(SearchScratch *s, int n, int ef, int m);

/* Best-first beam search keeping the ef best keys seen: a walk from the entry and the seeds
 * (ids outside the index and repeats skipped); if `all`, the other entry points are then offered
 * to the finished beam and the walk goes on from those that got in. Leaves the beam, best
 * first, in s->pool; returns its size. Departure: the entry points, and the seeds. */
static int beam_search(BeamWalk *walk, const RAIndex *ix, const float *q, Rows K, int d,
                       int ef, int all, const int32_t *seeds, int n_seeds, int *n_scored,
                       SearchScratch *s) {
    *n_scored = s->hops = 0;
    if (ix->n == 0 || ix->entry < 0) return 0;
    if (ef < 1) ef = 1;
    scratch_fit(s, ix->n, ef, ix->M);
    int np = 0;
    beam_offer(ix, q, K, d, ef, &ix->entry, 1, &np, n_scored, s);
    beam_offer(ix, q, K, d, ef, seeds, n_seeds, &np, n_scored, s);
    walk(ix, q, K, d, ef, &np, n_scored, s);
    if (all && ix->n_entry > 1) {
        beam_offer(ix, q, K, d, ef, ix->entries + 1, ix->n_entry - 1, &np, n_scored, s);
        walk(ix, q, K, d, ef, &np, n_scored, s);
    }
    return np;
}

/* The walk: expand the best key of the beam not yet expanded (offer it its out-list), until
 * all np <= ef are expanded. */
void beam_walk(const RAIndex *ix, const float *q, Rows K, int d, int ef, int *np, int *n_scored,
               SearchScratch *s) {
    for (;;) {
        int cur = 0;
        while (cur < *np && s->pool[cur].done) cur++;
        if (cur == *np) return;
        int v = s->pool[cur].node;
        s->pool[cur].done = 1, s->hops++;
        beam_offer(ix, q, K, d, ef, ix->adj + (size_t)v * ix->M, ix->deg[v], np, n_scored, s);
    }
}

/* keys v[0..n) into the beam, in order, but those this search has seen (or outside the index):
 * scored a scratch's worth at a time (dot_rows) */
void beam_offer(const RAIndex *ix, const float *q, Rows K, int d, int ef, const int32_t *v, int n,
                int *np, int *n_scored, SearchScratch *s) {
    for (int i = 0; i < n;) {
        int nb = 0;
        for (; i < n && nb < s->m; i++)
            if (v[i] >= 0 && v[i] < ix->n && s->mark[v[i]] != s->epoch) {
                s->mark[v[i]] = s->epoch;
                s->nb[nb++] = v[i];
            }
        dot_rows(q, K, s->nb, nb, d, s->nbs);
        *n_scored += nb;
        for (int j = 0; j < nb; j++) pool_insert(s->pool, np, ef, (Cand){s->nbs[j], s->nb[j], 0});
    }
}

/* inserts x into the sorted beam (n entries, at most ef) from its end, where a key that gets in
 * mostly lands; returns its slot, or -1 */
int pool_insert(Cand *pool, int *n, int ef, Cand x) {
    if (*n == ef && !cand_better(x, pool[ef - 1])) return -1;
    int i = *n < ef ? (*n)++ : ef - 1;   /* the slot at the end, freed */
    for (; i > 0 && cand_better(x, pool[i - 1]); i--) pool[i] = pool[i - 1];
    pool[i] = x;
    return i;
}

void build_search_scratch(SearchScratch *s) { memset(s, 0, sizeof *s); }

void free_search_scratch(SearchScratch *s) {
    free(s->mark); free(s->pool); free(s->nb); free(s->nbs);
    memset(s, 0, sizeof *s);
}

/* room for a search of an index of n nodes, beam ef, degree m; a new epoch clears the marks */
static void scratch_fit(SearchScratch *s, int n, int ef, int m) {
    if (n > s->cap) {   /* indexes grow by a key a step: grow by half at least, not by one */
        int cap = n > s->cap + s->cap / 2 ? n : s->cap + s->cap / 2;
        s->mark = xrealloc(s->mark, (size_t)cap * sizeof *s->mark);
        memset(s->mark + s->cap, 0, (size_t)(cap - s->cap) * sizeof *s->mark);
        s->cap = cap;
    }
    if (ef > s->ef) { s->pool = xrealloc(s->pool, (size_t)ef * sizeof *s->pool); s->ef = ef; }
    if (m > s->m) {
        s->nb = xrealloc(s->nb, (size_t)m * sizeof *s->nb);
        s->nbs = xrealloc(s->nbs, (size_t)m * sizeof *s->nbs);
        s->m = m;
    }
    if (++s->epoch == 0) {   /* wrapped: forget all marks */
        memset(s->mark, 0, (size_t)s->cap * sizeof *s->mark);
        s->epoch = 1;
    }
}

/* ---- 4. Insertion: Alg. 1 lines 4-5, H.insert ------------------------------------------------ */

static int guide_candidates(const RAIndex *ix, Rows K, int d, int u, int32_t *cand);

/* Alg. 1 line 5: key n (row ix->n of K) leaves the window W and enters the index; link_node
 * keeps the invariants. Its candidates: the top keys of the guides whose lists it comes closest
 * to (guide_candidates), else a search with the key. Departure: guided, not a search with the
 * key, which keys' distribution misleads (§2.4). Not safe beside searches. Returns the node. */
int ra_insert(RAIndex *ix, Rows K, int d, SearchScratch *s) {
    int32_t cand[GUIDE_USE * GUIDE_TOP];
    int nc = guide_candidates(ix, K, d, ix->n, cand);
    return ra_insert_linked(ix, K, d, cand, nc, s);
}

/* Key ix->n enters, linked to cand[0..nc) (best first), or with none to what a search with the
 * key finds: ra_insert's second half, and its fast twin's (ra_insert_ahead, model.c) */
int ra_insert_linked(RAIndex *ix, Rows K, int d, const int32_t *cand, int nc, SearchScratch *s) {
    if (ix->n == ix->cap) grow_ra_index(ix, ix->cap > 0 ? 2 * ix->cap : 64);
    int u = ix->n;
    float kb[HEAD_DIM_MAX];   /* key u's halves as floats */
    int32_t *found = NULL;    /* (ef_conn) a search's keys */
    ix->deg[u] = ix->indeg[u] = 0;
    if (nc == 0 && ix->n > 0) {   /* no guides, or none listed a key: search with the key */
        int ns, np = beam_search(beam_walk, ix, row_f32(K, u, d, kb), K, d, ix->ef_conn, 0, NULL,
                                 0, &ns, s);
        found = xmalloc((size_t)(np + 1) * sizeof *found);
        for (int i = 0; i < np; i++) found[i] = s->pool[i].node;
        cand = found, nc = np;
    }
    ix->n++;
    if (ix->entry < 0) ix->entry = u;
    else link_node(ix, K, d, u, cand, nc, ix->M / 2 > 1 ? ix->M / 2 : 1);   /* M 1: 1 in-link */
    free(found);
    return u;
}

/* Key u's candidates (GUIDE_USE * GUIDE_TOP at most): the GUIDE_USE guides with the highest q.k
 * less the guide's Nq-th score (what the key must beat to enter its list), then guide_keys */
static int guide_candidates(const RAIndex *ix, Rows K, int d, int u, int32_t *cand) {
    Hit best[GUIDE_USE];   /* a heap of the best guides */
    int nb = 0;
    float kb[HEAD_DIM_MAX];
    const float *k = row_f32(K, u, d, kb);
    for (int g = 0; g < ix->n_guide; g++)
        heap_offer(best, &nb, GUIDE_USE,
                   (Hit){dot8(ix->guide + (size_t)g * d, k, d) - ix->guide_thr[g], g});
    return guide_keys(ix, best, nb, cand);
}

/* the top keys of the guides in the heap best (nb), rank by rank, no repeats, into c; the count */
int guide_keys(const RAIndex *ix, Hit *best, int nb, int32_t *c) {
    int32_t guides[GUIDE_USE];
    int n = 0, ng = heap_write(best, nb, guides);   /* best first */
    for (int r = 0; r < GUIDE_TOP; r++)
        for (int i = 0; i < ng; i++) {
            int v = ix->guide_top[(size_t)guides[i] * GUIDE_TOP + r], dup = v < 0;
            for (int j = 0; j < n && !dup; j++) dup = c[j] == v;
            if (!dup) c[n++] = v;
        }
    return n;
}

/* ---- 5. The decoding step: Algorithm 1 ------------------------------------------------------- */

/* W (§3.3) is [0, sink) and the window [idx_end, pos], attended exactly; H = [sink, idx_end) is
 * in the indexes, one per (layer, query head) (App. C), key id i at position sink + i. Before a
 * step attends, the keys that left the window are inserted, so none is ever dropped. A query
 * head whose index is still being built (section 8) scans H exactly instead: Flat's top-k. */

static int warm_seeds(const int32_t *prev, int n_prev, int32_t *seeds);
static int search_ef(const AttnParams *ap, int n_indexed);
static void trace_step(StepTrace *tr, const RAIndex *ix, const AttnParams *ap, int hops,
                       float z_omega, float s_omega);

/* Alg. 1 for one query head at the step of the token at pos, the lines in the paper's order, by
 * the plain method functions alone: the oracle of ra_decode_layer and its tasks. q, out: (d); K,
 * V: the head's KV head, positions 0..pos; omega (topk): Omega as positions; tr (or NULL): what
 * each line did (trace_step). Returns |Omega|. */
int ra_step_head(const AttnParams *ap, HeadStep *hs, const float *q, Rows K, Rows V, int d,
                 int pos, int32_t *omega, float *out, SearchScratch *s, StepTrace *tr) {
    int sink = ap->sink;
    float scale = 1.0f / sqrtf((float)d);
    float o_sink[HEAD_DIM_MAX], o_w[HEAD_DIM_MAX], o_omega[HEAD_DIM_MAX];   /* (d) each */
    float z_sink, s_sink, z_w, s_w, z_omega, s_omega;   /* each part's z~ and sum (Eq. 4) */
    if (pos + 1 - ap->window > hs->idx_end) hs->idx_end = pos + 1 - ap->window;   /* line 1 */
    int n_h = hs->idx_end - sink;             /* H: id i is position sink + i */
    Rows KH = rows_from(K, (size_t)sink);
    int n_was = hs->ix ? hs->ix->n : 0, n_seeds = 0;
    while (hs->ix && hs->ix->n < n_h) ra_insert(hs->ix, KH, d, s);     /* lines 4-5 */
    attn_partial(q, K, V, NULL, sink, d, scale, o_sink, &z_sink, &s_sink);   /* line 6: o_W */
    attn_partial(q, rows_from(K, (size_t)hs->idx_end), rows_from(V, (size_t)hs->idx_end), NULL,
                 pos + 1 - hs->idx_end, d, scale, o_w, &z_w, &s_w);
    attn_merge(o_sink, z_sink, s_sink, o_w, z_w, s_w, d, o_w, &z_w, &s_w);   /* W = both runs */
    int k = ap->topk < n_h ? ap->topk : n_h, n_omega;                  /* line 7: VectorSearch */
    if (hs->ix) {
        int32_t *seeds = xmalloc((size_t)(2 * hs->n_prev + 1) * sizeof *seeds);
        n_seeds = ap->warm ? warm_seeds(hs->prev, hs->n_prev, seeds) : 0;
        n_omega = ra_search(hs->ix, q, KH, d, search_ef(ap, n_h), seeds, n_seeds, k, omega,
                            &hs->n_scored, s);
        free(seeds);
    } else n_omega = flat_topk(q, KH, NULL, n_h, d, k, omega, &hs->n_scored);   /* not built */
    memcpy(hs->prev, omega, (size_t)n_omega * sizeof *omega), hs->n_prev = n_omega;
    for (int i = 0; i < n_omega; i++) omega[i] += sink;                /* ids to positions */
    attn_partial(q, K, V, omega, n_omega, d, scale, o_omega, &z_omega, &s_omega);   /* line 8 */
    attn_merge(o_w, z_w, s_w, o_omega, z_omega, s_omega, d, out, NULL, NULL);   /* line 9 */
    if (tr) {
        *tr = (StepTrace){pos, hs->idx_end, hs->ix != NULL, n_was, n_h - n_was, 0, 0,
                          sink + pos + 1 - hs->idx_end, z_w, s_w, 0, -1, n_seeds, 0,
                          hs->n_scored, n_h, n_omega, z_omega, s_omega, 0, 0};
        trace_step(tr, hs->ix, ap, s->hops, z_omega, s_omega);
    }
    return n_omega;
}

/* the rest of a step's trace from the index and the search: the last key inserted's links (lines
 * 4-5), the beam, entry and hops (line 7), gamma_1 and gamma_2 (line 9) */
static void trace_step(StepTrace *tr, const RAIndex *ix, const AttnParams *ap, int hops,
                       float z_omega, float s_omega) {
    if (!tr->indexed) tr->n_ins = 0;
    if (tr->n_ins > 0) {
        int u = tr->ins_first + tr->n_ins - 1;
        tr->ins_out = ix->deg[u], tr->ins_in = ix->indeg[u];
    }
    if (tr->indexed) tr->ef = search_ef(ap, tr->n_h), tr->entry = ix->entry, tr->hops = hops;
    attn_gammas(tr->z_w, tr->s_w, z_omega, s_omega, &tr->g1, &tr->g2);
}

/* The warm start: this index's keys of the previous step and the key after each (the next
 * position, what a copying head wants next), as seeds. Departure: RoarGraph's search starts
 * at its entry alone. Writes 2 n_prev seeds; the search skips ids past the index and repeats. */
static int warm_seeds(const int32_t *prev, int n_prev, int32_t *seeds) {
    int n = 0;
    for (int i = 0; i < n_prev; i++) seeds[n++] = prev[i], seeds[n++] = prev[i] + 1;
    return n;
}

/* the beam of a search over n_indexed keys: --ef, else ra_auto_ef */
static int search_ef(const AttnParams *ap, int n_indexed) {
    return ap->ef ? ap->ef : ra_auto_ef(ap->topk, n_indexed, ap->max_degree);
}

/* ---- 6. The baselines (§4.1): Flat, IVF, StreamingLLM --------------------------------------- */

/* Flat: the exact top-k of one query over the keys ids[0..n) (NULL: 0..n-1) by a linear scan,
 * every key scored (*n_scored = n). Returns the number written to ids_out. */
int flat_topk(const float *q, Rows K, const int32_t *ids, int n, int d, int topk,
              int32_t *ids_out, int *n_scored) {
    enum { CHUNK = 256 };
    float s[CHUNK];                                                 /* a chunk's scores */
    Hit *h = xmalloc((size_t)(topk > 0 ? topk : 1) * sizeof *h);   /* (topk) heap */
    int nh = 0;
    if (n_scored) *n_scored = n;
    for (int j0 = 0; j0 < n; j0 += CHUNK) {
        int nb = n - j0 < CHUNK ? n - j0 : CHUNK;
        dot_rows(q, ids ? K : rows_from(K, j0), ids ? ids + j0 : NULL, nb, d, s);
        for (int j = 0; j < nb; j++)
            if (s[j] == s[j])   /* a NaN score ranks nowhere */
                heap_offer(h, &nh, topk, (Hit){s[j], ids ? ids[j0 + j] : j0 + j});
    }
    int r = heap_write(h, nh, ids_out);   /* ids_out may be ids: all were read */
    free(h);
    return r;
}

/* IVF [14]: lists by k-means (Lloyd, L2), probed by inner product. Departure: Faiss's
 * inner-product IVF clusters by inner product (spherical k-means). */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    const float *K, *cent, *half_norm;   /* (keys, ld) keys, (nlist, d) centroids, (nlist) */
    const int32_t *ids;                  /* (n) the keys to assign (NULL: 0..n-1) */
    int ld, d, nlist;
    int32_t *assign;                     /* (n) */
} AssignTask;

/* the nearest centroid in L2 of each key: argmax_l k.c_l - |c_l|^2/2, ties to the lower l */
static void assign_range(void *arg, int lo, int hi, int tid) {
    (void)tid;
    const AssignTask *J = arg;
    float *s = xmalloc((size_t)J->nlist * sizeof *s);   /* (nlist) */
    for (int i = lo; i < hi; i++) {
        dot_rows(J->K + (size_t)(J->ids ? J->ids[i] : i) * J->ld, rows_f32(J->cent, J->d), NULL,
                 J->nlist, J->d, s);
        int best = 0;
        for (int l = 1; l < J->nlist; l++)
            if (s[l] - J->half_norm[l] > s[best] - J->half_norm[best]) best = l;
        J->assign[i] = best;
    }
    free(s);
}

/* the lists of --attn ivf's index over n keys: 4 sqrt(n), at least 1 and at most n */
int ivf_nlist(int n) {
    int nlist = (int)(4 * sqrt((double)(n > 0 ? n : 1)));
    if (nlist > n) nlist = n;
    return nlist > 1 ? nlist : 1;
}

/* nlist lists over the keys ids[0..n) (NULL: 0..n-1): centroids start at nlist distinct keys
 * drawn with `seed`, then `iters` Lloyd steps (an empty list keeps its centroid). The same for a
 * seed whatever nthreads. Returns 0, -1 if nlist is invalid. */
int build_ivf(IVFIndex *ix, const float *K, const int32_t *ids, int n, int ld, int d,
              int nlist, int iters, uint64_t seed, int nthreads) {
    memset(ix, 0, sizeof *ix);
    if (nlist < 1 || nlist > n) return -1;
    ix->nlist = nlist; ix->n = n; ix->d = d;
    ix->cent = xmalloc((size_t)nlist * d * sizeof *ix->cent);
    ix->off = xcalloc((size_t)nlist + 1, sizeof *ix->off);
    ix->ids = xmalloc((size_t)n * sizeof *ix->ids);
    int32_t *perm = xmalloc((size_t)n * sizeof *perm);           /* (n) */
    int32_t *assign = xmalloc((size_t)n * sizeof *assign);       /* (n) list of each key */
    float *half = xmalloc((size_t)nlist * sizeof *half);         /* (nlist) |c|^2 / 2 */
    double *sum = xmalloc((size_t)nlist * d * sizeof *sum);      /* (nlist, d) */
    int32_t *cnt = xmalloc((size_t)nlist * sizeof *cnt);         /* (nlist) */
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int l = 0; l < nlist; l++) {   /* partial Fisher-Yates: nlist distinct keys */
        int j = l + (int)(splitmix64(&seed) % (uint64_t)(n - l));
        int32_t t = perm[l]; perm[l] = perm[j]; perm[j] = t;
        const float *k = K + (size_t)(ids ? ids[perm[l]] : perm[l]) * ld;
        memcpy(ix->cent + (size_t)l * d, k, (size_t)d * sizeof(float));
    }
    AssignTask J = {K, ix->cent, half, ids, ld, d, nlist, assign};
    for (int it = 0; it <= iters; it++) {
        for (int l = 0; l < nlist; l++) {
            const float *c = ix->cent + (size_t)l * d;
            half[l] = 0.5f * dot8(c, c, d);
        }
        parallel_for(n, nthreads, assign_range, &J);
        if (it == iters) break;   /* the last pass only assigns */
        memset(sum, 0, (size_t)nlist * d * sizeof *sum);
        memset(cnt, 0, (size_t)nlist * sizeof *cnt);
        for (int i = 0; i < n; i++) {
            const float *k = K + (size_t)(ids ? ids[i] : i) * ld;
            for (int j = 0; j < d; j++) sum[(size_t)assign[i] * d + j] += k[j];
            cnt[assign[i]]++;
        }
        for (int l = 0; l < nlist; l++)
            for (int j = 0; cnt[l] > 0 && j < d; j++)
                ix->cent[(size_t)l * d + j] = (float)(sum[(size_t)l * d + j] / cnt[l]);
    }
    group_by(assign, n, nlist, ix->off, ix->ids);
    for (int i = 0; i < n; i++) ix->ids[i] = ids ? ids[ix->ids[i]] : ix->ids[i];
    free(perm); free(assign); free(half); free(sum); free(cnt);
    return 0;
}

void free_ivf(IVFIndex *ix) {
    free(ix->cent); free(ix->off); free(ix->ids);
    memset(ix, 0, sizeof *ix);
}

/* the nprobe lists of highest q.centroid, scanned exactly; *n_scored counts the keys scanned
 * (not the centroids). Returns the number of ids. */
int ivf_search(const IVFIndex *ix, const float *q, Rows K, int d, int nprobe,
               int topk, int32_t *ids_out, int *n_scored) {
    if (nprobe > ix->nlist) nprobe = ix->nlist;
    if (nprobe < 1 || topk < 1) {
        if (n_scored) *n_scored = 0;
        return 0;
    }
    float *cs = xmalloc((size_t)ix->nlist * sizeof *cs);   /* (nlist) q.c */
    Hit *lh = xmalloc((size_t)nprobe * sizeof *lh);        /* (nprobe) lists to probe */
    Hit *h = xmalloc((size_t)topk * sizeof *h);            /* (topk) */
    float *s = xmalloc(256 * sizeof *s);                   /* (256) a chunk of scores */
    int nl = 0, nh = 0, scanned = 0;
    dot_rows(q, rows_f32(ix->cent, d), NULL, ix->nlist, d, cs);
    for (int l = 0; l < ix->nlist; l++) heap_offer(lh, &nl, nprobe, (Hit){cs[l], l});
    for (int t = 0; t < nl; t++) {
        int l = lh[t].id;
        for (int j0 = ix->off[l]; j0 < ix->off[l + 1]; j0 += 256) {
            int nb = ix->off[l + 1] - j0 < 256 ? ix->off[l + 1] - j0 : 256;
            dot_rows(q, K, ix->ids + j0, nb, d, s);
            for (int j = 0; j < nb; j++) heap_offer(h, &nh, topk, (Hit){s[j], ix->ids[j0 + j]});
            scanned += nb;
        }
    }
    int r = heap_write(h, nh, ids_out);
    free(cs); free(lh); free(h); free(s);
    if (n_scored) *n_scored = scanned;
    return r;
}

/* StreamingLLM [10]: W alone, the static pattern without retrieval (ra_decode_layer skips
 * lines 7-8 in --attn streaming; attn_merge then takes o_W whole). */

/* ============================================================================================
 * Part 2: the method in the engine
 *
 * The attention state of a run: Alg. 1 for every query head of a layer at once, beside the
 * model's layers (App. C), the fast path that ra_step_head is the oracle of; the index builds
 * beside the prefill; set-up, memory plans, --audit and the GPU path's hooks.
 * ============================================================================================ */

/* ---- 7. The decoding step in the engine: Alg. 1 for every head of a layer (App. C) ---------- */

typedef struct {            /* --audit sums for one (layer, query head), over steps */
    double recall, mass_w, mass_omega, err;
    long n;
} AuditSum;

/* Alg. 1 line 5: the keys up to `to` (a position) of a layer enter the indexes that have taken
 * over, each from where it stands; keys up to n_keys - 1 (index ids) are in the cache */
typedef struct {
    Attention *A;
    const State *s;
    int layer, to, n_keys;
} InsertTask;

/* one layer's index builds: the layer's sampled queries (n_heads, n_query, hd) and the state
 * whose cache holds its keys */
typedef struct { Attention *A; const State *s; int layer, threads; const float *q; } BuildTask;

enum { INDEX_BUILDING = 0, INDEX_READY = 1, INDEX_FAILED = 2 };   /* Attention.ready */

typedef struct {            /* ra's builds beside the prefill and decoding (section 8) */
    pthread_t thread;
    int started, exited;    /* the builds' thread was started; it has returned */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* signalled at every change below */
    float **held;           /* (n_layers) each layer's sampled queries (n_heads, n_query, hd),
                               from its hand-over until its build ends; else NULL */
    int n_held;             /* layers held; the prefill waits at AttnParams.held_layers */
    int built;              /* layers [0, built) ended their builds (built, failed or passed) */
    int published;          /* layers [0, published) have taken over */
    uint8_t *failed;        /* (n_layers) 1: the layer's builds failed */
    int decoding;           /* attention_prefill_done has been called */
    void (*save)(void *arg, int whole);   /* or NULL: run before the indexes take over */
    void *save_arg;
    atomic_int stop;        /* 1: end at once, build nothing more */
    int hold, fail_layer;   /* test hooks (attention_hold_build, attention_fail_build) */
    const State *s;         /* the state whose cache holds the keys */
    const int32_t *replay;  /* the prompt's tokens when the builds run it again for the queries */
    int replay_batch;
    State *replay_state;    /* the state that runs it, while it runs */
    Pool *pool;             /* the builds' threads, at the lowest priority */
    double ready_at;        /* now_s() when the last layer took over, 0 before */
} Builds;

typedef struct {            /* --trace (AttnParams.trace): the traced head as the engine runs it */
    StepTrace st;           /* its last step: the tasks fill in what they computed */
    int n_was;              /* its index's keys before the step's insertions (lines 4-5) */
    int ahead_pos;          /* the step whose insertions attention_insert_ahead started, or -1 */
    int32_t *scored;        /* (ctx) the keys line 7 scored, as positions */
    void (*build)(void *arg, int layer, int head, const RAIndex *ix);   /* attention_trace */
    void (*step)(void *arg, const StepRecord *r);
    void *arg;
} Tracer;

typedef struct {            /* a run's statistics, for the report and --stats */
    double knn_s, build_s, retrieval_s, attention_s, audit_s;
    double conn_s;          /* the connectivity step's share of build_s, as knn_s the KNN's */
    long n_repaired, n_indexed; /* keys step (d) linked, keys indexed: all indexes */
    double build_wait_s;    /* the prefill's time waiting for builds */
    double insert_s;        /* time in or waiting for the insertions (a part of "other") */
    long exact_steps;       /* decoding steps in which some head scanned exactly (ra) */
    int exact_pos;          /* the last such step's position */
    double scan_sum;        /* sum over searches of keys scored / keys indexed */
    long n_searches;
    AuditSum *audit;        /* (n_layers, n_heads) or NULL */
    long n_w_ext;           /* (step, layer) pairs whose o_W came from AttnAsync.wait */
    uint64_t omega_fnv;     /* FNV-1a over every Omega, its count and ids in order, by step,
                               layer and head: two runs that retrieved alike agree */
} AttnStats;

typedef struct {            /* the GPU path's hooks (attention_w_source, attention_insert_ahead) */
    const float *(*wait)(void *arg);   /* o_W from elsewhere (the GPU), or NULL */
    void *arg;
    InsertTask ahead;        /* the insertions started ahead, on the pool's workers */
    Pool *inserting;        /* the pool that runs them, until a wait; else NULL */
} AttnAsync;

struct Attention {
    AttnParams p;
    const Model *m;
    int active;             /* 0: full attention (mode full, or attention_active says so) */
    int n_prompt;           /* positions below are the prompt's */
    int idx_end;            /* positions [sink, idx_end) are indexed (the same for every layer) */
    int prompt_end;         /* idx_end after the prompt, n_prompt - window: what builds index */
    int *layer_end;         /* (n_layers) idx_end reached by each layer's insertions */
    RAIndex *ra;            /* (n_layers, n_heads) ATTN_RA */
    atomic_int *ready;      /* (n_layers, n_heads) ATTN_RA: INDEX_BUILDING, _READY or _FAILED */
    IVFIndex *ivf;          /* (n_layers, n_kv_heads) ATTN_IVF; past ivf_end scanned exactly */
    int ivf_end;
    int32_t *pos_ids;       /* (ctx) pos_ids[i] = i: id lists for flat scans and W */
    SearchScratch *scratch; /* (nthreads) */
    int32_t *omega;         /* (n_heads, topk) Omega of each head at the current step */
    int *n_omega;           /* (n_heads) */
    uint8_t *use_index;     /* (n_heads) 1: the head searches its index this step; 0: exact */
    Hit *hits;              /* (n_heads, n_run, 2 topk) the exact scan's best keys of each run,
                               with room for as many candidates (flat_scan_group) */
    int *n_hits;            /* (n_heads, n_run) their counts */
    int n_run;              /* runs of keys the exact scan splits H into (one a thread at least) */
    int32_t *prev;          /* (n_layers, n_heads, topk) ra with warm: each index's last result */
    int *n_prev;            /* (n_layers, n_heads) */
    int32_t *seeds;         /* (nthreads, 2 topk) a search's seeds */
    float *work;            /* (nthreads, work_stride) partial outputs, scores, id lists */
    float *w_cpu;           /* (n_heads * (hd + 2)) o_W of the step by attn_window, as StepTask.w:
                               [n_heads x hd | n_heads maxima | n_heads sums] */
    float *w_part;          /* (2 n_heads, hd + 2) attn_window's scratch */
    size_t work_stride;
    int nthreads;
    int n_query;            /* prefill queries each index is built from (ra_query_sample) */
    float *k_f32;           /* (n_kv_heads, prompt_end, hd) a layer's keys as floats for its
                               builds, when the cache holds halves (else NULL) */
    Builds b;
    long *scored;           /* (n_heads) keys scored at the current step, per head */
    AttnStats st;
    AttnAsync async;
    Tracer tr;
};

typedef struct {
    Attention *A;
    State *s;
    int layer, pos;
    const float *w;   /* o_W of every head (line 6): (n_heads, hd), maxima, sums (w_partial) */
} StepTask;

/* a step past the prompt with the attention state active */
static int is_decoding_step(const Attention *A, int pos) {
    return A && A->active && pos >= A->n_prompt;
}

static void ra_decode_layer(Attention *A, State *s, int layer, int pos);
static void reference_decode_layer(Attention *A, State *s, int layer, int pos);

/* Attention for one layer, q and out (n, n_heads*hd) at positions pos0..: a decoding step runs
 * Alg. 1; the prompt (or full attention) runs Eq. (1) over every key before each query, by the
 * tiled kernel attn_causal (model.c). The next decoding step indexes what left W meanwhile. */
void attention_layer(const Model *m, State *s, int layer, int n, int pos0) {
    if (n == 1 && is_decoding_step(s->attn, pos0) && !layer_sliding(&m->c, layer)) {
        if (s->attn->p.reference) reference_decode_layer(s->attn, s, layer, pos0);
        else ra_decode_layer(s->attn, s, layer, pos0);
    } else attn_causal(m, s, layer, n, pos0);   /* a sliding layer's window, exactly */
}

/* Alg. 1 line 1: idx_end at the step of the token at pos, where W's window begins; W is static
 * (§3.3), so lines 2-3 never run */
static int idx_end_at(const Attention *A, int pos) {
    return pos + 1 - A->p.window > A->idx_end ? pos + 1 - A->p.window : A->idx_end;
}

static int choose_indexes(Attention *A, int layer);
static int keys_to_insert(const Attention *A, int layer);
static void insert_wait(Attention *A);
static void insert_task(void *arg, int64_t h0, int64_t h1, int thread);
static void exact_task(void *arg, int64_t t0, int64_t t1, int thread);
static void retrieve_task(void *arg, int64_t h0, int64_t h1, int thread);
static void attend_task(void *arg, int64_t h0, int64_t h1, int thread);
static void step_statistics(Attention *A, StepTask *t, double t_end);
static int traced(const Attention *A, int layer, int h);
static void trace_search(Attention *A, size_t ih, int n_seeds, const SearchScratch *s);
static void trace_scored(Attention *A, const RAIndex *ix, const SearchScratch *s);
static void trace_decoded(Attention *A, const StepTask *t);
static void trace_insertions(Attention *A, int layer);
static void trace_emit(Attention *A, const StepTask *t);

/* Alg. 1 for one layer and the token at pos, every query head in parallel (App. C), ra_step_head
 * its oracle; each line is tagged. Lines 2-3 (H -> W) never run: W is static (§3.3). flat and ivf
 * search otherwise at line 7, as does a head whose index is not yet built (exactly); streaming
 * skips lines 7-8. */
static void ra_decode_layer(Attention *A, State *s, int layer, int pos) {
    const Config *c = &A->m->c;
    StepTask t = {A, s, layer, pos, NULL};
    insert_wait(A);   /* the insertions started ahead (attention_insert_ahead) */
    A->idx_end = idx_end_at(A, pos);   /* line 1; the same at each layer of the step */
    int exact = choose_indexes(A, layer);   /* the heads whose indexes serve this step */
    if (traced(A, layer, A->p.trace_head) && A->tr.ahead_pos != pos) trace_insertions(A, layer);
    double t0 = now_s();
    if (keys_to_insert(A, layer))                                                  /* lines 4-5 */
        pool_for(s->pool, c->n_heads, insert_task,
                 &(InsertTask){A, s, layer, A->idx_end, pos + 1 - A->p.sink});
    A->layer_end[layer] = A->idx_end;   /* flat scans the range; ivf scans it as a tail */
    double t1 = now_s();
    if (exact) pool_for(s->pool, (int64_t)c->n_kv_heads * A->n_run, exact_task, &t);    /* 7 */
    if (A->p.mode != ATTN_STREAMING) pool_for(s->pool, c->n_heads, retrieve_task, &t);   /* 7 */
    double t2 = now_s();
    if (A->async.wait && (t.w = A->async.wait(A->async.arg))) A->st.n_w_ext++;       /* line 6 */
    else attn_window(A->m, s, layer, pos, A->p.sink, A->idx_end, A->w_cpu, A->w_part),
         t.w = A->w_cpu;
    pool_for(s->pool, c->n_heads, attend_task, &t);                            /* lines 6, 8, 9 */
    double t3 = now_s();
    A->st.insert_s += t1 - t0, A->st.retrieval_s += t2 - t1, A->st.attention_s += t3 - t2;
    if (A->p.mode == ATTN_RA && exact && pos != A->st.exact_pos)
        A->st.exact_steps++, A->st.exact_pos = pos;
    if (traced(A, layer, A->p.trace_head)) trace_decoded(A, &t);
    step_statistics(A, &t, t3);
}

/* the cached keys and values of one KV head of a layer, (ctx, head_dim) */
static Rows layer_k(const State *s, const Config *c, int layer, int kvh) {
    return cache_rows(s, c, 0, layer, kvh);   /* a layer with indexes holds every position */
}
static Rows layer_v(const State *s, const Config *c, int layer, int kvh) {
    return cache_rows(s, c, 1, layer, kvh);
}

/* 1 when the index of (layer, query head h) has taken over from the exact scan */
static int index_ready(const Attention *A, int layer, int h) {
    return atomic_load_explicit(&A->ready[(size_t)layer * A->m->c.n_heads + h],
                                memory_order_acquire) == INDEX_READY;
}

/* The heads of the layer whose index serves this step (use_index), read once before line 4, so
 * the lines see the same; returns how many scan exactly. ra's heads as their builds stand; flat
 * scans every head; ivf and streaming none. */
static int choose_indexes(Attention *A, int layer) {
    int exact = 0;
    for (int h = 0; h < A->m->c.n_heads; h++) {
        A->use_index[h] = A->p.mode == ATTN_RA && index_ready(A, layer, h);
        exact += (A->p.mode == ATTN_RA || A->p.mode == ATTN_FLAT) && !A->use_index[h];
    }
    return exact;
}

/* 1 when an index that serves this step lacks keys that left W (the insertions started ahead,
 * or none to make, leave nothing); a head that takes over meanwhile catches up at its first step */
static int keys_to_insert(const Attention *A, int layer) {
    const RAIndex *ix = A->ra + (size_t)layer * A->m->c.n_heads;
    for (int h = 0; A->p.mode == ATTN_RA && h < A->m->c.n_heads; h++)
        if (A->use_index[h] && A->p.sink + ix[h].n < A->idx_end) return 1;
    return 0;
}

/* Alg. 1 lines 4-5: the keys that left W enter every query head's index of the layer that has
 * taken over, each from its last key on (an index that took over late catches up at once) */
static void insert_task(void *arg, int64_t h0, int64_t h1, int thread) {
    InsertTask *j = arg;
    Attention *A = j->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    for (int64_t h = h0; h < h1; h++) {
        RAIndex *ix = &A->ra[(size_t)j->layer * c->n_heads + h];
        if (!index_ready(A, j->layer, (int)h)) continue;   /* scanned exactly meanwhile */
        /* the index's keys count from sink */
        Rows Ks = rows_from(layer_k(j->s, c, j->layer, (int)h / group), A->p.sink);
        while (A->p.sink + ix->n < j->to) {
            ra_insert_ahead(ix, Ks, hd, j->n_keys, &A->scratch[thread]);   /* key ix->n */
        }
    }
}

/* the insertions started ahead: the step waits for them (the time they were not hidden) */
static void insert_wait(Attention *A) {
    if (!A->async.inserting) return;
    double t0 = now_s();
    pool_wait(A->async.inserting);
    A->st.insert_s += now_s() - t0;
    A->async.inserting = NULL;
}

static int topk_of(const Attention *A, int n_indexed) {
    return A->p.topk < n_indexed ? A->p.topk : n_indexed;
}

static int exact_merge(const StepTask *t, int h, int thread, int32_t *out);
static int ivf_retrieve(const StepTask *t, int h, int thread, int32_t *out, int *scored);

/* beam_walk's fast twin, the walk the decoding steps and step (d) run: after each expansion it
 * resumes at the best slot a new key took, not at the beam's start (the slots before it were all
 * expanded), and it requests the next key's out-list while this one's neighbours are scored.
 * The same beam, hops and scores (tests/test_index.c). */
void beam_walk_fast(const RAIndex *ix, const float *q, Rows K, int d, int ef, int *np,
                    int *n_scored, SearchScratch *s) {
    uint32_t ep = s->epoch;
    int cur = 0;
    while (cur < *np && s->pool[cur].done) cur++;
    while (cur < *np) {
        int v = s->pool[cur].node, nb = 0, first = *np, nx = cur + 1;
        s->pool[cur].done = 1, s->hops++;
        while (nx < *np && s->pool[nx].done) nx++;   /* the likely next to expand */
        if (nx < *np) prefetch_lists(ix, &s->pool[nx].node, 1);
        const int32_t *r = ix->adj + (size_t)v * ix->M;
        for (int j = 0; j < ix->deg[v]; j++)   /* beam_offer's, with the slots kept */
            if (s->mark[r[j]] != ep) s->mark[r[j]] = ep, s->nb[nb++] = r[j];
        dot_rows(q, K, s->nb, nb, d, s->nbs);
        *n_scored += nb;
        for (int j = 0; j < nb; j++) {
            int at = pool_insert(s->pool, np, ef, (Cand){s->nbs[j], s->nb[j], 0});
            if (at >= 0 && at < first) first = at;
        }
        cur = first < cur + 1 ? first : cur + 1;   /* pool[0..cur) were all expanded */
        while (cur < *np && s->pool[cur].done) cur++;
    }
}

/* Alg. 1 line 7: Omega <- VectorSearch(q_t), one index per query head (App. C); a head whose
 * index has not taken over gets the exact top-k (exact_task's runs, merged) */
static void retrieve_task(void *arg, int64_t h0, int64_t h1, int thread) {
    StepTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, topk = A->p.topk;
    int n_idx = A->idx_end - A->p.sink, ef = search_ef(&A->p, n_idx);
    for (int64_t h = h0; h < h1; h++) {
        const float *q = t->s->q + (size_t)h * hd;
        Rows K = layer_k(t->s, c, t->layer, (int)h / group);
        int32_t *out = A->omega + (size_t)h * topk;
        size_t ih = (size_t)t->layer * c->n_heads + h;
        int scored = 0, nf = 0;
        if (A->use_index[h]) {
            int32_t *seeds = A->seeds + (size_t)thread * 2 * topk;
            int n_seeds = A->p.warm ? warm_seeds(A->prev + ih * topk, A->n_prev[ih], seeds) : 0;
            nf = ra_search_by(beam_walk_fast, &A->ra[ih], q, rows_from(K, A->p.sink), hd, ef,
                              seeds, n_seeds, topk_of(A, n_idx), out, &scored, &A->scratch[thread]);
            for (int i = 0; i < nf; i++) out[i] += A->p.sink;   /* index ids count from sink */
            if (traced(A, t->layer, (int)h)) trace_search(A, ih, n_seeds, &A->scratch[thread]);
        } else if (A->p.mode == ATTN_RA || A->p.mode == ATTN_FLAT) {
            nf = exact_merge(t, (int)h, thread, out), scored = n_idx;
        } else if (A->p.mode == ATTN_IVF) {
            nf = ivf_retrieve(t, (int)h, thread, out, &scored);
        }
        if (A->p.mode == ATTN_RA && A->p.warm) {   /* the next search's seeds, as index ids */
            for (int i = 0; i < nf; i++) A->prev[ih * topk + i] = out[i] - A->p.sink;
            A->n_prev[ih] = nf;
        }
        A->n_omega[h] = nf;
        A->scored[h] = scored;
    }
}

/* query head h at this step: its query, the keys and values of its KV head (GQA), its output */
typedef struct { const float *q; Rows K, V; float *out; } HeadView;   /* q, out: (hd) */

static HeadView head_view(const StepTask *t, int h) {
    const Config *c = &t->A->m->c;
    int hd = c->head_dim, kvh = h / (c->n_heads / c->n_kv_heads);
    HeadView v = {t->s->q + (size_t)h * hd, layer_k(t->s, c, t->layer, kvh),
                  layer_v(t->s, c, t->layer, kvh), t->s->att + (size_t)h * hd};
    return v;
}

/* head h's o_W (line 6) in StepTask.w, [n_heads x hd | n_heads maxima | n_heads sums] */
static Partial w_partial(const float *w, int h, int nh, int hd) {
    return (Partial){w + (size_t)h * hd, w[(size_t)nh * hd + h], w[(size_t)nh * hd + nh + h]};
}

/* Alg. 1 lines 6, 8, 9: o_W over the static pattern, o_Omega over the retrieved keys, merged by
 * Eq. (4)-(5) */
static void attend_task(void *arg, int64_t h0, int64_t h1, int thread) {
    StepTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, nh = c->n_heads;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = h0; h < h1; h++) {
        HeadView hv = head_view(t, (int)h);
        float *o_omega = A->work + (size_t)thread * A->work_stride;   /* (hd) */
        float z_omega = -INFINITY, s_omega = 0;   /* Eq. (4): z~2 and its sum, none yet */
        /* line 6: o_W = Attn(q, K[W], V[W]) over [0, sink) and [idx_end, pos], as attn_window
           (or the GPU) gave it, with z~1 and its sum */
        Partial w = w_partial(t->w, (int)h, nh, hd);
        /* line 8: o_Omega = Attn(q, K[Omega], V[Omega]) */
        if (A->p.mode != ATTN_STREAMING)
            attn_partial_ids(hv.q, hv.K, hv.V, A->omega + (size_t)h * A->p.topk, A->n_omega[h],
                             hd, scale, o_omega, &z_omega, &s_omega);
        /* line 9: o_t = g1 o_W + g2 o_Omega, Eq. (4)-(5) */
        attn_merge(w.o, w.zmax, w.sumexp, o_omega, z_omega, s_omega, hd, hv.out, NULL, NULL);
        if (traced(A, t->layer, (int)h)) A->tr.st.z_omega = z_omega, A->tr.st.s_omega = s_omega;
    }
}

/* --reference (ra): the same step by its plain function, ra_step_head, a query head at a time on
 * this thread, in the paper's order; the heads' indexes as the builds left them */
static void reference_decode_layer(Attention *A, State *s, int layer, int pos) {
    const Config *c = &A->m->c;
    StepTask t = {A, s, layer, pos, NULL};
    int topk = A->p.topk, idx_end = A->idx_end;
    double t0 = now_s();
    for (int h = 0; h < c->n_heads; h++) {
        size_t ih = (size_t)layer * c->n_heads + h;
        HeadView hv = head_view(&t, h);
        A->use_index[h] = index_ready(A, layer, h);
        HeadStep hs = {A->use_index[h] ? &A->ra[ih] : NULL, idx_end, A->prev + ih * topk,
                       A->n_prev[ih], 0};
        StepTrace *tr = traced(A, layer, h) ? &A->tr.st : NULL;
        A->n_omega[h] = ra_step_head(&A->p, &hs, hv.q, hv.K, hv.V, c->head_dim, pos,
                                     A->omega + (size_t)h * topk, hv.out, &A->scratch[0], tr);
        A->n_prev[ih] = hs.n_prev, A->scored[h] = hs.n_scored, A->idx_end = hs.idx_end;
        if (tr) trace_scored(A, hs.ix, &A->scratch[0]), trace_emit(A, &t);
    }
    A->layer_end[layer] = A->idx_end;
    double t1 = now_s();
    A->st.retrieval_s += t1 - t0;
    step_statistics(A, &t, t1);
}

/* Flat at line 7 in a decoding step, for the heads that scan (use_index 0): each KV head's keys
 * H = [sink, idx_end) in n_run runs, a run's keys read once for the group's query heads (App. C,
 * flat_scan_group: model.c), each head's best keys of the run into hits */
static void exact_task(void *arg, int64_t i0, int64_t i1, int thread) {
    StepTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, R = A->n_run;
    int n = A->idx_end - A->p.sink, k = topk_of(A, n);
    (void)thread;
    for (int64_t i = i0; i < i1; i++) {
        int kvh = (int)(i / R), r = (int)(i % R), h0 = kvh * group, scans = 0;
        int lo = A->p.sink + (int)((int64_t)n * r / R);
        int hi = A->p.sink + (int)((int64_t)n * (r + 1) / R);
        for (int h = h0; h < h0 + group; h++) scans += !A->use_index[h];
        if (scans)
            flat_scan_group(t->s->q + (size_t)h0 * hd, group, layer_k(t->s, c, t->layer, kvh), lo,
                            hi, hd, k, A->hits + ((size_t)h0 * R + r) * 2 * A->p.topk,
                            (size_t)R * 2 * A->p.topk, A->n_hits + (size_t)h0 * R + r, (size_t)R);
    }
}

/* head h's exact top-k over H: its best keys of each run, merged (heap_offer's order, as
 * flat_topk's), positions into out */
static int exact_merge(const StepTask *t, int h, int thread, int32_t *out) {
    Attention *A = t->A;
    int R = A->n_run, k = topk_of(A, A->idx_end - A->p.sink), n = 0;
    Hit *best = (Hit *)(A->work + (size_t)thread * A->work_stride);   /* (k) */
    for (int r = 0; r < R; r++) {
        const Hit *run = A->hits + ((size_t)h * R + r) * 2 * A->p.topk;
        for (int i = 0; i < A->n_hits[(size_t)h * R + r]; i++) heap_offer(best, &n, k, run[i]);
    }
    return heap_write(best, n, out);
}

static const float *keys_to_index(const BuildTask *t, int kvh);

/* --attn ivf's index of one KV head (its query heads share it), built once from the prompt */
static void head_ivf_task(void *arg, int64_t h0, int64_t h1, int thread) {
    BuildTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, n = A->prompt_end - A->p.sink;
    (void)thread;
    for (int64_t h = h0; h < h1; h++) {
        if (t->s->stop && t->s->stop()) break;
        /* n >= 1: past W */
        build_ivf(&A->ivf[(size_t)t->layer * c->n_kv_heads + h], keys_to_index(t, (int)h),
                  A->pos_ids + A->p.sink, n, hd, hd, ivf_nlist(n), 10, 1234 + (uint64_t)h, 1);
    }
}

/* the top-k of the union of two id lists by q.k (the IVF result and the tail), ties to the lower
 * id; sc (n) scratch */
static int merge_topk(const float *q, Rows K, int hd, int32_t *ids, int n, int k, float *sc) {
    for (int i = 0; i < n; i++) sc[i] = dot_row(q, K, ids[i], hd);
    for (int i = 0; i < n && i < k; i++) {   /* partial selection sort: k is small */
        int b = i;
        for (int j = i + 1; j < n; j++)
            if (sc[j] > sc[b] || (sc[j] == sc[b] && ids[j] < ids[b])) b = j;
        float ts = sc[i];
        int32_t ti = ids[i];
        sc[i] = sc[b], ids[i] = ids[b], sc[b] = ts, ids[b] = ti;
    }
    return n < k ? n : k;
}

/* --attn ivf at line 7: the probed lists' top-k, merged with the keys indexed since the build
 * (the tail past ivf_end, scanned exactly). Departure: clustered once, from the prompt. */
static int ivf_retrieve(const StepTask *t, int h, int thread, int32_t *out, int *scored) {
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, topk = A->p.topk, nf;
    const float *q = t->s->q + (size_t)h * hd;
    Rows K = layer_k(t->s, c, t->layer, h / group);
    int32_t *cand = (int32_t *)(A->work + (size_t)thread * A->work_stride);
    float *sc = (float *)(cand + topk + (A->idx_end - A->ivf_end));
    nf = ivf_search(&A->ivf[(size_t)t->layer * c->n_kv_heads + h / group], q, K, hd, A->p.nprobe,
                    topk, cand, scored);
    for (int i = A->ivf_end; i < A->idx_end; i++) cand[nf++] = i, (*scored)++;   /* the tail */
    nf = merge_topk(q, K, hd, cand, nf, topk, sc);
    memcpy(out, cand, (size_t)nf * sizeof *out);
    return nf;
}

/* ---- 8. The index builds beside the prefill and decoding (§3.2, App. C) ------------------- */

/* A layer's indexes are built once its prefill keys and queries exist, one per query head, from
 * a sample of its queries that the prefill hands over (attention_layer_done). The builds run on
 * a thread and a pool of their own at the lowest priority (thread_background): the prefill goes
 * on, and decoding starts at the prefill's end; a head scans its keys exactly until its index
 * takes over. Departure: the paper builds every index before decoding (./ra --index-wait). */

static void hand_over(Attention *A, const State *s, int layer, int n);
static void build_layer(Attention *A, int layer);
static void end_layer(Attention *A, int layer, int failed);
static void layer_keys_f32(Attention *A, BuildTask *t, Pool *p);
static void head_ivf_task(void *arg, int64_t h0, int64_t h1, int thread);

/* State.layer_done: once a layer's prefill keys and queries exist, ra's layer is handed over to
 * the builds, ivf's lists are built at once (on every thread) */
static void attention_layer_done(void *arg, int layer, int pos0, int n) {
    State *s = arg;
    Attention *A = s->attn;
    if (!A || !A->active || pos0 != 0) return;   /* built once, from the prompt */
    const Config *c = &A->m->c;
    int again = A->layer_end[layer] > 0;   /* > 0 once built: idx_end > sink >= 0 while active */
    if (n != A->n_prompt || again)   /* a misuse of the API: refused rather than index stale keys */
        die("an attention state for one prefill of %d tokens got %s of %d at layer %d"
            " (build a new one for each prompt: build_attention)", A->n_prompt,
            again ? "another" : "one", n, layer);
    A->layer_end[layer] = A->idx_end;
    if (layer_sliding(c, layer)) return;   /* it attends to its window alone: no index */
    if (A->p.mode == ATTN_RA) hand_over(A, s, layer, n);
    if (A->p.mode != ATTN_IVF) return;   /* flat, streaming: no index */
    double t0 = now_s();
    BuildTask t = {A, s, layer, 1, NULL};
    if (s->cache_type & CACHE_K_F16) layer_keys_f32(A, &t, s->pool);
    pool_for(s->pool, c->n_kv_heads, head_ivf_task, &t);
    double wall = now_s() - t0;
    A->st.build_s += wall, A->st.build_wait_s += wall;
}

static float *sample_layer_queries(Attention *A, const State *s, int n);
static void *builds_main(void *arg);

/* The layer's sampled queries to the builds, which are started with the first; the prefill
 * waits first while held_layers layers wait for theirs (memory) */
static void hand_over(Attention *A, const State *s, int layer, int n) {
    Builds *b = &A->b;
    int most = A->p.held_layers > 0 ? A->p.held_layers : A->m->c.n_layers;
    double t0 = now_s();
    pthread_mutex_lock(&b->mu);
    if (!b->s) b->s = s;   /* before the builds' thread starts: it reads it from then on */
    while (b->started && !b->exited && b->n_held >= most) pthread_cond_wait(&b->cv, &b->mu);
    int gone = b->exited;   /* the builds stopped */
    pthread_mutex_unlock(&b->mu);
    A->st.build_wait_s += now_s() - t0;
    if (gone) return;
    float *q = sample_layer_queries(A, s, n);
    pthread_mutex_lock(&b->mu);
    b->held[layer] = q, b->n_held++;
    if (!b->started && pthread_create(&b->thread, NULL, builds_main, A) != 0)
        die("could not start a thread for the index builds");
    b->started = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* The layer's sampled queries (ra_query_sample over the n prompt queries, which q_keep holds at
 * kept_row) of each head, in a new array (n_heads, n_query, hd) that the builds read while the
 * prefill writes the next layer's queries to q_keep */
static float *sample_layer_queries(Attention *A, const State *s, int n) {
    const Config *c = &A->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd, m;
    int32_t *rows = query_sample_rows(n, A->p.q_stride, &m);   /* (m) */
    float *q = xmalloc(((size_t)c->n_heads * m * hd + 1) * sizeof(float));
    for (int i = 0; i < m; i++) {   /* each sampled query's row of q_keep */
        int r = kept_row(s, rows[i]);
        if (r < 0)   /* a caller's q_keep_row without it: refused rather than build from garbage */
            die("the kept prefill queries lack query %d, which the index build reads", rows[i]);
        rows[i] = r;
    }
    sample_rows(s->q_keep, (size_t)qd, c->n_heads, hd, rows, m, q);
    free(rows);
    return q;
}

static int builds_stopped(const Builds *b) {
    return atomic_load(&b->stop) || (b->s && b->s->stop && b->s->stop());
}

static int wait_handed(Attention *A, int layer);
static void replay_prompt(Attention *A);
static void publish(Attention *A, int upto);

/* The builds' thread: each global layer in order, once handed over (or, after a context file
 * without indexes, as the prompt runs again); at the end, once decoding may begin, the save,
 * then every index takes over (without a save they took over one layer at a time) */
static void *builds_main(void *arg) {
    Attention *A = arg;
    Builds *b = &A->b;
    int L = A->m->c.n_layers;
    thread_background();   /* before its pool: the pool's threads inherit it */
    b->pool = build_pool(A->nthreads);
    if (b->replay) replay_prompt(A);
    for (int l = 0; !b->replay && l < L && !builds_stopped(b); l++) {
        if (layer_sliding(&A->m->c, l)) end_layer(A, l, 0);   /* no index */
        else if (wait_handed(A, l)) build_layer(A, l);
    }
    pthread_mutex_lock(&b->mu);
    while (!b->decoding && !atomic_load(&b->stop)) pthread_cond_wait(&b->cv, &b->mu);
    if (b->save && b->built == L && !atomic_load(&b->stop)) {
        int whole = 1;
        for (int l = 0; l < L; l++) whole &= !b->failed[l];
        pthread_mutex_unlock(&b->mu);
        b->save(b->save_arg, whole);
        pthread_mutex_lock(&b->mu);
        publish(A, L);
    }
    free_pool(b->pool);
    b->pool = NULL, b->exited = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* 1 once the layer is handed over; 0: stopped */
static int wait_handed(Attention *A, int layer) {
    Builds *b = &A->b;
    pthread_mutex_lock(&b->mu);
    while (!b->held[layer] && !atomic_load(&b->stop)) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    return !atomic_load(&b->stop);
}

static int room_for_build(const Attention *A);
static RAParams head_build_params(const AttnParams *ap);
static void head_index_task(void *arg, int64_t h0, int64_t h1, int thread);
static void record_build(Attention *A, int layer, double wall);

/* §3.2 for every query head of the layer on the builds' pool: a head a thread; the heads left
 * over when they do not divide evenly, each on every thread. A build that cannot get its memory
 * fails, said in one line: the layer's heads scan exactly for good. Stopped: nothing ends. */
static void build_layer(Attention *A, int layer) {
    Builds *b = &A->b;
    const Config *c = &A->m->c;
    pthread_mutex_lock(&b->mu);
    while (b->hold && !atomic_load(&b->stop)) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    int failed = b->fail_layer == layer || !room_for_build(A);
    if (failed)
        fprintf(stderr, "ra: the indexes of layer %d could not get their memory: its heads scan "
                "their keys exactly\n", layer);
    if (!failed && !builds_stopped(b)) {
        double t0 = now_s();
        BuildTask t = {A, b->s, layer, 1, b->held[layer]};
        if (b->s->cache_type & CACHE_K_F16) layer_keys_f32(A, &t, b->pool);
        int nt = pool_threads(b->pool), whole = c->n_heads > nt ? c->n_heads / nt * nt : c->n_heads;
        pool_for(b->pool, whole, head_index_task, &t);
        BuildTask wide = {A, b->s, layer, nt, b->held[layer]};
        if (whole < c->n_heads) head_index_task(&wide, whole, c->n_heads, 0);
        if (!builds_stopped(b)) record_build(A, layer, now_s() - t0);
    }
    if (!builds_stopped(b)) end_layer(A, layer, failed);
}

/* A layer's builds ended: its queries are freed (the prefill may hand over another), and it
 * takes over at once when decoding has begun and nothing is to be saved first */
static void end_layer(Attention *A, int layer, int failed) {
    Builds *b = &A->b;
    pthread_mutex_lock(&b->mu);
    if (b->held[layer]) free(b->held[layer]), b->held[layer] = NULL, b->n_held--;
    b->failed[layer] = (uint8_t)failed;
    b->built = layer + 1;
    if (b->decoding && !b->save) publish(A, b->built);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* layers [published, upto) take over: a step reads each head's flag (index_ready) before it
 * searches; under b->mu */
static void publish(Attention *A, int upto) {
    Builds *b = &A->b;
    const Config *c = &A->m->c;
    for (int l = b->published; l < upto; l++)
        for (int h = 0; h < c->n_heads && !layer_sliding(c, l); h++)
            atomic_store_explicit(&A->ready[(size_t)l * c->n_heads + h],
                                  b->failed[l] ? INDEX_FAILED : INDEX_READY, memory_order_release);
    if (upto > b->published) b->published = upto;
    if (b->published == c->n_layers && !b->ready_at) b->ready_at = now_s();
}

/* 1 when the memory a layer's builds take could be had now (tried, then given back): with too
 * little, the layer scans exactly rather than end the run when an allocation fails midway */
static int room_for_build(const Attention *A) {
    const Config *c = &A->m->c;
    RAParams rp = head_build_params(&A->p);
    int n = A->prompt_end - A->p.sink, cap = A->b.s->ctx - A->p.window - A->p.sink;
    double bytes = pool_threads(A->b.pool) * ra_build_bytes(A->n_prompt, n, c->head_dim, &rp) +
                   (double)c->n_heads * cap * (A->p.max_degree + 2) * sizeof(int32_t);
    void *p = bytes < (double)SIZE_MAX / 2 ? malloc((size_t)bytes) : NULL;
    free(p);
    return p != NULL;
}

/* a layer's build took `wall` seconds: its statistics, and the KNN's and step (d)'s shares */
static void record_build(Attention *A, int layer, double wall) {
    const Config *c = &A->m->c;
    double knn = 0, conn = 0, all = 0;
    A->st.build_s += wall;
    for (int h = 0; h < c->n_heads; h++) {
        const RAIndex *ix = &A->ra[(size_t)layer * c->n_heads + h];
        knn += ix->t_knn, conn += ix->t_conn, all += ix->t_knn + ix->t_proj + ix->t_conn;
        A->st.n_repaired += ix->n_repaired, A->st.n_indexed += ix->n;
    }
    A->st.knn_s += all > 0 ? wall * knn / all : 0;
    A->st.conn_s += all > 0 ? wall * conn / all : 0;
}

/* the layer's keys [0, prompt_end) of KV heads [h0, h1) as floats into k_f32 */
static void keys_f32_task(void *arg, int64_t h0, int64_t h1, int thread) {
    BuildTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, n = A->prompt_end;
    (void)thread;
    for (int64_t h = h0; h < h1; h++) {
        Rows K = layer_k(t->s, c, t->layer, (int)h);
        for (int i = 0; i < n; i++) row_f32(K, i, hd, A->k_f32 + ((size_t)h * n + i) * hd);
    }
}

/* a cache of halves: the layer's keys as floats, one copy that its builds share (the KNN and
 * k-means read floats) */
static void layer_keys_f32(Attention *A, BuildTask *t, Pool *p) {
    const Config *c = &A->m->c;
    if (!A->k_f32)
        A->k_f32 =
            xmalloc(((size_t)c->n_kv_heads * A->prompt_end * c->head_dim + 1) * sizeof(float));
    pool_for(p, c->n_kv_heads, keys_f32_task, t);
}

/* the keys a build of KV head kvh reads, rows [0, prompt_end) as floats: the cache's own rows,
 * or their copy in k_f32 */
static const float *keys_to_index(const BuildTask *t, int kvh) {
    const Attention *A = t->A;
    if (A->k_f32) return A->k_f32 + (size_t)kvh * A->prompt_end * A->m->c.head_dim;
    return layer_k(t->s, &A->m->c, t->layer, kvh).data;
}

/* one head's build settings from the run's flags (one thread; build_layer gives a leftover head
 * every thread) */
static RAParams head_build_params(const AttnParams *ap) {
    RAParams rp = ra_default_params();
    rp.nq_knn = ap->nq_knn, rp.max_degree = ap->max_degree, rp.q_stride = ap->q_stride,
    rp.nthreads = 1;
    rp.ef_conn = ap->ef_conn;
    if (ap->n_entry) rp.n_entry = ap->n_entry;
    rp.gpu_knn = ap->gpu && ap->nq_knn <= KNN_GPU_MAX_KQ;   /* past it the CPU's (./ra says so) */
    rp.plain_knn = ap->reference;
    return rp;
}

/* §3.2: the index of one query head, from its sampled prefill queries and its KV head's keys */
static void head_index_task(void *arg, int64_t h0, int64_t h1, int thread) {
    BuildTask *t = arg;
    Attention *A = t->A;
    const Config *c = &A->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, m = A->n_query;
    (void)thread;
    for (int64_t h = h0; h < h1; h++) {
        if (builds_stopped(&A->b)) break;
        RAParams rp = head_build_params(&A->p);
        rp.nthreads = t->threads;
        rp.q_stride = 1;   /* the queries handed over are the sample */
        rp.capacity = t->s->ctx - A->p.window - A->p.sink;   /* every key the context can index */
        const float *K = keys_to_index(t, (int)h / group) + (size_t)A->p.sink * hd;
        RAIndex *ix = &A->ra[(size_t)t->layer * c->n_heads + h];
        rp.trace_keys = traced(A, t->layer, (int)h);
        build_ra_index(ix, t->q + (size_t)h * m * hd, m, hd, K, A->prompt_end - A->p.sink, hd, hd,
                       &rp);
        if (traced(A, t->layer, (int)h) && A->tr.build)
            A->tr.build(A->tr.arg, t->layer, (int)h, ix);
    }
}

/* -- a context file without indexes: the prompt runs again on the builds' threads -- */

/* the state whose builds run the prompt again on this thread (for replay_stop), else NULL */
static _Thread_local Attention *replaying;

/* the replay's State.stop: the builds stopped, or the run (Ctrl-C) */
static int replay_stop(void) { return replaying && builds_stopped(&replaying->b); }

/* the replay's State.layer_done: the layer's queries handed over, and built at once */
static void replay_layer_done(void *arg, int layer, int pos0, int n) {
    Attention *A = arg;
    Builds *b = &A->b;
    (void)pos0;
    if (layer_sliding(&A->m->c, layer)) {
        end_layer(A, layer, 0);
        return;
    }
    float *q = sample_layer_queries(A, b->replay_state, n);
    pthread_mutex_lock(&b->mu);
    b->held[layer] = q, b->n_held++;
    pthread_mutex_unlock(&b->mu);
    build_layer(A, layer);
}

/* The prompt's queries, computed again: the prompt through the model on a state of its own (its
 * own cache: a sliding layer's ring of the prompt's start is gone from the run's), whose
 * layer_done builds each layer. No memory for that state: one line, and every head scans. */
static void replay_prompt(Attention *A) {
    Builds *b = &A->b;
    const Config *c = &A->m->c;
    int n = A->n_prompt;
    State rs;
    char err[ERR_LEN];
    int32_t *keep_row = NULL;
    int ok = !build_state(&rs, A->m, n, b->replay_batch, b->s->cache_type, b->pool, err);
    if (ok) {
        keep_row = malloc((size_t)n * sizeof *keep_row);   /* (n) State.q_keep_row */
        rs.q_keep_n = keep_row ? ra_query_slots(n, A->p.q_stride, keep_row) : 0;
        rs.q_keep_row = keep_row, rs.q_keep_span = n;
        rs.q_keep = malloc(((size_t)rs.q_keep_n * c->n_heads * c->head_dim + 1) * sizeof(float));
        ok = keep_row && rs.q_keep;
    }
    if (!ok) {
        fprintf(stderr, "ra: no memory to run the prompt again for the indexes' queries: every "
                "head scans its keys exactly\n");
        for (int l = 0; l < c->n_layers; l++) end_layer(A, l, !layer_sliding(c, l));
    } else {
        rs.layer_done = replay_layer_done, rs.layer_arg = A, rs.stop = replay_stop;
        b->replay_state = &rs;
        replaying = A;
        forward(A->m, &rs, b->replay, n);
        replaying = NULL, b->replay_state = NULL;
    }
    free(keep_row);
    free(rs.q_keep);
    if (ok || rs.k) free_state(&rs);
}

/* -- the builds' controls -- */

void attention_replay(Attention *A, State *s, const int32_t *tokens, int batch) {
    Builds *b = &A->b;
    if (!A->active || A->p.mode != ATTN_RA || b->started) return;
    for (int l = 0; l < A->m->c.n_layers; l++) A->layer_end[l] = A->idx_end;
    b->s = s, b->replay = tokens, b->replay_batch = batch;
    if (pthread_create(&b->thread, NULL, builds_main, A) != 0)
        die("could not start a thread for the index builds");
    b->started = 1;
}

void attention_prefill_done(Attention *A, void (*save)(void *arg, int whole), void *arg) {
    Builds *b = &A->b;
    pthread_mutex_lock(&b->mu);
    b->decoding = 1;
    b->save = save, b->save_arg = arg;
    if (!save) publish(A, b->built);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void attention_wait_build(Attention *A) {
    if (!A || !A->b.started) return;
    Builds *b = &A->b;
    double t0 = now_s();
    pthread_mutex_lock(&b->mu);
    while (!b->exited) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    A->st.build_wait_s += now_s() - t0;
}

void attention_stop_build(Attention *A) {
    Builds *b = &A->b;
    if (!b->started) return;
    atomic_store(&b->stop, 1);
    pthread_mutex_lock(&b->mu);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    b->started = 0;
}

int attention_builds_left(const Attention *A, int *total) {
    int n = A && A->active && A->p.mode == ATTN_RA ? global_layers(&A->m->c) : 0, left = 0;
    if (total) *total = n;
    if (!n) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&A->b.mu);
    for (int l = A->b.published; l < A->m->c.n_layers; l++) left += !layer_sliding(&A->m->c, l);
    pthread_mutex_unlock((pthread_mutex_t *)&A->b.mu);
    return left;
}

long attention_exact_steps(const Attention *A) { return A ? A->st.exact_steps : 0; }

double attention_ready_at(const Attention *A) {
    double t;
    pthread_mutex_lock((pthread_mutex_t *)&A->b.mu);
    t = A->b.ready_at;
    pthread_mutex_unlock((pthread_mutex_t *)&A->b.mu);
    return t;
}

void attention_hold_build(Attention *A, int hold) {
    pthread_mutex_lock(&A->b.mu);
    A->b.hold = hold;
    pthread_cond_broadcast(&A->b.cv);
    pthread_mutex_unlock(&A->b.mu);
}

void attention_fail_build(Attention *A, int fail_layer) { A->b.fail_layer = fail_layer; }

/* ---- 9. The attention state's upkeep: set-up, memory plans, --audit, the GPU path's hooks ---- */

/* host bytes of the KV cache and of the indexes for a context, as planned (App. C: keys and
 * values stored once per KV head, indexes hold ids) */
void attention_memory(const Config *c, const AttnParams *p, int ctx, int max_batch,
                      double *kv_bytes, double *index_bytes) {
    double n_idx = ctx - p->sink - p->window > 0 ? ctx - p->sink - p->window : 0;
    *kv_bytes = kv_cache_bytes(c, ctx, max_batch, p->cache_type);
    int n_global = global_layers(c);   /* they alone have indexes */
    *index_bytes = 0;
    if (p->mode == ATTN_RA) {   /* per (layer, query head): M ids, degree and in-degree per node;
                                 * the guides (vectors, thresholds, top keys), ra_insert_ahead's */
        RAParams rp = ra_default_params();
        double guides = (double)rp.n_guide * (c->head_dim + 1 + GUIDE_TOP) * 4 +
                        (double)GUIDE_AHEAD * (GUIDE_USE * GUIDE_TOP + 1) * 4;
        *index_bytes = (double)n_global * c->n_heads *
                       (n_idx * (p->max_degree + 2) * sizeof(int32_t) + guides);
    }
    if (p->mode == ATTN_IVF)   /* ids and centroids per (layer, KV head) */
        *index_bytes =
            (double)n_global * c->n_kv_heads * (n_idx * 4 + 4 * sqrt(n_idx) * c->head_dim * 4);
}

/* The host bytes one build_ra_index call holds beyond the index it returns, at its peak: the
 * most of (a) the lists and the KNN's buffers, (b) the lists, pivots and stamps, (c) the edges
 * by target, (d) the marks, queue and scratch. The preflight counts one build per thread. */
double ra_build_bytes(int nq, int nk, int d, const RAParams *p) {
    RAParams P = p ? *p : ra_default_params();
    if (P.max_degree < 1) P.max_degree = 1;
    if (nk <= 0) return 0;
    double Nq = P.nq_knn < nk ? (P.nq_knn > 1 ? P.nq_knn : 1) : nk;
    double n_query = nq > 0 ? ra_query_sample(nq, P.q_stride, NULL) : 0;
    int nth = P.nthreads < 1 ? 1 : P.nthreads > MAX_THREADS ? MAX_THREADS : P.nthreads;
    double held = n_query * Nq * 4 + (double)nk * 4;   /* the lists and top queries, (a) to (d) */
    double a = held + n_query * d * 4 + knn_blocked_bytes(nk, d, (int)Nq, nth);   /* + the sample */
    double b = held + n_query * Nq * 4 + (double)nk * (4 + 1 + 4.0 * nth) + n_query * 8;
    double c = held + (double)nk * 8 + 12.0 * ((n_query < nk ? n_query : nk) * P.max_degree + 1);
    double dd = held + (double)nk * (1 + 4 + 4) + (P.ef_conn + Nq) * 16.0 + P.max_degree * 8.0;
    double peak = a > b ? a : b;
    peak = peak > c ? peak : c;
    return peak > dd ? peak : dd;
}

/* The mode runs once the prompt outgrows W; ra, once it also leaves exact_below keys outside W:
 * fewer are scanned exactly by full attention faster than a search finds their top-k, and the
 * build is saved. Departure: the paper searches at every length. */
int attention_active(const AttnParams *p, int n_prompt) {
    if (p->mode == ATTN_FULL || n_prompt <= p->sink + p->window) return 0;
    return p->mode != ATTN_RA || n_prompt - p->sink - p->window >= p->exact_below;
}

int build_attention(Attention **out, const Model *m, const AttnParams *p, int ctx, int n_prompt,
                    int nthreads, char *err) {
    const Config *c = &m->c;
    Attention *A = calloc(1, sizeof *A);
    if (!A) return snprintf(err, ERR_LEN, "out of memory"), -1;
    A->p = *p;
    A->m = m;
    A->nthreads = nthreads;
    A->active = attention_active(p, n_prompt);
    A->n_prompt = n_prompt;
    A->idx_end = A->prompt_end = n_prompt - p->window;
    A->ivf_end = A->idx_end;
    A->st.exact_pos = -1;
    A->st.omega_fnv = 0xcbf29ce484222325ull;   /* FNV-1a's offset basis */
    A->n_query = A->active && p->mode == ATTN_RA ? ra_query_sample(n_prompt, p->q_stride, NULL) : 0;
    pthread_mutex_init(&A->b.mu, NULL);
    pthread_cond_init(&A->b.cv, NULL);
    A->b.fail_layer = -1;
    int hd = c->head_dim;
    size_t n_ih = (size_t)c->n_layers * c->n_heads, tk = p->topk > 0 ? (size_t)p->topk : 1;
    /* the exact scan's runs of keys: two a thread, over the KV heads */
    A->n_run = (2 * nthreads + c->n_kv_heads - 1) / c->n_kv_heads;
    A->layer_end = calloc((size_t)c->n_layers, sizeof(int));
    A->pos_ids = malloc((size_t)ctx * sizeof(int32_t));
    A->scratch = calloc((size_t)nthreads, sizeof(SearchScratch));
    A->omega = malloc((size_t)c->n_heads * tk * sizeof(int32_t));
    A->n_omega = calloc((size_t)c->n_heads, sizeof(int));
    A->use_index = calloc((size_t)c->n_heads, 1);
    A->hits = malloc((size_t)c->n_heads * A->n_run * 2 * tk * sizeof(Hit));
    A->n_hits = calloc((size_t)c->n_heads * A->n_run, sizeof(int));
    A->prev = malloc(n_ih * tk * sizeof(int32_t));
    A->n_prev = calloc(n_ih, sizeof(int));
    A->seeds = malloc((size_t)nthreads * 2 * tk * sizeof(int32_t));
    A->scored = calloc((size_t)c->n_heads, sizeof(long));
    /* per thread: partial outputs (2 hd), then scores (ctx) and two id/score lists (audit, IVF) */
    A->work_stride = (size_t)ctx * 3 + 2 * hd + (size_t)p->topk + 16;
    A->work = malloc((size_t)nthreads * A->work_stride * sizeof(float));
    A->w_cpu = malloc((size_t)c->n_heads * (hd + 2) * sizeof(float));
    A->w_part = malloc((size_t)2 * c->n_heads * (hd + 2) * sizeof(float));
    A->b.held = calloc((size_t)c->n_layers, sizeof(float *));
    A->b.failed = calloc((size_t)c->n_layers, 1);
    if (p->mode == ATTN_RA) A->ra = calloc(n_ih, sizeof(RAIndex));
    if (p->mode == ATTN_RA) A->ready = calloc(n_ih, sizeof(atomic_int));   /* INDEX_BUILDING */
    if (p->mode == ATTN_IVF) A->ivf = calloc((size_t)c->n_layers * c->n_kv_heads, sizeof(IVFIndex));
    if (p->audit) A->st.audit = calloc(n_ih, sizeof(AuditSum));
    A->tr.scored = malloc((size_t)ctx * sizeof(int32_t));   /* --trace's, set on or off later */
    A->tr.ahead_pos = -1;
    if (!A->layer_end || !A->pos_ids || !A->scratch || !A->omega || !A->n_omega || !A->scored ||
        !A->work || !A->w_cpu || !A->w_part || !A->prev || !A->n_prev || !A->seeds ||
        !A->use_index || !A->hits || !A->n_hits || !A->b.held || !A->b.failed ||
        (p->mode == ATTN_RA && (!A->ra || !A->ready)) ||
        (p->mode == ATTN_IVF && !A->ivf) || (p->audit && !A->st.audit) || !A->tr.scored) {
        free_attention(A);
        snprintf(err, ERR_LEN, "out of memory for the attention state (context %d)", ctx);
        return -1;
    }
    for (int i = 0; i < ctx; i++) A->pos_ids[i] = i;
    for (int i = 0; i < nthreads; i++) build_search_scratch(&A->scratch[i]);
    *out = A;
    return 0;
}

void free_attention(Attention *A) {
    if (!A) return;
    const Config *c = &A->m->c;
    if (A->async.inserting) pool_wait(A->async.inserting);
    attention_stop_build(A);
    if (A->ra)
        for (int i = 0; i < c->n_layers * c->n_heads; i++) free_ra_index(&A->ra[i]);
    if (A->ivf)
        for (int i = 0; i < c->n_layers * c->n_kv_heads; i++) free_ivf(&A->ivf[i]);
    if (A->scratch)
        for (int i = 0; i < A->nthreads; i++) free_search_scratch(&A->scratch[i]);
    for (int l = 0; A->b.held && l < c->n_layers; l++) free(A->b.held[l]);   /* never built */
    free(A->ra), free(A->ready), free(A->ivf), free(A->scratch), free(A->layer_end);
    free(A->pos_ids), free(A->omega), free(A->n_omega), free(A->scored), free(A->work);
    free(A->st.audit), free(A->w_cpu), free(A->w_part), free(A->use_index), free(A->hits);
    free(A->n_hits), free(A->prev), free(A->n_prev), free(A->seeds), free(A->k_f32);
    free(A->b.held), free(A->b.failed), free(A->tr.scored);
    pthread_mutex_destroy(&A->b.mu);
    pthread_cond_destroy(&A->b.cv);
    free(A);
}

void attach_attention(State *s, Attention *A) {
    s->attn = A;
    s->layer_done = attention_layer_done;
    s->layer_arg = s;
}

static void audit_task(void *arg, int64_t h0, int64_t h1, int thread);
static ExactCheck exact_check(const StepTask *t, int h, float *work);

/* after a step: --audit (its own phase, not timed as decoding) and the scan ratio */
/* FNV-1a: h, then n bytes at p */
static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void step_statistics(Attention *A, StepTask *t, double t_end) {
    const Config *c = &A->m->c;
    if (A->st.audit) {
        pool_for(t->s->pool, c->n_heads, audit_task, t);
        A->st.audit_s += now_s() - t_end;
    }
    if (A->p.mode != ATTN_STREAMING)
        for (int h = 0; h < c->n_heads; h++) {
            int n_idx = A->idx_end - A->p.sink;
            A->st.scan_sum += n_idx > 0 ? (double)A->scored[h] / n_idx : 0;
            A->st.n_searches++;
            uint64_t *f = &A->st.omega_fnv;
            *f = fnv1a(*f, (const uint8_t *)&A->n_omega[h], sizeof(int));
            *f = fnv1a(*f, (const uint8_t *)(A->omega + (size_t)h * A->p.topk),
                       (size_t)A->n_omega[h] * sizeof(int32_t));
        }
}

/* The step of head h just taken against Eq. (1) over every key 0..pos (--audit, --trace): the
 * recall of Omega against the exact top-k indexed keys (flat_topk's rule), the attention mass of
 * W and of Omega, the relative error of o_t. work: (hd + pos + 1 + k), left with the exact
 * weights a_i (pos + 1) at work + hd, then the exact top-k as positions. */
static ExactCheck exact_check(const StepTask *t, int h, float *work) {
    Attention *A = t->A;
    int hd = A->m->c.head_dim, pos = t->pos, sink = A->p.sink, hit = 0, scanned;
    float scale = 1.0f / sqrtf((float)hd);
    HeadView hv = head_view(t, h);
    float *exact = work, *z = exact + hd;               /* (hd), (pos + 1) */
    int32_t *truth = (int32_t *)(z + pos + 1);          /* (k) */
    const int32_t *f = A->omega + (size_t)h * A->p.topk;
    double mx = -INFINITY, sum = 0, num = 0, den = 0;
    ExactCheck e = {topk_of(A, A->idx_end - sink), 0, 0, 0, 0};
    attn_full(hv.q, hv.K, hv.V, pos + 1, hd, scale, exact);
    for (int i = 0; i <= pos; i++)
        z[i] = dot_row(hv.q, hv.K, i, hd) * scale, mx = z[i] > mx ? z[i] : mx;
    for (int i = 0; i <= pos; i++) sum += exp(z[i] - mx);
    for (int i = 0; i <= pos; i++)
        if (i < sink || i >= A->idx_end) e.mass_w += exp(z[i] - mx) / sum;
    for (int i = 0; i < A->n_omega[h]; i++) e.mass_omega += exp(z[f[i]] - mx) / sum;
    if (e.k > 0) flat_topk(hv.q, hv.K, A->pos_ids + sink, A->idx_end - sink, hd, e.k, truth,
                           &scanned);
    for (int i = 0; i < e.k; i++)
        for (int j = 0; j < A->n_omega[h]; j++)
            if (f[j] == truth[i]) {
                hit++;
                break;
            }
    for (int d = 0; d < hd; d++)
        num += (hv.out[d] - exact[d]) * (hv.out[d] - exact[d]), den += (double)exact[d] * exact[d];
    e.recall = e.k > 0 ? (double)hit / e.k : 1.0;
    e.err = sqrt(num / (den > 0 ? den : 1));
    for (int i = 0; i <= pos; i++) z[i] = (float)(exp(z[i] - mx) / sum);   /* a_i */
    return e;
}

/* --audit: exact_check of every head, summed for the report */
static void audit_task(void *arg, int64_t h0, int64_t h1, int thread) {
    StepTask *t = arg;
    Attention *A = t->A;
    for (int64_t h = h0; h < h1; h++) {
        ExactCheck e = exact_check(t, (int)h, A->work + (size_t)thread * A->work_stride);
        AuditSum *a = &A->st.audit[(size_t)t->layer * A->m->c.n_heads + h];
        a->recall += e.recall, a->mass_w += e.mass_w, a->mass_omega += e.mass_omega;
        a->err += e.err, a->n++;
    }
}

/* -- --trace L:H: one query head's Alg. 1 as the engine runs it -- */

/* 1 when (layer, query head h) is the one --trace follows */
static int traced(const Attention *A, int layer, int h) {
    return A->p.trace && layer == A->p.trace_layer && h == A->p.trace_head;
}

/* the keys line 7 scored, as positions, into tr.scored: the search's marks in s (before its
 * thread's scratch serves another head), or every key of H when it scanned (ix NULL) */
static void trace_scored(Attention *A, const RAIndex *ix, const SearchScratch *s) {
    int n = 0, n_h = A->idx_end - A->p.sink;
    for (int i = 0; i < n_h; i++)
        if (!ix || (i < ix->n && s->mark[i] == s->epoch)) A->tr.scored[n++] = A->p.sink + i;
}

/* lines 4-5 of the traced head: its index's keys before the insertions of a step */
static void trace_insertions(Attention *A, int layer) {
    int h = A->p.trace_head;
    A->tr.n_was = index_ready(A, layer, h) ? A->ra[(size_t)layer * A->m->c.n_heads + h].n : 0;
}

/* line 7 of the traced head in retrieve_task: its seeds, hops and scored keys */
static void trace_search(Attention *A, size_t ih, int n_seeds, const SearchScratch *s) {
    trace_scored(A, &A->ra[ih], s);
    A->tr.st.n_seeds = n_seeds, A->tr.st.hops = s->hops;
}

/* The traced head's step by ra_decode_layer, from what its tasks computed, completed by
 * trace_step as ra_step_head's: lines 4-5 are the keys that entered since its last step. */
static void trace_decoded(Attention *A, const StepTask *t) {
    const Config *c = &A->m->c;
    int h = A->p.trace_head, nh = c->n_heads, hd = c->head_dim, sink = A->p.sink;
    int n_h = A->idx_end - sink, on = A->use_index[h];
    const RAIndex *ix = &A->ra[(size_t)t->layer * nh + h];
    StepTrace *st = &A->tr.st;
    int n_was = on ? A->tr.n_was : 0;
    float z_omega = st->z_omega, s_omega = st->s_omega;
    int hops = st->hops, n_seeds = on ? st->n_seeds : 0;
    Partial w = w_partial(t->w, h, nh, hd);
    *st = (StepTrace){t->pos, A->idx_end, on, n_was, n_h - n_was, 0, 0,
                      sink + t->pos + 1 - A->idx_end, w.zmax, w.sumexp, 0, -1, n_seeds, 0,
                      (int)A->scored[h], n_h, A->n_omega[h], z_omega, s_omega, 0, 0};
    trace_step(st, ix, &A->p, hops, z_omega, s_omega);
    if (!on) trace_scored(A, NULL, NULL);
    trace_emit(A, t);
}

/* the traced head's step beside Eq. (1) (exact_check), to the step hook */
static void trace_emit(Attention *A, const StepTask *t) {
    int h = A->p.trace_head, hd = A->m->c.head_dim;
    float *work = A->work;   /* the first thread's: the step's tasks are done */
    StepRecord r = {t->layer, h, A->p.sink, A->tr.st, exact_check(t, h, work),
                    A->omega + (size_t)h * A->p.topk, (int32_t *)(work + hd + t->pos + 1),
                    A->tr.scored, work + hd};
    if (A->tr.step) A->tr.step(A->tr.arg, &r);
}

void attention_trace(Attention *A,
                     void (*build)(void *arg, int layer, int head, const RAIndex *ix),
                     void (*step)(void *arg, const StepRecord *r), void *arg) {
    A->tr.build = build, A->tr.step = step, A->tr.arg = arg;
}

/* Alg. 1 line 5 a step early, on the pool's workers, while the GPU computes the rest of the
 * layer: the keys that leave W at step pos + 1 are all cached at pos. They enter between the same
 * two searches as in Alg. 1 (insert_wait comes first), so every search sees the same index. */
void attention_insert_ahead(Attention *A, State *s, int layer, int pos) {
    if (!is_decoding_step(A, pos) || A->p.mode != ATTN_RA || layer_sliding(&A->m->c, layer)) return;
    if (pos + 1 >= s->ctx) return;   /* the context ends at pos: nothing leaves W */
    int end = idx_end_at(A, pos + 1);
    if (end > pos + 1) end = pos + 1;   /* window 0: the key at pos + 1 does not exist yet */
    if (A->layer_end[layer] >= end) return;
    insert_wait(A);
    if (traced(A, layer, A->p.trace_head)) trace_insertions(A, layer), A->tr.ahead_pos = pos + 1;
    A->async.ahead = (InsertTask){A, s, layer, end, pos + 1 - A->p.sink};
    A->layer_end[layer] = end;
    A->async.inserting = s->pool;
    pool_start(s->pool, A->m->c.n_heads, insert_task, &A->async.ahead);
}

/* A prompt whose first positions were read, not computed (./ra's --prompt-cache): its layers'
 * indexes as after a computed prefill. ra's indexes, read with them, cover [sink, indexed_to)
 * and take over at once: the keys after them are inserted (Alg. 1 line 5). ivf builds its
 * lists from the keys (the State's layer hook, as each layer ends). */
void attention_resume(Attention *A, State *s, int indexed_to) {
    const Config *c = &A->m->c;
    if (!A->active) return;
    if (A->p.mode != ATTN_RA) {
        for (int l = 0; l < c->n_layers && !(s->stop && s->stop()); l++)
            if (s->layer_done) s->layer_done(s->layer_arg, l, 0, A->n_prompt);
        return;
    }
    double t0 = now_s();
    pthread_mutex_lock(&A->b.mu);
    for (int l = 0; l < c->n_layers; l++) A->b.failed[l] = 0;
    publish(A, c->n_layers);
    pthread_mutex_unlock(&A->b.mu);
    for (int l = 0; l < c->n_layers; l++) {
        A->layer_end[l] = A->idx_end;
        if (layer_sliding(c, l) || indexed_to >= A->idx_end) continue;
        InsertTask j = {A, s, l, A->idx_end, A->n_prompt - A->p.sink};
        pool_for(s->pool, c->n_heads, insert_task, &j);
    }
    double wall = now_s() - t0;
    A->st.build_s += wall, A->st.build_wait_s += wall;
}

int attention_w(const Attention *A, int pos, int *sink, int *idx_end) {
    if (!is_decoding_step(A, pos)) return 0;
    *sink = A->p.sink;
    *idx_end = idx_end_at(A, pos);
    return 1;
}

void attention_w_source(Attention *A, const float *(*wait)(void *arg), void *arg) {
    A->async.wait = wait;
    A->async.arg = arg;
}

long attention_w_external(const Attention *A) { return A ? A->st.n_w_ext : 0; }

/* ============================================================================================
 * Part 3: the ./ra program
 * ============================================================================================ */

/* ---- errors and checked allocation ----------------------------------------------------------- */

/* a partial file to remove when the run ends early (die, out of memory, a second Ctrl-C): the
 * context file's FILE.tmp while it is written. A lock-free atomic: a signal handler and any
 * thread may read it (C11 7.14.1.1). */
static _Atomic(const char *) die_unlink;
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "die_unlink must be a lock-free atomic");

/* 1 while a progress line is open on a terminal (show_progress): an error ends it first */
static atomic_int progress_open;

/* Lets one thread print the run's last error: two workers out of memory at once would print two
 * lines, and the first to come exits the process, so a later one waits for that. Starts the
 * error on a line of its own. */
static void error_begin(void) {
    static atomic_flag claimed = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&claimed))
        for (;;) pause();
    if (atomic_load(&progress_open)) fputc('\n', stderr);
}

/* removes die_unlink's file, if any; async-signal-safe */
static void unlink_partial(void) {
    const char *path = atomic_load(&die_unlink);
    if (path) unlink(path);
}

/* a message as one line of text: control bytes (names from a file may hold newlines or escapes)
 * and bytes of no valid UTF-8 character become '?' */
static void scrub_line(char *msg) {
    size_t n = strlen(msg);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)msg[i];
        size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (c >= 0x80 && len > 1 && i + len <= n && utf8_valid((unsigned char *)msg + i, len))
            i += len - 1;
        else if (c < 0x20 || c >= 0x7f)
            msg[i] = '?';
    }
}

/* One line on stderr, exit status 1. _exit, not exit: nothing is left to clean up, and the
 * leak check of a sanitizer build (run at exit) is for the runs that finish, not for what an
 * error path still holds. */
void die(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    scrub_line(msg);
    error_begin();
    fprintf(stderr, "ra: error: %s\n", msg);
    unlink_partial();
    fflush(stdout);
    _exit(1);
}

/* out of memory, maybe on a worker thread: _exit, as die does, so that no atexit handler or
 * stdio teardown runs while the other threads go on (nor die's flush of stdout, whose lock a
 * thread blocked on a full pipe may hold) */
static void out_of_memory(size_t n, size_t size) {
    error_begin();
    fprintf(stderr, "ra: error: out of memory (%zu x %zu bytes)\n", n, size);
    unlink_partial();
    _exit(1);
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(1, n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) out_of_memory(1, n);
    return p;
}

/* ---- the context file's records (--prompt-cache): checksummed words, an index ---------------- */

/* One open context file, read or written in 4-byte words through a running checksum (FNV-1a's
 * step, a word at a time), so that a record is read by the same code that wrote it. */
typedef struct {
    const char *path;       /* the file named, for messages */
    FILE *f;
    int loading;            /* 1: words are read into the records; 0: written from them */
    uint64_t sum;           /* the checksum of the words so far */
} ContextIO;

/* the checksum of a context file: sum, then the words of x, folded in one at a time */
static uint64_t context_sum(uint64_t sum, const void *x, size_t words) {
    const uint8_t *p = x;
    for (size_t i = 0; i < words; i++) {
        uint32_t w;
        memcpy(&w, p + 4 * i, 4);
        sum = (sum ^ w) * 0x100000001b3ull;
    }
    return sum;
}

static void context_io(ContextIO *io, void *x, size_t words) {
    size_t bytes = words * 4;
    if (io->loading && fread(x, 1, bytes, io->f) != bytes)
        die("--prompt-cache: '%s' is truncated", io->path);
    if (!io->loading && fwrite(x, 1, bytes, io->f) != bytes)
        die("--prompt-cache: write error on '%s': %s", io->path, strerror(errno));
    io->sum = context_sum(io->sum, x, words);
}

/* a word read that must lie in [lo, hi]: else the file is corrupt, and nothing of it is used */
static int32_t context_check(const ContextIO *io, int32_t v, int64_t lo, int64_t hi,
                             const char *what) {
    if (v < lo || v > hi)
        die("--prompt-cache: '%s' is corrupt (%s %d outside [%lld, %lld])", io->path, what, v,
            (long long)lo, (long long)hi);
    return v;
}

enum { INDEX_WORDS = 13 };   /* an index record's head: its sizes and its build's statistics */

/* One RAIndex as a record: its sizes, the entries, the guides, and each node's out-list (deg[i]
 * ids) and in-degree. Read, it must hold n nodes of degree bound M over d-dimensional keys, and
 * gets room for cap; a value out of range ends the run (context_check). Written, n and M are its
 * own. The insertion look-ahead (ahead) is not kept: ra_insert works it out again. */
__attribute__((unused))   /* the tests include this file, and test_index alone reads records */
static void context_index(ContextIO *io, RAIndex *ix, int n, int M, int d, int cap) {
    if (!io->loading) n = ix->n, M = ix->M;
    int32_t h[INDEX_WORDS] = {ix->n, ix->M, ix->entry, ix->n_entry, ix->ef_conn, ix->n_guide,
                              ix->n_query, ix->n_repaired, ix->n_searched, ix->knn_gpu,
                              ix->knn_amx, (int32_t)(ix->conn_scored & 0xffffffff),
                              (int32_t)((uint64_t)ix->conn_scored >> 32)};
    context_io(io, h, INDEX_WORDS);
    if (io->loading) {
        context_check(io, h[0], n, n, "index size");
        context_check(io, h[1], M, M, "degree bound");
        memset(ix, 0, sizeof *ix);
        ix->n = n, ix->M = M;
        ix->entry = context_check(io, h[2], n > 0 ? 0 : -1, n - 1, "entry");
        ix->n_entry = context_check(io, h[3], n > 0, n > 0 ? n : 0, "entry count");
        ix->ef_conn = context_check(io, h[4], 1, INT32_MAX, "beam");
        ix->n_guide = context_check(io, h[5], 0, 1 << 20, "guide count");
        ix->n_query = h[6], ix->n_repaired = h[7], ix->n_searched = h[8];
        ix->knn_gpu = h[9] != 0, ix->knn_amx = h[10] != 0;
        ix->conn_scored = (long)(((uint64_t)(uint32_t)h[12] << 32) | (uint32_t)h[11]);
        grow_ra_index(ix, cap > n ? cap : n > 0 ? n : 1);
        ix->entries = xmalloc(((size_t)ix->n_entry + 1) * sizeof *ix->entries);
        ix->guide = xmalloc(((size_t)ix->n_guide * d + 1) * sizeof *ix->guide);
        ix->guide_thr = xmalloc(((size_t)ix->n_guide + 1) * sizeof *ix->guide_thr);
        ix->guide_top = xmalloc(((size_t)ix->n_guide * GUIDE_TOP + 1) * sizeof *ix->guide_top);
    }
    context_io(io, ix->entries, (size_t)ix->n_entry);
    context_io(io, ix->guide, (size_t)ix->n_guide * d);
    context_io(io, ix->guide_thr, (size_t)ix->n_guide);
    context_io(io, ix->guide_top, (size_t)ix->n_guide * GUIDE_TOP);
    context_io(io, ix->deg, (size_t)n);
    for (int i = 0; io->loading && i < ix->n_entry; i++)
        context_check(io, ix->entries[i], 0, n - 1, "entry point");
    for (size_t i = 0; io->loading && i < (size_t)ix->n_guide * GUIDE_TOP; i++)
        context_check(io, ix->guide_top[i], -1, n - 1, "guide's key");
    for (int i = 0; i < n; i++) {
        int32_t *out = ix->adj + (size_t)i * M;
        if (io->loading) context_check(io, ix->deg[i], 0, M, "out-degree");
        context_io(io, out, (size_t)ix->deg[i]);
        for (int j = 0; io->loading && j < ix->deg[i]; j++)
            if (context_check(io, out[j], 0, n - 1, "neighbour") == i)
                die("--prompt-cache: '%s' is corrupt (a node links to itself)", io->path);
    }
    context_io(io, ix->indeg, (size_t)n);
    for (int i = 0; io->loading && i < n; i++) context_check(io, ix->indeg[i], 0, n, "in-degree");
}

#ifndef TESTING

/* the signal that stopped the run, or 0. Set by the handler (below) and read by every thread: a
 * lock-free atomic is the one kind of object C11 lets both do that with (7.14.1.1, 5.1.2.4). */
static atomic_int interrupted;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the interrupt flag must be a lock-free atomic");

static int stop_requested(void) { return atomic_load(&interrupted) != 0; }

typedef struct {
    const char *model, *prompt, *prompt_file, *stats, *dump_qk, *prompt_cache;
    const char *trace_file;      /* --trace-file: --trace's JSON lines */
    const char *chat_template;   /* --chat-template: a format's name or a Jinja template */
    int n_predict, ctx, threads, batch, chat, ignore_eos;
    int conversation;       /* -cnv: questions from stdin after the document (-f, -p) */
    int ctx_model;          /* -c 0 (llama.cpp's): the model's trained context */
    int batch_set;          /* -b given on the command line, not the default */
    unsigned attn_given;    /* bit i: attn_flags[i] was given (flag_given) */
    int no_gpu;             /* --no-gpu: the CPU path even when a GPU is present */
    int index_wait;         /* --index-wait: ra's first token after every index is built */
    int gpu_mem;            /* --gpu-mem: plan against at most this many MiB of device memory */
    float temp, top_p, min_p;
    int top_k;
    float rope_scale;       /* --rope-scale, 0: the model's own */
    long long seed;
    AttnParams attn;
} Args;

/* NaN or inf logits (corrupt weights, or a model that overflows) have no next token to sample */
static void check_logits(const float *logits, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i]))
            die("the model produced a non-finite logit (token %d: %g): corrupt weights?", i,
                logits[i]);
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: ra -m MODEL.gguf (-p TEXT | -f FILE | -cnv) [options]\n"
        "  -m, --model FILE     GGUF model (llama, qwen2 or gemma3 architecture)\n"
        "  -p, --prompt TEXT    prompt text\n"
        "  -f, --file FILE      read the prompt from a UTF-8 file\n"
        "  -n, --n-predict N    tokens to generate (default 128; -1 until the end of generation or "
        "a\n"
        "                       full context, 0 the prompt alone)\n"
        "  -c, --ctx-size N     context size (default: prompt + n, capped at the trained context;\n"
        "                       0 the trained context)\n"
        "  -t, --threads N      CPU threads (default: the CPUs this process may run on)\n"
        "  -b, --batch-size N   prefill batch (default 256; on the GPU 1024)\n"
        "      --no-gpu         run on the CPU even when a CUDA GPU is present\n"
        "      --gpu-mem MiB    plan the GPU's work within this much device memory (default: all\n"
        "                       that is free); a run that would not fit is refused before it "
        "starts\n"
        "  -ctk, --cache-type-k T   the KV cache's keys: f16 (default) or f32\n"
        "  -ctv, --cache-type-v T   the KV cache's values: f16 (default) or f32; every mode\n"
        "                       reads the same cache\n"
        "      --rope-scale N   RoPE context scaling factor: positions are divided by N, as\n"
        "                       llama.cpp's linear scaling (default: the model's own, 1 for most)\n"
        "      --temp T         temperature, 0 = greedy (default 0.8)\n"
        "      --top-k N        sample from the N most likely tokens, 0 = all (default 40)\n"
        "      --top-p P        then from their nucleus of mass P, 1 = all (default 0.95)\n"
        "      --min-p P        then from those at least P times as likely as the most\n"
        "                       likely, 0 = all (default 0.05); the temperature applies\n"
        "                       to what these keep (llama.cpp's sampler chain)\n"
        "  -s, --seed N         random seed (default, or -1: from the clock)\n"
        "      --chat           wrap the prompt in the model's chat format (llama.cpp's built-in\n"
        "                       templates: chatml, llama2, llama3, mistral-v1, -v3, -v7 and "
        "variants)\n"
        "      --chat-template T   --chat in format T: one of those names, or a Jinja template\n"
        "                       read as llama.cpp reads one (default: the model's)\n"
        "      --ignore-eos     keep generating past end-of-generation tokens\n"
        "  -cnv, --conversation  the prompt (-f, -p) is a document; then questions from stdin,\n"
        "                       one a line, each answered in the chat format over one context\n"
        "                       (-n tokens at most each; /exit or end of input ends; -c: the\n"
        "                       trained context by default)\n"
        "      --attn MODE      full (default): Eq. (1) over every key\n"
        "                       ra: RetrievalAttention, static pattern + attention-aware index\n"
        "                       flat: static pattern + exact top-k by a linear scan\n"
        "                       ivf: static pattern + top-k from k-means inverted lists\n"
        "                       streaming: static pattern only\n"
        "      --sink N         initial tokens in the static pattern (default 128)\n"
        "      --window N       last tokens in the static pattern (default 512)\n"
        "      --topk N         keys retrieved per head and step (default 100)\n"
        "      --ef N           search candidate list, >= topk (default: topk x 32768 / keys\n"
        "                       indexed, at most 3 topk; past 32768 keys topk, 1/16 wider\n"
        "                       per doubling; x 35 / out-degree)\n"
        "      --no-warm        ra: start each search at the entry points only (default:\n"
        "                       also at the keys found last step and the key after each)\n"
        "      --nprobe N       IVF lists probed (default 5%% of the lists)\n"
        "      --nq N, --degree M, --q-stride S   index build: KNN size (100), out-degree (24),\n"
        "                       use every S-th prefill query (0, the default: all of the last\n"
        "                       8192, and every 2nd before them)\n"
        "      --ef-conn N      index build: beam of the searches that link the few keys that\n"
        "                       neither the projection nor their top query links (32; 48 with\n"
        "                       --q-stride > 1)\n"
        "      --entries N      index build: entry points, one per run of positions, that every\n"
        "                       search walks on from once the walk from the entry (and the\n"
        "                       warm start) is done (16; 1: the entry alone, as RoarGraph)\n"
        "      --exact-below N  ra: a prompt that leaves fewer than N keys outside the static\n"
        "                       pattern runs full attention, no index (default 11264; 0: always\n"
        "                       search)\n"
        "      --index-wait     ra: the first token after every index is built, as the paper\n"
        "                       (default: decoding starts when the prefill ends; a head scans\n"
        "                       its keys exactly until its index, built meanwhile, takes over)\n"
        "      --reference      ra: the plain path, slow, for audits: the builds' KNN by plain\n"
        "                       loops, each step by ra_step_head a head at a time (Alg. 1 in\n"
        "                       order); implies --index-wait and --no-gpu\n"
        "      --audit          also compute exact attention each step: recall, mass, error\n"
        "      --trace L:H      ra: one query head's Alg. 1 on stderr: its index's build\n"
        "                       (§3.2 (a)-(d)), then each decoding step line by line, beside\n"
        "                       the exact Eq. (1) (layer L, query head H, from 0)\n"
        "      --trace-file F   with --trace: the same records as JSON lines into F, with each\n"
        "                       step's keys: Omega, the exact top-k, those scored, the weights\n"
        "      --stats FILE     write run statistics as one JSON object\n"
        "      --dump-qk DIR    write the post-RoPE queries (prefill, generated), keys and values "
        "of\n"
        "                       every layer and head to DIR (a sliding layer's queries only): "
        "float32\n"
        "                       files + meta.json (bench-index, bench-sparsity)\n"
        "      --prompt-cache FILE  the context file: read the KV cache, the indexes and the\n"
        "                       logits from FILE when the prompt begins with FILE's (then run\n"
        "                       only the rest); else run the prompt and save them there (ra:\n"
        "                       once its indexes are built; a run that ends first waits)\n"
        "  -h, --help           this text\n");
}

/* strict numbers: the whole argument, no space or garbage around it, no overflow, in range */
static long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    if (!s) die("%s needs a value", flag);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || isspace((unsigned char)*s) || (errno && errno != ERANGE))
        die("%s: '%s' is not an integer", flag, s);
    if (errno == ERANGE) die("%s: %s is out of range [%lld, %lld]", flag, s, lo, hi);
    if (v < lo || v > hi) die("%s: %lld is out of range [%lld, %lld]", flag, v, lo, hi);
    return v;
}

/* a number in [lo, hi] (compared as written, in double); one too small for a double reads as
   the nearest it can hold (then compared), one too large is out of range */
static float parse_float(const char *flag, const char *s, double lo, double hi) {
    if (!s) die("%s needs a value", flag);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || isspace((unsigned char)*s) || v != v || (errno && errno != ERANGE))
        die("%s: '%s' is not a number", flag, s);
    if (errno == ERANGE && fabs(v) > 1) die("%s: %s is out of range [%g, %g]", flag, s, lo, hi);
    if (v < lo || v > hi) die("%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    return (float)v;
}

static int flag_is(const char *f, const char *a, const char *b) {
    return !strcmp(f, a) || (b && !strcmp(f, b));
}

static const char *need_value(const char *flag, const char *v) {
    if (!v) die("%s needs a value", flag);
    return v;
}

static const char *attn_mode_name(int mode) {
    static const char *names[] = {"full", "ra", "flat", "ivf", "streaming"};
    return names[mode];
}

/* the attention options, and the --attn modes that read them (bit m: mode m, ATTN_FULL = 0 ...):
 * one given to a mode that does not read it gets a note (say_unused_flags), not silence */
#define MODE_BIT(m) (1u << (m))
static const struct {
    const char *flag;
    unsigned modes;
} attn_flags[] = {
    {"--sink",
     MODE_BIT(ATTN_RA) | MODE_BIT(ATTN_FLAT) | MODE_BIT(ATTN_IVF) | MODE_BIT(ATTN_STREAMING)},
    {"--window",
     MODE_BIT(ATTN_RA) | MODE_BIT(ATTN_FLAT) | MODE_BIT(ATTN_IVF) | MODE_BIT(ATTN_STREAMING)},
    {"--topk", MODE_BIT(ATTN_RA) | MODE_BIT(ATTN_FLAT) | MODE_BIT(ATTN_IVF)},
    {"--ef", MODE_BIT(ATTN_RA)},
    {"--nq", MODE_BIT(ATTN_RA)},
    {"--degree", MODE_BIT(ATTN_RA)},
    {"--q-stride", MODE_BIT(ATTN_RA)},
    {"--ef-conn", MODE_BIT(ATTN_RA)},
    {"--entries", MODE_BIT(ATTN_RA)},
    {"--no-warm", MODE_BIT(ATTN_RA)},
    {"--exact-below", MODE_BIT(ATTN_RA)},
    {"--index-wait", MODE_BIT(ATTN_RA)},
    {"--reference", MODE_BIT(ATTN_RA)},
    {"--trace", MODE_BIT(ATTN_RA)},
    {"--trace-file", MODE_BIT(ATTN_RA)},
    {"--nprobe", MODE_BIT(ATTN_IVF)},
};
#undef MODE_BIT

/* flag's row of attn_flags, or -1 where it is not an attention option */
static int attn_flag_index(const char *flag) {
    for (size_t i = 0; i < sizeof attn_flags / sizeof *attn_flags; i++)
        if (!strcmp(flag, attn_flags[i].flag)) return (int)i;
    return -1;
}

/* 1 when --attn mode reads option flag */
static int mode_reads(const char *flag, int mode) {
    int i = attn_flag_index(flag);
    return i >= 0 && (attn_flags[i].modes >> mode & 1);
}

/* 1 when attention option flag was given on the command line */
static int flag_given(const Args *a, const char *flag) {
    int i = attn_flag_index(flag);
    return i >= 0 && (a->attn_given >> i & 1);
}

static void attn_flag_given(Args *a, const char *flag) {
    int i = attn_flag_index(flag);
    if (i >= 0) a->attn_given |= 1u << i;
}

/* one line naming the options given that this run's --attn does not read */
static void say_unused_flags(const Args *a) {
    char list[256] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof attn_flags / sizeof *attn_flags; i++)
        if ((a->attn_given >> i & 1) && !(attn_flags[i].modes >> a->attn.mode & 1))
            n++, snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                          list[0] ? ", " : "", attn_flags[i].flag);
    if (n)
        fprintf(stderr, "ra: --attn %s does not use %s: %s\n", attn_mode_name(a->attn.mode), list,
                n == 1 ? "it is ignored" : "they are ignored");
}

/* -ctk/-ctv's value, llama.cpp's names: the bit (CACHE_K_F16 or CACHE_V_F16) for f16, 0 for f32 */
static int parse_cache_type(const char *flag, const char *v, int bit) {
    if (!strcmp(need_value(flag, v), "f16")) return bit;
    if (!strcmp(v, "f32")) return 0;
    die("%s: unsupported cache type '%s' (f16 or f32)", flag, v);
}

enum { RA_EXACT_BELOW = 11264 };   /* --exact-below's default: see attention_active */

/* --trace L:H: a layer and a query head, each a number (checked against the model later) */
static void parse_trace(const char *flag, const char *v, AttnParams *ap) {
    char *end;
    long l = strtol(v, &end, 10), h = -1;
    if (end != v && *end == ':' && isdigit((unsigned char)end[1])) h = strtol(end + 1, &end, 10);
    if (h < 0 || l < 0 || *end || l > 1 << 20 || h > 1 << 20)
        die("%s: '%s' is not LAYER:HEAD (two numbers from 0, as 8:3)", flag, v);
    ap->trace = 1, ap->trace_layer = (int)l, ap->trace_head = (int)h;
}

static Args parse_args(int argc, char **argv) {
    Args a;
    memset(&a, 0, sizeof a);
    a.n_predict = 128;
    a.batch = 256;
    a.temp = 0.8f;
    a.top_p = 0.95f;
    a.top_k = 40, a.min_p = 0.05f;   /* llama.cpp's defaults */
    a.seed = -1;
    a.attn.mode = ATTN_FULL;
    a.attn.sink = 128, a.attn.window = 512, a.attn.topk = 100, a.attn.ef = 0, a.attn.nprobe = 0;
    RAParams rd = ra_default_params();   /* the index build's defaults */
    a.attn.nq_knn = rd.nq_knn, a.attn.max_degree = rd.max_degree, a.attn.q_stride = rd.q_stride;
    a.attn.ef_conn = 0, a.attn.warm = 1;   /* ef_conn 0: ra_default_ef_conn(q_stride) */
    a.attn.exact_below = RA_EXACT_BELOW;
    a.attn.cache_type = CACHE_K_F16 | CACHE_V_F16;   /* llama.cpp's default */
    a.threads = cpu_count();
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        attn_flag_given(&a, f);
        if (flag_is(f, "-h", "--help")) {
            usage(stdout);
            if (fflush(stdout) != 0 || ferror(stdout))
                die("standard output: write error: %s", strerror(errno));
            exit(0);
        }
        else if (flag_is(f, "-m", "--model")) a.model = need_value(f, v), i++;
        else if (flag_is(f, "-p", "--prompt")) a.prompt = need_value(f, v), i++;
        else if (flag_is(f, "-f", "--file")) a.prompt_file = need_value(f, v), i++;
        else if (flag_is(f, "-n",
                         "--n-predict")) { /* llama.cpp's -1: until the end of generation */
            a.n_predict = (int)parse_int(f, v, -1, 1 << 24), i++;
            if (a.n_predict < 0) a.n_predict = 1 << 30;
        } else if (flag_is(f, "-c", "--ctx-size"))
            a.ctx = (int)parse_int(f, v, 0, 1 << 24), a.ctx_model = !a.ctx, i++;
        else if (flag_is(f, "-t", "--threads")) a.threads = (int)parse_int(f, v, 1, 1024), i++;
        else if (flag_is(f, "-b", "--batch-size"))
            a.batch = (int)parse_int(f, v, 1, 1 << 16), a.batch_set = 1, i++;
        else if (flag_is(f, "-ctk", "--cache-type-k"))
            a.attn.cache_type = (a.attn.cache_type & ~CACHE_K_F16) |
                                parse_cache_type(f, v, CACHE_K_F16), i++;
        else if (flag_is(f, "-ctv", "--cache-type-v"))
            a.attn.cache_type = (a.attn.cache_type & ~CACHE_V_F16) |
                                parse_cache_type(f, v, CACHE_V_F16), i++;
        else if (flag_is(f, "--no-gpu", NULL)) a.no_gpu = 1;
        else if (flag_is(f, "--gpu-mem", NULL)) a.gpu_mem = (int)parse_int(f, v, 1, 1 << 30), i++;
        else if (flag_is(f, "--temp", NULL)) a.temp = parse_float(f, v, 0, 100), i++;
        else if (flag_is(f, "--top-p", NULL)) a.top_p = parse_float(f, v, 0, 1), i++;
        else if (flag_is(f, "--top-k", NULL)) a.top_k = (int)parse_int(f, v, 0, 1 << 30), i++;
        else if (flag_is(f, "--min-p", NULL)) a.min_p = parse_float(f, v, 0, 1), i++;
        else if (flag_is(f, "-s", "--seed")) a.seed = parse_int(f, v, -1, (long long)1 << 62), i++;
        else if (flag_is(f, "--chat", NULL)) a.chat = 1;
        else if (flag_is(f, "-cnv", "--conversation")) a.conversation = a.chat = 1;
        else if (flag_is(f, "--chat-template", NULL))
            a.chat_template = need_value(f, v), a.chat = 1, i++;
        else if (flag_is(f, "--ignore-eos", NULL)) a.ignore_eos = 1;
        else if (flag_is(f, "--stats", NULL)) a.stats = need_value(f, v), i++;
        else if (flag_is(f, "--dump-qk", NULL)) a.dump_qk = need_value(f, v), i++;
        else if (flag_is(f, "--prompt-cache", NULL)) a.prompt_cache = need_value(f, v), i++;
        else if (flag_is(f, "--rope-scale", NULL))
            a.rope_scale = parse_float(f, v, 0.001, 1024), i++;
        else if (flag_is(f, "--attn", NULL)) {
            static const char *modes[] = {"full", "ra", "flat", "ivf", "streaming"};
            v = need_value(f, v), i++;
            a.attn.mode = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, modes[k])) a.attn.mode = k;
            if (a.attn.mode < 0)
                die("--attn: unknown mode '%s' (full, ra, flat, ivf, streaming)", v);
        } else if (flag_is(f, "--sink", NULL)) a.attn.sink = (int)parse_int(f, v, 0, 1 << 24), i++;
        else if (flag_is(f, "--window", NULL))
            a.attn.window = (int)parse_int(f, v, 1, 1 << 24), i++;
        else if (flag_is(f, "--topk", NULL)) a.attn.topk = (int)parse_int(f, v, 1, 1 << 20), i++;
        else if (flag_is(f, "--ef", NULL)) a.attn.ef = (int)parse_int(f, v, 1, 1 << 20), i++;
        else if (flag_is(f, "--nprobe", NULL))
            a.attn.nprobe = (int)parse_int(f, v, 1, 1 << 20), i++;
        else if (flag_is(f, "--nq", NULL)) a.attn.nq_knn = (int)parse_int(f, v, 1, 4096), i++;
        else if (flag_is(f, "--degree", NULL))
            a.attn.max_degree = (int)parse_int(f, v, 2, 1024), i++;
        else if (flag_is(f, "--q-stride", NULL))
            a.attn.q_stride = (int)parse_int(f, v, 0, 1 << 20), i++;   /* 0: the default */
        else if (flag_is(f, "--ef-conn", NULL))
            a.attn.ef_conn = (int)parse_int(f, v, 1, 1 << 20), i++;
        else if (flag_is(f, "--entries", NULL))
            a.attn.n_entry = (int)parse_int(f, v, 1, 1 << 20), i++;
        else if (flag_is(f, "--exact-below", NULL))
            a.attn.exact_below = (int)parse_int(f, v, 0, 1 << 30), i++;
        else if (flag_is(f, "--audit", NULL)) a.attn.audit = 1;
        else if (flag_is(f, "--index-wait", NULL)) a.index_wait = 1;
        else if (flag_is(f, "--reference", NULL)) a.attn.reference = 1;
        else if (flag_is(f, "--trace", NULL)) parse_trace(f, need_value(f, v), &a.attn), i++;
        else if (flag_is(f, "--trace-file", NULL)) a.trace_file = need_value(f, v), i++;
        else if (flag_is(f, "--no-warm", NULL)) a.attn.warm = 0;
        else if (f[0] != '-')
            die("unexpected argument '%s': each option takes at most one value (see ra --help)", f);
        else die("unknown option '%s' (see ra --help)", f);
    }
    if (!a.model) die("no model given (-m MODEL.gguf)");
    if (a.attn.mode != ATTN_RA) a.attn.reference = 0;   /* ra's alone (say_unused_flags) */
    if (a.attn.mode != ATTN_RA) a.attn.trace = 0, a.trace_file = NULL;
    if (a.trace_file && !a.attn.trace)
        die("--trace-file writes --trace's records: give --trace L:H");
    if (a.attn.reference) a.index_wait = a.no_gpu = 1;   /* the paper's order, on the CPU */
    if (!a.prompt && !a.prompt_file && !a.conversation)
        die("no prompt given (-p TEXT or -f FILE)");
    if (a.prompt && a.prompt_file) die("give -p or -f, not both");
    return a;
}

/* bytes of a prompt file or a question: past any context (2^24 tokens of 32 bytes), and within
 * what tokenizer_encode takes */
enum { PROMPT_FILE_MAX = 1 << 29 };
_Static_assert(PROMPT_FILE_MAX < (INT_MAX - 8) / 3 - 4096, "tokenizer_encode's bound, less a turn");

static char *read_prompt_file(const char *path, size_t *len) {
    struct stat st;
    if (stat(path, &st) != 0) die("%s: cannot open prompt file: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) die("%s: is a directory, not a prompt file", path);
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open prompt file: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        /* dies with a message when out of memory */
        if (n + 4096 > cap) buf = xrealloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0) break;
        if (memchr(buf + n, 0, r)) /* at once: /dev/zero or a binary file is not read to its end */
            die("%s: prompt file contains a NUL byte (UTF-16 text? save it as UTF-8)", path);
        n += r;
        if (n > PROMPT_FILE_MAX)   /* a pipe or a device may never end */
            die("%s: prompt file is larger than %d MiB, more than any context holds", path,
                PROMPT_FILE_MAX >> 20);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) die("%s: read error", path);
    if (n == 0) die("%s: prompt file is empty", path);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* --chat's format: the one --chat-template names, else the model's template as llama.cpp reads
 * it, else ChatML, Llama 3 or Gemma where the vocabulary has their tokens (chat_detect, model.c).
 * Writes which, and from where, into said, for the summary line. */
static int chat_format(const Model *m, const char *flag, char *said, size_t said_len) {
    static const char *known =
        "ra writes chatml, gemma, llama2, llama3, mistral-v1, mistral-v3, mistral-v7 and their "
        "variants";
    const char *name = NULL, *from = flag ? "--chat-template" : "the model's chat template";
    char what[96];   /* the template, as an error names it */
    int fmt = CHAT_NONE;
    Str s;
    int got = flag ? 1 : gguf_get_str(&m->gguf, "tokenizer.chat_template", &s);
    if (got < 0) die("--chat: the model's metadata 'tokenizer.chat_template' is not a string");
    if (got == 1) {
        char *copy = NULL;   /* the file's template, NUL-terminated (a NUL inside ends it) */
        if (!flag && (copy = malloc(s.len + 1))) memcpy(copy, s.s, s.len), copy[s.len] = 0;
        if (!flag && !copy) die("out of memory");
        name = chat_detect(flag ? flag : copy, &fmt);
        free(copy);
        int quoted = flag && strlen(flag) <= 40;   /* short and printable: repeated on the line */
        for (const char *c = flag; quoted && *c; c++)
            quoted = (unsigned char)*c >= 0x20 && *c != 0x7f;
        if (!flag) snprintf(what, sizeof what, "--chat: the model's chat template");
        else if (quoted) snprintf(what, sizeof what, "--chat-template: '%s'", flag);
        else snprintf(what, sizeof what, "--chat-template: the template given");
        if (!name && quoted)
            die("%s is neither a format ra writes nor a template it can read (%s)", what, known);
        if (!name) die("%s is not one ra can read (%s)", what, known);
        if (fmt == CHAT_NONE && flag && !strcmp(flag, name))
            die("%s is a format of llama.cpp's that ra does not write (%s)", what, known);
        if (fmt == CHAT_NONE)
            die("%s is llama.cpp's '%s' format, which ra does not write (%s)", what, name, known);
    } else if (tokenizer_find(&m->tok, "<|im_start|>") >= 0) {
        fmt = CHAT_CHATML, name = "chatml", from = "the model's vocabulary";
    } else if (tokenizer_find(&m->tok, "<|start_header_id|>") >= 0) {
        fmt = CHAT_LLAMA3, name = "llama3", from = "the model's vocabulary";
    } else if (tokenizer_find(&m->tok, "<start_of_turn>") >= 0) {
        fmt = CHAT_GEMMA, name = "gemma", from = "the model's vocabulary";
    } else {
        die("--chat: the model has no chat template, nor ChatML's, Llama 3's or Gemma's tokens: "
            "name a format with --chat-template");
    }
    snprintf(said, said_len, ", chat format %s from %s", name, from);
    return fmt;
}

/* --chat: the prompt as one user message in the chat format (chat_apply in model.c); with -cnv,
 * the document opening the first user message, which each question then ends (converse) */
static char *apply_chat(const Model *m, const char *prompt, const char *flag, int conversation,
                        int *format, char *said, size_t said_len) {
    const char *pre, *post, *end;
    int fmt = *format = chat_format(m, flag, said, said_len);
    char *out = conversation ? NULL : chat_apply(fmt, prompt);
    if (conversation && !chat_parts(fmt, &pre, &post, &end) &&
        (out = malloc(strlen(pre) + strlen(prompt) + 1)))
        strcat(strcpy(out, pre), prompt);
    if (!out) die("out of memory");
    return out;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static const char *plural(int n) { return n == 1 ? "" : "s"; }   /* "%d token%s" */

/* progress of long work on stderr: shown once it has lasted a second, every half second */
typedef struct {
    double t0, last, frac;
    int shown, total;
    const char *what, *unit;   /* "prefill", "tokens" */
} Progress;

static void show_progress(void *arg, double frac) {
    Progress *p = arg;
    double t = now_s(), el = t - p->t0;
    p->frac = frac;
    int tty = isatty(2);   /* a terminal gets one line rewritten; a log a line every 5 s */
    if (el < 1.0 || (t - p->last < (tty ? 0.5 : 5.0) && frac < 1)) return;
    p->last = t;
    p->shown = tty;   /* a line is open on the terminal */
    fprintf(stderr, "%s%s %d/%d %s, %.1f %s/s, ETA %.0f s%s", tty ? "\r" : "", p->what,
            (int)(frac * p->total + 0.5), p->total, p->unit, frac * p->total / el,
            strcmp(p->unit, "tokens") ? p->unit : "tok", frac > 0 ? el * (1 - frac) / frac : 0,
            tty ? "   " : "\n");
    if (frac >= 1 && tty) fprintf(stderr, "\n"), p->shown = 0;
    atomic_store(&progress_open, p->shown);
}

/* a generated token's text to stdout, at once; a failed write (a full disk, a closed pipe) ends
   the run with an error rather than a text cut short without a word */
static void print_piece(const Model *m, int id) {
    char small[256], *buf = small;
    int n = tokenizer_decode_piece(&m->tok, id, 0, buf, sizeof small);
    if (n > (int)sizeof small) {   /* a token of more bytes: all of them */
        buf = xmalloc((size_t)n);
        n = tokenizer_decode_piece(&m->tok, id, 0, buf, n);
    }
    if ((n > 0 && fwrite(buf, 1, (size_t)n, stdout) != (size_t)n) || fflush(stdout) != 0)
        die("standard output: write error: %s", strerror(errno));
    if (buf != small) free(buf);
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

/* ---- --dump-qk DIR: a real prompt's post-RoPE queries, keys and values ----------------------- */
/* For the index benchmarks of §2.4 (Fig. 2b, 2c) in tests/bench_index* and the sparsity of §2.3
 * (Fig. 2a) in tests/bench_sparsity.py. DIR gets raw little-endian float32 files of hd-float
 * rows (row = position), and meta.json:
 *   q_l<L>_h<H>.f32   (n_prompt, hd)          prefill queries of query head H of layer L
 *   qd_l<L>_h<H>.f32  (n_gen, hd)             generated tokens' queries, row j: n_prompt + j
 *   k_l<L>_kv<G>.f32  (n_prompt + n_gen, hd)  keys of KV head G = H / (n_heads / n_kv)
 *   v_l<L>_kv<G>.f32  (n_prompt + n_gen, hd)  values of KV head G
 * n_gen counts the generated tokens run through the model (-n N gives N - 1). */

typedef struct {
    const char *dir;
    FILE *meta;             /* DIR/meta.json, opened before the prefill, written at the end */
    const Model *m;
    State *s;
    int n_prompt, n_gen, cap;   /* n_gen decoding steps captured, at most cap */
    float *qd;              /* (cap, n_layers, n_heads*hd) the decoding steps' queries */
    void (*next)(void *arg, int layer, int pos0, int n);   /* the hook it wraps (index builds) */
    void *next_arg;
} QKDump;

/* DIR/name, emptied for writing: a link there (symbolic, or a file with another name, which the
 * model or the prompt may be) is refused and left as it is */
static FILE *dump_file(const QKDump *d, const char *name, char *path, size_t cap) {
    struct stat st;
    snprintf(path, cap, "%s/%s", d->dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno == ELOOP)
        die("--dump-qk: '%s' is a symbolic link (left as it is): remove it, or give another "
            "directory", path);
    if (fd < 0) die("--dump-qk: cannot write '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink > 1)
        die("--dump-qk: '%s' is not a file of its own (left as it is): remove it, or give "
            "another directory", path);
    FILE *f = ftruncate(fd, 0) == 0 ? fdopen(fd, "wb") : NULL;
    if (!f) die("--dump-qk: cannot write '%s': %s", path, strerror(errno));
    return f;
}

/* DIR/name <- n rows of x, hd floats each (halves converted) */
static void dump_rows(const QKDump *d, const char *name, Rows x, int n) {
    char path[4200];
    FILE *f = dump_file(d, name, path, sizeof path);
    size_t hd = (size_t)d->m->c.head_dim;
    float buf[HEAD_DIM_MAX];
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        ok = fwrite(row_f32(x, (size_t)i, (int)hd, buf), sizeof(float), hd, f) == hd;
    if (fclose(f) != 0 || !ok) die("--dump-qk: write error on '%s'", path);
}

/* before the model loads, so that a DIR that cannot be written fails at once: DIR is a
 * directory this process may write in, or one it may create (one level). Nothing is made yet:
 * a run refused before its prefill leaves DIR as it was. */
static void dump_open(QKDump *d, const char *dir) {
    const uint16_t one = 1;
    struct stat st;
    char parent[4200];
    if (*(const uint8_t *)&one != 1)
        die("--dump-qk: the files are little-endian and this host is not");
    if (strlen(dir) > 4000) die("--dump-qk: directory name too long");
    if (!dir[0]) die("--dump-qk: the directory name is empty");
    d->dir = dir;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) die("--dump-qk: '%s' is not a directory", dir);
        if (access(dir, W_OK | X_OK) != 0)
            die("--dump-qk: cannot write in '%s': %s", dir, strerror(errno));
        return;
    }
    if (errno != ENOENT) die("--dump-qk: cannot create '%s': %s", dir, strerror(errno));
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;   /* "a/b/" is "a/b", in "a" */
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;                  /* "/b" is in "/" */
    else *slash = 0;
    if (access(parent, W_OK | X_OK) != 0)
        die("--dump-qk: cannot create '%s': %s", dir, strerror(errno));
}

/* before the prefill, after every check that could refuse the run: DIR made, meta.json opened */
static void dump_make(QKDump *d) {
    struct stat st;
    char path[4200];
    if (mkdir(d->dir, 0777) != 0 && errno != EEXIST)
        die("--dump-qk: cannot create '%s': %s", d->dir, strerror(errno));
    if (stat(d->dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--dump-qk: '%s' is not a directory", d->dir);
    d->meta = dump_file(d, "meta.json", path, sizeof path);
}

/* State.layer_done: after the wrapped hook, the prefill queries of the layer go to their files;
 * a decoding step's (n = 1, at pos0 >= n_prompt) are kept */
static void dump_layer_done(void *arg, int layer, int pos0, int n) {
    QKDump *d = arg;
    const Config *c = &d->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd, step = pos0 - d->n_prompt;
    char name[64];
    if (d->next) d->next(d->next_arg, layer, pos0, n);
    if (pos0 == 0)
        for (int h = 0; h < c->n_heads; h++) {
            snprintf(name, sizeof name, "q_l%d_h%d.f32", layer, h);
            dump_rows(d, name, rows_f32(d->s->q_keep + (size_t)h * hd, (size_t)qd), n);
        }
    else if (step >= 0 && step < d->cap) {
        memcpy(d->qd + ((size_t)step * c->n_layers + layer) * qd, d->s->q_keep,
               (size_t)qd * sizeof(float));
        if (layer == c->n_layers - 1) d->n_gen = step + 1;
    }
}

/* after the attention state is attached: keep q_keep for every layer and call, wrap the hook */
static void dump_attach(QKDump *d, const Model *m, State *s, int n_prompt, int n_predict) {
    size_t qd = (size_t)m->c.n_heads * m->c.head_dim;
    d->m = m, d->s = s, d->n_prompt = n_prompt;
    d->cap = n_predict < s->ctx - n_prompt ? n_predict : s->ctx - n_prompt;
    d->qd = malloc((size_t)(d->cap > 0 ? d->cap : 1) * m->c.n_layers * qd * sizeof(float));
    if (!s->q_keep) s->q_keep = malloc((size_t)n_prompt * qd * sizeof(float));
    s->q_keep_n = n_prompt, s->q_keep_row = NULL;   /* every query */
    if (!d->qd || !s->q_keep)
        die("--dump-qk: out of memory for the queries of %d tokens", n_prompt);
    d->next = s->layer_done, d->next_arg = s->layer_arg;
    s->layer_done = dump_layer_done, s->layer_arg = d;
}

/* after decoding: the decoding queries, the keys of every position run, and meta.json */
static void dump_finish(QKDump *d, const AttnParams *ap) {
    const Config *c = &d->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    char name[64];
    for (int l = 0; l < c->n_layers; l++) {
        for (int h = 0; h < c->n_heads; h++) {
            snprintf(name, sizeof name, "qd_l%d_h%d.f32", l, h);
            dump_rows(d, name, rows_f32(d->qd + (size_t)l * qd + (size_t)h * hd,
                                        (size_t)c->n_layers * qd), d->n_gen);
        }
        for (int g = 0; g < c->n_kv_heads && !layer_sliding(c, l); g++) {   /* every position */
            snprintf(name, sizeof name, "k_l%d_kv%d.f32", l, g);
            dump_rows(d, name, cache_rows(d->s, c, 0, l, g), d->n_prompt + d->n_gen);
            snprintf(name, sizeof name, "v_l%d_kv%d.f32", l, g);
            dump_rows(d, name, cache_rows(d->s, c, 1, l, g), d->n_prompt + d->n_gen);
        }
    }
    char global[4096] = "";   /* the layers that keep every position (not sliding) */
    for (int l = 0, k = 0; l < c->n_layers && k < (int)sizeof global - 16; l++)
        if (!layer_sliding(c, l))
            k += snprintf(global + k, sizeof global - k, "%s%d", k ? ", " : "", l);
    FILE *f = d->meta;
    fprintf(f, "{\"model\": ");
    json_string(f, d->m->name);
    fprintf(f,
            ", \"n_layers\": %d, \"n_heads\": %d, \"n_kv\": %d, \"hd\": %d, \"n_prompt\": %d, "
            "\"n_gen\": %d,\n"
            " \"sink\": %d, \"window\": %d, \"dtype\": \"float32, little-endian, row-major; q and "
            "k post-RoPE\",\n"
            " \"gqa\": \"query head h uses KV head h / (n_heads / n_kv)\", \"group\": %d,\n"
            " \"global_layers\": [%s], \"sliding_window\": %d,\n"
            " \"files\": {\"q_prefill\": {\"name\": \"q_l{layer}_h{head}.f32\", \"rows\": "
            "\"n_prompt\", \"row\": \"position\"},\n"
            "           \"q_decode\": {\"name\": \"qd_l{layer}_h{head}.f32\", \"rows\": \"n_gen\", "
            "\"row\": \"position - n_prompt\"},\n"
            "           \"k\": {\"name\": \"k_l{layer}_kv{kv_head}.f32\", "
            "\"layers\": \"global_layers\",\n"
            "                 \"rows\": \"n_prompt + n_gen\", \"row\": \"position\"},\n"
            "           \"v\": {\"name\": \"v_l{layer}_kv{kv_head}.f32\", "
            "\"layers\": \"global_layers\",\n"
            "                 \"rows\": \"n_prompt + n_gen\", \"row\": \"position\"}}}\n",
            c->n_layers, c->n_heads, c->n_kv_heads, hd, d->n_prompt, d->n_gen, ap->sink, ap->window,
            c->n_heads / c->n_kv_heads, global, c->swa_window);
    d->meta = NULL;
    if (fclose(f) != 0) die("--dump-qk: write error on '%s/meta.json'", d->dir);
    fprintf(stderr, "ra: --dump-qk: queries, keys and values of %d + %d tokens written to %s\n",
            d->n_prompt, d->n_gen, d->dir);
}

/* what dump_make and dump_attach hold; meta.json is left empty when dump_finish did not run */
static void free_dump(QKDump *d) {
    if (d->meta) fclose(d->meta);
    free(d->qd);
}

/* ---- --prompt-cache FILE: the context file (KV cache, indexes, last logits) ------------------ */
/* llama.cpp's flag. The paper assumes the prefill is done ahead of the questions (context caching,
 * §3). FILE holds what decoding needs after a prompt: the KV cache, ra's indexes and the last
 * logits. A prompt that begins with FILE's tokens reads them and runs only the rest, whose keys
 * then enter the indexes as decoding inserts them (Alg. 1 line 5); FILE stays as it is. Else the
 * prompt runs and FILE is written (FILE.tmp, then renamed). Layout, in 4-byte words:
 *   "RAPC", version, n_layers, n_heads, n_kv_heads, head_dim, vocab, dim, cache type (CACHE_*),
 *   n (tokens), ring (the rows a sliding layer keeps), u64 model bytes, u64 model hash,
 *   indexes (0: none, 1: ra's), sink, window, nq, degree, q_stride, ef_conn, entries, tokens[n];
 *   then per layer, k of each KV head, then v of each (in the cache's types), for positions
 *   n - rows .. n - 1 (rows: n, or a sliding layer's ring); with indexes, a record per global
 *   layer and query head (context_index); logits[vocab]; then the u64 checksum of all before. */

enum { CONTEXT_VERSION = 4, CONTEXT_SHAPE = 10, CONTEXT_ATTN = 8 };

typedef struct {
    ContextIO io;
    char tmp[4200];         /* (4200) FILE.tmp while writing */
    int n;                  /* tokens FILE holds */
    int ring;               /* rows FILE holds of a sliding layer: its last positions */
    int indexed;            /* 1: FILE holds ra's indexes, of the keys [sink, n - window) */
    int sink, window, degree; /* ... and the settings they were built with */
    int use_indexes;        /* 1: the run takes FILE's indexes (ra, built with its settings) */
    int replay;             /* 1: ra without them: the builds run the prompt again */
    int reuse;              /* positions read from FILE (0: none, and FILE is written) */
    int rewrite;            /* 1: FILE holds this very prompt, and is written again with the
                               indexes this run builds */
    /* what the builds' save reads once decoding has begun (context_keep) */
    uint8_t **ring_copy;    /* (2, n_layers) each sliding layer's k, v as the prefill left them,
                               (n_kv_heads, kv_cap, hd) in the cache's types; NULL elsewhere */
    float *logits;          /* (vocab) the prompt's last logits */
    const Model *m;
    State *s;
    Attention *A;
    const int32_t *tokens;
    int saved;              /* 1 once FILE is written */
} Context;

/* what identifies the model: its file size and a hash of its first and last MiB (the header
 * and metadata, and the last tensor's bytes), of the first 4 KiB of every tensor (a model of the
 * same shape and size, a fine-tune, differs there; 4 KiB a tensor is little to read), and its
 * RoPE scale when not 1 (--rope-scale changes every query and key) */
static void model_fingerprint(const Model *m, uint64_t fp[2]) {
    const GGUF *g = &m->gguf;
    size_t n = g->size, mib = (size_t)1 << 20, a = n < mib ? n : mib;
    fp[0] = n;
    fp[1] = fnv1a(fnv1a(0xcbf29ce484222325ull, g->map, a), g->map + n - a, a);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const GGUFTensor *t = &g->tensors[i];
        fp[1] = fnv1a(fp[1], t->data, t->nbytes < 4096 ? (size_t)t->nbytes : 4096);
    }
    if (m->c.rope_scale != 1.0f)
        fp[1] = fnv1a(fp[1], (const uint8_t *)&m->c.rope_scale, sizeof m->c.rope_scale);
}

/* the rows of a sliding layer a context of n tokens keeps (its ring's, at most n); 0: none */
static int context_ring(const State *s, const Config *c, int n) {
    for (int l = 0; l < c->n_layers; l++)
        if (layer_sliding(c, l)) return s->kv_cap[l] < n ? s->kv_cap[l] : n;
    return 0;
}

/* the header's words: the model's shape, the cache type, the tokens and ring; the model's
 * fingerprint; the indexes held and the settings they were built with (zeros for none) */
static void context_header(const Model *m, const AttnParams *ap, int indexed, int n, int ring,
                           uint32_t shape[CONTEXT_SHAPE], uint64_t fp[2],
                           int32_t attn[CONTEXT_ATTN]) {
    const Config *c = &m->c;
    uint32_t w[CONTEXT_SHAPE] = {CONTEXT_VERSION, c->n_layers, c->n_heads, c->n_kv_heads,
                                 c->head_dim, c->vocab_size, c->dim, (uint32_t)ap->cache_type, n,
                                 ring};
    memcpy(shape, w, sizeof w);
    model_fingerprint(m, fp);
    int32_t a[CONTEXT_ATTN] = {1, ap->sink, ap->window, ap->nq_knn, ap->max_degree, ap->q_stride,
                               ap->ef_conn, ap->n_entry};
    for (int i = 0; i < CONTEXT_ATTN; i++) attn[i] = indexed ? a[i] : 0;
}

/* the checksum's start: the header's words and the n tokens, as the file holds them */
static uint64_t context_head_sum(const uint32_t shape[CONTEXT_SHAPE], const uint64_t fp[2],
                                 const int32_t attn[CONTEXT_ATTN], const int32_t *tokens, int n) {
    uint64_t sum = context_sum(0xcbf29ce484222325ull, "RAPC", 1);
    sum = context_sum(sum, shape, CONTEXT_SHAPE);
    sum = context_sum(sum, fp, 4);
    sum = context_sum(sum, attn, CONTEXT_ATTN);
    return context_sum(sum, tokens, (size_t)n);
}

/* 1 when the run at n_prompt tokens searches ra's indexes (which only a context file that holds
 * them, built with the same settings, can give it) */
static int run_indexed(const AttnParams *ap, int n_prompt) {
    return ap->mode == ATTN_RA && attention_active(ap, n_prompt);
}

/* 1 when the regular file at path begins with a context file's magic */
static int has_context_magic(const char *path) {
    char magic[4];
    FILE *f = fopen(path, "rb");
    int ok = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "RAPC", 4);
    if (f) fclose(f);
    return ok;
}

/* Before a run that will write FILE: FILE.tmp can be created (tried, then removed), or is ra's
 * leftover (empty, or a context file's start), or a pipe someone reads. A link, a file of other
 * contents (which would be lost) or a pipe no one reads (a wait for ever) is refused. */
static void check_tmp(const char *tmp, const char *path) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666), err = errno;
    struct stat st;
    if (fd >= 0) {
        close(fd), unlink(tmp);
        return;
    }
    if (err == EEXIST && lstat(tmp, &st) == 0) {
        if (S_ISDIR(st.st_mode)) err = EISDIR;
        else if (S_ISFIFO(st.st_mode) && (fd = open(tmp, O_WRONLY | O_NONBLOCK)) < 0)
            die("--prompt-cache: '%s', where '%s' is written first, is a pipe with no reader: it "
                "would wait for one for ever", tmp, path);
        else if (S_ISFIFO(st.st_mode)) close(fd);   /* a pipe someone reads: its choice */
        else if (!S_ISREG(st.st_mode) || st.st_nlink > 1 ||
                 (st.st_size > 0 && !has_context_magic(tmp)))   /* a link, another's file */
            die("--prompt-cache: '%s', where '%s' is written first, is there and is not a "
                "leftover of ra (left as it is): remove it, or give another FILE", tmp, path);
        return;   /* ra's leftover, or a read pipe */
    }
    die("--prompt-cache: cannot write '%s' (written first, then renamed to '%s'): %s", tmp, path,
        strerror(err));
}

static void context_refused(Context *cx, const char *why) {
    fclose(cx->io.f);
    cx->io.f = NULL;
    check_tmp(cx->tmp, cx->io.path);
    fprintf(stderr, "ra: --prompt-cache: '%s' %s: running the whole prompt and replacing it\n",
            cx->io.path, why);
}

/* Before the prefill: how many prompt positions FILE gives (cx->reuse), all or a shared prefix
 * that passes FILE's indexes and leaves a token to run (REFERENCE.md: reuse only past the indexes);
 * 0 for a FILE absent or of another setting (said). A file not ra's is an error, never replaced. */
static void context_probe(Context *cx, const char *path, const Model *m, const AttnParams *ap,
                          const int32_t *tokens, int n_prompt, int gpu) {
    uint32_t want[CONTEXT_SHAPE], got[CONTEXT_SHAPE];
    uint64_t fpw[2], fpg[2];
    int32_t aw[CONTEXT_ATTN], ag[CONTEXT_ATTN];
    char magic[4];
    struct stat st;
    memset(cx, 0, sizeof *cx);
    cx->io.path = path;
    if (strlen(path) > 4000) die("--prompt-cache: file name too long");
    if (!path[0]) die("--prompt-cache: the file name is empty");
    snprintf(cx->tmp, sizeof cx->tmp, "%s.tmp", path);
    if (stat(path, &st) != 0) {
        if (errno != ENOENT) die("--prompt-cache: cannot open '%s': %s", path, strerror(errno));
        check_tmp(cx->tmp, path);   /* the run will write FILE */
        return;
    }
    if (!S_ISREG(st.st_mode)) die("--prompt-cache: '%s' is not a regular file", path);
    if (!(cx->io.f = fopen(path, "rb")))
        die("--prompt-cache: cannot open '%s': %s", path, strerror(errno));
    if (fread(magic, 1, 4, cx->io.f) != 4 || memcmp(magic, "RAPC", 4))
        die("--prompt-cache: '%s' is not a context file of ra (left as it is)", path);
    if (fread(got, sizeof got, 1, cx->io.f) != 1 || fread(fpg, sizeof fpg, 1, cx->io.f) != 1 ||
        fread(ag, sizeof ag, 1, cx->io.f) != 1)
        die("--prompt-cache: '%s' is truncated", path);
    int indexed = run_indexed(ap, n_prompt);
    context_header(m, ap, indexed, 0, 0, want, fpw, aw);
    if (memcmp(got, want, 7 * sizeof *got) || memcmp(fpg, fpw, sizeof fpg))
        return context_refused(cx, got[0] != CONTEXT_VERSION
                                       ? "was written by another version of ra"
                                       : "holds the context of another model or RoPE scale");
    if (got[7] != want[7]) {
        char why[96];
        snprintf(why, sizeof why, "holds a cache of other types (-ctk %s -ctv %s)",
                 got[7] & CACHE_K_F16 ? "f16" : "f32", got[7] & CACHE_V_F16 ? "f16" : "f32");
        return context_refused(cx, why);
    }
    cx->n = (int)got[8], cx->ring = (int)got[9], cx->indexed = ag[0] == 1;
    cx->sink = ag[1], cx->window = ag[2], cx->degree = ag[4];
    if (got[8] < 1 || got[8] > 1u << 24 || got[9] > got[8] || ag[0] < 0 || ag[0] > 1 ||
        (cx->indexed && (cx->window < 1 || cx->sink < 0 || cx->sink + cx->window >= cx->n ||
                         cx->degree < 1 || cx->degree > 1024)))   /* --degree's range */
        die("--prompt-cache: '%s' is corrupt (its header)", path);
    cx->use_indexes = indexed && !memcmp(ag, aw, sizeof ag);
    if (indexed && !cx->use_indexes && gpu)   /* the device runs the prompt for its queries */
        return context_refused(cx, cx->indexed ? "holds indexes built with other settings"
                                               : "holds no indexes (saved by another --attn, "
                                                 "or from a prompt too short for them)");
    int32_t *held = xmalloc((size_t)cx->n * sizeof *held);   /* (n) FILE's tokens */
    if (fread(held, sizeof *held, (size_t)cx->n, cx->io.f) != (size_t)cx->n)
        die("--prompt-cache: '%s' is truncated", path);
    int same = 0;   /* the tokens FILE and the prompt share from the start */
    while (same < cx->n && same < n_prompt && held[same] == tokens[same]) same++;
    uint64_t head_sum = context_head_sum(got, fpg, ag, held, cx->n);
    free(held);
    int r = same < n_prompt - 1 ? same : n_prompt - 1;   /* a token left to run, for the logits */
    if (same == cx->n && cx->n == n_prompt) r = n_prompt;   /* or FILE's logits are the prompt's */
    int need = cx->use_indexes ? cx->n - cx->window : 1;   /* the positions they cover */
    if (cx->ring < cx->n && m->c.swa_window > 0 && r + 1 - m->c.swa_window < cx->n - cx->ring)
        need = cx->n + 1;   /* the ring no longer holds the window r's query sees */
    char why[160];
    snprintf(why, sizeof why, "holds a prompt of %d tokens that differs from this one at token %d",
             cx->n, same);
    if (cx->use_indexes && n_prompt < cx->n && r >= need)   /* they reach into this one's W */
        snprintf(why, sizeof why, "holds a longer prompt (%d tokens), whose indexes reach into "
                 "this one's window", cx->n);
    if (r < need || (cx->use_indexes && n_prompt < cx->n)) return context_refused(cx, why);
    cx->reuse = r;
    cx->replay = indexed && !cx->use_indexes;
    cx->rewrite = cx->replay && r == n_prompt;
    cx->io.loading = 1;
    cx->io.sum = head_sum;
}

/* a layer's keys and values of positions [n - rows, n) (rows: n, or a sliding layer's ring): read
 * into its cache those before cx->reuse (position p at row p % kv_cap, the later ones last),
 * written from it all */
static void context_layer(Context *cx, State *s, const Config *c, int layer, int n) {
    int hd = c->head_dim, rows = layer_sliding(c, layer) ? cx->ring : n;
    float *skip = xmalloc((size_t)hd * sizeof *skip);
    for (int kv = 0; kv < 2; kv++) {
        size_t row = (size_t)hd * cache_elem(s, kv), words = row / 4;   /* a row's bytes, words */
        for (int g = 0; g < c->n_kv_heads; g++) {
            char *base = (char *)(kv ? s->v : s->k) + kv_offset(s, c, layer, g) * cache_elem(s, kv);
            if (cx->ring_copy && cx->ring_copy[kv * c->n_layers + layer])   /* context_keep's */
                base = (char *)cx->ring_copy[kv * c->n_layers + layer] +
                       (size_t)g * kv_ring(s, layer) * row;
            int p = n - rows;
            if (!layer_sliding(c, layer)) {   /* rows 0 .. n-1 in order: those kept, at once */
                p = cx->io.loading && cx->reuse < n ? cx->reuse : n;
                context_io(&cx->io, base, (size_t)p * words);
            }
            for (; p < n; p++) {
                int keep = !cx->io.loading || p < cx->reuse;
                char *at = base + (size_t)(p % s->kv_cap[layer]) * row;
                context_io(&cx->io, keep ? (void *)at : skip, words);
            }
        }
    }
    free(skip);
}

/* the indexes of every global layer, one record per query head (context_index): read into A
 * when the run searches them (A->ra; they cover [sink, n - window)), else read past */
static void context_indexes(Context *cx, Attention *A, const State *s, int use) {
    const Config *c = &A->m->c;
    int n_idx = cx->n - cx->window - cx->sink, cap = s->ctx - A->p.window - A->p.sink;
    for (int l = 0; l < c->n_layers; l++) {
        if (layer_sliding(c, l)) continue;
        for (int h = 0; h < c->n_heads; h++) {
            RAIndex spare, *ix = use ? &A->ra[(size_t)l * c->n_heads + h] : &spare;
            context_index(&cx->io, ix, n_idx, cx->degree, c->head_dim, use ? cap : 0);
            if (use) A->n_query = ix->n_query, A->st.n_repaired += ix->n_repaired;
            if (use) A->st.n_indexed += ix->n;
            else free_ra_index(&spare);
        }
    }
}

/* The positions FILE gives (cx->reuse), layer by layer, then its indexes, its logits and the
 * checksum, compared before anything is used: s->n = cx->reuse. ra's indexes then cover
 * [sink, n - window) (attention_resume takes them on). Returns the logits when FILE held the
 * whole prompt, else NULL (then the rest of the prompt runs); NULL too when Ctrl-C stopped it. */
static float *context_load(Context *cx, State *s, Attention *A) {
    const Config *c = &A->m->c;
    for (int l = 0; l < c->n_layers; l++) {
        context_layer(cx, s, c, l, cx->n);
        if (s->progress) s->progress(s->progress_arg, (double)(l + 1) / c->n_layers);
        if (s->stop && s->stop()) {
            fclose(cx->io.f);
            cx->io.f = NULL;
            return NULL;
        }
    }
    if (cx->indexed) context_indexes(cx, A, s, cx->use_indexes);
    float *logits = xmalloc((size_t)c->vocab_size * sizeof *logits);
    uint64_t sum;
    context_io(&cx->io, logits, (size_t)c->vocab_size);
    uint64_t want = cx->io.sum;
    if (fread(&sum, sizeof sum, 1, cx->io.f) != 1)
        die("--prompt-cache: '%s' is truncated", cx->io.path);
    if (sum != want || fgetc(cx->io.f) != EOF)
        die("--prompt-cache: '%s' is corrupt (checksum mismatch)", cx->io.path);
    fclose(cx->io.f);
    cx->io.f = NULL;
    s->n = cx->reuse;
    if (cx->reuse == A->n_prompt) memcpy(s->logits, logits, (size_t)c->vocab_size * sizeof *logits);
    free(logits);
    return cx->reuse == A->n_prompt ? s->logits : NULL;
}

/* A prefill run from its start, or over a file without this run's indexes: FILE.tmp gets the
 * header, every layer's keys and values, ra's indexes when the run built them all (whole), the
 * logits and the checksum, then becomes FILE. The builds' save runs it while decoding goes on:
 * the sliding layers' rings and the logits are then read from context_keep's copies. Ctrl-C
 * stops it, FILE.tmp removed and FILE as it was. Returns 1 once saved. */
static int context_save(Context *cx, int whole) {
    uint32_t shape[CONTEXT_SHAPE];
    uint64_t fp[2];
    int32_t attn[CONTEXT_ATTN];
    const Model *m = cx->m;
    const Config *c = &m->c;
    State *s = cx->s;
    Attention *A = cx->A;
    int n = A->n_prompt;
    cx->n = n, cx->ring = context_ring(s, c, n);
    cx->indexed = whole && run_indexed(&A->p, n);
    cx->window = A->p.window;
    context_header(m, &A->p, cx->indexed, n, cx->ring, shape, fp, attn);
    check_tmp(cx->tmp, cx->io.path);   /* again: the prefill took a while */
    /* O_NONBLOCK: a pipe whose reader left is an error, not a wait; writes then block again */
    int fd = open(cx->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                  0666);
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (fd < 0 || !(cx->io.f = fdopen(fd, "wb")))
        die("--prompt-cache: cannot write '%s' (written first, then renamed to '%s'): %s",
            cx->tmp, cx->io.path, strerror(errno));
    die_unlink = cx->tmp;
    const char *path = cx->io.path;
    cx->io.path = cx->tmp, cx->io.loading = 0;
    if (fwrite("RAPC", 1, 4, cx->io.f) != 4 || fwrite(shape, sizeof shape, 1, cx->io.f) != 1 ||
        fwrite(fp, sizeof fp, 1, cx->io.f) != 1 || fwrite(attn, sizeof attn, 1, cx->io.f) != 1 ||
        fwrite(cx->tokens, sizeof *cx->tokens, (size_t)n, cx->io.f) != (size_t)n)
        die("--prompt-cache: write error on '%s': %s", cx->tmp, strerror(errno));
    cx->io.sum = context_head_sum(shape, fp, attn, cx->tokens, n);
    int stopped = 0;
    for (int l = 0; l < c->n_layers && !(stopped = stop_requested()); l++)
        context_layer(cx, s, c, l, n);
    for (int l = 0; cx->indexed && !stopped && l < c->n_layers; l++)
        for (int h = 0; h < c->n_heads && !layer_sliding(c, l); h++)
            context_index(&cx->io, &A->ra[(size_t)l * c->n_heads + h], 0, 0, c->head_dim, 0);
    if (!stopped) context_io(&cx->io, cx->logits, (size_t)c->vocab_size);
    if (!stopped && fwrite(&cx->io.sum, sizeof cx->io.sum, 1, cx->io.f) != 1)
        die("--prompt-cache: write error on '%s'", cx->tmp);
    if (fclose(cx->io.f) != 0 && !stopped) die("--prompt-cache: write error on '%s'", cx->tmp);
    cx->io.f = NULL, cx->io.path = path;
    if (stopped) {   /* Ctrl-C: nothing half written is left, FILE is as it was */
        unlink(cx->tmp);
        die_unlink = NULL;
        return 0;
    }
    if (rename(cx->tmp, path) != 0)
        die("--prompt-cache: cannot rename '%s' to '%s': %s", cx->tmp, path, strerror(errno));
    die_unlink = NULL;
    fprintf(stderr, "ra: --prompt-cache: %d token%s saved to %s (KV cache%s)\n", n, plural(n),
            path, cx->indexed ? " and indexes" : "");
    return cx->saved = 1;
}

/* What the builds' save reads after decoding has begun changing the state: the prompt's last
 * logits, and each sliding layer's ring (decoding writes over its rows; a global layer's rows of
 * the prompt stay as they are) */
static void context_keep(Context *cx, const float *logits) {
    const Config *c = &cx->m->c;
    State *s = cx->s;
    cx->logits = xmalloc((size_t)c->vocab_size * sizeof *cx->logits);
    memcpy(cx->logits, logits, (size_t)c->vocab_size * sizeof *cx->logits);
    cx->ring_copy = xcalloc((size_t)2 * c->n_layers, sizeof *cx->ring_copy);
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < c->n_layers; l++) {
            if (!layer_sliding(c, l)) continue;
            size_t bytes = (size_t)c->n_kv_heads * kv_ring(s, l) * c->head_dim * cache_elem(s, kv);
            uint8_t *copy = xmalloc(bytes);
            memcpy(copy, (char *)(kv ? s->v : s->k) + kv_offset(s, c, l, 0) * cache_elem(s, kv),
                   bytes);
            cx->ring_copy[kv * c->n_layers + l] = copy;
        }
}

/* the builds' save (attention_prefill_done), on their thread */
static void context_save_built(void *arg, int whole) { context_save(arg, whole); }

static void free_context(Context *cx) {
    for (int i = 0; cx->ring_copy && i < 2 * cx->m->c.n_layers; i++) free(cx->ring_copy[i]);
    free(cx->ring_copy), free(cx->logits);
    cx->ring_copy = NULL, cx->logits = NULL;
}

/* ---- Memory preflight: refuse work that would not fit, before starting it -------------------- */

/* a number from a /proc or /sys file (the first integer after `key`, times `unit`); -1 if absent */
static double read_number(const char *path, const char *key, double unit) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    while (fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, strlen(key))) continue;
        char *p = line + (key ? strlen(key) : 0), *end;
        double x = strtod(p, &end);
        if (end != p) v = x * unit;
        break;   /* "max" (no cgroup limit) parses as nothing: -1 */
    }
    fclose(f);
    return v;
}

/* Bytes this process can still take: the kernel's MemAvailable, lowered by a cgroup (v2 or v1)
 * memory limit when one is set (containers, CI). -1 when neither can be read. */
static double mem_available(void) {
    double avail = read_number("/proc/meminfo", "MemAvailable:", 1024.0);
    double lim = read_number("/sys/fs/cgroup/memory.max", NULL, 1),
           used = read_number("/sys/fs/cgroup/memory.current", NULL, 1);
    if (lim < 0) {
        lim = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", NULL, 1);
        used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", NULL, 1);
    }
    if (lim > 0 && used >= 0 && lim < 1e18 && (avail < 0 || lim - used < avail))
        avail = lim - used > 0 ? lim - used : 0;
    return avail;
}

/* Bytes this process may still map under its limits: RLIMIT_AS (ulimit -v) less what is mapped
 * (VmSize), and RLIMIT_DATA (ulimit -d) less its data (VmData: since Linux 4.7 also malloc's
 * own mappings); *which names the one that binds. -1 when neither limit is set. */
static double address_space_left(const char **which) {
    struct rlimit rl;
    double left = 0;
    int limited = 0;
    if (!getrlimit(RLIMIT_AS, &rl) && rl.rlim_cur != RLIM_INFINITY) {
        double mapped = read_number("/proc/self/status", "VmSize:", 1024.0);
        if (mapped >= 0) left = (double)rl.rlim_cur - mapped, *which = "ulimit -v", limited = 1;
    }
    if (!getrlimit(RLIMIT_DATA, &rl) && rl.rlim_cur != RLIM_INFINITY) {
        double data = read_number("/proc/self/status", "VmData:", 1024.0);
        if (data >= 0 && (!limited || (double)rl.rlim_cur - data < left))
            left = (double)rl.rlim_cur - data, *which = "ulimit -d", limited = 1;
    }
    if (!limited) return -1;
    return left > 0 ? left : 0;
}

/* Host memory of the run: the weights (on the GPU their embeddings alone: the rest is dropped
 * after the upload), the KV cache and buffers, the kept queries, the indexes and their builds.
 * ra's layers may hand their queries to the builds ahead of them (held_layers): as many as fit,
 * all of them where they do, at least one. A run that would not fit stops here with the numbers.
 * Returns the bytes (mem_plan_mb). */
static double preflight_memory(const Model *m, Args *a, int ctx, int n_prompt, int nthreads,
                               int gpu, const Context *cx) {
    const Config *c = &m->c;
    AttnParams *ap = &a->attn;
    double kv, idx, state = state_bytes(c, ctx, a->batch, ap->cache_type, nthreads);
    double weights = gpu ? (double)m->tok_embd.rows * m->tok_embd.row_bytes : (double)m->gguf.size;
    attention_memory(c, ap, ctx, a->batch, &kv, &idx);
    int active = attention_active(ap, n_prompt);
    if (!active) idx = 0;
    /* q_keep, one layer: the build's sample (--dump-qk: every query), with the map of the rows
     * kept; a prompt read from a context file runs no layer of it from the start */
    int ra = active && ap->mode == ATTN_RA, built = ra && !cx->use_indexes;
    double m_sample = ra ? ra_query_sample(n_prompt, ap->q_stride, NULL) : 0;
    double rows = a->dump_qk ? n_prompt : cx->reuse ? 0 : m_sample;
    double layer_q = m_sample * c->n_heads * c->head_dim * sizeof(float);   /* a layer's sample */
    double qkeep = rows * c->n_heads * c->head_dim * sizeof(float) +
                   (ra && !a->dump_qk ? (double)n_prompt * sizeof(int32_t) : 0);
    /* the decoding queries dumped */
    int n_gen = a->n_predict < ctx - n_prompt ? a->n_predict : ctx - n_prompt;
    if (a->dump_qk) qkeep += (double)n_gen * c->n_layers * c->n_heads * c->head_dim * sizeof(float);
    double attn_work =
        (double)nthreads * ((double)ctx * 3 + 2 * c->head_dim + ap->topk + 16) * sizeof(float);
    double build = 0; /* a layer's index builds, one head per thread at a time (build_layer) */
    if (built) {
        RAParams rp = head_build_params(ap);
        int side = nthreads < c->n_heads ? nthreads : c->n_heads;
        build = side * ra_build_bytes(n_prompt, n_prompt - ap->sink - ap->window, c->head_dim, &rp);
        if (cx->replay)   /* the prompt run again on the builds' own state */
            build += state_bytes(c, n_prompt, a->batch, ap->cache_type, nthreads) + layer_q +
                     (double)n_prompt * sizeof(int32_t);
    }
    if (active && (built || ap->mode == ATTN_IVF) && (ap->cache_type & CACHE_K_F16))
        build += (double)c->n_kv_heads * n_prompt * c->head_dim * sizeof(float);   /* k_f32 */
    double base = weights + state + qkeep + attn_work + build, avail = mem_available();
    const char *limit = "";
    double left = address_space_left(&limit);   /* the weights are mapped already */
    double room = avail;   /* for the samples: what memory and the address space leave */
    if (left >= 0 && (room < 0 || weights + left < room)) room = weights + left;
    /* the samples handed over: a layer's is freed as its index is built, so with every layer's
     * held at once the two peak apart, a layer's sample beside the rest's indexes at most */
    int n_global = global_layers(c), held = built && !cx->replay ? n_global : built;
    double q_all = n_global * layer_q, need = base + (q_all > idx ? q_all : idx) + layer_q;
    if (held < n_global || (room >= 0 && need > room)) {
        if (held > 1 && room >= 0)
            held = room - base - idx > layer_q ? (int)((room - base - idx) / layer_q) : 1;
        if (held > n_global) held = n_global;
        need = base + idx + held * layer_q;
    }
    ap->held_layers = held;
    double more = need - weights;
    qkeep = need - base - idx + qkeep;   /* the kept queries, the samples handed over with them */
    char threads[64] = "";   /* the threads' stacks and heaps are mapped already */
    if (nthreads > 1) snprintf(threads, sizeof threads, " or -t (%d threads),", nthreads);
    if (left >= 0 && more > left)
        die("not enough address space: a context of %d tokens needs about %.2f GB more than is "
            "mapped, but this process's limit (%s) leaves %.2f GB; lower -c%s or raise the limit",
            ctx, more / 1e9, limit, left / 1e9, threads);
    if (avail >= 0 && need > avail)
        die("not enough memory: a context of %d tokens needs about %.2f GB (weights %.2f, KV cache "
            "%.2f, "
            "buffers %.2f, kept queries %.2f, indexes %.2f, index build %.2f) but %.2f GB is "
            "available%s; lower -c%s",
            ctx, need / 1e9, weights / 1e9, kv / 1e9, (state - kv + attn_work) / 1e9, qkeep / 1e9,
            idx / 1e9, build / 1e9, avail / 1e9,
            gpu ? " (the weights: their embeddings, the rest is on the GPU)" : "",
            active && ap->mode == ATTN_RA ? " or --degree" : "");
    return need;
}

/* ---- The GPU: found once, its memory planned before any work --------------------------------- */

/* 1 when the run goes to the GPU, with which one (or why none: no device, or no CUDA in the
 * build) in msg (ERR_LEN) for say_gpu; "" with --no-gpu */
static int find_gpu(const Args *a, char *msg) {
    msg[0] = 0;
    return !a->no_gpu && ra_cuda_init(msg, ERR_LEN);
}

/* what find_gpu found, said once (after the host's memory preflight, so that a refusal is the
 * only line) */
static void say_gpu(const Args *a, int gpu, const char *msg) {
    if (gpu) fprintf(stderr, "ra: GPU: %s\n", msg);
    else if (!a->no_gpu) fprintf(stderr, "ra: no GPU (%s): running on the CPU\n", msg);
    if (!gpu && a->gpu_mem)
        fprintf(stderr, "ra: --gpu-mem is for the GPU path: it is ignored on the CPU\n");
}

/* headroom the plan does not itemize: cuBLAS's workspaces (up to 32 MiB a handle on Hopper) and
 * the kernels CUDA loads at their first launch, after the free memory was read */
enum { GPU_HEADROOM_MIB = 256 };

/* refuses a run whose device plan (gpu_plan, and the headroom) would not fit what is free, or
 * --gpu-mem; returns the plan in MiB, and in *base_mb the memory in use when checked (the CUDA
 * context, other processes), which --stats sets beside the peak's growth */
static double preflight_gpu(const Config *c, const Args *a, const AttnParams *ap, int n_prompt,
                            int batch, double *base_mb) {
    double weights, work, free_mb, total_mb;
    int n_w = attention_active(ap, n_prompt) ? ap->sink + ap->window : 0;
    gpu_plan(c, n_prompt, batch, n_w, ap->cache_type, &weights, &work);
    if (gpu_free_mb(&free_mb, &total_mb)) die("the GPU's free memory could not be read");
    int capped = a->gpu_mem && a->gpu_mem < free_mb;
    double avail = capped ? a->gpu_mem : free_mb,
           need = (weights + work) / 1048576.0 + GPU_HEADROOM_MIB;
    if (need > avail)
        die("not enough GPU memory: a %d-token prompt needs about %.0f MiB (fp16 weights %.0f, "
            "work %.0f, "
            "headroom %d) but %.0f MiB is %s; use --no-gpu, a shorter prompt or a smaller -b",
            n_prompt, need, weights / 1048576.0, work / 1048576.0, GPU_HEADROOM_MIB, avail,
            capped ? "allowed (--gpu-mem)" : "free");
    *base_mb = total_mb - free_mb;
    return need;
}

/* where a symbolic link at `link` whose text is `to` leads: `to` itself when absolute, else `to`
   in the link's directory. Caller frees. */
static char *link_target(const char *link, const char *to) {
    const char *slash = strrchr(link, '/');
    size_t dir = to[0] != '/' && slash ? (size_t)(slash - link) + 1 : 0, n = strlen(to);
    char *next = xmalloc(dir + n + 1);
    memcpy(next, link, dir), memcpy(next + dir, to, n + 1);
    return next;
}

/* --stats is written at the end; its path is checked first without emptying a file or leaving
 * one behind: a new path is made (O_EXCL) and removed, an existing one opened to append (a FIFO
 * without a reader taken), a link to a file not made yet followed. given: the path as typed. */
static void check_stats_target(const char *path, const char *given) {
    struct stat st, made;
    int regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    for (int fd = 1; fd <= 2 && regular; fd++)   /* the JSON would replace the run's text in it */
        if (fstat(fd, &made) == 0 && st.st_dev == made.st_dev && st.st_ino == made.st_ino)
            die("--stats: '%s' is the file standard %s goes to: give another", given,
                fd == 1 ? "output" : "error");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK, 0666);
    if (fd >= 0) {
        int ok = fstat(fd, &made) == 0;
        close(fd);
        if (ok && lstat(path, &st) == 0 && st.st_dev == made.st_dev && st.st_ino == made.st_ino)
            unlink(path);
        return;
    }
    if (errno == EEXIST) {
        fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK);
        if (fd >= 0) {
            close(fd);
            return;
        }
        if (errno == ENXIO) return;   /* a FIFO with no reader yet */
        if (errno == ENOENT && lstat(path, &st) == 0 &&
            S_ISLNK(st.st_mode)) { /* a link to a file not made yet */
            char to[4096];
            ssize_t n = readlink(path, to, sizeof to);
            if (n >= 0 && n < (ssize_t)sizeof to) {
                to[n] = 0;
                char *next = link_target(path, to);
                check_stats_target(next, given);
                free(next);
                return;
            }
            if (n >= 0) errno = ENAMETOOLONG;
        }
    }
    int e = errno;
    if (strcmp(path, given))
        die("--stats: cannot write '%s', where the link '%s' leads: %s", path, given, strerror(e));
    die("--stats: cannot write '%s': %s", path, strerror(e));
}

/* forward on the GPU when there is one; NULL only for Ctrl-C (a GPU error ends the run) */
static float *run_forward(const Model *m, GpuModel *g, State *s, const int32_t *tokens, int n) {
    if (!g) return forward(m, s, tokens, n);
    float *logits = forward_cuda(g, s, tokens, n);
    if (!logits && !stop_requested()) die("the GPU forward pass failed (above)");
    return logits;
}

/* ---- Interrupt: Ctrl-C stops prefill, index build or generation cleanly ---------------------- */

/* interrupted (above): set by the handler; forward and the builds poll it (stop_requested). A
 * second signal ends the program at once, removing a partial context file first (unlink and
 * _exit are async-signal-safe); no statistics then. */
static void on_interrupt(int sig) {
    if (atomic_exchange(&interrupted, sig)) {   /* non-zero: SIGINT or SIGTERM came before */
        unlink_partial();
        _exit(128 + sig);
    }
}

/* SA_RESTART: a write to a full pipe or a paused terminal goes on after the signal instead of
 * failing with EINTR (which would turn the clean stop into a write error) */
static void catch_interrupt(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);   /* a closed stdout is a write error, said, not a silent death */
}

/* ---- --trace L:H: one query head's Alg. 1, on stderr and in a file ------------------------- */

typedef struct {
    int sink;               /* index id i is position sink + i */
    FILE *f;                /* --trace-file's F.tmp, renamed to F at the end; or NULL */
    const char *path;
    char tmp[4096];
    pthread_mutex_t mu;     /* the build's record comes from the builds' thread */
} TraceOut;

static void json_ids(FILE *f, const char *key, const int32_t *ids, int n) {
    fprintf(f, ", \"%s\": [", key);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc(']', f);
}

static void trace_build_json(TraceOut *o, const RAIndex *ix, int layer, int head, long edges);

/* the traced head's index, once built: what each step of §3.2 did */
static void trace_print_build(void *arg, int layer, int head, const RAIndex *ix) {
    TraceOut *o = arg;
    const BuildTrace *b = &ix->bt;
    long edges = 0;
    for (int v = 0; v < ix->n; v++) edges += ix->deg[v];
    double pruned = b->b_cand > 0 ? 1.0 - (double)b->b_edges / b->b_cand : 0;
    pthread_mutex_lock(&o->mu);
    fprintf(stderr,
            "ra: trace L%d:H%d build (§3.2): %d keys, %d queries\n"
            "ra: trace   (a) exact KNN: %ld links, %d keys in some query's list\n"
            "ra: trace   (b) projection: %d keys linked, out-degree mean %.1f, max %d; %.1f%% of "
            "%ld candidates pruned\n"
            "ra: trace   (c) reverse edges: %ld added\n"
            "ra: trace   (d) connectivity: %d keys unreached from the entry: %d linked to their "
            "top query's list, %d by a search; %+ld edges\n"
            "ra: trace   entry: the key at %d, of %d entry points; %ld edges, out-degree mean "
            "%.1f\n",
            layer, head, ix->n, ix->n_query, b->a_links, b->a_keys, b->b_linked,
            b->b_linked ? (double)b->b_edges / b->b_linked : 0, b->b_deg_max, 100 * pruned,
            b->b_cand, b->c_added, ix->n_repaired, ix->n_repaired - ix->n_searched,
            ix->n_searched, b->d_net, ix->entry + o->sink, ix->n_entry, edges,
            ix->n ? (double)edges / ix->n : 0);
    for (int i = 0; b->d_keys && i < ix->n_repaired && i < 8; i++)
        fprintf(stderr, "%s%d by %s", i ? ", " : "ra: trace   (d) the first keys linked: ",
                (b->d_keys[i] < 0 ? -1 - b->d_keys[i] : b->d_keys[i]) + o->sink,
                b->d_keys[i] < 0 ? "a search" : "its list");
    if (b->d_keys && ix->n_repaired > 0) fputs(ix->n_repaired > 8 ? ", ...\n" : "\n", stderr);
    if (o->f) trace_build_json(o, ix, layer, head, edges);
    pthread_mutex_unlock(&o->mu);
}

/* the build's record in --trace-file: its counts, and step (d)'s keys as positions */
static void trace_build_json(TraceOut *o, const RAIndex *ix, int layer, int head, long edges) {
    const BuildTrace *b = &ix->bt;
    fprintf(o->f,
            "{\"kind\": \"build\", \"layer\": %d, \"head\": %d, \"keys\": %d, \"queries\": %d, "
            "\"a_links\": %ld, \"a_keys\": %d, \"b_linked\": %d, \"b_edges\": %ld, "
            "\"b_deg_max\": %d, \"b_cand\": %ld, \"c_added\": %ld, \"d_unreached\": %d, "
            "\"d_by_search\": %d, \"d_net\": %ld, \"entry\": %d, \"entries\": %d, "
            "\"edges\": %ld",
            layer, head, ix->n, ix->n_query, b->a_links, b->a_keys, b->b_linked, b->b_edges,
            b->b_deg_max, b->b_cand, b->c_added, ix->n_repaired, ix->n_searched, b->d_net,
            ix->entry + o->sink, ix->n_entry, edges);
    for (int way = 0; way < 2; way++) {   /* by its top query's list, by a search */
        fprintf(o->f, way ? ", \"d_search_pos\": [" : ", \"d_list_pos\": [");
        for (int i = 0, n = 0; b->d_keys && i < ix->n_repaired; i++)
            if ((b->d_keys[i] < 0) == way)
                fprintf(o->f, n++ ? ",%d" : "%d",
                        (way ? -1 - b->d_keys[i] : b->d_keys[i]) + o->sink);
        fputc(']', o->f);
    }
    fputs("}\n", o->f);
}

/* one decoding step of the traced head, a line per line of Alg. 1, positions for ids */
static void trace_step_lines(const StepRecord *r) {
    const StepTrace *t = &r->st;
    int sink = r->sink, last = t->ins_first + t->n_ins - 1 + sink;
    fprintf(stderr, "ra: trace L%d:H%d step at position %d (Alg. 1)\n", r->layer, r->head, t->pos);
    fprintf(stderr, "ra: trace   line 1    W = [0, %d) + [%d, %d], %d keys; H = [%d, %d), %d keys "
            "(§3.3)\n", sink, t->idx_end, t->pos, t->n_w, sink, t->idx_end, t->n_h);
    if (!t->indexed)
        fprintf(stderr, "ra: trace   lines 4-5 no index yet: H is scanned exactly\n");
    else if (t->n_ins == 0) fprintf(stderr, "ra: trace   lines 4-5 no key left W\n");
    else
        fprintf(stderr, "ra: trace   lines 4-5 %d key%s inserted, the last at %d: %d out-links, "
                "%d in-links\n", t->n_ins, plural(t->n_ins), last, t->ins_out, t->ins_in);
    fprintf(stderr, "ra: trace   line 6    o_W (Eq. 2): |W| %d, z~1 %.4f, sum_W %.4f\n", t->n_w,
            t->z_w, t->s_w);
    if (t->indexed)
        fprintf(stderr, "ra: trace   line 7    VectorSearch: ef %d from key %d and %d warm seeds, "
                "%d hops, %d keys scored (%.1f%% of H)\n", t->ef, t->entry + sink, t->n_seeds,
                t->hops, t->n_scored, t->n_h ? 100.0 * t->n_scored / t->n_h : 0);
    else
        fprintf(stderr, "ra: trace   line 7    exact top-k (index not built yet): %d keys scored\n",
                t->n_scored);
    fprintf(stderr, "ra: trace   line 8    o_Omega (Eq. 2): |Omega| %d, z~2 %.4f, sum_Omega %.4f\n",
            t->n_omega, t->z_omega, t->s_omega);
    fprintf(stderr, "ra: trace   line 9    Eq. (5): gamma1 %.4f, gamma2 %.4f\n", t->g1, t->g2);
    fprintf(stderr, "ra: trace   Eq. (1)   exact: recall@%d %.3f, mass W %.3f + Omega %.3f, output "
            "error %.2e\n", r->ex.k, r->ex.recall, r->ex.mass_w, r->ex.mass_omega, r->ex.err);
}

static void trace_step_json(FILE *f, const StepRecord *r) {
    const StepTrace *t = &r->st;
    fprintf(f, "{\"kind\": \"step\", \"layer\": %d, \"head\": %d, \"pos\": %d, \"sink\": %d, "
            "\"idx_end\": %d, \"indexed\": %d, \"ins_first\": %d, \"n_ins\": %d, \"ins_out\": %d, "
            "\"ins_in\": %d, \"n_w\": %d, \"z_w\": %.9g, \"sum_w\": %.9g, \"ef\": %d, "
            "\"entry\": %d, \"seeds\": %d, \"hops\": %d, \"scored\": %d, \"n_h\": %d, "
            "\"n_omega\": %d, \"z_omega\": %.9g, \"sum_omega\": %.9g, \"gamma1\": %.9g, "
            "\"gamma2\": %.9g, \"k\": %d, \"recall\": %.6f, \"mass_w\": %.6f, "
            "\"mass_omega\": %.6f, \"err\": %.6g",
            r->layer, r->head, t->pos, r->sink, t->idx_end, t->indexed, t->ins_first + r->sink,
            t->n_ins, t->ins_out, t->ins_in, t->n_w, t->z_w, t->s_w, t->ef,
            t->entry >= 0 ? t->entry + r->sink : -1, t->n_seeds, t->hops, t->n_scored, t->n_h,
            t->n_omega, t->z_omega, t->s_omega, t->g1, t->g2, r->ex.k, r->ex.recall,
            r->ex.mass_w, r->ex.mass_omega, r->ex.err);
    json_ids(f, "omega_pos", r->omega, t->n_omega);
    json_ids(f, "topk_pos", r->topk, r->ex.k);
    json_ids(f, "scored_pos", r->scored, t->n_scored);
    fputs(", \"weight\": [", f);
    for (int i = 0; i <= t->pos; i++) fprintf(f, i ? ",%.4g" : "%.4g", r->weight[i]);
    fputs("]}\n", f);
}

static void trace_print_step(void *arg, const StepRecord *r) {
    TraceOut *o = arg;
    pthread_mutex_lock(&o->mu);
    trace_step_lines(r);
    if (o->f) trace_step_json(o->f, r);
    pthread_mutex_unlock(&o->mu);
}

/* --trace L:H against the model: a layer with indexes, a query head; F.tmp opened */
static void trace_open(TraceOut *o, const Model *m, const Args *a, Attention *A) {
    const AttnParams *ap = &a->attn;
    const Config *c = &m->c;
    pthread_mutex_init(&o->mu, NULL);
    o->sink = ap->sink;
    if (!ap->trace) return;
    if (ap->trace_layer >= c->n_layers || ap->trace_head >= c->n_heads)
        die("--trace %d:%d: the model has layers 0..%d and query heads 0..%d", ap->trace_layer,
            ap->trace_head, c->n_layers - 1, c->n_heads - 1);
    if (layer_sliding(c, ap->trace_layer))
        die("--trace %d:%d: layer %d is a sliding layer, which attends to its window alone (no "
            "index): give a global layer", ap->trace_layer, ap->trace_head, ap->trace_layer);
    if (a->trace_file) {
        o->path = a->trace_file;
        if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp", a->trace_file) >= (int)sizeof o->tmp)
            die("--trace-file: path too long");
        if (!(o->f = fopen(o->tmp, "w")))
            die("--trace-file: cannot write '%s': %s", o->tmp, strerror(errno));
    }
    attention_trace(A, trace_print_build, trace_print_step, o);
}

/* F.tmp written: it becomes F */
static void trace_close(TraceOut *o) {
    if (o->f) {
        if (fclose(o->f) != 0) die("--trace-file: write error on '%s'", o->tmp);
        if (rename(o->tmp, o->path) != 0)
            die("--trace-file: cannot rename '%s' to '%s': %s", o->tmp, o->path, strerror(errno));
    }
    pthread_mutex_destroy(&o->mu);
}

/* ---- The run: prompt, context, prefill, generation, report ----------------------------------- */
/* main reads as the run's outline; each step below is one function:
 *   tokenize_prompt   text (and --chat) -> tokens
 *   settle_context    the context size, the attention flags against it
 *   prefill           the prompt's forward pass (or the context file), the
 *                     indexes built layer by layer as its keys complete
 *   generate          sample, print, forward one token, until done
 *   report, report_audit, write_stats: the summary on stderr, --stats' JSON */

typedef struct {            /* what a run found and measured, for its report */
    int n_prompt, ctx;      /* prompt tokens; context size */
    char chat_said[128];    /* (128) --chat: which format, and from where (summary line) */
    double mem_plan;        /* bytes the memory preflight planned */
    int gpu;                /* 1 when the run went to the GPU */
    /* the device plan (MiB, headroom included); in use before it */
    double gpu_plan_mb, gpu_base_mb;
    int cached;             /* --prompt-cache: positions read from it */
    int cache_built;        /* 1: the builds save FILE once every index is built */
    int cache_saved;        /* 1: FILE was saved */
    double prefill_s, build_s; /* prefill wall time less the build's waits; the index build */
    double t_start, ttft_s; /* the prefill's start; from it to the first token printed (0: none) */
    double prefill_attn_s;  /* the prefill's causal attention, a part of prefill_s */
    long long seed;         /* the sampler's seed, given or from the clock */
    int n_gen, steps, eog;  /* tokens generated; decoding steps run; stopped at an EOG token */
    int pending;            /* the last token sampled and not run through the model, or -1 */
    uint64_t rng;           /* the sampler's xorshift64* state, from the seed */
    int chat_fmt, doc_empty; /* --chat's format (CHAT_*); -cnv: no document was given */
    double decode_s;        /* decoding wall time, the --audit work excluded */
    int exact_steps;        /* ... its steps in which some head scanned exactly (ra) */
    double exact_s;         /* ... and their time */
    const char *stopped;    /* where Ctrl-C stopped the run ("prefill", "generation"), or NULL */
    int refused;            /* -cnv questions refused (said, passed over): the exit status is 1 */
} Run;

/* the prompt's tokens (special-token text is parsed, as llama.cpp does); sets r->n_prompt and,
 * with --chat, r->chat_said */
static int32_t *tokenize_prompt(const Model *m, const Args *a, Run *r) {
    size_t plen;
    /* no NUL in it */
    char *text = a->prompt_file ? read_prompt_file(a->prompt_file, &plen)
                                : strdup(a->prompt ? a->prompt : "");
    plen = strlen(text);
    if (!utf8_valid((const unsigned char *)text, plen))
        die(a->prompt_file ? "%s: prompt file is not valid UTF-8"
                           : "%s: the prompt is not valid UTF-8",
            a->prompt_file ? a->prompt_file : "-p");
    if (a->chat) {
        r->doc_empty = !text[0];
        char *t = apply_chat(m, text, a->chat_template, a->conversation, &r->chat_fmt,
                             r->chat_said, sizeof r->chat_said);
        free(text);
        text = t;
        plen = strlen(text);
    }
    int cap = (int)(plen + 16 > 1 << 30 ? 1 << 30 : plen + 16);
    int32_t *tokens = malloc((size_t)cap * sizeof(int32_t));
    if (!tokens) die("out of memory for the prompt (%zu bytes)", plen);
    int n = tokenizer_encode(&m->tok, text, plen, 1, 1, tokens, cap);
    if (n > cap) {   /* more ids than bytes (byte fallback): again with room for all */
        free(tokens);
        tokens = malloc((size_t)n * sizeof(int32_t));
        if (!tokens) die("out of memory for %d prompt tokens", n);
        cap = n;
        n = tokenizer_encode(&m->tok, text, plen, 1, 1, tokens, cap);
    }
    free(text);
    if (n < 0) die("the prompt could not be tokenized");
    if (n == 0) die("the prompt is empty");
    r->n_prompt = n;
    return tokens;
}

/* the context: prompt + n, capped at the trained context unless -c raises it. Then the flags
 * that depend on it: the batch is capped at it, the attention's defaults are filled in, and a
 * flag given past the context is refused. */
static int settle_context(const Model *m, Args *a, int n_prompt) {
    int ctx = a->ctx_model || (a->conversation && !a->ctx) ? m->c.ctx_train : a->ctx;
    if (!ctx) {
        long long want = (long long)n_prompt + a->n_predict;
        ctx = (int)(want < m->c.ctx_train ? want : m->c.ctx_train);
    }
    if (ctx > 1 << 24) ctx = 1 << 24; /* -c's bound, for a trained context past it (-c 0, -n -1) */
    const char *raise =
        a->ctx && !a->ctx_model ? "raise -c" : "the model's trained context; -c raises it";
    if (n_prompt > ctx)
        die("the prompt is %d tokens, which does not fit the context of %d (%s)", n_prompt, ctx,
            raise);
    if (n_prompt == ctx && a->n_predict > 0)   /* -n 0 runs the prompt alone */
        die("the prompt is %d token%s, which fills the context of %d and leaves no room to "
            "generate (%s, or -n 0)",
            n_prompt, plural(n_prompt), ctx, raise);
    if (a->batch > ctx) a->batch = ctx;
    AttnParams *ap = &a->attn;
    if (!ap->ef_conn) ap->ef_conn = ra_default_ef_conn(ap->q_stride);
    if (!ap->n_entry) ap->n_entry = RA_ENTRIES;
    if (ap->mode != ATTN_FULL) {
        /* a default that exceeds a short context is no error: only a value given is refused, and
           only for an option the mode reads (say_unused_flags notes the others) */
        const struct {
            const char *flag;
            int value;
        } sized[] = {
            {"--sink", ap->sink},       {"--window", ap->window},   {"--topk", ap->topk},
            {"--ef", ap->ef},           {"--nprobe", ap->nprobe},   {"--nq", ap->nq_knn},
            {"--ef-conn", ap->ef_conn}, {"--entries", ap->n_entry},
        };
        for (size_t i = 0; i < sizeof sized / sizeof *sized; i++)
            if (flag_given(a, sized[i].flag) && mode_reads(sized[i].flag, ap->mode) &&
                sized[i].value >= ctx)
                die("%s %d is not smaller than the context of %d", sized[i].flag, sized[i].value,
                    ctx);
        if (ap->mode == ATTN_RA && ap->ef && ap->ef < ap->topk)
            die("--ef %d is smaller than --topk %d", ap->ef, ap->topk);
    }
    if (ap->mode == ATTN_IVF && n_prompt > ap->sink + ap->window) {
        int nlist = ivf_nlist(n_prompt - ap->sink - ap->window);
        if (!ap->nprobe) ap->nprobe = nlist / 20 > 1 ? nlist / 20 : 1;   /* about 5% of the lists */
        if (ap->nprobe > nlist) {   /* --stats then records the lists probed */
            fprintf(
                stderr,
                "ra: --nprobe %d is more than the %d IVF lists of this prompt: probing all %d\n",
                ap->nprobe, nlist, nlist);
            ap->nprobe = nlist;
        }
    }
    return ctx;
}

/* Waits for the index builds with their progress on stderr (`why`: what for); 0 when Ctrl-C
 * stopped them first */
static int wait_builds(Attention *A, const char *why) {
    int total, left = attention_builds_left(A, &total);
    Progress pr = {now_s(), 0, 0, 0, total, why, "layers"};
    while (left > 0 && !stop_requested()) {
        show_progress(&pr, (double)(total - left) / total);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        left = attention_builds_left(A, NULL);
    }
    if (pr.shown) fprintf(stderr, "\n"), atomic_store(&progress_open, 0);
    A->st.build_wait_s += now_s() - pr.t0;   /* attention_wait_build counts the rest */
    if (left > 0) attention_stop_build(A);   /* Ctrl-C */
    attention_wait_build(A);
    return left == 0 && !stop_requested();   /* Ctrl-C during the save: it wrote nothing */
}

/* The prompt's forward pass with progress on stderr, each layer's queries handed over to the
 * index builds as its keys complete. With --prompt-cache, the positions the context file gives
 * are read instead, and only the rest runs (attention_resume, or attention_replay for a file
 * without this run's indexes); a prompt run from its start is saved, ra's once its indexes are
 * built. Decoding may then begin (--index-wait: once every index has taken over). Sets
 * r->prefill_s; the last token's logits, or NULL (r->stopped) when Ctrl-C stopped it. */
static float *prefill(const Model *m, GpuModel *g, State *s, Attention *A, const Args *a,
                      Context *cx, const int32_t *tokens, Run *r) {
    const char *what = r->cached ? "context file" : "prefill";
    Progress pr = {now_s(), 0, 0, 0, r->n_prompt, what, "tokens"};
    r->t_start = pr.t0;
    s->progress = show_progress;
    s->progress_arg = &pr;
    s->stop = stop_requested;
    float *logits = NULL;
    int stopped = 0;
    if (r->cached) {
        logits = context_load(cx, s, A);
        stopped = s->n != r->cached;
        if (!stopped)
            fprintf(stderr, "ra: --prompt-cache: %d of the prompt's %d tokens read from %s%s\n",
                    r->cached, r->n_prompt, cx->io.path,
                    r->cached < r->n_prompt ? ", the rest run (the file is kept)" : "");
    }
    if (!stopped && r->cached < r->n_prompt) {
        if (r->cached)   /* the rest's own progress */
            pr.what = "prefill", pr.t0 = now_s(), pr.last = 0, pr.total = r->n_prompt - r->cached;
        logits = run_forward(m, g, s, tokens + r->cached, r->n_prompt - r->cached);
    }
    if (logits && cx->replay) {
        fprintf(stderr, "ra: --prompt-cache: %s holds no indexes of these settings: they are "
                "built while decoding, the prompt run again for its queries%s\n", cx->io.path,
                cx->rewrite ? ", then saved there" : "");
        attention_replay(A, s, tokens, a->batch);
    } else if (logits && r->cached) {
        attention_resume(A, s, cx->use_indexes ? cx->n - cx->window : 0);
    }
    if (logits && r->cached && stop_requested()) logits = NULL;   /* during attention_resume */
    if (!logits) r->stopped = "prefill";
    else check_logits(logits, m->c.vocab_size);
    if (r->stopped && pr.shown) fprintf(stderr, "\n"), atomic_store(&progress_open, 0);
    s->progress = NULL, s->progress_arg = NULL;   /* pr ends with this call */
    double t_save = now_s();
    int save = a->prompt_cache && logits && (!r->cached || cx->rewrite);
    cx->m = m, cx->s = s, cx->A = A, cx->tokens = tokens;
    if (save && attention_builds_left(A, NULL)) {   /* saved by the builds once all are built */
        context_keep(cx, logits);
        attention_prefill_done(A, context_save_built, cx);
        r->cache_built = 1;
    } else {   /* saved before decoding changes the state: ttft_s counts it, prefill_s not */
        if (save) cx->logits = logits, context_save(cx, 1), cx->logits = NULL;
        attention_prefill_done(A, NULL, NULL);
    }
    t_save = now_s() - t_save;
    if (r->stopped) attention_stop_build(A);
    else if (a->index_wait && !wait_builds(A, "index build")) r->stopped = "index build";
    r->prefill_s = now_s() - r->t_start - A->st.build_wait_s - t_save;
    /* --dump-qk: decoding queries arrive there too */
    if (!a->dump_qk) free(s->q_keep), s->q_keep = NULL;
    r->prefill_attn_s = s->prefill_attn_s;   /* the part of the prompt that ran */
    if (r->stopped && !strcmp(r->stopped, "prefill"))
        fprintf(stderr, "ra: interrupted during prefill at %.0f%%; statistics so far:\n",
                100 * pr.frac);
    if (r->stopped && strcmp(r->stopped, "prefill"))
        fprintf(stderr, "ra: interrupted while waiting for the index builds; statistics so far:\n");
    return r->stopped ? NULL : logits;
}

/* Generation: sample a token from the logits, print it, run it forward, until -n tokens, an
 * end-of-generation token (unless --ignore-eos), a full context or Ctrl-C. `logits` is the
 * prefill's (or a turn's), NULL when it was stopped (then nothing is generated). The last token
 * sampled and not run (an end of generation, or the -n-th) is left in r->pending. */
static void generate(const Model *m, GpuModel *g, State *s, const Args *a, float *logits, Run *r) {
    ProbId *pbuf = malloc((size_t)m->c.vocab_size * sizeof(ProbId));
    if (!pbuf) die("out of memory for the sampler's buffer");
    Sampler sampler = {a->temp, a->top_p, a->min_p, a->top_k};
    int n = 0;   /* tokens of this call */
    r->eog = 0, r->pending = -1;
    while (!r->stopped && n < a->n_predict && s->n < r->ctx) {
        int next = sample(logits, m->c.vocab_size, &sampler, &r->rng, pbuf);
        r->pending = next;
        if (!a->ignore_eos && tokenizer_is_eog(&m->tok, next)) {
            r->eog = 1;
            break;
        }
        print_piece(m, next);
        n++;
        if (!r->n_gen++) fflush(stdout), r->ttft_s = now_s() - r->t_start;
        if (n == a->n_predict || s->n >= r->ctx) break;
        if (stop_requested()) {
            r->stopped = "generation";
            break;
        }
        double t1 = now_s(), audit0 = s->attn->st.audit_s;
        long exact0 = attention_exact_steps(s->attn);
        logits = run_forward(m, g, s, &next, 1);
        r->pending = -1;
        double dt = now_s() - t1 - (s->attn->st.audit_s - audit0);   /* --audit's is apart */
        r->decode_s += dt;
        if (!logits) {
            r->stopped = "generation";
            break;
        }
        if (attention_exact_steps(s->attn) > exact0) r->exact_steps++, r->exact_s += dt;
        check_logits(logits, m->c.vocab_size);
        r->steps++;
    }
    free(pbuf);
    if ((n && putchar('\n') == EOF) || fflush(stdout) != 0) /* nothing for nothing generated */
        die("standard output: write error: %s", strerror(errno));
    if (!r->stopped && !r->eog && n < a->n_predict)
        fprintf(stderr, "ra: stopped after %d token%s: the context of %d tokens is full (-c)\n", n,
                plural(n), r->ctx);
    if (r->stopped && !strcmp(r->stopped, "generation"))
        fprintf(stderr, "ra: interrupted during generation after %d token%s; statistics so far:\n",
                r->n_gen, plural(r->n_gen));
}

typedef struct {            /* -cnv's reader of stdin, a line at a time */
    char *buf;              /* (cap) bytes read, the unread ones from `at` to `len` */
    size_t len, at, cap;
    size_t seen;            /* bytes from `at` searched already, with no newline */
    int eof;
    int too_long;           /* the line being read is past PROMPT_FILE_MAX: dropped to its end */
} LineReader;

/* the next line of stdin (its newline cut; NUL-terminated in r->buf; its bytes in *n), or NULL at
 * the end of input or on Ctrl-C (stop_requested): stdin is polled, so Ctrl-C ends a wait. A line
 * past PROMPT_FILE_MAX bytes is dropped as it comes and returned empty, with r->too_long set. */
static char *read_line(LineReader *r, size_t *n) {
    for (;;) {
        char *nl = NULL;
        if (r->len > r->at + r->seen) nl = memchr(r->buf + r->at + r->seen, '\n',
                                                  r->len - r->at - r->seen);
        r->seen = r->len - r->at;
        if (nl || (r->eof && (r->len > r->at || r->too_long))) {
            size_t end = nl ? (size_t)(nl - r->buf) : r->len;
            if (end - r->at > PROMPT_FILE_MAX) r->too_long = 1;   /* its end came with the read */
            if (end == r->cap) r->buf = xrealloc(r->buf, ++r->cap);
            r->buf[end] = 0;
            char *line = r->too_long ? r->buf + end : r->buf + r->at;   /* dropped: empty */
            *n = (size_t)(r->buf + end - line);
            r->at = nl ? end + 1 : end, r->seen = 0;
            return line;
        }
        if (r->len - r->at > PROMPT_FILE_MAX) {   /* drop the line so far */
            free(r->buf);
            r->buf = NULL, r->len = r->at = r->cap = r->seen = 0, r->too_long = 1;
        }
        if (r->eof || stop_requested()) return NULL;
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;   /* a timeout, or a signal: look at the flag */
        if (r->at) memmove(r->buf, r->buf + r->at, r->len - r->at);   /* buf is NULL at first */
        r->len -= r->at, r->at = 0;
        if (r->cap - r->len < 4096) r->buf = xrealloc(r->buf, r->cap = 2 * r->cap + 4096);
        ssize_t got = read(STDIN_FILENO, r->buf + r->len, r->cap - r->len);
        if (got < 0 && errno != EINTR && errno != EAGAIN)
            die("-cnv: cannot read standard input: %s", strerror(errno));
        if (got == 0) r->eof = 1;
        if (got > 0) r->len += (size_t)got;
    }
}

/* the next question of -cnv, one a line (a carriage return cut too), or NULL at the end of input,
 * /exit or Ctrl-C; empty lines are passed over, and bad ones too, said and counted in *refused */
static char *next_question(LineReader *in, int *refused) {
    for (;;) {
        if (isatty(STDIN_FILENO)) fputs("> ", stderr);
        size_t n;
        char *line = read_line(in, &n);
        if (!line) return NULL;
        if (in->too_long) {
            fprintf(stderr, "ra: -cnv: a question is longer than %d MiB: passed over\n",
                    PROMPT_FILE_MAX >> 20);
            in->too_long = 0, ++*refused;
            continue;
        }
        while (n > 0 && line[n - 1] == '\r') line[--n] = 0;
        if (!strcmp(line, "/exit")) return NULL;
        if (n == 0) continue;
        if (!utf8_valid((const unsigned char *)line, n) || strlen(line) != n) {
            fprintf(stderr, "ra: -cnv: the question is not valid UTF-8 text: passed over\n");
            ++*refused;
            continue;
        }
        return line;
    }
}

/* a question's turn as tokens (no BOS) into *toks (grown): the answer before it closed (the token
 * it left unrun, the format's end of turn), the user's turn opened (the first opened with the
 * document), the question, the assistant's turn opened. Returns the count. */
static int turn_tokens(const Model *m, const Run *r, const char *question, int first,
                       int32_t **toks, int *cap) {
    const char *pre, *post, *end;
    chat_parts(r->chat_fmt, &pre, &post, &end);
    char *turn = chat_apply(r->chat_fmt, question);   /* pre, the question (trimmed), post */
    if (!turn) die("out of memory");
    const char *open = first ? (r->doc_empty ? "" : "\n\n") : end;
    const char *rest = first ? turn + strlen(pre) : turn;   /* the first turn is open already */
    size_t len = strlen(open) + strlen(rest);
    char *text = xmalloc(len + 1);
    snprintf(text, len + 1, "%s%s", open, rest);
    free(turn);
    int lead = !first && r->pending >= 0 && !tokenizer_is_eog(&m->tok, r->pending);
    if (*cap < (int)len + 2)
        *cap = (int)len + 2, *toks = xrealloc(*toks, (size_t)*cap * sizeof **toks);
    if (lead) (*toks)[0] = r->pending;
    int n = tokenizer_encode(&m->tok, text, len, 0, 1, *toks + lead, *cap - lead);
    if (n > *cap - lead) {   /* more ids than bytes: again with room for all */
        *cap = n + lead, *toks = xrealloc(*toks, (size_t)*cap * sizeof **toks);
        n = tokenizer_encode(&m->tok, text, len, 0, 1, *toks + lead, *cap - lead);
    }
    free(text);
    if (n < 0) die("-cnv: a question could not be tokenized");
    return n + lead;
}

/* -cnv: after the document's prefill, questions from stdin, each answered over the same KV cache
 * and indexes. A turn's tokens run as a prompt's do (Eq. 1 over every key); the keys they leave
 * outside W enter the indexes at the next decoding step (Alg. 1 line 5). Per-turn timings go to
 * stderr. Ends at the end of input, /exit or Ctrl-C; a question past the context is refused. */
static void converse(const Model *m, GpuModel *g, State *s, const Args *a, Run *r) {
    LineReader in = {0};
    int32_t *toks = NULL;
    int cap = 0;
    for (int turn = 1; !r->stopped;) {   /* turn: the next question answered */
        const char *q = next_question(&in, &r->refused);
        if (stop_requested()) {
            r->stopped = "generation";
            fprintf(stderr, "ra: interrupted while waiting for a question; statistics so far:\n");
        }
        if (!q || r->stopped) break;
        int n = turn_tokens(m, r, q, turn == 1, &toks, &cap);
        if (s->n + n >= r->ctx) {   /* a shorter question may still fit */
            fprintf(stderr, "ra: -cnv: question %d (%d tokens) does not fit the %d left of the "
                    "context of %d (-c): passed over\n", turn, n, r->ctx - s->n, r->ctx);
            r->refused++;
            continue;
        }
        double t0 = now_s(), d0 = r->decode_s;
        int gen0 = r->n_gen, steps0 = r->steps;
        float *logits = run_forward(m, g, s, toks, n);
        if (!logits) {
            r->stopped = "generation";
            break;
        }
        check_logits(logits, m->c.vocab_size);
        double t1 = now_s();
        generate(m, g, s, a, logits, r);
        int steps = r->steps - steps0;
        fprintf(stderr, "ra: turn %d: question %d token%s in %.2f s; answer %d token%s, %.2f "
                "ms/token; context %d tokens\n", turn, n, plural(n), t1 - t0, r->n_gen - gen0,
                plural(r->n_gen - gen0), steps ? (r->decode_s - d0) * 1000 / steps : 0.0, s->n);
        turn++;
    }
    free(in.buf);
    free(toks);
}

/* The run's end: a context file that the builds save is waited for (their progress on stderr;
 * Ctrl-C stops them, FILE as it was); the builds still running otherwise are stopped */
static void finish_builds(Attention *A, Run *r) {
    if (r->cache_built && !r->stopped && !wait_builds(A, "index build for --prompt-cache")) {
        r->stopped = "index build";
        fprintf(stderr, "ra: interrupted while waiting for the index builds; statistics so far:\n");
    }
    attention_stop_build(A);
    r->build_s = A->st.build_s;
}

typedef struct {            /* the run's rates, for the summary lines and --stats */
    double prefill_tok_s;   /* 0 when the prefill was interrupted */
    double scan;            /* keys scored by a search / keys indexed, the mean over searches */
    /* a decoding step's ms, the mean over steps (Table 6's split) */
    double total, retrieval, attention, other, insert, audit;
} Rates;

static Rates run_rates(const Attention *A, const Run *r) {
    Rates t = {0, 0, 0, 0, 0, 0, 0, 0};
    int prefill_done = !(r->stopped && !strcmp(r->stopped, "prefill"));
    if (r->prefill_s > 0 && prefill_done) t.prefill_tok_s = r->n_prompt / r->prefill_s;
    if (A->st.n_searches) t.scan = A->st.scan_sum / A->st.n_searches;
    if (!r->steps) return t;
    t.total = r->decode_s * 1000 / r->steps;
    t.retrieval = A->st.retrieval_s * 1000 / r->steps;
    t.attention = A->st.attention_s * 1000 / r->steps;
    t.other = t.total - t.retrieval - t.attention;
    t.insert = A->st.insert_s * 1000 / r->steps;
    t.audit = A->st.audit_s * 1000 / r->steps;
    return t;
}

/* the builds' seconds the prefill did not wait for (build_overlap_s) */
static double build_overlap(const Attention *A) {
    return A->st.build_s > A->st.build_wait_s ? A->st.build_s - A->st.build_wait_s : 0;
}

/* the share of the keys indexed that the builds' connectivity step linked (conn_keys); 0 before
 * any ra build */
static double conn_share(const Attention *A) {
    return A->st.n_indexed ? (double)A->st.n_repaired / A->st.n_indexed : 0;
}

/* ra: when the indexes took over, and the decoding steps with some head scanning exactly (before
 * the last took over) and the others */
static void report_takeover(const Attention *A, const Run *r) {
    int total, left = attention_builds_left(A, &total), after = r->steps - r->exact_steps;
    char when[96];
    if (left)
        snprintf(when, sizeof when, "%d of %d layers took over by the end", total - left, total);
    else
        snprintf(when, sizeof when, "all %d layers took over %.2f s after the prefill began", total,
                 attention_ready_at(A) - r->t_start);
    if (!r->steps) {
        fprintf(stderr, "ra: indexes: %s\n", when);
        return;
    }
    fprintf(stderr, "ra: indexes: %s; decoding steps with a head scanning exactly %d (%.2f "
            "ms/token), the others %d (%.2f ms/token)\n", when, r->exact_steps,
            r->exact_steps ? r->exact_s * 1000 / r->exact_steps : 0.0, after,
            after ? (r->decode_s - r->exact_s) * 1000 / after : 0.0);
}

/* the summary lines on stderr */
static void report(const Model *m, const Attention *A, const AttnParams *ap, int threads,
                   const Run *r, const Rates *rates) {
    Rates t = *rates;
    fprintf(stderr, "ra: %s, %d thread%s, attention %s%s\n", m->name, threads, plural(threads),
            A->active ? attn_mode_name(ap->mode) : "full", r->chat_said);   /* the one that ran */
    char rate[48];   /* an interrupted prefill has no rate */
    if (r->stopped && !strcmp(r->stopped, "prefill")) snprintf(rate, sizeof rate, "interrupted");
    else snprintf(rate, sizeof rate, "%.1f tok/s", t.prefill_tok_s);
    /* the first token comes from the prefill: a rate needs a decoding step */
    char per_token[32] = "";
    if (r->steps) snprintf(per_token, sizeof per_token, ", %.2f ms/token", t.total);
    char first[48] = "";
    if (r->n_gen) snprintf(first, sizeof first, " (the first after %.2f s)", r->ttft_s);
    fprintf(stderr,
            "ra: prompt %d token%s in %.2f s (%s, attention %.2f s); generated %d token%s%s%s\n",
            r->n_prompt, plural(r->n_prompt), r->prefill_s, rate, r->prefill_attn_s, r->n_gen,
            plural(r->n_gen), first, per_token);
    if (!A->active) return;
    char build[256] = "";   /* flat and streaming build nothing; ivf has no KNN step */
    if (ap->mode == ATTN_RA)
        snprintf(build, sizeof build,
                 "index build %.2f s from %d queries a head, %.2f s of it not waited for (KNN"
                 " %.2f s, connectivity %.2f s for %.0f%% of the keys); ",
                 r->build_s, A->n_query, build_overlap(A), A->st.knn_s, A->st.conn_s,
                 100 * conn_share(A));
    if (ap->mode == ATTN_IVF) snprintf(build, sizeof build, "index build %.2f s; ", r->build_s);
    if (!r->steps)
        fprintf(stderr, "ra: %sno decoding step\n", build);
    else
        fprintf(stderr,
                "ra: %sscan ratio %.2f%%; per token: retrieval %.2f ms, attention %.2f ms, other "
                "%.2f ms "
                "(insertion %.2f)\n",
                build, 100 * t.scan, t.retrieval, t.attention, t.other, t.insert);
    if (ap->mode == ATTN_RA) report_takeover(A, r);
}

/* --audit: a line per layer and one overall on stderr; returns the overall means (over every
 * layer, query head and step), with their count in .n (0: no audit) */
static AuditSum report_audit(const Model *m, const Attention *A, const AttnParams *ap) {
    AuditSum all = {0, 0, 0, 0, 0};
    if (!A->st.audit) return all;
    for (int l = 0; l < m->c.n_layers; l++) {
        AuditSum sum = {0, 0, 0, 0, 0};
        for (int h = 0; h < m->c.n_heads; h++) {
            const AuditSum *x = &A->st.audit[(size_t)l * m->c.n_heads + h];
            sum.recall += x->recall, sum.mass_w += x->mass_w, sum.mass_omega += x->mass_omega;
            sum.err += x->err, sum.n += x->n;
        }
        if (sum.n)
            fprintf(stderr,
                    "ra: audit layer %2d: recall@%d %.3f, attention mass W %.3f + retrieved %.3f, "
                    "output error %.2e\n",
                    l, ap->topk, sum.recall / sum.n, sum.mass_w / sum.n, sum.mass_omega / sum.n,
                    sum.err / sum.n);
        all.recall += sum.recall, all.mass_w += sum.mass_w, all.mass_omega += sum.mass_omega;
        all.err += sum.err, all.n += sum.n;
    }
    if (all.n) {
        all.recall /= all.n, all.mass_w /= all.n, all.mass_omega /= all.n, all.err /= all.n;
        fprintf(stderr,
                "ra: audit overall: recall@%d %.3f, attention mass W %.3f + retrieved %.3f, output "
                "error %.2e\n",
                ap->topk, all.recall, all.mass_w, all.mass_omega, all.err);
    } else if (A->active) { /* -n 0 or 1: the audit looks at decoding steps, and there were none */
        fprintf(stderr, "ra: --audit: no decoding step, so nothing was audited\n");
    }
    return all;
}

/* the share of the indexes built whose KNN ran on the GPU (RAIndex.knn_gpu), or with amx on the
 * CPU's AMX tiles (RAIndex.knn_amx); 0 outside ra */
static double knn_share(const Model *m, const Attention *A, int amx) {
    if (A->p.mode != ATTN_RA || !A->active) return 0;
    long built = 0, on = 0;
    /* cap 0: not built (interrupted) */
    for (size_t i = 0; i < (size_t)m->c.n_layers * m->c.n_heads; i++)
        if (A->ra[i].cap > 0) built++, on += amx ? A->ra[i].knn_amx : A->ra[i].knn_gpu;
    return built ? (double)on / built : 0;
}

/* the beam of the first decoding step: --ef, or ra_auto_ef for the prompt's keys */
static int stats_ef(const AttnParams *ap, int n_prompt) {
    int n = n_prompt - ap->sink - ap->window;
    return search_ef(ap, n > 0 ? n : 0);
}

/* ra: seconds from the prefill's start until the last index took over; -1 when some never did
 * (or their builds failed), 0 without ra's indexes */
static double index_ready_s(const Attention *A, const Run *r) {
    int total, left = attention_builds_left(A, &total);
    if (!total) return 0;
    return left ? -1 : attention_ready_at(A) - r->t_start;
}

/* --stats: the run as one JSON object */
static void write_stats(const Model *m, const Attention *A, const Args *a, int threads,
                        const Run *r, const Rates *rates, const AuditSum *audit) {
    const AttnParams *ap = &a->attn;
    Rates t = *rates;
    double kv_bytes, index_bytes;
    attention_memory(&m->c, ap, r->ctx, a->batch, &kv_bytes, &index_bytes);
    /* no index was built (full attention ran): as the preflight */
    if (!A->active) index_bytes = 0;
    FILE *stats = fopen(a->stats, "w");
    if (!stats) die("--stats: cannot write '%s': %s", a->stats, strerror(errno));
    fprintf(stats, "{\"mode\": \"%s\", \"attn\": \"%s\", \"model\": ", attn_mode_name(ap->mode),
            A->active ? attn_mode_name(ap->mode) : "full");
    json_string(stats, a->model);
    fprintf(
        stats,
        ", \"prompt_tokens\": %d, \"generated_tokens\": %d, \"ctx\": %d, \"prefill_s\": %.4f, "
        "\"ttft_s\": %.4f, "
        "\"prefill_tok_s\": %.2f, \"prefill_attn_s\": %.4f, \"decode_ms_per_token\": %.3f, "
        "\"peak_rss_mb\": %.1f, \"mem_plan_mb\": %.1f, \"threads\": %d, "
        "\"temp\": %g, \"top_k\": %d, \"top_p\": %g, \"min_p\": %g, \"seed\": %lld, "
        "\"sink\": %d, \"window\": %d, \"topk\": %d, \"ef\": %d, \"ef_auto\": %d, \"warm\": %d, "
        "\"nprobe\": %d, "
        "\"nq\": %d, \"degree\": %d, \"q_stride\": %d, \"q_used\": %d, \"ef_conn\": %d, "
        "\"entries\": %d, \"exact_below\": %d, \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", "
        "\"knn_s\": %.4f, "
        "\"index_build_s\": %.4f, \"scan_ratio\": %.5f, \"retrieval_ms\": %.3f, \"attention_ms\": "
        "%.3f, "
        "\"other_ms\": %.3f, \"insert_ms\": %.3f, \"audit_ms\": %.3f, \"kv_bytes\": %.0f, "
        "\"index_bytes\": %.0f, "
        "\"gpu\": %d, \"gpu_peak_mb\": %.1f, \"gpu_base_mb\": %.1f, \"gpu_plan_mb\": %.1f, "
        "\"w_on_gpu\": %.3f, "
        "\"knn_on_gpu\": %.3f, \"knn_on_amx\": %.3f, \"conn_s\": %.4f, \"conn_keys\": %.5f, "
        "\"build_overlap_s\": %.4f, \"index_wait\": %d, \"index_ready_s\": %.4f, "
        "\"reference\": %d, \"omega_fnv\": \"%016llx\", "
        "\"exact_steps\": %d, \"decode_exact_ms\": %.3f, \"decode_indexed_ms\": %.3f",
        r->n_prompt, r->n_gen, r->ctx, r->prefill_s, r->ttft_s, t.prefill_tok_s, r->prefill_attn_s,
        t.total,
        peak_rss_mb(), r->mem_plan / 1048576.0, threads, a->temp, a->top_k, a->top_p, a->min_p,
        r->seed, ap->sink, ap->window, ap->topk, stats_ef(ap, r->n_prompt), !ap->ef,
        ap->mode == ATTN_RA && ap->warm,
        ap->nprobe, ap->nq_knn, ap->max_degree, ap->q_stride, A->n_query, ap->ef_conn, ap->n_entry,
        ap->mode == ATTN_RA ? ap->exact_below : 0,
        ap->cache_type & CACHE_K_F16 ? "f16" : "f32", ap->cache_type & CACHE_V_F16 ? "f16" : "f32",
        A->st.knn_s,
        r->build_s, t.scan, t.retrieval, t.attention, t.other, t.insert, t.audit, kv_bytes,
        index_bytes, r->gpu, gpu_peak_mb(), r->gpu_base_mb, r->gpu_plan_mb,
        A->active && r->steps && global_layers(&m->c)
            ? (double)attention_w_external(A) / ((double)r->steps * global_layers(&m->c))
            : 0.0,
        knn_share(m, A, 0), knn_share(m, A, 1), A->st.conn_s, conn_share(A),
        build_overlap(A), a->index_wait && ap->mode == ATTN_RA, index_ready_s(A, r),
        ap->reference && ap->mode == ATTN_RA, (unsigned long long)A->st.omega_fnv,
        r->exact_steps, r->exact_steps ? r->exact_s * 1000 / r->exact_steps : 0.0,
        r->steps > r->exact_steps ? (r->decode_s - r->exact_s) * 1000 / (r->steps - r->exact_steps)
                                  : 0.0);
    if (audit->n)
        fprintf(stats,
                ", \"recall_at_k\": %.5f, \"attn_mass\": %.5f, \"attn_mass_window\": %.5f, "
                "\"out_rel_err\": %.3e",
                audit->recall, audit->mass_w + audit->mass_omega, audit->mass_w, audit->err);
    if (a->prompt_cache)
        fprintf(stats, ", \"cached_tokens\": %d, \"prompt_cache\": \"%s\"", r->cached,
                r->cached == r->n_prompt ? "loaded"
                : r->cached        ? "prefix"
                : r->cache_saved ? "saved"
                                 : "none");
    if (r->stopped) fprintf(stats, ", \"interrupted\": \"%s\"", r->stopped);
    fprintf(stats, "}\n");
    if (ferror(stats) | fclose(stats)) die("--stats: write error on '%s'", a->stats);
}

/* path as an absolute name, its directory resolved (links followed), into out (n bytes) */
static void absolute_name(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX], real[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path + (slash == path)) : 1,
             slash ? path : ".");
    if (!realpath(dir, real)) snprintf(real, sizeof real, "%s", dir);
    snprintf(out, n, "%s/%s", real, slash ? slash + 1 : path);
}

enum { NAME_MAX_BYTES = 2 * PATH_MAX + 2 };   /* an absolute name: a resolved directory, a name */

/* where path leads: symbolic links followed, also to a file not made yet (as --stats follows
   them), as an absolute name (absolute_name) into out (NAME_MAX_BYTES) */
static void final_name(const char *path, char *out) {
    char cur[PATH_MAX], to[PATH_MAX];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hop = 0; hop < 40; hop++) {   /* 40: the kernel's own bound on a chain of links */
        struct stat st;
        ssize_t k;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode) ||
            (k = readlink(cur, to, sizeof to - 1)) < 0)
            break;
        to[k] = 0;
        char *next = link_target(cur, to);
        snprintf(cur, sizeof cur, "%s", next);
        free(next);
    }
    absolute_name(cur, out, NAME_MAX_BYTES);
}

/* 1 when paths a and b name the same regular file or directory: the same inode where both
   exist, the same final name where neither does (devices, FIFOs, empty names: never) */
static int same_path(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a[0] || !b[0]) return 0;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb)
        return (S_ISREG(sa.st_mode) || S_ISDIR(sa.st_mode)) && sa.st_dev == sb.st_dev &&
               sa.st_ino == sb.st_ino;
    if (ea || eb) return 0;
    char na[NAME_MAX_BYTES], nb[NAME_MAX_BYTES];
    final_name(a, na);
    final_name(b, nb);
    return !strcmp(na, nb);
}

/* 1 when path names a file directly inside directory dir */
static int inside_dir(const char *path, const char *dir) {
    char name[NAME_MAX_BYTES];
    if (!path[0] || !dir[0]) return 0;
    final_name(path, name);
    *strrchr(name, '/') = 0;   /* final_name's names are absolute: there is a '/' */
    return same_path(name[0] ? name : "/", dir);
}

/* The files a run writes (--stats; --prompt-cache and its FILE.tmp; --dump-qk's directory and
   the files in it; --trace-file and its F.tmp) must be apart from each other and from those it
   reads (-m, -f): --stats on
   the model would replace it with JSON after the run, and FILE.tmp on it would empty it while it
   is mapped. An input that does not exist is left to its own error. */
static void check_paths_apart(const Args *a) {
    char tmp[PATH_MAX + 8] = "", ttmp[PATH_MAX + 8] = "";
    if (a->prompt_cache) snprintf(tmp, sizeof tmp, "%s.tmp", a->prompt_cache);
    if (a->trace_file) snprintf(ttmp, sizeof ttmp, "%s.tmp", a->trace_file);
    enum { OUT = 6, ALL = 8 };   /* the run's outputs first, then the files it reads */
    const char *name[ALL] = {"--stats",   "--prompt-cache", "--prompt-cache's FILE.tmp",
                             "--dump-qk", "--trace-file",   "--trace-file's F.tmp", "-m", "-f"};
    const char *path[ALL] = {a->stats,   a->prompt_cache, a->prompt_cache ? tmp : NULL,
                             a->dump_qk, a->trace_file,   a->trace_file ? ttmp : NULL,
                             a->model,   a->prompt_file};
    struct stat st;
    for (int i = 0; i < OUT; i++)
        for (int j = i + 1; j < ALL; j++) {
            if (!path[i] || !path[j] || (j >= OUT && stat(path[j], &st) != 0) ||
                (i == 1 && j == 2) || (i == 4 && j == 5))
                continue;
            if (same_path(path[i], path[j]))
                die("%s and %s name the same file, '%s'", name[i], name[j], path[i]);
        }
    for (int j = 0; a->dump_qk && j < ALL; j++)
        if (j != 3 && path[j] && inside_dir(path[j], a->dump_qk))
            die("%s '%s' is inside --dump-qk's directory '%s', whose files the run writes", name[j],
                path[j], a->dump_qk);
}

/* A closed stdin, stdout or stderr gets /dev/null opened the other way: no file the run opens
 * (--dump-qk's, --stats) takes its number and the text meant for it, and using it fails as
 * before (EBADF), which is said */
static void hold_std_fds(void) {
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
        int got = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
        if (got >= 0 && got != fd) dup2(got, fd), close(got);
    }
}

int main(int argc, char **argv) {
    hold_std_fds();
    Args a = parse_args(argc, argv);
    char err[ERR_LEN];
    check_paths_apart(&a);
    if (a.dump_qk && a.conversation)
        die("--dump-qk writes one prompt's queries and its generation's: not with -cnv");
    if (a.dump_qk && a.prompt_cache)   /* a context file holds no queries */
        die("--dump-qk writes the prefill's queries, which --prompt-cache's file does not hold: "
            "give one or the other");
    if (a.stats) check_stats_target(a.stats, a.stats);
    say_unused_flags(&a);
    QKDump dump = {0};
    if (a.dump_qk) dump_open(&dump, a.dump_qk);

    Model m;
    if (build_model(&m, a.model, err)) die("%s", err);
    if (a.rope_scale > 0) model_set_rope_scale(&m, a.rope_scale);
    Run r = {0};
    int32_t *tokens = tokenize_prompt(&m, &a, &r);
    r.ctx = settle_context(&m, &a, r.n_prompt);
    AttnParams *ap = &a.attn;

    /* the set-up: memory, the GPU, the state and the attention; its refusals come before the
     * prefill starts */
    Context cx = {0};
    char gpu_msg[ERR_LEN];
    r.gpu = find_gpu(&a, gpu_msg);
    if (a.prompt_cache) context_probe(&cx, a.prompt_cache, &m, ap, tokens, r.n_prompt, r.gpu);
    r.cached = cx.reuse;
    Pool *pool = build_pool(a.threads);
    int started = pool_threads(pool);
    if (started < a.threads)   /* too little memory, or a process limit */
        fprintf(stderr, "ra: -t %d: only %d thread%s could start: running on %s\n", a.threads,
                started, plural(started), started > 1 ? "them" : "it");
    int cpus = cpu_count();
    if (a.threads > cpus)   /* only by -t: the default is cpu_count() */
        fprintf(stderr,
                "ra: -t %d is more threads than the %d CPU%s this process may run on: they will "
                "take turns, "
                "slower than -t %d\n",
                a.threads, cpus, plural(cpus), cpus);
    catch_interrupt();   /* from here Ctrl-C ends the run with its statistics */
    r.mem_plan = preflight_memory(&m, &a, r.ctx, r.n_prompt, pool_threads(pool), r.gpu, &cx);
    say_gpu(&a, r.gpu, gpu_msg);
    int gpu_batch = a.batch_set ? a.batch : 1024;
    if (gpu_batch > r.n_prompt) gpu_batch = r.n_prompt;
    if (r.gpu) r.gpu_plan_mb = preflight_gpu(&m.c, &a, ap, r.n_prompt, gpu_batch, &r.gpu_base_mb);
    ap->gpu = r.gpu;
    if (r.gpu && ap->mode == ATTN_RA && ap->nq_knn > KNN_GPU_MAX_KQ)
        fprintf(stderr,
                "ra: --nq %d is more than the GPU's KNN takes (%d): the index builds' KNN runs on "
                "the CPU\n",
                ap->nq_knn, KNN_GPU_MAX_KQ);
    State s;
    if (build_state(&s, &m, r.ctx, a.batch, a.attn.cache_type, pool, err)) die("%s", err);
    Attention *A = NULL;
    if (build_attention(&A, &m, ap, r.ctx, r.n_prompt, pool_threads(pool), err)) die("%s", err);
    attach_attention(&s, A);
    TraceOut trace = {0};
    trace_open(&trace, &m, &a, A);
    /* the tests' hooks of the builds: held back for good, or failing at one layer */
    if (getenv("RA_TEST_HOLD_BUILDS")) attention_hold_build(A, 1);
    if (getenv("RA_TEST_FAIL_BUILD")) attention_fail_build(A, atoi(getenv("RA_TEST_FAIL_BUILD")));
    int32_t *keep_row = NULL;   /* (n_prompt) State.q_keep_row */
    if (ap->mode == ATTN_RA && A->active && !a.dump_qk && !r.cached) {   /* for the builds */
        keep_row = xmalloc((size_t)r.n_prompt * sizeof *keep_row);
        s.q_keep_n = ra_query_slots(r.n_prompt, ap->q_stride, keep_row);
        s.q_keep_row = keep_row, s.q_keep_span = r.n_prompt;
        s.q_keep = malloc((size_t)s.q_keep_n * m.c.n_heads * m.c.head_dim * sizeof(float));
        if (!s.q_keep) die("out of memory keeping the prefill queries (%d tokens)", r.n_prompt);
    }
    if (a.dump_qk) dump_make(&dump), dump_attach(&dump, &m, &s, r.n_prompt, a.n_predict);
    GpuModel *g = NULL;
    if (r.gpu && build_gpu_model(&g, &m, &s, r.n_prompt, gpu_batch, err)) die("%s", err);
    /* said once nothing can refuse the run */
    if (ap->mode != ATTN_FULL && r.n_prompt <= ap->sink + ap->window)
        fprintf(stderr,
                "ra: the prompt (%d token%s) is not longer than sink + window (%d): running full "
                "attention\n",
                r.n_prompt, plural(r.n_prompt), ap->sink + ap->window);
    else if (ap->mode != ATTN_FULL && !A->active)
        fprintf(stderr,
                "ra: the prompt leaves %d key%s outside sink + window, fewer than --exact-below %d:"
                " running full attention, whose exact scan of so few is faster than a search\n",
                r.n_prompt - ap->sink - ap->window, plural(r.n_prompt - ap->sink - ap->window),
                ap->exact_below);
    if (ap->trace && !A->active)
        fprintf(stderr,
                "ra: --trace: the prompt runs full attention: no index, nothing to trace\n");
    if (ap->audit && !A->active)   /* --attn full, or a prompt that runs it */
        fprintf(stderr,
                "ra: --audit: full attention attends every key, so there is nothing to audit\n");

    float *logits = prefill(&m, g, &s, A, &a, &cx, tokens, &r);
    /* the seed given, or one from the clock; --stats reports it, so any run can be repeated */
    r.seed = a.seed >= 0 ? a.seed
                         : (long long)(((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)) >> 2);
    r.rng = (uint64_t)r.seed * 2654435761u + 1;
    if (!r.rng) r.rng = 1;
    A->st.retrieval_s = A->st.attention_s = A->st.audit_s = A->st.insert_s = 0;   /* decoding's */
    if (a.conversation && logits) converse(&m, g, &s, &a, &r);
    else generate(&m, g, &s, &a, logits, &r);
    finish_builds(A, &r);
    r.cache_saved = cx.saved;
    Rates rates = run_rates(A, &r);
    report(&m, A, ap, pool_threads(pool), &r, &rates);
    AuditSum audit = report_audit(&m, A, ap);
    if (a.stats) write_stats(&m, A, &a, pool_threads(pool), &r, &rates, &audit);
    if (a.dump_qk && !r.stopped) dump_finish(&dump, ap);
    if (a.dump_qk && r.stopped)
        fprintf(stderr, "ra: --dump-qk: interrupted, %s is incomplete (meta.json left empty)\n",
                a.dump_qk);
    free_dump(&dump);
    free_context(&cx);
    free_gpu_model(g);
    free(s.q_keep);
    free(keep_row);
    free_attention(A);
    trace_close(&trace);
    free(tokens);
    free_state(&s);
    free_pool(pool);
    free_model(&m);
    /* 128 + the signal, as a shell reports it: 130 for Ctrl-C, 143 for SIGTERM; 1 for a question
     * -cnv refused */
    return r.stopped ? 128 + atomic_load(&interrupted) : r.refused ? 1 : 0;
}
#endif
