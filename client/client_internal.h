/*
 * libtessera internals: the transport operations table, the layers of the library (the public
 * calls' internal twins in api.c, the connection layer's ts_conn_*, the router's ts_cl_*) and
 * the pure reply decoders. Not installed; none of these symbols is exported (tessera.map).
 */
#ifndef TS_CLIENT_INTERNAL_H
#define TS_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"

/* ---- transports ----------------------------------------------------------------------------- */

/* Readiness bits for ts_transport_ops.wait. */
#define TS_IO_READ 0x1
#define TS_IO_WRITE 0x2

/* Everything a transport needs to connect. Strings are borrowed for the call only. */
struct ts_conn_params {
    const char *host; /* name or address literal, without brackets */
    const char *port;
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    const char *tls_server_name; /* NULL: host */
    int timeout_ms;              /* < 0: none */
    const uint8_t *rdma_token;   /* RDMA: TS_RDMA_TOKEN_LEN bytes from RDMA_TOKEN (open.c) */
    char *err;                   /* a human-readable reason on failure, may be NULL */
    size_t errlen;
};

/* Every transport object starts with this; the transport's own state follows it. */
struct ts_transport {
    const struct ts_transport_ops *ops;
};

/*
 * Device memory (GPU memory) as a transport registers it for the peer to write (GPUDirect
 * RDMA): dmabuf gives a DMA-BUF file descriptor covering [buf, buf+len) and buf's offset in it
 * (0, or TS_E*; the transport closes *fd once registered). With dmabuf NULL the device address
 * is registered as it is, which works where the nvidia-peermem module is loaded.
 */
struct ts_reg_src {
    int (*dmabuf)(void *ctx, void *buf, size_t len, int *fd, uint64_t *off);
    void *ctx;
};

/*
 * A read into memory the host cannot touch (GPU memory; gpu/placed.c): the node places the
 * bytes (RDMA), src says how the transport registers dst, and verify checks the placed bytes
 * against the reply's piece table (npieces entries of length and CRC32C, le32 each) once the
 * table is in: 0, TS_ECORRUPT (a piece fails), or TS_E* (the check itself failed). Such a read
 * is never received in-band (a reply that would be fails with TS_EPROTO) and never retried
 * here: its caller decides.
 */
struct ts_read_target {
    const struct ts_reg_src *src;
    int (*verify)(void *ctx, const uint8_t *table, uint32_t npieces, const void *dst, size_t len);
    void *ctx;
};

/*
 * One table per transport (style rule 10). Every function returns a TS_E* code on failure,
 * converted from the dependency's convention inside the transport's own file.
 *   connect: a connected, handshaken transport in *out.
 *   send:    writes from iov without blocking; bytes written (0: would block) or TS_E*.
 *   recv:    reads into the iovcnt buffers of iov, in order, without blocking; bytes read (0:
 *            would block) or TS_E* (the peer closing is TS_ECONNRESET). Fewer bytes than the
 *            buffers hold means the transport had no more at that moment: the caller waits
 *            before it receives again.
 *   wait:    blocks until the transport can make progress on events (TS_IO_*) or timeout_ms
 *            passes (< 0: forever); the events that are ready, 0 on timeout, or TS_E*.
 *   error:   why the last send or recv failed, in words; NULL when there is nothing to add
 *            to the code (optional).
 *   pollfd:  for waiting on several transports at once: 1 when it can make progress on
 *            events (TS_IO_*) right now (bytes buffered inside the transport), else 0 with
 *            the descriptor and the poll() events to wait for in *fd and *pevents; or TS_E*.
 *   close:   releases everything (registrations left included); NULL is a no-op.
 *   reg:     (optional: a transport the server can write into) registers [buf, buf+len) for
 *            the peer to write: its address and key in *addr, *key, a handle in *h. TS_ENOTSUP
 *            when this range cannot be (the read goes in-band). src NULL: host memory; else
 *            memory the host cannot touch (GPU memory), registered as src says.
 *   dereg:   (with reg) the read into a handle's memory is over, before close; bad: its
 *            bytes failed their CRC (a registration that may point at other pages: drop it).
 *   rx_lowat: (optional) a wait for TS_IO_READ returns only once at least bytes are there to
 *            receive (1: the first byte), or the receive window is nearly full; 0 or TS_E*.
 */
