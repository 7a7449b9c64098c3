/*
 * Anomalies of a cluster from its nodes' STATUS documents and measured rates (cli_anomaly.h).
 * Pure: every input is an argument, every finding is written into the caller's array.
 */
#include "cli_anomaly.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {
#define X(k, s) s,
    CLI_ANOMALY_KINDS(X)
#undef X
};

const char *cli_anomaly_kind_name(enum cli_anomaly_kind k)
{
    return (unsigned)k < CLI_AN_COUNT ? kind_names[k] : "?";
}

void cli_anomaly_limits_init(struct cli_anomaly_limits *l)
{
    l->lag_s = 5;
    l->lag_ops = 1000;
    l->lag_bytes = 256ull << 20;
    l->peering_s = 2;
    l->disk_free_pct = 10;
    l->hot_pg_factor = 10;
    l->hot_pg_min_bps = 1 << 20;
    l->skew_factor = 2;
    l->skew_min_bps = 1 << 20;
}

struct json_object *cli_json_get(struct json_object *o, const char *path)
{
    char key[64];

    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof(key) || !json_object_is_type(o, json_type_object))
            return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        if (!json_object_object_get_ex(o, key, &o))
            return NULL;
        path += n + (dot ? 1 : 0);
    }
    return o;
}

double cli_json_num(struct json_object *o, const char *path, double def)
{
    struct json_object *v = cli_json_get(o, path);

    if (!v || !(json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double) ||
                json_object_is_type(v, json_type_boolean)))
        return def;
    return json_object_get_double(v);
}

double cli_status_hot_read_bps(struct json_object *status)
{
    struct json_object *ds = cli_json_get(status, "hot.datasets");
    double sum = 0;

    if (!ds || !json_object_is_type(ds, json_type_array))
        return -1;
    for (size_t i = 0; i < json_object_array_length(ds); i++)
        sum += cli_json_num(json_object_array_get_idx(ds, i), "bytes_per_s", 0);
    return sum;
}

/* Appends one finding (counted even past cap). */
struct found {
    struct cli_anomaly *out;
    size_t cap, n;
};

__attribute__((format(printf, 4, 5))) static void add(struct found *f, enum cli_anomaly_kind k,
                                                      const char *node, const char *fmt, ...)
{
    va_list ap;

    if (f->n < f->cap) {
        struct cli_anomaly *a = &f->out[f->n];
        a->kind = k;
        snprintf(a->node, sizeof(a->node), "%s", node ? node : "");
        va_start(ap, fmt);
        vsnprintf(a->text, sizeof(a->text), fmt, ap);
        va_end(ap);
    }
    f->n++;
}

static const char *mib(double bytes, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.1f MiB", bytes / (1 << 20));
    return buf;
}

static int answered(const struct cli_node_obs *o)
{
    return o->status && json_object_is_type(o->status, json_type_object);
}

static void nodes_down(const struct cli_node_obs *nodes, size_t n, struct found *f)
{
    for (size_t i = 0; i < n; i++) {
        const struct cli_node_obs *o = &nodes[i];
        if (o->map_state && !strcmp(o->map_state, "down"))
            add(f, CLI_AN_NODE_DOWN, o->id,
                "%s: down in the map (its PGs are served by the next "
                "replicas until it is marked up)",
                o->id);
    }
    for (size_t i = 0; i < n; i++) {
        const struct cli_node_obs *o = &nodes[i];
        char since[48] = "";
        if (answered(o) || (o->map_state && strcmp(o->map_state, "up")))
            continue;
        if (o->silent_s > 0)
            snprintf(since, sizeof(since), " for %.1f s", o->silent_s);
        add(f, CLI_AN_NODE_SILENT, o->id, "%s: %snot answering%s%s%s", o->id,
            o->map_state ? "up in the map but " : "", since, o->error ? ": " : "",
            o->error ? o->error : "");
    }
}

static void pgs_inactive(const struct cli_node_obs *o, const struct cli_anomaly_limits *l,
                         struct found *f)
{
    struct json_object *arr = cli_json_get(o->status, "replication.peering");

