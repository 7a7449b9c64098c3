/*
 * libtessera, the connection layer: READV, many small ranges in one request and one reply
 * (docs/protocol.md "Reads of many small ranges (READV)"). The reply's table comes first; then
 * each range's bytes are received straight into its own buffer (scattered, no copy) and
 * checked against its CRC32C as soon as they are in. A range that failed keeps its code; the
 * caller reads it again on its own. A refusal (a status and a message) is received whole.
 */
#include "conn.h"

#include <stdio.h>
#include <stdlib.h>

#define FAC "client"

int ts_conn_readv_submit(tessera_client *c, const char *name, struct ts_readv *v, size_t n,
                         uint64_t *op)
{
    struct ts_req *r;
    uint64_t total = 0;
    int rc;

    if (op)
        *op = 0;
    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!op || !v || n == 0 || n > TS_READV_MAX) {
        ts_conn_set_error(c, "a READV has 1 to %u ranges", TS_READV_MAX);
        return TS_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if ((!v[i].dst && v[i].len) || v[i].len > TS_READV_BYTES) {
            ts_conn_set_error(c, "bad READV range or buffer");
            return TS_EINVAL;
        }
        total += v[i].len;
        v[i].rc = TS_EINTERNAL;
        v[i].got = 0;
    }
    if (total > TS_READV_BYTES) {
        ts_conn_set_error(c, "a READV asks for at most %u bytes", TS_READV_BYTES);
        return TS_EINVAL;
    }
    r = ts_req_name(c, TS_OP_READV, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_ranges(&r->w, v, n);
    r->user = 1;
    r->rv = v;
    r->nrv = n;
    rc = ts_req_send(c, r, NULL, 0);
    if (rc) {
        ts_req_free(c, r);
        return rc;
    }
    ts_req_submitted(c, r, op);
    return 0;
}

void ts_wr_ranges(struct ts_wr *w, const struct ts_readv *v, size_t n)
{
    ts_wr_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        ts_wr_u32(w, v[i].shard);
        ts_wr_u64(w, v[i].off);
        ts_wr_u32(w, (uint32_t)TS_MIN(v[i].len, (size_t)UINT32_MAX));
    }
}

/* ---- receiving a READV reply (recv.c's state machine calls these) -------------------------- */

/* A range whose bytes failed their CRC32C in transit. */
static void range_corrupt(tessera_client *c, const struct ts_readv *v, uint64_t id)
{
    TS_ERROR(FAC, TS_ECORRUPT, "READV %llu: shard %u [%llu, +%zu) fails its CRC32C in transit",
             (unsigned long long)id, v->shard, (unsigned long long)v->off, v->len);
}

/* The entry of range i in the table: status, length, CRC32C. */
static void entry(const struct rx *x, size_t i, int32_t *st, uint32_t *len, uint32_t *crc)
{
    const uint8_t *e = x->table + i * (size_t)TS_READV_RESULT;

    *st = (int32_t)ts_get_le32(e);
    *len = ts_get_le32(e + 4);
    *crc = ts_get_le32(e + 8);
}

/* Past the ranges with nothing (more) to receive; the reply is complete after the last. */
static void next_range(tessera_client *c)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;

    while (x->vi < r->nrv && x->vhave == r->rv[x->vi].got) {
        x->vi++;
        x->vhave = 0;
    }
    if (x->vi == r->nrv)
        ts_rx_complete(c, 0);
}

/* The table is in: checked whole, the ranges' statuses and lengths into the caller's
 * entries, the data to follow. */
static int table_done(tessera_client *c)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;
    size_t total = 0;

    for (size_t i = 0; i < r->nrv; i++) {
        int32_t st;
        uint32_t len, crc;
        entry(x, i, &st, &len, &crc);
        if (st > 0 || (st != 0 && len != 0) || len > r->rv[i].len) {
            ts_proto_err(c, "READV reply's table does not match the ranges asked for");
            ts_rx_drain(c, x->vleft, TS_EPROTO);
            return 0;
        }
        r->rv[i].rc = st;
        r->rv[i].got = len;
        total += len;
    }
    if (total != x->vleft) {
        ts_proto_err(c, "READV reply's lengths do not add up to the data sent");
        ts_rx_drain(c, x->vleft, TS_EPROTO);
        return 0;
    }
    x->vi = x->vhave = 0;
    next_range(c);
    return 0;
}

