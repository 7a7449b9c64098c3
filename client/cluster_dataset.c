/*
 * libtessera in cluster mode: dataset and shard calls, scrub and status. Creation, deletion
 * and sealing go to every node; stat and the lists are gathered from the nodes that are up and
 * merged; a shard's stat is asked of its replicas, the primary first; scrub adds the nodes'
 * reports up; status comes from one node (the seed, or any node the CLI names). Each node is
 * asked with the connection layer's call of the same name (ts_conn_*) on its sub-connection.
 */
#include "cluster_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_map.h"

#define FAC "client"

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

    ts_cl_policy_forget(cl, name);
    rc = ts_cl_fan_begin(cl, &f, 1, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        size_t p = f.peers[i];
        tessera_client *sub;
        char msg[512];
        rc = ts_cl_peer_conn(cl, p, f.states[i] != TS_NODE_UP, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, p, sub,
                                 pol ? ts_conn_dataset_create_inc(sub, name, pol, inc)
                                     : ts_conn_dataset_delete(sub, name),
                                 msg, sizeof(msg));
        else
            snprintf(msg, sizeof(msg), "%s", ts_conn_error(cl->c));
        if (!rc) {
            ok++;
        } else if (f.states[i] != TS_NODE_UP) {
            TS_INFO(FAC, "%s %s on %s (down in the map): %s, ignored", pol ? "create" : "delete",
                    name, cl->peers[p].id, ts_errname(rc));
            ts_cl_why_add(ignored, "%s (down): %s", cl->peers[p].id, ts_errname(rc));
        } else if (rc == same) {
            nsame++;
            ts_cl_why_add(f.why, "%s: %s", cl->peers[p].id, msg[0] ? msg : ts_strerror(rc));
        } else {
            if (!f.first)
                f.first = rc;
            ts_cl_why_add(f.why, "%s: %s", cl->peers[p].id, msg[0] ? msg : ts_strerror(rc));
        }
    }
    ts_cl_fan_end(&f);
    if (f.first) {
        ts_cl_err(cl, "%s", f.why);
        return f.first;
    }
    if (!ok && nsame) {
        ts_cl_err(cl, "%s", f.why);
        return same;
    }
    if (!ok) {
        ts_cl_err(cl, "no node took it: %s", ignored[0] ? ignored : "no node in the map");
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
    rc = ts_cl_fan_begin(cl, &f, 0, name != NULL);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        struct ts_dataset_info *dv = NULL;
        struct ts_shard_info *sv = NULL;
        tessera_client *sub;
        void *got;
        size_t m;
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub,
                                 name ? ts_conn_shard_list(sub, name, &sv, &m)
                                      : ts_conn_dataset_list(sub, &dv, &m),
                                 NULL, 0);
        if (rc) {
            ts_cl_fan_fail(cl, &f, f.peers[i], rc);
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
        rc = ts_cl_fan_none(cl, &f);
        goto out_free;
    }
    *all = v;
    v = NULL;
    rc = 0;
out_free:
    free(v);
    ts_cl_fan_end(&f);
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

    rc = ts_cl_fan_begin(cl, &f, 0, 1);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        tessera_client *sub;
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub, ts_conn_dataset_stat(sub, name, &d), NULL, 0);
        if (rc) {
            ts_cl_fan_fail(cl, &f, f.peers[i], rc);
        } else if (!have) {
            *out = d;
            have = 1;
        } else {
            merge_info(out, &d);
        }
    }
    ts_cl_fan_end(&f);
    if (!have)
        return ts_cl_fan_none(cl, &f);
    ts_cl_policy_keep(cl, name, &out->policy);
    count_dataset(cl, name, out);
    ts_conn_set_error(c, "%s", "");
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
    ts_conn_set_error(c, "%s", "");
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
            ts_cl_why_add(
                why, next + 1 == v[i].shard ? "shard %u is missing" : "shards %u-%u are missing",
                next, v[i].shard - 1);
        if (v[i].state != TS_SHARD_COMPLETE)
            ts_cl_why_add(why, "shard %u is being written and complete on no node", v[i].shard);
        next = v[i].shard + 1;
    }
    free(v);
    if (why[0]) {
        ts_cl_err(cl, "cannot seal %s: %s", name, why);
        return TS_EINCOMPLETE;
    }
    rc = ts_cl_fan_begin(cl, &f, 0, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        tessera_client *sub;
        char msg[512];
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub,
                                 ts_conn_dataset_seal_flags(sub, name, TS_SEAL_LOCAL_ONLY), msg,
                                 sizeof(msg));
        else
            snprintf(msg, sizeof(msg), "%s", ts_conn_error(cl->c));
        if (!rc) {
            ok++;
        } else if (rc == TS_ESEALED) {
            sealed++;
        } else {
            if (!f.first)
                f.first = rc;
            ts_cl_why_add(f.why, "%s: %s", cl->peers[f.peers[i]].id,
                          msg[0] ? msg : ts_strerror(rc));
        }
    }
    ts_cl_fan_end(&f);
    if (f.first) {
        ts_cl_err(cl, "sealed on %zu of %zu nodes; %s", ok + sealed, f.n, f.why);
        return f.first;
    }
    if (!ok && sealed) {
        ts_cl_err(cl, "dataset %s is sealed already", name);
        return TS_ESEALED;
    }
    return 0;
}

/* ---- shards --------------------------------------------------------------------------------- */

