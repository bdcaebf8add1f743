/* ra.h - the one shared header of ra, a reference implementation of
 * RetrievalAttention (Liu et al., 2024, "RetrievalAttention: Accelerating
 * Long-Context LLM Inference via Vector Retrieval").
 *
 *   ra.c        the method in the paper's order: attention and the merge (Eq. 1-5), the index
 *               (§3.2), search and insertion, the decoding step (Alg. 1), the baselines; then
 *               the ./ra program
 *   model.c     the engine: GGUF reader, dequantization, tokenizer, thread pool, forward pass,
 *               sampling, and the fast kernels tested against ra.c's plain functions
 *   ra_cuda.cu  GPU twins of the CPU functions (extern "C")
 *
 * Every array in a struct carries its shape in a comment, outermost dimension first.
 */
#ifndef RA_H
#define RA_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Errors: functions that can fail on input return -1 and write a one-line  */
/* message into a caller buffer of this size.                               */
/* ------------------------------------------------------------------------ */

#define ERR_LEN 512

/* Checked allocation (ra.c): out of memory ends the run with one line. die: one line on stderr
 * ("ra: error: ..."), exit status 1. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* ------------------------------------------------------------------------ */
/* GGUF file (model.c)                                                      */
/* ------------------------------------------------------------------------ */

typedef struct { const char *s; uint64_t len; } Str;   /* s (len): a byte view, no NUL */

enum {  /* GGUF metadata value types */
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_NTYPES = 13
};

typedef struct {
    Str key;
    uint32_t type;          /* GGUF_* value type */
    uint32_t elem_type;     /* element type when type == GGUF_ARRAY */
    uint64_t n;             /* number of elements (1 for a scalar) */
    const uint8_t *data;    /* (n of elem_type, or 1 of type) the value's bytes in the map */
    Str *strs;              /* (n) views of the strings of a string array, else NULL */
} GGUFKV;

typedef struct {
    Str name;
    uint32_t n_dims;
    int64_t ne[4];          /* (n_dims) sizes, ne[0] the fastest (a row), unused dims are 1 */
    uint32_t type;          /* ggml tensor type, GGML_* */
    uint64_t offset;        /* from the start of the data section */
    uint64_t nbytes;
    const void *data;       /* (nbytes) the tensor's blocks in the map */
} GGUFTensor;

typedef struct {
    char path[256];         /* (256) the file's path, NUL-terminated, cut to fit */
    uint8_t *map;           /* (size) the whole file, mapped read-only */
    size_t size;
    int mapped;             /* 1: map is our mmap (free_gguf unmaps it); 0: the caller's memory */
    uint32_t version;       /* 2 or 3 */
    uint64_t n_kv, n_tensors, alignment, data_offset;
    GGUFKV *kv;             /* (n_kv) */
    GGUFTensor *tensors;    /* (n_tensors) */
} GGUF;

int  build_gguf(GGUF *g, const char *path, char *err);
int  build_gguf_from_memory(GGUF *g, const uint8_t *buf, size_t size, const char *name, char *err);
void free_gguf(GGUF *g);
/* drops the mapped file's pages from this process's resident memory (madvise): the map stays
 * valid and a later read faults its page back in from the file. build_gpu_model calls it once
 * the weights are on the device. Nothing for the caller's memory (mapped 0). */
void gguf_release_pages(const GGUF *g);
const GGUFKV *gguf_find(const GGUF *g, const char *key);
const GGUFTensor *gguf_tensor(const GGUF *g, const char *name);
/* Typed getters: 1 when found and of a convertible type, 0 when absent, -1 when present with a
 * wrong type. */
int gguf_get_int(const GGUF *g, const char *key, int64_t *out);
int gguf_get_float(const GGUF *g, const char *key, float *out);
int gguf_get_str(const GGUF *g, const char *key, Str *out);
int gguf_get_bool(const GGUF *g, const char *key, int *out);

/* ------------------------------------------------------------------------ */
/* Tensor types and dequantization (model.c)                                */
/* ------------------------------------------------------------------------ */

enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q8_1 = 9,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_Q8_K = 15,
    GGML_IQ2_XXS = 16,
    GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23,
    GGML_BF16 = 30
};

typedef struct { const char *name; int block_elems; int block_bytes; int supported; } TypeInfo;

const TypeInfo *type_info(uint32_t type);               /* NULL for an unknown id */
int64_t type_row_bytes(uint32_t type, int64_t n);       /* -1: unknown type or n not whole blocks */
int   dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
/* y[r] = W[r,:] . x for rows r0..r1-1 of W (rows of n elements of `type`) */
void matvec_rows(uint32_t type, const void *W, int64_t n, const float *x, float *y, int64_t r0,
                 int64_t r1);

/* ------------------------------------------------------------------------ */
/* Tokenizer (model.c)                                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *model;      /* tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SentencePiece) */
    const char *pre;        /* tokenizer.ggml.pre, or NULL */
    int n_vocab;
    const Str *tokens;      /* (n_vocab) */
    const float *scores;    /* (n_vocab) or NULL */
    const int32_t *types;   /* (n_vocab) TOK_NORMAL .. TOK_BYTE (1..6), or NULL */
    int n_merges;
    const Str *merges;      /* (n_merges) "left right", rank = index */
    int bos_id, eos_id, eot_id, unk_id, pad_id;   /* -1 when absent */
    int add_bos, add_eos, add_space_prefix;       /* -1 when absent: the model kind's default */
} TokenizerSpec;

enum { TOK_BPE = 1, TOK_SPM = 2 };                                   /* Tokenizer.kind */
enum { TOK_PRE_DEFAULT, TOK_PRE_GPT2, TOK_PRE_SMOLLM, TOK_PRE_LLAMA3, /* Tokenizer.pre: which */
       TOK_PRE_QWEN2, TOK_PRE_FALCON };                               /* split regexes (BPE) */
enum { TOK_NORMAL = 1, TOK_UNKNOWN, TOK_CONTROL, TOK_USER_DEFINED,    /* token types as in GGUF; */
       TOK_UNUSED, TOK_BYTE };                                        /* 0 = undefined */

