/*
 * A node gone for out_after is marked out and its data re-replicated elsewhere (issue 29), with
 * real daemons: a real 3-member etcd, 4 real nodes following it (lease TTL 2 s, down_after
 * 2.5 s, out_after 8 s), a dataset of core 3 / min_core 2 with 30 shards. n4 is killed with -9
 * and no command is typed: the monitor marks it down, then out; placement gives each of its
 * PGs a third core replica among n1..n3, which is backfilled; then every shard is read from each
 * of its core replicas of the final map alone, byte for byte (3 copies again, none on n4).
 * Started again, n4 is marked up by the monitor (the policy put it out, so it may bring it back).
 * Then the same with an erasure-coded dataset tiered back to replicated while n4 was out: the
 * monitor keeps n4 out until the tier, run again, has put n4's bytes back.
 */
#include "etcd_nodes.h"

#include "etcd.h"
#include "mapstore.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREFIX "/tessera/o"
#define SLEN (32 << 10)
#define SHARDS 30

static struct etcd_cluster E;
static struct tsd_cluster CL;
static ts_etcd *ETCD;

/* n4's state in etcd's map. */
static int state_of(int i)
{
    struct ts_map *m = NULL;
    int st;

    assert_int_equal(ts_mapstore_get(ETCD, PREFIX, &m, NULL), 0);
    st = m->nodes[i].state;
    ts_map_free(m);
    return st;
}

static long wait_state(int i, int st, int secs)
{
    uint64_t t0 = ts_now_mono_ns();

    for (int t = 0; t < secs * 10; t++) {
        if (state_of(i) == st)
            return (long)((ts_now_mono_ns() - t0) / 1000000);
        usleep(100 * 1000);
    }
    return -1;
}

/* Every shard from each of its 3 core replicas in etcd's map alone (up to 60 s for backfills):
 * how many (shard, replica) reads were missing or differed; *on_n4 counts placements on n4. */
static unsigned check_core_copies(unsigned *on_n4)
{
    static uint8_t want[SLEN], got[SLEN];
    struct ts_map *m = NULL;
    uint64_t deadline = ts_now_mono_ns() + 60000000000ull;
    unsigned bad = 0;

    *on_n4 = 0;
    assert_int_equal(ts_mapstore_get(ETCD, PREFIX, &m, NULL), 0);
    for (uint32_t s = 0; s < SHARDS; s++) {
        int order[3];
        size_t n = ts_map_pg_order(m, ts_map_pg_of(m, "o", s), order, 3);
        assert_int_equal(n, 3);
        ts_test_fill(want, SLEN, s, 0);
        for (size_t k = 0; k < n; k++) {
            int i = tsd_cluster_find(&CL, m->nodes[order[k]].id), rc;
            size_t len = 0;
            if (i == 3)
                (*on_n4)++;
            do {
                rc = raw_read_shard(CL.node[i].addr, "o", s, SLEN, got, &len);
                if (rc == 0 && (len != SLEN || memcmp(got, want, SLEN) != 0))
                    rc = TS_ECORRUPT;
                if (rc)
                    usleep(200 * 1000);
            } while (rc && ts_now_mono_ns() < deadline);
            if (rc && bad++ < 5)
                fprintf(stderr, "  shard %u on %s: %s\n", s, CL.id[i], ts_errname(rc));
        }
    }
    ts_map_free(m);
    return bad;
}

