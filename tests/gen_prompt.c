/* gen_prompt.c - long-context retrieval prompts for ./ra, and the scorer of its answers: the
 * accuracy side of the paper's evaluation (§4.1 benchmarks, Tables 2-3), run by tests/eval.sh.
 *
 *   cc -O2 -march=native -std=gnu11 -Wall -Wextra -pthread -o tests/bin/gen_prompt tests/gen_prompt.c -lm
 *   tests/bin/gen_prompt -m MODEL --task TASK --tokens N [--depth D] [--seed S]
 *                        [--haystack FILE] [-o PROMPT] [--answer REFS]
 *   tests/bin/gen_prompt score --task TASK --answer REFS --output OUT   prints the score
 *   tests/bin/gen_prompt ctx -m MODEL                                   prints the trained context
 * The prompt goes to PROMPT (else stdout), the reference answers to REFS, one per line; the
 * token count and the needle's position go to stderr. tests/test_eval.c includes this file with
 * GEN_PROMPT_NO_MAIN defined.
 *
 * Tasks, each in the format of its benchmark:
 *   passkey        InfiniteBench Retr.PassKey (Zhang et al., 2024, "∞Bench"): "The pass key is
 *                  {5 digits}. Remember it. ..." in the noise "The grass is green. The sky is blue. ..."
 *   number_string  InfiniteBench Retr.Number: a 10-digit "sequence of digits" in the same noise
 *   niah_single_1  RULER niah_single_1 (Hsieh et al., 2024): "One of the special magic numbers for
 *                  {adjective-noun} is: {7 digits}." in the same noise repeated
 *   niah_multikey  RULER niah_multikey_2: the haystack is other such needles (distractors), topped
 *                  up with a few noise sentences to reach the length
 *   vt             RULER variable tracking: one chain "VAR X1 = {5 digits}." then 4 hops
 *                  "VAR X2 = VAR X1." ..., the first at the depth, the rest spread evenly after it
 * --haystack FILE: the words of a UTF-8 text (repeated) instead of the noise.
 *
 * Length. The prompt is at most N tokens of MODEL's tokenizer, counted as ./ra counts them (BOS
 * added when the model says so, control-token text parsed), and at most one haystack unit (a
 * noise sentence, a distractor, a word of --haystack) below N: the haystack is grown unit by
 * unit, and the exact count of the whole prompt decides. Depth D (0..1) is the fraction of the
 * haystack's tokens before the needle; the needle goes to the sentence boundary nearest to it.
 * The prompt is written without a final newline (./ra reads the file as it is).
 *
 * Reproducibility. The random draws (keys, values, names, distractors) come from splitmix64
 * seeded with --seed and the task name only: the same arguments and model give the same bytes on
 * any machine, and the key of a seed is the same at every length and depth.
 *
 * The scorer follows each benchmark: InfiniteBench's passkey/number_string rule (the first
 * integer of the output equals the key: 1 or 0), RULER's string_match_all (the fraction of the
 * references found in the output, case-insensitive). */
#define TESTING
#include "../model.c"
#include "../ra.c"

#include <ctype.h>

/* ----------------------------------------------------------------------------
   Errors, growable strings, files */

static void gp_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gen_prompt: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

typedef struct { char *s; size_t n, cap; } GpBuf;   /* s[0..n) plus a 0 byte */

static void gp_put(GpBuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1) + 256;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void gp_puts(GpBuf *b, const char *s) { gp_put(b, s, strlen(s)); }

/* the whole file, 0-terminated; NULL when it cannot be read */
static char *gp_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    GpBuf b = {0};
    char chunk[1 << 16];
    for (size_t k; (k = fread(chunk, 1, sizeof chunk, f)) > 0;) gp_put(&b, chunk, k);
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(b.s); return NULL; }
    if (!b.s) gp_put(&b, "", 0);   /* an empty file is "" */
    *len = b.n;
    return b.s;
}

static void gp_write_file(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s, 1, n, f) != n || fclose(f)) gp_die("cannot write '%s': %s", path, strerror(errno));
}

/* 1 when s[0..n) is well-formed UTF-8 (./ra refuses a prompt that is not) */
static int gp_utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = s[i] < 0x80 ? 1 : (s[i] >> 5) == 6 ? 2 : (s[i] >> 4) == 14 ? 3 : (s[i] >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (int j = 1; j < k; j++) if ((s[i + j] & 0xC0) != 0x80) return 0;   /* continuation bytes */
        i += k;
    }
    return 1;
}