typedef struct Tokenizer {
    int kind;               /* TOK_BPE or TOK_SPM */
    int pre;                /* TOK_PRE_*, BPE only */
    int n_vocab;
    char *text;             /* (text_off[n_vocab]) the GGUF's token strings, back to back */
    uint32_t *text_off;     /* (n_vocab+1) token i is text[text_off[i] .. text_off[i+1]) */
    float *score;           /* (n_vocab) SPM merge priority, higher merges first */
    uint8_t *type;          /* (n_vocab) TOK_NORMAL .. TOK_BYTE */
    int n_keys;             /* lookup strings: the n_vocab tokens, then BPE merges not in it */
    char *key;              /* (key_off[n_keys]) raw bytes (BPE: byte map undone) or text (SPM) */
    uint32_t *key_off;      /* (n_keys+1) key i is key[key_off[i] .. key_off[i+1]); empty: none */
    int32_t *key_hash;      /* (key_cap) open addressing over keys: key id, -1 = empty slot */
    uint32_t key_cap;       /* power of two */
    uint64_t *pair;         /* (pair_cap) BPE merges: (left + 1) << 32 | (right + 1), 0 empty */
    int32_t *pair_rank;     /* (pair_cap) merge rank = index in the merges, lower first */
    int32_t *pair_merged;   /* (pair_cap) key of the merged string */
    uint32_t pair_cap;      /* power of two */
    int32_t byte_tok[256];  /* (256) BPE: each byte's key; SPM: byte fallback token, -1 none */
    int32_t *special;       /* (n_special) control, user-defined, unknown; longest first */
    int n_special;
    int bos_id, eos_id, eot_id, unk_id, pad_id;            /* -1 when absent */
    int add_bos, add_eos, add_space_prefix, ignore_merges; /* resolved flags, 0 or 1 */
} Tokenizer;

/* 0 ok, -1 error with a one-line message in err */
int  build_tokenizer(Tokenizer *t, const TokenizerSpec *spec, char *err, size_t errlen);
void free_tokenizer(Tokenizer *t);
/* Encode len bytes of UTF-8 text. add_special: BOS/EOS as the model's flags say. parse_special:
   control tokens written as text become their ids. Returns the number of ids (only max_out are
   written when it is larger), or -1 on error. */
int  tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int add_special,
                      int parse_special, int32_t *out, int max_out);
/* Bytes of one token (control/unknown tokens give "" unless render_special). Returns the byte
   count, which may exceed cap (then only cap bytes are written), or -1 for a bad id. */
int  tokenizer_decode_piece(const Tokenizer *t, int32_t id, int render_special, char *buf, int cap);
/* the tokenizer described by a GGUF file's tokenizer.ggml.* metadata */
int  build_tokenizer_from_gguf(Tokenizer *t, const GGUF *g, char *err);
/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF) */
int  utf8_valid(const unsigned char *s, size_t n);
/* the id of the token whose text is exactly s, or -1 */
int  tokenizer_find(const Tokenizer *t, const char *s);
/* 1 when id ends generation: EOS, EOT, or an end-of-turn control token (<|im_end|>, <|eot_id|>,
 * ...) */
int  tokenizer_is_eog(const Tokenizer *t, int32_t id);

/* Chat formats (llama.cpp's built-in templates) for one user message, the assistant's turn opened
 */
enum { CHAT_NONE, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_LLAMA2_STRIP, CHAT_MISTRAL_V1,
       CHAT_MISTRAL_V3, CHAT_MISTRAL_V3_TEKKEN, CHAT_MISTRAL_V7, CHAT_MISTRAL_V7_TEKKEN,
       CHAT_GEMMA, CHAT_LLAMA2_BOS /* llama2's, a BOS opening each later turn */,
       CHAT_N /* the count */ };
/* llama.cpp's name for the format of tmpl, a format's name or a Jinja chat template, or NULL when
   it names none; *format is the format, CHAT_NONE where ra does not write it (e.g. "zephyr") */
const char *chat_detect(const char *tmpl, int *format);
/* msg in the format (malloc'd), or NULL for CHAT_NONE or out of memory */
char *chat_apply(int format, const char *msg);
/* a conversation's pieces in the format: pre opens a user turn, post closes it and opens the
 * assistant's, end closes the assistant's (the end-of-turn token and what follows it); -1 for
 * CHAT_NONE */
int  chat_parts(int format, const char **pre, const char **post, const char **end);


/* ------------------------------------------------------------------------ */
/* Thread pool (model.c): persistent pthreads, one parallel loop at a time  */
/* ------------------------------------------------------------------------ */

typedef void (*TaskFn)(void *arg, int64_t i0, int64_t i1, int thread);
typedef struct Pool Pool;
/* the CPUs this process may run on (its affinity mask, as nproc counts them: a container's
 * cpuset, taskset), at least 1: ./ra's default -t, and the pool's measure of oversubscription */
int   cpu_count(void);
/* seconds on a monotonic clock: the timings of the forward pass, the builds, --stats */
double now_s(void);
Pool *build_pool(int nthreads);
void  free_pool(Pool *p);
int   pool_threads(const Pool *p);
/* Run fn over [0, n) split into contiguous chunks, one per thread; returns when all are done. */
void  pool_for(Pool *p, int64_t n, TaskFn fn, void *arg);
/* Start fn over [0, n) on the workers alone (threads 1 .. n-1, one contiguous chunk each) and
 * return at once, so the caller can go on with other work; with no workers it runs here, now.
 * pool_wait returns when it is done; pool_for, pool_start and free_pool wait for it first. */
void  pool_start(Pool *p, int64_t n, TaskFn fn, void *arg);
void  pool_wait(Pool *p);
/* fn(ctx, lo, hi, tid) on contiguous slices of [0, n), a thread each (at most MAX_THREADS),
 * started for this call: the index builds, one per thread, run their own steps in parallel */
enum { MAX_THREADS = 64 };
typedef void (*RangeFn)(void *ctx, int lo, int hi, int tid);
void  parallel_for(int n, int nthreads, RangeFn fn, void *ctx);
/* the calling thread, and the threads it starts from now on, run only on CPU time that nothing
 * else wants (SCHED_IDLE; where refused, the lowest nice): the index builds beside decoding */
void  thread_background(void);

/* The top-k heap of every exact search (model.c). A Hit is a scored key; "better" is the higher
 * score, then the lower id, the tie rule of every top-k. heap_offer keeps the best cap hits in h
 * (cap), its root h[0] the worst kept; heap_write sorts them best first, writes their ids and
 * returns how many. */
typedef struct { float s; int32_t id; } Hit;
void heap_offer(Hit *h, int *n, int cap, Hit x);
int  heap_write(Hit *h, int n, int32_t *ids_out);

/* ------------------------------------------------------------------------ */
/* Model (model.c)                                                          */
/* ------------------------------------------------------------------------ */

enum { ARCH_LLAMA = 0, ARCH_QWEN2 = 1, ARCH_GEMMA3 = 2 };
enum { ROPE_NORM = 0, ROPE_NEOX = 1 };   /* pairs (2i, 2i+1) vs (i, i + rot/2) */

