/*
 * A PG split under load (`tessera rebalance split`, client/cli/cli_split.c): four real nodes, 8
 * PGs, 64 shards written before, and a writer that goes on writing and reading back verified
 * shards throughout. The split doubles the count to 16 with every child on its parent's nodes,
 * then moves children one at a time, paced. Mid-split, the primary of a moving child is killed
 * (-9) and restarted; the split is rolled back (children back on their parents' nodes), then
 * spread again to its end. After each step the map says what it must, and at the end every
 * acknowledged shard is read back byte for byte from the cluster and from each of its replicas
 * alone. A map whose PG count is no split of the cluster's is refused and changes nothing.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PGS 8
#define LEN 40000
#define NPRE 64
#define MAXW 4096

static struct tsd_cluster CL;
static char out[1 << 16];
#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

static atomic_uchar acked[MAXW];
static atomic_uint nexts = NPRE, nacked, reads, bad_reads;
static atomic_int stop;

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 167 + seed * 40503u) >> 2);
}

/* Writes shard after shard (acknowledged ones remembered), each followed by a verified read of
 * an acknowledged one. */
static void *writer_main(void *arg)
{
    tessera_client *c = NULL;
    uint8_t *buf = malloc(LEN), *got = malloc(LEN);

    (void)arg;
    if (!buf || !got || test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL) != 0)
        abort();
    while (!atomic_load(&stop) && atomic_load(&nexts) < MAXW) {
        uint32_t s = atomic_fetch_add(&nexts, 1), r = (uint32_t)rand() % s;
        size_t n = 0;
        fill(buf, LEN, s);
        if (tessera_put(c, "sp", s, buf, LEN, NULL, 0) == 0) {
            atomic_store(&acked[s], 1);
            atomic_fetch_add(&nacked, 1);
        }
        if (atomic_load(&acked[r])) {
            fill(buf, LEN, r);
            if (tessera_read(c, "sp", r, 0, LEN, got, &n) != 0 || n != LEN ||
                memcmp(buf, got, LEN) != 0) {
                fprintf(stderr, "  load: shard %u read back wrong or failed: %s\n", r,
                        tessera_client_error(c));
                atomic_fetch_add(&bad_reads, 1);
            }
            atomic_fetch_add(&reads, 1);
        }
        usleep(60000);
    }
    tessera_client_close(c);
    free(buf);
    free(got);
    return NULL;
}

/* The map of the first node that answers. */
static struct ts_map *map_now(void)
{
    for (int i = 0; i < CL.n; i++) {
        struct ts_map *m = tsd_alive(&CL.node[i]) ? raw_map_get(CL.node[i].addr) : NULL;
        if (m)
            return m;
    }
    return NULL;
}

/* 1 when PG pg's first three replicas are its parent's (pg % parents). */
static int with_parent(const struct ts_map *m, uint32_t pg, uint32_t parents)
{
    int a[3], b[3];
    size_t na = ts_map_pg_order(m, pg, a, 3), nb = ts_map_pg_order(m, pg % parents, b, 3);

    return na == nb && !memcmp(a, b, na * sizeof(*a));
}

/* Every acknowledged shard through the cluster, then from each of its replicas alone (a few
 * tries for one still recovering); the failures. */
static int check_all(const struct ts_map *m)
{
    uint8_t *want = malloc(LEN), *got = malloc(LEN);
    tessera_client *c = NULL;
    int bad = 0, n = 0;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "reader", NULL, NULL), 0);
    for (uint32_t s = 0; s < atomic_load(&nexts) && s < MAXW; s++) {
        int order[3];
        size_t no, g = 0;
        if (!atomic_load(&acked[s]))
            continue;
        n++;
        fill(want, LEN, s);
        if (tessera_read(c, "sp", s, 0, LEN, got, &g) != 0 || g != LEN || memcmp(got, want, LEN)) {
            fprintf(stderr, "  shard %u: read through the cluster failed: %s\n", s,
                    tessera_client_error(c));
            bad++;
        }
        no = ts_map_pg_order(m, ts_map_pg_of(m, "sp", s), order, 3);
        for (size_t k = 0; k < no; k++) {
            int rc = -1;
            for (int t = 0; t < 8 && rc; t++) {
                g = 0;
                rc = raw_read_shard(m->nodes[order[k]].addr, "sp", s, LEN, got, &g);
                rc = rc ? rc : g != LEN || memcmp(got, want, LEN) ? -1 : 0;
                if (rc)
                    usleep(250000);
            }
            if (rc) {
                fprintf(stderr, "  shard %u (PG %u): replica %s: %s\n", s, ts_map_pg_of(m, "sp", s),
                        m->nodes[order[k]].id, rc == -1 ? "wrong bytes" : ts_errname(rc));
                bad++;
            }
        }
    }
    fprintf(stderr, "  %d acknowledged shards checked, each from its 3 replicas: %d bad\n", n, bad);
    tessera_client_close(c);
    free(want);
    free(got);
    return bad;
}