struct ts_transport_ops {
    const char *name;
    int (*connect)(struct ts_transport **out, const struct ts_conn_params *p);
    long (*send)(struct ts_transport *t, const struct iovec *iov, int iovcnt);
    long (*recv)(struct ts_transport *t, const struct iovec *iov, int iovcnt);
    int (*wait)(struct ts_transport *t, int events, int timeout_ms);
    const char *(*error)(struct ts_transport *t);
    int (*pollfd)(struct ts_transport *t, int events, int *fd, short *pevents);
    void (*close)(struct ts_transport *t);
    int (*reg)(struct ts_transport *t, void *buf, size_t len, const struct ts_reg_src *src,
               uint64_t *addr, uint32_t *key, void **h);
    void (*dereg)(struct ts_transport *t, void *h, int bad);
    int (*rx_lowat)(struct ts_transport *t, size_t bytes);
};

extern const struct ts_transport_ops ts_transport_tcp;
extern const struct ts_transport_ops ts_transport_tls;
extern const struct ts_transport_ops ts_transport_rdma;
/* The RDMA transport's registration cache: reads whose buffer was registered already, and
 * registrations made (0, 0 for other transports). */
void ts_rdma_reg_stats(struct ts_transport *t, uint64_t *hits, uint64_t *misses);
/* The same for a connection's transport (a single-node handle). */
void ts_conn_reg_stats(tessera_client *c, uint64_t *hits, uint64_t *misses);

