/*
 * libtessera: the public calls of a handle, the top of the library's three layers
 * (client_internal.h): each checks its arguments once and goes to the router (a handle in
 * cluster mode: ts_cl_*, cluster*.c) or to the connection (a single node: ts_conn_*).
 *
 * A single-node handle's call goes straight to its ts_conn_* twin, which checks the arguments
 * itself: the router calls the same ts_conn_* on its sub-connections and needs those checks
 * too. A router handle's arguments are checked here, with the checks the call always made on
 * a router, in the same order, before ts_cl_*. Opening a handle (its node's cluster map
 * decides between a single-node handle and a router over the cluster) and closing it are here
 * as well: this is the one file that knows both the router and the connection.
 */
#include "conn.h"

#include <stdio.h>

#include "ts_map.h"

#define FAC "client"

/* A handle in cluster mode (NULL is not). */
static int routed(const tessera_client *c)
{
    return c && c->cl;
}

/* ---- open / close ---------------------------------------------------------------------------- */

/* A router handle over the seed's cluster: it takes seed and map. */
static int make_router(tessera_client **out, tessera_client *seed, struct ts_map *map)
{
    tessera_client *r;
    int rc;

    *out = NULL;
    rc = ts_conn_shell(&r, seed, map->epoch);
    if (rc)
        goto out_free_seed;
    rc = ts_cl_create(&r->cl, r, seed, map, ts_conn_opts(r));
    if (rc) {
        tessera_client_close(r);
        return rc;
    }
    *out = r;
    return 0;

out_free_seed:
    ts_map_free(map);
    ts_conn_close(seed);
    return rc;
}

/*
 * *out was opened on the seed node (address addr), which has cluster map map (NULL: a single
 * node, *out stays as it is): a router over the cluster replaces it.
 */
static int open_router(tessera_client **out, struct ts_map *map, const char *addr, char *err,
                       size_t errlen)
{
    int rc;

    if (!map)
        return 0;
    TS_INFO(FAC, "node %s is in a cluster: map epoch %llu, %zu nodes, %u PGs", ts_conn_node(*out),
            (unsigned long long)map->epoch, map->n, map->pg_count);
    rc = make_router(out, *out, map);
    if (rc && err && errlen)
        snprintf(err, errlen, "cluster map of %s: %s", addr, ts_strerror(rc));
    return rc;
}

/* How a failure to make the router names the seed. */
static const char *seed_name(const struct tessera_opts *o)
{
    if (!o)
        return TS_DEFAULT_ADDRESS; /* the address the defaults give */
    return o->address ? o->address : "the seed";
}

int ts_client_open_ex(tessera_client **out, const struct tessera_opts *o, char *err, size_t errlen)
{
    struct ts_map *map = NULL;
    int rc;

    rc = ts_conn_open_seed(out, &map, o, err, errlen);
    if (rc)
        return rc;
    return open_router(out, map, seed_name(o), err, errlen);
}

int ts_client_open_transport(tessera_client **out, const struct tessera_opts *o,
                             struct ts_transport *t, char *err, size_t errlen)
{
    struct ts_map *map = NULL;
    int rc;

    rc = ts_conn_open_transport(out, &map, o, t, err, errlen);
    if (rc)
        return rc;
    return open_router(out, map, seed_name(o), err, errlen);
}

int tessera_client_open(tessera_client **out, const struct tessera_opts *o)
{
    return ts_client_open_ex(out, o, NULL, 0);
}

void tessera_client_close(tessera_client *c)
{
    if (!c)
        return;
    ts_cl_free(c->cl);
    ts_conn_close(c);
}

/* ---- what a handle tells -------------------------------------------------------------------- */

void ts_client_set_timeout(tessera_client *c, int timeout_ms)
{
    ts_conn_set_timeout(c, timeout_ms);
    if (c->cl)
        ts_cl_set_timeout(c->cl, ts_conn_timeout(c));
}

uint64_t tessera_client_epoch(const tessera_client *c)
{
    return routed(c) ? ts_cl_epoch(c->cl) : 0;
}

int tessera_client_role(const tessera_client *c)
{
    return ts_conn_role(c);
}

const char *tessera_client_error(const tessera_client *c)
{
    return ts_conn_error(c);
}

const char *tessera_client_node(const tessera_client *c)
{
    return ts_conn_node(c);
}

