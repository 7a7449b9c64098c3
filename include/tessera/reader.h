/*
 * Readers: one rank's plan (tessera/plan.h) over a dataset, read ahead and returned in plan
 * order; docs/client.md "Readers".
 *
 * A reader opens its own connections (handles of libtessera, each driven by a thread of the
 * reader), builds the plan from the dataset (its complete shards, or their records), and keeps
 * a bounded window of units in flight: at most window_units units and window_bytes bytes read
 * ahead of the caller (a single unit larger than window_bytes is read alone, when it is next).
 * Each unit lands once, in its own buffer, and is handed to the caller without a copy.
 *
 * Failover: on a cluster every read goes to one replica and, when that replica fails (an error,
 * a timeout, a checksum mismatch, a lost connection), to the next. A unit that still failed is
 * read again from the start, up to `retries` times, over a fresh connection when its
 * connection broke. A unit no replica could serve is an error naming the dataset, the shard
 * and the record; the reader stops there.
 *
 * Resume: tessera_reader_consumed() is how many units this rank took; the ranks' counts make
 * the job's position with tessera_plan_state() on tessera_reader_plan(), and a reader opened
 * with that state (at any world size) reads exactly what is left.
 *
 * A reader is used by one thread at a time (its own threads are internal).
 */
#ifndef TESSERA_READER_H
#define TESSERA_READER_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/plan.h"
#include "tessera/tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tessera_unit_kind {
    TESSERA_UNIT_SHARD = 0,  /* a unit is a whole complete shard */
    TESSERA_UNIT_RECORD = 1, /* a unit is one record of the shards' record indexes */
};

struct tessera_reader_opts {
    const char *dataset;
    int unit; /* enum tessera_unit_kind */
    /* seed, epoch, rank, world, assign, remainder, shuffle, window. The reader fills in units
     * and group_sizes (records: each shard is a group) from the dataset. With a GIVEN order,
     * plan.units must be its length, the dataset's units (else TS_EINVAL). */
    struct tessera_plan_opts plan;
    const void *resume; /* a tessera_plan_state to continue from; NULL: the epoch's start */
    size_t resume_len;
    uint32_t window_units; /* units read ahead of the caller at most; default 64 */
    uint64_t window_bytes; /* bytes read ahead at most; default 256 MiB */
    uint32_t connections;  /* connections (and threads) reading at once; default 2 */
    uint32_t depth;        /* reads in flight per connection; default 32 */
    uint32_t retries;      /* times a failed unit is read again; default 3 */
    uint32_t index_shards; /* record units: record indexes kept in memory (shards); default 64 */
    /*
     * Split among the workers of one rank (e.g. a DataLoader's): this reader reads only the
     * blocks split_i, split_i + split_n, ... of split_block consecutive positions of the
     * rank's plan (worker split_i of split_n; with split_block the batch size, batch j of the
     * rank is worker j mod split_n's). Default 1, 1, 0: the whole plan.
     */
    uint32_t split_block, split_n, split_i;
    /*
     * Caller-owned buffers: when alloc is set, each unit is read into alloc(arg, len) (len may
     * be 0) and belongs to the caller once tessera_reader_next returned it; free_fn(arg, p)
     * releases buffers the caller never received (close, a failed unit). Both are called from
     * the reader's threads, several at once, and must not wait for the caller (a thread in
     * alloc collects no replies meanwhile; NULL fails the unit with TS_ENOMEM instead). NULL:
     * the reader owns
     * the buffers, and a returned unit's data stays valid until the next tessera_reader_next
     * or tessera_reader_close.
     */
    void *(*alloc)(void *arg, size_t len);
    void (*free_fn)(void *arg, void *p);
    void *alloc_arg;
    /* What a record unit's data is (enum tessera_record_form of tessera/records.h): AUTO (0,
     * the default) its payload when the dataset says its record format, FRAMED its stored
     * bytes, PAYLOAD its payload. Shard units are always whole. */
    int record;
    /*
     * Hints (HINT, docs/client.md "Hints"): a thread with a connection of its own tells the
     * nodes the ranges of the next hint_bytes of the plan past what the reader's connections
     * took (are reading), so they read those chunks from disk into their caches ahead of the
     * reads. Default 64 MiB (a node queues 64 MiB per connection by default);
     * TESSERA_READER_NO_HINTS: none.
     */
    uint64_t hint_bytes;
};
#define TESSERA_READER_NO_HINTS UINT64_MAX

