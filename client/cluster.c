/*
 * libtessera in cluster mode: the router.
 *
 * A handle opened on a node that has a cluster map becomes a router (api.c): it keeps the
 * map and sends every call to the nodes that hold its data, over sub-connections (plain
 * single-node connections, one per node) opened when first needed, with the same TLS options.
 *
 * The router sits between the public calls and the connection layer: api.c checks a call's
 * arguments and hands a router handle's call to its ts_cl_* function here; the router talks
 * to the nodes only through the connection layer's ts_conn_* calls (client_internal.h), never
 * through a public tessera_* call, so nothing below it calls back up.
 *
 * Placement (common/ts_map.h): shard -> PG by a stable hash, PG -> ordered replicas over the
 * nodes that are up (primary, other core replicas, fringe replicas). The dataset's policy
 * (DATASET_STAT, cached per dataset) says how many of them are replicas: the first `core`
 * are core replicas, the next `fringe` fringe replicas.
 *   - Writes (tessera_put*) go to the primary. An unreachable primary: the map is refreshed
 *     from the other nodes and the upload is retried once with the primary it names then.
 *   - Reads go to one of the core + fringe replicas, spread by (PG, shard, offset region) and
 *     a per-handle salt, those in the handle's domain (tessera_opts.domain) first; on
 *     TS_ECORRUPT, TS_ENOENT, TS_EINCOMPLETE, a timeout, a lost or refused connection (and the
 *     like: retryable()) the next replica is read, until every replica was tried. Every failed
 *     replica is logged, a corrupt one at error level.
 *   - Dataset calls fan out to every node (create, delete, seal) or aggregate over the nodes
 *     that are up (stat, list, shard list, scrub).
 * Epochs: every request carries the router's map epoch. A TS_ESTALE refusal carries the
 * node's map, and a reply with a higher epoch than ours makes us ask that node (MAP_GET):
 * the newer map is adopted and the call retried, at most MAX_TRIES times.
 *
 * This file holds the router's state and what every routed call stands on: the nodes we talk
 * to (peers) and their connections, the map (adopting a newer one), fan-outs over the nodes,
 * the bookkeeping of a replica that failed a read (ts_cl_sel_fail, and ts_cl_cop_collect: a
 * broken connection's submitted reads are collected before it is replaced), the router's
 * creation and release, and its epoch, timeout and map for api.c. The calls themselves are
 * in cluster_read.c, cluster_put.c, cluster_dataset.c and cluster_admin.c; placement and
 * replica selection in cluster_place.c.
 */
#include "cluster_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ts_map.h"

#define FAC "client"
#define PROBE_TIMEOUT_MS 2000          /* connect timeout towards a node the map says is not up */
#define FAILED_NS (5ull * 1000000000u) /* a node that just failed is tried last this long */

/* ---- small helpers ---------------------------------------------------------------------------
 */

void ts_cl_err(struct ts_cluster *cl, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    ts_conn_set_error(cl->c, "%s", buf);
}

/* Appends "; "-separated text to why[WHY_LEN]. */
void ts_cl_why_add(char *why, const char *fmt, ...)
{
    size_t off = strlen(why);
    va_list ap;

    if (off >= WHY_LEN - 8)
        return;
    if (off)
        off += (size_t)snprintf(why + off, WHY_LEN - off, "; ");
    va_start(ap, fmt);
    vsnprintf(why + off, WHY_LEN - off, fmt, ap);
    va_end(ap);
}

uint64_t ts_cl_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Failures after which another replica may well serve the read. */
static int retryable(int rc)
{
    switch (rc) {
    case TS_ECORRUPT:
    case TS_ENOENT:
    case TS_EINCOMPLETE:
    case TS_ETIMEDOUT:
    case TS_ECONNREFUSED:
    case TS_ECONNRESET:
    case TS_EIO:
    case TS_EPROTO:
    case TS_ESHUTDOWN:
    case TS_EBUSY:
    case TS_EDB:
    case TS_EFRAGMENTED: /* one that missed the drop still holds its bytes (issue 33) */
        return 1;
    default:
        return 0;
    }
}

