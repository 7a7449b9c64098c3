/*
 * tesserad's RDMA sessions (docs/protocol.md "RDMA"). rdma.c holds the rdma-core code and is
 * built only with it; rdma_stub.c stands in otherwise (tsd_rdma_start answers TS_ENOTSUP).
 *
 * A session is admitted by a token (rdma_token.c) that an authenticated TCP/TLS connection got
 * with RDMA_TOKEN; it carries that connection's role. Its frames travel as SENDs of at most
 * TS_RDMA_MSG bytes through a libevent bufferevent pair, so the connection layer (conn.c)
 * serves it like any other connection; READ data with flag TS_F_RDMA is placed in the
 * client's memory by RDMA WRITE (tsd_rdma_place) before the reply's SEND. Everything runs on
 * worker 0's event loop: the CM channel and each session's completion channel are
 * non-blocking descriptors registered there; no thread per connection.
 */
#ifndef TSD_RDMA_H
#define TSD_RDMA_H

#include <event2/bufferevent.h>
#include <stddef.h>
#include <stdint.h>

struct tsd_server;
struct tsd_worker;
struct tsd_conn;
struct tsd_rdma_sess;

/* What the RDMA layer asks of the connection layer (wired by server.c; rdma.c calls nothing
 * above it directly). */
struct tsd_rdma_hooks {
    /* An admitted session's frames flow through bev (the connection's end of a pair): a new
     * connection of role `role`; NULL when it cannot be set up (the session is dropped). */
    struct tsd_conn *(*conn_start)(struct tsd_worker *w, struct bufferevent *bev,
                                   struct tsd_rdma_sess *r, const char *peer, int role,
                                   const char *who);
    /* Placement room came back (WRITEs completed): a paused READ stream may go on. */
    void (*room)(struct tsd_conn *c);
    /* The session ended (disconnect, error, timeout): the connection goes too. */
    void (*gone)(struct tsd_conn *c);
};

/* Listens for RDMA sessions on addr (HOST:PORT; port 0 picks one); the bound address is then
 * tsd_rdma_addr(s). TS_ENOTSUP in a build without rdma-core or with no RDMA device. */
int tsd_rdma_start(struct tsd_server *s, const char *addr, const struct tsd_rdma_hooks *hooks,
                   char *why, size_t cap);
void tsd_rdma_stop(struct tsd_server *s);
/* "HOST:PORT" of the listener, or NULL when none runs. */
const char *tsd_rdma_addr(const struct tsd_server *s);
/* Sessions open now (STATUS). */
unsigned tsd_rdma_sessions(const struct tsd_server *s);

/* Places len bytes of src at raddr (rkey) in the session's peer: copied into registered memory
 * and posted as RDMA WRITEs. Returns the bytes taken (maybe fewer than len, maybe 0 when the
 * registered memory is all in flight: hooks->room is called when some comes back), or TS_E*
 * (the session is broken). src NULL places zeros. */
long tsd_rdma_place(struct tsd_rdma_sess *r, const void *src, size_t len, uint64_t raddr,
                    uint32_t rkey);
/* The connection is going away: the session is disconnected and freed (no hook is called). */
void tsd_rdma_close(struct tsd_rdma_sess *r);

/* ---- admission tokens (rdma_token.c: pure bookkeeping, built everywhere) ---------------- */

#define TSD_RDMA_TOKEN_TTL_MS 10000 /* a token not redeemed within this is refused */
#define TSD_RDMA_TOKENS 256         /* tokens outstanding at most (the oldest is dropped) */

struct tsd_rdma_token {
    uint8_t tok[16];
    uint64_t expires_ns; /* 0: free slot */
    int role;
    char who[96]; /* the identity that asked (certificate subject or peer address) */
};

struct tsd_rdma_tokens {
    void *lock; /* a pthread mutex (allocated by init) */
    struct tsd_rdma_token t[TSD_RDMA_TOKENS];
};

int tsd_rdma_tokens_init(struct tsd_rdma_tokens *tt);
void tsd_rdma_tokens_fini(struct tsd_rdma_tokens *tt);
/* A fresh random token for (role, who), valid for TSD_RDMA_TOKEN_TTL_MS from now_ns. */
int tsd_rdma_token_issue(struct tsd_rdma_tokens *tt, int role, const char *who, uint64_t now_ns,
                         uint8_t out[16]);
/* Redeems tok once: 0 with its role and identity; TS_EPERM when unknown, expired or already
 * used (why says which). */
int tsd_rdma_token_redeem(struct tsd_rdma_tokens *tt, const uint8_t tok[16], uint64_t now_ns,
                          int *role, char *who, size_t cap, const char **why);

#endif
