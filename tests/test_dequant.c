/* test_dequant.c - tests (and an optional benchmark) for the dequantizers in model.c
 *
 *   gcc -O2 -Wall -Wextra -std=c11 -g -fsanitize=address,undefined tests/test_dequant.c -lm
 *   ./a.out [reference.gguf]          default tests/data/dequant_ref.gguf
 *   ./a.out --bench                   matvec bandwidth (build with -O3 -march=native)
 *
 * The reference file holds, per type T, `q.T` (raw blocks, 4 x 512) and `f.T`
 * (F32, the values gguf-py's dequantize gives). Dequantization must match it
 * bit for bit; a mismatch within 1e-6 * max|expected| is reported but tolerated
 * (FMA contraction, e.g. -std=gnu11 -march=native, can change the last bit).
 */
#define _GNU_SOURCE   /* model.c's feature set (sched_getaffinity), set before any header */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define TESTING
#include "../model.c"
#include "../ra.c"

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    if (ok) n_pass++;
    else { n_fail++; printf("FAIL: %s\n", what); }
}

/* ----------------------------------------------------------------------------
 * fp16 / bf16 */

static int same_f(float a, float b) { return f32_bits(a) == f32_bits(b); }

static void test_fp16(void) {
    char msg[128];
    /* known values */
    check(same_f(fp16_to_fp32(0x0000), 0.0f) && same_f(fp16_to_fp32(0x8000), -0.0f), "fp16 +-0");
    check(fp16_to_fp32(0x3c00) == 1.0f && fp16_to_fp32(0xc000) == -2.0f, "fp16 1, -2");
    check(fp16_to_fp32(0x0001) == 0x1p-24f, "fp16 min subnormal");
    check(fp16_to_fp32(0x03ff) == 1023 * 0x1p-24f, "fp16 max subnormal");
    check(fp16_to_fp32(0x0400) == 0x1p-14f, "fp16 min normal");
    check(fp16_to_fp32(0x7bff) == 65504.0f, "fp16 max");
    check(isinf(fp16_to_fp32(0x7c00)) && fp16_to_fp32(0xfc00) < 0 && isinf(fp16_to_fp32(0xfc00)), "fp16 inf");
    check(isnan(fp16_to_fp32(0x7e00)) && isnan(fp16_to_fp32(0x7c01)) && isnan(fp16_to_fp32(0xfe00)), "fp16 nan");
    check(fp32_to_fp16(1.0f) == 0x3c00 && fp32_to_fp16(-0.0f) == 0x8000, "to fp16 1, -0");
    check(fp32_to_fp16(65504.0f) == 0x7bff && fp32_to_fp16(65519.0f) == 0x7bff, "to fp16 max");
    check(fp32_to_fp16(65520.0f) == 0x7c00 && fp32_to_fp16(1e9f) == 0x7c00 && fp32_to_fp16(-1e30f) == 0xfc00, "to fp16 overflow");
    check(fp32_to_fp16(INFINITY) == 0x7c00 && fp32_to_fp16(-INFINITY) == 0xfc00, "to fp16 inf");
    check((fp32_to_fp16(NAN) & 0x7c00) == 0x7c00 && (fp32_to_fp16(NAN) & 0x3ff) != 0, "to fp16 nan");
    check(fp32_to_fp16(0x1p-25f) == 0x0000 && fp32_to_fp16(0x1.0002p-25f) == 0x0001, "to fp16 tiny");
    check(fp32_to_fp16(3 * 0x1p-25f) == 0x0002 && fp32_to_fp16(5 * 0x1p-25f) == 0x0002, "to fp16 subnormal ties to even");
    check(fp32_to_fp16(1.0f + 0x1p-11f) == 0x3c00 && fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02, "to fp16 normal ties to even");
    check(fp32_to_fp16(0x1.ffcp-15f) == 0x0400, "to fp16 rounds up into min normal");
    check(fp32_to_fp16(1e-10f) == 0 && fp32_to_fp16(-1e-10f) == 0x8000, "to fp16 underflow");
    /* exhaustive: portable == public, and round trip */
#ifndef __F16C__
    printf("fp16: built without F16C, the public conversions are the portable ones: the checks of "
           "portable == public compare them with themselves (round trips and rounding still checked)\n");
#endif
    int bad_port = 0, bad_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = fp16_to_fp32_portable((uint16_t)h), b = fp16_to_fp32((uint16_t)h);
        int nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        if (nan) { bad_port += !(isnan(a) && isnan(b)); bad_trip += !isnan(fp16_to_fp32(fp32_to_fp16(a))); continue; }
        bad_port += !same_f(a, b);
        bad_trip += fp32_to_fp16(a) != h || fp32_to_fp16_portable(a) != h;
    }
    snprintf(msg, sizeof msg, "fp16 all 65536: %d portable mismatches, %d round-trip failures", bad_port, bad_trip);
    check(bad_port == 0 && bad_trip == 0, msg);
    /* random floats (all exponents): portable rounding == public (F16C when built with it) */
    uint32_t s = 12345;
    int bad_rnd = 0;
    for (int i = 0; i < 2000000; i++) {
        s = s * 1664525u + 1013904223u;
        float f = f32_from_bits(s);
        if (isnan(f)) continue;
        bad_rnd += fp32_to_fp16_portable(f) != fp32_to_fp16(f);
        /* independent check of rounding against the neighbours in double */
        if (i % 16 == 0 && fabsf(f) < 65504.0f) {
            double v = f, r = fp16_to_fp32(fp32_to_fp16(f));
            uint16_t h = fp32_to_fp16(f);
            double up = fp16_to_fp32((uint16_t)(h + 1)), dn = h & 0x7fff ? fp16_to_fp32((uint16_t)(h - 1)) : -r;
            bad_rnd += fabs(v - r) > fabs(v - up) || fabs(v - r) > fabs(v - dn);
        }
    }
    snprintf(msg, sizeof msg, "fp32->fp16 random: %d mismatches", bad_rnd);
    check(bad_rnd == 0, msg);
    /* bf16 */
    check(bf16_to_fp32(0x3f80) == 1.0f && bf16_to_fp32(0xc040) == -3.0f, "bf16 1, -3");
    check(bf16_to_fp32(0x0001) == 0x1p-133f && bf16_to_fp32(0x7f7f) == 0x1.fep127f, "bf16 subnormal, max");
    check(isinf(bf16_to_fp32(0x7f80)) && isnan(bf16_to_fp32(0x7fc0)) && same_f(bf16_to_fp32(0x8000), -0.0f), "bf16 inf nan -0");
}

