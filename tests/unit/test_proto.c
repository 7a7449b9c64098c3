/* Unit tests for the wire codec (common/proto.c): frame header, payload reader/writer, info
 * bodies, the opcode table and roles. */
#include "ts_test.h"

#include "ts_proto.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A header whose every field differs from its neighbours' bytes, to catch offset mix-ups. */
static const struct ts_frame_hdr sample_hdr = {
    .version = TS_PROTO_VERSION,
    .opcode = TS_OP_SHARD_WRITE,
    .flags = TS_F_REPLY,
    .req_id = 0x0102030405060708ull,
    .epoch = 0x1112131415161718ull,
    .length = 0x00abcdefu,
};

/* Recomputes the header CRC after a test changed bytes 0..27. */
static void fix_crc(uint8_t *b)
{
    ts_put_le32(b + 28, ts_crc32c(0, b, 28));
}

static void test_header_round_trip(void **state)
{
    static const struct ts_frame_hdr hdrs[] = {
        {TS_PROTO_VERSION, TS_OP_HELLO, 0, 0, 0, 0},
        {TS_PROTO_VERSION, TS_OP_READ, 0, 1, 7, 12345},
        {TS_PROTO_VERSION, TS_OP_STATUS, TS_F_REPLY, UINT64_MAX, UINT64_MAX, UINT32_MAX},
        {TS_PROTO_VERSION, 0, 0, 42, 0, 0},   /* opcode 0: parsing does not judge opcodes */
        {TS_PROTO_VERSION, 255, 0, 42, 0, 0}, /* ... that is the dispatcher's job */
    };
    uint8_t b[TS_HDR_LEN + 8], again[TS_HDR_LEN];
    struct ts_frame_hdr h;

    for (size_t i = 0; i < TS_ARRAY_SIZE(hdrs); i++) {
        memset(&h, 0xa5, sizeof(h));
        ts_frame_encode(b, &hdrs[i]);
        assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_HDR_LEN);
        assert_int_equal(h.version, TS_PROTO_VERSION);
        assert_int_equal(h.opcode, hdrs[i].opcode);
        assert_int_equal(h.flags, hdrs[i].flags);
        assert_true(h.req_id == hdrs[i].req_id);
        assert_true(h.epoch == hdrs[i].epoch);
        assert_int_equal(h.length, hdrs[i].length);
        ts_frame_encode(again, &h);
        assert_memory_equal(b, again, TS_HDR_LEN);
    }

    /* The exact layout of docs/protocol.md. */
    ts_frame_encode(b, &sample_hdr);
    assert_memory_equal(b, "TSRA", 4);
    assert_int_equal(ts_get_le32(b), TS_MAGIC);
    assert_int_equal(b[4], TS_PROTO_VERSION);
    assert_int_equal(b[5], TS_OP_SHARD_WRITE);
    assert_int_equal(ts_get_le16(b + 6), TS_F_REPLY);
    assert_int_equal(b[8], 0x08); /* little-endian */
    assert_true(ts_get_le64(b + 8) == sample_hdr.req_id);
    assert_true(ts_get_le64(b + 16) == sample_hdr.epoch);
    assert_int_equal(ts_get_le32(b + 24), sample_hdr.length);
    assert_int_equal(ts_get_le32(b + 28), ts_crc32c(0, b, 28));

    /* Bytes after the header (the payload) are not looked at. */
    memset(b + TS_HDR_LEN, 0xff, 8);
    assert_int_equal(ts_frame_parse(b, sizeof(b), UINT32_MAX, &h), TS_HDR_LEN);

    /* An unset version is written as the current one. */
    h = sample_hdr;
    h.version = 0;
    ts_frame_encode(again, &h);
    assert_memory_equal(b, again, TS_HDR_LEN);
}

static void test_header_truncated(void **state)
{
    uint8_t b[TS_HDR_LEN];
    struct ts_frame_hdr h;

    ts_frame_encode(b, &sample_hdr);
    for (size_t n = 0; n < TS_HDR_LEN; n++) {
        /* An exact-size copy, so a sanitizer build sees any read past the prefix. */
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, b, n);
        assert_int_equal(ts_frame_parse(p, n, UINT32_MAX, &h), 0);
        free(p);
    }
    assert_int_equal(ts_frame_parse(NULL, 0, UINT32_MAX, &h), 0);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_HDR_LEN);
}

