/*
 * What the etcd tests share around their etcd cluster (etcd_harness.h): tessera nodes that
 * follow it, `tessera monitor` processes on it, a client of it, and the end of main().
 */
#ifndef TS_ETCD_NODES_H
#define TS_ETCD_NODES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <cmocka.h>

#include "etcd.h"
#include "etcd_harness.h"
#include "harness.h"

/* The monitor timings of the tests that watch it act: a node down after 2.5 s without its
 * registration, up again after 1 s with it. */
#define ETCD_QUICK_MONITOR "--monitor-down-after-ms", "2500", "--monitor-up-after-ms", "1000"

/* Starts n nodes (pgs PGs) following etcd cluster e under prefix: each gets the members, the
 * prefix and a 2 s registration lease, then more (NULL-terminated; NULL: nothing), then its own
 * each[i] (NULL: nothing). What tsd_cluster_start_each returns. */
int etcd_nodes_start_each(struct tsd_cluster *cl, int n, uint32_t pgs, const struct etcd_cluster *e,
                          const char *prefix, const char *const *more,
                          const char *const *const *each);
int etcd_nodes_start(struct tsd_cluster *cl, int n, uint32_t pgs, const struct etcd_cluster *e,
                     const char *prefix, const char *const *more);

/* Stops the nodes (tsd_cluster_stop), then e, then removes the test's directory dir (NULL:
 * none): 0, or -1 if a node did not exit cleanly or dir could not be removed. */
int etcd_nodes_stop(struct tsd_cluster *cl, struct etcd_cluster *e, const char *dir);

/* A client of e (3 s timeout): 0, or -1. */
int etcd_client_open(ts_etcd **out, const struct etcd_cluster *e);

/* `tessera monitor` on e under prefix, as admin through the node at TLS address server, its
 * output in log: its pid, or -1. */
pid_t etcd_monitor_start(const struct etcd_cluster *e, const char *prefix, const char *server,
                         const char *log);
/* SIGTERM, then waits for it; pid <= 0: nothing. */
void etcd_monitor_stop(pid_t pid);

/* The end of an etcd test's main(): skipped (77) or failed where this machine has no etcd
 * (etcd_required), else the group run, with every node's log printed when a test failed. */
int etcd_run_group(const char *test, const char *group, const struct CMUnitTest *tests, size_t n,
                   CMFixtureFunction setup, CMFixtureFunction teardown,
                   const struct tsd_cluster *cl);

#endif