/* ----------------------------------------------------------------------------
 * Table and error paths */

static void test_table(void) {
    struct { uint32_t t; int64_t bytes512; } want[] = {
        {GGML_F32, 2048}, {GGML_F16, 1024}, {GGML_BF16, 1024}, {GGML_Q4_0, 288}, {GGML_Q4_1, 320},
        {GGML_Q5_0, 352}, {GGML_Q5_1, 384}, {GGML_Q8_0, 544}, {GGML_Q8_1, 576}, {GGML_Q2_K, 168},
        {GGML_Q3_K, 220}, {GGML_Q4_K, 288}, {GGML_Q5_K, 352}, {GGML_Q6_K, 420}, {GGML_Q8_K, 584},
    };
    char msg[96];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(msg, sizeof msg, "type_row_bytes(%s, 512)", type_info(want[i].t)->name);
        check(type_row_bytes(want[i].t, 512) == want[i].bytes512, msg);
    }
    check(type_row_bytes(GGML_Q4_0, 100) == -1 && type_row_bytes(GGML_Q4_K, 576) == -1, "row bytes: n not a block multiple");
    check(type_row_bytes(GGML_F16, 7) == 14 && type_row_bytes(GGML_Q8_0, 0) == 0, "row bytes: odd n for F16, n=0");
    check(type_row_bytes(4, 32) == -1 && type_row_bytes(40, 32) == -1 && type_row_bytes(1u << 31, 32) == -1, "row bytes: unknown type");
    check(type_info(40) == NULL && type_info(0xffffffffu) == NULL, "type_info out of table");
    check(strcmp(type_info(GGML_Q8_K)->name, "Q8_K") == 0 && !type_info(GGML_Q8_K)->supported, "Q8_K named, unsupported");
    check(strcmp(type_info(GGML_IQ4_XS)->name, "IQ4_XS") == 0 && type_info(GGML_IQ4_XS)->supported &&
          strcmp(type_info(GGML_IQ4_NL)->name, "IQ4_NL") == 0 && type_info(GGML_IQ4_NL)->supported &&
          strcmp(type_info(39)->name, "MXFP4") == 0, "IQ names");
    check(type_row_bytes(GGML_IQ4_NL, 512) == 288 && type_row_bytes(GGML_IQ4_XS, 512) == 272, "row bytes: IQ4_NL, IQ4_XS");
    float buf[256] = {0}, y[2] = {7, 7};
    uint8_t blk[512] = {0};
    /* the grid types (IQ1-IQ3: lookup tables of 256 to 2,048 entries), Q8_1/Q8_K (ggml's own
       activation types), retired ids, unknown ids */
    uint32_t unsup[] = {GGML_Q8_1, GGML_Q8_K, 4, 16, 17, 18, 19, 21, 22, 24, 29, 34, 39, 40, 1000};
    int all = 1;
    for (size_t i = 0; i < sizeof unsup / sizeof unsup[0]; i++) all &= dequantize_row(unsup[i], blk, buf, 256) == -1;
    check(all, "dequantize_row returns -1 for unsupported types");
    check(dequantize_row(GGML_Q4_0, blk, buf, 48) == -1, "dequantize_row: n not a block multiple");
    matvec_rows(GGML_Q8_K, blk, 256, buf, y, 0, 2);
    check(y[0] == 7 && y[1] == 7, "matvec_rows leaves y alone for unsupported types");
}

