/*
 * The hotness window (server/hotness.c): PGs, datasets and a Space-Saving sketch of shards over
 * a sliding window of 6 x 10 s, driven on a clock of the test's own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "hotness.h"

#define S 1000000000ull

static void test_pgs_ranked_and_median(void **state)
{
    struct tsd_hot *h = NULL;
    struct tsd_hot_pg top[4];
    size_t n;

    assert_int_equal(tsd_hot_create(&h, 8), 0);
    tsd_hot_advance(h, 100 * S);
    for (int i = 0; i < 10; i++)
        tsd_hot_add(h, "d", 1, 3, 1000); /* PG 3: 10,000 bytes */
    tsd_hot_add(h, "d", 2, 5, 500);      /* PG 5: 500 */
    tsd_hot_add(h, "d", 3, 1, 700);      /* PG 1: 700 */
    tsd_hot_add(h, "d", 4, 99, 700);     /* no such PG: datasets and shards only */
    n = tsd_hot_top_pgs(h, top, 4);
    assert_int_equal(n, 3);
    assert_int_equal(top[0].pg, 3);
    assert_int_equal(top[0].bytes, 10000);
    assert_int_equal(top[0].reads, 10);
    assert_int_equal(top[1].pg, 1);
    assert_int_equal(top[2].pg, 5);
    assert_int_equal(tsd_hot_pg_median(h), 700);
    n = tsd_hot_top_pgs(h, top, 1); /* k bounds the answer */
    assert_int_equal(n, 1);
    tsd_hot_destroy(h);
}

static void test_window_slides(void **state)
{
    struct tsd_hot *h = NULL;
    struct tsd_hot_pg top[2];
    struct tsd_hot_ds ds[2];

    assert_int_equal(tsd_hot_create(&h, 4), 0);
    tsd_hot_advance(h, 1000 * S);
    tsd_hot_add(h, "old", 0, 0, 5000);
    tsd_hot_advance(h, 1030 * S); /* 30 s on: still in the window */
    tsd_hot_add(h, "new", 0, 1, 100);
    assert_int_equal(tsd_hot_top_pgs(h, top, 2), 2);
    assert_int_equal(top[0].pg, 0);
    assert_int_equal(tsd_hot_top_datasets(h, ds, 2), 2);
    assert_string_equal(ds[0].name, "old");
    tsd_hot_advance(h, 1065 * S); /* 65 s after the first read: it left the window */
    assert_int_equal(tsd_hot_top_pgs(h, top, 2), 1);
    assert_int_equal(top[0].pg, 1);
    assert_int_equal(tsd_hot_top_datasets(h, ds, 2), 1);
    assert_string_equal(ds[0].name, "new");
    assert_true(tsd_hot_window_s(h, 1065 * S) <= 60.0);
    assert_true(tsd_hot_window_s(h, 1065 * S) >= 50.0);
    tsd_hot_advance(h, 2000 * S); /* long idle: everything gone */
    assert_int_equal(tsd_hot_top_pgs(h, top, 2), 0);
    assert_int_equal(tsd_hot_pg_median(h), 0);
    tsd_hot_destroy(h);
}

/* Space-Saving: a shard read more than 1/64 of the bytes is found among thousands of cold
 * ones, with at most the smallest counter's overestimate. */
static void test_sketch_finds_hot_shards_in_bounded_memory(void **state)
{
    struct tsd_hot *h = NULL;
    struct tsd_hot_shard top[3];
    size_t n;

    assert_int_equal(tsd_hot_create(&h, 0), 0);
    tsd_hot_advance(h, 5 * S);
    for (uint32_t i = 0; i < 20000; i++) {
        tsd_hot_add(h, "cold", i, UINT32_MAX, 100); /* 20,000 shards read once */
        if (i % 20 == 0)
            tsd_hot_add(h, "hot", 7, UINT32_MAX, 1000); /* 1,000 reads of 1000 */
        if (i % 40 == 0)
            tsd_hot_add(h, "warm", 9, UINT32_MAX, 1000); /* 500 of 1000 */
    }
    n = tsd_hot_top_shards(h, top, 3);
    assert_int_equal(n, 3);
    assert_string_equal(top[0].dataset, "hot");
    assert_int_equal(top[0].shard, 7);
    assert_true(top[0].bytes >= 1000000);
    assert_true(top[0].bytes <= 1000000 + 2500000 / 64 * 2); /* the overestimate bound */
    assert_string_equal(top[1].dataset, "warm");
    assert_int_equal(top[1].shard, 9);
    tsd_hot_destroy(h);
}

static void test_pg_count_changes(void **state)
{
    struct tsd_hot *h = NULL;
    struct tsd_hot_pg top[2];

    assert_int_equal(tsd_hot_create(&h, 0), 0);
    tsd_hot_advance(h, 5 * S);
    tsd_hot_add(h, "d", 0, 3, 10); /* no PGs yet (a single node) */
    assert_int_equal(tsd_hot_top_pgs(h, top, 2), 0);
    assert_int_equal(tsd_hot_set_npg(h, 16), 0); /* the first map */
    assert_int_equal(tsd_hot_npg(h), 16);
    tsd_hot_add(h, "d", 0, 3, 10);
    assert_int_equal(tsd_hot_top_pgs(h, top, 2), 1);
    assert_int_equal(top[0].pg, 3);
    tsd_hot_destroy(h);
    tsd_hot_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pgs_ranked_and_median),
        cmocka_unit_test(test_window_slides),
        cmocka_unit_test(test_sketch_finds_hot_shards_in_bounded_memory),
        cmocka_unit_test(test_pg_count_changes),
    };
    return cmocka_run_group_tests_name("hotness", tests, NULL, NULL);
}
