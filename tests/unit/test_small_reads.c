/*
 * Small reads from disk (issue 32): a range of a chunk that is not cached is read by 4 KiB
 * sub-blocks from its chunk file and verified against the sub-blocks' CRCs kept on disk, not by
 * reading its whole chunk; a byte flipped inside what the read touches is found, one flipped
 * elsewhere in the chunk does not cost the read (the whole-chunk read proves it was flipped).
 */
#include "store_util.h"
#include "ts_test.h"

#include "store_internal.h" /* key_subcrc: damage to the kept sub-block CRCs */
#include "ts_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (256u << 10)
#define SIZE (3 * CHUNK - 1000) /* a short last chunk */
#define SEED 7

struct fx {
    char *dir;
    ts_store *s;
    struct ts_store_opts o;
    uint64_t dsid;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct ts_dataset_policy p;
    struct ts_dataset_info d;

    f->dir = ts_test_tmpdir("small-reads");
    ts_store_opts_init(&f->o);
    f->o.path = f->dir;
    f->o.sync = TS_SYNC_NONE;
    assert_int_equal(ts_store_open(&f->s, &f->o), 0);
    ts_dataset_policy_init(&p);
    p.chunk_size = CHUNK;
    assert_int_equal(ts_store_dataset_create(f->s, "ds", &p), 0);
    ts_test_put_shard(f->s, "ds", 0, SIZE, CHUNK, SEED);
    assert_int_equal(ts_store_dataset_record(f->s, "ds", &d), 0);
    f->dsid = d.id;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    ts_store_close(f->s);
    ts_test_rmtree(f->dir);
    free(f);
    return 0;
}

/* Reads [off, off+len) of shard 0 through ts_read_ctx_piece as the server does: the bytes and
 * their CRC, or the check's error. *piece: whether it was read by sub-blocks. */
static int read_piece(ts_store *s, uint64_t off, size_t len, uint8_t *out, int *piece)
{
    ts_read_ctx *r;
    struct ts_chunk_ref ref;
    uint32_t idx = (uint32_t)(off / CHUNK), crc;
    size_t in = (size_t)(off % CHUNK);
    int rc;

    assert_int_equal(ts_store_read_open(s, "ds", 0, 0, &r), 0);
    rc = ts_read_ctx_piece(r, idx, in, len, &ref);
    if (rc == 0) {
        *piece = ref.piece;
        if (ts_chunk_ref_whole(&ref, in, len))
            crc = ref.crc;
        else
            rc = ts_chunk_ref_check_crc(&ref, in, len, &crc);
        if (rc == 0) {
            memcpy(out, ts_chunk_ref_at(&ref, in), len);
            assert_int_equal(crc, ts_crc32c(0, out, len)); /* the reply's CRC is right */
        }
        ts_chunk_ref_release(&ref);
    }
    ts_read_ctx_close(r);
    return rc;
}

static void expect_bytes(const uint8_t *got, uint64_t off, size_t len)
{
    uint8_t *want = malloc(len);
    ts_test_fill(want, len, SEED, off);
    assert_memory_equal(got, want, len);
    free(want);
}

static void reads(ts_store *s, struct ts_store_read_stats *st)
{
    ts_store_read_stats(s, st);
}

/* A 10 KiB record reads 12 KiB (its three sub-blocks), never its 256 KiB chunk, and is not
 * cached; a large read takes the whole chunk, which later small reads then use. */
static void test_small_read_touches_its_sub_blocks(void **state)
{
    struct fx *f = *state;
    struct ts_store_read_stats a, b;
    uint8_t *buf = malloc(CHUNK);
    const struct {
        uint64_t off;
        size_t len, read;
    } cases[] = {
        {CHUNK + 50001, 10000, 12288},      /* unaligned both ends: sub-blocks 12..14 */
        {CHUNK + 8192, 4096, 4096},         /* one aligned sub-block */
        {2 * CHUNK + 200000, 61144, 64536}, /* to the end of the short last chunk */
        {100, 1, 4096},                     /* one byte */
        {2 * CHUNK + 250000, 11144, 11288}, /* into the last, partial sub-block */
        {CHUNK - 5000, 4000, 8192},         /* the chunk's last two sub-blocks */
    };
    int piece;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        reads(f->s, &a);
        assert_int_equal(read_piece(f->s, cases[i].off, cases[i].len, buf, &piece), 0);
        reads(f->s, &b);
        assert_true(piece);
        expect_bytes(buf, cases[i].off, cases[i].len);
        assert_int_equal(b.pieces - a.pieces, 1);
        assert_int_equal(b.piece_bytes - a.piece_bytes, cases[i].read);
        assert_int_equal(b.chunks - a.chunks, 0);
    }
    /* Not cached: the same record is read from disk again. */
    reads(f->s, &a);
    assert_int_equal(read_piece(f->s, CHUNK + 50001, 10000, buf, &piece), 0);
    reads(f->s, &b);
    assert_int_equal(b.pieces - a.pieces, 1);
    /* A large range (over a quarter of the chunk) reads and caches the whole chunk... */
    assert_int_equal(read_piece(f->s, CHUNK, CHUNK / 2, buf, &piece), 0);
    assert_false(piece);
    expect_bytes(buf, CHUNK, CHUNK / 2);
    reads(f->s, &a);
    assert_int_equal(a.chunks - b.chunks, 1);
    assert_int_equal(a.chunk_bytes - b.chunk_bytes, CHUNK);
    /* ...which small reads of that chunk then use (checked by sub-block in memory). */
    assert_int_equal(read_piece(f->s, CHUNK + 50001, 10000, buf, &piece), 0);
    assert_false(piece);
    expect_bytes(buf, CHUNK + 50001, 10000);
    reads(f->s, &b);
    assert_int_equal(b.pieces, a.pieces);
    assert_int_equal(b.chunks, a.chunks);
    free(buf);
}

