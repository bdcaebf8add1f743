#!/usr/bin/env python3
"""Generate independent reference data for the ra C tests.

This is our own script.  It only *calls* well-kept third-party tools and
stores the numbers they produce; no code of those tools is copied here.

  * llama.cpp, through the PyPI package llama-cpp-python (tokenizer ids,
    detokenization check, next-token logits of the default model, chat formats)
  * gguf-py, the PyPI package `gguf` (dequantization reference values and
    the GGUF writer/reader for tests/data/dequant_ref.gguf)

Versions used to produce the committed data:
    Python 3.11.7, numpy 2.4.6, gguf 0.19.0,
    llama-cpp-python 0.3.36 (vendored llama.cpp / ggml 0.25.3),
    built from the sdist with CMAKE_ARGS="-DGGML_NATIVE=ON", CPU only (x86-64).

Setup (a venv outside the repository) and run, from the repository root:

    python3 -m venv ../venv-ref
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=2 \
        ../venv-ref/bin/pip install numpy gguf llama-cpp-python
    ../venv-ref/bin/python tests/ref/make_ref.py --only logits_kvf32   # first: sampler reads it
    ../venv-ref/bin/python tests/ref/make_ref.py

Optional arguments:  --model PATH  (default data/SmolLM2-135M-Instruct.Q4_1.gguf)
                     --only tok,logits,dequant,chat,chat_turns,sampler   (a subset; default)
                     --only logits_kvf32  (extra: same logits with an F32 KV
                                           cache -> tests/data/logits_ref_kvf32.bin)
                     --only tiny  (extra: logits of tiny models of other
                                   architectures -> tests/data/logits_tiny.txt)

Outputs (all under tests/data/, see tests/ref/README.md for formats):
    tok_cases.txt, tok_ref_smollm2.txt, tok_ref_smollm2_special.txt,
    logits_prompt_{0,1,2,3}.txt, logits_ref.bin, dequant_ref.gguf, chat_ref.txt, chat_turns_ref.txt,
    sampler_ref.txt (from the committed logits_ref_kvf32.bin)
    [logits_ref_kvf32.bin with --only logits_kvf32, logits_tiny.txt with --only tiny]
"""

import argparse
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DATA = os.path.join(ROOT, "tests", "data")
DEFAULT_MODEL = os.path.join(ROOT, "data", "SmolLM2-135M-Instruct.Q4_1.gguf")


def rel(p):
    return os.path.relpath(p, ROOT)


# ---------------------------------------------------------------------------
# Tokenizer test cases
# ---------------------------------------------------------------------------

TOK_CASES = [
    # plain English
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "e.g. i.e. etc. Mr. Smith met Dr. Jones at 5 p.m.",
    # empty / whitespace only
    "",
    " ",
    "  ",
    "   ",
    "    ",
    "     ",
    "        ",
    " Hello",
    "  leading two spaces",
    "Hello ",
    "trailing three   ",
    "   Hello   world   ",
    "a  b   c    d     e      f       g        h",
    # tabs
    "\t",
    "a\tb\t\tc",
    "\tindented\n\t\tdouble",
    # newlines
    "\n",
    "\n\n",
    "\n\n\n",
    "line one\nline two",
    "para one\n\npara two",
    "windows\r\nline\r\n",
    "\r",
    " \n \n  \n\t\n",
    "end with spaces  \n  next line\n",
    "trailing newline\n",
    # digits and numbers
    "1234567890",
    "3.14159",
    "1,000,000",
    "123 4567 89012 345678",
    "version 2.0.1-rc3, build #42",
    "x = 10**6; y = 3e-5; z = -0.001",
    "1st 2nd 3rd 4th 2024-01-15 12:34:56",
    # punctuation runs
    "!!!???...;;;",
    "Hello!!! Are you there???",
    "--- === *** ### @@@ ~~~",
    "(a+b)*[c-d]/{e^f}",
    "\"quoted\" 'single' `back`",
    # contractions
    "It's they're we've I'm you'll he'd don't",
    "IT'S THEY'RE WE'VE I'M YOU'LL HE'D DON'T",
    "'s 't 're 've 'm 'll 'd",
    "John's car isn't here; JOHN'S CAR ISN'T",
    "rock 'n' roll ''quoted''",
    # non-ASCII
    "café naïve résumé über Straße",
    "ÀÉÎÕÜ àéîõü Ñandú",
    "Ελληνικά: Γειά σου κόσμε",
    "Привет, мир! Как дела?",
    "你好，世界。我喜欢编程。",
    "こんにちは世界、カタカナとひらがな",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "non\u00a0breaking\u3000ideographic space",
    "١٢٣ ٤٥٦ and １２３",
    "ﬁ ligature, ½ fraction, ™ and ©",
    # emoji
    "😀",
    "I love 🍕 and 🍣!",
    "👨‍👩‍👧‍👦 family",
    "🇺🇸🇫🇷🇯🇵",
    "👍🏽 skin tone",
    "Mixed: English, 中文, русский, 123, 🎉!",
    # code
    "def add(a, b):\n    return a + b\n",
    "int main(void) {\n\tprintf(\"hi\\n\");\n\treturn 0;\n}",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "https://example.com/path?query=1&x=y#frag user@example.com",
    "CamelCaseIdentifier snake_case_name kebab-case SCREAMING_CASE",
    # long runs
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    # other control bytes
    "vt\x0bff\x0cend",
    "ctrl\x01\x02\x7fbytes",
    # special-token text
    "<|im_start|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|>user\nHello<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start| not closed <| im_end |>",
    " <|endoftext|> spaced ",
]


