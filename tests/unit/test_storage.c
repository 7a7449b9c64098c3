/*
 * Unit tests for storage/: a real RocksDB in a temp directory. Round trips, range reads,
 * seal rules, names, corruption found by reads and scrub, and kill -9 durability.
 */
#include "store_util.h"
#include "ts_test.h"

#include "ts_store.h"
#include "store_internal.h" /* key layout and meta_scan: the chunk records */
#include "ts_map.h"

#include <rocksdb/c.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (64u << 10)

struct fx {
    char *dir;
    ts_store *s;
    struct ts_store_opts o;
};

static int fx_open(struct fx *f)
{
    return ts_store_open(&f->s, &f->o);
}

/* The default store: chunk files (storage/chunkfile.c). */
static int setup_files(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    f->dir = ts_test_tmpdir("store");
    ts_store_opts_init(&f->o);
    f->o.path = f->dir;
    f->o.sync = TS_SYNC_NONE; /* unit tests: WAL without fsync (kill -9 safe) */
    assert_int_equal(fx_open(f), 0);
    *state = f;
    return 0;
}

/* Chunk bytes in RocksDB's blob files (chunk_files 0): stores written before chunk files. */
/* The default store, closed again: a setup changes an option and reopens it. */
static struct fx *fx_closed(void **state)
{
    setup_files(state);
    struct fx *f = *state;
    ts_store_close(f->s);
    f->s = NULL;
    return f;
}

static int setup_blob(void **state)
{
    struct fx *f = fx_closed(state);
    f->o.chunk_files = 0;
    return fx_open(f);
}

/* The default sync policy: chunks durable with their shard's seal (fsyncs for real). */
static int setup_seal(void **state)
{
    struct fx *f = fx_closed(state);
    f->o.sync = TS_SYNC_SEAL;
    return fx_open(f);
}

/* Shards of up to two chunks inline (storage.inline_max_kb): no file of their own. */
static int setup_inline(void **state)
{
    struct fx *f = fx_closed(state);
    f->o.inline_max = 2 * CHUNK;
    return fx_open(f);
}

static int setup_sst(void **state)
{
    setup_blob(state);
    struct fx *f = *state;
    ts_store_close(f->s);
    ts_test_rmtree(f->dir);
    f->dir = ts_test_tmpdir("store-sst");
    f->o.path = f->dir;
    f->o.blob_files = 0;
    return fx_open(f);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    ts_store_close(f->s);
    ts_test_rmtree(f->dir);
    free(f);
    return 0;
}

static void mk_dataset(ts_store *s, const char *name, uint32_t chunk)
{
    struct ts_dataset_policy p;
    ts_dataset_policy_init(&p);
    p.chunk_size = chunk;
    assert_int_equal(ts_store_dataset_create(s, name, &p), 0);
}

/* Writes a shard of len bytes from the deterministic generator and seals it. */
static void check_range(ts_store *s, const char *ds, uint32_t shard, uint64_t seed, uint64_t off,
                        size_t len, size_t expect_len)
{
    uint8_t *got = malloc(len + 1), *want = malloc(len + 1);
    size_t n = 12345;

    assert_int_equal(ts_store_read(s, ds, shard, off, len, got, &n), 0);
    assert_int_equal(n, expect_len);
    ts_test_fill(want, expect_len, seed, off);
    assert_memory_equal(got, want, expect_len);
    free(got);
    free(want);
}

static void test_roundtrip_sizes(void **state)
{
    struct fx *f = *state;
    const size_t sizes[] = {0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17};
    struct ts_shard_info si;

    mk_dataset(f->s, "sizes", CHUNK);
    for (uint32_t i = 0; i < TS_ARRAY_SIZE(sizes); i++) {
        ts_test_put_shard(f->s, "sizes", i, sizes[i], CHUNK, 100 + i);
        check_range(f->s, "sizes", i, 100 + i, 0, sizes[i], sizes[i]);
        assert_int_equal(ts_store_shard_stat(f->s, "sizes", i, &si), 0);
        assert_int_equal(si.state, TS_SHARD_COMPLETE);
        assert_true(si.size == sizes[i]);
        assert_int_equal(si.nchunks, (sizes[i] + CHUNK - 1) / CHUNK);
    }
}

static void test_roundtrip_64mib(void **state)
{
    struct fx *f = *state;
    const size_t len = 64u << 20;
    uint8_t *buf = malloc(len), *want = malloc(len);
    struct ts_dataset_info d;
    size_t n;

    mk_dataset(f->s, "big", 1u << 20);
    ts_test_put_shard(f->s, "big", 0, len, 1u << 20, 42);
    assert_int_equal(ts_store_read(f->s, "big", 0, 0, len, buf, &n), 0);
    assert_int_equal(n, len);
    ts_test_fill(want, len, 42, 0);
    assert_memory_equal(buf, want, len);
    assert_int_equal(ts_store_dataset_stat(f->s, "big", &d), 0);
    assert_int_equal(d.shards, 1);
    assert_true(d.bytes == len);
    free(buf);
    free(want);
}

static void test_range_reads(void **state)
{
    struct fx *f = *state;
    const size_t len = 5 * CHUNK + 333;
    uint8_t tiny;
    size_t n;

    mk_dataset(f->s, "ranges", CHUNK);
    ts_test_put_shard(f->s, "ranges", 0, len, CHUNK, 9);
    /* Across one boundary, across several, exactly one chunk, the tail, a single byte. */
    check_range(f->s, "ranges", 0, 9, CHUNK - 10, 20, 20);
    check_range(f->s, "ranges", 0, 9, CHUNK / 2, 3 * CHUNK, 3 * CHUNK);
    check_range(f->s, "ranges", 0, 9, 2 * CHUNK, CHUNK, CHUNK);
    check_range(f->s, "ranges", 0, 9, len - 5, 5, 5);
    check_range(f->s, "ranges", 0, 9, 4 * CHUNK + 1, 1, 1);
    /* Past the end: cut at the end; at the end: empty; beyond: TS_ERANGE. */
    check_range(f->s, "ranges", 0, 9, len - 100, 1000, 100);
    check_range(f->s, "ranges", 0, 9, len, 10, 0);
    assert_int_equal(ts_store_read(f->s, "ranges", 0, len + 1, 1, &tiny, &n), TS_ERANGE);
    for (int i = 0; i < 50; i++) {
        uint64_t off = (uint64_t)rand() % len;
        size_t l = (size_t)rand() % (2 * CHUNK);
        check_range(f->s, "ranges", 0, 9, off, l, TS_MIN(l, len - off));
    }
}

static int count_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    (*(int *)arg)++;
    return 0;
}

/* The per-chunk records of an upload (meta 'C' keys) while it is written, and none once it is
 * sealed: they are dropped by point deletes of exactly those written (a range delete per
 * upload piled up range tombstones that RocksDB fragments again on every read). An
 * abandoned upload's records go when the shard is begun again. */
