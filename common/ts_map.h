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

/*
 * A rebalance in progress (map_move.c, docs/operations.md "Rebalancing"). The node table (nodes)
 * is the target; `from` is the table before. A PENDING or MOVING PG keeps the placement `from`
 * gives it (with the nodes that are down now left out); a SETTLED one has the target's. In a
 * MOVING PG the nodes that the target adds join: they get the PG's log and a backfill, serve
 * nothing, and count for no write (ts_repl_rank_of), until the PG settles in a later epoch.
 */
enum ts_pg_move { TS_PG_SETTLED = 0, TS_PG_PENDING = 1, TS_PG_MOVING = 2 };

#define TS_MOVE_DRIVER_MONITOR 1ull

struct ts_map_move {
    struct ts_map_node *from; /* the node table before the rebalance */
    size_t nfrom;
    uint8_t *pg;             /* pg_count entries: enum ts_pg_move */
    int paused;              /* no new PG starts moving; backfills of moving PGs wait */
    uint64_t rate;           /* bytes/s of each moving PG's backfill, 0: unlimited */
    uint64_t driver;         /* the CLI process that drives it (a random token): one at a time;
                              * TS_MOVE_DRIVER_MONITOR: the elected `tessera monitor` (on etcd) */
    uint32_t concurrent;     /* PGs moving at once (--max-concurrent; 0: the driver's default) */
    uint32_t from_placement; /* the map's placement_pgs before it (0: the map's own): a split's
                              * spreading moves children from their parent's placement */
    /* Derived: `from` with the states of now (a node down now is down there). */
    struct ts_map *old;
    int *old_idx; /* old->nodes[i] is nodes[old_idx[i]] */
};

/* A hot dataset (map_hot.c): `fringe` extra fringe replicas of it, in every PG (pg -1) or in
 * one PG; its replicas in a PG are the first core + fringe + extra nodes of the PG's order. */
#define TS_MAP_MAX_HOT 256
#define TS_MAP_MAX_HOT_FRINGE 8
struct ts_map_hot {
    char dataset[65]; /* TS_NAME_MAX + 1 */
    int64_t pg;       /* -1: every PG */
    uint8_t fringe;   /* 1..TS_MAP_MAX_HOT_FRINGE */
};

