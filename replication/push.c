/*
 * Log pushers (replication/repl_internal.h): one per (PG this node leads and has activated,
 * other replica), plus pulls (a peering primary asked this node for its newer log). A pusher
 * first compares the replica's log with ours (PG_INFO: head and newest entries as
 * (seq, epoch)): a prefix of ours is extended; entries past the last common one are divergent
 * (never acknowledged) and the replica is told to roll them back (REPL_SEAL kind TRUNCATE)
 * before anything is counted as applied. Then it sends our entries in order, streaming a
 * shard's chunks first when the replica lacks them; a position trimmed from our log is
 * backfilled from the PG's shards.
 */
#include "repl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_WINDOW 4
#define TAIL_MAX 32

struct push *repl_push_find(ts_repl *r, uint32_t pg, const char *node)
{
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (ps->pg == pg && !strcmp(ps->node, node))
            return ps;
    return NULL;
}

void repl_push_free(struct push *ps)
{
    ts_read_ctx_close(ps->rctx);
    free(ps->items);
    free(ps);
}

static void push_retry_later(struct push *ps)
{
    ps->busy = 0;
    ps->retry_at = ts_now_mono_ns() + RETRY_NS;
}

static uint64_t push_epoch(const struct push *ps)
{
    return ps->pull ? ps->pull_epoch : 0;
}

static void wr_repl_seal(struct ts_wr *w, int kind, uint32_t pg, uint64_t seq, uint64_t epoch,
                         const struct ts_log_rec *rec, const uint64_t *recs, uint32_t nrec)
{
    ts_wr_init(w);
    ts_wr_begin_frame(w);
    ts_wr_u8(w, (uint8_t)kind);
    ts_wr_u32(w, pg);
    ts_wr_u64(w, seq);
    ts_wr_u64(w, epoch);
    ts_wr_str(w, rec ? rec->dataset : "");
    repl_wr_ds_fields(w, rec ? &rec->policy : &(struct ts_dataset_policy){0}, rec ? rec->inc : 0);
    ts_wr_u32(w, rec ? rec->shard : 0);
    ts_wr_u8(w, rec ? 1 : 0);
    ts_wr_u32(w, rec ? rec->crc : 0);
    ts_wr_u32(w, nrec);
    for (uint32_t i = 0; i < nrec; i++)
        ts_wr_u64(w, recs[i]);
}

static void push_send_seal(ts_repl *r, struct push *ps);
static void push_stream(ts_repl *r, struct push *ps);

/* A puller that refuses our frames (a newer epoch, or it no longer pulls from us) has moved
 * on: the pull is over. */
static void pull_refused(struct push *ps, int status)
{
    if (ps->pull && (status == TS_ESTALE || status == TS_EPERM))
        ps->pull_done = 1;
}

/* The replica holds log position `seq` now (or more). */
static void push_advanced(ts_repl *r, struct push *ps, uint64_t applied)
{
    if (applied > ps->applied)
        ps->applied = applied;
    ps->busy = 0;
    ps->retry_at = 0;
    repl_waiters_check(r);
    repl_push_step(r, ps);
}

static void truncate_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;

    ps->busy = 0;
    if (status == 0) {
        uint64_t applied = ts_rd_u64(body);
        if (!body->err) {
            /* Ask again: the replica's log now ends at the common entry (or still further
             * back, when the comparison goes on). */
            TS_INFO(FAC, "PG %u: %s rolled back to %llu", ps->pg, ps->node,
                    (unsigned long long)applied);
            ps->known = 0;
            repl_push_step(r, ps);
            return;
        }
    }
    if (status == TS_ESTALE)
        repl_on_stale(r, p, body);
    pull_refused(ps, status);
    ps->known = 0;
    TS_WARN(FAC, status, "PG %u: rolling back %s's divergent entries failed", ps->pg, ps->node);
    push_retry_later(ps);
}

/* The life a push's requests belong to now (0: none; it must not push) and its interval: the
 * PG's peering verdict's while this node leads it (activating or active), or the pull's. */
static uint64_t push_life(ts_repl *r, const struct push *ps, uint64_t *interval)
{
    if (ps->pull) {
        *interval = ps->pull_epoch;
        return ps->pull_done ? 0 : ps->pull_life;
    }
    return repl_pg_life(r, ps->pg, interval);
}

