/*
 * tessera CLI: the failover drills' shared parts (cli_drill.c: the load, the acts on nodes, the
 * scenarios; cli_drill_check.c: what every drill checks at its end, acknowledged shards read
 * through the cluster and from each core replica alone, and the report; cli_drill_data.c: the
 * drills on data, corrupt-chunk, fringe-lag and disk-full; cli_drill_net.c: partition;
 * cli_agent.c: the acts themselves, here or on a node's host).
 */
#ifndef TS_CLI_DRILL_H
#define TS_CLI_DRILL_H

#include <sys/types.h>

#include "cli.h"

#define SHARD_BYTES (64u << 10)
#define MAX_SHARDS 100000
#define DRILL_OTHER_BYTES 1 /* drill_read_alone: the node served other bytes than acknowledged */

/* A core replica's figures at the end of a drill (cli_drill_check.c). */
struct drill_replica {
    char id[64];
    uint64_t checked;    /* acknowledged shards it is a core replica of (the final map), read */
    uint64_t missing;    /* of those, not served whole within the wait (absent, incomplete,
                          * declined, a checksum error, no answer) */
    uint64_t mismatched; /* served whole, with other bytes (or another length) */
};

struct drill {
    struct ctx *x;
    char ds[64];
    uint8_t *acked;        /* acked[i]: shard i's put succeeded */
    uint64_t *acked_epoch; /* the map epoch the client held when shard i's put succeeded */
    uint32_t next;         /* the next shard to write */
    uint64_t t0;
    /* results */
    uint64_t writes_ok, writes_failed, reads_ok, reads_failed, checksum_errors;
    uint64_t act_ns, detect_ns, failover_ns, recover_ns;
    uint64_t ops_before, ops_during, ops_after;
    double secs_before, secs_during, secs_after;
    char node[64], log[2048];
    int phase; /* 0 before the act, 1 during, 2 after recovery */
    /* corrupt-chunk: bytes flipped in the node's files, its reads that found them, the
     * shards it held corrupt and still holds after the repair; fringe-lag: the largest lag */
    uint64_t flipped, node_corrupt, node_still_bad;
    uint64_t lag_max_ops;
    double lag_max_s;
    int avoid;             /* -1, or a node whose core PGs the load leaves alone (fringe-lag) */
    uint64_t enospc;       /* writes refused with TS_ENOSPC (disk-full) */
    uint64_t balloon;      /* bytes the disk-full drill put on the node's filesystem */
    char first_err[300];   /* the first write the act made fail, and why */
    uint64_t node_missing; /* partition: the healed node's missing + mismatched (drill_finish) */
    /* at the end: acknowledged shards lost (read through the cluster), rolled back */
    uint64_t lost, rb_acked, rb_all, rb_unseen;
    /* at the end: every UP node's figures as a core replica (nrep of them), and the shards
     * missing or mismatched on one, summed over the replicas */
    struct drill_replica *rep;
    size_t nrep;
    uint64_t core_missing;
    /* --auto (cli_drill_auto.c): the PGs the killed node led (led[pg]), when each first took an
     * acknowledged write after the act and when no node listed it peering or lagging any more
     * after the node's return; when the monitor marked the node down and up */
    uint32_t npg;
    uint8_t *led;
    uint64_t *pg_writable_ns, *pg_replicated_ns;
    uint64_t down_ns, back_ns, up_ns;
};

/* cli_drill_auto.c: --auto. Refused (TS_EINVAL, why in x->local) unless the scenario is one the
 * monitor heals and the cluster's nodes follow etcd. */
int drill_auto_check(struct drill *d, const char *scenario);
/* Notes the PGs node i leads now (before it is killed). */
int drill_auto_pgs(struct drill *d, int i);
/* A write of shard s was acknowledged at t: the first after the act in a PG the node led. */
void drill_auto_acked(struct drill *d, uint32_t s, uint64_t t);
/* Runs the load until the map marks node `id` `state` (TS_NODE_*), at most max_s: 0 with the
 * moment in *at, or TS_ETIMEDOUT. */
int drill_auto_wait(struct drill *d, const char *id, int state, double max_s, uint64_t *at);
/* After the node's return: runs the load until no node lists any of its PGs peering or
 * lagging (at most max_s), noting when each PG got there. */
void drill_auto_replicated(struct drill *d, double max_s);
/* The report's part: "auto", per PG "writable_s" and "replicated_s" (from the act), the
 * monitor's "marked_down_s" and "marked_up_s" (from the act, from the start). */
