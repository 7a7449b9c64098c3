/*
 * tessera CLI: the node commands (node add, drain, remove, weight, up, down, out). Each is a
 * map change made on a copy of the newest map the cluster has, checked, shown (which PGs change
 * replicas, which new replicas need a backfill), refused when some PG would be left with fewer
 * than min_core caught-up core replicas, and only then written and pushed (tessera map push:
 * one epoch more than any node has). --dry-run shows and changes nothing.
 *
 * Caught up: a PG's current core replica that is up, answers, and is not listed as lagging or
 * recovering by the PG's primary (its STATUS "replication.lag"), in a PG its primary does not
 * list as peering. A replica a change adds holds nothing yet: it is not caught up until its
 * backfill is done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ts_map.h"

#define MAX_RANK 16 /* replicas per PG looked at (core + fringe of the widest dataset) */
#define DEFAULT_RATE (100ull << 20) /* bytes/s the estimate assumes without --rate */

/* What the datasets ask of every PG: the widest replica set, core and min_core. */
struct need {
    unsigned width, core, min_core;
};

static int datasets_need(struct ctx *x, struct need *n)
{
    struct ts_dataset_info *ds = NULL;
    size_t nds = 0;
    int rc = tessera_dataset_list(x->c, &ds, &nds);

    n->width = n->core = n->min_core = 0;
    if (rc)
        return rc;
    for (size_t i = 0; i < nds; i++) {
        const struct ts_dataset_policy *p = &ds[i].policy;
        n->width = TS_MAX(n->width, (unsigned)(p->core + p->fringe));
        n->core = TS_MAX(n->core, (unsigned)p->core);
        n->min_core = TS_MAX(n->min_core, (unsigned)p->min_core);
    }
    tessera_buffer_free(ds);
    n->width = TS_MIN(TS_MAX(n->width, 1u), (unsigned)MAX_RANK);
    n->core = TS_MIN(TS_MAX(n->core, 1u), n->width);
    return 0;
}

/*
 * Bytes a change moves: for every shard of every dataset, the replicas (of the dataset's core +
 * fringe) the new map adds copy it in, the ones it drops no longer hold it. in[i] counts into
 * next's node i, out[i] out of cur's node i; the total is what has to be copied.
 */
static int bytes_moved(struct ctx *x, const struct ts_map *cur, const struct ts_map *next,
                       uint64_t *in, uint64_t *out, uint64_t *total)
{
    struct ts_dataset_info *ds = NULL;
    size_t nds = 0;
    int rc = tessera_dataset_list(x->c, &ds, &nds);

    *total = 0;
    for (size_t d = 0; !rc && d < nds; d++) {
        struct ts_shard_info *sh = NULL;
        size_t nsh = 0;
        size_t w = TS_MIN((size_t)ds[d].policy.core + ds[d].policy.fringe, (size_t)MAX_RANK);
        if (tessera_shard_list(x->c, ds[d].name, &sh, &nsh) != 0)
            continue; /* a dataset deleted meanwhile */
        for (size_t k = 0; k < nsh; k++) {
            uint32_t pg = ts_map_pg_of(cur, ds[d].name, sh[k].shard);
            int a[MAX_RANK], b[MAX_RANK];
            size_t na = ts_map_pg_order(cur, pg, a, w), nb = ts_map_pg_order(next, pg, b, w);
            for (size_t j = 0; j < nb; j++) {
                int c = ts_map_find(cur, next->nodes[b[j]].id);
                int had = 0;
                for (size_t i = 0; i < na && c >= 0; i++)
                    had |= a[i] == c;
                if (!had) {
                    in[b[j]] += sh[k].size;
                    *total += sh[k].size;
                }
            }
            for (size_t i = 0; i < na; i++) {
                int kept = 0;
                for (size_t j = 0; j < nb; j++)
                    kept |= !strcmp(next->nodes[b[j]].id, cur->nodes[a[i]].id);
                if (!kept)
                    out[a[i]] += sh[k].size;
            }
        }
        tessera_buffer_free(sh);
    }
    tessera_buffer_free(ds);
    return rc;
}

