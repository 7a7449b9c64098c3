/*
 * tesserad's RDMA sessions over rdma-core (server/rdma.h; docs/protocol.md "RDMA").
 *
 * Listener: an rdma_cm id bound to rdma_listen, its event channel non-blocking on worker 0's
 * event loop. A CONNECT_REQUEST must carry TS_RDMA_PRIV_MAGIC and a token in its private
 * data; a wrong, expired or replayed token is rejected (the reason in the reject's private
 * data) before any resource is made for it. Admitted, a session gets its own protection
 * domain, completion channel (non-blocking, on the same loop), CQ and RC queue pair, and one
 * registered region split into RECV buffers, SEND buffers and placement buffers.
 *
 * Frames: what the connection layer writes to its end of a bufferevent pair is cut into
 * SENDs of at most TS_RDMA_MSG bytes as SEND buffers come back; each RECV completion is
 * written into the pair towards the connection. The peer keeps TS_RDMA_MSG-byte RECVs
 * posted; a sender that finds none waits on the receiver (RNR retry, count 7 = forever).
 *
 * Placement: READ data is copied from the chunk into a placement buffer and posted as an
 * RDMA WRITE to the client's region; the reply's SEND is posted after the WRITEs on the same
 * queue pair, so the client sees the data in place before it sees the reply.
 *
 * A session ends on a disconnect, a completion error (a remote access error when the client
 * deregistered its memory mid-read: only that session ends), or when its connection closes.
 */
#include "rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define N_RECV 32
#define N_SEND 16
#define N_PLACE 16
#define PLACE_SLOT (256u << 10)
#define MAX_SESSIONS 64
#define PAIR_HIGH (1u << 20) /* frame bytes waiting for SEND buffers before the pair stops */

enum { WR_RECV = 1, WR_SEND = 2, WR_PLACE = 3 };
#define WR_ID(kind, i) (((uint64_t)(kind) << 32) | (uint32_t)(i))
#define WR_KIND(id) ((int)((id) >> 32))
#define WR_IDX(id) ((uint32_t)(id))

struct tsd_rdma {
    struct tsd_server *s;
    struct tsd_worker *w; /* every session lives on this worker's loop */
    struct tsd_rdma_hooks hooks;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *lid;
    struct event *cm_ev;
    char addr[80];
    struct tsd_rdma_sess *sessions;
    unsigned nsess;
};

struct tsd_rdma_sess {
    struct tsd_rdma *L;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *mem; /* RECV, SEND, then placement buffers */
    uint32_t send_free[N_SEND], nsend_free;
    uint32_t place_free[N_PLACE], nplace_free;
    struct event *cq_ev, *room_ev, *end_ev;
    struct bufferevent *pair[2]; /* [0] the connection's, [1] ours */
    struct tsd_conn *conn;
    int role;
    int established, ending;
    char who[96], peer[64];
    struct tsd_rdma_sess *prev, *next;
};

static uint8_t *recv_buf(struct tsd_rdma_sess *r, uint32_t i)
{
    return r->mem + (size_t)i * TS_RDMA_MSG;
}

static uint8_t *send_buf(struct tsd_rdma_sess *r, uint32_t i)
{
    return r->mem + (size_t)(N_RECV + i) * TS_RDMA_MSG;
}

static uint8_t *place_buf(struct tsd_rdma_sess *r, uint32_t i)
{
    return r->mem + (size_t)(N_RECV + N_SEND) * TS_RDMA_MSG + (size_t)i * PLACE_SLOT;
}

#define MEM_SIZE ((size_t)(N_RECV + N_SEND) * TS_RDMA_MSG + (size_t)N_PLACE * PLACE_SLOT)

