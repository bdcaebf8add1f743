/* model.c - the engine of ra: GGUF reader, dequantization, tokenizer, thread pool, the
 * transformer's blocks, the fast paths of the method's kernels (each tested against ra.c's plain
 * function), run state, the forward pass and sampling. Each section is one concern, top to
 * bottom. The method itself (Eq. 1-5, the index, Alg. 1) is ra.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ra.h"

/* ======================================================================== */
/* Small utilities                                                          */
/* ======================================================================== */

static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err) vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

/* a + b and a * b that report overflow instead of wrapping */
static int add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

static int str_eq(Str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.s, c, n) == 0;
}

/* The top-k heap of every exact search: "better" is the higher score, then the lower id */
static int hit_better(Hit a, Hit b) { return a.s > b.s || (a.s == b.s && a.id < b.id); }

static int hit_cmp(const void *a, const void *b) {   /* best first */
    Hit x = *(const Hit *)a, y = *(const Hit *)b;
    return hit_better(x, y) ? -1 : hit_better(y, x) ? 1 : 0;
}

void heap_offer(Hit *h, int *n, int cap, Hit x) {
    int i;
    if (*n < cap) {
        for (i = (*n)++; i > 0 && hit_better(h[(i - 1) / 2], x); i = (i - 1) / 2)
            h[i] = h[(i - 1) / 2];
        h[i] = x;
    } else if (cap > 0 && hit_better(x, h[0])) {
        for (i = 0;;) {
            int c = 2 * i + 1;
            if (c >= cap) break;
            if (c + 1 < cap && hit_better(h[c], h[c + 1])) c++;   /* the worse child */
            if (!hit_better(x, h[c])) break;
            h[i] = h[c];
            i = c;
        }
        h[i] = x;
    }
}

int heap_write(Hit *h, int n, int32_t *ids_out) {
    qsort(h, (size_t)n, sizeof *h, hit_cmp);
    for (int i = 0; i < n; i++) ids_out[i] = h[i].id;
    return n;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ======================================================================== */
/* GGUF reader (versions 2 and 3)                                           */
/*   header: "GGUF" u32 version, u64 n_tensors, u64 n_kv                    */
/*   n_kv x (string key, u32 type, value)                                   */
/*   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset) */
/*   padding to general.alignment, then the data section                    */
/* Every count, length and offset is checked against the file size with    */
/* overflow-safe arithmetic before it is used.                              */
/* ======================================================================== */

typedef struct {
    const uint8_t *p;       /* (size) the file's bytes */
    uint64_t size, off;
    const char *file;
    char *err;              /* (ERR_LEN) the first error */
} Cursor;

static int cur_need(Cursor *c, uint64_t n, const char *what) {
    uint64_t end;
    if (!add_ok(c->off, n, &end) || end > c->size)
        return fail(c->err, "%s: truncated file: %s needs %llu bytes at offset %llu, file has %llu",
                    c->file, what, (unsigned long long)n, (unsigned long long)c->off,
                    (unsigned long long)c->size);
    return 0;
}
static int cur_read(Cursor *c, void *dst, uint64_t n, const char *what) {
    if (cur_need(c, n, what)) return -1;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}
static int cur_u32(Cursor *c, uint32_t *v, const char *what) { return cur_read(c, v, 4, what); }
static int cur_u64(Cursor *c, uint64_t *v, const char *what) { return cur_read(c, v, 8, what); }
static int cur_str(Cursor *c, Str *s, const char *what) {
    uint64_t n;
    if (cur_u64(c, &n, what) || cur_need(c, n, what)) return -1;
    s->s = (const char *)c->p + c->off;
    s->len = n;
    c->off += n;
    return 0;
}

static const int gguf_scalar_size[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *gguf_type_name[GGUF_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                                  "bool", "string", "array", "u64", "i64", "f64"};

/* one key/value pair; the value is left in the map and located by kv->data */
static int gguf_read_kv(Cursor *c, GGUFKV *kv, uint64_t index) {
    char what[96];
    snprintf(what, sizeof what, "key %llu", (unsigned long long)index);
    if (cur_str(c, &kv->key, what) || cur_u32(c, &kv->type, what)) return -1;
    snprintf(what, sizeof what, "value of '%.*s'", (int)(kv->key.len > 60 ? 60 : kv->key.len),
             kv->key.s);
    if (kv->type >= GGUF_NTYPES)
        return fail(c->err, "%s: %s has unknown type %u", c->file, what, kv->type);
    kv->n = 1;
    kv->elem_type = kv->type;
    if (kv->type == GGUF_ARRAY) {
        if (cur_u32(c, &kv->elem_type, what) || cur_u64(c, &kv->n, what)) return -1;
        if (kv->elem_type >= GGUF_NTYPES || kv->elem_type == GGUF_ARRAY)
            return fail(c->err, "%s: %s: arrays of type %u are not supported", c->file, what,
                        kv->elem_type);
    }
    kv->data = c->p + c->off;
    if (kv->elem_type == GGUF_STRING) {
        /* each string needs at least its 8-byte length: bound n before allocating */
        if (kv->n > (c->size - c->off) / 8)
            return fail(c->err, "%s: %s: %llu strings cannot fit in the file (truncated?)", c->file,
                        what, (unsigned long long)kv->n);
        if (kv->type == GGUF_ARRAY) {
            kv->strs = malloc((kv->n ? kv->n : 1) * sizeof(Str));
            if (!kv->strs) return fail(c->err, "%s: %s: out of memory", c->file, what);
        }
        for (uint64_t i = 0; i < kv->n; i++) {
            Str s;
            if (cur_str(c, &s, what)) return -1;
            if (kv->strs) kv->strs[i] = s;
        }
        return 0;
    }
    uint64_t bytes;
    if (!mul_ok(kv->n, (uint64_t)gguf_scalar_size[kv->elem_type], &bytes))
        return fail(c->err, "%s: %s: array length %llu overflows", c->file, what,
                    (unsigned long long)kv->n);
    if (cur_need(c, bytes, what)) return -1;
    c->off += bytes;
    return 0;
}

static int gguf_read_tensor_info(Cursor *c, GGUFTensor *t, uint64_t index) {
    char what[96];
    snprintf(what, sizeof what, "tensor info %llu", (unsigned long long)index);
    if (cur_str(c, &t->name, what) || cur_u32(c, &t->n_dims, what)) return -1;
    int nl = (int)(t->name.len > 80 ? 80 : t->name.len);
    if (t->n_dims == 0 || t->n_dims > 4)
        return fail(c->err, "%s: tensor '%.*s': %u dimensions (1 to 4 allowed)", c->file, nl,
                    t->name.s, t->n_dims);
    uint64_t count = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (cur_u64(c, &ne, what)) return -1;
        if (ne > (uint64_t)INT64_MAX || !mul_ok(count, ne, &count) || count > (uint64_t)INT64_MAX)
            return fail(c->err, "%s: tensor '%.*s': element count overflows", c->file, nl,
                        t->name.s);
        t->ne[d] = (int64_t)ne;
    }
    if (cur_u32(c, &t->type, what) || cur_u64(c, &t->offset, what)) return -1;
    const TypeInfo *ti = type_info(t->type);
    if (!ti || ti->block_elems <= 0)
        return fail(c->err, "%s: tensor '%.*s': unknown tensor type %u", c->file, nl, t->name.s,
                    t->type);
    if (t->ne[0] % ti->block_elems)
        return fail(
            c->err,
            "%s: tensor '%.*s': row of %lld elements is not a whole number of %s blocks of %d",
            c->file, nl, t->name.s, (long long)t->ne[0], ti->name, ti->block_elems);
    uint64_t rows = count / (uint64_t)(t->ne[0] ? t->ne[0] : 1);
    if (t->ne[0] == 0) rows = 0;
    uint64_t row_bytes;
    if (!mul_ok((uint64_t)(t->ne[0] / ti->block_elems), (uint64_t)ti->block_bytes, &row_bytes) ||
        !mul_ok(rows, row_bytes, &t->nbytes))
        return fail(c->err, "%s: tensor '%.*s': byte size overflows", c->file, nl, t->name.s);
    return 0;
}

static int str_order(const void *a, const void *b) {   /* by length, then bytes */
    const Str *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(x->s, y->s, x->len);
}

/* Refuses a name given twice among n items (the Str at byte `at` of each item of `size` bytes):
   sorted, so that a file of a million keys is checked in a moment, not in minutes. */
static int find_duplicate(const void *items, uint64_t n, size_t size, size_t at, const char *what,
                          const char *path, char *err) {
    if (n < 2) return 0;
    Str *names = malloc(n * sizeof *names);
    if (!names) return fail(err, "%s: out of memory reading the header", path);
    for (uint64_t i = 0; i < n; i++)
        memcpy(&names[i], (const uint8_t *)items + i * size + at, sizeof(Str));
    qsort(names, n, sizeof *names, str_order);
    int r = 0;
    for (uint64_t i = 1; i < n && !r; i++)
        if (!str_order(&names[i - 1], &names[i]))
            r = fail(err, "%s: duplicate %s '%.*s'", path, what,
                     (int)(names[i].len > 80 ? 80 : names[i].len), names[i].s);
    free(names);
    return r;
}

typedef struct { uint64_t start, end, i; } Span;

static int span_order(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->start != y->start ? (x->start < y->start ? -1 : 1) : (x->i < y->i ? -1 : x->i > y->i);
}

/* Refuses tensors whose data share bytes: each tensor must have its own (llama.cpp goes further
   and wants them packed in order). Tensors of no bytes hold nothing and are left out. */
static int find_overlap(const GGUF *g, char *err) {
    Span *sp = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *sp);
    if (!sp) return fail(err, "%s: out of memory reading the header", g->path);
    uint64_t n = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes)
            sp[n++] = (Span){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(sp, n, sizeof *sp, span_order);
    int r = 0;
    for (uint64_t k = 1, last = 0; k < n && !r;
         k++) { /* last: the span of the furthest end so far */
        if (sp[k].start < sp[last].end) {
            const Str *a = &g->tensors[sp[last].i].name, *b = &g->tensors[sp[k].i].name;
            r = fail(
                err,
                "%s: tensors '%.*s' and '%.*s' share bytes of the data section (at offset %llu)",
                g->path, (int)(a->len > 60 ? 60 : a->len), a->s, (int)(b->len > 60 ? 60 : b->len),
                b->s, (unsigned long long)sp[k].start);
        }
        if (sp[k].end > sp[last].end) last = k;
    }
    free(sp);
    return r;
}

static int gguf_parse(GGUF *g, char *err) {
    Cursor c = {g->map, g->size, 0, g->path, err};
    char magic[4];
    if (cur_read(&c, magic, 4, "magic")) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return fail(err, "%s: not a GGUF file (bad magic)", g->path);
    if (cur_u32(&c, &g->version, "version")) return -1;
    if (g->version != 2 && g->version != 3)
        return fail(err, "%s: GGUF version %u is not supported (2 and 3 are)", g->path, g->version);
    if (cur_u64(&c, &g->n_tensors, "tensor count") || cur_u64(&c, &g->n_kv, "key count")) return -1;
    /* a key needs >= 12 bytes and a tensor info >= 24: bound the counts by the file size */
    if (g->n_kv > g->size / 12)
        return fail(err, "%s: key count %llu cannot fit in the file", g->path,
                    (unsigned long long)g->n_kv);
    if (g->n_tensors > g->size / 24)
        return fail(err, "%s: tensor count %llu cannot fit in the file", g->path,
                    (unsigned long long)g->n_tensors);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(GGUFKV));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(GGUFTensor));
    if (!g->kv || !g->tensors) return fail(err, "%s: out of memory reading the header", g->path);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_read_kv(&c, &g->kv[i], i)) return -1;
    if (find_duplicate(g->kv, g->n_kv, sizeof *g->kv, offsetof(GGUFKV, key), "key", g->path, err))
        return -1;
    g->alignment = 32;
    const GGUFKV *al = gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32)
            return fail(err, "%s: general.alignment must be u32, is %s", g->path,
                        gguf_type_name[al->type]);
        uint32_t a;
        memcpy(&a, al->data, 4);
        if (a == 0 || (a & (a - 1)))
            return fail(err, "%s: general.alignment %u is not a power of two", g->path, a);
        g->alignment = a;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_read_tensor_info(&c, &g->tensors[i], i)) return -1;
    /* the data section starts at the next multiple of the alignment */
    uint64_t pad = (g->alignment - c.off % g->alignment) % g->alignment;
    if (!add_ok(c.off, pad, &g->data_offset) || (g->n_tensors && g->data_offset > g->size))
        return fail(err, "%s: truncated file: data section starts past the end", g->path);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        GGUFTensor *t = &g->tensors[i];
        int nl = (int)(t->name.len > 80 ? 80 : t->name.len);
        uint64_t start, end;
        if (t->offset % g->alignment)
            return fail(err, "%s: tensor '%.*s': offset %llu is not aligned to %llu", g->path, nl,
                        t->name.s, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (!add_ok(g->data_offset, t->offset, &start) || !add_ok(start, t->nbytes, &end) ||
            end > g->size)
            return fail(err, "%s: tensor '%.*s': data runs past the end of the file (truncated?)",
                        g->path, nl, t->name.s);
        t->data = g->map + start;
    }
    if (find_duplicate(g->tensors, g->n_tensors, sizeof *g->tensors, offsetof(GGUFTensor, name),
                       "tensor", g->path, err) ||
        find_overlap(g, err))
        return -1;
    return 0;
}

int build_gguf_from_memory(GGUF *g, const uint8_t *buf, size_t size, const char *name, char *err) {
    memset(g, 0, sizeof *g);
    snprintf(g->path, sizeof g->path, "%s", name);
    g->map = (uint8_t *)buf;
    g->size = size;
    if (gguf_parse(g, err)) {
        free_gguf(g);
        return -1;
    }
    return 0;
}

int build_gguf(GGUF *g, const char *path, char *err) {
    memset(g, 0, sizeof *g);
    snprintf(g->path, sizeof g->path, "%s", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO would wait for a writer: refused below */
    if (fd < 0) return fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return fail(err, "%s: truncated file: %lld bytes is too small for a GGUF header", path,
                    (long long)st.st_size);
    }
    g->size = (size_t)st.st_size;
    void *map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(err, "%s: cannot map: %s", path, strerror(errno));
    g->map = map;
    g->mapped = 1;
    if (gguf_parse(g, err)) {
        free_gguf(g);
        return -1;
    }
    return 0;
}

void gguf_release_pages(const GGUF *g) {
    /* a read-only private map: its pages are the file's */
    if (g->map && g->mapped) madvise(g->map, g->size, MADV_DONTNEED);
}

void free_gguf(GGUF *g) {
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    /* memory from build_gguf_from_memory stays the caller's */
    if (g->map && g->mapped) munmap(g->map, g->size);
    memset(g, 0, sizeof *g);
}

const GGUFKV *gguf_find(const GGUF *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const GGUFTensor *gguf_tensor(const GGUF *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

int gguf_get_int(const GGUF *g, const char *key, int64_t *out) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return 0;
    const uint8_t *d = kv->data;
    switch (kv->type) {
    case GGUF_U8: *out = d[0]; return 1;
    case GGUF_I8: *out = (int8_t)d[0]; return 1;
    case GGUF_U16: { uint16_t v; memcpy(&v, d, 2); *out = v; return 1; }
    case GGUF_I16: { int16_t v; memcpy(&v, d, 2); *out = v; return 1; }
    case GGUF_U32: { uint32_t v; memcpy(&v, d, 4); *out = v; return 1; }
    case GGUF_I32: { int32_t v; memcpy(&v, d, 4); *out = v; return 1; }
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, d, 8);
        if (v > INT64_MAX) return -1;
        *out = (int64_t)v;
        return 1;
    }
    case GGUF_I64: { int64_t v; memcpy(&v, d, 8); *out = v; return 1; }
    default: return -1;
    }
}

int gguf_get_float(const GGUF *g, const char *key, float *out) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type == GGUF_F32) { memcpy(out, kv->data, 4); return 1; }
    if (kv->type == GGUF_F64) { double v; memcpy(&v, kv->data, 8); *out = (float)v; return 1; }
    int64_t i;
    if (gguf_get_int(g, key, &i) == 1) { *out = (float)i; return 1; }
    return -1;
}

int gguf_get_str(const GGUF *g, const char *key, Str *out) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STRING) return -1;
    uint64_t n;   /* kv->data points at a scalar string's u64 length (gguf_read_kv) */
    memcpy(&n, kv->data, 8);
    out->s = (const char *)kv->data + 8;
    out->len = n;
    return 1;
}

int gguf_get_bool(const GGUF *g, const char *key, int *out) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_BOOL) return -1;
    *out = kv->data[0] != 0;
    return 1;
}

/* ======================================================================== */
/* Tensor types and dequantization                                          */
/* ======================================================================== */

/* GGML tensor types: sizes, fp16/bf16, dequantization, fused matvec.
 *
 * Written from the GGUF/GGML block format definitions. Every block is stored
 * little-endian; "fp16" fields are IEEE half precision. Layouts (bytes):
 *
 *   Q4_0  32 el, 18 B: d:f16, qs[16]         w = d*(q-8), q = nibble
 *   Q4_1  32 el, 20 B: d:f16, m:f16, qs[16]  w = d*q + m
 *   Q5_0  32 el, 22 B: d:f16, qh:u32, qs[16] w = d*(q-16), q = nibble | bit<<4
 *   Q5_1  32 el, 24 B: d, m, qh:u32, qs[16]  w = d*q + m
 *   Q8_0  32 el, 34 B: d:f16, qs:i8[32]      w = d*q
 *   For the 32-element types, byte j of qs holds element j in its low nibble
 *   and element j+16 in its high nibble; bit j of qh is bit 4 of element j.
 *
 *   Q4_K 256 el, 144 B: d, dmin:f16, scales[12], qs[128]
 *   Q5_K 256 el, 176 B: d, dmin:f16, scales[12], qh[32], qs[128]
 *     8 sub-blocks of 32, w = d*sc[s]*q - dmin*mn[s], with 6-bit sc/mn packed
 *     in 12 bytes (see kq_scale_min). qs is read in 32-byte groups g=0..3: low
 *     nibbles are sub-block 2g, high nibbles sub-block 2g+1. For Q5_K bit 2g
 *     (resp. 2g+1) of qh[l] is bit 4 of element l of that sub-block.
 *   Q6_K 256 el, 210 B: ql[128], qh[64], scales:i8[16], d:f16
 *     16 sub-blocks of 16, w = d*sc[s]*(q-32), q = 4 low bits | 2 high bits<<4.
 *   Q2_K 256 el,  84 B: scales[16], qs[64], d, dmin:f16
 *     16 sub-blocks of 16, w = d*sc[s]*q - dmin*mn[s], q 2 bits, sc and mn the
 *     low and high nibbles of scales[s].
 *   Q3_K 256 el, 110 B: hmask[32], qs[64], scales[12], d:f16
 *     16 sub-blocks of 16, w = d*(sc[s]-32)*q, q = 2 low bits - (high bit ? 0 : 4),
 *     with 6-bit sc packed in 12 bytes (see q3k_scale).
 *     In both, element 128h + 32j + l (half h, j < 4, l < 32) takes its 2 low
 *     bits from bits 2j, 2j+1 of qs[32h + l] and is in sub-block 8h + 2j + l/16;
 *     for Q3_K its high bit is bit 4h + j of hmask[l].
 *   IQ4_NL 32 el, 18 B: d:f16, qs[16]        w = d*kv[q], q = nibble (Q4_0's layout)
 *   IQ4_XS 256 el, 136 B: d:f16, scales_h:u16, scales_l[4], qs[128]
 *     8 sub-blocks of 32 as IQ4_NL (16 bytes of qs each), w = d*(ls[s]-32)*kv[q],
 *     ls[s] = nibble s%2 of scales_l[s/2] | bits 2s, 2s+1 of scales_h << 4.
 *     kv is the 16-entry non-linear grid iq4nl_values.
 */

/* ----------------------------------------------------------------------------
 * Type table, indexed by ggml_type id. block_elems 0 = id retired from ggml. */

static const TypeInfo TYPE_TABLE[] = {
    [0]  = {"F32",      1,   4, 1}, [1]  = {"F16",      1,   2, 1},
    [2]  = {"Q4_0",    32,  18, 1}, [3]  = {"Q4_1",    32,  20, 1},
    [4]  = {"Q4_2",     0,   0, 0}, [5]  = {"Q4_3",     0,   0, 0},
    [6]  = {"Q5_0",    32,  22, 1}, [7]  = {"Q5_1",    32,  24, 1},
    [8]  = {"Q8_0",    32,  34, 1}, [9]  = {"Q8_1",    32,  36, 0},
    [10] = {"Q2_K",   256,  84, 1}, [11] = {"Q3_K",   256, 110, 1},
    [12] = {"Q4_K",   256, 144, 1}, [13] = {"Q5_K",   256, 176, 1},
    [14] = {"Q6_K",   256, 210, 1}, [15] = {"Q8_K",   256, 292, 0},
    [16] = {"IQ2_XXS",256,  66, 0}, [17] = {"IQ2_XS", 256,  74, 0},
    [18] = {"IQ3_XXS",256,  98, 0}, [19] = {"IQ1_S",  256,  50, 0},
    [20] = {"IQ4_NL",  32,  18, 1}, [21] = {"IQ3_S",  256, 110, 0},
    [22] = {"IQ2_S",  256,  82, 0}, [23] = {"IQ4_XS", 256, 136, 1},
    [24] = {"I8",       1,   1, 0}, [25] = {"I16",      1,   2, 0},
    [26] = {"I32",      1,   4, 0}, [27] = {"I64",      1,   8, 0},
    [28] = {"F64",      1,   8, 0}, [29] = {"IQ1_M",  256,  56, 0},
    [30] = {"BF16",     1,   2, 1}, [31] = {"Q4_0_4_4", 0,   0, 0},
    [32] = {"Q4_0_4_8", 0,   0, 0}, [33] = {"Q4_0_8_8", 0,   0, 0},
    [34] = {"TQ1_0",  256,  54, 0}, [35] = {"TQ2_0",  256,  66, 0},
    [36] = {"IQ4_NL_4_4",0,  0, 0}, [37] = {"IQ4_NL_4_8",0,  0, 0},
    [38] = {"IQ4_NL_8_8",0,  0, 0}, [39] = {"MXFP4",   32,  17, 0},
};

const TypeInfo *type_info(uint32_t type) {
    if (type >= sizeof(TYPE_TABLE) / sizeof(TYPE_TABLE[0])) return NULL;
    return &TYPE_TABLE[type];
}

int64_t type_row_bytes(uint32_t type, int64_t n) {
    const TypeInfo *ti = type_info(type);
    if (!ti || ti->block_elems == 0 || n < 0 || n % ti->block_elems != 0) return -1;
    return n / ti->block_elems * ti->block_bytes;
}

/* ----------------------------------------------------------------------------
 * Half and bfloat16 conversion. The portable versions work on the bit
 * patterns; with F16C the hardware instructions are used (same results,
 * except that NaN payloads may be quieted), and the portable ones serve only
 * as the tests' oracle (hence `unused`, for clang). */

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

__attribute__((unused)) static inline float fp16_to_fp32_portable(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);                              /* +-0 */
        uint32_t e = 113;                       /* subnormal: normalize mantissa */
        while (!(man & 0x400)) { man <<= 1; e--; }
        return f32_from_bits(sign | (e << 23) | ((man & 0x3ff) << 13));
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

__attribute__((unused)) static inline uint16_t fp32_to_fp16_portable(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00 | ((x >> 13) & 0x3ff);     /* NaN stays NaN */
    if (x >= 0x38800000u) {                              /* normal half (or overflow) */
        uint32_t h = (x >> 13) - (112u << 10), rem = x & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;   /* round to nearest even */
        return sign | (uint16_t)(h >= 0x7c00 ? 0x7c00 : h);
    }
    if (x <= 0x33000000u) return sign;                   /* <= 2^-25 rounds to zero */
    uint32_t m = (x & 0x7fffff) | 0x800000, shift = 126 - (x >> 23); /* subnormal half */
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float fp16_to_fp32(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32_portable(h);
#endif
}

uint16_t fp32_to_fp16(float f) {
#ifdef __F16C__
    return _cvtss_sh(f, 0);   /* 0 = round to nearest even */
#else
    return fp32_to_fp16_portable(f);
#endif
}

float bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline float rd_f16(const uint8_t *p) { return fp16_to_fp32((uint16_t)(p[0] | p[1] << 8)); }

/* ----------------------------------------------------------------------------
 * Block dequantizers: one block from p into y, in the reference's float order (d*q, then +m or
 * -dmin*mn; each product is exact in float, so FMA contraction changes nothing). Plain 32-lane
 * loops, which vectorize: the 16 nibble bytes are held twice in `src`, lane j reading src[j]. */

static inline void dup16(const uint8_t *qs, uint8_t *src) {
    memcpy(src, qs, 16);
    memcpy(src + 16, qs, 16);
}

static inline int nib(const uint8_t *src, int j) { return j < 16 ? src[j] & 15 : src[j] >> 4; }

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* bit 4 of 5-bit value j of a Q5_0/Q5_1 block: bit j of qh */
static inline int bit4(uint32_t qh, int j) { return (int)((qh >> j) & 1) << 4; }

static void deq_q4_0(const uint8_t *p, float *y) {
    float d = rd_f16(p);
    uint8_t src[32];
    dup16(p + 2, src);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(nib(src, j) - 8);
}

static void deq_q4_1(const uint8_t *p, float *y) {
    float d = rd_f16(p), m = rd_f16(p + 2);
    uint8_t src[32];
    dup16(p + 4, src);
    for (int j = 0; j < 32; j++) y[j] = d * (float)nib(src, j) + m;
}

static void deq_q5_0(const uint8_t *p, float *y) {
    float d = rd_f16(p);
    uint32_t qh = rd_u32(p + 2);
    uint8_t src[32];
    dup16(p + 6, src);
    for (int j = 0; j < 32; j++) y[j] = d * (float)((nib(src, j) | bit4(qh, j)) - 16);
}

static void deq_q5_1(const uint8_t *p, float *y) {
    float d = rd_f16(p), m = rd_f16(p + 2);
    uint32_t qh = rd_u32(p + 4);
    uint8_t src[32];
    dup16(p + 8, src);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(nib(src, j) | bit4(qh, j)) + m;
}

static void deq_q8_0(const uint8_t *p, float *y) {
    float d = rd_f16(p);
    const int8_t *qs = (const int8_t *)(p + 2);
    for (int j = 0; j < 32; j++) y[j] = d * (float)qs[j];
}

/* 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes s:
   bytes 0-3: scales 0-3 in bits 0-5; bytes 4-7: mins 0-3 in bits 0-5;
   bytes 8-11: low nibble = bits 0-3 of scale 4-7, high nibble = bits 0-3 of
   min 4-7; bits 4-5 of scales/mins 4-7 are the top two bits of bytes 0-3/4-7. */
static void kq_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* float scale and min of the 8 sub-blocks of a Q4_K/Q5_K super-block */
static void kq_scales(const uint8_t *p, float *dsc, float *dmn) {
    float d = rd_f16(p), dmin = rd_f16(p + 2);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        kq_scale_min(p + 4, s, &sc, &mn);
        dsc[s] = d * (float)sc;
        dmn[s] = dmin * (float)mn;
    }
}

static void deq_q4_k(const uint8_t *p, float *y) {
    float dsc[8], dmn[8];
    kq_scales(p, dsc, dmn);
    const uint8_t *qs = p + 16;
    for (int g = 0; g < 4; g++, qs += 32, y += 64) {
        for (int l = 0; l < 32; l++) {
            y[l]      = dsc[2*g]     * (float)(qs[l] & 15) - dmn[2*g];
            y[l + 32] = dsc[2*g + 1] * (float)(qs[l] >> 4) - dmn[2*g + 1];
        }
    }
}

static void deq_q5_k(const uint8_t *p, float *y) {
    float dsc[8], dmn[8];
    kq_scales(p, dsc, dmn);
    const uint8_t *qh = p + 16, *qs = p + 48;
    for (int g = 0; g < 4; g++, qs += 32, y += 64) {
        for (int l = 0; l < 32; l++) {
            int lo = (qs[l] & 15) | (((qh[l] >> (2*g)) & 1) << 4);
            int hi = (qs[l] >> 4) | (((qh[l] >> (2*g + 1)) & 1) << 4);
            y[l]      = dsc[2*g]     * (float)lo - dmn[2*g];
            y[l + 32] = dsc[2*g + 1] * (float)hi - dmn[2*g + 1];
        }
    }
}

/* Q6_K: each half (128 values) uses 64 bytes of ql, 32 of qh and 8 scales.
   Value 32*i + l of a half (i = 0..3, l < 32) takes its low 4 bits from the
   low (i < 2) or high (i >= 2) nibble of ql[l + 32*(i&1)] and its top 2 bits
   from bits 2i, 2i+1 of qh[l]; its scale is sc[2i + l/16]. */
