/*
 * Plain data types shared by the client API and the server: dataset policy and state,
 * shard state, scrub reports. All fields are host byte order; the wire encoding is in
 * docs/protocol.md.
 */
#ifndef TESSERA_TYPES_H
#define TESSERA_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_NAME_MAX 128
#define TS_DEFAULT_CHUNK_SIZE (1u << 20)
#define TS_MIN_CHUNK_SIZE 4096u
#define TS_SIZE_UNKNOWN UINT64_MAX

enum ts_dataset_state { TS_DS_OPEN = 0, TS_DS_SEALED = 1 };
enum ts_shard_state { TS_SHARD_WRITING = 0, TS_SHARD_COMPLETE = 1 };

struct ts_dataset_policy {
    uint8_t core;          /* synchronous (core) replicas */
    uint8_t fringe;        /* asynchronous (fringe) replicas */
    uint8_t min_core;      /* core replicas that must hold a write before it is acknowledged */
    uint32_t chunk_size;   /* bytes per chunk; 0 means TS_DEFAULT_CHUNK_SIZE */
    uint8_t record_format; /* what its records are (enum tessera_record_format of
                              tessera/records.h); 0: not said, raw bytes */
    uint8_t ec_k, ec_m;    /* erasure-coded (issue 33): each shard also as ec_k data and ec_m
                              parity fragments on ec_k + ec_m nodes; 0, 0: replicated only */
    uint8_t ec_dropped;    /* erasure-coded, and the replicas' bytes dropped: they keep the shard
                              records only, and reads answer TS_EFRAGMENTED */
};

struct ts_dataset_info {
    char name[TS_NAME_MAX + 1];
    uint64_t id;
    struct ts_dataset_policy policy;
    int state;               /* enum ts_dataset_state */
    uint64_t created_ns;     /* wall clock, ns since the epoch */
    uint32_t shards;         /* complete shards */
    uint32_t shards_writing; /* shards with an upload in progress or abandoned */
    uint64_t bytes;          /* bytes in complete shards */
};

struct ts_shard_info {
    uint32_t shard;
    int state;            /* enum ts_shard_state */
    uint64_t size;        /* bytes (written so far while TS_SHARD_WRITING) */
    uint64_t expect_size; /* declared when the upload began, or TS_SIZE_UNKNOWN */
    uint32_t chunk_size;
    uint32_t nchunks;
    uint32_t crc;      /* CRC32C of all the shard's bytes (so far while writing) */
    uint32_t nrecords; /* entries in the record index, 0 if none */
};

struct ts_scrub_report {
    uint64_t shards;
    uint64_t chunks;
    uint64_t bytes;
    uint64_t corrupt;
    /* In a cluster: the node's PG replicas compared with their primaries' inventories. */
    uint32_t pgs_compared;
    uint32_t pgs_differing; /* found short of their primary: a backfill was started */
    uint32_t pgs_unchecked; /* not comparable now (primary away, peering, writes in flight) */
    uint64_t missing;       /* complete shards the primaries hold beyond this node's */
};

#ifdef __cplusplus
}
#endif
#endif
