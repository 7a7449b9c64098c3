/*
 * A deterministic, seeded simulation of PG peering (FoundationDB style): one PG, 3 to 5 nodes,
 * a sequence of maps, messages delayed, reordered (in order per pair of nodes) and dropped,
 * nodes killed, restarted and cut off, maps reaching only some nodes, calm and stormy
 * stretches. The decisions are the real ones: ts_peering_decide(), ts_peering_quorum() and
 * ts_peering_rollback() (replication/peering.c). Everything around them (replication/pgpeer.c,
 * push.c, the server's handlers and writes, storage/pglog.c) is an in-memory model: per node, the
 * durable PG facts (log of (epoch, seq, write id), promised, les with its acting set and wq, the
 * pending intervals with theirs, at most TS_PG_MAX_PENDING) and volatile state (alive, reachable,
 * its map, its peering, its pushers' view of the replicas, its writes waiting for replicas).
 *
 * How the model maps to the code:
 *   set_map()          repl_pgpeer_map_changed(): every map epoch that makes the node the
 *                      primary (by placement in its own map) starts a new interval at that epoch
 *   start_round()      start_round(): promise the epoch here (blocked if a newer one was
 *                      promised), PG_QUERY to every node of the map
 *   M_QUERY            tsd_op_pg_query(): ts_store_pg_promise, reply the PG facts or ESTALE
 *   evaluate()         evaluate(): ts_peering_decide() on the replies so far
 *   M_PULLREQ          send_pull() / tsd_op_pg_pull() (fenced by the promise; refused: the
 *                      puller peers again from its timer) / repl_pull_start()
 *   M_PULLDATA         the source pushes its log to the puller under the puller's epoch; the
 *                      puller takes it only at that map epoch, under no newer promise, and
 *                      while it pulls from that node (sender_may_replicate); maybe cut short
 *   start_activate()   start_activate(): ts_store_pg_prepare here, PG_ACTIVATE phase 0 to the
 *                      new acting set and every set peering needed (out.sets[]); re-sent by
 *                      the timer (300 ms) while the pushers catch members up, or (after 10 s)
 *                      the node peers again
 *   M_ACT (phase 0)    tsd_op_pg_activate() / ts_store_pg_prepare(): promise; a member of the
 *                      new acting set records the pending interval only if its head is the
 *                      primary's; any other node records it as a witness. Recorded: it
 *                      replaces the pending interval of its epoch, else is added (not recorded
 *                      with TS_PG_MAX_PENDING pending already)
 *   prepared()         q of every set recorded it, and min(wq, |acting|) members of the new
 *                      acting set (the primary counts)
 *   activated()        ts_store_pg_commit here (les = E), PG_ACTIVATE phase 1 (best effort)
 *   M_ACT (phase 1)    ts_store_pg_commit(): les = E unless it knows a newer one; the pending
 *                      intervals up to E are removed
 *   do_write()         tsd_primary_check() + the seal: the active primary (in its own map), if
 *                      its own promise is not newer, appends (interval epoch, seq, write id)
 *                      and waits for need - 1 of the other core replicas (order[1..core) of
 *                      its map)
 *   push_to()          repl_push_step(): a replica whose position was learned in this life
 *                      (pgpeer.life, set by each ACTIVATE verdict) gets our entries after it;
 *                      otherwise PG_INFO asks where its log stands (stamped with the life and
 *                      interval it was asked in)
 *   M_INFO/INFOREPLY   tsd_op_pg_info() (not fenced) / pginfo_reply(): the replica's newest 32
 *                      entries compared with the pusher's log *as it is when the reply
 *                      arrives*, through the real ts_peering_rollback(): PREFIX (known at its
 *                      head; counts for writes; the push goes on), TRUNCATE, REFUSE or STALE
 *   M_TRUNC/TRUNCACK   REPL_SEAL TRUNCATE under the interval's epoch, fenced like a push; the
 *                      replica refuses to remove entries newer than that epoch; then compare again
 *   M_PUSH/PUSHACK     REPL_SEALs of the entries after the pusher's idea of the replica's
 *                      position: ts_pglog_begin() appends only the next entry (not older than
 *                      the head), the same entry again is fine, anything else stops the push
 *                      (TS_ERANGE: compare again). Frames carry the sender's map epoch; the
 *                      receiver refuses a frame whose epoch is not its map's (conn.c
 *                      epoch_fenced; the older side gets the newer map pushed), or below its
 *                      promise (fenced()), or from a node that is not the primary of its map
 *                      (sender_may_replicate). Replies of another life are ignored.
 *                      TESSERA_SIM_UNGUARDED=1: the push path before issue 27 (any reply
 *                      compared, any rollback sent under the map's epoch, no replica check)
 *   ack_check()        repl_waiters_check() + seal_replicated(): done when no reachable target
 *                      is still open (or at a deadline); acknowledged if need - 1 hold it and
 *                      still_leading() (our own promise is not newer than the write's epoch).
 *                      A map change or an activation makes the pushes that are not busy ask
 *                      again (forget_positions()); a busy one's reply counts only in the life
 *                      it was asked in (unguarded: also after the node stopped leading)
 *   M_MAP              MAP_PUSH: a node that sees a frame of an older epoch pushes its map
 *
 * Checked after every step: a node that becomes active in the newest interval so far holds
 * every acknowledged write; the primary of the newest activated interval, while active, holds
 * them all (so an older primary's late acknowledgement must be of a write it holds); every
 * acknowledged write is still on some node and is never rolled back anywhere; no two nodes
 * activate the same epoch. At the end: every node restarted, reachable and up in a final map,
 * peering, pulls, prepares and pushes retried until done; the final primary must be active and
 * able to write (else the PG is stuck: a liveness failure), and its log must hold every
 * acknowledged write exactly once, with non-decreasing epochs, a write acknowledged before
 * another was issued coming first.
 *
 * Faults: kills and restarts (with the newest map or the node's old one), nodes cut off (still
 * running: in their own map they may lead and push) and back, replication frames and replies
 * delivered twice, maps reaching only some nodes, dropped messages, a slow node, a slow link (its
 * messages held back while others go; at a failover, often the new primary's link to the old
 * one), fresh primaries failing over soon after they activate, calm and stormy stretches.
 *
 * Tests: scripted runs (A, B, C: the smallest losses found in the first version of the
 * protocol; D: the promise fencing a deposed primary that shares the replica's map epoch;
 * E: a prepare erasing the evidence of an older pending interval, found in this version;
 * F: the pending intervals filling up, a liveness failure of the first list version, fixed by
 * replacing a pending interval of the same acting set and write quorum; G: issue 27's PG 18, a
 * PG_INFO reply read by a primary that came back from a partition and peers again), then the
 * random runs.
 *
 * Environment: TESSERA_SIM_SEED=<n> runs that one seed with a step-by-step trace;
 * TESSERA_SIM_TRACE=1 traces the scripts; TESSERA_SIM_SEEDS / TESSERA_SIM_STEPS: how many
 * seeds, how many steps each (default 6000, 400); TESSERA_SIM_FIRST: the first seed (default 1);
 * TESSERA_SIM_LIST=1 lists every failing seed.
 */
#include "ts_test.h"

#include "peering.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 5
#define MAXLOG 1024
#define MAXMSG 4096
#define MAXEPOCH 1024
#define MAXW 1024

enum { R_NONE, R_QUERY, R_PULL, R_ACTIVATE, R_ACTIVE, R_BLOCKED };
static const char *const role_names[] = {"-", "query", "pull", "activate", "ACTIVE", "blocked"};

enum {
    M_QUERY,
    M_QREPLY,
    M_ACT,
    M_ACTREPLY,
    M_PULLREQ,
    M_PULLDATA,
    M_PUSH,
    M_PUSHACK,
    M_INFO,
    M_INFOREPLY,
    M_MAP,
    M_TRUNC,
    M_TRUNCACK
};
static const char *const msg_names[] = {"QUERY",    "QREPLY",   "ACTIVATE", "ACTREPLY", "PULL",
                                        "PULLDATA", "PUSH",     "PUSHACK",  "INFO",     "INFOREPLY",
                                        "MAP",      "TRUNCATE", "TRUNCACK"};

struct entry {
    uint64_t epoch, seq;
    uint32_t wid;
};

struct cfg {
    unsigned n, c, wq;
};

/* One set whose replies peering needed (struct ts_peering_set, with node numbers). */
struct pset {
    uint64_t epoch;
    int pending;
    int ids[TS_PG_MAX_ACTING];
    unsigned n, need, have;
};

/* An interval (struct ts_pg_interval, with node numbers). */
struct pint {
    uint64_t epoch;
    uint8_t wq, n;
    int acting[MAXN];
};

/* The PG facts a node reports (struct ts_pg_state, with node numbers: compact, as messages carry
 * them). */
struct facts {
    uint64_t applied, head_epoch, promised, les;
    uint8_t wq, nacting, npending;
    int acting[MAXN];
    struct pint pending[TS_PG_MAX_PENDING];
};

struct node {
    /* durable (ts_pg_state and the log) */
    struct entry log[MAXLOG];
    unsigned nlog;
    uint64_t promised, les;
    uint8_t wq, nacting;
    int acting[MAXN];
    uint8_t npending; /* the intervals being started (ts_pg_state.pending), unordered */
    struct pint pending[TS_PG_MAX_PENDING];
    /* volatile */
    int alive;
    int cut; /* alive but unreachable: its messages (and maps) are lost */
    uint64_t map_epoch;
    int role;
    uint64_t ep; /* the interval being started / led (pp->epoch) */
    unsigned round;
    int pacting[MAXN];
    unsigned npacting;
    uint8_t pwq;
    struct facts replies[MAXN]; /* the replies so far, from rfrom[] */
    int rfrom[MAXN];
    size_t nreplies;
    int pull_from;
    uint64_t pull_e, pull_s;
    struct pset sets[TS_PEERING_MAX_SETS]; /* ACTIVATE: the sets peering needed */
    unsigned nsets, caught_up;
    uint64_t act_e, act_s; /* the head it prepared with */
    uint64_t dec_L;        /* the last interval its ACTIVATE verdict was based on */
    int known[MAXN];
    uint64_t applied[MAXN];
    uint64_t life; /* pp->life: set by an ACTIVATE verdict that does not repeat the last */
    uint64_t life_epoch, life_he, life_hs;
    uint64_t asked_life[MAXN], asked_ival[MAXN]; /* ps->asked_life, ps->asked_interval */
};

struct msg {
    int type, from, to;
    uint64_t epoch; /* the frame's (or the payload's) epoch */
    unsigned round;
    int stale;  /* refused (TS_ESTALE or another error) */
    int flag;   /* ACT: phase 1 (commit); ACTREPLY: recorded; PUSHACK: the replier's map is older */
    int member; /* ACT: a member of the new acting set */
    struct facts st;
    struct entry *snap;
    unsigned nsnap;
    uint64_t pos, pos_e; /* PUSHACK/INFOREPLY: the replier's position; ACT: the primary's head */
    uint8_t wq, nacting;
    int acting[MAXN];
    uint64_t life, ival; /* INFO, PUSH, TRUNCATE and their replies: the pusher's life, interval */
    int erange;          /* PUSHACK: an entry was refused (not the next one): compare again */
};

enum { W_PENDING, W_ACKED, W_FAILED };

struct write {
    uint32_t wid;
    int node;
    uint64_t epoch, seq;
    int targets[MAXN];
    unsigned ntargets, min_acks;
    int state;
    unsigned issued_at, acked_at; /* acked_at: position in the acknowledgement order */
};

struct stats {
    unsigned long seeds, steps, writes, acked, wfail_fenced, wfail_acks, wfail_crash, activations,
        pulls, prepares, not_caught_up, repeers, stale_acts, heals, heal_iters, heal_max, msgs,
        dropped, kills, maps, refused_pushes, pend_max, pend_full, truncates, rb_refused, rb_stale,
        trunc_refused, dups;
};

