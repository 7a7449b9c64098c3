/*
 * libtessera, the connection layer: the engine. Requests are queued for sending (header and
 * fields in a buffer the request owns, then optionally a data tail borrowed from the caller)
 * and matched to replies by request id; the server may answer in any order. Everything is
 * driven by ts_pump(), which sends and receives without blocking and waits in the transport's
 * wait() until a condition holds, the connection fails, or the call's timeout passes;
 * ts_conns_wait drives several connections at once. On top: queueing a request
 * (ts_req_send) and the request-reply round trips (ts_call*).
 */
#include "conn.h"

#include <errno.h>
#include <poll.h>

#define FAC "client"
#define TX_BATCH 16 /* requests gathered into one send */
/* Receive batching (ts_batch.on_block): less is not worth a wait's syscall, more is not held
 * back, and a batched wait wakes after this long whatever came. */
#define RX_BATCH_MIN (64u << 10)
#define RX_BATCH_MAX (1u << 20)
#define RX_BATCH_WAIT_MS 5

/*
 * The connection is gone (or no longer trusted): every request still in flight completes
 * with rc, and later calls get TS_ECONNRESET.
 */
void ts_fail_conn(struct tessera_client *c, int rc)
{
    const char *why;

    if (c->broken)
        return;
    c->broken = rc;
    why = c->t && c->t->ops->error ? c->t->ops->error(c->t) : NULL;
    if (why && !c->err[0])
        ts_conn_set_error(c, "%s", why);
    TS_WARN(FAC, rc, "connection to %s failed%s%s", c->node[0] ? c->node : "the server",
            why ? ": " : "", why ? why : "");
    for (size_t i = 0; i < c->nlive; i++) {
        struct ts_req *r = c->live[i];
        ts_req_unplace(c, r, 0); /* before the transport (and its registrations) goes */
        if (r->done)
            continue;
        if (!r->replied)
            r->rc = rc;
        r->sent = r->replied = 1;
        ts_req_finish(c, r);
    }
    c->tx_head = c->tx_tail = NULL;
    c->awaiting = 0;
    c->rx.soff = c->rx.slen = 0;
    ts_rx_reset(c);
    if (c->t) {
        c->t->ops->close(c->t);
        c->t = NULL;
    }
}

/* ---- sending ------------------------------------------------------------------------------- */

int ts_tx_step(struct tessera_client *c, int *progress)
{
    struct iovec iov[2 * TX_BATCH];
    struct ts_req *r;
    int cnt = 0, k = 0;
    long n;

    for (r = c->tx_head; r && k < TX_BATCH; r = r->next_tx, k++) {
        size_t off = r->tx_off;
        if (off < r->w.len) {
            iov[cnt].iov_base = r->w.buf + off;
            iov[cnt++].iov_len = r->w.len - off;
            off = r->w.len;
        }
        if (r->data_len > off - r->w.len) {
            iov[cnt].iov_base = (void *)(r->data + (off - r->w.len));
            iov[cnt++].iov_len = r->data_len - (off - r->w.len);
        }
    }
    if (cnt == 0)
        return 0;
    n = c->t->ops->send(c->t, iov, cnt);
    if (n <= 0)
        return (int)n;
    *progress = 1;
    while (n > 0 && (r = c->tx_head)) {
        size_t left = r->w.len + r->data_len - r->tx_off;
        size_t take = TS_MIN((size_t)n, left);
        r->tx_off += take;
        n -= (long)take;
        if (r->tx_off == r->w.len + r->data_len) {
            c->tx_head = r->next_tx;
            if (!c->tx_head)
                c->tx_tail = NULL;
            r->next_tx = NULL;
            r->sent = 1;
            ts_req_finish(c, r);
        }
    }
    return 0;
}

/* ---- the pump -------------------------------------------------------------------------------- */

int ts_cond_done(const struct tessera_client *c, const void *arg)
{
    return ((const struct ts_req *)arg)->done;
}

static int cond_room(const struct tessera_client *c, const void *arg)
{
    return c->inflight < c->max_inflight;
}

