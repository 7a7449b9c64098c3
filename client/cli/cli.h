/*
 * tessera CLI internals: the context a command works with, the commands (cli_data.c,
 * cli_admin.c, cli_status.c) that the command table in cli.c names, and the output helpers
 * they share (cli_print.c). Not installed.
 */
#ifndef TS_CLI_H
#define TS_CLI_H

#include <stdint.h>

#include <json-c/json.h>

#include "cli_util.h"
#include "client_internal.h"
#include "tessera/reader.h"

/* What a command works with. */
struct ctx {
    tessera_client *c;
    const char *server;
    int json;
    int timeout_set;
    int argc;
    char **argv;
    /* dataset create */
    struct ts_dataset_policy policy;
    int min_core_set;
    /* get */
    const char *output;
    uint64_t offset, length;
    int length_set;
    /* pg, status */
    const char *dataset;
    uint64_t shard;
    int shard_set;
    const char *node;
    int server_set; /* -s or $TESSERA_SERVER */
    /* node commands */
    const char *tls_addr, *domain;
    uint64_t weight, rate;
    int dry_run;
    int auto_heal; /* drill --auto: the cluster (on etcd) heals itself, no operator step */
    const char *etcd, *etcd_prefix; /* --etcd ENDPOINTS (or $TESSERA_ETCD), --etcd-prefix */
    int seal;                       /* ingest --seal */
    /* rebalance */
    uint64_t max_concurrent;
    int detach;
    /* hot: --fringe +K, --pg P */
    uint64_t hot_fringe, hot_pg;
    int hot_pg_set;
    /* drill */
    uint64_t duration;
    const char *report;
    const char *agent; /* --agent TEMPLATE: acts on nodes run through it */
    /* plan */
    struct tessera_plan_opts plan;
    /* records */
    const char *range;
    /* read: the reader's options (the plan's come from plan above), the connection's */
    struct tessera_reader_opts rd;
    uint64_t count;
    /* top: seconds between polls, one frame only, stop after N frames (0: until 'q') */
    double top_interval;
    int top_once;
    uint64_t top_iterations;
    const char *prometheus; /* top --prometheus URL: job stalls */
    const struct tessera_opts *opts;
    /* a local failure, in words (instead of a TS_E* line) */
    char local[512];
};

/* ---- output helpers (cli_print.c) ----------------------------------------------------------- */

/* Prints a JSON document (pretty) and releases it. */
void json_print(struct json_object *o);
struct json_object *json_u64(uint64_t v);
/* Seconds, printed with 3 decimals. */
struct json_object *json_secs(double secs);
/* a when v is 0, else b. */
const char *pick(int v, const char *a, const char *b);
struct json_object *dataset_json(const struct ts_dataset_info *d);
struct json_object *shard_json(const struct ts_shard_info *s);
/* "key:  value" lines with the values lined up. */
void kv_print(const char *const *kv, size_t n);
void dataset_print(const struct ts_dataset_info *d);

/* ---- commands: 0 or TS_E* (a local failure explained in x->local) ---------------------------- */

/* cli_admin.c: writes m to a temporary map file and pushes it to every node (one epoch past
 * every node's: tessera_map_push_file); the new epoch in *epoch. With --etcd: one
 * compare-and-swap in etcd over m's own epoch (cli_etcd_map_commit), nodes learn it from etcd. */
struct ts_map;
int cli_map_push(struct ctx *x, const struct ts_map *m, uint64_t *epoch);

/* cli_drill.c */
int cmd_drill(struct ctx *x);
/* cli_agent.c: tessera agent ACT [ARG...] (the drills' acts on this host's node) */
int cmd_agent(struct ctx *x);
/* cli_hot.c */
int cmd_hot_add(struct ctx *x);
int cmd_hot_rm(struct ctx *x);
int cmd_hot_ls(struct ctx *x);

