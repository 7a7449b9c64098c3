/*
 * Shard writes: a writer's begin (registered in the writer table, one writer per shard; a
 * takeover supersedes the one left open), put, seal (with its log record) and abort. With
 * chunk files (the default) a chunk's bytes go to the shard's file (chunkfile.c) and only its
 * record goes through the engine. Under TS_SYNC_ALWAYS the file is synced before each chunk's
 * record; under TS_SYNC_SEAL once, before the seal's record (a chunk of an unsealed shard is
 * not durable on its own: a put is acknowledged at its seal).
 */
#include "store_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define FAC "storage"

#define MAX_SHARD_CHUNKS (1u << 30)
/* Bytes of one-chunk inline shards held in memory between their chunk and their seal, all
 * uploads together; past it a chunk is written as it comes (as a bigger shard's is). */
#define INLINE_HELD_MAX (64ull << 20)

/* ---- shard writes ------------------------------------------------------------------------ */

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

/* Whether a shard declared expect_size bytes long lives inline (chunks in the engine). */
static int fd_less(const ts_store *s, uint64_t expect_size)
{
    return s->o.chunk_files && expect_size != TS_SIZE_UNKNOWN && expect_size <= s->o.inline_max;
}

/* Adds an upload's first records to b: its shard record (writing) and no record index. */
static void begin_records(ts_shard_writer *w, rocksdb_writebatch_t *b)
{
    ts_store *s = w->s;
    struct ts_shard_info si;
    uint8_t k[13], rec[SHARD_REC_LEN];

    memset(&si, 0, sizeof(si));
    si.state = TS_SHARD_WRITING;
    si.chunk_size = w->chunk_size;
    si.expect_size = w->expect_size;
    shard_encode(rec, &si, w->file);
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k,
                                 key_shard(k, 'R', w->dsid, w->shard));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k,
                              key_shard(k, 'S', w->dsid, w->shard), (const char *)rec, sizeof(rec));
}

