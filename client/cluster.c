/*
 * libtessera in cluster mode: the router.
 *
 * A handle opened on a node that has a cluster map becomes a router (client.c): it keeps the
 * map and sends every call to the nodes that hold its data, over sub-connections (plain
 * single-node handles, one per node) opened when first needed, with the same TLS options.
 *
 * Placement (common/ts_map.h): shard -> PG by a stable hash, PG -> ordered replicas over the
 * nodes that are up (primary, other core replicas, fringe replicas). The dataset's policy
 * (DATASET_STAT, cached per dataset) says how many of them are replicas: the first `core`
 * are core replicas, the next `fringe` fringe replicas.
 *   - Writes (tessera_put*) go to the primary. An unreachable primary: the map is refreshed
 *     from the other nodes and the upload is retried once with the primary it names then.
 *   - Reads go to one of the core + fringe replicas, spread by (PG, shard, offset region) and
 *     a per-handle salt; on TS_ECORRUPT, TS_ENOENT, TS_EINCOMPLETE, a timeout, a lost or
 *     refused connection (and the like: retryable()) the next replica is read, until every
 *     replica was tried. Every failed replica is logged, a corrupt one at error level.
 *   - Dataset calls fan out to every node (create, delete, seal) or aggregate over the nodes
 *     that are up (stat, list, shard list, scrub).
 * Epochs: every request carries the router's map epoch. A TS_ESTALE refusal carries the
 * node's map, and a reply with a higher epoch than ours makes us ask that node (MAP_GET):
 * the newer map is adopted and the call retried, at most MAX_TRIES times.
 */
#include "client_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ts_map.h"

#define FAC "client"
#define MAX_TRIES 3                    /* attempts of one call across map changes */
#define MAX_REPLICAS 32                /* of one PG that a read may try */
#define PROBE_TIMEOUT_MS 2000          /* connect timeout towards a node the map says is not up */
#define FAILED_NS (5ull * 1000000000u) /* a node that just failed is tried last this long */
#define WHY_LEN 1024
#define NO_PEER SIZE_MAX

/* A node we talk to, by id and address (a map change keeps its connection). */
struct peer {
    char id[64];
    char addr[128];
    tessera_client *conn;   /* NULL until first needed, or after it failed */
    uint64_t failed_ns;     /* when connecting to it or its connection last failed */
    uint64_t checked_epoch; /* the highest reply epoch we already asked it the map for */
    unsigned reads;         /* submitted reads in flight on conn */
};

struct policy {
    char name[TS_NAME_MAX + 1];
    uint8_t core, fringe;
};

/* Which replicas a read tried, and why they failed. */
struct sel {
    uint32_t start; /* rotation: which replica to try first */
    int spread;     /* 0: the primary first */
    size_t tried[MAX_REPLICAS];
    size_t ntried;
    unsigned adopted; /* newer maps adopted while the read went on */
    int rc;           /* what to report once no replica is left */
    char why[WHY_LEN];
};

/* A submitted read (tessera_read_submit) of the router. */
struct cop {
    uint64_t id;
    int inflight; /* on peers[peer] as sub_op; else finished with rc, got */
    int retry;    /* finished with a failure another replica may not have */
    size_t peer;
    uint64_t sub_op;
    int rc;
    size_t got;
    char *msg; /* the message of a failed read */
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t off;
    size_t len;
    void *buf;
    struct sel sel;
};

struct ts_cluster {
    tessera_client *c; /* the router: its message */
    struct ts_map *map;
    uint64_t epoch; /* map->epoch (0: no map); sub-connections' requests carry it */
    struct peer *peers;
    size_t npeers, cappeers;
    size_t seed; /* the peer the handle was opened on, or NO_PEER */
    struct policy *pols;
    size_t npols, cappols;
    struct cop **cops; /* by id */
    size_t ncops, capcops;
    uint64_t next_op;
    uint64_t salt;
    const struct tessera_opts *o; /* the router's options (strings owned by it) */
    int timeout_ms;
};

/* ---- small helpers ---------------------------------------------------------------------------
 */

static void cl_err(struct ts_cluster *cl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void cl_err(struct ts_cluster *cl, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    ts_client_set_error(cl->c, "%s", buf);
}

/* Appends "; "-separated text to why[WHY_LEN]. */
static void why_add(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void why_add(char *why, const char *fmt, ...)
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

static uint64_t mix64(uint64_t x)
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
        return 1;
    default:
        return 0;
    }
}

/* The replica does not have the data (yet): weaker news than a failure. */
static int absent(int rc)
{
    return rc == TS_ENOENT || rc == TS_EINCOMPLETE;
}

/* The connection to the node broke or never came up. */
static int lost(int rc)
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
static int node_peer(struct ts_cluster *cl, const struct ts_map *m, size_t i, size_t *out)
{
    return peer_find(cl, m->nodes[i].id, node_addr(cl, &m->nodes[i]), out);
}

static int recently_failed(const struct peer *pe)
{
    return pe->failed_ns && ts_now_mono_ns() - pe->failed_ns < FAILED_NS;
}

static void cop_collect(struct ts_cluster *cl, struct cop *k);

/*
 * The connection to peer p, opened if needed. A node the map says is not up (probe), or one
 * that failed before and has not answered since, gets a short connect timeout: a dead host
 * must not stall a read that another replica can serve. A broken connection is replaced; the
 * submitted reads it carried are collected first (failed: their callers' waits move them to
 * another replica).
 */
static int peer_conn(struct ts_cluster *cl, size_t p, int probe, tessera_client **out)
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
                cop_collect(cl, cl->cops[i]);
        tessera_client_close(sub);
        cl->peers[p].conn = NULL;
    }
    if (cl->peers[p].conn) {
        *out = cl->peers[p].conn;
        return 0;
    }
    o = *cl->o;
    o.address = cl->peers[p].addr;
    o.timeout_ms = cl->timeout_ms;
    probe |= cl->peers[p].failed_ns != 0;
    if (probe && (o.timeout_ms < 0 || o.timeout_ms > PROBE_TIMEOUT_MS))
        o.timeout_ms = PROBE_TIMEOUT_MS;
    err[0] = '\0';
    rc = ts_conn_open(&sub, &o, &cl->epoch, err, sizeof(err));
    if (rc) {
        cl->peers[p].failed_ns = ts_now_mono_ns();
        cl_err(cl, "node %s (%s): %s", cl->peers[p].id, cl->peers[p].addr,
               err[0] ? err : ts_strerror(rc));
        return rc;
    }
    ts_client_set_timeout(sub, cl->timeout_ms);
    cl->peers[p].failed_ns = 0;
    if (strcmp(tessera_client_node(sub), cl->peers[p].id) != 0)
        TS_WARN(FAC, 0, "%s answers as node '%s', the map says '%s'", cl->peers[p].addr,
                tessera_client_node(sub), cl->peers[p].id);
    cl->peers[p].conn = sub;
    *out = sub;
    return 0;
}