static void test_out_after_re_replicates(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    struct tessera_opts o;
    tessera_client *c = NULL;
    unsigned bad, on_n4;
    long down, out, up;
    uint64_t t0;

    (void)state;
    tsd_client_opts(&o, &CL.node[0], "writer");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, "o", &p), 0);
    for (uint32_t s = 0; s < SHARDS; s++)
        assert_int_equal(tsd_put_pattern(c, "o", s, SLEN, s), 0);
    tessera_client_close(c);
    bad = check_core_copies(&on_n4);
    fprintf(stderr, "  30 shards, 3 copies each: %u of the 90 copies on n4, %u missing\n", on_n4,
            bad);
    assert_int_equal(bad, 0);
    assert_true(on_n4 > 0);

    t0 = ts_now_mono_ns();
    tsd_kill9(&CL.node[3]);
    down = wait_state(3, TS_NODE_DOWN, 30);
    out = wait_state(3, TS_NODE_OUT, 60);
    fprintf(stderr, "  n4 killed (-9), no command: down after %ld ms, out %ld ms later\n", down,
            out);
    assert_true(down >= 0 && out >= 0);
    bad = check_core_copies(&on_n4);
    fprintf(stderr,
            "  %.1f s after the kill: every shard read from its 3 core replicas alone, %u "
            "missing, %u placed on n4\n",
            (double)(ts_now_mono_ns() - t0) / 1e9, bad, on_n4);
    assert_int_equal(on_n4, 0);
    assert_int_equal(bad, 0);

    assert_int_equal(tsd_start(&CL.node[3], NULL), 0);
    up = wait_state(3, TS_NODE_UP, 60);
    fprintf(stderr, "  n4 started again: marked up after %ld ms\n", up);
    assert_true(up >= 0);
    bad = check_core_copies(&on_n4);
    fprintf(stderr, "  every shard from its 3 core replicas again: %u missing\n", bad);
    assert_int_equal(bad, 0);
}

/* Whether any node's log says `what` (the monitor's node is whichever was elected). */
static int some_log_has(const char *what)
{
    for (int i = 0; i < CL.n; i++) {
        char line[2048];
        FILE *f = fopen(CL.node[i].log, "r");
        int hit = 0;
        while (f && !hit && fgets(line, sizeof(line), f))
            hit = strstr(line, what) != NULL;
        if (f)
            fclose(f);
        if (hit)
            return 1;
    }
    return 0;
}

/* Every shard of COLD (COLD_SHARDS of COLD_LEN) read through the router, byte for byte. */
#define COLD_SHARDS 6
#define COLD_LEN (100u << 10)
#define COLD "cold"

/* The shards' ec:2+1 positions stay where they are, but n4's, when n4 is marked out
 * (ts_map_ec_order): the tier back below reads through the fragments left, and this test has no
 * `tessera monitor` to put moved ones. */
static void check_positions_stay(void)
{
    struct ts_map *m = NULL, *o;

    assert_int_equal(ts_mapstore_get(ETCD, PREFIX, &m, NULL), 0);
    o = ts_map_dup(m);
    assert_non_null(o);
    o->nodes[3].state = TS_NODE_OUT;
    for (uint32_t s = 0; s < COLD_SHARDS; s++) {
        int a[3], b[3];
        uint32_t pg = ts_map_pg_of(m, COLD, s);
        assert_int_equal(ts_map_ec_order(m, pg, a, 3), 3);
        assert_int_equal(ts_map_ec_order(o, pg, b, 3), 3);
        for (int f = 0; f < 3; f++)
            assert_true(a[f] == 3 || a[f] == b[f]);
    }
    ts_map_free(o);
    ts_map_free(m);
}
static void read_cold(void)
{
    static uint8_t want[COLD_LEN], got[COLD_LEN];
    struct tessera_opts o;
    tessera_client *c = NULL;

    tsd_client_opts(&o, &CL.node[0], "reader");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    for (uint32_t s = 0; s < COLD_SHARDS; s++) {
        size_t n = 0;
        ts_test_fill(want, COLD_LEN, 700 + s, 0);
        assert_int_equal(tessera_read(c, COLD, s, 0, COLD_LEN, got, &n), 0);
        assert_int_equal(n, COLD_LEN);
        assert_memory_equal(got, want, COLD_LEN);
    }
    tessera_client_close(c);
}

/* A node the monitor put out while an erasure-coded dataset went back to replicated holds that
 * dataset's replicas dropped (its bytes' fragments are gone): started again, the monitor keeps
 * it out (while the dataset was still tiered as n4 holds it, n4 came back up by itself) (its
 * registration lists the dataset, which the cluster holds replicated) and says why; once `tessera
 * dataset tier cold replicated` has put its bytes back, the monitor brings it up, with no command
 * typed for that, and every byte reads. */
