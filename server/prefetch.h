/*
 * Plan-driven prefetch (issue 32): a reader tells the node, by HINT, the ranges it will ask
 * for next; the node reads their chunks ahead from disk into its chunk cache (verified as
 * every read is, admitted as wanted), on a thread of its own, so disk latency hides behind the
 * job's compute. Hints are advisory and bounded: queued chunk bytes per connection
 * (storage.prefetch_conn_mb) and per node (storage.prefetch_mb); a hint past either bound is
 * dropped (counted), never waited for. A closed connection's queued hints are forgotten.
 */
#ifndef TSD_PREFETCH_H
#define TSD_PREFETCH_H

#include <stdint.h>

struct tsd_prefetch;
struct tsd_pf_account;
typedef struct ts_store ts_store;

struct tsd_prefetch_stats {
    uint64_t hinted;  /* chunks hinted */
    uint64_t queued;  /* ... accepted into the queue */
    uint64_t dropped; /* ... over the connection's or the node's bound */
    uint64_t read;    /* chunks read ahead into the cache */
    uint64_t skipped; /* ... already cached when their turn came, or their connection gone */
    uint64_t failed;  /* ... that could not be read (a damaged chunk: not cached, logged) */
    uint64_t read_bytes;
    uint64_t queued_bytes; /* now */
};

/* node_bytes 0: prefetch off (every hint is dropped). */
int tsd_prefetch_start(struct tsd_prefetch **out, ts_store *store, uint64_t node_bytes,
                       uint64_t conn_bytes);
/* Stops the thread (what is queued is forgotten). NULL is a no-op. */
void tsd_prefetch_stop(struct tsd_prefetch *p);
/* A connection's account, made on its first hint (NULL when out of memory). */
struct tsd_pf_account *tsd_prefetch_account(struct tsd_prefetch *p);
/* The connection closed: its queued hints are dropped when their turn comes. */
void tsd_prefetch_account_close(struct tsd_pf_account *a);
/* Queues chunk idx (bytes long) of a dataset's shard for account a: 1 queued, 0 dropped. */
int tsd_prefetch_add(struct tsd_prefetch *p, struct tsd_pf_account *a, uint64_t dsid,
                     uint32_t shard, uint32_t idx, uint32_t bytes);
/* Counts n chunks hinted and dropped without being offered (after a drop in the same HINT). */
void tsd_prefetch_drop(struct tsd_prefetch *p, uint32_t n);
void tsd_prefetch_stats(struct tsd_prefetch *p, struct tsd_prefetch_stats *out);

#endif