/* The replica's position was learned in this life and interval: its replies still count. */
static int push_current(ts_repl *r, const struct push *ps)
{
    uint64_t interval, life = push_life(r, ps, &interval);

    return life && life == ps->asked_life && interval == ps->asked_interval;
}

/* A reply to a request of an earlier life decides nothing: start over from a comparison. */
static void push_forget(ts_repl *r, struct push *ps)
{
    TS_DEBUG(FAC, "PG %u: a reply from %s of an earlier peering life: comparing again", ps->pg,
             ps->node);
    ts_read_ctx_close(ps->rctx);
    ps->rctx = NULL;
    ps->stream_failed = 0;
    ps->backfill = 0;
    ps->known = 0;
    push_retry_later(ps);
}

/*
 * The replica's log compared with ours: what ts_peering_rollback() allows is done, nothing
 * else. Our entries at the replica's positions are read here; the decision is pure.
 */
static void pginfo_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;
    struct ts_log_pos tail[TAIL_MAX];
    uint64_t ours[TAIL_MAX];
    struct ts_rollback_in in;
    struct ts_rollback_out out;
    struct ts_log_rec rec;
    struct ts_pg_state me;
    uint64_t applied, head_epoch;
    uint32_t ntail;
    struct ts_wr w;

    ps->busy = 0;
    ps->told_clean = 0;
    if (status) {
        if (status == TS_ESTALE)
            repl_on_stale(r, p, body);
        pull_refused(ps, status); /* the puller moved on: nothing to push */
        push_retry_later(ps);
        return;
    }
    applied = ts_rd_u64(body);
    ts_rd_u64(body); /* oldest */
    head_epoch = ts_rd_u64(body);
    ts_rd_u64(body); /* promised */
    ts_rd_u64(body); /* les */
    ntail = ts_rd_u32(body);
    if (body->err || ntail > TAIL_MAX || ts_store_pg_state(r->o.store, ps->pg, &me) != 0) {
        push_retry_later(ps);
        return;
    }
    for (uint32_t i = 0; i < ntail; i++) {
        tail[i].seq = ts_rd_u64(body);
        tail[i].epoch = ts_rd_u64(body);
    }
    if (body->err) {
        push_retry_later(ps);
        return;
    }
    /* Optional trailing u8: the replica moved into the PG's replicas and holds none of its
     * shards yet (a map change): backfill it once caught up by the log. */
    if (body->off < body->len && ts_rd_u8(body) != 0)
        ps->want_backfill = 1; /* a puller too: a primary holding the log without the shards */
    if (applied && (ntail == 0 || tail[0].seq != applied)) {
        /* Its head has no entry (it was backfilled there): compare the head first. */
        memmove(tail + 1, tail, sizeof(tail[0]) * (ntail < TAIL_MAX ? ntail : TAIL_MAX - 1));
        tail[0].seq = applied;
        tail[0].epoch = head_epoch;
        ntail = ntail < TAIL_MAX ? ntail + 1 : TAIL_MAX;
    }
    memset(&in, 0, sizeof(in));
    for (uint32_t i = 0; i < ntail; i++) {
        int rc = 0;
        ours[i] = 0;
        if (tail[i].seq <= me.applied) {
            rc = ts_store_log_read(r->o.store, ps->pg, tail[i].seq, &rec);
            ours[i] = rc == TS_ENOENT ? TS_ROLLBACK_TRIMMED : rec.epoch;
        }
        if (rc && rc != TS_ENOENT) {
            push_retry_later(ps);
            return;
        }
    }
    if (ntail && tail[ntail - 1].seq > 1 &&
        ts_store_log_read(r->o.store, ps->pg, tail[ntail - 1].seq - 1, &rec) == 0)
        in.ours_before = rec.epoch;
    in.life = push_life(r, ps, &in.interval);
    in.authoritative = in.life != 0;
    in.asked_life = ps->asked_life;
    in.asked_interval = ps->asked_interval;
    in.my_epoch = me.head_epoch;
    in.my_applied = me.applied;
    in.applied = applied;
    in.head_epoch = head_epoch;
    in.tail = tail;
    in.ntail = ntail;
    in.ours = ours;
    if (ts_peering_rollback(&in, &out) != 0) {
        push_retry_later(ps);
        return;
    }
    switch (out.verdict) {
    case TS_ROLLBACK_PREFIX:
        if (ps->backfill && ps->bf_life != in.life)
            ps->backfill = 0; /* begun in an earlier life: its items and target are not ours */
        if (ps->backfill)
            ps->want_backfill = 0; /* the one running covers it */
        ps->known = 1;
        ps->refused = 0;
        ps->applied = applied;
        if (applied < me.applied)
            TS_INFO(FAC, "PG %u: %s holds our log up to %llu of %llu: catching it up", ps->pg,
                    ps->node, (unsigned long long)applied, (unsigned long long)me.applied);
        repl_waiters_check(r);
        repl_push_step(r, ps);
        return;
    case TS_ROLLBACK_TRUNCATE:
        ps->refused = 0;
        TS_WARN(FAC, 0, "PG %u: %s: %s", ps->pg, ps->node, out.why);
        wr_repl_seal(&w, TS_REPL_TRUNCATE, ps->pg, out.to, out.to_epoch, NULL, NULL, 0);
        ps->busy = 1;
        /* Under the interval our log is authoritative in: the replica refuses to remove entries
         * newer than the frame's epoch, and frames older than its promise. */
        repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, truncate_reply, ps,
                       in.interval);
        return;
    case TS_ROLLBACK_REFUSE:
        if (!ps->refused) { /* counted and logged once until the comparison changes */
            pthread_mutex_lock(&r->lock);
            r->rollbacks_refused++;
            pthread_mutex_unlock(&r->lock);
            TS_WARN(FAC, 0, "PG %u: %s: %s", ps->pg, ps->node, out.why);
        }
        ps->refused = 1;
        /* fall through */
    default: /* STALE: nothing decided; ask again while it may */
        ps->known = 0;
        push_retry_later(ps);
    }
}

