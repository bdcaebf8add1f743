#!/bin/sh
# Under ThreadSanitizer (make test-tsan): ./ra runs that use every threaded part on the CPU side:
# the prefill workers (matmul, tiled attention), the index builds (RoarGraph over heads, IVF) on
# their own threads beside the prefill and decoding, the exact scans of the heads not yet indexed
# and their hand-over to the indexes, the parallel search and merge of decoding (Alg. 1 lines
# 6-8), the audit, the insertions, and the builds' save of a context file.
# Prints "N passed, N failed"; a race report makes the run exit non-zero (halt_on_error=1).
RA=${RA:-build/tsan/ra}
M=data/SmolLM2-135M-Instruct.Q4_1.gguf
P=${TMPDIR:-/tmp}/ra_tsan_prompt.txt
head -c 2400 data/passkey.txt >"$P"
passed=0
failed=0
for mode in full ra ivf flat; do
    xb=; [ $mode = ra ] && xb="--exact-below 0"   # the index, on a prompt too short to need it
    if TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} "$RA" -m $M -f "$P" -n 6 --temp 0 -t 3 -b 64 --attn $mode $xb \
        --sink 16 --window 64 --audit --ignore-eos >/dev/null 2>"$P.err"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: --attn $mode under ThreadSanitizer"; grep -A8 'WARNING' "$P.err" | head -n 30
    fi
done
# a context file saved by ra, then a longer prompt that reads it: the keys past it are inserted on
# every thread (attention_resume)
rm -f "$P.ctx"
cp "$P" "$P.more"
printf ' And then some more words at the end.' >>"$P.more"
for f in "$P" "$P.more"; do
    if TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} "$RA" -m $M -f "$f" -n 6 --temp 0 -t 3 -b 64 --attn ra --exact-below 0 \
        --sink 16 --window 64 --ignore-eos --prompt-cache "$P.ctx" >/dev/null 2>"$P.err"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: --prompt-cache ($f) under ThreadSanitizer"; grep -A8 'WARNING' "$P.err" | head -n 30
    fi
done
# a context file saved by full attention, which ra reads: the builds run the prompt again on
# their own state and threads for its queries while decoding goes on, then rewrite the file
rm -f "$P.full"
for mode in full ra; do
    xb=; [ $mode = ra ] && xb="--exact-below 0"
    if TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} "$RA" -m $M -f "$P" -n 6 --temp 0 -t 3 -b 64 --attn $mode $xb \
        --sink 16 --window 64 --ignore-eos --prompt-cache "$P.full" >/dev/null 2>"$P.err"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: --prompt-cache of full attention read by --attn $mode under ThreadSanitizer"; grep -A8 'WARNING' "$P.err" | head -n 30
    fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
