/*
 * The chunk store: datasets, shards and chunks in RocksDB, every chunk guarded by CRC32C.
 *
 * Thread-safety: a ts_store may be used from any number of threads at once. A shard writer
 * and a read context belong to one thread at a time.
 * Ownership: strings passed in are copied when kept; structures filled for the caller are the
 * caller's; chunk references pin engine memory until ts_chunk_ref_release().
 */
#ifndef TS_STORE_H
#define TS_STORE_H

#include <stdint.h>
#include <stddef.h>

#include "ts_common.h"
#include "tessera/types.h"

typedef struct ts_store ts_store;
typedef struct ts_shard_writer ts_shard_writer;
typedef struct ts_read_ctx ts_read_ctx;

enum ts_sync_policy {
    TS_SYNC_ALWAYS = 0, /* fsync the WAL before acknowledging each write (survives power loss) */
    TS_SYNC_NONE = 1,   /* write the WAL, do not fsync it (survives kill -9, not power loss) */
    TS_SYNC_SEAL = 2,   /* as ALWAYS, except a chunk of an unsealed shard: its bytes and record
                           become durable with the shard's seal (the file is fdatasync'ed and
                           the seal's WAL write synced, which covers the records before it) */
};

struct ts_store_opts {
    const char *path;            /* directory of the RocksDB database (created if missing) */
    int sync;                    /* enum ts_sync_policy; default TS_SYNC_SEAL */
    int chunk_files;             /* 1 (default): a shard's chunks in a file of its own, RocksDB
                                    keeping the records only (storage/chunkfile.c); 0: chunk
                                    values in RocksDB (blob files or SSTs, below) */
    uint32_t inline_max;         /* with chunk_files: a shard declared at most this large keeps
                                    its chunks in RocksDB, no file of its own (0, the default:
                                    every shard gets a file) */
    int blob_files;              /* 1 (default): chunk values in BlobDB blob files; 0: in SSTs
                                    (with chunk_files, inline shards' chunks are in SSTs) */
    uint32_t min_blob_size;      /* values at least this large go to blob files (default 4096) */
    uint64_t blob_file_size;     /* target blob file size (default 256 MiB) */
    uint64_t block_cache_bytes;  /* shared block cache for SSTs (default 256 MiB) */
    int verify_engine_checksums; /* 1: RocksDB also verifies its own checksums on chunk reads;
                                    0 (default): our CRC32C guards chunks end to end. Metadata
                                    reads always verify. */
    uint32_t max_chunk_size;     /* largest accepted chunk size (default 64 MiB) */
    uint64_t cache_bytes; /* verified-chunk and shard-record cache (default 256 MiB; 0 disables):
                             hot reads skip the engine and the CRC pass */
    int cache_arena; /* 1 (default): cached chunk bytes live in a memfd that can be sendfile()d */
    int max_open_files;          /* RocksDB's file descriptor budget (default 4096) */
    uint64_t reserve_bytes;      /* free space kept on the filesystem: writes beyond get TS_ENOSPC
                                    (UINT64_MAX, the default: 2 % of the filesystem, 8 MiB..1 GiB) */
    uint64_t write_buffer_bytes; /* chunk memtable size (0, the default: 128 MiB, at most 1/8
                                    of the filesystem); tests make it small to force flushes */
};

/*
 * A chunk, pinned in engine memory, a cache entry or a buffer (no copy) until
 * ts_chunk_ref_release(). Either the whole chunk, verified (a cached copy is checked again by
 * sub-block where partly sent), or a piece of it read by sub-blocks from its chunk file
 * (ts_read_ctx_piece): bytes [base, base+len) of the chunk with their sub-blocks' stored CRCs,
 * verified by ts_chunk_ref_check_crc as they are sent.
 */
struct ts_chunk_ref {
    const uint8_t *data;
    size_t len;
    uint32_t crc; /* the whole chunk's (not for a piece) */
    void *pin;    /* reference on the bytes; opaque */
    int fd;       /* >= 0: the same bytes are file_off..+len of fd (for sendfile) */
    uint64_t file_off;
    const uint32_t *sub; /* CRC32C per TS_SUB_BLOCK from base (NULL: verified whole now) */
    size_t base;         /* a piece: the chunk offset of data[0], a multiple of TS_SUB_BLOCK */
    int piece;           /* only [base, base+len) of the chunk, checked only as sent */
};

