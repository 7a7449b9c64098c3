/*
 * The chunk store on RocksDB: its options and defaults, opening and closing it.
 *
 * Where the rest lives (store_internal.h declares what the files share):
 *   layout.c         column families, meta keys, record encoding (the on-disk format)
 *   engine.c         RocksDB errors as TS_E* codes; meta get, batch write, meta prefix scan
 *   engine_open.c    opening the engine; what a damaged write-ahead log means
 *   dataset_cache.c  dataset lookup by name (cached) and by id
 *   dataset.c        dataset create, stat, list, seal, delete; tombstones and incarnations
 *   shard.c          shard records, stat, list, record index, removal; iteration by PG
 *   shard_write.c    shard writers: begin, put, seal, abort
 *   writers.c        the writer table: active writers, superseding them
 *   read.c           read contexts, verified chunk reads, the chunk cache, range reads
 *   arena.c          the cache arena (memfd slots for cached chunks)
 *   scrub.c          scrub and chunk repair
 *   pglog.c          the per-PG operation log and peering state
 *   inventory.c      a PG's inventory digest
 *   space.c          free-space admission
 *   cache.c          the LRU cache of reference-counted entries
 */
#include "store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FAC "storage"

/* ---- open / close ------------------------------------------------------------------------ */

const char *ts_store_sync_name(int sync)
{
    return sync == TS_SYNC_ALWAYS ? "always" : sync == TS_SYNC_NONE ? "none" : "seal";
}

int ts_store_sync_parse(const char *name)
{
    for (int p = TS_SYNC_ALWAYS; p <= TS_SYNC_SEAL; p++)
        if (!strcmp(name, ts_store_sync_name(p)))
            return p;
    return -1;
}

void ts_store_opts_init(struct ts_store_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->sync = TS_SYNC_SEAL;
    o->chunk_files = 1;
    o->inline_max = 0; /* opt-in for now (storage.inline_max_kb; docs/operations.md) */
    o->blob_files = 1;
    o->min_blob_size = 4096;
    o->blob_file_size = 256ull << 20;
    o->block_cache_bytes = 256ull << 20;
    o->verify_engine_checksums = 0;
    o->max_chunk_size = 64u << 20;
    o->cache_bytes = 256ull << 20;
    o->cache_arena = 1;
    o->max_open_files = 4096;
    o->reserve_bytes = UINT64_MAX; /* automatic */
}

void ts_dataset_policy_init(struct ts_dataset_policy *p)
{
    memset(p, 0, sizeof(*p));
    p->core = 1;
    p->fringe = 0;
    p->min_core = 1;
    p->chunk_size = TS_DEFAULT_CHUNK_SIZE;
}

/* Closes the engine and frees the read and write options made once it opened. */
static void engine_close(ts_store *s)
{
    for (int i = 0; i < CF_COUNT; i++)
        rocksdb_column_family_handle_destroy(s->cf[i]);
    rocksdb_close(s->db);
    rocksdb_writeoptions_destroy(s->wo);
    rocksdb_writeoptions_destroy(s->wo_chunk);
    rocksdb_readoptions_destroy(s->ro_meta);
    rocksdb_readoptions_destroy(s->ro_chunk);
}

