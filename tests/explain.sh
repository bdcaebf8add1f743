#!/bin/sh
# make explain: one decoding step of one query head, drawn. ./ra --trace L:H --trace-file runs
# the pass-key prompt (data/passkey.txt) to its first decoding step with every index built first;
# the step's record gives, for each key position, the exact attention weight of Eq. (1), whether
# it is in W (§3.3), whether the search scored it (Alg. 1 line 7), whether it is in Omega, and
# whether it is in the exact top-k. OUT/explain.png (gnuplot) plots the weight on a log scale
# against the position: W shaded, the keys scored in grey, Omega circled, the exact top-k
# crossed. OUT/explain.tsv holds the points, OUT/trace.txt the trace's lines.
#   TRACE=20:5 THREADS=2 OUT_DIR=results/explain sh tests/explain.sh MODEL
set -eu
model=${1:?usage: sh tests/explain.sh MODEL}
trace=${TRACE:-20:5}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/explain}
say() { echo "explain: $*" >&2; }
command -v gnuplot >/dev/null 2>&1 || { say "gnuplot not found (apt-get install gnuplot-nox)"; exit 1; }
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }

mkdir -p "$out"
make -s ra >&2
# -n 2: the first token comes from the prefill's logits, the second from the first decoding step
./ra -m "$model" -f data/passkey.txt -n 2 --temp 0 -t "$threads" --attn ra --exact-below 0 \
    --index-wait --trace "$trace" --trace-file "$out/trace.jsonl" >/dev/null 2>"$out/ra.err" ||
    { cat "$out/ra.err" >&2; exit 1; }
grep '^ra: trace' "$out/ra.err" >"$out/trace.txt"
cat "$out/trace.txt" >&2

# the first step's record: a row per key position, the title; W's bounds on stdout
bounds=$(python3 - "$out/trace.jsonl" "$out/explain.tsv" "$out/title.txt" <<'PY'
import json, sys
step = next(r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "step")
scored, omega, top = set(step["scored_pos"]), set(step["omega_pos"]), set(step["topk_pos"])
sink, w0 = step["sink"], step["idx_end"]
with open(sys.argv[2], "w") as f:
    f.write("# pos\tweight\tin_W\tscored\tin_omega\tin_topk\n")
    for i, a in enumerate(step["weight"]):
        f.write("%d\t%.6g\t%d\t%d\t%d\t%d\n" % (i, max(a, 1e-30), i < sink or i >= w0, i in scored,
                                                i in omega, i in top))
with open(sys.argv[3], "w") as f:
    f.write("layer %d, head %d, step at position %d: W = [0, %d) + [%d, %d]; line 7 scored %d of %d "
            "keys of H in %d hops; recall@%d %.2f; mass W %.3f + Omega %.3f; gamma1 %.3f, gamma2 %.3f"
            % (step["layer"], step["head"], step["pos"], sink, w0, step["pos"], step["scored"],
               step["n_h"], step["hops"], step["k"], step["recall"], step["mass_w"],
               step["mass_omega"], step["gamma1"], step["gamma2"]))
print("%d %d %d" % (sink, w0, step["pos"]))
PY
)
set -- $bounds
sink=$1 w0=$2 pos=$3
gnuplot <<GP
set terminal pngcairo size 1400,600 font ",11" noenhanced
set output "$out/explain.png"
set title "$(cat "$out/title.txt")" font ",10"
set xlabel "key position"
set ylabel "exact attention weight a_i, Eq. (1)"
set logscale y
set format y "1e%T"
set yrange [1e-9:1]
set xrange [0:$pos + 1]
set key top center horizontal
set object 1 rect from 0, graph 0 to $sink, graph 1 fc rgb "#dde8f5" fs solid noborder behind
set object 2 rect from $w0, graph 0 to $pos + 1, graph 1 fc rgb "#dde8f5" fs solid noborder behind
plot "$out/explain.tsv" using 1:(\$3 == 1 ? \$2 : 1/0) with points pt 7 ps 0.3 lc rgb "#7a9cc6" title "W (attended exactly, line 6)", \
     "" using 1:(\$3 == 0 && \$4 == 0 ? \$2 : 1/0) with points pt 7 ps 0.3 lc rgb "#d0d0d0" title "H, not scored", \
     "" using 1:(\$4 == 1 ? \$2 : 1/0) with points pt 7 ps 0.4 lc rgb "#808080" title "scored by the search (line 7)", \
     "" using 1:(\$6 == 1 ? \$2 : 1/0) with points pt 2 ps 1.2 lc rgb "#c0392b" title "exact top-k", \
     "" using 1:(\$5 == 1 ? \$2 : 1/0) with points pt 6 ps 1.2 lc rgb "#1f4e99" title "Omega, retrieved (line 8)"
GP
say "plot: $out/explain.png"
