#!/bin/sh
# The command line's long cases, which make test leaves to make test-long: Gemma 3 on the pass
# key and from its context files, -cnv sessions, Ctrl-C and SIGTERM, --reference on the pass key,
# and the cache types of every mode. Prints "N passed, N failed". make test-asan runs it too
# (RA=the sanitizer build).
F=tests/bin/fixtures
RA=${RA:-./ra}
M=data/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $F
tests/bin/gen_fixtures $F || exit 1
passed=0
failed=0
first_int() { printf '%s' "$1" | tr -c '0-9' ' ' | awk '{print $1}'; }
if [ -z "${RA_TEST_MAX_TOKENS:-}" ]; then
# Gemma 3 270M (make model-gemma), on the same pass key: its 15 sliding layers attend to their
# 512-key window, ra indexes the 3 global ones (5, 11, 17) alone; full and ra (its index) both
# answer; the audit lists those layers; a sliding layer's cache is a ring of window + batch rows
# (kv_bytes); --prompt-cache gives the same text and --stats; --chat writes Gemma's turns
G=data/gemma-3-270m-q4_k_m.gguf
gfull=$("$RA" -m $G -f data/passkey.txt -n 8 --temp 0 -t 2 --no-gpu --stats $F/gemma_full.json 2>/dev/null)
rm -f $F/gemma.pc
gra=$("$RA" -m $G -f data/passkey.txt -n 8 --temp 0 -t 2 --no-gpu --attn ra --exact-below 0 --index-wait --audit \
      --prompt-cache $F/gemma.pc --stats $F/gemma_ra.json 2>$F/gemma_ra.err)
gra2=$("$RA" -m $G -f data/passkey.txt -n 8 --temp 0 -t 2 --no-gpu --attn ra --exact-below 0 --index-wait --audit \
       --prompt-cache $F/gemma.pc --stats $F/gemma_ra2.json 2>/dev/null)
layers=$(sed -n 's/^ra: audit layer *\([0-9]*\):.*/\1/p' $F/gemma_ra.err | tr '\n' ' ')
if [ "$(first_int "$gfull")" = 68217 ] && [ "$(first_int "$gra")" = 68217 ] && [ "$gra2" = "$gra" ] &&
    [ "$layers" = "5 11 17 " ] && python3 -c "
import json, sys
a, b, f = (json.load(open('$F/gemma_%s.json' % n)) for n in ('ra', 'ra2', 'full'))
times = ('_s', '_ms', '_mb', 'tok_s', '_per_token', 'prompt_cache', 'cached_tokens', 'seed')
same = all(a[k] == b[k] for k in a if not k.endswith(times))
n = a['ctx']; rows = 3 * n + 15 * min(n, 512 + 256)   # the CPU's batch, 256
sys.exit(not (same and a['attn'] == 'ra' and a['kv_bytes'] == rows * 256 * 2 * 2 and f['kv_bytes'] == a['kv_bytes']))"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: gemma3 on the pass key: full '$gfull', ra '$gra', from the cache '$gra2', audited layers '$layers'"
    cat $F/gemma_ra.err
fi
# a context file of Gemma's, saved with -b 16 (its sliding layers' rings: 512 + 16 rows) and with
# the default batch (512 + 256): a prompt whose last 40 or so tokens differ reuses the second, and
# answers as a fresh run does, bit for bit under full attention; the first's rings no longer hold
# the window those tokens see, so the prompt runs whole
python3 -c "t = open('data/passkey.txt').read(); open('$F/gdoc.txt', 'w').write(t[:-200]); open('$F/gq.txt', 'w').write(t[:-200] + 'What is the pass key? The pass key is')"
rm -f $F/g16.ctx $F/g256.ctx
"$RA" -m $G -f data/passkey.txt -n 0 -t 2 -b 16 --prompt-cache $F/g16.ctx >/dev/null 2>&1
"$RA" -m $G -f data/passkey.txt -n 0 -t 2 --prompt-cache $F/g256.ctx >/dev/null 2>&1
want=$("$RA" -m $G -f $F/gq.txt -n 8 --temp 0 -t 2 2>/dev/null)
g256=$("$RA" -m $G -f $F/gq.txt -n 8 --temp 0 -t 2 --prompt-cache $F/g256.ctx --stats $F/g256.json 2>/dev/null)
g16=$("$RA" -m $G -f $F/gq.txt -n 8 --temp 0 -t 2 --prompt-cache $F/g16.ctx 2>$F/g16.err)
if [ "$(first_int "$want")" = 68217 ] && [ "$g256" = "$want" ] && [ "$g16" = "$want" ] && grep -q '"prompt_cache": "prefix"' $F/g256.json &&
    grep -q "^ra: --prompt-cache: '$F/g16.ctx' holds a prompt of [0-9]* tokens that differs from this one at token" $F/g16.err; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: gemma3 from a context file: fresh '$want', ring of 768 '$g256', ring of 528 '$g16'"; cat $F/g16.err