/* ---- the map -------------------------------------------------------------------------------- */

/* Takes m; adopts it when it is newer than ours. 1 when adopted. */
static int cl_adopt(struct ts_cluster *cl, struct ts_map *m)
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
    return 1;
}

/*
 * After a call on peer p: adopts the map a TS_ESTALE reply carried, or asks the node for its
 * map when a reply carried a higher epoch than ours. Read the connection's message first:
 * this may send a request on it. 1 when a newer map was adopted.
 */
static int cl_check(struct ts_cluster *cl, size_t p)
{
    tessera_client *sub = cl->peers[p].conn;
    struct ts_map *m = NULL;
    uint64_t seen, e;
    int adopted;

    if (!sub)
        return 0;
    adopted = cl_adopt(cl, ts_conn_take_stale_map(sub));
    seen = ts_conn_seen_epoch(sub);
    if (seen > cl->epoch && seen > cl->peers[p].checked_epoch && !ts_conn_broken(sub)) {
        cl->peers[p].checked_epoch = seen;
        if (ts_conn_map_get(sub, &m, &e) == 0)
            adopted |= cl_adopt(cl, m);
    }
    return adopted;
}

/*
 * After a call on peer p's connection sub that returned rc: its message goes to msg[cap], or
 * with msg NULL a failure's message becomes the router's; then the node's map is looked at
 * (cl_check). rc.
 */
static int peer_done(struct ts_cluster *cl, size_t p, tessera_client *sub, int rc, char *msg,
                     size_t cap)
{
    if (msg)
        snprintf(msg, cap, "%s", tessera_client_error(sub));
    else if (rc)
        cl_err(cl, "%s", tessera_client_error(sub));
    cl_check(cl, p);
    return rc;
}

/*
 * Asks every node but peer `skip` for its map (up nodes, then down ones with a short connect
 * timeout; not those that failed a moment ago) and adopts the newest. 1 when one was newer.
 */
static int cl_refresh(struct ts_cluster *cl, size_t skip)
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
            if (node_peer(cl, cl->map, i, &peers[k]) == 0 && peers[k] != skip) {
                probe[k] = st != TS_NODE_UP;
                k++;
            }
        }
    for (size_t i = 0; i < k; i++) {
        tessera_client *sub;
        struct ts_map *m;
        uint64_t e;
        if (recently_failed(&cl->peers[peers[i]]) && !cl->peers[peers[i]].conn)
            continue;
        if (peer_conn(cl, peers[i], probe[i], &sub) != 0)
            continue;
        if (ts_conn_map_get(sub, &m, &e) == 0)
            adopted |= cl_adopt(cl, m);
    }
out_free:
    free(peers);
    free(probe);
    return adopted;
}

/*
 * A fan-out: the nodes it goes to, from the map as it is now (every node that is up, and with
 * with_down those that are down too; never those that are out), and what failed on them.
 */
struct fan {
    size_t *peers; /* peer indexes */
    int *states;   /* their map states */
    size_t n;
    int absent_last;   /* a failure saying the data is absent gives way to another failure */
    int first;         /* the failure to report */
    char why[WHY_LEN]; /* every failure */
};

static void fan_end(struct fan *f)
{
    free(f->peers);
    free(f->states);
}

static int fan_begin(struct ts_cluster *cl, struct fan *f, int with_down, int absent_last)
{
    size_t n = cl->map->n;

    memset(f, 0, sizeof(*f));
    f->absent_last = absent_last;
    f->peers = calloc(n, sizeof(*f->peers));
    f->states = calloc(n, sizeof(*f->states));
    if (!f->peers || !f->states) {
        fan_end(f);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int st = cl->map->nodes[i].state;
        if (st == TS_NODE_OUT || (st == TS_NODE_DOWN && !with_down))
            continue;
        if (node_peer(cl, cl->map, i, &f->peers[f->n]) != 0)
            continue;
        f->states[f->n++] = st;
    }
    return 0;
}

/* Peer p failed with rc, the router's message saying why. */
static void fan_fail(struct ts_cluster *cl, struct fan *f, size_t p, int rc)
{
    if (!f->first || (f->absent_last && absent(f->first) && !absent(rc)))
        f->first = rc;
    why_add(f->why, "%s: %s", cl->peers[p].id, tessera_client_error(cl->c));
}

/* No node answered: every failure goes into the router's message; the code to return. */
static int fan_none(struct ts_cluster *cl, const struct fan *f)
{
    cl_err(cl, "%s", f->why[0] ? f->why : "no node is up");
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
        tessera_client_close(seed);
        return TS_ENOMEM;
    }
    cl->c = router;
    cl->o = o;
    cl->map = map;
    cl->epoch = map ? map->epoch : 0;
    cl->seed = NO_PEER;
    cl->next_op = 1;
    cl->timeout_ms = ts_client_timeout(router);
    cl->salt = mix64(ts_now_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)cl);
    if (seed) {
        i = map ? ts_map_find(map, tessera_client_node(seed)) : -1;
        if (i >= 0 && node_peer(cl, map, (size_t)i, &cl->seed) == 0) {
            cl->peers[cl->seed].conn = seed;
            ts_conn_attach(seed, &cl->epoch);
        } else {
            TS_WARN(FAC, 0, "the node opened, '%s', is not in its own cluster map",
                    tessera_client_node(seed));
            tessera_client_close(seed);
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
        tessera_client_close(cl->peers[i].conn);
    for (size_t i = 0; i < cl->ncops; i++) {
        free(cl->cops[i]->msg);
        free(cl->cops[i]);
    }
    free(cl->cops);
    free(cl->peers);
    free(cl->pols);
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
            ts_client_set_timeout(cl->peers[i].conn, timeout_ms);
}

const struct ts_map *ts_client_map(const tessera_client *c)
{
    struct ts_cluster *cl = ts_client_cluster(c);

    return cl ? cl->map : NULL;
}

/* ---- placement ------------------------------------------------------------------------------ */

static void policy_forget(struct ts_cluster *cl, const char *name)
{
    for (size_t i = 0; i < cl->npols; i++) {
        if (strcmp(cl->pols[i].name, name) == 0) {
            cl->pols[i] = cl->pols[--cl->npols];
            return;
        }
    }
}

static int policy_keep(struct ts_cluster *cl, const char *name, const struct ts_dataset_policy *p)
{
    struct policy *v;

    policy_forget(cl, name);
    v = ts_grow(cl->pols, cl->npols, &cl->cappols, sizeof(*v), 8);
    if (!v)
        return TS_ENOMEM;
    cl->pols = v;
    snprintf(cl->pols[cl->npols].name, sizeof(cl->pols[0].name), "%s", name);
    cl->pols[cl->npols].core = p->core;
    cl->pols[cl->npols].fringe = p->fringe;
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
        rc = node_peer(cl, cl->map, (size_t)order[i], &p);
        if (rc)
            return rc;
        rc = peer_conn(cl, p, 0, &sub);
        if (!rc)
            rc = peer_done(cl, p, sub, tessera_dataset_stat(sub, name, &d), NULL, 0);
        if (!rc) {
            *replicas = (unsigned)d.policy.core + d.policy.fringe;
            return policy_keep(cl, name, &d.policy);
        }
        fan_fail(cl, &f, p, rc);
    }
    cl_err(cl, "dataset %s: %s", name, f.why[0] ? f.why : "no node is up");
    return f.first ? f.first : TS_EUNAVAIL;
}

