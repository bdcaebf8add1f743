#!/bin/sh
# make eval: task accuracy of full attention, RetrievalAttention and the baselines on long-context
# retrieval prompts, in the shape of the paper's Table 2 (columns = tasks) and Table 3 (columns =
# context lengths). An evaluation: it prints and writes numbers and asserts nothing.
#
#   sh tests/eval.sh [MODEL]                  (default data/SmolLM2-135M-Instruct.Q4_1.gguf)
#   TASKS="passkey vt" MODES="full ra" LENGTHS="1024 16384" DEPTHS="0.5" SEEDS="1 2" sh tests/eval.sh
#
# Tasks (tests/gen_prompt.c): passkey, number_string (InfiniteBench), niah_single_1,
# niah_multikey, vt (RULER). Each case (task, length in tokens, needle depth, seed) gets one
# prompt, run by every mode with greedy decoding: ./ra --temp 0 -n 24 --ignore-eos; the output is
# scored by the benchmark's rule (gen_prompt score). The prompt's prefill runs once: ra runs first
# and saves it with its indexes (--prompt-cache), the others read it (prefill_s is then the time
# to read it).
# Lengths above the model's trained context go to separate tables, "beyond trained context".
#
# Writes OUT_DIR (default results/eval):
#   eval.csv      task,mode,tokens,depth,seed,score,prefill_s,decode_ms (tokens = the asked length;
#                 score in [0, 1]; decode_ms = ms per generated token)
#   table.md      the tables, also printed on stdout
#   accuracy.png  accuracy (mean over tasks) against length, one line per mode (needs gnuplot)
#   niah.png      needle-in-a-haystack grids as the paper's Figure 5: accuracy (mean over the
#                 single-needle tasks, passkey and niah_single_1, and the seeds) of each length
#                 and needle depth, one grid per mode (gnuplot)
#   runs/         each prompt, its reference answers, and each run's output, log and stats
# Progress on stderr, one line per run: "[12/240] passkey ra 4096 0.5 seed 1 ... score 1 (14 s)".
# Other settings: THREADS (default all cores), NPREDICT (24), OUT_DIR; PLOT_ONLY=1 runs nothing
# and makes the tables and plots again from OUT_DIR/eval.csv.
set -eu
model=${1:-data/SmolLM2-135M-Instruct.Q4_1.gguf}
tasks=${TASKS:-passkey number_string niah_single_1 niah_multikey vt}
modes=${MODES:-full ra flat ivf streaming}
# the modes, ra first: the context file it saves holds its indexes too, which the others pass over
ra_first() { for m in "$@"; do [ "$m" != ra ] || echo ra; done; for m in "$@"; do [ "$m" = ra ] || echo "$m"; done; }
lengths=${LENGTHS:-1024 2048 4096 8192}
depths=${DEPTHS:-0.1 0.5 0.9}
seeds=${SEEDS:-1}
threads=${THREADS:-$(nproc)}
npredict=${NPREDICT:-24}
out=${OUT_DIR:-results/eval}
gen=tests/bin/gen_prompt

# ---- checks ---------------------------------------------------------------------------------
for f in ./ra "$gen"; do
    [ -x "$f" ] || { echo "eval: $f is missing (make ra tests/bin/gen_prompt)" >&2; exit 1; }
