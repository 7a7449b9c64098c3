/*
 * Who may do what in a cluster, tried with raw frames from real connections: a client without a
 * certificate (plain TCP) is at most a reader whatever it sends; only a node certificate may
 * replicate, and only as the node it names, and only if that node is in the map; an admin may
 * not replicate; a node may not put or delete; a node refuses to start with a configuration that
 * would let strangers in; a peer presenting another node's certificate is not taken for the node.
 * After every refusal the data and the map are what they were.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_proto.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct tsd_cluster CL;

#define SLEN 70000u

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(((i + seed * 7919) * 2654435761u) >> 11);
}

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static tessera_client *client_as(int i, const char *role)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tsd_client_opts(&o, &CL.node[i], role);
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

/* Every shard of "keep" reads back as written, through a client without a certificate. */
static void assert_keep_intact(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    uint8_t *want = malloc(SLEN), *got = malloc(SLEN);
    size_t n;

    tessera_opts_init(&o);
    o.address = CL.node[1].addr;
    o.timeout_ms = 10000;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    for (uint32_t s = 0; s < 4; s++) {
        fill(want, SLEN, s);
        assert_int_equal(tessera_read(c, "keep", s, 0, SLEN, got, &n), 0);
        assert_int_equal(n, SLEN);
        assert_memory_equal(got, want, SLEN);
    }
    tessera_client_close(c);
    free(want);
    free(got);
}

static int group_setup(void **state)
{
    static const char *const extra[] = {"--sync", "always", NULL};
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};
    uint8_t *buf = malloc(SLEN);
    tessera_client *c;

    (void)state;
    if (tsd_cluster_start(&CL, 3, NULL, 8, extra) != 0)
        return -1;
    c = client_as(0, "writer");
    assert_int_equal(tessera_dataset_create(c, "keep", &p), 0);
    for (uint32_t s = 0; s < 4; s++) {
        fill(buf, SLEN, s);
        assert_int_equal(tessera_put(c, "keep", s, buf, SLEN, NULL, 0), 0);
    }
    tessera_client_close(c);
    free(buf);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

/* HELLO as name on fd: the reply's status; *role gets the role the node grants. */
static int hello(int fd, const char *name, int *role, char *msg, size_t cap)
{
    struct ts_wr w;
    uint8_t *p = NULL;
    size_t plen = 0;
    int rc;

    ts_wr_init(&w);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, name);
    rc = raw_send_frame(fd, TS_OP_HELLO, 0, 1, w.buf, w.len);
    ts_wr_fini(&w);
    if (rc == 0)
        rc = raw_recv_reply(fd, 5000, NULL, msg, cap, &p, &plen);
    if (rc == 0 && role) {
        struct ts_rd r;
        char id[128];
        ts_rd_init(&r, p + 4, plen - 4);
        ts_rd_u16(&r);
        ts_rd_str(&r, id, sizeof(id));
        *role = ts_rd_u8(&r);
    }
    free(p);
    return rc;
}

/* Sends op with payload (pl, len) on fd and returns the reply's status; msg gets its text. */
static int request(int fd, uint8_t op, const void *pl, size_t len, char *msg, size_t cap)
{
    static uint64_t id = 100;
    int rc = raw_send_frame(fd, op, 0, ++id, pl, len);
    return rc ? rc : raw_recv_reply(fd, 5000, NULL, msg, cap, NULL, NULL);
}

/* The operations only a node may do, each with a payload that would be accepted from one. */
static void node_only_ops_refused(int fd, const char *who)
{
    static const uint8_t ops[] = {TS_OP_REPL_WRITE, TS_OP_REPL_SEAL, TS_OP_PG_QUERY,
                                  TS_OP_PG_ACTIVATE, TS_OP_PG_PULL};
    uint8_t junk[64] = {0};
    char msg[300];

    for (size_t i = 0; i < sizeof(ops); i++) {
        int rc = request(fd, ops[i], junk, sizeof(junk), msg, sizeof(msg));
        fprintf(stderr, "  %s: %s -> %s: %s\n", who, ts_op_desc(ops[i])->name, ts_errname(rc), msg);
        assert_int_equal(rc, TS_EPERM);
    }
}

