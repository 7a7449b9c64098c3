/*
 * Unit tests for the chunk cache's policy (storage/cache.c, S3-FIFO): a hot set survives a
 * one-pass scan of another dataset, the budget holds, entries a reader holds outlive their
 * eviction and are freed at the last unref, remove and drop reach both queues and the ghost,
 * the ghost stays bounded, a wanted (prefetched) entry survives a scan, and two threads at once.
 *
 * Entries are charged ENTRY bytes (a 1 MiB chunk) but allocate only their header; every entry
 * made is counted, and every test ends with the cache destroyed and each entry freed once.
 */
#include "ts_test.h"

#include "cache.h"
#include "ts_common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENTRY (1u << 20)
#define NBUDGET 1000u /* the budget, in entries */
#define BUDGET ((uint64_t)NBUDGET * ENTRY)
#define MAGIC 0x7e55e7ac4eull

enum { DS_COLD = 1, DS_HOT, DS_SCAN, DS_A, DS_X, DS_W, DS_P };

struct tent {
    struct ts_cache_entry base;
    uint64_t magic;
    int *freed; /* set at destroy, when not NULL */
};

static _Atomic uint64_t created, destroyed;

static void tdestroy(struct ts_cache_entry *e)
{
    struct tent *t = (struct tent *)e;

    if (t->magic != MAGIC)
        abort(); /* freed twice, or never made here */
    t->magic = 0;
    if (t->freed)
        *t->freed = 1;
    atomic_fetch_add(&destroyed, 1);
    free(t);
}

static struct ts_cache_entry *mk(uint64_t dsid, uint32_t idx, size_t bytes, int *freed)
{
    struct tent *t = calloc(1, sizeof(*t));

    if (!t)
        abort();
    t->base.dsid = dsid;
    t->base.idx = idx;
    t->base.bytes = bytes;
    t->base.refs = 1;
    t->base.destroy = tdestroy;
    t->magic = MAGIC;
    t->freed = freed;
    atomic_fetch_add(&created, 1);
    return &t->base;
}

/* A reader of (dsid, idx): 1 on a hit; on a miss it reads the chunk and caches it, 0. */
static int touch(ts_cache *c, uint64_t dsid, uint32_t idx)
{
    struct ts_cache_entry *e = ts_cache_get(c, dsid, 0, idx);

    if (e) {
        ts_cache_unref(e);
        return 1;
    }
    ts_cache_unref(ts_cache_insert(c, mk(dsid, idx, ENTRY, NULL)));
    return 0;
}

/* 1 when (dsid, idx) is cached (a lookup: it counts as an access). */
static int resident(ts_cache *c, uint64_t dsid, uint32_t idx)
{
    struct ts_cache_entry *e = ts_cache_get(c, dsid, 0, idx);

    ts_cache_unref(e);
    return e != NULL;
}

static struct ts_cache_stats stats(ts_cache *c)
{
    struct ts_cache_stats st;

    memset(&st, 0, sizeof(st));
    ts_cache_stats(c, &st);
    return st;
}

/* What holds after every step: the bytes charged fit the budget, and add up. */
static void check_budget(ts_cache *c)
{
    struct ts_cache_stats st = stats(c);

    assert_true(st.bytes <= st.budget);
    assert_int_equal(st.bytes, st.small_bytes + st.main_bytes);
    assert_int_equal(st.bytes, st.entries * ENTRY);
}

static int setup(void **state)
{
    ts_cache *c;

    created = destroyed = 0;
    if (ts_cache_create(&c, BUDGET) != 0)
        return -1;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ts_cache_destroy(*state);
    if (created != destroyed) {
        fprintf(stderr, "entries made %llu, freed %llu\n", (unsigned long long)created,
                (unsigned long long)destroyed);
        return -1;
    }
    return 0;
}

/* The cache full of other data, then a job's hot set (40 % of the budget) read three times. */
static void warm_hot_set(ts_cache *c, uint32_t hot)
{
    for (uint32_t i = 0; i < 2 * NBUDGET; i++)
        touch(c, DS_COLD, i);
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t i = 0; i < hot; i++)
            touch(c, DS_HOT, i);
}

