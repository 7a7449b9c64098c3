/*
 * Live rebalancing (client/cli/cli_rebalance.c, common/map_move.c) against a real 5-node cluster,
 * with a verified write/read load and a training reader (shard units of a sealed dataset, every
 * byte checked) running throughout: n5 joins (it starts out), the rebalance is applied in the
 * background, paused (nothing moves while paused), resumed, rolled back, and applied again to the
 * end. After each step every acknowledged write reads back byte for byte from the cluster and from
 * every core replica alone; the reader sees no failed read; at the end the copies outside the new
 * placement are gone.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct tsd_cluster CL;
static char out[1 << 16];

#define LEN 70000
#define NTRAIN 12
#define MAXW 4096

/* The CLI as admin against node 0's TLS listener; its output (both streams) in out. */
#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131 + seed * 7919) >> 3);
}

/* ---- the load: writes (acknowledged ones counted), verified reads, a plan reader ------------ */

static atomic_uint acked;     /* shards 0..acked-1 of "rb" are acknowledged */
static atomic_int stop;       /* the load threads end */
static atomic_uint bad_reads; /* a verified read that failed or differed */
static atomic_uint reads, train_units, train_failed;

static void *writer_main(void *arg)
{
    tessera_client *c = NULL;
    uint8_t *buf = malloc(LEN), *got = malloc(LEN);

    (void)arg;
    if (test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL) != 0)
        abort();
    while (!atomic_load(&stop) && atomic_load(&acked) < MAXW) {
        uint32_t s = atomic_load(&acked), r;
        size_t n = 0;
        fill(buf, LEN, s);
        if (tessera_put(c, "rb", s, buf, LEN, NULL, 0) == 0)
            atomic_store(&acked, s + 1);
        else
            usleep(50000); /* a PG switching primary: the next try finds it */
        r = atomic_load(&acked);
        if (r) {
            r = (uint32_t)rand() % r;
            fill(buf, LEN, r);
            if (tessera_read(c, "rb", r, 0, LEN, got, &n) != 0 || n != LEN ||
                memcmp(buf, got, LEN) != 0) {
                fprintf(stderr, "load: shard %u: %s\n", r, tessera_client_error(c));
                atomic_fetch_add(&bad_reads, 1);
            }
            atomic_fetch_add(&reads, 1);
        }
        usleep(100000);
    }
    tessera_client_close(c);
    free(buf);
    free(got);
    return NULL;
}

/* A training job: epochs of shard units of the sealed dataset "train", every byte checked. */
static void *trainer_main(void *arg)
{
    uint8_t *want = malloc(LEN);

    (void)arg;
    for (uint64_t epoch = 0; !atomic_load(&stop); epoch++) {
        struct tessera_reader_opts ro;
        struct tessera_opts co;
        struct tessera_unit u;
        tessera_reader *r = NULL;
        char err[512];
        int rc;

        tessera_opts_init(&co);
        co.address = CL.listen[2];
        tessera_reader_opts_init(&ro);
        ro.dataset = "train";
        ro.plan.epoch = epoch;
        ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
        if (tessera_reader_open(&r, &co, &ro, err, sizeof(err)) != 0) {
            fprintf(stderr, "trainer: open: %s\n", err);
            atomic_fetch_add(&train_failed, 1);
            usleep(100000);
            continue;
        }
        while ((rc = tessera_reader_next(r, &u)) == 1) {
            fill(want, LEN, 1000 + u.shard);
            if (u.len != LEN || memcmp(u.data, want, LEN) != 0)
                atomic_fetch_add(&train_failed, 1);
            atomic_fetch_add(&train_units, 1);
        }
        if (rc != 0) {
            fprintf(stderr, "trainer: %s\n", tessera_reader_error(r));
            atomic_fetch_add(&train_failed, 1);
        }
        tessera_reader_close(r);
    }
    free(want);
    return NULL;
}

/* ---- checks -------------------------------------------------------------------------------- */

static void check_all(void)
{
    tessera_client *c = NULL;
    uint8_t *want = malloc(LEN), *got = malloc(LEN);
    uint32_t upto = atomic_load(&acked);

    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "reader", NULL, NULL), 0);
    for (uint32_t s = 0; s < upto; s++) {
        size_t n = 0;
        fill(want, LEN, s);
        assert_int_equal(tessera_read(c, "rb", s, 0, LEN, got, &n), 0);
        assert_int_equal(n, LEN);
        assert_memory_equal(got, want, LEN);
    }
    tessera_client_close(c);
    free(want);
    free(got);
}

