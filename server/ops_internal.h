/*
 * Request handlers' shared parts (ops.c: client operations; ops_repl.c: node-to-node
 * replication, peering and maps). Handlers get their requests decoded (requests.h). Each
 * helper that fails has replied already.
 */
#ifndef TSD_OPS_INTERNAL_H
#define TSD_OPS_INTERNAL_H

#include "server_internal.h"

void ops_reply_ok(struct tsd_conn *c, const struct ts_frame_hdr *h);
/* A storage error, naming what is missing (the dataset or the shard; shard < 0: none). */
void ops_reply_store_error(struct tsd_conn *c, const struct ts_frame_hdr *h, int rc,
                           const char *name, long shard);
/* A shard's info (SHARD_STAT's reply, and a seal's), or the error that stopped it. */
void ops_reply_shard_info(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                          uint32_t shard);
void ops_reply_write_ok(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t idx,
                        uint64_t bytes);
/* Stores one chunk of an upload on this connection (chunk 0 starts it); *u_out: the upload. */
int ops_local_write(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                    uint32_t shard, uint32_t idx, uint64_t size, uint32_t crc, uint32_t len,
                    const uint8_t *data, struct tsd_upload **u_out);
struct tsd_upload *ops_upload_find(struct tsd_conn *c, const char *name, uint32_t shard);
void ops_upload_remove(struct tsd_conn *c, struct tsd_upload *u);
/* The record offsets of a seal, copied into a malloc'ed array (*recs; NULL when there are
 * none); replies TS_ENOMEM on failure. */
int ops_records(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_u64s *v,
                uint64_t **recs);

/* A reply that waits for replication: the connection is held until it is sent. */
struct parked {
    struct tsd_conn *c;
    struct ts_frame_hdr h;
    unsigned min_acks; /* other core replicas that must hold the write */
    unsigned targets;
    uint32_t idx;
    uint64_t bytes;
    char name[TS_NAME_MAX + 1];
    uint32_t shard;
    uint32_t pg;
    uint64_t epoch; /* the PG's interval when the write was accepted (cluster mode) */
    uint64_t t0_ns; /* when the request arrived (metrics: its latency) */
};
/* Parks c's reply to h: need is the replicas (this one included) that must hold the write,
 * targets the other core replicas asked; NULL when out of memory. */
struct parked *ops_park(struct tsd_conn *c, const struct ts_frame_hdr *h, unsigned need,
                        unsigned targets);
/* Returns 1 if the parked connection is still there to reply to (then reply, and call
 * ops_unpark_done); 0: it is gone (free pk). */
int ops_unpark(struct parked *pk);
void ops_unpark_done(struct parked *pk);
/* Whether this node still leads pk's PG in the interval its write was accepted in. */
int ops_still_leading(struct parked *pk);
/* Cluster mode: 1 when this node takes a write of (name, shard) (the placement filled in);
 * else 0 after replying the refusal. */
int ops_placement(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                  uint32_t shard, const struct ts_dataset_policy *p, uint32_t *pg,
                  struct ts_repl_targets *to, uint64_t *epoch, unsigned *need);
/* Replies TS_EUNAVAIL (and returns 0) if fewer than min_core replicas could take a write. */
/* Whether a write to a fragment store NAME#f may go on (an admin's, NAME sealed here; the
 * store made on first use); 1 for any other name; 0 after replying the refusal. */
int ops_frag_write_ok(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                      uint32_t shard);
void tsd_op_chunk_repair(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_dataset_tier(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
int ops_enough_replicas(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                        uint32_t shard, unsigned need, const struct ts_repl_targets *to);
/* ops_seal.c: SHARD_SEAL (through the store's group commit where seals are synced), and the
 * worker's end of it: seals made durable, answered on the worker's loop. */
void tsd_op_shard_seal(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_seals_durable(struct tsd_worker *w);
void tsd_seals_forget(struct tsd_worker *w);
/* ops.c, reached by the connection layer through tsd_ops_table() */
void tsd_uploads_abort(struct tsd_conn *c);
int tsd_stream_continue(struct tsd_conn *c); /* a streaming READ: 1 when finished */
void tsd_stream_free(struct tsd_read_stream *rs);
void tsd_uploads_expire(struct tsd_conn *c, uint64_t before);

/* ops_read.c */
void tsd_op_read(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
/* A local chunk failed verification (rc TS_ECORRUPT): in a cluster, fetch a good copy. */
void tsd_repair_chunk(struct tsd_server *s, const char *name, uint32_t shard, uint32_t idx, int rc);

/* ops_readv.c */
void tsd_op_readv(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_hint(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);

/* ops_status.c */
void tsd_op_status(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);

/* ops_repl.c */
void tsd_op_map_get(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_map_push(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_repl_write(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_repl_seal(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_pg_info(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
/* ops_move.c */
void tsd_op_pg_drop(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_pg_query(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_pg_activate(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_pg_pull(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);
void tsd_op_pg_inventory(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q);

#endif