/* Frees a writer's memory (its held chunk given back). */
static void writer_free(ts_shard_writer *w)
{
    if (w->held) {
        atomic_fetch_sub(&w->s->inline_held, w->bytes);
        free(w->held);
    }
    chunkfile_close(&w->fd);
    pthread_mutex_destroy(&w->lock);
    free(w->crcs);
    free(w);
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
    uint32_t old_file = 0;
    rocksdb_writebatch_t *b;
    int rc, abandoned;

    if (!s || !out)
        return TS_EINVAL;
    *out = NULL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, dataset, &d);
    if (rc)
        goto out_unlock;
    if (d.state == TS_DS_SEALED && !takeover) {
        /* A PG primary's stream may fill in a shard of a sealed dataset: a backfill of what
         * the primary holds (a replica that lost it, or dropped it when the PG moved away). */
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
    rc = shard_get(s, d.id, shard, &si, NULL, &old_file);
    if (rc == 0 && si.state == TS_SHARD_COMPLETE) {
        rc = TS_EEXIST;
        goto out_unlock;
    }
    if (rc != 0 && rc != TS_ENOENT)
        goto out_unlock;
    abandoned = rc == 0; /* a record in state writing: an upload left unfinished */
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
    w->dropped = d.policy.ec_dropped;
    w->expect_size = expect_size;
    w->fd = -1;
    pthread_mutex_init(&w->lock, NULL);
    /* A small shard of a declared size lives inline (its chunks in the engine, file 0): a file
     * of its own would cost an inode's creation and deletion per shard. */
    if (s->o.chunk_files && !fd_less(s, expect_size)) {
        rc = chunkfile_create(s, d.id, shard, &w->file, &w->fd);
        if (rc) {
            free(w);
            goto out_unlock;
        }
    }

    /* A new inline shard writes nothing yet: its record goes with its first chunk written, or
     * with its seal (a shard of one chunk: one batch for the whole put). */
    w->deferred = fd_less(s, expect_size) && !abandoned;
    rc = 0;
    if (!w->deferred) {
        /* An abandoned upload of this shard (its record says writing): its chunks go. Only
         * then: a range delete per upload would pile range tombstones into the memtable, which
         * RocksDB fragments again on every read (small shards slowed down without bound). */
        b = rocksdb_writebatch_create();
        if (abandoned)
            shard_range_delete(s, b, d.id, shard);
        begin_records(w, b);
        /* Synced only where it takes over an abandoned upload (its file goes next): a new
         * upload's record need not outlive a crash, and a seal's synced write covers it (the
         * WAL replays a prefix). */
        rc = batch_write_wo(s, abandoned ? s->wo : s->wo_chunk, b, "shard begin");
        rocksdb_writebatch_destroy(b);
    }
    if (rc) {
        chunkfile_close(&w->fd);
        chunkfile_unlink(s, d.id, shard, w->file);
        pthread_mutex_destroy(&w->lock);
        free(w);
        goto out_unlock;
    }
    if (old_file != w->file)
        chunkfile_unlink(s, d.id, shard, old_file); /* an abandoned upload's file */
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
    uint32_t got, *subs = NULL;
    int rc;

    if (!w || (!data && len && !w->dropped))
        return TS_EINVAL; /* a chunk without bytes: only its record (storage/tier.c) */
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
    if (data && ts_space_admit(s, len, NULL, 0) != 0)
        return TS_ENOSPC; /* nothing written: the filesystem keeps its reserve */
    if (!data) {
        got = crc; /* the sender's record of bytes it does not hold either */
    } else if (w->fd >= 0 && w->chunk_size > TS_SUB_BLOCK) {
        /* A chunk file's chunk: its sub-block CRCs too, in the same pass (small reads). */
        subs = malloc(4 * subcrc_count(len));
        if (!subs)
            return TS_ENOMEM;
        got = subcrc_compute(data, len, subs);
    } else {
        got = ts_crc32c(0, data, len);
    }
    if (got != crc) {
        TS_WARN(FAC, TS_ECORRUPT, "chunk %u of shard %u arrived corrupt (crc %08x, sent %08x)", idx,
                w->shard, got, crc);
        free(subs);
        return TS_ECORRUPT;
    }
    if (w->next == w->cap) {
        uint32_t cap = w->cap ? 2 * w->cap : 64;
        uint32_t *nc = realloc(w->crcs, 4 * (size_t)cap);
        if (!nc) {
            rc = TS_ENOMEM;
            goto out;
        }
        w->crcs = nc;
        w->cap = cap;
    }

    memset(&si, 0, sizeof(si));
    si.state = TS_SHARD_WRITING;
    si.chunk_size = w->chunk_size;
    si.expect_size = w->expect_size;
    si.size = w->bytes + len;
    si.nchunks = idx + 1;
    si.crc = ts_crc32c_combine(w->crc, got, len); /* no second pass over the bytes */
    shard_encode(srec, &si, w->file);
    ts_put_le32(crec, crc);
    ts_put_le32(crec + 4, (uint32_t)len);

    if (w->fd >= 0 && data) {
        /* The bytes to the shard's file, durable first where the record will be. */
        rc = chunkfile_write(w->fd, data, len, (uint64_t)idx * w->chunk_size);
        if (rc == 0 && sync_chunks(s))
            rc = chunkfile_sync(w->fd);
        else if (rc == 0 && sync_seals(s))
            chunkfile_start_writeback(w->fd, (uint64_t)idx * w->chunk_size, len);
        if (rc) {
            TS_WARN(FAC, rc, "chunk %u of shard %u: the chunk file write failed", idx, w->shard);
            goto out;
        }
    }
    if (data && w->deferred && idx == 0 && len == w->expect_size &&
        atomic_fetch_add(&s->inline_held, len) + len <= INLINE_HELD_MAX) {
        /* The whole shard in one chunk: held until the seal, which writes it all at once. */
        w->held = malloc(len);
        if (!w->held) {
            atomic_fetch_sub(&s->inline_held, len);
            rc = TS_ENOMEM;
            goto out;
        }
        memcpy(w->held, data, len);
        goto done;
    } else if (data && w->deferred && idx == 0 && len == w->expect_size) {
        atomic_fetch_sub(&s->inline_held, len); /* over the bound: written now */
    }
    pthread_mutex_lock(&w->lock);
    if (atomic_load(&w->superseded)) { /* taken over while the bytes were written */
        pthread_mutex_unlock(&w->lock);
        rc = TS_ESTALE;
        goto out;
    }
    b = rocksdb_writebatch_create();
    if (w->deferred)
        begin_records(w, b); /* the record this upload's begin left for now */
    if (w->fd < 0 && data)
        rocksdb_writebatch_put_cf(b, s->cf[CF_CHUNKS], (const char *)kc,
                                  key_chunk(kc, w->dsid, w->shard, idx), data, len);
    if (subs)
        subcrc_put(s, b, w->dsid, w->shard, idx, subs, len);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)kr,
                              key_chunkrec(kr, w->dsid, w->shard, idx), (const char *)crec,
                              sizeof(crec));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                              key_shard(ks, 'S', w->dsid, w->shard), (const char *)srec,
                              sizeof(srec));
    rc = batch_write_wo(s, s->wo_chunk, b, "chunk write");
    pthread_mutex_unlock(&w->lock);
    rocksdb_writebatch_destroy(b);
    if (rc)
        goto out;
    w->deferred = 0;