/* The replica does not have the data (yet): weaker news than a failure. */
int ts_cl_absent(int rc)
{
    return rc == TS_ENOENT || rc == TS_EINCOMPLETE;
}

/* The connection to the node broke or never came up. */
int ts_cl_lost(int rc)
{
    return rc == TS_ECONNREFUSED || rc == TS_ECONNRESET || rc == TS_ETIMEDOUT || rc == TS_ESHUTDOWN;
}

/* ---- peers and their connections -------------------------------------------------------------
 */

static const char *node_addr(const struct ts_cluster *cl, const struct ts_map_node *nd)
{
    return cl->o->tls_ca && nd->tls_addr[0] ? nd->tls_addr : nd->addr;
}

static int peer_find(struct ts_cluster *cl, const char *id, const char *addr, size_t *out)
{
    struct peer *pe;

    for (size_t i = 0; i < cl->npeers; i++) {
        if (strcmp(cl->peers[i].id, id) == 0 && strcmp(cl->peers[i].addr, addr) == 0) {
            *out = i;
            return 0;
        }
    }
    pe = ts_grow(cl->peers, cl->npeers, &cl->cappeers, sizeof(*pe), 8);
    if (!pe)
        return TS_ENOMEM;
    cl->peers = pe;
    pe = &cl->peers[cl->npeers];
    memset(pe, 0, sizeof(*pe));
    snprintf(pe->id, sizeof(pe->id), "%s", id);
    snprintf(pe->addr, sizeof(pe->addr), "%s", addr);
    *out = cl->npeers++;
    return 0;
}

/* The peer of node i of map m. */
int ts_cl_node_peer(struct ts_cluster *cl, const struct ts_map *m, size_t i, size_t *out)
{
    return peer_find(cl, m->nodes[i].id, node_addr(cl, &m->nodes[i]), out);
}

int ts_cl_recently_failed(const struct peer *pe)
{
    return pe->failed_ns && ts_now_mono_ns() - pe->failed_ns < FAILED_NS;
}

/*
 * The connection to peer p, opened if needed. A node the map says is not up (probe), or one
 * that failed before and has not answered since, gets a short connect timeout: a dead host
 * must not stall a read that another replica can serve. A broken connection is replaced; the
 * submitted reads it carried are collected first (failed: their callers' waits move them to
 * another replica).
 */
int ts_cl_peer_conn(struct ts_cluster *cl, size_t p, int probe, tessera_client **out)
{
    struct tessera_opts o;
    tessera_client *sub;
    char err[256];
    int rc;

    *out = NULL;
    sub = cl->peers[p].conn;
    if (sub && ts_conn_broken(sub)) {
        for (size_t i = 0; i < cl->ncops && cl->peers[p].reads; i++)
            if (cl->cops[i]->inflight && cl->cops[i]->peer == p)
                ts_cl_cop_collect(cl, cl->cops[i]);
        ts_conn_close(sub);
        cl->peers[p].conn = NULL;
    }
    if (cl->peers[p].conn) {
        *out = cl->peers[p].conn;
        return 0;
    }
    /* Connecting may take a while (connect, TLS, HELLO) on a connection that has no hook yet:
     * the caller's deferred work (ts_client_batch) is done first. */
    if (cl->batch.on_block)
        cl->batch.on_block(cl->batch.arg);
    o = *cl->o;
    o.address = cl->peers[p].addr;
    o.timeout_ms = cl->timeout_ms;
    probe |= cl->peers[p].failed_ns != 0;
    if (probe && (o.timeout_ms < 0 || o.timeout_ms > PROBE_TIMEOUT_MS))
        o.timeout_ms = PROBE_TIMEOUT_MS;
    err[0] = '\0';
    if (cl->o->address && !strncmp(cl->o->address, "rdma://", 7) && !cl->peers[p].no_rdma) {
        /* An rdma:// handle reaches every node that serves RDMA by RDMA, the others (they
         * answer TS_ENOTSUP to the admission) over their TCP/TLS listener. */
        char rdma[160];
        snprintf(rdma, sizeof(rdma), "rdma://%s", cl->peers[p].addr);
        o.address = rdma;
        rc = ts_conn_open(&sub, &o, &cl->epoch, err, sizeof(err));
        if (rc == TS_ENOTSUP) {
            TS_INFO(FAC, "node %s (%s) serves no RDMA: reading it over %s", cl->peers[p].id,
                    cl->peers[p].addr, cl->o->tls_ca ? "TLS" : "TCP");
            cl->peers[p].no_rdma = 1;
            o.address = cl->peers[p].addr;
            err[0] = '\0';
            rc = ts_conn_open(&sub, &o, &cl->epoch, err, sizeof(err));
        }
    } else {
        rc = ts_conn_open(&sub, &o, &cl->epoch, err, sizeof(err));
    }
    if (rc) {
        cl->peers[p].failed_ns = ts_now_mono_ns();
        ts_cl_err(cl, "node %s (%s): %s", cl->peers[p].id, cl->peers[p].addr,
                  err[0] ? err : ts_strerror(rc));
        return rc;
    }
    ts_conn_set_timeout(sub, cl->timeout_ms);
    ts_conn_batch(sub, &cl->batch);
    cl->peers[p].failed_ns = 0;
    if (strcmp(ts_conn_node(sub), cl->peers[p].id) != 0)
        TS_WARN(FAC, 0, "%s answers as node '%s', the map says '%s'", cl->peers[p].addr,
                ts_conn_node(sub), cl->peers[p].id);
    cl->peers[p].conn = sub;
    *out = sub;
    return 0;
}

