/*
 * The anomaly finder of `tessera top` and `tessera status` (client/cli/cli_anomaly.c) over
 * synthetic STATUS documents: each anomaly is found when present and not when absent; and the
 * pieces of `top` that need no server: its frame (cli_top_draw.c) and the Prometheus reply's
 * parse (cli_top_prom.c).
 */
#include "ts_test.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_anomaly.h"
#include "cli_top.h"
#include "tessera/errno.h"

/* A healthy node's STATUS, as server/ops_status.c writes it (the members the finder reads). */
static const char *const HEALTHY =
    "{\"node\":\"%s\",\"connections\":2,"
    "\"disk\":{\"total_bytes\":1000000,\"free_bytes\":500000,\"writes_refused\":false,"
    "\"wal_damage_found_ns\":0},"
    "\"stats\":{\"requests\":10,\"read_bytes\":100,\"bytes_in\":0,\"corrupt_chunks\":0},"
    "\"cache\":{\"hits\":1,\"misses\":1},"
    "\"cluster\":{\"epoch\":3,\"pg_count\":8},"
    "\"replication\":{\"primary_pgs\":3,\"pgs_active\":3,\"pgs_peering\":0,\"peering\":[],"
    "\"replicas\":{\"x2\":{\"pgs\":3,\"core_pgs\":3,\"lag_ops\":0,\"lag_bytes\":0,"
    "\"max_lag_s\":0.0,\"recovering_pgs\":0}},\"lag\":[]}}";

#define N 3
static struct json_object *doc[N];
static struct cli_node_obs obs[N];
static const char *const ids[N] = {"n1", "n2", "n3"};

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++) {
        char buf[2048];
        snprintf(buf, sizeof(buf), HEALTHY, ids[i]);
        doc[i] = json_tokener_parse(buf);
        assert_non_null(doc[i]);
        memset(&obs[i], 0, sizeof(obs[i]));
        obs[i].id = ids[i];
        obs[i].map_state = "up";
        obs[i].status = doc[i];
        obs[i].read_bps = obs[i].write_bps = obs[i].req_ps = -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++)
        json_object_put(doc[i]);
    return 0;
}

/* Sets member path (dotted) of node i's document to the JSON text v. */
static void set(int i, const char *path, const char *v)
{
    char parent[128], *dot;
    struct json_object *o = doc[i];

    snprintf(parent, sizeof(parent), "%s", path);
    dot = strrchr(parent, '.');
    if (dot) {
        *dot = '\0';
        o = cli_json_get(doc[i], parent);
        assert_non_null(o);
    }
    json_object_object_add(o, dot ? dot + 1 : parent, json_tokener_parse(v));
}

static struct cli_anomaly an[32];

static size_t find(void)
{
    return cli_anomalies(obs, N, NULL, an, 32);
}

/* How many of the anomalies found are of kind k; the first one's text in *text. */
static int count(size_t n, enum cli_anomaly_kind k, const char **text)
{
    int c = 0;
    for (size_t i = 0; i < n && i < 32; i++)
        if (an[i].kind == k) {
            if (!c && text)
                *text = an[i].text;
            c++;
        }
    return c;
}

static void test_healthy_has_none(void **state)
{
    (void)state;
    assert_int_equal(find(), 0);
    assert_string_equal(cli_anomaly_kind_name(CLI_AN_NODE_DOWN), "node-down");
    assert_string_equal(cli_anomaly_kind_name(CLI_AN_WAL_DAMAGE), "wal-damage");
}

static void test_node_down_and_silent(void **state)
{
    const char *t = NULL;
    (void)state;
    obs[1].status = NULL;
    obs[1].error = "connection refused";
    obs[1].silent_s = 3;
    assert_int_equal(count(find(), CLI_AN_NODE_SILENT, &t), 1);
    assert_non_null(strstr(t, "n2: up in the map but not answering for 3.0 s: connection refused"));
    obs[1].map_state = "down";
    assert_int_equal(count(find(), CLI_AN_NODE_DOWN, &t), 1);
    assert_non_null(strstr(t, "n2: down in the map"));
    assert_int_equal(count(find(), CLI_AN_NODE_SILENT, NULL), 0); /* expected not to answer */
    obs[1].map_state = "out";
    assert_int_equal(find(), 0); /* drained on purpose */
    obs[1].map_state = NULL;     /* a single node */
    assert_int_equal(count(find(), CLI_AN_NODE_SILENT, &t), 1);
    assert_non_null(strstr(t, "n2: not answering"));
}

