/*
 * S3-FIFO cache of reference-counted entries over a byte budget (see cache.h): Yang et al.,
 * "FIFO queues are all you need for cache eviction", SOSP 2023.
 *
 * Three FIFOs. A new entry enters `small` (a tenth of the budget). When small is over its share
 * the oldest entry leaves it: to `main` if it was accessed while in small, else out of the cache,
 * its key (only the key) remembered by the `ghost` FIFO, which holds about as many keys as main
 * holds entries. An insert of a remembered key goes straight to main: it was evicted too early.
 * Main evicts its oldest entry, unless that one was accessed since it entered or last passed,
 * in which case it goes round once more with its count lowered. Each entry counts accesses in
 * 2 bits (0..3). A hit only bumps that count: no list moves on the read path. A one-pass scan
 * (each key read once) thus cycles through small and never reaches what main holds.
 *
 * Entries taken out while a reader holds them (eviction, remove, drop) leave the table and the
 * budget at once and are freed by their last ts_cache_unref().
 */
#include "cache.h"

#include "ts_common.h"

#include <pthread.h>
#include <stdlib.h>

enum { Q_NONE, Q_SMALL, Q_MAIN };

#define FREQ_MAX 3
#define SMALL_SHARE 10 /* small gets budget / SMALL_SHARE */
#define GHOST_MIN 16   /* keys the ghost may always hold */
#define NBUCKETS (1u << 16)
#define GBUCKETS (1u << 14)

struct fifo {
    struct ts_cache_entry *head, *tail; /* newest first */
    uint64_t bytes, n;
};

/* A remembered key of an entry evicted from small. */
struct ghost {
    uint64_t dsid;
    uint32_t shard, idx;
    struct ghost *hnext, *prev, *next;
};

struct ts_cache {
    pthread_mutex_t lock;
    struct ts_cache_entry **table; /* NBUCKETS chains */
    struct ghost **gtable;         /* GBUCKETS chains */
    struct fifo q[3];              /* q[Q_SMALL], q[Q_MAIN] */
    struct ghost *ghead, *gtail;   /* newest first */
    uint64_t gn;
    uint64_t budget, small_target;
    uint64_t hits, misses, inserts, evictions, ghost_hits;
};

#define SAME(e, d, s, i) ((e)->dsid == (d) && (e)->shard == (s) && (e)->idx == (i))

static uint64_t key_hash(uint64_t dsid, uint32_t shard, uint32_t idx)
{
    uint64_t h = dsid * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)shard << 32 | idx) * 0xC2B2AE3D27D4EB4Full;
    return h ^ (h >> 31);
}

/* The link that points at the key's entry, or the chain's terminating NULL link. */
static struct ts_cache_entry **find(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_cache_entry **pp = &c->table[key_hash(dsid, shard, idx) & (NBUCKETS - 1)];

    while (*pp && !SAME(*pp, dsid, shard, idx))
        pp = &(*pp)->hnext;
    return pp;
}

static struct ghost **ghost_find(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ghost **pp = &c->gtable[key_hash(dsid, shard, idx) & (GBUCKETS - 1)];

    while (*pp && !SAME(*pp, dsid, shard, idx))
        pp = &(*pp)->hnext;
    return pp;
}

int ts_cache_create(ts_cache **out, uint64_t budget)
{
    ts_cache *c = calloc(1, sizeof(*c));

    if (!c)
        return TS_ENOMEM;
    c->budget = budget;
    c->small_target = budget / SMALL_SHARE;
    c->table = calloc(NBUCKETS, sizeof(*c->table));
    if (!c->table)
        goto out_free_cache;
    c->gtable = calloc(GBUCKETS, sizeof(*c->gtable));
    if (!c->gtable)
        goto out_free_table;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
out_free_table:
    free(c->table);
out_free_cache:
    free(c);
    return TS_ENOMEM;
}

