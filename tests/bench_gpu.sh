#!/bin/sh
# make bench-gpu: the GPU path's benchmark (README, "The GPU path"): prefill time (and its
# causal attention's part), index build time (its KNN on the GPU, its connectivity step on the
# CPU threads, the share of keys that step linked, the part of it that ran during the prefill),
# the time to the first token, decode ms/token with
# the paper's Table 6 split (retrieval / attention / other), device memory (the peak, what was
# in use before the run, and the plan), host memory (the preflight's plan and the measured
# peak), and the shares of layer steps whose o_W, and of indexes whose KNN, came from the GPU,
# per context length and mode, from ./ra --stats. A benchmark: it prints numbers and asserts
# nothing. On a machine without a GPU ./ra says so and runs on the CPU (the rows show gpu 0).
#   MODEL=preset:llama3-8b LENGTHS="32768 65536 131072" MODES="full ra" GEN=8 \
#   GPU_MEM=24000 THREADS=16 OUT_DIR=results/bench_gpu sh tests/bench_gpu.sh
# MODEL is a GGUF, or preset:NAME for a random-weight model of that shape (tests/bin/gen_model,
# written once into OUT_DIR; llama3-8b is 8.5 GB). Its timings are the shape's; its scan ratios
# and answers mean nothing (flat attention). QSTRIDE=S passes ra's --q-stride S (the build's KNN
# uses every S-th prefill query; default: ra's own sample). INDEX_WAIT=1 passes ra's --index-wait
# (every index built before the first token); by default decoding starts when the prefill ends,
# and the rows give when the last index took over and the decoding rates before and after. GPU_MEM is --gpu-mem (MiB): 24000
# makes each run's device plan fit a 24 GB card. No context file is written (at 128K the 8B
# shape's would be about 50 GB).
# Rows are appended to OUT/gpu.csv, so runs of one length or mode at a time (a device call's
# time limit) add up; the table printed at the end is every row so far, and OUT/gpu_latency.png
# plots them (gnuplot; skipped with a note when it is missing): decode ms/token and prefill
# seconds against the context, a line per model and mode (the latest row of each length).
# PLOT_ONLY=1: no runs, the table and the plot of OUT/gpu.csv as it is (a CSV from the GPU
# machine plotted on another); PLOT_TITLE: the plot's title (the machine, the date).
set -eu
model=${MODEL:-data/SmolLM2-135M-Instruct.Q4_1.gguf}
lengths=${LENGTHS:-32768 65536 131072}
modes=${MODES:-full ra}
gen=${GEN:-8}
qstride=${QSTRIDE:-}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_gpu}
gpu_mem=""; [ -n "${GPU_MEM:-}" ] && gpu_mem="--gpu-mem $GPU_MEM"
say() { echo "bench_gpu: $*" >&2; }

mkdir -p "$out"
csv=$out/gpu.csv
header="model,tokens,mode,q_stride,gpu,prefill_s,prefill_tok_s,prefill_attn_s,index_build_s,knn_s,ms_per_token,retrieval_ms,attention_ms,other_ms,insert_ms,scan_ratio,gpu_peak_mb,gpu_base_mb,gpu_plan_mb,w_on_gpu,knn_on_gpu,mem_plan_mb,peak_rss_mb,generated,conn_s,conn_keys,ttft_s,build_overlap_s,q_used,index_wait,index_ready_s,exact_steps,decode_exact_ms,decode_indexed_ms"
if [ "${PLOT_ONLY:-0}" = 1 ]; then
    [ -f "$csv" ] || { say "PLOT_ONLY=1: no $csv"; exit 1; }
    [ "$(head -n 1 "$csv")" = "$header" ] || { say "PLOT_ONLY=1: $csv has other columns than these: $header"; exit 1; }
    lengths=""   # no runs
