/* tesserad internals: server, workers, connections, dispatch. */
#ifndef TSD_SERVER_INTERNAL_H
#define TSD_SERVER_INTERNAL_H

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>

#include "config.h"
#include "metrics.h"
#include "rdma.h"
#include "requests.h"
#include "ts_common.h"
#include "ts_proto.h"
#include "ts_map.h"
#include "ts_repl.h"
#include "ts_store.h"

#define FAC "server"

/* Counters, one set per worker, summed on request (STATUS). Relaxed atomics: exact enough. */
struct tsd_stats {
    _Atomic uint64_t conns_accepted;
    _Atomic uint64_t conns_refused;
    _Atomic uint64_t requests;
    _Atomic uint64_t errors;
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t chunks_written;
    _Atomic uint64_t read_bytes;
    _Atomic uint64_t corrupt_chunks;
    _Atomic uint64_t protocol_errors;
    _Atomic uint64_t input_budget_waits; /* a frame waited for room in the input budget */
    _Atomic uint64_t rdma_placed_bytes;  /* READ data written by RDMA WRITE (not in-band) */
    _Atomic uint64_t by_op[TS_OP_MAX];
};
#define STAT_ADD(st, field, n) atomic_fetch_add_explicit(&(st)->field, (n), memory_order_relaxed)
#define STAT_GET(st, field) atomic_load_explicit(&(st)->field, memory_order_relaxed)

struct tsd_server;
struct tsd_conn;

struct tsd_pending {
    evutil_socket_t fd;
    int tls;
    int evict; /* accepted over max_connections: room is made by closing a handshake */
    char peer[64];
    struct tsd_pending *next;
};

struct tsd_worker {
    struct tsd_server *srv;
    int id;
    pthread_t thread;
    struct event_base *base;
    struct event *notify; /* activated by the acceptor (new fds) and on drain */
    struct event *idle_sweep;
    pthread_mutex_t lock;
    struct tsd_pending *queue;
    struct tsd_conn *conns;
    _Atomic int nconns;
    int draining;
    struct event *drain_tick;
    _Atomic int done; /* its loop has ended */
    struct tsd_stats stats;
    struct tsd_wmetrics *m; /* metrics.h: the Prometheus counters */
    /* Seals back from the store's commit thread (ops_seal.c), under lock; sealed_ev wakes the
     * loop for them. */
    struct tsd_seal_job *sealed;
    struct event *sealed_ev;
};

struct tsd_upload {
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    ts_shard_writer *w;
    uint64_t last_ns;          /* the last chunk (idle uploads expire) */
    struct ts_repl_targets to; /* primary: the replicas its chunks were forwarded to */
};

struct tsd_read_stream {
    uint64_t req_id;
    ts_read_ctx *ctx;
    uint64_t pos, end; /* shard offsets still to send: [pos, end) */
    uint32_t chunk_size;
    uint32_t first_idx, last_idx;
    struct ts_chunk_ref first, last; /* prefetched (partial) pieces, or pin == NULL */
    char name[TS_NAME_MAX + 1];
    /* Placed by RDMA WRITE (flag TS_F_RDMA): byte pos goes to raddr + (pos - start); the reply
     * frame (head and piece table) is sent once every byte is posted. */
    int placed;
    uint64_t start, raddr;
    uint32_t rkey;
    uint8_t *reply;
    size_t reply_len;
    uint32_t shard;           /* metrics: the read's shard, */
    uint64_t t0_ns, head_len; /* when it arrived, and its reply's head and piece table */
};

