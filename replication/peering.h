/*
 * Peering decisions (docs/architecture.md "Peering"): a pure function from what the replicas
 * of a PG reported to what the would-be primary does next. No I/O, no clocks, no globals: the
 * replication thread feeds it the replies it collected and acts on the verdict; unit tests
 * drive it through the interleavings they can name (tests/unit/test_peering.c).
 *
 * The rules, in short (Ceph's past intervals and Raft's up-to-date rule, with joint quorums):
 *  - Every node keeps, per PG, durably: its log head (epoch, seq), the highest epoch it promised
 *    (it then refuses replication and activation from older epochs), the newest interval known
 *    to have started (les) with its acting set and write quorum (wq), and the intervals being
 *    started (pending) with theirs: a pending interval is forgotten only when an interval at
 *    least as new is known to have started (any of them may have started).
 *  - Starting interval E: the primary prepares E (pending) on q of every set the peering
 *    needed (below) and on enough members of E's acting set that hold its whole log to make a
 *    write quorum; only then is E started (les = E, committed: its primary tells the members).
 *    So every write an interval starts from is on wq of its acting set, and every write
 *    acknowledged in it is too (writes need wq).
 *  - Peering needs, for L = the newest started interval any replier knows (or, before any, the
 *    whole map) and for every newer pending interval any replier reports: replies from
 *    q = max(|A| - wq + 1, |A|/2 + 1) members of its acting set A. The first term makes the
 *    replies meet every write quorum of that interval; the second makes two peerings meet, so a
 *    later interval that was started (prepared on q of the set this one also needs) is seen.
 *  - The authoritative head is the newest (epoch, seq) among the primary and the repliers that
 *    are members of those sets (a node outside them holds nothing acknowledged beyond them, and
 *    may hold a log without its data: a rebalance drops old copies, not their log); on a tie
 *    the primary, then a member of the newest set. A primary whose own head is older pulls
 *    first; entries it holds beyond a common prefix are divergent (never acknowledged) and are
 *    rolled back by the pull. A primary that holds the log but not the shards (it joined the
 *    PG's replicas in this map) is backfilled by a member at the head before it leads.
 */
#ifndef TS_PEERING_H
#define TS_PEERING_H

#include <stddef.h>
#include <stdint.h>

#include "ts_store.h"

/* One replier's durable PG facts (the primary itself is one of them). */
struct ts_peer_reply {
    char id[64];
    struct ts_pg_state st;
    int lacks_shards; /* it holds the PG's log but not all its shards (awaits a backfill) */
};

struct ts_peering_in {
    uint64_t epoch;   /* the epoch being peered */
    const char *self; /* the would-be primary */
    const char (*map_nodes)[64];
    size_t nmap; /* every node of the map: the acting set before any interval */
    const struct ts_peer_reply *replies;
    size_t nreplies;
    /* This node holds the PG's log but not its shards (a map change made it a replica, here its
     * primary, of a PG it applied as no-ops): it may not lead from its log alone. The verdict
     * is then PULL from a member of the sets at the authoritative head (which backfills it), or
     * WAIT while none has answered. */
    int self_needs_backfill;
};

enum ts_peering_verdict {
    TS_PEERING_WAIT = 0,     /* not enough replies from the newest interval's acting set */
    TS_PEERING_PULL = 1,     /* quorum reached; this node must first catch up from pull_from */
    TS_PEERING_ACTIVATE = 2, /* quorum reached and this node holds the newest head */
};

#define TS_PEERING_MAX_SETS 64

/* One acting set whose replies peering needs: the newest started interval, or a pending one. */
struct ts_peering_set {
    uint64_t epoch; /* 0: the whole map (no interval started yet) */
    int pending;    /* an interval being started, not known to have started */
    char ids[TS_PG_MAX_ACTING][64];
    unsigned n, need, have;
};

struct ts_peering_out {
    int verdict;
    char why[400];                                   /* WAIT: who is missing; else a summary */
    uint64_t head_seq, head_epoch;                   /* the authoritative head */
    char pull_from[64];                              /* PULL: a replier holding that head */
    uint64_t last_interval;                          /* L */
    struct ts_peering_set sets[TS_PEERING_MAX_SETS]; /* L's first, then pending ones */
    unsigned nsets;
};

/* q(L) for an acting set of n members and write quorum wq. */
unsigned ts_peering_quorum(unsigned n, unsigned wq);
/* -1, 0, 1 as head (e1, s1) is older than, equal to, newer than (e2, s2). */
int ts_peering_head_cmp(uint64_t e1, uint64_t s1, uint64_t e2, uint64_t s2);
/* Decides; fills *out. TS_EINVAL when self is not among the replies. */
int ts_peering_decide(const struct ts_peering_in *in, struct ts_peering_out *out);

/*
 * Rolling a replica back (push.c asks this and acts only on its answer; nothing else in the
 * code truncates a replica's log). A pusher compared the replica's log with ours (PG_INFO) and
 * the reply came back; it decides what the comparison allows:
 *  - PREFIX: the replica's log is a prefix of ours; it holds ours up to `to` (counts for writes).
 *  - TRUNCATE: entries of the replica past (to, to_epoch) are provably divergent: our log is the
 *    PG's authoritative one now (this node leads the PG and its peering verdict of this life
 *    found its log the newest: activating or active; or a peering primary pulls our log), the
 *    reply was asked for in this same life and interval, and none of them is of an epoch newer
 *    than that interval (such entries are what we lack, never what diverged).
 *  - REFUSE: the comparison says the replica diverges, and a rule above forbids rolling it back.
 *  - STALE: the reply is from an earlier life or interval, or our log is not authoritative now;
 *    nothing is decided (the pusher asks again once it may).
 */
#define TS_ROLLBACK_TRIMMED UINT64_MAX /* ours[i]: that position is trimmed from our log */

struct ts_rollback_in {
    int authoritative; /* our log is the PG's authoritative one now (above) */
    uint64_t interval; /* the interval it is authoritative under: ours, or the puller's epoch */
    uint64_t life;     /* the peering life (or the pull) now; 0: none */
    uint64_t asked_interval, asked_life; /* when the PG_INFO was sent */
    uint64_t my_epoch, my_applied;       /* our head */
    uint64_t applied, head_epoch;        /* the replica's head */
    const struct ts_log_pos *tail;       /* its newest entries, newest first (head first) */
    size_t ntail;
    const uint64_t *ours; /* per tail entry: our entry's epoch at that seq (0: none) */
    uint64_t ours_before; /* our entry's epoch at the oldest tail seq - 1 (0: none) */
};

enum ts_rollback_verdict {
    TS_ROLLBACK_STALE = 0,
    TS_ROLLBACK_REFUSE = 1,
    TS_ROLLBACK_PREFIX = 2,
    TS_ROLLBACK_TRUNCATE = 3,
};

struct ts_rollback_out {
    int verdict;
    uint64_t to, to_epoch; /* PREFIX: the replica's head; TRUNCATE: the entry to roll back to */
    char why[320];
};

/* Decides; fills *out. TS_EINVAL on inconsistent input (a tail longer than its pointer). */
int ts_peering_rollback(const struct ts_rollback_in *in, struct ts_rollback_out *out);

#endif
