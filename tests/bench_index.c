/* bench_index.c - recall@100 against the scan ratio of ra's indexes on queries and keys dumped
   from a real prompt (./ra --dump-qk DIR): Fig. 2b of the paper (§2.4: an index over the keys
   searched with decoding queries, Q->K, and with keys, K->K), with the attention-aware index of
   §3.2 (Fig. 3b) beside the IVF baseline. A benchmark: it prints numbers and asserts nothing.

   make tests/bin/bench_index
   tests/bin/bench_index DIR [options] > recall.csv
     -p L:H,L:H,...  (layer, query head) pairs (default: -s of them spread over the layers)
     -s N            number of default pairs (6)
     --pairs         print the pairs as a -p list and exit (the Faiss script takes the same)
     --ef LIST       RA beam widths (100,120,150,200,300,400,600,1000,1500,2000)
     --nprobe LIST   IVF lists probed (1,2,4,...: powers of two, then all lists)
     -g GTDIR        also write the exact top-100 of every query (int32, ids into the indexed keys)
     -t N            threads for the index builds (2)
     --nq N, --degree M  the RA index's Nq and out-degree bound (./ra's defaults: 100, 24)
     --q-stride S    build from every S-th prefill query (./ra's default, 0: ra_query_sample's)
     --ef-conn N     the beam of its connectivity step's searches (./ra's default:
                     ra_default_ef_conn(S))
     --conn-seed 0   those searches start at the entry alone (./ra's 1: also at the key's
                     neighbours in position, conn_seeds)
     --conn-search 1 the connectivity step links every key it reaches by a search with the key,
                     as RoarGraph (./ra's 0: by its top query's list, a search only without one)
     --entries N     searches walk on from N entry points (./ra's default 16, other_entries; 1: the
                     entry alone, as the paper)
     --qk-only       Q->K only (skip K->K and the IVF sweeps: tuning the RA graph)

   What is indexed (as ./ra --attn ra indexes a prompt, §3.3): the keys of positions
   [sink, n_prompt - window) of the KV head of query head H (H / group), built from the
   n_prompt prefill queries of head H with ra_default_params() (= ./ra's defaults: Nq 100,
   M 24, ra_query_sample's sample, 16 entry points); the IVF has 4 sqrt(n) lists and 10
   k-means steps, as ./ra --attn ivf. The queries are held out of the build. Q->K: that index, searched with the queries of the generated tokens.
   K->K (as Fig. 2b samples keys): the same keys less n_gen of them, evenly spaced (at most a
   tenth), indexed the same way and searched with the held-out keys. (The generated tokens' own
   keys are not an in-distribution sample: their text is new, and after a repetitive prompt their
   Mahalanobis distance to its keys is 2-3x a held-out key's, if half a query's: the K_gen rows
   of the Faiss script's Fig. 2c numbers.)
   Ground truth: the exact top-100 over the keys indexed (flat_topk). Output: CSV rows
     method,kind,layer,head,param,scan,recall
   method ra or ra_warm (param = ef; ra_warm: Q->K only, the queries in order, each search
   also started where the previous one ended, as ./ra by default) or ra_ivf (param = nprobe);
   kind QK or KK; scan = keys scored / keys indexed and recall = |found ∩ exact| / 100, both
   averaged over the queries. */

#define TESTING
#include "../model.c"
#include "../ra.c"

enum { TOPK = 100, MAX_LIST = 64, MAX_PAIRS = 256 };

/* ----------------------------------------------------------------------------
   The dump: meta.json and the float32 files */

typedef struct {
    const char *dir;
    int n_layers, n_heads, n_kv, hd, n_prompt, n_gen, sink, window;
    int n_global, global[MAX_PAIRS];   /* the layers whose keys are dumped (not sliding ones) */
} Dump;

static void bench_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench_index: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* the integer after "key": in a JSON text; fails when absent */
static int json_int(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    if (!p) bench_fail("meta.json has no \"%s\"", key);
    return (int)strtol(p + strlen(pat), NULL, 10);
}

