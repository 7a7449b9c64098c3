/* READ: a range of a complete shard, streamed as the peer drains it, zero-copy (pinned engine
 * buffers or the cache arena by sendfile), every piece with its CRC32C
 * (docs/architecture.md "Reads and checksums"). */
#include "ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reads ------------------------------------------------------------------------------ */

/* A local chunk failed verification: in a cluster, fetch a good copy from a replica; a
 * fragment has none: noted for the monitor's EC repair (ec_wanted.c). */
void tsd_repair_chunk(struct tsd_server *s, const char *name, uint32_t shard, uint32_t idx, int rc)
{
    if (rc != TS_ECORRUPT || !atomic_load(&s->epoch) || !s->repl || idx == UINT32_MAX)
        return;
    if (ts_frag_split(name, NULL, NULL)) {
        tsd_ec_wanted_note(s, name, shard, idx);
        return;
    }
    ts_repl_repair(s->repl, name, shard, idx, tsd_pg_of(s, name, shard));
}

/* Zeros sent in place of a chunk that failed verification mid-stream (see protocol.md). */
static const uint8_t zeros[1u << 20];

static void pin_cleanup(const void *data, size_t len, void *pin)
{
    ts_chunk_pin_release(pin);
}

void tsd_stream_free(struct tsd_read_stream *rs)
{
    if (!rs)
        return;
    ts_chunk_ref_release(&rs->first);
    ts_chunk_ref_release(&rs->last);
    ts_read_ctx_close(rs->ctx);
    free(rs->reply);
    free(rs);
}

#define SENDFILE_MIN (128u << 10)

static void hdr_free_cb(const void *data, size_t len, void *buf)
{
    free(buf);
}

static void seg_cleanup(struct evbuffer_file_segment const *seg, int flags, void *pin)
{
    ts_chunk_pin_release(pin);
}

/*
 * Adds [in, in+n) of a verified chunk to the output without copying it: on plain TCP from the
 * cache arena by sendfile() (file segment), otherwise by reference to its memory. The
 * reference on the chunk is released by libevent once the bytes are handed to the kernel.
 * Takes ownership of ref.
 */
static void add_piece(struct tsd_conn *c, struct evbuffer *out, struct ts_chunk_ref *ref, size_t in,
                      size_t n)
{
    /* Small pieces batch better into one writev; large ones go by sendfile. */
    if (!c->tls && !c->rdma && ref->fd >= 0 && n >= SENDFILE_MIN) {
        struct evbuffer_file_segment *seg = evbuffer_file_segment_new(
            ref->fd, (ev_off_t)(ref->file_off + in - ref->base), (ev_off_t)n,
            EVBUF_FS_DISABLE_MMAP | EVBUF_FS_DISABLE_LOCKING);
        if (seg) {
            ts_chunk_ref_lend(ref); /* its pages may outlive the call in the socket */
            evbuffer_file_segment_add_cleanup_cb(seg, seg_cleanup, ref->pin);
            ref->pin = NULL; /* now released by the segment's cleanup */
            if (evbuffer_add_file_segment(out, seg, 0, (ev_off_t)n) != 0)
                TS_ERROR(FAC, TS_ENOMEM, "cannot queue %zu bytes to %s", n, c->peer);
            evbuffer_file_segment_free(seg); /* the evbuffer holds its own reference */
            ref->data = NULL;
            return;
        }
    }
    if (evbuffer_add_reference(out, ts_chunk_ref_at(ref, in), n, pin_cleanup, ref->pin) != 0)
        ts_chunk_pin_release(ref->pin);
    ref->pin = NULL;
    ref->data = NULL;
}

static void add_zeros(struct evbuffer *out, size_t n)
{
    while (n) {
        size_t k = TS_MIN(n, sizeof(zeros));
        evbuffer_add_reference(out, zeros, k, NULL, NULL);
        n -= k;
    }
}

/* The stream is done: free it, and for a placed read send its reply now (after the WRITEs). */
static int stream_done(struct tsd_conn *c, struct tsd_read_stream *rs)
{
    struct ts_frame_hdr h = {.opcode = TS_OP_READ};

    c->t0_ns = rs->t0_ns; /* the latency of this read */
    tsd_m_reply(c, &h, 0, rs->head_len + (rs->end - rs->start));
    tsd_m_read(c, rs->name, rs->shard, rs->end - rs->start);
    if (rs->placed && rs->reply) {
        if (evbuffer_add_reference(tsd_conn_out(c), rs->reply, rs->reply_len, hdr_free_cb,
                                   rs->reply) == 0)
            rs->reply = NULL;
        else
            c->closing = 1; /* a reply promised and not sent: the connection cannot go on */
    }
    tsd_stream_free(rs);
    c->rs = NULL;
    return 1;
}

