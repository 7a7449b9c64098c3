/*
 * The chunk store on RocksDB.
 *
 * Column families:
 *   default  unused (RocksDB requires it)
 *   meta     dataset, shard and chunk-checksum records (small; block cache; verified reads)
 *   chunks   chunk bytes; integrated BlobDB keeps them in blob files, out of compaction
 *   oplog    per-PG operation log (used by replication)
 *
 * meta keys ("id" is the dataset's 8-byte big-endian id, so a dataset's keys are contiguous):
 *   'D' name                 -> dataset record
 *   'T' name                 -> tombstone: le64 incarnation (created_ns) last deleted
 *   'I' id                   -> dataset name (reverse index for scrub and PG iteration)
 *   'N'                      -> next dataset id
 *   'S' id shard(be32)       -> shard record (+ per-chunk CRC list once complete)
 *   'C' id shard idx(be32)   -> chunk record (crc, len) while the shard is being written
 *   'R' id shard             -> record index (le64 offsets)
 * chunks keys: id shard(be32) idx(be32) -> chunk bytes
 */
#include "ts_store.h"

#include "cache.h"
#include "store_internal.h"
#include "ts_map.h"
#include "ts_proto.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAC "storage"

const char *const ts_store_cf_names[CF_COUNT] = {"default", "meta", "chunks", "oplog"};

#define DS_REC_LEN 40
#define SHARD_REC_LEN 40
#define CHUNK_REC_LEN 8
#define REC_VERSION 1

#define DS_BUCKETS 1024
#define DS_MAX_ENTS 4096

struct ds_ent {
    struct ds_ent *next;
    struct ts_dataset_info d;
};

/*
 * A verified chunk shared by readers through the cache: either the pinned engine buffer, or
 * (cache arena on) a copy in the arena, a memfd that the server can sendfile() from.
 */
struct chunk_entry {
    struct ts_cache_entry base;
    ts_store *s;
    rocksdb_pinnableslice_t *pin; /* NULL when the bytes live in the arena */
    const uint8_t *data;
    size_t len;
    uint32_t crc;
    int64_t arena_off; /* -1: not in the arena */
    uint32_t *sub;     /* CRC32C per TS_SUB_BLOCK of the verified bytes (cached entries) */
};

/* A complete shard's record with its CRC list (immutable once complete). */
struct shard_entry {
    struct ts_cache_entry base;
    struct ts_shard_info info;
    uint32_t crcs[];
};

#define MAX_SHARD_CHUNKS (1u << 30)

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
    uint32_t *crcs;
    uint32_t cap;
    _Atomic int superseded; /* a newer upload of the shard (or its dataset's delete) took over */
};

struct ts_read_ctx {
    ts_store *s;
    uint64_t dsid;
    struct ts_shard_info info;
    const uint32_t *crcs;   /* NULL while the shard is incomplete: per-chunk records are used */
    struct shard_entry *se; /* holds crcs */
    int nocache;            /* scrub: always read and verify what is on disk */
};

/* ---- error conversion (the RocksDB edge) ------------------------------------------------- */

int from_rocksdb(char *err, const char *what)
{
    int rc = TS_EDB;

    if (!err)
        return 0;
    /* RocksDB's Status::ToString(): "<code>: [<subcode>]<message>". Map by code (and the
     * no-space subcode), never by words that a path in the message may contain. */
    static const struct {
        const char *prefix;
        int rc;
    } codes[] = {
        {"IO error: No space left on device", TS_ENOSPC},
        {"IO error: ", TS_EIO},
        {"Corruption: ", TS_ECORRUPT},
        {"Invalid argument: ", TS_EINVAL},
        {"Resource busy: ", TS_EBUSY},
        {"Operation timed out: ", TS_EBUSY},
        {"Result incomplete: ", TS_EBUSY},
        {"Not implemented: ", TS_ENOTSUP},
    };
    for (size_t i = 0; i < TS_ARRAY_SIZE(codes); i++)
        if (!strncmp(err, codes[i].prefix, strlen(codes[i].prefix))) {
            rc = codes[i].rc;
            break;
        }
    TS_ERROR(FAC, rc, "%s: %s", what, err);
    rocksdb_free(err);
    return rc;
}

/* ---- key and record encoding ------------------------------------------------------------- */

static size_t key_ds(uint8_t *k, const char *name)
{
    size_t n = strlen(name);
    k[0] = 'D';
    memcpy(k + 1, name, n);
    return n + 1;
}

static size_t key_id(uint8_t *k, char tag, uint64_t id)
{
    k[0] = (uint8_t)tag;
    ts_put_be64(k + 1, id);
    return 9;
}

static size_t key_shard(uint8_t *k, char tag, uint64_t id, uint32_t shard)
{
    key_id(k, tag, id);
    ts_put_be32(k + 9, shard);
    return 13;
}

static size_t key_chunkrec(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx)
{
    key_shard(k, 'C', id, shard);
    ts_put_be32(k + 13, idx);
    return 17;
}

static size_t key_chunk(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx)
{
    ts_put_be64(k, id);
    ts_put_be32(k + 8, shard);
    ts_put_be32(k + 12, idx);
    return 16;
}

static void ds_encode(uint8_t *b, const struct ts_dataset_info *d)
{
    memset(b, 0, DS_REC_LEN);
    b[0] = REC_VERSION;
    b[1] = (uint8_t)d->state;
    b[2] = d->policy.core;
    b[3] = d->policy.fringe;
    b[4] = d->policy.min_core;
    ts_put_le32(b + 8, d->policy.chunk_size);
    ts_put_le64(b + 16, d->id);
    ts_put_le64(b + 24, d->created_ns);
}

static int ds_decode(const char *v, size_t len, const char *name, struct ts_dataset_info *d)
{
    const uint8_t *b = (const uint8_t *)v;

    if (len < DS_REC_LEN || b[0] != REC_VERSION)
        return TS_ECORRUPT;
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->state = b[1];
    d->policy.core = b[2];
    d->policy.fringe = b[3];
    d->policy.min_core = b[4];
    d->policy.chunk_size = ts_get_le32(b + 8);
    d->id = ts_get_le64(b + 16);
    d->created_ns = ts_get_le64(b + 24);
    return 0;
}

static void shard_encode(uint8_t *b, const struct ts_shard_info *si)
{
    memset(b, 0, SHARD_REC_LEN);
    b[0] = REC_VERSION;
    b[1] = (uint8_t)si->state;
    ts_put_le32(b + 4, si->chunk_size);
    ts_put_le64(b + 8, si->size);
    ts_put_le64(b + 16, si->expect_size);
    ts_put_le32(b + 24, si->nchunks);
    ts_put_le32(b + 28, si->crc);
    ts_put_le32(b + 32, si->nrecords);
}

static int shard_decode(const char *v, size_t len, uint32_t shard, struct ts_shard_info *si)
{
    const uint8_t *b = (const uint8_t *)v;

    if (len < SHARD_REC_LEN || b[0] != REC_VERSION)
        return TS_ECORRUPT;
    memset(si, 0, sizeof(*si));
    si->shard = shard;
    si->state = b[1];
    si->chunk_size = ts_get_le32(b + 4);
    si->size = ts_get_le64(b + 8);
    si->expect_size = ts_get_le64(b + 16);
    si->nchunks = ts_get_le32(b + 24);
    si->crc = ts_get_le32(b + 28);
    si->nrecords = ts_get_le32(b + 32);
    if (si->state == TS_SHARD_COMPLETE && len != SHARD_REC_LEN + 4 * (size_t)si->nchunks)
        return TS_ECORRUPT;
    return 0;
}

/* ---- small engine helpers ---------------------------------------------------------------- */

