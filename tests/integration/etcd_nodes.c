/* What the etcd tests share around their etcd cluster (etcd_nodes.h). */
#include "etcd_nodes.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ARGS 64

int etcd_nodes_start_each(struct tsd_cluster *cl, int n, uint32_t pgs, const struct etcd_cluster *e,
                          const char *prefix, const char *const *more,
                          const char *const *const *each)
{
    const char *args[MAX_ARGS] = {"--etcd", e->endpoints,         "--etcd-prefix",
                                  prefix,   "--etcd-lease-ttl-s", "2"};
    size_t k = 6;

    for (size_t i = 0; more && more[i]; i++) {
        if (k + 1 >= MAX_ARGS)
            return -1;
        args[k++] = more[i];
    }
    args[k] = NULL;
    return tsd_cluster_start_each(cl, n, NULL, pgs, args, each);
}

int etcd_nodes_start(struct tsd_cluster *cl, int n, uint32_t pgs, const struct etcd_cluster *e,
                     const char *prefix, const char *const *more)
{
    return etcd_nodes_start_each(cl, n, pgs, e, prefix, more, NULL);
}

int etcd_nodes_stop(struct tsd_cluster *cl, struct etcd_cluster *e, const char *dir)
{
    char cmd[800];
    int rc = tsd_cluster_stop(cl);

    etcd_cluster_stop(e);
    if (dir && dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0)
            rc = -1;
    }
    return rc;
}

int etcd_client_open(ts_etcd **out, const struct etcd_cluster *e)
{
    struct ts_etcd_opts o;

    memset(&o, 0, sizeof(o));
    o.endpoints = e->endpoints;
    o.timeout_ms = 3000;
    return ts_etcd_open(out, &o) == 0 ? 0 : -1;
}

pid_t etcd_monitor_start(const struct etcd_cluster *e, const char *prefix, const char *server,
                         const char *log)
{
    pid_t pid = fork();

    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execl(TESSERA_CLI_PATH, TESSERA_CLI_PATH, "-s", server, "--tls-ca", test_cert("ca", "pem"),
              "--tls-cert", test_cert("admin", "pem"), "--tls-key", test_cert("admin", "key"),
              "--etcd", e->endpoints, "--etcd-prefix", prefix, "monitor", (char *)NULL);
        _exit(127);
    }
    return pid;
}

void etcd_monitor_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

int etcd_run_group(const char *test, const char *group, const struct CMUnitTest *tests, size_t n,
                   CMFixtureFunction setup, CMFixtureFunction teardown,
                   const struct tsd_cluster *cl)
{
    int rc = etcd_required(test);

    if (rc)
        return rc;
    rc = _cmocka_run_group_tests(group, tests, n, setup, teardown);
    if (rc)
        tsd_cluster_dump_logs(cl);
    return rc;
}