def escape_case(s: str) -> str:
    out = []
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        else:
            out.append(ch)
    return "".join(out)


def unescape_case(line: str) -> str:
    out = []
    i = 0
    while i < len(line):
        c = line[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        n = line[i + 1]
        if n == "n":
            out.append("\n"); i += 2
        elif n == "t":
            out.append("\t"); i += 2
        elif n == "r":
            out.append("\r"); i += 2
        elif n == "\\":
            out.append("\\"); i += 2
        elif n == "x":
            out.append(chr(int(line[i + 2:i + 4], 16))); i += 4
        else:
            raise ValueError("bad escape in %r" % line)
    return "".join(out)


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for ln in lines:
            f.write(ln + "\n")
    print("wrote %s (%d bytes)" % (rel(path), os.path.getsize(path)))


def gen_tok(model_path):
    from llama_cpp import Llama

    cases = TOK_CASES
    esc = [escape_case(c) for c in cases]
    for c, e in zip(cases, esc):  # self-check of the escape format
        assert unescape_case(e) == c and "\n" not in e
    write_lines(os.path.join(DATA, "tok_cases.txt"), esc)

    llm = Llama(model_path=model_path, vocab_only=True, verbose=False)
    meta = llm.metadata
    print("tokenizer.ggml.model =", meta.get("tokenizer.ggml.model"),
          " pre =", meta.get("tokenizer.ggml.pre"),
          " add_bos =", meta.get("tokenizer.ggml.add_bos_token"),
          " bos/eos =", llm.token_bos(), llm.token_eos())
    tmpl = meta.get("tokenizer.chat_template")
    if tmpl is not None:
        print("chat template:\n" + tmpl)

    plain, special = [], []
    bad = 0
    for i, c in enumerate(cases):
        b = c.encode("utf-8")
        ids = llm.tokenize(b, add_bos=False, special=False)
        ids_s = llm.tokenize(b, add_bos=False, special=True)
        plain.append(" ".join(str(t) for t in ids))
        special.append(" ".join(str(t) for t in ids_s))
        d = llm.detokenize(ids)
        d_s = llm.detokenize(ids_s, special=True)
        if d != b:
            bad += 1
            print("DETOKENIZE MISMATCH (special=False) case %d: %r -> %r" % (i, b, d))
        if d_s != b:
            bad += 1
            print("DETOKENIZE MISMATCH (special=True) case %d: %r -> %r" % (i, b, d_s))
        if ids != ids_s:
            print("case %d differs with special=True: %r\n   plain   %s\n   special %s"
                  % (i, c, plain[-1], special[-1]))
    print("detokenize mismatches: %d" % bad)
    write_lines(os.path.join(DATA, "tok_ref_smollm2.txt"), plain)
    write_lines(os.path.join(DATA, "tok_ref_smollm2_special.txt"), special)


# ---------------------------------------------------------------------------
# Logits reference
# ---------------------------------------------------------------------------

class XorShift64:
    """Tiny self-contained PRNG so the prompts never depend on Python's random."""

    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF

    def next(self):
        x = self.s
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        self.s = x
        return x

    def below(self, n):
        return (self.next() >> 11) % n

    def pick(self, seq):
        return seq[self.below(len(seq))]


SUBJECTS = ["the old farmer", "a young engineer", "the committee", "my neighbour",
            "the river", "a small robot", "the teacher", "our team", "the city council",
            "a curious child", "the library", "the northern train", "every student",
            "the ship's captain", "a quiet musician", "the market"]
VERBS = ["carried", "found", "built", "noticed", "repaired", "painted", "counted",
         "described", "followed", "opened", "measured", "borrowed", "sold", "planted",
         "discovered", "remembered"]
ADJS = ["green", "heavy", "ancient", "bright", "narrow", "wooden", "silent", "broken",
        "famous", "tiny", "golden", "strange", "careful", "warm", "distant", "simple"]
NOUNS = ["boxes", "bridge", "letters", "garden", "windows", "machine", "stones",
         "maps", "apples", "lanterns", "songs", "records", "bicycles", "clocks",
         "questions", "tools"]
PLACES = ["near the harbour", "in the valley", "behind the station", "at the school",
          "across the field", "under the bridge", "in March", "before dawn",
          "after the storm", "on the third floor", "beside the lake", "in 1987"]
CONNECT = ["and then", "but", "because", "while", "so", "although", "after which"]
OPENERS = ["However,", "Meanwhile,", "In the end,", "Surprisingly,", "Later that day,",
           "As expected,", "For example,", "Still,"]


def make_sentence(r):
    k = r.below(6)
    if k == 0:
        s = "%s %s %d %s %s %s" % (r.pick(SUBJECTS), r.pick(VERBS), 2 + r.below(998),
                                    r.pick(ADJS), r.pick(NOUNS), r.pick(PLACES))
    elif k == 1:
        s = "%s %s the %s %s, %s %s %s the %s %s" % (
            r.pick(OPENERS), r.pick(SUBJECTS), r.pick(ADJS), r.pick(NOUNS),
            r.pick(CONNECT), r.pick(SUBJECTS), r.pick(VERBS), r.pick(ADJS), r.pick(NOUNS))
    elif k == 2:
        s = "%s %s %s %s; it cost %d.%02d dollars" % (
            r.pick(SUBJECTS), r.pick(VERBS), r.pick(ADJS), r.pick(NOUNS),
            1 + r.below(500), r.below(100))
    elif k == 3:
        s = "\"Why are the %s so %s?\" asked %s" % (r.pick(NOUNS), r.pick(ADJS),
                                                   r.pick(SUBJECTS))
    elif k == 4:
        s = "%s %s the %s %s (about %d%% of them) %s" % (
            r.pick(SUBJECTS), r.pick(VERBS), r.pick(ADJS), r.pick(NOUNS),
            r.below(101), r.pick(PLACES))
    else:
        s = "%s %s %s %s, %s %s, and %s %s" % (
            r.pick(OPENERS), r.pick(SUBJECTS), r.pick(VERBS), r.pick(NOUNS),
            r.pick(ADJS), r.pick(NOUNS), r.pick(ADJS), r.pick(NOUNS))
    s = s[0].upper() + s[1:]
    end = "?" if s.endswith("?") else ("!" if r.below(10) == 0 else ".")
    return s if s.endswith("?") else s + end


def make_text(seed, n_tokens_min, tokenize):
    r = XorShift64(seed)
    paras, cur = [], []
    while True:
        cur.append(make_sentence(r))
        if len(cur) >= 3 + r.below(4):
            paras.append(" ".join(cur))
            cur = []
        text = "\n\n".join(paras + ([" ".join(cur)] if cur else []))
        if len(tokenize(text)) >= n_tokens_min:
            return text


SHORT_PROMPT = "The capital of France is Paris, and the capital of Germany is the city of"
LOGIT_TARGETS = [None, 200, 1000, 2100]   # None = SHORT_PROMPT (16 tokens)


def no_repack_llama():
    """llama.cpp's --no-repack: on CPUs with AMX its AMX weight buffers crash llama_decode in
    llama-cpp-python 0.3.36; elsewhere a Q4_1 or F32 model has no repacked form, so the same
    numbers"""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from bench_forward import no_repack
    no_repack()


def last_logits(llm, n_vocab):
    """the logits of the last token llm evaluated, as float32, checked finite"""
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype("<f4").copy()
    assert np.all(np.isfinite(logits))
    return logits


def gen_logits(model_path, kv_f32=False):
    from llama_cpp import Llama

    # Default llama.cpp settings: F16 KV cache, no flash attention.  With
    # kv_f32 the KV cache is F32 (type_k = type_v = GGML_TYPE_F32 = 0) and the
    # output goes to logits_ref_kvf32.bin instead (same format, same prompts).
    kv = dict(type_k=0, type_v=0) if kv_f32 else {}
    no_repack_llama()
    llm = Llama(model_path=model_path, n_ctx=4096, n_batch=512, logits_all=False,
                n_threads=2, seed=0, verbose=False, **kv)
    n_vocab = llm.n_vocab()
    tok = lambda t: llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)

    out = bytearray()
    out += b"RLOG" + struct.pack("<III", 1, len(LOGIT_TARGETS), n_vocab)
    for i, tgt in enumerate(LOGIT_TARGETS):
        text = SHORT_PROMPT if tgt is None else make_text(1000 + i, tgt, tok)
        p = os.path.join(DATA, "logits_prompt_%d.txt" % i)
        with open(p, "wb") as f:
            f.write(text.encode("utf-8"))
        print("wrote %s (%d bytes)" % (rel(p), os.path.getsize(p)))
        ids = tok(text)
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm, n_vocab)
        out += struct.pack("<I", len(ids))
        out += np.asarray(ids, dtype="<i4").tobytes()
        out += logits.tobytes()
        top = np.argsort(-logits, kind="stable")[:5]
        desc = ", ".join("%d %r %.4f" % (t, llm.detokenize([int(t)]).decode("utf-8", "replace"),
                                        logits[t]) for t in top)
        print("prompt %d: %d tokens; top-5: %s" % (i, len(ids), desc))
    p = os.path.join(DATA, "logits_ref_kvf32.bin" if kv_f32 else "logits_ref.bin")
    with open(p, "wb") as f:
        f.write(out)
    print("wrote %s (%d bytes)" % (rel(p), os.path.getsize(p)))


