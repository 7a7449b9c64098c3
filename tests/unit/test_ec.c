/*
 * The erasure code and the stripe layout (common/ec.c, ec_layout.c; issue 33): every pattern of
 * up to M lost fragments is rebuilt byte for byte, M+1 is refused without writing, a sub-range
 * of the cells decodes alone (a degraded read of a small record), policies parse and bad ones
 * are refused, and the layout puts every shard byte in exactly one place.
 */
#include "ts_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ts_common.h"
#include "ts_ec.h"

#include <stdlib.h>
#include <string.h>

#define NMAX (TS_EC_MAX_K + TS_EC_MAX_M)

static void test_parse(void **state)
{
    static const char *const bad[] = {"",        "ec:",     "ec:0+2", "ec:4+0", "ec:4+9",
                                      "ec:33+1", "ec:4+2x", "ec:4-2", "ec:+2",  "ec:4+",
                                      "rs:4+2",  "4+2+1",   " 4+2"};
    unsigned k = 0, m = 0;
    char err[128] = "";

    assert_int_equal(ts_ec_parse("ec:4+2", &k, &m, err, sizeof(err)), 0);
    assert_int_equal(k, 4);
    assert_int_equal(m, 2);
    assert_int_equal(ts_ec_parse("8+3", &k, &m, err, sizeof(err)), 0);
    assert_int_equal(k, 8);
    assert_int_equal(m, 3);
    assert_int_equal(ts_ec_parse("ec:32+8", &k, &m, NULL, 0), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        k = m = 77;
        err[0] = 0;
        assert_int_equal(ts_ec_parse(bad[i], &k, &m, err, sizeof(err)), TS_EINVAL);
        assert_non_null(strstr(err, "ec:K+M"));
        assert_int_equal(k, 77); /* refused: nothing changed */
    }
    assert_int_equal(ts_ec_parse(NULL, &k, &m, NULL, 0), TS_EINVAL);
}

static void test_create_limits(void **state)
{
    ts_ec *ec = (ts_ec *)1;

    assert_int_equal(ts_ec_create(&ec, 0, 2), TS_EINVAL);
    assert_null(ec);
    assert_int_equal(ts_ec_create(&ec, 4, 0), TS_EINVAL);
    assert_int_equal(ts_ec_create(&ec, TS_EC_MAX_K + 1, 1), TS_EINVAL);
    assert_int_equal(ts_ec_create(&ec, 4, TS_EC_MAX_M + 1), TS_EINVAL);
    assert_int_equal(ts_ec_create(&ec, 4, 2), 0);
    assert_int_equal(ts_ec_k(ec), 4);
    assert_int_equal(ts_ec_m(ec), 2);
    ts_ec_destroy(ec);
    ts_ec_destroy(NULL);
}

struct stripe {
    unsigned k, m;
    size_t len;
    uint8_t *orig[NMAX]; /* the true fragments */
    uint8_t *work[NMAX]; /* what a decode sees */
};

static void stripe_make(struct stripe *s, const ts_ec *ec, size_t len, uint64_t seed)
{
    s->k = ts_ec_k(ec);
    s->m = ts_ec_m(ec);
    s->len = len;
    for (unsigned i = 0; i < s->k + s->m; i++) {
        s->orig[i] = malloc(len);
        s->work[i] = malloc(len);
        assert_non_null(s->orig[i]);
        assert_non_null(s->work[i]);
        if (i < s->k)
            ts_test_fill(s->orig[i], len, seed + i, 0);
    }
    ts_ec_encode(ec, len, s->orig, &s->orig[s->k]);
}

static void stripe_free(struct stripe *s)
{
    for (unsigned i = 0; i < s->k + s->m; i++) {
        free(s->orig[i]);
        free(s->work[i]);
    }
}

/* Loses the fragments in `lost` (their buffers scribbled over) and rebuilds them. */
static int lose_and_decode(const ts_ec *ec, struct stripe *s, uint64_t lost)
{
    uint64_t all = (UINT64_C(1) << (s->k + s->m)) - 1;

    for (unsigned i = 0; i < s->k + s->m; i++) {
        if (lost >> i & 1)
            memset(s->work[i], 0xa5, s->len);
        else
            memcpy(s->work[i], s->orig[i], s->len);
    }
    return ts_ec_decode(ec, s->len, s->work, all & ~lost, lost);
}

/* Every set of up to m lost fragments (data, parity or both) comes back byte for byte; m+1
 * lost is TS_EUNAVAIL and the lost buffers are left as they were. */
