/* tests/test_gguf.c - the GGUF reader: every value type, both versions, alignment, and
 * corrupt files of every kind (truncation at each byte, bad counts, offsets, types, shapes,
 * duplicates, random byte flips): each must give an error naming the problem, never a crash. */
#define TESTING
#include "../model.c"
#include "../ra.c"
#include "check.h"
#include "gguf_writer.h"

static uint8_t *sample_file(size_t *size, uint32_t version, uint32_t alignment) {
    GW g;
    gw_init(&g);
    g.version = version;
    if (alignment != 32) gw_u32(&g, "general.alignment", alignment), g.alignment = alignment;
    gw_key(&g, "k.u8", GGUF_U8), buf_put(&g.kv, "\xfe", 1);
    gw_key(&g, "k.i8", GGUF_I8), buf_put(&g.kv, "\xfe", 1);
    uint16_t u16 = 65000;
    gw_key(&g, "k.u16", GGUF_U16), buf_put(&g.kv, &u16, 2);
    int16_t i16 = -3;
    gw_key(&g, "k.i16", GGUF_I16), buf_put(&g.kv, &i16, 2);
    gw_u32(&g, "k.u32", 4000000000u);
    int32_t i32 = -70000;
    gw_key(&g, "k.i32", GGUF_I32), buf_put(&g.kv, &i32, 4);
    gw_f32(&g, "k.f32", 1.5f);
    gw_bool(&g, "k.bool", 1);
    gw_string(&g, "k.str", "hello");
    uint64_t u64 = 1ULL << 40;
    gw_key(&g, "k.u64", GGUF_U64), buf_put(&g.kv, &u64, 8);
    int64_t i64 = -5;
    gw_key(&g, "k.i64", GGUF_I64), buf_put(&g.kv, &i64, 8);
    double f64 = 2.25;
    gw_key(&g, "k.f64", GGUF_F64), buf_put(&g.kv, &f64, 8);
    gw_arr_header(&g, "k.arr_i32", GGUF_I32, 3);
    for (int i = 0; i < 3; i++) w_u32(&g.kv, (uint32_t)(i * 10));
    gw_arr_header(&g, "k.arr_str", GGUF_STRING, 2);
    w_str(&g.kv, "ab"), w_str(&g.kv, "");
    float t1[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne1[2] = {4, 2};
    gw_tensor(&g, "t.f32", GGML_F32, 2, ne1, t1, sizeof t1);
    uint8_t q8[34 * 2] = {0};
    int64_t ne2[1] = {64};
    gw_tensor(&g, "t.q8", GGML_Q8_0, 1, ne2, q8, sizeof q8);
    uint8_t *b = gw_finish(&g, size);
    gw_free(&g);
    return b;
}

static int parse(const uint8_t *b, size_t n, char *err) {
    GGUF g;
    int r = build_gguf_from_memory(&g, b, n, "mem.gguf", err);
    if (r == 0) free_gguf(&g);
    return r;
}

static void test_valid(uint32_t version, uint32_t alignment) {
    size_t n;
    uint8_t *b = sample_file(&n, version, alignment);
    GGUF g;
    char err[ERR_LEN] = "";
    int r = build_gguf_from_memory(&g, b, n, "mem.gguf", err);
    CHECK(r == 0, "v%u align %u: %s", version, alignment, err);
    if (r) return free(b);
    int64_t i;
    float f;
    Str s;
    int bo;
    CHECK(gguf_get_int(&g, "k.u8", &i) == 1 && i == 254, "u8 %lld", (long long)i);
    CHECK(gguf_get_int(&g, "k.i8", &i) == 1 && i == -2, "i8 %lld", (long long)i);
    CHECK(gguf_get_int(&g, "k.u16", &i) == 1 && i == 65000, "u16");
    CHECK(gguf_get_int(&g, "k.i16", &i) == 1 && i == -3, "i16");
    CHECK(gguf_get_int(&g, "k.u32", &i) == 1 && i == 4000000000LL, "u32");
    CHECK(gguf_get_int(&g, "k.i32", &i) == 1 && i == -70000, "i32");
    CHECK(gguf_get_int(&g, "k.u64", &i) == 1 && i == (1LL << 40), "u64");
    CHECK(gguf_get_int(&g, "k.i64", &i) == 1 && i == -5, "i64");
    CHECK(gguf_get_float(&g, "k.f32", &f) == 1 && f == 1.5f, "f32");
    CHECK(gguf_get_float(&g, "k.f64", &f) == 1 && f == 2.25f, "f64");
    CHECK(gguf_get_bool(&g, "k.bool", &bo) == 1 && bo == 1, "bool");
    CHECK(gguf_get_str(&g, "k.str", &s) == 1 && str_eq(s, "hello"), "str");
    CHECK(gguf_get_int(&g, "k.str", &i) == -1, "a string is not an int");
    CHECK(gguf_get_int(&g, "missing", &i) == 0, "absent key");
    const GGUFKV *a = gguf_find(&g, "k.arr_i32");
    CHECK(a && a->type == GGUF_ARRAY && a->elem_type == GGUF_I32 && a->n == 3, "int array");
    if (a) {
        int32_t v[3];
        memcpy(v, a->data, 12);
        CHECK(v[0] == 0 && v[1] == 10 && v[2] == 20, "int array values");
    }
    a = gguf_find(&g, "k.arr_str");
    CHECK(a && a->n == 2 && a->strs && str_eq(a->strs[0], "ab") && a->strs[1].len == 0, "string array");
    const GGUFTensor *t = gguf_tensor(&g, "t.f32");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 2 && t->nbytes == 32, "tensor info");
    CHECK(t && ((const float *)t->data)[7] == 8.0f, "tensor data");
    CHECK(t && ((uintptr_t)((const uint8_t *)t->data - b)) % alignment == 0, "tensor aligned to %u", alignment);
    t = gguf_tensor(&g, "t.q8");
    CHECK(t && t->type == GGML_Q8_0 && t->nbytes == 68, "q8 tensor bytes");
    CHECK(g.alignment == alignment, "alignment %llu", (unsigned long long)g.alignment);
    free_gguf(&g);
    free(b);
}