int ts_cond_any_user(const struct tessera_client *c, const void *arg)
{
    for (size_t i = 0; i < c->nlive; i++)
        if (c->live[i]->user && c->live[i]->done)
            return 1;
    return 0;
}

/*
 * The reply data the connection's sent reads still bring (READ and READV requests not answered
 * yet, less what has arrived of the one being received): what will arrive unless a reply is a
 * refusal or ends early.
 */
static size_t rx_due(const struct tessera_client *c)
{
    const struct rx *x = &c->rx;
    size_t due = 0;

    for (size_t i = 0; i < c->nlive; i++) {
        const struct ts_req *r = c->live[i];
        if (!r->sent || r->replied)
            continue;
        if (r == x->req && x->state == RX_VDATA) {
            due += x->vleft;
        } else if (r->op == TS_OP_READ && !r->mr) {
            due += r->cap - (r == x->req && x->state == RX_RDATA ? TS_MIN(x->have, r->cap) : 0);
        } else if (r->op == TS_OP_READV) {
            for (size_t j = 0; j < r->nrv; j++)
                due += r->rv[j].len;
        }
    }
    return due;
}

/* Before a wait: how much the transport lets queue before it wakes, the caller's want (see
 * struct ts_batch) within what is due; 1 when that wait is batched. */
static int rx_batch(struct tessera_client *c, size_t want)
{
    size_t lowat = 0;

    if (!c->t || !c->t->ops->rx_lowat)
        return 0;
    if (want >= RX_BATCH_MIN && !c->rx_nobatch) {
        lowat = TS_MIN(TS_MIN(want, (size_t)RX_BATCH_MAX), rx_due(c));
        if (lowat < RX_BATCH_MIN)
            lowat = 0;
    }
    if (lowat != c->rx_lowat && c->t->ops->rx_lowat(c->t, lowat) == 0) {
        if (!c->rx_lowat)
            c->rx_batch_since = ts_now_mono_ns();
        c->rx_lowat = lowat;
    }
    return c->rx_lowat != 0;
}

/* A wait returned, with bytes for this connection (ready) or not: a batched one that has had
 * none for RX_BATCH_WAIT_MS (its own, even while other connections woke the wait) wakes at the
 * first byte next time. */
static void rx_batch_after(struct tessera_client *c, int ready)
{
    if (ready) {
        c->rx_nobatch = 0;
        c->rx_batch_since = ts_now_mono_ns();
    } else if (c->rx_lowat &&
               ts_now_mono_ns() - c->rx_batch_since >= RX_BATCH_WAIT_MS * 1000000ull) {
        c->rx_nobatch = 1;
        rx_batch(c, 0);
    }
}

/* Sends and receives what it can without blocking; a failure ends the connection. */
static void conn_step(struct tessera_client *c, int *progress)
{
    int rc;

    rc = ts_tx_step(c, progress);
    if (rc < 0) {
        /* The server may have said why before it closed: read that first. */
        int rrc;
        c->rx_more = 1;
        rrc = ts_rx_some(c, progress);
        ts_fail_conn(c, rrc < 0 && rrc != TS_ECONNRESET ? rrc : rc);
        return;
    }
    rc = ts_rx_some(c, progress);
    if (rc < 0)
        ts_fail_conn(c, rc);
}

/*
 * Sends and receives until cond holds. A call waits at most timeout_ms for it: then the
 * connection is failed with TS_ETIMEDOUT. 0 when cond holds, else the code that broke the
 * connection.
 */
int ts_pump(struct tessera_client *c, ts_pump_cond cond, const void *arg)
{
    uint64_t deadline = 0, now;
    int rc, progress, left, events;
    size_t want;

    if (!c->t && !c->broken)
        return TS_EINVAL; /* a router has no connection to pump */
    if (c->timeout_ms > 0)
        deadline = ts_now_mono_ns() + (uint64_t)c->timeout_ms * 1000000u;
    for (;;) {
        if (cond(c, arg))
            return 0;
        if (c->broken)
            return c->broken;
        progress = 0;
        conn_step(c, &progress);
        if (progress || c->broken)
            continue;
        left = -1;
        if (deadline) {
            now = ts_now_mono_ns();
            if (now >= deadline) {
                ts_conn_set_error(c, "no reply within %d ms", c->timeout_ms);
                ts_fail_conn(c, TS_ETIMEDOUT);
                continue;
            }
            left = (int)TS_MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
        }
        events = TS_IO_READ | (c->tx_head ? TS_IO_WRITE : 0);
        want = c->batch.on_block ? c->batch.on_block(c->batch.arg) : 0;
        if (rx_batch(c, want) && (left < 0 || left > RX_BATCH_WAIT_MS))
            left = RX_BATCH_WAIT_MS;
        rc = c->t->ops->wait(c->t, events, left);
        rx_batch_after(c, rc != 0);
        if (rc < 0)
            ts_fail_conn(c, rc);
        else if (rc & TS_IO_READ)
            c->rx_more = 1;
    }
}

