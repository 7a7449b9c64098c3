/*
 * READV against a real tesserad on loopback: many small ranges of several shards in one
 * request, each answered with its own status, length and CRC32C (ranges inside a chunk,
 * across a chunk boundary, a whole chunk, cut at the shard's end, past it, of a shard that does
 * not exist); bad requests refused with the connection and the data intact; the client
 * library's READV scattering each range into its own buffer; and a chunk flipped on disk
 * failing only the ranges that touch it.
 */
#include "harness.h"
#include "ts_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "client_internal.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CORRUPT_CHUNK_PATH
#error "CORRUPT_CHUNK_PATH must be defined by the build"
#endif

#define CHUNK (64u << 10)
#define SIZE0 (5 * CHUNK + 7)

static struct tsd_proc D;

static int group_setup(void **state)
{
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};
    tessera_client *c;

    if (tsd_start(&D, NULL) != 0)
        return -1;
    c = tsd_connect(&D);
    if (!c || tessera_dataset_create(c, "rv", &p) != 0 || tsd_put_pattern(c, "rv", 0, SIZE0, 1) ||
        tsd_put_pattern(c, "rv", 1, 100, 2) || tsd_put_pattern(c, "rv", 2, 3 * CHUNK, 3))
        return -1;
    tessera_client_close(c);
    return 0;
}

static int group_teardown(void **state)
{
    int rc = tsd_stop(&D);

    tsd_cleanup(&D);
    return rc == 0 ? 0 : -1;
}

/* The expected bytes of a range of the test shards. */
static uint64_t seed_of(uint32_t shard)
{
    return shard + 1;
}

static uint64_t size_of(uint32_t shard)
{
    return shard == 0 ? SIZE0 : shard == 1 ? 100 : 3 * CHUNK;
}

struct range {
    uint32_t shard;
    uint64_t off;
    uint32_t len;
};

static void readv_payload(struct ts_wr *w, const char *ds, const struct range *v, uint32_t n,
                          uint32_t count_field)
{
    ts_wr_init(w);
    ts_wr_str(w, ds);
    ts_wr_u32(w, count_field);
    for (uint32_t i = 0; i < n; i++) {
        ts_wr_u32(w, v[i].shard);
        ts_wr_u64(w, v[i].off);
        ts_wr_u32(w, v[i].len);
    }
}

/* Sends a READV on fd; the reply's status, its payload in *pl (malloc'ed). */
static int readv_raw(int fd, uint16_t flags, const char *ds, const struct range *v, uint32_t n,
                     uint32_t count_field, uint8_t **pl, size_t *plen, char *msg, size_t cap)
{
    static uint64_t id = 100;
    struct ts_wr w;
    uint64_t got_id = 0;
    int rc;

    readv_payload(&w, ds, v, n, count_field);
    assert_int_equal(raw_send_frame(fd, TS_OP_READV, flags, ++id, w.buf, w.len), 0);
    ts_wr_fini(&w);
    rc = raw_recv_reply(fd, 10000, &got_id, msg, cap, pl, plen);
    assert_true(got_id == id);
    return rc;
}

/* A good READV of every kind of range, its reply checked field by field and byte by byte. */
static void check_good_readv(int fd)
{
    const struct range v[] = {
        {0, 0, 100},            /* inside the first chunk */
        {0, CHUNK - 10, 20},    /* across a chunk boundary */
        {2, CHUNK, CHUNK},      /* a whole chunk: its stored CRC */
        {1, 50, 1000},          /* cut at the shard's end: 50 bytes */
        {0, SIZE0, 10},         /* at the end exactly: nothing */
        {0, SIZE0 + 100, 4},    /* past the end */
        {7, 0, 10},             /* no such shard */
        {2, 10, 2 * CHUNK + 5}, /* three chunks, partial at both ends */
        {1, 0, 100},            /* a whole small shard */
    };
    const int want_rc[] = {0, 0, 0, 0, 0, TS_ERANGE, TS_ENOENT, 0, 0};
    const uint32_t n = TS_ARRAY_SIZE(v);
    uint8_t *pl = NULL, *want;
    size_t plen = 0, at;
    struct ts_rd rd;

    assert_int_equal(readv_raw(fd, 0, "rv", v, n, n, &pl, &plen, NULL, 0), 0);
    ts_rd_init(&rd, pl, plen);
    assert_int_equal(ts_rd_u32(&rd), 0);
    assert_int_equal(ts_rd_u32(&rd), n);
    at = rd.off + n * (size_t)TS_READV_RESULT;
    for (uint32_t i = 0; i < n; i++) {
        int32_t st = (int32_t)ts_rd_u32(&rd);
        uint32_t len = ts_rd_u32(&rd), crc = ts_rd_u32(&rd);
        uint64_t end = v[i].off + v[i].len;
        assert_int_equal(st, want_rc[i]);
        if (st) {
            assert_int_equal(len, 0);
            continue;
        }
        if (end > size_of(v[i].shard))
            end = size_of(v[i].shard);
        assert_int_equal(len, end - v[i].off);
        want = malloc(len + 1);
        ts_test_fill(want, len, seed_of(v[i].shard), v[i].off);
        assert_true(at + len <= plen);
        assert_memory_equal(pl + at, want, len);
        assert_int_equal(crc, ts_crc32c(0, want, len));
        free(want);
        at += len;
    }
    assert_int_equal(at, plen); /* nothing after the last range's bytes */
    free(pl);
}

