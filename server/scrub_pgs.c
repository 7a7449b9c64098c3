/*
 * The cluster half of a scrub: every PG this node holds a replica of (not the ones it leads)
 * is compared with its primary's inventory (replication/inventory.c). A PG whose log position
 * matches the primary's but whose shards do not has lost shards behind its log's back (a
 * damaged store): it is counted, logged, and backfilled from the primary, which streams only
 * what is missing. Runs on the maintenance thread.
 */
#include "server_internal.h"

#undef FAC
#define FAC "scrub"
#define PG_TIMEOUT_MS 5000

void tsd_scrub_pgs(struct tsd_server *s, struct tsd_scrub_pgs *out, const _Atomic int *cancel)
{
    memset(out, 0, sizeof(*out));
    if (!s->repl || !atomic_load(&s->epoch))
        return;
    for (uint32_t pg = 0; pg < s->npg && !atomic_load(&s->stopping) && !atomic_load(cancel); pg++) {
        struct ts_repl_inventory inv;
        int rc = ts_repl_inventory_check(s->repl, pg, PG_TIMEOUT_MS, &inv);

        if (rc == TS_EEXIST || rc == TS_ENOENT)
            continue; /* we lead it, or hold none of it */
        if (rc || inv.applied != inv.primary_applied) {
            /* The primary is away or peering, or writes are in flight: next scrub. */
            out->unchecked++;
            continue;
        }
        out->compared++;
        if (inv.count == inv.primary_count && inv.digest == inv.primary_digest)
            continue;
        out->differing++;
        if (inv.primary_count > inv.count)
            out->missing += inv.primary_count - inv.count;
        TS_WARN(FAC, TS_ECORRUPT,
                "PG %u: this replica (rank %d) holds %llu complete shards, its primary %s %llu, "
                "at the same log position %llu: shards were lost here; asking %s for a backfill",
                pg, inv.rank, (unsigned long long)inv.count, inv.primary,
                (unsigned long long)inv.primary_count, (unsigned long long)inv.applied,
                inv.primary);
        ts_repl_ask_backfill(s->repl, pg);
    }
}