fi
out=$("$RA" -m $G -p "What is the capital of France?" --chat -n 4 --temp 0 -t 2 2>$F/gemma_chat.err)
if [ -n "$out" ] && grep -q "chat format gemma from the model's vocabulary" $F/gemma_chat.err; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: gemma3 --chat: '$out'"; cat $F/gemma_chat.err
fi
# -cnv: the document read once, then questions from a here-document, each answered in the chat
# format over the same context, which grows by each turn (its keys inserted into ra's indexes);
# /exit ends the session before a third question; a second session reads the document from the
# context file the first saved, and answers alike
python3 -c "t = open('data/passkey.txt').read(); open('$F/doc.txt', 'w').write(t[:t.rindex('What is')])"
rm -f $F/cnv.ctx
for run in 1 2; do
    "$RA" -m $M -f $F/doc.txt -cnv -n 16 --temp 0 -t 2 --attn ra --exact-below 0 --index-wait --prompt-cache $F/cnv.ctx \
        --stats $F/cnv$run.json >$F/cnv$run.out 2>$F/cnv$run.err <<'EOF'
What is the pass key mentioned in the text? Answer with the number only.

Repeat the pass key.
/exit
What is never asked?
EOF
    turns=$(sed -n 's/^ra: turn \([0-9]*\): question [0-9]* tokens in .*; answer \([0-9]*\) tokens, .*; context \([0-9]*\) tokens$/\1 \2 \3/p' $F/cnv$run.err | tr '\n' ' ')
    if [ "$(wc -l <$F/cnv$run.out)" = 2 ] && [ "$(grep -c 68217 $F/cnv$run.out)" = 2 ] && python3 -c "
import json, sys
t = [int(x) for x in '$turns'.split()]
s = json.load(open('$F/cnv$run.json'))
ok = len(t) == 6 and t[0] == 1 and t[3] == 2 and t[5] > t[2] > s['prompt_tokens'] and t[1] + t[4] == s['generated_tokens']
ok = ok and s['attn'] == 'ra' and s['prompt_cache'] == ('saved' if $run == 1 else 'loaded')
sys.exit(0 if ok else 1)"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: -cnv session $run: '$(cat $F/cnv$run.out)', turns '$turns'"; cat $F/cnv$run.err
    fi
done
cmp -s $F/cnv1.out $F/cnv2.out && passed=$((passed + 1)) ||
    { failed=$((failed + 1)); echo "FAIL: -cnv from the context file answered otherwise"; cat $F/cnv1.out $F/cnv2.out; }
# end of input ends a session as /exit does; a question past the context, or not UTF-8, is
# refused with one line and passed over: a shorter one after it is answered, and the exit is 1
out=$(printf 'Repeat the pass key.\n' | "$RA" -m $M -f $F/doc.txt -cnv -n 8 --temp 0 -t 2 2>$F/cnv3.err)
rc3=$?
out2=$(printf 'Repeat the pass key.\nRepeat the pass key once more, and then say it again in full, with every digit spelled out as a word, please.\n\377\nOK?\n' |
    "$RA" -m $M -f $F/doc.txt -cnv -n 8 -c 2270 --temp 0 -t 2 2>$F/cnv4.err)
rc4=$?
if [ -n "$out" ] && [ $rc3 = 0 ] && grep -q "^ra: turn 1:" $F/cnv3.err && [ $rc4 = 1 ] &&
    [ "$(printf '%s\n' "$out2" | head -n 1)" = "$out" ] && [ "$(grep -c '^ra: turn ' $F/cnv4.err)" = 2 ] &&
    grep -q "^ra: -cnv: question 2 ([0-9]* tokens) does not fit the [0-9]* left of the context of 2270 (-c): passed over$" $F/cnv4.err &&
    grep -q "^ra: -cnv: the question is not valid UTF-8 text: passed over$" $F/cnv4.err; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: -cnv at the end of input, or past the context: $rc3 '$out', $rc4 '$out2'"; cat $F/cnv3.err $F/cnv4.err
