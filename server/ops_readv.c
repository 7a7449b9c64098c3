/* READV: many small ranges of one dataset's complete shards in one request and one reply
 * (docs/protocol.md "Reads of many small ranges (READV)"), each range verified like a READ's
 * and answered with its own status and CRC32C; the bytes go out by reference, without a copy. */
#include "ops_internal.h"

#include <stdlib.h>

#include "ts_common.h"

/* The verified chunk pieces of the ranges answered so far, in reply order. */
struct rv_piece {
    struct ts_chunk_ref ref;
    size_t in, n;
};

struct rv {
    struct tsd_conn *c;
    const char *name;
    int verify; /* flag VERIFY: cached copies are evicted before the read */
    struct rv_piece *p;
    size_t np, capp;
    ts_read_ctx *ctx; /* of the last range's shard (ranges of one shard share it) */
    uint32_t ctx_shard;
};

static void rv_release(struct rv *v, size_t from)
{
    for (size_t i = from; i < v->np; i++)
        ts_chunk_ref_release(&v->p[i].ref);
    v->np = from;
}

/* Chunk idx of the open shard, verified, its bytes [in, in+n) checked when partial; the CRC32C
 * of those bytes in *crc. */
static int rv_chunk(struct rv *v, uint32_t shard, uint32_t idx, size_t in, size_t n, uint32_t *crc)
{
    struct tsd_server *s = v->c->w->srv;
    struct rv_piece *pc;
    int rc, whole;

    if (v->np == v->capp) {
        size_t cap = v->capp ? 2 * v->capp : 16;
        pc = realloc(v->p, cap * sizeof(*pc));
        if (!pc)
            return TS_ENOMEM;
        v->p = pc;
        v->capp = cap;
    }
    pc = &v->p[v->np];
    if (v->verify)
        ts_read_ctx_evict(v->ctx, idx);
    rc = ts_read_ctx_piece(v->ctx, idx, in, n, &pc->ref);
    whole = !rc && ts_chunk_ref_whole(&pc->ref, in, n);
    if (whole)
        *crc = pc->ref.crc;
    if (!rc && !whole && ts_chunk_ref_check_crc(&pc->ref, in, n, crc) != 0) {
        /* A cached copy whose memory went bad, or sub-blocks read from a damaged file: the
         * whole chunk is read again from the store and verified. */
        int piece = pc->ref.piece; /* if so, the whole chunk's read counts it */

        TS_ERROR(FAC, TS_ECORRUPT, "%s of chunk %u of %s/%u failed its check: read again whole",
                 piece ? "sub-blocks read from disk" : "cached copy", idx, v->name, shard);
        if (!piece)
            STAT_ADD(&v->c->w->stats, corrupt_chunks, 1);
        ts_chunk_ref_release(&pc->ref);
        ts_read_ctx_evict(v->ctx, idx);
        rc = ts_read_ctx_chunk(v->ctx, idx, &pc->ref);
        if (!rc && ts_chunk_ref_check_crc(&pc->ref, in, n, crc) != 0) {
            /* Bad memory again, not a bad stored chunk: counted once, nothing to repair. */
            ts_chunk_ref_release(&pc->ref);
            return TS_ECORRUPT;
        }
    }
    if (rc) {
        if (rc == TS_ECORRUPT)
            STAT_ADD(&v->c->w->stats, corrupt_chunks, 1);
        tsd_repair_chunk(s, v->name, shard, idx, rc);
        return rc;
    }

    pc->in = in;
    pc->n = n;
    v->np++;
    return 0;
}

/* One range: its status; on success its pieces are added to v, *got and *crc set. */
static int rv_range(struct rv *v, uint32_t shard, uint64_t off, uint32_t len, uint32_t *got,
                    uint32_t *crc)
{
    struct tsd_server *s = v->c->w->srv;
    const struct ts_shard_info *si;
    size_t mark = v->np;
    uint64_t end, pos;
    int rc = 0;

    *got = 0;
    *crc = 0;
    if (atomic_load(&s->epoch) && !tsd_pg_serves(s, v->name, shard))
        return TS_EBUSY; /* recovering its PG: another replica serves it */
    if (!v->ctx || v->ctx_shard != shard) {
        ts_read_ctx_close(v->ctx);
        v->ctx = NULL;
        rc = ts_store_read_open(s->store, v->name, shard, 0, &v->ctx);
        if (rc)
            return rc;
        v->ctx_shard = shard;
    }
    si = ts_read_ctx_info(v->ctx);
    if (off > si->size)
        return TS_ERANGE;
    end = off + TS_MIN((uint64_t)len, si->size - off);
    for (pos = off; pos < end && !rc;) {
        uint32_t idx = (uint32_t)(pos / si->chunk_size), pcrc = 0;
        size_t in = (size_t)(pos % si->chunk_size);
        size_t n = (size_t)TS_MIN((uint64_t)si->chunk_size - in, end - pos);
        rc = rv_chunk(v, shard, idx, in, n, &pcrc);
        if (!rc)
            *crc = pos == off ? pcrc : ts_crc32c_combine(*crc, pcrc, n);
        pos += n;
    }
    if (rc) {
        rv_release(v, mark);
        *crc = 0;
        return rc;
    }
    *got = (uint32_t)(end - off);
    return 0;
}