static Dump read_dump(const char *dir) {
    char path[4200], text[8192];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) bench_fail("cannot open %s: %s (make it with ./ra --dump-qk %s)", path, strerror(errno), dir);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    Dump d = {dir, json_int(text, "n_layers"), json_int(text, "n_heads"), json_int(text, "n_kv"), json_int(text, "hd"),
              json_int(text, "n_prompt"), json_int(text, "n_gen"), json_int(text, "sink"), json_int(text, "window"), 0, {0}};
    const char *gl = strstr(text, "\"global_layers\": [");   /* absent in older dumps: all */
    for (int l = 0; !gl && l < d.n_layers && l < MAX_PAIRS; l++) d.global[d.n_global++] = l;
    for (char *end; gl && d.n_global < MAX_PAIRS; gl = end) {
        gl = strpbrk(gl, "0123456789]");
        if (!gl || *gl == ']') break;
        d.global[d.n_global++] = (int)strtol(gl, &end, 10);
    }
    if (d.n_kv < 1 || d.n_heads % d.n_kv || d.hd < 1 || d.n_gen < 1 || d.n_global < 1)
        bench_fail("%s: bad shape or no generated tokens (n_gen %d)", path, d.n_gen);
    if (d.n_prompt - d.window - d.sink < 2 * TOPK)
        bench_fail("%s: the prompt (%d tokens) leaves fewer than %d keys outside sink + window", path, d.n_prompt, 2 * TOPK);
    return d;
}

/* rows x hd floats of a dump file; fails unless the file has exactly that many */
static float *read_rows(const Dump *d, const char *name, int rows) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", d->dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) bench_fail("cannot open %s: %s", path, strerror(errno));
    size_t n = (size_t)rows * d->hd;
    float *x = xmalloc(n * sizeof *x);
    if (fread(x, sizeof *x, n, f) != n || fgetc(f) != EOF) bench_fail("%s: not %d rows of %d floats", path, rows, d->hd);
    fclose(f);
    return x;
}

/* ----------------------------------------------------------------------------
   Arguments */

typedef struct {
    const char *dir, *gt_dir;
    int pairs[MAX_PAIRS][2], n_pairs, n_default, list_pairs, threads;
    int ef[MAX_LIST], n_ef, nprobe[MAX_LIST], n_nprobe;
    int nq, degree, ef_conn, q_stride, qk_only;   /* RA build settings (0: ./ra's defaults); Q->K only */
    int conn_seed, conn_search;                    /* RAParams': -1 ./ra's default, 0 or 1 */
    int n_entry;                                   /* RAParams.n_entry (0: ./ra's default) */
} Args;

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || (*end && *end != ',')) bench_fail("bad list '%s'", s);
        out[n++] = (int)v;
    }
    return n;
}

static void parse_pairs(Args *a, const char *s) {
    for (char *end; *s && a->n_pairs < MAX_PAIRS; s = *end ? end + 1 : end) {
        long l = strtol(s, &end, 10), h = -1;
        if (*end == ':') h = strtol(end + 1, &end, 10);
        if (l < 0 || h < 0 || (*end && *end != ',')) bench_fail("bad pair list '%s' (want L:H,L:H,...)", s);
        a->pairs[a->n_pairs][0] = (int)l, a->pairs[a->n_pairs][1] = (int)h, a->n_pairs++;
    }
}

/* a flag's value that must be 0 or 1 */
static int parse_bit(const char *flag, const char *v) {
    if (strcmp(v, "0") && strcmp(v, "1")) bench_fail("%s takes 0 or 1, not '%s'", flag, v);
    return v[0] == '1';
}

