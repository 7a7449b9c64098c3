/*
 * Issue 28: what makes a seal durable, counted. kill -9 tests cannot see a missing fsync (the
 * page cache survives a process), so this test interposes fdatasync(2) and fsync(2) — RocksDB
 * and the chunk files call them through libc — and counts, per kind of file, the syncs that a
 * put (begin, chunks, seal) makes under each policy:
 *   sync = seal:   the shard's chunk file and the WAL (the seal's record) at least once each;
 *   sync = always: the WAL at least once per chunk, and the chunk file;
 *   sync = none:   neither.
 * And the group commit of seals: concurrent seals share one WAL sync, none acknowledged first.
 * Deleting the chunk file's fdatasync (storage/chunkfile.c) or the synced write options
 * (storage/store.c) fails it in the ordinary suite; tests/powercut shows the same with real
 * power cuts of a qemu guest.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ts_test.h"

#include "ts_store.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (64u << 10)

enum { K_CHUNK, K_WAL, K_OTHER, K_N };
static atomic_uint syncs[K_N];

static int kind_of(int fd)
{
    char link[64], path[PATH_MAX];
    ssize_t n;
    size_t len;

    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof(path) - 1);
    if (n <= 0)
        return K_OTHER;
    path[n] = '\0';
    len = (size_t)n;
    if (strstr(path, "/chunks/"))
        return K_CHUNK;
    if (len > 4 && !strcmp(path + len - 4, ".log"))
        return K_WAL;
    return K_OTHER;
}

/* The interposed calls (this executable's definitions come first for every library): count,
 * then call libc's. */
static int counted(const char *name, int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);

    atomic_fetch_add(&syncs[kind_of(fd)], 1);
    return real ? real(fd) : -1;
}

int fdatasync(int fd)
{
    return counted("fdatasync", fd);
}

int fsync(int fd)
{
    return counted("fsync", fd);
}

struct counted {
    unsigned chunk, wal;
};

/* A put of `chunks` chunks under `policy` in a fresh store; the syncs it made. */
static struct counted put_counted(int policy, unsigned chunks)
{
    struct ts_store_opts o;
    struct ts_dataset_policy p;
    ts_store *s = NULL;
    ts_shard_writer *w = NULL;
    char *dir = ts_test_tmpdir("sync");
    uint8_t *buf = malloc(CHUNK);
    uint32_t crc = 0;
    struct counted c;