static void deq_q6_k(const uint8_t *p, float *y) {
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t *sc = (const int8_t *)(p + 192);
    float d = rd_f16(p + 208);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        int8_t q[4][32];
        for (int l = 0; l < 32; l++) {
            q[0][l] = (int8_t)(((ql[l] & 15)      | ((qh[l] & 3) << 4)) - 32);
            q[1][l] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[2][l] = (int8_t)(((ql[l] >> 4)      | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[3][l] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        for (int i = 0; i < 4; i++) {
            float d0 = d * (float)sc[2*i], d1 = d * (float)sc[2*i + 1];
            for (int l = 0; l < 32; l++) y[32*i + l] = (l < 16 ? d0 : d1) * (float)q[i][l];
        }
    }
}

/* Q2_K, Q3_K: element 128h + 32j + l of the block (see the layouts above). Each half's bytes
   are copied to the stack first, and each 32-lane loop picks its lane's sub-block (l < 16 or
   not) by a select: the shape gcc vectorizes (as deq_q6_k) */
static void deq_q2_k(const uint8_t *p, float *y) {
    const uint8_t *sc = p;
    float d = rd_f16(p + 80), dmin = rd_f16(p + 82);
    for (int h = 0; h < 2; h++) {
        uint8_t q[32];
        memcpy(q, p + 16 + 32*h, 32);
        for (int j = 0; j < 4; j++, y += 32) {
            int s0 = sc[8*h + 2*j], s1 = sc[8*h + 2*j + 1];
            float d0 = d * (float)(s0 & 15), d1 = d * (float)(s1 & 15);
            float m0 = dmin * (float)(s0 >> 4), m1 = dmin * (float)(s1 >> 4);
            for (int l = 0; l < 32; l++)
                y[l] = (l < 16 ? d0 : d1) * (float)((q[l] >> 2 * j) & 3) - (l < 16 ? m0 : m1);
        }
    }
}

/* 6-bit scale s (0..15) of a Q3_K block from its 12 packed bytes: the low 4 bits are the low
   (s < 8) or high (s >= 8) nibble of byte s % 8, the top 2 bits are bits 2(s/4), 2(s/4)+1 of
   byte 8 + s % 4 */
static int q3k_scale(const uint8_t *b, int s) {
    int lo = s < 8 ? b[s] & 15 : b[s - 8] >> 4;
    return lo | ((b[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
}

static void deq_q3_k(const uint8_t *p, float *y) {
    float d = rd_f16(p + 108);
    uint8_t hm[32];
    memcpy(hm, p, 32);
    for (int h = 0; h < 2; h++) {
        uint8_t q[32];
        memcpy(q, p + 32 + 32*h, 32);
        for (int j = 0; j < 4; j++, y += 32) {
            float d0 = d * (float)(q3k_scale(p + 96, 8 * h + 2 * j) - 32),
                  d1 = d * (float)(q3k_scale(p + 96, 8 * h + 2 * j + 1) - 32);
            for (int l = 0; l < 32; l++)   /* 2 low bits, less 4 where the high bit is clear */
                y[l] = (l < 16 ? d0 : d1) *
                       (float)(((q[l] >> 2 * j) & 3) - 4 + 4 * ((hm[l] >> (4 * h + j)) & 1));
        }
    }
}

/* IQ4_NL, IQ4_XS: a nibble picks one of 16 non-linear levels, scaled (d kv is one product, so
   the 16 scaled levels are worked out once a block, or sub-block, with the same bits) */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

static void iq4_levels(float d, float *lv) {
    for (int i = 0; i < 16; i++) lv[i] = d * (float)iq4nl_values[i];
}

static void deq_iq4_nl(const uint8_t *p, float *y) {
    float lv[16];
    uint8_t src[32];
    iq4_levels(rd_f16(p), lv);
    dup16(p + 2, src);
    for (int j = 0; j < 32; j++) y[j] = lv[nib(src, j)];
}

static void deq_iq4_xs(const uint8_t *p, float *y) {
    float d = rd_f16(p), lv[16];
    unsigned sh = (unsigned)p[2] | (unsigned)p[3] << 8;
    for (int s = 0; s < 8; s++, y += 32) {
        int ls = ((p[4 + s/2] >> (4 * (s % 2))) & 15) | ((sh >> (2*s)) & 3) << 4;
        uint8_t src[32];
        iq4_levels(d * (float)(ls - 32), lv);
        dup16(p + 8 + 16*s, src);
        for (int j = 0; j < 32; j++) y[j] = lv[nib(src, j)];
    }
}

/* nb blocks of bytes each through deq; inlined per type so the call is direct */
static inline void deq_blocks(void (*deq)(const uint8_t *, float *), int bytes, int elems,
                              const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) deq(p + b * bytes, y + b * elems);
}

int dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const TypeInfo *ti = type_info(type);
    if (!ti || !ti->supported || n % ti->block_elems != 0) return -1;
    const uint8_t *p = src;
    int64_t nb = n / ti->block_elems;
    switch (type) {
    case GGML_F32: memcpy(dst, src, (size_t)n * 4); break;
    case GGML_F16: {
        int64_t i = 0;
#ifdef __F16C__
        for (; i < n / 8 * 8; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                          (const __m128i *)(const void *)(p + 2 * i))));
#endif
        for (; i < n; i++) dst[i] = rd_f16(p + 2*i);
        break;
    }
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32((uint16_t)(p[2*i] | p[2*i + 1] << 8));
        break;
    case GGML_Q4_0: deq_blocks(deq_q4_0,  18,  32, p, dst, nb); break;
    case GGML_Q4_1: deq_blocks(deq_q4_1,  20,  32, p, dst, nb); break;
    case GGML_Q5_0: deq_blocks(deq_q5_0,  22,  32, p, dst, nb); break;
    case GGML_Q5_1: deq_blocks(deq_q5_1,  24,  32, p, dst, nb); break;
    case GGML_Q8_0: deq_blocks(deq_q8_0,  34,  32, p, dst, nb); break;
    case GGML_Q4_K: deq_blocks(deq_q4_k, 144, 256, p, dst, nb); break;
    case GGML_Q5_K: deq_blocks(deq_q5_k, 176, 256, p, dst, nb); break;
    case GGML_Q6_K: deq_blocks(deq_q6_k, 210, 256, p, dst, nb); break;
    case GGML_Q2_K: deq_blocks(deq_q2_k,  84, 256, p, dst, nb); break;
    case GGML_Q3_K: deq_blocks(deq_q3_k, 110, 256, p, dst, nb); break;
    case GGML_IQ4_NL: deq_blocks(deq_iq4_nl, 18, 32, p, dst, nb); break;
    case GGML_IQ4_XS: deq_blocks(deq_iq4_xs, 136, 256, p, dst, nb); break;
    default: return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------
 * Fused dequantize + dot: 32 float lanes, acc[j] for element j of every 32-block, summed once a
 * row; weights rebuilt as the dequantizers do. A decoding step streams each matrix once, so each
 * kernel asks for the weights PREFETCH_AHEAD bytes ahead (the hint changes no result). */

enum { PREFETCH_AHEAD = 2048 };   /* bytes */

/* The hint for the cache line PREFETCH_AHEAD bytes past p. Near the end of a matrix that line
   lies past it, where a prefetch does not fault; the address is therefore formed as an integer,
   since pointer arithmetic past the end of an array is undefined in C. */
static inline void prefetch_ahead(const void *p) {
    __builtin_prefetch((const void *)((uintptr_t)p + PREFETCH_AHEAD));
}

static inline float madd(float a, float b, float c) {
#ifdef FP_FAST_FMAF
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

static float sum32(const float *acc) {
    float s8[8];
    for (int k = 0; k < 8; k++) s8[k] = (acc[k] + acc[k + 8]) + (acc[k + 16] + acc[k + 24]);
    return ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
}

/* hint 0: a is already in cache (dot_generic's stack buffer), so no prefetch; a constant at
   each call, so the compiler drops the branch */
static inline float dot_f32_hinted(const float *a, const float *x, int64_t n, int hint) {
    float acc[32] = {0}, s = 0.0f;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (hint) {
            prefetch_ahead(a + i);    /* 32 floats are two cache lines */
            prefetch_ahead(a + i + 16);
        }
        for (int j = 0; j < 32; j++) acc[j] = madd(a[i + j], x[i + j], acc[j]);
    }
    for (; i < n; i++) s += a[i] * x[i];
    return sum32(acc) + s;
}

static float dot_f32(const float *a, const float *x, int64_t n) {
    return dot_f32_hinted(a, x, n, 1);
}

/* Q4_0/Q4_1/Q5_0/Q5_1 share a kernel: w = d*q + m, with m = -8d (Q4_0) or
   -16d (Q5_0). `bytes`, the block size, tells the type apart; it is a constant
   at each call, so the compiler specializes the inlined kernel per type. */
static inline float dot_q45(const uint8_t *p, int bytes, const float *x, int64_t n) {
    float acc[32] = {0};
    for (int64_t b = 0; b < n / 32; b++, p += bytes, x += 32) {
        prefetch_ahead(p);
        float d = rd_f16(p);
        float m = bytes == 18 ? -8.0f * d : bytes == 22 ? -16.0f * d : rd_f16(p + 2);
        uint32_t qh = bytes == 22 ? rd_u32(p + 2) : bytes == 24 ? rd_u32(p + 4) : 0;
        uint8_t src[32];
        dup16(p + bytes - 16, src);
        for (int j = 0; j < 32; j++)
            acc[j] = madd(madd(d, (float)(nib(src, j) | bit4(qh, j)), m), x[j], acc[j]);
    }
    return sum32(acc);
}

__attribute__((unused))   /* with AVX2, only the tests call it: the oracle of dot_q8_0_avx2 */
static float dot_q8_0(const uint8_t *p, const float *x, int64_t n) {
    float acc[32] = {0};
    for (int64_t b = 0; b < n / 32; b++, p += 34, x += 32) {
        prefetch_ahead(p);
        float d = rd_f16(p);
        int32_t q[32];   /* widen first: this two-loop shape vectorizes best */
        for (int j = 0; j < 32; j++) q[j] = (int8_t)p[2 + j];
        for (int j = 0; j < 32; j++) acc[j] = madd(d * (float)q[j], x[j], acc[j]);
    }
    return sum32(acc);
}

/* AVX2 twins of the matrix-vector kernels (Q4_0/Q4_1, Q8_0, the K types, IQ4_NL, IQ4_XS). The
 * plain loops are their oracle: the same float operations on the same 32 lanes, so the same bits
 * (test_dequant); only the widening of the quants differs. Built where madd fuses as they do. */
#if defined(__AVX2__) && defined(__FMA__) && defined(FP_FAST_FMAF)
#define HAVE_DOT_AVX2 1
static float lanes_store_sum(const __m256 a[4]) {
    float acc[32];
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);
    return sum32(acc);
}

static float dot_q4_avx2(const uint8_t *p, int bytes, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const __m256i low4 = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < n / 32; b++, p += bytes, x += 32) {
        prefetch_ahead(p);
        float d = rd_f16(p), m = bytes == 18 ? -8.0f * d : rd_f16(p + 2);
        __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
        __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(p + bytes - 16));
        /* bytes 0-7, 8-15 */
        __m256i b0 = _mm256_cvtepu8_epi32(qs), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(qs, 8));
        __m256i q[4] = {_mm256_and_si256(b0, low4),
                        _mm256_and_si256(b1, low4), /* elements 0-7, 8-15: low nibbles */
                        /* 16-23, 24-31: high nibbles */
                        _mm256_srli_epi32(b0, 4), _mm256_srli_epi32(b1, 4)};
        for (int k = 0; k < 4; k++) {
            __m256 w = _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(q[k]), vm);
            a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8 * k), a[k]);
        }
    }
    return lanes_store_sum(a);
}

/* dot_q45_k's twin: per 64 elements, the low nibbles of 32 bytes with one scale and min, the
 * high nibbles with the next; Q5_K's fifth bits from qh. Inlined: a loop of its own per type */
static inline __attribute__((always_inline)) float dot_q45_k_avx2(const uint8_t *p, int bytes,
                                                                  const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const __m256i low4 = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    for (int64_t b = 0; b < n / 256; b++, p += bytes) {
        float dsc[8], dmn[8];
        kq_scales(p, dsc, dmn);
        __m256i qh[4];
        if (bytes == 176)
            for (int k = 0; k < 4; k++)
                qh[k] = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(const void *)(p + 16 + 8 * k)));
        const uint8_t *qs = p + bytes - 128;
        for (int g = 0; g < 4; g++, qs += 32, x += 64) {
            prefetch_ahead(qs);
            __m256 d1 = _mm256_set1_ps(dsc[2 * g]), m1 = _mm256_set1_ps(-dmn[2 * g]);
            __m256 d2 = _mm256_set1_ps(dsc[2 * g + 1]), m2 = _mm256_set1_ps(-dmn[2 * g + 1]);
            __m128i sh1 = _mm_cvtsi32_si128(2 * g), sh2 = _mm_cvtsi32_si128(2 * g + 1);
            for (int k = 0; k < 4; k++) {
                __m256i q = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(const void *)(qs + 8 * k)));
                __m256i q1 = _mm256_and_si256(q, low4), q2 = _mm256_srli_epi32(q, 4);
                if (bytes == 176) {
                    q1 = _mm256_or_si256(
                        q1,
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(qh[k], sh1), one), 4));
                    q2 = _mm256_or_si256(
                        q2,
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(qh[k], sh2), one), 4));
                }
                __m256 lo = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(q1), m1);
                __m256 hi = _mm256_fmadd_ps(d2, _mm256_cvtepi32_ps(q2), m2);
                a[k] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + 8 * k), a[k]);
                a[k] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 32 + 8 * k), a[k]);
            }
        }
    }
    return lanes_store_sum(a);
}

static float dot_q8_0_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / 32; b++, p += 34, x += 32) {
        prefetch_ahead(p);
        __m256 vd = _mm256_set1_ps(rd_f16(p));
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(const void *)(p + 2 + 8 * k)));
            a[k] = _mm256_fmadd_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(q)),
                                   _mm256_loadu_ps(x + 8 * k), a[k]);
        }
    }
    return lanes_store_sum(a);
}

/* the 32 signed bytes of b widened to 32-bit lanes, 8 to each of v[0..3] */
static inline void widen_bytes_avx2(__m256i b, __m256i v[4]) {
    __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    v[0] = _mm256_cvtepi8_epi32(lo);
    v[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8));
    v[2] = _mm256_cvtepi8_epi32(hi);
    v[3] = _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8));
}

/* bits sh and up of every byte of b, under mask (a 16-bit shift: the bits it brings into a
   byte from its neighbour lie above the mask) */
static inline __m256i byte_bits_avx2(__m256i b, int sh, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(b, _mm_cvtsi32_si128(sh)),
                            _mm256_set1_epi8((char)mask));
}

/* dot_q6_k's twin: each value's 4 low and 2 high bits put together in the bytes, less 32 (-32 to
   31), then widened; lanes 0-15 take scale sc[2i], 16-31 sc[2i + 1] */
static float dot_q6_k_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < n / 256; b++, p += 210) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = rd_f16(p + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8) {
            prefetch_ahead(ql);
            prefetch_ahead(ql + 64);
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)qh);
            for (int i = 0; i < 4; i++, x += 32) {
                __m256 vd[2] = {_mm256_set1_ps(d * (float)sc[2 * i]),
                                _mm256_set1_ps(d * (float)sc[2 * i + 1])};
                __m256i lo = byte_bits_avx2(i & 1 ? l1 : l0, 4 * (i >> 1), 15);
                /* at most 48: no carry out of a byte */
                __m256i hi = _mm256_slli_epi16(byte_bits_avx2(hb, 2 * i, 3), 4);
                __m256i v[4];
                widen_bytes_avx2(_mm256_sub_epi8(_mm256_or_si256(lo, hi), k32), v);
                for (int k = 0; k < 4; k++)
                    a[k] = _mm256_fmadd_ps(_mm256_mul_ps(vd[k / 2], _mm256_cvtepi32_ps(v[k])),
                                           _mm256_loadu_ps(x + 8 * k), a[k]);
            }
        }
    }
    return lanes_store_sum(a);
}

/* dot_q2_k's twin: each j takes its 2 bits from all 32 bytes of the half at once, then widens
   them; lanes 0-15 (a[0], a[1]) take the first sub-block's scale and min, 16-31 the second's */
static float dot_q2_k_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / 256; b++, p += 84) {
        prefetch_ahead(p);
        prefetch_ahead(p + 64);
        float d = rd_f16(p + 80), dmin = rd_f16(p + 82);
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(p + 16 + 32*h));
            for (int j = 0; j < 4; j++, x += 32) {
                int s0 = p[8*h + 2*j], s1 = p[8*h + 2*j + 1];
                __m256 vd[2] = {_mm256_set1_ps(d * (float)(s0 & 15)),
                                _mm256_set1_ps(d * (float)(s1 & 15))};
                __m256 vm[2] = {_mm256_set1_ps(-dmin * (float)(s0 >> 4)),
                                _mm256_set1_ps(-dmin * (float)(s1 >> 4))};
                __m256i v[4];
                widen_bytes_avx2(byte_bits_avx2(q, 2*j, 3), v);
                for (int k = 0; k < 4; k++) {
                    __m256 w = _mm256_fmadd_ps(vd[k / 2], _mm256_cvtepi32_ps(v[k]), vm[k / 2]);
                    a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8 * k), a[k]);
                }
            }
        }
    }
    return lanes_store_sum(a);
}

/* dot_q3_k's twin, in dot_q2_k_avx2's shape; the value 2 low bits + 4 high bit - 4 is formed
   in the bytes, -4 to 3, before widening */
static float dot_q3_k_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const __m256i four = _mm256_set1_epi8(4);
    for (int64_t b = 0; b < n / 256; b++, p += 110) {
        prefetch_ahead(p);
        prefetch_ahead(p + 64);
        float d = rd_f16(p + 108);
        __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)p);
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 + 32*h));
            for (int j = 0; j < 4; j++, x += 32) {
                __m256 vd[2] = {_mm256_set1_ps(d * (float)(q3k_scale(p + 96, 8*h + 2*j) - 32)),
                                _mm256_set1_ps(d * (float)(q3k_scale(p + 96, 8*h + 2*j + 1) - 32))};
                /* 0 or 4: no carry out of a byte */
                __m256i hi = _mm256_slli_epi16(byte_bits_avx2(hm, 4 * h + j, 1), 2);
                __m256i v[4];
                widen_bytes_avx2(
                    _mm256_sub_epi8(_mm256_add_epi8(byte_bits_avx2(q, 2 * j, 3), hi), four), v);
                for (int k = 0; k < 4; k++)
                    a[k] = _mm256_fmadd_ps(_mm256_mul_ps(vd[k / 2], _mm256_cvtepi32_ps(v[k])),
                                           _mm256_loadu_ps(x + 8 * k), a[k]);
            }
        }
    }
    return lanes_store_sum(a);
}

/* dot_iq4_block's twin: one byte shuffle looks up the 16 levels of kv for 16 nibbles at once;
   the level, widened to float, times the block's scale is the dequantizer's d kv[q] */
static inline void dot_iq4_block_avx2(const uint8_t *qs, __m256 vd, const float *x, __m256 a[4]) {
    const __m128i kv = _mm_loadu_si128((const __m128i *)(const void *)iq4nl_values),
                  low4 = _mm_set1_epi8(15);
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(q, low4)); /* elements 0-15 */
    __m128i hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), low4));   /* 16-31 */
    __m256i v[4] = {_mm256_cvtepi8_epi32(lo), _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)),
                    _mm256_cvtepi8_epi32(hi), _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))};
    for (int k = 0; k < 4; k++)
        a[k] = _mm256_fmadd_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(v[k])),
                               _mm256_loadu_ps(x + 8 * k), a[k]);
}

static float dot_iq4_nl_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / 32; b++, p += 18, x += 32) {
        prefetch_ahead(p);
        dot_iq4_block_avx2(p + 2, _mm256_set1_ps(rd_f16(p)), x, a);
    }
    return lanes_store_sum(a);
}

static float dot_iq4_xs_avx2(const uint8_t *p, const float *x, int64_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / 256; b++, p += 136) {
        prefetch_ahead(p);
        float d = rd_f16(p);
        unsigned sh = (unsigned)p[2] | (unsigned)p[3] << 8;
        for (int s = 0; s < 8; s++, x += 32) {
            int ls = ((p[4 + s/2] >> (4 * (s % 2))) & 15) | ((sh >> (2*s)) & 3) << 4;
            dot_iq4_block_avx2(p + 8 + 16*s, _mm256_set1_ps(d * (float)(ls - 32)), x, a);
        }
    }
    return lanes_store_sum(a);
}
#else
#define HAVE_DOT_AVX2 0
#endif

/* Q4_K and Q5_K (bytes 144, 176): per 64 elements, the low nibbles of 32 bytes with one scale
   and min, the high nibbles with the next; Q5_K adds bit 2g (low) or 2g + 1 (high) of qh[l] as
   bit 4. `bytes` is a constant at each call, as in dot_q45. Without AVX2, Q5_K takes
   dot_generic, the faster there. */
__attribute__((unused))   /* with AVX2, only the tests call it: the oracle of dot_q45_k_avx2 */
static inline float dot_q45_k(const uint8_t *p, int bytes, const float *x, int64_t n) {
    float acc[32] = {0};
    for (int64_t b = 0; b < n / 256; b++, p += bytes) {
        float dsc[8], dmn[8];
        kq_scales(p, dsc, dmn);
        const uint8_t *qh = p + 16, *qs = p + bytes - 128;
        for (int g = 0; g < 4; g++, qs += 32, x += 64) {
            prefetch_ahead(qs);
            float d1 = dsc[2*g], m1 = -dmn[2*g], d2 = dsc[2*g + 1], m2 = -dmn[2*g + 1];
            for (int l = 0; l < 32; l++) {
                int lo = qs[l] & 15, hi = qs[l] >> 4;
                if (bytes == 176)
                    lo |= ((qh[l] >> (2 * g)) & 1) << 4, hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
                acc[l] = madd(madd(d1, (float)lo, m1), x[l], acc[l]);
                acc[l] = madd(madd(d2, (float)hi, m2), x[l + 32], acc[l]);
            }
        }
    }
    return sum32(acc);
}

/* Q2_K: lane l takes element 128h + 32j + l of each block (h < 2, j < 4; see the layouts in the
   type table), whose sub-block is 8h + 2j + l/16; d sc q - dmin mn is one fused multiply-add,
   as in its twin (and in dot_q45_k). Only oracles: without AVX2, gcc vectorizes these loops
   worse than dot_generic's dequantizers, which matvec_rows takes there. */
__attribute__((unused))   /* only the tests call it: the oracle of dot_q2_k_avx2 */
static float dot_q2_k(const uint8_t *p, const float *x, int64_t n) {
    float acc[32] = {0};
    for (int64_t b = 0; b < n / 256; b++, p += 84) {
        prefetch_ahead(p);
        prefetch_ahead(p + 64);
        float d = rd_f16(p + 80), dmin = rd_f16(p + 82);
        for (int h = 0; h < 2; h++) {
            uint8_t q[32];
            memcpy(q, p + 16 + 32*h, 32);
            for (int j = 0; j < 4; j++, x += 32) {
                int s0 = p[8*h + 2*j], s1 = p[8*h + 2*j + 1];
                float d0 = d * (float)(s0 & 15), d1 = d * (float)(s1 & 15);
                float m0 = -dmin * (float)(s0 >> 4), m1 = -dmin * (float)(s1 >> 4);
                for (int l = 0; l < 32; l++)
                    acc[l] =
                        madd(madd(l < 16 ? d0 : d1, (float)((q[l] >> 2 * j) & 3), l < 16 ? m0 : m1),
                             x[l], acc[l]);
            }
        }
    }
    return sum32(acc);
}

/* The oracles of the twins whose every weight is one product (Q3_K, Q6_K, IQ4_NL, IQ4_XS): each
 * block dequantized as dequantize_row does it, then a fused multiply-add per lane. Without AVX2
 * matvec_rows takes dot_generic for these types, as fast or faster. */
static inline float dot_by_blocks(void (*deq)(const uint8_t *, float *), int bytes, int elems,
                                  const uint8_t *p, const float *x, int64_t n) {
    float acc[32] = {0}, y[256];
    for (int64_t b = 0; b < n / elems; b++, p += bytes, x += elems) {
        prefetch_ahead(p);
        deq(p, y);
        for (int i = 0; i < elems; i += 32)
            for (int j = 0; j < 32; j++) acc[j] = madd(y[i + j], x[i + j], acc[j]);
    }
    return sum32(acc);
}

__attribute__((unused)) /* only the tests call these four: the oracles of the AVX2 twins */
static float
dot_q3_k(const uint8_t *p, const float *x, int64_t n) {
    return dot_by_blocks(deq_q3_k, 110, 256, p, x, n);
}
__attribute__((unused)) static float dot_q6_k(const uint8_t *p, const float *x, int64_t n) {
    return dot_by_blocks(deq_q6_k, 210, 256, p, x, n);
}
__attribute__((unused)) static float dot_iq4_nl(const uint8_t *p, const float *x, int64_t n) {
    return dot_by_blocks(deq_iq4_nl, 18, 32, p, x, n);
}
__attribute__((unused)) static float dot_iq4_xs(const uint8_t *p, const float *x, int64_t n) {
    return dot_by_blocks(deq_iq4_xs, 136, 256, p, x, n);
}

/* any other supported type: dequantize up to 1024 elements at a time into a
   stack buffer (it stays in L1) and dot that */
static float dot_generic(uint32_t type, const uint8_t *p, const float *x, int64_t n) {
    const TypeInfo *ti = type_info(type);
    float buf[1024], s = 0.0f;
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t k = n - i < 1024 ? n - i : 1024;
        const uint8_t *src = p + i / ti->block_elems * ti->block_bytes;
        for (int64_t b = 0; b < k / ti->block_elems * ti->block_bytes;
             b += 64) /* a cache line at a time */
            prefetch_ahead(src + b);
        dequantize_row(type, src, buf, k);
        s += dot_f32_hinted(buf, x + i, k, 0);
    }
    return s;
}

void matvec_rows(uint32_t type, const void *W, int64_t n, const float *x, float *y, int64_t r0,
                 int64_t r1) {
    const TypeInfo *ti = type_info(type);
    int64_t rb = type_row_bytes(type, n);
    if (!ti || !ti->supported || rb < 0) return;
    const uint8_t *w = W;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + r * rb;
        switch (type) {
        case GGML_F32:  y[r] = dot_f32((const float *)(const void *)row, x, n); break;
#if HAVE_DOT_AVX2
        case GGML_Q4_0: y[r] = dot_q4_avx2(row, 18, x, n); break;
        case GGML_Q4_1: y[r] = dot_q4_avx2(row, 20, x, n); break;
        case GGML_Q8_0: y[r] = dot_q8_0_avx2(row, x, n); break;
        case GGML_Q4_K: y[r] = dot_q45_k_avx2(row, 144, x, n); break;
        case GGML_Q5_K: y[r] = dot_q45_k_avx2(row, 176, x, n); break;
        case GGML_Q6_K: y[r] = dot_q6_k_avx2(row, x, n); break;
        case GGML_Q2_K: y[r] = dot_q2_k_avx2(row, x, n); break;
        case GGML_Q3_K: y[r] = dot_q3_k_avx2(row, x, n); break;
        case GGML_IQ4_NL: y[r] = dot_iq4_nl_avx2(row, x, n); break;
        case GGML_IQ4_XS: y[r] = dot_iq4_xs_avx2(row, x, n); break;
#else
        case GGML_Q4_0: y[r] = dot_q45(row, 18, x, n); break;
        case GGML_Q4_1: y[r] = dot_q45(row, 20, x, n); break;
        case GGML_Q8_0: y[r] = dot_q8_0(row, x, n); break;
        case GGML_Q4_K: y[r] = dot_q45_k(row, 144, x, n); break;
#endif
        case GGML_Q5_0: y[r] = dot_q45(row, 22, x, n); break;
        case GGML_Q5_1: y[r] = dot_q45(row, 24, x, n); break;
        default:        y[r] = dot_generic(type, row, x, n); break;
        }
    }
}

/* ======================================================================== */
/* Tokenizer                                                                */
/* ======================================================================== */

/* ----------------------------------------------------------------------------
 * Unicode tables (generated by tests/gen_unicode.py with Python 3.13: Unicode 15.1, the version
 * of llama.cpp's unicode-data.cpp, so \p{L} \p{N} \p{P} agree for every codepoint) */