/* rdma_cm's -1 + errno, and verbs' returned errno, as TS_E* (style rule 5). */
static int errno_rc(int e)
{
    switch (e) {
    case ENOMEM:
        return TS_ENOMEM;
    case ECONNREFUSED:
        return TS_ECONNREFUSED;
    case ETIMEDOUT:
        return TS_ETIMEDOUT;
    case ENODEV:
    case ENOSYS:
    case EAFNOSUPPORT:
    case EADDRNOTAVAIL:
        return TS_ENOTSUP;
    default:
        return TS_EIO;
    }
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- a session's end ------------------------------------------------------------------------ */

/* Frees everything of r (the CM event that named it, if any, is acknowledged already). */
static void sess_free(struct tsd_rdma_sess *r)
{
    struct tsd_rdma *L = r->L;

    if (r->prev)
        r->prev->next = r->next;
    else if (L->sessions == r)
        L->sessions = r->next;
    if (r->next)
        r->next->prev = r->prev;
    L->nsess--;
    if (r->cq_ev)
        event_free(r->cq_ev);
    if (r->room_ev)
        event_free(r->room_ev);
    if (r->end_ev)
        event_free(r->end_ev);
    if (r->pair[1])
        bufferevent_free(r->pair[1]);
    if (r->id && r->id->qp)
        rdma_destroy_qp(r->id);
    if (r->mr)
        ibv_dereg_mr(r->mr);
    if (r->cq)
        ibv_destroy_cq(r->cq);
    if (r->cc)
        ibv_destroy_comp_channel(r->cc);
    if (r->pd)
        ibv_dealloc_pd(r->pd);
    if (r->id)
        rdma_destroy_id(r->id);
    free(r->mem);
    free(r);
}

/* Ends r from a clean stack (never inside its own callbacks' loops): its connection goes
 * too, unless the connection is what ended it. */
static void end_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_rdma_sess *r = arg;
    struct tsd_conn *c = r->conn;

    r->conn = NULL;
    if (c)
        r->L->hooks.gone(c);
    if (r->established)
        rdma_disconnect(r->id);
    TS_DEBUG(FAC, "RDMA session from %s (%s) ended", r->peer, r->who);
    sess_free(r);
}

static void sess_end(struct tsd_rdma_sess *r, int rc, const char *why)
{
    if (r->ending)
        return;
    r->ending = 1;
    if (rc)
        TS_WARN(FAC, rc, "RDMA session from %s (%s): %s; closing it", r->peer, r->who, why);
    if (r->end_ev)
        event_active(r->end_ev, EV_TIMEOUT, 0);
    else
        sess_free(r);
}

void tsd_rdma_close(struct tsd_rdma_sess *r)
{
    if (!r)
        return;
    r->conn = NULL; /* the connection is going: no hook for it */
    sess_end(r, 0, NULL);
}

/* ---- sends and receives ------------------------------------------------------------------- */

static int post_recv(struct tsd_rdma_sess *r, uint32_t i)
{
    struct ibv_sge sge = {(uintptr_t)recv_buf(r, i), TS_RDMA_MSG, r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WR_ID(WR_RECV, i), .sg_list = &sge, .num_sge = 1}, *bad;

    return ibv_post_recv(r->id->qp, &wr, &bad) ? TS_EIO : 0;
}

/* Frame bytes the connection wrote, as SENDs while SEND buffers are free. */
static void tx_pump(struct tsd_rdma_sess *r)
{
    struct evbuffer *in;

    if (r->ending || !r->pair[1])
        return;
    in = bufferevent_get_input(r->pair[1]);
    while (r->nsend_free && evbuffer_get_length(in) > 0) {
        uint32_t i = r->send_free[--r->nsend_free];
        int n = evbuffer_remove(in, send_buf(r, i), TS_RDMA_MSG);
        struct ibv_sge sge = {(uintptr_t)send_buf(r, i), (uint32_t)n, r->mr->lkey};
        struct ibv_send_wr wr = {.wr_id = WR_ID(WR_SEND, i),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        int e;

        if (n <= 0 || (e = ibv_post_send(r->id->qp, &wr, &bad)) != 0) {
            r->send_free[r->nsend_free++] = i;
            sess_end(r, TS_EIO, "cannot post a SEND");
            return;
        }
    }
}

static void pair_readcb(struct bufferevent *bev, void *arg)
{
    tx_pump(arg);
}

static void pair_eventcb(struct bufferevent *bev, short what, void *arg)
{
    /* Our end reports nothing we act on: the connection closes through tsd_rdma_close. */
}

static void room_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_rdma_sess *r = arg;

    if (r->conn && !r->ending)
        r->L->hooks.room(r->conn);
}

static void on_completion(struct tsd_rdma_sess *r, const struct ibv_wc *wc)
{
    uint32_t i = WR_IDX(wc->wr_id);

    if (wc->status != IBV_WC_SUCCESS) {
        char why[160];
        if (r->ending)
            return;
        snprintf(why, sizeof(why), "%s completion failed: %s",
                 WR_KIND(wc->wr_id) == WR_PLACE  ? "placement (RDMA WRITE)"
                 : WR_KIND(wc->wr_id) == WR_SEND ? "SEND"
                                                 : "RECV",
                 ibv_wc_status_str(wc->status));
        sess_end(r, wc->status == IBV_WC_REM_ACCESS_ERR ? TS_EPERM : TS_EIO, why);
        return;
    }
    switch (WR_KIND(wc->wr_id)) {
    case WR_RECV:
        if (r->pair[1] && bufferevent_write(r->pair[1], recv_buf(r, i), wc->byte_len) != 0) {
            sess_end(r, TS_ENOMEM, "cannot queue a received frame");
            return;
        }
        if (post_recv(r, i) != 0)
            sess_end(r, TS_EIO, "cannot post a RECV");
        break;
    case WR_SEND:
        r->send_free[r->nsend_free++] = i;
        tx_pump(r);
        break;
    case WR_PLACE:
        r->place_free[r->nplace_free++] = i;
        event_active(r->room_ev, EV_TIMEOUT, 0);
        break;
    }
}

