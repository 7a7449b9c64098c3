/*
 * Metrics as an operator sees them: a real Prometheus (Debian's), started here, scrapes a real
 * 5-node cluster (metrics_listen on every node) under a known load. Through Prometheus's HTTP
 * API: the bytes read of a dataset, summed over the nodes, equal what this test read; the hot
 * dataset is on top; a fringe replica stopped (SIGSTOP) shows its lag rising on the primary,
 * back to 0 once it runs again; a killed node's target is down. Every node's /metrics passes
 * `promtool check metrics`; /healthz and /readyz answer.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tessera/tessera.h"
#include "ts_map.h"
#include "ts_proto.h"

#define PROMETHEUS "/usr/bin/prometheus"
#define PROMTOOL "/usr/bin/promtool"
#define N 5
#define LEN (256 * 1024)
#define HOT_SHARDS 8
#define HOT_ROUNDS 4

static struct tsd_cluster CL;
static char maddr[N][64]; /* each node's metrics address */
static char prom_addr[64];
static pid_t prom_pid;
static char prom_dir[256];
/* A training job's target as Prometheus sees it: tessera_job_data_stall_seconds_total of rank 3
 * growing by 0.25 s per second (a child rewrites the file), served by python3 -m http.server. */
static pid_t job_http_pid, job_writer_pid;
static int job_port;

/* ---- a plain HTTP/1.0 GET (the test's own client: Prometheus and the nodes both speak it) */

static void urlenc(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (; *in && o + 4 < cap; in++) {
        unsigned char ch = (unsigned char)*in;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '_' || ch == '.' || ch == '-')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", ch);
    }
    out[o] = 0;
}

/* An instant query: the number of series in the result (-1: the query failed); the first
 * series' value in *v and its label `label` in lv (both optional). */
static int prom_query(const char *expr, double *v, const char *label, char *lv, size_t lcap)
{
    static char body[1 << 20];
    char path[4096], enc[3000];
    json_object *root, *data, *res, *first, *val, *metric, *l;
    int n = -1;

    urlenc(expr, enc, sizeof(enc));
    snprintf(path, sizeof(path), "/api/v1/query?query=%s", enc);
    if (tsd_http_get(prom_addr, path, body, sizeof(body)) != 200)
        return -1;
    root = json_tokener_parse(body);
    if (!root)
        return -1;
    if (json_object_object_get_ex(root, "data", &data) &&
        json_object_object_get_ex(data, "result", &res)) {
        n = (int)json_object_array_length(res);
        if (n > 0) {
            first = json_object_array_get_idx(res, 0);
            if (v && json_object_object_get_ex(first, "value", &val))
                *v = atof(json_object_get_string(json_object_array_get_idx(val, 1)));
            if (lv && json_object_object_get_ex(first, "metric", &metric) &&
                json_object_object_get_ex(metric, label, &l))
                snprintf(lv, lcap, "%s", json_object_get_string(l));
        }
    }
    json_object_put(root);
    return n;
}

/* Waits up to secs for expr's first value to satisfy want(v) (polling every 0.5 s); the last
 * value seen in *last. 1 when it did. */
static int prom_wait(const char *expr, int (*want)(double), double *last, int secs)
{
    for (int t = 0; t < secs * 2; t++) {
        double v = -1;
        if (prom_query(expr, &v, NULL, NULL, 0) > 0) {
            *last = v;
            if (want(v))
                return 1;
        }
        usleep(500000);
    }
    return 0;
}

/* Waits up to secs for expr's first series to carry label = want (a rate needs two scrapes of
 * a series first). 1 when it did; the last label seen in lv. */
static int prom_wait_label(const char *expr, const char *label, const char *want, char *lv,
                           size_t cap, int secs)
{
    for (int t = 0; t < secs * 2; t++) {
        lv[0] = 0;
        if (prom_query(expr, NULL, label, lv, cap) > 0 && strcmp(lv, want) == 0)
            return 1;
        usleep(500000);
    }
    return 0;
}

/* ---- the cluster and Prometheus ------------------------------------------------------- */