static void test_anonymous_is_a_reader(void **state)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr), *next;
    int fd = raw_connect(CL.node[0].addr), role = -1;
    struct ts_wr w;
    char msg[300];
    uint8_t chunk[64] = {0};

    (void)state;
    assert_non_null(m);
    assert_true(fd >= 0);
    /* The nodes run with the default anonymous_role (auto): in a cluster that is reader. */
    assert_int_equal(hello(fd, "anon", &role, msg, sizeof(msg)), 0);
    assert_int_equal(role, TS_ROLE_READER);
    node_only_ops_refused(fd, "anonymous");
    /* A newer, valid map is refused: the map stays. */
    next = ts_map_dup(m);
    next->epoch = m->epoch + 5;
    ts_wr_init(&w);
    ts_map_encode(&w, next);
    assert_int_equal(request(fd, TS_OP_MAP_PUSH, w.buf, w.len, msg, sizeof(msg)), TS_EPERM);
    ts_wr_fini(&w);
    /* Neither delete nor write. */
    ts_wr_init(&w);
    ts_wr_str(&w, "keep");
    assert_int_equal(request(fd, TS_OP_DATASET_DELETE, w.buf, w.len, msg, sizeof(msg)), TS_EPERM);
    fprintf(stderr, "  anonymous: dataset-delete -> %s\n", msg);
    ts_wr_fini(&w);
    ts_wr_init(&w);
    ts_wr_str(&w, "keep");
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, sizeof(chunk));
    ts_wr_u32(&w, ts_crc32c(0, chunk, sizeof(chunk)));
    ts_wr_u32(&w, sizeof(chunk));
    ts_wr_bytes(&w, chunk, sizeof(chunk));
    assert_int_equal(request(fd, TS_OP_SHARD_WRITE, w.buf, w.len, msg, sizeof(msg)), TS_EPERM);
    ts_wr_fini(&w);
    raw_close(fd);
    for (int i = 0; i < CL.n; i++) {
        struct ts_map *now = raw_map_get(CL.node[i].addr);
        assert_non_null(now);
        assert_true(now->epoch == m->epoch);
        ts_map_free(now);
    }
    assert_keep_intact();
    ts_map_free(next);
    ts_map_free(m);
}

static void test_admin_may_not_replicate(void **state)
{
    int fd = raw_connect_as(CL.node[0].tls_addr, "admin"), role = -1;
    char msg[300];

    (void)state;
    assert_true(fd >= 0);
    /* Even naming itself a node. */
    assert_int_equal(hello(fd, "node:n2", &role, msg, sizeof(msg)), 0);
    assert_int_equal(role, TS_ROLE_ADMIN);
    node_only_ops_refused(fd, "admin");
    raw_close(fd);
    assert_keep_intact();
}

