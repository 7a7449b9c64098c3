/*
 * Plans (include/tessera/plan.h): the epoch's order of units and each rank's share of it,
 * computed per unit in constant memory, and resumable states.
 *
 * Order. "Positions" 0..N-1 are the epoch's order; position p holds unit order(p):
 *   NONE    order(p) = p
 *   GLOBAL  a keyed permutation of [0, N): a Feistel network over the smallest even-bit power
 *           of two >= N, with cycle-walking (at most 4 steps expected) — no table of N entries
 *   WINDOW  groups permuted (a table of ngroups prefix sums: memory per group, never per
 *           unit), windows of `window` consecutive groups of that order, and the positions
 *           within a window permuted with a key of their own. Without group sizes every unit
 *           is a group and the windows are blocks of `window` units (no table at all).
 * Keys come from (seed, epoch) through splitmix64; everything is 64-bit integer arithmetic, so
 * every machine and build computes the same plan.
 *
 * Shares. Level 0 splits the positions over W0 ranks by assignment and remainder. A resume adds
 * a level over what the ranks of the level below had not consumed: at the same world size
 * rank r keeps its own remaining list ("continue"); otherwise the remaining lists, concatenated
 * in rank order, are split again as an exact cover ("redistribute"). Unit k of a rank at the
 * top level maps down level by level to a position, then to its unit.
 */
#include "tessera/errno.h"
#include "tessera/plan.h"

#include "ts_common.h"
#include "ts_proto.h"

#include <stdlib.h>
#include <string.h>

#define STATE_MAGIC 0x4e4c5054u /* "TPLN" */
/* Version 2: a redistributing level shares under the plan's remainder policy (version 1 split
 * it unevenly; its states are read where that makes no difference). */
#define STATE_VERSION 2
#define MAX_LEVELS 64
#define FEISTEL_ROUNDS 6

enum level_kind { LEVEL_BASE = 0, LEVEL_CONTINUE = 1, LEVEL_REDISTRIBUTE = 2 };

struct level {
    int kind;
    uint32_t world;
    uint64_t *consumed; /* of the level below, one per rank of it (not for LEVEL_BASE) */
    uint64_t *prefix;   /* REDISTRIBUTE: remaining units of the ranks below, prefix sums */
    uint64_t total;     /* units over all ranks of this level */
};

struct tessera_plan {
    struct tessera_plan_opts o;
    uint64_t key;
    uint64_t *group_start; /* WINDOW with groups: first unit of group g, g in unit order */
    uint64_t *perm_prefix; /* WINDOW with groups: prefix sums of sizes in the shuffled order */
    uint64_t *perm_group;  /* WINDOW with groups: the group at each place of the shuffled order
                              (permute(key, ngroups, t), kept: asked for once per unit) */
    uint64_t groups_hash;  /* of the group sizes given (0: none): part of the fingerprint */
    uint64_t *order;       /* GIVEN: the caller's order, copied */
    uint64_t order_hash;   /* of it: part of the fingerprint */
    uint64_t nlevels;
    struct level lv[MAX_LEVELS];
};

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A keyed bijection of [0, n). */
static uint64_t permute(uint64_t key, uint64_t n, uint64_t x)
{
    unsigned bits = 0, h;
    uint64_t mask;

    if (n <= 1)
        return 0;
    while (bits < 64 && (n - 1) >> bits)
        bits++;
    h = (bits + 1) / 2;
    mask = h >= 64 ? ~0ull : (1ull << h) - 1;
    do {
        uint64_t l = x >> h, r = x & mask;
        for (unsigned i = 0; i < FEISTEL_ROUNDS; i++) {
            uint64_t t = l ^ (mix(key ^ mix(r + ((uint64_t)i << 56))) & mask);
            l = r;
            r = t;
        }
        x = (l << h) | r;
    } while (x >= n); /* cycle-walking: the domain is at most 4n */
    return x;
}

