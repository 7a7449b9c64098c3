/*
 * Anomalies of a cluster, found in its nodes' STATUS documents (server/ops_status.c) and in the
 * rates `tessera top` measures between two polls. Pure: no I/O, no clock; `tessera top` and
 * `tessera status` both ask it, and tests/unit/test_cli_anomaly.c drives it with synthetic
 * documents.
 */
#ifndef TS_CLI_ANOMALY_H
#define TS_CLI_ANOMALY_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

/* What is known of one node of the map (or the single node). The caller keeps ownership of
 * every pointer; nothing is kept past the call. */
struct cli_node_obs {
    const char *id;             /* node id */
    const char *map_state;      /* its state in the map ("up", "down", "out"); NULL: no map */
    struct json_object *status; /* its STATUS document; NULL when it did not answer */
    const char *error;          /* why it did not answer (NULL: unknown) */
    double silent_s;            /* for how long it has not answered (0: unknown) */
    /* Rates between two polls; below 0: unknown (then read_bps falls back on the sum of the
     * STATUS "hot" datasets' bytes_per_s, when there is one). */
    double read_bps, write_bps, req_ps;
};

/* When a value is an anomaly. cli_anomaly_limits_init sets the defaults shown. */
struct cli_anomaly_limits {
    double lag_s;          /* a replica's oldest unapplied write older than this: 5 s */
    uint64_t lag_ops;      /* ... or more operations behind than this: 1000 */
    uint64_t lag_bytes;    /* ... or more bytes behind than this: 256 MiB */
    double peering_s;      /* a PG not active for longer than this: 2 s */
    double disk_free_pct;  /* free space below this share of the disk: 10 % */
    double hot_pg_factor;  /* a PG read this many times faster than the median PG: 10 */
    double hot_pg_min_bps; /* ... and at least this fast: 1 MiB/s */
    double skew_factor;    /* a node reading this many times the mean of the nodes: 2 */
    double skew_min_bps;   /* ... while the cluster reads at least this much: 1 MiB/s */
};

void cli_anomaly_limits_init(struct cli_anomaly_limits *l);

#define CLI_ANOMALY_KINDS(X)                                                                       \
    X(NODE_DOWN, "node-down")                                                                      \
    X(NODE_SILENT, "node-not-answering")                                                           \
    X(PG_INACTIVE, "pg-not-active")                                                                \
    X(REPLICA_LAG, "replica-lag")                                                                  \
    X(DISK_FULL, "disk-full")                                                                      \
    X(CORRUPT, "checksum-failures")                                                                \
    X(HOT_PG, "hot-pg")                                                                            \
    X(READ_SKEW, "read-skew")                                                                      \
    X(WAL_DAMAGE, "wal-damage")

enum cli_anomaly_kind {
#define X(k, s) CLI_AN_##k,
    CLI_ANOMALY_KINDS(X)
#undef X
        CLI_AN_COUNT
};

/* One anomaly in words, e.g. "n2: up in the map but not answering for 3.0 s (...)". */
struct cli_anomaly {
    enum cli_anomaly_kind kind;
    char node[64]; /* the node it is about ("" for the cluster) */
    char text[256];
};

/* "node-down", "replica-lag", ... */
const char *cli_anomaly_kind_name(enum cli_anomaly_kind k);

/*
 * The anomalies of nodes[0..n) under limits l (NULL: the defaults), in the order of the kinds
 * above, at most cap of them into out (may be NULL when cap is 0). Returns how many were found,
 * which may exceed cap.
 */
size_t cli_anomalies(const struct cli_node_obs *nodes, size_t n, const struct cli_anomaly_limits *l,
                     struct cli_anomaly *out, size_t cap);

/* Sum of a STATUS document's "hot" datasets' bytes_per_s; below 0 when it has no "hot". */
double cli_status_hot_read_bps(struct json_object *status);

/* Member lookups over a dotted path ("disk.free_bytes"); def when absent. */
double cli_json_num(struct json_object *o, const char *path, double def);
struct json_object *cli_json_get(struct json_object *o, const char *path);

#endif