static void test_node_is_who_its_certificate_says(void **state)
{
    int fd = raw_connect_as(CL.node[0].tls_addr, "node-n2"), role = -1;
    char msg[300];
    struct ts_wr w;

    (void)state;
    assert_true(fd >= 0);
    /* n2's certificate may not speak as n3. */
    assert_int_equal(hello(fd, "node:n3", &role, msg, sizeof(msg)), TS_EPERM);
    fprintf(stderr, "  node-n2 as n3: %s\n", msg);
    assert_non_null(strstr(msg, "n2"));
    assert_int_equal(hello(fd, "node:n2", &role, msg, sizeof(msg)), 0);
    assert_int_equal(role, TS_ROLE_NODE);
    /* A node certificate is not a writer's or an admin's. */
    ts_wr_init(&w);
    ts_wr_str(&w, "keep");
    assert_int_equal(request(fd, TS_OP_DATASET_DELETE, w.buf, w.len, msg, sizeof(msg)), TS_EPERM);
    ts_wr_fini(&w);
    raw_close(fd);

    /* n9 has a certificate of the CA but is in no map: no replication from it. */
    fd = raw_connect_as(CL.node[0].tls_addr, "node-n9");
    assert_true(fd >= 0);
    assert_int_equal(hello(fd, "node:n9", &role, msg, sizeof(msg)), 0);
    {
        uint8_t junk[64] = {0};
        assert_int_equal(request(fd, TS_OP_REPL_SEAL, junk, sizeof(junk), msg, sizeof(msg)),
                         TS_EPERM);
        fprintf(stderr, "  node-n9: repl-seal -> %s\n", msg);
        assert_non_null(strstr(msg, "not in this node's map"));
    }
    /* Nor a map (issue 28: every node installed and persisted one pushed by n9): a valid newer
     * map is refused, and the node keeps its own. */
    {
        struct ts_map *m = raw_map_get(CL.node[0].addr), *after;
        uint64_t e;
        struct ts_wr mw;
        assert_non_null(m);
        e = m->epoch;
        m->epoch = e + 1;
        ts_wr_init(&mw);
        ts_map_encode(&mw, m);
        assert_int_equal(request(fd, TS_OP_MAP_PUSH, mw.buf, mw.len, msg, sizeof(msg)), TS_EPERM);
        fprintf(stderr, "  node-n9: map-push -> %s\n", msg);
        assert_non_null(strstr(msg, "not in this node's map"));
        ts_wr_fini(&mw);
        after = raw_map_get(CL.node[0].addr);
        assert_non_null(after);
        assert_int_equal(after->epoch, e);
        ts_map_free(after);
        ts_map_free(m);
    }
    raw_close(fd);
    assert_keep_intact();
}

/* Issue 28: DATASET_CREATE with a policy the cluster cannot honour (no core replica, more
 * replicas than placement orders or than the map's 3 nodes, min_core above core) is refused
 * with a clear error, from an admin too, and creates nothing. */
static void test_impossible_policies_refused(void **state)
{
    static const uint8_t bad[][3] = {{0, 0, 0}, {255, 0, 1}, {4, 0, 2}, {2, 2, 1}, {2, 0, 3}};
    int fd = raw_connect_as(CL.node[0].tls_addr, "admin");
    char msg[300];

    (void)state;
    assert_true(fd >= 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ts_wr w;
        ts_wr_init(&w);
        ts_wr_str(&w, "impossible");
        ts_wr_u8(&w, bad[i][0]); /* core */
        ts_wr_u8(&w, bad[i][1]); /* fringe */
        ts_wr_u8(&w, bad[i][2]); /* min_core */
        ts_wr_u32(&w, 0);        /* chunk size: the default */
        assert_int_equal(request(fd, TS_OP_DATASET_CREATE, w.buf, w.len, msg, sizeof(msg)),
                         TS_EINVAL);
        fprintf(stderr, "  core %u fringe %u min_core %u -> %s\n", bad[i][0], bad[i][1], bad[i][2],
                msg);
        assert_non_null(strstr(msg, "invalid policy"));
        ts_wr_fini(&w);
    }
    raw_close(fd);
    for (int i = 0; i < 3; i++) {
        size_t g = 0;
        uint8_t b[8];
        assert_int_equal(raw_read_shard(CL.node[i].addr, "impossible", 0, sizeof(b), b, &g),
                         TS_ENOENT);
    }
}

/* Starts a lone tesserad with args; 1 if it refused to start and its log holds needle. */
static int refuses_to_start(const char *const *args, const char *needle)
{
    struct tsd_proc p;
    char line[1024];
    int found = 0;
    FILE *f;

    memset(&p, 0, sizeof(p));
    if (tsd_start(&p, args) == 0) {
        tsd_stop(&p);
        tsd_cleanup(&p);
        return 0;
    }
    f = fopen(p.log, "r");
    while (f && fgets(line, sizeof(line), f))
        found |= strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    tsd_cleanup(&p);
    return found;
}