/* A connected, non-blocking TCP socket for host:port (shared by the TCP and TLS transports). */
int ts_tcp_connect_fd(const struct ts_conn_params *p, int *fd);
/* Wraps an already connected stream socket (tests use a socketpair); takes fd on success. */
int ts_tcp_from_fd(struct ts_transport **out, int fd);
/* Waits for events on fd with poll(); what ts_transport_ops.wait returns. */
int ts_fd_wait(int fd, int events, int timeout_ms);
/* TS_IO_* events as poll() events. */
short ts_poll_events(int events);
/* Formats a reason into p->err (when it has room). */
void ts_conn_err(const struct ts_conn_params *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- small helpers -------------------------------------------------------------------------- */

/*
 * Room for one more element in array v of *cap elements of size bytes, n of them used: v, or
 * v grown (to first elements, then doubling; *cap updated). NULL when out of memory (v is
 * unchanged and still the caller's).
 */
void *ts_grow(void *v, size_t n, size_t *cap, size_t size, size_t first);

/* ---- addresses ------------------------------------------------------------------------------ */

#define TS_DEFAULT_ADDRESS "127.0.0.1:7070"
#define TS_DEFAULT_PORT "7070"

struct ts_addr {
    const struct ts_transport_ops *ops; /* NULL: TCP or TLS, by the options */
    char host[256];
    char port[16];
};

/*
 * Parses "[scheme://]host[:port]": host a name, an IPv4 literal or a bracketed IPv6 literal
 * ("[::1]:7070"; without brackets more than one ':' is refused, never guessed at); port 1 to
 * 65535, default 7070; scheme "tcp" or "rdma". 0 or TS_EINVAL.
 */
int ts_addr_parse(const char *s, struct ts_addr *a);
/* The same, saying why an address is refused in why[cap] (may be NULL). */
int ts_addr_parse_why(const char *s, struct ts_addr *a, char *why, size_t cap);

/* ---- the public calls' internal twins (api.c) ------------------------------------------------
 *
 * libtessera is three layers, each calling only the one below it:
 *   api.c       the public calls of a handle: each checks its arguments once and goes to the
 *               router (a handle in cluster mode) or to the connection (a single node);
 *               opening a handle (which asks the node for its cluster map and makes a router
 *               when it has one) and closing it.
 *   cluster*.c  the router (ts_cl_*): keeps the map and routes every call over
 *               sub-connections, one per node, with the ts_conn_* calls below.
 *   the rest    the connection layer (ts_conn_*: open.c, ops.c, read.c, put.c over request.c,
 *               recv.c, conn.c): one connection to one node; it never knows the router.
 */

/* Why tessera_client_open refuses tls_cert/tls_key without tls_ca (TS_EINVAL). */
#define TS_CERT_NEEDS_CA                                                                           \
    "a client certificate needs --tls-ca (TLS is used only with a CA to verify the server)"

/*
 * tessera_client_open that also says why it failed, in words, into err[errlen] (the handle
 * does not exist then, so tessera_client_error cannot). Used by the CLI.
 */
int ts_client_open_ex(tessera_client **out, const struct tessera_opts *o, char *err, size_t errlen);
/* Changes the per-request timeout of an open handle (< 0: none). */
void ts_client_set_timeout(tessera_client *c, int timeout_ms);
/* Like tessera_client_open, over t (taken on success and failure alike). Tests. */
int ts_client_open_transport(tessera_client **out, const struct tessera_opts *o,
                             struct ts_transport *t, char *err, size_t errlen);
/* The node that served the submitted read tessera_wait / tessera_wait_any last returned. */
const char *ts_client_served(const tessera_client *c);
/* Submitted reads the handle sent to another replica after theirs failed (0: a single node). */
uint64_t ts_client_resubmits(const tessera_client *c);
/*
 * For a caller that submits reads in bursts and then waits (the plan reader):
 * defer_tx: submitted reads are queued and sent together by the next tessera_wait* (fewer,
 *           larger sends);
 * on_block: called (no lock of the library held) each time a wait is about to sleep in the
 *           kernel, so the caller can hand over what it finished in one go instead of waking
 *           its own consumer once per reply. It returns how many bytes of replies the wait may
 *           let arrive before it wakes (0: wake at the first byte): a consumer with units in
 *           hand lets the thread sleep through many replies and receive them in one go,
 *           instead of waking per segment the socket gets. The connection takes at most what
 *           its sent reads will bring, and wakes after RX_BATCH_WAIT_MS regardless (a refusal
 *           is shorter than the data it refuses).
 */
struct ts_batch {
    int defer_tx;
    size_t (*on_block)(void *arg);
    void *arg;
};
void ts_client_batch(tessera_client *c, const struct ts_batch *b);

/*
 * Many small reads in one request (READV, docs/protocol.md): n ranges of the dataset's shards,
 * each into its own host buffer. The whole READV is collected by tessera_wait / _wait_any as
 * one op (0: every range has its own outcome in rc and got; TS_E*: none was read). On a router
 * the READV goes to the node that serves its first range, once, without failover: ranges that
 * fail are for the caller to read again one by one (tessera_read_submit), which fails over.
 * v must stay in place until the op is collected. At most TS_READV_MAX ranges and
 * TS_READV_BYTES bytes.
 */
struct ts_readv {
    uint32_t shard;
    uint64_t off;
    size_t len;
    uint8_t *dst;
    int rc; /* the range's outcome, once the READV is collected */
    size_t got;
};
int ts_client_readv_submit(tessera_client *c, const char *name, struct ts_readv *v, size_t n,
                           uint64_t *op);
/* Which connection a read of (shard, off) goes to first (READVs are grouped by it): 0 on a
 * single node; SIZE_MAX when none is usable or that node is reached by RDMA (READs there are
 * placed straight into the caller's memory: no READV). */
size_t ts_client_read_lane(tessera_client *c, const char *name, uint32_t shard, uint64_t off);
/* HINT (hint.c): n (1..TS_HINT_MAX) ranges of v (dst unused) that will be read next, to the
 * node(s) that will serve them; what they did is added to *res. Advisory. */
struct ts_hint_result {
    uint64_t queued, dropped, skipped; /* chunks */
    size_t first_dropped; /* the first range of v with a chunk dropped (n: none); set by the
                             call, which the caller starts at n */
};
int ts_client_hint(tessera_client *c, const char *name, const struct ts_readv *v, size_t n,
                   struct ts_hint_result *res);
/* A handle's replica choices: the same salt makes handles pick the same replica for a region
 * (a plan reader's connections, and every reader: one node's cache serves a region). No-op on
 * a single node. */
void ts_client_route_salt(tessera_client *c, uint64_t salt);
/* Whether reads of the handle are better sent as READVs when small: not where the transport
 * places reads straight into the caller's memory (RDMA; on a cluster ts_client_read_lane
 * decides per node). */
int ts_client_readv_useful(const tessera_client *c);

/* ---- the connection layer (open.c, ops.c, read.c, put.c, conn.c) ------------------------------
 *
 * One connection to one node: a single-node handle, or a sub-connection of the router (which
 * never asks for the map and never routes). Each ts_conn_* call named after a public call
 * does what that call does on a single node, argument checks included.
 */

struct ts_map;
struct ts_cluster;

/*
 * A top-level connection to o->address (connect, TLS, HELLO, the options kept) and its
 * node's cluster map in *map (NULL: a single node; MAP_GET refused or unknown). Says why it
 * failed into err[errlen].
 */
int ts_conn_open_seed(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                      char *err, size_t errlen);
/* The same over t (taken on success and failure alike). */
int ts_conn_open_transport(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                           struct ts_transport *t, char *err, size_t errlen);
/*
 * Opens a sub-connection to o->address (connect, TLS, HELLO; no MAP_GET). Its requests carry
 * *epoch_ref (the router's map epoch) rather than the epoch of the replies.
 */
int ts_conn_open(tessera_client **out, const struct tessera_opts *o, const uint64_t *epoch_ref,
                 char *err, size_t errlen);
/*
 * A handle with no connection of its own (a router's): seed's node, role and limits, map
 * epoch epoch, and seed's options, whose strings move over from seed. TS_ENOMEM leaves seed
 * as it was.
 */
int ts_conn_shell(tessera_client **out, tessera_client *seed, uint64_t epoch);
/* Closes the connection and frees the handle (NULL is a no-op). */
void ts_conn_close(tessera_client *c);
/* Makes an open single-node handle a sub-connection whose requests carry *epoch_ref. */
void ts_conn_attach(tessera_client *c, const uint64_t *epoch_ref);

/* The code that ended the connection, or 0 while it is usable. */
int ts_conn_broken(const tessera_client *c);
/* The highest map epoch any reply on the connection carried (HELLO included). */
uint64_t ts_conn_seen_epoch(const tessera_client *c);
/* The newest map a TS_ESTALE reply carried since the last call, or NULL; the caller frees it. */
struct ts_map *ts_conn_take_stale_map(tessera_client *c);
/* The options a top-level handle was opened with (strings owned by the handle). */
const struct tessera_opts *ts_conn_opts(const tessera_client *c);
/* Per-request timeout of a handle (ms; < 0: none). */
int ts_conn_timeout(const tessera_client *c);
/* Sets it (0: the default). */
void ts_conn_set_timeout(tessera_client *c, int timeout_ms);
/* ts_client_batch for one connection (the default: sends go at once, no hook). */
void ts_conn_batch(tessera_client *c, const struct ts_batch *b);
/* What tessera_client_role / _error / _node say of a handle (NULL: 0, ""). */
int ts_conn_role(const tessera_client *c);
const char *ts_conn_error(const tessera_client *c);
const char *ts_conn_node(const tessera_client *c);
/* Sets the handle's message, as tessera_client_error() shows it. */
void ts_conn_set_error(tessera_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * MAP_GET: *out the node's map (NULL when it has none: epoch 0, no nodes), *epoch its epoch.
 * 0 or TS_E* (an old server answers TS_ENOTSUP).
 */
int ts_conn_map_get(tessera_client *c, struct ts_map **out, uint64_t *epoch);
/* MAP_PUSH: *epoch the epoch now in force on the node. */
int ts_conn_map_push(tessera_client *c, const struct ts_map *m, uint64_t *epoch);
/* PG_DROP: the node deletes its copies of pg's shards it no longer holds a rank for. */
int ts_conn_pg_drop(tessera_client *c, uint32_t pg, const char *dataset, uint32_t *shards,
                    uint64_t *bytes);

/* The public calls of the same names, on one connection. */
int ts_conn_dataset_create(tessera_client *c, const char *name, const struct ts_dataset_policy *p);
int ts_conn_dataset_list(tessera_client *c, struct ts_dataset_info **out, size_t *n);
int ts_conn_dataset_stat(tessera_client *c, const char *name, struct ts_dataset_info *out);
/* Its record only (policy and state; shards and bytes 0): DATASET_STAT with TS_F_BRIEF. */
int ts_conn_dataset_policy(tessera_client *c, const char *name, struct ts_dataset_info *out);
int ts_conn_dataset_seal(tessera_client *c, const char *name);
int ts_conn_dataset_delete(tessera_client *c, const char *name);
/* DATASET_TIER on this node: the dataset's erasure code (0, 0: replicated only). */
int ts_conn_dataset_tier(tessera_client *c, const char *name, unsigned k, unsigned m, int dropped);
/* CHUNK_REPAIR on this node: good bytes for chunk idx of fragment store NAME#f's shard. */
int ts_conn_chunk_repair(tessera_client *c, const char *name, uint32_t shard, uint32_t idx,
                         const void *data, uint32_t len);
int ts_conn_shard_records(tessera_client *c, const char *name, uint32_t shard, uint64_t **offsets,
                          uint32_t *n);
int ts_conn_shard_stat(tessera_client *c, const char *name, uint32_t shard,
                       struct ts_shard_info *out);
int ts_conn_shard_list(tessera_client *c, const char *name, struct ts_shard_info **out, size_t *n);
/* n (up to TS_PUT_MANY_MAX) puts of one shard number at once, each on its own connection
 * (cs[i] distinct), without records: rcs[i] each one's result (put.c). */
#define TS_PUT_MANY_MAX 64
void ts_conn_put_many(tessera_client *const *cs, const char *const *names, uint32_t shard,
                      const void *const *bufs, const size_t *lens, int *rcs, unsigned n);
int ts_conn_put(tessera_client *c, const char *name, uint32_t shard, const void *buf, size_t len,
                const uint64_t *records, uint32_t nrecords);
int ts_conn_put_fd(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size);
int ts_conn_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                 void *buf, size_t *out_len);
int ts_conn_read_submit(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *buf, uint64_t *op);
/* ts_conn_read_submit into device memory (tgt): TS_ENOTSUP when the connection cannot place
 * reads (not RDMA) or the transport cannot register buf as tgt->src says. */
int ts_conn_read_submit_to(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                           size_t len, void *buf, const struct ts_read_target *tgt, uint64_t *op);
/* 1 when c is one connection whose transport lets the node place reads (RDMA), else 0. */
int ts_conn_can_place(const tessera_client *c);
int ts_conn_readv_submit(tessera_client *c, const char *name, struct ts_readv *v, size_t n,
                         uint64_t *op);
/* READV's and HINT's request ranges (readv.c): u32 n, then each (u32 shard, u64 off, u32 len). */
void ts_wr_ranges(struct ts_wr *w, const struct ts_readv *v, size_t n);
/* HINT on this connection (hint.c): a round trip; the node's counts added to *res. */
int ts_conn_hint(tessera_client *c, const char *name, const struct ts_readv *v, size_t n,
                 struct ts_hint_result *res);
int ts_conn_wait(tessera_client *c, uint64_t op, size_t *out_len);
int ts_conn_wait_any(tessera_client *c, uint64_t *op, size_t *out_len);
int ts_conn_scrub(tessera_client *c, const char *name, struct ts_scrub_report *rep,
                  void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk,
                             int rc),
                  void *arg);