static void test_pg_not_active(void **state)
{
    const char *t = NULL;
    (void)state;
    set(0, "replication.peering",
        "[{\"pg\":5,\"state\":\"peering\",\"epoch\":3,\"since_s\":0.5,\"why\":\"waiting\"}]");
    assert_int_equal(find(), 0); /* brief peering is normal */
    set(0, "replication.peering",
        "[{\"pg\":5,\"state\":\"peering\",\"epoch\":3,\"since_s\":12.5,\"why\":\"needs n3\"}]");
    assert_int_equal(count(find(), CLI_AN_PG_INACTIVE, &t), 1);
    assert_string_equal(t, "PG 5: not active on n1 (peering) for 12.5 s: needs n3");
}

static void test_replica_lag(void **state)
{
    const char *t = NULL;
    (void)state;
    set(0, "replication.replicas",
        "{\"n2\":{\"lag_ops\":12,\"lag_bytes\":1000,\"max_lag_s\":0.4,\"recovering_pgs\":0}}");
    assert_int_equal(find(), 0); /* a little behind: normal */
    set(0, "replication.replicas",
        "{\"n2\":{\"lag_ops\":12,\"lag_bytes\":1000,\"max_lag_s\":7.5,\"recovering_pgs\":0}}");
    assert_int_equal(count(find(), CLI_AN_REPLICA_LAG, &t), 1);
    assert_non_null(strstr(t, "n2: replica of PGs led by n1 lags 12 ops"));
    assert_null(strstr(t, "recovering"));
    set(0, "replication.replicas",
        "{\"n3\":{\"lag_ops\":5000,\"lag_bytes\":1000,\"max_lag_s\":0.1,\"recovering_pgs\":2}}");
    assert_int_equal(count(find(), CLI_AN_REPLICA_LAG, &t), 1);
    assert_non_null(strstr(t, "(recovering 2 PGs)"));
    set(0, "replication.replicas",
        "{\"n3\":{\"lag_ops\":1,\"lag_bytes\":300000000,\"max_lag_s\":0.1,\"recovering_pgs\":0}}");
    assert_int_equal(count(find(), CLI_AN_REPLICA_LAG, NULL), 1);
}

static void test_disk_full(void **state)
{
    const char *t = NULL;
    (void)state;
    set(2, "disk.free_bytes", "120000"); /* 12 % */
    assert_int_equal(find(), 0);
    set(2, "disk.free_bytes", "80000"); /* 8 % */
    assert_int_equal(count(find(), CLI_AN_DISK_FULL, &t), 1);
    assert_string_equal(t, "n3: disk nearly full: 8.0 % free (below 10 %)");
    set(2, "disk.free_bytes", "500000");
    set(2, "disk.writes_refused", "true");
    assert_int_equal(count(find(), CLI_AN_DISK_FULL, &t), 1);
    assert_non_null(strstr(t, "writes refused"));
}

static void test_checksum_failures(void **state)
{
    const char *t = NULL;
    (void)state;
    set(1, "stats.corrupt_chunks", "0");
    assert_int_equal(find(), 0);
    set(1, "stats.corrupt_chunks", "3");
    assert_int_equal(count(find(), CLI_AN_CORRUPT, &t), 1);
    assert_non_null(strstr(t, "n2: 3 checksum failures"));
}

static void test_wal_damage(void **state)
{
    const char *t = NULL;
    (void)state;
    set(0, "disk.wal_damage_found_ns", "1700000000000000000");
    assert_int_equal(count(find(), CLI_AN_WAL_DAMAGE, &t), 1);
    assert_non_null(strstr(t, "n1: a damaged WAL"));
}

