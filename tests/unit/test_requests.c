/* Unit tests for the server's request decoders (server/requests.c): the layouts of
 * docs/protocol.md, their optional trailing fields, and the errors a handler used to answer. */
#include "ts_test.h"

#include "requests.h"
#include "ts_map.h"

#include <stdlib.h>
#include <string.h>

#define NAME "imagenet-1k.train"

static char msg[192];

/* Decodes w's bytes as opcode op; *q is freed by the caller when 0 is returned. */
static int dec(unsigned op, const struct ts_wr *w, struct tsd_req *q)
{
    msg[0] = '\0';
    return tsd_req_decode(op, w->buf, w->len, q, msg, sizeof(msg));
}

static void test_empty_payloads(void **state)
{
    static const unsigned ops[] = {TS_OP_DATASET_LIST, TS_OP_STATUS, TS_OP_MAP_GET};
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    for (size_t i = 0; i < TS_ARRAY_SIZE(ops); i++) {
        assert_int_equal(tsd_req_decode(ops[i], NULL, 0, &q, msg, sizeof(msg)), 0);
        assert_int_equal(q.op, ops[i]);
        w.len = 0;
        ts_wr_u8(&w, 0);
        assert_int_equal(dec(ops[i], &w, &q), TS_EPROTO);
        assert_non_null(strstr(msg, "malformed"));
    }
    assert_int_equal(tsd_req_decode(0, NULL, 0, &q, msg, sizeof(msg)), TS_ENOTSUP);
    assert_int_equal(tsd_req_decode(TS_OP_MAX, NULL, 0, &q, msg, sizeof(msg)), TS_ENOTSUP);
    /* Without room for a message: the same answers, nothing written. */
    assert_int_equal(tsd_req_decode(TS_OP_STATUS, w.buf, w.len, &q, NULL, 0), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_names(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    assert_int_equal(dec(TS_OP_DATASET_STAT, &w, &q), 0);
    assert_string_equal(q.u.dataset_stat.name, NAME);
    assert_int_equal(dec(TS_OP_DATASET_DELETE, &w, &q), 0);
    assert_string_equal(q.u.dataset_delete.name, NAME);
    assert_int_equal(dec(TS_OP_SHARD_LIST, &w, &q), 0);
    assert_string_equal(q.u.shard_list.name, NAME);

    ts_wr_u8(&w, 0); /* trailing byte */
    assert_int_equal(dec(TS_OP_DATASET_STAT, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "malformed dataset-stat request");

    w.len = 0; /* an invalid name wins over what follows it */
    ts_wr_str(&w, ".hidden");
    ts_wr_u32(&w, 1);
    assert_int_equal(dec(TS_OP_SHARD_STAT, &w, &q), TS_ENAME);
    assert_string_equal(msg, "invalid dataset name (1-128 of [A-Za-z0-9._-], or NAME#fragment)");

    /* Fragment names (NAME#f): the shard operations take them, nothing else does. */
    w.len = 0;
    ts_wr_str(&w, NAME "#5");
    ts_wr_u32(&w, 1);
    assert_int_equal(dec(TS_OP_SHARD_STAT, &w, &q), 0);
    assert_string_equal(q.u.shard_stat.name, NAME "#5");
    w.len = 0;
    ts_wr_str(&w, NAME "#5");
    assert_int_equal(dec(TS_OP_DATASET_STAT, &w, &q), TS_ENAME);
    assert_string_equal(msg, "invalid dataset name (1-128 of [A-Za-z0-9._-])");
    assert_int_equal(dec(TS_OP_DATASET_DELETE, &w, &q), TS_ENAME);
    /* SHARD_LIST lists a fragment store too (an EC presence repair: one list a node and f). */
    assert_int_equal(dec(TS_OP_SHARD_LIST, &w, &q), 0);
    assert_string_equal(q.u.shard_list.name, NAME "#5");
    w.len = 0;
    ts_wr_str(&w, NAME "#40");
    assert_int_equal(dec(TS_OP_SHARD_LIST, &w, &q), TS_ENAME);
    {
        static const char *const bad[] = {NAME "#", NAME "#40", NAME "#05", NAME "#1#2",
                                          "#3",     ".x#1",     NAME "#x",  NAME "#123"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            w.len = 0;
            ts_wr_str(&w, bad[i]);
            ts_wr_u32(&w, 1);
            assert_int_equal(dec(TS_OP_SHARD_STAT, &w, &q), TS_ENAME);
        }
    }

    w.len = 0; /* the name's bytes are missing: malformed */
    ts_wr_u16(&w, 10);
    ts_wr_bytes(&w, "abc", 3);
    assert_int_equal(dec(TS_OP_SHARD_STAT, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "malformed shard-stat request");
    ts_wr_fini(&w);
}

static void test_dataset_create_incarnation(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u8(&w, 3);
    ts_wr_u8(&w, 1);
    ts_wr_u8(&w, 2);
    ts_wr_u32(&w, 4096);
    assert_int_equal(dec(TS_OP_DATASET_CREATE, &w, &q), 0);
    assert_int_equal(q.u.dataset_create.has_inc, 0);
    assert_true(q.u.dataset_create.inc == 0);
    assert_int_equal(q.u.dataset_create.policy.core, 3);
    assert_int_equal(q.u.dataset_create.policy.fringe, 1);
    assert_int_equal(q.u.dataset_create.policy.min_core, 2);
    assert_int_equal(q.u.dataset_create.policy.chunk_size, 4096);

    ts_wr_u64(&w, 1700000000000000000ull);
    assert_int_equal(dec(TS_OP_DATASET_CREATE, &w, &q), 0);
    assert_int_equal(q.u.dataset_create.has_inc, 1);
    assert_true(q.u.dataset_create.inc == 1700000000000000000ull);

    /* Anything but exactly 8 more bytes is malformed. */
    for (size_t cut = 1; cut < 8; cut++) {
        struct ts_wr t = w;
        t.len = w.len - cut;
        assert_int_equal(dec(TS_OP_DATASET_CREATE, &t, &q), TS_EPROTO);
    }
    /* Then one byte more: the record format; anything more is malformed. */
    ts_wr_u8(&w, 3);
    assert_int_equal(dec(TS_OP_DATASET_CREATE, &w, &q), 0);
    assert_int_equal(q.u.dataset_create.policy.record_format, 3);
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_DATASET_CREATE, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_dataset_seal_flags(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    assert_int_equal(dec(TS_OP_DATASET_SEAL, &w, &q), 0);
    assert_int_equal(q.u.dataset_seal.has_flags, 0);
    assert_int_equal(q.u.dataset_seal.flags, 0);
    ts_wr_u8(&w, TS_SEAL_LOCAL_ONLY);
    assert_int_equal(dec(TS_OP_DATASET_SEAL, &w, &q), 0);
    assert_int_equal(q.u.dataset_seal.has_flags, 1);
    assert_int_equal(q.u.dataset_seal.flags, TS_SEAL_LOCAL_ONLY);
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_DATASET_SEAL, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

/* DATASET_TIER: name, K, M, and whether the replicas' bytes are dropped (0 or 1). */
static void test_dataset_tier(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u8(&w, 4);
    ts_wr_u8(&w, 2);
    assert_int_equal(dec(TS_OP_DATASET_TIER, &w, &q), TS_EPROTO); /* the flag is not optional */
    ts_wr_u8(&w, 1);
    assert_int_equal(dec(TS_OP_DATASET_TIER, &w, &q), 0);
    assert_int_equal(q.u.dataset_tier.k, 4);
    assert_int_equal(q.u.dataset_tier.m, 2);
    assert_int_equal(q.u.dataset_tier.dropped, 1);
    w.buf[w.len - 1] = 2;
    assert_int_equal(dec(TS_OP_DATASET_TIER, &w, &q), TS_EPROTO);
    assert_non_null(strstr(msg, "replicas flag 2"));
    ts_wr_fini(&w);
}

static void test_scrub_name(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, "");
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), 0);
    assert_string_equal(q.u.scrub.name, ""); /* every dataset */
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), TS_EPROTO);
    w.len = 1;
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), TS_EPROTO);
    w.len = 0;
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), TS_EPROTO);
    ts_wr_str(&w, NAME);
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), 0);
    assert_string_equal(q.u.scrub.name, NAME);
    w.len = 0;
    ts_wr_str(&w, "bad name");
    assert_int_equal(dec(TS_OP_SCRUB, &w, &q), TS_ENAME);
    ts_wr_fini(&w);
}