/*
 * The replicas of (name, shard) under the current map: node indexes in order[], the count
 * in *n (at least 1); *pg its PG.
 */
static int replicas(struct ts_cluster *cl, const char *name, uint32_t shard, int *order, size_t *n,
                    uint32_t *pg)
{
    unsigned want;
    size_t k;
    int rc;

    *pg = ts_map_pg_of(cl->map, name, shard);
    k = ts_map_pg_order(cl->map, *pg, order, MAX_REPLICAS);
    if (k == 0) {
        cl_err(cl, "no node is up in the cluster map (epoch %llu)", (unsigned long long)cl->epoch);
        return TS_EUNAVAIL;
    }
    rc = policy_get(cl, name, order, k, &want);
    if (rc)
        return rc;
    *n = TS_MAX(1u, TS_MIN((size_t)want, k));
    return 0;
}

/* ---- replica selection ------------------------------------------------------------------------
 */

static void sel_init(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                     uint64_t off, int spread)
{
    uint64_t h = ts_crc32c(0, name, strlen(name));

    memset(s, 0, sizeof(*s));
    s->spread = spread;
    /* The same 64 MiB region of a shard goes to the same replica from this handle (its
     * cache stays warm); different handles start at different replicas. */
    s->start = (uint32_t)mix64(cl->salt ^ mix64(h << 32 ^ shard) ^ (off >> 26));
}

static int sel_tried(const struct sel *s, size_t p)
{
    for (size_t i = 0; i < s->ntried; i++)
        if (s->tried[i] == p)
            return 1;
    return 0;
}

/*
 * Replica p failed the read with rc (msg: why). Logs it, keeps it for the final report, adopts
 * a newer map if the node had one. 1 when another replica should be tried.
 */
static int sel_fail(struct ts_cluster *cl, struct sel *s, size_t p, int rc, const char *msg,
                    const char *name, uint32_t shard, uint64_t off)
{
    struct peer *pe = &cl->peers[p];

    if (rc == TS_ECORRUPT)
        TS_ERROR(FAC, rc, "replica %s (%s) served corrupt data for %s/%u at offset %llu: %s",
                 pe->id, pe->addr, name, shard, (unsigned long long)off,
                 msg[0] ? msg : ts_strerror(rc));
    else if (absent(rc)) /* a fringe replica behind: to be expected */
        TS_INFO(FAC, "replica %s (%s) does not have %s/%u yet (%s): reading another", pe->id,
                pe->addr, name, shard, ts_errname(rc));
    else
        TS_WARN(FAC, rc, "replica %s (%s) failed a read of %s/%u at offset %llu: %s", pe->id,
                pe->addr, name, shard, (unsigned long long)off, msg[0] ? msg : ts_strerror(rc));
    if (lost(rc) || rc == TS_EIO)
        pe->failed_ns = ts_now_mono_ns();
    why_add(s->why, "%s: %s%s%s", pe->id, ts_errname(rc), msg[0] ? " " : "", msg);
    if (!s->rc || (absent(s->rc) && !absent(rc)))
        s->rc = rc;
    if (cl_check(cl, p) && s->adopted < MAX_TRIES) {
        s->adopted++;
        s->ntried = 0; /* the replicas may have changed: start over under the new map */
        return 1;
    }
    return retryable(rc);
}

/*
 * The next replica to read from and its connection: replicas not tried yet, from the
 * rotation's start, those that failed a moment ago last. Replicas that cannot be connected
 * to are skipped (and reported). When none is left: the read's error, with every failure
 * named in the router's message.
 */
static int sel_next(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                    uint64_t off, size_t *out, tessera_client **sub)
{
    int order[MAX_REPLICAS];
    size_t n, p;
    unsigned adopted;
    uint32_t pg;
    int rc;

again:
    adopted = s->adopted;
    rc = replicas(cl, name, shard, order, &n, &pg);
    if (rc)
        return rc;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < n; k++) {
            size_t i = s->spread ? (s->start + k) % n : k;
            rc = node_peer(cl, cl->map, (size_t)order[i], &p);
            if (rc)
                return rc;
            if (sel_tried(s, p) || recently_failed(&cl->peers[p]) != pass)
                continue;
            if (s->ntried < MAX_REPLICAS)
                s->tried[s->ntried++] = p;
            rc = peer_conn(cl, p, 0, sub);
            if (!rc) {
                *out = p;
                return 0;
            }
            sel_fail(cl, s, p, rc, tessera_client_error(cl->c), name, shard, off);
            if (s->adopted != adopted)
                goto again;
        }
    }
    if (!s->rc)
        s->rc = TS_EUNAVAIL;
    cl_err(cl, "no replica of %s/%u could serve it (PG %u, map epoch %llu): %s", name, shard, pg,
           (unsigned long long)cl->epoch, s->why[0] ? s->why : "none is up");
    return s->rc;
}

/*
 * Replica p (connection sub) failed a call with rc: 1 when another replica should be tried
 * (sel_fail), else 0 with the replica's message in the router's.
 */
