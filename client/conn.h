/*
 * libtessera internals of the connection layer: the handle itself (struct tessera_client),
 * its request records and receive state, and the engine functions that the files of the
 * connection layer (request.c, recv.c, conn.c, open.c, ops.c, read.c, put.c) share, with the
 * checks at entry that the public calls (api.c) use too. Not installed; the router
 * (cluster*.c) and the tests see only client_internal.h.
 */
#ifndef TS_CLIENT_CONN_H
#define TS_CLIENT_CONN_H

#include "client_internal.h"

struct ts_req {
    struct ts_req *next_tx; /* send queue; also the free list */
    uint64_t id;
    uint8_t op;
    uint8_t user;    /* a tessera_read_submit read: kept until tessera_wait* */
    uint8_t queued;  /* on the send queue or sent */
    uint8_t sent;    /* every byte handed to the transport */
    uint8_t replied; /* the reply was received (or the connection failed) */
    uint8_t done;    /* sent and replied: the caller may look */
    uint16_t hflags; /* request header flags (TS_F_VERIFY) */
    int rc;          /* of a READ: its result; of others: 0 or why no reply came */
    uint64_t seq;    /* completion order (tessera_wait_any reports the earliest) */
    struct ts_wr w;  /* header + fields; the buffer is kept across reuse */
    const uint8_t *data;
    size_t data_len;
    size_t tx_off;  /* bytes of w and data sent */
    uint8_t *reply; /* non-READ: the whole payload */
    size_t reply_len;
    /* READ */
    uint8_t *dst;
    size_t cap;
    uint64_t rd_off;
    size_t got;
    uint64_t shard_size;
    char *msg; /* the server's message for a refused READ */
    void *mr;  /* placed by the server (RDMA): the registration of dst, until the reply */
    const struct ts_read_target *tgt; /* dst is device memory (NULL: host memory) */
    /* READV: the caller's ranges (readv.c); their outcomes are in them once rv_done */
    struct ts_readv *rv;
    size_t nrv;
    int rv_done;
};

/* RX_VHEAD, RX_VDATA: a READV reply's head, then its table and the ranges' data (readv.c). */
enum rx_state { RX_HDR, RX_BODY, RX_RHEAD, RX_RDATA, RX_VHEAD, RX_VDATA, RX_DRAIN };

/* What a receive asks for when a new frame begins: several small replies (4 KiB records) come
 * in one receive and are copied out of stage, instead of two receives per reply. */
#define RX_STAGE (32u << 10)
#define RX_TABLE_KEEP 4096 /* piece table bytes kept for the next reply (512 pieces) */

/*
 * The receive side. A new frame is received into stage (RX_STAGE bytes, allocated at the first
 * receive), with whatever follows it that the transport has: for small replies that is
 * the rest of the reply and the next ones, which are copied out of stage into their places.
 * Once stage is used up, the rest of a READ reply's piece table and data are received straight
 * into their places (the data into the caller's buffer), in one receive for both: a large
 * read costs at most RX_STAGE bytes of copying.
 */
struct rx {
    enum rx_state state;
    uint8_t *stage;    /* RX_STAGE bytes; kept across frames */
    size_t soff, slen; /* stage[soff, slen) was received but not consumed yet */
    size_t have;       /* bytes of the current target received (READ: of the data) */
    struct ts_frame_hdr h;
    struct ts_req *req; /* NULL: a connection-level error reply (request id 0) */
    uint8_t *body;
    size_t body_len;
    uint8_t rhead[TS_READ_HEAD_LEN];
    size_t rhead_len;
    struct ts_read_head rd;
    uint8_t *table; /* the piece table; kept across replies (table_cap bytes) */
    size_t table_cap;
    size_t tlen, thave; /* its bytes, received */
    int placed;         /* the data is already in place (RDMA): only the table follows */
    uint32_t pdone;     /* pieces verified */
    size_t pdoff;       /* their bytes */
    size_t drain_left;
    int drain_rc;
    /* READV: the range being received, its bytes in, and the data still due in all */
    size_t vi, vhave, vleft;
};

