/*
 * The replication thread (see ts_repl.h).
 *
 * Everything here runs on the replication thread's event loop, except the ts_repl_* entry
 * points, which only post messages to it (event_base_once is thread-safe once libevent's
 * threading is on) and ts_repl_reachable/ts_repl_lag, which read state under r->lock.
 *
 * Ordering: one connection per peer, and a replica answers REPL_* frames in order, so the
 * chunks of an upload reach a replica before its seal, and a PG's log records reach each
 * replica in sequence order (one pusher per (PG, replica), one request at a time).
 */
#include "repl_internal.h"

#include <errno.h>
#include <event2/bufferevent_ssl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TICK_MS 100
#define LAG_SCAN_MAX 10000

/* ---- completions on the caller's loop -------------------------------------------------- */

struct done_msg {
    ts_repl_done done;
    void *arg;
    int rc;
    unsigned acked;
    char msg[256];
};

static void done_tramp(evutil_socket_t fd, short what, void *arg)
{
    struct done_msg *m = arg;
    m->done(m->arg, m->rc, m->acked, m->msg);
    free(m);
}

static void complete(struct event_base *base, ts_repl_done done, void *arg, int rc, unsigned acked,
                     const char *msg)
{
    struct done_msg *m = calloc(1, sizeof(*m));

    if (!m) {
        done(arg, TS_ENOMEM, acked, "out of memory");
        return;
    }
    m->done = done;
    m->arg = arg;
    m->rc = rc;
    m->acked = acked;
    snprintf(m->msg, sizeof(m->msg), "%s", msg ? msg : "");
    event_base_once(base, -1, EV_TIMEOUT, done_tramp, m, NULL);
}

/* ---- map helpers ------------------------------------------------------------------------ */

int repl_node_rank(ts_repl *r, uint32_t pg, const char *id)
{
    return ts_repl_rank_of(r->map, pg, id);
}

int repl_is_other_replica(ts_repl *r, uint32_t pg, const char *id)
{
    return strcmp(id, r->node_id) != 0 && repl_node_rank(r, pg, id) >= 0;
}

/* ---- peers ------------------------------------------------------------------------------ */

static void peer_fail(ts_repl *r, struct peer *p, int rc, const char *why);
static void map_push_to(ts_repl *r, const char *id);

static struct peer *peer_get(ts_repl *r, const char *id)
{
    struct peer *p;
    int i;

    for (p = r->peers; p; p = p->next)
        if (!strcmp(p->id, id))
            return p;
    if (!r->map || (i = ts_map_find(r->map, id)) < 0)
        return NULL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    snprintf(p->id, sizeof(p->id), "%s", id);
    if (r->o.ssl && r->map->nodes[i].tls_addr[0]) {
        snprintf(p->addr, sizeof(p->addr), "%s", r->map->nodes[i].tls_addr);
        p->use_tls = 1;
    } else {
        snprintf(p->addr, sizeof(p->addr), "%s", r->map->nodes[i].addr);
    }
    p->next_id = 1;
    p->r = r;
    p->next = r->peers;
    r->peers = p;
    return p;
}

static void peer_dispatch(ts_repl *r, struct peer *p, const struct ts_frame_hdr *h,
                          const uint8_t *payload)
{
    struct pend **pp = &p->pend, *pe;
    struct ts_rd body;
    int status;

    while (*pp && (*pp)->id != h->req_id)
        pp = &(*pp)->next;
    pe = *pp;
    if (!pe) {
        TS_WARN(FAC, TS_EPROTO, "peer %s: reply to unknown request %llu", p->id,
                (unsigned long long)h->req_id);
        return;
    }
    *pp = pe->next;
    p->npend--;
    ts_rd_init(&body, payload, h->length);
    status = (int)ts_rd_u32(&body);
    if (body.err)
        status = TS_EPROTO;
    pe->cb(r, p, pe->ctx, status, &body);
    free(pe);
}

static void peer_readcb(struct bufferevent *bev, void *arg)
{
    struct peer *p = arg;
    ts_repl *r = p->r;
    struct evbuffer *in = bufferevent_get_input(bev);

    for (;;) {
        uint8_t hb[TS_HDR_LEN];
        struct ts_frame_hdr h;
        size_t avail = evbuffer_get_length(in);
        int rc;

        if (avail < TS_HDR_LEN)
            return;
        evbuffer_copyout(in, hb, TS_HDR_LEN);
        rc = ts_frame_parse(hb, TS_HDR_LEN, TS_MAX_READ + (1u << 20), &h);
        if (rc < 0 || !(h.flags & TS_F_REPLY)) {
            peer_fail(r, p, TS_EPROTO, "malformed reply");
            return;
        }
        if (avail < TS_HDR_LEN + (size_t)h.length)
            return;
        evbuffer_drain(in, TS_HDR_LEN);
        p->last_progress_ns = ts_now_mono_ns();
        if (h.epoch && r->map && h.epoch < r->map->epoch)
            map_push_to(r, p->id); /* the peer is behind: give it our map */
        peer_dispatch(r, p, &h, h.length ? evbuffer_pullup(in, h.length) : NULL);
        if (!p->bev)
            return; /* a callback failed the peer; the input went with it */
        evbuffer_drain(in, h.length);
    }
}