/* ----------------------------------------------------------------------------
   Random numbers: splitmix64 (Steele, Lea & Flood, 2014), the same on every machine */

static uint64_t gp_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, n): the high 64 bits of a 64x64 product (Lemire), no modulo bias worth naming */
static uint64_t gp_below(uint64_t *s, uint64_t n) { return (uint64_t)(((unsigned __int128)gp_rand(s) * n) >> 64); }

/* the stream of a seed and a task: FNV-1a of the name, mixed with the seed */
static uint64_t gp_seed(uint64_t seed, const char *task) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = task; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t s = h ^ seed * 0x9e3779b97f4a7c15ull;
    gp_rand(&s);   /* one step so that near seeds start far apart */
    return s;
}

/* ----------------------------------------------------------------------------
   The tokenizer of a GGUF file, and counting tokens as ./ra does */

typedef struct {
    GGUF g;
    Tokenizer tok;
    int ctx_train;   /* <arch>.context_length; 0 when absent */
} GpModel;

static int gp_load_model(GpModel *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (build_gguf(&m->g, path, err)) return -1;
    if (build_tokenizer_from_gguf(&m->tok, &m->g, err)) { free_gguf(&m->g); return -1; }
    Str a;
    int64_t v;
    char key[96];
    if (gguf_get_str(&m->g, "general.architecture", &a) == 1) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)(a.len > 64 ? 64 : a.len), a.s);
        if (gguf_get_int(&m->g, key, &v) == 1 && v > 0 && v < INT_MAX) m->ctx_train = (int)v;
    }
    return 0;
}

static void gp_free_model(GpModel *m) {
    free_tokenizer(&m->tok);
    free_gguf(&m->g);
}

/* tokens of s[0..n): with bos, exactly the prompt count of ./ra (tokenizer_encode with BOS as the
 * model's flags say, control-token text parsed); without, a piece in the middle of a prompt */
static int gp_ntok(const Tokenizer *t, const char *s, size_t n, int bos) {
    int k = tokenizer_encode(t, s, n, bos, 1, NULL, 0);   /* max_out 0: count only, nothing written */
    if (k < 0) gp_die("the tokenizer failed on a %zu-byte text", n);
    return k;
}

/* ----------------------------------------------------------------------------
   Tasks: the text around the haystack, the needles and the references */

enum { GP_PASSKEY, GP_NUMBER_STRING, GP_NIAH_SINGLE_1, GP_NIAH_MULTIKEY, GP_VT, GP_N_TASKS };
static const char *const gp_task_names[GP_N_TASKS] = {"passkey", "number_string", "niah_single_1", "niah_multikey", "vt"};

#define GP_MAX_NEEDLES 5   /* vt: the value and 4 hops */
#define GP_VT_HOPS 4

static int gp_task_id(const char *name) {
    for (int i = 0; i < GP_N_TASKS; i++) if (!strcmp(name, gp_task_names[i])) return i;
    return -1;
}

/* InfiniteBench's tasks are scored by the first integer, RULER's by substring matches */
static int gp_task_is_ruler(int id) { return id >= GP_NIAH_SINGLE_1; }

/* InfiniteBench's passkey / number_string noise (RULER's niah_single_1 "repeat" haystack is the
 * same), one sentence per haystack unit; each unit carries its leading space */
static const char *const gp_noise[] = {" The grass is green.", " The sky is blue.", " The sun is yellow.",
                                       " Here we go.", " There and back again."};
#define GP_N_NOISE (int)(sizeof gp_noise / sizeof *gp_noise)

/* RULER's keys are "adjective-noun" pairs (wonderwords lists); ours come from these small lists */
static const char *const gp_adjectives[] = {
    "abundant", "agreeable", "ancient", "angry", "bitter", "black", "brave", "breezy", "bright", "broad",
    "calm", "careful", "cheerful", "clever", "cloudy", "clumsy", "crooked", "curious", "damp", "dark",
    "delicate", "eager", "early", "elegant", "empty", "faint", "fancy", "fierce", "fluffy", "foggy",
    "fragile", "fresh", "gentle", "gigantic", "glossy", "golden", "grumpy", "hollow", "humble", "icy",
    "jolly", "kind", "lazy", "little", "lively", "loud", "lucky", "massive", "mellow", "misty",
    "modern", "narrow", "nervous", "noisy", "odd", "orange", "patient", "plain", "polite", "proud",
    "purple", "quick", "quiet", "rapid", "rough", "round", "rusty", "salty", "scary", "shaggy",
    "shiny", "silent", "silly", "slow", "smooth", "soft", "sour", "spicy", "steep", "sticky",
    "stormy", "strange", "sturdy", "sunny", "swift", "tall", "tame", "tender", "tiny", "tough",
    "vast", "warm", "wealthy", "wide", "wild", "wise", "witty", "wooden", "yellow", "young"};
