#!/usr/bin/env python3
"""Float64 next-token logits of the default model, from a plain NumPy forward pass.

This is our own script.  It uses gguf-py (the PyPI package `gguf`) only to
read the GGUF file (`gguf.GGUFReader`) and to dequantize the weights
(`gguf.quants.dequantize`); the Llama forward pass below is a straightforward
NumPy implementation written for this repository, computed entirely in
float64 (weights are dequantized to float32 and then cast to float64; there is
no KV-cache or activation quantization).  The result is a high-precision
reference for the next-token logits, to sit beside llama.cpp's own logits in
tests/data/logits_ref_kvf32.bin (which llama.cpp computes with Q8-quantized
activations inside its quantized matrix multiplications).

The prompt token ids are read from tests/data/logits_ref_kvf32.bin itself, so
both files hold identical ids.  Only prompts 0 and 1 (16 and 201 tokens) are
computed, to keep this cheap.

Versions used to produce the committed data:
    Python 3.11.7, numpy 2.4.6, gguf 0.19.0 (x86-64, CPU).

Run, from the repository root (venv set up as in tests/ref/README.md):

    ../venv-ref/bin/python tests/ref/exact_logits.py

    ../venv-ref/bin/python tests/ref/exact_logits.py --decode   # tests/data/decode_exact.txt

Optional arguments:  --model PATH   (default data/SmolLM2-135M-Instruct.Q4_1.gguf)
                     --ref PATH     (default tests/data/logits_ref_kvf32.bin)
                     --out PATH     (default tests/data/logits_exact.bin)
                     --prompts N    (how many leading prompts; default 2)

Output: tests/data/logits_exact.bin, same layout as logits_ref.bin
(little-endian):
    char[4] magic = "RLOG"
    u32 version   = 1
    u32 n_prompts (2)
    u32 n_vocab   (49152)
    per prompt:  u32 n_tokens; i32 ids[n_tokens]; f32 logits[n_vocab]
The logits are computed in float64 and rounded to float32 only when written.
After writing, the script prints a comparison with the --ref file
(relative L2 distance, max |diff|, top-5 ids).

Model facts this code relies on (checked against the GGUF metadata at run
time where they are stored there): architecture llama, no output.weight
(the output projection is tied to token_embd), RoPE in the "normal"
interleaved layout (pairs 2i, 2i+1 of each head; the GGUF converter has
already permuted the Q/K weights for it), no RoPE scaling.
"""

import os

# Keep CPU use modest (must be set before numpy is imported).
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import struct
import sys
import time

