#!/bin/sh
# Under ThreadSanitizer (make test-tsan): ./ra runs that use every threaded part on the CPU side:
# the prefill workers (matmul, tiled attention), the index builds (RoarGraph over heads, IVF),
# the parallel search and merge of decoding (Alg. 1 lines 6-8), the audit and the insertions.
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
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