static void metrics_addr_of(int i)
{
    FILE *f = fopen(CL.node[i].log, "r");
    char line[1024];

    assert_non_null(f);
    maddr[i][0] = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "tesserad ready");
        if (p && (p = strstr(p, " metrics=")))
            sscanf(p + 9, "%63s", maddr[i]);
    }
    fclose(f);
    assert_true(maddr[i][0] && strcmp(maddr[i], "-") != 0);
}

static int start_prometheus(void)
{
    char cfg[512], path[300], body[4096];
    FILE *f;
    int port = tsd_free_port();

    snprintf(prom_dir, sizeof(prom_dir), "%s/prometheus", CL.dir);
    mkdir(prom_dir, 0700);
    snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", prom_dir);
    f = fopen(cfg, "w");
    if (!f)
        return -1;
    fprintf(f, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
               "scrape_configs:\n  - job_name: tessera\n    static_configs:\n");
    for (int i = 0; i < N; i++)
        fprintf(f, "      - targets: ['%s']\n        labels: {node: %s}\n", maddr[i], CL.id[i]);
    fprintf(f,
            "  - job_name: tessera-job\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n",
            job_port);
    fclose(f);
    snprintf(prom_addr, sizeof(prom_addr), "127.0.0.1:%d", port);
    prom_pid = fork();
    if (prom_pid == 0) {
        char a1[600], a2[600], a3[100], logp[600];
        snprintf(a1, sizeof(a1), "--config.file=%s", cfg);
        snprintf(a2, sizeof(a2), "--storage.tsdb.path=%s/data", prom_dir);
        snprintf(a3, sizeof(a3), "--web.listen-address=%s", prom_addr);
        snprintf(logp, sizeof(logp), "%s/prometheus.log", prom_dir);
        freopen(logp, "w", stderr);
        freopen("/dev/null", "w", stdout);
        execl(PROMETHEUS, PROMETHEUS, a1, a2, a3, (char *)NULL);
        _exit(127);
    }
    for (int t = 0; t < 300; t++) {
        if (tsd_http_get(prom_addr, "/-/ready", body, sizeof(body)) == 200)
            return 0;
        usleep(100000);
    }
    snprintf(path, sizeof(path), "cat %s/prometheus.log >&2", prom_dir);
    (void)!system(path);
    return -1;
}

static void start_job_target(void)
{
    char dir[300];

    snprintf(dir, sizeof(dir), "%s/job", CL.dir);
    mkdir(dir, 0700);
    job_port = tsd_free_port();
    job_writer_pid = fork();
    if (job_writer_pid == 0) {
        char tmp[400], dst[400];
        struct timespec t0, t;
        snprintf(tmp, sizeof(tmp), "%s/.metrics", dir);
        snprintf(dst, sizeof(dst), "%s/metrics", dir);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            FILE *o = fopen(tmp, "w");
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (o) {
                fprintf(o,
                        "# TYPE tessera_job_data_stall_seconds_total counter\n"
                        "tessera_job_data_stall_seconds_total{rank=\"3\"} %.3f\n",
                        0.25 * ((double)(t.tv_sec - t0.tv_sec) +
                                (double)(t.tv_nsec - t0.tv_nsec) / 1e9));
                fclose(o);
                rename(tmp, dst);
            }
            usleep(200000);
        }
    }
    job_http_pid = fork();
    if (job_http_pid == 0) {
        char port[16];
        snprintf(port, sizeof(port), "%d", job_port);
        freopen("/dev/null", "w", stderr);
        freopen("/dev/null", "w", stdout);
        execl("/usr/bin/python3", "python3", "-m", "http.server", "--bind", "127.0.0.1",
              "--directory", dir, port, (char *)NULL);
        _exit(127);
    }
}

static int setup(void **state)
{
    const char *extra[] = {"--metrics-listen", "127.0.0.1:0", "--peer-timeout-ms", "1000", NULL};

    if (access(PROMETHEUS, X_OK) != 0 || access(PROMTOOL, X_OK) != 0) {
        fprintf(stderr,
                "test_metrics: %s and %s are needed (Debian's prometheus package: "
                "scripts/deps installs it)\n",
                PROMETHEUS, PROMTOOL);
        return -1;
    }
    if (tsd_cluster_start(&CL, N, NULL, 8, extra) != 0)
        return -1;
    for (int i = 0; i < N; i++)
        metrics_addr_of(i);
    start_job_target();
    return start_prometheus();
}

