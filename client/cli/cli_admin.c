/*
 * tessera CLI: the maintenance and cluster commands: scrub, map show, map push, failover and
 * pg (the `status` command is in cli_status.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"
#include "ts_map.h"

/* ---- scrub / status ----------------------------------------------------------------------------
 */

struct scrub_seen {
    struct json_object *list; /* --json */
    uint64_t n;
};

static void scrub_cb(void *arg, const char *dataset, uint32_t shard, uint32_t chunk, int code)
{
    struct scrub_seen *s = arg;

    s->n++;
    if (s->list) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(dataset));
        json_object_object_add(o, "shard", json_u64(shard));
        json_object_object_add(o, "chunk", json_u64(chunk));
        json_object_object_add(o, "code", json_object_new_string(ts_errname(code)));
        json_object_array_add(s->list, o);
    } else {
        printf("corrupt: dataset %s shard %u chunk %u: %s (%s)\n", dataset, shard, chunk,
               ts_strerror(code), ts_errname(code));
    }
}

int cmd_scrub(struct ctx *x)
{
    struct scrub_seen seen = {NULL, 0};
    struct ts_scrub_report rep;
    const char *name = x->argc > 0 ? x->argv[0] : NULL;
    int rc;

    if (x->json)
        seen.list = json_object_new_array();
    rc = tessera_scrub(x->c, name, &rep, scrub_cb, &seen);
    if (rc) {
        json_object_put(seen.list);
        return rc;
    }
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "shards", json_u64(rep.shards));
        json_object_object_add(o, "chunks", json_u64(rep.chunks));
        json_object_object_add(o, "bytes", json_u64(rep.bytes));
        json_object_object_add(o, "corrupt", json_u64(rep.corrupt));
        json_object_object_add(o, "corrupt_chunks", seen.list);
        json_object_object_add(o, "pgs_compared", json_u64(rep.pgs_compared));
        json_object_object_add(o, "pgs_differing", json_u64(rep.pgs_differing));
        json_object_object_add(o, "pgs_unchecked", json_u64(rep.pgs_unchecked));
        json_object_object_add(o, "missing_shards", json_u64(rep.missing));
        json_print(o);
    } else {
        char hs[32];
        printf("scrubbed %s: %llu shards, %llu chunks, %s: %llu corrupt%s\n",
               name ? name : "every dataset", (unsigned long long)rep.shards,
               (unsigned long long)rep.chunks, cli_human_size(rep.bytes, hs, sizeof(hs)),
               (unsigned long long)rep.corrupt, rep.corrupt > seen.n ? " (more than listed)" : "");
        if (rep.pgs_compared || rep.pgs_unchecked)
            printf("replicas against their primaries: %u PGs compared, %u short of their primary "
                   "(%llu shards missing, backfill started), %u not comparable now\n",
                   rep.pgs_compared, rep.pgs_differing, (unsigned long long)rep.missing,
                   rep.pgs_unchecked);
    }
    if (rep.corrupt) {
        snprintf(x->local, sizeof(x->local), "%llu corrupt chunk%s found",
                 (unsigned long long)rep.corrupt, rep.corrupt == 1 ? "" : "s");
        return TS_ECORRUPT;
    }
    if (rep.pgs_differing) {
        snprintf(x->local, sizeof(x->local),
                 "%u PG replica%s short of the primary (%llu shards missing; backfill started)",
                 rep.pgs_differing, rep.pgs_differing == 1 ? "" : "s",
                 (unsigned long long)rep.missing);
        return TS_ECORRUPT;
    }
    return 0;
}

/* ---- cluster commands ---------------------------------------------------------------------- */

/* The handle's cluster map, or a local error on a single node. */
static const struct ts_map *need_map(struct ctx *x)
{
    const struct ts_map *m = ts_client_map(x->c);

    if (!m)
        snprintf(x->local, sizeof(x->local),
                 "%s (node %s) has no cluster map: it runs as a single node", x->server,
                 tessera_client_node(x->c));
    return m;
}

static struct json_object *map_node_json(const struct ts_map_node *nd, unsigned primary_pgs)
{
    struct json_object *o = json_object_new_object();

