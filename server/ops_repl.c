/*
 * Node-to-node handlers: replication from a PG's primary (REPL_WRITE, REPL_SEAL), log
 * comparison (PG_INFO), peering (PG_QUERY, PG_ACTIVATE, PG_PULL) and maps (MAP_GET,
 * MAP_PUSH). docs/protocol.md specifies the payloads; docs/architecture.md "Peering" why.
 *
 * Fencing: a PG's replication and peering frames from an epoch older than the one this node
 * promised for that PG (to a newer primary's peering) are refused with TS_ESTALE, so a deposed
 * primary cannot get a write acknowledged, whatever map the nodes hold.
 */
#include "ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAIL_MAX 32

/*
 * A node (named in its HELLO) replicating a PG must be that PG's primary in our map, or the node
 * we pull the PG's log from while peering (a pull that outlived our PULL state is refused, which
 * ends it). REPL_WRITE and REPL_SEAL carry our map's epoch (conn.c); PG_PULL may carry another
 * (a newer peering primary's, whose map we have not yet): judged by the promise alone.
 */
static int sender_may_replicate(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t pg)
{
    struct tsd_server *s = c->w->srv;
    const char *id = c->node_id; /* REPL_* and PG_* need role node: its certificate's node */
    int order[1], ok = 1;

    if (h->opcode == TS_OP_PG_PULL && h->epoch != atomic_load(&s->epoch))
        return 1;
    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map && ts_map_pg_order(s->map, pg, order, 1) == 1)
        ok = !strcmp(s->map->nodes[order[0]].id, id);
    pthread_rwlock_unlock(&s->map_lock);
    return ok || ts_repl_pulling_from(s->repl, pg, id);
}

/* Replies TS_ESTALE and returns 1 when the frame's epoch is below the PG's promise here. */
static int fenced(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t pg, const char *what)
{
    struct ts_pg_state st;
    int rc = ts_store_pg_state(c->w->srv->store, pg, &st);

    tsd_peer_map_check(c, h);
    if (rc) {
        tsd_reply_error(c, h, rc, "%s PG %u: cannot read the PG's state: %s", what, pg,
                        ts_strerror(rc));
        return 1;
    }
    if (h->epoch < st.promised) {
        tsd_reply_stale(c, h,
                        "%s PG %u at epoch %llu refused: this node promised epoch %llu to a "
                        "newer primary of the PG",
                        what, pg, (unsigned long long)h->epoch, (unsigned long long)st.promised);
        return 1;
    }
    if (!sender_may_replicate(c, h, pg)) {
        tsd_reply_error(c, h, TS_EPERM,
                        "%s PG %u: %s is not the PG's primary in epoch %llu (nor a node this one "
                        "pulls from)",
                        what, pg, c->node_id, (unsigned long long)h->epoch);
        return 1;
    }
    return 0;
}

_Static_assert(TSD_PG_MAX_ACTING == TS_PG_MAX_ACTING,
               "PG_ACTIVATE's decoder bounds the acting set");

/* ---- replication from a PG primary ------------------------------------------------------ */

void tsd_op_repl_write(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const struct tsd_req_repl_write *a = &q->u.repl_write;
    const char *name = a->name;
    const struct tsd_chunk *k = &a->chunk;
    uint32_t shard = k->shard;
    struct tsd_upload *u;
    int rc;

    if (fenced(c, h, tsd_pg_of(s, name, shard), "repl-write"))
        return;
    rc = ts_store_dataset_ensure(s->store, name, &a->policy, a->inc);
    if (rc == TS_ESTALE) {
        tsd_reply_error(c, h, rc, "repl-write %s/%u: this node holds a newer incarnation of %s",
                        name, shard, name);
        return;
    }
    if (rc == 0 && a->policy.ec_dropped)
        rc = ts_store_dataset_follow_dropped(s->store, name, a->policy.ec_k, a->policy.ec_m);
    if (rc) {
        ops_reply_store_error(c, h, rc, name, shard);
        return;
    }
    if (ops_local_write(c, h, name, shard, k->idx, k->size, k->crc, k->len, k->data, &u))
        return;
    ops_reply_write_ok(c, h, k->idx, ts_shard_writer_bytes(u->w));
}

static void reply_applied(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t pg)
{
    uint64_t applied = 0;
    struct ts_wr w;

    ts_store_pg_applied(c->w->srv->store, pg, &applied, NULL);
    tsd_reply_begin(&w);
    ts_wr_u64(&w, applied);
    tsd_reply_send(c, h, &w);
}

