/*
 * The cluster map (design.md "Data model", "Coordination") and placement: which nodes exist,
 * their addresses, weights, failure domains and states, the PG count, and the epoch that grows
 * with every change; shard -> PG by a stable hash and PG -> ordered replica set by weighted
 * rendezvous hashing with failure domains.
 *
 * Ownership: a struct ts_map and its nodes array are two separate malloc() blocks, both freed by
 * ts_map_free(). Functions that return a map through *out leave *out untouched on failure.
 */
#ifndef TS_MAP_H
#define TS_MAP_H

#include <stddef.h>
#include <stdint.h>

struct ts_rd;
struct ts_wr;

#define TS_MAP_MAX_NODES 4096 /* the largest map accepted from a file or the wire */
#define TS_MAP_MAX_PGS 65536  /* pg_count bound (fixed for a cluster's life) */
#define TS_MAP_MAX_EPOCH INT64_MAX

enum ts_node_state {
    TS_NODE_UP = 0,
    TS_NODE_DOWN = 1,
    TS_NODE_OUT = 2
}; /* OUT: drained, holds no placements */

struct ts_map_node {
    char id[64];        /* unique, [A-Za-z0-9._-] */
    char addr[128];     /* "host:port" of its plain listener */
    char tls_addr[128]; /* "host:port" of its TLS listener, "" if none */
    uint32_t weight;    /* > 0; relative capacity */
    char domain[64];    /* failure domain (zone/rack/host); "" = its own id */
    int state;          /* enum ts_node_state */
};

struct ts_map {
    uint64_t epoch;    /* grows with every change */
    uint32_t pg_count; /* > 0, fixed for the life of a cluster */
    size_t n;
    struct ts_map_node *nodes;
};

/* "up", "down", "out"; "?" for anything else. */
const char *ts_node_state_name(int state);

/*
 * Reads a map from a libconfig file:
 *
 *   epoch = 1;
 *   pg_count = 64;
 *   nodes = (
 *     { id = "n1"; addr = "127.0.0.1:7101"; tls_addr = ""; weight = 100; domain = "rack-a";
 *       state = "up"; },
 *     { id = "n2"; addr = "127.0.0.1:7102"; weight = 100; domain = "rack-b"; }
 *   );
 *
 * epoch, pg_count, nodes and each node's id, addr and weight are required; tls_addr and domain
 * default to "", state to "up". Validated (the same checks for the wire form): 1..TS_MAP_MAX_NODES
 * nodes, unique ids, every listener address (plain and TLS) used once, weight > 0, pg_count
 * 1..TS_MAP_MAX_PGS, epoch <= TS_MAP_MAX_EPOCH, at least one node up, state up|down|out, no
 * unknown settings. Integers above 2147483647 need libconfig's L suffix (libconfig 1.5 silently
 * wraps them otherwise; ts_map_write_file() adds it). On error returns TS_ECONFIG and writes a
 * message naming the line into err (when err != NULL); a file that cannot be read is TS_ECONFIG
 * too, with the reason. On success *out is a new map the caller frees with ts_map_free().
 */
int ts_map_parse_file(const char *path, struct ts_map **out, char *err, size_t errlen);
int ts_map_parse_string(const char *text, struct ts_map **out, char *err, size_t errlen);

/*
 * Writes m in the format above to path.tmp, fsyncs it, renames it over path and fsyncs the
 * directory: readers see the old file or the new one, never a mix. TS_EINVAL (nothing written)
 * when m would not parse back; else 0 or the TS_E* of the failed system call.
 */
int ts_map_write_file(const struct ts_map *m, const char *path);

/*
 * Wire form: u64 epoch, u32 pg_count, u32 n, then n x (str id, str addr, str tls_addr,
 * u32 weight, str domain, u8 state), with the ts_wr_* encodings. Decoding is bounds-checked
 * and validates like the parser (n <= TS_MAP_MAX_NODES); anything malformed is TS_EPROTO (also
 * left in r->err). Decoding does not require the map to end the payload: call ts_rd_done().
 */
void ts_map_encode(struct ts_wr *w, const struct ts_map *m);
int ts_map_decode(struct ts_rd *r, struct ts_map **out);

/* A deep copy, or NULL when out of memory (or m is NULL). */
struct ts_map *ts_map_dup(const struct ts_map *m);
void ts_map_free(struct ts_map *m); /* NULL ok */

/* Index of the node with this id, or -1. */
int ts_map_find(const struct ts_map *m, const char *id);

/* The PG of a shard: CRC32C(dataset || be32 shard) % pg_count. The one definition of the
 * mapping (storage, servers and clients all use it); it must never change. 0 when pg_count
 * is 0. */
uint32_t ts_pg_of(const char *dataset, uint32_t shard, uint32_t pg_count);
/* ts_pg_of() with the map's PG count (0 for a NULL map). */
uint32_t ts_map_pg_of(const struct ts_map *m, const char *dataset, uint32_t shard);

/*
 * The ordered replica set of a PG over nodes in state UP: by weighted rendezvous hashing
 * (score per (pg,node) from a good 64-bit hash of (pg, node id), weighted as -weight/ln(u) with
 * u in (0,1) from the hash), then reordered so that the first replicas are in distinct failure
 * domains for as long as distinct domains remain (walk the HRW ranking; take a node if its
 * domain is not used yet; after every domain is used, continue with the skipped nodes in HRW
 * order). Writes up to max node indexes (into m->nodes) to out; returns how many.
 * Deterministic across machines: the result depends only on the ids, weights, domains and
 * states of the UP nodes, not on their order in the map or on the platform's libm.
 * Returns 0 when no node is UP, and (for maps over 64 nodes) when out of memory.
 */
size_t ts_map_pg_order(const struct ts_map *m, uint32_t pg, int *out, size_t max);

#endif