typedef struct {
    int arch;               /* ARCH_* */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, ctx_train;
    float norm_eps;
    float rope_base;
    int rope_dim;           /* rotated dims per head (<= head_dim) */
    int rope_type;          /* ROPE_* */
    float rope_scale;       /* linear position scaling: positions divided by this (1 = none) */
    int swa_window;         /* keys a sliding layer's query sees, its own the last (0: none) */
    int swa_pattern;        /* layer l slides when l % swa_pattern < swa_pattern - 1 (0: none) */
    float rope_base_swa;    /* the sliding layers' RoPE base, unscaled */
    float embd_scale;       /* token embeddings times this, 0 read as 1 (gemma3: sqrt(dim)) */
    float q_scale;          /* queries times this after RoPE, 0 read as 1 (gemma3 27B's) */
} Config;

/* "llama", "qwen2" or "gemma3" */
const char *arch_name(const Config *c);
/* 1 when layer l attends to its last swa_window keys only (a sliding layer), else 0 */
int layer_sliding(const Config *c, int l);
/* the layers that attend to every key, not sliding: RetrievalAttention's */
int global_layers(const Config *c);

typedef struct {            /* a weight matrix as stored in the file */
    const void *data;       /* (rows, cols) in `type` blocks, row-major */
    uint32_t type;
    int64_t rows, cols;
    int64_t row_bytes;
} Mat;

typedef struct {
    float *attn_norm;       /* (dim) */
    Mat wq, wk, wv, wo;     /* (n_heads*hd, dim), (n_kv*hd, dim) x 2, (dim, n_heads*hd) */
    float *bq, *bk, *bv;    /* (n_heads*hd), (n_kv*hd), (n_kv*hd): qwen2 only, else NULL */
    float *q_norm, *k_norm; /* (hd), (hd) RMSNorm of each query and key head: gemma3, else NULL */
    float *post_attn_norm;  /* (dim) RMSNorm of the attention's output: gemma3, else NULL */
    float *ffn_norm;        /* (dim) */
    Mat w_gate, w_up, w_down;   /* (ffn, dim), (ffn, dim), (dim, ffn) */
    float *post_ffn_norm;   /* (dim) RMSNorm of the FFN's output: gemma3, else NULL */
} Layer;

typedef struct {
    Config c;
    GGUF gguf;
    Tokenizer tok;
    Mat tok_embd;           /* (vocab, dim) */
    Mat output;             /* (vocab, dim): tok_embd when the embedding is tied */
    float *out_norm;        /* (dim) */
    float *rope_freqs;      /* (rope_dim/2) Llama 3.1 frequency divisors, or NULL */
    float *rope_inv_freq;   /* (rope_dim/2) theta_i = base^(-2i/rope_dim) / freqs[i] / rope_scale */
    float *rope_inv_freq_swa; /* (rope_dim/2) the sliding layers' theta_i (rope_base_swa), or
                                 NULL */
    Layer *layers;          /* (n_layers) */
    char name[128];         /* (128) general.name, or the file name; NUL-terminated, cut to fit */
} Model;

int  build_model(Model *m, const char *path, char *err);
void free_model(Model *m);
/* linear RoPE scaling: positions divided by scale (the model's own is in its GGUF) */
void model_set_rope_scale(Model *m, float scale);

/* ------------------------------------------------------------------------ */
/* The method on plain float arrays (ra.c), and its fast twins (model.c)    */
/* ------------------------------------------------------------------------ */
/* A matrix's rows as a KV cache holds them: row i at data + i * ld elements, each a float, or
 * an IEEE half where f16 is set (-ctk/-ctv f16). Every reader computes in floats. */
typedef struct { const void *data; size_t ld; int f16; } Rows;   /* data (rows, ld) */
enum { HEAD_DIM_MAX = 1024 };   /* the longest row a model may have (build_model checks) */
Rows rows_f32(const float *data, size_t ld);
Rows rows_from(Rows r, size_t i);                            /* the rows from row i on */
/* w . x as 8 lane sums added in a fixed order, then the tail: the one dot product of the
 * matmuls and of the index, so every kernel gives the same bits for the same pair (model.c) */
float dot8(const float *w, const float *x, int n);
const float *row_f16_f32(Rows r, size_t i, int d, float *buf);   /* row_f32's halves (model.c) */
float dot_row_f16(const float *q, Rows K, size_t i, int d);      /* dot_row's halves (model.c) */
/* row i (d elements) as floats: the row itself, or its halves converted into buf (d) */
static inline const float *row_f32(Rows r, size_t i, int d, float *buf) {
    return r.f16 ? row_f16_f32(r, i, d, buf) : (const float *)r.data + i * r.ld;
}
/* q . row i, by dot8 (on halves, dot8's bits on the row as floats) */
static inline float dot_row(const float *q, Rows K, size_t i, int d) {
    return K.f16 ? dot_row_f16(q, K, i, d) : dot8(q, (const float *)K.data + i * K.ld, d);
}

/* Attention, Eq. (1)-(5) */
/* one side of Eq. (4): a partial output o (d), its local max z~ and sum_i e^{z_i - z~} */
typedef struct { const float *o; float zmax, sumexp; } Partial;
void attn_partial(const float *q, Rows K, Rows V, const int32_t *ids, int n, int d, float scale,
                  float *o, float *zmax, float *sumexp);
/* attn_partial's fast twin for keys by id (Alg. 1 line 8, Omega): their values' rows requested
 * before the scan, while the keys are scored (model.c); the same bits */
void attn_partial_ids(const float *q, Rows K, Rows V, const int32_t *ids, int n, int d,
                      float scale, float *o, float *zmax, float *sumexp);
void attn_merge(const float *o1, float m1, float s1, const float *o2, float m2, float s2,
                int d, float *out, float *m_out, float *s_out);
/* Eq. (5): the merge's weights of two partials (z~, sum each); returns their union's sum */
double attn_gammas(float m1, float s1, float m2, float s2, float *g1, float *g2);
void attn_full(const float *q, Rows K, Rows V, int n, int d, float scale, float *out);

/* Exact top-k: knn_topk in plain loops (ra.c), the oracle of knn_topk_blocked (model.c), which
 * the builds run, and of knn_topk_cuda; each also gives each key's top query, top_query (nk) or
 * NULL. knn_topk_blocked returns 1 when it scored on AMX tiles (its rule: knn_topk_cuda's), else
 * 0. knn_blocked_bytes is what knn_topk_blocked holds */
void knn_topk(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
              int Nq, int32_t *ids_out, int32_t *top_query, int nthreads);
int  knn_topk_blocked(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
                      int Nq, int32_t *ids_out, int32_t *top_query, int nthreads);