static void test_chunk_records_dropped(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    ts_shard_writer *w;
    uint8_t buf[CHUNK], k[17];
    int n;

    mk_dataset(f->s, "crec", CHUNK);
    assert_int_equal(ts_store_dataset_stat(f->s, "crec", &d), 0);
    memset(buf, 7, sizeof(buf));
    assert_int_equal(ts_store_shard_begin(f->s, "crec", 5, TS_SIZE_UNKNOWN, &w), 0);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(ts_shard_writer_put(w, i, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    n = 0;
    key_chunkrec(k, d.id, 5, 0);
    assert_int_equal(meta_scan(f->s, k, 13, count_cb, &n), 0);
    assert_int_equal(n, 6);
    ts_shard_writer_abort(w); /* abandoned: begun again below */
    assert_int_equal(ts_store_shard_begin(f->s, "crec", 5, TS_SIZE_UNKNOWN, &w), 0);
    n = 0;
    assert_int_equal(meta_scan(f->s, k, 13, count_cb, &n), 0);
    assert_int_equal(n, 0);
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(ts_shard_writer_put(w, i, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    uint32_t crc = ts_crc32c(0, buf, CHUNK);
    crc = ts_crc32c_combine(ts_crc32c_combine(crc, crc, CHUNK), crc, CHUNK);
    assert_int_equal(ts_shard_writer_seal(w, 1, crc, NULL, 0), 0);
    n = 0;
    assert_int_equal(meta_scan(f->s, k, 13, count_cb, &n), 0);
    assert_int_equal(n, 0);
    {
        uint8_t got[CHUNK];
        size_t g = 0;
        assert_int_equal(ts_store_read(f->s, "crec", 5, 2 * CHUNK, CHUNK, got, &g), 0);
        assert_int_equal(g, CHUNK);
        assert_memory_equal(got, buf, CHUNK);
    }
}

static void test_seal_rules(void **state)
{
    struct fx *f = *state;
    ts_shard_writer *w, *w2;
    uint8_t buf[CHUNK];
    struct ts_dataset_info d;

    mk_dataset(f->s, "seal", CHUNK);
    ts_test_fill(buf, sizeof(buf), 1, 0);

    /* Declared 2 chunks, wrote 1: incomplete; the writer stays usable. */
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 0, 2 * CHUNK, &w), 0);
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 0, 2 * CHUNK, &w2), TS_EBUSY);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, NULL, 0), TS_EINCOMPLETE);
    /* Out of order, oversize, wrong CRC: refused, nothing stored. */
    assert_int_equal(ts_shard_writer_put(w, 5, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), TS_EINVAL);
    assert_int_equal(ts_shard_writer_put(w, 1, buf, CHUNK, ts_crc32c(0, buf, CHUNK) ^ 1),
                     TS_ECORRUPT);
    assert_int_equal(ts_shard_writer_next(w), 1);
    /* A shard being written is invisible to readers. */
    assert_int_equal(ts_store_read(f->s, "seal", 0, 0, 1, buf, NULL), TS_EINCOMPLETE);
    assert_int_equal(ts_shard_writer_put(w, 1, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    assert_int_equal(ts_shard_writer_put(w, 2, buf, 1, ts_crc32c(0, buf, 1)), TS_ETOOBIG);
    /* A wrong whole-shard CRC refuses the seal. */
    assert_int_equal(ts_shard_writer_seal(w, 1, 0xdeadbeef, NULL, 0), TS_ECORRUPT);
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, NULL, 0), 0);
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 0, 1, &w), TS_EEXIST);

    /* Dataset seal refuses a gap (shard 2 without shard 1) and an abandoned upload. */
    ts_test_put_shard(f->s, "seal", 2, 10, CHUNK, 3);
    assert_int_equal(ts_store_dataset_seal(f->s, "seal"), TS_EINCOMPLETE);
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 1, 100, &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, 50, ts_crc32c(0, buf, 50)), 0);
    assert_int_equal(ts_store_dataset_seal(f->s, "seal"), TS_EINCOMPLETE);
    ts_shard_writer_abort(w);
    assert_int_equal(ts_store_dataset_stat(f->s, "seal", &d), 0);
    assert_int_equal(d.shards_writing, 1);
    assert_int_equal(ts_store_dataset_seal(f->s, "seal"), TS_EINCOMPLETE);
    /* Restarting the abandoned shard discards the partial upload. */
    ts_test_put_shard(f->s, "seal", 1, 100, CHUNK, 4);
    check_range(f->s, "seal", 1, 4, 0, 100, 100);
    assert_int_equal(ts_store_dataset_seal(f->s, "seal"), 0);
    assert_int_equal(ts_store_dataset_stat(f->s, "seal", &d), 0);
    assert_int_equal(d.state, TS_DS_SEALED);
    assert_int_equal(d.shards, 3);
    assert_int_equal(d.shards_writing, 0);
    /* Sealed: no new shards, no second seal; data still readable. */
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 3, 1, &w), TS_ESEALED);
    assert_int_equal(ts_store_dataset_seal(f->s, "seal"), TS_ESEALED);
    check_range(f->s, "seal", 2, 3, 0, 10, 10);
    /* A replica that lost a shard of a sealed dataset (or dropped it when its PG moved away)
     * gets it back from the PG primary's stream: the takeover form may fill it in. */
    assert_int_equal(ts_store_shard_delete(f->s, "seal", 2), 0);
    assert_int_equal(ts_store_shard_begin(f->s, "seal", 2, 10, &w), TS_ESEALED);
    assert_int_equal(ts_store_shard_begin_ex(f->s, "seal", 2, 10, 1, &w), 0);
    ts_test_fill(buf, 10, 3, 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, 10, ts_crc32c(0, buf, 10)), 0);
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, NULL, 0), 0);
    check_range(f->s, "seal", 2, 3, 0, 10, 10);
}

static void test_names_and_duplicates(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    struct ts_shard_info si;
    struct ts_dataset_policy p;
    ts_shard_writer *w;
    uint8_t b;

    mk_dataset(f->s, "dup", CHUNK);
    ts_dataset_policy_init(&p);
    assert_int_equal(ts_store_dataset_create(f->s, "dup", &p), TS_EEXIST);
    assert_int_equal(ts_store_dataset_create(f->s, "bad/name", &p), TS_ENAME);
    assert_int_equal(ts_store_dataset_create(f->s, "", &p), TS_ENAME);
    p.chunk_size = 100; /* below the minimum */
    assert_int_equal(ts_store_dataset_create(f->s, "tiny", &p), TS_EINVAL);
    ts_dataset_policy_init(&p);
    p.min_core = 3; /* more than core */
    assert_int_equal(ts_store_dataset_create(f->s, "pol", &p), TS_EINVAL);
    assert_int_equal(ts_store_dataset_stat(f->s, "nope", &d), TS_ENOENT);
    assert_int_equal(ts_store_shard_stat(f->s, "dup", 7, &si), TS_ENOENT);
    assert_int_equal(ts_store_read(f->s, "dup", 7, 0, 1, &b, NULL), TS_ENOENT);
    assert_int_equal(ts_store_read(f->s, "nope", 0, 0, 1, &b, NULL), TS_ENOENT);
    assert_int_equal(ts_store_shard_begin(f->s, "nope", 0, 1, &w), TS_ENOENT);
    assert_int_equal(ts_store_dataset_seal(f->s, "nope"), TS_ENOENT);
    assert_int_equal(ts_store_dataset_delete(f->s, "nope"), TS_ENOENT);
}

static int count_ds(void *arg, const struct ts_dataset_info *d)
{
    (*(int *)arg)++;
    return 0;
}

static void test_delete_and_list(void **state)
{
    struct fx *f = *state;
    ts_shard_writer *w;
    int n = 0;
    uint8_t b;

    mk_dataset(f->s, "a", CHUNK);
    mk_dataset(f->s, "b", CHUNK);
    ts_test_put_shard(f->s, "a", 0, 3 * CHUNK, CHUNK, 5);
    ts_test_put_shard(f->s, "b", 0, 10, CHUNK, 6);
    assert_int_equal(ts_store_dataset_list(f->s, count_ds, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ts_store_shard_begin(f->s, "a", 1, 10, &w), 0);
    assert_int_equal(ts_store_dataset_delete(f->s, "a"), TS_EBUSY);
    ts_shard_writer_abort(w);
    assert_int_equal(ts_store_dataset_delete(f->s, "a"), 0);
    assert_int_equal(ts_store_read(f->s, "a", 0, 0, 1, &b, NULL), TS_ENOENT);
    check_range(f->s, "b", 0, 6, 0, 10, 10); /* the neighbour is untouched */
    /* The name can be reused; the old data does not come back. */
    mk_dataset(f->s, "a", CHUNK);
    assert_int_equal(ts_store_read(f->s, "a", 0, 0, 1, &b, NULL), TS_ENOENT);
    n = 0;
    assert_int_equal(ts_store_dataset_list(f->s, count_ds, &n), 0);
    assert_int_equal(n, 2);
}

static void test_records_and_reopen(void **state)
{
    struct fx *f = *state;
    ts_shard_writer *w;
    uint8_t buf[1000];
    const uint64_t recs[] = {0, 100, 250, 999};
    uint64_t *got;
    uint32_t n;

    mk_dataset(f->s, "rec", CHUNK);
    ts_test_fill(buf, sizeof(buf), 11, 0);
    assert_int_equal(ts_store_shard_begin(f->s, "rec", 0, TS_SIZE_UNKNOWN, &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, sizeof(buf), ts_crc32c(0, buf, 1000)), 0);
    const uint64_t bad[] = {10, 5};
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, bad, 2), TS_EINVAL);
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, recs, 4), 0);
    ts_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f), 0);
    assert_int_equal(ts_store_shard_records(f->s, "rec", 0, &got, &n), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(got, recs, sizeof(recs));
    free(got);
    check_range(f->s, "rec", 0, 11, 0, 1000, 1000);
    /* The index carries its own CRC32C: a flipped byte of it is found, never handed out. */
    {
        struct ts_dataset_info di;
        uint8_t k[13] = {'R'};
        assert_int_equal(ts_store_dataset_stat(f->s, "rec", &di), 0);
        ts_put_be64(k + 1, di.id);
        ts_put_be32(k + 9, 0);
        ts_store_close(f->s);
        f->s = NULL;
        ts_test_flip_value(f->dir, 1, k, sizeof(k), 9);
        assert_int_equal(fx_open(f), 0);
        got = NULL;
        assert_int_equal(ts_store_shard_records(f->s, "rec", 0, &got, &n), TS_ECORRUPT);
        assert_null(got);
    }
}