/* Every core replica of every acknowledged shard, read from that node alone. */
static void check_replicas(void)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    uint8_t *want = malloc(LEN), *got = malloc(LEN);
    uint32_t upto = atomic_load(&acked);
    int bad = 0;

    assert_non_null(m);
    for (uint32_t s = 0; s < upto; s++) {
        int order[3];
        size_t n = ts_map_pg_order(m, ts_map_pg_of(m, "rb", s), order, 3);
        fill(want, LEN, s);
        for (size_t k = 0; k < n; k++) {
            size_t g = 0;
            int rc = raw_read_shard(m->nodes[order[k]].addr, "rb", s, LEN, got, &g);
            if (rc || g != LEN || memcmp(got, want, LEN) != 0) {
                fprintf(stderr, "shard %u (PG %u): replica %zu %s: %s\n", s,
                        ts_map_pg_of(m, "rb", s), k, m->nodes[order[k]].id, ts_errname(rc));
                bad++;
            }
        }
    }
    ts_map_free(m);
    free(want);
    free(got);
    assert_int_equal(bad, 0);
}

/* "N/M PGs done" of `rebalance status`; -1 when none is in progress. */
static int pgs_done(int *total, int *paused)
{
    const char *p;

    assert_int_equal(cli("rebalance status"), 0);
    *paused = strstr(out, ", paused") != NULL;
    if (strstr(out, "no rebalance in progress"))
        return -1;
    p = strstr(out, " PGs done");
    assert_non_null(p);
    while (p > out && p[-1] != ' ')
        p--;
    *total = atoi(strchr(p, '/') + 1);
    return atoi(p);
}

static int wait_done_at_least(int want, int secs)
{
    int total = 0, paused = 0, d = 0;

    for (int i = 0; i < secs * 4; i++) {
        d = pgs_done(&total, &paused);
        if (d < 0 || d >= want)
            return d;
        usleep(250000);
    }
    return d;
}

/* The target: the cluster's map with n5 up. */
static void write_target(const char *path)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    int i;

    assert_non_null(m);
    ts_map_move_clear(m);
    i = ts_map_find(m, "n5");
    assert_true(i >= 0);
    m->nodes[i].state = TS_NODE_UP;
    assert_int_equal(ts_map_write_file(m, path), 0);
    ts_map_free(m);
}