static Args parse_args(int argc, char **argv) {
    Args a = {0};
    a.n_default = 6, a.threads = 2, a.conn_seed = -1, a.conn_search = -1;
    a.n_ef = parse_list("100,120,150,200,300,400,600,1000,1500,2000", a.ef, MAX_LIST);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(f, "--pairs") && strcmp(f, "--qk-only") && f[0] == '-';
        if (takes && !v) bench_fail("%s needs a value", f);
        if (!strcmp(f, "-p")) parse_pairs(&a, v);
        else if (!strcmp(f, "-s")) a.n_default = atoi(v);
        else if (!strcmp(f, "--pairs")) a.list_pairs = 1;
        else if (!strcmp(f, "--ef")) a.n_ef = parse_list(v, a.ef, MAX_LIST);
        else if (!strcmp(f, "--nprobe")) a.n_nprobe = parse_list(v, a.nprobe, MAX_LIST);
        else if (!strcmp(f, "-g")) a.gt_dir = v;
        else if (!strcmp(f, "-t")) a.threads = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(f, "--nq")) parse_list(v, &a.nq, 1);
        else if (!strcmp(f, "--degree")) parse_list(v, &a.degree, 1);
        else if (!strcmp(f, "--ef-conn")) parse_list(v, &a.ef_conn, 1);
        else if (!strcmp(f, "--q-stride")) parse_list(v, &a.q_stride, 1);
        else if (!strcmp(f, "--entries")) parse_list(v, &a.n_entry, 1);
        else if (!strcmp(f, "--conn-seed")) a.conn_seed = parse_bit(f, v);
        else if (!strcmp(f, "--conn-search")) a.conn_search = parse_bit(f, v);
        else if (!strcmp(f, "--qk-only")) a.qk_only = 1;
        else if (f[0] != '-' && !a.dir) a.dir = f;
        else bench_fail("unknown argument '%s' (usage: bench_index DIR [-p L:H,...] [-s N] [--pairs] [--ef LIST] "
                  "[--nprobe LIST] [-g GTDIR] [-t N] [--nq N] [--degree M] [--ef-conn N] [--conn-seed 0|1] [--conn-search 0|1] [--entries N] [--q-stride S] [--qk-only])", f);
        i += takes;
    }
    if (!a.dir) bench_fail("no dump directory given (usage: bench_index DIR [options])");
    return a;
}

/* -s pairs spread evenly over the layers whose keys are dumped (every layer, but a sliding
 * layer's), the heads stepping by 4 so that every KV group appears; with fewer such layers than
 * pairs (gemma3's 3), each layer in turn, its heads spread */
static void default_pairs(Args *a, const Dump *d) {
    int s = a->n_default < 1 ? 1 : a->n_default > MAX_PAIRS ? MAX_PAIRS : a->n_default, ng = d->n_global;
    for (int i = 0; i < s; i++) {
        if (ng >= s) {
            a->pairs[i][0] = d->global[s > 1 ? i * (ng - 1) / (s - 1) : ng / 2];
            a->pairs[i][1] = (4 * i + 1) % d->n_heads;
        } else {
            int rounds = (s + ng - 1) / ng;
            a->pairs[i][0] = d->global[i % ng];
            a->pairs[i][1] = (i / ng * d->n_heads / rounds + 1) % d->n_heads;
        }
    }
    a->n_pairs = s;
}

/* ----------------------------------------------------------------------------
   One query set against one index */

typedef struct {
    const char *kind;       /* "QK" or "KK" */
    const float *q;         /* (nq, hd) */
    int nq;
    int32_t *gt;            /* (nq, TOPK) exact top-100, ids into the indexed keys */
} QuerySet;

static double overlap(const int32_t *a, int na, const int32_t *gt) {
    int hit = 0;
    for (int i = 0; i < na; i++)
        for (int j = 0; j < TOPK; j++)
            if (a[i] == gt[j]) { hit++; break; }
    return (double)hit / TOPK;
}

static void exact_topk(QuerySet *qs, const float *K, int nk, int hd) {
    qs->gt = xmalloc((size_t)qs->nq * TOPK * sizeof *qs->gt);
    for (int i = 0; i < qs->nq; i++) flat_topk(qs->q + (size_t)i * hd, rows_f32(K, hd), NULL, nk, hd, TOPK, qs->gt + (size_t)i * TOPK, NULL);
}

static void write_gt(const Args *a, const QuerySet *qs, int l, int h) {
    char path[4200];
    snprintf(path, sizeof path, "%s/gt_%s_l%d_h%d.i32", a->gt_dir, qs->kind, l, h);
    FILE *f = fopen(path, "wb");
    if (!f) bench_fail("cannot write %s: %s", path, strerror(errno));
    size_t n = (size_t)qs->nq * TOPK;
    if (fwrite(qs->gt, sizeof *qs->gt, n, f) != n || fclose(f)) bench_fail("write error on %s", path);
}

/* Fig. 2b: the RA index (§3.2) at each ef. warm: the queries in generation order, each
   search also started from the previous one's result and the key after each (./ra's default,
   ra.c warm_seeds), as method "ra_warm"; else each from the entry, then the other entry points
   (other_entries; --entries 1: the entry alone, as RoarGraph's). */
