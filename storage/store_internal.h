/*
 * Storage internals shared by the files of the storage module (store.c lists them: open and
 * close, on-disk layout, engine helpers, datasets, shard records and writes, reads, the cache
 * arena, scrub; pglog.c: per-PG operation log and peering state). Not installed, not used
 * outside storage/.
 */
#ifndef TS_STORE_INTERNAL_H
#define TS_STORE_INTERNAL_H

#include <pthread.h>
#include <rocksdb/c.h>

#include "cache.h"
#include "ts_store.h"

/* layout.c: column families, keys and records (see there for the layout). */
enum { CF_DEFAULT, CF_META, CF_CHUNKS, CF_OPLOG, CF_COUNT };
extern const char *const ts_store_cf_names[CF_COUNT];

#define DS_REC_LEN 40
#define SHARD_REC_LEN 40
#define CHUNK_REC_LEN 8
#define REC_VERSION 1

/* Each writes a key into k and returns its length. */
size_t key_ds(uint8_t *k, const char *name);
size_t key_id(uint8_t *k, char tag, uint64_t id);
size_t key_shard(uint8_t *k, char tag, uint64_t id, uint32_t shard);
size_t key_chunkrec(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx);
size_t key_chunk(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx);
size_t key_subcrc(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx);
void ds_encode(uint8_t *b, const struct ts_dataset_info *d);
int ds_decode(const char *v, size_t len, const char *name, struct ts_dataset_info *d);
/* A shard record; file: its chunk file's id (0: its chunks are in CF_CHUNKS). */
void shard_encode(uint8_t *b, const struct ts_shard_info *si, uint32_t file);
int shard_decode(const char *v, size_t len, uint32_t shard, struct ts_shard_info *si,
                 uint32_t *file);

#define WANT_SLOTS 65536 /* want.c's counting filter */
#define FILL_SLOTS 64    /* fill.c: chunk fills in progress, at most */

struct fill_slot {
    int busy;
    uint64_t dsid;
    uint32_t shard, idx;
};
#define DS_BUCKETS 1024 /* buckets of the dataset-record cache (s->dstab) */

struct writer_slot {
    uint64_t dsid;
    uint32_t shard;
    ts_shard_writer *w;
};

/*
 * The cache arena: one sparse memfd, mapped once. Slots come in power-of-two size classes
 * (4 KiB .. 64 MiB), each class with its own 1 TiB of offsets, a bump pointer and two free
 * lists. A slot whose bytes were lent to the kernel by reference (sendfile(): the socket's
 * buffers may still hold its pages after the call) is hole-punched when given back, so a later
 * writer gets fresh pages and bytes in flight are never overwritten. A slot that was never lent
 * (its bytes only copied out: writev, TLS, RDMA) keeps its pages, up to ARENA_KEEP_BYTES of
 * such slots at once: the next chunk read into it costs no page faults and no zeroing (in this
 * VM, 1 MiB into fresh pages took 0.9 ms, into kept ones 0.09 ms).
 */
#define ARENA_MIN_SHIFT 12
#define ARENA_MAX_SHIFT 26
#define ARENA_CLASS_SPAN (1ull << 40)
#define ARENA_CLASSES (ARENA_MAX_SHIFT - ARENA_MIN_SHIFT + 1)
#define ARENA_KEEP_BYTES (64ull << 20)
struct arena_list {
    uint64_t *off;
    size_t n, cap;
};
struct arena {
    int fd;
    uint8_t *base;
    uint64_t size;
    pthread_mutex_t lock;
    uint64_t bump[ARENA_CLASSES];
    struct arena_list punched[ARENA_CLASSES]; /* free slots without pages */
    struct arena_list kept[ARENA_CLASSES];    /* free slots with their pages */
    uint64_t kept_bytes;
    uint64_t reused_kept, punches; /* slots taken with their pages; slots punched */
};