/* The last index i with a[i] <= v, for ascending a[0..n] (a[0] = 0 <= v < a[n]). */
static size_t upper_slot(const uint64_t *a, size_t n, uint64_t v)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= v)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The unit at position p of the epoch's order. */
static uint64_t order(const tessera_plan *p, uint64_t pos)
{
    const struct tessera_plan_opts *o = &p->o;
    uint64_t n = o->units, w = o->window;

    switch (o->shuffle) {
    case TESSERA_SHUFFLE_GLOBAL:
        return permute(p->key, n, pos);
    case TESSERA_SHUFFLE_WINDOW:
        if (!p->perm_prefix) {
            /* Blocks of w units: the full blocks in a shuffled order, the units shuffled
             * within each; a short last block stays last (shuffled within). */
            uint64_t nfull = n / w, t = pos / w, blk;
            if (t >= nfull)
                return nfull * w + permute(mix(p->key ^ ~0ull), n - nfull * w, pos - nfull * w);
            blk = permute(p->key, nfull, t);
            return blk * w + permute(mix(p->key ^ blk), w, pos - t * w);
        } else {
            const uint64_t *s = p->perm_prefix;
            size_t ng = o->ngroups, t = upper_slot(s, ng, pos), win = t / w;
            uint64_t lo = s[win * w], hi = s[TS_MIN((size_t)(win + 1) * w, ng)];
            uint64_t q = lo + permute(mix(p->key ^ (0x5bd1e995ull + win)), hi - lo, pos - lo);
            size_t t2 = upper_slot(s, ng, q);
            uint64_t g = p->perm_group[t2];
            return p->group_start[g] + (q - s[t2]);
        }
    case TESSERA_SHUFFLE_GIVEN:
        return p->order[pos];
    default:
        return pos;
    }
}

/* ---- shares ------------------------------------------------------------------------------- */

/* Units rank r of world gets of a sequence of total units under the remainder policy. */
static uint64_t share_count(int remainder, uint64_t total, uint32_t world, uint32_t r)
{
    if (remainder == TESSERA_REMAINDER_DROP)
        return total / world;
    if (remainder == TESSERA_REMAINDER_PAD)
        return (total + world - 1) / world;
    return total / world + (r < total % world); /* UNEVEN: an exact cover */
}

/* Index into the sequence of element i of rank r's share (i < share_count). Under PAD the
 * indexes past the end repeat the sequence from its start. */
static uint64_t share_index(int assign, int remainder, uint64_t total, uint32_t world, uint32_t r,
                            uint64_t i)
{
    uint64_t s, q = total / world, m = total % world;

    if (assign == TESSERA_ASSIGN_STRIDED)
        s = r + i * world;
    else if (remainder == TESSERA_REMAINDER_UNEVEN)
        s = r * q + TS_MIN((uint64_t)r, m) + i;
    else
        s = r * share_count(remainder, total, world, r) + i;
    return s % total;
}

/* Ranks of the base level share the epoch's positions; a redistributing level shares what the
 * ranks below had left, concatenated in rank order, under the same policy, so after a resume at
 * another world size every rank still reads as many units (PAD, DROP) as DDP needs. */
static uint64_t level_count(const tessera_plan *p, size_t j, uint32_t r)
{
    const struct level *l = &p->lv[j];
    const struct tessera_plan_opts *o = &p->o;

    if (l->kind == LEVEL_BASE)
        return share_count(o->remainder, o->units, l->world, r);
    if (l->kind == LEVEL_CONTINUE)
        return level_count(p, j - 1, r) - l->consumed[r];
    return share_count(o->remainder, l->total, l->world, r);
}

/* Position (in the epoch's order) of element i of rank r at level j. */
static uint64_t level_position(const tessera_plan *p, size_t j, uint32_t r, uint64_t i)
{
    const struct level *l = &p->lv[j];
    const struct tessera_plan_opts *o = &p->o;

    for (;;) {
        if (l->kind == LEVEL_BASE)
            return share_index(o->assign, o->remainder, o->units, l->world, r, i);
        if (l->kind == LEVEL_CONTINUE) {
            i += l->consumed[r];
        } else {
            const struct level *below = &p->lv[j - 1];
            uint64_t s = share_index(o->assign, o->remainder, l->total, l->world, r, i);
            uint32_t rb = (uint32_t)upper_slot(l->prefix, below->world, s);
            i = l->consumed[rb] + (s - l->prefix[rb]);
            r = rb;
        }
        l = &p->lv[--j];
    }
}

