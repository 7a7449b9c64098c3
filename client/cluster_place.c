/*
 * libtessera in cluster mode: placement and replica selection. The dataset's replica counts
 * (DATASET_STAT, cached per dataset), the replicas of a shard under the current map, and the
 * order in which a read tries them (a rotation spread by PG, shard and offset region and a
 * per-handle salt; with the handle's domain set, the replicas in that domain first; replicas
 * that failed a moment ago last).
 */
#include "cluster_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_map.h"

#define FAC "client"

/* ---- placement ------------------------------------------------------------------------------ */

/* What the placement memos hold (struct ts_cluster): a map, a name or a policy changed. */
void ts_cl_memo_forget(struct ts_cluster *cl)
{
    memset(cl->pg_memo, 0, sizeof(cl->pg_memo));
    memset(cl->lane_memo, 0, sizeof(cl->lane_memo));
}

void ts_cl_policy_forget(struct ts_cluster *cl, const char *name)
{
    ts_cl_memo_forget(cl);
    for (size_t i = 0; i < cl->npols; i++) {
        if (strcmp(cl->pols[i].name, name) == 0) {
            cl->pols[i] = cl->pols[--cl->npols];
            return;
        }
    }
}

int ts_cl_policy_keep(struct ts_cluster *cl, const char *name, const struct ts_dataset_policy *p)
{
    struct policy *v;

    ts_cl_policy_forget(cl, name);
    v = ts_grow(cl->pols, cl->npols, &cl->cappols, sizeof(*v), 8);
    if (!v)
        return TS_ENOMEM;
    cl->pols = v;
    snprintf(cl->pols[cl->npols].name, sizeof(cl->pols[0].name), "%s", name);
    cl->pols[cl->npols].core = p->core;
    cl->pols[cl->npols].fringe = p->fringe;
    cl->pols[cl->npols].ec_k = p->ec_k;
    cl->pols[cl->npols].ec_m = p->ec_m;
    cl->pols[cl->npols].ec_dropped = p->ec_dropped;
    cl->npols++;
    return 0;
}

/*
 * The dataset's replica counts: cached, else DATASET_STAT from the nodes in order[0..n) (the
 * PG's replicas: they have the dataset if anyone has), first answer wins.
 */
