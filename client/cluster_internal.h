/*
 * libtessera internals of the router (cluster mode): its state (struct ts_cluster), the peers
 * it talks to, submitted reads, replica selection and fan-outs, and the functions that the
 * router's files (cluster.c, cluster_place.c, cluster_read.c, cluster_put.c,
 * cluster_dataset.c, cluster_admin.c) share. The router is entered from api.c only (the
 * ts_cl_* calls of client_internal.h) and reaches the nodes only through the connection
 * layer's ts_conn_* calls. Not installed.
 */
#ifndef TS_CLUSTER_INTERNAL_H
#define TS_CLUSTER_INTERNAL_H

#include "client_internal.h"

#define MAX_TRIES 3     /* attempts of one call across map changes */
#define MAX_REPLICAS 32 /* of one PG that a read may try */
#define WHY_LEN 1024
#define NO_PEER SIZE_MAX

/* A node we talk to, by id and address (a map change keeps its connection). */
struct peer {
    char id[64];
    char addr[128];
    tessera_client *conn;   /* NULL until first needed, or after it failed */
    uint64_t failed_ns;     /* when connecting to it or its connection last failed */
    uint64_t checked_epoch; /* the highest reply epoch we already asked it the map for */
    unsigned reads;         /* submitted reads in flight on conn */
    int no_rdma;            /* the handle asked for RDMA and this node serves none: TCP/TLS */
};

struct policy {
    char name[TS_NAME_MAX + 1];
    uint8_t core, fringe;
    uint8_t ec_k, ec_m; /* erasure-coded: reads go through cluster_ec.c */
    uint8_t ec_dropped; /* and its replicas hold no bytes: submitted reads too */
};

/* Which replicas a read tried, and why they failed. */
struct sel {
    uint32_t start; /* rotation: which replica to try first */
    int spread;     /* 0: the primary first */
    size_t tried[MAX_REPLICAS];
    size_t ntried;
    unsigned adopted; /* newer maps adopted while the read went on */
    int rc;           /* what to report once no replica is left */
    char why[WHY_LEN];
};

/* A submitted read (tessera_read_submit) of the router. */
struct cop {
    uint64_t id;
    int inflight; /* on peers[peer] as sub_op; else finished with rc, got */
    int retry;    /* finished with a failure another replica may not have */
    size_t peer;
    uint64_t sub_op;
    int rc;
    size_t got;
    char *msg; /* the message of a failed read */
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    uint64_t off;
    size_t len;
    void *buf;
    struct ts_readv *rv; /* a READV (ts_cl_readv_submit): its ranges; sent once, no failover */
    size_t nrv;
    struct sel sel;
    struct cop *next_free; /* on cl->free_cops */
};

#define PG_ORD_MAX 16 /* replicas kept per PG; a longer order is computed each time */
#define PG_MEMO 64    /* shards whose PG is kept */

struct ts_cluster {
    tessera_client *c; /* the router: its message */
    struct ts_map *map;
    uint64_t epoch; /* map->epoch (0: no map); sub-connections' requests carry it */
    struct peer *peers;
    size_t npeers, cappeers;
    size_t seed; /* the peer the handle was opened on, or NO_PEER */
    struct policy *pols;
    size_t npols, cappols;
    struct cop **cops; /* by id */
    size_t ncops, capcops;
    struct cop *free_cops; /* finished ones, kept for the next submitted read */
    uint64_t next_op;
    uint64_t salt;
    const struct tessera_opts *o; /* the router's options (strings owned by it) */
    int timeout_ms;
    size_t served;         /* the peer that served the submitted read last collected, or NO_PEER */
    uint64_t resubmits;    /* submitted reads sent to another replica after theirs failed */
    uint64_t ec_reads;     /* reads served through an erasure-coded dataset's fragments */
    uint64_t ec_fallbacks; /* ... that the fragments could not serve: read from the replicas */
    struct ts_batch batch; /* for the sub-connections (ts_cl_batch) */
    /* Each PG's replica order under map (ts_map_pg_order, which costs more than the read's
     * own work on a small read): computed at first use, dropped with the map. */
    uint16_t *pg_ord; /* pg_count x PG_ORD_MAX node indexes */
    uint8_t *pg_nord; /* per PG: 0 not computed, else the count + 1 */
    /* CRC32C of the dataset name placed last (a reader places every unit of one dataset). */
    char crc_name[TS_NAME_MAX + 1];
    uint32_t name_crc;
    /* That name's shards' PGs, by shard % PG_MEMO (pg + 1; 0: none): a reader of small records
     * places every unit, and ISA-L's CRC32C of the 4-byte shard number costs more than the
     * rest of the placement. And the lane (ts_cl_read_lane) of each (shard, 64 MiB region),
     * by both (region + 1; 0: none). Dropped with the name, the map or a dataset's policy. */
    struct {
        uint32_t shard, pg1;
    } pg_memo[PG_MEMO];
    struct {
        uint64_t region1;
        uint32_t shard;
        size_t lane;
    } lane_memo[PG_MEMO];
};

