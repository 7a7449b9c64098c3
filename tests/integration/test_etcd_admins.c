/*
 * Two admins changing the map at the same moment, many times (issue 29), on a cluster whose map
 * is in etcd: a real 3-member etcd, 5 real nodes (mutual TLS) following it with the monitor on,
 * and a writer putting shards through the cluster meanwhile. Each admin runs 15 rounds of
 * `tessera --etcd ... node weight|down|up nK`, both starting each round in the
 * same 600 ms slot (admin 0 on n2 and n3, admin 1 on n4 and n5: down, up, a weight), so their
 * reads of the map and their compare-and-swaps interleave. Asserted:
 *  - no command crashes (the ASan pass of .ci/run runs this test with the ASan CLI: an ASan
 *    report fails it); each ends applied, refused with a reason, or "the map changed under you"
 *    after its retries; at least one command lost a race and planned again (the fault happened);
 *  - etcd's history is linear: each revision of the map key holds the epoch after the one before;
 *  - every node ends on etcd's last map, byte for byte;
 *  - no PG was activated by two nodes at one epoch (every node's log);
 *  - every acknowledged write reads back byte for byte.
 */
#include "etcd_nodes.h"

#include "etcd.h"
#include "mapstore.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_proto.h"
#include "ts_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PREFIX "/tessera/a"
#define PGS 16
#define NODES 5
#define ROUNDS 15
#define SLOT_MS 600
#define SLEN (8 << 10)

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

static uint64_t now_ms(void)
{
    return ts_now_mono_ns() / 1000000;
}

/* What one admin's commands came to, written by the admin's process as one line. */
struct tally {
    unsigned applied, refused, lost_race, retried;
};

/* Admin k: ROUNDS commands, round r started at t0 + r * SLOT_MS (both admins alike). */
static void admin(int k, uint64_t t0)
{
    char path[700], out[16384], cmd[256];
    struct tally t = {0, 0, 0, 0};
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
    FILE *f;

    for (int r = 0; r < ROUNDS; r++) {
        int node, op, rc;
        uint64_t at = t0 + (uint64_t)r * SLOT_MS;
        while (now_ms() < at)
            usleep(1000);
        /* Admin 0 works on n2 and n3, admin 1 on n4 and n5: down, then up (the monitor may have
         * marked it up first), and now and then a weight; so both usually change the map in
         * the same slot, and one of them loses the compare-and-swap. */
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        node = 2 + 2 * k + (r / 2) % 2;
        op = r % 5 == 4 ? 0 : 1 + r % 2;
        if (op == 0)
            snprintf(cmd, sizeof(cmd), "node weight n%d %u", node,
                     50 + (unsigned)(rng >> 16) % 150);
        else
            snprintf(cmd, sizeof(cmd), "node %s n%d", op == 1 ? "down" : "up", node);
        rc = tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), "--etcd %s --etcd-prefix %s %s",
                     E.endpoints, PREFIX, cmd);
        if (rc < 0 || rc > 2 || strstr(out, "AddressSanitizer") || strstr(out, "runtime error")) {
            fprintf(stderr, "admin %d round %d: `%s` crashed (status %d)\n", k, r, cmd, rc);
            _exit(3);
        }
        if (strstr(out, "planning again on the new map"))
            t.retried++;
        if (rc == 0 && strstr(out, "stored in etcd")) {
            t.applied++;
        } else if (rc != 0 && (strstr(out, "refused") || strstr(out, "already"))) {
            t.refused++; /* after planning again, maybe: the new map made it unsafe */
        } else if (rc != 0 && strstr(out, "the map changed under you")) {
            t.lost_race++;
        } else if (rc != 0) {
            fprintf(stderr, "admin %d round %d: `%s` failed without a reason the test knows\n", k,
                    r, cmd);
            _exit(4);
        } else {
            fprintf(stderr, "admin %d round %d: `%s` said it succeeded but not how\n", k, r, cmd);
            _exit(4);
        }
    }
    snprintf(path, sizeof(path), "%s/admin%d", dir, k);
    f = fopen(path, "w");
    if (!f)
        _exit(2);
    fprintf(f, "%u %u %u %u\n", t.applied, t.refused, t.lost_race, t.retried);
    fclose(f);
    _exit(0);
}

