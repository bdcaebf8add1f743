#!/bin/sh
# Runs every row of tests/bad_input.tsv against ./ra, then checks that good input runs, and
# prints "N passed, N failed".
F=tests/bin/fixtures
M=data/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $F
tests/bin/gen_fixtures $F || exit 1
: >$F/empty.txt
printf 'hi\n' >$F/prompt.txt
printf 'caf\351\n' >$F/latin1.txt
passed=0
failed=0
tab=$(printf '\t')
while IFS="$tab" read -r args code msg; do
    case "$args" in '#'*|'') continue ;; esac
    args=$(printf '%s' "$args" | sed "s|F/|$F/|g; s|\\bF\\b|$F|g; s|\\bM\\b|$M|g")
    msg=$(printf '%s' "$msg" | sed "s|F/|$F/|g")
    err=$(eval "./ra $args" 2>&1 >/dev/null)
    rc=$?
    lines=$(printf '%s\n' "$err" | wc -l)
    case "$err" in
        *"$msg"*) found=1 ;;
        *) found=0 ;;
    esac
    if [ "$rc" = "$code" ] && [ $found = 1 ] && [ "$lines" = 1 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: ./ra $args"
        echo "  want exit $code and one line containing: $msg"
        echo "  got  exit $rc, $lines line(s): $err"
    fi
done <tests/bad_input.tsv
# good input still works: the tiny model runs, the default model answers the pass key
if ./ra -m $F/tiny.gguf -p "hello" -n 4 --temp 0 >/dev/null 2>&1; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: tiny model run"; fi
out=$(./ra -m $M -f data/passkey.txt -n 8 --temp 0 -t 2 2>/dev/null)
case "$out" in
    *68217*) passed=$((passed + 1)) ;;
    *) failed=$((failed + 1)); echo "FAIL: passkey answer: $out" ;;
esac
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