static int teardown(void **state)
{
    pid_t kids[] = {prom_pid, job_http_pid, job_writer_pid};
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGTERM);
            waitpid(kids[i], NULL, 0);
        }
    return tsd_cluster_stop(&CL);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131 + seed * 7919) >> 3);
}

static tessera_client *writer(void)
{
    tessera_client *c = NULL;
    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "writer", NULL, NULL), 0);
    return c;
}

static void put_shard(tessera_client *c, const char *ds, uint32_t s)
{
    uint8_t *buf = malloc(LEN);
    fill(buf, LEN, s);
    assert_int_equal(tessera_put(c, ds, s, buf, LEN, NULL, 0), 0);
    free(buf);
}

/* Reads shard s of ds whole through the cluster client, checks it byte for byte; its bytes. */
static uint64_t read_shard(tessera_client *c, const char *ds, uint32_t s)
{
    uint8_t *want = malloc(LEN), *got = malloc(LEN);
    size_t n = 0;

    fill(want, LEN, s);
    assert_int_equal(tessera_read(c, ds, s, 0, LEN, got, &n), 0);
    assert_int_equal(n, LEN);
    assert_memory_equal(want, got, LEN);
    free(want);
    free(got);
    return n;
}

static int is_zero(double v)
{
    return v == 0;
}
static int is_positive(double v)
{
    return v > 0;
}

static double g_want;
static int is_want(double v)
{
    return v == g_want;
}

/* ---- the tests -------------------------------------------------------------------------- */

static void test_every_node_serves_valid_metrics(void **state)
{
    static char body[1 << 20];

    for (int i = 0; i < N; i++) {
        char path[1200];
        FILE *p;
        assert_int_equal(tsd_http_get(maddr[i], "/metrics", body, sizeof(body)), 200);
        assert_non_null(strstr(body, "# TYPE tessera_requests_total counter"));
        assert_non_null(strstr(body, "tessera_map_epoch 1"));
        snprintf(path, sizeof(path), "%s check metrics >/dev/null 2>&1", PROMTOOL);
        p = popen(path, "w");
        assert_non_null(p);
        fputs(body, p);
        assert_int_equal(pclose(p), 0); /* promtool's verdict on this node's exposition */
        assert_int_equal(tsd_http_get(maddr[i], "/healthz", body, sizeof(body)), 200);
        assert_int_equal(tsd_http_get(maddr[i], "/readyz", body, sizeof(body)), 200);
        assert_int_equal(tsd_http_get(maddr[i], "/nothing", body, sizeof(body)), 404);
    }
}

