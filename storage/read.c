/*
 * Reads: read contexts over a shard, chunk reads verified against their CRC32C, the cache of
 * verified chunks (in the arena when there is one) and of complete shards' records, range
 * reads.
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

/*
 * A verified chunk shared by readers through the cache: the pinned engine buffer, a buffer
 * of its own (read from a chunk file), or (cache arena on) a copy in the arena, a memfd that
 * the server can sendfile() from.
 */
struct chunk_entry {
    struct ts_cache_entry base;
    ts_store *s;
    rocksdb_pinnableslice_t *pin; /* NULL when the bytes live in the arena or in heap */
    uint8_t *heap;                /* the bytes, read from a chunk file (else NULL) */
    const uint8_t *data;
    size_t len;
    uint32_t crc;
    int64_t arena_off; /* -1: not in the arena */
    _Atomic int lent;  /* its arena bytes went out by sendfile() (ts_chunk_ref_lend) */
    uint32_t *sub;     /* CRC32C per TS_SUB_BLOCK of the verified bytes (cached entries) */
};

/* A complete shard's record with its CRC list (immutable once complete). */
struct shard_entry {
    struct ts_cache_entry base;
    struct ts_shard_info info;
    uint32_t file;
    uint32_t crcs[];
};

/* ---- reads ------------------------------------------------------------------------------- */

static void shard_entry_destroy(struct ts_cache_entry *e)
{
    free(e);
}

/* The complete shard's cached record, or its current record read from the engine. */
int read_open_id(ts_store *s, uint64_t dsid, uint32_t shard, int allow_incomplete, int nocache,
                 ts_read_ctx **out)
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
        r->file = r->se->file;
        r->crcs = r->se->crcs;
        *out = r;
        return 0;
    }
    rc = shard_get(s, dsid, shard, &r->info, &crcs, &r->file);
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
            se->file = r->file;
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
    if (d.policy.ec_dropped) { /* its bytes are in its fragments only (tier.c) */
        struct ts_shard_info si;
        rc = shard_get(s, d.id, shard, &si, NULL, NULL);
        return rc ? rc : TS_EFRAGMENTED;
    }
    return read_open_id(s, d.id, shard, allow_incomplete, 0, out);
}

int ts_store_records_open(ts_store *s, const char *dataset, uint32_t shard, ts_read_ctx **out)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    *out = NULL;
    rc = dataset_get(s, dataset, &d);
    return rc ? rc : read_open_id(s, d.id, shard, 0, 1, out);
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
        arena_release(&ce->s->arena, ce->arena_off, ce->len, atomic_load(&ce->lent));
    free(ce->heap);
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

/* TS_ENOENT when dataset dsid is gone (deleted while it was read), else TS_ECORRUPT: a chunk
 * its records name is missing. */
static int chunk_missing(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    uint8_t k[9];
    char *nv = NULL;
    size_t nvlen = 0;
    int nrc = meta_get(s, k, key_id(k, 'I', dsid), &nv, &nvlen);

    if (nrc == TS_ENOENT)
        return TS_ENOENT;
    if (nrc == 0)
        rocksdb_free(nv);
    TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of shard %u is missing", idx, shard);
    return TS_ECORRUPT;
}

static struct chunk_entry *chunk_entry_new(ts_read_ctx *r, uint32_t idx, const uint8_t *data,
                                           size_t len, uint32_t crc)
{
    struct chunk_entry *ce = malloc(sizeof(*ce));

    if (!ce)
        return NULL;
    memset(ce, 0, sizeof(*ce));
    ce->base.dsid = r->dsid;
    ce->base.shard = r->info.shard;
    ce->base.idx = idx;
    ce->base.bytes = len + sizeof(*ce);
    ce->base.refs = 1;
    ce->base.destroy = chunk_entry_destroy;
    ce->s = r->s;
    ce->data = data;
    ce->len = len;
    ce->crc = crc;
    ce->arena_off = -1;
    return ce;
}

