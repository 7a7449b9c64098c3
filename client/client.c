/*
 * libtessera: one connection per handle, many requests in flight on it.
 *
 * Requests are queued for sending (header and fields in a buffer the request owns, then
 * optionally a data tail borrowed from the caller) and matched to replies by request id; the
 * server may answer in any order. Everything is driven by pump(), which sends and receives
 * without blocking and waits in the transport's wait() until a condition holds, the
 * connection fails, or the call's timeout passes. READ data is received straight into the
 * destination buffer after its piece table was checked, and each piece's CRC32C is verified
 * as soon as its bytes are in.
 */
#include "client_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ts_map.h"

#define FAC "client"
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_MAX_INFLIGHT 64u
#define MAX_SMALL_REPLY (256u << 20) /* lists and documents */
#define MAX_ERROR_REPLY (64u << 10)  /* a status and a message */
#define MAX_REFUSAL (2u << 20)       /* a refused READ: a message and maybe a map (TS_ESTALE) */
#define MAX_READ_REPLY (TS_MAX_READ + (1u << 20))
#define PUT_WINDOW_BYTES (32u << 20) /* upload bytes in flight */
#define READ_WINDOW 4                /* TESSERA_MAX_READ requests in flight per tessera_read */
#define TX_BATCH 16                  /* requests gathered into one send */
#define RX_BUDGET (16u << 20)        /* bytes received before the pump looks around */

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
};

enum rx_state { RX_HDR, RX_BODY, RX_RHEAD, RX_RDATA, RX_DRAIN };

/* A frame header and the fixed head of a READ reply that may follow it: what one receive asks
 * for when a new frame begins. */
#define RX_STAGE (TS_HDR_LEN + TS_READ_HEAD_LEN)
#define RX_TABLE_KEEP 4096 /* piece table bytes kept for the next reply (512 pieces) */

/*
 * The receive side. A new frame is received into stage, together with the head of a READ
 * reply that may follow the header, but never further: the piece table and the data of a
 * READ reply are received straight into their places (the data into the caller's buffer), in
 * one receive for both. When a frame is shorter than that head, stage holds the start of the
 * next frame, which is taken from there first (it is never READ data: that begins after a
 * whole head).
 */
struct rx {
    enum rx_state state;
    uint8_t stage[RX_STAGE];
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
    uint32_t pdone;     /* pieces verified */
    size_t pdoff;       /* their bytes */
    size_t drain_left;
    int drain_rc;
};

struct tessera_client {
    struct ts_cluster *cl; /* cluster mode: a router with no connection of its own */
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
    unsigned inflight;
    struct ts_req **live; /* requests queued or awaiting tessera_wait, in id order */
    size_t nlive, caplive;
    struct ts_req *free_reqs;
    struct ts_req *tx_head, *tx_tail;
    struct rx rx;
    unsigned awaiting; /* requests queued whose reply has not arrived */
    int rx_more;       /* a receive may find bytes: no receive came back short since the last
                          wait that said the transport is readable */
    uint8_t *scratch;
    const uint64_t *epoch_ref; /* a sub-connection: requests carry the router's map epoch */
    uint64_t seen_epoch;       /* the highest epoch a reply carried */
    struct ts_map *stale_map;  /* the newest map a TS_ESTALE reply carried, until taken */
    struct tessera_opts opts;  /* a top-level handle: how it was opened (strings in optbuf) */
    char *optbuf;
    char node[256];
    char err[512];
};

/* ---- small helpers ----------------------------------------------------------------------------
 */

