/*
 * The erasure code (ts_ec.h): Reed-Solomon over GF(2^8) with ISA-L. The generator is an
 * identity on top of a Cauchy matrix (gf_gen_cauchy1_matrix), so every k of its k+m rows are
 * independent and any k fragments rebuild the rest; ISA-L's vectorised dot products do the
 * encoding and, with the inverted rows of the fragments that survive, the decoding.
 */
#include "ts_ec.h"

#include "ts_common.h"

#include <ctype.h>
#include <isa-l/erasure_code.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EC_MAX_N (TS_EC_MAX_K + TS_EC_MAX_M)
#define EC_STEP (1u << 30) /* ISA-L takes an int length */

struct ts_ec {
    unsigned k, m;
    uint8_t gen[EC_MAX_N * TS_EC_MAX_K];          /* (k+m) x k, row i makes fragment i */
    uint8_t tbls[32 * TS_EC_MAX_K * TS_EC_MAX_M]; /* the parity rows, expanded for ISA-L */
};

static int limits_ok(unsigned k, unsigned m)
{
    return k >= 1 && k <= TS_EC_MAX_K && m >= 1 && m <= TS_EC_MAX_M;
}

int ts_ec_parse(const char *s, unsigned *k, unsigned *m, char *err, size_t errlen)
{
    unsigned long a, b;
    char *end;

    if (!s)
        s = "";
    if (!strncmp(s, "ec:", 3))
        s += 3;
    if (!isdigit((unsigned char)*s))
        goto bad;
    a = strtoul(s, &end, 10);
    if (*end != '+' || !isdigit((unsigned char)end[1]))
        goto bad;
    s = end + 1;
    b = strtoul(s, &end, 10);
    if (*end || a > TS_EC_MAX_K || b > TS_EC_MAX_M || !limits_ok(a, b))
        goto bad;
    *k = (unsigned)a;
    *m = (unsigned)b;
    return 0;
bad:
    if (err && errlen)
        snprintf(err, errlen, "erasure code: want ec:K+M with 1 <= K <= %d and 1 <= M <= %d",
                 TS_EC_MAX_K, TS_EC_MAX_M);
    return TS_EINVAL;
}

int ts_ec_create(ts_ec **out, unsigned k, unsigned m)
{
    ts_ec *ec;

    *out = NULL;
    if (!limits_ok(k, m))
        return TS_EINVAL;
    ec = calloc(1, sizeof(*ec));
    if (!ec)
        return TS_ENOMEM;
    ec->k = k;
    ec->m = m;
    gf_gen_cauchy1_matrix(ec->gen, (int)(k + m), (int)k);
    ec_init_tables((int)k, (int)m, &ec->gen[k * k], ec->tbls);
    *out = ec;
    return 0;
}

void ts_ec_destroy(ts_ec *ec)
{
    free(ec);
}

unsigned ts_ec_k(const ts_ec *ec)
{
    return ec->k;
}

unsigned ts_ec_m(const ts_ec *ec)
{
    return ec->m;
}

/* rows x k coefficients (tables tb) applied to src[k], into dst[rows], in steps ISA-L takes. */
static void apply(unsigned k, unsigned rows, const uint8_t *tb, size_t len, uint8_t **src,
                  uint8_t **dst)
{
    uint8_t *s[TS_EC_MAX_K], *d[EC_MAX_N];

    for (size_t at = 0; at < len; at += EC_STEP) {
        int n = (int)TS_MIN(len - at, (size_t)EC_STEP);
        for (unsigned i = 0; i < k; i++)
            s[i] = src[i] + at;
        for (unsigned i = 0; i < rows; i++)
            d[i] = dst[i] + at;
        ec_encode_data(n, (int)k, (int)rows, (unsigned char *)tb, s, d);
    }
}

void ts_ec_encode(const ts_ec *ec, size_t len, uint8_t *const *data, uint8_t *const *parity)
{
    apply(ec->k, ec->m, ec->tbls, len, (uint8_t **)data, (uint8_t **)parity);
}

int ts_ec_decode(const ts_ec *ec, size_t len, uint8_t *const *frag, uint64_t have, uint64_t want)
{
    unsigned k = ec->k, n = ec->k + ec->m, rows = 0, used = 0;
    uint8_t b[TS_EC_MAX_K * TS_EC_MAX_K], inv[TS_EC_MAX_K * TS_EC_MAX_K];
    uint8_t c[EC_MAX_N * TS_EC_MAX_K], tb[32 * TS_EC_MAX_K * EC_MAX_N];
    uint8_t *src[TS_EC_MAX_K], *dst[EC_MAX_N];
    uint64_t all = (UINT64_C(1) << n) - 1, missing; /* n <= 40 */

    if ((have | want) & ~all)
        return TS_EINVAL;
    missing = want & ~have;
    if (!missing)
        return 0;
    /* The first k fragments there: their generator rows, inverted, give the data from them. */
    for (unsigned i = 0; i < n && used < k; i++)
        if (have >> i & 1) {
            memcpy(&b[used * k], &ec->gen[i * k], k);
            src[used++] = frag[i];
        }
    if (used < k)
        return TS_EUNAVAIL;
    if (gf_invert_matrix(b, inv, (int)k) != 0)
        return TS_EINTERNAL; /* cannot happen with a Cauchy generator */
    /* Each missing fragment's row over the ones used: data i is row i of the inverse; parity j
     * is generator row j times the inverse. */
    for (unsigned i = 0; i < n; i++) {
        if (!(missing >> i & 1))
            continue;
        if (i < k) {
            memcpy(&c[rows * k], &inv[i * k], k);
        } else {
            for (unsigned col = 0; col < k; col++) {
                uint8_t s = 0;
                for (unsigned t = 0; t < k; t++)
                    s ^= gf_mul(ec->gen[i * k + t], inv[t * k + col]);
                c[rows * k + col] = s;
            }
        }
        dst[rows++] = frag[i];
    }
    ec_init_tables((int)k, (int)rows, c, tb);
    apply(k, rows, tb, len, src, dst);
    return 0;
}
