/*
 * The per-PG operation log and the PG's durable peering facts (ts_store.h, "per-PG operation
 * log"; docs/architecture.md "Peering").
 *
 * Keys:
 *   oplog  pg(be32) seq(be64)  -> log entry: v2 = 0x82, epoch, type, time, dataset, policy,
 *                                 incarnation, shard, size, crc, nchunks, CRC32C of all of it
 *   meta   'P' pg(be32)        -> PG state: v4 = 0x04, applied, head epoch, promised, last epoch
 *                                 started, write quorum, acting set (ids), pending intervals
 *                                 (epoch, write quorum, acting set)
 * Entries of the first format (no epoch, no CRC) and 8-byte PG records (applied only) are still
 * read, as epoch 0.
 *
 * The log lock orders sequence assignment and every read-modify-write of a PG record.
 */
#include "store_internal.h"

#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAC "storage"
#define LOG_V2 0x82
#define PG_V2 0x02
#define PG_V3 0x03
#define PG_V4 0x04

static size_t key_log(uint8_t *k, uint32_t pg, uint64_t seq)
{
    ts_put_be32(k, pg);
    ts_put_be64(k + 4, seq);
    return 12;
}

static size_t key_pg(uint8_t *k, uint32_t pg)
{
    k[0] = 'P';
    ts_put_be32(k + 1, pg);
    return 5;
}

/* ---- PG state ------------------------------------------------------------------------------ */

static int rd_interval(struct ts_rd *r, struct ts_pg_interval *iv)
{
    iv->epoch = ts_rd_u64(r);
    iv->wq = ts_rd_u8(r);
    iv->n = ts_rd_u8(r);
    if (iv->n > TS_PG_MAX_ACTING)
        return TS_ECORRUPT;
    for (unsigned i = 0; i < iv->n; i++)
        ts_rd_str(r, iv->acting[i], sizeof(iv->acting[i]));
    return 0;
}

static int pg_state_decode(const char *v, size_t vlen, struct ts_pg_state *st)
{
    struct ts_rd r;
    uint8_t ver;

    memset(st, 0, sizeof(*st));
    if (vlen == 8) { /* first format: the applied sequence only */
        st->applied = ts_get_le64((const uint8_t *)v);
        return 0;
    }
    ts_rd_init(&r, v, vlen);
    ver = ts_rd_u8(&r);
    if (ver != PG_V2 && ver != PG_V3 && ver != PG_V4)
        return TS_ECORRUPT;
    st->applied = ts_rd_u64(&r);
    st->head_epoch = ts_rd_u64(&r);
    st->promised = ts_rd_u64(&r);
    st->les = ts_rd_u64(&r);
    st->wq = ts_rd_u8(&r);
    st->nacting = ts_rd_u8(&r);
    if (st->nacting > TS_PG_MAX_ACTING)
        return TS_ECORRUPT;
    for (unsigned i = 0; i < st->nacting; i++)
        ts_rd_str(&r, st->acting[i], sizeof(st->acting[i]));
    if (ver == PG_V3) { /* one pending interval */
        if (rd_interval(&r, &st->pending[0]))
            return TS_ECORRUPT;
        st->npending = st->pending[0].epoch ? 1 : 0;
    } else if (ver == PG_V4) {
        st->npending = ts_rd_u8(&r);
        if (st->npending > TS_PG_MAX_PENDING)
            return TS_ECORRUPT;
        for (unsigned k = 0; k < st->npending; k++)
            if (rd_interval(&r, &st->pending[k]))
                return TS_ECORRUPT;
    }
    return ts_rd_done(&r) ? TS_ECORRUPT : 0;
}

static int pg_state_get(ts_store *s, uint32_t pg, struct ts_pg_state *st)
{
    uint8_t k[5];
    char *v;
    size_t vlen;
    int rc = meta_get(s, k, key_pg(k, pg), &v, &vlen);

    memset(st, 0, sizeof(*st));
    if (rc == TS_ENOENT)
        return 0;
    if (rc)
        return rc;
    rc = pg_state_decode(v, vlen, st);
    rocksdb_free(v);
    if (rc)
        TS_ERROR(FAC, rc, "PG %u: unreadable PG record", pg);
    return rc;
}