/* A verified chunk into the cache; the entry to use, referenced. */
static struct ts_cache_entry *cache_insert(ts_read_ctx *r, struct ts_cache_entry *e)
{
    if (r->wanted || want_check(r->s, r->dsid, e->shard, e->idx))
        return ts_cache_insert_wanted(r->s->ccache, e);
    return ts_cache_insert(r->s->ccache, e);
}

/* Chunk idx of a shard with a chunk file: read straight into the arena when it will be cached
 * (one copy), verified against its CRC32C. */
static int chunk_read_file(ts_read_ctx *r, uint32_t idx, uint32_t want, uint32_t len,
                           struct ts_chunk_ref *out)
{
    ts_store *s = r->s;
    int cache = r->crcs && !r->nocache, rc;
    int64_t off = cache ? arena_alloc(&s->arena, len) : -1;
    uint8_t *buf = off >= 0 ? s->arena.base + off : malloc(len ? len : 1);
    struct ts_cache_entry *hit;
    struct chunk_entry *ce;
    uint32_t *subs = NULL;

    if (!buf)
        return TS_ENOMEM;
    rc = chunkfile_read(s, r->dsid, r->info.shard, r->file, (uint64_t)idx * r->info.chunk_size, buf,
                        len);
    if (rc == TS_ENOENT) {
        /* The shard was deleted (and maybe written again) since this record was read: forget
         * the cached record, so the next read context reads the current one. */
        ts_cache_remove(s->ccache, r->dsid, r->info.shard, TS_CACHE_SHARD);
        rc = chunk_missing(s, r->dsid, r->info.shard, idx);
    }
    if (rc == 0) {
        atomic_fetch_add_explicit(&s->rd_chunks, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->rd_chunk_bytes, len, memory_order_relaxed);
    }
    if (rc == 0 && cache && !(subs = malloc(4 * subcrc_count(len))))
        rc = TS_ENOMEM;
    /* To be cached: the sub-block CRCs from the same pass that verifies the chunk. */
    if (rc == 0 && (subs ? subcrc_compute(buf, len, subs) : ts_crc32c(0, buf, len)) != want) {
        TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of shard %u (dataset id %llu) fails its CRC32C", idx,
                 r->info.shard, (unsigned long long)r->dsid);
        rc = TS_ECORRUPT;
    }
    ce = rc ? NULL : chunk_entry_new(r, idx, buf, len, want);
    if (!rc && !ce)
        rc = TS_ENOMEM;
    if (ce) {
        ce->arena_off = off;
        ce->heap = off >= 0 ? NULL : buf;
        ce->sub = subs;
        subs = NULL;
    }
    free(subs);
    if (rc) {
        if (off >= 0)
            arena_release(&s->arena, off, len, 0);
        else
            free(buf);
        return rc;
    }
    hit = cache ? cache_insert(r, &ce->base) : &ce->base;
    chunk_ref_fill(s, (struct chunk_entry *)hit, out);
    return 0;
}

/* The same, one fill of a chunk at a time: a reader that waited for another's fill of it takes
 * the cached copy (fill.c). */
static int chunk_from_file(ts_read_ctx *r, uint32_t idx, uint32_t want, uint32_t len,
                           struct ts_chunk_ref *out)
{
    int mine, rc;

    if (!r->crcs || r->nocache)
        return chunk_read_file(r, idx, want, len, out);
    mine = fill_begin(r->s, r->dsid, r->info.shard, idx);
    if (!mine && read_cached_chunk(r, idx, out) == 0)
        return 0;
    rc = chunk_read_file(r, idx, want, len, out);
    if (mine)
        fill_end(r->s, r->dsid, r->info.shard, idx);
    return rc;
}

int ts_chunk_ref_check(const struct ts_chunk_ref *ref, size_t off, size_t len)
{
    uint32_t crc;

    return ts_chunk_ref_check_crc(ref, off, len, &crc);
}

