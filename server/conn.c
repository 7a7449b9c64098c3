/*
 * tesserad connections: each is a small state machine
 *   handshake (TLS only) -> serving (frames parsed and dispatched in order)
 *   -> streaming (a READ reply is produced as the peer drains it; input paused)
 *   -> closing (output flushed, then freed),
 * plus the reply builders every handler uses. The request handlers (ops.c) are reached only
 * through the table the server hands over (s->ops): this layer calls nothing above it.
 */
#include "server_internal.h"

#include <errno.h>
#include <event2/bufferevent_ssl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Largest payload of any opcode: the bound on what a header may announce. */
static uint32_t max_payload_any(void)
{
    static uint32_t m; /* computed once: the opcode table is constant */
    if (!m)
        for (unsigned op = 0; op < TS_OP_MAX; op++) {
            const struct ts_op_desc *d = ts_op_desc(op);
            if (d && d->max_payload > m)
                m = d->max_payload;
        }
    return m;
}

/*
 * The global input budget. Every connection may buffer a small frame's worth (IN_FREE bytes)
 * without asking; a frame with a larger payload first reserves its whole length from the
 * server-wide budget (input_budget_mb), and the connection reads it only then. A reservation is
 * whole-frame, so a connection holding one can always complete its frame: the budget never
 * deadlocks. A connection that cannot reserve stops reading and tries again every
 * BUDGET_RETRY_MS; the reservation is returned when its frame has been handled.
 */
#define IN_FREE (TS_HDR_LEN + (size_t)TS_SMALL_PAYLOAD)
#define BUDGET_RETRY_MS 5

static size_t in_limit(const struct tsd_conn *c)
{
    return IN_FREE + c->in_reserved;
}

static void in_limit_changed(struct tsd_conn *c)
{
    if (c->bev)
        bufferevent_setwatermark(c->bev, EV_READ, 0, in_limit(c));
}

/*
 * Fairness between connections (plain TCP, issue 31). One callback of the event loop serves a
 * connection for at most TURN_REQS requests or TURN_BYTES written; with work left it yields:
 * its EV_WRITE stays added, so it comes back once the loop has polled and served every other
 * ready connection. A connection with thousands of requests pipelined (or one long stream)
 * no longer holds its worker while the others wait. TLS connections (bufferevents) are not
 * bounded: their read callback only comes back with new input.
 */
#define TURN_REQS 16
#define TURN_BYTES (1u << 20)

static void turn_begin(struct tsd_conn *c)
{
    c->turn_reqs = 0;
    c->turn_out = 0;
    c->yielded = 0;
}

static int turn_spent(const struct tsd_conn *c)
{
    return !c->bev && (c->turn_reqs >= TURN_REQS || c->turn_out >= TURN_BYTES);
}

/* Work is left for the next turn: EV_WRITE (level-triggered, the socket writable or soon to
 * be) brings the connection back to raw_writecb once the loop has polled again. */
static void turn_yield(struct tsd_conn *c)
{
    c->yielded = 1;
    if (!event_pending(c->wev, EV_WRITE, NULL))
        event_add(c->wev, NULL);
}

static void budget_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_conn *c = arg;

    c->budget_wait = 0;
    if (!c->bev)
        turn_begin(c);
    tsd_conn_resume(c);
}

/* Makes room to buffer a frame of len payload bytes. 1: go on reading; 0: the budget is spent,
 * the connection is paused and retried shortly. */
static int in_reserve(struct tsd_conn *c, uint32_t len)
{
    struct tsd_server *s = c->w->srv;
    size_t used;

    if (TS_HDR_LEN + (size_t)len <= IN_FREE || c->in_reserved >= len)
        return 1;
    used = atomic_load(&s->in_reserved);
    do {
        if (used + len > s->in_budget) {
            if (!c->budget_ev)
                c->budget_ev = evtimer_new(c->w->base, budget_retry_cb, c);
            if (!c->budget_wait) {
                struct timeval tv = {0, BUDGET_RETRY_MS * 1000};
                STAT_ADD(&c->w->stats, input_budget_waits, 1);
                c->budget_wait = 1;
                if (c->budget_ev)
                    evtimer_add(c->budget_ev, &tv);
            }
            tsd_conn_pause(c);
            return 0;
        }
    } while (!atomic_compare_exchange_weak(&s->in_reserved, &used, used + len));
    c->in_reserved = len;
    in_limit_changed(c);
    return 1;
}

static void in_release(struct tsd_conn *c)
{
    if (!c->in_reserved)
        return;
    atomic_fetch_sub(&c->w->srv->in_reserved, c->in_reserved);
    c->in_reserved = 0;
    if (!c->dead)
        in_limit_changed(c);
}