static void peer_set_down(ts_repl *r, struct peer *p, int down)
{
    pthread_mutex_lock(&r->lock);
    p->down = down;
    pthread_mutex_unlock(&r->lock);
}

static void peer_eventcb(struct bufferevent *bev, short what, void *arg)
{
    struct peer *p = arg;

    if (what & BEV_EVENT_CONNECTED) {
        p->connected = 1;
        p->last_progress_ns = ts_now_mono_ns();
        peer_set_down(p->r, p, 0);
        TS_INFO(FAC, "connected to %s (%s%s)", p->id, p->addr, p->use_tls ? ", TLS" : "");
        return;
    }
    if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF)) {
        int err = EVUTIL_SOCKET_ERROR();
        SSL *ssl = p->use_tls ? bufferevent_openssl_get_ssl(bev) : NULL;
        long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
        char why[200];

        if (!p->connected && vr != X509_V_OK)
            snprintf(why, sizeof(why),
                     "TLS handshake: its certificate is refused (%s; it must "
                     "be node %s's certificate from tls.ca)",
                     X509_verify_cert_error_string(vr), p->id);
        else
            snprintf(why, sizeof(why), "%s",
                     (what & BEV_EVENT_EOF) ? "connection closed"
                                            : evutil_socket_error_to_string(err));
        peer_fail(p->r, p, p->connected ? TS_ECONNRESET : TS_ECONNREFUSED, why);
    }
}

/* Fails every request owed by p and drops its connection; reconnects after a pause. */
static void peer_fail(ts_repl *r, struct peer *p, int rc, const char *why)
{
    struct pend *pe = p->pend;

    if (p->bev) {
        TS_WARN(FAC, rc, "peer %s (%s): %s", p->id, p->addr, why);
        bufferevent_free(p->bev);
        p->bev = NULL;
    }
    ERR_clear_error();
    /* The peer may come back restarted (short of what it had, serving nothing): compare its
     * logs again and tell it again when it holds ours. */
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (!strcmp(ps->node, p->id)) {
            ps->known = 0;
            ps->told_clean = 0;
        }
    p->connected = 0;
    p->pend = NULL;
    p->npend = 0;
    p->down_until_ns = ts_now_mono_ns() + RETRY_NS;
    peer_set_down(r, p, 1);
    while (pe) {
        struct pend *next = pe->next;
        struct ts_rd none;
        ts_rd_init(&none, NULL, 0);
        pe->cb(r, p, pe->ctx, rc, &none);
        free(pe);
        pe = next;
    }
    repl_waiters_check(r);
}

/*
 * A socket for a connection to a peer, bound to this node's own host as the map names it
 * (docs/architecture.md "Replication"): peers see node traffic come from the node's address, as
 * firewalls and the partition drill expect, even on a host with several addresses. A host that
 * is a name or a wildcard leaves the choice to the kernel. -1 when no socket could be made.
 */
static evutil_socket_t peer_socket(ts_repl *r, const struct peer *p, int family)
{
    const struct ts_map_node *me = r->map && r->self >= 0 ? &r->map->nodes[r->self] : NULL;
    const char *own = !me ? "" : p->use_tls && me->tls_addr[0] ? me->tls_addr : me->addr;
    const char *colon = strrchr(own, ':');
    struct addrinfo hints, *res = NULL;
    char host[128];
    evutil_socket_t fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0 || !colon || (size_t)(colon - own) >= sizeof(host))
        return fd;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - own), own);
    if (host[0] == '[') { /* "[v6]:port" */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(host, "0", &hints, &res) == 0 && res) {
        int wildcard = (family == AF_INET &&
                        ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr == INADDR_ANY) ||
                       (family == AF_INET6 &&
                        IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr));
        if (!wildcard && bind(fd, res->ai_addr, res->ai_addrlen) != 0)
            TS_WARN(FAC, TS_EIO, "connection to %s: cannot bind to this node's host %s: %s", p->id,
                    host, strerror(errno));
        freeaddrinfo(res);
    }
    return fd;
}