/* Seals shard `shard` of ds with log entry (epoch, seq) of pg (seq 0: the next one). */
static int seal_logged(ts_store *s, const char *ds, uint32_t shard, uint32_t pg, uint64_t epoch,
                       uint64_t seq, uint64_t seed)
{
    ts_shard_writer *w;
    uint8_t buf[100];
    struct ts_log_rec log;
    int rc;

    ts_test_fill(buf, sizeof(buf), seed, 0);
    assert_int_equal(ts_store_shard_begin(s, ds, shard, sizeof(buf), &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    memset(&log, 0, sizeof(log));
    log.pg = pg;
    log.seq = seq;
    log.epoch = epoch;
    snprintf(log.dataset, sizeof(log.dataset), "%s", ds);
    log.shard = shard;
    rc = ts_shard_writer_seal_log(w, 0, 0, NULL, 0, &log);
    if (rc)
        ts_shard_writer_abort(w);
    return rc;
}

/* Log entries named by (epoch, seq); promises, intervals and rollback survive a reopen. */
static void test_pg_log_and_peering_facts(void **state)
{
    struct fx *f = *state;
    struct ts_pg_state st;
    struct ts_log_pos tail[8];
    struct ts_log_rec rec;
    const char acting[2][64] = {"n1", "n2"};
    size_t n;
    unsigned removed;

    mk_dataset(f->s, "lg", CHUNK);
    assert_int_equal(seal_logged(f->s, "lg", 0, 3, 1, 0, 1), 0); /* (1, 1) */
    assert_int_equal(seal_logged(f->s, "lg", 1, 3, 1, 0, 2), 0); /* (1, 2) */
    /* A replica: the next entry only; the same entry again is EEXIST; another one in its
     * place (divergent) or an older epoch is ERANGE. */
    assert_int_equal(seal_logged(f->s, "lg", 2, 3, 2, 4, 3), TS_ERANGE); /* a gap */
    assert_int_equal(seal_logged(f->s, "lg", 2, 3, 2, 3, 3), 0);         /* (2, 3) */
    assert_int_equal(seal_logged(f->s, "lg", 3, 3, 1, 4, 4), TS_ERANGE); /* older than the head */
    assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
    assert_int_equal(st.applied, 3);
    assert_int_equal(st.head_epoch, 2);
    assert_int_equal(ts_store_log_read(f->s, 3, 3, &rec), 0);
    assert_int_equal(rec.epoch, 2);
    assert_int_equal(rec.shard, 2);
    rec.seq = 3;
    assert_int_equal(ts_store_log_append(f->s, &rec), TS_EEXIST); /* the same entry */
    rec.epoch = 3;
    assert_int_equal(ts_store_log_append(f->s, &rec), TS_ERANGE); /* another entry at seq 3 */
    assert_int_equal(ts_store_pg_log_tail(f->s, 3, tail, 8, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(tail[0].seq, 3);
    assert_int_equal(tail[0].epoch, 2);
    assert_int_equal(tail[2].seq, 1);

    /* Promises only grow; an interval needs an epoch >= the promise. A member of the new
     * acting set records it (pending) only when it holds the primary's head; a witness always. */
    assert_int_equal(ts_store_pg_promise(f->s, 3, 5, &st), 0);
    assert_int_equal(st.promised, 5);
    assert_int_equal(ts_store_pg_promise(f->s, 3, 4, &st), TS_ESTALE);
    {
        int got = 7;
        assert_int_equal(ts_store_pg_prepare(f->s, 3, 4, 2, acting, 2, 1, 2, 3, &got), TS_ESTALE);
        assert_int_equal(ts_store_pg_prepare(f->s, 3, 6, 2, acting, 2, 1, 2, 9, &got), 0);
        assert_int_equal(got, 0); /* behind the primary's head (2, 9) */
        assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
        assert_int_equal(st.npending, 0);
        assert_int_equal(st.promised, 6);
        assert_int_equal(ts_store_pg_prepare(f->s, 3, 6, 2, acting, 2, 1, 2, 3, &got), 0);
        assert_int_equal(got, 1);
        assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
        assert_int_equal(st.npending, 1);
        assert_int_equal(st.pending[0].epoch, 6);
        assert_int_equal(st.les, 0);
        /* A later prepare keeps the earlier pending interval (it may have started) unless it
         * has the same acting set and write quorum (peering asks the same of both); a commit
         * removes the pending intervals up to it only. */
        const char other[2][64] = {"n2", "n3"};
        assert_int_equal(ts_store_pg_prepare(f->s, 3, 7, 2, acting, 2, 0, 0, 0, &got), 0);
        assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
        assert_int_equal(st.npending, 1); /* epoch 6 replaced: the same set */
        assert_int_equal(st.pending[0].epoch, 7);
        assert_int_equal(ts_store_pg_prepare(f->s, 3, 8, 2, other, 2, 0, 0, 0, &got), 0);
        assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
        assert_int_equal(st.npending, 2);
        assert_int_equal(ts_store_pg_commit(f->s, 3, 7, 2, acting, 2), 0);
        assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
        assert_int_equal(st.npending, 1);
        assert_int_equal(st.pending[0].epoch, 8);
        assert_int_equal(st.les, 7);
    }

    /* Roll back to (1, 2): entry 3 goes, and the shard it sealed. */
    assert_int_equal(ts_store_pg_truncate(f->s, 3, 2, 1, 0, &removed), 0);
    assert_int_equal(removed, 1);
    assert_int_equal(ts_store_log_read(f->s, 3, 3, &rec), TS_ENOENT);
    {
        struct ts_shard_info si;
        assert_int_equal(ts_store_shard_stat(f->s, "lg", 2, &si), TS_ENOENT);
        assert_int_equal(ts_store_shard_stat(f->s, "lg", 1, &si), 0);
    }

    /* Everything is durable across a reopen. */
    ts_store_close(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f), 0);
    assert_int_equal(ts_store_pg_state(f->s, 3, &st), 0);
    assert_int_equal(st.applied, 2);
    assert_int_equal(st.head_epoch, 1);
    assert_int_equal(st.promised, 8); /* the prepare of epoch 8 */
    assert_int_equal(st.les, 7);
    assert_int_equal(st.npending, 1); /* epoch 8 is still being started */
    assert_int_equal(st.wq, 2);
    assert_int_equal(st.nacting, 2);
    assert_string_equal(st.acting[1], "n2");
    assert_int_equal(seal_logged(f->s, "lg", 2, 3, 6, 3, 5), 0); /* the new (6, 3) */
}

/* Defence in depth (issue 27): a truncate never removes entries of an epoch newer than the
 * sender's (the frame's) epoch; refused, nothing changes. */
static void test_pg_truncate_refuses_newer_entries(void **state)
{
    struct fx *f = *state;
    struct ts_log_rec rec;
    struct ts_pg_state st;
    unsigned removed = 9;

    for (uint64_t q = 1; q <= 4; q++) {
        memset(&rec, 0, sizeof(rec));
        rec.pg = 4;
        rec.seq = q;
        rec.epoch = q <= 2 ? 7 : 8;
        rec.type = TS_LOG_NOOP;
        assert_int_equal(ts_store_log_append(f->s, &rec), 0);
    }
    /* A sender at epoch 7 (an old primary) may not remove (8, 3) and (8, 4). */
    assert_int_equal(ts_store_pg_truncate(f->s, 4, 2, 7, 7, &removed), TS_EPERM);
    assert_int_equal(removed, 0);
    assert_int_equal(ts_store_pg_state(f->s, 4, &st), 0);
    assert_int_equal(st.applied, 4);
    assert_int_equal(st.head_epoch, 8);
    assert_int_equal(ts_store_log_read(f->s, 4, 4, &rec), 0);
    /* A backfill's end never sets the head back either (that would drop (8, 3), (8, 4)). */
    assert_int_equal(ts_store_pg_set_applied(f->s, 4, 2, 7, 9), TS_ERANGE);
    assert_int_equal(ts_store_pg_set_applied(f->s, 4, 9, 7, 9), TS_ERANGE); /* older epoch */
    assert_int_equal(ts_store_pg_set_applied(f->s, 4, 3, 9, 9), TS_ERANGE); /* hides (8, 4) */
    assert_int_equal(ts_store_pg_set_applied(f->s, 4, 4, 9, 9), TS_ERANGE); /* (8, 4) != (9, 4) */
    assert_int_equal(ts_store_pg_state(f->s, 4, &st), 0);
    assert_int_equal(st.applied, 4);
    assert_int_equal(st.head_epoch, 8);
    /* At epoch 9 they may go (peering there found them divergent). */
    assert_int_equal(ts_store_pg_truncate(f->s, 4, 2, 7, 9, &removed), 0);
    assert_int_equal(ts_store_pg_state(f->s, 4, &st), 0);
    assert_int_equal(st.applied, 2);
    assert_int_equal(st.head_epoch, 7);
    assert_int_equal(ts_store_log_read(f->s, 4, 3, &rec), TS_ENOENT);
}

/* Incarnations: an older one is replaced, a newer one refused; a deleted one never comes
 * back through replication (tombstone). */
static void test_incarnations_and_tombstones(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_policy p;
    struct ts_dataset_info d;
    uint64_t dead;

    ts_dataset_policy_init(&p);
    p.chunk_size = CHUNK;
    assert_int_equal(ts_store_dataset_create_inc(f->s, "inc", &p, 100), 0);
    ts_test_put_shard(f->s, "inc", 0, 10, CHUNK, 1);
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 100), 0); /* the same one */
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 50), TS_ESTALE);
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 200), 0); /* re-created */
    assert_int_equal(ts_store_dataset_get(f->s, "inc", &d), 0);
    assert_int_equal(d.created_ns, 200);
    {
        struct ts_shard_info si;
        assert_int_equal(ts_store_shard_stat(f->s, "inc", 0, &si), TS_ENOENT); /* old bytes gone */
    }
    assert_int_equal(ts_store_dataset_delete(f->s, "inc"), 0);
    assert_int_equal(ts_store_tombstone(f->s, "inc", &dead), 0);
    assert_int_equal(dead, 200);
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 200), TS_ESTALE);
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 150), TS_ESTALE);
    assert_int_equal(ts_store_dataset_ensure(f->s, "inc", &p, 300), 0);
    /* A delete judged on incarnation 200 (a backfill's prune, a DELETE entry) that runs after
     * 300 took the name (another PG's replication, on another thread) deletes nothing: before,
     * it deleted by name, and the new incarnation's acknowledged shards went with it. */
    ts_test_put_shard(f->s, "inc", 0, 10, CHUNK, 1);
    assert_int_equal(ts_store_dataset_delete_upto(f->s, "inc", 200, 1), TS_ESTALE);
    assert_int_equal(ts_store_dataset_get(f->s, "inc", &d), 0);
    assert_int_equal(d.created_ns, 300);
    {
        struct ts_shard_info si;
        assert_int_equal(ts_store_shard_stat(f->s, "inc", 0, &si), 0);
    }
    assert_int_equal(ts_store_dataset_delete_upto(f->s, "inc", 300, 1), 0);
    assert_int_equal(ts_store_tombstone(f->s, "inc", &dead), 0);
    assert_int_equal(dead, 300);
}