struct tsd_conn {
    struct tsd_worker *w;
    struct bufferevent *bev; /* TLS connections */
    /* Plain TCP: straight on the socket (no bufferevent): reads into reserved input space,
     * replies written at once, EV_WRITE registered only while the socket is full. */
    evutil_socket_t fd;
    struct evbuffer *in, *out;
    struct event *rev, *wev;
    int reading;   /* rev is added */
    int in_readcb; /* replies are flushed at the end of the read callback */
    int io_error;  /* a write failed: freed from the write callback */
    /* This loop turn's share (plain TCP): requests handled and bytes written since its callback
     * began; past TSD_TURN_REQS or TSD_TURN_BYTES it yields (EV_WRITE brings it back after the
     * loop has polled every other connection). */
    unsigned turn_reqs;
    size_t turn_out;
    int yielded; /* wev is kept added: work is left for the next turn */
    struct tsd_conn *prev, *next;
    int tls;
    int ready;            /* plain: at once; TLS: after the handshake */
    int handshaking;      /* counted in srv->nhandshakes */
    uint64_t accepted_ns; /* when it was accepted (the oldest handshake goes first) */
    int role;
    int anonymous; /* no certificate: role is anonymous_role (at most reader in a cluster) */
    int closing;   /* close once the output has drained */
    uint64_t last_active_ns;
    char peer[64];
    char subject[256];
    char node_id[64]; /* role node: the node its certificate names */
    char client_name[64];
    struct tsd_upload *uploads;
    size_t nuploads, capuploads;
    struct tsd_read_stream *rs;
    struct tsd_pf_account *pf; /* its hints in the prefetch queue (made at its first HINT) */
    int eof;                   /* the peer half-closed: answer what was sent, then close */
    uint32_t discard;          /* payload bytes of a refused frame still to drop */
    int refs;                  /* replies parked on replication hold a reference */
    int dead;                  /* closed; freed when refs drops to 0 */
    int parked;                /* replies still to come from replication */
    uint32_t in_reserved;      /* bytes of the input budget held for the frame being read */
    int budget_wait;           /* paused until budget_ev: the input budget is spent */
    struct event *budget_ev;
    struct tsd_rdma_sess *rdma;  /* an RDMA session's connection (frames through a pair) */
    uint64_t t0_ns;              /* when the request being answered arrived (metrics: latency) */
    int m_counted, m_role, m_tr; /* counted in the connection gauges, as this role/transport */
};

/* The request handlers as the connection layer reaches them (filled by ops.c). A handler gets
 * its request decoded (requests.h); a payload that does not decode never reaches it. */
typedef void (*tsd_handler)(struct tsd_conn *c, const struct ts_frame_hdr *h,
                            const struct tsd_req *q);
struct tsd_ops {
    tsd_handler (*handler_for)(unsigned opcode); /* known opcodes only */
    void (*conn_closing)(struct tsd_conn *c);    /* uploads abandoned, queued hints forgotten */
    int (*stream_continue)(struct tsd_conn *c);  /* a streaming READ: 1 when finished */
    void (*stream_free)(struct tsd_read_stream *rs);
    /* Ends the uploads of c idle since before `before` (monotonic ns). */
    void (*uploads_expire)(struct tsd_conn *c, uint64_t before);
    /* Seals the store's group commit made durable (or failed): answered on w's loop. */
    void (*seals_durable)(struct tsd_worker *w);
    /* At shutdown, once no seal is in the commit thread: frees what was never answered. */
    void (*seals_forget)(struct tsd_worker *w);
};

/* Scrubs, for the metrics: totals of the scrubs completed, and whether one runs now. */
struct tsd_scrub_stats {
    _Atomic uint64_t runs, corrupt, pg_differing;
    _Atomic int running;
    _Atomic uint64_t last_end_ns; /* wall clock */
    _Atomic int64_t next_s;       /* the next scheduled scrub (wall seconds; 0: none) */
};

/* scrub.c: the scheduled scrubs' thread (storage.scrub_interval_s). */
struct tsd_scrub_patrol {
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t cv; /* stop, or a whole-node scrub ended (the schedule moved) */
    int started, stop;
    _Atomic int cancel;
    int64_t last; /* when the last whole-node scrub ended, wall seconds */
};

/* ec_wanted.c: fragment chunks this node found damaged or missing, waiting for the monitor's
 * repair (docs/operations.md "Repair"). */
#define TSD_EC_WANTED_MAX 64
#define TSD_TIER_SLOTS 4
struct tsd_ec_wanted_ent {
    char frag[TS_NAME_MAX + 1]; /* NAME#f */
    uint32_t shard, idx;        /* idx UINT32_MAX: the whole fragment is missing here */
    uint64_t at_ns;             /* wall clock, when first noted */
    uint64_t mono_ns;           /* the same, monotonic (its age) */
};
struct tsd_ec_wanted {
    pthread_mutex_t mu;
    struct tsd_ec_wanted_ent e[TSD_EC_WANTED_MAX];
    unsigned n;
    uint64_t warned_ns;           /* the last warning of a missing fragment (rate limit) */
    _Atomic uint64_t noted, done; /* counters: entries noted, entries repaired */
};

struct tsd_metrics;

