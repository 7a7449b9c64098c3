/*
 * The store's cache of verified chunks and complete-shard records (storage-internal).
 *
 * S3-FIFO over a byte budget (Yang et al., SOSP 2023; policy in cache.c), keyed by (dataset id,
 * shard, chunk index); shard records use chunk index TS_CACHE_SHARD. Entries are
 * reference-counted: a lookup returns a referenced entry, the cache holds one reference while
 * the entry is in its table, and the last ts_cache_unref() frees it (through the entry's
 * destructor), so an entry a reader holds outlives its eviction. Thread-safe.
 */
#ifndef TS_CACHE_H
#define TS_CACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TS_CACHE_SHARD UINT32_MAX

struct ts_cache_entry {
    uint64_t dsid;
    uint32_t shard, idx;
    size_t bytes; /* charged against the budget */
    _Atomic int refs;
    unsigned char queue; /* the cache's: 0 not in it, else its small or main FIFO */
    unsigned char freq;  /* the cache's: accesses since it entered or last passed (0..3) */
    void (*destroy)(struct ts_cache_entry *e);
    struct ts_cache_entry *hnext, *prev, *next;
};

typedef struct ts_cache ts_cache;

/* budget 0: a cache that keeps nothing (inserts hand the entry straight back). */
int ts_cache_create(ts_cache **out, uint64_t budget);
void ts_cache_destroy(ts_cache *c);
/* A referenced entry, or NULL. */
struct ts_cache_entry *ts_cache_get(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx);
/*
 * Inserts e (refs must be 1: the caller's). If an entry with the same key is present, e is
 * left out and the present one is returned referenced instead (the caller then unrefs e).
 * Returns the entry the caller should use, referenced once for the caller. An entry larger
 * than a quarter of the budget is not cached (e comes straight back).
 */
struct ts_cache_entry *ts_cache_insert(ts_cache *c, struct ts_cache_entry *e);
/*
 * As ts_cache_insert, for an entry a reader is known to want soon (plan-driven prefetch): it
 * enters the main FIFO already counted as accessed once, so a scan passing through the cache
 * before its reader comes does not push it out. Prefetch no more than the cache should keep:
 * wanted entries compete with the main FIFO's, not with new arrivals.
 */
struct ts_cache_entry *ts_cache_insert_wanted(ts_cache *c, struct ts_cache_entry *e);
void ts_cache_unref(struct ts_cache_entry *e);
/* Drops one entry (its copy failed a check), if present, and forgets its key. */
void ts_cache_remove(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx);
/* Drops every entry of a dataset (deleted), and the remembered keys of its evicted ones. */
void ts_cache_drop_dataset(ts_cache *c, uint64_t dsid);

struct ts_cache_stats {
    uint64_t hits, misses, inserts, evictions, bytes, entries, budget;
    uint64_t small_bytes, main_bytes; /* bytes = small_bytes + main_bytes */
    uint64_t ghost_hits;              /* inserts readmitted to main by a remembered key */
    uint64_t ghost_entries;           /* keys remembered now */
};
void ts_cache_stats(ts_cache *c, struct ts_cache_stats *out);

#endif