static int setup(void **state)
{
    static const char *const domains[] = {"a", "a", "b", "b", "c"};
    struct ts_dataset_policy p = {3, 0, 2, 64u << 10, 0, 0, 0, 0};
    tessera_client *c = NULL;
    uint8_t *buf = malloc(LEN);

    (void)state;
    if (!buf || tsd_cluster_start(&CL, 5, domains, 32, NULL) != 0)
        return -1;
    /* n5 runs but holds nothing: the rebalance brings it in. */
    if (cli("node out n5") != 0)
        return -1;
    if (test_tls_open(&c, CL.tls_listen[0], "writer", NULL, NULL) != 0 ||
        tessera_dataset_create(c, "rb", &p) != 0 || tessera_dataset_create(c, "train", &p) != 0)
        return -1;
    for (uint32_t s = 0; s < NTRAIN; s++) {
        fill(buf, LEN, 1000 + s);
        if (tessera_put(c, "train", s, buf, LEN, NULL, 0) != 0)
            return -1;
    }
    if (tessera_dataset_seal(c, "train") != 0)
        return -1;
    for (uint32_t s = 0; s < 24; s++) {
        fill(buf, LEN, s);
        if (tessera_put(c, "rb", s, buf, LEN, NULL, 0) != 0)
            return -1;
    }
    atomic_store(&acked, 24);
    tessera_client_close(c);
    free(buf);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

static void test_refused_changes_nothing(void **state)
{
    char path[600];
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    uint64_t e = m->epoch;

    (void)state;
    ts_map_free(m);
    assert_int_not_equal(cli("rebalance apply /nonexistent.map"), 0);
    assert_int_not_equal(cli("rebalance pause"), 0);
    assert_non_null(strstr(out, "no rebalance is in progress"));
    assert_int_not_equal(cli("rebalance rollback"), 0);
    /* The target as the cluster is: nothing to move. */
    snprintf(path, sizeof(path), "%s/same.map", CL.dir);
    m = raw_map_get(CL.node[0].addr);
    assert_int_equal(ts_map_write_file(m, path), 0);
    ts_map_free(m);
    assert_int_not_equal(cli("rebalance apply %s", path), 0);
    assert_non_null(strstr(out, "nothing to move"));
    m = raw_map_get(CL.node[0].addr);
    assert_true(m->epoch == e && m->move == NULL);
    ts_map_free(m);
}

static void test_apply_pause_resume_rollback_apply(void **state)
{
    pthread_t w, t;
    char path[600];
    int total = 0, paused = 0, d0, d1;

    (void)state;
    snprintf(path, sizeof(path), "%s/target.map", CL.dir);
    write_target(path);
    assert_int_equal(pthread_create(&w, NULL, writer_main, NULL), 0);
    assert_int_equal(pthread_create(&t, NULL, trainer_main, NULL), 0);
    sleep(1);

    /* Apply in the background, paced; the CLI returns at once. */
    assert_int_equal(
        cli("rebalance apply %s --max-concurrent 2 --max-bytes-per-sec 8M --detach", path), 0);
    assert_non_null(strstr(out, "PGs to move"));
    assert_non_null(strstr(out, "driven in the background"));
    assert_int_not_equal(cli("rebalance apply %s", path), 0); /* one at a time */
    assert_non_null(strstr(out, "in progress"));
    assert_int_not_equal(cli("node weight n1 200"), 0); /* only up/down meanwhile */
    assert_non_null(strstr(out, "a rebalance is in progress"));
    d0 = wait_done_at_least(2, 60);
    assert_true(d0 >= 2);

    /* Pause: nothing settles while paused (the driver stops). */
    assert_int_equal(cli("rebalance pause"), 0);
    sleep(1);
    d0 = pgs_done(&total, &paused);
    assert_true(paused);
    sleep(2);
    d1 = pgs_done(&total, &paused);
    assert_int_equal(d1, d0);
    assert_true(d0 < total);

    /* Resume in the background; more PGs settle; then roll back to the start (foreground). */
    assert_int_equal(cli("rebalance resume --detach"), 0);
    d1 = wait_done_at_least(d0 + 1, 60);
    assert_true(d1 > d0);
    assert_int_equal(cli("rebalance rollback"), 0);
    assert_non_null(strstr(out, "rolled back"));
    assert_non_null(strstr(out, "rebalance: done"));
    {
        struct ts_map *m = raw_map_get(CL.node[0].addr);
        assert_null(m->move);
        assert_int_equal(m->nodes[ts_map_find(m, "n5")].state, TS_NODE_OUT);
        ts_map_free(m);
    }
    check_all();
    check_replicas();

    /* Apply again, to the end, in the foreground. */
    assert_int_equal(cli("rebalance apply %s --max-concurrent 4", path), 0);
    assert_non_null(strstr(out, "rebalance: done"));
    assert_non_null(strstr(out, "dropped"));
    atomic_store(&stop, 1);
    pthread_join(w, NULL);
    pthread_join(t, NULL);
    {
        struct ts_map *m = raw_map_get(CL.node[0].addr);
        assert_null(m->move);
        assert_int_equal(m->nodes[ts_map_find(m, "n5")].state, TS_NODE_UP);
        ts_map_free(m);
    }
    fprintf(stderr,
            "load: %u acknowledged writes, %u verified reads (%u bad); trainer %u units, "
            "%u failed\n",
            atomic_load(&acked), atomic_load(&reads), atomic_load(&bad_reads),
            atomic_load(&train_units), atomic_load(&train_failed));
    check_all();
    check_replicas();
    assert_int_equal(atomic_load(&bad_reads), 0);
    assert_int_equal(atomic_load(&train_failed), 0);
    assert_true(atomic_load(&train_units) > NTRAIN);
    assert_true(atomic_load(&acked) > 24);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_changes_nothing),
        cmocka_unit_test(test_apply_pause_resume_rollback_apply),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
