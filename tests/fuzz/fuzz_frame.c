/*
 * Fuzz target for the frame parser (common/proto.c), the server's request decoders
 * (server/requests.c, the very code tesserad runs before a handler) and the client's reply
 * decoding.
 *
 * Each input is treated as bytes arriving on a connection: the header is parsed at several
 * payload limits and every prefix of it; when a header parses, its payload is decoded the way
 * the server decodes a request (tsd_req_decode), or a client a reply when the REPLY flag is
 * set, from a copy of exactly the payload's size so that a sanitizer sees any read past its
 * end. Because random bytes almost never carry a valid header CRC, each input is also tried
 * with its CRC (and then its length) repaired, which lets the fuzzer reach the decoders.
 *
 * Invariants (a violation aborts):
 *   - ts_frame_parse returns 0, TS_HDR_LEN, TS_EPROTO or TS_ETOOBIG, and 0 only for a short
 *     input whose bytes so far match the magic;
 *   - for a whole header the result is exactly the one docs/protocol.md gives (computed here
 *     independently), at every limit, and does not depend on the bytes after the header;
 *   - a header that parsed re-encodes to the identical TS_HDR_LEN bytes;
 *   - a request decode returns 0, TS_EPROTO, TS_ENAME or TS_ENOMEM, the same with or without
 *     room for its message, and a message when it fails; what it hands out is sound (valid
 *     names, strings as long as the wire says, views that lie inside the payload);
 *   - a request that decodes was consumed exactly: this file's own encoder (written from
 *     docs/protocol.md, independent of the decoder) turns the decoded struct back into the
 *     identical payload. (The one exception: a MAP_PUSH map whose strings hold a NUL, which a
 *     C string ends; it must then decode again to the same map.)
 *   - the reply reader never moves past its length, and a reply that decodes was consumed
 *     exactly.
 *
 * Built twice (tests/fuzz/CMakeLists.txt): as the libFuzzer target fuzz_frame, and linked with
 * smoke_main.c into fuzz_frame_smoke, a deterministic driver that runs in ctest.
 */
#include "requests.h"
#include "ts_map.h"
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
#define MSG_CAP 192 /* the server's buffer for a decode failure's message */

static size_t rd_left(const struct ts_rd *r)
{
    CHECK(r->off <= r->len);
    return r->len - r->off;
}

/* ---- requests: decoded by the server's decoder, re-encoded here ---------------------------- */

/* [q, q+n) lies inside [p, p+len). */
static int inside(const uint8_t *p, size_t len, const uint8_t *q, size_t n)
{
    return q && q >= p && (size_t)(q - p) <= len && n <= len - (size_t)(q - p);
}

/* A string the decoder copied out: as long as the wire said, terminated, within its buffer. */
static void check_str(const char *s, size_t cap, uint16_t len)
{
    CHECK(len < cap);
    CHECK(s[len] == '\0');
}

static void check_name(const char *name, int may_be_empty)
{
    CHECK(strlen(name) <= TS_NAME_MAX);
    CHECK(ts_name_valid(name) || (may_be_empty && name[0] == '\0'));
}

/* The shard operations' names: a dataset's, or one of its fragment stores (NAME#f). */
static void check_store_name(const char *name)
{
    CHECK(strlen(name) <= TS_NAME_MAX);
    CHECK(ts_name_valid_store(name));
}

static void wr_name(struct ts_wr *w, const char *name)
{
    ts_wr_str(w, name); /* a valid name has no NUL: strlen is its length */
}

/* A str with its bytes (which may hold NULs) and its length on the wire. */
static void wr_str_len(struct ts_wr *w, const char *s, uint16_t len)
{
    ts_wr_u16(w, len);
    ts_wr_bytes(w, s, len);
}

static void wr_chunk(struct ts_wr *w, const struct tsd_chunk *k)
{
    ts_wr_u32(w, k->shard);
    ts_wr_u32(w, k->idx);
    ts_wr_u64(w, k->size);
    ts_wr_u32(w, k->crc);
    ts_wr_u32(w, k->len);
    if (k->data) /* none: a chunk's record without its bytes (REPL_WRITE, bytes dropped) */
        ts_wr_bytes(w, k->data, k->len);
}

