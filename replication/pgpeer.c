/*
 * Peering of the PGs this node leads (docs/architecture.md "Peering"): the I/O around the pure
 * decisions of peering.c. For each PG whose primary this node is in its map, and whose acting
 * set changed (or that was never activated here):
 *
 *   QUERY     PG_QUERY(pg, epoch) to every node of the map; each repliers promises the epoch
 *             durably (refusing older primaries from then on) and answers its PG facts.
 *   PULL      when another replier holds a newer head: PG_PULL asks it to push its log here
 *             (rolling back what diverges); when our head has reached it, QUERY again.
 *   ACTIVATE  PG_ACTIVATE(pg, epoch, wq, acting) to the new acting set and the last
 *             interval's; the PG is active once q(L) members of the last interval recorded it.
 *   ACTIVE    writes are accepted (ts_repl_pg_ready) and the log pushers run.
 *   BLOCKED   a replier promised a newer epoch: our map is old; wait for the next map.
 */
#include "repl_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUERY_NS (300ull * 1000000)
#define PULL_NUDGE_NS (2000ull * 1000000)

static const char *const state_names[] = {"peering", "pulling", "activating", "active", "blocked"};

const char *ts_repl_pg_state_name(int state)
{
    return state >= 0 && state <= PGP_BLOCKED ? state_names[state] : "?";
}

struct pgpeer *repl_pgpeer_find(ts_repl *r, uint32_t pg)
{
    for (struct pgpeer *pp = r->pgs; pp; pp = pp->next)
        if (pp->pg == pg)
            return pp;
    return NULL;
}

int repl_pg_active(ts_repl *r, uint32_t pg)
{
    struct pgpeer *pp = repl_pgpeer_find(r, pg);
    return pp && pp->state == PGP_ACTIVE;
}

int repl_pg_pushes(ts_repl *r, uint32_t pg)
{
    struct pgpeer *pp = repl_pgpeer_find(r, pg);
    return pp && (pp->state == PGP_ACTIVE || pp->state == PGP_ACTIVATE);
}

uint64_t repl_pg_life(ts_repl *r, uint32_t pg, uint64_t *interval)
{
    struct pgpeer *pp = repl_pgpeer_find(r, pg);

    *interval = 0;
    if (!pp || (pp->state != PGP_ACTIVE && pp->state != PGP_ACTIVATE))
        return 0;
    *interval = pp->epoch;
    return pp->life;
}