const struct ts_map *ts_client_map(const tessera_client *c)
{
    return routed(c) ? ts_cl_map(c->cl) : NULL;
}

const char *ts_client_served(const tessera_client *c)
{
    return routed(c) ? ts_cl_served(c->cl) : ts_conn_node(c);
}

void ts_client_batch(tessera_client *c, const struct ts_batch *b)
{
    if (routed(c))
        ts_cl_batch(c->cl, b);
    else
        ts_conn_batch(c, b);
}

uint64_t ts_client_resubmits(const tessera_client *c)
{
    return routed(c) ? ts_cl_resubmits(c->cl) : 0;
}

int ts_client_node_status(tessera_client *c, size_t node, char **json)
{
    *json = NULL;
    if (!routed(c))
        return TS_EINVAL;
    return ts_cl_node_status(c, c->cl, node, json);
}

int ts_client_node_tier_check(tessera_client *c, const char *id)
{
    return routed(c) ? ts_cl_node_tier_check(c, c->cl, id) : 0;
}

int ts_client_ec_repair(tessera_client *c, const char *name, int mode,
                        struct tessera_repair_report *rep)
{
    memset(rep, 0, sizeof(*rep));
    if (!routed(c))
        return TS_EINVAL;
    c->err[0] = '\0';
    return ts_cl_dataset_repair(c, c->cl, name, mode, rep);
}

int ts_client_ec_chunk_repair(tessera_client *c, const char *frag, uint32_t shard, uint32_t chunk,
                              struct tessera_repair_report *rep)
{
    memset(rep, 0, sizeof(*rep));
    if (!routed(c))
        return TS_EINVAL;
    c->err[0] = '\0';
    return ts_cl_ec_chunk_repair(c, c->cl, frag, shard, chunk, rep);
}

int ts_client_node_read(tessera_client *c, size_t node, const char *name, uint32_t shard,
                        uint64_t off, size_t len, void *buf, size_t *out_len)
{
    if (!routed(c))
        return TS_EINVAL;
    return ts_cl_node_read(c, c->cl, node, name, shard, off, len, buf, out_len);
}

void ts_client_map_refresh(tessera_client *c)
{
    if (routed(c))
        ts_cl_map_refresh(c->cl);
}

int ts_client_node_pg_drop(tessera_client *c, size_t node, uint32_t pg, uint32_t *shards,
                           uint64_t *bytes)
{
    if (!routed(c))
        return TS_EINVAL;
    return ts_cl_node_pg_drop(c, c->cl, node, pg, NULL, shards, bytes);
}

int ts_client_node_pg_drop_dataset(tessera_client *c, size_t node, uint32_t pg, const char *dataset,
                                   uint32_t *shards, uint64_t *bytes)
{
    if (!routed(c))
        return TS_EINVAL;
    return ts_cl_node_pg_drop(c, c->cl, node, pg, dataset, shards, bytes);
}

int ts_client_node_dataset_stat(tessera_client *c, size_t node, const char *name,
                                struct ts_dataset_info *out)
{
    if (!routed(c))
        return TS_EINVAL;
    return ts_cl_node_dataset_stat(c, c->cl, node, name, out);
}

/* ---- datasets ------------------------------------------------------------------------------- */

int tessera_dataset_create(tessera_client *c, const char *name, const struct ts_dataset_policy *p)
{
    int rc;

    if (!routed(c))
        return ts_conn_dataset_create(c, name, p);
    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!p)
        p = &ts_policy_default;
    return ts_cl_dataset_create(c, c->cl, name, p);
}

int tessera_dataset_list(tessera_client *c, struct ts_dataset_info **out, size_t *n)
{
    int rc;

    if (!routed(c))
        return ts_conn_dataset_list(c, out, n);
    if (out)
        *out = NULL;
    rc = ts_list_begin(c, out != NULL, n);
    if (rc)
        return rc;
    return ts_cl_dataset_list(c, c->cl, out, n);
}

int tessera_dataset_stat(tessera_client *c, const char *name, struct ts_dataset_info *out)
{
    int rc;

    if (!routed(c))
        return ts_conn_dataset_stat(c, name, out);
    rc = ts_enter_out_name(c, out != NULL, name);
    if (rc)
        return rc;
    return ts_cl_dataset_stat(c, c->cl, name, out);
}

