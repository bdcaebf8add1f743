#!/bin/sh
# make bench-index: the vector-search side of the paper on real queries and keys (§2.4, Fig. 2b
# and 2c; §3.2). A benchmark: it prints numbers and asserts nothing.
#   1. a pass-key prompt of LENGTH tokens (tests/passkey_prompt.sh)
#   2. ./ra --dump-qk: post-RoPE queries and keys of every layer and head, GEN generated tokens
#   3. tests/bin/bench_index: ra's attention-aware index (§3.2) and ra's IVF, Q->K and K->K
#   4. tests/bench_index_faiss.py: Faiss IVF and HNSW on the same keys, queries, ground truth,
#      and the Mahalanobis distances of Fig. 2c (numpy + faiss-cpu, installed into .venv)
#   5. OUT/recall.csv, two tables (recall@100 at a given scan; the scan needed for recall 0.95,
#      on the curve averaged over the sampled heads), OUT/mahalanobis.csv and its table, and
#      OUT/recall_qk.png, OUT/recall_kk.png (gnuplot; skipped with a note when it is missing)
#   LENGTH=8192 GEN=128 SAMPLES=6 THREADS=2 OUT_DIR=results/bench_index sh tests/bench_index.sh MODEL
# The dump (OUT/dump_LENGTH, about 115 KB a token) is kept and reused by the next run at the same
# LENGTH and GEN; REDUMP=1 makes it again, KEEP_DUMP=0 deletes it at the end.
# TEMP=T samples the generated tokens at temperature T (seed SEED, default 1) instead of greedy
# decoding: far past its trained context a small model's greedy text can repeat one token, whose
# queries are then all alike. A dump is reused only when it was made with the same TEMP and SEED
# (OUT/dump_LENGTH/sampling: "greedy" or "temp T seed S" and the sampler's filters, so that a dump
# sampled before the chain of 2026-11-26 is made again; a dump without that file was greedy).
# QK_ONLY=1: Q->K only (no K->K, no Fig. 2c); NO_HNSW=1: no Faiss HNSW. For long contexts: at
# 128K the twelve index builds and Faiss's one-thread HNSW builds take most of an hour here.
set -eu
model=${1:?usage: sh tests/bench_index.sh MODEL}
length=${LENGTH:-8192}
gen=${GEN:-128}
samples=${SAMPLES:-6}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_index}
dump=$out/dump_$length
py=${PYTHON:-.venv/bin/python}
say() { echo "bench_index: $*" >&2; }

mkdir -p "$out"
make -s ra tests/bin/bench_index >&2

# 1-2. prompt and dump (-n GEN+1: the last token generated is sampled, never run, so GEN run)
sampling="temp ${TEMP:-0} seed ${SEED:-1} top-k 40 top-p 0.95 min-p 0.05"   # ./ra's sampler chain, its defaults
if [ "${TEMP:-0}" = 0 ]; then sampling=greedy; fi          # the seed does not matter then
made=$(cat "$dump/sampling" 2>/dev/null || echo greedy)    # a dump from before this file: greedy
if [ "${REDUMP:-0}" = 1 ] || [ "$made" != "$sampling" ] || ! grep -q "\"n_gen\": $gen," "$dump/meta.json" 2>/dev/null; then
    say "pass-key prompt of $length tokens, then ./ra --dump-qk with $gen generated tokens"
    sh tests/passkey_prompt.sh "$model" "$length" "$out/passkey_$length.txt"
    ./ra -m "$model" -f "$out/passkey_$length.txt" -n $((gen + 1)) --temp "${TEMP:-0}" --seed "${SEED:-1}" --ignore-eos -t "$threads" \
        -c $((length + gen + 64)) --attn full --dump-qk "$dump" \
        >"$out/answer_$length.txt"
    echo "$sampling" >"$dump/sampling"
else
    say "reusing the dump in $dump (REDUMP=1 makes it again)"
fi
pairs=$(tests/bin/bench_index "$dump" --pairs -s "$samples")

# 3. ra's indexes
say "ra's RA index and IVF on (layer:head) $pairs"
mkdir -p "$out/gt"
qk=; if [ "${QK_ONLY:-0}" = 1 ]; then qk=--qk-only; fi
tests/bin/bench_index "$dump" -p "$pairs" -g "$out/gt" -t "$threads" $qk >"$out/ra.csv"

# 4. Faiss, in a virtual environment of its own
if ! "$py" -c 'import faiss, numpy' 2>/dev/null; then
    say "installing numpy and faiss-cpu into .venv"
    { python3 -m venv .venv && .venv/bin/pip install -q numpy faiss-cpu; } >&2 || true
    py=.venv/bin/python
