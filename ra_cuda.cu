/* ra_cuda.cu - GPU twins of the CPU functions of ra.c (RetrievalAttention, Liu et al., 2024).
 *
 *   ra_cuda_init       is there a usable CUDA device?
 *   knn_topk_cuda      knn_topk of ra.c: exact top-k keys per prefill query (§3.2: "the KNN
 *                      results can be efficiently computed via GPU")
 *   attn_partial_cuda  attn_partial of ra.c (Eq. 4) for every query head at once, over a
 *                      contiguous range of positions: the static pattern W, which §3.3 keeps
 *                      on the GPU (Alg. 1 line 6)
 *   ra_cuda_free_all   frees the device buffers and the cuBLAS handle
 *
 * Every entry point takes host pointers, uploads what it needs and returns host results, so
 * each is a drop-in twin of its CPU function and is tested against it (tests/test_cuda.c).
 * Errors: 0 on success, -1 on a CUDA / cuBLAS error or an unsupported size, with a message
 * (file:line) on stderr; nothing here exits or aborts.
 *
 * Precision: scores are fp32 products summed in fp32. cuBLAS runs in CUBLAS_PEDANTIC_MATH, so
 * no TF32 tensor cores and no fp32 emulation (bf16x9) are used whatever the defaults or the
 * environment (NVIDIA_TF32_OVERRIDE, CUBLAS_EMULATE_SINGLE_PRECISION) say. The summation order
 * differs from dot8 in model.c, so scores differ from the CPU's in the last bits.
 *
 * nvcc -O2 -std=c++17 -arch=sm_80 -c ra_cuda.cu; link with -lcudart -lcublas. */
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

extern "C" {
#include "ra.h"
}

/* ------------------------------------------------------------------------ */
/* Error checks: print file:line and make the calling entry point return -1 */
/* ------------------------------------------------------------------------ */

static int cuda_check(cudaError_t e, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "[CUDA ERROR] at file %s:%d:\n%s\n", file, line, cudaGetErrorString(e));
    return -1;
}
static int cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    fprintf(stderr, "[cuBLAS ERROR] at file %s:%d:\n%s\n", file, line, cublasGetStatusString(s));
    return -1;
}
#define cudaCheck(call)   do { if (cuda_check((call), __FILE__, __LINE__)) return -1; } while (0)
#define cublasCheck(call) do { if (cublas_check((call), __FILE__, __LINE__)) return -1; } while (0)

/* ------------------------------------------------------------------------ */
/* Device buffers, grown on demand and kept between calls                   */
/* ------------------------------------------------------------------------ */

enum { BUF_K, BUF_Q, BUF_S, BUF_BEST_S, BUF_BEST_ID,      /* knn_topk_cuda */
       BUF_AQ, BUF_AK, BUF_AV, BUF_AOUT, NBUF };          /* attn_partial_cuda */
static void *dbuf[NBUF];
static size_t dbuf_cap[NBUF];
static cublasHandle_t blas;

/* buffer b with room for at least `bytes`, or NULL (message on stderr) */
static void *dev_buf(int b, size_t bytes) {
    if (bytes < 256) bytes = 256;
    if (bytes <= dbuf_cap[b]) return dbuf[b];
    if (dbuf[b]) cudaFree(dbuf[b]);
    dbuf[b] = NULL, dbuf_cap[b] = 0;
    if (cuda_check(cudaMalloc(&dbuf[b], bytes), __FILE__, __LINE__)) { dbuf[b] = NULL; return NULL; }
    dbuf_cap[b] = bytes;
    return dbuf[b];
}

/* the cuBLAS handle, created on first use in pedantic fp32 (see the top of the file) */
static int ensure_blas(void) {
    if (blas) return 0;
    cublasCheck(cublasCreate(&blas));
    cublasCheck(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH));
    return 0;
}