/* Adds the PG record to batch b (TS_ENOMEM on failure, nothing added). */
static int pg_state_put(ts_store *s, rocksdb_writebatch_t *b, uint32_t pg,
                        const struct ts_pg_state *st)
{
    uint8_t k[5];
    struct ts_wr w;
    int rc;

    ts_wr_init(&w);
    ts_wr_u8(&w, PG_V4);
    ts_wr_u64(&w, st->applied);
    ts_wr_u64(&w, st->head_epoch);
    ts_wr_u64(&w, st->promised);
    ts_wr_u64(&w, st->les);
    ts_wr_u8(&w, st->wq);
    ts_wr_u8(&w, st->nacting);
    for (unsigned i = 0; i < st->nacting && i < TS_PG_MAX_ACTING; i++)
        ts_wr_str(&w, st->acting[i]);
    ts_wr_u8(&w, st->npending);
    for (unsigned j = 0; j < st->npending && j < TS_PG_MAX_PENDING; j++) {
        const struct ts_pg_interval *iv = &st->pending[j];
        ts_wr_u64(&w, iv->epoch);
        ts_wr_u8(&w, iv->wq);
        ts_wr_u8(&w, iv->n);
        for (unsigned i = 0; i < iv->n && i < TS_PG_MAX_ACTING; i++)
            ts_wr_str(&w, iv->acting[i]);
    }
    rc = w.err;
    if (!rc)
        rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_pg(k, pg),
                                  (const char *)w.buf, w.len);
    ts_wr_fini(&w);
    return rc;
}

static int pg_state_write(ts_store *s, uint32_t pg, const struct ts_pg_state *st, const char *what)
{
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    int rc = pg_state_put(s, b, pg, st);

    if (!rc)
        rc = batch_write(s, b, what);
    rocksdb_writebatch_destroy(b);
    return rc;
}

int ts_store_pg_state(ts_store *s, uint32_t pg, struct ts_pg_state *out)
{
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, pg, out);
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

int ts_store_pg_promise(ts_store *s, uint32_t pg, uint64_t epoch, struct ts_pg_state *out)
{
    struct ts_pg_state st;
    int rc;

    if (!s)
        return TS_EINVAL;
    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, pg, &st);
    if (rc == 0 && epoch < st.promised)
        rc = TS_ESTALE;
    if (rc == 0 && epoch > st.promised) {
        st.promised = epoch;
        rc = pg_state_write(s, pg, &st, "PG promise");
    }
    if (out)
        *out = st;
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

/* The same acting set (in any order) and write quorum: an older pending interval with them is
 * replaced by a newer one, as peering asks the same of both (q of that set). */
static int same_interval_set(const struct ts_pg_interval *iv, uint8_t wq, const char (*acting)[64],
                             uint8_t nacting)
{
    if (iv->wq != wq || iv->n != nacting)
        return 0;
    for (unsigned i = 0; i < nacting; i++) {
        unsigned j = 0;
        while (j < iv->n && strcmp(iv->acting[j], acting[i]))
            j++;
        if (j == iv->n)
            return 0;
    }
    return 1;
}

/* Checks an interval's arguments, takes the log lock and reads the PG's state: 0 with the lock
 * held (the caller unlocks), or an error with it released. */
static int interval_update_begin(ts_store *s, uint32_t pg, const char (*acting)[64],
                                 uint8_t nacting, struct ts_pg_state *st)
{
    int rc;

    if (!s || nacting > TS_PG_MAX_ACTING || (nacting && !acting))
        return TS_EINVAL;
    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, pg, st);
    if (rc)
        pthread_mutex_unlock(&s->loglock);
    return rc;
}