/* 4 KiB: a 4 KiB-aligned partial read of a cached chunk checks no byte it does not send. */
#define TS_SUB_BLOCK (4u << 10)
/* The bytes at chunk offset off of a reference. */
static inline const uint8_t *ts_chunk_ref_at(const struct ts_chunk_ref *ref, size_t off)
{
    return ref->data + (off - ref->base);
}
/* Whether [off, off+len) is the whole chunk with its stored CRC in ref->crc (else a partial
 * range, which ts_chunk_ref_check_crc must check before it is sent). */
static inline int ts_chunk_ref_whole(const struct ts_chunk_ref *ref, size_t off, size_t len)
{
    return !ref->piece && off == 0 && len == ref->len;
}
/* Checks the bytes [off, off+len) (chunk offsets) of a reference against their sub-blocks'
 * CRCs; 0 or TS_ECORRUPT (a cached copy whose memory went bad, or a piece whose bytes on disk
 * did: evict and read the whole chunk again). */
int ts_chunk_ref_check(const struct ts_chunk_ref *ref, size_t off, size_t len);
/* The same check, and *crc the CRC32C of exactly those bytes (a partial read's reply), in one
 * pass over the touched sub-blocks: each is verified from the CRCs of its parts inside and
 * outside the range, and the inside parts' CRCs combine into *crc (checksums computed once). */
int ts_chunk_ref_check_crc(const struct ts_chunk_ref *ref, size_t off, size_t len, uint32_t *crc);

void ts_store_opts_init(struct ts_store_opts *o);
/* "always", "none" or "seal"; ts_store_sync_parse: the policy, or -1 for another name. */
const char *ts_store_sync_name(int sync);
int ts_store_sync_parse(const char *name);
int ts_store_open(ts_store **out, const struct ts_store_opts *o);
/* When this store last opened on a write-ahead log damaged before its end (wall-clock ns; 0:
 * never): writes logged after the damage were lost here (storage/engine_open.c). */
uint64_t ts_store_wal_damage_ns(ts_store *s);
/* Flushes the memtables (best effort), then closes. NULL is a no-op; open writers must be
 * finished first. */
void ts_store_close(ts_store *s);
/* Closes without flushing the memtables first: the files as a crash leaves them (the data of
 * the last writes in the WAL only). For tests of WAL recovery. */
void ts_store_close_unflushed(ts_store *s);

/* Datasets. */
void ts_dataset_policy_init(struct ts_dataset_policy *p);
int ts_store_dataset_create(ts_store *s, const char *name, const struct ts_dataset_policy *p);
int ts_store_dataset_stat(ts_store *s, const char *name, struct ts_dataset_info *out);
/* The dataset's record alone (policy, state, id; shards and bytes 0): O(1), where
 * ts_store_dataset_stat counts the shards by a scan of their records. */
int ts_store_dataset_record(ts_store *s, const char *name, struct ts_dataset_info *out);
/* Calls cb for each dataset in name order; a non-zero return from cb stops and is returned. */
int ts_store_dataset_list(ts_store *s, int (*cb)(void *arg, const struct ts_dataset_info *info),
                          void *arg);
/* The same without counting each dataset's shards (shards and bytes 0): the records alone,
 * O(datasets) where the count scans every shard record. */
int ts_store_dataset_list_records(ts_store *s,
                                  int (*cb)(void *arg, const struct ts_dataset_info *info),
                                  void *arg);
/* Seals an open dataset: every shard 0..N-1 must be complete (TS_EINCOMPLETE otherwise). */
int ts_store_dataset_seal(ts_store *s, const char *name);
/*
 * A sealed dataset's tier on this node (issue 33; tier.c): its erasure code (k = m = 0:
 * replicated only) and whether its replicas' bytes are dropped (the shard records stay; reads
 * answer TS_EFRAGMENTED). TS_EINVAL for an open dataset, one of k, m 0 without the other, or
 * dropped without a code. Dropping: the mark is made durable, then the chunk bytes go (again
 * on a second call: an interrupted drop completes). Keeping them again: every chunk of every
 * shard must read back matching its CRC32C (restored with ts_store_chunk_repair), else
 * TS_EINCOMPLETE with *missing (if given) the chunks not back, and nothing changes.
 * Another code (or replicated only) while the bytes are dropped: TS_EBUSY. Durable per the sync
 * policy.
 */
int ts_store_dataset_set_tier(ts_store *s, const char *name, unsigned k, unsigned m, int dropped,
                              uint64_t *missing);
