/*
 * The node's metrics in the Prometheus text exposition format (version 0.0.4), rendered on the
 * metrics thread when /metrics is fetched: the workers' counters summed, the hotness window,
 * replication, integrity and the node's disk, cache and engine. docs/operations.md
 * "Monitoring" lists every series.
 */
#include "metrics_internal.h"
#include "prefetch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOT_K 10
#define MAX_ZERO_DATASETS 4096 /* datasets shown at 0 before their first read */

static void help(struct evbuffer *o, const char *name, const char *type, const char *text)
{
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

/* A label value, escaped as the format asks (backslash, double quote, newline). */
static void esc(struct evbuffer *o, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            evbuffer_add_printf(o, "\\%c", *v);
        else if (*v == '\n')
            evbuffer_add(o, "\\n", 2);
        else
            evbuffer_add(o, v, 1);
    }
}

static void one(struct evbuffer *o, const char *name, const char *type, const char *text, double v)
{
    help(o, name, type, text);
    evbuffer_add_printf(o, "%s %.17g\n", name, v);
}

/* ---- the workers' counters -------------------------------------------------------------- */

static void sum_workers(struct tsd_server *s, struct tsd_wmetrics *sum)
{
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_wmetrics *m = s->workers[i].m;
#define SUMA(f)                                                                                    \
    for (size_t k = 0; k < sizeof(m->f) / sizeof(uint64_t); k++)                                   \
    ((uint64_t *)&sum->f)[k] +=                                                                    \
        atomic_load_explicit(&((_Atomic uint64_t *)&m->f)[k], memory_order_relaxed)
        if (!m)
            continue;
        SUMA(req);
        SUMA(rx);
        SUMA(tx);
        SUMA(err);
        SUMA(lat);
        SUMA(lat_sum_ns);
        SUMA(conns);
        sum->ring_dropped += atomic_load(&m->ring_dropped);
#undef SUMA
    }
}

