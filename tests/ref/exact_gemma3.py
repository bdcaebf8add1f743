#!/usr/bin/env python3
"""Float64 next-token logits of Gemma 3 270M, from a plain NumPy forward pass.

Our own script, the gemma3 companion of exact_logits.py: gguf-py (`gguf.GGUFReader`,
`gguf.quants.dequantize`) reads and dequantizes the weights; the forward pass below is written
for this repository from Gemma 3's description and computed in float64, with no activation
quantization. It is the tight reference for ra's gemma3 forward pass, beside llama.cpp's logits
in tests/data/gemma3/logits_ref_kvf32.bin (whose quantized products round activations to 8 bits).

Gemma 3, as llama.cpp runs it: embeddings times sqrt(dim); per layer RMSNorm, Q/K/V, RMSNorm of
each query and key head, NeoX RoPE (base 1e6 on the global layers, 10000 on the sliding ones),
attention (a sliding layer's query sees its last `sliding_window` keys), RMSNorm of the
attention's output, the residual; RMSNorm, gelu(gate) * up (tanh form), down, RMSNorm of that,
the residual. Five layers in six slide; every sixth is global. The output is tied.

Run from the repository root (venv as in tests/ref/README.md; make model-gemma first):

    ../venv-ref/bin/python tests/ref/exact_gemma3.py    # its 4 prompts, llama.cpp's (10 min)
    ../venv-ref/bin/python tests/ref/exact_gemma3.py --decode   # decode_exact.txt (10 min)

Output: tests/data/gemma3/logits_exact.bin (RLOG, as exact_logits.py writes).
"""

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import sys
import time

import numpy as np
import gguf
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exact_logits import read_rlog, write_rlog, compare, rmsnorm  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "gemma3")


class Gemma3:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        kv = lambda k: r.fields[k].contents()
        assert kv("general.architecture") == "gemma3"
        self.n_layer = int(kv("gemma3.block_count"))
        self.dim = int(kv("gemma3.embedding_length"))
        self.n_head = int(kv("gemma3.attention.head_count"))
        self.n_kv_head = int(kv("gemma3.attention.head_count_kv"))
        self.hd = int(kv("gemma3.attention.key_length"))
        self.eps = float(kv("gemma3.attention.layer_norm_rms_epsilon"))
        self.base = float(kv("gemma3.rope.freq_base"))
        self.window = int(kv("gemma3.attention.sliding_window"))
        for key in r.fields:
            assert "rope.scaling" not in key and "softcapping" not in key, key
        self.tensors = {t.name: t for t in r.tensors}
        assert "output.weight" not in self.tensors

    def w(self, name):
        t = self.tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).astype(np.float64)

    def sliding(self, l):
        return l % 6 < 5