static void test_header_bad_magic(void **state)
{
    uint8_t b[TS_HDR_LEN];
    struct ts_frame_hdr h;

    /* Detected from the first byte that differs, before a whole header arrived. */
    for (size_t i = 0; i < 4; i++) {
        ts_frame_encode(b, &sample_hdr);
        b[i] ^= 0x20;                   /* "tSRA", "TsRA", ... */
        for (size_t n = 0; n <= i; n++) /* the bytes so far are right: need more */
            assert_int_equal(ts_frame_parse(b, n, UINT32_MAX, &h), 0);
        for (size_t n = i + 1; n <= TS_HDR_LEN; n++)
            assert_int_equal(ts_frame_parse(b, n, UINT32_MAX, &h), TS_EPROTO);
        /* Also when the CRC was computed over the bad magic. */
        fix_crc(b);
        assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
    }
    b[0] = 'G'; /* "GET / HTTP/1.1" */
    assert_int_equal(ts_frame_parse(b, 1, UINT32_MAX, &h), TS_EPROTO);
    b[0] = 0x16; /* a TLS ClientHello on a plain port */
    assert_int_equal(ts_frame_parse(b, 1, UINT32_MAX, &h), TS_EPROTO);
    /* Byte-swapped magic (a big-endian writer). */
    ts_put_be32(b, TS_MAGIC);
    assert_int_equal(ts_frame_parse(b, 1, UINT32_MAX, &h), TS_EPROTO);
}

static void test_header_bad_crc(void **state)
{
    uint8_t b[TS_HDR_LEN];
    struct ts_frame_hdr h;

    /* Every single-bit error after the magic is caught by the CRC (or is the CRC). */
    for (size_t bit = 32; bit < TS_HDR_LEN * 8; bit++) {
        ts_frame_encode(b, &sample_hdr);
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
    }
    /* A length changed in flight must not be trusted, even when it is within the limit. */
    ts_frame_encode(b, &sample_hdr);
    ts_put_le32(b + 24, 16);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
    /* The CRC is checked before the length: a corrupt header is EPROTO, not ETOOBIG. */
    ts_put_le32(b + 24, UINT32_MAX);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, 0, &h), TS_EPROTO);
}

static void test_header_bad_version(void **state)
{
    static const uint8_t versions[] = {0, 2, 0x80, 0xff};
    uint8_t b[TS_HDR_LEN];
    struct ts_frame_hdr h;

    for (size_t i = 0; i < TS_ARRAY_SIZE(versions); i++) {
        ts_frame_encode(b, &sample_hdr);
        b[4] = versions[i];
        fix_crc(b);
        assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
        /* The version is checked before the length. */
        assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, 0, &h), TS_EPROTO);
    }
}

static void test_header_reserved_flags(void **state)
{
    struct ts_frame_hdr in = sample_hdr, h;
    uint8_t b[TS_HDR_LEN];

    for (unsigned bit = 0; bit < 16; bit++) {
        in.flags = (uint16_t)(1u << bit);
        ts_frame_encode(b, &in);
        if (in.flags & TS_F_KNOWN) {
            assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_HDR_LEN);
            assert_int_equal(h.flags, in.flags);
        } else {
            assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
            assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, 0, &h), TS_EPROTO);
        }
    }
    in.flags = TS_F_REPLY | 0x8000;
    ts_frame_encode(b, &in);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_EPROTO);
}