static int peer_connect(ts_repl *r, struct peer *p)
{
    evutil_socket_t fd;
    struct addrinfo hints, *res = NULL;
    char host[128];
    const char *colon = strrchr(p->addr, ':');

    if (!colon || (size_t)(colon - p->addr) >= sizeof(host))
        return TS_EINVAL;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - p->addr), p->addr);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
        return TS_ECONNREFUSED;
    fd = peer_socket(r, p, res->ai_family);
    if (fd < 0) {
        freeaddrinfo(res);
        return TS_EIO;
    }
    if (p->use_tls) {
        SSL *ssl = SSL_new(r->o.ssl);
        if (!ssl) {
            evutil_closesocket(fd);
            freeaddrinfo(res);
            return TS_ETLS;
        }
        SSL_set_tlsext_host_name(ssl, host);
        /* The peer must be the node the map names: its certificate carries that node id. */
        if (SSL_set1_host(ssl, p->id) != 1) {
            SSL_free(ssl);
            evutil_closesocket(fd);
            freeaddrinfo(res);
            return TS_ETLS;
        }
        p->bev = bufferevent_openssl_socket_new(r->base, fd, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                BEV_OPT_CLOSE_ON_FREE);
    } else {
        p->bev = bufferevent_socket_new(r->base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    if (!p->bev) {
        evutil_closesocket(fd);
        freeaddrinfo(res);
        return TS_ENOMEM;
    }
    bufferevent_setcb(p->bev, peer_readcb, NULL, peer_eventcb, p);
    bufferevent_set_max_single_write(p->bev, 4u << 20);
    bufferevent_set_max_single_read(p->bev, 1u << 20);
    bufferevent_enable(p->bev, EV_READ | EV_WRITE);
    p->connected = 0;
    p->last_progress_ns = ts_now_mono_ns();
    if (bufferevent_socket_connect(p->bev, res->ai_addr, (int)res->ai_addrlen) != 0) {
        freeaddrinfo(res);
        bufferevent_free(p->bev);
        p->bev = NULL;
        return TS_ECONNREFUSED;
    }
    freeaddrinfo(res);
    return 0;
}

static void wr_free_cb(const void *data, size_t len, void *extra)
{
    free(extra);
}

/*
 * Sends the frame in w (header room reserved by ts_wr_begin_frame; taken over) to peer id,
 * plus an optional data tail by reference (released through tail_cleanup). cb runs with the
 * reply, or with an error status if the peer cannot be reached or fails.
 */
static void hello_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    if (status && p && p->bev)
        TS_WARN(FAC, status, "peer %s refused our hello", p->id);
}

void repl_peer_send(ts_repl *r, const char *id, uint8_t op, struct ts_wr *w, const void *tail,
                    size_t tail_len, evbuffer_ref_cleanup_cb tail_cleanup, void *tail_arg,
                    pend_cb cb, void *ctx, uint64_t epoch)
{
    struct peer *p = peer_get(r, id);
    struct pend *pe;
    struct ts_frame_hdr h = {TS_PROTO_VERSION, op, 0, 0, 0, 0};
    struct evbuffer *out;
    struct ts_rd none;
    int rc = 0;

    ts_rd_init(&none, NULL, 0);
    if (!p || w->err) {
        rc = p ? w->err : TS_ENOENT;
        goto out_fail;
    }
    if (!p->bev) {
        /* Always try: a writer is waiting on this. Background retries are paced by the
         * pushers themselves (push_retry_later). */
        struct ts_wr hw;
        rc = peer_connect(r, p);
        if (rc) {
            p->down_until_ns = ts_now_mono_ns() + RETRY_NS;
            peer_set_down(r, p, 1);
            goto out_fail;
        }
        /* Say who we are first: a node that refuses our epoch as stale pushes us its map
         * (maps are only ever installed from MAP_PUSH, never from a reply). */
        ts_wr_init(&hw);
        ts_wr_begin_frame(&hw);
        ts_wr_u16(&hw, TS_PROTO_VERSION);
        {
            char name[80];
            snprintf(name, sizeof(name), "node:%s", r->node_id);
            ts_wr_str(&hw, name);
        }
        repl_peer_send(r, id, TS_OP_HELLO, &hw, NULL, 0, NULL, NULL, hello_reply, NULL, 0);
    }
    pe = calloc(1, sizeof(*pe));
    if (!pe) {
        rc = TS_ENOMEM;
        goto out_fail;
    }
    h.req_id = pe->id = p->next_id++;
    h.epoch = epoch ? epoch : r->map ? r->map->epoch : 0;
    h.length = (uint32_t)(w->len - TS_HDR_LEN + tail_len);
    ts_frame_encode(w->buf, &h);
    pe->cb = cb;
    pe->ctx = ctx;
    pe->next = p->pend;
    p->pend = pe;
    if (p->npend++ == 0)
        p->last_progress_ns = ts_now_mono_ns();
    out = bufferevent_get_output(p->bev);
    if (evbuffer_add_reference(out, w->buf, w->len, wr_free_cb, w->buf) != 0)
        free(w->buf);
    w->buf = NULL;
    ts_wr_fini(w);
    if (tail_len && evbuffer_add_reference(out, tail, tail_len, tail_cleanup, tail_arg) != 0)
        tail_cleanup(tail, tail_len, tail_arg);
    else if (!tail_len && tail_cleanup)
        tail_cleanup(tail, 0, tail_arg);
    return;

out_fail:
    ts_wr_fini(w);
    if (tail_cleanup)
        tail_cleanup(tail, tail_len, tail_arg);
    cb(r, p, ctx, rc, &none);
}

/* ---- chunk forwarding ------------------------------------------------------------------- */

/* The fields of a REPL_WRITE frame, up to its data (sent by reference after it). */
void repl_wr_ds_fields(struct ts_wr *w, const struct ts_dataset_policy *p, uint64_t inc)
{
    ts_wr_u8(w, p->core);
    ts_wr_u8(w, p->fringe);
    ts_wr_u8(w, p->min_core);
    ts_wr_u32(w, p->chunk_size);
    ts_wr_u8(w, p->record_format);
    ts_wr_u8(w, p->ec_k);
    ts_wr_u8(w, p->ec_m);
    ts_wr_u8(w, p->ec_dropped);
    ts_wr_u64(w, inc);
}