/* every strict prefix of a valid file is an error, never a crash */
static void test_truncation(void) {
    size_t n;
    uint8_t *b = sample_file(&n, 3, 32);
    int all = 1;
    for (size_t len = 0; len < n; len++) {
        uint8_t *c = malloc(len ? len : 1);   /* exact size so ASan sees any overread */
        memcpy(c, b, len);
        char err[ERR_LEN] = "";
        if (parse(c, len, err) == 0) all = 0, fprintf(stderr, "prefix %zu accepted\n", len);
        free(c);
    }
    CHECK(all, "every prefix of %zu bytes rejected", n);
    char err[ERR_LEN] = "";
    uint8_t *c = malloc(n - 1);
    memcpy(c, b, n - 1);
    parse(c, n - 1, err);
    CHECK(strstr(err, "past the end") || strstr(err, "truncated"), "message names truncation: %s", err);
    free(c);
    free(b);
}

/* patch one field of a valid file and expect an error whose message contains `want` */
static void expect_error(const char *what, uint8_t *b, size_t n, const char *want) {
    char err[ERR_LEN] = "";
    int r = parse(b, n, err);
    CHECK(r == -1 && strstr(err, want), "%s: got r=%d '%s', want '%s'", what, r, err, want);
}

static size_t find(const uint8_t *b, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(b + i, s, k)) return i;
    return 0;
}

