/*
 * PG_DROP (admin): the end of a rebalance's move of a PG (docs/operations.md "Rebalancing"):
 * this node deletes its copies of the PG's shards of every dataset it is no longer a replica
 * of under the current map. `tessera hot rm` sends it too (a hot dataset's extra replicas go). It
 * judges that itself: a dataset it still holds a rank in (its core + fringe, an incoming node of a
 * moving PG included) keeps its shards, and a PG that a rebalance has not settled yet is refused
 * with TS_EBUSY. The rebalance calls it once the PG's new replicas are caught up; a copy dropped
 * too early would come back by backfill if the map moved the PG here again.
 */
#include "ops_internal.h"

#include "ts_map.h"
#include "ts_repl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAC "server"

struct drop_item {
    char dataset[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t size;
};

struct drop_acc {
    struct tsd_server *s;
    int rank;
    struct ts_map *map; /* a copy of the node's map: its hot datasets */
    uint32_t pg;
    const char *only; /* a dataset name, or "" for every dataset */
    struct drop_item *v;
    size_t n, cap;
    int rc;
};

static int drop_collect_cb(void *arg, const char *dataset, const struct ts_shard_info *si)
{
    struct drop_acc *a = arg;
    struct ts_dataset_info d;
    struct drop_item *it;

    if ((a->only[0] && strcmp(a->only, dataset) != 0) ||
        ts_store_dataset_get(a->s->store, dataset, &d) != 0)
        return 0;
    if (a->rank >= 0 && a->rank < (int)d.policy.core + d.policy.fringe +
                                      (int)ts_map_hot_extra(a->map, dataset, a->pg))
        return 0; /* still a replica of this dataset here (a hot dataset's extras count) */
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        struct drop_item *v = realloc(a->v, cap * sizeof(*v));
        if (!v) {
            a->rc = TS_ENOMEM;
            return TS_ENOMEM;
        }
        a->v = v;
        a->cap = cap;
    }
    it = &a->v[a->n++];
    snprintf(it->dataset, sizeof(it->dataset), "%s", dataset);
    it->shard = si->shard;
    it->size = si->size;
    return 0;
}

void tsd_op_pg_drop(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    uint32_t pg = q->u.pg_drop.pg;
    struct drop_acc a = {.s = s, .only = q->u.pg_drop.dataset};
    uint64_t epoch;
    uint64_t bytes = 0;
    uint32_t removed = 0, npg;
    struct ts_wr w;
    int state, rc;

    pthread_rwlock_rdlock(&s->map_lock);
    if (!s->map || pg >= s->map->pg_count) {
        pthread_rwlock_unlock(&s->map_lock);
        tsd_reply_error(c, h, TS_EINVAL, "pg-drop %u: %s", pg,
                        s->map ? "no such PG" : "this node is not in a cluster");
        return;
    }
    npg = s->map->pg_count;
    state = ts_map_pg_move_state(s->map, pg);
    a.rank = ts_repl_rank_of(s->map, pg, s->cfg->node_id);
    a.map = ts_map_dup(s->map);
    a.pg = pg;
    epoch = s->map->epoch;
    pthread_rwlock_unlock(&s->map_lock);
    if (!a.map) {
        tsd_reply_error(c, h, TS_ENOMEM, "pg-drop %u: out of memory", pg);
        return;
    }
    if (state != TS_PG_SETTLED) {
        ts_map_free(a.map);
        tsd_reply_error(c, h, TS_EBUSY, "pg-drop %u: a rebalance has not moved the PG yet", pg);
        return;
    }
    rc = ts_store_pg_iter(s->store, pg, npg, drop_collect_cb, &a);
    if (!rc)
        rc = a.rc;
    ts_map_free(a.map);
    if (!rc && atomic_load(&s->epoch) != epoch) {
        /* A map change since the ranks were read may have given this node a rank again. */
        free(a.v);
        tsd_reply_error(c, h, TS_EBUSY, "pg-drop %u: the map changed meanwhile: ask again", pg);
        return;
    }
    for (size_t i = 0; !rc && i < a.n; i++) {
        int drc = ts_store_shard_delete(s->store, a.v[i].dataset, a.v[i].shard);
        if (drc == 0) {
            removed++;
            bytes += a.v[i].size;
        } else if (drc != TS_ENOENT) {
            rc = drc;
        }
    }
    free(a.v);
    if (rc) {
        tsd_reply_error(c, h, rc, "pg-drop %u: %s (%u shards removed)", pg, ts_strerror(rc),
                        removed);
        return;
    }
    if (removed)
        TS_INFO(FAC, "PG %u: dropped %u shards (%llu bytes) this node no longer holds a rank for",
                pg, removed, (unsigned long long)bytes);
    tsd_reply_begin(&w);
    ts_wr_u32(&w, removed);
    ts_wr_u64(&w, bytes);
    tsd_reply_send(c, h, &w);
}
