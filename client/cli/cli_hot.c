/*
 * tessera CLI: hot datasets (tessera hot add|rm|ls; docs/operations.md "Hot datasets"). A hot
 * dataset gets extra fringe replicas from the map, in every PG or in one: the next nodes of each
 * PG's placement order, like any other replica. Adding one is a map change: each new replica is
 * marked as needing a backfill (it serves nothing of the PG until its primary streamed the
 * PG's shards to it) and takes the dataset's writes from then on (asynchronously, as fringe);
 * clients spread reads over every replica. Removing one pushes the map, then asks the nodes
 * past the new width to drop their copies (PG_DROP: a node deletes only what it holds no rank
 * for under its map). Refused, and nothing changed: an unknown dataset, a bad count or PG, more
 * replicas than nodes that are up, or a rebalance in progress.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ts_map.h"

#define MAX_RANK 64
/* Replicas a PG's placement gives a dataset at most: replication orders that many ranks
 * (TS_REPL_MAX_REPLICAS, replication/ts_repl.h). */
#define MAX_REPLICAS 8

static unsigned up_nodes(const struct ts_map *m)
{
    unsigned n = 0;
    for (size_t i = 0; i < m->n; i++)
        n += m->nodes[i].state == TS_NODE_UP;
    return n;
}

static const char *pg_words(int64_t pg, char *buf, size_t cap)
{
    if (pg < 0)
        snprintf(buf, cap, "every PG");
    else
        snprintf(buf, cap, "PG %lld", (long long)pg);
    return buf;
}

/* After a removal: the nodes past the dataset's new width in each PG it had extras in drop
 * their copies of it (PG_DROP of that dataset only). The count of shards dropped; *failed the
 * nodes that did not answer (their copies stay: unused, they cost only space). */
static long drop_extras(struct ctx *x, const struct ts_map *m, const struct ts_dataset_info *d,
                        int64_t only_pg, unsigned old_extra, unsigned *failed)
{
    unsigned base = (unsigned)d->policy.core + d->policy.fringe;
    long dropped = 0;

    *failed = 0;
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int order[MAX_RANK];
        unsigned width = base + ts_map_hot_extra(m, d->name, pg);
        size_t n;
        if (only_pg >= 0 && pg != (uint32_t)only_pg)
            continue;
        n = ts_map_pg_order(m, pg, order, TS_MIN(MAX_RANK, base + old_extra));
        for (size_t k = width; k < n; k++) {
            uint32_t shards = 0;
            uint64_t bytes = 0;
            int rc = ts_client_node_pg_drop_dataset(x->c, (size_t)order[k], pg, d->name, &shards,
                                                    &bytes);
            if (rc) {
                if (!*failed)
                    snprintf(x->local, sizeof(x->local),
                             "PG %u: %s did not drop its copies of %s: %s (they stay, unused)", pg,
                             m->nodes[order[k]].id, d->name, tessera_client_error(x->c));
                (*failed)++;
                continue;
            }
            dropped += shards;
        }
    }
    return dropped;
}