/* Publishes pp's state for the workers (ts_repl_pg_ready) and STATUS. */
static void publish(ts_repl *r, struct pgpeer *pp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void publish(ts_repl *r, struct pgpeer *pp, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(pp->why, sizeof(pp->why), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&r->lock);
    if (r->pub && pp->pg < r->npub) {
        struct repl_pg_pub *p = &r->pub[pp->pg];
        p->state = pp->state;
        p->epoch = pp->epoch;
        p->wq = pp->wq;
        p->since_ns = pp->since_ns;
        snprintf(p->pull_from, sizeof(p->pull_from), "%s",
                 pp->state == PGP_PULL ? pp->pull_from : "");
        snprintf(p->why, sizeof(p->why), "%s", pp->why);
    }
    pthread_mutex_unlock(&r->lock);
}

static void unpublish(ts_repl *r, uint32_t pg)
{
    pthread_mutex_lock(&r->lock);
    if (r->pub && pg < r->npub)
        memset(&r->pub[pg], 0, sizeof(r->pub[pg]));
    pthread_mutex_unlock(&r->lock);
}

static void set_state(ts_repl *r, struct pgpeer *pp, int state)
{
    if (pp->state != state)
        pp->since_ns = ts_now_wall_ns();
    pp->state = state;
}

/* Replies carry (pg, round); the pgpeer may be gone or have started over since. */
struct pctx {
    uint32_t pg;
    unsigned round;
    uint64_t epoch; /* a pgpeer freed and made again restarts its rounds: the epoch tells */
    char node[64];
};

static struct pgpeer *ctx_pp(ts_repl *r, struct pctx *c)
{
    struct pgpeer *pp = repl_pgpeer_find(r, c->pg);
    return pp && pp->round == c->round && pp->epoch == c->epoch ? pp : NULL;
}

static struct pctx *ctx_new(struct pgpeer *pp, const char *node)
{
    struct pctx *c = calloc(1, sizeof(*c));
    if (c) {
        c->pg = pp->pg;
        c->round = pp->round;
        c->epoch = pp->epoch;
        snprintf(c->node, sizeof(c->node), "%.63s", node);
    }
    return c;
}

/* A peering frame to `to`: the reply context and a frame started with the PG and the epoch.
 * NULL (nothing started) when out of memory. */
static struct pctx *pg_frame(struct pgpeer *pp, const char *to, struct ts_wr *w)
{
    struct pctx *c = ctx_new(pp, to);

    if (!c)
        return NULL;
    ts_wr_init(w);
    ts_wr_begin_frame(w);
    ts_wr_u32(w, pp->pg);
    ts_wr_u64(w, pp->epoch);
    return c;
}

static int in_list(const char (*ids)[64], unsigned n, const char *id)
{
    for (unsigned i = 0; i < n; i++)
        if (!strcmp(ids[i], id))
            return 1;
    return 0;
}

static void add_reply(struct pgpeer *pp, const char *id, const struct ts_pg_state *st, int lacks)
{
    for (size_t i = 0; i < pp->nreplies; i++)
        if (!strcmp(pp->replies[i].id, id)) {
            pp->replies[i].st = *st;
            pp->replies[i].lacks_shards = lacks;
            return;
        }
    if (pp->nreplies == pp->capreplies) {
        size_t cap = pp->capreplies ? 2 * pp->capreplies : 8;
        struct ts_peer_reply *n = realloc(pp->replies, cap * sizeof(*n));
        if (!n)
            return;
        pp->replies = n;
        pp->capreplies = cap;
    }
    snprintf(pp->replies[pp->nreplies].id, sizeof(pp->replies[0].id), "%s", id);
    pp->replies[pp->nreplies].lacks_shards = lacks;
    pp->replies[pp->nreplies++].st = *st;
}

static void start_round(ts_repl *r, struct pgpeer *pp);

static int needs_backfill(ts_repl *r, uint32_t pg)
{
    return r->o.needs_backfill && r->o.needs_backfill(r->o.arg, pg);
}
static void evaluate(ts_repl *r, struct pgpeer *pp);

static void block(ts_repl *r, struct pgpeer *pp, const char *node, uint64_t promised)
{
    set_state(r, pp, PGP_BLOCKED);
    pp->round++;
    pp->outstanding = 0;
    publish(r, pp, "%s promised epoch %llu or newer: waiting for a newer map than %llu", node,
            (unsigned long long)promised, (unsigned long long)pp->epoch);
    TS_WARN(FAC, TS_ESTALE, "PG %u: %s", pp->pg, pp->why);
}

/* ---- QUERY ---------------------------------------------------------------------------------- */

void ts_repl_wr_pg_state(struct ts_wr *w, const struct ts_pg_state *st)
{
    ts_wr_u64(w, st->applied);
    ts_wr_u64(w, st->head_epoch);
    ts_wr_u64(w, st->promised);
    ts_wr_u64(w, st->les);
    ts_wr_u8(w, st->wq);
    ts_wr_u8(w, st->nacting);
    for (unsigned i = 0; i < st->nacting && i < TS_PG_MAX_ACTING; i++)
        ts_wr_str(w, st->acting[i]);
    ts_wr_u8(w, st->npending);
    for (unsigned k = 0; k < st->npending && k < TS_PG_MAX_PENDING; k++) {
        const struct ts_pg_interval *iv = &st->pending[k];
        ts_wr_u64(w, iv->epoch);
        ts_wr_u8(w, iv->wq);
        ts_wr_u8(w, iv->n);
        for (unsigned i = 0; i < iv->n && i < TS_PG_MAX_ACTING; i++)
            ts_wr_str(w, iv->acting[i]);
    }
}

int ts_repl_rd_pg_state(struct ts_rd *rd, struct ts_pg_state *st)
{
    memset(st, 0, sizeof(*st));
    st->applied = ts_rd_u64(rd);
    st->head_epoch = ts_rd_u64(rd);
    st->promised = ts_rd_u64(rd);
    st->les = ts_rd_u64(rd);
    st->wq = ts_rd_u8(rd);
    st->nacting = ts_rd_u8(rd);
    if (st->nacting > TS_PG_MAX_ACTING)
        return TS_EPROTO;
    for (unsigned i = 0; i < st->nacting; i++)
        ts_rd_str(rd, st->acting[i], sizeof(st->acting[i]));
    st->npending = ts_rd_u8(rd);
    if (st->npending > TS_PG_MAX_PENDING)
        return TS_EPROTO;
    for (unsigned k = 0; k < st->npending; k++) {
        struct ts_pg_interval *iv = &st->pending[k];
        iv->epoch = ts_rd_u64(rd);
        iv->wq = ts_rd_u8(rd);
        iv->n = ts_rd_u8(rd);
        if (iv->n > TS_PG_MAX_ACTING)
            return TS_EPROTO;
        for (unsigned i = 0; i < iv->n; i++)
            ts_rd_str(rd, iv->acting[i], sizeof(iv->acting[i]));
    }
    return rd->err ? TS_EPROTO : 0;
}

static void query_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct pctx *c = ctx;
    struct pgpeer *pp = ctx_pp(r, c);
    struct ts_pg_state st;

    if (!pp || pp->state != PGP_QUERY) {
        free(c);
        return;
    }
    pp->outstanding--;
    if (status == 0 && ts_repl_rd_pg_state(body, &st) == 0 && st.promised >= pp->epoch) {
        /* Optional trailing u8: the replier holds the log but not all the shards. */
        int lacks = body->off < body->len && ts_rd_u8(body) != 0;
        add_reply(pp, c->node, &st, lacks);
    } else if (status != TS_ESTALE) {
        TS_DEBUG(FAC, "PG %u: no peering reply from %s: %s", pp->pg, c->node, ts_errname(status));
    } else {
        block(r, pp, c->node, pp->epoch + 1);
        repl_on_stale(r, p, body);
        free(c);
        return;
    }
    free(c);
    if (!pp->sending)
        evaluate(r, pp);
}

