/*
 * Erasure-coded shards over the router (issue 33). A shard's K+M fragments (common/ec_layout.c)
 * live on the K+M nodes of its PG's EC order (ts_map_ec_order), fragment f on position f, each
 * kept by its node as shard SHARD of the store dataset NAME#f: chunked, a CRC32C per chunk and
 * per 4 KiB sub-block, checked on every read like any shard's bytes.
 *
 * A read of a range reads the data fragments that hold it, as they are (no decoding). Where a
 * fragment cannot be read (its node down or unreachable, the fragment missing, its bytes failing
 * their CRC32C), the same cells are read from other fragments until K are in hand, and the
 * wanted bytes are rebuilt from them: a function of verified bytes only. With fewer than K
 * readable the read fails with TS_EUNAVAIL and names each fragment it could not read.
 */
#include "cluster_internal.h"
#include "ts_ec.h"
#include "ts_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAC "client"

/* The fragments of one shard: where each lives, and what went wrong with it. */
struct ec_shard {
    struct ts_ec_layout lay;
    ts_ec *ec;
    unsigned n;            /* k + m */
    int node[TS_FRAG_MAX]; /* map node index of position f */
    char name[TS_FRAG_MAX][TS_NAME_MAX + 1];
    int bad[TS_FRAG_MAX]; /* 1: not readable in this call (why in why[]) */
    char why[WHY_LEN];
};

static int ec_shard_init(tessera_client *c, struct ts_cluster *cl, struct ec_shard *e,
                         const char *name, uint32_t shard, uint64_t len, unsigned k, unsigned m)
{
    int ord[TS_FRAG_MAX];
    size_t got;
    int rc;

    memset(e, 0, sizeof(*e));
    if (!cl->map)
        return TS_EINVAL;
    rc = ts_ec_layout_for(&e->lay, k, m, len);
    if (rc) {
        ts_conn_set_error(c, "ec %u+%u: K must be 1 to %d and M 1 to %d", k, m, TS_EC_MAX_K,
                          TS_EC_MAX_M);
        return rc;
    }
    e->n = k + m;
    got = ts_map_ec_order(cl->map, ts_map_pg_of(cl->map, name, shard), ord, e->n);
    if (got < e->n) {
        ts_conn_set_error(c,
                          "%s/%u: ec %u+%u needs %u nodes that are not out, the map (epoch "
                          "%llu) has %zu",
                          name, shard, k, m, e->n, (unsigned long long)cl->map->epoch, got);
        return TS_EUNAVAIL;
    }
    for (unsigned f = 0; f < e->n; f++) {
        e->node[f] = ord[f];
        rc = ts_frag_name(e->name[f], name, f);
        if (rc) {
            ts_conn_set_error(c, "%s: too long a name for its fragments (NAME#%u within %d bytes)",
                              name, f, TS_NAME_MAX);
            return rc;
        }
    }
    rc = ts_ec_create(&e->ec, k, m);
    return rc;
}

/* Fragment f could not be read or written: rc, and the node's message. */
static void ec_fail(struct ts_cluster *cl, struct ec_shard *e, unsigned f, int rc, const char *msg)
{
    e->bad[f] = 1;
    ts_cl_why_add(e->why, "fragment %u on %s: %s%s%s", f, cl->map->nodes[e->node[f]].id,
                  ts_errname(rc), msg && msg[0] ? ": " : "", msg ? msg : "");
}

/* The connection to position f's node; a node the map says is down is not tried. */
static int ec_sub(struct ts_cluster *cl, struct ec_shard *e, unsigned f, size_t *p,
                  tessera_client **sub)
{
    const struct ts_map_node *nd = &cl->map->nodes[e->node[f]];
    int rc;

    if (nd->state != TS_NODE_UP) {
        ec_fail(cl, e, f, TS_EUNAVAIL, "the map says it is down");
        return TS_EUNAVAIL;
    }
    rc = ts_cl_node_peer(cl, cl->map, (size_t)e->node[f], p);
    if (!rc && !cl->peers[*p].conn && ts_cl_recently_failed(&cl->peers[*p])) {
        /* Failed a moment ago: the other fragments serve; it is tried again after a while. */
        ec_fail(cl, e, f, TS_EUNAVAIL, "its connection failed a moment ago");
        return TS_EUNAVAIL;
    }
    if (!rc)
        rc = ts_cl_peer_conn(cl, *p, 0, sub);
    if (rc)
        ec_fail(cl, e, f, rc, "no connection");
    return rc;
}

