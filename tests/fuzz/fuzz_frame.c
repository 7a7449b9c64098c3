/*
 * Fuzz target for the frame parser and the payload decoders (common/proto.c).
 *
 * Each input is treated as bytes arriving on a connection: the header is parsed at several
 * payload limits and every prefix of it; when a header parses, its payload is decoded the way
 * a server decodes a request (or a client a reply, when the REPLY flag is set), from a copy of
 * exactly the payload's size so that a sanitizer sees any read past its end. Because random
 * bytes almost never carry a valid header CRC, each input is also tried with its CRC (and
 * then its length) repaired, which lets the fuzzer reach the decoders.
 *
 * Invariants (a violation aborts):
 *   - ts_frame_parse returns 0, TS_HDR_LEN, TS_EPROTO or TS_ETOOBIG, and 0 only for a short
 *     input whose bytes so far match the magic;
 *   - for a whole header the result is exactly the one docs/protocol.md gives (computed here
 *     independently), at every limit, and does not depend on the bytes after the header;
 *   - a header that parsed re-encodes to the identical TS_HDR_LEN bytes;
 *   - the reader never moves past its length; a decode that succeeds consumed exactly the
 *     payload, and re-encoding a decoded request gives back the identical payload.
 *
 * Built twice (tests/fuzz/CMakeLists.txt): as the libFuzzer target fuzz_frame, and linked with
 * smoke_main.c into fuzz_frame_smoke, a deterministic driver that runs in ctest.
 */
#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_frame_decode(const uint8_t *frame, size_t size);

/* Not assert(): it must also fire in release (NDEBUG) builds of the smoke driver. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define STR_CAP (UINT16_MAX + 1) /* room for the longest str the wire can carry */
#define SCRUB_MAX_ERRORS 1000
#define HELLO_NAME_CAP 64 /* the server's buffer for the client name (longer: TS_EPROTO) */

static size_t rd_left(const struct ts_rd *r)
{
    CHECK(r->off <= r->len);
    return r->len - r->off;
}

/* ---- requests: decoded as the server does, then re-encoded ---------------------------- */

struct req {
    uint16_t version;
    char str[HELLO_NAME_CAP]; /* HELLO client name */
    size_t str_len;
    char name[TS_NAME_MAX + 1];
    int all_datasets; /* SCRUB with an empty name */
    int framed;       /* the payload was consumed exactly */
    uint8_t core, fringe, min_core, have_crc;
    uint32_t chunk_size, shard, index, crc, length, nrecords;
    uint64_t size, offset;
    const uint8_t *data;
    uint64_t *records;
};

/*
 * The reader's string outputs go to arrays of exactly the size given to it, on the stack, so
 * that a sanitizer sees a write past them (a field of struct req would hide it).
 */

/* A str whose bytes are kept with their length (they may hold NULs). */
static void rd_str_len(struct ts_rd *r, char *dst, size_t *len)
{
    char out[HELLO_NAME_CAP];
    size_t before = r->off;

    *len = rd_left(r) >= 2 ? ts_get_le16(r->p + r->off) : 0;
    ts_rd_str(r, out, sizeof(out));
    CHECK(r->err || r->off == before + 2 + *len);
    CHECK(r->err || (*len < sizeof(out) && out[*len] == '\0'));
    CHECK(!r->err || out[0] == '\0');
    memcpy(dst, out, sizeof(out));
}

static int rd_name(struct ts_rd *r, char *dst)
{
    char out[TS_NAME_MAX + 1];
    int rc = ts_rd_name(r, out);

    CHECK(rc == 0 || rc == TS_EPROTO || rc == TS_ENAME);
    CHECK(rc != 0 || (ts_name_valid(out) && strlen(out) <= TS_NAME_MAX));
    memcpy(dst, out, sizeof(out));
    return rc;
}

/*
 * Decodes a request body in the order server/ops.c does: the name first (an invalid one is
 * answered at once), then the fixed fields, then ts_rd_done(), then content checks. Returns 0
 * or the status the server would reply with; q->framed says the payload was consumed exactly.
 */
