/*
 * tessera CLI: live rebalancing (docs/operations.md "Rebalancing"); `rebalance plan` is in
 * cli_node.c.
 *
 *   rebalance apply FILE [--max-bytes-per-sec R] [--max-concurrent N] [--detach]
 *   rebalance status | pause | resume [--detach] | rollback [--detach]
 *
 * The state lives in the cluster map (ts_map.h, struct ts_map_move), not in this process: the
 * target node table, the table before, and per PG whether it is pending, moving or settled.
 * apply pushes the target with every changing PG pending (each keeps its old placement), then
 * drives: up to N PGs move at a time (their incoming replicas get the log and a backfill from
 * the PG's primary, paced at R / N bytes/s each, while the old replicas keep serving reads and
 * writes); a PG whose incoming replicas its primary reports caught up and clean settles (takes
 * the target placement) in the next epoch, several in one push; once its new replicas are
 * clean, every node outside them drops its copies (PG_DROP). Any CLI can pick the drive up
 * again (resume), pause it, or roll it back: the target becomes the table before (nodes the
 * rebalance added stay, out), with the PGs placed differently pending again.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ts_map.h"

#define MAX_RANK 16
#define POLL_MS 300
#define TRUST_MS 600 /* a primary's lag report is trusted this long after it has the epoch */

struct rb {
    struct ctx *x;
    unsigned width;     /* widest dataset: core + fringe */
    unsigned maxc;      /* PGs moving at once */
    uint64_t rate;      /* bytes/s in all, 0 unlimited */
    uint8_t *want_drop; /* per PG: settled by this rebalance, copies outside it to drop */
    uint64_t *seen_ms;  /* per PG: when its primary was first seen with the map's epoch */
    uint64_t said_ms;   /* when the PGs still waiting were last named */
    char why[256];      /* what the last PG found incomplete waits for */
    uint64_t *pg_bytes;
};

/* `tessera monitor` (cli_monitor.c): it drives as TS_MOVE_DRIVER_MONITOR while keep() says it
 * is still the elected one. */
static uint64_t token_override;
static int (*keep_driving)(void);

void cli_rebalance_as_monitor(int (*keep)(void))
{
    token_override = TS_MOVE_DRIVER_MONITOR;
    keep_driving = keep;
}

/* This process's token as the rebalance's driver (the map names one; the others stop). */
static uint64_t my_token(void)
{
    static uint64_t t;
    struct timespec ts;

    if (token_override)
        return token_override;
    if (!t) {
        clock_gettime(CLOCK_REALTIME, &ts);
        t = ((uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^
             (uint64_t)ts.tv_sec) &
            (uint64_t)INT64_MAX;
        if (t <= TS_MOVE_DRIVER_MONITOR)
            t += 2;
    }
    return t;
}

/* On etcd a command hands the drive to the elected `tessera monitor` and ends: the rebalance
 * goes on without it (and after the monitor's death, under the next one). */
static int handed_to_monitor(const struct ctx *x)
{
    return x->etcd && !token_override;
}

static uint64_t driver_token(const struct ctx *x)
{
    return handed_to_monitor(x) ? TS_MOVE_DRIVER_MONITOR : my_token();
}

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The first w of PG pg's order before the rebalance (as node indexes of m) and its target. */
static size_t old_order(const struct ts_map *m, uint32_t pg, int *out, size_t w)
{
    size_t n = ts_map_pg_target_order(m->move->old, pg, out, w);

    for (size_t i = 0; i < n; i++)
        out[i] = m->move->old_idx[out[i]];
    return n;
}

static int pg_changes(const struct ts_map *m, uint32_t pg, unsigned w)
{
    int a[MAX_RANK], b[MAX_RANK];
    size_t na = old_order(m, pg, a, w), nb = ts_map_pg_target_order(m, pg, b, w);

    if (na != nb)
        return 1;
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i])
            return 1;
    return 0;
}

