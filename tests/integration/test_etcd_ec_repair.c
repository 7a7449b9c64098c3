/*
 * Erasure-coded datasets repaired without an operator (issue 33): a real 3-member etcd, 7 real
 * nodes following it (lease TTL 2 s, down_after 2.5 s, out_after 8 s) and an elected `tessera
 * monitor`. A sealed dataset is tiered to ec:4+2; then no repair command is typed:
 *
 * - a byte flipped in a fragment's chunk file on disk, found by a scrub: the monitor rebuilds the
 *   chunk from the other fragments and the node writes it back (the file's byte is the original
 *   again);
 * - the same found by a read (the node restarted, its cache gone, the shard read through its
 *   fragments);
 * - a node holding fragments killed (-9): marked down, then out, by the nodes' monitor; its
 *   positions move, and the elected monitor rebuilds their fragments on the new nodes. Proof:
 *   two more nodes of a moved shard are killed and every shard still reads byte for byte (with
 *   the moved fragments missing that would be three fragments gone of six, one more than M).
 *
 * - a reader asking for 100 fragments that were never there: its node notes 32 (half its
 *   table), and the monitor looks each up once and leaves it.
 *
 * Each repair's log line gives the time to full redundancy.
 */
#include "etcd_nodes.h"

#include "etcd.h"
#include "mapstore.h"

#include "client_internal.h"
#include "cluster_internal.h"
#include "conn.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_ec.h"
#include "ts_map.h"
#include "ts_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PREFIX "/tessera/ec"
#define K 4
#define M 2
#define NODES 7
#define NSHARDS 4
/* Distinct lengths: each fragment's chunk file is found on its node by its size. */
static const size_t LENS[NSHARDS] = {700000, (3u << 20) + 40000, (2u << 20) + 777, 1234567};

static struct etcd_cluster E;
static struct tsd_cluster CL;
static ts_etcd *ETCD;
static char dir[600], out[1 << 16];
static pid_t mon = -1;

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 11);
}

static struct ts_map *etcd_map(void)
{
    struct ts_map *m = NULL;

    assert_int_equal(ts_mapstore_get(ETCD, PREFIX, &m, NULL), 0);
    return m;
}

/* The cluster index of the node at EC position f of shard s in etcd's map. */
static int at_position(uint32_t s, unsigned f)
{
    struct ts_map *m = etcd_map();
    int ord[K + M], i;

    assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "cold", s), ord, K + M), K + M);
    i = tsd_cluster_find(&CL, m->nodes[ord[f]].id);
    ts_map_free(m);
    return i;
}

static char *monitor_log(void)
{
    static char buf[1 << 16];
    char path[700];
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "%s/monitor.log", dir);
    buf[0] = '\0';
    f = fopen(path, "r");
    if (!f)
        return buf;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The monitor's log line containing what (after byte from), or NULL within secs. */
static const char *wait_log(const char *what, size_t from, int secs)
{
    for (int t = 0; t < secs * 5; t++) {
        char *log = monitor_log();
        const char *p = strlen(log) > from ? strstr(log + from, what) : NULL;
        if (p) {
            static char line[1024];
            const char *b = p, *e = strchr(p, '\n');
            while (b > log && b[-1] != '\n')
                b--;
            snprintf(line, sizeof(line), "%.*s", (int)((e ? e : p + strlen(p)) - b), b);
            return line;
        }
        usleep(200 * 1000);
    }
    return NULL;
}

static uint8_t byte_at(const char *path, off_t off)
{
    uint8_t x = 0;
    int fd = open(path, O_RDONLY);

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &x, 1, off), 1);
    close(fd);
    return x;
}

/* Flips the byte at off of fragment f of shard s on its node's disk; the original byte. */
static uint8_t flip(uint32_t s, unsigned f, off_t off, char *path, size_t cap, int *node)
{
    struct ts_ec_layout l;
    uint8_t x, orig;
    int fd;

    assert_int_equal(ts_ec_layout_for(&l, K, M, LENS[s]), 0);
    *node = at_position(s, f);
    assert_int_equal(
        tsd_chunk_files_of_size(CL.node[*node].data, (off_t)ts_ec_frag_len(&l, f), path, cap), 1);
    orig = x = byte_at(path, off);
    x ^= 0x40;
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &x, 1, off), 1);
    close(fd);
    fprintf(stderr, "  flipped byte %lld of %s/%u's fragment %u on %s (%s)\n", (long long)off,
            "cold", s, f, CL.id[*node], path);
    return orig;
}

/* Seconds until the byte at off of path is want again, or -1 after secs. */
static double wait_byte(const char *path, off_t off, uint8_t want, int secs)
{
    uint64_t t0 = ts_now_mono_ns();

    for (int t = 0; t < secs * 5; t++) {
        if (byte_at(path, off) == want)
            return (double)(ts_now_mono_ns() - t0) / 1e9;
        usleep(200 * 1000);
    }
    return -1;
}

static tessera_client *admin(void)
{
    tessera_client *c = NULL;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "admin", NULL, NULL), 0);
    return c;
}