int ts_conn_status(tessera_client *c, char **json);

/* DATASET_CREATE on this handle's node with the incarnation every node of a cluster records
 * for this creation (0: the node picks one; single node). No checks at entry. */
int ts_conn_dataset_create_inc(tessera_client *c, const char *name,
                               const struct ts_dataset_policy *p, uint64_t incarnation);
/* DATASET_SEAL with the trailing flags byte (TS_SEAL_LOCAL_ONLY). */
int ts_conn_dataset_seal_flags(tessera_client *c, const char *name, uint8_t flags);
/* Submitted reads on the connection not collected yet. */
size_t ts_conn_user_pending(const tessera_client *c);
/* 1 when submitted read op has completed (ts_conn_wait returns at once), 0 while it is in
 * flight, TS_ENOENT when the connection has no such read. */
int ts_conn_op_done(const tessera_client *c, uint64_t op);
/*
 * Drives the connections v[0..n) at once until one of them holds a completed submitted read
 * (a failed connection completes its reads with its code). After timeout_ms (< 0: none)
 * without one, every connection still waiting for a read is failed with TS_ETIMEDOUT.
 * 0, or TS_ENOENT when no connection has a read in flight.
 */
int ts_conns_wait(tessera_client *const *v, size_t n, int timeout_ms);

