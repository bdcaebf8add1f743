/* tests/check.h - the tests' one assertion: count, report the failure with file:line, go on.
 * Every test program ends with check_summary(), which prints "N passed, N failed" and
 * returns the exit status (non-zero on any failure). */
#ifndef CHECK_H
#define CHECK_H
#include <stdarg.h>
#include <stdio.h>

static int check_passed, check_failed;

/* the same as a function, printing every result as a PASS or FAIL line */
static inline void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) check_passed++;
    else check_failed++;
    fflush(stdout);
}

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) check_passed++;                                           \
        else {                                                              \
            check_failed++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

static int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
#endif
