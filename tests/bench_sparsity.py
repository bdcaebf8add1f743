#!/usr/bin/env python3
"""bench_sparsity.py - §2.3 of the paper (Fig. 2a): how few keys dominate a decoding query's
attention, on the queries, keys and values that ./ra --dump-qk DIR wrote.

For every layer, query head and generated token (the query at position p = n_prompt + j,
attending keys 0..p as Eq. (1) does), with a = softmax(q K^T / sqrt(hd)) and o = a V:
  - the keys needed for 90% and 99% of the attention mass (a sorted, largest first);
  - the mass of the top 36, 100 and 500 keys (the paper: "the top 500 tokens dominate");
  - the top-k approximation of §2.3 / Eq. (2): o_k = sum over the k largest a_i of a_i v_i,
    divided by their mass, and its mean-square error against o, (1/hd) |o_k - o|^2: the
    smallest k whose MSE is below 1e-6 (the paper: 36 tokens for Llama-2-7B at 64K), and the
    relative error |o_k - o| / |o| at k = 100 (ra's --topk);
  - §3.3's split of the same keys: the static pattern W (the first `sink` and the last `window`
    keys, from meta.json: ./ra's defaults 128 and 512) and the exact top 100 of the keys between
    (what --attn flat attends, and what RetrievalAttention's search looks for): the mass of W,
    the mass of W and those 100, and the output error of attention over them alone (Eq. (4)-(5)
    over W and Omega, with Omega exact);
  - how the critical keys change from token to token (§2.3, "dynamic"): the share of a query's
    top 100 keys that were in the same head's top 100 at the previous token (whose keys are one
    fewer). ra's warm start (REFERENCE.md, departures) seeds each search with the previous
    token's result, so this share is what it can hope to reuse.
Everything in float64.

Writes OUT/sparsity.csv (one row per layer, head, token), OUT/rank.dat (the sorted weights
a_(r) against rank r: quartiles over all queries, for the plot of Fig. 2a) and OUT/mse.dat (the
MSE of o_k against k: quartiles), and prints the quartiles of each measure.

  tests/bench_sparsity.py DUMP_DIR OUT_DIR
Needs numpy (tests/bench_sparsity.sh installs it into .venv).
"""
import json
import math
import os
import sys

import numpy as np

MSE_TARGET = 1e-6


def rows(d, name, n, hd):
    x = np.fromfile(os.path.join(d, name), dtype="<f4")
    if x.size < n * hd:
        sys.exit("bench_sparsity: %s: %d floats, want at least %d x %d" % (name, x.size, n, hd))
    return x[:n * hd].reshape(n, hd).astype(np.float64)


def ks_grid(n):
    """1, 2, 3, 4, 5, 6, 8, 10, 13, ... (about 12 a decade) up to n"""
    g = sorted({int(round(10 ** (e / 12))) for e in range(0, int(12 * math.log10(n)) + 1)} | {n})
    return [k for k in g if 1 <= k <= n]


def query_stats(q, K, V, sink, window):
    """the measures of one query against keys K and values V (rows 0..p)"""
    hd = q.shape[0]
    s = K @ q / math.sqrt(hd)
    a = np.exp(s - s.max())
    a /= a.sum()
    o = a @ V
    order = np.argsort(-a, kind="stable")
    w = a[order]
    mass = np.cumsum(w)
    partial = np.cumsum(w[:, None] * V[order], axis=0)       # (n, hd): sum of the k largest a_i v_i
    ok = partial / mass[:, None]                              # o_k for k = 1..n (Eq. (2) over the top k)
    mse = ((ok - o) ** 2).mean(axis=1)
    n = len(w)
    below = np.nonzero(mse < MSE_TARGET)[0]
    top = lambda k: float(mass[min(k, n) - 1])
    in_w = np.zeros(n, dtype=bool)                            # §3.3: W, then the top 100 of the rest
    in_w[:sink] = True
    in_w[max(n - window, 0):] = True
    mid = np.nonzero(~in_w)[0]
    omega = mid[np.argsort(-a[mid], kind="stable")[:100]]
    keep = in_w.copy()
    keep[omega] = True
    o_wo = (a[keep] @ V[keep]) / a[keep].sum()
    return {
        "n_keys": n,
        "k90": int(np.searchsorted(mass, 0.90) + 1),
        "k99": int(np.searchsorted(mass, 0.99) + 1),
        "mass36": top(36), "mass100": top(100), "mass500": top(500),
        "k_mse": int(below[0] + 1) if len(below) else n,
        "mse36_ok": bool(mse[min(36, n) - 1] < MSE_TARGET),
        "rel100": float(np.linalg.norm(ok[min(100, n) - 1] - o) / np.linalg.norm(o)),
        "mass_w": float(a[in_w].sum()), "mass_w100": float(a[keep].sum()),
        "rel_w100": float(np.linalg.norm(o_wo - o) / np.linalg.norm(o)),
        "top100": order[:100], "w": w, "mse": mse,
    }