/* A child that moved already has had its copies dropped from a node of its parent's outside its
 * own placement (so the rollback must bring them back, not just point there); 1 once seen. */
static int dropped_behind(void)
{
    for (int t = 0; t < 100; t++) {
        struct ts_map *m = map_now();
        for (uint32_t pg = PGS; m && m->move && pg < 2 * PGS; pg++) {
            int own[3], par[3];
            size_t no, np;
            if (ts_map_pg_move_state(m, pg) != TS_PG_SETTLED)
                continue;
            no = ts_map_pg_order(m, pg, own, 3);
            np = ts_map_pg_order(m, pg - PGS, par, 3);
            for (size_t k = 0; k < np; k++) {
                int inside = 0;
                for (size_t j = 0; j < no; j++)
                    inside |= own[j] == par[k];
                for (uint32_t s = 0; !inside && s < NPRE; s++) {
                    uint8_t b[16];
                    size_t g = 0;
                    if (ts_map_pg_of(m, "sp", s) != pg)
                        continue;
                    if (raw_read_shard(m->nodes[par[k]].addr, "sp", s, sizeof(b), b, &g) != 0) {
                        fprintf(stderr, "  PG %u moved: %s no longer holds its shard %u\n", pg,
                                m->nodes[par[k]].id, s);
                        ts_map_free(m);
                        return 1;
                    }
                    break;
                }
            }
        }
        ts_map_free(m);
        usleep(100000);
    }
    return 0;
}

