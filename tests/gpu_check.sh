#!/bin/sh
# The checks to run on a machine with an NVIDIA GPU, in one go (README, "The GPU path"):
#   1. make test-cuda, which must have found a device ("cuda: device ...") and passed with no
#      failure: without a usable device test_cuda prints "cuda: skipped" and 0 passed, which
#      here is an error, not a pass;
#   2. unless CHECK_ONLY=1, the 128K benchmark row of the 8B shape on a 24 GB plan:
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
[ "${CHECK_ONLY:-0}" = 1 ] && exit 0
MODEL=${MODEL:-preset:llama3-8b} LENGTHS=${LENGTHS:-131072} MODES=${MODES:-ra} QSTRIDE=${QSTRIDE:-16} \
    GPU_MEM=${GPU_MEM:-24000} GEN=${GEN:-8} THREADS=${THREADS:-$(nproc)} make -s bench-gpu
