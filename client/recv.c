/*
 * libtessera, the connection layer: the receive side of a connection. Frames are received
 * into a stage (several small replies per receive), matched to their requests by id, and run
 * through a state machine (header, small body, READ head, READ piece table and data, drain);
 * the data of a large READ lands straight in the caller's buffer, and each piece's CRC32C is
 * verified as soon as its bytes are in.
 */
#include "conn.h"

#include <stdlib.h>

#define FAC "client"
#define MAX_SMALL_REPLY (256u << 20) /* lists and documents */
#define MAX_ERROR_REPLY (64u << 10)  /* a status and a message */
#define MAX_REFUSAL (2u << 20)       /* a refused READ: a message and maybe a map (TS_ESTALE) */
#define MAX_READ_REPLY (TS_MAX_READ + (1u << 20))
#define RX_BUDGET (16u << 20) /* bytes received before the pump looks around */
#define RX_TABLE_KEEP 4096    /* piece table bytes kept for the next reply (512 pieces) */
#define RX_IOV 64             /* buffers one receive fills: a READV's small ranges, many at once */

/* Ready for the next frame; what stage holds of it (and the stage and table buffers) is
 * kept. */
void ts_rx_reset(struct tessera_client *c)
{
    struct rx *x = &c->rx;
    uint8_t *table = x->table, *stage = x->stage;
    size_t table_cap = x->table_cap, soff = x->soff, slen = x->slen;

    free(x->body);
    if (table_cap > RX_TABLE_KEEP) {
        free(table);
        table = NULL;
        table_cap = 0;
    }
    memset(x, 0, sizeof(*x));
    x->stage = stage;
    x->soff = soff;
    x->slen = slen;
    x->table = table;
    x->table_cap = table_cap;
    x->state = RX_HDR;
}

/* ---- receiving ------------------------------------------------------------------------------- */

int ts_rx_table(struct rx *x, size_t len)
{
    if (len > x->table_cap) {
        uint8_t *t = realloc(x->table, len);
        if (!t)
            return TS_ENOMEM;
        x->table = t;
        x->table_cap = len;
    }
    x->tlen = len;
    x->thave = 0;
    return 0;
}

/* The whole reply is in: the request is answered. */
void ts_rx_complete(struct tessera_client *c, int rc)
{
    struct ts_req *r = c->rx.req;

    if (r->op == TS_OP_READV && !c->rx.body) { /* the ranges' data went to their buffers */
        r->rc = rc;
        r->rv_done = rc == 0;
    } else if (r->op == TS_OP_READ) {
        /* The server wrote what it will write before its reply. */
        ts_req_unplace(c, r, rc == TS_ECORRUPT);
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
    ts_req_finish(c, r);
    ts_rx_reset(c);
    /* Nothing more is expected: the next receive waits until the transport is readable. */
    if (c->awaiting && --c->awaiting == 0)
        c->rx_more = 0;
}

void ts_rx_drain(struct tessera_client *c, size_t left, int rc)
{
    c->rx.drain_left = left;
    c->rx.drain_rc = rc;
    c->rx.have = 0;
    c->rx.state = RX_DRAIN;
    if (left == 0)
        ts_rx_complete(c, rc);
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
        ts_note_stale(c, &rd, rc);
        free(r->msg);
        r->msg = strdup(msg);
        ts_rx_complete(c, rc ? rc : TS_EPROTO);
        return 0;
    }
    ts_rx_complete(c, 0);
    return 0;
}

