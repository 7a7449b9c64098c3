/*
 * The plan reader (tessera/reader.h) against real daemons: every unit of a rank's plan comes
 * back in plan order, byte for byte (records and whole shards, a shard larger than one read);
 * the byte window bounds what is read ahead; caller-owned buffers; a unit no replica can serve
 * is an error naming its shard and record; a 4-rank read of a 5-node cluster survives a kill -9
 * of a replica; a job saved at 4 ranks, resumed at 3, saved again and resumed at 5 reads every
 * record exactly once; with one replica corrupt, one node stopped and one dead, every record
 * still comes back right; the reader's threads stay asleep while the caller has units in hand.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"

#include <dirent.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CORRUPT_CHUNK_PATH
#error "CORRUPT_CHUNK_PATH must be defined by the build"
#endif

#define CHUNK (64u << 10)

static struct tsd_proc D;
static struct tsd_cluster CL;

/* ---- the data: record i of shard s, and the shards made of them ----------------------------- */

static size_t rec_len(uint32_t s, uint64_t i)
{
    return (size_t)((s * 131u + i * 17u) % 1500u); /* some records are empty */
}

static uint8_t rec_byte(uint32_t s, uint64_t i, size_t j)
{
    return (uint8_t)(s * 7u + i * 13u + j * 31u + (j >> 8));
}

static int rec_ok(uint32_t s, uint64_t i, const uint8_t *p, size_t len)
{
    if (len != rec_len(s, i))
        return 0;
    for (size_t j = 0; j < len; j++)
        if (p[j] != rec_byte(s, i, j))
            return 0;
    return 1;
}

/* Uploads shards 0..nshards-1 of ds, shard s holding nrec(s) records, with its record index. */
static void put_record_shards(tessera_client *c, const char *ds, uint32_t nshards,
                              uint64_t (*nrec)(uint32_t))
{
    for (uint32_t s = 0; s < nshards; s++) {
        uint64_t n = nrec(s), *offs = calloc(n + 1, sizeof(*offs)), at = 0;
        uint8_t *buf;
        for (uint64_t i = 0; i < n; i++) {
            offs[i] = at;
            at += rec_len(s, i);
        }
        buf = malloc(at + 1);
        for (uint64_t i = 0; i < n; i++)
            for (size_t j = 0; j < rec_len(s, i); j++)
                buf[offs[i] + j] = rec_byte(s, i, j);
        assert_int_equal(tessera_put(c, ds, s, buf, at, offs, (uint32_t)n), 0);
        free(buf);
        free(offs);
    }
}

static uint64_t nrec_small(uint32_t s)
{
    return 40 + s * 9;
}

static uint64_t total_of(uint32_t nshards, uint64_t (*nrec)(uint32_t))
{
    uint64_t t = 0;
    for (uint32_t s = 0; s < nshards; s++)
        t += nrec(s);
    return t;
}

/* The dataset record number of record i of shard s. */
static uint64_t dsrec(uint32_t s, uint64_t i, uint64_t (*nrec)(uint32_t))
{
    uint64_t u = i;
    for (uint32_t x = 0; x < s; x++)
        u += nrec(x);
    return u;
}

static void client_opts(struct tessera_opts *o)
{
    tessera_opts_init(o);
    o->address = D.addr;
}