/* SEAL / BACKFILL: seal the shard uploaded on this connection, or log one that is here. */
static int apply_seal(struct tsd_conn *c, int kind, const char *name, uint32_t shard,
                      const struct ts_dataset_policy *p, int have_crc, uint32_t crc,
                      const uint64_t *recs, uint32_t nrec, struct ts_log_rec *log)
{
    struct tsd_server *s = c->w->srv;
    struct ts_shard_info si;
    struct tsd_upload *u;
    int rc = ts_store_dataset_ensure(s->store, name, p, log->inc);

    if (rc == TS_ESTALE && kind == TS_REPL_SEAL) {
        /* That incarnation of the dataset was deleted here (or replaced by a newer one) since
         * the primary logged this seal: holding nothing of it is right. Log the entry, so the
         * log stays the primary's, and drop any upload of it on this connection. */
        if ((u = ops_upload_find(c, name, shard))) {
            ts_shard_writer_abort(u->w);
            ops_upload_remove(c, u);
        }
        log->type = TS_LOG_SEAL;
        log->crc = crc;
        rc = ts_store_log_append(s->store, log);
        if (rc == 0)
            TS_INFO(FAC, "PG %u entry %llu: %s/%u of a deleted incarnation of %s: logged only",
                    log->pg, (unsigned long long)log->seq, name, shard, name);
        return rc;
    }
    if (rc == TS_ESTALE)
        return TS_EEXIST; /* backfill of a deleted incarnation: nothing to hold */
    if (rc)
        return rc;
    u = ops_upload_find(c, name, shard);
    if (u) {
        rc = kind == TS_REPL_SEAL ? ts_shard_writer_seal_log(u->w, have_crc, crc, recs, nrec, log)
                                  : ts_shard_writer_seal(u->w, have_crc, crc, recs, nrec);
        if (rc == 0 || rc == TS_EEXIST || rc == TS_ERANGE) {
            if (rc)
                ts_shard_writer_abort(u->w);
            ops_upload_remove(c, u);
        }
        return rc;
    }
    /* No upload: fine if the shard is already here, complete and identical. */
    rc = ts_store_shard_stat(s->store, name, shard, &si);
    if (rc == TS_ENOENT || (rc == 0 && si.state != TS_SHARD_COMPLETE))
        return TS_EINCOMPLETE;
    if (rc)
        return rc;
    if (have_crc && si.crc != crc) {
        TS_ERROR(FAC, TS_ECORRUPT, "%s/%u here has CRC %08x, the primary's %08x", name, shard,
                 si.crc, crc);
        return TS_ECORRUPT;
    }
    if (kind != TS_REPL_SEAL)
        return TS_EEXIST;
    log->type = TS_LOG_SEAL;
    log->size = si.size;
    log->crc = si.crc;
    log->nchunks = si.nchunks;
    return ts_store_log_append(s->store, log);
}

struct prune_arg {
    char (*names)[TS_NAME_MAX + 1];
    uint64_t *incs;
    uint8_t *dead;
    size_t n;
    char (*gone)[TS_NAME_MAX + 1];
    uint64_t *gone_inc; /* the incarnation of each that was judged */
    size_t ngone, capgone;
};

/* A local dataset goes when the primary deleted that incarnation (or a newer one), or holds a
 * newer incarnation of the name; one the primary does not know at all stays (it may have been
 * created while the primary was away). */
static int prune_collect_cb(void *arg, const struct ts_dataset_info *d)
{
    struct prune_arg *a = arg;
    int drop = 0;

    for (size_t i = 0; i < a->n && !drop; i++)
        if (!strcmp(a->names[i], d->name))
            drop = a->dead[i] ? a->incs[i] >= d->created_ns : a->incs[i] > d->created_ns;
    if (!drop)
        return 0;
    if (a->ngone == a->capgone) {
        size_t cap = a->capgone ? 2 * a->capgone : 8;
        void *g = realloc(a->gone, cap * sizeof(*a->gone));
        if (!g)
            return TS_ENOMEM;
        a->gone = g;
        g = realloc(a->gone_inc, cap * sizeof(*a->gone_inc));
        if (!g)
            return TS_ENOMEM;
        a->gone_inc = g;
        a->capgone = cap;
    }
    a->gone_inc[a->ngone] = d->created_ns;
    snprintf(a->gone[a->ngone++], sizeof(a->gone[0]), "%s", d->name);
    return 0;
}