struct ts_map {
    uint64_t epoch;    /* grows with every change */
    uint32_t pg_count; /* > 0; it only grows, by a split (doubling: docs/operations.md) */
    /* PG pg is placed as PG pg % placement_pgs (0: pg_count, every PG on its own). Less than
     * pg_count only after a split: every child PG stays with its parent until the split's
     * rebalance spreads them. Divides pg_count. */
    uint32_t placement_pgs;
    size_t n;
    struct ts_map_node *nodes;
    struct ts_map_move *move; /* NULL: no rebalance in progress */
    struct ts_map_hot *hot;   /* nhot entries (NULL when none) */
    size_t nhot;
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
 *   placement_pgs = 32;      # only after a split (tessera pg split): children with parents
 *   hot = ( { dataset = "imagenet"; fringe = 2; },   # extra fringe replicas (tessera hot)
 *           { dataset = "coco"; pg = 5; fringe = 1; } ); # in one PG only
 *   rebalance = {            # only while one is in progress (written by `tessera rebalance`)
 *     paused = false; rate = 0; driver = 0; concurrent = 4;
 *     from_placement_pgs = 32;  # a split's spreading: placement_pgs before it
 *     from = ( { id = "n1"; ... } );   # the node table before, as `nodes`
 *     pending = [ 3, 7 ]; moving = [ 5 ];   # PGs that keep the placement `from` gives them
 *   };
 *
 * epoch, pg_count, nodes and each node's id, addr and weight are required; tls_addr and domain
 * default to "", state to "up". Validated (the same checks for the wire form): 1..TS_MAP_MAX_NODES
 * nodes, unique ids, every listener address (plain and TLS) used once, weight > 0, pg_count
 * 1..TS_MAP_MAX_PGS, placement_pgs (and the rebalance's from_placement_pgs) dividing pg_count,
 * epoch <= TS_MAP_MAX_EPOCH, at least one node up, state up|down|out, no
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
 * Wire form: u64 epoch, u32 pg_count, u32 n, then n x (str id, str addr, str tls_addr, u32
 * weight, str domain, u8 state), then u8 1 and the rebalance (u8 paused, u64 rate, u64 driver,
 * u32 concurrent, u32 from_placement (0: the map's), u32 nfrom, nfrom nodes as above, pg_count x
 * u8 state) or u8 0, then u32 nhot and
 * nhot x (str dataset, u64 pg (two's complement: -1 every PG), u8 fringe), then u32 placement_pgs
 * (0: pg_count), with the ts_wr_* encodings. Decoding is bounds-checked and validates like the
 * parser (n <= TS_MAP_MAX_NODES); anything malformed is TS_EPROTO (also left in r->err). Decoding
 * does not require the map to end the payload: call ts_rd_done().
 */
void ts_map_encode(struct ts_wr *w, const struct ts_map *m);
int ts_map_decode(struct ts_rd *r, struct ts_map **out);

/* A deep copy, or NULL when out of memory (or m is NULL). */
struct ts_map *ts_map_dup(const struct ts_map *m);
void ts_map_free(struct ts_map *m); /* NULL ok */

/* Index of the node with this id, or -1. */
int ts_map_find(const struct ts_map *m, const char *id);
/* Node nd's failure domain: its domain, else its own id (a domain of its own). */
const char *ts_map_node_domain(const struct ts_map_node *nd);
/* 1 when s names a failure domain a map can hold: 1 to 63 of [A-Za-z0-9._:/-] (node ids are
 * of these too). */
int ts_map_domain_valid(const char *s);

/* The PG of a shard: CRC32C(dataset || be32 shard) % pg_count. The one definition of the
 * mapping (storage, servers and clients all use it); it must never change. 0 when pg_count
 * is 0. */
uint32_t ts_pg_of(const char *dataset, uint32_t shard, uint32_t pg_count);
/* ts_pg_of() from CRC32C(dataset), for a caller placing many shards of one dataset. */
uint32_t ts_pg_of_hashed(uint32_t dataset_crc, uint32_t shard, uint32_t pg_count);
/* ts_pg_of() with the map's PG count (0 for a NULL map). */
uint32_t ts_map_pg_of(const struct ts_map *m, const char *dataset, uint32_t shard);
/* How many PGs m places on their own (its placement_pgs, else pg_count): PG pg is placed as PG
 * pg % ts_map_placement_pgs(m). */
uint32_t ts_map_placement_pgs(const struct ts_map *m);
/* 1 when a map of new_count PGs splits one of old_count: new_count is old_count times a power
 * of two (up to TS_MAP_MAX_PGS), so every PG of it has one parent, pg % old_count. */
int ts_map_pg_count_splits(uint32_t old_count, uint32_t new_count);

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
 * During a rebalance (m->move), a PENDING or MOVING PG gets the order of the table before it,
 * followed by the target's other nodes. Either order is PG pg % placement_pgs's (the map's, or
 * the rebalance's from_placement for the order before it).
 */
size_t ts_map_pg_order(const struct ts_map *m, uint32_t pg, int *out, size_t max);
/* ts_map_pg_order under the node table alone: where a rebalance takes the PG. Without a
 * rebalance the two are the same. */
size_t ts_map_pg_target_order(const struct ts_map *m, uint32_t pg, int *out, size_t max);
/* The positions of an erasure-coded PG's fragments (issue 33; common/map_ec.c): n distinct
 * nodes that are not out, each position drawn on its own (CRUSH's indep mode), the failure
 * domains shared out. A node down keeps its positions (a hole reads go around); marked out,
 * only the positions it held move. Returns how many (n, or fewer when fewer nodes are not
 * out). */
size_t ts_map_ec_order(const struct ts_map *m, uint32_t pg, int *out, size_t max);

/*
 * Starts (or replaces) m's rebalance: `from` (copied) is the table before, pgstate (pg_count
 * entries of enum ts_pg_move, copied; NULL: every PG SETTLED). Every node of `from` must be in
 * m's table. TS_EINVAL when they do not fit, TS_ENOMEM; m unchanged then.
 */
int ts_map_move_set(struct ts_map *m, const struct ts_map_node *from, size_t nfrom,
                    const uint8_t *pgstate, int paused, uint64_t rate);
/* Sets m's rebalance's placement_pgs before it (0: the map's own); TS_EINVAL without a
 * rebalance or when it does not divide pg_count. */
int ts_map_move_set_from_placement(struct ts_map *m, uint32_t placement_pgs);
/* Ends m's rebalance (every PG takes the target placement). */
void ts_map_move_clear(struct ts_map *m);
/* Sets PG pg's state and re-derives nothing else; TS_EINVAL without a rebalance. */
int ts_map_move_pg(struct ts_map *m, uint32_t pg, int state);
/* enum ts_pg_move of PG pg (SETTLED without a rebalance). */
int ts_map_pg_move_state(const struct ts_map *m, uint32_t pg);

/* map_hot.c. The extra fringe replicas the map gives dataset in PG pg (0: none); the largest
 * over every dataset of PG pg. */
unsigned ts_map_hot_extra(const struct ts_map *m, const char *dataset, uint32_t pg);
unsigned ts_map_hot_extra_max(const struct ts_map *m, uint32_t pg);
/* 1 when maps a and b give every dataset the same extra replicas in PG pg; 1 when m gives some
 * dataset more extra replicas in PG pg than old did. */
int ts_map_hot_same(const struct ts_map *a, const struct ts_map *b, uint32_t pg);
int ts_map_hot_grew(const struct ts_map *old, const struct ts_map *m, uint32_t pg);
/* Sets the entry (dataset, pg) (pg -1: every PG) to `fringe` extra replicas; 0 removes it
 * (TS_ENOENT when there is none). TS_EINVAL for a bad name, pg or count, or a full list. */
int ts_map_hot_set(struct ts_map *m, const char *dataset, int64_t pg, unsigned fringe);

#endif
