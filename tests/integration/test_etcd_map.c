/*
 * Nodes that follow the map in etcd (tesserad's `etcd` setting, server/etcd_map.c), with a real
 * 3-member etcd cluster and 3 real tesserad nodes (mutual TLS between them):
 *  - the first node to reach an empty etcd stores its map; all install what etcd holds;
 *  - `tessera --etcd ... map push FILE` changes it by compare-and-swap and every node installs it;
 *  - two admins pushing at once, 5 times each: one history in etcd (each epoch once, each the one
 *    before plus one), and every node ends on etcd's map;
 *  - a MAP_PUSH straight to a node, an admin's (the old way) or a peer node's, is refused and
 *    changes nothing: a node installs only maps etcd committed;
 *  - each node is registered under PREFIX/nodes/ID with a lease: kill -9 of a node, and its key
 *    is gone within the lease's TTL (2 s here; measured); started again, it is back;
 *  - one etcd member killed: a map change goes through, every node follows it, all reachable;
 *  - etcd's majority gone: writes and reads go on under the current map, no map change can be
 *    made, STATUS says etcd is unreachable; etcd back: changes go through again.
 */
#include "etcd_nodes.h"

#include "etcd.h"
#include "mapstore.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"
#include "ts_test.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PREFIX "/tessera/t"
#define PGS 8

static struct etcd_cluster E;
static struct tsd_cluster CL;
static char dir[600];

static ts_etcd *etcd_client(void)
{
    struct ts_etcd_opts o = {.endpoints = E.endpoints, .timeout_ms = 3000};
    ts_etcd *e = NULL;

    assert_int_equal(ts_etcd_open(&e, &o), 0);
    return e;
}

/* The epoch of the map node i has (MAP_GET), 0 when it cannot be read. */
static uint64_t node_epoch(int i)
{
    struct ts_map *m = raw_map_get(CL.node[i].addr);
    uint64_t epoch = m ? m->epoch : 0;

    ts_map_free(m);
    return epoch;
}

/* Waits up to ms for every node to have epoch; the time it took (ms), or -1. */
static long all_at(uint64_t epoch, int ms)
{
    uint64_t t0 = ts_now_mono_ns();

    for (int t = 0; t < ms / 50; t++) {
        int ok = 1;
        for (int i = 0; i < CL.n && ok; i++)
            ok = node_epoch(i) == epoch;
        if (ok)
            return (long)((ts_now_mono_ns() - t0) / 1000000);
        usleep(50 * 1000);
    }
    for (int i = 0; i < CL.n; i++)
        fprintf(stderr, "  n%d at epoch %llu (want %llu)\n", i + 1,
                (unsigned long long)node_epoch(i), (unsigned long long)epoch);
    return -1;
}

/* `tessera --etcd E --etcd-prefix PREFIX ARGS` (with the admin's TLS options, unused by a plain
 * etcd); its exit status, its output in out. */