static void test_readv_ranges(void **state)
{
    int fd = raw_connect(D.addr);

    check_good_readv(fd);
    check_good_readv(fd); /* again: now from the chunk cache */
    raw_close(fd);
}

/* Each bad READV is refused with a clear code; the connection and the data stay. */
static void test_readv_bad_input(void **state)
{
    struct range one = {0, 0, 10}, big[2] = {{2, 0, 3u << 20}, {0, 0, 3u << 20}};
    struct range many[TS_READV_MAX + 1];
    char msg[256];
    uint8_t *pl = NULL;
    size_t plen = 0;
    struct ts_wr w;
    uint64_t id;
    int fd = raw_connect(D.addr);

    for (size_t i = 0; i < TS_ARRAY_SIZE(many); i++)
        many[i] = one;
    /* No ranges; too many. */
    assert_int_equal(readv_raw(fd, 0, "rv", &one, 0, 0, NULL, NULL, msg, sizeof(msg)), TS_EINVAL);
    assert_non_null(strstr(msg, "ranges"));
    assert_int_equal(readv_raw(fd, 0, "rv", many, TS_READV_MAX + 1, TS_READV_MAX + 1, NULL, NULL,
                               msg, sizeof(msg)),
                     TS_EINVAL);
    /* A count that the entries do not fill; entries past the count. */
    assert_int_equal(readv_raw(fd, 0, "rv", many, 2, 3, NULL, NULL, msg, sizeof(msg)), TS_EPROTO);
    assert_int_equal(readv_raw(fd, 0, "rv", many, 3, 2, NULL, NULL, msg, sizeof(msg)), TS_EPROTO);
    /* A half entry. */
    readv_payload(&w, "rv", &one, 1, 1);
    assert_int_equal(raw_send_frame(fd, TS_OP_READV, 0, 7, w.buf, w.len - 5), 0);
    ts_wr_fini(&w);
    assert_int_equal(raw_recv_reply(fd, 10000, &id, msg, sizeof(msg), NULL, NULL), TS_EPROTO);
    /* More bytes than one READV may ask for. */
    assert_int_equal(readv_raw(fd, 0, "rv", big, 2, 2, NULL, NULL, msg, sizeof(msg)), TS_ETOOBIG);
    assert_non_null(strstr(msg, "at most"));
    /* Placement (flag RDMA) is for READ only. */
    assert_int_equal(readv_raw(fd, TS_F_RDMA, "rv", &one, 1, 1, NULL, NULL, msg, sizeof(msg)),
                     TS_EINVAL);
    /* An invalid name; a dataset that does not exist: every range says so. */
    assert_int_equal(readv_raw(fd, 0, "no/such", &one, 1, 1, NULL, NULL, msg, sizeof(msg)),
                     TS_ENAME);
    assert_int_equal(readv_raw(fd, 0, "nosuch", many, 3, 3, &pl, &plen, NULL, 0), 0);
    assert_int_equal(plen, 8 + 3 * TS_READV_RESULT);
    for (int i = 0; i < 3; i++)
        assert_int_equal((int32_t)ts_get_le32(pl + 8 + i * TS_READV_RESULT), TS_ENOENT);
    free(pl);
    /* The same connection still serves, and every byte is still there. */
    check_good_readv(fd);
    raw_close(fd);
    assert_true(tsd_alive(&D));
}

/* The library's READV: each range lands in its own buffer; a failed range keeps its code. */
static void test_readv_client(void **state)
{
    tessera_client *c = tsd_connect(&D);
    uint8_t a[300], b[CHUNK + 9], d[16], *want = malloc(CHUNK + 9);
    struct ts_readv v[] = {
        {0, 1000, sizeof(a), a, 0, 0},
        {2, CHUNK - 4, sizeof(b), b, 0, 0},
        {1, 200, sizeof(d), d, 0, 0}, /* past the end of a 100-byte shard */
    };
    uint64_t op = 0, op2 = 0;
    size_t got = 0;

    assert_non_null(c);
    assert_int_equal(ts_client_readv_submit(c, "rv", v, 3, &op), 0);
    assert_int_equal(tessera_wait_any(c, &op2, &got), 0);
    assert_true(op2 == op);
    assert_int_equal(got, sizeof(a) + sizeof(b));
    assert_int_equal(v[0].rc, 0);
    assert_int_equal(v[0].got, sizeof(a));
    ts_test_fill(want, sizeof(a), 1, 1000);
    assert_memory_equal(a, want, sizeof(a));
    assert_int_equal(v[1].rc, 0);
    assert_int_equal(v[1].got, sizeof(b));
    ts_test_fill(want, sizeof(b), 3, CHUNK - 4);
    assert_memory_equal(b, want, sizeof(b));
    assert_int_equal(v[2].rc, TS_ERANGE);
    assert_int_equal(v[2].got, 0);
    /* Arguments the library refuses before sending. */
    assert_int_equal(ts_client_readv_submit(c, "rv", v, 0, &op), TS_EINVAL);
    assert_int_equal(ts_client_readv_submit(c, "bad name", v, 1, &op), TS_ENAME);
    free(want);
    tessera_client_close(c);
}

