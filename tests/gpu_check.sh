#!/bin/sh
# The checks to run on a machine with an NVIDIA GPU, in one go (README, "The GPU path"):
#   1. make test-cuda, which must have found a device ("cuda: device ...") and passed with no
#      failure: without a usable device test_cuda prints "cuda: skipped" and 0 passed, which
#      here is an error, not a pass;
#   2. ./ra on the device: a run whose plan exceeds --gpu-mem is refused before any work, with
#      the one-line error naming the sizes and the headroom; an --attn ra run with room says
#      which GPU it found, finishes, and took every decoding layer step's o_W from the device
#      and built every index's KNN there (--stats: gpu 1, w_on_gpu 1.000, knn_on_gpu 1.000),
#      and what it added to the device's memory (gpu_peak_mb less gpu_base_mb) is within its
#      plan (gpu_plan_mb) (--index-wait); by default, decoding beside the builds, every index's
#      KNN still runs there, and the context file is saved with the indexes;
#      the host's memory plan of a GPU run counts of the weights only the token embeddings
#      (the rest is on the device): --stats's mem_plan_mb is the --no-gpu run's less the model
#      file's size but the embeddings; the gemma3-270m shape runs its sliding layers there too;
#      --trace on the GPU path gives a build and each step's records, holding together;
#   3. unless CHECK_ONLY=1, the 128K benchmark row of the 8B shape on a 24 GB plan:
#      MODEL=preset:llama3-8b LENGTHS=131072 MODES=ra QSTRIDE=16 GPU_MEM=24000 GEN=8 make bench-gpu
# Exit status 0 only when the tests ran on a device and passed.
set -u
log=${OUT_DIR:-results/bench_gpu}/test_cuda.log
mkdir -p "$(dirname "$log")"
make -s test-cuda >"$log" 2>&1
rc=$?
cat "$log"
if ! grep -Eq '^cuda: device [0-9]+ of' "$log"; then
    echo "gpu_check: test_cuda did not run on a device (see above)" >&2
    exit 1
fi
if [ $rc -ne 0 ] || ! grep -Eq '^[1-9][0-9]* passed, 0 failed$' "$log"; then
    echo "gpu_check: test_cuda failed" >&2
    exit 1
fi
make -s ra tests/bin/gen_model || exit 1
tiny=$(dirname "$log")/gpu_check_tiny.gguf
tests/bin/gen_model "$tiny" --preset tiny --seed 3 --quiet || exit 1
./ra -m "$tiny" -p "hello world" -n 2 --temp 0 --gpu-mem 100 >/dev/null 2>"$log.refused"
rc=$?
cat "$log.refused"
if [ $rc != 1 ] || ! grep -q "not enough GPU memory: .*headroom 256) but 100 MiB is allowed (--gpu-mem)" "$log.refused"; then
    echo "gpu_check: --gpu-mem 100 was not refused as planned (exit $rc)" >&2
    exit 1
fi
./ra -m "$tiny" -p "hello world, hello world, hello world" --attn ra --exact-below 0 --sink 4 --window 8 -n 4 --temp 0 \
    --ignore-eos --index-wait --stats "$log.json" >/dev/null 2>"$log.ran"
rc=$?
cat "$log.ran" "$log.json"
# decoding beside the builds (the default): their KNN on the device's low-priority stream, the
# context file saved once every index is built (the run waits for them at its end)
rm -f "$log.ctx"
./ra -m "$tiny" -p "hello world, hello world, hello world" --attn ra --exact-below 0 --sink 4 --window 8 -n 4 --temp 0 \
    --ignore-eos --prompt-cache "$log.ctx" --stats "$log.async.json" >/dev/null 2>"$log.async"
rca=$?
cat "$log.async" "$log.async.json"
rm -f "$tiny" "$log.ctx"
if [ $rca != 0 ] || ! grep -q '"knn_on_gpu": 1.000' "$log.async.json" || ! grep -q "saved to .*(KV cache and indexes)" "$log.async" ||
    ! python3 -c "import json, sys; sys.exit(not json.load(open(sys.argv[1]))['index_ready_s'] > 0)" "$log.async.json"; then
    echo "gpu_check: ./ra --attn ra with its builds beside decoding did not build every index's KNN on the device" \
        "and save them (exit $rca)" >&2
    exit 1
fi
if [ $rc != 0 ] || ! grep -q "^ra: GPU: " "$log.ran" || ! grep -q '"gpu": 1,' "$log.json" ||
    ! grep -q '"w_on_gpu": 1.000' "$log.json" || ! grep -q '"knn_on_gpu": 1.000' "$log.json" ||
    ! python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
sys.exit(not 0 < d['gpu_peak_mb'] - d['gpu_base_mb'] <= d['gpu_plan_mb'])" "$log.json"; then
    echo "gpu_check: ./ra --attn ra did not run on the GPU with every o_W and every KNN from the device," \
        "within its device plan (exit $rc)" >&2
    exit 1