static void test_unsafe_cluster_configs_refused(void **state)
{
    char crt2[600], key2[600], ca[600], crt1[600], key1[600];

    (void)state;
    snprintf(ca, sizeof(ca), "%s", test_cert("ca", "pem"));
    snprintf(crt1, sizeof(crt1), "%s", test_cert("node-n1", "pem"));
    snprintf(key1, sizeof(key1), "%s", test_cert("node-n1", "key"));
    snprintf(crt2, sizeof(crt2), "%s", test_cert("node-n2", "pem"));
    snprintf(key2, sizeof(key2), "%s", test_cert("node-n2", "key"));
    {
        /* Anonymous writers or admins on a cluster node. */
        const char *const a[] = {"--node-id",  "n1", "--map-file",       CL.map_path,
                                 "--tls-cert", crt1, "--tls-key",        key1,
                                 "--tls-ca",   ca,   "--anonymous-role", "admin",
                                 NULL};
        assert_true(refuses_to_start(a, "refused on a cluster node"));
    }
    {
        /* No node certificate: it could not authenticate to its peers. */
        const char *const a[] = {"--node-id", "n1", "--map-file", CL.map_path, NULL};
        assert_true(refuses_to_start(a, "no node certificate"));
    }
    {
        /* Another node's certificate. */
        const char *const a[] = {"--node-id", "n1", "--map-file", CL.map_path, "--tls-cert", crt2,
                                 "--tls-key", key2, "--tls-ca",   ca,          NULL};
        assert_true(refuses_to_start(a, "is the certificate of node 'n2', not of 'n1'"));
    }
    {
        /* A client certificate. */
        const char *const a[] = {"--node-id",  "n1",
                                 "--map-file", CL.map_path,
                                 "--tls-cert", test_cert("admin", "pem"),
                                 "--tls-key",  test_cert("admin", "key"),
                                 "--tls-ca",   ca,
                                 NULL};
        assert_true(refuses_to_start(a, "is not a node certificate"));
    }
}