int ts_rx_readv_head(tessera_client *c)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;
    size_t payload = x->h.length;
    int32_t status = (int32_t)ts_get_le32(x->rhead);

    if (status != 0 || x->rhead_len < 8) { /* refused: status + message, read whole */
        x->body_len = payload;
        x->body = malloc(payload ? payload : 1);
        if (!x->body)
            return TS_ENOMEM;
        memcpy(x->body, x->rhead, x->rhead_len);
        x->have = x->rhead_len;
        x->state = RX_BODY;
        if (x->have == x->body_len)
            ts_rx_complete(c, 0); /* the caller decodes the refusal (ts_conn_readv_result) */
        return 0;
    }
    if (ts_get_le32(x->rhead + 4) != r->nrv || payload < 8 + r->nrv * (size_t)TS_READV_RESULT) {
        ts_proto_err(c, "READV reply for another number of ranges");
        ts_rx_drain(c, payload - x->rhead_len, TS_EPROTO);
        return 0;
    }
    if (ts_rx_table(x, r->nrv * (size_t)TS_READV_RESULT) != 0)
        return TS_ENOMEM;
    x->vleft = payload - 8 - x->tlen;
    x->state = RX_VDATA;
    return 0;
}

int ts_rx_readv_iov(tessera_client *c, struct iovec *iov, int max)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;
    int n = 0;

    if (x->thave < x->tlen) { /* the table first, on its own: it says where the data goes */
        iov[0].iov_base = x->table + x->thave;
        iov[0].iov_len = x->tlen - x->thave;
        return 1;
    }
    for (size_t i = x->vi; i < r->nrv && n < max; i++) {
        size_t at = i == x->vi ? x->vhave : 0;
        if (r->rv[i].got == at)
            continue;
        iov[n].iov_base = r->rv[i].dst + at;
        iov[n].iov_len = r->rv[i].got - at;
        n++;
    }
    return n;
}

int ts_rx_readv_arrived(tessera_client *c, size_t n)
{
    struct rx *x = &c->rx;
    struct ts_req *r = x->req;

    if (x->thave < x->tlen) { /* only the table was asked for */
        x->thave += n;
        return x->thave < x->tlen ? 0 : table_done(c);
    }
    while (n) {
        struct ts_readv *v = &r->rv[x->vi];
        size_t k = TS_MIN(n, v->got - x->vhave);
        int32_t st;
        uint32_t len, crc;
        x->vhave += k;
        x->vleft -= k;
        n -= k;
        if (x->vhave < v->got)
            break;
        entry(x, x->vi, &st, &len, &crc);
        if (ts_crc32c(0, v->dst, v->got) != crc) {
            v->rc = TS_ECORRUPT;
            range_corrupt(c, v, r->id);
        }
        if (v->rc)
            v->got = 0; /* none of its bytes count */
        x->vi++;
        x->vhave = 0;
        next_range(c);
        if (x->state != RX_VDATA)
            break; /* complete */
    }
    return 0;
}

/* ---- the outcome ---------------------------------------------------------------------------- */

int ts_conn_readv_result(tessera_client *c, struct ts_req *r, size_t *out_len)
{
    struct ts_rd rd;
    size_t total = 0;
    int rc;

    if (r->rc || !r->rv_done) /* nothing was read: no range keeps what its table entry said */
        for (size_t i = 0; i < r->nrv; i++) {
            r->rv[i].rc = r->rc ? r->rc : TS_EPROTO;
            r->rv[i].got = 0;
        }
    if (r->rc) {
        if (r->msg)
            snprintf(c->err, sizeof(c->err), "%s", r->msg);
        return r->rc;
    }
    if (!r->rv_done) { /* refused: the reply is a status and a message */
        if (!r->reply)
            return ts_proto_err(c, "READV reply without a body");
        ts_rd_init(&rd, r->reply, r->reply_len);
        rc = ts_reply_status(&rd, c->err, sizeof(c->err));
        ts_note_stale(c, &rd, rc);
        return rc ? rc : ts_proto_err(c, "READV reply without its table");
    }
    for (size_t i = 0; i < r->nrv; i++)
        total += r->rv[i].got;
    if (out_len)
        *out_len = total;
    return 0;
}
