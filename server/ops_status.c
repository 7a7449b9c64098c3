/* STATUS: the node's health, counters, cache, cluster and replication state as one JSON
 * document (docs/operations.md "Status and health"). */
#include "metrics_internal.h"
#include "ops_internal.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t tsd_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Fragment chunks this node found damaged or missing, for the monitor's repair (ec_wanted.c):
 * "chunk" -1 is the whole fragment. */
static void status_ec_wanted(struct tsd_server *s, json_object *root)
{
    struct tsd_ec_wanted_ent e[TSD_EC_WANTED_MAX];
    size_t n = tsd_ec_wanted_copy(s, e, TSD_EC_WANTED_MAX);
    json_object *arr = json_object_new_array();

    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "fragment", json_object_new_string(e[i].frag));
        json_object_object_add(o, "shard", json_object_new_int64(e[i].shard));
        json_object_object_add(
            o, "chunk", json_object_new_int64(e[i].idx == UINT32_MAX ? -1 : (int64_t)e[i].idx));
        json_object_object_add(o, "at_ns", json_object_new_int64((int64_t)e[i].at_ns));
        json_object_array_add(arr, o);
    }
    json_object_object_add(root, "ec_repair_wanted", arr);
}

#define STATUS_MAX_DATASETS 100
#define STATUS_MAX_LAG 100 /* the reply is a u16-length str; `dataset ls` lists all */

static int status_ds_cb(void *arg, const struct ts_dataset_info *d)
{
    json_object *arr = arg, *o;

    if (json_object_array_length(arr) >= STATUS_MAX_DATASETS)
        return 1;
    o = json_object_new_object();
    json_object_object_add(o, "name", json_object_new_string(d->name));
    json_object_object_add(o, "state", json_object_new_string(d->state ? "sealed" : "open"));
    json_object_object_add(o, "shards", json_object_new_int64(d->shards));
    json_object_object_add(o, "shards_writing", json_object_new_int64(d->shards_writing));
    json_object_object_add(o, "bytes", json_object_new_int64((int64_t)d->bytes));
    json_object_object_add(o, "core", json_object_new_int(d->policy.core));
    json_object_object_add(o, "fringe", json_object_new_int(d->policy.fringe));
    json_object_object_add(o, "chunk_size", json_object_new_int64(d->policy.chunk_size));
    json_object_object_add(o, "record_format",
                           json_object_new_string(ts_record_format_name(d->policy.record_format)));
    json_object_array_add(arr, o);
    return 0;
}

/* The PGs this node leads (or is peering to lead) that are not active, and the counts; the PGs
 * it holds as a replica that it does not serve yet. */
static void status_pgs(struct tsd_server *s, json_object *rep)
{
    struct ts_repl_pgstat *ps = NULL;
    size_t n = 0, active = 0, waiting = 0, unclean = 0;
    json_object *arr = json_object_new_array();

    ts_repl_pg_states(s->repl, &ps, &n);
    for (size_t i = 0; i < n; i++) {
        json_object *o;
        if (ps[i].active) {
            active++;
            continue;
        }
        waiting++;
        if (json_object_array_length(arr) >= STATUS_MAX_LAG)
            continue;
        o = json_object_new_object();
        json_object_object_add(o, "pg", json_object_new_int64(ps[i].pg));
        json_object_object_add(o, "state", json_object_new_string(ps[i].state));
        json_object_object_add(o, "epoch", json_object_new_int64((int64_t)ps[i].epoch));
        json_object_object_add(
            o, "since_s",
            json_object_new_double(ps[i].since_ns && ts_now_wall_ns() > ps[i].since_ns
                                       ? (double)(ts_now_wall_ns() - ps[i].since_ns) / 1e9
                                       : 0));
        json_object_object_add(o, "why", json_object_new_string(ps[i].why));
        json_object_array_add(arr, o);
    }
    free(ps);
    unclean = tsd_pgs_not_confirmed(s);
    json_object_object_add(rep, "pgs_active", json_object_new_int64((int64_t)active));
    json_object_object_add(rep, "pgs_peering", json_object_new_int64((int64_t)waiting));
    json_object_object_add(rep, "peering", arr);
    json_object_object_add(rep, "pgs_not_confirmed", json_object_new_int64((int64_t)unclean));
}

