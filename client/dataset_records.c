/*
 * A dataset's records as plan units (tessera_dataset_records, include/tessera/tessera.h): the
 * shard list with record counts, and record number -> (shard, index) by binary search over the
 * shards' first record numbers. Memory per shard, never per record.
 */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

static int by_shard(const void *a, const void *b)
{
    uint32_t x = ((const struct ts_shard_info *)a)->shard,
             y = ((const struct ts_shard_info *)b)->shard;
    return x < y ? -1 : x > y;
}

void tessera_dataset_records_free(struct tessera_dataset_records *r)
{
    if (!r)
        return;
    free(r->shard);
    free(r->count);
    free(r->first);
    free(r->bytes);
    free(r);
}

int tessera_dataset_records(tessera_client *c, const char *name,
                            struct tessera_dataset_records **out)
{
    struct tessera_dataset_records *r;
    struct ts_shard_info *v = NULL;
    size_t n = 0;
    int rc;

    if (!out)
        return TS_EINVAL;
    *out = NULL;
    rc = tessera_shard_list(c, name, &v, &n);
    if (rc)
        return rc;
    qsort(v, n, sizeof(*v), by_shard);
    r = calloc(1, sizeof(*r));
    if (r) {
        r->shard = calloc(n ? n : 1, sizeof(*r->shard));
        r->count = calloc(n ? n : 1, sizeof(*r->count));
        r->first = calloc(n ? n : 1, sizeof(*r->first));
        r->bytes = calloc(n ? n : 1, sizeof(*r->bytes));
    }
    if (!r || !r->shard || !r->count || !r->first || !r->bytes) {
        tessera_dataset_records_free(r);
        free(v);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (v[i].state != TS_SHARD_COMPLETE)
            continue; /* only what a job can read */
        r->shard[r->nshards] = v[i].shard;
        r->count[r->nshards] = v[i].nrecords;
        r->first[r->nshards] = r->total;
        r->bytes[r->nshards] = v[i].size;
        r->total += v[i].nrecords;
        r->nshards++;
    }
    free(v);
    {
        struct ts_dataset_info di;
        rc = tessera_dataset_stat(c, name, &di);
        r->format = rc ? 0 : di.policy.record_format;
    }
    if (rc) {
        tessera_dataset_records_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

size_t ts_dataset_records_pos(const struct tessera_dataset_records *r, uint64_t u)
{
    size_t lo = 0, hi = r->nshards;

    /* The last shard whose first record is <= u and that has records. */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->first[mid] <= u)
            lo = mid;
        else
            hi = mid;
    }
    while (lo < r->nshards && (r->count[lo] == 0 || u - r->first[lo] >= r->count[lo]))
        lo++; /* past shards without records */
    return lo;
}

int tessera_dataset_record_at(const struct tessera_dataset_records *r, uint64_t u, uint32_t *shard,
                              uint64_t *index)
{
    size_t i;

    if (!r || !shard || !index)
        return TS_EINVAL;
    if (u >= r->total)
        return TS_ERANGE;
    i = ts_dataset_records_pos(r, u);
    *shard = r->shard[i];
    *index = u - r->first[i];
    return 0;
}