/* One unit as returned. */
struct tessera_unit {
    uint64_t k;      /* its position in this rank's plan (0, 1, ... without a split) */
    uint64_t unit;   /* its number in the dataset's units */
    uint32_t shard;  /* the shard it is (or is in) */
    uint64_t record; /* record units: its record number within the shard; else 0 */
    uint64_t offset; /* its first byte within the shard */
    void *data;
    size_t len;
    const char *node; /* the node that served it (valid while the reader is open) */
    void *buffer;     /* the buffer data lies in (data is past its start when it is a record's
                         payload): what tessera_reader_give_back and free_fn take */
};

#define TESSERA_READER_MAX_NODES 64

struct tessera_reader_node {
    char node[64];
    uint64_t units, bytes;
};

struct tessera_reader_stats {
    uint64_t units, bytes;    /* returned to the caller */
    uint64_t stall_ns;        /* time the caller spent in tessera_reader_next waiting for data */
    uint64_t stalls;          /* calls that had to wait */
    uint64_t retries;         /* reads tried again: on another replica, or the unit once more */
    uint64_t reconnects;      /* connections opened again after one broke */
    uint64_t index_loads;     /* record indexes fetched (record units) */
    uint64_t ahead_bytes_max; /* the most bytes held ahead of the caller at once */
    uint64_t ahead_bytes;     /* bytes held ahead now: read or being read, not yet returned */
    size_t nnodes;            /* which node served what (the first TESSERA_READER_MAX_NODES) */
    struct tessera_reader_node nodes[TESSERA_READER_MAX_NODES];
    uint64_t hinted_units; /* units whose ranges were hinted to the nodes */
    uint64_t hint_queued;  /* chunks the nodes queued to read ahead */
    uint64_t hint_dropped; /* chunks the nodes dropped (over their bounds) */
};

typedef struct tessera_reader tessera_reader;

void tessera_reader_opts_init(struct tessera_reader_opts *o);
/*
 * Opens copts->address (with its TLS options) o->connections times, reads the dataset's shard
 * list and builds the plan. TS_ENOENT for an unknown dataset, TS_EINVAL for options that make
 * no plan (or a state that does not fit them); err[errlen] (may be NULL) says why.
 */
int tessera_reader_open(tessera_reader **out, const struct tessera_opts *copts,
                        const struct tessera_reader_opts *o, char *err, size_t errlen);
/* The next unit in plan order, waiting for it: 1 with *u, 0 at the end of the plan, or TS_E*
 * (the reader's message in tessera_reader_error; later calls return the same). */
int tessera_reader_next(tessera_reader *r, struct tessera_unit *u);
/*
 * The next units in plan order, copied back to back into buf[cap]: waits for the first, then
 * takes the ones already read behind it, up to max, while they fit. 1 with *n units and their
 * lengths in lens[0..*n); 1 with *n == 0 when the next unit alone does not fit (its length in
 * lens[0]: take it with tessera_reader_next, or call again with more room); 0 at the end of the
 * plan; TS_E* as tessera_reader_next. One call and one copy per batch instead of one call per
 * unit: for small records handed to an interpreter. Library-owned buffers only (TS_EINVAL with
 * alloc set). The unit tessera_reader_next returned last is released.
 */
int tessera_reader_next_many(tessera_reader *r, void *buf, size_t cap, size_t *lens, uint32_t max,
                             uint32_t *n);
/*
 * Keeps the unit tessera_reader_next returned last (library-owned buffers): its data stays
 * valid after the next call and after close, until tessera_buffer_free(data). For callers
 * that hold units longer than one step (a Python array over the bytes, a batch being built).
 * 0, or TS_ENOENT when no unit is held.
 */
int tessera_reader_keep(tessera_reader *r);
/* (A kept buffer is released with tessera_buffer_free, tessera/tessera.h.) */
/*
 * Gives a kept buffer back to the reader it came from, which is still open, instead of
 * tessera_buffer_free: the reader reads a later unit into it (no fresh memory for every
 * unit: no page faults, and the bytes may still be in the cache). data is what
 * tessera_reader_next returned before tessera_reader_keep.
 */
void tessera_reader_give_back(tessera_reader *r, void *data);
/* Units this reader reads (the rank's plan, or this worker's part of it), and units returned
 * so far. */
uint64_t tessera_reader_len(const tessera_reader *r);
uint64_t tessera_reader_consumed(const tessera_reader *r);
/* The plan being read (for tessera_plan_state). */
const tessera_plan *tessera_reader_plan(const tessera_reader *r);
void tessera_reader_stats(tessera_reader *r, struct tessera_reader_stats *st);
const char *tessera_reader_error(const tessera_reader *r);
/* Stops the threads, closes the connections, frees what the caller does not own. NULL ok. */
void tessera_reader_close(tessera_reader *r);

#ifdef __cplusplus
}
#endif
#endif