static void set_err(struct tessera_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_err(struct tessera_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* A malformed reply: the call fails with TS_EPROTO and says why. */
static int proto_err(struct tessera_client *c, const char *what)
{
    set_err(c, "malformed reply from the server: %s", what);
    TS_WARN(FAC, TS_EPROTO, "malformed reply: %s", what);
    return TS_EPROTO;
}

/*
 * A refusal with status rc was decoded from r (left after the message): a TS_ESTALE reply
 * carries the node's map there; keep the newest for the router (ts_conn_take_stale_map).
 */
static void note_stale(struct tessera_client *c, struct ts_rd *r, int rc)
{
    struct ts_map *m = NULL;

    if (rc != TS_ESTALE || r->err || r->off >= r->len)
        return;
    if (ts_map_decode(r, &m) != 0) {
        TS_WARN(FAC, TS_EPROTO, "a TS_ESTALE reply from %s carries a malformed map", c->node);
        return;
    }
    if (c->stale_map && c->stale_map->epoch >= m->epoch) {
        ts_map_free(m);
        return;
    }
    ts_map_free(c->stale_map);
    c->stale_map = m;
    if (m->epoch > c->seen_epoch)
        c->seen_epoch = m->epoch;
}

/* Checks common to every call: a usable handle, a clean message slot. */
static int enter(tessera_client *c)
{
    if (!c)
        return TS_EINVAL;
    c->err[0] = '\0';
    return c->broken ? TS_ECONNRESET : 0;
}

static int name_check(tessera_client *c, const char *name)
{
    if (!ts_name_valid(name)) {
        set_err(c, "'%s' is not a valid dataset name", name ? name : "(null)");
        return TS_ENAME;
    }
    return 0;
}

/* enter() for a call on a dataset: a valid name too. */
static int enter_name(tessera_client *c, const char *name)
{
    int rc = enter(c);

    return rc ? rc : name_check(c, name);
}

/* enter() for the calls that only a connection takes, never a router. */
static int enter_conn(tessera_client *c)
{
    int rc = enter(c);

    if (rc)
        return rc;
    return c->cl ? TS_EINVAL : 0;
}

void *ts_grow(void *v, size_t n, size_t *cap, size_t size, size_t first)
{
    size_t ncap;

    if (n < *cap)
        return v;
    ncap = *cap ? *cap * 2 : first;
    v = realloc(v, ncap * size);
    if (v)
        *cap = ncap;
    return v;
}

/* ---- request bookkeeping -------------------------------------------------------------------- */

static struct ts_req *req_new(struct tessera_client *c, uint8_t op)
{
    struct ts_req *r = c->free_reqs;
    struct ts_wr w;

    if (r) {
        c->free_reqs = r->next_tx;
        w = r->w;
    } else {
        r = malloc(sizeof(*r));
        if (!r)
            return NULL;
        ts_wr_init(&w);
    }
    memset(r, 0, sizeof(*r));
    r->w = w;
    r->w.err = 0;
    r->op = op;
    ts_wr_begin_frame(&r->w);
    return r;
}

/* A new request whose body starts with the dataset name. */
static struct ts_req *req_name(struct tessera_client *c, uint8_t op, const char *name)
{
    struct ts_req *r = req_new(c, op);

    if (r)
        ts_wr_str(&r->w, name);
    return r;
}

static size_t live_find(const struct tessera_client *c, uint64_t id)
{
    size_t lo = 0, hi = c->nlive;

    while (lo < hi) { /* ids only grow: live[] is sorted */
        size_t mid = lo + (hi - lo) / 2;
        if (c->live[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->nlive && c->live[lo]->id == id ? lo : SIZE_MAX;
}

static void req_free(struct tessera_client *c, struct ts_req *r)
{
    size_t i;

    if (!r)
        return;
    if (r->queued) {
        i = live_find(c, r->id);
        if (i != SIZE_MAX) {
            memmove(&c->live[i], &c->live[i + 1], (c->nlive - i - 1) * sizeof(c->live[0]));
            c->nlive--;
        }
    }
    free(r->reply);
    free(r->msg);
    r->reply = NULL;
    r->msg = NULL;
    r->next_tx = c->free_reqs;
    c->free_reqs = r;
}

static void req_destroy(struct ts_req *r)
{
    free(r->reply);
    free(r->msg);
    ts_wr_fini(&r->w);
    free(r);
}

/* Sent and answered: the request is the caller's again. */
static void req_finish(struct tessera_client *c, struct ts_req *r)
{
    if (r->done || !r->sent || !r->replied)
        return;
    r->done = 1;
    r->seq = ++c->done_seq;
    c->inflight--;
}

/* Ready for the next frame; what stage holds of it (and the table buffer) is kept. */
static void rx_reset(struct tessera_client *c)
{
    struct rx *x = &c->rx;
    uint8_t *table = x->table;
    size_t table_cap = x->table_cap, soff = x->soff, slen = x->slen;
    uint8_t stage[RX_STAGE];

    memcpy(stage, x->stage, slen);
    free(x->body);
    if (table_cap > RX_TABLE_KEEP) {
        free(table);
        table = NULL;
        table_cap = 0;
    }
    memset(x, 0, sizeof(*x));
    memcpy(x->stage, stage, slen);
    x->soff = soff;
    x->slen = slen;
    x->table = table;
    x->table_cap = table_cap;
    x->state = RX_HDR;
}

/*
 * The connection is gone (or no longer trusted): every request still in flight completes
 * with rc, and later calls get TS_ECONNRESET.
 */
static void fail_conn(struct tessera_client *c, int rc)
{
    const char *why;

    if (c->broken)
        return;
    c->broken = rc;
    why = c->t && c->t->ops->error ? c->t->ops->error(c->t) : NULL;
    if (why && !c->err[0])
        set_err(c, "%s", why);
    TS_WARN(FAC, rc, "connection to %s failed%s%s", c->node[0] ? c->node : "the server",
            why ? ": " : "", why ? why : "");
    for (size_t i = 0; i < c->nlive; i++) {
        struct ts_req *r = c->live[i];
        if (r->done)
            continue;
        if (!r->replied)
            r->rc = rc;
        r->sent = r->replied = 1;
        req_finish(c, r);
    }
    c->tx_head = c->tx_tail = NULL;
    c->awaiting = 0;
    c->rx.soff = c->rx.slen = 0;
    rx_reset(c);
    if (c->t) {
        c->t->ops->close(c->t);
        c->t = NULL;
    }
}

/* ---- sending ------------------------------------------------------------------------------- */

static int tx_step(struct tessera_client *c, int *progress)
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
            req_finish(c, r);
        }
    }
    return 0;
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* The whole reply is in: the request is answered. */
static void rx_complete(struct tessera_client *c, int rc)
{
    struct ts_req *r = c->rx.req;

    if (r->op == TS_OP_READ) {
        r->rc = rc;
        if (rc == 0) {
            r->got = c->rx.rd.data_len;
            r->shard_size = c->rx.rd.shard_size;
        }
    } else {
        r->reply = c->rx.body; /* the request owns the payload now */
        r->reply_len = c->rx.body_len;
        c->rx.body = NULL;
    }
    r->replied = 1;
    req_finish(c, r);
    rx_reset(c);
    /* Nothing more is expected: the next receive waits until the transport is readable. */
    if (c->awaiting && --c->awaiting == 0)
        c->rx_more = 0;
}

/* Skips the rest of a frame whose request fails with rc (framing is intact). */
static void rx_drain(struct tessera_client *c, size_t left, int rc)
{
    c->rx.drain_left = left;
    c->rx.drain_rc = rc;
    c->rx.have = 0;
    c->rx.state = RX_DRAIN;
    if (left == 0)
        rx_complete(c, rc);
}

/* A whole refused READ reply or other small payload was received into rx.body. */
static int rx_body_done(struct tessera_client *c)
{
    struct ts_req *r = c->rx.req;
    char msg[sizeof(c->err)];
    struct ts_rd rd;
    int rc;

    if (!r) { /* request id 0: the server gave up on the connection */
        ts_rd_init(&rd, c->rx.body, c->rx.body_len);
        rc = ts_reply_status(&rd, c->err, sizeof(c->err));
        TS_WARN(FAC, rc, "the server closes the connection: %s", c->err);
        return rc ? rc : TS_EPROTO;
    }
    if (r->op == TS_OP_READ) { /* only refusals come here */
        ts_rd_init(&rd, c->rx.body, c->rx.body_len);
        rc = ts_reply_status(&rd, msg, sizeof(msg));
        note_stale(c, &rd, rc);
        free(r->msg);
        r->msg = strdup(msg);
        rx_complete(c, rc ? rc : TS_EPROTO);
        return 0;
    }
    rx_complete(c, 0);
    return 0;
}

/* A frame header is in x->h. */
static int rx_header(struct tessera_client *c)
{
    struct rx *x = &c->rx;
    size_t i;

    if (!(x->h.flags & TS_F_REPLY))
        return proto_err(c, "a request where a reply was expected");
    if (x->h.epoch > c->seen_epoch)
        c->seen_epoch = x->h.epoch;
    if (!c->epoch_ref && x->h.epoch > c->epoch)
        c->epoch = x->h.epoch;
    x->have = 0;
    if (x->h.req_id == 0) {
        if (x->h.length > MAX_ERROR_REPLY)
            return proto_err(c, "oversized error reply");
        x->req = NULL;
        goto body;
    }
    i = live_find(c, x->h.req_id);
    if (i == SIZE_MAX || c->live[i]->replied)
        return proto_err(c, "reply to an unknown request id");
    x->req = c->live[i];
    if (x->req->op != x->h.opcode)
        return proto_err(c, "reply opcode differs from the request's");
    if (x->req->op == TS_OP_READ) {
        if (x->h.length > MAX_READ_REPLY)
            return proto_err(c, "oversized READ reply");
        x->rhead_len = TS_MIN((size_t)x->h.length, TS_READ_HEAD_LEN);
        x->state = RX_RHEAD;
        if (x->rhead_len == 0)
            rx_drain(c, 0, TS_EPROTO);
        return 0;
    }
    if (x->h.length > MAX_SMALL_REPLY)
        return proto_err(c, "oversized reply");
body:
    x->body_len = x->h.length;
    x->body = malloc(x->body_len ? x->body_len : 1);
    if (!x->body)
        return TS_ENOMEM;
    x->state = RX_BODY;
    if (x->body_len == 0)
        return rx_body_done(c);
    return 0;
}

/* The fixed head of a READ reply is in x->rhead. */
static int rx_read_head(struct tessera_client *c)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;
    size_t payload = x->h.length;

    int32_t status = (int32_t)ts_get_le32(x->rhead);

    if (status != 0) { /* refused: status + message, read it whole */
        if (payload > MAX_REFUSAL) {
            rx_drain(c, payload - x->rhead_len, status < 0 ? status : TS_EPROTO);
            return 0;
        }
        x->body_len = payload;
        x->body = malloc(payload);
        if (!x->body)
            return TS_ENOMEM;
        memcpy(x->body, x->rhead, x->rhead_len);
        x->have = x->rhead_len;
        x->state = RX_BODY;
        return x->have == x->body_len ? rx_body_done(c) : 0;
    }
    if (x->rhead_len < TS_READ_HEAD_LEN ||
        ts_read_head_decode(x->rhead, payload, r->rd_off, r->cap, &x->rd) != 0) {
        proto_err(c, "READ reply does not match the range asked for");
        rx_drain(c, payload - x->rhead_len, TS_EPROTO);
        return 0;
    }
    /* From here the data (at most r->cap bytes, checked above) may land in r->dst. */
    x->have = 0;
    if (x->rd.npieces) {
        x->tlen = (size_t)x->rd.npieces * 8;
        x->thave = 0;
        if (x->tlen > x->table_cap) {
            uint8_t *t = realloc(x->table, x->tlen);
            if (!t)
                return TS_ENOMEM;
            x->table = t;
            x->table_cap = x->tlen;
        }
        x->state = RX_RDATA;
        return 0;
    }
    if (x->rd.data_len) {
        proto_err(c, "READ reply carries data but no pieces");
        rx_drain(c, x->rd.data_len, TS_EPROTO);
        return 0;
    }
    rx_complete(c, 0);
    return 0;
}

/* A corrupt READ reply: the request fails with rc, the rest of the frame is skipped. */
static void rx_read_fail(struct tessera_client *c, int rc)
{
    struct rx *x = &c->rx;

    rx_drain(c, x->tlen - x->thave + x->rd.data_len - x->have, rc);
}

/* n more bytes of a READ reply's piece table and data arrived (table first). */
static int rx_read_data(struct tessera_client *c, size_t n)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;
    size_t k = TS_MIN(n, x->tlen - x->thave);
    int rc;

    if (k) {
        x->thave += k;
        n -= k;
        x->have += n; /* data that came with the end of the table */
        if (x->thave < x->tlen)
            return 0;
        if (ts_read_pieces_check(x->table, x->rd.npieces, x->rd.data_len) != 0) {
            proto_err(c, "READ piece lengths do not add up to the data sent");
            rx_read_fail(c, TS_EPROTO);
            return 0;
        }
    } else {
        x->have += n;
    }
    rc = ts_read_pieces_verify(x->table, x->rd.npieces, r->dst, x->have, &x->pdone, &x->pdoff);
    if (rc) {
        set_err(c, "piece %u of a READ reply fails its CRC32C", x->pdone);
        free(r->msg);
        r->msg = strdup(c->err); /* for tessera_wait*, which report the read's own message */
        TS_ERROR(FAC, rc, "shard data corrupt in transit: piece %u of request %llu", x->pdone,
                 (unsigned long long)r->id);
        rx_read_fail(c, rc);
        return 0;
    }
    if (x->have == x->rd.data_len)
        rx_complete(c, 0);
    return 0;
}

/* n more bytes of the current target (not stage) are in place. */
static int rx_arrived(struct tessera_client *c, size_t n)
{
    struct rx *x = &c->rx;

    switch (x->state) {
    case RX_BODY:
        x->have += n;
        return x->have < x->body_len ? 0 : rx_body_done(c);
    case RX_RDATA:
        return rx_read_data(c, n);
    default:
        x->drain_left -= n;
        if (x->drain_left == 0)
            rx_complete(c, x->drain_rc);
        return 0;
    }
}

/*
 * Takes what stage holds for the current state: a frame header, a READ head, or bytes of the
 * current target (copied; they are never READ data). 1 when the state moved on, 0 when stage
 * holds too little, TS_E* when the connection is unusable.
 */
static int rx_staged(struct tessera_client *c, const struct iovec *iov)
{
    struct rx *x = &c->rx;
    size_t avail = x->slen - x->soff, k;
    int rc;

    switch (x->state) {
    case RX_HDR:
        rc = ts_frame_parse(x->stage + x->soff, TS_MIN(avail, (size_t)TS_HDR_LEN), UINT32_MAX,
                            &x->h);
        if (rc < 0)
            return proto_err(c, c->frames ? "bad frame header"
                                          : "not a tessera frame (is this a tessera server?)");
        if (rc == 0)
            return 0;
        x->soff += TS_HDR_LEN;
        c->frames++;
        rc = rx_header(c);
        break;
    case RX_RHEAD:
        if (avail < x->rhead_len)
            return 0;
        memcpy(x->rhead, x->stage + x->soff, x->rhead_len);
        x->soff += x->rhead_len;
        rc = rx_read_head(c);
        break;
    default:
        if (avail == 0)
            return 0;
        k = TS_MIN(avail, iov[0].iov_len);
        memcpy(iov[0].iov_base, x->stage + x->soff, k);
        x->soff += k;
        rc = rx_arrived(c, k);
        break;
    }
    if (x->soff == x->slen)
        x->soff = x->slen = 0;
    return rc < 0 ? rc : 1;
}

/*
 * One step of receiving: what stage holds, else one receive. 1 when bytes were taken, 0 when
 * nothing is there (or nothing is expected: c->rx_more is 0), TS_E* when the connection is
 * unusable.
 */
static int rx_step(struct tessera_client *c, size_t *bytes)
{
    struct rx *x = &c->rx;
    struct iovec iov[2];
    size_t want;
    int cnt = 1, rc;
    long n;

    if (!c->scratch && x->state == RX_DRAIN) {
        c->scratch = malloc(64u << 10);
        if (!c->scratch)
            return TS_ENOMEM;
    }
    switch (x->state) {
    case RX_HDR:
    case RX_RHEAD:
        iov[0].iov_len = 0;
        break;
    case RX_BODY:
        iov[0].iov_base = x->body + x->have;
        iov[0].iov_len = x->body_len - x->have;
        break;
    case RX_RDATA:
        /* The rest of the piece table and the data together, the data straight into the
         * caller's buffer. */
        if (x->thave < x->tlen) {
            iov[0].iov_base = x->table + x->thave;
            iov[0].iov_len = x->tlen - x->thave;
            iov[cnt].iov_base = x->req->dst + x->have;
            iov[cnt].iov_len = x->rd.data_len - x->have;
            cnt += iov[cnt].iov_len > 0;
        } else {
            iov[0].iov_base = x->req->dst + x->have;
            iov[0].iov_len = x->rd.data_len - x->have;
        }
        break;
    default:
        iov[0].iov_base = c->scratch;
        iov[0].iov_len = TS_MIN(x->drain_left, (size_t)64u << 10);
        break;
    }
    rc = rx_staged(c, iov);
    if (rc != 0)
        return rc;
    if (!c->rx_more)
        return 0;
    if (x->state == RX_HDR || x->state == RX_RHEAD) {
        /* Into stage: a header with the READ head that may follow it, or the rest of a head. */
        if (x->soff) {
            memmove(x->stage, x->stage + x->soff, x->slen - x->soff);
            x->slen -= x->soff;
            x->soff = 0;
        }
        want = x->state == RX_HDR ? RX_STAGE : x->rhead_len;
        iov[0].iov_base = x->stage + x->slen;
        iov[0].iov_len = want - x->slen;
    }
    want = iov[0].iov_len + (cnt > 1 ? iov[1].iov_len : 0);
    n = c->t->ops->recv(c->t, iov, cnt);
    if (n <= 0) {
        if (n == 0)
            c->rx_more = 0;
        return (int)n;
    }
    if ((size_t)n < want)
        c->rx_more = 0; /* the transport has nothing more now: wait before the next receive */
    *bytes += (size_t)n;
    if (x->state == RX_HDR || x->state == RX_RHEAD) {
        x->slen += (size_t)n;
        rc = rx_staged(c, NULL);
    } else {
        rc = rx_arrived(c, (size_t)n);
    }
    return rc < 0 ? rc : 1;
}

/* Receives what is there, up to a budget; 0 or TS_E*. */
static int rx_some(struct tessera_client *c, int *progress)
{
    size_t bytes = 0;
    int rc;

    while (bytes < RX_BUDGET) {
        rc = rx_step(c, &bytes);
        if (rc <= 0)
            return rc;
        *progress = 1;
    }
    return 0;
}

/* ---- the pump -------------------------------------------------------------------------------- */

typedef int (*pump_cond)(const struct tessera_client *c, const void *arg);

static int cond_done(const struct tessera_client *c, const void *arg)
{
    return ((const struct ts_req *)arg)->done;
}

static int cond_room(const struct tessera_client *c, const void *arg)
{
    return c->inflight < c->max_inflight;
}

static int cond_any_user(const struct tessera_client *c, const void *arg)
{
    for (size_t i = 0; i < c->nlive; i++)
        if (c->live[i]->user && c->live[i]->done)
            return 1;
    return 0;
}

/* Sends and receives what it can without blocking; a failure ends the connection. */
static void conn_step(struct tessera_client *c, int *progress)
{
    int rc;

    rc = tx_step(c, progress);
    if (rc < 0) {
        /* The server may have said why before it closed: read that first. */
        int rrc;
        c->rx_more = 1;
        rrc = rx_some(c, progress);
        fail_conn(c, rrc < 0 && rrc != TS_ECONNRESET ? rrc : rc);
        return;
    }
    rc = rx_some(c, progress);
    if (rc < 0)
        fail_conn(c, rc);
}

/*
 * Sends and receives until cond holds. A call waits at most timeout_ms for it: then the
 * connection is failed with TS_ETIMEDOUT. 0 when cond holds, else the code that broke the
 * connection.
 */
static int pump(struct tessera_client *c, pump_cond cond, const void *arg)
{
    uint64_t deadline = 0, now;
    int rc, progress, left, events;

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
                set_err(c, "no reply within %d ms", c->timeout_ms);
                fail_conn(c, TS_ETIMEDOUT);
                continue;
            }
            left = (int)TS_MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
        }
        events = TS_IO_READ | (c->tx_head ? TS_IO_WRITE : 0);
        rc = c->t->ops->wait(c->t, events, left);
        if (rc < 0)
            fail_conn(c, rc);
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
    size_t i = live_find(c, op);

    if (i == SIZE_MAX || !c->live[i]->user)
        return TS_ENOENT;
    return c->live[i]->done;
}