static void test_read_bytes_and_hot_dataset(void **state)
{
    struct ts_dataset_policy hot = {3, 0, 2, 65536, 0, 0, 0, 0},
                             cold = {3, 0, 2, 65536, 0, 0, 0, 0};
    tessera_client *c = writer();
    uint64_t read_hot = 0, read_cold = 0;
    double v = -1;
    char expr[512], top[64] = "";

    assert_int_equal(tessera_dataset_create(c, "hotds", &hot), 0);
    assert_int_equal(tessera_dataset_create(c, "coldds", &cold), 0);
    for (uint32_t s = 0; s < HOT_SHARDS; s++)
        put_shard(c, "hotds", s);
    put_shard(c, "coldds", 0);
    /* Every node's series of both datasets exist (at 0) before the reads: the reads below take
     * less than a scrape interval, and rate() counts from a series' first sample. */
    g_want = (double)N * 2;
    assert_true(prom_wait("count(tessera_dataset_read_bytes_total{dataset=~\"hotds|coldds\"})",
                          is_want, &v, 20));
    for (int r = 0; r < HOT_ROUNDS; r++)
        for (uint32_t s = 0; s < HOT_SHARDS; s++)
            read_hot += read_shard(c, "hotds", s);
    read_cold += read_shard(c, "coldds", 0);
    tessera_client_close(c);

    /* What Prometheus scraped equals what was read, summed over the nodes that served it. */
    g_want = (double)read_hot;
    if (!prom_wait("sum(tessera_dataset_read_bytes_total{dataset=\"hotds\"})", is_want, &v, 20))
        fail_msg("Prometheus shows %.0f bytes read of hotds; the test read %llu", v,
                 (unsigned long long)read_hot);
    g_want = (double)read_cold;
    if (!prom_wait("sum(tessera_dataset_read_bytes_total{dataset=\"coldds\"})", is_want, &v, 20))
        fail_msg("Prometheus shows %.0f bytes read of coldds; the test read %llu", v,
                 (unsigned long long)read_cold);
    g_want = (double)HOT_ROUNDS * HOT_SHARDS;
    assert_true(prom_wait("sum(tessera_dataset_reads_total{dataset=\"hotds\"})", is_want, &v, 10));
    /* Written: every byte the client put, counted once (at the primaries). */
    g_want = (double)HOT_SHARDS * LEN;
    assert_true(
        prom_wait("sum(tessera_dataset_written_bytes_total{dataset=\"hotds\"})", is_want, &v, 10));
    /* The hot dataset on top: by rate, and by the nodes' hot-shard sketches. */
    snprintf(expr, sizeof(expr),
             "topk(1, sum by (dataset) (rate(tessera_dataset_read_bytes_total[1m])))");
    if (!prom_wait_label(expr, "dataset", "hotds", top, sizeof(top), 15))
        fail_msg("the top dataset by read rate is '%s', not hotds", top);
    if (!prom_wait_label("topk(1, sum by (dataset) (tessera_hot_shard_read_bytes_per_second))",
                         "dataset", "hotds", top, sizeof(top), 15))
        fail_msg("the top dataset by the nodes' hot-shard sketches is '%s', not hotds", top);
    /* Latency histograms came with the reads and writes. */
    assert_true(prom_query("sum(tessera_request_duration_seconds_count{kind=\"read\"})", &v, NULL,
                           NULL, 0) > 0);
    assert_true(v >= HOT_ROUNDS * HOT_SHARDS);
    assert_true(prom_query("sum(tessera_request_duration_seconds_count{kind=\"replicate\"})", &v,
                           NULL, NULL, 0) > 0);
    assert_true(v > 0);
}

/* A scrub of n1 shows in its metrics: it read and verified every byte n1 holds. */
static void test_scrub_shows(void **state)
{
    static char out[1 << 14];
    double v = -1, stored = -1;

    g_want = 0;
    assert_true(prom_wait("tessera_scrubs_total{node=\"n1\"}", is_want, &v, 10));
    assert_int_equal(tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), "scrub"), 0);
    g_want = 1;
    assert_true(prom_wait("tessera_scrubs_total{node=\"n1\"}", is_want, &v, 10));
    assert_true(prom_query("tessera_stored_bytes{node=\"n1\"}", &stored, NULL, NULL, 0) > 0);
    assert_true(stored >= LEN);
    g_want = stored;
    if (!prom_wait("tessera_scrub_checked_bytes_total{node=\"n1\"}", is_want, &v, 10))
        fail_msg("n1 holds %.0f bytes; its scrub checked %.0f", stored, v);
    g_want = 0;
    assert_true(prom_wait("tessera_scrub_running{node=\"n1\"}", is_want, &v, 10));
}

