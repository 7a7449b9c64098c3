/*
 * Hot datasets in the map (ts_map.h "hot", docs/operations.md "Hot datasets"): extra fringe
 * replicas for a dataset, in every PG or in one. A dataset's replicas are the first
 * core + fringe + hot nodes of a PG's order; the extra ones are fringe replicas like any other
 * (pushed asynchronously, backfilled when they join, dropped with PG_DROP when they leave).
 */
#include "map_internal.h"

#include <stdlib.h>
#include <string.h>

#include "ts_common.h"
#include "ts_proto.h"

static const char *const hot_keys[] = {"dataset", "pg", "fringe"};

unsigned ts_map_hot_extra(const struct ts_map *m, const char *dataset, uint32_t pg)
{
    unsigned extra = 0;

    for (size_t i = 0; m && dataset && i < m->nhot; i++) {
        const struct ts_map_hot *h = &m->hot[i];
        if ((h->pg < 0 || (uint32_t)h->pg == pg) && !strcmp(h->dataset, dataset) &&
            h->fringe > extra)
            extra = h->fringe;
    }
    return extra;
}

unsigned ts_map_hot_extra_max(const struct ts_map *m, uint32_t pg)
{
    unsigned extra = 0;

    for (size_t i = 0; m && i < m->nhot; i++)
        if ((m->hot[i].pg < 0 || (uint32_t)m->hot[i].pg == pg) && m->hot[i].fringe > extra)
            extra = m->hot[i].fringe;
    return extra;
}

int ts_map_hot_same(const struct ts_map *a, const struct ts_map *b, uint32_t pg)
{
    for (int side = 0; side < 2; side++) {
        const struct ts_map *x = side ? b : a, *y = side ? a : b;
        for (size_t i = 0; x && i < x->nhot; i++) {
            const struct ts_map_hot *h = &x->hot[i];
            if (h->pg >= 0 && (uint32_t)h->pg != pg)
                continue;
            if (ts_map_hot_extra(y, h->dataset, pg) != ts_map_hot_extra(x, h->dataset, pg))
                return 0;
        }
    }
    return 1;
}

int ts_map_hot_grew(const struct ts_map *old, const struct ts_map *m, uint32_t pg)
{
    for (size_t i = 0; m && i < m->nhot; i++) {
        const struct ts_map_hot *h = &m->hot[i];
        if ((h->pg < 0 || (uint32_t)h->pg == pg) &&
            ts_map_hot_extra(m, h->dataset, pg) > ts_map_hot_extra(old, h->dataset, pg))
            return 1;
    }
    return 0;
}

static int hot_find(const struct ts_map *m, const char *dataset, int64_t pg)
{
    for (size_t i = 0; i < m->nhot; i++)
        if (m->hot[i].pg == pg && !strcmp(m->hot[i].dataset, dataset))
            return (int)i;
    return -1;
}

int ts_map_hot_set(struct ts_map *m, const char *dataset, int64_t pg, unsigned fringe)
{
    int i;

    if (!m || !dataset || !ts_name_valid(dataset) || fringe > TS_MAP_MAX_HOT_FRINGE || pg < -1 ||
        (pg >= 0 && (uint64_t)pg >= m->pg_count))
        return TS_EINVAL;
    i = hot_find(m, dataset, pg);
    if (fringe == 0) { /* removal */
        if (i < 0)
            return TS_ENOENT;
        memmove(&m->hot[i], &m->hot[i + 1], (m->nhot - (size_t)i - 1) * sizeof(*m->hot));
        m->nhot--;
        return 0;
    }
    if (i < 0) {
        struct ts_map_hot *v;
        if (m->nhot == TS_MAP_MAX_HOT)
            return TS_EINVAL;
        v = realloc(m->hot, (m->nhot + 1) * sizeof(*v));
        if (!v)
            return TS_ENOMEM;
        m->hot = v;
        i = (int)m->nhot++;
        memset(&m->hot[i], 0, sizeof(m->hot[i]));
        snprintf(m->hot[i].dataset, sizeof(m->hot[i].dataset), "%s", dataset);
        m->hot[i].pg = pg;
    }
    m->hot[i].fringe = (uint8_t)fringe;
    return 0;
}