    json_object_object_add(o, "id", json_object_new_string(nd->id));
    json_object_object_add(o, "addr", json_object_new_string(nd->addr));
    json_object_object_add(o, "tls_addr", json_object_new_string(nd->tls_addr));
    json_object_object_add(o, "domain", json_object_new_string(nd->domain));
    json_object_object_add(o, "weight", json_u64(nd->weight));
    json_object_object_add(o, "state", json_object_new_string(ts_node_state_name(nd->state)));
    json_object_object_add(o, "primary_pgs", json_u64(primary_pgs));
    return o;
}

int cli_map_push(struct ctx *x, const struct ts_map *m, uint64_t *epoch)
{
    char dir[] = "/tmp/tessera-map-XXXXXX", path[64];
    int rc;

    if (x->etcd)
        return cli_etcd_map_commit(x, m, m->epoch, epoch);

    if (!mkdtemp(dir))
        return TS_EIO;
    snprintf(path, sizeof(path), "%s/cluster.map", dir);
    rc = ts_map_write_file(m, path);
    if (rc == 0)
        rc = tessera_map_push_file(x->c, path, epoch);
    unlink(path);
    rmdir(dir);
    return rc;
}

struct ts_map *cli_map_base(struct ctx *x)
{
    const struct ts_map *m;

    if (x->etcd)
        return cli_etcd_map_get(x);
    ts_client_map_refresh(x->c); /* the newest map any node has: never build on an older one */
    m = need_map(x);
    return m ? ts_map_dup(m) : NULL;
}

int cmd_map_show(struct ctx *x)
{
    return map_print(x, ts_client_map(x->c));
}

int map_print(struct ctx *x, const struct ts_map *m)
{
    static const char *const hdr[] = {"ID",     "ADDR",  "TLS_ADDR",   "DOMAIN",
                                      "WEIGHT", "STATE", "PRIMARY_PGS"};
    unsigned *leads, count[3] = {0, 0, 0};
    struct cli_table t;
    int rc;

    if (!m) {
        if (x->json) {
            struct json_object *o = json_object_new_object();
            json_object_object_add(o, "epoch", json_u64(0));
            json_object_object_add(o, "pg_count", json_u64(0));
            json_object_object_add(o, "nodes", json_object_new_array());
            json_print(o);
        } else {
            printf("node %s has no cluster map (a single node, epoch 0)\n",
                   x->c ? tessera_client_node(x->c) : "-");
        }
        return 0;
    }
    leads = calloc(m->n, sizeof(*leads));
    if (!leads)
        return TS_ENOMEM;
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int first[1];
        if (ts_map_pg_order(m, pg, first, 1) == 1)
            leads[first[0]]++;
    }
    if (x->json) {
        struct json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "epoch", json_u64(m->epoch));
        json_object_object_add(o, "pg_count", json_u64(m->pg_count));
        for (size_t i = 0; i < m->n; i++)
            json_object_array_add(a, map_node_json(&m->nodes[i], leads[i]));
        json_object_object_add(o, "nodes", a);
        json_print(o);
        free(leads);
        return 0;
    }
    for (size_t i = 0; i < m->n; i++)
        if (m->nodes[i].state >= 0 && m->nodes[i].state <= 2)
            count[m->nodes[i].state]++;
    printf("epoch:    %llu\npg_count: %u\nnodes:    %zu (%u up, %u down, %u out)\n\n",
           (unsigned long long)m->epoch, m->pg_count, m->n, count[0], count[1], count[2]);
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x50, hdr);
    for (size_t i = 0; i < m->n && !rc; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        char weight[16], lead[16];
        const char *row[] = {nd->id,
                             nd->addr,
                             nd->tls_addr[0] ? nd->tls_addr : "-",
                             nd->domain[0] ? nd->domain : "-",
                             weight,
                             ts_node_state_name(nd->state),
                             lead};
        snprintf(weight, sizeof(weight), "%u", nd->weight);
        snprintf(lead, sizeof(lead), "%u", leads[i]);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
    free(leads);
    return rc;
}