static int sel_retry(struct ts_cluster *cl, struct sel *s, size_t p, tessera_client *sub, int rc,
                     const char *name, uint32_t shard, uint64_t off)
{
    char msg[512];

    snprintf(msg, sizeof(msg), "%s", tessera_client_error(sub));
    if (sel_fail(cl, s, p, rc, msg, name, shard, off))
        return 1;
    cl_err(cl, "%s: %s", cl->peers[p].id, msg);
    return 0;
}

/* ---- reads ---------------------------------------------------------------------------------- */

int ts_cl_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
               uint64_t off, size_t len, void *buf, size_t *out_len)
{
    struct sel s;
    tessera_client *sub;
    size_t p;
    int rc;

    sel_init(cl, &s, name, shard, off, 1);
    for (;;) {
        rc = sel_next(cl, &s, name, shard, off, &p, &sub);
        if (rc)
            return rc;
        rc = tessera_read(sub, name, shard, off, len, buf, out_len);
        if (!rc) {
            cl_check(cl, p);
            return 0;
        }
        if (!sel_retry(cl, &s, p, sub, rc, name, shard, off))
            return rc;
    }
}

static struct cop *cop_find(struct ts_cluster *cl, uint64_t id, size_t *at)
{
    size_t lo = 0, hi = cl->ncops;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cl->cops[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < cl->ncops && cl->cops[lo]->id == id) {
        *at = lo;
        return cl->cops[lo];
    }
    return NULL;
}

static void cop_remove(struct ts_cluster *cl, size_t at)
{
    struct cop *k = cl->cops[at];

    memmove(&cl->cops[at], &cl->cops[at + 1], (cl->ncops - at - 1) * sizeof(cl->cops[0]));
    cl->ncops--;
    free(k->msg);
    free(k);
}

/* Sends read k to the next replica that takes it; else k's final error. */
static int cop_submit(struct ts_cluster *cl, struct cop *k)
{
    tessera_client *sub;
    size_t p;
    int rc;

    for (;;) {
        rc = sel_next(cl, &k->sel, k->name, k->shard, k->off, &p, &sub);
        if (rc)
            return rc;
        rc = tessera_read_submit(sub, k->name, k->shard, k->off, k->len, k->buf, &k->sub_op);
        if (!rc) {
            k->inflight = 1;
            k->retry = 0;
            k->peer = p;
            cl->peers[p].reads++;
            return 0;
        }
        if (!sel_retry(cl, &k->sel, p, sub, rc, k->name, k->shard, k->off))
            return rc;
    }
}

/* Collects in-flight read k from its replica (waits for it), noting whether another
 * replica should be asked. */
static void cop_collect(struct ts_cluster *cl, struct cop *k)
{
    tessera_client *sub = cl->peers[k->peer].conn;
    const char *msg;

    k->rc = tessera_wait(sub, k->sub_op, &k->got);
    k->inflight = 0;
    cl->peers[k->peer].reads--;
    free(k->msg);
    k->msg = NULL;
    if (!k->rc) {
        cl_check(cl, k->peer);
        return;
    }
    msg = tessera_client_error(sub);
    k->msg = malloc(strlen(msg) + sizeof(cl->peers[0].id) + 3);
    if (k->msg)
        sprintf(k->msg, "%s: %s", cl->peers[k->peer].id, msg);
    k->retry = sel_fail(cl, &k->sel, k->peer, k->rc, msg, k->name, k->shard, k->off);
}

/* A finished read k: resubmitted to another replica if it should be (0), else final (1). */
static int cop_settle(struct ts_cluster *cl, struct cop *k)
{
    int rc;

    if (k->inflight)
        return 0;
    if (!k->rc || !k->retry)
        return 1;
    rc = cop_submit(cl, k);
    if (!rc)
        return 0;
    k->rc = rc;
    k->retry = 0;
    free(k->msg);
    k->msg = strdup(tessera_client_error(cl->c));
    return 1;
}

/* Reports final read k to the caller and forgets it. */
static int cop_result(struct ts_cluster *cl, size_t at, uint64_t *op, size_t *out_len)
{
    struct cop *k = cl->cops[at];
    int rc = k->rc;

    if (op)
        *op = k->id;
    if (out_len)
        *out_len = rc ? 0 : k->got;
    if (rc && k->msg)
        cl_err(cl, "%s", k->msg);
    cop_remove(cl, at);
    return rc;
}

int ts_cl_read_submit(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                      uint64_t off, size_t len, void *buf, uint64_t *op)
{
    struct cop **v, *k;
    int rc;

    v = ts_grow(cl->cops, cl->ncops, &cl->capcops, sizeof(*v), 64);
    if (!v)
        return TS_ENOMEM;
    cl->cops = v;
    k = calloc(1, sizeof(*k));
    if (!k)
        return TS_ENOMEM;
    snprintf(k->name, sizeof(k->name), "%s", name);
    k->shard = shard;
    k->off = off;
    k->len = len;
    k->buf = buf;
    sel_init(cl, &k->sel, name, shard, off, 1);
    rc = cop_submit(cl, k);
    if (rc) {
        free(k);
        return rc;
    }
    k->id = cl->next_op++;
    cl->cops[cl->ncops++] = k;
    *op = k->id;
    return 0;
}

int ts_cl_wait(tessera_client *c, struct ts_cluster *cl, uint64_t op, size_t *out_len)
{
    struct cop *k;
    size_t at;

    k = cop_find(cl, op, &at);
    if (!k)
        return TS_ENOENT;
    for (;;) {
        if (k->inflight)
            cop_collect(cl, k);
        if (cop_settle(cl, k))
            break;
    }
    return cop_result(cl, at, NULL, out_len);
}

int ts_cl_wait_any(tessera_client *c, struct ts_cluster *cl, uint64_t *op, size_t *out_len)
{
    tessera_client **v;
    size_t nv;
    int rc;

    if (cl->ncops == 0)
        return TS_ENOENT;
    for (;;) {
        for (size_t i = 0; i < cl->ncops; i++)
            if (cop_settle(cl, cl->cops[i]))
                return cop_result(cl, i, op, out_len);
        v = calloc(cl->npeers, sizeof(*v));
        if (!v)
            return TS_ENOMEM;
        nv = 0;
        for (size_t p = 0; p < cl->npeers; p++)
            if (cl->peers[p].reads && cl->peers[p].conn)
                v[nv++] = cl->peers[p].conn;
        rc = ts_conns_wait(v, nv, cl->timeout_ms);
        free(v);
        if (rc)
            return rc == TS_ENOENT ? TS_EINTERNAL : rc;
        for (size_t i = 0; i < cl->ncops; i++) {
            struct cop *k = cl->cops[i];
            if (k->inflight && ts_conn_op_done(cl->peers[k->peer].conn, k->sub_op) == 1)
                cop_collect(cl, k);
        }
    }
}