/* Unicode 15.1.0 (Python 3.13 unicodedata); entry = first << 11 | (last - first) */
static const uint32_t tok_letter[711] = {
    /* \p{L}: 660 ranges */
    0x20819,    0x30819,    0x55000,    0x5a800,    0x5d000,    0x60016,    0x6c01e,    0x7c1c9,
    0x16300b,   0x170004,   0x176000,   0x177000,   0x1b8004,   0x1bb001,   0x1bd003,   0x1bf800,
    0x1c3000,   0x1c4002,   0x1c6000,   0x1c7013,   0x1d1852,   0x1fb88a,   0x2450a5,   0x298825,
    0x2ac800,   0x2b0028,   0x2e801a,   0x2f7803,   0x31002a,   0x337001,   0x338862,   0x36a800,
    0x372801,   0x377001,   0x37d002,   0x37f800,   0x388000,   0x38901d,   0x3a6858,   0x3d8800,
    0x3e5020,   0x3fa001,   0x3fd000,   0x400015,   0x40d000,   0x412000,   0x414000,   0x420018,
    0x43000a,   0x438017,   0x444805,   0x450029,   0x482035,   0x49e800,   0x4a8000,   0x4ac009,
    0x4b880f,   0x4c2807,   0x4c7801,   0x4c9815,   0x4d5006,   0x4d9000,   0x4db003,   0x4de800,
    0x4e7000,   0x4ee001,   0x4ef802,   0x4f8001,   0x4fe000,   0x502805,   0x507801,   0x509815,
    0x515006,   0x519001,   0x51a801,   0x51c001,   0x52c803,   0x52f000,   0x539002,   0x542808,
    0x547802,   0x549815,   0x555006,   0x559001,   0x55a804,   0x55e800,   0x568000,   0x570001,
    0x57c800,   0x582807,   0x587801,   0x589815,   0x595006,   0x599001,   0x59a804,   0x59e800,
    0x5ae001,   0x5af802,   0x5b8800,   0x5c1800,   0x5c2805,   0x5c7002,   0x5c9003,   0x5cc801,
    0x5ce000,   0x5cf001,   0x5d1801,   0x5d4002,   0x5d700b,   0x5e8000,   0x602807,   0x607002,
    0x609016,   0x61500f,   0x61e800,   0x62c002,   0x62e800,   0x630001,   0x640000,   0x642807,
    0x647002,   0x649016,   0x655009,   0x65a804,   0x65e800,   0x66e801,   0x670001,   0x678801,
    0x682008,   0x687002,   0x689028,   0x69e800,   0x6a7000,   0x6aa002,   0x6af802,   0x6bd005,
    0x6c2811,   0x6cd017,   0x6d9808,   0x6de800,   0x6e0006,   0x70082f,   0x719001,   0x720006,
    0x740801,   0x742000,   0x743004,   0x746017,   0x752800,   0x753809,   0x759001,   0x75e800,
    0x760004,   0x763000,   0x76e003,   0x780000,   0x7a0007,   0x7a4823,   0x7c4004,   0x80002a,
    0x81f800,   0x828005,   0x82d003,   0x830800,   0x832801,   0x837002,   0x83a80c,   0x847000,
    0x850025,   0x863800,   0x866800,   0x86802a,   0x87e14c,   0x925003,   0x928006,   0x92c000,
    0x92d003,   0x930028,   0x945003,   0x948020,   0x959003,   0x95c006,   0x960000,   0x961003,
    0x96400e,   0x96c038,   0x989003,   0x98c042,   0x9c000f,   0x9d0055,   0x9fc005,   0xa00a6b,
    0xb37810,   0xb40819,   0xb5004a,   0xb78807,   0xb80011,   0xb8f812,   0xba0011,   0xbb000c,
    0xbb7002,   0xbc0033,   0xbeb800,   0xbee000,   0xc10058,   0xc40004,   0xc43821,   0xc55000,
    0xc58045,   0xc8001e,   0xca801d,   0xcb8004,   0xcc002b,   0xcd8019,   0xd00016,   0xd10034,
    0xd53800,   0xd8282e,   0xda2807,   0xdc181d,   0xdd7001,   0xddd02b,   0xe00023,   0xe26802,
    0xe2d023,   0xe40008,   0xe4802a,   0xe5e802,   0xe74803,   0xe77005,   0xe7a801,   0xe7d000,
    0xe800bf,   0xf00115,   0xf8c005,   0xf90025,   0xfa4005,   0xfa8007,   0xfac800,   0xfad800,
    0xfae800,   0xfaf81e,   0xfc0034,   0xfdb006,   0xfdf000,   0xfe1002,   0xfe3006,   0xfe8003,
    0xfeb005,   0xff000c,   0xff9002,   0xffb006,   0x1038800,  0x103f800,  0x104800c,  0x1081000,
    0x1083800,  0x1085009,  0x108a800,  0x108c804,  0x1092000,  0x1093000,  0x1094000,  0x1095003,
    0x109780a,  0x109e003,  0x10a2804,  0x10a7000,  0x10c1801,  0x16000e4,  0x1675803,  0x1679001,
    0x1680025,  0x1693800,  0x1696800,  0x1698037,  0x16b7800,  0x16c0016,  0x16d0006,  0x16d4006,
    0x16d8006,  0x16dc006,  0x16e0006,  0x16e4006,  0x16e8006,  0x16ec006,  0x1717800,  0x1802801,
    0x1818804,  0x181d801,  0x1820855,  0x184e802,  0x1850859,  0x187e003,  0x188282a,  0x189885d,
    0x18d001f,  0x18f800f,  0x1a007ff,  0x1e007ff,  0x22007ff,  0x26001bf,  0x27007ff,  0x2b007ff,
    0x2f007ff,  0x33007ff,  0x37007ff,  0x3b007ff,  0x3f007ff,  0x43007ff,  0x47007ff,  0x4b007ff,
    0x4f0068c,  0x526802d,  0x528010c,  0x530800f,  0x5315001,  0x532002e,  0x533f81e,  0x5350045,
    0x538b808,  0x5391066,  0x53c583f,  0x53e8001,  0x53e9800,  0x53ea804,  0x53f900f,  0x5401802,
    0x5403803,  0x5406016,  0x5420033,  0x5441031,  0x5479005,  0x547d800,  0x547e801,  0x548501b,
    0x5498016,  0x54b001c,  0x54c202e,  0x54e7800,  0x54f0004,  0x54f3009,  0x54fd004,  0x5500028,
    0x5520002,  0x5522007,  0x5530016,  0x553d000,  0x553f031,  0x5558800,  0x555a801,  0x555c804,
    0x5560000,  0x5561000,  0x556d802,  0x557000a,  0x5579002,  0x5580805,  0x5584805,  0x5588805,
    0x5590006,  0x5594006,  0x559802a,  0x55ae00d,  0x55b8072,  0x56007ff,  0x5a007ff,  0x5e007ff,
    0x62007ff,  0x66007ff,  0x6a003a3,  0x6bd8016,  0x6be5830,  0x7c8016d,  0x7d38069,  0x7d80006,
    0x7d89804,  0x7d8e800,  0x7d8f809,  0x7d9500c,  0x7d9c004,  0x7d9f000,  0x7da0001,  0x7da1801,
    0x7da306b,  0x7de996a,  0x7ea803f,  0x7ec9035,  0x7ef800b,  0x7f38004,  0x7f3b086,  0x7f90819,
    0x7fa0819,  0x7fb3058,  0x7fe1005,  0x7fe5005,  0x7fe9005,  0x7fed002,  0x800000b,  0x8006819,
    0x8014012,  0x801e001,  0x801f80e,  0x802800d,  0x804007a,  0x814001c,  0x8150030,  0x818001f,
    0x8196813,  0x81a1007,  0x81a8025,  0x81c001d,  0x81d0023,  0x81e4007,  0x820009d,  0x8258023,
    0x826c023,  0x8280027,  0x8298033,  0x82b800a,  0x82be00e,  0x82c6006,  0x82ca001,  0x82cb80a,
    0x82d180e,  0x82d9806,  0x82dd801,  0x8300136,  0x83a0015,  0x83b0007,  0x83c0005,  0x83c3829,
    0x83d9008,  0x8400005,  0x8404000,  0x840502b,  0x841b801,  0x841e000,  0x841f816,  0x8430016,
    0x844001e,  0x8470012,  0x847a001,  0x8480015,  0x8490019,  0x84c0037,  0x84df001,  0x8500000,
    0x8508003,  0x850a802,  0x850c81c,  0x853001c,  0x854001c,  0x8560007,  0x856481b,  0x8580035,
    0x85a0015,  0x85b0012,  0x85c0011,  0x8600048,  0x8640032,  0x8660032,  0x8680023,  0x8740029,
    0x8758001,  0x878001c,  0x8793800,  0x8798015,  0x87b8011,  0x87d8014,  0x87f0016,  0x8801834,
    0x8838801,  0x883a800,  0x884182c,  0x8868018,  0x8881823,  0x88a2000,  0x88a3800,  0x88a8022,
    0x88bb000,  0x88c182f,  0x88e0803,  0x88ed000,  0x88ee000,  0x8900011,  0x8909818,  0x891f801,
    0x8940006,  0x8944000,  0x8945003,  0x894780e,  0x894f809,  0x895802e,  0x8982807,  0x8987801,
    0x8989815,  0x8995006,  0x8999001,  0x899a804,  0x899e800,  0x89a8000,  0x89ae804,  0x8a00034,
    0x8a23803,  0x8a2f802,  0x8a4002f,  0x8a62001,  0x8a63800,  0x8ac002e,  0x8aec003,  0x8b0002f,
    0x8b22000,  0x8b4002a,  0x8b5c000,  0x8b8001a,  0x8ba0006,  0x8c0002b,  0x8c5003f,  0x8c7f807,
    0x8c84800,  0x8c86007,  0x8c8a801,  0x8c8c017,  0x8c9f800,  0x8ca0800,  0x8cd0007,  0x8cd5026,
    0x8cf0800,  0x8cf1800,  0x8d00000,  0x8d05827,  0x8d1d000,  0x8d28000,  0x8d2e02d,  0x8d4e800,
    0x8d58048,  0x8e00008,  0x8e05024,  0x8e20000,  0x8e3901d,  0x8e80006,  0x8e84001,  0x8e85825,
    0x8ea3000,  0x8eb0005,  0x8eb3801,  0x8eb501f,  0x8ecc000,  0x8f70012,  0x8f81000,  0x8f8200c,
    0x8f89021,  0x8fd8000,  0x9000399,  0x92400c3,  0x97c8060,  0x980042f,  0x9a20805,  0xa200246,
    0xb400238,  0xb52001e,  0xb53804e,  0xb56801d,  0xb58002f,  0xb5a0003,  0xb5b1814,  0xb5be812,
    0xb72003f,  0xb78004a,  0xb7a8000,  0xb7c980c,  0xb7f0001,  0xb7f1800,  0xb8007ff,  0xbc007ff,
    0xc0007f7,  0xc4004d5,  0xc680008,  0xd7f8003,  0xd7fa806,  0xd7fe801,  0xd800122,  0xd899000,
    0xd8a8002,  0xd8aa800,  0xd8b2003,  0xd8b818b,  0xde0006a,  0xde3800c,  0xde40008,  0xde48009,
    0xea00054,  0xea2b046,  0xea4f001,  0xea51000,  0xea52801,  0xea54803,  0xea5700b,  0xea5d800,
    0xea5e806,  0xea62840,  0xea83803,  0xea86807,  0xea8b006,  0xea8f01b,  0xea9d803,  0xeaa0004,
    0xeaa3000,  0xeaa5006,  0xeaa9153,  0xeb54018,  0xeb61018,  0xeb6e01e,  0xeb7e018,  0xeb8b01e,
    0xeb9b018,  0xeba801e,  0xebb8018,  0xebc501e,  0xebd5018,  0xebe2007,  0xef8001e,  0xef92805,
    0xf01803d,  0xf08002c,  0xf09b806,  0xf0a7000,  0xf14801d,  0xf16002b,  0xf26801b,  0xf3f0006,
    0xf3f4003,  0xf3f6801,  0xf3f800e,  0xf4000c4,  0xf480043,  0xf4a5800,  0xf700003,  0xf70281a,
    0xf710801,  0xf712000,  0xf713800,  0xf714809,  0xf71a003,  0xf71c800,  0xf71d800,  0xf721000,
    0xf723800,  0xf724800,  0xf725800,  0xf726802,  0xf728801,  0xf72a000,  0xf72b800,  0xf72c800,
    0xf72d800,  0xf72e800,  0xf72f800,  0xf730801,  0xf732000,  0xf733803,  0xf736006,  0xf73a003,
    0xf73c803,  0xf73f000,  0xf740009,  0xf745810,  0xf750802,  0xf752804,  0xf755810,  0x100007ff,
    0x104007ff, 0x108007ff, 0x10c007ff, 0x110007ff, 0x114007ff, 0x118007ff, 0x11c007ff, 0x120007ff,
    0x124007ff, 0x128007ff, 0x12c007ff, 0x130007ff, 0x134007ff, 0x138007ff, 0x13c007ff, 0x140007ff,
    0x144007ff, 0x148007ff, 0x14c007ff, 0x150006df, 0x153807ff, 0x157807ff, 0x15b80039, 0x15ba00dd,
    0x15c107ff, 0x160107ff, 0x16410681, 0x167587ff, 0x16b587ff, 0x16f587ff, 0x17358530, 0x175f826d,
    0x17c0021d, 0x180007ff, 0x184007ff, 0x1880034a, 0x189a87ff, 0x18da87ff, 0x191a805f,
};
static const uint32_t tok_number[137] = {
    /* \p{N}: 137 ranges */
    0x18009,   0x59001,   0x5c800,   0x5e002,   0x330009,  0x378009,  0x3e0009,  0x4b3009,
    0x4f3009,  0x4fa005,  0x533009,  0x573009,  0x5b3009,  0x5b9005,  0x5f300c,  0x633009,
    0x63c006,  0x673009,  0x6ac006,  0x6b3012,  0x6f3009,  0x728009,  0x768009,  0x790013,
    0x820009,  0x848009,  0x9b4813,  0xb77002,  0xbf0009,  0xbf8009,  0xc08009,  0xca3009,
    0xce800a,  0xd40009,  0xd48009,  0xda8009,  0xdd8009,  0xe20009,  0xe28009,  0x1038000,
    0x103a005, 0x1040009, 0x10a8032, 0x10c2804, 0x123003b, 0x1275015, 0x13bb01d, 0x167e800,
    0x1803800, 0x1810808, 0x181c002, 0x18c9003, 0x1910009, 0x1924007, 0x192880e, 0x1940009,
    0x195880e, 0x5310009, 0x5373009, 0x5418005, 0x5468009, 0x5480009, 0x54e8009, 0x54f8009,
    0x5528009, 0x55f8009, 0x7f88009, 0x808382c, 0x80a0038, 0x80c5001, 0x817081a, 0x8190003,
    0x81a0800, 0x81a5000, 0x81e8804, 0x8250009, 0x842c007, 0x843c806, 0x8453808, 0x847d804,
    0x848b005, 0x84de001, 0x84e000f, 0x84e902d, 0x8520008, 0x853e801, 0x854e802, 0x8575804,
    0x85ac007, 0x85bc007, 0x85d4806, 0x867d005, 0x8698009, 0x873001e, 0x878e809, 0x87a8803,
    0x87e2806, 0x882901d, 0x8878009, 0x889b009, 0x88e8009, 0x88f0813, 0x8978009, 0x8a28009,
    0x8a68009, 0x8b28009, 0x8b60009, 0x8b9800b, 0x8c70012, 0x8ca8009, 0x8e2801c, 0x8ea8009,
    0x8ed0009, 0x8fa8009, 0x8fe0014, 0x920006e, 0xb530009, 0xb560009, 0xb5a8009, 0xb5ad806,
    0xb740016, 0xe960013, 0xe970013, 0xe9b0018, 0xebe7031, 0xf0a0009, 0xf178009, 0xf278009,
    0xf463808, 0xf4a8009, 0xf63883a, 0xf656802, 0xf658803, 0xf68082c, 0xf69780e, 0xf88000c,
    0xfdf8009,
};
static const uint32_t tok_punct[191] = {
    /* \p{P}: 191 ranges */
    0x10802,   0x12805,   0x16003,   0x1d001,   0x1f801,   0x2d802,   0x2f800,   0x3d800,
    0x3e800,   0x50800,   0x53800,   0x55800,   0x5b001,   0x5d800,   0x5f800,   0x1bf000,
    0x1c3800,  0x2ad005,  0x2c4801,  0x2df000,  0x2e0000,  0x2e1800,  0x2e3000,  0x2f9801,
    0x304801,  0x306001,  0x30d800,  0x30e802,  0x335003,  0x36a000,  0x38000d,  0x3fb802,
    0x41800e,  0x42f000,  0x4b2001,  0x4b8000,  0x4fe800,  0x53b000,  0x578000,  0x63b800,
    0x642000,  0x6fa000,  0x727800,  0x72d001,  0x78200e,  0x78a000,  0x79d003,  0x7c2800,
    0x7e8004,  0x7ec801,  0x825005,  0x87d800,  0x9b0008,  0xa00000,  0xb37000,  0xb4d801,
    0xb75802,  0xb9a801,  0xbea002,  0xbec002,  0xc0000a,  0xca2001,  0xd0f001,  0xd50006,
    0xd54005,  0xdad006,  0xdbe801,  0xdfe003,  0xe1d804,  0xe3f001,  0xe60007,  0xe69800,
    0x1008017, 0x1018013, 0x102280c, 0x102980b, 0x103e801, 0x1046801, 0x1184003, 0x1194801,
    0x13b400d, 0x13e2801, 0x13f3009, 0x14c1815, 0x14ec003, 0x14fe001, 0x167c803, 0x167f001,
    0x16b8000, 0x170002e, 0x171801f, 0x172900b, 0x1800802, 0x1804009, 0x180a00b, 0x1818000,
    0x181e800, 0x1850000, 0x187d800, 0x527f001, 0x5306802, 0x5339800, 0x533f000, 0x5379005,
    0x543a003, 0x5467001, 0x547c002, 0x547e000, 0x5497001, 0x54af800, 0x54e080c, 0x54ef001,
    0x552e003, 0x556f001, 0x5578001, 0x55f5800, 0x7e9f001, 0x7f08009, 0x7f18022, 0x7f2a00d,
    0x7f31800, 0x7f34000, 0x7f35001, 0x7f80802, 0x7f82805, 0x7f86003, 0x7f8d001, 0x7f8f801,
    0x7f9d802, 0x7f9f800, 0x7fad800, 0x7fae800, 0x7faf806, 0x8080002, 0x81cf800, 0x81e8000,
    0x82b7800, 0x842b800, 0x848f800, 0x849f800, 0x8528008, 0x853f800, 0x8578006, 0x859c806,
    0x85cc803, 0x8756800, 0x87aa804, 0x87c3003, 0x8823806, 0x885d801, 0x885f003, 0x88a0003,
    0x88ba001, 0x88e2803, 0x88e6800, 0x88ed800, 0x88ee802, 0x891c005, 0x8954800, 0x8a25804,
    0x8a2d001, 0x8a2e800, 0x8a63000, 0x8ae0816, 0x8b20802, 0x8b3000c, 0x8b5c800, 0x8b9e002,
    0x8c1d800, 0x8ca2002, 0x8cf1000, 0x8d1f807, 0x8d4d002, 0x8d4f004, 0x8d80009, 0x8e20804,
    0x8e38001, 0x8f7b801, 0x8fa180c, 0x8fff800, 0x9238004, 0x97f8801, 0xb537001, 0xb57a800,
    0xb59b804, 0xb5a2000, 0xb74b803, 0xb7f1000, 0xde4f800, 0xed43804, 0xf4af001,
};

/* ----------------------------------------------------------------------------
 * Unicode categories */

/* codepoint class flags; TOK_U_ANY marks a codepoint (as opposed to "past the end", 0) */
enum { TOK_U_ANY = 1, TOK_U_L = 2, TOK_U_N = 4, TOK_U_P = 8, TOK_U_WS = 16 };

static int tok_in_table(const uint32_t *r, int n, uint32_t c) {
    int lo = 0, hi = n - 1;                  /* find the last range starting at or before c */
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((r[mid] >> 11) <= c) lo = mid + 1; else hi = mid - 1;
    }
    return hi >= 0 && c - (r[hi] >> 11) <= (r[hi] & 2047);
}

/* \s as llama.cpp has it: Unicode White_Space */
static int tok_is_white(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int tok_ucat(uint32_t c) {
    int f = TOK_U_ANY;
    if (c < 128) {                           /* fast path, same answers as the tables */
        if ((c | 32) >= 'a' && (c | 32) <= 'z') f |= TOK_U_L;
        else if (c >= '0' && c <= '9') f |= TOK_U_N;
        else if (c > 32 && c < 127 && strchr("!\"#%&'()*,-./:;?@[\\]_{}", (int)c)) f |= TOK_U_P;
    } else if (tok_in_table(tok_letter, sizeof tok_letter / 4, c)) f |= TOK_U_L;
    else if (tok_in_table(tok_number, sizeof tok_number / 4, c)) f |= TOK_U_N;
    else if (tok_in_table(tok_punct, sizeof tok_punct / 4, c)) f |= TOK_U_P;
    return tok_is_white(c) ? f | TOK_U_WS : f;
}

/* ----------------------------------------------------------------------------
 * UTF-8 and the GPT-2 byte map */

/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF) */
int utf8_valid(const unsigned char *s, size_t n) {
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
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* Decode one codepoint leniently, as llama.cpp does: overlong forms and surrogates pass; an
   invalid or truncated sequence gives U+FFFD and consumes one byte (so do codepoints past
   U+10FFFF, on which llama.cpp throws). Returns the bytes consumed, n >= 1. */
static int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
    if (len == 1) { *cp = c; return 1; }
    if (len == 0 || (size_t)len > n) goto bad;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v > 0x10FFFF) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xFFFD;
    return 1;
}

static int tok_utf8_encode(uint32_t c, unsigned char *o) {
    if (c < 0x80) { o[0] = c; return 1; }
    if (c < 0x800) { o[0] = 0xC0 | c >> 6; o[1] = 0x80 | (c & 63); return 2; }
    if (c < 0x10000) {
        o[0] = 0xE0 | c >> 12;
        o[1] = 0x80 | (c >> 6 & 63);
        o[2] = 0x80 | (c & 63);
        return 3;
    }
    o[0] = 0xF0 | c >> 18;
    o[1] = 0x80 | (c >> 12 & 63);
    o[2] = 0x80 | (c >> 6 & 63);
    o[3] = 0x80 | (c & 63);
    return 4;
}

/* GPT-2 shows every byte as a printable codepoint: printable bytes stay, the other 68
   (0x00-0x20, 0x7F-0xA0, 0xAD) become U+0100.. in byte order. Codepoint -> byte, -1 if none. */
static int tok_gpt2_cpt_to_byte(uint32_t c) {
    if (c < 0x100) return (c <= 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) ? -1 : (int)c;
    if (c < 0x100 + 33) return c - 0x100;
    if (c < 0x100 + 67) return 0x7F + (c - 0x100 - 33);
    return c == 0x100 + 67 ? 0xAD : -1;
}

/* Undo the GPT-2 map on a whole string; the raw length, or -1 if a codepoint is not mapped */
static long tok_gpt2_unmap(const char *s, size_t n, char *out) {
    long m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += tok_utf8_decode((const unsigned char *)s + i, n - i, &c);
        int b = tok_gpt2_cpt_to_byte(c);
        if (b < 0) return -1;
        out[m++] = (char)b;
    }
    return m;
}

/* ----------------------------------------------------------------------------
 * Hash tables: lookup string -> key id, (left key, right key) -> merge */

static uint32_t tok_hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;                                  /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static uint32_t tok_hash_pair(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;   /* murmur3 finalizer */
    return (uint32_t)k;
}

/* slot holding key s, or the empty slot where it would go */
static uint32_t tok_key_slot(const Tokenizer *t, const char *s, size_t n) {
    uint32_t mask = t->key_cap - 1, h = tok_hash_bytes(s, n) & mask;
    for (;; h = (h + 1) & mask) {
        int32_t id = t->key_hash[h];
        if (id < 0) return h;
        const char *k = t->key + t->key_off[id];
        if (t->key_off[id + 1] - t->key_off[id] == n && memcmp(k, s, n) == 0) return h;
    }
}

static int32_t tok_key_find(const Tokenizer *t, const char *s, size_t n) {
    return t->key_hash[tok_key_slot(t, s, n)];
}

/* append key s (the arena was sized in advance); returns its id, or -1 if s was already there */
static int32_t tok_key_add(Tokenizer *t, const char *s, size_t n) {
    uint32_t h = tok_key_slot(t, s, n);
    if (t->key_hash[h] >= 0) return -1;
    int32_t id = t->n_keys++;
    memmove(t->key + t->key_off[id], s, n);
    t->key_off[id + 1] = t->key_off[id] + (uint32_t)n;
    t->key_hash[h] = id;
    return id;
}

static uint32_t tok_pair_slot(const Tokenizer *t, int32_t l, int32_t r) {
    uint64_t k = (uint64_t)(l + 1) << 32 | (uint32_t)(r + 1);
    uint32_t mask = t->pair_cap - 1, h = tok_hash_pair(k) & mask;
    while (t->pair[h] != 0 && t->pair[h] != k) h = (h + 1) & mask;
    return h;
}

/* ----------------------------------------------------------------------------
 * Building and freeing */

static const struct {
    const char *name;
    int pre, llama3;
} tok_pre_names[] = {
    {"default", TOK_PRE_DEFAULT, 0},   {"gpt-2", TOK_PRE_GPT2, 0},
    {"phi-2", TOK_PRE_GPT2, 0},        {"mpt", TOK_PRE_GPT2, 0},
    {"olmo", TOK_PRE_GPT2, 0},         {"jais", TOK_PRE_GPT2, 0},
    {"exaone4", TOK_PRE_GPT2, 0},      {"gigachat", TOK_PRE_GPT2, 0},
    {"trillion", TOK_PRE_GPT2, 0},     {"granite-docling", TOK_PRE_GPT2, 0},
    {"smollm", TOK_PRE_SMOLLM, 0},     {"starcoder", TOK_PRE_SMOLLM, 0},
    {"refact", TOK_PRE_SMOLLM, 0},     {"command-r", TOK_PRE_SMOLLM, 0},
    {"codeshell", TOK_PRE_SMOLLM, 0},  {"exaone", TOK_PRE_SMOLLM, 0},
    {"minerva-7b", TOK_PRE_SMOLLM, 0}, {"mellum2", TOK_PRE_SMOLLM, 0},
    {"llama3", TOK_PRE_LLAMA3, 1},     {"llama-v3", TOK_PRE_LLAMA3, 1},
    {"llama-bpe", TOK_PRE_LLAMA3, 1},  {"falcon3", TOK_PRE_LLAMA3, 1},
    {"falcon-h1", TOK_PRE_LLAMA3, 1},  {"pixtral", TOK_PRE_LLAMA3, 1},
    {"midm-2.0", TOK_PRE_LLAMA3, 1},   {"lfm2", TOK_PRE_LLAMA3, 1},
    {"dbrx", TOK_PRE_LLAMA3, 0},       {"smaug-bpe", TOK_PRE_LLAMA3, 0},
    {"qwen2", TOK_PRE_QWEN2, 0},       {"deepseek-r1-qwen", TOK_PRE_QWEN2, 0},
    {"megrez", TOK_PRE_QWEN2, 0},      {"stablelm2", TOK_PRE_QWEN2, 0},
    {"hunyuan", TOK_PRE_QWEN2, 0},     {"solar-open", TOK_PRE_QWEN2, 0},
    {"falcon", TOK_PRE_FALCON, 0},
};

/* Texts llama.cpp forces to CONTROL (end-of-generation, EOT and FIM markers); the first 11
   are its EOT candidates, used when the GGUF names no eot id. */
static const char *tok_control_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<end_of_utterance>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81"
    "sentence\xEF\xBD\x9C>",
    "<|eom_id|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "\xE2\x96\x81<PRE>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "\xE2\x96\x81<SUF>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "\xE2\x96\x81<MID>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
};

static int tok_fail(Tokenizer *t, char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    free_tokenizer(t);
    return -1;
}

/* total bytes of n strings (empty ones count as `empty`), UINT64_MAX if one is malformed */
static uint64_t tok_strs_total(const Str *a, int n, uint64_t empty) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].len > (1u << 30) || (a[i].len && !a[i].s)) return UINT64_MAX;
        total += a[i].len ? a[i].len : empty;
    }
    return total;
}

static uint32_t tok_pow2_above(uint64_t n) {
    uint32_t c = 16;
    while (c < n && c < (1u << 31)) c *= 2;
    return c;
}

static int tok_text_len(const Tokenizer *t, int32_t id) {
    return (int)(t->text_off[id + 1] - t->text_off[id]);
}

static int tok_same_text(const Tokenizer *t, int32_t id, const char *s, size_t n) {
    return (size_t)tok_text_len(t, id) == n && memcmp(t->text + t->text_off[id], s, n) == 0;
}

/* id of the token whose GGUF text is s, or -1 */
static int32_t tok_text_find(const Tokenizer *t, const char *s) {
    size_t n = strlen(s);
    int32_t id = tok_key_find(t, s, n);
    if (id >= 0 && id < t->n_vocab && tok_same_text(t, id, s, n)) return id;
    int plain = 1;                             /* printable ASCII: the BPE key is the text too */
    for (size_t i = 0; i < n; i++)
        plain &= (unsigned char)s[i] >= 0x21 && (unsigned char)s[i] <= 0x7E;
    for (id = 0; t->kind == TOK_BPE && !plain && id < t->n_vocab; id++)
        if (tok_same_text(t, id, s, n)) return id;
    return -1;
}

typedef struct { int len; int32_t id; } TokLen;
static int tok_by_len_desc(const void *a, const void *b) {
    const TokLen *x = a, *y = b;
    return x->len != y->len ? y->len - x->len : x->id - y->id;
}

/* Split a merge line "left right" at the first space after its first byte, as llama.cpp does,
   and undo the GPT-2 map into out: left at out[0..*nl), right at out[*nl..*nl+*nr). */
static int tok_merge_unmap(Str m, char *out, long *nl, long *nr) {
    const char *sp = m.len > 1 ? memchr(m.s + 1, ' ', m.len - 1) : NULL;
    if (!sp) return -1;
    *nl = tok_gpt2_unmap(m.s, sp - m.s, out);
    if (*nl < 0) return -1;
    *nr = tok_gpt2_unmap(sp + 1, m.s + m.len - sp - 1, out + *nl);
    return *nr < 0 ? -1 : 0;
}

/* Merge table, rank = line number. A merge result missing from the vocab still becomes a key
   (a pseudo token), since llama.cpp merges strings and may merge it further. */
static int tok_build_merges(Tokenizer *t, const TokenizerSpec *sp, char *tmp) {
    long nl, nr;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t k = tok_key_find(t, &c, 1);
        t->byte_tok[b] = k >= 0 ? k : tok_key_add(t, &c, 1);
    }
    for (int i = 0; i < sp->n_merges; i++)
        if (tok_merge_unmap(sp->merges[i], tmp, &nl, &nr) == 0 && tok_key_find(t, tmp, nl + nr) < 0)
            tok_key_add(t, tmp, nl + nr);
    t->pair_cap = tok_pow2_above(2 * (uint64_t)sp->n_merges);
    t->pair = calloc(t->pair_cap, sizeof *t->pair);
    t->pair_rank = malloc(t->pair_cap * sizeof *t->pair_rank);
    t->pair_merged = malloc(t->pair_cap * sizeof *t->pair_merged);
    if (!t->pair || !t->pair_rank || !t->pair_merged) return -1;
    for (int i = 0; i < sp->n_merges; i++) {
        if (tok_merge_unmap(sp->merges[i], tmp, &nl, &nr) != 0) continue;
        int32_t l = tok_key_find(t, tmp, nl), r = tok_key_find(t, tmp + nl, nr);
        if (l < 0 || r < 0) continue;                  /* can never occur as a symbol */
        uint32_t h = tok_pair_slot(t, l, r);
        if (t->pair[h] != 0) continue;                 /* duplicate merge: the first rank wins */
        t->pair[h] = (uint64_t)(l + 1) << 32 | (uint32_t)(r + 1);
        t->pair_rank[h] = i;
        t->pair_merged[h] = tok_key_find(t, tmp, nl + nr);
    }
    return 0;
}

/* token strings (llama.cpp renames empty ones "[EMPTY_<id>]"), types, scores; `total`: the
 * strings' bytes (tok_strs_total) */
static int tok_copy_texts(Tokenizer *t, const TokenizerSpec *sp, uint64_t total, char *err,
                          size_t errlen) {
    int n = t->n_vocab;
    t->text = malloc(total + 1);
    t->text_off = malloc((n + 1) * sizeof *t->text_off);
    t->score = malloc(n * sizeof *t->score);
    t->type = malloc(n);
    t->special = malloc(n * sizeof *t->special);
    if (!t->text || !t->text_off || !t->score || !t->type || !t->special)
        return tok_fail(t, err, errlen, "tokenizer: out of memory");
    t->text_off[0] = 0;
    for (int i = 0; i < n; i++) {
        char *p = t->text + t->text_off[i];
        uint32_t len = sp->tokens[i].len ? (uint32_t)sp->tokens[i].len
                                         : (uint32_t)snprintf(p, 21, "[EMPTY_%d]", i);
        if (sp->tokens[i].len) memcpy(p, sp->tokens[i].s, len);
        t->text_off[i + 1] = t->text_off[i] + len;
        t->score[i] = sp->scores ? sp->scores[i] : 0.0f;
        int ty = sp->types ? sp->types[i] : TOK_NORMAL;
        t->type[i] = ty >= TOK_NORMAL && ty <= TOK_BYTE ? ty : 0;
    }
    return 0;
}

/* lookup keys and their hash, then BPE's merges or SPM's byte tokens; BPE keys are raw bytes,
 * so encoding never applies the byte map. `total`, `mtotal`: the bytes of the token and merge
 * strings */
static int tok_build_keys(Tokenizer *t, const TokenizerSpec *sp, uint64_t total, uint64_t mtotal,
                          char *err, size_t errlen) {
    int n = t->n_vocab;
    uint64_t nkeys = (uint64_t)n + (t->kind == TOK_BPE ? 256 + sp->n_merges : 0);
    t->key = malloc(total + mtotal + 256 + 1);
    t->key_off = malloc((nkeys + 1) * sizeof *t->key_off);
    t->key_cap = tok_pow2_above(2 * nkeys);
    t->key_hash = malloc(t->key_cap * sizeof *t->key_hash);
    char *tmp = malloc(mtotal + 8);
    if (!t->key || !t->key_off || !t->key_hash || !tmp) {
        free(tmp);
        return tok_fail(t, err, errlen, "tokenizer: out of memory");
    }
    memset(t->key_hash, 0xFF, t->key_cap * sizeof *t->key_hash);
    t->key_off[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *s = t->text + t->text_off[i];
        long len = tok_text_len(t, i);
        if (t->kind == TOK_BPE) len = tok_gpt2_unmap(s, len, t->key + t->key_off[i]);
        if (len < 0) {                         /* not byte-mapped text: BPE can never produce it */
            t->key_off[++t->n_keys] = t->key_off[i];
            continue;
        }
        if (tok_key_add(t, t->kind == TOK_BPE ? t->key + t->key_off[i] : s, len) < 0) {
            free(tmp);
            return tok_fail(t, err, errlen, "tokenizer: duplicate token '%.*s' (id %d)",
                            tok_text_len(t, i), s, i);
        }
    }
    int rc = t->kind == TOK_BPE ? tok_build_merges(t, sp, tmp) : 0;
    free(tmp);
    if (rc) return tok_fail(t, err, errlen, "tokenizer: out of memory");
    if (t->kind == TOK_SPM) {                  /* byte fallback: <0xHH>, else the byte itself */
        for (int b = 0; b < 256; b++) {
            char hex[7], c = (char)b;
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t id = tok_key_find(t, hex, 6);
            t->byte_tok[b] = id >= 0 ? id : tok_key_find(t, &c, 1);
        }
    }
    return 0;
}

/* special ids and flags: the spec's, else llama.cpp's defaults per model kind */
static int tok_settle_specials(Tokenizer *t, const TokenizerSpec *sp, int llama3, char *err,
                               size_t errlen) {
    int n = t->n_vocab, spm = t->kind == TOK_SPM;
    int ids[5] = {sp->bos_id, sp->eos_id, sp->eot_id, sp->unk_id, sp->pad_id};
    int def[5] = {spm ? 1 : 11, spm ? 2 : 11, -1, spm ? 0 : -1, -1};
    for (int k = 0; k < 5; k++) {
        if (ids[k] < 0 || ids[k] >= n) ids[k] = def[k] < n ? def[k] : -1;
    }
    t->bos_id = ids[0];
    t->eos_id = ids[1];
    t->eot_id = ids[2];
    t->unk_id = ids[3];
    t->pad_id = ids[4];
    t->add_bos = sp->add_bos >= 0 ? sp->add_bos != 0 : (spm || llama3);
    t->add_eos = sp->add_eos > 0;
    t->add_space_prefix = sp->add_space_prefix >= 0 ? sp->add_space_prefix != 0 : spm;
    t->ignore_merges = llama3;
    if ((t->add_bos && t->bos_id < 0) || (t->add_eos && t->eos_id < 0))
        return tok_fail(t, err, errlen,
                        "tokenizer: add_bos/add_eos set but the token id is missing");
    if (spm && t->unk_id >= 0)
        for (int b = 0; b < 256; b++) if (t->byte_tok[b] < 0) t->byte_tok[b] = t->unk_id;
    return 0;
}

/* control-looking tokens, then the special-token cache (longest first) */
static int tok_build_special_cache(Tokenizer *t, char *err, size_t errlen) {
    int n = t->n_vocab;
    for (size_t k = 0; k < sizeof tok_control_texts / sizeof tok_control_texts[0]; k++) {
        int32_t id = tok_text_find(t, tok_control_texts[k]);
        if (id < 0) continue;
        t->type[id] = TOK_CONTROL;
        if (t->eot_id < 0 && k < 11) t->eot_id = id;
    }
    TokLen *order = malloc(n * sizeof *order);
    if (!order) return tok_fail(t, err, errlen, "tokenizer: out of memory");
    for (int i = 0; i < n; i++)
        if (t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER_DEFINED ||
            t->type[i] == TOK_UNKNOWN)
            order[t->n_special++] = (TokLen){tok_text_len(t, i), i};
    qsort(order, t->n_special, sizeof *order, tok_by_len_desc);
    for (int i = 0; i < t->n_special; i++) t->special[i] = order[i].id;
    free(order);
    return 0;
}

