/*
 * libtessera internals: the transport operations table, the request engine's pieces that the
 * unit tests reach, and the pure reply decoders. Not installed.
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
    char *err;                   /* a human-readable reason on failure, may be NULL */
    size_t errlen;
};

/* Every transport object starts with this; the transport's own state follows it. */
struct ts_transport {
    const struct ts_transport_ops *ops;
};

/*
 * One table per transport (style rule 10). Every function returns a TS_E* code on failure,
 * converted from the dependency's convention inside the transport's own file.
 *   connect: a connected, handshaken transport in *out.
 *   send:    writes from iov without blocking; bytes written (0: would block) or TS_E*.
 *   recv:    reads up to len bytes into buf without blocking; bytes read (0: would block) or
 *            TS_E* (the peer closing is TS_ECONNRESET).
 *   wait:    blocks until the transport can make progress on events (TS_IO_*) or timeout_ms
 *            passes (< 0: forever); the events that are ready, 0 on timeout, or TS_E*.
 *   error:   why the last send or recv failed, in words; NULL when there is nothing to add
 *            to the code (optional).
 *   close:   releases everything; NULL is a no-op.
 */
struct ts_transport_ops {
    const char *name;
    int (*connect)(struct ts_transport **out, const struct ts_conn_params *p);
    long (*send)(struct ts_transport *t, const struct iovec *iov, int iovcnt);
    long (*recv)(struct ts_transport *t, void *buf, size_t len);
    int (*wait)(struct ts_transport *t, int events, int timeout_ms);
    const char *(*error)(struct ts_transport *t);
    void (*close)(struct ts_transport *t);
};

extern const struct ts_transport_ops ts_transport_tcp;
extern const struct ts_transport_ops ts_transport_tls;
extern const struct ts_transport_ops ts_transport_rdma;

/* A connected, non-blocking TCP socket for host:port (shared by the TCP and TLS transports). */
int ts_tcp_connect_fd(const struct ts_conn_params *p, int *fd);
/* Wraps an already connected stream socket (tests use a socketpair); takes fd on success. */
int ts_tcp_from_fd(struct ts_transport **out, int fd);
/* Waits for events on fd with poll(); what ts_transport_ops.wait returns. */
int ts_fd_wait(int fd, int events, int timeout_ms);
/* Formats a reason into p->err (when it has room). */
void ts_conn_err(const struct ts_conn_params *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- addresses ------------------------------------------------------------------------------ */

#define TS_DEFAULT_ADDRESS "127.0.0.1:7070"
#define TS_DEFAULT_PORT "7070"

struct ts_addr {
    const struct ts_transport_ops *ops; /* NULL: TCP or TLS, by the options */
    char host[256];
    char port[16];
};

/*
 * Parses "[scheme://]host[:port]": host a name, an IPv4 literal or a bracketed IPv6 literal;
 * scheme "tcp" or "rdma". 0 or TS_EINVAL.
 */
int ts_addr_parse(const char *s, struct ts_addr *a);

/* ---- opening over a given transport (tests) ---------------------------------------------------
 */

/*
 * tessera_client_open that also says why it failed, in words, into err[errlen] (the handle
 * does not exist then, so tessera_client_error cannot). Used by the CLI.
 */
int ts_client_open_ex(tessera_client **out, const struct tessera_opts *o, char *err, size_t errlen);
/* Changes the per-request timeout of an open handle (< 0: none). */
void ts_client_set_timeout(tessera_client *c, int timeout_ms);
/* Like tessera_client_open, over t (taken on success and failure alike). */
int ts_client_open_transport(tessera_client **out, const struct tessera_opts *o,
                             struct ts_transport *t, char *err, size_t errlen);

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
/* The piece table (n pairs of u32 length, u32 CRC32C, as on the wire) must sum to data_len. */
int ts_read_pieces_check(const uint8_t *table, uint32_t n, size_t data_len);
/* Verifies piece CRCs [*done, n) whose bytes have fully arrived (have bytes of data so far);
 * *done and *doff advance. TS_ECORRUPT on the first mismatch. */
int ts_read_pieces_verify(const uint8_t *table, uint32_t n, const uint8_t *data, size_t have,
                          uint32_t *done, size_t *doff);

/* Bytes of a dataset info / shard info on the wire, at least (for bounding list counts). */
#define TS_DATASET_INFO_MIN 42
#define TS_SHARD_INFO_LEN 37

#endif