static int decode_request(uint8_t op, struct ts_rd *r, struct req *q)
{
    int rc;

    switch (op) {
    case TS_OP_HELLO:
        q->version = ts_rd_u16(r);
        rd_str_len(r, q->str, &q->str_len);
        if ((rc = ts_rd_done(r)) != 0)
            return rc;
        q->framed = 1;
        return q->version == TS_PROTO_VERSION ? 0 : TS_ENOTSUP;
    case TS_OP_DATASET_CREATE:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        q->core = ts_rd_u8(r);
        q->fringe = ts_rd_u8(r);
        q->min_core = ts_rd_u8(r);
        q->chunk_size = ts_rd_u32(r);
        break;
    case TS_OP_DATASET_LIST:
    case TS_OP_STATUS:
        break;
    case TS_OP_DATASET_STAT:
    case TS_OP_DATASET_SEAL:
    case TS_OP_DATASET_DELETE:
    case TS_OP_SHARD_LIST:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        break;
    case TS_OP_SHARD_WRITE:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        q->shard = ts_rd_u32(r);
        q->index = ts_rd_u32(r);
        q->size = ts_rd_u64(r);
        q->crc = ts_rd_u32(r);
        q->length = ts_rd_u32(r);
        q->data = ts_rd_bytes(r, q->length);
        CHECK(r->err || q->data == r->p + r->off - q->length);
        if ((rc = ts_rd_done(r)) != 0)
            return rc;
        q->framed = 1;
        /* The chunk's CRC is verified before anything is stored. */
        return ts_crc32c(0, q->data, q->length) == q->crc ? 0 : TS_ECORRUPT;
    case TS_OP_SHARD_SEAL:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        q->shard = ts_rd_u32(r);
        q->have_crc = ts_rd_u8(r);
        q->crc = ts_rd_u32(r);
        q->nrecords = ts_rd_u32(r);
        if (r->err)
            return r->err;
        /* The count must match the bytes present, before anything is allocated for it. */
        if ((uint64_t)q->nrecords * 8 != rd_left(r))
            return TS_EPROTO;
        q->records = malloc((q->nrecords ? q->nrecords : 1) * sizeof(uint64_t));
        if (!q->records)
            return TS_ENOMEM;
        for (uint32_t i = 0; i < q->nrecords; i++)
            q->records[i] = ts_rd_u64(r);
        CHECK(!r->err);
        break;
    case TS_OP_READ:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        q->shard = ts_rd_u32(r);
        q->offset = ts_rd_u64(r);
        q->length = ts_rd_u32(r);
        if ((rc = ts_rd_done(r)) != 0)
            return rc;
        q->framed = 1;
        return q->length > TS_MAX_READ ? TS_ETOOBIG : 0;
    case TS_OP_SHARD_STAT:
        if ((rc = rd_name(r, q->name)) != 0)
            return rc;
        q->shard = ts_rd_u32(r);
        break;
    case TS_OP_SCRUB:
        /* An empty name means every dataset; anything else must be a valid name. */
        if (rd_left(r) >= 2 && ts_get_le16(r->p + r->off) == 0) {
            ts_rd_u16(r);
            q->all_datasets = 1;
        } else if ((rc = rd_name(r, q->name)) != 0) {
            return rc;
        }
        break;
    default:
        return TS_ENOTSUP;
    }
    if ((rc = ts_rd_done(r)) != 0)
        return rc;
    q->framed = 1;
    return 0;
}

static void wr_name(struct ts_wr *w, const struct req *q)
{
    ts_wr_str(w, q->name);
}