static const char *const gp_nouns[] = {
    "anchor", "apple", "badge", "basket", "beacon", "blanket", "bottle", "bridge", "bucket", "cabin",
    "camera", "candle", "canyon", "carpet", "castle", "cherry", "chimney", "circus", "cliff", "cloud",
    "compass", "cookie", "cottage", "crystal", "dolphin", "donkey", "dragon", "drum", "eagle", "engine",
    "falcon", "feather", "fiddle", "forest", "fountain", "garden", "giraffe", "glacier", "guava", "hammer",
    "harbor", "helmet", "island", "jacket", "jungle", "kettle", "kitten", "ladder", "lantern", "lemon",
    "library", "lizard", "magnet", "meadow", "mirror", "monkey", "mountain", "needle", "ocean", "orchard",
    "otter", "paddle", "parrot", "pebble", "pencil", "pepper", "pillow", "pirate", "planet", "pocket",
    "puzzle", "rabbit", "radish", "river", "rocket", "saddle", "sailor", "shadow", "shovel", "spider",
    "spoon", "squirrel", "statue", "summit", "teapot", "thunder", "tiger", "tractor", "trumpet", "tunnel",
    "turtle", "umbrella", "valley", "violin", "wagon", "walnut", "whistle", "window", "wizard", "zebra"};
#define GP_N_ADJ (sizeof gp_adjectives / sizeof *gp_adjectives)
#define GP_N_NOUN (sizeof gp_nouns / sizeof *gp_nouns)

typedef struct {
    int id;                                /* GP_PASSKEY .. GP_VT */
    uint64_t rng;                          /* after the task's own draws: the distractors' stream */
    char head[256];                        /* the instruction before the haystack */
    char tail[512];                        /* after it: the question and the answer's first words */
    int n_needles;
    char needle[GP_MAX_NEEDLES][160];      /* in order; each begins with a space, like a noise unit */
    double spread[GP_MAX_NEEDLES];         /* needle j goes at depth + spread[j] * (1 - depth) */
    int n_refs;
    char ref[GP_MAX_NEEDLES][32];          /* the reference answers, one per line of --answer */
    char key[32], value[16];               /* niah: the queried key and its value (kept off distractors) */
} GpTask;

static void gp_word_pair(uint64_t *rng, char *out, size_t cap) {
    const char *a = gp_adjectives[gp_below(rng, GP_N_ADJ)];
    snprintf(out, cap, "%s-%s", a, gp_nouns[gp_below(rng, GP_N_NOUN)]);
}

/* a number of exactly `digits` digits (no leading zero) */
static void gp_number(uint64_t *rng, int digits, char *out, size_t cap) {
    uint64_t lo = 1;
    for (int i = 1; i < digits; i++) lo *= 10;
    snprintf(out, cap, "%llu", (unsigned long long)(lo + gp_below(rng, 9 * lo)));
}

/* five distinct names of five capital letters, as RULER's variable_tracking draws them */
static void gp_var_names(uint64_t *rng, char names[][8], int n) {
    for (int i = 0; i < n; i++) {
        int dup;
        do {
            for (int j = 0; j < 5; j++) names[i][j] = (char)('A' + gp_below(rng, 26));
            names[i][5] = 0;
            dup = 0;
            for (int j = 0; j < i; j++) dup |= !strcmp(names[i], names[j]);
        } while (dup);
    }
}

/* InfiniteBench's instruction, shared by passkey and number_string */
#define GP_IB_HEAD "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. " \
                   "I will quiz you about the important information there.\n\n"

static void gp_task_infinitebench(GpTask *t, const char *what, int digits) {
    gp_number(&t->rng, digits, t->ref[0], sizeof t->ref[0]);
    const char *k = t->ref[0];
    t->n_refs = t->n_needles = 1;
    snprintf(t->head, sizeof t->head, GP_IB_HEAD);
    snprintf(t->needle[0], sizeof t->needle[0], " The %s is %s. Remember it. %s is the %s.", what, k, k, what);
    snprintf(t->tail, sizeof t->tail, "\n\nWhat is the %s? The %s is", what, what);
}