struct ts_store {
    /* Scrubs: chunks and bytes read and verified, counted as they go (the metrics' progress). */
    _Atomic uint64_t scrub_chunks, scrub_bytes;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_options_t *cf_opts[CF_COUNT];
    rocksdb_cache_t *cache;
    rocksdb_block_based_table_options_t *bbto;
    rocksdb_column_family_handle_t *cf[CF_COUNT];
    rocksdb_writeoptions_t *wo;       /* every write: synced unless sync = none */
    rocksdb_writeoptions_t *wo_chunk; /* a chunk of an unsealed shard: synced under always */
    rocksdb_readoptions_t *ro_meta;
    rocksdb_readoptions_t *ro_chunk;
    struct ts_store_opts o;
    char *path;
    pthread_mutex_t lock;    /* serialises metadata read-modify-write and the writer table */
    pthread_mutex_t loglock; /* PG log sequence assignment and order */
    ts_cache *ccache;        /* verified chunks and complete-shard records */
    struct arena arena;      /* where cached chunk bytes live (fd -1: in engine buffers) */
    pthread_mutex_t dslock;  /* the dataset-record cache below */
    struct ds_ent **dstab;
    size_t ndsents;
    uint64_t ds_gen; /* bumped on every invalidation: a racing fill is dropped */
    /* free-space admission (space.c) */
    pthread_mutex_t space_lock;
    uint64_t space_reserve, space_total, space_avail, space_admitted;
    uint64_t space_checked_ns, space_warned_ns;
    struct writer_slot *writers;
    size_t nwriters, capwriters;
    uint64_t wal_damage_ns;       /* when a damaged WAL was last found at open (0: never) */
    struct ts_rolled_back *rb;    /* TS_ROLLED_BACK_KEEP, a ring under loglock (pglog.c) */
    uint64_t nrb;                 /* shard-sealing entries noted in the ring since open */
    uint64_t nrb_all;             /* every entry rolled back since open */
    struct ts_commit *commit;     /* the group commit thread (commit.c; NULL under sync = none) */
    _Atomic uint64_t inline_held; /* bytes of single-chunk inline shards held until their seal */
    /* Reads from the store, not the cache (ts_store_read_stats): whole chunks, and pieces of
     * chunk files read by sub-blocks (piece.c). */
    _Atomic uint64_t rd_chunks, rd_chunk_bytes, rd_pieces, rd_piece_bytes;
    _Atomic uint32_t want[WANT_SLOTS]; /* want.c: chunks hinted, not read ahead yet */
    pthread_mutex_t fill_lock;         /* fill.c: the fills in progress */
    pthread_cond_t fill_cv;
    struct fill_slot fills[FILL_SLOTS];
};

/* A read context (read.c): a shard's record, and its CRC list once the shard is complete. */
struct shard_entry;
struct ts_read_ctx {
    ts_store *s;
    uint64_t dsid;
    struct ts_shard_info info;
    uint32_t file;          /* the shard's chunk file (0: chunks in CF_CHUNKS) */
    const uint32_t *crcs;   /* NULL while the shard is incomplete: per-chunk records are used */
    struct shard_entry *se; /* holds crcs */
    int nocache;            /* scrub: always read and verify what is on disk */
    int wanted;             /* prefetch: chunks read are cached as wanted soon */
};

/* engine_open.c: opens s->db (see there for what a damaged WAL does); s->ro_meta must exist. */
int engine_open(ts_store *s);

/* engine.c: RocksDB's char **errptr to a TS_E* code (logged); 0 when err is NULL. Frees err. */
int from_rocksdb(char *err, const char *what);
/* A meta value into a malloc'ed buffer (rocksdb_free); TS_ENOENT if absent. */
int meta_get(ts_store *s, const uint8_t *k, size_t klen, char **val, size_t *vlen);
int batch_write(ts_store *s, rocksdb_writebatch_t *b, const char *what);
/* The same with other write options (s->wo_chunk). */
int batch_write_wo(ts_store *s, rocksdb_writeoptions_t *wo, rocksdb_writebatch_t *b,
                   const char *what);