/* ---- the router (client/cluster*.c) ---------------------------------------------------------
 *
 * In cluster mode the handle the caller holds is a router: it has no connection of its own,
 * keeps the cluster map, and routes every call over sub-connections, one per node, opened
 * lazily. Every ts_cl_* function named after a public call implements it for a router handle
 * c whose arguments api.c has checked (c's message was cleared already); cl is c's cluster
 * state.
 */

/* Takes seed (an open handle to one node, which becomes that node's sub-connection) and map. */
int ts_cl_create(struct ts_cluster **out, tessera_client *router, tessera_client *seed,
                 struct ts_map *map, const struct tessera_opts *o);
void ts_cl_free(struct ts_cluster *cl);
uint64_t ts_cl_epoch(const struct ts_cluster *cl);
void ts_cl_set_timeout(struct ts_cluster *cl, int timeout_ms);
const struct ts_map *ts_cl_map(const struct ts_cluster *cl);
const char *ts_cl_served(const struct ts_cluster *cl);
uint64_t ts_cl_resubmits(const struct ts_cluster *cl);
/* ts_client_batch for the router: its sub-connections, now and later. */
void ts_cl_batch(struct ts_cluster *cl, const struct ts_batch *b);

int ts_cl_dataset_create(tessera_client *c, struct ts_cluster *cl, const char *name,
                         const struct ts_dataset_policy *p);
