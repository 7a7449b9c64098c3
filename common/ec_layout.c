/*
 * The stripe layout of an erasure-coded shard (ts_ec.h): which fragment, and where in it, holds
 * each byte of the shard, and how long each fragment and cell is. Arithmetic only.
 */
#include "ts_ec.h"

#include "ts_common.h"

int ts_ec_layout_init(struct ts_ec_layout *l, unsigned k, unsigned m, uint64_t cell, uint64_t len)
{
    if (k < 1 || k > TS_EC_MAX_K || m < 1 || m > TS_EC_MAX_M || cell == 0 ||
        cell > UINT64_MAX / TS_EC_MAX_K)
        return TS_EINVAL;
    l->k = k;
    l->m = m;
    l->cell = cell;
    l->len = len;
    l->stripes = len ? (len - 1) / (k * cell) + 1 : 0;
    return 0;
}

int ts_ec_layout_for(struct ts_ec_layout *l, unsigned k, unsigned m, uint64_t len)
{
    uint64_t cell = k ? (len + k - 1) / k : 0;

    cell = (cell + TS_EC_CELL_MIN - 1) / TS_EC_CELL_MIN * TS_EC_CELL_MIN;
    return ts_ec_layout_init(l, k, m, TS_MIN(TS_MAX(cell, TS_EC_CELL_MIN), TS_EC_CELL_MAX), len);
}

uint64_t ts_ec_cell_len(const struct ts_ec_layout *l, uint64_t s, unsigned i)
{
    uint64_t start;

    if (s >= l->stripes || i >= l->k + l->m)
        return 0;
    if (i >= l->k)
        i = 0; /* a parity cell is as long as the stripe's first */
    start = s * l->k * l->cell + (uint64_t)i * l->cell;
    return start >= l->len ? 0 : TS_MIN(l->cell, l->len - start);
}

uint64_t ts_ec_frag_len(const struct ts_ec_layout *l, unsigned i)
{
    if (!l->stripes || i >= l->k + l->m)
        return 0;
    /* Every stripe but the last is whole. */
    return (l->stripes - 1) * l->cell + ts_ec_cell_len(l, l->stripes - 1, i);
}

size_t ts_ec_map(const struct ts_ec_layout *l, uint64_t off, uint64_t len, struct ts_ec_piece *out,
                 size_t cap)
{
    uint64_t stripe_bytes = l->k * l->cell, end;
    size_t n = 0;

    if (off >= l->len)
        return 0;
    end = off + TS_MIN(len, l->len - off);
    while (off < end) {
        uint64_t s = off / stripe_bytes, in = off % stripe_bytes;
        unsigned i = (unsigned)(in / l->cell);
        uint64_t o = in % l->cell, take = TS_MIN(l->cell - o, end - off);
        if (n < cap)
            out[n] = (struct ts_ec_piece){s, i, s * l->cell + o, o, off, take};
        n++;
        off += take;
    }
    return n;
}
