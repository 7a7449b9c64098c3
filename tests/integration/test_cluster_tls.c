/*
 * A 3-node cluster that speaks only TLS 1.3 with mutual authentication: clients present
 * role certificates, nodes replicate to each other with their node certificates (OU=node).
 * Writes through the cluster client reach every core replica; a client without a
 * certificate is refused by every node.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N 3
static struct tsd_proc node[N];
static char map_path[600], certs[512];
static char ca[600], ncert[N][600], nkey[N][600], plain[N][64], tlsa[N][64], ids[N][8];

static int open_as(int i, const char *role, tessera_client **c)
{
    return test_tls_open(c, node[i].tls_addr, role, NULL, NULL);
}

static int group_setup(void **state)
{
    const char *dir = test_certs();
    FILE *f;

    if (!dir)
        return -1;
    snprintf(certs, sizeof(certs), "%s", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", certs);
    snprintf(map_path, sizeof(map_path), "%s/tls-cluster.map", certs);
    f = fopen(map_path, "w");
    if (!f)
        return -1;
    int ports[2 * N];
    if (tsd_free_ports(ports, 2 * N) != 0) {
        fclose(f);
        return -1;
    }
    fprintf(f, "epoch = 1;\npg_count = 8;\nnodes = (\n");
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "t%d", i + 1);
        /* Its node certificate serves the TLS listener and authenticates it to peers. */
        snprintf(ncert[i], sizeof(ncert[i]), "%s/node-%s.pem", certs, ids[i]);
        snprintf(nkey[i], sizeof(nkey[i]), "%s/node-%s.key", certs, ids[i]);
        snprintf(plain[i], sizeof(plain[i]), "127.0.0.1:%d", ports[2 * i]);
        snprintf(tlsa[i], sizeof(tlsa[i]), "127.0.0.1:%d", ports[2 * i + 1]);
        fprintf(f, "  { id = \"%s\"; addr = \"%s\"; tls_addr = \"%s\"; weight = 100; }%s\n", ids[i],
                plain[i], tlsa[i], i + 1 < N ? "," : "");
    }
    fprintf(f, ");\n");
    fclose(f);
    for (int i = 0; i < N; i++) {
        const char *const a[] = {"--listen",
                                 "",
                                 "--tls-listen",
                                 tlsa[i],
                                 "--tls-cert",
                                 ncert[i],
                                 "--tls-key",
                                 nkey[i],
                                 "--tls-ca",
                                 ca,
                                 "--tls-require-client-cert",
                                 "--anonymous-role",
                                 "none",
                                 "--node-id",
                                 ids[i],
                                 "--map-file",
                                 map_path,
                                 "--peer-timeout-ms",
                                 "1500",
                                 NULL};
        if (tsd_start(&node[i], a) != 0)
            return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    int bad = 0;
    for (int i = 0; i < N; i++) {
        int st = tsd_stop(&node[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            tsd_dump_log(&node[i]);
            bad = 1;
        }
        tsd_cleanup(&node[i]);
    }
    return bad ? -1 : 0;
}

/* Complete shards of dataset ds on node i, from its own STATUS (local store). */
static long local_shards(int i, const char *ds)
{
    tessera_client *c;
    char *json = NULL;
    long n = -1;

    /* A handle whose seed is node i answers STATUS from node i. */
    if (open_as(i, "admin", &c) != 0)
        return -1;
    if (tessera_status(c, &json) == 0) {
        json_object *j = json_tokener_parse(json), *arr, *name;
        if (j && json_object_object_get_ex(j, "datasets", &arr)) {
            for (size_t k = 0; k < json_object_array_length(arr); k++) {
                json_object *d = json_object_array_get_idx(arr, k), *sh;
                if (json_object_object_get_ex(d, "name", &name) &&
                    !strcmp(json_object_get_string(name), ds) &&
                    json_object_object_get_ex(d, "shards", &sh))
                    n = (long)json_object_get_int64(sh);
            }
        }
        json_object_put(j);
    }
    free(json);
    tessera_client_close(c);
    return n;
}

static void test_replicated_over_mutual_tls(void **state)
{
    tessera_client *c;
    struct ts_dataset_policy p = {3, 0, 3, 65536, 0, 0, 0, 0};
    uint8_t data[200000], back[200000];
    size_t n;

    assert_int_equal(node[0].addr[0], '\0'); /* TLS only */
    assert_int_equal(open_as(0, "writer", &c), 0);
    assert_true(tessera_client_epoch(c) == 1);
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 13 + (i >> 8));
    assert_int_equal(tessera_dataset_create(c, "tlsrep", &p), 0);
    for (uint32_t s = 0; s < 6; s++)
        assert_int_equal(tessera_put(c, "tlsrep", s, data, sizeof(data), NULL, 0), 0);
    for (uint32_t s = 0; s < 6; s++) {
        assert_int_equal(tessera_read(c, "tlsrep", s, 0, sizeof(back), back, &n), 0);
        assert_int_equal(n, sizeof(data));
        assert_memory_equal(back, data, n);
    }
    tessera_client_close(c);
    /* core 3 on 3 nodes, min_core 3: every node holds every shard, replicated over TLS. */
    for (int i = 0; i < N; i++)
        assert_int_equal(local_shards(i, "tlsrep"), 6);
}

static void test_no_certificate_refused(void **state)
{
    tessera_client *c;
    int rc;

    for (int i = 0; i < N; i++) {
        rc = open_as(i, NULL, &c);
        assert_true(rc == TS_ETLS || rc == TS_ECONNRESET || rc == TS_EAUTH);
        assert_null(c);
    }
    /* A reader may read but not write, on any node. */
    assert_int_equal(open_as(1, "reader", &c), 0);
    uint8_t b[16];
    size_t n;
    assert_int_equal(tessera_read(c, "tlsrep", 0, 0, sizeof(b), b, &n), 0);
    assert_int_equal(tessera_put(c, "tlsrep", 99, b, sizeof(b), NULL, 0), TS_EPERM);
    tessera_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replicated_over_mutual_tls),
        cmocka_unit_test(test_no_certificate_refused),
    };
    int rc = cmocka_run_group_tests_name("cluster-tls", tests, group_setup, group_teardown);
    if (rc)
        for (int i = 0; i < N; i++)
            tsd_dump_log(&node[i]);
    return rc;
}
