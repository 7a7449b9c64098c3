/* HINT: the ranges a reader will ask for next (docs/protocol.md "Hints"), queued to be read
 * ahead into the chunk cache (prefetch.c). Advisory: a range this node does not serve, of an
 * unknown dataset or past the bounds is counted and left; the reply says how many chunks were
 * queued, dropped over the bounds, and skipped, and the first range with a chunk dropped (the
 * client hints from there again later; every chunk after it is dropped too). */
#include "ops_internal.h"

#include "prefetch.h"
#include "ts_common.h"

void tsd_op_hint(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_readv *rq = &q->u.hint;
    struct tsd_server *s = c->w->srv;
    struct ts_dataset_info d;
    uint32_t queued = 0, dropped = 0, skipped = 0, chunk, first_dropped = rq->n;
    uint64_t last = UINT64_MAX; /* the last chunk queued or dropped (shard << 32 | idx) */
    struct ts_wr w;
    int rc;

    if (rq->n == 0 || rq->n > TS_HINT_MAX) {
        tsd_reply_error(c, h, TS_EINVAL, "hint %s: %u ranges; 1 to %u per request", rq->name, rq->n,
                        TS_HINT_MAX);
        return;
    }
    rc = ts_store_dataset_record(s->store, rq->name, &d);
    if (rc == 0 && d.policy.ec_dropped)
        rc = TS_EFRAGMENTED; /* nothing here to read ahead */
    if (rc) {
        tsd_reply_error(c, h, rc, "hint %s: %s", rq->name, ts_strerror(rc));
        return;
    }
    chunk = d.policy.chunk_size ? d.policy.chunk_size : 1;
    if (!c->pf)
        c->pf = tsd_prefetch_account(s->prefetch);
    for (uint32_t i = 0; i < rq->n; i++) {
        uint32_t shard, len, first, lastidx;
        uint64_t off;

        tsd_readv_at(rq, i, &shard, &off, &len);
        if (!len || !c->pf || (atomic_load(&s->epoch) && !tsd_pg_serves(s, rq->name, shard))) {
            skipped++; /* nothing, or not read here (another replica serves its PG) */
            continue;
        }
        first = (uint32_t)(off / chunk);
        lastidx = (uint32_t)((off + len - 1) / chunk);
        for (uint32_t idx = first; idx <= lastidx; idx++) {
            uint64_t key = (uint64_t)shard << 32 | idx;
            if (key == last) { /* ranges in the chunk just queued or dropped: counted once */
                skipped++;
                continue;
            }
            last = key;
            /* After the first drop, the rest are dropped too: the client hints them again from
             * there, in order, and no later chunk is read ahead of an earlier one. */
            if (!dropped && tsd_prefetch_add(s->prefetch, c->pf, d.id, shard, idx, chunk)) {
                queued++;
            } else {
                dropped++;
                first_dropped = TS_MIN(first_dropped, i);
            }
        }
    }
    if (dropped > 1)
        tsd_prefetch_drop(s->prefetch, dropped - 1); /* the first was counted when refused */
    tsd_reply_begin(&w);
    ts_wr_u32(&w, queued);
    ts_wr_u32(&w, dropped);
    ts_wr_u32(&w, skipped);
    ts_wr_u32(&w, first_dropped);
    tsd_reply_send(c, h, &w);
}