/* Gets a meta value into a malloc'ed buffer; TS_ENOENT if absent. */
int meta_get(ts_store *s, const uint8_t *k, size_t klen, char **val, size_t *vlen)
{
    char *err = NULL;
    *val = rocksdb_get_cf(s->db, s->ro_meta, s->cf[CF_META], (const char *)k, klen, vlen, &err);
    if (err)
        return from_rocksdb(err, "metadata read");
    return *val ? 0 : TS_ENOENT;
}

int batch_write(ts_store *s, rocksdb_writebatch_t *b, const char *what)
{
    char *err = NULL;
    rocksdb_write(s->db, s->wo, b, &err);
    return from_rocksdb(err, what);
}

static size_t ds_bucket(const char *name)
{
    return ts_crc32c(0, name, strlen(name)) & (DS_BUCKETS - 1);
}

/* Forgets a cached dataset record (after seal or delete). */
static void ds_invalidate(ts_store *s, const char *name)
{
    struct ds_ent **pp;

    pthread_mutex_lock(&s->dslock);
    s->ds_gen++;
    for (pp = &s->dstab[ds_bucket(name)]; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->d.name, name)) {
            struct ds_ent *e = *pp;
            *pp = e->next;
            free(e);
            s->ndsents--;
            break;
        }
    }
    pthread_mutex_unlock(&s->dslock);
}

static void ds_clear_locked(ts_store *s)
{
    for (size_t i = 0; i < DS_BUCKETS; i++) {
        while (s->dstab[i]) {
            struct ds_ent *e = s->dstab[i];
            s->dstab[i] = e->next;
            free(e);
        }
    }
    s->ndsents = 0;
}

static int dataset_get(ts_store *s, const char *name, struct ts_dataset_info *d)
{
    uint8_t k[1 + TS_NAME_MAX];
    struct ds_ent *e;
    uint64_t gen;
    char *v;
    size_t vlen;
    int rc;

    if (!ts_name_valid(name))
        return TS_ENAME;
    pthread_mutex_lock(&s->dslock);
    for (e = s->dstab[ds_bucket(name)]; e; e = e->next)
        if (!strcmp(e->d.name, name))
            break;
    if (e)
        *d = e->d;
    gen = s->ds_gen;
    pthread_mutex_unlock(&s->dslock);
    if (e)
        return 0;

    rc = meta_get(s, k, key_ds(k, name), &v, &vlen);
    if (rc)
        return rc;
    rc = ds_decode(v, vlen, name, d);
    rocksdb_free(v);
    if (rc)
        return rc;
    e = malloc(sizeof(*e));
    if (!e)
        return 0;
    e->d = *d;
    pthread_mutex_lock(&s->dslock);
    if (gen != s->ds_gen) {
        free(e); /* invalidated meanwhile: what we read may be stale */
    } else {
        if (s->ndsents >= DS_MAX_ENTS)
            ds_clear_locked(s);
        e->next = s->dstab[ds_bucket(name)];
        s->dstab[ds_bucket(name)] = e;
        s->ndsents++;
    }
    pthread_mutex_unlock(&s->dslock);
    return 0;
}

static int shard_get(ts_store *s, uint64_t dsid, uint32_t shard, struct ts_shard_info *si,
                     uint32_t **crcs)
{
    uint8_t k[13];
    char *v;
    size_t vlen;
    int rc;

    rc = meta_get(s, k, key_shard(k, 'S', dsid, shard), &v, &vlen);
    if (rc)
        return rc;
    rc = shard_decode(v, vlen, shard, si);
    if (rc == 0 && crcs) {
        *crcs = NULL;
        if (si->state == TS_SHARD_COMPLETE && si->nchunks) {
            *crcs = malloc(4 * (size_t)si->nchunks);
            if (!*crcs)
                rc = TS_ENOMEM;
            else
                for (uint32_t i = 0; i < si->nchunks; i++)
                    (*crcs)[i] = ts_get_le32((const uint8_t *)v + SHARD_REC_LEN + 4 * i);
        }
    }
    rocksdb_free(v);
    return rc;
}

static int writer_active(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard)
{
    for (size_t i = 0; i < s->nwriters; i++)
        if (s->writers[i].dsid == dsid && (any_shard || s->writers[i].shard == shard))
            return 1;
    return 0;
}

/* Under s->lock: the writers of dataset dsid (any_shard) or of its shard give way: each is
 * marked superseded (its next put or seal fails with TS_ESTALE, its abort only frees it) and
 * leaves the table. Returns how many. */
static size_t writers_supersede(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard)
{
    size_t n = 0;

    for (size_t i = 0; i < s->nwriters;) {
        if (s->writers[i].dsid == dsid && (any_shard || s->writers[i].shard == shard)) {
            atomic_store(&s->writers[i].w->superseded, 1);
            s->writers[i] = s->writers[--s->nwriters];
            n++;
        } else {
            i++;
        }
    }
    return n;
}

/* ---- cache arena ------------------------------------------------------------------------- */

static int arena_class(size_t len)
{
    int c = ARENA_MIN_SHIFT;
    while (c <= ARENA_MAX_SHIFT && ((size_t)1 << c) < len)
        c++;
    return c <= ARENA_MAX_SHIFT ? c - ARENA_MIN_SHIFT : -1;
}

static int arena_init(struct arena *a)
{
    a->fd = memfd_create("tessera-cache", MFD_CLOEXEC);
    a->size = ARENA_CLASS_SPAN * ARENA_CLASSES;
    if (a->fd < 0 || ftruncate(a->fd, (off_t)a->size) != 0)
        goto out_fail;
    a->base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
    if (a->base == MAP_FAILED)
        goto out_fail;
    pthread_mutex_init(&a->lock, NULL);
    return 0;
out_fail:
    TS_WARN(FAC, ts_from_errno(errno), "no cache arena (%s): cached chunks stay in engine buffers",
            strerror(errno));
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    a->base = NULL;
    return ts_from_errno(errno);
}

static void arena_fini(struct arena *a)
{
    if (a->fd < 0)
        return;
    munmap(a->base, a->size);
    close(a->fd);
    for (int i = 0; i < ARENA_CLASSES; i++)
        free(a->free[i]);
    pthread_mutex_destroy(&a->lock);
    a->fd = -1;
}

/* An offset for len bytes, or -1. */
static int64_t arena_alloc(struct arena *a, size_t len)
{
    int c = arena_class(len);
    int64_t off = -1;

    if (a->fd < 0 || c < 0)
        return -1;
    pthread_mutex_lock(&a->lock);
    if (a->nfree[c]) {
        off = (int64_t)a->free[c][--a->nfree[c]];
    } else if (a->bump[c] + ((uint64_t)1 << (c + ARENA_MIN_SHIFT)) <= ARENA_CLASS_SPAN) {
        off = (int64_t)((uint64_t)c * ARENA_CLASS_SPAN + a->bump[c]);
        a->bump[c] += (uint64_t)1 << (c + ARENA_MIN_SHIFT);
    }
    pthread_mutex_unlock(&a->lock);
    return off;
}

static void arena_release(struct arena *a, int64_t off, size_t len)
{
    int c = arena_class(len);
    size_t span = (len + 4095) & ~(size_t)4095;

    /* Give the pages back before the slot can be reused (see struct arena). If that fails,
     * the slot is never reused: a sendfile() still in flight may read its old pages. */
    if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)span) != 0) {
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            TS_WARN(FAC, ts_from_errno(errno),
                    "cache arena: cannot free a slot's pages (%s): slots are not reused",
                    strerror(errno));
        return;
    }
    pthread_mutex_lock(&a->lock);
    if (a->nfree[c] == a->capfree[c]) {
        size_t cap = a->capfree[c] ? 2 * a->capfree[c] : 64;
        uint64_t *nf = realloc(a->free[c], cap * sizeof(*nf));
        if (!nf) {
            pthread_mutex_unlock(&a->lock);
            return; /* the slot is lost to reuse; its pages are already free */
        }
        a->free[c] = nf;
        a->capfree[c] = cap;
    }
    a->free[c][a->nfree[c]++] = (uint64_t)off;
    pthread_mutex_unlock(&a->lock);
}