static void sweep_ra(const Args *a, const RAIndex *ix, const float *K, int nk, int hd, const QuerySet *qs, int l, int h,
                     int warm) {
    SearchScratch sc;
    build_search_scratch(&sc);
    int32_t ids[TOPK], seeds[2 * TOPK] = {0};
    for (int e = 0; e < a->n_ef; e++) {
        double scan = 0, recall = 0;
        int n_seeds = 0;
        for (int i = 0; i < qs->nq; i++) {
            int ns, n = ra_search_by(beam_walk_fast, ix, qs->q + (size_t)i * hd, rows_f32(K, hd), hd, a->ef[e], seeds,
                                    n_seeds, TOPK, ids, &ns, &sc);   /* the walk ./ra runs */
            scan += (double)ns / nk, recall += overlap(ids, n, qs->gt + (size_t)i * TOPK);
            if (warm) n_seeds = warm_seeds(ids, n, seeds);
        }
        printf("%s,%s,%d,%d,%d,%.6f,%.5f\n", warm ? "ra_warm" : "ra", qs->kind, l, h, a->ef[e], scan / qs->nq,
               recall / qs->nq);
    }
    free_search_scratch(&sc);
}

/* Fig. 2b: ra's IVF baseline at each nprobe */
static void sweep_ivf(const Args *a, const IVFIndex *iv, const float *K, int nk, int hd, const QuerySet *qs, int l, int h) {
    int32_t ids[TOPK];
    for (int e = 0; e < a->n_nprobe; e++) {
        if (a->nprobe[e] > iv->nlist) continue;
        double scan = 0, recall = 0;
        for (int i = 0; i < qs->nq; i++) {
            int ns, n = ivf_search(iv, qs->q + (size_t)i * hd, rows_f32(K, hd), hd, a->nprobe[e], TOPK, ids, &ns);
            scan += (double)ns / nk, recall += overlap(ids, n, qs->gt + (size_t)i * TOPK);
        }
        printf("ra_ivf,%s,%d,%d,%d,%.6f,%.5f\n", qs->kind, l, h, a->nprobe[e], scan / qs->nq, recall / qs->nq);
    }
}

/* ----------------------------------------------------------------------------
   One (layer, query head) */

/* K->K's held-out keys: nh of the nk keys, evenly spaced (key (2j+1) nk / 2nh for j < nh), go
   to held (nh, hd) and the others, in order, to rest (nk - nh, hd) */
static void split_keys(const float *K, int nk, int hd, int nh, float *rest, float *held) {
    int j = 0, r = 0;
    for (int i = 0; i < nk; i++) {
        int take = j < nh && i == (int)((2 * (int64_t)j + 1) * nk / (2 * nh));
        memcpy(take ? held + (size_t)j++ * hd : rest + (size_t)r++ * hd, K + (size_t)i * hd, (size_t)hd * sizeof(float));
    }
}

/* one kind: the exact top-100, the RA index (from every prefill query) and the IVF over the keys
   K (nk, hd), then both sweeps with the queries */
