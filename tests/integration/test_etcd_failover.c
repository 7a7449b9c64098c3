/*
 * A cluster that heals itself (issue 29): a real 3-member etcd, 3 real nodes following it, each
 * standing for monitor (etcd_monitor.c). A writer puts 16 KiB shards through the cluster and
 * records each acknowledged one; node n1 is killed with -9 and no command is typed: its lease
 * goes, the monitor marks it down, peering moves its PGs, and writes go on. The test prints how
 * long writes stalled and asserts a bound (lease TTL 2 s + down_after 2.5 s + a monitor round +
 * peering, within 20 s); every acknowledged shard is read back byte for byte from each node that
 * is up, alone. n1 is started again: the monitor marks it up by itself, and it serves every
 * acknowledged shard too. Then a second round kills the node the monitor runs on: another node
 * is elected, marks it down and, once back, up; 0 lost again. Last, n1 is cut off from etcd
 * alone (iptables, in the test's own network namespace): failed over, it logs and acknowledges
 * nothing more in its old PGs (their logs on n1 stand still), 0 lost; reconnected, it is marked
 * up again. And `tessera drill node-return --auto` lets the cluster heal itself twice: per PG
 * the time until writable and until fully replicated, 0 lost.
 */
#include "etcd_nodes.h"

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_test.h"
#include "etcd.h"

#include <json-c/json.h>

#include <sched.h>
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
static char work_dir[600], acked_path[700], failed_path[700], stop_path[700], n1_etcd[256];

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
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
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

/*
 * n1 cut off from etcd only (an iptables rule in the test's network namespace drops what n1
 * sends to the address it alone reaches etcd by, 127.0.2.1; its peers and clients still reach
 * it): its lease runs out, the monitor fails it over, and n1, which can no longer learn the new
 * map, acknowledges no write of its old PGs: every acknowledged write (a writer going through
 * n1 the whole time) is on n2 and n3 alone. The rule removed: n1 installs etcd's map, is marked
 * up, and serves them all.
 */
static void test_cut_off_from_etcd(void **state)
{
    struct ts_map *m1, *m2;
    struct raw_pginfo before[8];
    int led[8];
    uint64_t t_cut, t_back;
    unsigned long down_ms, up_ms, gap;
    unsigned n, bad;
    pid_t w;
    int st;

    (void)state;
    assert_true(wait_state(1, 0, TS_NODE_UP, ts_now_mono_ns()) > 0 ||
                seen_state(1, 0) == TS_NODE_UP);
    unlink(stop_path);
    w = fork();
    if (w == 0)
        writer(0, 3 * MAX_SHARDS);
    sleep(3);
    t_cut = ts_now_mono_ns();
    assert_int_equal(system("iptables -w -A OUTPUT -d 127.0.2.1 -j DROP"), 0);
    down_ms = wait_state(1, 0, TS_NODE_DOWN, t_cut);
    fprintf(stderr, "  n1 cut off from etcd (not from its peers): marked down after %lu ms\n",
            down_ms);
    assert_true(down_ms > 0);
    /* n1's logs of the PGs it led, a moment after the failover (peering done elsewhere). */
    sleep(1);
    m1 = raw_map_get(CL.node[0].addr);
    assert_non_null(m1);
    for (uint32_t pg = 0; pg < m1->pg_count; pg++) {
        int first[1];
        led[pg] = ts_map_pg_order(m1, pg, first, 1) == 1 && first[0] == 0;
        if (led[pg])
            assert_int_equal(raw_pg_info(CL.node[0].addr, pg, &before[pg]), 0);
    }
    ts_map_free(m1);
    sleep(5); /* the writer goes on through n1 */
    m1 = raw_map_get(CL.node[0].addr);
    m2 = raw_map_get(CL.node[1].addr);
    assert_true(m1 && m2);
    fprintf(stderr,
            "  n1 still holds epoch %llu, n2 has %llu: n1 cannot learn it was failed over\n",
            (unsigned long long)m1->epoch, (unsigned long long)m2->epoch);
    /* The fault happened: n1 is behind, and still answers its clients. */
    assert_true(m1->epoch < m2->epoch);
    ts_map_free(m1);
    ts_map_free(m2);
    {
        FILE *f = fopen(stop_path, "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(waitpid(w, &st, 0), w);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    {
        unsigned long long last = 0;
        unsigned nf = failures(&last);
        fprintf(stderr,
                "  %u writes through n1 failed (its old PGs), the last %llu ms after the cut\n", nf,
                last - t_cut / 1000000);
    }
    /* n1 logged nothing more in the PGs it led (a primary logs a write before it acknowledges
     * it): it acknowledged no write after it was failed over. */
    for (uint32_t pg = 0; pg < 8; pg++) {
        struct raw_pginfo now;
        if (!led[pg])
            continue;
        assert_int_equal(raw_pg_info(CL.node[0].addr, pg, &now), 0);
        fprintf(stderr, "  n1's log of PG %u (it led): head (%llu, %llu), the same as 5 s before\n",
                pg, (unsigned long long)now.head_epoch, (unsigned long long)now.applied);
        assert_true(now.applied == before[pg].applied && now.head_epoch == before[pg].head_epoch);
    }
    /* Nothing n1 acknowledged is missing from the PG's current replicas. */
    for (int i = 1; i < CL.n; i++) {
        bad = verify_on(i, &n, &gap);
        fprintf(stderr, "  %s alone: %u acknowledged shards, %u missing\n", CL.id[i], n, bad);
        assert_int_equal(bad, 0);
    }
    assert_int_equal(system("iptables -w -D OUTPUT -d 127.0.2.1 -j DROP"), 0);
    t_back = ts_now_mono_ns();
    up_ms = wait_state(1, 0, TS_NODE_UP, t_back);
    fprintf(stderr, "  etcd reachable again: n1 marked up after %lu ms\n", up_ms);
    assert_true(up_ms > 0);
    bad = verify_on(0, &n, &gap);
    fprintf(stderr, "  n1 alone: %u acknowledged shards, %u missing\n", n, bad);
    assert_int_equal(bad, 0);
}

static double num(struct json_object *o, const char *k)
{
    struct json_object *v;
    return json_object_object_get_ex(o, k, &v) ? json_object_get_double(v) : -1;
}

/*
 * `tessera drill node-return --auto`: the drill kills a primary, waits for the monitor (no
 * failover by the drill), writes, starts it again, waits for the monitor to mark it up, kills it
 * again; its report gives, per PG the node led, the time until writable and until fully
 * replicated, and 0 lost. Without --auto the drill would fail the node over itself (a map push,
 * refused on etcd: the drill then fails).
 */
static void test_drill_auto(void **state)
{
    char out[65536], report[800];
    struct json_object *rep, *pgs;
    int rc;

    (void)state;
    snprintf(report, sizeof(report), "%s/drill-auto.json", work_dir);
    rc = tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out),
                 "--timeout 3000 drill node-return --auto --duration 6 --report %s", report);
    rep = json_object_from_file(report);
    assert_non_null(rep);
    assert_int_equal(rc, 0);
    fprintf(
        stderr, "  drill --auto: marked down after %.3f s, up %.3f s after its start; lost %.0f\n",
        num(rep, "marked_down_s"), num(rep, "marked_up_s"), num(rep, "acknowledged_writes_lost"));
    assert_true(num(rep, "marked_down_s") > 0 && num(rep, "marked_up_s") > 0);
    assert_true(num(rep, "acknowledged_writes") > 0);
    assert_true(num(rep, "acknowledged_writes_lost") == 0);
    assert_true(json_object_object_get_ex(rep, "pgs", &pgs));
    assert_true(json_object_array_length(pgs) > 0);
    for (size_t k = 0; k < json_object_array_length(pgs); k++) {
        struct json_object *p = json_object_array_get_idx(pgs, k);
        fprintf(stderr, "    PG %.0f: writable after %.3f s, fully replicated after %.3f s\n",
                num(p, "pg"), num(p, "writable_s"), num(p, "replicated_s"));
        assert_true(num(p, "writable_s") > 0);
        assert_true(num(p, "replicated_s") >= num(p, "writable_s"));
    }
    json_object_put(rep);
}