/* 1 when node i's log (this run) contains needle. */
static int log_has(int i, const char *needle)
{
    char line[2048];
    int found = 0;
    FILE *f = fopen(CL.node[i].log, "r");

    if (!f)
        return 0;
    fseek(f, CL.node[i].log_off, SEEK_SET);
    while (fgets(line, sizeof(line), f))
        found |= strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void test_impostor_peer_not_trusted(void **state)
{
    int n3 = tsd_cluster_find(&CL, "n3"), seen = 0;
    tessera_client *c;
    uint8_t *buf = malloc(SLEN);
    pid_t imp;
    struct ts_dataset_policy p = {3, 0, 2, 65536, 0, 0, 0, 0};

    (void)state;
    c = client_as(0, "writer");
    assert_int_equal(tessera_dataset_create(c, "imp", &p), 0); /* on every node */
    /* n3 goes away; at its TLS address a server with n2's (valid) certificate answers. */
    assert_int_equal(tsd_stop(&CL.node[n3]), 0);
    imp = fork();
    if (imp == 0) {
        int null = open("/dev/null", 1);
        dup2(null, 1);
        dup2(null, 2);
        execlp("openssl", "openssl", "s_server", "-quiet", "-tls1_3", "-accept", CL.tls_listen[n3],
               "-cert", test_cert("node-n2", "pem"), "-key", test_cert("node-n2", "key"), "-CAfile",
               test_cert("ca", "pem"), "-Verify", "1", (char *)NULL);
        _exit(127);
    }
    msleep(500);
    for (uint32_t s = 0; s < 8; s++) {
        fill(buf, SLEN, s + 50);
        /* min_core 2: acknowledged by n1 and n2; the impostor is never counted. */
        assert_int_equal(tessera_put(c, "imp", s, buf, SLEN, NULL, 0), 0);
    }
    tessera_client_close(c);
    for (int t = 0; t < 50 && !seen; t++) {
        for (int i = 0; i < CL.n; i++)
            if (i != n3 && log_has(i, "peer n3") && log_has(i, "hostname mismatch"))
                seen = 1;
        if (!seen)
            msleep(100);
    }
    kill(imp, SIGKILL);
    waitpid(imp, NULL, 0);
    if (!seen)
        tsd_cluster_dump_logs(&CL);
    assert_true(seen);
    /* n3 comes back and catches up: the cluster is whole again. */
    assert_int_equal(tsd_start(&CL.node[n3], NULL), 0);
    assert_keep_intact();
    free(buf);
}

/* PG_QUERY for (pg, epoch) as node `as` to node i: the reply's status, msg its text. */
static int pg_query_as(int i, const char *as, uint32_t pg, uint64_t epoch, char *msg, size_t cap)
{
    char cert[64], name[64];
    int fd, role = -1, rc;
    struct ts_wr w;

    snprintf(cert, sizeof(cert), "node-%s", as);
    snprintf(name, sizeof(name), "node:%s", as);
    fd = raw_connect_as(CL.node[i].tls_addr, cert);
    assert_true(fd >= 0);
    assert_int_equal(hello(fd, name, &role, msg, cap), 0);
    ts_wr_init(&w);
    ts_wr_u32(&w, pg);
    ts_wr_u64(&w, epoch);
    ts_wr_str(&w, as);
    rc = request(fd, TS_OP_PG_QUERY, w.buf, w.len, msg, cap);
    ts_wr_fini(&w);
    raw_close(fd);
    return rc;
}

/* Issue 29: a node promises an epoch only to the PG's primary in its own map of that epoch.
 * Before, any node could gather promises at an equal epoch (two different maps of one epoch
 * activated a PG on two nodes). */
static void test_promise_only_to_the_primary(void **state)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr), *after;
    int order[1], prim, other, asked;
    uint32_t pg = 0;
    char msg[300];

    (void)state;
    assert_non_null(m);
    assert_int_equal(ts_map_pg_order(m, pg, order, 1), 1);
    prim = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    other = (prim + 1) % CL.n;
    asked = (prim + 2) % CL.n;
    /* The node that is not the primary, at the map's own epoch: refused. */
    assert_int_equal(pg_query_as(asked, CL.id[other], pg, m->epoch, msg, sizeof(msg)), TS_EPERM);
    fprintf(stderr, "  %s asks %s for PG %u at epoch %llu: %s\n", CL.id[other], CL.id[asked], pg,
            (unsigned long long)m->epoch, msg);
    assert_non_null(strstr(msg, CL.id[prim]));
    /* At an epoch the asked node has no map of yet: wait, no promise. */
    assert_int_equal(pg_query_as(asked, CL.id[other], pg, m->epoch + 1, msg, sizeof(msg)),
                     TS_EBUSY);
    fprintf(stderr, "  ... at epoch %llu: %s\n", (unsigned long long)m->epoch + 1, msg);
    /* The primary itself is answered (a promise it already holds). */
    assert_int_equal(pg_query_as(asked, CL.id[prim], pg, m->epoch, msg, sizeof(msg)), 0);
    /* Nothing moved: same map everywhere, the data intact. */
    for (int i = 0; i < CL.n; i++) {
        after = raw_map_get(CL.node[i].addr);
        assert_non_null(after);
        assert_int_equal(after->epoch, m->epoch);
        ts_map_free(after);
    }
    ts_map_free(m);
    assert_keep_intact();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anonymous_is_a_reader),
        cmocka_unit_test(test_admin_may_not_replicate),
        cmocka_unit_test(test_node_is_who_its_certificate_says),
        cmocka_unit_test(test_impossible_policies_refused),
        cmocka_unit_test(test_unsafe_cluster_configs_refused),
        cmocka_unit_test(test_promise_only_to_the_primary),
        cmocka_unit_test(test_impostor_peer_not_trusted),
    };
    int rc = cmocka_run_group_tests_name("trust", tests, group_setup, group_teardown);
    if (rc)
        tsd_cluster_dump_logs(&CL);
    return rc;
}