void ts_cache_unref(struct ts_cache_entry *e)
{
    if (e && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
        e->destroy(e);
}

/* Puts e at the head (newest end) of FIFO q. */
static void fifo_push(ts_cache *c, int q, struct ts_cache_entry *e)
{
    struct fifo *f = &c->q[q];

    e->prev = NULL;
    e->next = f->head;
    if (f->head)
        f->head->prev = e;
    else
        f->tail = e;
    f->head = e;
    f->bytes += e->bytes;
    f->n++;
    e->queue = (unsigned char)q;
}

/* Takes e out of its FIFO. */
static void fifo_cut(ts_cache *c, struct ts_cache_entry *e)
{
    struct fifo *f = &c->q[e->queue];

    if (e->prev)
        e->prev->next = e->next;
    else
        f->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        f->tail = e->prev;
    e->prev = e->next = NULL;
    f->bytes -= e->bytes;
    f->n--;
    e->queue = Q_NONE;
}

/* Takes e out of the table and its FIFO; the table's reference goes to the caller. */
static void unlink_entry(ts_cache *c, struct ts_cache_entry *e)
{
    struct ts_cache_entry **pp = find(c, e->dsid, e->shard, e->idx);

    if (*pp == e)
        *pp = e->hnext;
    e->hnext = NULL;
    fifo_cut(c, e);
}

/* Forgets the remembered key *gp points at; the node goes to the caller. */
static struct ghost *ghost_cut(ts_cache *c, struct ghost **gp)
{
    struct ghost *g = *gp;

    *gp = g->hnext;
    if (g->prev)
        g->prev->next = g->next;
    else
        c->ghead = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        c->gtail = g->prev;
    c->gn--;
    return g;
}

/* As many keys as main would hold entries of the mean size cached now (at least GHOST_MIN). */
static uint64_t ghost_cap(const ts_cache *c)
{
    uint64_t n = c->q[Q_SMALL].n + c->q[Q_MAIN].n;
    uint64_t mean = n ? (c->q[Q_SMALL].bytes + c->q[Q_MAIN].bytes) / n : 0;
    uint64_t cap = mean ? (c->budget - c->small_target) / mean : 0;

    return cap > GHOST_MIN ? cap : GHOST_MIN;
}

/* Remembers e's key, forgetting the oldest keys beyond the cap (a node is reused). */
static void ghost_add(ts_cache *c, const struct ts_cache_entry *e)
{
    uint64_t cap = ghost_cap(c);
    struct ghost *g = NULL, **gp;

    while (c->gn >= cap) {
        free(g);
        g = c->gtail;
        ghost_cut(c, ghost_find(c, g->dsid, g->shard, g->idx));
    }
    if (!g && !(g = malloc(sizeof(*g))))
        return; /* not remembered: a later insert of the key starts in small, no harm */
    g->dsid = e->dsid;
    g->shard = e->shard;
    g->idx = e->idx;
    gp = ghost_find(c, e->dsid, e->shard, e->idx);
    g->hnext = *gp;
    *gp = g;
    g->prev = NULL;
    g->next = c->ghead;
    if (c->ghead)
        c->ghead->prev = g;
    else
        c->gtail = g;
    c->ghead = g;
    c->gn++;
}

static void unref_all(struct ts_cache_entry *victims)
{
    while (victims) {
        struct ts_cache_entry *v = victims;
        victims = v->hnext;
        ts_cache_unref(v);
    }
}

void ts_cache_destroy(ts_cache *c)
{
    struct ts_cache_entry *victims = NULL;

    if (!c)
        return;
    for (int q = Q_SMALL; q <= Q_MAIN; q++)
        while (c->q[q].head) {
            struct ts_cache_entry *e = c->q[q].head;
            unlink_entry(c, e);
            e->hnext = victims;
            victims = e;
        }
    unref_all(victims);
    while (c->ghead) {
        struct ghost *g = c->ghead;
        c->ghead = g->next;
        free(g);
    }
    pthread_mutex_destroy(&c->lock);
    free(c->gtable);
    free(c->table);
    free(c);
}

struct ts_cache_entry *ts_cache_get(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_cache_entry *e;

    if (!c->budget)
        return NULL;
    pthread_mutex_lock(&c->lock);
    e = *find(c, dsid, shard, idx);
    if (e) {
        atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
        e->freq += e->freq < FREQ_MAX;
        c->hits++;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->lock);
    return e;
}

/*
 * Evicts until the cached bytes fit the budget, never `keep` (the entry being inserted); returns
 * the victims chained by hnext, each with the table's reference, to unref outside the lock.
 */
static struct ts_cache_entry *evict(ts_cache *c, const struct ts_cache_entry *keep)
{
    struct fifo *s = &c->q[Q_SMALL], *m = &c->q[Q_MAIN];
    struct ts_cache_entry *victims = NULL, *t;

    while (s->bytes + m->bytes > c->budget) {
        int main_other = m->tail && (m->tail != keep || m->head != keep);

        if (s->tail && s->tail != keep && (s->bytes > c->small_target || !main_other)) {
            t = s->tail;
            if (t->freq) { /* accessed in small: kept, in main */
                fifo_cut(c, t);
                fifo_push(c, Q_MAIN, t);
                continue;
            }
            ghost_add(c, t);
        } else if (main_other) {
            t = m->tail;
            if (t->freq || t == keep) { /* one more round */
                fifo_cut(c, t);
                if (t->freq)
                    t->freq--;
                fifo_push(c, Q_MAIN, t);
                continue;
            }
        } else {
            break; /* only keep is left: it fits (at most a quarter of the budget) */
        }
        unlink_entry(c, t);
        t->hnext = victims;
        victims = t;
        c->evictions++;
    }
    return victims;
}

static struct ts_cache_entry *insert(ts_cache *c, struct ts_cache_entry *e, int wanted)
{
    struct ts_cache_entry **pp, *old, *victims;
    struct ghost **gp;
    int q = wanted ? Q_MAIN : Q_SMALL;

    if (!c->budget || e->bytes > c->budget / 4)
        return e; /* not cached: the caller keeps its only reference */
    pthread_mutex_lock(&c->lock);
    pp = find(c, e->dsid, e->shard, e->idx);
    if ((old = *pp) != NULL) { /* another reader's copy got in first: an access of it */
        atomic_fetch_add_explicit(&old->refs, 1, memory_order_relaxed);
        old->freq += old->freq < FREQ_MAX;
        pthread_mutex_unlock(&c->lock);
        ts_cache_unref(e);
        return old;
    }
    gp = ghost_find(c, e->dsid, e->shard, e->idx);
    if (*gp) { /* evicted from small not long ago: wanted after all */
        free(ghost_cut(c, gp));
        c->ghost_hits++;
        q = Q_MAIN;
    }
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed); /* the table's */
    e->hnext = NULL;
    *pp = e;
    e->freq = wanted ? 1 : 0;
    fifo_push(c, q, e);
    c->inserts++;
    victims = evict(c, e);
    pthread_mutex_unlock(&c->lock);
    unref_all(victims);
    return e;
}