int build_tokenizer(Tokenizer *t, const TokenizerSpec *sp, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (!sp || !sp->model || sp->n_vocab <= 0 || !sp->tokens || sp->n_merges < 0 ||
        (sp->n_merges && !sp->merges))
        return tok_fail(t, err, errlen,
                        "tokenizer: incomplete spec (model, tokens or merges missing)");
    if (strcmp(sp->model, "gpt2") == 0) t->kind = TOK_BPE;
    else if (strcmp(sp->model, "llama") == 0) t->kind = TOK_SPM;
    else
        return tok_fail(t, err, errlen, "tokenizer: unsupported model '%s' (want gpt2 or llama)",
                        sp->model);
    int llama3 = 0, n = t->n_vocab = sp->n_vocab;
    if (t->kind == TOK_BPE && sp->pre && sp->pre[0]) {
        size_t i, np = sizeof tok_pre_names / sizeof tok_pre_names[0];
        for (i = 0; i < np && strcmp(sp->pre, tok_pre_names[i].name) != 0; i++) {}
        if (i == np)
            return tok_fail(t, err, errlen, "tokenizer: unsupported pre-tokenizer '%s'", sp->pre);
        t->pre = tok_pre_names[i].pre;
        llama3 = tok_pre_names[i].llama3;
    }
    uint64_t total = tok_strs_total(sp->tokens, n, 20),
             mtotal = tok_strs_total(sp->merges, sp->n_merges, 0);
    if (total >= UINT32_MAX || mtotal >= UINT32_MAX || total + mtotal + 256 >= UINT32_MAX ||
        (uint64_t)n + sp->n_merges + 256 >= INT32_MAX)
        return tok_fail(t, err, errlen, "tokenizer: malformed or too large token/merge strings");
    if (tok_copy_texts(t, sp, total, err, errlen) ||
        tok_build_keys(t, sp, total, mtotal, err, errlen) ||
        tok_settle_specials(t, sp, llama3, err, errlen) || tok_build_special_cache(t, err, errlen))
        return -1;   /* each step frees what was built and says why */
    return 0;
}

void free_tokenizer(Tokenizer *t) {
    if (!t) return;
    free(t->text); free(t->text_off); free(t->score); free(t->type); free(t->key); free(t->key_off);
    free(t->key_hash); free(t->pair); free(t->pair_rank); free(t->pair_merged); free(t->special);
    memset(t, 0, sizeof *t);
}

/* ----------------------------------------------------------------------------
 * Encoding state: scratch buffers of one encode call, and its output */

typedef struct {
    int32_t key;
    uint32_t start, len;
    int32_t prev, next;
} TokSym; /* a merge symbol */
typedef struct { double pri; int32_t left, right, lkey, rkey, merged; uint32_t size; } TokPair;

typedef struct {
    void *cpmem; size_t ncap;           /* (17 ncap) bytes: the five arrays below */
    uint32_t *cp, *boff;                /* (ncap) codepoints of a fragment, byte offset of each */
    int32_t *ends, *tmp;                /* (ncap) word ends (codepoint index), scratch copy */
    uint8_t *fl;                        /* (ncap) TOK_U_* flags of each codepoint */
    unsigned char *buf; size_t bcap;    /* (bcap) normalised (BPE) or escaped (SPM) fragment */
    TokSym *sym; size_t scap;           /* (scap) merge symbols */
    TokPair *heap; size_t hcap, nh;     /* (hcap) merge candidates, a binary heap of nh */
    int32_t *out; int max_out, n_out;   /* (max_out) the caller's ids */
    int prev_special;                   /* SPM: fragment follows a special token (or the start) */
    int failed;                         /* out of memory */
} TokState;

/* room for need elements; on failure keep the old block and flag the state */
static void *tok_grow(TokState *st, void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = need + need / 2 + 16;
    void *q = realloc(p, c * elem);
    if (!q) { st->failed = 1; return p; }
    *cap = c;
    return q;
}

static void tok_emit(TokState *st, int32_t id) {
    if (st->n_out < st->max_out) st->out[st->n_out] = id;
    st->n_out++;
}

/* heap order: higher pri first, then leftmost (llama.cpp's priority queues) */
static int tok_pair_before(const TokPair *x, const TokPair *y) {
    return x->pri > y->pri || (x->pri == y->pri && x->left < y->left);
}

static void tok_heap_push(TokState *st, TokPair p) {
    st->heap = tok_grow(st, st->heap, &st->hcap, st->nh + 1, sizeof *st->heap);
    if (st->nh + 1 > st->hcap) return;
    size_t i = st->nh++;
    for (; i > 0 && tok_pair_before(&p, &st->heap[(i - 1) / 2]); i = (i - 1) / 2)
        st->heap[i] = st->heap[(i - 1) / 2];
    st->heap[i] = p;
}

static TokPair tok_heap_pop(TokState *st) {
    TokPair top = st->heap[0], last = st->heap[--st->nh];
    size_t i = 0, n = st->nh;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tok_pair_before(&st->heap[c + 1], &st->heap[c])) c++;
        if (!tok_pair_before(&st->heap[c], &last)) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (n > 0) st->heap[i] = last;
    return top;
}

/* merge symbol r into its left neighbour l */
static void tok_sym_merge(TokSym *sym, int l, int r) {
    sym[l].len += sym[r].len;
    sym[r].len = 0;
    sym[l].next = sym[r].next;
    if (sym[r].next >= 0) sym[sym[r].next].prev = l;
}

/* ----------------------------------------------------------------------------
 * BPE pre-tokenizer: llama.cpp's regex splits, by hand. Each split takes the piece [a,b) of the
   fragment's codepoints c (flags f) and appends the ends of the words it cuts it into to e. */

static int tok_fl_at(const uint8_t *f, int i, int b) { return i < b ? f[i] : 0; }
static int tok_is_other(int fl) {
    return fl && !(fl & (TOK_U_WS | TOK_U_L | TOK_U_N));
} /* [^\s\p{L}\p{N}] */

/* 's|'t|'re|'ve|'m|'ll|'d at i (ASCII case folded when icase); returns the end, or i */
static int tok_contraction(const uint32_t *c, int i, int b, int icase) {
    if (c[i] != '\'' || i + 1 >= b) return i;
    uint32_t x = c[i + 1], y = i + 2 < b ? c[i + 2] : 0;
    if (icase && x < 128) x |= (x >= 'A' && x <= 'Z') ? 32 : 0;
    if (icase && y < 128) y |= (y >= 'A' && y <= 'Z') ? 32 : 0;
    if (x == 's' || x == 't' || x == 'm' || x == 'd') return i + 2;
    if ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l')) return i + 3;
    return i;
}

/* \s*[\r\n]+ (only when rn) | \s+(?!\S) | \s+ at i */
static int tok_space_run(const uint32_t *c, const uint8_t *f, int i, int b, int rn) {
    int k = i, last_rn = -1;
    for (; tok_fl_at(f, k, b) & TOK_U_WS; k++) if (c[k] == '\r' || c[k] == '\n') last_rn = k + 1;
    if (rn && last_rn > 0) return last_rn;
    if (k - i > 1 && k < b) return k - 1;        /* leave the last space to the next word */
    return k > i ? k : i + 1;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int tok_split_gpt2(const uint32_t *c, const uint8_t *f, int a, int b, int32_t *e, int n) {
    for (int i = a, j; i < b; i = j) {
        j = tok_contraction(c, i, b, 0);
        if (j == i) {
            int sp = c[i] == ' ', f2 = sp ? tok_fl_at(f, i + 1, b) : f[i];
            j = i + sp;
            if (f2 & TOK_U_L) while (tok_fl_at(f, j, b) & TOK_U_L) j++;
            else if (f2 & TOK_U_N) while (tok_fl_at(f, j, b) & TOK_U_N) j++;
            else if (tok_is_other(f2)) while (tok_is_other(tok_fl_at(f, j, b))) j++;
            else j = tok_space_run(c, f, i, b, 0);
        }
        e[n++] = j;
    }
    return n;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxd}| ?[^\s\p{L}\p{N}]+[\r\n]*|
   \s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3: maxd 3; Qwen2: maxd 1) */
static int tok_split_llama3(const uint32_t *c, const uint8_t *f, int a, int b, int maxd, int32_t *e,
                            int n) {
    for (int i = a, j; i < b; i = j) {
        j = tok_contraction(c, i, b, 1);
        if (j == i) {
            int f1 = tok_fl_at(f, i + 1, b), f2 = c[i] == ' ' ? f1 : f[i];
            if (!(c[i] == '\r' || c[i] == '\n' || (f[i] & TOK_U_N)) && ((f[i] | f1) & TOK_U_L)) {
                for (j = i + 1; tok_fl_at(f, j, b) & TOK_U_L; j++) {}
            } else if (f[i] & TOK_U_N) {
                for (j = i; j < b && (f[j] & TOK_U_N) && j - i < maxd; j++) {}
            } else if (!(f2 & (TOK_U_WS | TOK_U_L |
                               TOK_U_N))) { /* llama.cpp tests f[i], never 0, not f2 */
                for (j = i + (c[i] == ' '); tok_is_other(tok_fl_at(f, j, b)); j++) {}
                while (j < b && (c[j] == '\r' || c[j] == '\n')) j++;
            } else {
                j = tok_space_run(c, f, i, b, 1);
            }
        }
        e[n++] = j;
    }
    return n;
}

/* Single-class patterns (llama.cpp runs these through std::regex): each match is a word and so
   is each gap between matches. mode 0: every matching codepoint, 1: maximal runs, 3: exactly
   three in a row ([0-9][0-9][0-9]). */
static int tok_split_class(const uint32_t *c, int a, int b, int (*match)(uint32_t), int mode,
                           int32_t *e, int n) {
    int prev = a;
    for (int i = a; i < b;) {
        int j = i;
        if (mode == 3)
            j = i + 3 <= b && match(c[i]) && match(c[i + 1]) && match(c[i + 2]) ? i + 3 : i;
        else if (match(c[i])) for (j = i + 1; mode == 1 && j < b && match(c[j]); j++) {}
        if (j == i) { i++; continue; }
        if (i > prev) e[n++] = i;
        e[n++] = prev = i = j;
    }
    if (prev < b) e[n++] = b;
    return n;
}

static int tok_m_number(uint32_t c) { return (tok_ucat(c) & TOK_U_N) != 0; }
static int tok_m_digit(uint32_t c) { return c >= '0' && c <= '9'; }
/* [\p{P}\$\+<=>\^~\|] with llama.cpp's ASCII reading of \p{P} */
static int tok_m_punct(uint32_t c) {
    if (c < 128)
        return c > 32 && c < 127 && strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}~", (int)c) != NULL;
    return (tok_ucat(c) & (TOK_U_P | TOK_U_WS)) == TOK_U_P;
}
static int tok_m_punct_bt(uint32_t c) { return c == '`' || tok_m_punct(c); }

/* each pre-tokenizer is llama.cpp's list of regexes, applied one after the other */
enum { TOK_S_END, TOK_S_GPT2, TOK_S_LLAMA3, TOK_S_QWEN2, TOK_S_EACH_NUMBER, TOK_S_NUMBER_RUNS,
       TOK_S_PUNCT_RUNS, TOK_S_PUNCT_RUNS_BT, TOK_S_DIGIT3 };
static const uint8_t tok_stages[][5] = {
    [TOK_PRE_DEFAULT] = {TOK_S_PUNCT_RUNS, TOK_S_GPT2, TOK_S_NUMBER_RUNS, TOK_S_DIGIT3, TOK_S_END},
    [TOK_PRE_GPT2]    = {TOK_S_GPT2, TOK_S_END},
    [TOK_PRE_SMOLLM]  = {TOK_S_EACH_NUMBER, TOK_S_GPT2, TOK_S_END},
    [TOK_PRE_LLAMA3]  = {TOK_S_LLAMA3, TOK_S_END},
    [TOK_PRE_QWEN2]   = {TOK_S_QWEN2, TOK_S_END},
    [TOK_PRE_FALCON]  = {TOK_S_PUNCT_RUNS_BT, TOK_S_GPT2, TOK_S_DIGIT3, TOK_S_END},
};

/* words of a fragment of len codepoints: returns their count, their ends in st->ends */
static int tok_pretokenize(int pre, TokState *st, int len) {
    const uint32_t *c = st->cp;
    int32_t *e = st->ends, *o = st->tmp;
    int n = len > 0;
    e[0] = len;
    for (const uint8_t *s = tok_stages[pre]; *s != TOK_S_END; s++) {
        int m = 0;
        for (int k = 0, a = 0; k < n; a = e[k++]) {
            int b = e[k];
            switch (*s) {
            case TOK_S_GPT2:          m = tok_split_gpt2(c, st->fl, a, b, o, m); break;
            case TOK_S_LLAMA3:        m = tok_split_llama3(c, st->fl, a, b, 3, o, m); break;
            case TOK_S_QWEN2:         m = tok_split_llama3(c, st->fl, a, b, 1, o, m); break;
            case TOK_S_EACH_NUMBER:   m = tok_split_class(c, a, b, tok_m_number, 0, o, m); break;
            case TOK_S_NUMBER_RUNS:   m = tok_split_class(c, a, b, tok_m_number, 1, o, m); break;
            case TOK_S_PUNCT_RUNS:    m = tok_split_class(c, a, b, tok_m_punct, 1, o, m); break;
            case TOK_S_PUNCT_RUNS_BT: m = tok_split_class(c, a, b, tok_m_punct_bt, 1, o, m); break;
            case TOK_S_DIGIT3:        m = tok_split_class(c, a, b, tok_m_digit, 3, o, m); break;
            }
        }
        memcpy(e, o, m * sizeof *e);
        n = m;
    }
    return n;
}

/* ----------------------------------------------------------------------------
 * BPE: merges by rank over the raw bytes of one word */

static void tok_bpe_add_pair(const Tokenizer *t, TokState *st, int l, int r) {
    if (l < 0 || r < 0) return;
    int32_t lk = st->sym[l].key, rk = st->sym[r].key;
    uint32_t h = tok_pair_slot(t, lk, rk);
    if (t->pair[h] == 0) return;
    tok_heap_push(st, (TokPair){-(double)t->pair_rank[h], l, r, lk, rk, t->pair_merged[h], 0});
}

static void tok_bpe_word(const Tokenizer *t, TokState *st, const unsigned char *s, int n) {
    if (t->ignore_merges) {                      /* Llama 3: a whole word in the vocab wins */
        int32_t id = tok_key_find(t, (const char *)s, n);
        if (id >= 0 && id < t->n_vocab) { tok_emit(st, id); return; }
    }
    st->sym = tok_grow(st, st->sym, &st->scap, n, sizeof *st->sym);
    if (st->failed) return;
    TokSym *sym = st->sym;
    for (int i = 0; i < n; i++)
        sym[i] = (TokSym){t->byte_tok[s[i]], i, 1, i - 1, i + 1 < n ? i + 1 : -1};
    st->nh = 0;
    for (int i = 1; i < n; i++) tok_bpe_add_pair(t, st, i - 1, i);
    while (st->nh > 0) {
        TokPair p = tok_heap_pop(st);
        TokSym *l = &sym[p.left], *r = &sym[p.right];
        /* stale */
        if (l->len == 0 || r->len == 0 || l->key != p.lkey || r->key != p.rkey) continue;
        tok_sym_merge(sym, p.left, p.right);
        sym[p.left].key = p.merged;
        tok_bpe_add_pair(t, st, sym[p.left].prev, p.left);
        tok_bpe_add_pair(t, st, p.left, sym[p.left].next);
    }
    for (int i = 0; i != -1 && n > 0; i = sym[i].next) {
        if (sym[i].key < t->n_vocab) { tok_emit(st, sym[i].key); continue; }
        /* not a token: llama.cpp looks up each byte of the mapped text alone, which only
           finds the bytes that map to themselves ('!'..'~') */
        for (uint32_t k = sym[i].start; k < sym[i].start + sym[i].len; k++) {
            int32_t id =
                s[k] >= 0x21 && s[k] <= 0x7E ? tok_key_find(t, (const char *)s + k, 1) : -1;
            if (id >= 0 && id < t->n_vocab) tok_emit(st, id);
        }
    }
}

/* one raw fragment: codepoints (invalid UTF-8 -> U+FFFD, as llama.cpp), words, merges */
static void tok_bpe_fragment(const Tokenizer *t, TokState *st, const unsigned char *s, size_t n) {
    if (n + 1 > st->ncap) {
        size_t cap = n + 1 + n / 2;
        void *m = realloc(st->cpmem, cap * 17);
        if (!m) { st->failed = 1; return; }
        st->cpmem = m;
        st->ncap = cap;
        st->cp = m; st->boff = st->cp + cap; st->ends = (int32_t *)(st->boff + cap);
        st->tmp = st->ends + cap; st->fl = (uint8_t *)(st->tmp + cap);
    }
    st->buf = tok_grow(st, st->buf, &st->bcap, 3 * n + 4, 1);
    if (st->failed) return;
    size_t m = 0;
    int nc = 0;
    for (size_t i = 0; i < n; nc++) {
        uint32_t c;
        i += tok_utf8_decode(s + i, n - i, &c);
        st->cp[nc] = c;
        st->fl[nc] = tok_ucat(c);
        st->boff[nc] = m;
        m += tok_utf8_encode(c, st->buf + m);
    }
    st->boff[nc] = m;
    int nw = tok_pretokenize(t->pre, st, nc);
    for (int k = 0, a = 0; k < nw && !st->failed; a = st->ends[k++])
        tok_bpe_word(t, st, st->buf + st->boff[a], st->boff[st->ends[k]] - st->boff[a]);
}

/* ----------------------------------------------------------------------------
 * SentencePiece: merges by score over UTF-8 characters of the whole fragment */

static void tok_spm_add_pair(const Tokenizer *t, TokState *st, int l, int r) {
    if (l < 0 || r < 0) return;
    uint32_t size = st->sym[l].len + st->sym[r].len;
    int32_t id = tok_key_find(t, (const char *)st->buf + st->sym[l].start, size);
    if (id >= 0) tok_heap_push(st, (TokPair){t->score[id], l, r, 0, 0, id, size});
}

static void tok_spm_fragment(const Tokenizer *t, TokState *st, const unsigned char *s, size_t n) {
    static const uint8_t utf8_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    st->buf = tok_grow(st, st->buf, &st->bcap, 3 * n + 3, 1);
    st->sym = tok_grow(st, st->sym, &st->scap, 3 * n + 3, sizeof *st->sym);
    if (st->failed) return;
    unsigned char *buf = st->buf;
    TokSym *sym = st->sym;
    size_t m = 0;
    if (t->add_space_prefix && st->prev_special) { memcpy(buf, "\xE2\x96\x81", 3); m = 3; }
    for (size_t i = 0; i < n; i++) {                         /* " " -> U+2581 */
        if (s[i] == ' ') { memcpy(buf + m, "\xE2\x96\x81", 3); m += 3; }
        else buf[m++] = s[i];
    }
    int ns = 0;
    for (size_t off = 0, len; off < m; off += len, ns++) {
        len = utf8_len[buf[off] >> 4];
        if (len > m - off) len = m - off;
        sym[ns] = (TokSym){-1, off, len, ns - 1, off + len < m ? ns + 1 : -1};
    }
    st->nh = 0;
    for (int i = 1; i < ns; i++) tok_spm_add_pair(t, st, i - 1, i);
    while (st->nh > 0) {
        TokPair p = tok_heap_pop(st);
        if (sym[p.left].len == 0 || sym[p.right].len == 0 ||
            sym[p.left].len + sym[p.right].len != p.size)
            continue;
        tok_sym_merge(sym, p.left, p.right);
        tok_spm_add_pair(t, st, sym[p.left].prev, p.left);
        tok_spm_add_pair(t, st, p.left, sym[p.left].next);
    }
    for (int i = 0; i != -1 && ns > 0; i = sym[i].next) {
        int32_t id = tok_key_find(t, (const char *)buf + sym[i].start, sym[i].len);
        if (id >= 0) { tok_emit(st, id); continue; }
        for (uint32_t k = sym[i].start; k < sym[i].start + sym[i].len; k++)
            if (t->byte_tok[buf[k]] >= 0) tok_emit(st, t->byte_tok[buf[k]]);
    }
}

/* ----------------------------------------------------------------------------
 * Encoding: the special-token partition, then the fragments */

static size_t tok_find_bytes(const char *s, size_t n, size_t from, const char *pat, size_t m) {
    for (size_t i = from; m > 0 && i + m <= n; i++) {
        const char *q = memchr(s + i, pat[0], n - m + 1 - i);
        if (!q) break;
        i = q - s;
        if (memcmp(q, pat, m) == 0) return i;
    }
    return SIZE_MAX;
}

/* llama.cpp's tokenizer_st_partition: cut s at every occurrence of special token k (left to
   right), pass the pieces between to tokens k+1.., and tokenize what no special token claims.
   User-defined tokens are always matched, control and unknown ones only with parse_special.
   Recursion depth is at most the number of special tokens. */
static void tok_encode_part(const Tokenizer *t, TokState *st, const char *s, size_t n, int k,
                            int parse_special) {
    for (; k < t->n_special && !st->failed; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != TOK_USER_DEFINED) continue;
        const char *tok = t->text + t->text_off[id];
        size_t tl = tok_text_len(t, id), p = 0, m = tok_find_bytes(s, n, 0, tok, tl);
        if (m == SIZE_MAX) continue;
        for (; m != SIZE_MAX; m = tok_find_bytes(s, n, p, tok, tl)) {
            if (m > p) tok_encode_part(t, st, s + p, m - p, k + 1, parse_special);
            tok_emit(st, id);
            st->prev_special = 1;
            p = m + tl;
        }
        if (p < n) tok_encode_part(t, st, s + p, n - p, k + 1, parse_special);
        return;
    }
    if (t->kind == TOK_SPM) tok_spm_fragment(t, st, (const unsigned char *)s, n);
    else tok_bpe_fragment(t, st, (const unsigned char *)s, n);
    st->prev_special = 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *out, int max_out) {
    if (!t || !t->n_vocab || (!text && len) || max_out < 0 || (max_out && !out) ||
        len > (INT_MAX - 8) / 3)
        return -1;
    TokState st = {0};
    st.out = out;
    st.max_out = max_out;
    st.prev_special = 1;
    if (add_special && t->add_bos) tok_emit(&st, t->bos_id);
    if (len > 0) tok_encode_part(t, &st, text, len, 0, parse_special);
    if (add_special && t->add_eos) tok_emit(&st, t->eos_id);
    free(st.cpmem); free(st.buf); free(st.sym); free(st.heap);
    return st.failed ? -1 : st.n_out;
}

/* ----------------------------------------------------------------------------
 * Decoding one token */

/* append n bytes at *k, writing only below cap; the count saturates at INT_MAX */
static void tok_put_bytes(char *buf, int cap, int *k, const char *s, size_t n) {
    for (size_t i = 0; i < n && *k < INT_MAX; i++, (*k)++) if (*k < cap) buf[*k] = s[i];
}

static int tok_hex_val(char c) {
    return c >= '0' && c <= '9'                 ? c - '0'
           : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10
                                                : -1;
}

int tokenizer_decode_piece(const Tokenizer *t, int32_t id, int render_special, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab || cap < 0 || (cap > 0 && !buf)) return -1;
    const char *s = t->text + t->text_off[id];
    size_t n = tok_text_len(t, id);
    int ty = t->type[id], k = 0;
    if (ty == TOK_CONTROL || ty == TOK_UNKNOWN || ty == TOK_USER_DEFINED) {
        if (ty == TOK_USER_DEFINED || render_special) tok_put_bytes(buf, cap, &k, s, n);
    } else if (ty == TOK_NORMAL && t->kind == TOK_SPM) {          /* U+2581 -> ' ' */
        for (size_t i = 0; i < n; i++) {
            int esc = i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0;
            tok_put_bytes(buf, cap, &k, esc ? " " : s + i, 1);
            i += esc ? 2 : 0;
        }
    } else if (ty == TOK_NORMAL) {                                /* undo the GPT-2 byte map */
        for (size_t i = 0; i < n;) {
            uint32_t c;
            i += tok_utf8_decode((const unsigned char *)s + i, n - i, &c);
            int b = tok_gpt2_cpt_to_byte(c);
            char one = (char)b, tmp[16];
            unsigned char u[4];
            if (b >= 0) { tok_put_bytes(buf, cap, &k, &one, 1); continue; }
            tok_put_bytes(buf, cap, &k, "[UNK_BYTE_0x", 12); /* llama.cpp's marker, verbatim */
            for (int j = 0, nu = tok_utf8_encode(c, u); j < nu; j++) {
                snprintf(tmp, sizeof tmp, "%02x", u[j]);
                tok_put_bytes(buf, cap, &k, tmp, 2);
            }
            tok_put_bytes(buf, cap, &k, s, n);
            tok_put_bytes(buf, cap, &k, "]", 1);
        }
    } else if (ty == TOK_BYTE) {                                  /* <0xHH> */
        int hi = n > 3 ? tok_hex_val(s[3]) : -1, lo = n > 4 ? tok_hex_val(s[4]) : -1;
        char b = (char)(hi < 0 ? 0 : lo < 0 ? hi : hi * 16 + lo);
        tok_put_bytes(buf, cap, &k, &b, 1);
    }
    return k;
}

int tokenizer_find(const Tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (int i = 0; i < t->n_vocab; i++)
        if (t->text_off[i + 1] - t->text_off[i] == n && !memcmp(t->text + t->text_off[i], s, n))
            return i;
    return -1;
}

int tokenizer_is_eog(const Tokenizer *t, int32_t id) {
    static const char *eog[] = {"<|im_end|>",    "<|eot_id|>", "<|end_of_text|>",
                                "<|endoftext|>", "<|eom_id|>", "<|end|>",
                                "</s>"};
    if (id < 0 || id >= t->n_vocab) return 0;
    if (id == t->eos_id || id == t->eot_id) return 1;
    if (t->type[id] != TOK_CONTROL) return 0;
    uint32_t n = t->text_off[id + 1] - t->text_off[id];
    for (size_t k = 0; k < sizeof eog / sizeof *eog; k++)
        if (strlen(eog[k]) == n && !memcmp(t->text + t->text_off[id], eog[k], n)) return 1;
    return 0;
}


/* ----------------------------------------------------------------------------
 * Chat formats: what --chat wraps the prompt in. These are llama.cpp's built-in templates
 * (llama-chat.cpp), written for the one conversation ./ra holds: one user message, then the
 * assistant's turn opened (add_ass). A format is named ("mistral-v3"), or read off the Jinja
 * template a GGUF carries (tokenizer.chat_template) by the substrings llama.cpp looks for, in
 * its order, so that a template gets the format llama.cpp gives it; ra does not run Jinja. */

/* llama.cpp's format names; CHAT_NONE: the other formats its template rules (below) name */
static const struct {
    const char *name;
    int format;
} chat_names[] = {
    {"chatml", CHAT_CHATML}, {"llama3", CHAT_LLAMA3},
    {"llama2", CHAT_LLAMA2}, {"llama2-sys", CHAT_LLAMA2}, {"llama2-sys-bos", CHAT_LLAMA2_BOS},
    {"llama2-sys-strip", CHAT_LLAMA2_STRIP},   /* the same text without a system message */
    {"mistral-v1", CHAT_MISTRAL_V1}, {"mistral-v3", CHAT_MISTRAL_V3},
    {"mistral-v3-tekken", CHAT_MISTRAL_V3_TEKKEN}, {"mistral-v7", CHAT_MISTRAL_V7},
    {"mistral-v7-tekken", CHAT_MISTRAL_V7_TEKKEN},
    {"phi4", CHAT_NONE}, {"smolvlm", CHAT_NONE}, {"phi3", CHAT_NONE}, {"chatglm4", CHAT_NONE},
    {"exaone-moe", CHAT_NONE}, {"falcon3", CHAT_NONE}, {"glmedge", CHAT_NONE},
    {"zephyr", CHAT_NONE}, {"monarch", CHAT_NONE}, {"gemma", CHAT_GEMMA},
    {"orion", CHAT_NONE}, {"openchat", CHAT_NONE}, {"vicuna", CHAT_NONE},
    {"vicuna-orca", CHAT_NONE}, {"deepseek", CHAT_NONE}, {"command-r", CHAT_NONE},
};

static int chat_has(const char *t, const char *s) { return strstr(t, s) != NULL; }

/* llama.cpp's name for the format of template t, or NULL */
static const char *chat_template_name(const char *t) {
    if (chat_has(t, "<|im_start|>"))
        return chat_has(t, "<|im_sep|>")           ? "phi4"
               : chat_has(t, "<end_of_utterance>") ? "smolvlm"
                                                   : "chatml";
    if (strncmp(t, "mistral", 7) == 0 || chat_has(t, "[INST]")) {
        if (chat_has(t, "[SYSTEM_PROMPT]")) return "mistral-v7";
        if (chat_has(t, "' [INST] ' + system_message") ||
            chat_has(t, "[AVAILABLE_TOOLS]")) /* Mistral's own */
            return chat_has(t, " [INST]")      ? "mistral-v1"
                   : chat_has(t, "\"[INST]\"") ? "mistral-v3-tekken"
                                               : "mistral-v3";
        return chat_has(t, "content.strip()")       ? "llama2-sys-strip"
               : chat_has(t, "bos_token + '[INST]") ? "llama2-sys-bos"
               : chat_has(t, "<<SYS>>")             ? "llama2-sys"
                                                    : "llama2";
    }
    /* formats ra does not write, tested before Llama 3's as llama.cpp tests them, so that their
       templates are refused by name rather than taken for another */
    if (chat_has(t, "<|assistant|>") && chat_has(t, "<|end|>")) return "phi3";
    if (chat_has(t, "[gMASK]<sop>")) return "chatglm4";
    if (chat_has(t, "<|assistant|>") && chat_has(t, "<|user|>"))
        return chat_has(t, "<|tool_declare|>") ? "exaone-moe"
               : chat_has(t, "</s>")           ? "falcon3"
                                               : "glmedge";
    if (chat_has(t, "<|{{ item['role'] }}|>") && chat_has(t, "<|begin_of_image|>"))
        return "glmedge";
    if (chat_has(t, "<|user|>") && chat_has(t, "<|endoftext|>")) return "zephyr";
    if (chat_has(t, "bos_token + message['role']")) return "monarch";
    if (chat_has(t, "<start_of_turn>")) return "gemma";
    if (chat_has(t, "'\\n\\nAssistant: ' + eos_token")) return "orion";
    if (chat_has(t, "GPT4 Correct ")) return "openchat";
    if (chat_has(t, "USER: ") && chat_has(t, "ASSISTANT: "))
        return chat_has(t, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
    if (chat_has(t, "### Instruction:") && chat_has(t, "<|EOT|>")) return "deepseek";
    if (chat_has(t, "<|START_OF_TURN_TOKEN|>") && chat_has(t, "<|USER_TOKEN|>")) return "command-r";
    if (chat_has(t, "<|start_header_id|>") && chat_has(t, "<|end_header_id|>")) return "llama3";
    return NULL; /* llama.cpp knows more formats, tested after Llama 3's; ra writes none of them */
}

const char *chat_detect(const char *tmpl, int *format) {
    const char *name = NULL;
    *format = CHAT_NONE;
    for (size_t k = 0; k < sizeof chat_names / sizeof *chat_names && !name; k++)
        if (strcmp(tmpl, chat_names[k].name) == 0) name = chat_names[k].name;
    if (!name) name = chat_template_name(tmpl);
    for (size_t k = 0; name && k < sizeof chat_names / sizeof *chat_names; k++)
        if (strcmp(name, chat_names[k].name) == 0) *format = chat_names[k].format;
    return name;
}

static int chat_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
} /* isspace, C locale */

