#!/bin/sh
# A pass-key prompt (the InfiniteBench format: a 5-digit key in repeated noise) of about N
# tokens, for the benchmarks (tests/bench_index.sh, tests/bench_latency.sh).
#   sh tests/passkey_prompt.sh MODEL N OUT [shell]
# With tests/bin/gen_prompt (make tests/bin/gen_prompt) the prompt is at most N tokens of MODEL's
# tokenizer and within one noise sentence of it, key at half depth; without it, or with `shell`
# (tests/bench_ra.sh, whose README numbers were taken so), a shell generator writes about N
# tokens (within a few %), key 68217 at 40% depth.
set -eu
model=$1 n=$2 out=$3 how=${4:-}
if [ "$how" != shell ] && make -s tests/bin/gen_prompt >/dev/null 2>&1 &&
    tests/bin/gen_prompt -m "$model" --task passkey --tokens "$n" -o "$out" 2>/dev/null; then
    exit 0
fi
noise="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
reps=$((n / 25))
{
    printf 'There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.\n\n'
    i=0
    while [ $i -lt $reps ]; do
        [ $i -eq $((reps * 2 / 5)) ] && printf 'The pass key is 68217. Remember it. 68217 is the pass key. '
        printf '%s' "$noise"
        i=$((i + 1))
    done
    printf '\n\nWhat is the pass key? The pass key is'
} >"$out"
