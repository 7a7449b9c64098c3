/*
 * libtessera, the connection layer: reads of one connection. ts_conn_read keeps a window of
 * READ requests in flight over the range; ts_conn_read_submit queues one read collected by
 * ts_conn_wait / ts_conn_wait_any. A read whose bytes fail their CRC32C is read once more from
 * the node's store (flag VERIFY). The public calls (api.c) on a single-node handle and the
 * router (cluster_read.c) on its sub-connections call them; nothing here knows the router.
 */
#include "conn.h"

#include <stdio.h>

#define FAC "client"
#define READ_WINDOW 4 /* TESSERA_MAX_READ requests in flight per tessera_read */

/* ---- reads ---------------------------------------------------------------------------------- */

int ts_read_args(tessera_client *c, const char *name, uint64_t off, size_t len, void *buf)
{
    int rc = ts_name_check(c, name);

    if (rc)
        return rc;
    if ((!buf && len) || len > UINT64_MAX - off) {
        ts_conn_set_error(c, "bad read range or buffer");
        return TS_EINVAL;
    }
    return 0;
}

int ts_submit_args(tessera_client *c, const char *name, uint64_t off, size_t len, void *buf,
                   uint64_t *op)
{
    int rc;

    if (op)
        *op = 0;
    rc = ts_enter(c);
    if (rc)
        return rc;
    if (!op)
        return TS_EINVAL;
    rc = ts_read_args(c, name, off, len, buf);
    if (rc)
        return rc;
    if (len > TESSERA_MAX_READ) {
        ts_conn_set_error(c, "a submitted read is at most %u bytes", TESSERA_MAX_READ);
        return TS_EINVAL;
    }
    return 0;
}

/* Queues a READ of [off, off+len) into buf: placed by the node where the transport can register
 * buf (RDMA), else in-band. Into device memory (tgt) it must be placed: TS_ENOTSUP if not. */
static int read_queue(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                      void *buf, int user, uint16_t hflags, const struct ts_read_target *tgt,
                      struct ts_req **out)
{
    struct ts_req *r;
    int rc;

    *out = NULL;
    if (tgt && (!c->t->ops->reg || !len)) {
        ts_conn_set_error(c, "%s cannot place reads into device memory", c->t->ops->name);
        return TS_ENOTSUP;
    }
    r = ts_req_name(c, TS_OP_READ, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    ts_wr_u64(&r->w, off);
    ts_wr_u32(&r->w, (uint32_t)len);
    if (c->t->ops->reg && len) {
        /* RDMA: the server writes the data into buf itself; the reply carries the CRCs. */
        uint64_t addr;
        uint32_t key;
        rc = c->t->ops->reg(c->t, buf, len, tgt ? tgt->src : NULL, &addr, &key, &r->mr);
        if (rc == 0) {
            hflags |= TS_F_RDMA;
            ts_wr_u64(&r->w, addr);
            ts_wr_u32(&r->w, key);
            ts_wr_u32(&r->w, 0);
        } else if (tgt) {
            /* Any refusal (no DMA-BUF, no peer memory: EFAULT, EINVAL, ...) means this path
             * cannot place here; the caller tries the next one. */
            ts_conn_set_error(c, "cannot register device memory for RDMA: %s", ts_strerror(rc));
            ts_req_free(c, r);
            return c->broken ? c->broken : TS_ENOTSUP;
        }
    }
    r->tgt = tgt;
    r->user = (uint8_t)user;
    r->hflags = hflags;
    r->dst = buf;
    r->cap = len;
    r->rd_off = off;
    rc = ts_req_send(c, r, NULL, 0);
    if (rc) {
        ts_req_unplace(c, r, 0);
        ts_req_free(c, r);
        return rc;
    }
    *out = r;
    return 0;
}

int ts_conn_can_place(const tessera_client *c)
{
    return c && !c->cl && c->t && c->t->ops->reg && !c->broken;
}

void ts_conn_reg_stats(tessera_client *c, uint64_t *hits, uint64_t *misses)
{
    ts_rdma_reg_stats(c ? c->t : NULL, hits, misses);
}

void ts_req_unplace(struct tessera_client *c, struct ts_req *r, int bad)
{
    if (r->mr && c->t)
        c->t->ops->dereg(c->t, r->mr, bad);
    r->mr = NULL;
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
                            hflags, NULL, &win[next % READ_WINDOW]);
            if (rc) {
                first = rc;
                break;
            }
            next++;
        }
        if (done == next)
            break;
        struct ts_req *r = win[done % READ_WINDOW];
        rc = ts_pump(c, ts_cond_done, r);
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
        ts_req_free(c, r);
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