def quartiles(x):
    return np.percentile(np.asarray(x, dtype=np.float64), [25, 50, 75])


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tests/bench_sparsity.py DUMP_DIR OUT_DIR")
    d, out = sys.argv[1], sys.argv[2]
    m = json.load(open(os.path.join(d, "meta.json")))
    L, H, G, hd, npr, ng = m["n_layers"], m["n_heads"], m["n_kv"], m["hd"], m["n_prompt"], m["n_gen"]
    if ng < 1:
        sys.exit("bench_sparsity: %s has no generated tokens' queries (n_gen 0)" % d)
    layers = m.get("global_layers", list(range(L)))   # a sliding layer's keys are not dumped
    if not os.path.exists(os.path.join(d, "v_l%d_kv0.f32" % layers[0])):
        sys.exit("bench_sparsity: %s has no values (v_l*_kv*.f32): a dump from before they were written; make it again" % d)
    os.makedirs(out, exist_ok=True)
    ranks = ks_grid(npr)                                      # the ranks every query has keys for
    stats, rank_w, rank_mse = [], [], []
    with open(os.path.join(out, "sparsity.csv"), "w") as f:
        f.write("layer,head,step,n_keys,k90,k99,mass36,mass100,mass500,k_mse,rel100,kept100,mass_w,mass_w100,rel_w100\n")
        for l in layers:
            for g in range(G):
                K = rows(d, "k_l%d_kv%d.f32" % (l, g), npr + ng, hd)
                V = rows(d, "v_l%d_kv%d.f32" % (l, g), npr + ng, hd)
                for h in range(g * (H // G), (g + 1) * (H // G)):   # GQA: the query heads of KV head g
                    Q = rows(d, "qd_l%d_h%d.f32" % (l, h), ng, hd)
                    prev = None
                    for j in range(ng):
                        p = npr + j
                        st = query_stats(Q[j], K[:p + 1], V[:p + 1], m["sink"], m["window"])
                        st["kept100"] = len(np.intersect1d(st["top100"], prev)) / 100 if prev is not None else -1
                        prev = st.pop("top100")
                        f.write("%d,%d,%d,%d,%d,%d,%.6f,%.6f,%.6f,%d,%.4e,%.2f,%.6f,%.6f,%.4e\n" % (
                            l, h, j, st["n_keys"], st["k90"], st["k99"], st["mass36"], st["mass100"],
                            st["mass500"], st["k_mse"], st["rel100"], st["kept100"], st["mass_w"], st["mass_w100"],
                            st["rel_w100"]))
                        rank_w.append(st["w"][np.array(ranks) - 1])
                        rank_mse.append(st["mse"][np.array(ranks) - 1])
                        del st["w"], st["mse"]
                        stats.append(st)
            print("bench_sparsity: layer %d of %d" % (l + 1, L), file=sys.stderr, end="\r")
    print(file=sys.stderr)
    rank_w, rank_mse = np.array(rank_w), np.array(rank_mse)
    for name, arr in (("rank.dat", rank_w), ("mse.dat", rank_mse)):
        q = np.percentile(arr, [25, 50, 75], axis=0)
        with open(os.path.join(out, name), "w") as f:
            f.write("# k q25 median q75 over %d queries\n" % len(arr))
            for i, k in enumerate(ranks):
                f.write("%d %.6e %.6e %.6e\n" % (k, q[0, i], q[1, i], q[2, i]))

    n = len(stats)
    print("§2.3 / Fig. 2a: %s, %d-token prompt, %d generated tokens' queries: %d (layer, head, token)"
          % (m["model"], npr, ng, n))
    print("%-44s %10s %10s %10s" % ("measure", "q25", "median", "q75"))
    for key, what, fmt in (
            ("k90", "keys for 90% of the attention mass", "%10.0f"),
            ("k99", "keys for 99% of the attention mass", "%10.0f"),
            ("mass36", "attention mass of the top 36 keys", "%10.3f"),
            ("mass100", "attention mass of the top 100 keys", "%10.3f"),
            ("mass500", "attention mass of the top 500 keys", "%10.3f"),
            ("k_mse", "top-k for an output MSE below 1e-6", "%10.0f"),
            ("rel100", "output rel. error of the top 100 keys", "%10.2e"),
            ("mass_w", "attention mass of W (sink + window)", "%10.3f"),
            ("mass_w100", "attention mass of W + the rest's top 100", "%10.3f"),
            ("rel_w100", "output rel. error of W + the rest's top 100", "%10.2e")):
        qs = quartiles([s[key] for s in stats])
        print("%-44s " % what + " ".join(fmt % v for v in qs))
    qs = quartiles([s["kept100"] for s in stats if s["kept100"] >= 0])
    print("%-44s " % "top 100 kept from the previous token" + " ".join("%10.2f" % v for v in qs))
    share = np.mean([s["mse36_ok"] for s in stats])
    print("queries whose top 36 keys reach an MSE below 1e-6: %.1f%%" % (100 * share))


if __name__ == "__main__":
    main()