/* The rebalance's limits on a moving PG's backfill (the map's rebalance rate, bytes/s per PG):
 * after a shard of `bytes`, the next waits its turn (1; the tick steps it again). */
static int bf_paced(ts_repl *r, struct push *ps, uint64_t bytes)
{
    const struct ts_map_move *mv = r->map ? r->map->move : NULL;

    if (!mv || !mv->rate || ts_map_pg_move_state(r->map, ps->pg) != TS_PG_MOVING)
        return 0;
    ps->retry_at = ts_now_mono_ns() + bytes * 1000000000ull / mv->rate;
    return 1;
}

/* A paused rebalance holds its moving PGs' backfills (writes still reach the new replicas). */
static int bf_paused(ts_repl *r, const struct push *ps)
{
    return r->map && r->map->move && r->map->move->paused &&
           ts_map_pg_move_state(r->map, ps->pg) == TS_PG_MOVING;
}

static void seal_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;
    uint64_t seq = ps->backfill ? 0 : ps->rec.seq;

    if (!push_current(r, ps)) {
        push_forget(r, ps);
        return;
    }
    if (status == 0 || status == TS_EEXIST) {
        ts_read_ctx_close(ps->rctx);
        ps->rctx = NULL;
        if (ps->backfill) {
            ps->at++;
            ps->busy = 0;
            if (!bf_paced(r, ps, ps->rec.size))
                repl_push_step(r, ps);
        } else {
            push_advanced(r, ps, seq);
        }
        return;
    }
    if ((status == TS_EINCOMPLETE || status == TS_EINVAL) && !ps->rctx && !ps->stream_failed) {
        /* The replica lacks the chunks: stream the shard, then seal again. */
        push_stream(r, ps);
        return;
    }
    if (status == TS_ERANGE) {
        ps->known = 0; /* the replica is elsewhere in the log: ask it */
        ps->busy = 0;
        repl_push_step(r, ps);
        return;
    }
    if (status == TS_ESTALE)
        repl_on_stale(r, p, body);
    pull_refused(ps, status); /* the puller moved on: nothing to push */
    if (status != TS_ECONNREFUSED && status != TS_ECONNRESET)
        TS_WARN(FAC, status, "push of PG %u seq %llu (%s/%u) to %s failed", ps->pg,
                (unsigned long long)seq, ps->rec.dataset, ps->rec.shard, ps->node);
    ts_read_ctx_close(ps->rctx);
    ps->rctx = NULL;
    ps->stream_failed = 0;
    push_retry_later(ps);
}