int ts_conn_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                 void *buf, size_t *out_len)
{
    int rc;

    if (out_len)
        *out_len = 0;
    rc = ts_enter(c);
    if (rc)
        return rc;
    rc = ts_read_args(c, name, off, len, buf);
    if (rc)
        return rc;
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

int ts_conn_read_submit(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *buf, uint64_t *op)
{
    return ts_conn_read_submit_to(c, name, shard, off, len, buf, NULL, op);
}

int ts_conn_read_submit_to(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                           size_t len, void *buf, const struct ts_read_target *tgt, uint64_t *op)
{
    struct ts_req *r;
    int rc;

    rc = ts_submit_args(c, name, off, len, buf, op);
    if (rc)
        return rc;
    rc = read_queue(c, name, shard, off, len, buf, 1, 0, tgt, &r);
    if (rc)
        return rc;
    ts_req_submitted(c, r, op);
    return 0;
}

void ts_req_submitted(tessera_client *c, struct ts_req *r, uint64_t *op)
{
    int rc, progress = 0;

    *op = r->id;
    /* Get the request on its way now (unless sends are batched until the next wait); its
     * outcome is reported by ts_conn_wait*. */
    if (c->batch.defer_tx)
        return;
    rc = ts_tx_step(c, &progress);
    if (rc < 0)
        ts_fail_conn(c, rc);
}

/*
 * A submitted READ that failed its CRC (or whose node found its copy bad), read once more from
 * the node's store (flag VERIFY), into the same buffer, as ts_conn_read does. Its name and shard
 * come back from the request's own frame.
 */
static int submitted_result(tessera_client *c, struct ts_req *r, size_t *out_len)
{
    if (r->op == TS_OP_READV)
        return ts_conn_readv_result(c, r, out_len);
    int rc = read_result(c, r, out_len);
    char name[TS_NAME_MAX + 1];
    struct ts_rd rd;
    uint32_t shard;

    if (rc != TS_ECORRUPT || c->broken || (r->hflags & TS_F_VERIFY) || r->tgt)
        return rc; /* a read into device memory is retried by its caller */
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

int ts_conn_wait(tessera_client *c, uint64_t op, size_t *out_len)
{
    struct ts_req *r;
    size_t i;
    int rc;

    if (out_len)
        *out_len = 0;
    if (!c)
        return TS_EINVAL;
    c->err[0] = '\0';
    i = ts_live_find(c, op);
    if (i == SIZE_MAX || !c->live[i]->user)
        return TS_ENOENT;
    r = c->live[i];
    (void)ts_pump(c, ts_cond_done, r); /* a failed connection completes r with its code */
    rc = submitted_result(c, r, out_len);
    ts_req_free(c, r);
    return rc;
}

int ts_conn_wait_any(tessera_client *c, uint64_t *op, size_t *out_len)
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
    for (size_t i = 0; i < c->nlive && !any; i++)
        any = c->live[i]->user;
    if (!any)
        return TS_ENOENT;
    (void)ts_pump(c, ts_cond_any_user, NULL);
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
    ts_req_free(c, r);
    return rc;
}

void ts_conn_batch(tessera_client *c, const struct ts_batch *b)
{
    c->batch = *b;
}