/* ---- open / close ------------------------------------------------------------------------ */

void ts_store_opts_init(struct ts_store_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->sync = TS_SYNC_ALWAYS;
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
    p->core = 1;
    p->fringe = 0;
    p->min_core = 1;
    p->chunk_size = TS_DEFAULT_CHUNK_SIZE;
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
            if (o->blob_files) {
                rocksdb_options_set_enable_blob_files(co, 1);
                rocksdb_options_set_min_blob_size(co, o->min_blob_size);
                rocksdb_options_set_blob_file_size(co, o->blob_file_size);
                rocksdb_options_set_blob_compression_type(co, rocksdb_no_compression);
                rocksdb_options_set_enable_blob_gc(co, 1);
                rocksdb_options_set_blob_gc_age_cutoff(co, 0.25);
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
    rocksdb_writeoptions_set_sync(s->wo, o->sync == TS_SYNC_ALWAYS);
    s->ro_chunk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(s->ro_chunk, o->verify_engine_checksums ? 1 : 0);
    TS_INFO(FAC, "opened store at %s (blob files %s, sync %s)", s->path,
            o->blob_files ? "on" : "off", o->sync == TS_SYNC_ALWAYS ? "always" : "none");
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
    pthread_mutex_destroy(&s->lock);
    free(s->path);
    free(s);
    return rc;
}

void ts_store_close(ts_store *s)
{
    if (!s)
        return;
    /* Cached chunks pin engine memory: release them before the engine closes. */
    ts_cache_destroy(s->ccache);
    arena_fini(&s->arena);
    ds_clear_locked(s);
    free(s->dstab);
    pthread_mutex_destroy(&s->dslock);
    pthread_mutex_destroy(&s->loglock);
    pthread_mutex_destroy(&s->space_lock);
    for (int i = 0; i < CF_COUNT; i++)
        rocksdb_column_family_handle_destroy(s->cf[i]);
    rocksdb_close(s->db);
    rocksdb_writeoptions_destroy(s->wo);
    rocksdb_readoptions_destroy(s->ro_meta);
    rocksdb_readoptions_destroy(s->ro_chunk);
    for (int i = 0; i < CF_COUNT; i++)
        rocksdb_options_destroy(s->cf_opts[i]);
    rocksdb_options_destroy(s->opts);
    rocksdb_block_based_options_destroy(s->bbto);
    rocksdb_cache_destroy(s->cache);
    pthread_mutex_destroy(&s->lock);
    free(s->writers);
    free(s->path);
    free(s);
}

/* ---- datasets ---------------------------------------------------------------------------- */

int ts_store_dataset_create(ts_store *s, const char *name, const struct ts_dataset_policy *p)
{
    return ts_store_dataset_create_inc(s, name, p, 0);
}

int ts_store_dataset_create_inc(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                                uint64_t incarnation)
{
    struct ts_dataset_info d, old;
    struct ts_dataset_policy def;
    uint8_t k[1 + TS_NAME_MAX], kid[9], rec[DS_REC_LEN], nbuf[8];
    char *v;
    size_t vlen;
    rocksdb_writebatch_t *b;
    uint64_t next = 1;
    int rc;

    if (!s || !ts_name_valid(name))
        return s ? TS_ENAME : TS_EINVAL;
    if (!p) {
        ts_dataset_policy_init(&def);
        p = &def;
    }
    memset(&d, 0, sizeof(d));
    d.policy = *p;
    if (!d.policy.chunk_size)
        d.policy.chunk_size = TS_DEFAULT_CHUNK_SIZE;
    if (d.policy.chunk_size < TS_MIN_CHUNK_SIZE || d.policy.chunk_size > s->o.max_chunk_size ||
        d.policy.core < 1 || d.policy.min_core < 1 || d.policy.min_core > d.policy.core)
        return TS_EINVAL;

    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &old);
    if (rc == 0) {
        rc = TS_EEXIST;
        goto out_unlock;
    }
    if (rc != TS_ENOENT)
        goto out_unlock;
    k[0] = 'N';
    rc = meta_get(s, k, 1, &v, &vlen);
    if (rc == 0) {
        if (vlen == 8)
            next = ts_get_le64((const uint8_t *)v);
        rocksdb_free(v);
    } else if (rc != TS_ENOENT) {
        goto out_unlock;
    }
    d.id = next;
    d.state = TS_DS_OPEN;
    d.created_ns = incarnation ? incarnation : ts_now_wall_ns();
    ds_encode(rec, &d);
    ts_put_le64(nbuf, next + 1);

    b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, 1, (const char *)nbuf, 8);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name),
                              (const char *)rec, sizeof(rec));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)kid, key_id(kid, 'I', d.id), name,
                              strlen(name));
    rc = batch_write(s, b, "dataset create");
    rocksdb_writebatch_destroy(b);
    if (rc == 0)
        TS_INFO(FAC, "created dataset %s (id %llu, chunk %u)", name, (unsigned long long)d.id,
                d.policy.chunk_size);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Iterates meta keys starting with prefix; cb gets key and value. */
int meta_scan(ts_store *s, const uint8_t *prefix, size_t plen,
              int (*cb)(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen),
              void *arg)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_meta, s->cf[CF_META]);
    char *err = NULL;
    int rc = 0;

    for (rocksdb_iter_seek(it, (const char *)prefix, plen); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        if (klen < plen || memcmp(k, prefix, plen) != 0)
            break;
        rc = cb(arg, (const uint8_t *)k, klen, v, vlen);
        if (rc)
            break;
    }
    rocksdb_iter_get_error(it, &err);
    if (err && rc == 0)
        rc = from_rocksdb(err, "metadata scan");
    else if (err)
        rocksdb_free(err);
    rocksdb_iter_destroy(it);
    return rc;
}

struct shard_count_arg {
    struct ts_dataset_info *d;
    int (*cb)(void *arg, const struct ts_shard_info *info);
    void *arg;
};

static int shard_scan_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct shard_count_arg *a = arg;
    struct ts_shard_info si;
    int rc;

    if (klen != 13)
        return TS_ECORRUPT;
    rc = shard_decode(v, vlen, ts_get_be32(k + 9), &si);
    if (rc)
        return rc;
    if (a->d) {
        if (si.state == TS_SHARD_COMPLETE) {
            a->d->shards++;
            a->d->bytes += si.size;
        } else {
            a->d->shards_writing++;
        }
    }
    return a->cb ? a->cb(a->arg, &si) : 0;
}

static int shard_scan(ts_store *s, uint64_t dsid, struct ts_dataset_info *d,
                      int (*cb)(void *arg, const struct ts_shard_info *info), void *arg)
{
    struct shard_count_arg a = {d, cb, arg};
    uint8_t prefix[9];
    return meta_scan(s, prefix, key_id(prefix, 'S', dsid), shard_scan_cb, &a);
}

int ts_store_dataset_stat(ts_store *s, const char *name, struct ts_dataset_info *out)
{
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    rc = dataset_get(s, name, out);
    if (rc)
        return rc;
    return shard_scan(s, out->id, out, NULL, NULL);
}

struct ds_list_arg {
    ts_store *s;
    int (*cb)(void *arg, const struct ts_dataset_info *info);
    void *arg;
};

static int ds_list_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct ds_list_arg *a = arg;
    struct ts_dataset_info d;
    char name[TS_NAME_MAX + 1];
    int rc;

    if (klen < 2 || klen - 1 > TS_NAME_MAX)
        return TS_ECORRUPT;
    memcpy(name, k + 1, klen - 1);
    name[klen - 1] = '\0';
    rc = ds_decode(v, vlen, name, &d);
    if (rc == 0)
        rc = shard_scan(a->s, d.id, &d, NULL, NULL);
    return rc ? rc : a->cb(a->arg, &d);
}

