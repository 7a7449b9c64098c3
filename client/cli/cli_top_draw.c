/*
 * `tessera top`'s frame (cli_top.h): header, nodes, hottest datasets, PGs and shards, replica
 * lag, job stalls and anomalies, drawn from one poll's view. Pure: writes to the FILE it is
 * given, reads no clock and no terminal.
 */
#include "cli_top.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)
#define LIST_MAX 10 /* entries of a list when the screen has no height */
#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))
#define MAX_SZ(a, b) ((a) > (b) ? (a) : (b))

/* The screen being written: lines cut at cols, none past rows. */
struct scr {
    FILE *f;
    int cols, rows, used, ansi;
};

__attribute__((format(printf, 2, 3))) static void line(struct scr *s, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;

    if (s->rows && s->used >= s->rows)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (s->cols > 0 && s->cols < (int)sizeof(buf))
        buf[s->cols] = '\0';
    if (s->ansi && s->used)
        fputc('\n', s->f); /* no newline after the last: the screen would scroll */
    fputs(buf, s->f);
    if (s->ansi)
        fputs("\033[K", s->f);
    else
        fputc('\n', s->f);
    s->used++;
}

static const char *rate(double bps, char *b, size_t cap)
{
    if (bps < 0)
        snprintf(b, cap, "-");
    else
        snprintf(b, cap, "%.1f", bps / MIB);
    return b;
}

static int answered(const struct cli_node_obs *o)
{
    return o->status && json_object_is_type(o->status, json_type_object);
}

/* ---- merged lists of the nodes' "hot" objects ---------------------------------------------- */

struct hot_row {
    char key[96];
    double bps, reads, bytes, rps;
};

struct hot_list {
    struct hot_row *r;
    size_t n, cap;
    int present; /* some node had this list */
};

static struct hot_row *hot_find(struct hot_list *l, const char *key)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->r[i].key, key))
            return &l->r[i];
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 32;
        struct hot_row *nr = realloc(l->r, nc * sizeof(*nr));
        if (!nr)
            return NULL;
        l->r = nr;
        l->cap = nc;
    }
    memset(&l->r[l->n], 0, sizeof(l->r[0]));
    snprintf(l->r[l->n].key, sizeof(l->r[0].key), "%s", key);
    return &l->r[l->n++];
}

static int hot_cmp(const void *a, const void *b)
{
    const struct hot_row *x = a, *y = b;
    return x->bps < y->bps ? 1 : x->bps > y->bps ? -1 : strcmp(x->key, y->key);
}

/* which: 0 datasets, 1 PGs, 2 shards. */
static void hot_merge(const struct cli_top_view *v, int which, struct hot_list *l, double *window)
{
    static const char *const path[] = {"hot.datasets", "hot.pgs", "hot.shards"};

    for (size_t i = 0; i < v->n; i++) {
        struct json_object *arr = cli_json_get(v->nodes[i].status, path[which]);
        if (!arr || !json_object_is_type(arr, json_type_array))
            continue;
        l->present = 1;
        if (window && *window <= 0)
            *window = cli_json_num(v->nodes[i].status, "hot.window_s", 0);
        for (size_t j = 0; j < json_object_array_length(arr); j++) {
            struct json_object *e = json_object_array_get_idx(arr, j), *s;
            struct hot_row *r;
            char key[96];
            if (which == 0)
                snprintf(key, sizeof(key), "%s",
                         (s = cli_json_get(e, "name")) ? json_object_get_string(s) : "?");
            else if (which == 1)
                snprintf(key, sizeof(key), "%.0f", cli_json_num(e, "pg", -1));
            else
                snprintf(key, sizeof(key), "%s/%.0f",
                         (s = cli_json_get(e, "dataset")) ? json_object_get_string(s) : "?",
                         cli_json_num(e, "shard", -1));
            if (!(r = hot_find(l, key)))
                continue;
            r->bps += cli_json_num(e, "bytes_per_s", 0);
            r->reads += cli_json_num(e, "reads", 0);
            r->bytes += cli_json_num(e, "read_bytes", 0);
            r->rps += cli_json_num(e, "reads_per_s", 0);
        }
    }
    if (l->n)
        qsort(l->r, l->n, sizeof(*l->r), hot_cmp);
}

/* ---- replica lag, over every node's "replication.lag" --------------------------------------- */