static void conn_unpause(struct tsd_conn *c);

/* ---- replies ---------------------------------------------------------------------------- */

static void wr_free_cb(const void *data, size_t len, void *extra)
{
    free(extra);
}

void tsd_reply_begin(struct ts_wr *w)
{
    ts_wr_init(w);
    ts_wr_begin_frame(w);
    ts_wr_u32(w, 0); /* status */
}

/* Hands the frame's buffer to the connection's output without copying it. */
/* A fixed error reply that needs no allocation (the last resort when building one failed). */
static void reply_static_error(struct tsd_conn *c, const struct ts_frame_hdr *req, int rc)
{
    static const char msg[] = "reply could not be built (out of memory or too large)";
    uint8_t buf[TS_HDR_LEN + 4 + 2 + sizeof(msg)];
    struct ts_frame_hdr h = {TS_PROTO_VERSION,
                             req->opcode,
                             TS_F_REPLY,
                             req->req_id,
                             atomic_load(&c->w->srv->epoch),
                             4 + 2 + sizeof(msg) - 1};

    ts_frame_encode(buf, &h);
    ts_put_le32(buf + TS_HDR_LEN, (uint32_t)rc);
    ts_put_le16(buf + TS_HDR_LEN + 4, sizeof(msg) - 1);
    memcpy(buf + TS_HDR_LEN + 6, msg, sizeof(msg) - 1);
    {
        /* A chain of its own (evbuffer_add() can fail right after a sendfile segment). */
        uint8_t *copy = malloc(TS_HDR_LEN + h.length);
        if (copy) {
            memcpy(copy, buf, TS_HDR_LEN + h.length);
            if (evbuffer_add_reference(tsd_conn_out(c), copy, TS_HDR_LEN + h.length, wr_free_cb,
                                       copy) != 0)
                free(copy);
        }
    }
    tsd_conn_flush(c);
}

/* Hands the frame's buffer to the connection's output without copying it; rc: the error it
 * carries (0: a success), for the metrics. */
static void reply_send(struct tsd_conn *c, const struct ts_frame_hdr *req, struct ts_wr *w, int rc)
{
    struct evbuffer *out = tsd_conn_out(c);
    struct tsd_server *s = c->w->srv;

    if (!w->err)
        ts_wr_frame(w, req->opcode, TS_F_REPLY, req->req_id, atomic_load(&s->epoch));
    if (w->err) {
        int err = w->err;
        ts_wr_fini(w);
        tsd_m_reply(c, req, err, 0);
        reply_static_error(c, req, err);
        return;
    }
    STAT_ADD(&c->w->stats, bytes_out, w->len);
    tsd_m_reply(c, req, rc, w->len);
    if (evbuffer_add_reference(out, w->buf, w->len, wr_free_cb, w->buf) != 0)
        free(w->buf);
    w->buf = NULL;
    ts_wr_fini(w);
    tsd_conn_flush(c);
}

void tsd_reply_send(struct tsd_conn *c, const struct ts_frame_hdr *req, struct ts_wr *w)
{
    reply_send(c, req, w, 0);
}

/* An error reply's message, counted as an error of the worker. */
static void error_message(struct tsd_conn *c, char *msg, size_t cap, const char *fmt, va_list ap)
{
    vsnprintf(msg, cap, fmt, ap);
    STAT_ADD(&c->w->stats, errors, 1);
}

void tsd_reply_error(struct tsd_conn *c, const struct ts_frame_hdr *req, int rc, const char *fmt,
                     ...)
{
    struct ts_wr w;
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    error_message(c, msg, sizeof(msg), fmt, ap);
    va_end(ap);
    TS_LOG(rc == TS_EINTERNAL || rc == TS_EDB || rc == TS_EIO ? TS_LOG_ERROR : TS_LOG_DEBUG, FAC,
           rc, "%s %s: %s", c->peer, ts_op_desc(req->opcode) ? ts_op_desc(req->opcode)->name : "?",
           msg);
    ts_wr_init(&w);
    ts_wr_begin_frame(&w);
    ts_wr_u32(&w, (uint32_t)rc);
    ts_wr_str(&w, msg);
    reply_send(c, req, &w, rc);
}

/* ---- connections ------------------------------------------------------------------------ */

void tsd_conn_unref(struct tsd_conn *c)
{
    if (--c->refs == 0) {
        free(c->uploads);
        free(c);
    }
}