def rope_neox(x, pos, base):
    """x: (T, heads, hd); pairs (i, i + hd/2)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, window, chunk=512):
    """q (T, H, hd), k, v (T, KVH, hd): causal, a key at most window - 1 before its query when
    window > 0; by chunks of queries to bound memory."""
    T, H, hd = q.shape
    group = H // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    out = np.empty((T, H, hd))
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        s0 = max(0, t0 - window + 1) if window else 0
        sc = np.einsum("thd,shd->hts", q[t0:t1], k[s0:t1]) / np.sqrt(hd)
        qp = np.arange(t0, t1)[:, None]
        kp = np.arange(s0, t1)[None, :]
        mask = kp > qp
        if window:
            mask |= qp - kp >= window
        sc[:, mask] = -np.inf
        sc -= sc.max(axis=-1, keepdims=True)
        a = np.exp(sc)
        a /= a.sum(axis=-1, keepdims=True)
        out[t0:t1] = np.einsum("hts,shd->thd", a, v[s0:t1])
    return out


def forward(m, prompts, rows=None):
    """the last position's logits of each prompt (rows: the logits at those positions from the
    end, rows[0] the last, as an array (len(rows), n_vocab) a prompt)"""
    dim, H, KVH, hd = m.dim, m.n_head, m.n_kv_head, m.hd
    emb = m.w("token_embd.weight").reshape(-1, dim)
    xs = [emb[np.asarray(ids, dtype=np.int64)] * np.sqrt(np.float32(dim)).astype(np.float64)
          for ids in prompts]
    for l in range(m.n_layer):
        p = "blk.%d." % l
        W = {n: m.w(p + n + ".weight") for n in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
            "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
            "post_ffw_norm")}
        base = 10000.0 if m.sliding(l) else m.base
        window = m.window if m.sliding(l) else 0
        for i, x in enumerate(xs):
            T = x.shape[0]
            pos = np.arange(T)
            xn = rmsnorm(x, W["attn_norm"], m.eps)
            q = (xn @ W["attn_q"].reshape(H * hd, dim).T).reshape(T, H, hd)
            k = (xn @ W["attn_k"].reshape(KVH * hd, dim).T).reshape(T, KVH, hd)
            v = (xn @ W["attn_v"].reshape(KVH * hd, dim).T).reshape(T, KVH, hd)
            q = rope_neox(rmsnorm(q, W["attn_q_norm"], m.eps), pos, base)
            k = rope_neox(rmsnorm(k, W["attn_k_norm"], m.eps), pos, base)
            o = attention(q, k, v, window).reshape(T, H * hd) @ W["attn_output"].reshape(dim, -1).T
            x = x + rmsnorm(o, W["post_attention_norm"], m.eps)
            xn = rmsnorm(x, W["ffn_norm"], m.eps)
            g = xn @ W["ffn_gate"].reshape(-1, dim).T
            u = xn @ W["ffn_up"].reshape(-1, dim).T
            f = (gelu(g) * u) @ W["ffn_down"].reshape(dim, -1).T
            xs[i] = x + rmsnorm(f, W["post_ffw_norm"], m.eps)
    out_norm = m.w("output_norm.weight")
    if rows is not None:
        return emb.shape[0], [rmsnorm(x[[len(x) - 1 - r for r in rows]], out_norm, m.eps) @ emb.T
                              for x in xs]
    return emb.shape[0], [emb @ rmsnorm(x[-1:], out_norm, m.eps)[0] for x in xs]


def gen_decode(m):
    """decode_exact.txt: for each prompt of decode_ref.txt (llama.cpp's greedy steps), the prompt
    and llama.cpp's tokens as one sequence, and at each step's position the 64 largest float64
    logits, as `prompt step id:logit ...`"""
    _, ref_prompts = read_rlog(os.path.join(DATA, "logits_ref_kvf32.bin"))
    steps = {}
    with open(os.path.join(DATA, "decode_ref.txt")) as f:
        for ln in f:
            if not ln.startswith("#"):
                p, st, tok = (int(v) for v in ln.split()[:3])
                steps.setdefault(p, []).append(tok)
    lines = ["# the float64 pass (exact_gemma3.py --decode) at decode_ref.txt's steps: prompt, step, "
             "then the 64 largest logits as id:logit"]
    for p in sorted(steps):
        toks = steps[p]
        seq = np.concatenate([ref_prompts[p][0], np.asarray(toks[:-1], dtype=np.int64)])
        _, (lg,) = forward(m, [seq], rows=list(range(len(toks) - 1, -1, -1)))
        for st, row in enumerate(lg):
            top = np.argsort(-row, kind="stable")[:64]
            lines.append("%d %d %s" % (p, st, " ".join("%d:%.6f" % (i, row[i]) for i in top)))
        print("prompt %d: %d steps" % (p, len(toks)))
    with open(os.path.join(DATA, "decode_exact.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(REPO, "data", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--prompts", default="0,1,2,3")
    ap.add_argument("--out", default=os.path.join(DATA, "logits_exact.bin"))
    ap.add_argument("--decode", action="store_true",
                    help="instead: tests/data/gemma3/decode_exact.txt, at decode_ref.txt's steps")
    a = ap.parse_args()
    t0 = time.time()
    if a.decode:
        gen_decode(Gemma3(a.model))
        print("wrote decode_exact.txt in %.1f s" % (time.time() - t0))
        return 0
    ref = os.path.join(DATA, "logits_ref_kvf32.bin")
    n_vocab, ref_prompts = read_rlog(ref)
    pick = [ref_prompts[int(i)] for i in a.prompts.split(",")]
    nv, logits = forward(Gemma3(a.model), [ids for ids, _ in pick])
    assert nv == n_vocab
    out = a.out
    write_rlog(out, n_vocab, [(ids, lg) for (ids, _), lg in zip(pick, logits)])
    print("wrote %s in %.1f s; against llama.cpp:" % (os.path.relpath(out), time.time() - t0))
    for (ids, ref_lg), lg in zip(pick, logits):
        compare(lg, ref_lg, "prompt of %d tokens" % len(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
