/* Hotness over a sliding window: per PG, per dataset, and a Space-Saving sketch of shards. */
#include "hotness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUCKET_NS ((uint64_t)TSD_HOT_BUCKET_S * 1000000000ull)

struct sk_entry {
    char dataset[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t bytes;
};

struct bucket {
    uint64_t id; /* now / BUCKET_NS when it was filled; 0: empty */
    uint64_t *pg_bytes, *pg_reads;
    struct tsd_hot_ds ds[TSD_HOT_MAX_DS];
    size_t nds;
    struct sk_entry sk[TSD_HOT_SKETCH];
    size_t nsk;
};

struct tsd_hot {
    uint32_t npg;
    uint64_t cur, start_ns;
    struct bucket b[TSD_HOT_BUCKETS];
};

static void bucket_clear(struct tsd_hot *h, struct bucket *b, uint64_t id)
{
    b->id = id;
    if (h->npg) {
        memset(b->pg_bytes, 0, h->npg * sizeof(uint64_t));
        memset(b->pg_reads, 0, h->npg * sizeof(uint64_t));
    }
    b->nds = 0;
    b->nsk = 0;
}

int tsd_hot_set_npg(struct tsd_hot *h, uint32_t npg)
{
    for (int i = 0; i < TSD_HOT_BUCKETS; i++) {
        uint64_t *pb = npg ? calloc(npg, sizeof(uint64_t)) : NULL;
        uint64_t *pr = npg ? calloc(npg, sizeof(uint64_t)) : NULL;
        if (npg && (!pb || !pr)) {
            free(pb);
            free(pr);
            return TS_ENOMEM;
        }
        free(h->b[i].pg_bytes);
        free(h->b[i].pg_reads);
        h->b[i].pg_bytes = pb;
        h->b[i].pg_reads = pr;
    }
    h->npg = npg;
    return 0;
}

uint32_t tsd_hot_npg(const struct tsd_hot *h)
{
    return h->npg;
}

int tsd_hot_create(struct tsd_hot **out, uint32_t npg)
{
    struct tsd_hot *h = calloc(1, sizeof(*h));

    if (!h)
        return TS_ENOMEM;
    if (tsd_hot_set_npg(h, npg) != 0) {
        tsd_hot_destroy(h);
        return TS_ENOMEM;
    }
    *out = h;
    return 0;
}

void tsd_hot_destroy(struct tsd_hot *h)
{
    if (!h)
        return;
    for (int i = 0; i < TSD_HOT_BUCKETS; i++) {
        free(h->b[i].pg_bytes);
        free(h->b[i].pg_reads);
    }
    free(h);
}

void tsd_hot_advance(struct tsd_hot *h, uint64_t now_ns)
{
    uint64_t cur = now_ns / BUCKET_NS + 1; /* ids start at 1: 0 is "empty" */

    if (!h->start_ns)
        h->start_ns = now_ns;
    if (cur == h->cur)
        return;
    for (int i = 0; i < TSD_HOT_BUCKETS; i++)
        if (h->b[i].id && h->b[i].id + TSD_HOT_BUCKETS <= cur)
            bucket_clear(h, &h->b[i], 0);
    h->cur = cur;
    if (h->b[cur % TSD_HOT_BUCKETS].id != cur)
        bucket_clear(h, &h->b[cur % TSD_HOT_BUCKETS], cur);
}

static void ds_add(struct bucket *b, const char *name, uint64_t bytes)
{
    for (size_t i = 0; i < b->nds; i++)
        if (strcmp(b->ds[i].name, name) == 0) {
            b->ds[i].bytes += bytes;
            b->ds[i].reads++;
            return;
        }
    if (b->nds == TSD_HOT_MAX_DS)
        return;
    snprintf(b->ds[b->nds].name, sizeof(b->ds[b->nds].name), "%s", name);
    b->ds[b->nds].bytes = bytes;
    b->ds[b->nds].reads = 1;
    b->nds++;
}

/* Space-Saving: a counted key adds; a new key takes a free counter, else replaces the smallest
 * and inherits its count (the overestimate bound). */
static void sketch_add(struct bucket *b, const char *name, uint32_t shard, uint64_t bytes)
{
    size_t min = 0;

    for (size_t i = 0; i < b->nsk; i++) {
        if (b->sk[i].shard == shard && strcmp(b->sk[i].dataset, name) == 0) {
            b->sk[i].bytes += bytes;
            return;
        }
        if (b->sk[i].bytes < b->sk[min].bytes)
            min = i;
    }
    if (b->nsk < TSD_HOT_SKETCH) {
        min = b->nsk++;
        b->sk[min].bytes = 0;
    }
    snprintf(b->sk[min].dataset, sizeof(b->sk[min].dataset), "%s", name);
    b->sk[min].shard = shard;
    b->sk[min].bytes += bytes;
}

void tsd_hot_add(struct tsd_hot *h, const char *dataset, uint32_t shard, uint32_t pg,
                 uint64_t bytes)
{
    struct bucket *b;

    if (!h->cur)
        return; /* not advanced yet: no window */
    b = &h->b[h->cur % TSD_HOT_BUCKETS];
    if (pg < h->npg) {
        b->pg_bytes[pg] += bytes;
        b->pg_reads[pg]++;
    }
    ds_add(b, dataset, bytes);
    sketch_add(b, dataset, shard, bytes);
}

double tsd_hot_window_s(const struct tsd_hot *h, uint64_t now_ns)
{
    uint64_t full = (uint64_t)TSD_HOT_BUCKETS * BUCKET_NS;
    uint64_t span = (TSD_HOT_BUCKETS - 1) * BUCKET_NS + now_ns % BUCKET_NS;

    if (!h->start_ns || now_ns <= h->start_ns)
        return 0;
    if (span > now_ns - h->start_ns)
        span = now_ns - h->start_ns;
    return (double)(span < full ? span : full) / 1e9;
}

static int live(const struct tsd_hot *h, const struct bucket *b)
{
    return b->id && b->id + TSD_HOT_BUCKETS > h->cur;
}

static int pg_cmp(const void *a, const void *b)
{
    const struct tsd_hot_pg *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->pg > y->pg) - (x->pg < y->pg);
}