static void push_send_seal(ts_repl *r, struct push *ps)
{
    struct ts_wr w;
    uint64_t *recs = NULL;
    uint32_t nrec = 0;

    ts_store_shard_records(r->o.store, ps->rec.dataset, ps->rec.shard, &recs, &nrec);
    wr_repl_seal(&w, ps->backfill ? TS_REPL_BACKFILL : TS_REPL_SEAL, ps->pg,
                 ps->backfill ? 0 : ps->rec.seq, ps->backfill ? 0 : ps->rec.epoch, &ps->rec, recs,
                 nrec);
    free(recs);
    ps->busy = 1;
    repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, seal_reply, ps,
                   push_epoch(ps));
}

static void chunk_pin_cleanup(const void *data, size_t len, void *pin)
{
    ts_chunk_pin_release(pin);
}

static void stream_more(ts_repl *r, struct push *ps);

static void stream_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;

    ps->inflight--;
    if (!status && !push_current(r, ps))
        status = TS_ECANCELED; /* an earlier life's stream: end it (and compare again) */
    if (status) {
        ps->stream_failed = status;
        if (body && status != TS_ESTALE && status != TS_ECANCELED) {
            ts_rd_str(body, ps->stream_why, sizeof(ps->stream_why));
            body->off = 0;
        }
    }
    if (ps->inflight == 0 && ps->stream_failed) {
        TS_WARN(FAC, ps->stream_failed, "streaming %s/%u to %s failed%s%s", ps->rec.dataset,
                ps->rec.shard, ps->node, ps->stream_why[0] ? ": " : "", ps->stream_why);
        ps->stream_why[0] = '\0';
        if (ps->stream_failed == TS_ESTALE)
            repl_on_stale(r, p, body);
        if (ps->stream_failed == TS_ECANCELED)
            ps->known = 0;
        ts_read_ctx_close(ps->rctx);
        ps->rctx = NULL;
        ps->stream_failed = 0;
        push_retry_later(ps);
        return;
    }
    stream_more(r, ps);
}

static void stream_more(ts_repl *r, struct push *ps)
{
    const struct ts_shard_info *si = ts_read_ctx_info(ps->rctx);
    uint32_t total = si->nchunks ? si->nchunks : 1; /* an empty shard: one empty chunk 0 */

    while (!ps->stream_failed && ps->next_chunk < total && ps->inflight < STREAM_WINDOW) {
        struct ts_chunk_ref ref = {0};
        struct ts_wr w;
        uint32_t idx = ps->next_chunk, len = 0;
        int rc = 0;

        if (si->nchunks && ps->rec.policy.ec_dropped) {
            rc = ts_read_ctx_chunk_crc(ps->rctx, idx, &ref.crc, &len); /* a record, no bytes */
            ref.len = len;
        } else if (si->nchunks) {
            rc = ts_read_ctx_chunk(ps->rctx, idx, &ref);
        }

        if (rc) {
            /* Our own copy is bad: repair it first (from another replica), retry later. */
            ts_repl_repair(r, ps->rec.dataset, ps->rec.shard, idx, ps->pg);
            ps->stream_failed = rc;
            break;
        }
        repl_wr_write(&w, ps->rec.dataset, &ps->rec.policy, ps->rec.inc, ps->rec.shard, idx,
                      si->size, ref.crc, (uint32_t)ref.len);
        ps->next_chunk++;
        ps->inflight++;
        repl_peer_send(r, ps->node, TS_OP_REPL_WRITE, &w, ref.data, ref.data ? ref.len : 0,
                       ref.pin ? chunk_pin_cleanup : NULL, ref.pin, stream_reply, ps,
                       push_epoch(ps));
        if (!ps->rctx)
            return; /* the send failed at once and its reply ended the stream */
    }
    if (ps->inflight == 0 && ps->stream_failed) {
        ts_read_ctx_close(ps->rctx);
        ps->rctx = NULL;
        ps->stream_failed = 0;
        push_retry_later(ps);
        return;
    }
    if (ps->inflight == 0 && ps->next_chunk >= total)
        push_send_seal(r, ps); /* all chunks acknowledged: seal (rctx marks "streamed") */
}