/* cli_node.c */
int cmd_node_add(struct ctx *x);
int cmd_node_drain(struct ctx *x);
int cmd_node_remove(struct ctx *x);
int cmd_node_weight(struct ctx *x);
int cmd_rebalance_plan(struct ctx *x);
/* cli_rebalance.c */
int cmd_rebalance_apply(struct ctx *x);
int cmd_rebalance_status(struct ctx *x);
int cmd_rebalance_pause(struct ctx *x);
int cmd_rebalance_resume(struct ctx *x);
int cmd_rebalance_rollback(struct ctx *x);
/* What `rebalance split` (cli_split.c) shares of the rebalance. */
int cli_rebalance_newest(struct ctx *x, struct ts_map **out);
int cli_rebalance_widest(struct ctx *x, unsigned *w);
int cli_rebalance_pg_changes(const struct ts_map *m, uint32_t pg, unsigned w);
uint64_t cli_rebalance_driver_token(const struct ctx *x);
int cli_rebalance_drive_started(struct ctx *x);
/* 1 when every PG of m is clean as its primary reports (it runs m's epoch, is not peering it,
 * lists no replica of it as behind or recovering); else 0 and why. */
int cli_rebalance_clean(struct ctx *x, const struct ts_map *m, unsigned w, char *why, size_t cap);
/* cli_split.c */
int cmd_rebalance_split(struct ctx *x);
int cmd_node_up(struct ctx *x);
int cmd_node_down(struct ctx *x);
int cmd_node_out(struct ctx *x);

/* cli_data.c */
int cmd_dataset_stat(struct ctx *x);
int cmd_dataset_create(struct ctx *x);
int cmd_dataset_ls(struct ctx *x);
int cmd_dataset_seal(struct ctx *x);
int cmd_dataset_tier(struct ctx *x);
int cmd_dataset_repair(struct ctx *x);
int cmd_dataset_rm(struct ctx *x);
int cmd_shard_ls(struct ctx *x);
int cmd_shard_stat(struct ctx *x);
int cmd_put(struct ctx *x);
int cmd_get(struct ctx *x);

/* cli_ingest.c */
int cmd_ingest(struct ctx *x);
/* `plan`: computed locally, no connection. */
int cmd_plan(struct ctx *x);
/* cli_records.c */
int cmd_records(struct ctx *x);
/* cli_read.c */
int cmd_read(struct ctx *x);

/* cli_admin.c */
int cmd_scrub(struct ctx *x);
/* The map as `map show` prints it (text, or JSON with --json); m NULL: a single node. */
struct ts_map;
int map_print(struct ctx *x, const struct ts_map *m);
/* cli_etcd.c: `map show` and `map push` against the map in etcd (--etcd) */
int cli_etcd_map_show(struct ctx *x);
int cli_etcd_map_push(struct ctx *x);
/* The map etcd holds (ts_map_free), or NULL (x->local says why). */
struct ts_map *cli_etcd_map_get(struct ctx *x);
/* next, stored by compare-and-swap in etcd only if etcd's map is still at epoch base (the one the
 * change was made on), at epoch base + 1; TS_ESTALE ("the map changed under you") otherwise. */
int cli_etcd_map_commit(struct ctx *x, const struct ts_map *next, uint64_t base, uint64_t *epoch);
/* Whether a `tessera monitor` is elected now (PREFIX/rebalancer exists). */
int cli_etcd_monitor_elected(struct ctx *x);
/* cli_rebalance.c: drive the rebalance in the map until it is done, paused or another drives
 * it; as the monitor (cli_rebalance_as_monitor) while keep() says it is still elected. */
int cli_rebalance_drive(struct ctx *x);
void cli_rebalance_as_monitor(int (*keep)(void));
/* cli_monitor.c: tessera monitor */
int cmd_monitor(struct ctx *x);
/* cli_monitor_ec.c: one round of the elected monitor's repair of erasure-coded datasets. */
void cli_monitor_ec_round(struct ctx *x, const char *me);
void cli_monitor_ec_elected(void); /* a new term: the next round checks every fragment */
/* cli_admin.c: the map a change is made on, the caller's to free: etcd's with --etcd, else a
 * copy of the newest one the nodes have; NULL on a single node (x->local says why). */
struct ts_map *cli_map_base(struct ctx *x);
int cmd_map_show(struct ctx *x);
/* `map push FILE` without -s: connect to the first node of the file that is up. */
void map_push_seed(struct ctx *x, const struct tessera_opts *o);
int cmd_map_push(struct ctx *x);
int cmd_failover(struct ctx *x);
int cmd_pg(struct ctx *x);

/* cli_status.c */
int cmd_status(struct ctx *x);
/* cli_top.c */
int cmd_top(struct ctx *x);

#endif
