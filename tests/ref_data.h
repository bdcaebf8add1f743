/* Readers of the reference data in tests/data (made by tests/ref/make_ref.py and
   exact_logits.py; formats in tests/ref/README.md). The logits files (RLOG): "RLOG", version,
   n_prompts, n_vocab, then per prompt its token count, ids and the next-token logits at its
   last position. The text files: '#' header lines, then the data. */
#ifndef REF_DATA_H
#define REF_DATA_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* prompt p of path: its ids (n_ids) and logits (n_vocab), both malloc'd; 0, or -1 when the file
   is absent or malformed or has no prompt p */
static int read_rlog_prompt(const char *path, int p, int32_t **ids, int *n_ids, float **logits, int *n_vocab) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint32_t h[4], nt = 0;
    int ok = fread(h, 4, 4, f) == 4 && !memcmp(h, "RLOG", 4) && p >= 0 && (uint32_t)p < h[2] && h[3] > 0 &&
             h[3] < (1u << 24);
    for (int i = 0; ok && i < p; i++)   /* past the prompts before p */
        ok = fread(&nt, 4, 1, f) == 1 && nt < (1u << 24) && fseek(f, ((long)nt + (long)h[3]) * 4, SEEK_CUR) == 0;
    ok = ok && fread(&nt, 4, 1, f) == 1 && nt > 0 && nt < (1u << 24);
    *ids = ok ? malloc((size_t)nt * 4) : NULL;
    *logits = ok ? malloc((size_t)h[3] * 4) : NULL;
    ok = ok && *ids && *logits && fread(*ids, 4, nt, f) == nt && fread(*logits, 4, h[3], f) == h[3];
    fclose(f);
    if (!ok) {
        free(*ids), free(*logits);
        *ids = NULL, *logits = NULL;
        return -1;
    }
    *n_ids = (int)nt, *n_vocab = (int)h[3];
    return 0;
}
/* past a text reference file's '#' header lines */
static void skip_header_lines(FILE *f) {
    int c;
    while ((c = fgetc(f)) == '#')
        while ((c = fgetc(f)) != '\n' && c != EOF) {}
    if (c != EOF) ungetc(c, f);
}
#endif
