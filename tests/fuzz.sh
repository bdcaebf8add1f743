#!/bin/sh
# make fuzz: each libFuzzer target for SECONDS (default 600) from the seed corpus and the kept
# inputs; the corpus grows in build/fuzz/corpus_*. A crash, leak, timeout (10 s on one input) or
# sanitizer report stops that target with its input saved as build/fuzz/crash_*; keep such an
# input in tests/fuzz/<target>/ once fixed, so make test replays it.
#   sh tests/fuzz.sh SECONDS SEEDS_DIR
set -u
secs=${1:-600}
seeds=${2:-tests/bin/fuzz_seeds.d}
status=0
for t in gguf tok; do
    corpus=build/fuzz/corpus_$t
    mkdir -p "$corpus"
    cp "$seeds/$t"/* tests/fuzz/$t/* "$corpus"/ 2>/dev/null
    echo "== fuzz_$t for $secs s (corpus $corpus: $(ls "$corpus" | wc -l) inputs)" >&2
    build/fuzz/fuzz_$t -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=200000 -print_final_stats=1 \
        -artifact_prefix=build/fuzz/crash_${t}_ "$corpus" 2>build/fuzz/fuzz_$t.log
    rc=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)' build/fuzz/fuzz_$t.log
    if [ $rc != 0 ]; then
        status=1
        echo "fuzz_$t: FAILED (exit $rc), see build/fuzz/fuzz_$t.log:" >&2
        grep -E 'ERROR|SUMMARY|Test unit written' build/fuzz/fuzz_$t.log | head -n 5 >&2
    else
        echo "fuzz_$t: clean for $secs s" >&2
    fi
done
exit $status