/* Reads [off, off+len) of fragment f into buf: 0, or marks it bad. */
static int ec_read_frag(struct ts_cluster *cl, struct ec_shard *e, unsigned f, uint32_t shard,
                        uint64_t off, size_t len, uint8_t *buf)
{
    char msg[256];
    tessera_client *sub;
    size_t p, got = 0;
    int rc;

    if (e->bad[f])
        return TS_EUNAVAIL;
    if (!len)
        return 0;
    rc = ec_sub(cl, e, f, &p, &sub);
    if (rc)
        return rc;
    rc = ts_cl_peer_done(cl, p, sub, ts_conn_read(sub, e->name[f], shard, off, len, buf, &got), msg,
                         sizeof(msg));
    if (rc == 0 && got != len) {
        rc = TS_ECORRUPT;
        snprintf(msg, sizeof(msg), "%zu of %zu bytes at %llu", got, len, (unsigned long long)off);
    }
    if (rc)
        ec_fail(cl, e, f, rc, msg);
    return rc;
}

int ts_cl_ec_put(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                 const void *buf, size_t len, unsigned k, unsigned m)
{
    struct ec_shard e;
    const uint8_t *src = buf;
    uint8_t *frag[TS_FRAG_MAX] = {0};
    int rc = ec_shard_init(c, cl, &e, name, shard, len, k, m);

    if (rc)
        goto out;
    /* Each fragment as stripes x cell bytes, zero past the shard's end (the short cells of the
     * last stripe are encoded zero-padded); only ts_ec_frag_len bytes of it are stored. */
    for (unsigned f = 0; f < e.n && !rc; f++)
        if (!(frag[f] = calloc(e.lay.stripes ? e.lay.stripes : 1, e.lay.cell)))
            rc = TS_ENOMEM;
    for (uint64_t s = 0; s < e.lay.stripes && !rc; s++) {
        uint8_t *d[TS_EC_MAX_K], *pa[TS_EC_MAX_M];
        for (unsigned i = 0; i < k; i++) {
            d[i] = frag[i] + s * e.lay.cell;
            memcpy(d[i], src + s * k * e.lay.cell + i * e.lay.cell, ts_ec_cell_len(&e.lay, s, i));
        }
        for (unsigned j = 0; j < m; j++)
            pa[j] = frag[k + j] + s * e.lay.cell;
        ts_ec_encode(e.ec, ts_ec_cell_len(&e.lay, s, 0), d, pa);
    }
    /* Every fragment must be durable on its node (its put returns at its seal): all put at
     * once, each node storing and syncing its own while the others do. */
    if (!rc) {
        tessera_client *sub[TS_FRAG_MAX];
        const char *names[TS_FRAG_MAX];
        const void *bufs[TS_FRAG_MAX];
        size_t p[TS_FRAG_MAX], lens[TS_FRAG_MAX];
        int rcs[TS_FRAG_MAX];
        for (unsigned f = 0; f < e.n && !rc; f++) {
            rc = ec_sub(cl, &e, f, &p[f], &sub[f]); /* marks the fragment bad, says why */
            names[f] = e.name[f];
            bufs[f] = frag[f];
            lens[f] = (size_t)ts_ec_frag_len(&e.lay, f);
        }
        if (!rc) {
            ts_conn_put_many(sub, names, shard, bufs, lens, rcs, e.n);
            for (unsigned f = 0; f < e.n; f++) {
                char msg[256];
                int r = ts_cl_peer_done(cl, p[f], sub[f], rcs[f], msg, sizeof(msg));
                if (r) {
                    ec_fail(cl, &e, f, r, msg);
                    rc = rc ? rc : r;
                }
            }
        }
        if (rc)
            ts_conn_set_error(c, "%s/%u: ec %u+%u: %s", name, shard, k, m, e.why);
    }
out:
    for (unsigned f = 0; f < TS_FRAG_MAX; f++)
        free(frag[f]);
    ts_ec_destroy(e.ec);
    return rc;
}

/* The bytes [lo, hi) of fragment g's cell of stripe st that it stores (a data cell of the short
 * last stripe holds fewer; the rest of the cell is zero). */