static void start_round(ts_repl *r, struct pgpeer *pp)
{
    struct ts_pg_state me;
    int rc;

    pp->round++;
    pp->nreplies = 0;
    pp->outstanding = 0;
    pp->retry_at = 0;
    set_state(r, pp, PGP_QUERY);
    rc = ts_store_pg_promise(r->o.store, pp->pg, pp->epoch, &me);
    if (rc == TS_ESTALE) {
        block(r, pp, r->node_id, me.promised);
        return;
    }
    if (rc) {
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
        publish(r, pp, "cannot record the promise here: %s", ts_strerror(rc));
        return;
    }
    add_reply(pp, r->node_id, &me, needs_backfill(r, pp->pg));
    /* Replies that fail at once (a peer known to be down) are only collected while sending;
     * the decision comes after, once. */
    pp->sending = 1;
    for (size_t i = 0; i < r->map->n && pp->state == PGP_QUERY; i++) {
        const char *id = r->map->nodes[i].id;
        struct pctx *c;
        struct ts_wr w;
        if ((int)i == r->self || !(c = pg_frame(pp, id, &w)))
            continue;
        ts_wr_str(&w, r->node_id);
        pp->outstanding++;
        repl_peer_send(r, id, TS_OP_PG_QUERY, &w, NULL, 0, NULL, NULL, query_reply, c, pp->epoch);
    }
    pp->sending = 0;
    if (pp->state == PGP_QUERY)
        evaluate(r, pp);
}

/* ---- PULL ----------------------------------------------------------------------------------- */

static void pull_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct pctx *c = ctx;
    struct pgpeer *pp = ctx_pp(r, c);

    if (pp && pp->state == PGP_PULL && status) {
        /* The source is gone or refuses: peer again (someone else may hold the head). */
        publish(r, pp, "%s did not push its log (%s): peering again", c->node, ts_errname(status));
        free(c);
        set_state(r, pp, PGP_QUERY); /* from the timer: never recurse from a failed send */
        pp->round++;
        pp->outstanding = 0;
        pp->retry_at = ts_now_mono_ns() + 100ull * 1000000;
        return;
    }
    free(c);
}

static void send_pull(ts_repl *r, struct pgpeer *pp)
{
    struct ts_wr w;
    struct pctx *c = pg_frame(pp, pp->pull_from, &w);

    if (!c)
        return;
    ts_wr_str(&w, r->node_id);
    ts_wr_u8(&w, 0); /* a peering primary's pull */
    pp->retry_at = ts_now_mono_ns() + PULL_NUDGE_NS;
    repl_peer_send(r, pp->pull_from, TS_OP_PG_PULL, &w, NULL, 0, NULL, NULL, pull_reply, c,
                   pp->epoch);
}

/* ---- ACTIVATE: prepare on enough nodes, then commit ------------------------------------------ */

static unsigned set_has(const struct ts_peering_set *s, const char *id)
{
    for (unsigned i = 0; i < s->n; i++)
        if (!strcmp(s->ids[i], id))
            return 1;
    return 0;
}

/* Prepared on q of every set peering needed, and on enough caught-up members of the new acting
 * set to make a write quorum (all of it when smaller). */
static int prepared(const struct pgpeer *pp, char *why, size_t cap)
{
    unsigned need = pp->wq < pp->nacting ? pp->wq : pp->nacting;

    for (unsigned k = 0; k < pp->nsets; k++)
        if (pp->sets[k].have < pp->sets[k].need) {
            snprintf(why, cap, "%u of the %u needed nodes of %s interval %llu recorded epoch %llu",
                     pp->sets[k].have, pp->sets[k].need,
                     pp->sets[k].pending ? "pending" : "started",
                     (unsigned long long)pp->sets[k].epoch, (unsigned long long)pp->epoch);
            return 0;
        }
    if (pp->caught_up < need) {
        snprintf(why, cap,
                 "%u of the %u members it needs hold the whole log (the others are "
                 "being caught up)",
                 pp->caught_up, need);
        return 0;
    }
    return 1;
}