/* ----------------------------------------------------------------------------
 * Hand-built blocks: a check of each layout that does not need the reference
 * file. Values are chosen so every field (high scale bits, qh bits) matters. */

static void put_f16(uint8_t *p, float f) { uint16_t h = fp32_to_fp16(f); p[0] = h & 0xff; p[1] = h >> 8; }

static void test_handmade(void) {
    uint8_t b[256];
    float y[256];
    /* Q4_0: d=0.5, element j has nibble j%16 */
    memset(b, 0, sizeof b); put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    dequantize_row(GGML_Q4_0, b, y, 32);
    int ok = 1;
    for (int j = 0; j < 16; j++) ok &= y[j] == 0.5f * (j - 8) && y[16 + j] == 0.5f * (7 - j);
    check(ok, "Q4_0 hand block");
    /* Q5_1: d=2, m=-1, qh bit j set for odd j */
    memset(b, 0, sizeof b); put_f16(b, 2.0f); put_f16(b + 2, -1.0f);
    b[4] = b[5] = b[6] = b[7] = 0xaa;
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)(j | j << 4);
    dequantize_row(GGML_Q5_1, b, y, 32);
    ok = 1;
    for (int j = 0; j < 32; j++) ok &= y[j] == 2.0f * ((j % 16) + 16 * (j & 1)) - 1.0f;
    check(ok, "Q5_1 hand block");
    /* Q8_0: d=0.25, qs = -128..-97 */
    memset(b, 0, sizeof b); put_f16(b, 0.25f);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(-128 + j);
    dequantize_row(GGML_Q8_0, b, y, 32);
    ok = 1;
    for (int j = 0; j < 32; j++) ok &= y[j] == 0.25f * (-128 + j);
    check(ok, "Q8_0 hand block");
    /* Q4_K: d=1, dmin=1, sub-block s has scale 40+s and min 20+3s (exercising
       the high bits of sub-blocks 4..7), all nibbles 3 */
    memset(b, 0, sizeof b); put_f16(b, 1.0f); put_f16(b + 2, 1.0f);
    int sc[8], mn[8];
    for (int s = 0; s < 8; s++) { sc[s] = 40 + s; mn[s] = 20 + 3 * s; }
    uint8_t *S = b + 4;
    for (int s = 0; s < 4; s++) {
        S[s] = (uint8_t)(sc[s] | (sc[s + 4] >> 4) << 6);
        S[s + 4] = (uint8_t)(mn[s] | (mn[s + 4] >> 4) << 6);
        S[s + 8] = (uint8_t)((sc[s + 4] & 15) | (mn[s + 4] & 15) << 4);
    }
    memset(b + 16, 0x33, 128);
    dequantize_row(GGML_Q4_K, b, y, 256);
    ok = 1;
    for (int i = 0; i < 256; i++) ok &= y[i] == (float)(sc[i / 32] * 3 - mn[i / 32]);
    check(ok, "Q4_K hand block (packed 6-bit scales)");
    /* Q6_K: d=0.5, scale s = s-8, element i has q = (i*7)%64 */
    memset(b, 0, sizeof b);
    for (int i = 0; i < 256; i++) {
        int q = (i * 7) % 64, h = i / 128, r = i % 128, part = r / 32, l = r % 32;
        uint8_t *ql = b + 64 * h + l + (part & 1) * 32, *qh = b + 128 + 32 * h + l;
        *ql |= (uint8_t)(part < 2 ? (q & 15) : (q & 15) << 4);
        *qh |= (uint8_t)((q >> 4) << (2 * part));
    }
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)(s - 8);
    put_f16(b + 208, 0.5f);
    dequantize_row(GGML_Q6_K, b, y, 256);
    ok = 1;
    for (int i = 0; i < 256; i++) ok &= y[i] == 0.5f * (float)(i / 16 - 8) * (float)((i * 7) % 64 - 32);
    check(ok, "Q6_K hand block");
    /* Q2_K: d=1, dmin=0.5, sub-block s has scale s and min 15-s, element i has q = i%4 */
    memset(b, 0, sizeof b);
    for (int s = 0; s < 16; s++) b[s] = (uint8_t)(s | (15 - s) << 4);
    for (int i = 0; i < 256; i++) b[16 + 32 * (i / 128) + i % 32] |= (uint8_t)((i % 4) << (2 * (i % 128 / 32)));
    put_f16(b + 80, 1.0f); put_f16(b + 82, 0.5f);
    dequantize_row(GGML_Q2_K, b, y, 256);
    ok = 1;
    for (int i = 0; i < 256; i++) ok &= y[i] == (float)(i / 16) * (float)(i % 4) - 0.5f * (float)(15 - i / 16);
    check(ok, "Q2_K hand block");
    /* Q3_K: d=0.25, sub-block s has the 6-bit scale 4s+3 (its two top bits take every value);
       element i has 2 low bits i%4 and its high bit set for odd i / 32 + i / 128 (q = i%4 or
       i%4 - 4) */
    memset(b, 0, sizeof b);
    for (int s = 0; s < 16; s++) {
        int v = 4 * s + 3;
        b[96 + s % 8] |= (uint8_t)((v & 15) << (s < 8 ? 0 : 4));
        b[96 + 8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
    }
    for (int i = 0; i < 256; i++) {
        int h = i / 128, j = i % 128 / 32, l = i % 32;
        b[32 + 32 * h + l] |= (uint8_t)((i % 4) << (2 * j));
        if ((i / 32 + h) % 2) b[l] |= (uint8_t)(1 << (4 * h + j));
    }
    put_f16(b + 108, 0.25f);
    dequantize_row(GGML_Q3_K, b, y, 256);
    ok = 1;
    for (int i = 0; i < 256; i++) {
        int q = i % 4 - ((i / 32 + i / 128) % 2 ? 0 : 4);
        ok &= y[i] == 0.25f * (float)(4 * (i / 16) + 3 - 32) * (float)q;
    }
    check(ok, "Q3_K hand block (packed 6-bit scales, high bits)");
    /* IQ4_NL: d=2, element j has nibble j%16: the whole grid */
    static const int kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    memset(b, 0, sizeof b); put_f16(b, 2.0f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    dequantize_row(GGML_IQ4_NL, b, y, 32);
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= y[j] == 2.0f * (float)kv[j] && y[16 + j] == 2.0f * (float)kv[15 - j];
    check(ok, "IQ4_NL hand block");
    /* IQ4_XS: d=0.5, sub-block s has the 6-bit scale 8s+5 (top bits: every value), element i
       has nibble i%16 */
    memset(b, 0, sizeof b); put_f16(b, 0.5f);
    for (int s = 0; s < 8; s++) {
        int v = 8 * s + 5;
        b[4 + s / 2] |= (uint8_t)((v & 15) << (4 * (s % 2)));
        b[2 + s / 4] |= (uint8_t)((v >> 4) << (2 * (s % 4)));   /* scales_h, little-endian */
    }
    for (int s = 0; s < 8; s++)
        for (int j = 0; j < 16; j++) b[8 + 16 * s + j] = (uint8_t)(j | j << 4);
    dequantize_row(GGML_IQ4_XS, b, y, 256);
    ok = 1;
    for (int i = 0; i < 256; i++) ok &= y[i] == 0.5f * (float)(8 * (i / 32) + 5 - 32) * (float)kv[i % 16];
    check(ok, "IQ4_XS hand block (6-bit scales, high bits)");
}

/* ----------------------------------------------------------------------------
 * Reference file from gguf-py */

static const uint32_t REF_TYPES[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                     GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                     GGML_Q2_K, GGML_Q3_K, GGML_IQ4_NL, GGML_IQ4_XS};

/* y = W x for all rows in double, from dequantized W; also sum |w x| per row */
static void ref_matvec(const float *w, const float *x, int rows, int n, double *y, double *mag) {
    for (int r = 0; r < rows; r++) {
        y[r] = mag[r] = 0;
        for (int i = 0; i < n; i++) { y[r] += (double)w[r * n + i] * x[i]; mag[r] += fabs((double)w[r * n + i] * x[i]); }
    }
}

static void check_matvec(uint32_t t, const void *q, const float *deq, int rows, int n, const char *tag) {
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)(rows + 2));
    double yr[8], mag[8];
    /* x in [-1,1] / max|w| so that F32/BF16 rows of random bits (up to ~3e38) cannot overflow */
    double maxw = 1;
    for (int i = 0; i < rows * n; i++) maxw = fmax(maxw, fabs(deq[i]));
    uint32_t s = 777;
    for (int i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; x[i] = (float)(((s >> 8) / 16777216.0 * 2 - 1) / maxw); }
    ref_matvec(deq, x, rows, n, yr, mag);
    for (int i = 0; i < rows + 2; i++) y[i] = -99.0f;
    matvec_rows(t, q, n, x, y, 0, rows);
    double worst = 0;
    for (int r = 0; r < rows; r++) worst = fmax(worst, fabs(y[r] - yr[r]) / (mag[r] + 1e-30));
    char msg[128];
    snprintf(msg, sizeof msg, "%s matvec_rows vs dequantize+dot: worst |err|/sum|w*x| = %.2e", tag, worst);
    check(worst <= 1e-5, msg);
    printf("  %-4s matvec worst |err|/sum|w*x| = %.2e\n", tag, worst);
    /* a sub-range writes only its own rows */
    for (int i = 0; i < rows + 2; i++) y[i] = -99.0f;
    matvec_rows(t, q, n, x, y, 1, rows - 1);
    check(y[0] == -99.0f && y[rows - 1] == -99.0f && y[1] != -99.0f, "matvec_rows sub-range");
    free(x); free(y);
}

