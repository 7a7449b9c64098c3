/*
 * A node gone for out_after is marked out and its data re-replicated elsewhere (issue 29), with
 * real daemons: a real 3-member etcd, 4 real nodes following it (lease TTL 2 s, down_after
 * 2.5 s, out_after 8 s), a dataset of core 3 / min_core 2 with 30 shards. n4 is killed with -9
 * and no command is typed: the monitor marks it down, then out; placement gives each of its
 * PGs a third core replica among n1..n3, which is backfilled; then every shard is read from each
 * of its core replicas of the final map alone, byte for byte (3 copies again, none on n4).
 * Started again, n4 is marked up by the monitor (the policy put it out, so it may bring it back).
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

static int setup(void **state)
{
    const char *const more[] = {ETCD_QUICK_MONITOR, "--monitor-out-after-ms", "8000", NULL};

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
    };

    return etcd_run_group("test_etcd_out", "etcd out", tests, TS_ARRAY_SIZE(tests), setup, teardown,
                          &CL);
}