static void render_requests(struct evbuffer *o, const struct tsd_wmetrics *m)
{
    help(o, "tessera_requests_total", "counter",
         "Requests answered, by operation, transport and result.");
    for (unsigned op = 0; op < TS_OP_MAX; op++)
        for (int tr = 0; tr < TSD_TR_N; tr++)
            for (int r = 0; r < 2; r++) {
                uint64_t v = atomic_load(&m->req[op][tr][r]);
                if (!ts_op_desc(op) || (!v && (r || tr == TSD_TR_RDMA)))
                    continue;
                evbuffer_add_printf(
                    o, "tessera_requests_total{op=\"%s\",transport=\"%s\",result=\"%s\"} %llu\n",
                    ts_op_desc(op)->name, tsd_transport_names[tr], r ? "error" : "ok",
                    (unsigned long long)v);
            }
    help(o, "tessera_request_errors_total", "counter", "Error replies, by error code.");
    for (int e = 0; e < TSD_NERR; e++) {
        uint64_t v = atomic_load(&m->err[e]);
        const char *nm = e ? ts_errname(-e) : "other";
        if (!v)
            continue;
        evbuffer_add_printf(o, "tessera_request_errors_total{code=\"%s\"} %llu\n",
                            strncmp(nm, "TS_", 3) == 0 ? nm + 3 : nm, (unsigned long long)v);
    }
    for (int dir = 0; dir < 2; dir++) {
        const char *name = dir ? "tessera_sent_bytes_total" : "tessera_received_bytes_total";
        help(o, name, "counter",
             dir ? "Bytes of replies sent (frames and data), by operation and transport."
                 : "Bytes of requests received (frames and payloads), by operation and "
                   "transport.");
        for (unsigned op = 0; op < TS_OP_MAX; op++)
            for (int tr = 0; tr < TSD_TR_N; tr++) {
                uint64_t v = atomic_load(dir ? &m->tx[op][tr] : &m->rx[op][tr]);
                if (!v || !ts_op_desc(op))
                    continue;
                evbuffer_add_printf(o, "%s{op=\"%s\",transport=\"%s\"} %llu\n", name,
                                    ts_op_desc(op)->name, tsd_transport_names[tr],
                                    (unsigned long long)v);
            }
    }
    help(o, "tessera_request_duration_seconds", "histogram",
         "Time from a request's arrival to its reply (reads: to the last byte queued; writes "
         "and seals: acknowledged, replicas included; replicate: a replica's apply).");
    for (int k = 0; k < TSD_LAT_N; k++)
        for (int tr = 0; tr < TSD_TR_N; tr++) {
            uint64_t cum = 0;
            if (tr == TSD_TR_RDMA && !atomic_load(&m->lat[k][tr][TSD_LAT_BUCKETS]) &&
                !atomic_load(&m->lat_sum_ns[k][tr]))
                continue;
            for (int b = 0; b <= TSD_LAT_BUCKETS; b++) {
                cum += atomic_load(&m->lat[k][tr][b]);
                if (b < TSD_LAT_BUCKETS)
                    evbuffer_add_printf(o,
                                        "tessera_request_duration_seconds_bucket{kind=\"%s\","
                                        "transport=\"%s\",le=\"%g\"} %llu\n",
                                        tsd_lat_kind_names[k], tsd_transport_names[tr],
                                        tsd_lat_bounds_s[b], (unsigned long long)cum);
                else
                    evbuffer_add_printf(o,
                                        "tessera_request_duration_seconds_bucket{kind=\"%s\","
                                        "transport=\"%s\",le=\"+Inf\"} %llu\n",
                                        tsd_lat_kind_names[k], tsd_transport_names[tr],
                                        (unsigned long long)cum);
            }
            evbuffer_add_printf(
                o, "tessera_request_duration_seconds_sum{kind=\"%s\",transport=\"%s\"} %.9f\n",
                tsd_lat_kind_names[k], tsd_transport_names[tr],
                (double)atomic_load(&m->lat_sum_ns[k][tr]) / 1e9);
            evbuffer_add_printf(
                o, "tessera_request_duration_seconds_count{kind=\"%s\",transport=\"%s\"} %llu\n",
                tsd_lat_kind_names[k], tsd_transport_names[tr], (unsigned long long)cum);
        }
    help(o, "tessera_connections", "gauge", "Open connections, by role and transport.");
    for (int r = 0; r < TSD_NROLES; r++)
        for (int tr = 0; tr < TSD_TR_N; tr++) {
            int64_t v = atomic_load(&m->conns[r][tr]);
            if (v <= 0 && tr == TSD_TR_RDMA)
                continue;
            evbuffer_add_printf(o, "tessera_connections{role=\"%s\",transport=\"%s\"} %lld\n",
                                ts_role_name(r), tsd_transport_names[tr],
                                (long long)(v > 0 ? v : 0));
        }
}

/* ---- per name (datasets, peers): the workers' tables merged by name ------------------- */

struct named {
    const char *name;
    uint64_t v[TSD_MV_N];
};

