/*
 * A rebalance's state in the cluster map (ts_map.h, struct ts_map_move): the node table before
 * it and each PG's progress, in the map file's `rebalance` group and the wire form. Kept in the
 * map, the state is on every node, persisted with the map, and survives the CLI that drives the
 * rebalance and any node's restart: `tessera rebalance resume|status|rollback` read it back.
 *
 * A PENDING or MOVING PG keeps the placement of the old table. The old table is taken with the
 * node states of now where a node is down now: a failover during a rebalance leaves a dead node
 * out of the PGs that still keep their old placement, as it does for the others.
 */
#include "map_internal.h"

#include "ts_common.h"
#include "ts_proto.h"

#include <stdlib.h>
#include <string.h>

static const char *const move_keys[] = {"paused", "rate",    "driver", "concurrent",
                                        "from",   "pending", "moving", "from_placement_pgs"};

void map_move_free(struct ts_map_move *mv)
{
    if (!mv)
        return;
    ts_map_free(mv->old);
    free(mv->old_idx);
    free(mv->from);
    free(mv->pg);
    free(mv);
}

/* The old table as placement uses it now, and where its nodes are in the target table. */
static int derive(struct ts_map *m, struct ts_map_move *mv)
{
    mv->old = map_alloc(mv->nfrom);
    mv->old_idx = calloc(mv->nfrom ? mv->nfrom : 1, sizeof(*mv->old_idx));
    if (!mv->old || !mv->old_idx)
        return TS_ENOMEM;
    mv->old->epoch = m->epoch;
    mv->old->pg_count = m->pg_count;
    mv->old->placement_pgs = mv->from_placement ? mv->from_placement : m->placement_pgs;
    for (size_t i = 0; i < mv->nfrom; i++) {
        int j = ts_map_find(m, mv->from[i].id);
        if (j < 0)
            return TS_EINVAL;
        mv->old->nodes[i] = mv->from[i];
        if (m->nodes[j].state == TS_NODE_DOWN)
            mv->old->nodes[i].state = TS_NODE_DOWN;
        mv->old_idx[i] = j;
    }
    return 0;
}

int ts_map_move_set(struct ts_map *m, const struct ts_map_node *from, size_t nfrom,
                    const uint8_t *pgstate, int paused, uint64_t rate)
{
    struct ts_map_move *mv;
    int rc;

    if (!m || !from || !nfrom || nfrom > TS_MAP_MAX_NODES)
        return TS_EINVAL;
    mv = calloc(1, sizeof(*mv));
    if (!mv)
        return TS_ENOMEM;
    mv->from = malloc(nfrom * sizeof(*from));
    mv->pg = calloc(m->pg_count, 1);
    if (!mv->from || !mv->pg) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    memcpy(mv->from, from, nfrom * sizeof(*from));
    mv->nfrom = nfrom;
    for (uint32_t pg = 0; pgstate && pg < m->pg_count; pg++) {
        if (pgstate[pg] > TS_PG_MOVING) {
            rc = TS_EINVAL;
            goto out_free;
        }
        mv->pg[pg] = pgstate[pg];
    }
    mv->paused = paused ? 1 : 0;
    mv->rate = rate;
    rc = derive(m, mv);
    if (rc)
        goto out_free;
    map_move_free(m->move);
    m->move = mv;
    return 0;

out_free:
    map_move_free(mv);
    return rc;
}

int ts_map_move_set_from_placement(struct ts_map *m, uint32_t placement_pgs)
{
    if (!m || !m->move || (placement_pgs && m->pg_count % placement_pgs))
        return TS_EINVAL;
    m->move->from_placement = placement_pgs; /* explicit, also when it is pg_count */
    m->move->old->placement_pgs =
        m->move->from_placement ? m->move->from_placement : m->placement_pgs;
    return 0;
}

void ts_map_move_clear(struct ts_map *m)
{
    if (!m)
        return;
    map_move_free(m->move);
    m->move = NULL;
}

