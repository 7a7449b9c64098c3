/*
 * Request payload decoders: every request opcode's payload (docs/protocol.md "Opcodes") into a
 * typed struct, before any handler runs. Pure: looks at nothing but the payload it is given and
 * knows nothing of connections or workers, so the fuzz target (tests/fuzz/fuzz_frame.c) calls
 * exactly the code the server runs.
 *
 * Rules, for every opcode: nothing is read past the payload; success means the payload was
 * consumed exactly (trailing or missing bytes are TS_EPROTO); a field that must be a dataset
 * name and is not gives TS_ENAME. Large variable parts (chunk data, record offsets, REPL_SEAL's
 * prune list) stay in the payload: the request points at them, with their counts checked
 * against the bytes present, and is valid only as long as the payload is.
 */
#ifndef TSD_REQUESTS_H
#define TSD_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "ts_common.h"
#include "ts_proto.h"

struct ts_map;

#define TSD_HELLO_NAME_CAP 1024 /* HELLO's client name: at most 1023 bytes (TS_EPROTO beyond) */
#define TSD_NODE_ID_CAP 64      /* node ids in PG_* requests: at most 63 bytes */
#define TSD_PG_MAX_ACTING 8     /* PG_ACTIVATE's acting set (TS_PG_MAX_ACTING of the store) */
#define TSD_PRUNE_ENTRY_MIN 11  /* an empty str, u64 incarnation, u8 deleted */

/* n little-endian u64 values, left in the payload. */
struct tsd_u64s {
    const uint8_t *p; /* 8 * n bytes */
    uint32_t n;
};

static inline uint64_t tsd_u64s_at(const struct tsd_u64s *v, uint32_t i)
{
    return ts_get_le64(v->p + 8 * (size_t)i);
}

/* The chunk fields of SHARD_WRITE and REPL_WRITE. */
struct tsd_chunk {
    uint32_t shard;
    uint32_t idx;
    uint64_t size; /* the declared shard size (UINT64_MAX: unknown); read on index 0 */
    uint32_t crc;
    uint32_t len;
    const uint8_t *data; /* len bytes in the payload; NULL: a record without bytes */
};

struct tsd_req_hello {
    uint16_t version;
    uint16_t name_len; /* bytes on the wire (the name may hold NULs) */
    char name[TSD_HELLO_NAME_CAP];
};

struct tsd_req_dataset_create {
    char name[TS_NAME_MAX + 1];
    struct ts_dataset_policy policy;
    uint8_t has_inc;    /* the optional trailing u64 was sent */
    uint8_t has_format; /* and after it the optional u8 record format (in policy) */
    uint64_t inc;       /* 0 when not sent, or sent as 0: the node's clock */
};

/* DATASET_STAT, DATASET_DELETE, SHARD_LIST; SCRUB, where "" means every dataset. */
struct tsd_req_dataset {
    char name[TS_NAME_MAX + 1];
};

/* CHUNK_REPAIR (issue 33): good bytes for chunk idx of a fragment (NAME#f) of shard. */
struct tsd_req_chunk_repair {
    char name[TS_NAME_MAX + 1];
    uint32_t shard, idx, len;
    const uint8_t *data; /* in the payload */
};

/* DATASET_TIER (issue 33): the dataset's erasure code; k = m = 0: replicated only. */
struct tsd_req_dataset_tier {
    char name[TS_NAME_MAX + 1];
    uint8_t k, m;
    uint8_t dropped; /* the replicas' bytes: 1 dropped, 0 kept (restored) */
};

struct tsd_req_dataset_seal {
    char name[TS_NAME_MAX + 1];
    uint8_t has_flags; /* the optional trailing flags byte was sent */
    uint8_t flags;     /* TS_SEAL_*; 0 when not sent */
};

struct tsd_req_shard_write {
    char name[TS_NAME_MAX + 1];
    struct tsd_chunk chunk;
};

struct tsd_req_shard_seal {
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    uint8_t have_crc;
    uint32_t crc;
    struct tsd_u64s records;
};

struct tsd_req_read {
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t off;
    uint32_t len; /* not checked against TS_MAX_READ here: the handler answers TS_ETOOBIG */
    /* Where the data goes (flag TS_F_RDMA; then these follow the range). */
    uint8_t placed;
    uint64_t raddr;
    uint32_t rkey;
};

/* READV: n ranges (TS_READV_ENTRY bytes each, filling the rest of the payload), left in the
 * payload; the handler refuses n = 0 or n > TS_READV_MAX. */
struct tsd_req_readv {
    char name[TS_NAME_MAX + 1];
    const uint8_t *p;
    uint32_t n;
};

/* Range i of a READV. */
static inline void tsd_readv_at(const struct tsd_req_readv *v, uint32_t i, uint32_t *shard,
                                uint64_t *off, uint32_t *len)
{
    const uint8_t *e = v->p + (size_t)TS_READV_ENTRY * i;

    *shard = ts_get_le32(e);
    *off = ts_get_le64(e + 4);
    *len = ts_get_le32(e + 12);
}

struct tsd_req_shard_stat {
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
};

struct tsd_req_map_push {
    struct ts_map *map; /* decoded and validated; owned by the request (tsd_req_free) */
};