int ts_conns_wait(tessera_client *const *v, size_t n, int timeout_ms)
{
    struct pollfd pfd[64];
    tessera_client *on[64];
    uint64_t deadline = 0, now;
    size_t k, waiting;
    int progress, left, rc;

    if (timeout_ms > 0)
        deadline = ts_now_mono_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        waiting = 0;
        for (size_t i = 0; i < n; i++) {
            if (cond_any_user(v[i], NULL))
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
                    set_err(v[i], "no reply within %d ms", timeout_ms);
                    fail_conn(v[i], TS_ETIMEDOUT);
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
                fail_conn(c, rc);
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
        do {
            rc = poll(pfd, (nfds_t)k, left);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            rc = ts_from_errno(errno);
            for (size_t i = 0; i < k; i++)
                fail_conn(on[i], rc);
        }
        for (size_t i = 0; i < k; i++)
            if (pfd[i].revents)
                on[i]->rx_more = 1;
        rc = 0;
    }
}

/*
 * Queues r with its data tail (borrowed until r is done) once fewer than max_inflight
 * requests are in flight. On failure r is still the caller's to free.
 */
static int req_send(struct tessera_client *c, struct ts_req *r, const void *data, size_t len)
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
        set_err(c, "a %s request of %llu bytes exceeds the limit of %u", d->name,
                (unsigned long long)payload, TS_MIN(d->max_payload, c->max_frame));
        return TS_ETOOBIG;
    }
    live = ts_grow(c->live, c->nlive, &c->caplive, sizeof(*live), 64);
    if (!live)
        return TS_ENOMEM;
    c->live = live;
    rc = pump(c, cond_room, NULL);
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
static int call(struct tessera_client *c, struct ts_req *r, struct ts_rd *body)
{
    int rc;

    rc = req_send(c, r, NULL, 0);
    if (rc)
        goto out_free;
    rc = pump(c, cond_done, r);
    if (rc)
        goto out_free;
    rc = r->rc;
    if (rc)
        goto out_free;
    ts_rd_init(body, r->reply, r->reply_len);
    rc = ts_reply_status(body, c->err, sizeof(c->err));
    if (rc == TS_EPROTO && !c->err[0])
        proto_err(c, "no status");
    note_stale(c, body, rc);
    if (rc)
        goto out_free;
    return 0;

out_free:
    req_free(c, r);
    return rc;
}

