#!/bin/sh
# make bench-tune: the RA index's build settings, tuned by measurement (§3.2; RoarGraph's Nq = 100
# and out-degree M = 35 are the starting point), and the beam of the connectivity step's searches
# (ef_conn, REFERENCE.md (d)). For each (Nq, M, ef_conn) it builds the indexes of the
# sampled heads of a dump and sweeps the beam width (tests/bin/bench_index --qk-only), then
# reads off the keys scanned for recall@100 of 0.95 on the curve averaged over the heads, as
# make bench-index does (tests/recall_curve.py). A benchmark: it prints a table and asserts nothing.
#   DUMP=results/bench_index/dump_8192 NQS="100 200 400" DEGREES="16 24 35 48" EF_CONNS="16 32 100" \
#   THREADS=2 OUT_DIR=results/bench_tune sh tests/bench_tune.sh
# EF_CONNS unset: ./ra's default alone. QSTRIDE=S builds from every S-th prefill query (1).
# CONN_SEED=0 starts the connectivity step's searches at the entry alone (./ra: 1, conn_seeds).
# The dump comes from make bench-index (LENGTH=32384 for a 32K one). Writes OUT/tune.csv
# (q_stride,conn_seed,nq,degree,ef_conn,scan_at_095,ef_lo,ef_hi,repaired_mean,conn_scored_mean,build_s_mean,
# conn_s_mean; conn_scored_mean: keys scored per connectivity search) and prints
# the tables: keys scanned over (Nq, M) at the first ef_conn, and over ef_conn at each (Nq, M)
# when EF_CONNS has more than one.
set -eu
dump=${DUMP:-results/bench_index/dump_8192}
nqs=${NQS:-100 200 400}
degrees=${DEGREES:-16 24 35 48}
ef_conns=${EF_CONNS:-default}
qstride=${QSTRIDE:-1}
conn_seed=${CONN_SEED:-1}
threads=${THREADS:-$(nproc)}
out=${OUT_DIR:-results/bench_tune}
efs=100,110,120,135,150,175,200,250,300,400,600,800
say() { echo "bench_tune: $*" >&2; }

[ -f "$dump/meta.json" ] || { say "no dump at $dump (make bench-index makes one)"; exit 1; }
mkdir -p "$out"
make -s tests/bin/bench_index >&2
echo "q_stride,conn_seed,nq,degree,ef_conn,scan_at_095,ef_lo,ef_hi,repaired_mean,conn_scored_mean,build_s_mean,conn_s_mean" \
    >"$out/tune.csv"
for nq in $nqs; do
    for m in $degrees; do
      for ec in $ef_conns; do
        say "Nq $nq, M $m, ef_conn $ec, q-stride $qstride, conn-seed $conn_seed"
        run=${nq}_${m}_$ec
        ecflag=; [ "$ec" = default ] || ecflag="--ef-conn $ec"
        ./tests/bin/bench_index "$dump" --qk-only --nq "$nq" --degree "$m" $ecflag --q-stride "$qstride" \
            --conn-seed "$conn_seed" --ef "$efs" -t "$threads" >"$out/recall_$run.csv" 2>"$out/log_$run.txt"
        python3 - "$out/recall_$run.csv" "$out/log_$run.txt" "$qstride" "$conn_seed" "$nq" "$m" >>"$out/tune.csv" <<'PY'
import csv, re, sys
sys.path.insert(0, "tests")
from recall_curve import mean_curves, scan_at
c = mean_curves(csv.DictReader(open(sys.argv[1])))[("ra", "QK")]
s, (lo, hi) = scan_at(c, 0.95)   # read as make bench-index reads it
scan = "" if s is None else "%.5f" % s
log = open(sys.argv[2]).read()
rep = [int(x) for x in re.findall(r"\((\d+) repaired,", log)]
ec = re.search(r"ef_conn (\d+),", log).group(1)
sc = [float(x) for x in re.findall(r"([0-9.]+) keys scored each\)", log)]
bs = [float(x) for x in re.findall(r"RA build ([0-9.]+) s", log)]
cs = [float(x) for x in re.findall(r"connectivity ([0-9.]+) s\]", log)]
print("%s,%s,%s,%s,%s,%s,%s,%s,%.0f,%.0f,%.2f,%.2f" % (sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], ec, scan,
      lo, hi, sum(rep) / len(rep), sum(sc) / len(sc), sum(bs) / len(bs), sum(cs) / len(cs)))
PY
      done
    done
done
python3 - "$out/tune.csv" "$degrees" "$ef_conns" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ms, ecs = sys.argv[2].split(), sys.argv[3].split()
pct = lambda r: "%.2f" % (100 * float(r["scan_at_095"])) if r["scan_at_095"] else "-"
if len(ecs) > 1:
    print("by ef_conn (q-stride %s, conn-seed %s): keys scanned for recall@100 0.95 (%%), mean build and"
          " connectivity s per head, keys scored per connectivity search" % (rows[0]["q_stride"], rows[0]["conn_seed"]))
    for r in rows:
        print("  Nq %s M %s ef_conn %5s: %7s  build %6s s  connectivity %6s s  %6s scored" % (r["nq"], r["degree"],
              r["ef_conn"], pct(r), r["build_s_mean"], r["conn_s_mean"], r["conn_scored_mean"]))
ec0 = rows[0]["ef_conn"]
rows = [r for r in rows if r["ef_conn"] == ec0]
print("keys scanned for recall@100 0.95 (%%), rows Nq, columns out-degree M, ef_conn %s, q-stride %s"
      " (not reached: -)" % (ec0, rows[0]["q_stride"]))
print("%6s" % "Nq" + "".join("%9s" % ("M " + m) for m in ms))
for nq in dict.fromkeys(r["nq"] for r in rows):
    at = {r["degree"]: r for r in rows if r["nq"] == nq}
    print("%6s" % nq + "".join("%9s" % (pct(at[m]) if m in at else "-") for m in ms))
PY
