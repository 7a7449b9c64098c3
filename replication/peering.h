/*
 * Peering decisions (docs/architecture.md "Peering"): a pure function from what the replicas
 * of a PG reported to what the would-be primary does next. No I/O, no clocks, no globals: the
 * replication thread feeds it the replies it collected and acts on the verdict; unit tests
 * drive it through the interleavings they can name (tests/unit/test_peering.c).
 *
 * The rules, in short:
 *  - Every node keeps, per PG, durably: its log head (epoch, seq), the highest epoch it promised
 *    (it then refuses replication and activation from older epochs), and the last interval it
 *    joined: last epoch started (les), that interval's acting set and write quorum (wq).
 *  - A write acknowledged in interval L is on at least wq members of acting(L).
 *  - The newest interval L is the highest les any responder reports. Peering needs replies from
 *    q(L) = max(|A| - wq + 1, |A|/2 + 1) members of A = acting(L): the first term makes every
 *    write quorum of L meet the replies (so the newest acknowledged entry is seen), the second
 *    makes two peerings' quorums meet (so a later interval that was started cannot be missed:
 *    starting it recorded its les on q(L) members of A). With no interval yet (a new cluster),
 *    A is every node of the map.
 *  - The authoritative head is the newest (epoch, seq) among the replies (Raft's up-to-date
 *    rule). A primary whose own head is older pulls first; entries it holds beyond a common
 *    prefix are divergent (never acknowledged) and are rolled back by the pull.
 *  - Activation of the new interval is complete once q(L) members of A recorded it.
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

struct ts_peering_out {
    int verdict;
    char why[320];                   /* WAIT: who is missing; else a summary */
    uint64_t head_seq, head_epoch;   /* the authoritative head */
    char pull_from[64];              /* PULL: a replier holding that head */
    uint64_t last_interval;          /* L */
    char prev[TS_PG_MAX_ACTING][64]; /* A, the set whose members must record the activation */
    unsigned nprev, prev_need;       /* |A| and q(L) */
    int prev_is_map;                 /* A is the whole map (no interval yet) */
};

/* q(L) for an acting set of n members and write quorum wq. */
unsigned ts_peering_quorum(unsigned n, unsigned wq);
/* -1, 0, 1 as head (e1, s1) is older than, equal to, newer than (e2, s2). */
int ts_peering_head_cmp(uint64_t e1, uint64_t s1, uint64_t e2, uint64_t s2);
/* Decides; fills *out. TS_EINVAL when self is not among the replies. */
int ts_peering_decide(const struct ts_peering_in *in, struct ts_peering_out *out);

#endif