int ts_map_move_pg(struct ts_map *m, uint32_t pg, int state)
{
    if (!m || !m->move || pg >= m->pg_count || state < TS_PG_SETTLED || state > TS_PG_MOVING)
        return TS_EINVAL;
    m->move->pg[pg] = (uint8_t)state;
    return 0;
}

int ts_map_pg_move_state(const struct ts_map *m, uint32_t pg)
{
    if (!m || !m->move || pg >= m->pg_count)
        return TS_PG_SETTLED;
    return m->move->pg[pg];
}

static int old_state(const struct ts_map *m, size_t i)
{
    const struct ts_map_move *mv = m->move;

    return m->nodes[mv->old_idx[i]].state == TS_NODE_DOWN ? TS_NODE_DOWN : mv->from[i].state;
}

size_t map_move_old_order(const struct ts_map *m, uint32_t pg, int *out, size_t max)
{
    const struct ts_map_move *mv = m->move;
    const struct ts_map *old = mv->old;
    struct ts_map *fresh = NULL;
    size_t n;

    /* A table changed in place since it was derived (a node marked down by the CLI before it
     * pushes the map): place with the states of now on a copy (readers share m). */
    for (size_t i = 0; i < mv->nfrom; i++) {
        if (old->nodes[i].state == old_state(m, i))
            continue;
        fresh = map_alloc(mv->nfrom);
        if (!fresh)
            return 0;
        fresh->epoch = old->epoch;
        fresh->pg_count = old->pg_count;
        fresh->placement_pgs = old->placement_pgs;
        for (size_t j = 0; j < mv->nfrom; j++) {
            fresh->nodes[j] = old->nodes[j];
            fresh->nodes[j].state = old_state(m, j);
        }
        old = fresh;
        break;
    }
    n = ts_map_pg_target_order(old, pg, out, max);
    for (size_t i = 0; i < n; i++)
        out[i] = mv->old_idx[out[i]];
    ts_map_free(fresh);
    return n;
}

/* ---- checks ---------------------------------------------------------------------------------- */

int map_move_check(const struct ts_map *m, char *err, size_t errlen)
{
    const struct ts_map_move *mv = m->move;
    struct ts_map from = {
        .epoch = m->epoch, .pg_count = m->pg_count, .n = mv->nfrom, .nodes = mv->from};
    char msg[384];
    long bad;

    if (!mv->from || !mv->nfrom || !mv->pg || !mv->old) {
        map_errf(err, errlen, "rebalance: no node table before it");
        return -1;
    }
    if (map_check(&from, &bad, msg, sizeof(msg))) {
        map_errf(err, errlen, "rebalance.from: %s", msg);
        return -1;
    }
    if (mv->from_placement && m->pg_count % mv->from_placement) {
        map_errf(err, errlen, "rebalance.from_placement_pgs %u must divide pg_count %u",
                 mv->from_placement, m->pg_count);
        return -1;
    }
    for (size_t i = 0; i < mv->nfrom; i++) {
        if (ts_map_find(m, mv->from[i].id) < 0) {
            map_errf(err, errlen,
                     "rebalance.from: node '%s' is not in nodes (remove a node only after a "
                     "rebalance that empties it has finished)",
                     mv->from[i].id);
            return -1;
        }
    }
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        if (mv->pg[pg] > TS_PG_MOVING) {
            map_errf(err, errlen, "rebalance: PG %u has state %u", pg, mv->pg[pg]);
            return -1;
        }
    }
    return 0;
}

/* ---- the map file ---------------------------------------------------------------------------- */

static int parse_pgs(config_setting_t *g, const char *name, uint8_t state, struct ts_map *m,
                     uint8_t *pgs, const char *where, char *err, size_t errlen)
{
    config_setting_t *a = config_setting_get_member(g, name);

    if (!a)
        return 0;
    if (!config_setting_is_array(a) && !config_setting_is_list(a))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(a),
                            "rebalance.%s must be an array of PG numbers: [ 1, 2 ]", name);
    for (int i = 0; i < config_setting_length(a); i++) {
        config_setting_t *e = config_setting_get_elem(a, (unsigned)i);
        long long v =
            config_setting_type(e) == CONFIG_TYPE_INT || config_setting_type(e) == CONFIG_TYPE_INT64
                ? config_setting_get_int64(e)
                : -1;
        if (v < 0 || v >= (long long)m->pg_count)
            return map_cfg_fail(err, errlen, where, config_setting_source_line(a),
                                "rebalance.%s: PG numbers are 0..%u", name, m->pg_count - 1);
        if (pgs[v] != TS_PG_SETTLED)
            return map_cfg_fail(err, errlen, where, config_setting_source_line(a),
                                "rebalance: PG %lld is listed twice", v);
        pgs[v] = state;
    }
    return 0;
}

