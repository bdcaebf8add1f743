#!/bin/sh
# make bench-sparsity: §2.3 of the paper (Fig. 2a), how few keys dominate a decoding query's
# attention, on a real model's queries, keys and values. A benchmark: it prints numbers and
# asserts nothing.
#   1. a pass-key prompt of LENGTH tokens (tests/passkey_prompt.sh)
#   2. ./ra --attn full --dump-qk with GEN generated tokens (greedy)
#   3. tests/bench_sparsity.py (numpy, installed into .venv): per layer, head and generated
#      token, the keys for 90% / 99% of the attention mass, the mass of the top 36 / 100 / 500,
#      the top-k whose output (§2.3: attention over the top k only) has an MSE below 1e-6, the
#      top 100's output error, the mass and output error of §3.3's static pattern W with the
#      exact top 100 of the keys between, and the share of the top 100 kept from the previous
#      token
#   4. OUT/sparsity.csv, the quartiles on stdout, and OUT/sparsity.png (gnuplot; skipped with
#      a note when it is missing): the sorted attention weights against rank, and the MSE
#      against k
#   LENGTH=8192 GEN=16 THREADS=2 OUT_DIR=results/bench_sparsity sh tests/bench_sparsity.sh MODEL
# The dump (OUT/dump_LENGTH, about 115 KB a token) is kept and reused by the next run at the same
# LENGTH and GEN; REDUMP=1 makes it again, KEEP_DUMP=0 deletes it at the end.
set -eu
model=${1:?usage: sh tests/bench_sparsity.sh MODEL}
length=${LENGTH:-8192}
gen=${GEN:-16}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_sparsity}
dump=$out/dump_$length
py=${PYTHON:-.venv/bin/python}
say() { echo "bench_sparsity: $*" >&2; }

mkdir -p "$out"
make -s ra >&2
# -n GEN+1: the last token generated is sampled, never run, so GEN run; a dump without values
# (made before --dump-qk wrote them) is made again
if [ "${REDUMP:-0}" = 1 ] || ! grep -q "\"n_gen\": $gen," "$dump/meta.json" 2>/dev/null || [ ! -f "$dump/v_l0_kv0.f32" ]; then
    say "pass-key prompt of $length tokens, then ./ra --dump-qk with $gen generated tokens"
    sh tests/passkey_prompt.sh "$model" "$length" "$out/passkey_$length.txt"
    rm -rf "$dump"
    ./ra -m "$model" -f "$out/passkey_$length.txt" -n $((gen + 1)) --temp 0 --ignore-eos -t "$threads" \
        -c $((length + gen + 64)) --attn full --dump-qk "$dump" >"$out/answer_$length.txt"
else
    say "reusing the dump in $dump (REDUMP=1 makes it again)"
fi

if ! "$py" -c 'import numpy' 2>/dev/null; then
    say "installing numpy into .venv"
    { python3 -m venv .venv && .venv/bin/pip install -q numpy; } >&2 || true
    py=.venv/bin/python
fi
"$py" -c 'import numpy' 2>/dev/null || { say "no numpy (pip failed)"; exit 1; }
"$py" tests/bench_sparsity.py "$dump" "$out"

if command -v gnuplot >/dev/null 2>&1; then
    n_prompt=$(sed -n 's/.*"n_prompt": \([0-9]*\).*/\1/p' "$dump/meta.json")
    gnuplot <<GP
set terminal pngcairo size 1200,500 font ",11" noenhanced
set output "$out/sparsity.png"
set multiplot layout 1,2 title "§2.3, Fig. 2a: decoding queries of $(basename "$model"), $n_prompt-token prompt (median and quartiles over layers, heads, tokens)"
set logscale xy
set grid
set format y "1e%L"
set yrange [1e-12:1]
set xlabel "rank r of the key (largest attention weight first)"
set ylabel "attention weight a_(r)"
set key top right
plot "$out/rank.dat" using 1:2:4 with filledcurves lc rgb "#c6dbef" title "quartiles", \
     "" using 1:3 with lines lw 2 lc rgb "#08519c" title "median"
set xlabel "k (keys attended: the k largest weights, renormalized)"
set ylabel "MSE of the output against full attention"
set yrange [1e-16:1]
set arrow from graph 0, first 1e-6 to graph 1, first 1e-6 nohead dt 2 lc rgb "#a50f15"
plot "$out/mse.dat" using 1:2:4 with filledcurves lc rgb "#fcbba1" title "quartiles", \
     "" using 1:3 with lines lw 2 lc rgb "#a50f15" title "median (dashed: 1e-6)"
unset multiplot
GP
    say "plot: $out/sparsity.png"
else
    say "gnuplot not found: no plot (apt-get install gnuplot-nox)"
fi
if [ "${KEEP_DUMP:-1}" = 0 ]; then rm -rf "$dump"; fi
