/*
 * Issue 27: acknowledged writes rolled back when a partition heals. The partition drill, as an
 * operator runs it (`tessera drill partition` over mutual TLS), again and again on one 5-node
 * cluster in a network namespace of its own (nodes on 127.0.1.1-5, iptables cutting the
 * primary of the PG the load writes next off from its peers while its clients still reach
 * it): writers count every acknowledged put, the node is failed over, the cut healed, the node
 * marked up. The nodes run sync = seal (the default; seals through the group commit). After
 * every run:
 *  - every acknowledged shard reads back byte for byte (the cluster's choice of replica), and
 *    from each of its core replicas alone (core_replica_shards_missing);
 *  - no node rolled back a log entry of an acknowledged shard (acknowledged_entries_rolled_back,
 *    from the nodes' STATUS "rolled_back": what every truncate removed);
 *  - the fault happened: writes failed while the node was cut off, and the map moved on.
 *
 * Before the fix (a push's stale PG_INFO reply acted on while its primary peered after the
 * heal) this rolled acknowledged entries back within a few runs. TESSERA_PARTITION_RUNS (default
 * 30) and TESSERA_PARTITION_SECS (the drill's --duration, default 3) size it. Needs root and a
 * network namespace; else it skips (77) saying so.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <json-c/json.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tessera/tessera.h"

static struct tsd_cluster CL;

static double num(struct json_object *o, const char *k)
{
    struct json_object *v;
    return json_object_object_get_ex(o, k, &v) ? json_object_get_double(v) : -1;
}

static unsigned env_u(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

static int partition(unsigned run, unsigned secs, struct json_object **rep)
{
    char cmd[2048], report[600];
    int st;

    snprintf(report, sizeof(report), "%s/partition-%u.json", CL.dir, run);
    snprintf(cmd, sizeof(cmd),
             "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s --timeout 3000 drill partition "
             "--duration %u --report %s > %s/partition-%u.out 2>&1",
             TESSERA_CLI_PATH, CL.tls_listen[0], test_cert("ca", "pem"), test_cert("admin", "pem"),
             test_cert("admin", "key"), secs, report, CL.dir, run);
    st = system(cmd);
    *rep = json_object_from_file(report);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_partition_heals_without_rollback(void **state)
{
    unsigned runs = env_u("TESSERA_PARTITION_RUNS", 30), secs = env_u("TESSERA_PARTITION_SECS", 3);
    double acked = 0, failed = 0, rolled = 0, epoch = 0;
    unsigned nodes_cut[5] = {0};

    for (unsigned run = 1; run <= runs; run++) {
        struct json_object *rep = NULL, *v;
        int rc = partition(run, secs, &rep);
        const char *node = "";
        char out[700];

        snprintf(out, sizeof(out), "cat %s/partition-%u.out >&2", CL.dir, run);
        if (rc != 0 || !rep)
            (void)!system(out); /* the drill's own log and report say what went wrong */
        assert_non_null(rep);
        if (json_object_object_get_ex(rep, "node", &v))
            node = json_object_get_string(v);
        fprintf(stderr,
                "partition %2u/%u: cut %s; %4.0f acknowledged, %3.0f failed while cut, lost %.0f, "
                "acknowledged entries rolled back %.0f (entries rolled back: %.0f), core "
                "replicas missing %.0f; map epoch %.0f\n",
                run, runs, node, num(rep, "acknowledged_writes"), num(rep, "writes_failed"),
                num(rep, "acknowledged_writes_lost"), num(rep, "acknowledged_entries_rolled_back"),
                num(rep, "entries_rolled_back"), num(rep, "core_replica_shards_missing"),
                num(rep, "map_epoch"));
        /* What a user relies on. */
        assert_int_equal(num(rep, "acknowledged_writes_lost"), 0);
        assert_int_equal(num(rep, "acknowledged_entries_rolled_back"), 0);
        assert_int_equal(num(rep, "rolled_back_not_inspected"), 0); /* every rollback was seen */
        assert_int_equal(num(rep, "node_shards_missing_after_heal"), 0);
        assert_int_equal(num(rep, "core_replica_shards_missing"), 0);
        assert_int_equal(rc, 0);
        /* The fault happened: writes to the cut node's PGs failed, the map moved on (a failover
         * and an up: two epochs at least). */
        assert_true(num(rep, "acknowledged_writes") > 5);
        assert_true(num(rep, "writes_failed") > 0);
        assert_true(num(rep, "map_epoch") >= epoch + 2);
        epoch = num(rep, "map_epoch");
        acked += num(rep, "acknowledged_writes");
        failed += num(rep, "writes_failed");
        rolled += num(rep, "entries_rolled_back");
        if (node[0] == 'n' && node[1] >= '1' && node[1] <= '5')
            nodes_cut[node[1] - '1']++;
        json_object_put(rep);
    }
    fprintf(
        stderr,
        "%u partitions healed (cut n1..n5: %u %u %u %u %u times): %.0f acknowledged writes, "
        "%.0f failed while cut, 0 lost, 0 acknowledged entries rolled back (%.0f unacknowledged "
        "entries rolled back)\n",
        runs, nodes_cut[0], nodes_cut[1], nodes_cut[2], nodes_cut[3], nodes_cut[4], acked, failed,
        rolled);
}

static int setup(void **state)
{
    static const char *const domains[] = {"a", "a", "b", "b", "c"};
    /* The default durable policy (the harness starts nodes with sync none): seals go through
     * the group commit, their replies parked until the WAL sync, as in production. */
    static const char *const extra[] = {"--sync", "seal", NULL};
    return tsd_cluster_start(&CL, 5, domains, 32, extra);
}

/* Drills restart the nodes they kill: stop every tesserad of the cluster. */
static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop_restarted(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition_heals_without_rollback),
    };
    if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0) {
        fprintf(stderr, "test_partition_loop: SKIP: needs root and a network namespace of its "
                        "own (iptables cuts nodes off by address)\n");
        return 77;
    }
    if (system("ip link set lo up") != 0 || system("iptables -w -L >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_partition_loop: cannot bring up the namespace's loopback, or no "
                        "iptables (scripts/deps installs it)\n");
        return 1;
    }
    tsd_cluster_own_hosts = 1;
    return cmocka_run_group_tests_name("partition loop", tests, setup, teardown);
}
