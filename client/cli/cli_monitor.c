/*
 * tessera monitor (issue 29): the process that drives rebalances, drains and hot changes of a
 * cluster whose map lives in etcd, so that they go on when the admin's command has ended and
 * after this process dies. Run two or more (on different hosts); one is elected through the key
 * PREFIX/rebalancer, created only if absent and bound to its lease (TTL 5 s, kept alive every
 * second by a thread of its own): when the elected one dies, its key goes with its lease and
 * another takes over within the TTL.
 *
 * The state is the map's: a rebalance whose driver is TS_MOVE_DRIVER_MONITOR (every
 * `rebalance apply|resume|rollback` given --etcd hands it over) is driven step by step as
 * `rebalance resume` would (cli_rebalance.c), each step one compare-and-swap in etcd over the
 * map it was made on, so a deposed monitor that has not yet noticed can change nothing. The
 * failover policy itself runs in the nodes (server/etcd_monitor.c).
 *
 * The elected monitor also repairs erasure-coded datasets (cli_monitor_ec.c): after each map
 * change, and the fragment chunks nodes report damaged or missing. Repairs are idempotent (a
 * node takes only bytes matching the chunk's stored CRC32C), so a deposed monitor finishing one
 * does no harm.
 *
 *   tessera --etcd ENDPOINTS [--etcd-prefix P] -s NODE [admin TLS options] monitor
 */
#include "cli.h"

#include "etcd.h"
#include "ts_map.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TTL_S 5

static atomic_int leading, lost, quit;
static int64_t lease_id;
static struct ts_etcd_opts eopts;

static void on_term(int sig)
{
    (void)sig;
    atomic_store(&quit, 1);
}

/* Keeps the lease alive every second; a lease that has run out (or etcd silent for the TTL)
 * ends this process's term as the elected one. */
static void *keepalive(void *arg)
{
    ts_etcd *e = NULL;
    uint64_t last_ok = ts_now_mono_ns();

    (void)arg;
    if (ts_etcd_open(&e, &eopts) != 0)
        return NULL;
    while (!atomic_load(&quit)) {
        int64_t left = 0;
        int rc = ts_etcd_lease_keepalive(e, lease_id, &left);
        if (rc == 0 && left > 0)
            last_ok = ts_now_mono_ns();
        if (rc == TS_ENOENT || ts_now_mono_ns() - last_ok > (uint64_t)TTL_S * 1000000000ull) {
            atomic_store(&lost, 1);
            atomic_store(&leading, 0);
        }
        sleep(1);
    }
    ts_etcd_close(e);
    return NULL;
}

static int still_elected(void)
{
    return atomic_load(&leading) && !atomic_load(&quit);
}

int cmd_monitor(struct ctx *x)
{
    char key[512], me[128], host[64] = "?";
    ts_etcd *e = NULL;
    pthread_t ka;
    int rc;

    if (!x->etcd) {
        snprintf(x->local, sizeof(x->local),
                 "monitor drives the rebalances of a cluster whose map is in etcd: give --etcd");
        return TS_EINVAL;
    }
    eopts.endpoints = x->etcd;
    eopts.ca = x->opts->tls_ca;
    eopts.cert = x->opts->tls_cert;
    eopts.key = x->opts->tls_key;
    eopts.timeout_ms = 3000;
    gethostname(host, sizeof(host) - 1);
    snprintf(me, sizeof(me), "tessera-monitor@%s:%ld", host, (long)getpid());
    snprintf(key, sizeof(key), "%s/rebalancer", x->etcd_prefix);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    rc = ts_etcd_open(&e, &eopts);
    if (!rc)
        rc = ts_etcd_lease_grant(e, TTL_S, &lease_id);
    if (rc) {
        snprintf(x->local, sizeof(x->local), "etcd: %s", e ? ts_etcd_error(e) : "cannot open");
        ts_etcd_close(e);
        return rc;
    }
    if (pthread_create(&ka, NULL, keepalive, NULL) != 0) {
        ts_etcd_close(e);
        return TS_ENOMEM;
    }
    cli_rebalance_as_monitor(still_elected);
    printf("monitor %s: standing for %s (lease %llx, %d s)\n", me, key,
           (unsigned long long)lease_id, TTL_S);
    fflush(stdout);
    while (!atomic_load(&quit) && !atomic_load(&lost)) {
        struct ts_etcd_kv kv = {0};
        const struct ts_map *m;
        int was = atomic_load(&leading);

        rc = ts_etcd_cas(e, key, 0, me, strlen(me), lease_id, NULL, &kv);
        atomic_store(&leading, rc == 0 || (rc == TS_ESTALE && kv.lease == lease_id));
        ts_etcd_kv_free(&kv);
        if (atomic_load(&leading) != was && atomic_load(&leading))
            cli_monitor_ec_elected();
        if (atomic_load(&leading) != was) {
            printf("monitor %s: %s\n", me,
                   atomic_load(&leading) ? "elected: drives the cluster's rebalances"
                                         : "no longer elected");
            fflush(stdout);
        }
        if (atomic_load(&leading)) {
            ts_client_map_refresh(x->c);
            m = ts_client_map(x->c);
            if (m && m->move && !m->move->paused && m->move->driver == TS_MOVE_DRIVER_MONITOR) {
                printf("monitor %s: driving the rebalance of map epoch %llu\n", me,
                       (unsigned long long)m->epoch);
                fflush(stdout);
                x->local[0] = '\0';
                rc = cli_rebalance_drive(x);
                printf("monitor %s: the drive ended: %s\n", me,
                       rc ? (x->local[0] ? x->local : ts_strerror(rc))
                          : "done, paused or handed on");
                fflush(stdout);
            }
            if (still_elected())
                cli_monitor_ec_round(x, me);
        }
        sleep(1);
    }
    if (atomic_load(&lost))
        printf("monitor %s: its lease ran out: it stops (another takes over)\n", me);
    atomic_store(&quit, 1);
    pthread_join(ka, NULL);
    if (!atomic_load(&lost))
        ts_etcd_lease_revoke(e, lease_id); /* a clean stop: the next one takes over at once */
    ts_etcd_close(e);
    return atomic_load(&lost) ? TS_ETIMEDOUT : 0;
}
