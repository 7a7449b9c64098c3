/*
 * Scrub (every chunk of a dataset or of the store read back from disk and checked against its
 * CRC32C) and chunk repair (a damaged chunk rewritten with a replica's verified copy).
 */
#include "store_internal.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define FAC "storage"

struct scrub_arg {
    ts_store *s;
    const _Atomic int *cancel;
    uint64_t pace;         /* bytes a second at most (0: no limit) */
    uint64_t t0_ns, paced; /* when the scrub began, the bytes it has read */
    uint64_t only_id;      /* 0: all datasets */
    uint64_t dropped_id;   /* the last dataset seen with its replica bytes dropped */
    void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx, int rc);
    void *arg;
    struct ts_scrub_report *rep;
};

static int cancelled(const struct scrub_arg *a)
{
    return a->cancel && atomic_load(a->cancel);
}

/* Before reading len more bytes: sleeps until they fit the pace (in steps, so a cancel is seen
 * within 50 ms). A scrub more than a second behind its pace moves its start up instead of
 * reading unpaced until it has caught up. */
static void pace(struct scrub_arg *a, uint64_t len)
{
    uint64_t due;

    if (!a->pace)
        return;
    due = a->t0_ns + (uint64_t)((double)a->paced * 1e9 / (double)a->pace);
    if (ts_now_mono_ns() > due + 1000000000ull) { /* behind (a slow disk): no catch-up burst */
        a->t0_ns += ts_now_mono_ns() - due - 1000000000ull;
        due = a->t0_ns + (uint64_t)((double)a->paced * 1e9 / (double)a->pace);
    }
    a->paced += len;
    for (uint64_t now = ts_now_mono_ns(); now < due && !cancelled(a); now = ts_now_mono_ns()) {
        uint64_t ns = TS_MIN(due - now, 50000000ull);
        struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static int scrub_shard_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct scrub_arg *a = arg;
    ts_read_ctx *r;
    char name[TS_NAME_MAX + 1] = "?";
    struct ts_dataset_info d;
    uint64_t dsid;
    uint32_t shard;
    int rc;

    if (klen != 13)
        return 0;
    if (cancelled(a))
        return TS_ECANCELED;
    dsid = ts_get_be64(k + 1);
    shard = ts_get_be32(k + 9);
    if (a->only_id && dsid != a->only_id)
        return 0;
    id_name(a->s, dsid, name);
    if (dsid != a->dropped_id && dataset_get(a->s, name, &d) == 0 && d.policy.ec_dropped)
        a->dropped_id = dsid;
    if (dsid == a->dropped_id)
        return 0; /* no bytes here: its fragments are scrubbed as datasets of their own */
    rc = read_open_id(a->s, dsid, shard, 1, 1, &r);
    if (rc == TS_ENOENT)
        return 0; /* deleted since the scan began (a paced scrub takes hours) */
    if (rc) {
        a->rep->corrupt++;
        if (a->cb)
            a->cb(a->arg, name, shard, UINT32_MAX, rc);
        return 0;
    }
    a->rep->shards++;
    for (uint32_t i = 0; i < r->info.nchunks && !cancelled(a); i++) {
        struct ts_chunk_ref ref;
        pace(a, r->info.chunk_size);
        rc = ts_read_ctx_chunk(r, i, &ref);
        a->rep->chunks++;
        atomic_fetch_add_explicit(&a->s->scrub_chunks, 1, memory_order_relaxed);
        if (rc == TS_ENOENT) /* its dataset deleted while it was scrubbed */
            break;
        if (rc == 0) {
            a->rep->bytes += ref.len;
            atomic_fetch_add_explicit(&a->s->scrub_bytes, ref.len, memory_order_relaxed);
            ts_chunk_ref_release(&ref);
        } else {
            a->rep->corrupt++;
            if (a->cb)
                a->cb(a->arg, name, shard, i, rc);
        }
    }
    ts_read_ctx_close(r);
    return 0;
}

int ts_store_scrub(ts_store *s, const char *dataset,
                   void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx, int rc),
                   void *arg, struct ts_scrub_report *report)
{
    return ts_store_scrub_ex(s, dataset, cb, arg, report, NULL);
}