static int pg_collect(void *arg, const char *ds, const struct ts_shard_info *si)
{
    (*(int *)arg)++;
    return 0;
}

static void test_pg_iter(void **state)
{
    struct fx *f = *state;
    int total = 0;
    const uint32_t pgs = 8;

    mk_dataset(f->s, "pg", CHUNK);
    for (uint32_t i = 0; i < 40; i++)
        ts_test_put_shard(f->s, "pg", i, 10, CHUNK, i);
    for (uint32_t pg = 0; pg < pgs; pg++) {
        int n = 0, expect = 0;
        assert_int_equal(ts_store_pg_iter(f->s, pg, pgs, pg_collect, &n), 0);
        for (uint32_t i = 0; i < 40; i++)
            expect += ts_pg_of("pg", i, pgs) == pg;
        assert_int_equal(n, expect);
        total += n;
    }
    assert_int_equal(total, 40);
    /* Stable hash: the same answer on every machine and version. */
    assert_int_equal(ts_pg_of("pg", 0, 1000), ts_pg_of("pg", 0, 1000));
    assert_int_equal(ts_store_pg_iter(f->s, pgs, pgs, pg_collect, &total), TS_EINVAL);
}

/* ---- corruption: flip one byte behind the store's back ------------------------------ */

/* Files in the store's chunks/DSID folder (-1: no folder). */
static int chunk_files_in(const char *dir, uint64_t dsid)
{
    char d[1100];
    struct dirent *e;
    DIR *dp;
    int n = 0;

    snprintf(d, sizeof(d), "%s/chunks/%016llx", dir, (unsigned long long)dsid);
    dp = opendir(d);
    if (!dp)
        return -1;
    while ((e = readdir(dp)) != NULL)
        n += e->d_name[0] != '.';
    closedir(dp);
    return n;
}

static void flip_chunk_byte(const char *path, uint64_t dsid, uint32_t shard, uint32_t idx,
                            size_t at)
{
    uint8_t k[16];
    char file[1400];

    if (ts_test_chunk_file(path, dsid, shard, file, sizeof(file)) == 0) {
        int fd = open(file, O_RDWR);
        uint8_t b;
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, &b, 1, (off_t)idx * CHUNK + (off_t)at), 1);
        b ^= 0x40;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)idx * CHUNK + (off_t)at), 1);
        close(fd);
        return;
    }
    ts_put_be64(k, dsid);
    ts_put_be32(k + 8, shard);
    ts_put_be32(k + 12, idx);
    ts_test_flip_value(path, 2, k, sizeof(k), at);
}

struct bad_chunk {
    int n;
    char ds[TS_NAME_MAX + 1];
    uint32_t shard, idx;
    int rc;
};

static void scrub_cb(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc)
{
    struct bad_chunk *b = arg;
    b->n++;
    snprintf(b->ds, sizeof(b->ds), "%s", ds);
    b->shard = shard;
    b->idx = idx;
    b->rc = rc;
}

static void test_corruption(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    struct ts_scrub_report rep;
    struct bad_chunk bad = {0};
    uint8_t *buf = malloc(4 * CHUNK);
    size_t n;

    mk_dataset(f->s, "other", CHUNK);
    ts_test_put_shard(f->s, "other", 0, 2 * CHUNK, CHUNK, 77);
    mk_dataset(f->s, "victim", CHUNK);
    ts_test_put_shard(f->s, "victim", 0, 4 * CHUNK, CHUNK, 1);
    ts_test_put_shard(f->s, "victim", 1, 4 * CHUNK, CHUNK, 2);
    assert_int_equal(ts_store_dataset_stat(f->s, "victim", &d), 0);
    ts_store_close(f->s);
    f->s = NULL;

    flip_chunk_byte(f->dir, d.id, 1, 2, 1234);

    assert_int_equal(fx_open(f), 0);
    /* A read touching the bad chunk fails; reads around it still work. */
    assert_int_equal(ts_store_read(f->s, "victim", 1, 0, 4 * CHUNK, buf, &n), TS_ECORRUPT);
    assert_int_equal(ts_store_read(f->s, "victim", 1, 2 * CHUNK + 1234, 1, buf, &n), TS_ECORRUPT);
    check_range(f->s, "victim", 1, 2, 0, 2 * CHUNK, 2 * CHUNK);
    check_range(f->s, "victim", 1, 2, 3 * CHUNK, CHUNK, CHUNK);
    check_range(f->s, "victim", 0, 1, 0, 4 * CHUNK, 4 * CHUNK);

    /* Scrub reports exactly that chunk, for one dataset and for all. */
    assert_int_equal(ts_store_scrub(f->s, "victim", scrub_cb, &bad, &rep), 0);
    assert_int_equal(bad.n, 1);
    assert_string_equal(bad.ds, "victim");
    assert_int_equal(bad.shard, 1);
    assert_int_equal(bad.idx, 2);
    assert_int_equal(bad.rc, TS_ECORRUPT);
    assert_true(rep.corrupt == 1 && rep.chunks == 8 && rep.shards == 2);
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(ts_store_scrub(f->s, NULL, scrub_cb, &bad, &rep), 0);
    assert_int_equal(bad.n, 1);
    assert_true(rep.corrupt == 1 && rep.chunks == 10 && rep.shards == 3);
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(ts_store_scrub(f->s, "other", scrub_cb, &bad, &rep), 0);
    assert_int_equal(bad.n, 0);
    free(buf);
}