int ts_store_open(ts_store **out, const struct ts_store_opts *o)
{
    ts_store *s;
    uint64_t write_buffer, max_wal;
    int rc;

    if (!out || !o || !o->path || !o->path[0])
        return TS_EINVAL;
    *out = NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return TS_ENOMEM;
    s->o = *o;
    s->path = strdup(o->path);
    if (!s->path) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    s->o.path = s->path;
    if (mkdir(s->path, 0750) != 0 && errno != EEXIST) {
        rc = ts_from_errno(errno);
        TS_ERROR(FAC, rc, "cannot create data directory %s: %s", s->path, strerror(errno));
        goto out_free;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->dslock, NULL);
    pthread_mutex_init(&s->loglock, NULL);
    pthread_mutex_init(&s->space_lock, NULL);
    pthread_mutex_init(&s->fill_lock, NULL);
    pthread_cond_init(&s->fill_cv, NULL);
    s->dstab = calloc(DS_BUCKETS, sizeof(*s->dstab));
    s->arena.fd = -1;
    if (!s->dstab || ts_cache_create(&s->ccache, o->cache_bytes) != 0) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    if (o->cache_bytes && o->cache_arena)
        arena_init(&s->arena); /* optional: without it cached chunks stay pinned */

    s->cache = rocksdb_cache_create_lru(o->block_cache_bytes);
    s->bbto = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(s->bbto, s->cache);
    rocksdb_block_based_options_set_block_size(s->bbto, 16 << 10);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(s->bbto, 1);

    ts_space_plan(s, &write_buffer, &max_wal);
    s->opts = rocksdb_options_create();
    rocksdb_options_set_max_total_wal_size(s->opts, max_wal);
    rocksdb_options_set_create_if_missing(s->opts, 1);
    rocksdb_options_set_create_missing_column_families(s->opts, 1);
    rocksdb_options_increase_parallelism(s->opts, 2);
    rocksdb_options_set_max_open_files(s->opts, o->max_open_files ? o->max_open_files : 4096);
    for (int i = 0; i < CF_COUNT; i++) {
        rocksdb_options_t *co = rocksdb_options_create_copy(s->opts);
        rocksdb_options_set_block_based_table_factory(co, s->bbto);
        if (i == CF_CHUNKS) {
            /* Chunk bytes: already compressed or incompressible training data; no compression.
             * Blob files keep large values out of compaction (written once, read many). */
            rocksdb_options_set_compression(co, rocksdb_no_compression);
            /* Blob files are not garbage-collected (below): with chunk files, the chunks in
             * the engine are small shards' (inline), deleted and rewritten freely; they stay
             * in SSTs, where compaction reclaims them. */
            if (o->blob_files && !o->chunk_files) {
                rocksdb_options_set_enable_blob_files(co, 1);
                rocksdb_options_set_min_blob_size(co, o->min_blob_size);
                rocksdb_options_set_blob_file_size(co, o->blob_file_size);
                rocksdb_options_set_blob_compression_type(co, rocksdb_no_compression);
                /* No blob garbage collection: it reads live blobs back during compactions,
                 * and one damaged blob then fails the compaction and stops every write of
                 * the node (RocksDB's background error) instead of costing one chunk that our
                 * CRC32C finds on read and a replica repairs (test_storage
                 * test_blob_file_damage_keeps_writes). A blob file is deleted once all its
                 * blobs are garbage (its datasets deleted or rewritten). */
                rocksdb_options_set_enable_blob_gc(co, 0);
            }
            rocksdb_options_set_write_buffer_size(co, write_buffer);
        } else {
            rocksdb_options_set_compression(co, rocksdb_lz4_compression);
        }
        s->cf_opts[i] = co;
    }

    s->ro_meta = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->ro_meta, 1);
    rc = engine_open(s);
    if (rc) {
        rocksdb_readoptions_destroy(s->ro_meta);
        goto out_destroy_opts;
    }
    s->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(s->wo, sync_seals(s));
    s->wo_chunk = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(s->wo_chunk, sync_chunks(s));
    s->ro_chunk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->ro_chunk, o->verify_engine_checksums ? 1 : 0);
    chunkfile_sweep(s); /* files of uploads and deletes a crash cut short */
    if (sync_seals(s) && (rc = commit_start(s)) != 0) {
        TS_ERROR(FAC, rc, "cannot start the group commit thread");
        engine_close(s);
        goto out_destroy_opts;
    }
    TS_INFO(FAC,
            "opened store at %s (chunk files %s, inline up to %u bytes, blob files %s, sync %s)",
            s->path, o->chunk_files ? "on" : "off", o->chunk_files ? o->inline_max : 0,
            o->blob_files ? "on" : "off", ts_store_sync_name(o->sync));
    *out = s;
    return 0;