/* Puts shards until the stop file exists; each acknowledged shard's number on a line. */
static void writer(void)
{
    char acked[700], stop[700];
    struct tessera_opts o;
    tessera_client *c = NULL;
    FILE *f;

    snprintf(acked, sizeof(acked), "%s/acked", dir);
    snprintf(stop, sizeof(stop), "%s/stop", dir);
    f = fopen(acked, "w");
    tsd_client_opts(&o, &CL.node[0], "writer");
    o.timeout_ms = 3000;
    if (!f || tessera_client_open(&c, &o) != 0)
        _exit(2);
    for (uint32_t s = 0; s < 1000000 && access(stop, F_OK) != 0; s++) {
        if (tsd_put_pattern(c, "w", s, SLEN, s) == 0) {
            fprintf(f, "%u\n", s);
            fflush(f);
        } else {
            usleep(50 * 1000);
        }
    }
    tessera_client_close(c);
    fclose(f);
    _exit(0);
}

/* Every (PG, epoch) at which some node's log says it activated the PG: two nodes at one pair
 * are counted (and shown). */
static unsigned double_activations(unsigned *total)
{
    static char who[PGS][4096];
    unsigned twice = 0;

    memset(who, 0, sizeof(who));
    *total = 0;
    for (int i = 0; i < CL.n; i++) {
        FILE *f = fopen(CL.node[i].log, "r");
        char line[1024];
        assert_non_null(f);
        while (fgets(line, sizeof(line), f)) {
            const char *p = strstr(line, "PG ");
            unsigned pg;
            unsigned long long epoch;
            if (!p || sscanf(p, "PG %u active at epoch %llu", &pg, &epoch) != 2 || pg >= PGS ||
                epoch >= 4096)
                continue;
            (*total)++;
            if (who[pg][epoch] && who[pg][epoch] != (char)(i + 1)) {
                fprintf(stderr, "  PG %u activated at epoch %llu by n%d and n%d\n", pg, epoch,
                        who[pg][epoch], i + 1);
                twice++;
            }
            who[pg][epoch] = (char)(i + 1);
        }
        fclose(f);
    }
    return twice;
}

