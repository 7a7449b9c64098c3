/*
 * RDMA transport over rdma-core (docs/protocol.md "RDMA"): an RC queue pair set up with
 * librdmacm, admitted by the token its control connection got (open.c); frames travel as
 * SENDs of at most TS_RDMA_MSG bytes into RECVs the peer keeps posted, and READ data is
 * written by the server straight into memory registered here (reg/dereg), never copied.
 *
 * Non-blocking like the socket transports: send and recv take what the queue pair allows now;
 * wait and pollfd use one epoll descriptor that holds the completion channel and the CM event
 * channel, so that a disconnect wakes a waiter as data does. rdma_cm's -1 + errno and verbs'
 * returned errno become TS_E* here. Built only with rdma-core (transport_rdma_stub.c
 * otherwise).
 */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define N_RECV 32
#define N_SEND 16
enum { WR_RECV = 1, WR_SEND = 2 };
#define WR_ID(kind, i) (((uint64_t)(kind) << 32) | (uint32_t)(i))
#define WR_KIND(id) ((int)((id) >> 32))
#define WR_IDX(id) ((uint32_t)(id))
#define MEM_SIZE ((size_t)(N_RECV + N_SEND) * TS_RDMA_MSG)
#define REG_CACHE 64                 /* registrations kept */
#define REG_CACHE_BYTES (1ull << 30) /* and their bytes, at most */

struct rdma_transport {
    struct ts_transport base;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *mem;
    int ep; /* epoll: cc->fd and ch->fd */
    int connected;
    int broken; /* TS_E*: a completion failed or the peer disconnected */
    uint32_t send_free[N_SEND], nsend_free;
    /* RECVs completed and not yet consumed, in arrival order. */
    uint32_t ready[N_RECV], ready_len[N_RECV], nready, ready_head;
    uint32_t head_off; /* bytes of the first ready buffer already taken */
    uint64_t max_mr_size;
    /* The registration cache: buffers of recent reads, kept registered (see rdma_reg). */
    struct reg {
        struct ibv_mr *mr;
        uint8_t *addr;
        size_t len;
        unsigned busy; /* reads in flight into it */
        int stale;     /* a read into it failed its CRC: deregister once idle */
        int kind;      /* how it was registered: REG_HOST, REG_DMABUF, REG_DEVADDR */
        uint64_t used;
    } regs[REG_CACHE];
    unsigned nregs;
    uint64_t reg_clock, reg_bytes;
    uint64_t reg_hits, reg_misses;
    char err[200];
};

static int from_errno(int e)
{
    switch (e) {
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EADDRNOTAVAIL:
        return TS_ECONNREFUSED;
    case ETIMEDOUT:
        return TS_ETIMEDOUT;
    case ENOMEM:
        return TS_ENOMEM;
    case ENODEV:
    case ENOSYS:
    case EOPNOTSUPP:
        return TS_ENOTSUP;
    default:
        return TS_EIO;
    }
}

static uint8_t *recv_buf(struct rdma_transport *r, uint32_t i)
{
    return r->mem + (size_t)i * TS_RDMA_MSG;
}

static uint8_t *send_buf(struct rdma_transport *r, uint32_t i)
{
    return r->mem + (size_t)(N_RECV + i) * TS_RDMA_MSG;
}

static int post_recv(struct rdma_transport *r, uint32_t i)
{
    struct ibv_sge sge = {(uintptr_t)recv_buf(r, i), TS_RDMA_MSG, r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WR_ID(WR_RECV, i), .sg_list = &sge, .num_sge = 1}, *bad;

    return ibv_post_recv(r->id->qp, &wr, &bad) ? TS_EIO : 0;
}

static void set_broken(struct rdma_transport *r, int rc, const char *why)
{
    if (r->broken)
        return;
    r->broken = rc;
    snprintf(r->err, sizeof(r->err), "%s", why);
}