static size_t ec_stored(const struct ec_shard *e, uint64_t st, unsigned g, uint64_t lo, uint64_t hi)
{
    uint64_t cell = ts_ec_cell_len(&e->lay, st, g);

    return cell > lo ? (size_t)(TS_MIN(hi, cell) - lo) : 0;
}

/* Reads [lo, hi) of the cells of stripe st of the fragments in `want` into ptr[g], all at once
 * (one submitted read per node, then the waits); the bits of those read in full, verified. */
static uint64_t ec_read_cells(struct ts_cluster *cl, struct ec_shard *e, uint32_t shard,
                              uint64_t st, uint64_t lo, uint64_t hi, uint64_t want, uint8_t **ptr)
{
    tessera_client *sub[TS_FRAG_MAX];
    uint64_t op[TS_FRAG_MAX], sent = 0, got_bits = 0;
    size_t peer[TS_FRAG_MAX], len[TS_FRAG_MAX];

    for (unsigned g = 0; g < e->n; g++) {
        if (!(want >> g & 1) || e->bad[g])
            continue;
        len[g] = ec_stored(e, st, g, lo, hi);
        memset(ptr[g] + len[g], 0, (size_t)(hi - lo) - len[g]);
        if (!len[g]) {
            got_bits |= 1ull << g;
            continue;
        }
        if (ec_sub(cl, e, g, &peer[g], &sub[g]) != 0)
            continue;
        if (ts_conn_read_submit(sub[g], e->name[g], shard, st * e->lay.cell + lo, len[g], ptr[g],
                                &op[g]) == 0)
            sent |= 1ull << g;
        else
            ec_fail(cl, e, g, TS_EIO, ts_conn_error(sub[g]));
    }
    for (unsigned g = 0; g < e->n; g++) {
        char msg[256];
        size_t got = 0;
        int rc;
        if (!(sent >> g & 1))
            continue;
        rc = ts_cl_peer_done(cl, peer[g], sub[g], ts_conn_wait(sub[g], op[g], &got), msg,
                             sizeof(msg));
        if (rc == 0 && got != len[g])
            rc = TS_ECORRUPT;
        if (rc)
            ec_fail(cl, e, g, rc, msg);
        else
            got_bits |= 1ull << g;
    }
    return got_bits;
}

/*
 * Pieces pcs[0..np) of any stripes read straight from their data fragments, all at once (one
 * submitted read each, then the waits): bit i of the result set when piece i was read whole.
 * A failure here marks nothing bad: ec_stripe reads such a piece again and says why.
 */
static uint64_t ec_read_direct(struct ts_cluster *cl, struct ec_shard *e, uint32_t shard,
                               const struct ts_ec_piece *pcs, size_t np, uint8_t *buf, uint64_t off)
{
    tessera_client *sub[64];
    uint64_t op[64], sent = 0, ok = 0;
    size_t p;

    for (size_t i = 0; i < np && i < 64; i++) {
        const struct ts_ec_piece *pc = &pcs[i];
        if (!pc->len) {
            ok |= 1ull << i;
            continue;
        }
        if (e->bad[pc->frag] || ec_sub(cl, e, pc->frag, &p, &sub[i]) != 0)
            continue;
        if (ts_conn_read_submit(sub[i], e->name[pc->frag], shard, pc->frag_off, (size_t)pc->len,
                                buf + (pc->shard_off - off), &op[i]) == 0)
            sent |= 1ull << i;
    }
    for (size_t i = 0; i < np && i < 64; i++) {
        size_t got = 0;
        if ((sent >> i & 1) && ts_conn_wait(sub[i], op[i], &got) == 0 && got == pcs[i].len)
            ok |= 1ull << i;
    }
    return ok;
}

/*
 * Pieces pcs[0..np) of one stripe, read straight from their data fragments (but those whose
 * bit is set in done: read already); those that fail are rebuilt together: over the cell bytes [lo,
 * hi) they span, from K fragments, reusing the pieces already read where they cover [lo, hi) and
 * reading the rest in parallel.
 */