int map_move_parse(config_setting_t *g, struct ts_map *m, const char *where, char *err,
                   size_t errlen)
{
    config_setting_t *list;
    unsigned long long rate = 0, driver = 0, concurrent = 0, from_placement = 0;
    struct ts_map_node *from = NULL;
    uint8_t *pgs = NULL;
    int paused = 0, n, rc;

    if (!g)
        return 0;
    if (!config_setting_is_group(g))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(g),
                            "'rebalance' must be a group { from = (...); ... }");
    for (int i = 0; i < config_setting_length(g); i++) {
        config_setting_t *e = config_setting_get_elem(g, (unsigned)i);
        if (!map_key_known(config_setting_name(e), move_keys, TS_ARRAY_SIZE(move_keys)))
            return map_cfg_fail(err, errlen, where, config_setting_source_line(e),
                                "unknown rebalance setting '%s'", config_setting_name(e));
    }
    if (config_setting_get_member(g, "paused")) {
        config_setting_t *p = config_setting_get_member(g, "paused");
        if (config_setting_type(p) != CONFIG_TYPE_BOOL)
            return map_cfg_fail(err, errlen, where, config_setting_source_line(p),
                                "rebalance.paused must be true or false");
        paused = config_setting_get_bool(p);
    }
    rc = map_cfg_int(g, "rate", 0, 0, INT64_MAX, &rate, where, err, errlen);
    if (rc >= 0)
        rc = map_cfg_int(g, "driver", 0, 0, INT64_MAX, &driver, where, err, errlen);
    if (rc >= 0)
        rc = map_cfg_int(g, "concurrent", 0, 0, TS_MAP_MAX_PGS, &concurrent, where, err, errlen);
    if (rc >= 0)
        rc = map_cfg_int(g, "from_placement_pgs", 0, 1, TS_MAP_MAX_PGS, &from_placement, where, err,
                         errlen);
    if (rc < 0)
        return rc;
    if (from_placement && m->pg_count % from_placement)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(g),
                            "rebalance.from_placement_pgs %llu must divide pg_count %u",
                            from_placement, m->pg_count);
    list = config_setting_get_member(g, "from");
    if (!list || !config_setting_is_list(list))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(g),
                            "rebalance.from must list the node table before the rebalance");
    n = config_setting_length(list);
    if (n < 1 || n > TS_MAP_MAX_NODES)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                            "rebalance.from must list 1..%d nodes", TS_MAP_MAX_NODES);
    from = calloc((size_t)n, sizeof(*from));
    pgs = calloc(m->pg_count, 1);
    if (!from || !pgs) {
        rc = map_cfg_fail(err, errlen, where, 0, "out of memory");
        goto out_free;
    }
    for (int i = 0; i < n; i++) {
        rc = map_cfg_node(config_setting_get_elem(list, (unsigned)i), &from[i], where, err, errlen);
        if (rc < 0)
            goto out_free;
    }
    rc = parse_pgs(g, "pending", TS_PG_PENDING, m, pgs, where, err, errlen);
    if (rc == 0)
        rc = parse_pgs(g, "moving", TS_PG_MOVING, m, pgs, where, err, errlen);
    if (rc < 0)
        goto out_free;
    rc = ts_map_move_set(m, from, (size_t)n, pgs, paused, rate);
    if (!rc) {
        m->move->driver = driver;
        m->move->concurrent = (uint32_t)concurrent;
        ts_map_move_set_from_placement(m, (uint32_t)from_placement);
    }
    if (rc)
        rc = map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                          "rebalance.from: every node must be in nodes too");