static void test_hot_pg(void **state)
{
    const char *t = NULL;
    (void)state;
    /* Even reads: no PG stands out. */
    set(0, "hot",
        "{\"window_s\":60,\"pgs\":[{\"pg\":1,\"bytes_per_s\":2000000},"
        "{\"pg\":2,\"bytes_per_s\":2100000},{\"pg\":3,\"bytes_per_s\":1900000}]}");
    assert_int_equal(find(), 0);
    /* PG 4 read 40x the median, its reads spread over two replicas (summed). */
    set(0, "hot",
        "{\"window_s\":60,\"pgs\":[{\"pg\":1,\"bytes_per_s\":1000000},"
        "{\"pg\":2,\"bytes_per_s\":1000000},{\"pg\":3,\"bytes_per_s\":1000000},"
        "{\"pg\":4,\"bytes_per_s\":20000000}]}");
    set(1, "hot", "{\"window_s\":60,\"pgs\":[{\"pg\":4,\"bytes_per_s\":20000000}]}");
    assert_int_equal(count(find(), CLI_AN_HOT_PG, &t), 1);
    assert_non_null(strstr(t, "PG 4: read at 38.1 MiB/s, 40x the median PG"));
    /* Far above the median but slow: not worth a line. */
    set(0, "hot",
        "{\"pgs\":[{\"pg\":1,\"bytes_per_s\":10},{\"pg\":2,\"bytes_per_s\":10},"
        "{\"pg\":3,\"bytes_per_s\":10},{\"pg\":4,\"bytes_per_s\":5000}]}");
    json_object_object_del(doc[1], "hot");
    assert_int_equal(count(find(), CLI_AN_HOT_PG, NULL), 0);
}

static void test_read_skew(void **state)
{
    const char *t = NULL;
    (void)state;
    obs[0].read_bps = 10e6;
    obs[1].read_bps = 10e6;
    obs[2].read_bps = 12e6;
    assert_int_equal(find(), 0);
    obs[2].read_bps = 100e6; /* mean 40 MB/s, 2.5x */
    assert_int_equal(count(find(), CLI_AN_READ_SKEW, &t), 1);
    assert_non_null(strstr(t, "n3: serves 95.4 MiB/s of reads, 2.5x the mean of 3 nodes"));
    /* Too little traffic to call it skew. */
    obs[0].read_bps = 0;
    obs[1].read_bps = 0;
    obs[2].read_bps = 1000;
    assert_int_equal(find(), 0);
    /* Without measured rates (`status`): the "hot" datasets' rates stand in. */
    for (int i = 0; i < N; i++)
        obs[i].read_bps = -1;
    set(0, "hot", "{\"datasets\":[{\"name\":\"d\",\"bytes_per_s\":90000000}]}");
    set(1, "hot", "{\"datasets\":[{\"name\":\"d\",\"bytes_per_s\":1000000}]}");
    set(2, "hot", "{\"datasets\":[]}");
    assert_int_equal(count(find(), CLI_AN_READ_SKEW, &t), 1);
    assert_non_null(strstr(t, "n1: serves"));
}

static void test_more_than_cap_are_counted(void **state)
{
    struct cli_anomaly one[1];
    (void)state;
    set(0, "stats.corrupt_chunks", "1");
    set(1, "stats.corrupt_chunks", "1");
    set(2, "disk.writes_refused", "true");
    assert_int_equal(cli_anomalies(obs, N, NULL, one, 1), 3);
    assert_int_equal(one[0].kind, CLI_AN_DISK_FULL);
    assert_int_equal(cli_anomalies(obs, N, NULL, NULL, 0), 3);
}

/* ---- top's frame and the Prometheus reply ---------------------------------------------------- */

static char *render(struct cli_top_view *v)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    cli_top_render(v, f);
    fclose(f);
    return buf;
}

