#!/bin/sh
# make bench-gpu: the GPU path's benchmark (README, "The GPU path"): prefill time (and its
# causal attention's part), index build time (and its KNN on the GPU), decode ms/token with
# the paper's Table 6 split (retrieval / attention / other), device memory, host memory (the
# preflight's plan and the measured peak), and the shares of layer steps whose o_W, and of
# indexes whose KNN, came from the GPU, per context length and mode, from ./ra --stats. A
# benchmark: it prints numbers and asserts nothing. On a machine without a GPU ./ra says so and
# runs on the CPU (the rows show gpu 0).
#   MODEL=preset:llama3-8b LENGTHS="32768 65536 131072" MODES="full ra" GEN=8 QSTRIDE=16 \
#   GPU_MEM=24000 THREADS=16 OUT_DIR=results/bench_gpu sh tests/bench_gpu.sh
# MODEL is a GGUF, or preset:NAME for a random-weight model of that shape (tests/bin/gen_model,
# written once into OUT_DIR; llama3-8b is 8.5 GB). Its timings are the shape's; its scan ratios
# and answers mean nothing (flat attention). QSTRIDE is ra's --q-stride (the build's KNN uses
# every QSTRIDE-th prefill query). GPU_MEM is --gpu-mem (MiB): 24000 makes each run's device plan
# fit a 24 GB card. No prompt cache is written (at 128K the 8B shape's would be about 100 GB).
# Rows are appended to OUT/gpu.csv, so runs of one length or mode at a time (a device call's
# time limit) add up; the table printed at the end is every row so far.
set -eu
model=${MODEL:-data/SmolLM2-135M-Instruct.Q4_1.gguf}
lengths=${LENGTHS:-32768 65536 131072}
modes=${MODES:-full ra}
gen=${GEN:-8}
qstride=${QSTRIDE:-1}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_gpu}
gpu_mem=""; [ -n "${GPU_MEM:-}" ] && gpu_mem="--gpu-mem $GPU_MEM"
say() { echo "bench_gpu: $*" >&2; }

mkdir -p "$out"
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
csv=$out/gpu.csv
header="model,tokens,mode,q_stride,gpu,prefill_s,prefill_tok_s,prefill_attn_s,index_build_s,knn_s,ms_per_token,retrieval_ms,attention_ms,other_ms,insert_ms,scan_ratio,gpu_peak_mb,w_on_gpu,knn_on_gpu,mem_plan_mb,peak_rss_mb,generated"
if [ -f "$csv" ] && [ "$(head -n 1 "$csv")" != "$header" ]; then   # rows of an earlier layout
    old=$csv.$(date +%Y%m%d-%H%M%S).old
    say "$csv has other columns: moved to $old"
    mv "$csv" "$old"
fi
[ -f "$csv" ] || echo "$header" >"$csv"
for n in $lengths; do
    p=$out/passkey_$n.txt
    tests/bin/gen_prompt -m "$model" --task passkey --tokens "$n" -o "$p" 2>/dev/null ||
        { say "gen_prompt failed for $n tokens"; continue; }
    for mode in $modes; do
        s=$out/stats_${n}_$mode.json
        qs=""; [ "$mode" = ra ] && qs="--q-stride $qstride"
        say "$n tokens, --attn $mode $qs"
        # shellcheck disable=SC2086  # $qs and $gpu_mem are zero or two words
        ./ra -m "$model" -f "$p" -n "$gen" --temp 0 --ignore-eos -t "$threads" -c $((n + gen + 64)) --attn "$mode" \
            $qs $gpu_mem --stats "$s" >"$out/out_${n}_$mode.txt" 2>"$out/log_${n}_$mode.txt" ||
            { say "failed: see $out/log_${n}_$mode.txt"; tail -n 2 "$out/log_${n}_$mode.txt" >&2; continue; }
        python3 - "$s" "$model" "$qstride" >>"$csv" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
qs = sys.argv[3] if s["mode"] == "ra" else ""
print("%s,%d,%s,%s,%d,%.2f,%.1f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.5f,%.0f,%.3f,%.3f,%.0f,%.0f,%d" % (
    os.path.basename(sys.argv[2]), s["prompt_tokens"], s["attn"], qs, s["gpu"], s["prefill_s"], s["prefill_tok_s"],
    s["prefill_attn_s"], s["index_build_s"], s["knn_s"], s["decode_ms_per_token"], s["retrieval_ms"], s["attention_ms"], s["other_ms"],
    s["insert_ms"], s["scan_ratio"], s["gpu_peak_mb"], s["w_on_gpu"], s["knn_on_gpu"], s["mem_plan_mb"],
    s["peak_rss_mb"], s["generated_tokens"]))
PY
    done
done

python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| model | tokens | mode | gpu | prefill s (tok/s; attention s) | index build s (KNN s) | decode ms/token | retrieval / attention / other (insert) | scan | gpu_peak_mb | o_W on GPU | KNN on GPU | host GB, plan / peak |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    ra = r["mode"] == "ra"
    print("| %s | %s | %s%s | %s | %s (%s; %s) | %s | %s | %s | %s | %s | %s | %s | %.1f / %.1f |" % (
        r["model"], r["tokens"], r["mode"], " --q-stride " + r["q_stride"] if ra and r["q_stride"] != "1" else "",
        r["gpu"], r["prefill_s"], r["prefill_tok_s"], r["prefill_attn_s"],
        "%s (%s)" % (r["index_build_s"], r["knn_s"]) if ra else "", r["ms_per_token"],
        "%s / %s / %s (%s)" % (r["retrieval_ms"], r["attention_ms"], r["other_ms"], r["insert_ms"]) if ra else "",
        "%.2f%%" % (100 * float(r["scan_ratio"])) if ra else "", r["gpu_peak_mb"],
        "%.0f%%" % (100 * float(r["w_on_gpu"])) if ra else "", "%.0f%%" % (100 * float(r["knn_on_gpu"])) if ra else "",
        float(r["mem_plan_mb"]) * 1048576 / 1e9, float(r["peak_rss_mb"]) * 1048576 / 1e9))
PY
echo "bench_gpu: rows in $csv" >&2