void repl_wr_write(struct ts_wr *w, const char *dataset, const struct ts_dataset_policy *p,
                   uint64_t inc, uint32_t shard, uint32_t idx, uint64_t size, uint32_t crc,
                   uint32_t len)
{
    ts_wr_init(w);
    ts_wr_begin_frame(w);
    ts_wr_str(w, dataset);
    repl_wr_ds_fields(w, p, inc);
    ts_wr_u32(w, shard);
    ts_wr_u32(w, idx);
    ts_wr_u64(w, size);
    ts_wr_u32(w, crc);
    ts_wr_u32(w, len);
}

static void fwd_unref(struct fwd *f)
{
    if (--f->refs == 0) {
        free(f->c->data);
        free(f->c);
        free(f);
    }
}

static void fwd_data_cleanup(const void *data, size_t len, void *arg)
{
    /* Runs on the replication thread (the peer's evbuffer belongs to it). */
    fwd_unref(arg);
}

static void fwd_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct fwd *f = ctx;
    char msg[200] = "";

    if (status == 0) {
        f->acked++;
    } else {
        if (status == TS_ESTALE)
            repl_on_stale(r, p, body);
        else if (body->len >= 6)
            ts_rd_str(body, msg, sizeof(msg));
        if (!f->rc || status == TS_ESTALE) { /* a stale map trumps other failures */
            f->rc = status;
            snprintf(f->msg, sizeof(f->msg), "replica %.63s: %.60s%s%.120s", p ? p->id : "?",
                     ts_strerror(status), msg[0] ? ": " : "", msg);
        }
    }
    if (--f->outstanding == 0) {
        complete(f->base, f->done, f->arg, f->acked == f->c->to.n ? 0 : f->rc, f->acked, f->msg);
        fwd_unref(f);
    }
}

struct fwd_msg {
    ts_repl *r;
    struct fwd *f;
};

static void fwd_start(evutil_socket_t fd, short what, void *arg)
{
    struct fwd_msg *m = arg;
    ts_repl *r = m->r;
    struct fwd *f = m->f;
    struct ts_repl_chunk *c = f->c;

    free(m);
    f->outstanding = c->to.n;
    f->refs = 1 + c->to.n;
    if (c->to.n == 0) {
        complete(f->base, f->done, f->arg, 0, 0, "");
        f->refs = 1;
        fwd_unref(f);
        return;
    }
    for (unsigned i = 0; i < c->to.n; i++) {
        struct ts_wr w;
        repl_wr_write(&w, c->dataset, &c->policy, c->inc, c->shard, c->idx, c->size, c->crc,
                      (uint32_t)c->len);
        repl_peer_send(r, c->to.id[i], TS_OP_REPL_WRITE, &w, c->data, c->len, fwd_data_cleanup, f,
                       fwd_reply, f, 0);
    }
}

void ts_repl_forward_chunk(ts_repl *r, struct ts_repl_chunk *c, struct event_base *base,
                           ts_repl_done done, void *arg)
{
    struct fwd *f = calloc(1, sizeof(*f));
    struct fwd_msg *m = calloc(1, sizeof(*m));

    if (!f || !m) {
        free(f);
        free(m);
        free(c->data);
        free(c);
        done(arg, TS_ENOMEM, 0, "out of memory");
        return;
    }
    f->c = c;
    f->base = base;
    f->done = done;
    f->arg = arg;
    m->r = r;
    m->f = f;
    event_base_once(r->base, -1, EV_TIMEOUT, fwd_start, m, NULL);
}

/* ---- waiting for core replicas ------------------------------------------------------- */

static int target_unreachable(ts_repl *r, const char *id)
{
    struct peer *p;
    for (p = r->peers; p; p = p->next)
        if (!strcmp(p->id, id))
            return !p->bev && ts_now_mono_ns() < p->down_until_ns;
    return 0;
}

void repl_waiters_check(ts_repl *r)
{
    struct waiter **wp = &r->waiters, *w;
    uint64_t now = ts_now_mono_ns();

    while ((w = *wp)) {
        unsigned acked = 0, open = 0;
        char msg[256] = "";

        for (unsigned i = 0; i < w->to.n; i++) {
            struct push *ps = repl_push_find(r, w->pg, w->to.id[i]);
            if (ps && ps->known && ps->applied >= w->seq)
                acked++;
            else if (!target_unreachable(r, w->to.id[i]) && now < w->deadline && ps)
                open++;
            else if (!msg[0])
                snprintf(msg, sizeof(msg), "core replica %s did not acknowledge", w->to.id[i]);
        }
        if (open) {
            wp = &w->next;
            continue;
        }
        *wp = w->next;
        complete(w->base, w->done, w->arg, acked == w->to.n ? 0 : TS_EUNAVAIL, acked, msg);
        free(w);
    }
}

struct wait_msg {
    ts_repl *r;
    struct waiter *w;
};