static void flip_file_byte(struct fx *f, uint64_t at)
{
    char path[1400];

    assert_int_equal(ts_test_chunk_file(f->dir, f->dsid, 0, path, sizeof(path)), 0);
    ts_test_flip_file_byte(path, at);
}

/* Whether chunk idx, read whole from disk, fails its CRC: proof that a flip happened. */
static int whole_chunk_fails(struct fx *f, uint32_t idx)
{
    ts_read_ctx *r;
    struct ts_chunk_ref ref;
    int rc;

    assert_int_equal(ts_store_read_open(f->s, "ds", 0, 0, &r), 0);
    ts_read_ctx_evict(r, idx);
    rc = ts_read_ctx_chunk(r, idx, &ref);
    if (rc == 0)
        ts_chunk_ref_release(&ref);
    ts_read_ctx_evict(r, idx); /* read good: not kept, the next read goes to disk again */
    ts_read_ctx_close(r);
    return rc == TS_ECORRUPT;
}

/* A byte flipped in the chunk file: inside the record, the read fails (never the bytes); in a
 * sub-block the read touches but outside the record, it fails too (each touched sub-block is
 * verified whole: the server then reads the whole chunk and repairs it from a replica); in
 * another part of the chunk, the record reads back right while the whole chunk fails. */
static void test_flipped_bytes(void **state)
{
    struct fx *f = *state;
    uint8_t *buf = malloc(CHUNK);
    const uint64_t rec = CHUNK + 50001; /* a 10,000-byte record: sub-blocks 12..14 of chunk 1 */
    int piece;

    /* Elsewhere in the chunk (byte 200,000 of chunk 1): the record is unharmed. */
    flip_file_byte(f, CHUNK + 200000);
    assert_true(whole_chunk_fails(f, 1));
    assert_int_equal(read_piece(f->s, rec, 10000, buf, &piece), 0);
    assert_true(piece);
    expect_bytes(buf, rec, 10000);
    flip_file_byte(f, CHUNK + 200000); /* back */
    assert_false(whole_chunk_fails(f, 1));

    /* Inside the record. */
    flip_file_byte(f, rec + 5000);
    assert_int_equal(read_piece(f->s, rec, 10000, buf, &piece), TS_ECORRUPT);
    flip_file_byte(f, rec + 5000);
    /* In the record's first sub-block, before the record. */
    flip_file_byte(f, CHUNK + 12 * 4096 + 3);
    assert_int_equal(read_piece(f->s, rec, 10000, buf, &piece), TS_ECORRUPT);
    flip_file_byte(f, CHUNK + 12 * 4096 + 3);
    /* In its last sub-block, after it. */
    flip_file_byte(f, CHUNK + 15 * 4096 - 1);
    assert_int_equal(read_piece(f->s, rec, 10000, buf, &piece), TS_ECORRUPT);
    flip_file_byte(f, CHUNK + 15 * 4096 - 1);
    assert_int_equal(read_piece(f->s, rec, 10000, buf, &piece), 0);
    expect_bytes(buf, rec, 10000);
    free(buf);
}

/* The kept sub-block CRCs damaged (a flipped byte in their record): they no longer fold to the
 * chunk's CRC, so they are not used: the read takes the whole chunk, verified, and is right. */