struct tessera_client {
    struct ts_cluster *cl; /* cluster mode: a router with no connection of its own (t NULL);
                              set and read by api.c only, never by the connection layer */
    struct ts_transport *t;
    int broken;      /* 0, or the code that ended the connection */
    uint64_t frames; /* reply frame headers received intact */
    uint64_t next_id;
    uint64_t done_seq;
    uint64_t epoch;
    int role;
    uint32_t max_frame;
    int timeout_ms;
    unsigned max_inflight;
    struct ts_batch batch; /* how a caller that submits in bursts wants sends and waits */
    unsigned inflight;
    struct ts_req **live; /* requests queued or awaiting tessera_wait, in id order */
    size_t nlive, caplive;
    struct ts_req *free_reqs;
    struct ts_req *tx_head, *tx_tail;
    struct rx rx;
    unsigned awaiting; /* requests queued whose reply has not arrived */
    int rx_more;       /* a receive may find bytes: no receive came back short since the last
                          wait that said the transport is readable */
    size_t rx_lowat;   /* what the transport's wait lets queue before it wakes (0: one byte) */
    int rx_nobatch;    /* a batched wait ran out: the next wakes at the first byte */
    uint64_t rx_batch_since; /* batched since, or bytes last came (monotonic ns) */
    uint8_t *scratch;
    const uint64_t *epoch_ref; /* a sub-connection: requests carry the router's map epoch */
    uint64_t seen_epoch;       /* the highest epoch a reply carried */
    struct ts_map *stale_map;  /* the newest map a TS_ESTALE reply carried, until taken */
    struct tessera_opts opts;  /* a top-level handle: how it was opened (strings in optbuf) */
    char *optbuf;
    char node[256];
    char err[512];
    /* The chunk sizes of the datasets this connection put to last (put.c): a put of a known
     * dataset skips DATASET_STAT; a put refused as the wrong shape asks again. */
    struct {
        char name[TS_NAME_MAX + 1];
        uint32_t chunk;
    } chunk_memo[8];
    unsigned chunk_memo_next;
};

/* ---- messages and checks at entry (request.c) ----------------------------------------------- */

/* A placed read's registration of its buffer, given back (at its reply, or when the connection
 * fails, before the transport closes); bad: the bytes failed their CRC. */
void ts_req_unplace(struct tessera_client *c, struct ts_req *r, int bad);

/* A malformed reply: the call fails with TS_EPROTO and says why. */
int ts_proto_err(struct tessera_client *c, const char *what);
/* A refusal with status rc was decoded from r (left after the message): a TS_ESTALE reply
 * carries the node's map there; keep the newest for the router (ts_conn_take_stale_map). */
void ts_note_stale(struct tessera_client *c, struct ts_rd *r, int rc);
/* Checks common to every call: a usable handle, a clean message slot. */
int ts_enter(tessera_client *c);
/* A valid dataset name, else TS_ENAME with a message. */
int ts_name_check(tessera_client *c, const char *name);
/* ts_enter() for a call on a dataset: a valid name too. */
int ts_enter_name(tessera_client *c, const char *name);
/* ts_enter(), then a result pointer (have_out, else TS_EINVAL), then a valid name. */
int ts_enter_out_name(tessera_client *c, int have_out, const char *name);
/* ts_enter() for the calls that only a connection takes: never a handle with no connection
 * of its own (a router's). */
int ts_enter_conn(tessera_client *c);
/* A read's name, range and buffer (ts_conn_read, ts_conn_read_submit; read.c). */
int ts_read_args(tessera_client *c, const char *name, uint64_t off, size_t len, void *buf);
/* Everything tessera_scrub checks (name NULL: every dataset); *rep becomes tmp when NULL, and
 * is cleared. */
int ts_scrub_args(tessera_client *c, const char *name, struct ts_scrub_report **rep,
                  struct ts_scrub_report *tmp);
/* Everything tessera_read_submit checks before a read is queued (*op cleared first). */
int ts_submit_args(tessera_client *c, const char *name, uint64_t off, size_t len, void *buf,
                   uint64_t *op);
/* The start of a list call (the caller has emptied *out): a usable handle, outputs given
 * (ops.c). */
int ts_list_begin(tessera_client *c, int have_out, size_t *n);
/* The policy of a dataset created without one (ops.c). */
extern const struct ts_dataset_policy ts_policy_default;

/* ---- request records (request.c) ------------------------------------------------------------ */