uint64_t tessera_plan_len(const tessera_plan *p)
{
    return p ? level_count(p, p->nlevels - 1, p->o.rank) : 0;
}

int tessera_plan_unit(const tessera_plan *p, uint64_t k, uint64_t *unit)
{
    if (!p || !unit)
        return TS_EINVAL;
    if (k >= tessera_plan_len(p))
        return TS_ERANGE;
    *unit = order(p, level_position(p, p->nlevels - 1, p->o.rank, k));
    return 0;
}

/* ---- building ----------------------------------------------------------------------------- */

void tessera_plan_opts_init(struct tessera_plan_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->world = 1;
    o->window = 16;
}

void tessera_plan_free(tessera_plan *p)
{
    if (!p)
        return;
    for (size_t j = 0; j < p->nlevels; j++) {
        free(p->lv[j].consumed);
        free(p->lv[j].prefix);
    }
    free(p->group_start);
    free(p->perm_prefix);
    free(p->perm_group);
    free(p->order);
    free(p);
}

static int opts_valid(const struct tessera_plan_opts *o)
{
    if (!o || o->world == 0 || o->rank >= o->world || o->assign < 0 || o->assign > 1 ||
        o->remainder < 0 || o->remainder > 2 || o->shuffle < 0 || o->shuffle > 3)
        return 0;
    if (o->shuffle == TESSERA_SHUFFLE_GIVEN && (!o->order || o->units > SIZE_MAX / 8))
        return 0;
    if (o->shuffle == TESSERA_SHUFFLE_WINDOW && o->window == 0)
        return 0;
    if (o->group_sizes) {
        uint64_t sum = 0;
        if (o->ngroups == 0)
            return 0;
        for (size_t g = 0; g < o->ngroups; g++) {
            if (o->group_sizes[g] > UINT64_MAX - sum)
                return 0;
            sum += o->group_sizes[g];
        }
        if (sum != o->units)
            return 0;
    }
    return 1;
}

/* Copies a GIVEN order into p: TS_EINVAL unless it is a permutation of [0, n). */
static int take_order(tessera_plan *p, const uint64_t *order, uint64_t n)
{
    uint8_t *seen = calloc(n / 8 + 1, 1);

    p->order = malloc((n ? n : 1) * sizeof(uint64_t));
    if (!seen || !p->order) {
        free(seen);
        return TS_ENOMEM;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t u = order[i];
        if (u >= n || (seen[u / 8] >> (u % 8) & 1)) {
            free(seen);
            return TS_EINVAL; /* not a permutation */
        }
        seen[u / 8] |= (uint8_t)(1u << (u % 8));
        p->order[i] = u;
        p->order_hash = mix(p->order_hash ^ mix(u + i));
    }
    free(seen);
    return 0;
}