int ts_store_dataset_list(ts_store *s, int (*cb)(void *arg, const struct ts_dataset_info *info),
                          void *arg)
{
    struct ds_list_arg a = {s, cb, arg};
    uint8_t prefix = 'D';

    if (!s || !cb)
        return TS_EINVAL;
    return meta_scan(s, &prefix, 1, ds_list_cb, &a);
}

struct seal_check_arg {
    uint32_t expect;
    int rc;
};

static int seal_check_cb(void *arg, const struct ts_shard_info *si)
{
    struct seal_check_arg *a = arg;

    if (si->state != TS_SHARD_COMPLETE || si->shard != a->expect) {
        a->rc = TS_EINCOMPLETE;
        return TS_EINCOMPLETE;
    }
    a->expect++;
    return 0;
}

int ts_store_dataset_seal(ts_store *s, const char *name)
{
    return ts_store_dataset_seal_ex(s, name, 0);
}

int ts_store_dataset_seal_ex(ts_store *s, const char *name, int local_only)
{
    struct ts_dataset_info d;
    struct seal_check_arg a = {0, 0};
    uint8_t k[1 + TS_NAME_MAX], rec[DS_REC_LEN];
    rocksdb_writebatch_t *b;
    int rc;

    if (!s)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc)
        goto out_unlock;
    if (d.state == TS_DS_SEALED) {
        rc = TS_ESEALED;
        goto out_unlock;
    }
    if (writer_active(s, d.id, 1, 0)) {
        rc = TS_EINCOMPLETE;
        goto out_unlock;
    }
    rc = local_only ? 0 : shard_scan(s, d.id, NULL, seal_check_cb, &a);
    if (rc) {
        TS_WARN(FAC, rc, "dataset %s cannot be sealed: shard %u is missing or incomplete", name,
                a.expect);
        goto out_unlock;
    }
    d.state = TS_DS_SEALED;
    ds_encode(rec, &d);
    b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name),
                              (const char *)rec, sizeof(rec));
    rc = batch_write(s, b, "dataset seal");
    rocksdb_writebatch_destroy(b);
    ds_invalidate(s, name);
    if (rc == 0)
        TS_INFO(FAC, "sealed dataset %s (%u shards)", name, a.expect);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void delete_id_range(rocksdb_writebatch_t *b, rocksdb_column_family_handle_t *cf, char tag,
                            uint64_t dsid)
{
    uint8_t lo[9], hi[9];
    key_id(lo, tag, dsid);
    key_id(hi, tag, dsid + 1);
    rocksdb_writebatch_delete_range_cf(b, cf, (const char *)lo, 9, (const char *)hi, 9);
}

int ts_store_dataset_delete(ts_store *s, const char *name)
{
    return ts_store_dataset_delete_ex(s, name, 0);
}

int ts_store_dataset_delete_ex(ts_store *s, const char *name, int force)
{
    struct ts_dataset_info d;
    uint8_t k[1 + TS_NAME_MAX], kid[9], lo[8], hi[8];
    rocksdb_writebatch_t *b;
    int rc;

    if (!s)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc)
        goto out_unlock;
    if (force && writers_supersede(s, d.id, 1, 0))
        TS_INFO(FAC, "dataset %s: uploads still open end with its delete", name);
    if (writer_active(s, d.id, 1, 0)) {
        rc = TS_EBUSY;
        goto out_unlock;
    }
    b = rocksdb_writebatch_create();
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name));
    {
        /* The tombstone: replication never brings this incarnation (or an older one) back. */
        uint8_t inc[8];
        size_t klen = key_ds(k, name);
        k[0] = 'T';
        ts_put_le64(inc, d.created_ns);
        rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, klen, (const char *)inc, 8);
    }
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)kid, key_id(kid, 'I', d.id));
    delete_id_range(b, s->cf[CF_META], 'S', d.id);
    delete_id_range(b, s->cf[CF_META], 'C', d.id);
    delete_id_range(b, s->cf[CF_META], 'R', d.id);
    ts_put_be64(lo, d.id);
    ts_put_be64(hi, d.id + 1);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_CHUNKS], (const char *)lo, 8, (const char *)hi,
                                       8);
    rc = batch_write(s, b, "dataset delete");
    rocksdb_writebatch_destroy(b);
    ds_invalidate(s, name);
    ts_cache_drop_dataset(s->ccache, d.id);
    if (rc == 0)
        TS_INFO(FAC, "deleted dataset %s (id %llu)", name, (unsigned long long)d.id);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- shard writes ------------------------------------------------------------------------ */

static void shard_range_delete(ts_store *s, rocksdb_writebatch_t *b, uint64_t dsid, uint32_t shard)
{
    uint8_t lo[17], hi[17], clo[16], chi[16];

    /* Chunk records and chunks of this shard: [shard, shard+1) (shard+1 may wrap to the next
     * dataset id's prefix only when shard == UINT32_MAX, which the ranges below handle). */
    key_chunkrec(lo, dsid, shard, 0);
    key_chunkrec(hi, dsid, shard, UINT32_MAX);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_META], (const char *)lo, 17, (const char *)hi,
                                       17);
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)hi, 17);
    key_chunk(clo, dsid, shard, 0);
    key_chunk(chi, dsid, shard, UINT32_MAX);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_CHUNKS], (const char *)clo, 16,
                                       (const char *)chi, 16);
    rocksdb_writebatch_delete_cf(b, s->cf[CF_CHUNKS], (const char *)chi, 16);
}