/* A frame header is in x->h. */
static int rx_header(struct tessera_client *c)
{
    struct rx *x = &c->rx;
    size_t i;

    if (!(x->h.flags & TS_F_REPLY))
        return ts_proto_err(c, "a request where a reply was expected");
    if (x->h.epoch > c->seen_epoch)
        c->seen_epoch = x->h.epoch;
    if (!c->epoch_ref && x->h.epoch > c->epoch)
        c->epoch = x->h.epoch;
    x->have = 0;
    if (x->h.req_id == 0) {
        if (x->h.length > MAX_ERROR_REPLY)
            return ts_proto_err(c, "oversized error reply");
        x->req = NULL;
        goto body;
    }
    i = ts_live_find(c, x->h.req_id);
    if (i == SIZE_MAX || c->live[i]->replied)
        return ts_proto_err(c, "reply to an unknown request id");
    x->req = c->live[i];
    if (x->req->op != x->h.opcode)
        return ts_proto_err(c, "reply opcode differs from the request's");
    if (x->req->op == TS_OP_READ) {
        if (x->h.length > MAX_READ_REPLY)
            return ts_proto_err(c, "oversized READ reply");
        x->placed = (x->h.flags & TS_F_RDMA) != 0;
        if (x->placed && !x->req->mr)
            return ts_proto_err(c, "a placed READ reply to a read that placed nothing");
        x->rhead_len = TS_MIN((size_t)x->h.length, TS_READ_HEAD_LEN);
        x->state = RX_RHEAD;
        if (x->rhead_len == 0)
            ts_rx_drain(c, 0, TS_EPROTO);
        return 0;
    }
    if (x->req->op == TS_OP_READV) {
        if (x->h.length > 8 + x->req->nrv * (size_t)TS_READV_RESULT + TS_READV_BYTES)
            return ts_proto_err(c, "oversized READV reply");
        x->rhead_len = TS_MIN((size_t)x->h.length, (size_t)8);
        x->state = RX_VHEAD;
        if (x->rhead_len == 0)
            ts_rx_drain(c, 0, TS_EPROTO);
        return 0;
    }
    if (x->h.length > MAX_SMALL_REPLY)
        return ts_proto_err(c, "oversized reply");
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
            ts_rx_drain(c, payload - x->rhead_len, status < 0 ? status : TS_EPROTO);
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
        (x->placed ? ts_read_head_decode_placed(x->rhead, payload, r->rd_off, r->cap, &x->rd)
                   : ts_read_head_decode(x->rhead, payload, r->rd_off, r->cap, &x->rd)) != 0) {
        ts_proto_err(c, "READ reply does not match the range asked for");
        ts_rx_drain(c, payload - x->rhead_len, TS_EPROTO);
        return 0;
    }
    if (!x->placed && r->tgt && x->rd.data_len) { /* host bytes never go into device memory */
        ts_proto_err(c, "an in-band READ reply to a read into device memory");
        ts_rx_drain(c, payload - x->rhead_len, TS_EPROTO);
        return 0;
    }
    /* From here the data (at most r->cap bytes, checked above) may land in r->dst. */
    x->have = 0;
    if (x->rd.npieces) {
        if (ts_rx_table(x, (size_t)x->rd.npieces * 8) != 0)
            return TS_ENOMEM;
        x->state = RX_RDATA;
        return 0;
    }
    if (x->rd.data_len) {
        ts_proto_err(c, "READ reply carries data but no pieces");
        ts_rx_drain(c, x->placed ? 0 : x->rd.data_len, TS_EPROTO);
        return 0;
    }
    ts_rx_complete(c, 0);
    return 0;
}

/* A corrupt READ reply: the request fails with rc, the rest of the frame is skipped. */
static void rx_read_fail(struct tessera_client *c, int rc)
{
    struct rx *x = &c->rx;

    ts_rx_drain(c, x->tlen - x->thave + (x->placed ? 0 : x->rd.data_len - x->have), rc);
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
        if (x->placed)
            x->have = x->rd.data_len; /* written into r->dst before the reply was sent */
        if (ts_read_pieces_check(x->table, x->rd.npieces, x->rd.data_len) != 0) {
            ts_proto_err(c, "READ piece lengths do not add up to the data sent");
            rx_read_fail(c, TS_EPROTO);
            return 0;
        }
    } else {
        x->have += n;
    }
    if (r->tgt) /* placed in device memory: checked there, all pieces at once */
        rc = r->tgt->verify(r->tgt->ctx, x->table, x->rd.npieces, r->dst, x->rd.data_len);
    else
        rc = ts_read_pieces_verify(x->table, x->rd.npieces, r->dst, x->have, &x->pdone, &x->pdoff);
    if (rc) {
        if (r->tgt)
            ts_conn_set_error(c,
                              rc == TS_ECORRUPT
                                  ? "a piece placed in device memory fails its CRC32C"
                                  : "the check of the bytes placed in device memory failed: %s",
                              ts_strerror(rc));
        else
            ts_conn_set_error(c, "piece %u of a READ reply fails its CRC32C", x->pdone);
        free(r->msg);
        r->msg = strdup(c->err); /* for tessera_wait*, which report the read's own message */
        TS_ERROR(FAC, rc, "shard data corrupt in transit: %s (request %llu)", c->err,
                 (unsigned long long)r->id);
        rx_read_fail(c, rc);
        return 0;
    }
    if (x->have == x->rd.data_len)
        ts_rx_complete(c, 0);
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
    case RX_VDATA:
        return ts_rx_readv_arrived(c, n);
    default:
        x->drain_left -= n;
        if (x->drain_left == 0)
            ts_rx_complete(c, x->drain_rc);
        return 0;
    }
}