/* 1. One pass over another dataset (10x the budget, each chunk read once) leaves the hot set. */
static void test_scan_keeps_hot_set(void **state)
{
    ts_cache *c = *state;
    const uint32_t hot = NBUDGET * 4 / 10;
    uint32_t kept = 0;
    struct ts_cache_stats st;

    warm_hot_set(c, hot);
    for (uint32_t i = 0; i < 10 * NBUDGET; i++)
        touch(c, DS_SCAN, i);
    check_budget(c);
    st = stats(c);
    for (uint32_t i = 0; i < hot; i++)
        kept += (uint32_t)resident(c, DS_HOT, i);
    fprintf(stderr,
            "  hot set (%u chunks, 40 %% of the budget) resident after a one-pass scan of 10x "
            "the budget: %u (%.1f %%); small %llu MiB, main %llu MiB, ghost %llu keys\n",
            hot, kept, 100.0 * kept / hot, (unsigned long long)(st.small_bytes >> 20),
            (unsigned long long)(st.main_bytes >> 20), (unsigned long long)st.ghost_entries);
    assert_true(kept * 10 >= hot * 9);
}

/* The same while the hot job goes on reading beside the scan (one of its chunks per 10 scanned):
 * its reads keep hitting. */
static void test_scan_beside_hot_job(void **state)
{
    ts_cache *c = *state;
    const uint32_t hot = NBUDGET * 4 / 10;
    uint32_t reads = 0, hits = 0;

    warm_hot_set(c, hot);
    for (uint32_t i = 0; i < 10 * NBUDGET; i++) {
        touch(c, DS_SCAN, i);
        if (i % 10 == 0) {
            hits += (uint32_t)touch(c, DS_HOT, (i / 10) % hot);
            reads++;
        }
    }
    check_budget(c);
    fprintf(stderr, "  hot job's hit ratio during the scan: %u of %u reads (%.1f %%)\n", hits,
            reads, 100.0 * hits / reads);
    assert_true(hits * 10 >= reads * 9);
}

/* 2. The budget holds at every step; entries a reader holds outlive their eviction and are freed
 * by the reader's unref; an entry over a quarter of the budget is handed back uncached. */
static void test_budget_and_readers(void **state)
{
    ts_cache *c = *state;
    enum { N = 5 * NBUDGET, EVERY = 7 };
    static int freed[N];
    static struct ts_cache_entry *held[N];
    uint32_t nheld = 0, gone = 0;
    struct ts_cache_entry *e;
    int big_freed = 0;

    memset(freed, 0, sizeof(freed));
    for (uint32_t i = 0; i < N; i++) {
        e = ts_cache_insert(c, mk(DS_A, i, ENTRY, &freed[i]));
        if (i % EVERY == 0) {
            held[i] = e;
            nheld++;
        } else {
            ts_cache_unref(e);
        }
        if (i % 3 == 0 && i)
            touch(c, DS_A, i - 1); /* some read again: traffic in both queues */
        check_budget(c);
        /* In memory: what the cache holds, and what readers hold beside it. */
        assert_true(created - destroyed <= stats(c).entries + nheld);
    }
    assert_true(stats(c).evictions > 0);
    for (uint32_t i = 0; i < N; i += EVERY) {
        struct tent *t = (struct tent *)held[i];
        struct ts_cache_entry *now = ts_cache_get(c, DS_A, 0, i);
        int cached = now == held[i]; /* not a copy read again after the eviction */
        ts_cache_unref(now);
        assert_false(freed[i]);
        assert_true(t->magic == MAGIC && t->base.idx == i);
        ts_cache_unref(held[i]);
        assert_int_equal(freed[i], !cached); /* the reader's reference was the last one */
        gone += (uint32_t)!cached;
    }
    assert_true(gone > 0);
    /* A quarter of the budget is cached; more is not. */
    e = mk(DS_X, 1, BUDGET / 4, NULL);
    assert_ptr_equal(ts_cache_insert(c, e), e);
    ts_cache_unref(e);
    assert_true(resident(c, DS_X, 1));
    e = mk(DS_X, 2, BUDGET / 4 + 1, &big_freed);
    assert_ptr_equal(ts_cache_insert(c, e), e);
    assert_false(resident(c, DS_X, 2));
    ts_cache_unref(e);
    assert_true(big_freed);
}

/* 2. remove and drop_dataset reach entries in small and in main, entries readers hold stay valid
 * until released, and the keys they forget are forgotten by the ghost too. */
