#!/bin/sh
# make bench-latency: decoding latency per attention mode as the context grows (the paper's
# Table 4) and its breakdown into retrieval, attention and the rest (Table 6), with the prefill
# and index build times, from ./ra --stats. A benchmark: it prints numbers and asserts nothing.
#   LENGTHS="1024 2048 4096 8192 16384 32384" MODES="full ra flat ivf streaming" GEN=32 THREADS=2 \
#   OUT_DIR=results/bench_latency sh tests/bench_latency.sh MODEL
# AUDIT=1 adds --audit (recall@k per run; the audit's time is not in ms/token); KEEP_CACHE=1
# keeps each length's prefill (OUT/prefill_N.cache) for more runs with --prompt-cache.
# Writes OUT/latency.csv (one row per length and mode), prints Table 4 (ms/token, modes x
# lengths) with each mode's speed-up over full and its growth from the shortest length, and
# Table 6 (the breakdown at each length), and plots OUT/latency.png (ms/token vs context,
# gnuplot; skipped with a note when it is missing). Prompts past the model's trained
# context run all the same (-c raises it): the timings stand, the answers may not. Each length's
# prefill runs once: the first mode saves it (--prompt-cache), ra first (its indexes go in the
# file too, which the others pass over), the others read it, and every row shows the prefill time
# of the run that computed it (none, "-", when the cache was there before).
# full attention times no retrieval or attention apart: its row puts everything in "other".
set -eu
model=${1:?usage: sh tests/bench_latency.sh MODEL}
lengths=${LENGTHS:-1024 2048 4096 8192 16384 32384}
modes=${MODES:-full ra flat ivf streaming}
ra_first() { for m in "$@"; do [ "$m" != ra ] || echo ra; done; for m in "$@"; do [ "$m" = ra ] || echo "$m"; done; }
gen=${GEN:-32}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_latency}
audit=""; [ "${AUDIT:-0}" = 1 ] && audit=--audit   # recall@k of each run too (its time is not counted)
say() { echo "bench_latency: $*" >&2; }

mkdir -p "$out"
make -s ra >&2
csv=$out/latency.csv
echo "tokens,mode,attn,prefill_s,index_build_s,ms_per_token,retrieval_ms,attention_ms,other_ms,scan_ratio,peak_rss_mb,generated,insert_ms,recall_at_k,ttft_s" >"$csv"
for n in $lengths; do
    p=$out/passkey_$n.txt
    sh tests/passkey_prompt.sh "$model" "$n" "$p"
    first=""   # the stats of the run that computed the prefill (the others read it from the cache)
    for mode in $(ra_first $modes); do
        say "$n tokens, --attn $mode"
        s=$out/stats_${n}_$mode.json
        xb=; [ "$mode" = ra ] && xb="--exact-below 0 --index-wait"   # the method's cost at every length
        ./ra -m "$model" -f "$p" -n "$gen" --temp 0 --ignore-eos -t "$threads" -c $((n + gen + 64)) --attn "$mode" $xb $audit \
            --prompt-cache "$out/prefill_$n.cache" --stats "$s" >/dev/null 2>"$out/log_${n}_$mode.txt" ||
            { say "failed: see $out/log_${n}_$mode.txt"; continue; }
        [ -n "$first" ] || first=$s
        python3 - "$s" "$first" >>"$csv" <<'PY'
import json, sys
s, first = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
# a cache that existed before this run was loaded, not computed: no prefill time to show
prefill = "%.3f" % first["prefill_s"] if first.get("prompt_cache") != "loaded" else ""
print("%d,%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.5f,%.1f,%d,%.3f,%s,%.3f" % (
    s["prompt_tokens"], s["mode"], s["attn"], prefill, s["index_build_s"], s["decode_ms_per_token"],
    s["retrieval_ms"], s["attention_ms"], s["other_ms"], s["scan_ratio"], s["peak_rss_mb"], s["generated_tokens"],
    s["insert_ms"], "%.4f" % s["recall_at_k"] if "recall_at_k" in s else "", s["ttft_s"]))
PY
    done
    [ "${KEEP_CACHE:-0}" = 1 ] || rm -f "$out/prefill_$n.cache"