size_t ts_conn_user_pending(const tessera_client *c)
{
    size_t n = 0;

    for (size_t i = 0; i < c->nlive; i++)
        n += c->live[i]->user;
    return n;
}

int ts_conn_op_done(const tessera_client *c, uint64_t op)
{
    size_t i = ts_live_find(c, op);

    if (i == SIZE_MAX || !c->live[i]->user)
        return TS_ENOENT;
    return c->live[i]->done;
}

int ts_conns_wait(tessera_client *const *v, size_t n, int timeout_ms)
{
    struct pollfd pfd[64];
    tessera_client *on[64];
    uint64_t deadline = 0, now;
    size_t k, waiting, want = 0;
    int progress, left, rc, batched;

    if (timeout_ms > 0)
        deadline = ts_now_mono_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        waiting = 0;
        for (size_t i = 0; i < n; i++) {
            if (ts_cond_any_user(v[i], NULL))
                return 0;
            waiting += ts_conn_user_pending(v[i]) > 0;
        }
        if (!waiting)
            return TS_ENOENT;
        progress = 0;
        for (size_t i = 0; i < n; i++)
            if (!v[i]->broken && v[i]->t)
                conn_step(v[i], &progress);
        if (progress)
            continue;
        left = -1;
        if (deadline) {
            now = ts_now_mono_ns();
            if (now >= deadline) {
                for (size_t i = 0; i < n; i++) {
                    if (v[i]->broken || !ts_conn_user_pending(v[i]))
                        continue;
                    ts_conn_set_error(v[i], "no reply within %d ms", timeout_ms);
                    ts_fail_conn(v[i], TS_ETIMEDOUT);
                }
                continue;
            }
            left = (int)TS_MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
        }
        k = 0;
        rc = 0;
        for (size_t i = 0; i < n && k < TS_ARRAY_SIZE(pfd); i++) {
            tessera_client *c = v[i];
            int events;
            if (c->broken || !c->t || (!ts_conn_user_pending(c) && !c->tx_head))
                continue;
            events = TS_IO_READ | (c->tx_head ? TS_IO_WRITE : 0);
            pfd[k].revents = 0;
            rc = c->t->ops->pollfd ? c->t->ops->pollfd(c->t, events, &pfd[k].fd, &pfd[k].events)
                                   : TS_ENOTSUP;
            if (rc < 0) {
                ts_fail_conn(c, rc);
                break;
            }
            if (rc > 0) {
                c->rx_more = 1;
                break; /* bytes are waiting inside the transport: step again */
            }
            on[k++] = c;
        }
        if (k == 0 || rc != 0)
            continue;
        batched = 0;
        for (size_t i = 0; i < k; i++) { /* a router's connections share one hook */
            if (on[i]->batch.on_block &&
                (i == 0 || on[i]->batch.on_block != on[i - 1]->batch.on_block ||
                 on[i]->batch.arg != on[i - 1]->batch.arg))
                want = on[i]->batch.on_block(on[i]->batch.arg);
            else if (!on[i]->batch.on_block)
                want = 0;
            batched |= rx_batch(on[i], want / k); /* the caller's bytes shared out */
        }
        if (batched && (left < 0 || left > RX_BATCH_WAIT_MS))
            left = RX_BATCH_WAIT_MS;
        do {
            rc = poll(pfd, (nfds_t)k, left);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            rc = ts_from_errno(errno);
            for (size_t i = 0; i < k; i++)
                ts_fail_conn(on[i], rc);
        }
        for (size_t i = 0; i < k; i++) {
            rx_batch_after(on[i], pfd[i].revents != 0);
            if (pfd[i].revents)
                on[i]->rx_more = 1;
        }
        rc = 0;
    }
}