static tessera_client *open_client(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    client_opts(&o);
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

static void mkds(tessera_client *c, const char *name, uint8_t core, uint8_t min_core)
{
    struct ts_dataset_policy p = {core, 0, min_core, CHUNK, 0, 0, 0, 0};
    assert_int_equal(tessera_dataset_create(c, name, &p), 0);
}

/* Options for a reader of "recs" by record, in a globally shuffled order. */
static void recs_opts(struct tessera_opts *co, struct tessera_reader_opts *ro)
{
    client_opts(co);
    tessera_reader_opts_init(ro);
    ro->dataset = "recs";
    ro->unit = TESSERA_UNIT_RECORD;
    ro->plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
}

static tessera_reader *open_reader(const struct tessera_opts *co, struct tessera_reader_opts *ro)
{
    tessera_reader *r = NULL;
    char err[512] = "";
    int rc = tessera_reader_open(&r, co, ro, err, sizeof(err));

    if (rc)
        fprintf(stderr, "reader_open: %s: %s\n", ts_errname(rc), err);
    assert_int_equal(rc, 0);
    return r;
}

/* ---- one node -------------------------------------------------------------------------------- */

static cpu_set_t all_cpus; /* the process's CPUs, put back if a pinned test fails */

static int setup_node(void **state)
{
    if (sched_getaffinity(0, sizeof(all_cpus), &all_cpus) != 0)
        return -1;
    memset(&D, 0, sizeof(D));
    if (tsd_start(&D, NULL) != 0)
        return -1;
    tessera_client *c = open_client();
    mkds(c, "recs", 1, 1);
    put_record_shards(c, "recs", 7, nrec_small);
    tessera_client_close(c);
    return 0;
}

static int teardown_node(void **state)
{
    (void)sched_setaffinity(0, sizeof(all_cpus), &all_cpus);
    return tsd_stop(&D) == 0 ? 0 : -1;
}

/* Every record once, in the order of the rank's plan, byte for byte; a small byte window. */
static void test_records_in_plan_order(void **state)
{
    const uint64_t total = total_of(7, nrec_small);
    struct tessera_reader_opts ro;
    struct tessera_reader_stats st;
    struct tessera_opts co;
    struct tessera_unit u;
    uint8_t *seen = calloc(total, 1);
    uint64_t n = 0;
    int rc;

    client_opts(&co);
    for (uint32_t world = 1; world <= 3; world += 2) {
        for (uint32_t rank = 0; rank < world; rank++) {
            tessera_reader_opts_init(&ro);
            ro.dataset = "recs";
            ro.unit = TESSERA_UNIT_RECORD;
            ro.plan.seed = 7;
            ro.plan.epoch = 2;
            ro.plan.rank = rank;
            ro.plan.world = world;
            ro.plan.assign = TESSERA_ASSIGN_STRIDED;
            ro.plan.shuffle = world == 1 ? TESSERA_SHUFFLE_GLOBAL : TESSERA_SHUFFLE_WINDOW;
            ro.plan.window = 2;
            ro.window_units = 16;
            ro.window_bytes = 4096; /* records are up to 1.5 KiB */
            ro.index_shards = 2;
            tessera_reader *r = open_reader(&co, &ro);
            const tessera_plan *p = tessera_reader_plan(r);
            uint64_t k = 0;
            while ((rc = tessera_reader_next(r, &u)) == 1) {
                uint64_t want;
                assert_int_equal(tessera_plan_unit(p, k, &want), 0);
                assert_int_equal(u.k, k);
                assert_int_equal(u.unit, want);
                assert_int_equal(u.unit, dsrec(u.shard, u.record, nrec_small));
                assert_true(rec_ok(u.shard, u.record, u.data, u.len));
                if (world == 3) {
                    assert_int_equal(seen[u.unit], 0);
                    seen[u.unit] = 1;
                    n++;
                }
                k++;
            }
            assert_int_equal(rc, 0);
            assert_int_equal(k, tessera_reader_len(r));
            assert_int_equal(tessera_reader_consumed(r), k);
            tessera_reader_stats(r, &st);
            assert_int_equal(st.units, k);
            assert_true(st.ahead_bytes_max <= 4096);
            assert_true(st.index_loads >= 7); /* two indexes kept, every shard touched */
            assert_int_equal(st.retries, 0);
            /* Every non-empty record came from the one node. */
            assert_true(st.nnodes == 1);
            assert_int_equal(tessera_reader_next(r, &u), 0); /* the end stays the end */
            tessera_reader_close(r);
        }
    }
    assert_int_equal(n, total);
    free(seen);
}

/* ---- the reader's threads sleep while the caller has units -------------------------------- */

/* Voluntary context switches of this process's reader threads ("tessera-reader") so far. */
static uint64_t reader_thread_sleeps(void)
{
    uint64_t n = 0;
    char path[300], line[256];
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        FILE *f;
        int ours = 0;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        f = fopen(path, "r");
        if (f) {
            ours = fgets(line, sizeof(line), f) && strncmp(line, "tessera-reader", 14) == 0;
            fclose(f);
        }
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
        if (!ours || !(f = fopen(path, "r")))
            continue;
        while (fgets(line, sizeof(line), f))
            if (strncmp(line, "voluntary_ctxt_switches:", 24) == 0)
                n += strtoull(line + 24, NULL, 10);
        fclose(f);
    }
    closedir(d);
    return n;
}

#define BIG_SHARDS 6
#define BIG_RECS 24
#define BIG_REC (100u << 10)

static uint8_t big_byte(uint32_t s, uint64_t i, size_t j)
{
    return (uint8_t)(s * 5u + i * 11u + j * 7u + (j >> 12));
}

static void spin_us(uint64_t us)
{
    uint64_t end = ts_now_mono_ns() + us * 1000u;

    while (ts_now_mono_ns() < end)
        ;
}

/* One pass over "big100k" (100 KiB records, as the adapters read them: one connection, a 4 MiB
 * window), the caller pausing on every unit: the reader threads' sleeps per unit. */
static double sleeps_per_unit(const struct tessera_opts *co)
{
    struct tessera_reader_opts ro;
    struct tessera_unit u;
    uint64_t before, k = 0;
    int rc;

    tessera_reader_opts_init(&ro);
    ro.dataset = "big100k";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    tessera_reader *r = open_reader(co, &ro);
    while (tessera_reader_consumed(r) == 0 && (rc = tessera_reader_next(r, &u)) == 1)
        k++; /* the first unit: the threads' start is not counted */
    before = reader_thread_sleeps();
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        assert_int_equal(u.len, BIG_REC);
        assert_int_equal(((const uint8_t *)u.data)[BIG_REC / 2],
                         big_byte(u.shard, u.record, BIG_REC / 2));
        k++;
        spin_us(200); /* the training step, on the reader threads' core */
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, (uint64_t)BIG_SHARDS * BIG_RECS);
    double per = (double)(reader_thread_sleeps() - before) / (double)(k - 1);
    tessera_reader_close(r);
    return per;
}

/*
 * While the caller has units in hand, the reader's threads stay asleep: they are not woken for
 * every unit the caller takes, only when that frees half the window to claim again or lets the
 * next unit in. Each needless wake-up is two context switches on the caller's core (a
 * training step's Python, where the adapters run). Asserted with and without the connection's
 * receive batching (TESSERA_READER_RX_BATCH=0), which works underneath and keeps its own
 * figures in docs/benchmarks.md: with a consumer that spins, as here, the thread rarely runs
 * before a burst's replies are all in.
 */