int ts_cl_dataset_list(tessera_client *c, struct ts_cluster *cl, struct ts_dataset_info **out,
                       size_t *n);
int ts_cl_dataset_stat(tessera_client *c, struct ts_cluster *cl, const char *name,
                       struct ts_dataset_info *out);
int ts_cl_dataset_seal(tessera_client *c, struct ts_cluster *cl, const char *name);
int ts_cl_dataset_delete(tessera_client *c, struct ts_cluster *cl, const char *name);
int ts_cl_shard_records(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                        uint64_t **offsets, uint32_t *n);
int ts_cl_shard_stat(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                     struct ts_shard_info *out);
int ts_cl_shard_list(tessera_client *c, struct ts_cluster *cl, const char *name,
                     struct ts_shard_info **out, size_t *n);
/* fd < 0: upload buf/len with records; else upload size bytes (or to EOF) from fd. */
int ts_cl_put(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
              const void *buf, size_t len, const uint64_t *records, uint32_t nrecords, int fd,
              uint64_t size);
int ts_cl_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
               uint64_t off, size_t len, void *buf, size_t *out_len);
int ts_cl_read_submit(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                      uint64_t off, size_t len, void *buf, uint64_t *op);
int ts_cl_wait(tessera_client *c, struct ts_cluster *cl, uint64_t op, size_t *out_len);
int ts_cl_readv_submit(tessera_client *c, struct ts_cluster *cl, const char *name,
                       struct ts_readv *v, size_t n, uint64_t *op);
size_t ts_cl_read_lane(struct ts_cluster *cl, const char *name, uint32_t shard, uint64_t off);
/* The salt of the router's replica rotation (cluster.c). */
void ts_cl_set_salt(struct ts_cluster *cl, uint64_t salt);
/* HINT through the router (hint.c): one per lane; a node that fails one is left out. */
int ts_cl_hint(struct ts_cluster *cl, const char *name, const struct ts_readv *v, size_t n,
               struct ts_hint_result *res);
int ts_cl_wait_any(tessera_client *c, struct ts_cluster *cl, uint64_t *op, size_t *out_len);
int ts_cl_scrub(tessera_client *c, struct ts_cluster *cl, const char *name,
                struct ts_scrub_report *rep,
                void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk, int rc),
                void *arg);
int ts_cl_status(tessera_client *c, struct ts_cluster *cl, char **json);
/* cl NULL: c is a single-node handle; a bare router of its own reaches the file's nodes. */
int ts_cl_map_push_file(tessera_client *c, struct ts_cluster *cl, const char *path,
                        uint64_t *new_epoch);