extern "C" void ra_cuda_free_all(void) {
    for (int b = 0; b < NBUF; b++) {
        if (dbuf[b]) cudaFree(dbuf[b]);
        dbuf[b] = NULL, dbuf_cap[b] = 0;
    }
    if (blas) cublasDestroy(blas);
    blas = NULL;
}

extern "C" int ra_cuda_init(char *msg, size_t n) {
    char tmp[ERR_LEN];
    if (!msg || n == 0) msg = tmp, n = sizeof tmp;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);   /* an error, not a crash, without a driver */
    if (e != cudaSuccess) {
        snprintf(msg, n, "no CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();                       /* clear it */
        return 0;
    }
    if (count == 0) { snprintf(msg, n, "no CUDA device: cudaGetDeviceCount found none"); return 0; }
    void *p = NULL;
    if ((e = cudaMalloc(&p, 256)) != cudaSuccess) {   /* a context and an allocation work */
        snprintf(msg, n, "CUDA device unusable: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    cudaFree(p);
    if (ensure_blas()) { snprintf(msg, n, "CUDA device unusable: cuBLAS did not start"); return 0; }
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        snprintf(msg, n, "CUDA device unusable: no properties");
        return 0;
    }
    snprintf(msg, n, "device %d of %d: %s, sm_%d%d, %.0f MiB", dev, count, prop.name, prop.major,
             prop.minor, (double)prop.totalGlobalMem / 1048576.0);
    return 1;
}

/* ======================================================================== */
/* Exact top-k (§3.2): S = Q K^T by cuBLAS in tiles, a block-level top-kq    */
/* selection per query                                                      */
/* ======================================================================== */

#define KNN_QT      4096   /* queries per tile */
#define KNN_KT      4096   /* keys per tile: S is at most KNN_QT x KNN_KT floats (64 MiB) */
#define KNN_THREADS 256    /* threads per query block: the scores offered per round */
#define KNN_KQ_MAX  1024   /* largest kq */
#define KNN_P_MAX   2048   /* shared list: a power of two >= KNN_KQ_MAX + KNN_THREADS */

/* "better" = higher score, then lower key id: hit_better of ra.c, the tie rule of every top-k */
__device__ __forceinline__ bool better(float sa, int32_t ia, float sb, int32_t ib) {
    return sa > sb || (sa == sb && ia < ib);
}

/* Sorts the P pairs (s, id) in shared memory best first (P a power of two): Batcher's bitonic
 * network. In stage (k, j) element i meets element i ^ j; blocks of k elements alternate
 * direction, and the last stage (k = P) leaves one sequence, best first. */
__device__ void bitonic_sort(float *s, int32_t *id, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                int l = i ^ j;
                if (l <= i) continue;
                bool best_first = (i & k) == 0;
                if (best_first ? better(s[l], id[l], s[i], id[i]) : better(s[i], id[i], s[l], id[l])) {
                    float ts = s[i]; s[i] = s[l]; s[l] = ts;
                    int32_t ti = id[i]; id[i] = id[l]; id[l] = ti;
                }
            }
            __syncthreads();
        }
}

/* Sorts the kept list with the candidates, keeps the best kq in [0, kq), empties [kq, P). */
__device__ void knn_flush(float *ss, int32_t *si, int P, int kq, int *count) {
    __syncthreads();   /* every candidate is written */
    bitonic_sort(ss, si, P);
    for (int i = kq + threadIdx.x; i < P; i += blockDim.x) ss[i] = -INFINITY, si[i] = INT32_MAX;
    if (threadIdx.x == 0) *count = 0;
    __syncthreads();
}

/* One block per query of the tile: its best kq keys so far, best first, come from
 * best_s/best_id (none on the first key tile: empty slots are (-inf, INT32_MAX)); the scores
 * S[q, 0..nkt) of keys k0.. are offered. A key better than the kq-th best kept joins the
 * candidate area [kq, P) of shared memory; a full area is sorted into the list (knn_flush),
 * which raises the bar, so later tiles admit few keys. */
