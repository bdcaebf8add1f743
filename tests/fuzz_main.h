/* tests/fuzz_main.h - a driver for the libFuzzer targets without libFuzzer: each argument is a
 * file or a folder of files, each regular file is one input. make test replays the kept inputs
 * (tests/fuzz/) and the seed corpus this way under gcc, so a fixed bug stays fixed.
 * Prints "N passed, 0 failed"; an input that breaks a target aborts the program. */
#ifndef FUZZ_MAIN_H
#define FUZZ_MAIN_H
#include <dirent.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);

static int fuzz_replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "%s: cannot open\n", path), -1;
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *b = malloc(cap);
    while ((r = fread(b + n, 1, cap - n, f)) > 0)
        if ((n += r) == cap) b = realloc(b, cap *= 2);
    fclose(f);
    uint8_t *exact = malloc(n ? n : 1);   /* exactly n bytes, so a read past the end is caught */
    memcpy(exact, b, n);
    free(b);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    int n = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: missing\n", argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += fuzz_replay_file(argv[i]) != 0, n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;   /* a folder's files only: never wait on a FIFO */
            bad += fuzz_replay_file(path) != 0, n++;
        }
        if (d) closedir(d);
    }
    printf("%s: %d inputs replayed\n", argv[0], n);
    printf("%d passed, %d failed\n", n - bad, bad);
    return bad != 0;
}
#endif
