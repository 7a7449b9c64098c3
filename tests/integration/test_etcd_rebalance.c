/*
 * A rebalance outlives the command that started it and the monitor that drives it (issue 29): a
 * real 3-member etcd, 5 real nodes following it (n5 out by an operator, holding nothing), two
 * `tessera monitor` processes standing for PREFIX/rebalancer, a writer putting shards the whole
 * time. `tessera --etcd ... rebalance apply` (n5 up, paced) hands the drive to the elected
 * monitor and ends at once; once some PGs have moved and others have not, the driving monitor is
 * killed with -9: the other is elected within the lease's 5 s, drives the rest, and the
 * rebalance completes. Every acknowledged write reads back byte for byte; etcd's map ends with
 * n5 up and no rebalance.
 */
#include "etcd_nodes.h"

#include "etcd.h"
#include "mapstore.h"
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
#include <sys/wait.h>
#include <unistd.h>

#define PREFIX "/tessera/r"
#define SLEN (64 << 10)

static struct etcd_cluster E;
static struct tsd_cluster CL;
static char dir[600], out[1 << 16];
static pid_t mon[2];
static atomic_int stop;
static atomic_uint nacked;
static uint32_t acked[100000];

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

static void *writer(void *arg)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    (void)arg;
    tsd_client_opts(&o, &CL.node[1], "writer");
    o.timeout_ms = 3000;
    if (tessera_client_open(&c, &o) != 0)
        return NULL;
    for (uint32_t s = 1000; !atomic_load(&stop) && s < 100000; s++) {
        if (tsd_put_pattern(c, "r", s, SLEN, s) == 0)
            acked[atomic_fetch_add(&nacked, 1)] = s;
        usleep(200 * 1000); /* 320 KB/s: below the rebalance's pace, so it ends */
    }
    tessera_client_close(c);
    return NULL;
}

/* `tessera monitor` k, its output in DIR/monitorK.log. */
static pid_t start_monitor(int k)
{
    char log[700];

    snprintf(log, sizeof(log), "%s/monitor%d.log", dir, k);
    return etcd_monitor_start(&E, PREFIX, CL.tls_listen[k], log);
}

static int log_says(int k, const char *what)
{
    char path[700], buf[16384];
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "%s/monitor%d.log", dir, k);
    f = fopen(path, "r");
    if (!f)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, what) != NULL;
}

/* PGs done of the rebalance in progress (and *total), or -1 with none in progress. */
static int pgs_done(int *total)
{
    const char *p;

    assert_int_equal(cli("--etcd %s --etcd-prefix %s rebalance status", E.endpoints, PREFIX), 0);
    if (strstr(out, "no rebalance in progress"))
        return -1;
    p = strstr(out, " PGs done");
    assert_non_null(p);
    while (p > out && p[-1] != ' ')
        p--;
    *total = atoi(strchr(p, '/') + 1);
    return atoi(p);
}

