/* The CRC32C routine that the GPU check runs per thread (client/gpu/crc32c_dev.h), compiled
 * for the host and checked against ISA-L (ts_crc32c) on random and edge-case inputs, and its
 * combine of split pieces against the CRC of the whole. */
#include "ts_test.h"

#include "gpu/crc32c_dev.h"
#include "ts_common.h"

#include <stdlib.h>
#include <string.h>

static uint8_t buf[70000 + 64];

static void fill_random(uint64_t seed)
{
    for (size_t i = 0; i < sizeof(buf); i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (uint8_t)(seed >> 56);
    }
}

static void test_known_vector(void **state)
{
    assert_int_equal(ts_crc32c_dev(0, (const uint8_t *)"123456789", 9), 0xE3069283u);
    assert_int_equal(ts_crc32c_dev(0, (const uint8_t *)"", 0), 0);
}

static void test_against_isal(void **state)
{
    static const size_t lens[] = {0,    1,    3,    7,    8,     63,    64,   65,
                                  4095, 4096, 4097, 9999, 65536, 65537, 70000};
    for (uint64_t seed = 1; seed <= 3; seed++) {
        fill_random(seed);
        for (size_t i = 0; i < TS_ARRAY_SIZE(lens); i++)
            for (size_t start = 0; start < 8; start += 3) /* unaligned starts too */
                assert_int_equal(ts_crc32c_dev(0, buf + start, lens[i]),
                                 ts_crc32c(0, buf + start, lens[i]));
    }
    memset(buf, 0, sizeof(buf));
    assert_int_equal(ts_crc32c_dev(0, buf, 4096), ts_crc32c(0, buf, 4096));
    memset(buf, 0xFF, sizeof(buf));
    assert_int_equal(ts_crc32c_dev(0, buf, 70000), ts_crc32c(0, buf, 70000));
    /* Continuing a CRC, as ISA-L does. */
    fill_random(9);
    assert_int_equal(ts_crc32c_dev(ts_crc32c(0, buf, 100), buf + 100, 900),
                     ts_crc32c(0, buf, 1000));
}

static void test_combine(void **state)
{
    fill_random(5);
    for (size_t len = 1; len <= 70000; len = len * 3 + 1) {
        uint32_t whole = ts_crc32c(0, buf, len);
        for (size_t cut = 0; cut <= len; cut += len / 5 + 1) {
            uint32_t a = ts_crc32c_dev(0, buf, cut), b = ts_crc32c_dev(0, buf + cut, len - cut);
            assert_int_equal(ts_crc32c_dev_combine(a, b, len - cut), whole);
        }
    }
    /* Many pieces of 4 KiB, joined in order: how the GPU check joins its threads' CRCs. */
    {
        uint32_t acc = 0;
        for (size_t off = 0; off < 70000; off += 4096) {
            size_t n = off + 4096 <= 70000 ? 4096 : 70000 - off;
            acc = ts_crc32c_dev_combine(acc, ts_crc32c_dev(0, buf + off, n), n);
        }
        assert_int_equal(acc, ts_crc32c(0, buf, 70000));
    }
}

/* The sliced routine (8 bytes a step through tables, as the GPU kernel runs it) against ISA-L,
 * from every alignment, so the byte-wise head and tail are covered. */
static void test_sliced(void **state)
{
    static uint32_t t[8][256];
    static const size_t lens[] = {0, 1, 3, 7, 8, 9, 15, 16, 63, 1023, 1024, 1025, 4096, 70000};

    for (uint32_t i = 0; i < 256; i++)
        t[0][i] = ts_crc32c_dev_entry(i);
    for (uint32_t i = 0; i < 256; i++)
        ts_crc32c_dev_slices(t, i);
    fill_random(13);
    for (size_t i = 0; i < TS_ARRAY_SIZE(lens); i++)
        for (size_t start = 0; start < 8 && start + lens[i] <= sizeof(buf); start++)
            assert_int_equal(
                ts_crc32c_dev_sliced(0, buf + start, lens[i], (const uint32_t(*)[256])t),
                ts_crc32c(0, buf + start, lens[i]));
    assert_int_equal(
        ts_crc32c_dev_sliced(0, (const uint8_t *)"123456789", 9, (const uint32_t(*)[256])t),
        0xE3069283u);
}

/* ts_crc32c_dev_join: a piece's CRC from its blocks' CRCs, as the GPU check's second kernel
 * computes it, for pieces of whole blocks, a short last block, one short block, and none. */
static void test_join(void **state)
{
    static const size_t lens[] = {0, 1, 4095, 4096, 4097, 8192, 12289, 65536, 70000};
    uint32_t crcs[70000 / 1024 + 1], op1k[32], op4k[32];

    ts_crc32c_dev_zeros_op(op1k, 1024);
    ts_crc32c_dev_zeros_op(op4k, 4096);
    fill_random(11);
    for (size_t i = 0; i < TS_ARRAY_SIZE(lens); i++)
        for (uint32_t block = 1024; block <= 4096; block *= 4) {
            size_t nb = (lens[i] + block - 1) / block;
            for (size_t j = 0; j < nb; j++)
                crcs[j] = ts_crc32c(0, buf + j * block, TS_MIN((size_t)block, lens[i] - j * block));
            assert_int_equal(
                ts_crc32c_dev_join(crcs, 1, lens[i], block, block == 1024 ? op1k : op4k),
                ts_crc32c(0, buf, lens[i]));
        }
    /* In two levels, as the join kernel runs: blocks of 256 bytes joined into segments of 8
     * (each segment's CRC left in its first slot), then the segments joined with a stride. */
    {
        static uint32_t b[70000 / 256 + 1];
        uint32_t op256[32], op2k[32];
        ts_crc32c_dev_zeros_op(op256, 256);
        ts_crc32c_dev_zeros_op(op2k, 8 * 256);
        for (size_t len = 1; len <= 70000; len = len * 5 + 3) {
            size_t nb = (len + 255) / 256, nseg = (len + 2047) / 2048;
            for (size_t j = 0; j < nb; j++)
                b[j] = ts_crc32c(0, buf + j * 256, TS_MIN((size_t)256, len - j * 256));
            for (size_t g = 0; g < nseg; g++)
                b[g * 8] = ts_crc32c_dev_join(b + g * 8, 1, TS_MIN((size_t)2048, len - g * 2048),
                                              256, op256);
            assert_int_equal(ts_crc32c_dev_join(b, 8, len, 2048, op2k), ts_crc32c(0, buf, len));
        }
    }
    /* A changed block changes the piece's CRC. */
    for (size_t j = 0; j * 1024 < 70000; j++)
        crcs[j] = ts_crc32c(0, buf + j * 1024, TS_MIN((size_t)1024, 70000 - j * 1024));
    assert_int_equal(ts_crc32c_dev_join(crcs, 1, 70000, 1024, op1k), ts_crc32c(0, buf, 70000));
    crcs[5] ^= 1;
    assert_int_not_equal(ts_crc32c_dev_join(crcs, 1, 70000, 1024, op1k), ts_crc32c(0, buf, 70000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vector), cmocka_unit_test(test_against_isal),
        cmocka_unit_test(test_combine),      cmocka_unit_test(test_sliced),
        cmocka_unit_test(test_join),
    };
    return cmocka_run_group_tests_name("gpu_crc", tests, NULL, NULL);
}
