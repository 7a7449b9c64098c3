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
 *    rolled back by the pull.
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
};

struct ts_peering_in {
    uint64_t epoch;   /* the epoch being peered */
    const char *self; /* the would-be primary */
    const char (*map_nodes)[64];
    size_t nmap; /* every node of the map: the acting set before any interval */
    const struct ts_peer_reply *replies;
    size_t nreplies;
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

#endif
