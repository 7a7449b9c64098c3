/*
 * tesserad settings: one declarative table behind the config file (libconfig syntax), the
 * command line (--name value, generated from the table) and STATUS.
 */
#ifndef TSD_CONFIG_H
#define TSD_CONFIG_H

#include <stdio.h>

struct tsd_config {
    char *config_file;
    char *node_id;
    char *listen;      /* plain TCP address, "" to disable */
    char *tls_listen;  /* TLS address, "" to disable */
    char *rdma_listen; /* RDMA (rdma_cm) address, "" to disable */
    char *data_dir;
    char *log_level;
    char *sync;
    char *anonymous_role;
    char *tls_cert, *tls_key, *tls_ca;
    char *tls_ciphersuites;
    char *map_file;
    char *etcd, *etcd_prefix; /* the control plane: etcd's members, the cluster's key prefix */
    char *metrics_listen;     /* /metrics, /healthz, /readyz over HTTP; "" disables */
    int metrics_tls;          /* ... over TLS with the node's certificate */
    int tls_require_client_cert;
    int workers;
    int chunk_files;
    int inline_max_kb;
    int blob_files;
    int verify_engine_checksums;
    int block_cache_mb;
    int cache_mb;
    int prefetch_mb, prefetch_conn_mb;
    int scrub_interval_s, scrub_mb_s; /* scheduled scrubs (server/scrub.c) */
    int reserve_mb;
    int cache_arena;
    int max_connections;
    int conn_output_kb;
    int idle_timeout_s;
    int input_budget_mb;
    int tls_handshake_timeout_s;
    int drain_timeout_s;
    int max_chunk_mb;
    int pg_log_keep;
    int peer_timeout_ms;
    int etcd_lease_ttl_s; /* the node's registration in etcd lives this long without keepalive */
    int monitor;          /* with etcd: may be the cluster's elected monitor (etcd_monitor.c) */
    int monitor_down_after_ms, monitor_up_after_ms, monitor_out_after_ms, monitor_max_down_pct;
    int monitor_flap_max, monitor_flap_window_ms, monitor_damp_ms;
    int max_open_files; /* derived at start-up from the descriptor limit */
};

/* Fills every setting with its default. */
void tsd_config_defaults(struct tsd_config *c);
/*
 * Applies argv over the defaults: first --config FILE (if given) is read, then every other
 * flag overrides the file. Returns 0, 1 when --help/--version was handled, or TS_ECONFIG
 * (the reason printed to stderr).
 */
int tsd_config_load(struct tsd_config *c, int argc, char **argv);
/* Cross-setting checks (TLS files present, roles valid, ...); prints the reason. */
/* anonymous_role resolved (auto: admin for one node on loopback only, else reader). */
int tsd_config_anon_role(const struct tsd_config *c);
int tsd_config_validate(const struct tsd_config *c);
void tsd_config_free(struct tsd_config *c);
void tsd_config_usage(FILE *f);
/* Emits "name = value" lines, for the start-up log. */
void tsd_config_dump(const struct tsd_config *c, void (*emit)(void *arg, const char *line),
                     void *arg);

#endif