int ts_cl_failover(tessera_client *c, struct ts_cluster *cl, uint32_t pg, uint64_t *new_epoch);
/* STATUS of node i of the map (connecting to it if needed). */
int ts_cl_node_status(tessera_client *c, struct ts_cluster *cl, size_t node, char **json);
/* Adopts the newest map any node has. */
void ts_cl_map_refresh(struct ts_cluster *cl);
/* READ from node i of the map alone. */
/* Erasure-coded shards (cluster_ec.c, issue 33): the shard's K+M fragments encoded from buf
 * and each put, durably, to its position's node as NAME#f (an admin's handle); and a range of
 * a shard of shard_len bytes read from its data fragments, rebuilt from any K where one cannot
 * be read (TS_EUNAVAIL naming the fragments when fewer than K can). */
struct ts_ec_read_stats {
    uint64_t direct;  /* pieces read from their data fragment */
    uint64_t rebuilt; /* pieces rebuilt from K others */
    uint64_t bad;     /* bit f: fragment f could not be read */
};
int ts_cl_ec_put(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                 const void *buf, size_t len, unsigned k, unsigned m);
int ts_cl_ec_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                  uint64_t shard_len, unsigned k, unsigned m, uint64_t off, size_t len, void *buf,
                  struct ts_ec_read_stats *st);
/* Repair of an erasure-coded dataset's fragments (cluster_ec.c): TS_REPAIR_FULL reads every
 * chunk (tessera dataset repair), TS_REPAIR_PRESENCE checks only that each fragment is on the
 * node of its position (the monitor after a map change). */
enum { TS_REPAIR_FULL, TS_REPAIR_PRESENCE, TS_REPAIR_CHUNK };
int ts_cl_dataset_repair(tessera_client *c, struct ts_cluster *cl, const char *name, int mode,
                         struct tessera_repair_report *rep);
/* One fragment chunk a node found damaged (chunk), or the fragment it found missing
 * (UINT32_MAX), of frag (NAME#f) shard shard: rebuilt from K others and written at its
 * position's node. TS_ENOENT: no such dataset, shard or fragment (nothing to repair). */
int ts_cl_ec_chunk_repair(tessera_client *c, struct ts_cluster *cl, const char *frag,
                          uint32_t shard, uint32_t chunk, struct tessera_repair_report *rep);
int ts_cl_dataset_tier(tessera_client *c, struct ts_cluster *cl, const char *name, unsigned k,
                       unsigned m, tessera_tier_progress progress, void *arg);
/* Before node id is brought up (from out or down): TS_EBUSY (and why) if it answers and holds a
 * dataset's replicas dropped that the other nodes hold otherwise (replicated, kept, another
 * code); 0 otherwise, or when it does not answer. */
int ts_cl_node_tier_check(tessera_client *c, struct ts_cluster *cl, const char *id);
/* A read of an erasure-coded dataset (cached policy) through its fragments: 1 when the policy
 * says it is one and the read was served (*rc its result), 0 to read the replicas. */
int ts_cl_ec_try_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                      uint64_t off, size_t len, void *buf, size_t *out_len, tessera_client *sub,
                      size_t p, int *rc);
int ts_cl_node_read(tessera_client *c, struct ts_cluster *cl, size_t node, const char *name,
                    uint32_t shard, uint64_t off, size_t len, void *buf, size_t *out_len);
/* PG_DROP on node i of the map. */
int ts_cl_node_pg_drop(tessera_client *c, struct ts_cluster *cl, size_t node, uint32_t pg,
                       const char *dataset, uint32_t *shards, uint64_t *bytes);
/* DATASET_STAT on node i of the map alone (its own record: the dataset's id there). */
int ts_cl_node_dataset_stat(tessera_client *c, struct ts_cluster *cl, size_t node, const char *name,
                            struct ts_dataset_info *out);

/* ---- cluster views for the CLI (api.c) ------------------------------------------------------ */

/* The handle's cluster map; NULL on a single node. */
const struct ts_map *ts_client_map(const tessera_client *c);
/* STATUS of node i of the handle's map (connecting to it if needed). */
int ts_client_node_status(tessera_client *c, size_t node, char **json);
/* The monitor's EC repair (cli_monitor_ec.c): ts_cl_dataset_repair with a mode, and
 * ts_cl_ec_chunk_repair. */
