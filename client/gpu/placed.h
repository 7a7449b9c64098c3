/*
 * libtessera internals: reads placed by the node straight into memory the host cannot touch
 * (GPU memory; GPUDirect RDMA). The registrations to try and the check of the placed bytes
 * come from a backend: the CUDA one (device_cuda.c: DMA-BUF, then nvidia-peermem, the check on
 * the GPU) in tessera_read_device, a host one in the tests. The pipeline is the same.
 */
#ifndef TS_GPU_PLACED_H
#define TS_GPU_PLACED_H

#include "client_internal.h"
#include "tessera/gpu.h"

struct ts_place_path {
    const char *name;      /* "dmabuf", "peermem": reported in tessera_device_stats.path */
    struct ts_reg_src src; /* how the transport registers the memory on this path */
};

struct ts_place_ops {
    const struct ts_place_path *paths; /* tried in order until one registers */
    size_t npaths;
    /* The check of placed bytes (struct ts_read_target's verify). */
    int (*verify)(void *ctx, const uint8_t *table, uint32_t npieces, const void *dst, size_t len);
    void *ctx;
};

#define TS_PLACE_WINDOW 4 /* reads of TESSERA_MAX_READ in flight */

/*
 * tessera_read semantics into dst, placed by the node on the first path that registers dst.
 * TS_ENOTSUP when nothing was read: the handle cannot place reads (it is not one RDMA
 * connection: a TCP or TLS handle, or a cluster) or no path registers dst; c's error says why,
 * and the caller reads another way. TS_ECORRUPT when placed bytes failed their check (the
 * caller reads them again another way). st says which path ran.
 */
int ts_read_placed(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                   void *dst, size_t *out_len, const struct ts_place_ops *ops,
                   struct tessera_device_stats *st);

#endif