    ts_store_opts_init(&o);
    o.path = dir;
    o.sync = policy;
    assert_int_equal(ts_store_open(&s, &o), 0);
    ts_dataset_policy_init(&p);
    p.chunk_size = CHUNK;
    assert_int_equal(ts_store_dataset_create(s, "d", &p), 0);
    assert_int_equal(ts_store_shard_begin(s, "d", 7, (uint64_t)chunks * CHUNK, &w), 0);
    for (int k = 0; k < K_N; k++)
        atomic_store(&syncs[k], 0);
    for (unsigned i = 0; i < chunks; i++) {
        ts_test_fill(buf, CHUNK, 42, (uint64_t)i * CHUNK);
        crc = ts_crc32c(crc, buf, CHUNK);
        assert_int_equal(ts_shard_writer_put(w, i, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    }
    assert_int_equal(ts_shard_writer_seal(w, 1, crc, NULL, 0), 0);
    c.chunk = atomic_load(&syncs[K_CHUNK]);
    c.wal = atomic_load(&syncs[K_WAL]);
    fprintf(stderr, "sync = %s, %u chunks: %u syncs of the chunk file, %u of the WAL, %u other\n",
            ts_store_sync_name(policy), chunks, c.chunk, c.wal, atomic_load(&syncs[K_OTHER]));
    ts_store_close(s);
    ts_test_rmtree(dir);
    free(buf);
    return c;
}

static void test_seal_syncs_file_and_wal(void **state)
{
    struct counted c = put_counted(TS_SYNC_SEAL, 4);

    (void)state;
    assert_true(c.chunk >= 1); /* the shard's bytes (storage/chunkfile.c) */
    assert_true(c.wal >= 1);   /* the seal's record (storage/store.c: synced write options) */
}

static void test_always_syncs_every_chunk(void **state)
{
    struct counted c = put_counted(TS_SYNC_ALWAYS, 4);

    (void)state;
    assert_true(c.chunk >= 1);
    assert_true(c.wal >= 5); /* each chunk's record before its acknowledgement, and the seal */
}

static void test_none_syncs_nothing(void **state)
{
    struct counted c = put_counted(TS_SYNC_NONE, 4);

    (void)state;
    assert_int_equal(c.chunk, 0);
    assert_int_equal(c.wal, 0);
}

/*
 * Group commit (storage/commit.c): seals queued while the commit thread is held are written
 * and made durable by ONE sync of the WAL, and none is reported done before that sync: each
 * done callback sees the WAL's sync count past what it was when the seals were queued.
 * Reporting before the sync (or syncing per seal) fails it.
 */
#define GROUP 16

struct group_seen {
    atomic_uint done, bad_rc, before_sync;
    unsigned wal_at_queue;
};

static void group_done(void *arg, int rc)
{
    struct group_seen *g = arg;

    if (rc)
        atomic_fetch_add(&g->bad_rc, 1);
    if (atomic_load(&syncs[K_WAL]) <= g->wal_at_queue)
        atomic_fetch_add(&g->before_sync, 1); /* acknowledged before any sync covered it */
    atomic_fetch_add(&g->done, 1);
}

static void group_commit_run(uint32_t inline_max)
{
    struct ts_store_opts o;
    struct ts_dataset_policy p;
    struct ts_commit_stats st;
    struct group_seen g;
    ts_store *s = NULL;
    ts_shard_writer *w[GROUP];
    char *dir = ts_test_tmpdir("group");
    uint8_t buf[16384];
    unsigned wal, chunk;

    memset(&g, 0, sizeof(g));
    ts_store_opts_init(&o);
    o.path = dir;
    o.sync = TS_SYNC_SEAL;
    o.inline_max = inline_max;
    assert_int_equal(ts_store_open(&s, &o), 0);
    assert_true(ts_store_group_commit(s));
    ts_dataset_policy_init(&p);
    assert_int_equal(ts_store_dataset_create(s, "g", &p), 0);
    for (unsigned i = 0; i < GROUP; i++) {
        ts_test_fill(buf, sizeof(buf), 7, i);
        assert_int_equal(ts_store_shard_begin(s, "g", i, sizeof(buf), &w[i]), 0);
        assert_int_equal(
            ts_shard_writer_put(w[i], 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))), 0);
    }
    ts_store_commit_hold(s, 1);
    for (int k = 0; k < K_N; k++)
        atomic_store(&syncs[k], 0);
    g.wal_at_queue = 0;
    for (unsigned i = 0; i < GROUP; i++)
        assert_int_equal(ts_shard_writer_seal_async(w[i], 0, 0, NULL, 0, NULL, group_done, &g), 0);
    usleep(50000);
    assert_int_equal(atomic_load(&g.done), 0); /* held: nothing written, nothing reported */
    ts_store_commit_hold(s, 0);
    ts_store_commit_quiesce(s);
    wal = atomic_load(&syncs[K_WAL]);
    chunk = atomic_load(&syncs[K_CHUNK]);
    ts_store_commit_stats(s, &st);
    fprintf(stderr,
            "group commit (%s): %u seals, %u WAL syncs, %u chunk-file syncs; stats: %llu seals, "
            "%llu syncs, largest group %llu\n",
            inline_max ? "inline shards" : "chunk files", atomic_load(&g.done), wal, chunk,
            (unsigned long long)st.seals, (unsigned long long)st.syncs,
            (unsigned long long)st.largest_group);
    assert_int_equal(atomic_load(&g.done), GROUP);
    assert_int_equal(atomic_load(&g.bad_rc), 0);
    assert_int_equal(atomic_load(&g.before_sync), 0);
    assert_int_equal(wal, 1); /* one WAL sync for the group */
    assert_int_equal(st.syncs, 1);
    assert_int_equal(st.largest_group, GROUP);
    /* Chunk files: each shard's bytes synced before its record (no file when inline). */
    assert_int_equal(chunk, inline_max ? 0 : GROUP);
    for (unsigned i = 0; i < GROUP; i++) {
        struct ts_shard_info si;
        assert_int_equal(ts_store_shard_stat(s, "g", i, &si), 0);
        assert_int_equal(si.state, TS_SHARD_COMPLETE);
    }
    ts_store_close(s);
    ts_test_rmtree(dir);
}

static void test_group_commit_one_sync(void **state)
{
    (void)state;
    group_commit_run(0);
    group_commit_run(64u << 10);
}

/* A seal refused by its checks returns at once and leaves the writer to the caller. */
static void test_group_commit_refusal(void **state)
{
    struct ts_store_opts o;
    struct ts_dataset_policy p;
    struct group_seen g;
    ts_store *s = NULL;
    ts_shard_writer *w = NULL;
    char *dir = ts_test_tmpdir("group");
    uint8_t buf[4096];

    (void)state;
    memset(&g, 0, sizeof(g));
    ts_store_opts_init(&o);
    o.path = dir;
    assert_int_equal(ts_store_open(&s, &o), 0);
    ts_dataset_policy_init(&p);
    p.chunk_size = sizeof(buf);
    assert_int_equal(ts_store_dataset_create(s, "g", &p), 0);
    ts_test_fill(buf, sizeof(buf), 3, 0);
    assert_int_equal(ts_store_shard_begin(s, "g", 1, 2 * sizeof(buf), &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    assert_int_equal(ts_shard_writer_seal_async(w, 0, 0, NULL, 0, NULL, group_done, &g),
                     TS_EINCOMPLETE);
    ts_test_fill(buf, sizeof(buf), 3, sizeof(buf));
    assert_int_equal(ts_shard_writer_put(w, 1, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    assert_int_equal(ts_shard_writer_seal_async(w, 1, 0x12345678, NULL, 0, NULL, group_done, &g),
                     TS_ECORRUPT);
    assert_int_equal(ts_shard_writer_seal_async(w, 0, 0, NULL, 0, NULL, group_done, &g), 0);
    ts_store_commit_quiesce(s);
    assert_int_equal(atomic_load(&g.done), 1);
    assert_int_equal(atomic_load(&g.bad_rc), 0);
    ts_store_close(s);
    ts_test_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_syncs_file_and_wal),
        cmocka_unit_test(test_always_syncs_every_chunk),
        cmocka_unit_test(test_none_syncs_nothing),
        cmocka_unit_test(test_group_commit_one_sync),
        cmocka_unit_test(test_group_commit_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