int ts_store_pg_prepare(ts_store *s, uint32_t pg, uint64_t epoch, uint8_t wq,
                        const char (*acting)[64], uint8_t nacting, int member, uint64_t head_epoch,
                        uint64_t head_seq, int *recorded)
{
    struct ts_pg_state st;
    int rc;

    *recorded = 0;
    rc = interval_update_begin(s, pg, acting, nacting, &st);
    if (rc)
        return rc;
    if (rc == 0 && epoch < st.promised)
        rc = TS_ESTALE;
    if (rc == 0) {
        st.promised = epoch;
        /* A member of the new acting set records the interval only once it holds the
         * primary's log: every write the interval starts from is then on enough of it. */
        if (!member || (st.head_epoch == head_epoch && st.applied == head_seq)) {
            /* Kept beside the other pending intervals: any of them may have started, and
             * only a commit at or above one says it no longer matters. */
            unsigned k = 0;
            while (k < st.npending && st.pending[k].epoch != epoch &&
                   !same_interval_set(&st.pending[k], wq, acting, nacting))
                k++;
            if (k == st.npending && k < TS_PG_MAX_PENDING)
                st.npending++;
            if (k < st.npending) {
                struct ts_pg_interval *iv = &st.pending[k];
                iv->epoch = epoch;
                iv->wq = wq;
                iv->n = nacting;
                for (unsigned i = 0; i < nacting; i++)
                    snprintf(iv->acting[i], sizeof(iv->acting[i]), "%s", acting[i]);
                *recorded = 1;
            } else {
                TS_WARN(FAC, TS_EBUSY,
                        "PG %u: %d intervals pending already: epoch %llu not "
                        "recorded",
                        pg, TS_PG_MAX_PENDING, (unsigned long long)epoch);
            }
        }
        rc = pg_state_write(s, pg, &st, "PG prepare");
    }
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

int ts_store_pg_commit(ts_store *s, uint32_t pg, uint64_t epoch, uint8_t wq,
                       const char (*acting)[64], uint8_t nacting)
{
    struct ts_pg_state st;
    int rc;

    rc = interval_update_begin(s, pg, acting, nacting, &st);
    if (rc)
        return rc;
    if (rc == 0 && epoch > st.les) {
        if (epoch > st.promised)
            st.promised = epoch;
        st.les = epoch;
        st.wq = wq;
        st.nacting = nacting;
        for (unsigned i = 0; i < nacting; i++)
            snprintf(st.acting[i], sizeof(st.acting[i]), "%s", acting[i]);
        for (unsigned k = 0; k < st.npending;) {
            if (st.pending[k].epoch <= epoch) {
                st.pending[k] = st.pending[--st.npending];
                continue;
            }
            k++;
        }
        rc = pg_state_write(s, pg, &st, "PG commit");
    }
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

/* ---- log entries --------------------------------------------------------------------------- */

static void log_encode(struct ts_wr *w, const struct ts_log_rec *l)
{
    size_t start = w->len;

    ts_wr_u8(w, LOG_V2);
    ts_wr_u64(w, l->epoch);
    ts_wr_u8(w, (uint8_t)l->type);
    ts_wr_u64(w, l->time_ns);
    ts_wr_str(w, l->dataset);
    ts_wr_u8(w, l->policy.core);
    ts_wr_u8(w, l->policy.fringe);
    ts_wr_u8(w, l->policy.min_core);
    ts_wr_u32(w, l->policy.chunk_size);
    ts_wr_u64(w, l->inc);
    ts_wr_u32(w, l->shard);
    ts_wr_u64(w, l->size);
    ts_wr_u32(w, l->crc);
    ts_wr_u32(w, l->nchunks);
    ts_wr_u8(w, l->policy.record_format);
    if (!w->err)
        ts_wr_u32(w, ts_crc32c(0, w->buf + start, w->len - start));
}

static int log_decode(const char *v, size_t vlen, uint32_t pg, uint64_t seq, struct ts_log_rec *l)
{
    struct ts_rd r;

    memset(l, 0, sizeof(*l));
    ts_rd_init(&r, v, vlen);
    l->pg = pg;
    l->seq = seq;
    if (vlen && (uint8_t)v[0] == LOG_V2) {
        if (vlen < 5 || ts_crc32c(0, v, vlen - 4) != ts_get_le32((const uint8_t *)v + vlen - 4))
            return TS_ECORRUPT;
        r.len = vlen - 4;
        ts_rd_u8(&r);
        l->epoch = ts_rd_u64(&r);
    }
    l->type = ts_rd_u8(&r);
    l->time_ns = ts_rd_u64(&r);
    ts_rd_str(&r, l->dataset, sizeof(l->dataset));
    l->policy.core = ts_rd_u8(&r);
    l->policy.fringe = ts_rd_u8(&r);
    l->policy.min_core = ts_rd_u8(&r);
    l->policy.chunk_size = ts_rd_u32(&r);
    if (l->epoch || (vlen && (uint8_t)v[0] == LOG_V2))
        l->inc = ts_rd_u64(&r);
    l->shard = ts_rd_u32(&r);
    l->size = ts_rd_u64(&r);
    l->crc = ts_rd_u32(&r);
    l->nchunks = ts_rd_u32(&r);
    if (r.len - r.off == 1) /* entries written before it existed end here */
        l->policy.record_format = ts_rd_u8(&r);
    return ts_rd_done(&r) ? TS_ECORRUPT : 0;
}

static int log_get(ts_store *s, uint32_t pg, uint64_t seq, struct ts_log_rec *out)
{
    uint8_t k[12];
    char *err = NULL, *v;
    size_t vlen;
    int rc;

    v = rocksdb_get_cf(s->db, s->ro_meta, s->cf[CF_OPLOG], (const char *)k, key_log(k, pg, seq),
                       &vlen, &err);
    if (err)
        return from_rocksdb(err, "log read");
    if (!v)
        return TS_ENOENT;
    rc = log_decode(v, vlen, pg, seq, out);
    rocksdb_free(v);
    return rc;
}

int ts_log_rec_same(const struct ts_log_rec *a, const struct ts_log_rec *b)
{
    return a->epoch == b->epoch && a->type == b->type && a->shard == b->shard && a->crc == b->crc &&
           a->size == b->size && a->inc == b->inc && !strcmp(a->dataset, b->dataset);
}

int ts_pglog_begin(ts_store *s, struct ts_log_rec *log, rocksdb_writebatch_t *b)
{
    struct ts_pg_state st;
    struct ts_log_rec have;
    uint8_t k[12];
    struct ts_wr w;
    int rc;

    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, log->pg, &st);
    if (rc)
        goto out_unlock;
    if (log->fence && log->fence < st.promised) {
        rc = TS_ESTALE; /* a newer primary's peering got here first: not this write */
        goto out_unlock;
    }
    if (log->seq == 0) {
        log->seq = st.applied + 1;
    } else if (log->seq <= st.applied) {
        /* Already here: the same entry (a retry) or a different one (divergent logs). */
        rc = log_get(s, log->pg, log->seq, &have);
        if (rc == TS_ENOENT)
            rc = TS_EEXIST; /* trimmed here: older than anything still compared */
        else if (rc == 0)
            rc = ts_log_rec_same(&have, log) ? TS_EEXIST : TS_ERANGE;
        goto out_unlock;
    } else if (log->seq > st.applied + 1 || log->epoch < st.head_epoch) {
        rc = TS_ERANGE; /* a gap, or an entry older than our head: the sender must look again */
        goto out_unlock;
    }
    if (!log->time_ns)
        log->time_ns = ts_now_wall_ns();
    ts_wr_init(&w);
    log_encode(&w, log);
    if (w.err) {
        rc = w.err;
        ts_wr_fini(&w);
        goto out_unlock;
    }
    rocksdb_writebatch_put_cf(b, s->cf[CF_OPLOG], (const char *)k, key_log(k, log->pg, log->seq),
                              (const char *)w.buf, w.len);
    ts_wr_fini(&w);
    st.applied = log->seq;
    st.head_epoch = log->epoch;
    rc = pg_state_put(s, b, log->pg, &st);
    if (rc)
        goto out_unlock;
    return 0;
out_unlock:
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

void ts_pglog_end(ts_store *s)
{
    pthread_mutex_unlock(&s->loglock);
}

int ts_store_log_append(ts_store *s, struct ts_log_rec *log)
{
    rocksdb_writebatch_t *b;
    int rc;

    if (!s || !log)
        return TS_EINVAL;
    b = rocksdb_writebatch_create();
    rc = ts_pglog_begin(s, log, b);
    if (rc == 0) {
        rc = batch_write(s, b, "log append");
        ts_pglog_end(s);
    }
    rocksdb_writebatch_destroy(b);
    return rc;
}

int ts_store_pg_applied(ts_store *s, uint32_t pg, uint64_t *applied, uint64_t *oldest)
{
    struct ts_pg_state st;
    uint8_t k[12];
    rocksdb_iterator_t *it;
    int rc;

    rc = ts_store_pg_state(s, pg, &st);
    *applied = st.applied;
    if (rc || !oldest)
        return rc;
    *oldest = 0;
    it = rocksdb_create_iterator_cf(s->db, s->ro_meta, s->cf[CF_OPLOG]);
    rocksdb_iter_seek(it, (const char *)k, key_log(k, pg, 0));
    if (rocksdb_iter_valid(it)) {
        size_t klen;
        const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen == 12 && ts_get_be32(key) == pg)
            *oldest = ts_get_be64(key + 4);
    }
    rocksdb_iter_destroy(it);
    return 0;
}

int ts_store_log_read(ts_store *s, uint32_t pg, uint64_t seq, struct ts_log_rec *out)
{
    if (!s || !out)
        return TS_EINVAL;
    return log_get(s, pg, seq, out);
}

int ts_store_log_trim(ts_store *s, uint32_t pg, uint64_t keep)
{
    uint64_t applied;
    uint8_t lo[12], hi[12];
    char *err = NULL;
    int rc = ts_store_pg_applied(s, pg, &applied, NULL);

    if (rc || applied <= keep)
        return rc;
    rocksdb_delete_range_cf(s->db, s->wo, s->cf[CF_OPLOG], (const char *)lo, key_log(lo, pg, 0),
                            (const char *)hi, key_log(hi, pg, applied - keep + 1), &err);
    return from_rocksdb(err, "log trim");
}

int ts_store_log_trim_to(ts_store *s, uint32_t pg, uint64_t upto)
{
    uint8_t lo[12], hi[12];
    char *err = NULL;

    if (!s || !upto)
        return s ? 0 : TS_EINVAL;
    rocksdb_delete_range_cf(s->db, s->wo, s->cf[CF_OPLOG], (const char *)lo, key_log(lo, pg, 0),
                            (const char *)hi, key_log(hi, pg, upto + 1), &err);
    return from_rocksdb(err, "log trim");
}

int ts_store_pg_set_applied(ts_store *s, uint32_t pg, uint64_t seq, uint64_t epoch, uint64_t fence)
{
    struct ts_pg_state st;
    int rc;

    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, pg, &st);
    if (rc == 0 && fence && fence < st.promised)
        rc = TS_ESTALE;
    if (rc == 0 && (st.applied > seq || st.head_epoch > epoch ||
                    (st.applied == seq && st.head_epoch != epoch))) {
        /* A backfill's end never moves the head back, nor past entries it holds that are not
         * the sender's: that would drop them without a rollback decision (ts_peering_rollback);
         * the sender compares again. */
        TS_WARN(FAC, TS_ERANGE,
                "PG %u: refused to set the head back from (%llu, %llu) to (%llu, %llu)", pg,
                (unsigned long long)st.head_epoch, (unsigned long long)st.applied,
                (unsigned long long)epoch, (unsigned long long)seq);
        rc = TS_ERANGE;
    }
    if (rc == 0) {
        st.applied = seq;
        st.head_epoch = epoch;
        rc = pg_state_write(s, pg, &st, "set applied");
    }
    pthread_mutex_unlock(&s->loglock);
    return rc;
}

