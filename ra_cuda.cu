/* ra_cuda.cu - GPU twins of ra's CPU functions (RetrievalAttention, Liu et al., 2024). Each
 * takes host pointers and returns host results, a drop-in for its CPU function, and is tested
 * against it (tests/test_cuda.c); 0 on success, -1 with one line on stderr, never an exit.
 *
 *   knn_topk_cuda      knn_topk (§3.2: "the KNN results can be efficiently computed via GPU")
 *   attn_partial_cuda  attn_partial (Eq. 4) over a range of positions for every head: o_W of
 *                      the static pattern W, which §3.3 keeps on the GPU (Alg. 1 line 6)
 *   attn_causal_cuda   attn_causal (model.c) by the fused kernel of the prefill
 *   build_gpu_model, forward_cuda, free_gpu_model   the model on the device, forward's twin
 *   ra_cuda_init, ra_cuda_free_all, gpu_plan, gpu_free_mb, gpu_peak_mb   the device itself
 *
 * Precision: scores are fp32 products summed in fp32 (cuBLAS pedantic: never TF32), in another
 * order than dot8, so the last bits differ from the CPU's. The weight GEMMs and the prefill's
 * fused attention take fp16 operands with fp32 sums. */
#include <float.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>

extern "C" {
#include "ra.h"
}

/* ------------------------------------------------------------------------ */
/* Error checks: print file:line and make the calling entry point return -1 */
/* ------------------------------------------------------------------------ */

static int cuda_check(cudaError_t e, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    /* one line */
    fprintf(stderr, "ra_cuda: CUDA error at %s:%d: %s\n", file, line, cudaGetErrorString(e));
    return -1;
}
static int cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    fprintf(stderr, "ra_cuda: cuBLAS error at %s:%d: %s\n", file, line, cublasGetStatusString(s));
    return -1;
}
#define cudaCheck(call)   do { if (cuda_check((call), __FILE__, __LINE__)) return -1; } while (0)
#define cublasCheck(call) do { if (cublas_check((call), __FILE__, __LINE__)) return -1; } while (0)

/* ------------------------------------------------------------------------ */
/* Device buffers, grown on demand and kept between calls                   */
/* ------------------------------------------------------------------------ */

enum { BUF_K, BUF_Q, BUF_S, BUF_BEST_S, BUF_BEST_ID,      /* knn_topk_cuda */
       BUF_COL_S, BUF_COL_Q,                             /* ... its best query per key */
       BUF_AQ, BUF_AK, BUF_AV, BUF_AOUT,                 /* attn_partial_cuda, attn_causal_cuda */
       BUF_AKH, BUF_AVH, NBUF };                         /* attn_causal_cuda's fp16 K, V */
static void *dbuf[NBUF];
static size_t dbuf_cap[NBUF];
static cublasHandle_t blas;        /* the KNN's, on knn_stream */
static cudaStream_t knn_stream;    /* the KNN's, at the device's lowest priority */

/* buffer b with room for at least `bytes`, or NULL (message on stderr) */
static void *dev_buf(int b, size_t bytes) {
    if (bytes < 256) bytes = 256;
    if (bytes <= dbuf_cap[b]) return dbuf[b];
    if (dbuf[b]) cudaFree(dbuf[b]);
    dbuf[b] = NULL, dbuf_cap[b] = 0;
    if (cuda_check(cudaMalloc(&dbuf[b], bytes), __FILE__, __LINE__)) {
        cudaGetLastError(); /* clear it, or this thread's next cudaGetLastError reports it again */
        dbuf[b] = NULL;
        return NULL;
    }
    dbuf_cap[b] = bytes;
    return dbuf[b];
}

/* the cuBLAS handle, created on first use in pedantic fp32 (see the top of the file), on a stream
 * of the lowest priority: the index builds' KNN runs beside the prefill and decoding, whose
 * kernels the device schedules first */
static int ensure_blas(void) {
    if (blas) return 0;
    int least = 0, greatest = 0;   /* least: the lowest priority, the greatest number */
    if (!knn_stream) {
        cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        cudaCheck(cudaStreamCreateWithPriority(&knn_stream, cudaStreamNonBlocking, least));
    }
    cublasCheck(cublasCreate(&blas));
    if (cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(blas, knn_stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "ra_cuda: cuBLAS refused pedantic fp32 math or the KNN's stream\n");
        cublasDestroy(blas);   /* never keep a handle that may use TF32 */
        blas = NULL;
        return -1;
    }
    return 0;
}

extern "C" void ra_cuda_free_all(void) {
    for (int b = 0; b < NBUF; b++) {
        if (dbuf[b]) cudaFree(dbuf[b]);
        dbuf[b] = NULL, dbuf_cap[b] = 0;
    }
    if (blas) cublasDestroy(blas);
    blas = NULL;
    if (knn_stream) cudaStreamDestroy(knn_stream);
    knn_stream = NULL;
}

/* a kernel that does nothing: is there code in this build for the device's architecture? */
static __global__ void probe_kernel(void) {}

extern "C" int ra_cuda_init(char *msg, size_t n) {
    char tmp[ERR_LEN];
    if (!msg || n == 0) msg = tmp, n = sizeof tmp;
    int count = 0, driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
        cudaGetLastError();
        snprintf(msg, n, "no CUDA driver");
        return 0;
    }
    cudaError_t e = cudaGetDeviceCount(&count);   /* an error, not a crash, without a driver */
    if (e != cudaSuccess) {
        snprintf(msg, n, "no CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();                       /* clear it */
        return 0;
    }
    if (count == 0) { snprintf(msg, n, "no CUDA device: cudaGetDeviceCount found none"); return 0; }
    /* a host thread waiting for the GPU sleeps rather than spins: during decoding the CPU's cores
     * belong to the index searches (before the context exists; an error if it already does) */
    cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    cudaGetLastError();
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
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, probe_kernel)) !=
        cudaSuccess) { /* e.g. sm_75 with sm_80+ code */
        snprintf(msg, n,
                 "%s (sm_%d%d) unusable: %s (make builds for sm_80 and later; CUDA_GENCODE= adds "
                 "others)",
                 prop.name, prop.major, prop.minor, cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    snprintf(msg, n, "device %d of %d: %s, sm_%d%d, %.0f MiB", dev, count, prop.name, prop.major,
             prop.minor, (double)prop.totalGlobalMem / 1048576.0);
    return 1;
}

/* ======================================================================== */
/* Exact top-k (§3.2): S = Q K^T by cuBLAS in tiles, a block-level top-Nq    */
/* selection per query                                                      */
/* ======================================================================== */

#define KNN_QT      4096   /* queries per tile */
#define KNN_KT      4096   /* keys per tile: S is at most KNN_QT x KNN_KT floats (64 MiB) */
#define KNN_THREADS 256    /* threads per query block: the scores offered per round */
/* bytes: queries farther apart are copied row by row (cudaMemcpy2D refuses a pitch past the
 * device's cudaDevAttrMaxPitch, 2^31 - 1 bytes on current GPUs) */
#define KNN_MAX_PITCH ((size_t)1 << 30)
#define KNN_P_MAX   2048   /* shared list: a power of two >= KNN_GPU_MAX_KQ + KNN_THREADS */

/* "better" = higher score, then lower key id: hit_better of ra.c, the tie rule of every top-k */
static __device__ __forceinline__ bool better(float sa, int32_t ia, float sb, int32_t ib) {
    return sa > sb || (sa == sb && ia < ib);
}

/* Sorts the P pairs (s, id) in shared memory best first (P a power of two): Batcher's bitonic
 * network. In stage (k, j) element i meets element i ^ j; blocks of k elements alternate
 * direction, and the last stage (k = P) leaves one sequence, best first. */
static __device__ void bitonic_sort(float *s, int32_t *id, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                int l = i ^ j;
                if (l <= i) continue;
                bool best_first = (i & k) == 0;
                if (best_first ? better(s[l], id[l], s[i], id[i])
                               : better(s[i], id[i], s[l], id[l])) {
                    float ts = s[i]; s[i] = s[l]; s[l] = ts;
                    int32_t ti = id[i]; id[i] = id[l]; id[l] = ti;
                }
            }
            __syncthreads();
        }
}

/* Sorts the kept list with the candidates, keeps the best Nq in [0, Nq), empties [Nq, P). */
static __device__ void knn_flush(float *ss, int32_t *si, int P, int Nq, int *count) {
    __syncthreads();   /* every candidate is written */
    bitonic_sort(ss, si, P);
    for (int i = Nq + threadIdx.x; i < P; i += blockDim.x) ss[i] = -INFINITY, si[i] = INT32_MAX;
    if (threadIdx.x == 0) *count = 0;
    __syncthreads();
}

/* One block per query of the tile: the scores S[q, 0..nkt) of keys k0.. are offered to its best
 * Nq so far, best first, in best_s/best_id (none on the first key tile: empty slots are (-inf,
 * INT32_MAX)) */
static __global__ void knn_select_kernel(const float *S, int nkt, int k0, int Nq, int P, int first,
                                  float *best_s, int32_t *best_id) {
    /* A key better than the Nq-th best kept joins the candidate area [Nq, P) of shared memory; a
     * full area is sorted into the list (knn_flush), which raises the bar, so later tiles admit
     * few keys. */
    __shared__ float ss[KNN_P_MAX];
    __shared__ int32_t si[KNN_P_MAX];
    __shared__ int count;                             /* candidates in [Nq, Nq + count) */
    const float *row = S + (size_t)blockIdx.x * nkt;  /* the scores of this query */
    float *bs = best_s + (size_t)blockIdx.x * Nq;
    int32_t *bi = best_id + (size_t)blockIdx.x * Nq;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        bool kept = i < Nq && !first;
        ss[i] = kept ? bs[i] : -INFINITY;
        si[i] = kept ? bi[i] : INT32_MAX;
    }
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int j0 = 0; j0 < nkt; j0 += blockDim.x) {
        int c = count;
        __syncthreads();                              /* all threads decide on the same c */
        if (c > P - Nq - (int)blockDim.x) knn_flush(ss, si, P, Nq, &count);  /* room for a round */
        float ts = ss[Nq - 1];                        /* the Nq-th best kept: the bar */
        int32_t ti = si[Nq - 1];
        int j = j0 + threadIdx.x;
        if (j < nkt && better(row[j], k0 + j, ts, ti)) {
            int slot = Nq + atomicAdd(&count, 1);
            ss[slot] = row[j], si[slot] = k0 + j;
        }
        __syncthreads();
    }
    if (count > 0) knn_flush(ss, si, P, Nq, &count);
    for (int i = threadIdx.x; i < Nq; i += blockDim.x) bs[i] = ss[i], bi[i] = si[i];
}

/* Each key's best query (top_query of knn_topk): thread j reads column j of S (nqt queries from
 * q0, row q at q * nkt; coalesced across j) and keeps the higher score, a tie the lower query,
 * NaN never; col_s, col_q (nk) hold the best of the earlier query tiles (first: none yet). */
static __global__ void knn_col_best_kernel(const float *S, int nkt, int nqt, int k0, int q0, int first,
                                    float *col_s, int32_t *col_q) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= nkt) return;
    float best = first ? -INFINITY : col_s[k0 + j];
    int32_t arg = first ? -1 : col_q[k0 + j];
    for (int q = 0; q < nqt; q++) {
        float s = S[(size_t)q * nkt + j];
        if (s > best) best = s, arg = q0 + q;
    }
    col_s[k0 + j] = best, col_q[k0 + j] = arg;
}

/* Exact top-Nq keys (rows of K, nk x d, stride ld) of each query (rows of Q, nq x d, stride
 * ldq) by inner product, best first, ties to the lower id, rows of ids_out (nq, Nq) padded with
 * -1 when nk < Nq: knn_topk's contract, Nq <= KNN_GPU_MAX_KQ. K is uploaded once; queries go in
 * tiles of KNN_QT and keys in tiles of KNN_KT, so device memory is nk*d + tiles, never nq*nk. */
static int knn_topk_locked(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld,
                           int d, int Nq, int32_t *ids_out, int32_t *top_query);
static void gpu_sample_memory(void);

