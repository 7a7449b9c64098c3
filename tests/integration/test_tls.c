/*
 * tesserad over TLS 1.3 with certificates generated at test time (conf/mkcerts): mutual TLS,
 * roles from certificates, and every way of knocking without the right credentials.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct tsd_proc M; /* mutual TLS required, no plain listener */
static struct tsd_proc O; /* TLS with optional client certs; anonymous = reader */
static char certs[512];
static char p_ca[600], p_srv[600], p_srvkey[600];
/* A TLS listener on a free port with the test server certificate and the test CA. */
#define TLS_SERVER                                                                                 \
    "--tls-listen", "127.0.0.1:0", "--tls-cert", p_srv, "--tls-key", p_srvkey, "--tls-ca", p_ca

/* role: "admin", "writer", "reader", "rogue" or NULL for no client certificate. */
static int open_as(struct tsd_proc *d, const char *role, const char *ca, tessera_client **c)
{
    return test_tls_open(c, d->tls_addr, role, ca, "localhost");
}

static int group_setup(void **state)
{
    const char *dir = test_certs();

    if (!dir)
        return -1;
    snprintf(certs, sizeof(certs), "%s", dir);
    snprintf(p_ca, sizeof(p_ca), "%s/ca.pem", certs);
    snprintf(p_srv, sizeof(p_srv), "%s/server.pem", certs);
    snprintf(p_srvkey, sizeof(p_srvkey), "%s/server.key", certs);
    const char *const m[] = {"--listen",
                             "",
                             TLS_SERVER,
                             "--tls-require-client-cert",
                             "--anonymous-role",
                             "none",
                             "--tls-handshake-timeout-s",
                             "1",
                             NULL};
    /* tsd_start adds --listen 127.0.0.1:0 first; the later --listen "" wins. */
    if (tsd_start(&M, m) != 0)
        return -1;
    const char *const o[] = {TLS_SERVER, "--anonymous-role", "reader", NULL};
    if (tsd_start(&O, o) != 0)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    int a = tsd_stop(&M), b = tsd_stop(&O);
    tsd_cleanup(&M);
    tsd_cleanup(&O);
    return (WIFEXITED(a) && WEXITSTATUS(a) == 0 && WIFEXITED(b) && WEXITSTATUS(b) == 0) ? 0 : -1;
}

static void test_mutual_tls_roundtrip(void **state)
{
    tessera_client *c;
    uint8_t data[300000], back[300000];
    size_t n;
    struct ts_dataset_policy p = {1, 0, 1, 65536, 0, 0, 0, 0};

    assert_int_equal(M.addr[0], '\0'); /* no plain listener */
    assert_int_equal(open_as(&M, "admin", NULL, &c), 0);
    assert_int_equal(tessera_client_role(c), 3);
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 31 + (i >> 9));
    assert_int_equal(tessera_dataset_create(c, "secure", &p), 0);
    assert_int_equal(tessera_put(c, "secure", 0, data, sizeof(data), NULL, 0), 0);
    assert_int_equal(tessera_read(c, "secure", 0, 0, sizeof(back), back, &n), 0);
    assert_int_equal(n, sizeof(data));
    assert_memory_equal(back, data, n);
    assert_int_equal(tessera_read(c, "secure", 0, 65530, 20, back, &n), 0);
    assert_memory_equal(back, data + 65530, 20);
    tessera_client_close(c);
}

static void test_roles(void **state)
{
    tessera_client *r, *w;
    uint8_t b[16];
    size_t n;
    struct ts_dataset_policy p = {1, 0, 1, 65536, 0, 0, 0, 0};

    assert_int_equal(open_as(&M, "reader", NULL, &r), 0);
    assert_int_equal(tessera_client_role(r), 1);
    assert_int_equal(tessera_read(r, "secure", 0, 0, sizeof(b), b, &n), 0);
    assert_int_equal(tessera_put(r, "secure", 5, b, sizeof(b), NULL, 0), TS_EPERM);
    assert_non_null(strstr(tessera_client_error(r), "reader"));
    assert_int_equal(tessera_dataset_create(r, "nope", &p), TS_EPERM);
    assert_int_equal(tessera_dataset_delete(r, "secure"), TS_EPERM);
    tessera_client_close(r);

    assert_int_equal(open_as(&M, "writer", NULL, &w), 0);
    assert_int_equal(tessera_client_role(w), 2);
    assert_int_equal(tessera_put(w, "secure", 1, b, sizeof(b), NULL, 0), 0);
    assert_int_equal(tessera_dataset_delete(w, "secure"), TS_EPERM);
    tessera_client_close(w);
}

static void test_refused_credentials(void **state)
{
    tessera_client *c;
    char rogue_ca[600];
    int rc;

    /* No client certificate where one is required. */
    rc = open_as(&M, NULL, NULL, &c);
    assert_true(rc == TS_ETLS || rc == TS_ECONNRESET || rc == TS_EAUTH);
    assert_null(c);
    /* A certificate from another CA. */
    rc = open_as(&M, "rogue", NULL, &c);
    assert_true(rc == TS_ETLS || rc == TS_ECONNRESET || rc == TS_EAUTH);
    assert_null(c);
    /* The client does not trust the server (verifying against the rogue CA). */
    snprintf(rogue_ca, sizeof(rogue_ca), "%s/rogue-ca.pem", certs);
    rc = open_as(&M, "admin", rogue_ca, &c);
    assert_int_equal(rc, TS_ETLS);
    /* The server still serves the right client. */
    assert_int_equal(open_as(&M, "admin", NULL, &c), 0);
    tessera_client_close(c);
}

