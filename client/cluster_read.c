/*
 * libtessera in cluster mode: reads. tessera_read goes to one replica (ts_conn_read on its
 * sub-connection) and moves on to the next on a failure another replica may not have;
 * submitted reads (tessera_read_submit) are kept by the router (struct cop), resubmitted to
 * another replica when theirs fails, and collected by tessera_wait / tessera_wait_any across
 * the sub-connections (ts_conn_wait, ts_conns_wait). Also what the router says of the reads
 * it served (ts_cl_served, ts_cl_resubmits).
 */
#include "cluster_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reads ---------------------------------------------------------------------------------- */

int ts_cl_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
               uint64_t off, size_t len, void *buf, size_t *out_len)
{
    struct sel s;
    tessera_client *sub;
    size_t p;
    int rc, fragmented = 0;

    ts_cl_sel_init(cl, &s, name, shard, off, 1);
    for (;;) {
        rc = ts_cl_sel_next(cl, &s, name, shard, off, &p, &sub);
        if (rc)
            return rc;
        if (ts_cl_ec_try_read(c, cl, name, shard, off, len, buf, out_len, sub, p, &rc))
            return rc;
        rc = ts_conn_read(sub, name, shard, off, len, buf, out_len);
        if (!rc) {
            ts_cl_check(cl, p);
            return 0;
        }
        if (rc == TS_EFRAGMENTED && !fragmented++) {
            /* Tiered since its policy was cached: asked again, the read goes to the fragments. */
            ts_cl_policy_forget(cl, name);
            ts_cl_sel_init(cl, &s, name, shard, off, 1);
            continue;
        }
        if (!ts_cl_sel_retry(cl, &s, p, sub, rc, name, shard, off))
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
    k->next_free = cl->free_cops;
    cl->free_cops = k;
}

/* Sends read k to the next replica that takes it; else k's final error. */
static int cop_submit(struct ts_cluster *cl, struct cop *k)
{
    tessera_client *sub;
    size_t p;
    int rc;

    for (;;) {
        rc = ts_cl_sel_next(cl, &k->sel, k->name, k->shard, k->off, &p, &sub);
        if (rc)
            return rc;
        if (k->rv)
            rc = ts_conn_readv_submit(sub, k->name, k->rv, k->nrv, &k->sub_op);
        else
            rc = ts_conn_read_submit(sub, k->name, k->shard, k->off, k->len, k->buf, &k->sub_op);
        if (!rc) {
            k->inflight = 1;
            k->retry = 0;
            k->peer = p;
            cl->peers[p].reads++;
            return 0;
        }
        if (!ts_cl_sel_retry(cl, &k->sel, p, sub, rc, k->name, k->shard, k->off) || k->rv)
            return rc;
    }
}

/* A finished read k: resubmitted to another replica if it should be (0), else final (1). */
static int cop_settle(struct ts_cluster *cl, struct cop *k)
{
    int rc;

    if (k->inflight)
        return 0;
    if (k->rc == TS_EFRAGMENTED) {
        ts_cl_policy_forget(cl, k->name); /* tiered since its policy was cached */
        ts_cl_ec_cop(cl, k);
        return 1;
    }
    if (!k->rc || !k->retry)
        return 1;
    cl->resubmits++;
    rc = cop_submit(cl, k);
    if (!rc)
        return 0;
    k->rc = rc;
    k->retry = 0;
    free(k->msg);
    k->msg = strdup(ts_conn_error(cl->c));
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
        ts_cl_err(cl, "%s", k->msg);
    if (!rc)
        cl->served = k->peer;
    cop_remove(cl, at);
    return rc;
}

/* A new read (cop) for the router's list, from its free list; TS_ENOMEM. */
static struct cop *cop_new(struct ts_cluster *cl, const char *name, uint32_t shard, uint64_t off)
{
    struct cop **v, *k;

    v = ts_grow(cl->cops, cl->ncops, &cl->capcops, sizeof(*v), 64);
    if (!v)
        return NULL;
    cl->cops = v;
    k = cl->free_cops; /* a read is submitted per small record: no calloc, no printf */
    if (k)
        cl->free_cops = k->next_free;
    else if (!(k = malloc(sizeof(*k))))
        return NULL;
    size_t nlen = strnlen(name, sizeof(k->name) - 1);
    k->inflight = k->retry = k->rc = 0;
    k->peer = 0;
    k->sub_op = 0;
    k->got = 0;
    k->msg = NULL;
    memcpy(k->name, name, nlen);
    k->name[nlen] = '\0';
    k->shard = shard;
    k->off = off;
    k->len = 0;
    k->buf = NULL;
    k->rv = NULL;
    k->nrv = 0;
    ts_cl_sel_init(cl, &k->sel, name, shard, off, 1);
    return k;
}

/* Sends k and lists it (its id in *op); on failure k is freed. */
static int cop_start(struct ts_cluster *cl, struct cop *k, uint64_t *op)
{
    int rc = ts_cl_ec_dropped(cl, k->name) ? ts_cl_ec_cop(cl, k) : cop_submit(cl, k);

    if (rc) {
        free(k);
        return rc;
    }
    k->id = cl->next_op++;
    cl->cops[cl->ncops++] = k;
    *op = k->id;
    return 0;
}

int ts_cl_read_submit(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                      uint64_t off, size_t len, void *buf, uint64_t *op)
{
    struct cop *k = cop_new(cl, name, shard, off);

    if (!k)
        return TS_ENOMEM;
    k->len = len;
    k->buf = buf;
    return cop_start(cl, k, op);
}

int ts_cl_readv_submit(tessera_client *c, struct ts_cluster *cl, const char *name,
                       struct ts_readv *v, size_t n, uint64_t *op)
{
    struct cop *k;

    if (n == 0)
        return TS_EINVAL;
    k = cop_new(cl, name, v[0].shard, v[0].off);
    if (!k)
        return TS_ENOMEM;
    k->rv = v;
    k->nrv = n;
    return cop_start(cl, k, op);
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
            ts_cl_cop_collect(cl, k);
        if (cop_settle(cl, k))
            break;
    }
    return cop_result(cl, at, NULL, out_len);
}