__global__ void knn_select_kernel(const float *S, int nkt, int k0, int kq, int P, int first,
                                  float *best_s, int32_t *best_id) {
    __shared__ float ss[KNN_P_MAX];
    __shared__ int32_t si[KNN_P_MAX];
    __shared__ int count;                             /* candidates in [kq, kq + count) */
    const float *row = S + (size_t)blockIdx.x * nkt;  /* the scores of this query */
    float *bs = best_s + (size_t)blockIdx.x * kq;
    int32_t *bi = best_id + (size_t)blockIdx.x * kq;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        bool kept = i < kq && !first;
        ss[i] = kept ? bs[i] : -INFINITY;
        si[i] = kept ? bi[i] : INT32_MAX;
    }
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int j0 = 0; j0 < nkt; j0 += blockDim.x) {
        int c = count;
        __syncthreads();                              /* all threads decide on the same c */
        if (c > P - kq - (int)blockDim.x) knn_flush(ss, si, P, kq, &count);  /* room for a round */
        float ts = ss[kq - 1];                        /* the kq-th best kept: the bar */
        int32_t ti = si[kq - 1];
        int j = j0 + threadIdx.x;
        if (j < nkt && better(row[j], k0 + j, ts, ti)) {
            int slot = kq + atomicAdd(&count, 1);
            ss[slot] = row[j], si[slot] = k0 + j;
        }
        __syncthreads();
    }
    if (count > 0) knn_flush(ss, si, P, kq, &count);
    for (int i = threadIdx.x; i < kq; i += blockDim.x) bs[i] = ss[i], bi[i] = si[i];
}

/* Exact top-kq keys (rows of K, nk x d, stride ld) of each query (rows of Q, nq x d, stride
 * ldq) by inner product, best first, ties to the lower id, rows of ids_out (nq, kq) padded with
 * -1 when nk < kq: knn_topk's contract, kq <= KNN_KQ_MAX. K is uploaded once; queries go in
 * tiles of KNN_QT and keys in tiles of KNN_KT, so device memory is nk*d + tiles, never nq*nk. */
extern "C" int knn_topk_cuda(const float *Q, int nq, int ldq, const float *K, int nk, int ld, int d,
                             int kq, int32_t *ids_out) {
    if (kq <= 0 || nq <= 0) return 0;
    if (kq > KNN_KQ_MAX || d <= 0 || ldq < d || ld < d) {
        fprintf(stderr, "knn_topk_cuda: unsupported kq %d (max %d), d %d, ldq %d, ld %d\n", kq, KNN_KQ_MAX, d, ldq, ld);
        return -1;
    }
    if (nk <= 0) {
        for (size_t i = 0; i < (size_t)nq * kq; i++) ids_out[i] = -1;
        return 0;
    }
    int P = 1;                                        /* kept list + one round of candidates */
    while (P < kq + KNN_THREADS) P <<= 1;
    int qt = nq < KNN_QT ? nq : KNN_QT, kt = nk < KNN_KT ? nk : KNN_KT;
    if (ensure_blas()) return -1;
    float *dK = (float *)dev_buf(BUF_K, (size_t)nk * d * sizeof(float));          /* (nk, d) */
    float *dQ = (float *)dev_buf(BUF_Q, (size_t)qt * d * sizeof(float));          /* (qt, d) */
    float *dS = (float *)dev_buf(BUF_S, (size_t)qt * kt * sizeof(float));         /* (qt, kt) */
    float *best_s = (float *)dev_buf(BUF_BEST_S, (size_t)qt * kq * sizeof(float));         /* (qt, kq) */
    int32_t *best_id = (int32_t *)dev_buf(BUF_BEST_ID, (size_t)qt * kq * sizeof(int32_t)); /* (qt, kq) */
    if (!dK || !dQ || !dS || !best_s || !best_id) return -1;
    cudaCheck(cudaMemcpy2D(dK, (size_t)d * sizeof(float), K, (size_t)ld * sizeof(float),
                           (size_t)d * sizeof(float), (size_t)nk, cudaMemcpyHostToDevice));
    const float one = 1.0f, zero = 0.0f;
    for (int q0 = 0; q0 < nq; q0 += KNN_QT) {
        int nqt = nq - q0 < KNN_QT ? nq - q0 : KNN_QT;
        cudaCheck(cudaMemcpy2D(dQ, (size_t)d * sizeof(float), Q + (size_t)q0 * ldq, (size_t)ldq * sizeof(float),
                               (size_t)d * sizeof(float), (size_t)nqt, cudaMemcpyHostToDevice));
        for (int k0 = 0; k0 < nk; k0 += KNN_KT) {
            int nkt = nk - k0 < KNN_KT ? nk - k0 : KNN_KT;
            /* S = Q_tile K_tile^T with row q contiguous. cuBLAS is column-major: it sees the
             * row-major K_tile (nkt, d) as A (d x nkt) and Q_tile (nqt, d) as B (d x nqt);
             * C = A^T B (nkt x nqt, ld nkt) has q.k_j at j + q*nkt, so column q is row q of S. */
            cublasCheck(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, nkt, nqt, d, &one,
                                    dK + (size_t)k0 * d, d, dQ, d, &zero, dS, nkt));
            knn_select_kernel<<<nqt, KNN_THREADS>>>(dS, nkt, k0, kq, P, k0 == 0, best_s, best_id);
            cudaCheck(cudaGetLastError());
        }
        int32_t *out = ids_out + (size_t)q0 * kq;
        cudaCheck(cudaMemcpy(out, best_id, (size_t)nqt * kq * sizeof(int32_t), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)nqt * kq; i++)
            if (out[i] == INT32_MAX) out[i] = -1;     /* an empty slot: nk < kq */
    }
    return 0;
}