static void test_plain_client_to_tls_port(void **state)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    int fd, rc;
    uint8_t body[64];
    struct ts_wr w;

    /* The library without TLS options against the TLS port: a clear error, not a hang. */
    tessera_opts_init(&o);
    o.address = M.tls_addr;
    o.timeout_ms = 5000;
    rc = tessera_client_open(&c, &o);
    assert_true(rc < 0);
    assert_null(c);
    /* Raw frames: the server sees a broken TLS ClientHello and closes. */
    fd = raw_connect(M.tls_addr);
    assert_true(fd >= 0);
    ts_wr_init(&w);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, "plain");
    memcpy(body, w.buf, w.len);
    /* The server may already have hung up on the header: a reset while sending is fine. */
    rc = raw_send_frame(fd, TS_OP_HELLO, 0, 1, body, w.len);
    assert_true(rc == 0 || rc == TS_ECONNRESET);
    ts_wr_fini(&w);
    assert_true(raw_wait_closed(fd, 5000));
    close(fd);
    rc = open_as(&M, "reader", NULL, &c);
    if (rc) {
        fprintf(stderr, "reader open after a plain client: %s\n", ts_strerror(rc));
        tsd_dump_log(&M);
    }
    assert_int_equal(rc, 0);
    tessera_client_close(c);
}

static void test_optional_client_cert(void **state)
{
    tessera_client *anon, *adm;
    struct ts_dataset_policy p = {1, 0, 1, 65536, 0, 0, 0, 0};
    uint8_t b[4] = {1, 2, 3, 4};
    size_t n;

    /* Without a certificate: anonymous_role = reader. */
    assert_int_equal(open_as(&O, NULL, NULL, &anon), 0);
    assert_int_equal(tessera_client_role(anon), 1);
    assert_int_equal(tessera_dataset_create(anon, "x", &p), TS_EPERM);
    /* With one: its role. */
    assert_int_equal(open_as(&O, "admin", NULL, &adm), 0);
    assert_int_equal(tessera_dataset_create(adm, "x", &p), 0);
    assert_int_equal(tessera_put(adm, "x", 0, b, 4, NULL, 0), 0);
    assert_int_equal(tessera_read(anon, "x", 0, 0, 4, b, &n), 0);
    assert_int_equal(n, 4);
    /* A presented certificate must still verify. */
    tessera_client *rogue;
    int rc = open_as(&O, "rogue", NULL, &rogue);
    assert_true(rc == TS_ETLS || rc == TS_ECONNRESET);
    tessera_client_close(anon);
    tessera_client_close(adm);
}

static void test_unsafe_config_refused(void **state)
{
    struct tsd_proc bad = {0};
    /* Mutual TLS required but a plain listener open to anonymous admins: refuse to start. */
    const char *const a[] = {TLS_SERVER, "--tls-require-client-cert", NULL};
    assert_int_not_equal(tsd_start(&bad, a), 0);
    tsd_cleanup(&bad);
}

/* A client that connects to the TLS port and never starts (or finishes) a handshake is closed
 * after tls.handshake_timeout_s (1 s here): it cannot hold a connection slot. */
static void test_stalled_handshake_closed(void **state)
{
    int fd = raw_connect(M.tls_addr);
    uint64_t t0 = ts_now_mono_ns();
    double s;

    assert_true(fd >= 0);
    assert_true(raw_wait_closed(fd, 5000));
    s = (double)(ts_now_mono_ns() - t0) / 1e9;
    fprintf(stderr, "  closed after %.1f s\n", s);
    assert_true(s >= 0.9 && s < 4.0);
    close(fd);
}

/*
 * Issue 28: with max_connections 50, sixty connections that open TCP to the TLS port and never
 * start TLS locked an admin out for the whole handshake timeout. Connections that have not
 * authenticated may not take every slot: the oldest handshake makes room for a new connection,
 * and an admin gets in while the flood is still open.
 */
static void test_handshake_flood_leaves_room(void **state)
{
    struct tsd_proc F;
    int fds[60], n = 0, ok = 0;
    tessera_client *c = NULL;
    char *json = NULL;
    uint64_t t0;

    (void)state;
    const char *const a[] = {
        TLS_SERVER, "--tls-handshake-timeout-s", "30", "--max-connections", "50", NULL};
    memset(&F, 0, sizeof(F));
    assert_int_equal(tsd_start(&F, a), 0);
    for (int i = 0; i < 60; i++) {
        fds[i] = raw_connect(F.tls_addr);
        if (fds[i] >= 0)
            n++;
    }
    fprintf(stderr, "  %d connections open that never start TLS\n", n);
    assert_true(n >= 50);
    usleep(200000);
    t0 = ts_now_mono_ns();
    if (test_tls_open(&c, F.tls_addr, "admin", NULL, "localhost") == 0 &&
        tessera_status(c, &json) == 0)
        ok = 1;
    fprintf(stderr, "  an admin %s in %.2f s\n", ok ? "got in" : "was locked out",
            (double)(ts_now_mono_ns() - t0) / 1e9);
    tessera_buffer_free(json);
    tessera_client_close(c);
    for (int i = 0; i < 60; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    tsd_stop(&F);
    tsd_cleanup(&F);
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls_roundtrip),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_refused_credentials),
        cmocka_unit_test(test_plain_client_to_tls_port),
        cmocka_unit_test(test_stalled_handshake_closed),
        cmocka_unit_test(test_handshake_flood_leaves_room),
        cmocka_unit_test(test_optional_client_cert),
        cmocka_unit_test(test_unsafe_config_refused),
    };
    int rc = cmocka_run_group_tests_name("server-tls", tests, group_setup, group_teardown);
    if (rc) {
        tsd_dump_log(&M);
        tsd_dump_log(&O);
    }
    return rc;
}