/* Closes the connection; the struct lives on while replies parked on replication hold it. */
void tsd_conn_free(struct tsd_conn *c)
{
    struct tsd_worker *w = c->w;

    TS_DEBUG(FAC, "closing connection %s (reading %d, stream %d, in %zu, out %zu, eof %d)", c->peer,
             c->reading, c->rs != NULL, evbuffer_get_length(tsd_conn_in(c)),
             evbuffer_get_length(tsd_conn_out(c)), c->eof);
    if (c->rs) {
        c->w->srv->ops->stream_free(c->rs);
        c->rs = NULL;
    }
    c->w->srv->ops->conn_closing(c);
    in_release(c);
    tsd_m_conn_close(c);
    if (c->budget_ev) {
        event_free(c->budget_ev);
        c->budget_ev = NULL;
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->rdma) {
        tsd_rdma_close(c->rdma); /* disconnects and frees the session (no hook for c) */
        c->rdma = NULL;
    }
    if (c->bev) {
        bufferevent_free(c->bev); /* closes the socket (and frees the SSL) */
        c->bev = NULL;
    } else {
        event_free(c->rev);
        event_free(c->wev);
        evbuffer_free(c->in);
        evbuffer_free(c->out); /* releases the chunk references still queued */
        evutil_closesocket(c->fd);
        c->rev = c->wev = NULL;
        c->in = c->out = NULL;
    }
    c->dead = 1;
    if (c->handshaking) {
        c->handshaking = 0;
        atomic_fetch_sub(&w->srv->nhandshakes, 1);
    }
    atomic_fetch_sub(&w->nconns, 1);
    atomic_fetch_sub(&w->srv->nconns, 1);
    tsd_conn_unref(c);
    if (w->draining && !w->conns)
        event_base_loopexit(w->base, NULL);
}

/* Returns 1 if c was freed (nothing left to send). */
static int conn_close_after_flush(struct tsd_conn *c)
{
    c->closing = 1;
    tsd_conn_pause(c);
    if (evbuffer_get_length(tsd_conn_out(c)) == 0 && !c->rs && !c->parked) {
        tsd_conn_free(c);
        return 1;
    }
    return 0;
}

void tsd_conn_maybe_finish(struct tsd_conn *c)
{
    /* A connection that yielded its turn still has requests to answer: a later turn closes. */
    if (!c->dead && c->eof && !c->closing && !c->rs && !c->parked && !c->yielded)
        conn_close_after_flush(c);
}

/*
 * Fencing: writes carry the sender's map epoch and must match the node's. Replication traffic
 * always; client writes once the node has a map (single-node clients send 0).
 */
void tsd_peer_map_check(struct tsd_conn *c, const struct ts_frame_hdr *h)
{
    struct tsd_server *s = c->w->srv;

    /* A node (it said "node:ID" in its HELLO) that sent an older epoch than ours gets our map:
     * nodes take maps only from MAP_PUSH, never from a reply. */
    if (s->repl && h->epoch && h->epoch < atomic_load(&s->epoch) && c->role == TS_ROLE_NODE)
        ts_repl_push_map(s->repl, c->node_id);
}

/* The role a request is judged by: a client without a certificate is at most a reader on a
 * node that is part of a cluster (has a map), whatever anonymous_role says. */
int tsd_conn_role(struct tsd_server *s, const struct tsd_conn *c)
{
    if (c->anonymous && atomic_load(&s->epoch) && c->role > TS_ROLE_READER)
        return TS_ROLE_READER;
    return c->role;
}

/* Whether the node id is a member of this node's current map. */
static int node_in_map(struct tsd_server *s, const char *id)
{
    int in;

    pthread_rwlock_rdlock(&s->map_lock);
    in = s->map && id[0] && ts_map_find(s->map, id) >= 0;
    pthread_rwlock_unlock(&s->map_lock);
    return in;
}

static int epoch_fenced(struct tsd_server *s, const struct ts_frame_hdr *h)
{
    uint64_t e = atomic_load(&s->epoch);

    switch (h->opcode) {
    case TS_OP_REPL_WRITE:
    case TS_OP_REPL_SEAL:
        return h->epoch != e;
    case TS_OP_SHARD_WRITE:
    case TS_OP_SHARD_SEAL:
        return e != 0 && h->epoch != e;
    default:
        return 0;
    }
}

