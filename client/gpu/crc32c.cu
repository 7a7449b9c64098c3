/*
 * CRC32C of data in GPU memory, on the GPU: the check of bytes placed straight into device
 * memory (GPUDirect RDMA), so they are never copied back to be verified. Each thread computes
 * the CRC of one block of TS_GPU_CRC_BLOCK bytes with the routine of crc32c_dev.h (the same
 * one the host tests check against ISA-L); one thread per piece then joins its blocks' CRCs in
 * order (ts_crc32c_dev_combine). The GPU backend's own file.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "gpu/crc32c_dev.h"
#include "gpu/crc32c_gpu.h"

__global__ static void block_crcs(const uint8_t *data, size_t len, uint32_t *out, size_t nblocks)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;

    if (i >= nblocks)
        return;
    size_t off = i * TS_GPU_CRC_BLOCK;
    size_t n = len - off < TS_GPU_CRC_BLOCK ? len - off : TS_GPU_CRC_BLOCK;
    out[i] = ts_crc32c_dev(0, data + off, n);
}

__global__ static void join(const uint32_t *blocks, size_t nblocks, size_t len, uint32_t *crc)
{
    uint32_t acc = 0;

    for (size_t i = 0; i < nblocks; i++) {
        size_t off = i * TS_GPU_CRC_BLOCK;
        size_t n = len - off < TS_GPU_CRC_BLOCK ? len - off : TS_GPU_CRC_BLOCK;
        acc = ts_crc32c_dev_combine(acc, blocks[i], n);
    }
    *crc = acc;
}

extern "C" int ts_gpu_crc32c(const void *dev, size_t len, uint32_t *crc)
{
    size_t nblocks = (len + TS_GPU_CRC_BLOCK - 1) / TS_GPU_CRC_BLOCK;
    uint32_t *blocks = NULL, *out = NULL;
    int rc = -1;

    *crc = 0;
    if (len == 0)
        return 0;
    if (cudaMalloc(&blocks, nblocks * sizeof(uint32_t)) != cudaSuccess ||
        cudaMalloc(&out, sizeof(uint32_t)) != cudaSuccess)
        goto out_free;
    block_crcs<<<(unsigned)((nblocks + 127) / 128), 128>>>((const uint8_t *)dev, len, blocks,
                                                           nblocks);
    join<<<1, 1>>>(blocks, nblocks, len, out);
    if (cudaMemcpy(crc, out, sizeof(uint32_t), cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
out_free:
    cudaFree(blocks);
    cudaFree(out);
    return rc;
}
