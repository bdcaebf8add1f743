"""Reading recall-against-scan curves (tests/bench_index.sh, tests/bench_tune.sh).

A curve is a list of (scan, recall, param) points, one per beam width or nprobe, each the
mean over the sampled heads, sorted by scan. Between two points the scan is read on a log
scale. A benchmark helper: no assertions."""
import math
from collections import defaultdict


def mean_curves(rows):
    """{(method, kind): curve} from recall.csv rows (method,kind,layer,head,param,scan,recall)."""
    acc = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        a = acc[(r["method"], r["kind"], int(r["param"]))]
        a[0] += float(r["scan"]); a[1] += float(r["recall"]); a[2] += 1
    curves = defaultdict(list)
    for (m, k, p), (s, r, n) in acc.items():
        curves[(m, k)].append((s / n, r / n, p))
    for c in curves.values():
        c.sort()
    return curves


def lerp_log(x0, x1, t):   # between two scans, on a log scale
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def recall_at(c, s):
    """recall at scan s, or None below the smallest scan of the sweep"""
    if s < c[0][0]: return None
    for (s0, r0, _), (s1, r1, _) in zip(c, c[1:]):
        if s0 <= s <= s1:
            return r0 + (r1 - r0) * (math.log(s / s0) / math.log(s1 / s0) if s1 > s0 else 1)
    return c[-1][1]


def scan_at(c, target):
    """(scan, params) where the curve first reaches recall `target`: scan None if it never does;
    params (p, p) if the first point already does, else the two params it lies between"""
    if c[0][1] >= target: return c[0][0], (c[0][2], c[0][2])
    for (s0, r0, p0), (s1, r1, p1) in zip(c, c[1:]):
        if r0 < target <= r1:
            return lerp_log(s0, s1, (target - r0) / (r1 - r0)), (p0, p1)
    return None, (c[-1][2], c[-1][2])


def scan_for(c, target):
    """scan_at as text: '<=x%' when the first point already reaches it, '>x%' when none does"""
    s, _ = scan_at(c, target)
    if s is None: return ">%.0f%%" % (100 * c[-1][0])
    return ("<=%.1f%%" if c[0][1] >= target else "%.1f%%") % (100 * s)
