/*
 * Erasure coding for the cold tier (issue 33): a Reed-Solomon code over GF(2^8) with a Cauchy
 * matrix (ISA-L), and the stripe layout that cuts a shard into fragments.
 *
 * A shard of L bytes under `ec K+M` with cell size C is cut into stripes of K cells of C bytes:
 * stripe s holds shard bytes [s*K*C, (s+1)*K*C), its cell i (i < K) bytes [s*K*C + i*C, + C).
 * Data fragment i is cell i of every stripe, back to back, so a healthy read of any range is a
 * read of the data fragments that hold it, with no decoding. Parity fragment j (K <= j < K+M)
 * is the code's row j over each stripe's cells. The last stripe may be short: its cells are
 * taken as zero past the shard's end, and its parity cells are as long as its first (longest)
 * cell. Each fragment is stored and checked like a shard of its own (chunks, CRC32C).
 */
#ifndef TS_EC_H
#define TS_EC_H

#include <stddef.h>
#include <stdint.h>

#define TS_EC_MAX_K 32
#define TS_EC_MAX_M 8

typedef struct ts_ec ts_ec;

/* Parses "ec:K+M" (also "K+M") into *k and *m: 0, or TS_EINVAL with a message in err (1 <= K
 * <= TS_EC_MAX_K, 1 <= M <= TS_EC_MAX_M). */
int ts_ec_parse(const char *s, unsigned *k, unsigned *m, char *err, size_t errlen);

/* A code of k data and m parity fragments (limits as ts_ec_parse's); *out owned by the caller,
 * freed by ts_ec_destroy (NULL is a no-op). TS_EINVAL, TS_ENOMEM. */
int ts_ec_create(ts_ec **out, unsigned k, unsigned m);
void ts_ec_destroy(ts_ec *ec);
unsigned ts_ec_k(const ts_ec *ec);
unsigned ts_ec_m(const ts_ec *ec);

/* The m parity cells of one stripe from its k data cells, each len bytes (data is read, parity
 * written; a short data cell is passed zero-padded to len). */
void ts_ec_encode(const ts_ec *ec, size_t len, uint8_t *const *data, uint8_t *const *parity);

/* Rebuilds the fragments in `want` (bit i: fragment i, data 0..k-1 then parity) that are not in
 * `have` from k of those in `have`; frag[i] points at len bytes for every i in have | want. The
 * bytes of the fragments in have are only read. TS_EUNAVAIL when fewer than k are in have,
 * TS_EINVAL for bits past k+m. */
int ts_ec_decode(const ts_ec *ec, size_t len, uint8_t *const *frag, uint64_t have, uint64_t want);

/* ---- the stripe layout ---------------------------------------------------------------------- */

struct ts_ec_layout {
    unsigned k, m;
    uint64_t cell;    /* C, bytes */
    uint64_t len;     /* the shard's length */
    uint64_t stripes; /* ceil(len / (k * cell)) */
};

/* The layout of a shard of len bytes: TS_EINVAL for k, m out of limits or cell 0. */
int ts_ec_layout_init(struct ts_ec_layout *l, unsigned k, unsigned m, uint64_t cell, uint64_t len);
/* The layout a shard of len bytes is stored with: cells of ceil(len / k) rounded up to 4 KiB,
 * at most 1 MiB (a small shard is one stripe, so its parity costs what its data does / k; a
 * record of up to a cell lies in one or two cells, read from one or two nodes). */
#define TS_EC_CELL_MIN (4u << 10)
#define TS_EC_CELL_MAX (1u << 20)
int ts_ec_layout_for(struct ts_ec_layout *l, unsigned k, unsigned m, uint64_t len);
/* Fragment i's length (data: the shard bytes it holds; parity: the data fragment 0's). */
uint64_t ts_ec_frag_len(const struct ts_ec_layout *l, unsigned i);
/* The length of cell i of stripe s (0 past the shard's end; parity cells as cell 0's). */
uint64_t ts_ec_cell_len(const struct ts_ec_layout *l, uint64_t s, unsigned i);

/* Where a shard byte lies: its stripe, its data fragment, its offset in that fragment. */
struct ts_ec_piece {
    uint64_t stripe;
    unsigned frag;
    uint64_t frag_off; /* in the fragment */
    uint64_t cell_off; /* in the cell */
    uint64_t shard_off;
    uint64_t len; /* within one cell */
};

/* Cuts [off, off+len) of the shard (within it) into pieces of one cell each, in shard order:
 * fills up to cap pieces and returns how many the range needs (more than cap: call again from
 * the last piece's end). */
size_t ts_ec_map(const struct ts_ec_layout *l, uint64_t off, uint64_t len, struct ts_ec_piece *out,
                 size_t cap);

#endif