/* ---- the map -------------------------------------------------------------------------------- */

/* Takes m; adopts it when it is newer than ours. 1 when adopted. */
int ts_cl_adopt(struct ts_cluster *cl, struct ts_map *m)
{
    if (!m)
        return 0;
    if (m->epoch <= cl->epoch) {
        ts_map_free(m);
        return 0;
    }
    TS_INFO(FAC, "cluster map epoch %llu -> %llu (%zu nodes)", (unsigned long long)cl->epoch,
            (unsigned long long)m->epoch, m->n);
    ts_map_free(cl->map);
    cl->map = m;
    cl->epoch = m->epoch;
    ts_cl_order_forget(cl);
    return 1;
}

/*
 * After a call on peer p: adopts the map a TS_ESTALE reply carried, or asks the node for its
 * map when a reply carried a higher epoch than ours. Read the connection's message first:
 * this may send a request on it. 1 when a newer map was adopted.
 */
int ts_cl_check(struct ts_cluster *cl, size_t p)
{
    tessera_client *sub = cl->peers[p].conn;
    struct ts_map *m = NULL;
    uint64_t seen, e;
    int adopted;

    if (!sub)
        return 0;
    adopted = ts_cl_adopt(cl, ts_conn_take_stale_map(sub));
    seen = ts_conn_seen_epoch(sub);
    if (seen > cl->epoch && seen > cl->peers[p].checked_epoch && !ts_conn_broken(sub)) {
        cl->peers[p].checked_epoch = seen;
        if (ts_conn_map_get(sub, &m, &e) == 0)
            adopted |= ts_cl_adopt(cl, m);
    }
    return adopted;
}

/*
 * After a call on peer p's connection sub that returned rc: its message goes to msg[cap], or
 * with msg NULL a failure's message becomes the router's; then the node's map is looked at
 * (ts_cl_check). rc.
 */
int ts_cl_peer_done(struct ts_cluster *cl, size_t p, tessera_client *sub, int rc, char *msg,
                    size_t cap)
{
    if (msg)
        snprintf(msg, cap, "%s", ts_conn_error(sub));
    else if (rc)
        ts_cl_err(cl, "%s", ts_conn_error(sub));
    ts_cl_check(cl, p);
    return rc;
}

/*
 * Asks every node but peer `skip` for its map (up nodes, then down ones with a short connect
 * timeout; not those that failed a moment ago) and adopts the newest. 1 when one was newer.
 */
