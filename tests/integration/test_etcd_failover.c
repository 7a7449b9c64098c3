/*
 * A cluster that heals itself (issue 29): a real 3-member etcd, 3 real nodes following it, each
 * standing for monitor (etcd_monitor.c). A writer puts 16 KiB shards through the cluster and
 * records each acknowledged one; node n1 is killed with -9 and no command is typed: its lease
 * goes, the monitor marks it down, peering moves its PGs, and writes go on. The test prints how
 * long writes stalled and asserts a bound (lease TTL 2 s + down_after 2.5 s + a monitor round +
 * peering, within 20 s); every acknowledged shard is read back byte for byte from each node that
 * is up, alone. n1 is started again: the monitor marks it up by itself, and it serves every
 * acknowledged shard too. Then a second round kills the node the monitor runs on: another node
 * is elected, marks it down and, once back, up; 0 lost again.
 */
#include "etcd_harness.h"
#include "harness.h"

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_test.h"
#include "etcd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PREFIX "/tessera/f"
#define SLEN (16 << 10)
#define MAX_SHARDS 100000

static struct etcd_cluster E;
static struct tsd_cluster CL;
static char acked_path[700], failed_path[700], stop_path[700];

/* The failed writes, and when the last one was (monotonic ms). */
static unsigned failures(unsigned long long *last_ms)
{
    FILE *f = fopen(failed_path, "r");
    unsigned s, n = 0;
    unsigned long long ms;

    *last_ms = 0;
    while (f && fscanf(f, "%u %llu", &s, &ms) == 2) {
        n++;
        *last_ms = ms;
    }
    if (f)
        fclose(f);
    return n;
}

/* The state node i has of node j in its map: TS_NODE_*, or -1. */
static int seen_state(int i, int j)
{
    struct ts_map *m = raw_map_get(CL.node[i].addr);
    int st = m && (size_t)j < m->n ? m->nodes[j].state : -1;

    ts_map_free(m);
    return st;
}

/* Puts shards base, base + 1, ... until stop_path exists; each acknowledged one as "shard ms" in
 * acked_path, each failed one as "shard ms" in failed_path (ms: the monotonic clock's, as the
 * test's). */
static void writer(int via, uint32_t base)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    FILE *f = fopen(acked_path, "a"), *bad = fopen(failed_path, "w");

    tsd_client_opts(&o, &CL.node[via], "writer");
    o.timeout_ms = 2000;
    if (!f || !bad || tessera_client_open(&c, &o) != 0)
        _exit(2);
    for (uint32_t s = base; s < base + MAX_SHARDS && access(stop_path, F_OK) != 0; s++) {
        FILE *to = tsd_put_pattern(c, "f", s, SLEN, s) == 0 ? f : bad;
        fprintf(to, "%u %llu\n", s, (unsigned long long)(ts_now_mono_ns() / 1000000));
        fflush(to);
    }
    tessera_client_close(c);
    fclose(f);
    fclose(bad);
    _exit(0);
}

/* Every acknowledged shard from node i alone, byte for byte (up to 30 s for a node catching
 * up); the number that are missing or differ. *n gets how many were acknowledged, *gap the
 * longest stretch (ms) between two acknowledgements. */
static unsigned verify_on(int i, unsigned *n, unsigned long *gap)
{
    FILE *f = fopen(acked_path, "r");
    static uint8_t want[SLEN], got[SLEN];
    unsigned s, bad = 0;
    unsigned long long ms, last = 0;
    uint64_t deadline = ts_now_mono_ns() + 30000000000ull;

    *n = 0;
    *gap = 0;
    assert_non_null(f);
    while (fscanf(f, "%u %llu", &s, &ms) == 2) {
        size_t len = 0;
        int rc;
        (*n)++;
        if (*n > 1 && ms - last > *gap)
            *gap = (unsigned long)(ms - last);
        last = ms;
        ts_test_fill(want, SLEN, s, 0);
        do {
            rc = raw_read_shard(CL.node[i].addr, "f", s, SLEN, got, &len);
            if (rc == 0 && (len != SLEN || memcmp(got, want, SLEN) != 0))
                rc = TS_ECORRUPT;
            if (rc)
                usleep(200 * 1000);
        } while (rc && ts_now_mono_ns() < deadline);
        if (rc) {
            if (bad++ < 3)
                fprintf(stderr, "  %s does not serve acknowledged shard %u: %s\n", CL.id[i], s,
                        ts_errname(rc));
        }
    }
    fclose(f);
    return bad;
}

/* The node the monitor runs on (PREFIX/monitor in etcd): its index, or -1. */
static int monitor_node(void)
{
    struct ts_etcd_opts eo = {.endpoints = E.endpoints, .timeout_ms = 3000};
    struct ts_etcd_kv kv = {0};
    ts_etcd *e = NULL;
    int i = -1;

    if (ts_etcd_open(&e, &eo) == 0 && ts_etcd_get(e, PREFIX "/monitor", &kv, NULL) == 0)
        i = tsd_cluster_find(&CL, (const char *)kv.value);
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
    return i;
}