/* Encodes a decoded request the way a client would. */
static void encode_request(uint8_t op, struct ts_wr *w, const struct req *q)
{
    switch (op) {
    case TS_OP_HELLO:
        ts_wr_u16(w, q->version);
        ts_wr_u16(w, (uint16_t)q->str_len);
        ts_wr_bytes(w, q->str, q->str_len);
        break;
    case TS_OP_DATASET_CREATE:
        wr_name(w, q);
        ts_wr_u8(w, q->core);
        ts_wr_u8(w, q->fringe);
        ts_wr_u8(w, q->min_core);
        ts_wr_u32(w, q->chunk_size);
        break;
    case TS_OP_DATASET_STAT:
    case TS_OP_DATASET_SEAL:
    case TS_OP_DATASET_DELETE:
    case TS_OP_SHARD_LIST:
        wr_name(w, q);
        break;
    case TS_OP_SHARD_WRITE:
        wr_name(w, q);
        ts_wr_u32(w, q->shard);
        ts_wr_u32(w, q->index);
        ts_wr_u64(w, q->size);
        ts_wr_u32(w, q->crc);
        ts_wr_u32(w, q->length);
        ts_wr_bytes(w, q->data, q->length);
        break;
    case TS_OP_SHARD_SEAL:
        wr_name(w, q);
        ts_wr_u32(w, q->shard);
        ts_wr_u8(w, q->have_crc);
        ts_wr_u32(w, q->crc);
        ts_wr_u32(w, q->nrecords);
        for (uint32_t i = 0; i < q->nrecords; i++)
            ts_wr_u64(w, q->records[i]);
        break;
    case TS_OP_READ:
        wr_name(w, q);
        ts_wr_u32(w, q->shard);
        ts_wr_u64(w, q->offset);
        ts_wr_u32(w, q->length);
        break;
    case TS_OP_SHARD_STAT:
        wr_name(w, q);
        ts_wr_u32(w, q->shard);
        break;
    case TS_OP_SCRUB:
        ts_wr_str(w, q->all_datasets ? "" : q->name);
        break;
    default:
        break;
    }
}

static int check_request(uint8_t op, const uint8_t *p, size_t len)
{
    struct req q = {0};
    struct ts_rd r;
    int rc;

    ts_rd_init(&r, p, len);
    rc = decode_request(op, &r, &q);
    CHECK(r.off <= len);
    CHECK(rc == 0 || rc == TS_EPROTO || rc == TS_ENAME || rc == TS_ETOOBIG || rc == TS_ECORRUPT ||
          rc == TS_ENOTSUP || rc == TS_ENOMEM);
    CHECK(rc != 0 || q.framed);
    if (q.framed) {
        /* Well-framed: the encoding is canonical, so it must come back byte for byte. */
        struct ts_wr w;

        CHECK(r.off == len);
        CHECK(r.err == 0);
        if (q.name[0])
            CHECK(ts_name_valid(q.name));
        ts_wr_init(&w);
        encode_request(op, &w, &q);
        CHECK(w.err == 0);
        CHECK(w.len == len);
        CHECK(len == 0 || memcmp(w.buf, p, len) == 0);
        ts_wr_fini(&w);
    }
    free(q.records);
    return rc;
}

/* ---- replies: decoded as the client does -------------------------------------------- */

static int check_dataset_info(struct ts_rd *r)
{
    struct ts_dataset_info d;
    size_t before = r->off;
    size_t name_len = rd_left(r) >= 2 ? ts_get_le16(r->p + r->off) : 0;
    int rc = ts_rd_dataset_info(r, &d);

    CHECK(r->off <= r->len);
    CHECK(rc == 0 || rc == TS_EPROTO);
    CHECK(rc || r->off == before + 2 + name_len + 40);
    CHECK(rc || name_len <= TS_NAME_MAX);
    CHECK(strlen(d.name) <= name_len);
    return rc;
}

static int check_shard_info(struct ts_rd *r)
{
    struct ts_shard_info s;
    size_t before = r->off;
    int rc = ts_rd_shard_info(r, &s);

    CHECK(r->off <= r->len);
    CHECK(rc == 0 || rc == TS_EPROTO);
    CHECK(rc || r->off == before + 37);
    return rc;
}

/* Reads a u32 count of items at least min_size bytes each, refusing counts the payload
 * cannot hold (before anything would be allocated for them). */
static uint32_t rd_count(struct ts_rd *r, size_t min_size)
{
    uint32_t n = ts_rd_u32(r);

    if (!r->err && n > rd_left(r) / min_size)
        r->err = TS_EPROTO;
    return r->err ? 0 : n;
}

