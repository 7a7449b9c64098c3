/*
 * Sub-block checksums on disk: a chunk in a chunk file also keeps the CRC32C of each
 * TS_SUB_BLOCK (4 KiB) of it, so a small read (a 4-100 KiB record) reads and verifies only the
 * sub-blocks it touches instead of its whole chunk (piece.c).
 *
 * They are computed in the one pass that verifies the chunk as it arrives: the sub-block CRCs,
 * folded together (ts_crc32c_combine), are the chunk's CRC, which is compared with the one the
 * sender computed. So they are as trustworthy as the chunk CRC: when loaded they are folded
 * again and must give the chunk CRC of the shard record, or they are not used (the read falls
 * back to the whole chunk). Kept under meta key 'B' id shard idx (layout.c), written with the
 * chunk record, removed with the shard.
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

size_t subcrc_count(size_t len)
{
    return (len + TS_SUB_BLOCK - 1) / TS_SUB_BLOCK;
}

/* The CRC of a chunk of len bytes from the CRCs of its sub-blocks. */
static uint32_t fold(const uint32_t *subs, size_t len)
{
    size_t n = subcrc_count(len);
    uint32_t crc = n ? subs[0] : 0;

    for (size_t b = 1; b < n; b++) {
        size_t bl = TS_MIN((size_t)TS_SUB_BLOCK, len - b * TS_SUB_BLOCK);
        crc = bl == TS_SUB_BLOCK ? ts_crc32c_combine_4k(crc, subs[b])
                                 : ts_crc32c_combine(crc, subs[b], bl);
    }
    return crc;
}

uint32_t subcrc_compute(const uint8_t *data, size_t len, uint32_t *subs)
{
    size_t n = subcrc_count(len);

    for (size_t b = 0; b < n; b++)
        subs[b] = ts_crc32c(0, data + b * TS_SUB_BLOCK,
                            TS_MIN((size_t)TS_SUB_BLOCK, len - b * TS_SUB_BLOCK));
    return fold(subs, len);
}

void subcrc_put(ts_store *s, rocksdb_writebatch_t *b, uint64_t dsid, uint32_t shard, uint32_t idx,
                const uint32_t *subs, size_t len)
{
    size_t n = subcrc_count(len);
    uint8_t k[17], *v = malloc(4 * n);

    if (!v)
        return; /* reads of this chunk then read it whole */
    for (size_t i = 0; i < n; i++)
        ts_put_le32(v + 4 * i, subs[i]);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_subcrc(k, dsid, shard, idx),
                              (const char *)v, 4 * n);
    free(v);
}

int subcrc_load(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx, uint32_t chunk_crc,
                size_t len, uint32_t **out)
{
    size_t n = subcrc_count(len), vlen;
    uint8_t k[17];
    uint32_t *subs;
    char *v;
    int rc = meta_get(s, k, key_subcrc(k, dsid, shard, idx), &v, &vlen);

    *out = NULL;
    if (rc)
        return rc; /* TS_ENOENT: written before sub-block CRCs, or not in a chunk file */
    if (vlen != 4 * n || !(subs = malloc(4 * n))) {
        rocksdb_free(v);
        return vlen != 4 * n ? TS_ECORRUPT : TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        subs[i] = ts_get_le32((const uint8_t *)v + 4 * i);
    rocksdb_free(v);
    if (fold(subs, len) != chunk_crc) {
        TS_WARN(FAC, TS_ECORRUPT,
                "sub-block CRCs of chunk %u of shard %u (dataset id %llu) do not fold to its CRC: "
                "read whole",
                idx, shard, (unsigned long long)dsid);
        free(subs);
        return TS_ECORRUPT;
    }
    *out = subs;
    return 0;
}