done
[ -f "$model" ] || { echo "eval: no model at $model (make model)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "eval: python3 is needed for the tables" >&2; exit 1; }
ctx_train=$("$gen" ctx -m "$model")

# ---- helpers --------------------------------------------------------------------------------
# how many words in a list (split on purpose: the lists are space-separated)
# shellcheck disable=SC2086
words() { set -- $1; echo $#; }

# a number from ./ra's --stats JSON (one line, "key": value)
json_num() { sed -n "s/.*\"$1\": \\([-0-9.e+]*\\).*/\\1/p" "$2"; }
json_str() { sed -n "s/.*\"$1\": \"\\([^\"]*\\)\".*/\\1/p" "$2"; }

# ---- runs -----------------------------------------------------------------------------------
csv="$out/eval.csv"
if [ "${PLOT_ONLY:-0}" = 1 ]; then   # the tables and plots of the eval.csv there, no runs
    [ -f "$csv" ] || { echo "eval: PLOT_ONLY=1: no $csv" >&2; exit 1; }
    failed=0
else
    mkdir -p "$out/runs"
    echo "task,mode,tokens,depth,seed,score,prefill_s,decode_ms" >"$csv"
    total=$(($(words "$tasks") * $(words "$modes") * $(words "$lengths") * $(words "$depths") * $(words "$seeds")))
    i=0
    failed=0
    for task in $tasks; do
        for n in $lengths; do
            for d in $depths; do
                for s in $seeds; do
                    case="$out/runs/${task}_${n}_${d}_$s"
                    if ! "$gen" -m "$model" --task "$task" --tokens "$n" --depth "$d" --seed "$s" \
                            -o "$case.prompt.txt" --answer "$case.answer.txt" 2>"$case.gen.log"; then
                        cat "$case.gen.log" >&2
                        exit 1
                    fi
                    for mode in $(ra_first $modes); do
                        i=$((i + 1))
                        printf '[%d/%d] %s %s %s %s seed %s ...' "$i" "$total" "$task" "$mode" "$n" "$d" "$s" >&2
                        run="${case}_$mode"
                        t0=$(date +%s)
                        # the context: the prompt (at most n tokens), the generated tokens, a margin
                        # ra searches its index at every length (--exact-below 0): the method, not its
                        # full-attention fallback for short prompts, every index built first
                        xb=; [ "$mode" = ra ] && xb="--exact-below 0 --index-wait"
                        if ./ra -m "$model" -f "$case.prompt.txt" -n "$npredict" --temp 0 --ignore-eos -t "$threads" \
                                -c $((n + npredict + 16)) --attn "$mode" $xb --prompt-cache "$case.cache" --stats "$run.json" \
                                >"$run.out" 2>"$run.log"; then
                            score=$("$gen" score --task "$task" --answer "$case.answer.txt" --output "$run.out")
                            echo "$task,$mode,$n,$d,$s,$score,$(json_num prefill_s "$run.json"),$(json_num decode_ms_per_token "$run.json")" >>"$csv"
                            note=""   # a prompt within sink + window runs full attention whatever the mode
                            [ "$(json_str attn "$run.json")" = full ] && [ "$mode" != full ] && note=" (ran full attention: prompt within sink + window)"
                            printf ' score %s (%d s): %s%s\n' "$score" $(($(date +%s) - t0)) \
                                "$(head -c 48 "$run.out" | tr '\n' ' ')" "$note" >&2
                        else
                            failed=$((failed + 1))
                            printf ' FAILED: %s\n' "$(tail -n 1 "$run.log")" >&2
                        fi
                    done
                    rm -f "$case.cache"
                done
            done
        done
    done
fi

# ---- tables (shaped like the paper's Tables 2 and 3) and the plot -----------------------------
python3 - "$csv" "$ctx_train" "$out" "$model" "$npredict" <<'PY'
import csv, sys
from collections import defaultdict

path, ctx_train, out, model, npredict = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = list(csv.DictReader(open(path)))
names = {"full": "FullAttention", "ra": "RetrievalAttention", "flat": "Flat", "ivf": "IVF", "streaming": "StreamingLLM"}
order = ["full", "streaming", "flat", "ivf", "ra"]          # the paper's row order
modes = sorted({r["mode"] for r in rows}, key=lambda m: (order.index(m) if m in order else 99, m))
tasks = list(dict.fromkeys(r["task"] for r in rows))
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")

def klabel(n):   # 4096 -> 4K, as the paper's columns
    return "%dK" % (n // 1024) if n % 1024 == 0 else str(n)

def table(sel, cols, colname, key, title):
    """rows = modes, cols = tasks or lengths, cells = mean score (%); Avg. = mean of the cells,
    with the difference to FullAttention in parentheses (as the paper)"""
    cell = defaultdict(list)
    for r in sel:
        cell[(r["mode"], key(r))].append(float(r["score"]))
    lines = ["**%s**" % title, "", "| Methods | " + " | ".join(colname(c) for c in cols) + " | Avg. |",
             "|---|" + "---:|" * (len(cols) + 1)]
    avgs = {}
    for m in modes:
        vals = [100 * mean(cell[(m, c)]) if cell[(m, c)] else float("nan") for c in cols]
        avgs[m] = mean([v for v in vals if v == v])
        avg = "%.2f" % avgs[m]
        if m != "full" and "full" in avgs:
            avg += " (%+.2f)" % (avgs[m] - avgs["full"])
        lines.append("| %s | " % names.get(m, m) + " | ".join("%.2f" % v if v == v else "-" for v in vals) + " | %s |" % avg)
    return lines

def by_length(sel):
    """score per (mode, length): the mean over tasks of each task's mean (tasks weigh the same)"""
    per = defaultdict(list)
    for r in sel:
        per[(r["mode"], int(r["tokens"]), r["task"])].append(float(r["score"]))
    return [dict(mode=m, tokens=str(n), score=str(mean(v))) for (m, n, t), v in per.items()]

md = ["# Accuracy (%%) on long-context retrieval: %s" % model, "",
      "Greedy decoding, %s tokens; mean over needle depths {%s} and seeds {%s}. Tasks: %s "
      "(passkey, number_string: InfiniteBench; niah_single_1, niah_multikey, vt: RULER). "
      "Trained context: %d tokens." % (
          npredict, ", ".join(sorted({r["depth"] for r in rows}, key=float)),
          ", ".join(sorted({r["seed"] for r in rows}, key=int)), ", ".join(tasks), ctx_train), ""]
for label, keep in (("within the trained context", lambda n: n <= ctx_train),
                    ("beyond trained context", lambda n: n > ctx_train)):
    sel = [r for r in rows if keep(int(r["tokens"]))]
    if not sel:
        continue
    lens = sorted({int(r["tokens"]) for r in sel})
    md += ["## Lengths %s (%s tokens)" % (label, ", ".join(map(str, lens))), ""]
    md += table(sel, [t for t in tasks if any(r["task"] == t for r in sel)], str, lambda r: r["task"],
                "By task, mean over lengths (as Table 2, ∞-Bench)") + [""]
    md += table(by_length(sel), lens, klabel, lambda r: int(r["tokens"]),
                "By context length, mean over tasks (as Table 3, RULER)") + [""]
if not rows:
    md.append("(no run succeeded)")
text = "\n".join(md)
print(text)
open(out + "/table.md", "w").write(text + "\n")

# the plot's data: one row per length, one column per mode (mean over tasks, %)
per = defaultdict(list)
for r in by_length(rows):
    per[(r["mode"], int(r["tokens"]))].append(100 * float(r["score"]))
acc = {k: mean(v) for k, v in per.items()}
with open(out + "/accuracy.dat", "w") as f:
    f.write("# tokens " + " ".join(modes) + "\n")
    for n in sorted({int(r["tokens"]) for r in rows}):
        f.write("%d %s\n" % (n, " ".join("%.2f" % acc[(m, n)] if (m, n) in acc else "NaN" for m in modes)))
with open(out + "/accuracy.modes", "w") as f:
    f.write(" ".join(names.get(m, m) for m in modes) + "\n")

# the needle-in-a-haystack grid (as the paper's Figure 5): per mode, the mean score over the
# single-needle tasks run (passkey, niah_single_1; all tasks when neither was) and the seeds of
# each (length, depth), one gnuplot block per mode on a grid of indices, the lengths and depths
# as the tics
needle = [r for r in rows if r["task"] in ("passkey", "niah_single_1")] or rows
lens = sorted({int(r["tokens"]) for r in needle})
deps = sorted({r["depth"] for r in needle}, key=float)
cell = defaultdict(list)
for r in needle:
    cell[(r["mode"], int(r["tokens"]), r["depth"])].append(100 * float(r["score"]))
with open(out + "/niah.dat", "w") as f:
    for m in modes:
        f.write("# %s: length index, depth index, accuracy (%%)\n" % m)
        for i, n in enumerate(lens):
            for j, d in enumerate(deps):
                f.write("%d %d %s\n" % (i, j, "%.1f" % mean(cell[(m, n, d)]) if cell[(m, n, d)] else "NaN"))
            f.write("\n")
        f.write("\n")
with open(out + "/niah.gp", "w") as f:   # the grid's axes and titles, for tests/eval_niah.gp
    f.write("set xtics (%s)\n" % ", ".join('"%s" %d' % (klabel(n), i) for i, n in enumerate(lens)))
    f.write("set ytics (%s)\n" % ", ".join('"%.0f%%%%" %d' % (100 * float(d), j) for j, d in enumerate(deps)))   # %% in a tic label is a %
    f.write("nx = %d; ny = %d\n" % (len(lens), len(deps)))
    f.write('titles = "%s"\n' % " ".join(names.get(m, m) for m in modes))
    f.write('tasks = "%s"\n' % ", ".join(dict.fromkeys(r["task"] for r in needle)))
PY

if command -v gnuplot >/dev/null; then
    titles=$(cat "$out/accuracy.modes")
    gnuplot -e "dat='$out/accuracy.dat'; png='$out/accuracy.png'; titles='$titles'; ctx=$ctx_train" tests/eval_plot.gp
    gnuplot -e "dat='$out/niah.dat'; axes='$out/niah.gp'; png='$out/niah.png'" tests/eval_niah.gp
    echo "eval: wrote $out/eval.csv, $out/table.md, $out/accuracy.png, $out/niah.png" >&2
else
    echo "eval: wrote $out/eval.csv, $out/table.md; gnuplot not found, accuracy.png and niah.png skipped" >&2
fi
if [ "$failed" -gt 0 ]; then
    echo "eval: $failed of $total runs failed (logs in $out/runs)" >&2
    exit 1
fi