static void check_code(unsigned k, unsigned m, size_t len)
{
    ts_ec *ec;
    struct stripe s;
    unsigned n = k + m, rebuilt = 0, refused = 0;

    assert_int_equal(ts_ec_create(&ec, k, m), 0);
    stripe_make(&s, ec, len, 1000 * k + m);
    /* Parity is not a copy of the data (the code did something; with k = 1 it is a mirror). */
    for (unsigned j = k; j < n && k > 1; j++)
        assert_memory_not_equal(s.orig[j], s.orig[0], len);
    for (uint64_t lost = 1; lost < (UINT64_C(1) << n); lost++) {
        int count = __builtin_popcountll(lost);
        if ((unsigned)count > m + 1)
            continue;
        if ((unsigned)count <= m) {
            assert_int_equal(lose_and_decode(ec, &s, lost), 0);
            for (unsigned i = 0; i < n; i++)
                assert_memory_equal(s.work[i], s.orig[i], len);
            rebuilt++;
        } else {
            assert_int_equal(lose_and_decode(ec, &s, lost), TS_EUNAVAIL);
            for (unsigned i = 0; i < n; i++)
                if (lost >> i & 1)
                    assert_int_equal(s.work[i][len / 2], 0xa5);
            refused++;
        }
    }
    assert_true(rebuilt > 0);
    assert_true(refused > 0);
    stripe_free(&s);
    ts_ec_destroy(ec);
}

static void test_code_4_2(void **state)
{
    check_code(4, 2, 4099);
}

static void test_code_8_3(void **state)
{
    check_code(8, 3, 1000);
}

static void test_code_small(void **state)
{
    check_code(1, 1, 17); /* a mirror */
    check_code(2, 1, 64);
    check_code(3, 3, 65);
}

/* The largest code: a handful of patterns (every one would be 2^40). */
static void test_code_32_8(void **state)
{
    static const uint64_t lost[] = {0xff, 0xff00000000ull, 0x1010101010ull, 0x80000001ull};
    ts_ec *ec;
    struct stripe s;

    assert_int_equal(ts_ec_create(&ec, 32, 8), 0);
    stripe_make(&s, ec, 512, 7);
    for (size_t t = 0; t < sizeof(lost) / sizeof(lost[0]); t++) {
        assert_int_equal(lose_and_decode(ec, &s, lost[t]), 0);
        for (unsigned i = 0; i < 40; i++)
            assert_memory_equal(s.work[i], s.orig[i], s.len);
    }
    assert_int_equal(lose_and_decode(ec, &s, 0x1ff), TS_EUNAVAIL);
    assert_int_equal(ts_ec_decode(ec, s.len, s.work, 1ull << 40, 0), TS_EINVAL);
    stripe_free(&s);
    ts_ec_destroy(ec);
}

/* A range inside the cells decodes from the same range of the survivors: a degraded read of a
 * small record rebuilds only its bytes. */
static void test_subrange(void **state)
{
    ts_ec *ec;
    struct stripe s;
    uint8_t *part[NMAX];
    const size_t off = 1234, len = 777;

    assert_int_equal(ts_ec_create(&ec, 4, 2), 0);
    stripe_make(&s, ec, 8192, 99);
    for (unsigned i = 0; i < 6; i++) {
        memcpy(s.work[i], s.orig[i], s.len);
        part[i] = s.work[i] + off;
    }
    memset(s.work[1], 0, s.len);
    memset(s.work[2], 0, s.len);
    assert_int_equal(ts_ec_decode(ec, len, part, 0x3f & ~0x6ull, 0x6), 0);
    assert_memory_equal(s.work[1] + off, s.orig[1] + off, len);
    assert_memory_equal(s.work[2] + off, s.orig[2] + off, len);
    assert_int_equal(s.work[1][off - 1], 0); /* only the range */
    assert_int_equal(s.work[1][off + len], 0);
    stripe_free(&s);
    ts_ec_destroy(ec);
}

