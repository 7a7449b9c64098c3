/*
 * A replica comparing what it holds of a PG with its primary (scrub, on the maintenance
 * thread): PG_INVENTORY asks the primary for its applied position and the inventory of the
 * datasets that keep a replica at our rank; when the positions agree and the inventories do
 * not, this node lost shards its log does not know about (a damaged store) and asks the
 * primary for a backfill (PG_PULL with re-check 2), which streams exactly what is missing.
 */
#include "repl_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define FAC "repl"

struct inv_call {
    ts_repl *r;
    uint32_t pg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
    struct ts_repl_inventory out;
    struct ts_map *map; /* the map the rank was taken from (its hot datasets) */
};

static void inv_put(struct inv_call *c)
{
    int last;

    pthread_mutex_lock(&c->mu);
    last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        ts_map_free(c->map);
        free(c);
    }
}

static void inv_finish(struct inv_call *c, int rc)
{
    pthread_mutex_lock(&c->mu);
    c->rc = rc;
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    inv_put(c);
}

static void inv_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct inv_call *c = ctx;

    if (!status) {
        c->out.primary_applied = ts_rd_u64(body);
        c->out.primary_count = ts_rd_u64(body);
        c->out.primary_digest = ts_rd_u64(body);
        if (body->err)
            status = TS_EPROTO;
    }
    inv_finish(c, status);
}

/* On the replication thread: the PG's primary and our rank in its placement, then the query. */
static void inv_send(evutil_socket_t fd, short what, void *arg)
{
    struct inv_call *c = arg;
    ts_repl *r = c->r;
    int order[TS_MAP_MAX_NODES], n, rank = -1;
    struct ts_wr w;

    if (!r->map || c->pg >= r->map->pg_count) {
        inv_finish(c, TS_EINVAL);
        return;
    }
    n = ts_map_pg_order(r->map, c->pg, order, TS_MAP_MAX_NODES);
    for (int i = 0; i < n; i++)
        if (order[i] == r->self)
            rank = i;
    if (rank <= 0) { /* we lead it, or hold no placement of it */
        inv_finish(c, rank == 0 ? TS_EEXIST : TS_ENOENT);
        return;
    }
    c->out.rank = rank;
    c->map = ts_map_dup(r->map);
    if (!c->map) {
        inv_finish(c, TS_ENOMEM);
        return;
    }
    snprintf(c->out.primary, sizeof(c->out.primary), "%s", r->map->nodes[order[0]].id);
    ts_wr_init(&w);
    ts_wr_begin_frame(&w);
    ts_wr_u32(&w, c->pg);
    ts_wr_u8(&w, (uint8_t)rank);
    repl_peer_send(r, c->out.primary, TS_OP_PG_INVENTORY, &w, NULL, 0, NULL, NULL, inv_reply, c, 0);
}

int ts_repl_inventory_check(ts_repl *r, uint32_t pg, int timeout_ms, struct ts_repl_inventory *out)
{
    struct inv_call *c = calloc(1, sizeof(*c));
    struct timespec until;
    int rc = 0;

    memset(out, 0, sizeof(*out));
    if (!c)
        return TS_ENOMEM;
    c->r = r;
    c->pg = pg;
    c->refs = 2; /* ours and the reply's: a late reply after our timeout frees it */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    if (event_base_once(r->base, -1, EV_TIMEOUT, inv_send, c, NULL) != 0) {
        c->refs = 1;
        inv_put(c);
        return TS_ENOMEM;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->done && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &until);
    if (c->done) {
        *out = c->out;
        rc = c->rc;
    } else {
        rc = TS_ETIMEDOUT;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        inv_put(c);
        return rc;
    }
    {
        struct ts_repl_hot_arg ha = {c->map, pg};
        if (ts_store_pg_applied(r->o.store, pg, &out->applied, &(uint64_t){0}) != 0 ||
            ts_store_pg_inventory(r->o.store, pg, c->map->pg_count, out->rank, ts_repl_hot_extra_cb,
                                  &ha, &out->count, &out->digest) != 0)
            rc = TS_EIO;
    }
    inv_put(c);
    return rc;
}