/* The completion channel is readable: take the event, re-arm, then drain the CQ (what
 * completed between the two is still seen). */
static void cq_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_rdma_sess *r = arg;
    struct ibv_cq *cq;
    void *ctx;
    struct ibv_wc wc[16];
    int n;

    if (ibv_get_cq_event(r->cc, &cq, &ctx) == 0)
        ibv_ack_cq_events(cq, 1);
    if (ibv_req_notify_cq(r->cq, 0) != 0) {
        sess_end(r, TS_EIO, "cannot arm the completion queue");
        return;
    }
    do {
        n = ibv_poll_cq(r->cq, 16, wc);
        for (int k = 0; k < n && !r->ending; k++)
            on_completion(r, &wc[k]);
    } while (n > 0 && !r->ending);
    if (n < 0)
        sess_end(r, TS_EIO, "cannot poll the completion queue");
}

long tsd_rdma_place(struct tsd_rdma_sess *r, const void *src, size_t len, uint64_t raddr,
                    uint32_t rkey)
{
    size_t taken = 0;

    if (!r || r->ending)
        return TS_ECONNRESET;
    while (taken < len && r->nplace_free) {
        uint32_t i = r->place_free[--r->nplace_free];
        size_t k = TS_MIN(len - taken, (size_t)PLACE_SLOT);
        struct ibv_sge sge = {(uintptr_t)place_buf(r, i), (uint32_t)k, r->mr->lkey};
        struct ibv_send_wr wr = {.wr_id = WR_ID(WR_PLACE, i),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;

        if (src)
            memcpy(place_buf(r, i), (const uint8_t *)src + taken, k);
        else
            memset(place_buf(r, i), 0, k);
        wr.wr.rdma.remote_addr = raddr + taken;
        wr.wr.rdma.rkey = rkey;
        if (ibv_post_send(r->id->qp, &wr, &bad) != 0) {
            r->place_free[r->nplace_free++] = i;
            sess_end(r, TS_EIO, "cannot post an RDMA WRITE");
            return TS_EIO;
        }
        taken += k;
    }
    return (long)taken;
}

/* ---- admission ------------------------------------------------------------------------------ */

static void reject(struct rdma_cm_id *id, const char *peer, const char *why)
{
    TS_WARN(FAC, TS_EPERM, "RDMA connection from %s refused: %s", peer, why);
    rdma_reject(id, why, (uint8_t)TS_MIN(strlen(why) + 1, (size_t)140));
}

static void peer_name(struct rdma_cm_id *id, char *out, size_t cap)
{
    struct sockaddr *sa = rdma_get_peer_addr(id);
    char host[64] = "?", port[16] = "?";

    if (sa)
        getnameinfo(sa,
                    sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in),
                    host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, cap, "rdma:%s:%s", host, port);
}

/* A connect request: 0 when accepted (a session exists for id), else the id is to be
 * destroyed by the caller once the event is acknowledged. */
