/*
 * Reads through host staging into other memory (gpu/staging.h): two staging buffers; the read
 * of the next piece is in flight (tessera_read_submit: its CRC32C checked as it arrives) while
 * the previous, verified piece is copied out by the backend. Only pieces whose read succeeded
 * are copied: nothing unverified reaches the destination.
 */
#include "gpu/staging.h"

#include <stdio.h>
#include <string.h>

int ts_read_staged(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                   void *dst, size_t *out_len, const struct ts_stage_ops *ops, size_t piece,
                   struct tessera_device_stats *st)
{
    void *stage[2] = {NULL, NULL};
    uint64_t op[2] = {0, 0};
    size_t want[2] = {0, 0}, total = 0, npieces, next = 0, done = 0;
    int inflight[2] = {0, 0}, ended = 0, rc = 0;

    if (out_len)
        *out_len = 0;
    if (st) {
        memset(st, 0, sizeof(*st));
        snprintf(st->path, sizeof(st->path), "staging");
    }
    if (!c || !name || (!dst && len) || !ops || piece == 0 || piece > TESSERA_MAX_READ)
        return TS_EINVAL;
    if (len == 0) { /* a zero-length read still checks the name and the range */
        uint8_t none;
        return tessera_read(c, name, shard, off, 0, &none, out_len);
    }
    npieces = (len - 1) / piece + 1;
    for (int b = 0; b < 2 && (size_t)b < npieces; b++) {
        rc = ops->alloc(ops->ctx, &stage[b], piece);
        if (rc)
            goto out_free;
    }
    while (done < npieces && !ended) {
        int b = (int)(done % 2);
        size_t n = 0;

        /* Keep the next piece's read in flight; its buffer's last copy must be done first. */
        while (next < npieces && next <= done + 1 && !inflight[next % 2]) {
            int nb = (int)(next % 2);
            if (next >= 2 && (rc = ops->sync(ops->ctx)) != 0)
                goto out_drain;
            want[nb] = TS_MIN(piece, len - next * piece);
            rc = tessera_read_submit(c, name, shard, off + (uint64_t)next * piece, want[nb],
                                     stage[nb], &op[nb]);
            if (rc)
                goto out_drain;
            inflight[nb] = 1;
            next++;
        }
        rc = tessera_wait(c, op[b], &n);
        inflight[b] = 0;
        if (rc == TS_ERANGE && done > 0) { /* the shard ended where this piece begins */
            rc = 0;
            break;
        }
        if (rc)
            goto out_drain;
        if (n) {
            rc = ops->copy(ops->ctx, (uint8_t *)dst + done * piece, stage[b], n);
            if (rc)
                goto out_drain;
        }
        total += n;
        if (st) {
            st->bytes += n;
            st->pieces++;
        }
        ended = n < want[b]; /* the shard ends inside this piece */
        done++;
    }
out_drain:
    /* Collect a read still in flight (the handle stays usable); its result does not count. */
    for (int b = 0; b < 2; b++)
        if (inflight[b]) {
            size_t n;
            (void)tessera_wait(c, op[b], &n);
        }
    {
        int src = ops->sync(ops->ctx);
        if (!rc)
            rc = src;
    }
    if (!rc && out_len)
        *out_len = total;
out_free:
    for (int b = 0; b < 2; b++)
        if (stage[b])
            ops->free(ops->ctx, stage[b]);
    return rc;
}