/* ======================================================================== */
/* Partial attention over a range of positions (Eq. 4), one block per head  */
/* ======================================================================== */

#define ATT_THREADS 128    /* 4 warps */
#define ATT_T       64     /* keys per tile */
#define ATT_DMAX    512    /* largest head dimension */

/* Eq. (4) for query head h = blockIdx.x over keys 0..n-1 of its KV head (K, V: (n_kv, n, d)):
 * o = sum_i e^{z_i - zmax} v_i / sumexp, z_i = scale * q.k_i, zmax the local max (z~ of Eq. 4),
 * sumexp = sum_i e^{z_i - zmax}. As attn_partial in ra.c: one pass with a running max
 * (FlashAttention's online softmax), weights and sums in double. GQA: head h reads KV head
 * h / group. Each tile: a warp scores a key, then every thread rescales and adds to its own
 * dimensions of the accumulator. */
__global__ void attn_partial_kernel(const float *q, const float *K, const float *V, int n, int d,
                                    int group, float scale, float *o, float *zmax, float *sumexp) {
    __shared__ float qs[ATT_DMAX];
    __shared__ double acc[ATT_DMAX];                  /* sum of e^{z_i - m} v_i */
    __shared__ double z[ATT_T], p[ATT_T];             /* the tile's scores, weights */
    int h = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
    const float *Kh = K + (size_t)(h / group) * n * d, *Vh = V + (size_t)(h / group) * n * d;
    for (int i = tid; i < d; i += blockDim.x) qs[i] = q[(size_t)h * d + i], acc[i] = 0.0;
    __syncthreads();
    double m = -INFINITY, s = 0.0;                    /* running max and sum: the same in every thread */
    for (int j0 = 0; j0 < n; j0 += ATT_T) {
        int nt = n - j0 < ATT_T ? n - j0 : ATT_T;
        for (int j = warp; j < nt; j += nwarps) {     /* z_j = scale * q.k_j, lanes over the dims */
            const float *k = Kh + (size_t)(j0 + j) * d;
            float dot = 0.0f;
            for (int i = lane; i < d; i += 32) dot += qs[i] * k[i];
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0) z[j] = (double)(scale * dot);   /* the float product, as attn_partial */
        }
        __syncthreads();
        double mt = m;                                /* the new running max */
        for (int j = 0; j < nt; j++) mt = fmax(mt, z[j]);
        double r = exp(m - mt);                       /* rescales what came before (0 at first) */
        for (int j = tid; j < nt; j += blockDim.x) p[j] = exp(z[j] - mt);
        __syncthreads();
        s *= r;
        for (int j = 0; j < nt; j++) s += p[j];
        for (int i = tid; i < d; i += blockDim.x) {
            double a = acc[i] * r;
            for (int j = 0; j < nt; j++) a += p[j] * Vh[(size_t)(j0 + j) * d + i];
            acc[i] = a;
        }
        m = mt;
        __syncthreads();                              /* z, p are rewritten by the next tile */
    }
    for (int i = tid; i < d; i += blockDim.x) o[(size_t)h * d + i] = s > 0.0 ? (float)(acc[i] / s) : 0.0f;
    if (tid == 0) zmax[h] = (float)m, sumexp[h] = (float)s;   /* empty: -inf, 0 */
}

