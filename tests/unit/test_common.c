/* Unit tests for common/: error space, CRC32C, names, byte order, logging. */
#include "ts_test.h"

#include "ts_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_errno_table(void **state)
{
    static const int codes[] = {
#define X(name, value, msg) name,
        TS_ERRNO_TABLE(X)
#undef X
    };
    assert_string_equal(ts_strerror(0), "success");
    assert_string_equal(ts_errname(0), "TS_OK");
    for (size_t i = 0; i < TS_ARRAY_SIZE(codes); i++) {
        assert_true(codes[i] < 0);
        assert_string_not_equal(ts_strerror(codes[i]), "unknown error");
        assert_int_equal(strncmp(ts_errname(codes[i]), "TS_E", 4), 0);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(codes[i], codes[j]);
    }
    assert_string_equal(ts_errname(TS_ECORRUPT), "TS_ECORRUPT");
    assert_string_equal(ts_strerror(-9999), "unknown error");
    assert_string_equal(ts_errname(-9999), "TS_E?");
}

static void test_errno_conversion(void **state)
{
    assert_int_equal(ts_from_errno(0), 0);
    assert_int_equal(ts_from_errno(ENOSPC), TS_ENOSPC);
    assert_int_equal(ts_from_errno(ENOENT), TS_ENOENT);
    assert_int_equal(ts_from_errno(ECONNRESET), TS_ECONNRESET);
    assert_int_equal(ts_from_errno(EPIPE), TS_ECONNRESET);
    assert_int_equal(ts_from_errno(EXDEV), TS_EIO);
}

static void test_crc32c_vectors(void **state)
{
    uint8_t zeros[32] = {0}, ones[32];
    const char *digits = "123456789";

    memset(ones, 0xff, sizeof(ones));
    /* Reference values from RFC 3720 (iSCSI) appendix B.4 and the common check value. */
    assert_int_equal(ts_crc32c(0, digits, 9), 0xE3069283u);
    assert_int_equal(ts_crc32c(0, zeros, 32), 0x8A9136AAu);
    assert_int_equal(ts_crc32c(0, ones, 32), 0x62A8AB43u);
    assert_int_equal(ts_crc32c(0, NULL, 0), 0);
}

static void test_crc32c_chaining(void **state)
{
    size_t len = 1 << 20;
    uint8_t *buf = malloc(len);
    uint32_t whole, part = 0;

    assert_non_null(buf);
    ts_test_fill(buf, len, 7, 0);
    whole = ts_crc32c(0, buf, len);
    for (size_t off = 0; off < len;) {
        size_t n = TS_MIN((size_t)(off % 4093 + 1), len - off);
        part = ts_crc32c(part, buf + off, n);
        off += n;
    }
    assert_int_equal(whole, part);
    buf[len / 2] ^= 1;
    assert_int_not_equal(whole, ts_crc32c(0, buf, len));
    free(buf);
}

/* crc(A || B) from crc(A), crc(B), |B|: every split of a buffer, empty parts included, and the
 * running CRC of many parts (as a shard's from its chunks); a flipped bit still shows. */
static void test_crc32c_combine(void **state)
{
    size_t len = (1 << 20) + 4093;
    uint8_t *buf = malloc(len);
    uint32_t whole, run = 0;

    assert_non_null(buf);
    ts_test_fill(buf, len, 11, 0);
    whole = ts_crc32c(0, buf, len);
    for (size_t cut = 0; cut <= len; cut = cut ? cut * 3 + 1 : 1) {
        size_t at = TS_MIN(cut, len);
        uint32_t a = ts_crc32c(0, buf, at), b = ts_crc32c(0, buf + at, len - at);
        assert_int_equal(ts_crc32c_combine(a, b, len - at), whole);
    }
    for (size_t off = 0; off < len;) {
        size_t n = TS_MIN((size_t)65536 + off % 777, len - off);
        run = ts_crc32c_combine(run, ts_crc32c(0, buf + off, n), n);
        off += n;
    }
    assert_int_equal(run, whole);
    assert_int_equal(ts_crc32c_combine(whole, 0, 0), whole);
    {
        /* A second part of 2^29 + 6 bytes (zeros, CRC'd by streaming): past where a table of
         * 32 powers would wrap (found by a review). */
        uint64_t zl = (1ull << 29) + 6;
        uint8_t *z = calloc(1, 1 << 20);
        uint32_t cz = 0, ca = ts_crc32c(0, buf, 100), cat = ca;
        assert_non_null(z);
        for (uint64_t done = 0; done < zl;) {
            size_t n = (size_t)TS_MIN((uint64_t)1 << 20, zl - done);
            cz = ts_crc32c(cz, z, n);
            cat = ts_crc32c(cat, z, n);
            done += n;
        }
        assert_int_equal(ts_crc32c_combine(ca, cz, zl), cat);
        free(z);
    }
    buf[12345] ^= 0x10;
    assert_int_not_equal(ts_crc32c_combine(ts_crc32c(0, buf, 20000),
                                           ts_crc32c(0, buf + 20000, len - 20000), len - 20000),
                         whole);
    free(buf);
}