/* Parses and dispatches every complete frame in the input. Returns 0 if c was freed. */
static int conn_process(struct tsd_conn *c)
{
    struct tsd_server *s = c->w->srv;
    struct evbuffer *in = tsd_conn_in(c);
    struct evbuffer *out = tsd_conn_out(c);
    const uint32_t max_any = max_payload_any();

    while (!c->closing && !c->rs) {
        uint8_t hb[TS_HDR_LEN];
        struct ts_frame_hdr h;
        const struct ts_op_desc *d;
        size_t avail = evbuffer_get_length(in), n = TS_MIN(avail, (size_t)TS_HDR_LEN);
        uint8_t *payload = NULL;
        struct tsd_req q;
        char msg[192];
        int rc, refuse = 0;

        if (avail == 0)
            break;
        if (turn_spent(c)) {
            turn_yield(c);
            break;
        }
        if (c->discard) {
            /* The rest of a refused frame: dropped as it arrives, never buffered whole. */
            size_t k = TS_MIN(avail, (size_t)c->discard);
            evbuffer_drain(in, k);
            c->discard -= (uint32_t)k;
            continue;
        }
        if (evbuffer_get_length(out) >= s->out_budget) {
            /* Backpressure: the peer is not reading its replies; stop reading requests. */
            tsd_conn_pause(c);
            return 1;
        }
        evbuffer_copyout(in, hb, n);
        rc = ts_frame_parse(hb, n, max_any, &h);
        if (rc == 0)
            break;
        if (rc < 0) {
            struct ts_frame_hdr none = {0};
            STAT_ADD(&c->w->stats, protocol_errors, 1);
            /* An oversize length comes in a sound header (its CRC checked): answer that
             * request's id; a broken header has no id to trust. */
            tsd_reply_error(c, rc == TS_ETOOBIG ? &h : &none, rc, "%s",
                            rc == TS_ETOOBIG ? "frame payload exceeds the protocol limit"
                                             : "malformed frame header (magic, version, flags "
                                               "or header CRC); closing");
            return !conn_close_after_flush(c);
        }
        d = ts_op_desc(h.opcode);
        /* An unknown opcode of any size within the protocol limit is answered TS_ENOTSUP below
         * and its payload skipped as it arrives: the same rule for every size (issue 28). */
        if (d && h.length > d->max_payload) {
            STAT_ADD(&c->w->stats, protocol_errors, 1);
            tsd_reply_error(c, &h, TS_ETOOBIG, "%s payload of %u bytes exceeds its limit of %u",
                            d->name, h.length, d->max_payload);
            return !conn_close_after_flush(c);
        }
        /* Central checks, decided on the header alone: a frame that will be refused is not
         * buffered (its payload is dropped as it arrives). */
        c->last_active_ns = c->t0_ns = ts_now_mono_ns();
        if (!d) {
            refuse = 1;
            tsd_reply_error(c, &h, TS_ENOTSUP, "unknown opcode %u", h.opcode);
        } else if (h.flags & TS_F_REPLY) {
            refuse = 1;
            STAT_ADD(&c->w->stats, protocol_errors, 1);
            tsd_reply_error(c, &h, TS_EPROTO, "a request must not carry the REPLY flag");
        } else if (!ts_role_may(tsd_conn_role(s, c), d->min_role)) {
            refuse = 1;
            tsd_reply_error(c, &h, TS_EPERM, "role '%s'%s may not %s (needs '%s')",
                            ts_role_name(tsd_conn_role(s, c)),
                            c->anonymous ? " (no certificate)" : "", d->name,
                            ts_role_name(d->min_role));
        } else if ((d->min_role == TS_ROLE_NODE ||
                    (d->min_role == TS_ROLE_ADMIN_OR_NODE && c->role == TS_ROLE_NODE)) &&
                   !node_in_map(s, c->node_id)) {
            /* A node certificate for an id that this node's map does not list may do nothing
             * as a node, MAP_PUSH included: an unknown node may not change the map (issue 28;
             * an admin may). */
            refuse = 1;
            tsd_reply_error(c, &h, TS_EPERM,
                            "%s from node '%s' refused: it is not in this node's "
                            "map (epoch %llu)",
                            d->name, c->node_id, (unsigned long long)atomic_load(&s->epoch));
        } else if (epoch_fenced(s, &h)) {
            refuse = 1;
            tsd_peer_map_check(c, &h);
            tsd_reply_stale(c, &h, "%s with map epoch %llu refused: this node is at epoch %llu",
                            d->name, (unsigned long long)h.epoch,
                            (unsigned long long)atomic_load(&s->epoch));
        }
        if (refuse) {
            STAT_ADD(&c->w->stats, requests, 1);
            tsd_m_request(c, &h);
            evbuffer_drain(in, TS_HDR_LEN);
            c->discard = h.length;
            continue;
        }
        if (avail < TS_HDR_LEN + (size_t)h.length) {
            in_reserve(c, h.length); /* the frame is read only once it has room */
            break;
        }
        evbuffer_drain(in, TS_HDR_LEN);
        if (h.length) {
            payload = evbuffer_pullup(in, h.length);
            if (!payload) {
                tsd_reply_error(c, &h, TS_ENOMEM, "out of memory");
                return !conn_close_after_flush(c);
            }
        }
        STAT_ADD(&c->w->stats, requests, 1);
        STAT_ADD(&c->w->stats, bytes_in, TS_HDR_LEN + (uint64_t)h.length);
        STAT_ADD(&c->w->stats, by_op[h.opcode], 1);
        tsd_m_request(c, &h);
        /* The payload is decoded whole before the handler runs; a malformed one is answered
         * here (the connection stays usable: framing is intact). */
        rc = tsd_req_decode(h.opcode, payload, h.length, &q, msg, sizeof(msg));
        if (rc) {
            tsd_reply_error(c, &h, rc, "%s", msg);
        } else {
            c->w->srv->ops->handler_for(h.opcode)(c, &h, &q);
            tsd_req_free(&q);
        }
        evbuffer_drain(in, h.length);
        in_release(c);
        c->turn_reqs++;
    }
    if (c->closing && evbuffer_get_length(out) == 0 && !c->rs && !c->parked) {
        tsd_conn_free(c);
        return 0;
    }
    return 1;
}