double knn_blocked_bytes(int nk, int d, int Nq, int nthreads);
/* out[j] = q . row rows[j] (NULL: j) of K, by dot8 (model.c) */
void dot_rows(const float *q, Rows K, const int32_t *rows, int n, int d, float *out);
/* a cache hint: rows ids[0..n) of r (d wide) requested now; no result changes */
void prefetch_rows(Rows r, const int32_t *ids, int n, int d);
int flat_topk(const float *q, Rows K, const int32_t *ids, int n, int d, int topk,
              int32_t *ids_out, int *n_scored);
/* flat_topk's fast twin for a few keys (step (d)'s lists): n <= RANK_MAX with no two scores tied
 * ranked at once (rank_distinct), else flat_topk; the same ids in the same order (model.c) */
int flat_topk_few(const float *q, Rows K, const int32_t *ids, int n, int d, int topk,
                  int32_t *ids_out, int *n_scored);
/* flat_topk's scan for the g query heads of one KV head at once (App. C: the group reads each
 * key once), over rows [lo, hi) of K: head i's best `cap` keys by heap_offer's order, in no
 * order, into hits + i ldh (2 cap slots each), their count in n[i * ldn]; scores dot_row's bits,
 * NaN skipped. Merged over runs of keys, they give flat_topk's ids (model.c; oracle flat_topk) */
void flat_scan_group(const float *q, int g, Rows K, int lo, int hi, int d, int cap, Hit *hits,
                     size_t ldh, int *n, size_t ldn);
/* rank[i] = how many of the n scores s beat s[i]; 1 when none ties or is NaN, the counts then
 * being a sort's places, best first (model.c; the sorts' fast path, oracle: a sort). Its cost
 * grows as n^2: beyond RANK_MAX a sort is faster. */
enum { RANK_MAX = 256 };
int rank_distinct(const float *s, int n, int32_t *rank);

/* The attention-aware index of §3.2 */
typedef struct {
    int nq_knn;     /* Nq: exact nearest keys per prefill query (Fig. 3b), default 100 */
    int max_degree; /* M: bound on every key's out-degree, default 24 */
    int q_stride;   /* build from every q_stride-th prefill query; default 0: the sample
                       ra_query_sample chooses from the prompt length */
    int ef_conn;    /* L: the connectivity search's beam (step d's rare searches), default
                       ra_default_ef_conn(q_stride) */
    int nthreads;   /* build threads, default 1 */
    int n_guide;    /* prefill queries kept to guide insertions, default 1024 (0: none) */
    int capacity;   /* nodes allocated at build, for the keys insertions will add (0: the built
                       keys only); past it ra_insert doubles the arrays */
    int gpu_knn;    /* step (a) by knn_topk_cuda (knn_topk_blocked if it fails), default 0 */
    int conn_seed;  /* step (d)'s searches, for keys whose top query lists nothing reachable,
                       also start at the key's neighbours in position, default 1 (0: at the
                       entry alone) */
    int conn_search; /* 1: step (d) links every key the BFS misses by a search with the key, as
                        RoarGraph; default 0: only those whose top query lists nothing reachable */
    int n_entry;    /* entry points a search offers its beam once the walk from the entry and the
                       seeds is done: the keys, cut into n_entry equal runs of positions, give each
                       run's most-listed key, default 16 (1: the entry alone, as RoarGraph's
                       search; the paper does not describe one) */
    int plain_knn;  /* 1: step (a) by knn_topk, the plain loops (./ra --reference); default 0 */
    int trace_keys; /* 1: keep step (d)'s keys, and how each was linked (BuildTrace.d_keys) */
} RAParams;

enum { GUIDE_TOP = 8, GUIDE_USE = 8,   /* ra_insert: best keys kept per guide query, guides used */
       GUIDE_AHEAD = 8 };               /* keys whose guides ra_insert_ahead works out at once */

typedef struct {    /* build_ra_index step by step (--trace); (d)'s ways: n_repaired, n_searched */
    long a_links;   /* (a) query-key links: the entries of the used queries' KNN lists */
    int a_keys;     /* (a) keys in at least one list */
    int b_linked;   /* (b) keys with out-links after the projection */
    long b_cand;    /* (b) candidates the occlusion rule walked, over the pivots */
    long b_edges;   /* (b) edges it kept */
    int b_deg_max;  /* (b) the largest out-degree */
    long c_added;   /* (c) edges the reverse step added */
    long d_net;     /* (d) edges it added, less those its prunings of u's list dropped */
    int32_t *d_keys;  /* (n_repaired) or NULL (RAParams.trace_keys): the keys (d) linked, in
                         order, u by its top query's list, -1 - u by a search */
} BuildTrace;

typedef struct {
    int n;          /* keys indexed (nodes) */
    int cap;        /* nodes allocated */
    int M;          /* degree bound */
    int entry;      /* the key in the most KNN lists, step (d)'s start; -1 while empty */
    int n_entry;    /* entry points */
    int32_t *entries; /* (n_entry) where ra_search starts: entries[0] = entry, then one per run
                         of positions (RAParams.n_entry), offered after the entry's walk */
    int ef_conn;    /* beam width of ra_insert's search when it has no guides */
    int n_guide;    /* guide queries kept */
    float *guide;   /* (n_guide, d) a sample of the prefill queries, for ra_insert */
    float *guide_thr; /* (n_guide) score of each guide query's Nq-th nearest key */
    int32_t *guide_top; /* (n_guide, GUIDE_TOP) the best keys (nodes) of each guide query */
    int32_t *ahead;     /* (GUIDE_AHEAD, GUIDE_USE * GUIDE_TOP) ra_insert's candidates for keys
                           ahead0 .. ahead0 + n_ahead - 1, from ra_insert_ahead (NULL before) */
    int32_t *ahead_nc;  /* (GUIDE_AHEAD) their counts */
    int ahead0, n_ahead;
    int32_t *adj;   /* (cap, M) out-neighbours of each node, as node numbers */
    int32_t *deg;   /* (cap) out-degree of each node */
    int32_t *indeg; /* (cap) in-degree of each node */
    double t_knn, t_proj, t_conn; /* build seconds: (a) KNN, (b)+(c) projection, (d) repair */
    int knn_gpu;    /* 1: step (a)'s KNN ran on the GPU (knn_topk_cuda), 0: on the CPU */
    int knn_amx;    /* 1: ... on the CPU's AMX tiles (knn_topk_blocked), 0: not */
    int n_repaired; /* nodes the connectivity step had to link */
    int n_searched; /* ... of them, those it found by a search (their top query had no link) */
    int n_query;    /* prefill queries the build used (ra_query_sample) */
    long conn_scored; /* keys its searches scored, over all of them */
    BuildTrace bt;  /* what each step did, for --trace */
} RAIndex;