/* The CRC of [s, e) of sub-block b (at bo, bl bytes long) and a check of the whole block from the
 * CRCs of its parts: one pass over the block's bytes. */
static int block_check(const struct ts_chunk_ref *ref, size_t b, size_t bo, size_t bl, size_t s,
                       size_t e, uint32_t *mid)
{
    const uint8_t *d = ref->data;
    uint32_t whole;

    *mid = ts_crc32c(0, d + s, e - s);
    whole = *mid;
    if (s > bo)
        whole = ts_crc32c_combine(ts_crc32c(0, d + bo, s - bo), whole, e - s);
    if (e < bo + bl)
        whole = ts_crc32c_combine(whole, ts_crc32c(0, d + e, bo + bl - e), bo + bl - e);
    return whole == ref->sub[b] ? 0 : TS_ECORRUPT;
}

int ts_chunk_ref_check_crc(const struct ts_chunk_ref *ref, size_t off, size_t len, uint32_t *crc)
{
    size_t end;
    uint32_t acc = 0;

    off -= ref->base; /* offsets into ref->data from here on */
    if (!ref->sub || !len) {
        *crc = ts_crc32c(0, ref->data + off, len);
        return 0; /* read from the engine and verified whole just now */
    }
    end = off + len;
    for (size_t b = off / TS_SUB_BLOCK; b * TS_SUB_BLOCK < end; b++) {
        size_t bo = b * TS_SUB_BLOCK, bl = TS_MIN((size_t)TS_SUB_BLOCK, ref->len - bo);
        size_t s = TS_MAX(off, bo), e = TS_MIN(end, bo + bl);
        uint32_t mid;

        if (block_check(ref, b, bo, bl, s, e, &mid) != 0)
            return TS_ECORRUPT;
        if (s == off)
            acc = mid;
        else
            acc = e - s == TS_SUB_BLOCK ? ts_crc32c_combine_4k(acc, mid)
                                        : ts_crc32c_combine(acc, mid, e - s);
    }
    *crc = acc;
    return 0;
}

void ts_read_ctx_evict(ts_read_ctx *r, uint32_t idx)
{
    ts_cache_remove(r->s->ccache, r->dsid, r->info.shard, idx);
}

int read_cached_chunk(ts_read_ctx *r, uint32_t idx, struct ts_chunk_ref *out)
{
    struct ts_cache_entry *hit;

    if (!r->crcs || r->nocache)
        return TS_ENOENT;
    hit = ts_cache_get(r->s->ccache, r->dsid, r->info.shard, idx);
    if (!hit)
        return TS_ENOENT;
    memset(out, 0, sizeof(*out));
    chunk_ref_fill(r->s, (struct chunk_entry *)hit, out);
    return 0;
}

uint32_t read_chunk_len(const ts_read_ctx *r, uint32_t idx)
{
    return idx + 1 < r->info.nchunks
               ? r->info.chunk_size
               : (uint32_t)(r->info.size - (uint64_t)idx * r->info.chunk_size);
}

