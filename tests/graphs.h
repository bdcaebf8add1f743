/* tests/graphs.h - the tests' comparisons of indexes and decoding steps (test_blocks, test_cuda);
 * included after ra.c */
#ifndef GRAPHS_H
#define GRAPHS_H

/* two indexes with the same nodes, entry points and out- and in-links, in the same order */
static int same_graph(const RAIndex *x, const RAIndex *y) {
    if (x->n != y->n || x->M != y->M || x->entry != y->entry || x->n_entry != y->n_entry) return 0;
    if (x->n_entry && memcmp(x->entries, y->entries, (size_t)x->n_entry * sizeof *x->entries)) return 0;
    if (memcmp(x->deg, y->deg, (size_t)x->n * sizeof *x->deg) || memcmp(x->indeg, y->indeg, (size_t)x->n * sizeof *x->indeg)) return 0;
    for (int u = 0; u < x->n; u++)
        if (memcmp(x->adj + (size_t)u * x->M, y->adj + (size_t)u * y->M, (size_t)x->deg[u] * sizeof *x->adj)) return 0;
    return 1;
}

/* a copy of an index that grows on its own, by ra_insert (its look-ahead left out) */
static void copy_index(RAIndex *to, const RAIndex *ix, int d) {
    *to = *ix;
    to->ahead = NULL, to->ahead_nc = NULL, to->ahead0 = to->n_ahead = 0;   /* ra_insert's plain path */
    to->bt.d_keys = NULL;   /* --trace's, the original's */
    to->adj = malloc((size_t)ix->cap * ix->M * 4), to->deg = malloc((size_t)ix->cap * 4);
    to->indeg = malloc((size_t)ix->cap * 4), to->entries = malloc((size_t)ix->n_entry * 4);
    to->guide = malloc((size_t)ix->n_guide * d * 4 + 4), to->guide_thr = malloc((size_t)ix->n_guide * 4 + 4);
    to->guide_top = malloc((size_t)ix->n_guide * GUIDE_TOP * 4 + 4);
    memcpy(to->adj, ix->adj, (size_t)ix->cap * ix->M * 4), memcpy(to->deg, ix->deg, (size_t)ix->cap * 4);
    memcpy(to->indeg, ix->indeg, (size_t)ix->cap * 4), memcpy(to->entries, ix->entries, (size_t)ix->n_entry * 4);
    memcpy(to->guide, ix->guide, (size_t)ix->n_guide * d * 4), memcpy(to->guide_thr, ix->guide_thr, (size_t)ix->n_guide * 4);
    memcpy(to->guide_top, ix->guide_top, (size_t)ix->n_guide * GUIDE_TOP * 4);
}

/* The oracle's step of query head h (ra_step_head on its HeadStep) against the decoding step the
 * engine just took at pos0: *same 1 when Omega is the same (ids, order), *bits when the output
 * is; returns the output's relative error (NaN: worst). tr (or NULL): the oracle's trace. */
static double oracle_head(Attention *A, State *s, int layer, int pos0, int h, HeadStep *hs,
                          SearchScratch *scratch, StepTrace *tr, int *same, int *bits) {
    int hd = A->m->c.head_dim;
    HeadView hv = head_view(&(StepTask){A, s, layer, pos0, NULL}, h);
    int32_t omega[512];
    float out[HEAD_DIM_MAX];
    int n_omega = ra_step_head(&A->p, hs, hv.q, hv.K, hv.V, hd, pos0, omega, out, scratch, tr);
    *same = n_omega == A->n_omega[h] && !memcmp(omega, A->omega + (size_t)h * A->p.topk, (size_t)n_omega * 4);
    *bits = !memcmp(out, hv.out, (size_t)hd * 4);
    double num = 0, den = 0;
    for (int i = 0; i < hd; i++) num += (out[i] - hv.out[i]) * (out[i] - hv.out[i]), den += hv.out[i] * hv.out[i];
    double e = sqrt(num / (den > 0 ? den : 1));
    return e == e ? e : INFINITY;
}

#endif
