/*
 * The etcd client (control/etcd.c) against a real 3-member etcd cluster on loopback: values
 * byte for byte (NULs too), compare-and-swap with one winner (two processes racing 60 times:
 * a linear history, no lost update), leases that keep keys alive and expire with them, watches,
 * one member killed (nothing changes), the majority killed (a clear timeout, then normal again
 * once they are back), and mutual TLS (a client without a certificate is refused). The map
 * store (control/mapstore.c): two writers changing the map 20 times each at once make one
 * history, every epoch once, each the last plus one.
 */
#include "etcd_harness.h"

#include "etcd.h"
#include "mapstore.h"
#include "tessera/errno.h"
#include "ts_proto.h"
#include "ts_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct etcd_cluster E;

static ts_etcd *client(int timeout_ms)
{
    struct ts_etcd_opts o = {.endpoints = E.endpoints, .timeout_ms = timeout_ms};
    ts_etcd *e = NULL;

    assert_int_equal(ts_etcd_open(&e, &o), 0);
    return e;
}

static void test_put_get_bytes(void **state)
{
    ts_etcd *e = client(3000);
    const uint8_t v[] = {0, 1, 2, 0xff, 0, 'x'};
    struct ts_etcd_kv kv;
    int64_t rev = 0, rev2 = 0;

    (void)state;
    assert_int_equal(ts_etcd_get(e, "/t/none", &kv, &rev), TS_ENOENT);
    assert_true(rev > 0);
    assert_int_equal(ts_etcd_put(e, "/t/a", v, sizeof(v), 0, &rev), 0);
    assert_int_equal(ts_etcd_get(e, "/t/a", &kv, &rev2), 0);
    assert_int_equal(kv.len, sizeof(v));
    assert_memory_equal(kv.value, v, sizeof(v));
    assert_true(kv.mod_rev == rev && rev2 >= rev);
    ts_etcd_kv_free(&kv);
    assert_int_equal(ts_etcd_put(e, "/t/a", "", 0, 0, NULL), 0); /* an empty value */
    assert_int_equal(ts_etcd_get(e, "/t/a", &kv, NULL), 0);
    assert_int_equal(kv.len, 0);
    ts_etcd_kv_free(&kv);
    assert_int_equal(ts_etcd_delete(e, "/t/a"), 0);
    assert_int_equal(ts_etcd_delete(e, "/t/a"), TS_ENOENT);
    ts_etcd_close(e);
}

/* Increments the counter at key n times by compare-and-swap, retrying on TS_ESTALE; writes the
 * values it won, one per line, to out. */
static int cas_increments(const char *key, int n, const char *out)
{
    ts_etcd *e = client(5000);
    FILE *f = fopen(out, "w");
    int rc = 0;

    for (int won = 0; won < n && !rc;) {
        struct ts_etcd_kv kv;
        char buf[32];
        long v = 0;
        int64_t mod = 0;
        rc = ts_etcd_get(e, key, &kv, NULL);
        if (rc == 0) {
            v = atol((const char *)kv.value);
            mod = kv.mod_rev;
        } else if (rc != TS_ENOENT) {
            break;
        }
        ts_etcd_kv_free(&kv);
        snprintf(buf, sizeof(buf), "%ld", v + 1);
        rc = ts_etcd_cas(e, key, mod, buf, strlen(buf), 0, NULL, NULL);
        if (rc == TS_ESTALE) {
            rc = 0; /* lost the race: read again */
            continue;
        }
        if (!rc) {
            fprintf(f, "%ld\n", v + 1);
            won++;
        }
    }
    fclose(f);
    ts_etcd_close(e);
    return rc;
}