/* A fringe replica stopped: its lag rises on the primary; running again: back to 0. */
static void test_fringe_lag_rises_and_returns(void **state)
{
    struct ts_dataset_policy p = {2, 1, 2, 65536, 0, 0, 0, 0}, three = {3, 0, 2, 65536, 0, 0, 0, 0};
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    tessera_client *c = writer();
    int order[8], f = -1, stop_i, prim_i;
    uint32_t pg = 0, shards[4], ns = 0, s3 = 0;
    char expr[256], rec[256];
    double v = -1;

    assert_non_null(m);
    assert_int_equal(tessera_dataset_create(c, "lagds", &p), 0);
    assert_int_equal(tessera_dataset_create(c, "lag3ds", &three), 0);
    /* The fringe replica (rank 2) of shard 0's PG, and shards of that PG only (the stopped
     * node is core in other PGs, whose writes would wait for it). */
    ts_map_pg_order(m, ts_map_pg_of(m, "lagds", 0), order, 8);
    f = order[2];
    pg = ts_map_pg_of(m, "lagds", 0);
    for (uint32_t s = 0; ns < 4 && s < 10000; s++)
        if (ts_map_pg_of(m, "lagds", s) == pg)
            shards[ns++] = s;
    while (s3 < 10000 && ts_map_pg_of(m, "lag3ds", s3) != pg)
        s3++;
    ts_map_free(m);
    assert_int_equal(ns, 4);
    stop_i = tsd_cluster_find(&CL, CL.id[f]);
    prim_i = tsd_cluster_find(&CL, CL.id[order[0]]);
    /* The same PG's log also holds a write of a dataset with 3 core replicas (rank 2 is core
     * there): that older write is applied everywhere and must not make the stopped replica's
     * outstanding fringe writes count as core. */
    put_shard(c, "lag3ds", s3);
    put_shard(c, "lagds", shards[0]); /* the PG's replicas in touch */
    snprintf(expr, sizeof(expr),
             "sum(tessera_replica_lag_operations{replica=\"%s\",tier=\"fringe\"})", CL.id[stop_i]);
    assert_true(prom_wait(expr, is_zero, &v, 20));

    assert_int_equal(kill(CL.node[stop_i].pid, SIGSTOP), 0);
    for (uint32_t k = 1; k < ns; k++)
        put_shard(c, "lagds", shards[k]); /* acknowledged by the core replicas alone */
    /* The primary gives up on the stopped replica after peer_timeout_ms (1 s here): it counts
     * it as recovering again, no longer knowing where its log ends. The lag must stay on the
     * fringe row through that, as long as the replica stays stopped. */
    snprintf(rec, sizeof(rec), "tessera_replicas_recovering{node=\"%s\"}", CL.id[prim_i]);
    if (!prom_wait(rec, is_positive, &v, 20)) {
        kill(CL.node[stop_i].pid, SIGCONT);
        fail_msg("the primary %s never timed the stopped replica %s out", CL.id[prim_i],
                 CL.id[stop_i]);
    }
    if (!prom_wait(expr, is_positive, &v, 20)) {
        kill(CL.node[stop_i].pid, SIGCONT);
        fail_msg("the fringe replica %s was stopped and 3 writes went on, but its lag in "
                 "Prometheus stayed %.0f",
                 CL.id[stop_i], v);
    }
    fprintf(stderr, "fringe %s stopped: lag %.0f operations in Prometheus\n", CL.id[stop_i], v);
    /* Its own target is down meanwhile (the stop is real). */
    snprintf(expr, sizeof(expr), "up{node=\"%s\"}", CL.id[stop_i]);
    assert_true(prom_wait(expr, is_zero, &v, 20));
    assert_int_equal(kill(CL.node[stop_i].pid, SIGCONT), 0);
    snprintf(expr, sizeof(expr), "sum(tessera_replica_lag_operations{replica=\"%s\"})",
             CL.id[stop_i]);
    if (!prom_wait(expr, is_zero, &v, 30))
        fail_msg("the fringe replica %s runs again, but its lag stayed %.0f", CL.id[stop_i], v);
    tessera_client_close(c);
}

static void test_killed_node_target_down(void **state)
{
    double v = -1;
    int k = N - 1;

    assert_true(prom_wait("up{node=\"n5\"}", is_positive, &v, 20));
    tsd_kill9(&CL.node[k]);
    if (!prom_wait("up{node=\"n5\"}", is_zero, &v, 20))
        fail_msg("n5 was killed, but its target is still up (%.0f)", v);
    assert_true(prom_query("count(up{job=\"tessera\"} == 1)", &v, NULL, NULL, 0) > 0);
    assert_int_equal((int)v, N - 1);
    /* Start it again for the teardown's clean stop. */
    assert_int_equal(tsd_start(&CL.node[k], NULL), 0);
}

/* `tessera top --prometheus URL` shows each rank's data stall as this real Prometheus computes
 * it (the job's target reports rank 3 stalling 0.25 s per second; while the query's 1 minute
 * window fills, Prometheus's rate climbs towards 0.25: top must show what Prometheus answers
 * around the same moment). */