/* Many READVs in flight at once, of random ranges (empty ones, ones across chunks, ones cut at
 * a shard's end, up to 256 a request): every byte lands in its own buffer, as the pattern says.
 * The replies' tables and data arrive split across receives in every way. */
static void test_readv_random(void **state)
{
    enum { INFLIGHT = 8, ROUNDS = 60 };
    struct batch {
        uint64_t op;
        size_t n;
        struct ts_readv v[TS_READV_MAX];
        uint8_t *buf;
    } *b = calloc(INFLIGHT, sizeof(*b));
    tessera_client *c = tsd_connect(&D);
    uint64_t rng = 0x243F6A8885A308D3ull;
    uint8_t *want = malloc(3 * CHUNK);

    assert_non_null(c);
    assert_non_null(b);
    for (int round = 0; round < ROUNDS + INFLIGHT; round++) {
        struct batch *x = &b[round % INFLIGHT];
        if (round >= INFLIGHT) { /* collect the batch that used this slot */
            size_t got = 0, total = 0;
            assert_int_equal(tessera_wait(c, x->op, &got), 0);
            for (size_t i = 0; i < x->n; i++) {
                struct ts_readv *v = &x->v[i];
                uint64_t size = size_of(v->shard), end = TS_MIN(v->off + v->len, size);
                if (v->off > size) {
                    assert_int_equal(v->rc, TS_ERANGE);
                    continue;
                }
                assert_int_equal(v->rc, 0);
                assert_int_equal(v->got, end - v->off);
                ts_test_fill(want, v->got, seed_of(v->shard), v->off);
                assert_memory_equal(v->dst, want, v->got);
                total += v->got;
            }
            assert_int_equal(got, total);
            free(x->buf);
        }
        if (round >= ROUNDS)
            continue;
        size_t used = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x->n = 1 + (rng >> 33) % TS_READV_MAX;
        x->buf = malloc((size_t)TS_READV_BYTES);
        for (size_t i = 0; i < x->n; i++) {
            struct ts_readv *v = &x->v[i];
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            v->shard = (uint32_t)((rng >> 20) % 3);
            v->off = (rng >> 28) % (size_of(v->shard) + 8); /* a few past the end */
            v->len = (size_t)((rng >> 45) % (i % 7 == 0 ? 3 * CHUNK : 6000));
            if (used + v->len > TS_READV_BYTES)
                v->len = 0;
            v->dst = x->buf + used;
            used += v->len;
        }
        assert_int_equal(ts_client_readv_submit(c, "rv", x->v, x->n, &x->op), 0);
    }
    free(want);
    free(b);
    tessera_client_close(c);
}

/* A byte flipped in a chunk on disk: the ranges touching it fail with TS_ECORRUPT (never its
 * bytes), the others in the same READV are served. Last: it restarts the node. */
static void test_readv_corrupt_chunk(void **state)
{
    const struct range v[] = {{0, CHUNK + 5, 100}, {0, 2 * CHUNK + 5, 100}, {1, 0, 100}};
    char cmd[1200];
    uint8_t *pl = NULL;
    size_t plen = 0;
    int fd;

    assert_int_equal(tsd_stop(&D), 0);
    snprintf(cmd, sizeof(cmd), "%s %s rv 0 1 100 >/dev/null", CORRUPT_CHUNK_PATH, D.data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&D, NULL), 0);
    fd = raw_connect(D.addr);
    assert_int_equal(readv_raw(fd, 0, "rv", v, 3, 3, &pl, &plen, NULL, 0), 0);
    assert_int_equal((int32_t)ts_get_le32(pl + 8), TS_ECORRUPT);
    assert_int_equal(ts_get_le32(pl + 8 + 4), 0);
    assert_int_equal((int32_t)ts_get_le32(pl + 8 + TS_READV_RESULT), 0);
    assert_int_equal((int32_t)ts_get_le32(pl + 8 + 2 * TS_READV_RESULT), 0);
    assert_int_equal(plen, 8 + 3 * TS_READV_RESULT + 200);
    free(pl);
    raw_close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readv_ranges),        cmocka_unit_test(test_readv_bad_input),
        cmocka_unit_test(test_readv_client),        cmocka_unit_test(test_readv_random),
        cmocka_unit_test(test_readv_corrupt_chunk),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