static int on_connect_request(struct tsd_rdma *L, struct rdma_cm_id *id, const uint8_t *priv,
                              size_t plen)
{
    struct tsd_rdma_sess *r;
    struct ibv_qp_init_attr qa;
    struct rdma_conn_param cp;
    char peer[64], who[96];
    const char *why;
    int role;

    peer_name(id, peer, sizeof(peer));
    if (plen < 4 + TS_RDMA_TOKEN_LEN || ts_get_le32(priv) != TS_RDMA_PRIV_MAGIC) {
        reject(id, peer, "no tessera RDMA token in the connect request");
        return -1;
    }
    if (atomic_load(&L->s->draining)) {
        reject(id, peer, "the node is shutting down");
        return -1;
    }
    if (L->nsess >= MAX_SESSIONS) {
        reject(id, peer, "too many RDMA sessions on this node");
        return -1;
    }
    if (tsd_rdma_token_redeem(&L->s->rdma_tokens, priv + 4, ts_now_mono_ns(), &role, who,
                              sizeof(who), &why) != 0) {
        reject(id, peer, why);
        return -1;
    }
    r = calloc(1, sizeof(*r));
    if (!r) {
        reject(id, peer, "out of memory");
        return -1;
    }
    r->L = L;
    r->role = role;
    snprintf(r->who, sizeof(r->who), "%s", who);
    snprintf(r->peer, sizeof(r->peer), "%s", peer);
    r->next = L->sessions;
    if (L->sessions)
        L->sessions->prev = r;
    L->sessions = r;
    L->nsess++;
    r->pd = ibv_alloc_pd(id->verbs);
    r->cc = r->pd ? ibv_create_comp_channel(id->verbs) : NULL;
    r->cq = r->cc ? ibv_create_cq(id->verbs, N_RECV + N_SEND + N_PLACE + 8, r, r->cc, 0) : NULL;
    r->mem = r->cq ? aligned_alloc(4096, MEM_SIZE) : NULL;
    r->mr = r->mem ? ibv_reg_mr(r->pd, r->mem, MEM_SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
    r->cq_ev = r->mr ? event_new(L->w->base, r->cc->fd, EV_READ | EV_PERSIST, cq_cb, r) : NULL;
    r->room_ev = event_new(L->w->base, -1, 0, room_cb, r);
    r->end_ev = event_new(L->w->base, -1, 0, end_cb, r);
    if (!r->cq_ev || !r->room_ev || !r->end_ev || ibv_req_notify_cq(r->cq, 0) != 0)
        goto out_fail;
    set_nonblock(r->cc->fd);
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = qa.recv_cq = r->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = N_SEND + N_PLACE;
    qa.cap.max_recv_wr = N_RECV;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, r->pd, &qa) != 0)
        goto out_fail;
    r->id = id;
    id->context = r;
    for (uint32_t i = 0; i < N_SEND; i++)
        r->send_free[r->nsend_free++] = i;
    for (uint32_t i = 0; i < N_PLACE; i++)
        r->place_free[r->nplace_free++] = i;
    for (uint32_t i = 0; i < N_RECV; i++)
        if (post_recv(r, i) != 0)
            goto out_fail;
    memset(&cp, 0, sizeof(cp));
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.retry_count = 7;
    cp.rnr_retry_count = 7; /* a peer without a RECV posted is waited for, not failed */
    if (rdma_accept(id, &cp) != 0)
        goto out_fail;
    /* The CQ is watched from ESTABLISHED on: a frame that arrives before it waits in the CQ
     * (the channel stays readable) until its pipe to the connection exists. */
    TS_DEBUG(FAC, "RDMA session from %s admitted (%s, role %s)", peer, who, ts_role_name(role));
    return 0;

out_fail:
    reject(id, peer, "cannot set up the session's queue pair and memory");
    r->id = NULL; /* the caller destroys id (after the event is acknowledged) */
    if (id->qp)
        rdma_destroy_qp(id);
    id->context = NULL;
    sess_free(r);
    return -1;
}

static void on_established(struct tsd_rdma *L, struct tsd_rdma_sess *r)
{
    if (!r || r->ending)
        return;
    r->established = 1;
    if (bufferevent_pair_new(L->w->base, BEV_OPT_DEFER_CALLBACKS, r->pair) != 0) {
        sess_end(r, TS_ENOMEM, "cannot make its frame pipe");
        return;
    }
    bufferevent_setcb(r->pair[1], pair_readcb, NULL, pair_eventcb, r);
    bufferevent_setwatermark(r->pair[1], EV_READ, 0, PAIR_HIGH);
    bufferevent_enable(r->pair[1], EV_READ | EV_WRITE);
    r->conn = L->hooks.conn_start(L->w, r->pair[0], r, r->peer, r->role, r->who);
    if (!r->conn) {
        r->pair[0] = NULL; /* conn_start freed it */
        sess_end(r, TS_ENOMEM, "cannot set up its connection");
        return;
    }
    event_add(r->cq_ev, NULL);
}

