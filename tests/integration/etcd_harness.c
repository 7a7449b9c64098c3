/* Real etcd clusters for tests (etcd_harness.h). */
#include "etcd_harness.h"

#include "etcd.h"
#include "harness.h"
#include "tessera/errno.h"
#include "ts_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ETCD_BIN "/usr/bin/etcd"

int etcd_required(const char *test)
{
    const char *req = getenv("TESSERA_REQUIRE_VM");
    int must = req && !strcmp(req, "1");

    if (access(ETCD_BIN, X_OK) == 0)
        return 0;
    fprintf(stderr, "%s: %s: no %s (apt-get install etcd-server)\n", test,
            must ? "required" : "skipped", ETCD_BIN);
    return must ? 1 : 77;
}

const char *etcd_member_url(const struct etcd_cluster *c, int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s://127.0.0.1:%d", c->tls ? "https" : "http", c->client_port[i]);
    return buf;
}

int etcd_member_start(struct etcd_cluster *c, int i)
{
    char name[16], data[600], log[600], url[64], listen[64], peer[64], initial[512] = "";
    pid_t pid;

    snprintf(name, sizeof(name), "m%d", i);
    snprintf(data, sizeof(data), "%s/%s", c->dir, name);
    snprintf(log, sizeof(log), "%s/%s.log", c->dir, name);
    etcd_member_url(c, i, url, sizeof(url));
    snprintf(listen, sizeof(listen), "%s://%s:%d", c->tls ? "https" : "http",
             c->listen_any ? "0.0.0.0" : "127.0.0.1", c->client_port[i]);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", c->peer_port[i]);
    for (int k = 0; k < c->n; k++)
        snprintf(initial + strlen(initial), sizeof(initial) - strlen(initial),
                 "%sm%d=http://127.0.0.1:%d", k ? "," : "", k, c->peer_port[k]);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char ca[700], cert[700], key[700];
        const char *argv[40];
        int a = 0;
        FILE *f = freopen(log, "a", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        argv[a++] = ETCD_BIN;
        argv[a++] = "--name", argv[a++] = name;
        argv[a++] = "--data-dir", argv[a++] = data;
        argv[a++] = "--listen-client-urls", argv[a++] = listen;
        argv[a++] = "--advertise-client-urls", argv[a++] = url;
        argv[a++] = "--listen-peer-urls", argv[a++] = peer;
        argv[a++] = "--initial-advertise-peer-urls", argv[a++] = peer;
        argv[a++] = "--initial-cluster", argv[a++] = initial;
        argv[a++] = "--initial-cluster-state", argv[a++] = "new";
        argv[a++] = "--heartbeat-interval", argv[a++] = "50";
        argv[a++] = "--election-timeout", argv[a++] = "500";
        if (c->tls) {
            snprintf(ca, sizeof(ca), "%s/ca.pem", c->certs);
            /* serverAuth and clientAuth: etcd's JSON gateway is a client of its own member */
            snprintf(cert, sizeof(cert), "%s/node-etcd.pem", c->certs);
            snprintf(key, sizeof(key), "%s/node-etcd.key", c->certs);
            argv[a++] = "--cert-file", argv[a++] = cert;
            argv[a++] = "--key-file", argv[a++] = key;
            argv[a++] = "--trusted-ca-file", argv[a++] = ca;
            argv[a++] = "--client-cert-auth";
        }
        argv[a] = NULL;
        execv(ETCD_BIN, (char *const *)argv);
        _exit(127);
    }
    c->pid[i] = pid;
    return 0;
}

void etcd_member_kill(struct etcd_cluster *c, int i)
{
    if (c->pid[i] > 0) {
        kill(c->pid[i], SIGKILL);
        waitpid(c->pid[i], NULL, 0);
        c->pid[i] = 0;
    }
}

/* Until a read of the cluster answers (a key that does not exist: TS_ENOENT), up to 30 s. */
static int wait_ready(struct etcd_cluster *c)
{
    struct ts_etcd_opts o = {.endpoints = c->endpoints, .timeout_ms = 1000};
    char ca[700], cert[700], key[700];
    ts_etcd *e = NULL;
    int rc = -1;

    if (c->tls) {
        snprintf(ca, sizeof(ca), "%s/ca.pem", c->certs);
        snprintf(cert, sizeof(cert), "%s/admin.pem", c->certs);
        snprintf(key, sizeof(key), "%s/admin.key", c->certs);
        o.ca = ca, o.cert = cert, o.key = key;
    }
    if (ts_etcd_open(&e, &o) != 0)
        return -1;
    for (int t = 0; t < 300 && rc; t++) {
        struct ts_etcd_kv kv;
        int r = ts_etcd_get(e, "/tessera-test/ready", &kv, NULL);
        if (r == TS_ENOENT || r == 0)
            rc = 0;
        else
            usleep(100 * 1000);
        ts_etcd_kv_free(&kv);
    }
    if (rc)
        fprintf(stderr, "etcd did not come up: %s\n", ts_etcd_error(e));
    ts_etcd_close(e);
    return rc;
}

int etcd_cluster_start(struct etcd_cluster *c, int n, int tls)
{
    int ports[2 * ETCD_MAX_MEMBERS], any = c->listen_any;
    char *tmp;

    memset(c, 0, sizeof(*c));
    c->listen_any = any;
    if (access(ETCD_BIN, X_OK) != 0) {
        fprintf(stderr, "no %s (apt-get install etcd-server)\n", ETCD_BIN);
        return 77;
    }
    if (n < 1 || n > ETCD_MAX_MEMBERS || tsd_free_ports(ports, 2 * n) != 0)
        return -1;
    tmp = ts_test_tmpdir("etcd");
    if (!tmp)
        return -1;
    snprintf(c->dir, sizeof(c->dir), "%s", tmp);
    free(tmp);
    c->n = n;
    c->tls = tls;
    if (tls) {
        char cmd[1400];
        snprintf(c->certs, sizeof(c->certs), "%s/certs", c->dir);
        snprintf(cmd, sizeof(cmd), "%s %s etcd >/dev/null", MKCERTS_PATH, c->certs);
        if (system(cmd) != 0)
            return -1;
    }
    for (int i = 0; i < n; i++) {
        char url[64];
        c->client_port[i] = ports[2 * i];
        c->peer_port[i] = ports[2 * i + 1];
        snprintf(c->endpoints + strlen(c->endpoints), sizeof(c->endpoints) - strlen(c->endpoints),
                 "%s%s", i ? "," : "", etcd_member_url(c, i, url, sizeof(url)));
    }
    for (int i = 0; i < n; i++)
        if (etcd_member_start(c, i) != 0)
            return -1;
    if (wait_ready(c) != 0) {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "tail -n 20 %s/m*.log >&2", c->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "(no etcd logs)\n");
        return -1;
    }
    return 0;
}

void etcd_cluster_stop(struct etcd_cluster *c)
{
    char cmd[600];

    for (int i = 0; i < c->n; i++)
        etcd_member_kill(c, i);
    if (c->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", c->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", c->dir);
    }
}