static void test_corrupt(void) {
    size_t n;
    uint8_t *b = sample_file(&n, 3, 32), *c = malloc(n);
    uint64_t big = 1ULL << 60;
    uint32_t u;

#define RESET() memcpy(c, b, n)
    RESET(), memcpy(c, "GGUX", 4), expect_error("magic", c, n, "not a GGUF file");
    RESET(), u = 1, memcpy(c + 4, &u, 4), expect_error("version 1", c, n, "version 1");
    RESET(), u = 4, memcpy(c + 4, &u, 4), expect_error("version 4", c, n, "version 4");
    RESET(), memcpy(c + 8, &big, 8), expect_error("tensor count", c, n, "tensor count");
    RESET(), memcpy(c + 16, &big, 8), expect_error("key count", c, n, "key count");
    /* the first key's length */
    RESET(), memcpy(c + 24, &big, 8), expect_error("key length", c, n, "truncated");
    /* a value type that does not exist */
    size_t at = find(b, n, "k.u8") + 4;
    RESET(), u = 77, memcpy(c + at, &u, 4), expect_error("value type", c, n, "unknown type");
    /* a nested array */
    at = find(b, n, "k.arr_i32") + 9 + 4;
    RESET(), u = GGUF_ARRAY, memcpy(c + at, &u, 4), expect_error("nested array", c, n, "not supported");
    /* an array length that overflows the byte count */
    uint64_t huge = 1ULL << 62;   /* times 4 bytes wraps around 2^64 */
    RESET(), memcpy(c + at + 4, &huge, 8), expect_error("array length", c, n, "overflows");
    /* string array count beyond the file */
    at = find(b, n, "k.arr_str") + 9 + 4 + 4;
    RESET(), memcpy(c + at, &big, 8), expect_error("string count", c, n, "cannot fit");
    /* a duplicate key: rename k.i8 to k.u8 */
    at = find(b, n, "k.i8");
    RESET(), memcpy(c + at, "k.u8", 4), expect_error("duplicate key", c, n, "duplicate key");
    /* tensor infos: n_dims, a dim, the type, the offset */
    at = find(b, n, "t.f32") + 5;
    RESET(), u = 5, memcpy(c + at, &u, 4), expect_error("n_dims", c, n, "dimensions");
    RESET(), memcpy(c + at + 4, &big, 8), memcpy(c + at + 12, &big, 8), expect_error("dims overflow", c, n, "overflow");
    RESET(), u = 99, memcpy(c + at + 20, &u, 4), expect_error("tensor type", c, n, "unknown tensor type");
    uint64_t off = 4;
    RESET(), memcpy(c + at + 24, &off, 8), expect_error("misaligned", c, n, "not aligned");
    off = 1ULL << 40;
    RESET(), memcpy(c + at + 24, &off, 8), expect_error("offset past end", c, n, "past the end");
    at = find(b, n, "t.q8") + 4;
    uint64_t d = 48;   /* not a whole number of Q8_0 blocks */
    RESET(), memcpy(c + at + 4, &d, 8), expect_error("partial block", c, n, "whole number");
    /* a duplicate tensor name, a bad alignment value and type: small fresh files */
    {
        GW g;
        gw_init(&g);
        float z[4] = {0};
        int64_t ne[1] = {4};
        gw_tensor(&g, "dup", GGML_F32, 1, ne, z, 16);
        gw_tensor(&g, "dup", GGML_F32, 1, ne, z, 16);
        size_t m;
        uint8_t *f = gw_finish(&g, &m);
        expect_error("duplicate tensor", f, m, "duplicate tensor");
        free(f);
        gw_free(&g);
        gw_init(&g);
        gw_u32(&g, "general.alignment", 24);
        f = gw_finish(&g, &m);
        expect_error("alignment", f, m, "power of two");
        free(f);
        gw_free(&g);
        gw_init(&g);
        gw_string(&g, "general.alignment", "x");
        f = gw_finish(&g, &m);
        expect_error("alignment type", f, m, "must be u32");
        free(f);
        gw_free(&g);
    }
#undef RESET
    free(c);
    free(b);
}

/* random byte flips: any outcome but a crash (ASan builds check the reads) */
static void test_flips(void) {
    size_t n;
    uint8_t *b = sample_file(&n, 3, 32), *c = malloc(n);
    uint64_t rng = 12345;
    int ok = 0, bad = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(c, b, n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ULL + 1;
            c[(rng >> 33) % n] ^= (uint8_t)(1u << ((rng >> 20) & 7));
        }
        char err[ERR_LEN] = "";
        if (parse(c, n, err) == 0) ok++;
        else {
            bad++;
            CHECK(err[0], "an error has a message");
        }
    }
    CHECK(ok > 0 && bad > 0, "3000 mutated files: both kinds met, %d parsed, %d rejected", ok, bad);
    free(c);
    free(b);
}

/* files on disk: missing, a directory, too small */
static void test_files(void) {
    GGUF g;
    char err[ERR_LEN] = "";
    CHECK(build_gguf(&g, "tests/data/does-not-exist.gguf", err) == -1 && strstr(err, "cannot open"), "%s", err);
    CHECK(build_gguf(&g, "tests", err) == -1 && strstr(err, "not a regular file"), "%s", err);
    write_file("tests/bin/tiny.bin", "GGUF", 4);
    CHECK(build_gguf(&g, "tests/bin/tiny.bin", err) == -1 && strstr(err, "truncated"), "%s", err);
}

/* bounds that mutation testing found unguarded: a string running past the end of a file with
 * no tensors, a tensor of 0 dimensions, a u64 past INT64_MAX read as an integer */
static int parse_mem(const uint8_t *b, size_t n, char *err) {
    GGUF g;
    int r = build_gguf_from_memory(&g, b, n, "mem.gguf", err);
    if (r == 0) free_gguf(&g);
    return r;
}

