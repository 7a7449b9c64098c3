/*
 * Issue 28: what makes a seal durable, counted. kill -9 tests cannot see a missing fsync (the
 * page cache survives a process), so this test interposes fdatasync(2) and fsync(2) — RocksDB
 * and the chunk files call them through libc — and counts, per kind of file, the syncs that a
 * put (begin, chunks, seal) makes under each policy:
 *   sync = seal:   the shard's chunk file and the WAL (the seal's record) at least once each;
 *   sync = always: the WAL at least once per chunk, and the chunk file;
 *   sync = none:   neither.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_syncs_file_and_wal),
        cmocka_unit_test(test_always_syncs_every_chunk),
        cmocka_unit_test(test_none_syncs_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