/* DELETE: the dataset incarnation log->inc was deleted; ours goes too if it is that one or
 * older; then the entry is logged like any other. */
static int apply_delete(struct tsd_server *s, struct ts_log_rec *log)
{
    struct ts_dataset_info d;
    int rc = ts_store_dataset_get(s->store, log->dataset, &d);

    if (rc == 0 && d.created_ns <= log->inc) {
        /* decided by the primary; only that incarnation or an older one (one re-created by
         * another thread since is newer and stays) */
        rc = ts_store_dataset_delete_upto(s->store, log->dataset, log->inc, 1);
        if (rc == 0)
            TS_INFO(FAC, "dataset %s (incarnation %llu) deleted through PG %u's log", log->dataset,
                    (unsigned long long)d.created_ns, log->pg);
    }
    if (rc == TS_ENOENT || rc == TS_ESTALE)
        rc = 0;
    if (rc)
        return rc;
    log->type = TS_LOG_DELETE;
    return ts_store_log_append(s->store, log);
}

/* PRUNE: the primary's datasets and tombstones (u32 n, n x (name, u64 incarnation, u8 deleted)),
 * sent before it backfills this node: the deletes it knows of are no longer in its log. */
static void apply_prune(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t pg,
                        const struct tsd_prune_list *l)
{
    struct tsd_server *s = c->w->srv;
    struct prune_arg a = {0};
    uint32_t n = l->n;
    size_t off = 0;

    a.names = calloc(n ? n : 1, sizeof(*a.names));
    a.incs = calloc(n ? n : 1, sizeof(*a.incs));
    a.dead = calloc(n ? n : 1, 1);
    if (!a.names || !a.incs || !a.dead) {
        free(a.names);
        free(a.incs);
        free(a.dead);
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        struct tsd_prune_entry e;
        off = tsd_prune_entry_at(l, off, &e);
        memcpy(a.names[i], e.name, sizeof(a.names[i]));
        a.incs[i] = e.inc;
        a.dead[i] = e.deleted;
    }
    a.n = n;
    ts_store_dataset_list(s->store, prune_collect_cb, &a);
    for (size_t i = 0; i < a.ngone; i++) {
        /* Only the incarnation judged: another thread may have re-created the name since
         * (a newer incarnation arriving through another PG), and that one stays. */
        int rc = ts_store_dataset_delete_upto(s->store, a.gone[i], a.gone_inc[i], 1);
        if (rc == 0)
            TS_WARN(FAC, 0,
                    "dataset %s (incarnation %llu) was deleted while this node was away (PG %u "
                    "backfill)",
                    a.gone[i], (unsigned long long)a.gone_inc[i], pg);
        else if (rc == TS_ESTALE)
            TS_INFO(FAC,
                    "dataset %s: incarnation %llu was deleted while this node was away; a newer "
                    "one has arrived since and stays",
                    a.gone[i], (unsigned long long)a.gone_inc[i]);
        else if (rc != TS_ENOENT)
            TS_WARN(FAC, rc, "dataset %s: deleted while this node was away, not removable now",
                    a.gone[i]);
    }
    ops_reply_ok(c, h);
    free(a.names);
    free(a.incs);
    free(a.dead);
    free(a.gone);
    free(a.gone_inc);
}