static int in_list(const int *v, size_t n, int x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static int widest(struct ctx *x, unsigned *w)
{
    struct ts_dataset_info *ds = NULL;
    size_t nds = 0;
    int rc = tessera_dataset_list(x->c, &ds, &nds);

    *w = 1;
    for (size_t i = 0; !rc && i < nds; i++)
        *w = TS_MAX(*w, (unsigned)(ds[i].policy.core + ds[i].policy.fringe));
    tessera_buffer_free(ds);
    *w = TS_MIN(*w, (unsigned)MAX_RANK);
    return rc;
}

/* Bytes of each PG (every shard of every dataset, once). */
static int pg_sizes(struct ctx *x, const struct ts_map *m, uint64_t *out)
{
    struct ts_dataset_info *ds = NULL;
    size_t nds = 0;
    int rc = tessera_dataset_list(x->c, &ds, &nds);

    memset(out, 0, m->pg_count * sizeof(*out));
    for (size_t d = 0; !rc && d < nds; d++) {
        struct ts_shard_info *sh = NULL;
        size_t nsh = 0;
        if (tessera_shard_list(x->c, ds[d].name, &sh, &nsh) != 0)
            continue;
        for (size_t k = 0; k < nsh; k++)
            out[ts_map_pg_of(m, ds[d].name, sh[k].shard)] += sh[k].size;
        tessera_buffer_free(sh);
    }
    tessera_buffer_free(ds);
    return rc;
}

/* The newest map any node has (a copy the caller frees). */
static int newest(struct ctx *x, struct ts_map **out)
{
    const struct ts_map *m;

    ts_client_map_refresh(x->c);
    m = ts_client_map(x->c);
    if (!m) {
        snprintf(x->local, sizeof(x->local), "%s has no cluster map: it runs as a single node",
                 x->server);
        return TS_EINVAL;
    }
    *out = ts_map_dup(m);
    return *out ? 0 : TS_ENOMEM;
}

/* ---- progress ---------------------------------------------------------------------------------
 */

struct progress {
    unsigned total, pending, moving, settled;
    uint64_t bytes_total, bytes_done;
};

static void progress_of(const struct rb *b, const struct ts_map *m, struct progress *p)
{
    memset(p, 0, sizeof(*p));
    if (!m->move)
        return;
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int st = m->move->pg[pg];
        if (st == TS_PG_SETTLED && !pg_changes(m, pg, b->width))
            continue;
        p->total++;
        p->pending += st == TS_PG_PENDING;
        p->moving += st == TS_PG_MOVING;
        p->settled += st == TS_PG_SETTLED;
        if (b->pg_bytes) {
            p->bytes_total += b->pg_bytes[pg];
            if (st == TS_PG_SETTLED)
                p->bytes_done += b->pg_bytes[pg];
        }
    }
}

static struct json_object *progress_json(const struct ts_map *m, const struct progress *p,
                                         double rate, double eta)
{
    struct json_object *o = json_object_new_object();

    json_object_object_add(o, "in_progress", json_object_new_boolean(m->move != NULL));
    json_object_object_add(o, "epoch", json_u64(m->epoch));
    json_object_object_add(o, "paused", json_object_new_boolean(m->move && m->move->paused));
    json_object_object_add(o, "pgs_total", json_u64(p->total));
    json_object_object_add(o, "pgs_done", json_u64(p->settled));
    json_object_object_add(o, "pgs_moving", json_u64(p->moving));
    json_object_object_add(o, "pgs_pending", json_u64(p->pending));
    json_object_object_add(o, "bytes_total", json_u64(p->bytes_total));
    json_object_object_add(o, "bytes_done", json_u64(p->bytes_done));
    json_object_object_add(o, "rate_bytes_per_s", json_object_new_double(rate));
    json_object_object_add(o, "eta_s", json_object_new_double(eta));
    json_object_object_add(o, "max_bytes_per_s_per_pg", json_u64(m->move ? m->move->rate : 0));
    return o;
}

static void progress_print(const struct rb *b, const struct ts_map *m, const struct progress *p,
                           double rate, int tty)
{
    double eta = rate > 0 ? (double)(p->bytes_total - p->bytes_done) / rate : -1;

    if (b->x->json) {
        struct json_object *o = progress_json(m, p, rate, eta);
        printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        json_object_put(o);
    } else if (tty) {
        char bar[31];
        unsigned fill = p->total ? 30u * p->settled / p->total : 30u;
        memset(bar, '#', fill);
        memset(bar + fill, '.', 30 - fill);
        bar[30] = '\0';
        printf("\r[%s] %u/%u PGs, %u moving, %.1f/%.1f MB, %.1f MB/s, ETA %s  ", bar, p->settled,
               p->total, p->moving, (double)p->bytes_done / 1e6, (double)p->bytes_total / 1e6,
               rate / 1e6, eta < 0 ? "-" : "");
        if (eta >= 0)
            printf("\b\b%.0f s  ", eta);
    } else if (!tty) {
        printf("rebalance: epoch %llu, %u/%u PGs done, %u moving, %u pending, %llu/%llu bytes, "
               "%.1f MB/s%s\n",
               (unsigned long long)m->epoch, p->settled, p->total, p->moving, p->pending,
               (unsigned long long)p->bytes_done, (unsigned long long)p->bytes_total, rate / 1e6,
               m->move && m->move->paused ? ", paused" : "");
    }
    fflush(stdout);
}

/* ---- the drive --------------------------------------------------------------------------------
 */