/* Sets *flag after 100 ms (a shutdown during a scheduled scrub). */
static void *cancel_later(void *arg)
{
    usleep(100 * 1000);
    atomic_store((_Atomic int *)arg, 1);
    return NULL;
}

/*
 * A paced scrub (the scheduled ones, storage.scrub_mb_s) reads no faster than its pace, still
 * finds what is damaged, and stops within a chunk or two of being cancelled.
 */
static void test_scrub_paced(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    struct ts_scrub_report rep;
    struct bad_chunk bad = {0};
    _Atomic int cancel = 0;
    pthread_t th;
    uint64_t t0, ns;

    mk_dataset(f->s, "paced", CHUNK);
    for (uint32_t i = 0; i < 4; i++)
        ts_test_put_shard(f->s, "paced", i, 8 * CHUNK, CHUNK, 60 + i); /* 2 MiB in all */
    assert_int_equal(ts_store_dataset_stat(f->s, "paced", &d), 0);
    ts_store_close(f->s);
    f->s = NULL;
    flip_chunk_byte(f->dir, d.id, 3, 7, 99);
    assert_int_equal(fx_open(f), 0);
    /* 2 MiB at 8 MB/s: at least a quarter of a second (unpaced, a few milliseconds). */
    t0 = ts_now_mono_ns();
    assert_int_equal(ts_store_scrub_paced(f->s, "paced", scrub_cb, &bad, &rep, &cancel, 8000000),
                     0);
    ns = ts_now_mono_ns() - t0;
    assert_true(ns >= 240000000ull);
    assert_true(rep.chunks == 32 && rep.corrupt == 1);
    assert_true(bad.n == 1 && bad.shard == 3 && bad.idx == 7);
    /* Cancelled after 100 ms of a scrub that would take 2 s: it stops within 50 ms or so. */
    assert_int_equal(pthread_create(&th, NULL, cancel_later, &cancel), 0);
    t0 = ts_now_mono_ns();
    assert_int_equal(ts_store_scrub_paced(f->s, "paced", NULL, NULL, &rep, &cancel, 1000000),
                     TS_ECANCELED);
    ns = ts_now_mono_ns() - t0;
    pthread_join(th, NULL);
    assert_true(ns < 1000000000ull);
    assert_true(rep.chunks < 32);
}

struct delete_later {
    ts_store *s;
    const char *name;
    int rc;
};

static void *delete_later(void *arg)
{
    struct delete_later *d = arg;

    usleep(200 * 1000);
    d->rc = ts_store_dataset_delete(d->s, d->name);
    return NULL;
}

/* A dataset deleted while a (paced, so long) scrub reads it is not damage: its shards and
 * chunks that are gone are passed over, none counted corrupt. */
static void test_scrub_dataset_deleted_meanwhile(void **state)
{
    struct fx *f = *state;
    struct ts_scrub_report rep;
    struct bad_chunk bad = {0};
    struct delete_later d = {f->s, "gone", -1};
    pthread_t th;

    mk_dataset(f->s, "gone", CHUNK);
    for (uint32_t i = 0; i < 4; i++)
        ts_test_put_shard(f->s, "gone", i, 8 * CHUNK, CHUNK, 70 + i);
    assert_int_equal(pthread_create(&th, NULL, delete_later, &d), 0);
    assert_int_equal(ts_store_scrub_paced(f->s, NULL, scrub_cb, &bad, &rep, NULL, 2000000), 0);
    pthread_join(th, NULL);
    assert_int_equal(d.rc, 0);
    assert_true(rep.chunks > 0 && rep.chunks < 32); /* it was under way when the delete came */
    assert_int_equal(rep.corrupt, 0);
    assert_int_equal(bad.n, 0);
}

/*
 * Inline shards (storage.inline_max_kb): a shard declared at most inline_max bytes keeps its
 * chunks in RocksDB, no file of its own; a larger one, or one of unknown size, gets a file.
 * Both read back byte for byte, also after a crash (close without flush: the WAL replayed),
 * scrub reads them, and a delete takes the inline bytes too.
 */
static void test_inline_shards(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    struct ts_scrub_report rep;
    size_t n;
    uint8_t buf[64];

    mk_dataset(f->s, "inl", CHUNK);
    assert_int_equal(ts_store_dataset_stat(f->s, "inl", &d), 0);
    ts_test_put_shard(f->s, "inl", 0, 2 * CHUNK, CHUNK, 11);     /* inline: two chunks */
    ts_test_put_shard(f->s, "inl", 1, 100, CHUNK, 12);           /* inline: one short chunk */
    ts_test_put_shard(f->s, "inl", 2, 2 * CHUNK + 1, CHUNK, 13); /* a file */
    assert_int_equal(chunk_files_in(f->dir, d.id), 1);
    check_range(f->s, "inl", 0, 11, 0, 2 * CHUNK, 2 * CHUNK);
    check_range(f->s, "inl", 1, 12, 0, 100, 100);
    check_range(f->s, "inl", 2, 13, 0, 2 * CHUNK + 1, 2 * CHUNK + 1);
    ts_store_close_unflushed(f->s); /* as kill -9: the memtables are lost, the WAL replays */
    f->s = NULL;
    assert_int_equal(fx_open(f), 0);
    check_range(f->s, "inl", 0, 11, 0, 2 * CHUNK, 2 * CHUNK);
    check_range(f->s, "inl", 1, 12, 0, 100, 100);
    assert_int_equal(ts_store_scrub(f->s, "inl", NULL, NULL, &rep), 0);
    assert_int_equal(rep.shards, 3);
    assert_int_equal(rep.corrupt, 0);
    assert_int_equal(rep.bytes, 2 * CHUNK + 100 + 2 * CHUNK + 1);
    assert_int_equal(ts_store_shard_delete(f->s, "inl", 0), 0);
    assert_int_equal(ts_store_read(f->s, "inl", 0, 0, sizeof(buf), buf, &n), TS_ENOENT);
    check_range(f->s, "inl", 1, 12, 0, 100, 100);
}

/*
 * A one-chunk inline shard (issue 31) is written in one batch at its seal: until then nothing
 * of it is in the engine (not even a record saying writing), an abort leaves nothing, a
 * takeover or a second upload of the same shard is still refused while it is open, and the
 * seal makes the whole shard readable and survives a kill -9 (the WAL replays it).
 */
