/*
 * Membership changes of a PG (ts_repl.h): a node whose place in a PG's replica order moves up
 * into the replicas of a dataset it was not a replica of holds none of that dataset's shards
 * of the PG, although its log position may equal the primary's (nodes outside a dataset's
 * replicas apply its log entries as no-ops). Such a node needs a backfill before it counts as
 * holding the PG: the replica does not serve the PG and the primary backfills it.
 */
#include "repl_internal.h"

struct widths_acc {
    struct ts_repl_widths *w;
};

static int width_cb(void *arg, const struct ts_dataset_info *d)
{
    struct ts_repl_widths *w = ((struct widths_acc *)arg)->w;
    unsigned n = (unsigned)d->policy.core + d->policy.fringe;

    if (!w->max || n < w->min)
        w->min = n;
    if (n > w->max)
        w->max = n;
    return 0;
}

void ts_repl_widths(ts_store *st, struct ts_repl_widths *w)
{
    struct widths_acc a = {w};

    w->min = w->max = 0;
    ts_store_dataset_list(st, width_cb, &a);
}

unsigned ts_repl_hot_extra_cb(void *arg, const char *dataset)
{
    const struct ts_repl_hot_arg *a = arg;
    return ts_map_hot_extra(a->map, dataset, a->pg);
}

static int rank_in(const struct ts_map *m, const int *order, size_t n, const char *node)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m->nodes[order[i]].id, node))
            return (int)i;
    return -1;
}

int ts_repl_rank_of(const struct ts_map *m, uint32_t pg, const char *node)
{
    int order[TS_REPL_MAX_REPLICAS];
    int acting, target;

    if (!m)
        return -1;
    acting = rank_in(m, order, ts_map_pg_order(m, pg, order, TS_REPL_MAX_REPLICAS), node);
    if (acting == 0 || ts_map_pg_move_state(m, pg) != TS_PG_MOVING)
        return acting;
    /* A moving PG: a node the rebalance brings in joins at its rank to be (0 too: the primary
     * to be holds what a primary holds, while the PG's primary stays where it is), so it
     * takes the PG's data by log and backfill before the PG settles. */
    target = rank_in(m, order, ts_map_pg_target_order(m, pg, order, TS_REPL_MAX_REPLICAS), node);
    if (target >= 0 && (acting < 0 || target < acting))
        return target;
    return acting;
}

int ts_repl_gains_data(const struct ts_map *old, const struct ts_map *m, uint32_t pg,
                       const char *node, const struct ts_repl_widths *w)
{
    int before, after;

    struct ts_repl_widths any = {1, TS_REPL_MAX_REPLICAS};

    if (!old || !m)
        return 0; /* no previous placement: nothing it could lack */
    if (!w->max)
        w = &any; /* no dataset here yet: the cluster may well have some, judge every rank (a
                   * backfill of nothing costs a SET_APPLIED; a missed one lost copies) */
    before = ts_repl_rank_of(old, pg, node);
    after = ts_repl_rank_of(m, pg, node);
    if (after < 0 || (unsigned)after >= w->max + ts_map_hot_extra_max(m, pg))
        return 0; /* a replica of no dataset now */
    if (before < 0)
        return 1; /* no place in the PG before */
    /* Some dataset's replicas take in ranks < width: a width in (after, before] gains it
     * (judged with the widest and narrowest datasets: may ask for a backfill not needed). */
    if (before > after && (unsigned)before >= w->min)
        return 1;
    /* A hot dataset got more extra replicas in this PG (tessera hot add): a node past some
     * dataset's base width may be one of them now (a removal gains nobody anything). */
    return ts_map_hot_grew(old, m, pg) && (unsigned)after >= w->min;
}
