#!/bin/sh
# make valgrind: short end-to-end runs on the default model under valgrind memcheck (full
# attention and RetrievalAttention with a small static pattern, so the index build, search and
# insertion all run; then a -cnv session that saves a context file and one that reads it; then
# full attention's context file read by ra, which runs the prompt again for its queries). The
# binary is built without -march=native: valgrind does not know AVX-512.
# Any memory error or definite/indirect leak fails the run.
#   sh tests/valgrind.sh RA MODEL
RA=$1
M=$2
P=${TMPDIR:-/tmp}/ra_valgrind_prompt.txt
head -c 500 data/passkey.txt >"$P"
status=0
for mode in full ra; do
    echo "== valgrind ./ra --attn $mode" >&2
    xb=; [ $mode = ra ] && xb="--exact-below 0"   # the index, on a prompt too short to need it
    valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
        --show-leak-kinds=definite,indirect "$RA" -m "$M" -f "$P" -n 4 --temp 0 -t 2 --attn $mode $xb \
        --sink 8 --window 24 --ignore-eos --stats "$P.$mode.json" >/dev/null
    rc=$?
    if [ $rc = 0 ]; then echo "valgrind --attn $mode: clean" >&2; else echo "valgrind --attn $mode: FAILED (exit $rc)" >&2; status=1; fi
done
# -cnv, twice: the first session saves the context file (KV cache and indexes), the second reads
# it; a question each, from stdin
rm -f "$P.ctx"
for run in save load; do
    echo "== valgrind ./ra -cnv --attn ra --prompt-cache ($run)" >&2
    printf 'Repeat the pass key.\n' | valgrind -q --error-exitcode=99 --leak-check=full \
        --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect "$RA" -m "$M" -f "$P" -cnv -n 4 \
        --temp 0 -t 2 --attn ra --exact-below 0 --sink 8 --window 24 --prompt-cache "$P.ctx" >/dev/null
    rc=$?
    if [ $rc = 0 ]; then echo "valgrind -cnv ($run): clean" >&2; else echo "valgrind -cnv ($run): FAILED (exit $rc)" >&2; status=1; fi
done
# a context file of full attention, which ra reads: its builds run the prompt again on their own
# state for its queries, then rewrite the file with the indexes
rm -f "$P.full"
for mode in full ra; do
    echo "== valgrind ./ra --attn $mode --prompt-cache (full attention's file)" >&2
    valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
        --show-leak-kinds=definite,indirect "$RA" -m "$M" -f "$P" -n 4 --temp 0 -t 2 --attn $mode --exact-below 0 \
        --sink 8 --window 24 --ignore-eos --prompt-cache "$P.full" >/dev/null 2>"$P.err"
    rc=$?
    if [ $rc = 0 ]; then echo "valgrind --attn $mode, full's file: clean" >&2; else echo "valgrind --attn $mode, full's file: FAILED (exit $rc)" >&2; cat "$P.err" >&2; status=1; fi
done
exit $status
