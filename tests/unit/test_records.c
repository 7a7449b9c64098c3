/*
 * The record scanner (client/records.c) on real formats, fed in pieces of every size: TFRecord
 * with its CRCs, WebDataset tar shards (our own tar writer and GNU tar's, long names through pax
 * headers), JSON lines and length-prefixed records; and malformed input of each kind refused
 * with the offset, record number and reason.
 */
#include "ts_test.h"

#include "tessera/errno.h"
#include "tessera/records.h"

#include "ts_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct offs {
    uint64_t v[256];
    size_t n;
    uint64_t end; /* tessera_recscan_data_end */
};

static int collect(void *arg, uint64_t off)
{
    struct offs *o = arg;
    if (o->n < 256)
        o->v[o->n++] = off;
    return 0;
}

/* Scans buf in pieces of `piece` bytes (0: at once); the result of the whole scan. */
static int scan(int fmt, const uint8_t *buf, size_t len, size_t piece, struct offs *o, char *why,
                size_t cap, uint64_t *err_off)
{
    tessera_recscan *s;
    int rc = 0;

    memset(o, 0, sizeof(*o));
    assert_int_equal(tessera_recscan_new(&s, fmt), 0);
    for (size_t at = 0; at < len && !rc;) {
        size_t n = piece ? TS_MIN(piece, len - at) : len;
        rc = tessera_recscan_feed(s, buf + at, n, collect, o);
        at += n;
    }
    if (!rc)
        rc = tessera_recscan_end(s, collect, o);
    o->end = tessera_recscan_data_end(s);
    if (rc && why) {
        const char *w = tessera_recscan_error(s, err_off, NULL);
        snprintf(why, cap, "%s", w ? w : "");
    }
    tessera_recscan_free(s);
    return rc;
}

static uint32_t tf_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static size_t tf_record(uint8_t *out, const void *data, uint64_t len)
{
    ts_put_le64(out, len);
    ts_put_le32(out + 8, tf_mask(ts_crc32c(0, out, 8)));
    memcpy(out + 12, data, len);
    ts_put_le32(out + 12 + len, tf_mask(ts_crc32c(0, data, len)));
    return 16 + len;
}

static void test_tfrecord(void **state)
{
    uint8_t buf[4096], data[1000];
    size_t len = 0, starts[3];
    const size_t sizes[] = {0, 17, 1000};
    struct offs o;
    char why[256];
    uint64_t at;

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 3; i++) {
        starts[i] = len;
        len += tf_record(buf + len, data, sizes[i]);
    }
    for (size_t piece = 0; piece <= 13; piece++) {
        assert_int_equal(scan(TESSERA_FMT_TFRECORD, buf, len, piece, &o, NULL, 0, NULL), 0);
        assert_int_equal(o.n, 3);
        for (int i = 0; i < 3; i++)
            assert_true(o.v[i] == starts[i]);
    }
    /* A flipped data byte of record 2: refused, naming it. */
    buf[starts[2] + 12 + 500] ^= 1;
    assert_int_equal(scan(TESSERA_FMT_TFRECORD, buf, len, 7, &o, why, sizeof(why), &at), TS_EPROTO);
    fprintf(stderr, "  %s\n", why);
    assert_true(at == starts[2]);
    assert_non_null(strstr(why, "TFRecord 2"));
    buf[starts[2] + 12 + 500] ^= 1;
    /* A damaged length. */
    buf[starts[1]] ^= 4;
    assert_int_equal(scan(TESSERA_FMT_TFRECORD, buf, len, 0, &o, why, sizeof(why), &at), TS_EPROTO);
    assert_true(at == starts[1]);
    assert_non_null(strstr(why, "length"));
    buf[starts[1]] ^= 4;
    /* Truncated inside the last record. */
    assert_int_equal(scan(TESSERA_FMT_TFRECORD, buf, len - 3, 5, &o, why, sizeof(why), &at),
                     TS_EPROTO);
    assert_non_null(strstr(why, "truncated"));
    /* Not a TFRecord file at all. */
    assert_int_equal(scan(TESSERA_FMT_TFRECORD, (const uint8_t *)"{\"a\": 1}\n{\"b\": 2}\n", 18, 0,
                          &o, why, sizeof(why), &at),
                     TS_EPROTO);
}