# ---------------------------------------------------------------------------
# Dequantization reference
# ---------------------------------------------------------------------------

# fp16 fields (byte offsets inside one block) that are scales (d, m, dmin)
FP16_FIELDS = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0],
}
# new types go at the end: the generator then draws the same bytes for the earlier ones
DEQ_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
             "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]
ROWS, COLS = 4, 512


def make_raw(qname, rng):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    qt = GGMLQuantizationType[qname]
    bs, ts = GGML_QUANT_SIZES[qt]
    nb = ROWS * COLS // bs
    if qname == "F32":
        u = rng.integers(0, 2**32, size=ROWS * COLS, dtype=np.uint64).astype(np.uint32)
        bad = (u & 0x7F800000) == 0x7F800000          # Inf/NaN exponent
        u[bad] &= ~np.uint32(0x40000000)
        return u.view(np.uint8).reshape(ROWS, COLS * 4)
    if qname in ("F16", "BF16"):
        u = rng.integers(0, 2**16, size=ROWS * COLS, dtype=np.uint32).astype(np.uint16)
        m = np.uint16(0x7C00 if qname == "F16" else 0x7F80)
        top = np.uint16(0x4000)
        bad = (u & m) == m
        u[bad] &= ~top
        return u.view(np.uint8).reshape(ROWS, COLS * 2)
    blocks = rng.integers(0, 256, size=(nb, ts), dtype=np.uint16).astype(np.uint8)
    for off in FP16_FIELDS[qname]:
        v = rng.uniform(-2.0, 2.0, size=nb).astype(np.float16)
        blocks[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(ROWS, COLS // bs * ts)


def ggml_to_float(qname, raw):
    """Optional cross-check with ggml's own to_float (from the llama_cpp build)."""
    import ctypes, glob
    try:
        import llama_cpp
    except ImportError:
        return None
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    cands = sorted(glob.glob(os.path.join(libdir, "libggml-base.*")))
    if not cands:
        return None
    lib = ctypes.CDLL(cands[0])

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    from gguf import GGMLQuantizationType
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    tr = lib.ggml_get_type_traits(int(GGMLQuantizationType[qname])).contents
    if qname == "F32":
        return raw.view("<f4").reshape(ROWS, COLS).copy()
    if not tr.to_float:
        return None
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(tr.to_float)
    src = np.ascontiguousarray(raw)
    dst = np.zeros(ROWS * COLS, dtype=np.float32)
    fn(src.ctypes.data, dst.ctypes.data, ROWS * COLS)
    return dst.reshape(ROWS, COLS)


def gen_dequant():
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    from gguf.quants import dequantize

    rng = np.random.default_rng(20240601)
    path = os.path.join(DATA, "dequant_ref.gguf")
    w = GGUFWriter(path, "ra-dequant-test")
    w.add_string("ra.test.description",
                 "q.<TYPE>: raw blocks (4 x 512 elements) with real GGML type; "
                 "f.<TYPE>: F32 expected values from gguf-py quants.dequantize")
    w.add_array("ra.test.types", DEQ_TYPES)
    expected = {}
    for qname in DEQ_TYPES:
        qt = GGMLQuantizationType[qname]
        raw = make_raw(qname, rng)
        exp = np.asarray(dequantize(raw, qt), dtype=np.float32).reshape(ROWS, COLS)
        assert np.all(np.isfinite(exp)), qname
        g = ggml_to_float(qname, raw)
        if g is not None:
            same = np.array_equal(g.view(np.uint32), exp.view(np.uint32))
            diff = np.abs(g.astype(np.float64) - exp)
            rel_ = diff / np.maximum(np.abs(exp), 1e-30)
            print("%-5s gguf-py vs ggml to_float: bit-identical=%s max_abs=%.3g max_rel=%.3g"
                  % (qname, same, diff.max(), rel_[diff > 0].max() if (diff > 0).any() else 0.0))
        expected[qname] = exp
        w.add_tensor("q." + qname, raw, raw_shape=raw.shape, raw_dtype=qt)
        w.add_tensor("f." + qname, exp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s (%d bytes)" % (rel(path), os.path.getsize(path)))

    # read back
    rd = GGUFReader(path)
    ts = {t.name: t for t in rd.tensors}
    for qname in DEQ_TYPES:
        tq, tf = ts["q." + qname], ts["f." + qname]
        assert tq.tensor_type == GGMLQuantizationType[qname], qname
        assert list(tq.shape) == [COLS, ROWS], (qname, tq.shape)
        assert tf.tensor_type == GGMLQuantizationType.F32
        got = np.asarray(dequantize(tq.data, tq.tensor_type), dtype=np.float32).reshape(ROWS, COLS)
        ff = np.asarray(tf.data, dtype=np.float32).reshape(ROWS, COLS)
        assert np.array_equal(got.view(np.uint32), expected[qname].view(np.uint32)), qname
        assert np.array_equal(ff.view(np.uint32), expected[qname].view(np.uint32)), qname
    print("dequant_ref.gguf read back OK (%d tensors)" % len(rd.tensors))


# ---------------------------------------------------------------------------
# Chat formats: llama.cpp's llama_chat_apply_template on one user message
# ---------------------------------------------------------------------------

# Templates that llama.cpp reads by substrings: short stand-ins written here, each with the
# markers one of its rules looks for (the files' own templates are long Jinja programs), and
# pairs of markers whose order of testing decides the format.
CHAT_TEMPLATES = [
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{% endfor %}",
    "<|im_start|><|im_sep|>",
    "<|im_start|><end_of_utterance>",
    "<|im_start|> [INST] <|start_header_id|><|end_header_id|>",
    "{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}",
    "{{ '<<SYS>>' }}[INST]",
    "{{ bos_token + '[INST] ' }}<<SYS>>",
    "{{ message['content'].strip() }}[INST]",
    "{{ ' [INST] ' + system_message }}",
    "[AVAILABLE_TOOLS]{{ '[INST] ' + m['content'] + '[/INST]' }}",
    "[AVAILABLE_TOOLS]{{ \"[INST]\" + m['content'] + \"[/INST]\" }}",
    "[SYSTEM_PROMPT][INST][/INST]",
    "mistral-like template without markers",
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>",
    "<|start_header_id|> <|assistant|><|end|>",
    "<start_of_turn>user <|start_header_id|><|end_header_id|>",
    "<|assistant|><|user|></s>",
    "<|assistant|><|user|>",
    "<|user|><|endoftext|>",
    "USER: ASSISTANT: ",
    "USER: ASSISTANT: SYSTEM: ",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "",
]

CHAT_MESSAGES = [
    "What is the capital of France?",
    "  two lines,\nspaces around \t\n",
    "\u00e9t\u00e9 [INST] <|im_end|>",
]


def chat_apply(tmpl, msg):
    import ctypes
    import llama_cpp
    chat = (llama_cpp.llama_chat_message * 1)()
    chat[0].role = b"user"
    chat[0].content = msg.encode("utf-8")
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode("utf-8"), chat, 1, True, buf, len(buf))
    return None if n < 0 else buf.raw[:n].decode("utf-8")


def gen_chat():
    """chat_ref.txt: template, message, llama.cpp's text (or "-" where it writes none), one
    escaped line each, three lines a case; the templates are every built-in name llama.cpp
    lists, then CHAT_TEMPLATES."""
    import ctypes
    import llama_cpp
    names = (ctypes.c_char_p * 256)()
    n = llama_cpp.llama_chat_builtin_templates(names, 256)
    templates = sorted(names[i].decode() for i in range(n)) + CHAT_TEMPLATES
    lines = []
    for t in templates:
        for msg in CHAT_MESSAGES:
            out = chat_apply(t, msg)
            lines += [escape_case(t), escape_case(msg), "-" if out is None else "=" + escape_case(out)]
    write_lines(os.path.join(DATA, "chat_ref.txt"), lines)


# a conversation: the first user turn, an answer, a second user turn, the answer's turn opened
CHAT_TURNS = [("user", "A long document.\n\nWhat is the pass key?"), ("assistant", "It is 41814."),
              ("user", "Repeat it.")]


def gen_chat_turns():
    """chat_turns_ref.txt: each built-in template of llama.cpp, then its text for CHAT_TURNS (or
    "-"), one escaped line each: what -cnv's turns (model.c:chat_parts) must add up to."""
    import ctypes
    import llama_cpp
    names = (ctypes.c_char_p * 256)()
    n = llama_cpp.llama_chat_builtin_templates(names, 256)
    chat = (llama_cpp.llama_chat_message * len(CHAT_TURNS))()
    keep = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in CHAT_TURNS]
    for i, (r, c) in enumerate(keep):
        chat[i].role, chat[i].content = r, c
    lines = []
    for t in sorted(names[i].decode() for i in range(n)):
        buf = ctypes.create_string_buffer(1 << 16)
        k = llama_cpp.llama_chat_apply_template(t.encode("utf-8"), chat, len(keep), True, buf, len(buf))
        lines += [escape_case(t), "-" if k < 0 else "=" + escape_case(buf.raw[:k].decode("utf-8"))]
    write_lines(os.path.join(DATA, "chat_turns_ref.txt"), lines)


# ---------------------------------------------------------------------------
# The sampler chain
# ---------------------------------------------------------------------------

# (top_k, top_p, min_p, temp): llama.cpp's defaults first, then each filter alone and together
SAMPLER_CASES = [
    (40, 0.95, 0.05, 0.8),
    (0, 0.7, 0.0, 1.0),
    (0, 1.0, 0.1, 1.5),
    (100, 0.5, 0.0, 0.7),
    (5, 1.0, 0.0, 2.0),
    (0, 0.99, 0.01, 1.2),
    (1000, 0.8, 0.02, 0.5),
    (3, 0.6, 0.3, 1.0),
]
SAMPLER_SCALES = [1.0, 0.5]   # the logits as they are, and flattened (more tokens kept)


def read_rlog(path):
    with open(path, "rb") as f:
        b = f.read()
    magic, _, n_prompts, n_vocab = struct.unpack_from("<4sIII", b, 0)
    assert magic == b"RLOG"
    off, out = 16, []
    for _ in range(n_prompts):
        (nt,) = struct.unpack_from("<I", b, off)
        off += 4 + 4 * nt
        out.append(np.frombuffer(b, dtype="<f4", count=n_vocab, offset=off).copy())
        off += 4 * n_vocab
    return out


def chain_probs(logits, top_k, top_p, min_p, temp):
    """llama.cpp's chain top_k, top_p, min_p, temp, dist (min_keep 1) applied to logits: the
    tokens kept and the probabilities dist gives them."""
    import ctypes
    import llama_cpp as L
    n = len(logits)
    arr = (L.llama_token_data * n)()
    for i in range(n):
        arr[i].id, arr[i].logit, arr[i].p = i, float(logits[i]), 0.0
    cur = L.llama_token_data_array(data=arr, size=n, selected=-1, sorted=False)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for smpl in (L.llama_sampler_init_top_k(top_k), L.llama_sampler_init_top_p(top_p, 1),
                 L.llama_sampler_init_min_p(min_p, 1), L.llama_sampler_init_temp(temp),
                 L.llama_sampler_init_dist(1234)):
        L.llama_sampler_chain_add(chain, smpl)
    L.llama_sampler_apply(chain, ctypes.byref(cur))
    L.llama_sampler_free(chain)
    return sorted((arr[i].id, arr[i].p) for i in range(cur.size))


def gen_sampler():
    """sampler_ref.txt: for each prompt of logits_ref_kvf32.bin, scale and case, one line
    `prompt scale top_k top_p min_p temp m id:p ...`, the m kept tokens by id."""
    prompts = read_rlog(os.path.join(DATA, "logits_ref_kvf32.bin"))
    lines = ["# prompt scale top_k top_p min_p temp m id:p ... (llama.cpp's chain; see tests/ref/README.md)"]
    for pi, lg in enumerate(prompts):
        for scale in SAMPLER_SCALES:
            z = lg * np.float32(scale)
            for (k, tp, mp, t) in SAMPLER_CASES:
                kept = chain_probs(z, k, tp, mp, t)
                lines.append("%d %g %d %g %g %g %d %s" % (pi, scale, k, tp, mp, t, len(kept),
                             " ".join("%d:%.7g" % (i, p) for i, p in kept)))
    write_lines(os.path.join(DATA, "sampler_ref.txt"), lines)


# ---------------------------------------------------------------------------
# Tiny models of other architectures: next-token logits by llama.cpp
# ---------------------------------------------------------------------------

TINY_POSITIONS = (0, 9, 99)   # the prompt runs in batches ending at these positions


def gen_tiny():
    """llama.cpp's logits for the tiny F32 models tests/bin/gen_fixtures writes (TINY_REFS in
    tests/gguf_writer.h: Llama 3.1's rope_freqs, Qwen2, head dim 128, no GQA with linear RoPE
    scaling, Gemma 3's sliding window, its 27B's query scale, its RoPE scaling), F32 KV cache,
    at the last position of each batch of one 100-token prompt."""
    import random
    import subprocess
    import tempfile
    import llama_cpp
    from llama_cpp import Llama
    no_repack_llama()
    subprocess.run(["make", "-s", "tests/bin/gen_fixtures"], check=True)
    lines = ["# llama.cpp (llama-cpp-python %s), F32 KV cache, no flash attention: logits of the "
             "tiny models of TINY_REFS (tests/gguf_writer.h) after batches of one prompt; "
             "tests/ref/make_ref.py --only tiny" % llama_cpp.__version__]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["tests/bin/gen_fixtures", d], check=True)
        for name in sorted(f for f in os.listdir(d) if f.startswith("ref_")):
            llm = Llama(model_path=os.path.join(d, name), n_ctx=128, n_batch=128, logits_all=False,
                        n_threads=2, seed=0, verbose=False, type_k=0, type_v=0, flash_attn=False)
            n_vocab = llm.n_vocab()
            rng = random.Random(name)
            ids = [rng.randrange(n_vocab - 1) for _ in range(TINY_POSITIONS[-1] + 1)]
            lines.append("model %s %d" % (name, n_vocab))
            lines.append("tokens " + " ".join(map(str, ids)))
            start = 0
            for pos in TINY_POSITIONS:
                llm.eval(ids[start:pos + 1])
                start = pos + 1
                logits = last_logits(llm, n_vocab)
                lines.append("pos %d " % pos + " ".join("%.8g" % x for x in logits))
            print("%s: %d tokens, top-1 at the last position %d (logit %.4f)" % (
                name, len(ids), int(np.argmax(logits)), float(logits.max())))
            del llm
    write_lines(os.path.join(DATA, "logits_tiny.txt"), lines)