int chat_parts(int format, const char **pre, const char **post, const char **end) {
    *end = "</s>";   /* the llama2 and mistral formats' */
    switch (format) {
    case CHAT_CHATML:
        *pre = "<|im_start|>user\n", *post = "<|im_end|>\n<|im_start|>assistant\n";
        *end = "<|im_end|>\n";
        break;
    case CHAT_LLAMA3:
        *pre = "<|start_header_id|>user<|end_header_id|>\n\n";
        *post = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        *end = "<|eot_id|>";
        break;
    case CHAT_LLAMA2: case CHAT_LLAMA2_STRIP: *pre = "[INST] ", *post = " [/INST]"; break;
    case CHAT_LLAMA2_BOS: *pre = "[INST] ", *post = " [/INST]", *end = "</s><s>"; break;
    case CHAT_MISTRAL_V1: *pre = " [INST] ", *post = " [/INST]"; break;
    case CHAT_MISTRAL_V3: case CHAT_MISTRAL_V7: *pre = "[INST] ", *post = "[/INST]"; break;
    case CHAT_MISTRAL_V3_TEKKEN:
    case CHAT_MISTRAL_V7_TEKKEN:
        *pre = "[INST]", *post = "[/INST]";
        break;
    case CHAT_GEMMA:
        *pre = "<start_of_turn>user\n", *post = "<end_of_turn>\n<start_of_turn>model\n";
        *end = "<end_of_turn>\n";
        break;
    default: return -1;
    }
    return 0;
}

char *chat_apply(int format, const char *msg) {
    const char *pre, *post, *end;
    if (chat_parts(format, &pre, &post, &end)) return NULL;
    size_t n = strlen(msg);
    if (format == CHAT_LLAMA2_STRIP || format == CHAT_LLAMA3 ||
        format == CHAT_GEMMA) { /* without leading and trailing spaces */
        while (n > 0 && chat_space(msg[n - 1])) n--;
        while (n > 0 && chat_space(*msg)) msg++, n--;
    }
    size_t a = strlen(pre), b = strlen(post);
    char *out = malloc(a + n + b + 1);
    if (!out) return NULL;
    memcpy(out, pre, a), memcpy(out + a, msg, n), memcpy(out + a + n, post, b);
    out[a + n + b] = 0;
    return out;
}

/* ======================================================================== */
/* Thread pool: persistent workers that spin briefly, then sleep            */
/* ======================================================================== */

/* With more threads than cores a waiting worker yields its core and sleeps sooner. pool_for
 * splits [0, n) into a contiguous chunk per thread, so which thread computes an output never
 * changes it; pool_start gives the chunks to the workers alone and returns at once. */

struct Pool {
    int n;                      /* threads, the caller included */
    pthread_t *workers;         /* (n - 1) */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_int gen;             /* bumped once per job */
    atomic_int pending;         /* workers still running the current job */
    atomic_int stop;
    TaskFn fn;
    void *arg;
    int64_t total;
    int first;                  /* the first thread with a chunk: 0 (pool_for), 1 (pool_start) */
    int spins;                  /* polls of gen before a worker sleeps */
    int yield;                  /* 1: more threads than cores, a polling worker yields its core */
};

typedef struct { Pool *p; int id; } WorkerArg;

static void pool_run_chunk(Pool *p, int t) {
    int k = t - p->first, n = p->n - p->first;
    if (k < 0) return;
    int64_t i0 = p->total * k / n, i1 = p->total * (k + 1) / n;
    if (i1 > i0) p->fn(p->arg, i0, i1, t);
}

static void *pool_worker(void *arg) {
    WorkerArg *wa = arg;
    Pool *p = wa->p;
    int id = wa->id, seen = 0;
    free(wa);
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < p->spins) {
                if (p->yield) sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        pool_run_chunk(p, id);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

void thread_background(void) {
#ifdef SCHED_IDLE
    struct sched_param sp = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) == 0) return;
#endif
    setpriority(PRIO_PROCESS, 0, 19);   /* the lowest nice: this thread's own on Linux */
}

int cpu_count(void) {
#ifdef CPU_COUNT   /* glibc with _GNU_SOURCE; elsewhere every online CPU */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);   /* more than CPU_SETSIZE CPUs, or no affinity call */
    return n > 0 ? (int)n : 1;
}

Pool *build_pool(int nthreads) {
    Pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads < 1 ? 1 : nthreads;
    p->yield = p->n > cpu_count();
    p->spins = p->yield ? 100 : 20000;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)p->n, sizeof(pthread_t));
    if (!p->workers) p->n = 1;   /* the calling thread alone */
    for (int i = 1; i < p->n; i++) {
        WorkerArg *wa = malloc(sizeof *wa);
        if (wa) wa->p = p, wa->id = i;
        if (!wa || pthread_create(&p->workers[i - 1], NULL, pool_worker, wa) != 0) {
            free(wa);
            p->n = i;   /* run with the threads we got */
            break;
        }
    }
    return p;
}

void free_pool(Pool *p) {
    if (!p) return;
    pool_wait(p);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int pool_threads(const Pool *p) { return p ? p->n : 1; }

/* hands the job to the workers (and to the caller's chunk 0 when first is 0) */
static void pool_launch(Pool *p, int64_t n, TaskFn fn, void *arg, int first) {
    p->fn = fn;
    p->arg = arg;
    p->total = n;
    p->first = first;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

void pool_wait(Pool *p) {
    if (p)
        while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) sched_yield();
}

void pool_for(Pool *p, int64_t n, TaskFn fn, void *arg) {
    pool_wait(p);   /* a job pool_start began */
    if (!p || p->n == 1 || n == 1) {
        if (n > 0) fn(arg, 0, n, 0);
        return;
    }
    pool_launch(p, n, fn, arg, 0);
    pool_run_chunk(p, 0);
    pool_wait(p);
}

void pool_start(Pool *p, int64_t n, TaskFn fn, void *arg) {
    pool_wait(p);
    if (!p || p->n == 1) {
        if (n > 0) fn(arg, 0, n, 0);
        return;
    }
    pool_launch(p, n, fn, arg, 1);
}

/* A thread per contiguous slice of [0, n), started for this call (the index builds): fn(ctx, lo,
 * hi, tid). Each slice's result must not depend on the others, so the output is the same for
 * any nthreads (at most MAX_THREADS). */
typedef struct { RangeFn fn; void *ctx; int lo, hi, tid; } Job;

static void *job_main(void *arg) {
    Job *j = arg;
    j->fn(j->ctx, j->lo, j->hi, j->tid);
    return NULL;
}

void parallel_for(int n, int nthreads, RangeFn fn, void *ctx) {
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (nthreads > n) nthreads = n;
    if (nthreads < 1) nthreads = 1;
    pthread_t th[MAX_THREADS];
    Job job[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        job[t] = (Job){fn, ctx, (int)((int64_t)n * t / nthreads),
                       (int)((int64_t)n * (t + 1) / nthreads), t};
        started[t] = t > 0 && pthread_create(&th[t], NULL, job_main, &job[t]) == 0;
    }
    for (int t = 0; t < nthreads; t++)   /* slice 0, or one whose thread could not start */
        if (!started[t]) job_main(&job[t]);
    for (int t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* ======================================================================== */
/* Model loading: configuration from metadata, weights from tensors         */
/* ======================================================================== */

static int get_int_key(const GGUF *g, const char *arch, const char *suffix, int64_t *out,
                       int required, char *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int r = gguf_get_int(g, key, out);
    if (r < 0) return fail(err, "%s: metadata '%s' is not an integer", g->path, key);
    if (r == 0 && required) return fail(err, "%s: metadata '%s' is missing", g->path, key);
    if (r == 1 && (*out < 0 || *out > INT32_MAX))
        return fail(err, "%s: metadata '%s' = %lld is out of range", g->path, key, (long long)*out);
    return r;
}

static int get_float_key(const GGUF *g, const char *arch, const char *suffix, float *out,
                         char *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int r = gguf_get_float(g, key, out);
    if (r < 0) return fail(err, "%s: metadata '%s' is not a number", g->path, key);
    return r;
}

/* an optional number that must be finite and at least lo (above lo when !lo_ok); 0 also reads as
   absent where zero_unset (llama.cpp's "not set" for the RoPE scale factors) */
static int get_range_float_key(const GGUF *g, const char *arch, const char *suffix, float *out,
                               float lo, int lo_ok, int zero_unset, char *err) {
    float v;
    int r = get_float_key(g, arch, suffix, &v, err);
    if (r != 1) return r;
    if (zero_unset && v == 0) return 0;
    if (!isfinite(v) || v < lo || (v == lo && !lo_ok))
        return fail(err, "%s: metadata '%s.%s' = %g is out of range (a finite number %s %g)",
                    g->path, arch, suffix, v, lo_ok ? ">=" : ">", lo);
    *out = v;
    return 1;
}

/* an optional string: 0 absent, 1 read; -1 (err set) where it is another type or holds a NUL
   byte (the rest of it would be dropped unseen where it is compared or printed) */
static int get_str_meta(const GGUF *g, const char *key, Str *out, char *err) {
    int r = gguf_get_str(g, key, out);
    if (r < 0) return fail(err, "%s: metadata '%s' is not a string", g->path, key);
    if (r == 1 && memchr(out->s, 0, out->len))
        return fail(err, "%s: metadata '%s' holds a NUL byte", g->path, key);
    return r;
}

const char *arch_name(const Config *c) {
    return c->arch == ARCH_QWEN2 ? "qwen2" : c->arch == ARCH_GEMMA3 ? "gemma3" : "llama";
}

int layer_sliding(const Config *c, int l) {
    return c->swa_window > 0 && c->swa_pattern > 0 && l % c->swa_pattern < c->swa_pattern - 1;
}

int global_layers(const Config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += !layer_sliding(c, l);
    return n;
}

/* Gemma 3, as llama.cpp reads it: with a sliding window, five layers in six slide (every sixth
   is global), and the sliding layers rotate with base 10000, unscaled. Logit soft-capping
   (Gemma 2's) is not computed, so a file that asks for it is refused. */
static int load_gemma3_keys(const GGUF *g, const char *arch, Config *c, char *err) {
    int64_t v;
    int r = get_int_key(g, arch, "attention.sliding_window", &v, 0, err);
    if (r < 0) return -1;
    if (r == 1 && v > 1 << 24)
        return fail(err, "%s: metadata '%s.attention.sliding_window' = %lld is implausible",
                    g->path, arch, (long long)v);
    if (r == 1 && v > 0) c->swa_window = (int)v, c->swa_pattern = 6, c->rope_base_swa = 10000.0f;
    const char *caps[2] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        float cap = 0;
        if (get_range_float_key(g, arch, caps[i], &cap, 0, 0, 1, err) < 0) return -1;
        if (cap != 0)
            return fail(err, "%s: metadata '%s.%s' asks for logit soft-capping, which ra does "
                        "not compute", g->path, arch, caps[i]);
    }
    return 0;
}

static int load_config(Model *m, char *err) {
    const GGUF *g = &m->gguf;
    Config *c = &m->c;
    Str a;
    int r = gguf_get_str(g, "general.architecture", &a);
    if (r <= 0)
        return fail(err, "%s: metadata 'general.architecture' is missing or not a string", g->path);
    char arch[32];
    if (str_eq(a, "llama")) c->arch = ARCH_LLAMA;
    else if (str_eq(a, "qwen2")) c->arch = ARCH_QWEN2;
    else if (str_eq(a, "gemma3")) c->arch = ARCH_GEMMA3;
    else return fail(err, "%s: architecture '%.*s' is not supported (llama, qwen2 and gemma3 are)",
                     g->path, (int)(a.len > 40 ? 40 : a.len), a.s);
    snprintf(arch, sizeof arch, "%.*s", (int)a.len, a.s);

    int64_t v;
    if (get_int_key(g, arch, "block_count", &v, 1, err) < 0) return -1;
    c->n_layers = (int)v;
    if (get_int_key(g, arch, "embedding_length", &v, 1, err) < 0) return -1;
    c->dim = (int)v;
    if (get_int_key(g, arch, "feed_forward_length", &v, 1, err) < 0) return -1;
    c->ffn_dim = (int)v;
    if (get_int_key(g, arch, "attention.head_count", &v, 1, err) < 0) return -1;
    c->n_heads = (int)v;
    c->n_kv_heads = c->n_heads;
    r = get_int_key(g, arch, "attention.head_count_kv", &v, 0, err);
    if (r < 0) return -1;
    if (r == 1) c->n_kv_heads = (int)v;
    c->ctx_train = 4096;
    if ((r = get_int_key(g, arch, "context_length", &v, 0, err)) < 0) return -1;
    if (r == 1) c->ctx_train = (int)v;
    if (c->n_layers <= 0 || c->n_layers > 1024 || c->dim <= 0 || c->dim > 65536 ||
        c->n_heads <= 0 || c->n_heads > 1024 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads ||
        c->ffn_dim <= 0 || c->ffn_dim > 1 << 20 || c->ctx_train <= 0)
        return fail(err, "%s: implausible shape (layers %d, dim %d, heads %d/%d, ffn %d, ctx %d)",
                    g->path, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim,
                    c->ctx_train);
    c->head_dim = c->dim / c->n_heads;
    if ((r = get_int_key(g, arch, "attention.key_length", &v, 0, err)) < 0) return -1;
    if (r == 1) c->head_dim = (int)v;
    int64_t vl;
    if ((r = get_int_key(g, arch, "attention.value_length", &vl, 0, err)) < 0) return -1;
    if (r == 1 && vl != c->head_dim)
        return fail(err, "%s: value length %lld differs from key length %d (not supported)",
                    g->path, (long long)vl, c->head_dim);
    if (c->head_dim <= 0 || c->head_dim > HEAD_DIM_MAX || c->head_dim % 2)
        return fail(err, "%s: head size %d is not supported", g->path, c->head_dim);
    c->norm_eps = 1e-5f;
    if (get_range_float_key(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps, 0, 1, 0,
                            err) < 0)
        return -1;
    c->rope_base = 10000.0f;
    if (get_range_float_key(g, arch, "rope.freq_base", &c->rope_base, 0, 0, 0, err) < 0) return -1;
    c->rope_dim = c->head_dim;
    if ((r = get_int_key(g, arch, "rope.dimension_count", &v, 0, err)) < 0) return -1;
    if (r == 1) c->rope_dim = (int)v;
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return fail(err, "%s: rope dimension %d does not fit head size %d", g->path, c->rope_dim,
                    c->head_dim);
    if (c->arch == ARCH_LLAMA &&
        c->rope_dim != c->head_dim) /* as llama.cpp: llama rotates every dimension */
        return fail(
            err, "%s: rope dimension %d is not the head size %d (a llama model rotates all of it)",
            g->path, c->rope_dim, c->head_dim);
    c->rope_type = c->arch == ARCH_LLAMA ? ROPE_NORM : ROPE_NEOX;
    c->embd_scale = c->arch == ARCH_GEMMA3 ? sqrtf((float)c->dim) : 1.0f;
    /* gemma3's 27B (62 layers) scales scores by 1/sqrt(dim/heads), in integers, not
       1/sqrt(head_dim) (as llama.cpp): its queries are scaled so that the attention's
       1/sqrt(head_dim) gives that */
    c->q_scale = c->arch == ARCH_GEMMA3 && c->n_layers == 62
                     ? sqrtf((float)c->head_dim / (float)(c->dim / c->n_heads)) : 1.0f;
    if (c->arch == ARCH_GEMMA3 && load_gemma3_keys(g, arch, c, err)) return -1;
    /* RoPE scaling, read as llama.cpp reads it: the type is "linear" (positions / factor) unless
       the file names another ("none" and "linear" are supported); the factor is
       rope.scaling.factor, or where that key is absent the older rope.scale_linear (0: unset);
       a type of "none" scales nothing. Llama 3.1 gives divisors in the rope_freqs tensor
       instead. */
    c->rope_scale = 1.0f;
    char key[128];
    Str st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((r = get_str_meta(g, key, &st, err)) < 0) return -1;
    int linear = r == 0 || str_eq(st, "linear");
    if (!linear && !str_eq(st, "none"))
        return fail(err, "%s: rope scaling '%.*s' is not supported (none and linear are)", g->path,
                    (int)(st.len > 20 ? 20 : st.len), st.s);
    float factor = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    const char *factor_key = gguf_find(g, key) ? "rope.scaling.factor" : "rope.scale_linear";
    if (get_range_float_key(g, arch, factor_key, &factor, 0, 0, 1, err) < 0) return -1;
    if (linear && factor != 0) c->rope_scale = factor;
    return 0;
}

static const char *type_name(uint32_t type) {
    const TypeInfo *ti = type_info(type);
    return ti ? ti->name : "unknown";
}

/* the name of layer l's tensor `what` ("blk.<l>.<what>") in name (96 bytes) */
static const char *blk_name(char name[96], int l, const char *what) {
    snprintf(name, 96, "blk.%d.%s", l, what);
    return name;
}

/* find a tensor, check its type is supported and its shape is [cols, rows] */
static int load_mat(Model *m, Mat *w, const char *name, int64_t rows, int64_t cols, int optional,
                    char *err) {
    const GGUFTensor *t = gguf_tensor(&m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) return optional ? 0 : fail(err, "%s: tensor '%s' is missing", m->gguf.path, name);
    const TypeInfo *ti = type_info(t->type);
    if (!ti || !ti->supported)
        return fail(err, "%s: tensor '%s' has type %s, which ra does not support", m->gguf.path,
                    name, type_name(t->type));
    int64_t r = t->n_dims > 1 ? t->ne[1] : 1;
    if (t->ne[0] != cols || r != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        char shape[96];
        int k = snprintf(shape, sizeof shape, "%lld, %lld", (long long)t->ne[0], (long long)r);
        for (int d = 2; d < 4 && (t->ne[2] != 1 || t->ne[3] != 1) && k < (int)sizeof shape; d++)
            k += snprintf(shape + k, sizeof shape - k, ", %lld", (long long)t->ne[d]);
        return fail(err, "%s: tensor '%s' has shape [%s], expected [%lld, %lld]", m->gguf.path,
                    name, shape, (long long)cols, (long long)rows);
    }
    /* F32 rows are read as floats (dot_f32); the other types byte by byte. general.alignment
       keeps a tensor's data on its multiple, and where that is below 4 this can fail */
    if (t->type == GGML_F32 && (uintptr_t)t->data % sizeof(float))
        return fail(err,
                    "%s: tensor '%s': F32 data at byte %llu of the file is not 4-byte aligned "
                    "(general.alignment %u)",
                    m->gguf.path, name,
                    (unsigned long long)((const uint8_t *)t->data - m->gguf.map),
                    (unsigned)m->gguf.alignment);
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = type_row_bytes(t->type, cols);
    return 1;
}

/* a small vector (norm weight, bias) as owned floats */
static int load_vec(Model *m, float **out, const char *name, int64_t n, int optional, char *err) {
    Mat w;
    *out = NULL;
    int r = load_mat(m, &w, name, 1, n, optional, err);
    if (r <= 0) return r;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return fail(err, "out of memory");
    dequantize_row(w.type, w.data, *out, n);
    return 1;
}

/* N of a name "blk.N...." (its digits from byte 4, at most 8), with *end (unless NULL) the byte
   after them; -1 where the name does not start so */
static long blk_number(Str name, size_t *end) {
    if (name.len < 5 || memcmp(name.s, "blk.", 4) || name.s[4] < '0' || name.s[4] > '9') return -1;
    long blk = 0;
    size_t j = 4;
    for (; j < name.len && j < 12 && name.s[j] >= '0' && name.s[j] <= '9'; j++)
        blk = blk * 10 + (name.s[j] - '0');
    if (end) *end = j;
    return blk;
}

/* The tensors load_weights reads, by name: any other in the file is refused, as llama.cpp refuses
   a tensor left over (an attention output bias, say, would change every output if skipped). */
static int tensor_known(Str name, int n_layers, int arch) {
    static const char *const top[] = {"token_embd.weight", "output.weight", "output_norm.weight",
                                      "rope_freqs.weight"};
    static const char *const per_layer[] = {
        "attn_norm.weight",   "attn_q.weight",   "attn_k.weight", "attn_v.weight",
        "attn_output.weight", "attn_q.bias",     "attn_k.bias",   "attn_v.bias",
        "ffn_norm.weight",    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
    /* gemma3 (as llama.cpp's loader) has no rope_freqs and no q, k or v biases */
    int gemma = arch == ARCH_GEMMA3;
    if (gemma && str_eq(name, "rope_freqs.weight")) return 0;
    for (size_t i = 0; i < sizeof top / sizeof *top; i++) if (str_eq(name, top[i])) return 1;
    size_t j;
    long layer = blk_number(name, &j);
    if (layer < 0 || j >= name.len || name.s[j] != '.' || (name.s[4] == '0' && j > 5) ||
        layer >= n_layers)
        return 0;
    Str rest = {name.s + j + 1, name.len - j - 1};
    static const char *const gemma3[] = {"attn_q_norm.weight", "attn_k_norm.weight",
                                         "post_attention_norm.weight", "post_ffw_norm.weight"};
    for (size_t i = 0; i < sizeof per_layer / sizeof *per_layer; i++)
        if (str_eq(rest, per_layer[i]) && !(gemma && strstr(per_layer[i], ".bias"))) return 1;
    for (size_t i = 0; gemma && i < sizeof gemma3 / sizeof *gemma3; i++)
        if (str_eq(rest, gemma3[i])) return 1;
    return 0;
}

static int load_weights(Model *m, char *err) {
    Config *c = &m->c;
    char name[96];
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    const GGUFTensor *emb = gguf_tensor(&m->gguf, "token_embd.weight");
    if (!emb) return fail(err, "%s: tensor 'token_embd.weight' is missing", m->gguf.path);
    for (uint64_t i = 0; i < m->gguf.n_tensors;
         i++) { /* a block_count cut short leaves blocks unread */
        Str tn = m->gguf.tensors[i].name;
        if (blk_number(tn, NULL) >= c->n_layers)
            return fail(
                err, "%s: tensor '%.*s' is past the model's %d blocks (metadata '%s.block_count')",
                m->gguf.path, (int)(tn.len > 60 ? 60 : tn.len), tn.s, c->n_layers,
                arch_name(c));
    }
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        if (!tensor_known(m->gguf.tensors[i].name, c->n_layers, c->arch)) {
            Str tn = m->gguf.tensors[i].name;
            return fail(err,
                        "%s: tensor '%.*s' is not one ra reads for %s, and leaving it out would "
                        "compute another model",
                        m->gguf.path, (int)(tn.len > 60 ? 60 : tn.len), tn.s,
                        arch_name(c));
        }
    /* Qwen2 has Q, K and V biases; a Llama file may (llama.cpp) */
    int bias_optional = c->arch != ARCH_QWEN2;
    c->vocab_size = (int)(emb->n_dims > 1 ? emb->ne[1] : 1);
    if (load_mat(m, &m->tok_embd, "token_embd.weight", c->vocab_size, c->dim, 0, err) < 0)
        return -1;
    if (load_mat(m, &m->output, "output.weight", c->vocab_size, c->dim, 1, err) < 0) return -1;
    if (!m->output.data) m->output = m->tok_embd;   /* tied embedding */
    if (load_vec(m, &m->out_norm, "output_norm.weight", c->dim, 0, err) < 0) return -1;
    if (load_vec(m, &m->rope_freqs, "rope_freqs.weight", c->rope_dim / 2, 1, err) < 0) return -1;
    for (int i = 0; m->rope_freqs && i < c->rope_dim / 2; i++)   /* divisors of the frequencies */
        if (!isfinite(m->rope_freqs[i]) || m->rope_freqs[i] <= 0)
            return fail(err,
                        "%s: tensor 'rope_freqs.weight' [%d] = %g is not a positive finite number",
                        m->gguf.path, i, m->rope_freqs[i]);
    m->layers = calloc((size_t)c->n_layers, sizeof(Layer));
    if (!m->layers) return fail(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        Layer *L = &m->layers[l];
        int dim = c->dim, ffn = c->ffn_dim, hd = c->head_dim;
        if (load_vec(m, &L->attn_norm, blk_name(name, l, "attn_norm.weight"), dim, 0, err) < 0 ||
            load_mat(m, &L->wq, blk_name(name, l, "attn_q.weight"), qd, dim, 0, err) < 0 ||
            load_mat(m, &L->wk, blk_name(name, l, "attn_k.weight"), kvd, dim, 0, err) < 0 ||
            load_mat(m, &L->wv, blk_name(name, l, "attn_v.weight"), kvd, dim, 0, err) < 0 ||
            load_mat(m, &L->wo, blk_name(name, l, "attn_output.weight"), dim, qd, 0, err) < 0 ||
            load_vec(m, &L->bq, blk_name(name, l, "attn_q.bias"), qd, bias_optional, err) < 0 ||
            load_vec(m, &L->bk, blk_name(name, l, "attn_k.bias"), kvd, bias_optional, err) < 0 ||
            load_vec(m, &L->bv, blk_name(name, l, "attn_v.bias"), kvd, bias_optional, err) < 0 ||
            load_vec(m, &L->ffn_norm, blk_name(name, l, "ffn_norm.weight"), dim, 0, err) < 0 ||
            load_mat(m, &L->w_gate, blk_name(name, l, "ffn_gate.weight"), ffn, dim, 0, err) < 0 ||
            load_mat(m, &L->w_up, blk_name(name, l, "ffn_up.weight"), ffn, dim, 0, err) < 0 ||
            load_mat(m, &L->w_down, blk_name(name, l, "ffn_down.weight"), dim, ffn, 0, err) < 0)
            return -1;
        if (c->arch == ARCH_GEMMA3 &&   /* Gemma's extra norms (llama.cpp requires all four) */
            (load_vec(m, &L->q_norm, blk_name(name, l, "attn_q_norm.weight"), hd, 0, err) < 0 ||
             load_vec(m, &L->k_norm, blk_name(name, l, "attn_k_norm.weight"), hd, 0, err) < 0 ||
             load_vec(m, &L->post_attn_norm, blk_name(name, l, "post_attention_norm.weight"), dim,
                      0, err) < 0 ||
             load_vec(m, &L->post_ffn_norm, blk_name(name, l, "post_ffw_norm.weight"), dim, 0,
                      err) < 0))
            return -1;
    }
    m->rope_inv_freq = malloc((size_t)(c->rope_dim / 2) * sizeof(float));
    if (!m->rope_inv_freq) return fail(err, "out of memory");
    if (c->swa_window > 0) {
        m->rope_inv_freq_swa = malloc((size_t)(c->rope_dim / 2) * sizeof(float));
        if (!m->rope_inv_freq_swa) return fail(err, "out of memory");
    }
    model_set_rope_scale(m, c->rope_scale);
    return 0;
}

/* theta_i = pos * base^(-2i/rot) / freqs[i] / scale (RoFormer; Llama 3.1 divisors; linear
 * scaling). build_model sets the model's own scale; ./ra --rope-scale overrides it. */
void model_set_rope_scale(Model *m, float scale) {
    const Config *c = &m->c;
    m->c.rope_scale = scale;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double f = pow((double)c->rope_base, -2.0 * i / c->rope_dim) / scale;
        if (m->rope_freqs) f /= m->rope_freqs[i];
        m->rope_inv_freq[i] = (float)f;
        if (m->rope_inv_freq_swa)   /* the sliding layers: their own base, never scaled */
            m->rope_inv_freq_swa[i] = (float)pow((double)c->rope_base_swa, -2.0 * i / c->rope_dim);
    }
}

/* copy a numeric GGUF array into an owned, aligned array, checking type and length */
static int gguf_array_copy(const GGUF *g, const char *key, uint32_t want, uint64_t n, void **out,
                           char *err) {
    const GGUFKV *kv = gguf_find(g, key);
    *out = NULL;
    if (!kv) return 0;
    if (kv->type != GGUF_ARRAY || kv->elem_type != want)
        return fail(err, "%s: metadata '%s' must be an array of %s", g->path, key,
                    gguf_type_name[want]);
    if (kv->n != n)
        return fail(err, "%s: metadata '%s' has %llu entries, expected %llu", g->path, key,
                    (unsigned long long)kv->n, (unsigned long long)n);
    size_t bytes = (size_t)n * (size_t)gguf_scalar_size[want];
    *out = malloc(bytes ? bytes : 1);
    if (!*out) return fail(err, "out of memory");
    memcpy(*out, kv->data, bytes);
    return 1;
}

int build_tokenizer_from_gguf(Tokenizer *tok, const GGUF *g, char *err) {
    TokenizerSpec sp;
    memset(&sp, 0, sizeof sp);
    char model[32] = "", pre[64] = "";
    Str s;
    int r = get_str_meta(g, "tokenizer.ggml.model", &s, err);
    if (r < 0) return -1;
    if (r == 0) return fail(err, "%s: metadata 'tokenizer.ggml.model' is missing", g->path);
    snprintf(model, sizeof model, "%.*s", (int)(s.len > 31 ? 31 : s.len), s.s);
    if ((r = get_str_meta(g, "tokenizer.ggml.pre", &s, err)) < 0) return -1;
    if (r == 1) snprintf(pre, sizeof pre, "%.*s", (int)(s.len > 63 ? 63 : s.len), s.s);
    sp.model = model;
    sp.pre = pre[0] ? pre : NULL;
    const GGUFKV *toks = gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_ARRAY || toks->elem_type != GGUF_STRING || toks->n == 0 ||
        toks->n > (1u << 24))
        return fail(err, "%s: metadata 'tokenizer.ggml.tokens' is missing or not a string array",
                    g->path);
    sp.n_vocab = (int)toks->n;
    sp.tokens = toks->strs;
    void *scores = NULL, *types = NULL;
    if (gguf_array_copy(g, "tokenizer.ggml.scores", GGUF_F32, toks->n, &scores, err) < 0 ||
        gguf_array_copy(g, "tokenizer.ggml.token_type", GGUF_I32, toks->n, &types, err) < 0) {
        free(scores);
        return -1;
    }
    sp.scores = scores;
    sp.types = types;
    const GGUFKV *merges = gguf_find(g, "tokenizer.ggml.merges");
    if (merges) {
        if (merges->type != GGUF_ARRAY || merges->elem_type != GGUF_STRING ||
            merges->n > (1u << 24)) {
            free(scores), free(types);
            return fail(err, "%s: metadata 'tokenizer.ggml.merges' must be a string array",
                        g->path);
        }
        sp.n_merges = (int)merges->n;
        sp.merges = merges->strs;
    } else if (!strcmp(
                   model,
                   "gpt2")) { /* as llama.cpp: byte-level BPE without its merges is no tokenizer */
        free(scores), free(types);
        return fail(err,
                    "%s: metadata 'tokenizer.ggml.merges' is missing (a gpt2 tokenizer needs it)",
                    g->path);
    }
    const char *idk[5] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id",
                          "tokenizer.ggml.padding_token_id"};
    int *ids[5] = {&sp.bos_id, &sp.eos_id, &sp.eot_id, &sp.unk_id, &sp.pad_id};
    for (int i = 0; i < 5; i++) {
        int64_t v;
        *ids[i] = -1;
        int r = gguf_get_int(g, idk[i], &v);
        if (r < 0 || (r == 1 && (v < 0 || v >= sp.n_vocab))) {
            free(scores), free(types);
            return fail(err, "%s: metadata '%s' is not a token id", g->path, idk[i]);
        }
        if (r == 1) *ids[i] = (int)v;
    }
    const char *fk[3] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                         "tokenizer.ggml.add_space_prefix"};
    int *flags[3] = {&sp.add_bos, &sp.add_eos, &sp.add_space_prefix};
    for (int i = 0; i < 3; i++) {
        int b;
        *flags[i] = -1;
        int r = gguf_get_bool(g, fk[i], &b);
        if (r < 0) {
            free(scores), free(types);
            return fail(err, "%s: metadata '%s' is not a bool", g->path, fk[i]);
        }
        if (r == 1) *flags[i] = b;
    }
    char terr[ERR_LEN];
    r = build_tokenizer(tok, &sp, terr, sizeof terr);
    free(scores);
    free(types);
    if (r) return fail(err, "%s: %s", g->path, terr);   /* terr begins "tokenizer: " */
    return 0;
}