/* Every shard read whole through its fragments, byte for byte: how many failed. */
static int read_all(uint64_t *rebuilt)
{
    tessera_client *c = admin();
    int bad = 0;

    *rebuilt = 0;
    for (uint32_t s = 0; s < NSHARDS; s++) {
        uint8_t *want = malloc(LENS[s]), *got = malloc(LENS[s]);
        struct ts_ec_read_stats st;
        int rc;
        fill(want, LENS[s], 900 + s);
        rc = ts_cl_ec_read(c, c->cl, "cold", s, LENS[s], K, M, 0, LENS[s], got, &st);
        if (rc == 0 && memcmp(got, want, LENS[s]) != 0)
            rc = TS_ECORRUPT;
        if (rc) {
            fprintf(stderr, "  cold/%u: %s: %s\n", s, ts_errname(rc), tessera_client_error(c));
            bad++;
        }
        *rebuilt += st.rebuilt;
        free(want);
        free(got);
    }
    tessera_client_close(c);
    return bad;
}

static void test_damage_repaired_by_itself(void **state)
{
    const char *line;
    char path[1600];
    uint8_t orig;
    uint64_t rebuilt;
    size_t from;
    double secs;
    int i;

    (void)state;
    assert_non_null(wait_log("EC repair: full redundancy at map epoch", 0, 30));

    /* Found by a scrub: byte 300000 of shard 1's fragment 1 (its second 256 KiB chunk). */
    from = strlen(monitor_log());
    orig = flip(1, 1, 300000, path, sizeof(path), &i);
    assert_int_not_equal(cli("scrub"), 0); /* the fault happened: the scrub found it */
    assert_non_null(strstr(out, "corrupt: dataset cold#1 shard 1 chunk 1"));
    secs = wait_byte(path, 300000, orig, 30);
    fprintf(stderr, "  scrub found it; the byte on disk is the original again after %.1f s\n",
            secs);
    assert_true(secs >= 0);
    line = wait_log("found damaged on", from, 5);
    assert_non_null(line);
    fprintf(stderr, "  monitor: %s\n", line);
    assert_non_null(strstr(line, CL.id[i]));
    assert_true(raw_status_has(CL.node[i].addr, "\"ec_repair_wanted\":[]"));

    /* Found by a read: byte 4097 of shard 2's fragment 0, its node restarted (cache gone). */
    from = strlen(monitor_log());
    orig = flip(2, 0, 4097, path, sizeof(path), &i);
    assert_int_equal(tsd_stop(&CL.node[i]), 0);
    assert_int_equal(tsd_start(&CL.node[i], NULL), 0);
    assert_int_equal(read_all(&rebuilt), 0);
    fprintf(stderr, "  every shard read: %llu pieces rebuilt\n", (unsigned long long)rebuilt);
    assert_true(rebuilt >= 1); /* the fault happened: the read found the damaged chunk */
    secs = wait_byte(path, 4097, orig, 30);
    fprintf(stderr, "  the read found it; the byte on disk is the original again after %.1f s\n",
            secs);
    assert_true(secs >= 0);
    fprintf(stderr, "  monitor: %s\n", wait_log("found damaged on", from, 5));
    assert_int_equal(read_all(&rebuilt), 0);
    assert_int_equal(rebuilt, 0); /* every read straight again */
}

/* How many times what occurs in s. */
static int occurrences(const char *s, const char *what)
{
    int n = 0;

    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/*
 * A reader asking for fragments that do not exist (100 shards that are not there) makes a node
 * note them, but no more than half its table's 64 (damaged chunks keep their room), and the
 * monitor looks each up once and leaves it: no repair, no retry every round.
 */
static void test_missing_fragments_asked_for(void **state)
{
    static uint8_t buf[4096];
    tessera_client *c;
    char *json = NULL;
    size_t from = strlen(monitor_log()), len;
    int listed;

    (void)state;
    struct ts_map *m = etcd_map();
    int asked = 0;

    /* Shards 1000.. do not exist; each asked for at the position n4 holds in its PG's order
     * (a node notes only fragments of positions it holds). */
    for (uint32_t s = 1000; asked < 100; s++) {
        int ord[K + M];
        char frag[32];
        assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "cold", s), ord, K + M), K + M);
        for (unsigned f = 0; f < K + M; f++)
            if (tsd_cluster_find(&CL, m->nodes[ord[f]].id) == 3) {
                snprintf(frag, sizeof(frag), "cold#%u", f);
                assert_int_equal(raw_read_shard(CL.node[3].addr, frag, s, sizeof(buf), buf, &len),
                                 TS_ENOENT);
                asked++;
            }
    }
    ts_map_free(m);
    c = admin();
    assert_int_equal(ts_client_node_status(c, 3, &json), 0);
    listed = occurrences(json, "\"chunk\":-1");
    free(json);
    tessera_client_close(c);
    fprintf(stderr, "  100 missing fragments asked for on %s: %d listed in its STATUS\n", CL.id[3],
            listed);
    assert_int_equal(listed, 32); /* at most half the table: damaged chunks keep their room */
    assert_non_null(wait_log("no such shard of the dataset", from, 10));
    sleep(6); /* three of the monitor's rounds */
    listed = occurrences(monitor_log() + from, "no such shard of the dataset");
    fprintf(stderr, "  the monitor looked each up once: %d lines\n", listed);
    assert_int_equal(listed, 32);
}