struct tsd_server {
    const struct tsd_ops *ops;
    struct tsd_config *cfg;
    ts_store *store;
    struct event_base *base;
    struct evconnlistener *lis[2]; /* plain, TLS */
    struct event *lis_resume[2];   /* re-enables a listener paused by EMFILE */
    uint64_t last_accept_warn_ns;
    /* Maintenance thread: scrubs run here, not on the workers. */
    pthread_t maint_thread;
    struct event_base *maint_base;
    struct event *maint_keepalive;
    _Atomic int stopping;
    char addr[2][64]; /* the bound addresses (port resolved) */
    SSL_CTX *ssl_ctx;
    struct tsd_worker *workers;
    int nworkers;
    unsigned next_worker;
    _Atomic int nconns;
    _Atomic int nhandshakes; /* TLS connections still in their handshake */
    _Atomic int draining;
    struct event *sig_term, *sig_int, *drain_timer, *drain_check;
    uint64_t start_ns;
    int anon_role;
    size_t out_budget;
    size_t in_budget;              /* input_budget_mb, bytes */
    _Atomic size_t in_reserved;    /* of in_budget, held by frames being read */
    _Atomic uint64_t epoch;        /* of the map below; 0: single node */
    struct tsd_etcd_map *etcd_map; /* etcd_map.c: the map from etcd, when configured */
    struct tsd_monitor *monitor;   /* etcd_monitor.c: this node's bid to be the monitor */
    pthread_rwlock_t map_lock;
    struct ts_map *map; /* NULL: single node */
    int self;           /* this node's index in map */
    ts_repl *repl;
    struct tsd_prefetch *prefetch; /* prefetch.c: chunks hinted by readers, read ahead */
    SSL_CTX *peer_ssl;             /* client context towards peers' TLS listeners */
    char peer_why[300];            /* peer_ssl is NULL: why */
    _Atomic uint8_t *pg_clean;     /* per PG: its primary said this node holds its log */
    _Atomic uint64_t *pg_asked;    /* per PG: when we last asked the primary to check us */
    _Atomic uint8_t *pg_backfill;  /* per PG: joined its replicas, waits for a backfill */
    uint32_t npg;
    struct tsd_rdma *rdma; /* the RDMA listener and its sessions (rdma.c); NULL: none */
    struct tsd_rdma_tokens rdma_tokens;
    struct tsd_metrics *metrics; /* http.c: the metrics thread and listener */
    struct tsd_scrub_stats scrub;
    struct tsd_scrub_patrol patrol;
    struct tsd_ec_wanted ec_wanted;
    _Atomic int tier_jobs; /* ops_ec.c: DATASET_TIER store work running on threads of its own */
    sem_t tier_slots;      /* ... of which TSD_TIER_SLOTS at once */
};

/*
 * Layers, bottom up (no file calls a layer above it):
 *   tls.c      TLS contexts and roles from certificates
 *   conn.c     connections: I/O, frame dispatch (through s->ops), reply builders
 *   cluster.c  the map, placement, PG readiness: returns decisions, never replies
 *   ops.c, ops_repl.c   request handlers (reply through conn.c, decide through cluster.c)
 *   server.c   acceptor, workers, signals, start and stop; wires ops.c into s->ops
 */

/* server.c */
int tsd_server_init(struct tsd_server *s, struct tsd_config *cfg);
int tsd_server_run(struct tsd_server *s);
void tsd_server_fini(struct tsd_server *s);

/* conn.c: connections and replies. The frame is built in w (header room reserved by
 * ts_wr_begin_frame). */
void tsd_conn_start(struct tsd_worker *w, struct tsd_pending *p);
/* The RDMA layer's hooks (rdma.h): an admitted session's connection over bev, with the role its
 * token carried; placement room came back; the session ended. */
struct tsd_conn *tsd_conn_start_rdma(struct tsd_worker *w, struct bufferevent *bev,
                                     struct tsd_rdma_sess *r, const char *peer, int role,
                                     const char *who);