/* random rows of every supported type, at sizes the reference file lacks:
   n not a multiple of 32 (F32/F16/BF16) and n > 1024 (several generic chunks) */
static void test_matvec_sizes(void) {
    static const uint32_t types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                     GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                     GGML_Q2_K, GGML_Q3_K, GGML_IQ4_NL, GGML_IQ4_XS};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        const TypeInfo *ti = type_info(t);
        int rows = 3, n = ti->block_elems == 1 ? 1111 : 1280;
        int64_t rb = type_row_bytes(t, n);
        if (rb <= 0) { check(0, "row bytes of a supported type"); continue; }
        uint8_t *q = malloc((size_t)(rb * rows));
        float *w = malloc(sizeof(float) * (size_t)(rows * n));
        uint32_t s = 99 + t;
        for (int64_t i = 0; i < rb * rows; i++) { s = s * 1664525u + 1013904223u; q[i] = (uint8_t)(s >> 24); }
        for (int64_t b = 0; b < rb * rows / ti->block_bytes; b++) {   /* sane scales / values */
            uint8_t *p = q + b * ti->block_bytes;
            float v = (float)(b % 17) / 8 - 1;
            if (t == GGML_F32) memcpy(p, &v, 4);
            else if (t == GGML_F16) put_f16(p, v);
            else if (t == GGML_BF16) { uint32_t u = f32_bits(v); p[0] = (uint8_t)(u >> 16); p[1] = (uint8_t)(u >> 24); }
            else if (t == GGML_Q6_K) put_f16(p + 208, 0.01f * (float)(b % 5 + 1));
            else if (t == GGML_Q2_K) put_f16(p + 80, 0.01f * (float)(b % 5 + 1)), put_f16(p + 82, -0.02f);
            else if (t == GGML_Q3_K) put_f16(p + 108, 0.01f * (float)(b % 5 + 1));
            else {
                put_f16(p, 0.01f * (float)(b % 5 + 1));
                if (t == GGML_Q4_1 || t == GGML_Q5_1 || t == GGML_Q4_K || t == GGML_Q5_K) put_f16(p + 2, -0.02f);
            }
        }
        for (int r = 0; r < rows; r++) dequantize_row(t, q + r * rb, w + (int64_t)r * n, n);
        char tag[48];
        snprintf(tag, sizeof tag, "%s n=%d", ti->name, n);
        check_matvec(t, q, w, rows, n, tag);
        free(q); free(w);
    }
}

