#!/bin/sh
# The documents against the code, so that a rename cannot leave them pointing at nothing:
#   1. every function cited as `file:name` in README.md and REFERENCE.md (REFERENCE.md cites
#      functions so, not by line) names a file of the project that defines or uses `name`;
#   2. every local link or image of the two documents leads to a file that is there;
#   3. every equation the sources cite, "Eq. (N)", has its row in REFERENCE.md's table.
# Prints "N passed, N failed".
passed=0
failed=0
check() {   # condition-status, message
    if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi
}

refs=$(grep -oh '`[A-Za-z0-9_./-]*\.\(c\|cu\|h\|sh\|py\):[A-Za-z_][A-Za-z0-9_]*`' README.md REFERENCE.md | tr -d '`' | sort -u)
n=0
for r in $refs; do
    file=${r%%:*}
    name=${r#*:}
    [ -f "$file" ] || file=tests/$file   # tests' files are cited by their name alone too
    if [ -f "$file" ] && grep -qw "$name" "$file"; then st=0; else st=1; fi
    check $st "\`$r\`: no $name in ${r%%:*}"
    n=$((n + 1))
done
echo "$n file:function citations"
[ "$n" -gt 50 ]
check $? "only $n file:function citations found: the pattern no longer matches the documents"

links=$(grep -oh '](\([A-Za-z0-9_./-]*\))' README.md REFERENCE.md | sed 's/^](//; s/)$//' | grep -v '^https\?:' | sort -u)
n=0
for l in $links; do
    [ -e "$l" ]
    check $? "link ($l): no such file"
    n=$((n + 1))
done
echo "$n local links"

eqs=$(grep -oh 'Eq\. ([0-9]*)' ra.c model.c ra.h ra_cuda.cu | sort -u)
n=0
for e in $(printf '%s\n' "$eqs" | sed 's/[^0-9]//g' | sort -un); do
    grep -q "^| [^|]*Eq\. ($e)" REFERENCE.md   # the row's first cell
    check $? "Eq. ($e) is cited in the sources but has no row in REFERENCE.md"
    n=$((n + 1))
done
echo "$n equations cited in the sources"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