static void test_header_length_limit(void **state)
{
    struct ts_frame_hdr in = sample_hdr, h;
    uint8_t b[TS_HDR_LEN];

    in.length = TS_SMALL_PAYLOAD;
    ts_frame_encode(b, &in);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, TS_SMALL_PAYLOAD, &h), TS_HDR_LEN);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, TS_SMALL_PAYLOAD - 1, &h), TS_ETOOBIG);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, 0, &h), TS_ETOOBIG);
    /* Still "need more" while the header is incomplete, whatever the limit. */
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN - 1, 0, &h), 0);

    in.length = 0;
    ts_frame_encode(b, &in);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, 0, &h), TS_HDR_LEN);

    in.length = UINT32_MAX;
    ts_frame_encode(b, &in);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, TS_MAX_CHUNK + 4096, &h), TS_ETOOBIG);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, UINT32_MAX, &h), TS_HDR_LEN);
    assert_int_equal(ts_frame_parse(b, TS_HDR_LEN, SIZE_MAX, &h), TS_HDR_LEN);
}

static void test_writer_frame(void **state)
{
    struct ts_wr w;
    struct ts_frame_hdr h;
    struct ts_rd r;

    ts_wr_init(&w);
    ts_wr_begin_frame(&w);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, "unit-test");
    ts_wr_frame(&w, TS_OP_HELLO, 0, 99, 5);
    assert_int_equal(w.err, 0);
    assert_int_equal(w.len, TS_HDR_LEN + 2 + 2 + 9);
    assert_int_equal(ts_frame_parse(w.buf, w.len, TS_SMALL_PAYLOAD, &h), TS_HDR_LEN);
    assert_int_equal(h.opcode, TS_OP_HELLO);
    assert_int_equal(h.length, 13);
    assert_true(h.req_id == 99 && h.epoch == 5);

    ts_rd_init(&r, w.buf + TS_HDR_LEN, h.length);
    assert_int_equal(ts_rd_u16(&r), TS_PROTO_VERSION);
    {
        char name[16];
        ts_rd_str(&r, name, sizeof(name));
        assert_string_equal(name, "unit-test");
    }
    assert_int_equal(ts_rd_done(&r), 0);

    /* begin_frame starts over on a used writer. */
    ts_wr_begin_frame(&w);
    ts_wr_frame(&w, TS_OP_STATUS, 0, 1, 0);
    assert_int_equal(w.len, TS_HDR_LEN);
    assert_int_equal(ts_frame_parse(w.buf, w.len, 0, &h), TS_HDR_LEN);
    assert_int_equal(h.length, 0);

    /* Strings: NULL is empty; longer than a u16 is cut at 65535. */
    w.len = 0;
    ts_wr_str(&w, NULL);
    assert_int_equal(w.len, 2);
    assert_int_equal(ts_get_le16(w.buf), 0);
    {
        char *big = malloc(70000);
        assert_non_null(big);
        memset(big, 'x', 69999);
        big[69999] = '\0';
        w.len = 0;
        ts_wr_str(&w, big);
        assert_int_equal(w.len, 2 + UINT16_MAX);
        assert_int_equal(ts_get_le16(w.buf), UINT16_MAX);
        free(big);
    }
    ts_wr_fini(&w);
    assert_null(w.buf);
    ts_wr_fini(&w); /* twice is harmless */
}

static void test_writer_overflow(void **state)
{
    static const uint8_t src[1];
    static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 8, SIZE_MAX / 2, SIZE_MAX / 2 + 1};

    /* Sizes that would wrap the capacity fail with TS_ENOMEM (sticky) and write nothing. */
    for (size_t i = 0; i < TS_ARRAY_SIZE(huge); i++) {
        struct ts_wr w;

        ts_wr_init(&w);
        ts_wr_u32(&w, 1);
        ts_wr_bytes(&w, src, huge[i]);
        assert_int_equal(w.err, TS_ENOMEM);
        assert_int_equal(w.len, 4);
        ts_wr_u8(&w, 1);
        assert_int_equal(w.len, 4);
        ts_wr_fini(&w);
    }
}

