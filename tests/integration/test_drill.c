/*
 * tessera drill against a real 5-node cluster on this host: kill-primary, kill-node,
 * node-return, partition, slow-node, corrupt-chunk and fringe-lag, each with the CLI's built-in
 * load; every report must say 0 acknowledged writes lost, recovery within the bound, and the
 * load must have written.
 *
 * Every drill also reads every acknowledged shard from each core replica alone, and
 * test_replica_lacks_shards makes one lack shards the others still serve: the drill must fail.
 *
 * As root the test runs in a network namespace of its own, each node on an address of its own
 * (127.0.1.x): the partition drill's iptables rules stay in that namespace. Without root the
 * partition drill must refuse (and the rest runs on 127.0.0.1). TESSERA_TEST_FILTER runs only
 * the tests whose names match this cmocka pattern.
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

#define RECOVER_BOUND_S 20.0

static struct tsd_cluster CL;
static char report[600];
static int own_netns; /* in a network namespace of our own, nodes on 127.0.1.x */

static const char *agent; /* --agent TEMPLATE for the drills, or NULL (embedded mode) */

static int drill(const char *scenario, struct json_object **rep)
{
    char cmd[2048], opt[700] = "";
    int st;

    /* The agent through a shell, as over ssh: the template names the node's own address. */
    if (agent)
        snprintf(opt, sizeof(opt), " --agent '%s'", agent);
    snprintf(report, sizeof(report), "%s/drill-%s.json", CL.dir, scenario);
    snprintf(cmd, sizeof(cmd),
             "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s --timeout 3000 drill %s "
             "--duration 4 --report %s%s >&2",
             TESSERA_CLI_PATH, CL.tls_listen[0], test_cert("ca", "pem"), test_cert("admin", "pem"),
             test_cert("admin", "key"), scenario, report, opt);
    st = system(cmd);
    *rep = json_object_from_file(report);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double num(struct json_object *o, const char *k)
{
    struct json_object *v;
    return json_object_object_get_ex(o, k, &v) ? json_object_get_double(v) : -1;
}

/* The core replica entry of node id in a drill report, or NULL. */
static struct json_object *replica_in(struct json_object *rep, const char *id)
{
    struct json_object *arr, *r, *v;

    if (!json_object_object_get_ex(rep, "core_replicas", &arr))
        return NULL;
    for (size_t k = 0; k < json_object_array_length(arr); k++) {
        r = json_object_array_get_idx(arr, k);
        if (json_object_object_get_ex(r, "node", &v) && !strcmp(json_object_get_string(v), id))
            return r;
    }
    return NULL;
}

/* Every acknowledged shard was read from each of its 3 core replicas alone (every node is up
 * at the end of a drill), and none lacked it or served other bytes. */
static void replicas_whole(struct json_object *rep)
{
    struct json_object *arr;
    double checked = 0;

    assert_true(json_object_object_get_ex(rep, "core_replicas", &arr));
    assert_int_equal(json_object_array_length(arr), CL.n);
    for (size_t k = 0; k < json_object_array_length(arr); k++) {
        struct json_object *r = json_object_array_get_idx(arr, k);
        assert_true(num(r, "shards_missing") == 0);
        assert_true(num(r, "shards_mismatched") == 0);
        checked += num(r, "shards_checked");
    }
    assert_true(checked == 3 * num(rep, "acknowledged_writes"));
    assert_true(num(rep, "core_replica_shards_missing") == 0);
}

static void check(const char *scenario)
{
    struct json_object *rep = NULL;
    int rc = drill(scenario, &rep);

    assert_non_null(rep);
    fprintf(stderr, "%s\n", json_object_to_json_string_ext(rep, JSON_C_TO_STRING_PRETTY));
    assert_int_equal(rc, 0);
    assert_true(num(rep, "acknowledged_writes") > 5);
    assert_true(num(rep, "acknowledged_writes_lost") == 0);
    assert_true(num(rep, "time_to_recover_s") >= 0);
    assert_true(num(rep, "time_to_recover_s") < RECOVER_BOUND_S);
    replicas_whole(rep);
    json_object_put(rep);
}

static void test_kill_primary(void **state)
{
    check("kill-primary");
}

static void test_kill_node(void **state)
{
    check("kill-node");
}

static void test_node_return(void **state)
{
    check("node-return");
}

static void test_slow_node(void **state)
{
    check("slow-node");
}

/* Bytes flipped in a replica's blob files: found as checksum errors (never wrong bytes), the
 * cluster's reads do not fail, the node repairs them from its primaries. */
static void test_corrupt_chunk(void **state)
{
    struct json_object *rep = NULL;
    int rc = drill("corrupt-chunk", &rep);

    assert_non_null(rep);
    fprintf(stderr, "%s\n", json_object_to_json_string_ext(rep, JSON_C_TO_STRING_PRETTY));
    assert_int_equal(rc, 0);
    assert_true(num(rep, "bytes_flipped") > 0);
    assert_true(num(rep, "node_checksum_errors") > 0);
    assert_true(num(rep, "node_shards_bad_after_repair") == 0);
    assert_true(num(rep, "acknowledged_writes_lost") == 0);
    assert_true(num(rep, "reads_failed") == 0);
    replicas_whole(rep);
    json_object_put(rep);
}

/* A stopped fringe replica: writes go on, its lag shows and drains. */
static void test_fringe_lag(void **state)
{
    struct json_object *rep = NULL;

    check("fringe-lag");
    assert_int_equal(drill("fringe-lag", &rep), 0);
    assert_true(num(rep, "fringe_lag_max_ops") > 0);
    assert_true(num(rep, "writes_failed") == 0);
    json_object_put(rep);
}

/* The primary of the next PG cut off from its peers (iptables), clients still reaching it:
 * it acknowledges nothing alone, the others take over, and healed it catches up. */
static void test_partition(void **state)
{
    struct json_object *rep = NULL;
    int rc;

    if (own_netns) {
        /* Nodes talk to each other from their own addresses (what a cut by address needs):
         * established connections between nodes, none from 127.0.0.1 (nothing else is
         * connected now). */
        FILE *f = popen("ss -Htn state established", "r");
        char line[512];
        int between = 0, from_lo = 0;
        assert_non_null(f);
        while (fgets(line, sizeof(line), f)) {
            char a[128], b[128];
            if (sscanf(line, "%*s %*s %127s %127s", a, b) != 2)
                continue;
            between += !strncmp(a, "127.0.1.", 8) && !strncmp(b, "127.0.1.", 8);
            from_lo += !strncmp(a, "127.0.0.1:", 10) || !strncmp(b, "127.0.0.1:", 10);
        }
        pclose(f);
        fprintf(stderr, "connections between nodes: %d, with 127.0.0.1: %d\n", between, from_lo);
        assert_true(between > 0);
        assert_int_equal(from_lo, 0);
    }
    rc = drill("partition", &rep);

    if (!own_netns) {
        assert_int_not_equal(rc, 0); /* refused: the nodes share 127.0.0.1, or no root */
        assert_null(rep);
        skip();
    }
    assert_non_null(rep);
    fprintf(stderr, "%s\n", json_object_to_json_string_ext(rep, JSON_C_TO_STRING_PRETTY));
    assert_int_equal(rc, 0);
    assert_true(num(rep, "acknowledged_writes") > 5);
    assert_true(num(rep, "acknowledged_writes_lost") == 0);
    assert_true(num(rep, "writes_failed") > 0); /* the cut was felt */
    assert_true(num(rep, "time_to_detect_s") >= 0);
    assert_true(num(rep, "time_to_recover_s") >= 0);
    assert_true(num(rep, "time_to_recover_s") < RECOVER_BOUND_S);
    assert_true(num(rep, "node_shards_missing_after_heal") == 0);
    replicas_whole(rep);
    json_object_put(rep);
    /* The rules are gone: the nodes reach each other again. */
    assert_int_not_equal(system("iptables -w -S TESSERA_DRILL >/dev/null 2>&1"), 0);
}

/* The same drills with every act done by `tessera agent` in a process of its own, started
 * from the --agent template (as `ssh {host} tessera -s {addr} agent --node {node}` would on a
 * real cluster):
 * kill and start (kill-primary), stop and cont (slow-node), term, gone and flip
 * (corrupt-chunk), cut and heal (partition). */
static void test_through_agent(void **state)
{
    static char tmpl[700];

    snprintf(tmpl, sizeof(tmpl), "%s -s {addr} agent --node {node}", TESSERA_CLI_PATH);
    agent = tmpl;
    check("kill-primary");
    check("slow-node");
    test_corrupt_chunk(state);
    if (own_netns)
        test_partition(state);
    agent = NULL;
}

/*
 * A core replica that lacks acknowledged shards the others still serve. corrupt-chunk through
 * an agent that, while the drill has the node stopped (SIGTERM), also drops the records of the
 * drill dataset's shards 0-63 from its store (corrupt_chunk ... drop: a store that lost data
 * behind its log's back; the PG log still has them, so nothing brings them back before the
 * drill ends, as test_cluster's test_missing_shard_found_by_scrub shows). Read through the
 * cluster every shard comes back (the router reads another replica: no acknowledged write lost,
 * all the drills checked before); read from each core replica alone, the node lacks some: the
 * drill must fail and its report say where.
 */
static void test_replica_lacks_shards(void **state)
{
    static char tmpl[700];
    struct json_object *rep = NULL, *arr, *v;
    char script[600], log[600], cmd[700];
    const char *node;
    FILE *f;
    int rc;

    snprintf(script, sizeof(script), "%s/lose-shards.sh", CL.dir);
    snprintf(log, sizeof(log), "%s/lose-shards.log", CL.dir);
    f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f, "# NODE ADDR ACT [ARG...]: the agent; at `flip` NODE's store also loses shards\n"
               "node=$1 addr=$2\nshift 2\nif [ \"$1\" = flip ]; then\n  case $node in\n");
    for (int i = 0; i < CL.n; i++)
        fprintf(f, "  %s) data='%s' ;;\n", CL.id[i], CL.node[i].data);
    fprintf(f,
            "  esac\n  %s \"$data\" 'drill-corrupt-chunk-*' 0-63 drop >>'%s' 2>&1 || exit 1\nfi\n"
            "exec %s -s \"$addr\" agent --node \"$node\" \"$@\"\n",
            CORRUPT_CHUNK_PATH, log, TESSERA_CLI_PATH);
    fclose(f);
    snprintf(tmpl, sizeof(tmpl), "sh %s {node} {addr}", script);
    agent = tmpl;
    rc = drill("corrupt-chunk", &rep);
    agent = NULL;
    snprintf(cmd, sizeof(cmd), "cat '%s' >&2", log);
    (void)!system(cmd);
    assert_non_null(rep);
    fprintf(stderr, "%s\n", json_object_to_json_string_ext(rep, JSON_C_TO_STRING_PRETTY));
    assert_true(json_object_object_get_ex(rep, "node", &v));
    node = json_object_get_string(v);
    assert_true(num(rep, "acknowledged_writes") > 5);
    assert_true(num(rep, "acknowledged_writes_lost") == 0); /* through the cluster: all there */
    assert_int_not_equal(rc, 0);                            /* but the drill fails */
    assert_true(num(rep, "core_replica_shards_missing") > 0);
    assert_non_null(replica_in(rep, node));
    assert_true(num(replica_in(rep, node), "shards_missing") > 0);
    assert_true(json_object_object_get_ex(rep, "core_replicas", &arr));
    assert_int_equal(json_object_array_length(arr), CL.n); /* every node up, every node read */
    for (size_t k = 0; k < json_object_array_length(arr); k++) {
        struct json_object *r = json_object_array_get_idx(arr, k);
        assert_true(num(r, "shards_checked") > 0);
        assert_true(num(r, "shards_mismatched") == 0);
        json_object_object_get_ex(r, "node", &v);
        if (strcmp(json_object_get_string(v), node))
            assert_true(num(r, "shards_missing") == 0); /* the others hold every one */
    }
    json_object_put(rep);
}