int map_hot_check(const struct ts_map *m, char *err, size_t errlen)
{
    if (m->nhot > TS_MAP_MAX_HOT) {
        map_errf(err, errlen, "more than %d hot entries", TS_MAP_MAX_HOT);
        return -1;
    }
    for (size_t i = 0; i < m->nhot; i++) {
        const struct ts_map_hot *h = &m->hot[i];
        if (!ts_name_valid(h->dataset)) {
            map_errf(err, errlen, "hot entry %zu: '%s' is not a dataset name", i, h->dataset);
            return -1;
        }
        if (h->fringe < 1 || h->fringe > TS_MAP_MAX_HOT_FRINGE) {
            map_errf(err, errlen, "hot entry '%s': fringe must be 1..%d, not %u", h->dataset,
                     TS_MAP_MAX_HOT_FRINGE, h->fringe);
            return -1;
        }
        if (h->pg < -1 || (h->pg >= 0 && (uint64_t)h->pg >= m->pg_count)) {
            map_errf(err, errlen, "hot entry '%s': pg %lld is not a PG of this map (0..%u)",
                     h->dataset, (long long)h->pg, m->pg_count - 1);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (m->hot[j].pg == h->pg && !strcmp(m->hot[j].dataset, h->dataset)) {
                map_errf(err, errlen, "hot entry '%s' (pg %lld) appears twice", h->dataset,
                         (long long)h->pg);
                return -1;
            }
    }
    return 0;
}

int map_hot_parse(config_setting_t *list, struct ts_map *m, const char *where, char *err,
                  size_t errlen)
{
    int n;

    if (!list)
        return 0;
    if (!config_setting_is_list(list))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                            "'hot' must be a list: hot = ( { dataset = \"x\"; fringe = 1; } );");
    n = config_setting_length(list);
    if (n > TS_MAP_MAX_HOT)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                            "'hot' lists %d entries, at most %d", n, TS_MAP_MAX_HOT);
    m->hot = calloc(n ? (size_t)n : 1, sizeof(*m->hot));
    if (!m->hot)
        return map_cfg_fail(err, errlen, where, 0, "out of memory");
    for (int i = 0; i < n; i++) {
        config_setting_t *g = config_setting_get_elem(list, (unsigned)i);
        struct ts_map_hot *h = &m->hot[i];
        unsigned long long fringe = 0, pg = 0;
        int rc, line = config_setting_source_line(g);
        if (!config_setting_is_group(g))
            return map_cfg_fail(err, errlen, where, line, "a hot entry must be a group { ... }");
        for (int k = 0; k < config_setting_length(g); k++) {
            const char *name = config_setting_name(config_setting_get_elem(g, (unsigned)k));
            if (!map_key_known(name, hot_keys, TS_ARRAY_SIZE(hot_keys)))
                return map_cfg_fail(err, errlen, where, line,
                                    "unknown setting '%s' in a hot entry (dataset, pg, fringe)",
                                    name);
        }
        if ((rc = map_cfg_str(g, "dataset", 1, h->dataset, sizeof(h->dataset), where, err,
                              errlen)) < 0 ||
            (rc = map_cfg_int(g, "fringe", 1, 1, TS_MAP_MAX_HOT_FRINGE, &fringe, where, err,
                              errlen)) < 0 ||
            (rc = map_cfg_int(g, "pg", 0, 0, TS_MAP_MAX_PGS - 1, &pg, where, err, errlen)) < 0)
            return rc;
        h->fringe = (uint8_t)fringe;
        h->pg = rc == 1 ? -1 : (int64_t)pg; /* absent: every PG */
        m->nhot++;
    }
    return 0;
}

void map_hot_emit(FILE *f, const struct ts_map *m)
{
    if (!m->nhot)
        return;
    fprintf(f, "# Hot datasets: extra fringe replicas (tessera hot add|rm).\nhot = (\n");
    for (size_t i = 0; i < m->nhot; i++) {
        const struct ts_map_hot *h = &m->hot[i];
        fprintf(f, "  { dataset = \"%s\"; ", h->dataset);
        if (h->pg >= 0)
            fprintf(f, "pg = %lld; ", (long long)h->pg);
        fprintf(f, "fringe = %u; }%s\n", h->fringe, i + 1 < m->nhot ? "," : "");
    }
    fprintf(f, ");\n");
}

void map_hot_encode(struct ts_wr *w, const struct ts_map *m)
{
    ts_wr_u32(w, (uint32_t)m->nhot);
    for (size_t i = 0; i < m->nhot; i++) {
        ts_wr_str(w, m->hot[i].dataset);
        ts_wr_u64(w, (uint64_t)m->hot[i].pg);
        ts_wr_u8(w, m->hot[i].fringe);
    }
}

int map_hot_decode(struct ts_rd *r, struct ts_map *m)
{
    uint32_t n = ts_rd_u32(r);

    if (r->err || n > TS_MAP_MAX_HOT)
        return TS_EPROTO;
    if (!n)
        return 0;
    m->hot = calloc(n, sizeof(*m->hot));
    if (!m->hot)
        return TS_ENOMEM;
    for (uint32_t i = 0; i < n && !r->err; i++) {
        ts_rd_str(r, m->hot[i].dataset, sizeof(m->hot[i].dataset));
        m->hot[i].pg = (int64_t)ts_rd_u64(r);
        m->hot[i].fringe = ts_rd_u8(r);
        m->nhot++;
    }
    return r->err ? TS_EPROTO : 0;
}

int map_hot_copy(struct ts_map *d, const struct ts_map *m)
{
    if (!m->nhot)
        return 0;
    d->hot = malloc(m->nhot * sizeof(*d->hot));
    if (!d->hot)
        return TS_ENOMEM;
    memcpy(d->hot, m->hot, m->nhot * sizeof(*d->hot));
    d->nhot = m->nhot;
    return 0;
}