static int policy_get(struct ts_cluster *cl, const char *name, const int *order, size_t n,
                      unsigned *replicas)
{
    struct fan f = {.absent_last = 1}; /* the failures only */
    struct ts_dataset_info d;
    int rc;

    for (size_t i = 0; i < cl->npols; i++) {
        if (strcmp(cl->pols[i].name, name) == 0) {
            *replicas = (unsigned)cl->pols[i].core + cl->pols[i].fringe;
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++) {
        tessera_client *sub;
        size_t p;
        rc = ts_cl_node_peer(cl, cl->map, (size_t)order[i], &p);
        if (rc)
            return rc;
        rc = ts_cl_peer_conn(cl, p, 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, p, sub, ts_conn_dataset_policy(sub, name, &d), NULL, 0);
        if (!rc) {
            *replicas = (unsigned)d.policy.core + d.policy.fringe;
            return ts_cl_policy_keep(cl, name, &d.policy);
        }
        ts_cl_fan_fail(cl, &f, p, rc);
    }
    ts_cl_err(cl, "dataset %s: %s", name, f.why[0] ? f.why : "no node is up");
    return f.first ? f.first : TS_EUNAVAIL;
}

void ts_cl_order_forget(struct ts_cluster *cl)
{
    ts_cl_memo_forget(cl);
    free(cl->pg_ord);
    free(cl->pg_nord);
    cl->pg_ord = NULL;
    cl->pg_nord = NULL;
}

/* The first PG_ORD_MAX (at most) of PG pg's replica order under the current map, kept per PG
 * once computed; ts_map_pg_order gives the rest. */
static size_t pg_order(struct ts_cluster *cl, uint32_t pg, int *order)
{
    uint32_t npg = cl->map->pg_count;
    size_t k;

    if (pg >= npg)
        return ts_map_pg_order(cl->map, pg, order, PG_ORD_MAX);
    if (!cl->pg_nord) {
        cl->pg_nord = calloc(npg, 1);
        cl->pg_ord = malloc((size_t)npg * PG_ORD_MAX * sizeof(*cl->pg_ord));
        if (!cl->pg_nord || !cl->pg_ord) {
            ts_cl_order_forget(cl);
            return ts_map_pg_order(cl->map, pg, order, PG_ORD_MAX);
        }
    }
    if (cl->pg_nord[pg]) {
        k = cl->pg_nord[pg] - 1u;
        for (size_t i = 0; i < k; i++)
            order[i] = cl->pg_ord[(size_t)pg * PG_ORD_MAX + i];
        return k;
    }
    k = ts_map_pg_order(cl->map, pg, order, PG_ORD_MAX);
    for (size_t i = 0; i < k; i++)
        cl->pg_ord[(size_t)pg * PG_ORD_MAX + i] = (uint16_t)order[i];
    cl->pg_nord[pg] = (uint8_t)(k + 1);
    return k;
}

/* CRC32C of a dataset name: the last one's is kept (and its shards' PGs). */
static uint32_t name_crc(struct ts_cluster *cl, const char *name)
{
    if (strcmp(cl->crc_name, name) != 0 || !cl->crc_name[0]) {
        cl->name_crc = ts_crc32c(0, name, strlen(name));
        snprintf(cl->crc_name, sizeof(cl->crc_name), "%s", name);
        ts_cl_memo_forget(cl);
    }
    return cl->name_crc;
}

/* The PG of (name, shard) under the current map: ts_pg_of, once per shard while it is kept. */
static uint32_t pg_of(struct ts_cluster *cl, const char *name, uint32_t shard)
{
    uint32_t crc = name_crc(cl, name), pg;
    size_t i = shard % PG_MEMO;

    if (cl->pg_memo[i].pg1 && cl->pg_memo[i].shard == shard)
        return cl->pg_memo[i].pg1 - 1;
    pg = ts_pg_of_hashed(crc, shard, cl->map->pg_count);
    cl->pg_memo[i].shard = shard;
    cl->pg_memo[i].pg1 = pg + 1;
    return pg;
}

/*
 * The replicas of (name, shard) under the current map (core + fringe, and the extra ones of a
 * hot dataset): node indexes in order[], the count in *n (at least 1); *pg its PG.
 */
static int replicas(struct ts_cluster *cl, const char *name, uint32_t shard, int *order, size_t *n,
                    uint32_t *pg)
{
    unsigned want;
    size_t k;
    int rc;

    *pg = cl->map ? pg_of(cl, name, shard) : 0;
    k = pg_order(cl, *pg, order);
    if (k == 0) {
        ts_cl_err(cl, "no node is up in the cluster map (epoch %llu)",
                  (unsigned long long)cl->epoch);
        return TS_EUNAVAIL;
    }
    rc = policy_get(cl, name, order, k, &want);
    if (rc)
        return rc;
    want += ts_map_hot_extra(cl->map, name, *pg); /* a hot dataset's extra fringe replicas */
    if (k == PG_ORD_MAX && want > k)
        k = ts_map_pg_order(cl->map, *pg, order, MAX_REPLICAS);
    *n = TS_MAX(1u, TS_MIN((size_t)want, k));
    return 0;
}

/* ---- replica selection ------------------------------------------------------------------------
 */

void ts_cl_sel_init(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                    uint64_t off, int spread)
{
    uint64_t h = name_crc(cl, name);

    /* Field by field: a read of a small record would otherwise clear why[] every time. */
    s->ntried = 0;
    s->adopted = 0;
    s->rc = 0;
    s->why[0] = '\0';
    s->spread = spread;
    /* The same 64 MiB region of a shard goes to the same replica from this handle (its
     * cache stays warm); different handles start at different replicas. */
    s->start = (uint32_t)ts_cl_mix64(cl->salt ^ ts_cl_mix64(h << 32 ^ shard) ^ (off >> 26));
}

/* Node i of the map is in the handle's domain (tessera_opts.domain). */
static int node_local(const struct ts_cluster *cl, int i)
{
    return !strcmp(ts_map_node_domain(&cl->map->nodes[i]), cl->o->domain);
}

/*
 * The order in which a read tries replicas order[0..n): try[k] is the position in order[] of
 * the k-th. Spread: the rotation from s->start; else the primary first, in placement order.
 * With the handle's domain set, a spread read's replicas in that domain come first (rotated
 * among themselves from s->start: the handles and regions of a domain still spread over its
 * replicas), then the others in the rotation's order.
 */
static void sel_order(const struct ts_cluster *cl, const struct sel *s, const int *order, size_t n,
                      size_t *try)
{
    size_t loc[MAX_REPLICAS], nlocal = 0, m = 0;
    uint32_t local = 0; /* bit i: order[i] is local */

    _Static_assert(MAX_REPLICAS <= 32, "a replica's bit in local");
    if (s->spread && cl->o->domain && cl->o->domain[0])
        for (size_t i = 0; i < n; i++)
            if (node_local(cl, order[i])) {
                local |= 1u << i;
                loc[nlocal++] = i;
            }
    for (size_t k = 0; k < nlocal; k++)
        try[m++] = loc[(s->start + k) % nlocal];
    for (size_t k = 0; k < n; k++) {
        size_t i = s->spread ? (s->start + k) % n : k;
        if (!(local >> i & 1u))
            try[m++] = i;
    }
}

static int sel_tried(const struct sel *s, size_t p)
{
    for (size_t i = 0; i < s->ntried; i++)
        if (s->tried[i] == p)
            return 1;
    return 0;
}

/*
 * The next replica to read from and its connection: replicas not tried yet, from the
 * rotation's start, those that failed a moment ago last. Replicas that cannot be connected
 * to are skipped (and reported). When none is left: the read's error, with every failure
 * named in the router's message.
 */
int ts_cl_sel_next(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                   uint64_t off, size_t *out, tessera_client **sub)
{
    int order[MAX_REPLICAS];
    size_t n, p, try[MAX_REPLICAS];
    unsigned adopted;
    uint32_t pg;
    int rc;

again:
    adopted = s->adopted;
    rc = replicas(cl, name, shard, order, &n, &pg);
    if (rc)
        return rc;
    sel_order(cl, s, order, n, try);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < n; k++) {
            rc = ts_cl_node_peer(cl, cl->map, (size_t)order[try[k]], &p);
            if (rc)
                return rc;
            if (sel_tried(s, p) || ts_cl_recently_failed(&cl->peers[p]) != pass)
                continue;
            if (s->ntried < MAX_REPLICAS)
                s->tried[s->ntried++] = p;
            rc = ts_cl_peer_conn(cl, p, 0, sub);
            if (!rc) {
                *out = p;
                return 0;
            }
            ts_cl_sel_fail(cl, s, p, rc, ts_conn_error(cl->c), name, shard, off);
            if (s->adopted != adopted)
                goto again;
        }
    }
    if (!s->rc)
        s->rc = TS_EUNAVAIL;
    ts_cl_err(cl, "no replica of %s/%u could serve it (PG %u, map epoch %llu): %s", name, shard, pg,
              (unsigned long long)cl->epoch, s->why[0] ? s->why : "none is up");
    return s->rc;
}