static void bench_kind(Args *a, const Dump *d, int l, int h, const float *qp, QuerySet *qs, const float *K, int nk) {
    int hd = d->hd, kvh = h / (d->n_heads / d->n_kv);
    exact_topk(qs, K, nk, hd);
    if (a->gt_dir) write_gt(a, qs, l, h);
    RAIndex ix;
    RAParams rp = ra_default_params();   /* ./ra's index: its --nq, --degree, --q-stride defaults */
    rp.nthreads = a->threads;
    if (a->nq) rp.nq_knn = a->nq;
    if (a->degree) rp.max_degree = a->degree;
    if (a->q_stride) rp.q_stride = a->q_stride;
    rp.ef_conn = a->ef_conn ? a->ef_conn : ra_default_ef_conn(rp.q_stride);
    if (a->conn_seed >= 0) rp.conn_seed = a->conn_seed;
    if (a->conn_search >= 0) rp.conn_search = a->conn_search;
    if (a->n_entry) rp.n_entry = a->n_entry;
    double t0 = now_s();
    build_ra_index(&ix, qp, d->n_prompt, hd, K, nk, hd, hd, &rp);
    double t1 = now_s();
    int nlist = ivf_nlist(nk);   /* as ./ra --attn ivf */
    IVFIndex iv;
    if (!a->qk_only) build_ivf(&iv, K, NULL, nk, hd, hd, nlist, 10, 1234 + (uint64_t)kvh, a->threads);
    fprintf(stderr, "bench_index: layer %d head %d %s: %d keys, %d queries; RA build %.2f s (%d repaired, ef_conn %d, "
            "%.0f keys scored each) [KNN %.2f s, projection %.2f s, connectivity %.2f s], IVF %d lists %.2f s\n", l, h,
            qs->kind, nk, qs->nq, t1 - t0, ix.n_repaired, rp.ef_conn,
            ix.n_repaired ? (double)ix.conn_scored / ix.n_repaired : 0.0, ix.t_knn, ix.t_proj, ix.t_conn, nlist,
            now_s() - t1);
    if (!a->n_nprobe) {   /* powers of two below nlist, then every list */
        for (int p = 1; p < nlist && a->n_nprobe < MAX_LIST - 1; p *= 2) a->nprobe[a->n_nprobe++] = p;
        a->nprobe[a->n_nprobe++] = nlist;
    }
    sweep_ra(a, &ix, K, nk, hd, qs, l, h, 0);
    if (!strcmp(qs->kind, "QK")) sweep_ra(a, &ix, K, nk, hd, qs, l, h, 1);
    if (!a->qk_only) sweep_ivf(a, &iv, K, nk, hd, qs, l, h);
    fflush(stdout);
    free_ra_index(&ix);
    if (!a->qk_only) free_ivf(&iv);
    free(qs->gt);
}

/* Q->K: ./ra's index (keys [sink, n_prompt - window)) searched with the generated tokens'
   queries. K->K: the same keys less n_gen held-out ones (at most a tenth), searched with those. */
static void bench_pair(Args *a, const Dump *d, int l, int h) {
    int hd = d->hd, nk = d->n_prompt - d->window - d->sink, kvh = h / (d->n_heads / d->n_kv);
    int nh = d->n_gen < nk / 10 ? d->n_gen : nk / 10;
    char name[64];
    snprintf(name, sizeof name, "k_l%d_kv%d.f32", l, kvh);
    float *keys = read_rows(d, name, d->n_prompt + d->n_gen);
    snprintf(name, sizeof name, "q_l%d_h%d.f32", l, h);
    float *qp = read_rows(d, name, d->n_prompt);
    snprintf(name, sizeof name, "qd_l%d_h%d.f32", l, h);
    float *qd = read_rows(d, name, d->n_gen);
    const float *K = keys + (size_t)d->sink * hd;   /* the indexed keys: key id i = position sink + i */
    float *rest = xmalloc((size_t)(nk - nh) * hd * sizeof *rest), *held = xmalloc((size_t)nh * hd * sizeof *held);
    split_keys(K, nk, hd, nh, rest, held);
    QuerySet qk = {"QK", qd, d->n_gen, NULL}, kk = {"KK", held, nh, NULL};
    bench_kind(a, d, l, h, qp, &qk, K, nk);
    if (!a->qk_only) bench_kind(a, d, l, h, qp, &kk, rest, nk - nh);
    free(keys), free(qp), free(qd), free(rest), free(held);
}

int main(int argc, char **argv) {
    Args a = parse_args(argc, argv);
    Dump d = read_dump(a.dir);
    if (!a.n_pairs) default_pairs(&a, &d);
    for (int i = 0; i < a.n_pairs; i++)
        if (a.pairs[i][0] >= d.n_layers || a.pairs[i][1] >= d.n_heads)
            bench_fail("pair %d:%d is outside %d layers x %d heads", a.pairs[i][0], a.pairs[i][1], d.n_layers, d.n_heads);
    if (a.list_pairs) {
        for (int i = 0; i < a.n_pairs; i++) printf("%s%d:%d", i ? "," : "", a.pairs[i][0], a.pairs[i][1]);
        printf("\n");
        return 0;
    }
    fprintf(stderr, "bench_index: %s: %d prompt + %d generated tokens, indexed keys [%d, %d), %d (layer, head) pairs\n",
            a.dir, d.n_prompt, d.n_gen, d.sink, d.n_prompt - d.window, a.n_pairs);
    printf("method,kind,layer,head,param,scan,recall\n");
    for (int i = 0; i < a.n_pairs; i++) bench_pair(&a, &d, a.pairs[i][0], a.pairs[i][1]);
    return 0;
}