static int decode_reply_body(uint8_t op, struct ts_rd *r)
{
    static char str[STR_CAP];
    uint32_t n;

    switch (op) {
    case TS_OP_HELLO:
        ts_rd_u16(r);
        ts_rd_str(r, str, STR_CAP);
        ts_rd_u8(r);
        ts_rd_u32(r);
        ts_rd_u64(r);
        break;
    case TS_OP_DATASET_LIST:
        n = rd_count(r, 42);
        for (uint32_t i = 0; i < n && !r->err; i++)
            check_dataset_info(r);
        break;
    case TS_OP_DATASET_STAT:
        check_dataset_info(r);
        break;
    case TS_OP_SHARD_WRITE:
        ts_rd_u32(r);
        ts_rd_u64(r);
        break;
    case TS_OP_SHARD_SEAL:
    case TS_OP_SHARD_STAT:
        check_shard_info(r);
        break;
    case TS_OP_READ: {
        uint64_t total = 0;

        ts_rd_u64(r);
        n = rd_count(r, 8);
        for (uint32_t i = 0; i < n && !r->err; i++) {
            total += ts_rd_u32(r); /* at most 2^32 pieces of < 2^32: no wrap */
            ts_rd_u32(r);
        }
        if (!r->err && total != rd_left(r))
            return TS_EPROTO;
        if (!r->err)
            CHECK(ts_rd_bytes(r, (size_t)total) != NULL);
        break;
    }
    case TS_OP_SHARD_LIST:
        n = rd_count(r, 37);
        for (uint32_t i = 0; i < n && !r->err; i++)
            check_shard_info(r);
        break;
    case TS_OP_SCRUB:
        for (int i = 0; i < 4; i++)
            ts_rd_u64(r);
        n = rd_count(r, 2 + 12);
        if (n > SCRUB_MAX_ERRORS)
            return TS_EPROTO;
        for (uint32_t i = 0; i < n && !r->err; i++) {
            char ds[TS_NAME_MAX + 1];

            ts_rd_str(r, ds, sizeof(ds));
            ts_rd_u32(r);
            ts_rd_u32(r);
            ts_rd_u32(r); /* i32 code */
        }
        break;
    case TS_OP_STATUS:
        ts_rd_str(r, str, STR_CAP);
        break;
    case TS_OP_DATASET_CREATE:
    case TS_OP_DATASET_SEAL:
    case TS_OP_DATASET_DELETE:
        break;
    default:
        return TS_ENOTSUP;
    }
    CHECK(r->off <= r->len);
    return ts_rd_done(r);
}

static int check_reply(uint8_t op, const uint8_t *p, size_t len)
{
    static char msg[STR_CAP];
    struct ts_rd r;
    int32_t status;
    int rc;

    ts_rd_init(&r, p, len);
    status = (int32_t)ts_rd_u32(&r);
    if (r.err)
        return r.err;
    if (status != 0) {
        ts_rd_str(&r, msg, STR_CAP);
        rc = ts_rd_done(&r);
    } else {
        rc = decode_reply_body(op, &r);
    }
    CHECK(r.off <= len);
    CHECK(rc == 0 || rc == TS_EPROTO || rc == TS_ENOTSUP);
    CHECK(rc != 0 || r.off == len);
    return rc;
}

/* ---- frames ------------------------------------------------------------------------- */

static int magic_prefix_ok(const uint8_t *data, size_t n)
{
    static const uint8_t magic[4] = {'T', 'S', 'R', 'A'};
    return memcmp(data, magic, n < 4 ? n : 4) == 0;
}

/* Parses a header the way the server does and decodes its payload; returns the first
 * error, or 0 for a complete, valid frame whose payload decodes. */
