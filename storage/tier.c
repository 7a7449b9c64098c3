/*
 * A sealed dataset's tier on this node (issue 33; docs/architecture.md "Erasure-coded shards"):
 * its erasure code, and whether its replicas' bytes are dropped. Dropped, the shard records
 * stay whole (size, CRC32C, chunk CRCs, record index: PG logs, inventories and peering see the
 * same shards) and only the chunk bytes go — the chunk files, and the chunks kept in the
 * engine for small shards. Reads then answer TS_EFRAGMENTED (read.c) and the client reads the
 * fragments. Restored chunk by chunk with ts_store_chunk_repair (each checked against its
 * stored CRC32C), the bytes are kept again only once every chunk reads back whole.
 */
#include "store_internal.h"

#include <string.h>

#define FAC "storage"

/* The chunk bytes of dataset dsid: gone from the engine and the disk, and from the cache. */
static int drop_bytes(ts_store *s, const char *name, uint64_t dsid)
{
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    uint8_t lo[8], hi[8];
    int rc;

    ts_put_be64(lo, dsid);
    ts_put_be64(hi, dsid + 1);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_CHUNKS], (const char *)lo, 8, (const char *)hi,
                                       8);
    rc = batch_write(s, b, "dataset tier: replica bytes dropped");
    rocksdb_writebatch_destroy(b);
    ts_cache_drop_dataset(s->ccache, dsid);
    if (rc == 0)
        chunkfile_drop_dataset(s, dsid);
    if (rc == 0)
        TS_INFO(FAC, "dataset %s: replica bytes dropped (its fragments hold them)", name);
    return rc;
}

struct restored_arg {
    ts_store *s;
    uint64_t dsid, missing;
};

/* Counts the chunks of one shard that do not read back matching their CRC32C. */
static int restored_cb(void *arg, const struct ts_shard_info *si)
{
    struct restored_arg *a = arg;
    ts_read_ctx *r;
    int rc;

    if (si->state != TS_SHARD_COMPLETE)
        return 0; /* an upload left unfinished: no one's copy, nothing to put back */
    rc = read_open_id(a->s, a->dsid, si->shard, 0, 1, &r);
    if (rc) {
        a->missing += si->nchunks ? si->nchunks : 1;
        return 0;
    }
    for (uint32_t i = 0; i < r->info.nchunks; i++) {
        struct ts_chunk_ref ref;
        if (ts_read_ctx_chunk(r, i, &ref) == 0)
            ts_chunk_ref_release(&ref);
        else
            a->missing++;
    }
    ts_read_ctx_close(r);
    return 0;
}

int ts_store_dataset_set_tier(ts_store *s, const char *name, unsigned k, unsigned m, int dropped,
                              uint64_t *missing)
{
    struct ts_dataset_info d;
    int rc, drop = 0;

    if (missing)
        *missing = 0;
    if (!s || k > 255 || m > 255 || (!k != !m) || (dropped && !k))
        return TS_EINVAL;
    rc = dataset_get(s, name, &d);
    if (rc == 0 && d.state != TS_DS_SEALED)
        rc = TS_EINVAL;
    if (rc == 0 && d.policy.ec_dropped && (d.policy.ec_k != k || d.policy.ec_m != m))
        rc = TS_EBUSY; /* its bytes are only in fragments of this code: keep it */
    if (rc == 0 && d.policy.ec_dropped && !dropped) {
        /* Checked outside the lock (it reads every chunk); the dataset is sealed and its bytes
         * change only through chunk repair, which adds good ones. */
        struct restored_arg a = {s, d.id, 0};
        rc = shard_scan(s, d.id, NULL, restored_cb, &a);
        if (rc == 0 && a.missing)
            rc = TS_EINCOMPLETE;
        if (missing)
            *missing = a.missing;
    }
    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc == 0 && d.policy.ec_dropped && (d.policy.ec_k != k || d.policy.ec_m != m))
        rc = TS_EBUSY; /* dropped since the check above */
    if (rc == 0 && (d.policy.ec_k != k || d.policy.ec_m != m || d.policy.ec_dropped != dropped)) {
        d.policy.ec_k = (uint8_t)k;
        d.policy.ec_m = (uint8_t)m;
        d.policy.ec_dropped = (uint8_t)(dropped != 0);
        rc = ds_rewrite(s, name, &d, "dataset tier");
        if (rc == 0)
            TS_INFO(FAC, "dataset %s: %s", name,
                    dropped ? "erasure-coded, replica bytes dropped"
                    : k     ? "erasure-coded, replica bytes kept"
                            : "replicated only");
    }
    drop = rc == 0 && dropped;
    pthread_mutex_unlock(&s->lock);
    /* After the mark is durable: a node that stops midway finds the mark and drops the rest
     * when told again, never serves a shard whose bytes went. */
    return drop ? drop_bytes(s, name, d.id) : rc;
}

int ts_store_dataset_follow_dropped(ts_store *s, const char *name, unsigned k, unsigned m)
{
    struct ts_dataset_info d;
    int rc;

    if (!s || !k || !m || k > 255 || m > 255)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc == 0 && d.policy.ec_dropped && (d.policy.ec_k != k || d.policy.ec_m != m))
        rc = TS_EBUSY; /* dropped here under another code: the sender is stale, or this node */
    if (rc == 0 && (d.state != TS_DS_SEALED || !d.policy.ec_dropped)) {
        /* Marked only: bytes this node holds of the dataset stay until DATASET_TIER drops them
         * here (the sender's word is not enough to delete them). */
        d.state = TS_DS_SEALED; /* the primary's is: a dataset is tiered once sealed */
        d.policy.ec_k = (uint8_t)k;
        d.policy.ec_m = (uint8_t)m;
        d.policy.ec_dropped = 1;
        rc = ds_rewrite(s, name, &d, "dataset tier (from a primary)");
        if (rc == 0)
            TS_INFO(FAC,
                    "dataset %s: erasure-coded ec:%u+%u, replica bytes dropped (as its "
                    "primary's; bytes held here stay until it is tiered here)",
                    name, k, m);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}