static void test_top_frame(void **state)
{
    struct cli_top_view v;
    double hit[N] = {50, -1, 100};
    char *s;
    size_t nan;
    (void)state;
    set(0, "hot",
        "{\"window_s\":60,\"datasets\":[{\"name\":\"cold\",\"reads\":1,\"read_bytes\":10,"
        "\"bytes_per_s\":1},{\"name\":\"imagenet\",\"reads\":900,\"read_bytes\":90000000,"
        "\"bytes_per_s\":3145728}],\"pgs\":[{\"pg\":7,\"bytes_per_s\":3145728,"
        "\"reads_per_s\":15}],\"shards\":[{\"dataset\":\"imagenet\",\"shard\":4,"
        "\"bytes_per_s\":3145728}]}");
    obs[1].status = NULL;
    obs[1].error = "connection refused (TS_ECONNREFUSED)";
    obs[0].read_bps = 3145728;
    obs[2].read_bps = 0;
    nan = cli_anomalies(obs, N, NULL, an, 32);
    memset(&v, 0, sizeof(v));
    v.server = "127.0.0.1:7070";
    v.clock = "12:00:00";
    v.interval_s = 1;
    v.map_epoch = 3;
    v.pg_count = 8;
    v.rates = 1;
    v.nodes = obs;
    v.hit_pct = hit;
    v.n = N;
    v.an = an;
    v.nan = nan;
    v.nan_kept = nan;
    v.cols = 120;
    s = render(&v);
    fputs(s, stderr);
    assert_non_null(strstr(s, "nodes 2 up, 1 down of 3; read 3.0 MiB/s"));
    assert_non_null(strstr(s, "n2         DOWN"));
    assert_non_null(strstr(s, "HOTTEST DATASETS (last 60 s)"));
    /* the hottest first */
    assert_true(strstr(s, "imagenet") < strstr(s, "cold"));
    assert_non_null(strstr(s, "imagenet/4"));
    assert_non_null(strstr(s, "--prometheus"));
    assert_non_null(strstr(s, "ANOMALIES (1)"));
    assert_non_null(strstr(s, "! n2: up in the map but not answering"));
    free(s);
    /* 80x24: no line wider, no more lines, the anomalies still there */
    v.cols = 80;
    v.rows = 24;
    s = render(&v);
    {
        int lines = 0;
        for (char *p = s, *e; *p; p = e + 1, lines++) {
            e = strchr(p, '\n');
            assert_non_null(e);
            assert_true(e - p <= 80);
        }
        assert_true(lines <= 24);
    }
    assert_non_null(strstr(s, "! n2: up in the map"));
    free(s);
}

static void test_prom_parse(void **state)
{
    struct cli_top_stall st[4];
    size_t n = 0;
    char err[128];
    (void)state;
    assert_int_equal(cli_prom_parse_stalls(
                         "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
                         "{\"metric\":{\"rank\":\"0\"},\"value\":[1700000000.1,\"0.05\"]},"
                         "{\"metric\":{\"rank\":\"1\"},\"value\":[1700000000.1,\"0.5\"]}]}}",
                         st, 4, &n, err, sizeof(err)),
                     0);
    assert_int_equal(n, 2);
    assert_string_equal(st[0].rank, "1");
    assert_true(st[0].stall_per_s > 0.49 && st[0].stall_per_s < 0.51);
    assert_int_equal(cli_prom_parse_stalls("{\"status\":\"error\",\"error\":\"bad query\"}", st, 4,
                                           &n, err, sizeof(err)),
                     TS_EPROTO);
    assert_non_null(strstr(err, "bad query"));
    assert_int_equal(cli_prom_parse_stalls("<html>", st, 4, &n, err, sizeof(err)), TS_EPROTO);
    /* no Prometheus there: an error in words, quickly */
    {
        char *body = NULL;
        assert_int_equal(cli_prom_query("ftp://x", "up", 100, &body, err, sizeof(err)), TS_EINVAL);
        assert_int_not_equal(
            cli_prom_query("http://127.0.0.1:1", "up", 500, &body, err, sizeof(err)), 0);
        assert_null(body);
    }
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_healthy_has_none), T(test_node_down_and_silent),
        T(test_pg_not_active),    T(test_replica_lag),
        T(test_disk_full),        T(test_checksum_failures),
        T(test_wal_damage),       T(test_hot_pg),
        T(test_read_skew),        T(test_more_than_cap_are_counted),
        T(test_top_frame),        T(test_prom_parse),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
