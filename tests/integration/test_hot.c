/*
 * Hot datasets (tessera hot add|rm|ls, common/map_hot.c) against a real 5-node cluster: the
 * refused changes change nothing; `hot add` gives every PG's next nodes a full copy (backfilled,
 * then kept up to date as writes go on), read from each node alone byte for byte; clients spread
 * their reads over the extra replicas; `hot rm` takes the copies away again while the core
 * replicas keep everything.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tessera/tessera.h"
#include "ts_map.h"
#include "ts_proto.h"

static struct tsd_cluster CL;
static char out[1 << 15];

#define LEN 70000

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131 + seed * 7919) >> 3);
}

static uint64_t epoch_now(void)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    uint64_t e = m ? m->epoch : 0;
    ts_map_free(m);
    return e;
}

static void put_shards(tessera_client *c, const char *ds, uint32_t from, uint32_t to, size_t len)
{
    uint8_t *buf = malloc(len);
    for (uint32_t s = from; s < to; s++) {
        fill(buf, len, s);
        assert_int_equal(tessera_put(c, ds, s, buf, len, NULL, 0), 0);
    }
    free(buf);
}

/* Node i serves shard s of ds, byte for byte, within secs (0: once). 0, or the last error. */
static int node_has(int i, const char *ds, uint32_t s, size_t len, int secs)
{
    uint8_t *want = malloc(len), *got = malloc(len);
    int rc = TS_EIO;

    fill(want, len, s);
    for (int t = 0; t <= secs * 10; t++) {
        size_t n = 0;
        rc = raw_read_shard(CL.node[i].addr, ds, s, len, got, &n);
        if (rc == 0 && (n != len || memcmp(want, got, len) != 0))
            rc = TS_ECORRUPT;
        if (rc == 0 || secs == 0)
            break;
        usleep(100000);
    }
    free(want);
    free(got);
    return rc;
}

/* The first k nodes of shard s's PG order under the cluster's map. */
static size_t order_of(const char *ds, uint32_t s, int *order, size_t k)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    size_t n;

    assert_non_null(m);
    n = ts_map_pg_order(m, ts_map_pg_of(m, ds, s), order, k);
    ts_map_free(m);
    return n;
}

static void test_refused_changes_change_nothing(void **state)
{
    tessera_client *c = NULL;
    struct ts_dataset_policy p = {2, 0, 2, 65536, 0, 0, 0, 0};
    uint64_t e0;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL), 0);
    assert_int_equal(tessera_dataset_create(c, "hot", &p), 0);
    put_shards(c, "hot", 0, 30, LEN);
    tessera_client_close(c);
    e0 = epoch_now();
    assert_int_not_equal(cli("hot add nosuch --fringe +1"), 0);
    assert_non_null(strstr(out, "nosuch"));
    assert_int_not_equal(cli("hot add hot --fringe +9"), 0);
    assert_int_not_equal(cli("hot add hot --fringe +4"), 0); /* 2 + 4 replicas, 5 nodes */
    assert_non_null(strstr(out, "are up"));
    assert_int_not_equal(cli("hot add hot --fringe +7"), 0); /* 9: placement orders 8 ranks */
    assert_non_null(strstr(out, "at most 8"));
    assert_int_not_equal(cli("hot add hot --fringe +1 --pg 99"), 0);
    assert_int_not_equal(cli("hot rm hot"), 0); /* no entry */
    assert_int_not_equal(cli("hot add hot --fringe x"), 0);
    assert_int_equal(cli("hot add hot --fringe +2 --dry-run"), 0);
    assert_non_null(strstr(out, "dry run"));
    assert_int_equal(epoch_now(), e0);
    assert_int_equal(cli("hot ls"), 0);
    assert_null(strstr(out, "hot "));
}

