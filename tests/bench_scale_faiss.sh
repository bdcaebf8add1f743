#!/bin/sh
# make bench-scale-faiss: §3.2's comparison (keys scanned for high recall) against Faiss itself at the paper's scale. For
# each n (LENGTHS, keys), bench_scale's synthetic out-of-distribution data (tests/test_index.c,
# the same generator and seeds as make bench-scale) is written as a --dump-qk directory and
# tests/bench_index_faiss.py runs Faiss's IVF (4 sqrt(n) lists, inner product; nprobe in steps
# of 1/32 of the lists) and HNSW on its 200 decoding queries. Prints the keys Faiss IVF scans
# for recall@100 >= 0.95 next to the RA graph's from make bench-scale. A benchmark: it asserts
# nothing. numpy and faiss-cpu are installed into .venv as make bench-index does.
#   LENGTHS="32768 65536 131072" OUT_DIR=results/bench_scale sh tests/bench_scale_faiss.sh
set -eu
lengths=${LENGTHS:-32768 65536 131072}
out=${OUT_DIR:-results/bench_scale}
py=${PYTHON:-.venv/bin/python}
say() { echo "bench_scale_faiss: $*" >&2; }
mkdir -p "$out"
make -s tests/bin/test_index >&2
if ! "$py" -c 'import faiss, numpy' 2>/dev/null; then
    say "installing numpy and faiss-cpu into .venv"
    python3 -m venv .venv >&2 && .venv/bin/pip install -q numpy faiss-cpu >&2
    py=.venv/bin/python
fi
./tests/bin/test_index scale "$(echo $lengths | tr ' ' '\n' | sort -n | tail -1)" | tee "$out/scale.txt" | grep SCALE >&2
echo "keys,method,param,scan,recall" >"$out/faiss_scale.csv"
for n in $lengths; do
    d=$out/data_$n
    ./tests/bin/test_index scale-dump "$n" "$d" >&2
    nprobes=$(python3 -c "import math; l = int(4 * math.sqrt($n)); print(','.join(str(max(1, l * i // 32)) for i in range(1, 32)))")
    say "$n keys: Faiss IVF and HNSW"
    "$py" tests/bench_index_faiss.py "$d" -p 0:0 -o "$d/faiss.csv" --nprobe "$nprobes"
    awk -F, -v n="$n" '$2 == "QK" { print n "," $1 "," $5 "," $6 "," $7 }' "$d/faiss.csv" >>"$out/faiss_scale.csv"
    rm -f "$d"/*.f32
done
python3 - "$out/scale.txt" "$out/faiss_scale.csv" <<'PY'
import csv, re, sys
ra = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"SCALE n\s+(\d+)\s+RA\s+([\d.]+)%", open(sys.argv[1]).read())}
rows = list(csv.DictReader(open(sys.argv[2])))
print("keys scanned for recall@100 >= 0.95 (synthetic OOD data, 200 decoding queries)")
print("%8s %8s %10s %10s %13s" % ("keys", "RA", "Faiss IVF", "IVF / RA", "Faiss HNSW"))
for n in sorted({int(r["keys"]) for r in rows}):
    def first(method):
        ok = [r for r in rows if int(r["keys"]) == n and r["method"] == method and float(r["recall"]) >= 0.95]
        return min((float(r["scan"]) for r in ok), default=None)
    ivf, hnsw = first("faiss_ivf"), first("faiss_hnsw")
    best = max((float(r["recall"]) for r in rows if int(r["keys"]) == n and r["method"] == "faiss_hnsw"), default=0)
    print("%8d %7.2f%% %9.2f%% %10s %13s" % (n, ra.get(n, float("nan")), 100 * ivf if ivf else float("nan"),
          "%.1fx" % (100 * ivf / ra[n]) if ivf and n in ra else "-",
          "%.2f%%" % (100 * hnsw) if hnsw else "not reached (best recall %.3f)" % best))
PY