static int named_cmp(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* The datasets this node holds (their series start at 0: a counter that appears only with its
 * first increment hides that increment from rate()). */
struct ds_names {
    char (*name)[TS_NAME_MAX + 1];
    size_t n, cap;
    uint64_t bytes; /* of every dataset held (complete shards) */
};

static int ds_bytes_cb(void *arg, const struct ts_dataset_info *d)
{
    ((struct ds_names *)arg)->bytes += d->bytes;
    return 0;
}

static int ds_name_cb(void *arg, const struct ts_dataset_info *d)
{
    struct ds_names *dn = arg;

    if (dn->n >= MAX_ZERO_DATASETS)
        return 0; /* counted, not listed */
    if (dn->n == dn->cap) {
        size_t cap = dn->cap ? 2 * dn->cap : 64;
        void *p = realloc(dn->name, cap * sizeof(*dn->name));
        if (!p)
            return 1;
        dn->name = p;
        dn->cap = cap;
    }
    memcpy(dn->name[dn->n++], d->name, sizeof(*dn->name));
    return 0;
}

/* Bytes of every dataset held: a scan of every shard record, so done at most once a minute,
 * and while or right after a scrub runs (scrapes all run on the metrics thread: the cache
 * needs no lock). */
#define STORED_EVERY_NS (60ull * 1000000000ull)
static uint64_t stored_bytes(struct tsd_server *s)
{
    static uint64_t at_ns, bytes, scrubs;
    static const struct tsd_server *of;
    uint64_t now = ts_now_mono_ns(), runs = atomic_load(&s->scrub.runs);

    /* Also after each scrub: its checked bytes are compared with these. */
    if (of != s || !at_ns || now - at_ns >= STORED_EVERY_NS || runs != scrubs ||
        atomic_load(&s->scrub.running)) {
        scrubs = runs;
        struct ds_names dn = {0};
        ts_store_dataset_list(s->store, ds_bytes_cb, &dn);
        bytes = dn.bytes;
        at_ns = now;
        of = s;
    }
    return bytes;
}

/* The names of every worker's table t (offset of the table in struct tsd_wmetrics), their
 * values summed, and (when zeros is given) the names in zeros with no counts yet; "_other" last
 * when a table overflowed. malloc'ed. */
static struct named *merge_tables(struct tsd_server *s, size_t off, const struct ds_names *zeros,
                                  size_t *n)
{
    size_t cap = (size_t)s->nworkers * TSD_MTAB_SLOTS + 1 + (zeros ? zeros->n : 0), k = 0;
    struct named *all = calloc(cap, sizeof(*all));
    uint64_t other[TSD_MV_N] = {0};
    int any_other = 0;

    *n = 0;
    if (!all)
        return NULL;
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_mtab *t;
        if (!s->workers[i].m)
            continue;
        t = (struct tsd_mtab *)((char *)s->workers[i].m + off);
        for (int j = 0; j < TSD_MTAB_SLOTS; j++) {
            struct tsd_mslot *sl = &t->slot[j];
            if (atomic_load_explicit(&sl->state, memory_order_acquire) != 2)
                continue;
            all[k].name = sl->name;
            for (int v = 0; v < TSD_MV_N; v++)
                all[k].v[v] = atomic_load(&sl->v[v]);
            k++;
        }
        for (int v = 0; v < TSD_MV_N; v++) {
            other[v] += atomic_load(&t->other[v]);
            any_other |= other[v] != 0;
        }
    }
    for (size_t i = 0; zeros && i < zeros->n; i++)
        all[k++].name = zeros->name[i]; /* values 0: summed into the counted one if any */
    qsort(all, k, sizeof(*all), named_cmp);
    {
        size_t w = 0;
        for (size_t r = 0; r < k; r++) {
            if (w && strcmp(all[w - 1].name, all[r].name) == 0) {
                for (int v = 0; v < TSD_MV_N; v++)
                    all[w - 1].v[v] += all[r].v[v];
                continue;
            }
            all[w++] = all[r];
        }
        k = w;
    }
    if (any_other) {
        all[k].name = "_other";
        memcpy(all[k].v, other, sizeof(other));
        k++;
    }
    *n = k;
    return all;
}