int ts_cl_wait_any(tessera_client *c, struct ts_cluster *cl, uint64_t *op, size_t *out_len)
{
    tessera_client *few[64], **v = few; /* on the heap only for a map of many nodes */
    size_t nv;
    int rc;

    if (cl->ncops == 0)
        return TS_ENOENT;
    for (;;) {
        for (size_t i = 0; i < cl->ncops; i++)
            if (cop_settle(cl, cl->cops[i]))
                return cop_result(cl, i, op, out_len);
        if (cl->npeers > TS_ARRAY_SIZE(few) && !(v = calloc(cl->npeers, sizeof(*v))))
            return TS_ENOMEM;
        nv = 0;
        for (size_t p = 0; p < cl->npeers; p++)
            if (cl->peers[p].reads && cl->peers[p].conn)
                v[nv++] = cl->peers[p].conn;
        rc = ts_conns_wait(v, nv, cl->timeout_ms);
        if (v != few)
            free(v);
        v = few;
        if (rc)
            return rc == TS_ENOENT ? TS_EINTERNAL : rc;
        for (size_t i = 0; i < cl->ncops; i++) {
            struct cop *k = cl->cops[i];
            if (k->inflight && ts_conn_op_done(cl->peers[k->peer].conn, k->sub_op) == 1)
                ts_cl_cop_collect(cl, k);
        }
    }
}

const char *ts_cl_served(const struct ts_cluster *cl)
{
    return cl->served < cl->npeers ? cl->peers[cl->served].id : "";
}

uint64_t ts_cl_resubmits(const struct ts_cluster *cl)
{
    return cl->resubmits;
}

void ts_cl_batch(struct ts_cluster *cl, const struct ts_batch *b)
{
    cl->batch = *b;
    for (size_t p = 0; p < cl->npeers; p++)
        if (cl->peers[p].conn)
            ts_conn_batch(cl->peers[p].conn, b);
}