static void test_damaged_sub_crcs_not_used(void **state)
{
    struct fx *f = *state;
    uint8_t k[17], *buf = malloc(CHUNK);
    int piece;

    ts_store_close(f->s);
    f->s = NULL;
    ts_test_flip_value(f->dir, 1, k, key_subcrc(k, f->dsid, 0, 1), 13 * 4);
    assert_int_equal(ts_store_open(&f->s, &f->o), 0);
    assert_int_equal(read_piece(f->s, CHUNK + 50001, 10000, buf, &piece), 0);
    assert_false(piece);
    expect_bytes(buf, CHUNK + 50001, 10000);
    /* Chunk 0's are intact: read by sub-blocks. */
    assert_int_equal(read_piece(f->s, 50001, 10000, buf, &piece), 0);
    assert_true(piece);
    free(buf);
}

/* A shard deleted takes its sub-block CRCs along; written again, its new ones are used. */
static void test_rewritten_shard(void **state)
{
    struct fx *f = *state;
    uint8_t *buf = malloc(CHUNK);
    char *v;
    size_t vlen;
    uint8_t k[17];
    int piece;

    assert_int_equal(ts_store_shard_delete(f->s, "ds", 0), 0);
    assert_int_equal(meta_get(f->s, k, key_subcrc(k, f->dsid, 0, 1), &v, &vlen), TS_ENOENT);
    ts_test_put_shard(f->s, "ds", 0, SIZE, CHUNK, SEED);
    assert_int_equal(read_piece(f->s, CHUNK + 50001, 10000, buf, &piece), 0);
    assert_true(piece);
    expect_bytes(buf, CHUNK + 50001, 10000);
    free(buf);
}

/* A chunk hinted (wanted soon, not read ahead yet): a small read of it takes the whole chunk into
 * the cache, so the next reads of it hit; once its prefetch came, small reads are pieces again. */
static void test_wanted_chunk_read_whole(void **state)
{
    struct fx *f = *state;
    struct ts_store_read_stats a, b;
    uint8_t *buf = malloc(CHUNK);
    int piece;

    ts_store_want(f->s, f->dsid, 0, 1, 1);
    reads(f->s, &a);
    assert_int_equal(read_piece(f->s, CHUNK + 50001, 10000, buf, &piece), 0);
    assert_false(piece);
    expect_bytes(buf, CHUNK + 50001, 10000);
    assert_int_equal(read_piece(f->s, CHUNK + 70001, 10000, buf, &piece), 0);
    expect_bytes(buf, CHUNK + 70001, 10000);
    reads(f->s, &b);
    assert_int_equal(b.chunks - a.chunks, 1); /* the second read hit the cache */
    assert_int_equal(b.pieces, a.pieces);
    ts_store_want(f->s, f->dsid, 0, 1, 0);
    assert_int_equal(read_piece(f->s, 50001, 10000, buf, &piece), 0);
    assert_true(piece); /* chunk 0 was never wanted */
    free(buf);
}

struct racer {
    ts_store *s;
    pthread_barrier_t *go;
    int rc;
};

static void *race_read(void *arg)
{
    struct racer *x = arg;
    ts_read_ctx *r;
    struct ts_chunk_ref ref;

    x->rc = ts_store_read_open(x->s, "ds", 0, 0, &r);
    pthread_barrier_wait(x->go);
    if (x->rc == 0)
        x->rc = ts_read_ctx_chunk(r, 2, &ref);
    if (x->rc == 0)
        ts_chunk_ref_release(&ref);
    ts_read_ctx_close(r);
    return NULL;
}

/* Eight readers miss the same chunk at once: it is read from disk once, the others wait for
 * that fill and take the cached copy (storage/fill.c). */
static void test_one_fill_per_chunk(void **state)
{
    struct fx *f = *state;
    struct ts_store_read_stats a, b;
    struct racer x[8];
    pthread_t th[8];
    pthread_barrier_t go;

    for (int round = 0; round < 5; round++) {
        ts_read_ctx *r;
        assert_int_equal(ts_store_read_open(f->s, "ds", 0, 0, &r), 0);
        ts_read_ctx_evict(r, 2);
        ts_read_ctx_close(r);
        pthread_barrier_init(&go, NULL, 8);
        reads(f->s, &a);
        for (int i = 0; i < 8; i++) {
            x[i] = (struct racer){f->s, &go, -1};
            assert_int_equal(pthread_create(&th[i], NULL, race_read, &x[i]), 0);
        }
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(x[i].rc, 0);
        }
        reads(f->s, &b);
        assert_int_equal(b.chunks - a.chunks, 1);
        pthread_barrier_destroy(&go);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_small_read_touches_its_sub_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_sub_crcs_not_used, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rewritten_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wanted_chunk_read_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_fill_per_chunk, setup, teardown),
    };
    ts_test_log_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