static void test_reader_values(void **state)
{
    uint8_t b[32];
    struct ts_wr w;
    struct ts_rd r;

    ts_wr_init(&w);
    ts_wr_u8(&w, 0xfe);
    ts_wr_u16(&w, 0xbeef);
    ts_wr_u32(&w, 0xdeadbeefu);
    ts_wr_u64(&w, 0x0123456789abcdefull);
    ts_wr_bytes(&w, "xyz", 3);
    assert_int_equal(w.err, 0);
    assert_int_equal(w.len, 18);
    memcpy(b, w.buf, w.len);
    assert_int_equal(b[1], 0xef); /* little-endian on the wire */

    ts_rd_init(&r, b, w.len);
    assert_int_equal(ts_rd_u8(&r), 0xfe);
    assert_int_equal(ts_rd_u16(&r), 0xbeef);
    assert_int_equal(ts_rd_u32(&r), 0xdeadbeefu);
    assert_true(ts_rd_u64(&r) == 0x0123456789abcdefull);
    assert_memory_equal(ts_rd_bytes(&r, 3), "xyz", 3);
    assert_int_equal(r.off, 18);
    assert_int_equal(ts_rd_done(&r), 0);
    /* Zero bytes at the end are fine and leave nothing over. */
    assert_non_null(ts_rd_bytes(&r, 0));
    assert_int_equal(ts_rd_done(&r), 0);
    ts_wr_fini(&w);
}

static void test_reader_bounds(void **state)
{
    /* Reads of every width from an exact-size buffer of every short length. */
    for (size_t len = 0; len < 8; len++) {
        for (int width = 1; width <= 8; width *= 2) {
            uint8_t *p = malloc(len ? len : 1);
            struct ts_rd r;
            uint64_t v = 1;

            assert_non_null(p);
            memset(p, 0xff, len ? len : 1);
            ts_rd_init(&r, p, len);
            switch (width) {
            case 1:
                v = ts_rd_u8(&r);
                break;
            case 2:
                v = ts_rd_u16(&r);
                break;
            case 4:
                v = ts_rd_u32(&r);
                break;
            case 8:
                v = ts_rd_u64(&r);
                break;
            }
            if (len < (size_t)width) {
                assert_int_equal(r.err, TS_EPROTO);
                assert_true(v == 0);
                assert_int_equal(r.off, 0);
            } else {
                assert_int_equal(r.err, 0);
                assert_int_equal(r.off, width);
            }
            assert_true(r.off <= r.len);
            free(p);
        }
    }
}

static void test_reader_sticky_error(void **state)
{
    const uint8_t b[6] = {1, 2, 3, 4, 5, 6};
    struct ts_rd r;

    ts_rd_init(&r, b, sizeof(b));
    assert_int_equal(ts_rd_u32(&r), 0x04030201u);
    assert_true(ts_rd_u64(&r) == 0); /* 2 left: fails */
    assert_int_equal(r.err, TS_EPROTO);
    assert_int_equal(r.off, 4);
    /* Sticky: later reads fail even where enough bytes remain. */
    assert_int_equal(ts_rd_u8(&r), 0);
    assert_int_equal(ts_rd_u16(&r), 0);
    assert_null(ts_rd_bytes(&r, 0));
    assert_int_equal(r.off, 4);
    assert_int_equal(ts_rd_done(&r), TS_EPROTO);

    /* Byte counts that would wrap the offset. */
    ts_rd_init(&r, b, sizeof(b));
    ts_rd_u8(&r);
    assert_null(ts_rd_bytes(&r, SIZE_MAX));
    assert_int_equal(r.err, TS_EPROTO);
    ts_rd_init(&r, b, sizeof(b));
    assert_null(ts_rd_bytes(&r, 7));
    ts_rd_init(&r, b, sizeof(b));
    assert_ptr_equal(ts_rd_bytes(&r, 6), b);
    assert_int_equal(ts_rd_done(&r), 0);
}

static void test_reader_done(void **state)
{
    const uint8_t b[4] = {0};
    struct ts_rd r;

    ts_rd_init(&r, b, sizeof(b));
    assert_int_equal(ts_rd_done(&r), TS_EPROTO); /* nothing read: all left over */
    ts_rd_u16(&r);
    ts_rd_u8(&r);
    assert_int_equal(ts_rd_done(&r), TS_EPROTO); /* one byte left over */
    ts_rd_u8(&r);
    assert_int_equal(ts_rd_done(&r), 0);
    ts_rd_init(&r, b, 0);
    assert_int_equal(ts_rd_done(&r), 0); /* empty payload, nothing expected */
}

