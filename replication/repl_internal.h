/*
 * Replication internals shared by repl.c (thread, peers, forwarding, waiters, maps, repair),
 * push.c (log pushers, pulls, backfill) and pgpeer.c (peering of the PGs this node leads).
 * Everything here runs on the replication thread unless it says otherwise.
 */
#ifndef TS_REPL_INTERNAL_H
#define TS_REPL_INTERNAL_H

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <pthread.h>

#include "peering.h"
#include "ts_common.h"
#include "ts_proto.h"
#include "ts_repl.h"

#define FAC "repl"
#define RETRY_NS (500ull * 1000000)

struct peer;
typedef void (*pend_cb)(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body);

struct pend {
    uint64_t id;
    pend_cb cb;
    void *ctx;
    struct pend *next;
};

struct peer {
    ts_repl *r;
    char id[64], addr[128];
    int use_tls;
    struct bufferevent *bev;
    int connected;
    uint64_t next_id;
    struct pend *pend;
    unsigned npend;
    uint64_t last_progress_ns;
    uint64_t down_until_ns;
    int down; /* under r->lock */
    uint64_t map_pushed_epoch, map_pushed_ns;
    struct peer *next;
};

struct push {
    uint32_t pg;
    char node[64];
    int known;
    uint64_t applied;
    int busy;
    uint64_t retry_at;
    /* streaming one shard's chunks before its seal */
    ts_read_ctx *rctx;
    uint32_t next_chunk, inflight;
    int stream_failed;
    char stream_why[160];  /* the replica's message for stream_failed */
    struct ts_log_rec rec; /* what is being pushed */
    int kind;              /* TS_REPL_SEAL or TS_REPL_BACKFILL */
    /* backfill: the PG's shards, then SET_APPLIED */
    int backfill;
    struct ts_log_rec *items;
    size_t nitems, at;
    uint64_t bf_target, bf_epoch;
    int bf_pruned;     /* the replica dropped datasets we no longer have */
    uint64_t bf_life;  /* the life the backfill was started in: it ends with it */
    int want_backfill; /* its scrub found shards missing: backfill it once caught up */
    /* a pull: this node is not the primary; a peering primary asked for its log */
    int pull, pull_done;
    int told_clean;      /* the replica was told it holds our log (it may serve reads) */
    uint64_t pull_epoch; /* frames carry this epoch (the puller's) */
    uint64_t pull_life;  /* this pull's life (a new puller epoch, or a pull after one ended) */
    /* The life (peering life of the PG, or the pull's) and interval the replica's position was
     * learned in: replies from another life decide nothing (ts_peering_rollback). */
    uint64_t asked_life, asked_interval;
    int refused; /* the last comparison's rollback was refused (logged once) */
    struct push *next;
};

/* Peering of one PG this node is the primary of in its map (pgpeer.c). */
enum pgpeer_state {
    PGP_QUERY = 0,    /* asking every node for its PG facts */
    PGP_PULL = 1,     /* catching up from the node holding the newest head */
    PGP_ACTIVATE = 2, /* asking the acting set (and the last interval's) to record the interval */
    PGP_ACTIVE = 3,   /* writes accepted */
    PGP_BLOCKED = 4,  /* a newer epoch was promised: waiting for a newer map */
};

struct pgpeer {
    uint32_t pg;
    uint64_t epoch; /* the interval being started (the map epoch when it began) */
    int state;
    uint64_t life;                         /* set by each ACTIVATE verdict: its pushes' life */
    uint64_t life_epoch, life_he, life_hs; /* the epoch and our head that life began with */
    unsigned round;                        /* replies of older rounds are ignored */
    char acting[TS_PG_MAX_ACTING][64];     /* the new acting set: core members, primary first */
    unsigned nacting;
    uint8_t wq;
    struct ts_peer_reply *replies;
    size_t nreplies, capreplies;
    unsigned outstanding;
    int sending;                   /* start_round is sending the queries: decide after */
    uint64_t pull_seq, pull_epoch; /* PULL: the head to reach */
    uint64_t pull_since_ns;
    char pull_from[64];
    /* ACTIVATE: the sets peering needed (each must record the interval on q of it), how many
     * members of the new acting set hold the whole log, the head it started from */
    struct ts_peering_set sets[TS_PEERING_MAX_SETS];
    unsigned nsets, caught_up;
    uint64_t act_head_epoch, act_head_seq, activate_since_ns;
    uint64_t retry_at, since_ns;
    char why[320]; /* the last verdict or refusal, for STATUS */
    struct pgpeer *next;
};

/* What the workers may read of a pgpeer (under r->lock); epoch 0: not led here. */
struct repl_pg_pub {
    int state;
    uint64_t epoch, since_ns;
    uint8_t wq;
    char pull_from[64]; /* PULL: the node whose log we take */
    char why[320];
};