static void pin_cleanup(const void *data, size_t len, void *pin)
{
    ts_chunk_pin_release(pin);
}

static void buf_free_cb(const void *data, size_t len, void *buf)
{
    free(buf);
}

void tsd_op_readv(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_readv *rq = &q->u.readv;
    struct tsd_server *s = c->w->srv;
    struct evbuffer *out = tsd_conn_out(c);
    struct rv v = {c, rq->name, (h->flags & TS_F_VERIFY) != 0, NULL, 0, 0, NULL, 0};
    uint64_t asked = 0, data = 0;
    uint32_t failed = 0;
    struct ts_wr w;

    if (rq->n == 0 || rq->n > TS_READV_MAX) {
        tsd_reply_error(c, h, TS_EINVAL, "readv %s: %u ranges; 1 to %u per request", rq->name,
                        rq->n, TS_READV_MAX);
        return;
    }
    if (h->flags & TS_F_RDMA) {
        tsd_reply_error(c, h, TS_EINVAL, "readv %s: its data is always in-band (no flag RDMA)",
                        rq->name);
        return;
    }
    for (uint32_t i = 0; i < rq->n; i++) {
        uint32_t shard, len;
        uint64_t off;
        tsd_readv_at(rq, i, &shard, &off, &len);
        asked += len;
    }
    if (asked > TS_READV_BYTES) {
        tsd_reply_error(c, h, TS_ETOOBIG,
                        "readv %s: %llu bytes asked by %u ranges, at most %u per request", rq->name,
                        (unsigned long long)asked, rq->n, TS_READV_BYTES);
        return;
    }
    if (v.verify)
        STAT_ADD(&c->w->stats, corrupt_chunks, 1);
    tsd_reply_begin(&w);
    ts_wr_u32(&w, rq->n);
    for (uint32_t i = 0; i < rq->n; i++) {
        uint32_t shard, len, got, crc;
        uint64_t off;
        int rc;
        tsd_readv_at(rq, i, &shard, &off, &len);
        rc = rv_range(&v, shard, off, len, &got, &crc);
        if (rc == TS_ENOMEM)
            break;
        failed += rc != 0;
        if (!rc) /* each range: its dataset's counters and hotness */
            tsd_m_read(c, rq->name, shard, got);
        ts_wr_u32(&w, (uint32_t)rc);
        ts_wr_u32(&w, got);
        ts_wr_u32(&w, crc);
        data += got;
    }
    ts_read_ctx_close(v.ctx);
    if (w.err || w.len != TS_HDR_LEN + 8 + (size_t)rq->n * TS_READV_RESULT) {
        rv_release(&v, 0);
        free(v.p);
        ts_wr_fini(&w);
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    if (v.verify)
        TS_WARN(FAC, TS_ECORRUPT,
                "readv %s from %s: the client asks for a read from the store (bytes failed their "
                "CRC): cached chunks of its %u ranges evicted",
                rq->name, c->peer, rq->n);
    else if (failed) /* the client reads them again one by one, which logs what matters */
        TS_DEBUG(FAC, "readv %s from %s: %u of %u ranges failed", rq->name, c->peer, failed, rq->n);
    struct ts_frame_hdr rh = {TS_PROTO_VERSION, h->opcode, TS_F_REPLY,
                              h->req_id,        s->epoch,  (uint32_t)(w.len - TS_HDR_LEN + data)};
    ts_frame_encode(w.buf, &rh);
    STAT_ADD(&c->w->stats, bytes_out, w.len + data);
    STAT_ADD(&c->w->stats, read_bytes, data);
    tsd_m_reply(c, h, 0, w.len + data);
    if (evbuffer_add_reference(out, w.buf, w.len, buf_free_cb, w.buf) != 0) {
        ts_wr_fini(&w);
        rv_release(&v, 0);
        free(v.p);
        c->closing = 1;
        return;
    }
    w.buf = NULL;
    ts_wr_fini(&w);
    /* The pieces by reference: each chunk stays pinned until its bytes are handed on. */
    for (size_t i = 0; i < v.np; i++) {
        struct rv_piece *pc = &v.p[i];
        if (evbuffer_add_reference(out, ts_chunk_ref_at(&pc->ref, pc->in), pc->n, pin_cleanup,
                                   pc->ref.pin) != 0) {
            ts_chunk_pin_release(pc->ref.pin);
            c->closing = 1; /* a frame promised and not completed: the connection ends */
        }
        pc->ref.pin = NULL;
    }
    free(v.p);
}