void tsd_conn_resume(struct tsd_conn *c)
{
    if (c->closing)
        return;
    if (!conn_process(c) || c->closing)
        return;
    if (c->eof) {
        tsd_conn_maybe_finish(c);
        return;
    }
    if (!c->rs && evbuffer_get_length(tsd_conn_out(c)) < c->w->srv->out_budget)
        conn_unpause(c);
}

/* The output drained below the low watermark. Returns 0 if c was freed. */
static int conn_drained(struct tsd_conn *c)
{
    struct evbuffer *out = tsd_conn_out(c);

    if (c->rs && !c->w->srv->ops->stream_continue(c))
        return 1; /* still streaming; called again when the output drains */
    if (c->closing) {
        if (evbuffer_get_length(out) == 0 && !c->rs && !c->parked) {
            tsd_conn_free(c);
            return 0;
        }
        return 1;
    }
    c->last_active_ns = ts_now_mono_ns();
    tsd_conn_resume(c);
    return !c->dead;
}

static void conn_readcb(struct bufferevent *bev, void *arg)
{
    struct tsd_conn *c = arg;
    if (c->ready)
        conn_process(c);
}

static void conn_writecb(struct bufferevent *bev, void *arg)
{
    conn_drained(arg);
}

/* ---- plain TCP connections -------------------------------------------------------------- */

#define RAW_READ_MAX (256u << 10) /* bytes reserved per read */

struct evbuffer *tsd_conn_in(struct tsd_conn *c)
{
    return c->bev ? bufferevent_get_input(c->bev) : c->in;
}

struct evbuffer *tsd_conn_out(struct tsd_conn *c)
{
    return c->bev ? bufferevent_get_output(c->bev) : c->out;
}

void tsd_conn_pause(struct tsd_conn *c)
{
    if (c->bev) {
        bufferevent_disable(c->bev, EV_READ);
    } else if (c->reading && c->rev) {
        event_del(c->rev);
        c->reading = 0;
    }
}

static void conn_unpause(struct tsd_conn *c)
{
    if (c->budget_wait)
        return; /* budget_retry_cb resumes it */
    if (c->bev) {
        bufferevent_enable(c->bev, EV_READ);
    } else if (!c->reading && c->rev && !c->eof && !c->closing) {
        event_add(c->rev, NULL);
        c->reading = 1;
    }
}

/* Writes what the socket takes now. 0: fine (maybe more queued), -1: the connection broke. */
static int raw_write(struct tsd_conn *c)
{
    while (evbuffer_get_length(c->out) > 0) {
        int n = evbuffer_write_atmost(c->out, c->fd, -1);
        if (n > 0) {
            c->turn_out += (size_t)n;
            continue;
        }
        /* 0: libevent's sendfile path reports EAGAIN/EINTR as 0 bytes written. */
        if (n == 0 || EVUTIL_SOCKET_ERROR() == EAGAIN || EVUTIL_SOCKET_ERROR() == EINTR)
            break;
        return -1;
    }
    if (evbuffer_get_length(c->out) > 0) {
        if (!event_pending(c->wev, EV_WRITE, NULL))
            event_add(c->wev, NULL);
    } else if (!c->yielded && event_pending(c->wev, EV_WRITE, NULL)) {
        event_del(c->wev);
    }
    return 0;
}

/*
 * Writes, and while the output drains keeps streams and queued requests going. Returns 0 if
 * c was freed.
 */