static int load_tokenizer(Model *m, char *err) {
    const GGUF *g = &m->gguf;
    if (build_tokenizer_from_gguf(&m->tok, g, err)) return -1;
    if (m->tok.n_vocab !=
        m->c.vocab_size) /* llama.cpp asks the same: every row a token, every token a row */
        return fail(err, "%s: the tokenizer has %d tokens but the embedding %d rows", g->path,
                    m->tok.n_vocab, m->c.vocab_size);
    return 0;
}

int build_model(Model *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (build_gguf(&m->gguf, path, err)) return -1;
    if (load_config(m, err) || load_weights(m, err) || load_tokenizer(m, err)) {
        free_model(m);
        return -1;
    }
    Str nm;
    const char *base = strrchr(path, '/');
    int r = get_str_meta(&m->gguf, "general.name", &nm, err);
    if (r < 0) {
        free_model(m);
        return -1;
    }
    if (r == 1)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(nm.len > 120 ? 120 : nm.len), nm.s);
    else
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    for (char *c = m->name; *c; c++)   /* it goes on one line of stderr and in JSON */
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return 0;
}

void free_model(Model *m) {
    if (m->layers)
        for (int l = 0; l < m->c.n_layers; l++) {
            Layer *L = &m->layers[l];
            free(L->attn_norm), free(L->ffn_norm), free(L->bq), free(L->bk), free(L->bv);
            free(L->q_norm), free(L->k_norm), free(L->post_attn_norm), free(L->post_ffn_norm);
        }
    free(m->layers);
    free(m->out_norm);
    free(m->rope_freqs);
    free(m->rope_inv_freq);
    free(m->rope_inv_freq_swa);
    if (m->tok.n_vocab) free_tokenizer(&m->tok);
    free_gguf(&m->gguf);
    memset(m, 0, sizeof *m);
}

/* ======================================================================== */
/* Neural-net blocks                                                        */
/* ======================================================================== */

/* RMSNorm: out = x / sqrt(mean(x^2) + eps) * w */
void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* RoPE (RoFormer): rotate pairs of each head by pos * theta_i. ROPE_NORM pairs (2i, 2i+1),
 * as in GGUF Llama files (the converter permutes Q and K); ROPE_NEOX pairs (i, i + rot/2). */
void rope_apply(float *vec, int n_heads, int head_dim, int rot_dim, int pos, const float *inv_freq,
                int rope_type) {
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        float theta = (float)pos * inv_freq[i];
        float cs = cosf(theta), sn = sinf(theta);
        for (int h = 0; h < n_heads; h++) {
            float *v = vec + (size_t)h * head_dim;
            int a = rope_type == ROPE_NEOX ? i : 2 * i;
            int b = rope_type == ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs - x1 * sn;
            v[b] = x0 * sn + x1 * cs;
        }
    }
}

/* softmax in place, shifted by the max for stability (the z - max of Eq. 4) */
void softmax(float *x, int n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* SwiGLU: out = silu(gate) * up, silu(x) = x / (1 + e^-x) */
void swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* GEGLU: out = gelu(gate) * up, gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the
 * tanh form ggml computes */
void geglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

/* The prefill kernel: 4 dequantized weight rows against MM_T (REG_BLOCK) token rows, in
 * GCC/Clang vector types. Every dot product, here and in dot8, sums the same 8 lanes in the same
 * order, then the tail by madd (named, so gcc fuses it alike): the same bits from any kernel. */
enum { MM_T = REG_BLOCK };   /* tokens per block of the prefill kernel */
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias)); /* any float address */

static v8f load8(const float *p) { return *(const v8f_u *)p; }

static float lanes_sum(v8f a) {
    float s = 0;
    for (int k = 0; k < 8; k++) s += a[k];
    return s;
}

float dot8(const float *w, const float *x, int n) {
    v8f acc = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8) acc += load8(w + j) * load8(x + j);
    float s = lanes_sum(acc);
    for (; j < n; j++) s = madd(w[j], x[j], s);
    return s;
}

/* dot8(q, r[t]) for 4 rows, the 4 sums interleaved so that their FMA latencies overlap */
void dot8_x4(const float *q, const float *const r[4], int n, float out[4]) {
    v8f acc[4] = {{0}};
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x = load8(q + j);
        for (int t = 0; t < 4; t++) acc[t] += x * load8(r[t] + j);
    }
    for (int t = 0; t < 4; t++) {
        float s = lanes_sum(acc[t]);
        for (int k = j; k < n; k++) s = madd(q[k], r[t][k], s);
        out[t] = s;
    }
}

/* out[r][t] = dot8(w[r,:], x[t,:]) for 4 rows of w and MM_T rows of x, each row n floats */
static void dot_4xT(const float *w, const float *x, int n, float out[4][MM_T]) {
    v8f acc[4][MM_T] = {{{0}}};
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f W[4], X[MM_T];
        for (int r = 0; r < 4; r++) W[r] = load8(w + (size_t)r * n + j);
        for (int t = 0; t < MM_T; t++) X[t] = load8(x + (size_t)t * n + j);
        for (int r = 0; r < 4; r++)
            for (int t = 0; t < MM_T; t++) acc[r][t] += W[r] * X[t];
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < MM_T; t++) {
            float s = lanes_sum(acc[r][t]);
            for (int k = j; k < n; k++) s = madd(w[(size_t)r * n + k], x[(size_t)t * n + k], s);
            out[r][t] = s;
        }
}

/* Y (n_tok, W rows), X (n_tok, W cols), wrow (threads, 4, W cols) dequantised weight rows */
typedef struct { float *Y; const float *X; const Mat *W; int n_tok; float *wrow; } MatmulTask;

/* rows [4*b0, 4*b1) of Y = X W^T; the pool splits blocks of 4 rows, so the grouping, and with
 * it every bit of the result, is the same for any thread count */
static void matmul_task(void *arg, int64_t b0, int64_t b1, int thread) {
    MatmulTask *t = arg;
    const Mat *W = t->W;
    int cols = (int)W->cols, nt = t->n_tok;
    int64_t rows = W->rows;
    float *w = t->wrow + (size_t)thread * 4 * (size_t)cols;
    for (int64_t r0 = b0 * 4; r0 < b1 * 4 && r0 < rows; r0 += 4) {
        int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
        for (int r = 0; r < nr; r++)
            dequantize_row(W->type, (const uint8_t *)W->data + (r0 + r) * W->row_bytes,
                           w + (size_t)r * cols, cols);
        int i = 0;
        if (nr == 4)
            for (; i + MM_T <= nt; i += MM_T) {
                float o[4][MM_T];
                dot_4xT(w, t->X + (size_t)i * cols, cols, o);
                for (int r = 0; r < 4; r++)
                    for (int k = 0; k < MM_T; k++) t->Y[(size_t)(i + k) * rows + r0 + r] = o[r][k];
            }
        for (; i < nt; i++)
            for (int r = 0; r < nr; r++)
                t->Y[(size_t)i * rows + r0 + r] =
                    dot8(w + (size_t)r * cols, t->X + (size_t)i * cols, cols);
    }
}

static void matvec_task(void *arg, int64_t r0, int64_t r1, int thread) {
    MatmulTask *t = arg;
    (void)thread;
    matvec_rows(t->W->type, t->W->data, t->W->cols, t->X, t->Y, r0, r1);   /* fused, memory bound */
}

void matmul(Pool *p, float *Y, const float *X, const Mat *W, int n_tok, float *wrow) {
    MatmulTask t = {Y, X, W, n_tok, wrow};
    if (n_tok == 1) pool_for(p, W->rows, matvec_task, &t);   /* decoding */
    else pool_for(p, (W->rows + 3) / 4, matmul_task, &t);
}

/* ======================================================================== */
/* The method's fast paths: each is tested against the plain function of   */
/* ra.c it speeds up (its oracle), as the matmuls are against dot8          */
/* ======================================================================== */

/* ---- a cache's rows: floats or halves (-ctk/-ctv) ---- */

Rows rows_f32(const float *data, size_t ld) {
    Rows r = {data, ld, 0};
    return r;
}

Rows rows_from(Rows r, size_t i) {
    r.data = (const char *)r.data + i * r.ld * (r.f16 ? sizeof(uint16_t) : sizeof(float));
    return r;
}

static const uint16_t *row_f16(Rows r, size_t i) { return (const uint16_t *)r.data + i * r.ld; }

/* 8 halves as floats (exact) */
static v8f load8h(const uint16_t *p) {
#ifdef __F16C__
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    v8f y;
    memcpy(&y, &x, sizeof y);
    return y;
#else
    v8f y;
    for (int k = 0; k < 8; k++) y[k] = fp16_to_fp32(p[k]);
    return y;
#endif
}

const float *row_f16_f32(Rows r, size_t i, int d, float *buf) {
    const uint16_t *h = row_f16(r, i);
    int j = 0;
    for (; j + 8 <= d; j += 8) {
        v8f x = load8h(h + j);
        memcpy(buf + j, &x, sizeof x);
    }
    for (; j < d; j++) buf[j] = fp16_to_fp32(h[j]);
    return buf;
}

/* dot8(q, h) of a row of halves: dot8's bits on the row converted to floats */
static float dot8h(const float *q, const uint16_t *h, int n) {
    v8f acc = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8) acc += load8(q + j) * load8h(h + j);
    float s = lanes_sum(acc);
    for (; j < n; j++) s = madd(q[j], fp16_to_fp32(h[j]), s);
    return s;
}

/* dot8_x4 on 4 rows of halves, in its order: dot8's bits on the rows as floats */
static void dot8h_x4(const float *q, const uint16_t *const r[4], int n, float out[4]) {
    v8f acc[4] = {{0}};
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x = load8(q + j);
        for (int t = 0; t < 4; t++) acc[t] += x * load8h(r[t] + j);
    }
    for (int t = 0; t < 4; t++) {
        float s = lanes_sum(acc[t]);
        for (int k = j; k < n; k++) s = madd(q[k], fp16_to_fp32(r[t][k]), s);
        out[t] = s;
    }
}

float dot_row_f16(const float *q, Rows K, size_t i, int d) { return dot8h(q, row_f16(K, i), d); }

/* A cache hint: rows ids[0..n) of r (d wide) requested now; no result changes. */
void prefetch_rows(Rows r, const int32_t *ids, int n, int d) {
    size_t es = r.f16 ? sizeof(uint16_t) : sizeof(float);
    for (int j = 0; j < n; j++)
        for (size_t b = 0; b < d * es; b += 64)
            __builtin_prefetch((const char *)r.data + (size_t)ids[j] * r.ld * es + b);
}

void attn_partial_ids(const float *q, Rows K, Rows V, const int32_t *ids, int n, int d,
                      float scale, float *o, float *zmax, float *sumexp) {
    prefetch_rows(V, ids, n, d);
    attn_partial(q, K, V, ids, n, d, scale, o, zmax, sumexp);
}

/* out[j] = q . row j of K, row rows[j] (rows NULL: j), by dot8: the index's scores. Rows named
 * by id lie anywhere (a search's neighbours, cold in the cache): all are requested before the
 * first product. */
void dot_rows(const float *q, Rows K, const int32_t *rows, int n, int d, float *out) {
    size_t es = K.f16 ? sizeof(uint16_t) : sizeof(float);
    const char *base = K.data;
    if (rows) prefetch_rows(K, rows, n, d);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const void *r[4];
        for (int t = 0; t < 4; t++) r[t] = base + (size_t)(rows ? rows[j + t] : j + t) * K.ld * es;
        if (K.f16) dot8h_x4(q, (const uint16_t *const *)r, d, out + j);
        else dot8_x4(q, (const float *const *)r, d, out + j);
    }
    for (; j < n; j++) out[j] = dot_row(q, K, (size_t)(rows ? rows[j] : j), d);
}

/* the k best of h[0..n) by hit_better into h[0..k), in no order: Hoare's selection with the
 * middle pivot (the order is total: ids differ) */
static void hits_select(Hit *h, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        Hit p = h[lo + (hi - lo) / 2], t;
        int i = lo, j = hi;
        while (i <= j) {
            while (hit_better(h[i], p)) i++;
            while (hit_better(p, h[j])) j--;
            if (i <= j) t = h[i], h[i++] = h[j], h[j--] = t;
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* flat_scan_group: GROUP_CHUNK heads at a time, a tile of keys at a time, converted from halves
 * once for those heads, then scored against each head's query by dot_rows (dot_row's bits). A
 * head's candidates gather in its 2 cap slots; when these fill, the cap best stay (hits_select)
 * and from then on a key enters only past the worst of them: the ids ascend, so a tie never
 * does. Until then any number enters (NaN never). */
void flat_scan_group(const float *q, int g, Rows K, int lo, int hi, int d, int cap, Hit *hits,
                     size_t ldh, int *n, size_t ldn) {
    enum { TILE_FLOATS = 4096, GROUP_CHUNK = 16 };
    float tile[TILE_FLOATS], sc[TILE_FLOATS];   /* (T, d) a tile's keys as floats; (T) scores */
    float bar[GROUP_CHUNK];                     /* each head's worst kept, once its slots filled */
    int T = d > 0 && d < TILE_FLOATS ? TILE_FLOATS / d : 1, full[GROUP_CHUNK];
    for (int i = 0; i < g; i++) n[i * ldn] = 0;
    for (int i0 = 0; i0 < g && cap > 0; i0 += GROUP_CHUNK) {
        int gc = g - i0 < GROUP_CHUNK ? g - i0 : GROUP_CHUNK;
        for (int i = 0; i < gc; i++) full[i] = 0, bar[i] = 0;
        for (int j0 = lo; j0 < hi; j0 += T) {
            int nb = hi - j0 < T ? hi - j0 : T;
            Rows R = rows_from(K, (size_t)j0);
            if (K.f16) {
                for (int j = 0; j < nb; j++)
                    row_f16_f32(K, (size_t)j0 + j, d, tile + (size_t)j * d);
                R = rows_f32(tile, (size_t)d);
            }
            for (int i = 0; i < gc; i++) {
                Hit *h = hits + (i0 + i) * ldh;
                int m = n[(i0 + i) * ldn];   /* a register: other runs' counts share its line */
                dot_rows(q + (size_t)(i0 + i) * d, R, NULL, nb, d, sc);
                for (int j = 0; j < nb; j++) {
                    if (full[i] ? !(sc[j] > bar[i]) : sc[j] != sc[j]) continue;
                    h[m++] = (Hit){sc[j], j0 + j};
                    if (m < 2 * cap) continue;
                    hits_select(h, m, cap);   /* the cap best stay; the worst of them: the bar */
                    m = cap, full[i] = 1, bar[i] = h[0].s;
                    for (int t = 1; t < cap; t++) bar[i] = h[t].s < bar[i] ? h[t].s : bar[i];
                }
                n[(i0 + i) * ldn] = m;
            }
        }
    }
    for (int i = 0; i < g; i++)   /* the cap best of what is left */
        if (n[i * ldn] > cap) hits_select(hits + i * ldh, n[i * ldn], cap), n[i * ldn] = cap;
}

/* A cache hint for a graph step (link_node): the out-lists and degrees of nodes[0..n) of ix are
 * requested now, to arrive while other work runs. It changes no result; the empty asm is its
 * side effect, without which a compiler that sees the caller drops the call. */
void prefetch_lists(const RAIndex *ix, const int32_t *nodes, int n) {
    for (int t = 0; t < n; t++) {
        __builtin_prefetch(&ix->deg[nodes[t]]);
        const int32_t *list = ix->adj + (size_t)nodes[t] * ix->M;
        for (int b = 0; b < ix->M; b += 16) __builtin_prefetch(list + b);
    }
    __asm__ volatile("" ::: "memory");
}

/* The same for the in-degrees of the out-neighbours of nodes[0..n) (their lists in the cache by
 * now): link_node's hand-offs read them. */
void prefetch_indeg(const RAIndex *ix, const int32_t *nodes, int n) {
    for (int t = 0; t < n; t++) {
        const int32_t *list = ix->adj + (size_t)nodes[t] * ix->M;
        for (int j = 0; j < ix->deg[nodes[t]]; j++) __builtin_prefetch(&ix->indeg[list[j]]);
    }
    __asm__ volatile("" ::: "memory");
}

/* ---- knn_topk_blocked: ra.c's knn_topk (§3.2 a) by blocks ------------------------------- */

/* A tile of KNN_QB queries x KNN_W keys is scored with vertical FMAs on KNN_W-float vectors, the
 * tile's keys transposed (a lane a key). Each q.k is summed in dot8's order, so for d % 8 == 0
 * its scores are dot8's bits. Tile row r < 8m (m = d/8) holds dim 8 (r mod m) + r / m. */
#if defined(__AVX512F__)
enum { KNN_W = 16 };
#else
enum { KNN_W = 8 };
#endif
/* 8 queries a tile: their accumulators, the key vector and a broadcast query fit in AVX2's 16
 * registers, and each key vector loaded serves 8 FMAs */
enum { KNN_QB = 8 };
enum { KNN_SAMPLE = 16 }; /* knn_block_range's estimate samples a key in every KNN_SAMPLE */
typedef float KnnV __attribute__((vector_size(KNN_W * sizeof(float))));
typedef int32_t KnnI __attribute__((vector_size(KNN_W * sizeof(int32_t))));

static int knn_dim(int r, int d) { /* the dim a tile row holds (see above) */
    int m = d / 8;
    return r < 8 * m ? (r % m) * 8 + r / m : r;
}

/* s[q] = the scores of the queries qp[q*d ..] (rows as knn_dim) against the KNN_W keys of the
   tile kt (d rows of KNN_W floats, rows as knn_dim). */
static inline void knn_tile(const float *qp, const float *kt, int d, KnnV s[KNN_QB]) {
    int m = d / 8, r = 0;
    for (int q = 0; q < KNN_QB; q++) s[q] = (KnnV){0};
    for (int k = 0; k < 8 && m > 0; k++) {        /* dot8's lane k */
        KnnV acc[KNN_QB] = {{0}};
        for (int e = r + m; r < e; r++) {
            KnnV kv;
            memcpy(&kv, kt + (size_t)r * KNN_W, sizeof kv);
            for (int q = 0; q < KNN_QB; q++) acc[q] += qp[q * d + r] * kv;
        }
        for (int q = 0; q < KNN_QB; q++) s[q] += acc[q]; /* lanes_sum, in lane order */
    }
    for (; r < d; r++) {                          /* dot8's tail */
        KnnV kv;
        memcpy(&kv, kt + (size_t)r * KNN_W, sizeof kv);
        for (int q = 0; q < KNN_QB; q++) s[q] += qp[q * d + r] * kv;
    }
}

#if defined(__AVX512F__) /* one compare into a bit mask; the loop below is the portable form */
#include <immintrin.h>
static unsigned knn_mask(KnnV s, float t) { /* bit j: key j of the tile scores >= t */
    return _mm512_cmp_ps_mask((__m512)s, _mm512_set1_ps(t), _CMP_GE_OQ);
}
#elif defined(__AVX__)
#include <immintrin.h>
static unsigned knn_mask(KnnV s, float t) {
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps((__m256)s, _mm256_set1_ps(t), _CMP_GE_OQ));
}
#else
static unsigned knn_mask(KnnV s, float t) {
    KnnI m = s >= t;
    unsigned b = 0;
    for (int j = 0; j < KNN_W; j++) b |= (unsigned)(m[j] & 1) << j;
    return b;
}
#endif

/* A candidate's score as an unsigned integer in the same order (-0 taken as +0, which ==
   treats as equal); the score is not NaN (knn_mask never passes a NaN) */
static inline uint32_t knn_ord(float s) {
    uint32_t u;
    s += 0.0f; /* -0 -> +0 */
    memcpy(&u, &s, sizeof u);
    return u ^ (u >> 31 ? 0xffffffffu : 0x80000000u);
}

static float knn_ord_score(uint32_t u) {
    float s;
    u ^= u >> 31 ? 0x80000000u : 0xffffffffu;
    memcpy(&s, &u, sizeof s);
    return s;
}

/* knn_topk's order (hit_better) as one integer: the score's order above the id's complement */
static uint64_t knn_key(uint32_t ord, int32_t id) {
    return (uint64_t)ord << 32 | (uint32_t)~(uint32_t)id;
}

/* rank[i] = how many of the n scores s beat s[i], 4 KNN_W of the i at a time. 1 when none ties
   or is NaN, as the counts' sum tells (a pair adds 1 just when ordered): rank is then each one's
   place in a sort, best first. The fast path of sort_cands, flat_topk_few and knn_rank; O(n^2). */
int rank_distinct(const float *s, int n, int32_t *rank) {
    int64_t sum = 0;
    for (int i0 = 0; i0 < n; i0 += 4 * KNN_W) {
        int nv = n - i0 < 4 * KNN_W ? n - i0 : 4 * KNN_W;
        KnnV v[4] = {{0}};
        KnnI c[4] = {{0}};
        memcpy(v, s + i0, (size_t)nv * sizeof *s);
        for (int j = 0; j < n; j++) {
#if defined(__AVX512F__) /* a masked add: no vector made from each mask */
            __m512 b = _mm512_set1_ps(s[j]);
            for (int g = 0; g < 4; g++)
                c[g] = (KnnI)_mm512_mask_add_epi32((__m512i)c[g],
                                                   _mm512_cmp_ps_mask(b, (__m512)v[g], _CMP_GT_OQ),
                                                   (__m512i)c[g], _mm512_set1_epi32(1));
#else
            KnnV b = (KnnV){0} + s[j];
            for (int g = 0; g < 4; g++) c[g] -= (KnnI)(b > v[g]); /* true is -1 */
#endif
        }
        for (int l = 0; l < nv; l++) rank[i0 + l] = c[l / KNN_W][l % KNN_W], sum += rank[i0 + l];
    }
    return sum == (int64_t)n * (n - 1) / 2 && (n != 1 || s[0] == s[0]); /* no pair at n = 1 */
}

/* 1 if ra_insert_ahead has worked out key u's candidates */
static int ahead_has(const RAIndex *ix, int u) {
    return u >= ix->ahead0 && u < ix->ahead0 + ix->n_ahead;
}

/* guide_candidates (ra.c) for keys u0 .. u0 + nk - 1 (nk <= GUIDE_AHEAD) in one pass over the
 * guides, each scored against all nk keys at once (dot_rows: dot8's bits), into ix->ahead */
static void guides_ahead(RAIndex *ix, Rows K, int d, int u0, int nk) {
    Hit best[GUIDE_AHEAD][GUIDE_USE];   /* per key: a heap of the best guides */
    int nb[GUIDE_AHEAD] = {0};
    float kf[GUIDE_AHEAD * HEAD_DIM_MAX], qk[GUIDE_AHEAD];   /* the keys as floats; a guide's q.k */
    if (!ix->ahead) {
        ix->ahead = xmalloc((size_t)GUIDE_AHEAD * GUIDE_USE * GUIDE_TOP * sizeof *ix->ahead);
        ix->ahead_nc = xmalloc((size_t)GUIDE_AHEAD * sizeof *ix->ahead_nc);
    }
    for (int b = 0; b < nk; b++) {
        const float *k = row_f32(K, u0 + b, d, kf + (size_t)b * d);
        if (k != kf + (size_t)b * d) memcpy(kf + (size_t)b * d, k, (size_t)d * sizeof *kf);
    }
    for (int g = 0; g < ix->n_guide; g++) {
        dot_rows(ix->guide + (size_t)g * d, rows_f32(kf, d), NULL, nk, d, qk);
        for (int b = 0; b < nk; b++)
            heap_offer(best[b], &nb[b], GUIDE_USE, (Hit){qk[b] - ix->guide_thr[g], g});
    }
    for (int b = 0; b < nk; b++)
        ix->ahead_nc[b] =
            guide_keys(ix, best[b], nb[b], ix->ahead + (size_t)b * GUIDE_USE * GUIDE_TOP);
    ix->ahead0 = u0, ix->n_ahead = nk;
}

/* ra_insert's fast twin: the guide step of the next keys ix->n .. (up to GUIDE_AHEAD of the n_keys
 * rows K holds) at once, the guides read once for all of them; then ra_insert_linked. The same
 * graph as ra_insert's (tests/test_index.c). */
int ra_insert_ahead(RAIndex *ix, Rows K, int d, int n_keys, SearchScratch *s) {
    int u = ix->n, nk = n_keys - u < GUIDE_AHEAD ? n_keys - u : GUIDE_AHEAD;
    if (!ahead_has(ix, u) && ix->n_guide > 0 && nk >= 2) guides_ahead(ix, K, d, u, nk);
    if (!ahead_has(ix, u)) return ra_insert(ix, K, d, s);
    return ra_insert_linked(ix, K, d, ix->ahead + (size_t)(u - ix->ahead0) * GUIDE_USE * GUIDE_TOP,
                            ix->ahead_nc[u - ix->ahead0], s);
}

int flat_topk_few(const float *q, Rows K, const int32_t *ids, int n, int d, int topk,
                  int32_t *ids_out, int *n_scored) {
    float s[RANK_MAX];
    int32_t rank[RANK_MAX], top[RANK_MAX];
    if (n > RANK_MAX) return flat_topk(q, K, ids, n, d, topk, ids_out, n_scored);
    dot_rows(q, K, ids, n, d, s);
    if (!rank_distinct(s, n, rank)) return flat_topk(q, K, ids, n, d, topk, ids_out, n_scored);
    int r = n < topk ? n : topk > 0 ? topk : 0;
    for (int j = 0; j < n; j++)
        if (rank[j] < r) top[rank[j]] = ids ? ids[j] : j;
    memcpy(ids_out, top, (size_t)r * sizeof *top);   /* ids_out may be ids */
    if (n_scored) *n_scored = n;
    return r;
}

/* c (n) best first by cand_better (ra.c); tmp, s, rank (n) scratch. Few and with no two scores
 * tied, each goes to its rank (rank_distinct); else a merge sort, bottom up (qsort calls through a
 * pointer for each comparison). The fast path of a sort by cand_better, its oracle in the tests. */
void sort_cands(Cand *c, int n, Cand *tmp, float *s, int32_t *rank) {
    for (int i = 0; i < n; i++) s[i] = c[i].s;
    if (n <= RANK_MAX && rank_distinct(s, n, rank)) {
        for (int i = 0; i < n; i++) tmp[rank[i]] = c[i];
        memcpy(c, tmp, (size_t)n * sizeof *c);
        return;
    }
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {   /* branch-free: the comparison is a coin toss */
                int b = cand_better(c[j], c[i]);
                tmp[k++] = b ? c[j] : c[i];
                j += b, i += !b;
            }
            while (i < mid) tmp[k++] = c[i++];
            while (j < hi) tmp[k++] = c[j++];
        }
        memcpy(c, tmp, (size_t)n * sizeof *c);
    }
}

typedef struct {
    const float *Q, *K; /* (nq, ldq), (nk, ld): d of each row used */
    float *kt, *ks; /* (tiles, d, KNN_W) the keys, and every KNN_SAMPLE-th, transposed by tile */
    size_t ldq;     /* query stride (with --q-stride it can exceed INT_MAX) */
    int nk, ns, ld, d, Nq, rank; /* ns = sampled keys; rank: see knn_block_range (0: none) */
    int32_t *out;   /* (nq, Nq) */
    float *col_s;   /* (nthreads, nt * KNN_W) or NULL: per thread, each key's best score so far */
    int32_t *col_q; /* (nthreads, nt * KNN_W) ... and the query that gave it */
    uint16_t *kb, *kbs; /* (tiles, nc, 2, 16, 32) kt and ks in bf16 hi, lo for AMX, or NULL */
    void *kb_mem;       /* kb's allocation (kb: its first 64-byte boundary) */
    int nc;             /* 32-dim chunks of a key (AMX): ceil(d / 32) */
} KnnBlockJob;

/* The estimate's j-th sampled key: one of keys [16j, 16j + 16) (of nk), picked by a hash of j so
   that text repeating with a period of 16 tokens cannot bias the sample */
static int knn_sample_key(int j, int nk) {
    int b = j * KNN_SAMPLE, n = nk - b < KNN_SAMPLE ? nk - b : KNN_SAMPLE;
    return b + (int)(((uint32_t)j * 2654435761u >> 16) % (uint32_t)n);
}

static void knn_transpose(void *arg, int lo, int hi,
                          int tid) { /* tiles [lo, hi) of kt, then of ks */
    (void)tid;
    const KnnBlockJob *J = arg;
    int d = J->d, nt = (J->nk + KNN_W - 1) / KNN_W;
    for (int t = lo; t < hi; t++) {
        int sample = t >= nt, t0 = sample ? t - nt : t, n = sample ? J->ns : J->nk;
        float *kt = (sample ? J->ks : J->kt) + (size_t)t0 * d * KNN_W;
        for (int j = 0, i = t0 * KNN_W; j < KNN_W; j++, i++) {
            int key = sample && i < n ? knn_sample_key(i, J->nk) : i;
            const float *k = J->K + (size_t)key * J->ld;
            for (int r = 0; r < d; r++) /* zero padding after the last key */
                kt[(size_t)r * KNN_W + j] = i < n ? k[knn_dim(r, d)] : 0.0f;
        }
    }
}

/* Each key's best query so far (cs, cq: one tile's KNN_W keys) meets the scores s of queries
   id0.. (n of them): a higher score wins, a tie keeps the earlier (lower) query, NaN never wins */
static void knn_col_best(const KnnV *s, int n, int32_t id0, float *cs, int32_t *cq) {
    KnnV best;
    KnnI arg;
    memcpy(&best, cs, sizeof best);
    memcpy(&arg, cq, sizeof arg);
    for (int q = 0; q < n; q++) {
        KnnI gt = s[q] > best;
        best = (KnnV)(((KnnI)s[q] & gt) | ((KnnI)best & ~gt));
        arg = (((KnnI){0} + (id0 + q)) & gt) | (arg & ~gt);
    }
    memcpy(cs, &best, sizeof best);
    memcpy(cq, &arg, sizeof arg);
}

/* queries per chunk: their candidates stay in cache while the keys pass by */
enum { KNN_QC = 8 * KNN_QB };
_Static_assert(KNN_QC <= 64, "knn_pass's `on` holds one bit per query of a chunk");

/* Each query's candidates, unordered: the keys whose score reached its threshold so far */
typedef struct {
    uint32_t *ord; /* (KNN_QC, len) scores, as knn_ord */
    int32_t *id;   /* (KNN_QC, len) key ids */
    uint64_t *key; /* (len) scratch: one query's candidates as knn_key */
    int32_t *rank; /* (len) scratch: their ranks */
    float *score;  /* (len) scratch: their scores */
    int len;       /* knn_cands_len: 4 Nq, and room for a tile's more */
    int n[KNN_QC]; /* (KNN_QC) candidates held */
} KnnCands;

static int knn_cands_len(int Nq) { return 4 * Nq + KNN_W; } /* few settles before the last */

/* The scores s (16 keys: ids id0, id0 + 1, ..) whose bit in m is set, appended to ord and id
   (room for 16 more); returns how many */
static int knn_append(KnnV s, unsigned m, int32_t id0, uint32_t *ord, int32_t *id) {
#if defined(__AVX512F__)
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i u = _mm512_castps_si512(_mm512_add_ps((__m512)s, _mm512_setzero_ps()));
    u = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31),
                                            _mm512_set1_epi32((int)0x80000000u))); /* knn_ord */
    __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(id0), iota);
    _mm512_storeu_si512(ord, _mm512_maskz_compress_epi32((__mmask16)m, u));
    _mm512_storeu_si512(id, _mm512_maskz_compress_epi32((__mmask16)m, ids));
    return __builtin_popcount(m);
#else
    int n = 0;
    for (; m; m &= m - 1) {
        int j = __builtin_ctz(m);
        ord[n] = knn_ord(s[j]), id[n++] = id0 + j;
    }
    return n;
