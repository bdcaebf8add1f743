#!/usr/bin/env python3
"""bench_index_faiss.py - the off-the-shelf peers of Fig. 2b and the distances of Fig. 2c
(§2.4 of the paper), on the queries and keys that ./ra --dump-qk DIR wrote.

Fig. 2b: Faiss IVF (IndexIVFFlat, inner product, 4 sqrt(n) lists, Faiss's default k-means) at
each nprobe, and Faiss HNSW (IndexHNSWFlat, M = 32, inner product, Faiss's default
efConstruction) at each efSearch, searched for the top-100 with the queries of the generated
tokens (Q->K) and with held-out keys (K->K). Keys, queries and ground truth are bench_index.c's:
Q->K indexes the keys of positions [sink, n_prompt - window) of the query head's KV head; K->K
the same less n_gen evenly spaced keys (at most a tenth), which are its queries; the exact
top-100 is read from bench_index's -g files when given (else computed here).
CSV rows on stdout (or -o): method,kind,layer,head,param,scan,recall with method faiss_ivf
(param nprobe) or faiss_hnsw (param efSearch); scan = distances Faiss computed (indexIVF_stats /
hnsw_stats .ndis; the IVF's centroid products are not counted, as ra_ivf does not count them)
/ (queries x keys indexed), recall = |found ∩ exact| / 100, averaged over the queries.

Fig. 2c: the Mahalanobis distance sqrt((x - mu)' S^-1 (x - mu)) of vectors x to the key
distribution: mu, S = mean and covariance of K->K's indexed keys (./ra's indexed keys less the
held-out ones). Sets: Q_decode (the generated tokens' queries: Q->K's queries), Q_prefill (up
to 5000 prefill queries: the paper samples 5000), K_holdout (K->K's queries), K_gen (the
generated tokens' keys). A vector drawn from the key distribution is at about sqrt(hd) (8 for
hd = 64).
Rows (--mahalanobis FILE): layer,head,set,n,mean,median.

  tests/bench_index_faiss.py DIR -p L:H,... [-g GTDIR] [-o CSV] [--mahalanobis CSV] [--qk-only] [--no-hnsw]
(--qk-only: Q->K only, as bench_index's, and no Fig. 2c, whose key statistics are K->K's keys;
--no-hnsw: IVF only. Both for long contexts, where an HNSW build on one thread takes minutes.)
Needs numpy and faiss-cpu (tests/bench_index.sh installs them into .venv).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

try:
    import faiss
except ImportError:
    sys.exit("bench_index_faiss: faiss is not installed (pip install faiss-cpu numpy)")

TOPK = 100


# ---------------------------------------------------------------------------
# The dump


def load_meta(d):
    with open(os.path.join(d, "meta.json")) as f:
        m = json.load(f)
    if m["n_prompt"] - m["sink"] - m["window"] < 2 * TOPK or m["n_gen"] < 1:
        sys.exit("bench_index_faiss: %s: too few keys outside sink + window, or no generated tokens" % d)
    return m


def rows(d, name, n, hd):
    x = np.fromfile(os.path.join(d, name), dtype="<f4")
    if x.size != n * hd:
        sys.exit("bench_index_faiss: %s: %d floats, want %d x %d" % (name, x.size, n, hd))
    return x.reshape(n, hd)


def load_pair(d, m, layer, head):
    """prefill queries, the generated tokens' keys, and per kind (keys indexed, queries), as
    bench_index: QK = ./ra's indexed keys and the generated tokens' queries; KK = those keys less
    n_gen evenly spaced ones (at most a tenth: key (2j+1) nk / 2nh), and the held-out keys"""
    hd, npr, ng = m["hd"], m["n_prompt"], m["n_gen"]
    kvh = head // (m["n_heads"] // m["n_kv"])   # GQA: query head h uses KV head h / group
    k = rows(d, "k_l%d_kv%d.f32" % (layer, kvh), npr + ng, hd)
    qp = rows(d, "q_l%d_h%d.f32" % (layer, head), npr, hd)
    qd = rows(d, "qd_l%d_h%d.f32" % (layer, head), ng, hd)
    keys = np.ascontiguousarray(k[m["sink"]:npr - m["window"]])
    nk = len(keys)
    nh = min(ng, nk // 10)
    held = [(2 * j + 1) * nk // (2 * nh) for j in range(nh)]
    rest = np.ascontiguousarray(np.delete(keys, held, axis=0))
    cases = {"QK": (keys, np.ascontiguousarray(qd)), "KK": (rest, np.ascontiguousarray(keys[held]))}
    return qp, np.ascontiguousarray(k[npr:]), cases


def exact_topk(q, keys, gt_dir, kind, layer, head):
    if gt_dir:
        path = os.path.join(gt_dir, "gt_%s_l%d_h%d.i32" % (kind, layer, head))
        if os.path.exists(path):
            return np.fromfile(path, dtype="<i4").reshape(len(q), TOPK)
    s = q.astype(np.float64) @ keys.astype(np.float64).T
    ids = np.arange(keys.shape[0])
    return np.stack([np.lexsort((ids, -row))[:TOPK] for row in s])   # best first, ties to the lower id


def recall(found, gt):
    return float(np.mean([len(np.intersect1d(f[f >= 0], g)) / TOPK for f, g in zip(found, gt)]))


# ---------------------------------------------------------------------------
# Fig. 2b: Faiss IVF and HNSW


def sweep_ivf(kind, keys, q, gt, nprobes, emit):
    n, d = keys.shape
    nlist = max(1, int(4 * math.sqrt(n)))   # as ./ra --attn ivf and bench_index's ra_ivf
    quant = faiss.IndexFlatIP(d)
    ix = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
    ix.cp.min_points_per_centroid = 1       # only silences Faiss's "too few points" warning
    ix.train(keys)
    ix.add(keys)
    for p in [p for p in nprobes if p < nlist] + [nlist]:
        ix.nprobe = p
        faiss.cvar.indexIVF_stats.reset()
        _, found = ix.search(q, TOPK)
        emit("faiss_ivf", kind, p, faiss.cvar.indexIVF_stats.ndis / (len(q) * n), recall(found, gt))
    return nlist


def sweep_hnsw(kind, keys, q, gt, efs, emit):
    n, d = keys.shape
    ix = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    ix.add(keys)
    for ef in efs:
        ix.hnsw.efSearch = ef
        faiss.cvar.hnsw_stats.reset()
        _, found = ix.search(q, TOPK)
        emit("faiss_hnsw", kind, ef, faiss.cvar.hnsw_stats.ndis / (len(q) * n), recall(found, gt))


# ---------------------------------------------------------------------------
# Fig. 2c: Mahalanobis distance to the key distribution


def mahalanobis(qp, kgen, cases, rng):
    base = cases["KK"][0].astype(np.float64)
    mu = base.mean(axis=0)
    cov = np.cov(base, rowvar=False)
    cov += np.eye(len(mu)) * 1e-6 * np.trace(cov) / len(mu)   # a whisker of ridge: S stays invertible
    inv = np.linalg.inv(cov)
    qps = qp[rng.permutation(len(qp))[:5000]]

    def dist(x):
        z = np.asarray(x, dtype=np.float64) - mu
        return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", z, inv, z), 0))

    return {"Q_decode": dist(cases["QK"][1]), "Q_prefill": dist(qps), "K_holdout": dist(cases["KK"][1]), "K_gen": dist(kgen)}


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("-p", "--pairs", required=True, help="layer:head,... (tests/bin/bench_index DIR --pairs)")
    ap.add_argument("-g", "--gt", help="bench_index's -g directory: the same exact top-100")
    ap.add_argument("-o", "--out", help="CSV file (default stdout)")
    ap.add_argument("--mahalanobis", help="CSV file for Fig. 2c's distances")
    ap.add_argument("--nprobe", default="1,2,4,8,16,32,64,128,256,512,1024")
    ap.add_argument("--ef", default="100,120,150,200,300,400,600,1000,1500,2000")
    ap.add_argument("--threads", type=int, default=1, help="Faiss threads (1: the same graph every run)")
    ap.add_argument("--qk-only", action="store_true", help="Q->K only (no K->K, no Mahalanobis)")
    ap.add_argument("--no-hnsw", action="store_true", help="IVF only")
    a = ap.parse_args()
    faiss.omp_set_num_threads(a.threads)
    m = load_meta(a.dir)
    pairs = [tuple(int(x) for x in p.split(":")) for p in a.pairs.split(",")]
    nprobes = [int(x) for x in a.nprobe.split(",")]
    efs = [int(x) for x in a.ef.split(",")]
    out = open(a.out, "w") if a.out else sys.stdout
    out.write("method,kind,layer,head,param,scan,recall\n")
    mah = open(a.mahalanobis, "w") if a.mahalanobis else None
    if mah:
        mah.write("layer,head,set,n,mean,median\n")
    rng = np.random.default_rng(1234)
    for layer, head in pairs:
        qp, kgen, cases = load_pair(a.dir, m, layer, head)

        def emit(method, kind, param, scan, rec):
            out.write("%s,%s,%d,%d,%d,%.6f,%.5f\n" % (method, kind, layer, head, param, scan, rec))

        for kind, (keys, q) in cases.items():
            if a.qk_only and kind != "QK":
                continue
            gt = exact_topk(q, keys, a.gt, kind, layer, head)
            sweep_ivf(kind, keys, q, gt, nprobes, emit)
            if not a.no_hnsw:
                sweep_hnsw(kind, keys, q, gt, efs, emit)
            out.flush()
        line = "bench_index_faiss: layer %d head %d: %d keys" % (layer, head, len(cases["QK"][0]))
        if mah and not a.qk_only:
            for name, dist in mahalanobis(qp, kgen, cases, rng).items():
                mah.write("%d,%d,%s,%d,%.3f,%.3f\n" % (layer, head, name, len(dist), dist.mean(), np.median(dist)))
            mah.flush()
            line += "; Mahalanobis done"
        print(line, file=sys.stderr)


if __name__ == "__main__":
    main()