struct lag_row {
    const char *primary;
    struct json_object *e;
    double s, ops;
};

static int lag_cmp(const void *a, const void *b)
{
    const struct lag_row *x = a, *y = b;
    if (x->s != y->s)
        return x->s < y->s ? 1 : -1;
    return x->ops < y->ops ? 1 : x->ops > y->ops ? -1 : 0;
}

static size_t lag_rows(const struct cli_top_view *v, struct lag_row **out)
{
    size_t n = 0, cap = 0;
    struct lag_row *r = NULL;

    for (size_t i = 0; i < v->n; i++) {
        struct json_object *arr = cli_json_get(v->nodes[i].status, "replication.lag");
        if (!arr || !json_object_is_type(arr, json_type_array))
            continue;
        for (size_t j = 0; j < json_object_array_length(arr); j++) {
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 32;
                struct lag_row *nr = realloc(r, nc * sizeof(*nr));
                if (!nr)
                    break;
                r = nr;
                cap = nc;
            }
            r[n].primary = v->nodes[i].id;
            r[n].e = json_object_array_get_idx(arr, j);
            r[n].s = cli_json_num(r[n].e, "lag_s", 0);
            r[n].ops = cli_json_num(r[n].e, "lag_ops", 0);
            n++;
        }
    }
    if (n)
        qsort(r, n, sizeof(*r), lag_cmp);
    *out = r;
    return n;
}

/* ---- the frame ------------------------------------------------------------------------------ */

static void header(struct scr *s, const struct cli_top_view *v)
{
    double rd = 0, wr = 0, rq = 0, conns = 0;
    size_t up = 0;
    uint64_t epoch = v->map_epoch;
    char b[3][16];

    for (size_t i = 0; i < v->n; i++) {
        const struct cli_node_obs *o = &v->nodes[i];
        if (!answered(o))
            continue;
        up++;
        rd += o->read_bps > 0 ? o->read_bps : 0;
        wr += o->write_bps > 0 ? o->write_bps : 0;
        rq += o->req_ps > 0 ? o->req_ps : 0;
        conns += cli_json_num(o->status, "connections", 0);
        if ((uint64_t)cli_json_num(o->status, "cluster.epoch", 0) > epoch)
            epoch = (uint64_t)cli_json_num(o->status, "cluster.epoch", 0);
    }
    line(s, "tessera top - %s - %s - every %.1f s - q quits", v->server ? v->server : "",
         v->clock ? v->clock : "", v->interval_s);
    if (v->map_epoch || epoch)
        line(s,
             "cluster epoch %llu, %u PGs: nodes %zu up, %zu down of %zu; read %s MiB/s, "
             "write %s MiB/s, %s req/s, %.0f conns",
             (unsigned long long)epoch, v->pg_count, up, v->n - up, v->n,
             rate(v->rates ? rd : -1, b[0], sizeof(b[0])), rate(v->rates ? wr : -1, b[1], 16),
             v->rates ? (snprintf(b[2], 16, "%.0f", rq), b[2]) : "-", conns);
    else
        line(s, "single node %s; read %s MiB/s, write %s MiB/s, %s req/s, %.0f conns",
             up ? "up" : "DOWN", rate(v->rates ? rd : -1, b[0], sizeof(b[0])),
             rate(v->rates ? wr : -1, b[1], 16),
             v->rates ? (snprintf(b[2], 16, "%.0f", rq), b[2]) : "-", conns);
}