/* A round trip whose reply carries nothing after the status; r is freed either way. */
static int call_status(struct tessera_client *c, struct ts_req *r)
{
    struct ts_rd body;
    int rc;

    rc = call(c, r, &body);
    if (rc)
        return rc;
    req_free(c, r);
    return 0;
}

/* A request with just a dataset name as its body; the reply body is in *body. */
static int call_name(struct tessera_client *c, uint8_t op, const char *name, struct ts_req **out,
                     struct ts_rd *body)
{
    struct ts_req *r;
    int rc;

    *out = NULL;
    rc = name_check(c, name);
    if (rc)
        return rc;
    r = req_name(c, op, name);
    if (!r)
        return TS_ENOMEM;
    rc = call(c, r, body);
    if (rc)
        return rc;
    *out = r;
    return 0;
}

/* ---- open / close ---------------------------------------------------------------------------- */

void tessera_opts_init(struct tessera_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->address = TS_DEFAULT_ADDRESS;
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->max_inflight = DEFAULT_MAX_INFLIGHT;
}

static int hello(struct tessera_client *c, const char *client_name)
{
    struct ts_hello_reply h;
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    r = req_new(c, TS_OP_HELLO);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u16(&r->w, TS_PROTO_VERSION);
    ts_wr_str(&r->w, client_name && client_name[0] ? client_name : "libtessera");
    rc = call(c, r, &body);
    if (rc)
        return rc;
    rc = ts_hello_decode(&body, &h);
    req_free(c, r);
    if (rc)
        return proto_err(c, "HELLO");
    if (h.version != TS_PROTO_VERSION) {
        set_err(c, "the server speaks protocol version %u, this library %u", h.version,
                TS_PROTO_VERSION);
        return TS_ENOTSUP;
    }
    snprintf(c->node, sizeof(c->node), "%s", h.node);
    c->role = h.role;
    c->max_frame = h.max_frame ? h.max_frame : TS_MAX_CHUNK + 4096;
    if (h.epoch > c->epoch)
        c->epoch = h.epoch;
    TS_DEBUG(FAC, "connected to node %s as %s (max frame %u, epoch %llu)", c->node,
             ts_role_name(c->role), c->max_frame, (unsigned long long)c->epoch);
    return 0;
}

/* Keeps a copy of the options (and their strings) in a top-level handle. */
static int opts_keep(struct tessera_client *c, const struct tessera_opts *o)
{
    const char *src[] = {o->address, o->tls_ca,          o->tls_cert,
                         o->tls_key, o->tls_server_name, o->client_name};
    const char **dst[] = {&c->opts.address, &c->opts.tls_ca,          &c->opts.tls_cert,
                          &c->opts.tls_key, &c->opts.tls_server_name, &c->opts.client_name};
    size_t len = 0, off = 0;

    c->opts = *o;
    for (size_t i = 0; i < TS_ARRAY_SIZE(src); i++)
        len += src[i] ? strlen(src[i]) + 1 : 0;
    c->optbuf = malloc(len ? len : 1);
    if (!c->optbuf)
        return TS_ENOMEM;
    for (size_t i = 0; i < TS_ARRAY_SIZE(src); i++) {
        if (!src[i])
            continue;
        memcpy(c->optbuf + off, src[i], strlen(src[i]) + 1);
        *dst[i] = c->optbuf + off;
        off += strlen(src[i]) + 1;
    }
    return 0;
}

/*
 * Asks the node for its cluster map. None (epoch 0, or a server without MAP_GET, or a role
 * that may not ask): a single node, *map NULL.
 */
static int seed_map(struct tessera_client *c, struct ts_map **map)
{
    uint64_t epoch;
    int rc;

    *map = NULL;
    rc = ts_conn_map_get(c, map, &epoch);
    if (rc == TS_ENOTSUP || rc == TS_EPERM) {
        TS_DEBUG(FAC, "node %s gives no cluster map (%s): single-node mode", c->node,
                 ts_errname(rc));
        c->err[0] = '\0';
        return 0;
    }
    return rc;
}

/* A router handle over the seed's cluster: it takes seed and map. */
static int make_router(struct tessera_client **out, struct tessera_client *seed, struct ts_map *map)
{
    struct tessera_client *r;
    int rc;

    *out = NULL;
    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = TS_ENOMEM;
        goto out_free_seed;
    }
    r->role = seed->role;
    r->max_frame = seed->max_frame;
    r->timeout_ms = seed->timeout_ms;
    r->max_inflight = seed->max_inflight;
    r->epoch = map->epoch;
    snprintf(r->node, sizeof(r->node), "%s", seed->node);
    r->opts = seed->opts; /* the strings stay in seed->optbuf: move them */
    r->optbuf = seed->optbuf;
    seed->optbuf = NULL;
    rx_reset(r);
    rc = ts_cl_create(&r->cl, r, seed, map, &r->opts);
    if (rc) {
        tessera_client_close(r);
        return rc;
    }
    *out = r;
    return 0;

out_free_seed:
    ts_map_free(map);
    tessera_client_close(seed);
    return rc;
}

/* HELLO on a connected transport (taken on success and failure alike); then, for a
 * top-level handle (sub == 0), the cluster map decides between a single-node handle and a
 * router. */
static int open_on(tessera_client **out, const struct tessera_opts *o, struct ts_transport *t,
                   const uint64_t *epoch_ref, int sub, char *err, size_t errlen)
{
    /* Plain TCP to a TLS port: the server drops the connection or answers with a TLS alert. */
    int plain = t->ops == &ts_transport_tcp;
    struct tessera_client *c;
    struct ts_map *map = NULL;
    int rc;

    *out = NULL;
    c = calloc(1, sizeof(*c));
    if (!c) {
        t->ops->close(t);
        return TS_ENOMEM;
    }
    c->t = t;
    c->next_id = 1;
    c->timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms;
    c->max_inflight = o->max_inflight ? o->max_inflight : DEFAULT_MAX_INFLIGHT;
    c->max_frame = TS_SMALL_PAYLOAD;
    c->epoch_ref = epoch_ref;
    rx_reset(c);
    rc = hello(c, o->client_name);
    if (rc)
        goto out_close;
    if (sub) {
        *out = c;
        return 0;
    }
    rc = opts_keep(c, o);
    if (rc)
        goto out_close;
    rc = seed_map(c, &map);
    if (rc)
        goto out_close;
    if (!map) {
        *out = c;
        return 0;
    }
    TS_INFO(FAC, "node %s is in a cluster: map epoch %llu, %zu nodes, %u PGs", c->node,
            (unsigned long long)map->epoch, map->n, map->pg_count);
    rc = make_router(out, c, map);
    if (rc && err && errlen)
        snprintf(err, errlen, "cluster map of %s: %s", o->address ? o->address : "the seed",
                 ts_strerror(rc));
    return rc;

out_close:
    if (err && errlen && plain && c->frames == 0 && (rc == TS_ECONNRESET || rc == TS_EPROTO))
        snprintf(err, errlen, "HELLO: %s (is this a TLS port? use --tls-ca)",
                 rc == TS_EPROTO ? "the server's reply is not a tessera frame"
                                 : "the server closed the connection without a reply");
    else if (err && errlen)
        snprintf(err, errlen, "%s: %s", c->role || c->node[0] ? "MAP_GET" : "HELLO",
                 c->err[0] ? c->err : ts_strerror(rc));
    tessera_client_close(c);
    return rc;
}

int ts_client_open_transport(tessera_client **out, const struct tessera_opts *o,
                             struct ts_transport *t, char *err, size_t errlen)
{
    return open_on(out, o, t, NULL, 0, err, errlen);
}