/* A plan with only its base level (world W0 = o->world). */
static int plan_base(tessera_plan **out, const struct tessera_plan_opts *o)
{
    tessera_plan *p;

    *out = NULL;
    if (!opts_valid(o))
        return TS_EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return TS_ENOMEM;
    p->o = *o;
    p->o.group_sizes = NULL; /* not kept: the caller's array */
    for (size_t g = 0; o->group_sizes && g < o->ngroups; g++)
        p->groups_hash = mix(p->groups_hash ^ mix(o->group_sizes[g] + g));
    p->key = mix(o->seed ^ mix(o->epoch + 0x632be59bd9b4e019ull));
    p->o.order = NULL; /* not kept: the caller's array */
    if (o->shuffle == TESSERA_SHUFFLE_GIVEN) {
        int rc = take_order(p, o->order, o->units);
        if (rc) {
            tessera_plan_free(p);
            return rc;
        }
    }
    if (o->shuffle == TESSERA_SHUFFLE_WINDOW && o->group_sizes) {
        size_t ng = o->ngroups;
        p->group_start = malloc((ng + 1) * sizeof(uint64_t));
        p->perm_prefix = malloc((ng + 1) * sizeof(uint64_t));
        p->perm_group = malloc((ng + 1) * sizeof(uint64_t));
        if (!p->group_start || !p->perm_prefix || !p->perm_group) {
            tessera_plan_free(p);
            return TS_ENOMEM;
        }
        p->group_start[0] = p->perm_prefix[0] = 0;
        for (size_t g = 0; g < ng; g++)
            p->group_start[g + 1] = p->group_start[g] + o->group_sizes[g];
        /* Slot t of the shuffled group order holds group permute(key, ng, t). */
        for (size_t t = 0; t < ng; t++) {
            p->perm_group[t] = permute(p->key, ng, t);
            p->perm_prefix[t + 1] = p->perm_prefix[t] + o->group_sizes[p->perm_group[t]];
        }
    }
    p->nlevels = 1;
    p->lv[0].kind = LEVEL_BASE;
    p->lv[0].world = o->world;
    *out = p;
    return 0;
}

int tessera_plan_new(tessera_plan **out, const struct tessera_plan_opts *o)
{
    if (!out)
        return TS_EINVAL;
    return plan_base(out, o);
}

/* Adds a level over consumed[] of the top level's world ranks, for new_world ranks. */
static int plan_push(tessera_plan *p, const uint64_t *consumed, uint32_t new_world)
{
    size_t j = p->nlevels;
    struct level *below = &p->lv[j - 1], *l;
    uint32_t wb = below->world;

    if (j >= MAX_LEVELS || new_world == 0)
        return TS_EINVAL;
    for (uint32_t r = 0; r < wb; r++)
        if (consumed[r] > level_count(p, j - 1, r))
            return TS_EINVAL; /* a rank cannot have read more than its plan */
    l = &p->lv[j];
    memset(l, 0, sizeof(*l));
    l->world = new_world;
    l->kind = new_world == wb ? LEVEL_CONTINUE : LEVEL_REDISTRIBUTE;
    l->consumed = malloc(wb * sizeof(uint64_t));
    l->prefix = l->kind == LEVEL_REDISTRIBUTE ? malloc((wb + 1) * sizeof(uint64_t)) : NULL;
    if (!l->consumed || (l->kind == LEVEL_REDISTRIBUTE && !l->prefix)) {
        free(l->consumed);
        free(l->prefix);
        return TS_ENOMEM;
    }
    memcpy(l->consumed, consumed, wb * sizeof(uint64_t));
    if (l->prefix) {
        l->prefix[0] = 0;
        for (uint32_t r = 0; r < wb; r++)
            l->prefix[r + 1] = l->prefix[r] + level_count(p, j - 1, r) - consumed[r];
        l->total = l->prefix[wb];
    }
    p->nlevels++;
    return 0;
}

/* ---- states ------------------------------------------------------------------------------- */

/* What a state must match: every option but rank and world. */
static uint64_t fingerprint(const tessera_plan *p)
{
    const struct tessera_plan_opts *o = &p->o;

    return mix(o->units) ^ mix(o->seed + 1) ^ mix(o->epoch + 2) ^
           mix(((uint64_t)o->assign << 16) | ((uint64_t)o->remainder << 8) | (uint64_t)o->shuffle) ^
           mix(o->window + 3) ^ mix(p->groups_hash + 4) ^
           (p->order ? mix(p->order_hash + 5) : 0); /* (states of before it still fit) */
}