static void test_bad_scenario(void **state)
{
    struct json_object *rep = NULL;
    assert_int_not_equal(drill("no-such-drill", &rep), 0);
    assert_null(rep);
}

static int setup(void **state)
{
    static const char *const domains[] = {"a", "a", "b", "b", "c"};
    return tsd_cluster_start(&CL, 5, domains, 16, NULL);
}

/* Drills restart the nodes they kill: stop every tesserad of the cluster. */
static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop_restarted(&CL);
}

/* As root: a network namespace of our own with its loopback up, and nodes on own addresses. */
static int enter_netns(void)
{
    if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0) {
        fprintf(stderr, "drill: not root or no network namespace: partition must refuse\n");
        return 0;
    }
    if (system("ip link set lo up") != 0) {
        fprintf(stderr, "drill: cannot bring up the namespace's loopback\n");
        return -1;
    }
    own_netns = 1;
    tsd_cluster_own_hosts = 1;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corrupt_chunk), cmocka_unit_test(test_fringe_lag),
        cmocka_unit_test(test_bad_scenario),  cmocka_unit_test(test_kill_primary),
        cmocka_unit_test(test_kill_node),     cmocka_unit_test(test_node_return),
        cmocka_unit_test(test_slow_node),     cmocka_unit_test(test_partition),
        cmocka_unit_test(test_through_agent), cmocka_unit_test(test_replica_lacks_shards),
    };
    const char *filter = getenv("TESSERA_TEST_FILTER"); /* e.g. "test_replica_*" */

    if (filter && *filter)
        cmocka_set_test_filter(filter);
    if (enter_netns() != 0)
        return 1;
    return cmocka_run_group_tests_name("drill", tests, setup, teardown);
}
