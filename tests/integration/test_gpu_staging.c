/*
 * The staging pipeline of tessera_read_device (client/gpu/staging.c) against a real tesserad,
 * with a host backend standing in for the CUDA copy (its only difference): ranges of every
 * shape land byte for byte as tessera_read gives them, over many pipeline steps; failures
 * leave the destination untouched (nothing unverified is copied); the handle stays usable.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gpu/placed.h"
#include "gpu/staging.h"
#include "tessera/gpu.h"
#include "tessera/tessera.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK (256u << 10)
#define SIZE ((9u << 20) + 12345)

static struct tsd_proc D;
static tessera_client *C;
static uint8_t *shard;

struct host_ctx {
    unsigned copies, syncs, live;
};

static int h_alloc(void *ctx, void **p, size_t n)
{
    ((struct host_ctx *)ctx)->live++;
    *p = malloc(n);
    return *p ? 0 : TS_ENOMEM;
}

static void h_free(void *ctx, void *p)
{
    ((struct host_ctx *)ctx)->live--;
    free(p);
}

static int h_copy(void *ctx, void *dst, const void *src, size_t n)
{
    ((struct host_ctx *)ctx)->copies++;
    memcpy(dst, src, n);
    return 0;
}

static int h_sync(void *ctx)
{
    ((struct host_ctx *)ctx)->syncs++;
    return 0;
}

static int setup(void **state)
{
    struct tessera_opts o;
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};

    if (tsd_start(&D, NULL) != 0)
        return -1;
    tessera_opts_init(&o);
    o.address = D.addr;
    if (tessera_client_open(&C, &o) != 0 || tessera_dataset_create(C, "stage", &p) != 0)
        return -1;
    shard = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++)
        shard[i] = (uint8_t)((i * 2654435761u) >> 11);
    return tessera_put(C, "stage", 0, shard, SIZE, NULL, 0) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    tessera_client_close(C);
    free(shard);
    tsd_stop(&D);
    tsd_cleanup(&D);
    return 0;
}

/* One staged read of [off, off+len) with pieces of `piece` bytes, checked against the shard. */
static void staged(uint64_t off, size_t len, size_t piece)
{
    struct host_ctx hc = {0, 0, 0};
    struct ts_stage_ops ops = {"host", h_alloc, h_free, h_copy, h_sync, &hc};
    struct tessera_device_stats st;
    size_t want = off >= SIZE ? 0 : (len < SIZE - off ? len : SIZE - off), n = 99;
    uint8_t *dst = malloc(len + 16);

    memset(dst, 0xEE, len + 16);
    assert_int_equal(ts_read_staged(C, "stage", 0, off, len, dst, &n, &ops, piece, &st), 0);
    assert_int_equal(n, want);
    if (want)
        assert_memory_equal(dst, shard + off, want);
    for (size_t i = want; i < len + 16; i++)
        assert_int_equal(dst[i], 0xEE);
    assert_string_equal(st.path, "staging");
    assert_int_equal(st.bytes, want);
    assert_int_equal(hc.live, 0); /* every staging buffer given back */
    free(dst);
}

static void test_ranges(void **state)
{
    staged(0, 0, 1u << 20);
    staged(0, 1, 1u << 20);
    staged(CHUNK - 3, 10, 1u << 20);         /* across a chunk boundary */
    staged(5, SIZE - 10, 1u << 20);          /* ten pipeline steps, partial ends */
    staged(0, SIZE, 3u << 20);               /* pieces not a multiple of the chunk */
    staged(SIZE - 100, 1u << 20, 64u << 10); /* runs past the end: cut there */
    staged(0, SIZE + (4u << 20), 1u << 20);  /* ends inside a piece, more pieces asked */
    staged(0, 2u << 20, 1u << 20);           /* the shard's end falls on no piece boundary */
}

static void test_failures_copy_nothing(void **state)
{
    struct host_ctx hc = {0, 0, 0};
    struct ts_stage_ops ops = {"host", h_alloc, h_free, h_copy, h_sync, &hc};
    uint8_t dst[4096];
    size_t n = 7;

    memset(dst, 0xEE, sizeof(dst));
    assert_int_equal(ts_read_staged(C, "nosuch", 0, 0, sizeof(dst), dst, &n, &ops, 1024, NULL),
                     TS_ENOENT);
    assert_int_equal(
        ts_read_staged(C, "stage", 0, (uint64_t)SIZE + 1, sizeof(dst), dst, &n, &ops, 1024, NULL),
        TS_ERANGE);
    assert_int_equal(n, 0);
    assert_int_equal(hc.copies, 0);
    for (size_t i = 0; i < sizeof(dst); i++)
        assert_int_equal(dst[i], 0xEE);
    assert_int_equal(hc.live, 0);
    staged(0, 4096, 1024); /* the handle still works */
    /* The public call: a build without CUDA says so; with CUDA but no GPU here, so does it. */
    {
        int rc = tessera_read_device(C, "stage", 0, 0, 16, dst, &n, NULL);
        assert_true(rc == TS_ENOTSUP || rc == TS_EIO);
        assert_true(strlen(tessera_client_error(C)) > 0);
    }
}

/* GPUDirect's placed path needs a transport the node writes into (RDMA): over TCP it reads
 * nothing and says so, so tessera_read_device goes on through staging (test_rdma covers the
 * placed path itself). */
static int never(void *ctx, const uint8_t *table, uint32_t n, const void *dst, size_t len)
{
    return TS_EIO;
}

static void test_placed_needs_rdma(void **state)
{
    const struct ts_place_path paths[] = {{"peermem", {NULL, NULL}}};
    struct ts_place_ops ops = {paths, 1, never, NULL};
    struct tessera_device_stats st;
    uint8_t dst[4096];
    size_t n = 7;

    memset(dst, 0xEE, sizeof(dst));
    assert_int_equal(ts_read_placed(C, "stage", 0, 0, sizeof(dst), dst, &n, &ops, &st), TS_ENOTSUP);
    assert_int_equal(n, 0);
    assert_non_null(strstr(tessera_client_error(C), "RDMA"));
    for (size_t i = 0; i < sizeof(dst); i++)
        assert_int_equal(dst[i], 0xEE);
    staged(0, 4096, 1024); /* the handle still works */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_failures_copy_nothing),
        cmocka_unit_test(test_placed_needs_rdma),
    };
    return cmocka_run_group_tests_name("gpu_staging", tests, setup, teardown);
}