static void test_bounds(void) {
    Buf b = {0};
    buf_put(&b, "GGUF", 4), w_u32(&b, 3), w_u64(&b, 0), w_u64(&b, 1);
    w_str(&b, "k"), w_u32(&b, GGUF_STRING), w_u64(&b, 1000), buf_put(&b, "hello", 5);
    uint8_t *c = malloc(b.n);   /* exactly the file's bytes: a read past them is ASan's to see */
    memcpy(c, b.b, b.n);
    char err[ERR_LEN] = "";
    int r = parse_mem(c, b.n, err);
    CHECK(r == -1 && strstr(err, "truncated"), "a 1000-byte string in a %zu-byte file: got '%s'", b.n, err);
    free(c), free(b.b);

    GW g;
    gw_init(&g);
    float z[1] = {0};
    gw_tensor(&g, "t", GGML_F32, 0, NULL, z, 4);
    size_t n;
    uint8_t *f = gw_finish(&g, &n);
    err[0] = 0;
    r = parse_mem(f, n, err);
    CHECK(r == -1 && strstr(err, "dimensions"), "a tensor of 0 dimensions: got '%s'", err);
    free(f), gw_free(&g);

    gw_init(&g);
    uint64_t big = 1ULL << 63;
    gw_key(&g, "k.big", GGUF_U64), buf_put(&g.kv, &big, 8);
    f = gw_finish(&g, &n);
    GGUF gg;
    int64_t v = 0;
    r = build_gguf_from_memory(&gg, f, n, "mem.gguf", err);
    int got = r == 0 ? gguf_get_int(&gg, "k.big", &v) : 99;
    CHECK(r == 0 && got == -1, "gguf_get_int of a u64 of 2^63 is no int64: got %d", got);
    if (r == 0) free_gguf(&gg);
    free(f), gw_free(&g);
}

/* found by an adversarial review: tensors sharing bytes, a byte size that wraps (2^62 F32
 * elements: 2^64 bytes), and a header of many keys, whose duplicate check must be no pairwise
 * scan (200,000 keys took 78 s that way; sorted, a moment) */
static void test_layout(void) {
    GW g;
    size_t n;
    char err[ERR_LEN] = "";
    float z[8] = {0};
    int64_t ne[1] = {8};
    gw_init(&g);
    gw_tensor(&g, "a", GGML_F32, 1, ne, z, sizeof z);
    gw_tensor(&g, "b", GGML_F32, 1, ne, z, sizeof z);
    uint8_t *f = gw_finish(&g, &n);
    size_t at = find(f, n, "b") + 1 + 4 + 8 + 4;   /* b's offset: after its name, n_dims, ne[0] and type */
    uint64_t off;
    memcpy(&off, f + at, 8);
    CHECK(off == 32 && parse_mem(f, n, err) == 0, "two tensors one after the other parse (b at %llu): %s",
          (unsigned long long)off, err);
    off = 0;   /* b on a's bytes */
    memcpy(f + at, &off, 8);
    int r = parse_mem(f, n, err);
    CHECK(r == -1 && strstr(err, "tensors 'a' and 'b' share bytes"), "b at a's offset: got '%s'", err);
    free(f), gw_free(&g);

    gw_init(&g);
    int64_t huge[1] = {(int64_t)1 << 62};
    gw_tensor(&g, "huge", GGML_F32, 1, huge, z, 0);
    f = gw_finish(&g, &n);
    r = parse_mem(f, n, err);
    CHECK(r == -1 && strstr(err, "byte size overflows"), "2^62 F32 elements: got '%s'", err);
    free(f), gw_free(&g);

    /* the duplicate-key check is linear: 10 times the keys take about 10 times as long, where a
       pairwise check takes 100 (a ratio against the smaller run, with 2 s of slack for noise) */
    double t_small = 0;
    for (int run = 0; run < 3; run++) {
        int nkeys = run == 0 ? 20000 : 200000, dup = run == 2;
        gw_init(&g);
        char key[32];
        for (int i = 0; i < nkeys; i++) {
            snprintf(key, sizeof key, "k%d", dup && i == nkeys - 1 ? 77 : i);   /* the last repeats key 77 */
            gw_key(&g, key, GGUF_U8), buf_put(&g.kv, "", 1);
        }
        f = gw_finish(&g, &n);
        double t0 = now_s();
        err[0] = 0;
        r = parse_mem(f, n, err);
        double t = now_s() - t0;
        if (dup) CHECK(r == -1 && strstr(err, "duplicate key 'k77'"), "%d keys, the last a repeat: got '%s'", nkeys, err);
        else CHECK(r == 0, "%d distinct keys parse: got '%s'", nkeys, err);
        if (run == 0) t_small = t;
        else CHECK(t < 50 * t_small + 2.0, "%d keys parsed in %.3f s, 20,000 in %.3f s: linear, not pairwise", nkeys, t, t_small);
        free(f), gw_free(&g);
    }
}

int main(void) {
    test_bounds();
    test_valid(3, 32);
    test_valid(2, 32);
    test_valid(3, 64);
    test_truncation();
    test_corrupt();
    test_flips();
    test_files();
    test_layout();
    return check_summary();
}