typedef struct { float s; int32_t node, done; } Cand; /* one beam entry */
int cand_better(Cand a, Cand b);   /* a before b: the higher score, then the lower id */
/* c (n) sorted by cand_better; tmp, s, rank (n) scratch (model.c) */
void sort_cands(Cand *c, int n, Cand *tmp, float *s, int32_t *rank);

typedef struct {    /* per-thread search state; grows on demand */
    uint32_t *mark; /* (cap) epoch at which each node was last scored */
    uint32_t epoch;
    int cap, ef, m;
    Cand *pool;     /* (ef) beam, best first */
    int32_t *nb;    /* (m) neighbours being scored */
    float *nbs;     /* (m) their scores */
    int hops;       /* keys the last search expanded (its walk's steps) */
} SearchScratch;

RAParams ra_default_params(void);
int ra_default_ef_conn(int q_stride);
/* the rows of the nq prefill queries a build uses (q_stride 0: the default sample); the count */
int ra_query_sample(int nq, int q_stride, int32_t *rows);
/* slot (nq): the row of each query among those ra_query_sample picks, or -1; their count. The
 * map State.q_keep_row, so that a prefill keeps only the queries its builds read. */
int ra_query_slots(int nq, int q_stride, int32_t *slot);
int build_ra_index(RAIndex *ix, const float *Q, int nq, int ldq, const float *K, int nk,
                   int ld, int d, const RAParams *p);
void free_ra_index(RAIndex *ix);
/* host bytes a build_ra_index call holds at its peak beyond the index it returns */
double ra_build_bytes(int nq, int nk, int d, const RAParams *p);
void build_search_scratch(SearchScratch *s);
void free_search_scratch(SearchScratch *s);
/* the beam of a search for topk of n keys, out-degree M, when --ef is not given */
int ra_auto_ef(int topk, int n, int M);
int ra_search(const RAIndex *ix, const float *q, Rows K, int d, int ef, const int32_t *seeds,
              int n_seeds, int topk, int32_t *ids_out, int *n_scored, SearchScratch *s);
/* the search's walk: beam_walk, plain, or its fast twin beam_walk_fast, which the engine runs
 * (ra.c's Part 2: it resumes where the beam changed and requests the next out-list early) */
typedef void BeamWalk(const RAIndex *ix, const float *q, Rows K, int d, int ef, int *np,
                      int *n_scored, SearchScratch *s);
BeamWalk beam_walk, beam_walk_fast;
int ra_search_by(BeamWalk *walk, const RAIndex *ix, const float *q, Rows K, int d, int ef,
                 const int32_t *seeds, int n_seeds, int topk, int32_t *ids_out, int *n_scored,
                 SearchScratch *s);
/* the beam's steps (ra.c): keys offered to it, one key into it (its slot, or -1) */
void beam_offer(const RAIndex *ix, const float *q, Rows K, int d, int ef, const int32_t *v, int n,
                int *np, int *n_scored, SearchScratch *s);
int pool_insert(Cand *pool, int *n, int ef, Cand x);
int ra_insert(RAIndex *ix, Rows K, int d, SearchScratch *s);
/* a cache hint (model.c): the out-lists and degrees of nodes[0..n) requested; no result changes */
void prefetch_lists(const RAIndex *ix, const int32_t *nodes, int n);
/* the same for the in-degrees of their out-neighbours */
void prefetch_indeg(const RAIndex *ix, const int32_t *nodes, int n);
/* ra_insert's halves: key ix->n linked to candidates (none: a search's); the guides' top keys */
int ra_insert_linked(RAIndex *ix, Rows K, int d, const int32_t *cand, int nc, SearchScratch *s);
int guide_keys(const RAIndex *ix, Hit *best, int nb, int32_t *c);
/* ra_insert's fast twin (model.c): the guide step of the next keys (K holds n_keys rows) in one
 * pass over the guides, kept in the index (ahead); the same graph */
int ra_insert_ahead(RAIndex *ix, Rows K, int d, int n_keys, SearchScratch *s);

/* IVF baseline */
typedef struct {
    int nlist, n, d;
    float *cent;    /* (nlist, d) centroids */
    int32_t *off;   /* (nlist+1) list l holds ids[off[l] .. off[l+1]) */
    int32_t *ids;   /* (n) key ids grouped by list, ascending within a list */
} IVFIndex;

/* the lists of --attn ivf's index over n keys: 4 sqrt(n), at least 1 and at most n */
int ivf_nlist(int n);
int build_ivf(IVFIndex *ix, const float *K, const int32_t *ids, int n, int ld, int d,
              int nlist, int iters, uint64_t seed, int nthreads);
void free_ivf(IVFIndex *ix);
int ivf_search(const IVFIndex *ix, const float *q, Rows K, int d, int nprobe, int topk,
               int32_t *ids_out, int *n_scored);

/* ------------------------------------------------------------------------ */
/* Attention modes and their state (ra.c)                                   */
/* ------------------------------------------------------------------------ */

enum { ATTN_FULL = 0, ATTN_RA = 1, ATTN_FLAT = 2, ATTN_IVF = 3, ATTN_STREAMING = 4 };

typedef struct {
    int mode;               /* ATTN_* */
    int sink, window;       /* static pattern W (§3.3): first `sink` and last `window` tokens */
    int topk;               /* |Ω|: keys retrieved per query head and step */
    int ef;                 /* search candidate list (Alg. 1 line 7); 0: ra_auto_ef */
    int nprobe;             /* IVF lists probed */
    int nq_knn, max_degree, q_stride; /* index build (§3.2): Nq, M, query stride */
    int ef_conn;            /* index build step (d): the beam of its searches */
    int n_entry;            /* index build: entry points of each search (0: 16) */
    int audit;              /* also compute exact attention at every step and compare */
    int warm;               /* ra: also start each search from the previous step's keys (ra.c) */
    int gpu;                /* ra: the index builds' KNN on the GPU */
    int exact_below;        /* ra: a prompt that leaves fewer keys outside W runs full attention,
                               no index (0: never; ./ra's default RA_EXACT_BELOW) */
    int cache_type;         /* the KV cache's element types (State.cache_type): memory plans */
    int held_layers;        /* ra: layers whose query samples the prefill may hand over before
                               their builds take them (0: every layer); past it, it waits */
    int reference;          /* ra: the plain path (--reference): each step by ra_step_head a head
                               at a time, the builds' KNN by knn_topk */
    int trace;              /* ra: 1: trace_layer's index of query head trace_head (--trace L:H),
                               its build and steps to attention_trace's hooks */
    int trace_layer, trace_head;
} AttnParams;

