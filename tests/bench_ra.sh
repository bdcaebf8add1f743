#!/bin/sh
# make bench-ra: RetrievalAttention against full attention and the baselines on the default
# model, at prompt lengths given in tokens (default 8192). A benchmark: it prints numbers and
# asserts nothing. For each length it writes a pass-key prompt (the InfiniteBench format, key at
# 40% depth), then runs each mode with --audit and --stats, and prints one line per run. The
# prefill runs once per length (ra at the first ef saves it, with its indexes, with
# --prompt-cache; the others read it); every row shows the time it took.
#   LENGTHS="8192 16384" EFS="100 200 400" sh tests/bench_ra.sh MODEL
set -eu
model=$1
lengths=${LENGTHS:-8192}
efs=${EFS:-100 200 400}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_ra}
mkdir -p "$out"
printf '%-6s %-9s %5s %9s %9s %9s %8s %8s %9s %9s %9s %8s\n' tokens mode ef prefill_s build_s ms/token scan% recall retr_ms attn_ms other_ms answer
for n in $lengths; do
    p="$out/passkey_$n.txt"
    sh tests/passkey_prompt.sh "$model" "$n" "$p" shell
    run() {   # mode ef
        s="$out/stats_${n}_$1_$2.json"
        xb=; [ "$1" = ra ] && xb="--exact-below 0 --index-wait"   # the index at every length, built first
        ans=$(./ra -m "$model" -f "$p" -n 16 --temp 0 --ignore-eos -t "$threads" -c $((n + 64)) --attn "$1" $xb --ef "$2" \
              --audit --prompt-cache "$out/prefill_$n.cache" --stats "$s" 2>/dev/null | tr -d '\n')
        ans=$(printf '%s' "$ans" | cut -c1-8)
        python3 - "$s" "$n" "$1" "$2" "$ans" "$out/stats_${n}_ra_${efs%% *}.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
prefill = json.load(open(sys.argv[6]))["prefill_s"]   # the run that computed it (ra, first)
print("%-6s %-9s %5s %9.1f %9.1f %9.2f %8.2f %8.3f %9.2f %9.2f %9.2f %8s" % (
    s["prompt_tokens"], sys.argv[3], sys.argv[4], prefill, s["index_build_s"], s["decode_ms_per_token"],
    100 * s["scan_ratio"], s.get("recall_at_k", 0), s["retrieval_ms"], s["attention_ms"], s["other_ms"], sys.argv[5].strip()))
PY
    }
    for ef in $efs; do run ra "$ef"; done
    run full 200
    run flat 200
    run ivf 200
    run streaming 200
    rm -f "$out/prefill_$n.cache"
done