static void test_inline_one_batch(void **state)
{
    struct fx *f = *state;
    struct ts_shard_info si;
    ts_shard_writer *w, *w2;
    uint8_t buf[100];

    mk_dataset(f->s, "one", CHUNK);
    ts_test_fill(buf, sizeof(buf), 21, 0);
    assert_int_equal(ts_store_shard_begin(f->s, "one", 0, sizeof(buf), &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    assert_int_equal(ts_store_shard_stat(f->s, "one", 0, &si), TS_ENOENT); /* nothing written */
    assert_int_equal(ts_store_shard_begin(f->s, "one", 0, sizeof(buf), &w2), TS_EBUSY);
    ts_shard_writer_abort(w);
    assert_int_equal(ts_store_shard_stat(f->s, "one", 0, &si), TS_ENOENT);
    /* Again, sealed this time. */
    assert_int_equal(ts_store_shard_begin(f->s, "one", 0, sizeof(buf), &w), 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    assert_int_equal(ts_shard_writer_seal(w, 1, ts_crc32c(0, buf, sizeof(buf)), NULL, 0), 0);
    check_range(f->s, "one", 0, 21, 0, sizeof(buf), sizeof(buf));
    assert_int_equal(ts_store_shard_begin(f->s, "one", 0, sizeof(buf), &w2), TS_EEXIST);
    /* An empty inline shard: begin and seal only. */
    assert_int_equal(ts_store_shard_begin(f->s, "one", 1, 0, &w), 0);
    assert_int_equal(ts_shard_writer_seal(w, 0, 0, NULL, 0), 0);
    ts_store_close_unflushed(f->s); /* as kill -9 */
    f->s = NULL;
    assert_int_equal(fx_open(f), 0);
    check_range(f->s, "one", 0, 21, 0, sizeof(buf), sizeof(buf));
    assert_int_equal(ts_store_shard_stat(f->s, "one", 1, &si), 0);
    assert_int_equal(si.state, TS_SHARD_COMPLETE);
    assert_int_equal(si.size, 0);
}

/*
 * Chunk files come and go with their records: the file holds the shard's bytes; it goes with
 * its shard, a dataset's folder with the dataset, an abandoned upload's file when the shard is
 * written again; at open, a file no record names (a crash between a file and its record) is
 * removed, and the files records name are kept. Bytes flipped in a file are found by the
 * chunk's CRC32C, and a repair writes the good bytes back into the file.
 */
static void test_chunk_files(void **state)
{
    struct fx *f = *state;
    struct ts_dataset_info d;
    struct ts_scrub_report rep;
    ts_shard_writer *w;
    char path[1400], stray[1400];
    uint8_t *buf = malloc(3 * CHUNK);
    struct stat st;
    size_t n;
    int fd;

    mk_dataset(f->s, "cf", CHUNK);
    assert_int_equal(ts_store_dataset_stat(f->s, "cf", &d), 0);
    ts_test_put_shard(f->s, "cf", 0, 3 * CHUNK, CHUNK, 5);
    ts_test_put_shard(f->s, "cf", 1, 2 * CHUNK + 7, CHUNK, 6);
    assert_int_equal(chunk_files_in(f->dir, d.id), 2);
    assert_int_equal(ts_test_chunk_file(f->dir, d.id, 1, path, sizeof(path)), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 2 * CHUNK + 7); /* the shard's bytes, nothing else */
    /* An upload abandoned half way, then the shard written again: one file, the new one. */
    assert_int_equal(ts_store_shard_begin(f->s, "cf", 2, TS_SIZE_UNKNOWN, &w), 0);
    ts_test_fill(buf, CHUNK, 99, 0);
    assert_int_equal(ts_shard_writer_put(w, 0, buf, CHUNK, ts_crc32c(0, buf, CHUNK)), 0);
    ts_shard_writer_abort(w);
    assert_int_equal(chunk_files_in(f->dir, d.id), 3);
    ts_test_put_shard(f->s, "cf", 2, CHUNK, CHUNK, 7);
    assert_int_equal(chunk_files_in(f->dir, d.id), 3);
    check_range(f->s, "cf", 2, 7, 0, CHUNK, CHUNK);
    /* A shard delete removes its file. */
    assert_int_equal(ts_store_shard_delete(f->s, "cf", 1), 0);
    assert_int_equal(chunk_files_in(f->dir, d.id), 2);
    assert_int_equal(access(path, F_OK), -1);
    /* A stray file goes at the next open; the named ones stay and read back. */
    snprintf(stray, sizeof(stray), "%s/chunks/%016llx/%08x.%08x", f->dir, (unsigned long long)d.id,
             7u, 0x1234u);
    fd = open(stray, O_WRONLY | O_CREAT, 0640);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, 100), 100);
    close(fd);
    ts_store_close_unflushed(f->s);
    f->s = NULL;
    assert_int_equal(fx_open(f), 0);
    assert_int_equal(access(stray, F_OK), -1);
    assert_int_equal(chunk_files_in(f->dir, d.id), 2);
    check_range(f->s, "cf", 0, 5, 0, 3 * CHUNK, 3 * CHUNK);
    check_range(f->s, "cf", 2, 7, 0, CHUNK, CHUNK);
    /* A byte flipped in the file: that chunk fails its CRC32C, is repaired from good bytes
     * (as a replica sends them), and then reads back right; scrub agrees. */
    ts_store_close(f->s);
    f->s = NULL;
    flip_chunk_byte(f->dir, d.id, 0, 1, 77);
    assert_int_equal(fx_open(f), 0);
    assert_int_equal(ts_store_read(f->s, "cf", 0, CHUNK, 10, buf, &n), TS_ECORRUPT);
    check_range(f->s, "cf", 0, 5, 2 * CHUNK, CHUNK, CHUNK);
    assert_int_equal(ts_store_scrub(f->s, "cf", NULL, NULL, &rep), 0);
    assert_int_equal(rep.corrupt, 1);
    ts_test_fill(buf, CHUNK, 5, CHUNK);
    assert_int_equal(ts_store_chunk_repair(f->s, "cf", 0, 1, buf, CHUNK), 0);
    check_range(f->s, "cf", 0, 5, 0, 3 * CHUNK, 3 * CHUNK);
    assert_int_equal(ts_store_scrub(f->s, "cf", NULL, NULL, &rep), 0);
    assert_int_equal(rep.corrupt, 0);
    /* A file gone from under its record: TS_ECORRUPT (a replica repairs), never other bytes. */
    assert_int_equal(ts_test_chunk_file(f->dir, d.id, 2, path, sizeof(path)), 0);
    ts_store_close(f->s);
    f->s = NULL;
    assert_int_equal(unlink(path), 0);
    assert_int_equal(fx_open(f), 0);
    assert_int_equal(ts_store_read(f->s, "cf", 2, 0, 10, buf, &n), TS_ECORRUPT);
    /* ... and a repair makes the file again. */
    ts_test_fill(buf, CHUNK, 7, 0);
    assert_int_equal(ts_store_chunk_repair(f->s, "cf", 2, 0, buf, CHUNK), 0);
    check_range(f->s, "cf", 2, 7, 0, CHUNK, CHUNK);
    /* A dataset delete removes its folder. */
    assert_int_equal(ts_store_dataset_delete(f->s, "cf"), 0);
    assert_int_equal(chunk_files_in(f->dir, d.id), -1);
    free(buf);
}

/*
 * Bytes flipped in the middle of a blob file (a bad sector under RocksDB's BlobDB): the chunks
 * there read back as TS_ECORRUPT, never as other bytes, and the store keeps taking writes while
 * flushes and compactions go on. Blob garbage collection, when it was on, made the first
 * compaction that relocated a damaged blob fail with "Corruption: Blob CRC mismatch", and
 * RocksDB then refused every write of the node until a restart, which hit it again (found by
 * the drill suite: a node whose blob file the corrupt-chunk drill damaged refused all writes
 * a few drills later).
 */
static void test_blob_file_damage_keeps_writes(void **state)
{
    struct fx *f = *state;
    const size_t shard = 16 * CHUNK; /* 1 MiB */
    uint8_t *buf = malloc(shard);
    char path[1200];
    int blobs = 0, bad = 0;
    DIR *dp;
    struct dirent *e;
    size_t n;

    ts_store_close(f->s);
    f->o.write_buffer_bytes = 1u << 20;
    f->o.blob_file_size = 1u << 20;
    assert_int_equal(fx_open(f), 0);
    mk_dataset(f->s, "old", CHUNK);
    for (uint32_t i = 0; i < 48; i += 2) /* even shards now, odd ones later: their keys */
        ts_test_put_shard(f->s, "old", i, shard, CHUNK,
                          100 + i); /* interleave, compactions merge */
    ts_store_close(f->s);
    f->s = NULL;
    /* 16 bytes spread over the middle of every blob file. */
    dp = opendir(f->dir);
    assert_non_null(dp);
    while ((e = readdir(dp))) {
        struct stat st;
        FILE *fp;
        if (!strstr(e->d_name, ".blob"))
            continue;
        snprintf(path, sizeof(path), "%s/%s", f->dir, e->d_name);
        assert_int_equal(stat(path, &st), 0);
        fp = fopen(path, "r+b");
        assert_non_null(fp);
        for (int k = 0; k < 16; k++) {
            long off = (long)(st.st_size / 4 + k * (st.st_size / 32));
            int c;
            fseek(fp, off, SEEK_SET);
            c = fgetc(fp);
            fseek(fp, off, SEEK_SET);
            fputc(c ^ 0xff, fp);
        }
        fclose(fp);
        blobs++;
    }
    closedir(dp);
    assert_true(blobs >= 4);
    assert_int_equal(fx_open(f), 0);
    /* Enough writes for many flushes and compactions of the files that reference them. */
    for (uint32_t i = 1; i < 48; i += 2)
        ts_test_put_shard(f->s, "old", i, shard, CHUNK, 100 + i);
    /* Compactions run in the background: keep writing for a while as they do. */
    mk_dataset(f->s, "after", CHUNK);
    for (uint32_t i = 0; i < 30; i++) {
        ts_test_put_shard(f->s, "after", i, shard, CHUNK, 900 + i);
        usleep(100000);
    }
    check_range(f->s, "after", 29, 929, 0, shard, shard);
    /* Every old shard reads back whole and right, or as TS_ECORRUPT: never other bytes. */
    for (uint32_t i = 0; i < 48; i++) {
        int rc = ts_store_read(f->s, "old", i, 0, shard, buf, &n);
        if (rc == 0)
            check_range(f->s, "old", i, 100 + i, 0, shard, shard);
        else
            assert_int_equal(rc, TS_ECORRUPT);
        bad += rc != 0;
    }
    assert_true(bad > 0);
    free(buf);
}

/* ---- crash: kill -9 a writer mid-stream ---------------------------------------------- */

/* Writes with the fixture's options (the storage mode and sync policy under test). */
static void crash_child(const struct ts_store_opts *fo, int fd)
{
    struct ts_store_opts o = *fo;
    ts_store *s;
    ts_shard_writer *w;
    uint8_t *buf = malloc(CHUNK);

    if (ts_store_open(&s, &o))
        _exit(2);
    for (uint32_t shard = 0;; shard++) {
        if (ts_store_shard_begin(s, "crash", shard, TS_SIZE_UNKNOWN, &w))
            _exit(3);
        for (uint32_t idx = 0; idx < 8; idx++) {
            uint32_t ack[2] = {shard, idx};
            ts_test_fill(buf, CHUNK, shard, (uint64_t)idx * CHUNK);
            if (ts_shard_writer_put(w, idx, buf, CHUNK, ts_crc32c(0, buf, CHUNK)))
                _exit(4);
            /* Acknowledged: tell the parent. */
            if (write(fd, ack, sizeof(ack)) != sizeof(ack))
                _exit(5);
        }
        if (shard % 2 == 0 && ts_shard_writer_seal(w, 0, 0, NULL, 0))
            _exit(6);
        else if (shard % 2)
            ts_shard_writer_abort(w); /* leave odd shards incomplete */
    }
}

static void test_crash_kill9(void **state)
{
    struct fx *f = *state;
    int pfd[2];
    pid_t pid;
    uint32_t ack[2], acked = 0, last_shard = 0, last_idx = 0;
    int status;

    mk_dataset(f->s, "crash", CHUNK);
    ts_store_close(f->s);
    f->s = NULL;
    assert_int_equal(pipe(pfd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        crash_child(&f->o, pfd[1]);
        _exit(0);
    }
    close(pfd[1]);
    /* Let it run until 100 chunks are acknowledged, then kill it mid-stream. */
    while (acked < 100 && read(pfd[0], ack, sizeof(ack)) == sizeof(ack)) {
        last_shard = ack[0];
        last_idx = ack[1];
        acked++;
    }
    kill(pid, SIGKILL);
    /* Anything still in the pipe was acknowledged too. */
    while (read(pfd[0], ack, sizeof(ack)) == sizeof(ack)) {
        last_shard = ack[0];
        last_idx = ack[1];
        acked++;
    }
    close(pfd[0]);
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    assert_true(acked >= 100);

    assert_int_equal(fx_open(f), 0);
    uint8_t *want = malloc(CHUNK);
    for (uint32_t shard = 0; shard <= last_shard; shard++) {
        ts_read_ctx *r;
        uint32_t upto = shard < last_shard ? 7 : last_idx;
        assert_int_equal(ts_store_read_open(f->s, "crash", shard, 1, &r), 0);
        if (shard < last_shard && shard % 2 == 0)
            assert_int_equal(ts_read_ctx_info(r)->state, TS_SHARD_COMPLETE);
        for (uint32_t idx = 0; idx <= upto; idx++) {
            struct ts_chunk_ref ref;
            assert_int_equal(ts_read_ctx_chunk(r, idx, &ref), 0);
            assert_int_equal(ref.len, CHUNK);
            ts_test_fill(want, CHUNK, shard, (uint64_t)idx * CHUNK);
            assert_memory_equal(ref.data, want, CHUNK);
            ts_chunk_ref_release(&ref);
        }
        ts_read_ctx_close(r);
    }
    free(want);
    /* A shard that was never sealed is not readable as complete. */
    uint8_t b;
    assert_int_equal(ts_store_read(f->s, "crash", 1, 0, 1, &b, NULL), TS_EINCOMPLETE);
    struct ts_scrub_report rep;
    assert_int_equal(ts_store_scrub(f->s, "crash", NULL, NULL, &rep), 0);
    assert_true(rep.corrupt == 0);
}

static void test_cache(void **state)
{
    struct fx *f = *state;
    struct ts_store_cache_stats cs0, cs1;
    ts_read_ctx *r;
    struct ts_chunk_ref a, b;
    uint8_t *buf = malloc(CHUNK);

    mk_dataset(f->s, "cache", CHUNK);
    ts_test_put_shard(f->s, "cache", 0, 3 * CHUNK, CHUNK, 21);
    ts_store_cache_stats(f->s, &cs0);
    check_range(f->s, "cache", 0, 21, 0, 3 * CHUNK, 3 * CHUNK);  /* fills the cache */
    check_range(f->s, "cache", 0, 21, 10, 2 * CHUNK, 2 * CHUNK); /* served from it */
    ts_store_cache_stats(f->s, &cs1);
    assert_true(cs1.hits >= cs0.hits + 3);
    assert_true(cs1.entries >= 4); /* 3 chunks + the shard record */
    /* A cached chunk is shared, and its bytes are in the arena for sendfile. */
    assert_int_equal(ts_store_read_open(f->s, "cache", 0, 0, &r), 0);
    assert_int_equal(ts_read_ctx_chunk(r, 1, &a), 0);
    assert_int_equal(ts_read_ctx_chunk(r, 1, &b), 0);
    assert_ptr_equal(a.data, b.data);
    assert_true(a.fd >= 0);
    assert_int_equal(pread(a.fd, buf, a.len, (off_t)a.file_off), (ssize_t)a.len);
    assert_memory_equal(buf, a.data, a.len);
    assert_int_equal(ts_crc32c(0, buf, a.len), a.crc);
    ts_chunk_ref_release(&a);
    ts_chunk_ref_release(&b);
    ts_read_ctx_close(r);
    /* Deleting the dataset drops its cached entries; the name comes back empty. */
    assert_int_equal(ts_store_dataset_delete(f->s, "cache"), 0);
    mk_dataset(f->s, "cache", CHUNK);
    uint8_t x;
    assert_int_equal(ts_store_read(f->s, "cache", 0, 0, 1, &x, NULL), TS_ENOENT);
    free(buf);
}

static int setup_small_cache(void **state)
{
    struct fx *f = fx_closed(state);
    f->o.cache_bytes = 8 * (CHUNK + 4096); /* a few chunks: constant eviction */
    return fx_open(f);
}

static int setup_no_cache(void **state)
{
    struct fx *f = fx_closed(state);
    f->o.cache_bytes = 0;
    return fx_open(f);
}

static void test_cache_eviction(void **state)
{
    struct fx *f = *state;
    struct ts_store_cache_stats cs;

    mk_dataset(f->s, "ev", CHUNK);
    ts_test_put_shard(f->s, "ev", 0, 20 * CHUNK, CHUNK, 31);
    ts_test_put_shard(f->s, "ev", 1, 20 * CHUNK, CHUNK, 32);
    for (int round = 0; round < 3; round++) {
        check_range(f->s, "ev", 0, 31, 0, 20 * CHUNK, 20 * CHUNK);
        check_range(f->s, "ev", 1, 32, CHUNK / 3, 15 * CHUNK, 15 * CHUNK);
    }
    ts_store_cache_stats(f->s, &cs);
    if (f->o.cache_bytes) {
        assert_true(cs.evictions > 0);
        assert_true(cs.bytes <= cs.budget);
    } else {
        assert_true(cs.entries == 0 && cs.hits == 0);
    }
}

static void test_sst_mode(void **state)
{
    struct fx *f = *state;
    mk_dataset(f->s, "sst", CHUNK);
    ts_test_put_shard(f->s, "sst", 0, 3 * CHUNK + 5, CHUNK, 8);
    check_range(f->s, "sst", 0, 8, CHUNK - 3, CHUNK + 6, CHUNK + 6);
}

/* The largest *.log (WAL) file of dir into path; its size, 0 if none. */
static off_t largest_wal(const char *dir, char *path, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    off_t best = 0;

    while (d && (e = readdir(d)) != NULL) {
        char p[1024];
        struct stat st;
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".log"))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && st.st_size > best) {
            best = st.st_size;
            snprintf(path, cap, "%s", p);
        }
    }
    if (d)
        closedir(d);
    return best;
}