static int raw_progress(struct tsd_conn *c)
{
    size_t low = c->w->srv->out_budget / 2;

    for (int rounds = 0; rounds < 64; rounds++) {
        size_t before;
        if (raw_write(c) != 0) {
            tsd_conn_free(c);
            return 0;
        }
        if (evbuffer_get_length(c->out) > low)
            return 1; /* the socket is full: EV_WRITE brings us back */
        if (turn_spent(c) && (c->rs || evbuffer_get_length(c->in) > 0)) {
            turn_yield(c); /* the rest in a later turn, after the other connections */
            return 1;
        }
        before = evbuffer_get_length(c->out);
        if (!c->rs && !c->closing && c->reading && evbuffer_get_length(c->in) == 0)
            return 1; /* nothing waits on the output draining */
        if (!conn_drained(c))
            return 0;
        if (evbuffer_get_length(c->out) == before)
            return 1; /* no more was queued */
    }
    /* Enough for one callback: what was queued last goes out when the socket is writable. */
    if (evbuffer_get_length(c->out) > 0 && !event_pending(c->wev, EV_WRITE, NULL))
        event_add(c->wev, NULL);
    return 1;
}

void tsd_conn_flush(struct tsd_conn *c)
{
    if (c->bev || c->in_readcb || c->dead)
        return;
    if (raw_write(c) != 0) {
        /* Freed from the write callback, at the top of the loop, never under a caller. */
        c->io_error = 1;
        event_active(c->wev, EV_WRITE, 0);
    } else if (c->rs || c->closing || !c->reading) {
        event_active(c->wev, EV_WRITE, 0); /* let raw_writecb continue the connection */
    }
}

static void raw_writecb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_conn *c = arg;

    if (c->io_error) {
        tsd_conn_free(c);
        return;
    }
    turn_begin(c);
    raw_progress(c);
}

static void raw_eof(struct tsd_conn *c)
{
    /* Half-close: answer every complete request already received, then close. */
    c->eof = 1;
    tsd_conn_pause(c);
}

static void raw_readcb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_conn *c = arg;
    int broken = 0;

    turn_begin(c);
    for (;;) {
        struct evbuffer_iovec v[2];
        size_t have = evbuffer_get_length(c->in), want, limit = in_limit(c);
        ssize_t n;
        int nv;

        if (have >= limit) {
            tsd_conn_pause(c); /* a small frame's worth, or the reserved frame, is buffered */
            break;
        }
        want = TS_MIN((size_t)RAW_READ_MAX, limit - have);
        nv = evbuffer_reserve_space(c->in, (ev_ssize_t)want, v, 2);
        if (nv <= 0) {
            broken = 1;
            break;
        }
        if (v[0].iov_len > want) {
            v[0].iov_len = want;
            nv = 1;
        } else if (nv == 2 && v[0].iov_len + v[1].iov_len > want) {
            v[1].iov_len = want - v[0].iov_len;
        }
        n = readv(fd, (struct iovec *)v, nv);
        if (n < 0) {
            evbuffer_commit_space(c->in, v, 0);
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                broken = 1;
            break;
        }
        if (n == 0) {
            evbuffer_commit_space(c->in, v, 0);
            raw_eof(c);
            break;
        }
        if ((size_t)n <= v[0].iov_len) {
            v[0].iov_len = (size_t)n;
            nv = 1;
        } else {
            v[1].iov_len = (size_t)n - v[0].iov_len;
        }
        evbuffer_commit_space(c->in, v, nv);
        STAT_ADD(&c->w->stats, bytes_in, 0);
        if ((size_t)n < want)
            break; /* the socket is empty: no extra read just to hear EAGAIN */
    }
    if (broken) {
        tsd_conn_free(c);
        return;
    }
    c->in_readcb = 1;
    if (!conn_process(c))
        return;
    c->in_readcb = 0;
    if (c->eof && !c->rs && !c->parked && !c->closing && !c->yielded)
        c->closing = 1; /* everything received is answered: close once it is sent */
    if (!raw_progress(c))
        return;
    if (!c->reading && !c->rs && !c->eof && !c->closing &&
        evbuffer_get_length(c->in) < in_limit(c) &&
        evbuffer_get_length(c->out) < c->w->srv->out_budget)
        conn_unpause(c);
}

