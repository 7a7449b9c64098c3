/*
 * libtessera internals: the CUDA driver as libtessera uses it (cuda_drv.c: loaded at first use
 * by dlopen, so a libtessera built with CUDA runs on hosts without it), and the check of data
 * in device memory on the GPU (the kernels of crc32c.cu, carried as a fatbin).
 */
#ifndef TS_CRC32C_GPU_H
#define TS_CRC32C_GPU_H

#include <stddef.h>
#include <stdint.h>

#define TS_GPU_CRC_BLOCK 256   /* bytes per thread */
#define TS_GPU_CRC_THREADS 256 /* threads per thread block (at least 256: the tables) */
#define TS_GPU_CRC_SEG 32      /* blocks per segment of the join */

#ifdef __cplusplus
extern "C" {
#endif
/* 0 when the CUDA driver is loaded and dev is device memory; else TS_ENOTSUP, with why in
 * words (the driver missing, host memory, ...) in why. */
int ts_cu_device_ptr(const void *dev, char *why, size_t whylen);
/* The CRC32C of [dev, dev+len) in device memory, computed on the GPU: 0 or TS_EIO (why). */
int ts_cu_crc32c(const void *dev, size_t len, uint32_t *crc, char *why, size_t whylen);
/* Checks the n pieces of a READ reply's piece table (length and CRC32C, le32 each) against
 * the bytes at dev, on the GPU: 0, TS_ECORRUPT (a piece differs: its index in *bad), or
 * TS_EIO (why). */
int ts_cu_verify_pieces(const void *dev, const uint8_t *table, uint32_t n, uint32_t *bad, char *why,
                        size_t whylen);
/* A DMA-BUF file descriptor covering [dev, dev+len) (cuMemGetHandleForAddressRange over the
 * host pages around it) and dev's offset in it: 0, or TS_ENOTSUP (why). */
int ts_cu_dmabuf(const void *dev, size_t len, int *fd, uint64_t *off, char *why, size_t whylen);
/* The embedded fatbin of crc32c.cu (generated at build time). */
extern const unsigned char ts_gpu_fatbin[];
#ifdef __cplusplus
}
#endif

#endif