static void cm_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_rdma *L = arg;
    struct rdma_cm_event *ev;

    while (rdma_get_cm_event(L->ch, &ev) == 0) {
        enum rdma_cm_event_type type = ev->event;
        struct rdma_cm_id *id = ev->id;
        /* A connect request's id carries the listener's context until it is accepted. */
        struct tsd_rdma_sess *r =
            id && id != L->lid && type != RDMA_CM_EVENT_CONNECT_REQUEST ? id->context : NULL;
        int drop = 0;

        if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
            drop = on_connect_request(L, id, ev->param.conn.private_data,
                                      ev->param.conn.private_data_len) != 0;
        rdma_ack_cm_event(ev); /* before any rdma_destroy_id of its id */
        switch (type) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
            if (drop)
                rdma_destroy_id(id);
            break;
        case RDMA_CM_EVENT_ESTABLISHED:
            on_established(L, r);
            break;
        case RDMA_CM_EVENT_DISCONNECTED:
            if (r) {
                r->established = 0;
                sess_end(r, 0, NULL);
            }
            break;
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED:
            if (r)
                sess_end(r, TS_ECONNRESET, rdma_event_str(type));
            break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
            if (r)
                sess_end(r, TS_EIO, "the RDMA device went away");
            break;
        default:
            break;
        }
    }
}

/* ---- the listener --------------------------------------------------------------------------- */

int tsd_rdma_start(struct tsd_server *s, const char *addr, const struct tsd_rdma_hooks *hooks,
                   char *why, size_t cap)
{
    struct tsd_rdma *L;
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    char host[64], port[16];
    const char *colon = strrchr(addr, ':');
    struct sockaddr *sa;
    int rc = TS_EINVAL, e;

    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof(host) || strlen(colon) > 15) {
        snprintf(why, cap, "rdma_listen '%s' is not HOST:PORT", addr);
        return TS_EINVAL;
    }
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    snprintf(port, sizeof(port), "%s", colon + 1);
    if ((e = getaddrinfo(host, port, &hints, &ai)) != 0) {
        snprintf(why, cap, "rdma_listen '%s': %s", addr, gai_strerror(e));
        return TS_EINVAL;
    }
    L = calloc(1, sizeof(*L));
    if (!L) {
        rc = TS_ENOMEM;
        goto out_ai;
    }
    L->s = s;
    L->w = &s->workers[0];
    L->hooks = *hooks;
    L->ch = rdma_create_event_channel();
    if (!L->ch) {
        rc = errno_rc(errno);
        snprintf(why, cap, "rdma_listen %s: no RDMA here: cannot open the RDMA CM (%s)", addr,
                 strerror(errno));
        goto out_free;
    }
    set_nonblock(L->ch->fd);
    if (rdma_create_id(L->ch, &L->lid, L, RDMA_PS_TCP) != 0 ||
        rdma_bind_addr(L->lid, ai->ai_addr) != 0 || rdma_listen(L->lid, 16) != 0) {
        rc = errno_rc(errno);
        snprintf(why, cap,
                 "cannot listen for RDMA on %s: %s (is an RDMA device, e.g. Soft-RoCE rxe, bound "
                 "to that address's interface?)",
                 addr, strerror(errno));
        goto out_id;
    }
    sa = rdma_get_local_addr(L->lid);
    snprintf(L->addr, sizeof(L->addr), "%s:%u", host,
             ntohs(sa->sa_family == AF_INET6 ? ((struct sockaddr_in6 *)sa)->sin6_port
                                             : ((struct sockaddr_in *)sa)->sin_port));
    L->cm_ev = event_new(L->w->base, L->ch->fd, EV_READ | EV_PERSIST, cm_cb, L);
    if (!L->cm_ev || event_add(L->cm_ev, NULL) != 0) {
        rc = TS_ENOMEM;
        goto out_id;
    }
    s->rdma = L;
    freeaddrinfo(ai);
    TS_INFO(FAC, "RDMA listener on %s", L->addr);
    return 0;

out_id:
    if (L->cm_ev)
        event_free(L->cm_ev);
    if (L->lid)
        rdma_destroy_id(L->lid);
    rdma_destroy_event_channel(L->ch);
out_free:
    free(L);
out_ai:
    freeaddrinfo(ai);
    return rc;
}

void tsd_rdma_stop(struct tsd_server *s)
{
    struct tsd_rdma *L = s->rdma;

    if (!L)
        return;
    while (L->sessions) {
        struct tsd_rdma_sess *r = L->sessions;
        if (r->conn) /* a connection the shutdown left: it must not reach the session */
            r->conn->rdma = NULL;
        r->conn = NULL;
        sess_free(r);
    }
    event_free(L->cm_ev);
    rdma_destroy_id(L->lid);
    rdma_destroy_event_channel(L->ch);
    free(L);
    s->rdma = NULL;
}

const char *tsd_rdma_addr(const struct tsd_server *s)
{
    return s->rdma ? s->rdma->addr : NULL;
}

unsigned tsd_rdma_sessions(const struct tsd_server *s)
{
    return s->rdma ? s->rdma->nsess : 0;
}