#endif
}

/* how many of the n candidates score at least t (in knn_ord's order) */
static int knn_count_ge(const uint32_t *ord, int n, uint32_t t) {
    int c = 0, i = 0;
#if defined(__AVX512F__) /* a count per lane: no chain of popcounts */
    __m512i tv = _mm512_set1_epi32((int)t), acc = _mm512_setzero_si512();
    __m512i one = _mm512_set1_epi32(1);
    for (; i + 16 <= n; i += 16)
        acc = _mm512_mask_add_epi32(acc, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(ord + i), tv),
                                    acc, one);
    c = _mm512_reduce_add_epi32(acc);
#endif
    for (; i < n; i++) c += ord[i] >= t;
    return c;
}

/* keeps, in order and in place, the n candidates (ord, id) that score at least t; the count */
static int knn_keep_ge(uint32_t *ord, int32_t *id, int n, uint32_t t) {
    int m = 0, i = 0;
#if defined(__AVX512F__) /* writes at m <= i: the lanes it overwrites are read already */
    for (__m512i tv = _mm512_set1_epi32((int)t); i + 16 <= n; i += 16) {
        __m512i o = _mm512_loadu_si512(ord + i), d = _mm512_loadu_si512(id + i);
        __mmask16 k = _mm512_cmpge_epu32_mask(o, tv);
        _mm512_storeu_si512(ord + m, _mm512_maskz_compress_epi32(k, o));
        _mm512_storeu_si512(id + m, _mm512_maskz_compress_epi32(k, d));
        /* the mask as a 32-bit count: given k itself, gcc 12 under -fsanitize=thread counts 4
           bytes of its 2-byte spill */
        m += __builtin_popcount(_cvtmask16_u32(k));
    }
#endif
    for (; i < n; i++) ord[m] = ord[i], id[m] = id[i], m += ord[i] >= t;
    return m;
}

/* how many of the n keys are above x */
static int knn_count_gt(const uint64_t *key, int n, uint64_t x) {
    int c = 0, i = 0;
#if defined(__AVX512F__)
    __m512i xv = _mm512_set1_epi64((long long)x), acc = _mm512_setzero_si512();
    __m512i one = _mm512_set1_epi64(1);
    for (; i + 8 <= n; i += 8)
        acc = _mm512_mask_add_epi64(acc, _mm512_cmpgt_epu64_mask(_mm512_loadu_si512(key + i), xv),
                                    acc, one);
    c = (int)_mm512_reduce_add_epi64(acc);
#endif
    for (; i < n; i++) c += key[i] > x;
    return c;
}

/* Query q's candidates ranked by knn_topk's order (a rank: the count of better ones): only the
   best cap stay, and with out (cap), each goes to out[rank] */
static void knn_rank(KnnCands *C, int q, int cap, int32_t *out) {
    uint32_t *ord = C->ord + (size_t)q * C->len;
    int32_t *id = C->id + (size_t)q * C->len, *rank = C->rank;
    float *sc = C->score;
    int n = C->n[q], m = 0;
    for (int i = 0; i < n; i++) sc[i] = knn_ord_score(ord[i]);
    if (!rank_distinct(sc, n, rank)) { /* equal scores: the lower id first */
        for (int i = 0; i < n; i++) C->key[i] = knn_key(ord[i], id[i]);
        for (int i = 0; i < n; i++) rank[i] = knn_count_gt(C->key, n, C->key[i]);
    }
    for (int i = 0; i < n; i++) {
        if (rank[i] >= cap) continue;
        if (out) out[rank[i]] = id[i];
        ord[m] = ord[i], id[m++] = id[i];
    }
    C->n[q] = m;
}

/* Once query q holds cap candidates: keep those scoring at least t, found by bisection on
   knn_ord, at most the cap-th best score and at most `slack` more kept (ties aside); t becomes
   its threshold. Ties that would fill the buffer are cut to the best cap by knn_topk's order. */
static void knn_settle(KnnCands *C, int q, int cap, int slack, float *thr) {
    uint32_t *ord = C->ord + (size_t)q * C->len;
    int32_t *id = C->id + (size_t)q * C->len;
    int n = C->n[q], m = 0;
    if (n < cap || cap < 1) return;
    uint32_t lo = UINT32_MAX, hi = 0; /* the cap-th best is in [lo, hi]: the least and best */
    for (int i = 0; i < n; i++) lo = ord[i] < lo ? ord[i] : lo, hi = ord[i] > hi ? ord[i] : hi;
    for (int c = n; lo < hi && c > cap + slack;) { /* c: the count at or above lo */
        uint32_t mid = (uint32_t)(((uint64_t)lo + hi + 1) / 2);
        int cm = knn_count_ge(ord, n, mid);
        if (cm >= cap) lo = mid, c = cm;
        else hi = mid - 1;
    }
    m = knn_keep_ge(ord, id, n, lo);
    uint32_t t = hi; /* the least kept: the threshold, as tight as it can be */
    for (int i = 0; i < m; i++) t = ord[i] < t ? ord[i] : t;
    C->n[q] = m;
    *thr = knn_ord_score(t);
    if (m + KNN_W > C->len) knn_rank(C, q, cap, NULL);
}

/* The scores s (n rows) of a chunk's queries q0.. against the tile of keys k0.. (ids k0, ..;
   bit j of valid: key j exists): a score that reaches thr[q] joins the query's candidates,
   settled to the best cap when its buffer fills. Queries whose bit in `on` is clear skip. */
static void knn_offer(const KnnV *s, int q0, int n, int k0, unsigned valid,
                      KnnCands *C, int cap, float *thr, uint64_t on) {
    for (int q = q0; q < q0 + n; q++) {
        if (!(on >> q & 1)) continue;
        if (C->n[q] + KNN_W > C->len) knn_settle(C, q, cap, C->len / 4, &thr[q]);
        size_t at = (size_t)q * C->len + C->n[q];
        unsigned m = knn_mask(s[q - q0], thr[q]) & valid;
        C->n[q] += knn_append(s[q - q0], m, k0, C->ord + at, C->id + at);
    }
}

/* One pass of the queries qp (nq, d) of a chunk, those with their bit in `on`, over the n keys
 * of kt (key j: id j), tile by tile in id order: knn_tile scores, knn_offer keeps. With cs (not
 * NULL), each key's best query (knn_col_best) is kept too, the chunk's first query being id0. */
static void knn_pass(const float *qp, int nq, int d, const float *kt, int n,
                     KnnCands *C, int cap, float *thr, uint64_t on, float *cs, int32_t *cq,
                     int32_t id0) {
    for (int k0 = 0; k0 < n; k0 += KNN_W) {
        const float *t = kt + (size_t)(k0 / KNN_W) * d * KNN_W;
        unsigned valid = n - k0 >= KNN_W ? ~0u : (1u << (n - k0)) - 1; /* tile keys < n */
        for (int q0 = 0; q0 < nq; q0 += KNN_QB) {
            if (!(on >> q0 & ((1ull << KNN_QB) - 1))) continue;
            KnnV s[KNN_QB];
            knn_tile(qp + (size_t)q0 * d, t, d, s);
            int nr = nq - q0 < KNN_QB ? nq - q0 : KNN_QB;
            if (cs) knn_col_best(s, nr, id0 + q0, cs + k0, cq + k0);
            knn_offer(s, q0, nr, k0, valid, C, cap, thr, on);
        }
    }
}

/* ---- knn_pass on AMX tiles, where the CPU has them ----------------------------------------- */

/* q.k on the matrix tiles in bf16: each value x is split as hi = bf16(x), lo = bf16(x - hi), and
 * hi.hi + hi.lo + lo.hi is summed in fp32, within (3.1 * 2^-16 + 3d * 2^-24) sum |q_i k_i| of q.k.
 * So ids may differ from knn_topk's only between keys scoring within that: knn_topk_cuda's rule. */
static int knn_amx_off; /* 1: the fp32 tiles only (the tests run both) */