done

python3 - "$csv" "$out" <<'PY'
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1])))
out = sys.argv[2]
modes = list(dict.fromkeys(r["mode"] for r in rows))
lens = sorted({int(r["tokens"]) for r in rows})
at = {(r["mode"], int(r["tokens"])): r for r in rows}
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")] if os.path.exists("/proc/cpuinfo") else []
print("machine: %s, %d logical CPUs (timings compare within one run of this script only)\n" % (cpu[0] if cpu else "unknown CPU", len(cpu)))
ms = lambda m, n: float(at[m, n]["ms_per_token"]) if (m, n) in at else None
print("Table 4: decoding ms/token by context (prompt tokens)")
print("%-10s" % "mode" + "".join("%10d" % n for n in lens))
for m in modes:
    print("%-10s" % m + "".join("%10s" % ("%.2f" % ms(m, n) if (m, n) in at else "-") for n in lens))
# Table 4's claims as ratios between runs of this one invocation: faster than full attention,
# and nearly flat as the context grows
if "full" in modes:
    print("\nspeed-up over full attention (full ms/token / mode ms/token)")
    for m in modes:
        if m == "full": continue
        print("%-10s" % m + "".join("%10s" % ("%.2fx" % (ms("full", n) / ms(m, n)) if ms("full", n) and ms(m, n) else "-")
                                    for n in lens))
print("\ngrowth from the shortest length (mode ms/token / its ms/token at %d tokens)" % lens[0])
for m in modes:
    print("%-10s" % m + "".join("%10s" % ("%.2fx" % (ms(m, n) / ms(m, lens[0])) if ms(m, n) and ms(m, lens[0]) else "-")
                                for n in lens))
print("\nTable 6: breakdown per token (ms), prefill and index build (s)")
print("%7s %-10s %9s %9s %9s %9s %9s %7s %7s %9s %9s %9s" % ("tokens", "mode", "retrieval", "attention", "other",
      "(insert)", "total", "scan%", "recall", "prefill_s", "build_s", "ttft_s"))
for n in lens:
    for m in modes:
        r = at.get((m, n))
        if not r: continue
        timed = r["attn"] != "full"   # full attention (or a prompt within sink + window): no breakdown
        print("%7d %-10s %9s %9s %9.2f %9s %9.2f %7s %7s %9s %9.2f %9.2f" % (
            n, m, "%.2f" % float(r["retrieval_ms"]) if timed else "-", "%.2f" % float(r["attention_ms"]) if timed else "-",
            float(r["other_ms"]), "%.2f" % float(r["insert_ms"]) if m == "ra" and timed else "-", float(r["ms_per_token"]),
            "%.2f" % (100 * float(r["scan_ratio"])) if timed else "-",
            "%.3f" % float(r["recall_at_k"]) if timed and r["recall_at_k"] and m not in ("streaming",) else "-",
            "%.2f" % float(r["prefill_s"]) if r["prefill_s"] else "-", float(r["index_build_s"]), float(r["ttft_s"])))
with open(os.path.join(out, "latency.dat"), "w") as f:   # gnuplot: one block per mode
    for m in modes:
        f.write("# %s\n" % m)
        for n in lens:
            if (m, n) in at: f.write("%d %s\n" % (n, at[m, n]["ms_per_token"]))
        f.write("\n\n")
with open(os.path.join(out, "modes.txt"), "w") as f:
    f.write(" ".join(modes))
PY

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<EOF
set terminal pngcairo size 900,600 font ",11" noenhanced
set output "$out/latency.png"
set title "Table 4: decoding latency per token vs context ($threads threads)"
set xlabel "context (prompt tokens)"
set ylabel "ms / token"
set logscale x 2
set autoscale xfix
set offsets graph 0.05, graph 0.05, 0, 0
set grid
set key top left
set yrange [0:*]
names = "$(cat "$out/modes.txt")"
plot for [i=1:words(names)] "$out/latency.dat" index (i-1) using 1:2 with linespoints pt 7 ps 0.8 lw 2 title word(names, i)
EOF
    say "plot: $out/latency.png"
else
    say "gnuplot not found: no plot (apt-get install gnuplot-nox)"
fi