static void test_remove_and_drop(void **state)
{
    ts_cache *c = *state;
    struct ts_cache_entry *a, *m;
    struct ts_cache_stats st0, st;
    int a_freed = 0, m_freed = 0;

    /* Ghost keys of DS_A: ten chunks read once, then pushed out by other data. */
    for (uint32_t i = 100; i < 110; i++)
        touch(c, DS_A, i);
    for (uint32_t i = 0; i < NBUDGET; i++)
        touch(c, DS_X, i);
    st0 = stats(c);
    assert_false(resident(c, DS_A, 100));
    assert_true(st0.ghost_entries >= 10);
    /* DS_A in small (1, 4) and in main (2, 3); a reader holds 1 and 2. */
    a = ts_cache_insert(c, mk(DS_A, 1, ENTRY, &a_freed));
    m = ts_cache_insert_wanted(c, mk(DS_A, 2, ENTRY, &m_freed));
    ts_cache_unref(ts_cache_insert_wanted(c, mk(DS_A, 3, ENTRY, NULL)));
    ts_cache_unref(ts_cache_insert(c, mk(DS_A, 4, ENTRY, NULL)));
    st = stats(c);
    assert_true(st.main_bytes == 2 * ENTRY);
    /* remove from small, and from main: gone from the cache at once, alive for the reader. */
    ts_cache_remove(c, DS_A, 0, 1);
    ts_cache_remove(c, DS_A, 0, 2);
    assert_false(resident(c, DS_A, 1));
    assert_false(resident(c, DS_A, 2));
    st = stats(c);
    assert_true(st.main_bytes == ENTRY);
    check_budget(c);
    assert_false(a_freed || m_freed);
    assert_true(((struct tent *)a)->magic == MAGIC && ((struct tent *)m)->magic == MAGIC);
    ts_cache_unref(a);
    ts_cache_unref(m);
    assert_true(a_freed && m_freed);
    /* remove of a remembered key forgets it: the next insert starts in small, no ghost hit. */
    st = stats(c);
    ts_cache_remove(c, DS_A, 0, 100);
    assert_int_equal(stats(c).ghost_entries, st.ghost_entries - 1);
    touch(c, DS_A, 100);
    assert_int_equal(stats(c).ghost_hits, st0.ghost_hits);
    /* drop: DS_A's entries in both queues go, and its nine remembered keys. */
    st = stats(c);
    ts_cache_drop_dataset(c, DS_A);
    for (uint32_t i = 1; i <= 4; i++)
        assert_false(resident(c, DS_A, i));
    assert_false(resident(c, DS_A, 100));
    assert_int_equal(stats(c).ghost_entries, st.ghost_entries - 9);
    assert_int_equal(stats(c).main_bytes, 0);
    check_budget(c);
    ts_cache_unref(ts_cache_insert(c, mk(DS_A, 101, ENTRY, NULL)));
    assert_int_equal(stats(c).ghost_hits, st0.ghost_hits);
    /* Other datasets keep theirs. */
    assert_true(resident(c, DS_X, NBUDGET - 1));
}

/* 2. The ghost remembers recently evicted keys (readmitted to main), a bounded number of them. */
static void test_ghost_readmits_and_is_bounded(void **state)
{
    ts_cache *c = *state;
    const uint32_t n = 20 * NBUDGET;
    const uint64_t cap = (BUDGET - BUDGET / 10) / ENTRY; /* main's size, in entries */
    struct ts_cache_stats st;

    for (uint32_t i = 0; i < n; i++)
        touch(c, DS_SCAN, i);
    st = stats(c);
    fprintf(stderr, "  after a scan of 20x the budget the ghost holds %llu keys (cap %llu)\n",
            (unsigned long long)st.ghost_entries, (unsigned long long)cap);
    assert_true(st.ghost_entries > 0 && st.ghost_entries <= cap);
    assert_int_equal(st.ghost_hits, 0);
    assert_int_equal(st.main_bytes, 0);
    /* The newest evicted key is remembered: read again, it goes to main and outlasts a scan. */
    assert_int_equal(touch(c, DS_SCAN, n - NBUDGET - 1), 0);
    st = stats(c);
    assert_int_equal(st.ghost_hits, 1);
    assert_int_equal(st.main_bytes, ENTRY);
    for (uint32_t i = n; i < n + 2 * NBUDGET; i++)
        touch(c, DS_SCAN, i);
    assert_true(resident(c, DS_SCAN, n - NBUDGET - 1));
    /* A key evicted long ago is not. */
    touch(c, DS_SCAN, 0);
    assert_int_equal(stats(c).ghost_hits, 1);
    assert_true(stats(c).ghost_entries <= cap);
}

/* 3. A wanted (prefetched) entry survives a scan of 2x the budget before its reader comes; the
 * same prefetch inserted plainly does not. */