struct sim {
    struct cfg cfg;
    uint64_t rng;
    int trace;    /* 1: events, with the nodes after activations, maps, violations; 2: every step */
    int dump_now; /* trace 1: show the nodes after this step */
    unsigned step;
    int healing;
    int reliable;  /* scripted runs: pushes and pulls are never cut short */
    int unguarded; /* the push path before issue 27: any reply compared, any rollback sent */
    uint64_t lives;
    int storm;
    int doom; /* a fresh primary that will fail over at step doom_at (+1; 0: none) */
    unsigned doom_at;
    int slow;               /* a node whose messages are slow (+1; 0: none) */
    int slow_from, slow_to; /* a link whose messages are held back (slow_to + 1; 0: none) */
    struct node nd[MAXN];
    int perm[MAXN];
    unsigned up[MAXEPOCH];
    uint64_t cur;
    struct msg msgs[MAXMSG];
    size_t nmsgs;
    struct write w[MAXW];
    unsigned nw, nacked;
    int act_node[MAXEPOCH]; /* who activated interval e (+1) */
    uint64_t emax;
    int emax_node;
    int failed;
    int keep_going; /* scripted runs: record violations and go on to the end */
    unsigned nviolations;
    char fail[2048], fail_last[2048];
    struct stats *st;
};

static struct sim S;
static char map_ids[MAXN][64];

/* ---- small helpers ------------------------------------------------------------------------ */

