/*
 * libtessera: reads into GPU memory (docs/client.md "GPU memory").
 *
 * tessera_read_device reads [off, off+len) of a complete shard into device memory dev (a CUDA
 * device pointer). Over TCP and TLS the bytes land in pinned host staging buffers, each piece's
 * CRC32C is verified there as it arrives (as for tessera_read), and only verified pieces are
 * copied to the device (cudaMemcpyAsync), the copy of one piece overlapping the receive of the
 * next. *out_len as tessera_read; st (may be NULL) says which path ran ("staging"; "dmabuf"
 * and "peermem" name the RDMA registrations of GPU memory, see docs/client.md) and how much
 * it moved. On failure nothing unverified was copied; what the device range holds is
 * undefined. TS_ENOTSUP in a libtessera built without CUDA (it says so), TS_EIO when the CUDA
 * runtime fails (no device: the message names the CUDA error).
 */
#ifndef TESSERA_GPU_H
#define TESSERA_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tessera_device_stats {
    char path[16];   /* "staging", "dmabuf" or "peermem" */
    uint64_t bytes;  /* bytes copied into device memory */
    uint64_t pieces; /* staging pieces (or placed reads) */
};

int tessera_read_device(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *dev, size_t *out_len, struct tessera_device_stats *st);

#ifdef __cplusplus
}
#endif

#endif