static int ec_stripe(tessera_client *c, struct ts_cluster *cl, struct ec_shard *e, const char *name,
                     uint32_t shard, const struct ts_ec_piece *pcs, size_t np, uint64_t done,
                     uint8_t *buf, uint64_t off, uint8_t *scratch, struct ts_ec_read_stats *st)
{
    unsigned k = e->lay.k;
    uint64_t lost = 0, have = 0, lo = UINT64_MAX, hi = 0, s = pcs[0].stripe;
    uint8_t *ptr[TS_FRAG_MAX];
    size_t len;
    int rc;

    for (size_t i = 0; i < np; i++) {
        const struct ts_ec_piece *pc = &pcs[i];
        if (done >> i & 1)
            continue; /* read already (ec_read_direct) */
        if (ec_read_frag(cl, e, pc->frag, shard, pc->frag_off, (size_t)pc->len,
                         buf + (pc->shard_off - off)) == 0) {
            if (st)
                st->direct++;
            continue;
        }
        lost |= 1ull << pc->frag;
        lo = TS_MIN(lo, pc->cell_off);
        hi = TS_MAX(hi, pc->cell_off + pc->len);
    }
    if (!lost)
        return 0;
    len = (size_t)(hi - lo);
    for (unsigned g = 0; g < e->n; g++)
        ptr[g] = scratch + (size_t)g * e->lay.cell;
    /* Data pieces read whole over [lo, hi) serve as they are. */
    for (size_t i = 0; i < np; i++) {
        const struct ts_ec_piece *pc = &pcs[i];
        if (!(lost >> pc->frag & 1) && pc->cell_off <= lo && pc->cell_off + pc->len >= hi) {
            ptr[pc->frag] = buf + (pc->shard_off - off) + (lo - pc->cell_off);
            have |= 1ull << pc->frag;
        }
    }
    /* The rest from other fragments, K at a time, until K are in hand or none is left. */
    for (;;) {
        uint64_t want = 0;
        unsigned n = (unsigned)__builtin_popcountll(have), left = 0;
        for (unsigned g = 0; g < e->n && n + left < k; g++)
            if (!(have >> g & 1) && !(lost >> g & 1) && !e->bad[g]) {
                want |= 1ull << g;
                left++;
            }
        if (n >= k || !want)
            break;
        have |= ec_read_cells(cl, e, shard, s, lo, hi, want, ptr);
    }
    rc = ts_ec_decode(e->ec, len, ptr, have, lost);
    if (rc == TS_EUNAVAIL) {
        ts_conn_set_error(c,
                          "%s/%u: stripe %llu: %d of %u fragments readable, %u needed (ec "
                          "%u+%u): %s",
                          name, shard, (unsigned long long)s, __builtin_popcountll(have), e->n, k,
                          k, e->lay.m, e->why);
        return rc;
    }
    if (rc)
        return rc;
    for (size_t i = 0; i < np; i++) {
        const struct ts_ec_piece *pc = &pcs[i];
        if (lost >> pc->frag & 1) {
            memcpy(buf + (pc->shard_off - off), ptr[pc->frag] + (pc->cell_off - lo),
                   (size_t)pc->len);
            if (st)
                st->rebuilt++;
        }
    }
    return 0;
}

int ts_cl_ec_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                  uint64_t shard_len, unsigned k, unsigned m, uint64_t off, size_t len, void *buf,
                  struct ts_ec_read_stats *st)
{
    struct ts_ec_piece pcs[64];
    struct ec_shard e;
    uint8_t *scratch = NULL;
    uint64_t at = off, end;
    int rc = ec_shard_init(c, cl, &e, name, shard, shard_len, k, m);

    if (st)
        memset(st, 0, sizeof(*st));
    if (!rc && (off > shard_len || len > shard_len - off)) {
        ts_conn_set_error(c, "%s/%u: range %llu+%zu past the shard's %llu bytes", name, shard,
                          (unsigned long long)off, len, (unsigned long long)shard_len);
        rc = TS_ERANGE;
    }
    if (!rc && len && !(scratch = malloc((size_t)e.n * e.lay.cell)))
        rc = TS_ENOMEM;
    end = off + len;
    while (!rc && at < end) {
        /* Up to 64 pieces read at once from their data fragments; a stripe with a piece that
         * could not be is then read, or rebuilt, as one. */
        size_t np =
            TS_MIN(ts_ec_map(&e.lay, at, end - at, pcs, TS_ARRAY_SIZE(pcs)), TS_ARRAY_SIZE(pcs));
        uint64_t ok = ec_read_direct(cl, &e, shard, pcs, np, buf, off);
        if (st)
            st->direct += (uint64_t)__builtin_popcountll(ok);
        for (size_t i = 0, j; !rc && i < np; i = j) {
            uint64_t part;
            for (j = i + 1; j < np && pcs[j].stripe == pcs[i].stripe;)
                j++;
            part = (ok >> i) & ((j - i) == 64 ? ~0ull : (1ull << (j - i)) - 1);
            if (part != ((j - i) == 64 ? ~0ull : (1ull << (j - i)) - 1))
                rc = ec_stripe(c, cl, &e, name, shard, pcs + i, j - i, part, buf, off, scratch, st);
        }
        at = pcs[np - 1].shard_off + pcs[np - 1].len;
    }
    if (st)
        for (unsigned f = 0; f < e.n; f++)
            if (e.bad[f])
                st->bad |= 1ull << f;
    free(scratch);
    ts_ec_destroy(e.ec);
    return rc;
}

