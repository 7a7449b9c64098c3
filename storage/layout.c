/*
 * The on-disk layout: column families, meta keys and the dataset, shard and chunk records
 * (encoding only; nothing here touches the engine).
 *
 * Column families:
 *   default  unused (RocksDB requires it)
 *   meta     dataset, shard and chunk-checksum records (small; block cache; verified reads)
 *   chunks   chunk bytes of shards written without chunk files (ts_store_opts.chunk_files 0,
 *            or before chunk files existed); integrated BlobDB keeps them in blob files
 *
 * A shard written with chunk files keeps its bytes in PATH/chunks/ (chunkfile.c): its record
 * names the file, and nothing of it is in the chunks column family.
 *   oplog    per-PG operation log (used by replication)
 *
 * meta keys ("id" is the dataset's 8-byte big-endian id, so a dataset's keys are contiguous):
 *   'D' name                 -> dataset record
 *   'T' name                 -> tombstone: le64 incarnation (created_ns) last deleted
 *   'I' id                   -> dataset name (reverse index for scrub and PG iteration)
 *   'N'                      -> next dataset id
 *   'S' id shard(be32)       -> shard record (+ per-chunk CRC list once complete); bytes
 *                               36..39: the chunk file's id (0: none)
 *   'C' id shard idx(be32)   -> chunk record (crc, len) while the shard is being written
 *   'R' id shard             -> record index (le64 offsets, then the u32 CRC32C of them)
 *   'B' id shard idx(be32)   -> a chunk file's chunk: le32 CRC32C of each 4 KiB sub-block
 *                               (subcrc.c; they fold to the chunk's CRC)
 * chunks keys: id shard(be32) idx(be32) -> chunk bytes
 */
#include "store_internal.h"

#include <stdio.h>
#include <string.h>

const char *const ts_store_cf_names[CF_COUNT] = {"default", "meta", "chunks", "oplog"};

/* ---- key and record encoding ------------------------------------------------------------- */

size_t key_ds(uint8_t *k, const char *name)
{
    size_t n = strlen(name);
    k[0] = 'D';
    memcpy(k + 1, name, n);
    return n + 1;
}

size_t key_id(uint8_t *k, char tag, uint64_t id)
{
    k[0] = (uint8_t)tag;
    ts_put_be64(k + 1, id);
    return 9;
}

size_t key_shard(uint8_t *k, char tag, uint64_t id, uint32_t shard)
{
    key_id(k, tag, id);
    ts_put_be32(k + 9, shard);
    return 13;
}

size_t key_chunkrec(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx)
{
    key_shard(k, 'C', id, shard);
    ts_put_be32(k + 13, idx);
    return 17;
}

size_t key_subcrc(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx)
{
    key_shard(k, 'B', id, shard);
    ts_put_be32(k + 13, idx);
    return 17;
}

size_t key_chunk(uint8_t *k, uint64_t id, uint32_t shard, uint32_t idx)
{
    ts_put_be64(k, id);
    ts_put_be32(k + 8, shard);
    ts_put_be32(k + 12, idx);
    return 16;
}

void ds_encode(uint8_t *b, const struct ts_dataset_info *d)
{
    memset(b, 0, DS_REC_LEN);
    b[0] = REC_VERSION;
    b[1] = (uint8_t)d->state;
    b[2] = d->policy.core;
    b[3] = d->policy.fringe;
    b[4] = d->policy.min_core;
    b[5] = d->policy.record_format; /* 0 in records written before it existed */
    b[6] = d->policy.ec_k;          /* 0, 0 (replicated) in records written before them */
    b[7] = d->policy.ec_m;
    ts_put_le32(b + 8, d->policy.chunk_size);
    b[12] = d->policy.ec_dropped; /* 0 in records written before it */
    ts_put_le64(b + 16, d->id);
    ts_put_le64(b + 24, d->created_ns);
}

int ds_decode(const char *v, size_t len, const char *name, struct ts_dataset_info *d)
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
    d->policy.record_format = b[5];
    d->policy.ec_k = b[6];
    d->policy.ec_m = b[7];
    d->policy.chunk_size = ts_get_le32(b + 8);
    d->policy.ec_dropped = b[12];
    d->id = ts_get_le64(b + 16);
    d->created_ns = ts_get_le64(b + 24);
    return 0;
}

void shard_encode(uint8_t *b, const struct ts_shard_info *si, uint32_t file)
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
    ts_put_le32(b + 36, file);
}

int shard_decode(const char *v, size_t len, uint32_t shard, struct ts_shard_info *si,
                 uint32_t *file)
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
    if (file)
        *file = ts_get_le32(b + 36);
    if (si->state == TS_SHARD_COMPLETE && len != SHARD_REC_LEN + 4 * (size_t)si->nchunks)
        return TS_ECORRUPT;
    return 0;
}