static void conn_eventcb(struct bufferevent *bev, short what, void *arg)
{
    struct tsd_conn *c = arg;
    struct tsd_server *s = c->w->srv;

    if (what & BEV_EVENT_CONNECTED) {
        /* TLS handshake done: the peer certificate (verified by OpenSSL) decides the role. */
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        c->role = tsd_tls_peer_role(ssl, c, s->anon_role);
        c->ready = 1;
        tsd_m_conn_open(c);
        if (c->handshaking) {
            c->handshaking = 0;
            atomic_fetch_sub(&s->nhandshakes, 1);
        }
        TS_DEBUG(FAC, "TLS %s from %s: %s, role %s", SSL_get_version(ssl), c->peer,
                 c->subject[0] ? c->subject : "no certificate", ts_role_name(c->role));
        conn_process(c);
        return;
    }
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && c->ready && !c->eof) {
        /* Half-close: answer every complete request already received, then close. */
        c->eof = 1;
        bufferevent_disable(bev, EV_READ);
        if (conn_process(c))
            tsd_conn_maybe_finish(c);
        return;
    }
    if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
        if (c->tls && (what & BEV_EVENT_ERROR)) {
            unsigned long e;
            char buf[256];
            while ((e = bufferevent_get_openssl_error(bev)) != 0) {
                ERR_error_string_n(e, buf, sizeof(buf));
                TS_WARN(FAC, TS_ETLS, "TLS connection from %s: %s", c->peer, buf);
            }
            /* OpenSSL's error queue is per thread: leave nothing behind for the next
             * connection this worker serves. */
            ERR_clear_error();
        }
        if (what & BEV_EVENT_TIMEOUT)
            TS_INFO(FAC, "connection %s idle for %d s: closing", c->peer, s->cfg->idle_timeout_s);
        tsd_conn_free(c);
    }
}

/*
 * Accepted over max_connections (the acceptor does so only while some connection is still in
 * its TLS handshake): close this worker's oldest such connection to make room, or, with none
 * here, the new one. Connections that never authenticate cannot take every slot and lock
 * clients with certificates out (issue 28). Returns 0 if the new connection may go on.
 */
static int make_room(struct tsd_worker *w, struct tsd_pending *p)
{
    struct tsd_conn *c, *oldest = NULL;

    for (c = w->conns; c; c = c->next)
        if (c->handshaking && (!oldest || c->accepted_ns < oldest->accepted_ns))
            oldest = c;
    if (!oldest) {
        TS_WARN(FAC, TS_EBUSY, "refusing %s: max_connections reached", p->peer);
        STAT_ADD(&w->stats, conns_refused, 1);
        evutil_closesocket(p->fd);
        atomic_fetch_sub(&w->srv->nconns, 1);
        return -1;
    }
    TS_WARN(FAC, TS_EBUSY,
            "closing %s, in its TLS handshake for %.1f s, to make room for %s "
            "(max_connections reached)",
            oldest->peer, (double)(ts_now_mono_ns() - oldest->accepted_ns) / 1e9, p->peer);
    STAT_ADD(&w->stats, conns_refused, 1);
    tsd_conn_free(oldest);
    return 0;
}

void tsd_conn_start(struct tsd_worker *w, struct tsd_pending *p)
{
    struct tsd_server *s = w->srv;
    struct tsd_conn *c;
    int one = 1;

    if (p->evict && atomic_load(&s->nconns) > s->cfg->max_connections && make_room(w, p) != 0)
        return;
    c = calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(p->fd);
        atomic_fetch_sub(&s->nconns, 1);
        return;
    }
    setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    {
        int sndbuf = (int)s->out_budget;
        setsockopt(p->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    }
    c->w = w;
    c->tls = p->tls;
    c->refs = 1;
    c->last_active_ns = c->accepted_ns = ts_now_mono_ns();
    snprintf(c->peer, sizeof(c->peer), "%s", p->peer);
    if (p->tls) {
        SSL *ssl;
        ERR_clear_error();
        ssl = SSL_new(s->ssl_ctx);
        c->bev = ssl ? bufferevent_openssl_socket_new(
                           w->base, p->fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE)
                     : NULL;
        if (c->bev) {
            bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
            c->handshaking = 1;
            atomic_fetch_add(&s->nhandshakes, 1);
        } else if (ssl) {
            SSL_free(ssl);
        }
    } else {
        evutil_make_socket_nonblocking(p->fd);
        c->fd = p->fd;
        c->in = evbuffer_new();
        c->out = evbuffer_new();
        c->rev = event_new(w->base, p->fd, EV_READ | EV_PERSIST, raw_readcb, c);
        c->wev = event_new(w->base, p->fd, EV_WRITE | EV_PERSIST, raw_writecb, c);
        if (!c->in || !c->out || !c->rev || !c->wev) {
            if (c->rev)
                event_free(c->rev);
            if (c->wev)
                event_free(c->wev);
            if (c->in)
                evbuffer_free(c->in);
            if (c->out)
                evbuffer_free(c->out);
            TS_ERROR(FAC, TS_ENOMEM, "cannot set up connection from %s", p->peer);
            evutil_closesocket(p->fd);
            atomic_fetch_sub(&s->nconns, 1);
            free(c);
            return;
        }
        /* Chunks in the cache arena go out by sendfile() from this buffer. */
        evbuffer_set_flags(c->out, EVBUFFER_FLAG_DRAINS_TO_FD);
        c->role = s->anon_role;
        c->anonymous = 1;
        c->ready = 1;
        tsd_m_conn_open(c);
    }
    if (!c->bev && !c->rev) {
        TS_ERROR(FAC, TS_ENOMEM, "cannot set up connection from %s", p->peer);
        evutil_closesocket(p->fd);
        atomic_fetch_sub(&s->nconns, 1);
        free(c);
        return;
    }
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    atomic_fetch_add(&w->nconns, 1);
    STAT_ADD(&w->stats, conns_accepted, 1);
    if (!c->bev) {
        event_add(c->rev, NULL);
        c->reading = 1;
        TS_DEBUG(FAC, "connection from %s (tcp) on worker %d", c->peer, w->id);
        return;
    }
    bufferevent_setcb(c->bev, conn_readcb, conn_writecb, conn_eventcb, c);
    /* Input: a small frame's worth, or the frame whose length it reserved (in_reserve).
     * Output: the write callback fires when the queue drains below half the budget. */
    in_limit_changed(c);
    bufferevent_setwatermark(c->bev, EV_WRITE, s->out_budget / 2, 0);
    /* libevent moves at most 16 KiB per syscall by default: far too little for 1 MiB chunks. */
    bufferevent_set_max_single_write(c->bev, s->out_budget);
    bufferevent_set_max_single_read(c->bev, 1u << 20);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    TS_DEBUG(FAC, "connection from %s (%s) on worker %d", c->peer, c->tls ? "tls" : "tcp", w->id);
}