static int etcd_cli(char *out, size_t cap, const char *args)
{
    char cmd[2048], line[512];
    size_t n = 0;
    FILE *p;
    int st;

    snprintf(cmd, sizeof(cmd), "%s --etcd %s --etcd-prefix %s %s 2>&1", TESSERA_CLI_PATH,
             E.endpoints, PREFIX, args);
    p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = '\0';
    while (fgets(line, sizeof(line), p))
        if (n + strlen(line) < cap) {
            memcpy(out + n, line, strlen(line) + 1);
            n += strlen(line);
        }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The cluster's map file with node n3's weight w, at path. */
static void map_file_with_weight(const char *path, unsigned w)
{
    struct ts_map *m = NULL;
    char err[256];

    assert_int_equal(ts_map_parse_file(CL.map_path, &m, err, sizeof(err)), 0);
    m->nodes[2].weight = w;
    assert_int_equal(ts_map_write_file(m, path), 0);
    ts_map_free(m);
}

static void test_nodes_follow_etcd(void **state)
{
    ts_etcd *e = etcd_client();
    struct ts_map *m = NULL;
    char path[700], out[4096];
    long ms;

    (void)state;
    /* A node stored its map; every node has epoch 1. */
    for (int t = 0; t < 100 && ts_mapstore_get(e, PREFIX, &m, NULL) != 0; t++)
        usleep(100 * 1000);
    assert_non_null(m);
    assert_true(m->epoch == 1 && m->n == 3);
    ts_map_free(m);
    assert_true(all_at(1, 10000) >= 0);

    snprintf(path, sizeof(path), "%s/w200.map", dir);
    map_file_with_weight(path, 200);
    {
        char args[800];
        snprintf(args, sizeof(args), "map push %s", path);
        assert_int_equal(etcd_cli(out, sizeof(out), args), 0);
    }
    assert_non_null(strstr(out, "at epoch 2"));
    ms = all_at(2, 10000);
    fprintf(stderr, "  epoch 2 pushed to etcd: on every node after %ld ms\n", ms);
    assert_true(ms >= 0);
    m = raw_map_get(CL.node[1].addr);
    assert_true(m && m->nodes[2].weight == 200);
    ts_map_free(m);
    assert_int_equal(etcd_cli(out, sizeof(out), "--json map show"), 0);
    assert_non_null(strstr(out, "\"epoch\": 2"));
    ts_etcd_close(e);
}

static void test_two_admins_one_history(void **state)
{
    ts_etcd *e = etcd_client();
    struct ts_map *m = NULL, *got;
    int64_t rev = 0;
    uint64_t start;
    char key[128];
    pid_t kid[2];
    int st;

    (void)state;
    assert_int_equal(ts_mapstore_get(e, PREFIX, &m, &rev), 0);
    start = m->epoch;
    ts_map_free(m);
    for (int k = 0; k < 2; k++) {
        kid[k] = fork();
        if (kid[k] == 0) {
            char path[700], out[4096], args[800];
            snprintf(path, sizeof(path), "%s/admin%d.map", dir, k);
            map_file_with_weight(path, 300 + (unsigned)k);
            snprintf(args, sizeof(args), "map push %s", path);
            for (int r = 0; r < 5; r++)
                if (etcd_cli(out, sizeof(out), args) != 0) {
                    fprintf(stderr, "admin %d: %s", k, out);
                    _exit(1);
                }
            _exit(0);
        }
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(waitpid(kid[k], &st, 0), kid[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    /* etcd's history from where it was: each revision the epoch after the one before. */
    for (uint64_t want = start; want <= start + 10; want++) {
        struct ts_etcd_kv kv;
        struct ts_rd r;
        int deleted;
        assert_int_equal(
            ts_etcd_watch(e, ts_mapstore_key(PREFIX, key, sizeof(key)), rev, 2000, &kv, &deleted),
            0);
        ts_rd_init(&r, kv.value, kv.len);
        assert_int_equal(ts_map_decode(&r, &got), 0);
        assert_true(got->epoch == want);
        rev = kv.mod_rev + 1;
        ts_map_free(got);
        ts_etcd_kv_free(&kv);
    }
    /* Every node on etcd's last map. */
    assert_true(all_at(start + 10, 15000) >= 0);
    assert_int_equal(ts_mapstore_get(e, PREFIX, &m, NULL), 0);
    for (int i = 0; i < CL.n; i++) {
        struct ts_map *n = raw_map_get(CL.node[i].addr);
        assert_non_null(n);
        assert_true(n->epoch == m->epoch && n->nodes[2].weight == m->nodes[2].weight);
        ts_map_free(n);
    }
    ts_map_free(m);
    ts_etcd_close(e);
}

static void test_admin_push_to_a_node_refused(void **state)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr), *next;
    uint64_t before = m->epoch;

    (void)state;
    next = ts_map_dup(m);
    next->epoch = m->epoch + 5;
    next->nodes[2].weight = 999;
    assert_int_equal(raw_map_push(CL.node[0].tls_addr, next), TS_EPERM);
    /* Nor from a peer node: a node installs only what etcd committed. */
    {
        int fd = raw_connect_as(CL.node[0].tls_addr, "node-n2");
        struct ts_wr w;
        ts_wr_init(&w);
        ts_map_encode(&w, next);
        assert_true(fd >= 0);
        assert_int_equal(raw_send_frame(fd, TS_OP_MAP_PUSH, 0, 1, w.buf, w.len), 0);
        assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), TS_EPERM);
        raw_close(fd);
        ts_wr_fini(&w);
    }
    usleep(300 * 1000);
    for (int i = 0; i < CL.n; i++)
        assert_true(node_epoch(i) == before);
    ts_map_free(next);
    ts_map_free(m);
}

