/*
 * Hotness over a sliding window (pure: no I/O, no clock of its own; tested by test_hotness).
 * The window is TSD_HOT_BUCKETS buckets of TSD_HOT_BUCKET_S seconds; reads land in the current
 * bucket, the oldest is dropped as time moves on. Per PG: exact byte and read counts (the PG
 * count is bounded by the map). Per dataset: exact within the window for up to TSD_HOT_MAX_DS
 * names. Per shard: a Space-Saving sketch of TSD_HOT_SKETCH counters per bucket (Metwally et
 * al., 2005): memory is bounded however many shards are read, and any shard read more than
 * 1/TSD_HOT_SKETCH of a bucket's bytes is in it, its count overestimated by at most the
 * smallest counter.
 */
#ifndef TSD_HOTNESS_H
#define TSD_HOTNESS_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/errno.h"
#include "tessera/types.h"

#define TSD_HOT_BUCKETS 6
#define TSD_HOT_BUCKET_S 10
#define TSD_HOT_SKETCH 64
#define TSD_HOT_MAX_DS 256

struct tsd_hot;

struct tsd_hot_pg {
    uint32_t pg;
    uint64_t bytes, reads; /* within the window */
};
struct tsd_hot_shard {
    char dataset[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t bytes; /* within the window (an upper bound: Space-Saving) */
};
struct tsd_hot_ds {
    char name[TS_NAME_MAX + 1];
    uint64_t bytes, reads; /* within the window */
};

int tsd_hot_create(struct tsd_hot **out, uint32_t npg);
void tsd_hot_destroy(struct tsd_hot *h); /* NULL ok */
/* The PG count changed (the first map): PG counts start again. */
int tsd_hot_set_npg(struct tsd_hot *h, uint32_t npg);
uint32_t tsd_hot_npg(const struct tsd_hot *h);
/* Moves the window to now (monotonic ns): buckets older than the window are dropped. */
void tsd_hot_advance(struct tsd_hot *h, uint64_t now_ns);
/* A read of bytes of dataset/shard in PG pg (pg >= npg: no PG). */
void tsd_hot_add(struct tsd_hot *h, const char *dataset, uint32_t shard, uint32_t pg,
                 uint64_t bytes);
/* Seconds the window covers now (up to TSD_HOT_BUCKETS * TSD_HOT_BUCKET_S). */
double tsd_hot_window_s(const struct tsd_hot *h, uint64_t now_ns);
/* The k hottest PGs by bytes, hottest first; returns how many (PGs with reads only). */
size_t tsd_hot_top_pgs(const struct tsd_hot *h, struct tsd_hot_pg *out, size_t k);
/* The median of the bytes of the PGs read within the window (0 when none). */
uint64_t tsd_hot_pg_median(const struct tsd_hot *h);
size_t tsd_hot_top_shards(const struct tsd_hot *h, struct tsd_hot_shard *out, size_t k);
size_t tsd_hot_top_datasets(const struct tsd_hot *h, struct tsd_hot_ds *out, size_t k);

#endif