static void render_named(struct tsd_server *s, struct evbuffer *o)
{
    static const struct {
        const char *name, *help;
        int v;
    } ds[] = {
        {"tessera_dataset_reads_total", "Reads (READ, READV) served, by dataset.", TSD_MV_READS},
        {"tessera_dataset_read_bytes_total", "Data bytes read, by dataset.", TSD_MV_READ_BYTES},
        {"tessera_dataset_written_bytes_total",
         "Data bytes written by clients (chunks acknowledged), by dataset.", TSD_MV_WRITTEN_BYTES},
    };
    size_t n;
    struct ds_names zeros = {0};
    struct named *all;

    ts_store_dataset_list_records(s->store, ds_name_cb, &zeros); /* no shard scan */
    all = merge_tables(s, offsetof(struct tsd_wmetrics, datasets), &zeros, &n);

    for (size_t d = 0; d < sizeof(ds) / sizeof(ds[0]); d++) {
        help(o, ds[d].name, "counter", ds[d].help);
        for (size_t i = 0; all && i < n; i++) {
            evbuffer_add_printf(o, "%s{dataset=\"", ds[d].name);
            esc(o, all[i].name);
            evbuffer_add_printf(o, "\"} %llu\n", (unsigned long long)all[i].v[ds[d].v]);
        }
    }
    free(all);
    free(zeros.name);
    one(o, "tessera_stored_bytes", "gauge",
        "Bytes of the datasets this node holds (complete shards; a scrub reads them all), "
        "counted at most once a minute.",
        (double)stored_bytes(s));
    all = merge_tables(s, offsetof(struct tsd_wmetrics, peers), NULL, &n);
    for (int d = 0; d < 2; d++) {
        const char *name =
            d ? "tessera_peer_sent_bytes_total" : "tessera_peer_received_bytes_total";
        help(o, name, "counter",
             d ? "Bytes this node sent on connections node peers opened to it (replies), by "
                 "peer."
               : "Bytes this node received from node peers (replication pushes, peering), by "
                 "peer.");
        for (size_t i = 0; all && i < n; i++) {
            evbuffer_add_printf(o, "%s{peer=\"", name);
            esc(o, all[i].name);
            evbuffer_add_printf(o, "\"} %llu\n",
                                (unsigned long long)all[i].v[d ? TSD_PEER_TX : TSD_PEER_RX]);
        }
    }
    free(all);
}

/* ---- hotness -------------------------------------------------------------------------- */

static void render_hot(struct tsd_server *s, struct evbuffer *o, uint64_t dropped)
{
    struct tsd_hot_pg pgs[HOT_K];
    struct tsd_hot_shard sh[HOT_K];
    size_t npg, nsh;
    uint64_t med;
    double win;

    tsd_metrics_hot_lock(s);
    win = tsd_hot_window_s(tsd_metrics_hot(s), ts_now_mono_ns());
    npg = tsd_hot_top_pgs(tsd_metrics_hot(s), pgs, HOT_K);
    med = tsd_hot_pg_median(tsd_metrics_hot(s));
    nsh = tsd_hot_top_shards(tsd_metrics_hot(s), sh, HOT_K);
    tsd_metrics_hot_unlock(s);
    one(o, "tessera_hot_window_seconds", "gauge",
        "The sliding window the tessera_hot_* rates are taken over.", win);
    if (win <= 0)
        win = 1;
    help(o, "tessera_hot_pg_read_bytes_per_second", "gauge",
         "The hottest PGs this node served reads of: bytes per second over the window.");
    for (size_t i = 0; i < npg; i++)
        evbuffer_add_printf(o, "tessera_hot_pg_read_bytes_per_second{pg=\"%u\"} %.6g\n", pgs[i].pg,
                            (double)pgs[i].bytes / win);
    one(o, "tessera_pg_read_bytes_per_second_median", "gauge",
        "The median read rate of the PGs this node served reads of in the window.",
        (double)med / win);
    help(o, "tessera_hot_shard_read_bytes_per_second", "gauge",
         "The hottest shards read here: bytes per second over the window (Space-Saving "
         "sketch: an upper bound).");
    for (size_t i = 0; i < nsh; i++) {
        evbuffer_add_printf(o, "tessera_hot_shard_read_bytes_per_second{dataset=\"");
        esc(o, sh[i].dataset);
        evbuffer_add_printf(o, "\",shard=\"%u\"} %.6g\n", sh[i].shard, (double)sh[i].bytes / win);
    }
    one(o, "tessera_hot_samples_dropped_total", "counter",
        "Reads left out of the hotness window (its queue was full; totals stay exact).",
        (double)dropped);
}

/* ---- replication, integrity, the node ------------------------------------------------- */