/* The incarnation of the dataset this node holds now is the one the entry names. */
static int same_incarnation(ts_repl *r, const struct ts_log_rec *rec)
{
    struct ts_dataset_info d;
    int rc = ts_store_dataset_get(r->o.store, rec->dataset, &d);

    if (rc)
        return rc;
    return !rec->inc || d.created_ns == rec->inc ? 0 : TS_ENOENT;
}

static void push_stream(ts_repl *r, struct push *ps)
{
    int rc = same_incarnation(r, &ps->rec), live = rc == 0;

    /* The dataset's tier as it is now (a backfill item's policy was read when it was listed):
     * its chunks go without bytes only while its replicas' bytes are dropped here. */
    ps->rec.policy.ec_dropped = 0;
    if (rc == 0)
        rc = ts_store_read_open(r->o.store, ps->rec.dataset, ps->rec.shard, 0, &ps->rctx);
    if (rc == TS_ENOENT && live && !ps->backfill) {
        /* The entry's dataset is here, its shard is not (this node awaits a backfill of it, or
         * lost it): never a no-op in its place, which would lose the replica's copy too. */
        TS_WARN(FAC, rc,
                "PG %u entry %llu: %s/%u is not here though its dataset is: not pushing it to "
                "%s%s",
                ps->pg, (unsigned long long)ps->rec.seq, ps->rec.dataset, ps->rec.shard, ps->node,
                ps->pull ? " (the puller peers again)" : "");
        if (ps->pull)
            ps->pull_done = 1;
        push_retry_later(ps);
        return;
    }
    if (rc == TS_EFRAGMENTED) {
        /* Erasure-coded, its replicas' bytes dropped (issue 33): the shard goes as its records,
         * each chunk's CRC32C and length without bytes (the fragments hold them), with the
         * dataset's code and dropped state, which the replica takes on. */
        struct ts_dataset_info d;
        rc = ts_store_dataset_get(r->o.store, ps->rec.dataset, &d);
        if (rc == 0) {
            ps->rec.policy.ec_k = d.policy.ec_k;
            ps->rec.policy.ec_m = d.policy.ec_m;
            ps->rec.policy.ec_dropped = d.policy.ec_dropped;
            rc = ts_store_records_open(r->o.store, ps->rec.dataset, ps->rec.shard, &ps->rctx);
        }
    }
    if (rc && rc != TS_ENOENT) {
        /* A local failure (memory, the engine): not "gone"; try again later. */
        TS_WARN(FAC, rc, "PG %u: cannot read %s/%u to push it to %s", ps->pg, ps->rec.dataset,
                ps->rec.shard, ps->node);
        push_retry_later(ps);
        return;
    }
    if (rc) {
        /* That incarnation of the dataset is gone here (deleted, or the name re-created): the
         * position carries nothing. */
        struct ts_wr w;
        if (ps->backfill) {
            ps->at++;
            ps->busy = 0;
            repl_push_step(r, ps);
            return;
        }
        wr_repl_seal(&w, TS_REPL_NOOP, ps->pg, ps->rec.seq, ps->rec.epoch, NULL, NULL, 0);
        ps->busy = 1;
        repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, seal_reply, ps,
                       push_epoch(ps));
        return;
    }
    ps->busy = 1;
    ps->next_chunk = 0;
    ps->inflight = 0;
    ps->stream_failed = 0;
    stream_more(r, ps);
}

struct bf_collect {
    ts_repl *r;
    struct push *ps;
    int rank;
};

static int bf_collect_cb(void *arg, const char *dataset, const struct ts_shard_info *si)
{
    struct bf_collect *b = arg;
    struct push *ps = b->ps;
    struct ts_dataset_info d;
    struct ts_log_rec *it;

    if (ts_store_dataset_get(b->r->o.store, dataset, &d) != 0)
        return 0;
    if (b->rank >=
        d.policy.core + d.policy.fringe + (int)ts_map_hot_extra(b->r->map, dataset, ps->pg))
        return 0; /* not a replica of this dataset (a hot dataset's extra replicas count) */
    if (ps->nitems % 64 == 0) {
        struct ts_log_rec *n = realloc(ps->items, (ps->nitems + 64) * sizeof(*n));
        if (!n)
            return TS_ENOMEM;
        ps->items = n;
    }
    it = &ps->items[ps->nitems++];
    memset(it, 0, sizeof(*it));
    it->pg = ps->pg;
    it->type = TS_LOG_SEAL;
    snprintf(it->dataset, sizeof(it->dataset), "%s", dataset);
    it->policy = d.policy;
    it->inc = d.created_ns;
    it->shard = si->shard;
    it->size = si->size;
    it->crc = si->crc;
    it->nchunks = si->nchunks;
    return 0;
}