/* RULER's niah template (single value): instruction, context, question, answer prefix */
static void gp_task_niah(GpTask *t, int multi) {
    gp_word_pair(&t->rng, t->key, sizeof t->key);
    gp_number(&t->rng, 7, t->value, sizeof t->value);
    t->n_refs = t->n_needles = 1;
    snprintf(t->ref[0], sizeof t->ref[0], "%s", t->value);
    snprintf(t->head, sizeof t->head, multi ?
             "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the numbers afterwards.\n" :
             "A special magic number is hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the number afterwards.\n");
    snprintf(t->needle[0], sizeof t->needle[0], " One of the special magic numbers for %s is: %s.", t->key, t->value);
    snprintf(t->tail, sizeof t->tail, "\nWhat is the special magic number for %s mentioned in the provided text? "
             "The special magic number for %s mentioned in the provided text is", t->key, t->key);
}

/* RULER's variable_tracking: one chain of GP_VT_HOPS hops, the value a 5-digit number; the
 * references are all GP_VT_HOPS + 1 names */
static void gp_task_vt(GpTask *t) {
    char names[GP_VT_HOPS + 1][8], value[16];
    gp_number(&t->rng, 5, value, sizeof value);
    gp_var_names(&t->rng, names, GP_VT_HOPS + 1);
    t->n_refs = t->n_needles = GP_VT_HOPS + 1;
    snprintf(t->needle[0], sizeof t->needle[0], " VAR %s = %s.", names[0], value);
    for (int j = 1; j <= GP_VT_HOPS; j++)
        snprintf(t->needle[j], sizeof t->needle[j], " VAR %s = VAR %s.", names[j], names[j - 1]);
    for (int j = 0; j <= GP_VT_HOPS; j++) {
        snprintf(t->ref[j], sizeof t->ref[j], "%s", names[j]);
        t->spread[j] = (double)j / (GP_VT_HOPS + 1);   /* evenly from the depth towards the end */
    }
    snprintf(t->head, sizeof t->head, "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n");
    snprintf(t->tail, sizeof t->tail, "\nQuestion: Find all variables that are assigned the value %s in the text above. "
             "Answer: According to the chain(s) of variable assignment in the text above, %d variables are "
             "assigned the value %s, they are:", value, GP_VT_HOPS + 1, value);
}

/* the task's text for a seed; its draws depend on the seed and the task only */
static void gp_make_task(GpTask *t, int id, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->id = id;
    t->rng = gp_seed(seed, gp_task_names[id]);
    switch (id) {
    case GP_PASSKEY: gp_task_infinitebench(t, "pass key", 5); break;
    case GP_NUMBER_STRING: gp_task_infinitebench(t, "sequence of digits", 10); break;
    case GP_NIAH_SINGLE_1: gp_task_niah(t, 0); break;
    case GP_NIAH_MULTIKEY: gp_task_niah(t, 1); break;
    default: gp_task_vt(t); break;
    }
}

/* ----------------------------------------------------------------------------
   Haystack streams: unit i of a stream is the same whatever the prompt's length */

enum { GP_HAY_NOISE, GP_HAY_FILE, GP_HAY_DISTRACTORS };

typedef struct {
    char *s;         /* with its leading whitespace */
    int ntok;        /* tokens of s alone (no BOS): additive across sentence boundaries */
    int boundary;    /* 1 when a needle may go just before this unit (a sentence starts) */
} GpUnit;

typedef struct {
    int kind;
    const Tokenizer *tok;
    GpUnit *u;            /* (n) units made so far */
    int n, cap;
    const char *text;     /* GP_HAY_FILE: the file, cut into words (leading whitespace + word) */
    size_t *woff;         /* (nw) where word k starts */
    int nw;
    uint64_t rng;         /* GP_HAY_DISTRACTORS: the stream of keys and values */
    const GpTask *task;   /* GP_HAY_DISTRACTORS: whose key and value the distractors avoid */
} GpStream;

/* cut text into units "whitespace run + non-whitespace run" (the first may lack whitespace) */
static int gp_split_words(const char *text, size_t **off) {
    size_t n = strlen(text), cap = 1024;
    int k = 0;
    *off = xmalloc(cap * sizeof **off);
    for (size_t i = 0; i < n;) {
        size_t start = i;
        while (i < n && isspace((unsigned char)text[i])) i++;
        if (i == n) break;   /* trailing whitespace belongs to no word */
        while (i < n && !isspace((unsigned char)text[i])) i++;
        if ((size_t)k == cap) *off = xrealloc(*off, (cap *= 2) * sizeof **off);
        (*off)[k++] = start;
    }
    return k;
}

