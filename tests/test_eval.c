/* test_eval.c - tests of the accuracy evaluation's prompt generator and scorer (tests/gen_prompt.c):
   prompt length in the default model's tokens, needle depth, determinism, references present,
   and the scoring rules of InfiniteBench and RULER on fixed strings.

   make tests/bin/test_eval && tests/bin/test_eval [model.gguf]
     model.gguf  default data/SmolLM2-135M-Instruct.Q4_1.gguf (make model fetches it) */

#define GEN_PROMPT_NO_MAIN
#include "gen_prompt.c"

#include "check.h"

#define TOL 16          /* the prompt may fall this many tokens short of the asked length */
#define DEPTH_TOL 0.02  /* measured needle depth vs asked */

/* ----------------------------------------------------------------------------
   Independent measurements of a prompt */

/* where needle 0 of t starts in text (its leading space dropped when it opens the haystack) */
static const char *find_needle(const char *text, const GpTask *t) {
    const char *n = t->needle[0] + strspn(t->needle[0], " ");
    return strstr(text, n);
}

/* the needle's depth in the haystack, measured by tokenizing the prompt's pieces again:
   (tokens before the needle - head) / (all - head - tail - needles) */
static double measured_depth(const Tokenizer *tok, const GpTask *t, const char *text, int n) {
    const char *at = find_needle(text, t);
    if (!at) return -1;
    int before = gp_ntok(tok, text, (size_t)(at - text), 1);
    int head = gp_ntok(tok, t->head, strlen(t->head), 1), tail = gp_ntok(tok, t->tail, strlen(t->tail), 0), needles = 0;
    for (int j = 0; j < t->n_needles; j++) needles += gp_ntok(tok, t->needle[j], strlen(t->needle[j]), 0);
    int hay = n - head - tail - needles;
    return hay > 0 ? (double)(before - head) / hay : -1;
}

/* 1 when every reference occurs in text, and the needles come in their order */
static int refs_and_order_ok(const GpTask *t, const char *text) {
    for (int j = 0; j < t->n_refs; j++) if (!strstr(text, t->ref[j])) return 0;
    const char *prev = text;
    for (int j = 0; j < t->n_needles; j++) {
        const char *at = strstr(prev, t->needle[j] + strspn(t->needle[j], " "));
        if (!at) return 0;
        prev = at + 1;
    }
    return 1;
}

static int starts_ends_ok(const GpTask *t, const GpPrompt *p) {
    size_t nh = strlen(t->head), nt = strlen(t->tail);
    return p->len >= nh + nt && !memcmp(p->text, t->head, nh) && !memcmp(p->text + p->len - nt, t->tail, nt);
}

/* ----------------------------------------------------------------------------
   Test groups */

/* every task at a few lengths and depths: length in tolerance, needle at its depth */
static void test_lengths(const Tokenizer *tok) {
    static const int lengths[] = {500, 2000, 8000};
    static const double depths[] = {0, 0.5, 1};
    char err[256];
    for (int id = 0; id < GP_N_TASKS; id++)
        for (int li = 0; li < 3; li++)
            for (int di = 0; di < 3; di++) {
                int N = lengths[li];
                GpTask t;
                GpPrompt p;
                gp_make_task(&t, id, 7);
                int rc = gp_make_prompt(tok, &t, N, depths[di], NULL, &p, err, sizeof err);
                if (rc) { check(0, "%s %d tokens depth %g: %s", gp_task_names[id], N, depths[di], err); continue; }
                int n = gp_ntok(tok, p.text, p.len, 1);   /* recounted as ./ra counts */
                double d = measured_depth(tok, &t, p.text, n);
                int ok = n == p.n_tokens && n <= N && n >= N - TOL && fabs(d - depths[di]) <= DEPTH_TOL &&
                         refs_and_order_ok(&t, p.text) && starts_ends_ok(&t, &p) && strlen(p.text) == p.len &&
                         gp_utf8_ok((const unsigned char *)p.text, p.len);
                check(ok, "%-13s %4d tokens depth %.1f: %d tokens (in [%d, %d]), needle depth %.3f (+-%.2f), "
                      "references in order, head/tail intact", gp_task_names[id], N, depths[di], n, N - TOL, N, d, DEPTH_TOL);
                gp_free_prompt(&p);
            }
}