static void backfill_start(ts_repl *r, struct push *ps, uint64_t my_applied, uint64_t my_epoch)
{
    /* A puller is the PG's primary in its map (ours may be older): every dataset's shards. */
    struct bf_collect b = {r, ps, ps->pull ? 0 : repl_node_rank(r, ps->pg, ps->node)};

    TS_INFO(FAC, "PG %u: %s is at %llu%s: backfilling", ps->pg, ps->node,
            (unsigned long long)ps->applied,
            ps->applied >= my_applied ? " but its scrub found shards missing"
                                      : ", before the oldest log record");
    pthread_mutex_lock(&r->lock);
    r->backfills++;
    pthread_mutex_unlock(&r->lock);
    free(ps->items);
    ps->items = NULL;
    ps->nitems = ps->at = 0;
    ps->backfill = 1;
    ps->bf_life = ps->asked_life;
    ps->bf_pruned = 0;
    ps->bf_target = my_applied;
    ps->bf_epoch = my_epoch;
    if (ts_store_pg_iter(r->o.store, ps->pg, r->map->pg_count, bf_collect_cb, &b) != 0) {
        ps->backfill = 0;
        push_retry_later(ps);
    }
}

/*
 * Before a backfill: our datasets and tombstones with their incarnations, so the replica drops
 * what was deleted (or re-created) while it was away — those deletes are no longer in our log.
 */
struct prune_list {
    struct ts_wr *w;
    uint32_t n;
};

static int prune_cb(void *arg, const struct ts_dataset_info *d)
{
    struct prune_list *pl = arg;
    ts_wr_str(pl->w, d->name);
    ts_wr_u64(pl->w, d->created_ns);
    ts_wr_u8(pl->w, 0); /* live */
    pl->n++;
    return 0;
}

static int prune_tomb_cb(void *arg, const char *name, uint64_t inc)
{
    struct prune_list *pl = arg;
    ts_wr_str(pl->w, name);
    ts_wr_u64(pl->w, inc);
    ts_wr_u8(pl->w, 1); /* deleted */
    pl->n++;
    return 0;
}

static void prune_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;

    ps->busy = 0;
    if (status == 0) {
        ps->bf_pruned = 1;
        repl_push_step(r, ps);
        return;
    }
    if (status == TS_ESTALE)
        repl_on_stale(r, p, body);
    pull_refused(ps, status);
    push_retry_later(ps);
}

static void send_prune(ts_repl *r, struct push *ps)
{
    struct ts_wr w;
    struct prune_list pl = {&w, 0};
    size_t at;

    wr_repl_seal(&w, TS_REPL_PRUNE, ps->pg, 0, 0, NULL, NULL, 0);
    w.len -= 4; /* the record count: a dataset list follows instead */
    at = w.len;
    ts_wr_u32(&w, 0);
    ts_store_dataset_list(r->o.store, prune_cb, &pl);
    ts_store_tombstone_list(r->o.store, prune_tomb_cb, &pl);
    if (!w.err)
        ts_put_le32(w.buf + at, pl.n);
    ps->busy = 1;
    repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, prune_reply, ps,
                   push_epoch(ps));
}

static void setapplied_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;

    if (!push_current(r, ps)) {
        push_forget(r, ps);
        return;
    }
    if (status == 0) {
        TS_INFO(FAC, "PG %u: backfill of %s done (%zu shards)", ps->pg, ps->node, ps->nitems);
        ps->backfill = 0;
        push_advanced(r, ps, ps->bf_target);
        return;
    }
    if (status == TS_ERANGE) {
        /* Its head is past our target (it never moves back): compare again. */
        ps->backfill = 0;
        ps->known = 0;
    }
    pull_refused(ps, status);
    push_retry_later(ps);
}