static void test_chunks(void **state)
{
    uint8_t data[100];
    struct tsd_req q;
    struct ts_wr w;

    memset(data, 0x5a, sizeof(data));
    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u8(&w, 3); /* REPL_WRITE's dataset fields */
    ts_wr_u8(&w, 1);
    ts_wr_u8(&w, 2);
    ts_wr_u32(&w, 1u << 20);
    ts_wr_u8(&w, 2); /* record format */
    ts_wr_u8(&w, 0); /* replicated: no code, bytes kept */
    ts_wr_u8(&w, 0);
    ts_wr_u8(&w, 0);
    ts_wr_u64(&w, 77);
    ts_wr_u32(&w, 5);
    ts_wr_u32(&w, 2);
    ts_wr_u64(&w, UINT64_MAX);
    ts_wr_u32(&w, 0xabcdef01u);
    ts_wr_u32(&w, sizeof(data));
    ts_wr_bytes(&w, data, sizeof(data));
    assert_int_equal(dec(TS_OP_REPL_WRITE, &w, &q), 0);
    assert_string_equal(q.u.repl_write.name, NAME);
    assert_true(q.u.repl_write.inc == 77);
    assert_int_equal(q.u.repl_write.policy.record_format, 2);
    assert_int_equal(q.u.repl_write.policy.chunk_size, 1u << 20);
    assert_int_equal(q.u.repl_write.chunk.shard, 5);
    assert_int_equal(q.u.repl_write.chunk.idx, 2);
    assert_true(q.u.repl_write.chunk.size == UINT64_MAX);
    assert_int_equal(q.u.repl_write.chunk.crc, 0xabcdef01u);
    assert_int_equal(q.u.repl_write.chunk.len, sizeof(data));
    /* The data is not copied: it points into the payload, at its end. */
    assert_ptr_equal(q.u.repl_write.chunk.data, w.buf + w.len - sizeof(data));

    w.len--; /* one byte of data missing */
    assert_int_equal(dec(TS_OP_REPL_WRITE, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "malformed repl-write request");

    /* A dataset whose replicas' bytes are dropped (ec 4+2): the chunk's record, no bytes. */
    w.len -= sizeof(data) - 1 + 4 + 4 + 8 + 4 + 4 + 8 + 3;
    ts_wr_u8(&w, 4);
    ts_wr_u8(&w, 2);
    ts_wr_u8(&w, 1);
    ts_wr_u64(&w, 77);
    ts_wr_u32(&w, 5);
    ts_wr_u32(&w, 2);
    ts_wr_u64(&w, UINT64_MAX);
    ts_wr_u32(&w, 0xabcdef01u);
    ts_wr_u32(&w, sizeof(data));
    assert_int_equal(dec(TS_OP_REPL_WRITE, &w, &q), 0);
    assert_int_equal(q.u.repl_write.policy.ec_k, 4);
    assert_int_equal(q.u.repl_write.policy.ec_dropped, 1);
    assert_int_equal(q.u.repl_write.chunk.len, sizeof(data));
    assert_null(q.u.repl_write.chunk.data);
    ts_wr_bytes(&w, data, 1); /* bytes after it: malformed */
    assert_int_equal(dec(TS_OP_REPL_WRITE, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_shard_seal_records(void **state)
{
    struct tsd_req q;
    struct ts_wr w;
    size_t at;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u32(&w, 5);
    ts_wr_u8(&w, 1);
    ts_wr_u32(&w, 0x12345678u);
    at = w.len;
    ts_wr_u32(&w, 3);
    ts_wr_u64(&w, 0);
    ts_wr_u64(&w, 10);
    ts_wr_u64(&w, UINT64_MAX);
    assert_int_equal(dec(TS_OP_SHARD_SEAL, &w, &q), 0);
    assert_int_equal(q.u.shard_seal.shard, 5);
    assert_int_equal(q.u.shard_seal.have_crc, 1);
    assert_int_equal(q.u.shard_seal.crc, 0x12345678u);
    assert_int_equal(q.u.shard_seal.records.n, 3);
    assert_ptr_equal(q.u.shard_seal.records.p, w.buf + at + 4);
    assert_true(tsd_u64s_at(&q.u.shard_seal.records, 1) == 10);
    assert_true(tsd_u64s_at(&q.u.shard_seal.records, 2) == UINT64_MAX);

    ts_put_le32(w.buf + at, 4); /* more records than bytes, or fewer */
    assert_int_equal(dec(TS_OP_SHARD_SEAL, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "record count does not match the payload");
    ts_put_le32(w.buf + at, UINT32_MAX);
    assert_int_equal(dec(TS_OP_SHARD_SEAL, &w, &q), TS_EPROTO);
    ts_put_le32(w.buf + at, 2);
    assert_int_equal(dec(TS_OP_SHARD_SEAL, &w, &q), TS_EPROTO);
    w.len = at + 2; /* the count itself cut short */
    assert_int_equal(dec(TS_OP_SHARD_SEAL, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "malformed shard-seal request");
    ts_wr_fini(&w);
}

static void repl_seal_head(struct ts_wr *w, uint8_t kind, const char *name, uint16_t unnamed)
{
    ts_wr_u8(w, kind);
    ts_wr_u32(w, 17);
    ts_wr_u64(w, 42);
    ts_wr_u64(w, 3);
    if (name)
        ts_wr_str(w, name);
    else
        ts_wr_u16(w, unnamed);
    ts_wr_u8(w, 3);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 2);
    ts_wr_u32(w, 4096);
    ts_wr_u8(w, 1); /* record format */
    ts_wr_u8(w, 4); /* ec 4+2, replica bytes kept */
    ts_wr_u8(w, 2);
    ts_wr_u8(w, 0);
    ts_wr_u64(w, 99);
    ts_wr_u32(w, 6);
    ts_wr_u8(w, 1);
    ts_wr_u32(w, 0xfeedu);
}

static void test_repl_seal_kinds(void **state)
{
    static const uint8_t named[] = {TS_REPL_SEAL, TS_REPL_BACKFILL, TS_REPL_DELETE, TS_REPL_ABORT};
    static const uint8_t unnamed[] = {
        TS_REPL_NOOP, TS_REPL_SET_APPLIED, TS_REPL_TRUNCATE, TS_REPL_CLEAN, 0, 200};
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    for (size_t i = 0; i < sizeof(named); i++) {
        w.len = 0;
        repl_seal_head(&w, named[i], NAME, 0);
        ts_wr_u32(&w, 1);
        ts_wr_u64(&w, 12);
        assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), 0);
        assert_int_equal(q.u.repl_seal.kind, named[i]);
        assert_int_equal(q.u.repl_seal.pg, 17);
        assert_true(q.u.repl_seal.seq == 42 && q.u.repl_seal.epoch == 3);
        assert_string_equal(q.u.repl_seal.name, NAME);
        assert_true(q.u.repl_seal.inc == 99);
        assert_int_equal(q.u.repl_seal.policy.chunk_size, 4096);
        assert_int_equal(q.u.repl_seal.shard, 6);
        assert_int_equal(q.u.repl_seal.crc, 0xfeedu);
        assert_int_equal(q.u.repl_seal.records.n, 1);
        assert_true(tsd_u64s_at(&q.u.repl_seal.records, 0) == 12);
        w.len = 0;
        repl_seal_head(&w, named[i], "no/slash", 0);
        ts_wr_u32(&w, 0);
        assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_ENAME);
    }
    /* The other kinds (unknown ones included: the handler refuses them) carry a u16 in the
     * name's place that is read and ignored: no name bytes follow, whatever its value. */
    for (size_t i = 0; i < sizeof(unnamed); i++) {
        w.len = 0;
        repl_seal_head(&w, unnamed[i], NULL, i ? 0x4142 : 0);
        ts_wr_u32(&w, 0);
        assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), 0);
        assert_string_equal(q.u.repl_seal.name, "");
        assert_int_equal(q.u.repl_seal.unnamed, i ? 0x4142 : 0);
        assert_int_equal(q.u.repl_seal.shard, 6);
    }
    w.len = 0;
    repl_seal_head(&w, TS_REPL_NOOP, NULL, 0);
    ts_wr_u32(&w, 1);
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "record count does not match the payload");
    ts_wr_fini(&w);
}