/* Node i's STATUS: the map epoch it runs, and whether it lists (pg, node) as lagging or
 * recovering (a primary's replication.lag). */
struct node_view {
    int ok;
    uint64_t epoch;
    struct json_object *doc;
};

static void view_read(struct ctx *x, size_t i, struct node_view *v)
{
    struct json_object *e;
    char *json = NULL;

    memset(v, 0, sizeof(*v));
    if (ts_client_node_status(x->c, i, &json) != 0 || !(v->doc = json_tokener_parse(json))) {
        tessera_buffer_free(json);
        return;
    }
    tessera_buffer_free(json);
    v->ok = 1;
    if (json_object_object_get_ex(v->doc, "epoch", &e))
        v->epoch = (uint64_t)json_object_get_int64(e);
}

static int view_lists(const struct node_view *v, uint32_t pg, const char *node)
{
    struct json_object *rep, *arr;

    if (!json_object_object_get_ex(v->doc, "replication", &rep) ||
        !json_object_object_get_ex(rep, "lag", &arr) || !json_object_is_type(arr, json_type_array))
        return 0;
    for (size_t k = 0; k < json_object_array_length(arr); k++) {
        struct json_object *o = json_object_array_get_idx(arr, k), *a, *b;
        if (json_object_object_get_ex(o, "pg", &a) && json_object_object_get_ex(o, "node", &b) &&
            (uint32_t)json_object_get_int64(a) == pg &&
            (!node || !strcmp(json_object_get_string(b), node)))
            return 1;
    }
    return 0;
}

static int view_peering(const struct node_view *v, uint32_t pg)
{
    struct json_object *rep, *arr, *a;

    if (!json_object_object_get_ex(v->doc, "replication", &rep) ||
        !json_object_object_get_ex(rep, "peering", &arr) ||
        !json_object_is_type(arr, json_type_array))
        return 0;
    for (size_t k = 0; k < json_object_array_length(arr); k++)
        if (json_object_object_get_ex(json_object_array_get_idx(arr, k), "pg", &a) &&
            (uint32_t)json_object_get_int64(a) == pg)
            return 1;
    return 0;
}

/*
 * Whether PG pg's replicas under `order` (w of them) are complete as its primary (order[0])
 * sees them now: it runs m's epoch (for TRUST_MS already, so its report is of this epoch), is
 * not peering the PG, and lists none of them as lagging or recovering.
 */
static int pg_complete(struct rb *b, const struct ts_map *m, struct node_view *views, uint32_t pg,
                       const int *order, size_t w)
{
    struct node_view *pv = &views[order[0]];

    if (!pv->ok || pv->epoch < m->epoch) {
        snprintf(b->why, sizeof(b->why), "its primary %s %s", m->nodes[order[0]].id,
                 pv->ok ? "has not the map yet" : "does not answer");
        b->seen_ms[pg] = 0;
        return 0;
    }
    if (!b->seen_ms[pg])
        b->seen_ms[pg] = now_ms();
    if (now_ms() - b->seen_ms[pg] < TRUST_MS) {
        snprintf(b->why, sizeof(b->why), "its primary %s's report of epoch %llu",
                 m->nodes[order[0]].id, (unsigned long long)m->epoch);
        return 0;
    }
    if (view_peering(pv, pg)) {
        snprintf(b->why, sizeof(b->why), "its primary %s is peering it", m->nodes[order[0]].id);
        return 0;
    }
    for (size_t i = 1; i < w; i++)
        if (view_lists(pv, pg, m->nodes[order[i]].id)) {
            snprintf(b->why, sizeof(b->why), "%s, which its primary %s lists as behind",
                     m->nodes[order[i]].id, m->nodes[order[0]].id);
            return 0;
        }
    return 1;
}

/* Every node outside the PG's new placement drops its copies (they refuse what they hold a
 * rank for); 1 once every node that is up has answered. */
static int drop_outside(struct rb *b, const struct ts_map *m, uint32_t pg)
{
    int t[MAX_RANK];
    size_t nt = ts_map_pg_target_order(m, pg, t, b->width);
    int all = 1;

    for (size_t i = 0; i < m->n; i++) {
        uint32_t shards = 0;
        uint64_t bytes = 0;
        if (in_list(t, nt, (int)i) || m->nodes[i].state == TS_NODE_DOWN)
            continue;
        if (ts_client_node_pg_drop(b->x->c, i, pg, &shards, &bytes) != 0) {
            all = 0;
            continue;
        }
        if (shards && !b->x->json)
            fprintf(stderr,
                    "rebalance: PG %u: %s dropped %u shards (%llu bytes) it no longer "
                    "holds\n",
                    pg, m->nodes[i].id, shards, (unsigned long long)bytes);
    }
    return all;
}

