/*
 * Replication (tesserad internal): one thread with its own event loop that owns the
 * connections to the other nodes and
 *   - forwards chunks of uploads to the other core replicas, synchronously for the uploader;
 *   - pushes each PG's operation log, in order, to every other replica of the PGs this node is
 *     primary of: core replicas (their acknowledgement completes a seal) and fringe replicas
 *     (asynchronous, lag measured), streaming the shard's chunks first when a replica lacks
 *     them; a replica whose position was trimmed from the log is backfilled from the PG;
 *   - repairs a corrupt local chunk from another replica.
 * Workers talk to it by posting work (thread-safe calls below); completions run on the
 * worker's event base.
 */
#ifndef TS_REPL_H
#define TS_REPL_H

#include <event2/event.h>
#include <openssl/ssl.h>

#include "ts_map.h"
#include "ts_store.h"

#define TS_REPL_MAX_REPLICAS 8

typedef struct ts_repl ts_repl;

struct ts_repl_opts {
    ts_store *store;
    const char *node_id;
    int peer_timeout_ms; /* a peer silent this long while owing replies is unreachable */
    uint64_t log_keep;   /* PG log records kept per PG */
    SSL_CTX *ssl;        /* client context for peers' TLS listeners; NULL: plain TCP */
    /* Runs on the replication thread when a peer shows a newer map than ours. */
    void (*adopt_map)(void *arg, const struct ts_map *m);
    /* Whether this node holds pg's log but not its shards (it joined the PG's replicas and has
     * not been backfilled yet): it may not lead the PG before a backfill. Thread-safe. */
    int (*needs_backfill)(void *arg, uint32_t pg);
    void *arg;
    /* Never push our map to a peer that is behind (a cluster whose map lives in etcd: each node
     * installs only what etcd committed, and learns it from etcd). */
    int no_map_push;
};

/* rc: 0, or why it failed; acked: how many targets hold the write. */
typedef void (*ts_repl_done)(void *arg, int rc, unsigned acked, const char *msg);

struct ts_repl_targets {
    unsigned n;
    char id[TS_REPL_MAX_REPLICAS][64];
};

struct ts_repl_chunk {
    char dataset[TS_NAME_MAX + 1];
    struct ts_dataset_policy policy;
    uint64_t inc; /* the dataset's incarnation */
    uint32_t shard, idx;
    uint64_t size;
    uint32_t crc;
    uint8_t *data; /* malloc'ed; the replication module frees it */
    size_t len;
    struct ts_repl_targets to;
};

int ts_repl_start(ts_repl **out, const struct ts_repl_opts *o, const struct ts_map *m);
void ts_repl_stop(ts_repl *r); /* NULL ok */
/* Installs a new map (copied). */
void ts_repl_set_map(ts_repl *r, const struct ts_map *m);
/* Sends chunk c (taken over) to its targets; done(arg, ...) runs on base when every target
 * answered or was found unreachable. */
void ts_repl_forward_chunk(ts_repl *r, struct ts_repl_chunk *c, struct event_base *base,
                           ts_repl_done done, void *arg);
/* Waits until every target has applied seq of pg (or is unreachable); pushes it there. */
void ts_repl_wait_applied(ts_repl *r, uint32_t pg, uint64_t seq, const struct ts_repl_targets *to,
                          struct event_base *base, ts_repl_done done, void *arg);
/* New records in pg's log: push them. */
void ts_repl_kick(ts_repl *r, uint32_t pg);
/* The upload of dataset/shard whose chunks were forwarded to `to` ended on the primary: end it
 * on those replicas too (after the chunks already on their way). */
void ts_repl_abort_upload(ts_repl *r, const char *dataset, uint32_t shard,
                          const struct ts_repl_targets *to);
/* Fetches chunk idx of dataset/shard from another replica of pg and repairs the local copy. */
void ts_repl_repair(ts_repl *r, const char *dataset, uint32_t shard, uint32_t idx, uint32_t pg);
/* How many of the targets are not known to be unreachable right now. */
unsigned ts_repl_reachable(ts_repl *r, const struct ts_repl_targets *to);

struct ts_repl_lag {
    uint32_t pg;
    char node[64];
    int core; /* 1 core, 0 fringe */
    uint64_t applied, primary_applied;
    uint64_t lag_ops, lag_bytes;
    double lag_s;
    int recovering;  /* not yet confirmed to hold this PG's log (it serves no reads of it) */
    int backfilling; /* a backfill of this replica runs: */
    uint64_t bf_done, bf_total; /* shards sent of the PG's shards */
};
/* A snapshot of every replica's position for the PGs this node is primary of (malloc'ed). */
int ts_repl_lag(ts_repl *r, struct ts_repl_lag **out, size_t *n, unsigned *primary_pgs,
                uint64_t *repairs, uint64_t *backfills);