struct ts_req *ts_req_new(struct tessera_client *c, uint8_t op);
/* A new request whose body starts with the dataset name. */
struct ts_req *ts_req_name(struct tessera_client *c, uint8_t op, const char *name);
/* The index in c->live of request id, or SIZE_MAX. */
size_t ts_live_find(const struct tessera_client *c, uint64_t id);
/* Back to the handle's free list (NULL is a no-op). */
void ts_req_free(struct tessera_client *c, struct ts_req *r);
/* Releases r and its buffers for good. */
void ts_req_destroy(struct ts_req *r);
/* Sent and answered: the request is the caller's again. */
void ts_req_finish(struct tessera_client *c, struct ts_req *r);

/* ---- receiving (recv.c) --------------------------------------------------------------------- */

/* Ready for the next frame; what stage holds of it (and the table buffer) is kept. */
void ts_rx_reset(struct tessera_client *c);
/* Room for a reply's table of len bytes in rx.table (kept across replies); none of it in yet. */
int ts_rx_table(struct rx *x, size_t len);
/* The reply being received is complete (rc: the request's outcome when not in the reply). */
void ts_rx_complete(struct tessera_client *c, int rc);
/* Skips the rest (left bytes) of a frame whose request fails with rc (framing is intact). */
void ts_rx_drain(struct tessera_client *c, size_t left, int rc);
/* READV replies (readv.c): the head (status, count) is in rx.rhead (rx.rhead_len bytes); n
 * more bytes arrived into the target ts_readv_iov gave; the targets for the next receive (the
 * table, then the ranges' buffers, at most max; their count). 0 or TS_E*. */
int ts_rx_readv_head(struct tessera_client *c);
int ts_rx_readv_arrived(struct tessera_client *c, size_t n);
int ts_rx_readv_iov(struct tessera_client *c, struct iovec *iov, int max);
/* Receives what is there, up to a budget; 0 or TS_E*. */
int ts_rx_some(struct tessera_client *c, int *progress);

/* ---- the engine (conn.c) -------------------------------------------------------------------- */

/* The connection is gone (or no longer trusted): every request still in flight completes
 * with rc, and later calls get TS_ECONNRESET. */
void ts_fail_conn(struct tessera_client *c, int rc);
/* Hands what the send queue holds to the transport without blocking; 0 or TS_E*. */
int ts_tx_step(struct tessera_client *c, int *progress);

typedef int (*ts_pump_cond)(const struct tessera_client *c, const void *arg);
/* Conditions for ts_pump: request arg is done; some submitted read is done. */
int ts_cond_done(const struct tessera_client *c, const void *arg);
int ts_cond_any_user(const struct tessera_client *c, const void *arg);
/* Sends and receives until cond holds (at most the handle's timeout); 0 when it holds, else
 * the code that broke the connection. */
int ts_pump(struct tessera_client *c, ts_pump_cond cond, const void *arg);
/* Queues r with its data tail (borrowed until r is done) once fewer than max_inflight
 * requests are in flight. On failure r is still the caller's to free. */
int ts_req_send(struct tessera_client *c, struct ts_req *r, const void *data, size_t len);
/* A submitted read r (tessera_read_submit, READV): its id into *op, sent now unless sends are
 * batched until the next wait (read.c). */
void ts_req_submitted(tessera_client *c, struct ts_req *r, uint64_t *op);
/* A collected READV (readv.c): its ranges' outcomes into r->rv; 0 or why none was read. */
int ts_conn_readv_result(tessera_client *c, struct ts_req *r, size_t *out_len);
/* A request-reply round trip. On success the reply body is in *body (pointing into r, which
 * the caller frees after decoding); on failure r is freed and the server's message is in
 * c->err. */
int ts_call(struct tessera_client *c, struct ts_req *r, struct ts_rd *body);
/* A round trip whose reply carries nothing after the status; r is freed either way. */
int ts_call_status(struct tessera_client *c, struct ts_req *r);
/* A request with just a dataset name as its body; the reply body is in *body. */
int ts_call_name(struct tessera_client *c, uint8_t op, const char *name, struct ts_req **out,
                 struct ts_rd *body);
/* The same with request header flags (TS_F_BRIEF). */
int ts_call_name_flags(struct tessera_client *c, uint8_t op, const char *name, uint16_t flags,
                       struct ts_req **out, struct ts_rd *body);

#endif
