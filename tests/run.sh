#!/bin/sh
# Run each test program, then print the total as the closing line "N passed, N failed".
# A program's own closing line is read for its counts; a program that crashes or exits
# non-zero without failures counted, or ends without that line, is one failure. Each program's
# seconds are printed after it, and all of them again at the end, the slowest first.
passed=0
failed=0
times=""
t_all=$(date +%s)
for t in "$@"; do
    echo "== $t"
    t0=$(date +%s)
    out=$("$t" 2>&1)
    rc=$?
    dt=$(($(date +%s) - t0))
    printf '%s\n' "$out"
    echo "== $t: $dt s"
    times="$times$dt s  $t
"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
    f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    if [ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
        echo "$t: exited with status $rc"
        failed=$((failed + 1))
    elif [ -z "$line" ]; then
        echo "$t: ended without its closing line \"N passed, N failed\""
        failed=$((failed + 1))
    fi
done
echo "== seconds per program ($(($(date +%s) - t_all)) s in all):"
printf '%s' "$times" | sort -rn
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