static void test_threads_sleep_while_caller_has_units(void **state)
{
    tessera_client *c = open_client();
    struct tessera_opts co;
    uint8_t *buf = malloc((size_t)BIG_RECS * BIG_REC);
    uint64_t offs[BIG_RECS];
    double batched, unbatched;
    cpu_set_t one;

    mkds(c, "big100k", 1, 1);
    for (uint32_t s = 0; s < BIG_SHARDS; s++) {
        for (uint64_t i = 0; i < BIG_RECS; i++) {
            offs[i] = i * BIG_REC;
            for (size_t j = 0; j < BIG_REC; j++)
                buf[offs[i] + j] = big_byte(s, i, j);
        }
        assert_int_equal(
            tessera_put(c, "big100k", s, buf, (size_t)BIG_RECS * BIG_REC, offs, BIG_RECS), 0);
    }
    free(buf);
    tessera_client_close(c);
    client_opts(&co);
    /* The caller and the reader's threads on one core, as in a DataLoader worker (the node is
     * another process, free to run on the other). */
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    sleeps_per_unit(&co); /* the node's cache warm */
    setenv("TESSERA_READER_RX_BATCH", "0", 1);
    unbatched = sleeps_per_unit(&co);
    unsetenv("TESSERA_READER_RX_BATCH");
    batched = sleeps_per_unit(&co);
    fprintf(stderr, "reader thread sleeps per unit: %.2f batched, %.2f waking per segment\n",
            batched, unbatched);
    assert_int_equal(sched_setaffinity(0, sizeof(all_cpus), &all_cpus), 0);
    /* Woken for every unit taken, each thread sleeps again 2-3 times a unit. */
    assert_true(unbatched < 1.0);
    assert_true(batched < 1.0);
}

struct pool {
    int live;
};
/* Called from the reader's threads, at once. */
static void *pool_alloc(void *arg, size_t len)
{
    __atomic_fetch_add(&((struct pool *)arg)->live, 1, __ATOMIC_RELAXED);
    return malloc(len ? len : 1);
}
static void pool_free(void *arg, void *p)
{
    __atomic_fetch_sub(&((struct pool *)arg)->live, 1, __ATOMIC_RELAXED);
    free(p);
}

/* Caller-owned buffers: the caller keeps every unit it got; the rest is freed at close. */
static void test_caller_owned_buffers(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    struct pool pool = {0};
    void *kept[20];

    recs_opts(&co, &ro);
    ro.alloc = pool_alloc;
    ro.free_fn = pool_free;
    ro.alloc_arg = &pool;
    tessera_reader *r = open_reader(&co, &ro);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(tessera_reader_next(r, &u), 1);
        assert_true(rec_ok(u.shard, u.record, u.data, u.len));
        kept[i] = u.data;
    }
    usleep(100 * 1000); /* let the window fill */
    tessera_reader_close(r);
    assert_int_equal(pool.live, 20); /* the caller's 20; what was read ahead is freed */
    for (int i = 0; i < 20; i++) {
        assert_non_null(kept[i]);
        pool_free(&pool, kept[i]);
    }
    assert_int_equal(pool.live, 0);
}

/* A rank's plan split among 3 workers in blocks of 4 (a DataLoader with batch size 4): taking
 * block j from worker j mod 3 in turn gives back exactly the rank's plan, in order. */
static void test_split_workers(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    tessera_reader *w[3];
    uint64_t k = 0, want;
    int live = 3;

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "recs";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.plan.rank = 1;
    ro.plan.world = 2;
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    ro.plan.remainder = TESSERA_REMAINDER_PAD;
    ro.split_block = 4;
    ro.split_n = 3;
    for (uint32_t i = 0; i < 3; i++) {
        ro.split_i = i;
        w[i] = open_reader(&co, &ro);
    }
    const tessera_plan *p = tessera_reader_plan(w[0]);
    assert_int_equal(tessera_reader_len(w[0]) + tessera_reader_len(w[1]) + tessera_reader_len(w[2]),
                     tessera_plan_len(p));
    for (uint64_t j = 0; live; j++) {
        tessera_reader *r = w[j % 3];
        for (int b = 0; b < 4; b++) {
            int rc = tessera_reader_next(r, &u);
            if (rc == 0) {
                live -= b == 0;
                break;
            }
            assert_int_equal(rc, 1);
            assert_int_equal(tessera_plan_unit(p, k, &want), 0);
            assert_int_equal(u.k, k);
            assert_int_equal(u.unit, want);
            assert_true(rec_ok(u.shard, u.record, u.data, u.len));
            k++;
        }
    }
    assert_int_equal(k, tessera_plan_len(p));
    for (int i = 0; i < 3; i++)
        tessera_reader_close(w[i]);
    ro.split_i = 3;
    tessera_reader *r = NULL;
    char err[256];
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), TS_EINVAL);
}

/* Kept units outlive the next call and the reader. */
static void test_kept_units(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u, kept[3];

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "recs";
    ro.unit = TESSERA_UNIT_RECORD;
    tessera_reader *r = open_reader(&co, &ro);
    assert_int_equal(tessera_reader_keep(r), TS_ENOENT); /* nothing returned yet */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tessera_reader_next(r, &kept[i]), 1);
        assert_int_equal(tessera_reader_keep(r), 0);
    }
    assert_int_equal(tessera_reader_next(r, &u), 1);
    tessera_reader_close(r);
    for (int i = 0; i < 3; i++) {
        assert_true(rec_ok(kept[i].shard, kept[i].record, kept[i].data, kept[i].len));
        tessera_buffer_free(kept[i].data);
    }
}