/* Builds a u16-length string of n bytes from s into b; returns the bytes written. */
static size_t put_str(uint8_t *b, const void *s, size_t n)
{
    ts_put_le16(b, (uint16_t)n);
    memcpy(b + 2, s, n);
    return n + 2;
}

static void test_reader_str(void **state)
{
    uint8_t b[64];
    char out[8];
    struct ts_rd r;
    size_t n;

    n = put_str(b, "1234567", 7); /* fits cap 8 with its terminator */
    ts_rd_init(&r, b, n);
    ts_rd_str(&r, out, sizeof(out));
    assert_string_equal(out, "1234567");
    assert_int_equal(ts_rd_done(&r), 0);

    n = put_str(b, "12345678", 8); /* one too many */
    ts_rd_init(&r, b, n);
    memset(out, 'z', sizeof(out));
    ts_rd_str(&r, out, sizeof(out));
    assert_int_equal(r.err, TS_EPROTO);
    assert_string_equal(out, "");

    n = put_str(b, "", 0);
    ts_rd_init(&r, b, n);
    ts_rd_str(&r, out, 1);
    assert_string_equal(out, "");
    assert_int_equal(ts_rd_done(&r), 0);

    /* A length running past the end of the payload. */
    n = put_str(b, "abc", 3);
    ts_rd_init(&r, b, n - 1);
    ts_rd_str(&r, out, sizeof(out));
    assert_int_equal(r.err, TS_EPROTO);
    assert_string_equal(out, "");
    assert_true(r.off <= r.len);

    /* Only half a length. */
    ts_rd_init(&r, b, 1);
    ts_rd_str(&r, out, sizeof(out));
    assert_int_equal(r.err, TS_EPROTO);
    assert_string_equal(out, "");
}

static void test_reader_name(void **state)
{
    char long_name[TS_NAME_MAX + 2], out[TS_NAME_MAX + 1];
    uint8_t b[TS_NAME_MAX + 16];
    struct ts_rd r;
    size_t n;

    n = put_str(b, "imagenet-1k_v2.train", 20);
    ts_rd_init(&r, b, n);
    assert_int_equal(ts_rd_name(&r, out), 0);
    assert_string_equal(out, "imagenet-1k_v2.train");
    assert_int_equal(ts_rd_done(&r), 0);

    memset(long_name, 'a', sizeof(long_name));
    n = put_str(b, long_name, TS_NAME_MAX); /* the longest valid name */
    ts_rd_init(&r, b, n);
    assert_int_equal(ts_rd_name(&r, out), 0);
    assert_int_equal(strlen(out), TS_NAME_MAX);
    assert_int_equal(ts_rd_done(&r), 0);

    static const struct {
        const char *s;
        size_t n;
    } bad[] = {
        {"", 0},        {"a/b", 3}, {"ab\0c", 4},       {"abc\0", 4}, {"\0", 1},
        {".hidden", 7}, {"a b", 3}, {"caf\xc3\xa9", 5}, {"..", 2},    {"../etc", 6},
    };
    for (size_t i = 0; i < TS_ARRAY_SIZE(bad); i++) {
        n = put_str(b, bad[i].s, bad[i].n);
        ts_rd_init(&r, b, n);
        assert_int_equal(ts_rd_name(&r, out), TS_ENAME);
        /* Framing is intact: the bad name was consumed and nothing else is wrong. */
        assert_int_equal(ts_rd_done(&r), 0);
    }

    n = put_str(b, long_name, TS_NAME_MAX + 1); /* 129 bytes */
    ts_rd_init(&r, b, n);
    assert_int_equal(ts_rd_name(&r, out), TS_ENAME);
    assert_int_equal(ts_rd_done(&r), 0);

    /* Truncated names are framing errors, not name errors. */
    n = put_str(b, "abc", 3);
    ts_rd_init(&r, b, n - 1);
    assert_int_equal(ts_rd_name(&r, out), TS_EPROTO);
    assert_int_equal(ts_rd_done(&r), TS_EPROTO);
    ts_rd_init(&r, b, 1);
    assert_int_equal(ts_rd_name(&r, out), TS_EPROTO);
    /* A huge declared length is refused without reading it. */
    ts_put_le16(b, UINT16_MAX);
    ts_rd_init(&r, b, sizeof(b));
    assert_int_equal(ts_rd_name(&r, out), TS_EPROTO);
}