/* Waits up to ms for node i's registration to be there (want 1) or gone (0); the ms it took. */
static long registered(ts_etcd *e, int i, int want, int ms)
{
    uint64_t t0 = ts_now_mono_ns();
    char key[64];

    snprintf(key, sizeof(key), PREFIX "/nodes/n%d", i + 1);
    for (int t = 0; t < ms / 50; t++) {
        struct ts_etcd_kv kv;
        int rc = ts_etcd_get(e, key, &kv, NULL);
        int there = rc == 0 && kv.lease != 0 &&
                    strstr((const char *)kv.value, key + strlen(PREFIX "/nodes/"));
        ts_etcd_kv_free(&kv);
        if (there == want)
            return (long)((ts_now_mono_ns() - t0) / 1000000);
        usleep(50 * 1000);
    }
    return -1;
}

static void test_registration_follows_liveness(void **state)
{
    ts_etcd *e = etcd_client();
    long ms;

    (void)state;
    for (int i = 0; i < CL.n; i++)
        assert_true(registered(e, i, 1, 5000) >= 0);
    tsd_kill9(&CL.node[2]);
    ms = registered(e, 2, 0, 10000);
    fprintf(stderr, "  n3 killed (-9): its registration gone after %ld ms (lease TTL 2 s)\n", ms);
    assert_true(ms >= 0 && ms <= 2000 + 1500);
    assert_true(registered(e, 0, 1, 100) >= 0 && registered(e, 1, 1, 100) >= 0);
    assert_int_equal(tsd_start(&CL.node[2], NULL), 0);
    ms = registered(e, 2, 1, 5000);
    fprintf(stderr, "  n3 started again: registered after %ld ms\n", ms);
    assert_true(ms >= 0);
    ts_etcd_close(e);
}

/* STATUS "etcd": {"reachable": ...} of node i, as 1/0, or -1 when absent. */
/* What node i's STATUS says of etcd: reachable 1 or 0, or -1 (no status, or no such field).
 * Shows the node's "etcd" object (its last error among it) on one line: a poll that never gets
 * what it waits for says why. */