out_free:
    free(from);
    free(pgs);
    return rc;
}

static void emit_pgs(FILE *f, const struct ts_map *m, const char *name, uint8_t state)
{
    int first = 1, col = 0;

    fprintf(f, "  %s = [", name);
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        if (m->move->pg[pg] != state)
            continue;
        fprintf(f, "%s%s%u", first ? " " : ", ", col && col % 16 == 0 ? "\n    " : "", pg);
        first = 0;
        col++;
    }
    fprintf(f, " ];\n");
}

void map_move_emit(FILE *f, const struct ts_map *m)
{
    const struct ts_map_move *mv = m->move;

    fprintf(f, "# A rebalance in progress (tessera rebalance status): PGs pending or moving keep\n"
               "# the placement of the node table `from`.\n");
    fprintf(
        f,
        "rebalance = {\n  paused = %s;\n  rate = %lluL;\n  driver = %lluL;\n  concurrent = %u;\n",
        mv->paused ? "true" : "false", (unsigned long long)mv->rate, (unsigned long long)mv->driver,
        mv->concurrent);
    if (mv->from_placement)
        fprintf(f, "  from_placement_pgs = %u;\n", mv->from_placement);
    fprintf(f, "  from = (\n");
    for (size_t i = 0; i < mv->nfrom; i++)
        map_emit_node(f, &mv->from[i], i + 1 == mv->nfrom);
    fprintf(f, "  );\n");
    emit_pgs(f, m, "pending", TS_PG_PENDING);
    emit_pgs(f, m, "moving", TS_PG_MOVING);
    fprintf(f, "};\n");
}

/* ---- wire ------------------------------------------------------------------------------------ */

void map_move_encode(struct ts_wr *w, const struct ts_map *m)
{
    const struct ts_map_move *mv = m->move;

    ts_wr_u8(w, mv ? 1 : 0);
    if (!mv)
        return;
    ts_wr_u8(w, (uint8_t)mv->paused);
    ts_wr_u64(w, mv->rate);
    ts_wr_u64(w, mv->driver);
    ts_wr_u32(w, mv->concurrent);
    ts_wr_u32(w, mv->from_placement);
    ts_wr_u32(w, (uint32_t)mv->nfrom);
    for (size_t i = 0; i < mv->nfrom; i++)
        map_node_encode(w, &mv->from[i]);
    ts_wr_bytes(w, mv->pg, m->pg_count);
}

int map_move_decode(struct ts_rd *r, struct ts_map *m)
{
    struct ts_map_node *from;
    uint32_t nfrom;
    uint64_t rate, driver;
    uint32_t concurrent, from_placement;
    const uint8_t *pgs;
    int paused, rc;

    if (!ts_rd_u8(r))
        return r->err ? TS_EPROTO : 0;
    paused = ts_rd_u8(r);
    rate = ts_rd_u64(r);
    driver = ts_rd_u64(r);
    concurrent = ts_rd_u32(r);
    from_placement = ts_rd_u32(r);
    nfrom = ts_rd_u32(r);
    if (r->err || nfrom == 0 || nfrom > TS_MAP_MAX_NODES || nfrom > r->len - r->off)
        return TS_EPROTO;
    from = calloc(nfrom, sizeof(*from));
    if (!from)
        return TS_ENOMEM;
    for (uint32_t i = 0; i < nfrom && !r->err; i++)
        map_node_decode(r, &from[i]);
    pgs = ts_rd_bytes(r, m->pg_count);
    rc = r->err || !pgs || paused > 1 || m->pg_count == 0 || m->pg_count > TS_MAP_MAX_PGS
             ? TS_EPROTO
             : ts_map_move_set(m, from, nfrom, pgs, paused, rate);
    if (!rc) {
        m->move->driver = driver;
        m->move->concurrent = concurrent > TS_MAP_MAX_PGS ? 0 : concurrent;
        rc = ts_map_move_set_from_placement(m, from_placement);
    }
    free(from);
    return rc ? TS_EPROTO : 0;
}
