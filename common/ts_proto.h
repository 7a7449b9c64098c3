/*
 * The tessera wire protocol: one frame format for every transport (docs/protocol.md).
 *
 * Frame = 32-byte header + payload. Header, all little-endian:
 *   0  u32 magic      TS_MAGIC ("TSRA" on the wire)
 *   4  u8  version    TS_PROTO_VERSION
 *   5  u8  opcode     enum ts_opcode
 *   6  u16 flags      TS_F_REPLY on replies; other bits reserved (must be 0)
 *   8  u64 request id chosen by the requester; the reply carries the same id
 *   16 u64 map epoch  the sender's cluster map epoch (0: none)
 *   24 u32 length     payload bytes that follow the header
 *   28 u32 hdr crc    CRC32C of bytes 0..27
 *
 * Every reply payload starts with an i32 status (0 or a TS_E* code); a failed reply then
 * carries a u16-length error message and nothing else.
 */
#ifndef TS_PROTO_H
#define TS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "ts_common.h"

#define TS_MAGIC 0x41525354u /* bytes 'T' 'S' 'R' 'A' */
#define TS_PROTO_VERSION 1
#define TS_HDR_LEN 32
#define TS_F_REPLY 0x0001u
/* On a READ request: read from the store, not from cached copies (the client found a piece
 * failing its CRC and asks once more); the node evicts the range's cached chunks first. */
#define TS_F_VERIFY 0x0002u
/* On a READ over an RDMA session: the data is placed by RDMA WRITE at the address the request
 * names (u64 address, u32 rkey, u32 reserved after the range), not carried in the reply; the
 * reply (flag set too) holds the head and the piece table only and is sent after the writes. */
#define TS_F_RDMA 0x0004u
/* On a DATASET_STAT request: the dataset's own record only (name, id, policy, state); its
 * shards and bytes are not counted (0 in the reply). A writer learns the chunk size in O(1):
 * counting scans every shard record of the dataset. */
#define TS_F_BRIEF 0x0008u
#define TS_F_KNOWN (TS_F_REPLY | TS_F_VERIFY | TS_F_RDMA | TS_F_BRIEF)

/* RDMA sessions (docs/protocol.md "RDMA"). */
#define TS_RDMA_TOKEN_LEN 16
#define TS_RDMA_MSG (64u << 10)        /* the largest SEND either side posts; RECVs are this big */
#define TS_RDMA_PRIV_MAGIC 0x414d4452u /* "RDMA": the connect request's private data begins so */

/* REPL_SEAL kinds. */
enum ts_repl_kind {
    TS_REPL_SEAL = 1,        /* seal the shard uploaded on this connection; log it as seq */
    TS_REPL_NOOP = 2,        /* log seq with nothing to apply */
    TS_REPL_BACKFILL = 3,    /* seal without a log record (backfill of a trimmed log) */
    TS_REPL_SET_APPLIED = 4, /* backfill done: the PG's head is (epoch, seq) */
    TS_REPL_TRUNCATE = 5,    /* roll the PG's log back to entry seq (of epoch): peering */
    TS_REPL_DELETE = 6,      /* log entry seq: dataset incarnation inc was deleted */
    TS_REPL_CLEAN = 7,       /* the replica holds the primary's log up to seq: it may serve */
    TS_REPL_PRUNE = 8,       /* before a backfill: the primary's datasets (name, incarnation) */
    TS_REPL_ABORT = 9,       /* the upload of (name, shard) on this connection ended */
};

/* DATASET_SEAL flags (optional trailing u8). */
#define TS_SEAL_LOCAL_ONLY 0x01

/*
 * Roles. none < reader < writer < admin are ordered: each may do everything the ones below it
 * may. node (a storage daemon, authenticated by its node certificate) stands apart: it may do
 * what a reader may plus the node-to-node operations (REPL_*, PG_*) and MAP_PUSH, and nothing
 * else; no other role may do the node-to-node operations. TS_ROLE_ADMIN_OR_NODE is only a
 * requirement (MAP_PUSH), never a connection's role.
 */
enum ts_role {
    TS_ROLE_NONE = 0,
    TS_ROLE_READER = 1,
    TS_ROLE_WRITER = 2,
    TS_ROLE_ADMIN = 3,
    TS_ROLE_NODE = 4,
    TS_ROLE_ADMIN_OR_NODE = 5,
};
const char *ts_role_name(int role);
int ts_role_parse(const char *name); /* none|reader|writer|admin|node; TS_EINVAL if unknown */
/* Whether a connection of role may do an operation that needs `need` (a table entry's role). */
int ts_role_may(int role, int need);

