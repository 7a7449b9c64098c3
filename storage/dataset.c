/*
 * Datasets: create (with an incarnation), stat, list, seal and delete (leaving a tombstone),
 * and the replication helpers: tombstones, and ensuring a dataset's incarnation.
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

/* ---- datasets ---------------------------------------------------------------------------- */

int ts_store_dataset_create(ts_store *s, const char *name, const struct ts_dataset_policy *p)
{
    return ts_store_dataset_create_inc(s, name, p, 0);
}

int ts_store_dataset_create_inc(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                                uint64_t incarnation)
{
    struct ts_dataset_info d, old;
    struct ts_dataset_policy def;
    uint8_t k[1 + TS_NAME_MAX], kid[9], rec[DS_REC_LEN], nbuf[8];
    char *v;
    size_t vlen;
    rocksdb_writebatch_t *b;
    uint64_t next = 1;
    int rc;

    if (!s || !ts_name_valid_store(name))
        return s ? TS_ENAME : TS_EINVAL;
    if (!p) {
        ts_dataset_policy_init(&def);
        p = &def;
    }
    memset(&d, 0, sizeof(d));
    d.policy = *p;
    d.policy.ec_k = d.policy.ec_m = d.policy.ec_dropped = 0; /* tiered once sealed (tier.c) */
    if (!d.policy.chunk_size)
        d.policy.chunk_size = TS_DEFAULT_CHUNK_SIZE;
    if (d.policy.chunk_size < TS_MIN_CHUNK_SIZE || d.policy.chunk_size > s->o.max_chunk_size ||
        d.policy.core < 1 || d.policy.min_core < 1 || d.policy.min_core > d.policy.core)
        return TS_EINVAL;

    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &old);
    if (rc == 0) {
        rc = TS_EEXIST;
        goto out_unlock;
    }
    if (rc != TS_ENOENT)
        goto out_unlock;
    k[0] = 'N';
    rc = meta_get(s, k, 1, &v, &vlen);
    if (rc == 0) {
        if (vlen == 8)
            next = ts_get_le64((const uint8_t *)v);
        rocksdb_free(v);
    } else if (rc != TS_ENOENT) {
        goto out_unlock;
    }
    d.id = next;
    d.state = TS_DS_OPEN;
    d.created_ns = incarnation ? incarnation : ts_now_wall_ns();
    ds_encode(rec, &d);
    ts_put_le64(nbuf, next + 1);

    b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, 1, (const char *)nbuf, 8);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name),
                              (const char *)rec, sizeof(rec));
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)kid, key_id(kid, 'I', d.id), name,
                              strlen(name));
    rc = batch_write(s, b, "dataset create");
    rocksdb_writebatch_destroy(b);
    if (rc == 0)
        TS_INFO(FAC, "created dataset %s (id %llu, chunk %u)", name, (unsigned long long)d.id,
                d.policy.chunk_size);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ts_store_dataset_record(ts_store *s, const char *name, struct ts_dataset_info *out)
{
    if (!s || !out)
        return TS_EINVAL;
    return dataset_get(s, name, out);
}

int ts_store_dataset_stat(ts_store *s, const char *name, struct ts_dataset_info *out)
{
    int rc;

    if (!s || !out)
        return TS_EINVAL;
    rc = dataset_get(s, name, out);
    if (rc)
        return rc;
    return shard_scan(s, out->id, out, NULL, NULL);
}

struct ds_list_arg {
    ts_store *s;
    int (*cb)(void *arg, const struct ts_dataset_info *info);
    void *arg;
    int count; /* count each dataset's shards (a scan of their records) */
};

static int ds_list_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct ds_list_arg *a = arg;
    struct ts_dataset_info d;
    char name[TS_NAME_MAX + 1];
    int rc;

    if (klen < 2 || klen - 1 > TS_NAME_MAX)
        return TS_ECORRUPT;
    memcpy(name, k + 1, klen - 1);
    name[klen - 1] = '\0';
    if (ts_frag_split(name, NULL, NULL))
        return 0; /* a fragment store of an erasure-coded dataset: not a dataset of its own */
    rc = ds_decode(v, vlen, name, &d);
    if (rc == 0 && a->count)
        rc = shard_scan(a->s, d.id, &d, NULL, NULL);
    return rc ? rc : a->cb(a->arg, &d);
}

static int ds_list(ts_store *s, int count, int (*cb)(void *arg, const struct ts_dataset_info *info),
                   void *arg)
{
    struct ds_list_arg a = {s, cb, arg, count};
    uint8_t prefix = 'D';

    if (!s || !cb)
        return TS_EINVAL;
    return meta_scan(s, &prefix, 1, ds_list_cb, &a);
}