done:
    w->crcs[idx] = crc;
    w->next++;
    w->bytes += len;
    w->crc = si.crc;
    if (len < w->chunk_size)
        w->short_seen = 1;
    rc = 0;
out:
    free(subs);
    return rc;
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

/* What a seal checks before it writes anything: the writer's state is unchanged on failure. */
int shard_seal_check(ts_shard_writer *w, int have_crc, uint32_t expect_crc, const uint64_t *records,
                     uint32_t nrecords)
{
    if (!w || (nrecords && !records))
        return TS_EINVAL;
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
    return 0;
}

/* A checked seal's write (with write options wo: s->wo, or unsynced under group commit); w is
 * freed on success. */
int shard_seal_write(ts_shard_writer *w, const uint64_t *records, uint32_t nrecords,
                     struct ts_log_rec *log, rocksdb_writeoptions_t *wo)
{
    ts_store *s = w->s;
    struct ts_shard_info si;
    uint8_t ks[13], lo[17];
    uint8_t *rec = NULL, *ridx = NULL;
    size_t reclen;
    rocksdb_writebatch_t *b;
    int rc;

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
        ridx = malloc(8 * (size_t)nrecords + 4);
    if (!rec || (nrecords && !ridx)) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    shard_encode(rec, &si, w->file);
    for (uint32_t i = 0; i < w->next; i++)
        ts_put_le32(rec + SHARD_REC_LEN + 4 * i, w->crcs[i]);
    for (uint32_t i = 0; i < nrecords; i++)
        ts_put_le64(ridx + 8 * i, records[i]);
    if (nrecords) /* the index carries its own CRC32C (checked by ts_store_shard_records) */
        ts_put_le32(ridx + 8 * (size_t)nrecords, ts_crc32c(0, ridx, 8 * (size_t)nrecords));

    if (w->fd >= 0 && sync_seals(s)) {
        /* Under always written chunk by chunk (once more costs nothing); under seal the
         * shard's bytes become durable here, before the record that seals them (even an
         * unsynced record may reach the disk first: the WAL is written back like any file). */
        rc = chunkfile_sync(w->fd);
        if (rc)
            goto out_free;
    }
    pthread_mutex_lock(&w->lock);
    if (atomic_load(&w->superseded)) {
        pthread_mutex_unlock(&w->lock);
        rc = TS_ESTALE;
        goto out_free;
    }
    b = rocksdb_writebatch_create();
    if (w->deferred) { /* nothing of this upload written yet: all of it in this batch */
        rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)ks,
                                     key_shard(ks, 'R', w->dsid, w->shard));
        if (w->held)
            rocksdb_writebatch_put_cf(b, s->cf[CF_CHUNKS], (const char *)lo,
                                      key_chunk(lo, w->dsid, w->shard, 0), (const char *)w->held,
                                      w->bytes);
    }
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                              key_shard(ks, 'S', w->dsid, w->shard), (const char *)rec, reclen);
    if (nrecords)
        rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)ks,
                                  key_shard(ks, 'R', w->dsid, w->shard), (const char *)ridx,
                                  8 * (size_t)nrecords + 4);
    /* The CRC list now lives in the shard record; drop the per-chunk records: exactly the
     * w->next this writer put (begin removed older ones), as point deletes, not a range
     * tombstone per seal (see begin). */
    for (uint32_t i = 0; i < w->next && !w->deferred; i++)
        rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)lo,
                                     key_chunkrec(lo, w->dsid, w->shard, i));
    if (log) {
        log->type = TS_LOG_SEAL;
        log->size = si.size;
        log->crc = si.crc;
        log->nchunks = si.nchunks;
        rc = ts_pglog_begin(s, log, b);
        if (rc) {
            pthread_mutex_unlock(&w->lock);
            rocksdb_writebatch_destroy(b);
            goto out_free;
        }
    }
    rc = batch_write_wo(s, wo, b, "shard seal");
    if (log)
        ts_pglog_end(s);
    pthread_mutex_unlock(&w->lock);
    rocksdb_writebatch_destroy(b);
    if (rc)
        goto out_free;
    writer_unregister(s, w);
    writer_free(w);
out_free:
    free(rec);
    free(ridx);
    return rc;
}

int ts_shard_writer_seal_log(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                             const uint64_t *records, uint32_t nrecords, struct ts_log_rec *log)
{
    int rc = shard_seal_check(w, have_crc, expect_crc, records, nrecords);

    return rc ? rc : shard_seal_write(w, records, nrecords, log, w->s->wo);
}

void ts_shard_writer_abort(ts_shard_writer *w)
{
    if (!w)
        return;
    writer_unregister(w->s, w);
    writer_free(w);
}