/* A replica catching up from a primary whose dataset is erasure-coded with its replica bytes
 * dropped (a REPL_WRITE saying so): sealed here too, with the code, and marked dropped (reads
 * refused); bytes it holds stay until DATASET_TIER drops them here. TS_EBUSY when it is
 * dropped here under another code. Its shards then arrive as records without bytes. */
int ts_store_dataset_follow_dropped(ts_store *s, const char *name, unsigned k, unsigned m);
/* Deletes a dataset and all its data; TS_EBUSY while an upload to it is in progress. */
int ts_store_dataset_delete(ts_store *s, const char *name);
/* With force, uploads still open on the dataset do not block the delete: they end (their next
 * put or seal fails with TS_ESTALE). For deletes decided elsewhere (a primary's log entry). */
int ts_store_dataset_delete_ex(ts_store *s, const char *name, int force);
/* The same, only while the incarnation here is upto or older (read and deleted under one lock):
 * TS_ESTALE, and nothing deleted, when a newer one replaced it since the caller looked (a
 * replication thread may re-create the name meanwhile). */
int ts_store_dataset_delete_upto(ts_store *s, const char *name, uint64_t upto, int force);

/*
 * Shards are written as a stream of chunks in order, then sealed. Beginning a shard that has
 * an abandoned (never sealed) upload discards it and starts over; a complete shard gives
 * TS_EEXIST; a sealed dataset TS_ESEALED; a shard already being uploaded TS_EBUSY.
 */
int ts_store_shard_begin(ts_store *s, const char *dataset, uint32_t shard, uint64_t expect_size,
                         ts_shard_writer **out);
/* With takeover, an upload of the shard already in progress gives way instead (its next put
 * or seal fails with TS_ESTALE): for a PG primary's stream superseding one an older primary
 * left open on this replica; such a stream may also fill a shard of a sealed dataset (a
 * backfill of a shard the replica lost or dropped). */
int ts_store_shard_begin_ex(ts_store *s, const char *dataset, uint32_t shard, uint64_t expect_size,
                            int takeover, ts_shard_writer **out);
/*
 * Appends chunk idx (must be the next one). crc is the CRC32C the sender computed: a mismatch
 * with the bytes gives TS_ECORRUPT and stores nothing. Every chunk but the last is chunk_size
 * long. On return 0 the chunk is durable per the sync policy.
 */
int ts_shard_writer_put(ts_shard_writer *w, uint32_t idx, const void *data, size_t len,
                        uint32_t crc);
/* Bytes and chunks accepted so far. */
uint64_t ts_shard_writer_bytes(const ts_shard_writer *w);
uint32_t ts_shard_writer_next(const ts_shard_writer *w);
/*
 * Seals the shard: TS_EINCOMPLETE if fewer bytes than declared arrived, TS_ECORRUPT if
 * expect_crc (when have_crc) differs from the CRC of all bytes. records/nrecords is an
 * optional record index (ascending offsets within the shard). On success the writer is freed;
 * on failure it stays valid and the caller may put more chunks, seal again or abort.
 */
int ts_shard_writer_seal(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                         const uint64_t *records, uint32_t nrecords);
/* Stops an upload, leaving the shard incomplete (invisible to readers). NULL is a no-op. */
void ts_shard_writer_abort(ts_shard_writer *w);

int ts_store_shard_stat(ts_store *s, const char *dataset, uint32_t shard,
                        struct ts_shard_info *out);
/* Calls cb for each shard of a dataset in shard order. */
int ts_store_shard_list(ts_store *s, const char *dataset,
                        int (*cb)(void *arg, const struct ts_shard_info *info), void *arg);
/* Copies the record index out: *offsets is malloc'ed, the caller frees it. */
int ts_store_shard_records(ts_store *s, const char *dataset, uint32_t shard, uint64_t **offsets,
                           uint32_t *n);

/*
 * Reads [off, off+len) of a complete shard into buf, verifying every touched chunk.
 * A range that runs past the end is cut at the end (*out_len tells); off beyond the end is
 * TS_ERANGE. A chunk whose bytes do not match its CRC gives TS_ECORRUPT, never the bytes.
 */
int ts_store_read(ts_store *s, const char *dataset, uint32_t shard, uint64_t off, size_t len,
                  void *buf, size_t *out_len);