/* ---- RDMA sessions (the hooks of rdma.h) -------------------------------------------------- */

struct tsd_conn *tsd_conn_start_rdma(struct tsd_worker *w, struct bufferevent *bev,
                                     struct tsd_rdma_sess *r, const char *peer, int role,
                                     const char *who)
{
    struct tsd_server *s = w->srv;
    struct tsd_conn *c = calloc(1, sizeof(*c));

    if (!c) {
        bufferevent_free(bev);
        return NULL;
    }
    c->w = w;
    c->bev = bev;
    c->rdma = r;
    c->refs = 1;
    c->ready = 1;
    c->role = role; /* what the token's connection had (never node: see RDMA_TOKEN) */
    tsd_m_conn_open(c);
    c->fd = -1;
    c->last_active_ns = ts_now_mono_ns();
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    snprintf(c->subject, sizeof(c->subject), "%s", who);
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    atomic_fetch_add(&w->nconns, 1);
    atomic_fetch_add(&s->nconns, 1);
    STAT_ADD(&w->stats, conns_accepted, 1);
    bufferevent_setcb(bev, conn_readcb, conn_writecb, conn_eventcb, c);
    in_limit_changed(c);
    bufferevent_setwatermark(bev, EV_WRITE, s->out_budget / 2, 0);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    TS_DEBUG(FAC, "RDMA connection from %s (%s, role %s) on worker %d", peer, who,
             ts_role_name(role), w->id);
    return c;
}

void tsd_conn_rdma_room(struct tsd_conn *c)
{
    if (c->rs)
        conn_drained(c);
}

void tsd_conn_rdma_gone(struct tsd_conn *c)
{
    c->rdma = NULL; /* the session is being freed by its own layer */
    if (!c->dead)
        tsd_conn_free(c);
}

void tsd_reply_stale(struct tsd_conn *c, const struct ts_frame_hdr *req, const char *fmt, ...)
{
    struct tsd_server *s = c->w->srv;
    struct ts_wr w;
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    error_message(c, msg, sizeof(msg), fmt, ap);
    va_end(ap);
    TS_DEBUG(FAC, "%s: %s", c->peer, msg);
    ts_wr_init(&w);
    ts_wr_begin_frame(&w);
    ts_wr_u32(&w, (uint32_t)TS_ESTALE);
    ts_wr_str(&w, msg);
    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map)
        ts_map_encode(&w, s->map);
    pthread_rwlock_unlock(&s->map_lock);
    tsd_reply_send(c, req, &w);
}

/* ---- counters ---------------------------------------------------------------------------- */

void tsd_stats_sum(struct tsd_server *s, struct tsd_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_stats *st = &s->workers[i].stats;
#define SUM(f) STAT_ADD(out, f, STAT_GET(st, f))
        SUM(conns_accepted);
        SUM(conns_refused);
        SUM(requests);
        SUM(errors);
        SUM(bytes_in);
        SUM(bytes_out);
        SUM(chunks_written);
        SUM(read_bytes);
        SUM(corrupt_chunks);
        SUM(protocol_errors);
        SUM(input_budget_waits);
        SUM(rdma_placed_bytes);
        for (int op = 0; op < TS_OP_MAX; op++)
            SUM(by_op[op]);
#undef SUM
    }
}