int ts_read_ctx_chunk(ts_read_ctx *r, uint32_t idx, struct ts_chunk_ref *out)
{
    ts_store *s = r->s;
    uint8_t k[17];
    uint32_t want, expect_len;
    rocksdb_pinnableslice_t *pin;
    struct chunk_entry *ce;
    uint32_t *subs = NULL;
    struct ts_cache_entry *hit;
    char *err = NULL;
    const char *v;
    size_t vlen;

    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (idx >= r->info.nchunks)
        return TS_ERANGE;
    if (read_cached_chunk(r, idx, out) == 0)
        return 0;
    if (r->crcs) {
        want = r->crcs[idx];
        expect_len = read_chunk_len(r, idx);
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
    if (r->file)
        return chunk_from_file(r, idx, want, expect_len, out);
    pin = rocksdb_get_pinned_cf(s->db, s->ro_chunk, s->cf[CF_CHUNKS], (const char *)k,
                                key_chunk(k, r->dsid, r->info.shard, idx), &err);
    if (err)
        return from_rocksdb(err, "chunk read");
    if (!pin) /* gone because the dataset was deleted meanwhile, or lost: corruption */
        return chunk_missing(s, r->dsid, r->info.shard, idx);
    v = rocksdb_pinnableslice_value(pin, &vlen);
    atomic_fetch_add_explicit(&s->rd_chunks, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->rd_chunk_bytes, vlen, memory_order_relaxed);
    /* Only verified chunks of complete (immutable) shards are shared; those get their sub-block
     * CRCs from the pass that verifies them. */
    if (r->crcs && !r->nocache && !(subs = malloc(4 * subcrc_count(vlen)))) {
        rocksdb_pinnableslice_destroy(pin);
        return TS_ENOMEM;
    }
    if (vlen != expect_len ||
        (subs ? subcrc_compute((const uint8_t *)v, vlen, subs) : ts_crc32c(0, v, vlen)) != want) {
        TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of shard %u (dataset id %llu) fails its CRC32C", idx,
                 r->info.shard, (unsigned long long)r->dsid);
        rocksdb_pinnableslice_destroy(pin);
        free(subs);
        return TS_ECORRUPT;
    }
    ce = chunk_entry_new(r, idx, (const uint8_t *)v, vlen, want);
    if (!ce) {
        rocksdb_pinnableslice_destroy(pin);
        free(subs);
        return TS_ENOMEM;
    }
    ce->pin = pin;
    ce->sub = subs;
    if (subs) {
        int64_t off = arena_alloc(&s->arena, vlen);
        if (off >= 0) {
            /* One copy on a miss; hits are then served from the arena (sendfile). */
            memcpy(s->arena.base + off, v, vlen);
            rocksdb_pinnableslice_destroy(pin);
            ce->pin = NULL;
            ce->data = s->arena.base + off;
            ce->arena_off = off;
        }
        hit = cache_insert(r, &ce->base);
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
    *len = read_chunk_len(r, idx);
    return 0;
}

void ts_chunk_ref_lend(struct ts_chunk_ref *ref)
{
    if (ref->fd >= 0 && ref->pin) /* arena bytes: the pin is a chunk entry's */
        atomic_store(&((struct chunk_entry *)ref->pin)->lent, 1);
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
    out->small_bytes = cs.small_bytes;
    out->main_bytes = cs.main_bytes;
    out->ghost_hits = cs.ghost_hits;
    pthread_mutex_lock(&s->arena.lock);
    out->arena_reused = s->arena.reused_kept;
    out->arena_punched = s->arena.punches;
    pthread_mutex_unlock(&s->arena.lock);
}

int ts_store_prefetch(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_chunk_ref ref;
    ts_read_ctx *r;
    int rc = read_open_id(s, dsid, shard, 0, 0, &r);

    if (rc)
        return rc;
    r->wanted = 1;
    rc = idx < r->info.nchunks ? 0 : TS_ERANGE;
    if (rc == 0 && read_cached_chunk(r, idx, &ref) == 0)
        rc = TS_EEXIST;
    else if (rc == 0)
        rc = ts_read_ctx_chunk(r, idx, &ref);
    if (rc == 0 || rc == TS_EEXIST)
        ts_chunk_ref_release(&ref);
    ts_read_ctx_close(r);
    return rc;
}

void ts_store_read_stats(ts_store *s, struct ts_store_read_stats *out)
{
    out->chunks = atomic_load_explicit(&s->rd_chunks, memory_order_relaxed);
    out->chunk_bytes = atomic_load_explicit(&s->rd_chunk_bytes, memory_order_relaxed);
    out->pieces = atomic_load_explicit(&s->rd_pieces, memory_order_relaxed);
    out->piece_bytes = atomic_load_explicit(&s->rd_piece_bytes, memory_order_relaxed);
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