/* Every PG with reads in the window, hottest first (malloc'ed; *n of them). */
static struct tsd_hot_pg *pgs_sorted(const struct tsd_hot *h, size_t *n)
{
    struct tsd_hot_pg *all = calloc(h->npg ? h->npg : 1, sizeof(*all));
    size_t k = 0;

    *n = 0;
    if (!all)
        return NULL;
    for (uint32_t pg = 0; pg < h->npg; pg++) {
        uint64_t bytes = 0, reads = 0;
        for (int i = 0; i < TSD_HOT_BUCKETS; i++)
            if (live(h, &h->b[i])) {
                bytes += h->b[i].pg_bytes[pg];
                reads += h->b[i].pg_reads[pg];
            }
        if (reads)
            all[k++] = (struct tsd_hot_pg){pg, bytes, reads};
    }
    qsort(all, k, sizeof(*all), pg_cmp);
    *n = k;
    return all;
}

size_t tsd_hot_top_pgs(const struct tsd_hot *h, struct tsd_hot_pg *out, size_t k)
{
    size_t n;
    struct tsd_hot_pg *all = pgs_sorted(h, &n);

    if (!all)
        return 0;
    if (n > k)
        n = k;
    memcpy(out, all, n * sizeof(*out));
    free(all);
    return n;
}

uint64_t tsd_hot_pg_median(const struct tsd_hot *h)
{
    size_t n;
    struct tsd_hot_pg *all = pgs_sorted(h, &n);
    uint64_t med = 0;

    if (all && n)
        med = n % 2 ? all[n / 2].bytes : (all[n / 2 - 1].bytes + all[n / 2].bytes) / 2;
    free(all);
    return med;
}

/* Sorts the n merged entries of all (malloc'ed; freed here), copies the first k to out. */
static size_t take_top(void *all, size_t n, size_t size, int (*cmp)(const void *, const void *),
                       void *out, size_t k)
{
    qsort(all, n, size, cmp);
    if (n > k)
        n = k;
    memcpy(out, all, n * size);
    free(all);
    return n;
}

static int shard_cmp(const void *a, const void *b)
{
    const struct tsd_hot_shard *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

size_t tsd_hot_top_shards(const struct tsd_hot *h, struct tsd_hot_shard *out, size_t k)
{
    struct tsd_hot_shard *all = calloc(TSD_HOT_BUCKETS * TSD_HOT_SKETCH, sizeof(*all));
    size_t n = 0;

    if (!all)
        return 0;
    for (int i = 0; i < TSD_HOT_BUCKETS; i++) {
        const struct bucket *b = &h->b[i];
        if (!live(h, b))
            continue;
        for (size_t j = 0; j < b->nsk; j++) {
            size_t m = 0;
            while (m < n && !(all[m].shard == b->sk[j].shard &&
                              strcmp(all[m].dataset, b->sk[j].dataset) == 0))
                m++;
            if (m == n) {
                memcpy(all[n].dataset, b->sk[j].dataset, sizeof(all[n].dataset));
                all[n].shard = b->sk[j].shard;
                all[n++].bytes = 0;
            }
            all[m].bytes += b->sk[j].bytes;
        }
    }
    return take_top(all, n, sizeof(*all), shard_cmp, out, k);
}

static int ds_cmp(const void *a, const void *b)
{
    const struct tsd_hot_ds *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : strcmp(x->name, y->name);
}

size_t tsd_hot_top_datasets(const struct tsd_hot *h, struct tsd_hot_ds *out, size_t k)
{
    struct tsd_hot_ds *all = calloc(TSD_HOT_BUCKETS * TSD_HOT_MAX_DS, sizeof(*all));
    size_t n = 0;

    if (!all)
        return 0;
    for (int i = 0; i < TSD_HOT_BUCKETS; i++) {
        const struct bucket *b = &h->b[i];
        if (!live(h, b))
            continue;
        for (size_t j = 0; j < b->nds; j++) {
            size_t m = 0;
            while (m < n && strcmp(all[m].name, b->ds[j].name) != 0)
                m++;
            if (m == n) {
                all[n] = b->ds[j];
                n++;
                continue;
            }
            all[m].bytes += b->ds[j].bytes;
            all[m].reads += b->ds[j].reads;
        }
    }
    return take_top(all, n, sizeof(*all), ds_cmp, out, k);
}