fi
rm -f "$out/faiss.csv" "$out/mahalanobis.csv"
if "$py" -c 'import faiss, numpy' 2>/dev/null; then
    say "Faiss IVF and HNSW, Mahalanobis distances"
    nohnsw=; if [ "${NO_HNSW:-0}" = 1 ]; then nohnsw=--no-hnsw; fi
    if [ -n "$qk" ]; then
        "$py" tests/bench_index_faiss.py "$dump" -p "$pairs" -g "$out/gt" -o "$out/faiss.csv" $qk $nohnsw
    else
        "$py" tests/bench_index_faiss.py "$dump" -p "$pairs" -g "$out/gt" -o "$out/faiss.csv" $nohnsw \
            --mahalanobis "$out/mahalanobis.csv"
    fi
else
    say "no numpy + faiss-cpu (pip failed): the Faiss rows and Fig. 2c are left out"
fi

# 5. tables and plots
cp "$out/ra.csv" "$out/recall.csv"
if [ -f "$out/faiss.csv" ]; then tail -n +2 "$out/faiss.csv" >>"$out/recall.csv"; fi
python3 - "$out" "$length" <<'PY'
import csv, os, sys
sys.path.insert(0, "tests")
from collections import defaultdict
from recall_curve import mean_curves, recall_at, scan_for
out, length = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(os.path.join(out, "recall.csv"))))
curves = mean_curves(rows)   # per (method, kind): per param, scan and recall averaged over the heads
methods = [m for m in ("ra", "ra_warm", "faiss_hnsw", "faiss_ivf", "ra_ivf") if any(k[0] == m for k in curves)]
heads = len({(r["layer"], r["head"]) for r in rows})

scans = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
print("Fig. 2b: recall@100 at a given scan (keys scored / keys indexed), %s tokens, mean of %d heads" % (length, heads))
print("%-4s %-11s" % ("kind", "method") + "".join("%8s" % ("%g%%" % (100 * s)) for s in scans) + "   scan for recall 0.95")
for kind in ("QK", "KK"):
    for m in methods:
        c = curves.get((m, kind))
        if not c: continue
        cells = "".join("%8s" % ("-" if recall_at(c, s) is None else "%.3f" % recall_at(c, s)) for s in scans)
        print("%-4s %-11s%s   %s" % (kind, m, cells, scan_for(c, 0.95)))
print("('-': below the smallest scan of the sweep; '<=': the smallest ef/nprobe already reaches 0.95)")
for kind in ("QK", "KK"):   # gnuplot data: one block per method that has this kind (ra_warm: QK only)
    have = [m for m in methods if curves.get((m, kind))]
    with open(os.path.join(out, "curve_%s.dat" % kind.lower()), "w") as f:
        for m in have:
            f.write("# %s\n" % m)
            for s, r, p in curves[(m, kind)]:
                f.write("%.6f %.5f %d\n" % (100 * s, r, p))
            f.write("\n\n")
    with open(os.path.join(out, "methods_%s.txt" % kind.lower()), "w") as f:
        f.write(" ".join(have))

mp = os.path.join(out, "mahalanobis.csv")
if os.path.exists(mp):
    mr = list(csv.DictReader(open(mp)))
    sets = ["Q_decode", "Q_prefill", "K_holdout", "K_gen"]
    print("\nFig. 2c: Mahalanobis distance to the keys' distribution, mean / median (in-distribution: about sqrt(hd))")
    print("%-9s" % "head" + "".join("%19s" % s for s in sets))
    by = defaultdict(dict)
    for r in mr:
        by["%s:%s" % (r["layer"], r["head"])][r["set"]] = (float(r["mean"]), float(r["median"]))
    for h, v in by.items():
        print("%-9s" % h + "".join("%19s" % ("%.1f / %.1f" % v[s] if s in v else "-") for s in sets))
    print("%-9s" % "mean" + "".join("%19s" % ("%.1f / %.1f" % tuple(sum(v[s][i] for v in by.values()) / len(by) for i in (0, 1)))
                                   for s in sets))
PY

if command -v gnuplot >/dev/null 2>&1; then
    for kind in qk kk; do
        methods=$(cat "$out/methods_$kind.txt")
        if [ -z "$methods" ]; then continue; fi          # QK_ONLY=1: no K->K curves
        case $kind in qk) what="Q->K: decoding queries" ;; kk) what="K->K: held-out keys" ;; esac
        gnuplot <<EOF
set terminal pngcairo size 900,600 font ",11" noenhanced
set output "$out/recall_$kind.png"
set title "Fig. 2b, $what: recall@100 vs keys scanned ($length tokens, mean of $samples heads)"
set xlabel "keys scanned (% of the keys indexed)"
set ylabel "recall@100"
set logscale x
set grid
set key bottom right
set yrange [0:1.02]
names = "$methods"
plot for [i=1:words(names)] "$out/curve_$kind.dat" index (i-1) using 1:2 with linespoints pt 7 ps 0.8 lw 2 title word(names, i)
EOF
    done
    if [ -n "$qk" ]; then say "plot: $out/recall_qk.png"; else say "plots: $out/recall_qk.png $out/recall_kk.png"; fi
else
    say "gnuplot not found: no plots (apt-get install gnuplot-nox)"
fi
if [ "${KEEP_DUMP:-1}" = 0 ]; then rm -rf "$dump"; fi