    if (!arr || !json_object_is_type(arr, json_type_array))
        return;
    for (size_t i = 0; i < json_object_array_length(arr); i++) {
        struct json_object *e = json_object_array_get_idx(arr, i), *st = cli_json_get(e, "state"),
                           *why = cli_json_get(e, "why");
        double since = cli_json_num(e, "since_s", 0);
        const char *w = why ? json_object_get_string(why) : "";
        if (since < l->peering_s)
            continue;
        add(f, CLI_AN_PG_INACTIVE, o->id, "PG %.0f: not active on %s (%s) for %.1f s%s%s",
            cli_json_num(e, "pg", -1), o->id, st ? json_object_get_string(st) : "peering", since,
            w && w[0] ? ": " : "", w ? w : "");
    }
}

static void replica_lag(const struct cli_node_obs *o, const struct cli_anomaly_limits *l,
                        struct found *f)
{
    struct json_object *per = cli_json_get(o->status, "replication.replicas");
    char b[32];

    if (!per || !json_object_is_type(per, json_type_object))
        return;
    json_object_object_foreach(per, node, r)
    {
        double s = cli_json_num(r, "max_lag_s", 0), ops = cli_json_num(r, "lag_ops", 0),
               bytes = cli_json_num(r, "lag_bytes", 0), rec = cli_json_num(r, "recovering_pgs", 0);
        if (s <= l->lag_s && ops <= (double)l->lag_ops && bytes <= (double)l->lag_bytes)
            continue;
        char rs[48] = "";
        if (rec > 0)
            snprintf(rs, sizeof(rs), " (recovering %.0f PGs)", rec);
        add(f, CLI_AN_REPLICA_LAG, node, "%s: replica of PGs led by %s lags %.0f ops, %s, %.1f s%s",
            node, o->id, ops, mib(bytes, b, sizeof(b)), s, rs);
    }
}

static void disk_full(const struct cli_node_obs *o, const struct cli_anomaly_limits *l,
                      struct found *f)
{
    double total = cli_json_num(o->status, "disk.total_bytes", 0),
           avail = cli_json_num(o->status, "disk.free_bytes", 0);
    int refused = cli_json_num(o->status, "disk.writes_refused", 0) != 0;
    double pct = total > 0 ? 100.0 * avail / total : 100;

    if (refused)
        add(f, CLI_AN_DISK_FULL, o->id, "%s: disk full, writes refused (%.1f %% free)", o->id, pct);
    else if (pct < l->disk_free_pct)
        add(f, CLI_AN_DISK_FULL, o->id, "%s: disk nearly full: %.1f %% free (below %.0f %%)", o->id,
            pct, l->disk_free_pct);
}

static void corrupt(const struct cli_node_obs *o, struct found *f)
{
    double c = cli_json_num(o->status, "stats.corrupt_chunks", 0);

    if (c > 0)
        add(f, CLI_AN_CORRUPT, o->id,
            "%s: %.0f checksum failures (corrupt chunks read or scrubbed; repaired from other "
            "replicas where one holds it)",
            o->id, c);
}