fi
else
    echo "test_cli_long: Gemma 3 and the -cnv sessions on the pass key skipped under RA_TEST_MAX_TOKENS=$RA_TEST_MAX_TOKENS (make test-long runs them)"
fi
# a question line past 512 MiB is refused and the next answered: from a pipe, dropped as it
# comes (not held whole); from a file, whose reads bring its end with the rest
{ head -c 536870913 /dev/zero | tr '\0' a; printf '\nhello\n'; } >$F/cnvlong.txt
for from in pipe file; do
    if [ $from = pipe ]; then
        cat $F/cnvlong.txt | "$RA" -m $F/tiny.gguf -p hi -cnv -n 2 --temp 0 --chat-template chatml >/dev/null 2>$F/cnvlong.err
    else
        "$RA" -m $F/tiny.gguf -p hi -cnv -n 2 --temp 0 --chat-template chatml <$F/cnvlong.txt >/dev/null 2>$F/cnvlong.err
    fi
    rc=$?
    [ $rc = 1 ] && grep -q "^ra: -cnv: a question is longer than 512 MiB: passed over$" $F/cnvlong.err &&
        grep -q "^ra: turn 1: " $F/cnvlong.err && passed=$((passed + 1)) ||
        { failed=$((failed + 1)); echo "FAIL: -cnv with a question past 512 MiB, from a $from: exit $rc"; grep -v '^prefill' $F/cnvlong.err; }
done
rm -f $F/cnvlong.txt
# Ctrl-C while -cnv waits for a question ends the session: exit 130, the statistics written
if python3 - "$RA" $M $F/cnvint.json <<'PY'
import json, os, select, signal, subprocess, sys, time
ra, model, stats = sys.argv[1:4]
if os.path.exists(stats):
    os.unlink(stats)