static void test_node_out_rebuilt_elsewhere(void **state)
{
    int ord_before[K + M], victim = -1, extra[2] = {-1, -1}, moved = -1;
    const char *line;
    struct ts_map *m;
    uint64_t rebuilt, t0;
    size_t from = strlen(monitor_log());

    (void)state;
    /* The victim: the node at shard 0's position 2 (never node 0: the monitor's and CLI's). */
    for (unsigned f = 0; f < K + M; f++)
        ord_before[f] = at_position(0, f);
    for (unsigned f = 2; victim <= 0; f = (f + 1) % (K + M))
        victim = ord_before[f];
    t0 = ts_now_mono_ns();
    tsd_kill9(&CL.node[victim]);
    fprintf(stderr, "  %s (holding fragments) killed (-9); no command typed\n", CL.id[victim]);
    for (int t = 0; t < 600; t++) {
        int st = -1;
        m = etcd_map();
        for (size_t n = 0; n < m->n; n++)
            if (!strcmp(m->nodes[n].id, CL.id[victim]))
                st = m->nodes[n].state;
        ts_map_free(m);
        if (st == TS_NODE_OUT)
            break;
        usleep(100 * 1000);
    }
    fprintf(stderr, "  marked out after %.1f s\n", (double)(ts_now_mono_ns() - t0) / 1e9);
    line = wait_log("EC repair: full redundancy at map epoch", from, 60);
    assert_non_null(line);
    fprintf(stderr, "  monitor: %s\n", line);
    assert_null(strstr(line, " 0 fragments rebuilt")); /* the fault happened: some moved */

    /* Shard 0's positions now: which moved, and two others (not node 0) to kill. */
    for (unsigned f = 0; f < K + M; f++) {
        int now = at_position(0, f);
        assert_int_not_equal(now, victim);
        if (now != ord_before[f])
            moved = now;
    }
    assert_true(moved >= 0);
    for (unsigned f = 0, k = 0; f < K + M && k < 2; f++) {
        int n = at_position(0, f);
        if (n != 0 && n != moved)
            extra[k++] = n;
    }
    assert_true(extra[1] >= 0);
    tsd_kill9(&CL.node[extra[0]]);
    tsd_kill9(&CL.node[extra[1]]);
    fprintf(stderr, "  %s and %s killed too (-9): shard 0 has 4 of its 6 fragments, %s's rebuilt\n",
            CL.id[extra[0]], CL.id[extra[1]], CL.id[moved]);
    assert_int_equal(read_all(&rebuilt), 0);
    fprintf(stderr, "  every shard read byte for byte (%llu pieces rebuilt)\n",
            (unsigned long long)rebuilt);
    assert_true(rebuilt > 0);
}

static int setup(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 256u << 10, 0, 0, 0, 0};
    const char *const more[] = {ETCD_QUICK_MONITOR, "--monitor-out-after-ms", "8000", NULL};
    tessera_client *c = NULL;
    char log[700], *tmp;
    int rc;

    (void)state;
    if (etcd_cluster_start(&E, 3, 0) != 0 || etcd_client_open(&ETCD, &E) != 0)
        return -1;
    tmp = ts_test_tmpdir("etcd-ec-repair");
    snprintf(dir, sizeof(dir), "%s", tmp);
    free(tmp);
    rc = etcd_nodes_start(&CL, NODES, 16, &E, PREFIX, more);
    if (rc)
        return rc;
    c = admin();
    if (tessera_dataset_create(c, "cold", &p) != 0)
        return -1;
    for (uint32_t s = 0; s < NSHARDS; s++) {
        uint8_t *buf = malloc(LENS[s]);
        fill(buf, LENS[s], 900 + s);
        rc = tessera_put(c, "cold", s, buf, LENS[s], NULL, 0);
        free(buf);
        if (rc)
            return -1;
    }
    if (tessera_dataset_seal(c, "cold") != 0)
        return -1;
    tessera_client_close(c);
    if (cli("dataset tier cold ec:4+2") != 0)
        return -1;
    snprintf(log, sizeof(log), "%s/monitor.log", dir);
    mon = etcd_monitor_start(&E, PREFIX, CL.tls_listen[0], log);
    return mon > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[800];

    (void)state;
    snprintf(cmd, sizeof(cmd), "tail -n 20 %s/monitor.log >&2", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "(no monitor log)\n");
    etcd_monitor_stop(mon);
    ts_etcd_close(ETCD);
    return etcd_nodes_stop(&CL, &E, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_damage_repaired_by_itself),
        cmocka_unit_test(test_missing_fragments_asked_for),
        cmocka_unit_test(test_node_out_rebuilt_elsewhere),
    };

    return etcd_run_group("test_etcd_ec_repair", "etcd ec repair", tests, TS_ARRAY_SIZE(tests),
                          setup, teardown, &CL);
}