/* same seed -> same bytes; another seed -> another key and other bytes; the PRNG is the
   published splitmix64 (so the same on any machine) */
static void test_seeds(const Tokenizer *tok) {
    uint64_t s = 0;
    check(gp_rand(&s) == 0xe220a8397b1dcdafull, "splitmix64 from state 0 gives its published first value");
    char err[256];
    for (int id = 0; id < GP_N_TASKS; id++) {
        GpTask a, b, c;
        GpPrompt pa, pb, pc;
        gp_make_task(&a, id, 42), gp_make_task(&b, id, 42), gp_make_task(&c, id, 43);
        int rc = gp_make_prompt(tok, &a, 2000, 0.3, NULL, &pa, err, sizeof err) |
                 gp_make_prompt(tok, &b, 2000, 0.3, NULL, &pb, err, sizeof err) |
                 gp_make_prompt(tok, &c, 2000, 0.3, NULL, &pc, err, sizeof err);
        check(!rc && pa.len == pb.len && !memcmp(pa.text, pb.text, pa.len), "%s: seed 42 twice gives identical bytes", gp_task_names[id]);
        check(!rc && strcmp(a.ref[0], c.ref[0]) && (pa.len != pc.len || memcmp(pa.text, pc.text, pa.len)),
              "%s: seeds 42 and 43 give different keys (%s, %s) and prompts", gp_task_names[id], a.ref[0], c.ref[0]);
        if (!rc) gp_free_prompt(&pa), gp_free_prompt(&pb), gp_free_prompt(&pc);
    }
    /* the key of a seed is fixed for all time: a change here changes every stored result */
    GpTask t;
    gp_make_task(&t, GP_PASSKEY, 1);
    check(!strcmp(t.ref[0], "41814"), "passkey seed 1 is 41814 (got %s)", t.ref[0]);
    gp_make_task(&t, GP_VT, 1);
    check(!strcmp(t.ref[0], "FBKVJ") && !strcmp(t.ref[4], "TMLOQ"), "vt seed 1 chain FBKVJ .. TMLOQ (got %s .. %s)", t.ref[0], t.ref[4]);
}

/* a user text as the haystack, repeated, and the distractors of niah_multikey */
static void test_haystack(const Tokenizer *tok) {
    const char *text = "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money\n"
                       "in my purse, and nothing particular to interest me on shore, I thought I would sail about\n"
                       "a little and see the watery part of the world.\n\nIt is a way I have of driving off the spleen.";
    char err[256];
    for (int id = 0; id < GP_N_TASKS; id++) {
        GpTask t;
        GpPrompt p;
        gp_make_task(&t, id, 3);
        if (gp_make_prompt(tok, &t, 3000, 0.25, text, &p, err, sizeof err)) { check(0, "%s with a haystack: %s", gp_task_names[id], err); continue; }
        int n = gp_ntok(tok, p.text, p.len, 1);
        double d = measured_depth(tok, &t, p.text, n);
        /* the text, repeated with its line breaks (niah_multikey only tops its distractors up with
           the text's first words when they fall short, here by none) */
        int text_ok = id == GP_NIAH_MULTIKEY ||
                      (strstr(p.text, "watery part of the world.\n\nIt is") && strstr(p.text, "the spleen.\nCall me"));
        check(n <= 3000 && n >= 3000 - TOL && fabs(d - 0.25) <= DEPTH_TOL && refs_and_order_ok(&t, p.text) && text_ok,
              "%s with a text haystack: %d tokens, depth %.3f, the text in it", gp_task_names[id], n, d);
        gp_free_prompt(&p);
    }
    GpTask t;
    GpPrompt p;
    gp_make_task(&t, GP_NIAH_MULTIKEY, 5);
    gp_make_prompt(tok, &t, 4000, 0.5, NULL, &p, err, sizeof err);
    int distractors = 0, target = 0;
    for (const char *s = p.text; (s = strstr(s, "One of the special magic numbers for ")); s++) {
        s += strlen("One of the special magic numbers for ");
        if (!strncmp(s, t.key, strlen(t.key)) && s[strlen(t.key)] == ' ') target++;
        else distractors++;
    }
    check(target == 1 && distractors > 100, "niah_multikey: the queried key occurs once among %d distractors", distractors);
    gp_free_prompt(&p);
}