/*
 * Kept units given back (tessera_reader_give_back) are read into again: every unit of the
 * plan arrives intact while the two before it are still held, and what is held at close
 * outlives the reader.
 */
static void test_kept_units_given_back(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit held[3];
    uint64_t n = 0;
    int rc;

    recs_opts(&co, &ro);
    ro.window_units = 8;
    tessera_reader *r = open_reader(&co, &ro);
    while ((rc = tessera_reader_next(r, &held[n % 3])) == 1) {
        struct tessera_unit *u = &held[n % 3];
        assert_true(rec_ok(u->shard, u->record, u->data, u->len));
        assert_int_equal(tessera_reader_keep(r), 0);
        for (uint64_t b = n >= 2 ? n - 2 : 0; b < n; b++) /* still intact while held */
            assert_true(
                rec_ok(held[b % 3].shard, held[b % 3].record, held[b % 3].data, held[b % 3].len));
        n++;
        if (n >= 3) /* the oldest goes back: the reader reads a later unit into it */
            tessera_reader_give_back(r, held[n % 3].data);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, total_of(7, nrec_small));
    tessera_reader_close(r);
    for (uint64_t b = n - 2; b < n; b++) {
        assert_true(
            rec_ok(held[b % 3].shard, held[b % 3].record, held[b % 3].data, held[b % 3].len));
        tessera_buffer_free(held[b % 3].data);
    }
    tessera_reader_give_back(NULL, NULL); /* nothing to give: nothing happens */
}

/* The plan's records in a fixed order, each as (length, bytes), read one by one. */
static uint8_t *plan_bytes(const struct tessera_opts *co, struct tessera_reader_opts *ro,
                           size_t *len, uint64_t *units)
{
    struct tessera_unit u;
    tessera_reader *r = open_reader(co, ro);
    uint8_t *all = NULL;
    size_t n = 0;
    int rc;

    *units = 0;
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        all = realloc(all, n + u.len + 1);
        memcpy(all + n, u.data, u.len);
        n += u.len;
        (*units)++;
    }
    assert_int_equal(rc, 0);
    tessera_reader_close(r);
    *len = n;
    return all;
}

/* Batches (tessera_reader_next_many) give the same bytes in the same order as one by one, with
 * a buffer too small for some records (those are taken with tessera_reader_next), a roomy one,
 * and a cap on the count; caller-owned buffers are refused. */
static void test_batches(void **state)
{
    static const size_t caps[] = {1200, 64u << 10};
    static const uint32_t maxes[] = {3, 1000};
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    size_t want_len, lens[1000];
    uint64_t want_units;
    uint8_t *want, *buf = malloc(64u << 10);
    struct pool pool = {0};
    uint32_t n;

    recs_opts(&co, &ro);
    ro.plan.seed = 3;
    want = plan_bytes(&co, &ro, &want_len, &want_units);
    for (size_t c = 0; c < TS_ARRAY_SIZE(caps); c++) {
        for (size_t m = 0; m < TS_ARRAY_SIZE(maxes); m++) {
            tessera_reader *r = open_reader(&co, &ro);
            size_t at = 0;
            uint64_t units = 0, singles = 0;
            int rc;
            while ((rc = tessera_reader_next_many(r, buf, caps[c], lens, maxes[m], &n)) == 1) {
                size_t off = 0;
                if (n == 0) { /* too big for this buffer: on its own */
                    assert_true(lens[0] > caps[c]);
                    assert_int_equal(tessera_reader_next(r, &u), 1);
                    assert_int_equal(u.len, lens[0]);
                    assert_memory_equal(u.data, want + at, u.len);
                    at += u.len;
                    units++;
                    singles++;
                    continue;
                }
                assert_true(n <= maxes[m]);
                for (uint32_t i = 0; i < n; i++) {
                    assert_true(at + off + lens[i] <= want_len);
                    off += lens[i];
                }
                assert_true(off <= caps[c]);
                assert_memory_equal(buf, want + at, off);
                at += off;
                units += n;
            }
            assert_int_equal(rc, 0);
            assert_int_equal(at, want_len);
            assert_int_equal(units, want_units);
            assert_int_equal(tessera_reader_consumed(r), want_units);
            if (caps[c] == 1200)
                assert_true(singles > 0); /* records of up to 1.5 KiB */
            tessera_reader_close(r);
        }
    }
    ro.alloc = pool_alloc;
    ro.free_fn = pool_free;
    ro.alloc_arg = &pool;
    {
        tessera_reader *r = open_reader(&co, &ro);
        assert_int_equal(tessera_reader_next_many(r, buf, 4096, lens, 4, &n), TS_EINVAL);
        tessera_reader_close(r);
    }
    free(want);
    free(buf);
}

/* READV requests the node has answered (its status). */
static uint64_t node_readvs(void)
{
    tessera_client *c = open_client();
    char *json = NULL;
    const char *at;
    uint64_t n;

    assert_int_equal(tessera_status(c, &json), 0);
    at = strstr(json, "\"readv\":");
    assert_non_null(at);
    at += strlen("\"readv\":");
    while (*at == ' ')
        at++;
    n = strtoull(at, NULL, 10);
    free(json);
    tessera_client_close(c);
    return n;
}

/*
 * Small records taken a few at a time by the caller still leave in large READVs: the window
 * refills by halves, not by the caller's few (which sent one small READV per take). Once with
 * the window full by units, once by bytes. Every byte is checked against the plan.
 */