static const struct ts_dataset_info sample_ds = {
    .name = "coco-2017.val",
    .id = 0x0a0b0c0d0e0f1011ull,
    .policy = {.core = 3,
               .fringe = 2,
               .min_core = 2,
               .chunk_size = 4u << 20,
               .record_format = 2,
               .ec_k = 8,
               .ec_m = 3,
               .ec_dropped = 1},
    .state = TS_DS_SEALED,
    .created_ns = 1700000000123456789ull,
    .shards = 1024,
    .shards_writing = 7,
    .bytes = 0x0000123456789abcull,
};

static const struct ts_shard_info sample_shard = {
    .shard = 0xfffffffeu,
    .state = TS_SHARD_COMPLETE,
    .size = 0x123456789ull,
    .expect_size = TS_SIZE_UNKNOWN,
    .chunk_size = 1u << 20,
    .nchunks = 0x1235,
    .crc = 0xe3069283u,
    .nrecords = 77,
};

static void test_dataset_info(void **state)
{
    struct ts_dataset_info d;
    struct ts_wr w;
    struct ts_rd r;
    size_t full;

    ts_wr_init(&w);
    ts_wr_dataset_info(&w, &sample_ds);
    assert_int_equal(w.err, 0);
    full = w.len;
    assert_int_equal(full, 2 + strlen(sample_ds.name) + 8 + 4 + 4 + 8 + 4 + 4 + 8 + 1 + 3);

    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_rd_dataset_info(&r, &d), 0);
    assert_int_equal(ts_rd_done(&r), 0);
    assert_string_equal(d.name, sample_ds.name);
    assert_true(d.id == sample_ds.id);
    assert_int_equal(d.policy.core, 3);
    assert_int_equal(d.policy.fringe, 2);
    assert_int_equal(d.policy.min_core, 2);
    assert_int_equal(d.policy.chunk_size, sample_ds.policy.chunk_size);
    assert_int_equal(d.policy.record_format, 2);
    assert_int_equal(d.policy.ec_k, 8);
    assert_int_equal(d.policy.ec_m, 3);
    assert_int_equal(d.policy.ec_dropped, 1);
    assert_int_equal(d.state, TS_DS_SEALED);
    assert_true(d.created_ns == sample_ds.created_ns);
    assert_int_equal(d.shards, 1024);
    assert_int_equal(d.shards_writing, 7);
    assert_true(d.bytes == sample_ds.bytes);

    /* Every truncation fails cleanly, from an exact-size buffer. */
    for (size_t n = 0; n < full; n++) {
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, w.buf, n);
        ts_rd_init(&r, p, n);
        assert_int_equal(ts_rd_dataset_info(&r, &d), TS_EPROTO);
        assert_true(r.off <= n);
        free(p);
    }
    /* A name longer than the struct holds. */
    w.len = 0;
    ts_wr_u16(&w, TS_NAME_MAX + 1);
    for (int i = 0; i <= TS_NAME_MAX; i++)
        ts_wr_u8(&w, 'a');
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_rd_dataset_info(&r, &d), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_shard_info(void **state)
{
    struct ts_shard_info s;
    struct ts_wr w;
    struct ts_rd r;
    size_t full;

    ts_wr_init(&w);
    ts_wr_shard_info(&w, &sample_shard);
    ts_wr_shard_info(&w, &sample_shard);
    assert_int_equal(w.err, 0);
    full = w.len / 2;
    assert_int_equal(full, 4 + 1 + 8 + 8 + 4 + 4 + 4 + 4);

    ts_rd_init(&r, w.buf, w.len);
    for (int i = 0; i < 2; i++) {
        memset(&s, 0xa5, sizeof(s));
        assert_int_equal(ts_rd_shard_info(&r, &s), 0);
        assert_int_equal(s.shard, sample_shard.shard);
        assert_int_equal(s.state, TS_SHARD_COMPLETE);
        assert_true(s.size == sample_shard.size);
        assert_true(s.expect_size == TS_SIZE_UNKNOWN);
        assert_int_equal(s.chunk_size, sample_shard.chunk_size);
        assert_int_equal(s.nchunks, sample_shard.nchunks);
        assert_int_equal(s.crc, sample_shard.crc);
        assert_int_equal(s.nrecords, 77);
    }
    assert_int_equal(ts_rd_done(&r), 0);

    for (size_t n = 0; n < full; n++) {
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, w.buf, n);
        ts_rd_init(&r, p, n);
        assert_int_equal(ts_rd_shard_info(&r, &s), TS_EPROTO);
        assert_true(r.off <= n);
        free(p);
    }
    ts_wr_fini(&w);
}