int fuzz_frame_decode(const uint8_t *frame, size_t size)
{
    const struct ts_op_desc *desc = size > 5 ? ts_op_desc(frame[5]) : NULL;
    size_t limit = desc ? desc->max_payload : TS_SMALL_PAYLOAD;
    struct ts_frame_hdr h;
    uint8_t *payload;
    size_t len;
    int rc;

    rc = ts_frame_parse(frame, size, limit, &h);
    if (rc != TS_HDR_LEN)
        return rc ? rc : TS_EINCOMPLETE;
    if (!ts_op_desc(h.opcode))
        return TS_ENOTSUP;
    /* Decode what arrived; a short payload is a truncated one. */
    len = TS_MIN(size - TS_HDR_LEN, (size_t)h.length);
    payload = malloc(len ? len : 1);
    CHECK(payload);
    memcpy(payload, frame + TS_HDR_LEN, len);
    if (h.flags & TS_F_REPLY)
        rc = check_reply(h.opcode, payload, len);
    else
        rc = check_request(h.opcode, payload, len);
    free(payload);
    if (rc == 0 && len < h.length)
        rc = TS_EINCOMPLETE;
    return rc;
}

static void check_header(const uint8_t *data, size_t size)
{
    static const size_t limits[] = {
        0, 1, 64, TS_SMALL_PAYLOAD, 16u << 20, TS_MAX_CHUNK + 4096, UINT32_MAX - 1, SIZE_MAX};
    struct ts_frame_hdr h;
    int well_formed;

    /* Every prefix of the header: need more, or a bad magic seen in the bytes so far. */
    for (size_t n = 0; n < TS_HDR_LEN && n <= size; n++) {
        int rc = ts_frame_parse(data, n, SIZE_MAX, &h);

        CHECK(rc == 0 || rc == TS_EPROTO);
        CHECK((rc == 0) == magic_prefix_ok(data, n));
    }
    if (size < TS_HDR_LEN)
        return;

    well_formed = magic_prefix_ok(data, 4) && ts_crc32c(0, data, 28) == ts_get_le32(data + 28) &&
                  data[4] == TS_PROTO_VERSION && !(ts_get_le16(data + 6) & ~TS_F_KNOWN);
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        int rc = ts_frame_parse(data, size, limits[i], &h), want;

        CHECK(rc == TS_HDR_LEN || rc == TS_EPROTO || rc == TS_ETOOBIG);
        /* Bytes after the header never matter. */
        CHECK(rc == ts_frame_parse(data, TS_HDR_LEN, limits[i], &h));
        /* Exactly what docs/protocol.md says, computed independently of the parser. */
        want = TS_EPROTO;
        if (well_formed)
            want = ts_get_le32(data + 24) > limits[i] ? TS_ETOOBIG : TS_HDR_LEN;
        CHECK(rc == want);
        if (rc == TS_HDR_LEN) {
            uint8_t again[TS_HDR_LEN];

            CHECK(h.length <= limits[i]);
            CHECK(h.version == TS_PROTO_VERSION);
            CHECK((h.flags & ~TS_F_KNOWN) == 0);
            ts_frame_encode(again, &h);
            CHECK(memcmp(again, data, TS_HDR_LEN) == 0);
        }
    }
}

static void check_frame(const uint8_t *data, size_t size)
{
    check_header(data, size);
    (void)fuzz_frame_decode(data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;

    /* Exactly the input's bytes, so that any read past them is seen by a sanitizer. */
    copy = malloc(size ? size : 1);
    CHECK(copy);
    if (size)
        memcpy(copy, data, size);
    else
        copy[0] = 0; /* never read; keeps the compiler's uninitialized-use analysis quiet */
    check_frame(copy, size);

    /* The info bodies on their own, over the raw bytes. */
    {
        struct ts_rd r;
        ts_rd_init(&r, copy, size);
        check_dataset_info(&r);
        ts_rd_init(&r, copy, size);
        check_shard_info(&r);
    }

    if (size >= TS_HDR_LEN) {
        /* With the header CRC repaired... */
        ts_put_le32(copy + 28, ts_crc32c(0, copy, 28));
        check_frame(copy, size);
        /* ... and the length matching the bytes present. */
        if (size - TS_HDR_LEN <= UINT32_MAX) {
            ts_put_le32(copy + 24, (uint32_t)(size - TS_HDR_LEN));
            ts_put_le32(copy + 28, ts_crc32c(0, copy, 28));
            check_frame(copy, size);
        }
    }
    free(copy);
    return 0;
}
