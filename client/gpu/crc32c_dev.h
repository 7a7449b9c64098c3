/*
 * CRC32C (Castagnoli) that compiles for both the host and a CUDA device: the per-thread
 * routine of the GPU check of data placed in GPU memory (crc32c.cu), checked on the CPU
 * against ISA-L (tests/unit/test_gpu_crc.c). Same convention as ts_crc32c (crc 0 to start;
 * "123456789" gives 0xE3069283), and ts_crc32c_dev_combine joins the CRCs of two adjacent
 * pieces, so a piece can be split over threads. ts_crc32c_dev is bitwise (no table);
 * ts_crc32c_dev_sliced reads 8 bytes a step through 8 tables of 256 entries, which the GPU
 * kernel builds in shared memory (a table in host memory is not reachable from a device). The
 * GPU backend's own header: the only place outside a .cu file that knows __CUDACC__.
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

/* Entry i of the byte-at-a-time table: the CRC register after byte i alone. */
static TS_HD inline uint32_t ts_crc32c_dev_entry(uint32_t i)
{
    for (int k = 0; k < 8; k++)
        i = (i >> 1) ^ (TS_CRC32C_POLY & (0u - (i & 1u)));
    return i;
}

/* Entries i of the 8 slicing tables: t[0][i] as above, t[k][i] the same followed by k zero
 * bytes (each level only needs t[0] complete). */
static TS_HD inline void ts_crc32c_dev_slices(uint32_t (*t)[256], uint32_t i)
{
    for (int k = 1; k < 8; k++)
        t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
}

/* A little-endian 32-bit word at p, 4-byte aligned. */
static TS_HD inline uint32_t ts_dev_le32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
#endif
}

/* ts_crc32c_dev through the slicing tables t (ts_crc32c_dev_entry, ts_crc32c_dev_slices). */
static TS_HD inline uint32_t ts_crc32c_dev_sliced(uint32_t crc, const uint8_t *p, size_t n,
                                                  const uint32_t (*t)[256])
{
    crc = ~crc;
    for (; n && ((uintptr_t)p & 3u); n--)
        crc = t[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t a = ts_dev_le32(p) ^ crc, b = ts_dev_le32(p + 4);
        crc = t[7][a & 0xFFu] ^ t[6][(a >> 8) & 0xFFu] ^ t[5][(a >> 16) & 0xFFu] ^ t[4][a >> 24] ^
              t[3][b & 0xFFu] ^ t[2][(b >> 8) & 0xFFu] ^ t[1][(b >> 16) & 0xFFu] ^ t[0][b >> 24];
    }
    for (; n; n--)
        crc = t[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
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

/* op: the operator (for ts_gf2_times) that appends len zero bytes to a CRC. */
static TS_HD inline void ts_crc32c_dev_zeros_op(uint32_t *op, uint64_t len)
{
    for (int i = 0; i < 32; i++)
        op[i] = ts_crc32c_dev_combine(1u << i, 0, len);
}

/* The CRC of a piece of len bytes from the CRCs of its blocks of `block` bytes each (the last
 * one may be shorter), found at crcs[0], crcs[stride], ...: blocks of the full size are joined
 * by op, the operator that appends `block` zero bytes (ts_crc32c_dev_zeros_op), the shorter
 * last one by ts_crc32c_dev_combine. */
static TS_HD inline uint32_t ts_crc32c_dev_join(const uint32_t *crcs, size_t stride, uint64_t len,
                                                uint64_t block, const uint32_t *op)
{
    uint32_t acc = 0;
    uint64_t nblocks = (len + block - 1) / block;

    for (uint64_t j = 0; j < nblocks; j++) {
        uint64_t n = len - j * block < block ? len - j * block : block;
        uint32_t c = crcs[j * stride];
        acc = n == block ? ts_gf2_times(op, acc) ^ c : ts_crc32c_dev_combine(acc, c, n);
    }
    return acc;
}

#endif