static void commit_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body);

static void send_activate(ts_repl *r, struct pgpeer *pp, int phase, const char *to, pend_cb cb)
{
    struct ts_wr w;
    struct pctx *c = pg_frame(pp, to, &w);

    if (!c)
        return;
    ts_wr_u8(&w, (uint8_t)phase);
    ts_wr_u8(&w, pp->wq);
    ts_wr_u8(&w, (uint8_t)pp->nacting);
    for (unsigned k = 0; k < pp->nacting; k++)
        ts_wr_str(&w, pp->acting[k]);
    ts_wr_u64(&w, pp->act_head_epoch);
    ts_wr_u64(&w, pp->act_head_seq);
    ts_wr_u8(&w, in_list((const char(*)[64])pp->acting, pp->nacting, to) ? 1 : 0);
    if (cb)
        pp->outstanding++;
    repl_peer_send(r, to, TS_OP_PG_ACTIVATE, &w, NULL, 0, NULL, NULL, cb ? cb : commit_reply, c,
                   pp->epoch);
}

static void commit_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    free(ctx); /* best effort: a member that missed it still has the interval pending */
}

/* Every node the activation talks to: the new acting set and the sets peering needed. */
static unsigned activation_targets(ts_repl *r, struct pgpeer *pp, char (*to)[64])
{
    unsigned nto = 0;

    for (unsigned i = 0; i < pp->nacting; i++)
        if (strcmp(pp->acting[i], r->node_id) &&
            !in_list((const char(*)[64])to, nto, pp->acting[i]))
            snprintf(to[nto++], 64, "%s", pp->acting[i]);
    for (unsigned k = 0; k < pp->nsets; k++)
        for (unsigned i = 0; i < pp->sets[k].n; i++)
            if (strcmp(pp->sets[k].ids[i], r->node_id) &&
                !in_list((const char(*)[64])to, nto, pp->sets[k].ids[i]))
                snprintf(to[nto++], 64, "%s", pp->sets[k].ids[i]);
    return nto;
}

static void activated(ts_repl *r, struct pgpeer *pp)
{
    char to[(TS_PEERING_MAX_SETS + 1) * TS_PG_MAX_ACTING][64];
    unsigned nto;
    int rc;

    rc = ts_store_pg_commit(r->o.store, pp->pg, pp->epoch, pp->wq, (const char(*)[64])pp->acting,
                            (uint8_t)pp->nacting);
    if (rc) {
        publish(r, pp, "cannot record the start of epoch %llu here: %s",
                (unsigned long long)pp->epoch, ts_strerror(rc));
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
        return;
    }
    set_state(r, pp, PGP_ACTIVE);
    publish(r, pp, "active since epoch %llu (acting set of %u, write quorum %u)",
            (unsigned long long)pp->epoch, pp->nacting, pp->wq);
    TS_INFO(FAC, "PG %u active at epoch %llu (%u member%s hold the whole log)", pp->pg,
            (unsigned long long)pp->epoch, pp->caught_up, pp->caught_up == 1 ? "" : "s");
    pp->round++;
    nto = activation_targets(r, pp, to);
    for (unsigned i = 0; i < nto; i++)
        send_activate(r, pp, 1, to[i], NULL);
    /* Replicas: compare their logs with ours now that ours is the acknowledged one. */
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (ps->pg == pp->pg && !ps->pull) {
            if (!ps->busy)
                ps->known = 0;
            repl_push_step(r, ps);
        }
    repl_waiters_check(r);
}

static void activate_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct pctx *c = ctx;
    struct pgpeer *pp = ctx_pp(r, c);
    char why[320];
    uint8_t recorded = 0;

    if (!pp || pp->state != PGP_ACTIVATE) {
        free(c);
        return;
    }
    pp->outstanding--;
    if (status == TS_ESTALE) {
        block(r, pp, c->node, pp->epoch + 1);
        free(c);
        return;
    }
    if (status == 0) {
        recorded = ts_rd_u8(body);
        if (body->err)
            recorded = 0;
    }
    if (recorded) {
        for (unsigned k = 0; k < pp->nsets; k++)
            pp->sets[k].have += set_has(&pp->sets[k], c->node);
        pp->caught_up += in_list((const char(*)[64])pp->acting, pp->nacting, c->node);
    }
    free(c);
    if (prepared(pp, why, sizeof(why))) {
        activated(r, pp);
        return;
    }
    if (pp->outstanding == 0 && !pp->sending) {
        publish(r, pp, "activating epoch %llu: %s", (unsigned long long)pp->epoch, why);
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
    }
}