/*
 * A fan-out: the nodes it goes to, from the map as it is now (every node that is up, and with
 * with_down those that are down too; never those that are out), and what failed on them.
 */
struct fan {
    size_t *peers; /* peer indexes */
    int *states;   /* their map states */
    size_t n;
    int absent_last;   /* a failure saying the data is absent gives way to another failure */
    int first;         /* the failure to report */
    char why[WHY_LEN]; /* every failure */
};

/* ---- small helpers (cluster.c) -------------------------------------------------------------- */

/* Sets the router's message. */
void ts_cl_err(struct ts_cluster *cl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends "; "-separated text to why[WHY_LEN]. */
void ts_cl_why_add(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t ts_cl_mix64(uint64_t x);
/* The replica does not have the data (yet): weaker news than a failure. */
int ts_cl_absent(int rc);
/* The connection to the node broke or never came up. */
int ts_cl_lost(int rc);

/* ---- peers, the map, fan-outs (cluster.c) --------------------------------------------------- */

/* The peer of node i of map m. */
int ts_cl_node_peer(struct ts_cluster *cl, const struct ts_map *m, size_t i, size_t *out);
/* Connecting to the peer or its connection failed a moment ago. */
int ts_cl_recently_failed(const struct peer *pe);
/* The connection to peer p, opened if needed (probe: a short connect timeout). */
int ts_cl_peer_conn(struct ts_cluster *cl, size_t p, int probe, tessera_client **out);
/* Takes m; adopts it when it is newer than ours. 1 when adopted. */
int ts_cl_adopt(struct ts_cluster *cl, struct ts_map *m);
/* Drops the PG replica orders kept for the map (cluster_place.c). */
void ts_cl_order_forget(struct ts_cluster *cl);
/* After a call on peer p: adopts a newer map the node has. 1 when one was adopted. */
int ts_cl_check(struct ts_cluster *cl, size_t p);
/* After a call on peer p's connection sub that returned rc: its message to msg[cap] (or the
 * router's), then ts_cl_check. rc. */
int ts_cl_peer_done(struct ts_cluster *cl, size_t p, tessera_client *sub, int rc, char *msg,
                    size_t cap);
/* Asks every node but peer `skip` for its map and adopts the newest. 1 when one was newer. */
int ts_cl_refresh(struct ts_cluster *cl, size_t skip);
void ts_cl_fan_end(struct fan *f);
int ts_cl_fan_begin(struct ts_cluster *cl, struct fan *f, int with_down, int absent_last);
/* Peer p failed with rc, the router's message saying why. */
void ts_cl_fan_fail(struct ts_cluster *cl, struct fan *f, size_t p, int rc);
/* No node answered: every failure goes into the router's message; the code to return. */
int ts_cl_fan_none(struct ts_cluster *cl, const struct fan *f);
/* Replica p failed the read with rc (msg: why). 1 when another replica should be tried. */
int ts_cl_sel_fail(struct ts_cluster *cl, struct sel *s, size_t p, int rc, const char *msg,
                   const char *name, uint32_t shard, uint64_t off);
/* Collects in-flight read k from its replica (waits for it). */
void ts_cl_cop_collect(struct ts_cluster *cl, struct cop *k);

/* ---- erasure-coded datasets (cluster_ec.c) --------------------------------------------------- */

/* The cached policy says the dataset's replicas dropped their bytes (issue 33). */
int ts_cl_ec_dropped(const struct ts_cluster *cl, const char *name);
/* Read (or READV) k served now through the dataset's fragments, one range at a time: k is
 * finished (k->rc, and each range's rc for a READV). Returns 0. */
int ts_cl_ec_cop(struct ts_cluster *cl, struct cop *k);

/* ---- placement and replica selection (cluster_place.c) -------------------------------------- */

void ts_cl_policy_forget(struct ts_cluster *cl, const char *name);
void ts_cl_memo_forget(struct ts_cluster *cl);
int ts_cl_policy_keep(struct ts_cluster *cl, const char *name, const struct ts_dataset_policy *p);
void ts_cl_sel_init(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                    uint64_t off, int spread);
/* The next replica to read from and its connection; when none is left, the read's error. */
int ts_cl_sel_next(struct ts_cluster *cl, struct sel *s, const char *name, uint32_t shard,
                   uint64_t off, size_t *out, tessera_client **sub);
/* Replica p (connection sub) failed a call with rc: 1 when another replica should be tried. */
int ts_cl_sel_retry(struct ts_cluster *cl, struct sel *s, size_t p, tessera_client *sub, int rc,
                    const char *name, uint32_t shard, uint64_t off);

#endif