/* Connects to o->address and opens a handle on it (sub: a sub-connection). */
static int open_addr(tessera_client **out, const struct tessera_opts *o, const uint64_t *epoch_ref,
                     int sub, char *err, size_t errlen)
{
    struct tessera_opts defaults;
    const struct ts_transport_ops *ops;
    struct ts_conn_params p;
    struct ts_transport *t;
    struct ts_addr a;
    char why[160];
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (!o) {
        tessera_opts_init(&defaults);
        o = &defaults;
    }
    if (ts_addr_parse_why(o->address, &a, why, sizeof(why)) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "bad address '%s': %s", o->address, why);
        TS_WARN(FAC, TS_EINVAL, "bad address '%s': %s", o->address, why);
        return TS_EINVAL;
    }
    /* TLS is chosen by tls_ca alone: a certificate without it must not mean plain TCP. */
    if ((o->tls_cert || o->tls_key) && !o->tls_ca) {
        if (err && errlen)
            snprintf(err, errlen, "%s", TS_CERT_NEEDS_CA);
        TS_WARN(FAC, TS_EINVAL, "%s", TS_CERT_NEEDS_CA);
        return TS_EINVAL;
    }
    ops = a.ops ? a.ops : o->tls_ca ? &ts_transport_tls : &ts_transport_tcp;
    p = (struct ts_conn_params){
        .host = a.host,
        .port = a.port,
        .tls_ca = o->tls_ca,
        .tls_cert = o->tls_cert,
        .tls_key = o->tls_key,
        .tls_server_name = o->tls_server_name,
        .timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms,
        .err = err,
        .errlen = errlen,
    };
    rc = ops->connect(&t, &p);
    if (rc) {
        TS_WARN(FAC, rc, "cannot connect to %s:%s over %s%s%s", a.host, a.port, ops->name,
                err && err[0] ? ": " : "", err && err[0] ? err : "");
        return rc;
    }
    return open_on(out, o, t, epoch_ref, sub, err, errlen);
}

int ts_client_open_ex(tessera_client **out, const struct tessera_opts *o, char *err, size_t errlen)
{
    return open_addr(out, o, NULL, 0, err, errlen);
}

int ts_conn_open(tessera_client **out, const struct tessera_opts *o, const uint64_t *epoch_ref,
                 char *err, size_t errlen)
{
    return open_addr(out, o, epoch_ref, 1, err, errlen);
}

int tessera_client_open(tessera_client **out, const struct tessera_opts *o)
{
    return ts_client_open_ex(out, o, NULL, 0);
}

void tessera_client_close(tessera_client *c)
{
    struct ts_req *r;

    if (!c)
        return;
    ts_cl_free(c->cl);
    if (c->t)
        c->t->ops->close(c->t);
    for (size_t i = 0; i < c->nlive; i++)
        req_destroy(c->live[i]);
    while ((r = c->free_reqs)) {
        c->free_reqs = r->next_tx;
        req_destroy(r);
    }
    free(c->live);
    free(c->rx.body);
    free(c->rx.table);
    free(c->scratch);
    ts_map_free(c->stale_map);
    free(c->optbuf);
    free(c);
}

/* ---- sub-connections ------------------------------------------------------------------------ */

void ts_conn_attach(tessera_client *c, const uint64_t *epoch_ref)
{
    c->epoch_ref = epoch_ref;
}

int ts_conn_broken(const tessera_client *c)
{
    return c->broken;
}

uint64_t ts_conn_seen_epoch(const tessera_client *c)
{
    return c->seen_epoch;
}

struct ts_map *ts_conn_take_stale_map(tessera_client *c)
{
    struct ts_map *m = c->stale_map;

    c->stale_map = NULL;
    return m;
}

struct ts_cluster *ts_client_cluster(const tessera_client *c)
{
    return c ? c->cl : NULL;
}

const struct tessera_opts *ts_client_opts(const tessera_client *c)
{
    return &c->opts;
}

int ts_client_timeout(const tessera_client *c)
{
    return c->timeout_ms;
}

void ts_client_set_error(tessera_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

int ts_conn_map_get(tessera_client *c, struct ts_map **out, uint64_t *epoch)
{
    struct ts_req *r;
    struct ts_rd body, peek;
    uint32_t n;
    int rc;

    *out = NULL;
    *epoch = 0;
    rc = enter_conn(c);
    if (rc)
        return rc;
    r = req_new(c, TS_OP_MAP_GET);
    if (!r)
        return TS_ENOMEM;
    rc = call(c, r, &body);
    if (rc)
        return rc;
    peek = body;
    *epoch = ts_rd_u64(&peek);
    (void)ts_rd_u32(&peek);
    n = ts_rd_u32(&peek);
    if (peek.err)
        rc = proto_err(c, "MAP_GET");
    else if (n > 0 && (ts_map_decode(&body, out) != 0 || ts_rd_done(&body) != 0))
        rc = proto_err(c, "MAP_GET map");
    if (rc) {
        ts_map_free(*out);
        *out = NULL;
        *epoch = 0;
    }
    req_free(c, r);
    return rc;
}

int ts_conn_map_push(tessera_client *c, const struct ts_map *m, uint64_t *epoch)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    *epoch = 0;
    rc = enter_conn(c);
    if (rc)
        return rc;
    r = req_new(c, TS_OP_MAP_PUSH);
    if (!r)
        return TS_ENOMEM;
    ts_map_encode(&r->w, m);
    rc = call(c, r, &body);
    if (rc)
        return rc;
    *epoch = ts_rd_u64(&body);
    if (body.err)
        rc = proto_err(c, "MAP_PUSH");
    req_free(c, r);
    return rc;
}

void ts_client_set_timeout(tessera_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : timeout_ms;
    if (c->cl)
        ts_cl_set_timeout(c->cl, c->timeout_ms);
}

uint64_t tessera_client_epoch(const tessera_client *c)
{
    return c && c->cl ? ts_cl_epoch(c->cl) : 0;
}

int tessera_client_role(const tessera_client *c)
{
    return c ? c->role : 0;
}

const char *tessera_client_error(const tessera_client *c)
{
    return c ? c->err : "";
}

const char *tessera_client_node(const tessera_client *c)
{
    return c ? c->node : "";
}

/* ---- datasets ------------------------------------------------------------------------------- */

int tessera_dataset_create(tessera_client *c, const char *name, const struct ts_dataset_policy *p)
{
    static const struct ts_dataset_policy def = {1, 0, 1, 0};
    int rc;

    rc = enter_name(c, name);
    if (rc)
        return rc;
    if (!p)
        p = &def;
    if (c->cl)
        return ts_cl_dataset_create(c, c->cl, name, p);
    return ts_client_dataset_create_inc(c, name, p, 0);
}

int ts_client_dataset_create_inc(tessera_client *c, const char *name,
                                 const struct ts_dataset_policy *p, uint64_t incarnation)
{
    struct ts_req *r = req_name(c, TS_OP_DATASET_CREATE, name);

    if (!r)
        return TS_ENOMEM;
    ts_wr_u8(&r->w, p->core);
    ts_wr_u8(&r->w, p->fringe);
    ts_wr_u8(&r->w, p->min_core);
    ts_wr_u32(&r->w, p->chunk_size);
    if (incarnation)
        ts_wr_u64(&r->w, incarnation);
    return call_status(c, r);
}

/* A list request, and the entries of its reply: how one is decoded, and what a malformed list
 * is called. */
struct list_kind {
    uint8_t op;
    size_t size; /* of a decoded entry */
    size_t min;  /* bytes of an entry on the wire, at least (bounds the count) */
    int (*decode)(struct ts_rd *r, void *entry);
    const char *bad_count, *bad_entry;
};

static int dataset_entry(struct ts_rd *r, void *entry)
{
    return ts_rd_dataset_info(r, entry);
}

static int shard_entry(struct ts_rd *r, void *entry)
{
    return ts_rd_shard_info(r, entry);
}

static const struct list_kind dataset_list = {TS_OP_DATASET_LIST,   sizeof(struct ts_dataset_info),
                                              TS_DATASET_INFO_MIN,  dataset_entry,
                                              "DATASET_LIST count", "DATASET_LIST entry"};
static const struct list_kind shard_list = {TS_OP_SHARD_LIST,   sizeof(struct ts_shard_info),
                                            TS_SHARD_INFO_LEN,  shard_entry,
                                            "SHARD_LIST count", "SHARD_LIST entry"};

/*
 * A list request (with name: its body is the dataset name) and its reply (a u32 count, then
 * the entries) decoded into *out, a calloc'ed array of *n entries (NULL when there are none).
 */
static int list_call(tessera_client *c, const struct list_kind *kind, const char *name, void **out,
                     size_t *n)
{
    struct ts_rd body;
    struct ts_req *r;
    uint8_t *v = NULL;
    uint32_t k;
    int rc;

    if (name) {
        rc = call_name(c, kind->op, name, &r, &body);
    } else {
        r = req_new(c, kind->op);
        if (!r)
            return TS_ENOMEM;
        rc = call(c, r, &body);
    }
    if (rc)
        return rc;
    k = ts_rd_u32(&body);
    if (body.err || k > (body.len - body.off) / kind->min) {
        rc = proto_err(c, kind->bad_count);
        goto out_free;
    }
    if (k) {
        v = calloc(k, kind->size);
        if (!v) {
            rc = TS_ENOMEM;
            goto out_free;
        }
    }
    for (uint32_t i = 0; i < k; i++) {
        if (kind->decode(&body, v + i * kind->size)) {
            rc = proto_err(c, kind->bad_entry);
            goto out_free_list;
        }
    }
    req_free(c, r);
    *out = v;
    *n = k;
    return 0;

out_free_list:
    free(v);
out_free:
    req_free(c, r);
    return rc;
}