#define TS_SMALL_PAYLOAD (64u << 10)
#define TS_MAX_CHUNK (64u << 20)
#define TS_MAX_READ (64u << 20) /* largest range one READ may ask for */
/* READV: many small ranges (of any shards of one dataset) in one request and one reply. */
#define TS_READV_MAX 256          /* ranges per READV */
#define TS_READV_BYTES (4u << 20) /* bytes asked for by one READV, all ranges together */
#define TS_READV_ENTRY 16         /* request bytes per range: u32 shard, u64 offset, u32 length */
#define TS_READV_RESULT 12        /* reply bytes per range: i32 status, u32 length, u32 CRC32C */
/* HINT: ranges a reader will read next (as READV's entries), for the node to read ahead. */
#define TS_HINT_MAX 256 /* ranges per HINT */

/* X(name, value, wire name, minimum role, largest request payload) */
#define TS_OPCODE_TABLE(X)                                                                         \
    X(HELLO, 1, "hello", TS_ROLE_NONE, TS_SMALL_PAYLOAD)                                           \
    X(DATASET_CREATE, 2, "dataset-create", TS_ROLE_WRITER, TS_SMALL_PAYLOAD)                       \
    X(DATASET_LIST, 3, "dataset-list", TS_ROLE_READER, TS_SMALL_PAYLOAD)                           \
    X(DATASET_STAT, 4, "dataset-stat", TS_ROLE_READER, TS_SMALL_PAYLOAD)                           \
    X(DATASET_SEAL, 5, "dataset-seal", TS_ROLE_WRITER, TS_SMALL_PAYLOAD)                           \
    X(DATASET_DELETE, 6, "dataset-delete", TS_ROLE_ADMIN, TS_SMALL_PAYLOAD)                        \
    X(SHARD_WRITE, 7, "shard-write", TS_ROLE_WRITER, TS_MAX_CHUNK + 4096)                          \
    X(SHARD_SEAL, 8, "shard-seal", TS_ROLE_WRITER, 16u << 20)                                      \
    X(READ, 9, "read", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                           \
    X(SHARD_STAT, 10, "shard-stat", TS_ROLE_READER, TS_SMALL_PAYLOAD)                              \
    X(SHARD_LIST, 11, "shard-list", TS_ROLE_READER, TS_SMALL_PAYLOAD)                              \
    X(SCRUB, 12, "scrub", TS_ROLE_WRITER, TS_SMALL_PAYLOAD)                                        \
    X(STATUS, 13, "status", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                      \
    X(MAP_GET, 14, "map-get", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                    \
    X(MAP_PUSH, 15, "map-push", TS_ROLE_ADMIN_OR_NODE, 1u << 20)                                   \
    X(REPL_WRITE, 16, "repl-write", TS_ROLE_NODE, TS_MAX_CHUNK + 4096)                             \
    X(REPL_SEAL, 17, "repl-seal", TS_ROLE_NODE, 16u << 20)                                         \
    X(PG_INFO, 18, "pg-info", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                    \
    X(PG_QUERY, 19, "pg-query", TS_ROLE_NODE, TS_SMALL_PAYLOAD)                                    \
    X(PG_ACTIVATE, 20, "pg-activate", TS_ROLE_NODE, TS_SMALL_PAYLOAD)                              \
    X(PG_PULL, 21, "pg-pull", TS_ROLE_NODE, TS_SMALL_PAYLOAD)                                      \
    X(PG_INVENTORY, 22, "pg-inventory", TS_ROLE_READER, TS_SMALL_PAYLOAD)                          \
    X(SHARD_RECORDS, 23, "shard-records", TS_ROLE_READER, TS_SMALL_PAYLOAD)                        \
    X(RDMA_TOKEN, 24, "rdma-token", TS_ROLE_READER, TS_SMALL_PAYLOAD)                              \
    X(PG_DROP, 25, "pg-drop", TS_ROLE_ADMIN, TS_SMALL_PAYLOAD)                                     \
    X(READV, 26, "readv", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                        \
    X(HINT, 27, "hint", TS_ROLE_READER, TS_SMALL_PAYLOAD)                                          \
    X(DATASET_TIER, 28, "dataset-tier", TS_ROLE_ADMIN, TS_SMALL_PAYLOAD)                           \
    X(CHUNK_REPAIR, 29, "chunk-repair", TS_ROLE_ADMIN, TS_MAX_CHUNK + 4096)

enum ts_opcode {
#define TS_OPCODE_ENUM(name, value, wire, role, max) TS_OP_##name = value,
    TS_OPCODE_TABLE(TS_OPCODE_ENUM)
#undef TS_OPCODE_ENUM
        TS_OP_MAX
};

struct ts_op_desc {
    const char *name;
    int min_role;
    uint32_t max_payload;
};
/* The table entry of an opcode, or NULL if unknown. */
const struct ts_op_desc *ts_op_desc(unsigned opcode);

struct ts_frame_hdr {
    uint8_t version;
    uint8_t opcode;
    uint16_t flags;
    uint64_t req_id;
    uint64_t epoch;
    uint32_t length;
};

/*
 * Parses a frame header from buf. Pure: looks at nothing but (buf, len).
 * Returns TS_HDR_LEN when a valid header was parsed into *h, 0 when more bytes are needed,
 * TS_EPROTO for a bad magic, version, reserved flag or header CRC, TS_ETOOBIG when the payload
 * length exceeds max_payload. The payload itself is not looked at.
 */
int ts_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, struct ts_frame_hdr *h);
/* Writes a header (with its CRC) into out[TS_HDR_LEN]. */
void ts_frame_encode(uint8_t *out, const struct ts_frame_hdr *h);

/* ---- payload reader: bounds-checked, points into the input ------------------------- */

struct ts_rd {
    const uint8_t *p;
    size_t len, off;
    int err; /* sticky: first failure (TS_EPROTO) */
};

static inline void ts_rd_init(struct ts_rd *r, const void *p, size_t len)
{
    r->p = p;
    r->len = len;
    r->off = 0;
    r->err = 0;
}
uint8_t ts_rd_u8(struct ts_rd *r);
uint16_t ts_rd_u16(struct ts_rd *r);
uint32_t ts_rd_u32(struct ts_rd *r);
uint64_t ts_rd_u64(struct ts_rd *r);
/* n raw bytes; NULL (and r->err set) if fewer remain. */
const uint8_t *ts_rd_bytes(struct ts_rd *r, size_t n);
/* u16 length + bytes, copied NUL-terminated into out[cap]; TS_EPROTO if longer than cap-1. */
void ts_rd_str(struct ts_rd *r, char *out, size_t cap);
/* u16 length + bytes as a dataset name: TS_ENAME (not TS_EPROTO) if not a valid name. */
int ts_rd_name(struct ts_rd *r, char out[TS_NAME_MAX + 1]);
/* The same, also taking a fragment name (NAME#f, ts_frag_split): the shard operations. */
int ts_rd_name_store(struct ts_rd *r, char out[TS_NAME_MAX + 1]);
/* 0 when everything parsed and nothing is left over, else TS_EPROTO. */
int ts_rd_done(const struct ts_rd *r);

/* ---- payload writer: growable buffer ------------------------------------------------ */

struct ts_wr {
    uint8_t *buf;
    size_t len, cap;
    int err; /* sticky: TS_ENOMEM, or TS_ETOOBIG from ts_wr_frame over 4 GiB */
};

void ts_wr_init(struct ts_wr *w);
void ts_wr_fini(struct ts_wr *w);
void ts_wr_u8(struct ts_wr *w, uint8_t v);
void ts_wr_u16(struct ts_wr *w, uint16_t v);
void ts_wr_u32(struct ts_wr *w, uint32_t v);
void ts_wr_u64(struct ts_wr *w, uint64_t v);
void ts_wr_bytes(struct ts_wr *w, const void *p, size_t n);
void ts_wr_str(struct ts_wr *w, const char *s); /* u16 length + bytes (cut at 65535) */
/* Reserves a header's room at the start; ts_wr_frame() fills it in once the payload is done. */
void ts_wr_begin_frame(struct ts_wr *w);
void ts_wr_frame(struct ts_wr *w, uint8_t opcode, uint16_t flags, uint64_t req_id, uint64_t epoch);

/* ---- shared message bodies --------------------------------------------------------- */

void ts_wr_dataset_info(struct ts_wr *w, const struct ts_dataset_info *d);
int ts_rd_dataset_info(struct ts_rd *r, struct ts_dataset_info *d);
void ts_wr_shard_info(struct ts_wr *w, const struct ts_shard_info *s);
int ts_rd_shard_info(struct ts_rd *r, struct ts_shard_info *s);

#endif