static void test_two_admins_race(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    struct tessera_opts o;
    tessera_client *c = NULL;
    ts_etcd *e = etcd_client();
    struct ts_map *m = NULL, *last = NULL;
    int64_t rev = 0;
    uint64_t start, t0;
    pid_t kid[2], w;
    struct tally sum = {0, 0, 0, 0};
    unsigned acked = 0, total = 0;
    char path[700], key[128];
    int st;

    (void)state;
    for (int t = 0; t < 100 && ts_mapstore_get(e, PREFIX, &m, &rev) != 0; t++)
        usleep(100 * 1000);
    assert_non_null(m);
    start = m->epoch;
    ts_map_free(m);
    tsd_client_opts(&o, &CL.node[0], "admin");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, "w", &p), 0);
    tessera_client_close(c);

    w = fork();
    if (w == 0)
        writer();
    t0 = now_ms() + 1000;
    for (int k = 0; k < 2; k++) {
        kid[k] = fork();
        if (kid[k] == 0)
            admin(k, t0);
    }
    for (int k = 0; k < 2; k++) {
        FILE *f;
        struct tally t;
        assert_int_equal(waitpid(kid[k], &st, 0), kid[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        snprintf(path, sizeof(path), "%s/admin%d", dir, k);
        f = fopen(path, "r");
        assert_non_null(f);
        assert_int_equal(fscanf(f, "%u %u %u %u", &t.applied, &t.refused, &t.lost_race, &t.retried),
                         4);
        fclose(f);
        fprintf(stderr,
                "  admin %d: %u applied, %u refused, %u lost every race, %u planned again after "
                "losing one\n",
                k, t.applied, t.refused, t.lost_race, t.retried);
        sum.applied += t.applied;
        sum.refused += t.refused;
        sum.lost_race += t.lost_race;
        sum.retried += t.retried;
    }
    /* The fault happened: the admins raced, and some command lost and built its change again. */
    assert_true(sum.retried + sum.lost_race > 0);
    assert_true(sum.applied > 0);

    /* Every node up again (the monitor marks live nodes up; an admin may have left one down). */
    for (int t = 0; t < 200; t++) {
        int down = 0;
        assert_int_equal(ts_mapstore_get(e, PREFIX, &m, NULL), 0);
        for (size_t i = 0; i < m->n; i++)
            down += m->nodes[i].state != TS_NODE_UP;
        ts_map_free(m);
        if (!down)
            break;
        usleep(100 * 1000);
    }
    sleep(2);
    snprintf(path, sizeof(path), "%s/stop", dir);
    {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(waitpid(w, &st, 0), w);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    /* etcd's history: each revision of the map the epoch after the one before. */
    assert_int_equal(ts_mapstore_get(e, PREFIX, &last, NULL), 0);
    fprintf(stderr, "  etcd's map went from epoch %llu to %llu\n", (unsigned long long)start,
            (unsigned long long)last->epoch);
    for (uint64_t want = start; want <= last->epoch; want++) {
        struct ts_etcd_kv kv;
        struct ts_map *got = NULL;
        struct ts_rd r;
        int deleted;
        assert_int_equal(
            ts_etcd_watch(e, ts_mapstore_key(PREFIX, key, sizeof(key)), rev, 2000, &kv, &deleted),
            0);
        ts_rd_init(&r, kv.value, kv.len);
        assert_int_equal(ts_map_decode(&r, &got), 0);
        if (got->epoch != want)
            fail_msg("etcd revision %lld holds epoch %llu after epoch %llu", (long long)kv.mod_rev,
                     (unsigned long long)got->epoch, (unsigned long long)want - 1);
        rev = kv.mod_rev + 1;
        ts_map_free(got);
        ts_etcd_kv_free(&kv);
    }
    /* Every node on etcd's last map, byte for byte. */
    {
        struct ts_wr a;
        ts_wr_init(&a);
        ts_map_encode(&a, last);
        for (int i = 0; i < CL.n; i++) {
            struct ts_map *n = NULL;
            struct ts_wr b;
            for (int t = 0; t < 100; t++) {
                ts_map_free(n);
                n = raw_map_get(CL.node[i].addr);
                if (n && n->epoch == last->epoch)
                    break;
                usleep(100 * 1000);
            }
            assert_non_null(n);
            ts_wr_init(&b);
            ts_map_encode(&b, n);
            if (b.len != a.len || memcmp(a.buf, b.buf, a.len) != 0)
                fail_msg("%s ends on epoch %llu, not etcd's map of epoch %llu", CL.id[i],
                         (unsigned long long)n->epoch, (unsigned long long)last->epoch);
            ts_wr_fini(&b);
            ts_map_free(n);
        }
        ts_wr_fini(&a);
    }
    /* No PG activated by two nodes at one epoch. */
    assert_int_equal(double_activations(&total), 0);
    fprintf(stderr, "  %u activations in the nodes' logs, none of a PG by two nodes at one epoch\n",
            total);
    assert_true(total > 0);
    /* Every acknowledged write, byte for byte. */
    {
        static uint8_t want[SLEN], got[SLEN];
        unsigned s;
        FILE *f;
        snprintf(path, sizeof(path), "%s/acked", dir);
        f = fopen(path, "r");
        assert_non_null(f);
        tsd_client_opts(&o, &CL.node[1], "reader");
        assert_int_equal(tessera_client_open(&c, &o), 0);
        while (fscanf(f, "%u", &s) == 1) {
            size_t n = 0;
            ts_test_fill(want, SLEN, s, 0);
            assert_int_equal(tessera_read(c, "w", s, 0, SLEN, got, &n), 0);
            assert_int_equal(n, SLEN);
            assert_memory_equal(got, want, SLEN);
            acked++;
        }
        fclose(f);
        tessera_client_close(c);
    }
    fprintf(stderr, "  %u acknowledged writes read back byte for byte\n", acked);
    assert_true(acked > 20);
    ts_map_free(last);
    ts_etcd_close(e);
}

static int setup(void **state)
{
    const char *const more[] = {"--monitor-up-after-ms", "1000", NULL};
    char *tmp;
    int rc;

    (void)state;
    rc = etcd_cluster_start(&E, 3, 0);
    if (rc)
        return -1;
    tmp = ts_test_tmpdir("etcd-admins");
    snprintf(dir, sizeof(dir), "%s", tmp);
    free(tmp);
    rc = etcd_nodes_start(&CL, NODES, PGS, &E, PREFIX, more);
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
        cmocka_unit_test(test_two_admins_race),
    };

    return etcd_run_group("test_etcd_admins", "etcd admins", tests, TS_ARRAY_SIZE(tests), setup,
                          teardown, &CL);
}