static void test_wanted_survives_scan(void **state)
{
    ts_cache *c = *state;
    const uint32_t n = 50;
    uint32_t wanted_kept = 0, plain_kept = 0;
    struct ts_cache_entry *e, *dup;
    int dup_freed = 0;

    for (uint32_t i = 0; i < 2 * NBUDGET; i++)
        touch(c, DS_COLD, i); /* a full cache */
    for (uint32_t i = 0; i < n; i++) {
        e = ts_cache_insert_wanted(c, mk(DS_W, i, ENTRY, NULL));
        assert_int_equal(e->freq, 1); /* counted as read once: a round more in main */
        ts_cache_unref(e);
        ts_cache_unref(ts_cache_insert(c, mk(DS_P, i, ENTRY, NULL)));
    }
    assert_int_equal(stats(c).main_bytes, (uint64_t)n * ENTRY); /* wanted ones enter main */
    /* A wanted insert of a key already cached (plainly) keeps the cached entry and marks it. */
    ts_cache_unref(ts_cache_insert(c, mk(DS_W, n, ENTRY, NULL)));
    dup = mk(DS_W, n, ENTRY, &dup_freed);
    e = ts_cache_insert_wanted(c, dup);
    assert_ptr_not_equal(e, dup);
    assert_true(dup_freed);
    ts_cache_unref(e);
    for (uint32_t i = 0; i < 2 * NBUDGET; i++)
        touch(c, DS_SCAN, i);
    check_budget(c);
    for (uint32_t i = 0; i <= n; i++)
        wanted_kept += (uint32_t)resident(c, DS_W, i);
    for (uint32_t i = 0; i < n; i++)
        plain_kept += (uint32_t)resident(c, DS_P, i);
    fprintf(stderr, "  after a scan of 2x the budget: wanted %u of %u kept, plain %u of %u\n",
            wanted_kept, n + 1, plain_kept, n);
    assert_int_equal(wanted_kept, n + 1);
    assert_int_equal(plain_kept, 0);
}

/* 4. Two threads get, insert (some wanted), remove and drop random keys for about a second. */
struct worker {
    ts_cache *c;
    unsigned seed;
    uint64_t gets, hits;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    uint64_t end = ts_now_mono_ns() + 1000000000ull;

    for (uint64_t n = 0;; n++) {
        if (n % 256 == 0 && ts_now_mono_ns() >= end)
            break;
        unsigned r = (unsigned)rand_r(&w->seed);
        uint64_t ds = r % 16 == 0 ? DS_X : DS_HOT;
        uint32_t idx = r % 2 ? (r >> 8) % (NBUDGET / 4) : (r >> 8) % (3 * NBUDGET);
        struct ts_cache_entry *e = ts_cache_get(w->c, ds, 0, idx);
        w->gets++;
        if (e) {
            w->hits++;
        } else {
            e = mk(ds, idx, ENTRY, NULL);
            e = r % 8 == 3 ? ts_cache_insert_wanted(w->c, e) : ts_cache_insert(w->c, e);
        }
        if (((struct tent *)e)->magic != MAGIC)
            abort();
        ts_cache_unref(e);
        if (r % 1024 == 5)
            ts_cache_remove(w->c, ds, 0, (r >> 4) % NBUDGET);
        if (r % 65536 == 7)
            ts_cache_drop_dataset(w->c, DS_X);
        if (r % 4096 == 9) {
            struct ts_cache_stats st = stats(w->c);
            if (st.bytes > st.budget || st.bytes != st.small_bytes + st.main_bytes)
                abort();
        }
    }
    return NULL;
}

static void test_threads_smoke(void **state)
{
    ts_cache *c = *state;
    struct worker w[2] = {{c, 1, 0, 0}, {c, 2, 0, 0}};
    pthread_t t[2];
    struct ts_cache_stats st;

    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    st = stats(c);
    fprintf(stderr,
            "  2 threads: %llu gets, %llu hits, %llu inserts, %llu evictions, %llu ghost hits\n",
            (unsigned long long)(w[0].gets + w[1].gets), (unsigned long long)st.hits,
            (unsigned long long)st.inserts, (unsigned long long)st.evictions,
            (unsigned long long)st.ghost_hits);
    assert_int_equal(st.hits + st.misses, w[0].gets + w[1].gets);
    assert_int_equal(st.hits, w[0].hits + w[1].hits);
    assert_true(st.inserts <= st.misses);
    check_budget(c);
    assert_int_equal(created - destroyed, st.entries); /* no reference left but the table's */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scan_keeps_hot_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_beside_hot_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_and_readers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_and_drop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ghost_readmits_and_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wanted_survives_scan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_smoke, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
