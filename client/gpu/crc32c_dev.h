/*
 * CRC32C (Castagnoli) that compiles for both the host and a CUDA device: the per-thread
 * routine of the GPU check of data placed in GPU memory (crc32c.cu), checked on the CPU
 * against ISA-L (tests/unit/test_gpu_crc.c). Same convention as ts_crc32c (crc 0 to start;
 * "123456789" gives 0xE3069283), and ts_crc32c_dev_combine joins the CRCs of two adjacent
 * pieces, so a piece can be split over threads. Bitwise (no table): a table in host memory
 * is not reachable from a device. The GPU backend's own header: the only place outside a
 * .cu file that knows __CUDACC__.
 */
#ifndef TS_CRC32C_DEV_H
#define TS_CRC32C_DEV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TS_HD __host__ __device__
#else
#define TS_HD
#endif

#define TS_CRC32C_POLY 0x82F63B78u /* reflected */

/* The CRC32C of crc's data followed by p[0..n). */
static TS_HD inline uint32_t ts_crc32c_dev(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (TS_CRC32C_POLY & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* GF(2) 32x32 matrix times vector, and square (zlib's crc32_combine, for CRC32C). */
static TS_HD inline uint32_t ts_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;

    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1u)
            sum ^= mat[i];
    return sum;
}

static TS_HD inline void ts_gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int i = 0; i < 32; i++)
        sq[i] = ts_gf2_times(mat, mat[i]);
}

/* The CRC of A||B from crc_a = CRC(A), crc_b = CRC(B) and len_b = |B|. */
static TS_HD inline uint32_t ts_crc32c_dev_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    uint32_t even[32], odd[32];

    if (len_b == 0)
        return crc_a;
    odd[0] = TS_CRC32C_POLY; /* the operator for one zero bit */
    for (int i = 1; i < 32; i++)
        odd[i] = 1u << (i - 1);
    ts_gf2_square(even, odd); /* two zero bits */
    ts_gf2_square(odd, even); /* four */
    do {
        ts_gf2_square(even, odd); /* apply len_b's bits, one zero byte and up */
        if (len_b & 1u)
            crc_a = ts_gf2_times(even, crc_a);
        len_b >>= 1;
        if (!len_b)
            break;
        ts_gf2_square(odd, even);
        if (len_b & 1u)
            crc_a = ts_gf2_times(odd, crc_a);
        len_b >>= 1;
    } while (len_b);
    return crc_a ^ crc_b;
}

#endif