static void test_cas_one_winner(void **state)
{
    ts_etcd *e = client(3000);
    struct ts_etcd_kv kv, now;
    int64_t rev;
    char out[2][700], cmd[1600];
    pid_t kid[2];
    int st;

    (void)state;
    /* Create only if absent: once. The loser learns what is there. */
    assert_int_equal(ts_etcd_cas(e, "/t/map", 0, "one", 3, 0, &rev, NULL), 0);
    assert_int_equal(ts_etcd_cas(e, "/t/map", 0, "two", 3, 0, NULL, &now), TS_ESTALE);
    assert_int_equal(now.len, 3);
    assert_memory_equal(now.value, "one", 3);
    assert_true(now.mod_rev == rev);
    ts_etcd_kv_free(&now);
    assert_int_equal(ts_etcd_cas(e, "/t/map", rev - 1, "two", 3, 0, NULL, NULL), TS_ESTALE);
    assert_int_equal(ts_etcd_cas(e, "/t/map", rev, "two", 3, 0, NULL, NULL), 0);
    assert_int_equal(ts_etcd_get(e, "/t/map", &kv, NULL), 0);
    assert_memory_equal(kv.value, "two", 3);
    ts_etcd_kv_free(&kv);

    /* Two processes, 30 increments each, at the same time: every value from 1 to 60 won by
     * exactly one of them (no lost update, no value twice). */
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof(out[k]), "%s/won-%d", E.dir, k);
        kid[k] = fork();
        if (kid[k] == 0)
            _exit(cas_increments("/t/counter", 30, out[k]) == 0 ? 0 : 1);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(waitpid(kid[k], &st, 0), kid[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    snprintf(cmd, sizeof(cmd),
             "test \"$(sort -n %s %s | tr '\\n' ' ')\" = \"$(seq 1 60 | tr '\\n' ' ')\"", out[0],
             out[1]);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(ts_etcd_get(e, "/t/counter", &kv, NULL), 0);
    assert_string_equal((const char *)kv.value, "60");
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
}

static void test_lease_keeps_and_expires(void **state)
{
    ts_etcd *e = client(3000);
    struct ts_etcd_kv kv;
    int64_t id = 0, ttl = 0;

    (void)state;
    assert_int_equal(ts_etcd_lease_grant(e, 2, &id), 0);
    assert_int_equal(ts_etcd_put(e, "/t/node", "up", 2, id, NULL), 0);
    for (int i = 0; i < 6; i++) { /* 3 s, longer than the TTL: kept alive */
        usleep(500 * 1000);
        assert_int_equal(ts_etcd_lease_keepalive(e, id, &ttl), 0);
        assert_true(ttl > 0);
    }
    assert_int_equal(ts_etcd_get(e, "/t/node", &kv, NULL), 0);
    assert_true(kv.lease == id);
    ts_etcd_kv_free(&kv);
    sleep(4); /* no keepalive: the lease and its key go */
    assert_int_equal(ts_etcd_get(e, "/t/node", &kv, NULL), TS_ENOENT);
    assert_int_equal(ts_etcd_lease_keepalive(e, id, &ttl), TS_ENOENT);
    /* Revoked: at once. */
    assert_int_equal(ts_etcd_lease_grant(e, 30, &id), 0);
    assert_int_equal(ts_etcd_put(e, "/t/node", "up", 2, id, NULL), 0);
    assert_int_equal(ts_etcd_lease_revoke(e, id), 0);
    assert_int_equal(ts_etcd_get(e, "/t/node", &kv, NULL), TS_ENOENT);
    ts_etcd_close(e);
}

static void test_watch(void **state)
{
    ts_etcd *e = client(3000);
    struct ts_etcd_kv kv;
    int64_t rev = 0, t0;
    int deleted;
    pid_t kid;

    (void)state;
    assert_int_equal(ts_etcd_put(e, "/t/w", "v1", 2, 0, &rev), 0);
    /* From a revision in the past: that change, at once. */
    assert_int_equal(ts_etcd_watch(e, "/t/w", rev, 2000, &kv, &deleted), 0);
    assert_true(kv.mod_rev == rev && !deleted);
    assert_memory_equal(kv.value, "v1", 2);
    ts_etcd_kv_free(&kv);
    /* Nothing new: a timeout, on time. */
    t0 = (int64_t)time(NULL);
    assert_int_equal(ts_etcd_watch(e, "/t/w", rev + 1, 500, &kv, &deleted), TS_ETIMEDOUT);
    assert_true((int64_t)time(NULL) - t0 <= 2);
    /* A change made while we wait. */
    kid = fork();
    if (kid == 0) {
        ts_etcd *w = client(3000);
        usleep(300 * 1000);
        _exit(ts_etcd_put(w, "/t/w", "v2", 2, 0, NULL) == 0 ? 0 : 1);
    }
    assert_int_equal(ts_etcd_watch(e, "/t/w", rev + 1, 5000, &kv, &deleted), 0);
    assert_memory_equal(kv.value, "v2", 2);
    assert_true(kv.mod_rev > rev);
    rev = kv.mod_rev;
    ts_etcd_kv_free(&kv);
    waitpid(kid, NULL, 0);
    assert_int_equal(ts_etcd_delete(e, "/t/w"), 0);
    assert_int_equal(ts_etcd_watch(e, "/t/w", rev + 1, 2000, &kv, &deleted), 0);
    assert_true(deleted && kv.len == 0);
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
}

static void test_members_lost_and_back(void **state)
{
    ts_etcd *e = client(1000);
    struct ts_etcd_kv kv;
    int rc;

    (void)state;
    assert_int_equal(ts_etcd_put(e, "/t/m", "a", 1, 0, NULL), 0);
    /* One member of three gone (the one the client used first, maybe the leader): writes go on
     * once the others elected a leader (election timeout 500 ms here). */
    etcd_member_kill(&E, 0);
    rc = -1;
    for (int t = 0; t < 50 && rc; t++) {
        rc = ts_etcd_put(e, "/t/m", "b", 1, 0, NULL);
        if (rc)
            usleep(100 * 1000);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(ts_etcd_get(e, "/t/m", &kv, NULL), 0);
    assert_memory_equal(kv.value, "b", 1);
    ts_etcd_kv_free(&kv);
    /* The majority gone: no write and no linearizable read, a clear error within the timeout. */
    etcd_member_kill(&E, 1);
    rc = ts_etcd_put(e, "/t/m", "c", 1, 0, NULL);
    fprintf(stderr, "  majority gone: %s: %s\n", ts_errname(rc), ts_etcd_error(e));
    assert_true(rc == TS_ETIMEDOUT || rc == TS_EUNAVAIL);
    rc = ts_etcd_get(e, "/t/m", &kv, NULL);
    assert_true(rc == TS_ETIMEDOUT || rc == TS_EUNAVAIL);
    /* Back: normal again. */
    assert_int_equal(etcd_member_start(&E, 0), 0);
    assert_int_equal(etcd_member_start(&E, 1), 0);
    rc = -1;
    for (int t = 0; t < 100 && rc; t++) {
        rc = ts_etcd_put(e, "/t/m", "d", 1, 0, NULL);
        if (rc)
            usleep(100 * 1000);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(ts_etcd_get(e, "/t/m", &kv, NULL), 0);
    assert_memory_equal(kv.value, "d", 1);
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
}

/* A single-member etcd that wants client certificates: ours works, none is refused. */
static void test_mutual_tls(void **state)
{
    struct etcd_cluster t;
    struct ts_etcd_opts o;
    char ca[700], cert[700], key[700];
    ts_etcd *e = NULL;
    struct ts_etcd_kv kv;

    (void)state;
    assert_int_equal(etcd_cluster_start(&t, 1, 1), 0);
    snprintf(ca, sizeof(ca), "%s/ca.pem", t.certs);
    snprintf(cert, sizeof(cert), "%s/admin.pem", t.certs);
    snprintf(key, sizeof(key), "%s/admin.key", t.certs);
    o = (struct ts_etcd_opts){.endpoints = t.endpoints, .ca = ca, .cert = cert, .key = key};
    assert_int_equal(ts_etcd_open(&e, &o), 0);
    assert_int_equal(ts_etcd_put(e, "/t/tls", "ok", 2, 0, NULL), 0);
    assert_int_equal(ts_etcd_get(e, "/t/tls", &kv, NULL), 0);
    assert_memory_equal(kv.value, "ok", 2);
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
    o.cert = o.key = NULL; /* no client certificate */
    assert_int_equal(ts_etcd_open(&e, &o), 0);
    assert_int_equal(ts_etcd_get(e, "/t/tls", &kv, NULL), TS_EUNAVAIL);
    fprintf(stderr, "  without a certificate: %s\n", ts_etcd_error(e));
    ts_etcd_close(e);
    etcd_cluster_stop(&t);
}

static const char MAP3[] = "epoch = 1; pg_count = 8; nodes = ("
                           "{ id = \"n1\"; addr = \"127.0.0.1:7101\"; weight = 100; },"
                           "{ id = \"n2\"; addr = \"127.0.0.1:7102\"; weight = 100; },"
                           "{ id = \"n3\"; addr = \"127.0.0.1:7103\"; weight = 100; });";

/* A change: node arg's weight becomes (the new epoch's) number; refuses node "n9". */
static int set_weight(void *arg, const struct ts_map *cur, struct ts_map **next, char *why,
                      size_t cap)
{
    int i = ts_map_find(cur, arg);

    if (i < 0) {
        snprintf(why, cap, "no node %s", (const char *)arg);
        return TS_ENOENT;
    }
    *next = ts_map_dup(cur);
    (*next)->epoch = cur->epoch + 1;
    (*next)->nodes[i].weight = (uint32_t)(*next)->epoch;
    return 0;
}

static int change_many(const char *node, int n, const char *out)
{
    ts_etcd *e = client(5000);
    FILE *f = fopen(out, "w");
    int rc = 0;

    for (int k = 0; k < n && !rc; k++) {
        uint64_t epoch = 0;
        char why[256];
        rc = ts_mapstore_change(e, "/tessera/t", set_weight, (void *)node, 100, &epoch, why,
                                sizeof(why));
        if (!rc)
            fprintf(f, "%llu\n", (unsigned long long)epoch);
        else
            fprintf(stderr, "change: %s\n", why);
    }
    fclose(f);
    ts_etcd_close(e);
    return rc;
}

static void test_map_history_is_linear(void **state)
{
    ts_etcd *e = client(3000);
    struct ts_map *m = NULL, *got = NULL;
    char err[256], why[256], out[2][700], cmd[1600];
    int64_t rev = 0, first_rev;
    uint64_t epoch = 0;
    pid_t kid[2];
    int st;

    (void)state;
    assert_int_equal(ts_map_parse_string(MAP3, &m, err, sizeof(err)), 0);
    assert_int_equal(ts_mapstore_get(e, "/tessera/t", &got, NULL), TS_ENOENT);
    assert_int_equal(ts_mapstore_init(e, "/tessera/t", m), 0);
    assert_int_equal(ts_mapstore_init(e, "/tessera/t", m), TS_EEXIST);
    assert_int_equal(ts_mapstore_get(e, "/tessera/t", &got, &first_rev), 0);
    assert_true(got->epoch == 1 && got->n == 3);
    ts_map_free(got);
    /* A refused change writes nothing. */
    assert_int_equal(
        ts_mapstore_change(e, "/tessera/t", set_weight, "n9", 3, &epoch, why, sizeof(why)),
        TS_ENOENT);
    assert_string_equal(why, "no node n9");
    assert_int_equal(ts_mapstore_get(e, "/tessera/t", &got, &rev), 0);
    assert_true(got->epoch == 1 && rev == first_rev);
    ts_map_free(got);

    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof(out[k]), "%s/epochs-%d", E.dir, k);
        kid[k] = fork();
        if (kid[k] == 0)
            _exit(change_many(k ? "n2" : "n3", 20, out[k]) == 0 ? 0 : 1);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(waitpid(kid[k], &st, 0), kid[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    /* The epochs the two won: 2..41, each once. */
    snprintf(cmd, sizeof(cmd),
             "test \"$(sort -n %s %s | tr '\\n' ' ')\" = \"$(seq 2 41 | tr '\\n' ' ')\"", out[0],
             out[1]);
    assert_int_equal(system(cmd), 0);
    /* etcd's history of the key: every revision a map of the epoch after the one before. */
    rev = first_rev;
    for (uint64_t want = 1; want <= 41; want++) {
        struct ts_etcd_kv kv;
        struct ts_rd r;
        int deleted;
        char key[64];
        assert_int_equal(ts_etcd_watch(e, ts_mapstore_key("/tessera/t", key, sizeof(key)), rev,
                                       2000, &kv, &deleted),
                         0);
        ts_rd_init(&r, kv.value, kv.len);
        assert_int_equal(ts_map_decode(&r, &got), 0);
        assert_true(got->epoch == want);
        rev = kv.mod_rev + 1;
        ts_map_free(got);
        ts_etcd_kv_free(&kv);
    }
    ts_map_free(m);
    ts_etcd_close(e);
}

static int setup(void **state)
{
    (void)state;
    return etcd_cluster_start(&E, 3, 0);
}

static int teardown(void **state)
{
    (void)state;
    etcd_cluster_stop(&E);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_bytes),           cmocka_unit_test(test_cas_one_winner),
        cmocka_unit_test(test_lease_keeps_and_expires), cmocka_unit_test(test_watch),
        cmocka_unit_test(test_map_history_is_linear),   cmocka_unit_test(test_mutual_tls),
        cmocka_unit_test(test_members_lost_and_back),
    };
    int rc;

    if ((rc = etcd_required("test_etcd")) != 0)
        return rc;
    rc = cmocka_run_group_tests_name("etcd", tests, setup, teardown);
    return rc;
}