struct tsd_req_repl_write {
    char name[TS_NAME_MAX + 1];
    struct ts_dataset_policy policy;
    uint64_t inc;
    struct tsd_chunk chunk;
};

/* REPL_SEAL kind 8: the primary's datasets and tombstones, left in the payload. */
struct tsd_prune_list {
    const uint8_t *p; /* n entries, back to back, len bytes; checked by the decoder */
    size_t len;
    uint32_t n;
};

struct tsd_prune_entry {
    char name[TS_NAME_MAX + 1]; /* a str of at most 128 bytes, not checked as a name */
    uint16_t name_len;
    uint64_t inc;
    uint8_t deleted;
};

struct tsd_req_repl_seal {
    uint8_t kind; /* enum ts_repl_kind; an unknown kind decodes (like a nameless one) */
    uint32_t pg;
    uint64_t seq;
    uint64_t epoch;
    /* Kinds SEAL, BACKFILL, DELETE and ABORT carry a dataset name; the others carry a u16 in
     * its place that is read and ignored (no bytes follow it; senders write 0). */
    char name[TS_NAME_MAX + 1];
    uint16_t unnamed;
    struct ts_dataset_policy policy;
    uint64_t inc;
    uint32_t shard;
    uint8_t have_crc;
    uint32_t crc;
    struct tsd_u64s records;     /* every kind but PRUNE */
    struct tsd_prune_list prune; /* PRUNE */
};

struct tsd_req_pg_info {
    uint32_t pg;
};

/* PG_DROP: u32 pg, then optionally str dataset (only that dataset's copies; "" every one). */
struct tsd_req_pg_drop {
    uint32_t pg;
    char dataset[TS_NAME_MAX + 1];
    uint16_t dataset_len;
    uint8_t has_dataset; /* the field was sent ("" and no field both mean every dataset) */
};

struct tsd_req_pg_query {
    uint32_t pg;
    uint64_t epoch;
    uint16_t from_len;
    char from[TSD_NODE_ID_CAP];
};

struct tsd_req_pg_activate {
    uint32_t pg;
    uint64_t epoch;
    uint8_t phase; /* 0 prepare, 1 commit */
    uint8_t wq;
    uint8_t n; /* <= TSD_PG_MAX_ACTING */
    uint16_t acting_len[TSD_PG_MAX_ACTING];
    char acting[TSD_PG_MAX_ACTING][TSD_NODE_ID_CAP];
    uint64_t head_epoch;
    uint64_t head_seq;
    uint8_t member;
};

struct tsd_req_pg_pull {
    uint32_t pg;
    uint64_t epoch;
    uint16_t node_len;
    char node[TSD_NODE_ID_CAP];
    uint8_t recheck;
};

struct tsd_req_pg_inventory {
    uint32_t pg;
    uint8_t rank; /* the asking replica's placement rank in the PG */
};

/* A decoded request: op says which member is filled (DATASET_LIST, STATUS and MAP_GET have
 * an empty payload and no member). */
struct tsd_req {
    uint8_t op; /* enum ts_opcode */
    union {
        struct tsd_req_hello hello;
        struct tsd_req_dataset_create dataset_create;
        struct tsd_req_dataset dataset_stat;
        struct tsd_req_dataset_seal dataset_seal;
        struct tsd_req_dataset_tier dataset_tier;
        struct tsd_req_chunk_repair chunk_repair;
        struct tsd_req_dataset dataset_delete;
        struct tsd_req_shard_write shard_write;
        struct tsd_req_shard_seal shard_seal;
        struct tsd_req_read read;
        struct tsd_req_readv readv;
        struct tsd_req_readv hint; /* the same fields */
        struct tsd_req_shard_stat shard_stat;
        struct tsd_req_shard_stat shard_records; /* the same fields */
        struct tsd_req_dataset shard_list;
        struct tsd_req_dataset scrub;
        struct tsd_req_map_push map_push;
        struct tsd_req_repl_write repl_write;
        struct tsd_req_repl_seal repl_seal;
        struct tsd_req_pg_info pg_info;
        struct tsd_req_pg_drop pg_drop;
        struct tsd_req_pg_query pg_query;
        struct tsd_req_pg_activate pg_activate;
        struct tsd_req_pg_pull pg_pull;
        struct tsd_req_pg_inventory pg_inventory;
    } u;
};

/*
 * Decodes the payload p[0..len) of a request of opcode op into *q. Returns 0, or TS_EPROTO
 * (malformed), TS_ENAME (an invalid dataset name), TS_ENOMEM, or TS_ENOTSUP (not a request
 * opcode) with a message for the reply in msg[msglen]. On failure *q holds nothing to free;
 * on success the caller calls tsd_req_free(q). p may be NULL when len is 0.
 */
int tsd_req_decode(unsigned op, const uint8_t *p, size_t len, struct tsd_req *q, char *msg,
                   size_t msglen);
void tsd_req_free(struct tsd_req *q);

/* The prune list's entry at byte offset off (0 for the first); returns the next entry's offset.
 * Only for a list that tsd_req_decode returned, at offsets it returned. */
size_t tsd_prune_entry_at(const struct tsd_prune_list *l, size_t off, struct tsd_prune_entry *e);

#endif
