/*
 * libtessera internals of the plan reader (include/tessera/reader.h): the reader's shared
 * state, which the caller's side (reader.c) and the connection threads (reader_worker.c)
 * share under one mutex, and the record index cache (reader_index.c). Not installed.
 */
#ifndef TS_READER_INTERNAL_H
#define TS_READER_INTERNAL_H

#include <pthread.h>

#include "client_internal.h"
#include "tessera/reader.h"

enum slot_state {
    SLOT_FREE = 0,
    SLOT_CLAIMED, /* a connection is finding out where the unit lies */
    SLOT_WAITING, /* its size is known; waiting for room in the byte window */
    SLOT_READING,
    SLOT_DONE,
    SLOT_FAILED,
};

/* A unit in the window: plan position k lives in slot k % window_units. */
struct slot {
    enum slot_state state;
    uint64_t k, unit;
    uint32_t shard;
    uint64_t record, offset;
    size_t len;
    uint8_t *buf;
    size_t cap;           /* of buf (library-owned buffers) */
    size_t poff, plen;    /* what the caller gets of buf: all, or the record's payload */
    uint32_t pieces_left; /* pieces not read yet */
    uint32_t attempts;    /* times a piece of it was read again */
    int rc;
    char node[64]; /* who served it (the last piece); before msg: the fields a read touches
                    * share two cache lines */
    char msg[512];
};

/* The record indexes of recently read shards (record units), least recently used dropped. */
struct index_entry {
    uint32_t i;     /* shard position in the dataset's records; UINT32_MAX: empty */
    uint64_t *offs; /* the record start offsets */
    uint32_t n;
    uint64_t used;
};

struct ts_worker;

/* Buffers kept for reuse: as many as the window holds units, 16 to 1024 (and window_bytes). */
#define TS_READER_POOL_MIN 16
#define TS_READER_POOL_MAX 1024

struct pool_buf {
    uint8_t *buf;
    size_t cap;
};

struct tessera_reader {
    struct tessera_reader_opts o;
    char dataset[TS_NAME_MAX + 1];
    struct tessera_opts copts; /* strings point into the caller's, copied below */
    char *copt_strings;
    int payload_fmt; /* record units handed out as payloads of this format (0: framed) */
    struct tessera_dataset_records *recs;
    tessera_plan *plan;
    uint64_t len;

    pthread_mutex_t m;
    pthread_cond_t ready; /* a slot finished */
    pthread_cond_t space; /* the caller took a unit, or the reader stops */
    int stop;
    int caller_waits;    /* the caller sleeps on ready, for plan position consumed */
    uint32_t idle;       /* threads sleeping on space */
    uint32_t npend;      /* threads holding a placed unit the byte window has not admitted */
    struct slot *slots;  /* window_units of them */
    uint64_t next_claim; /* the next plan position a connection takes */
    uint64_t next_admit; /* the next plan position the byte window admits (in order) */
    uint64_t consumed;   /* the next plan position the caller takes */
    uint64_t ahead;      /* bytes of admitted units the caller has not taken */
    uint64_t done_ahead; /* of those, bytes of units done */
    int rx_batch;        /* connections may sleep through replies while the caller has units */
    uint64_t fail_k;     /* the first failed position; UINT64_MAX: none */
    int err;             /* the error the caller got (sticky) */
    char errmsg[600];

    struct index_entry *index;
    uint64_t index_clock;

    struct ts_worker *workers;
    uint32_t nworkers;

    uint8_t *held; /* library-owned: the buffer of the unit the caller holds */
    size_t held_cap;
    /* Library-owned buffers the caller gave back, reused (no page faults for every unit). */
    struct pool_buf *pool;
    uint32_t npool, pool_max;
    uint64_t pool_bytes;
    char held_node[64];
    struct tessera_reader_stats st;
    /* Hints (reader_hint.c): the thread and its connection, the next position to hint, and a
     * ring of the lengths hinted past the caller (hint_cap of them). */
    pthread_t hint_th;
    int hint_started;
    tessera_client *hint_c;
    uint64_t next_hint, hint_tail, hint_ahead;
    uint64_t *hint_len;
    uint32_t hint_cap;
    pthread_cond_t hint_cv; /* position hint_wake_at was claimed, or the reader stops */
    int hint_waits;
    int hint_full; /* a node dropped hints: wait for the caller to take more first */
    uint64_t hint_wake_at;
};

/* The plan position of this reader's j-th unit (its split: blocks split_i, split_i + split_n,
 * ... of split_block positions). */
static inline uint64_t ts_reader_plan_pos(const struct tessera_reader *r, uint64_t j)
{
    uint64_t b = r->o.split_block, n = r->o.split_n;

    return ((j / b) * n + r->o.split_i) * b + j % b;
}

/* A reader's slot for its j-th unit (slots, claims and the caller count this reader's units;
 * the plan position is ts_reader_plan_pos). */
