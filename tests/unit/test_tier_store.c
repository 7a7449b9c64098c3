/*
 * Unit tests for storage/tier.c (issue 33) on a real RocksDB: a sealed dataset's replica bytes
 * dropped — reads answer TS_EFRAGMENTED, the shard records stay whole, scrub finds nothing to
 * check, the mark survives a reopen — and put back chunk by chunk (each checked against its
 * stored CRC32C) before the bytes are kept again; the refusals change nothing. Chunk files and
 * chunks kept in the engine (inline shards) alike. A replica following a primary's drop keeps
 * the bytes it holds.
 */
#include "store_util.h"
#include "ts_test.h"

#include "ts_store.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define NS 3
static const size_t LENS[NS] = {0, CHUNK + 5, 3 * CHUNK + 17};

struct fx {
    char *dir;
    ts_store *s;
    struct ts_store_opts o;
};

static int setup_with(void **state, uint32_t inline_max)
{
    struct fx *f = calloc(1, sizeof(*f));
    f->dir = ts_test_tmpdir("tier");
    ts_store_opts_init(&f->o);
    f->o.path = f->dir;
    f->o.sync = TS_SYNC_NONE;
    f->o.inline_max = inline_max;
    assert_int_equal(ts_store_open(&f->s, &f->o), 0);
    *state = f;
    return 0;
}

static int setup_files(void **state)
{
    return setup_with(state, 0);
}

static int setup_inline(void **state)
{
    return setup_with(state, 8 * CHUNK); /* every shard's chunks in the engine */
}

static int teardown(void **state)
{
    struct fx *f = *state;
    ts_store_close(f->s);
    ts_test_rmtree(f->dir);
    free(f);
    return 0;
}

static void read_back(ts_store *s, uint32_t shard)
{
    uint8_t *got = malloc(LENS[shard] + 1), *want = malloc(LENS[shard] + 1);
    size_t n = 0;

    assert_int_equal(ts_store_read(s, "t", shard, 0, LENS[shard], got, &n), 0);
    assert_int_equal(n, LENS[shard]);
    ts_test_fill(want, LENS[shard], 10 + shard, 0);
    assert_memory_equal(got, want, LENS[shard]);
    free(got);
    free(want);
}

/* Puts chunk idx of shard's bytes back (ts_store_chunk_repair); flip: one byte wrong. */
static int put_back(ts_store *s, uint32_t shard, uint32_t idx, int flip)
{
    uint8_t *all = malloc(LENS[shard] + 1);
    size_t at = (size_t)idx * CHUNK, n = LENS[shard] - at < CHUNK ? LENS[shard] - at : CHUNK;
    int rc;

    ts_test_fill(all, LENS[shard], 10 + shard, 0);
    all[at] ^= (uint8_t)(flip ? 1 : 0);
    rc = ts_store_chunk_repair(s, "t", shard, idx, all + at, n);
    free(all);
    return rc;
}