/* Chunk idx of the stream: the first or last one prefetched (and verified) with the reply's
 * head, else from the store or cache (verified). */
static int stream_chunk(struct tsd_read_stream *rs, uint32_t idx, struct ts_chunk_ref *ref)
{
    if (idx == rs->first_idx && rs->first.pin) {
        *ref = rs->first;
        rs->first.pin = NULL;
        return 0;
    }
    if (idx == rs->last_idx && rs->last.pin) {
        *ref = rs->last;
        rs->last.pin = NULL;
        return 0;
    }
    return ts_read_ctx_chunk(rs->ctx, idx, ref);
}

/* A chunk that failed mid-stream (already promised): logged, counted, repaired from a replica
 * where there is one; its bytes go as zeros, which fail the piece CRC at the client. */
static void stream_chunk_failed(struct tsd_conn *c, struct tsd_read_stream *rs, uint32_t idx,
                                int rc)
{
    TS_ERROR(FAC, rc, "read %s/%u chunk %u failed mid-stream to %s", rs->name,
             ts_read_ctx_info(rs->ctx)->shard, idx, c->peer);
    STAT_ADD(&c->w->stats, corrupt_chunks, 1);
    tsd_repair_chunk(c->w->srv, rs->name, ts_read_ctx_info(rs->ctx)->shard, idx, rc);
}

/* Mid-stream, the dataset was deleted: the promised frame cannot be finished. */
static int stream_gone(struct tsd_conn *c, struct tsd_read_stream *rs)
{
    TS_INFO(FAC, "read %s/%u: deleted while streaming to %s; closing", rs->name,
            ts_read_ctx_info(rs->ctx)->shard, c->peer);
    tsd_stream_free(rs);
    c->rs = NULL;
    c->closing = 1;
    tsd_conn_pause(c);
    return 1;
}

/* A placed stream: chunk bytes copied to the session's registered memory and written into the
 * client's region, as far as that memory allows; the rest when WRITEs complete (the RDMA
 * layer's room hook). 1 when finished. */
static int stream_place(struct tsd_conn *c, struct tsd_read_stream *rs)
{
    while (rs->pos < rs->end) {
        uint32_t idx = (uint32_t)(rs->pos / rs->chunk_size);
        size_t in = (size_t)(rs->pos % rs->chunk_size);
        size_t n = (size_t)TS_MIN((uint64_t)rs->chunk_size - in, rs->end - rs->pos);
        struct ts_chunk_ref ref;
        const void *src = NULL;
        long k;
        int rc = stream_chunk(rs, idx, &ref);

        if (rc == TS_ENOENT)
            return stream_gone(c, rs);
        if (rc) /* zeros in its place (src NULL) */
            stream_chunk_failed(c, rs, idx, rc);
        else
            src = ts_chunk_ref_at(&ref, in);
        k = tsd_rdma_place(c->rdma, src, n, rs->raddr + (rs->pos - rs->start), rs->rkey);
        if (!rc)
            ts_chunk_ref_release(&ref);
        if (k < 0) {
            tsd_stream_free(rs);
            c->rs = NULL;
            c->closing = 1;
            return 1;
        }
        rs->pos += (uint64_t)k;
        STAT_ADD(&c->w->stats, read_bytes, (uint64_t)k);
        STAT_ADD(&c->w->stats, rdma_placed_bytes, (uint64_t)k);
        if ((size_t)k < n)
            return 0; /* the session's placement memory is all in flight */
    }
    return stream_done(c, rs);
}

int tsd_stream_continue(struct tsd_conn *c)
{
    struct tsd_read_stream *rs = c->rs;
    struct evbuffer *out = tsd_conn_out(c);
    size_t budget = c->w->srv->out_budget;

    if (rs->placed)
        return stream_place(c, rs);
    while (rs->pos < rs->end && evbuffer_get_length(out) < budget) {
        uint32_t idx = (uint32_t)(rs->pos / rs->chunk_size);
        size_t in = (size_t)(rs->pos % rs->chunk_size);
        size_t n = (size_t)TS_MIN((uint64_t)rs->chunk_size - in, rs->end - rs->pos);
        struct ts_chunk_ref ref;
        int rc = stream_chunk(rs, idx, &ref);

        if (rc == TS_ENOENT) /* closing is the only honest end of a frame already promised */
            return stream_gone(c, rs);
        if (rc) {
            /* The corrupt bytes themselves never leave: zeros in their place. */
            stream_chunk_failed(c, rs, idx, rc);
            add_zeros(out, n);
        } else {
            add_piece(c, out, &ref, in, n);
        }
        rs->pos += n;
        STAT_ADD(&c->w->stats, read_bytes, n);
        STAT_ADD(&c->w->stats, bytes_out, n);
    }
    if (rs->pos < rs->end)
        return 0;
    return stream_done(c, rs);
}