/* One look at the cluster and at most one map push. 1 when the rebalance is over. */
static int drive_step(struct rb *b, int tty, double *rate)
{
    struct ctx *x = b->x;
    struct ts_map *m = NULL;
    struct node_view *views = NULL;
    struct progress p;
    unsigned moving = 0, settle = 0, start = 0, drops_left = 0;
    int rc, changed = 0;

    rc = newest(x, &m);
    if (rc)
        return rc;
    views = calloc(m->n, sizeof(*views));
    if (!views) {
        ts_map_free(m);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < m->n; i++)
        if (m->nodes[i].state != TS_NODE_DOWN) /* out nodes may still hold kept placements */
            view_read(x, i, &views[i]);
    /* Settled PGs whose new replicas are complete: the copies outside them go. */
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int t[MAX_RANK];
        size_t nt;
        if (!b->want_drop[pg] || ts_map_pg_move_state(m, pg) != TS_PG_SETTLED)
            continue;
        nt = ts_map_pg_target_order(m, pg, t, b->width);
        if (nt && pg_complete(b, m, views, pg, t, nt) && drop_outside(b, m, pg))
            b->want_drop[pg] = 0;
        else
            drops_left++;
    }
    if (!m->move) {
        rc = drops_left ? 0 : 1;
        goto out;
    }
    if (m->move->paused) {
        rc = 2;
        goto out;
    }
    if (m->move->driver != my_token()) {
        rc = 3; /* a later command drives it now */
        goto out;
    }
    /* Moving PGs whose incoming replicas are complete settle; pending ones start. */
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int a[MAX_RANK], t[MAX_RANK], both[2 * MAX_RANK];
        size_t na, nt, n;
        if (m->move->pg[pg] != TS_PG_MOVING)
            continue;
        moving++;
        na = old_order(m, pg, a, b->width);
        nt = ts_map_pg_target_order(m, pg, t, b->width);
        if (!na)
            continue;
        /* The primary (old order) reports on the old replicas and the incoming ones alike. */
        memcpy(both, a, na * sizeof(*a));
        n = na;
        for (size_t i = 0; i < nt; i++)
            if (!in_list(both, n, t[i]))
                both[n++] = t[i];
        if (!pg_complete(b, m, views, pg, both, n)) {
            if (!x->json && now_ms() - b->said_ms > 10000) {
                fprintf(stderr, "rebalance: PG %u waits for %s\n", pg, b->why);
                b->said_ms = now_ms();
            }
        } else {
            m->move->pg[pg] = TS_PG_SETTLED;
            b->seen_ms[pg] = 0;
            b->want_drop[pg] = 1;
            settle++;
            changed = 1;
        }
    }
    moving -= settle;
    for (uint32_t pg = 0; pg < m->pg_count && moving + start < b->maxc; pg++) {
        if (m->move->pg[pg] != TS_PG_PENDING)
            continue;
        m->move->pg[pg] = TS_PG_MOVING;
        start++;
        changed = 1;
    }
    progress_of(b, m, &p);
    if (!p.pending && !p.moving) {
        ts_map_move_clear(m); /* every PG has its target placement: the rebalance ends */
        changed = 1;
    }
    if (changed) {
        struct ts_map *chk = NULL;
        uint64_t epoch = 0;
        /* Only over the map this step read: a pause or a takeover since wins. */
        rc = newest(x, &chk);
        if (!rc && (chk->epoch != m->epoch || !chk->move || chk->move->paused ||
                    chk->move->driver != my_token())) {
            ts_map_free(chk);
            goto out; /* rc 0: look again */
        }
        ts_map_free(chk);
        if (!rc)
            rc = cli_map_push(x, m, &epoch);
        if (rc == TS_ESTALE) {
            rc = 0; /* another change took this epoch on some node: look again */
            goto out;
        }
        if (rc)
            goto out;
        if (!x->json && !tty && (settle || start))
            printf("rebalance: epoch %llu: %u PG%s settled, %u started moving\n",
                   (unsigned long long)epoch, settle, settle == 1 ? "" : "s", start);
        m->epoch = epoch;
    }
    if (tty || b->x->json || changed)
        progress_print(b, m, &p, *rate, tty);
    rc = 0;
out:
    for (size_t i = 0; i < m->n; i++)
        json_object_put(views[i].doc);
    free(views);
    ts_map_free(m);
    return rc;
}