static void test_opcode_table(void **state)
{
    static const struct {
        unsigned op;
        const char *wire;
        int role;
        uint32_t max;
    } ops[] = {
#define X(name, value, wire, role, max) {value, wire, role, max},
        TS_OPCODE_TABLE(X)
#undef X
    };
    static const unsigned unknown[] = {0, TS_OP_MAX, 30, 100, 200, 254, 255, 256, UINT_MAX};

    assert_int_equal(TS_ARRAY_SIZE(ops), 29);
    for (size_t i = 0; i < TS_ARRAY_SIZE(ops); i++) {
        const struct ts_op_desc *d = ts_op_desc(ops[i].op);
        assert_non_null(d);
        assert_string_equal(d->name, ops[i].wire);
        assert_int_equal(d->min_role, ops[i].role);
        assert_int_equal(d->max_payload, ops[i].max);
        assert_true(d->max_payload >= TS_SMALL_PAYLOAD);
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(ops[i].op, ops[j].op);
            assert_string_not_equal(ops[i].wire, ops[j].wire);
        }
    }
    for (size_t i = 0; i < TS_ARRAY_SIZE(unknown); i++)
        assert_null(ts_op_desc(unknown[i]));

    /* Spot checks against docs/protocol.md. */
    assert_int_equal(ts_op_desc(TS_OP_HELLO)->min_role, TS_ROLE_NONE);
    assert_int_equal(ts_op_desc(TS_OP_DATASET_DELETE)->min_role, TS_ROLE_ADMIN);
    assert_int_equal(ts_op_desc(TS_OP_PG_QUERY)->min_role, TS_ROLE_NODE);
    assert_int_equal(ts_op_desc(TS_OP_RDMA_TOKEN)->min_role, TS_ROLE_READER);
    assert_int_equal(ts_op_desc(TS_OP_PG_DROP)->min_role, TS_ROLE_ADMIN);
    assert_int_equal(ts_op_desc(TS_OP_READV)->min_role, TS_ROLE_READER);
    assert_string_equal(ts_op_desc(TS_OP_READV)->name, "readv");
    assert_int_equal(ts_op_desc(TS_OP_PG_ACTIVATE)->min_role, TS_ROLE_NODE);
    assert_int_equal(ts_op_desc(TS_OP_PG_PULL)->min_role, TS_ROLE_NODE);
    assert_int_equal(ts_op_desc(TS_OP_REPL_WRITE)->min_role, TS_ROLE_NODE);
    assert_int_equal(ts_op_desc(TS_OP_REPL_SEAL)->min_role, TS_ROLE_NODE);
    assert_int_equal(ts_op_desc(TS_OP_MAP_PUSH)->min_role, TS_ROLE_ADMIN_OR_NODE);
    assert_int_equal(ts_op_desc(TS_OP_PG_INVENTORY)->min_role, TS_ROLE_READER);
    assert_string_equal(ts_op_desc(TS_OP_PG_INVENTORY)->name, "pg-inventory");
    assert_string_equal(ts_op_desc(TS_OP_PG_QUERY)->name, "pg-query");
    assert_int_equal(ts_op_desc(TS_OP_SHARD_WRITE)->max_payload, (64u << 20) + 4096);
    assert_int_equal(ts_op_desc(TS_OP_SHARD_SEAL)->max_payload, 16u << 20);
    assert_string_equal(ts_op_desc(TS_OP_READ)->name, "read");
}