static void test_small_records_large_requests(void **state)
{
    /* Records are up to 1.5 KiB (750 B on average): 32 fill the byte window. Taken 8 at a
     * time with a READV each, that is units / 8 READVs; the bounds are what the halves give
     * here with room to spare (8 and 41 READVs for 469 records; 26 and 56 before). */
    static const struct {
        uint32_t units;
        uint64_t bytes;
        uint64_t per; /* records per READV at least */
    } win[] = {{256, 256u << 20, 24}, {1024, 24u << 10, 10}};
    const char *e = getenv("TESSERA_READER_READV");
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    size_t want_len, lens[8];
    uint64_t want_units, before, sent;
    uint8_t *want, buf[8 * 1500];
    uint32_t n;
    int rc;

    recs_opts(&co, &ro);
    ro.plan.seed = 5;
    ro.connections = 1;
    want = plan_bytes(&co, &ro, &want_len, &want_units);
    for (size_t i = 0; i < TS_ARRAY_SIZE(win); i++) {
        size_t at = 0;
        uint64_t units = 0;
        ro.window_units = win[i].units;
        ro.window_bytes = win[i].bytes;
        ro.depth = 1024;
        before = node_readvs();
        tessera_reader *r = open_reader(&co, &ro);
        while ((rc = tessera_reader_next_many(r, buf, sizeof(buf), lens, 8, &n)) == 1) {
            size_t off = 0;
            assert_true(n > 0);
            for (uint32_t j = 0; j < n; j++)
                off += lens[j];
            assert_true(at + off <= want_len);
            assert_memory_equal(buf, want + at, off);
            at += off;
            units += n;
            usleep(200); /* a caller slower than the node: the window is full at each take */
        }
        assert_int_equal(rc, 0);
        assert_int_equal(at, want_len);
        assert_int_equal(units, want_units);
        tessera_reader_close(r);
        sent = node_readvs() - before;
        fprintf(stderr, "window %u units, %llu bytes: %llu records in %llu READVs\n", win[i].units,
                (unsigned long long)win[i].bytes, (unsigned long long)units,
                (unsigned long long)sent);
        if (!(e && !strcmp(e, "0"))) { /* not in the run with READV off */
            assert_true(sent > 0);
            assert_true(sent * win[i].per <= units);
        }
    }
    free(want);
}

/* Shard units, one shard larger than a single read (TESSERA_MAX_READ): whole, byte for byte. */
static void test_shard_units_large(void **state)
{
    const size_t big = TESSERA_MAX_READ + 3 * CHUNK + 5;
    tessera_client *c = open_client();
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    uint8_t *buf = malloc(big);
    int got[3] = {0};

    mkds(c, "big", 1, 1);
    for (size_t j = 0; j < big; j++)
        buf[j] = (uint8_t)(j * 7 + (j >> 16));
    assert_int_equal(tessera_put(c, "big", 0, buf, big, NULL, 0), 0);
    assert_int_equal(tessera_put(c, "big", 1, buf, 1000, NULL, 0), 0);
    assert_int_equal(tessera_put(c, "big", 2, buf, 0, NULL, 0), 0);
    tessera_client_close(c);

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "big";
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    ro.window_bytes = 1 << 20; /* smaller than the big shard: it is read alone */
    tessera_reader *r = open_reader(&co, &ro);
    assert_int_equal(tessera_reader_len(r), 3);
    while (tessera_reader_next(r, &u) == 1) {
        size_t want = u.shard == 0 ? big : u.shard == 1 ? 1000 : 0;
        assert_int_equal(u.len, want);
        assert_memory_equal(u.data, buf, want ? want : 0);
        got[u.shard]++;
    }
    assert_string_equal(tessera_reader_error(r), "");
    tessera_reader_close(r);
    assert_int_equal(got[0] + got[1] + got[2], 3);
    assert_true(got[0] == 1 && got[1] == 1 && got[2] == 1);
    free(buf);
}

/* Bad options and names are refused at open, saying why. */
static void test_refusals(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    tessera_reader *r = NULL;
    char err[512];

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "nosuch";
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), TS_ENOENT);
    assert_non_null(strstr(err, "nosuch"));
    ro.dataset = "recs";
    ro.plan.rank = 3;
    ro.plan.world = 2;
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), TS_EINVAL);
    assert_non_null(strstr(err, "plan"));
    ro.plan.rank = 0;
    ro.resume = "garbage";
    ro.resume_len = 7;
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), TS_EINVAL);
    assert_non_null(strstr(err, "saved position"));
    ro.resume = NULL;
    ro.connections = 0;
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), TS_EINVAL);
    assert_null(r);
}