static const struct policy *ec_policy(const struct ts_cluster *cl, const char *name)
{
    for (size_t i = 0; i < cl->npols; i++)
        if (strcmp(cl->pols[i].name, name) == 0)
            return cl->pols[i].ec_k ? &cl->pols[i] : NULL;
    return NULL;
}

int ts_cl_ec_dropped(const struct ts_cluster *cl, const char *name)
{
    const struct policy *pol = ec_policy(cl, name);
    return pol && pol->ec_dropped;
}

int ts_cl_ec_try_read(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
                      uint64_t off, size_t len, void *buf, size_t *out_len, tessera_client *sub,
                      size_t p, int *rc)
{
    const struct policy *pol = ec_policy(cl, name);
    struct ts_shard_info si;
    unsigned k, m;
    int dropped;
    size_t n;

    if (!pol)
        return 0;
    k = pol->ec_k; /* copied: the calls below may change cl->pols */
    m = pol->ec_m;
    dropped = pol->ec_dropped;
    /* The shard's length lays its fragments out (its replicas keep the record, bytes or not). */
    if (ts_cl_peer_done(cl, p, sub, ts_conn_shard_stat(sub, name, shard, &si), NULL, 0) != 0 ||
        off > si.size)
        return 0; /* the replica's read reports it, or moves on to another */
    n = (size_t)TS_MIN((uint64_t)len, si.size - off);
    *rc = ts_cl_ec_read(c, cl, name, shard, si.size, k, m, off, n, buf, NULL);
    if (*rc == 0) {
        *out_len = n;
        cl->ec_reads++;
        return 1;
    }
    if (dropped) {
        /* The fragments are the only copy, unless the dataset was tiered back since its policy
         * was cached (its fragments then go once every replica holds its bytes again). */
        struct ts_dataset_info d;
        ts_cl_policy_forget(cl, name);
        if (ts_cl_peer_done(cl, p, sub, ts_conn_dataset_policy(sub, name, &d), NULL, 0) != 0 ||
            d.policy.ec_dropped)
            return 1; /* their error is the read's */
        ts_cl_policy_keep(cl, name, &d.policy);
        TS_INFO(FAC, "%s: tiered back to replicated since its policy was read: reading a replica",
                name);
        return 0;
    }
    TS_WARN(FAC, *rc, "%s/%u: its fragments could not serve the read (%s): reading a replica", name,
            shard, ts_conn_error(c));
    cl->ec_fallbacks++;
    return 0;
}

int ts_cl_ec_cop(struct ts_cluster *cl, struct cop *k)
{
    k->inflight = k->retry = 0;
    free(k->msg);
    k->msg = NULL;
    if (k->rv) {
        for (size_t i = 0; i < k->nrv; i++)
            k->rv[i].rc = ts_cl_read(cl->c, cl, k->name, k->rv[i].shard, k->rv[i].off, k->rv[i].len,
                                     k->rv[i].dst, &k->rv[i].got);
        k->rc = 0;
    } else {
        k->rc = ts_cl_read(cl->c, cl, k->name, k->shard, k->off, k->len, k->buf, &k->got);
    }
    if (k->rc)
        k->msg = strdup(ts_conn_error(cl->c));
    return 0;
}

/* ---- repair ---------------------------------------------------------------------------------- */

/* Bytes [a, a+len) of fragment f (its own offsets) rebuilt into out from K other fragments,
 * one cell of a stripe at a time. */