/* Zero-copy reads: open a shard once, then fetch verified, pinned chunks. */
int ts_store_read_open(ts_store *s, const char *dataset, uint32_t shard, int allow_incomplete,
                       ts_read_ctx **out);
/* A context over a complete shard's records alone, also where its dataset's replica bytes were
 * dropped (tier.c): ts_read_ctx_info and ts_read_ctx_chunk_crc, not its bytes. */
int ts_store_records_open(ts_store *s, const char *dataset, uint32_t shard, ts_read_ctx **out);
const struct ts_shard_info *ts_read_ctx_info(const ts_read_ctx *r);
int ts_read_ctx_chunk(ts_read_ctx *r, uint32_t idx, struct ts_chunk_ref *out);
/*
 * What a read of [in, in+n) of chunk idx needs: the cached chunk if it is cached; else, for a
 * small range of a chunk-file chunk with sub-block CRCs kept (storage/subcrc.c), a piece with
 * only the touched sub-blocks read from disk (its bytes checked by ts_chunk_ref_check_crc as
 * they are sent); else the whole chunk as ts_read_ctx_chunk gives it.
 */
int ts_read_ctx_piece(ts_read_ctx *r, uint32_t idx, size_t in, size_t n, struct ts_chunk_ref *out);
/* Reads chunk idx of a complete shard into the cache, verified, as wanted soon (plan-driven
 * prefetch): 0, TS_EEXIST when it is cached already, or the read's error (nothing cached). */
int ts_store_prefetch(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx);
/* Marks a chunk wanted soon (queued for prefetch; wanted 1) or no longer (0: its prefetch came):
 * until then a miss on it reads it whole into the cache, even for a small range (want.c). */
void ts_store_want(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx, int wanted);
/* Reads from the store rather than the cache: whole chunks and pieces, and their bytes. */
struct ts_store_read_stats {
    uint64_t chunks, chunk_bytes, pieces, piece_bytes;
};
void ts_store_read_stats(ts_store *s, struct ts_store_read_stats *out);
/* Drops the cached copy of chunk idx (it failed a check). */
void ts_read_ctx_evict(ts_read_ctx *r, uint32_t idx);
/* Stored CRC32C and length of chunk idx, without reading it (complete shards only). */
int ts_read_ctx_chunk_crc(const ts_read_ctx *r, uint32_t idx, uint32_t *crc, uint32_t *len);
/* Releases a pin by its handle (for cleanup callbacks that only get the handle). */
/* ref's bytes are about to go out by sendfile() from ref->fd: the kernel may hold its pages
 * after the call returns, so the arena slot is hole-punched, not kept, once the chunk leaves
 * the cache (store_internal.h, struct arena). Call it before the pin is handed on. */
void ts_chunk_ref_lend(struct ts_chunk_ref *ref);
void ts_chunk_pin_release(void *pin);
void ts_read_ctx_close(ts_read_ctx *r);
void ts_chunk_ref_release(struct ts_chunk_ref *ref);

/*
 * Verifies every stored chunk (of one dataset, or all with dataset == NULL), complete and
 * incomplete shards alike. cb, if set, is called for each corrupt chunk.
 */
int ts_store_scrub(ts_store *s, const char *dataset,
                   void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx, int rc),
                   void *arg, struct ts_scrub_report *report);

/* ---- per-PG operation log (replication) --------------------------------------------------- */

enum ts_log_type {
    TS_LOG_SEAL = 1,   /* a shard became complete */
    TS_LOG_NOOP = 2,   /* a sequence number with nothing to apply (keeps replica logs contiguous) */
    TS_LOG_DELETE = 3, /* dataset incarnation `inc` was deleted */
};

struct ts_log_rec {
    uint32_t pg;
    uint64_t seq;     /* 0 on append: assign the next one */
    uint64_t epoch;   /* map epoch of the primary that appended it; (epoch, seq) names an entry */
    uint64_t inc;     /* the dataset's incarnation (its created_ns, the same on every node) */
    uint64_t fence;   /* append only if the PG's promise is not newer (TS_ESTALE): the sender's
                         epoch, checked under the log lock with the append (0: no check) */
    int type;         /* enum ts_log_type */
    uint64_t time_ns; /* wall clock when the primary appended it */
    char dataset[TS_NAME_MAX + 1];
    struct ts_dataset_policy policy;
    uint32_t shard;
    uint64_t size;
    uint32_t crc;
    uint32_t nchunks;
};