/* One query head between the steps of Alg. 1, for ra_step_head */
typedef struct {
    RAIndex *ix;            /* its index over H = [sink, idx_end), id i at position sink + i; NULL:
                               not built yet, H scanned exactly (Flat's top-k) */
    int idx_end;            /* W's window starts here (line 1) */
    int32_t *prev;          /* (topk) the last step's Omega as ids: warm's seeds */
    int n_prev;
    int n_scored;           /* keys line 7 scored at the last step */
} HeadStep;
/* What one query head's Alg. 1 did at one step (--trace), read from what the method computed:
 * by ra_step_head, and by the decoding step for the traced head. Ids are index ids. */
typedef struct {
    int pos, idx_end;       /* the step's token; line 1: W = [0, sink) and [idx_end, pos] */
    int indexed;            /* 1: line 7 searched the index; 0: it scanned H exactly (not built) */
    int ins_first, n_ins;   /* lines 4-5: keys ins_first .. + n_ins - 1 entered the index */
    int ins_out, ins_in;    /* ... the last of them: its out-links and in-links */
    int n_w;                /* line 6: |W| */
    float z_w, s_w;         /* ... z~1 and sum_W e^{z_i - z~1} (Eq. 4) */
    int ef, entry, n_seeds; /* line 7: the beam, the entry, warm seeds offered */
    int hops, n_scored, n_h;  /* ... keys expanded, keys scored, of the n_h keys of H */
    int n_omega;            /* line 8: |Omega| */
    float z_omega, s_omega; /* ... z~2 and sum_Omega e^{z_i - z~2} */
    float g1, g2;           /* line 9: gamma_1, gamma_2 (Eq. 5) */
} StepTrace;

/* Alg. 1, lines 1-9 in order, for one query head at the token at pos: plain, the oracle of the
 * decoding step. K, V: its KV head's rows 0..pos; q, out: (d); omega: (topk) positions; tr:
 * what each line did, or NULL. */
int ra_step_head(const AttnParams *ap, HeadStep *hs, const float *q, Rows K, Rows V, int d,
                 int pos, int32_t *omega, float *out, SearchScratch *s, StepTrace *tr);

typedef struct {            /* one head's step against Eq. (1) over every key (--audit, --trace) */
    int k;                  /* the exact top-k of H's size */
    double recall;          /* the share of it in Omega */
    double mass_w, mass_omega;  /* the exact attention mass of W, of Omega */
    double err;             /* ||o - o_exact|| / ||o_exact|| */
} ExactCheck;

typedef struct {            /* --trace: one traced step, for attention_trace's step hook */
    int layer, head, sink;  /* sink: index id i is position sink + i */
    StepTrace st;
    ExactCheck ex;
    const int32_t *omega, *topk, *scored;   /* (st.n_omega), (ex.k), (st.n_scored) positions:
                                               Omega, the exact top-k, the keys line 7 scored */
    const float *weight;    /* (st.pos + 1) the exact a_i of Eq. (1) */
} StepRecord;

typedef struct Attention Attention;   /* mode state: indexes, statistics (ra.c) */



/* ------------------------------------------------------------------------ */
/* Run state and forward pass (model.c)                                     */
/* ------------------------------------------------------------------------ */

typedef struct {
    int ctx;                /* positions the cache can hold */
    int max_batch;          /* tokens per forward call */
    int n;                  /* positions filled */
    void *k, *v;            /* per layer l from kv_off[l]: (n_kv_heads, kv_cap[l], head_dim)
                               post-RoPE keys, values; position p at row p % kv_cap[l]; floats,
                               or halves where cache_type says (cache_rows reads them) */
    int cache_type;         /* CACHE_K_F16 | CACHE_V_F16 bits; 0: both f32 */
    int *kv_cap;            /* (n_layers) positions a layer holds: ctx, a sliding layer its ring
                               of swa_window + max_batch (kv_rows) */
    size_t *kv_off;         /* (n_layers) elements from k (and v) to the layer's first row */
    float *x;               /* (ctx, dim) residual stream of the tokens of one forward call */
    float *xb, *xb2;        /* (max_batch, dim) */
    float *q;               /* (max_batch, n_heads*hd) post-RoPE queries */
    float *kb, *vb;         /* (max_batch, n_kv*hd) this batch's new keys and values */
    float *att;             /* (max_batch, n_heads*hd) attention output */
    float *hb, *hb2;        /* (max_batch, ffn) */
    float *logits;          /* (vocab) of the last token of the batch */
    float *wrow;            /* (nthreads, 4, max(dim, ffn, n_heads*hd)) weight rows, per thread */
    float *att_work;        /* (nthreads, att_work_stride) tiled attention scratch, per thread */
    size_t att_work_stride;
    Pool *pool;
    Attention *attn;        /* NULL: full attention */
    float *q_keep;          /* (q_keep_n, n_heads*hd) or NULL: one layer's queries of a forward
                               call, kept for the index build: query i at row kept_row(s, i) */
    const int32_t *q_keep_row; /* (q_keep_span) or NULL (query i at row i): the row that keeps the
                               call's query i, -1: not kept; rows ascend (ra_query_slots) */
    int q_keep_n, q_keep_span; /* rows q_keep holds; queries q_keep_row maps */
    void (*layer_done)(void *arg, int layer, int pos0, int n);   /* or NULL: after each layer */
    void (*progress)(void *arg, double fraction);                /* or NULL: after each batch */
    void *progress_arg, *layer_arg;
    double prefill_attn_s;  /* seconds the prompts' causal attention (Eq. 1 over the cache) took,
                               summed over forward calls of n > 1, their layers and batches: wall
                               time on the host, device time (CUDA events) on the GPU */
    int (*stop)(void);      /* or NULL: once stop() returns non-zero (Ctrl-C), forward stops after
                               the current batch and returns NULL; index builds skip the heads
                               not yet started. Called from any thread. */
} State;

/* the KV cache's element types (-ctk, -ctv): keys, values in IEEE halves where set */
enum { CACHE_K_F16 = 1, CACHE_V_F16 = 2 };
int  build_state(State *s, const Model *m, int ctx, int max_batch, int cache_type, Pool *pool,
                 char *err);
/* bytes build_state allocates for these sizes (the memory preflight) */
double state_bytes(const Config *c, int ctx, int max_batch, int cache_type, int nthreads);
/* positions layer l's cache holds: ctx, or for a sliding layer the window and a batch, the most
 * a batch's queries see at once (older keys are never read again) */
int  kv_rows(const Config *c, int l, int ctx, int max_batch);
/* bytes of the KV cache: the keys and values of every layer's kv_rows */
double kv_cache_bytes(const Config *c, int ctx, int max_batch, int cache_type);
/* rows layer l's cache holds (State.kv_cap: ctx, or a sliding layer's ring); position p is row
 * p % kv_ring */