static void wait_start(evutil_socket_t fd, short what, void *arg)
{
    struct wait_msg *m = arg;
    ts_repl *r = m->r;
    struct waiter *w = m->w;

    free(m);
    w->deadline = ts_now_mono_ns() + (uint64_t)r->o.peer_timeout_ms * 1000000u * 2;
    w->next = r->waiters;
    r->waiters = w;
    for (unsigned i = 0; i < w->to.n; i++) {
        struct push *ps = repl_push_find(r, w->pg, w->to.id[i]);
        if (ps)
            repl_push_step(r, ps);
    }
    /* Fringe replicas of this PG get the new record too. */
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (ps->pg == w->pg)
            repl_push_step(r, ps);
    repl_waiters_check(r);
}

void ts_repl_wait_applied(ts_repl *r, uint32_t pg, uint64_t seq, const struct ts_repl_targets *to,
                          struct event_base *base, ts_repl_done done, void *arg)
{
    struct waiter *w = calloc(1, sizeof(*w));
    struct wait_msg *m = calloc(1, sizeof(*m));

    if (!w || !m) {
        free(w);
        free(m);
        done(arg, TS_ENOMEM, 0, "out of memory");
        return;
    }
    w->pg = pg;
    w->seq = seq;
    w->to = *to;
    w->base = base;
    w->done = done;
    w->arg = arg;
    m->r = r;
    m->w = w;
    event_base_once(r->base, -1, EV_TIMEOUT, wait_start, m, NULL);
}

struct kick_msg {
    ts_repl *r;
    uint32_t pg;
};

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kick_msg *m = arg;
    for (struct push *ps = m->r->pushes; ps; ps = ps->next)
        if (ps->pg == m->pg)
            repl_push_step(m->r, ps);
    free(m);
}

void ts_repl_kick(ts_repl *r, uint32_t pg)
{
    struct kick_msg *m = calloc(1, sizeof(*m));
    if (!m)
        return;
    m->r = r;
    m->pg = pg;
    event_base_once(r->base, -1, EV_TIMEOUT, kick_cb, m, NULL);
}

