/* The monitor's policy (control/policy.h): observations and a map in, the next map out. */
#include "policy.h"

#include "tessera/errno.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ts_policy_cfg_defaults(struct ts_policy_cfg *c)
{
    c->down_after_ms = 8000; /* a 5 s lease and 3 s of grace */
    c->out_after_ms = 600000;
    c->up_after_ms = 3000;
    c->max_down_pct = 34;
    c->flap_window_ms = 300000;
    c->flap_max = 4;
    c->damp_ms = 600000;
}

void ts_policy_init(struct ts_policy *p)
{
    memset(p, 0, sizeof(*p));
}

void ts_policy_fini(struct ts_policy *p)
{
    free(p->node);
    memset(p, 0, sizeof(*p));
}

static struct ts_policy_node *find(struct ts_policy *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->node[i].id, id))
            return &p->node[i];
    return NULL;
}

int ts_policy_auto_out(struct ts_policy *p, const char *id)
{
    const struct ts_policy_node *nd = find(p, id);

    return nd && nd->auto_out;
}

void ts_policy_observe(struct ts_policy *p, const char *id, int registered, int caught_up,
                       uint64_t now_ms)
{
    struct ts_policy_node *nd = find(p, id);

    if (!nd) {
        if (p->n == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 16;
            struct ts_policy_node *v = realloc(p->node, cap * sizeof(*v));
            if (!v)
                return; /* not observed: the next observation tries again */
            p->node = v;
            p->cap = cap;
        }
        nd = &p->node[p->n++];
        memset(nd, 0, sizeof(*nd));
        snprintf(nd->id, sizeof(nd->id), "%s", id);
        nd->registered = !registered; /* so that since_ms is set below */
    }
    if (nd->registered != !!registered) {
        nd->registered = !!registered;
        nd->since_ms = now_ms;
    }
    nd->caught_up = !!caught_up;
}

void ts_policy_reachable(struct ts_policy *p, const char *id, int reachable)
{
    struct ts_policy_node *nd = find(p, id);

    if (nd)
        nd->reachable = !!reachable;
}

/* A node holds a reachable copy: up in the map, and registered or answering its peers. */
static int reachable_copy(struct ts_policy *p, const struct ts_map *m, int i)
{
    const struct ts_policy_node *nd = find(p, m->nodes[i].id);

    return m->nodes[i].state == TS_NODE_UP && (!nd || nd->registered || nd->reachable);
}

/* The PG's copies in map m: the core replicas of its full-strength placement (`full`: every node
 * that is not out taken as up, as the data was placed) that are up in m and reachable. */
static unsigned live_copies(struct ts_policy *p, const struct ts_map *full, const struct ts_map *m,
                            uint32_t pg, unsigned core)
{
    int f[16];
    size_t nf = ts_map_pg_order(full, pg, f, core);
    unsigned ok = 0;

    for (size_t k = 0; k < nf; k++)
        ok += reachable_copy(p, m, f[k]);
    return ok;
}

/* The first PG the change from `before` to `after` takes below min_core live copies (one below
 * already is not the change's doing), or UINT32_MAX; TS_ENOMEM as UINT32_MAX - 1. Nodes are
 * matched by index: the policy changes states, not the node table. */
static uint32_t starved_pg(struct ts_policy *p, const struct ts_map *before,
                           const struct ts_map *after, const struct ts_policy_cfg *c)
{
    unsigned core = c->core < 1 ? 1 : c->core > 16 ? 16 : c->core;
    struct ts_map *full = ts_map_dup(before);
    uint32_t found = UINT32_MAX;

    if (!full)
        return UINT32_MAX;
    for (size_t i = 0; i < full->n; i++)
        if (full->nodes[i].state == TS_NODE_DOWN)
            full->nodes[i].state = TS_NODE_UP;
    for (uint32_t pg = 0; pg < after->pg_count && found == UINT32_MAX; pg++)
        if (live_copies(p, full, after, pg, core) < c->min_core &&
            live_copies(p, full, before, pg, core) >= c->min_core)
            found = pg;
    ts_map_free(full);
    return found;
}

/* Counts a state change of nd at now; damps it when it flaps. */
static void flap(struct ts_policy_node *nd, const struct ts_policy_cfg *c, uint64_t now)
{
    if (now - nd->flap_start_ms > c->flap_window_ms) {
        nd->flap_start_ms = now;
        nd->flaps = 0;
    }
    if (++nd->flaps >= c->flap_max)
        nd->damped_until_ms = now + c->damp_ms;
}

static void add_why(char *why, size_t cap, const char *id, const char *what)
{
    size_t n = strlen(why);

    snprintf(why + n, cap - n, "%s%s %s", n ? "; " : "", id, what);
}

int ts_policy_decide(struct ts_policy *p, const struct ts_map *m, const struct ts_policy_cfg *c,
                     uint64_t now, struct ts_map **next, char *why, size_t cap)
{
    struct ts_map *x;
    unsigned away = 0, limit = (unsigned)(m->n * c->max_down_pct / 100);
    int changed = 0;

    *next = NULL;
    why[0] = '\0';
    if (limit == 0)
        limit = 1;
    x = ts_map_dup(m);
    if (!x)
        return TS_ENOMEM;
    /* Nodes down already (by whoever's hand, back or not): the guard's count starts with
     * them. Out nodes hold no placements: they do not count. */
    for (size_t i = 0; i < x->n; i++)
        away += x->nodes[i].state == TS_NODE_DOWN;
    for (size_t i = 0; i < x->n; i++) {
        struct ts_map_node *mn = &x->nodes[i];
        struct ts_policy_node *nd = find(p, mn->id);
        uint64_t for_ms;
        if (!nd)
            continue; /* never observed: nothing known */
        for_ms = now - nd->since_ms;
        if (mn->state == TS_NODE_UP && !nd->registered && for_ms >= c->down_after_ms) {
            uint32_t pg;
            if (away >= limit) {
                add_why(why, cap, mn->id,
                        "stays up: marking it down would put more nodes away "
                        "than max_down_pct allows");
                continue;
            }
            mn->state = TS_NODE_DOWN;
            if (nd->reachable && c->min_core && (pg = starved_pg(p, m, x, c)) != UINT32_MAX) {
                char what[160];
                mn->state = TS_NODE_UP;
                snprintf(what, sizeof(what),
                         "stays up: it lost its lease but answers its peers, and marking it "
                         "down would leave PG %u below min_core %u reachable copies",
                         pg, c->min_core);
                add_why(why, cap, mn->id, what);
                continue;
            }
            away++;
            flap(nd, c, now);
            add_why(why, cap, mn->id, "down (its lease is gone)");
            changed = 1;
        } else if (mn->state == TS_NODE_DOWN && !nd->registered && for_ms >= c->out_after_ms) {
            mn->state = TS_NODE_OUT;
            nd->auto_out = 1;
            add_why(why, cap, mn->id, "out (gone for out_after: its data goes elsewhere)");
            changed = 1;
        } else if ((mn->state == TS_NODE_DOWN || (mn->state == TS_NODE_OUT && nd->auto_out)) &&
                   nd->registered && nd->caught_up && for_ms >= c->up_after_ms &&
                   now >= nd->damped_until_ms) {
            mn->state = TS_NODE_UP;
            nd->auto_out = 0;
            flap(nd, c, now);
            add_why(why, cap, mn->id, "up (back and caught up)");
            changed = 1;
        }
    }
    if (!changed) {
        ts_map_free(x);
        return 0;
    }
    x->epoch = m->epoch + 1;
    *next = x;
    return 0;
}