void tsd_op_repl_seal(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const struct tsd_req_repl_seal *a = &q->u.repl_seal;
    const char *name = a->name; /* "" for the kinds without one */
    struct ts_log_rec log;
    uint64_t seq = a->seq, epoch = a->epoch, *recs = NULL;
    uint32_t pg = a->pg, shard = a->shard;
    uint8_t kind = a->kind;
    unsigned removed = 0;
    int rc;

    if (kind == TS_REPL_ABORT) {
        /* The primary's upload of (name, shard) ended: so does ours, from this connection. */
        struct tsd_upload *u;
        if ((u = ops_upload_find(c, name, shard))) {
            ts_shard_writer_abort(u->w);
            ops_upload_remove(c, u);
        }
        ops_reply_ok(c, h);
        return;
    }
    if (kind == TS_REPL_PRUNE) {
        if (!fenced(c, h, pg, "repl-seal"))
            apply_prune(c, h, pg, &a->prune);
        return;
    }
    if (fenced(c, h, pg, "repl-seal"))
        return;
    memset(&log, 0, sizeof(log));
    log.pg = pg;
    log.seq = seq;
    log.epoch = epoch;
    log.fence = h->epoch; /* the promise is checked again with the append, under its lock */
    snprintf(log.dataset, sizeof(log.dataset), "%s", name);
    log.policy = a->policy;
    log.inc = a->inc;
    log.shard = shard;
    switch (kind) {
    case TS_REPL_NOOP:
        log.type = TS_LOG_NOOP;
        rc = ts_store_log_append(s->store, &log);
        break;
    case TS_REPL_SET_APPLIED: /* the end of a backfill */
        rc = ts_store_pg_set_applied(s->store, pg, seq, epoch, h->epoch);
        if (rc == 0)
            tsd_pg_backfilled(s, pg);
        break;
    case TS_REPL_TRUNCATE:
        rc = ts_store_pg_truncate(s->store, pg, seq, epoch, h->epoch, &removed);
        if (rc == 0)
            tsd_pg_mark_clean(s, pg, 0); /* unconfirmed again until its primary says so */
        if (rc == 0)
            TS_WARN(FAC, 0,
                    "PG %u: log rolled back to %llu by %s at epoch %llu (%u shards removed)", pg,
                    (unsigned long long)seq, c->node_id, (unsigned long long)h->epoch, removed);
        if (rc == TS_EPERM) {
            tsd_reply_error(c, h, rc,
                            "repl-seal PG %u: rolling back to %llu refused: this node holds "
                            "entries newer than epoch %llu",
                            pg, (unsigned long long)seq, (unsigned long long)h->epoch);
            return;
        }
        break;
    case TS_REPL_DELETE:
        rc = apply_delete(s, &log);
        break;
    case TS_REPL_CLEAN: {
        /* Only if this node holds exactly the log the primary says it holds. */
        struct ts_pg_state st;
        rc = ts_store_pg_state(s->store, pg, &st);
        if (rc == 0 && (st.applied != seq || st.head_epoch != epoch))
            rc = TS_ERANGE;
        if (rc == 0 && tsd_pg_needs_backfill(s, pg))
            rc = TS_EBUSY; /* it joined the PG's replicas: a backfill first (PG_INFO says so) */
        if (rc == 0)
            rc = tsd_pg_mark_clean(s, pg, 1);
        break;
    }
    case TS_REPL_SEAL:
    case TS_REPL_BACKFILL:
        if (ops_records(c, h, &a->records, &recs))
            return;
        rc = apply_seal(c, kind, name, shard, &a->policy, a->have_crc, a->crc, recs, a->records.n,
                        &log);
        free(recs);
        break;
    default:
        rc = TS_EPROTO;
    }
    if (rc == 0 || rc == TS_EEXIST) /* EEXIST: this very entry is here already */
        reply_applied(c, h, pg);
    else if (rc == TS_ESTALE)
        tsd_reply_stale(c, h,
                        "repl-seal PG %u at epoch %llu: a newer primary's peering got here "
                        "first",
                        pg, (unsigned long long)h->epoch);
    else if (rc == TS_EINCOMPLETE)
        tsd_reply_error(c, h, rc, "repl-seal %s/%u: this replica lacks its chunks", name, shard);
    else if (rc == TS_ERANGE)
        tsd_reply_error(
            c, h, rc,
            "repl-seal PG %u entry (%llu, %llu): not the next entry of this log (a gap, "
            "or a different entry holds it)",
            pg, (unsigned long long)epoch, (unsigned long long)seq);
    else
        ops_reply_store_error(c, h, rc, name[0] ? name : "(log)", shard);
}

/* ---- log comparison and peering ---------------------------------------------------------- */