/* ms until node `at` sees node j in state st (at most 20 s), or 0. */
static unsigned long wait_state(int at, int j, int st, uint64_t since)
{
    for (int t = 0; t < 400; t++) {
        if (seen_state(at, j) == st)
            return (unsigned long)((ts_now_mono_ns() - since) / 1000000);
        usleep(50 * 1000);
    }
    return 0;
}

/*
 * One failover and return, with no command typed: a writer (through node `via`) runs while node
 * v is killed with -9; v is marked down, writes stall and go on; every acknowledged shard (of
 * this round and the ones before) is read from each other node alone; v is started again,
 * marked up, and serves them all too.
 */
static void failover_round(int round, int v, int via)
{
    uint64_t t_kill, t_back;
    unsigned long down_ms, up_ms, gap;
    unsigned n, bad;
    pid_t w;
    int st;

    unlink(stop_path);
    w = fork();
    if (w == 0)
        writer(via, (uint32_t)round * MAX_SHARDS);
    sleep(3);
    t_kill = ts_now_mono_ns();
    tsd_kill9(&CL.node[v]);
    down_ms = wait_state(via, v, TS_NODE_DOWN, t_kill);
    assert_true(down_ms > 0);
    fprintf(stderr, "  round %d: %s killed (-9), no command typed: marked down after %lu ms\n",
            round, CL.id[v], down_ms);
    sleep(6); /* writes go on under the new map */
    {
        FILE *f = fopen(stop_path, "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(waitpid(w, &st, 0), w);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < CL.n; i++) {
        if (i == v)
            continue;
        bad = verify_on(i, &n, &gap);
        fprintf(stderr, "  %s alone: %u acknowledged shards, %u missing\n", CL.id[i], n, bad);
        assert_int_equal(bad, 0);
    }
    {
        unsigned long long last = 0;
        unsigned nf = failures(&last);
        /* The fault happened: writes to the PGs v led failed, until they moved. */
        fprintf(stderr,
                "  %u writes failed (the PGs %s led), the last %llu ms after the kill; writes "
                "under way again after that (the longest stretch without an acknowledgement: "
                "%lu ms)\n",
                nf, CL.id[v], last - t_kill / 1000000, gap);
        assert_true(nf > 0);
        assert_true(last - t_kill / 1000000 <= 20000);
    }
    assert_true(n > 50 * (unsigned)round);
    /* Back: marked up by the monitor, then it serves every acknowledged shard. */
    assert_int_equal(tsd_start(&CL.node[v], NULL), 0);
    t_back = ts_now_mono_ns();
    up_ms = wait_state(via, v, TS_NODE_UP, t_back);
    assert_true(up_ms > 0);
    fprintf(stderr, "  %s started again: marked up after %lu ms\n", CL.id[v], up_ms);
    bad = verify_on(v, &n, &gap);
    fprintf(stderr, "  %s alone: %u acknowledged shards, %u missing\n", CL.id[v], n, bad);
    assert_int_equal(bad, 0);
}

static void test_primary_killed_heals_itself(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0};
    struct tessera_opts o;
    tessera_client *c = NULL;
    int mon, again;

    (void)state;
    tsd_client_opts(&o, &CL.node[1], "admin");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, "f", &p), 0);
    tessera_client_close(c);
    failover_round(1, 0, 1);
    /* A second failover: the node the monitor runs on (a primary of its own PGs, one that took
     * over n1's while it was away) is killed; another node becomes the monitor and heals. */
    mon = monitor_node();
    assert_true(mon >= 0);
    fprintf(stderr, "  the monitor runs on %s: it is the next victim\n", CL.id[mon]);
    failover_round(2, mon, (mon + 1) % CL.n);
    again = monitor_node();
    fprintf(stderr, "  the monitor now runs on %s\n", again >= 0 ? CL.id[again] : "no node");
    assert_true(again >= 0);
}

static int setup(void **state)
{
    char *tmp;
    int rc;

    (void)state;
    rc = etcd_cluster_start(&E, 3, 0);
    if (rc)
        return -1;
    tmp = ts_test_tmpdir("etcd-failover");
    snprintf(acked_path, sizeof(acked_path), "%s/acked", tmp);
    snprintf(stop_path, sizeof(stop_path), "%s/stop", tmp);
    snprintf(failed_path, sizeof(failed_path), "%s/failed", tmp);
    free(tmp);
    {
        const char *extra[] = {"--etcd",
                               E.endpoints,
                               "--etcd-prefix",
                               PREFIX,
                               "--etcd-lease-ttl-s",
                               "2",
                               "--monitor-down-after-ms",
                               "2500",
                               "--monitor-up-after-ms",
                               "1000",
                               NULL};
        rc = tsd_cluster_start(&CL, 3, NULL, 8, extra);
    }
    return rc;
}

static int teardown(void **state)
{
    int rc;

    (void)state;
    rc = tsd_cluster_stop(&CL);
    etcd_cluster_stop(&E);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_primary_killed_heals_itself),
    };
    int rc;

    if ((rc = etcd_required("test_etcd_failover")) != 0)
        return rc;
    rc = cmocka_run_group_tests_name("etcd failover", tests, setup, teardown);
    if (rc)
        tsd_cluster_dump_logs(&CL);
    return rc;
}