fi
# Gemma 3's shape: a prompt of 1,400 byte tokens, past its 512-key window, runs the sliding layers
# and their rings on the device, and every global layer's decoding step takes o_W from there
gem=$(dirname "$log")/gpu_check_gemma.gguf
tests/bin/gen_model "$gem" --preset gemma3-270m --seed 3 --quiet || exit 1
./ra -m "$gem" -p "$(python3 -c "print('the quick brown fox jumps over the lazy dog ' * 32)")" --attn ra \
    --exact-below 0 -n 4 --temp 0 --ignore-eos --index-wait --stats "$log.gemma.json" >/dev/null 2>"$log.gemma"
rc=$?
cat "$log.gemma" "$log.gemma.json"
rm -f "$gem"
if [ $rc != 0 ] || ! grep -q "^ra: GPU: " "$log.gemma" || ! grep -q '"gpu": 1,' "$log.gemma.json" ||
    ! grep -q '"w_on_gpu": 1.000' "$log.gemma.json" || ! grep -q '"knn_on_gpu": 1.000' "$log.gemma.json"; then
    echo "gpu_check: ./ra on the gemma3-270m shape did not run on the GPU with every global layer's o_W" \
        "and KNN from the device (exit $rc)" >&2
    exit 1
fi
# --trace on the GPU path: the traced head's build and each decoding step (o_W from the device,
# the insertions a step ahead), the records holding together as on the CPU (tests/test_cli.sh)
tiny=$(dirname "$log")/gpu_check_tiny.gguf
tests/bin/gen_model "$tiny" --preset tiny --seed 3 --quiet || exit 1
./ra -m "$tiny" -p "$(python3 -c "print('hello world, ' * 40)")" --attn ra --exact-below 0 --sink 4 --window 8 -n 6 \
    --temp 0 --ignore-eos --index-wait --trace 1:2 --trace-file "$log.trace" --stats "$log.trace.json" >/dev/null \
    2>"$log.traced"
rc=$?
rm -f "$tiny"
grep '^ra: trace' "$log.traced" | head -20
if [ $rc != 0 ] || ! grep -q '"w_on_gpu": 1.000' "$log.trace.json" || ! python3 - "$log.trace" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in recs if r["kind"] == "step"]
ok = sum(r["kind"] == "build" for r in recs) == 1 and len(s) == 5
for r in s:
    ok &= r["indexed"] == 1 and abs(r["gamma1"] + r["gamma2"] - 1) < 1e-6 and 0 <= r["recall"] <= 1
    ok &= set(r["omega_pos"]) <= set(r["scored_pos"]) and abs(sum(r["weight"]) - 1) < 1e-2
sys.exit(0 if ok else 1)
PY
then
    echo "gpu_check: ./ra --trace on the GPU path did not give a build and 5 steps that hold together (exit $rc)" >&2
    exit 1
fi
deep=$(dirname "$log")/gpu_check_deep.gguf   # 31 MiB of weights, 0.5 MiB of them the embeddings
tests/bin/gen_model "$deep" --preset tiny --layers 8 --dim 256 --ffn 1024 --vocab 512 --type F32 --seed 3 --quiet || exit 1
./ra -m "$deep" -p "hello world" -n 2 --temp 0 --stats "$log.gpu.json" >/dev/null 2>"$log.deep" &&
    ./ra -m "$deep" -p "hello world" -n 2 --temp 0 --no-gpu --stats "$log.cpu.json" >/dev/null 2>>"$log.deep"
rc=$?
bytes=$(wc -c <"$deep")
embd=$((512 * 256 * 4))   # the token embeddings (F32), which the host still reads
rm -f "$deep"
plan() { sed -n 's/.*"mem_plan_mb": \([0-9.]*\).*/\1/p' "$1"; }
echo "gpu_check: mem_plan_mb $(plan "$log.gpu.json") on the GPU, $(plan "$log.cpu.json") with --no-gpu; model $bytes bytes, embeddings $embd"
if [ $rc != 0 ] || ! grep -q '"gpu": 1,' "$log.gpu.json" || ! awk -v g="$(plan "$log.gpu.json")" -v c="$(plan "$log.cpu.json")" \
    -v b="$bytes" -v e="$embd" 'BEGIN { d = c - g - (b - e) / 1048576; exit !(g > 0 && d > -0.15 && d < 0.15) }'; then
    cat "$log.deep"
    echo "gpu_check: the GPU run's host plan is not the CPU run's less the weights but the embeddings (exit $rc)" >&2
    exit 1
fi
[ "${CHECK_ONLY:-0}" = 1 ] && exit 0
MODEL=${MODEL:-preset:llama3-8b} LENGTHS=${LENGTHS:-131072} MODES=${MODES:-ra} QSTRIDE=${QSTRIDE:-16} \
    GPU_MEM=${GPU_MEM:-24000} GEN=${GEN:-8} THREADS=${THREADS:-$(nproc)} make -s bench-gpu
