/*
 * Real etcd clusters for tests (Debian's etcd-server, /usr/bin/etcd): n members on loopback,
 * each its own data directory under a temp dir, peers over plain HTTP, clients over HTTP or,
 * with tls, HTTPS with client-certificate authentication (certificates from conf/mkcerts).
 */
#ifndef TS_ETCD_HARNESS_H
#define TS_ETCD_HARNESS_H

#include <sys/types.h>

#define ETCD_MAX_MEMBERS 5

struct etcd_cluster {
    int n, tls;
    char dir[512];
    int client_port[ETCD_MAX_MEMBERS], peer_port[ETCD_MAX_MEMBERS];
    pid_t pid[ETCD_MAX_MEMBERS];
    char endpoints[512]; /* every member's client URL, comma-separated */
    char certs[600];     /* tls: conf/mkcerts' directory (ca.pem, admin.pem, ...) */
    int listen_any;      /* set before the start: members take clients on every address (so a
                          * node can be given its own way to them, e.g. 127.0.2.1, to cut) */
};

/* 0 when this machine has /usr/bin/etcd; else 77 (skip) or, where the suite's own command
 * installed it (TESSERA_REQUIRE_VM=1, scripts/test), 1: the reason printed for test. */
int etcd_required(const char *test);
/* Starts n members and waits until the cluster answers: 0, or -1 (the logs on stderr); 77 when
 * this machine has no etcd. */
int etcd_cluster_start(struct etcd_cluster *c, int n, int tls);
/* SIGKILL of member i; its start again (same data). */
void etcd_member_kill(struct etcd_cluster *c, int i);
int etcd_member_start(struct etcd_cluster *c, int i);
/* Kills every member and removes the directory. */
void etcd_cluster_stop(struct etcd_cluster *c);
/* The client URL of member i. */
const char *etcd_member_url(const struct etcd_cluster *c, int i, char *buf, size_t cap);

#endif