static int rb_init(struct rb *b, struct ctx *x)
{
    struct ts_map *m = NULL;
    int rc;

    memset(b, 0, sizeof(*b));
    b->x = x;
    b->rate = x->rate;
    rc = widest(x, &b->width);
    if (!rc)
        rc = newest(x, &m);
    if (rc)
        return rc;
    /* --max-concurrent, else what the map keeps from apply (or the last resume), else 4 */
    b->maxc = x->max_concurrent                ? (unsigned)x->max_concurrent
              : m->move && m->move->concurrent ? m->move->concurrent
                                               : 4;
    b->want_drop = calloc(m->pg_count, 1);
    b->seen_ms = calloc(m->pg_count, sizeof(*b->seen_ms));
    b->pg_bytes = calloc(m->pg_count, sizeof(*b->pg_bytes));
    if (!b->want_drop || !b->seen_ms || !b->pg_bytes)
        rc = TS_ENOMEM;
    if (!rc)
        rc = pg_sizes(x, m, b->pg_bytes);
    for (uint32_t pg = 0; !rc && m->move && pg < m->pg_count; pg++)
        b->want_drop[pg] = m->move->pg[pg] == TS_PG_SETTLED && pg_changes(m, pg, b->width);
    ts_map_free(m);
    return rc;
}

static void rb_fini(struct rb *b)
{
    free(b->want_drop);
    free(b->seen_ms);
    free(b->pg_bytes);
}

/* Runs the drive here until the rebalance ends (0) or is paused (0, said). */
static int drive(struct ctx *x)
{
    struct rb b;
    int tty = isatty(STDOUT_FILENO) && !x->json, rc;
    uint64_t t0 = now_ms(), done0 = UINT64_MAX;
    double rate = 0;

    rc = rb_init(&b, x);
    usleep(2 * POLL_MS * 1000); /* a driver before this one sees the takeover and stops */
    while (!rc) {
        struct ts_map *m = NULL;
        struct progress p;
        if (keep_driving && !keep_driving()) {
            rc = 3; /* no longer the elected monitor: the next one drives */
            break;
        }
        rc = drive_step(&b, tty, &rate);
        if (rc == 1 || rc == 2 || rc == 3)
            break;
        if (rc)
            break;
        usleep(POLL_MS * 1000);
        if (newest(x, &m) == 0) {
            progress_of(&b, m, &p);
            if (done0 == UINT64_MAX)
                done0 = p.bytes_done;
            if (now_ms() > t0)
                rate = (double)(p.bytes_done - TS_MIN(done0, p.bytes_done)) * 1000.0 /
                       (double)(now_ms() - t0);
            ts_map_free(m);
        }
    }
    if (tty)
        printf("\n");
    if (rc == 2 && !x->json)
        printf("rebalance: paused ('tessera rebalance resume' goes on from here)\n");
    else if (rc == 1 && !x->json)
        printf("rebalance: done: every PG has its new placement and the copies outside it are "
               "dropped\n");
    else if (rc == 3 && !x->json)
        printf("rebalance: another command drives it now (resume, rollback); this one stops\n");
    rb_fini(&b);
    return rc == 1 || rc == 2 || rc == 3 ? 0 : rc;
}

/* The drive is the monitor's: say so, and whether one is elected now (PREFIX/rebalancer). */
static int monitor_note(struct ctx *x)
{
    int running = cli_etcd_monitor_elected(x);

    if (!x->json)
        printf("rebalance: driven by the elected 'tessera monitor' (etcd %s%s); 'tessera "
               "rebalance status' shows progress\n",
               x->etcd_prefix,
               running ? "" : ": none runs now, the rebalance waits until one does");
    return 0;
}

int cli_rebalance_drive(struct ctx *x)
{
    return drive(x);
}

/* --detach: `tessera ... rebalance resume` goes on in a session of its own, its output in a
 * log file (the state is in the map, so a fresh process picks the drive up; a forked copy of
 * this one would share its connections). */
static int drive_maybe_detached(struct ctx *x)
{
    char path[64], exe[4096], conc[24];
    const char *argv[24];
    int argc = 0, fd;
    ssize_t n;
    pid_t pid;

    if (handed_to_monitor(x))
        return monitor_note(x);
    if (!x->detach)
        return drive(x);
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return TS_EIO;
    exe[n] = '\0';
    snprintf(path, sizeof(path), "/tmp/tessera-rebalance-%ld.log", (long)getpid());
    snprintf(conc, sizeof(conc), "%llu", (unsigned long long)x->max_concurrent);
    argv[argc++] = exe;
    argv[argc++] = "-s";
    argv[argc++] = x->server;
    if (x->opts->tls_ca) {
        argv[argc++] = "--tls-ca";
        argv[argc++] = x->opts->tls_ca;
    }
    if (x->opts->tls_cert) {
        argv[argc++] = "--tls-cert";
        argv[argc++] = x->opts->tls_cert;
        argv[argc++] = "--tls-key";
        argv[argc++] = x->opts->tls_key;
    }
    if (x->opts->tls_server_name) {
        argv[argc++] = "--tls-server-name";
        argv[argc++] = x->opts->tls_server_name;
    }
    argv[argc++] = "rebalance";
    argv[argc++] = "resume";
    if (x->max_concurrent) { /* else the map's */
        argv[argc++] = "--max-concurrent";
        argv[argc++] = conc;
    }
    argv[argc] = NULL;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ts_from_errno(errno);
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        close(fd);
        return ts_from_errno(errno);
    }
    if (pid == 0) {
        setsid();
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    printf("rebalance: driven in the background (pid %ld, log %s); 'tessera rebalance status' "
           "shows progress\n",
           (long)pid, path);
    return 0;
}