/* The layout: fragment lengths, short last stripes, and every shard byte in one place. */
static void test_layout(void **state)
{
    const uint64_t C = 1 << 20;
    struct ts_ec_layout l;
    struct ts_ec_piece p[64];
    uint64_t total = 0;

    assert_int_equal(ts_ec_layout_init(&l, 4, 2, 0, 100), TS_EINVAL);
    assert_int_equal(ts_ec_layout_init(&l, 0, 2, C, 100), TS_EINVAL);
    assert_int_equal(ts_ec_layout_init(&l, 4, 2, C, 10 * C + 123), 0);
    assert_int_equal(l.stripes, 3);
    assert_int_equal(ts_ec_frag_len(&l, 0), 3 * C);
    assert_int_equal(ts_ec_frag_len(&l, 1), 3 * C);
    assert_int_equal(ts_ec_frag_len(&l, 2), 2 * C + 123);
    assert_int_equal(ts_ec_frag_len(&l, 3), 2 * C);
    assert_int_equal(ts_ec_frag_len(&l, 4), 3 * C); /* parity: as data fragment 0 */
    assert_int_equal(ts_ec_frag_len(&l, 6), 0);
    assert_int_equal(ts_ec_cell_len(&l, 2, 2), 123);
    assert_int_equal(ts_ec_cell_len(&l, 2, 3), 0);
    assert_int_equal(ts_ec_cell_len(&l, 3, 0), 0);
    for (unsigned i = 0; i < 4; i++)
        total += ts_ec_frag_len(&l, i);
    assert_int_equal(total, l.len);

    /* A range across stripes and cells. */
    assert_int_equal(ts_ec_map(&l, C - 10, 4 * C + 20, p, 64), 6);
    assert_int_equal(p[0].frag, 0);
    assert_int_equal(p[0].len, 10);
    assert_int_equal(p[0].frag_off, C - 10);
    assert_int_equal(p[4].stripe, 1);
    assert_int_equal(p[4].frag, 0);
    assert_int_equal(p[4].frag_off, C); /* stripe 1's cell 0: right after stripe 0's */
    assert_int_equal(p[5].len, 10);
    /* Clipped at the shard's end; nothing past it; a small cap still counts the pieces. */
    assert_int_equal(ts_ec_map(&l, 10 * C, 1000, p, 64), 1);
    assert_int_equal(p[0].len, 123);
    assert_int_equal(p[0].frag, 2);
    assert_int_equal(ts_ec_map(&l, 10 * C + 123, 5, p, 64), 0);
    assert_int_equal(ts_ec_map(&l, 0, l.len, p, 2), 11);
    assert_int_equal(ts_ec_layout_init(&l, 4, 2, C, 0), 0);
    assert_int_equal(ts_ec_frag_len(&l, 0), 0);
}

/* A shard cut into fragments by the layout and read back through ts_ec_map at odd ranges. */
static void test_layout_roundtrip(void **state)
{
    const uint64_t C = 1000, L = 23 * C + 457;
    struct ts_ec_layout l;
    struct ts_ec_piece p[64];
    uint8_t *shard = malloc(L), *got = malloc(L), *frag[4];
    uint64_t used[4] = {0};

    assert_int_equal(ts_ec_layout_init(&l, 4, 2, C, L), 0);
    ts_test_fill(shard, L, 5, 0);
    for (unsigned i = 0; i < 4; i++)
        frag[i] = calloc(1, ts_ec_frag_len(&l, i) + 1);
    /* Written piece by piece: each fragment is filled exactly, in order. */
    size_t n = ts_ec_map(&l, 0, L, p, 64);
    assert_true(n <= 64);
    for (size_t j = 0; j < n; j++) {
        assert_int_equal(p[j].frag_off, used[p[j].frag]);
        memcpy(frag[p[j].frag] + p[j].frag_off, shard + p[j].shard_off, p[j].len);
        used[p[j].frag] += p[j].len;
    }
    for (unsigned i = 0; i < 4; i++)
        assert_int_equal(used[i], ts_ec_frag_len(&l, i));
    for (uint64_t off = 0; off < L; off += 997) {
        uint64_t len = (off * 7919) % (5 * C) + 1;
        memset(got, 0, L);
        n = ts_ec_map(&l, off, len, p, 64);
        for (size_t j = 0; j < n; j++)
            memcpy(got + p[j].shard_off, frag[p[j].frag] + p[j].frag_off, p[j].len);
        len = TS_MIN(len, L - off);
        assert_memory_equal(got + off, shard + off, len);
    }
    for (unsigned i = 0; i < 4; i++)
        free(frag[i]);
    free(shard);
    free(got);
}

/* What the fragments cost: (K+M)/K of the data, within 2 % for shards of a few stripes. */
static void test_overhead(void **state)
{
    static const unsigned km[][2] = {{4, 2}, {8, 3}, {6, 3}};
    struct ts_ec_layout l;

    for (size_t t = 0; t < 3; t++) {
        unsigned k = km[t][0], m = km[t][1];
        uint64_t sum = 0, len = (64 << 20) + 1;
        assert_int_equal(ts_ec_layout_init(&l, k, m, 1 << 20, len), 0);
        for (unsigned i = 0; i < k + m; i++)
            sum += ts_ec_frag_len(&l, i);
        double ratio = (double)sum / (double)len, want = (double)(k + m) / k;
        assert_true(ratio >= want - 1e-9 && ratio <= want * 1.02);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_create_limits),
        cmocka_unit_test(test_code_4_2),
        cmocka_unit_test(test_code_8_3),
        cmocka_unit_test(test_code_small),
        cmocka_unit_test(test_code_32_8),
        cmocka_unit_test(test_subrange),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_layout_roundtrip),
        cmocka_unit_test(test_overhead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