/* lagging[pg * nnodes + node]: the PG's primary says that replica is behind; peering[pg]. */
struct health {
    uint8_t *lagging, *peering, *silent; /* silent[node]: up in the map, did not answer */
    size_t nnodes;
};

static void health_free(struct health *h)
{
    free(h->lagging);
    free(h->peering);
    free(h->silent);
}

static int health_read(struct ctx *x, const struct ts_map *m, struct health *h)
{
    memset(h, 0, sizeof(*h));
    h->nnodes = m->n;
    h->lagging = calloc((size_t)m->pg_count * m->n, 1);
    h->peering = calloc(m->pg_count, 1);
    h->silent = calloc(m->n, 1);
    if (!h->lagging || !h->peering || !h->silent)
        return TS_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        struct json_object *doc, *rep, *arr;
        char *json = NULL;

        /* The handle's node of that id (m may be etcd's map, in another order; a call may
         * adopt a newer map, so it is looked up each time). */
        const struct ts_map *hm = ts_client_map(x->c);
        int ci = hm ? ts_map_find(hm, m->nodes[i].id) : -1;

        if (m->nodes[i].state != TS_NODE_UP)
            continue;
        if (ci < 0 || ts_client_node_status(x->c, (size_t)ci, &json) != 0 ||
            !(doc = json_tokener_parse(json))) {
            h->silent[i] = 1;
            tessera_buffer_free(json);
            continue;
        }
        tessera_buffer_free(json);
        if (json_object_object_get_ex(doc, "replication", &rep)) {
            if (json_object_object_get_ex(rep, "lag", &arr) &&
                json_object_is_type(arr, json_type_array))
                for (size_t k = 0; k < json_object_array_length(arr); k++) {
                    struct json_object *o = json_object_array_get_idx(arr, k), *v;
                    int node = json_object_object_get_ex(o, "node", &v)
                                   ? ts_map_find(m, json_object_get_string(v))
                                   : -1;
                    uint32_t pg = json_object_object_get_ex(o, "pg", &v)
                                      ? (uint32_t)json_object_get_int64(v)
                                      : UINT32_MAX;
                    if (node >= 0 && pg < m->pg_count)
                        h->lagging[(size_t)pg * m->n + (size_t)node] = 1;
                }
            if (json_object_object_get_ex(rep, "peering", &arr) &&
                json_object_is_type(arr, json_type_array))
                for (size_t k = 0; k < json_object_array_length(arr); k++) {
                    struct json_object *v;
                    if (json_object_object_get_ex(json_object_array_get_idx(arr, k), "pg", &v) &&
                        (uint64_t)json_object_get_int64(v) < m->pg_count)
                        h->peering[json_object_get_int64(v)] = 1;
                }
        }
        json_object_put(doc);
    }
    return 0;
}

/* The change a node command makes, on a copy of the map; 0 or TS_EINVAL (x->local says why). */
typedef int (*edit_fn)(struct ctx *x, struct ts_map *m);

static int find_node(struct ctx *x, const struct ts_map *m, const char *id)
{
    int i = ts_map_find(m, id);

    if (i < 0)
        snprintf(x->local, sizeof(x->local), "no node '%s' in the map (epoch %llu)", id,
                 (unsigned long long)m->epoch);
    return i;
}

static int set_state(struct ctx *x, struct ts_map *m, int state)
{
    int i = find_node(x, m, x->argv[0]);

    if (i < 0)
        return TS_EINVAL;
    if (m->nodes[i].state == state) {
        snprintf(x->local, sizeof(x->local), "node %s is %s already", x->argv[0],
                 ts_node_state_name(state));
        return TS_EINVAL;
    }
    m->nodes[i].state = state;
    return 0;
}

static int edit_up(struct ctx *x, struct ts_map *m)
{
    int i = find_node(x, m, x->argv[0]);

    /* Back from out or down: not while it holds replicas dropped that the cluster has tiered
     * otherwise since (their fragments may be gone). */
    if (i >= 0 && m->nodes[i].state != TS_NODE_UP && ts_client_node_tier_check(x->c, x->argv[0])) {
        snprintf(x->local, sizeof(x->local), "%s", tessera_client_error(x->c));
        return TS_EBUSY;
    }
    return set_state(x, m, TS_NODE_UP);
}