static void test_top_shows_job_stalls_from_prometheus(void **state)
{
    static char out[1 << 16];
    const char *q = "sum by (rank) (rate(tessera_job_data_stall_seconds_total[1m]))";
    char url[100];
    double before = -1, after = -1, shown = -1;
    char *line;

    assert_true(prom_wait(q, is_positive, &before, 20));
    snprintf(url, sizeof(url), "http://%s", prom_addr);
    assert_true(prom_query(q, &before, NULL, NULL, 0) > 0);
    assert_int_equal(tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out),
                             "top --once --interval 0.3 --prometheus %s", url),
                     0);
    assert_true(prom_query(q, &after, NULL, NULL, 0) > 0);
    line = strstr(out, "rank 3");
    if (!line || sscanf(line, "rank 3 stalled %*f %% of the time (%lf s/s)", &shown) != 1)
        fail_msg("tessera top --prometheus shows no stall of rank 3:\n%s",
                 strstr(out, "JOB STALLS") ? strstr(out, "JOB STALLS") : out);
    fprintf(stderr, "rank 3: Prometheus %.3f then %.3f s/s, top shows %.3f\n", before, after,
            shown);
    assert_true(shown > 0);
    assert_true(shown >= (before < after ? before : after) - 0.002);
    assert_true(shown <= (before > after ? before : after) + 0.002);
}

/* metrics_tls: /metrics over TLS with the node's certificate (and a client certificate where
 * the node requires one); plain HTTP on that port gets nothing. curl is the client. */
static void test_metrics_over_tls(void **state)
{
    struct tsd_proc p;
    char cert[600], key[600], ca[600], cmd[4000];
    const char *extra[] = {"--tls-listen",
                           "127.0.0.1:0",
                           "--tls-cert",
                           cert,
                           "--tls-key",
                           key,
                           "--tls-ca",
                           ca,
                           "--metrics-listen",
                           "127.0.0.1:0",
                           "--metrics-tls",
                           "--tls-require-client-cert",
                           "--anonymous-role",
                           "none",
                           NULL};
    char addr[64] = "", line[1024];
    FILE *f;

    snprintf(cert, sizeof(cert), "%s", test_cert("node-n1", "pem"));
    snprintf(key, sizeof(key), "%s", test_cert("node-n1", "key"));
    snprintf(ca, sizeof(ca), "%s", test_cert("ca", "pem"));
    memset(&p, 0, sizeof(p));
    assert_int_equal(tsd_start(&p, extra), 0);
    f = fopen(p.log, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        char *m = strstr(line, " metrics=");
        if (strstr(line, "tesserad ready") && m)
            sscanf(m + 9, "%63s", addr);
    }
    fclose(f);
    assert_true(addr[0] && strcmp(addr, "-") != 0);
    /* With the test CA and a client certificate: the metrics. */
    snprintf(cmd, sizeof(cmd),
             "curl -sS --max-time 10 --cacert %s --cert %s --key %s https://%s/metrics | "
             "grep -q '^tessera_build_info'",
             ca, test_cert("reader", "pem"), test_cert("reader", "key"), addr);
    assert_int_equal(system(cmd), 0);
    /* Without a client certificate (the node requires one), or over plain HTTP: nothing. */
    snprintf(cmd, sizeof(cmd),
             "curl -s --max-time 10 --cacert %s https://%s/metrics | grep -q tessera_", ca, addr);
    assert_int_not_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "curl -s --max-time 10 http://%s/metrics | grep -q tessera_", addr);
    assert_int_not_equal(system(cmd), 0);
    assert_int_equal(tsd_stop(&p), 0);
    tsd_cleanup(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_node_serves_valid_metrics),
        cmocka_unit_test(test_read_bytes_and_hot_dataset),
        cmocka_unit_test(test_scrub_shows),
        cmocka_unit_test(test_fringe_lag_rises_and_returns),
        cmocka_unit_test(test_killed_node_target_down),
        cmocka_unit_test(test_top_shows_job_stalls_from_prometheus),
        cmocka_unit_test(test_metrics_over_tls),
    };
    return cmocka_run_group_tests_name("metrics", tests, setup, teardown);
}