static uint64_t rnd(struct sim *s)
{
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static unsigned rn(struct sim *s, unsigned n)
{
    return n ? (unsigned)(rnd(s) % n) : 0;
}

static int chance(struct sim *s, unsigned pct)
{
    return rn(s, 100) < pct;
}

static void trace(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(struct sim *s, const char *fmt, ...)
{
    va_list ap;

    if (!s->trace)
        return;
    va_start(ap, fmt);
    printf("  [%3u] ", s->step);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static void violation(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(struct sim *s, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;

    if (s->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (s->trace)
        printf("  [%3u] *** VIOLATION: %s\n", s->step, msg);
    s->dump_now = 1;
    if (!s->fail[0])
        snprintf(s->fail, sizeof(s->fail), "%s", msg);
    snprintf(s->fail_last, sizeof(s->fail_last), "%s", msg);
    s->nviolations++;
    if (!s->keep_going)
        s->failed = 1;
}

static int node_of(const char *id)
{
    return atoi(id + 1);
}

static char *fmt_set(char *buf, size_t cap, const int *ids, unsigned n)
{
    size_t len = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < n && len + 4 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%sn%d", i ? "," : "", ids[i]);
    return buf;
}

static char *fmt_log(char *buf, size_t cap, const struct entry *log, unsigned n)
{
    size_t len = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < n && len + 24 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64 ".%" PRIu64 ":w%u", i ? " " : "",
                                log[i].epoch, log[i].seq, log[i].wid);
    return buf;
}

static int entry_eq(const struct entry *a, const struct entry *b)
{
    return a->epoch == b->epoch && a->seq == b->seq;
}

static uint64_t head_e(const struct node *nd)
{
    return nd->nlog ? nd->log[nd->nlog - 1].epoch : 0;
}

static uint64_t head_s(const struct node *nd)
{
    return nd->nlog ? nd->log[nd->nlog - 1].seq : 0;
}

static int has_wid(const struct node *nd, uint32_t wid)
{
    for (unsigned i = 0; i < nd->nlog; i++)
        if (nd->log[i].wid == wid)
            return 1;
    return 0;
}

static int in_set(const int *ids, unsigned n, int id)
{
    for (unsigned i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

static const struct write *acked_write(const struct sim *s, uint32_t wid)
{
    if (wid == 0 || wid > s->nw || s->w[wid - 1].state != W_ACKED)
        return NULL;
    return &s->w[wid - 1];
}

/* The UP nodes of map e in the PG's preference order: [0] the primary, the first c acting. */
static unsigned map_order(const struct sim *s, uint64_t e, int *out)
{
    unsigned n = 0;

    for (unsigned i = 0; i < s->cfg.n; i++)
        if (s->up[e] & (1u << s->perm[i]))
            out[n++] = s->perm[i];
    return n;
}

static int primary_of(const struct sim *s, uint64_t e)
{
    int order[MAXN];

    return map_order(s, e, order) ? order[0] : -1;
}

static struct facts state_of(const struct sim *s, int i)
{
    const struct node *nd = &s->nd[i];
    struct facts st;

    memset(&st, 0, sizeof(st));
    st.applied = head_s(nd);
    st.head_epoch = head_e(nd);
    st.promised = nd->promised;
    st.les = nd->les;
    st.wq = nd->wq;
    st.nacting = nd->nacting;
    memcpy(st.acting, nd->acting, sizeof(st.acting));
    st.npending = nd->npending;
    memcpy(st.pending, nd->pending, nd->npending * sizeof(nd->pending[0]));
    return st;
}

/* The facts as a ts_pg_state (what ts_repl_rd_pg_state() gives peering). */
static void pg_state_of(const struct facts *f, struct ts_pg_state *st)
{
    memset(st, 0, sizeof(*st));
    st->applied = f->applied;
    st->head_epoch = f->head_epoch;
    st->promised = f->promised;
    st->les = f->les;
    st->wq = f->wq;
    st->nacting = f->nacting;
    for (unsigned k = 0; k < f->nacting; k++)
        snprintf(st->acting[k], sizeof(st->acting[k]), "n%d", f->acting[k]);
    st->npending = f->npending;
    for (unsigned x = 0; x < f->npending; x++) {
        struct ts_pg_interval *iv = &st->pending[x];
        iv->epoch = f->pending[x].epoch;
        iv->wq = f->pending[x].wq;
        iv->n = f->pending[x].n;
        for (unsigned k = 0; k < iv->n; k++)
            snprintf(iv->acting[k], sizeof(iv->acting[k]), "n%d", f->pending[x].acting[k]);
    }
}

static char *fmt_pending(char *buf, size_t cap, const struct node *nd)
{
    size_t len = 0;
    char sb[64];

    buf[0] = '\0';
    if (!nd->npending)
        return snprintf(buf, cap, "-"), buf;
    for (unsigned x = 0; x < nd->npending && len + 40 < cap; x++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64 "{%s}", x ? " " : "",
                                nd->pending[x].epoch,
                                fmt_set(sb, sizeof(sb), nd->pending[x].acting, nd->pending[x].n));
    return buf;
}

static void dump_nodes(struct sim *s)
{
    char lb[4096], ab[64], pb[64], qb[1024];

    if (!s->trace)
        return;
    for (unsigned i = 0; i < s->cfg.n; i++) {
        const struct node *nd = &s->nd[i];
        printf("        n%u %s%s map%-3" PRIu64 " %-8s ep%-3" PRIu64 " promised %-3" PRIu64
               " les %-3" PRIu64 " {%s} wq%u pend %s%s%s | %s\n",
               i, nd->alive ? "up" : "DEAD", nd->cut ? "/cut" : "    ", nd->map_epoch,
               role_names[nd->role], nd->ep, nd->promised, nd->les,
               fmt_set(ab, sizeof(ab), nd->acting, nd->nacting), nd->wq,
               fmt_pending(qb, sizeof(qb), nd), nd->role != R_NONE ? " acting " : "",
               nd->role != R_NONE ? fmt_set(pb, sizeof(pb), nd->pacting, nd->npacting) : "",
               fmt_log(lb, sizeof(lb), nd->log, nd->nlog));
    }
}

/* ---- the network -------------------------------------------------------------------------- */

static struct msg *send_msg(struct sim *s, int type, int from, int to, uint64_t epoch,
                            unsigned round)
{
    struct msg *m;

    if (s->nmsgs == MAXMSG) {
        s->st->dropped++;
        return NULL;
    }
    m = &s->msgs[s->nmsgs++];
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->from = from;
    m->to = to;
    m->epoch = epoch;
    m->round = round;
    s->st->msgs++;
    return m;
}

static void set_snap(struct msg *m, const struct node *nd)
{
    if (!m)
        return;
    m->nsnap = nd->nlog;
    m->snap = malloc((nd->nlog ? nd->nlog : 1) * sizeof(*m->snap));
    assert_non_null(m->snap);
    memcpy(m->snap, nd->log, nd->nlog * sizeof(*m->snap));
}

/* A replication frame or reply delivered twice (the copy later): a retry, a reconnect. */
static void dup_msg(struct sim *s, const struct msg *m)
{
    struct msg *c;

    if (m->type != M_PUSH && m->type != M_PUSHACK && m->type != M_INFOREPLY && m->type != M_TRUNC &&
        m->type != M_TRUNCACK)
        return;
    if (s->nmsgs == MAXMSG)
        return;
    c = &s->msgs[s->nmsgs++];
    *c = *m;
    if (m->snap) {
        c->snap = malloc((m->nsnap ? m->nsnap : 1) * sizeof(*c->snap));
        assert_non_null(c->snap);
        memcpy(c->snap, m->snap, m->nsnap * sizeof(*c->snap));
    }
    s->st->dups++;
}

static void msg_take(struct sim *s, size_t k, struct msg *out)
{
    *out = s->msgs[k];
    memmove(&s->msgs[k], &s->msgs[k + 1], (s->nmsgs - k - 1) * sizeof(s->msgs[0]));
    s->nmsgs--;
}

/* A node that sees a frame of an older epoch than its map pushes its map (tsd_peer_map_check). */
static void map_check(struct sim *s, int at, int from, uint64_t epoch)
{
    if (epoch && epoch < s->nd[at].map_epoch)
        send_msg(s, M_MAP, at, from, s->nd[at].map_epoch, 0);
}

/*
 * A REPL frame (a push, or a pull's data) of epoch e from `from` at node `at`: 0 if taken, else
 * refused: at another map epoch (conn.c epoch_fenced; *older says the receiver's map is the
 * older one), under a newer promise (fenced()), or from a node that is neither the primary of
 * the receiver's map nor the node it pulls from (sender_may_replicate).
 */
static int repl_refused(struct sim *s, int at, int from, uint64_t e, int *older)
{
    struct node *nd = &s->nd[at];

    *older = 0;
    if (e != nd->map_epoch) {
        map_check(s, at, from, e);
        *older = e > nd->map_epoch;
        return 1;
    }
    if (nd->promised > e)
        return 1;
    if (primary_of(s, nd->map_epoch) != from && !(nd->role == R_PULL && nd->pull_from == from))
        return 1;
    return 0;
}

/* ---- logs --------------------------------------------------------------------------------- */

static unsigned lcp(const struct entry *a, unsigned na, const struct entry *b, unsigned nb)
{
    unsigned k = 0;

    while (k < na && k < nb && entry_eq(&a[k], &b[k]))
        k++;
    return k;
}

/*
 * dst receives src's log the way a pusher sends it: a log that is a prefix of src's is
 * extended; otherwise it is rolled back to the last common entry first (entries beyond the
 * sender's head are not the sender's: they go too). partial: the push may stop after any
 * number of entries (a crash or a cut connection mid-way). An acknowledged write is never
 * rolled back.
 */
static void apply_log(struct sim *s, int to, int from, const struct entry *src, unsigned nsrc,
                      int partial)
{
    struct node *dst = &s->nd[to];
    unsigned k = lcp(dst->log, dst->nlog, src, nsrc), upto = nsrc;

    if (k < dst->nlog) {
        trace(s, "    n%d rolled back from (%" PRIu64 ",%" PRIu64 ") to seq %u", to, head_e(dst),
              head_s(dst), k);
        for (unsigned x = k; x < dst->nlog; x++) {
            const struct write *w = acked_write(s, dst->log[x].wid);
            if (w)
                violation(s,
                          "n%d rolled back acknowledged write w%u (%" PRIu64 ".%" PRIu64
                          ", acknowledged by n%d), pushed the log of n%d",
                          to, w->wid, w->epoch, w->seq, w->node, from);
        }
    }
    dst->nlog = k;
    if (partial && !s->healing && !s->reliable && chance(s, 8))
        upto = k + rn(s, nsrc - k + 1);
    for (unsigned i = k; i < upto; i++)
        dst->log[dst->nlog++] = src[i];
}

/* ---- the durable PG facts (storage/pglog.c) ----------------------------------------------- */

/* ts_store_pg_prepare(): returns 0 (recorded or not), or -1 when a newer epoch was promised.
 * The interval replaces the pending one of the same epoch, else is added; with
 * TS_PG_MAX_PENDING pending already it is not recorded. */
/* ts_store_pg_prepare()'s same_interval_set(): same members (any order) and write quorum. */
static int same_set(const struct pint *iv, uint8_t wq, const int *acting, unsigned na)
{
    if (iv->wq != wq || iv->n != na)
        return 0;
    for (unsigned i = 0; i < na; i++) {
        unsigned j = 0;
        while (j < iv->n && iv->acting[j] != acting[i])
            j++;
        if (j == iv->n)
            return 0;
    }
    return 1;
}

static int pg_prepare(struct stats *stp, struct node *nd, uint64_t e, uint8_t wq, const int *acting,
                      unsigned na, int member, uint64_t he, uint64_t hs, int *recorded)
{
    *recorded = 0;
    if (e < nd->promised)
        return -1;
    nd->promised = e;
    if (!member || (head_e(nd) == he && head_s(nd) == hs)) {
        unsigned k = 0;
        while (k < nd->npending && nd->pending[k].epoch != e &&
               !same_set(&nd->pending[k], wq, acting, na))
            k++;
        if (k == nd->npending && k < TS_PG_MAX_PENDING)
            nd->npending++;
        if (k < nd->npending) {
            struct pint *iv = &nd->pending[k];
            iv->epoch = e;
            iv->wq = wq;
            iv->n = (uint8_t)na;
            memcpy(iv->acting, acting, na * sizeof(acting[0]));
            *recorded = 1;
            if (nd->npending > stp->pend_max)
                stp->pend_max = nd->npending;
        } else {
            stp->pend_full++;
        }
    }
    return 0;
}

/* ts_store_pg_commit(): interval e started (no promise check: it is a fact); the pending
 * intervals up to e are removed (the last one takes the place of a removed one). */
static void pg_commit(struct node *nd, uint64_t e, uint8_t wq, const int *acting, unsigned na)
{
    if (e <= nd->les)
        return;
    if (e > nd->promised)
        nd->promised = e;
    nd->les = e;
    nd->wq = wq;
    nd->nacting = (uint8_t)na;
    memcpy(nd->acting, acting, na * sizeof(acting[0]));
    for (unsigned k = 0; k < nd->npending;) {
        if (nd->pending[k].epoch <= e) {
            nd->pending[k] = nd->pending[--nd->npending];
            continue;
        }
        k++;
    }
}

/* ---- peering (pgpeer.c) ------------------------------------------------------------------- */

static void start_round(struct sim *s, int i);

/* "Positions may have moved: ask again": every push of node i that is not busy (a request
 * outstanding; its reply still counts) forgets the replica's position. */
static void forget_positions(struct sim *s, int i)
{
    for (unsigned k = 0; k < MAXN; k++)
        if (s->healing || s->reliable || !chance(s, 30))
            s->nd[i].known[k] = 0;
}

static void block(struct sim *s, int i, const char *why)
{
    struct node *nd = &s->nd[i];

    nd->role = R_BLOCKED;
    nd->round++;
    trace(s, "n%d blocked at epoch %" PRIu64 ": %s", i, nd->ep, why);
}

/* Every node the activation talks to: the new acting set and the sets peering needed. */
static unsigned activation_targets(const struct node *nd, int self, int *to)
{
    unsigned nto = 0;

    for (unsigned k = 0; k < nd->npacting; k++)
        if (nd->pacting[k] != self && !in_set(to, nto, nd->pacting[k]))
            to[nto++] = nd->pacting[k];
    for (unsigned k = 0; k < nd->nsets; k++)
        for (unsigned t = 0; t < nd->sets[k].n; t++)
            if (nd->sets[k].ids[t] != self && !in_set(to, nto, nd->sets[k].ids[t]))
                to[nto++] = nd->sets[k].ids[t];
    return nto;
}

static int prepared(const struct node *nd)
{
    unsigned need = nd->pwq < nd->npacting ? nd->pwq : nd->npacting;

    for (unsigned k = 0; k < nd->nsets; k++)
        if (nd->sets[k].have < nd->sets[k].need)
            return 0;
    return nd->caught_up >= need;
}

static void send_activate(struct sim *s, int i, int to, int phase)
{
    struct node *nd = &s->nd[i];
    struct msg *m = send_msg(s, M_ACT, i, to, nd->ep, nd->round);

    if (!m)
        return;
    m->flag = phase;
    m->member = in_set(nd->pacting, nd->npacting, to);
    m->pos_e = nd->act_e;
    m->pos = nd->act_s;
    m->wq = nd->pwq;
    m->nacting = (uint8_t)nd->npacting;
    memcpy(m->acting, nd->pacting, sizeof(m->acting));
}

static void activated(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];
    int to[2 * MAXN];
    unsigned nto;
    char lb[4096];

    pg_commit(nd, nd->ep, nd->pwq, nd->pacting, nd->npacting);
    nd->role = R_ACTIVE;
    nd->round++;
    nto = activation_targets(nd, i, to);
    for (unsigned k = 0; k < nto; k++)
        send_activate(s, i, to[k], 1);
    forget_positions(s, i);
    s->st->activations++;
    trace(s, "n%d ACTIVE at epoch %" PRIu64 " (%u caught up) log %s", i, nd->ep, nd->caught_up,
          fmt_log(lb, sizeof(lb), nd->log, nd->nlog));
    if (s->act_node[nd->ep] && s->act_node[nd->ep] != i + 1)
        violation(s, "two primaries activated epoch %" PRIu64 ": n%d and n%d", nd->ep,
                  s->act_node[nd->ep] - 1, i);
    s->act_node[nd->ep] = i + 1;
    s->dump_now = 1;
    if (!s->healing && !s->reliable && chance(s, s->storm ? 50 : 15)) { /* buggify */
        s->doom = i + 1;
        s->doom_at = s->step + 1 + rn(s, 12);
    }
    if (nd->ep < s->emax) {
        s->st->stale_acts++; /* an older interval completing late: fenced, checked below */
        return;
    }
    for (unsigned k = 0; k < s->nw; k++)
        if (s->w[k].state == W_ACKED && !has_wid(nd, s->w[k].wid))
            violation(s,
                      "n%d activated epoch %" PRIu64 " without acknowledged write w%u (%" PRIu64
                      ".%" PRIu64
                      ", acknowledged by n%d); its verdict was based on interval %" PRIu64
                      " (%s; the newest activated interval is %" PRIu64 ")",
                      i, nd->ep, s->w[k].wid, s->w[k].epoch, s->w[k].seq, s->w[k].node, nd->dec_L,
                      nd->dec_L < MAXEPOCH && !s->act_node[nd->dec_L] && nd->dec_L
                          ? "one that never became active"
                      : nd->dec_L < s->emax ? "an older one"
                                            : "that one",
                      s->emax);
    s->emax = nd->ep;
    s->emax_node = i;
}

/* Prepares the interval: here, then on every target (again from the timer). */
static void start_activate(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];
    int to[2 * MAXN], recorded;
    unsigned nto;

    nd->role = R_ACTIVATE;
    nd->round++;
    nd->act_e = head_e(nd);
    nd->act_s = head_s(nd);
    if (pg_prepare(s->st, nd, nd->ep, nd->pwq, nd->pacting, nd->npacting, 1, nd->act_e, nd->act_s,
                   &recorded)) {
        block(s, i, "a newer epoch was promised here");
        return;
    }
    s->st->prepares++;
    for (unsigned k = 0; k < nd->nsets; k++)
        nd->sets[k].have = in_set(nd->sets[k].ids, nd->sets[k].n, i);
    nd->caught_up = 1;
    nto = activation_targets(nd, i, to);
    for (unsigned k = 0; k < nto; k++)
        send_activate(s, i, to[k], 0);
    if (prepared(nd))
        activated(s, i);
}

static void evaluate(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];
    struct ts_peering_in in;
    struct ts_peering_out out;
    static struct ts_peer_reply replies[MAXN];
    char self[64];

    snprintf(self, sizeof(self), "n%d", i);
    memset(&in, 0, sizeof(in));
    in.epoch = nd->ep;
    in.self = self;
    in.map_nodes = (const char(*)[64])map_ids;
    in.nmap = s->cfg.n;
    for (size_t k = 0; k < nd->nreplies; k++) {
        snprintf(replies[k].id, sizeof(replies[k].id), "n%d", nd->rfrom[k]);
        pg_state_of(&nd->replies[k], &replies[k].st);
    }
    in.replies = replies;
    in.nreplies = nd->nreplies;
    assert_int_equal(ts_peering_decide(&in, &out), 0);
    switch (out.verdict) {
    case TS_PEERING_WAIT:
        return;
    case TS_PEERING_PULL:
        nd->role = R_PULL;
        nd->life_epoch = 0;
        nd->round++;
        nd->pull_from = node_of(out.pull_from);
        nd->pull_e = out.head_epoch;
        nd->pull_s = out.head_seq;
        s->st->pulls++;
        trace(s, "n%d decides PULL: %s", i, out.why);
        send_msg(s, M_PULLREQ, i, nd->pull_from, nd->ep, nd->round);
        return;
    default:
        nd->round++;
        nd->nsets = out.nsets;
        for (unsigned k = 0; k < out.nsets; k++) {
            struct pset *p = &nd->sets[k];
            memset(p, 0, sizeof(*p));
            p->epoch = out.sets[k].epoch;
            p->pending = out.sets[k].pending;
            p->n = out.sets[k].n;
            p->need = out.sets[k].need;
            for (unsigned t = 0; t < p->n; t++)
                p->ids[t] = node_of(out.sets[k].ids[t]);
        }
        nd->dec_L = out.last_interval;
        if (!nd->life || nd->life_epoch != nd->ep || nd->life_he != head_e(nd) ||
            nd->life_hs != head_s(nd)) {
            nd->life = ++s->lives;
            nd->life_epoch = nd->ep;
            nd->life_he = head_e(nd);
            nd->life_hs = head_s(nd);
        }
        trace(s, "n%d decides ACTIVATE at epoch %" PRIu64 ": %s", i, nd->ep, out.why);
        start_activate(s, i);
    }
}

static void add_reply(struct node *nd, int from, const struct facts *st)
{
    size_t k = 0;

    while (k < nd->nreplies && nd->rfrom[k] != from)
        k++;
    if (k == nd->nreplies)
        nd->rfrom[nd->nreplies++] = from;
    nd->replies[k] = *st;
}

static void start_round(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];
    struct facts me;

    nd->round++;
    nd->nreplies = 0;
    nd->role = R_QUERY;
    if (nd->promised > nd->ep) {
        block(s, i, "promised a newer epoch itself");
        return;
    }
    nd->promised = nd->ep;
    me = state_of(s, i);
    add_reply(nd, i, &me);
    trace(s, "n%d queries at epoch %" PRIu64 " (round %u)", i, nd->ep, nd->round);
    for (unsigned j = 0; j < s->cfg.n; j++)
        if ((int)j != i)
            send_msg(s, M_QUERY, i, (int)j, nd->ep, nd->round);
    evaluate(s, i);
}

/* repl_pgpeer_map_changed() for node i installing map e: every map epoch that makes it the
 * primary starts a new interval, even with the same acting set. */
static void set_map(struct sim *s, int i, uint64_t e)
{
    struct node *nd = &s->nd[i];
    int order[MAXN];
    unsigned no = map_order(s, e, order);

    nd->map_epoch = e;
    forget_positions(s, i);
    if (no == 0 || order[0] != i) {
        if (nd->role != R_NONE)
            trace(s, "n%d: no longer the primary in map %" PRIu64, i, e);
        nd->role = R_NONE;
        nd->round++;
        return;
    }
    nd->npacting = no < s->cfg.c ? no : s->cfg.c;
    memcpy(nd->pacting, order, nd->npacting * sizeof(order[0]));
    nd->pwq = (uint8_t)s->cfg.wq;
    nd->ep = e;
    start_round(s, i);
}

/* ---- message handlers --------------------------------------------------------------------- */

static void push_to(struct sim *s, int i, int j);

/* push_life(): the life a push of node nd belongs to now (0: it must not push: neither
 * activating nor active) and its interval. */
static uint64_t pusher_life(const struct node *nd, uint64_t *ival)
{
    *ival = 0;
    if (!nd->alive || (nd->role != R_ACTIVE && nd->role != R_ACTIVATE))
        return 0;
    *ival = nd->ep;
    return nd->life;
}

/* push_current(): a reply of (life, ival) still counts for the push to j. */
static int push_current(const struct node *nd, int j, uint64_t life, uint64_t ival)
{
    uint64_t now_ival, now = pusher_life(nd, &now_ival);

    return now && now == life && now_ival == ival && nd->asked_life[j] == life;
}

/* The REPL_SEALs of m (entries m->pos + 1 ...) at node m->to: ts_pglog_begin() takes an entry
 * that is the next one (seq = applied + 1, epoch not older than the head); one already there
 * and the same is skipped (TS_EEXIST); anything else stops the push (TS_ERANGE). It may stop
 * after any entry (a cut connection). */
static void append_entries(struct sim *s, const struct msg *m, struct msg *r)
{
    struct node *dst = &s->nd[m->to];
    unsigned upto = m->nsnap, x;

    if (!s->healing && !s->reliable && chance(s, 8) && m->nsnap > m->pos)
        upto = (unsigned)m->pos + rn(s, m->nsnap - (unsigned)m->pos + 1);
    for (x = (unsigned)m->pos; x < upto; x++) {
        const struct entry *e = &m->snap[x];
        if (x < dst->nlog) {
            if (entry_eq(&dst->log[x], e))
                continue;
            break;
        }
        if (x > dst->nlog || e->epoch < head_e(dst) || dst->nlog == MAXLOG)
            break;
        dst->log[dst->nlog++] = *e;
    }
    if (!r)
        return;
    r->erange = x < upto;
    r->pos = x;
    r->pos_e = x ? m->snap[x - 1].epoch : 0;
}

/* A push's REPL_SEAL (or TRUNCATE) m at its receiver: the reply of `type` (*r, echoing the
 * pusher's life and interval) is queued; 1 when the frame is taken, 0 when repl_refused()
 * refused it (the reply then says so, and whether the receiver's map is the older one). */
static int repl_frame_taken(struct sim *s, const struct msg *m, int type, struct msg **r)
{
    int older;

    *r = send_msg(s, type, m->to, m->from, m->epoch, 0);
    if (*r) {
        (*r)->life = m->life;
        (*r)->ival = m->ival;
    }
    if (!repl_refused(s, m->to, m->from, m->epoch, &older))
        return 1;
    s->st->refused_pushes++;
    if (*r) {
        (*r)->stale = 1;
        (*r)->flag = older;
    }
    return 0;
}

/* ts_store_pg_truncate() at node `to`, told by `from`: entries after seq `to_seq` go. */
static void truncate_log(struct sim *s, int to, int from, uint64_t to_seq)
{
    struct node *dst = &s->nd[to];

    if (to_seq >= dst->nlog)
        return;
    s->st->truncates++;
    trace(s, "    n%d rolled back from (%" PRIu64 ",%" PRIu64 ") to seq %" PRIu64 " by n%d", to,
          head_e(dst), head_s(dst), to_seq, from);
    for (unsigned x = (unsigned)to_seq; x < dst->nlog; x++) {
        const struct write *w = acked_write(s, dst->log[x].wid);
        if (w)
            violation(s,
                      "n%d rolled back acknowledged write w%u (%" PRIu64 ".%" PRIu64
                      ", acknowledged by n%d), told by n%d",
                      to, w->wid, w->epoch, w->seq, w->node, from);
    }
    dst->nlog = (unsigned)to_seq;
}

/*
 * pginfo_reply(): the replica's log (its newest 32 entries, as PG_INFO sends them) compared with
 * ours as it is now, through the real decision (ts_peering_rollback). Unguarded (the code before
 * issue 27): any reply is compared, whatever this node's state and the life it was asked in,
 * and a rollback goes out under the map's epoch.
 */
static void info_reply(struct sim *s, const struct msg *m)
{
    struct node *nd = &s->nd[m->to];
    struct ts_log_pos tail[32];
    uint64_t ours[32];
    struct ts_rollback_in in;
    struct ts_rollback_out out;
    size_t n = 0;
    struct msg *t;

    for (unsigned x = m->nsnap; x > 0 && n < 32; x--, n++) {
        tail[n].seq = m->snap[x - 1].seq;
        tail[n].epoch = m->snap[x - 1].epoch;
        ours[n] = tail[n].seq <= nd->nlog ? nd->log[tail[n].seq - 1].epoch : 0;
    }
    memset(&in, 0, sizeof(in));
    in.life = pusher_life(nd, &in.interval);
    in.authoritative = in.life != 0;
    in.asked_life = m->life;
    in.asked_interval = m->ival;
    if (s->unguarded) {
        in.authoritative = 1;
        in.life = in.asked_life = 1;
        in.interval = in.asked_interval = UINT64_MAX - 1;
    }
    in.my_epoch = head_e(nd);
    in.my_applied = head_s(nd);
    in.applied = m->nsnap ? m->snap[m->nsnap - 1].seq : 0;
    in.head_epoch = m->nsnap ? m->snap[m->nsnap - 1].epoch : 0;
    in.tail = tail;
    in.ntail = n;
    in.ours = ours;
    if (n && tail[n - 1].seq > 1 && tail[n - 1].seq - 1 <= nd->nlog)
        in.ours_before = nd->log[tail[n - 1].seq - 2].epoch;
    assert_int_equal(ts_peering_rollback(&in, &out), 0);
    switch (out.verdict) {
    case TS_ROLLBACK_PREFIX:
        if (!s->unguarded || nd->asked_life[m->from] == m->life) {
            uint64_t ival;
            nd->known[m->from] = 1;
            nd->applied[m->from] = out.to;
            if (out.to < nd->nlog && pusher_life(nd, &ival))
                push_to(s, m->to, m->from); /* repl_push_step(): catch it up */
        }
        break;
    case TS_ROLLBACK_TRUNCATE:
        trace(s, "n%d -> n%d: %s", m->to, m->from, out.why);
        t = send_msg(s, M_TRUNC, m->to, m->from, s->unguarded ? nd->map_epoch : in.interval, 0);
        if (t) {
            t->pos = out.to;
            t->pos_e = out.to_epoch;
            t->life = m->life;
            t->ival = m->ival;
        }
        nd->known[m->from] = 0;
        break;
    case TS_ROLLBACK_REFUSE:
        s->st->rb_refused++;
        trace(s, "n%d -> n%d: %s", m->to, m->from, out.why);
        nd->known[m->from] = 0;
        break;
    default:
        s->st->rb_stale++;
        nd->known[m->from] = 0;
    }
}

static void deliver(struct sim *s, struct msg *m)
{
    struct node *nd = &s->nd[m->to];
    struct msg *r;
    int older, rec;

    if (!nd->alive) {
        trace(s, "%s n%d->n%d lost: n%d is down", msg_names[m->type], m->from, m->to, m->to);
        return;
    }
    if (nd->cut || s->nd[m->from].cut) {
        trace(s, "%s n%d->n%d lost: n%d is cut off", msg_names[m->type], m->from, m->to,
              nd->cut ? m->to : m->from);
        return;
    }
    trace(s, "deliver %s%s n%d->n%d epoch %" PRIu64 "%s%s", msg_names[m->type],
          m->type == M_ACT ? (m->flag ? " (commit)" : " (prepare)") : "", m->from, m->to, m->epoch,
          m->stale ? " (refused)" : "",
          m->type == M_ACTREPLY && !m->stale ? (m->flag ? " (recorded)" : " (not caught up)") : "");
    switch (m->type) {
    case M_QUERY:
        map_check(s, m->to, m->from, m->epoch);
        r = send_msg(s, M_QREPLY, m->to, m->from, m->epoch, m->round);
        if (nd->promised > m->epoch) {
            if (r)
                r->stale = 1;
            break;
        }
        nd->promised = m->epoch;
        if (r)
            r->st = state_of(s, m->to);
        break;
    case M_QREPLY:
        if (nd->role != R_QUERY || nd->round != m->round)
            break;
        if (m->stale) {
            block(s, m->to, "a replier promised a newer epoch");
            break;
        }
        add_reply(nd, m->from, &m->st);
        evaluate(s, m->to);
        break;
    case M_ACT:
        map_check(s, m->to, m->from, m->epoch);
        if (m->flag) { /* commit: best effort, no reply */
            pg_commit(nd, m->epoch, m->wq, m->acting, m->nacting);
            break;
        }
        r = send_msg(s, M_ACTREPLY, m->to, m->from, m->epoch, m->round);
        if (pg_prepare(s->st, nd, m->epoch, m->wq, m->acting, m->nacting, m->member, m->pos_e,
                       m->pos, &rec)) {
            if (r)
                r->stale = 1;
            break;
        }
        if (!rec)
            s->st->not_caught_up++;
        if (r)
            r->flag = rec;
        break;
    case M_ACTREPLY:
        if (nd->role != R_ACTIVATE || nd->round != m->round)
            break;
        if (m->stale) {
            block(s, m->to, "a prepare was refused");
            break;
        }
        if (m->flag) {
            for (unsigned k = 0; k < nd->nsets; k++)
                nd->sets[k].have += in_set(nd->sets[k].ids, nd->sets[k].n, m->from);
            nd->caught_up += in_set(nd->pacting, nd->npacting, m->from);
        }
        if (prepared(nd))
            activated(s, m->to);
        break;
    case M_PULLREQ: /* tsd_op_pg_pull(): fenced, then this node pushes its log */
        map_check(s, m->to, m->from, m->epoch);
        r = send_msg(s, M_PULLDATA, m->to, m->from, m->epoch, m->round);
        if (nd->promised > m->epoch ||
            (m->epoch == nd->map_epoch && primary_of(s, nd->map_epoch) != m->from)) {
            if (r)
                r->stale = 1;
            break;
        }
        set_snap(r, nd);
        break;
    case M_PULLDATA:
        if (m->stale) { /* pull_reply(): the source refused: peer again, from the timer */
            if (nd->role == R_PULL && nd->round == m->round) {
                nd->role = R_QUERY;
                nd->round++;
                trace(s, "n%d: n%d refused the pull: peering again", m->to, m->from);
            }
            break;
        }
        if (repl_refused(s, m->to, m->from, m->epoch, &older)) {
            s->st->refused_pushes++;
            break;
        }
        apply_log(s, m->to, m->from, m->snap, m->nsnap, 1);
        if (nd->role == R_PULL &&
            ts_peering_head_cmp(head_e(nd), head_s(nd), nd->pull_e, nd->pull_s) >= 0) {
            trace(s, "n%d caught up to (%" PRIu64 ",%" PRIu64 ")", m->to, nd->pull_e, nd->pull_s);
            start_round(s, m->to);
        }
        break;
    case M_PUSH: /* REPL_SEAL of the entries from m->pos: each the next one, or refused */
        if (!repl_frame_taken(s, m, M_PUSHACK, &r))
            break;
        append_entries(s, m, r);
        break;
    case M_PUSHACK:
        if (m->stale) {
            if (m->flag) /* repl_on_stale(): the replier's map is older: push ours */
                send_msg(s, M_MAP, m->to, m->from, nd->map_epoch, 0);
            break;
        }
        if (!s->unguarded && !push_current(nd, m->from, m->life, m->ival)) {
            s->st->rb_stale++; /* seal_reply(): an earlier life's reply: compare again */
            nd->known[m->from] = 0;
            break;
        }
        if (m->erange) {
            nd->known[m->from] = 0; /* TS_ERANGE: the replica is elsewhere in the log */
            break;
        }
        if (nd->known[m->from] &&
            (m->pos == 0 || (m->pos <= nd->nlog && nd->log[m->pos - 1].epoch == m->pos_e))) {
            if (m->pos > nd->applied[m->from])
                nd->applied[m->from] = m->pos;
        }
        break;
    case M_INFO: /* tsd_op_pg_info(): not fenced; the replica's log */
        map_check(s, m->to, m->from, m->epoch);
        r = send_msg(s, M_INFOREPLY, m->to, m->from, m->epoch, 0);
        if (r) {
            r->life = m->life;
            r->ival = m->ival;
            set_snap(r, nd);
        }
        break;
    case M_INFOREPLY:
        info_reply(s, m);
        break;
    case M_TRUNC: /* REPL_SEAL TRUNCATE: fenced like any push, then ts_store_pg_truncate() */
        if (!repl_frame_taken(s, m, M_TRUNCACK, &r))
            break;
        if (!s->unguarded && head_e(nd) > m->epoch) {
            /* Defence in depth: entries newer than the sender's epoch are never removed. */
            s->st->trunc_refused++;
            trace(s,
                  "n%d refuses to roll back to %" PRIu64 ": holds (%" PRIu64 ",%" PRIu64
                  "), newer than the sender's epoch %" PRIu64,
                  m->to, m->pos, head_e(nd), head_s(nd), m->epoch);
            break;
        }
        truncate_log(s, m->to, m->from, m->pos);
        break;
    case M_TRUNCACK: /* truncate_reply(): compare again */
        if (m->stale && m->flag)
            send_msg(s, M_MAP, m->to, m->from, nd->map_epoch, 0);
        nd->known[m->from] = 0;
        break;
    case M_MAP:
        if (m->epoch > nd->map_epoch) {
            trace(s, "n%d installs map %" PRIu64, m->to, m->epoch);
            set_map(s, m->to, m->epoch);
        }
        break;
    }
}

/* ---- writes ------------------------------------------------------------------------------- */

static int can_write(const struct sim *s, int i)
{
    const struct node *nd = &s->nd[i];

    return nd->alive && nd->role == R_ACTIVE && primary_of(s, nd->map_epoch) == i &&
           nd->promised <= nd->ep;
}

/* repl_push_step(): a replica whose position was learned in this life gets our entries after
 * it; else (not known, or known in an earlier life) PG_INFO asks where its log stands. */
static void push_to(struct sim *s, int i, int j)
{
    struct node *nd = &s->nd[i];
    struct msg *m;

    if (!s->unguarded && nd->known[j] && !push_current(nd, j, nd->asked_life[j], nd->asked_ival[j]))
        nd->known[j] = 0;
    if (!nd->known[j]) {
        m = send_msg(s, M_INFO, i, j, nd->map_epoch, 0);
        nd->asked_life[j] = pusher_life(nd, &nd->asked_ival[j]);
        if (m) {
            m->life = nd->asked_life[j];
            m->ival = nd->asked_ival[j];
        }
        return;
    }
    m = send_msg(s, M_PUSH, i, j, nd->map_epoch, 0);
    if (!m)
        return;
    set_snap(m, nd);
    m->pos = nd->applied[j];
    m->life = nd->asked_life[j];
    m->ival = nd->asked_ival[j];
}

static void do_write(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];
    int order[MAXN];
    unsigned no = map_order(s, nd->map_epoch, order), need = s->cfg.wq ? s->cfg.wq : 1;
    struct write *w;
    struct entry *e;

    if (s->nw == MAXW || nd->nlog == MAXLOG)
        return;
    if (no > s->cfg.c)
        no = s->cfg.c;
    if (no < need) { /* enough_replicas(): refused before anything is written */
        trace(s, "n%d refuses a write: %u core replicas, %u needed", i, no, need);
        return;
    }
    w = &s->w[s->nw];
    memset(w, 0, sizeof(*w));
    w->wid = s->nw + 1;
    w->node = i;
    w->epoch = nd->ep;
    w->seq = head_s(nd) + 1;
    w->min_acks = need - 1;
    w->issued_at = s->nacked;
    for (unsigned k = 1; k < no; k++)
        w->targets[w->ntargets++] = order[k];
    s->nw++;
    s->st->writes++;
    e = &nd->log[nd->nlog++];
    e->epoch = w->epoch;
    e->seq = w->seq;
    e->wid = w->wid;
    trace(s, "n%d writes w%u as (%" PRIu64 ",%" PRIu64 ")", i, w->wid, w->epoch, w->seq);
    for (unsigned k = 0; k < w->ntargets; k++)
        push_to(s, i, w->targets[k]);
}

/* repl_waiters_check() + seal_replicated(): deadline: complete with what is acknowledged. */
static void ack_check(struct sim *s, int i, int deadline)
{
    struct node *nd = &s->nd[i];

    for (unsigned k = 0; k < s->nw; k++) {
        struct write *w = &s->w[k];
        unsigned acked = 0, open = 0;
        if (w->node != i || w->state != W_PENDING)
            continue;
        for (unsigned t = 0; t < w->ntargets; t++) {
            const struct node *tn = &s->nd[w->targets[t]];
            if (nd->known[w->targets[t]] && nd->applied[w->targets[t]] >= w->seq)
                acked++;
            else if (nd->role != R_NONE && tn->alive && !tn->cut)
                open++; /* its pusher is there (this node leads) and it is not unreachable */
        }
        if (open && !deadline)
            continue;
        if (nd->promised > w->epoch || acked < w->min_acks) {
            w->state = W_FAILED;
            if (nd->promised > w->epoch)
                s->st->wfail_fenced++;
            else
                s->st->wfail_acks++;
            trace(s, "n%d: write w%u fails (%u acked, promised %" PRIu64 ")", i, w->wid, acked,
                  nd->promised);
            if (deadline)
                return;
            continue;
        }
        w->state = W_ACKED;
        w->acked_at = ++s->nacked;
        s->st->acked++;
        trace(s, "n%d ACKNOWLEDGES w%u (%" PRIu64 ",%" PRIu64 ") with %u of %u replicas", i, w->wid,
              w->epoch, w->seq, acked, w->ntargets);
        if (deadline)
            return;
    }
}

/* ---- faults and the map ------------------------------------------------------------------- */

static void kill_node(struct sim *s, int i)
{
    struct node *nd = &s->nd[i];

    nd->alive = 0;
    nd->role = R_NONE;
    nd->round++;
    memset(nd->known, 0, sizeof(nd->known));
    for (unsigned k = 0; k < s->nw; k++)
        if (s->w[k].node == i && s->w[k].state == W_PENDING) {
            s->w[k].state = W_FAILED;
            s->st->wfail_crash++;
        }
    s->st->kills++;
    trace(s, "n%d killed", i);
}

static void restart_node(struct sim *s, int i, uint64_t e)
{
    struct node *nd = &s->nd[i];

    nd->alive = 1;
    nd->role = R_NONE;
    trace(s, "n%d restarts with map %" PRIu64, i, e);
    set_map(s, i, e);
}

static void new_map(struct sim *s, unsigned up, unsigned deliver_pct)
{
    uint64_t e = ++s->cur;
    int order[MAXN];
    char ob[64];
    unsigned no;

    s->up[e] = up;
    s->dump_now = 1;
    no = map_order(s, e, order);
    if (no && e > 1 && !s->healing && !s->reliable && primary_of(s, e - 1) >= 0 &&
        primary_of(s, e - 1) != order[0] && chance(s, 60)) {
        /* buggify: the new primary's messages to the old one are slow */
        s->slow_from = order[0];
        s->slow_to = primary_of(s, e - 1) + 1;
        trace(s, "link n%d->n%d is slow", s->slow_from, s->slow_to - 1);
    }
    s->st->maps++;
    trace(s, "map %" PRIu64 ": up order [%s]", e, fmt_set(ob, sizeof(ob), order, no));
    for (unsigned i = 0; i < s->cfg.n; i++)
        if (s->nd[i].alive && !s->nd[i].cut && chance(s, deliver_pct) && s->nd[i].map_epoch < e)
            set_map(s, (int)i, e);
}

/* The retry timer of a peering node (repl_pgpeer_tick()). */
static void retry(struct sim *s, int i, int repeer_pct)
{
    struct node *nd = &s->nd[i];

    trace(s, "n%d: retry timer (%s)", i, role_names[nd->role]);
    if (nd->role == R_PULL &&
        ts_peering_head_cmp(head_e(nd), head_s(nd), nd->pull_e, nd->pull_s) < 0 && chance(s, 50))
        send_msg(s, M_PULLREQ, i, nd->pull_from, nd->ep, nd->round); /* ask again */
    else if (nd->role == R_ACTIVATE && !chance(s, repeer_pct))
        start_activate(s, i); /* prepare again (members are being caught up) */
    else {
        if (nd->role == R_ACTIVATE)
            s->st->repeers++; /* activating for too long: peer again */
        start_round(s, i);
    }
}

/* ---- invariants --------------------------------------------------------------------------- */

static void check(struct sim *s)
{
    const struct node *leg;

    if (s->failed)
        return;
    /* Every acknowledged write is still somewhere. */
    for (unsigned k = 0; k < s->nw; k++) {
        int found = 0;
        if (s->w[k].state != W_ACKED)
            continue;
        for (unsigned i = 0; i < s->cfg.n && !found; i++)
            found = has_wid(&s->nd[i], s->w[k].wid);
        if (!found) {
            violation(s, "acknowledged write w%u (%" PRIu64 ".%" PRIu64 ") is on no node any more",
                      s->w[k].wid, s->w[k].epoch, s->w[k].seq);
            return;
        }
    }
    /* The primary of the newest activated interval holds every acknowledged write. */
    if (!s->emax)
        return;
    leg = &s->nd[s->emax_node];
    if (!leg->alive || leg->role != R_ACTIVE || leg->ep != s->emax)
        return;
    for (unsigned k = 0; k < s->nw; k++)
        if (s->w[k].state == W_ACKED && !has_wid(leg, s->w[k].wid)) {
            violation(s,
                      "n%d, active primary of the newest interval %" PRIu64
                      ", lacks acknowledged write w%u (%" PRIu64 ".%" PRIu64
                      ", acknowledged by n%d)",
                      s->emax_node, s->emax, s->w[k].wid, s->w[k].epoch, s->w[k].seq, s->w[k].node);
            return;
        }
}

/* Whether node i still waits on a message of its current round (else its retry timer fires). */
static int waiting(const struct sim *s, int i)
{
    const struct node *nd = &s->nd[i];

    for (size_t k = 0; k < s->nmsgs; k++) {
        const struct msg *m = &s->msgs[k];
        if (m->round == nd->round && ((m->from == i && m->type != M_QREPLY) || m->to == i) &&
            (m->type == M_QUERY || m->type == M_QREPLY || m->type == M_ACT ||
             m->type == M_ACTREPLY || m->type == M_PULLREQ || m->type == M_PULLDATA))
            return 1;
    }
    return 0;
}

static int same_log(const struct node *a, const struct node *b)
{
    return a->nlog == b->nlog && lcp(a->log, a->nlog, b->log, b->nlog) == b->nlog;
}

/* Heal: everyone up in a final map, everything delivered in order, the final primary's timers
 * and pushers run until it is active and every log equals its log. Then the final log is
 * checked. */
static void heal_and_check(struct sim *s)
{
    int order[MAXN];
    unsigned all = 0, iter;
    int f;
    struct node *fn;
    char lb[4096];

    s->healing = 1;
    trace(s, "---- heal ----");
    for (unsigned i = 0; i < s->cfg.n; i++)
        all |= 1u << i;
    for (unsigned i = 0; i < s->cfg.n; i++)
        s->nd[i].cut = 0;
    for (unsigned i = 0; i < s->cfg.n; i++)
        if (!s->nd[i].alive) {
            s->nd[i].alive = 1;
            s->nd[i].role = R_NONE;
            trace(s, "n%u restarts", i);
        }
    new_map(s, all, 100);
    map_order(s, s->cur, order);
    f = order[0];
    fn = &s->nd[f];
    for (iter = 0; iter < 20000 && !s->failed; iter++) {
        int done = 1;
        s->step++;
        if (s->nmsgs) {
            struct msg m;
            msg_take(s, 0, &m);
            deliver(s, &m);
            free(m.snap);
            check(s);
            continue;
        }
        for (unsigned i = 0; i < s->cfg.n; i++)
            ack_check(s, (int)i, 1);
        if (fn->role == R_BLOCKED || fn->role == R_NONE)
            break;
        if (fn->role == R_ACTIVATE) /* its pushers catch the members up meanwhile */
            for (unsigned i = 0; i < s->cfg.n; i++)
                if ((int)i != f && !same_log(&s->nd[i], fn))
                    push_to(s, f, (int)i);
        if (fn->role != R_ACTIVE) {
            retry(s, f, iter % 50 == 49 ? 100 : 0);
            continue;
        }
        for (unsigned i = 0; i < s->cfg.n; i++)
            if ((int)i != f && !same_log(&s->nd[i], fn)) {
                done = 0;
                push_to(s, f, (int)i);
            }
        if (done)
            break;
    }
    if (s->failed)
        return;
    s->st->heal_iters += iter;
    if (iter > s->st->heal_max)
        s->st->heal_max = iter;
    check(s);
    if (s->failed)
        return;
    if (fn->role != R_ACTIVE) {
        violation(s,
                  "after healing, the final primary n%d is not active (%s at epoch %" PRIu64
                  ", promised %" PRIu64 ", after %u steps)",
                  f, role_names[fn->role], fn->ep, fn->promised, iter);
        return;
    }
    if (!can_write(s, f)) {
        violation(
            s,
            "after healing, the final primary n%d cannot take writes: it leads interval %" PRIu64
            " but promised %" PRIu64,
            f, fn->ep, fn->promised);
        return;
    }
    for (unsigned i = 0; i < s->cfg.n; i++)
        if (!same_log(&s->nd[i], fn)) {
            violation(s, "after healing, n%u's log is not the final primary's", i);
            return;
        }
    trace(s, "final primary n%d at epoch %" PRIu64 ": %s", f, fn->ep,
          fmt_log(lb, sizeof(lb), fn->log, fn->nlog));
    for (unsigned k = 0; k < fn->nlog; k++) {
        if (fn->log[k].seq != k + 1)
            violation(s, "final log: entry %u has seq %" PRIu64, k, fn->log[k].seq);
        if (k && fn->log[k].epoch < fn->log[k - 1].epoch)
            violation(s, "final log: epoch goes back at seq %" PRIu64, fn->log[k].seq);
    }
    for (unsigned k = 0; k < s->nw && !s->failed; k++) {
        const struct write *w = &s->w[k];
        unsigned copies = 0, pos = 0;
        if (w->state != W_ACKED)
            continue;
        for (unsigned x = 0; x < fn->nlog; x++)
            if (fn->log[x].wid == w->wid) {
                copies++;
                pos = x;
            }
        if (copies != 1) {
            violation(s,
                      "final log holds acknowledged write w%u (%" PRIu64 ".%" PRIu64 ") %u times",
                      w->wid, w->epoch, w->seq, copies);
            break;
        }
        /* Acknowledged before another write was issued: it comes first. */
        for (unsigned k2 = 0; k2 < s->nw; k2++) {
            const struct write *w2 = &s->w[k2];
            if (w2->state != W_ACKED || w2->issued_at < w->acked_at)
                continue;
            for (unsigned x = 0; x <= pos; x++)
                if (fn->log[x].wid == w2->wid)
                    violation(s,
                              "final log: w%u precedes w%u, which was acknowledged before w%u was "
                              "written",
                              w2->wid, w->wid, w2->wid);
        }
    }
    s->st->heals++;
}

/* ---- one seed ----------------------------------------------------------------------------- */

/* The primary of the newest map crashes or is cut off; a map marking it down follows. */
static int failover(struct sim *s)
{
    int order[MAXN];
    unsigned no = map_order(s, s->cur, order), alive = 0;

    if (s->cur + 2 >= MAXEPOCH)
        return 0;
    for (unsigned i = 0; i < s->cfg.n; i++)
        alive += s->nd[i].alive;
    if (!no || alive < 2)
        return 0;
    if (s->nd[order[0]].alive && chance(s, 50))
        kill_node(s, order[0]);
    else if (s->nd[order[0]].alive && !s->nd[order[0]].cut) {
        s->nd[order[0]].cut = 1;
        trace(s, "n%d cut off", order[0]);
    }
    new_map(s, s->up[s->cur] & ~(1u << order[0]), 30 + rn(s, 71));
    return 1;
}

enum {
    A_DELIVER,
    A_DROP,
    A_KILL,
    A_RESTART,
    A_MAP,
    A_MAPONE,
    A_TIMER,
    A_WRITE,
    A_PUSH,
    A_INFO,
    A_ACK,
    A_DEADLINE,
    A_CUT,
    A_FAILOVER,
    A_N
};

/* Weights in calm and in stormy stretches (a seed alternates between them). */
static const unsigned weights[2][A_N] = {
    {50, 1, 1, 3, 1, 3, 4, 18, 3, 1, 7, 1, 1, 1},
    {40, 3, 3, 3, 4, 4, 4, 12, 2, 1, 5, 1, 2, 6},
};

static void step_once(struct sim *s)
{
    const unsigned *wt = weights[s->storm];
    unsigned total = 0, r, a;
    int cand[MAXN];
    unsigned nc = 0;

    for (a = 0; a < A_N; a++)
        total += wt[a];
    r = rn(s, total);
    for (a = 0; a < A_N && r >= wt[a]; a++)
        r -= wt[a];
    switch (a) {
    case A_CUT: /* a node is cut off, or reachable again */
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (s->nd[i].alive && s->nd[i].cut)
                cand[nc++] = (int)i;
        if (!nc || chance(s, 40)) {
            nc = 0;
            for (unsigned i = 0; i < s->cfg.n; i++)
                if (s->nd[i].alive)
                    cand[nc++] = (int)i;
        }
        if (nc) {
            int i = cand[rn(s, nc)];
            s->nd[i].cut = !s->nd[i].cut;
            trace(s, "n%d %s", i, s->nd[i].cut ? "cut off" : "reachable again");
            return;
        }
        break;
    case A_FAILOVER: /* the primary crashes or is cut off; the next map marks it down */
        if (failover(s))
            return;
        break;
    case A_DROP:
        if (s->nmsgs) {
            struct msg m;
            msg_take(s, rn(s, (unsigned)s->nmsgs), &m);
            trace(s, "drop %s n%d->n%d", msg_names[m.type], m.from, m.to);
            free(m.snap);
            return;
        }
        break;
    case A_KILL:
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (s->nd[i].alive)
                cand[nc++] = (int)i;
        if (nc > 1) {
            kill_node(s, cand[rn(s, nc)]);
            return;
        }
        break;
    case A_RESTART: /* with the newest map or its old one */
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (!s->nd[i].alive)
                cand[nc++] = (int)i;
        if (nc) {
            int i = cand[rn(s, nc)];
            restart_node(s, i, chance(s, 50) ? s->cur : s->nd[i].map_epoch);
            return;
        }
        break;
    case A_MAP: /* a new map, pushed to some nodes */
        if (s->cur + 2 < MAXEPOCH) {
            unsigned up = 0, how = rn(s, 10);
            int order[MAXN];
            if (how < 4) { /* what the monitor sees */
                for (unsigned i = 0; i < s->cfg.n; i++)
                    if (s->nd[i].alive && !s->nd[i].cut)
                        up |= 1u << i;
            } else if (how < 7 && map_order(s, s->cur, order)) { /* fail the primary over */
                up = s->up[s->cur] & ~(1u << order[0]);
            } else { /* one node marked down or up */
                up = s->up[s->cur] ^ (1u << rn(s, s->cfg.n));
            }
            new_map(s, up, 20 + rn(s, 81));
            return;
        }
        break;
    case A_MAPONE: /* the newest map reaches one more node */
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (s->nd[i].alive && !s->nd[i].cut && s->nd[i].map_epoch < s->cur)
                cand[nc++] = (int)i;
        if (nc) {
            int i = cand[rn(s, nc)];
            trace(s, "n%d installs map %" PRIu64, i, s->cur);
            set_map(s, i, s->cur);
            return;
        }
        break;
    case A_TIMER: /* a retry timer: when nothing of its round is in flight (or rarely: a timeout) */
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (s->nd[i].alive &&
                (s->nd[i].role == R_QUERY || s->nd[i].role == R_PULL ||
                 s->nd[i].role == R_ACTIVATE) &&
                (!waiting(s, (int)i) || chance(s, 10)))
                cand[nc++] = (int)i;
        if (nc) {
            retry(s, cand[rn(s, nc)], 15);
            return;
        }
        break;
    case A_WRITE:
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (can_write(s, (int)i))
                cand[nc++] = (int)i;
        if (nc) {
            do_write(s, cand[rn(s, nc)]);
            return;
        }
        break;
    case A_PUSH:
    case A_INFO: /* a pusher step (activating or active): push, or compare (PG_INFO) */
        for (unsigned i = 0; i < s->cfg.n; i++)
            if (s->nd[i].alive && (s->nd[i].role == R_ACTIVE || s->nd[i].role == R_ACTIVATE))
                cand[nc++] = (int)i;
        if (nc) {
            int i = cand[rn(s, nc)], order[MAXN], j;
            unsigned no = map_order(s, s->nd[i].map_epoch, order);
            if (no >= 2) {
                j = order[1 + rn(s, no - 1)];
                if (a == A_PUSH) {
                    trace(s, "n%d pushes to n%d", i, j);
                    push_to(s, i, j);
                } else {
                    trace(s, "n%d compares with n%d", i, j);
                    s->nd[i].known[j] = 0;
                    push_to(s, i, j);
                }
                return;
            }
        }
        break;
    case A_ACK:
    case A_DEADLINE:
        for (unsigned k = 0; k < s->nw; k++)
            if (s->w[k].state == W_PENDING && s->nd[s->w[k].node].alive &&
                !in_set(cand, nc, s->w[k].node))
                cand[nc++] = s->w[k].node;
        if (nc) {
            ack_check(s, cand[rn(s, nc)], a == A_DEADLINE);
            return;
        }
        break;
    default:
        break;
    }
    /* Deliver a message: one of the oldest few (a connection keeps order; peers do not). */
    if (s->nmsgs) {
        struct msg m;
        unsigned window = s->nmsgs < 6 || chance(s, 10) ? (unsigned)s->nmsgs : 6;
        unsigned k = rn(s, window), j;
        if (s->slow && (s->msgs[k].to == s->slow - 1 || s->msgs[k].from == s->slow - 1) &&
            chance(s, 85)) /* a slow node: its messages mostly wait */
            k = rn(s, window);
        if (s->slow_to && s->msgs[k].from == s->slow_from && s->msgs[k].to == s->slow_to - 1 &&
            chance(s, 99)) /* a slow link: its messages wait while others go */
            for (j = 0; j < window; j++)
                if (s->msgs[j].from != s->slow_from || s->msgs[j].to != s->slow_to - 1) {
                    k = j;
                    break;
                }
        for (j = 0; j < k; j++) /* one connection per pair of nodes: in order */
            if (s->msgs[j].from == s->msgs[k].from && s->msgs[j].to == s->msgs[k].to)
                break;
        msg_take(s, j, &m);
        if (chance(s, s->storm ? 3 : 1))
            dup_msg(s, &m);
        deliver(s, &m);
        free(m.snap);
    }
}

static void sim_reset(struct sim *s)
{
    for (size_t k = 0; k < s->nmsgs; k++)
        free(s->msgs[k].snap);
    memset(s, 0, sizeof(*s));
}

static void run_seed(struct sim *s, uint64_t seed, unsigned steps, int trace_on, struct stats *st)
{
    /* (nodes, acting set, write quorum) */
    static const unsigned cfgs[][3] = {{5, 3, 2}, {5, 3, 2}, {5, 3, 2}, {4, 3, 3},
                                       {3, 3, 1}, {5, 5, 3}, {5, 4, 2}, {4, 3, 2}};
    unsigned all = 0, c;

    sim_reset(s);
    s->unguarded = getenv("TESSERA_SIM_UNGUARDED") != NULL;
    s->rng = seed * 0x100000001b3ull + 1;
    s->trace = trace_on;
    s->st = st;
    c = rn(s, sizeof(cfgs) / sizeof(cfgs[0]));
    s->cfg.n = cfgs[c][0];
    s->cfg.c = cfgs[c][1];
    s->cfg.wq = cfgs[c][2];
    for (unsigned i = 0; i < s->cfg.n; i++)
        s->perm[i] = (int)i;
    for (unsigned i = s->cfg.n - 1; i > 0; i--) {
        unsigned j = rn(s, i + 1);
        int t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    if (trace_on) {
        char pb[64];
        printf("seed %" PRIu64 ": %u nodes, acting %u, wq %u (peering q %u), preference [%s]\n",
               seed, s->cfg.n, s->cfg.c, s->cfg.wq, ts_peering_quorum(s->cfg.c, s->cfg.wq),
               fmt_set(pb, sizeof(pb), s->perm, s->cfg.n));
    }
    for (unsigned i = 0; i < s->cfg.n; i++) {
        s->nd[i].alive = 1;
        all |= 1u << i;
    }
    s->cur = 0;
    new_map(s, all, 100);
    check(s);
    for (s->step = 1; s->step <= steps && !s->failed; s->step++) {
        if (chance(s, 2)) {
            s->slow = chance(s, 50) ? 0 : 1 + (int)rn(s, s->cfg.n);
            if (s->slow)
                trace(s, "n%d is slow", s->slow - 1);
        }
        if (chance(s, 1)) {
            s->slow_to = 0;
            if (chance(s, 50)) {
                s->slow_from = (int)rn(s, s->cfg.n);
                s->slow_to = 1 + (int)rn(s, s->cfg.n);
                trace(s, "link n%d->n%d is slow", s->slow_from, s->slow_to - 1);
            }
        }
        if (chance(s, s->storm ? 6 : 2)) {
            s->storm = !s->storm;
            trace(s, "---- %s ----", s->storm ? "storm" : "calm");
        }
        if (s->doom && s->step >= s->doom_at) {
            if (primary_of(s, s->cur) == s->doom - 1)
                failover(s);
            s->doom = 0;
        } else {
            step_once(s);
        }
        check(s);
        if (s->trace > 1 || (s->trace && s->dump_now))
            dump_nodes(s);
        s->dump_now = 0;
    }
    st->steps += s->step - 1;
    if (!s->failed)
        heal_and_check(s);
    if (s->trace)
        dump_nodes(s);
    st->seeds++;
}

static unsigned env_u(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

static void test_sim_random(void **state)
{
    const char *one = getenv("TESSERA_SIM_SEED");
    unsigned seeds = env_u("TESSERA_SIM_SEEDS", 6000), steps = env_u("TESSERA_SIM_STEPS", 400);
    unsigned first = env_u("TESSERA_SIM_FIRST", 1);
    struct stats st;
    unsigned long failures = 0;
    uint64_t first_bad = 0;
    char first_msg[2048] = "";

    memset(&st, 0, sizeof(st));
    if (one && *one) {
        run_seed(&S, strtoull(one, NULL, 10), steps, 2, &st);
        printf("seed %s: %s\n", one, S.failed ? S.fail : "ok");
        fflush(stdout);
        if (S.failed)
            fail_msg("seed %s: %s", one, S.fail);
        return;
    }
    for (unsigned seed = first; seed < first + seeds; seed++) {
        run_seed(&S, seed, steps, 0, &st);
        if (S.failed && getenv("TESSERA_SIM_LIST"))
            printf("  seed %u: %s\n", seed, S.fail);
        if (S.failed && !failures++) {
            first_bad = seed;
            snprintf(first_msg, sizeof(first_msg), "%s", S.fail);
        }
    }
    printf("peering sim: %lu seeds, %lu steps, %lu writes (%lu acknowledged; failed: %lu fenced, "
           "%lu short of replicas, %lu primary crashed), %lu activations (%lu late), %lu prepares "
           "(%lu members not caught up), %lu re-peers while activating, %lu pulls, %lu maps, "
           "%lu kills, %lu messages (%lu replication frames refused, %lu delivered twice), "
           "%lu rollbacks (%lu refused by the decision, %lu by a replica's defence; %lu replies "
           "of an earlier life ignored), %lu heals (%lu steps, at "
           "most %lu); at most %lu intervals pending on a node (%lu prepares not recorded: "
           "%d pending already); %lu seeds failed%s\n",
           st.seeds, st.steps, st.writes, st.acked, st.wfail_fenced, st.wfail_acks, st.wfail_crash,
           st.activations, st.stale_acts, st.prepares, st.not_caught_up, st.repeers, st.pulls,
           st.maps, st.kills, st.msgs, st.refused_pushes, st.dups, st.truncates, st.rb_refused,
           st.trunc_refused, st.rb_stale, st.heals, st.heal_iters, st.heal_max, st.pend_max,
           st.pend_full, TS_PG_MAX_PENDING, failures,
           getenv("TESSERA_SIM_UNGUARDED") ? " (UNGUARDED: the push path before issue 27)" : "");
    if (failures) {
        struct stats t;
        memset(&t, 0, sizeof(t));
        printf("first failing seed %" PRIu64 ": %s\ntrace (TESSERA_SIM_SEED=%" PRIu64
               " to reproduce):\n",
               first_bad, first_msg, first_bad);
        run_seed(&S, first_bad, steps, 1, &t);
        fflush(stdout);
        fail_msg("%lu of %lu seeds lost acknowledged writes or got stuck; first: seed %" PRIu64
                 ": %s",
                 failures, st.seeds, first_bad, first_msg);
    }
}

/* ---- the counterexamples of the first version, scripted ------------------------------------ */

static void drain(struct sim *s)
{
    while (s->nmsgs && !s->failed) {
        struct msg m;
        s->step++;
        msg_take(s, 0, &m);
        deliver(s, &m);
        free(m.snap);
        check(s);
    }
}

/* Delivers messages in order while cond(s) holds. */
static void drain_while(struct sim *s, int (*cond)(struct sim *))
{
    while (s->nmsgs && !s->failed && cond(s)) {
        struct msg m;
        s->step++;
        msg_take(s, 0, &m);
        deliver(s, &m);
        free(m.snap);
        check(s);
    }
}

static void drop_to(struct sim *s, int type, int to)
{
    for (size_t k = 0; k < s->nmsgs; k++)
        if (s->msgs[k].type == type && s->msgs[k].to == to) {
            struct msg m;
            msg_take(s, k, &m);
            trace(s, "drop %s n%d->n%d", msg_names[m.type], m.from, m.to);
            free(m.snap);
            return;
        }
}

/* What a script expects of the protocol; a miss is noted (traced) and counted, and the script
 * goes on (the safety checks decide). */
static void expect(struct sim *s, int cond, const char *what)
{
    if (!cond && s->trace)
        printf("  [%3u] (script: expected \"%s\"; the protocol went another way)\n", s->step, what);
}

static void scenario_init(struct sim *s, struct stats *st)
{
    sim_reset(s);
    memset(st, 0, sizeof(*st));
    s->trace = getenv("TESSERA_SIM_SEED") != NULL || getenv("TESSERA_SIM_TRACE") != NULL;
    s->st = st;
    s->reliable = 1;
    s->keep_going = 1;
    s->cfg.n = 5;
    s->cfg.c = 3;
    s->cfg.wq = 2;
    for (int i = 0; i < 5; i++) {
        s->perm[i] = i;
        s->nd[i].alive = 1;
    }
    if (s->trace)
        printf("scripted: 5 nodes, acting 3, wq 2, preference [n0..n4]\n");
}

/* A scripted run goes on after a violation, to the end; reports the first and the last. */
static void scenario_end(struct sim *s)
{
    if (!s->nviolations)
        return;
    fflush(stdout);
    fail_msg("scripted run: %s%s%s", s->fail, s->nviolations > 1 ? "; in the end: " : "",
             s->nviolations > 1 ? s->fail_last : "");
}

static int n1_queries(struct sim *s)
{
    return s->nd[1].role == R_QUERY;
}

static int n1_peering(struct sim *s)
{
    return s->nd[1].role == R_QUERY || s->nd[1].role == R_ACTIVATE;
}

/*
 * A: members counted before they held the log. Five nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 leads {n0,n1,n2}; w1 is acknowledged on n0 and n1 (n2's copy is late).
 *   epoch 2: n0 is down; n1 peers (n1 and n2 answer for interval 1: 2 of 3), holds w1 and
 *            prepares {n1,n2,n3}. The first version let n2 and n3 record les 2 before n1
 *            pushed them anything, so that, with n1 down too, n2 activated epoch 3 from n2, n3,
 *            n4, none of which held w1. Now n2 and n3 are not caught up: they do not record
 *            epoch 2, and n1 stays activating until its pushers catch one of them up.
 *   epoch 3: n1 is down before its pushers ran; n2 peers for {n2,n3,n4}: interval 1 is still
 *            the newest, and of its {n0,n1,n2} only n2 answers: it waits (for n0 or n1).
 *   heal:    w1 is in the final log.
 */
static void test_sim_scenario_unsynced_acting(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    if (can_write(s, 0))
        do_write(s, 0);
    drop_to(s, M_PUSH, 2); /* n2's copy is late */
    drain(s);
    ack_check(s, 0, 1);
    expect(s, s->nw == 1 && s->w[0].state == W_ACKED, "w1 is acknowledged");
    dump_nodes(s);
    kill_node(s, 0);
    new_map(s, 0x1e, 100); /* n0 down: n1 leads {n1,n2,n3} */
    drain(s);
    expect(s, s->nd[1].role == R_ACTIVATE, "n1 is activating (n2, n3 are not caught up)");
    dump_nodes(s);
    kill_node(s, 1);       /* before its pushers ran */
    new_map(s, 0x1c, 100); /* n1 down: n2 leads {n2,n3,n4} */
    drain(s);
    expect(s, s->nd[2].role == R_QUERY, "n2 waits for interval 1's acting set");
    dump_nodes(s);
    if (can_write(s, 2)) {
        do_write(s, 2);
        drain(s);
        ack_check(s, 2, 1);
    }
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

/*
 * B: an interval taken as started before it was. Five nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 leads {n0,n1,n2}.
 *   epoch 2: n0 is down; n1 peers for {n1,n2,n3}: n1 and n2 answer (2 of interval 1's 3),
 *            ACTIVATE. n1 prepares epoch 2 on itself and n3, but n2 is cut off before it
 *            records it and n0 is down: 1 of interval 1's 2. The first version's retry then
 *            found les 2 on n1 itself and certified it with n1 and n3. Now n1 and n3 only hold
 *            epoch 2 as pending: interval 1 still needs 2 of {n0,n1,n2}; n1 waits.
 *            n2 is back: n1 peers again and activates (n2 records epoch 2 and its commit is
 *            lost: n2 is cut off again). w1 is acknowledged on n1 and n3.
 *   epoch 3: n1 and n3 are down, n0 and n2 back: n0 finds interval 1 the newest started one
 *            (n0, n2, n4) but n2 reports epoch 2 pending: its acting set {n1,n2,n3} needs 2
 *            answers. n0 waits; w1 is in the final log.
 */
static void test_sim_scenario_activation_retry(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    kill_node(s, 0);
    new_map(s, 0x1e, 100); /* n0 down: n1 leads {n1,n2,n3} */
    drain_while(s, n1_queries);
    expect(s, s->nd[1].role == R_ACTIVATE, "n1 is activating");
    s->nd[2].cut = 1;
    trace(s, "n2 cut off");
    drain(s);
    expect(s, s->nd[1].role == R_ACTIVATE, "n1 is still activating (1 of 2)");
    retry(s, 1, 100); /* peers again */
    drain(s);
    expect(s, s->nd[1].role == R_QUERY, "n1 waits for interval 1's acting set");
    s->nd[2].cut = 0;
    trace(s, "n2 reachable again");
    retry(s, 1, 100);
    drain_while(s, n1_peering);
    expect(s, s->nd[1].role == R_ACTIVE, "n1 is active");
    s->nd[2].cut = 1;
    trace(s, "n2 cut off");
    drain(s);
    if (can_write(s, 1)) {
        do_write(s, 1);
        drain(s);
        ack_check(s, 1, 1); /* n2 is unreachable: n3's copy makes 2 */
    }
    expect(s, s->nw == 1 && s->w[0].state == W_ACKED, "w1 is acknowledged");
    dump_nodes(s);
    kill_node(s, 1);
    kill_node(s, 3);
    s->nd[2].cut = 0;
    restart_node(s, 0, s->cur);
    new_map(s, 0x15, 100); /* n0, n2, n4 up: n0 leads {n0,n2,n4} */
    drain(s);
    expect(s, s->nd[0].role == R_QUERY, "n0 waits for pending interval 2's acting set");
    dump_nodes(s);
    if (can_write(s, 0)) {
        do_write(s, 0);
        drain(s);
        ack_check(s, 0, 1);
    }
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

/*
 * C: an interval "continued" across map epochs. Five nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 leads {n0,n1,n2}.
 *   epoch 2: n0 is cut off (marked down; map 2 and n1's PG_QUERY never reach it); n1 leads
 *            {n1,n2,n3} and w1 is acknowledged at (2, 1) on n1, n2, n3.
 *   epoch 3: n0 is back, the map says {n0,n1,n2} again and reaches n0 first (it never saw
 *            map 2). The first version let its interval 1 go on without peering, its pushes
 *            (map epoch 3) rolling w1 back. Now it peers at epoch 3: interval 2 is the newest,
 *            it pulls w1 from n1, prepares and commits epoch 3. The deposed n1's pushes and
 *            writes are fenced by its promise of epoch 3.
 */
static void test_sim_scenario_interval_continues(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    s->nd[0].cut = 1;
    trace(s, "n0 cut off");
    new_map(s, 0x1e, 100); /* n0 marked down; the map does not reach it */
    drain(s);
    expect(s, s->nd[1].role == R_ACTIVE, "n1 is active");
    if (can_write(s, 1)) {
        do_write(s, 1);
        drain(s);
        ack_check(s, 1, 0);
    }
    expect(s, s->nw == 1 && s->w[0].state == W_ACKED, "w1 is acknowledged");
    dump_nodes(s);
    s->nd[0].cut = 0;
    trace(s, "n0 reachable again");
    new_map(s, 0x1f, 0); /* n0 is up again; map 3 reaches n0 first */
    set_map(s, 0, s->cur);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active at epoch 3, with w1");
    expect(s, !can_write(s, 1), "n1 is fenced");
    for (int j = 2; j < 5; j++)
        push_to(s, 1, j); /* the deposed primary's pushers */
    drain(s);
    for (int j = 1; j < 5; j++)
        if (s->nd[j].map_epoch < s->cur)
            set_map(s, j, s->cur);
    drain(s);
    if (can_write(s, 0)) {
        do_write(s, 0);
        drain(s);
        ack_check(s, 0, 1);
    }
    dump_nodes(s);
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

/* Delivers, in order, the messages not on the link from -> to (held back). */
static void drain_but(struct sim *s, int from, int to)
{
    for (;;) {
        size_t k;
        struct msg m;
        for (k = 0; k < s->nmsgs; k++)
            if (s->msgs[k].from != from || s->msgs[k].to != to)
                break;
        if (k == s->nmsgs || s->failed)
            return;
        s->step++;
        msg_take(s, k, &m);
        deliver(s, &m);
        free(m.snap);
        check(s);
    }
}

/*
 * D: the promise fences a deposed primary whose map epoch the replica still shares. Five
 *   nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 leads {n0,n1,n2}.
 *   epoch 2: n0 is marked down, but map 2 reaches only n1; n1 peers and activates {n1,n2,n3}
 *            while its messages to n0 are slow: n2 and n3 promise epoch 2 with map 1 still.
 *            n0, unaware (its own promise is still 1), writes w1 and pushes it at epoch 1:
 *            n2's map epoch matches (the central check passes), but n2 promised epoch 2: it
 *            refuses, and w1 fails. Without that fence n2 would take it and n0 would
 *            acknowledge a write that the active primary of epoch 2 does not hold.
 */
static void test_sim_scenario_promise_fence(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    new_map(s, 0x1e, 0); /* n0 marked down; only n1 gets the map */
    set_map(s, 1, s->cur);
    drain_but(s, 1, 0);
    expect(s, s->nd[2].promised == 2 && s->nd[2].map_epoch == 1, "n2 promised 2 with map 1");
    if (can_write(s, 0)) {
        do_write(s, 0);
        drain_but(s, 1, 0);
        ack_check(s, 0, 1);
    }
    expect(s, s->nw == 1 && s->w[0].state == W_FAILED, "w1 fails");
    dump_nodes(s);
    for (int k = 0; k < 4 && s->nd[1].role == R_ACTIVATE; k++) {
        for (int j = 2; j < 5; j++)
            push_to(s, 1, j); /* n1's pushers catch its acting set up */
        drain_but(s, 1, 0);
        retry(s, 1, 0);
        drain_but(s, 1, 0);
    }
    expect(s, s->nd[1].role == R_ACTIVE, "n1 is active");
    drain(s);
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

static int n0_not_active(struct sim *s)
{
    return s->nd[0].role != R_ACTIVE;
}

/*
 * E: a prepare erases the evidence of an older pending interval that did start (found by the
 *   random runs: seed 272918 of 300000 at 400 steps, seed 14252 of 40000 at 2000 steps). Five
 *   nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 prepares {n0,n1,n2} on every node (pend 1) and starts it (les 1 on n0), then
 *            is cut off: its commits are lost. n1..n4 hold epoch 1 as pending only.
 *   epoch 2: n1 peers for {n1,n2,n3}: no les anywhere, so the whole map (3 of 5) and pending
 *            interval 1's {n0,n1,n2} (2 of 3: n1, n2) are needed; met. It prepares epoch 2:
 *            ts_store_pg_prepare() overwrites pend 1 with pend 2 on n1 (itself), n3 and n4;
 *            n2 is cut off before it records it, n0 is unreachable: interval 1's set has 1 of
 *            the 2 it needs, and n1 stays activating.
 *            Its retry peers again at epoch 2: n1, n3, n4 now report pend 2 only; interval 1
 *            is nowhere to be seen, so the map (n1, n3, n4) and pending 2's {n1,n2,n3}
 *            (n1, n3) suffice: epoch 2 starts, with only n1 of interval 1's {n0,n1,n2} ever
 *            having heard of it. w1 is acknowledged at (2, 1) on n1 and n3.
 *   epoch 3: n1, n3, n4 are down; n0 and n2 are back: interval 1 (les 1 on n0, pend 1 on n2)
 *            is the newest they know, and they are 2 of its {n0,n1,n2}: n0 activates epoch 3
 *            without w1 and acknowledges w2 at (3, 1) on n0, n2; when all are back, w1 is
 *            rolled back.
 *   The cause: ts_store_pg_prepare() keeps one pending interval and overwrites it, so the
 *   prepare of an interval that has not started (2) erases the evidence of one that may have
 *   (1). A node must keep every pending interval newer than its les until a commit of one at
 *   least as new replaces it (and report them all).
 *   Fixed so (ts_pg_state.pending[]): at n1's retry, n1, n3, n4 still report pending 1, whose
 *   {n0,n1,n2} has only n1: n1 waits, epoch 2 never starts and w1 is never written; n0 and n2
 *   then start epoch 3 from interval 1, rightly.
 */
static void test_sim_scenario_pending_overwritten(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain_while(s, n0_not_active);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    s->nd[0].cut = 1; /* its commits are lost */
    trace(s, "n0 cut off");
    drain(s);
    new_map(s, 0x1e, 100); /* n0 marked down: n1 leads {n1,n2,n3} */
    drain_while(s, n1_queries);
    expect(s, s->nd[1].role == R_ACTIVATE, "n1 is activating");
    s->nd[2].cut = 1;
    trace(s, "n2 cut off");
    drain(s);
    expect(s, s->nd[1].role == R_ACTIVATE, "n1 is still activating (1 of interval 1's 2)");
    retry(s, 1, 100); /* activating for too long: peers again */
    drain(s);
    if (can_write(s, 1)) {
        do_write(s, 1);
        drain(s);
        ack_check(s, 1, 1); /* n2 is unreachable: n3's copy makes 2 */
    }
    expect(s, s->nw == 0, "n1 does not start epoch 2");
    dump_nodes(s);
    kill_node(s, 1);
    kill_node(s, 3);
    kill_node(s, 4);
    s->nd[0].cut = 0;
    s->nd[2].cut = 0;
    trace(s, "n0, n2 reachable again");
    new_map(s, 0x05, 100); /* n0, n2 up: n0 leads {n0,n2} */
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 starts epoch 3 (interval 2 never started)");
    if (can_write(s, 0)) { /* at (3, 1); before the fix, w1 (2, 1) was then rolled back */
        do_write(s, 0);
        drain(s);
        ack_check(s, 0, 1);
    }
    dump_nodes(s);
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

/* Delivers every message in order, dropping those of one type. */
static void drain_dropping(struct sim *s, int type)
{
    while (s->nmsgs && !s->failed) {
        struct msg m;
        s->step++;
        msg_take(s, 0, &m);
        if (m.type == type)
            trace(s, "drop %s n%d->n%d", msg_names[m.type], m.from, m.to);
        else
            deliver(s, &m);
        free(m.snap);
        check(s);
    }
}

/*
 * F: the pending intervals fill up (TS_PG_MAX_PENDING). Five nodes, preference n0..n4, acting 3,
 *   wq 2.
 *   epoch 1: n0 leads {n0,n1,n2} and starts it (les 1 everywhere).
 *   epochs 2..17: every map makes n0 the primary again (a new interval each time): it peers,
 *            prepares {n0,n1,n2} on n0, n1, n2 (recorded: pending), but every ACTIVATE reply is
 *            lost, so no interval starts and nothing commits: 16 intervals pending on each.
 *   epoch 18 and on: a prepare is not recorded anywhere any more (n0 counts itself), and only a
 *            commit of an interval at least as new would remove a pending one: no interval of
 *            {n0,n1,n2} can start again, nor one needing 2 of it, ever; the PG stays inactive.
 */
static void test_sim_scenario_pending_full(void **state)
{
    struct sim *s = &S;
    struct stats st;

    scenario_init(s, &st);
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    for (unsigned k = 0; k < TS_PG_MAX_PENDING; k++) {
        new_map(s, 0x1f, 100); /* n0 the primary again: a new interval */
        drain_dropping(s, M_ACTREPLY);
        expect(s, s->nd[0].role == R_ACTIVATE, "n0 is activating");
    }
    dump_nodes(s);
    heal_and_check(s);
    dump_nodes(s);
    scenario_end(s);
}

/* Delivers the oldest message only. */
static void deliver_first(struct sim *s)
{
    struct msg m;

    if (!s->nmsgs || s->failed)
        return;
    s->step++;
    msg_take(s, 0, &m);
    deliver(s, &m);
    free(m.snap);
    check(s);
}

/*
 * G: issue 27's PG 18, a PG_INFO reply read after a map change, as a partition heals. Five
 *   nodes, preference n0..n4, acting 3, wq 2.
 *   epoch 1: n0 leads {n0,n1,n2}; w1 is acknowledged. n0 is cut off (it keeps running: in its
 *            own map 1 it still leads, active).
 *   epoch 2: n0 is marked down (the map does not reach it); n1 leads {n1,n2,n3}; w2 is
 *            acknowledged as (2, 2).
 *   heal:    n0's pusher, active at epoch 1 in its view, compares n1's log (PG_INFO); n1
 *            answers with (2, 2). Map 3 (n0 up) reaches n0 before the reply: n0 peers (it must
 *            pull (2, 2)). Then the reply arrives. Before the fix n0 compared it with its log
 *            and told n1 to roll (2, 2) back, under epoch 3, which n1 had just promised to it;
 *            now the reply is of an earlier life and n0 is not active: nothing is rolled back.
 * Returns the violations (the script runs on to the end and heals).
 */
static unsigned scenario_stale_info(struct sim *s, int unguarded)
{
    struct stats st;

    scenario_init(s, &st);
    s->unguarded = unguarded;
    new_map(s, 0x1f, 100);
    drain(s);
    expect(s, s->nd[0].role == R_ACTIVE, "n0 is active");
    if (can_write(s, 0))
        do_write(s, 0);
    drain(s);
    ack_check(s, 0, 1);
    expect(s, s->nw == 1 && s->w[0].state == W_ACKED, "w1 is acknowledged");
    s->nd[0].cut = 1;
    trace(s, "n0 cut off (still running)");
    new_map(s, 0x1e, 100); /* n0 down: n1 leads {n1,n2,n3} */
    drain(s);
    expect(s, s->nd[1].role == R_ACTIVE, "n1 is active at epoch 2");
    if (can_write(s, 1))
        do_write(s, 1);
    drain(s);
    ack_check(s, 1, 1);
    expect(s, s->nw == 2 && s->w[1].state == W_ACKED, "w2 is acknowledged at epoch 2");
    s->nd[0].cut = 0;
    trace(s, "healed: n0 reachable again, still active at epoch 1 in its own map");
    expect(s, s->nd[0].role == R_ACTIVE && s->nd[0].map_epoch == 1, "n0 leads in its map 1");
    s->nd[0].known[1] = 0;
    push_to(s, 0, 1);      /* PG_INFO to n1 */
    deliver_first(s);      /* n1 answers (2, 2); its reply is on its way */
    new_map(s, 0x1f, 100); /* n0 up: it leads again and peers */
    expect(s, s->nd[0].role == R_QUERY, "n0 peers at epoch 3");
    drain(s); /* the reply first, then the peering */
    heal_and_check(s);
    return s->nviolations;
}

static void test_sim_scenario_stale_info_after_heal(void **state)
{
    /* The push path before the fix loses w2 in this script: the test can fail. */
    assert_true(scenario_stale_info(&S, 1) > 0);
    assert_non_null(strstr(S.fail, "rolled back acknowledged write w2"));
    if (S.trace)
        printf("  (unguarded, as expected: %s)\n", S.fail);
    /* With it: nothing rolled back, both writes in the final log. */
    scenario_stale_info(&S, 0);
    assert_int_equal(S.st->rb_refused + S.st->rb_stale > 0, 1);
    scenario_end(&S);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_scenario_unsynced_acting),
        cmocka_unit_test(test_sim_scenario_activation_retry),
        cmocka_unit_test(test_sim_scenario_interval_continues),
        cmocka_unit_test(test_sim_scenario_promise_fence),
        cmocka_unit_test(test_sim_scenario_pending_overwritten),
        cmocka_unit_test(test_sim_scenario_pending_full),
        cmocka_unit_test(test_sim_scenario_stale_info_after_heal),
        cmocka_unit_test(test_sim_random),
    };
    for (int i = 0; i < MAXN; i++)
        snprintf(map_ids[i], sizeof(map_ids[i]), "n%d", i);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