/* A job saved at 4 ranks, resumed at 3, saved again, resumed at 5: every record exactly once. */
static void test_resume_4_3_5(void **state)
{
    const uint64_t total = total_of(7, nrec_small);
    const uint64_t take4[4] = {5, 17, 0, 30}, take3[3] = {11, 2, 40};
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    uint8_t *seen = calloc(total, 1);
    uint64_t n = 0, consumed[5];
    void *state1 = NULL, *state2 = NULL;
    size_t len1 = 0, len2 = 0;

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "recs";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.plan.seed = 99;
    ro.plan.epoch = 4;
    ro.plan.assign = TESSERA_ASSIGN_STRIDED;
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    /* Three stages: 4 ranks from the start, 3 from state1, 5 from state2 to the end. */
    for (int stage = 0; stage < 3; stage++) {
        uint32_t world = stage == 0 ? 4 : stage == 1 ? 3 : 5;
        ro.plan.world = world;
        ro.resume = stage == 0 ? NULL : stage == 1 ? state1 : state2;
        ro.resume_len = stage == 0 ? 0 : stage == 1 ? len1 : len2;
        for (uint32_t rank = 0; rank < world; rank++) {
            uint64_t want = stage == 0 ? take4[rank] : stage == 1 ? take3[rank] : UINT64_MAX;
            ro.plan.rank = rank;
            tessera_reader *r = open_reader(&co, &ro);
            while (tessera_reader_consumed(r) < want && tessera_reader_next(r, &u) == 1) {
                assert_true(rec_ok(u.shard, u.record, u.data, u.len));
                assert_int_equal(seen[u.unit], 0);
                seen[u.unit] = 1;
                n++;
            }
            assert_string_equal(tessera_reader_error(r), "");
            consumed[rank] = tessera_reader_consumed(r);
            if (stage < 2 && rank == world - 1) {
                void **sp = stage == 0 ? &state1 : &state2;
                size_t *lp = stage == 0 ? &len1 : &len2;
                assert_int_equal(
                    tessera_plan_state(tessera_reader_plan(r), consumed, world, sp, lp), 0);
            }
            tessera_reader_close(r);
        }
    }
    assert_int_equal(n, total);
    free(state1);
    free(state2);
    free(seen);
}

/* A unit no replica can serve: the error names the dataset, the shard and the record, after
 * the units before it were returned. Last in its group: it restarts the node. */
static void test_unservable_unit_named(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    char cmd[1200];
    int rc, before = 0;

    tessera_client *c = open_client();
    mkds(c, "bad", 1, 1);
    put_record_shards(c, "bad", 3, nrec_small);
    tessera_client_close(c);
    assert_int_equal(tsd_stop(&D), 0);
    snprintf(cmd, sizeof(cmd), "%s %s bad 1 0 100 >/dev/null", CORRUPT_CHUNK_PATH, D.data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&D, NULL), 0);

    client_opts(&co);
    tessera_reader_opts_init(&ro);
    ro.dataset = "bad";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.retries = 2;
    tessera_reader *r = open_reader(&co, &ro);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        assert_true(rec_ok(u.shard, u.record, u.data, u.len));
        before++;
    }
    assert_int_equal(rc, TS_ECORRUPT);
    assert_int_equal(before, (int)nrec_small(0)); /* all of shard 0, then shard 1's first */
    fprintf(stderr, "reader error: %s\n", tessera_reader_error(r));
    assert_non_null(strstr(tessera_reader_error(r), "bad shard 1 record 0"));
    assert_int_equal(tessera_reader_next(r, &u), TS_ECORRUPT); /* it stays failed */
    struct tessera_reader_stats st;
    tessera_reader_stats(r, &st);
    assert_true(st.retries >= 2);
    tessera_reader_close(r);
}

/* A single node killed (kill -9) and restarted at the same address mid-read: the reader's
 * connection breaks, it connects again (backing off meanwhile) and every unit still comes
 * back once, in order, byte for byte. */
static void test_node_restart_reconnects(void **state)
{
    static struct tsd_proc E;
    static char listen[64];
    struct tessera_reader_opts ro;
    struct tessera_reader_stats st;
    struct tessera_opts co;
    struct tessera_unit u;
    tessera_client *c = NULL;
    uint64_t k = 0;
    int rc;

    memset(&E, 0, sizeof(E));
    assert_int_equal(tsd_start(&E, NULL), 0);
    snprintf(listen, sizeof(listen), "%s", E.addr);
    E.argv[2] = listen; /* restarts listen where the reader connects */
    tessera_opts_init(&co);
    co.address = listen;
    assert_int_equal(tessera_client_open(&c, &co), 0);
    mkds(c, "again", 1, 1);
    put_record_shards(c, "again", 4, nrec_small);
    tessera_client_close(c);

    tessera_reader_opts_init(&ro);
    ro.dataset = "again";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.connections = 1;
    ro.window_units = 4;
    ro.retries = 10;
    tessera_reader *r = open_reader(&co, &ro);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        assert_int_equal(u.k, k);
        assert_true(rec_ok(u.shard, u.record, u.data, u.len));
        if (++k == 30) {
            tsd_kill9(&E);
            assert_int_equal(tsd_start(&E, NULL), 0);
            assert_string_equal(E.addr, listen);
        }
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, total_of(4, nrec_small));
    tessera_reader_stats(r, &st);
    fprintf(stderr, "retries %llu, reconnects %llu\n", (unsigned long long)st.retries,
            (unsigned long long)st.reconnects);
    assert_true(st.reconnects >= 1);
    tessera_reader_close(r);
    assert_int_equal(tsd_stop(&E), 0);
    tsd_cleanup(&E);
}

/* ---- a 5-node cluster -------------------------------------------------------------------------
 */

static uint64_t nrec_cluster(uint32_t s)
{
    return 150 + (s % 4) * 25;
}

#define CL_SHARDS 16
#define RANKS 4

struct rank_run {
    uint32_t rank;
    const char *addr;
    uint64_t done; /* units read so far */
    uint64_t bad;  /* units wrong or out of order */
    int rc;        /* how the reader ended (0: the end of its plan) */
    char err[600];
    uint64_t *units;  /* what it read, in order */
    char (*node)[16]; /* who served each */
    struct tessera_reader_stats st;
    int *kill_done;
    uint64_t after_kill_from; /* first position read after the kill */
};