/* One caller at a time: the index builds of a layer's heads run on the host threads and share the
 * device buffers; while one head's KNN runs on the GPU the others project on the CPU. After an
 * error that CUDA cannot clear (a lost context: every later call would fail the same way) it
 * returns -1 at once, so that the heads still to build fall back without an error line each. */
extern "C" int knn_topk_cuda(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld,
                             int d, int Nq, int32_t *ids_out, int32_t *top_query) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int device_lost;
    pthread_mutex_lock(&lock);
    int rc = device_lost ? -1 : knn_topk_locked(Q, nq, ldq, K, nk, ld, d, Nq, ids_out, top_query);
    if (rc && !device_lost) {
        cudaGetLastError();   /* the caller falls back to the CPU: leave no error behind */
        /* still failing: a sticky error */
        if (cudaDeviceSynchronize() != cudaSuccess) device_lost = 1;
    }
    gpu_sample_memory();
    pthread_mutex_unlock(&lock);
    return rc;
}

static int knn_topk_locked(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld,
                           int d, int Nq, int32_t *ids_out, int32_t *top_query) {
    if (Nq <= 0 || nq <= 0) {
        for (int j = 0; top_query && j < nk; j++) top_query[j] = -1;
        return 0;
    }
    if (Nq > KNN_GPU_MAX_KQ || d <= 0 || ldq < (size_t)d || ld < d) {
        fprintf(stderr, "knn_topk_cuda: unsupported Nq %d (max %d), d %d, ldq %zu, ld %d\n", Nq,
                KNN_GPU_MAX_KQ, d, ldq, ld);
        return -1;
    }
    if (nk <= 0) {
        for (size_t i = 0; i < (size_t)nq * Nq; i++) ids_out[i] = -1;
        return 0;
    }
    int P = 1;                                        /* kept list + one round of candidates */
    while (P < Nq + KNN_THREADS) P <<= 1;
    int qt = nq < KNN_QT ? nq : KNN_QT, kt = nk < KNN_KT ? nk : KNN_KT;
    if (ensure_blas()) return -1;
    float *dK = (float *)dev_buf(BUF_K, (size_t)nk * d * sizeof(float));          /* (nk, d) */
    float *dQ = (float *)dev_buf(BUF_Q, (size_t)qt * d * sizeof(float));          /* (qt, d) */
    float *dS = (float *)dev_buf(BUF_S, (size_t)qt * kt * sizeof(float));         /* (qt, kt) */
    float *best_s = (float *)dev_buf(BUF_BEST_S, (size_t)qt * Nq * sizeof(float)); /* (qt, Nq) */
    /* (qt, Nq) */
    int32_t *best_id = (int32_t *)dev_buf(BUF_BEST_ID, (size_t)qt * Nq * sizeof(int32_t));
    float *col_s = top_query ? (float *)dev_buf(BUF_COL_S, (size_t)nk * sizeof(float)) : NULL;
    int32_t *col_q =                                                               /* (nk) */
        top_query ? (int32_t *)dev_buf(BUF_COL_Q, (size_t)nk * sizeof(int32_t)) : NULL;
    if (!dK || !dQ || !dS || !best_s || !best_id || (top_query && (!col_s || !col_q))) return -1;
    cudaStream_t st = knn_stream;   /* every copy and kernel below in order on it */
    cudaCheck(cudaMemcpy2DAsync(dK, (size_t)d * sizeof(float), K, (size_t)ld * sizeof(float),
                                (size_t)d * sizeof(float), (size_t)nk, cudaMemcpyHostToDevice, st));
    const float one = 1.0f, zero = 0.0f;
    for (int q0 = 0; q0 < nq; q0 += KNN_QT) {
        int nqt = nq - q0 < KNN_QT ? nq - q0 : KNN_QT;
        if (ldq * sizeof(float) <= KNN_MAX_PITCH) {
            cudaCheck(cudaMemcpy2DAsync(dQ, (size_t)d * sizeof(float), Q + (size_t)q0 * ldq,
                                        ldq * sizeof(float), (size_t)d * sizeof(float),
                                        (size_t)nqt, cudaMemcpyHostToDevice, st));
        } else {   /* rows farther apart than a 2D copy's pitch (--q-stride): one by one */
            for (int r = 0; r < nqt; r++)
                cudaCheck(cudaMemcpyAsync(dQ + (size_t)r * d, Q + (size_t)(q0 + r) * ldq,
                                          (size_t)d * sizeof(float), cudaMemcpyHostToDevice, st));
        }
        for (int k0 = 0; k0 < nk; k0 += KNN_KT) {
            int nkt = nk - k0 < KNN_KT ? nk - k0 : KNN_KT;
            /* S = Q_tile K_tile^T with row q contiguous. cuBLAS is column-major: it sees the
             * row-major K_tile (nkt, d) as A (d x nkt) and Q_tile (nqt, d) as B (d x nqt);
             * C = A^T B (nkt x nqt, ld nkt) has q.k_j at j + q*nkt, so column q is row q of S. */
            cublasCheck(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, nkt, nqt, d, &one,
                                    dK + (size_t)k0 * d, d, dQ, d, &zero, dS, nkt));
            knn_select_kernel<<<nqt, KNN_THREADS, 0, st>>>(dS, nkt, k0, Nq, P, k0 == 0, best_s,
                                                           best_id);
            cudaCheck(cudaGetLastError());
            if (top_query) {
                knn_col_best_kernel<<<(nkt + KNN_THREADS - 1) / KNN_THREADS, KNN_THREADS, 0, st>>>(
                    dS, nkt, nqt, k0, q0, q0 == 0, col_s, col_q);
                cudaCheck(cudaGetLastError());
            }
        }
        int32_t *out = ids_out + (size_t)q0 * Nq;
        cudaCheck(cudaMemcpyAsync(out, best_id, (size_t)nqt * Nq * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st));
        cudaCheck(cudaStreamSynchronize(st));
        for (size_t i = 0; i < (size_t)nqt * Nq; i++)
            if (out[i] == INT32_MAX) out[i] = -1;     /* an empty slot: nk < Nq */
    }
    if (top_query) {
        cudaCheck(cudaMemcpyAsync(top_query, col_q, (size_t)nk * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st));
        cudaCheck(cudaStreamSynchronize(st));
    }
    return 0;
}

/* ======================================================================== */
/* Partial attention over a range of positions (Eq. 4), one block per head  */
/* ======================================================================== */

#define ATT_THREADS 128    /* 4 warps */
#define ATT_T       64     /* keys per tile */
#define ATT_DMAX    512    /* largest head dimension */

/* Eq. (4) for query head h = blockIdx.x over keys 0..n-1 of KV head h / group (K, V: (n_kv, n,
 * d)): o, its local max zmax (z~) and sumexp = sum_i e^{z_i - zmax}, as attn_partial in ra.c,
 * in one pass with a running max (FlashAttention's online softmax), weights and sums in double */
static __global__ void attn_partial_kernel(const float *q, const float *K, const float *V, int n, int d,
                                    int group, float scale, float *o, float *zmax, float *sumexp) {
    /* each tile: a warp scores a key, then every thread rescales and adds to its own dimensions
     * of the accumulator */
    __shared__ float qs[ATT_DMAX];
    __shared__ double acc[ATT_DMAX];                  /* sum of e^{z_i - m} v_i */
    __shared__ double z[ATT_T], p[ATT_T];             /* the tile's scores, weights */
    int h = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32,
        nwarps = blockDim.x / 32;
    const float *Kh = K + (size_t)(h / group) * n * d, *Vh = V + (size_t)(h / group) * n * d;
    for (int i = tid; i < d; i += blockDim.x) qs[i] = q[(size_t)h * d + i], acc[i] = 0.0;
    __syncthreads();
    double m = -INFINITY, s = 0.0; /* running max and sum: the same in every thread */
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
    for (int i = tid; i < d; i += blockDim.x)
        o[(size_t)h * d + i] = s > 0.0 ? (float)(acc[i] / s) : 0.0f;
    if (tid == 0) zmax[h] = (float)m, sumexp[h] = (float)s;   /* empty: -inf, 0 */
}

/* positions [p0, p0 + n) of every KV head of K, V (n_kv_heads, ctx, d) into dK, dV, packed as
 * (n_kv_heads, n, d): what the twins below upload of a layer of State's cache */