unsigned ts_repl_reachable(ts_repl *r, const struct ts_repl_targets *to)
{
    unsigned n = 0;

    pthread_mutex_lock(&r->lock);
    for (unsigned i = 0; i < to->n; i++) {
        struct peer *p;
        int down = 0;
        for (p = r->peers; p; p = p->next)
            if (!strcmp(p->id, to->id[i]))
                down = p->down && ts_now_mono_ns() < p->down_until_ns;
        n += !down;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* ---- maps ------------------------------------------------------------------------------- */

static void map_push_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    if (status && status != TS_ECONNREFUSED)
        TS_WARN(FAC, status, "pushing map epoch %llu to %s failed",
                (unsigned long long)(r->map ? r->map->epoch : 0), p ? p->id : "?");
}

static void map_push_to(ts_repl *r, const char *id)
{
    struct peer *p = peer_get(r, id);
    uint64_t now = ts_now_mono_ns();
    struct ts_wr w;

    if (!p || !r->map || r->self < 0 || r->o.no_map_push)
        return;
    if (p->map_pushed_epoch == r->map->epoch && now - p->map_pushed_ns < 200ull * 1000000)
        return; /* pushed this epoch a moment ago */
    p->map_pushed_epoch = r->map->epoch;
    p->map_pushed_ns = now;
    ts_wr_init(&w);
    ts_wr_begin_frame(&w);
    ts_map_encode(&w, r->map);
    repl_peer_send(r, id, TS_OP_MAP_PUSH, &w, NULL, 0, NULL, NULL, map_push_reply, NULL, 0);
}

struct pushmap_msg {
    ts_repl *r;
    char id[64];
};

static void pushmap_cb(evutil_socket_t fd, short what, void *arg)
{
    struct pushmap_msg *m = arg;
    map_push_to(m->r, m->id);
    free(m);
}

void ts_repl_push_map(ts_repl *r, const char *node_id)
{
    struct pushmap_msg *m = calloc(1, sizeof(*m));

    if (!m)
        return;
    m->r = r;
    snprintf(m->id, sizeof(m->id), "%s", node_id);
    event_base_once(r->base, -1, EV_TIMEOUT, pushmap_cb, m, NULL);
}

void repl_on_stale(ts_repl *r, struct peer *p, struct ts_rd *body)
{
    char msg[256];
    struct ts_map *m = NULL;
    uint64_t theirs = 0;

    if (!p || !r->map)
        return;
    ts_rd_str(body, msg, sizeof(msg));
    if (!body->err && body->off < body->len && ts_map_decode(body, &m) == 0 && m) {
        theirs = m->epoch;
        ts_map_free(m);
    }
    /* A newer map is never taken from a reply: the peer pushes it to us (MAP_PUSH, checked
     * like any other), having seen our older epoch on our request. */
    if (theirs && theirs >= r->map->epoch)
        return;
    map_push_to(r, p->id);
}

struct map_msg {
    ts_repl *r;
    struct ts_map *m;
};

static void set_map_cb(evutil_socket_t fd, short what, void *arg)
{
    struct map_msg *mm = arg;
    ts_repl *r = mm->r;
    struct ts_repl_widths wd;
    struct peer *p;

    /* Replicas that the new map moves into a dataset's replicas of a PG hold none of its
     * shards there: backfill them once they are caught up by the log, and tell them clean only
     * after (they report the same in PG_INFO; this covers a replica that has not got the map
     * yet). */
    ts_repl_widths(r->o.store, &wd);
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (!ps->pull && ts_repl_gains_data(r->map, mm->m, ps->pg, ps->node, &wd)) {
            ps->want_backfill = 1;
            ps->told_clean = 0;
        }
    ts_map_free(r->map);
    r->map = mm->m;
    free(mm);
    r->self = ts_map_find(r->map, r->node_id);
    /* Addresses may have changed: drop idle connections to peers no longer as they were. */
    for (p = r->peers; p; p = p->next) {
        int i = ts_map_find(r->map, p->id);
        const char *addr = i < 0 ? ""
                           : (p->use_tls && r->map->nodes[i].tls_addr[0])
                               ? r->map->nodes[i].tls_addr
                               : r->map->nodes[i].addr;
        if (strcmp(addr, p->addr) != 0) {
            peer_fail(r, p, TS_ECONNRESET, "address changed in the new map");
            snprintf(p->addr, sizeof(p->addr), "%s", addr);
        }
    }
    /* Positions may have moved with the map: ask again. */
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        if (!ps->busy)
            ps->known = 0;
    repl_pushes_rebuild(r);
    repl_pgpeer_map_changed(r);
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        repl_push_step(r, ps);
    repl_waiters_check(r);
}

void ts_repl_set_map(ts_repl *r, const struct ts_map *m)
{
    struct map_msg *mm = calloc(1, sizeof(*mm));

    if (!mm)
        return;
    mm->r = r;
    mm->m = ts_map_dup(m);
    if (!mm->m) {
        free(mm);
        return;
    }
    event_base_once(r->base, -1, EV_TIMEOUT, set_map_cb, mm, NULL);
}

/* ---- repair ----------------------------------------------------------------------------- */

static void repair_next(ts_repl *r, struct repair *rp);

static void repair_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body)
{
    struct repair *rp = ctx;

    struct ts_dataset_info d;

    if (ts_store_dataset_get(r->o.store, rp->dataset, &d) == 0 && d.policy.ec_dropped) {
        free(rp); /* its bytes were dropped meanwhile (tiered): nothing to repair */
        return;
    }
    if (status == 0) {
        uint32_t npieces, len = 0, crc;
        const uint8_t *data;
        ts_rd_u64(body); /* shard size */
        npieces = ts_rd_u32(body);
        if (npieces == 1) {
            len = ts_rd_u32(body);
            crc = ts_rd_u32(body);
            data = ts_rd_bytes(body, len);
            if (!body->err && ts_crc32c(0, data, len) == crc &&
                ts_store_chunk_repair(r->o.store, rp->dataset, rp->shard, rp->idx, data, len) ==
                    0) {
                pthread_mutex_lock(&r->lock);
                r->repairs++;
                pthread_mutex_unlock(&r->lock);
                TS_WARN(FAC, 0, "chunk %u of %s/%u repaired from %s", rp->idx, rp->dataset,
                        rp->shard, p->id);
                free(rp);
                return;
            }
        }
    }
    repair_next(r, rp);
}

static void repair_next(ts_repl *r, struct repair *rp)
{
    int order[TS_REPL_MAX_REPLICAS];
    size_t n = r->map ? ts_map_pg_order(r->map, rp->pg, order, TS_REPL_MAX_REPLICAS) : 0;
    struct ts_shard_info si;

    if (ts_store_shard_stat(r->o.store, rp->dataset, rp->shard, &si) != 0) {
        free(rp);
        return;
    }
    while ((size_t)rp->next_rank < n) {
        int i = order[rp->next_rank++];
        struct ts_wr w;
        uint64_t off = (uint64_t)rp->idx * si.chunk_size;
        uint32_t len = (uint32_t)TS_MIN((uint64_t)si.chunk_size, si.size - off);

        if (i == r->self)
            continue;
        ts_wr_init(&w);
        ts_wr_begin_frame(&w);
        ts_wr_str(&w, rp->dataset);
        ts_wr_u32(&w, rp->shard);
        ts_wr_u64(&w, off);
        ts_wr_u32(&w, len);
        repl_peer_send(r, r->map->nodes[i].id, TS_OP_READ, &w, NULL, 0, NULL, NULL, repair_reply,
                       rp, 0);
        return;
    }
    TS_ERROR(FAC, TS_ECORRUPT, "chunk %u of %s/%u: no replica could repair it", rp->idx,
             rp->dataset, rp->shard);
    free(rp);
}

static void repair_cb(evutil_socket_t fd, short what, void *arg)
{
    struct repair *rp = arg;
    repair_next(rp->r, rp);
}