/* ---- commands ---------------------------------------------------------------------------------
 */

int cmd_rebalance_apply(struct ctx *x)
{
    struct ts_map *cur = NULL, *f = NULL, *next = NULL;
    char why[256] = "";
    unsigned width, changing = 0;
    uint8_t *st = NULL;
    uint64_t epoch = 0, maxc = x->max_concurrent ? x->max_concurrent : 4;
    int rc;

    rc = newest(x, &cur);
    if (rc)
        return rc;
    if (cur->move) {
        snprintf(x->local, sizeof(x->local),
                 "a rebalance is in progress (map epoch %llu): 'tessera rebalance status', "
                 "'resume' or 'rollback' it first",
                 (unsigned long long)cur->epoch);
        rc = TS_EINVAL;
        goto out;
    }
    if (ts_map_parse_file(x->argv[0], &f, why, sizeof(why)) != 0) {
        snprintf(x->local, sizeof(x->local), "%s", why);
        rc = TS_EINVAL;
        goto out;
    }
    if (f->pg_count != cur->pg_count || f->move) {
        snprintf(x->local, sizeof(x->local), "%s: %s", x->argv[0],
                 f->move ? "a map file with a rebalance section is not a target"
                         : "pg_count differs from the cluster's ('tessera rebalance split' "
                           "doubles it)");
        rc = TS_EINVAL;
        goto out;
    }
    rc = widest(x, &width);
    if (rc)
        goto out;
    next = ts_map_dup(f);
    st = calloc(cur->pg_count, 1);
    if (!next || !st) {
        rc = TS_ENOMEM;
        goto out;
    }
    next->epoch = cur->epoch;
    rc = ts_map_move_set(next, cur->nodes, cur->n, NULL, 0, x->rate ? x->rate / maxc : 0);
    if (rc) {
        snprintf(x->local, sizeof(x->local),
                 "%s leaves out nodes the cluster has: take a node out first ('tessera node "
                 "drain'), let the rebalance empty it, and remove it after",
                 x->argv[0]);
        goto out;
    }
    for (uint32_t pg = 0; pg < cur->pg_count; pg++)
        if (pg_changes(next, pg, width)) {
            st[pg] = TS_PG_PENDING;
            changing++;
        }
    if (!changing) {
        snprintf(x->local, sizeof(x->local),
                 "%s places every PG as the cluster does already: "
                 "nothing to move (use 'map push' for other changes)",
                 x->argv[0]);
        rc = TS_EINVAL;
        goto out;
    }
    rc = ts_map_move_set(next, cur->nodes, cur->n, st, 0, x->rate ? x->rate / maxc : 0);
    if (rc)
        goto out;
    next->move->driver = driver_token(x);
    next->move->concurrent = (uint32_t)maxc;
    if (x->dry_run) {
        printf("rebalance apply: %u of %u PGs would move, %llu at a time; dry run: nothing "
               "changed ('tessera rebalance plan %s' shows the bytes)\n",
               changing, cur->pg_count, (unsigned long long)maxc, x->argv[0]);
        goto out;
    }
    rc = cli_map_push(x, next, &epoch);
    if (rc)
        goto out;
    if (!x->json)
        printf("rebalance: map epoch %llu: %u of %u PGs to move (%llu at a time%s); the old "
               "replicas serve them until each is complete\n",
               (unsigned long long)epoch, changing, cur->pg_count, (unsigned long long)maxc,
               x->rate ? ", paced" : "");
    ts_map_free(cur);
    ts_map_free(f);
    ts_map_free(next);
    free(st);
    return drive_maybe_detached(x);
out:
    ts_map_free(cur);
    ts_map_free(f);
    ts_map_free(next);
    free(st);
    return rc;
}