static int hot_change(struct ctx *x, int add)
{
    const char *name = x->argv[0];
    const struct ts_map *cur;
    struct ts_dataset_info d;
    struct ts_map *next;
    unsigned base, before = 0, after, extra = add ? (unsigned)x->hot_fringe : 0;
    int64_t pg = x->hot_pg_set ? (int64_t)x->hot_pg : -1;
    uint64_t epoch = 0;
    char where[32];
    int rc;

    ts_client_map_refresh(x->c); /* the newest map any node has: never push an older one */
    cur = ts_client_map(x->c);
    if (!cur) {
        snprintf(x->local, sizeof(x->local), "hot datasets need a cluster (this node has no map)");
        return TS_EINVAL;
    }
    if (cur->move) {
        snprintf(x->local, sizeof(x->local),
                 "a rebalance is in progress: change hot datasets once it ends (rebalance "
                 "status)");
        return TS_EBUSY;
    }
    if (pg >= (int64_t)cur->pg_count) {
        snprintf(x->local, sizeof(x->local), "--pg %lld: the map has PGs 0..%u", (long long)pg,
                 cur->pg_count - 1);
        return TS_EINVAL;
    }
    rc = tessera_dataset_stat(x->c, name, &d);
    if (rc == TS_ENOENT && !add) {
        /* A deleted dataset's entry can still go (else a new dataset of that name would be
         * hot at once); no copies are left to drop. */
        memset(&d, 0, sizeof(d));
        snprintf(d.name, sizeof(d.name), "%s", name);
    } else if (rc) {
        return rc; /* unknown name: the server's message */
    }
    base = (unsigned)d.policy.core + d.policy.fringe;
    for (size_t i = 0; i < cur->nhot; i++)
        if (cur->hot[i].pg == pg && !strcmp(cur->hot[i].dataset, name))
            before = cur->hot[i].fringe;
    if (add && (extra < 1 || extra > TS_MAP_MAX_HOT_FRINGE)) {
        snprintf(x->local, sizeof(x->local), "--fringe: want +1 to +%d extra replicas",
                 TS_MAP_MAX_HOT_FRINGE);
        return TS_EINVAL;
    }
    if (add && base + extra > MAX_REPLICAS) {
        snprintf(x->local, sizeof(x->local),
                 "%s has %u replicas per PG; %u more would make %u, and a PG's placement gives a "
                 "dataset at most %d",
                 name, base, extra, base + extra, MAX_REPLICAS);
        return TS_EINVAL;
    }
    if (add && base + extra > up_nodes(cur)) {
        snprintf(x->local, sizeof(x->local),
                 "%s has %u replicas per PG; %u more need %u nodes, and %u are up", name, base,
                 extra, base + extra, up_nodes(cur));
        return TS_EINVAL;
    }
    if (!add && !before) {
        snprintf(x->local, sizeof(x->local), "%s has no hot entry for %s (hot ls)", name,
                 pg_words(pg, where, sizeof(where)));
        return TS_ENOENT;
    }
    next = ts_map_dup(cur);
    if (!next)
        return TS_ENOMEM;
    rc = ts_map_hot_set(next, name, pg, extra);
    if (rc) {
        ts_map_free(next);
        snprintf(x->local, sizeof(x->local), "cannot set the hot entry (%s)", ts_strerror(rc));
        return rc;
    }
    after = extra;
    if (!x->json && !add && !d.id)
        printf("hot rm %s: %s: the entry goes (the dataset no longer exists)\n", name,
               pg_words(pg, where, sizeof(where)));
    else if (!x->json)
        printf("hot %s %s: %s: %u extra fringe replica%s -> %u (replicas per PG %u -> %u); "
               "about %.1f MB to %s\n",
               add ? "add" : "rm", name, pg_words(pg, where, sizeof(where)), before,
               before == 1 ? "" : "s", after, base + before, base + after,
               (double)d.bytes * (after > before ? after - before : before - after) /
                   (pg < 0 ? 1.0 : (double)cur->pg_count) / 1e6,
               after > before ? "copy (backfilled from each PG's primary)" : "delete");
    if (x->dry_run) {
        ts_map_free(next);
        if (!x->json)
            printf("dry run: nothing changed\n");
        return 0;
    }
    rc = cli_map_push(x, next, &epoch);
    if (rc) {
        ts_map_free(next);
        return rc;
    }
    if (!add && d.id) {
        unsigned failed = 0;
        long dropped = drop_extras(x, next, &d, pg, before, &failed);
        if (!x->json)
            printf("map epoch %llu; %ld shard copies dropped%s\n", (unsigned long long)epoch,
                   dropped, failed ? " (some nodes did not answer: see below)" : "");
        if (failed) {
            ts_map_free(next);
            return TS_EIO;
        }
    } else if (!add && !x->json) {
        printf("map epoch %llu\n", (unsigned long long)epoch);
    } else if (!x->json) {
        printf("map epoch %llu; the new replicas fill in the background (tessera status)\n",
               (unsigned long long)epoch);
    }
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(name));
        json_object_object_add(o, "pg", json_object_new_int64(pg));
        json_object_object_add(o, "extra_fringe", json_object_new_int((int)after));
        json_object_object_add(o, "replicas_per_pg", json_object_new_int((int)(base + after)));
        json_object_object_add(o, "map_epoch", json_u64(epoch));
        json_print(o);
    }
    ts_map_free(next);
    return 0;
}

int cmd_hot_add(struct ctx *x)
{
    return hot_change(x, 1);
}

int cmd_hot_rm(struct ctx *x)
{
    return hot_change(x, 0);
}

int cmd_hot_ls(struct ctx *x)
{
    const struct ts_map *m = ts_client_map(x->c);
    struct json_object *arr = json_object_new_array();
    char where[32];

    if (!x->json)
        printf("%-24s %-10s %-6s %s\n", "DATASET", "PG", "EXTRA", "REPLICAS_PER_PG");
    for (size_t i = 0; m && i < m->nhot; i++) {
        const struct ts_map_hot *h = &m->hot[i];
        struct ts_dataset_info d;
        int have = tessera_dataset_stat(x->c, h->dataset, &d) == 0;
        unsigned base = have ? (unsigned)d.policy.core + d.policy.fringe : 0;
        if (x->json) {
            struct json_object *o = json_object_new_object();
            json_object_object_add(o, "dataset", json_object_new_string(h->dataset));
            json_object_object_add(o, "pg", json_object_new_int64(h->pg));
            json_object_object_add(o, "extra_fringe", json_object_new_int(h->fringe));
            if (have)
                json_object_object_add(o, "replicas_per_pg",
                                       json_object_new_int((int)(base + h->fringe)));
            json_object_array_add(arr, o);
        } else {
            char reps[32] = "? (no such dataset)";
            if (have)
                snprintf(reps, sizeof(reps), "%u", base + h->fringe);
            printf("%-24s %-10s +%-5u %s\n", h->dataset,
                   h->pg < 0 ? "all" : pg_words(h->pg, where, sizeof(where)) + 3, h->fringe, reps);
        }
    }
    if (x->json)
        json_print(arr);
    else
        json_object_put(arr);
    return 0;
}