/* Whether the sync policy makes a chunk durable on its own, or a seal (with its shard's file). */
static inline int sync_chunks(const ts_store *s)
{
    return s->o.sync == TS_SYNC_ALWAYS;
}
static inline int sync_seals(const ts_store *s)
{
    return s->o.sync != TS_SYNC_NONE;
}
/* Iterates meta keys starting with prefix; a non-zero return from cb stops and is returned. */
int meta_scan(ts_store *s, const uint8_t *prefix, size_t plen,
              int (*cb)(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen),
              void *arg);

/* arena.c: the cache arena. arena_init() is optional (fd -1 without it); arena_alloc()
 * returns an offset for len bytes, or -1 (a slot with its pages first); arena_release() gives
 * it back, hole-punched first when lent (its bytes were sendfile()d) or when the kept slots
 * are at ARENA_KEEP_BYTES. */
int arena_init(struct arena *a);
void arena_fini(struct arena *a);
int64_t arena_alloc(struct arena *a, size_t len);
void arena_release(struct arena *a, int64_t off, size_t len, int lent);

/* dataset_cache.c: a dataset's record by name (through the cache), its name by id ('I'). */
int dataset_get(ts_store *s, const char *name, struct ts_dataset_info *d);
/* dataset.c: writes dataset d's record (s->lock held) and forgets the cached copy. */
int ds_rewrite(ts_store *s, const char *name, const struct ts_dataset_info *d, const char *what);
/* Forgets a cached dataset record (after seal or delete). */
void ds_invalidate(ts_store *s, const char *name);
/* Empties the cache (s->dslock held, or the store being closed). */
void ds_clear_locked(ts_store *s);
/* name has room for TS_NAME_MAX + 1 bytes. */
int id_name(ts_store *s, uint64_t dsid, char *name);

/* shard.c: a shard's record (and, if crcs and complete, its malloc'ed CRC list); the walk
 * over dataset dsid's shard records, counting them into d if not NULL, calling cb if not NULL. */
int shard_get(ts_store *s, uint64_t dsid, uint32_t shard, struct ts_shard_info *si, uint32_t **crcs,
              uint32_t *file);
int shard_scan(ts_store *s, uint64_t dsid, struct ts_dataset_info *d,
               int (*cb)(void *arg, const struct ts_shard_info *info), void *arg);
/*
 * chunkfile.c: a shard's chunks in a file of its own (see there). create: a new file (random
 * id in *file) for dataset dsid's shard, open for writing; write/sync/close on its fd; read
 * and repair: [off, off+len) of a shard's file (TS_ENOENT: no such file); unlink: after the
 * record that named it is gone; drop_dataset: every file of a deleted dataset; sweep: at open,
 * removes what no record names.
 */
int chunkfile_create(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t *file, int *fd);
int chunkfile_write(int fd, const void *data, size_t len, uint64_t off);
int chunkfile_sync(int fd);
/* Starts writing [off, off + len) of the file to the disk without waiting for it (under
 * sync = seal after every chunk: the seal's fdatasync then waits only for the last ones). */
void chunkfile_start_writeback(int fd, uint64_t off, size_t len);
void chunkfile_close(int *fd);
int chunkfile_read(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file, uint64_t off,
                   void *buf, size_t len);
int chunkfile_repair(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file, uint64_t off,
                     const void *data, size_t len);
void chunkfile_unlink(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file);
void chunkfile_drop_dataset(ts_store *s, uint64_t dsid);
void chunkfile_sweep(ts_store *s);

/* subcrc.c: per-sub-block CRCs of chunk-file chunks (see there). subcrc_compute fills
 * subs[subcrc_count(len)] and returns the chunk's CRC folded from them (one pass); subcrc_load
 * gives them back only if they fold to chunk_crc (else TS_ECORRUPT; TS_ENOENT: none kept). */
size_t subcrc_count(size_t len);
uint32_t subcrc_compute(const uint8_t *data, size_t len, uint32_t *subs);
void subcrc_put(ts_store *s, rocksdb_writebatch_t *b, uint64_t dsid, uint32_t shard, uint32_t idx,
                const uint32_t *subs, size_t len);
int subcrc_load(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx, uint32_t chunk_crc,
                size_t len, uint32_t **out);