int ts_store_shard_delete(ts_store *s, const char *dataset, uint32_t shard)
{
    struct ts_dataset_info d;
    uint8_t k[13];
    rocksdb_writebatch_t *b;
    int rc;

    if (!s || !dataset)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, dataset, &d);
    if (rc)
        goto out_unlock;
    if (writer_active(s, d.id, 0, shard)) {
        rc = TS_EBUSY;
        goto out_unlock;
    }
    b = rocksdb_writebatch_create();
    shard_range_delete(s, b, d.id, shard);
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k,
                                 key_shard(k, 'R', d.id, shard));
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k,
                                 key_shard(k, 'S', d.id, shard));
    rc = batch_write(s, b, "shard delete");
    rocksdb_writebatch_destroy(b);
    /* Cached chunks and shard records of the dataset go too (coarse, and rare: rollback). */
    ts_cache_drop_dataset(s->ccache, d.id);
    if (rc == 0)
        TS_INFO(FAC, "removed shard %s/%u", dataset, shard);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void writer_unregister(ts_store *s, ts_shard_writer *w)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nwriters; i++) {
        if (s->writers[i].w == w) {
            s->writers[i] = s->writers[--s->nwriters];
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

int ts_store_shard_begin(ts_store *s, const char *dataset, uint32_t shard, uint64_t expect_size,
                         ts_shard_writer **out)
{
    return ts_store_shard_begin_ex(s, dataset, shard, expect_size, 0, out);
}

int ts_store_shard_begin_ex(ts_store *s, const char *dataset, uint32_t shard, uint64_t expect_size,
                            int takeover, ts_shard_writer **out)
{
    struct ts_dataset_info d;
    struct ts_shard_info si;
    ts_shard_writer *w = NULL;
    uint8_t k[13], rec[SHARD_REC_LEN];
    rocksdb_writebatch_t *b;
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    *out = NULL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, dataset, &d);
    if (rc)
        goto out_unlock;
    if (d.state == TS_DS_SEALED) {
        rc = TS_ESEALED;
        goto out_unlock;
    }
    if (expect_size != TS_SIZE_UNKNOWN && expect_size &&
        (expect_size - 1) / d.policy.chunk_size >= MAX_SHARD_CHUNKS) {
        rc = TS_ETOOBIG; /* refused up front, not after 2^30 chunks */
        goto out_unlock;
    }
    if (takeover && writers_supersede(s, d.id, 0, shard))
        TS_INFO(FAC, "shard %s/%u: a newer upload takes over from one left open", dataset, shard);
    if (writer_active(s, d.id, 0, shard)) {
        rc = TS_EBUSY;
        goto out_unlock;
    }
    rc = shard_get(s, d.id, shard, &si, NULL);
    if (rc == 0 && si.state == TS_SHARD_COMPLETE) {
        rc = TS_EEXIST;
        goto out_unlock;
    }
    if (rc != 0 && rc != TS_ENOENT)
        goto out_unlock;
    if (s->nwriters == s->capwriters) {
        size_t cap = s->capwriters ? 2 * s->capwriters : 16;
        struct writer_slot *nw = realloc(s->writers, cap * sizeof(*nw));
        if (!nw) {
            rc = TS_ENOMEM;
            goto out_unlock;
        }
        s->writers = nw;
        s->capwriters = cap;
    }
    w = calloc(1, sizeof(*w));
    if (!w) {
        rc = TS_ENOMEM;
        goto out_unlock;
    }
    w->s = s;
    w->dsid = d.id;
    w->shard = shard;
    w->chunk_size = d.policy.chunk_size;
    w->expect_size = expect_size;

    memset(&si, 0, sizeof(si));
    si.state = TS_SHARD_WRITING;
    si.chunk_size = w->chunk_size;
    si.expect_size = expect_size;
    shard_encode(rec, &si);
    b = rocksdb_writebatch_create();
    shard_range_delete(s, b, d.id, shard); /* an abandoned upload of this shard, if any */
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k,
                                 key_shard(k, 'R', d.id, shard));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_shard(k, 'S', d.id, shard),
                              (const char *)rec, sizeof(rec));
    rc = batch_write(s, b, "shard begin");
    rocksdb_writebatch_destroy(b);
    if (rc) {
        free(w);
        goto out_unlock;
    }
    s->writers[s->nwriters].dsid = d.id;
    s->writers[s->nwriters].shard = shard;
    s->writers[s->nwriters].w = w;
    s->nwriters++;
    *out = w;
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ts_shard_writer_put(ts_shard_writer *w, uint32_t idx, const void *data, size_t len,
                        uint32_t crc)
{
    ts_store *s;
    struct ts_shard_info si;
    uint8_t kc[16], kr[17], ks[13], crec[CHUNK_REC_LEN], srec[SHARD_REC_LEN];
    rocksdb_writebatch_t *b;
    uint32_t got;
    int rc;

    if (!w || (!data && len))
        return TS_EINVAL;
    s = w->s;
    if (atomic_load(&w->superseded))
        return TS_ESTALE;
    if (idx != w->next)
        return TS_EINVAL;
    if (len == 0 || len > w->chunk_size || w->short_seen)
        return TS_EINVAL;
    if (w->next >= MAX_SHARD_CHUNKS)
        return TS_ETOOBIG; /* a shard of 2^30 chunks is far past any sane size */
    if (w->expect_size != TS_SIZE_UNKNOWN && w->bytes + len > w->expect_size)
        return TS_ETOOBIG;
    if (ts_space_admit(s, len, NULL, 0) != 0)
        return TS_ENOSPC; /* nothing written: the filesystem keeps its reserve */
    got = ts_crc32c(0, data, len);
    if (got != crc) {
        TS_WARN(FAC, TS_ECORRUPT, "chunk %u of shard %u arrived corrupt (crc %08x, sent %08x)", idx,
                w->shard, got, crc);
        return TS_ECORRUPT;
    }
    if (w->next == w->cap) {
        uint32_t cap = w->cap ? 2 * w->cap : 64;
        uint32_t *nc = realloc(w->crcs, 4 * (size_t)cap);
        if (!nc)
            return TS_ENOMEM;
        w->crcs = nc;
        w->cap = cap;
    }

    memset(&si, 0, sizeof(si));
    si.state = TS_SHARD_WRITING;
    si.chunk_size = w->chunk_size;
    si.expect_size = w->expect_size;
    si.size = w->bytes + len;
    si.nchunks = idx + 1;
    si.crc = ts_crc32c(w->crc, data, len);
    shard_encode(srec, &si);
    ts_put_le32(crec, crc);
    ts_put_le32(crec + 4, (uint32_t)len);

    b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, s->cf[CF_CHUNKS], (const char *)kc,
                              key_chunk(kc, w->dsid, w->shard, idx), data, len);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)kr,
                              key_chunkrec(kr, w->dsid, w->shard, idx), (const char *)crec,
                              sizeof(crec));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                              key_shard(ks, 'S', w->dsid, w->shard), (const char *)srec,
                              sizeof(srec));
    rc = batch_write(s, b, "chunk write");
    rocksdb_writebatch_destroy(b);
    if (rc)
        return rc;
    w->crcs[idx] = crc;
    w->next++;
    w->bytes += len;
    w->crc = si.crc;
    if (len < w->chunk_size)
        w->short_seen = 1;
    return 0;
}

uint64_t ts_shard_writer_bytes(const ts_shard_writer *w)
{
    return w ? w->bytes : 0;
}

uint32_t ts_shard_writer_next(const ts_shard_writer *w)
{
    return w ? w->next : 0;
}

int ts_shard_writer_seal(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                         const uint64_t *records, uint32_t nrecords)
{
    return ts_shard_writer_seal_log(w, have_crc, expect_crc, records, nrecords, NULL);
}

int ts_shard_writer_seal_log(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                             const uint64_t *records, uint32_t nrecords, struct ts_log_rec *log)
{
    ts_store *s;
    struct ts_shard_info si;
    uint8_t ks[13], lo[17], hi[17];
    uint8_t *rec = NULL, *ridx = NULL;
    size_t reclen;
    rocksdb_writebatch_t *b;
    int rc;

    if (!w || (nrecords && !records))
        return TS_EINVAL;
    s = w->s;
    if (atomic_load(&w->superseded))
        return TS_ESTALE;
    if (w->expect_size != TS_SIZE_UNKNOWN && w->bytes != w->expect_size) {
        TS_WARN(FAC, TS_EINCOMPLETE, "shard %u: %llu of %llu bytes received", w->shard,
                (unsigned long long)w->bytes, (unsigned long long)w->expect_size);
        return TS_EINCOMPLETE;
    }
    if (have_crc && expect_crc != w->crc) {
        TS_WARN(FAC, TS_ECORRUPT, "shard %u: crc %08x, sender says %08x", w->shard, w->crc,
                expect_crc);
        return TS_ECORRUPT;
    }
    for (uint32_t i = 0; i < nrecords; i++)
        if (records[i] > w->bytes || (i && records[i] < records[i - 1]))
            return TS_EINVAL;

    memset(&si, 0, sizeof(si));
    si.state = TS_SHARD_COMPLETE;
    si.chunk_size = w->chunk_size;
    si.expect_size = w->expect_size;
    si.size = w->bytes;
    si.nchunks = w->next;
    si.crc = w->crc;
    si.nrecords = nrecords;
    reclen = SHARD_REC_LEN + 4 * (size_t)w->next;
    rec = malloc(reclen);
    if (nrecords)
        ridx = malloc(8 * (size_t)nrecords);
    if (!rec || (nrecords && !ridx)) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    shard_encode(rec, &si);
    for (uint32_t i = 0; i < w->next; i++)
        ts_put_le32(rec + SHARD_REC_LEN + 4 * i, w->crcs[i]);
    for (uint32_t i = 0; i < nrecords; i++)
        ts_put_le64(ridx + 8 * i, records[i]);

    b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                              key_shard(ks, 'S', w->dsid, w->shard), (const char *)rec, reclen);
    if (nrecords)
        rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                                  key_shard(ks, 'R', w->dsid, w->shard), (const char *)ridx,
                                  8 * (size_t)nrecords);
    /* The CRC list now lives in the shard record; drop the per-chunk records. */
    key_chunkrec(lo, w->dsid, w->shard, 0);
    key_chunkrec(hi, w->dsid, w->shard, UINT32_MAX);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_META], (const char *)lo, 17, (const char *)hi,
                                       17);
    if (log) {
        log->type = TS_LOG_SEAL;
        log->size = si.size;
        log->crc = si.crc;
        log->nchunks = si.nchunks;
        rc = ts_pglog_begin(s, log, b);
        if (rc) {
            rocksdb_writebatch_destroy(b);
            goto out_free;
        }
    }
    rc = batch_write(s, b, "shard seal");
    if (log)
        ts_pglog_end(s);
    rocksdb_writebatch_destroy(b);
    if (rc)
        goto out_free;
    writer_unregister(s, w);
    free(w->crcs);
    free(w);