static int edit_down(struct ctx *x, struct ts_map *m)
{
    return set_state(x, m, TS_NODE_DOWN);
}

static int edit_out(struct ctx *x, struct ts_map *m)
{
    return set_state(x, m, TS_NODE_OUT);
}

static int edit_weight(struct ctx *x, struct ts_map *m)
{
    uint64_t w;
    int i = find_node(x, m, x->argv[0]);

    if (i < 0)
        return TS_EINVAL;
    if (cli_parse_uint(x->argv[1], 1000000, &w) != 0 || w == 0) {
        snprintf(x->local, sizeof(x->local), "weight '%s': want an integer from 1 to 1000000",
                 x->argv[1]);
        return TS_EINVAL;
    }
    m->nodes[i].weight = (uint32_t)w;
    return 0;
}

static int edit_remove(struct ctx *x, struct ts_map *m)
{
    int i = find_node(x, m, x->argv[0]);

    if (i < 0)
        return TS_EINVAL;
    if (m->nodes[i].state != TS_NODE_OUT) {
        snprintf(x->local, sizeof(x->local),
                 "node %s is %s: drain it first ('tessera node drain %s'), and remove it once "
                 "its PGs have moved",
                 x->argv[0], ts_node_state_name(m->nodes[i].state), x->argv[0]);
        return TS_EINVAL;
    }
    memmove(&m->nodes[i], &m->nodes[i + 1], (m->n - (size_t)i - 1) * sizeof(m->nodes[0]));
    m->n--;
    return 0;
}

static int edit_add(struct ctx *x, struct ts_map *m)
{
    struct ts_map_node *g, *nd;

    if (ts_map_find(m, x->argv[0]) >= 0) {
        snprintf(x->local, sizeof(x->local), "node '%s' is in the map already", x->argv[0]);
        return TS_EINVAL;
    }
    if (!x->tls_addr) {
        snprintf(x->local, sizeof(x->local),
                 "a cluster node needs --tls-addr HOST:PORT (nodes talk over mutual TLS)");
        return TS_EINVAL;
    }
    g = realloc(m->nodes, (m->n + 1) * sizeof(*g));
    if (!g)
        return TS_ENOMEM;
    m->nodes = g;
    nd = &m->nodes[m->n++];
    memset(nd, 0, sizeof(*nd));
    snprintf(nd->id, sizeof(nd->id), "%s", x->argv[0]);
    snprintf(nd->addr, sizeof(nd->addr), "%s", x->argv[1]);
    snprintf(nd->tls_addr, sizeof(nd->tls_addr), "%s", x->tls_addr);
    snprintf(nd->domain, sizeof(nd->domain), "%s", x->domain ? x->domain : "");
    nd->weight = x->weight ? (uint32_t)x->weight : 100;
    nd->state = TS_NODE_UP;
    return 0;
}

/* rebalance plan FILE: the nodes of the map in FILE (the epoch stays the cluster's). */
static int edit_from_file(struct ctx *x, struct ts_map *m)
{
    struct ts_map *f = NULL;
    char why[256] = "";

    if (ts_map_parse_file(x->argv[0], &f, why, sizeof(why)) != 0) {
        snprintf(x->local, sizeof(x->local), "%s", why); /* names the file */
        return TS_EINVAL;
    }
    if (f->pg_count != m->pg_count) {
        snprintf(x->local, sizeof(x->local),
                 "%s: pg_count %u differs from the cluster's %u (fixed for its life)", x->argv[0],
                 f->pg_count, m->pg_count);
        ts_map_free(f);
        return TS_EINVAL;
    }
    free(m->nodes);
    m->nodes = f->nodes;
    m->n = f->n;
    f->nodes = NULL;
    f->n = 0;
    ts_map_free(f);
    return 0;
}