/* The AVX2 kernels of Q4_0, Q4_1, Q8_0, the K types, IQ4_NL and IQ4_XS (matvec_rows takes them where they are built)
 * give the plain kernels' bits for every row: random quants, scales from fp16 subnormals to
 * 65504 with either sign, rows of 1 to 128 blocks, x with a wide range of magnitudes. */
static void test_matvec_avx2_bits(void) {
#if HAVE_DOT_AVX2
    static const uint32_t types[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                     GGML_Q2_K, GGML_Q3_K, GGML_IQ4_NL, GGML_IQ4_XS};
    static const int blocks[] = {1, 2, 3, 18, 128};
    static const float scales[] = {6e-8f, 1e-3f, 0.01f, -0.37f, 3.5f, -65504.0f};
    uint32_t s = 2024;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        const TypeInfo *ti = type_info(t);
        int rows = 16, differ = 0, total = 0, finite = 0;
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            int n = blocks[bi] * (int)ti->block_elems;
            int64_t rb = type_row_bytes(t, n);
            if (rb <= 0) { check(0, "row bytes of a supported type"); continue; }
            uint8_t *q = malloc((size_t)(rb * rows));
            float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)rows);
            for (int64_t i = 0; i < rb * rows; i++) { s = s * 1664525u + 1013904223u; q[i] = (uint8_t)(s >> 24); }
            for (int64_t b = 0; b < rb * rows / ti->block_bytes; b++) {
                uint8_t *p = q + b * ti->block_bytes;
                int at = t == GGML_Q2_K ? 80 : t == GGML_Q3_K ? 108 : t == GGML_Q6_K ? 208 : 0;   /* d, then the min's scale */
                put_f16(p + at, scales[b % 6]);
                if (t == GGML_Q4_1 || t == GGML_Q4_K || t == GGML_Q5_K || t == GGML_Q2_K) put_f16(p + at + 2, -scales[(b + 1) % 6]);   /* finite, as every scale */
            }
            for (int i = 0; i < n; i++) {
                s = s * 1664525u + 1013904223u;
                x[i] = (float)(((s >> 8) / 16777216.0 * 2 - 1) * pow(10, (int)(s % 7) - 3));
            }
            matvec_rows(t, q, n, x, y, 0, rows);
            for (int r = 0; r < rows; r++) {
                const uint8_t *row = q + r * rb;
                float want = t == GGML_Q8_0 ? dot_q8_0(row, x, n)
                           : t == GGML_Q4_K || t == GGML_Q5_K ? dot_q45_k(row, (int)ti->block_bytes, x, n)
                           : t == GGML_Q6_K ? dot_q6_k(row, x, n)
                           : t == GGML_Q2_K ? dot_q2_k(row, x, n) : t == GGML_Q3_K ? dot_q3_k(row, x, n)
                           : t == GGML_IQ4_NL ? dot_iq4_nl(row, x, n) : t == GGML_IQ4_XS ? dot_iq4_xs(row, x, n)
                           : dot_q45(row, (int)ti->block_bytes, x, n);
                differ += memcmp(&want, &y[r], 4) != 0;
                finite += isfinite(want) != 0;   /* a NaN's sign may depend on the operand order */
                total++;
            }
            free(q); free(x); free(y);
        }
        char msg[128];
        snprintf(msg, sizeof msg, "%s: the AVX2 matvec kernel gives the plain kernel's bits (%d of %d rows differ, "
                 "%d finite)", ti->name, differ, total, finite);
        check(differ == 0 && finite == total, msg);
    }