int ts_store_scrub_ex(ts_store *s, const char *dataset,
                      void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx,
                                 int rc),
                      void *arg, struct ts_scrub_report *report, const _Atomic int *cancel)
{
    return ts_store_scrub_paced(s, dataset, cb, arg, report, cancel, 0);
}

int ts_store_scrub_paced(ts_store *s, const char *dataset,
                         void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t idx,
                                    int rc),
                         void *arg, struct ts_scrub_report *report, const _Atomic int *cancel,
                         uint64_t bytes_per_s)
{
    struct ts_scrub_report local;
    struct scrub_arg a = {s, cancel, bytes_per_s, ts_now_mono_ns(),        0, 0,
                          0, cb,     arg,         report ? report : &local};
    struct ts_dataset_info d;
    uint8_t prefix[9];
    size_t plen = 1;
    int rc;

    if (!s)
        return TS_EINVAL;
    memset(a.rep, 0, sizeof(*a.rep));
    prefix[0] = 'S';
    if (dataset) {
        rc = dataset_get(s, dataset, &d);
        if (rc)
            return rc;
        a.only_id = d.id;
        plen = key_id(prefix, 'S', d.id);
    }
    rc = meta_scan(s, prefix, plen, scrub_shard_cb, &a);
    if (rc == 0 && cancelled(&a))
        rc = TS_ECANCELED; /* the last shard's chunks were not all read */
    if (rc == 0)
        TS_INFO(FAC, "scrub %s: %llu shards, %llu chunks, %llu corrupt", dataset ? dataset : "all",
                (unsigned long long)a.rep->shards, (unsigned long long)a.rep->chunks,
                (unsigned long long)a.rep->corrupt);
    return rc;
}

int ts_store_chunk_repair(ts_store *s, const char *dataset, uint32_t shard, uint32_t idx,
                          const void *data, size_t len)
{
    struct ts_dataset_info d;
    ts_read_ctx *r;
    uint32_t crc, clen;
    uint8_t k[16];
    char *err = NULL;
    int rc;

    /* Also the chunks of a dataset whose replica bytes were dropped: put back (tier.c). */
    rc = dataset_get(s, dataset, &d);
    if (rc == 0)
        rc = read_open_id(s, d.id, shard, 0, 1, &r);
    if (rc)
        return rc;
    rc = ts_read_ctx_chunk_crc(r, idx, &crc, &clen);
    if (rc == 0 && (clen != len || ts_crc32c(0, data, len) != crc))
        rc = TS_ECORRUPT;
    if (rc == 0 && r->file) {
        rc = chunkfile_repair(s, r->dsid, shard, r->file, (uint64_t)idx * r->info.chunk_size, data,
                              len);
    } else if (rc == 0) {
        rocksdb_put_cf(s->db, s->wo, s->cf[CF_CHUNKS], (const char *)k,
                       key_chunk(k, r->dsid, shard, idx), data, len, &err);
        rc = from_rocksdb(err, "chunk repair");
    }
    if (rc == 0 && !d.policy.ec_dropped) /* a restore is told once, by whoever restores */
        TS_WARN(FAC, 0,
                "repaired chunk %u of %s/%u (%zu bytes): a replica's, or rebuilt from fragments",
                idx, dataset, shard, len);
    ts_read_ctx_close(r);
    return rc;
}

void ts_store_scrub_progress(ts_store *s, uint64_t *chunks, uint64_t *bytes)
{
    *chunks = atomic_load_explicit(&s->scrub_chunks, memory_order_relaxed);
    *bytes = atomic_load_explicit(&s->scrub_bytes, memory_order_relaxed);
}