static void nodes_table(struct scr *s, const struct cli_top_view *v)
{
    line(s, "%-10s %-6s %5s %8s %8s %8s %6s %5s %9s  %s", "NODE", "STATE", "CONNS", "RD MiB/s",
         "WR MiB/s", "REQ/s", "FREE%", "HIT%", "PGS A/P", "WORST LAG");
    for (size_t i = 0; i < v->n; i++) {
        const struct cli_node_obs *o = &v->nodes[i];
        char rd[16], wr[16], rq[16], fr[16], hit[16], pgs[24], lag[48];
        struct json_object *per;
        double total, worst = -1, wops = 0;
        const char *wnode = "";

        if (!answered(o)) {
            line(s, "%-10s %-6s %5s %8s %8s %8s %6s %5s %9s  %s", o->id, "DOWN", "-", "-", "-", "-",
                 "-", "-", "-", o->error ? o->error : "not answering");
            continue;
        }
        total = cli_json_num(o->status, "disk.total_bytes", 0);
        snprintf(fr, sizeof(fr), total > 0 ? "%.0f%%" : "-",
                 100.0 * cli_json_num(o->status, "disk.free_bytes", 0) / (total > 0 ? total : 1));
        if (v->hit_pct && v->hit_pct[i] >= 0)
            snprintf(hit, sizeof(hit), "%.0f%%", v->hit_pct[i]);
        else
            snprintf(hit, sizeof(hit), "-");
        if (o->req_ps >= 0)
            snprintf(rq, sizeof(rq), "%.0f", o->req_ps);
        else
            snprintf(rq, sizeof(rq), "-");
        if (cli_json_get(o->status, "replication"))
            snprintf(pgs, sizeof(pgs), "%.0f/%.0f",
                     cli_json_num(o->status, "replication.pgs_active", 0),
                     cli_json_num(o->status, "replication.pgs_peering", 0));
        else
            snprintf(pgs, sizeof(pgs), "-");
        per = cli_json_get(o->status, "replication.replicas");
        if (per && json_object_is_type(per, json_type_object)) {
            json_object_object_foreach(per, rn, r)
            {
                double ls = cli_json_num(r, "max_lag_s", 0), lo = cli_json_num(r, "lag_ops", 0);
                if (ls > worst || (ls == worst && lo > wops)) {
                    worst = ls;
                    wops = lo;
                    wnode = rn;
                }
            }
        }
        if (worst < 0)
            snprintf(lag, sizeof(lag), "-");
        else if (worst == 0 && wops == 0)
            snprintf(lag, sizeof(lag), "0");
        else
            snprintf(lag, sizeof(lag), "%.1fs %.0fops (%s)", worst, wops, wnode);
        line(s, "%-10s %-6s %5.0f %8s %8s %8s %6s %5s %9s  %s", o->id,
             o->map_state ? o->map_state : "up", cli_json_num(o->status, "connections", 0),
             rate(o->read_bps, rd, sizeof(rd)), rate(o->write_bps, wr, sizeof(wr)), rq, fr, hit,
             pgs, lag);
    }
}

/* How many entries each list gets: what it has (at least 1 line for "none"), within the rows
 * left, anomalies served first. */
struct budget {
    size_t ds, pg, lag, stall, an;
};

static void plan(const struct cli_top_view *v, size_t nds, size_t npg, size_t nlag, size_t nstall,
                 struct budget *b)
{
    /* lines under each title: a list's header row and entries, or one line saying "none" */
    size_t want[5] = {v->nan ? v->nan_kept + (v->nan > v->nan_kept) : 1, nds + 1, nlag + 1, npg + 1,
                      nstall ? nstall : 1};
    size_t got[5] = {1, 1, 1, 1, 1};
    long left;

    if (!v->rows) {
        b->an = want[0];
        b->ds = MIN_SZ(want[1], LIST_MAX + 1);
        b->lag = MIN_SZ(want[2], LIST_MAX + 1);
        b->pg = MIN_SZ(want[3], LIST_MAX + 1);
        b->stall = want[4];
        return;
    }
    /* header 2, blank + node header + nodes, 5 sections of blank + title + 1 entry */
    left = (long)v->rows - (long)(2 + 2 + v->n) - 5 * 3;
    for (int more = 1; more && left > 0;) {
        more = 0;
        for (int k = 0; k < 5 && left > 0; k++)
            if (got[k] < want[k]) {
                got[k]++;
                left--;
                more = 1;
            }
    }
    b->an = got[0];
    b->ds = got[1];
    b->lag = got[2];
    b->pg = got[3];
    b->stall = got[4];
}