static void wr_ds_fields(struct ts_wr *w, const struct ts_dataset_policy *p, uint64_t inc)
{
    ts_wr_u8(w, p->core);
    ts_wr_u8(w, p->fringe);
    ts_wr_u8(w, p->min_core);
    ts_wr_u32(w, p->chunk_size);
    ts_wr_u8(w, p->record_format);
    ts_wr_u8(w, p->ec_k);
    ts_wr_u8(w, p->ec_m);
    ts_wr_u8(w, p->ec_dropped);
    ts_wr_u64(w, inc);
}

static void wr_u64s(struct ts_wr *w, const struct tsd_u64s *v)
{
    ts_wr_u32(w, v->n);
    for (uint32_t i = 0; i < v->n; i++)
        ts_wr_u64(w, tsd_u64s_at(v, i));
}

/* REPL_SEAL kind 8's list, read back with the server's own accessor. */
static void wr_prune(struct ts_wr *w, const struct tsd_prune_list *l)
{
    size_t off = 0;

    ts_wr_u32(w, l->n);
    for (uint32_t i = 0; i < l->n; i++) {
        struct tsd_prune_entry e;
        size_t next = tsd_prune_entry_at(l, off, &e);

        CHECK(next > off && next <= l->len);
        check_str(e.name, sizeof(e.name), e.name_len);
        wr_str_len(w, e.name, e.name_len);
        ts_wr_u64(w, e.inc);
        ts_wr_u8(w, e.deleted);
        off = next;
    }
    CHECK(off == l->len);
}