int ts_cl_refresh(struct ts_cluster *cl, size_t skip)
{
    size_t n = cl->map ? cl->map->n : 0, *peers, k = 0;
    int *probe, adopted = 0;

    peers = calloc(n ? n : 1, sizeof(*peers));
    probe = calloc(n ? n : 1, sizeof(*probe));
    if (!peers || !probe)
        goto out_free;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            int st = cl->map->nodes[i].state;
            if ((pass == 0) != (st == TS_NODE_UP) || st == TS_NODE_OUT)
                continue;
            if (ts_cl_node_peer(cl, cl->map, i, &peers[k]) == 0 && peers[k] != skip) {
                probe[k] = st != TS_NODE_UP;
                k++;
            }
        }
    for (size_t i = 0; i < k; i++) {
        tessera_client *sub;
        struct ts_map *m;
        uint64_t e;
        if (ts_cl_recently_failed(&cl->peers[peers[i]]) && !cl->peers[peers[i]].conn)
            continue;
        if (ts_cl_peer_conn(cl, peers[i], probe[i], &sub) != 0)
            continue;
        if (ts_conn_map_get(sub, &m, &e) == 0)
            adopted |= ts_cl_adopt(cl, m);
    }
out_free:
    free(peers);
    free(probe);
    return adopted;
}

void ts_cl_fan_end(struct fan *f)
{
    free(f->peers);
    free(f->states);
}

int ts_cl_fan_begin(struct ts_cluster *cl, struct fan *f, int with_down, int absent_last)
{
    size_t n = cl->map->n;

    memset(f, 0, sizeof(*f));
    f->absent_last = absent_last;
    f->peers = calloc(n, sizeof(*f->peers));
    f->states = calloc(n, sizeof(*f->states));
    if (!f->peers || !f->states) {
        ts_cl_fan_end(f);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int st = cl->map->nodes[i].state;
        if (st == TS_NODE_OUT || (st == TS_NODE_DOWN && !with_down))
            continue;
        if (ts_cl_node_peer(cl, cl->map, i, &f->peers[f->n]) != 0)
            continue;
        f->states[f->n++] = st;
    }
    return 0;
}

/* Peer p failed with rc, the router's message saying why. */
void ts_cl_fan_fail(struct ts_cluster *cl, struct fan *f, size_t p, int rc)
{
    if (!f->first || (f->absent_last && ts_cl_absent(f->first) && !ts_cl_absent(rc)))
        f->first = rc;
    ts_cl_why_add(f->why, "%s: %s", cl->peers[p].id, ts_conn_error(cl->c));
}

/* No node answered: every failure goes into the router's message; the code to return. */
int ts_cl_fan_none(struct ts_cluster *cl, const struct fan *f)
{
    ts_cl_err(cl, "%s", f->why[0] ? f->why : "no node is up");
    return f->first ? f->first : TS_EUNAVAIL;
}

/* ---- create / free -------------------------------------------------------------------------- */

int ts_cl_create(struct ts_cluster **out, tessera_client *router, tessera_client *seed,
                 struct ts_map *map, const struct tessera_opts *o)
{
    struct ts_cluster *cl;
    int i;

    *out = NULL;
    cl = calloc(1, sizeof(*cl));
    if (!cl) {
        ts_map_free(map);
        ts_conn_close(seed);
        return TS_ENOMEM;
    }
    cl->c = router;
    cl->o = o;
    cl->map = map;
    cl->epoch = map ? map->epoch : 0;
    cl->seed = NO_PEER;
    cl->served = NO_PEER;
    cl->next_op = 1;
    cl->timeout_ms = ts_conn_timeout(router);
    cl->salt = ts_cl_mix64(ts_now_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)cl);
    if (seed) {
        i = map ? ts_map_find(map, ts_conn_node(seed)) : -1;
        if (i >= 0 && ts_cl_node_peer(cl, map, (size_t)i, &cl->seed) == 0) {
            cl->peers[cl->seed].conn = seed;
            ts_conn_attach(seed, &cl->epoch);
        } else {
            TS_WARN(FAC, 0, "the node opened, '%s', is not in its own cluster map",
                    ts_conn_node(seed));
            ts_conn_close(seed);
        }
    }
    *out = cl;
    return 0;
}