#else
    printf("  (no AVX2 matvec kernels in this build, which need AVX2, FMA and gcc's FP_FAST_FMAF: "
           "matvec_rows runs the plain kernels, nothing to compare)\n");
#endif
}

static void test_reference(const char *path) {
    GGUF g;
    char msg[160], err[ERR_LEN];
    if (build_gguf(&g, path, err) != 0) {
        printf("%s\n", err);
        check(0, "load reference gguf");
        return;
    }
    for (size_t k = 0; k < sizeof REF_TYPES / sizeof REF_TYPES[0]; k++) {
        uint32_t t = REF_TYPES[k];
        const char *tn = type_info(t)->name;
        char qn[32], fn[32];
        snprintf(qn, sizeof qn, "q.%s", tn); snprintf(fn, sizeof fn, "f.%s", tn);
        const GGUFTensor *qi = gguf_tensor(&g, qn), *fi = gguf_tensor(&g, fn);
        snprintf(msg, sizeof msg, "%s: tensors present with type %u, 512 x 4", tn, t);
        int ok = qi && fi && qi->type == t && fi->type == GGML_F32 && qi->n_dims == 2 && fi->n_dims == 2
                 && qi->ne[0] == 512 && qi->ne[1] == 4 && fi->ne[0] == 512 && fi->ne[1] == 4;
        check(ok, msg);
        if (!ok) continue;
        int n = 512, rows = 4;
        int64_t rb = type_row_bytes(t, n);
        const uint8_t *q = qi->data;
        const float *want = fi->data;
        float got[2048];
        ok = 1;
        for (int r = 0; r < rows; r++) ok &= dequantize_row(t, q + r * rb, got + r * n, n) == 0;
        int nexact = 0, nfinite = 0;
        double maxabs = 0, maxdiff = 0;
        for (int i = 0; i < n * rows; i++) {
            float w;
            memcpy(&w, want + i, 4);
            nexact += same_f(got[i], w) || (isnan(got[i]) && isnan(w));
            if (isfinite(w)) { nfinite++; maxabs = fmax(maxabs, fabs(w)); maxdiff = fmax(maxdiff, fabs((double)got[i] - w)); }
        }
        printf("  %-4s %4d/%d bit-exact vs gguf-py, max diff %.3g (max|expected| %.3g)\n",
               tn, nexact, n * rows, maxdiff, maxabs);
        snprintf(msg, sizeof msg, "%s dequantize_row vs gguf-py (%d/%d bit-exact)", tn, nexact, n * rows);
        check(ok && nfinite == n * rows && (nexact == n * rows || maxdiff <= 1e-6 * maxabs), msg);
        float wf[2048];
        memcpy(wf, want, sizeof wf);
        check_matvec(t, q, wf, rows, n, tn);
    }
    free_gguf(&g);
}