struct lag_row {
    char node[64];
    int core;
    uint64_t ops, bytes;
    double max_s;
};

static void render_repl(struct tsd_server *s, struct evbuffer *o)
{
    struct ts_repl_lag *l = NULL;
    struct ts_repl_pgstat *ps = NULL;
    struct lag_row *rows;
    size_t nl = 0, nr = 0, nps = 0, recovering = 0, backfilling = 0;
    uint64_t bf_done = 0, bf_total = 0;
    unsigned ppgs = 0;
    uint64_t repairs = 0, backfills = 0;
    static const char *const states[] = {"active", "peering", "pulling", "activating", "blocked"};

    one(o, "tessera_map_epoch", "gauge", "The cluster map's epoch on this node (0: one node).",
        (double)atomic_load(&s->epoch));
    if (!s->repl)
        return;
    ts_repl_lag(s->repl, &l, &nl, &ppgs, &repairs, &backfills);
    rows = calloc(nl ? nl : 1, sizeof(*rows));
    for (size_t i = 0; rows && i < nl; i++) {
        size_t r = 0;
        recovering += l[i].recovering != 0;
        backfilling += l[i].backfilling != 0;
        bf_done += l[i].bf_done;
        bf_total += l[i].bf_total;
        while (r < nr && !(rows[r].core == l[i].core && strcmp(rows[r].node, l[i].node) == 0))
            r++;
        if (r == nr) {
            snprintf(rows[nr].node, sizeof(rows[nr].node), "%s", l[i].node);
            rows[nr++].core = l[i].core;
        }
        rows[r].ops += l[i].lag_ops;
        rows[r].bytes += l[i].lag_bytes;
        if (l[i].lag_s > rows[r].max_s)
            rows[r].max_s = l[i].lag_s;
    }
    for (int k = 0; k < 3; k++) {
        static const char *const nm[] = {"tessera_replica_lag_operations",
                                         "tessera_replica_lag_bytes",
                                         "tessera_replica_lag_seconds"};
        static const char *const hp[] = {
            "Log entries a replica has yet to apply, summed over the PGs this node leads.",
            "Bytes a replica has yet to apply, summed over the PGs this node leads.",
            "How far behind a replica is, the largest over the PGs this node leads."};
        help(o, nm[k], "gauge", hp[k]);
        for (size_t r = 0; r < nr; r++) {
            evbuffer_add_printf(o, "%s{replica=\"", nm[k]);
            esc(o, rows[r].node);
            evbuffer_add_printf(o, "\",tier=\"%s\"} %.6g\n", rows[r].core ? "core" : "fringe",
                                k == 0   ? (double)rows[r].ops
                                : k == 1 ? (double)rows[r].bytes
                                         : rows[r].max_s);
        }
    }
    free(rows);
    free(l);
    one(o, "tessera_replicas_recovering", "gauge",
        "Replicas of PGs this node leads that are not yet confirmed to hold the PG's log.",
        (double)recovering);
    one(o, "tessera_replicas_confirmed", "gauge",
        "Replicas of PGs this node leads confirmed to hold the PG's log (they serve reads).",
        (double)(nl - recovering));
    one(o, "tessera_primary_pgs", "gauge", "PGs this node leads.", (double)ppgs);
    one(o, "tessera_backfills_running", "gauge",
        "Backfills of replicas of PGs this node leads running now.", (double)backfilling);
    one(o, "tessera_backfill_shards", "gauge",
        "Shards the running backfills have to send, all of them together.", (double)bf_total);
    one(o, "tessera_backfill_shards_sent", "gauge",
        "Shards the running backfills have sent so far (progress: sent / shards).",
        (double)bf_done);
    ts_repl_pg_states(s->repl, &ps, &nps);
    help(o, "tessera_pgs", "gauge", "PGs this node leads or is peering to lead, by state.");
    for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++) {
        size_t c = 0;
        for (size_t i = 0; i < nps; i++)
            c += strcmp(ps[i].state, states[k]) == 0;
        evbuffer_add_printf(o, "tessera_pgs{state=\"%s\"} %zu\n", states[k], c);
    }
    free(ps);
    one(o, "tessera_pgs_not_confirmed", "gauge",
        "PGs this node holds a replica of that their primary has not confirmed yet.",
        (double)tsd_pgs_not_confirmed(s));
    one(o, "tessera_repairs_total", "counter",
        "Chunks repaired from another replica (a damaged or missing copy).", (double)repairs);
    one(o, "tessera_backfills_total", "counter", "Backfills of replicas this node ran.",
        (double)backfills);
    one(o, "tessera_rollbacks_refused_total", "counter",
        "Replica rollbacks the peering decision refused.",
        (double)ts_repl_rollbacks_refused(s->repl));
}