/* Encodes a decoded request the way docs/protocol.md lays it out. */
static void encode_request(struct ts_wr *w, const struct tsd_req *q)
{
    switch (q->op) {
    case TS_OP_HELLO:
        ts_wr_u16(w, q->u.hello.version);
        wr_str_len(w, q->u.hello.name, q->u.hello.name_len);
        break;
    case TS_OP_DATASET_CREATE: {
        const struct tsd_req_dataset_create *a = &q->u.dataset_create;
        wr_name(w, a->name);
        ts_wr_u8(w, a->policy.core);
        ts_wr_u8(w, a->policy.fringe);
        ts_wr_u8(w, a->policy.min_core);
        ts_wr_u32(w, a->policy.chunk_size);
        if (a->has_inc)
            ts_wr_u64(w, a->inc);
        if (a->has_format)
            ts_wr_u8(w, a->policy.record_format);
        break;
    }
    case TS_OP_DATASET_LIST:
    case TS_OP_STATUS:
    case TS_OP_MAP_GET:
    case TS_OP_RDMA_TOKEN:
        break;
    case TS_OP_DATASET_STAT:
        wr_name(w, q->u.dataset_stat.name);
        break;
    case TS_OP_DATASET_SEAL:
        wr_name(w, q->u.dataset_seal.name);
        if (q->u.dataset_seal.has_flags)
            ts_wr_u8(w, q->u.dataset_seal.flags);
        break;
    case TS_OP_DATASET_DELETE:
        wr_name(w, q->u.dataset_delete.name);
        break;
    case TS_OP_SHARD_WRITE:
        wr_name(w, q->u.shard_write.name);
        wr_chunk(w, &q->u.shard_write.chunk);
        break;
    case TS_OP_SHARD_SEAL:
        wr_name(w, q->u.shard_seal.name);
        ts_wr_u32(w, q->u.shard_seal.shard);
        ts_wr_u8(w, q->u.shard_seal.have_crc);
        ts_wr_u32(w, q->u.shard_seal.crc);
        wr_u64s(w, &q->u.shard_seal.records);
        break;
    case TS_OP_READ:
        wr_name(w, q->u.read.name);
        ts_wr_u32(w, q->u.read.shard);
        ts_wr_u64(w, q->u.read.off);
        ts_wr_u32(w, q->u.read.len);
        if (q->u.read.placed) {
            ts_wr_u64(w, q->u.read.raddr);
            ts_wr_u32(w, q->u.read.rkey);
            ts_wr_u32(w, 0);
        }
        break;
    case TS_OP_READV:
    case TS_OP_HINT: /* the same fields */
        wr_name(w, q->u.readv.name);
        ts_wr_u32(w, q->u.readv.n);
        ts_wr_bytes(w, q->u.readv.p, (size_t)q->u.readv.n * TS_READV_ENTRY);
        break;
    case TS_OP_SHARD_STAT:
    case TS_OP_SHARD_RECORDS:
        wr_name(w, q->u.shard_stat.name);
        ts_wr_u32(w, q->u.shard_stat.shard);
        break;
    case TS_OP_SHARD_LIST:
        wr_name(w, q->u.shard_list.name);
        break;
    case TS_OP_SCRUB:
        wr_name(w, q->u.scrub.name); /* "" (every dataset) is a zero length */
        break;
    case TS_OP_MAP_PUSH:
        ts_map_encode(w, q->u.map_push.map);
        break;
    case TS_OP_REPL_WRITE:
        wr_name(w, q->u.repl_write.name);
        wr_ds_fields(w, &q->u.repl_write.policy, q->u.repl_write.inc);
        wr_chunk(w, &q->u.repl_write.chunk);
        break;
    case TS_OP_REPL_SEAL: {
        const struct tsd_req_repl_seal *a = &q->u.repl_seal;
        int named = a->kind == TS_REPL_SEAL || a->kind == TS_REPL_BACKFILL ||
                    a->kind == TS_REPL_DELETE || a->kind == TS_REPL_ABORT;
        ts_wr_u8(w, a->kind);
        ts_wr_u32(w, a->pg);
        ts_wr_u64(w, a->seq);
        ts_wr_u64(w, a->epoch);
        if (named)
            wr_name(w, a->name);
        else
            ts_wr_u16(w, a->unnamed); /* a u16 in the name's place, no bytes after it */
        wr_ds_fields(w, &a->policy, a->inc);
        ts_wr_u32(w, a->shard);
        ts_wr_u8(w, a->have_crc);
        ts_wr_u32(w, a->crc);
        if (a->kind == TS_REPL_PRUNE)
            wr_prune(w, &a->prune);
        else
            wr_u64s(w, &a->records);
        break;
    }
    case TS_OP_PG_INFO:
        ts_wr_u32(w, q->u.pg_info.pg);
        break;
    case TS_OP_PG_DROP:
        ts_wr_u32(w, q->u.pg_drop.pg);
        if (q->u.pg_drop.has_dataset)
            wr_str_len(w, q->u.pg_drop.dataset, q->u.pg_drop.dataset_len);
        break;
    case TS_OP_PG_QUERY:
        ts_wr_u32(w, q->u.pg_query.pg);
        ts_wr_u64(w, q->u.pg_query.epoch);
        wr_str_len(w, q->u.pg_query.from, q->u.pg_query.from_len);
        break;
    case TS_OP_PG_ACTIVATE: {
        const struct tsd_req_pg_activate *a = &q->u.pg_activate;
        ts_wr_u32(w, a->pg);
        ts_wr_u64(w, a->epoch);
        ts_wr_u8(w, a->phase);
        ts_wr_u8(w, a->wq);
        ts_wr_u8(w, a->n);
        for (unsigned i = 0; i < a->n; i++)
            wr_str_len(w, a->acting[i], a->acting_len[i]);
        ts_wr_u64(w, a->head_epoch);
        ts_wr_u64(w, a->head_seq);
        ts_wr_u8(w, a->member);
        break;
    }
    case TS_OP_PG_PULL:
        ts_wr_u32(w, q->u.pg_pull.pg);
        ts_wr_u64(w, q->u.pg_pull.epoch);
        wr_str_len(w, q->u.pg_pull.node, q->u.pg_pull.node_len);
        ts_wr_u8(w, q->u.pg_pull.recheck);
        break;
    case TS_OP_PG_INVENTORY:
        ts_wr_u32(w, q->u.pg_inventory.pg);
        ts_wr_u8(w, q->u.pg_inventory.rank);
        break;
    case TS_OP_CHUNK_REPAIR:
        wr_name(w, q->u.chunk_repair.name);
        ts_wr_u32(w, q->u.chunk_repair.shard);
        ts_wr_u32(w, q->u.chunk_repair.idx);
        ts_wr_u32(w, q->u.chunk_repair.len);
        ts_wr_bytes(w, q->u.chunk_repair.data, q->u.chunk_repair.len);
        break;
    case TS_OP_DATASET_TIER:
        wr_name(w, q->u.dataset_tier.name);
        ts_wr_u8(w, q->u.dataset_tier.k);
        ts_wr_u8(w, q->u.dataset_tier.m);
        ts_wr_u8(w, q->u.dataset_tier.dropped);
        break;
    default:
        CHECK(!"a request opcode the encoder does not know");
    }
}

