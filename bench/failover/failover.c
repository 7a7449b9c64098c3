/*
 * bench/failover: how long a cluster on etcd takes to heal itself, over many kills
 * (docs/benchmarks.md "Failover"). A real 3-member etcd and N real nodes (mutual TLS) following
 * it; a writer thread puts 16 KiB shards round-robin over every PG and notes when each was
 * acknowledged (a put gives up after 1 s). Each round kills a random node with -9 (no command
 * typed) and measures: down      kill -> the node marked down in the map (lease TTL + down_after +
 * a monitor round) writable  kill -> the first acknowledged write to a PG the node led (down +
 * peering) up        start again -> marked up (up_after + a monitor round) then waits until every
 * PG is active again before the next round. Prints each round and the p50/p99/max of each measure;
 * every acknowledged shard is read back at the end (0 lost).
 *
 *   bench_failover [KILLS (20)] [NODES (5)]   settings: TTL 2 s, down_after 2.5 s, up_after 1 s
 *   BENCH_FAILOVER_DEFAULTS=1 bench_failover   ... with the shipped settings (5 s, 8 s, 3 s)
 */
#include "etcd_harness.h"
#include "harness.h"

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_test.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PGS 16
#define SLEN (16 << 10)
#define MAX_ACKS 2000000

static struct etcd_cluster E;
static struct tsd_cluster CL;
static atomic_int stop;
static atomic_uint nacked;
static uint32_t acked[MAX_ACKS];
static struct ts_map *pgmap;                  /* for a shard's PG (fixed for the cluster's life) */
static _Atomic uint64_t last_ack_ns[PGS + 1]; /* per PG: the newest acknowledgement */

static void *writer(void *arg)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    int via = *(int *)arg;

    tsd_client_opts(&o, &CL.node[via], "writer");
    o.timeout_ms = 1000; /* a put to a dead primary gives up after 1 s (the figures' resolution) */
    if (tessera_client_open(&c, &o) != 0) {
        fprintf(stderr, "bench_failover: the writer cannot connect\n");
        exit(1);
    }
    for (uint32_t s = 0; !atomic_load(&stop) && s < MAX_ACKS; s++) {
        if (tsd_put_pattern(c, "f", s, SLEN, s) == 0) {
            uint32_t pg = ts_map_pg_of(pgmap, "f", s);
            atomic_store(&last_ack_ns[pg < PGS ? pg : PGS], ts_now_mono_ns());
            acked[atomic_fetch_add(&nacked, 1)] = s;
        }
    }
    tessera_client_close(c);
    return NULL;
}

static int state_at(int at, int j)
{
    struct ts_map *m = raw_map_get(CL.node[at].addr);
    int st = m && (size_t)j < m->n ? m->nodes[j].state : -1;

    ts_map_free(m);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    printf("%-9s p50 %7.0f ms   p99 %7.0f ms   max %7.0f ms   (%d kills)\n", what, v[n / 2],
           v[(n * 99 + 99) / 100 - 1], v[n - 1], n);
}

