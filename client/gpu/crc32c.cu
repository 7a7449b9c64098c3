/*
 * CRC32C of data in GPU memory, on the GPU: the check of bytes placed straight into device
 * memory (GPUDirect RDMA), so they are never copied back to be verified. Built into a fatbin
 * that libtessera carries and loads through the CUDA driver (gpu/cuda_drv.c), so the library
 * needs no CUDA runtime. The pieces of a READ reply are cut into blocks of TS_GPU_CRC_BLOCK
 * bytes: one thread computes each block's CRC with the sliced routine of crc32c_dev.h (the
 * same one the host tests check against ISA-L; its tables in the thread block's shared
 * memory), then a warp per piece joins its blocks' CRCs in order (ts_crc32c_dev_join), in
 * segments first.
 * The GPU backend's own file.
 */
#include <stdint.h>

#include "gpu/crc32c_dev.h"
#include "gpu/crc32c_gpu.h"

/* Block t of the n pieces (piece i: poff[i], plen[i] bytes from base; its blocks from
 * pblk[i]; pblk[n] blocks in all): its CRC into out[t]. */
extern "C" __global__ void ts_crc_blocks(const uint8_t *base, const unsigned long long *poff,
                                         const uint32_t *plen, const uint32_t *pblk, uint32_t n,
                                         uint32_t *out)
{
    __shared__ uint32_t tab[8][256];
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x, lo = 0, hi = n;

    /* The slicing tables, built by the block's threads (the block is TS_GPU_CRC_THREADS). */
    for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
        tab[0][i] = ts_crc32c_dev_entry(i);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
        ts_crc32c_dev_slices(tab, i);
    __syncthreads();
    if (t >= pblk[n])
        return;
    while (hi - lo > 1) { /* the last piece whose blocks start at or before t */
        uint32_t mid = lo + (hi - lo) / 2;
        if (pblk[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t off = (uint64_t)(t - pblk[lo]) * TS_GPU_CRC_BLOCK;
    uint64_t len = plen[lo] - off < TS_GPU_CRC_BLOCK ? plen[lo] - off : TS_GPU_CRC_BLOCK;
    out[t] = ts_crc32c_dev_sliced(0, base + poff[lo] + off, len, tab);
}

/* Piece i's CRC into out[i], from its blocks' CRCs, by warp i: each lane joins segments of
 * TS_GPU_CRC_SEG blocks (left in the segment's first slot), then lane 0 joins the segments.
 * op[0..32) appends TS_GPU_CRC_BLOCK zero bytes, op[32..64) a segment's worth. */
extern "C" __global__ void ts_crc_join(const uint32_t *plen, const uint32_t *pblk, uint32_t n,
                                       uint32_t *blocks, const uint32_t *op, uint32_t *out)
{
    __shared__ uint32_t sop[64];
    uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const uint64_t seg = (uint64_t)TS_GPU_CRC_SEG * TS_GPU_CRC_BLOCK;

    for (uint32_t i = threadIdx.x; i < 64; i += blockDim.x)
        sop[i] = op[i];
    __syncthreads();
    if (warp >= n)
        return;
    uint32_t *b = blocks + pblk[warp];
    uint64_t len = plen[warp], nseg = (len + seg - 1) / seg;
    for (uint64_t s = lane; s < nseg; s += 32) {
        uint64_t l = len - s * seg < seg ? len - s * seg : seg;
        b[s * TS_GPU_CRC_SEG] =
            ts_crc32c_dev_join(b + s * TS_GPU_CRC_SEG, 1, l, TS_GPU_CRC_BLOCK, sop);
    }
    __syncwarp();
    if (lane == 0)
        out[warp] = ts_crc32c_dev_join(b, TS_GPU_CRC_SEG, len, seg, sop + 32);
}
