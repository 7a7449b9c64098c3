/*
 * Reads placed by the node into device memory (gpu/placed.h): the range in reads of at most
 * TESSERA_MAX_READ, TS_PLACE_WINDOW of them in flight, each registered by the transport as the
 * chosen path says and checked by the backend once its piece table is in (recv.c), before the
 * read counts as done. A path is chosen by the first read: the first path whose registration
 * works.
 */
#include "gpu/placed.h"

#include <stdio.h>
#include <string.h>

/* Submits the read of [off, off+len) into dst on the first path that registers; its index. */
static int first_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                      void *dst, const struct ts_place_ops *ops, struct ts_read_target *tgt,
                      uint64_t *op, size_t *path)
{
    char why[400] = "";
    size_t at = 0;
    int rc = TS_ENOTSUP;

    for (size_t i = 0; i < ops->npaths; i++) {
        tgt->src = &ops->paths[i].src;
        rc = ts_conn_read_submit_to(c, name, shard, off, len, dst, tgt, op);
        if (rc != TS_ENOTSUP) {
            *path = i;
            return rc;
        }
        at += (size_t)snprintf(why + at, sizeof(why) - TS_MIN(at, sizeof(why)), "%s%s: %s",
                               i ? "; " : "", ops->paths[i].name, tessera_client_error(c));
        at = TS_MIN(at, sizeof(why));
    }
    ts_conn_set_error(c, "no placed read into device memory (%s)", why);
    return TS_ENOTSUP;
}

int ts_read_placed(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                   void *dst, size_t *out_len, const struct ts_place_ops *ops,
                   struct tessera_device_stats *st)
{
    struct ts_read_target tgt = {NULL, ops->verify, ops->ctx};
    uint64_t op[TS_PLACE_WINDOW];
    size_t want[TS_PLACE_WINDOW], npieces, next = 0, done = 0, total = 0, path = 0;
    int rc = 0, ended = 0;

    if (out_len)
        *out_len = 0;
    if (st)
        memset(st, 0, sizeof(*st));
    if (!c || !name || !dst || !ops || !ops->npaths || !ops->verify)
        return TS_EINVAL;
    if (!ts_conn_can_place(c)) {
        ts_conn_set_error(c, "this handle cannot place reads (RDMA to one node only)");
        return TS_ENOTSUP;
    }
    if (len == 0)
        return tessera_read(c, name, shard, off, 0, dst, out_len);
    npieces = (len - 1) / TESSERA_MAX_READ + 1;
    want[0] = TS_MIN(len, (size_t)TESSERA_MAX_READ);
    rc = first_read(c, name, shard, off, want[0], dst, ops, &tgt, &op[0], &path);
    if (rc)
        return rc;
    next = 1;
    if (st)
        snprintf(st->path, sizeof(st->path), "%s", ops->paths[path].name);
    while (done < next) {
        size_t n = 0;
        int w;

        while (!ended && !rc && next < npieces && next < done + TS_PLACE_WINDOW) {
            size_t k = next % TS_PLACE_WINDOW;
            want[k] = TS_MIN((size_t)TESSERA_MAX_READ, len - next * (size_t)TESSERA_MAX_READ);
            rc = ts_conn_read_submit_to(c, name, shard, off + (uint64_t)next * TESSERA_MAX_READ,
                                        want[k], (uint8_t *)dst + next * (size_t)TESSERA_MAX_READ,
                                        &tgt, &op[k]);
            if (rc == 0)
                next++;
        }
        /* Collect in order; after a failure or the shard's end, only what is in flight. */
        w = ts_conn_wait(c, op[done % TS_PLACE_WINDOW], &n);
        if (w == TS_ERANGE && done > 0 && !rc)
            ended = 1;               /* the shard ended where this read begins */
        else if (w && !rc && !ended) /* reads past the shard's end do not count */
            rc = w;
        if (!w && !rc && !ended) {
            total += n;
            if (st) {
                st->bytes += n;
                st->pieces++;
            }
            ended = n < want[done % TS_PLACE_WINDOW];
        }
        done++;
    }
    if (!rc && out_len)
        *out_len = total;
    return rc;
}