/* Every PG active on its primary and no replica behind, on every node: up to 60 s. */
static int settled(void)
{
    for (int t = 0; t < 600; t++) {
        int ok = 1;
        for (int i = 0; i < CL.n && ok; i++)
            ok = raw_status_has(CL.node[i].addr, "\"pgs_peering\":0") &&
                 raw_status_has(CL.node[i].addr, "\"lag\":[]");
        if (ok)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

int main(int argc, char **argv)
{
    int kills = argc > 1 ? atoi(argv[1]) : 20, nodes = argc > 2 ? atoi(argv[2]) : 5, via = 0;
    int defaults = getenv("BENCH_FAILOVER_DEFAULTS") != NULL;
    double *down = calloc((size_t)kills, sizeof(double)),
           *wr = calloc((size_t)kills, sizeof(double));
    double *up = calloc((size_t)kills, sizeof(double));
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    /* Flap damping off: the bench kills the same nodes again and again on purpose. */
    const char *tuned[] = {"--etcd",
                           NULL,
                           "--etcd-prefix",
                           "/tessera/bench",
                           "--etcd-lease-ttl-s",
                           "2",
                           "--monitor-down-after-ms",
                           "2500",
                           "--monitor-up-after-ms",
                           "1000",
                           "--monitor-flap-max",
                           "1000",
                           NULL};
    const char *shipped[] = {
        "--etcd", NULL, "--etcd-prefix", "/tessera/bench", "--monitor-flap-max", "1000", NULL};
    const char **extra = defaults ? shipped : tuned;
    struct tessera_opts o;
    tessera_client *c = NULL;
    pthread_t wt;
    unsigned lost = 0;
    int rc;

    if (kills < 1 || nodes < 3 || nodes > 8 || !down || !wr || !up)
        return 2;
    if ((rc = etcd_required("bench_failover")) != 0)
        return rc;
    if (etcd_cluster_start(&E, 3, 0) != 0)
        return 1;
    extra[1] = E.endpoints;
    srand((unsigned)getpid());
    if (tsd_cluster_start(&CL, nodes, NULL, PGS, extra) != 0)
        return 1;
    printf("bench_failover: %d nodes, %d PGs, core 3, min_core 2; lease TTL %s, down_after %s, "
           "up_after %s\n",
           nodes, PGS, defaults ? "5 s" : "2 s", defaults ? "8 s" : "2.5 s",
           defaults ? "3 s" : "1 s");
    sleep(2);
    tsd_client_opts(&o, &CL.node[0], "admin");
    if (tessera_client_open(&c, &o) != 0 || tessera_dataset_create(c, "f", &p) != 0)
        return 1;
    tessera_client_close(c);
    pgmap = raw_map_get(CL.node[0].addr);
    if (!pgmap)
        return 1;
    pthread_create(&wt, NULL, writer, &via);
    sleep(2);
    printf("%5s %6s %10s %12s %8s\n", "KILL", "NODE", "DOWN_MS", "WRITABLE_MS", "UP_MS");
    for (int k = 0; k < kills; k++) {
        struct ts_map *m = raw_map_get(CL.node[via].addr);
        int v = 1 + rand() % (nodes - 1), order[1];
        uint8_t led[PGS] = {0};
        uint64_t t0, t_down = 0, t_wr = 0, t_up = 0;

        if (!m)
            return 1;
        for (uint32_t pg = 0; pg < PGS; pg++)
            led[pg] = ts_map_pg_order(m, pg, order, 1) == 1 && order[0] == v;
        ts_map_free(m);
        t0 = ts_now_mono_ns();
        tsd_kill9(&CL.node[v]);
        while (!t_down || !t_wr) {
            uint64_t now = ts_now_mono_ns();
            if (!t_down && state_at(via, v) == TS_NODE_DOWN)
                t_down = now;
            for (uint32_t pg = 0; pg < PGS && !t_wr; pg++)
                if (led[pg] && atomic_load(&last_ack_ns[pg]) > t0)
                    t_wr = atomic_load(&last_ack_ns[pg]);
            if (now - t0 > 60000000000ull) {
                fprintf(stderr, "bench_failover: kill %d: not healed within 60 s\n", k + 1);
                return 1;
            }
            usleep(20 * 1000);
        }
        if (tsd_start(&CL.node[v], NULL) != 0)
            return 1;
        {
            uint64_t t1 = ts_now_mono_ns();
            while (state_at(via, v) != TS_NODE_UP && ts_now_mono_ns() - t1 < 60000000000ull)
                usleep(20 * 1000);
            t_up = ts_now_mono_ns() - t1;
        }
        down[k] = (double)(t_down - t0) / 1e6;
        wr[k] = (double)(t_wr - t0) / 1e6;
        up[k] = (double)t_up / 1e6;
        printf("%5d %6s %10.0f %12.0f %8.0f\n", k + 1, CL.id[v], down[k], wr[k], up[k]);
        fflush(stdout);
        if (settled() != 0) {
            fprintf(stderr, "bench_failover: kill %d: the cluster did not settle in 60 s\n", k + 1);
            return 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(wt, NULL);
    report("down", down, kills);
    report("writable", wr, kills);
    report("up", up, kills);
    {
        static uint8_t want[SLEN], got[SLEN];
        tsd_client_opts(&o, &CL.node[0], "reader");
        if (tessera_client_open(&c, &o) != 0)
            return 1;
        for (unsigned i = 0; i < atomic_load(&nacked); i++) {
            size_t n = 0;
            ts_test_fill(want, SLEN, acked[i], 0);
            if (tessera_read(c, "f", acked[i], 0, SLEN, got, &n) != 0 || n != SLEN ||
                memcmp(got, want, SLEN) != 0)
                lost++;
        }
        tessera_client_close(c);
    }
    printf("acknowledged writes %u, lost %u\n", atomic_load(&nacked), lost);
    ts_map_free(pgmap);
    tsd_cluster_stop(&CL);
    etcd_cluster_stop(&E);
    return lost ? 1 : 0;
}