static int ec_rebuild_range(struct ts_cluster *cl, struct ec_shard *e, uint32_t shard, unsigned f,
                            uint64_t a, size_t len, uint8_t *out, uint8_t *scratch)
{
    uint64_t at = a, end = a + len, cell = e->lay.cell;
    int bad_before = e->bad[f];

    e->bad[f] = 1; /* never its own survivor */
    while (at < end) {
        uint64_t s = at / cell, lo = at % cell, hi = TS_MIN(cell, lo + (end - at)), have = 0;
        uint8_t *ptr[TS_FRAG_MAX];
        int rc;
        for (unsigned g = 0; g < e->n; g++)
            ptr[g] = scratch + (size_t)g * cell;
        for (;;) {
            uint64_t want = 0;
            unsigned nh = (unsigned)__builtin_popcountll(have), left = 0;
            for (unsigned g = 0; g < e->n && nh + left < e->lay.k; g++)
                if (!(have >> g & 1) && !e->bad[g]) {
                    want |= 1ull << g;
                    left++;
                }
            if (nh >= e->lay.k || !want)
                break;
            have |= ec_read_cells(cl, e, shard, s, lo, hi, want, ptr);
        }
        ptr[f] = out + (at - a);
        rc = ts_ec_decode(e->ec, (size_t)(hi - lo), ptr, have, 1ull << f);
        if (rc) {
            e->bad[f] = bad_before;
            return rc;
        }
        at += hi - lo;
    }
    e->bad[f] = bad_before;
    return 0;
}

/* Fragment f of the shard on its node: put whole where it is missing; with TS_REPAIR_FULL its
 * chunks that fail their CRC32C there rewritten with rebuilt bytes (CHUNK_REPAIR), with
 * TS_REPAIR_CHUNK chunk `chunk` rewritten so without reading it (its node found it damaged; the
 * node takes only bytes matching the chunk's stored CRC32C), with TS_REPAIR_PRESENCE nothing
 * read. */
static int ec_repair_frag(tessera_client *c, struct ts_cluster *cl, struct ec_shard *e,
                          uint32_t shard, unsigned f, uint8_t *scratch, int mode, uint32_t chunk,
                          struct tessera_repair_report *rep)
{
    uint64_t want = ts_ec_frag_len(&e->lay, f);
    struct ts_shard_info si;
    char msg[256];
    tessera_client *sub;
    uint8_t *buf = NULL;
    size_t p;
    int rc = ec_sub(cl, e, f, &p, &sub);

    if (rc) {
        rep->unreachable++;
        return 0; /* a hole: repaired when its node is back, or out (then elsewhere) */
    }
    rc = ts_cl_peer_done(cl, p, sub, ts_conn_shard_stat(sub, e->name[f], shard, &si), msg,
                         sizeof(msg));
    if (rc == TS_ENOENT || (rc == 0 && si.state != TS_SHARD_COMPLETE)) {
        if (!(buf = malloc(want ? want : 1)))
            return TS_ENOMEM;
        rc = ec_rebuild_range(cl, e, shard, f, 0, (size_t)want, buf, scratch);
        if (!rc)
            rc = ts_cl_peer_done(cl, p, sub,
                                 ts_conn_put(sub, e->name[f], shard, buf, (size_t)want, NULL, 0),
                                 msg, sizeof(msg));
        if (!rc) {
            rep->fragments_put++;
            rep->bytes_rebuilt += want;
        }
    } else if (rc == 0 && si.size != want) {
        snprintf(msg, sizeof(msg), "it holds %llu bytes, the layout says %llu",
                 (unsigned long long)si.size, (unsigned long long)want);
        rc = TS_ECORRUPT;
    } else if (rc == 0) {
        uint32_t cs = si.chunk_size ? si.chunk_size : TS_DEFAULT_CHUNK_SIZE;
        if (!(buf = malloc(TS_MIN((uint64_t)cs, want ? want : 1))))
            return TS_ENOMEM;
        uint64_t from = mode == TS_REPAIR_CHUNK ? (uint64_t)chunk * cs : 0;
        uint64_t to = mode == TS_REPAIR_CHUNK ? TS_MIN(want, from + 1) : want;
        if (mode == TS_REPAIR_PRESENCE)
            to = 0;
        for (uint64_t off = from; off < to && !rc; off += cs) {
            size_t clen = (size_t)TS_MIN((uint64_t)cs, want - off), got = 0;
            int r =
                mode == TS_REPAIR_CHUNK
                    ? TS_ECORRUPT
                    : ts_cl_peer_done(cl, p, sub,
                                      ts_conn_read(sub, e->name[f], shard, off, clen, buf, &got),
                                      msg, sizeof(msg));
            if (r == 0 && got == clen)
                continue;
            if (r != TS_ECORRUPT && r != 0) {
                rc = r; /* not the bytes: the node or the connection */
                break;
            }
            rc = ec_rebuild_range(cl, e, shard, f, off, clen, buf, scratch);
            if (!rc)
                rc =
                    ts_cl_peer_done(cl, p, sub,
                                    ts_conn_chunk_repair(sub, e->name[f], shard,
                                                         (uint32_t)(off / cs), buf, (uint32_t)clen),
                                    msg, sizeof(msg));
            if (!rc) {
                rep->chunks_repaired++;
                rep->bytes_rebuilt += clen;
            }
        }
    }
    free(buf);
    if (rc) {
        rep->failed++;
        ts_cl_why_add(e->why, "fragment %u on %s: %s%s%s", f, cl->map->nodes[e->node[f]].id,
                      ts_errname(rc), msg[0] ? ": " : "", msg);
    }
    return rc;
}