int  kv_ring(const State *s, int l);
/* elements from s->k (s->v) to row 0 of KV head h of layer l; position p is row p % kv_cap[l] */
size_t kv_offset(const State *s, const Config *c, int l, int h);
/* the rows of KV head h of layer l: its keys (v 0) or values (v 1), (kv_cap[l], head_dim) */
Rows cache_rows(const State *s, const Config *c, int v, int l, int h);
/* bytes of one element of the keys (v 0) or values (v 1) */
size_t cache_elem(const State *s, int v);
void free_state(State *s);
/* Run tokens[0..n) at positions s->n .. s->n+n-1 through the model, layer by layer, in batches
 * of max_batch; returns the logits of the last one (vocab). s->n + n <= ctx. Returns NULL,
 * with s->n unchanged, when s->stop() turned non-zero during the call. */
float *forward(const Model *m, State *s, const int32_t *tokens, int n);

/* the pieces forward and forward_cuda share: a token's key and value into the cache of layer l
 * at pos (k, v: (n_kv_heads, head_dim)); the embeddings of n tokens into x (n, dim); the row of
 * q_keep that keeps the call's query i, or -1 (State.q_keep_row; a row past q_keep_n: -1) */
void cache_store(State *s, const Config *c, int l, int pos, const float *k, const float *v);
void embed_tokens(const Model *m, const int32_t *tokens, int n, float *x);
int  kept_row(const State *s, int i);

/* blocks, exposed for the equation-level tests */
void rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void rope_apply(float *vec, int n_heads, int head_dim, int rot_dim, int pos, const float *inv_freq,
                int rope_type);
void softmax(float *x, int n);
void swiglu(float *out, const float *gate, const float *up, int n);
/* GEGLU: out = gelu(gate) * up, GELU in its tanh form (gemma3's FFN) */
void geglu(float *out, const float *gate, const float *up, int n);
/* Y (n_tok, W.rows) = X (n_tok, W.cols) . W^T, rows split over the pool;
 * wrow (nthreads, 4, W.cols) scratch */
void matmul(Pool *p, float *Y, const float *X, const Mat *W, int n_tok, float *wrow);
/* out[t] = dot8(q, r[t]) for 4 rows at once, the 4 sums interleaved (the same bits) */
void dot8_x4(const float *q, const float *const r[4], int n, float out[4]);

/* Accumulator vectors per row in the register-blocked kernels of model.c (the matmul's dot_4xT,
 * the tiled attention's qk_4rows and pv_4rows), 4 rows each: 4 x 4 fit AVX-512's 32 vector
 * registers; with AVX2's 16, 4 x 2 */
#if defined(__AVX512F__)
enum { REG_BLOCK = 4 };
#else
enum { REG_BLOCK = 2 };
#endif

/* The attention state for a run (ra.c) over a prompt of n_prompt tokens; attach_attention hooks
 * it into the forward pass. One Attention serves one prompt and the tokens decoded after it: for
 * another prompt, free it and build a new one. free_attention stops and joins its builds. */
int build_attention(Attention **A, const Model *m, const AttnParams *p, int ctx, int n_prompt,
                    int nthreads, char *err);
void free_attention(Attention *A);
void attach_attention(State *s, Attention *A);
/* 1 when a prompt of n_prompt tokens runs p's mode, else full attention: the prompt outgrows W,
 * and for ra leaves at least p->exact_below keys outside it */
int attention_active(const AttnParams *p, int n_prompt);
/* ra's builds run beside the prefill and decoding, on threads of their own at the lowest
 * priority, layer by layer as the prefill hands over each layer's queries (State.layer_done).
 * Until a query head's index takes over, its step scans its keys exactly (the Flat baseline).
 * attention_prefill_done: decoding may begin; the indexes built take over from the next step,
 * the others as they come. With save, they take over all at once, after save(arg, whole) ran on
 * the builds' thread (whole 0: a build failed, and its heads scan exactly for good). */
void attention_prefill_done(Attention *A, void (*save)(void *arg, int whole), void *arg);
/* after attention_prefill_done: waits until the builds have ended, every index taken over (or
 * failed), or the builds stopped */
void attention_wait_build(Attention *A);
/* stops the builds (those not yet built are dropped, their heads scan exactly) and joins them */
void attention_stop_build(Attention *A);
/* ra's global layers whose indexes have not taken over (0 when none is to come); their count
 * in *total (NULL: not wanted) */
int  attention_builds_left(const Attention *A, int *total);
/* the decoding steps in which some query head scanned exactly for want of its index; the
 * now_s() at which the last index took over (0: not yet) */
long attention_exact_steps(const Attention *A);
double attention_ready_at(const Attention *A);
/* after a prompt whose first positions (and, for ra, indexes of keys [sink, indexed_to)) were
 * read instead of computed, and the rest run: the indexes as after a computed prefill (ra: the
 * keys past indexed_to inserted, Alg. 1 line 5; ivf: built) */
void attention_resume(Attention *A, State *s, int indexed_to);
/* ra, after a prompt read from a context file without its indexes: the builds get the prompt's
 * queries by running tokens[0..n_prompt) again on their own state and threads, in batches of
 * batch, and build from them (the keys are s's) */
void attention_replay(Attention *A, State *s, const int32_t *tokens, int batch);
/* test hooks: hold 1 keeps the builds from starting until hold 0; fail_layer's builds fail as an
 * allocation that failed would (-1: none) */
void attention_hold_build(Attention *A, int hold);
void attention_fail_build(Attention *A, int fail_layer);
/* --trace (AttnParams.trace): build(arg, layer, head, ix) once the traced index is built (on the
 * builds' thread), step(arg, r) after each of its decoding steps; either may be NULL */
void attention_trace(Attention *A,
                     void (*build)(void *arg, int layer, int head, const RAIndex *ix),
                     void (*step)(void *arg, const StepRecord *r), void *arg);
/* planned host bytes of the KV cache and the indexes for a context */
void attention_memory(const Config *c, const AttnParams *p, int ctx, int max_batch,
                      double *kv_bytes, double *index_bytes);

/* The GPU path's hooks. attention_w: 1 when the step at pos runs Alg. 1, with W = [0, *sink)
 * and [*idx_end, pos] (§3.3). attention_w_source: such steps call wait(arg) after line 7 and take
 * o_W from it: (n_heads, hd) outputs, (n_heads) maxima, (n_heads) sums as attn_partial's (Eq. 4);
 * wait NULL: W on the CPU. attention_w_external: the (step, layer) pairs that took o_W from
 * wait. */
int  attention_w(const Attention *A, int pos, int *sink, int *idx_end);
void attention_w_source(Attention *A, const float *(*wait)(void *arg), void *arg);
long attention_w_external(const Attention *A);
/* The GPU path, after a layer's decoding step at pos: the keys that leave W at the next step
 * start entering that layer's indexes on s->pool's workers (Alg. 1 line 5, ahead); the next
 * attention_layer call waits for them. The outputs are the same. ra only. */