static void render_integrity(struct tsd_server *s, struct evbuffer *o, const struct tsd_stats *st)
{
    struct tsd_scrub_stats *sc = &s->scrub;

    one(o, "tessera_checksum_failures_total", "counter",
        "Chunks that failed their CRC32C here (read, written, scrubbed, or reported by a client).",
        (double)STAT_GET(st, corrupt_chunks));
    one(o, "tessera_scrubs_total", "counter", "Scrubs completed.", (double)atomic_load(&sc->runs));
    one(o, "tessera_scrub_running", "gauge", "1 while a scrub runs.",
        (double)atomic_load(&sc->running));
    {
        uint64_t chunks, bytes;
        ts_store_scrub_progress(s->store, &chunks, &bytes);
        one(o, "tessera_scrub_checked_bytes_total", "counter",
            "Bytes scrubs read and verified, counted as they go (progress: its rate against "
            "tessera_stored_bytes).",
            (double)bytes);
        one(o, "tessera_scrub_checked_chunks_total", "counter",
            "Chunks scrubs read and verified, counted as they go.", (double)chunks);
    }
    one(o, "tessera_scrub_corrupt_chunks_total", "counter", "Chunks scrubs found damaged.",
        (double)atomic_load(&sc->corrupt));
    one(o, "tessera_scrub_pgs_differing_total", "counter",
        "PGs a scrub found holding fewer shards than their primary (a backfill was asked for).",
        (double)atomic_load(&sc->pg_differing));
    one(o, "tessera_scrub_last_end_timestamp_seconds", "gauge",
        "When the last scrub ended (Unix time; 0: none yet).",
        (double)atomic_load(&sc->last_end_ns) / 1e9);
    one(o, "tessera_scrub_next_timestamp_seconds", "gauge",
        "When the next scheduled scrub is due (Unix time; 0: none scheduled, "
        "storage.scrub_interval_s 0).",
        (double)atomic_load(&sc->next_s));
    {
        size_t all = tsd_ec_wanted_copy(s, NULL, 0), damaged = tsd_ec_wanted_damaged(s);
        one(o, "tessera_ec_repair_wanted_chunks", "gauge",
            "Fragment chunks found damaged here (failing their CRC32C), waiting for the "
            "monitor's repair.",
            (double)damaged);
        one(o, "tessera_ec_repair_wanted_fragments", "gauge",
            "Whole fragments a reader asked this node for and it does not hold, waiting for the "
            "monitor's repair (or its finding that the shard does not exist).",
            (double)(all > damaged ? all - damaged : 0));
    }
    one(o, "tessera_ec_repair_noted_total", "counter",
        "Fragment chunks or fragments found damaged or missing here (noted for repair).",
        (double)atomic_load(&s->ec_wanted.noted));
    one(o, "tessera_ec_repair_done_total", "counter",
        "Of those, repaired here (the monitor's rebuilt bytes taken).",
        (double)atomic_load(&s->ec_wanted.done));
    one(o, "tessera_wal_damage_timestamp_seconds", "gauge",
        "When the store last opened on a damaged write-ahead log (Unix time; 0: never).",
        (double)ts_store_wal_damage_ns(s->store) / 1e9);
    one(o, "tessera_protocol_errors_total", "counter",
        "Malformed frames, oversize lengths and other protocol violations.",
        (double)STAT_GET(st, protocol_errors));
}