int ts_store_pg_log_tail(ts_store *s, uint32_t pg, struct ts_log_pos *out, size_t max, size_t *n)
{
    struct ts_pg_state st;
    uint8_t k[12];
    rocksdb_iterator_t *it;
    int rc;

    *n = 0;
    rc = ts_store_pg_state(s, pg, &st);
    if (rc || st.applied == 0)
        return rc;
    it = rocksdb_create_iterator_cf(s->db, s->ro_meta, s->cf[CF_OPLOG]);
    rocksdb_iter_seek_for_prev(it, (const char *)k, key_log(k, pg, st.applied));
    while (*n < max && rocksdb_iter_valid(it)) {
        size_t klen, vlen;
        const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        struct ts_log_rec rec;
        if (klen != 12 || ts_get_be32(key) != pg)
            break;
        if (log_decode(v, vlen, pg, ts_get_be64(key + 4), &rec) != 0)
            break;
        out[*n].seq = rec.seq;
        out[*n].epoch = rec.epoch;
        (*n)++;
        rocksdb_iter_prev(it);
    }
    rocksdb_iter_destroy(it);
    return 0;
}

/* Notes a rolled-back entry in the ring (under loglock). */
static void rolled_back_note(ts_store *s, const struct ts_log_rec *rec, uint64_t now)
{
    struct ts_rolled_back *r;

    if (!s->rb && !(s->rb = calloc(TS_ROLLED_BACK_KEEP, sizeof(*s->rb))))
        return;
    r = &s->rb[s->nrb++ % TS_ROLLED_BACK_KEEP];
    r->pg = rec->pg;
    r->shard = rec->shard;
    r->seq = rec->seq;
    r->epoch = rec->epoch;
    r->at_ns = now;
    snprintf(r->dataset, sizeof(r->dataset), "%s", rec->dataset);
}