void drill_auto_report(const struct drill *d, struct json_object *o);
/* ... and as text lines of the report. */
void drill_auto_print(const struct drill *d);
/* The load's step (cli_drill.c), for the waits above. */
int drill_load_step(struct drill *d);

/* Node i's STATUS as a parsed document (the caller puts it), or NULL. */
struct json_object *drill_status_of(struct drill *d, size_t i);
/* cli_drill_check.c: shard s read from node i alone (not through the cluster's choice of replica)
 * and compared with its bytes: 0 (the same), DRILL_OTHER_BYTES (served whole, other bytes or
 * length), or the read's TS_E*. Asked again every 100 ms until `deadline` (monotonic ns) while the
 * node declines (TS_EBUSY, TS_ESTALE: it serves a PG once its primary has confirmed it) or, with
 * `any`, on any error (a replica catching up); other bytes are never asked again. */
int drill_read_alone(struct drill *d, int i, uint32_t s, uint64_t deadline, int any);
/* Every acknowledged shard read from each of its core replicas (under the map now) alone, byte
 * for byte, waited for up to 30 s in all: d->rep, d->nrep (every UP node) and d->core_missing,
 * which it returns. */
uint64_t drill_check_replicas(struct drill *d);
/* The end of every drill: acknowledged shards read through the cluster (d->lost), from each
 * core replica alone (drill_check_replicas), the nodes' rollbacks; the report (printed, and
 * written to --report). 0, or TS_EIO with d->x->local saying what failed. */
int drill_finish(struct drill *d, const char *scenario);
/* The drill dataset's log entries that a rollback removed on any node (the nodes' STATUS
 * "rolled_back"): *acked those of acknowledged shards, at or after the epoch of their
 * acknowledgement (an earlier, failed attempt's entry is not one), *all every one; *unseen:
 * shard-sealing entries rolled back that no node's STATUS listed (its list keeps the newest 128,
 * and is dropped from an oversized STATUS) or of nodes that did not answer: not inspected. */
void drill_rolled_back(struct drill *d, uint64_t *acked, uint64_t *all, uint64_t *unseen);
/* The drill's log: a timestamped line, kept for the report (and on stderr without --json). */
void drill_note(struct drill *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Shard i's bytes (64 KiB, from its number). */
void drill_shard_bytes(uint8_t *p, uint32_t i);
/* The load (a write and a verified read per step) for secs seconds. */
void drill_load_for(struct drill *d, double secs);
/* Act `act` (with up to two arguments) on node i (cli_agent.c lists them): done here in the
 * embedded mode, else through d->x->agent. 0 with the agent's output in out, or TS_E* with
 * d->x->local saying why. */
int drill_act(struct drill *d, int i, const char *act, const char *arg, const char *arg2, char *out,
              size_t cap);
/* cli_agent.c: the act itself, on node `id` of this host (x->c, when set, is a client of the
 * cluster; else the agent connects to x->opts->address when the act needs the running node). */
int agent_do(struct ctx *x, const char *id, const char *act, const char *arg, const char *arg2,
             char *out, size_t cap);
/* Starts d->node again (the agent's saved command line; output in logdir/drill-NODE.log) and
 * marks it up. */
int drill_restart(struct drill *d, const char *logdir);
/* The node that leads the PG of the shard the load writes next. */
int drill_primary_next(struct drill *d);
/* Node i is one of the first 3 replicas (the drill dataset's core) of shard s's PG. */
int drill_core_of(struct drill *d, uint32_t s, int i);
/* The act on node i begins (d->node, the phase, the act's time); TS_EINVAL with why_none in
 * d->x->local when i < 0 (no such node). */
int drill_begin(struct drill *d, int i, const char *why_none);
/* Fails node i over (marks it down in a new map epoch); marks node id up again. */
int drill_fail_over(struct drill *d, int i);
int drill_mark_up(struct drill *d, const char *id);

/* cli_drill_data.c: 0, or a TS_E* with d->x->local saying why. */
int drill_corrupt_chunk(struct drill *d, double dur, const char *logdir);
int drill_fringe_lag(struct drill *d, double dur);
int drill_disk_full(struct drill *d, double dur);
/* The node disk-full would fill, or -1 (d->x->local says why): checked before anything else. */
int drill_disk_full_pick(struct drill *d);

/* cli_drill_net.c: whether the partition drill can run here (-1, d->x->local says why: nodes
 * sharing an address, no iptables or no root), checked before anything else; the drill. */
int drill_partition_check(struct drill *d);
int drill_partition(struct drill *d, double dur);

#endif