/* The changed map passes the checks every node makes of a map (its wire form decoded back). */
static int map_valid(struct ctx *x, const struct ts_map *m)
{
    struct ts_map *back = NULL;
    struct ts_wr w;
    struct ts_rd r;
    int rc;

    ts_wr_init(&w);
    ts_map_encode(&w, m);
    ts_rd_init(&r, w.buf, w.len);
    rc = w.err ? TS_ENOMEM : ts_map_decode(&r, &back);
    ts_wr_fini(&w);
    ts_map_free(back);
    if (rc == TS_ENOMEM)
        return rc;
    if (rc) {
        snprintf(x->local, sizeof(x->local), "the changed map is not valid (%s)", ts_errname(rc));
        return TS_EINVAL;
    }
    return 0;
}

static int contains(const int *v, size_t n, int x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* One node command: edit a copy of the newest map, show the PGs it changes, refuse or push.
 * TS_ESTALE: the map changed under it (with --etcd: between reading and the compare-and-swap). */
static int node_change_once(struct ctx *x, const char *what, edit_fn edit)
{
    struct ts_map *cur = cli_map_base(x), *next = NULL;
    struct health h;
    struct need need;
    struct json_object *refused_js = NULL, *moves_js = NULL;
    uint32_t changed = 0, refused = 0, backfills = 0;
    uint32_t *in = NULL, *out = NULL;
    uint64_t *bin = NULL, *bout = NULL, bytes = 0, rate;
    char first_refused[160] = "";
    uint64_t epoch = 0;
    int rc;

    memset(&h, 0, sizeof(h));
    if (!cur)
        return x->local[0] ? TS_EINVAL : TS_ENOMEM;
    if (cur->move && !x->dry_run && edit != edit_up && edit != edit_down) {
        snprintf(x->local, sizeof(x->local),
                 "a rebalance is in progress (map epoch %llu): let it finish ('tessera rebalance "
                 "status') or roll it back first; only node up and down are taken meanwhile",
                 (unsigned long long)cur->epoch);
        rc = TS_EINVAL;
        goto out_free;
    }
    next = ts_map_dup(cur);
    if (!next) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    rc = edit(x, next);
    if (rc)
        goto out_free;
    rc = datasets_need(x, &need);
    if (rc)
        goto out_free;
    rc = health_read(x, cur, &h);
    if (rc)
        goto out_health;
    in = calloc(next->n, sizeof(*in));
    out = calloc(cur->n, sizeof(*out));
    if (!in || !out) {
        rc = TS_ENOMEM;
        goto out_health;
    }
    if (x->json) {
        refused_js = json_object_new_array();
        moves_js = json_object_new_array();
    }
    for (uint32_t pg = 0; pg < cur->pg_count; pg++) {
        int a[MAX_RANK], b[MAX_RANK];
        size_t na = ts_map_pg_order(cur, pg, a, need.width);
        size_t nb = ts_map_pg_order(next, pg, b, need.width);
        unsigned caught = 0;
        int same = na == nb;

        /* Compare by node id: indexes differ between the maps after add or remove. */
        int bcur[MAX_RANK];
        for (size_t k = 0; k < nb; k++)
            bcur[k] = ts_map_find(cur, next->nodes[b[k]].id);
        for (size_t k = 0; k < nb && same; k++)
            same = bcur[k] == a[k];
        for (size_t k = 0; k < TS_MIN(nb, (size_t)need.core); k++) {
            int c = bcur[k];
            if (c >= 0 && contains(a, TS_MIN(na, (size_t)need.core), c) && !h.silent[c] &&
                !h.lagging[(size_t)pg * cur->n + (size_t)c] && !h.peering[pg])
                caught++;
        }
        if (!same) {
            changed++;
            for (size_t k = 0; k < nb; k++)
                if (bcur[k] < 0 || !contains(a, na, bcur[k])) {
                    in[b[k]]++;
                    backfills++;
                }
            for (size_t k = 0; k < na; k++)
                if (!contains(bcur, nb, a[k]))
                    out[a[k]]++;
            if (moves_js) {
                struct json_object *o = json_object_new_object(), *f = json_object_new_array(),
                                   *t = json_object_new_array();
                for (size_t k = 0; k < na; k++)
                    json_object_array_add(f, json_object_new_string(cur->nodes[a[k]].id));
                for (size_t k = 0; k < nb; k++)
                    json_object_array_add(t, json_object_new_string(next->nodes[b[k]].id));
                json_object_object_add(o, "pg", json_u64(pg));
                json_object_object_add(o, "from", f);
                json_object_object_add(o, "to", t);
                json_object_array_add(moves_js, o);
            }
        }
        if (need.min_core && caught < need.min_core) {
            refused++;
            if (!first_refused[0])
                snprintf(first_refused, sizeof(first_refused),
                         "PG %u would keep %u caught-up core replica%s", pg, caught,
                         caught == 1 ? "" : "s");
            if (refused_js) {
                struct json_object *o = json_object_new_object();
                json_object_object_add(o, "pg", json_u64(pg));
                json_object_object_add(o, "caught_up", json_u64(caught));
                json_object_array_add(refused_js, o);
            }
        }
    }
    bin = calloc(next->n, sizeof(*bin));
    bout = calloc(cur->n, sizeof(*bout));
    if (!bin || !bout) {
        rc = TS_ENOMEM;
        goto out_health;
    }
    rc = bytes_moved(x, cur, next, bin, bout, &bytes);
    if (rc)
        goto out_health;
    rate = x->rate ? x->rate : DEFAULT_RATE;
    if (x->json) {
        struct json_object *o = json_object_new_object(), *nodes = json_object_new_array();
        json_object_object_add(o, "change", json_object_new_string(what));
        json_object_object_add(o, "epoch", json_u64(cur->epoch));
        json_object_object_add(o, "pgs", json_u64(cur->pg_count));
        json_object_object_add(o, "pgs_changing", json_u64(changed));
        json_object_object_add(o, "replicas_to_backfill", json_u64(backfills));
        json_object_object_add(o, "bytes_to_copy", json_u64(bytes));
        json_object_object_add(o, "estimated_s", json_object_new_double((double)bytes / rate));
        json_object_object_add(o, "rate_bytes_per_s", json_u64(rate));
        json_object_object_add(o, "min_core", json_u64(need.min_core));
        for (size_t i = 0; i < next->n; i++) {
            int c = ts_map_find(cur, next->nodes[i].id);
            struct json_object *n = json_object_new_object();
            json_object_object_add(n, "id", json_object_new_string(next->nodes[i].id));
            json_object_object_add(n, "replicas_in", json_u64(in[i]));
            json_object_object_add(n, "replicas_out", json_u64(c >= 0 ? out[c] : 0));
            json_object_object_add(n, "bytes_in", json_u64(bin[i]));
            json_object_object_add(n, "bytes_out", json_u64(c >= 0 ? bout[c] : 0));
            json_object_array_add(nodes, n);
        }
        json_object_object_add(o, "nodes", nodes);
        json_object_object_add(o, "moves", moves_js);
        json_object_object_add(o, "refused_pgs", refused_js);
        moves_js = refused_js = NULL;
        json_object_object_add(o, "dry_run", json_object_new_boolean(x->dry_run));
        json_object_object_add(o, "applied", json_object_new_boolean(!x->dry_run && !refused));
        if (refused || x->dry_run)
            json_print(o);
        else
            json_object_put(o); /* printed with the new epoch below */
    } else {
        printf("%s: map epoch %llu, %u of %u PGs change replicas, %u new replicas to backfill "
               "(widest dataset: %u replicas, %u core, min_core %u)\n",
               what, (unsigned long long)cur->epoch, changed, cur->pg_count, backfills, need.width,
               need.core, need.min_core);
        printf("bytes to copy: %llu, about %.1f s at %llu bytes/s\n", (unsigned long long)bytes,
               (double)bytes / rate, (unsigned long long)rate);
        for (size_t i = 0; i < next->n; i++) {
            int c = ts_map_find(cur, next->nodes[i].id);
            if (in[i] || (c >= 0 && out[c]))
                printf("  %-12s +%u -%u replicas, +%llu -%llu bytes\n", next->nodes[i].id, in[i],
                       c >= 0 ? out[c] : 0, (unsigned long long)bin[i],
                       (unsigned long long)(c >= 0 ? bout[c] : 0));
        }
        for (size_t i = 0; i < cur->n; i++)
            if (ts_map_find(next, cur->nodes[i].id) < 0 && out[i])
                printf("  %-12s +0 -%u replicas (removed)\n", cur->nodes[i].id, out[i]);
    }
    fflush(stdout); /* the plan before the verdict the caller prints on stderr */
    if (refused) {
        snprintf(x->local, sizeof(x->local),
                 "refused: %u PG%s would have fewer than min_core %u caught-up core replicas "
                 "(%s); nothing changed",
                 refused, refused == 1 ? "" : "s", need.min_core, first_refused);
        rc = TS_EINVAL;
        goto out_health;
    }
    if (x->dry_run) {
        if (!x->json)
            printf("dry run: nothing changed\n");
        goto out_health;
    }
    rc = map_valid(x, next);
    if (!rc)
        rc = cli_map_push(x, next, &epoch);
    if (rc)
        goto out_health;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "change", json_object_new_string(what));
        json_object_object_add(o, "applied", json_object_new_boolean(1));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "pgs_changing", json_u64(changed));
        json_object_object_add(o, "replicas_to_backfill", json_u64(backfills));
        json_print(o);
    } else {
        printf(x->etcd ? "applied: map epoch %llu stored in etcd (the nodes install it from "
                         "there)\n"
                       : "applied: map epoch %llu pushed to every node that is up\n",
               (unsigned long long)epoch);
        if (backfills)
            printf("the new replicas fill from their PGs' primaries; 'tessera status' shows "
                   "them as recovering until they hold everything\n");
    }