/* `map push FILE` without -s: connect to the first node of the file that is up. */
void map_push_seed(struct ctx *x, const struct tessera_opts *o)
{
    static char addr[sizeof(((struct ts_map_node *)0)->addr)];
    struct ts_map *m = NULL;

    if (x->argc < 1 || ts_map_parse_file(x->argv[0], &m, NULL, 0) != 0)
        return; /* the push itself says what is wrong with the file */
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        if (nd->state != TS_NODE_UP)
            continue;
        snprintf(addr, sizeof(addr), "%s", o->tls_ca && nd->tls_addr[0] ? nd->tls_addr : nd->addr);
        x->server = addr;
        break;
    }
    ts_map_free(m);
}

int cmd_map_push(struct ctx *x)
{
    const char *file = x->argv[0];
    uint64_t epoch = 0;
    int rc;

    rc = tessera_map_push_file(x->c, file, &epoch);
    if (rc)
        return rc;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "file", json_object_new_string(file));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "note",
                               tessera_client_error(x->c)[0]
                                   ? json_object_new_string(tessera_client_error(x->c))
                                   : NULL);
        json_print(o);
    } else {
        printf("pushed map %s at epoch %llu\n", file, (unsigned long long)epoch);
        if (tessera_client_error(x->c)[0]) /* nodes that are not up and did not take it */
            fprintf(stderr, "tessera: map push: note: %s\n", tessera_client_error(x->c));
    }
    return 0;
}

/* failover with --etcd: the PG's primary in etcd's map marked down, by compare-and-swap over
 * that map (a change that lost the race is made again on the new one, up to 5 times). */
static int failover_etcd(struct ctx *x, uint32_t pg, char *old, char *now, uint64_t *epoch)
{
    int rc = TS_ESTALE;

    for (int t = 0; t < 5 && rc == TS_ESTALE; t++) {
        struct ts_map *m = cli_map_base(x);
        int first[1];
        if (!m)
            return TS_EINVAL;
        if (pg >= m->pg_count || ts_map_pg_order(m, pg, first, 1) != 1) {
            snprintf(x->local, sizeof(x->local), "PG %u has no primary in etcd's map (epoch %llu)",
                     pg, (unsigned long long)m->epoch);
            ts_map_free(m);
            return TS_EINVAL;
        }
        snprintf(old, 64, "%s", m->nodes[first[0]].id);
        m->nodes[first[0]].state = TS_NODE_DOWN;
        if (ts_map_pg_order(m, pg, first, 1) != 1) {
            snprintf(x->local, sizeof(x->local),
                     "refused: PG %u would have no primary without %s; nothing changed", pg, old);
            ts_map_free(m);
            return TS_EINVAL;
        }
        snprintf(now, 64, "%s", m->nodes[first[0]].id);
        x->local[0] = '\0';
        rc = cli_etcd_map_commit(x, m, m->epoch, epoch);
        ts_map_free(m);
        if (rc == TS_ESTALE)
            fprintf(stderr, "tessera: failover %u: %s: trying again on the new map\n", pg,
                    x->local);
    }
    return rc;
}

int cmd_failover(struct ctx *x)
{
    const struct ts_map *m = need_map(x);
    char old[64] = "?", now[64] = "?";
    uint64_t pg, epoch = 0;
    int first[1], rc;

    if (!m)
        return TS_EINVAL;
    (void)cli_parse_uint(x->argv[0], UINT32_MAX, &pg); /* checked with the arguments */
    if (x->etcd) {
        rc = failover_etcd(x, (uint32_t)pg, old, now, &epoch);
        if (rc)
            return rc;
    } else {
        if (ts_map_pg_order(m, (uint32_t)pg, first, 1) == 1)
            snprintf(old, sizeof(old), "%s", m->nodes[first[0]].id);
        rc = tessera_failover(x->c, (uint32_t)pg, &epoch);
        if (rc)
            return rc;
        m = ts_client_map(x->c);
        if (ts_map_pg_order(m, (uint32_t)pg, first, 1) == 1)
            snprintf(now, sizeof(now), "%s", m->nodes[first[0]].id);
    }
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "pg", json_u64(pg));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "old_primary", json_object_new_string(old));
        json_object_object_add(o, "new_primary", json_object_new_string(now));
        json_print(o);
    } else {
        printf("PG %llu: primary %s -> %s (%s marked down), map epoch %llu\n",
               (unsigned long long)pg, old, now, old, (unsigned long long)epoch);
    }
    return 0;
}