/* The start of a list call (the caller has emptied *out): a usable handle, outputs given. */
static int list_begin(tessera_client *c, int have_out, size_t *n)
{
    int rc;

    if (n)
        *n = 0;
    rc = enter(c);
    if (rc)
        return rc;
    return have_out && n ? 0 : TS_EINVAL;
}

int tessera_dataset_list(tessera_client *c, struct ts_dataset_info **out, size_t *n)
{
    void *v;
    int rc;

    if (out)
        *out = NULL;
    rc = list_begin(c, out != NULL, n);

    if (rc)
        return rc;
    if (c->cl)
        return ts_cl_dataset_list(c, c->cl, out, n);
    rc = list_call(c, &dataset_list, NULL, &v, n);
    if (!rc)
        *out = v;
    return rc;
}

int tessera_dataset_stat(tessera_client *c, const char *name, struct ts_dataset_info *out)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    rc = enter(c);
    if (rc)
        return rc;
    if (!out)
        return TS_EINVAL;
    if (c->cl)
        return name_check(c, name) ? TS_ENAME : ts_cl_dataset_stat(c, c->cl, name, out);
    rc = call_name(c, TS_OP_DATASET_STAT, name, &r, &body);
    if (rc)
        return rc;
    if (ts_rd_dataset_info(&body, out))
        rc = proto_err(c, "DATASET_STAT");
    req_free(c, r);
    return rc;
}

static int simple_name_op(tessera_client *c, uint8_t op, const char *name)
{
    struct ts_req *r;
    int rc;

    rc = enter_name(c, name);
    if (rc)
        return rc;
    r = req_name(c, op, name);
    if (!r)
        return TS_ENOMEM;
    return call_status(c, r);
}

int tessera_dataset_seal(tessera_client *c, const char *name)
{
    if (c && c->cl) {
        c->err[0] = '\0';
        return name_check(c, name) ? TS_ENAME : ts_cl_dataset_seal(c, c->cl, name);
    }
    return simple_name_op(c, TS_OP_DATASET_SEAL, name);
}

int tessera_dataset_delete(tessera_client *c, const char *name)
{
    if (c && c->cl) {
        c->err[0] = '\0';
        return name_check(c, name) ? TS_ENAME : ts_cl_dataset_delete(c, c->cl, name);
    }
    return simple_name_op(c, TS_OP_DATASET_DELETE, name);
}

