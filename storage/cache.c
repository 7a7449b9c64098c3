/* LRU cache of reference-counted entries over a byte budget (see cache.h). */
#include "cache.h"

#include "ts_common.h"

#include <pthread.h>
#include <stdlib.h>

struct ts_cache {
    pthread_mutex_t lock;
    struct ts_cache_entry **table;
    size_t nbuckets;                    /* power of two */
    struct ts_cache_entry *head, *tail; /* most recently used first */
    uint64_t budget, bytes, entries;
    uint64_t hits, misses, inserts, evictions;
};

static size_t bucket(const ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    uint64_t h = dsid * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)shard << 32 | idx) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 31;
    return (size_t)h & (c->nbuckets - 1);
}

int ts_cache_create(ts_cache **out, uint64_t budget)
{
    ts_cache *c = calloc(1, sizeof(*c));

    if (!c)
        return TS_ENOMEM;
    c->budget = budget;
    c->nbuckets = 1u << 16;
    c->table = calloc(c->nbuckets, sizeof(*c->table));
    if (!c->table) {
        free(c);
        return TS_ENOMEM;
    }
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
}

void ts_cache_unref(struct ts_cache_entry *e)
{
    if (e && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
        e->destroy(e);
}

/* Unlinks e from table and list; the table's reference is returned to the caller. */
static void unlink_entry(ts_cache *c, struct ts_cache_entry *e)
{
    struct ts_cache_entry **pp = &c->table[bucket(c, e->dsid, e->shard, e->idx)];

    while (*pp && *pp != e)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = e->hnext;
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = e->hnext = NULL;
    e->in_table = 0;
    c->bytes -= e->bytes;
    c->entries--;
}

void ts_cache_destroy(ts_cache *c)
{
    if (!c)
        return;
    while (c->head) {
        struct ts_cache_entry *e = c->head;
        unlink_entry(c, e);
        ts_cache_unref(e);
    }
    pthread_mutex_destroy(&c->lock);
    free(c->table);
    free(c);
}

static void move_front(ts_cache *c, struct ts_cache_entry *e)
{
    if (c->head == e)
        return;
    e->prev->next = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = NULL;
    e->next = c->head;
    c->head->prev = e;
    c->head = e;
}

struct ts_cache_entry *ts_cache_get(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_cache_entry *e;

    if (!c->budget)
        return NULL;
    pthread_mutex_lock(&c->lock);
    for (e = c->table[bucket(c, dsid, shard, idx)]; e; e = e->hnext)
        if (e->dsid == dsid && e->shard == shard && e->idx == idx)
            break;
    if (e) {
        atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
        move_front(c, e);
        c->hits++;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->lock);
    return e;
}

struct ts_cache_entry *ts_cache_insert(ts_cache *c, struct ts_cache_entry *e)
{
    struct ts_cache_entry *old, *victims = NULL;
    size_t b;

    if (!c->budget || e->bytes > c->budget / 4)
        return e; /* not cached: the caller keeps its only reference */
    pthread_mutex_lock(&c->lock);
    b = bucket(c, e->dsid, e->shard, e->idx);
    for (old = c->table[b]; old; old = old->hnext)
        if (old->dsid == e->dsid && old->shard == e->shard && old->idx == e->idx)
            break;
    if (old) {
        atomic_fetch_add_explicit(&old->refs, 1, memory_order_relaxed);
        move_front(c, old);
        pthread_mutex_unlock(&c->lock);
        ts_cache_unref(e);
        return old;
    }
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed); /* the table's */
    e->hnext = c->table[b];
    c->table[b] = e;
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
    e->in_table = 1;
    c->bytes += e->bytes;
    c->entries++;
    c->inserts++;
    /* Evict from the cold end; entries still referenced by readers are freed by their last
     * reader, so memory above the budget is bounded by what is in flight. */
    while (c->bytes > c->budget && c->tail && c->tail != e) {
        struct ts_cache_entry *v = c->tail;
        unlink_entry(c, v);
        v->hnext = victims;
        victims = v;
        c->evictions++;
    }
    pthread_mutex_unlock(&c->lock);
    while (victims) {
        struct ts_cache_entry *v = victims;
        victims = v->hnext;
        ts_cache_unref(v);
    }
    return e;
}

void ts_cache_drop_dataset(ts_cache *c, uint64_t dsid)
{
    struct ts_cache_entry *e, *next, *victims = NULL;

    pthread_mutex_lock(&c->lock);
    for (e = c->head; e; e = next) {
        next = e->next;
        if (e->dsid == dsid) {
            unlink_entry(c, e);
            e->hnext = victims;
            victims = e;
        }
    }
    pthread_mutex_unlock(&c->lock);
    while (victims) {
        e = victims;
        victims = e->hnext;
        ts_cache_unref(e);
    }
}

void ts_cache_remove(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_cache_entry *e, *victim = NULL;

    pthread_mutex_lock(&c->lock);
    for (e = c->head; e; e = e->next)
        if (e->dsid == dsid && e->shard == shard && e->idx == idx) {
            unlink_entry(c, e);
            victim = e;
            break;
        }
    pthread_mutex_unlock(&c->lock);
    if (victim)
        ts_cache_unref(victim);
}

void ts_cache_stats(ts_cache *c, struct ts_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    out->hits = c->hits;
    out->misses = c->misses;
    out->inserts = c->inserts;
    out->evictions = c->evictions;
    out->bytes = c->bytes;
    out->entries = c->entries;
    out->budget = c->budget;
    pthread_mutex_unlock(&c->lock);
}