static int upload_kv_range(float *dK, float *dV, const float *K, const float *V, int n_kv_heads,
                           int ctx, int p0, int n, int d) {
    size_t head = (size_t)n * d * sizeof(float);
    for (int g = 0; g < n_kv_heads && n > 0; g++) {
        size_t src = ((size_t)g * ctx + p0) * d;
        cudaCheck(cudaMemcpy((char *)dK + g * head, K + src, head, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy((char *)dV + g * head, V + src, head, cudaMemcpyHostToDevice));
    }
    return 0;
}

/* attn_partial (Eq. 2) of each query head q (n_heads, d) over positions [p0, p1) of K, V
 * (n_kv_heads, ctx, d), an f32 cache layer; head h reads KV head h / group. Outputs o (n_heads, d),
 * zmax, sumexp (n_heads), as attn_partial defines them. Only the range is uploaded. */
extern "C" int attn_partial_cuda(const float *q, int n_heads, const float *K, const float *V,
                                 int n_kv_heads, int ctx, int p0, int p1, int d, float scale,
                                 float *o, float *zmax, float *sumexp) {
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || d <= 0 || d > ATT_DMAX ||
        p0 < 0 || p1 < p0 || p1 > ctx) {
        fprintf(stderr,
                "attn_partial_cuda: unsupported heads %d/%d, d %d (max %d), range [%d, %d) of %d\n",
                n_heads, n_kv_heads, d, ATT_DMAX, p0, p1, ctx);
        return -1;
    }
    int n = p1 - p0;
    size_t head = (size_t)n * d * sizeof(float);      /* bytes of one KV head's range */
    float *dq = (float *)dev_buf(BUF_AQ, (size_t)n_heads * d * sizeof(float));
    float *dK = (float *)dev_buf(BUF_AK, head * n_kv_heads);                     /* (n_kv, n, d) */
    float *dV = (float *)dev_buf(BUF_AV, head * n_kv_heads);
    /* o, zmax, sumexp */
    float *dout = (float *)dev_buf(BUF_AOUT, (size_t)n_heads * (d + 2) * sizeof(float));
    if (!dq || !dK || !dV || !dout) return -1;
    cudaCheck(cudaMemcpy(dq, q, (size_t)n_heads * d * sizeof(float), cudaMemcpyHostToDevice));
    if (upload_kv_range(dK, dV, K, V, n_kv_heads, ctx, p0, n, d)) return -1;
    float *d_o = dout, *d_zmax = dout + (size_t)n_heads * d, *d_sumexp = d_zmax + n_heads;
    attn_partial_kernel<<<n_heads, ATT_THREADS>>>(dq, dK, dV, n, d, n_heads / n_kv_heads, scale,
                                                  d_o, d_zmax, d_sumexp);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(o, d_o, (size_t)n_heads * d * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(zmax, d_zmax, (size_t)n_heads * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(
        cudaMemcpy(sumexp, d_sumexp, (size_t)n_heads * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

/* ======================================================================== */
/* The model on the GPU: fp16 weights, the forward pass through cuBLAS      */
/* ======================================================================== */
/* forward_cuda is forward (model.c) on the device. The prefill runs every layer there, each
 * batch's keys, values and queries copied to the host cache on a second stream (App. C), then
 * layer_done hands the layer's queries to the index builds, which run on the CPU's threads
 * beside the rest of the prefill (their KNN back here, at low priority). A decoding step runs
 * the projections and the FFN there, and attention_layer (ra.c) on the host, which holds the
 * cache; o_W meanwhile on the device. Weights are fp16; GEMMs sum in fp32; activations and
 * scores are fp32. */

struct GpuLayer {
    __half *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;   /* (rows, cols) as the Mat, fp16 */
    float *attn_norm, *ffn_norm;                          /* (dim) */
    float *bq, *bk, *bv;                                  /* (qd), (kvd), (kvd) or NULL */
    float *q_norm, *k_norm;                /* (hd), (hd) gemma3's per-head norms, or NULL */
    float *post_attn_norm, *post_ffn_norm; /* (dim), (dim) gemma3's post norms, or NULL */
};

struct GpuModel {
    const Model *m;
    GpuLayer *layers;        /* (n_layers) */
    __half *output;          /* (vocab, dim) */
    float *out_norm;         /* (dim) */
    float *inv_freq;         /* (rope_dim/2) */
    float *inv_freq_swa;     /* (rope_dim/2) the sliding layers' (gemma3), or NULL */
    int B;                   /* tokens per device batch */
    float *x;                /* (cap_x, dim) residual stream of the call's tokens */
    int cap_x;
    __half *xh;              /* (B, max(dim, qd, ffn)) fp16 GEMM input */
    float *q, *kb, *vb;      /* (B, qd), (B, kvd), (B, kvd) */
    float *att, *y;          /* (B, qd), (B, dim) */
    float *hg, *hu;          /* (B, ffn) */
    float *logits;           /* (vocab) */
    float *Kl, *Vl; /* (n_kv, cap_kv, hd) the current layer's keys and values, positions 0..;
                       rounded to halves where the host cache holds halves (cache_type) */
    __half *Kh, *Vh; /* (n_kv, cap_kv, hd) their fp16 copies, which the fused attention reads
                        and a host cache of halves receives */
    int cache_type;  /* the host cache's (State.cache_type) */
    float *stage;    /* (n_w, hd) host: W's rows converted from the host cache's halves */
    int cap_kv;
    float *S;                /* (cap_S) attention scores of a query tile, a GQA group */
    size_t cap_S;
    /* decoding: the static pattern W of every layer (see "W on the device" below) */
    float *Wk, *Wv;          /* (global layers, n_kv, n_w, hd) W's keys and values, by slot */
    int n_w, w_sink, w_window;   /* n_w = w_sink + w_window slots */
    int *w_last; /* (n_layers) host: the last position stored in the layer's W, -1: none */
    int w_off;               /* 1: W could not be placed on the device; the host attends it */
    float *ow, *ow_host;     /* (n_heads * (hd + 2)) o_W, local maxima, sums: device, pinned host */
    float *qkv_host;         /* (qd + 2 kvd) pinned host: a decoding step's q, k, v on their way */
    float *att_host;         /* (qd) pinned host: its attention output on its way back */
    cudaStream_t stream, copy;
    cudaEvent_t kv_ready, q_free, qkv_done, w_done;
    cudaEvent_t attn_ev[2][2];   /* (2, 2) prefill attention: begin, end, of even and odd batches */
    int attn_pending[2];         /* (2) 1: that pair recorded and not yet read (attn_time_read) */
    cublasHandle_t blas;     /* default math: fp16 tensor cores for the weights */
    const void *pinned[3];   /* (3) host ranges registered for asynchronous copies: k, v, q_keep */
    size_t weight_bytes;
};

static double gpu_peak;      /* MiB in use on the device (cudaMemGetInfo), the highest sample */
/* the prefill and a layer's build (its KNN) sample it from two threads */
static pthread_mutex_t gpu_peak_lock = PTHREAD_MUTEX_INITIALIZER;

static void gpu_sample_memory(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return;
    pthread_mutex_lock(&gpu_peak_lock);
    if ((tot - fr) / 1048576.0 > gpu_peak) gpu_peak = (tot - fr) / 1048576.0;
    pthread_mutex_unlock(&gpu_peak_lock);
}

extern "C" double gpu_peak_mb(void) {
    pthread_mutex_lock(&gpu_peak_lock);
    double p = gpu_peak;
    pthread_mutex_unlock(&gpu_peak_lock);
    return p;
}

extern "C" int gpu_free_mb(double *free_mb, double *total_mb) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
    *free_mb = fr / 1048576.0, *total_mb = tot / 1048576.0;
    return 0;
}

/* the query rows per attention tile: a group's scores (group, tq, nk) within GPU_S_BYTES
 * (gpu_attention_tile_bytes changes it, for the tests) */
#define GPU_S_BYTES ((size_t)256 << 20)
static size_t s_tile_bytes = GPU_S_BYTES;

extern "C" void gpu_attention_tile_bytes(size_t bytes) {
    s_tile_bytes = bytes ? bytes : GPU_S_BYTES;
}

/* the head dims of the prefill's fused attention kernel (attn_causal_kernel); others go through
 * attention_tiles */
static int fused_head_dim(int hd) { return hd == 64 || hd == 128; }

static int attn_tile_rows(int group, int nk, int nb) {
    size_t t = s_tile_bytes / ((size_t)group * (nk > 0 ? nk : 1) * sizeof(float));
    if (t < 1) t = 1;
    return t < (size_t)nb ? (int)t : nb;
}

/* floats of the weight upload's stage: at least 1024 rows of the widest matrix, at least 64 MiB */
static size_t upload_stage_elems(const Config *c) {
    size_t wmax = (size_t)(c->dim > c->ffn_dim ? c->dim : c->ffn_dim),
           qd = (size_t)c->n_heads * c->head_dim;
    if (qd > wmax) wmax = qd;
    return wmax * 1024 > ((size_t)16 << 20) ? wmax * 1024 : ((size_t)16 << 20);
}

extern "C" void gpu_plan(const Config *c, int n_prompt, int B, int n_w, int cache_type,
                         double *weights, double *work) {
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    /* weight elements of a layer */
    double per_layer = qd * c->dim * 2 + kvd * c->dim * 2 + 3.0 * c->ffn_dim * c->dim;
    *weights = 2.0 * (per_layer * c->n_layers + (double)c->vocab_size * c->dim) +
               4.0 * (2.0 * c->dim * c->n_layers + c->dim + c->rope_dim / 2 +
                      c->n_layers * (qd + 2 * kvd));
    if (c->arch == ARCH_GEMMA3)   /* the heads' and the post norms, the sliding layers' RoPE */
        *weights += 4.0 * (c->n_layers * (2.0 * c->head_dim + 2.0 * c->dim) + c->rope_dim / 2);
    double wmax = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    if (qd > wmax) wmax = qd;
    int group = c->n_heads / c->n_kv_heads;
    double s_tile = (double)group * attn_tile_rows(group, n_prompt, B) * n_prompt * 4;
    double knn = (double)n_prompt * c->head_dim * 4 + (double)KNN_QT * c->head_dim * 4 +
                 (double)KNN_QT * KNN_KT * 4 + (double)KNN_QT * KNN_GPU_MAX_KQ * 8;
    /* x, the upload's stage (freed after), a batch's rows, one layer's K and V (and their fp16
     * copies), the attention tile, the KNN, the logits, W */
    *work = (double)n_prompt * c->dim * 4 + (double)upload_stage_elems(c) * 4 +
            (double)B * (wmax * 2 + (2 * qd + 2 * kvd + c->dim + 2.0 * c->ffn_dim) * 4) +
            2.0 * n_prompt * kvd * (fused_head_dim(c->head_dim) || cache_type ? 4 + 2 : 4) +
            s_tile + knn + (double)c->vocab_size * 4 + 2.0 * global_layers(c) * n_w * kvd * 4 +
            (n_w ? (double)c->n_heads * (c->head_dim + 2) * 4 : 0);
}

/* ---- kernels: one thread per element, one block per row where a row is reduced ---- */

/* a GEMM input (an activation, or a weight on upload) to fp16, a finite value past fp16's
 * largest (65504) saturated at it, as the CPU's fp32 would hold it: an outlier (a large
 * silu(g) u) stays large rather than becoming inf and then NaN in the next product. inf and
 * NaN stay what they are, as on the CPU (the comparisons with FLT_MAX are false for NaN). */
static __device__ __half half_sat(float x) {
    if (x > 65504.0f && x <= FLT_MAX) return __float2half(65504.0f);
    if (x < -65504.0f && x >= -FLT_MAX) return __float2half(-65504.0f);
    return __float2half(x);
}

/* 1 / rms(xr) over n values (rmsnorm of model.c: the sum of squares in double), by the block's
 * 256 threads, each of which gets it */
static __device__ float rms_inv(const float *xr, int n, float eps) {
    __shared__ double part[256];
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    return (float)(1.0 / sqrt(part[0] / n + eps));
}

/* out (fp16) = x * w / rms(x) per row of n */
static __global__ void rmsnorm_h_kernel(const float *x, const float *w, __half *out, int n, float eps) {
    const float *xr = x + (size_t)blockIdx.x * n;
    float r = rms_inv(xr, n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[(size_t)blockIdx.x * n + i] = half_sat(xr[i] * r * w[i]);
}

/* x = x * w / rms(x) in place, per row of n: a head's query or key (gemma3's q/k norms, rows of
 * hd) or a block's output (its post norms, rows of dim); then x *= post */
static __global__ void rmsnorm_f_kernel(float *x, const float *w, int n, float eps, float post) {
    float *xr = x + (size_t)blockIdx.x * n;
    float r = rms_inv(xr, n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = xr[i] * r * w[i] * post;
}

static __global__ void f2h_kernel(const float *x, __half *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = half_sat(x[i]);
}

static __global__ void h2f_kernel(const __half *x, float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]);
}

static __global__ void add_kernel(float *x, const float *y, size_t n) {   /* x += y */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

/* rows of width n: x[t, i] += b[i] */
static __global__ void add_bias_kernel(float *x, const float *b, int n, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % n];
}

/* out (fp16) = silu(g) * u (swiglu of model.c) */
static __global__ void swiglu_h_kernel(const float *g, const float *u, __half *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = half_sat(g[i] / (1.0f + expf(-g[i])) * u[i]);
}

/* out (fp16) = gelu(g) * u, the tanh form (geglu of model.c) */
static __global__ void geglu_h_kernel(const float *g, const float *u, __half *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = g[i];
        out[i] = half_sat(0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) *
                          u[i]);
    }
}

/* rope_apply of model.c on row t (position pos0 + t) of v (rows of n_heads * hd):
 * pair i of every head turns by (pos * inv_freq[i]) */
static __global__ void rope_kernel(float *v, int n_heads, int hd, int half, int pos0,
                            const float *inv_freq, int neox) {
    int t = blockIdx.x;
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float theta = (float)(pos0 + t) * inv_freq[i];
        float cs = cosf(theta), sn = sinf(theta);
        float *r = v + ((size_t)t * n_heads + h) * hd;
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = r[a], x1 = r[b];
        r[a] = x0 * cs - x1 * sn;
        r[b] = x0 * sn + x1 * cs;
    }
}

/* rows t of kb, vb (nb, n_kv * hd) to position pos0 + t of Kl, Vl (n_kv, cap, hd), rounded to
 * halves where the host cache holds halves (cache_type; as cache_store, but saturating), and in
 * fp16 (half_sat) to Kh, Vh where they are not NULL */
static __global__ void store_kv_kernel(const float *kb, const float *vb, float *Kl, float *Vl, __half *Kh,
                                __half *Vh, int n_kv, int hd, int cap, int pos0, int cache_type) {
    int t = blockIdx.x;
    for (int j = threadIdx.x; j < n_kv * hd; j += blockDim.x) {
        int g = j / hd, i = j % hd;
        size_t at = ((size_t)g * cap + pos0 + t) * hd + i;
        float k = kb[(size_t)t * n_kv * hd + j], v = vb[(size_t)t * n_kv * hd + j];
        if (cache_type & CACHE_K_F16) k = __half2float(half_sat(k));
        if (cache_type & CACHE_V_F16) v = __half2float(half_sat(v));
        Kl[at] = k, Vl[at] = v;
        if (Kh) Kh[at] = half_sat(k), Vh[at] = half_sat(v);
    }
}

/* Causal softmax of Eq. (1) on a tile of scores: block (r, b) is query row r of group member b,
 * S + (b * tq + r) * nk, whose column j is the key at position k_first + j; the query sits at
 * position p = p_first + r and sees keys k_first..p, or with a window (a sliding layer's) those
 * after p - window. Those become e^{z - max} / sum; the others become 0. */
static __global__ void causal_softmax_kernel(float *S, int nk, int tq, int p_first, int k_first,
                                      int window) {
    __shared__ float red[256];
    __shared__ double dred[256];
    float *row = S + ((size_t)blockIdx.y * tq + blockIdx.x) * nk;
    int p = p_first + blockIdx.x, lim = p + 1 - k_first;   /* columns [lo, lim) */
    int lo = window > 0 && p + 1 - window > k_first ? p + 1 - window - k_first : 0;
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, row[j]);
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
        __syncthreads();
    }
    mx = red[0];
    double s = 0;
    for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) {
        float e = expf(row[j] - mx);
        row[j] = e;
        s += e;
    }
    dred[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) dred[threadIdx.x] += dred[threadIdx.x + k];
        __syncthreads();
    }
    float inv = (float)(1.0 / dred[0]);
    for (int j = threadIdx.x; j < nk; j += blockDim.x)
        row[j] = j >= lo && j < lim ? row[j] * inv : 0.0f;
}