GEMMA3_MODEL = os.path.join(ROOT, "data", "gemma-3-270m-q4_k_m.gguf")
GEMMA3_DATA = os.path.join(DATA, "gemma3")
GEMMA3_TARGETS = [None, 1000, 2100, 9000]   # None = SHORT_PROMPT; 1000 > the 512-key window
GEMMA3_DECODE = [(1, 24), (3, 24)]   # (prompt, greedy steps) of the decoding reference
DECODE_TOP = 64


def gen_gemma3(model_path):
    """Gemma 3 270M (make model-gemma): its tokenizer on TOK_CASES, the next-token logits of four
    prompts (one past the sliding window, one past 8K) with an F32 KV cache, and greedy decoding
    one token an eval, the 64 largest logits of each step. Into tests/data/gemma3/."""
    from llama_cpp import Llama
    os.makedirs(GEMMA3_DATA, exist_ok=True)
    voc = Llama(model_path=model_path, vocab_only=True, verbose=False)
    plain, special = [], []
    for c in TOK_CASES:
        b = c.encode("utf-8")
        ids = voc.tokenize(b, add_bos=False, special=False)
        ids_s = voc.tokenize(b, add_bos=False, special=True)
        assert voc.detokenize(ids) == b and voc.detokenize(ids_s, special=True) == b, c
        plain.append(" ".join(str(t) for t in ids))
        special.append(" ".join(str(t) for t in ids_s))
    write_lines(os.path.join(GEMMA3_DATA, "tok_ref.txt"), plain)
    write_lines(os.path.join(GEMMA3_DATA, "tok_ref_special.txt"), special)
    del voc

    no_repack_llama()
    llm = Llama(model_path=model_path, n_ctx=9600, n_batch=512, logits_all=False, n_threads=2,
                seed=0, verbose=False, type_k=0, type_v=0)
    n_vocab = llm.n_vocab()
    tok = lambda t: llm.tokenize(t.encode("utf-8"), add_bos=True, special=False)
    out = bytearray(b"RLOG" + struct.pack("<III", 1, len(GEMMA3_TARGETS), n_vocab))
    prompts = []
    for i, tgt in enumerate(GEMMA3_TARGETS):
        text = SHORT_PROMPT if tgt is None else make_text(2000 + i, tgt, tok)
        p = os.path.join(GEMMA3_DATA, "logits_prompt_%d.txt" % i)
        with open(p, "wb") as f:
            f.write(text.encode("utf-8"))
        ids = tok(text)
        prompts.append(ids)
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm, n_vocab)
        out += struct.pack("<I", len(ids)) + np.asarray(ids, dtype="<i4").tobytes()
        out += logits.tobytes()
        print("gemma3 prompt %d: %d tokens, top-1 %d" % (i, len(ids), int(np.argmax(logits))))
    p = os.path.join(GEMMA3_DATA, "logits_ref_kvf32.bin")
    with open(p, "wb") as f:
        f.write(out)
    print("wrote %s (%d bytes)" % (rel(p), os.path.getsize(p)))

    lines = ["# prompt step token margin, then the %d largest logits as id:logit" % DECODE_TOP]
    for pi, steps in GEMMA3_DECODE:
        llm.reset()
        llm.eval(prompts[pi])
        for step in range(steps):
            logits = last_logits(llm, n_vocab)
            top = np.argsort(-logits, kind="stable")[:DECODE_TOP]
            t = int(top[0])
            lines.append("%d %d %d %.6f %s" % (pi, step, t, logits[top[0]] - logits[top[1]],
                         " ".join("%d:%.6f" % (int(k), logits[k]) for k in top)))
            llm.eval([t])
    write_lines(os.path.join(GEMMA3_DATA, "decode_ref.txt"), lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--only", default="tok,logits,dequant,chat,chat_turns,sampler",
                    help="comma list of: tok, logits, logits_kvf32, dequant, chat, chat_turns, "
                         "sampler, tiny, gemma3")
    a = ap.parse_args()
    os.makedirs(DATA, exist_ok=True)
    from importlib.metadata import version, PackageNotFoundError
    for pkg in ("numpy", "gguf", "llama_cpp_python"):
        try:
            print("%s %s" % (pkg, version(pkg)))
        except PackageNotFoundError:
            print("%s not installed" % pkg)
    parts = a.only.split(",")
    if "tok" in parts:
        gen_tok(a.model)
    if "logits" in parts:
        gen_logits(a.model)
    if "logits_kvf32" in parts:
        gen_logits(a.model, kv_f32=True)
    if "dequant" in parts:
        gen_dequant()
    if "chat" in parts:
        gen_chat()
    if "chat_turns" in parts:
        gen_chat_turns()
    if "sampler" in parts:
        gen_sampler()
    if "tiny" in parts:
        gen_tiny()
    if "gemma3" in parts:
        gen_gemma3(GEMMA3_MODEL)


if __name__ == "__main__":
    sys.exit(main())