void ts_repl_repair(ts_repl *r, const char *dataset, uint32_t shard, uint32_t idx, uint32_t pg)
{
    struct repair *rp = calloc(1, sizeof(*rp));

    if (!rp)
        return;
    snprintf(rp->dataset, sizeof(rp->dataset), "%s", dataset);
    rp->shard = shard;
    rp->idx = idx;
    rp->pg = pg;
    rp->r = r;
    event_base_once(r->base, -1, EV_TIMEOUT, repair_cb, rp, NULL);
}

/* ---- tick: timeouts, retries, lag ------------------------------------------------------ */

static void lag_snapshot(ts_repl *r)
{
    struct ts_repl_lag *lag = NULL;
    size_t n = 0, cap = 0;
    uint64_t now = ts_now_wall_ns();

    for (struct push *ps = r->pushes; ps; ps = ps->next) {
        uint64_t my_applied = 0, oldest = 0;
        struct ts_repl_lag *l;
        int rank = repl_node_rank(r, ps->pg, ps->node);
        uint8_t max_core = 1;

        if (ts_store_pg_applied(r->o.store, ps->pg, &my_applied, &oldest) != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct ts_repl_lag *nl = realloc(lag, cap * sizeof(*nl));
            if (!nl)
                break;
            lag = nl;
        }
        l = &lag[n++];
        memset(l, 0, sizeof(*l));
        l->pg = ps->pg;
        snprintf(l->node, sizeof(l->node), "%s", ps->node);
        /* Where the replica last said its log ends, even when that is no longer known for
         * sure (a timed-out or restarted peer is asked again): counting from 0 then would make
         * every entry of the PG lag, and the role would come from writes it applied long ago
         * (a fringe replica stopped would show as a core one). */
        l->applied = ps->applied;
        l->primary_applied = my_applied;
        l->recovering = !ps->pull && (!ps->known || !ps->told_clean);
        if (ps->backfill) {
            l->backfilling = 1;
            l->bf_done = ps->at;
            l->bf_total = ps->nitems;
        }
        if (my_applied > l->applied) {
            uint64_t from = l->applied + 1, scanned = 0;
            struct ts_log_rec rec;
            l->lag_ops = my_applied - l->applied;
            for (uint64_t s = from; s <= my_applied && scanned < LAG_SCAN_MAX; s++, scanned++) {
                if (ts_store_log_read(r->o.store, ps->pg, s, &rec) != 0)
                    continue;
                if (s == from)
                    l->lag_s = now > rec.time_ns ? (double)(now - rec.time_ns) / 1e9 : 0;
                if (rec.type == TS_LOG_SEAL) {
                    l->lag_bytes += rec.size;
                    if (rec.policy.core > max_core)
                        max_core = rec.policy.core;
                }
            }
        }
        /* Role by the rank and the largest core count seen in the outstanding records (3 by
         * default when there are none). */
        l->core = rank >= 0 && rank < (l->lag_ops ? max_core : 3);
    }
    pthread_mutex_lock(&r->lock);
    free(r->lag);
    r->lag = lag;
    r->nlag = n;
    pthread_mutex_unlock(&r->lock);
}

/*
 * Keeps the newest log_keep entries of a PG; where this node leads the PG, also what a replica
 * it is in touch with still has to apply (up to 8 x log_keep: a replica further behind, or one
 * that is gone, is backfilled later instead).
 */
static void trim_log(ts_repl *r, uint32_t pg)
{
    uint64_t applied = 0, keep = r->o.log_keep, cut, floor = UINT64_MAX;

    if (ts_store_pg_applied(r->o.store, pg, &applied, NULL) != 0 || applied <= keep)
        return;
    cut = applied - keep;
    if (repl_pgpeer_find(r, pg)) {
        for (struct push *ps = r->pushes; ps; ps = ps->next)
            if (ps->pg == pg && !ps->pull && ps->known && ps->applied < floor)
                floor = ps->applied;
        if (floor < cut)
            cut = TS_MAX(floor, applied > 8 * keep ? applied - 8 * keep : 0);
    }
    if (cut)
        ts_store_log_trim_to(r->o.store, pg, cut);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    ts_repl *r = arg;
    uint64_t now = ts_now_mono_ns();
    uint64_t timeout = (uint64_t)r->o.peer_timeout_ms * 1000000u;

    for (struct peer *p = r->peers; p; p = p->next)
        if (p->bev && p->npend && now - p->last_progress_ns > timeout)
            peer_fail(r, p, TS_ETIMEDOUT, "no answer within peer_timeout_ms");
    repl_pgpeer_tick(r);
    for (struct push *ps = r->pushes; ps; ps = ps->next)
        repl_push_step(r, ps);
    repl_waiters_check(r);
    if (now - r->last_lag_ns > 200ull * 1000000) {
        r->last_lag_ns = now;
        lag_snapshot(r);
    }
    if (now - r->last_trim_ns > 1000ull * 1000000 && r->map) {
        r->last_trim_ns = now;
        for (uint32_t pg = 0; pg < r->map->pg_count; pg++)
            trim_log(r, pg);
    }
}

uint64_t ts_repl_rollbacks_refused(ts_repl *r)
{
    uint64_t n;

    pthread_mutex_lock(&r->lock);
    n = r->rollbacks_refused;
    pthread_mutex_unlock(&r->lock);
    return n;
}

