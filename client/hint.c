/*
 * HINT (docs/protocol.md "Hints"): ranges a reader will read next, told to the node that will
 * serve them so it reads their chunks ahead into its cache. Advisory: the node may drop them,
 * and a failure here changes nothing for the reads. On a cluster the ranges go to each range's
 * lane, the replica its reads go to first (ts_cl_read_lane).
 */
#include "cluster_internal.h"
#include "conn.h"

#include <stdlib.h>

int ts_conn_hint(tessera_client *c, const char *name, const struct ts_readv *v, size_t n,
                 struct ts_hint_result *res)
{
    struct ts_req *r;
    struct ts_rd body;
    uint32_t fd;
    int rc = ts_enter_name(c, name);

    if (rc)
        return rc;
    if (n == 0 || n > TS_HINT_MAX)
        return TS_EINVAL;
    r = ts_req_name(c, TS_OP_HINT, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_ranges(&r->w, v, n);
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    res->queued += ts_rd_u32(&body);
    res->dropped += ts_rd_u32(&body);
    res->skipped += ts_rd_u32(&body);
    fd = ts_rd_u32(&body);
    if (fd < n)
        res->first_dropped = TS_MIN(res->first_dropped, (size_t)fd);
    if (body.err)
        rc = ts_proto_err(c, "HINT");
    ts_req_free(c, r);
    return rc;
}

int ts_cl_hint(struct ts_cluster *cl, const char *name, const struct ts_readv *v, size_t n,
               struct ts_hint_result *res)
{
    struct ts_readv *by = malloc(n * sizeof(*by));
    size_t *lane = malloc(n * sizeof(*lane)), *orig = malloc(n * sizeof(*orig));
    int rc = by && lane && orig ? 0 : TS_ENOMEM;

    for (size_t i = 0; !rc && i < n; i++)
        lane[i] = ts_cl_read_lane(cl, name, v[i].shard, v[i].off);
    /* One HINT per lane, its ranges in the order given. */
    for (size_t i = 0; !rc && i < n; i++) {
        size_t p = lane[i], k = 0;
        struct ts_hint_result one = *res;
        tessera_client *sub;

        if (p == SIZE_MAX)
            continue; /* no usable node, or one read by RDMA placement */
        for (size_t j = i; j < n; j++)
            if (lane[j] == p) {
                orig[k] = j;
                by[k++] = v[j];
                lane[j] = SIZE_MAX;
            }
        one.first_dropped = k;
        if (ts_cl_peer_conn(cl, p, 0, &sub) == 0)
            rc = ts_conn_hint(sub, name, by, k, &one);
        if (one.first_dropped < k) /* back to the caller's numbering */
            one.first_dropped = TS_MIN(res->first_dropped, orig[one.first_dropped]);
        else
            one.first_dropped = res->first_dropped;
        *res = one;
        if (rc && rc != TS_ENOMEM)
            rc = 0; /* advisory: that node just reads without them */
    }
    free(by);
    free(lane);
    free(orig);
    return rc;
}