out_destroy_opts:
    for (int i = 0; i < CF_COUNT; i++)
        if (s->cf_opts[i])
            rocksdb_options_destroy(s->cf_opts[i]);
    rocksdb_options_destroy(s->opts);
    rocksdb_block_based_options_destroy(s->bbto);
    rocksdb_cache_destroy(s->cache);
out_free:
    ts_cache_destroy(s->ccache);
    arena_fini(&s->arena);
    free(s->dstab);
    pthread_mutex_destroy(&s->dslock);
    pthread_mutex_destroy(&s->loglock);
    pthread_mutex_destroy(&s->space_lock);
    pthread_mutex_destroy(&s->fill_lock);
    pthread_cond_destroy(&s->fill_cv);
    pthread_mutex_destroy(&s->lock);
    free(s->path);
    free(s);
    return rc;
}

static void store_close(ts_store *s, int flush);

void ts_store_close(ts_store *s)
{
    store_close(s, 1);
}

void ts_store_close_unflushed(ts_store *s)
{
    store_close(s, 0);
}

static void store_close(ts_store *s, int flush)
{
    if (!s)
        return;
    commit_stop(s); /* seals queued are written and reported first */
    /* A clean close leaves the data in table and blob files, not only in the WAL: the next
     * open replays nothing (best effort: on a full disk the WAL keeps it). */
    if (flush) {
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 1);
        for (int i = 0; i < CF_COUNT; i++) {
            char *err = NULL;
            rocksdb_flush_cf(s->db, fo, s->cf[i], &err);
            if (err) {
                TS_WARN(FAC, TS_EIO, "close: flushing the memtables failed: %s", err);
                rocksdb_free(err);
                break;
            }
        }
        rocksdb_flushoptions_destroy(fo);
    }
    /* Cached chunks pin engine memory: release them before the engine closes. */
    ts_cache_destroy(s->ccache);
    arena_fini(&s->arena);
    ds_clear_locked(s);
    free(s->dstab);
    pthread_mutex_destroy(&s->dslock);
    pthread_mutex_destroy(&s->loglock);
    pthread_mutex_destroy(&s->space_lock);
    pthread_mutex_destroy(&s->fill_lock);
    pthread_cond_destroy(&s->fill_cv);
    engine_close(s);
    for (int i = 0; i < CF_COUNT; i++)
        rocksdb_options_destroy(s->cf_opts[i]);
    rocksdb_options_destroy(s->opts);
    rocksdb_block_based_options_destroy(s->bbto);
    rocksdb_cache_destroy(s->cache);
    pthread_mutex_destroy(&s->lock);
    free(s->writers);
    free(s->rb);
    free(s->path);
    free(s);
}

char *ts_store_engine_stats(ts_store *s)
{
    return s ? rocksdb_property_value(s->db, "rocksdb.stats") : NULL;
}

void ts_store_engine_props(ts_store *s, struct ts_store_engine_props *out)
{
    static const char *const names[TS_ENGINE_PROPS] = {
        "rocksdb.estimate-num-keys", "rocksdb.live-sst-files-size",
        "rocksdb.estimate-pending-compaction-bytes", "rocksdb.num-running-compactions",
        "rocksdb.num-running-flushes"};
    uint64_t v;

    memset(out, 0, sizeof(*out));
    for (int i = 0; i < CF_COUNT; i++) {
        if (!s->cf[i])
            continue;
        for (int k = 0; k < TS_ENGINE_PROPS; k++)
            if (rocksdb_property_int_cf(s->db, s->cf[i], names[k], &v) == 0) {
                if (k >= 3 && i) /* running compactions and flushes: the whole DB's */
                    continue;
                out->v[k] += v;
            }
    }
    if (s->cache)
        out->block_cache_bytes = rocksdb_cache_get_usage(s->cache);
}