p = subprocess.Popen([ra, "-m", model, "-p", "You are helpful.", "-cnv", "-n", "4", "--temp", "0", "-t", "2",
                      "--no-gpu", "--stats", stats], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
p.stdin.write(b"Hi\n")
p.stdin.flush()
err, t0 = b"", time.time()
while b"ra: turn 1:" not in err and time.time() - t0 < 120 and p.poll() is None:
    if select.select([p.stderr], [], [], 1)[0]:
        err += os.read(p.stderr.fileno(), 4096)
time.sleep(0.5)   # waiting for the second question, which never comes
p.send_signal(signal.SIGINT)
try:
    rc = p.wait(timeout=10)
except subprocess.TimeoutExpired:
    p.kill()
    sys.exit("still waiting 10 s after Ctrl-C")
s = json.load(open(stats))
print("-cnv, Ctrl-C at the prompt: exit %d, interrupted %s, generated %d" % (rc, s.get("interrupted"), s["generated_tokens"]))
sys.exit(0 if rc == 130 and s.get("interrupted") == "generation" and s["generated_tokens"] > 0 else 1)
PY
then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: Ctrl-C while -cnv waits for a question"; fi
# Ctrl-C (SIGINT) and SIGTERM stop prefill and generation cleanly: exit 128 + the signal (130,
# 143), the statistics so far on stderr, and the --stats file written (valid JSON naming where
# the run stopped). A prefill gets the signal with its first progress line (a second in) that
# counts fewer tokens than the prompt's, which is 6.7K tokens so that most of it is still to go;
# generation gets it after `seconds`. The prefills are the CPU's (--no-gpu): a GPU's can end
# before its first progress line, so test_cuda stops forward_cuda at a chosen batch instead.
interrupt_at() {   # stage, seconds, signal, expected exit, "$RA" args...
    stage=$1 secs=$2 sig=$3 want=$4
    shift 4
    rm -f $F/int.json
    "$RA" "$@" --stats $F/int.json >/dev/null 2>$F/int.err &
    pid=$!
    if [ $stage = prefill ]; then
        i=0
        while [ $i -lt 1200 ] && ! awk '/^prefill / { split($2, a, "/"); if (a[1] < a[2]) f = 1 } END { exit !f }' $F/int.err; do
            sleep 0.05; i=$((i + 1))
        done
    else
        sleep "$secs"
    fi
    kill -$sig $pid
    wait $pid
    rc=$?
    rate="tok/s"; [ $stage = prefill ] && rate="(interrupted, attention"   # no rate for a prompt cut short
    if [ $rc = $want ] && grep -q "interrupted during $stage" $F/int.err && grep -q "^ra: prompt .*$rate" $F/int.err &&
        python3 -c "import json, sys; sys.exit(json.load(open('$F/int.json')).get('interrupted') != '$stage')"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: SIG$sig during $stage: exit $rc, not $want"; cat $F/int.err
    fi
}
cat data/passkey.txt data/passkey.txt data/passkey.txt >$F/passkey3.txt
interrupt_at prefill 0 INT 130 -m $M -f $F/passkey3.txt -n 8 --temp 0 -t 2 --no-gpu --attn ra --exact-below 0
interrupt_at generation 3 INT 130 -m $M -p "Tell me a story." -n 3000 -c 4000 --ignore-eos --temp 0 -t 2
interrupt_at generation 3 TERM 143 -m $M -p "Tell me a story." -n 3000 -c 4000 --ignore-eos --temp 0 -t 2
# a prefill stopped with --prompt-cache saves nothing, and --stats says so
rm -f $F/intpc.cache
interrupt_at prefill 0 INT 130 -m $M -f $F/passkey3.txt -n 8 --temp 0 -t 2 --no-gpu --prompt-cache $F/intpc.cache
if [ ! -e $F/intpc.cache ] && [ ! -e $F/intpc.cache.tmp ] &&
    python3 -c "import json, sys; sys.exit(json.load(open('$F/int.json')).get('prompt_cache') != 'none')"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: an interrupted prefill with --prompt-cache: a file left, or --stats not \"none\""; cat $F/int.json
fi
# a prefill stopped with --dump-qk says the dump is incomplete and leaves meta.json empty (and,
# under ASan, holds no leak: the decoding queries' buffer is freed whether or not it was written)
rm -rf $F/intdump
interrupt_at prefill 0 INT 130 -m $M -f $F/passkey3.txt -n 8 --temp 0 -t 2 --no-gpu --dump-qk $F/intdump
if grep -q "intdump is incomplete (meta.json left empty)" $F/int.err && [ -f $F/intdump/meta.json ] &&
    [ ! -s $F/intdump/meta.json ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1)); echo "FAIL: an interrupted prefill with --dump-qk: no 'incomplete' line, or meta.json not empty"
fi
rm -rf $F/intdump $F/passkey3.txt
# a second Ctrl-C ends the run at once and leaves no partial --prompt-cache FILE.tmp behind. To
# hold the run where it writes the file, FILE.tmp is a FIFO whose reader never reads: the
# first Ctrl-C must not fail that blocked write (EINTR once made it a write error, exit 1),
# the second ends the run with 130 and removes FILE.tmp (which a killed run once left)
if python3 - "$RA" $M $F/fifo.cache >$F/fifo.out 2>&1 <<'PY'
import array, fcntl, os, signal, subprocess, sys, termios, time
ra, model, cache = sys.argv[1:4]
tmp = cache + ".tmp"
for f in (cache, tmp):
    if os.path.lexists(f):
        os.unlink(f)
os.mkfifo(tmp)
rfd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK)
# a short prompt: the file is written after the prefill, and its first layer fills the pipe
p = subprocess.Popen([ra, "-m", model, "-p", "The capital of France is", "-n", "8", "--temp", "0", "-t", "2",
                      "--prompt-cache", cache], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
def held():
    b = array.array("i", [0])
    fcntl.ioctl(rfd, termios.FIONREAD, b)
    return b[0]
t0 = time.time()
while held() < 65536 and time.time() - t0 < 60 and p.poll() is None:   # the pipe full: ./ra blocked
    time.sleep(0.05)
time.sleep(0.3)
p.send_signal(signal.SIGINT)
time.sleep(0.5)
blocked = p.poll() is None
p.send_signal(signal.SIGINT)
rc = p.wait(timeout=30)
err = p.stderr.read().decode(errors="replace")
print("first Ctrl-C: %s; exit %d; FILE.tmp %s; stderr ends: %s" % ("still writing" if blocked else "ended the run", rc,
      "left" if os.path.lexists(tmp) else "removed", err[-300:]))
sys.exit(0 if blocked and rc == 130 and not os.path.lexists(tmp) and not os.path.lexists(cache) else 1)
PY
then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: two Ctrl-Cs while writing --prompt-cache:"; cat $F/fifo.out; fi
rm -f $F/fifo.cache $F/fifo.cache.tmp
# Ctrl-C while ./ra is blocked writing to a full pipe: the clean stop (130, statistics, --stats),
# not a write error (the interrupted write(2) once failed with EINTR)
if python3 - "$RA" $F/tiny.gguf $F/eintr.json >$F/eintr.out 2>&1 <<'PY'
import fcntl, json, os, signal, subprocess, sys, termios, array, time
ra, model, stats = sys.argv[1:4]
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)   # F_SETPIPE_SZ: one page, soon full
p = subprocess.Popen([ra, "-m", model, "-p", "hello", "-n", "50000", "-c", "60000", "--temp", "0", "--ignore-eos",
                      "-t", "1", "--stats", stats], stdout=w, stderr=subprocess.PIPE)