static void clean_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct push *ps = ctx;

    ps->busy = 0;
    if (status == 0) {
        ps->told_clean = 1;
        return;
    }
    if (status == TS_ESTALE)
        repl_on_stale(r, p, body);
    if (status == TS_EBUSY)
        ps->known = 0; /* it waits for a backfill: its PG_INFO says so */
    push_retry_later(ps);
}

void repl_push_step(ts_repl *r, struct push *ps)
{
    struct ts_pg_state me;
    struct ts_wr w;
    int rank, rc;

    if (ps->busy || ps->pull_done || (ps->retry_at && ts_now_mono_ns() < ps->retry_at))
        return;
    /* Only the primary of an activated interval pushes (before that its own log may be short
     * of the acknowledged one, and comparing against it would roll good entries back); a pull
     * pushes because a peering primary found our log the newest. */
    if (!ps->pull && !repl_pg_pushes(r, ps->pg))
        return;
    ps->retry_at = 0;
    if ((ps->known || ps->backfill) && !push_current(r, ps)) {
        /* Its position was learned in an earlier life: compare again. */
        ps->known = 0;
        ps->backfill = 0;
    }
    if (!ps->known) {
        ps->asked_life = push_life(r, ps, &ps->asked_interval);
        ts_wr_init(&w);
        ts_wr_begin_frame(&w);
        ts_wr_u32(&w, ps->pg);
        ps->busy = 1;
        repl_peer_send(r, ps->node, TS_OP_PG_INFO, &w, NULL, 0, NULL, NULL, pginfo_reply, ps,
                       push_epoch(ps));
        return;
    }
    if (ps->backfill) {
        if (bf_paused(r, ps)) {
            push_retry_later(ps);
            return;
        }
        if (!ps->bf_pruned) {
            send_prune(r, ps);
            return;
        }
        if (ps->at < ps->nitems) {
            ps->rec = ps->items[ps->at];
            push_send_seal(r, ps);
        } else {
            wr_repl_seal(&w, TS_REPL_SET_APPLIED, ps->pg, ps->bf_target, ps->bf_epoch, NULL, NULL,
                         0);
            ps->busy = 1;
            repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, setapplied_reply,
                           ps, push_epoch(ps));
        }
        return;
    }
    if (ts_store_pg_state(r->o.store, ps->pg, &me) != 0)
        return;
    if (ps->applied >= me.applied && ps->want_backfill) {
        /* Caught up by its log, yet its scrub found shards missing: backfill the PG. */
        ps->want_backfill = 0;
        backfill_start(r, ps, me.applied, me.head_epoch);
        repl_push_step(r, ps);
        return;
    }
    if (ps->applied >= me.applied) {
        if (ps->pull) {
            TS_INFO(FAC, "PG %u: %s pulled our log up to %llu", ps->pg, ps->node,
                    (unsigned long long)me.applied);
            ps->pull_done = 1;
        } else if (!ps->told_clean && repl_pg_active(r, ps->pg)) {
            /* Caught up: it may serve reads of this PG again (a restarted replica does not
             * until told, so it never serves what it missed, deletes included). */
            wr_repl_seal(&w, TS_REPL_CLEAN, ps->pg, me.applied, me.head_epoch, NULL, NULL, 0);
            ps->busy = 1;
            repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, clean_reply, ps,
                           0);
        }
        return; /* caught up */
    }
    memset(&ps->rec, 0, sizeof(ps->rec));
    rc = ts_store_log_read(r->o.store, ps->pg, ps->applied + 1, &ps->rec);
    if (rc == TS_ENOENT) {
        backfill_start(r, ps, me.applied, me.head_epoch);
        repl_push_step(r, ps);
        return;
    }
    if (rc) {
        push_retry_later(ps);
        return;
    }
    rank = repl_node_rank(r, ps->pg, ps->node);
    if (ps->rec.type == TS_LOG_DELETE) { /* every replica applies deletes */
        wr_repl_seal(&w, TS_REPL_DELETE, ps->pg, ps->rec.seq, ps->rec.epoch, &ps->rec, NULL, 0);
        ps->busy = 1;
        repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, seal_reply, ps,
                       push_epoch(ps));
        return;
    }
    if (ps->rec.type != TS_LOG_SEAL ||
        (!ps->pull &&
         (rank < 0 || rank >= ps->rec.policy.core + ps->rec.policy.fringe +
                                  (int)ts_map_hot_extra(r->map, ps->rec.dataset, ps->pg)))) {
        wr_repl_seal(&w, TS_REPL_NOOP, ps->pg, ps->rec.seq, ps->rec.epoch, NULL, NULL, 0);
        ps->busy = 1;
        repl_peer_send(r, ps->node, TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, seal_reply, ps,
                       push_epoch(ps));
        return;
    }
    ps->stream_failed = 0;
    push_send_seal(r, ps);
}