static void gp_stream_init(GpStream *st, int kind, const Tokenizer *tok, const char *file_text, const GpTask *task) {
    memset(st, 0, sizeof *st);
    st->kind = kind;
    st->tok = tok;
    st->task = task;
    if (kind == GP_HAY_FILE) {
        st->text = file_text;
        st->nw = gp_split_words(file_text, &st->woff);
        if (!st->nw) gp_die("the haystack file has no words");
    }
    if (kind == GP_HAY_DISTRACTORS) st->rng = task->rng;   /* continues after the task's draws */
}

static void gp_stream_free(GpStream *st) {
    for (int i = 0; i < st->n; i++) free(st->u[i].s);
    free(st->u);
    free(st->woff);
}

/* word i of the repeated file as a unit. The file's first word, when no whitespace precedes it,
 * gets "\n" (at the wrap-around, or after distractors). *boundary: a sentence starts with this
 * word (after . ! or ?, or at a line break) */
static char *gp_file_unit(GpStream *st, int i, int *boundary) {
    int k = i % st->nw;
    size_t a = st->woff[k], b = k + 1 < st->nw ? st->woff[k + 1] : strlen(st->text);
    while (b > a && isspace((unsigned char)st->text[b - 1])) b--;   /* the word without the next one's space */
    int sep = k == 0 && !isspace((unsigned char)st->text[a]);
    char *s = xmalloc(b - a + 2);
    if (sep) s[0] = '\n';
    memcpy(s + sep, st->text + a, b - a);
    s[sep + b - a] = 0;
    const char *prev = i > 0 ? st->u[i - 1].s : NULL;   /* units are made in order */
    size_t pl = prev ? strlen(prev) : 0, lead = strspn(s, " \t\r\n");
    *boundary = !prev || (pl && strchr(".!?", prev[pl - 1])) || memchr(s, '\n', lead) != NULL;
    return s;
}

/* a distractor needle: another key (never the queried one) with its own 7-digit value */
static char *gp_distractor(GpStream *st) {
    char key[64], value[32], buf[160];
    do gp_word_pair(&st->rng, key, sizeof key); while (!strcmp(key, st->task->key));
    do gp_number(&st->rng, 7, value, sizeof value); while (!strcmp(value, st->task->value));
    snprintf(buf, sizeof buf, " One of the special magic numbers for %s is: %s.", key, value);
    return strdup(buf);
}

/* unit i, made (with units before it) on first use */
static const GpUnit *gp_unit(GpStream *st, int i) {
    while (st->n <= i) {
        if (st->n == st->cap) st->u = xrealloc(st->u, (size_t)(st->cap = 2 * st->cap + 64) * sizeof *st->u);
        GpUnit *u = &st->u[st->n];
        u->boundary = 1;   /* noise sentences and distractors are whole sentences */
        if (st->kind == GP_HAY_NOISE) u->s = strdup(gp_noise[st->n % GP_N_NOISE]);
        else if (st->kind == GP_HAY_DISTRACTORS) u->s = gp_distractor(st);
        else u->s = gp_file_unit(st, st->n, &u->boundary);
        u->ntok = gp_ntok(st->tok, u->s, strlen(u->s), 0);
        st->n++;
    }
    return &st->u[i];
}

/* ----------------------------------------------------------------------------
   Prompt layout: head, haystack items with the needles at their depths, tail */

typedef struct {
    const GpTask *task;
    const Tokenizer *tok;
    GpStream *main_st;     /* the haystack proper */
    GpStream *fill_st;     /* NULL, or finer units after the main ones (niah_multikey: noise) */
    int K, F;              /* items: K main units, then F fill units */
    double depth;
    int at[GP_MAX_NEEDLES];   /* needle j goes before item at[j] (K + F = at the end) */
    GpBuf text;               /* the last rendering */
    size_t needle_off;        /* where needle 0 starts in text */
} GpLayout;

static const GpUnit *gp_item(GpLayout *L, int i) { return i < L->K ? gp_unit(L->main_st, i) : gp_unit(L->fill_st, i - L->K); }

/* each needle before the item whose token offset in the haystack is nearest to its depth,
 * among the items where a sentence starts (ties: the earlier) */
static void gp_place_needles(GpLayout *L) {
    int n = L->K + L->F;
    long total = 0;
    for (int i = 0; i < n; i++) total += gp_item(L, i)->ntok;
    for (int j = 0; j < L->task->n_needles; j++) {
        double d = L->depth + L->task->spread[j] * (1 - L->depth), want = d * total, best = 1e300;
        long cum = 0;
        L->at[j] = n;
        for (int i = 0; i <= n; i++) {
            int ok = i == 0 || i == n || gp_item(L, i)->boundary;   /* a needle may always open or close */
            if (ok && fabs(cum - want) < best) best = fabs(cum - want), L->at[j] = i;
            if (i < n) cum += gp_item(L, i)->ntok;
        }
        if (j > 0 && L->at[j] < L->at[j - 1]) L->at[j] = L->at[j - 1];   /* keep the chain in order */
    }
}