void ts_cl_free(struct ts_cluster *cl)
{
    if (!cl)
        return;
    for (size_t i = 0; i < cl->npeers; i++)
        ts_conn_close(cl->peers[i].conn);
    for (size_t i = 0; i < cl->ncops; i++) {
        free(cl->cops[i]->msg);
        free(cl->cops[i]);
    }
    free(cl->cops);
    while (cl->free_cops) {
        struct cop *k = cl->free_cops;
        cl->free_cops = k->next_free;
        free(k);
    }
    free(cl->peers);
    free(cl->pols);
    ts_cl_order_forget(cl);
    ts_map_free(cl->map);
    free(cl);
}

uint64_t ts_cl_epoch(const struct ts_cluster *cl)
{
    return cl->epoch;
}

void ts_cl_set_timeout(struct ts_cluster *cl, int timeout_ms)
{
    cl->timeout_ms = timeout_ms;
    for (size_t i = 0; i < cl->npeers; i++)
        if (cl->peers[i].conn)
            ts_conn_set_timeout(cl->peers[i].conn, timeout_ms);
}

const struct ts_map *ts_cl_map(const struct ts_cluster *cl)
{
    return cl->map;
}

/* ---- a replica that failed a read ----------------------------------------------------------- */

/*
 * Replica p failed the read with rc (msg: why). Logs it, keeps it for the final report, adopts
 * a newer map if the node had one. 1 when another replica should be tried.
 */
int ts_cl_sel_fail(struct ts_cluster *cl, struct sel *s, size_t p, int rc, const char *msg,
                   const char *name, uint32_t shard, uint64_t off)
{
    struct peer *pe = &cl->peers[p];

    if (rc == TS_ECORRUPT)
        TS_ERROR(FAC, rc, "replica %s (%s) served corrupt data for %s/%u at offset %llu: %s",
                 pe->id, pe->addr, name, shard, (unsigned long long)off,
                 msg[0] ? msg : ts_strerror(rc));
    else if (ts_cl_absent(rc)) /* a fringe replica behind: to be expected */
        TS_INFO(FAC, "replica %s (%s) does not have %s/%u yet (%s): reading another", pe->id,
                pe->addr, name, shard, ts_errname(rc));
    else
        TS_WARN(FAC, rc, "replica %s (%s) failed a read of %s/%u at offset %llu: %s", pe->id,
                pe->addr, name, shard, (unsigned long long)off, msg[0] ? msg : ts_strerror(rc));
    if (ts_cl_lost(rc) || rc == TS_EIO)
        pe->failed_ns = ts_now_mono_ns();
    ts_cl_why_add(s->why, "%s: %s%s%s", pe->id, ts_errname(rc), msg[0] ? " " : "", msg);
    if (!s->rc || (ts_cl_absent(s->rc) && !ts_cl_absent(rc)))
        s->rc = rc;
    if (ts_cl_check(cl, p) && s->adopted < MAX_TRIES) {
        s->adopted++;
        s->ntried = 0; /* the replicas may have changed: start over under the new map */
        return 1;
    }
    return retryable(rc);
}

/* Collects in-flight read k from its replica (waits for it), noting whether another
 * replica should be asked. */
void ts_cl_cop_collect(struct ts_cluster *cl, struct cop *k)
{
    tessera_client *sub = cl->peers[k->peer].conn;
    const char *msg;

    k->rc = ts_conn_wait(sub, k->sub_op, &k->got);
    k->inflight = 0;
    cl->peers[k->peer].reads--;
    free(k->msg);
    k->msg = NULL;
    if (!k->rc) {
        ts_cl_check(cl, k->peer);
        return;
    }
    msg = ts_conn_error(sub);
    k->msg = malloc(strlen(msg) + sizeof(cl->peers[0].id) + 3);
    if (k->msg)
        sprintf(k->msg, "%s: %s", cl->peers[k->peer].id, msg);
    k->retry = ts_cl_sel_fail(cl, &k->sel, k->peer, k->rc, msg, k->name, k->shard, k->off);
    if (k->rv)
        k->retry = 0; /* a READV's ranges are read again one by one, by its caller */
}

void ts_cl_set_salt(struct ts_cluster *cl, uint64_t salt)
{
    cl->salt = salt;
}
