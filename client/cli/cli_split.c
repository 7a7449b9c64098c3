/*
 * tessera CLI: `rebalance split` doubles the cluster's PG count online (docs/operations.md
 * "Splitting PGs").
 *
 * A shard's PG is CRC32C(dataset, shard) % pg_count, so under twice the count every PG p splits
 * into p and its child p + pg_count, each with about half of p's shards, and nothing else moves
 * between PGs. One map push makes the split and starts its rebalance: pg_count doubles, and the
 * rebalance's `from_placement` (the count before) places every child exactly as its parent, so at
 * that epoch no byte has moved and every node that held p holds p's child. The rebalance then
 * moves the children whose own placement differs, staged as any rebalance (up to N at a time,
 * paced, paused, resumed, rolled back); a rollback takes the children back to their parents'
 * nodes and keeps the count. `rebalance split` run again then spreads them without doubling
 * (the map's placement_pgs, below pg_count, says they still sit with their parents).
 *
 * The split starts only from a settled, clean cluster: no rebalance in progress, every node up,
 * and every PG's primary reporting no replica behind. A child's log starts empty at the split, so
 * every write of its shards from before it must be on all of the parent's replicas (the parent's
 * log keeps those entries, and the child's shards are found by their hash, not by a log).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ts_map.h"

static int refuse(struct ctx *x, int rc, const char *what)
{
    snprintf(x->local, sizeof(x->local), "%s", what);
    return rc;
}

int cmd_rebalance_split(struct ctx *x)
{
    struct ts_map *cur = NULL, *next = NULL;
    uint64_t epoch = 0, maxc = x->max_concurrent ? x->max_concurrent : 4;
    unsigned width = 0, moving = 0;
    uint8_t *st = NULL;
    char why[300] = "";
    uint32_t before, place, count;
    int rc = cli_rebalance_newest(x, &cur);

    if (rc)
        return rc;
    before = cur->pg_count;
    place = ts_map_placement_pgs(cur); /* below the count: a split whose spreading was undone */
    count = place < before ? before : 2 * before;
    if (cur->move) {
        snprintf(why, sizeof(why),
                 "a rebalance is in progress (map epoch %llu): 'tessera rebalance status', "
                 "'resume' or 'rollback' it first",
                 (unsigned long long)cur->epoch);
        rc = refuse(x, TS_EINVAL, why);
        goto out;
    }
    if (count != before && !ts_map_pg_count_splits(before, count)) {
        snprintf(why, sizeof(why), "%u PGs cannot double: at most %u", before, TS_MAP_MAX_PGS);
        rc = refuse(x, TS_EINVAL, why);
        goto out;
    }
    for (size_t i = 0; i < cur->n; i++)
        if (cur->nodes[i].state == TS_NODE_DOWN) {
            snprintf(why, sizeof(why),
                     "node %s is down: a split starts with every node up or out (bring it "
                     "back, or take it out and let that rebalance finish)",
                     cur->nodes[i].id);
            rc = refuse(x, TS_EBUSY, why);
            goto out;
        }
    rc = cli_rebalance_widest(x, &width);
    if (rc)
        goto out;
    if (!cli_rebalance_clean(x, cur, width, why, sizeof(why))) {
        char msg[sizeof(why) + 160];
        snprintf(msg, sizeof(msg),
                 "not every PG is clean: %s. A split needs every write on all of its PG's "
                 "replicas; try again once they caught up ('tessera status')",
                 why);
        rc = refuse(x, TS_EBUSY, msg);
        goto out;
    }
    next = ts_map_dup(cur);
    st = calloc(count, 1);
    if (!next || !st) {
        rc = TS_ENOMEM;
        goto out;
    }
    next->pg_count = count;
    next->placement_pgs = 0;
    rc = ts_map_move_set(next, cur->nodes, cur->n, NULL, 0, 0);
    if (!rc)
        rc = ts_map_move_set_from_placement(next, place);
    for (uint32_t pg = place; !rc && pg < count; pg++)
        if (cli_rebalance_pg_changes(next, pg, width)) {
            st[pg] = TS_PG_PENDING;
            moving++;
        }
    if (!rc)
        rc = ts_map_move_set(next, cur->nodes, cur->n, st, 0, x->rate ? x->rate / maxc : 0);
    if (!rc)
        rc = ts_map_move_set_from_placement(next, place);
    if (rc)
        goto out;
    next->move->driver = cli_rebalance_driver_token(x);
    next->move->concurrent = (uint32_t)maxc;
    if (!moving)
        ts_map_move_clear(next); /* every child's own placement is its parent's */
    if (x->dry_run) {
        printf("rebalance split: %u PGs would become %u; %u of the %u children would move, "
               "%llu at a time; dry run: nothing changed\n",
               before, count, moving, count - place, (unsigned long long)maxc);
        goto out;
    }
    rc = cli_map_push(x, next, &epoch);
    if (rc)
        goto out;
    if (!x->json)
        printf("rebalance split: map epoch %llu: %u PGs are %u, each child on its parent's "
               "replicas; %u of the %u children to move (%llu at a time%s)\n",
               (unsigned long long)epoch, place, count, moving, count - place,
               (unsigned long long)maxc, x->rate ? ", paced" : "");
    ts_map_free(cur);
    ts_map_free(next);
    free(st);
    return moving ? cli_rebalance_drive_started(x) : 0;
out:
    ts_map_free(cur);
    ts_map_free(next);
    free(st);
    return rc;
}