/* The log entries rollbacks removed here since the node started (what a rollback took: an
 * acknowledged one would be a lost write; drills check), the newest STATUS_MAX_ROLLED_BACK. */
#define STATUS_MAX_ROLLED_BACK 128
static void status_rolled_back(struct tsd_server *s, json_object *root)
{
    struct ts_rolled_back rb[STATUS_MAX_ROLLED_BACK];
    json_object *arr = json_object_new_array();
    uint64_t total = 0, sealing = 0;
    size_t n = 0;

    ts_store_rolled_back(s->store, rb, STATUS_MAX_ROLLED_BACK, &n, &sealing, &total);
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "pg", json_object_new_int64(rb[i].pg));
        json_object_object_add(o, "seq", json_object_new_int64((int64_t)rb[i].seq));
        json_object_object_add(o, "epoch", json_object_new_int64((int64_t)rb[i].epoch));
        json_object_object_add(o, "dataset", json_object_new_string(rb[i].dataset));
        json_object_object_add(o, "shard", json_object_new_int64(rb[i].shard));
        json_object_object_add(o, "at_ns", json_object_new_int64((int64_t)rb[i].at_ns));
        json_object_array_add(arr, o);
    }
    json_object_object_add(root, "rolled_back_entries", json_object_new_int64((int64_t)total));
    json_object_object_add(root, "rolled_back_sealing", json_object_new_int64((int64_t)sealing));
    json_object_object_add(root, "rolled_back", arr);
}

/* The hottest datasets, PGs and shards this node served in the metrics window (hotness.h). */
#define STATUS_HOT 10
static void status_hot(struct tsd_server *s, json_object *root)
{
    struct tsd_hot_ds ds[STATUS_HOT];
    struct tsd_hot_pg pg[STATUS_HOT];
    struct tsd_hot_shard sh[STATUS_HOT];
    size_t nds, npg, nsh;
    uint64_t med;
    double win;
    json_object *hot = json_object_new_object(), *a;

    if (!s->metrics) {
        json_object_object_add(root, "hot", hot);
        return;
    }
    tsd_metrics_hot_lock(s);
    win = tsd_hot_window_s(tsd_metrics_hot(s), ts_now_mono_ns());
    nds = tsd_hot_top_datasets(tsd_metrics_hot(s), ds, STATUS_HOT);
    npg = tsd_hot_top_pgs(tsd_metrics_hot(s), pg, STATUS_HOT);
    nsh = tsd_hot_top_shards(tsd_metrics_hot(s), sh, STATUS_HOT);
    med = tsd_hot_pg_median(tsd_metrics_hot(s));
    tsd_metrics_hot_unlock(s);
    json_object_object_add(hot, "window_s", json_object_new_double(win));
    if (win <= 0)
        win = 1;
    a = json_object_new_array();
    for (size_t i = 0; i < nds; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(ds[i].name));
        json_object_object_add(o, "reads", json_object_new_int64((int64_t)ds[i].reads));
        json_object_object_add(o, "read_bytes", json_object_new_int64((int64_t)ds[i].bytes));
        json_object_object_add(o, "bytes_per_s", json_object_new_double((double)ds[i].bytes / win));
        json_object_array_add(a, o);
    }
    json_object_object_add(hot, "datasets", a);
    a = json_object_new_array();
    for (size_t i = 0; i < npg; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "pg", json_object_new_int64(pg[i].pg));
        json_object_object_add(o, "bytes_per_s", json_object_new_double((double)pg[i].bytes / win));
        json_object_object_add(o, "reads_per_s", json_object_new_double((double)pg[i].reads / win));
        json_object_array_add(a, o);
    }
    json_object_object_add(hot, "pgs", a);
    json_object_object_add(hot, "pg_median_bytes_per_s", json_object_new_double((double)med / win));
    a = json_object_new_array();
    for (size_t i = 0; i < nsh; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(sh[i].dataset));
        json_object_object_add(o, "shard", json_object_new_int64(sh[i].shard));
        json_object_object_add(o, "bytes_per_s", json_object_new_double((double)sh[i].bytes / win));
        json_object_array_add(a, o);
    }
    json_object_object_add(hot, "shards", a);
    json_object_object_add(root, "hot", hot);
}