void tsd_metrics_render_engine(struct tsd_server *s, struct evbuffer *o)
{
    static const char *const nm[TS_ENGINE_PROPS][2] = {
        {"tessera_rocksdb_estimated_keys", "RocksDB's estimate of its keys, all column families."},
        {"tessera_rocksdb_live_sst_bytes", "Bytes of RocksDB's live SST files."},
        {"tessera_rocksdb_pending_compaction_bytes",
         "Bytes RocksDB estimates its compactions still have to rewrite."},
        {"tessera_rocksdb_running_compactions", "Compactions running now."},
        {"tessera_rocksdb_running_flushes", "Memtable flushes running now."},
    };
    struct ts_store_engine_props p;

    ts_store_engine_props(s->store, &p);
    for (int k = 0; k < TS_ENGINE_PROPS; k++)
        one(o, nm[k][0], "gauge", nm[k][1], (double)p.v[k]);
    one(o, "tessera_rocksdb_block_cache_bytes", "gauge", "Bytes in RocksDB's block cache.",
        (double)p.block_cache_bytes);
    {
        struct ts_commit_stats cm;
        ts_store_commit_stats(s->store, &cm);
        one(o, "tessera_group_commit_seals_total", "counter",
            "Seals made durable by the group commit (sync = seal or always).", (double)cm.seals);
        one(o, "tessera_group_commit_syncs_total", "counter",
            "WAL syncs the group commit did for them: seals per sync is the grouping.",
            (double)cm.syncs);
    }
}