/* A presence repair's view of the fragment stores: what each node holds of each store NAME#f,
 * listed once per (node, f) on first use (one request a node and fragment, not one a shard and
 * fragment). A fragment the listing shows complete and of its layout's length is in place; any
 * other goes through ec_repair_frag, which asks its node again. */
struct frag_held {
    struct ts_shard_info *v; /* sorted by shard */
    size_t n;
    int listed; /* 0 not yet, 1 listed, -1 could not be (its fragments checked one by one) */
};

struct frag_index {
    uint64_t epoch; /* of the map the node indexes are of */
    size_t nodes;
    struct frag_held *held; /* nodes x TS_FRAG_MAX */
};

static int shard_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct ts_shard_info *)a)->shard,
             y = ((const struct ts_shard_info *)b)->shard;
    return x < y ? -1 : x > y;
}

static int frag_index_init(struct ts_cluster *cl, struct frag_index *ix)
{
    ix->epoch = cl->map ? cl->map->epoch : 0;
    ix->nodes = cl->map ? cl->map->n : 0;
    ix->held = calloc(ix->nodes ? ix->nodes * TS_FRAG_MAX : 1, sizeof(*ix->held));
    return ix->held ? 0 : TS_ENOMEM;
}

static void frag_index_free(struct frag_index *ix)
{
    for (size_t i = 0; ix->held && i < ix->nodes * TS_FRAG_MAX; i++)
        free(ix->held[i].v);
    free(ix->held);
}

/* 1 when fragment f of the shard is in place on its node by that node's listing. */
static int frag_in_place(struct ts_cluster *cl, struct frag_index *ix, const struct ec_shard *e,
                         uint32_t shard, unsigned f)
{
    struct ts_shard_info key = {.shard = shard}, *at;
    struct frag_held *h;
    char msg[256];
    tessera_client *sub;
    size_t p;

    if (!cl->map || cl->map->epoch != ix->epoch || (size_t)e->node[f] >= ix->nodes)
        return 0; /* the map changed meanwhile: checked on its own */
    h = &ix->held[(size_t)e->node[f] * TS_FRAG_MAX + f];
    if (!h->listed) {
        int rc = -1;
        h->listed = -1;
        if (cl->map->nodes[e->node[f]].state == TS_NODE_UP &&
            ts_cl_node_peer(cl, cl->map, (size_t)e->node[f], &p) == 0 &&
            !(!cl->peers[p].conn && ts_cl_recently_failed(&cl->peers[p])) &&
            ts_cl_peer_conn(cl, p, 0, &sub) == 0)
            rc = ts_cl_peer_done(cl, p, sub, ts_conn_shard_list(sub, e->name[f], &h->v, &h->n), msg,
                                 sizeof(msg)); /* not the caller's: a miss is no error */

        if (rc == TS_ENOENT) /* no store NAME#f there: none of its fragments f */
            rc = 0;
        if (rc == 0) {
            h->listed = 1;
            if (h->n > 1)
                qsort(h->v, h->n, sizeof(*h->v), shard_cmp);
        }
    }
    if (h->listed != 1 || !h->n)
        return 0;
    at = bsearch(&key, h->v, h->n, sizeof(*h->v), shard_cmp);
    return at && at->state == TS_SHARD_COMPLETE && at->size == ts_ec_frag_len(&e->lay, f);
}