void tsd_op_status(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    struct tsd_stats st;
    json_object *root, *stats, *ops, *ds, *lis;
    struct ts_wr w;

    tsd_stats_sum(s, &st);
    root = json_object_new_object();
    json_object_object_add(root, "node", json_object_new_string(s->cfg->node_id));
    json_object_object_add(root, "version", json_object_new_string(TESSERA_VERSION));
    json_object_object_add(root, "protocol", json_object_new_int(TS_PROTO_VERSION));
    json_object_object_add(root, "pid", json_object_new_int((int)getpid()));
    json_object_object_add(root, "epoch", json_object_new_int64((int64_t)s->epoch));
    json_object_object_add(root, "uptime_s",
                           json_object_new_double((double)(ts_now_mono_ns() - s->start_ns) / 1e9));
    json_object_object_add(root, "data_dir", json_object_new_string(s->cfg->data_dir));
    json_object_object_add(root, "sync", json_object_new_string(s->cfg->sync));
    json_object_object_add(root, "workers", json_object_new_int(s->nworkers));
    json_object_object_add(root, "connections", json_object_new_int(atomic_load(&s->nconns)));
    json_object_object_add(root, "rss_kb",
                           json_object_new_int64((int64_t)(tsd_rss_bytes() / 1024)));
    lis = json_object_new_object();
    json_object_object_add(lis, "tcp", json_object_new_string(s->addr[0]));
    json_object_object_add(lis, "tls", json_object_new_string(s->addr[1]));
    json_object_object_add(lis, "rdma",
                           json_object_new_string(tsd_rdma_addr(s) ? tsd_rdma_addr(s) : ""));
    json_object_object_add(lis, "metrics", json_object_new_string(tsd_metrics_addr(s)));
    json_object_object_add(root, "listen", lis);
    json_object_object_add(root, "rdma_sessions", json_object_new_int((int)tsd_rdma_sessions(s)));
    json_object_object_add(root, "your_role",
                           json_object_new_string(ts_role_name(tsd_conn_role(c->w->srv, c))));
    stats = json_object_new_object();
#define J(f) json_object_object_add(stats, #f, json_object_new_int64((int64_t)STAT_GET(&st, f)))
    J(conns_accepted);
    J(conns_refused);
    J(requests);
    J(errors);
    J(bytes_in);
    J(bytes_out);
    J(chunks_written);
    J(read_bytes);
    J(corrupt_chunks);
    J(protocol_errors);
    J(input_budget_waits);
    J(rdma_placed_bytes);
#undef J
    json_object_object_add(stats, "input_reserved_bytes",
                           json_object_new_int64((int64_t)atomic_load(&s->in_reserved)));
    json_object_object_add(stats, "input_budget_bytes",
                           json_object_new_int64((int64_t)s->in_budget));
    ops = json_object_new_object();
    for (unsigned op = 0; op < TS_OP_MAX; op++)
        if (ts_op_desc(op))
            json_object_object_add(ops, ts_op_desc(op)->name,
                                   json_object_new_int64((int64_t)STAT_GET(&st, by_op[op])));
    json_object_object_add(stats, "by_op", ops);
    {
        struct ts_store_cache_stats cs;
        json_object *cj = json_object_new_object();
        ts_store_cache_stats(s->store, &cs);
        json_object_object_add(cj, "budget", json_object_new_int64((int64_t)cs.budget));
        json_object_object_add(cj, "bytes", json_object_new_int64((int64_t)cs.bytes));
        json_object_object_add(cj, "entries", json_object_new_int64((int64_t)cs.entries));
        json_object_object_add(cj, "hits", json_object_new_int64((int64_t)cs.hits));
        json_object_object_add(cj, "misses", json_object_new_int64((int64_t)cs.misses));
        json_object_object_add(cj, "evictions", json_object_new_int64((int64_t)cs.evictions));
        json_object_object_add(root, "cache", cj);
    }
    {
        struct ts_store_space sp;
        json_object *dj = json_object_new_object();
        ts_store_space(s->store, &sp);
        json_object_object_add(dj, "total_bytes", json_object_new_int64((int64_t)sp.total));
        json_object_object_add(dj, "free_bytes", json_object_new_int64((int64_t)sp.avail));
        json_object_object_add(dj, "reserve_bytes", json_object_new_int64((int64_t)sp.reserve));
        json_object_object_add(dj, "memtable_bytes", json_object_new_int64((int64_t)sp.memtables));
        json_object_object_add(dj, "writes_refused", json_object_new_boolean(sp.full));
        /* A damaged WAL found at open: writes after the damage were lost on this node. */
        json_object_object_add(dj, "wal_damage_found_ns",
                               json_object_new_int64((int64_t)ts_store_wal_damage_ns(s->store)));
        json_object_object_add(root, "disk", dj);
    }
    json_object_object_add(root, "stats", stats);
    status_hot(s, root);
    status_rolled_back(s, root);
    status_ec_wanted(s, root);
    if (atomic_load(&s->epoch)) {
        json_object *cl = json_object_new_object(), *rep = json_object_new_object(), *lag;
        struct ts_repl_lag *l = NULL;
        size_t nl = 0;
        unsigned ppgs = 0;
        uint64_t repairs = 0, backfills = 0;

        json_object_object_add(cl, "epoch", json_object_new_int64((int64_t)atomic_load(&s->epoch)));
        json_object_object_add(cl, "node", json_object_new_string(s->cfg->node_id));
        pthread_rwlock_rdlock(&s->map_lock);
        if (s->map) {
            json_object_object_add(cl, "pg_count", json_object_new_int64(s->map->pg_count));
            json_object_object_add(cl, "nodes", json_object_new_int64((int64_t)s->map->n));
        }
        pthread_rwlock_unlock(&s->map_lock);
        json_object_object_add(root, "cluster", cl);
        ts_repl_lag(s->repl, &l, &nl, &ppgs, &repairs, &backfills);
        /* Per replica node: totals over the PGs this node leads; then the lagging
         * (PG, replica) pairs, at most STATUS_MAX_LAG of them (the reply is bounded). */
        lag = json_object_new_array();
        {
            json_object *per = json_object_new_object();
            for (size_t i = 0; i < nl; i++) {
                json_object *o, *x;
                if (!json_object_object_get_ex(per, l[i].node, &o)) {
                    o = json_object_new_object();
                    json_object_object_add(o, "pgs", json_object_new_int64(0));
                    json_object_object_add(o, "core_pgs", json_object_new_int64(0));
                    json_object_object_add(o, "lag_ops", json_object_new_int64(0));
                    json_object_object_add(o, "lag_bytes", json_object_new_int64(0));
                    json_object_object_add(o, "max_lag_s", json_object_new_double(0));
                    json_object_object_add(o, "recovering_pgs", json_object_new_int64(0));
                    json_object_object_add(per, l[i].node, o);
                }
                json_object_object_get_ex(o, "recovering_pgs", &x);
                json_object_set_int64(x, json_object_get_int64(x) + l[i].recovering);
                json_object_object_get_ex(o, "pgs", &x);
                json_object_set_int64(x, json_object_get_int64(x) + 1);
                json_object_object_get_ex(o, "core_pgs", &x);
                json_object_set_int64(x, json_object_get_int64(x) + l[i].core);
                json_object_object_get_ex(o, "lag_ops", &x);
                json_object_set_int64(x, json_object_get_int64(x) + (int64_t)l[i].lag_ops);
                json_object_object_get_ex(o, "lag_bytes", &x);
                json_object_set_int64(x, json_object_get_int64(x) + (int64_t)l[i].lag_bytes);
                json_object_object_get_ex(o, "max_lag_s", &x);
                if (l[i].lag_s > json_object_get_double(x))
                    json_object_set_double(x, l[i].lag_s);
            }
            json_object_object_add(rep, "replicas", per);
        }
        for (size_t i = 0; i < nl && json_object_array_length(lag) < STATUS_MAX_LAG; i++) {
            json_object *o;
            if (!l[i].lag_ops && !l[i].recovering)
                continue;
            o = json_object_new_object();
            json_object_object_add(o, "pg", json_object_new_int64(l[i].pg));
            json_object_object_add(o, "node", json_object_new_string(l[i].node));
            json_object_object_add(o, "role",
                                   json_object_new_string(l[i].core ? "core" : "fringe"));
            json_object_object_add(o, "applied", json_object_new_int64((int64_t)l[i].applied));
            json_object_object_add(o, "primary_applied",
                                   json_object_new_int64((int64_t)l[i].primary_applied));
            json_object_object_add(o, "lag_ops", json_object_new_int64((int64_t)l[i].lag_ops));
            json_object_object_add(o, "lag_bytes", json_object_new_int64((int64_t)l[i].lag_bytes));
            json_object_object_add(o, "lag_s", json_object_new_double(l[i].lag_s));
            json_object_object_add(o, "recovering", json_object_new_boolean(l[i].recovering));
            json_object_array_add(lag, o);
        }
        free(l);
        json_object_object_add(rep, "primary_pgs", json_object_new_int64(ppgs));
        json_object_object_add(rep, "repairs", json_object_new_int64((int64_t)repairs));
        json_object_object_add(rep, "backfills", json_object_new_int64((int64_t)backfills));
        json_object_object_add(rep, "rollbacks_refused",
                               json_object_new_int64((int64_t)ts_repl_rollbacks_refused(s->repl)));
        json_object_object_add(rep, "lag", lag);
        status_pgs(s, rep);
        json_object_object_add(root, "replication", rep);
    }
    tsd_etcd_map_status(s, root);
    tsd_monitor_status(s, root);
    ds = json_object_new_array();
    json_object_object_add(
        root, "datasets_truncated",
        json_object_new_boolean(ts_store_dataset_list(s->store, status_ds_cb, ds) == 1));
    json_object_object_add(root, "datasets", ds);

    tsd_reply_begin(&w);
    {
        /* The document travels as a u16-length string: shed the long lists if needed. */
        const char *txt = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
        json_object *rep;
        if (strlen(txt) > 60000) {
            json_object_object_add(root, "datasets", json_object_new_array());
            json_object_object_add(root, "datasets_truncated", json_object_new_boolean(1));
            txt = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
        }
        if (strlen(txt) > 60000) {
            json_object_object_add(root, "rolled_back", json_object_new_array());
            txt = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
        }
        if (strlen(txt) > 60000 && json_object_object_get_ex(root, "replication", &rep)) {
            json_object_object_add(rep, "lag", json_object_new_array());
            json_object_object_add(rep, "lag_truncated", json_object_new_boolean(1));
            txt = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
        }
        ts_wr_str(&w, txt);
    }
    json_object_put(root);
    tsd_reply_send(c, h, &w);
}