static void test_names(void **state)
{
    char long_name[TS_NAME_MAX + 2];

    assert_true(ts_name_valid("imagenet-1k_v2.train"));
    assert_false(ts_name_valid(""));
    assert_false(ts_name_valid(NULL));
    assert_false(ts_name_valid(".hidden"));
    assert_false(ts_name_valid("a/b"));
    assert_false(ts_name_valid("a b"));
    assert_false(ts_name_valid("caf\xc3\xa9"));
    memset(long_name, 'a', sizeof(long_name));
    long_name[TS_NAME_MAX] = '\0';
    assert_true(ts_name_valid(long_name));
    long_name[TS_NAME_MAX] = 'a';
    long_name[TS_NAME_MAX + 1] = '\0';
    assert_false(ts_name_valid(long_name));
}

/* Fragment names NAME#f (issue 33): made and split back; no user name is one. */
static void test_frag_names(void **state)
{
    char n[TS_NAME_MAX + 1], base[TS_NAME_MAX + 1], longb[TS_NAME_MAX + 1];
    unsigned f = 99;

    assert_int_equal(ts_frag_name(n, "cold.v1", 0), 0);
    assert_string_equal(n, "cold.v1#0");
    assert_int_equal(ts_frag_name(n, "cold.v1", TS_FRAG_MAX - 1), 0);
    assert_true(ts_frag_split(n, base, &f));
    assert_string_equal(base, "cold.v1");
    assert_int_equal(f, TS_FRAG_MAX - 1);
    assert_false(ts_name_valid(n));
    assert_true(ts_name_valid_store(n));
    assert_true(ts_name_valid_store("cold.v1"));
    assert_int_equal(ts_frag_name(n, "cold", TS_FRAG_MAX), TS_ENAME);
    assert_int_equal(ts_frag_name(n, ".x", 1), TS_ENAME);
    /* The whole must fit TS_NAME_MAX: a 126-byte name has fragments #0..#9 only. */
    memset(longb, 'a', TS_NAME_MAX - 2);
    longb[TS_NAME_MAX - 2] = '\0';
    assert_int_equal(ts_frag_name(n, longb, 9), 0);
    assert_int_equal(strlen(n), TS_NAME_MAX);
    assert_int_equal(ts_frag_name(n, longb, 10), TS_ENAME);
    assert_false(ts_frag_split("cold", NULL, NULL));
    assert_false(ts_frag_split("cold#", NULL, NULL));
    assert_false(ts_frag_split("cold#07", NULL, NULL));
    assert_false(ts_frag_split("cold#40", NULL, NULL));
    assert_false(ts_frag_split("#1", NULL, NULL));
    assert_false(ts_frag_split("a#1#2", NULL, NULL));
    assert_false(ts_frag_split(".a#1", NULL, NULL));
    assert_false(ts_frag_split(NULL, NULL, NULL));
}

static void test_byte_order(void **state)
{
    uint8_t b[8];

    ts_put_be32(b, 0x01020304u);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[3], 4);
    assert_int_equal(ts_get_be32(b), 0x01020304u);
    ts_put_be64(b, 0x0102030405060708ull);
    assert_int_equal(b[7], 8);
    assert_true(ts_get_be64(b) == 0x0102030405060708ull);
    ts_put_le64(b, 0x0102030405060708ull);
    assert_int_equal(b[0], 8);
    assert_true(ts_get_le64(b) == 0x0102030405060708ull);
}

static int lines_seen, args_evaluated;
static char last_line[256];

static void capture(void *arg, int level, const char *fac, int rc, const char *msg)
{
    lines_seen++;
    snprintf(last_line, sizeof(last_line), "%s|%s|%d", fac, msg, rc);
}

static int count_eval(void)
{
    return ++args_evaluated;
}

static void test_logging(void **state)
{
    ts_log_set(capture, NULL, TS_LOG_WARN);
    TS_DEBUG("test", "debug %d", count_eval());
    TS_INFO("test", "info %d", count_eval());
    assert_int_equal(args_evaluated, 0); /* level checked before the arguments */
    assert_int_equal(lines_seen, 0);
    TS_ERROR("test", TS_ECORRUPT, "bad chunk %d", 3);
    assert_int_equal(lines_seen, 1);
    assert_string_equal(last_line, "test|bad chunk 3|-6");
    ts_log_set(NULL, NULL, TS_LOG_DEBUG);
    TS_ERROR("test", 0, "dropped %d", count_eval());
    assert_int_equal(args_evaluated, 0);
    assert_int_equal(lines_seen, 1);
    assert_int_equal(ts_log_level_parse("debug"), TS_LOG_DEBUG);
    assert_int_equal(ts_log_level_parse("WARN"), TS_LOG_WARN);
    assert_int_equal(ts_log_level_parse("loud"), TS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errno_table),    cmocka_unit_test(test_errno_conversion),
        cmocka_unit_test(test_crc32c_vectors), cmocka_unit_test(test_crc32c_chaining),
        cmocka_unit_test(test_crc32c_combine), cmocka_unit_test(test_names),
        cmocka_unit_test(test_frag_names),     cmocka_unit_test(test_byte_order),
        cmocka_unit_test(test_logging),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