import numpy as np
import gguf
from gguf.quants import dequantize

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def read_rlog(path):
    """Return (n_vocab, [(ids, logits_f32), ...]) from an RLOG file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"RLOG":
        raise ValueError(f"{path}: bad magic")
    version, n_prompts, n_vocab = struct.unpack_from("<III", data, 4)
    if version != 1:
        raise ValueError(f"{path}: unsupported version {version}")
    off = 16
    prompts = []
    for _ in range(n_prompts):
        (n_tok,) = struct.unpack_from("<I", data, off)
        off += 4
        ids = np.frombuffer(data, dtype="<i4", count=n_tok, offset=off).copy()
        off += 4 * n_tok
        logits = np.frombuffer(data, dtype="<f4", count=n_vocab, offset=off).copy()
        off += 4 * n_vocab
        prompts.append((ids, logits))
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return n_vocab, prompts


def write_rlog(path, n_vocab, prompts):
    out = bytearray(b"RLOG" + struct.pack("<III", 1, len(prompts), n_vocab))
    for ids, logits in prompts:
        ids = np.asarray(ids, dtype="<i4")
        logits = np.asarray(logits, dtype="<f4")
        assert logits.shape == (n_vocab,)
        out += struct.pack("<I", len(ids))
        out += ids.tobytes()
        out += logits.tobytes()
    with open(path, "wb") as f:
        f.write(out)


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.reader = r

        def kv(key):
            return r.fields[key].contents()

        arch = kv("general.architecture")
        if arch != "llama":
            raise ValueError(f"architecture {arch!r}, expected 'llama'")
        self.n_layer = int(kv("llama.block_count"))
        self.dim = int(kv("llama.embedding_length"))
        self.n_head = int(kv("llama.attention.head_count"))
        self.n_kv_head = int(kv("llama.attention.head_count_kv"))
        self.n_ff = int(kv("llama.feed_forward_length"))
        # eps and rope base are stored as f32 in the file; use that value exactly.
        self.eps = float(kv("llama.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(kv("llama.rope.freq_base")) if "llama.rope.freq_base" in r.fields else 10000.0
        self.head_dim = self.dim // self.n_head
        if "llama.rope.dimension_count" in r.fields:
            assert int(kv("llama.rope.dimension_count")) == self.head_dim, "partial RoPE not supported"
        for key in r.fields:
            if key.startswith("llama.rope.scaling"):
                raise ValueError(f"RoPE scaling ({key}) not supported")

        self.tensors = {t.name: t for t in r.tensors}
        if "output.weight" in self.tensors:
            raise ValueError("untied output.weight not supported by this script")

    def w(self, name, shape):
        """Dequantize a tensor to float32 (gguf-py order: rows, cols), check shape, cast to float64."""
        t = self.tensors[name]
        a = dequantize(t.data, t.tensor_type)
        a = np.asarray(a, dtype=np.float32)
        if len(shape) == 1:
            a = a.reshape(-1)
        want = tuple(a.shape[i] if n == -1 else n for i, n in enumerate(shape))
        if a.shape != want:
            raise ValueError(f"{name}: shape {a.shape}, expected {want}")
        return a.astype(np.float64)


def rmsnorm(x, w, eps):
    # x: (T, dim) float64
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base):
    """Normal (interleaved) RoPE.  x: (T, n_heads, head_dim); pairs (2i, 2i+1)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # (T, hd/2)
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward_all(m, prompt_ids, rows=None):
    """Last-position float64 logits for each prompt in prompt_ids (rows: those positions of
    every prompt instead, as an array (len(rows), n_vocab) a prompt).

    The layers are the outer loop, so each layer's weights are dequantized once
    and used for all prompts (every prompt is processed as a (T, dim) matrix).
    """
    dim, H, KVH, hd = m.dim, m.n_head, m.n_kv_head, m.head_dim
    group = H // KVH
    emb = m.w("token_embd.weight", (-1, dim))  # (n_vocab, dim)
    n_vocab = emb.shape[0]
    xs = [emb[np.asarray(ids, dtype=np.int64)].copy() for ids in prompt_ids]

    for l in range(m.n_layer):
        p = f"blk.{l}."
        attn_norm = m.w(p + "attn_norm.weight", (dim,))
        wq = m.w(p + "attn_q.weight", (H * hd, dim))
        wk = m.w(p + "attn_k.weight", (KVH * hd, dim))
        wv = m.w(p + "attn_v.weight", (KVH * hd, dim))
        wo = m.w(p + "attn_output.weight", (dim, H * hd))
        ffn_norm = m.w(p + "ffn_norm.weight", (dim,))
        wg = m.w(p + "ffn_gate.weight", (m.n_ff, dim))
        wu = m.w(p + "ffn_up.weight", (m.n_ff, dim))
        wd = m.w(p + "ffn_down.weight", (dim, m.n_ff))

        for i, x in enumerate(xs):
            T = x.shape[0]
            pos = np.arange(T)
            xn = rmsnorm(x, attn_norm, m.eps)
            q = (xn @ wq.T).reshape(T, H, hd)
            k = (xn @ wk.T).reshape(T, KVH, hd)
            v = (xn @ wv.T).reshape(T, KVH, hd)
            q = rope(q, pos, m.rope_base)
            k = rope(k, pos, m.rope_base)
            # GQA: query head h uses KV head h // group.
            k = np.repeat(k, group, axis=1)  # (T, H, hd)
            v = np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)  # (H, T, T)
            mask = np.triu(np.ones((T, T), dtype=bool), k=1)
            scores[:, mask] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            a = np.exp(scores)
            a /= a.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", a, v).reshape(T, H * hd)
            x = x + o @ wo.T

            xn = rmsnorm(x, ffn_norm, m.eps)
            g = xn @ wg.T
            u = xn @ wu.T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ wd.T
            xs[i] = x

    out_norm = m.w("output_norm.weight", (dim,))
    result = []
    for x in xs:
        if rows is None:
            h = rmsnorm(x[-1:], out_norm, m.eps)[0]
            result.append(emb @ h)  # tied output: logits = token_embd @ h
        else:
            result.append(rmsnorm(x[rows], out_norm, m.eps) @ emb.T)
    return n_vocab, result