/* Adds to b the deletion of a shard's chunk records and chunks. */
void shard_range_delete(ts_store *s, rocksdb_writebatch_t *b, uint64_t dsid, uint32_t shard);

/* A shard writer (shard_write.c); the writer table (writers.c) marks it superseded. */
struct ts_shard_writer {
    ts_store *s;
    uint64_t dsid;
    uint32_t shard;
    uint32_t chunk_size;
    uint64_t expect_size;
    uint64_t bytes;
    uint32_t next;
    uint32_t crc;
    int short_seen; /* a chunk shorter than chunk_size was written: it must be the last */
    int fd;         /* the chunk file being written (-1: chunks go to CF_CHUNKS) */
    uint32_t file;  /* its id, in the shard record */
    int dropped;    /* the dataset's replica bytes are dropped: chunks come without bytes */
    uint32_t *crcs;
    uint32_t cap;
    /* A new inline shard: its begin record is not written until a chunk must be (deferred),
     * and a shard of one chunk keeps that chunk here (held, counted in s->inline_held) until
     * its seal writes everything in one batch. */
    int deferred;
    uint8_t *held;
    _Atomic int superseded; /* a newer upload of the shard (or its dataset's delete) took over */
    pthread_mutex_t lock;   /* held over a put's or seal's last check and its batch: a takeover
                               (writers_supersede) waits for it, so no batch of a superseded
                               writer lands after the takeover's own records */
};

/* writers.c, under s->lock: whether dataset dsid (any_shard) or its shard has a writer;
 * writers_supersede() makes them give way (see there) and returns how many. */
int writer_active(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard);
size_t writers_supersede(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard);

/* read.c: a read context by dataset id; nocache (scrub) reads and verifies what is on disk. */
int read_open_id(ts_store *s, uint64_t dsid, uint32_t shard, int allow_incomplete, int nocache,
                 ts_read_ctx **out);
/* fill.c: a chunk about to be read from its file into the cache: 1 when the caller reads it
 * and then calls fill_end(); 0 when another reader's fill of it was waited for (look in the
 * cache again) or too many fills are in progress (read, without fill_end). */
int fill_begin(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx);
void fill_end(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx);
/* want.c: whether chunk idx of a shard is wanted soon (hinted; maybe a false positive). */
int want_check(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx);
/* The cached copy of chunk idx (0), or TS_ENOENT when it is not cached. */
int read_cached_chunk(ts_read_ctx *r, uint32_t idx, struct ts_chunk_ref *out);
/* Length of chunk idx of a complete shard. */
uint32_t read_chunk_len(const ts_read_ctx *r, uint32_t idx);

/* space.c: sizes the memtables and the WAL for the filesystem and sets the reserve (before
 * the database is opened). */
void ts_space_plan(ts_store *s, uint64_t *write_buffer, uint64_t *max_wal);
/* 0 if a write of len bytes leaves the reserve and room for flushes; TS_ENOSPC (why says
 * what is free) otherwise. */
int ts_space_admit(ts_store *s, uint64_t len, char *why, size_t cap);

/* shard_write.c: a seal in two steps (ts_shard_writer_seal_log is both): check leaves the
 * writer as it was on failure; write (with options wo) frees it on success. */
int shard_seal_check(ts_shard_writer *w, int have_crc, uint32_t expect_crc, const uint64_t *records,
                     uint32_t nrecords);
int shard_seal_write(ts_shard_writer *w, const uint64_t *records, uint32_t nrecords,
                     struct ts_log_rec *log, rocksdb_writeoptions_t *wo);

/* commit.c: the group commit thread, started at open where seals are synced, stopped (after
 * what was queued) before the engine closes. */
int commit_start(ts_store *s);
void commit_stop(ts_store *s);

/* pglog.c: adds log record *log (and the PG's new head) to batch b under the log lock, which
 * ts_pglog_end() releases once the batch was written. On failure the lock is not held. */
int ts_pglog_begin(ts_store *s, struct ts_log_rec *log, rocksdb_writebatch_t *b);
void ts_pglog_end(ts_store *s);

#endif