int ts_store_dataset_list(ts_store *s, int (*cb)(void *arg, const struct ts_dataset_info *info),
                          void *arg)
{
    return ds_list(s, 1, cb, arg);
}

int ts_store_dataset_list_records(ts_store *s,
                                  int (*cb)(void *arg, const struct ts_dataset_info *info),
                                  void *arg)
{
    return ds_list(s, 0, cb, arg);
}

struct seal_check_arg {
    uint32_t expect;
    int rc;
};

static int seal_check_cb(void *arg, const struct ts_shard_info *si)
{
    struct seal_check_arg *a = arg;

    if (si->state != TS_SHARD_COMPLETE || si->shard != a->expect) {
        a->rc = TS_EINCOMPLETE;
        return TS_EINCOMPLETE;
    }
    a->expect++;
    return 0;
}

int ts_store_dataset_seal(ts_store *s, const char *name)
{
    return ts_store_dataset_seal_ex(s, name, 0);
}

/* Writes dataset record d of name again (under s->lock), durable per the sync policy. */
int ds_rewrite(ts_store *s, const char *name, const struct ts_dataset_info *d, const char *what)
{
    uint8_t k[1 + TS_NAME_MAX], rec[DS_REC_LEN];
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    int rc;

    ds_encode(rec, d);
    rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name),
                              (const char *)rec, sizeof(rec));
    rc = batch_write(s, b, what);
    rocksdb_writebatch_destroy(b);
    ds_invalidate(s, name);
    return rc;
}

int ts_store_dataset_seal_ex(ts_store *s, const char *name, int local_only)
{
    struct ts_dataset_info d;
    struct seal_check_arg a = {0, 0};
    int rc;

    if (!s)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc)
        goto out_unlock;
    if (d.state == TS_DS_SEALED) {
        rc = TS_ESEALED;
        goto out_unlock;
    }
    if (writer_active(s, d.id, 1, 0)) {
        rc = TS_EINCOMPLETE;
        goto out_unlock;
    }
    rc = local_only ? 0 : shard_scan(s, d.id, NULL, seal_check_cb, &a);
    if (rc) {
        TS_WARN(FAC, rc, "dataset %s cannot be sealed: shard %u is missing or incomplete", name,
                a.expect);
        goto out_unlock;
    }
    d.state = TS_DS_SEALED;
    rc = ds_rewrite(s, name, &d, "dataset seal");
    if (rc == 0)
        TS_INFO(FAC, "sealed dataset %s (%u shards)", name, a.expect);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void delete_id_range(rocksdb_writebatch_t *b, rocksdb_column_family_handle_t *cf, char tag,
                            uint64_t dsid)
{
    uint8_t lo[9], hi[9];
    key_id(lo, tag, dsid);
    key_id(hi, tag, dsid + 1);
    rocksdb_writebatch_delete_range_cf(b, cf, (const char *)lo, 9, (const char *)hi, 9);
}

int ts_store_dataset_delete(ts_store *s, const char *name)
{
    return ts_store_dataset_delete_ex(s, name, 0);
}

int ts_store_dataset_delete_ex(ts_store *s, const char *name, int force)
{
    return ts_store_dataset_delete_upto(s, name, UINT64_MAX, force);
}

static int dataset_delete_one(ts_store *s, const char *name, uint64_t upto, int force);

/* A dataset's fragments (NAME#f, issue 33) go with it, on every path that deletes it. */
int ts_store_dataset_delete_upto(ts_store *s, const char *name, uint64_t upto, int force)
{
    int rc = dataset_delete_one(s, name, upto, force);

    if (rc == 0 && !ts_frag_split(name, NULL, NULL)) {
        char frag[TS_NAME_MAX + 1];
        for (unsigned f = 0; f < TS_FRAG_MAX; f++) {
            int fr;
            if (ts_frag_name(frag, name, f) != 0)
                break;
            fr = dataset_delete_one(s, frag, UINT64_MAX, 1);
            if (fr && fr != TS_ENOENT)
                TS_WARN(FAC, fr, "dataset %s deleted, its fragment store %s not", name, frag);
        }
    }
    return rc;
}