int cmd_pg(struct ctx *x)
{
    static const char *const hdr[] = {"RANK", "NODE", "ADDR", "DOMAIN", "ROLE"};
    const struct ts_map *m = need_map(x);
    struct ts_dataset_info d;
    struct cli_table t;
    int order[256], rc;
    unsigned core = 0, fringe = 0, hot = 0;
    uint64_t pg = 0;
    size_t n;

    if (!m)
        return TS_EINVAL;
    if (x->dataset) {
        rc = tessera_dataset_stat(x->c, x->dataset, &d);
        if (rc)
            return rc;
        core = d.policy.core;
        fringe = d.policy.fringe;
        m = ts_client_map(x->c); /* may have been refreshed */
    }
    if (x->argc > 0)
        (void)cli_parse_uint(x->argv[0], UINT32_MAX, &pg);
    else
        pg = ts_map_pg_of(m, x->dataset, (uint32_t)x->shard);
    if (pg >= m->pg_count) {
        snprintf(x->local, sizeof(x->local), "the cluster has PGs 0 to %u", m->pg_count - 1);
        return TS_EINVAL;
    }
    n = ts_map_pg_order(m, (uint32_t)pg, order, TS_ARRAY_SIZE(order));
    if (x->dataset)
        hot = ts_map_hot_extra(m, x->dataset, (uint32_t)pg); /* a hot dataset's extra fringe */
    if (x->json) {
        struct json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "pg", json_u64(pg));
        json_object_object_add(o, "epoch", json_u64(m->epoch));
        json_object_object_add(o, "dataset",
                               x->dataset ? json_object_new_string(x->dataset) : NULL);
        if (x->shard_set)
            json_object_object_add(o, "shard", json_u64(x->shard));
        for (size_t i = 0; i < n; i++) {
            struct json_object *e = json_object_new_object();
            const char *role = i == 0                            ? "primary"
                               : !x->dataset                     ? NULL
                               : i < core                        ? "core"
                               : i < (size_t)core + fringe       ? "fringe"
                               : i < (size_t)core + fringe + hot ? "fringe (hot)"
                                                                 : NULL;
            json_object_object_add(e, "rank", json_u64(i));
            json_object_object_add(e, "node", json_object_new_string(m->nodes[order[i]].id));
            json_object_object_add(e, "addr", json_object_new_string(m->nodes[order[i]].addr));
            json_object_object_add(e, "role", role ? json_object_new_string(role) : NULL);
            json_object_array_add(a, e);
        }
        json_object_object_add(o, "order", a);
        json_print(o);
        return 0;
    }
    printf("PG %llu, map epoch %llu", (unsigned long long)pg, (unsigned long long)m->epoch);
    if (x->dataset)
        printf(", dataset %s (core %u, fringe %u", x->dataset, core, fringe);
    if (x->dataset && hot)
        printf(", hot +%u", hot);
    if (x->dataset)
        printf(")");
    if (x->shard_set)
        printf(" shard %llu", (unsigned long long)x->shard);
    printf(": %zu node%s up\n", n, n == 1 ? "" : "s");
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x1, hdr);
    for (size_t i = 0; i < n && !rc; i++) {
        const struct ts_map_node *nd = &m->nodes[order[i]];
        char rank[24];
        const char *role = i == 0                            ? "primary"
                           : !x->dataset                     ? "-"
                           : i < core                        ? "core"
                           : i < (size_t)core + fringe       ? "fringe"
                           : i < (size_t)core + fringe + hot ? "fringe (hot)"
                                                             : "-";
        const char *row[] = {rank, nd->id, nd->addr, nd->domain[0] ? nd->domain : "-", role};
        snprintf(rank, sizeof(rank), "%zu", i);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
    if (!x->dataset)
        printf("(--dataset NAME shows which ranks are its core and fringe replicas)\n");
    return rc;
}