/* pause / resume: the map's paused flag, pushed. */
static int set_paused_once(struct ctx *x, int paused)
{
    struct ts_map *m = NULL;
    uint64_t epoch = 0;
    int rc = newest(x, &m);

    if (rc)
        return rc;
    if (!m->move) {
        snprintf(x->local, sizeof(x->local), "no rebalance is in progress (map epoch %llu)",
                 (unsigned long long)m->epoch);
        ts_map_free(m);
        return TS_EINVAL;
    }
    if (m->move->paused != paused || !paused) {
        int was = m->move->paused;
        m->move->paused = paused;
        if (!paused)
            m->move->driver = driver_token(x); /* resume: this process (or the monitor) drives */
        if (!paused && x->max_concurrent)
            m->move->concurrent = (uint32_t)x->max_concurrent; /* kept for the next resume */
        rc = cli_map_push(x, m, &epoch);
        if (!rc && !x->json)
            printf("rebalance: %s (map epoch %llu)\n",
                   paused ? "paused"
                   : was  ? "resumed"
                          : "taken over",
                   (unsigned long long)epoch);
    }
    ts_map_free(m);
    return rc;
}

/* A change that lost a race for its epoch (TS_ESTALE: another change got there first on some
 * node) is made again over the newest map, a few times. */
static int set_paused(struct ctx *x, int paused)
{
    int rc = TS_ESTALE;

    for (int t = 0; t < 5 && rc == TS_ESTALE; t++) {
        if (t)
            usleep(200000);
        rc = set_paused_once(x, paused);
    }
    return rc;
}

int cmd_rebalance_pause(struct ctx *x)
{
    return set_paused(x, 1);
}

int cmd_rebalance_resume(struct ctx *x)
{
    int rc = set_paused(x, 0);

    return rc ? rc : drive_maybe_detached(x);
}

int cmd_rebalance_status(struct ctx *x)
{
    struct ts_map *m = NULL;
    struct progress p;
    struct rb b;
    int rc = rb_init(&b, x);

    if (!rc)
        rc = newest(x, &m);
    if (!rc) {
        progress_of(&b, m, &p);
        if (!m->move && !x->json)
            printf("no rebalance in progress (map epoch %llu)\n", (unsigned long long)m->epoch);
        if (m->move && m->move->from_placement != ts_map_placement_pgs(m) &&
            m->move->from_placement && !x->json)
            printf("a split's: PGs placed %u apart move to %u placements\n",
                   m->move->from_placement, ts_map_placement_pgs(m));
        else
            progress_print(&b, m, &p, 0, 0);
        if (m->move && !x->json)
            for (uint32_t pg = 0; pg < m->pg_count; pg++)
                if (m->move->pg[pg] == TS_PG_MOVING)
                    printf("  PG %u moving\n", pg);
    }
    ts_map_free(m);
    rb_fini(&b);
    return rc;
}

/* back's rebalance starts from m's target placement count (where it differs from back's). */
static int placement_from(struct ts_map *back, const struct ts_map *m)
{
    uint32_t now = ts_map_placement_pgs(m);

    return now == ts_map_placement_pgs(back) ? 0 : ts_map_move_set_from_placement(back, now);
}