/* ---- writes --------------------------------------------------------------------------------- */

int ts_cl_put(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
              const void *buf, size_t len, const uint64_t *records, uint32_t nrecords, int fd,
              uint64_t size)
{
    off_t start = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : 0;
    int order[1], rc, adopted, unreachable, refreshed = 0, stale = 0;
    uint64_t busy_ns = 0;
    char msg[512];
    tessera_client *sub;
    uint32_t pg;
    size_t p;

    for (;;) {
        pg = ts_map_pg_of(cl->map, name, shard);
        if (ts_map_pg_order(cl->map, pg, order, 1) == 0) {
            cl_err(cl, "PG %u of %s/%u has no primary: no node is up (map epoch %llu)", pg, name,
                   shard, (unsigned long long)cl->epoch);
            return TS_EUNAVAIL;
        }
        rc = node_peer(cl, cl->map, (size_t)order[0], &p);
        if (rc)
            return rc;
        adopted = 0;
        unreachable = 0;
        rc = peer_conn(cl, p, 0, &sub);
        if (rc) {
            snprintf(msg, sizeof(msg), "%s", tessera_client_error(c));
            unreachable = 1;
        } else {
            rc = fd < 0 ? tessera_put(sub, name, shard, buf, len, records, nrecords)
                        : tessera_put_fd(sub, name, shard, fd, size);
            snprintf(msg, sizeof(msg), "%s", tessera_client_error(sub));
            adopted = cl_check(cl, p);
            if (!rc)
                return 0;
            if (lost(rc)) {
                cl->peers[p].failed_ns = ts_now_mono_ns();
                unreachable = 1;
            }
        }
        if (rc == TS_ESTALE && adopted && ++stale < MAX_TRIES) {
            TS_INFO(FAC, "write of %s/%u: retrying under map epoch %llu", name, shard,
                    (unsigned long long)cl->epoch);
        } else if (rc == TS_EBUSY && busy_ns < (uint64_t)cl->timeout_ms * 1000000u) {
            /* The primary is peering (catching up before it takes writes): wait and retry. */
            struct timespec ts = {0, 100 * 1000000};
            if (busy_ns == 0)
                TS_INFO(FAC, "write of %s/%u: %s; retrying", name, shard, msg);
            nanosleep(&ts, NULL);
            busy_ns += 100ull * 1000000;
            if (busy_ns % (1000ull * 1000000) == 0)
                cl_refresh(cl, NO_PEER); /* a newer map may name another primary */
        } else if (unreachable && !refreshed) {
            refreshed = 1;
            TS_WARN(FAC, rc,
                    "primary %s (%s) of PG %u is unreachable: %s; asking the other nodes "
                    "for a newer map",
                    cl->peers[p].id, cl->peers[p].addr, pg, msg);
            cl_refresh(cl, p);
        } else {
            break;
        }
        if (fd >= 0 && (start < 0 || lseek(fd, start, SEEK_SET) < 0)) {
            cl_err(cl, "primary %s of PG %u: %s (the input cannot be read again to retry)",
                   cl->peers[p].id, pg, msg);
            return rc;
        }
    }
    if (unreachable)
        cl_err(cl,
               "primary %s (%s) of PG %u for %s/%u is unreachable: %s (map epoch %llu; "
               "'tessera failover %u' promotes another replica)",
               cl->peers[p].id, cl->peers[p].addr, pg, name, shard, msg,
               (unsigned long long)cl->epoch, pg);
    else if (rc == TS_ESTALE)
        cl_err(cl, "primary %s of PG %u refused the write as stale under map epoch %llu: %s",
               cl->peers[p].id, pg, (unsigned long long)cl->epoch, msg);
    else
        cl_err(cl, "%s: %s", cl->peers[p].id, msg);
    return rc;
}

/* ---- datasets -------------------------------------------------------------------------------- */

/*
 * DATASET_CREATE or DATASET_DELETE on every node that is not out. The first failure of a
 * node that is up is the result; failures of down nodes are ignored. `same` (TS_EEXIST for a
 * create, TS_ENOENT for a delete) from some nodes while others succeeded completes an
 * earlier partial call; from all of them it is the result.
 */
static int broadcast(struct ts_cluster *cl, const char *name, const struct ts_dataset_policy *pol,
                     int same)
{
    char ignored[WHY_LEN] = "";
    size_t ok = 0, nsame = 0;
    /* One incarnation for every node: a deleted and re-created name is told apart by it. */
    uint64_t inc = ts_now_wall_ns();
    struct fan f;
    int rc;

    policy_forget(cl, name);
    rc = fan_begin(cl, &f, 1, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        size_t p = f.peers[i];
        tessera_client *sub;
        char msg[512];
        rc = peer_conn(cl, p, f.states[i] != TS_NODE_UP, &sub);
        if (!rc)
            rc = peer_done(cl, p, sub,
                           pol ? ts_client_dataset_create_inc(sub, name, pol, inc)
                               : tessera_dataset_delete(sub, name),
                           msg, sizeof(msg));
        else
            snprintf(msg, sizeof(msg), "%s", tessera_client_error(cl->c));
        if (!rc) {
            ok++;
        } else if (f.states[i] != TS_NODE_UP) {
            TS_INFO(FAC, "%s %s on %s (down in the map): %s, ignored", pol ? "create" : "delete",
                    name, cl->peers[p].id, ts_errname(rc));
            why_add(ignored, "%s (down): %s", cl->peers[p].id, ts_errname(rc));
        } else if (rc == same) {
            nsame++;
            why_add(f.why, "%s: %s", cl->peers[p].id, msg[0] ? msg : ts_strerror(rc));
        } else {
            if (!f.first)
                f.first = rc;
            why_add(f.why, "%s: %s", cl->peers[p].id, msg[0] ? msg : ts_strerror(rc));
        }
    }
    fan_end(&f);
    if (f.first) {
        cl_err(cl, "%s", f.why);
        return f.first;
    }
    if (!ok && nsame) {
        cl_err(cl, "%s", f.why);
        return same;
    }
    if (!ok) {
        cl_err(cl, "no node took it: %s", ignored[0] ? ignored : "no node in the map");
        return TS_EUNAVAIL;
    }
    if (nsame)
        TS_WARN(FAC, same, "%s %s: done on %zu nodes; %s", pol ? "create" : "delete", name, ok,
                f.why);
    return 0;
}

