/*
 * The positions of an erasure-coded PG's fragments (issue 33; docs/architecture.md
 * "Erasure-coded shards"). Replicas are a set, and their order may shift when a node leaves;
 * fragment f must stay on the node of position f, since a position that moves is a fragment to
 * rebuild. So each position draws its node on its own, as CRUSH's `indep` mode does:
 *
 * - position f's draw in round t is the top of a weighted rendezvous ranking (straw2: weight /
 *   -ln(u)) seeded by (PG, f + t * n), over every node of weight > 0 *whatever its state*;
 * - a draw that is already another position's node, or in a failure domain that already holds
 *   its share of the positions (one each while there are n domains or more, else
 *   ceil(n / domains)), is refused, and the position draws again in the next round.
 *
 * The positions are first settled as if no node were out: the placement the PG has with every
 * node in. Then only the positions that landed on a node out draw again (refusing out nodes
 * too), around the others, which stay. So against that placement, the nodes out move exactly
 * the positions they held, and bringing them back moves them back. (With two nodes out, a
 * position redrawn for the first may move again when the second goes out: it is compared with
 * the placement with every node in, not with the one before.) A node down keeps its positions: a
 * hole that reads go around. Adding a node moves the positions it now wins. Deterministic across
 * machines: it depends on ids, weights, domains and states only, with the placement code's
 * portable logarithm.
 */
#include "map_internal.h"

#include <stdlib.h>
#include <string.h>

#define EC_ROUNDS 64
#define TS_MAP_EC_MAX 64 /* positions: K + M <= 40 */

/* Position draw r of PG pg: the node of largest straw2 score (ties by id), or -1. */
static int draw(const struct ts_map *m, uint32_t pg, uint32_t r)
{
    uint64_t seed = map_mix64(((uint64_t)pg << 32 | r) + 0x9e3779b97f4a7c15ull);
    double best = -1;
    int at = -1;

    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        uint64_t h;
        double u, score;
        if (nd->weight == 0)
            continue;
        h = map_mix64(map_str_key(nd->id) ^ seed);
        u = ((double)(h >> 12) + 0.5) * (1.0 / 4503599627370496.0); /* strictly inside (0,1) */
        score = (double)nd->weight / -map_det_ln(u);
        if (score > best || (score == best && at >= 0 && strcmp(nd->id, m->nodes[at].id) < 0)) {
            best = score;
            at = (int)i;
        }
    }
    return at;
}

static int eligible(const struct ts_map_node *nd)
{
    return nd->weight > 0 && nd->state != TS_NODE_OUT;
}

/* Whether node nd may hold a position: eligible, or, settling as if no node were out, any of
 * weight > 0. */
static int may_hold(const struct ts_map_node *nd, int as_if_in)
{
    return as_if_in ? nd->weight > 0 : eligible(nd);
}

/* How many of out[0..n) sit in node i's domain. */
static size_t in_domain(const struct ts_map *m, const int *out, size_t n, int i)
{
    const char *d = ts_map_node_domain(&m->nodes[i]);
    size_t k = 0;

    for (size_t f = 0; f < n; f++)
        k += out[f] >= 0 && strcmp(ts_map_node_domain(&m->nodes[out[f]]), d) == 0;
    return k;
}

static int taken(const int *out, size_t n, int i)
{
    for (size_t f = 0; f < n; f++)
        if (out[f] == i)
            return 1;
    return 0;
}

/* The nodes that may hold a position (*nodes) and their failure domains (*domains). */
static void count_nodes(const struct ts_map *m, int as_if_in, size_t *nodes, size_t *domains)
{
    *nodes = *domains = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = 0;
        if (!may_hold(&m->nodes[i], as_if_in))
            continue;
        (*nodes)++;
        while (j < i &&
               !(may_hold(&m->nodes[j], as_if_in) &&
                 strcmp(ts_map_node_domain(&m->nodes[j]), ts_map_node_domain(&m->nodes[i])) == 0))
            j++;
        *domains += j == i; /* the first such node of its domain */
    }
}

/* Rounds of draws for the open positions of out[0..n) (-1), each domain holding at most cap:
 * how many are filled after them. */
static size_t settle(const struct ts_map *m, uint32_t pgp, int *out, size_t n, size_t cap,
                     int as_if_in)
{
    size_t filled = 0;

    for (size_t f = 0; f < n; f++)
        filled += out[f] >= 0;
    for (uint32_t t = 0; t < EC_ROUNDS && filled < n; t++) {
        for (size_t f = 0; f < n; f++) {
            int i;
            if (out[f] >= 0)
                continue;
            i = draw(m, pgp, (uint32_t)(f + (size_t)t * n));
            if (i < 0 || !may_hold(&m->nodes[i], as_if_in) || taken(out, n, i) ||
                in_domain(m, out, n, i) >= cap)
                continue;
            out[f] = i;
            filled++;
        }
    }
    return filled;
}

/* Positions still open after every round (a map of few nodes that may hold one): the nodes
 * left, by id, the domain share kept where it can be. */
static void fill_rest(const struct ts_map *m, int *out, size_t n, size_t cap, int as_if_in)
{
    for (int pass = 0; pass < 2; pass++) {
        for (size_t f = 0; f < n; f++) {
            int best = -1;
            if (out[f] >= 0)
                continue;
            for (size_t i = 0; i < m->n; i++)
                if (may_hold(&m->nodes[i], as_if_in) && !taken(out, n, (int)i) &&
                    (pass || in_domain(m, out, n, (int)i) < cap) &&
                    (best < 0 || strcmp(m->nodes[i].id, m->nodes[best].id) < 0))
                    best = (int)i;
            out[f] = best;
        }
    }
}

size_t ts_map_ec_order(const struct ts_map *m, uint32_t pg, int *out, size_t n)
{
    uint32_t place = m ? ts_map_placement_pgs(m) : 0, pgp;
    size_t nel, ndom, all, alldom, cap;

    if (!m || !out || !n || !m->n)
        return 0;
    pgp = place ? pg % place : pg;
    count_nodes(m, 0, &nel, &ndom);
    count_nodes(m, 1, &all, &alldom);
    n = n < nel ? n : nel;
    n = n < TS_MAP_EC_MAX ? n : TS_MAP_EC_MAX;
    if (!n)
        return 0;
    for (size_t f = 0; f < n; f++)
        out[f] = -1;
    /* The whole placement as if no node were out; then the positions on nodes that are out
     * drawn again around the others. A domain's share only grows when its last node goes out,
     * so the positions kept stay within it. With no node out the second step finds nothing to
     * do. */
    cap = (n + alldom - 1) / alldom;
    if (settle(m, pgp, out, n, cap, 1) < n)
        fill_rest(m, out, n, cap, 1);
    for (size_t f = 0; f < n; f++)
        if (out[f] >= 0 && !eligible(&m->nodes[out[f]]))
            out[f] = -1;
    cap = (n + ndom - 1) / ndom;
    if (settle(m, pgp, out, n, cap, 0) < n)
        fill_rest(m, out, n, cap, 0);
    return n;
}