/*
 * Seals like ts_shard_writer_seal and, in the same atomic write, appends log record *log to
 * its PG's log and advances the PG's head to (log->epoch, seq). log->seq == 0 assigns the next
 * sequence (primary) and stores it in log->seq; a given seq (replica) must be applied+1:
 * TS_EEXIST if the same entry (epoch, dataset, shard, CRC) is already there, TS_ERANGE if it
 * leaves a gap, is older than the head, or a different entry holds that sequence (divergent
 * logs: the sender compares and truncates; ts_store_pg_state tells where the PG is).
 */
int ts_shard_writer_seal_log(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                             const uint64_t *records, uint32_t nrecords, struct ts_log_rec *log);
/*
 * Group commit (storage/commit.c). Seals as ts_shard_writer_seal_log does (log may be NULL), on
 * the store's commit thread, which writes every seal queued meanwhile and then syncs the WAL
 * once for all of them. A failed check (TS_EINCOMPLETE, TS_ECORRUPT, TS_EINVAL, TS_ESTALE)
 * returns at once and leaves w to the caller as ts_shard_writer_seal does. 0: w belongs to the
 * store now, and done(arg, rc) is called once, from the commit thread, when the seal is
 * durable (rc 0; log->seq is set) or failed (w aborted: the shard stays incomplete). *log and
 * arg must live until then; records are copied. Under sync = none the seal is written and done
 * called before this returns.
 */
typedef void (*ts_seal_done_fn)(void *arg, int rc);
int ts_shard_writer_seal_async(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                               const uint64_t *records, uint32_t nrecords, struct ts_log_rec *log,
                               ts_seal_done_fn done, void *arg);
/* Whether seals go through the commit thread (the sync policy is seal or always). */
int ts_store_group_commit(const ts_store *s);
struct ts_commit_stats {
    uint64_t seals;         /* seals made durable through the commit thread */
    uint64_t syncs;         /* WAL syncs it did for them */
    uint64_t largest_group; /* the most seals one sync covered */
};
void ts_store_commit_stats(ts_store *s, struct ts_commit_stats *out);
/* Tests: holds the commit thread before its next group (1) or lets it go (0). */
void ts_store_commit_hold(ts_store *s, int hold);
/* Returns once every seal queued so far was written, synced and reported (a caller that stops
 * queueing, e.g. a daemon whose loops have ended, then frees what done callbacks use). */
void ts_store_commit_quiesce(ts_store *s);
/* Appends a record that carries no shard (same sequence rules). */
int ts_store_log_append(ts_store *s, struct ts_log_rec *log);
/* The PG's last applied sequence (0: none) and its oldest retained one (0: log empty). */
int ts_store_pg_applied(ts_store *s, uint32_t pg, uint64_t *applied, uint64_t *oldest);
/* Record seq of a PG's log: TS_ENOENT if trimmed or never written. */
int ts_store_log_read(ts_store *s, uint32_t pg, uint64_t seq, struct ts_log_rec *out);
/* Keeps the newest keep records of a PG's log. */
int ts_store_log_trim(ts_store *s, uint32_t pg, uint64_t keep);
/* Removes a PG's log records up to and including seq upto. */
int ts_store_log_trim_to(ts_store *s, uint32_t pg, uint64_t upto);

/* Forces the PG's head to (epoch, seq) (backfill finished); TS_ESTALE if a promise newer than
 * fence (0: none) was made; TS_ERANGE (logged, nothing changed) if that is older than the head
 * (moving it back would drop entries without a rollback decision). */
int ts_store_pg_set_applied(ts_store *s, uint32_t pg, uint64_t seq, uint64_t epoch, uint64_t fence);

/* 1 when two entries are the same operation (epoch, type, dataset, shard, size, CRC). */
int ts_log_rec_same(const struct ts_log_rec *a, const struct ts_log_rec *b);

/*
 * Durable peering facts of a PG on this node (docs/architecture.md "Peering"): its log head,
 * the highest epoch it promised to a peering primary (it refuses older primaries), and the
 * interval it last joined (last epoch started, that interval's acting set and write quorum).
 */