/* A ustar member: header + data padded to 512. Returns bytes written. */
static size_t tar_member(uint8_t *out, const char *name, const void *data, size_t len)
{
    unsigned sum = 0;
    memset(out, 0, 512);
    snprintf((char *)out, 100, "%s", name);
    snprintf((char *)out + 100, 8, "0000644");
    snprintf((char *)out + 108, 8, "0000000");
    snprintf((char *)out + 116, 8, "0000000");
    snprintf((char *)out + 124, 12, "%011zo", len);
    snprintf((char *)out + 136, 12, "%011o", 0);
    memset(out + 148, ' ', 8);
    out[156] = '0';
    memcpy(out + 257, "ustar", 6);
    memcpy(out + 263, "00", 2);
    for (int i = 0; i < 512; i++)
        sum += out[i];
    snprintf((char *)out + 148, 8, "%06o", sum);
    memcpy(out + 512, data, len);
    memset(out + 512 + len, 0, (512 - len % 512) % 512);
    return 512 + (len + 511) / 512 * 512;
}

static void test_webdataset_tar(void **state)
{
    static uint8_t buf[64 << 10];
    const char *names[] = {"train/000.jpg", "train/000.cls",  "train/001.jpg",
                           "train/001.cls", "train/001.json", "train/002.jpg"};
    static uint8_t payload[2000];
    size_t len = 0, starts[3] = {0}, k = 0;
    struct offs o;
    char why[256], prev[64] = "";
    uint64_t at;

    memset(payload, 'p', sizeof(payload));
    for (int i = 0; i < 6; i++) {
        char key[64];
        snprintf(key, sizeof(key), "%.9s", names[i]);
        if (strcmp(key, prev))
            starts[k++] = len;
        snprintf(prev, sizeof(prev), "%s", key);
        len += tar_member(buf + len, names[i], payload, 13 + (size_t)i * 300);
    }
    memset(buf + len, 0, 10240); /* end of archive, padded to a 10 KiB record as tar does */
    len += 10240;
    for (size_t piece = 0; piece <= 700; piece += 233) {
        assert_int_equal(scan(TESSERA_FMT_TAR, buf, len, piece, &o, NULL, 0, NULL), 0);
        assert_int_equal(o.n, 3);          /* samples 000, 001, 002 */
        assert_true(o.end == len - 10240); /* the records end where the end of archive begins */
        for (int i = 0; i < 3; i++)
            assert_true(o.v[i] == starts[i]);
    }
    /* A damaged header. */
    buf[starts[1] + 10] ^= 0x20;
    assert_int_equal(scan(TESSERA_FMT_TAR, buf, len, 100, &o, why, sizeof(why), &at), TS_EPROTO);
    fprintf(stderr, "  %s\n", why);
    assert_true(at == starts[1]);
    assert_non_null(strstr(why, "checksum"));
    buf[starts[1] + 10] ^= 0x20;
    /* Cut inside a member. */
    assert_int_equal(scan(TESSERA_FMT_TAR, buf, starts[2] + 600, 0, &o, why, sizeof(why), &at),
                     TS_EPROTO);
    assert_non_null(strstr(why, "truncated"));
}

/*
 * GNU tar's own output, long names included (pax headers): samples found by key. GNU tar is
 * required (Debian's tar is essential): a tar that fails or says anything fails the test.
 */
static void test_gnu_tar(void **state)
{
    char *dir = ts_test_tmpdir("rec"), cmd[1024], path[1200], said[1024] = "";
    static uint8_t buf[256 << 10];
    size_t len;
    struct offs o;
    FILE *f;
    int st;
    const char *longdir = "a-directory-name-that-is-long-enough-to-need-a-pax-header-because-"
                          "ustar-names-stop-at-one-hundred-bytes";

    assert_non_null(dir);
    snprintf(cmd, sizeof(cmd),
             "cd %s && mkdir -p %s && for k in s1 s2 s3; do echo img-$k > %s/$k.jpg; "
             "echo $k > %s/$k.cls; done && tar --format=pax --sort=name -cf out.tar %s 2>&1",
             dir, longdir, longdir, longdir, longdir);
    f = popen(cmd, "r");
    assert_non_null(f);
    len = fread(said, 1, sizeof(said) - 1, f);
    said[len] = '\0';
    st = pclose(f);
    if (st != 0 || len != 0) {
        ts_test_rmtree(dir);
        fail_msg("tar --format=pax --sort=name -cf out.tar failed (wait status %d): %s", st, said);
    }
    snprintf(path, sizeof(path), "%s/out.tar", dir);
    f = fopen(path, "rb");
    assert_non_null(f);
    len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_true(len > 0 && len < sizeof(buf));
    assert_int_equal(scan(TESSERA_FMT_TAR, buf, len, 0, &o, NULL, 0, NULL), 0);
    assert_int_equal(o.n, 3); /* s1, s2, s3 (the directory entry is no sample) */
    ts_test_rmtree(dir);
}

