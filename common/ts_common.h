/*
 * Internal helpers shared by every tessera module: error conversion, logging macros,
 * CRC32C, byte order. Not installed.
 */
#ifndef TS_COMMON_H
#define TS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tessera/errno.h"
#include "tessera/log.h"
#include "tessera/types.h"

#define TS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define TS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TS_MAX(a, b) ((a) > (b) ? (a) : (b))

/* errno value -> TS_E* (at the edge, once). */
int ts_from_errno(int err);

/* ---- logging ------------------------------------------------------------------------------ */

extern int ts_log_level_cur;
void ts_log_write(int level, const char *facility, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The level is checked before any argument is evaluated. */
#define TS_LOG(level, fac, rc, ...)                                                                \
    do {                                                                                           \
        if ((level) <= ts_log_level_cur)                                                           \
            ts_log_write((level), (fac), (rc), __VA_ARGS__);                                       \
    } while (0)
#define TS_ERROR(fac, rc, ...) TS_LOG(TS_LOG_ERROR, fac, rc, __VA_ARGS__)
#define TS_WARN(fac, rc, ...) TS_LOG(TS_LOG_WARN, fac, rc, __VA_ARGS__)
#define TS_INFO(fac, ...) TS_LOG(TS_LOG_INFO, fac, 0, __VA_ARGS__)
#define TS_DEBUG(fac, ...) TS_LOG(TS_LOG_DEBUG, fac, 0, __VA_ARGS__)

/* ---- CRC32C (Castagnoli), computed by ISA-L -------------------------------------------- */

/*
 * Standard CRC32C of buf, continuing from crc (0 to start): chaining
 * ts_crc32c(ts_crc32c(0, a), b) equals the CRC of a followed by b.
 */
uint32_t ts_crc32c(uint32_t crc, const void *buf, size_t len);
/* The CRC32C of A followed by B from crc(A), crc(B) and B's length, without a pass over the
 * bytes (common/crc_combine.c): a chunk's CRC, computed once, extends a running shard CRC. */
uint32_t ts_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* The same for len_b = 4096 (TS_SUB_BLOCK), by table: for folding many sub-block CRCs. */
uint32_t ts_crc32c_combine_4k(uint32_t crc_a, uint32_t crc_b);

/* ---- explicit byte order for wire and on-disk records ---------------------------------- */

static inline void ts_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline uint32_t ts_get_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void ts_put_be64(uint8_t *p, uint64_t v)
{
    ts_put_be32(p, (uint32_t)(v >> 32));
    ts_put_be32(p + 4, (uint32_t)v);
}
static inline uint64_t ts_get_be64(const uint8_t *p)
{
    return ((uint64_t)ts_get_be32(p) << 32) | ts_get_be32(p + 4);
}
static inline void ts_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline uint16_t ts_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline void ts_put_le32(uint8_t *p, uint32_t v)
{
    ts_put_le16(p, (uint16_t)v);
    ts_put_le16(p + 2, (uint16_t)(v >> 16));
}
static inline uint32_t ts_get_le32(const uint8_t *p)
{
    return (uint32_t)ts_get_le16(p) | ((uint32_t)ts_get_le16(p + 2) << 16);
}
static inline void ts_put_le64(uint8_t *p, uint64_t v)
{
    ts_put_le32(p, (uint32_t)v);
    ts_put_le32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t ts_get_le64(const uint8_t *p)
{
    return (uint64_t)ts_get_le32(p) | ((uint64_t)ts_get_le32(p + 4) << 32);
}

/* Dataset names: 1..TS_NAME_MAX bytes of [A-Za-z0-9._-], not starting with '.'. */
int ts_name_valid(const char *name);
/*
 * Fragment names (issue 33): a node keeps fragment f of an erasure-coded dataset NAME as the
 * store dataset "NAME#f" (f in decimal, no leading zero, below TS_FRAG_MAX). '#' is outside
 * the names users give, so no user dataset can take one; the whole fits TS_NAME_MAX.
 */
#define TS_FRAG_MAX 40 /* TS_EC_MAX_K + TS_EC_MAX_M */
/* NAME#f into out: 0, or TS_ENAME (an invalid NAME, f too large, or the whole too long). */
int ts_frag_name(char out[TS_NAME_MAX + 1], const char *base, unsigned f);
/* 1 when name is a fragment name (then its NAME into base and f into *f, each when not NULL),
 * else 0. */
int ts_frag_split(const char *name, char base[TS_NAME_MAX + 1], unsigned *f);
/* A dataset name or a fragment name: what the store keeps. */
int ts_name_valid_store(const char *name);
/* A dataset's record format (enum tessera_record_format of tessera/records.h) by name:
 * "tfrecord", "tar", "jsonl", "len32", "len64" ("none" for 0, "?" past the last). */
#define TS_RECORD_FORMAT_MAX 5
const char *ts_record_format_name(int fmt);

/* Monotonic and wall clocks in nanoseconds. */
uint64_t ts_now_mono_ns(void);
uint64_t ts_now_wall_ns(void);
/* "HOST:PORT" or "[V6]:PORT" (port 0: any free port) -> a socket address for bind(); 0 or
 * TS_ECONFIG. */
struct sockaddr_storage;
int ts_listen_addr_parse(const char *addr, struct sockaddr_storage *ss, int *sslen);

#endif