static void *rank_main(void *arg)
{
    struct rank_run *rr = arg;
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    tessera_reader *r = NULL;
    int rc;

    tessera_opts_init(&co);
    co.address = rr->addr;
    co.timeout_ms = 5000;
    tessera_reader_opts_init(&ro);
    ro.dataset = "train";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.plan.seed = 3;
    ro.plan.rank = rr->rank;
    ro.plan.world = RANKS;
    ro.plan.assign = TESSERA_ASSIGN_STRIDED;
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    ro.window_units = 8;
    rr->rc = tessera_reader_open(&r, &co, &ro, rr->err, sizeof(rr->err));
    if (rr->rc)
        return NULL;
    rr->after_kill_from = UINT64_MAX;
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        uint64_t want = UINT64_MAX;
        tessera_plan_unit(tessera_reader_plan(r), u.k, &want);
        if (u.k != rr->done || u.unit != want || !rec_ok(u.shard, u.record, u.data, u.len))
            rr->bad++;
        if (__atomic_load_n(rr->kill_done, __ATOMIC_ACQUIRE) && rr->after_kill_from == UINT64_MAX)
            rr->after_kill_from = rr->done;
        rr->units[rr->done] = u.unit;
        snprintf(rr->node[rr->done], sizeof(rr->node[0]), "%s", u.node);
        __atomic_store_n(&rr->done, rr->done + 1, __ATOMIC_RELEASE);
        usleep(300); /* a training step */
    }
    rr->rc = rc;
    snprintf(rr->err, sizeof(rr->err), "%s", tessera_reader_error(r));
    tessera_reader_stats(r, &rr->st);
    tessera_reader_close(r);
    return NULL;
}

static int setup_cluster(void **state)
{
    memset(&CL, 0, sizeof(CL));
    if (tsd_cluster_start(&CL, 5, NULL, 16, NULL) != 0) {
        tsd_cluster_dump_logs(&CL);
        return -1;
    }
    return 0;
}

static int teardown_cluster(void **state)
{
    /* The killed node is gone (and reaped); the others must stop cleanly. */
    return tsd_cluster_stop(&CL);
}

static void test_kill9_during_4_rank_read(void **state)
{
    const uint64_t total = total_of(CL_SHARDS, nrec_cluster);
    struct tessera_opts o;
    tessera_client *c = NULL;
    struct rank_run rr[RANKS];
    pthread_t th[RANKS];
    int kill_done = 0;
    uint8_t *seen = calloc(total, 1);
    const int victim = 2;
    uint64_t n = 0, retries = 0, served_by_victim = 0;

    tsd_client_opts(&o, &CL.node[0], "writer");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    mkds(c, "train", 3, 2);
    put_record_shards(c, "train", CL_SHARDS, nrec_cluster);
    tessera_client_close(c);

    for (int i = 0; i < RANKS; i++) {
        memset(&rr[i], 0, sizeof(rr[i]));
        rr[i].rank = (uint32_t)i;
        rr[i].addr = CL.node[i == victim ? 0 : i].addr;
        rr[i].units = calloc(total, sizeof(uint64_t));
        rr[i].node = calloc(total, sizeof(rr[i].node[0]));
        rr[i].kill_done = &kill_done;
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &rr[i]), 0);
    }
    /* Kill a replica once every rank is a quarter through. */
    for (int t = 0; t < 6000; t++) {
        int ready = 1;
        for (int i = 0; i < RANKS; i++)
            ready &= __atomic_load_n(&rr[i].done, __ATOMIC_ACQUIRE) >= total / RANKS / 4;
        if (ready)
            break;
        usleep(5000);
    }
    tsd_kill9(&CL.node[victim]);
    __atomic_store_n(&kill_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < RANKS; i++)
        pthread_join(th[i], NULL);

    for (int i = 0; i < RANKS; i++) {
        if (rr[i].rc)
            fprintf(stderr, "rank %d: %s: %s\n", i, ts_errname(rr[i].rc), rr[i].err);
        assert_int_equal(rr[i].rc, 0);
        assert_int_equal(rr[i].bad, 0);
        assert_true(rr[i].after_kill_from != UINT64_MAX); /* the kill came mid-read */
        for (uint64_t k = 0; k < rr[i].done; k++) {
            assert_int_equal(seen[rr[i].units[k]], 0);
            seen[rr[i].units[k]] = 1;
            n++;
            if (strcmp(rr[i].node[k], CL.id[victim]) == 0) {
                served_by_victim++;
                /* Units read ahead before the kill may come after it; none read later. */
                assert_true(k < rr[i].after_kill_from + 8 + 1);
            }
        }
        retries += rr[i].st.retries;
        fprintf(stderr, "rank %d: %llu units, stall %.1f ms, retries %llu, reconnects %llu, nodes",
                i, (unsigned long long)rr[i].done, rr[i].st.stall_ns / 1e6,
                (unsigned long long)rr[i].st.retries, (unsigned long long)rr[i].st.reconnects);
        for (size_t x = 0; x < rr[i].st.nnodes; x++)
            fprintf(stderr, " %s:%llu", rr[i].st.nodes[x].node,
                    (unsigned long long)rr[i].st.nodes[x].units);
        fprintf(stderr, "\n");
        free(rr[i].units);
        free(rr[i].node);
    }
    assert_int_equal(n, total);
    assert_true(served_by_victim > 0); /* it was serving before it died */
    free(seen);
}