/* p's first 64-byte boundary: a tile row that straddles two cache lines loads at half speed */
static uint16_t *align64(void *p) { return (uint16_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#define KNN_AMX 1
#include <sys/syscall.h>

enum { AMX_KB = 8 }; /* key tiles a block: they stay in L1 while a chunk's queries pass by */

static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_request(void) { /* Linux: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA */
    amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

typedef struct {              /* the 64 bytes of LDTILECFG's operand */
    uint8_t palette, start_row, zero[14];   /* (14) reserved */
    uint16_t colsb[16];       /* (16) bytes in a row of each tile */
    uint8_t rows[16];         /* (16) rows of each tile */
} AmxConfig;

/* Tiles 0-7: 16 rows of 64 bytes each. A constant object: gcc 12's _tile_loadconfig declares a
   read of 8 of its 64 bytes, so a local's other stores were dropped once it was not inlined. */
static const AmxConfig amx_tiles = {.palette = 1,
                                    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                    .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

static void amx_config(void) { _tile_loadconfig(&amx_tiles); } /* this thread's tiles */

static uint16_t bf16_rne(float x) { /* round to nearest even; x finite, |x| <= 2^50 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

static float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x's hi part at t[0] and lo part at t[512]: the tile after a hi tile holds the lo parts */
static void bf16_split(float x, uint16_t *t) {
    t[0] = bf16_rne(x);
    t[512] = bf16_rne(x - bf16_f32(t[0]));
}

/* rows (n, ld) that the split takes: finite, |x| <= 2^50 (no product overflows) */
static int amx_rows_ok(const float *X, int n, size_t ld, int d) {
    for (int i = 0; i < n; i++)
        for (int r = 0; r < d; r++)
            if (!(fabsf(X[(size_t)i * ld + r]) <= 0x1p50f)) return 0;
    return 1;
}

/* tiles [lo, hi) of kb, then of kbs, in B order: tile t, chunk c, part (hi, lo), row r holds
 * dims 32c + 2r and 32c + 2r + 1 of the tile's 16 keys, key by key; zeros past d and n */
static void knn_pack_amx(void *arg, int lo, int hi, int tid) {
    (void)tid;
    const KnnBlockJob *J = arg;
    int d = J->d, nc = J->nc, nt = (J->nk + 15) / 16;
    for (int t = lo; t < hi; t++) {
        int sample = t >= nt, t0 = sample ? t - nt : t, n = sample ? J->ns : J->nk;
        uint16_t *kb = (sample ? J->kbs : J->kb) + (size_t)t0 * nc * 1024;
        memset(kb, 0, (size_t)nc * 1024 * sizeof *kb);
        for (int j = 0, i = t0 * 16; j < 16 && i < n; j++, i++) {
            const float *k = J->K + (size_t)(sample ? knn_sample_key(i, J->nk) : i) * J->ld;
            for (int r = 0; r < d; r++)
                bf16_split(k[r], kb + (size_t)(r / 32) * 1024 + (r % 32 / 2) * 32 + 2 * j + r % 2);
        }
    }
}

/* a chunk's queries (nq rows of Q, stride ldq) in A order: tile of 16 queries, chunk c, part,
 * row q holds dims 32c .. 32c + 31 of query q; zeros past d and nq */
static void knn_pack_queries_amx(const float *Q, size_t ldq, int nq, int d, int nc,
                                 uint16_t *qa) {
    memset(qa, 0, (size_t)KNN_QC / 16 * nc * 1024 * sizeof *qa);
    for (int i = 0; i < nq; i++)
        for (int r = 0; r < d; r++)
            bf16_split(Q[(size_t)i * ldq + r],
                       qa + ((size_t)(i / 16) * nc + r / 32) * 1024 + (i % 16) * 32 + r % 32);
}

/* s (16 x 16) = 16 queries (qa) . 16 keys (kb), as hi.hi + hi.lo + lo.hi over nc chunks */
static void amx_tile(const uint16_t *qa, const uint16_t *kb, int nc, KnnV s[16]) {
    _tile_zero(0);
    for (int c = 0; c < nc; c++) {
        _tile_loadd(1, qa + (size_t)c * 1024, 64);
        _tile_loadd(2, qa + (size_t)c * 1024 + 512, 64);
        _tile_loadd(3, kb + (size_t)c * 1024, 64);
        _tile_loadd(4, kb + (size_t)c * 1024 + 512, 64);
        _tile_dpbf16ps(0, 1, 3);
        _tile_dpbf16ps(0, 1, 4);
        _tile_dpbf16ps(0, 2, 3);
    }
    _tile_stored(0, s, 64);
}

/* knn_pass on AMX: the chunk's queries qa, 16 a tile, against the n keys of kb, AMX_KB key
 * tiles at a time; a key meets the queries in order, as knn_col_best's tie rule needs */
static void knn_pass_amx(const uint16_t *qa, int nq, int nc, const uint16_t *kb, int n,
                         KnnCands *C, int cap, float *thr, uint64_t on, float *cs,
                         int32_t *cq, int32_t id0) {
    int nt = (n + 15) / 16;
    KnnV s[AMX_KB][16]; /* a block's scores: all are stored before any is read */
    for (int b0 = 0; b0 < nt; b0 += AMX_KB)
        for (int q0 = 0; q0 < nq; q0 += 16) {
            int nr = nq - q0 < 16 ? nq - q0 : 16, nb = nt - b0 < AMX_KB ? nt - b0 : AMX_KB;
            if (!(on >> q0 & 0xffff)) continue;
            for (int t = 0; t < nb; t++)
                amx_tile(qa + (size_t)(q0 / 16) * nc * 1024, kb + (size_t)(b0 + t) * nc * 1024, nc,
                         s[t]);
            for (int t = 0; t < nb; t++) {
                int k0 = (b0 + t) * 16;
                unsigned valid = n - k0 >= 16 ? 0xffffu : (1u << (n - k0)) - 1;
                if (cs) knn_col_best(s[t], nr, id0 + q0, cs + k0, cq + k0);
                knn_offer(s[t], q0, nr, k0, valid, C, cap, thr, on);
            }
        }
}
#endif

/* whether knn_topk_blocked scores on AMX: the CPU and kernel allow it, the rows are in range */
static int knn_use_amx(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d) {
#ifdef KNN_AMX
    pthread_once(&amx_once, amx_request);
    return !knn_amx_off && amx_granted && amx_rows_ok(Q, nq, ldq, d) && amx_rows_ok(K, nk, ld, d);
#else
    (void)Q, (void)nq, (void)ldq, (void)K, (void)nk, (void)ld, (void)d, (void)knn_amx_off;
    return 0;
#endif
}

/* one pass of a chunk's queries (qp; qa on AMX) over the keys, or over their sample */
static void knn_pass_job(const KnnBlockJob *J, const float *qp, const uint16_t *qa, int nq,
                         int sample, KnnCands *C, int cap, float *thr, uint64_t on, float *cs,
                         int32_t *cq, int32_t id0) {
    int n = sample ? J->ns : J->nk; /* the sample's ids are its rows: only its threshold is read */
#ifdef KNN_AMX
    if (J->kb)
        knn_pass_amx(qa, nq, J->nc, sample ? J->kbs : J->kb, n, C, cap, thr, on, cs, cq,
                     id0);
    else
#endif
        knn_pass(qp, nq, J->d, sample ? J->ks : J->kt, n, C, cap, thr, on, cs, cq, id0);
    (void)qa;
    for (int q = 0; q < nq; q++) /* the estimate's threshold exact, a final one near */
        if (on >> q & 1) knn_settle(C, q, cap, sample ? 0 : KNN_W, &thr[q]);
}

static long knn_n_redo; /* queries whose estimate was too high (the tests read it) */

/* Queries [lo, hi) in chunks of KNN_QC. A candidate costs far more than a score, so a first pass
 * over every KNN_SAMPLE-th key estimates T, the rank-th best score, and the full pass keeps only
 * scores >= T. A query left with Nq is exact; one left with fewer is redone. */
static void knn_block_range(void *arg, int lo, int hi, int tid) {
    const KnnBlockJob *J = arg;
    size_t ncol = (size_t)(J->nk + KNN_W - 1) / KNN_W * KNN_W;
    float *cs = J->col_s ? J->col_s + (size_t)tid * ncol : NULL;
    int32_t *cq = J->col_q ? J->col_q + (size_t)tid * ncol : NULL;
    int d = J->d, Nq = J->Nq, *hn;
    float est[KNN_QC], thr[KNN_QC]; /* T (or -INF); knn_offer's thr */
    KnnCands C = {.len = knn_cands_len(Nq)};
    C.ord = xmalloc((size_t)C.len *
                    (KNN_QC * (sizeof *C.ord + sizeof *C.id) + sizeof *C.key + sizeof *C.rank +
                     sizeof *C.score));
    C.id = (int32_t *)(C.ord + (size_t)KNN_QC * C.len);
    C.key = (uint64_t *)(C.id + (size_t)KNN_QC * C.len);
    C.rank = (int32_t *)(C.key + C.len);
    C.score = (float *)(C.rank + C.len);
    hn = C.n;
    /* (KNN_QC, d) the queries, rows permuted; on AMX, (KNN_QC / 16, nc, 2, 16, 32) in bf16 */
    float *qp = xmalloc((size_t)KNN_QC * (d > 0 ? d : 1) * sizeof *qp);
    uint16_t *qa = NULL;
    void *qa_mem = NULL;
#ifdef KNN_AMX
    if (J->kb) {
        qa_mem = xmalloc((size_t)KNN_QC / 16 * J->nc * 1024 * sizeof *qa + 64);
        qa = align64(qa_mem);
        amx_config();
    }
#endif
    for (int c0 = lo; c0 < hi; c0 += KNN_QC) {
        int nq = hi - c0 < KNN_QC ? hi - c0 : KNN_QC;
        uint64_t all = nq == 64 ? ~0ull : (1ull << nq) - 1, redo = 0;
        for (int i = 0; i < KNN_QC; i++) {
            hn[i] = 0, est[i] = thr[i] = -INFINITY;
            for (int r = 0; r < d && !qa; r++)
                qp[(size_t)i * d + r] =
                    i < nq ? J->Q[(size_t)(c0 + i) * J->ldq + knn_dim(r, d)] : 0.0f;
        }
#ifdef KNN_AMX
        if (qa) knn_pack_queries_amx(J->Q + (size_t)c0 * J->ldq, J->ldq, nq, d, J->nc, qa);
#endif
        if (J->rank > 0) { /* the estimate: the rank best of the sample */
            knn_pass_job(J, qp, qa, nq, 1, &C, J->rank, thr, all, NULL, NULL, 0);
            for (int i = 0; i < nq; i++)
                est[i] = thr[i] = hn[i] >= J->rank ? thr[i] : -INFINITY, hn[i] = 0;
        }
        knn_pass_job(J, qp, qa, nq, 0, &C, Nq, thr, all, cs, cq, c0);
        for (int i = 0; i < nq; i++)
            if (hn[i] < Nq && hn[i] < J->nk && est[i] != -INFINITY)
                redo |= 1ull << i, hn[i] = 0, thr[i] = -INFINITY;
        if (redo) {
            __atomic_fetch_add(&knn_n_redo, __builtin_popcountll(redo), __ATOMIC_RELAXED);
            knn_pass_job(J, qp, qa, nq, 0, &C, Nq, thr, redo, NULL, NULL, 0);
        }
        for (int i = 0; i < nq; i++) { /* best first */
            int32_t *o = J->out + (size_t)(c0 + i) * Nq;
            for (int j = hn[i]; j < Nq; j++) o[j] = -1;
            knn_rank(&C, i, Nq, o);
        }
    }
#ifdef KNN_AMX
    if (qa) _tile_release();
#endif
    free(C.ord); free(qp); free(qa_mem);
}

/* knn_topk's contract (ra.c), by blocks: the same ids for d % 8 == 0 (knn_tile: dot8's bits).
 * Threads split the queries; each query's answer is computed alone. The best query of each key
 * (top_query, NULL: not wanted) is read from the same score tiles, by column, per thread, and
 * the threads' answers are merged by knn_topk's tie rule. */
int knn_topk_blocked(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
                     int Nq, int32_t *ids_out, int32_t *top_query, int nthreads) {
    for (int v = 0; top_query && (nq <= 0 || Nq <= 0) && v < nk; v++) top_query[v] = -1;
    if (Nq <= 0 || nq <= 0) return 0;
    int ns = (nk + KNN_SAMPLE - 1) / KNN_SAMPLE, nt = (nk + KNN_W - 1) / KNN_W,
        nts = (ns + KNN_W - 1) / KNN_W;
    double e = (double)Nq / KNN_SAMPLE; /* the true top-Nq keys a sample holds, on average */
    int rank = (int)(e + 4 * sqrt(e) + 2); /* ~4 standard deviations more */
    if (4 * rank > Nq || ns < 4 * rank) rank = 0; /* not worth it */
    int nth = nthreads < 1 ? 1 : nthreads > MAX_THREADS ? MAX_THREADS : nthreads;
    nth = nth > nq ? nq : nth; /* parallel_for's thread count */
    size_t ncol = (size_t)nt * KNN_W;
    int amx = knn_use_amx(Q, nq, ldq, K, nk, ld, d);
    KnnBlockJob J = {Q, K, NULL, NULL, ldq, nk, ns, ld, d, Nq, rank, ids_out, NULL, NULL,
                     NULL, NULL, NULL, (d + 31) / 32};
    if (amx) { /* KNN_W == 16 on AMX: the tiles of 16 keys are knn_pass's */
        J.kb_mem = xmalloc((size_t)(nt + nts) * J.nc * 1024 * sizeof *J.kb + 64);
        J.kb = align64(J.kb_mem);
        J.kbs = J.kb + (size_t)nt * J.nc * 1024;
    } else {
        J.kt = xmalloc((size_t)(nt + nts) * d * KNN_W * sizeof(float));
        J.ks = J.kt + (size_t)nt * d * KNN_W;
    }
    if (top_query) {
        J.col_s = xmalloc((size_t)nth * ncol * (sizeof *J.col_s + sizeof *J.col_q) + 1);
        J.col_q = (int32_t *)(J.col_s + (size_t)nth * ncol);
        for (size_t i = 0; i < (size_t)nth * ncol; i++) J.col_s[i] = -INFINITY, J.col_q[i] = -1;
    }
#ifdef KNN_AMX
    if (amx) parallel_for(nt + nts, nthreads, knn_pack_amx, &J);
#endif
    if (!amx) parallel_for(nt + nts, nthreads, knn_transpose, &J);
    parallel_for(nq, nth, knn_block_range, &J);
    for (int v = 0; top_query && v < nk; v++) { /* thread t's queries all follow thread t-1's */
        float b = J.col_s[v];
        top_query[v] = J.col_q[v];
        for (int t = 1; t < nth; t++)
            if (J.col_s[(size_t)t * ncol + v] > b)
                b = J.col_s[(size_t)t * ncol + v], top_query[v] = J.col_q[(size_t)t * ncol + v];
    }
    free(J.col_s);
    free(J.kt);
    free(J.kb_mem);
    return amx;
}

/* the bytes knn_topk_blocked holds: the keys and their sample by tile, transposed, each
 * thread's chunk of heaps and queries, and its best query per key */
double knn_blocked_bytes(int nk, int d, int Nq, int nthreads) {
    double tiles =
        (nk + KNN_W - 1) / KNN_W + ((nk + KNN_SAMPLE - 1) / KNN_SAMPLE + KNN_W - 1) / KNN_W;
    double nc = (d + 31) / 32, fp32 = d * KNN_W * 4.0, amx = nc * 2048; /* a tile's bytes */
    double per_thread = KNN_QC * (knn_cands_len(Nq) * 8.0 + d * 4 + nc * 128) +
                        knn_cands_len(Nq) * 16.0 + (nk + KNN_W) * 8.0; /* + key, rank, score */
    return tiles * (fp32 > amx ? fp32 : amx) + nthreads * per_thread;
}

/* ---- attn_causal: Eq. (1) for a batch of queries, in tiles (oracle: attn_full) ------------ */

/* The query heads of a GQA group, for up to ATT_QB consecutive tokens, share one pass over the
 * keys, ATT_KT at a time, with FlashAttention's running max and sum (the algebra of Eq. 4-5).
 * Memory stays linear in the context. */
#define ATT_QB 16   /* tokens per block */
#define ATT_KT 64   /* keys per tile */

/* the KNN's vector (16 floats with AVX-512, else 8); qk_4rows and pv_4rows keep 4 rows x ATT_C
 * vectors of accumulators in registers (REG_BLOCK, ra.h) */
enum { ATT_W = KNN_W };
enum { ATT_C = REG_BLOCK };
typedef KnnV AttV;
/* any float address */
typedef float AttV_u __attribute__((vector_size(ATT_W * sizeof(float)), aligned(4), may_alias));
static AttV att_load(const float *p) { return *(const AttV_u *)p; }
static void att_store(float *p, AttV v) { *(AttV_u *)p = v; }
_Static_assert(ATT_KT % (ATT_C * ATT_W) == 0 && ATT_KT % 16 == 0,
               "qk_4rows and softmax_tile cover a tile in whole steps");

/* rows of layer l's cache (State.kv_cap); a State set up by hand (the tests' kernels) has no
 * kv_cap: every layer then holds ctx */
int kv_ring(const State *s, int l) { return s->kv_cap ? s->kv_cap[l] : s->ctx; }

/* window: a sliding layer's (Config.swa_window), each query seeing its last `window` keys; 0 all */
typedef struct { const Model *m; State *s; int layer, n, pos0, window; } AttnTask;

/* e^x for x <= 0 (x = z - max) within 2 ulp of expf, in plain arithmetic that vectorizes:
 * x = n ln2 + r, e^r by Cephes' polynomial, 2^n into the exponent bits. Below -87: e^-87; NaN
 * stays NaN. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504f + 12582912.0f; /* 1.5 * 2^23: the sum rounds n into t's low bits */
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;              /* ln 2, in two parts */
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;                  /* 2^n: n + 127 into the exponent field */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* S[a][j] = Qb[a] . k_j for 4 query rows a and the tile's ATT_KT keys, Kt being the tile
 * transposed (hd, ATT_KT): each loaded key column serves 4 rows, and every product is a
 * vector FMA with no horizontal sum */
static void qk_4rows(float *S, const float *Qb, const float *Kt, int hd) {
    for (int j0 = 0; j0 < ATT_KT; j0 += ATT_C * ATT_W) {
        AttV a[4][ATT_C] = {{{0}}};
        for (int d = 0; d < hd; d++) {
            AttV k[ATT_C];
            for (int c = 0; c < ATT_C; c++)
                k[c] = att_load(Kt + (size_t)d * ATT_KT + j0 + c * ATT_W);
            for (int r = 0; r < 4; r++) {
                float q = Qb[(size_t)r * hd + d];
                for (int c = 0; c < ATT_C; c++) a[r][c] += q * k[c];
            }
        }
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < ATT_C; c++)
                att_store(S + (size_t)r * ATT_KT + j0 + c * ATT_W, a[r][c]);
    }
}

/* acc[a][d0 + i] += sum_j P[a][j] v_j[d0 + i] for 4 rows a and nv * ATT_W dims from d0 (nv <=
 * ATT_C): the accumulators stay in registers over the tile's keys, each value vector loaded
 * once for 4 rows */
static inline void pv_4rows(float *acc, const float *P, const float *V, int nk, int hd, int d0,
                            int nv) {
    AttV a[4][ATT_C], v[ATT_C];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < nv; c++) a[r][c] = att_load(acc + (size_t)r * hd + d0 + c * ATT_W);
    for (int j = 0; j < nk; j++) {
        for (int c = 0; c < nv; c++) v[c] = att_load(V + (size_t)j * hd + d0 + c * ATT_W);
        for (int r = 0; r < 4; r++) {
            float p = P[(size_t)r * ATT_KT + j];
            for (int c = 0; c < nv; c++) a[r][c] += p * v[c];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < nv; c++) att_store(acc + (size_t)r * hd + d0 + c * ATT_W, a[r][c]);
}

/* acc[a] += P[a] . V for 4 rows, all hd dims: ATT_C vectors at a time, then one, then the
 * dims that fill no vector */
static void pv_tile(float *acc, const float *P, const float *V, int nk, int hd) {
    int d0 = 0;
    for (; d0 + ATT_C * ATT_W <= hd; d0 += ATT_C * ATT_W) pv_4rows(acc, P, V, nk, hd, d0, ATT_C);
    for (; d0 + ATT_W <= hd; d0 += ATT_W) pv_4rows(acc, P, V, nk, hd, d0, 1);
    for (; d0 < hd; d0++)
        for (int r = 0; r < 4; r++) {
            float o = acc[(size_t)r * hd + d0];
            for (int j = 0; j < nk; j++) o += P[(size_t)r * ATT_KT + j] * V[(size_t)j * hd + d0];
            acc[(size_t)r * hd + d0] = o;
        }
}

/* the online softmax of one row's tile: m = max(old max, z_j for lo <= j < nv); S[j] =
 * e^(z_j - m) there, 0 elsewhere (the causal mask after, a sliding window's before); returns
 * sum_j S[j]. In 16 lanes, so the loops vectorize (on AVX2 with -fno-trapping-math, as the
 * Makefile builds). */
static float softmax_tile(float *S, int lo, int nv, float *max) {
    float mm[16], m = *max, ls[16] = {0};
    for (int k = 0; k < 16; k++) mm[k] = m;
    int j = lo;
    for (; j + 16 <= nv; j += 16)
        for (int k = 0; k < 16; k++) mm[k] = S[j + k] > mm[k] ? S[j + k] : mm[k];
    for (; j < nv; j++) m = S[j] > m ? S[j] : m;
    for (int k = 0; k < 16; k++) m = mm[k] > m ? mm[k] : m;
    /* e^ of every lane, masked outside (a lane there may give inf or NaN, never kept): with no
       branch the loop vectorizes without AVX-512's masked instructions */
    for (j = 0; j < ATT_KT; j += 16)
        for (int k = 0; k < 16; k++) {
            float e = exp_neg(S[j + k] - m), p = j + k < nv && j + k >= lo ? e : 0;
            S[j + k] = p;
            ls[k] += p;
        }
    for (int w = 8; w > 0;
         w /= 2) /* the 16 lanes added pairwise: 4 vector adds, not 15 in a chain */
        for (int k = 0; k < w; k++) ls[k] += ls[k + w];
    *max = m;
    return ls[0];
}

/* Eq. (1) for KV head kvh's query heads and the block's tokens from tok0, over keys [key0, key1).
 * part NULL: into s->att. Else one token's run of a split step: each row's partial (Eq. 4) into
 * part (rows, hd + 2): o over the run, its max z~ and its sum of e^(z - z~). */
static void attn_block(AttnTask *t, int kvh, int tok0, int key0, int key1, float *part,
                       int thread) {
    const Config *c = &t->m->c;
    State *s = t->s;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, qd = c->n_heads * hd;
    int nt = t->n - tok0 < ATT_QB ? t->n - tok0 : ATT_QB, rows = nt * group,
        rows4 = (rows + 3) & ~3;
    float scale = 1.0f / sqrtf((float)hd);
    /* position p at row p % cap */
    Rows K = cache_rows(s, c, 0, t->layer, kvh), V = cache_rows(s, c, 1, t->layer, kvh);
    size_t kes = cache_elem(s, 0), ves = cache_elem(s, 1);
    int cap = kv_ring(s, t->layer);
    float kb[HEAD_DIM_MAX];   /* a key row of halves, as floats */
    /* (rows4, ATT_KT) scores, then weights */
    float *S = s->att_work + (size_t)thread * s->att_work_stride;
    float *acc = S + (size_t)rows4 * ATT_KT; /* (rows4, hd) running sum of p v */
    float *Qb = acc + (size_t)rows4 * hd; /* (rows4, hd) the queries, scaled */
    float *Kt = Qb + (size_t)rows4 * hd; /* (hd, ATT_KT) the key tile, transposed */
    float *mx = Kt + (size_t)hd * ATT_KT, *sum = mx + rows4; /* (rows4) running max, sum of p */
    float *Vt = sum + rows4; /* (ATT_KT, hd) the tile's values, where the cache holds halves */
    int *pos = (int *)(Vt + (size_t)ATT_KT * hd); /* (rows4) position of each row */
    for (int r = 0; r < rows4; r++) {
        int ok = r < rows, tok = tok0 + (ok ? r : rows - 1) / group,
            h = kvh * group + (ok ? r : rows - 1) % group;
        const float *q = s->q + (size_t)tok * qd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) Qb[(size_t)r * hd + d] = ok ? q[d] * scale : 0;
        pos[r] = ok ? t->pos0 + tok : -1;   /* padding rows see no key */
        mx[r] = -INFINITY, sum[r] = 0;
    }
    memset(acc, 0, (size_t)rows4 * hd * sizeof(float));
    for (int j0 = key0, nk; j0 < key1; j0 += nk) {
        /* a tile: up to ATT_KT keys, contiguous rows (a sliding layer's ring ends one) */
        int row = j0 % cap;
        nk = key1 - j0 < ATT_KT ? key1 - j0 : ATT_KT;
        nk = nk < cap - row ? nk : cap - row;
        /* S = Qb . K^T for this tile: z_j of Eq. (1); keys past nk are zeros, masked below */
        for (int j = 0; j < ATT_KT; j++) {
            const float *kr = j < nk ? row_f32(K, (size_t)(row + j), hd, kb) : NULL;
            for (int d = 0; d < hd; d++) Kt[(size_t)d * ATT_KT + j] = kr ? kr[d] : 0;
        }
        if (j0 + nk < key1) {   /* ask for the next tile's keys and this tile's values now */
            /* keys in the next tile */
            int next = (j0 + nk) % cap, nn = key1 - j0 - nk < ATT_KT ? key1 - j0 - nk : ATT_KT;
            nn = nn < cap - next ? nn : cap - next;
            const char *kn = (const char *)K.data + (size_t)next * hd * kes,
                       *vn = (const char *)V.data + (size_t)row * hd * ves;
            for (size_t b = 0; b < (size_t)nn * hd * kes; b += 64) __builtin_prefetch(kn + b);
            for (size_t b = 0; b < (size_t)nk * hd * ves; b += 64) __builtin_prefetch(vn + b);
        }
        for (int r = 0; r < rows4; r += 4)
            qk_4rows(S + (size_t)r * ATT_KT, Qb + (size_t)r * hd, Kt, hd);
        /* causal mask, running max, weights p = e^(z - max), rescale what came before */
        for (int r = 0; r < rows4; r++) {
            int nv = pos[r] + 1 - j0 < nk ? pos[r] + 1 - j0 : nk;
            int lo = t->window > 0 ? pos[r] + 1 - t->window - j0 : 0;   /* the window's start */
            lo = lo < 0 ? 0 : lo > nv ? (nv < 0 ? 0 : nv) : lo;
            float m = mx[r], l = softmax_tile(S + (size_t)r * ATT_KT, lo, nv < 0 ? 0 : nv, &m);
            float corr = m == -INFINITY ? 1 : expf(mx[r] - m), *o = acc + (size_t)r * hd;
            if (corr != 1)
                for (int d = 0; d < hd; d++) o[d] *= corr;
            sum[r] = sum[r] * corr + l;
            mx[r] = m;
        }
        const float *Vr = Vt;
        if (V.f16)   /* the tile's values as floats */
            for (int j = 0; j < nk; j++) row_f32(V, (size_t)(row + j), hd, Vt + (size_t)j * hd);
        else Vr = (const float *)V.data + (size_t)row * hd;
        for (int r = 0; r < rows4; r += 4)
            pv_tile(acc + (size_t)r * hd, S + (size_t)r * ATT_KT, Vr, nk, hd);
    }
    for (int r = 0; r < rows; r++) {
        int tok = tok0 + r / group, h = kvh * group + r % group;
        float *out =
            part ? part + (size_t)r * (hd + 2) : s->att + (size_t)tok * qd + (size_t)h * hd;
        float inv = sum[r] > 0 ? 1.0f / sum[r] : 0;
        for (int d = 0; d < hd; d++) out[d] = acc[(size_t)r * hd + d] * inv;
        if (part) out[hd] = sum[r] > 0 ? mx[r] : -INFINITY, out[hd + 1] = sum[r];
    }
}

static void attn_causal_task(void *arg, int64_t i0, int64_t i1, int thread) {
    AttnTask *t = arg;
    int nblocks = (t->n + ATT_QB - 1) / ATT_QB;
    for (int64_t i = i0; i < i1; i++) {
        int tok0 = (int)(i % nblocks) * ATT_QB, nt = t->n - tok0 < ATT_QB ? t->n - tok0 : ATT_QB;
        int key0 = t->window > 0 ? t->pos0 + tok0 + 1 - t->window : 0;   /* the first row's */
        attn_block(t, (int)(i / nblocks), tok0, key0 > 0 ? key0 : 0, t->pos0 + tok0 + nt, NULL,
                   thread);
    }
}

/* One token gives only n_kv_heads blocks, fewer than the threads, so its keys are split into
 * runs, a task each (Eq. 4 over the run), merged by Eq. (4)-(5) in position order. The runs
 * depend on the position alone: the same bits for any thread count. */
#define ATT_SPLIT 1024   /* keys per run; a multiple of ATT_KT */
_Static_assert(ATT_SPLIT % ATT_KT == 0, "runs are whole tiles");

/* part (n_kv_heads, nrun, group, hd + 2): each run's partial, with its max and sum */
typedef struct { AttnTask *t; int nrun; float *part; } SplitTask;

static void attn_run_task(void *arg, int64_t i0, int64_t i1, int thread) {
    SplitTask *st = arg;
    const Config *c = &st->t->m->c;
    int group = c->n_heads / c->n_kv_heads, nkeys = st->t->pos0 + 1;
    for (int64_t i = i0; i < i1; i++) {   /* i = kvh * nrun + run */
        int key0 = (int)(i % st->nrun) * ATT_SPLIT,
            key1 = key0 + ATT_SPLIT < nkeys ? key0 + ATT_SPLIT : nkeys;
        attn_block(st->t, (int)(i / st->nrun), 0, key0, key1,
                   st->part + (size_t)i * group * (c->head_dim + 2), thread);
    }
}

/* the decoding step's attention by runs; 0 when the runs' buffer cannot be had (the caller
 * then attends in one pass) */
static int attn_split_decode(AttnTask *t) {
    const Config *c = &t->m->c;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, nrun = t->pos0 / ATT_SPLIT + 1;
    float *part = malloc((size_t)c->n_kv_heads * nrun * group * (hd + 2) * sizeof(float));
    if (!part) return 0;
    SplitTask st = {t, nrun, part};
    pool_for(t->s->pool, (int64_t)c->n_kv_heads * nrun, attn_run_task, &st);
    for (int h = 0; h < c->n_heads; h++) {   /* Eq. (4)-(5), run by run */
        int kvh = h / group, r = h % group;
        float *out = t->s->att + (size_t)h * hd;
        const float *p = part + ((size_t)kvh * nrun * group + r) * (hd + 2);
        float m = p[hd], sm = p[hd + 1];
        memcpy(out, p, (size_t)hd * sizeof(float));
        for (int run = 1; run < nrun; run++) {
            const float *q = p + (size_t)run * group * (hd + 2);
            attn_merge(out, m, sm, q, q[hd], q[hd + 1], hd, out, &m, &sm);
        }
    }
    free(part);
    return 1;
}

/* o_W of a decoding step (Alg. 1 line 6): the runs [0, sink) and [w0, pos] of each KV head in
 * tiles (attn_block), merged by Eq. (4)-(5). The fast path of attn_partial over W. part is
 * (2 n_kv_heads, group, hd + 2): each run's partial, with its max and sum. */
typedef struct { AttnTask *t; int sink, w0; float *part; } WindowTask;

static void attn_window_task(void *arg, int64_t i0, int64_t i1, int thread) {
    WindowTask *w = arg;
    const Config *c = &w->t->m->c;
    size_t group = (size_t)(c->n_heads / c->n_kv_heads);
    for (int64_t i = i0; i < i1; i++) {   /* i = 2 kvh + run: [0, sink), then [w0, pos] */
        int run = (int)(i % 2), key0 = run ? w->w0 : 0, key1 = run ? w->t->pos0 + 1 : w->sink;
        attn_block(w->t, (int)(i / 2), 0, key0, key1, w->part + i * group * (c->head_dim + 2),
                   thread);
    }
}

void attn_window(const Model *m, State *s, int layer, int pos, int sink, int w0, float *out,
                 float *part) {
    const Config *c = &m->c;
    int hd = c->head_dim, nh = c->n_heads, group = nh / c->n_kv_heads;
    AttnTask t = {m, s, layer, 1, pos, 0};
    WindowTask w = {&t, sink, w0, part};
    pool_for(s->pool, 2 * (int64_t)c->n_kv_heads, attn_window_task, &w);
    for (int h = 0; h < nh; h++) {
        const float *a = part + ((size_t)2 * (h / group) * group + h % group) * (hd + 2);
        const float *b = a + (size_t)group * (hd + 2);
        attn_merge(a, a[hd], a[hd + 1], b, b[hd], b[hd + 1], hd, out + (size_t)h * hd,
                   &out[(size_t)nh * hd + h], &out[(size_t)nh * hd + nh + h]);
    }
}

/* Eq. (1) over every key before each query, for the n queries of s->q at positions pos0..
 * (n, n_heads*hd), into s->att: the prompt's causal attention, and full attention's decoding
 * step. attention_layer (ra.c) calls it; attn_causal_cuda is its GPU twin. */
void attn_causal(const Model *m, State *s, int layer, int n, int pos0) {
    AttnTask t = {m, s, layer, n, pos0, layer_sliding(&m->c, layer) ? m->c.swa_window : 0};
    if (n == 1 && pos0 >= ATT_SPLIT && !t.window && attn_split_decode(&t)) return;   /* > 1 run */
    pool_for(s->pool, (int64_t)m->c.n_kv_heads * ((n + ATT_QB - 1) / ATT_QB), attn_causal_task, &t);
}

/* scratch floats per thread for attn_block */
size_t attn_work_floats(const Config *c) {
    size_t rows = ((size_t)ATT_QB * (c->n_heads / c->n_kv_heads) + 3) & ~(size_t)3;
    return rows * (ATT_KT + 2 * (size_t)c->head_dim + 3) + 2 * (size_t)c->head_dim * ATT_KT;
}

/* ======================================================================== */
/* Run state                                                                */
/* ======================================================================== */

/* The KV cache: one block for keys, one for values, in 2 MiB pages where the kernel has
 * transparent huge pages: ra's searches read keys at random across the cache, and with 4 KiB
 * pages most reads would also miss the TLB. posix_memalign's memory is freed by free. */
enum { HUGE_PAGE = 2 << 20 };   /* bytes in a transparent huge page (x86-64; arm64, 4 KiB pages) */

static void *alloc_cache(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* advice only: where it is not taken, the pages stay 4 KiB */
#endif
    return p;
}

int kv_rows(const Config *c, int l, int ctx, int max_batch) {
    if (!layer_sliding(c, l)) return ctx;
    long ring = (long)c->swa_window + max_batch;   /* a batch's first query sees window - 1 back */
    return ring < ctx ? (int)ring : ctx;
}

static size_t elem_bytes(int f16) { return f16 ? sizeof(uint16_t) : sizeof(float); }

double kv_cache_bytes(const Config *c, int ctx, int max_batch, int cache_type) {
    double rows = 0;
    for (int l = 0; l < c->n_layers; l++) rows += kv_rows(c, l, ctx, max_batch);
    return rows * c->n_kv_heads * c->head_dim *
           (double)(elem_bytes(cache_type & CACHE_K_F16) + elem_bytes(cache_type & CACHE_V_F16));
}

size_t cache_elem(const State *s, int v) {
    return elem_bytes(s->cache_type & (v ? CACHE_V_F16 : CACHE_K_F16));
}

Rows cache_rows(const State *s, const Config *c, int v, int l, int h) {
    Rows r = {(const char *)(v ? s->v : s->k) + kv_offset(s, c, l, h) * cache_elem(s, v),
              (size_t)c->head_dim, (s->cache_type & (v ? CACHE_V_F16 : CACHE_K_F16)) != 0};
    return r;
}

size_t kv_offset(const State *s, const Config *c, int l, int h) {
    size_t off = s->kv_off ? s->kv_off[l] : (size_t)l * c->n_kv_heads * s->ctx * c->head_dim;
    return off + (size_t)h * kv_ring(s, l) * c->head_dim;
}

int build_state(State *s, const Model *m, int ctx, int max_batch, int cache_type, Pool *pool,
                char *err) {
    const Config *c = &m->c;
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->cache_type = cache_type;
    s->max_batch = max_batch;
    s->pool = pool;
    int nt = pool_threads(pool);
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t cache = 0;
    size_t wmax = (size_t)(c->dim > c->ffn_dim ? c->dim : c->ffn_dim);
    if (qd > wmax) wmax = qd;
    s->kv_cap = malloc((size_t)c->n_layers * sizeof *s->kv_cap);
    s->kv_off = malloc((size_t)c->n_layers * sizeof *s->kv_off);
    for (int l = 0; s->kv_cap && s->kv_off && l < c->n_layers; l++) {
        s->kv_cap[l] = kv_rows(c, l, ctx, max_batch);
        s->kv_off[l] = cache;
        cache += kvd * (size_t)s->kv_cap[l];
    }
    s->k = alloc_cache(cache * cache_elem(s, 0));
    s->v = alloc_cache(cache * cache_elem(s, 1));
    s->x = malloc((size_t)ctx * c->dim * sizeof(float));   /* a whole prompt goes layer by layer */
    s->xb = malloc((size_t)max_batch * c->dim * sizeof(float));
    s->xb2 = malloc((size_t)max_batch * c->dim * sizeof(float));
    s->q = malloc((size_t)max_batch * qd * sizeof(float));
    s->kb = malloc((size_t)max_batch * kvd * sizeof(float));
    s->vb = malloc((size_t)max_batch * kvd * sizeof(float));
    s->att = malloc((size_t)max_batch * qd * sizeof(float));
    s->hb = malloc((size_t)max_batch * c->ffn_dim * sizeof(float));
    s->hb2 = malloc((size_t)max_batch * c->ffn_dim * sizeof(float));
    s->logits = malloc((size_t)c->vocab_size * sizeof(float));
    s->wrow = malloc((size_t)nt * 4 * wmax * sizeof(float));
    s->att_work_stride = attn_work_floats(c);
    s->att_work = malloc((size_t)nt * s->att_work_stride * sizeof(float));
    if (!s->kv_cap || !s->kv_off || !s->k || !s->v || !s->x || !s->xb || !s->xb2 || !s->q ||
        !s->kb || !s->vb || !s->att || !s->hb || !s->hb2 || !s->logits || !s->wrow ||
        !s->att_work) {
        free_state(s);
        return fail(err,
                    "out of memory allocating the KV cache and buffers for a context of %d tokens "
                    "(%.1f GB)",
                    ctx, (double)cache * (cache_elem(s, 0) + cache_elem(s, 1)) / 1e9);
    }
    return 0;
}

double state_bytes(const Config *c, int ctx, int max_batch, int cache_type, int nthreads) {
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double wmax = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    if (qd > wmax) wmax = qd;
    double floats =
        kv_cache_bytes(c, ctx, max_batch, cache_type) / sizeof(float) /* k, v */
        + (double)ctx * c->dim /* x */
        + (double)max_batch * (2.0 * c->dim + 2 * qd + 2 * kvd + 2.0 * c->ffn_dim) /* batch rows */
        + c->vocab_size /* logits */
        + (double)nthreads * (4 * wmax + attn_work_floats(c)); /* per thread */
    return floats * sizeof(float);
}

void free_state(State *s) {
    free(s->k), free(s->v), free(s->x), free(s->xb), free(s->xb2), free(s->q), free(s->kb),
        free(s->vb), free(s->kv_cap), free(s->kv_off);
    free(s->att), free(s->hb), free(s->hb2), free(s->logits), free(s->wrow), free(s->att_work);
    memset(s, 0, sizeof *s);
}

/* ======================================================================== */
/* Forward pass: a batch of n tokens at positions s->n .. s->n+n-1          */
/* ======================================================================== */

/* x (n) into a cache at element at: copied, or rounded to the nearest half, a finite value past
 * the largest (65504) saturated at it, as the GPU path's copies (ra_cuda.cu:half_sat) */
static void store_row(void *cache, int f16, size_t at, const float *x, int n) {
    if (!f16) {
        memcpy((float *)cache + at, x, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)cache + at;
    for (int i = 0; i < n; i++) {
        float v = x[i] > 65504.0f && x[i] <= FLT_MAX     ? 65504.0f
                  : x[i] < -65504.0f && x[i] >= -FLT_MAX ? -65504.0f
                                                         : x[i];
        h[i] = fp32_to_fp16(v);
    }
}

/* The new key and value of one token (k, v: (n_kv_heads, hd), post-RoPE) into layer l's cache
 * at position pos: the cache holds exactly what the dot product of Eq. (1) uses */
void cache_store(State *s, const Config *c, int l, int pos, const float *k, const float *v) {
    int hd = c->head_dim;
    for (int h = 0; h < c->n_kv_heads; h++) {
        size_t at = kv_offset(s, c, l, h) + (size_t)(pos % kv_ring(s, l)) * hd;
        store_row(s->k, s->cache_type & CACHE_K_F16, at, k + (size_t)h * hd, hd);
        store_row(s->v, s->cache_type & CACHE_V_F16, at, v + (size_t)h * hd, hd);
    }
}

/* rows x (n, dim) = the token embeddings of tokens[0..n) */
void embed_tokens(const Model *m, const int32_t *tokens, int n, float *x) {
    for (int t = 0; t < n; t++)
        dequantize_row(m->tok_embd.type,
                       (const uint8_t *)m->tok_embd.data +
                           (int64_t)tokens[t] * m->tok_embd.row_bytes,
                       x + (size_t)t * m->c.dim, m->c.dim);
    if (m->c.embd_scale > 0 && m->c.embd_scale != 1.0f)   /* gemma3: sqrt(dim) */
        for (size_t i = 0; i < (size_t)n * m->c.dim; i++) x[i] *= m->c.embd_scale;
}

int kept_row(const State *s, int i) {
    int r = !s->q_keep_row ? i : i < s->q_keep_span ? s->q_keep_row[i] : -1;
    return r < s->q_keep_n ? r : -1;   /* a map past q_keep's rows keeps nothing there */
}

/* the queries of a batch (rows t0 .. t0+nb-1 of the call, in s->q) that q_keep keeps, each at
 * its row (State.q_keep_row) */
static void keep_queries(State *s, int qd, int t0, int nb) {
    for (int t = 0; t < nb; t++) {
        int r = kept_row(s, t0 + t);
        if (r >= 0)
            memcpy(s->q_keep + (size_t)r * qd, s->q + (size_t)t * qd, (size_t)qd * sizeof(float));
    }
}

/* One transformer layer for nb tokens at positions pos .. pos+nb-1, whose residual rows are
 * x (nb, dim); t0 is their offset within the current forward call. Returns the seconds its
 * attention took (State.prefill_attn_s sums them over a prompt's layers and batches). */
static double layer_forward(const Model *m, State *s, int l, float *x, int nb, int pos, int t0) {
    const Config *c = &m->c;
    const Layer *L = &m->layers[l];
    int dim = c->dim, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    Pool *p = s->pool;

    /* attention block: x += Wo . Attn(RoPE(Wq xn), RoPE(Wk xn), Wv xn) */
    for (int t = 0; t < nb; t++)
        rmsnorm(s->xb + (size_t)t * dim, x + (size_t)t * dim, L->attn_norm, dim, c->norm_eps);
    matmul(p, s->q, s->xb, &L->wq, nb, s->wrow);
    matmul(p, s->kb, s->xb, &L->wk, nb, s->wrow);
    matmul(p, s->vb, s->xb, &L->wv, nb, s->wrow);
    const float *inv_freq = layer_sliding(c, l) ? m->rope_inv_freq_swa : m->rope_inv_freq;
    for (int t = 0; t < nb; t++) {
        float *q = s->q + (size_t)t * qd, *k = s->kb + (size_t)t * kvd,
              *v = s->vb + (size_t)t * kvd;
        if (L->bq)
            for (int i = 0; i < qd; i++) q[i] += L->bq[i];
        if (L->bk)
            for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
        if (L->bv)
            for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
        for (int h = 0; L->q_norm && h < c->n_heads; h++)   /* gemma3: each head normed */
            rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, c->norm_eps);
        for (int h = 0; L->k_norm && h < c->n_kv_heads; h++)
            rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, c->norm_eps);
        rope_apply(q, c->n_heads, hd, c->rope_dim, pos + t, inv_freq, c->rope_type);
        rope_apply(k, c->n_kv_heads, hd, c->rope_dim, pos + t, inv_freq, c->rope_type);
        if (c->q_scale > 0 && c->q_scale != 1.0f)
            for (int i = 0; i < qd; i++) q[i] *= c->q_scale;
        cache_store(s, c, l, pos + t, k, v);
    }
    if (s->q_keep) keep_queries(s, qd, t0, nb);
    double t_attn = now_s();
    attention_layer(m, s, l, nb, pos);
    t_attn = now_s() - t_attn;
    matmul(p, s->xb2, s->att, &L->wo, nb, s->wrow);
    for (int t = 0; L->post_attn_norm && t < nb; t++)
        rmsnorm(s->xb2 + (size_t)t * dim, s->xb2 + (size_t)t * dim, L->post_attn_norm, dim,
                c->norm_eps);
    for (size_t i = 0; i < (size_t)nb * dim; i++) x[i] += s->xb2[i];

    /* feed-forward block: x += W_down (act(W_gate xn) * W_up xn), act silu or (gemma3) gelu */
    for (int t = 0; t < nb; t++)
        rmsnorm(s->xb + (size_t)t * dim, x + (size_t)t * dim, L->ffn_norm, dim, c->norm_eps);
    matmul(p, s->hb, s->xb, &L->w_gate, nb, s->wrow);
    matmul(p, s->hb2, s->xb, &L->w_up, nb, s->wrow);
    if (c->arch == ARCH_GEMMA3) geglu(s->hb, s->hb, s->hb2, nb * c->ffn_dim);
    else swiglu(s->hb, s->hb, s->hb2, nb * c->ffn_dim);
    matmul(p, s->xb2, s->hb, &L->w_down, nb, s->wrow);
    for (int t = 0; L->post_ffn_norm && t < nb; t++)
        rmsnorm(s->xb2 + (size_t)t * dim, s->xb2 + (size_t)t * dim, L->post_ffn_norm, dim,
                c->norm_eps);
    for (size_t i = 0; i < (size_t)nb * dim; i++) x[i] += s->xb2[i];
    return t_attn;
}

/* The whole model for n tokens, one layer at a time over all of them (in batches of
 * max_batch): when a layer is done its keys for every token are in the cache and its queries in
 * q_keep, which is when RetrievalAttention builds that layer's indexes (layer_done). */
float *forward(const Model *m, State *s, const int32_t *tokens, int n) {
    const Config *c = &m->c;
    int dim = c->dim, pos0 = s->n;

    embed_tokens(m, tokens, n, s->x);
    for (int l = 0; l < c->n_layers; l++) {
        for (int b0 = 0; b0 < n; b0 += s->max_batch) {
            int nb = n - b0 < s->max_batch ? n - b0 : s->max_batch;
            double t_attn = layer_forward(m, s, l, s->x + (size_t)b0 * dim, nb, pos0 + b0, b0);
            /* a prompt's; a decoding step's is Table 6's split */
            if (n > 1) s->prefill_attn_s += t_attn;
            if (s->progress)
                s->progress(s->progress_arg, ((double)l * n + b0 + nb) / ((double)c->n_layers * n));
            if (s->stop && s->stop()) return NULL;   /* interrupted: the caller reports and exits */
        }
        if (s->layer_done) s->layer_done(s->layer_arg, l, pos0, n);
        if (s->stop && s->stop()) return NULL;
    }
    s->n += n;

    /* logits of the last token only */
    rmsnorm(s->xb, s->x + (size_t)(n - 1) * dim, m->out_norm, dim, c->norm_eps);
    matmul(s->pool, s->logits, s->xb, &m->output, 1, s->wrow);
    return s->logits;
}

/* ======================================================================== */
/* Sampling: llama.cpp's chain: top-k, top-p, min-p, temperature, a draw    */
/* ======================================================================== */

static uint64_t rng_next(uint64_t *st) {   /* xorshift64* */
    *st ^= *st >> 12, *st ^= *st << 25, *st ^= *st >> 27;
    return *st * 0x2545F4914F6CDD1DULL;
}
static float rng_float(uint64_t *st) { return (rng_next(st) >> 40) / 16777216.0f; }

/* the sampler's order: the larger logit first, ties to the lower id */
static int cmp_prob_desc(const void *a, const void *b) {
    const ProbId *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

/* the k largest logits (k < n) into buf (k), best first: a heap of the k best so far whose root
 * is the weakest of them, so each token is one comparison unless it displaces the root */
static void heap_sift_down(ProbId *h, int m, int i) {
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;   /* w: the weakest of i and its children */
        if (l < m && cmp_prob_desc(&h[l], &h[w]) > 0) w = l;
        if (r < m && cmp_prob_desc(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        ProbId t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

static void top_k_select(const float *logits, int n, int k, ProbId *buf) {
    for (int i = 0; i < k; i++) buf[i].p = logits[i], buf[i].id = i;
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(buf, k, i);
    for (int i = k; i < n; i++) {
        ProbId x = {logits[i], i};
        if (cmp_prob_desc(&x, &buf[0]) < 0) buf[0] = x, heap_sift_down(buf, k, 0);
    }
    qsort(buf, (size_t)k, sizeof *buf, cmp_prob_desc);
}

/* the most likely token, the lowest id among equals */
static int argmax_first(const float *logits, int n) {
    int top = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[top]) top = i;
    return top;
}

int sample_probs(const float *logits, int n, const Sampler *sp, ProbId *buf) {
    int top = argmax_first(logits, n);
    float mx = logits[top];
    if (n == 1 || !isfinite(mx)) {
        buf[0].p = 1, buf[0].id = top;
        return 1;
    }
    /* top-k: the candidates buf[0..m), best first, their logits z in .p. Z is the sum of
       exp(z - max) over the candidates, so the next filter sees probabilities exp(z - max) / Z,
       renormalized over what top-k kept (as llama.cpp's top-p). */
    int m = 0;
    double Z = 0;
    if (sp->top_k > 0 && sp->top_k < n) {
        m = sp->top_k;
        top_k_select(logits, n, m, buf);
        for (int i = 0; i < m; i++) Z += expf(buf[i].p - mx);
    } else {
        /* every token. Sorting them all (128K for Llama 3) would be most of the sampler's time,
           so the tokens that cannot be in the nucleus are left out first: a token of probability
           below cut = (1 - top_p) / (n - 1) never is, as the tokens ranked at or below it (at
           most n - 1) hold less than 1 - top_p, so the run before it reached top_p already.
           The most likely token is always kept (all equal with top_p < 1/n: cut is above all). */
        for (int i = 0; i < n; i++) {   /* exp(z - max) once a token, kept in buf for the cut */
            buf[i].p = expf(logits[i] - mx), buf[i].id = i;
            Z += buf[i].p;
        }
        /* in units of exp(z - max) */
        double cut = sp->top_p < 1 ? (1 - sp->top_p) / (n - 1) * Z : 0;
        for (int i = 0; i < n; i++)   /* in place (m <= i), back to logits */
            if (buf[i].p >= cut || i == top) buf[m].p = logits[i], buf[m].id = i, m++;
        qsort(buf, (size_t)m, sizeof *buf, cmp_prob_desc);
    }
    /* top-p: the shortest run from the first token whose probability reaches top_p */
    if (sp->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < m; i++) {
            cum += expf(buf[i].p - mx) / Z;
            if (cum >= sp->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    /* min-p: the tokens at least min_p times as likely as the first, z >= max + log(min_p) */
    if (sp->min_p > 0) {
        float floor_z = mx + logf(sp->min_p);
        int keep = 1;
        while (keep < m && buf[keep].p >= floor_z) keep++;
        m = keep;
    }
    /* the temperature, on the tokens kept: softmax((z - max) / temp). (z - max) / temp is 0 for
       the first token, and -inf (not NaN) for the others when temp is tiny (1e-40), which then
       leaves the first alone. */
    double sum = 0;
    for (int i = 0; i < m; i++) {
        buf[i].p = expf((buf[i].p - mx) / sp->temp);
        sum += buf[i].p;
    }
    for (int i = 0; i < m; i++) buf[i].p = (float)(buf[i].p / sum);
    return m;
}

int sample(const float *logits, int n, const Sampler *sp, uint64_t *rng, ProbId *buf) {
    if (sp->temp <= 0) return argmax_first(logits, n);   /* greedy */
    int m = sample_probs(logits, n, sp, buf);
    float r = rng_float(rng), acc = 0;   /* a draw in proportion */
    for (int i = 0; i < m; i++) {
        acc += buf[i].p;
        if (r < acc) return buf[i].id;
    }
    return buf[m - 1].id;   /* r just below 1 where the rounded probabilities sum below it */
}

/* ======================================================================== */
/* The GPU twins, when built without ra_cuda.cu (make CUDA=0, or no nvcc)   */
/* ======================================================================== */

#ifndef RA_CUDA
/* they report no device */
int ra_cuda_init(char *msg, size_t n) {
    if (msg && n) snprintf(msg, n, "built without CUDA");
    return 0;
}
int knn_topk_cuda(const float *Q, int nq, size_t ldq, const float *K, int nk, int ld, int d,
                  int Nq, int32_t *ids_out, int32_t *top_query) {
    (void)Q, (void)nq, (void)ldq, (void)K, (void)nk, (void)ld, (void)d, (void)Nq, (void)ids_out;
    (void)top_query;
    fprintf(stderr, "knn_topk_cuda: built without CUDA\n");
    return -1;
}
int attn_partial_cuda(const float *q, int n_heads, const float *K, const float *V, int n_kv_heads,
                      int ctx, int p0, int p1, int d, float scale,
                      float *o, float *zmax, float *sumexp) {
    (void)q, (void)n_heads, (void)K, (void)V, (void)n_kv_heads, (void)ctx, (void)p0, (void)p1;
    (void)d, (void)scale, (void)o, (void)zmax, (void)sumexp;
    fprintf(stderr, "attn_partial_cuda: built without CUDA\n");
    return -1;
}
int attn_causal_cuda(const float *q, int n, int p0, const float *K, const float *V, int n_heads,
                     int n_kv_heads, int ctx, int d, float *out) {
    (void)q, (void)n, (void)p0, (void)K, (void)V, (void)n_heads, (void)n_kv_heads, (void)ctx,
        (void)d, (void)out;
    fprintf(stderr, "attn_causal_cuda: built without CUDA\n");
    return -1;
}
void gpu_fused_attention(int on) { (void)on; }
void gpu_attention_tile_bytes(size_t bytes) { (void)bytes; }
void ra_cuda_free_all(void) {}
int build_gpu_model(GpuModel **g, const Model *m, State *s, int n_prompt, int B, char *err) {
    (void)m, (void)s, (void)n_prompt, (void)B;
    *g = NULL;
    snprintf(err, ERR_LEN, "built without CUDA");
    return -1;
}
void free_gpu_model(GpuModel *g) { (void)g; }
float *forward_cuda(GpuModel *g, State *s, const int32_t *tokens, int n) {
    (void)g, (void)s, (void)tokens, (void)n;
    fprintf(stderr, "forward_cuda: built without CUDA\n");
    return NULL;
}
void gpu_plan(const Config *c, int n_prompt, int B, int n_w, int cache_type, double *weights,
              double *work) {
    (void)c, (void)n_prompt, (void)B, (void)n_w, (void)cache_type;
    *weights = *work = 0;
}
int gpu_free_mb(double *free_mb, double *total_mb) {
    *free_mb = *total_mb = 0;
    return -1;
}
double gpu_peak_mb(void) { return 0; }
#endif
