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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vector),
        cmocka_unit_test(test_against_isal),
        cmocka_unit_test(test_combine),
    };
    return cmocka_run_group_tests_name("gpu_crc", tests, NULL, NULL);
}