static void test_monitor_killed_mid_rebalance(void **state)
{
    struct ts_etcd_opts eo = {.endpoints = E.endpoints, .timeout_ms = 3000};
    ts_etcd *e = NULL;
    struct ts_map *m = NULL;
    char target[700];
    int driver = -1, total = 0, done = 0, at_kill;
    pthread_t w;
    uint64_t t_kill;

    (void)state;
    for (int k = 0; k < 2; k++)
        mon[k] = start_monitor(k);
    for (int t = 0; t < 100 && driver < 0; t++) {
        for (int k = 0; k < 2 && driver < 0; k++)
            if (log_says(k, "elected: drives"))
                driver = k;
        usleep(100 * 1000);
    }
    assert_true(driver >= 0);
    fprintf(stderr, "  two monitors; monitor %d is elected\n", driver);

    /* The target: etcd's map with n5 up. */
    assert_int_equal(ts_etcd_open(&e, &eo), 0);
    assert_int_equal(ts_mapstore_get(e, PREFIX, &m, NULL), 0);
    m->nodes[ts_map_find(m, "n5")].state = TS_NODE_UP;
    snprintf(target, sizeof(target), "%s/target.map", dir);
    assert_int_equal(ts_map_write_file(m, target), 0);
    ts_map_free(m);

    pthread_create(&w, NULL, writer, NULL);
    assert_int_equal(cli("--etcd %s --etcd-prefix %s rebalance apply %s --max-concurrent 1 "
                         "--max-bytes-per-sec 1000000",
                         E.endpoints, PREFIX, target),
                     0);
    assert_non_null(strstr(out, "driven by the elected 'tessera monitor'"));
    /* Some PGs moved, others not yet: the driving monitor dies. */
    for (int t = 0; t < 240 && done < 1; t++) {
        done = pgs_done(&total);
        usleep(250 * 1000);
    }
    assert_true(done >= 1);
    assert_true(log_says(driver, "driving the rebalance"));
    at_kill = pgs_done(&total);
    t_kill = ts_now_mono_ns();
    kill(mon[driver], SIGKILL);
    waitpid(mon[driver], NULL, 0);
    mon[driver] = 0;
    fprintf(stderr, "  monitor %d killed (-9) with %d of %d PGs done\n", driver, at_kill, total);
    /* The fault happened mid-way. */
    assert_true(at_kill >= 0 && at_kill < total);
    for (int t = 0; t < 480 && (done = pgs_done(&total)) >= 0; t++)
        usleep(250 * 1000);
    assert_int_equal(done, -1);
    fprintf(stderr, "  the rebalance completed %.1f s after the kill\n",
            (double)(ts_now_mono_ns() - t_kill) / 1e9);
    assert_true(log_says(1 - driver, "elected: drives"));
    assert_true(log_says(1 - driver, "driving the rebalance"));
    atomic_store(&stop, 1);
    pthread_join(w, NULL);

    /* etcd's map: n5 up, no rebalance; every acknowledged write byte for byte. */
    assert_int_equal(ts_mapstore_get(e, PREFIX, &m, NULL), 0);
    assert_null(m->move);
    assert_int_equal(m->nodes[ts_map_find(m, "n5")].state, TS_NODE_UP);
    ts_map_free(m);
    ts_etcd_close(e);
    {
        static uint8_t want[SLEN], got[SLEN];
        struct tessera_opts o;
        tessera_client *c = NULL;
        unsigned bad = 0, n = atomic_load(&nacked);
        tsd_client_opts(&o, &CL.node[2], "reader");
        assert_int_equal(tessera_client_open(&c, &o), 0);
        for (unsigned i = 0; i < n; i++) {
            size_t len = 0;
            ts_test_fill(want, SLEN, acked[i], 0);
            if (tessera_read(c, "r", acked[i], 0, SLEN, got, &len) != 0 || len != SLEN ||
                memcmp(got, want, SLEN) != 0)
                bad++;
        }
        for (uint32_t s = 0; s < 40; s++) {
            size_t len = 0;
            ts_test_fill(want, SLEN, s, 0);
            if (tessera_read(c, "r", s, 0, SLEN, got, &len) != 0 || len != SLEN ||
                memcmp(got, want, SLEN) != 0)
                bad++;
        }
        tessera_client_close(c);
        fprintf(stderr, "  %u acknowledged writes (40 before, %u during), %u lost\n", n + 40, n,
                bad);
        assert_int_equal(bad, 0);
    }
}

static int setup(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    struct tessera_opts o;
    tessera_client *c = NULL;
    char *tmp;
    int rc;

    (void)state;
    rc = etcd_cluster_start(&E, 3, 0);
    if (rc)
        return -1;
    tmp = ts_test_tmpdir("etcd-rebalance");
    snprintf(dir, sizeof(dir), "%s", tmp);
    free(tmp);
    rc = etcd_nodes_start(&CL, 5, 16, &E, PREFIX, NULL);
    if (rc)
        return rc;
    sleep(1);
    /* n5 runs but holds nothing: the rebalance brings it in (an operator's out stays out). */
    if (cli("--etcd %s --etcd-prefix %s node out n5", E.endpoints, PREFIX) != 0)
        return -1;
    tsd_client_opts(&o, &CL.node[0], "writer");
    if (tessera_client_open(&c, &o) != 0 || tessera_dataset_create(c, "r", &p) != 0)
        return -1;
    for (uint32_t s = 0; s < 40; s++)
        if (tsd_put_pattern(c, "r", s, SLEN, s) != 0)
            return -1;
    tessera_client_close(c);
    return 0;
}

static int teardown(void **state)
{
    char cmd[800];

    (void)state;
    snprintf(cmd, sizeof(cmd), "tail -n 8 %s/monitor*.log >&2", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "(no monitor logs)\n");
    for (int k = 0; k < 2; k++)
        etcd_monitor_stop(mon[k]);
    return etcd_nodes_stop(&CL, &E, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_monitor_killed_mid_rebalance),
    };

    return etcd_run_group("test_etcd_rebalance", "etcd rebalance", tests, TS_ARRAY_SIZE(tests),
                          setup, teardown, &CL);
}