/* Prepares the interval: here, then on every target; counts who recorded it. Called again (by
 * the timer) while members are being caught up by the pushers. */
static void start_activate(ts_repl *r, struct pgpeer *pp)
{
    char to[(TS_PEERING_MAX_SETS + 1) * TS_PG_MAX_ACTING][64];
    struct ts_pg_state me;
    unsigned nto;
    int rc, recorded = 0;

    if (pp->state != PGP_ACTIVATE) {
        set_state(r, pp, PGP_ACTIVATE);
        pp->activate_since_ns = ts_now_mono_ns();
    }
    pp->round++;
    pp->retry_at = 0;
    rc = ts_store_pg_state(r->o.store, pp->pg, &me);
    if (rc == 0) {
        pp->act_head_epoch = me.head_epoch;
        pp->act_head_seq = me.applied;
        rc = ts_store_pg_prepare(r->o.store, pp->pg, pp->epoch, pp->wq,
                                 (const char(*)[64])pp->acting, (uint8_t)pp->nacting, 1,
                                 me.head_epoch, me.applied, &recorded);
    }
    if (rc == TS_ESTALE) {
        block(r, pp, r->node_id, pp->epoch + 1);
        return;
    }
    if (rc) {
        publish(r, pp, "cannot record the interval here: %s", ts_strerror(rc));
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
        return;
    }
    for (unsigned k = 0; k < pp->nsets; k++)
        pp->sets[k].have = set_has(&pp->sets[k], r->node_id);
    pp->caught_up = 1; /* this node: it holds the head it prepared with */
    publish(r, pp, "activating epoch %llu", (unsigned long long)pp->epoch);
    pp->outstanding = 0;
    pp->sending = 1;
    nto = activation_targets(r, pp, to);
    for (unsigned i = 0; i < nto && pp->state == PGP_ACTIVATE; i++)
        send_activate(r, pp, 0, to[i], activate_reply);
    pp->sending = 0;
    if (pp->state == PGP_ACTIVATE) {
        char why[320];
        if (prepared(pp, why, sizeof(why)))
            activated(r, pp);
        else if (pp->outstanding == 0)
            pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
    }
}

/* ---- decisions ------------------------------------------------------------------------------ */

static void evaluate(ts_repl *r, struct pgpeer *pp)
{
    struct ts_peering_in in;
    struct ts_peering_out out;
    char(*nodes)[64] = calloc(r->map->n ? r->map->n : 1, 64);

    if (!nodes) {
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS; /* the timer asks again */
        return;
    }
    for (size_t i = 0; i < r->map->n; i++)
        snprintf(nodes[i], 64, "%s", r->map->nodes[i].id);
    memset(&in, 0, sizeof(in));
    in.epoch = pp->epoch;
    in.self = r->node_id;
    in.map_nodes = (const char(*)[64])nodes;
    in.nmap = r->map->n;
    in.replies = pp->replies;
    in.nreplies = pp->nreplies;
    in.self_needs_backfill = needs_backfill(r, pp->pg);
    if (ts_peering_decide(&in, &out) != 0) {
        free(nodes);
        pp->retry_at = ts_now_mono_ns() + REQUERY_NS; /* its own reply is missing: ask again */
        return;
    }
    free(nodes);
    switch (out.verdict) {
    case TS_PEERING_WAIT:
        publish(r, pp, "%s", out.why);
        if (pp->outstanding == 0) {
            TS_WARN(FAC, TS_EUNAVAIL, "PG %u (epoch %llu) cannot start yet: %s", pp->pg,
                    (unsigned long long)pp->epoch, out.why);
            pp->retry_at = ts_now_mono_ns() + REQUERY_NS;
        }
        return;
    case TS_PEERING_PULL:
        set_state(r, pp, PGP_PULL);
        pp->life_epoch = 0; /* our log may change: the next ACTIVATE verdict is a new life */
        pp->round++;        /* late query replies are not needed any more */
        pp->outstanding = 0;
        pp->pull_seq = out.head_seq;
        pp->pull_epoch = out.head_epoch;
        snprintf(pp->pull_from, sizeof(pp->pull_from), "%s", out.pull_from);
        pp->pull_since_ns = ts_now_mono_ns();
        publish(r, pp, "%s", out.why);
        TS_INFO(FAC, "PG %u (epoch %llu): %s", pp->pg, (unsigned long long)pp->epoch, out.why);
        send_pull(r, pp);
        return;
    default: {
        struct ts_pg_state me;
        pp->round++;
        /* A new life, unless this verdict repeats the last one: same interval, our log unchanged
         * (no pull since): then the replicas' positions and backfills still hold (a re-peer
         * while activating must not restart backfills that take longer than its timer). */
        if (ts_store_pg_state(r->o.store, pp->pg, &me) != 0 || !pp->life ||
            pp->life_epoch != pp->epoch || pp->life_he != me.head_epoch ||
            pp->life_hs != me.applied) {
            pp->life = ++r->lives; /* the pushes of an earlier verdict are over */
            pp->life_epoch = pp->epoch;
            pp->life_he = me.head_epoch;
            pp->life_hs = me.applied;
        }
        pp->outstanding = 0;
        memcpy(pp->sets, out.sets, sizeof(pp->sets));
        pp->nsets = out.nsets;
        TS_INFO(FAC, "PG %u (epoch %llu): %s", pp->pg, (unsigned long long)pp->epoch, out.why);
        start_activate(r, pp);
    }
    }
}