static void test_split_kill_rollback_spread(void **state)
{
    struct ts_map *m = NULL;
    pthread_t w;
    int victim = -1, moved = 0;

    (void)state;
    assert_int_equal(pthread_create(&w, NULL, writer_main, NULL), 0);
    usleep(500000);

    /* The split, paced so that it is caught in the middle. */
    assert_int_equal(cli("rebalance split --max-concurrent 1 --max-bytes-per-sec 400K --detach"),
                     0);
    assert_non_null(strstr(out, "8 PGs are 16"));
    for (int t = 0; t < 300 && victim < 0; t++) {
        m = map_now();
        assert_non_null(m);
        assert_int_equal(m->pg_count, 16);
        int settled = 0; /* children moved already: the rollback takes them back */
        for (uint32_t pg = PGS; m->move && pg < 2 * PGS; pg++)
            settled += ts_map_pg_move_state(m, pg) == TS_PG_SETTLED;
        for (uint32_t pg = PGS; m->move && settled && pg < 2 * PGS && victim < 0; pg++) {
            int order[1];
            if (ts_map_pg_move_state(m, pg) != TS_PG_MOVING ||
                ts_map_pg_order(m, pg, order, 1) != 1)
                continue;
            /* its primary, unless that is node 0 (the CLI's): then the next replica */
            if (order[0] == 0) {
                int o3[3];
                ts_map_pg_order(m, pg, o3, 3);
                order[0] = o3[1];
            }
            victim = order[0];
            fprintf(stderr, "  PG %u moving, %d children moved (map epoch %llu): kill -9 %s\n", pg,
                    settled, (unsigned long long)m->epoch, CL.id[victim]);
        }
        ts_map_free(m);
        if (victim < 0)
            usleep(100000);
    }
    assert_true(victim > 0);
    assert_true(dropped_behind());
    tsd_kill9(&CL.node[victim]);
    assert_false(tsd_alive(&CL.node[victim]));
    usleep(1500000);
    assert_int_equal(tsd_start(&CL.node[victim], NULL), 0);

    /* Rolled back: the children return to their parents' nodes; the count stays. */
    assert_int_equal(cli("rebalance rollback"), 0);
    assert_null(strstr(out, " 0 PGs already moved go back"));
    assert_non_null(strstr(out, "rebalance: done"));
    m = map_now();
    assert_non_null(m);
    assert_int_equal(m->pg_count, 16);
    assert_null(m->move);
    assert_int_equal(ts_map_placement_pgs(m), PGS);
    for (uint32_t pg = PGS; pg < 2 * PGS; pg++)
        assert_true(with_parent(m, pg, PGS));
    fprintf(stderr, "  rolled back at map epoch %llu: every child with its parent\n",
            (unsigned long long)m->epoch);
    ts_map_free(m);

    /* Spread again, to the end: the count stays 16, children go where they belong. */
    {
        int rc = -1; /* refused (busy) while the restarted node's PGs peer and catch up */
        for (int t = 0; t < 60 && rc; t++)
            if ((rc = cli("rebalance split --max-concurrent 4")) != 0) {
                assert_non_null(strstr(out, "not every PG is clean"));
                usleep(500000);
            }
        assert_int_equal(rc, 0);
    }
    assert_non_null(strstr(out, "rebalance: done"));
    m = map_now();
    assert_non_null(m);
    assert_int_equal(m->pg_count, 16);
    assert_null(m->move);
    assert_int_equal(ts_map_placement_pgs(m), 16);
    for (uint32_t pg = PGS; pg < 2 * PGS; pg++)
        moved += !with_parent(m, pg, PGS);
    fprintf(stderr, "  split done at map epoch %llu: %d of %d children placed apart\n",
            (unsigned long long)m->epoch, moved, PGS);
    assert_true(moved > 0);

    atomic_store(&stop, 1);
    pthread_join(w, NULL);
    fprintf(stderr, "  load: %u writes acknowledged, %u verified reads, %u bad\n",
            atomic_load(&nacked), atomic_load(&reads), atomic_load(&bad_reads));
    assert_true(atomic_load(&nacked) > 20);
    assert_int_equal(atomic_load(&bad_reads), 0);
    assert_int_equal(check_all(m), 0);
    ts_map_free(m);
}

/* A PG count that is no split (not twice, four times... the count) is refused everywhere, and
 * so is a smaller one; the map stays as it was. */
static void test_no_split_refused(void **state)
{
    struct ts_map *m = map_now(), *bad;
    uint64_t epoch;

    (void)state;
    assert_non_null(m);
    epoch = m->epoch;
    for (int k = 0; k < 2; k++) {
        bad = ts_map_dup(m);
        assert_non_null(bad);
        bad->epoch = epoch + 1;
        bad->pg_count = k ? m->pg_count / 2 : m->pg_count * 3;
        bad->placement_pgs = 0;
        assert_int_not_equal(raw_map_push(CL.tls_listen[0], bad), 0);
        ts_map_free(bad);
    }
    ts_map_free(m);
    for (int i = 0; i < CL.n; i++) {
        m = raw_map_get(CL.node[i].addr);
        assert_non_null(m);
        assert_true(m->epoch == epoch);
        ts_map_free(m);
    }
}

static int setup(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 64u << 10, 0, 0, 0, 0};
    tessera_client *c = NULL;
    uint8_t *buf = malloc(LEN);
    int rc = -1;

    (void)state;
    if (!buf || tsd_cluster_start(&CL, 4, NULL, PGS, NULL) != 0)
        goto out;
    if (test_tls_open(&c, CL.tls_listen[0], "writer", NULL, NULL) != 0 ||
        tessera_dataset_create(c, "sp", &p) != 0)
        goto out;
    for (uint32_t s = 0; s < NPRE; s++) {
        fill(buf, LEN, s);
        if (tessera_put(c, "sp", s, buf, LEN, NULL, 0) != 0)
            goto out;
        atomic_store(&acked[s], 1);
    }
    rc = 0;
out:
    tessera_client_close(c);
    free(buf);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_kill_rollback_spread),
        cmocka_unit_test(test_no_split_refused),
    };
    int rc = cmocka_run_group_tests_name("split", tests, setup, teardown);

    if (rc)
        tsd_cluster_dump_logs(&CL);
    return rc;
}