/*
 * Bytes flipped in the middle of the write-ahead log: the store opens (at the last consistent
 * point), says so (ts_store_wal_damage_ns, kept across restarts), and what it still has reads
 * back verified; a clean reopen never reports damage.
 */
static void test_damaged_wal_reported(void **state)
{
    struct fx *f = *state;
    char wal[1100];
    off_t size;
    int fd, present = 0;
    size_t nchunks = f->o.chunk_files ? 32 : 1;

    mk_dataset(f->s, "wal", CHUNK);
    ts_store_close(f->s);
    assert_int_equal(fx_open(f), 0);
    assert_true(ts_store_wal_damage_ns(f->s) == 0); /* a clean restart */
    /* The recovery at that open moved the WAL's contents into tables: the shards below are in
     * the new WAL only. */
    /* With chunk files the WAL holds records only: shards of 32 chunks make it span several
     * of its 32 KiB blocks (damage in the last one reads as a torn tail, dropped quietly). */
    for (uint32_t i = 0; i < 40; i++)
        ts_test_put_shard(f->s, "wal", i, nchunks * CHUNK, CHUNK, 900 + i);
    ts_store_close_unflushed(f->s); /* as a crash leaves it: these shards in the WAL only */
    f->s = NULL;

    size = largest_wal(f->dir, wal, sizeof(wal));
    /* With chunk files the WAL holds the records only (the bytes are in the files). */
    fprintf(stderr, "  WAL %lld bytes\n", (long long)size);
    assert_true(size > (f->o.chunk_files ? 4 * 32768 : 16 * (off_t)CHUNK));
    fd = open(wal, O_RDWR);
    assert_true(fd >= 0);
    for (off_t at = size / 2; at < size / 2 + 64; at++) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);

    assert_int_equal(fx_open(f), 0);
    assert_true(ts_store_wal_damage_ns(f->s) > 0);
    for (uint32_t i = 0; i < 40; i++) {
        struct ts_shard_info si;
        int rc = ts_store_shard_stat(f->s, "wal", i, &si);
        if (rc == 0 && si.state == TS_SHARD_COMPLETE) {
            check_range(f->s, "wal", i, 900 + i, 0, nchunks * CHUNK, nchunks * CHUNK);
            present++;
        }
    }
    fprintf(stderr, "  %d of 40 shards before the damage are still there\n", present);
    assert_true(present > 0 && present < 40);
    ts_store_close(f->s);
    assert_int_equal(fx_open(f), 0);
    assert_true(ts_store_wal_damage_ns(f->s) > 0); /* still reported after another restart */
}