/* files, task names */
static void test_files(void) {
    const char *path = "tests/bin/test_eval.tmp", *s = "VAR A = 1.\nline two";
    size_t n = 0;
    gp_write_file(path, s, strlen(s));
    char *back = gp_read_file(path, &n);
    check(back && n == strlen(s) && !memcmp(back, s, n), "a file written and read back is the same");
    free(back);
    remove(path);
    int names_ok = gp_task_id("nope") == -1;
    for (int id = 0; id < GP_N_TASKS; id++) names_ok &= gp_task_id(gp_task_names[id]) == id;
    check(names_ok, "task names map to their ids, an unknown one to -1");
    check(gp_utf8_ok((const unsigned char *)"caf\xc3\xa9", 5) && !gp_utf8_ok((const unsigned char *)"caf\xe9", 4),
          "UTF-8 check: \"caf\\xc3\\xa9\" valid, Latin-1 \"caf\\xe9\" not");
}

static void test_too_short(const Tokenizer *tok) {
    GpTask t;
    GpPrompt p;
    char err[256] = "";
    gp_make_task(&t, GP_VT, 1);
    int rc = gp_make_prompt(tok, &t, 60, 0.5, NULL, &p, err, sizeof err);
    check(rc == -1 && strstr(err, "too short"), "vt in 60 tokens is refused: %s", err);
}

/* the scoring rules on fixed strings */
static void test_scorer(void) {
    const char *key[] = {"68217"};
    check(gp_score(GP_PASSKEY, key, 1, " 68217.") == 1, "passkey: \" 68217.\" scores 1 for 68217");
    check(gp_score(GP_PASSKEY, key, 1, "The pass key is 12345") == 0, "passkey: \"The pass key is 12345\" scores 0 for 68217");
    check(gp_score(GP_PASSKEY, key, 1, "1 68217") == 0, "passkey: the first integer decides: \"1 68217\" scores 0");
    check(gp_score(GP_PASSKEY, key, 1, "682170") == 0 && gp_score(GP_PASSKEY, key, 1, "") == 0,
          "passkey: \"682170\" and \"\" score 0");
    check(gp_score(GP_PASSKEY, key, 1, "\n68217 is the pass key. 12345") == 1, "passkey: \"\\n68217 is the pass key. 12345\" scores 1");
    const char *num[] = {"9224453025"};
    check(gp_score(GP_NUMBER_STRING, num, 1, " 9224453025. Remember it.") == 1 &&
          gp_score(GP_NUMBER_STRING, num, 1, " 922445302") == 0, "number_string: the whole first integer must match");
    const char *val[] = {"4124159"};
    check(gp_score(GP_NIAH_SINGLE_1, val, 1, " 4124159.\nWhat") == 1 && gp_score(GP_NIAH_MULTIKEY, val, 1, "the number 41241 59") == 0,
          "niah: substring match of the value");
    const char *vars[] = {"FBKVJ", "BDHTX", "GCWVG", "RMPOO", "TMLOQ"};
    check(gp_score(GP_VT, vars, 5, " fbkvj, BdHtX, GCWVG, RMPOO, tmloq") == 1, "vt: all five names, any case, score 1");
    check(fabs(gp_score(GP_VT, vars, 5, " FBKVJ, BDHTX, XXXXX") - 0.4) < 1e-12, "vt: two of five names score 0.4");
    check(gp_score(GP_VT, vars, 5, " none") == 0, "vt: no names score 0");
    char refs_text[] = "  FBKVJ \r\n\nBDHTX\n";
    const char *refs[4];
    int n = gp_read_refs(refs_text, refs, 4);
    check(n == 2 && !strcmp(refs[0], "FBKVJ") && !strcmp(refs[1], "BDHTX"), "--answer lines are trimmed, empty ones skipped");
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "data/SmolLM2-135M-Instruct.Q4_1.gguf";
    test_scorer();
    test_files();
    GpModel m;
    char err[ERR_LEN];
    if (gp_load_model(&m, path, err)) {
        check(0, "the default model's tokenizer is needed: %s (run make model)", err);
        return check_summary();
    }
    check(m.ctx_train > 0, "%s: trained context %d tokens", path, m.ctx_train);
    test_lengths(&m.tok);
    test_seeds(&m.tok);
    test_haystack(&m.tok);
    test_too_short(&m.tok);
    gp_free_model(&m);
    return check_summary();
}