static void test_node_back_after_a_tier_back_waits_for_its_bytes(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    char out[1 << 14];
    struct tessera_opts o;
    tessera_client *c = NULL;
    long up;

    (void)state;
    assert_int_equal(state_of(3), TS_NODE_UP);
    check_positions_stay();
    tsd_client_opts(&o, &CL.node[0], "writer");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, COLD, &p), 0);
    for (uint32_t s = 0; s < COLD_SHARDS; s++)
        assert_int_equal(tsd_put_pattern(c, COLD, s, COLD_LEN, 700 + s), 0);
    assert_int_equal(tessera_dataset_seal(c, COLD), 0);
    tessera_client_close(c);
    assert_int_equal(
        tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), "dataset tier %s ec:2+1", COLD), 0);

    /* Out and back while the cluster holds the dataset as n4 does (ec:2+1, dropped): up again
     * by itself, as any node. */
    tsd_kill9(&CL.node[3]);
    assert_true(wait_state(3, TS_NODE_DOWN, 30) >= 0);
    assert_true(wait_state(3, TS_NODE_OUT, 60) >= 0);
    assert_int_equal(tsd_start(&CL.node[3], NULL), 0);
    up = wait_state(3, TS_NODE_UP, 60);
    fprintf(stderr, "  n4 back holding %s dropped as the cluster does: marked up after %ld ms\n",
            COLD, up);
    assert_true(up >= 0);

    /* Out again, and the dataset tiered back to replicated meanwhile. */
    tsd_kill9(&CL.node[3]);
    assert_true(wait_state(3, TS_NODE_DOWN, 30) >= 0);
    assert_true(wait_state(3, TS_NODE_OUT, 60) >= 0);
    assert_int_equal(
        tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), "dataset tier %s replicated", COLD), 0);

    /* Back, registered, but kept out: well past up_after (1 s). */
    assert_int_equal(tsd_start(&CL.node[3], NULL), 0);
    assert_int_equal(wait_state(3, TS_NODE_UP, 8), -1);
    assert_int_equal(state_of(3), TS_NODE_OUT);
    {
        char want[200];
        snprintf(want, sizeof(want),
                 "node n4 stays where it is: it holds dataset %s's replicas dropped (ec:2+1) and "
                 "the cluster holds it replicated",
                 COLD);
        assert_true(some_log_has(want));
    }

    /* Its bytes put back: then the monitor brings it up by itself. */
    assert_int_equal(
        tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), "dataset tier %s replicated", COLD), 0);
    up = wait_state(3, TS_NODE_UP, 60);
    fprintf(stderr,
            "  n4 kept out while it held %s dropped; marked up %ld ms after its bytes "
            "were put back\n",
            COLD, up);
    assert_true(up >= 0);
    read_cold();
}

static int setup(void **state)
{
    /* n4 goes out and comes back three times: not damped as flapping (test_policy checks that). */
    const char *const more[] = {
        ETCD_QUICK_MONITOR, "--monitor-out-after-ms", "8000", "--monitor-flap-max", "100", NULL};

    (void)state;
    if (etcd_cluster_start(&E, 3, 0) != 0 || etcd_client_open(&ETCD, &E) != 0)
        return -1;
    return etcd_nodes_start(&CL, 4, 16, &E, PREFIX, more);
}

static int teardown(void **state)
{
    int rc;

    (void)state;
    rc = tsd_cluster_stop(&CL);
    ts_etcd_close(ETCD);
    etcd_cluster_stop(&E);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_after_re_replicates),
        cmocka_unit_test(test_node_back_after_a_tier_back_waits_for_its_bytes),
    };

    return etcd_run_group("test_etcd_out", "etcd out", tests, TS_ARRAY_SIZE(tests), setup, teardown,
                          &CL);
}
