#!/bin/sh
# make bench-tune: the RA index's build settings, tuned by measurement (§3.2; RoarGraph's Nq = 100
# and out-degree M = 35 are the starting point). For each (Nq, M) it builds the indexes of the
# sampled heads of a dump and sweeps the beam width (tests/bin/bench_index --qk-only), then
# reads off the keys scanned for recall@100 of 0.95 on the curve averaged over the heads, as
# make bench-index does (tests/recall_curve.py). A benchmark: it prints a table and asserts nothing.
#   DUMP=results/bench_index/dump_8192 NQS="100 200 400" DEGREES="16 24 35 48" THREADS=2 \
#   OUT_DIR=results/bench_tune sh tests/bench_tune.sh
# The dump comes from make bench-index (LENGTH=32384 for a 32K one). Writes OUT/tune.csv
# (nq,degree,scan_at_095,ef_lo,ef_hi,repaired_mean,build_s_mean) and prints the table.
set -eu
dump=${DUMP:-results/bench_index/dump_8192}
nqs=${NQS:-100 200 400}
degrees=${DEGREES:-16 24 35 48}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_tune}
efs=100,110,120,135,150,175,200,250,300,400,600,800
say() { echo "bench_tune: $*" >&2; }

[ -f "$dump/meta.json" ] || { say "no dump at $dump (make bench-index makes one)"; exit 1; }
mkdir -p "$out"
make -s tests/bin/bench_index >&2
echo "nq,degree,scan_at_095,ef_lo,ef_hi,repaired_mean,build_s_mean" >"$out/tune.csv"
for nq in $nqs; do
    for m in $degrees; do
        say "Nq $nq, M $m"
        ./tests/bin/bench_index "$dump" --qk-only --nq "$nq" --degree "$m" --ef "$efs" -t "$threads" \
            >"$out/recall_${nq}_$m.csv" 2>"$out/log_${nq}_$m.txt"
        python3 - "$out/recall_${nq}_$m.csv" "$out/log_${nq}_$m.txt" "$nq" "$m" >>"$out/tune.csv" <<'PY'
import csv, re, sys
sys.path.insert(0, "tests")
from recall_curve import mean_curves, scan_at
c = mean_curves(csv.DictReader(open(sys.argv[1])))[("ra", "QK")]
s, (lo, hi) = scan_at(c, 0.95)   # read as make bench-index reads it
scan = "" if s is None else "%.5f" % s
log = open(sys.argv[2]).read()
rep = [int(x) for x in re.findall(r"\((\d+) repaired\)", log)]
bs = [float(x) for x in re.findall(r"RA build ([0-9.]+) s", log)]
print("%s,%s,%s,%s,%s,%.0f,%.2f" % (sys.argv[3], sys.argv[4], scan, lo, hi,
      sum(rep) / len(rep), sum(bs) / len(bs)))
PY
    done
done
python3 - "$out/tune.csv" "$degrees" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ms = sys.argv[2].split()
print("keys scanned for recall@100 0.95 (%), rows Nq, columns out-degree M (not reached: -)")
print("%6s" % "Nq" + "".join("%9s" % ("M " + m) for m in ms))
for nq in dict.fromkeys(r["nq"] for r in rows):
    at = {r["degree"]: r for r in rows if r["nq"] == nq}
    print("%6s" % nq + "".join("%9s" % ("%.2f" % (100 * float(at[m]["scan_at_095"])) if m in at and at[m]["scan_at_095"] else "-")
                                for m in ms))
PY