static unsigned blocks_for(size_t n) { return (unsigned)((n + 255) / 256); }

/* ---- the prefill's causal attention in one kernel ---- */
/* Eq. (1), causal, for nb queries at positions p0.. (rows of Q; head h at column h * HD) over
 * keys 0..p0+t of their KV head (K, V fp16) into O: FlashAttention-2's loop, 64 queries of a
 * head a block, keys in tiles of 64 with a running max and sum, S = Q K^T and O += P V on the
 * tensor cores (mma.sync m16n8k16, fp32 sums), the next tile copied in meanwhile (cp.async).
 * Its oracle is attn_causal (model.c), in test_cuda. */
#define FA_BQ 64                 /* queries per block */
#define FA_BK 64                 /* keys per tile */
#define FA_WARPS (FA_BQ / 16)    /* a warp: 16 query rows */

/* shared memory of the kernel for head dim HD: rows of HD + 8 halves (16-byte aligned for
 * cp.async; the fragment loads of Q and K below fall on 32 distinct banks, those of V on 16,
 * lanes that share a word reading it at once) */
template <int HD> struct FaLayout {
    static const int LD = HD + 8;
    static const size_t q = 0; /* half (FA_BQ, LD) the block's queries */
    /* half (2, 2, FA_BK, LD) stage, K or V, key */
    static const size_t kv = q + (size_t)FA_BQ * LD * 2;
    static const size_t bytes = kv + (size_t)2 * 2 * FA_BK * LD * 2;
};

/* D = A B + D for A (16 x 16, fp16, row-major), B (16 x 8, fp16, by columns), D (16 x 8, fp32),
 * a warp's fragments as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16") */
static __device__ __forceinline__ void mma_16816(float d[4], const unsigned a[4], unsigned b0,
                                          unsigned b1) {
    /* Lane = 4 g + t holds: of A, a[0] = row g, columns 2t, 2t+1; a[1] the same of row g + 8;
     * a[2], a[3] those of columns 2t + 8, 2t + 9; of B, b0 = rows 2t, 2t+1 of column g, b1 = rows
     * 2t + 8, 2t + 9; of D, d[0], d[1] = row g, columns 2t, 2t+1, and d[2], d[3] the same of row
     * g + 8. Two halves in 32 bits: the first is the low. */
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, "
                 "%7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ unsigned ld_half2(const __half *p) {
    return *(const unsigned *)p;
} /* p[0], p[1] */

static __device__ __forceinline__ unsigned pack_half2(__half lo, __half hi) {
    return (unsigned)__half_as_ushort(lo) | (unsigned)__half_as_ushort(hi) << 16;
}

static __device__ __forceinline__ unsigned pack_float2(float lo, float hi) {
    return pack_half2(__float2half(lo), __float2half(hi));
}

/* 16 bytes from global to shared memory, asynchronously; zeros where !valid (nothing read) */
static __device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

/* the keys and values of tile `tile` (positions < kend; zeros past it) into stage `stage` */
template <int HD>
static __device__ void fa_load_tile(__half *kv, const __half *Kh, const __half *Vh, int tile, int stage,
                             int kend) {
    typedef FaLayout<HD> L;
    __half *Ks = kv + (size_t)stage * 2 * FA_BK * L::LD, *Vs = Ks + FA_BK * L::LD;
    for (int i = threadIdx.x; i < FA_BK * HD / 8; i += blockDim.x) {
        int r = i / (HD / 8), c = i % (HD / 8) * 8, j = tile * FA_BK + r;
        size_t at = j < kend ? (size_t)j * HD + c : 0;
        cp_async_16(Ks + r * L::LD + c, Kh + at, j < kend);
        cp_async_16(Vs + r * L::LD + c, Vh + at, j < kend);
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int HD>
static __global__ void __launch_bounds__(FA_WARPS * 32)
    attn_causal_kernel(const float *Q, int ldq, const __half *K, const __half *V, size_t ld_head,
                       int nb, int p0, int group, float scale, float *O, int ldo) {
    typedef FaLayout<HD> L;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    __half *Qs = (__half *)(fa_smem + L::q), *kv = (__half *)(fa_smem + L::kv);
    int h = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * FA_BQ;   /* the longest blocks first */
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const __half *Kh = K + (size_t)(h / group) * ld_head, *Vh = V + (size_t)(h / group) * ld_head;
    int kend = p0 + (t0 + FA_BQ < nb ? t0 + FA_BQ : nb);   /* keys any row of the block sees */
    int ntiles = (kend + FA_BK - 1) / FA_BK;
    fa_load_tile<HD>(kv, Kh, Vh, 0, 0, kend);
    for (int i = threadIdx.x; i < FA_BQ * HD; i += blockDim.x) {   /* the block's queries, fp16 */
        int r = i / HD, d = i % HD;
        Qs[r * L::LD + d] =
            half_sat(t0 + r < nb ? Q[(size_t)(t0 + r) * ldq + (size_t)h * HD + d] : 0.0f);
    }
    __syncthreads();
    unsigned qa[HD / 16][4];   /* the warp's 16 queries as A operands, 16 dimensions each */
    const __half *Qw = Qs + warp * 16 * L::LD;
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
        qa[k][0] = ld_half2(Qw + g * L::LD + k * 16 + 2 * t);
        qa[k][1] = ld_half2(Qw + (g + 8) * L::LD + k * 16 + 2 * t);
        qa[k][2] = ld_half2(Qw + g * L::LD + k * 16 + 2 * t + 8);
        qa[k][3] = ld_half2(Qw + (g + 8) * L::LD + k * 16 + 2 * t + 8);
    }
    /* this lane's rows: r = 0 is row g of the warp, r = 1 row g + 8; -1: a padding row */
    int row = t0 + warp * 16 + g,
        qpos[2] = {row < nb ? p0 + row : -1, row + 8 < nb ? p0 + row + 8 : -1};
    float o[HD / 8][4];   /* O (16, HD): o[n][2r + e] = row r, dimension 8n + 2t + e */
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    /* running max (log2 units), sum (this lane's part) */
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float zscale = scale * 1.4426950408889634f;            /* scale log2 e */
    for (int tile = 0; tile < ntiles; tile++) {
        if (tile + 1 < ntiles) {   /* the next tile on its way; this one's arrived */
            fa_load_tile<HD>(kv, Kh, Vh, tile + 1, (tile + 1) % 2, kend);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const __half *Ks = kv + (size_t)(tile % 2) * 2 * FA_BK * L::LD, *Vs = Ks + FA_BK * L::LD;
        int j0 = tile * FA_BK;
        float s[FA_BK / 8][4];   /* S (16, FA_BK): s[n][2r + e] = row r, key j0 + 8n + 2t + e */
#pragma unroll
        for (int n = 0; n < FA_BK / 8; n++) { /* B = K^T: column g of block n is key 8n + g's row */
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const __half *kr = Ks + (n * 8 + g) * L::LD + 2 * t;
#pragma unroll
            for (int k = 0; k < HD / 16; k++)
                mma_16816(s[n], qa[k], ld_half2(kr + k * 16), ld_half2(kr + k * 16 + 8));
        }
        /* z = scale q.k in log2 units, keys past the row's position masked; the online softmax:
         * new max, p = 2^(z - m), the sum and the output rescaled by 2^(m_old - m) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mt = -INFINITY;
#pragma unroll
            for (int n = 0; n < FA_BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float z =
                        j0 + 8 * n + 2 * t + e <= qpos[r] ? s[n][2 * r + e] * zscale : -INFINITY;
                    s[n][2 * r + e] = z;
                    mt = fmaxf(mt, z);
                }
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));   /* the row's 4 lanes */
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
            float mn = fmaxf(m[r], mt), ps = 0.0f;
            float a = mn == -INFINITY ? 1.0f : exp2f(m[r] - mn);
#pragma unroll
            for (int n = 0; n < FA_BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = mn == -INFINITY ? 0.0f : exp2f(s[n][2 * r + e] - mn);
                    s[n][2 * r + e] = p;
                    ps += p;
                }
            l[r] = l[r] * a + ps, m[r] = mn;
#pragma unroll
            for (int n = 0; n < HD / 8; n++) o[n][2 * r] *= a, o[n][2 * r + 1] *= a;
        }
        /* O += P V, 16 keys at a time: P's A operand is S's two blocks of 8 keys as they lie */
#pragma unroll
        for (int k = 0; k < FA_BK / 16; k++) {
            unsigned pa[4] = {pack_float2(s[2 * k][0], s[2 * k][1]),
                              pack_float2(s[2 * k][2], s[2 * k][3]),
                              pack_float2(s[2 * k + 1][0], s[2 * k + 1][1]),
                              pack_float2(s[2 * k + 1][2], s[2 * k + 1][3])};
            /* B = V: column g of block n is dimension 8n + g */
            const __half *vr = Vs + (k * 16 + 2 * t) * L::LD + g;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                mma_16816(o[n], pa, pack_half2(vr[8 * n], vr[L::LD + 8 * n]),
                          pack_half2(vr[8 * L::LD + 8 * n], vr[9 * L::LD + 8 * n]));
        }
        __syncthreads();   /* every warp done with this stage before the next tile lands in it */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (qpos[r] < 0) continue;
        float *out = O + (size_t)(row + 8 * r) * ldo + (size_t)h * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            out[8 * n] = o[n][2 * r] / sum, out[8 * n + 1] = o[n][2 * r + 1] / sum;
    }
}

template <int HD>
static int attn_causal_launch_hd(const float *Q, int ldq, const __half *K, const __half *V,
                                 size_t ld_head, int nb, int p0, int n_heads, int group, float *O,
                                 int ldo, cudaStream_t st) {
    if (cudaFuncSetAttribute(attn_causal_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)FaLayout<HD>::bytes) !=
        cudaSuccess) { /* a device with less shared memory a block: the caller uses the tiles */
        cudaGetLastError();
        return 1;
    }
    dim3 grid((unsigned)((nb + FA_BQ - 1) / FA_BQ), (unsigned)n_heads);
    attn_causal_kernel<HD><<<grid, FA_WARPS * 32, FaLayout<HD>::bytes, st>>>(
        Q, ldq, K, V, ld_head, nb, p0, group, 1.0f / sqrtf((float)HD), O, ldo);
    cudaCheck(cudaGetLastError());
    return 0;
}

/* the fused kernel on stream st for head dims 64 and 128 (K, V: fp16 copies); 1 when hd has no
 * kernel or the device not the shared memory it needs (the caller uses attention_tiles), -1 on a
 * CUDA error */
static int attn_causal_launch(const float *Q, int ldq, const __half *K, const __half *V,
                              size_t ld_head, int nb, int p0, int n_heads, int group, int hd,
                              float *O, int ldo, cudaStream_t st) {
    if (nb <= 0) return 0;
    if (hd == 64)
        return attn_causal_launch_hd<64>(Q, ldq, K, V, ld_head, nb, p0, n_heads, group, O, ldo, st);
    if (hd == 128)
        return attn_causal_launch_hd<128>(Q, ldq, K, V, ld_head, nb, p0, n_heads, group, O, ldo,
                                          st);
    return 1;
}

static int fused_attention = 1;   /* 0: the prefill attends through attention_tiles */

extern "C" void gpu_fused_attention(int on) { fused_attention = on; }