void tsd_conn_rdma_room(struct tsd_conn *c);
void tsd_conn_rdma_gone(struct tsd_conn *c);
void tsd_conn_free(struct tsd_conn *c);
void tsd_reply_error(struct tsd_conn *c, const struct ts_frame_hdr *req, int rc, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));
/* TS_ESTALE with the node's map after the message. */
void tsd_reply_stale(struct tsd_conn *c, const struct ts_frame_hdr *req, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tsd_reply_begin(struct ts_wr *w);
void tsd_reply_send(struct tsd_conn *c, const struct ts_frame_hdr *req, struct ts_wr *w);
void tsd_conn_resume(struct tsd_conn *c);
/* The connection's input and output buffers, whatever the transport. */
struct evbuffer *tsd_conn_in(struct tsd_conn *c);
struct evbuffer *tsd_conn_out(struct tsd_conn *c);
/* Stops reading requests (backpressure, streams); tsd_conn_resume() restarts. */
void tsd_conn_pause(struct tsd_conn *c);
/* Plain TCP: sends what is queued now (outside the read callback, e.g. a parked reply). */
void tsd_conn_flush(struct tsd_conn *c);
void tsd_conn_unref(struct tsd_conn *c);
/* After a parked reply: close a half-closed connection once nothing is left to answer. */
void tsd_conn_maybe_finish(struct tsd_conn *c);
/* A node peer that sent an older map epoch than ours is pushed our map (rate-limited). */
void tsd_peer_map_check(struct tsd_conn *c, const struct ts_frame_hdr *h);
/* The workers' counters, summed. */
void tsd_stats_sum(struct tsd_server *s, struct tsd_stats *out);

/* cluster.c: the map, fencing, placement. */
int tsd_cluster_init(struct tsd_server *s);
void tsd_cluster_fini(struct tsd_server *s);
/* Installs m if newer than the current map: it must list this node and keep the cluster's
 * pg_count; it is persisted first (a refused or unpersisted map changes nothing). TS_ESTALE if
 * older; TS_EINVAL (why says) if refused. */
int tsd_map_install(struct tsd_server *s, const struct ts_map *m);
/* etcd_map.c: the thread that installs the map etcd holds (the etcd setting; nothing without) */
int tsd_etcd_map_start(struct tsd_server *s);
/* A client of the node's etcd (its members; TLS with the node's certificate). */
struct ts_etcd;
int tsd_etcd_open(struct tsd_server *s, struct ts_etcd **e);
void tsd_etcd_map_stop(struct tsd_server *s);
struct json_object;
void tsd_etcd_map_status(struct tsd_server *s, struct json_object *root);
/* etcd_monitor.c: the elected monitor (the monitor setting, with etcd) */
int tsd_monitor_start(struct tsd_server *s);
void tsd_monitor_stop(struct tsd_server *s);
void tsd_monitor_status(struct tsd_server *s, struct json_object *root);
/* etcd_monitor_tier.c: 1 when the node registered at key holds every dataset it lists dropped
 * the way this node does (it may be brought up), else 0 and why. */
int tsd_monitor_tier_agrees(struct tsd_server *s, struct ts_etcd *e, const char *key, char *why,
                            size_t cap);
int tsd_map_install_why(struct tsd_server *s, const struct ts_map *m, char *why, size_t cap);

/* Where a client write of (dataset, shard) goes, when this node may take it. */
struct tsd_placement {
    uint32_t pg;
    struct ts_repl_targets to; /* the other core replicas */
    uint64_t epoch;            /* the PG's active interval (its log entries' epoch); 0: single */
    unsigned need;             /* replicas, this one included, that must hold a write */
};
/*
 * Decides whether this node takes a write of (dataset, shard): 0 (and *pl filled) when it is the
 * activated primary of the shard's PG, or a single node; TS_ESTALE when it is not the PG's
 * primary in its map or a newer primary took over (why says which); TS_EBUSY while the PG is
 * peering here. need is the dataset's min_core or the interval's write quorum, the larger.
 */
int tsd_primary_check(struct tsd_server *s, const char *dataset, uint32_t shard,
                      const struct ts_dataset_policy *p, struct tsd_placement *pl, char *why,
                      size_t cap);
/* A replica may serve reads of pg once its primary said it holds the PG's log (REPL_SEAL kind
 * CLEAN; cleared again by a rollback). */
int tsd_pg_mark_clean(struct tsd_server *s, uint32_t pg, int clean);
/* Whether reads of (dataset, shard) may be served here: its PG is clean here or led here by an
 * activated primary; otherwise the primary is asked to check this node. */
int tsd_pg_serves(struct tsd_server *s, const char *dataset, uint32_t shard);
/* A map change made this node a replica of pg's shards it does not hold: it waits for the
 * primary's backfill (reported in PG_INFO, CLEAN refused meanwhile); the backfill is done. */
int tsd_pg_needs_backfill(struct tsd_server *s, uint32_t pg);
void tsd_pg_backfilled(struct tsd_server *s, uint32_t pg);
/* PG of a shard in the current map (0 on a single node). */
uint32_t tsd_pg_of(struct tsd_server *s, const char *dataset, uint32_t shard);

/* ops.c: one handler per opcode; each sends exactly one reply (or starts a stream). */
const struct tsd_ops *tsd_ops_table(void);

/* scrub_pgs.c: a scrub's comparison of this node's PG replicas with their primaries (it stops
 * at the next PG once the node stops or *cancel is set). */
struct tsd_scrub_pgs {
    uint32_t compared;  /* PGs whose inventory was compared with the primary's */
    uint32_t differing; /* of those, PGs that differ (a backfill was asked for) */
    uint32_t unchecked; /* PGs not compared now (primary away or peering, writes in flight) */
    uint64_t missing;   /* complete shards the primaries hold beyond ours */
};
void tsd_scrub_pgs(struct tsd_server *s, struct tsd_scrub_pgs *out, const _Atomic int *cancel);
/* scrub.c. A scrub of name (NULL: every dataset) on the calling thread, reading at most
 * bytes_per_s (0: no limit) and stopping when *cancel is set: each damaged chunk's repair asked
 * for (tsd_repair_chunk), then handed to cb (may be NULL); the PG comparison; the metrics. A
 * whole-node scrub that completes moves the schedule. 0 or TS_E*. */
int tsd_scrub_run(struct tsd_server *s, const char *name, uint64_t bytes_per_s,
                  const _Atomic int *cancel,
                  void (*cb)(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc),
                  void *arg, struct ts_scrub_report *rep, struct tsd_scrub_pgs *pgs);
/* The scheduled scrubs: started with the server (nothing runs with storage.scrub_interval_s
 * 0), stopped before replication (their repairs use it). */
int tsd_scrub_patrol_start(struct tsd_server *s);
void tsd_scrub_patrol_stop(struct tsd_server *s);

/* ec_wanted.c. A chunk of fragment frag (NAME#f) failed its CRC32C here (idx), or a read found
 * the fragment missing while NAME is erasure-coded here (note_missing): noted once, kept until
 * it is repaired (CHUNK_REPAIR of the chunk, a seal of the fragment) or for EC_WANTED_TTL; the
 * oldest of its kind goes when the table is full (missing fragments: at most half of it).
 * copy: the entries now (STATUS), or with out NULL how many. */
void tsd_ec_wanted_init(struct tsd_ec_wanted *w);
void tsd_ec_wanted_fini(struct tsd_ec_wanted *w);
void tsd_ec_wanted_note(struct tsd_server *s, const char *frag, uint32_t shard, uint32_t idx);
void tsd_ec_wanted_note_missing(struct tsd_server *s, const char *frag, uint32_t shard);
void tsd_ec_wanted_done(struct tsd_server *s, const char *frag, uint32_t shard, uint32_t idx);
size_t tsd_ec_wanted_copy(struct tsd_server *s, struct tsd_ec_wanted_ent *out, size_t cap);
/* Of the entries, the damaged chunks (not whole fragments, which readers can claim). */
size_t tsd_ec_wanted_damaged(struct tsd_server *s);

/* cluster.c: whether this node holds EC position f (of n) of base's shard in its map. */
int tsd_ec_position_here(struct tsd_server *s, const char *base, uint32_t shard, unsigned f,
                         unsigned n);

/* cluster.c: PGs this node holds a replica of (not leads) that their primary has not confirmed
 * yet (it serves no reads of them). */
uint64_t tsd_pgs_not_confirmed(struct tsd_server *s);
/* ops_status.c: the daemon's resident memory (bytes; 0 if unknown). */
uint64_t tsd_rss_bytes(void);

/* conn.c: the role requests are judged by (anonymous clients are at most readers in a cluster) */
int tsd_conn_role(struct tsd_server *s, const struct tsd_conn *c);

/* tls.c */
int tsd_tls_init(struct tsd_server *s);
void tsd_tls_fini(struct tsd_server *s);
/* Role from the verified peer certificate's OU (anon_role without one); fills c->subject,
 * c->node_id (role node: the certificate's node id) and c->anonymous. */
int tsd_tls_peer_role(SSL *ssl, struct tsd_conn *c, int anon_role);
/* 0 when the certificate at path is node_id's node certificate; TS_ECONFIG and why if not. */
int tsd_tls_node_cert_check(const char *path, const char *node_id, char *why, size_t cap);

#endif