void cli_top_render(const struct cli_top_view *v, FILE *out)
{
    struct scr s = {out, v->cols, v->rows, 0, v->ansi};
    struct hot_list ds = {0}, pg = {0}, sh = {0};
    struct lag_row *lag = NULL;
    struct budget b;
    double window = 0;
    size_t nlag, npg;

    hot_merge(v, 0, &ds, &window);
    hot_merge(v, 1, &pg, NULL);
    hot_merge(v, 2, &sh, NULL);
    nlag = lag_rows(v, &lag);
    npg = MAX_SZ(pg.n, sh.n);
    plan(v, ds.n, npg, nlag, v->nstalls, &b);

    header(&s, v);
    line(&s, "%s", "");
    nodes_table(&s, v);

    line(&s, "%s", "");
    if (window > 0)
        line(&s, "HOTTEST DATASETS (last %.0f s)", window);
    else
        line(&s, "HOTTEST DATASETS");
    if (!ds.present)
        line(&s, "  -  (the nodes' STATUS has no \"hot\" object: no per-dataset read rates)");
    else if (!ds.n)
        line(&s, "  none read");
    else
        line(&s, "  %-24s %9s %10s %12s", "DATASET", "MiB/s", "READS", "READ MiB");
    for (size_t i = 0; i < ds.n && i + 1 < b.ds; i++)
        line(&s, "  %-24s %9.1f %10.0f %12.1f", ds.r[i].key, ds.r[i].bps / MIB, ds.r[i].reads,
             ds.r[i].bytes / MIB);

    line(&s, "%s", "");
    line(&s, "%-38s %s", "HOTTEST PGS", "HOTTEST SHARDS");
    if (!pg.present && !sh.present)
        line(&s, "  -  (no \"hot\" object in STATUS)");
    else if (!npg)
        line(&s, "  none read");
    else
        line(&s, "  %-8s %9s %9s         %-20s %9s", "PG", "MiB/s", "reads/s", "DATASET/SHARD",
             "MiB/s");
    for (size_t i = 0; i < npg && i + 1 < b.pg; i++) {
        char l[160] = "", r[160] = ""; /* keys are cut to their column */
        if (i < pg.n)
            snprintf(l, sizeof(l), "%-8.8s %9.1f %9.0f", pg.r[i].key, pg.r[i].bps / MIB,
                     pg.r[i].rps);
        if (i < sh.n)
            snprintf(r, sizeof(r), "%-20.40s %9.1f", sh.r[i].key, sh.r[i].bps / MIB);
        line(&s, "  %-36s %s", l, r);
    }

    line(&s, "%s", "");
    line(&s, "REPLICA LAG");
    if (!nlag)
        line(&s, "  no replica lags");
    else
        line(&s, "  %-5s %-10s %-10s %-6s %9s %10s %8s %s", "PG", "PRIMARY", "REPLICA", "ROLE",
             "LAG OPS", "LAG MiB", "LAG s", "");
    for (size_t i = 0; i < nlag && i + 1 < b.lag; i++) {
        struct json_object *e = lag[i].e, *nd = cli_json_get(e, "node"),
                           *role = cli_json_get(e, "role");
        line(&s, "  %-5.0f %-10s %-10s %-6s %9.0f %10.1f %8.1f %s", cli_json_num(e, "pg", -1),
             lag[i].primary, nd ? json_object_get_string(nd) : "?",
             role ? json_object_get_string(role) : "?", lag[i].ops,
             cli_json_num(e, "lag_bytes", 0) / MIB, lag[i].s,
             cli_json_num(e, "recovering", 0) ? "recovering" : "");
    }

    line(&s, "%s", "");
    if (!v->prom_url) {
        line(&s, "JOB STALLS");
        line(&s, "  -  (nodes do not see them: add --prometheus http://HOST:9090 to show each "
                 "rank's data stall)");
    } else {
        line(&s, "JOB STALLS (%s)", v->prom_url);
        if (v->prom_error)
            line(&s, "  cannot ask Prometheus: %s", v->prom_error);
        else if (!v->nstalls)
            line(&s, "  no rank reports tessera_job_data_stall_seconds_total");
        for (size_t i = 0; !v->prom_error && i < v->nstalls && i < b.stall; i++)
            line(&s, "  rank %-10s stalled %5.1f %% of the time (%.3f s/s)", v->stalls[i].rank,
                 100.0 * v->stalls[i].stall_per_s, v->stalls[i].stall_per_s);
    }

    line(&s, "%s", "");
    line(&s, "ANOMALIES (%zu)", v->nan);
    if (!v->nan)
        line(&s, "  no anomalies");
    for (size_t i = 0; i < v->nan && i < b.an; i++) {
        if (i >= v->nan_kept || (i + 1 == b.an && v->nan > b.an)) {
            line(&s, "  ... and %zu more (tessera status lists them all)", v->nan - i);
            break;
        }
        line(&s, "  ! %s", v->an[i].text);
    }
    free(lag);
    free(ds.r);
    free(pg.r);
    free(sh.r);
}