int ts_conn_dataset_seal(tessera_client *c, const char *name, uint8_t flags)
{
    struct ts_req *r;
    int rc;

    rc = enter_name(c, name);
    if (rc)
        return rc;
    if (c->cl)
        return TS_EINVAL;
    r = req_name(c, TS_OP_DATASET_SEAL, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u8(&r->w, flags);
    return call_status(c, r);
}

/* ---- shards --------------------------------------------------------------------------------- */

int tessera_shard_stat(tessera_client *c, const char *name, uint32_t shard,
                       struct ts_shard_info *out)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    rc = enter(c);
    if (rc)
        return rc;
    if (!out)
        return TS_EINVAL;
    rc = name_check(c, name);
    if (rc)
        return rc;
    if (c->cl)
        return ts_cl_shard_stat(c, c->cl, name, shard, out);
    r = req_name(c, TS_OP_SHARD_STAT, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    rc = call(c, r, &body);
    if (rc)
        return rc;
    if (ts_rd_shard_info(&body, out))
        rc = proto_err(c, "SHARD_STAT");
    req_free(c, r);
    return rc;
}

int tessera_shard_list(tessera_client *c, const char *name, struct ts_shard_info **out, size_t *n)
{
    void *v;
    int rc;

    if (out)
        *out = NULL;
    rc = list_begin(c, out != NULL, n);

    if (rc)
        return rc;
    if (c->cl)
        return name_check(c, name) ? TS_ENAME : ts_cl_shard_list(c, c->cl, name, out, n);
    rc = list_call(c, &shard_list, name, &v, n);
    if (!rc)
        *out = v;
    return rc;
}

/* ---- reads ---------------------------------------------------------------------------------- */

static int read_args(tessera_client *c, const char *name, uint64_t off, size_t len, void *buf)
{
    int rc = name_check(c, name);

    if (rc)
        return rc;
    if ((!buf && len) || len > UINT64_MAX - off) {
        set_err(c, "bad read range or buffer");
        return TS_EINVAL;
    }
    return 0;
}

static int read_queue(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                      void *buf, int user, uint16_t hflags, struct ts_req **out)
{
    struct ts_req *r;
    int rc;

    *out = NULL;
    r = req_name(c, TS_OP_READ, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    ts_wr_u64(&r->w, off);
    ts_wr_u32(&r->w, (uint32_t)len);
    r->user = (uint8_t)user;
    r->hflags = hflags;
    r->dst = buf;
    r->cap = len;
    r->rd_off = off;
    rc = req_send(c, r, NULL, 0);
    if (rc) {
        req_free(c, r);
        return rc;
    }
    *out = r;
    return 0;
}

/* A finished READ: its status, with the server's message (if any) as the handle's error. */
static int read_result(tessera_client *c, struct ts_req *r, size_t *out_len)
{
    if (out_len)
        *out_len = r->rc ? 0 : r->got;
    if (r->rc && r->msg)
        snprintf(c->err, sizeof(c->err), "%s", r->msg);
    return r->rc;
}

/* A read of one node: a window of READ requests in flight over the range. */
static int read_window(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                       size_t len, void *buf, size_t *out_len, uint16_t hflags)
{
    struct ts_req *win[READ_WINDOW];
    uint8_t *dst = buf;
    size_t npieces, next = 0, done = 0, total = 0, got = 0;
    uint64_t size = UINT64_MAX;
    int rc, first = 0, ended = 0;

    npieces = len ? (len - 1) / TESSERA_MAX_READ + 1 : 1;
    while (done < npieces) {
        /* Keep a window of requests in flight; none past a known end of the shard. */
        while (!first && !ended && next < npieces && next - done < READ_WINDOW) {
            uint64_t poff = off + (uint64_t)next * TESSERA_MAX_READ;
            size_t plen = TS_MIN(len - next * (size_t)TESSERA_MAX_READ, (size_t)TESSERA_MAX_READ);
            if (next > 0 && poff >= size)
                break;
            rc = read_queue(c, name, shard, poff, plen, dst + next * (size_t)TESSERA_MAX_READ, 0,
                            hflags, &win[next % READ_WINDOW]);
            if (rc) {
                first = rc;
                break;
            }
            next++;
        }
        if (done == next)
            break;
        struct ts_req *r = win[done % READ_WINDOW];
        rc = pump(c, cond_done, r);
        if (!first && !ended) {
            rc = rc ? rc : read_result(c, r, &got);
            if (rc == TS_ERANGE && done > 0 && r->rd_off >= size) {
                ended = 1; /* the shard ended exactly where this piece begins */
                c->err[0] = '\0';
            } else if (rc) {
                first = rc;
            } else {
                size = r->shard_size;
                total += got;
                ended = got < r->cap; /* the shard ends inside this piece */
            }
        }
        req_free(c, r);
        done++;
        if (done == next && (first || ended))
            break;
    }
    if (first)
        return first;
    if (out_len)
        *out_len = total;
    return 0;
}

int tessera_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                 void *buf, size_t *out_len)
{
    int rc;

    if (out_len)
        *out_len = 0;
    rc = enter(c);
    if (rc)
        return rc;
    rc = read_args(c, name, off, len, buf);
    if (rc)
        return rc;
    if (c->cl)
        return ts_cl_read(c, c->cl, name, shard, off, len, buf, out_len);
    rc = read_window(c, name, shard, off, len, buf, out_len, 0);
    if (rc == TS_ECORRUPT && !c->broken) {
        /* Bytes that failed their CRC (or a node that found its copy bad): once more, read
         * from the store; the node drops the cached copies of the range first. */
        TS_WARN(FAC, rc, "%s/%u: %s; reading it again from the node's store", name, shard,
                c->err[0] ? c->err : ts_strerror(rc));
        c->err[0] = '\0';
        rc = read_window(c, name, shard, off, len, buf, out_len, TS_F_VERIFY);
    }
    return rc;
}

int tessera_read_submit(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *buf, uint64_t *op)
{
    struct ts_req *r;
    int rc, progress = 0;

    if (op)
        *op = 0;
    rc = enter(c);
    if (rc)
        return rc;
    if (!op)
        return TS_EINVAL;
    rc = read_args(c, name, off, len, buf);
    if (rc)
        return rc;
    if (len > TESSERA_MAX_READ) {
        set_err(c, "a submitted read is at most %u bytes", TESSERA_MAX_READ);
        return TS_EINVAL;
    }
    if (c->cl)
        return ts_cl_read_submit(c, c->cl, name, shard, off, len, buf, op);
    rc = read_queue(c, name, shard, off, len, buf, 1, 0, &r);
    if (rc)
        return rc;
    *op = r->id;
    /* Get the request on its way now; its outcome is reported by tessera_wait*. */
    rc = tx_step(c, &progress);
    if (rc < 0)
        fail_conn(c, rc);
    return 0;
}

/*
 * A submitted READ that failed its CRC (or whose node found its copy bad), read once more from
 * the node's store (flag VERIFY), into the same buffer, as tessera_read does. Its name and shard
 * come back from the request's own frame.
 */
static int submitted_result(tessera_client *c, struct ts_req *r, size_t *out_len)
{
    int rc = read_result(c, r, out_len);
    char name[TS_NAME_MAX + 1];
    struct ts_rd rd;
    uint32_t shard;

    if (rc != TS_ECORRUPT || c->broken || (r->hflags & TS_F_VERIFY))
        return rc;
    ts_rd_init(&rd, r->w.buf + TS_HDR_LEN, r->w.len - TS_HDR_LEN);
    ts_rd_str(&rd, name, sizeof(name));
    shard = ts_rd_u32(&rd);
    if (rd.err)
        return rc;
    TS_WARN(FAC, rc, "%s/%u: %s; reading it again from the node's store", name, shard,
            c->err[0] ? c->err : ts_strerror(rc));
    c->err[0] = '\0';
    return read_window(c, name, shard, r->rd_off, r->cap, r->dst, out_len, TS_F_VERIFY);
}

int tessera_wait(tessera_client *c, uint64_t op, size_t *out_len)
{
    struct ts_req *r;
    size_t i;
    int rc;

    if (out_len)
        *out_len = 0;
    if (!c)
        return TS_EINVAL;
    c->err[0] = '\0';
    if (c->cl)
        return ts_cl_wait(c, c->cl, op, out_len);
    i = live_find(c, op);
    if (i == SIZE_MAX || !c->live[i]->user)
        return TS_ENOENT;
    r = c->live[i];
    (void)pump(c, cond_done, r); /* a failed connection completes r with its code */
    rc = submitted_result(c, r, out_len);
    req_free(c, r);
    return rc;
}

int tessera_wait_any(tessera_client *c, uint64_t *op, size_t *out_len)
{
    struct ts_req *r = NULL;
    int rc, any = 0;

    if (op)
        *op = 0;
    if (out_len)
        *out_len = 0;
    if (!c)
        return TS_EINVAL;
    c->err[0] = '\0';
    if (c->cl)
        return ts_cl_wait_any(c, c->cl, op, out_len);
    for (size_t i = 0; i < c->nlive && !any; i++)
        any = c->live[i]->user;
    if (!any)
        return TS_ENOENT;
    (void)pump(c, cond_any_user, NULL);
    for (size_t i = 0; i < c->nlive; i++) {
        struct ts_req *q = c->live[i];
        if (q->user && q->done && (!r || q->seq < r->seq))
            r = q;
    }
    if (!r)
        return c->broken ? c->broken : TS_EINTERNAL;
    if (op)
        *op = r->id;
    rc = submitted_result(c, r, out_len);
    req_free(c, r);
    return rc;
}

/* ---- uploads -------------------------------------------------------------------------------- */

struct put {
    const char *name;
    uint32_t shard;
    uint32_t chunk;    /* the dataset's chunk size */
    uint64_t declared; /* shard size, or TS_SIZE_UNKNOWN */
    uint32_t index;    /* next chunk index */
    uint64_t bytes;    /* bytes queued so far */
    uint32_t crc;      /* of all of them */
    struct ts_req **win;
    uint32_t nwin;  /* ring size */
    uint32_t head;  /* oldest request in flight */
    uint32_t count; /* requests in flight */
    int rc;         /* first failure */
};

static int put_begin(tessera_client *c, struct put *p, const char *name, uint32_t shard,
                     uint64_t declared)
{
    struct ts_dataset_info d;
    int rc;

    memset(p, 0, sizeof(*p));
    p->name = name;
    p->shard = shard;
    p->declared = declared;
    rc = tessera_dataset_stat(c, name, &d);
    if (rc)
        return rc;
    p->chunk = d.policy.chunk_size ? d.policy.chunk_size : TS_DEFAULT_CHUNK_SIZE;
    if (declared != TS_SIZE_UNKNOWN && declared && (declared - 1) / p->chunk >= (1u << 30)) {
        /* Refused before a byte is sent: the server stores at most 2^30 chunks a shard. */
        set_err(c, "%s/%u: %llu bytes make more than 2^30 chunks of %u bytes", name, shard,
                (unsigned long long)declared, p->chunk);
        return TS_ETOOBIG;
    }
    p->nwin = TS_MAX(2u, PUT_WINDOW_BYTES / p->chunk);
    p->nwin = TS_MIN(p->nwin, c->max_inflight);
    p->win = calloc(p->nwin, sizeof(*p->win));
    return p->win ? 0 : TS_ENOMEM;
}

/* Collects the oldest chunk's acknowledgement. */
static void put_collect(tessera_client *c, struct put *p)
{
    struct ts_req *r = p->win[p->head];
    char scratch[sizeof(c->err)];
    uint32_t expect = p->index - p->count;
    struct ts_rd body;
    int rc;

    rc = pump(c, cond_done, r);
    rc = rc ? rc : r->rc;
    if (!rc) {
        ts_rd_init(&body, r->reply, r->reply_len);
        /* Keep the first refusal's message: later ones are usually its echo. */
        rc = ts_reply_status(&body, p->rc ? scratch : c->err, sizeof(scratch));
        note_stale(c, &body, rc);
        if (!rc) {
            uint32_t idx = ts_rd_u32(&body);
            (void)ts_rd_u64(&body);
            if (body.err || idx != expect)
                rc = p->rc ? TS_EPROTO : proto_err(c, "SHARD_WRITE acknowledges another chunk");
        }
    }
    if (rc && !p->rc) {
        p->rc = rc;
        TS_WARN(FAC, rc, "upload of %s/%u: chunk %u failed", p->name, p->shard, expect);
    }
    req_free(c, r);
    p->win[p->head] = NULL;
    p->head = (p->head + 1) % p->nwin;
    p->count--;
}

/* Waits until the window has room for another chunk; the first failure so far. */
static int put_room(tessera_client *c, struct put *p)
{
    while (p->count == p->nwin)
        put_collect(c, p);
    return p->rc;
}

/* Queues one chunk (data borrowed until it is acknowledged). */
static int put_chunk(tessera_client *c, struct put *p, const void *data, uint32_t len)
{
    uint32_t crc = ts_crc32c(0, data, len);
    struct ts_req *r;
    int rc;

    r = req_name(c, TS_OP_SHARD_WRITE, p->name);
    if (!r)
        return p->rc = TS_ENOMEM;
    ts_wr_u32(&r->w, p->shard);
    ts_wr_u32(&r->w, p->index);
    ts_wr_u64(&r->w, p->declared);
    ts_wr_u32(&r->w, crc);
    ts_wr_u32(&r->w, len);
    rc = req_send(c, r, data, len);
    if (rc) {
        req_free(c, r);
        return p->rc = rc;
    }
    p->win[(p->head + p->count) % p->nwin] = r;
    p->count++;
    p->index++;
    p->bytes += len;
    p->crc = ts_crc32c(p->crc, data, len);
    return 0;
}

/* SHARD_SEAL with the shard's CRC32C and record index; *info from the reply. */
static int seal_call(tessera_client *c, const char *name, uint32_t shard, uint32_t crc,
                     const uint64_t *records, uint32_t nrecords, struct ts_shard_info *info)
{
    struct ts_req *r = req_name(c, TS_OP_SHARD_SEAL, name);
    struct ts_rd body;
    int rc;

    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    ts_wr_u8(&r->w, 1);
    ts_wr_u32(&r->w, crc);
    ts_wr_u32(&r->w, nrecords);
    for (uint32_t i = 0; i < nrecords; i++)
        ts_wr_u64(&r->w, records[i]);
    rc = call(c, r, &body);
    if (rc)
        return rc;
    if (ts_rd_shard_info(&body, info))
        rc = proto_err(c, "SHARD_SEAL");
    req_free(c, r);
    return rc;
}

/* Collects every outstanding acknowledgement, then seals; frees the window. */
static int put_end(tessera_client *c, struct put *p, const uint64_t *records, uint32_t nrecords)
{
    struct ts_shard_info info;
    int rc;

    while (p->count)
        put_collect(c, p);
    free(p->win);
    p->win = NULL;
    if (p->rc)
        return p->rc;
    rc = seal_call(c, p->name, p->shard, p->crc, records, nrecords, &info);
    if (!rc)
        TS_DEBUG(FAC, "sealed %s/%u: %llu bytes, %u chunks, crc %08x", p->name, p->shard,
                 (unsigned long long)info.size, info.nchunks, info.crc);
    return rc;
}

/*
 * The shard exists already (TS_EEXIST at chunk 0): a retry of a put whose answer was lost, or
 * another shard. The same bytes: SHARD_SEAL with their CRC, answered once the shard is as
 * durable as a fresh seal; other bytes: TS_EEXIST saying so.
 */
static int put_exists(tessera_client *c, const char *name, uint32_t shard, const void *buf,
                      size_t len, const uint64_t *records, uint32_t nrecords)
{
    struct ts_shard_info si;
    uint32_t crc = ts_crc32c(0, buf, len);
    int rc;

    rc = tessera_shard_stat(c, name, shard, &si);
    if (rc)
        return rc == TS_ENOENT ? TS_EEXIST : rc;
    if (si.state != TS_SHARD_COMPLETE || si.size != len || si.crc != crc) {
        set_err(c,
                "%s/%u already exists with other contents (%llu bytes, CRC32C %08x; this put: "
                "%zu bytes, %08x)",
                name, shard, (unsigned long long)si.size, si.crc, len, crc);
        return TS_EEXIST;
    }
    rc = seal_call(c, name, shard, crc, records, nrecords, &si);
    if (!rc)
        TS_INFO(FAC, "%s/%u was sealed already with these bytes: put confirmed", name, shard);
    return rc;
}

int tessera_put(tessera_client *c, const char *name, uint32_t shard, const void *buf, size_t len,
                const uint64_t *records, uint32_t nrecords)
{
    const uint8_t *src = buf;
    struct put p;
    size_t off = 0;
    int rc;

    rc = enter_name(c, name);
    if (rc)
        return rc;
    if ((!buf && len) || (!records && nrecords))
        return TS_EINVAL;
    if (c->cl)
        return ts_cl_put(c, c->cl, name, shard, buf, len, records, nrecords, -1, 0);
    rc = put_begin(c, &p, name, shard, len);
    if (rc)
        goto out_end;
    do { /* an empty shard is one empty chunk */
        uint32_t n = (uint32_t)TS_MIN((size_t)p.chunk, len - off);
        if (put_room(c, &p) || put_chunk(c, &p, src + off, n))
            break;
        off += n;
    } while (off < len);
out_end:
    if (!p.win)
        return rc ? rc : p.rc;
    rc = put_end(c, &p, records, nrecords);
    if (rc == TS_EEXIST)
        rc = put_exists(c, name, shard, buf, len, records, nrecords);
    return rc;
}

/* Fills buf with up to len bytes from fd (a file or a pipe); the count, or TS_E*. */
static long read_full(int fd, uint8_t *buf, size_t len)
{
    size_t got = 0;
    ssize_t n;

    while (got < len) {
        n = read(fd, buf + got, len - got);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                (void)poll(&pfd, 1, -1);
                continue;
            }
            return ts_from_errno(errno);
        }
        got += (size_t)n;
    }
    return (long)got;
}