int tessera_dataset_seal(tessera_client *c, const char *name)
{
    int rc;

    if (!routed(c))
        return ts_conn_dataset_seal(c, name);
    c->err[0] = '\0';
    rc = ts_name_check(c, name);
    if (rc)
        return rc;
    return ts_cl_dataset_seal(c, c->cl, name);
}

int tessera_dataset_repair(tessera_client *c, const char *name, struct tessera_repair_report *rep)
{
    int rc;

    if (!rep)
        return TS_EINVAL;
    memset(rep, 0, sizeof(*rep));
    if (!routed(c)) {
        rc = ts_enter_name(c, name);
        if (rc)
            return rc;
        ts_conn_set_error(c, "erasure coding needs a cluster: this handle is on one node");
        return TS_ENOTSUP;
    }
    c->err[0] = '\0';
    rc = ts_name_check(c, name);
    return rc ? rc : ts_cl_dataset_repair(c, c->cl, name, TS_REPAIR_FULL, rep);
}

int tessera_dataset_tier(tessera_client *c, const char *name, unsigned k, unsigned m,
                         tessera_tier_progress progress, void *arg)
{
    int rc;

    if (!routed(c)) {
        rc = ts_enter_name(c, name);
        if (rc)
            return rc;
        ts_conn_set_error(c, "erasure coding needs a cluster (k + m nodes): this handle is on "
                             "one node without a map");
        return TS_ENOTSUP;
    }
    c->err[0] = '\0';
    rc = ts_name_check(c, name);
    if (rc)
        return rc;
    return ts_cl_dataset_tier(c, c->cl, name, k, m, progress, arg);
}

int tessera_dataset_delete(tessera_client *c, const char *name)
{
    int rc;

    if (!routed(c))
        return ts_conn_dataset_delete(c, name);
    c->err[0] = '\0';
    rc = ts_name_check(c, name);
    if (rc)
        return rc;
    return ts_cl_dataset_delete(c, c->cl, name);
}

/* ---- shards --------------------------------------------------------------------------------- */

int tessera_shard_records(tessera_client *c, const char *name, uint32_t shard, uint64_t **offsets,
                          uint32_t *n)
{
    int rc;

    if (!routed(c))
        return ts_conn_shard_records(c, name, shard, offsets, n);
    if (offsets)
        *offsets = NULL;
    if (n)
        *n = 0;
    rc = ts_enter_out_name(c, offsets && n, name);
    if (rc)
        return rc;
    return ts_cl_shard_records(c, c->cl, name, shard, offsets, n);
}

int tessera_shard_stat(tessera_client *c, const char *name, uint32_t shard,
                       struct ts_shard_info *out)
{
    int rc;

    if (!routed(c))
        return ts_conn_shard_stat(c, name, shard, out);
    rc = ts_enter_out_name(c, out != NULL, name);
    if (rc)
        return rc;
    return ts_cl_shard_stat(c, c->cl, name, shard, out);
}

int tessera_shard_list(tessera_client *c, const char *name, struct ts_shard_info **out, size_t *n)
{
    int rc;

    if (!routed(c))
        return ts_conn_shard_list(c, name, out, n);
    if (out)
        *out = NULL;
    rc = ts_list_begin(c, out != NULL, n);
    if (rc)
        return rc;
    rc = ts_name_check(c, name);
    if (rc)
        return rc;
    return ts_cl_shard_list(c, c->cl, name, out, n);
}

/* ---- uploads and reads ---------------------------------------------------------------------- */

int tessera_put(tessera_client *c, const char *name, uint32_t shard, const void *buf, size_t len,
                const uint64_t *records, uint32_t nrecords)
{
    int rc;

    if (!routed(c))
        return ts_conn_put(c, name, shard, buf, len, records, nrecords);
    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if ((!buf && len) || (!records && nrecords))
        return TS_EINVAL;
    return ts_cl_put(c, c->cl, name, shard, buf, len, records, nrecords, -1, 0);
}

int tessera_put_fd(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size)
{
    int rc;

    if (!routed(c))
        return ts_conn_put_fd(c, name, shard, fd, size);
    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (fd < 0)
        return TS_EINVAL;
    return ts_cl_put(c, c->cl, name, shard, NULL, 0, NULL, 0, fd, size);
}