# The decoding reference: positions of prompt 3 (2110 tokens) on either side of the decoding
# step's runs of 1,024 keys (ra.c ATT_SPLIT), and its last. test_model decodes up to each one
# token at a time and compares its logits there with the TOP ids' float64 logits.
DECODE_PROMPT = 3
DECODE_POSITIONS = [1023, 1024, 1099, 2047, 2048, 2109]
DECODE_TOP = 64


def write_decode(path, ids, logits):
    """decode_exact.txt: a header line, then per position `pos id:logit ...`, the TOP ids by
    float64 logit (%.6f)."""
    lines = ["# prompt %d of logits_ref_kvf32.bin (%d tokens): pos, then the %d largest float64 logits "
             "at that position as id:logit (exact_logits.py --decode)" % (DECODE_PROMPT, len(ids), DECODE_TOP)]
    for pos, lg in zip(DECODE_POSITIONS, logits):
        top = np.argsort(-lg, kind="stable")[:DECODE_TOP]
        lines.append("%d %s" % (pos, " ".join("%d:%.6f" % (i, lg[i]) for i in top)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def compare(exact, ref_logits, ids_label):
    a = np.asarray(exact, dtype=np.float64)
    b = np.asarray(ref_logits, dtype=np.float64)
    rel = np.linalg.norm(a - b) / np.linalg.norm(b)
    mx = np.max(np.abs(a - b))
    top_a = np.argsort(-a, kind="stable")[:5]
    top_b = np.argsort(-b, kind="stable")[:5]
    print(f"  {ids_label}: rel L2 {rel:.3e}  max|diff| {mx:.4f}  mean|diff| {np.mean(np.abs(a - b)):.4f}")
    print(f"    top-5 exact: {top_a.tolist()}  {np.round(a[top_a], 4).tolist()}")
    print(f"    top-5 ref  : {top_b.tolist()}  {np.round(b[top_b], 4).tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(REPO, "data", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ref", default=os.path.join(REPO, "tests", "data", "logits_ref_kvf32.bin"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "logits_exact.bin"))
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--decode", action="store_true",
                    help="instead: tests/data/decode_exact.txt, the decoding reference (DECODE_POSITIONS)")
    args = ap.parse_args()

    t0 = time.time()
    ref_vocab, ref_prompts = read_rlog(args.ref)
    if args.decode:
        ids = ref_prompts[DECODE_PROMPT][0]
        _, (rows,) = forward_all(Model(args.model), [ids], rows=DECODE_POSITIONS)
        out = os.path.join(REPO, "tests", "data", "decode_exact.txt")
        write_decode(out, ids, rows)
        print(f"wrote {os.path.relpath(out)} ({os.path.getsize(out)} bytes) in {time.time() - t0:.1f} s")
        return 0
    ref_prompts = ref_prompts[: args.prompts]
    m = Model(args.model)
    n_vocab, logits = forward_all(m, [ids for ids, _ in ref_prompts])
    if n_vocab != ref_vocab:
        raise ValueError(f"n_vocab {n_vocab} != {ref_vocab} in {args.ref}")
    write_rlog(args.out, n_vocab, [(ids, lg) for (ids, _), lg in zip(ref_prompts, logits)])
    print(f"wrote {os.path.relpath(args.out)} ({os.path.getsize(args.out)} bytes) in {time.time() - t0:.1f} s")

    print(f"comparison with {os.path.relpath(args.ref)}:")
    for i, ((ids, ref_lg), lg) in enumerate(zip(ref_prompts, logits)):
        compare(lg, ref_lg, f"prompt {i} ({len(ids)} tokens)")
    # Read the output back and check it against the in-memory float64 values.
    _, back = read_rlog(args.out)
    for (ids_w, lg_w), (ids_r, _), lg in zip(back, ref_prompts, logits):
        assert np.array_equal(ids_w, ids_r)
        assert np.allclose(lg_w, lg, rtol=1e-6, atol=1e-5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