static void render_node(struct tsd_server *s, struct evbuffer *o, const struct tsd_stats *st)
{
    struct ts_store_space sp;
    struct ts_store_cache_stats cs;
    struct ts_store_read_stats rd;
    struct tsd_prefetch_stats pf;

    ts_store_space(s->store, &sp);
    one(o, "tessera_disk_total_bytes", "gauge", "Size of the data directory's filesystem.",
        (double)sp.total);
    one(o, "tessera_disk_free_bytes", "gauge", "Free bytes on the data directory's filesystem.",
        (double)sp.avail);
    one(o, "tessera_disk_used_bytes", "gauge", "Used bytes on the data directory's filesystem.",
        (double)(sp.total > sp.avail ? sp.total - sp.avail : 0));
    one(o, "tessera_disk_reserve_bytes", "gauge",
        "Free space kept: a write beyond it is refused (storage.reserve_mb).", (double)sp.reserve);
    one(o, "tessera_disk_writes_refused", "gauge", "1 while writes are refused for space.",
        (double)sp.full);
    one(o, "tessera_rocksdb_memtable_bytes", "gauge", "Bytes in RocksDB's memtables.",
        (double)sp.memtables);
    tsd_metrics_render_engine(s, o);
    ts_store_read_stats(s->store, &rd);
    one(o, "tessera_store_chunk_reads_total", "counter",
        "Whole chunks read from the store (not the cache) and verified.", (double)rd.chunks);
    one(o, "tessera_store_chunk_read_bytes_total", "counter", "Their bytes.",
        (double)rd.chunk_bytes);
    one(o, "tessera_store_piece_reads_total", "counter",
        "Small reads served by sub-blocks of a chunk file instead of the whole chunk.",
        (double)rd.pieces);
    one(o, "tessera_store_piece_read_bytes_total", "counter", "Their bytes read from disk.",
        (double)rd.piece_bytes);
    tsd_prefetch_stats(s->prefetch, &pf);
    one(o, "tessera_prefetch_hinted_total", "counter", "Chunks named by readers' hints (HINT).",
        (double)pf.hinted);
    one(o, "tessera_prefetch_queued_total", "counter", "Hinted chunks queued to be read ahead.",
        (double)pf.queued);
    one(o, "tessera_prefetch_dropped_total", "counter",
        "Hinted chunks dropped: over the connection's or the node's bound.", (double)pf.dropped);
    one(o, "tessera_prefetch_read_total", "counter", "Hinted chunks read ahead into the cache.",
        (double)pf.read);
    one(o, "tessera_prefetch_read_bytes_total", "counter", "Their bytes.", (double)pf.read_bytes);
    one(o, "tessera_prefetch_skipped_total", "counter",
        "Hinted chunks not read: cached already, gone, or their connection closed.",
        (double)pf.skipped);
    one(o, "tessera_prefetch_failed_total", "counter",
        "Hinted chunks that failed their read (damaged: not cached).", (double)pf.failed);
    one(o, "tessera_prefetch_queued_bytes", "gauge", "Bytes of hinted chunks in the queue.",
        (double)pf.queued_bytes);
    ts_store_cache_stats(s->store, &cs);
    one(o, "tessera_cache_hits_total", "counter", "Chunk cache hits.", (double)cs.hits);
    one(o, "tessera_cache_misses_total", "counter", "Chunk cache misses.", (double)cs.misses);
    one(o, "tessera_cache_evictions_total", "counter", "Chunks evicted from the cache.",
        (double)cs.evictions);
    one(o, "tessera_cache_ghost_hits_total", "counter",
        "Chunks cached again soon after their eviction from the cache's small queue, so "
        "admitted straight to its main queue (S3-FIFO's ghost).",
        (double)cs.ghost_hits);
    one(o, "tessera_cache_arena_reused_total", "counter",
        "Chunks read into a cache arena slot that kept its pages (no page faults).",
        (double)cs.arena_reused);
    one(o, "tessera_cache_arena_punched_total", "counter",
        "Cache arena slots whose pages were given back on release (sent by sendfile, or past "
        "the 64 MiB of free slots kept with their pages).",
        (double)cs.arena_punched);
    one(o, "tessera_cache_bytes", "gauge", "Bytes held by the chunk cache.", (double)cs.bytes);
    one(o, "tessera_cache_budget_bytes", "gauge", "The chunk cache's budget (storage.cache_mb).",
        (double)cs.budget);
    one(o, "tessera_connections_accepted_total", "counter", "Connections accepted.",
        (double)STAT_GET(st, conns_accepted));
    one(o, "tessera_connections_refused_total", "counter",
        "Connections refused (max_connections, draining).", (double)STAT_GET(st, conns_refused));
    one(o, "tessera_input_budget_waits_total", "counter",
        "Frames that waited for room in the input budget.",
        (double)STAT_GET(st, input_budget_waits));
    one(o, "tessera_rdma_placed_bytes_total", "counter",
        "Read bytes written straight into clients' memory by RDMA WRITE.",
        (double)STAT_GET(st, rdma_placed_bytes));
}

int tsd_metrics_render(struct tsd_server *s, struct evbuffer *o)
{
    struct tsd_wmetrics *sum = calloc(1, sizeof(*sum));
    struct tsd_stats st;

    if (!sum)
        return TS_ENOMEM;
    memset(&st, 0, sizeof(st));
    tsd_stats_sum(s, &st);
    sum_workers(s, sum);
    help(o, "tessera_build_info", "gauge", "The tesserad build (value 1).");
    evbuffer_add_printf(o, "tessera_build_info{version=\"%s\",protocol=\"%d\"} 1\n",
                        TESSERA_VERSION, TS_PROTO_VERSION);
    one(o, "tessera_up_seconds", "gauge", "Seconds since the node started.",
        (double)(ts_now_mono_ns() - s->start_ns) / 1e9);
    one(o, "tessera_process_resident_memory_bytes", "gauge", "The daemon's resident memory.",
        (double)tsd_rss_bytes());
    render_requests(o, sum);
    render_named(s, o);
    render_hot(s, o, sum->ring_dropped);
    render_repl(s, o);
    render_integrity(s, o, &st);
    render_node(s, o, &st);
    free(sum);
    return 0;
}
