#!/bin/sh
# Replays every kept fuzz input (tests/fuzz/gguf, tests/fuzz/tok: inputs that once broke a
# target, kept as regression cases) and the seed corpus through the fuzz targets built without
# libFuzzer (tests/fuzz_main.h). Prints "N passed, N failed".
#   FUZZ_SEEDS=DIR (from tests/bin/fuzz_seeds)  FUZZ_BIN=folder of the replay builds (tests/bin)
bin=${FUZZ_BIN:-tests/bin}
seeds=${FUZZ_SEEDS:-tests/bin/fuzz_seeds.d}
passed=0
failed=0
replay() {   # target, inputs...
    t=$1
    shift
    out=$("$bin/$t" "$@" 2>&1)
    rc=$?
    printf '%s\n' "$out" | tail -n 3
    p=$(printf '%s\n' "$out" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' | tail -n 1)
    if [ $rc = 0 ] && [ -n "$p" ] && [ "$p" -gt 0 ]; then passed=$((passed + p)); else failed=$((failed + 1)); echo "FAIL: $t (exit $rc)"; fi
}
mkdir -p tests/bin/fixtures && tests/bin/gen_fixtures tests/bin/fixtures || failed=$((failed + 1))
replay fuzz_gguf tests/fuzz/gguf "$seeds/gguf" tests/bin/fixtures
replay fuzz_tok tests/fuzz/tok "$seeds/tok"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