/*
 * Queues r with its data tail (borrowed until r is done) once fewer than max_inflight
 * requests are in flight. On failure r is still the caller's to free.
 */
int ts_req_send(struct tessera_client *c, struct ts_req *r, const void *data, size_t len)
{
    const struct ts_op_desc *d = ts_op_desc(r->op);
    struct ts_frame_hdr h = {TS_PROTO_VERSION, r->op, r->hflags, 0, 0, 0};
    struct ts_req **live;
    uint64_t payload;
    int rc;

    if (r->w.err)
        return r->w.err;
    payload = (uint64_t)(r->w.len - TS_HDR_LEN) + len;
    if (payload > TS_MIN(d->max_payload, c->max_frame)) {
        ts_conn_set_error(c, "a %s request of %llu bytes exceeds the limit of %u", d->name,
                          (unsigned long long)payload, TS_MIN(d->max_payload, c->max_frame));
        return TS_ETOOBIG;
    }
    live = ts_grow(c->live, c->nlive, &c->caplive, sizeof(*live), 64);
    if (!live)
        return TS_ENOMEM;
    c->live = live;
    rc = ts_pump(c, cond_room, NULL);
    if (rc)
        return rc;
    if (c->broken) /* the wait for room ended with the connection */
        return c->broken;
    r->id = c->next_id++;
    h.req_id = r->id;
    h.epoch = c->epoch_ref ? *c->epoch_ref : c->epoch;
    h.length = (uint32_t)payload;
    ts_frame_encode(r->w.buf, &h);
    r->data = data;
    r->data_len = len;
    r->queued = 1;
    c->live[c->nlive++] = r;
    c->inflight++;
    c->awaiting++;
    if (c->tx_tail)
        c->tx_tail->next_tx = r;
    else
        c->tx_head = r;
    c->tx_tail = r;
    return 0;
}

/*
 * A request-reply round trip. On success the reply body is in *body (pointing into r, which
 * the caller frees after decoding); on failure r is freed and the server's message is in
 * c->err.
 */
int ts_call(struct tessera_client *c, struct ts_req *r, struct ts_rd *body)
{
    int rc;

    rc = ts_req_send(c, r, NULL, 0);
    if (rc)
        goto out_free;
    rc = ts_pump(c, ts_cond_done, r);
    if (rc)
        goto out_free;
    rc = r->rc;
    if (rc)
        goto out_free;
    ts_rd_init(body, r->reply, r->reply_len);
    rc = ts_reply_status(body, c->err, sizeof(c->err));
    if (rc == TS_EPROTO && !c->err[0])
        ts_proto_err(c, "no status");
    ts_note_stale(c, body, rc);
    if (rc)
        goto out_free;
    return 0;

out_free:
    ts_req_free(c, r);
    return rc;
}

/* A round trip whose reply carries nothing after the status; r is freed either way. */
int ts_call_status(struct tessera_client *c, struct ts_req *r)
{
    struct ts_rd body;
    int rc;

    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    ts_req_free(c, r);
    return 0;
}

/* A request with just a dataset name as its body; the reply body is in *body. */
int ts_call_name(struct tessera_client *c, uint8_t op, const char *name, struct ts_req **out,
                 struct ts_rd *body)
{
    return ts_call_name_flags(c, op, name, 0, out, body);
}

int ts_call_name_flags(struct tessera_client *c, uint8_t op, const char *name, uint16_t flags,
                       struct ts_req **out, struct ts_rd *body)
{
    struct ts_req *r;
    int rc;

    *out = NULL;
    rc = ts_name_check(c, name);
    if (rc)
        return rc;
    r = ts_req_name(c, op, name);
    if (!r)
        return TS_ENOMEM;
    r->hflags = flags;
    rc = ts_call(c, r, body);
    if (rc)
        return rc;
    *out = r;
    return 0;
}