static int rollback_once(struct ctx *x)
{
    struct ts_map *m = NULL, *back = NULL;
    struct ts_map_node *nodes = NULL;
    unsigned width, again = 0;
    uint8_t *st = NULL;
    uint64_t epoch = 0;
    size_t n = 0;
    int rc = newest(x, &m);

    if (rc)
        return rc;
    if (!m->move) {
        snprintf(x->local, sizeof(x->local), "no rebalance is in progress (map epoch %llu)",
                 (unsigned long long)m->epoch);
        rc = TS_EINVAL;
        goto out;
    }
    rc = widest(x, &width);
    if (rc)
        goto out;
    /* The target is the table before; nodes the rebalance added stay, out (no placement). */
    nodes = calloc(m->n + m->move->nfrom, sizeof(*nodes));
    st = calloc(m->pg_count, 1);
    back = ts_map_dup(m);
    if (!nodes || !st || !back) {
        rc = TS_ENOMEM;
        goto out;
    }
    memcpy(nodes, m->move->from, m->move->nfrom * sizeof(*nodes));
    n = m->move->nfrom;
    for (size_t i = 0; i < n; i++) {
        int j = ts_map_find(m, nodes[i].id);
        if (j >= 0 && m->nodes[j].state == TS_NODE_DOWN)
            nodes[i].state = TS_NODE_DOWN; /* down now: it stays down */
    }
    for (size_t i = 0; i < m->n; i++) {
        int in_from = 0;
        for (size_t k = 0; k < m->move->nfrom; k++)
            in_from |= !strcmp(m->move->from[k].id, m->nodes[i].id);
        if (!in_from) {
            nodes[n] = m->nodes[i];
            nodes[n++].state = TS_NODE_OUT;
        }
    }
    /* Each PG keeps the placement it has now (ts_map_pg_order of m) until it moves back. */
    {
        struct ts_map *now = ts_map_dup(m);
        int ok = now != NULL;
        if (ok) {
            free(back->nodes);
            back->nodes = nodes;
            back->n = n;
            nodes = NULL;
            ts_map_move_clear(back);
            /* A split's: the target places every child with its parent again (the PG count
             * stays: the children keep their logs), from the placement of now. */
            if (m->move->from_placement)
                back->placement_pgs = m->move->from_placement;
            /* from = the table now; the PGs already settled under it differ from the target */
            rc = ts_map_move_set(back, m->nodes, m->n, NULL, 0, m->move->rate);
            if (!rc)
                rc = placement_from(back, m);
        }
        for (uint32_t pg = 0; ok && !rc && pg < m->pg_count; pg++) {
            int a[MAX_RANK], t[MAX_RANK];
            size_t na = ts_map_pg_order(now, pg, a, width), nt;
            int differs;
            nt = ts_map_pg_target_order(back, pg, t, width);
            differs = na != nt;
            for (size_t i = 0; i < na && !differs; i++)
                differs = strcmp(now->nodes[a[i]].id, back->nodes[t[i]].id) != 0;
            if (!differs)
                continue;
            if (ts_map_pg_move_state(m, pg) != TS_PG_SETTLED) {
                /* Not moved yet: its placement now is the old table's, which is the target;
                 * differs only by a node down now. Nothing to move. */
                continue;
            }
            st[pg] = TS_PG_PENDING;
            again++;
        }
        ts_map_free(now);
        if (!ok)
            rc = TS_ENOMEM;
    }
    if (!rc)
        rc = ts_map_move_set(back, m->nodes, m->n, st, 0, m->move->rate);
    if (!rc)
        rc = placement_from(back, m);
    if (rc)
        goto out;
    back->move->driver = driver_token(x);
    back->move->concurrent = x->max_concurrent ? (uint32_t)x->max_concurrent : m->move->concurrent;
    rc = cli_map_push(x, back, &epoch);
    if (rc)
        goto out;
    if (!x->json)
        printf("rebalance: rolled back (map epoch %llu): %u PG%s already moved go back, the "
               "others never left\n",
               (unsigned long long)epoch, again, again == 1 ? "" : "s");
    ts_map_free(m);
    ts_map_free(back);
    free(st);
    return drive_maybe_detached(x); /* also drops what incoming replicas got meanwhile */
out:
    ts_map_free(m);
    ts_map_free(back);
    free(nodes);
    free(st);
    return rc;
}

int cmd_rebalance_rollback(struct ctx *x)
{
    int rc = TS_ESTALE;

    for (int t = 0; t < 5 && rc == TS_ESTALE; t++) { /* lost a race for the epoch: again */
        if (t)
            usleep(200000);
        rc = rollback_once(x);
    }
    return rc;
}

/* ---- for `rebalance split` (cli_split.c) ------------------------------------------------------
 */

int cli_rebalance_newest(struct ctx *x, struct ts_map **out)
{
    return newest(x, out);
}

int cli_rebalance_widest(struct ctx *x, unsigned *w)
{
    return widest(x, w);
}

int cli_rebalance_pg_changes(const struct ts_map *m, uint32_t pg, unsigned w)
{
    return pg_changes(m, pg, w);
}

uint64_t cli_rebalance_driver_token(const struct ctx *x)
{
    return driver_token(x);
}

int cli_rebalance_drive_started(struct ctx *x)
{
    return drive_maybe_detached(x);
}

int cli_rebalance_clean(struct ctx *x, const struct ts_map *m, unsigned w, char *why, size_t cap)
{
    struct node_view *views = calloc(m->n, sizeof(*views));
    int clean = views != NULL;

    for (size_t i = 0; clean && i < m->n; i++)
        view_read(x, i, &views[i]);
    for (uint32_t pg = 0; clean && pg < m->pg_count; pg++) {
        int order[MAX_RANK];
        size_t n = ts_map_pg_order(m, pg, order, w);
        const struct node_view *pv = n ? &views[order[0]] : NULL;
        if (!pv || !pv->ok || pv->epoch != m->epoch)
            snprintf(why, cap, "PG %u: its primary %s %s", pg, n ? m->nodes[order[0]].id : "-",
                     !pv || !pv->ok ? "does not answer" : "runs another map epoch");
        else if (view_peering(pv, pg))
            snprintf(why, cap, "PG %u: its primary %s is peering it", pg, m->nodes[order[0]].id);
        else if (view_lists(pv, pg, NULL))
            snprintf(why, cap, "PG %u: its primary %s lists a replica as behind or recovering", pg,
                     m->nodes[order[0]].id);
        else
            continue;
        clean = 0;
    }
    for (size_t i = 0; views && i < m->n; i++)
        json_object_put(views[i].doc);
    free(views);
    return clean;
}