/* the prompt for the current K, F into L->text; the first item after the head drops its
 * leading whitespace (the head ends with a line break) */
static void gp_render(GpLayout *L) {
    int n = L->K + L->F, first = 1;
    L->text.n = 0;
    gp_puts(&L->text, L->task->head);
    for (int i = 0; i <= n; i++) {
        for (int j = 0; j < L->task->n_needles; j++) {
            if (L->at[j] != i) continue;
            const char *s = L->task->needle[j] + (first ? strspn(L->task->needle[j], " \n\t\r") : 0);
            if (j == 0) L->needle_off = L->text.n;
            gp_puts(&L->text, s);
            first = 0;
        }
        if (i == n) break;
        const char *s = gp_item(L, i)->s;
        gp_puts(&L->text, first ? s + strspn(s, " \n\t\r") : s);
        first = 0;
    }
    gp_puts(&L->text, L->task->tail);
}

/* tokens of the whole prompt with K main and F fill units, needles placed */
static int gp_count(GpLayout *L, int K, int F) {
    L->K = K, L->F = F;
    gp_place_needles(L);
    gp_render(L);
    return gp_ntok(L->tok, L->text.s, L->text.n, 1);
}

/* the largest x >= 0 with count(x) <= N, given count(0) <= N and a guess: gallop from the guess
 * to a bracket, then bisect (the count grows with x; the guess from additive unit counts is
 * usually exact, so this costs two or three tokenizations of the prompt) */
static int gp_largest(GpLayout *L, int fill, int guess, int N) {
    int lo, hi;
#define GP_F(x) (fill ? gp_count(L, L->K, (x)) : gp_count(L, (x), 0))
    if (GP_F(guess) <= N) {
        lo = guess;
        for (int step = 1;; step *= 2) {
            hi = guess + step;
            if (GP_F(hi) > N) break;
            lo = hi;
        }
    } else {
        hi = guess;
        for (int step = 1;; step *= 2) {
            lo = guess - step > 0 ? guess - step : 0;
            if (lo == 0 || GP_F(lo) <= N) break;
            hi = lo;
        }
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (GP_F(mid) <= N) lo = mid;
        else hi = mid;
    }
#undef GP_F
    return lo;
}

/* how many units of st fit in `room` tokens by their separate counts */
static int gp_guess(GpStream *st, long room) {
    int k = 0;
    for (long used = 0; room > 0; k++) {
        used += gp_unit(st, k)->ntok;
        if (used > room) break;
    }
    return k;
}

/* ----------------------------------------------------------------------------
   A prompt of N tokens */

typedef struct {
    char *text;         /* the prompt, 0-terminated, no final newline */
    size_t len;
    int n_tokens;       /* as ./ra counts them (BOS included when the model adds it) */
    int needle_tok;     /* index of needle 0's first token */
    int head_tok;       /* tokens of BOS + head */
    int tail_tok;       /* tokens of the tail alone */
    int needles_tok;    /* tokens of all needles */
    int hay_units;      /* haystack units used (main + fill) */
    double depth;       /* measured: haystack tokens before needle 0 / all haystack tokens */
} GpPrompt;

/* The prompt of task t with at most N tokens and at least N minus one unit; haystack = the noise,
 * or the words of hay_text (repeated) when it is not NULL. 0, or -1 with a message in err. */