int ts_cl_dataset_create(tessera_client *c, struct ts_cluster *cl, const char *name,
                         const struct ts_dataset_policy *p)
{
    return broadcast(cl, name, p, TS_EEXIST);
}

int ts_cl_dataset_delete(tessera_client *c, struct ts_cluster *cl, const char *name)
{
    return broadcast(cl, name, NULL, TS_ENOENT);
}

/*
 * The lists of every node that is up, one after another in *all (*nall entries, malloc'ed):
 * with name, SHARD_LIST of that dataset (struct ts_shard_info; a node that does not have the
 * dataset is weaker news than one that fails), else DATASET_LIST (struct ts_dataset_info).
 * *answered: how many nodes answered. With no answer: the failure, every node's in the
 * router's message.
 */
static int gather_lists(struct ts_cluster *cl, const char *name, void **all, size_t *nall,
                        size_t *answered)
{
    size_t size = name ? sizeof(struct ts_shard_info) : sizeof(struct ts_dataset_info);
    uint8_t *v = NULL;
    struct fan f;
    int rc;

    *all = NULL;
    *nall = 0;
    *answered = 0;
    rc = fan_begin(cl, &f, 0, name != NULL);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        struct ts_dataset_info *dv = NULL;
        struct ts_shard_info *sv = NULL;
        tessera_client *sub;
        void *got;
        size_t m;
        rc = peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = peer_done(cl, f.peers[i], sub,
                           name ? tessera_shard_list(sub, name, &sv, &m)
                                : tessera_dataset_list(sub, &dv, &m),
                           NULL, 0);
        if (rc) {
            fan_fail(cl, &f, f.peers[i], rc);
            continue;
        }
        (*answered)++;
        got = name ? (void *)sv : (void *)dv;
        if (m) {
            uint8_t *grown = realloc(v, (*nall + m) * size);
            if (!grown) {
                free(got);
                rc = TS_ENOMEM;
                goto out_free;
            }
            v = grown;
            memcpy(v + *nall * size, got, m * size);
            *nall += m;
        }
        free(got);
    }
    if (!*answered) {
        rc = fan_none(cl, &f);
        goto out_free;
    }
    *all = v;
    v = NULL;
    rc = 0;
out_free:
    free(v);
    fan_end(&f);
    if (rc)
        *nall = 0;
    return rc;
}

static int by_shard(const void *a, const void *b)
{
    const struct ts_shard_info *x = a, *y = b;

    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (x->state != y->state) /* complete first */
        return x->state == TS_SHARD_COMPLETE ? -1 : 1;
    return 0;
}

/*
 * SHARD_LIST from every node that is up, merged by shard number: a shard complete on some
 * node is listed complete (as that node has it), else as being written. *answered: how many
 * nodes answered. With no answer: the first failure.
 */
static int shard_union(struct ts_cluster *cl, const char *name, struct ts_shard_info **out,
                       size_t *nout, size_t *answered)
{
    struct ts_shard_info *all;
    size_t nall, k = 0;
    void *v;
    int rc;

    *out = NULL;
    *nout = 0;
    rc = gather_lists(cl, name, &v, &nall, answered);
    if (rc)
        return rc;
    all = v;
    if (nall)
        qsort(all, nall, sizeof(*all), by_shard);
    for (size_t i = 0; i < nall; i++)
        if (k == 0 || all[k - 1].shard != all[i].shard)
            all[k++] = all[i];
    *out = all;
    *nout = k;
    return 0;
}

/* Folds another node's view of a dataset into d: sealed anywhere is sealed. */
static void merge_info(struct ts_dataset_info *d, const struct ts_dataset_info *o)
{
    if (o->state == TS_DS_SEALED)
        d->state = TS_DS_SEALED;
    if (o->created_ns && (!d->created_ns || o->created_ns < d->created_ns))
        d->created_ns = o->created_ns;
}

/*
 * Shard counts and bytes of dataset name's info d from the union of the nodes' shards (left
 * as they are when no node answers).
 */
static void count_dataset(struct ts_cluster *cl, const char *name, struct ts_dataset_info *d)
{
    struct ts_shard_info *v;
    size_t m, answered;

    if (shard_union(cl, name, &v, &m, &answered) != 0)
        return;
    d->shards = 0;
    d->shards_writing = 0;
    d->bytes = 0;
    for (size_t i = 0; i < m; i++) {
        if (v[i].state == TS_SHARD_COMPLETE) {
            d->shards++;
            d->bytes += v[i].size;
        } else {
            d->shards_writing++;
        }
    }
    free(v);
}

int ts_cl_dataset_stat(tessera_client *c, struct ts_cluster *cl, const char *name,
                       struct ts_dataset_info *out)
{
    struct ts_dataset_info d;
    int rc, have = 0;
    struct fan f;

    rc = fan_begin(cl, &f, 0, 1);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        tessera_client *sub;
        rc = peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = peer_done(cl, f.peers[i], sub, tessera_dataset_stat(sub, name, &d), NULL, 0);
        if (rc) {
            fan_fail(cl, &f, f.peers[i], rc);
        } else if (!have) {
            *out = d;
            have = 1;
        } else {
            merge_info(out, &d);
        }
    }
    fan_end(&f);
    if (!have)
        return fan_none(cl, &f);
    policy_keep(cl, name, &out->policy);
    count_dataset(cl, name, out);
    ts_client_set_error(c, "%s", "");
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct ts_dataset_info *)a)->name,
                  ((const struct ts_dataset_info *)b)->name);
}

int ts_cl_dataset_list(tessera_client *c, struct ts_cluster *cl, struct ts_dataset_info **out,
                       size_t *nout)
{
    struct ts_dataset_info *all;
    size_t nall, k = 0, answered;
    void *v;
    int rc;

    rc = gather_lists(cl, NULL, &v, &nall, &answered);
    if (rc)
        return rc;
    all = v;
    if (nall)
        qsort(all, nall, sizeof(*all), by_name);
    for (size_t i = 0; i < nall; i++) {
        if (k > 0 && strcmp(all[k - 1].name, all[i].name) == 0)
            merge_info(&all[k - 1], &all[i]);
        else
            all[k++] = all[i];
    }
    for (size_t i = 0; i < k; i++)
        count_dataset(cl, all[i].name, &all[i]);
    ts_client_set_error(c, "%s", "");
    *out = all;
    *nout = k;
    return 0;
}