int ts_client_ec_repair(tessera_client *c, const char *name, int mode,
                        struct tessera_repair_report *rep);
int ts_client_ec_chunk_repair(tessera_client *c, const char *frag, uint32_t shard, uint32_t chunk,
                              struct tessera_repair_report *rep);
/* ts_cl_node_tier_check (0 on a single node). */
int ts_client_node_tier_check(tessera_client *c, const char *id);
/* READ of (name, shard, off, len) from node i of the handle's map alone (no failover). */
int ts_client_node_read(tessera_client *c, size_t node, const char *name, uint32_t shard,
                        uint64_t off, size_t len, void *buf, size_t *out_len);
/* Adopts the newest map any node has (no-op on a single node). */
void ts_client_map_refresh(tessera_client *c);
/* PG_DROP on node i of the handle's map. */
int ts_client_node_pg_drop(tessera_client *c, size_t node, uint32_t pg, uint32_t *shards,
                           uint64_t *bytes);
/* The same for one dataset's copies only (tessera hot rm). */
int ts_client_node_pg_drop_dataset(tessera_client *c, size_t node, uint32_t pg, const char *dataset,
                                   uint32_t *shards, uint64_t *bytes);
/* DATASET_STAT on node i of the handle's map alone. */
int ts_client_node_dataset_stat(tessera_client *c, size_t node, const char *name,
                                struct ts_dataset_info *out);

/* ---- pure reply decoders ------------------------------------------------------------------- */

/*
 * The status at the head of a reply payload. On status 0, r is left at the reply body. On a
 * refusal, the server's message is copied into msg[cap] (cut if longer) and the status is
 * returned; a status that is not a TS_E* code, or a payload too short to hold one, is
 * TS_EPROTO.
 */
int ts_reply_status(struct ts_rd *r, char *msg, size_t cap);

struct ts_hello_reply {
    uint16_t version;
    char node[256];
    uint8_t role;
    uint32_t max_frame;
    uint64_t epoch;
};
/* The HELLO reply body (after the status). Trailing fields (newer servers) are ignored. */
int ts_hello_decode(struct ts_rd *r, struct ts_hello_reply *h);

/* The fixed head of a READ reply with status 0: i32 status, u64 shard size, u32 pieces. */
#define TS_READ_HEAD_LEN 16

struct ts_read_head {
    uint64_t shard_size;
    uint32_t npieces;
    size_t data_len; /* payload bytes after the piece table */
};

/*
 * Checks the head of a successful READ reply of payload_len bytes against the request (off,
 * len): the piece table must fit, and the data after it must be exactly the part of [off,
 * off+len) that lies within the shard. 0 or TS_EPROTO (a server that would overflow the
 * caller's buffer is a protocol error, caught before any data byte is received).
 */
int ts_read_head_decode(const uint8_t head[TS_READ_HEAD_LEN], size_t payload_len, uint64_t off,
                        size_t len, struct ts_read_head *out);
/* The same for a placed reply (flag TS_F_RDMA): the payload is the head and the table only,
 * and the data length follows from the shard size and the range asked for. */
int ts_read_head_decode_placed(const uint8_t head[TS_READ_HEAD_LEN], size_t payload_len,
                               uint64_t off, size_t len, struct ts_read_head *out);
/* The piece table (n pairs of u32 length, u32 CRC32C, as on the wire) must sum to data_len. */
int ts_read_pieces_check(const uint8_t *table, uint32_t n, size_t data_len);
/* Verifies piece CRCs [*done, n) whose bytes have fully arrived (have bytes of data so far);
 * *done and *doff advance. TS_ECORRUPT on the first mismatch. */
int ts_read_pieces_verify(const uint8_t *table, uint32_t n, const uint8_t *data, size_t have,
                          uint32_t *done, size_t *doff);

/* Bytes of a dataset info / shard info on the wire, at least (for bounding list counts). */
#define TS_DATASET_INFO_MIN 43
#define TS_SHARD_INFO_LEN 37

/* The position (in r's shard arrays) of the shard holding dataset record u (< r->total). */
size_t ts_dataset_records_pos(const struct tessera_dataset_records *r, uint64_t u);

#endif