static void test_add_then_rm(void **state)
{
    tessera_client *c = NULL;
    uint64_t e0 = epoch_now();

    assert_int_equal(cli("hot add hot --fringe +2"), 0);
    assert_true(epoch_now() > e0);
    assert_int_equal(cli("hot ls"), 0);
    assert_non_null(strstr(out, "+2"));
    assert_int_equal(cli("pg --dataset hot --shard 0"), 0); /* the extra ranks are shown */
    assert_non_null(strstr(out, "fringe (hot)"));
    assert_non_null(strstr(out, "hot +2"));
    /* Every shard on each of its PG's first 4 nodes, read from each alone. */
    for (uint32_t s = 0; s < 30; s++) {
        int order[4];
        assert_int_equal(order_of("hot", s, order, 4), 4);
        for (int k = 0; k < 4; k++) {
            int rc = node_has(order[k], "hot", s, LEN, 30);
            if (rc)
                fprintf(stderr, "shard %u on %s (rank %d): %s\n", s, CL.id[order[k]], k,
                        ts_strerror(rc));
            assert_int_equal(rc, 0);
        }
    }
    /* Writes after the change reach the extra replicas too (as fringe: soon after the ack). */
    assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL), 0);
    put_shards(c, "hot", 30, 40, LEN);
    tessera_client_close(c);
    for (uint32_t s = 30; s < 40; s++) {
        int order[4];
        assert_int_equal(order_of("hot", s, order, 4), 4);
        for (int k = 2; k < 4; k++)
            assert_int_equal(node_has(order[k], "hot", s, LEN, 30), 0);
    }
    /* Removed: the extra copies go, the core replicas keep every byte. */
    assert_int_equal(cli("hot rm hot"), 0);
    assert_non_null(strstr(out, "dropped"));
    for (uint32_t s = 0; s < 40; s++) {
        int order[4];
        assert_int_equal(order_of("hot", s, order, 4), 4);
        for (int k = 0; k < 2; k++)
            assert_int_equal(node_has(order[k], "hot", s, LEN, 10), 0);
        for (int k = 2; k < 4; k++)
            assert_int_equal(node_has(order[k], "hot", s, LEN, 0), TS_ENOENT);
    }
    assert_int_equal(cli("hot ls"), 0);
    assert_null(strstr(out, "+2"));
    /* The entry of a dataset deleted meanwhile can still be removed. */
    {
        struct ts_dataset_policy p = {2, 0, 2, 65536, 0, 0, 0, 0};
        assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL), 0);
        assert_int_equal(tessera_dataset_create(c, "gone", &p), 0);
        put_shards(c, "gone", 0, 3, LEN);
        tessera_client_close(c);
        assert_int_equal(cli("hot add gone --fringe +1"), 0);
        assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "admin", NULL, NULL), 0);
        { /* the new replicas may still be filling: "busy, try again" (meanwhile the delete
           * reaches the busy node through the PG logs: the retry may find it gone) */
            struct ts_dataset_info gone;
            int rc = TS_EBUSY, busy = 0;
            for (int t = 0; t < 100 && rc == TS_EBUSY; t++)
                if ((rc = tessera_dataset_delete(c, "gone")) == TS_EBUSY) {
                    busy = 1;
                    usleep(100000);
                }
            assert_true(rc == 0 || (busy && rc == TS_ENOENT));
            assert_int_equal(tessera_dataset_stat(c, "gone", &gone), TS_ENOENT);
        }
        tessera_client_close(c);
        assert_int_equal(cli("hot rm gone"), 0);
        assert_int_equal(cli("hot ls"), 0);
        assert_null(strstr(out, "gone"));
    }
}

static int64_t read_bytes(int i)
{
    return raw_status_read_bytes(CL.node[i].addr);
}

/* Reads of the shard by `handles` fresh clients (each starts at a replica of its own). */
static void read_by_clients(int handles, size_t len)
{
    uint8_t *want = malloc(len), *got = malloc(len);

    fill(want, len, 0);
    for (int h = 0; h < handles; h++) {
        tessera_client *c = NULL;
        struct tessera_opts o;
        size_t n = 0;
        tessera_opts_init(&o);
        o.address = CL.listen[h % CL.n];
        assert_int_equal(tessera_client_open(&c, &o), 0);
        assert_int_equal(tessera_read(c, "one", 0, 0, len, got, &n), 0);
        assert_true(n == len && memcmp(want, got, len) == 0);
        tessera_client_close(c);
    }
    free(want);
    free(got);
}

static void test_reads_spread(void **state)
{
    const size_t len = 1u << 20;
    struct ts_dataset_policy p = {1, 0, 1, 65536, 0, 0, 0, 0};
    tessera_client *c = NULL;
    int order[3];
    int64_t before, after;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL), 0);
    assert_int_equal(tessera_dataset_create(c, "one", &p), 0);
    put_shards(c, "one", 0, 1, len);
    tessera_client_close(c);
    assert_int_equal(order_of("one", 0, order, 3), 3);
    /* One replica: every read on it. */
    before = read_bytes(order[1]) + read_bytes(order[2]);
    read_by_clients(12, len);
    after = read_bytes(order[1]) + read_bytes(order[2]);
    assert_true(after - before < (int64_t)len);
    /* Two extra replicas: once they hold it, reads spread over all three. */
    assert_int_equal(cli("hot add one --fringe +2"), 0);
    assert_int_equal(node_has(order[1], "one", 0, len, 30), 0);
    assert_int_equal(node_has(order[2], "one", 0, len, 30), 0);
    before = read_bytes(order[1]) + read_bytes(order[2]);
    read_by_clients(12, len);
    after = read_bytes(order[1]) + read_bytes(order[2]);
    fprintf(stderr, "extra replicas served %lld bytes of 12 reads of %zu\n",
            (long long)(after - before), len);
    assert_true(after - before >= (int64_t)len);
}

static int setup(void **state)
{
    return tsd_cluster_start(&CL, 5, NULL, 8, NULL);
}

static int teardown(void **state)
{
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_changes_change_nothing),
        cmocka_unit_test(test_add_then_rm),
        cmocka_unit_test(test_reads_spread),
    };
    return cmocka_run_group_tests_name("hot", tests, setup, teardown);
}