/* ---- map changes and timers ----------------------------------------------------------------- */

/* The largest core count and the smallest min_core of the datasets known here. */
struct widths {
    unsigned core, wq;
};

static int widths_cb(void *arg, const struct ts_dataset_info *d)
{
    struct widths *w = arg;
    if (d->policy.core > w->core)
        w->core = d->policy.core;
    if (!w->wq || d->policy.min_core < w->wq)
        w->wq = d->policy.min_core ? d->policy.min_core : 1;
    return 0;
}

static void pgpeer_free(struct pgpeer *pp)
{
    free(pp->replies);
    free(pp);
}

void repl_pgpeer_map_changed(ts_repl *r)
{
    struct widths wd = {0, 0};
    struct pgpeer **pp, *p;

    if (!r->map || r->self < 0)
        return;
    pthread_mutex_lock(&r->lock);
    if (r->npub != r->map->pg_count) { /* the first map, or a split: the PGs led stay */
        struct repl_pg_pub *pub = calloc(r->map->pg_count, sizeof(*pub));
        if (pub && r->pub)
            memcpy(pub, r->pub, TS_MIN(r->npub, r->map->pg_count) * sizeof(*pub));
        free(r->pub);
        r->pub = pub;
        r->npub = pub ? r->map->pg_count : 0;
    }
    pthread_mutex_unlock(&r->lock);
    ts_store_dataset_list(r->o.store, widths_cb, &wd);
    if (wd.core < 3)
        wd.core = 3; /* the default policy's; wider datasets widen the acting set */
    if (wd.core > TS_PG_MAX_ACTING)
        wd.core = TS_PG_MAX_ACTING;
    if (!wd.wq)
        wd.wq = 2; /* no dataset yet: the cluster default (core 3, min_core a majority) */
    for (pp = &r->pgs; (p = *pp);) {
        int order[TS_REPL_MAX_REPLICAS];
        size_t n = p->pg < r->map->pg_count
                       ? ts_map_pg_order(r->map, p->pg, order, TS_REPL_MAX_REPLICAS)
                       : 0;
        if (n == 0 || order[0] != r->self) {
            TS_INFO(FAC, "PG %u: no longer its primary (map epoch %llu)", p->pg,
                    (unsigned long long)r->map->epoch);
            *pp = p->next;
            unpublish(r, p->pg);
            pgpeer_free(p);
            continue;
        }
        pp = &p->next;
    }
    for (uint32_t pg = 0; pg < r->map->pg_count; pg++) {
        int order[TS_REPL_MAX_REPLICAS];
        size_t n = ts_map_pg_order(r->map, pg, order, TS_REPL_MAX_REPLICAS);
        char acting[TS_PG_MAX_ACTING][64];
        unsigned na = 0;

        if (n == 0 || order[0] != r->self)
            continue;
        for (size_t i = 0; i < n && na < wd.core; i++)
            snprintf(acting[na++], sizeof(acting[0]), "%s", r->map->nodes[order[i]].id);
        p = repl_pgpeer_find(r, pg);
        if (!p) {
            p = calloc(1, sizeof(*p));
            if (!p)
                continue;
            p->pg = pg;
            p->state = PGP_QUERY;
            p->next = r->pgs;
            r->pgs = p;
        }
        /* Every new map epoch starts a new interval, even with the same acting set: this node
         * may have missed epochs in which another primary led (it cannot tell from its map). */
        memcpy(p->acting, acting, sizeof(acting));
        p->nacting = na;
        p->wq = (uint8_t)wd.wq;
        p->epoch = r->map->epoch;
        TS_INFO(FAC, "PG %u: peering at epoch %llu (acting set of %u)", pg,
                (unsigned long long)p->epoch, na);
        start_round(r, p);
    }
}