/* attn_partial for the n_heads query heads q (n_heads, d) over positions [p0, p1) of K, V
 * (n_kv_heads, ctx, d), the layout of a layer of State's cache; head h reads KV head
 * h / (n_heads / n_kv_heads). Outputs o (n_heads, d), zmax, sumexp (n_heads), each head as
 * attn_partial(q_h, K_kvh + p0*d, d, V_kvh + p0*d, d, NULL, p1 - p0, d, scale, ...) defines
 * them. Only the range is uploaded. */
extern "C" int attn_partial_cuda(const float *q, int n_heads, const float *K, const float *V, int n_kv_heads,
                                 int ctx, int p0, int p1, int d, float scale,
                                 float *o, float *zmax, float *sumexp) {
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || d <= 0 || d > ATT_DMAX ||
        p0 < 0 || p1 < p0 || p1 > ctx) {
        fprintf(stderr, "attn_partial_cuda: unsupported heads %d/%d, d %d (max %d), range [%d, %d) of %d\n",
                n_heads, n_kv_heads, d, ATT_DMAX, p0, p1, ctx);
        return -1;
    }
    int n = p1 - p0;
    size_t head = (size_t)n * d * sizeof(float);      /* bytes of one KV head's range */
    float *dq = (float *)dev_buf(BUF_AQ, (size_t)n_heads * d * sizeof(float));
    float *dK = (float *)dev_buf(BUF_AK, head * n_kv_heads);                     /* (n_kv, n, d) */
    float *dV = (float *)dev_buf(BUF_AV, head * n_kv_heads);
    float *dout = (float *)dev_buf(BUF_AOUT, (size_t)n_heads * (d + 2) * sizeof(float)); /* o, zmax, sumexp */
    if (!dq || !dK || !dV || !dout) return -1;
    cudaCheck(cudaMemcpy(dq, q, (size_t)n_heads * d * sizeof(float), cudaMemcpyHostToDevice));
    for (int g = 0; g < n_kv_heads && n > 0; g++) {
        size_t src = ((size_t)g * ctx + p0) * d;
        cudaCheck(cudaMemcpy((char *)dK + g * head, K + src, head, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy((char *)dV + g * head, V + src, head, cudaMemcpyHostToDevice));
    }
    float *d_o = dout, *d_zmax = dout + (size_t)n_heads * d, *d_sumexp = d_zmax + n_heads;
    attn_partial_kernel<<<n_heads, ATT_THREADS>>>(dq, dK, dV, n, d, n_heads / n_kv_heads, scale,
                                                  d_o, d_zmax, d_sumexp);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(o, d_o, (size_t)n_heads * d * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(zmax, d_zmax, (size_t)n_heads * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(sumexp, d_sumexp, (size_t)n_heads * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}