struct ts_cache_entry *ts_cache_insert(ts_cache *c, struct ts_cache_entry *e)
{
    return insert(c, e, 0);
}

struct ts_cache_entry *ts_cache_insert_wanted(ts_cache *c, struct ts_cache_entry *e)
{
    return insert(c, e, 1);
}

void ts_cache_drop_dataset(ts_cache *c, uint64_t dsid)
{
    struct ts_cache_entry *e, *next, *victims = NULL;
    struct ghost *g, *gnext;

    pthread_mutex_lock(&c->lock);
    for (int q = Q_SMALL; q <= Q_MAIN; q++)
        for (e = c->q[q].head; e; e = next) {
            next = e->next;
            if (e->dsid == dsid) {
                unlink_entry(c, e);
                e->hnext = victims;
                victims = e;
            }
        }
    for (g = c->ghead; g; g = gnext) {
        gnext = g->next;
        if (g->dsid == dsid)
            free(ghost_cut(c, ghost_find(c, g->dsid, g->shard, g->idx)));
    }
    pthread_mutex_unlock(&c->lock);
    unref_all(victims);
}

void ts_cache_remove(ts_cache *c, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct ts_cache_entry *victim;
    struct ghost **gp;

    pthread_mutex_lock(&c->lock);
    victim = *find(c, dsid, shard, idx);
    if (victim)
        unlink_entry(c, victim);
    gp = ghost_find(c, dsid, shard, idx);
    if (*gp)
        free(ghost_cut(c, gp));
    pthread_mutex_unlock(&c->lock);
    ts_cache_unref(victim);
}

void ts_cache_stats(ts_cache *c, struct ts_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    out->hits = c->hits;
    out->misses = c->misses;
    out->inserts = c->inserts;
    out->evictions = c->evictions;
    out->small_bytes = c->q[Q_SMALL].bytes;
    out->main_bytes = c->q[Q_MAIN].bytes;
    out->bytes = out->small_bytes + out->main_bytes;
    out->entries = c->q[Q_SMALL].n + c->q[Q_MAIN].n;
    out->budget = c->budget;
    out->ghost_hits = c->ghost_hits;
    out->ghost_entries = c->gn;
    pthread_mutex_unlock(&c->lock);
}