int tessera_plan_state(const tessera_plan *p, const uint64_t *consumed, uint32_t world,
                       void **state, size_t *len)
{
    struct ts_wr w;
    uint64_t fp;

    if (state)
        *state = NULL;
    if (len)
        *len = 0;
    if (!p || !consumed || !state || !len || world != p->lv[p->nlevels - 1].world)
        return TS_EINVAL;
    if (p->nlevels >= MAX_LEVELS)
        return TS_ERANGE;
    for (uint32_t r = 0; r < world; r++)
        if (consumed[r] > level_count(p, p->nlevels - 1, r))
            return TS_EINVAL;
    fp = fingerprint(p);
    ts_wr_init(&w);
    ts_wr_u32(&w, STATE_MAGIC);
    ts_wr_u16(&w, STATE_VERSION);
    ts_wr_u64(&w, fp);
    ts_wr_u32(&w, (uint32_t)p->nlevels);
    ts_wr_u32(&w, p->lv[0].world);
    for (size_t j = 1; j <= p->nlevels; j++) {
        const uint64_t *c = j < p->nlevels ? p->lv[j].consumed : consumed;
        uint32_t wb = p->lv[j - 1].world;
        if (j < p->nlevels)
            ts_wr_u32(&w, p->lv[j].world);
        for (uint32_t r = 0; r < wb; r++)
            ts_wr_u64(&w, c[r]);
    }
    ts_wr_u32(&w, ts_crc32c(0, w.buf, w.len));
    if (w.err) {
        ts_wr_fini(&w);
        return TS_ENOMEM;
    }
    *state = w.buf;
    *len = w.len;
    return 0;
}

int tessera_plan_resume(tessera_plan **out, const struct tessera_plan_opts *o, const void *state,
                        size_t len)
{
    struct tessera_plan_opts base;
    tessera_plan *p = NULL;
    struct ts_rd r;
    uint64_t *c = NULL;
    uint32_t nlevels, w0, wb;
    uint16_t version;
    int rc;

    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (!o || !state || len < 4 + 2 + 8 + 4 + 4 + 4 ||
        ts_crc32c(0, state, len - 4) != ts_get_le32((const uint8_t *)state + len - 4))
        return TS_EINVAL;
    ts_rd_init(&r, state, len - 4);
    if (ts_rd_u32(&r) != STATE_MAGIC)
        return TS_EINVAL;
    version = ts_rd_u16(&r);
    if (version != STATE_VERSION && version != 1)
        return TS_EINVAL;
    base = *o;
    {
        uint64_t fp = ts_rd_u64(&r);
        nlevels = ts_rd_u32(&r);
        w0 = ts_rd_u32(&r);
        if (r.err || nlevels == 0 || nlevels >= MAX_LEVELS || w0 == 0)
            return TS_EINVAL;
        base.rank = 0;
        base.world = w0;
        rc = plan_base(&p, &base);
        if (rc)
            return rc;
        if (fp != fingerprint(p)) {
            tessera_plan_free(p);
            return TS_EINVAL; /* saved with other options */
        }
    }
    wb = w0;
    for (uint32_t j = 1; j <= nlevels && !rc; j++) {
        uint32_t wn = j < nlevels ? ts_rd_u32(&r) : o->world;
        if (r.err || wn == 0 || (size_t)wb * 8 > r.len - r.off ||
            (version == 1 && j < nlevels && wn != wb && o->remainder != TESSERA_REMAINDER_UNEVEN)) {
            rc = TS_EINVAL; /* (a version-1 redistribution meant another split) */
            break;
        }
        c = malloc((size_t)wb * sizeof(uint64_t));
        if (!c) {
            rc = TS_ENOMEM;
            break;
        }
        for (uint32_t k = 0; k < wb; k++)
            c[k] = ts_rd_u64(&r);
        rc = r.err ? TS_EINVAL : plan_push(p, c, wn);
        free(c);
        wb = wn;
    }
    if (!rc && (r.off != r.len || o->rank >= o->world))
        rc = TS_EINVAL;
    if (rc) {
        tessera_plan_free(p);
        return rc;
    }
    p->o.rank = o->rank;
    p->o.world = o->world;
    *out = p;
    return 0;
}