/* ----------------------------------------------------------------------------
 * Benchmark: weight bytes streamed per second, single thread */


static void bench_one(uint32_t t, int rows, int n) {
    int64_t rb = type_row_bytes(t, n);
    if (rb <= 0) return;
    size_t bytes = (size_t)(rb * rows);
    uint8_t *w = malloc(bytes);
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * rows), *tmp = malloc(sizeof(float) * n);
    uint32_t s = 1;
    for (size_t i = 0; i < bytes; i++) { s = s * 1664525u + 1013904223u; w[i] = (uint8_t)(s >> 24); }
    /* make every fp16 scale field sane: rewrite the blocks' headers */
    const TypeInfo *ti = type_info(t);
    for (size_t b = 0; b < bytes / ti->block_bytes; b++) {
        uint8_t *p = w + b * ti->block_bytes;
        if (t == GGML_Q6_K) put_f16(p + 208, 0.01f);
        else if (t == GGML_Q2_K) put_f16(p + 80, 0.01f), put_f16(p + 82, 0.02f);
        else if (t == GGML_Q3_K) put_f16(p + 108, 0.01f);
        else if (t == GGML_F32) { float v = (float)(b % 13) - 6; memcpy(p, &v, 4); }
        else if (t == GGML_F16 || t == GGML_BF16) { p[0] = 0; p[1] = 0x3c; }
        else { put_f16(p, 0.01f); if (t == GGML_Q4_1 || t == GGML_Q4_K || t == GGML_Q5_K) put_f16(p + 2, 0.02f); }
    }
    for (int i = 0; i < n; i++) x[i] = (float)(i % 7) - 3;
    double best_f = 1e9, best_d = 1e9, target = 0.3;
    int reps = (int)(2e8 / bytes) + 1;
    for (double t0 = now_s(); now_s() - t0 < target;) {
        double a = now_s();
        for (int k = 0; k < reps; k++) matvec_rows(t, w, n, x, y, 0, rows);
        best_f = fmin(best_f, (now_s() - a) / reps);
    }
    float chk = y[rows / 2];
    for (double t0 = now_s(); now_s() - t0 < target;) {
        double a = now_s();
        for (int k = 0; k < reps; k++)
            for (int r = 0; r < rows; r++) { dequantize_row(t, w + r * rb, tmp, n); y[r] = dot_f32(tmp, x, n); }
        best_d = fmin(best_d, (now_s() - a) / reps);
    }
    printf("%-5s %6d x %-5d %8.2f MB  fused %6.2f GB/s (%7.1f us)   dequant+dot %6.2f GB/s   (y diff %.1e)\n",
           ti->name, rows, n, bytes / 1e6, bytes / best_f / 1e9, best_f * 1e6, bytes / best_d / 1e9,
           fabs(chk - y[rows / 2]) / (fabs(chk) + 1e-9));
    free(w); free(x); free(y); free(tmp);
}

static void bench(void) {
    bench_one(GGML_Q4_1, 1536, 576);
    bench_one(GGML_Q8_0, 49152, 576);
    bench_one(GGML_Q4_K, 576, 1536);
    bench_one(GGML_Q4_0, 1536, 576);
    bench_one(GGML_Q5_0, 1536, 576);
    bench_one(GGML_Q5_K, 576, 1536);
    bench_one(GGML_Q6_K, 576, 1536);
    bench_one(GGML_Q2_K, 576, 1536);
    bench_one(GGML_Q3_K, 576, 1536);
    bench_one(GGML_IQ4_NL, 1536, 576);
    bench_one(GGML_IQ4_XS, 576, 1536);
    bench_one(GGML_F16, 576, 576);
    bench_one(GGML_F32, 576, 576);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) { bench(); return 0; }
    test_fp16();
    test_table();
    test_handmade();
    test_matvec_sizes();
    test_matvec_avx2_bits();
    test_reference(argc > 1 ? argv[1] : "tests/data/dequant_ref.gguf");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
