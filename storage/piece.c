/*
 * Small reads from disk: a range of a chunk that is not cached, read by sub-blocks.
 *
 * A 4-100 KiB record in a 1 MiB chunk would otherwise cost the whole chunk: read, verified and
 * cached (read.c). When the chunk lives in a chunk file and its sub-block CRCs were kept
 * (subcrc.c), only the sub-blocks the range touches are read, into a buffer of their own, with
 * their stored CRCs; ts_chunk_ref_check_crc verifies each of them as the reply's CRC is computed
 * (one pass), before any byte is sent. Pieces are not cached: chunks enter the cache when read
 * whole (large reads, and the prefetch of hinted ranges).
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

/* A piece is read by sub-blocks when it is at most this part of its chunk. */
#define PIECE_MAX_SHARE 4

struct piece_entry {
    struct ts_cache_entry base; /* only its reference count and destructor are used */
    uint8_t *buf;
    uint32_t *subs;
};

static void piece_destroy(struct ts_cache_entry *e)
{
    struct piece_entry *p = (struct piece_entry *)e;

    free(p->buf);
    free(p->subs);
    free(p);
}

int ts_read_ctx_piece(ts_read_ctx *r, uint32_t idx, size_t in, size_t n, struct ts_chunk_ref *out)
{
    ts_store *s = r->s;
    uint32_t clen, *subs = NULL;
    size_t lo, hi, b0;
    struct piece_entry *p;
    int rc;

    if (!r->crcs || r->nocache || !r->file || idx >= r->info.nchunks ||
        r->info.chunk_size <= TS_SUB_BLOCK)
        return ts_read_ctx_chunk(r, idx, out);
    clen = read_chunk_len(r, idx);
    lo = in / TS_SUB_BLOCK * TS_SUB_BLOCK;
    hi = TS_MIN((size_t)clen, (in + n + TS_SUB_BLOCK - 1) / TS_SUB_BLOCK * TS_SUB_BLOCK);
    if (!n || in + n > clen || (hi - lo) * PIECE_MAX_SHARE > clen)
        return ts_read_ctx_chunk(r, idx, out);
    if (read_cached_chunk(r, idx, out) == 0)
        return 0;
    if (want_check(s, r->dsid, r->info.shard, idx)) {
        /* Hinted: read whole into the cache, where the next reads of it (and the prefetch)
         * find it. */
        r->wanted = 1;
        rc = ts_read_ctx_chunk(r, idx, out);
        r->wanted = 0;
        return rc;
    }
    if (subcrc_load(s, r->dsid, r->info.shard, idx, r->crcs[idx], clen, &subs) != 0)
        return ts_read_ctx_chunk(r, idx, out); /* none kept (older shard), or not usable */
    p = calloc(1, sizeof(*p));
    if (p)
        p->buf = malloc(hi - lo);
    if (!p || !p->buf) {
        free(p);
        free(subs);
        return TS_ENOMEM;
    }
    b0 = lo / TS_SUB_BLOCK;
    memmove(subs, subs + b0, 4 * subcrc_count(hi - lo)); /* from the piece's first sub-block */
    p->subs = subs;
    p->base.refs = 1;
    p->base.destroy = piece_destroy;
    rc = chunkfile_read(s, r->dsid, r->info.shard, r->file, (uint64_t)idx * r->info.chunk_size + lo,
                        p->buf, hi - lo);
    if (rc) {
        piece_destroy(&p->base);
        return ts_read_ctx_chunk(r, idx, out); /* reports a missing or short file its way */
    }
    atomic_fetch_add_explicit(&s->rd_pieces, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->rd_piece_bytes, hi - lo, memory_order_relaxed);
    memset(out, 0, sizeof(*out));
    out->data = p->buf;
    out->len = hi - lo;
    out->pin = &p->base;
    out->fd = -1;
    out->sub = p->subs;
    out->base = lo;
    out->piece = 1;
    return 0;
}
