/*
 * The monitor's policy (control/policy.c): a pure function of (what was observed of the nodes,
 * the map, the time) to the next map, as docs/architecture.md "Control plane" describes. No I/O:
 * the monitor feeds it what etcd says (each node's registration, from its lease) and what the
 * nodes report (caught up with their PGs), and stores what it returns by compare-and-swap.
 *
 * Rules, per node of the map:
 *   up   -> down  its registration has been gone for down_after_ms
 *   down -> out   gone for out_after_ms (its data is then re-replicated elsewhere by placement)
 *   down -> up    registered again for up_after_ms and caught up with its PGs
 *   out  -> up    the same (an operator's `out` is an intent the monitor does not undo: only
 *                 nodes it put out itself, auto_out)
 * Guard rails: a registered node is never marked down; the monitor marks a node down only while
 * the nodes down in the map stay within max_down_pct of them (an etcd partition or a rack's
 * power must not empty the cluster: the rest wait); a node that lost its lease but still answers
 * its peers (reachable: cut off from etcd alone) is not marked down when that would leave some
 * PG with fewer than min_core caught-up core replicas that are reachable (registered, or
 * answering) — it stays up, its PGs stay writable, and it goes down once it stops answering or
 * the others suffice; a node whose state changed flap_max times within flap_window_ms is held
 * down for damp_ms before it may come up again.
 */
#ifndef TS_POLICY_H
#define TS_POLICY_H

#include "ts_map.h"

#include <stdint.h>

struct ts_policy_cfg {
    uint64_t down_after_ms; /* e.g. lease TTL + grace */
    uint64_t out_after_ms;
    uint64_t up_after_ms;
    unsigned max_down_pct; /* of the map's nodes, at least one node */
    uint64_t flap_window_ms;
    unsigned flap_max;
    uint64_t damp_ms;
    unsigned core, min_core; /* what the datasets ask of a PG (the widest core, the largest
                              * min_core); min_core 0: no min_core guard */
};

void ts_policy_cfg_defaults(struct ts_policy_cfg *c);

/* What the policy remembers of a node between decisions. */
struct ts_policy_node {
    char id[64];
    int registered;         /* its lease's key is in etcd */
    int caught_up;          /* it reported holding every PG it is a replica of */
    uint64_t since_ms;      /* when `registered` last changed (or was first seen) */
    int auto_out;           /* the policy put it out (an operator did not) */
    uint64_t flap_start_ms; /* the current flap window */
    unsigned flaps;         /* state changes in it */
    uint64_t damped_until_ms;
    int reachable; /* it answers its peers (the monitor's node reached it), lease or not */
};

struct ts_policy {
    size_t n, cap;
    struct ts_policy_node *node;
};

void ts_policy_init(struct ts_policy *p);
void ts_policy_fini(struct ts_policy *p);
/* An observation of node id at now_ms: registered or not, caught up or not. */
void ts_policy_observe(struct ts_policy *p, const char *id, int registered, int caught_up,
                       uint64_t now_ms);
/* Whether the policy marked node id out itself (so it may bring it back up): 1, else 0. */
int ts_policy_auto_out(struct ts_policy *p, const char *id);
/* Whether node id answers its peers (observed by the monitor for nodes without a lease). */
void ts_policy_reachable(struct ts_policy *p, const char *id, int reachable);
/*
 * The next map (epoch + 1) for map m at now_ms: 0 with *next (ts_map_free) and why says what
 * changed, or 0 with *next NULL when nothing is to change; TS_ENOMEM.
 */
int ts_policy_decide(struct ts_policy *p, const struct ts_map *m, const struct ts_policy_cfg *c,
                     uint64_t now_ms, struct ts_map **next, char *why, size_t cap);

#endif