/* Comparisons whose rollback of a replica ts_peering_rollback() refused (thread-safe). */
uint64_t ts_repl_rollbacks_refused(ts_repl *r);

/* ---- peering (pgpeer.c; docs/architecture.md "Peering") ------------------------------------ */

/* 0 when this node leads pg in an activated interval (*epoch: the interval, *wq: its write
 * quorum); else TS_EBUSY with the reason in why (peering, pulling, blocked...). Thread-safe. */
int ts_repl_pg_ready(ts_repl *r, uint32_t pg, uint64_t *epoch, uint8_t *wq, char *why, size_t cap);

struct ts_repl_pgstat {
    uint32_t pg;
    const char *state; /* "peering", "pulling", "activating", "active", "blocked" */
    int active;
    uint64_t epoch, since_ns;
    char why[320];
};
/* Every PG this node leads or is peering to lead (malloc'ed array). Thread-safe. */
int ts_repl_pg_states(ts_repl *r, struct ts_repl_pgstat **out, size_t *n);
const char *ts_repl_pg_state_name(int state);
/* Whether this node is pulling pg's log from node (peering). Thread-safe. */
int ts_repl_pulling_from(ts_repl *r, uint32_t pg, const char *node);

/* A peering primary (node) asked for our log of pg: push it there under that epoch.
 * recheck: a replica asks its primary to compare its log again (ignored unless we lead pg). */
void ts_repl_pull(ts_repl *r, uint32_t pg, const char *node, uint64_t epoch, int recheck);
/* This replica may not serve pg yet (restarted): ask the PG's primary to compare our log and
 * tell us when we hold it (REPL_SEAL kind CLEAN). Thread-safe. */
void ts_repl_ask_primary(ts_repl *r, uint32_t pg);
/* Asks pg's primary to backfill this node (scrub found shards missing here). Thread-safe. */
void ts_repl_ask_backfill(ts_repl *r, uint32_t pg);

/* inventory.c: this replica's inventory of a PG next to its primary's (see ts_store_pg_inventory).
 * Blocks up to timeout_ms (call it off the replication thread). 0 with out filled; TS_EEXIST
 * when this node leads the PG, TS_ENOENT when it holds no placement of it, or the primary's or
 * the transport's error (TS_EBUSY: the primary is not active). */
struct ts_repl_inventory {
    char primary[64];
    int rank;
    uint64_t applied, count, digest;                         /* ours */
    uint64_t primary_applied, primary_count, primary_digest; /* the primary's */
};
int ts_repl_inventory_check(ts_repl *r, uint32_t pg, int timeout_ms, struct ts_repl_inventory *out);
/* A ts_store_extra_fn: the extra (hot) replicas map gives a dataset in PG pg. */
struct ts_repl_hot_arg {
    const struct ts_map *map;
    uint32_t pg;
};
unsigned ts_repl_hot_extra_cb(void *arg, const char *dataset);
/* Sends our map to node (it showed an older epoch). Thread-safe. */
void ts_repl_push_map(ts_repl *r, const char *node_id);

/* Dataset incarnation `incarnation` was deleted here: log it in every PG this node leads, so
 * replicas that were away apply it before they serve again. Thread-safe. */
void ts_repl_log_delete(ts_repl *r, const char *dataset, uint64_t incarnation);

/* membership.c: the replica widths (core + fringe) of this node's datasets, narrowest and
 * widest (0 and 0: no dataset); a node's rank in a PG's replica order (-1: none; in a PG
 * that a rebalance moves, a node it brings in ranks where it will: two nodes may share a rank,
 * and a rank 0 is not always the primary); whether a
 * map change moves node into the replicas of a dataset of pg that it was not a replica of
 * (it holds none of its shards there and needs a backfill). */
struct ts_repl_widths {
    unsigned min, max;
};
void ts_repl_widths(ts_store *st, struct ts_repl_widths *w);
int ts_repl_rank_of(const struct ts_map *m, uint32_t pg, const char *node);
int ts_repl_gains_data(const struct ts_map *old, const struct ts_map *m, uint32_t pg,
                       const char *node, const struct ts_repl_widths *w);

/* The PG facts as PG_QUERY replies carry them (docs/protocol.md). */
struct ts_wr;
struct ts_rd;
void ts_repl_wr_pg_state(struct ts_wr *w, const struct ts_pg_state *st);
int ts_repl_rd_pg_state(struct ts_rd *rd, struct ts_pg_state *st);

#endif