int ts_cl_dataset_seal(tessera_client *c, struct ts_cluster *cl, const char *name)
{
    struct ts_shard_info *v;
    char why[WHY_LEN] = "";
    size_t m, answered, ok = 0, sealed = 0;
    uint32_t next = 0;
    struct fan f;
    int rc;

    /* Complete across the cluster: shards 0..N-1 each complete on some node. */
    rc = shard_union(cl, name, &v, &m, &answered);
    if (rc)
        return rc;
    for (size_t i = 0; i < m; i++) {
        if (v[i].shard != next)
            why_add(why,
                    next + 1 == v[i].shard ? "shard %u is missing" : "shards %u-%u are missing",
                    next, v[i].shard - 1);
        if (v[i].state != TS_SHARD_COMPLETE)
            why_add(why, "shard %u is being written and complete on no node", v[i].shard);
        next = v[i].shard + 1;
    }
    free(v);
    if (why[0]) {
        cl_err(cl, "cannot seal %s: %s", name, why);
        return TS_EINCOMPLETE;
    }
    rc = fan_begin(cl, &f, 0, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        tessera_client *sub;
        char msg[512];
        rc = peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = peer_done(cl, f.peers[i], sub, ts_conn_dataset_seal(sub, name, TS_SEAL_LOCAL_ONLY),
                           msg, sizeof(msg));
        else
            snprintf(msg, sizeof(msg), "%s", tessera_client_error(cl->c));
        if (!rc) {
            ok++;
        } else if (rc == TS_ESEALED) {
            sealed++;
        } else {
            if (!f.first)
                f.first = rc;
            why_add(f.why, "%s: %s", cl->peers[f.peers[i]].id, msg[0] ? msg : ts_strerror(rc));
        }
    }
    fan_end(&f);
    if (f.first) {
        cl_err(cl, "sealed on %zu of %zu nodes; %s", ok + sealed, f.n, f.why);
        return f.first;
    }
    if (!ok && sealed) {
        cl_err(cl, "dataset %s is sealed already", name);
        return TS_ESEALED;
    }
    return 0;
}

/* ---- shards --------------------------------------------------------------------------------- */

int ts_cl_shard_stat(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                     struct ts_shard_info *out)
{
    struct sel s;
    tessera_client *sub;
    size_t p;
    int rc;

    sel_init(cl, &s, name, shard, 0, 0); /* the primary knows best */
    for (;;) {
        rc = sel_next(cl, &s, name, shard, 0, &p, &sub);
        if (rc)
            return rc;
        rc = tessera_shard_stat(sub, name, shard, out);
        if (!rc) {
            cl_check(cl, p);
            return 0;
        }
        if (!sel_retry(cl, &s, p, sub, rc, name, shard, 0))
            return rc;
    }
}

int ts_cl_shard_list(tessera_client *c, struct ts_cluster *cl, const char *name,
                     struct ts_shard_info **out, size_t *n)
{
    size_t answered;
    int rc;

    rc = shard_union(cl, name, out, n, &answered);
    if (!rc)
        ts_client_set_error(c, "%s", "");
    return rc;
}

/* ---- maintenance ----------------------------------------------------------------------------- */

int ts_cl_scrub(tessera_client *c, struct ts_cluster *cl, const char *name,
                struct ts_scrub_report *rep,
                void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk, int rc),
                void *arg)
{
    struct fan f;
    int rc;

    rc = fan_begin(cl, &f, 0, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        struct ts_scrub_report r;
        tessera_client *sub;
        rc = peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = peer_done(cl, f.peers[i], sub, tessera_scrub(sub, name, &r, cb, arg), NULL, 0);
        if (rc) {
            fan_fail(cl, &f, f.peers[i], rc);
            continue;
        }
        if (r.corrupt)
            TS_ERROR(FAC, TS_ECORRUPT, "scrub: node %s holds %llu corrupt chunks",
                     cl->peers[f.peers[i]].id, (unsigned long long)r.corrupt);
        rep->shards += r.shards;
        rep->chunks += r.chunks;
        rep->bytes += r.bytes;
        rep->corrupt += r.corrupt;
        rep->pgs_compared += r.pgs_compared;
        rep->pgs_differing += r.pgs_differing;
        rep->pgs_unchecked += r.pgs_unchecked;
        rep->missing += r.missing;
    }
    fan_end(&f);
    if (f.first)
        cl_err(cl, "%s", f.why);
    return f.first;
}

int ts_cl_status(tessera_client *c, struct ts_cluster *cl, char **json)
{
    tessera_client *sub;
    size_t p = cl->seed;
    int rc;

    /* The node the handle was opened on, else the first node that answers. */
    if (p != NO_PEER && peer_conn(cl, p, 0, &sub) == 0) {
        rc = tessera_status(sub, json);
        if (rc)
            cl_err(cl, "%s: %s", cl->peers[p].id, tessera_client_error(sub));
        return rc;
    }
    rc = TS_EUNAVAIL;
    for (size_t i = 0; i < cl->map->n; i++) {
        if (cl->map->nodes[i].state != TS_NODE_UP || node_peer(cl, cl->map, i, &p) != 0)
            continue;
        rc = peer_conn(cl, p, 0, &sub);
        if (rc)
            continue;
        rc = tessera_status(sub, json);
        if (rc)
            cl_err(cl, "%s: %s", cl->peers[p].id, tessera_client_error(sub));
        return rc;
    }
    return rc;
}

int ts_client_node_status(tessera_client *c, size_t node, char **json)
{
    struct ts_cluster *cl = ts_client_cluster(c);
    tessera_client *sub;
    size_t p;
    int rc;

    *json = NULL;
    if (!cl || node >= cl->map->n)
        return TS_EINVAL;
    ts_client_set_error(c, "%s", "");
    rc = node_peer(cl, cl->map, node, &p);
    if (rc)
        return rc;
    rc = peer_conn(cl, p, cl->map->nodes[node].state != TS_NODE_UP, &sub);
    if (rc)
        return rc;
    return peer_done(cl, p, sub, tessera_status(sub, json), NULL, 0);
}