static void test_drop_and_put_back(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_policy p;
    struct ts_dataset_info d;
    struct ts_shard_info si[NS], now;
    struct ts_scrub_report rep;
    uint64_t missing = 0, chunks = 0;
    uint8_t b[8];
    size_t n;

    ts_dataset_policy_init(&p);
    p.chunk_size = CHUNK;
    assert_int_equal(ts_store_dataset_create(f->s, "t", &p), 0);
    for (uint32_t s = 0; s < NS; s++) {
        ts_test_put_shard(f->s, "t", s, LENS[s], CHUNK, 10 + s);
        assert_int_equal(ts_store_shard_stat(f->s, "t", s, &si[s]), 0);
        chunks += si[s].nchunks;
    }
    /* Open: not tiered. Sealed: a code without the bytes dropped changes no read. */
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, NULL), TS_EINVAL);
    assert_int_equal(ts_store_dataset_seal(f->s, "t"), 0);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, NULL), 0);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 0, 0, 1, NULL), TS_EINVAL);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 0, 1, NULL), TS_EINVAL);
    read_back(f->s, 2);

    /* Dropped: reads refused, records whole, scrub has nothing to read; across a reopen. */
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 1, NULL), 0);
    for (int pass = 0; pass < 2; pass++) {
        assert_int_equal(ts_store_dataset_record(f->s, "t", &d), 0);
        assert_int_equal(d.policy.ec_dropped, 1);
        for (uint32_t s = 0; s < NS; s++) {
            assert_int_equal(ts_store_read(f->s, "t", s, 0, sizeof(b), b, &n), TS_EFRAGMENTED);
            assert_int_equal(ts_store_shard_stat(f->s, "t", s, &now), 0);
            assert_memory_equal(&now, &si[s], sizeof(now));
        }
        assert_int_equal(ts_store_read(f->s, "t", 7, 0, sizeof(b), b, &n), TS_ENOENT);
        assert_int_equal(ts_store_scrub(f->s, "t", NULL, NULL, &rep), 0);
        assert_int_equal(rep.corrupt, 0);
        assert_int_equal(rep.chunks, 0);
        ts_store_close(f->s);
        assert_int_equal(ts_store_open(&f->s, &f->o), 0);
    }

    /* Refused while the bytes are not back: nothing changes. */
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 0, 0, 0, NULL), TS_EBUSY);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, &missing), TS_EINCOMPLETE);
    assert_true(missing == chunks);
    assert_int_equal(put_back(f->s, 2, 1, 1), TS_ECORRUPT); /* not the chunk's bytes */
    for (uint32_t s = 0; s < NS; s++)
        for (uint32_t i = 0; i < si[s].nchunks; i++)
            if (!(s == 2 && i == 3))
                assert_int_equal(put_back(f->s, s, i, 0), 0);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, &missing), TS_EINCOMPLETE);
    assert_true(missing == 1);
    assert_int_equal(ts_store_read(f->s, "t", 2, 0, sizeof(b), b, &n), TS_EFRAGMENTED);

    /* The last chunk back: kept again, every byte reads, then replicated only. */
    assert_int_equal(put_back(f->s, 2, 3, 0), 0);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, &missing), 0);
    assert_true(missing == 0);
    for (uint32_t s = 0; s < NS; s++)
        read_back(f->s, s);
    assert_int_equal(ts_store_scrub(f->s, "t", NULL, NULL, &rep), 0);
    assert_int_equal(rep.corrupt, 0);
    assert_true(rep.chunks == chunks);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 0, 0, 0, NULL), 0);
    assert_int_equal(ts_store_dataset_record(f->s, "t", &d), 0);
    assert_int_equal(d.policy.ec_k, 0);
    assert_int_equal(d.policy.ec_dropped, 0);
}

/* A replica told by a primary that the dataset's bytes are dropped: marked (reads refused), but
 * the bytes it holds stay until DATASET_TIER drops them here; keeping them again needs nothing
 * put back. Another code than the one it was dropped under: refused, nothing changed. */
static void test_follow_keeps_bytes(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_policy p;
    struct ts_dataset_info d;
    uint64_t missing = 1;
    uint8_t b[8];
    size_t n;

    ts_dataset_policy_init(&p);
    p.chunk_size = CHUNK;
    assert_int_equal(ts_store_dataset_create(f->s, "t", &p), 0);
    for (uint32_t s = 0; s < NS; s++)
        ts_test_put_shard(f->s, "t", s, LENS[s], CHUNK, 10 + s);
    assert_int_equal(ts_store_dataset_follow_dropped(f->s, "t", 4, 2), 0); /* open here: sealed */
    assert_int_equal(ts_store_dataset_record(f->s, "t", &d), 0);
    assert_int_equal(d.state, TS_DS_SEALED);
    assert_int_equal(d.policy.ec_dropped, 1);
    assert_int_equal(ts_store_read(f->s, "t", 2, 0, sizeof(b), b, &n), TS_EFRAGMENTED);
    assert_int_equal(ts_store_dataset_follow_dropped(f->s, "t", 8, 3), TS_EBUSY);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 8, 3, 1, NULL), TS_EBUSY);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 0, 0, 0, NULL), TS_EBUSY);
    assert_int_equal(ts_store_dataset_record(f->s, "t", &d), 0);
    assert_int_equal(d.policy.ec_k, 4);
    assert_int_equal(ts_store_dataset_set_tier(f->s, "t", 4, 2, 0, &missing), 0);
    assert_true(missing == 0);
    for (uint32_t s = 0; s < NS; s++)
        read_back(f->s, s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_drop_and_put_back, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_drop_and_put_back, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_follow_keeps_bytes, setup_files, teardown),
    };
    ts_test_log_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