void repl_pgpeer_tick(ts_repl *r)
{
    uint64_t now = ts_now_mono_ns();
    struct push **pp, *ps;

    for (struct pgpeer *p = r->pgs; p; p = p->next) {
        if (p->state == PGP_PULL) {
            struct ts_pg_state me;
            if (ts_store_pg_state(r->o.store, p->pg, &me) == 0 &&
                ts_peering_head_cmp(me.head_epoch, me.applied, p->pull_epoch, p->pull_seq) >= 0 &&
                !needs_backfill(r, p->pg)) {
                TS_INFO(FAC, "PG %u: caught up to (%llu, %llu) from %s", p->pg,
                        (unsigned long long)p->pull_epoch, (unsigned long long)p->pull_seq,
                        p->pull_from);
                start_round(r, p);
            } else if (p->retry_at && now >= p->retry_at) {
                /* Not there yet: ask everyone again (the source may have died; another replier
                 * may hold the head now), which pulls again from whoever has it. */
                if (now - p->pull_since_ns > 10ull * PULL_NUDGE_NS)
                    start_round(r, p);
                else
                    send_pull(r, p);
            }
            continue;
        }
        if (p->state == PGP_ACTIVATE && p->outstanding == 0 && p->retry_at && now >= p->retry_at) {
            /* Members are being caught up by the pushers meanwhile; after a while, peer again
             * (a node needed may have gone). */
            if (now - p->activate_since_ns > 10ull * 1000000000)
                start_round(r, p);
            else
                start_activate(r, p);
        } else if (p->state == PGP_QUERY && p->outstanding == 0 && p->retry_at &&
                   now >= p->retry_at)
            start_round(r, p);
    }
    /* Pulls that are done, and pushes of PGs this node no longer leads (busy at the map
     * change), go once idle. */
    for (pp = &r->pushes; (ps = *pp);) {
        if (ps->pull && repl_pgpeer_find(r, ps->pg) && repl_is_other_replica(r, ps->pg, ps->node)) {
            /* We lead the PG now and the puller is its replica: an ordinary push from here. */
            ps->pull = ps->pull_done = 0;
            if (!ps->busy)
                ps->known = 0;
        }
        if (!ps->busy && (ps->pull ? ps->pull_done : !repl_pgpeer_find(r, ps->pg))) {
            *pp = ps->next;
            repl_push_free(ps);
            continue;
        }
        pp = &ps->next;
    }
}

int repl_pgpeer_owns_ctx(pend_cb cb)
{
    return cb == query_reply || cb == pull_reply || cb == commit_reply || cb == activate_reply;
}

void repl_pgpeer_free_all(ts_repl *r)
{
    while (r->pgs) {
        struct pgpeer *p = r->pgs;
        r->pgs = p->next;
        pgpeer_free(p);
    }
    free(r->pub);
    r->pub = NULL;
    r->npub = 0;
}

/* ---- thread-safe entry points --------------------------------------------------------------- */

int ts_repl_pg_ready(ts_repl *r, uint32_t pg, uint64_t *epoch, uint8_t *wq, char *why, size_t cap)
{
    int rc = TS_EBUSY;

    pthread_mutex_lock(&r->lock);
    if (r->pub && pg < r->npub) {
        const struct repl_pg_pub *p = &r->pub[pg];
        if (p->state == PGP_ACTIVE && p->epoch) {
            rc = 0;
            if (epoch)
                *epoch = p->epoch;
            if (wq)
                *wq = p->wq;
        } else if (why) {
            snprintf(why, cap, "%s: %s", ts_repl_pg_state_name(p->epoch ? p->state : PGP_QUERY),
                     p->why[0] ? p->why : "peering has not started");
        }
    } else if (why) {
        snprintf(why, cap, "peering has not started");
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int ts_repl_pulling_from(ts_repl *r, uint32_t pg, const char *node)
{
    int yes = 0;

    pthread_mutex_lock(&r->lock);
    if (r->pub && pg < r->npub && r->pub[pg].state == PGP_PULL)
        yes = !strcmp(r->pub[pg].pull_from, node);
    pthread_mutex_unlock(&r->lock);
    return yes;
}

int ts_repl_pg_states(ts_repl *r, struct ts_repl_pgstat **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&r->lock);
    for (uint32_t pg = 0; r->pub && pg < r->npub; pg++)
        if (r->pub[pg].epoch)
            (*n)++;
    if (*n && !(*out = calloc(*n, sizeof(**out))))
        *n = 0;
    for (uint32_t pg = 0, k = 0; *out && pg < r->npub; pg++) {
        const struct repl_pg_pub *p = &r->pub[pg];
        if (!p->epoch)
            continue;
        (*out)[k].pg = pg;
        (*out)[k].state = ts_repl_pg_state_name(p->state);
        (*out)[k].active = p->state == PGP_ACTIVE;
        (*out)[k].epoch = p->epoch;
        (*out)[k].since_ns = p->since_ns;
        snprintf((*out)[k].why, sizeof((*out)[k].why), "%s", p->why);
        k++;
    }
    pthread_mutex_unlock(&r->lock);
    return 0;
}

struct pull_msg {
    ts_repl *r;
    uint32_t pg;
    uint64_t epoch;
    int recheck;
    char node[64];
};

static void pull_cb(evutil_socket_t fd, short what, void *arg)
{
    struct pull_msg *m = arg;
    repl_pull_start(m->r, m->pg, m->node, m->epoch, m->recheck);
    free(m);
}

void ts_repl_pull(ts_repl *r, uint32_t pg, const char *node, uint64_t epoch, int recheck)
{
    struct pull_msg *m = calloc(1, sizeof(*m));

    if (!m)
        return;
    m->r = r;
    m->pg = pg;
    m->epoch = epoch;
    m->recheck = recheck;
    snprintf(m->node, sizeof(m->node), "%s", node);
    event_base_once(r->base, -1, EV_TIMEOUT, pull_cb, m, NULL);
}

/* ---- a replica asking its primary to compare its log again (after a restart) ------------- */

struct recheck_msg {
    ts_repl *r;
    uint32_t pg;
    uint8_t how; /* 1: compare my log again; 2: backfill me */
};

static void recheck_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    if (status == TS_ESTALE)
        repl_on_stale(r, p, body);
}