/* What the decoder hands out is sound: names valid, strings as long as the wire said, the
 * views into the payload inside it, counts within their bounds. */
static void check_decoded(const struct tsd_req *q, const uint8_t *p, size_t len)
{
    switch (q->op) {
    case TS_OP_HELLO:
        check_str(q->u.hello.name, sizeof(q->u.hello.name), q->u.hello.name_len);
        break;
    case TS_OP_DATASET_CREATE:
        check_name(q->u.dataset_create.name, 0);
        CHECK(q->u.dataset_create.has_inc || q->u.dataset_create.inc == 0);
        CHECK(q->u.dataset_create.has_inc || !q->u.dataset_create.has_format);
        CHECK(q->u.dataset_create.has_format || q->u.dataset_create.policy.record_format == 0);
        break;
    case TS_OP_DATASET_STAT:
        check_name(q->u.dataset_stat.name, 0);
        break;
    case TS_OP_DATASET_SEAL:
        check_name(q->u.dataset_seal.name, 0);
        CHECK(q->u.dataset_seal.has_flags || q->u.dataset_seal.flags == 0);
        break;
    case TS_OP_DATASET_DELETE:
        check_name(q->u.dataset_delete.name, 0);
        break;
    case TS_OP_DATASET_TIER:
        check_name(q->u.dataset_tier.name, 0);
        break;
    case TS_OP_CHUNK_REPAIR:
        check_store_name(q->u.chunk_repair.name);
        CHECK(inside(p, len, q->u.chunk_repair.data, q->u.chunk_repair.len));
        break;
    case TS_OP_SHARD_WRITE:
        check_store_name(q->u.shard_write.name);
        CHECK(inside(p, len, q->u.shard_write.chunk.data, q->u.shard_write.chunk.len));
        break;
    case TS_OP_SHARD_SEAL:
        check_store_name(q->u.shard_seal.name);
        CHECK(inside(p, len, q->u.shard_seal.records.p, 8 * (size_t)q->u.shard_seal.records.n));
        break;
    case TS_OP_READ:
        check_store_name(q->u.read.name);
        break;
    case TS_OP_SHARD_STAT:
    case TS_OP_SHARD_RECORDS:
        check_store_name(q->u.shard_stat.name);
        break;
    case TS_OP_SHARD_LIST:
        check_name(q->u.shard_list.name, 0);
        break;
    case TS_OP_SCRUB:
        check_name(q->u.scrub.name, 1);
        break;
    case TS_OP_MAP_PUSH: {
        const struct ts_map *m = q->u.map_push.map;
        CHECK(m && m->n >= 1 && m->n <= TS_MAP_MAX_NODES);
        CHECK(m->pg_count >= 1 && m->pg_count <= TS_MAP_MAX_PGS);
        break;
    }
    case TS_OP_REPL_WRITE:
        check_name(q->u.repl_write.name, 0);
        /* Its bytes in the payload, or none where the dataset's replica bytes are dropped. */
        CHECK(q->u.repl_write.policy.ec_dropped
                  ? !q->u.repl_write.chunk.data
                  : inside(p, len, q->u.repl_write.chunk.data, q->u.repl_write.chunk.len));
        break;
    case TS_OP_REPL_SEAL: {
        const struct tsd_req_repl_seal *a = &q->u.repl_seal;
        int named = a->kind == TS_REPL_SEAL || a->kind == TS_REPL_BACKFILL ||
                    a->kind == TS_REPL_DELETE || a->kind == TS_REPL_ABORT;
        check_name(a->name, !named);
        CHECK(named || a->name[0] == '\0');
        if (a->kind == TS_REPL_PRUNE) {
            CHECK(inside(p, len, a->prune.p, a->prune.len));
            CHECK(a->prune.n <= a->prune.len / TSD_PRUNE_ENTRY_MIN);
        } else {
            CHECK(inside(p, len, a->records.p, 8 * (size_t)a->records.n));
        }
        break;
    }
    case TS_OP_PG_QUERY:
        check_str(q->u.pg_query.from, sizeof(q->u.pg_query.from), q->u.pg_query.from_len);
        break;
    case TS_OP_PG_ACTIVATE:
        CHECK(q->u.pg_activate.n <= TSD_PG_MAX_ACTING);
        for (unsigned i = 0; i < q->u.pg_activate.n; i++)
            check_str(q->u.pg_activate.acting[i], sizeof(q->u.pg_activate.acting[i]),
                      q->u.pg_activate.acting_len[i]);
        break;
    case TS_OP_PG_PULL:
        check_str(q->u.pg_pull.node, sizeof(q->u.pg_pull.node), q->u.pg_pull.node_len);
        break;
    default:
        break;
    }
}