/* ---- administration -------------------------------------------------------------------------- */

/*
 * Pushes m to every node of m but skip_node (up_only: to those that are up; nodes that are not
 * up get a short connect timeout, and their failures do not count). *pushed: how many accepted. The
 * first failure of a node that is up, with every failure in why.
 */
static int push_all(struct ts_cluster *cl, const struct ts_map *m, size_t skip_node, int up_only,
                    size_t *pushed, char *why)
{
    int rc, first = 0;

    *pushed = 0;
    for (size_t i = 0; i < m->n; i++) {
        tessera_client *sub;
        uint64_t e = 0;
        const char *msg;
        size_t p;
        int up = m->nodes[i].state == TS_NODE_UP;
        if (i == skip_node || (up_only && !up))
            continue;
        rc = node_peer(cl, m, i, &p);
        if (rc)
            return rc;
        rc = peer_conn(cl, p, !up, &sub);
        if (!rc) {
            rc = ts_conn_map_push(sub, m, &e);
            msg = tessera_client_error(sub);
            if (!rc && e != m->epoch) {
                rc = TS_ESTALE;
                msg = "it keeps a newer epoch";
            }
        } else {
            msg = tessera_client_error(cl->c);
        }
        if (!rc) {
            (*pushed)++;
            continue;
        }
        why_add(why, "%s (%s)%s: %s: %s", cl->peers[p].id, cl->peers[p].addr,
                up ? "" : ", not up in the map", ts_errname(rc), msg[0] ? msg : ts_strerror(rc));
        if (up && !first)
            first = rc;
    }
    return first;
}

int tessera_map_push_file(tessera_client *c, const char *path, uint64_t *new_epoch)
{
    struct ts_cluster *cl, *bare = NULL;
    struct ts_map *m = NULL, *got;
    char err[512], why[WHY_LEN] = "";
    uint64_t hi, e;
    size_t pushed;
    int rc;

    if (new_epoch)
        *new_epoch = 0;
    if (!c || !path)
        return TS_EINVAL;
    ts_client_set_error(c, "%s", "");
    cl = ts_client_cluster(c);
    if (!cl) {
        /* A single-node handle: connections to the file's nodes of its own. */
        rc = ts_cl_create(&bare, c, NULL, NULL, ts_client_opts(c));
        if (rc)
            return rc;
        cl = bare;
    }
    err[0] = '\0';
    rc = ts_map_parse_file(path, &m, err, sizeof(err));
    if (rc) {
        cl_err(cl, "%s", err[0] ? err : ts_strerror(rc));
        goto out_free;
    }
    /* Higher than any epoch in sight: the file's, ours, every reachable node's. */
    hi = TS_MAX(m->epoch, cl->epoch);
    if (bare && ts_conn_map_get(c, &got, &e) == 0) {
        hi = TS_MAX(hi, e);
        ts_map_free(got);
    }
    for (size_t i = 0; i < m->n; i++) {
        tessera_client *sub;
        size_t p;
        if (node_peer(cl, m, i, &p) != 0 ||
            peer_conn(cl, p, m->nodes[i].state != TS_NODE_UP, &sub) != 0)
            continue;
        if (ts_conn_map_get(sub, &got, &e) == 0) {
            hi = TS_MAX(hi, e);
            ts_map_free(got);
        }
    }
    if (hi >= TS_MAP_MAX_EPOCH) {
        cl_err(cl, "the epoch in sight (%llu) leaves no newer one", (unsigned long long)hi);
        rc = TS_EINVAL;
        goto out_free;
    }
    /* The operator's file is theirs: it is never rewritten (the nodes keep the map they run). */
    m->epoch = hi + 1;
    if (new_epoch)
        *new_epoch = m->epoch;
    rc = push_all(cl, m, SIZE_MAX, 0, &pushed, why);
    TS_INFO(FAC, "map epoch %llu from %s pushed to %zu of %zu nodes", (unsigned long long)m->epoch,
            path, pushed, m->n);
    if (why[0])
        cl_err(cl, "epoch %llu reached %zu of %zu nodes; %s", (unsigned long long)m->epoch, pushed,
               m->n, why);
    if (!bare) {
        cl_adopt(cl, m);
        m = NULL;
    }
out_free:
    ts_map_free(m);
    ts_cl_free(bare);
    return rc;
}

int tessera_failover(tessera_client *c, uint32_t pg, uint64_t *new_epoch)
{
    struct ts_cluster *cl = ts_client_cluster(c);
    char why[WHY_LEN] = "";
    struct ts_map *m;
    int order[1], rc;
    size_t old, pushed;

    if (new_epoch)
        *new_epoch = 0;
    if (!c)
        return TS_EINVAL;
    ts_client_set_error(c, "%s", "");
    if (!cl) {
        ts_client_set_error(c, "node %s has no cluster map: nothing to fail over",
                            tessera_client_node(c));
        return TS_EINVAL;
    }
    cl_refresh(cl, NO_PEER); /* the newest map any node has */
    if (pg >= cl->map->pg_count) {
        cl_err(cl, "PG %u does not exist: the cluster has PGs 0 to %u", pg, cl->map->pg_count - 1);
        return TS_EINVAL;
    }
    if (ts_map_pg_order(cl->map, pg, order, 1) == 0) {
        cl_err(cl, "PG %u has no primary: no node is up (map epoch %llu)", pg,
               (unsigned long long)cl->epoch);
        return TS_EUNAVAIL;
    }
    m = ts_map_dup(cl->map);
    if (!m)
        return TS_ENOMEM;
    old = (size_t)order[0];
    m->nodes[old].state = TS_NODE_DOWN;
    m->epoch++;
    if (ts_map_pg_order(m, pg, order, 1) == 0) {
        cl_err(cl, "PG %u: %s is its last node that is up; nothing to promote", pg,
               m->nodes[old].id);
        ts_map_free(m);
        return TS_EUNAVAIL;
    }
    TS_INFO(FAC, "failover of PG %u: %s down, %s primary, map epoch %llu", pg, m->nodes[old].id,
            m->nodes[order[0]].id, (unsigned long long)m->epoch);
    rc = push_all(cl, m, old, 1, &pushed, why);
    if (new_epoch)
        *new_epoch = m->epoch;
    if (why[0])
        cl_err(cl, "epoch %llu reached %zu nodes; %s", (unsigned long long)m->epoch, pushed, why);
    cl_adopt(cl, m);
    return rc;
}