void attention_insert_ahead(Attention *A, State *s, int layer, int pos);

/* attention over the cache for one layer (ra.c): q, out (n, n_heads*hd) at positions pos0..; a
 * decoding step runs Alg. 1, the rest attn_causal */
void attention_layer(const Model *m, State *s, int layer, int n, int pos0);
/* Eq. (1) over every key before each query, in tiles (model.c; oracle attn_full), for the n
 * queries s->q at positions pos0.. into s->att; attn_work_floats: its scratch per thread */
void attn_causal(const Model *m, State *s, int layer, int n, int pos0);
/* o_W of the decoding step at pos for the query s->q (n_heads, hd) over W = [0, sink) and
 * [w0, pos] of layer l's cache, in tiles (model.c; oracle attn_partial), as attention_w_source
 * gives it: out (n_heads, hd) outputs, then (n_heads) maxima, (n_heads) sums; part
 * (2 n_heads, hd + 2) scratch for the two runs' partial outputs */
void attn_window(const Model *m, State *s, int layer, int pos, int sink, int w0, float *out,
                 float *part);
size_t attn_work_floats(const Config *c);

/* ------------------------------------------------------------------------ */
/* Sampling (model.c)                                                       */
/* ------------------------------------------------------------------------ */

typedef struct { float p; int id; } ProbId;
/* llama.cpp's sampler chain and defaults: the k most likely tokens (top_k 40; 0: all), of them
 * the nucleus (top_p 0.95; 1: all), of it those at least min_p times as likely as the first
 * (min_p 0.05; 0: all), then the temperature (temp 0.8; 0: the argmax) and a draw in proportion.
 * The filters see the model's probabilities (temperature 1), renormalized over what the filter
 * before them kept; the temperature shapes only the draw among the tokens kept. */
typedef struct {
    float temp, top_p, min_p;
    int top_k;
} Sampler;
/* the chain's distribution (temp > 0): the m tokens it keeps into buf[0..m), most likely
 * first, .p their probabilities (summing to 1); returns m >= 1. buf holds n. The most likely
 * token (the lowest id among equals) is never filtered out. */
int sample_probs(const float *logits, int n, const Sampler *sp, ProbId *buf);
/* the next token from logits (n): the argmax at temp <= 0, else a draw from sample_probs;
 * buf (n) is scratch, rng the xorshift64* state */
int sample(const float *logits, int n, const Sampler *sp, uint64_t *rng, ProbId *buf);

/* ------------------------------------------------------------------------ */
/* GPU twins (ra_cuda.cu, linked when built with -DRA_CUDA; without it     */
/* model.c defines stubs: no device, -1). Host pointers in and out; 0 ok,   */
/* -1 error (message on stderr).                                           */
/* ------------------------------------------------------------------------ */

/* 1 when a usable CUDA device is present (msg: which), else 0 with the reason in msg (n bytes) */
int  ra_cuda_init(char *msg, size_t n);
/* knn_topk's contract on the GPU (§3.2), Nq <= KNN_GPU_MAX_KQ; scores by cuBLAS fp32 (no TF32),
 * so ids may differ from knn_topk's only between keys whose scores are within rounding */
#define KNN_GPU_MAX_KQ 1024   /* the largest Nq (--nq) knn_topk_cuda takes */
int  knn_topk_cuda(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
                   int Nq, int32_t *ids_out, int32_t *top_query);
/* attn_partial (Eq. 4) for n_heads query heads q (n_heads, d) over positions [p0, p1) of K, V
 * (n_kv_heads, ctx, d); head h reads KV head h / (n_heads / n_kv_heads); d <= 512.
 * o (n_heads, d), zmax (n_heads), sumexp (n_heads) as attn_partial defines them */
int  attn_partial_cuda(const float *q, int n_heads, const float *K, const float *V, int n_kv_heads,
                       int ctx, int p0, int p1, int d, float scale,
                       float *o, float *zmax, float *sumexp);
/* the causal attention of a prefill batch, as attention_layer computes it with full attention:
 * queries q, out (n, n_heads*d) at positions p0..p0+n-1 over positions 0..p0+n-1 of K, V
 * (n_kv_heads, ctx, d); d 64 or 128. By forward_cuda's fused kernel (fp16 products on the tensor
 * cores, fp32 softmax and sums) */
int  attn_causal_cuda(const float *q, int n, int p0, const float *K, const float *V, int n_heads,
                      int n_kv_heads, int ctx, int d, float *out);
/* forward_cuda's prefill attention: 1 (the default) the fused kernel where the head dim has one,
 * 0 the cuBLAS tiles it is tested against */
void gpu_fused_attention(int on);
/* the cuBLAS tiles' budget for one tile's scores (256 MiB; 0 restores it): the tests shrink it
 * so that a short prompt takes several tiles a batch */
void gpu_attention_tile_bytes(size_t bytes);
/* frees the device buffers and the cuBLAS handle (the next call makes them again) */
void ra_cuda_free_all(void);

/* The model on the GPU, fp16 weights. build_gpu_model uploads them, drops the map's pages
 * (gguf_release_pages) and sizes buffers for n_prompt tokens in batches of B (-1 with err: no
 * room). forward_cuda is forward there, but a decoding step's attention (attention_layer) is the
 * host's, o_W the device's meanwhile. NULL on a CUDA error or a stop (a failed step is final). */
typedef struct GpuModel GpuModel;
int    build_gpu_model(GpuModel **g, const Model *m, State *s, int n_prompt, int B, char *err);
void   free_gpu_model(GpuModel *g);
float *forward_cuda(GpuModel *g, State *s, const int32_t *tokens, int n);
/* the layers whose earlier keys a prompt's rest took up from the host cache, since the start
 * (the tests: a rest ran on the device, not on the CPU) */
long   gpu_rest_layers(void);
/* planned device bytes for a prefill of n_prompt tokens in batches of B: fp16 weights, work
 * (activations, one layer's keys and values, the attention tile, the KNN's buffers, and the
 * static pattern's keys and values of every global layer, n_w = sink + window positions, 0 for
 * none), for a host cache of cache_type (State.cache_type) */
void   gpu_plan(const Config *c, int n_prompt, int B, int n_w, int cache_type, double *weights,
                double *work);
/* device memory: free and total MiB now (-1 on error); the most in use on the whole device
 * (cudaMemGetInfo: total - free, so other processes' memory too) seen by this process's
 * samples (after the weights' upload, W's allocation, each layer of forward_cuda and each
 * KNN), in MiB */
int    gpu_free_mb(double *free_mb, double *total_mb);
double gpu_peak_mb(void);

#endif