/*
 * An upload left open (an older PG primary's stream, a vanished client) must not block the
 * replication that supersedes it: a takeover begin ends it, and a delete decided by a primary
 * (force) ends every upload of the dataset. The old writer then fails cleanly and its abort
 * touches nothing of the new one; without takeover or force the old rules hold (TS_EBUSY).
 */
static void test_writer_takeover(void **state)
{
    struct fx *f = *state;
    ts_shard_writer *old, *neu, *w2;
    uint8_t buf[1000];
    struct ts_shard_info si;

    mk_dataset(f->s, "tk", CHUNK);
    ts_test_fill(buf, sizeof(buf), 7, 0);
    assert_int_equal(ts_store_shard_begin(f->s, "tk", 0, sizeof(buf), &old), 0);
    assert_int_equal(ts_store_shard_begin(f->s, "tk", 0, sizeof(buf), &neu), TS_EBUSY);
    assert_int_equal(ts_store_shard_begin_ex(f->s, "tk", 0, sizeof(buf), 1, &neu), 0);
    assert_int_equal(ts_shard_writer_put(old, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     TS_ESTALE);
    ts_shard_writer_abort(old); /* frees it; the new upload goes on */
    assert_int_equal(ts_shard_writer_put(neu, 0, buf, sizeof(buf), ts_crc32c(0, buf, sizeof(buf))),
                     0);
    assert_int_equal(ts_shard_writer_seal(neu, 1, ts_crc32c(0, buf, sizeof(buf)), NULL, 0), 0);
    assert_int_equal(ts_store_shard_stat(f->s, "tk", 0, &si), 0);
    assert_int_equal(si.state, TS_SHARD_COMPLETE);
    check_range(f->s, "tk", 0, 7, 0, sizeof(buf), sizeof(buf));

    assert_int_equal(ts_store_shard_begin(f->s, "tk", 1, sizeof(buf), &w2), 0);
    assert_int_equal(ts_store_dataset_delete(f->s, "tk"), TS_EBUSY);
    assert_int_equal(ts_store_dataset_delete_ex(f->s, "tk", 1), 0);
    assert_int_equal(ts_shard_writer_seal(w2, 0, 0, NULL, 0), TS_ESTALE);
    ts_shard_writer_abort(w2);
    assert_int_equal(ts_store_shard_stat(f->s, "tk", 0, &si), TS_ENOENT);
}

int main(void)
{
    ts_test_log_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_sizes, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_64mib, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_range_reads, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_seal_rules, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_records_dropped, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_records_dropped, setup_blob, teardown),
        cmocka_unit_test_setup_teardown(test_names_and_duplicates, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_delete_and_list, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_records_and_reopen, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_pg_iter, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_pg_log_and_peering_facts, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_pg_truncate_refuses_newer_entries, setup_files,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_incarnations_and_tombstones, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup_blob, teardown),
        cmocka_unit_test_setup_teardown(test_scrub_paced, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_scrub_dataset_deleted_meanwhile, setup_files,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_blob_file_damage_keeps_writes, setup_blob, teardown),
        cmocka_unit_test_setup_teardown(test_inline_one_batch, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_inline_shards, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_sizes, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_delete_and_list, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_seal_rules, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_files, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_crash_kill9, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_wal_reported, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_wal_reported, setup_blob, teardown),
        cmocka_unit_test_setup_teardown(test_crash_kill9, setup_blob, teardown),
        cmocka_unit_test_setup_teardown(test_crash_kill9, setup_seal, teardown),
        cmocka_unit_test_setup_teardown(test_crash_kill9, setup_inline, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_files, setup_seal, teardown),
        cmocka_unit_test_setup_teardown(test_records_and_reopen, setup_seal, teardown),
        cmocka_unit_test_setup_teardown(test_writer_takeover, setup_seal, teardown),
        cmocka_unit_test_setup_teardown(test_writer_takeover, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_sst_mode, setup_sst, teardown),
        cmocka_unit_test_setup_teardown(test_cache, setup_files, teardown),
        cmocka_unit_test_setup_teardown(test_cache_eviction, setup_small_cache, teardown),
        cmocka_unit_test_setup_teardown(test_cache_eviction, setup_no_cache, teardown),
    };
    return cmocka_run_group_tests_name("storage", tests, NULL, NULL);
}