void tsd_op_read(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const char *name = q->u.read.name;
    struct tsd_read_stream *rs;
    const struct ts_shard_info *si;
    uint32_t shard = q->u.read.shard, len = q->u.read.len, npieces;
    uint64_t off = q->u.read.off, end;
    struct ts_wr w;
    int rc;

    if (q->u.read.placed != !!(h->flags & TS_F_RDMA)) {
        tsd_reply_error(c, h, TS_EPROTO,
                        "read %s/%u: flag RDMA and the placement fields must come together", name,
                        shard);
        return;
    }
    if (q->u.read.placed && !c->rdma) {
        tsd_reply_error(c, h, TS_EINVAL,
                        "read %s/%u: data placement (flag RDMA) needs an RDMA session", name,
                        shard);
        return;
    }
    if (len > TS_MAX_READ) {
        tsd_reply_error(c, h, TS_ETOOBIG, "read %s/%u: %u bytes asked, at most %u per request",
                        name, shard, len, TS_MAX_READ);
        return;
    }
    if (atomic_load(&s->epoch) && !tsd_pg_serves(s, name, shard)) {
        tsd_reply_error(c, h, TS_EBUSY,
                        "read %s/%u: this node is recovering PG %u (it may lack writes or deletes "
                        "made while it was away); another replica serves it",
                        name, shard, tsd_pg_of(s, name, shard));
        return;
    }
    rs = calloc(1, sizeof(*rs));
    if (!rs) {
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    snprintf(rs->name, sizeof(rs->name), "%s", name);
    rc = ts_store_read_open(s->store, name, shard, 0, &rs->ctx);
    if (rc) {
        if (rc == TS_EINCOMPLETE)
            tsd_reply_error(c, h, rc, "read %s/%u: shard is still being written (not sealed)", name,
                            shard);
        else
            ops_reply_store_error(c, h, rc, name, shard);
        if (rc == TS_ENOENT && atomic_load(&s->epoch))
            tsd_ec_wanted_note_missing(s, name, shard); /* a fragment lost here: repair it */
        goto out_free;
    }
    si = ts_read_ctx_info(rs->ctx);
    if (off > si->size) {
        tsd_reply_error(c, h, TS_ERANGE, "read %s/%u: offset %llu is past the end (%llu bytes)",
                        name, shard, (unsigned long long)off, (unsigned long long)si->size);
        goto out_free;
    }
    end = off + TS_MIN((uint64_t)len, si->size - off);
    rs->pos = off;
    rs->end = end;
    rs->chunk_size = si->chunk_size;
    rs->req_id = h->req_id;
    rs->shard = shard;
    rs->t0_ns = c->t0_ns;
    rs->placed = q->u.read.placed;
    rs->start = off;
    rs->raddr = q->u.read.raddr;
    rs->rkey = q->u.read.rkey;
    npieces = end > off ? (uint32_t)((end - 1) / si->chunk_size - off / si->chunk_size + 1) : 0;
    rs->first_idx = (uint32_t)(off / si->chunk_size);
    rs->last_idx = npieces ? (uint32_t)((end - 1) / si->chunk_size) : rs->first_idx;
    if ((h->flags & TS_F_VERIFY) && npieces) {
        /* The client found bytes failing their CRC: drop the cached copies of the range, so
         * that this read comes from the store (verified again as it fills the cache). */
        TS_WARN(FAC, TS_ECORRUPT,
                "read %s/%u [%llu, %llu): the client asks for a read from the store (bytes failed "
                "their CRC): cached chunks %u-%u evicted",
                name, shard, (unsigned long long)off, (unsigned long long)end, rs->first_idx,
                rs->last_idx);
        STAT_ADD(&c->w->stats, corrupt_chunks, 1);
        for (uint32_t idx = rs->first_idx; idx <= rs->last_idx; idx++)
            ts_read_ctx_evict(rs->ctx, idx);
    }

    /* Piece table. The first and last chunks are read and verified now (their CRCs may need
     * computing over a partial range); whole middle chunks carry their stored CRC. */
    tsd_reply_begin(&w);
    ts_wr_u64(&w, si->size);
    ts_wr_u32(&w, npieces);
    for (uint32_t i = 0; i < npieces; i++) {
        uint32_t idx = rs->first_idx + i, crc, clen;
        uint64_t cstart = (uint64_t)idx * si->chunk_size;
        uint64_t ps = TS_MAX(cstart, off);
        uint64_t pe = TS_MIN(cstart + si->chunk_size, end);
        struct ts_chunk_ref *ref = NULL;

        if (i == 0)
            ref = &rs->first;
        else if (i == npieces - 1)
            ref = &rs->last;
        if (ref) {
            rc = ts_read_ctx_piece(rs->ctx, idx, ps - cstart, pe - ps, ref);
            if (rc) {
                ts_wr_fini(&w);
                if (rc == TS_ECORRUPT)
                    STAT_ADD(&c->w->stats, corrupt_chunks, 1);
                tsd_repair_chunk(s, name, shard, idx, rc);
                tsd_reply_error(c, h, rc, "read %s/%u: chunk %u: %s", name, shard, idx,
                                ts_strerror(rc));
                goto out_free;
            }
            if (ts_chunk_ref_whole(ref, ps - cstart, pe - ps)) {
                crc = ref->crc; /* the stored CRC: the client checks the bytes against it */
            } else {
                /* A partial piece gets a CRC computed here, as its bytes are checked against
                 * their sub-blocks' CRCs: a cached copy whose memory went bad, or sub-blocks
                 * read from a damaged file, and the whole chunk is read again and verified. */
                if (ts_chunk_ref_check_crc(ref, ps - cstart, pe - ps, &crc) != 0) {
                    int piece = ref->piece; /* if so, the whole chunk's read counts it */

                    TS_ERROR(FAC, TS_ECORRUPT,
                             "%s of chunk %u of %s/%u failed its check: read again whole",
                             piece ? "sub-blocks read from disk" : "cached copy", idx, name, shard);
                    if (!piece)
                        STAT_ADD(&c->w->stats, corrupt_chunks, 1);
                    ts_chunk_ref_release(ref);
                    ts_read_ctx_evict(rs->ctx, idx);
                    rc = ts_read_ctx_chunk(rs->ctx, idx, ref);
                    if (rc) {
                        if (rc == TS_ECORRUPT)
                            STAT_ADD(&c->w->stats, corrupt_chunks, 1);
                        tsd_repair_chunk(s, name, shard, idx, rc);
                    } else {
                        rc = ts_chunk_ref_check_crc(ref, ps - cstart, pe - ps, &crc);
                    }
                    if (rc) {
                        ts_wr_fini(&w);
                        tsd_reply_error(c, h, rc, "read %s/%u: chunk %u: %s", name, shard, idx,
                                        ts_strerror(rc));
                        goto out_free;
                    }
                }
            }
        } else {
            ts_read_ctx_chunk_crc(rs->ctx, idx, &crc, &clen);
        }
        ts_wr_u32(&w, (uint32_t)(pe - ps));
        ts_wr_u32(&w, crc);
    }
    /* The frame length covers the data that the stream will add. */
    if (!w.err && rs->placed) {
        /* The head and table go out once every byte is written into the client's region. */
        struct ts_frame_hdr rh = {TS_PROTO_VERSION, h->opcode, TS_F_REPLY | TS_F_RDMA,
                                  h->req_id,        s->epoch,  (uint32_t)(w.len - TS_HDR_LEN)};
        ts_frame_encode(w.buf, &rh);
        STAT_ADD(&c->w->stats, bytes_out, w.len);
        rs->head_len = w.len;
        rs->reply = w.buf;
        rs->reply_len = w.len;
        w.buf = NULL;
        ts_wr_fini(&w);
        c->rs = rs;
        if (!tsd_stream_continue(c))
            tsd_conn_pause(c);
        return;
    }
    if (!w.err) {
        struct ts_frame_hdr rh = {TS_PROTO_VERSION, h->opcode,
                                  TS_F_REPLY,       h->req_id,
                                  s->epoch,         (uint32_t)(w.len - TS_HDR_LEN + (end - off))};
        struct evbuffer *out = tsd_conn_out(c);
        ts_frame_encode(w.buf, &rh);
        STAT_ADD(&c->w->stats, bytes_out, w.len);
        rs->head_len = w.len;
        /* By reference: libevent 2.1 refuses evbuffer_add() right after a file segment (a
         * previous reply's sendfile piece), while a reference is always a chain of its own. */
        if (evbuffer_add_reference(out, w.buf, w.len, hdr_free_cb, w.buf) != 0) {
            ts_wr_fini(&w);
            goto out_free;
        }
        w.buf = NULL;
        ts_wr_fini(&w);
        c->rs = rs;
        /* Most replies fit the budget at once; only a stream that must wait for the peer
         * pauses the connection's input (no event churn per small read). */
        if (!tsd_stream_continue(c))
            tsd_conn_pause(c);
        return;
    }
    ts_wr_fini(&w);
    tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
out_free:
    tsd_stream_free(rs);
}
