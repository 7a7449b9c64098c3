/*
 * tessera CLI: `tessera drill SCENARIO --auto` (issue 29). On a cluster whose map lives in etcd
 * the drill kills and lets the cluster heal itself: no failover and no mark-up by the drill. It
 * waits, with its load running, for the monitor to mark the node down and, after the node's
 * start, up; and it reports per PG the node led the time from the act until the PG took an
 * acknowledged write again (writable) and until no node listed it peering or lagging after the
 * node's return (fully replicated), beside the drill's usual figures (cli_drill_check.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_drill.h"
#include "ts_map.h"

int drill_auto_check(struct drill *d, const char *scenario)
{
    struct json_object *st, *etcd, *v;
    int ok = 0;

    if (strcmp(scenario, "kill-primary") && strcmp(scenario, "kill-node") &&
        strcmp(scenario, "node-return")) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "--auto applies to kill-primary, kill-node and node-return (the acts the "
                 "monitor heals), not to %s",
                 scenario);
        return TS_EINVAL;
    }
    st = drill_status_of(d, 0);
    if (st && json_object_object_get_ex(st, "etcd", &etcd) &&
        json_object_object_get_ex(etcd, "reachable", &v))
        ok = json_object_get_boolean(v);
    json_object_put(st);
    if (!ok) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "--auto needs a cluster whose map is in etcd and reachable (tesserad --etcd; "
                 "its monitor heals it): %s's STATUS has no reachable etcd",
                 ts_client_map(d->x->c)->nodes[0].id);
        return TS_EINVAL;
    }
    return 0;
}

int drill_auto_pgs(struct drill *d, int i)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    int first[1];

    free(d->led);
    free(d->pg_writable_ns);
    free(d->pg_replicated_ns);
    d->npg = m->pg_count;
    d->led = calloc(d->npg, 1);
    d->pg_writable_ns = calloc(d->npg, sizeof(uint64_t));
    d->pg_replicated_ns = calloc(d->npg, sizeof(uint64_t));
    if (!d->led || !d->pg_writable_ns || !d->pg_replicated_ns)
        return TS_ENOMEM;
    for (uint32_t pg = 0; pg < d->npg; pg++)
        d->led[pg] = ts_map_pg_order(m, pg, first, 1) == 1 && first[0] == i;
    return 0;
}

void drill_auto_acked(struct drill *d, uint32_t s, uint64_t t)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    uint32_t pg = m ? ts_map_pg_of(m, d->ds, s) : UINT32_MAX;

    if (d->phase >= 1 && d->act_ns && pg < d->npg && d->led[pg] && !d->pg_writable_ns[pg])
        d->pg_writable_ns[pg] = t;
}

int drill_auto_wait(struct drill *d, const char *id, int state, double max_s, uint64_t *at)
{
    uint64_t end = ts_now_mono_ns() + (uint64_t)(max_s * 1e9), look = 0;

    *at = 0;
    while (ts_now_mono_ns() < end) {
        uint64_t now = ts_now_mono_ns();
        if (now >= look) {
            const struct ts_map *m;
            int i;
            ts_client_map_refresh(d->x->c); /* the newest map any node has (from etcd) */
            m = ts_client_map(d->x->c);
            i = m ? ts_map_find(m, id) : -1;
            if (i >= 0 && m->nodes[i].state == state) {
                *at = ts_now_mono_ns();
                return 0;
            }
            look = now + 100000000ull;
        }
        drill_load_step(d);
    }
    return TS_ETIMEDOUT;
}

/* Whether pg appears in any node's STATUS replication "peering" or "lag" list. */
static int pg_busy(struct json_object **st, size_t n, uint32_t pg)
{
    static const char *const lists[] = {"peering", "lag"};

    for (size_t i = 0; i < n; i++) {
        struct json_object *rep, *arr, *v;
        if (!st[i] || !json_object_object_get_ex(st[i], "replication", &rep))
            continue;
        for (size_t l = 0; l < 2; l++) {
            if (!json_object_object_get_ex(rep, lists[l], &arr) ||
                !json_object_is_type(arr, json_type_array))
                continue;
            for (size_t k = 0; k < json_object_array_length(arr); k++)
                if (json_object_object_get_ex(json_object_array_get_idx(arr, k), "pg", &v) &&
                    (uint32_t)json_object_get_int64(v) == pg)
                    return 1;
        }
    }
    return 0;
}

void drill_auto_replicated(struct drill *d, double max_s)
{
    uint64_t end = ts_now_mono_ns() + (uint64_t)(max_s * 1e9), look = 0;
    int left = 1;

    while (left && ts_now_mono_ns() < end) {
        uint64_t now = ts_now_mono_ns();
        if (now >= look) {
            const struct ts_map *m = ts_client_map(d->x->c);
            size_t n = m ? m->n : 0;
            struct json_object **st = calloc(n ? n : 1, sizeof(*st));
            left = 0;
            for (size_t i = 0; st && i < n; i++)
                if (m->nodes[i].state == TS_NODE_UP)
                    st[i] = drill_status_of(d, i);
            for (uint32_t pg = 0; st && pg < d->npg; pg++) {
                if (!d->led[pg] || d->pg_replicated_ns[pg])
                    continue;
                if (pg_busy(st, n, pg))
                    left = 1;
                else
                    d->pg_replicated_ns[pg] = now;
            }
            for (size_t i = 0; st && i < n; i++)
                json_object_put(st[i]);
            free(st);
            look = now + 200000000ull;
        }
        if (left)
            drill_load_step(d);
    }
    drill_note(d, "%s's PGs %s", d->node,
               left ? "not all fully replicated within the wait"
                    : "fully replicated again (no node lists them peering or lagging)");
}

static double since(uint64_t from, uint64_t to)
{
    return from && to >= from ? (double)(to - from) / 1e9 : -1;
}

void drill_auto_report(const struct drill *d, struct json_object *o)
{
    struct json_object *pgs = json_object_new_array();

    json_object_object_add(o, "auto", json_object_new_boolean(1));
    json_object_object_add(o, "marked_down_s",
                           json_object_new_double(since(d->act_ns, d->down_ns)));
    json_object_object_add(o, "marked_up_s", json_object_new_double(since(d->back_ns, d->up_ns)));
    for (uint32_t pg = 0; d->led && pg < d->npg; pg++) {
        struct json_object *p;
        if (!d->led[pg])
            continue;
        p = json_object_new_object();
        json_object_object_add(p, "pg", json_u64(pg));
        json_object_object_add(p, "writable_s",
                               json_object_new_double(since(d->act_ns, d->pg_writable_ns[pg])));
        json_object_object_add(p, "replicated_s",
                               json_object_new_double(since(d->act_ns, d->pg_replicated_ns[pg])));
        json_object_array_add(pgs, p);
    }
    json_object_object_add(o, "pgs", pgs);
}

void drill_auto_print(const struct drill *d)
{
    printf("  monitor (--auto):          marked %s down %.3f s after the kill, up %.3f s after "
           "its start (-1: not seen)\n",
           d->node, since(d->act_ns, d->down_ns), since(d->back_ns, d->up_ns));
    printf("  its PGs, from the kill:    PG  writable_s  fully_replicated_s\n");
    for (uint32_t pg = 0; d->led && pg < d->npg; pg++)
        if (d->led[pg])
            printf("                             %3u  %10.3f  %18.3f\n", pg,
                   since(d->act_ns, d->pg_writable_ns[pg]),
                   since(d->act_ns, d->pg_replicated_ns[pg]));
}
