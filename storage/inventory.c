/*
 * A PG's inventory: how many complete shards this node holds of it, and an order-independent
 * digest of what they are (dataset and incarnation, shard, size, CRC32C). Two replicas that
 * hold the same shards of a PG have the same inventory; scrub compares a replica's with its
 * primary's to find shards a damaged replica lost without its log knowing.
 */
#include "ts_store.h"

#include <string.h>

struct inv {
    ts_store *s;
    int rank;
    ts_store_extra_fn extra;
    void *arg;
    uint64_t count, digest;
};

static int inv_cb(void *arg, const char *dataset, const struct ts_shard_info *si)
{
    struct inv *v = arg;
    struct ts_dataset_info d;
    uint8_t b[32];
    uint32_t lo, hi;

    if (ts_store_dataset_get(v->s, dataset, &d) != 0)
        return 0;
    if (v->rank >=
        d.policy.core + d.policy.fringe + (v->extra ? (int)v->extra(v->arg, dataset) : 0))
        return 0; /* the replica at that rank holds none of this dataset */
    ts_put_le64(b, d.created_ns);
    ts_put_le32(b + 8, si->shard);
    ts_put_le64(b + 12, si->size);
    ts_put_le32(b + 20, si->crc);
    lo = ts_crc32c(ts_crc32c(0, dataset, strlen(dataset)), b, 24);
    hi = ts_crc32c(lo ^ 0x9e3779b9u, b, 24);
    v->count++;
    v->digest += ((uint64_t)hi << 32) | lo; /* a sum: the order of the walk does not matter */
    return 0;
}

int ts_store_pg_inventory(ts_store *s, uint32_t pg, uint32_t pg_count, int rank,
                          ts_store_extra_fn extra, void *arg, uint64_t *count, uint64_t *digest)
{
    struct inv v = {s, rank, extra, arg, 0, 0};
    int rc = ts_store_pg_iter(s, pg, pg_count, inv_cb, &v);

    *count = v.count;
    *digest = v.digest;
    return rc;
}