static void test_repl_seal_prune(void **state)
{
    struct tsd_prune_entry e;
    struct tsd_req q;
    struct ts_wr w;
    char long_name[TS_NAME_MAX + 2];
    size_t at, off;

    ts_wr_init(&w);
    repl_seal_head(&w, TS_REPL_PRUNE, NULL, 0);
    at = w.len;
    ts_wr_u32(&w, 2);
    ts_wr_str(&w, NAME);
    ts_wr_u64(&w, 5);
    ts_wr_u8(&w, 0);
    ts_wr_u16(&w, 3); /* not checked as a dataset name: kept with its NUL */
    ts_wr_bytes(&w, "a\0b", 3);
    ts_wr_u64(&w, 6);
    ts_wr_u8(&w, 1);
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), 0);
    assert_int_equal(q.u.repl_seal.prune.n, 2);
    assert_ptr_equal(q.u.repl_seal.prune.p, w.buf + at + 4);
    assert_int_equal(q.u.repl_seal.prune.len, w.len - at - 4);
    off = tsd_prune_entry_at(&q.u.repl_seal.prune, 0, &e);
    assert_string_equal(e.name, NAME);
    assert_int_equal(e.name_len, strlen(NAME));
    assert_true(e.inc == 5 && e.deleted == 0);
    off = tsd_prune_entry_at(&q.u.repl_seal.prune, off, &e);
    assert_int_equal(e.name_len, 3);
    assert_memory_equal(e.name, "a\0b", 4);
    assert_true(e.inc == 6 && e.deleted == 1);
    assert_int_equal(off, q.u.repl_seal.prune.len);

    /* A count the bytes cannot hold (11 bytes an entry at least) is refused before the walk. */
    ts_put_le32(w.buf + at, 1000);
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "repl-seal prune: malformed dataset list");
    ts_put_le32(w.buf + at, 3);
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "malformed repl-seal request");
    ts_put_le32(w.buf + at, 1); /* the second entry is then trailing bytes */
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_EPROTO);

    w.len = at; /* a name of 129 bytes is too long */
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    ts_wr_u32(&w, 1);
    ts_wr_str(&w, long_name);
    ts_wr_u64(&w, 1);
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_REPL_SEAL, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_strings(void **state)
{
    char big[TSD_HELLO_NAME_CAP + 1];
    struct tsd_req q;
    struct ts_wr w;

    memset(big, 'c', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ts_wr_init(&w);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_u16(&w, TSD_HELLO_NAME_CAP - 1);
    ts_wr_bytes(&w, big, TSD_HELLO_NAME_CAP - 1);
    assert_int_equal(dec(TS_OP_HELLO, &w, &q), 0);
    assert_int_equal(q.u.hello.version, TS_PROTO_VERSION);
    assert_int_equal(q.u.hello.name_len, TSD_HELLO_NAME_CAP - 1);
    assert_int_equal(strlen(q.u.hello.name), TSD_HELLO_NAME_CAP - 1);
    w.len = 0;
    ts_wr_u16(&w, 7); /* another version decodes: the handler answers TS_ENOTSUP */
    ts_wr_str(&w, "client");
    assert_int_equal(dec(TS_OP_HELLO, &w, &q), 0);
    assert_int_equal(q.u.hello.version, 7);
    w.len = 0;
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, big); /* 1024 bytes: one too many */
    assert_int_equal(dec(TS_OP_HELLO, &w, &q), TS_EPROTO);

    w.len = 0;
    ts_wr_u32(&w, 4);
    ts_wr_u64(&w, 9);
    ts_wr_u16(&w, TSD_NODE_ID_CAP - 1);
    ts_wr_bytes(&w, big, TSD_NODE_ID_CAP - 1);
    assert_int_equal(dec(TS_OP_PG_QUERY, &w, &q), 0);
    assert_int_equal(q.u.pg_query.from_len, TSD_NODE_ID_CAP - 1);
    w.len = 0;
    ts_wr_u32(&w, 4);
    ts_wr_u64(&w, 9);
    ts_wr_u16(&w, TSD_NODE_ID_CAP);
    ts_wr_bytes(&w, big, TSD_NODE_ID_CAP);
    assert_int_equal(dec(TS_OP_PG_QUERY, &w, &q), TS_EPROTO);

    w.len = 0;
    ts_wr_u32(&w, 4);
    ts_wr_u64(&w, 9);
    ts_wr_str(&w, "n2");
    ts_wr_u8(&w, 1);
    assert_int_equal(dec(TS_OP_PG_PULL, &w, &q), 0);
    assert_string_equal(q.u.pg_pull.node, "n2");
    assert_int_equal(q.u.pg_pull.recheck, 1);

    w.len = 0;
    ts_wr_u32(&w, 6);
    ts_wr_u8(&w, 2);
    assert_int_equal(dec(TS_OP_PG_INVENTORY, &w, &q), 0);
    assert_int_equal(q.u.pg_inventory.pg, 6);
    assert_int_equal(q.u.pg_inventory.rank, 2);
    ts_wr_u8(&w, 0); /* a trailing byte */
    assert_int_equal(dec(TS_OP_PG_INVENTORY, &w, &q), TS_EPROTO);
    w.len = 4; /* no rank */
    assert_int_equal(dec(TS_OP_PG_INVENTORY, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

static void wr_activate(struct ts_wr *w, uint8_t n)
{
    w->len = 0;
    ts_wr_u32(w, 4);
    ts_wr_u64(w, 9);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 2);
    ts_wr_u8(w, n);
    for (unsigned i = 0; i < n; i++)
        ts_wr_str(w, i ? "other" : "primary");
    ts_wr_u64(w, 8);
    ts_wr_u64(w, 30);
    ts_wr_u8(w, 1);
}

static void test_pg_activate(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    wr_activate(&w, TSD_PG_MAX_ACTING);
    assert_int_equal(dec(TS_OP_PG_ACTIVATE, &w, &q), 0);
    assert_int_equal(q.u.pg_activate.n, TSD_PG_MAX_ACTING);
    assert_string_equal(q.u.pg_activate.acting[0], "primary");
    assert_string_equal(q.u.pg_activate.acting[TSD_PG_MAX_ACTING - 1], "other");
    assert_int_equal(q.u.pg_activate.phase, 1);
    assert_int_equal(q.u.pg_activate.wq, 2);
    assert_true(q.u.pg_activate.head_epoch == 8 && q.u.pg_activate.head_seq == 30);
    assert_int_equal(q.u.pg_activate.member, 1);
    wr_activate(&w, TSD_PG_MAX_ACTING + 1);
    assert_int_equal(dec(TS_OP_PG_ACTIVATE, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "pg-activate: 9 members (at most 8)");
    ts_wr_fini(&w);
}

/* READ: the range alone, or with the RDMA placement fields; anything else is refused. */
static void test_read_placement(void **state)
{
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u32(&w, 3);
    ts_wr_u64(&w, 4096);
    ts_wr_u32(&w, 1000);
    assert_int_equal(dec(TS_OP_READ, &w, &q), 0);
    assert_int_equal(q.u.read.placed, 0);
    assert_int_equal(q.u.read.len, 1000);
    tsd_req_free(&q);
    ts_wr_u64(&w, 0x7f0012340000ull);
    ts_wr_u32(&w, 0xabcd);
    ts_wr_u32(&w, 0);
    assert_int_equal(dec(TS_OP_READ, &w, &q), 0);
    assert_int_equal(q.u.read.placed, 1);
    assert_true(q.u.read.raddr == 0x7f0012340000ull);
    assert_int_equal(q.u.read.rkey, 0xabcd);
    tsd_req_free(&q);
    /* A placement cut short, or bytes after it. */
    w.len -= 2;
    assert_int_equal(dec(TS_OP_READ, &w, &q), TS_EPROTO);
    w.len += 2;
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_READ, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
    assert_int_equal(tsd_req_decode(TS_OP_RDMA_TOKEN, NULL, 0, &q, msg, sizeof(msg)), 0);
    tsd_req_free(&q);
}

/* READV: the ranges stay in the payload; counts out of 1..TS_READV_MAX and entries that do
 * not fill the count exactly are refused. */
static void test_readv(void **state)
{
    struct tsd_req q;
    struct ts_wr w;
    uint32_t shard, len;
    uint64_t off;

    ts_wr_init(&w);
    ts_wr_str(&w, NAME);
    ts_wr_u32(&w, 2);
    ts_wr_u32(&w, 7);
    ts_wr_u64(&w, 1ull << 40);
    ts_wr_u32(&w, 4096);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, 5);
    ts_wr_u32(&w, 0);
    assert_int_equal(dec(TS_OP_READV, &w, &q), 0);
    assert_string_equal(q.u.readv.name, NAME);
    assert_int_equal(q.u.readv.n, 2);
    tsd_readv_at(&q.u.readv, 0, &shard, &off, &len);
    assert_int_equal(shard, 7);
    assert_true(off == 1ull << 40);
    assert_int_equal(len, 4096);
    tsd_readv_at(&q.u.readv, 1, &shard, &off, &len);
    assert_int_equal(shard, 0);
    assert_true(off == 5);
    assert_int_equal(len, 0);
    tsd_req_free(&q);
    /* An entry cut short; a byte after the last one. */
    w.len -= 1;
    assert_int_equal(dec(TS_OP_READV, &w, &q), TS_EPROTO);
    w.len += 1;
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_READV, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
    /* No ranges (decoded: the handler refuses it), a count the payload cannot hold, no count. */
    for (int i = 0; i < 3; i++) {
        ts_wr_init(&w);
        ts_wr_str(&w, NAME);
        if (i < 2)
            ts_wr_u32(&w, i == 0 ? 0 : TS_READV_MAX + 1);
        assert_int_equal(dec(TS_OP_READV, &w, &q), i == 0 ? 0 : TS_EPROTO);
        if (i == 0) {
            assert_int_equal(q.u.readv.n, 0);
            tsd_req_free(&q);
        }
        ts_wr_fini(&w);
    }
}

static void test_map_push(void **state)
{
    struct ts_map_node nodes[1] = {{.id = "n1", .addr = "127.0.0.1:7101", .weight = 100}};
    struct ts_map map = {.epoch = 4, .pg_count = 8, .n = 1, .nodes = nodes};
    struct tsd_req q;
    struct ts_wr w;

    ts_wr_init(&w);
    ts_map_encode(&w, &map);
    assert_int_equal(dec(TS_OP_MAP_PUSH, &w, &q), 0);
    assert_non_null(q.u.map_push.map);
    assert_true(q.u.map_push.map->epoch == 4);
    assert_string_equal(q.u.map_push.map->nodes[0].id, "n1");
    tsd_req_free(&q);
    assert_null(q.u.map_push.map);
    ts_wr_u8(&w, 0);
    assert_int_equal(dec(TS_OP_MAP_PUSH, &w, &q), TS_EPROTO);
    assert_string_equal(msg, "map-push: malformed or invalid map (trailing bytes)");
    nodes[0].weight = 0; /* invalid */
    w.len = 0;
    ts_map_encode(&w, &map);
    assert_int_equal(dec(TS_OP_MAP_PUSH, &w, &q), TS_EPROTO);
    ts_wr_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_payloads),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_dataset_create_incarnation),
        cmocka_unit_test(test_dataset_seal_flags),
        cmocka_unit_test(test_dataset_tier),
        cmocka_unit_test(test_scrub_name),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_shard_seal_records),
        cmocka_unit_test(test_repl_seal_kinds),
        cmocka_unit_test(test_repl_seal_prune),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_pg_activate),
        cmocka_unit_test(test_map_push),
        cmocka_unit_test(test_read_placement),
        cmocka_unit_test(test_readv),
    };
    return cmocka_run_group_tests_name("requests", tests, NULL, NULL);
}