int tessera_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                 void *buf, size_t *out_len)
{
    int rc;

    if (!routed(c))
        return ts_conn_read(c, name, shard, off, len, buf, out_len);
    if (out_len)
        *out_len = 0;
    rc = ts_enter(c);
    if (rc)
        return rc;
    rc = ts_read_args(c, name, off, len, buf);
    if (rc)
        return rc;
    return ts_cl_read(c, c->cl, name, shard, off, len, buf, out_len);
}

int tessera_read_submit(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *buf, uint64_t *op)
{
    int rc;

    if (!routed(c))
        return ts_conn_read_submit(c, name, shard, off, len, buf, op);
    rc = ts_submit_args(c, name, off, len, buf, op);
    if (rc)
        return rc;
    return ts_cl_read_submit(c, c->cl, name, shard, off, len, buf, op);
}

int ts_client_readv_submit(tessera_client *c, const char *name, struct ts_readv *v, size_t n,
                           uint64_t *op)
{
    int rc;

    if (!routed(c))
        return ts_conn_readv_submit(c, name, v, n, op);
    if (op)
        *op = 0;
    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!op || !v)
        return TS_EINVAL;
    return ts_cl_readv_submit(c, c->cl, name, v, n, op);
}

int ts_client_hint(tessera_client *c, const char *name, const struct ts_readv *v, size_t n,
                   struct ts_hint_result *res)
{
    int rc;

    if (!routed(c))
        return ts_conn_hint(c, name, v, n, res);
    rc = ts_enter_name(c, name);
    return rc ? rc : ts_cl_hint(c->cl, name, v, n, res);
}

void ts_client_route_salt(tessera_client *c, uint64_t salt)
{
    if (routed(c))
        ts_cl_set_salt(c->cl, salt);
}

size_t ts_client_read_lane(tessera_client *c, const char *name, uint32_t shard, uint64_t off)
{
    return routed(c) ? ts_cl_read_lane(c->cl, name, shard, off) : 0;
}

int ts_client_readv_useful(const tessera_client *c)
{
    return routed(c) || !ts_conn_can_place(c);
}

int tessera_wait(tessera_client *c, uint64_t op, size_t *out_len)
{
    if (!routed(c))
        return ts_conn_wait(c, op, out_len);
    if (out_len)
        *out_len = 0;
    c->err[0] = '\0';
    return ts_cl_wait(c, c->cl, op, out_len);
}

int tessera_wait_any(tessera_client *c, uint64_t *op, size_t *out_len)
{
    if (!routed(c))
        return ts_conn_wait_any(c, op, out_len);
    if (op)
        *op = 0;
    if (out_len)
        *out_len = 0;
    c->err[0] = '\0';
    return ts_cl_wait_any(c, c->cl, op, out_len);
}

/* ---- maintenance and administration --------------------------------------------------------- */

int tessera_scrub(tessera_client *c, const char *name, struct ts_scrub_report *rep,
                  void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk,
                             int rc),
                  void *arg)
{
    struct ts_scrub_report tmp;
    int rc;

    if (!routed(c))
        return ts_conn_scrub(c, name, rep, cb, arg);
    rc = ts_scrub_args(c, name, &rep, &tmp);
    if (rc)
        return rc;
    return ts_cl_scrub(c, c->cl, name, rep, cb, arg);
}

int tessera_status(tessera_client *c, char **json)
{
    int rc;

    if (!routed(c))
        return ts_conn_status(c, json);
    if (json)
        *json = NULL;
    rc = ts_enter(c);
    if (rc)
        return rc;
    if (!json)
        return TS_EINVAL;
    return ts_cl_status(c, c->cl, json);
}

int tessera_map_push_file(tessera_client *c, const char *path, uint64_t *new_epoch)
{
    if (new_epoch)
        *new_epoch = 0;
    if (!c || !path)
        return TS_EINVAL;
    ts_conn_set_error(c, "%s", "");
    return ts_cl_map_push_file(c, c->cl, path, new_epoch); /* cl NULL: a single node */
}

int tessera_failover(tessera_client *c, uint32_t pg, uint64_t *new_epoch)
{
    if (new_epoch)
        *new_epoch = 0;
    if (!c)
        return TS_EINVAL;
    ts_conn_set_error(c, "%s", "");
    if (!c->cl) {
        ts_conn_set_error(c, "node %s has no cluster map: nothing to fail over", ts_conn_node(c));
        return TS_EINVAL;
    }
    return ts_cl_failover(c, c->cl, pg, new_epoch);
}
