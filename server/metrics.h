/*
 * The node's metrics (docs/operations.md "Monitoring"): counters the workers add to on the hot
 * path, one set per worker, without locks (relaxed atomics on the worker's own cache lines); the
 * hottest PGs and shards from a per-worker ring drained by the metrics thread (http.c); the
 * Prometheus text rendering (metrics_text.c).
 */
#ifndef TSD_METRICS_H
#define TSD_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "ts_proto.h"
#include "tessera/types.h"

struct tsd_conn;
struct tsd_server;
struct tsd_worker;

enum { TSD_TR_TCP, TSD_TR_TLS, TSD_TR_RDMA, TSD_TR_N };
enum { TSD_LAT_READ, TSD_LAT_WRITE, TSD_LAT_REPL, TSD_LAT_N };
#define TSD_LAT_BUCKETS 18 /* upper bounds in tsd_lat_bounds_s, then +Inf */
#define TSD_NERR 32        /* error codes by -rc; 0: any other */
#define TSD_NROLES 5       /* none, reader, writer, admin, node */
#define TSD_MTAB_SLOTS 256 /* names per worker table; more are counted as "_other" */
#define TSD_HOT_RING 8192  /* reads waiting for the metrics thread, per worker */

extern const double tsd_lat_bounds_s[TSD_LAT_BUCKETS];
extern const char *const tsd_transport_names[TSD_TR_N];
extern const char *const tsd_lat_kind_names[TSD_LAT_N];

/* A name's counters (a dataset's, a peer's). A slot is claimed once (state 0 -> 1 by CAS), its
 * name written, then published (2); it is never freed, so a reader needs no lock. */
enum { TSD_MV_READS, TSD_MV_READ_BYTES, TSD_MV_WRITTEN_BYTES, TSD_MV_N };
enum { TSD_PEER_RX = 0, TSD_PEER_TX = 1 };
struct tsd_mslot {
    _Atomic uint32_t state;
    uint32_t hash;
    char name[TS_NAME_MAX + 1];
    _Atomic uint64_t v[TSD_MV_N];
};
struct tsd_mtab {
    struct tsd_mslot slot[TSD_MTAB_SLOTS];
    _Atomic uint64_t other[TSD_MV_N];
};

/* A read for the hotness views: which dataset (a slot of the worker's dataset table), shard,
 * bytes. A bounded multi-producer queue (a cell's seq says whose turn it is). */
struct tsd_hot_cell {
    _Atomic uint64_t seq;
    uint32_t slot, shard;
    uint64_t bytes;
};

struct tsd_wmetrics {
    _Atomic uint64_t req[TS_OP_MAX][TSD_TR_N][2]; /* [op][transport][ok, error] */
    _Atomic uint64_t rx[TS_OP_MAX][TSD_TR_N], tx[TS_OP_MAX][TSD_TR_N];
    _Atomic uint64_t err[TSD_NERR];
    _Atomic uint64_t lat[TSD_LAT_N][TSD_TR_N][TSD_LAT_BUCKETS + 1];
    _Atomic uint64_t lat_sum_ns[TSD_LAT_N][TSD_TR_N];
    _Atomic int64_t conns[TSD_NROLES][TSD_TR_N];
    struct tsd_mtab datasets; /* v: reads, read bytes, written bytes */
    struct tsd_mtab peers;    /* v[TSD_PEER_RX], v[TSD_PEER_TX]: node peers' connections */
    struct tsd_hot_cell ring[TSD_HOT_RING];
    _Atomic uint64_t ring_head;
    uint64_t ring_tail; /* the metrics thread's */
    _Atomic uint64_t ring_dropped;
};

/* metrics.c: the hot path. */
struct tsd_wmetrics *tsd_wmetrics_create(void);
void tsd_wmetrics_destroy(struct tsd_wmetrics *m);
int tsd_conn_transport(const struct tsd_conn *c);
/* A request frame was taken in (its header and payload). */
void tsd_m_request(struct tsd_conn *c, const struct ts_frame_hdr *h);
/* A reply went out: rc 0 or the error sent; bytes: the whole reply frame. The request's time
 * (h->recv_ns) gives the latency of reads, writes and replication. */
void tsd_m_reply(struct tsd_conn *c, const struct ts_frame_hdr *h, int rc, uint64_t bytes);
/* Data bytes read from (or written to) a dataset: its counters and the hotness ring. */
void tsd_m_read(struct tsd_conn *c, const char *dataset, uint32_t shard, uint64_t bytes);
void tsd_m_written(struct tsd_conn *c, const char *dataset, uint64_t bytes);
/* A connection is ready (its role known) / closed: the connection gauges. */
void tsd_m_conn_open(struct tsd_conn *c);
void tsd_m_conn_close(struct tsd_conn *c);
/* The metrics thread: takes the next queued read of w (1), or 0 when none. */
int tsd_m_ring_take(struct tsd_wmetrics *m, uint32_t *slot, uint32_t *shard, uint64_t *bytes);

#endif