static void test_roles(void **state)
{
    static const char *const names[] = {"none", "reader", "writer", "admin", "node"};

    assert_true(TS_ROLE_NONE < TS_ROLE_READER && TS_ROLE_READER < TS_ROLE_WRITER &&
                TS_ROLE_WRITER < TS_ROLE_ADMIN);
    for (int i = TS_ROLE_NONE; i <= TS_ROLE_NODE; i++) {
        assert_string_equal(ts_role_name(i), names[i]);
        assert_int_equal(ts_role_parse(names[i]), i);
        assert_int_equal(ts_role_parse(ts_role_name(i)), i);
    }
    assert_int_equal(ts_role_parse("ADMIN"), TS_ROLE_ADMIN); /* certificate OUs vary in case */
    assert_int_equal(ts_role_parse("Writer"), TS_ROLE_WRITER);
    assert_int_equal(ts_role_parse("root"), TS_EINVAL);
    assert_int_equal(ts_role_parse(""), TS_EINVAL);
    assert_int_equal(ts_role_parse("admin "), TS_EINVAL);
    assert_int_equal(ts_role_parse("admin or node"), TS_EINVAL); /* a requirement, not a role */
    assert_int_equal(ts_role_parse(NULL), TS_EINVAL);
    assert_string_equal(ts_role_name(-1), "?");
    assert_string_equal(ts_role_name(TS_ROLE_ADMIN_OR_NODE + 1), "?");
    /* The ordered roles include the ones below them; node stands apart. */
    for (int r = TS_ROLE_NONE; r <= TS_ROLE_ADMIN; r++)
        for (int need = TS_ROLE_NONE; need <= TS_ROLE_ADMIN; need++)
            assert_int_equal(ts_role_may(r, need), r >= need);
    for (int r = TS_ROLE_NONE; r <= TS_ROLE_ADMIN; r++)
        assert_false(ts_role_may(r, TS_ROLE_NODE)); /* admin may not replicate */
    assert_true(ts_role_may(TS_ROLE_NODE, TS_ROLE_NODE));
    assert_true(ts_role_may(TS_ROLE_NODE, TS_ROLE_READER));
    assert_false(ts_role_may(TS_ROLE_NODE, TS_ROLE_WRITER)); /* a node certificate cannot put */
    assert_false(ts_role_may(TS_ROLE_NODE, TS_ROLE_ADMIN));  /* ... nor delete */
    assert_true(ts_role_may(TS_ROLE_NODE, TS_ROLE_ADMIN_OR_NODE));
    assert_true(ts_role_may(TS_ROLE_ADMIN, TS_ROLE_ADMIN_OR_NODE));
    assert_false(ts_role_may(TS_ROLE_WRITER, TS_ROLE_ADMIN_OR_NODE));
    assert_false(ts_role_may(TS_ROLE_ADMIN_OR_NODE, TS_ROLE_READER)); /* not a role */
    assert_string_equal(ts_role_name(INT_MIN), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_round_trip),
        cmocka_unit_test(test_header_truncated),
        cmocka_unit_test(test_header_bad_magic),
        cmocka_unit_test(test_header_bad_crc),
        cmocka_unit_test(test_header_bad_version),
        cmocka_unit_test(test_header_reserved_flags),
        cmocka_unit_test(test_header_length_limit),
        cmocka_unit_test(test_writer_frame),
        cmocka_unit_test(test_writer_overflow),
        cmocka_unit_test(test_reader_values),
        cmocka_unit_test(test_reader_bounds),
        cmocka_unit_test(test_reader_sticky_error),
        cmocka_unit_test(test_reader_done),
        cmocka_unit_test(test_reader_str),
        cmocka_unit_test(test_reader_name),
        cmocka_unit_test(test_dataset_info),
        cmocka_unit_test(test_shard_info),
        cmocka_unit_test(test_opcode_table),
        cmocka_unit_test(test_roles),
    };
    return cmocka_run_group_tests_name("proto", tests, NULL, NULL);
}