void tsd_op_pg_info(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct ts_log_pos tail[TAIL_MAX];
    struct ts_pg_state st;
    uint64_t applied = 0, oldest = 0;
    uint32_t pg = q->u.pg_info.pg;
    size_t ntail = 0;
    struct ts_wr w;
    int rc;

    tsd_peer_map_check(c, h);
    rc = ts_store_pg_applied(c->w->srv->store, pg, &applied, &oldest);
    if (!rc)
        rc = ts_store_pg_state(c->w->srv->store, pg, &st);
    if (!rc)
        rc = ts_store_pg_log_tail(c->w->srv->store, pg, tail, TAIL_MAX, &ntail);
    if (rc) {
        tsd_reply_error(c, h, rc, "pg-info %u: %s", pg, ts_strerror(rc));
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_u64(&w, applied);
    ts_wr_u64(&w, oldest);
    ts_wr_u64(&w, st.head_epoch);
    ts_wr_u64(&w, st.promised);
    ts_wr_u64(&w, st.les);
    ts_wr_u32(&w, (uint32_t)ntail);
    for (size_t i = 0; i < ntail; i++) {
        ts_wr_u64(&w, tail[i].seq);
        ts_wr_u64(&w, tail[i].epoch);
    }
    ts_wr_u8(&w, (uint8_t)tsd_pg_needs_backfill(c->w->srv, pg)); /* joined: backfill me */
    tsd_reply_send(c, h, &w);
}

/*
 * A promise for epoch E goes only to the PG's primary in this node's map of epoch E: with an
 * older map here the asker is told to wait (peering asks again once the map arrived, from etcd
 * or a push), and an asker that is not the primary of the map this node holds at E is refused.
 * So two nodes that hold different maps for one epoch (issue 29) can never both gather this
 * node's promise; with the map in etcd no two maps share an epoch at all.
 */
static int promise_admissible(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t pg,
                              uint64_t epoch, const char *from)
{
    struct tsd_server *s = c->w->srv;
    const char *asker = c->node_id[0] ? c->node_id : from;
    char primary[sizeof(s->map->nodes[0].id)] = "";
    uint64_t mine = 0;
    int order[1];

    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map) {
        mine = s->map->epoch;
        if (ts_map_pg_order(s->map, pg, order, 1) == 1)
            snprintf(primary, sizeof(primary), "%s", s->map->nodes[order[0]].id);
    }
    pthread_rwlock_unlock(&s->map_lock);
    if (!mine || epoch < mine)
        return 1; /* no map (a lone node), or an older epoch: the promise decides (stale) */
    if (epoch > mine) {
        tsd_reply_error(c, h, TS_EBUSY,
                        "pg-query PG %u from %s at epoch %llu: this node holds the map of epoch "
                        "%llu, not yet that one",
                        pg, asker, (unsigned long long)epoch, (unsigned long long)mine);
        return 0;
    }
    if (strcmp(primary, asker)) {
        tsd_reply_error(c, h, TS_EPERM,
                        "pg-query PG %u from %s at epoch %llu: the PG's primary in this node's "
                        "map of that epoch is %s",
                        pg, asker, (unsigned long long)epoch, primary[0] ? primary : "nobody");
        return 0;
    }
    return 1;
}

void tsd_op_pg_query(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct ts_pg_state st;
    uint32_t pg = q->u.pg_query.pg;
    uint64_t epoch = q->u.pg_query.epoch;
    const char *from = q->u.pg_query.from;
    struct ts_wr w;
    int rc;

    tsd_peer_map_check(c, h);
    if (!promise_admissible(c, h, pg, epoch, from))
        return;
    rc = ts_store_pg_promise(c->w->srv->store, pg, epoch, &st);
    if (rc == TS_ESTALE) {
        tsd_reply_stale(c, h, "pg-query PG %u from %s at epoch %llu: epoch %llu was promised here",
                        pg, from, (unsigned long long)epoch, (unsigned long long)st.promised);
        return;
    }
    if (rc) {
        tsd_reply_error(c, h, rc, "pg-query PG %u: %s", pg, ts_strerror(rc));
        return;
    }
    tsd_reply_begin(&w);
    ts_repl_wr_pg_state(&w, &st);
    ts_wr_u8(&w, (uint8_t)tsd_pg_needs_backfill(c->w->srv, pg)); /* lacks shards */
    tsd_reply_send(c, h, &w);
}