out_free:
    free(rec);
    free(ridx);
    return rc;
}

void ts_shard_writer_abort(ts_shard_writer *w)
{
    if (!w)
        return;
    writer_unregister(w->s, w);
    free(w->crcs);
    free(w);
}

int ts_store_dataset_get(ts_store *s, const char *name, struct ts_dataset_info *out)
{
    if (!s || !out)
        return TS_EINVAL;
    return dataset_get(s, name, out);
}

/* ---- replication helpers ------------------------------------------------------------------ */

int ts_store_tombstone(ts_store *s, const char *name, uint64_t *incarnation)
{
    uint8_t k[1 + TS_NAME_MAX];
    char *v;
    size_t vlen, klen;
    int rc;

    *incarnation = 0;
    if (!ts_name_valid(name))
        return TS_ENAME;
    klen = key_ds(k, name);
    k[0] = 'T';
    rc = meta_get(s, k, klen, &v, &vlen);
    if (rc)
        return rc;
    if (vlen == 8)
        *incarnation = ts_get_le64((const uint8_t *)v);
    rocksdb_free(v);
    return vlen == 8 ? 0 : TS_ECORRUPT;
}

struct tomb_arg {
    int (*cb)(void *arg, const char *name, uint64_t incarnation);
    void *arg;
};

static int tomb_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct tomb_arg *a = arg;
    char name[TS_NAME_MAX + 1];

    if (klen < 2 || klen - 1 > TS_NAME_MAX || vlen != 8)
        return 0;
    memcpy(name, k + 1, klen - 1);
    name[klen - 1] = '\0';
    return a->cb(a->arg, name, ts_get_le64((const uint8_t *)v));
}

int ts_store_tombstone_list(ts_store *s, int (*cb)(void *arg, const char *name, uint64_t inc),
                            void *arg)
{
    struct tomb_arg a = {cb, arg};
    uint8_t prefix = 'T';

    return meta_scan(s, &prefix, 1, tomb_cb, &a);
}

int ts_store_dataset_ensure(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                            uint64_t incarnation)
{
    struct ts_dataset_info d;
    uint64_t dead = 0;
    int rc = dataset_get(s, name, &d);

    if (rc == TS_ENOENT && incarnation && ts_store_tombstone(s, name, &dead) == 0 &&
        dead >= incarnation)
        return TS_ESTALE; /* that incarnation was deleted here: never bring it back */

    if (rc == 0 && incarnation && d.created_ns != incarnation) {
        if (d.created_ns > incarnation)
            return TS_ESTALE; /* the sender has an older incarnation than ours */
        /* Ours was deleted and the name re-created while this node was away. */
        TS_WARN(FAC, 0,
                "dataset %s here is an older incarnation (%llu) than the primary's "
                "(%llu): replacing it",
                name, (unsigned long long)d.created_ns, (unsigned long long)incarnation);
        rc = ts_store_dataset_delete(s, name);
        if (rc)
            return rc;
        rc = TS_ENOENT;
    }
    if (rc != TS_ENOENT)
        return rc;
    rc = ts_store_dataset_create_inc(s, name, p, incarnation);
    return rc == TS_EEXIST ? 0 : rc;
}

int ts_store_chunk_repair(ts_store *s, const char *dataset, uint32_t shard, uint32_t idx,
                          const void *data, size_t len)
{
    ts_read_ctx *r;
    uint32_t crc, clen;
    uint8_t k[16];
    char *err = NULL;
    int rc;

    rc = ts_store_read_open(s, dataset, shard, 0, &r);
    if (rc)
        return rc;
    rc = ts_read_ctx_chunk_crc(r, idx, &crc, &clen);
    if (rc == 0 && (clen != len || ts_crc32c(0, data, len) != crc))
        rc = TS_ECORRUPT;
    if (rc == 0) {
        rocksdb_put_cf(s->db, s->wo, s->cf[CF_CHUNKS], (const char *)k,
                       key_chunk(k, r->dsid, shard, idx), data, len, &err);
        rc = from_rocksdb(err, "chunk repair");
    }
    if (rc == 0)
        TS_WARN(FAC, 0, "repaired chunk %u of %s/%u (%zu bytes) from a replica", idx, dataset,
                shard, len);
    ts_read_ctx_close(r);
    return rc;
}

/* ---- shard metadata ---------------------------------------------------------------------- */

int ts_store_shard_stat(ts_store *s, const char *dataset, uint32_t shard, struct ts_shard_info *out)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    rc = dataset_get(s, dataset, &d);
    if (rc)
        return rc;
    return shard_get(s, d.id, shard, out, NULL);
}

int ts_store_shard_list(ts_store *s, const char *dataset,
                        int (*cb)(void *arg, const struct ts_shard_info *info), void *arg)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !cb)
        return TS_EINVAL;
    rc = dataset_get(s, dataset, &d);
    if (rc)
        return rc;
    return shard_scan(s, d.id, NULL, cb, arg);
}

int ts_store_shard_records(ts_store *s, const char *dataset, uint32_t shard, uint64_t **offsets,
                           uint32_t *n)
{
    struct ts_dataset_info d;
    struct ts_shard_info si;
    uint8_t k[13];
    char *v;
    size_t vlen;
    int rc;

    if (!s || !offsets || !n)
        return TS_EINVAL;
    *offsets = NULL;
    *n = 0;
    rc = dataset_get(s, dataset, &d);
    if (rc == 0)
        rc = shard_get(s, d.id, shard, &si, NULL);
    if (rc)
        return rc;
    if (si.state != TS_SHARD_COMPLETE)
        return TS_EINCOMPLETE;
    if (si.nrecords == 0)
        return 0;
    rc = meta_get(s, k, key_shard(k, 'R', d.id, shard), &v, &vlen);
    if (rc)
        return rc == TS_ENOENT ? TS_ECORRUPT : rc;
    if (vlen != 8 * (size_t)si.nrecords) {
        rocksdb_free(v);
        return TS_ECORRUPT;
    }
    *offsets = malloc(vlen);
    if (!*offsets) {
        rocksdb_free(v);
        return TS_ENOMEM;
    }
    for (uint32_t i = 0; i < si.nrecords; i++)
        (*offsets)[i] = ts_get_le64((const uint8_t *)v + 8 * i);
    *n = si.nrecords;
    rocksdb_free(v);
    return 0;
}

/* ---- reads ------------------------------------------------------------------------------- */

static void shard_entry_destroy(struct ts_cache_entry *e)
{
    free(e);
}