static void recheck_cb(evutil_socket_t fd, short what, void *arg)
{
    struct recheck_msg *m = arg;
    ts_repl *r = m->r;
    int order[1];
    struct ts_wr w;

    if (r->map && m->pg < r->map->pg_count && ts_map_pg_order(r->map, m->pg, order, 1) == 1 &&
        order[0] != r->self) {
        ts_wr_init(&w);
        ts_wr_begin_frame(&w);
        ts_wr_u32(&w, m->pg);
        ts_wr_u64(&w, r->map->epoch);
        ts_wr_str(&w, r->node_id);
        ts_wr_u8(&w, m->how);
        repl_peer_send(r, r->map->nodes[order[0]].id, TS_OP_PG_PULL, &w, NULL, 0, NULL, NULL,
                       recheck_reply, NULL, 0);
    }
    free(m);
}

static void ask(ts_repl *r, uint32_t pg, uint8_t how)
{
    struct recheck_msg *m = calloc(1, sizeof(*m));

    if (!m)
        return;
    m->r = r;
    m->pg = pg;
    m->how = how;
    event_base_once(r->base, -1, EV_TIMEOUT, recheck_cb, m, NULL);
}

void ts_repl_ask_primary(ts_repl *r, uint32_t pg)
{
    ask(r, pg, 1);
}

void ts_repl_ask_backfill(ts_repl *r, uint32_t pg)
{
    ask(r, pg, 2);
}

/* ---- deletes through the PG logs ------------------------------------------------------------ */

struct del_msg {
    ts_repl *r;
    char name[TS_NAME_MAX + 1];
    uint64_t inc;
};

static void del_cb(evutil_socket_t fd, short what, void *arg)
{
    struct del_msg *m = arg;
    ts_repl *r = m->r;

    for (struct pgpeer *pp = r->pgs; pp; pp = pp->next) {
        struct ts_log_rec rec;
        int rc;
        if (pp->state != PGP_ACTIVE)
            continue;
        memset(&rec, 0, sizeof(rec));
        rec.pg = pp->pg;
        rec.epoch = pp->epoch;
        rec.type = TS_LOG_DELETE;
        rec.inc = m->inc;
        snprintf(rec.dataset, sizeof(rec.dataset), "%s", m->name);
        rc = ts_store_log_append(r->o.store, &rec);
        if (rc) {
            TS_ERROR(FAC, rc, "PG %u: cannot log the delete of %s", pp->pg, m->name);
            continue;
        }
        for (struct push *ps = r->pushes; ps; ps = ps->next)
            if (ps->pg == pp->pg)
                repl_push_step(r, ps);
    }
    free(m);
}

void ts_repl_log_delete(ts_repl *r, const char *dataset, uint64_t incarnation)
{
    struct del_msg *m = calloc(1, sizeof(*m));

    if (!m)
        return;
    m->r = r;
    snprintf(m->name, sizeof(m->name), "%s", dataset);
    m->inc = incarnation;
    event_base_once(r->base, -1, EV_TIMEOUT, del_cb, m, NULL);
}
