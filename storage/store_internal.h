/*
 * Storage internals shared by the files of the storage module (store.c: datasets, shards,
 * chunks; pglog.c: per-PG operation log and peering state). Not installed, not used outside
 * storage/.
 */
#ifndef TS_STORE_INTERNAL_H
#define TS_STORE_INTERNAL_H

#include <pthread.h>
#include <rocksdb/c.h>

#include "cache.h"
#include "ts_store.h"

enum { CF_DEFAULT, CF_META, CF_CHUNKS, CF_OPLOG, CF_COUNT };
extern const char *const ts_store_cf_names[CF_COUNT];

struct writer_slot {
    uint64_t dsid;
    uint32_t shard;
    ts_shard_writer *w;
};

/*
 * The cache arena: one sparse memfd, mapped once. Slots come in power-of-two size classes
 * (4 KiB .. 64 MiB), each class with its own 1 TiB of offsets, a free list and a bump
 * pointer. A slot given back is hole-punched first, so its pages go back to the system and a
 * later writer gets fresh pages: bytes the kernel still holds for an earlier sendfile() are
 * never overwritten.
 */
#define ARENA_MIN_SHIFT 12
#define ARENA_MAX_SHIFT 26
#define ARENA_CLASS_SPAN (1ull << 40)
#define ARENA_CLASSES (ARENA_MAX_SHIFT - ARENA_MIN_SHIFT + 1)
struct arena {
    int fd;
    uint8_t *base;
    uint64_t size;
    pthread_mutex_t lock;
    uint64_t bump[ARENA_CLASSES];
    uint64_t *free[ARENA_CLASSES];
    size_t nfree[ARENA_CLASSES], capfree[ARENA_CLASSES];
};

struct ts_store {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_options_t *cf_opts[CF_COUNT];
    rocksdb_cache_t *cache;
    rocksdb_block_based_table_options_t *bbto;
    rocksdb_column_family_handle_t *cf[CF_COUNT];
    rocksdb_writeoptions_t *wo;
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
    uint64_t wal_damage_ns; /* when a damaged WAL was last found at open (0: never) */
};

/* engine_open.c: opens s->db (see there for what a damaged WAL does); s->ro_meta must exist. */
int engine_open(ts_store *s);

/* RocksDB's char **errptr to a TS_E* code (logged); 0 when err is NULL. Frees err. */
int from_rocksdb(char *err, const char *what);
/* A meta value into a malloc'ed buffer (rocksdb_free); TS_ENOENT if absent. */
int meta_get(ts_store *s, const uint8_t *k, size_t klen, char **val, size_t *vlen);
int batch_write(ts_store *s, rocksdb_writebatch_t *b, const char *what);
/* Iterates meta keys starting with prefix; a non-zero return from cb stops and is returned. */
int meta_scan(ts_store *s, const uint8_t *prefix, size_t plen,
              int (*cb)(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen),
              void *arg);

/* space.c: sizes the memtables and the WAL for the filesystem and sets the reserve (before
 * the database is opened). */
void ts_space_plan(ts_store *s, uint64_t *write_buffer, uint64_t *max_wal);
/* 0 if a write of len bytes leaves the reserve and room for flushes; TS_ENOSPC (why says
 * what is free) otherwise. */
int ts_space_admit(ts_store *s, uint64_t len, char *why, size_t cap);

/* pglog.c: adds log record *log (and the PG's new head) to batch b under the log lock, which
 * ts_pglog_end() releases once the batch was written. On failure the lock is not held. */
int ts_pglog_begin(ts_store *s, struct ts_log_rec *log, rocksdb_writebatch_t *b);
void ts_pglog_end(ts_store *s);

#endif