static int setup(void **state)
{
    char *tmp;
    int rc;

    (void)state;
    E.listen_any = 1; /* n1 reaches etcd by 127.0.2.1 alone: test_cut_off_from_etcd cuts that */
    rc = etcd_cluster_start(&E, 3, 0);
    if (rc)
        return -1;
    for (int i = 0; i < E.n; i++)
        snprintf(n1_etcd + strlen(n1_etcd), sizeof(n1_etcd) - strlen(n1_etcd),
                 "%shttp://127.0.2.1:%d", i ? "," : "", E.client_port[i]);
    tmp = ts_test_tmpdir("etcd-failover");
    snprintf(work_dir, sizeof(work_dir), "%s", tmp);
    snprintf(acked_path, sizeof(acked_path), "%s/acked", tmp);
    snprintf(stop_path, sizeof(stop_path), "%s/stop", tmp);
    snprintf(failed_path, sizeof(failed_path), "%s/failed", tmp);
    free(tmp);
    {
        /* the tests kill n1 and n2 again and again on purpose: no flap damping
         * (test_etcd_guards tests it) */
        const char *const more[] = {ETCD_QUICK_MONITOR, "--monitor-flap-max", "1000", NULL};
        const char *n1[] = {"--etcd", n1_etcd, NULL};
        const char *const *each[] = {n1, NULL, NULL};
        rc = etcd_nodes_start_each(&CL, 3, 8, &E, PREFIX, more, each);
    }
    return rc;
}

static int teardown(void **state)
{
    int rc;

    (void)state;
    rc = tsd_cluster_stop_restarted(&CL); /* the drill restarted n2 itself */
    etcd_cluster_stop(&E);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_primary_killed_heals_itself),
        cmocka_unit_test(test_cut_off_from_etcd),
        cmocka_unit_test(test_drill_auto),
    };
    int rc;

    if ((rc = etcd_required("test_etcd_failover")) != 0)
        return rc;
    if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0) {
        fprintf(stderr, "test_etcd_failover: SKIP: needs root and a network namespace of its own "
                        "(iptables cuts a node off from etcd)\n");
        return 77;
    }
    if (system("ip link set lo up") != 0 || system("iptables -w -L >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_etcd_failover: cannot bring up the namespace's loopback, or no "
                        "iptables (scripts/deps installs it)\n");
        return 1;
    }
    rc = cmocka_run_group_tests_name("etcd failover", tests, setup, teardown);
    if (rc)
        tsd_cluster_dump_logs(&CL);
    return rc;
}