int ts_store_rolled_back(ts_store *s, struct ts_rolled_back *out, size_t max, size_t *n,
                         uint64_t *sealing, uint64_t *total)
{
    uint64_t have, first;

    pthread_mutex_lock(&s->loglock);
    have = s->nrb < TS_ROLLED_BACK_KEEP ? s->nrb : TS_ROLLED_BACK_KEEP;
    if (have > max)
        have = max;
    first = s->nrb - have;
    for (uint64_t i = 0; i < have && s->rb; i++)
        out[i] = s->rb[(first + i) % TS_ROLLED_BACK_KEEP];
    *n = s->rb ? (size_t)have : 0;
    if (sealing)
        *sealing = s->nrb;
    if (total)
        *total = s->nrb_all;
    pthread_mutex_unlock(&s->loglock);
    return 0;
}

int ts_store_pg_truncate(ts_store *s, uint32_t pg, uint64_t seq, uint64_t epoch, uint64_t fence,
                         unsigned *removed)
{
    struct ts_pg_state st;
    struct ts_log_rec rec;
    uint8_t lo[12], hi[12];
    rocksdb_writebatch_t *b;
    int rc;

    if (removed)
        *removed = 0;
    rc = ts_store_pg_state(s, pg, &st);
    if (rc || st.applied <= seq)
        return rc;
    if (fence && fence < st.promised)
        return TS_ESTALE;
    if (fence && st.head_epoch > fence) {
        /* Entries of an epoch newer than the sender's are never divergent from where it stands
         * (peering would have it pull them): defence in depth behind ts_peering_rollback(). */
        TS_WARN(FAC, TS_EPERM,
                "PG %u: refused to roll back to %llu: the log holds entries up to (%llu, %llu), "
                "newer than the sender's epoch %llu",
                pg, (unsigned long long)seq, (unsigned long long)st.head_epoch,
                (unsigned long long)st.applied, (unsigned long long)fence);
        return TS_EPERM;
    }
    /* First the shards the divergent entries sealed (never acknowledged: they were not on a
     * write quorum), then the entries: a crash in between leaves entries without shards, which
     * the next comparison finds divergent again. */
    for (uint64_t q = seq + 1; q <= st.applied; q++) {
        if (log_get(s, pg, q, &rec) != 0 || rec.type != TS_LOG_SEAL)
            continue;
        rc = ts_store_shard_delete(s, rec.dataset, rec.shard);
        if (rc && rc != TS_ENOENT)
            return rc;
        if (removed)
            (*removed)++;
        TS_WARN(FAC, 0, "PG %u: rolled back divergent entry %llu (epoch %llu, %s/%u)", pg,
                (unsigned long long)q, (unsigned long long)rec.epoch, rec.dataset, rec.shard);
    }
    pthread_mutex_lock(&s->loglock);
    rc = pg_state_get(s, pg, &st);
    if (rc == 0 && fence && fence < st.promised)
        rc = TS_ESTALE;
    if (rc == 0 && fence && st.head_epoch > fence)
        rc = TS_EPERM;
    if (rc == 0 && st.applied > seq) {
        uint64_t old_head = st.applied;
        b = rocksdb_writebatch_create();
        rocksdb_writebatch_delete_range_cf(b, s->cf[CF_OPLOG], (const char *)lo,
                                           key_log(lo, pg, seq + 1), (const char *)hi,
                                           key_log(hi, pg, st.applied + 1));
        st.applied = seq;
        st.head_epoch = epoch;
        rc = pg_state_put(s, b, pg, &st);
        if (!rc) {
            /* What goes, for the record: read before the write removes it, noted once it did
             * (the newest TS_ROLLED_BACK_KEEP are kept; older ones only count). */
            uint64_t now = ts_now_wall_ns(), from = seq + 1;
            struct ts_log_rec *gone;
            size_t ngone = 0;
            if (old_head - seq > TS_ROLLED_BACK_KEEP)
                from = old_head - TS_ROLLED_BACK_KEEP + 1;
            gone = calloc(old_head - from + 1, sizeof(*gone));
            for (uint64_t q = from; gone && q <= old_head; q++)
                if (log_get(s, pg, q, &gone[ngone]) == 0 && gone[ngone].type == TS_LOG_SEAL)
                    ngone++;
            rc = batch_write(s, b, "log truncate");
            if (rc == 0) {
                s->nrb_all += old_head - seq;
                for (size_t k = 0; k < ngone; k++)
                    rolled_back_note(s, &gone[k], now);
            }
            free(gone);
        }
        rocksdb_writebatch_destroy(b);
    }
    pthread_mutex_unlock(&s->loglock);
    return rc;
}
