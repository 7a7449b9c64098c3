/* libtessera internals: CRC32C of device memory, computed on the GPU (crc32c.cu). */
#ifndef TS_CRC32C_GPU_H
#define TS_CRC32C_GPU_H

#include <stddef.h>
#include <stdint.h>

#define TS_GPU_CRC_BLOCK 4096 /* bytes per thread */

#ifdef __cplusplus
extern "C" {
#endif
/* The CRC32C of [dev, dev+len) in device memory into *crc: 0, or -1 when CUDA fails. */
int ts_gpu_crc32c(const void *dev, size_t len, uint32_t *crc);
#ifdef __cplusplus
}
#endif

#endif