/* Takes CM events (a disconnect breaks the transport) without blocking. */
static void cm_poll(struct rdma_transport *r)
{
    struct rdma_cm_event *ev;

    while (rdma_get_cm_event(r->ch, &ev) == 0) {
        enum rdma_cm_event_type type = ev->event;
        rdma_ack_cm_event(ev);
        if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
            r->connected = 0;
            set_broken(r, TS_ECONNRESET, "the server ended the RDMA session");
        }
    }
}

/* Drains the CQ without blocking: receives queued in order, SEND buffers given back. */
static void cq_poll(struct rdma_transport *r)
{
    struct ibv_wc wc[16];
    int n;

    while ((n = ibv_poll_cq(r->cq, 16, wc)) > 0) {
        for (int k = 0; k < n; k++) {
            uint32_t i = WR_IDX(wc[k].wr_id);
            if (wc[k].status != IBV_WC_SUCCESS) {
                char why[160];
                snprintf(why, sizeof(why), "RDMA %s failed: %s",
                         WR_KIND(wc[k].wr_id) == WR_SEND ? "SEND" : "RECV",
                         ibv_wc_status_str(wc[k].status));
                set_broken(r, TS_ECONNRESET, why);
                continue;
            }
            if (WR_KIND(wc[k].wr_id) == WR_SEND) {
                r->send_free[r->nsend_free++] = i;
            } else {
                uint32_t at = (r->ready_head + r->nready) % N_RECV;
                r->ready[at] = i;
                r->ready_len[at] = wc[k].byte_len;
                r->nready++;
            }
        }
    }
    if (n < 0)
        set_broken(r, TS_EIO, "cannot poll the RDMA completion queue");
}

static void progress(struct rdma_transport *r)
{
    cq_poll(r);
    cm_poll(r);
}

