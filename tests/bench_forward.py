#!/usr/bin/env python3
"""Prefill and decode speed of ./ra against llama.cpp (llama-cpp-python) on the same GGUF,
prompt and thread count, in one process. A benchmark: it prints numbers, it asserts nothing.

    python3 tests/bench_forward.py MODEL.gguf [--threads N] [--lengths 512,2048] [--decode 64]
                                   [--long 8000,16000]

The first table: both run full attention, greedy. llama.cpp keeps its defaults (F16 KV cache,
batch 512) except for its weight repacking, which is off as with llama.cpp's --no-repack (see
no_repack); ra uses its defaults (F16 KV cache, batch 256). Decode ms/token is measured after
the prompt. The second, at long contexts (-c 16384): the time to the first token and ms/token
of llama.cpp, of ./ra --attn full and of ./ra --attn ra (--exact-below 0: the method at every
length; decoding starts at the prefill's end, its heads scanning exactly until their indexes,
built beside it, take over), with ra's index_ready_s and its ms/token before and after.
"""
import argparse, json, os, subprocess, sys, tempfile, time

def no_repack():
    """llama.cpp's --no-repack (use_extra_bufts = false), which llama-cpp-python's Llama does not
    expose: every Llama made after this call gets it. On CPUs with AMX, llama.cpp otherwise puts
    the Q4_1 weights in its AMX buffers, and llama-cpp-python 0.3.36 then crashes in
    llama_decode (segmentation fault). The plain CPU kernels are also what ra is compared with."""
    import llama_cpp, llama_cpp.llama
    default = llama_cpp.llama_model_default_params
    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama.llama_cpp.llama_model_default_params = params

def llama_cpp_times(model, ids, threads, n_decode):
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=len(ids) + n_decode + 8, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False, seed=0)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    tok = ids[-1]
    t1 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([tok])
    decode = (time.perf_counter() - t1) / n_decode
    return prefill, decode * 1000

def llama_cpp_first(model, ids, threads, n_decode):
    """llama.cpp's time to the first token (the prompt's evaluation, then the argmax) and its ms
    per token over the n_decode tokens after it"""
    from llama_cpp import Llama
    import numpy as np
    llm = Llama(model_path=model, n_ctx=len(ids) + n_decode + 8, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False, seed=0, logits_all=False)
    def argmax():   # the last token's logits, which llama-cpp-python keeps only in the context
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    tok = argmax()
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([tok])
        tok = argmax()
    return ttft, (time.perf_counter() - t1) / n_decode * 1000

def ra_stats(model, text, threads, n_decode, *flags):
    with tempfile.TemporaryDirectory() as d:
        pf, sf = os.path.join(d, "p.txt"), os.path.join(d, "s.json")
        open(pf, "w").write(text)
        subprocess.run(["./ra", "-m", model, "-f", pf, "-n", str(n_decode + 1), "--temp", "0", "-t", str(threads),
                        "-c", "16384", "--ignore-eos", "--stats", sf, *flags], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return json.load(open(sf))

def ra_times(model, text, threads, n_decode):
    s = ra_stats(model, text, threads, n_decode)
    return s["prefill_s"], s["decode_ms_per_token"], s["prompt_tokens"]

def prompt_of(vocab, base, n):
    """base repeated to n tokens of the model's tokenizer, cut there, as text and ids"""
    text = base
    while len(vocab.tokenize(text.encode(), add_bos=False, special=True)) < n:
        text += base
    ids = vocab.tokenize(text.encode(), add_bos=False, special=True)[:n]
    text = vocab.detokenize(ids).decode("utf-8", "ignore")
    return text, vocab.tokenize(text.encode(), add_bos=False, special=True)

def long_rows(a, vocab, base):
    print(f"\nlong contexts (-c 16384): time to the first token s, ms/token over {a.decode} tokens")
    print(f"{'tokens':>7} | {'llama.cpp':>17} | {'ra full':>17} {'/llama':>6} | {'ra ra':>17} {'/llama':>6} {'/full':>6} |"
          f" {'ra: indexes ready s':>19} {'ms/tok exact, then':>20}")
    for n in [int(x) for x in a.long.split(",") if x]:
        text, ids = prompt_of(vocab, base, n)
        lt, ld = llama_cpp_first(a.model, ids, a.threads, a.decode)
        f = ra_stats(a.model, text, a.threads, a.decode, "--attn", "full")
        r = ra_stats(a.model, text, a.threads, a.decode, "--attn", "ra", "--exact-below", "0")
        ready = "%.1f" % r["index_ready_s"] if r["index_ready_s"] >= 0 else "not by the end"
        print(f"{len(ids):>7} | {lt:>7.2f} s {ld:>5.1f} ms | {f['ttft_s']:>7.2f} s {f['decode_ms_per_token']:>5.1f} ms"
              f" {f['ttft_s'] / lt:>5.2f}x | {r['ttft_s']:>7.2f} s {r['decode_ms_per_token']:>5.1f} ms {r['ttft_s'] / lt:>5.2f}x"
              f" {r['ttft_s'] / f['ttft_s']:>5.2f}x | {ready:>19} {r['decode_exact_ms']:>9.1f} ({r['exact_steps']}),"
              f" {r['decode_indexed_ms']:>5.1f}")
    print("ratios: time to the first token over llama.cpp's (/llama) and over ra --attn full's (/full)")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--long", default="8000,16000")
    a = ap.parse_args()
    from llama_cpp import Llama
    no_repack()
    vocab = Llama(model_path=a.model, vocab_only=True, verbose=False)
    base = open(os.path.join(os.path.dirname(__file__), "..", "data", "passkey.txt")).read()
    print(f"model {a.model}, {a.threads} threads, {a.decode} decoded tokens")
    print(f"{'tokens':>7} {'llama.cpp tok/s':>16} {'ra tok/s':>9} {'ratio':>6} | {'llama.cpp ms/tok':>16} {'ra ms/tok':>9} {'ratio':>6}")
    for n in [int(x) for x in a.lengths.split(",") if x]:
        text, ids = prompt_of(vocab, base, n)
        lp, ld = llama_cpp_times(a.model, ids, a.threads, a.decode)
        rp, rd, rn = ra_times(a.model, text, a.threads, a.decode)
        print(f"{len(ids):>7} {len(ids)/lp:>16.1f} {rn/rp:>9.1f} {(len(ids)/lp)/(rn/rp):>6.2f} | {ld:>16.2f} {rd:>9.2f} {rd/ld:>6.2f}")
    print("ratio: llama.cpp speed over ra's (prefill) and ra's time over llama.cpp's (decode); 1.0 = equal, target <= 2")
    long_rows(a, vocab, base)

if __name__ == "__main__":
    main()