os.close(w)
def held():
    b = array.array("i", [0])
    fcntl.ioctl(r, termios.FIONREAD, b)
    return b[0]
t0 = time.time()
while held() < 4000 and time.time() - t0 < 60:
    time.sleep(0.05)
time.sleep(0.5)   # ./ra is now blocked in write(2)
p.send_signal(signal.SIGINT)
time.sleep(0.5)
while os.read(r, 65536):
    pass
err = p.stderr.read().decode(errors="replace")
rc = p.wait()
ok = rc == 130 and "interrupted during generation" in err and json.load(open(stats)).get("interrupted") == "generation"
print("exit %d; stderr ends: %s" % (rc, err[-300:]))
sys.exit(0 if ok else 1)
PY
then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: Ctrl-C on a blocked write:"; cat $F/eintr.out; fi
# --reference on the whole pass-key prompt (its plain KNN takes a minute on 2 cores): the answer
# and text of the default path, every index built first; not under a sanitizer
if [ "$RA" = ./ra ]; then
    for run in ref fast; do
        flag=--index-wait; [ $run = ref ] && flag=--reference
        "$RA" -m $M -f data/passkey.txt -n 8 --temp 0 -t 2 --attn ra --exact-below 0 $flag >$F/pk_$run.txt 2>/dev/null
    done
    if [ "$(first_int "$(cat $F/pk_ref.txt)")" = 68217 ] && cmp -s $F/pk_ref.txt $F/pk_fast.txt; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: --reference on the pass key: '$(cat $F/pk_ref.txt)' against '$(cat $F/pk_fast.txt)'"
    fi
fi
# -ctk/-ctv: every mode reads the cache in halves (the default) as in floats: on the pass key,
# the same text from both, and with --audit (exact attention over the same cache) an output
# error no worse than the f32 cache's by more than 1e-3, twice a half's rounding (2^-11). Not
# under a sanitizer, where its audits take minutes: every run there reads halves, the default
modes="full ra flat ivf streaming"
[ "$RA" = ./ra ] || modes=
for mode in $modes; do
    xb=; [ $mode = ra ] && xb="--exact-below 0"
    au=; [ $mode != full ] && au=--audit
    for ct in f16 f32; do
        "$RA" -m $M -f data/passkey.txt -n 8 --temp 0 -t 2 --attn $mode $xb $au -ctk $ct -ctv $ct \
            --stats $F/ct_$ct.json >$F/ct_$ct.txt 2>/dev/null
    done
    if [ -s $F/ct_f16.txt ] && cmp -s $F/ct_f16.txt $F/ct_f32.txt && python3 -c "
import json, sys
h, f = (json.load(open('$F/ct_%s.json' % t)) for t in ('f16', 'f32'))
ok = (h['cache_type_k'], h['cache_type_v'], f['cache_type_k'], f['cache_type_v']) == ('f16', 'f16', 'f32', 'f32')
ok &= 2 * h['kv_bytes'] == f['kv_bytes'] and h['attn'] == '$mode'
ok &= ('$au' == '' or h['out_rel_err'] <= f['out_rel_err'] + 1e-3)
print('-ctk/-ctv f16 against f32, --attn $mode: output error %s against %s' % (h.get('out_rel_err'), f.get('out_rel_err')))
sys.exit(not ok)"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); echo "FAIL: --attn $mode with an f16 cache against f32: '$(cat $F/ct_f16.txt)', '$(cat $F/ct_f32.txt)'"
    fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