static long tr_send(struct ts_transport *t, const struct iovec *iov, int iovcnt)
{
    struct rdma_transport *r = (struct rdma_transport *)t;
    long total = 0;
    int v = 0;
    size_t voff = 0;

    progress(r);
    if (r->broken)
        return r->broken;
    while (r->nsend_free && v < iovcnt) {
        uint32_t i = r->send_free[--r->nsend_free];
        size_t n = 0;
        struct ibv_sge sge;
        struct ibv_send_wr wr = {.wr_id = WR_ID(WR_SEND, i),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;

        /* One SEND gathers as much of iov as a peer's RECV holds (a copy: these are frame
         * headers and request fields, small). */
        while (v < iovcnt && n < TS_RDMA_MSG) {
            size_t k = TS_MIN(iov[v].iov_len - voff, (size_t)TS_RDMA_MSG - n);
            memcpy(send_buf(r, i) + n, (const uint8_t *)iov[v].iov_base + voff, k);
            n += k;
            voff += k;
            if (voff == iov[v].iov_len) {
                v++;
                voff = 0;
            }
        }
        if (n == 0) {
            r->send_free[r->nsend_free++] = i;
            break;
        }
        sge = (struct ibv_sge){(uintptr_t)send_buf(r, i), (uint32_t)n, r->mr->lkey};
        if (ibv_post_send(r->id->qp, &wr, &bad) != 0) {
            r->send_free[r->nsend_free++] = i;
            set_broken(r, TS_EIO, "cannot post an RDMA SEND");
            return total ? total : TS_EIO;
        }
        total += (long)n;
    }
    return total;
}

static long tr_recv(struct ts_transport *t, const struct iovec *iov, int iovcnt)
{
    struct rdma_transport *r = (struct rdma_transport *)t;
    long total = 0;

    progress(r);
    for (int v = 0; v < iovcnt; v++) {
        size_t off = 0;
        while (off < iov[v].iov_len && r->nready) {
            uint32_t i = r->ready[r->ready_head], len = r->ready_len[r->ready_head];
            size_t k = TS_MIN(iov[v].iov_len - off, (size_t)(len - r->head_off));
            memcpy((uint8_t *)iov[v].iov_base + off, recv_buf(r, i) + r->head_off, k);
            off += k;
            total += (long)k;
            r->head_off += (uint32_t)k;
            if (r->head_off == len) {
                r->head_off = 0;
                r->ready_head = (r->ready_head + 1) % N_RECV;
                r->nready--;
                if (post_recv(r, i) != 0) {
                    set_broken(r, TS_EIO, "cannot post an RDMA RECV");
                    return total ? total : TS_EIO;
                }
            }
        }
        if (off < iov[v].iov_len)
            break;
    }
    if (total == 0 && r->broken)
        return r->broken;
    return total;
}

/* Events ready now (bytes received, a SEND buffer free); 0 if none. */
static int ready_now(struct rdma_transport *r, int events)
{
    int ready = 0;

    if ((events & TS_IO_READ) && (r->nready || r->broken))
        ready |= TS_IO_READ;
    if ((events & TS_IO_WRITE) && (r->nsend_free || r->broken))
        ready |= TS_IO_WRITE;
    return ready;
}

/* Arms the CQ's notification, then looks once more (what completed before the arming). */
static int arm(struct rdma_transport *r, int events)
{
    int ready;

    progress(r);
    ready = ready_now(r, events);
    if (ready)
        return ready;
    if (ibv_req_notify_cq(r->cq, 0) != 0) {
        set_broken(r, TS_EIO, "cannot arm the RDMA completion queue");
        return events;
    }
    progress(r);
    return ready_now(r, events);
}

/* The completion channel fired: take its events (acknowledged at once). */
static void take_cq_events(struct rdma_transport *r)
{
    struct ibv_cq *cq;
    void *ctx;

    while (ibv_get_cq_event(r->cc, &cq, &ctx) == 0)
        ibv_ack_cq_events(cq, 1);
}

static int tr_wait(struct ts_transport *t, int events, int timeout_ms)
{
    struct rdma_transport *r = (struct rdma_transport *)t;
    struct timespec t0;
    int ready;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct epoll_event ev[2];
        struct timespec now;
        int left = timeout_ms, n;

        ready = arm(r, events);
        if (ready)
            return ready;
        if (timeout_ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            left = timeout_ms -
                   (int)((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
            if (left <= 0)
                return 0;
        }
        n = epoll_wait(r->ep, ev, 2, left);
        if (n < 0 && errno != EINTR)
            return TS_EIO;
        take_cq_events(r);
    }
}

static int tr_pollfd(struct ts_transport *t, int events, int *fd, short *pevents)
{
    struct rdma_transport *r = (struct rdma_transport *)t;

    take_cq_events(r);
    if (arm(r, events))
        return 1;
    *fd = r->ep;
    *pevents = POLLIN;
    return 0;
}

static const char *tr_error(struct ts_transport *t)
{
    struct rdma_transport *r = (struct rdma_transport *)t;

    return r->err[0] ? r->err : NULL;
}

/* ---- registrations for placed reads ------------------------------------------------------- */

/*
 * A registration cache: the buffer of a read stays registered after it, so a reader that reads
 * into the same buffers again (a pool, a pinned arena) registers each once. A cache keyed by
 * address cannot see memory freed and mapped again at the same address: its registration
 * still points at the old pages, so the node's WRITE lands there. The end-to-end CRC makes
 * that safe: the caller's bytes then fail their check, the connection layer marks the entry
 * stale (tr_dereg with bad), and the VERIFY read that follows registers afresh.
 */
static void reg_drop(struct rdma_transport *r, unsigned i)
{
    ibv_dereg_mr(r->regs[i].mr);
    r->reg_bytes -= r->regs[i].len;
    r->regs[i] = r->regs[--r->nregs];
}

/* Room for one more of len bytes: idle entries dropped, least recently used first. */
static void reg_make_room(struct rdma_transport *r, size_t len)
{
    while (r->nregs == REG_CACHE || (r->nregs && r->reg_bytes + len > REG_CACHE_BYTES)) {
        int lru = -1;
        for (unsigned i = 0; i < r->nregs; i++)
            if (!r->regs[i].busy && (lru < 0 || r->regs[i].used < r->regs[lru].used))
                lru = (int)i;
        if (lru < 0)
            return; /* every entry has a read in flight: go over the bound for now */
        reg_drop(r, (unsigned)lru);
    }
}

/* A registration of device memory (src): from its DMA-BUF where src gives one, else of the
 * device address itself (nvidia-peermem). NULL with errno set when the device or driver
 * cannot. */
static struct ibv_mr *reg_device(struct rdma_transport *r, void *buf, size_t len,
                                 const struct ts_reg_src *src, int access)
{
    struct ibv_mr *mr;
    uint64_t off = 0;
    int fd = -1, rc, e;

    if (!src->dmabuf)
        return ibv_reg_mr(r->pd, buf, len, access);
    rc = src->dmabuf(src->ctx, buf, len, &fd, &off);
    if (rc) {
        errno = rc == TS_ENOTSUP ? EOPNOTSUPP : EIO;
        return NULL;
    }
    mr = ibv_reg_dmabuf_mr(r->pd, off, len, (uintptr_t)buf, fd, access);
    e = errno;
    close(fd); /* the registration holds the buffer */
    errno = e;
    return mr;
}

enum { REG_HOST, REG_DMABUF, REG_DEVADDR };

static int tr_reg(struct ts_transport *t, void *buf, size_t len, const struct ts_reg_src *src,
                  uint64_t *addr, uint32_t *key, void **h)
{
    int kind = !src ? REG_HOST : src->dmabuf ? REG_DMABUF : REG_DEVADDR;
    struct rdma_transport *r = (struct rdma_transport *)t;
    uint8_t *p = buf;
    struct reg *e;
    struct ibv_mr *mr;

    *h = NULL;
    if (r->broken)
        return r->broken;
    if (len == 0 || len > r->max_mr_size)
        return TS_ENOTSUP; /* the caller reads this range in-band instead */
    for (unsigned i = 0; i < r->nregs; i++) {
        e = &r->regs[i];
        if (!e->stale && e->kind == kind && p >= e->addr && p + len <= e->addr + e->len) {
            e->busy++;
            e->used = ++r->reg_clock;
            r->reg_hits++;
            *addr = (uintptr_t)buf;
            *key = e->mr->rkey;
            *h = e->mr;
            return 0;
        }
    }
    reg_make_room(r, len);
    if (r->nregs == REG_CACHE)
        return TS_ENOTSUP; /* all busy: in-band */
    if (src)
        mr = reg_device(r, buf, len, src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    else
        mr = ibv_reg_mr(r->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
        return from_errno(errno);
    r->reg_misses++;
    e = &r->regs[r->nregs++];
    *e = (struct reg){mr, p, len, 1, 0, kind, ++r->reg_clock};
    r->reg_bytes += len;
    *addr = (uintptr_t)buf;
    *key = mr->rkey;
    *h = mr;
    return 0;
}

static void tr_dereg(struct ts_transport *t, void *h, int bad)
{
    struct rdma_transport *r = (struct rdma_transport *)t;

    for (unsigned i = 0; h && i < r->nregs; i++) {
        struct reg *e = &r->regs[i];
        if (e->mr != h)
            continue;
        if (e->busy)
            e->busy--;
        if (bad)
            e->stale = 1;
        if (e->stale && !e->busy)
            reg_drop(r, i);
        return;
    }
}

void ts_rdma_reg_stats(struct ts_transport *t, uint64_t *hits, uint64_t *misses)
{
    struct rdma_transport *r = (struct rdma_transport *)t;

    *hits = t && t->ops == &ts_transport_rdma ? r->reg_hits : 0;
    *misses = t && t->ops == &ts_transport_rdma ? r->reg_misses : 0;
}

/* ---- connecting --------------------------------------------------------------------------- */

static void tr_close(struct ts_transport *t)
{
    struct rdma_transport *r = (struct rdma_transport *)t;

    if (!r)
        return;
    if (r->connected)
        rdma_disconnect(r->id);
    while (r->nregs)
        reg_drop(r, r->nregs - 1);
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
    if (r->ch)
        rdma_destroy_event_channel(r->ch);
    if (r->ep >= 0)
        close(r->ep);
    free(r->mem);
    free(r);
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Waits up to timeout_ms for the next CM event of the connection's set-up; it must be `want`.
 * A reject carries the server's reason in its private data. */
static int cm_expect(struct rdma_transport *r, enum rdma_cm_event_type want, int timeout_ms,
                     const struct ts_conn_params *p)
{
    struct pollfd pfd = {r->ch->fd, POLLIN, 0};
    struct rdma_cm_event *ev;
    enum rdma_cm_event_type got;
    int rc;

    if (poll(&pfd, 1, timeout_ms < 0 ? -1 : timeout_ms) <= 0) {
        ts_conn_err(p, "RDMA connection set-up to %s:%s timed out (waiting for %s)", p->host,
                    p->port, rdma_event_str(want));
        return TS_ETIMEDOUT;
    }
    if (rdma_get_cm_event(r->ch, &ev) != 0) {
        ts_conn_err(p, "RDMA CM: %s", strerror(errno));
        return from_errno(errno);
    }
    got = ev->event;
    rc = got == want ? 0 : TS_ECONNREFUSED;
    if (got == RDMA_CM_EVENT_REJECTED) {
        char why[150] = "";
        if (ev->param.conn.private_data_len && ev->param.conn.private_data)
            snprintf(why, sizeof(why), "%.*s", (int)ev->param.conn.private_data_len,
                     (const char *)ev->param.conn.private_data);
        ts_conn_err(p, "the server refused the RDMA session: %s",
                    why[0] ? why : "no reason given (no tessera RDMA listener there?)");
        rc = TS_EPERM;
        if (!why[0])
            rc = TS_ECONNREFUSED;
    } else if (rc) {
        ts_conn_err(p, "RDMA connection to %s:%s: %s (waiting for %s)", p->host, p->port,
                    rdma_event_str(got), rdma_event_str(want));
    }
    rdma_ack_cm_event(ev);
    return rc;
}

static int tr_connect(struct ts_transport **out, const struct ts_conn_params *p)
{
    struct rdma_transport *r;
    struct addrinfo hints = {.ai_flags = AI_NUMERICSERV, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    struct ibv_qp_init_attr qa;
    struct rdma_conn_param cp;
    struct ibv_device_attr da;
    struct epoll_event ev = {.events = EPOLLIN};
    uint8_t priv[4 + TS_RDMA_TOKEN_LEN];
    int rc, e, tmo = p->timeout_ms < 0 ? -1 : p->timeout_ms;

    *out = NULL;
    if (!p->rdma_token) {
        ts_conn_err(p, "an RDMA session needs a token from a control connection");
        return TS_EINVAL;
    }
    if ((e = getaddrinfo(p->host, p->port, &hints, &ai)) != 0) {
        ts_conn_err(p, "cannot resolve %s:%s: %s", p->host, p->port, gai_strerror(e));
        return TS_ECONNREFUSED;
    }
    r = calloc(1, sizeof(*r));
    if (!r) {
        freeaddrinfo(ai);
        return TS_ENOMEM;
    }
    r->base.ops = &ts_transport_rdma;
    r->ep = -1;
    r->ch = rdma_create_event_channel();
    if (!r->ch) {
        rc = TS_ENOTSUP;
        ts_conn_err(p, "no RDMA on this host: cannot open the RDMA CM (%s)", strerror(errno));
        goto out_close;
    }
    if (rdma_create_id(r->ch, &r->id, r, RDMA_PS_TCP) != 0 ||
        rdma_resolve_addr(r->id, NULL, ai->ai_addr, tmo < 0 ? 2000 : tmo) != 0) {
        rc = from_errno(errno);
        ts_conn_err(p, "cannot resolve the RDMA address %s:%s: %s", p->host, p->port,
                    strerror(errno));
        goto out_close;
    }
    if ((rc = cm_expect(r, RDMA_CM_EVENT_ADDR_RESOLVED, tmo, p)) != 0)
        goto out_close;
    if (rdma_resolve_route(r->id, tmo < 0 ? 2000 : tmo) != 0) {
        rc = from_errno(errno);
        ts_conn_err(p, "cannot resolve an RDMA route to %s:%s: %s", p->host, p->port,
                    strerror(errno));
        goto out_close;
    }
    if ((rc = cm_expect(r, RDMA_CM_EVENT_ROUTE_RESOLVED, tmo, p)) != 0)
        goto out_close;
    r->max_mr_size = ibv_query_device(r->id->verbs, &da) == 0 ? da.max_mr_size : (1ull << 30);
    r->pd = ibv_alloc_pd(r->id->verbs);
    r->cc = r->pd ? ibv_create_comp_channel(r->id->verbs) : NULL;
    r->cq = r->cc ? ibv_create_cq(r->id->verbs, N_RECV + N_SEND + 8, r, r->cc, 0) : NULL;
    r->mem = r->cq ? aligned_alloc(4096, MEM_SIZE) : NULL;
    r->mr = r->mem ? ibv_reg_mr(r->pd, r->mem, MEM_SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!r->mr) {
        rc = TS_ENOMEM;
        ts_conn_err(p, "cannot set up RDMA resources (protection domain, CQ, memory)");
        goto out_close;
    }
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = qa.recv_cq = r->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = N_SEND;
    qa.cap.max_recv_wr = N_RECV;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(r->id, r->pd, &qa) != 0) {
        rc = from_errno(errno);
        ts_conn_err(p, "cannot create an RDMA queue pair: %s", strerror(errno));
        goto out_close;
    }
    for (uint32_t i = 0; i < N_SEND; i++)
        r->send_free[r->nsend_free++] = i;
    for (uint32_t i = 0; i < N_RECV; i++)
        if ((rc = post_recv(r, i)) != 0)
            goto out_close;
    ts_put_le32(priv, TS_RDMA_PRIV_MAGIC);
    memcpy(priv + 4, p->rdma_token, TS_RDMA_TOKEN_LEN);
    memset(&cp, 0, sizeof(cp));
    cp.private_data = priv;
    cp.private_data_len = sizeof(priv);
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.retry_count = 7;
    cp.rnr_retry_count = 7; /* wait for the server's RECVs rather than fail */
    if (rdma_connect(r->id, &cp) != 0) {
        rc = from_errno(errno);
        ts_conn_err(p, "RDMA connect to %s:%s: %s", p->host, p->port, strerror(errno));
        goto out_close;
    }
    if ((rc = cm_expect(r, RDMA_CM_EVENT_ESTABLISHED, tmo, p)) != 0)
        goto out_close;
    r->connected = 1;
    set_nonblock(r->ch->fd);
    set_nonblock(r->cc->fd);
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    if (r->ep < 0 || epoll_ctl(r->ep, EPOLL_CTL_ADD, r->cc->fd, &ev) != 0 ||
        epoll_ctl(r->ep, EPOLL_CTL_ADD, r->ch->fd, &ev) != 0) {
        rc = TS_EIO;
        ts_conn_err(p, "cannot set up waiting on the RDMA channels");
        goto out_close;
    }
    freeaddrinfo(ai);
    *out = &r->base;
    return 0;

out_close:
    freeaddrinfo(ai);
    tr_close(&r->base);
    return rc;
}

const struct ts_transport_ops ts_transport_rdma = {
    .name = "rdma",
    .connect = tr_connect,
    .send = tr_send,
    .recv = tr_recv,
    .wait = tr_wait,
    .error = tr_error,
    .pollfd = tr_pollfd,
    .close = tr_close,
    .reg = tr_reg,
    .dereg = tr_dereg,
};