static int gp_make_prompt(const Tokenizer *tok, const GpTask *t, int N, double depth, const char *hay_text,
                          GpPrompt *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    GpStream main_st, fill_st;
    int multi = t->id == GP_NIAH_MULTIKEY, file_kind = hay_text ? GP_HAY_FILE : GP_HAY_NOISE;
    gp_stream_init(&main_st, multi ? GP_HAY_DISTRACTORS : file_kind, tok, hay_text, t);
    if (multi) gp_stream_init(&fill_st, file_kind, tok, hay_text, t);   /* RULER's needle haystack, topped up */
    GpLayout L = {.task = t, .tok = tok, .main_st = &main_st, .fill_st = multi ? &fill_st : NULL, .depth = depth};
    int base = gp_count(&L, 0, 0), rc = 0;   /* head + needles + tail */
    if (base > N) {
        snprintf(err, errlen, "%s: %d tokens is too short: the instruction, needle(s) and question alone take %d",
                 gp_task_names[t->id], N, base);
        rc = -1;
    } else {
        int K = gp_largest(&L, 0, gp_guess(&main_st, N - base), N);
        int F = 0;
        if (multi) {
            L.K = K;
            F = gp_largest(&L, 1, gp_guess(&fill_st, N - gp_count(&L, K, 0)), N);
        }
        p->n_tokens = gp_count(&L, K, F);   /* the final rendering stays in L.text */
        p->hay_units = K + F;
        p->text = L.text.s, p->len = L.text.n;
        L.text.s = NULL;
        /* where needle 0 sits, in tokens */
        p->needle_tok = gp_ntok(tok, p->text, L.needle_off, 1);
        p->head_tok = gp_ntok(tok, t->head, strlen(t->head), 1);
        p->tail_tok = gp_ntok(tok, t->tail, strlen(t->tail), 0);
        for (int j = 0; j < t->n_needles; j++) p->needles_tok += gp_ntok(tok, t->needle[j], strlen(t->needle[j]), 0);
        int hay = p->n_tokens - p->head_tok - p->tail_tok - p->needles_tok;
        p->depth = hay > 0 ? (double)(p->needle_tok - p->head_tok) / hay : 0;
    }
    free(L.text.s);
    gp_stream_free(&main_st);
    if (multi) gp_stream_free(&fill_st);
    return rc;
}

static void gp_free_prompt(GpPrompt *p) { free(p->text); p->text = NULL; }

/* ----------------------------------------------------------------------------
   Scoring (InfiniteBench: first integer; RULER: string_match_all) */

/* the first run of ASCII digits of s into out ("" when there is none) */
static void gp_first_int(const char *s, char *out, size_t cap) {
    while (*s && !isdigit((unsigned char)*s)) s++;
    size_t n = 0;
    while (isdigit((unsigned char)s[n])) n++;
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

/* 1 when needle occurs in hay, ASCII case ignored */
static int gp_icontains(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return n == 0;
}

/* the score of one output: InfiniteBench's get_score_one_passkey / number_string (the first
 * integer of the output equals the reference: 1 or 0); RULER's string_match_all (the fraction
 * of the references that occur in the output, case-insensitive) */
static double gp_score(int task, const char *const *refs, int n_refs, const char *output) {
    if (n_refs <= 0) return 0;
    if (!gp_task_is_ruler(task)) {
        char first[64];
        gp_first_int(output, first, sizeof first);
        return first[0] && !strcmp(first, refs[0]);
    }
    int found = 0;
    for (int i = 0; i < n_refs; i++) found += gp_icontains(output, refs[i]);
    return (double)found / n_refs;
}

/* the non-empty lines of an --answer file, trimmed, in place; returns the count */
static int gp_read_refs(char *text, const char **refs, int max) {
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        while (isspace((unsigned char)*line)) line++;
        size_t k = strlen(line);
        while (k && isspace((unsigned char)line[k - 1])) line[--k] = 0;   /* also a '\r' */
        if (k) refs[n++] = line;
    }
    return n;
}

/* ----------------------------------------------------------------------------
   The program */

#ifndef GEN_PROMPT_NO_MAIN
static void gp_usage(void) {
    fprintf(stderr,
            "usage: gen_prompt -m MODEL --task TASK --tokens N [--depth D] [--seed S] [--haystack FILE]\n"
            "                  [-o PROMPT] [--answer REFS]\n"
            "       gen_prompt score --task TASK --answer REFS --output OUT\n"
            "       gen_prompt ctx -m MODEL\n"
            "  TASK: passkey, number_string (InfiniteBench), niah_single_1, niah_multikey, vt (RULER)\n"
            "  N: prompt tokens of MODEL's tokenizer, BOS included (at most N, at most one haystack unit less)\n"
            "  D: fraction of the haystack before the needle, 0..1 (default 0.5); S: seed (default 1)\n"
            "  FILE: a UTF-8 text used (repeated) as the haystack instead of the noise\n"
            "  score prints the score of the output OUT: 1 or 0 (InfiniteBench), a fraction (RULER)\n");
    exit(2);
}

static const char *gp_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) gp_die("%s needs a value", argv[*i]);
    return argv[++*i];
}

static double gp_num(const char *s, const char *what, double lo, double hi) {
    char *e;
    double v = strtod(s, &e);
    if (e == s || *e || !(v >= lo && v <= hi)) gp_die("%s: '%s' is not a number in [%g, %g]", what, s, lo, hi);
    return v;
}