/* the causal attention of a prefill batch (attention_layer with full attention, ra.c) on the
 * GPU by the fused kernel: q, out (n, n_heads * hd) at positions p0..p0+n-1; K, V (n_kv_heads,
 * ctx, hd) hold positions 0..p0+n-1. Uploads what it needs and makes the fp16 copies of K, V the
 * kernel reads, as forward_cuda's store_kv_kernel does. hd 64 or 128. */
extern "C" int attn_causal_cuda(const float *q, int n, int p0, const float *K, const float *V,
                                int n_heads, int n_kv_heads, int ctx, int hd, float *out) {
    if (n <= 0 || p0 < 0 || p0 + n > ctx || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads || !fused_head_dim(hd)) {
        fprintf(stderr,
                "attn_causal_cuda: unsupported sizes: %d queries at %d of %d, heads %d/%d, hd %d "
                "(64 or 128)\n",
                n, p0, ctx, n_heads, n_kv_heads, hd);
        return -1;
    }
    int qd = n_heads * hd, nk = p0 + n;
    size_t e = (size_t)nk * hd * n_kv_heads;
    float *dq = (float *)dev_buf(BUF_AQ, (size_t)n * qd * sizeof(float));
    float *dK = (float *)dev_buf(BUF_AK, e * sizeof(float)),
          *dV = (float *)dev_buf(BUF_AV, e * sizeof(float));
    __half *hK = (__half *)dev_buf(BUF_AKH, e * sizeof(__half)),
           *hV = (__half *)dev_buf(BUF_AVH, e * sizeof(__half));
    float *dout = (float *)dev_buf(BUF_AOUT, (size_t)n * qd * sizeof(float));
    if (!dq || !dK || !dV || !hK || !hV || !dout) return -1;
    cudaCheck(cudaMemcpy(dq, q, (size_t)n * qd * sizeof(float), cudaMemcpyHostToDevice));
    if (upload_kv_range(dK, dV, K, V, n_kv_heads, ctx, 0, nk, hd)) return -1;
    f2h_kernel<<<blocks_for(e), 256>>>(dK, hK, e);
    f2h_kernel<<<blocks_for(e), 256>>>(dV, hV, e);
    cudaCheck(cudaGetLastError());
    int rc = attn_causal_launch(dq, qd, hK, hV, (size_t)nk * hd, n, p0, n_heads,
                                n_heads / n_kv_heads, hd, dout, qd, 0);
    if (rc == 1)
        fprintf(stderr,
                "attn_causal_cuda: this device cannot give the fused kernel its shared memory\n");
    if (rc) return -1;
    cudaCheck(cudaMemcpy(out, dout, (size_t)n * qd * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

/* ---- build / free ---- */

/* a device array of n elements of `size` bytes, counted in *bytes; NULL on failure */
static void *gpu_alloc(size_t n, size_t size, size_t *bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, n * size > 0 ? n * size : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (bytes) *bytes += n * size;
    return p;
}

static float *upload_f32(const float *h, size_t n, size_t *bytes) {
    if (!h) return NULL;
    float *d = (float *)gpu_alloc(n, sizeof(float), bytes);
    if (d && cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        cudaFree(d), d = NULL;
    return d;
}

typedef struct { const Mat *W; int64_t r0; float *dst; } DequantTask;   /* dst (rows, W cols) */

static void dequant_rows_task(void *arg, int64_t i0, int64_t i1, int thread) {
    DequantTask *t = (DequantTask *)arg;
    (void)thread;
    for (int64_t r = i0; r < i1; r++)
        dequantize_row(t->W->type, (const uint8_t *)t->W->data + (t->r0 + r) * t->W->row_bytes,
                       t->dst + r * t->W->cols, t->W->cols);
}

/* W as fp16 on the device: rows dequantized on the host threads in chunks (fp32, pinned stage),
 * uploaded, rounded to fp16 there */
static const char *upload_error;   /* a CUDA error other than out-of-memory during the upload */

static __half *upload_mat(const Mat *W, Pool *pool, float *stage, float *dstage, size_t stage_elems,
                          size_t *bytes) {
    __half *d = (__half *)gpu_alloc((size_t)W->rows * W->cols, sizeof(__half), bytes);
    if (!d) return NULL;
    int64_t chunk = (int64_t)(stage_elems / (size_t)W->cols);
    for (int64_t r0 = 0; r0 < W->rows; r0 += chunk) {
        int64_t nr = W->rows - r0 < chunk ? W->rows - r0 : chunk;
        DequantTask t = {W, r0, stage};
        pool_for(pool, nr, dequant_rows_task, &t);
        size_t n = (size_t)nr * W->cols;
        cudaError_t e = cudaMemcpy(dstage, stage, n * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess) {
            f2h_kernel<<<blocks_for(n), 256>>>(dstage, d + (size_t)r0 * W->cols, n);
            if ((e = cudaGetLastError()) == cudaSuccess) e = cudaDeviceSynchronize();
        }
        if (e != cudaSuccess) {
            upload_error = cudaGetErrorString(e);
            cudaFree(d);
            return NULL;
        }
    }
    return d;
}

/* keeps a host range registered (page-locked) so copies into it run asynchronously; on failure the
 * copies still work, synchronously */
static void pin_host(GpuModel *g, int slot, const void *p, size_t bytes) {
    if (g->pinned[slot] == p) return;
    if (g->pinned[slot]) cudaHostUnregister((void *)g->pinned[slot]);
    g->pinned[slot] = NULL;
    if (p && cudaHostRegister((void *)p, bytes, cudaHostRegisterDefault) == cudaSuccess)
        g->pinned[slot] = p;
    else cudaGetLastError();
}

extern "C" void free_gpu_model(GpuModel *g) {
    if (!g) return;
    if (g->layers)
        for (int l = 0; l < g->m->c.n_layers; l++) {
            GpuLayer *L = &g->layers[l];
            void *ps[] = {L->wq,     L->wk,        L->wv,       L->wo,     L->w_gate,
                          L->w_up,   L->w_down,    L->attn_norm, L->ffn_norm, L->bq,
                          L->bk,     L->bv,        L->q_norm,    L->k_norm,   L->post_attn_norm,
                          L->post_ffn_norm};
            for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) if (ps[i]) cudaFree(ps[i]);
        }
    free(g->layers);
    void *ps[] = {g->output, g->out_norm, g->inv_freq, g->inv_freq_swa, g->x,  g->xh,
                  g->q,      g->kb,       g->vb,       g->att,          g->y,  g->hg,
                  g->hu,     g->logits,   g->Kl,       g->Vl,           g->Kh, g->Vh,
                  g->S,      g->Wk,       g->Wv,       g->ow};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) if (ps[i]) cudaFree(ps[i]);
    for (int i = 0; i < 3; i++) if (g->pinned[i]) cudaHostUnregister((void *)g->pinned[i]);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    if (g->copy) cudaStreamDestroy(g->copy);
    if (g->kv_ready) cudaEventDestroy(g->kv_ready);
    if (g->q_free) cudaEventDestroy(g->q_free);
    if (g->qkv_done) cudaEventDestroy(g->qkv_done);
    if (g->w_done) cudaEventDestroy(g->w_done);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (g->attn_ev[i][j]) cudaEventDestroy(g->attn_ev[i][j]);
    if (g->ow_host) cudaFreeHost(g->ow_host);
    if (g->qkv_host) cudaFreeHost(g->qkv_host);
    if (g->att_host) cudaFreeHost(g->att_host);
    free(g->w_last);
    free(g->stage);
    free(g);
}

/* grows the call's buffers: x for n tokens, Kl/Vl for positions 0..npos-1; -1 when the device
 * has no room */
static int gpu_reserve(GpuModel *g, int n, int npos) {
    const Config *c = &g->m->c;
    if (n > g->cap_x) {
        if (g->x) cudaFree(g->x);
        g->cap_x = 0;
        if (!(g->x = (float *)gpu_alloc((size_t)n * c->dim, sizeof(float), NULL))) return -1;
        g->cap_x = n;
    }
    if (npos > g->cap_kv) {
        void *old[] = {g->Kl, g->Vl, g->Kh, g->Vh};
        for (int i = 0; i < 4; i++) if (old[i]) cudaFree(old[i]);
        g->Kl = g->Vl = NULL, g->Kh = g->Vh = NULL, g->cap_kv = 0;
        size_t e = (size_t)c->n_kv_heads * npos * c->head_dim;
        if (!(g->Kl = (float *)gpu_alloc(e, sizeof(float), NULL)) ||
            !(g->Vl = (float *)gpu_alloc(e, sizeof(float), NULL)))
            return -1;
        if ((fused_head_dim(c->head_dim) || g->cache_type) &&
            (!(g->Kh = (__half *)gpu_alloc(e, sizeof(__half), NULL)) ||
             !(g->Vh = (__half *)gpu_alloc(e, sizeof(__half), NULL))))
            return -1;
        g->cap_kv = npos;
    }
    int group = c->n_heads / c->n_kv_heads;   /* the largest attention tile of this call */
    size_t S = (size_t)group * attn_tile_rows(group, npos, g->B < n ? g->B : n) * npos;
    if (S > g->cap_S) {
        if (g->S) cudaFree(g->S);
        g->cap_S = 0;
        if (!(g->S = (float *)gpu_alloc(S, sizeof(float), NULL))) return -1;
        g->cap_S = S;
    }
    return 0;
}

extern "C" int build_gpu_model(GpuModel **out, const Model *m, State *s, int n_prompt, int B,
                               char *err) {
    const Config *c = &m->c;
    *out = NULL;
    int scaled = c->q_scale > 0 && c->q_scale != 1.0f;   /* qkv_gpu folds it into the q-norms */
    for (int l = 0; scaled && l < c->n_layers; l++)
        if (!m->layers[l].q_norm)
            return snprintf(err, ERR_LEN, "the GPU path scales queries only within their norms"),
                   -1;
    upload_error = NULL;   /* this build's, not an earlier one's */
    GpuModel *g = (GpuModel *)calloc(1, sizeof *g);
    if (!g) return snprintf(err, ERR_LEN, "out of memory"), -1;
    g->m = m;
    g->B = B;
    g->cache_type = s->cache_type;
    int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    size_t wmax = (size_t)(c->dim > c->ffn_dim ? c->dim : c->ffn_dim);
    if ((size_t)qd > wmax) wmax = qd;
    size_t stage_elems = upload_stage_elems(c);
    float *stage = NULL, *dstage = NULL;
    size_t wb = 0;
    int setup = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) == cudaSuccess &&
                cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->kv_ready, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->q_free, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->qkv_done, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->w_done, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->attn_ev[0][0], cudaEventBlockingSync) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->attn_ev[0][1], cudaEventBlockingSync) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->attn_ev[1][0], cudaEventBlockingSync) == cudaSuccess &&
                cudaEventCreateWithFlags(&g->attn_ev[1][1], cudaEventBlockingSync) == cudaSuccess &&
                cublasCreate(&g->blas) == CUBLAS_STATUS_SUCCESS &&
                cublasSetStream(g->blas, g->stream) == CUBLAS_STATUS_SUCCESS &&
                cudaMallocHost(&stage, stage_elems * sizeof(float)) == cudaSuccess &&
                cudaMallocHost(&g->qkv_host, (size_t)(qd + 2 * kvd) * sizeof(float)) ==
                    cudaSuccess &&
                cudaMallocHost(&g->att_host, (size_t)qd * sizeof(float)) == cudaSuccess;
    int ok = setup && (dstage = (float *)gpu_alloc(stage_elems, sizeof(float), NULL)) != NULL &&
             (g->layers = (GpuLayer *)calloc((size_t)c->n_layers, sizeof(GpuLayer))) != NULL;
    double t0 = now_s(), shown = 0;
    for (int l = 0; ok && l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        GpuLayer *G = &g->layers[l];
        ok = (G->wq = upload_mat(&L->wq, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->wk = upload_mat(&L->wk, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->wv = upload_mat(&L->wv, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->wo = upload_mat(&L->wo, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->w_gate = upload_mat(&L->w_gate, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->w_up = upload_mat(&L->w_up, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->w_down = upload_mat(&L->w_down, s->pool, stage, dstage, stage_elems, &wb)) &&
             (G->attn_norm = upload_f32(L->attn_norm, c->dim, &wb)) &&
             (G->ffn_norm = upload_f32(L->ffn_norm, c->dim, &wb)) &&
             (!L->bq || (G->bq = upload_f32(L->bq, qd, &wb))) &&
             (!L->bk || (G->bk = upload_f32(L->bk, kvd, &wb))) &&
             (!L->bv || (G->bv = upload_f32(L->bv, kvd, &wb))) &&
             (!L->q_norm || (G->q_norm = upload_f32(L->q_norm, hd, &wb))) &&
             (!L->k_norm || (G->k_norm = upload_f32(L->k_norm, hd, &wb))) &&
             (!L->post_attn_norm ||
              (G->post_attn_norm = upload_f32(L->post_attn_norm, c->dim, &wb))) &&
             (!L->post_ffn_norm || (G->post_ffn_norm = upload_f32(L->post_ffn_norm, c->dim, &wb)));
        if (now_s() - t0 > 1 && now_s() - shown > 0.5) {
            fprintf(stderr, "\rra: weights to the GPU: layer %d of %d", l + 1, c->n_layers);
            shown = now_s();
        }
    }
    if (shown) fprintf(stderr, "\n");
    ok = ok && (g->output = upload_mat(&m->output, s->pool, stage, dstage, stage_elems, &wb)) &&
         (g->out_norm = upload_f32(m->out_norm, c->dim, &wb)) &&
         (g->inv_freq = upload_f32(m->rope_inv_freq, c->rope_dim / 2, &wb)) &&
         (!m->rope_inv_freq_swa ||
          (g->inv_freq_swa = upload_f32(m->rope_inv_freq_swa, c->rope_dim / 2, &wb)));
    if (stage) cudaFreeHost(stage);
    if (dstage) cudaFree(dstage);
    g->weight_bytes = wb;
    ok = ok && (g->xh = (__half *)gpu_alloc((size_t)B * wmax, sizeof(__half), NULL)) &&
         (g->q = (float *)gpu_alloc((size_t)B * qd, sizeof(float), NULL)) &&
         (g->kb = (float *)gpu_alloc((size_t)B * kvd, sizeof(float), NULL)) &&
         (g->vb = (float *)gpu_alloc((size_t)B * kvd, sizeof(float), NULL)) &&
         (g->att = (float *)gpu_alloc((size_t)B * qd, sizeof(float), NULL)) &&
         (g->y = (float *)gpu_alloc((size_t)B * c->dim, sizeof(float), NULL)) &&
         (g->hg = (float *)gpu_alloc((size_t)B * c->ffn_dim, sizeof(float), NULL)) &&
         (g->hu = (float *)gpu_alloc((size_t)B * c->ffn_dim, sizeof(float), NULL)) &&
         (g->logits = (float *)gpu_alloc((size_t)c->vocab_size, sizeof(float), NULL)) &&
         gpu_reserve(g, n_prompt, n_prompt) == 0;
    if (!ok) {
        cudaError_t e = cudaGetLastError();   /* read and cleared: the next call starts clean */
        double fr = 0, tot = 0;
        gpu_free_mb(&fr, &tot);
        if (!setup)
            snprintf(err, ERR_LEN,
                     "the GPU could not be set up (its streams, cuBLAS, or %.0f MiB of pinned host "
                     "memory for the upload): %s; use --no-gpu",
                     stage_elems * sizeof(float) / 1048576.0,
                     e != cudaSuccess ? cudaGetErrorString(e) : "cuBLAS did not start");
        else if (upload_error)
            snprintf(err, ERR_LEN,
                     "the GPU failed while the weights were uploaded: %s; use --no-gpu",
                     upload_error);
        else
            snprintf(err, ERR_LEN,
                     "the model does not fit on the GPU (%.0f MiB of weights placed, %.0f MiB free "
                     "of %.0f); "
                     "use --no-gpu or a shorter prompt",
                     wb / 1048576.0, fr, tot);
        free_gpu_model(g);
        return -1;
    }
    /* the weights are on the device: their pages leave the host's memory before the pinning
     * below makes the KV cache resident */
    gguf_release_pages(&m->gguf);
    int last = c->n_layers - 1;   /* elements of k, of v: to the end of the last layer's rows */
    size_t cache = s->kv_off ? s->kv_off[last] + (size_t)kvd * s->kv_cap[last]
                             : (size_t)c->n_layers * kvd * (size_t)s->ctx;
    pin_host(g, 0, s->k, cache * cache_elem(s, 0));
    pin_host(g, 1, s->v, cache * cache_elem(s, 1));
    gpu_sample_memory();
    *out = g;
    return 0;
}

/* ---- forward ---- */

/* Y (nt, rows) = X (nt, cols, fp16) . W^T (W (rows, cols) fp16, row-major): column-major cuBLAS
 * sees W as (cols x rows) and X as (cols x nt), so Y^T = W^T X with Y row t contiguous */
static int gemm_w(GpuModel *g, const __half *W, int rows, int cols, const __half *X, int nt,
                  float *Y) {
    const float one = 1.0f, zero = 0.0f;
    cublasCheck(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, nt, cols, &one, W, CUDA_R_16F,
                             cols, X, CUDA_R_16F, cols, &zero, Y, CUDA_R_32F, rows,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* Eq. (1), causal, for the nb queries q (nb, qd) at positions p0.. over Kl, Vl positions
 * 0..p0+nb-1 (a sliding layer's: the last `window` of each query's), into att (nb, qd). The plain
 * form (cuBLAS, fp32 scores), for the head dims and windows the fused kernel lacks. */
static int attention_tiles(GpuModel *g, int nb, int p0, int window) {
    /* For each query tile and KV head g, its group's heads at once: S = scale q.K^T (fp32,
     * pedantic), the causal softmax, att = S V; S goes through device memory (at most
     * s_tile_bytes a tile). */
    const Config *c = &g->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd, group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    const float one = 1.0f, zero = 0.0f;
    /* gpu_reserve sized S for the call's last batch, whose keys are the most: an earlier batch
     * has fewer keys and may fit more rows in the tile budget than S holds, so rows are capped
     * at what S holds (at least one: S holds a row of every position). A tile reads at most
     * kmax keys: all, or with a window its keys and the tile's rows. */
    int kmax = window > 0 && window < p0 ? window + nb : p0 + nb;
    size_t fit = g->cap_S / ((size_t)group * kmax);
    if (fit < 1)
        return fprintf(stderr, "attention_tiles: the score buffer holds no row of %d keys\n",
                       kmax),
               -1;
    for (int t0 = 0; t0 < nb;) {
        int tq = attn_tile_rows(group, kmax, nb - t0);
        if ((size_t)tq > fit) tq = (int)fit;
        /* keys k0..nk-1: from the first the tile's first query sees to the last query's own */
        int nk = p0 + t0 + tq, k0 = window > 0 && p0 + t0 + 1 > window ? p0 + t0 + 1 - window : 0;
        int nkt = nk - k0;
        /* <= cap_S by the cap above; checked, since past it S would overflow */
        size_t used = (size_t)group * tq * nkt;
        if (used > g->cap_S)
            return fprintf(stderr, "attention_tiles: a tile of %zu scores for a buffer of %zu\n",
                           used, g->cap_S),
                   -1;
        for (int kvh = 0; kvh < c->n_kv_heads; kvh++) {
            const float *K = g->Kl + ((size_t)kvh * g->cap_kv + k0) * hd,
                        *V = g->Vl + ((size_t)kvh * g->cap_kv + k0) * hd;
            const float *Q = g->q + (size_t)t0 * qd + (size_t)kvh * group * hd;
            float *O = g->att + (size_t)t0 * qd + (size_t)kvh * group * hd;
            /* S_b (nkt x tq, column r = query r) = K^T-view . Q_b, b over the group's heads */
            cublasCheck(cublasGemmStridedBatchedEx(
                g->blas, CUBLAS_OP_T, CUBLAS_OP_N, nkt, tq, hd, &scale, K, CUDA_R_32F, hd, 0, Q,
                CUDA_R_32F, qd, hd, &zero, g->S, CUDA_R_32F, nkt, (long long)tq * nkt, group,
                CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
            causal_softmax_kernel<<<dim3(tq, group), 256, 0, g->stream>>>(g->S, nkt, tq, p0 + t0,
                                                                          k0, window);
            cudaCheck(cudaGetLastError());
            /* O_b (hd x tq, ld qd) = V-view (hd x nkt) . P_b (nkt x tq) */
            cublasCheck(cublasGemmStridedBatchedEx(
                g->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, tq, nkt, &one, V, CUDA_R_32F, hd, 0, g->S,
                CUDA_R_32F, nkt, (long long)tq * nkt, &zero, O, CUDA_R_32F, qd, hd, group,
                CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
        }
        t0 += tq;
    }
    return 0;
}

/* the prefill batch's attention in layer l: the fused kernel (head dims 64, 128) or the tiles,
 * which alone mask a sliding layer's window */
static int attention_gpu(GpuModel *g, int l, int nb, int p0) {
    const Config *c = &g->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    if (layer_sliding(c, l)) return attention_tiles(g, nb, p0, c->swa_window);
    int rc =
        fused_attention && fused_head_dim(hd) && g->Kh
            ? attn_causal_launch(g->q, qd, g->Kh, g->Vh, (size_t)g->cap_kv * hd, nb, p0, c->n_heads,
                                 c->n_heads / c->n_kv_heads, hd, g->att, qd, g->stream)
            : 1;
    return rc == 1 ? attention_tiles(g, nb, p0, 0) : rc;
}

/* q, k, v of nb tokens (residual rows x) at positions pos..: rmsnorm, projections, biases, the
 * heads' norms (gemma3), RoPE with the layer's frequencies, the queries' scale (layer_forward) */
static int qkv_gpu(GpuModel *g, int l, const float *x, int nb, int pos) {
    const Config *c = &g->m->c;
    const GpuLayer *L = &g->layers[l];
    int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    rmsnorm_h_kernel<<<nb, 256, 0, g->stream>>>(x, L->attn_norm, g->xh, c->dim, c->norm_eps);
    /* the previous batch's queries may still be on their way to the host */
    cudaCheck(cudaStreamWaitEvent(g->stream, g->q_free, 0));
    if (gemm_w(g, L->wq, qd, c->dim, g->xh, nb, g->q) ||
        gemm_w(g, L->wk, kvd, c->dim, g->xh, nb, g->kb) ||
        gemm_w(g, L->wv, kvd, c->dim, g->xh, nb, g->vb))
        return -1;
    if (L->bq)
        add_bias_kernel<<<blocks_for((size_t)nb * qd), 256, 0, g->stream>>>(g->q, L->bq, qd,
                                                                            (size_t)nb * qd);
    if (L->bk)
        add_bias_kernel<<<blocks_for((size_t)nb * kvd), 256, 0, g->stream>>>(g->kb, L->bk, kvd,
                                                                             (size_t)nb * kvd);
    if (L->bv)
        add_bias_kernel<<<blocks_for((size_t)nb * kvd), 256, 0, g->stream>>>(g->vb, L->bv, kvd,
                                                                             (size_t)nb * kvd);
    /* rotation is linear: scaling q before it is scaling it after, as the CPU does */
    float q_scale = c->q_scale > 0 ? c->q_scale : 1.0f;
    if (L->q_norm)   /* build_gpu_model refuses a query scale without them */
        rmsnorm_f_kernel<<<nb * c->n_heads, 256, 0, g->stream>>>(g->q, L->q_norm, hd, c->norm_eps,
                                                                 q_scale);
    if (L->k_norm)
        rmsnorm_f_kernel<<<nb * c->n_kv_heads, 256, 0, g->stream>>>(g->kb, L->k_norm, hd,
                                                                    c->norm_eps, 1.0f);
    int half = c->rope_dim / 2, neox = c->rope_type == ROPE_NEOX;
    const float *inv_freq = layer_sliding(c, l) ? g->inv_freq_swa : g->inv_freq;
    rope_kernel<<<nb, 256, 0, g->stream>>>(g->q, c->n_heads, hd, half, pos, inv_freq, neox);
    rope_kernel<<<nb, 256, 0, g->stream>>>(g->kb, c->n_kv_heads, hd, half, pos, inv_freq, neox);
    cudaCheck(cudaGetLastError());
    return 0;
}

/* x += Wo att; x += W_down (act(W_gate xn) * W_up xn), act silu or (gemma3) gelu; gemma3 norms
 * each block's output before it is added */
static int out_ffn_gpu(GpuModel *g, int l, float *x, int nb) {
    const Config *c = &g->m->c;
    const GpuLayer *L = &g->layers[l];
    int qd = c->n_heads * c->head_dim;
    size_t nx = (size_t)nb * c->dim, nh = (size_t)nb * c->ffn_dim;
    f2h_kernel<<<blocks_for((size_t)nb * qd), 256, 0, g->stream>>>(g->att, g->xh, (size_t)nb * qd);
    if (gemm_w(g, L->wo, c->dim, qd, g->xh, nb, g->y)) return -1;
    if (L->post_attn_norm)
        rmsnorm_f_kernel<<<nb, 256, 0, g->stream>>>(g->y, L->post_attn_norm, c->dim, c->norm_eps,
                                                    1.0f);
    add_kernel<<<blocks_for(nx), 256, 0, g->stream>>>(x, g->y, nx);
    rmsnorm_h_kernel<<<nb, 256, 0, g->stream>>>(x, L->ffn_norm, g->xh, c->dim, c->norm_eps);
    if (gemm_w(g, L->w_gate, c->ffn_dim, c->dim, g->xh, nb, g->hg) ||
        gemm_w(g, L->w_up, c->ffn_dim, c->dim, g->xh, nb, g->hu))
        return -1;
    if (c->arch == ARCH_GEMMA3)
        geglu_h_kernel<<<blocks_for(nh), 256, 0, g->stream>>>(g->hg, g->hu, g->xh, nh);
    else swiglu_h_kernel<<<blocks_for(nh), 256, 0, g->stream>>>(g->hg, g->hu, g->xh, nh);
    if (gemm_w(g, L->w_down, c->dim, c->ffn_dim, g->xh, nb, g->y)) return -1;
    if (L->post_ffn_norm)
        rmsnorm_f_kernel<<<nb, 256, 0, g->stream>>>(g->y, L->post_ffn_norm, c->dim, c->norm_eps,
                                                    1.0f);
    add_kernel<<<blocks_for(nx), 256, 0, g->stream>>>(x, g->y, nx);
    cudaCheck(cudaGetLastError());
    return 0;
}

/* ---- W on the device: Alg. 1 line 6 during decoding ---- */
/* Each global layer keeps W's keys and values (§3.3), (n_kv, n_w, hd), n_w = sink + window:
 * position p in slot p below sink, else sink + (p - sink) % window, so the newest key overwrites
 * the one that left W. o_W is attn_partial_kernel over all n_w slots (order does not matter). */

/* layer l's place in Wk, Wv: the global layers before it (a sliding layer has no W) */
static int w_layer(const Config *c, int l) {
    int n = 0;
    for (int i = 0; i < l; i++) n += !layer_sliding(c, i);
    return n;
}

static int w_slot(const GpuModel *g, int p) {
    return p < g->w_sink ? p : g->w_sink + (p - g->w_sink) % g->w_window;
}

/* W's buffers for sink + window slots a layer; -1 when the device has no room */
static int w_build(GpuModel *g, int sink, int window) {
    const Config *c = &g->m->c;
    size_t e = (size_t)global_layers(c) * c->n_kv_heads * (sink + window) * c->head_dim;
    size_t no = (size_t)c->n_heads * (c->head_dim + 2);
    g->w_sink = sink, g->w_window = window, g->n_w = sink + window;
    if (!(g->w_last = (int *)malloc((size_t)c->n_layers * sizeof(int))) ||
        !(g->Wk = (float *)gpu_alloc(e, sizeof(float), NULL)) ||
        !(g->Wv = (float *)gpu_alloc(e, sizeof(float), NULL)) ||
        (g->cache_type &&
         !(g->stage = (float *)malloc((size_t)g->n_w * c->head_dim * sizeof(float)))) ||
        !(g->ow = (float *)gpu_alloc(no, sizeof(float), NULL)) ||
        cudaMallocHost(&g->ow_host, no * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();   /* clear the failed allocation's error, give back what was placed */
        if (g->Wk) cudaFree(g->Wk);
        if (g->Wv) cudaFree(g->Wv);
        if (g->ow) cudaFree(g->ow);
        g->Wk = g->Wv = g->ow = g->ow_host = NULL;
        return -1;
    }
    for (int l = 0; l < c->n_layers; l++) g->w_last[l] = -1;
    gpu_sample_memory();
    return 0;
}

/* rows [p, p + run) of host cache rows r into dst on the device: floats as they are; halves
 * converted into g->stage, the copy done before stage is used again */
static int upload_rows(GpuModel *g, float *dst, Rows r, int p, int run, int hd) {
    size_t bytes = (size_t)run * hd * sizeof(float);
    if (!r.f16) {
        cudaCheck(cudaMemcpyAsync(dst, (const float *)r.data + (size_t)p * hd, bytes,
                                  cudaMemcpyHostToDevice, g->stream));
        return 0;
    }
    for (int i = 0; i < run; i++) row_f32(r, (size_t)(p + i), hd, g->stage + (size_t)i * hd);
    cudaCheck(cudaMemcpyAsync(dst, g->stage, bytes, cudaMemcpyHostToDevice, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
}

/* positions [p0, p1) of layer l's host cache into its W, a run of consecutive slots at a time */
static int w_upload(GpuModel *g, const State *s, int l, int p0, int p1) {
    const Config *c = &g->m->c;
    int hd = c->head_dim;
    for (int p = p0; p < p1;) {
        int slot = w_slot(g, p), run = p1 - p;
        /* slots before the sink ends or the ring wraps */
        int room = p < g->w_sink ? g->w_sink - p : g->n_w - slot;
        if (run > room) run = room;
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t to = (((size_t)w_layer(c, l) * c->n_kv_heads + h) * g->n_w + slot) * hd;
            if (upload_rows(g, g->Wk + to, cache_rows(s, c, 0, l, h), p, run, hd) ||
                upload_rows(g, g->Wv + to, cache_rows(s, c, 1, l, h), p, run, hd))
                return -1;
        }
        p += run;
    }
    return 0;
}

/* Alg. 1 line 6 queued on the stream after q, k, v: the new key and value into layer l's W, o_W
 * of every query head, copied to ow_host (w_done). 1 when queued; 0 when the step has no W
 * (full attention, or a sliding layer, which attends to its window on the host) or W stays on
 * the host (no room, or not the W the device holds); -1 on a CUDA error. */
static int w_enqueue(GpuModel *g, State *s, int l, int pos) {
    const Config *c = &g->m->c;
    int hd = c->head_dim, nh = c->n_heads, sink, w0;
    if (layer_sliding(c, l) || !attention_w(s->attn, pos, &sink, &w0) || g->w_off ||
        hd > ATT_DMAX)
        return 0;
    int window = pos + 1 - w0;
    if (window <= 0) return 0;
    if (!g->Wk && w_build(g, sink, window)) {
        g->w_off = 1;
        fprintf(stderr,
                "ra: no device memory for W (%d positions a layer): attending it on the CPU\n",
                sink + window);
        return 0;
    }
    if (sink != g->w_sink || window != g->w_window || w0 < sink) return 0;
    if (g->w_last[l] != pos - 1) {   /* first step of this layer (or a gap): load W from the host */
        if (w_upload(g, s, l, 0, sink) || w_upload(g, s, l, w0, pos)) return -1;
    }
    size_t at = (size_t)w_layer(c, l) * c->n_kv_heads * g->n_w * hd;
    store_kv_kernel<<<1, 256, 0, g->stream>>>(g->kb, g->vb, g->Wk + at, g->Wv + at, NULL, NULL,
                                              c->n_kv_heads, hd, g->n_w, w_slot(g, pos),
                                              g->cache_type);
    attn_partial_kernel<<<nh, ATT_THREADS, 0, g->stream>>>(
        g->q, g->Wk + at, g->Wv + at, g->n_w, hd, nh / c->n_kv_heads, 1.0f / sqrtf((float)hd),
        g->ow, g->ow + (size_t)nh * hd, g->ow + (size_t)nh * hd + nh);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpyAsync(g->ow_host, g->ow, (size_t)nh * (hd + 2) * sizeof(float),
                              cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaEventRecord(g->w_done, g->stream));
    g->w_last[l] = pos;
    return 1;
}

/* attention_w_source's wait: o_W once the device has it; NULL (the host attends W) on an error,
 * after which every layer's W is loaded again at its next step (the store may not have run) */
static const float *w_wait(void *arg) {
    GpuModel *g = (GpuModel *)arg;
    cudaError_t e = cudaEventSynchronize(g->w_done);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "ra: o_W on the GPU failed (%s): attending W on the CPU\n",
                cudaGetErrorString(e));
        for (int l = 0; l < g->m->c.n_layers; l++) g->w_last[l] = -1;
        return NULL;
    }
    return g->ow_host;
}

/* a decoding step's layer: q, k, v to the host cache; o_W on the device (W there) while the host
 * runs the mode's attention (ra.c: the search, o_Omega, the Eq. 4-5 merge, and any insertion
 * not started ahead); back. The copies go through pinned buffers: into pageable memory a copy
 * holds the host until the device reaches it. */
static int decode_layer_gpu(GpuModel *g, State *s, int l, int pos) {
    const Config *c = &g->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    float *hq = g->qkv_host, *hk = hq + qd, *hv = hk + kvd;
    if (qkv_gpu(g, l, g->x, 1, pos)) return -1;
    cudaCheck(cudaMemcpyAsync(hq, g->q, qd * sizeof(float), cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaMemcpyAsync(hk, g->kb, kvd * sizeof(float), cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaMemcpyAsync(hv, g->vb, kvd * sizeof(float), cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaEventRecord(g->qkv_done, g->stream));
    int w = w_enqueue(g, s, l, pos);   /* Alg. 1 line 6, behind the copies on the same stream */
    if (w < 0) return -1;
    cudaCheck(cudaEventSynchronize(g->qkv_done));
    memcpy(s->q, hq, qd * sizeof(float));
    memcpy(s->kb, hk, kvd * sizeof(float));
    memcpy(s->vb, hv, kvd * sizeof(float));
    cache_store(s, c, l, pos, s->kb, s->vb);
    if (s->q_keep && kept_row(s, 0) >= 0)   /* as keep_queries (model.c) keeps a step's query */
        memcpy(s->q_keep + (size_t)kept_row(s, 0) * qd, s->q, qd * sizeof(float));
    if (w) attention_w_source(s->attn, w_wait, g);
    attention_layer(g->m, s, l, 1, pos); /* lines 7-9 on the host threads, W's output from w_wait */
    if (w) attention_w_source(s->attn, NULL, NULL);
    /* att_host is free again: the last layer's copy ran before this layer's q, k, v */
    memcpy(g->att_host, s->att, qd * sizeof(float));
    cudaCheck(cudaMemcpyAsync(g->att, g->att_host, qd * sizeof(float), cudaMemcpyHostToDevice,
                              g->stream));
    /* line 5 for the next step on the host's workers while the device finishes this layer and
     * computes the next one's q, k, v; the next layer's step waits for them first */
    attention_insert_ahead(s->attn, s, l, pos);
    return out_ffn_gpu(g, l, g->x, 1);
}

/* keep_queries' twin (model.c): the batch's queries that q_keep keeps (kept_row), from g->q to
 * the host on the copy stream. A run of kept queries at one spacing, whose rows ascend by one, is
 * one 2D copy whose source pitch, the spacing, is a small fraction of the limit on a pitch. */
static int next_kept(const State *s, int b0, int t, int nb) {
    while (t < nb && kept_row(s, b0 + t) < 0) t++;
    return t;
}

static int keep_queries_gpu(GpuModel *g, State *s, int qd, int b0, int nb) {
    size_t row = (size_t)qd * sizeof(float);
    int t = next_kept(s, b0, 0, nb);
    while (t < nb) {
        int u = next_kept(s, b0, t + 1, nb), gap = u < nb ? u - t : 1, rows = 1;
        while (u < nb && u - t == rows * gap && kept_row(s, b0 + u) == kept_row(s, b0 + t) + rows)
            rows++, u = next_kept(s, b0, u + 1, nb);
        float *to = s->q_keep + (size_t)kept_row(s, b0 + t) * qd;
        const float *from = g->q + (size_t)t * qd;
        if (gap == 1 || rows == 1)
            cudaCheck(
                cudaMemcpyAsync(to, from, (size_t)rows * row, cudaMemcpyDeviceToHost, g->copy));
        else
            cudaCheck(cudaMemcpy2DAsync(to, row, from, (size_t)gap * row, row, (size_t)rows,
                                        cudaMemcpyDeviceToHost, g->copy));
        t = u;
    }
    return 0;
}

/* State.prefill_attn_s on the device: each batch's attention lies between a pair of events (the
 * even batches' or the odd ones'), read two batches on and at the layer's end, so the device is
 * never left idle. An event that cannot be read adds nothing, and its error is cleared. */
static void attn_time_read(GpuModel *g, State *s, int p) {
    float ms = 0;
    if (!g->attn_pending[p]) return;
    if (cudaEventSynchronize(g->attn_ev[p][1]) == cudaSuccess &&
        cudaEventElapsedTime(&ms, g->attn_ev[p][0], g->attn_ev[p][1]) == cudaSuccess)
        s->prefill_attn_s += ms / 1000.0;
    else
        cudaGetLastError();
    g->attn_pending[p] = 0;
}

/* a prefill batch of layer l: rows b0.. of the call, positions pos..; its keys, values and
 * queries go to the host on the copy stream while the next batch computes */
static int prefill_batch_gpu(GpuModel *g, State *s, int l, int b0, int nb, int pos) {
    const Config *c = &g->m->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    float *x = g->x + (size_t)b0 * c->dim;
    if (qkv_gpu(g, l, x, nb, pos)) return -1;
    store_kv_kernel<<<nb, 256, 0, g->stream>>>(g->kb, g->vb, g->Kl, g->Vl, g->Kh, g->Vh,
                                               c->n_kv_heads, hd, g->cap_kv, pos, g->cache_type);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaEventRecord(g->kv_ready, g->stream));
    cudaCheck(cudaStreamWaitEvent(g->copy, g->kv_ready, 0));
    /* the queries first: the next batch's projections wait only for them (q_free); the keys and
     * values (positions no later batch of this layer writes) go on while it computes */
    if (s->q_keep && keep_queries_gpu(g, s, qd, b0, nb)) return -1;
    cudaCheck(cudaEventRecord(g->q_free, g->copy));
    /* into the host cache, position p at row p % ring (kv_ring: ctx, or a sliding layer's
     * ring): the batch's positions the ring holds, a run of rows up to its wrap at a time */
    int ring = kv_ring(s, l), kh = s->cache_type & CACHE_K_F16, vh = s->cache_type & CACHE_V_F16;
    for (int p = nb > ring ? pos + nb - ring : pos, run; p < pos + nb; p += run) {
        int row = p % ring;
        run = pos + nb - p < ring - row ? pos + nb - p : ring - row;
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t at = kv_offset(s, c, l, h) + (size_t)row * hd,
                   from = ((size_t)h * g->cap_kv + p) * hd, n = (size_t)run * hd;
            const void *k = kh ? (const void *)(g->Kh + from) : (const void *)(g->Kl + from),
                       *v = vh ? (const void *)(g->Vh + from) : (const void *)(g->Vl + from);
            cudaCheck(cudaMemcpyAsync((char *)s->k + at * cache_elem(s, 0), k,
                                      n * cache_elem(s, 0), cudaMemcpyDeviceToHost, g->copy));
            cudaCheck(cudaMemcpyAsync((char *)s->v + at * cache_elem(s, 1), v,
                                      n * cache_elem(s, 1), cudaMemcpyDeviceToHost, g->copy));
        }
    }
    int p = (b0 / g->B) % 2;
    attn_time_read(g, s, p);
    cudaCheck(cudaEventRecord(g->attn_ev[p][0], g->stream));
    if (attention_gpu(g, l, nb, pos)) return -1;
    cudaCheck(cudaEventRecord(g->attn_ev[p][1], g->stream));
    g->attn_pending[p] = 1;
    return out_ffn_gpu(g, l, x, nb);
}

static long rest_layers;   /* kv_upload's calls (gpu_rest_layers) */
extern "C" long gpu_rest_layers(void) { return rest_layers; }

/* positions p.. of layer l (run of them) from rows row.. of the host cache into Kl, Vl and, where
 * there (gpu_reserve: any half cached), their halves: halves copied and widened, or floats copied
 * and narrowed, as store_kv_kernel leaves them */
static int kv_upload_run(GpuModel *g, const State *s, int l, int p, int row, int run) {
    const Config *c = &g->m->c;
    int hd = c->head_dim;
    size_t n = (size_t)run * hd;
    for (int h = 0; h < c->n_kv_heads; h++) {
        size_t at = kv_offset(s, c, l, h) + (size_t)row * hd, to = ((size_t)h * g->cap_kv + p) * hd;
        for (int v = 0; v < 2; v++) {
            const char *from = (const char *)(v ? s->v : s->k) + at * cache_elem(s, v);
            float *F = (v ? g->Vl : g->Kl) + to;
            __half *H = v ? g->Vh : g->Kh;
            if (s->cache_type & (v ? CACHE_V_F16 : CACHE_K_F16)) {
                cudaCheck(cudaMemcpyAsync(H + to, from, n * sizeof(__half), cudaMemcpyHostToDevice,
                                          g->stream));
                h2f_kernel<<<blocks_for(n), 256, 0, g->stream>>>(H + to, F, n);
            } else {
                cudaCheck(cudaMemcpyAsync(F, from, n * sizeof(float), cudaMemcpyHostToDevice,
                                          g->stream));
                if (H) f2h_kernel<<<blocks_for(n), 256, 0, g->stream>>>(F, H + to, n);
            }
            cudaCheck(cudaGetLastError());
        }
    }
    return 0;
}

/* A prompt's rest (n > 1 at pos0 > 0: after a context file, or a -cnv turn): layer l's keys and
 * values of positions [0, pos0), or those a sliding layer's ring holds (more than its window),
 * from the host cache to the device, as they would be had the whole prompt run here. The
 * previous layer's copies are done: forward_gpu waits for them at each layer's end. */
static int kv_upload(GpuModel *g, const State *s, int l, int pos0) {
    int ring = kv_ring(s, l);
    for (int p = pos0 > ring ? pos0 - ring : 0, run; p < pos0; p += run) {
        run = pos0 - p < ring - p % ring ? pos0 - p : ring - p % ring;   /* up to the ring's wrap */
        if (kv_upload_run(g, s, l, p, p % ring, run)) return -1;
    }
    rest_layers++;
    return 0;
}

/* forward_cuda's failure: what failed and CUDA's last error on stderr (a failed cuBLAS call sets
 * none: cublasCheck has printed its status), NULL */
static float *forward_failed(const char *what) {
    cudaError_t e = cudaGetLastError();
    fprintf(stderr, "forward_cuda: %s failed: %s\n", what,
            e != cudaSuccess ? cudaGetErrorString(e) : "cuBLAS (above)");
    return NULL;
}

static float *forward_gpu(GpuModel *g, State *s, const int32_t *tokens, int n);

/* q_keep is page-locked only while a prefill copies into it: main frees it after the prefill */
extern "C" float *forward_cuda(GpuModel *g, State *s, const int32_t *tokens, int n) {
    if (s->cache_type != g->cache_type) {
        fprintf(stderr, "forward_cuda: the state's cache type is not its GPU model's\n");
        return NULL;
    }
    float *logits = forward_gpu(g, s, tokens, n);
    if (!logits) {   /* a failed batch may leave copies in flight: let them land */
        cudaStreamSynchronize(g->stream);
        cudaStreamSynchronize(g->copy);
        attn_time_read(g, s, 0);   /* the attention of the batches run before Ctrl-C or the error */
        attn_time_read(g, s, 1);
        cudaGetLastError();
    }
    pin_host(g, 2, NULL, 0);
    return logits;
}

static float *forward_gpu(GpuModel *g, State *s, const int32_t *tokens, int n) {
    const Model *m = g->m;
    const Config *c = &m->c;
    int dim = c->dim, pos0 = s->n, qd = c->n_heads * c->head_dim;
    if (n <= 0 || pos0 + n > s->ctx)
        return fprintf(stderr, "forward_cuda: %d tokens at %d do not fit %d\n", n, pos0, s->ctx),
               (float *)NULL;
    int rest = n > 1 && pos0 > 0;   /* a prompt's rest: its earlier keys are on the host */
    if (pos0 == 0 &&
        g->w_last) /* a new prompt: every layer's W is loaded again at its first step */
        for (int l = 0; l < c->n_layers; l++) g->w_last[l] = -1;
    /* a decoding step reserves only x, which a failed longer prefill may have freed */
    if ((n > 1 || g->cap_x < n) && gpu_reserve(g, n, n > 1 ? pos0 + n : 0)) {
        if (rest) {   /* the host holds every key: the CPU runs these tokens */
            fprintf(stderr, "ra: no device memory for %d tokens after %d: they run on the CPU\n",
                    n, pos0);
            return forward(m, s, tokens, n);
        }
        fprintf(stderr, "forward_cuda: no device memory for %d tokens\n", n);
        return NULL;
    }
    if (s->q_keep && n > 1) pin_host(g, 2, s->q_keep, (size_t)s->q_keep_n * qd * sizeof(float));
    embed_tokens(m, tokens, n, s->x);   /* rows dequantized on the host */
    /* on the stream, so the copy is done before the first layer reads x */
    if (cudaMemcpyAsync(g->x, s->x, (size_t)n * dim * sizeof(float), cudaMemcpyHostToDevice,
                        g->stream) != cudaSuccess)
        return forward_failed("the embeddings' upload");
    for (int l = 0; l < c->n_layers; l++) {
        if (n == 1) {
            if (decode_layer_gpu(g, s, l, pos0)) return forward_failed("a decoding step");
        } else {
            if (rest && kv_upload(g, s, l, pos0)) return forward_failed("the earlier keys' upload");
            for (int b0 = 0; b0 < n; b0 += g->B) {
                int nb = n - b0 < g->B ? n - b0 : g->B;
                if (prefill_batch_gpu(g, s, l, b0, nb, pos0 + b0))
                    return forward_failed("a prefill batch");
                if (s->progress) {
                    cudaStreamSynchronize(g->stream);
                    s->progress(s->progress_arg,
                                ((double)l * n + b0 + nb) / ((double)c->n_layers * n));
                }
                /* copies done */
                if (s->stop && s->stop()) return cudaDeviceSynchronize(), (float *)NULL;
            }
            if (cudaStreamSynchronize(g->stream) != cudaSuccess ||
                cudaStreamSynchronize(g->copy) != cudaSuccess)
                return forward_failed("a prefill layer");
            attn_time_read(g, s, 0);
            attn_time_read(g, s, 1);
        }
        gpu_sample_memory();
        if (s->layer_done) s->layer_done(s->layer_arg, l, pos0, n);
        if (s->stop && s->stop()) return NULL;
    }
    /* logits of the last token only */
    const float *xl = g->x + (size_t)(n - 1) * dim;
    rmsnorm_h_kernel<<<1, 256, 0, g->stream>>>(xl, g->out_norm, g->xh, dim, c->norm_eps);
    if (gemm_w(g, g->output, c->vocab_size, dim, g->xh, 1, g->logits))
        return forward_failed("the logits");
    if (cudaMemcpyAsync(s->logits, g->logits, (size_t)c->vocab_size * sizeof(float),
                        cudaMemcpyDeviceToHost, g->stream) ||
        cudaStreamSynchronize(g->stream))
        return forward_failed("the logits' download");
    s->n += n;
    return s->logits;
}