static inline struct slot *ts_reader_slot(struct tessera_reader *r, uint64_t k)
{
    return &r->slots[k % r->o.window_units];
}

/* Slot s finished (lock held): wakes the caller if it waits for exactly this one. */
static inline void ts_reader_wake_caller(struct tessera_reader *r, const struct slot *s)
{
    if (r->caller_waits && s->k == r->consumed)
        pthread_cond_signal(&r->ready);
}

/* Room in the window or the next admission (lock held): wakes the threads that sleep. */
static inline void ts_reader_wake_threads(struct tessera_reader *r)
{
    if (r->idle)
        pthread_cond_broadcast(&r->space);
}

/* Half the window (units and bytes) is free, and positions are left to claim (lock held): a
 * thread with half its reads back claims a burst. */
static inline int ts_reader_half_free(const struct tessera_reader *r)
{
    return r->next_claim - r->consumed <= r->o.window_units / 2 &&
           r->ahead <= r->o.window_bytes / 2 && r->next_claim < r->len && r->next_claim < r->fail_k;
}

/*
 * Unit k may be read now (lock held): units are admitted in plan order, each once the bytes
 * ahead of the caller leave room for it, or alone when it does not fit the window at all.
 * Whatever holds the window's bytes is before k, so the caller frees it by reading on.
 */
static inline int ts_reader_admits(const struct tessera_reader *r, uint64_t k, size_t len)
{
    return k == r->next_admit && (r->ahead + len <= r->o.window_bytes || r->ahead == 0);
}

/*
 * The caller took units (lock held): the sleeping threads are woken only when that made room
 * one of them acts on, a burst to claim or the unit next in line to admit. Waking them for
 * every unit taken costs two context switches per sleeping thread for nothing while the
 * window refills by halves.
 */
static inline void ts_reader_wake_taken(struct tessera_reader *r)
{
    const struct slot *s = ts_reader_slot(r, r->next_admit);

    if (r->idle &&
        (ts_reader_half_free(r) || (r->npend && s->k == r->next_admit && s->state == SLOT_WAITING &&
                                    ts_reader_admits(r, s->k, s->len))))
        pthread_cond_broadcast(&r->space);
}

/* Buffers (reader.c, lock held): one of at least len bytes (its capacity in *cap), NULL when
 * out of memory; a buffer the caller is done with, kept for reuse or freed. */
uint8_t *ts_reader_buf_get(struct tessera_reader *r, size_t len, size_t *cap);
void ts_reader_buf_put(struct tessera_reader *r, uint8_t *buf, size_t cap);

/* Threads (reader_worker.c): first (taken) and connections - 1 more opened, a thread on
 * each. On failure the caller still stops them (ts_reader_workers_stop). */
int ts_reader_workers_start(struct tessera_reader *r, tessera_client *first, char *err,
                            size_t errlen);
/* Stops and joins them (r->stop must be set and broadcast), closes the connections. */
void ts_reader_workers_stop(struct tessera_reader *r);
/* Adds one served unit to the per-node stats (lock held). */
void ts_reader_count_node(struct tessera_reader *r, const char *node, size_t len);

/* Where the reader's unit k lies (reader_index.c): its dataset unit, shard, record (record
 * units), byte offset and length; a record's through its shard's index, fetched over c on a
 * miss. 0 or TS_E* with a message in msg[cap]. Takes r->m itself (call it unlocked). */
struct ts_unit_loc {
    uint64_t unit;
    uint32_t shard;
    uint64_t record, offset;
    size_t len;
};
int ts_reader_locate(struct tessera_reader *r, tessera_client *c, uint64_t k,
                     struct ts_unit_loc *out, char *msg, size_t cap);
/* Every connection of every plan reader routes with this salt: all pick the same replica for a
 * region of a shard, so the node that is hinted is the node that is read, and readers of one
 * dataset (ranks, jobs) share that node's cache. */
#define TS_READER_SALT 0x5eed0fcac4e5ull
/* Hints (reader_hint.c): the thread that tells the nodes what comes next, on a connection of
 * its own (routed like the readers'); started if hint_bytes asks for it, stopped with the
 * workers (r->stop set and broadcast first). */
int ts_reader_hints_start(struct tessera_reader *r, char *err, size_t errlen);
void ts_reader_hints_stop(struct tessera_reader *r);

/* Record indexes (reader_index.c). The byte range [*off, *off + *len) of record `index` of the
 * dataset's shard at position i, fetching the shard's index over c on a miss. 0 or TS_E* with
 * a message in msg[cap]. Takes r->m itself (call it unlocked). */
int ts_reader_record_range(struct tessera_reader *r, tessera_client *c, uint32_t i, uint64_t index,
                           uint64_t *off, size_t *len, char *msg, size_t cap);
void ts_reader_index_free(struct tessera_reader *r);

#endif