static int dataset_delete_one(ts_store *s, const char *name, uint64_t upto, int force)
{
    struct ts_dataset_info d;
    uint8_t k[1 + TS_NAME_MAX], kid[9], lo[8], hi[8];
    rocksdb_writebatch_t *b;
    int rc;

    if (!s)
        return TS_EINVAL;
    pthread_mutex_lock(&s->lock);
    rc = dataset_get(s, name, &d);
    if (rc)
        goto out_unlock;
    if (d.created_ns > upto) {
        rc = TS_ESTALE; /* a newer incarnation took the name since the caller looked */
        goto out_unlock;
    }
    if (force && writers_supersede(s, d.id, 1, 0))
        TS_INFO(FAC, "dataset %s: uploads still open end with its delete", name);
    if (writer_active(s, d.id, 1, 0)) {
        rc = TS_EBUSY;
        goto out_unlock;
    }
    b = rocksdb_writebatch_create();
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)k, key_ds(k, name));
    {
        /* The tombstone: replication never brings this incarnation (or an older one) back. */
        uint8_t inc[8];
        size_t klen = key_ds(k, name);
        k[0] = 'T';
        ts_put_le64(inc, d.created_ns);
        rocksdb_writebatch_put_cf(b, s->cf[CF_META], (const char *)k, klen, (const char *)inc, 8);
    }
    rocksdb_writebatch_delete_cf(b, s->cf[CF_META], (const char *)kid, key_id(kid, 'I', d.id));
    delete_id_range(b, s->cf[CF_META], 'S', d.id);
    delete_id_range(b, s->cf[CF_META], 'C', d.id);
    delete_id_range(b, s->cf[CF_META], 'R', d.id);
    delete_id_range(b, s->cf[CF_META], 'B', d.id);
    ts_put_be64(lo, d.id);
    ts_put_be64(hi, d.id + 1);
    rocksdb_writebatch_delete_range_cf(b, s->cf[CF_CHUNKS], (const char *)lo, 8, (const char *)hi,
                                       8);
    rc = batch_write(s, b, "dataset delete");
    rocksdb_writebatch_destroy(b);
    ds_invalidate(s, name);
    ts_cache_drop_dataset(s->ccache, d.id);
    if (rc == 0) {
        chunkfile_drop_dataset(s, d.id);
        TS_INFO(FAC, "deleted dataset %s (id %llu)", name, (unsigned long long)d.id);
    }
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ts_store_dataset_get(ts_store *s, const char *name, struct ts_dataset_info *out)
{
    if (!s || !out)
        return TS_EINVAL;
    return dataset_get(s, name, out);
}

/* ---- replication helpers ------------------------------------------------------------------ */

int ts_store_tombstone(ts_store *s, const char *name, uint64_t *incarnation)
{
    uint8_t k[1 + TS_NAME_MAX];
    char *v;
    size_t vlen, klen;
    int rc;

    *incarnation = 0;
    if (!ts_name_valid_store(name))
        return TS_ENAME;
    klen = key_ds(k, name);
    k[0] = 'T';
    rc = meta_get(s, k, klen, &v, &vlen);
    if (rc)
        return rc;
    if (vlen == 8)
        *incarnation = ts_get_le64((const uint8_t *)v);
    rocksdb_free(v);
    return vlen == 8 ? 0 : TS_ECORRUPT;
}

struct tomb_arg {
    int (*cb)(void *arg, const char *name, uint64_t incarnation);
    void *arg;
};

static int tomb_cb(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen)
{
    struct tomb_arg *a = arg;
    char name[TS_NAME_MAX + 1];

    if (klen < 2 || klen - 1 > TS_NAME_MAX || vlen != 8)
        return 0;
    memcpy(name, k + 1, klen - 1);
    name[klen - 1] = '\0';
    if (ts_frag_split(name, NULL, NULL))
        return 0;
    return a->cb(a->arg, name, ts_get_le64((const uint8_t *)v));
}

int ts_store_tombstone_list(ts_store *s, int (*cb)(void *arg, const char *name, uint64_t inc),
                            void *arg)
{
    struct tomb_arg a = {cb, arg};
    uint8_t prefix = 'T';

    return meta_scan(s, &prefix, 1, tomb_cb, &a);
}

int ts_store_dataset_ensure(ts_store *s, const char *name, const struct ts_dataset_policy *p,
                            uint64_t incarnation)
{
    struct ts_dataset_info d;
    uint64_t dead = 0;
    int rc = dataset_get(s, name, &d);

    if (rc == TS_ENOENT && incarnation && ts_store_tombstone(s, name, &dead) == 0 &&
        dead >= incarnation)
        return TS_ESTALE; /* that incarnation was deleted here: never bring it back */

    if (rc == 0 && incarnation && d.created_ns != incarnation) {
        if (d.created_ns > incarnation)
            return TS_ESTALE; /* the sender has an older incarnation than ours */
        /* Ours was deleted and the name re-created while this node was away. */
        TS_WARN(FAC, 0,
                "dataset %s here is an older incarnation (%llu) than the primary's "
                "(%llu): replacing it",
                name, (unsigned long long)d.created_ns, (unsigned long long)incarnation);
        rc = ts_store_dataset_delete_upto(s, name, incarnation - 1, 0);
        if (rc)
            return rc;
        rc = TS_ENOENT;
    }
    if (rc != TS_ENOENT)
        return rc;
    rc = ts_store_dataset_create_inc(s, name, p, incarnation);
    return rc == TS_EEXIST ? 0 : rc;
}
