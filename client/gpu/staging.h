/*
 * libtessera internals: reads through host staging buffers into other memory (GPU memory),
 * the copy done by a backend: the CUDA one (device_cuda.c) in tessera_read_device, a host one
 * (memcpy) in the tests. The pipeline is the same; only the copy differs.
 */
#ifndef TS_GPU_STAGING_H
#define TS_GPU_STAGING_H

#include "client_internal.h"
#include "tessera/gpu.h"

struct ts_stage_ops {
    const char *name;
    /* n bytes of staging memory (pinned for a device), or TS_E*. */
    int (*alloc)(void *ctx, void **p, size_t n);
    void (*free)(void *ctx, void *p);
    /* Starts copying n bytes from staging src to dst (may return before it is done). */
    int (*copy)(void *ctx, void *dst, const void *src, size_t n);
    /* Waits until every copy started is done. */
    int (*sync)(void *ctx);
    void *ctx;
};

#define TS_STAGE_PIECE (4u << 20) /* bytes per staging buffer (two of them) */

/* tessera_read semantics into dst through two staging buffers of `piece` bytes: the read of
 * piece i+1 is in flight while piece i (verified) is copied. */
int ts_read_staged(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                   void *dst, size_t *out_len, const struct ts_stage_ops *ops, size_t piece,
                   struct tessera_device_stats *st);

#endif