#define TS_PG_MAX_ACTING 8
#define TS_PG_MAX_PENDING 16
struct ts_pg_interval {
    uint64_t epoch;
    uint8_t wq, n;
    char acting[TS_PG_MAX_ACTING][64];
};
struct ts_pg_state {
    uint64_t applied;    /* sequence of the last entry held (0: none) */
    uint64_t head_epoch; /* epoch of that entry */
    uint64_t promised;   /* no replication or activation from epochs below this */
    uint64_t les;        /* last epoch started: the newest interval known to have started */
    uint8_t wq;          /* that interval's write quorum */
    uint8_t nacting;
    char acting[TS_PG_MAX_ACTING][64]; /* that interval's acting set, primary first */
    /* Intervals being started, prepared here and not known to have started: each newer than
     * les; only a commit at or above one removes it (any of them may have started). */
    uint8_t npending;
    struct ts_pg_interval pending[TS_PG_MAX_PENDING];
};
struct ts_log_pos {
    uint64_t seq, epoch;
};
int ts_store_pg_state(ts_store *s, uint32_t pg, struct ts_pg_state *out);
/* Raises promised to epoch (durably); TS_ESTALE if a newer epoch was promised. *out (optional)
 * gets the state as it is now. */
int ts_store_pg_promise(ts_store *s, uint32_t pg, uint64_t epoch, struct ts_pg_state *out);
/*
 * Prepares interval epoch (promised = epoch; the interval added to the pending ones, or replacing
 * the pending one of the same epoch); TS_ESTALE if a newer epoch was promised. A member of the
 * new acting set records it only if its log head is (head_epoch, head_seq), the primary's
 * (*recorded says); a member of an older interval's set (member = 0) records it as a witness
 * either way. With TS_PG_MAX_PENDING intervals pending already it is not recorded.
 */
int ts_store_pg_prepare(ts_store *s, uint32_t pg, uint64_t epoch, uint8_t wq,
                        const char (*acting)[64], uint8_t nacting, int member, uint64_t head_epoch,
                        uint64_t head_seq, int *recorded);
/* Interval epoch started (les = epoch with its acting set and write quorum; pending intervals up
 * to it are cleared). Older than les: nothing changes. */
int ts_store_pg_commit(ts_store *s, uint32_t pg, uint64_t epoch, uint8_t wq,
                       const char (*acting)[64], uint8_t nacting);
/* The newest entries' (seq, epoch), newest first, up to max. */
int ts_store_pg_log_tail(ts_store *s, uint32_t pg, struct ts_log_pos *out, size_t max, size_t *n);
/* A shard-sealing log entry removed by a rollback (ts_store_pg_truncate), kept in memory since
 * the store opened (the last TS_ROLLED_BACK_KEEP; the total counts all): operators and drills
 * see what a rollback removed. */
#define TS_ROLLED_BACK_KEEP 1024
struct ts_rolled_back {
    uint32_t pg, shard;
    uint64_t seq, epoch, at_ns; /* the entry; when it was removed (wall clock) */
    char dataset[TS_NAME_MAX + 1];
};
/* Copies up to max of the most recent, oldest first; *sealing: how many shard-sealing entries
 * rollbacks removed since the store opened (the ring's), *total: every entry they removed. */
int ts_store_rolled_back(ts_store *s, struct ts_rolled_back *out, size_t max, size_t *n,
                         uint64_t *sealing, uint64_t *total);
/* Rolls the log back to seq, whose entry has epoch `epoch`: entries after it are removed and
 * the shards they sealed deleted (they were never acknowledged). *removed counts shards.
 * TS_ESTALE (nothing removed) if a promise newer than fence (0: none) was made; TS_EPERM (nothing
 * removed, logged) if the log holds entries of an epoch newer than fence. */
int ts_store_pg_truncate(ts_store *s, uint32_t pg, uint64_t seq, uint64_t epoch, uint64_t fence,
                         unsigned *removed);
/* Deletes one shard (complete or not) and its records; TS_EBUSY while it is being uploaded. */
int ts_store_shard_delete(ts_store *s, const char *dataset, uint32_t shard);
/* The dataset's record only (cached; no shard scan). */
int ts_store_dataset_get(ts_store *s, const char *name, struct ts_dataset_info *out);

/* Creates a dataset whose incarnation (created_ns) is given: the same on every node of a
 * cluster (0: now). A deleted and re-created name is a new incarnation. */
int ts_store_dataset_create_inc(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                                uint64_t incarnation);
/* The incarnation of name last deleted here (its tombstone): TS_ENOENT if none. */
int ts_store_tombstone(ts_store *s, const char *name, uint64_t *incarnation);
/* Calls cb for each tombstone (name, incarnation deleted); a non-zero return stops. */
int ts_store_tombstone_list(ts_store *s, int (*cb)(void *arg, const char *name, uint64_t inc),
                            void *arg);