/* The complete shard's cached record, or its current record read from the engine. */
static int read_open_id(ts_store *s, uint64_t dsid, uint32_t shard, int allow_incomplete,
                        int nocache, ts_read_ctx **out)
{
    ts_read_ctx *r = calloc(1, sizeof(*r));
    struct ts_cache_entry *ce;
    uint32_t *crcs = NULL;
    int rc;

    if (!r)
        return TS_ENOMEM;
    r->s = s;
    r->dsid = dsid;
    r->nocache = nocache;
    ce = ts_cache_get(s->ccache, dsid, shard, TS_CACHE_SHARD);
    if (ce) {
        r->se = (struct shard_entry *)ce;
        r->info = r->se->info;
        r->crcs = r->se->crcs;
        *out = r;
        return 0;
    }
    rc = shard_get(s, dsid, shard, &r->info, &crcs);
    if (rc == 0 && r->info.state != TS_SHARD_COMPLETE && !allow_incomplete)
        rc = TS_EINCOMPLETE;
    if (rc == 0 && r->info.state == TS_SHARD_COMPLETE) {
        struct shard_entry *se = malloc(sizeof(*se) + 4 * (size_t)r->info.nchunks);
        if (!se) {
            rc = TS_ENOMEM;
        } else {
            memset(&se->base, 0, sizeof(se->base));
            se->base.dsid = dsid;
            se->base.shard = shard;
            se->base.idx = TS_CACHE_SHARD;
            se->base.bytes = sizeof(*se) + 4 * (size_t)r->info.nchunks;
            se->base.refs = 1;
            se->base.destroy = shard_entry_destroy;
            se->info = r->info;
            if (r->info.nchunks)
                memcpy(se->crcs, crcs, 4 * (size_t)r->info.nchunks);
            r->se = (struct shard_entry *)ts_cache_insert(s->ccache, &se->base);
            r->crcs = r->se->crcs;
        }
    }
    free(crcs);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int ts_store_read_open(ts_store *s, const char *dataset, uint32_t shard, int allow_incomplete,
                       ts_read_ctx **out)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    *out = NULL;
    rc = dataset_get(s, dataset, &d);
    if (rc)
        return rc;
    return read_open_id(s, d.id, shard, allow_incomplete, 0, out);
}

const struct ts_shard_info *ts_read_ctx_info(const ts_read_ctx *r)
{
    return &r->info;
}

static void chunk_entry_destroy(struct ts_cache_entry *e)
{
    struct chunk_entry *ce = (struct chunk_entry *)e;
    if (ce->pin)
        rocksdb_pinnableslice_destroy(ce->pin);
    if (ce->arena_off >= 0)
        arena_release(&ce->s->arena, ce->arena_off, ce->len);
    free(ce->sub);
    free(ce);
}

static void chunk_ref_fill(ts_store *s, struct chunk_entry *ce, struct ts_chunk_ref *out)
{
    out->data = ce->data;
    out->len = ce->len;
    out->crc = ce->crc;
    out->pin = &ce->base;
    out->fd = ce->arena_off >= 0 ? s->arena.fd : -1;
    out->file_off = ce->arena_off >= 0 ? (uint64_t)ce->arena_off : 0;
    out->sub = ce->sub;
}

int ts_chunk_ref_check(const struct ts_chunk_ref *ref, size_t off, size_t len)
{
    if (!ref->sub || !len)
        return 0; /* read from the engine and verified whole just now */
    for (size_t b = off / TS_SUB_BLOCK; b <= (off + len - 1) / TS_SUB_BLOCK; b++) {
        size_t bo = b * TS_SUB_BLOCK, bl = TS_MIN((size_t)TS_SUB_BLOCK, ref->len - bo);
        if (ts_crc32c(0, ref->data + bo, bl) != ref->sub[b])
            return TS_ECORRUPT;
    }
    return 0;
}

void ts_read_ctx_evict(ts_read_ctx *r, uint32_t idx)
{
    ts_cache_remove(r->s->ccache, r->dsid, r->info.shard, idx);
}

int ts_read_ctx_chunk(ts_read_ctx *r, uint32_t idx, struct ts_chunk_ref *out)
{
    ts_store *s = r->s;
    uint8_t k[17];
    uint32_t want, expect_len;
    rocksdb_pinnableslice_t *pin;
    struct chunk_entry *ce;
    struct ts_cache_entry *hit;
    char *err = NULL;
    const char *v;
    size_t vlen;

    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (idx >= r->info.nchunks)
        return TS_ERANGE;
    if (r->crcs && !r->nocache) {
        hit = ts_cache_get(s->ccache, r->dsid, r->info.shard, idx);
        if (hit) {
            chunk_ref_fill(s, (struct chunk_entry *)hit, out);
            return 0;
        }
    }
    if (r->crcs) {
        want = r->crcs[idx];
        expect_len = idx + 1 < r->info.nchunks
                         ? r->info.chunk_size
                         : (uint32_t)(r->info.size - (uint64_t)idx * r->info.chunk_size);
    } else {
        char *cv;
        size_t cvlen;
        int rc = meta_get(s, k, key_chunkrec(k, r->dsid, r->info.shard, idx), &cv, &cvlen);
        if (rc)
            return rc == TS_ENOENT ? TS_ECORRUPT : rc;
        if (cvlen != CHUNK_REC_LEN) {
            rocksdb_free(cv);
            return TS_ECORRUPT;
        }
        want = ts_get_le32((const uint8_t *)cv);
        expect_len = ts_get_le32((const uint8_t *)cv + 4);
        rocksdb_free(cv);
    }
    pin = rocksdb_get_pinned_cf(s->db, s->ro_chunk, s->cf[CF_CHUNKS], (const char *)k,
                                key_chunk(k, r->dsid, r->info.shard, idx), &err);
    if (err)
        return from_rocksdb(err, "chunk read");
    if (!pin) {
        /* Gone because the dataset was deleted meanwhile, or lost: corruption. */
        char *nv = NULL;
        size_t nvlen = 0;
        int nrc = meta_get(s, k, key_id(k, 'I', r->dsid), &nv, &nvlen);
        if (nrc == TS_ENOENT)
            return TS_ENOENT;
        if (nrc == 0)
            rocksdb_free(nv);
        TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of shard %u is missing", idx, r->info.shard);
        return TS_ECORRUPT;
    }
    v = rocksdb_pinnableslice_value(pin, &vlen);
    if (vlen != expect_len || ts_crc32c(0, v, vlen) != want) {
        TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of shard %u (dataset id %llu) fails its CRC32C", idx,
                 r->info.shard, (unsigned long long)r->dsid);
        rocksdb_pinnableslice_destroy(pin);
        return TS_ECORRUPT;
    }
    ce = malloc(sizeof(*ce));
    if (!ce) {
        rocksdb_pinnableslice_destroy(pin);
        return TS_ENOMEM;
    }
    memset(&ce->base, 0, sizeof(ce->base));
    ce->base.dsid = r->dsid;
    ce->base.shard = r->info.shard;
    ce->base.idx = idx;
    ce->base.bytes = vlen + sizeof(*ce);
    ce->base.refs = 1;
    ce->base.destroy = chunk_entry_destroy;
    ce->s = s;
    ce->pin = pin;
    ce->data = (const uint8_t *)v;
    ce->len = vlen;
    ce->crc = want;
    ce->arena_off = -1;
    ce->sub = NULL;
    /* Only verified chunks of complete (immutable) shards are shared. */
    if (r->crcs && !r->nocache) {
        int64_t off;
        /* CRCs per sub-block of the verified bytes: a partial read of the cached copy checks
         * what it touches (cheaply) before it is sent. */
        size_t nsub = (vlen + TS_SUB_BLOCK - 1) / TS_SUB_BLOCK;
        ce->sub = malloc((nsub ? nsub : 1) * sizeof(*ce->sub));
        if (!ce->sub) {
            rocksdb_pinnableslice_destroy(pin);
            free(ce);
            return TS_ENOMEM;
        }
        for (size_t b = 0; b < nsub; b++)
            ce->sub[b] = ts_crc32c(0, v + b * TS_SUB_BLOCK,
                                   TS_MIN((size_t)TS_SUB_BLOCK, vlen - b * TS_SUB_BLOCK));
        off = arena_alloc(&s->arena, vlen);
        if (off >= 0) {
            /* One copy on a miss; hits are then served from the arena (sendfile). */
            memcpy(s->arena.base + off, v, vlen);
            rocksdb_pinnableslice_destroy(pin);
            ce->pin = NULL;
            ce->data = s->arena.base + off;
            ce->arena_off = off;
        }
        hit = ts_cache_insert(s->ccache, &ce->base);
    } else {
        hit = &ce->base;
    }
    chunk_ref_fill(s, (struct chunk_entry *)hit, out);
    return 0;
}