/*
 * Replica p (connection sub) failed a call with rc: 1 when another replica should be tried
 * (ts_cl_sel_fail), else 0 with the replica's message in the router's.
 */
int ts_cl_sel_retry(struct ts_cluster *cl, struct sel *s, size_t p, tessera_client *sub, int rc,
                    const char *name, uint32_t shard, uint64_t off)
{
    char msg[512];

    snprintf(msg, sizeof(msg), "%s", ts_conn_error(sub));
    if (ts_cl_sel_fail(cl, s, p, rc, msg, name, shard, off))
        return 1;
    ts_cl_err(cl, "%s: %s", cl->peers[p].id, msg);
    return 0;
}

/* No peer is marked failed: replica choices are the plain rotation's (lanes may be kept). */
static int none_failed(const struct ts_cluster *cl)
{
    for (size_t i = 0; i < cl->npeers; i++)
        if (cl->peers[i].failed_ns)
            return 0;
    return 1;
}

/*
 * The lane of a read: the peer that serves it first (READVs are gathered per lane), or
 * SIZE_MAX to read it alone. Kept per (shard, region) while no peer is marked failed: a
 * lane only groups ranges, and a range its READV's node cannot serve is read again on its
 * own, so a kept lane is never wrong, at worst not the best.
 */
size_t ts_cl_read_lane(struct ts_cluster *cl, const char *name, uint32_t shard, uint64_t off)
{
    uint64_t region = off >> 26;
    size_t i = (shard * 7u + (size_t)region) % PG_MEMO, p;
    int keep = none_failed(cl);
    struct sel s;
    tessera_client *sub;

    name_crc(cl, name); /* a new name drops the memos */
    if (keep && cl->lane_memo[i].region1 == region + 1 && cl->lane_memo[i].shard == shard)
        return cl->lane_memo[i].lane;
    ts_cl_sel_init(cl, &s, name, shard, off, 1);
    if (ts_cl_sel_next(cl, &s, name, shard, off, &p, &sub) != 0)
        return SIZE_MAX;
    if (ts_conn_can_place(sub))
        p = SIZE_MAX; /* by RDMA: placed READs are better */
    if (keep && none_failed(cl)) {
        cl->lane_memo[i].region1 = region + 1;
        cl->lane_memo[i].shard = shard;
        cl->lane_memo[i].lane = p;
    }
    return p;
}