/* Creates the dataset if it does not exist (replicas learn datasets from their primaries).
 * With an incarnation (non-zero): an older local incarnation is deleted and replaced;
 * TS_ESTALE if the local one is newer, or that incarnation was deleted here (tombstone). */
int ts_store_dataset_ensure(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                            uint64_t incarnation);
/* Seal; local_only: this node holds only some shards, so skip the 0..N-1 check. */
int ts_store_dataset_seal_ex(ts_store *s, const char *name, int local_only);
/* Replaces the bytes of chunk idx of a complete shard with data, which must match the stored
 * CRC32C and length (TS_ECORRUPT otherwise): repair from a good replica. */
int ts_store_chunk_repair(ts_store *s, const char *dataset, uint32_t shard, uint32_t idx,
                          const void *data, size_t len);

/* Scrub that stops with TS_ECANCELED once *cancel becomes non-zero (checked per shard). */
int ts_store_scrub_ex(ts_store *s, const char *dataset,
                      void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx,
                                 int rc),
                      void *arg, struct ts_scrub_report *report, const _Atomic int *cancel);
/* The same at a pace: at most bytes_per_s read (0: no limit), and *cancel checked before
 * every chunk (a scheduled scrub on a serving node). */
int ts_store_scrub_paced(ts_store *s, const char *dataset,
                         void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx,
                                    int rc),
                         void *arg, struct ts_scrub_report *report, const _Atomic int *cancel,
                         uint64_t bytes_per_s);
/* Chunks and bytes every scrub since the store opened has read and verified, counted as it goes
 * (a running scrub's progress). Thread-safe. */
void ts_store_scrub_progress(ts_store *s, uint64_t *chunks, uint64_t *bytes);

/* The replicas a dataset has beyond core + fringe in the PG asked about (a hot dataset's extra
 * fringe replicas, from the map: the storage layer does not know the map). */
typedef unsigned (*ts_store_extra_fn)(void *arg, const char *dataset);
/* inventory.c: the count of complete shards of pg (of pg_count) here, of the datasets that keep
 * a replica at placement rank `rank` (core + fringe + extra(arg, dataset) > rank; extra NULL:
 * none), and an order-independent digest of them (dataset incarnation, shard, size, CRC32C):
 * equal on replicas that agree. */
int ts_store_pg_inventory(ts_store *s, uint32_t pg, uint32_t pg_count, int rank,
                          ts_store_extra_fn extra, void *arg, uint64_t *count, uint64_t *digest);

/* Calls cb for every complete shard that maps to pg (of pg_count), for backfill. */
int ts_store_pg_iter(ts_store *s, uint32_t pg, uint32_t pg_count,
                     int (*cb)(void *arg, const char *dataset, const struct ts_shard_info *info),
                     void *arg);

struct ts_store_cache_stats {
    uint64_t hits, misses, evictions, bytes, entries, budget;
    uint64_t small_bytes, main_bytes; /* the S3-FIFO's two queues: bytes = small + main */
    uint64_t ghost_hits; /* inserts readmitted to main because their key was evicted recently */
    /* The arena's slots taken with their pages kept, and slots hole-punched on release (after
     * a sendfile(), or past the kept bound): store_internal.h, struct arena. */
    uint64_t arena_reused, arena_punched;
};
void ts_store_cache_stats(ts_store *s, struct ts_store_cache_stats *out);

/* The data directory's filesystem as admission sees it. */
struct ts_store_space {
    uint64_t total, avail, reserve, memtables;
    int full; /* writes are refused now */
};
void ts_store_space(ts_store *s, struct ts_store_space *out);

/* Engine statistics as text (RocksDB "rocksdb.stats" etc.), malloc'ed; NULL on error. */
char *ts_store_engine_stats(ts_store *s);
/* RocksDB's figures, summed over the column families: estimated keys, live SST bytes, pending
 * compaction bytes, running compactions, running flushes; and the block cache's usage. */
enum { TS_ENGINE_PROPS = 5 };
struct ts_store_engine_props {
    uint64_t v[TS_ENGINE_PROPS];
    uint64_t block_cache_bytes;
};
void ts_store_engine_props(ts_store *s, struct ts_store_engine_props *out);

#endif