int ts_repl_lag(ts_repl *r, struct ts_repl_lag **out, size_t *n, unsigned *primary_pgs,
                uint64_t *repairs, uint64_t *backfills)
{
    pthread_mutex_lock(&r->lock);
    *out = NULL;
    *n = r->nlag;
    if (r->nlag) {
        *out = malloc(r->nlag * sizeof(**out));
        if (*out)
            memcpy(*out, r->lag, r->nlag * sizeof(**out));
        else
            *n = 0;
    }
    *primary_pgs = r->primary_pgs;
    *repairs = r->repairs;
    *backfills = r->backfills;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static void first_peering_cb(evutil_socket_t fd, short what, void *arg)
{
    repl_pgpeer_map_changed(arg);
}

static void *repl_main(void *arg)
{
    ts_repl *r = arg;
    event_base_loop(r->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

int ts_repl_start(ts_repl **out, const struct ts_repl_opts *o, const struct ts_map *m)
{
    ts_repl *r = calloc(1, sizeof(*r));
    struct timeval tv = {0, TICK_MS * 1000};

    if (!r)
        return TS_ENOMEM;
    r->o = *o;
    snprintf(r->node_id, sizeof(r->node_id), "%s", o->node_id);
    r->self = -1;
    pthread_mutex_init(&r->lock, NULL);
    r->base = event_base_new();
    if (!r->base)
        goto out_free;
    if (m) {
        r->map = ts_map_dup(m);
        r->self = r->map ? ts_map_find(r->map, r->node_id) : -1;
        repl_pushes_rebuild(r);
    }
    r->tick = event_new(r->base, -1, EV_PERSIST, tick_cb, r);
    if (!r->tick || event_add(r->tick, &tv) != 0)
        goto out_free;
    event_base_once(r->base, -1, EV_TIMEOUT, first_peering_cb, r, NULL);
    if (pthread_create(&r->thread, NULL, repl_main, r) != 0)
        goto out_free;
    *out = r;
    return 0;
out_free:
    if (r->tick)
        event_free(r->tick);
    if (r->base)
        event_base_free(r->base);
    ts_map_free(r->map);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return TS_ENOMEM;
}

void ts_repl_stop(ts_repl *r)
{
    if (!r)
        return;
    event_base_loopbreak(r->base);
    pthread_join(r->thread, NULL);
    while (r->peers) {
        struct peer *p = r->peers;
        r->peers = p->next;
        if (p->bev)
            bufferevent_free(p->bev);
        while (p->pend) {
            struct pend *pe = p->pend;
            p->pend = pe->next;
            /* A peering request still unanswered (stopped mid-peering): its context. */
            if (repl_pgpeer_owns_ctx(pe->cb))
                free(pe->ctx);
            free(pe);
        }
        free(p);
    }
    while (r->pushes) {
        struct push *ps = r->pushes;
        r->pushes = ps->next;
        repl_push_free(ps);
    }
    while (r->waiters) {
        struct waiter *w = r->waiters;
        r->waiters = w->next;
        free(w);
    }
    repl_pgpeer_free_all(r);
    event_free(r->tick);
    event_base_free(r->base);
    ts_map_free(r->map);
    free(r->lag);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* ---- ending replica uploads --------------------------------------------------------------- */

struct abort_msg {
    ts_repl *r;
    char dataset[TS_NAME_MAX + 1];
    uint32_t shard;
    struct ts_repl_targets to;
};

static void abort_reply(ts_repl *r, struct peer *p, void *ctx, int status, struct ts_rd *body) {}

static void abort_cb(evutil_socket_t fd, short what, void *arg)
{
    struct abort_msg *m = arg;

    for (unsigned i = 0; i < m->to.n; i++) {
        struct peer *p = peer_get(m->r, m->to.id[i]);
        struct ts_wr w;
        if (!p || !p->bev)
            continue; /* no connection: no upload there to end */
        ts_wr_init(&w);
        ts_wr_begin_frame(&w);
        ts_wr_u8(&w, TS_REPL_ABORT);
        ts_wr_u32(&w, 0);
        ts_wr_u64(&w, 0);
        ts_wr_u64(&w, 0);
        ts_wr_str(&w, m->dataset);
        repl_wr_ds_fields(&w, &(struct ts_dataset_policy){0}, 0);
        ts_wr_u32(&w, m->shard);
        ts_wr_u8(&w, 0);
        ts_wr_u32(&w, 0);
        ts_wr_u32(&w, 0);
        repl_peer_send(m->r, m->to.id[i], TS_OP_REPL_SEAL, &w, NULL, 0, NULL, NULL, abort_reply,
                       NULL, 0);
    }
    free(m);
}

void ts_repl_abort_upload(ts_repl *r, const char *dataset, uint32_t shard,
                          const struct ts_repl_targets *to)
{
    struct abort_msg *m = calloc(1, sizeof(*m));

    if (!m)
        return;
    m->r = r;
    snprintf(m->dataset, sizeof(m->dataset), "%s", dataset);
    m->shard = shard;
    m->to = *to;
    event_base_once(r->base, -1, EV_TIMEOUT, abort_cb, m, NULL);
}
