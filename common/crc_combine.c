/*
 * CRC32C of a concatenation from the CRCs of its parts: crc(A || B) from crc(A), crc(B) and
 * the length of B, without touching the bytes. Appending len zero bytes to a message
 * multiplies its CRC register by x^(8 len) modulo the CRC polynomial; with the standard
 * pre- and post-inversion the inversions cancel, so crc(A || B) = crc(A) * x^(8|B|) ^ crc(B).
 * Polynomials are kept bit-reflected, as the CRC register is (x^0 in bit 31). x^(8 len) is
 * built from a table of x^(2^k), so a combine costs a few dozen carry-less multiplications
 * done bit by bit: well under a microsecond, against a pass over the bytes.
 */
#include "ts_common.h"

#include <pthread.h>

#define POLY 0x82f63b78u /* CRC32C (Castagnoli), reflected */

#define X2K_N 67 /* 8 n < 2^67 for every 64-bit n */

static uint32_t x2k[X2K_N]; /* x^(2^k) mod POLY */
static pthread_once_t x2k_once = PTHREAD_ONCE_INIT;

/* a * b modulo POLY (both reflected). */
static uint32_t mulmod(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;

    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static void x2k_init(void)
{
    uint32_t p = 1u << 30; /* x^1 */

    /* Every k up to 66: the powers do not cycle with period 32 for this polynomial (its
     * factors differ from CRC-32's), so no index may wrap. */
    x2k[0] = p;
    for (int k = 1; k < X2K_N; k++)
        x2k[k] = p = mulmod(p, p);
}

/* x^(8 n) modulo POLY. */
static uint32_t x8n(uint64_t n)
{
    uint32_t p = 1u << 31; /* x^0 */
    unsigned k = 3;        /* 8 n = n * 2^3 */

    pthread_once(&x2k_once, x2k_init);
    while (n) {
        if (n & 1)
            p = mulmod(x2k[k], p);
        n >>= 1;
        k++;
    }
    return p;
}

uint32_t ts_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return len_b ? mulmod(x8n(len_b), crc_a) ^ crc_b : crc_a;
}

/* crc(A || B) for |B| = 4 KiB by table: x^(8*4096) * crc_a is linear in crc_a, so it is the XOR
 * of four byte-indexed tables (a per-block combine is then a few loads, not a multiplication). */
static uint32_t shift4k[4][256];
static pthread_once_t shift4k_once = PTHREAD_ONCE_INIT;

static void shift4k_init(void)
{
    uint32_t p = x8n(4096);

    for (int j = 0; j < 4; j++)
        for (uint32_t v = 0; v < 256; v++)
            shift4k[j][v] = mulmod(p, v << (8 * j));
}

uint32_t ts_crc32c_combine_4k(uint32_t crc_a, uint32_t crc_b)
{
    pthread_once(&shift4k_once, shift4k_init);
    return shift4k[0][crc_a & 255] ^ shift4k[1][(crc_a >> 8) & 255] ^
           shift4k[2][(crc_a >> 16) & 255] ^ shift4k[3][crc_a >> 24] ^ crc_b;
}