int ts_cl_dataset_repair(tessera_client *c, struct ts_cluster *cl, const char *name, int mode,
                         struct tessera_repair_report *rep)
{
    struct ts_shard_info *v = NULL;
    struct ts_dataset_info d;
    struct frag_index ix = {0};
    char why[WHY_LEN] = "";
    size_t n = 0;
    int rc;

    memset(rep, 0, sizeof(*rep));
    rc = ts_cl_dataset_stat(c, cl, name, &d);
    if (rc)
        return rc;
    if (!d.policy.ec_k) {
        ts_conn_set_error(c,
                          "dataset %s is not erasure-coded: its replicas repair each other "
                          "(tessera scrub)",
                          name);
        return TS_EINVAL;
    }
    rc = ts_cl_shard_list(c, cl, name, &v, &n);
    if (!rc && mode == TS_REPAIR_PRESENCE)
        rc = frag_index_init(cl, &ix);
    for (size_t i = 0; !rc && i < n; i++) {
        struct ec_shard e;
        uint8_t *scratch = NULL;
        rc = ec_shard_init(c, cl, &e, name, v[i].shard, v[i].size, d.policy.ec_k, d.policy.ec_m);
        if (!rc && !(scratch = malloc((size_t)e.n * e.lay.cell)))
            rc = TS_ENOMEM;
        for (unsigned f = 0; !rc && f < e.n; f++)
            if (!ix.held || !frag_in_place(cl, &ix, &e, v[i].shard, f))
                ec_repair_frag(c, cl, &e, v[i].shard, f, scratch, mode, 0, rep);
        if (e.why[0])
            ts_cl_why_add(why, "%s/%u: %s", name, v[i].shard, e.why);
        rep->shards++;
        free(scratch);
        ts_ec_destroy(e.ec);
    }
    free(v);
    frag_index_free(&ix);
    if (!rc && why[0])
        ts_conn_set_error(c, "%s", why);
    return rc ? rc : (rep->failed ? TS_EIO : 0);
}

int ts_cl_ec_chunk_repair(tessera_client *c, struct ts_cluster *cl, const char *frag,
                          uint32_t shard, uint32_t chunk, struct tessera_repair_report *rep)
{
    char base[TS_NAME_MAX + 1];
    struct ts_dataset_info d;
    struct ts_shard_info si;
    struct ec_shard e;
    uint8_t *scratch = NULL;
    unsigned f;
    int rc;

    memset(rep, 0, sizeof(*rep));
    if (!ts_frag_split(frag, base, &f)) {
        ts_conn_set_error(c, "'%s' is not a fragment's name (NAME#f)", frag);
        return TS_EINVAL;
    }
    rc = ts_cl_dataset_stat(c, cl, base, &d);
    if (!rc && (!d.policy.ec_k || f >= (unsigned)d.policy.ec_k + d.policy.ec_m)) {
        ts_conn_set_error(c, "dataset %s has no fragment %u (it is %s)", base, f,
                          d.policy.ec_k ? "erasure-coded with fewer" : "not erasure-coded");
        return TS_ENOENT; /* nothing to repair (tiered back since it was noted, say) */
    }
    if (!rc)
        rc = ts_cl_shard_stat(c, cl, base, shard, &si);
    if (rc)
        return rc;
    rc = ec_shard_init(c, cl, &e, base, shard, si.size, d.policy.ec_k, d.policy.ec_m);
    if (!rc && !(scratch = malloc((size_t)e.n * e.lay.cell)))
        rc = TS_ENOMEM;
    if (!rc)
        rc = ec_repair_frag(c, cl, &e, shard, f, scratch,
                            chunk == UINT32_MAX ? TS_REPAIR_PRESENCE : TS_REPAIR_CHUNK, chunk, rep);
    rep->shards = 1;
    if (e.why[0])
        ts_conn_set_error(c, "%s/%u: %s", base, shard, e.why);
    free(scratch);
    ts_ec_destroy(e.ec);
    return rc ? rc : (rep->unreachable ? TS_EUNAVAIL : 0);
}
