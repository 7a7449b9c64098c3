/*
 * Scheduled scrubs (storage.scrub_interval_s) on a real 3-node cluster, every shard on every
 * node: a byte flipped in a chunk file of a stopped node, which then comes back, is found by
 * the node's own scheduled scrub (no client asks for one) and rewritten with a replica's copy;
 * a later scheduled pass is clean, and the shard reads from that node byte for byte. The
 * schedule is kept across restarts (data_dir/scrub.last; a time ahead of the clock is not
 * trusted), and the metrics say when the next scrub is due.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef CORRUPT_CHUNK_PATH
#error "CORRUPT_CHUNK_PATH must be defined by the build"
#endif

#define EVERY_S 3 /* storage.scrub_interval_s */
#define EVERY_S_ARG "3"
#define LONG_EVERY_S 100000 /* node 1's */
#define SLEN (1u << 20)
#define SEED 41

static struct tsd_cluster CL;

static tessera_client *admin(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tsd_client_opts(&o, &CL.node[0], "admin");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

static void write_last(const char *path, long long t)
{
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fprintf(f, "%lld\n", t);
    assert_int_equal(fclose(f), 0);
}

/* Waits up to ms for metric name of node i to reach at least v: its last value. */
static double metric_at_least(int i, const char *name, double v, int ms)
{
    double got = tsd_metric(&CL.node[i], name);

    for (int t = 0; t < ms / 100 && got < v; t++) {
        usleep(100 * 1000);
        got = tsd_metric(&CL.node[i], name);
    }
    return got;
}

static void test_damage_found_by_the_schedule(void **state)
{
    const int v = 2; /* the victim: it holds every shard, as every node does */
    struct ts_dataset_policy p = {3, 0, 2, 64u << 10, 0, 0, 0, 0};
    uint8_t *want = malloc(SLEN), *got = malloc(SLEN);
    tessera_client *c = admin();
    double runs, corrupt, next, now;
    char cmd[1024], path[600];
    size_t n = 0;
    FILE *f;
    long long last = 0;

    assert_int_equal(tessera_dataset_create(c, "patrol", &p), 0);
    assert_int_equal(tsd_put_pattern(c, "patrol", 0, SLEN, SEED), 0);
    assert_int_equal(tessera_dataset_seal(c, "patrol"), 0);
    tessera_client_close(c);
    ts_test_fill(want, SLEN, SEED, 0);

    /* The schedule is in the metrics and on disk. */
    now = (double)time(NULL);
    next = tsd_metric(&CL.node[v], "tessera_scrub_next_timestamp_seconds");
    assert_true(next > now - 2 * EVERY_S && next <= now + EVERY_S + 1);
    snprintf(path, sizeof(path), "%s/scrub.last", CL.node[v].data);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lld", &last), 1);
    fclose(f);
    assert_true(last > 0 && (double)last <= now);

    /* The schedule is read back at a start: node 1 (its interval 100,000 s), told its last
     * scrub ended 50,000 s ago, is next due 50,000 s from now, not an interval after its start;
     * told it ended in the future (a clock once set wrong), its clock starts now instead of
     * holding every scrub off until then. */
    assert_int_equal(tsd_stop(&CL.node[1]), 0);
    snprintf(path, sizeof(path), "%s/scrub.last", CL.node[1].data);
    last = (long long)time(NULL) - 50000;
    write_last(path, last);
    assert_int_equal(tsd_start(&CL.node[1], NULL), 0);
    assert_true(tsd_metric(&CL.node[1], "tessera_scrub_next_timestamp_seconds") ==
                (double)(last + LONG_EVERY_S));
    assert_int_equal(tsd_stop(&CL.node[1]), 0);
    write_last(path, (long long)time(NULL) + 50000);
    now = (double)time(NULL);
    assert_int_equal(tsd_start(&CL.node[1], NULL), 0);
    next = tsd_metric(&CL.node[1], "tessera_scrub_next_timestamp_seconds");
    assert_true(next >= now + LONG_EVERY_S && next <= (double)time(NULL) + LONG_EVERY_S);

    /* A byte of chunk 3 flipped on disk while the victim is down. */
    assert_int_equal(tsd_stop(&CL.node[v]), 0);
    snprintf(cmd, sizeof(cmd), "%s %s patrol 0 3 >/dev/null", CORRUPT_CHUNK_PATH, CL.node[v].data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&CL.node[v], NULL), 0);

    /* Nobody reads the shard or asks for a scrub: the schedule finds the damage (the fault
     * happened, and it is what found it) ... */
    corrupt = metric_at_least(v, "tessera_scrub_corrupt_chunks_total", 1, 30000);
    assert_true(corrupt >= 1);
    runs = tsd_metric(&CL.node[v], "tessera_scrubs_total");
    /* ... the node rewrites the chunk with a replica's copy, and a later scheduled pass, which
     * reads the disk again, is clean (two more: the one that found it may not have been
     * counted yet when runs was read). */
    assert_true(metric_at_least(v, "tessera_scrubs_total", runs + 2, 30000) >= runs + 2);
    assert_true(tsd_metric(&CL.node[v], "tessera_scrub_corrupt_chunks_total") == corrupt);
    assert_int_equal(raw_read_shard(CL.listen[v], "patrol", 0, SLEN, got, &n), 0);
    assert_int_equal(n, SLEN);
    assert_memory_equal(got, want, SLEN);
    free(want);
    free(got);
}

static int setup(void **state)
{
    const char *const extra[] = {"--storage-scrub-interval-s",
                                 EVERY_S_ARG,
                                 "--storage-scrub-mb-s",
                                 "20",
                                 "--metrics-listen",
                                 "127.0.0.1:0",
                                 NULL};
    const char *const n2[] = {"--storage-scrub-interval-s", "100000", NULL};
    const char *const *const each[] = {NULL, n2, NULL};

    (void)state;
    memset(&CL, 0, sizeof(CL));
    return tsd_cluster_start_each(&CL, 3, NULL, 8, extra, each);
}

static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_damage_found_by_the_schedule),
    };
    int rc = cmocka_run_group_tests_name("scheduled scrubs", tests, setup, teardown);

    if (rc)
        tsd_cluster_dump_logs(&CL);
    return rc;
}