static uint64_t gp_seed_arg(const char *s) {
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (e == s || *e || errno || *s == '-') gp_die("--seed: '%s' is not a non-negative integer", s);
    return v;
}

static int gp_main_score(int argc, char **argv) {
    const char *task = NULL, *answer = NULL, *output = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--task")) task = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "--answer")) answer = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "--output")) output = gp_arg(argc, argv, &i);
        else gp_usage();
    }
    if (!task || !answer || !output) gp_usage();
    int id = gp_task_id(task);
    if (id < 0) gp_die("unknown task '%s'", task);
    size_t na, no;
    char *ans = gp_read_file(answer, &na), *out = gp_read_file(output, &no);
    if (!ans) gp_die("cannot read '%s'", answer);
    if (!out) gp_die("cannot read '%s'", output);
    const char *refs[GP_MAX_NEEDLES * 4];
    int n = gp_read_refs(ans, refs, GP_MAX_NEEDLES * 4);
    if (!n) gp_die("%s: no reference answer", answer);
    printf("%.4g\n", gp_score(id, refs, n, out));
    free(ans), free(out);
    return 0;
}

static int gp_main_ctx(int argc, char **argv) {
    if (argc != 4 || strcmp(argv[2], "-m")) gp_usage();
    GpModel m;
    char err[ERR_LEN];
    if (gp_load_model(&m, argv[3], err)) gp_die("%s", err);
    printf("%d\n", m.ctx_train);
    gp_free_model(&m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "score")) return gp_main_score(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "ctx")) return gp_main_ctx(argc, argv);
    const char *model = NULL, *task = NULL, *hay = NULL, *out = NULL, *answer = NULL;
    int N = 0;
    double depth = 0.5;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) model = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "--task")) task = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "--tokens")) N = (int)gp_num(gp_arg(argc, argv, &i), "--tokens", 1, 1 << 30);
        else if (!strcmp(argv[i], "--depth")) depth = gp_num(gp_arg(argc, argv, &i), "--depth", 0, 1);
        else if (!strcmp(argv[i], "--seed")) seed = gp_seed_arg(gp_arg(argc, argv, &i));
        else if (!strcmp(argv[i], "--haystack")) hay = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "-o")) out = gp_arg(argc, argv, &i);
        else if (!strcmp(argv[i], "--answer")) answer = gp_arg(argc, argv, &i);
        else gp_usage();
    }
    if (!model || !task || !N) gp_usage();
    int id = gp_task_id(task);
    if (id < 0) gp_die("unknown task '%s' (passkey, number_string, niah_single_1, niah_multikey, vt)", task);
    char *hay_text = NULL;
    size_t hay_len = 0;
    if (hay) {
        if (!(hay_text = gp_read_file(hay, &hay_len))) gp_die("cannot read the haystack '%s'", hay);
        if (strlen(hay_text) != hay_len || !gp_utf8_ok((const unsigned char *)hay_text, hay_len))
            gp_die("%s: the haystack is not UTF-8 text", hay);
    }
    GpModel m;
    char err[ERR_LEN];
    if (gp_load_model(&m, model, err)) gp_die("%s", err);

    GpTask t;
    gp_make_task(&t, id, seed);
    GpPrompt p;
    if (gp_make_prompt(&m.tok, &t, N, depth, hay_text, &p, err, sizeof err)) gp_die("%s", err);
    if (out) gp_write_file(out, p.text, p.len);
    else fwrite(p.text, 1, p.len, stdout);
    if (answer) {
        GpBuf b = {0};
        for (int j = 0; j < t.n_refs; j++) gp_puts(&b, t.ref[j]), gp_puts(&b, "\n");
        gp_write_file(answer, b.s, b.n);
        free(b.s);
    }
    int short_by = N - p.n_tokens, tol = N / 100 > 16 ? N / 100 : 16;
    if (short_by > tol)   /* only with --haystack: one of its "words" is that long */
        fprintf(stderr, "gen_prompt: note: %d tokens short of %d (a haystack unit is that long)\n", short_by, N);
    fprintf(stderr, "gen_prompt: %s seed %llu: %d tokens (asked %d); needle at token %d, depth %.3f of the "
            "haystack (asked %.3f)%s\n", task, (unsigned long long)seed, p.n_tokens, N, p.needle_tok, p.depth, depth,
            m.ctx_train && p.n_tokens > m.ctx_train ? "; beyond the trained context" : "");
    gp_free_prompt(&p);
    gp_free_model(&m);
    free(hay_text);
    return 0;
}
#endif
