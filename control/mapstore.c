/* The cluster map in etcd (control/mapstore.h). */
#include "mapstore.h"

#include "tessera/errno.h"
#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>

const char *ts_mapstore_key(const char *prefix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/map", prefix);
    return buf;
}

static int decode(const struct ts_etcd_kv *kv, struct ts_map **m)
{
    struct ts_rd r;
    int rc;

    ts_rd_init(&r, kv->value, kv->len);
    rc = ts_map_decode(&r, m);
    if (!rc && ts_rd_done(&r) != 0) {
        ts_map_free(*m);
        *m = NULL;
        rc = TS_EPROTO;
    }
    return rc ? TS_EPROTO : 0;
}

int ts_mapstore_get(ts_etcd *e, const char *prefix, struct ts_map **m, int64_t *rev)
{
    struct ts_etcd_kv kv;
    char key[512];
    int rc;

    *m = NULL;
    rc = ts_etcd_get(e, ts_mapstore_key(prefix, key, sizeof(key)), &kv, NULL);
    if (!rc) {
        rc = decode(&kv, m);
        if (rev)
            *rev = kv.mod_rev;
    }
    ts_etcd_kv_free(&kv);
    return rc;
}

/* The map's wire form into w; 0 or TS_ENOMEM. */
static int encode(struct ts_wr *w, const struct ts_map *m)
{
    ts_wr_init(w);
    ts_map_encode(w, m);
    if (w->err) {
        ts_wr_fini(w);
        return TS_ENOMEM;
    }
    return 0;
}

int ts_mapstore_init(ts_etcd *e, const char *prefix, const struct ts_map *m)
{
    struct ts_wr w;
    char key[512];
    int rc;

    if (!m || m->epoch < 1)
        return TS_EINVAL;
    rc = encode(&w, m);
    if (rc)
        return rc;
    rc = ts_etcd_cas(e, ts_mapstore_key(prefix, key, sizeof(key)), 0, w.buf, w.len, 0, NULL, NULL);
    ts_wr_fini(&w);
    return rc == TS_ESTALE ? TS_EEXIST : rc;
}

int ts_mapstore_change(ts_etcd *e, const char *prefix, ts_mapstore_change_fn change, void *arg,
                       int tries, uint64_t *epoch, char *why, size_t cap)
{
    char key[512];
    int rc = TS_ESTALE;

    ts_mapstore_key(prefix, key, sizeof(key));
    for (int t = 0; t < tries && rc == TS_ESTALE; t++) {
        struct ts_map *cur = NULL, *next = NULL;
        struct ts_wr w;
        int64_t rev = 0;
        rc = ts_mapstore_get(e, prefix, &cur, &rev);
        if (rc) {
            snprintf(why, cap, "cannot read the map from etcd: %s",
                     rc == TS_ENOENT ? "none stored yet" : ts_etcd_error(e));
            return rc;
        }
        rc = change(arg, cur, &next, why, cap);
        if (!rc && (!next || next->epoch != cur->epoch + 1)) {
            snprintf(why, cap, "a map change must make epoch %llu",
                     (unsigned long long)cur->epoch + 1);
            rc = TS_EINVAL;
        }
        if (!rc)
            rc = encode(&w, next);
        if (!rc) {
            rc = ts_etcd_cas(e, key, rev, w.buf, w.len, 0, NULL, NULL);
            ts_wr_fini(&w);
            if (!rc && epoch)
                *epoch = next->epoch;
            else if (rc == TS_ESTALE)
                snprintf(why, cap,
                         "the map changed under you (epoch %llu is no longer the "
                         "newest)",
                         (unsigned long long)cur->epoch);
            else if (rc)
                snprintf(why, cap, "etcd: %s", ts_etcd_error(e));
        }
        ts_map_free(cur);
        ts_map_free(next);
    }
    return rc;
}