out_health:
    json_object_put(moves_js);
    json_object_put(refused_js);
    free(in);
    free(out);
    free(bin);
    free(bout);
    health_free(&h);
out_free:
    ts_map_free(next);
    ts_map_free(cur);
    return rc;
}

/* With --etcd, a change that lost the race is made again on the map that won (the plan is shown
 * again: it may differ), up to 5 times; without, the push itself takes the next epoch. */
static int node_change(struct ctx *x, const char *what, edit_fn edit)
{
    int rc = node_change_once(x, what, edit);

    for (int t = 1; t < 5 && rc == TS_ESTALE && x->etcd && !x->dry_run; t++) {
        fprintf(stderr, "tessera: %s: %s: planning again on the new map\n", what, x->local);
        x->local[0] = '\0';
        rc = node_change_once(x, what, edit);
    }
    return rc;
}

/* "node VERB ARGS..." as the change's name, then the change. */
static int node_cmd(struct ctx *x, const char *verb, edit_fn edit)
{
    char what[200];
    int n = snprintf(what, sizeof(what), "node %s", verb);

    for (int i = 0; i < x->argc && n > 0 && (size_t)n < sizeof(what); i++)
        n += snprintf(what + n, sizeof(what) - (size_t)n, " %s", x->argv[i]);
    return node_change(x, what, edit);
}

int cmd_node_add(struct ctx *x)
{
    return node_cmd(x, "add", edit_add);
}

int cmd_node_up(struct ctx *x)
{
    return node_cmd(x, "up", edit_up);
}

int cmd_node_down(struct ctx *x)
{
    return node_cmd(x, "down", edit_down);
}

int cmd_node_out(struct ctx *x)
{
    return node_cmd(x, "out", edit_out);
}

int cmd_node_drain(struct ctx *x) /* out, by its operator's name */
{
    return node_cmd(x, "drain", edit_out);
}

int cmd_node_remove(struct ctx *x)
{
    return node_cmd(x, "remove", edit_remove);
}

int cmd_rebalance_plan(struct ctx *x) /* shows only: applying is a map push today */
{
    x->dry_run = 1;
    return node_change(x, "rebalance plan", edit_from_file);
}

int cmd_node_weight(struct ctx *x)
{
    return node_cmd(x, "weight", edit_weight);
}