static void wal_damage(const struct cli_node_obs *o, struct found *f)
{
    if (cli_json_num(o->status, "disk.wal_damage_found_ns", 0) > 0)
        add(f, CLI_AN_WAL_DAMAGE, o->id,
            "%s: a damaged WAL was found at open: writes after the damage were lost on this node",
            o->id);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The PGs of every node's "hot" object (summed by PG over nodes: replicas share the reads). */
static void hot_pgs(const struct cli_node_obs *nodes, size_t n, const struct cli_anomaly_limits *l,
                    struct found *f)
{
    size_t cap = 0, np = 0;
    uint64_t *pg = NULL;
    double *bps = NULL, *sorted = NULL, median;

    for (size_t i = 0; i < n; i++) {
        struct json_object *arr = cli_json_get(nodes[i].status, "hot.pgs");
        if (!arr || !json_object_is_type(arr, json_type_array))
            continue;
        for (size_t j = 0; j < json_object_array_length(arr); j++) {
            struct json_object *e = json_object_array_get_idx(arr, j);
            uint64_t p = (uint64_t)cli_json_num(e, "pg", 0);
            size_t k = 0;
            while (k < np && pg[k] != p)
                k++;
            if (k == np) {
                if (np == cap) {
                    size_t nc = cap ? cap * 2 : 64;
                    uint64_t *npg = realloc(pg, nc * sizeof(*pg));
                    if (!npg)
                        goto out_free;
                    pg = npg;
                    double *nb = realloc(bps, nc * sizeof(*bps));
                    if (!nb)
                        goto out_free;
                    bps = nb;
                    cap = nc;
                }
                pg[np] = p;
                bps[np++] = 0;
            }
            bps[k] += cli_json_num(e, "bytes_per_s", 0);
        }
    }
    if (np < 3)
        goto out_free; /* no median worth the name */
    sorted = malloc(np * sizeof(*sorted));
    if (!sorted)
        goto out_free;
    memcpy(sorted, bps, np * sizeof(*sorted));
    qsort(sorted, np, sizeof(*sorted), cmp_double);
    median = np % 2 ? sorted[np / 2] : (sorted[np / 2 - 1] + sorted[np / 2]) / 2;
    for (size_t k = 0; k < np; k++) {
        if (bps[k] < l->hot_pg_min_bps || bps[k] <= l->hot_pg_factor * median)
            continue;
        if (median > 0)
            add(f, CLI_AN_HOT_PG, "",
                "PG %llu: read at %.1f MiB/s, %.0fx the median PG (%.2f MiB/s)",
                (unsigned long long)pg[k], bps[k] / (1 << 20), bps[k] / median, median / (1 << 20));
        else
            add(f, CLI_AN_HOT_PG, "", "PG %llu: read at %.1f MiB/s while the median PG is idle",
                (unsigned long long)pg[k], bps[k] / (1 << 20));
    }
out_free:
    free(sorted);
    free(bps);
    free(pg);
}

static double node_read_bps(const struct cli_node_obs *o)
{
    if (o->read_bps >= 0)
        return o->read_bps;
    return cli_status_hot_read_bps(o->status);
}

static void read_skew(const struct cli_node_obs *nodes, size_t n,
                      const struct cli_anomaly_limits *l, struct found *f)
{
    double sum = 0, mean;
    size_t k = 0;

    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]) && node_read_bps(&nodes[i]) >= 0) {
            sum += node_read_bps(&nodes[i]);
            k++;
        }
    if (k < 2 || sum < l->skew_min_bps)
        return;
    mean = sum / (double)k;
    for (size_t i = 0; i < n; i++) {
        double r;
        if (!answered(&nodes[i]) || (r = node_read_bps(&nodes[i])) < 0)
            continue;
        if (r > l->skew_factor * mean)
            add(f, CLI_AN_READ_SKEW, nodes[i].id,
                "%s: serves %.1f MiB/s of reads, %.1fx the mean of %zu nodes (%.1f MiB/s)",
                nodes[i].id, r / (1 << 20), r / mean, k, mean / (1 << 20));
    }
}

size_t cli_anomalies(const struct cli_node_obs *nodes, size_t n, const struct cli_anomaly_limits *l,
                     struct cli_anomaly *out, size_t cap)
{
    struct cli_anomaly_limits def;
    struct found f = {out, out ? cap : 0, 0};

    if (!l) {
        cli_anomaly_limits_init(&def);
        l = &def;
    }
    nodes_down(nodes, n, &f);
    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]))
            pgs_inactive(&nodes[i], l, &f);
    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]))
            replica_lag(&nodes[i], l, &f);
    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]))
            disk_full(&nodes[i], l, &f);
    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]))
            corrupt(&nodes[i], &f);
    hot_pgs(nodes, n, l, &f);
    read_skew(nodes, n, l, &f);
    for (size_t i = 0; i < n; i++)
        if (answered(&nodes[i]))
            wal_damage(&nodes[i], &f);
    return f.n;
}