int ts_cl_shard_records(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                        uint64_t **offsets, uint32_t *n)
{
    struct sel s;
    tessera_client *sub;
    size_t p;
    int rc;

    ts_cl_sel_init(cl, &s, name, shard, 0, 0);
    for (;;) {
        rc = ts_cl_sel_next(cl, &s, name, shard, 0, &p, &sub);
        if (rc)
            return rc;
        rc = ts_conn_shard_records(sub, name, shard, offsets, n);
        if (!rc) {
            ts_cl_check(cl, p);
            return 0;
        }
        if (!ts_cl_sel_retry(cl, &s, p, sub, rc, name, shard, 0))
            return rc;
    }
}

int ts_cl_shard_stat(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                     struct ts_shard_info *out)
{
    struct sel s;
    tessera_client *sub;
    size_t p;
    int rc;

    ts_cl_sel_init(cl, &s, name, shard, 0, 0); /* the primary knows best */
    for (;;) {
        rc = ts_cl_sel_next(cl, &s, name, shard, 0, &p, &sub);
        if (rc)
            return rc;
        rc = ts_conn_shard_stat(sub, name, shard, out);
        if (!rc) {
            ts_cl_check(cl, p);
            return 0;
        }
        if (!ts_cl_sel_retry(cl, &s, p, sub, rc, name, shard, 0))
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
        ts_conn_set_error(c, "%s", "");
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

    rc = ts_cl_fan_begin(cl, &f, 0, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        struct ts_scrub_report r;
        tessera_client *sub;
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub, ts_conn_scrub(sub, name, &r, cb, arg), NULL,
                                 0);
        if (rc) {
            ts_cl_fan_fail(cl, &f, f.peers[i], rc);
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
    ts_cl_fan_end(&f);
    if (f.first)
        ts_cl_err(cl, "%s", f.why);
    return f.first;
}

int ts_cl_status(tessera_client *c, struct ts_cluster *cl, char **json)
{
    tessera_client *sub;
    size_t p = cl->seed;
    int rc;

    /* The node the handle was opened on, else the first node that answers. */
    if (p != NO_PEER && ts_cl_peer_conn(cl, p, 0, &sub) == 0) {
        rc = ts_conn_status(sub, json);
        if (rc)
            ts_cl_err(cl, "%s: %s", cl->peers[p].id, ts_conn_error(sub));
        return rc;
    }
    rc = TS_EUNAVAIL;
    for (size_t i = 0; i < cl->map->n; i++) {
        if (cl->map->nodes[i].state != TS_NODE_UP || ts_cl_node_peer(cl, cl->map, i, &p) != 0)
            continue;
        rc = ts_cl_peer_conn(cl, p, 0, &sub);
        if (rc)
            continue;
        rc = ts_conn_status(sub, json);
        if (rc)
            ts_cl_err(cl, "%s: %s", cl->peers[p].id, ts_conn_error(sub));
        return rc;
    }
    return rc;
}

int ts_cl_node_status(tessera_client *c, struct ts_cluster *cl, size_t node, char **json)
{
    tessera_client *sub;
    size_t p;
    int rc;

    if (node >= cl->map->n)
        return TS_EINVAL;
    ts_conn_set_error(c, "%s", "");
    rc = ts_cl_node_peer(cl, cl->map, node, &p);
    if (rc)
        return rc;
    rc = ts_cl_peer_conn(cl, p, cl->map->nodes[node].state != TS_NODE_UP, &sub);
    if (rc)
        return rc;
    return ts_cl_peer_done(cl, p, sub, ts_conn_status(sub, json), NULL, 0);
}

void ts_cl_map_refresh(struct ts_cluster *cl)
{
    ts_cl_refresh(cl, NO_PEER);
}

/* The sub-connection to node i of the map alone (*p its peer), for the per-node calls below. */
static int node_sub(tessera_client *c, struct ts_cluster *cl, size_t node, size_t *p,
                    tessera_client **sub)
{
    int rc;

    if (node >= cl->map->n)
        return TS_EINVAL;
    ts_conn_set_error(c, "%s", "");
    rc = ts_cl_node_peer(cl, cl->map, node, p);
    return rc ? rc : ts_cl_peer_conn(cl, *p, 0, sub);
}

int ts_cl_node_pg_drop(tessera_client *c, struct ts_cluster *cl, size_t node, uint32_t pg,
                       const char *dataset, uint32_t *shards, uint64_t *bytes)
{
    tessera_client *sub;
    size_t p;
    int rc;

    *shards = 0;
    *bytes = 0;
    rc = node_sub(c, cl, node, &p, &sub);
    if (rc)
        return rc;
    return ts_cl_peer_done(cl, p, sub, ts_conn_pg_drop(sub, pg, dataset, shards, bytes), NULL, 0);
}

int ts_cl_node_dataset_stat(tessera_client *c, struct ts_cluster *cl, size_t node, const char *name,
                            struct ts_dataset_info *out)
{
    tessera_client *sub;
    size_t p;
    int rc = node_sub(c, cl, node, &p, &sub);

    if (rc)
        return rc;
    return ts_cl_peer_done(cl, p, sub, ts_conn_dataset_stat(sub, name, out), NULL, 0);
}

int ts_cl_node_read(tessera_client *c, struct ts_cluster *cl, size_t node, const char *name,
                    uint32_t shard, uint64_t off, size_t len, void *buf, size_t *out_len)
{
    tessera_client *sub;
    size_t p;
    int rc;

    *out_len = 0;
    rc = node_sub(c, cl, node, &p, &sub);
    if (rc)
        return rc;
    return ts_cl_peer_done(cl, p, sub, ts_conn_read(sub, name, shard, off, len, buf, out_len), NULL,
                           0);
}