void tsd_op_pg_activate(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_pg_activate *a = &q->u.pg_activate;
    uint32_t pg = a->pg;
    uint64_t epoch = a->epoch;
    struct ts_wr w;
    int rc, recorded = 0;

    tsd_peer_map_check(c, h);
    if (a->phase == 1) {
        /* The interval started: a fact; older than what this node knows changes nothing. */
        rc = ts_store_pg_commit(c->w->srv->store, pg, epoch, a->wq, a->acting, a->n);
        if (rc)
            tsd_reply_error(c, h, rc, "pg-activate PG %u (commit): %s", pg, ts_strerror(rc));
        else
            ops_reply_ok(c, h);
        return;
    }
    rc = ts_store_pg_prepare(c->w->srv->store, pg, epoch, a->wq, a->acting, a->n, a->member,
                             a->head_epoch, a->head_seq, &recorded);
    if (rc == TS_ESTALE) {
        tsd_reply_stale(c, h, "pg-activate PG %u at epoch %llu: a newer epoch was promised here",
                        pg, (unsigned long long)epoch);
        return;
    }
    if (rc) {
        tsd_reply_error(c, h, rc, "pg-activate PG %u: %s", pg, ts_strerror(rc));
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_u8(&w, (uint8_t)recorded);
    tsd_reply_send(c, h, &w);
}

void tsd_op_pg_pull(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    uint32_t pg = q->u.pg_pull.pg;
    uint64_t epoch = q->u.pg_pull.epoch;
    const char *node = q->u.pg_pull.node;
    uint8_t recheck = q->u.pg_pull.recheck;

    if (!s->repl || !node[0]) {
        tsd_reply_error(c, h, TS_EINVAL, "pg-pull: this node is not in a cluster");
        return;
    }
    if (!recheck && fenced(c, h, pg, "pg-pull"))
        return;
    ts_repl_pull(s->repl, pg, node, epoch, recheck);
    ops_reply_ok(c, h);
}

/* ---- maps -------------------------------------------------------------------------------- */

void tsd_op_map_get(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    struct ts_wr w;

    tsd_reply_begin(&w);
    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map) {
        ts_map_encode(&w, s->map);
    } else {
        ts_wr_u64(&w, 0);
        ts_wr_u32(&w, 0);
        ts_wr_u32(&w, 0);
    }
    pthread_rwlock_unlock(&s->map_lock);
    tsd_reply_send(c, h, &w);
}

void tsd_op_map_push(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const struct ts_map *m = q->u.map_push.map; /* decoded and validated; freed by the caller */
    char why[300];
    struct ts_wr w;
    int rc;

    if (s->cfg->etcd[0]) {
        /* A node installs only maps etcd committed, and learns them from etcd: no push, from an
         * admin or a peer, is taken (an admin changes the map in etcd). */
        tsd_reply_error(c, h, TS_EPERM,
                        "map-push refused: this cluster's map lives in etcd (%s, %s): change it "
                        "there (tessera --etcd ENDPOINTS map push)",
                        s->cfg->etcd, s->cfg->etcd_prefix);
        return;
    }
    rc = tsd_map_install_why(s, m, why, sizeof(why));
    if (rc == TS_ESTALE && why[0]) {
        tsd_reply_stale(c, h, "map-push: %s", why);
    } else if (rc == TS_ESTALE) {
        tsd_reply_stale(c, h, "map-push: epoch %llu is older than this node's %llu",
                        (unsigned long long)m->epoch, (unsigned long long)atomic_load(&s->epoch));
    } else if (rc) {
        tsd_reply_error(c, h, rc, "map-push refused: %s", why[0] ? why : ts_strerror(rc));
    } else {
        tsd_reply_begin(&w);
        ts_wr_u64(&w, atomic_load(&s->epoch));
        tsd_reply_send(c, h, &w);
    }
}

/* PG_INVENTORY: what this node holds of a PG (scrub on a replica compares it with ours). Only
 * the PG's active primary answers: anyone else's inventory may be short. */
void tsd_op_pg_inventory(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    uint32_t pg = q->u.pg_inventory.pg;
    uint8_t rank = q->u.pg_inventory.rank, wq;
    uint64_t count = 0, digest = 0, epoch, applied = 0, oldest;
    char why[200];
    struct ts_wr w;
    int rc;

    if (!s->repl || pg >= s->npg) {
        tsd_reply_error(c, h, TS_EINVAL, "pg-inventory %u: no such PG here", pg);
        return;
    }
    rc = ts_repl_pg_ready(s->repl, pg, &epoch, &wq, why, sizeof(why));
    if (rc) {
        tsd_reply_error(c, h, TS_EBUSY,
                        "pg-inventory %u: this node is not the PG's active "
                        "primary (%s)",
                        pg, why);
        return;
    }
    rc = ts_store_pg_applied(s->store, pg, &applied, &oldest);
    if (!rc) {
        struct ts_repl_hot_arg ha = {NULL, pg};
        pthread_rwlock_rdlock(&s->map_lock);
        ha.map = ts_map_dup(s->map);
        pthread_rwlock_unlock(&s->map_lock);
        rc = ts_store_pg_inventory(s->store, pg, s->npg, rank, ts_repl_hot_extra_cb, &ha, &count,
                                   &digest);
        ts_map_free((struct ts_map *)ha.map);
    }
    if (rc) {
        tsd_reply_error(c, h, rc, "pg-inventory %u: %s", pg, ts_strerror(rc));
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_u64(&w, applied);
    ts_wr_u64(&w, count);
    ts_wr_u64(&w, digest);
    tsd_reply_send(c, h, &w);
}