/*
 * Takes what stage holds for the current state: a frame header, a READ head, or bytes of the
 * current target (copied: a body, a piece table, READ data, bytes being drained). 1 when the state
 * moved on, 0 when stage holds too little, TS_E* when the connection is unusable.
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
            return ts_proto_err(c, c->frames ? "bad frame header"
                                             : "not a tessera frame (is this a tessera server?)");
        if (rc == 0)
            return 0;
        x->soff += TS_HDR_LEN;
        c->frames++;
        rc = rx_header(c);
        break;
    case RX_RHEAD:
    case RX_VHEAD:
        if (avail < x->rhead_len)
            return 0;
        memcpy(x->rhead, x->stage + x->soff, x->rhead_len);
        x->soff += x->rhead_len;
        rc = x->state == RX_RHEAD ? rx_read_head(c) : ts_rx_readv_head(c);
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
 * Bytes to receive into stage now. As much as it has room for (several small replies in one
 * receive), but only a READ reply's header and head when its data is larger than stage: the
 * data then goes straight into the caller's buffer, not through stage and a copy. The reply
 * due next is guessed from the oldest request not answered yet; a wrong guess costs nothing
 * but the copy.
 */
static size_t stage_want(const struct tessera_client *c)
{
    const struct rx *x = &c->rx;
    size_t staged = x->slen - x->soff, room = RX_STAGE - x->slen;
    const size_t head = TS_HDR_LEN + TS_READ_HEAD_LEN;

    if (x->state == RX_RHEAD) /* the header is in; stage holds part of the head */
        return x->h.length > RX_STAGE && staged < x->rhead_len ? x->rhead_len - staged : room;
    if (x->state != RX_HDR || staged != 0)
        return room;
    for (size_t i = 0; i < c->nlive; i++) {
        const struct ts_req *r = c->live[i];
        if (r->replied || !r->sent)
            continue;
        return r->op == TS_OP_READ && !r->mr && r->cap > RX_STAGE && head <= room ? head : room;
    }
    return room;
}

/*
 * One step of receiving: what stage holds, else one receive. 1 when bytes were taken, 0 when
 * nothing is there (or nothing is expected: c->rx_more is 0), TS_E* when the connection is
 * unusable.
 */
static int rx_step(struct tessera_client *c, size_t *bytes)
{
    struct rx *x = &c->rx;
    struct iovec iov[RX_IOV];
    size_t want = 0;
    int cnt = 1, rc;
    long n;

    if (!x->stage) {
        x->stage = malloc(RX_STAGE);
        if (!x->stage)
            return TS_ENOMEM;
    }
    if (!c->scratch && x->state == RX_DRAIN) {
        c->scratch = malloc(64u << 10);
        if (!c->scratch)
            return TS_ENOMEM;
    }
    switch (x->state) {
    case RX_HDR:
    case RX_RHEAD:
    case RX_VHEAD:
        iov[0].iov_len = 0;
        break;
    case RX_VDATA:
        cnt = ts_rx_readv_iov(c, iov, (int)TS_ARRAY_SIZE(iov));
        if (cnt == 0) /* a READV reply completes with its last range: never here */
            return ts_proto_err(c, "READV reply state lost");
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
            iov[cnt].iov_len = x->placed ? 0 : x->rd.data_len - x->have;
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
    if (x->state == RX_HDR || x->state == RX_RHEAD || x->state == RX_VHEAD) {
        /* Into stage: a header (or the rest of a READ head) and what follows it, as much as
         * the transport has up to RX_STAGE. */
        if (x->soff) {
            memmove(x->stage, x->stage + x->soff, x->slen - x->soff);
            x->slen -= x->soff;
            x->soff = 0;
        }
        iov[0].iov_base = x->stage + x->slen;
        iov[0].iov_len = stage_want(c);
    }
    for (int i = 0; i < cnt; i++)
        want += iov[i].iov_len;
    n = c->t->ops->recv(c->t, iov, cnt);
    if (n <= 0) {
        if (n == 0)
            c->rx_more = 0;
        return (int)n;
    }
    if ((size_t)n < want)
        c->rx_more = 0; /* the transport has nothing more now: wait before the next receive */
    *bytes += (size_t)n;
    if (x->state == RX_HDR || x->state == RX_RHEAD || x->state == RX_VHEAD) {
        x->slen += (size_t)n;
        rc = rx_staged(c, NULL);
    } else {
        rc = rx_arrived(c, (size_t)n);
    }
    return rc < 0 ? rc : 1;
}

/* Receives what is there, up to a budget; 0 or TS_E*. */
int ts_rx_some(struct tessera_client *c, int *progress)
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