int tessera_put_fd(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size)
{
    uint8_t **bufs = NULL;
    struct put p;
    uint32_t slot;
    long n;
    int rc;

    rc = enter_name(c, name);
    if (rc)
        return rc;
    if (fd < 0)
        return TS_EINVAL;
    if (c->cl)
        return ts_cl_put(c, c->cl, name, shard, NULL, 0, NULL, 0, fd, size);
    rc = put_begin(c, &p, name, shard, size);
    if (rc)
        goto out_free;
    /* One buffer per window slot: a buffer is reused once its chunk is acknowledged. */
    bufs = calloc(p.nwin, sizeof(*bufs));
    if (!bufs) {
        p.rc = TS_ENOMEM;
        goto out_end;
    }
    for (;;) {
        uint64_t left = size == TS_SIZE_UNKNOWN ? p.chunk : size - p.bytes;
        size_t want = (size_t)TS_MIN((uint64_t)p.chunk, left);
        if (put_room(c, &p))
            break;
        slot = (p.head + p.count) % p.nwin;
        if (!bufs[slot] && !(bufs[slot] = malloc(p.chunk))) {
            p.rc = TS_ENOMEM;
            break;
        }
        n = read_full(fd, bufs[slot], want);
        if (n < 0) {
            set_err(c, "cannot read the input: %s", ts_strerror((int)n));
            p.rc = (int)n;
            break;
        }
        if (size != TS_SIZE_UNKNOWN && (size_t)n < want) {
            set_err(c, "the input ended after %llu of %llu bytes",
                    (unsigned long long)(p.bytes + (uint64_t)n), (unsigned long long)size);
            p.rc = TS_EIO;
            break;
        }
        if (n == 0 && p.index > 0)
            break;
        if (p.index == UINT32_MAX) {
            set_err(c, "a shard has at most 2^32 chunks");
            p.rc = TS_ETOOBIG;
            break;
        }
        if (put_chunk(c, &p, bufs[slot], (uint32_t)n))
            break;
        if ((size_t)n < want || (size != TS_SIZE_UNKNOWN && p.bytes == size))
            break;
    }
out_end:
    rc = put_end(c, &p, NULL, 0);
out_free:
    if (bufs)
        for (uint32_t i = 0; i < p.nwin; i++)
            free(bufs[i]);
    free(bufs);
    return rc;
}

/* ---- maintenance ------------------------------------------------------------------------------
 */

int tessera_scrub(tessera_client *c, const char *name, struct ts_scrub_report *rep,
                  void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk,
                             int rc),
                  void *arg)
{
    struct ts_scrub_report tmp;
    char ds[TS_NAME_MAX + 1];
    struct ts_req *r;
    struct ts_rd body;
    uint32_t n;
    int rc;

    rc = enter(c);
    if (rc)
        return rc;
    if (name) {
        rc = name_check(c, name);
        if (rc)
            return rc;
    }
    if (!rep)
        rep = &tmp;
    memset(rep, 0, sizeof(*rep));
    if (c->cl)
        return ts_cl_scrub(c, c->cl, name, rep, cb, arg);
    r = req_new(c, TS_OP_SCRUB);
    if (!r)
        return TS_ENOMEM;
    ts_wr_str(&r->w, name ? name : "");
    rc = call(c, r, &body);
    if (rc)
        return rc;
    rep->shards = ts_rd_u64(&body);
    rep->chunks = ts_rd_u64(&body);
    rep->bytes = ts_rd_u64(&body);
    rep->corrupt = ts_rd_u64(&body);
    n = ts_rd_u32(&body);
    for (uint32_t i = 0; i < n && !body.err; i++) {
        uint32_t shard, chunk;
        int code;
        ts_rd_str(&body, ds, sizeof(ds));
        shard = ts_rd_u32(&body);
        chunk = ts_rd_u32(&body);
        code = (int32_t)ts_rd_u32(&body);
        if (!body.err && cb)
            cb(arg, ds, shard, chunk, code);
    }
    if (!body.err && body.off < body.len) { /* a cluster node's comparison with primaries */
        rep->pgs_compared = ts_rd_u32(&body);
        rep->pgs_differing = ts_rd_u32(&body);
        rep->missing = ts_rd_u64(&body);
        rep->pgs_unchecked = ts_rd_u32(&body);
    }
    if (body.err)
        rc = proto_err(c, "SCRUB");
    req_free(c, r);
    return rc;
}

int tessera_status(tessera_client *c, char **json)
{
    struct ts_req *r;
    struct ts_rd body;
    const uint8_t *p;
    uint16_t n;
    int rc;

    if (json)
        *json = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (!json)
        return TS_EINVAL;
    if (c->cl)
        return ts_cl_status(c, c->cl, json);
    r = req_new(c, TS_OP_STATUS);
    if (!r)
        return TS_ENOMEM;
    rc = call(c, r, &body);
    if (rc)
        return rc;
    n = ts_rd_u16(&body);
    p = ts_rd_bytes(&body, n);
    if (!p) {
        rc = proto_err(c, "STATUS");
        goto out_free;
    }
    *json = malloc((size_t)n + 1);
    if (!*json) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    memcpy(*json, p, n);
    (*json)[n] = '\0';
out_free:
    req_free(c, r);
    return rc;
}