/* Rebuilds the set of pushes: one per (PG this node is primary of, other replica). */
void repl_pushes_rebuild(ts_repl *r)
{
    struct push **pp = &r->pushes, *ps;
    unsigned primary_pgs = 0;

    /* Drop pushes of PGs we no longer lead, unless a request is outstanding (then later). */
    while ((ps = *pp)) {
        int order[TS_REPL_MAX_REPLICAS];
        size_t n = r->map ? ts_map_pg_order(r->map, ps->pg, order, TS_REPL_MAX_REPLICAS) : 0;
        int keep = n > 0 && order[0] == r->self && repl_is_other_replica(r, ps->pg, ps->node);
        if (ps->pull && keep) {
            /* We lead the PG now and the puller is its replica: an ordinary push from here. */
            ps->pull = ps->pull_done = 0;
            if (!ps->busy)
                ps->known = 0;
        } else if (ps->pull) {
            keep = !ps->pull_done;
        }
        if (!keep && !ps->busy) {
            *pp = ps->next;
            repl_push_free(ps);
            continue;
        }
        pp = &ps->next;
    }
    if (!r->map || r->self < 0)
        return;
    for (uint32_t pg = 0; pg < r->map->pg_count; pg++) {
        int order[TS_REPL_MAX_REPLICAS];
        size_t n = ts_map_pg_order(r->map, pg, order, TS_REPL_MAX_REPLICAS);
        if (n == 0 || order[0] != r->self)
            continue;
        primary_pgs++;
        for (size_t i = 1; i < n; i++) {
            const char *id = r->map->nodes[order[i]].id;
            if (repl_push_find(r, pg, id))
                continue;
            ps = calloc(1, sizeof(*ps));
            if (!ps)
                return;
            ps->pg = pg;
            snprintf(ps->node, sizeof(ps->node), "%s", id);
            ps->next = r->pushes;
            r->pushes = ps;
        }
    }
    pthread_mutex_lock(&r->lock);
    r->primary_pgs = primary_pgs;
    pthread_mutex_unlock(&r->lock);
}

void repl_pull_start(ts_repl *r, uint32_t pg, const char *node, uint64_t epoch, int recheck)
{
    struct push *ps = repl_push_find(r, pg, node);

    if (recheck) {
        /* A restarted replica asks its primary to compare its log again (1), or a replica
         * whose scrub found shards missing asks for a backfill (2): only the PG's active
         * primary answers (anyone else's log may be short of the acknowledged one). */
        if (ps && !ps->pull && repl_pg_active(r, pg)) {
            if (recheck == 2)
                ps->want_backfill = 1;
            if (!ps->busy)
                ps->known = 0;
            ps->retry_at = 0;
            repl_push_step(r, ps);
        }
        return;
    }
    if (!ps) {
        ps = calloc(1, sizeof(*ps));
        if (!ps)
            return;
        ps->pg = pg;
        snprintf(ps->node, sizeof(ps->node), "%s", node);
        ps->next = r->pushes;
        r->pushes = ps;
    }
    TS_INFO(FAC, "PG %u: %s pulls our log (epoch %llu)", pg, node, (unsigned long long)epoch);
    if (!ps->pull || ps->pull_done || ps->pull_epoch != epoch)
        ps->pull_life = ++r->lives; /* a new pull: replies to an earlier one decide nothing */
    ps->pull = 1;
    ps->pull_done = 0;
    ps->pull_epoch = epoch;
    if (!ps->busy)
        ps->known = 0;
    ps->retry_at = 0;
    repl_push_step(r, ps);
}
