/*
 * libtessera, the connection layer: READV, many small ranges in one request and one reply
 * (docs/protocol.md "Reads of many small ranges (READV)"). The reply is received whole (a
 * small reply's body), then each range's bytes are checked against its CRC32C and copied into
 * its own buffer. A range that failed keeps its code; the caller reads it again on its own.
 */
#include "conn.h"

#include <stdio.h>

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
    ts_wr_u32(&r->w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        ts_wr_u32(&r->w, v[i].shard);
        ts_wr_u64(&r->w, v[i].off);
        ts_wr_u32(&r->w, (uint32_t)v[i].len);
    }
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

/* A range whose bytes failed their CRC32C in transit. */
static void range_corrupt(tessera_client *c, const struct ts_readv *v, uint64_t id)
{
    TS_ERROR(FAC, TS_ECORRUPT, "READV %llu: shard %u [%llu, +%zu) fails its CRC32C in transit",
             (unsigned long long)id, v->shard, (unsigned long long)v->off, v->len);
}

int ts_conn_readv_result(tessera_client *c, struct ts_req *r, size_t *out_len)
{
    struct ts_rd rd, tab, chk;
    const uint8_t *data;
    size_t total = 0;
    int rc;

    if (r->rc) {
        if (r->msg)
            snprintf(c->err, sizeof(c->err), "%s", r->msg);
        return r->rc;
    }
    if (!r->reply)
        return ts_proto_err(c, "READV reply without a body");
    ts_rd_init(&rd, r->reply, r->reply_len);
    rc = ts_reply_status(&rd, c->err, sizeof(c->err));
    if (rc) {
        ts_note_stale(c, &rd, rc);
        return rc;
    }
    if (ts_rd_u32(&rd) != r->nrv || rd.err)
        return ts_proto_err(c, "READV reply for another number of ranges");
    tab = rd; /* at the table */
    if (!ts_rd_bytes(&rd, r->nrv * (size_t)TS_READV_RESULT))
        return ts_proto_err(c, "READV reply too short for its table");
    data = r->reply + rd.off;
    /* The table first, whole: lengths within what was asked and adding up to the data sent. */
    chk = tab;
    for (size_t i = 0; i < r->nrv; i++) {
        int32_t st = (int32_t)ts_rd_u32(&chk);
        uint32_t len = ts_rd_u32(&chk);
        (void)ts_rd_u32(&chk);
        if (st > 0 || (st != 0 && len != 0) || len > r->rv[i].len)
            return ts_proto_err(c, "READV reply's table does not match the ranges asked for");
        total += len;
    }
    if (total != r->reply_len - rd.off)
        return ts_proto_err(c, "READV reply's lengths do not add up to the data sent");
    for (size_t i = 0; i < r->nrv; i++) {
        struct ts_readv *v = &r->rv[i];
        int32_t st = (int32_t)ts_rd_u32(&tab);
        uint32_t len = ts_rd_u32(&tab), crc = ts_rd_u32(&tab);
        v->rc = st;
        v->got = 0;
        if (st == 0 && ts_crc32c(0, data, len) != crc) {
            v->rc = TS_ECORRUPT;
            range_corrupt(c, v, r->id);
        } else if (st == 0) {
            memcpy(v->dst, data, len);
            v->got = len;
        }
        data += len;
    }
    if (out_len)
        *out_len = total;
    return 0;
}
