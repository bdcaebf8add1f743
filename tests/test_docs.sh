#!/bin/sh
# The documents against the code, so that a rename cannot leave them pointing at nothing:
#   1. every function cited as `file:name` in README.md and REFERENCE.md (REFERENCE.md cites
#      functions so, not by line) names a file of the project that defines or uses `name`;
#   2. every local link or image of the two documents leads to a file that is there;
#   3. every equation the sources cite, "Eq. (N)", has its row in REFERENCE.md's table;
#   4. every flag `./ra --help` lists is in README's table of flags, and every key of a
#      --stats object (a run with each optional key's condition but an interruption's: --attn
#      ra past its static pattern, --audit, --prompt-cache) is named as `key` in README's
#      account of --stats (from "With `--stats FILE`" to the next heading).
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
[ "$n" -ge 3 ]
check $? "only $n local links found: the pattern no longer matches the documents"

eqs=$(grep -oh 'Eq\. ([0-9]*)' ra.c model.c ra.h ra_cuda.cu | sort -u)
n=0
for e in $(printf '%s\n' "$eqs" | sed 's/[^0-9]//g' | sort -un); do
    grep -q "^| [^|]*Eq\. ($e)" REFERENCE.md   # the row's first cell
    check $? "Eq. ($e) is cited in the sources but has no row in REFERENCE.md"
    n=$((n + 1))
done
echo "$n equations cited in the sources"
[ "$n" -ge 5 ]
check $? "only $n of Eq. (1)-(5) cited in the sources: the pattern no longer matches them"

# 4. ./ra's flags and --stats keys against README.md (needs ./ra and the default model: make test)
flags=$(./ra --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u)
n=0
for f in $flags; do
    sed -n '/^| flag | meaning |$/,/^$/p' README.md | grep -q -- "^| \`[^|]*$f\([^a-z-]\|$\)"   # its row
    check $? "./ra --help lists $f, README's table of flags does not"
    n=$((n + 1))
done
echo "$n flags of ./ra --help"
[ "$n" -gt 30 ]
check $? "only $n flags found in ./ra --help: the pattern no longer matches it"
tmp=${TMPDIR:-/tmp}/test_docs.$$
mkdir -p "$tmp"
./ra -m data/SmolLM2-135M-Instruct.Q4_1.gguf -p "The quick brown fox jumps over the lazy dog, and the dog sleeps on." \
    -n 3 --temp 0 --attn ra --exact-below 0 --sink 4 --window 8 --audit --prompt-cache "$tmp/pc" --no-gpu --stats "$tmp/s.json" \
    >/dev/null 2>"$tmp/err"
check $? "./ra --stats run: $(tail -n 1 "$tmp/err")"
keys=$(python3 -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))))" "$tmp/s.json" 2>/dev/null)
sed -n '/^With `--stats FILE`/,/^#/p' README.md >"$tmp/account"
n=0
for k in $keys; do
    grep -q "\`$k\`" "$tmp/account"
    check $? "--stats writes \"$k\", README does not name it"
    n=$((n + 1))
done
rm -rf "$tmp"
echo "$n keys of --stats"
[ "$n" -gt 40 ] && printf '%s\n' $keys | grep -qx recall_at_k && printf '%s\n' $keys | grep -qx prompt_cache
check $? "the --stats run wrote $n keys, not every optional one (recall_at_k, prompt_cache)"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