int ts_read_ctx_chunk_crc(const ts_read_ctx *r, uint32_t idx, uint32_t *crc, uint32_t *len)
{
    if (!r->crcs)
        return TS_EINCOMPLETE;
    if (idx >= r->info.nchunks)
        return TS_ERANGE;
    *crc = r->crcs[idx];
    *len = idx + 1 < r->info.nchunks
               ? r->info.chunk_size
               : (uint32_t)(r->info.size - (uint64_t)idx * r->info.chunk_size);
    return 0;
}

void ts_chunk_pin_release(void *pin)
{
    ts_cache_unref(pin);
}

void ts_chunk_ref_release(struct ts_chunk_ref *ref)
{
    if (ref && ref->pin) {
        ts_cache_unref(ref->pin);
        ref->pin = NULL;
        ref->data = NULL;
    }
}

void ts_read_ctx_close(ts_read_ctx *r)
{
    if (!r)
        return;
    if (r->se)
        ts_cache_unref(&r->se->base);
    free(r);
}

void ts_store_cache_stats(ts_store *s, struct ts_store_cache_stats *out)
{
    struct ts_cache_stats cs;
    ts_cache_stats(s->ccache, &cs);
    out->hits = cs.hits;
    out->misses = cs.misses;
    out->evictions = cs.evictions;
    out->bytes = cs.bytes;
    out->entries = cs.entries;
    out->budget = cs.budget;
}

int ts_store_read(ts_store *s, const char *dataset, uint32_t shard, uint64_t off, size_t len,
                  void *buf, size_t *out_len)
{
    ts_read_ctx *r;
    uint8_t *dst = buf;
    size_t done = 0;
    int rc;

    if (!buf && len)
        return TS_EINVAL;
    if (out_len)
        *out_len = 0;
    rc = ts_store_read_open(s, dataset, shard, 0, &r);
    if (rc)
        return rc;
    if (off > r->info.size) {
        rc = TS_ERANGE;
        goto out_close;
    }
    if (len > r->info.size - off)
        len = (size_t)(r->info.size - off);
    while (done < len) {
        uint64_t pos = off + done;
        uint32_t idx = (uint32_t)(pos / r->info.chunk_size);
        size_t in = (size_t)(pos % r->info.chunk_size);
        struct ts_chunk_ref ref;
        size_t n;

        rc = ts_read_ctx_chunk(r, idx, &ref);
        if (rc)
            goto out_close;
        n = TS_MIN(ref.len - in, len - done);
        memcpy(dst + done, ref.data + in, n);
        ts_chunk_ref_release(&ref);
        done += n;
    }
    if (out_len)
        *out_len = done;
out_close:
    ts_read_ctx_close(r);
    return rc;
}

/* ---- scrub and PG iteration ------------------------------------------------------------ */

static int id_name(ts_store *s, uint64_t dsid, char *name)
{
    uint8_t k[9];
    char *v;
    size_t vlen;
    int rc = meta_get(s, k, key_id(k, 'I', dsid), &v, &vlen);

    if (rc)
        return rc;
    if (vlen == 0 || vlen > TS_NAME_MAX) {
        rocksdb_free(v);
        return TS_ECORRUPT;
    }
    memcpy(name, v, vlen);
    name[vlen] = '\0';
    rocksdb_free(v);
    return 0;
}

struct scrub_arg {
    ts_store *s;
    const _Atomic int *cancel;
    uint64_t only_id; /* 0: all datasets */
    void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx, int rc);
    void *arg;
    struct ts_scrub_report *rep;
};

static int scrub_shard_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct scrub_arg *a = arg;
    ts_read_ctx *r;
    char name[TS_NAME_MAX + 1] = "?";
    uint64_t dsid;
    uint32_t shard;
    int rc;

    if (klen != 13)
        return 0;
    if (a->cancel && atomic_load(a->cancel))
        return TS_ECANCELED;
    dsid = ts_get_be64(k + 1);
    shard = ts_get_be32(k + 9);
    if (a->only_id && dsid != a->only_id)
        return 0;
    id_name(a->s, dsid, name);
    rc = read_open_id(a->s, dsid, shard, 1, 1, &r);
    if (rc) {
        a->rep->corrupt++;
        if (a->cb)
            a->cb(a->arg, name, shard, UINT32_MAX, rc);
        return 0;
    }
    a->rep->shards++;
    for (uint32_t i = 0; i < r->info.nchunks; i++) {
        struct ts_chunk_ref ref;
        rc = ts_read_ctx_chunk(r, i, &ref);
        a->rep->chunks++;
        if (rc == 0) {
            a->rep->bytes += ref.len;
            ts_chunk_ref_release(&ref);
        } else {
            a->rep->corrupt++;
            if (a->cb)
                a->cb(a->arg, name, shard, i, rc);
        }
    }
    ts_read_ctx_close(r);
    return 0;
}

int ts_store_scrub(ts_store *s, const char *dataset,
                   void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx, int rc),
                   void *arg, struct ts_scrub_report *report)
{
    return ts_store_scrub_ex(s, dataset, cb, arg, report, NULL);
}

int ts_store_scrub_ex(ts_store *s, const char *dataset,
                      void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx,
                                 int rc),
                      void *arg, struct ts_scrub_report *report, const _Atomic int *cancel)
{
    struct ts_scrub_report local;
    struct scrub_arg a = {s, cancel, 0, cb, arg, report ? report : &local};
    struct ts_dataset_info d;
    uint8_t prefix[9];
    size_t plen = 1;
    int rc;

    if (!s)
        return TS_EINVAL;
    memset(a.rep, 0, sizeof(*a.rep));
    prefix[0] = 'S';
    if (dataset) {
        rc = dataset_get(s, dataset, &d);
        if (rc)
            return rc;
        a.only_id = d.id;
        plen = key_id(prefix, 'S', d.id);
    }
    rc = meta_scan(s, prefix, plen, scrub_shard_cb, &a);
    if (rc == 0)
        TS_INFO(FAC, "scrub %s: %llu shards, %llu chunks, %llu corrupt", dataset ? dataset : "all",
                (unsigned long long)a.rep->shards, (unsigned long long)a.rep->chunks,
                (unsigned long long)a.rep->corrupt);
    return rc;
}

struct pg_arg {
    ts_store *s;
    uint32_t pg, pg_count;
    int (*cb)(void *arg, const char *dataset, const struct ts_shard_info *info);
    void *arg;
};

static int pg_iter_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct pg_arg *a = arg;
    struct ts_shard_info si;
    char name[TS_NAME_MAX + 1];
    int rc;

    if (klen != 13)
        return 0;
    rc = shard_decode(v, vlen, ts_get_be32(k + 9), &si);
    if (rc || si.state != TS_SHARD_COMPLETE)
        return rc;
    rc = id_name(a->s, ts_get_be64(k + 1), name);
    if (rc)
        return rc;
    if (ts_pg_of(name, si.shard, a->pg_count) != a->pg)
        return 0;
    return a->cb(a->arg, name, &si);
}

int ts_store_pg_iter(ts_store *s, uint32_t pg, uint32_t pg_count,
                     int (*cb)(void *arg, const char *dataset, const struct ts_shard_info *info),
                     void *arg)
{
    struct pg_arg a = {s, pg, pg_count, cb, arg};
    uint8_t prefix = 'S';

    if (!s || !cb || !pg_count || pg >= pg_count)
        return TS_EINVAL;
    return meta_scan(s, &prefix, 1, pg_iter_cb, &a);
}

char *ts_store_engine_stats(ts_store *s)
{
    return s ? rocksdb_property_value(s->db, "rocksdb.stats") : NULL;
}