else
    make -s ra tests/bin/gen_prompt >&2
    case $model in
    preset:*)
        preset=${model#preset:}
        model=$out/$preset.gguf
        if [ ! -f "$model" ]; then
            say "writing a random-weight $preset model to $model"
            make -s tests/bin/gen_model >&2
            tests/bin/gen_model "$model" --preset "$preset" --no-check --no-sync >&2
        fi
        ;;
    esac
    [ -f "$model" ] || { say "no model $model (make model, or MODEL=preset:NAME)"; exit 1; }
    if [ -f "$csv" ] && [ "$(head -n 1 "$csv")" != "$header" ]; then   # rows of an earlier layout
        old=$csv.$(date +%Y%m%d-%H%M%S).old
        say "$csv has other columns: moved to $old"
        mv "$csv" "$old"
    fi
    [ -f "$csv" ] || echo "$header" >"$csv"
fi
for n in $lengths; do
    p=$out/passkey_$n.txt
    tests/bin/gen_prompt -m "$model" --task passkey --tokens "$n" -o "$p" 2>/dev/null ||
        { say "gen_prompt failed for $n tokens"; continue; }
    for mode in $modes; do
        s=$out/stats_${n}_$mode.json
        qs=""; [ "$mode" = ra ] && [ -n "$qstride" ] && qs="--q-stride $qstride"
        [ "$mode" = ra ] && qs="$qs --exact-below 0"   # the method's cost at every length
        [ "$mode" = ra ] && [ "${INDEX_WAIT:-0}" = 1 ] && qs="$qs --index-wait"
        say "$n tokens, --attn $mode $qs"
        # shellcheck disable=SC2086  # $qs and $gpu_mem are a few words, or none
        ./ra -m "$model" -f "$p" -n "$gen" --temp 0 --ignore-eos -t "$threads" -c $((n + gen + 64)) --attn "$mode" \
            $qs $gpu_mem --stats "$s" >"$out/out_${n}_$mode.txt" 2>"$out/log_${n}_$mode.txt" ||
            { say "failed: see $out/log_${n}_$mode.txt"; tail -n 2 "$out/log_${n}_$mode.txt" >&2; continue; }
        python3 - "$s" "$model" >>"$csv" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
qs = str(s["q_stride"]) if s["mode"] == "ra" else ""   # 0: ra's own sample
print("%s,%d,%s,%s,%d,%.2f,%.1f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.5f,%.0f,%.0f,%.0f,%.3f,%.3f,%.0f,%.0f,%d,%.2f,%.4f,%.2f,%.2f,%d,%d,%.2f,%d,%.2f,%.2f" % (
    os.path.basename(sys.argv[2]), s["prompt_tokens"], s["attn"], qs, s["gpu"], s["prefill_s"], s["prefill_tok_s"],
    s["prefill_attn_s"], s["index_build_s"], s["knn_s"], s["decode_ms_per_token"], s["retrieval_ms"], s["attention_ms"], s["other_ms"],
    s["insert_ms"], s["scan_ratio"], s["gpu_peak_mb"], s["gpu_base_mb"], s["gpu_plan_mb"], s["w_on_gpu"], s["knn_on_gpu"],
    s["mem_plan_mb"],
    s["peak_rss_mb"], s["generated_tokens"], s["conn_s"], s["conn_keys"], s["ttft_s"], s["build_overlap_s"],
    s["q_used"], s["index_wait"], s["index_ready_s"], s["exact_steps"], s["decode_exact_ms"], s["decode_indexed_ms"]))
PY
    done
done

python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| model | tokens | mode | gpu | prefill s (tok/s; attention s) | index build s (KNN s; connectivity s, keys linked; not waited for s), queries a head | first token s | indexes ready s (steps before: ms/token; after) | decode ms/token | retrieval / attention / other (insert) | scan | GPU MiB, peak (before; plan) | o_W on GPU | KNN on GPU | host GB, plan / peak |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    ra = r["mode"] == "ra"
    print("| %s | %s | %s%s%s | %s | %s (%s; %s) | %s | %s | %s | %s | %s | %s | %s (%s; %s) | %s | %s | %.1f / %.1f |" % (
        r["model"], r["tokens"], r["mode"], " --q-stride " + r["q_stride"] if ra and r["q_stride"] not in ("0", "1") else "",
        " --index-wait" if ra and r["index_wait"] == "1" else "",
        r["gpu"], r["prefill_s"], r["prefill_tok_s"], r["prefill_attn_s"],
        "%s (%s; %s, %.0f%%; %s), %s" % (r["index_build_s"], r["knn_s"], r["conn_s"], 100 * float(r["conn_keys"]),
                                         r["build_overlap_s"], r["q_used"]) if ra else "",
        r["ttft_s"],
        "%s (%s: %s; %s)" % (r["index_ready_s"], r["exact_steps"], r["decode_exact_ms"], r["decode_indexed_ms"]) if ra else "",
        r["ms_per_token"],
        "%s / %s / %s (%s)" % (r["retrieval_ms"], r["attention_ms"], r["other_ms"], r["insert_ms"]) if ra else "",
        "%.2f%%" % (100 * float(r["scan_ratio"])) if ra else "", r["gpu_peak_mb"], r["gpu_base_mb"], r["gpu_plan_mb"],
        "%.0f%%" % (100 * float(r["w_on_gpu"])) if ra else "", "%.0f%%" % (100 * float(r["knn_on_gpu"])) if ra else "",
        float(r["mem_plan_mb"]) * 1048576 / 1e9, float(r["peak_rss_mb"]) * 1048576 / 1e9))
PY
echo "bench_gpu: rows in $csv" >&2

python3 - "$csv" "$out" <<'PY'
import csv, os, sys
last = {}   # (series, tokens) -> the latest row
for r in csv.DictReader(open(sys.argv[1])):
    name = "%s %s" % (r["model"][:-5] if r["model"].endswith(".gguf") else r["model"], r["mode"])
    last[name, int(r["tokens"])] = r
series = sorted({k[0] for k in last})
with open(os.path.join(sys.argv[2], "gpu_latency.dat"), "w") as f:   # gnuplot: one block per series
    for name in series:
        f.write("# %s: tokens ms_per_token prefill_s index_build_s\n" % name)
        for n in sorted(k[1] for k in last if k[0] == name):
            r = last[name, n]
            f.write("%d %s %s %s\n" % (n, r["ms_per_token"], r["prefill_s"], r["index_build_s"] or "0"))
        f.write("\n\n")
with open(os.path.join(sys.argv[2], "gpu_series.txt"), "w") as f:
    f.write("\n".join(series) + "\n")
PY
if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<EOF && say "plot: $out/gpu_latency.png" || say "gnuplot failed (above): no plot"
set terminal pngcairo size 1300,560 font ",11" noenhanced
set output "$out/gpu_latency.png"
n = int(system("wc -l <'$out/gpu_series.txt'"))
name(i) = system(sprintf("sed -n %dp '$out/gpu_series.txt'", i))
set multiplot layout 1,2 title "${PLOT_TITLE:-make bench-gpu}"
set xlabel "context (prompt tokens)"
set logscale x 2
set logscale y 10
set autoscale xfix
set offsets graph 0.05, graph 0.05, 0, 0
set grid
set key top left
set title "decoding, ms per token (dashed: the target, 50 at 128K for the 8B shape)"
set arrow from graph 0, first 50 to graph 1, first 50 nohead dt 2 lc rgb "gray40"
plot for [i=1:n] "$out/gpu_latency.dat" index (i-1) using 1:(\$2 > 0 ? \$2 : 1/0) with linespoints pt 7 ps 0.8 lw 2 lc i title name(i)
unset arrow
set title "prefill (solid) and ra's index build (dashed), seconds"
plot for [i=1:n] "$out/gpu_latency.dat" index (i-1) using 1:(\$3 > 0 ? \$3 : 1/0) with linespoints pt 7 ps 0.8 lw 2 lc i title name(i), \
     for [i=1:n] "$out/gpu_latency.dat" index (i-1) using 1:(\$4 > 0 ? \$4 : 1/0) with linespoints pt 5 ps 0.8 lw 2 dt 2 lc i notitle
unset multiplot
EOF
else
    say "gnuplot not found: no plot (apt-get install gnuplot-nox)"
fi
