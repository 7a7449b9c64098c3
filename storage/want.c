/*
 * Chunks wanted soon: the ones a reader hinted and the prefetch has not read yet (prefetch.c in
 * server/ counts them in and out). A miss on such a chunk reads it whole into the cache, as
 * wanted, even for a small range (piece.c): the reads of its other records, and another job's,
 * then hit, and the prefetch finds it cached. A counting filter of one hash: a false positive
 * only makes a small read take its whole chunk; no memory per chunk, no lock.
 */
#include "store_internal.h"

static size_t slot(uint64_t dsid, uint32_t shard, uint32_t idx)
{
    uint64_t h =
        dsid * 0x9E3779B97F4A7C15ull ^ ((uint64_t)shard << 32 | idx) * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ h >> 29) % WANT_SLOTS;
}

void ts_store_want(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx, int wanted)
{
    _Atomic uint32_t *c = &s->want[slot(dsid, shard, idx)];

    if (wanted)
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    else if (atomic_load_explicit(c, memory_order_relaxed))
        atomic_fetch_sub_explicit(c, 1, memory_order_relaxed);
}

int want_check(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    return atomic_load_explicit(&s->want[slot(dsid, shard, idx)], memory_order_relaxed) != 0;
}