static int etcd_reachable(int i)
{
    char out[65536];
    json_object *j, *o = NULL, *r;
    int v = -1, st;
    const char *brace;

    st = tsd_cli_quiet(&CL, TESSERA_CLI_PATH, out, sizeof(out), "--json status --node n%d", i + 1);
    brace = st == 0 ? strchr(out, '{') : NULL;
    j = brace ? json_tokener_parse(brace) : NULL;
    if (j && json_object_object_get_ex(j, "etcd", &o) &&
        json_object_object_get_ex(o, "reachable", &r))
        v = json_object_get_boolean(r);
    if (o)
        fprintf(stderr, "  n%d etcd: %s\n", i + 1,
                json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    else
        fprintf(stderr, "  n%d status (exit %d, %zu bytes): %.300s\n", i + 1, st, strlen(out), out);
    json_object_put(j);
    return v;
}

static void test_etcd_member_then_majority_gone(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    struct tessera_opts o;
    tessera_client *c = NULL;
    char path[700], out[4096], args[800];
    uint64_t before = node_epoch(0);
    uint8_t buf[4096], back[4096];
    size_t n;
    int down = 0, rc = -1;

    (void)state;
    tsd_client_opts(&o, &CL.node[0], "admin");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, "d", &p), 0);
    /* One member of three gone: nothing changes for the nodes; a map change goes through and
     * every node follows it. */
    etcd_member_kill(&E, 0);
    snprintf(path, sizeof(path), "%s/w400.map", dir);
    map_file_with_weight(path, 400);
    snprintf(args, sizeof(args), "--timeout 3000 map push %s", path);
    rc = etcd_cli(out, sizeof(out), args);
    if (rc)
        fprintf(stderr, "  push with one member gone: %s", out);
    assert_int_equal(rc, 0);
    rc = -1;
    assert_true(all_at(before + 1, 15000) >= 0);
    for (int i = 0; i < CL.n; i++) {
        int up = 0;
        for (int t = 0; t < 80 && up != 1; t++) /* moving to another member: 20 s at most */
            if ((up = etcd_reachable(i)) != 1)
                usleep(250 * 1000);
        assert_int_equal(up, 1);
    }
    fprintf(stderr,
            "  one etcd member killed: map epoch %llu pushed, every node on it, all "
            "reachable\n",
            (unsigned long long)before + 1);
    before++;
    etcd_member_kill(&E, 1);
    /* The data path goes on under the current map. */
    memset(buf, 7, sizeof(buf));
    assert_int_equal(tessera_put(c, "d", 1, buf, sizeof(buf), NULL, 0), 0);
    assert_int_equal(tessera_read(c, "d", 1, 0, sizeof(back), back, &n), 0);
    assert_true(n == sizeof(buf) && !memcmp(buf, back, n));
    /* No map change; status says etcd is unreachable. */
    snprintf(path, sizeof(path), "%s/w500.map", dir);
    map_file_with_weight(path, 500);
    snprintf(args, sizeof(args), "--timeout 1500 map push %s", path);
    assert_int_not_equal(etcd_cli(out, sizeof(out), args), 0);
    fprintf(stderr, "  push with etcd's majority gone: %s", out);
    for (int t = 0; t < 80 && !down; t++) {
        down = etcd_reachable(1) == 0;
        if (!down)
            usleep(250 * 1000);
    }
    assert_true(down);
    for (int i = 0; i < CL.n; i++)
        assert_true(node_epoch(i) == before);
    /* etcd back: changes go through, the nodes follow. */
    assert_int_equal(etcd_member_start(&E, 0), 0);
    assert_int_equal(etcd_member_start(&E, 1), 0);
    for (int t = 0; t < 50 && rc; t++) {
        rc = etcd_cli(out, sizeof(out), args);
        if (rc)
            usleep(200 * 1000);
    }
    assert_int_equal(rc, 0);
    assert_true(all_at(before + 1, 15000) >= 0);
    assert_int_equal(etcd_reachable(1), 1);
    memset(back, 0, sizeof(back));
    assert_int_equal(tessera_read(c, "d", 1, 0, sizeof(back), back, &n), 0);
    assert_true(n == sizeof(buf) && !memcmp(buf, back, n));
    tessera_client_close(c);
}

static int setup(void **state)
{
    char *tmp;
    int rc;

    (void)state;
    rc = etcd_cluster_start(&E, 3, 0);
    if (rc)
        return rc == 77 ? -1 : rc;
    tmp = ts_test_tmpdir("etcd-map");
    snprintf(dir, sizeof(dir), "%s", tmp);
    free(tmp);
    rc = etcd_nodes_start(&CL, 3, PGS, &E, PREFIX, NULL);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    return etcd_nodes_stop(&CL, &E, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_follow_etcd),
        cmocka_unit_test(test_two_admins_one_history),
        cmocka_unit_test(test_admin_push_to_a_node_refused),
        cmocka_unit_test(test_registration_follows_liveness),
        cmocka_unit_test(test_etcd_member_then_majority_gone),
    };

    return etcd_run_group("test_etcd_map", "etcd map", tests, TS_ARRAY_SIZE(tests), setup, teardown,
                          &CL);
}