static void test_jsonl_and_lengths(void **state)
{
    const char *j = "{\"a\":1}\n\n{\"b\":2}\n[3]";
    uint8_t buf[256], zero[] = "{\"a\":1}\n{\"b\0\":2}\n";
    size_t len = 0;
    struct offs o;
    char why[256];
    uint64_t at;

    for (size_t piece = 0; piece < 5; piece++) {
        assert_int_equal(
            scan(TESSERA_FMT_JSONL, (const uint8_t *)j, strlen(j), piece, &o, NULL, 0, NULL), 0);
        assert_int_equal(o.n, 3);
        assert_true(o.v[0] == 0 && o.v[1] == 9 && o.v[2] == 17);
        assert_true(o.end == strlen(j)); /* the last line has no newline */
    }
    assert_int_equal(scan(TESSERA_FMT_JSONL, (const uint8_t *)"{}\n\n\n", 5, 0, &o, NULL, 0, NULL),
                     0);
    assert_true(o.n == 1 && o.end == 3); /* blank lines after the last record are not its own */
    assert_int_equal(scan(TESSERA_FMT_JSONL, zero, sizeof(zero) - 1, 0, &o, why, sizeof(why), &at),
                     TS_EPROTO);
    assert_true(at == 8); /* the line holding the NUL */
    assert_non_null(strstr(why, "offset 11"));

    for (uint32_t i = 0; i < 4; i++) {
        ts_put_le32(buf + len, i * 10);
        memset(buf + len + 4, 'x', i * 10);
        len += 4 + i * 10;
    }
    assert_int_equal(scan(TESSERA_FMT_LEN32, buf, len, 3, &o, NULL, 0, NULL), 0);
    assert_int_equal(o.n, 4);
    assert_true(o.v[3] == 4 + 14 + 24);
    assert_int_equal(scan(TESSERA_FMT_LEN32, buf, len - 1, 3, &o, why, sizeof(why), &at),
                     TS_EPROTO);
    assert_true(at == 4 + 14 + 24);
    assert_int_equal(tessera_record_format_parse("webdataset"), TESSERA_FMT_TAR);
    assert_int_equal(tessera_record_format_parse("TFRecord"), TESSERA_FMT_TFRECORD);
    assert_int_equal(tessera_record_format_parse("csv"), TS_EINVAL);
}

/* tessera_record_payload: each format's payload span, and TS_EPROTO for bytes that are not one
 * framed record of the format. */
static void test_payloads(void **state)
{
    static uint8_t tar[4096];
    uint8_t tf[40] = {0}, l32[7] = {3, 0, 0, 0, 'a', 'b', 'c'};
    const char *line = "{\"a\": 1}\n\n";
    size_t off, n, len;

    (void)state;
    ts_put_le64(tf, 24);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_TFRECORD, tf, 40, &off, &n), 0);
    assert_true(off == 12 && n == 24);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_TFRECORD, tf, 39, &off, &n), TS_EPROTO);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_LEN32, l32, 7, &off, &n), 0);
    assert_true(off == 4 && n == 3);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_LEN32, l32, 6, &off, &n), TS_EPROTO);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_JSONL, line, strlen(line), &off, &n), 0);
    assert_true(off == 0 && n == 8);
    len = tar_member(tar, "k/001.txt", "hello", 5);
    len += tar_member(tar + len, "k/001.cls", "7", 1);
    assert_int_equal(tessera_record_payload(TESSERA_FMT_TAR, tar, len + 1024, &off, &n), 0);
    assert_true(off == 0 && n == len); /* the end-of-archive blocks are not the sample's */
    assert_int_equal(tessera_record_payload(TESSERA_FMT_TAR, tar, len - 1, &off, &n), TS_EPROTO);
    assert_int_equal(tessera_record_payload(0, tar, 9, &off, &n), 0);
    assert_true(off == 0 && n == 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tfrecord), cmocka_unit_test(test_webdataset_tar),
        cmocka_unit_test(test_gnu_tar),  cmocka_unit_test(test_jsonl_and_lengths),
        cmocka_unit_test(test_payloads),
    };
    return cmocka_run_group_tests_name("records", tests, NULL, NULL);
}
