/*
 * The positions of an erasure-coded PG's fragments (issue 33; docs/architecture.md
 * "Erasure-coded shards"). Replicas are a set, and their order may shift when a node leaves;
 * fragment f must stay on the node of position f, since a position that moves is a fragment to
 * rebuild. So each position draws its node on its own, as CRUSH's `indep` mode does:
 *
 * - position f's draw in round t is the top of a weighted rendezvous ranking (straw2: weight /
 *   -ln(u)) seeded by (PG, f + t * n), over every node of weight > 0 *whatever its state*;
 * - a draw that is out, already another position's node, or in a failure domain that already
 *   holds its share of the positions (one each while there are n domains or more, else
 *   ceil(n / domains)), is refused, and the position draws again in the next round.
 *
 * Because out nodes stay in every ranking, marking a node out changes no other position's first
 * draw; and the positions whose first draw is out draw again only after all the others have
 * settled, so they never take a node another position would have had: only the positions the
 * node held move (and a position that drew the same node first, or, with failure domains, one
 * whose domain's share changed). A node down keeps its positions: a hole that reads go around.
 * Adding a node moves the positions it now wins. Deterministic across machines: it depends on ids,
 * weights, domains and states only, with the placement code's portable logarithm.
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

size_t ts_map_ec_order(const struct ts_map *m, uint32_t pg, int *out, size_t n)
{
    uint32_t place = m ? ts_map_placement_pgs(m) : 0, pgp;
    size_t nel = 0, ndom = 0, cap, filled = 0;
    char first_out[TS_MAP_EC_MAX];

    if (!m || !out || !n || !m->n)
        return 0;
    pgp = place ? pg % place : pg;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = 0;
        if (!eligible(&m->nodes[i]))
            continue;
        nel++;
        while (j < i && !(eligible(&m->nodes[j]) && strcmp(ts_map_node_domain(&m->nodes[j]),
                                                           ts_map_node_domain(&m->nodes[i])) == 0))
            j++;
        ndom += j == i; /* the first eligible node of its domain */
    }
    n = n < nel ? n : nel;
    n = n < TS_MAP_EC_MAX ? n : TS_MAP_EC_MAX;
    if (!n)
        return 0;
    cap = (n + ndom - 1) / ndom; /* positions a domain may hold */
    for (size_t f = 0; f < n; f++) {
        int i = draw(m, pgp, (uint32_t)f);
        out[f] = -1;
        first_out[f] = i >= 0 && !eligible(&m->nodes[i]);
    }
    /* The positions whose first draw is not out settle first, as they would if that node were
     * up; those whose first draw is out draw again only then, so they never displace one. */
    for (int group = 0; group < 2 && filled < n; group++) {
        for (uint32_t t = 0; t < EC_ROUNDS && filled < n; t++) {
            for (size_t f = 0; f < n; f++) {
                int i;
                if (out[f] >= 0 || first_out[f] != group)
                    continue;
                i = draw(m, pgp, (uint32_t)(f + (size_t)t * n));
                if (i < 0 || !eligible(&m->nodes[i]) || taken(out, n, i) ||
                    in_domain(m, out, n, i) >= cap)
                    continue;
                out[f] = i;
                filled++;
            }
        }
    }
    /* Positions still open after every round (a map of few eligible nodes among many out
     * ones): the eligible nodes left, by id, the domain share kept where it can be. */
    for (int pass = 0; pass < 2 && filled < n; pass++) {
        for (size_t f = 0; f < n && filled < n; f++) {
            int best = -1;
            if (out[f] >= 0)
                continue;
            for (size_t i = 0; i < m->n; i++)
                if (eligible(&m->nodes[i]) && !taken(out, n, (int)i) &&
                    (pass || in_domain(m, out, n, (int)i) < cap) &&
                    (best < 0 || strcmp(m->nodes[i].id, m->nodes[best].id) < 0))
                    best = (int)i;
            if (best >= 0) {
                out[f] = best;
                filled++;
            }
        }
    }
    return n;
}