struct waiter {
    uint32_t pg;
    uint64_t seq;
    struct ts_repl_targets to;
    struct event_base *base;
    ts_repl_done done;
    void *arg;
    uint64_t deadline;
    struct waiter *next;
};

struct fwd {
    struct ts_repl_chunk *c;
    unsigned outstanding, acked;
    int rc;
    char msg[256];
    int refs; /* this struct + data references queued in evbuffers */
    struct event_base *base;
    ts_repl_done done;
    void *arg;
};

struct repair {
    char dataset[TS_NAME_MAX + 1];
    uint32_t shard, idx, pg;
    int next_rank;     /* which replica to ask next */
    struct ts_repl *r; /* for repair_cb */
};

struct ts_repl {
    struct ts_repl_opts o;
    char node_id[64];
    pthread_t thread;
    struct event_base *base;
    struct event *tick;
    struct ts_map *map;
    int self;
    struct peer *peers;
    struct push *pushes;
    struct waiter *waiters;
    pthread_mutex_t lock; /* peers' down flags and the lag snapshot */
    struct ts_repl_lag *lag;
    size_t nlag;
    unsigned primary_pgs;
    uint64_t repairs, backfills;
    uint64_t lives;             /* the last life given to a peering verdict or a pull */
    uint64_t rollbacks_refused; /* comparisons whose rollback ts_peering_rollback refused */
    uint64_t last_lag_ns, last_trim_ns;
    struct pgpeer *pgs;      /* PGs this node is (or is becoming) primary of */
    struct repl_pg_pub *pub; /* their states for the workers, per PG; under lock */
    uint32_t npub;
};

/* repl.c */
/* Sends the frame in w (header room reserved; taken over) to peer id with an optional data
 * tail sent by reference; cb runs with the reply or an error status. epoch 0: the map's. */
void repl_peer_send(ts_repl *r, const char *id, uint8_t op, struct ts_wr *w, const void *tail,
                    size_t tail_len, evbuffer_ref_cleanup_cb tail_cleanup, void *tail_arg,
                    pend_cb cb, void *ctx, uint64_t epoch);
/* A TS_ESTALE reply: push our map to a peer that is behind (never adopts the peer's). */
void repl_on_stale(ts_repl *r, struct peer *p, struct ts_rd *body);
void repl_waiters_check(ts_repl *r);
int repl_node_rank(ts_repl *r, uint32_t pg, const char *id);
/* id is a node other than this one with a rank in pg (a rebalance's incoming node may rank 0). */
int repl_is_other_replica(ts_repl *r, uint32_t pg, const char *id);
/* The fields of a REPL_WRITE frame, up to its data. */
/* The dataset fields of REPL_WRITE and REPL_SEAL (docs/protocol.md): policy, code, incarnation. */
void repl_wr_ds_fields(struct ts_wr *w, const struct ts_dataset_policy *p, uint64_t inc);
void repl_wr_write(struct ts_wr *w, const char *dataset, const struct ts_dataset_policy *p,
                   uint64_t inc, uint32_t shard, uint32_t idx, uint64_t size, uint32_t crc,
                   uint32_t len);

/* push.c */
struct push *repl_push_find(ts_repl *r, uint32_t pg, const char *node);
void repl_push_free(struct push *ps);
void repl_push_step(ts_repl *r, struct push *ps);
/* One push per (PG this node leads, other replica); pulls are kept until done. */
void repl_pushes_rebuild(ts_repl *r);
/* Starts (or keeps) pushing pg's log to node under the puller's epoch. recheck: a replica
 * asks its primary to compare again (only a push this node has as primary answers it). */
void repl_pull_start(ts_repl *r, uint32_t pg, const char *node, uint64_t epoch, int recheck);

/* pgpeer.c */
struct pgpeer *repl_pgpeer_find(ts_repl *r, uint32_t pg);
/* After a map change: start peering the PGs this node now leads, forget the others. */
void repl_pgpeer_map_changed(ts_repl *r);
/* Timer work: retries, pull progress. */
void repl_pgpeer_tick(ts_repl *r);
void repl_pgpeer_free_all(ts_repl *r);
/* Whether a request's reply context is a peering context of pgpeer.c (heap memory the reply
 * callback frees): ts_repl_stop frees those of requests that never got a reply. */
int repl_pgpeer_owns_ctx(pend_cb cb);
/* Writes may go on in pg: active in this epoch. */
int repl_pg_active(ts_repl *r, uint32_t pg);
/* Its pushers may run: active, or activating (its log is the authoritative one already). */
int repl_pg_pushes(ts_repl *r, uint32_t pg);
/* The life of pg's peering verdict while activating or active here (else 0), and its interval. */
uint64_t repl_pg_life(ts_repl *r, uint32_t pg, uint64_t *interval);

#endif