/* Whether a map on the wire (one that decoded) has a string holding a NUL byte. */
static int map_wire_has_nul(const uint8_t *p, size_t len)
{
    struct ts_rd r;
    uint32_t n;

    ts_rd_init(&r, p, len);
    ts_rd_u64(&r);
    ts_rd_u32(&r);
    n = ts_rd_u32(&r);
    for (uint32_t i = 0; i < n && !r.err; i++) {
        for (int k = 0; k < 5; k++) { /* id, addr, tls_addr, (u32 weight), domain */
            uint16_t sl;
            const uint8_t *b;

            if (k == 3) {
                ts_rd_u32(&r);
                continue;
            }
            sl = ts_rd_u16(&r);
            b = ts_rd_bytes(&r, sl);
            if (b && memchr(b, 0, sl))
                return 1;
        }
        ts_rd_u8(&r);
    }
    CHECK(!r.err);
    return 0;
}

static int maps_equal(const struct ts_map *a, const struct ts_map *b)
{
    if (a->epoch != b->epoch || a->pg_count != b->pg_count || a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        const struct ts_map_node *x = &a->nodes[i], *y = &b->nodes[i];
        if (strcmp(x->id, y->id) || strcmp(x->addr, y->addr) || strcmp(x->tls_addr, y->tls_addr) ||
            strcmp(x->domain, y->domain) || x->weight != y->weight || x->state != y->state)
            return 0;
    }
    return 1;
}

static int check_request(uint8_t op, const uint8_t *p, size_t len)
{
    char *msg = malloc(MSG_CAP); /* exactly its size: a write past it is seen */
    struct tsd_req q, again;
    struct ts_wr w;
    int rc, rc2;

    CHECK(msg);
    msg[0] = '\0';
    rc = tsd_req_decode(op, p, len, &q, msg, MSG_CAP);
    CHECK(rc == 0 || rc == TS_EPROTO || rc == TS_ENAME || rc == TS_ENOMEM);
    CHECK(q.op == op);
    /* The same answer without room for a message (and nothing written to it). */
    rc2 = tsd_req_decode(op, p, len, &again, NULL, 0);
    CHECK(rc2 == rc);
    if (rc2 == 0)
        tsd_req_free(&again);
    if (rc) {
        CHECK(memchr(msg, '\0', MSG_CAP) != NULL);
        CHECK(msg[0] != '\0');
        free(msg);
        return rc;
    }
    free(msg);

    check_decoded(&q, p, len);
    /* Consumed exactly: the decoded struct encodes back to the identical payload. */
    ts_wr_init(&w);
    encode_request(&w, &q);
    CHECK(w.err == 0);
    if (op == TS_OP_MAP_PUSH && map_wire_has_nul(p, len)) {
        /* C strings end at the NUL: what re-encodes must decode to the same map. */
        struct tsd_req back;
        CHECK(w.len < len);
        CHECK(tsd_req_decode(op, w.buf, w.len, &back, NULL, 0) == 0);
        CHECK(maps_equal(q.u.map_push.map, back.u.map_push.map));
        tsd_req_free(&back);
    } else {
        CHECK(w.len == len);
        CHECK(len == 0 || memcmp(w.buf, p, len) == 0);
    }
    ts_wr_fini(&w);
    tsd_req_free(&q);
    return 0;
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
    CHECK(rc || r->off == before + 2 + name_len + 44);
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
    case TS_OP_SHARD_RECORDS:
        n = rd_count(r, 8);
        for (uint32_t i = 0; i < n && !r->err; i++)
            ts_rd_u64(r);
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
