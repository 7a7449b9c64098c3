/*
 * The plan reader's record indexes: where record k of a shard lies. A reader of record units
 * keeps the indexes of the last index_shards shards it touched (least recently used dropped),
 * so memory is per open shard, never per dataset record; a WINDOW shuffle touches one window
 * of shards at a time, a GLOBAL one may fetch an index again after dropping it.
 */
#include "reader_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* The entry of shard position i, or NULL (lock held). */
static struct index_entry *index_find(struct tessera_reader *r, uint32_t i)
{
    for (uint32_t e = 0; e < r->o.index_shards; e++)
        if (r->index[e].i == i)
            return &r->index[e];
    return NULL;
}

/* Takes offs (lock held): the least recently used entry gives way. */
static struct index_entry *index_put(struct tessera_reader *r, uint32_t i, uint64_t *offs,
                                     uint32_t n)
{
    struct index_entry *e = index_find(r, i), *old = &r->index[0];

    if (e) { /* another connection fetched it meanwhile */
        free(offs);
        return e;
    }
    for (uint32_t x = 1; x < r->o.index_shards; x++)
        if (r->index[x].used < old->used)
            old = &r->index[x];
    free(old->offs);
    old->i = i;
    old->offs = offs;
    old->n = n;
    r->st.index_loads++;
    return old;
}

/* The range of record `index` from a shard's entry (lock held). */
static int index_range(struct tessera_reader *r, struct index_entry *e, uint64_t index,
                       uint64_t *off, size_t *len, char *msg, size_t cap)
{
    uint64_t end, size = r->recs->bytes[e->i];

    e->used = ++r->index_clock;
    if (index >= e->n) {
        snprintf(msg, cap, "record %llu is past the %u records of its index",
                 (unsigned long long)index, e->n);
        return TS_ERANGE;
    }
    end = index + 1 < e->n ? e->offs[index + 1] : size;
    if (e->offs[index] > end || end > size) {
        snprintf(msg, cap, "the record index does not fit the shard (%llu bytes)",
                 (unsigned long long)size);
        return TS_EPROTO;
    }
    *off = e->offs[index];
    *len = (size_t)(end - e->offs[index]);
    return 0;
}

int ts_reader_record_range(struct tessera_reader *r, tessera_client *c, uint32_t i, uint64_t index,
                           uint64_t *off, size_t *len, char *msg, size_t cap)
{
    struct index_entry *e;
    uint64_t *offs = NULL;
    uint32_t n = 0;
    int rc;

    pthread_mutex_lock(&r->m);
    e = index_find(r, i);
    if (e) {
        rc = index_range(r, e, index, off, len, msg, cap);
        pthread_mutex_unlock(&r->m);
        return rc;
    }
    pthread_mutex_unlock(&r->m);
    rc = tessera_shard_records(c, r->dataset, r->recs->shard[i], &offs, &n);
    if (rc) {
        snprintf(msg, cap, "reading its record index: %s",
                 tessera_client_error(c)[0] ? tessera_client_error(c) : ts_strerror(rc));
        return rc;
    }
    if (n != r->recs->count[i]) {
        free(offs);
        snprintf(msg, cap, "its record index holds %u records, the shard list said %llu", n,
                 (unsigned long long)r->recs->count[i]);
        return TS_EPROTO;
    }
    pthread_mutex_lock(&r->m);
    e = index_put(r, i, offs, n);
    rc = index_range(r, e, index, off, len, msg, cap);
    pthread_mutex_unlock(&r->m);
    return rc;
}

int ts_reader_locate(struct tessera_reader *r, tessera_client *c, uint64_t k,
                     struct ts_unit_loc *out, char *msg, size_t cap)
{
    const struct tessera_dataset_records *d = r->recs;
    uint64_t u;
    size_t lo;
    int rc = tessera_plan_unit(r->plan, ts_reader_plan_pos(r, k), &u);

    if (rc) {
        snprintf(msg, cap, "the plan has no position %llu", (unsigned long long)k);
        return rc;
    }
    out->unit = u;
    if (r->o.unit == TESSERA_UNIT_SHARD) {
        out->shard = d->shard[u];
        out->record = 0;
        out->offset = 0;
        out->len = (size_t)d->bytes[u];
        return 0;
    }
    lo = ts_dataset_records_pos(d, u);
    if (lo == d->nshards)
        return TS_ERANGE;
    out->shard = d->shard[lo];
    out->record = u - d->first[lo];
    return ts_reader_record_range(r, c, (uint32_t)lo, out->record, &out->offset, &out->len, msg,
                                  cap);
}

void ts_reader_index_free(struct tessera_reader *r)
{
    if (!r->index)
        return;
    for (uint32_t e = 0; e < r->o.index_shards; e++)
        free(r->index[e].offs);
    free(r->index);
    r->index = NULL;
}
