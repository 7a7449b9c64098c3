/*
 * Shards, besides writing them: one shard's record (and CRC list), the walk over a dataset's
 * shards, shard stat and list, a shard's record index, removing a shard (log rollback), and the
 * walk over complete shards by PG.
 */
#include "store_internal.h"

#include "ts_map.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

int shard_get(ts_store *s, uint64_t dsid, uint32_t shard, struct ts_shard_info *si, uint32_t **crcs,
              uint32_t *file)
{
    uint8_t k[13];
    char *v;
    size_t vlen;
    int rc;

    rc = meta_get(s, k, key_shard(k, 'S', dsid, shard), &v, &vlen);
    if (rc)
        return rc;
    rc = shard_decode(v, vlen, shard, si, file);
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
    rc = shard_decode(v, vlen, ts_get_be32(k + 9), &si, NULL);
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

int shard_scan(ts_store *s, uint64_t dsid, struct ts_dataset_info *d,
               int (*cb)(void *arg, const struct ts_shard_info *info), void *arg)
{
    struct shard_count_arg a = {d, cb, arg};
    uint8_t prefix[9];
    return meta_scan(s, prefix, key_id(prefix, 'S', dsid), shard_scan_cb, &a);
}

int ts_store_shard_stat(ts_store *s, const char *dataset, uint32_t shard, struct ts_shard_info *out)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    rc = dataset_get(s, dataset, &d);
    if (rc)
        return rc;
    return shard_get(s, d.id, shard, out, NULL, NULL);
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
        rc = shard_get(s, d.id, shard, &si, NULL, NULL);
    if (rc)
        return rc;
    if (si.state != TS_SHARD_COMPLETE)
        return TS_EINCOMPLETE;
    if (si.nrecords == 0)
        return 0;
    rc = meta_get(s, k, key_shard(k, 'R', d.id, shard), &v, &vlen);
    if (rc)
        return rc == TS_ENOENT ? TS_ECORRUPT : rc;
    /* le64 offsets, then their CRC32C (an index written before it had one: offsets only). */
    if ((vlen != 8 * (size_t)si.nrecords && vlen != 8 * (size_t)si.nrecords + 4) ||
        (vlen % 8 == 4 &&
         ts_crc32c(0, v, vlen - 4) != ts_get_le32((const uint8_t *)v + vlen - 4))) {
        rocksdb_free(v);
        TS_ERROR(FAC, TS_ECORRUPT, "%s/%u: its record index fails its CRC32C", dataset, shard);
        return TS_ECORRUPT;
    }
    for (uint32_t i = 0; i < si.nrecords; i++) {
        uint64_t at = ts_get_le64((const uint8_t *)v + 8 * i);
        if (at > si.size || (i && at < ts_get_le64((const uint8_t *)v + 8 * (i - 1)))) {
            rocksdb_free(v);
            TS_ERROR(FAC, TS_ECORRUPT,
                     "%s/%u: its record index is out of order or past the shard's end", dataset,
                     shard);
            return TS_ECORRUPT;
        }
    }
    *offsets = malloc(8 * (size_t)si.nrecords);
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

void shard_range_delete(ts_store *s, rocksdb_writebatch_t *b, uint64_t dsid, uint32_t shard)
{
    uint8_t lo[17], hi[17], clo[16], chi[16];

    /* Chunk records, sub-block CRCs and chunks of this shard: [shard, shard+1) (shard+1 may wrap to
     * the next dataset id's prefix only when shard == UINT32_MAX, which the ranges below handle).
     */
    key_chunkrec(lo, dsid, shard, 0);
    key_chunkrec(hi, dsid, shard, UINT32_MAX);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_META], (const char *)lo, 17, (const char *)hi,
                                       17);
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)hi, 17);
    key_subcrc(lo, dsid, shard, 0);
    key_subcrc(hi, dsid, shard, UINT32_MAX);
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
    struct ts_shard_info si;
    uint32_t file = 0;
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
    if (shard_get(s, d.id, shard, &si, NULL, &file) != 0)
        file = 0;
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
    if (rc == 0) {
        chunkfile_unlink(s, d.id, shard, file); /* no record names it any more */
        TS_INFO(FAC, "removed shard %s/%u", dataset, shard);
    }
out_unlock:
    pthread_mutex_unlock(&s->lock);
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
    rc = shard_decode(v, vlen, ts_get_be32(k + 9), &si, NULL);
    if (rc || si.state != TS_SHARD_COMPLETE)
        return rc;
    rc = id_name(a->s, ts_get_be64(k + 1), name);
    if (rc)
        return rc;
    /* Fragments (NAME#f) are placed by their dataset's EC layout, not by PG replication. */
    if (ts_frag_split(name, NULL, NULL) || ts_pg_of(name, si.shard, a->pg_count) != a->pg)
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