/* Node index of each replica of ds/shard (the map's order: primary first). */
static int replicas(const char *ds, uint32_t shard, int *out)
{
    struct ts_map *m = NULL;
    int order[8], n = 0;

    for (int i = 0; i < CL.n && !m; i++)
        if (tsd_alive(&CL.node[i]))
            m = raw_map_get(CL.node[i].addr);
    assert_non_null(m);
    size_t k = ts_map_pg_order(m, ts_map_pg_of(m, ds, shard), order, 8);
    for (size_t i = 0; i < k && i < 3; i++)
        out[n++] = tsd_cluster_find(&CL, m->nodes[order[i]].id);
    ts_map_free(m);
    return n;
}

/*
 * Replica faults are passed over without the caller seeing them: one replica of a shard
 * serves a corrupt chunk (bytes flipped in its store), another node stops answering (SIGSTOP:
 * its reads time out), and a third is still dead from the test before. Every unit comes back
 * right, and the reader counted the retries.
 */
static void test_replica_faults_passed_over(void **state)
{
    const uint64_t total = total_of(CL_SHARDS, nrec_cluster);
    struct tessera_reader_opts ro;
    struct tessera_reader_stats st;
    struct tessera_opts co;
    struct tessera_unit u;
    int rep[3], bad = -1, stopped = -1, seed = -1, rc;
    uint32_t shard = 0;
    uint64_t n = 0;
    char cmd[1200];

    /* A shard with a live replica to corrupt and another live one to read it from. */
    for (shard = 0; shard < CL_SHARDS && bad < 0; shard++) {
        int k = replicas("train", shard, rep), live = 0;
        for (int i = 0; i < k; i++)
            live += tsd_alive(&CL.node[rep[i]]);
        if (live >= 2)
            for (int i = 0; i < k && bad < 0; i++)
                if (tsd_alive(&CL.node[rep[i]]))
                    bad = rep[i];
    }
    shard--;
    assert_true(bad >= 0);
    assert_int_equal(tsd_stop(&CL.node[bad]), 0);
    snprintf(cmd, sizeof(cmd), "%s %s train %u 0 10 >/dev/null", CORRUPT_CHUNK_PATH,
             CL.node[bad].data, shard);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&CL.node[bad], NULL), 0);
    /* Stop a node that is neither the corrupt one nor the shard's last good replica. */
    int k = replicas("train", shard, rep);
    for (int i = 0; i < CL.n && stopped < 0; i++) {
        int in_set = 0;
        for (int j = 0; j < k; j++)
            in_set |= rep[j] == i;
        if (i != bad && !in_set && tsd_alive(&CL.node[i]))
            stopped = i;
    }
    for (int i = 0; i < CL.n && seed < 0; i++)
        if (i != stopped && tsd_alive(&CL.node[i]))
            seed = i;
    assert_true(stopped >= 0 && seed >= 0);
    assert_int_equal(kill(CL.node[stopped].pid, SIGSTOP), 0);

    tessera_opts_init(&co);
    co.address = CL.node[seed].addr;
    co.timeout_ms = 1500;
    tessera_reader_opts_init(&ro);
    ro.dataset = "train";
    ro.unit = TESSERA_UNIT_RECORD;
    ro.plan.shuffle = TESSERA_SHUFFLE_WINDOW;
    ro.plan.window = 4;
    ro.connections = 3;
    tessera_reader *r = open_reader(&co, &ro);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        assert_true(rec_ok(u.shard, u.record, u.data, u.len));
        assert_string_not_equal(u.node, CL.id[stopped]);
        n++;
    }
    if (rc)
        fprintf(stderr, "reader: %s\n", tessera_reader_error(r));
    assert_int_equal(rc, 0);
    assert_int_equal(n, total);
    tessera_reader_stats(r, &st);
    fprintf(stderr, "corrupt replica %s (shard %u), stopped %s: retries %llu, stall %.1f ms\n",
            CL.id[bad], shard, CL.id[stopped], (unsigned long long)st.retries, st.stall_ns / 1e6);
    assert_true(st.retries >= 1);
    tessera_reader_close(r);
    kill(CL.node[stopped].pid, SIGCONT);
}

int main(void)
{
    const struct CMUnitTest node_tests[] = {
        cmocka_unit_test(test_records_in_plan_order),
        cmocka_unit_test(test_caller_owned_buffers),
        cmocka_unit_test(test_threads_sleep_while_caller_has_units),
        cmocka_unit_test(test_kept_units),
        cmocka_unit_test(test_kept_units_given_back),
        cmocka_unit_test(test_batches),
        cmocka_unit_test(test_small_records_large_requests),
        cmocka_unit_test(test_split_workers),
        cmocka_unit_test(test_shard_units_large),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_resume_4_3_5),
        cmocka_unit_test(test_node_restart_reconnects),
        cmocka_unit_test(test_unservable_unit_named),
    };
    const struct CMUnitTest cluster_tests[] = {
        cmocka_unit_test(test_kill9_during_4_rank_read),
        cmocka_unit_test(test_replica_faults_passed_over),
    };
    int rc = cmocka_run_group_tests_name("reader_node", node_tests, setup_node, teardown_node);
    rc += cmocka_run_group_tests_name("reader_cluster", cluster_tests, setup_cluster,
                                      teardown_cluster);
    tsd_cleanup(&D);
    return rc;
}
