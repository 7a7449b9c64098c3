/*
 * tessera: the admin CLI of tessera.
 *
 *   tessera [-s HOST:PORT] [--tls-ca F --tls-cert F --tls-key F] [--tls-server-name N]
 *           [--json] [--timeout MS] [--client-domain D] [-v] COMMAND ...
 *
 * Global options may come anywhere on the line; command options after the command. Output is
 * human-readable (aligned tables, sizes in KiB/MiB/GiB) or, with --json, one JSON document.
 * Errors: one line on stderr, exit 1 (server or I/O) or 2 (usage).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#include "tessera/records.h"
#include "ts_map.h"

#define EXIT_FAIL 1
#define EXIT_USAGE 2

enum opt_id {
    O_HELP = 1,
    O_SERVER,
    O_TLS_CA,
    O_TLS_CERT,
    O_TLS_KEY,
    O_TLS_NAME,
    O_JSON,
    O_TIMEOUT,
    O_VERBOSE,
    O_CLIENT_DOMAIN,
    O_CORE,
    O_FRINGE,
    O_MIN_CORE,
    O_CHUNK,
    O_OUTPUT,
    O_OFFSET,
    O_LENGTH,
    O_DATASET,
    O_SHARD,
    O_NODE,
    O_SHARDS,
    O_SEED,
    O_EPOCH,
    O_ASSIGN,
    O_REMAINDER,
    O_SHUFFLE,
    O_WINDOW,
    O_RANGE,
    O_UNIT,
    O_WINDOW_UNITS,
    O_WINDOW_BYTES,
    O_CONNECTIONS,
    O_DEPTH,
    O_COUNT,
    O_WEIGHT,
    O_DOMAIN,
    O_TLS_ADDR,
    O_DRY_RUN,
    O_AUTO,
    O_DURATION,
    O_RATE,
    O_REPORT,
    O_MAX_CONC,
    O_DETACH,
    O_HOT_FRINGE,
    O_PG,
    O_AGENT,
    O_FORMAT,
    O_SEAL,
    O_RECORD,
    O_ETCD,
    O_ETCD_PREFIX,
    O_INTERVAL,
    O_ONCE,
    O_ITERATIONS,
    O_PROMETHEUS,
};

static const struct cli_opt global_opts[] = {
    {"help", 'h', 0, O_HELP},
    {"server", 's', 1, O_SERVER},
    {"tls-ca", 0, 1, O_TLS_CA},
    {"tls-cert", 0, 1, O_TLS_CERT},
    {"tls-key", 0, 1, O_TLS_KEY},
    {"tls-server-name", 0, 1, O_TLS_NAME},
    {"json", 0, 0, O_JSON},
    {"timeout", 0, 1, O_TIMEOUT},
    {"verbose", 'v', 0, O_VERBOSE},
    {"client-domain", 0, 1, O_CLIENT_DOMAIN},
    {"etcd", 0, 1, O_ETCD},
    {"etcd-prefix", 0, 1, O_ETCD_PREFIX},
    {NULL, 0, 0, 0},
};

static const struct cli_opt create_opts[] = {
    {"core", 0, 1, O_CORE},        {"fringe", 0, 1, O_FRINGE}, {"min-core", 0, 1, O_MIN_CORE},
    {"chunk-size", 0, 1, O_CHUNK}, {"format", 0, 1, O_FORMAT}, {NULL, 0, 0, 0},
};

static const struct cli_opt get_opts[] = {
    {"output", 'o', 1, O_OUTPUT},
    {"offset", 0, 1, O_OFFSET},
    {"length", 0, 1, O_LENGTH},
    {"node", 0, 1, O_NODE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt pg_opts[] = {
    {"dataset", 0, 1, O_DATASET},
    {"shard", 0, 1, O_SHARD},
    {NULL, 0, 0, 0},
};

static const struct cli_opt node_opts[] = {
    {"dry-run", 0, 0, O_DRY_RUN},
    {"rate", 0, 1, O_RATE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt rebalance_opts[] = {
    {"rate", 0, 1, O_RATE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt rebalance_apply_opts[] = {
    {"max-bytes-per-sec", 0, 1, O_RATE},
    {"max-concurrent", 0, 1, O_MAX_CONC},
    {"detach", 0, 0, O_DETACH},
    {"dry-run", 0, 0, O_DRY_RUN},
    {NULL, 0, 0, 0},
};

static const struct cli_opt rebalance_drive_opts[] = {
    {"detach", 0, 0, O_DETACH},
    {"max-concurrent", 0, 1, O_MAX_CONC},
    {NULL, 0, 0, 0},
};

static const struct cli_opt node_add_opts[] = {
    {"tls-addr", 0, 1, O_TLS_ADDR}, {"weight", 0, 1, O_WEIGHT}, {"domain", 0, 1, O_DOMAIN},
    {"dry-run", 0, 0, O_DRY_RUN},   {"rate", 0, 1, O_RATE},     {NULL, 0, 0, 0},
};

static const struct cli_opt hot_add_opts[] = {
    {"fringe", 0, 1, O_HOT_FRINGE},
    {"pg", 0, 1, O_PG},
    {"dry-run", 0, 0, O_DRY_RUN},
    {NULL, 0, 0, 0},
};

static const struct cli_opt hot_rm_opts[] = {
    {"pg", 0, 1, O_PG},
    {"dry-run", 0, 0, O_DRY_RUN},
    {NULL, 0, 0, 0},
};

static const struct cli_opt agent_opts[] = {
    {"node", 0, 1, O_NODE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt drill_opts[] = {
    {"duration", 0, 1, O_DURATION}, {"report", 0, 1, O_REPORT}, {"agent", 0, 1, O_AGENT},
    {"dry-run", 0, 0, O_DRY_RUN},   {"auto", 0, 0, O_AUTO},     {NULL, 0, 0, 0},
};

static const struct cli_opt status_opts[] = {
    {"node", 0, 1, O_NODE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt top_opts[] = {
    {"interval", 0, 1, O_INTERVAL},     {"once", 0, 0, O_ONCE}, {"iterations", 0, 1, O_ITERATIONS},
    {"prometheus", 0, 1, O_PROMETHEUS}, {NULL, 0, 0, 0},
};

static const struct cli_opt ingest_opts[] = {
    {"dataset", 0, 1, O_DATASET},   {"shards", 0, 1, O_SHARDS},
    {"core", 0, 1, O_CORE},         {"fringe", 0, 1, O_FRINGE},
    {"min-core", 0, 1, O_MIN_CORE}, {"chunk-size", 0, 1, O_CHUNK},
    {"seal", 0, 0, O_SEAL},         {NULL, 0, 0, 0},
};

static const struct cli_opt plan_opts[] = {
    {"seed", 0, 1, O_SEED},
    {"epoch", 0, 1, O_EPOCH},
    {"assign", 0, 1, O_ASSIGN},
    {"remainder", 0, 1, O_REMAINDER},
    {"shuffle", 0, 1, O_SHUFFLE},
    {"window", 0, 1, O_WINDOW},
    {NULL, 0, 0, 0},
};

/* `read` takes these and plan_opts. */
static const struct cli_opt read_opts[] = {
    {"unit", 0, 1, O_UNIT},
    {"window-units", 0, 1, O_WINDOW_UNITS},
    {"window-bytes", 0, 1, O_WINDOW_BYTES},
    {"connections", 0, 1, O_CONNECTIONS},
    {"depth", 0, 1, O_DEPTH},
    {"count", 0, 1, O_COUNT},
    {"output", 'o', 1, O_OUTPUT},
    {"record", 0, 1, O_RECORD},
    {NULL, 0, 0, 0},
};

static const struct cli_opt records_opts[] = {
    {"range", 0, 1, O_RANGE},
    {"output", 'o', 1, O_OUTPUT},
    {NULL, 0, 0, 0},
};

static const struct cli_opt no_opts[] = {{NULL, 0, 0, 0}};

struct cmd {
    const char *group; /* "dataset", "shard" or NULL */
    const char *name;
    int min_args, max_args;
    int ctx_args; /* positional arguments named in error lines */
    const struct cli_opt *opts;
    int (*run)(struct ctx *x);
    const char *args;
    const char *help;
    int cluster;                     /* listed under "Cluster commands" */
    const struct cli_opt *more_opts; /* a second table of options it takes, or NULL */
};

/* ---- the command table ------------------------------------------------------------------------
 */

static const struct cmd cmds[] = {
    {"dataset", "create", 1, 1, 1, create_opts, cmd_dataset_create,
     "NAME [--core N] [--fringe N] [--min-core N] [--chunk-size B] [--format F]",
     "Creates a dataset. --core: synchronous replicas (default 1), --fringe: asynchronous\n"
     "replicas (default 0), --min-core: core replicas that must hold a write (default: a\n"
     "majority of core, core/2+1; 0 means the same), --chunk-size: bytes per chunk, with\n"
     "K/M/G suffixes (default 1M, at least 4K), --format: what its records are (tfrecord,\n"
     "tar, jsonl, len32, len64; default none): readers then hand out each record's payload.",
     0, NULL},
    {"dataset", "ls", 0, 0, 0, no_opts, cmd_dataset_ls, "", "Lists the datasets.", 0, NULL},
    {"dataset", "stat", 1, 1, 1, no_opts, cmd_dataset_stat, "NAME", "Shows one dataset.", 0, NULL},
    {"dataset", "seal", 1, 1, 1, no_opts, cmd_dataset_seal, "NAME",
     "Seals a dataset: no more shards can be added. Fails while an upload is incomplete.", 0, NULL},
    {"dataset", "tier", 2, 2, 2, no_opts, cmd_dataset_tier, "NAME ec:K+M|replicated",
     "Tiers a sealed dataset (admin role, a cluster of K+M nodes): ec:K+M puts every shard as K\n"
     "data and M parity fragments on K+M nodes, each durable, read back and checked against\n"
     "the shard's CRC32C, then reads go through them; replicated removes the fragments. Shows\n"
     "progress and the time left; run again after a failure, it goes on.",
     0, NULL},
    {"dataset", "repair", 1, 1, 1, no_opts, cmd_dataset_repair, "NAME",
     "Repairs an erasure-coded dataset (admin role): every fragment checked on its node; a\n"
     "missing one rebuilt from K others and put, a damaged chunk rebuilt and written back.\n"
     "Says how long it took to full redundancy; exits non-zero short of it.",
     0, NULL},
    {"dataset", "rm", 1, 1, 1, no_opts, cmd_dataset_rm, "NAME",
     "Deletes a dataset and all its shards (admin role).", 0, NULL},
    {"shard", "ls", 1, 1, 1, no_opts, cmd_shard_ls, "NAME", "Lists the shards of a dataset.", 0,
     NULL},
    {"shard", "stat", 2, 2, 2, no_opts, cmd_shard_stat, "NAME SHARD", "Shows one shard.", 0, NULL},
    {NULL, "put", 3, 3, 2, no_opts, cmd_put, "NAME SHARD FILE",
     "Uploads FILE ('-': standard input, read to its end) as shard SHARD of dataset NAME and\n"
     "seals the shard. Every chunk carries its CRC32C; the server acknowledges each once it\n"
     "is durable. A FILE that changes size during the upload fails it (nothing is sealed).",
     0, NULL},
    {NULL, "records", 1, 1, 1, records_opts, cmd_records, "NAME [--range A:B] [-o FILE]",
     "Lists a dataset's records (number, shard, offset, length), counted over its complete\n"
     "shards in shard order by their record indexes; --range A:B: records A to B-1 (either may\n"
     "be left out). With -o FILE (or -): writes the records' bytes instead, read and verified.",
     0, NULL},
    {NULL, "plan", 3, 4, 0, plan_opts, cmd_plan,
     "UNITS RANK WORLD [COUNT] [--seed S] [--epoch E] [--assign contiguous|strided]\n"
     "          [--remainder uneven|drop|pad] [--shuffle none|global|window] [--window G]",
     "Shows which of UNITS units rank RANK of WORLD reads in an epoch, in order (the first\n"
     "COUNT, default 20), as libtessera's plans compute them (docs/client.md \"Plans\").\n"
     "Needs no server.",
     0, NULL},
    {NULL, "read", 1, 3, 1, read_opts, cmd_read,
     "NAME [RANK WORLD] [--unit shard|record] [plan options as for 'plan'] [--count K]\n"
     "          [--window-units N] [--window-bytes B] [--connections N] [--depth N]\n"
     "          [--record auto|framed|payload] [-o FILE]",
     "Reads rank RANK of WORLD's plan of dataset NAME (default: rank 0 of 1) as a training job\n"
     "does, with libtessera's reader (docs/client.md \"Readers\"): units read ahead in a window,\n"
     "over several connections, every byte verified, failed reads retried on other replicas.\n"
     "Prints the units and bytes read, the rate, the data stall (time spent waiting for data),\n"
     "retries and which node served what. --count K: stop after K units. -o FILE (or -): the\n"
     "units' bytes in plan order: a record's payload (e.g. a TFRecord's data) when the dataset\n"
     "says its record format, its stored bytes with --record framed.",
     0, plan_opts},
    {NULL, "ingest", 2, 1 << 20, 1, ingest_opts, cmd_ingest,
     "FORMAT PATH... --dataset NAME [--shards N] [--seal] [--core N] [--fringe N] [--min-core N]",
     "Uploads record files (FORMAT: tfrecord, tar or webdataset, jsonl, len32, len64) as shards\n"
     "with their record index: each file one shard, or with --shards N the records of all\n"
     "files split into N shards of contiguous records (the first R mod N get one more). Every\n"
     "file is checked first: a malformed one is refused (file, offset, reason) and nothing of\n"
     "it is uploaded. Shards already sealed with the same bytes are skipped: run it again to\n"
     "resume. Creates the dataset if needed (--core/--fringe/--min-core/--chunk-size), of\n"
     "record format FORMAT; refuses a dataset of another format. The dataset stays open (more\n"
     "files can be ingested) unless --seal: then it is sealed once every shard is.",
     0, NULL},
    {NULL, "get", 2, 2, 2, get_opts, cmd_get,
     "NAME SHARD [-o FILE] [--offset O] [--length L] [--node ID]",
     "Reads a shard (or the range from --offset, --length bytes; K/M/G suffixes) to FILE\n"
     "or standard output, verifying every piece's CRC32C. FILE is written as FILE.tmp.PID\n"
     "and renamed over FILE once complete: a failed get leaves FILE as it was. --node ID (in a\n"
     "cluster): from that node's copy alone, with no failover to another replica.",
     0, NULL},
    {NULL, "scrub", 0, 1, 1, no_opts, cmd_scrub, "[NAME]",
     "Re-verifies every stored chunk of NAME (or of every dataset) on the server and lists\n"
     "corrupt ones; exits 1 when any is found. Waits without a timeout unless --timeout.",
     0, NULL},
    {NULL, "status", 0, 0, 0, status_opts, cmd_status, "[--node ID]",
     "Shows the server's status: node, listeners, connections, counters, datasets.\n"
     "On a cluster: one section per node of the map (reachable, epoch, the PGs it leads,\n"
     "its replicas' applied position and lag in operations, bytes and seconds); exits 1\n"
     "when a node that is up in the map does not answer. --node ID: that node's whole status.\n"
     "Ends with \"anomalies:\", what 'tessera top' flags too, in words (or \"no anomalies\"):\n"
     "nodes down or not answering, PGs not active for over 2 s, replicas over 5 s, 1000 ops\n"
     "or 256 MiB behind, disks under 10 % free or refusing writes, checksum failures, a PG\n"
     "read over 10x the median PG, a node serving over 2x the mean read rate, WAL damage.",
     0, NULL},
    {NULL, "top", 0, 0, 0, top_opts, cmd_top,
     "[--interval S] [--once] [--iterations N] [--prometheus URL]",
     "A live view of the cluster (or the single node), redrawn in place every --interval\n"
     "seconds (default 1; fractions allowed) and sized to the terminal: map epoch, nodes up\n"
     "and down and the totals; per node its state, connections, read and write MiB/s and\n"
     "requests/s (between two polls), free disk, cache hits, PGs active/peering and its worst\n"
     "replica's lag; the hottest datasets, PGs and shards (from the nodes' STATUS \"hot\"\n"
     "object, \"-\" without one); the lagging replicas; job stalls per rank (--prometheus\n"
     "http://HOST:9090: rate(tessera_job_data_stall_seconds_total[1m]) from Prometheus's\n"
     "HTTP API); the anomalies 'tessera status' lists. q or Ctrl-C quits and gives the\n"
     "terminal back. --once: one frame (two polls an interval apart, for the rates) as plain\n"
     "text, for scripts; --iterations N: stop after N frames.",
     0, NULL},
    {"map", "show", 0, 0, 0, no_opts, cmd_map_show, "",
     "Shows the cluster map the server has: epoch, PG count, and every node's id, addresses,\n"
     "failure domain, weight, state and how many PGs it leads.",
     1, NULL},
    {"map", "push", 1, 1, 1, no_opts, cmd_map_push, "FILE",
     "Pushes the map FILE to every node it lists (admin role): its epoch becomes one more\n"
     "than the highest epoch of the file and of every reachable node, and is written back\n"
     "into FILE first. Fails when a node that is up in the map does not take it. Without\n"
     "-s it connects to the first node of FILE that is up.",
     1, NULL},
    {NULL, "failover", 1, 1, 1, no_opts, cmd_failover, "PG",
     "Fails over placement group PG (admin role): its primary is marked down in a new map\n"
     "epoch, pushed to every other node that is up; the next core replica leads. Edit the\n"
     "map file to match before the next 'map push'.",
     1, NULL},
    {"node", "add", 2, 2, 1, node_add_opts, cmd_node_add,
     "ID ADDR --tls-addr HOST:PORT [--weight W] [--domain D] [--dry-run]",
     "Adds node ID (plain listener ADDR, TLS listener --tls-addr; weight 100 and a domain of\n"
     "its own unless given) to the cluster map, up (admin role). Like every node command it\n"
     "shows the PGs whose replicas change and the new replicas that fill from their primaries,\n"
     "refuses a change that would leave any PG with fewer than min_core caught-up core\n"
     "replicas (nothing changes then), and pushes the new map; --dry-run only shows.",
     1, NULL},
    {"node", "drain", 1, 1, 1, node_opts, cmd_node_drain, "ID [--dry-run]",
     "Marks node ID out: its replicas move to other nodes (which fill from the PGs'\n"
     "primaries); remove it once they are complete ('tessera status').",
     1, NULL},
    {"node", "remove", 1, 1, 1, node_opts, cmd_node_remove, "ID [--dry-run]",
     "Removes node ID from the map; only a node that is out (drained).", 1, NULL},
    {"node", "weight", 2, 2, 1, node_opts, cmd_node_weight, "ID W [--dry-run]",
     "Sets node ID's weight (1 to 1000000): its share of the PGs follows.", 1, NULL},
    {"node", "up", 1, 1, 1, node_opts, cmd_node_up, "ID [--dry-run]",
     "Marks node ID up (back from down: it catches up from the PGs' primaries).", 1, NULL},
    {"node", "down", 1, 1, 1, node_opts, cmd_node_down, "ID [--dry-run]",
     "Marks node ID down (failed, expected back): the next replicas serve its PGs.", 1, NULL},
    {"node", "out", 1, 1, 1, node_opts, cmd_node_out, "ID [--dry-run]",
     "Marks node ID out (as drain).", 1, NULL},
    {"rebalance", "plan", 1, 1, 1, rebalance_opts, cmd_rebalance_plan, "FILE [--rate B]",
     "Shows what pushing the map FILE would move, without changing anything: the PGs whose\n"
     "replicas change, the bytes each node takes in and gives up (every shard of every\n"
     "dataset, by its core + fringe), the time at --rate bytes/s (K/M/G; default 100M), and\n"
     "whether it would leave a PG below min_core caught-up core replicas. 'rebalance apply\n"
     "FILE' moves it live.",
     1, NULL},
    {"rebalance", "apply", 1, 1, 1, rebalance_apply_opts, cmd_rebalance_apply,
     "FILE [--max-bytes-per-sec R] [--max-concurrent N] [--detach] [--dry-run]",
     "Moves the cluster to the nodes of the map FILE live: up to N PGs (4) at a time, each\n"
     "PG's new replicas filled from its primary (R bytes/s in all, K/M/G; unlimited by\n"
     "default) while the old ones serve it; a PG switches in one epoch once its new\n"
     "replicas are complete, then the copies outside them are dropped. The state is in the\n"
     "cluster map: --detach (or any later 'resume') drives it from another process.",
     1, NULL},
    {NULL, "monitor", 0, 0, 1, node_opts, cmd_monitor, "",
     "Drives the rebalances of a cluster whose map is in etcd (--etcd), so they go on after\n"
     "the command that started them ends: run two or more; one is elected (PREFIX/rebalancer,\n"
     "bound to its 5 s lease) and drives every rebalance handed to it ('rebalance apply',\n"
     "'resume' and 'rollback' with --etcd hand theirs over); when it dies the next takes over.\n"
     "Runs until SIGTERM (admin role: -s NODE with an admin certificate).",
     1, NULL},
    {"rebalance", "split", 0, 0, 1, rebalance_apply_opts, cmd_rebalance_split,
     "[--max-bytes-per-sec R] [--max-concurrent N] [--detach] [--dry-run]",
     "Doubles the cluster's PG count online: every PG p splits into p and p + pg_count (half\n"
     "its shards each), the children first on their parents' replicas, then moved where they\n"
     "belong as a rebalance (status, pause, resume, rollback as for 'apply'; a rollback puts\n"
     "the children back on their parents' nodes). Needs every node up and every PG clean.",
     1, NULL},
    {"rebalance", "status", 0, 0, 1, node_opts, cmd_rebalance_status, "[--json]",
     "Shows the rebalance in progress: PGs done / total, moving, pending, bytes, paused.", 1, NULL},
    {"rebalance", "pause", 0, 0, 1, node_opts, cmd_rebalance_pause, "",
     "Pauses the rebalance: no PG starts moving, moving PGs' backfills wait; writes go on.", 1,
     NULL},
    {"rebalance", "resume", 0, 0, 1, rebalance_drive_opts, cmd_rebalance_resume,
     "[--max-concurrent N] [--detach]",
     "Resumes (or picks up) the rebalance from where it stopped and drives it to the end.", 1,
     NULL},
    {"rebalance", "rollback", 0, 0, 1, rebalance_drive_opts, cmd_rebalance_rollback,
     "[--max-concurrent N] [--detach]",
     "Moves back to the placement before the rebalance (nodes it added stay, out), the PGs\n"
     "that moved back the same staged way; writes made meanwhile are kept.",
     1, NULL},
    {NULL, "agent", 1, 3, 0, agent_opts, cmd_agent, "--node ID ACT [ARG [ARG]]",
     "The drills' agent: does one act to node ID's tesserad on this host, reached at -s\n"
     "(pid, kill, term, gone, stop, cont, start LOGDIR, mark DATASET, flip SINCE, datadir,\n"
     "fill LEAVE, unfill, cut OWN PEERS, heal; client/cli/cli_agent.c). `tessera drill --agent\n"
     "TEMPLATE` runs it on each node's host, e.g.\n"
     "--agent 'ssh {host} tessera -s {addr} agent --node {node}'.",
     0, NULL},
    {NULL, "drill", 1, 1, 1, drill_opts, cmd_drill,
     "SCENARIO [--duration S] [--report FILE] [--agent TEMPLATE] [--auto] [--json] [--dry-run]",
     "Runs a failover drill against the running cluster (admin role; its nodes on this host):\n"
     "a load of 64 KiB writes and verified reads on a dataset of its own, the act, the\n"
     "operator's answer (failover, restart, mark up), then every acknowledged write read back\n"
     "through the cluster and from each of its core replicas alone.\n"
     "SCENARIO: kill-primary, kill-node, node-return (kill, fail over, write, return, kill and\n"
     "fail over again), partition (cut a primary off from its peers, not from clients, with\n"
     "iptables: nodes on addresses of their own, root), slow-node (SIGSTOP for a while),\n"
     "corrupt-chunk, fringe-lag, disk-full. Prints time to detect and to recover,\n"
     "acknowledged writes lost, each core replica's shards checked / missing / with other\n"
     "bytes (exits 1 unless none is lost, missing or other), failed reads, checksum errors,\n"
     "throughput before/during/after and the final map; --report FILE writes it as JSON. The\n"
     "nodes run here (embedded mode), or --agent TEMPLATE runs each act on the node's host:\n"
     "TEMPLATE with {node} {host} {addr} {tls_addr} filled in, then ACT [ARG...] (see\n"
     "'tessera agent'). --auto (kill-primary, kill-node, node-return on a cluster whose map\n"
     "is in etcd): no failover and no mark-up by the drill: it waits for the monitor, and\n"
     "reports per PG of the node the time until writable and until fully replicated.",
     1, NULL},
    {"hot", "add", 1, 1, 1, hot_add_opts, cmd_hot_add, "NAME [--fringe +K] [--pg P] [--dry-run]",
     "Gives dataset NAME K more fringe replicas (default +1) in every PG, or in PG P (admin\n"
     "role): the next nodes of each PG's placement, backfilled from the PG's primary, then\n"
     "kept up to date like any fringe replica; reads spread over them. A map change (one\n"
     "epoch); refused during a rebalance or with fewer nodes up than replicas.",
     1, NULL},
    {"hot", "rm", 1, 1, 1, hot_rm_opts, cmd_hot_rm, "NAME [--pg P] [--dry-run]",
     "Takes NAME's extra fringe replicas away again (every PG, or PG P): a map change, then\n"
     "the nodes past the dataset's width drop their copies.",
     1, NULL},
    {"hot", "ls", 0, 0, 0, no_opts, cmd_hot_ls, "",
     "Lists the hot datasets of the map: extra fringe replicas, where, and replicas per PG.", 1,
     NULL},
    {NULL, "pg", 0, 1, 1, pg_opts, cmd_pg, "[PG] [--dataset NAME [--shard N]]",
     "Shows a placement group's replica order (rank 0 is the primary). With --dataset, the\n"
     "roles of its core and fringe replicas; with --shard too, the PG of that shard.",
     1, NULL},
};

static void usage_cmd(FILE *f, const struct cmd *k)
{
    fprintf(f, "usage: tessera [OPTIONS] %s%s%s%s%s\n\n%s\n", k->group ? k->group : "",
            k->group ? " " : "", k->name, k->args[0] ? " " : "", k->args, k->help);
}

static void usage(FILE *f)
{
    fputs("usage: tessera [OPTIONS] COMMAND [ARGS]\n"
          "\n"
          "Options (anywhere on the line):\n"
          "  -s, --server HOST:PORT   server address (default $TESSERA_SERVER, else "
          "127.0.0.1:7070)\n"
          "      --tls-ca FILE        CA bundle (PEM): connect with TLS 1.3 and verify the "
          "server\n"
          "      --tls-cert FILE      client certificate (PEM) for mutual TLS (with --tls-ca)\n"
          "      --tls-key FILE       its private key (PEM)\n"
          "      --tls-server-name N  name expected in the server certificate (default: "
          "HOST)\n"
          "      --json               machine-readable output (JSON)\n"
          "      --timeout MS         per-request timeout in milliseconds (default 30000)\n"
          "      --client-domain D    this host's failure domain in the cluster map (default\n"
          "                           $TESSERA_DOMAIN): reads go to replicas there first\n"
          "      --etcd ENDPOINTS     the cluster map in etcd (default $TESSERA_ETCD): map show\n"
          "                           and map push read and change it there\n"
          "      --etcd-prefix P      the cluster's key prefix (default /tessera/default)\n"
          "  -v, --verbose            log what the library does to stderr\n"
          "  -h, --help               this help; 'tessera COMMAND --help' for a command's\n"
          "\n"
          "Commands:\n",
          f);
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++) {
        char line[128];
        if (cmds[i].cluster && (i == 0 || !cmds[i - 1].cluster))
            fputs("\nCluster commands:\n", f);
        snprintf(line, sizeof(line), "%s%s%s%s%s", cmds[i].group ? cmds[i].group : "",
                 cmds[i].group ? " " : "", cmds[i].name, cmds[i].args[0] ? " " : "", cmds[i].args);
        fprintf(f, "  %s\n", line);
    }
    fputs("\nSizes take K, M, G, T suffixes (powers of 1024). See docs/client.md.\n", f);
}

/* A usage error: one line on stderr, exit status 2. */
static int usage_error(const char *what, const struct cmd *k)
{
    if (k)
        fprintf(stderr, "tessera: %s%s%s: %s (see 'tessera %s%s%s --help')\n",
                k->group ? k->group : "", k->group ? " " : "", k->name, what,
                k->group ? k->group : "", k->group ? " " : "", k->name);
    else
        fprintf(stderr, "tessera: %s (see 'tessera --help')\n", what);
    return EXIT_USAGE;
}

static const struct cmd *find_cmd(const char *group, const char *name)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++) {
        const struct cmd *k = &cmds[i];
        if (k->group ? (group && strcmp(k->group, group) == 0 && name && strcmp(k->name, name) == 0)
                     : (!group && strcmp(k->name, name) == 0))
            return k;
    }
    return NULL;
}

static int is_group(const char *w)
{
    return strcmp(w, "dataset") == 0 || strcmp(w, "shard") == 0 || strcmp(w, "map") == 0 ||
           strcmp(w, "node") == 0 || strcmp(w, "rebalance") == 0 || strcmp(w, "hot") == 0;
}

static void usage_group(FILE *f, const char *group)
{
    fprintf(f, "usage: tessera [OPTIONS] %s SUBCOMMAND\n\n", group);
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++)
        if (cmds[i].group && strcmp(cmds[i].group, group) == 0)
            fprintf(f, "  %s %s%s%s\n", group, cmds[i].name, cmds[i].args[0] ? " " : "",
                    cmds[i].args);
}

/* A size option's value, or a usage error. */
static int opt_size(const struct cmd *k, const char *opt, const char *val, uint64_t max,
                    uint64_t *out)
{
    char msg[200];
    int rc = cli_parse_size(val, out);

    if (!rc && *out > max)
        rc = TS_ERANGE;
    if (!rc)
        return 0;
    snprintf(msg, sizeof(msg), "--%s: '%s' is not a size%s (e.g. 4096, 64K, 1M, 2G)", opt, val,
             rc == TS_ERANGE ? " in range" : "");
    return usage_error(msg, k);
}

static int opt_u8(const struct cmd *k, const char *opt, const char *val, uint8_t *out)
{
    char msg[160];
    uint64_t v;

    if (cli_parse_uint(val, UINT8_MAX, &v) == 0) {
        *out = (uint8_t)v;
        return 0;
    }
    snprintf(msg, sizeof(msg), "--%s: '%s' is not a number from 0 to 255", opt, val);
    return usage_error(msg, k);
}

static void print_error(const struct ctx *x, const struct cmd *k, int rc)
{
    char where[512];
    const char *srv = x->c ? tessera_client_error(x->c) : "";
    size_t off;

    off = (size_t)snprintf(where, sizeof(where), "%s%s%s", k->group ? k->group : "",
                           k->group ? " " : "", k->name);
    for (int i = 0; i < x->argc && i < k->ctx_args && off < sizeof(where); i++)
        off += (size_t)snprintf(where + off, sizeof(where) - off, " %s", x->argv[i]);
    if (x->local[0])
        srv = x->local;
    if (srv[0])
        fprintf(stderr, "tessera: %s: %s (%s): %s\n", where, ts_strerror(rc), ts_errname(rc), srv);
    else
        fprintf(stderr, "tessera: %s: %s (%s)\n", where, ts_strerror(rc), ts_errname(rc));
}

/* Keep going after parsing. */
#define CLI_RUN (-1)

/*
 * Parses the command line into x, opts and *kout; positional arguments go into x->argv
 * (room for argc). CLI_RUN to go on, else the exit status (help printed, or a usage error).
 */
static int parse_args(int argc, char **argv, struct ctx *x, struct tessera_opts *opts,
                      const struct cmd **kout, int *verbose)
{
    const struct cli_opt *tables[3] = {global_opts, NULL, NULL}, *o;
    const struct cmd *k = NULL;
    const char *group = NULL, *val;
    struct cli_iter it;
    struct ts_addr addr;
    enum cli_token tok;
    char msg[512], why[160];
    int help = 0;
    uint64_t v;

    cli_iter_init(&it, argc - 1, argv + 1);
    while ((tok = cli_next(&it, tables, 3, &o, &val)) != CLI_END) {
        if (tok == CLI_ERR)
            return usage_error(it.err, k);
        if (tok == CLI_POS) {
            if (k) {
                x->argv[x->argc++] = (char *)val;
            } else if (!group && is_group(val)) {
                group = val;
            } else {
                k = find_cmd(group, val);
                if (!k) {
                    snprintf(msg, sizeof(msg), "unknown command '%s%s%s'", group ? group : "",
                             group ? " " : "", val);
                    return usage_error(msg, NULL);
                }
                tables[1] = k->opts;
                tables[2] = k->more_opts;
            }
            continue;
        }
        switch (o->id) {
        case O_HELP:
            help = 1;
            break;
        case O_SERVER:
            x->server = val;
            x->server_set = 1;
            break;
        case O_TLS_CA:
            opts->tls_ca = val;
            break;
        case O_TLS_CERT:
            opts->tls_cert = val;
            break;
        case O_TLS_KEY:
            opts->tls_key = val;
            break;
        case O_TLS_NAME:
            opts->tls_server_name = val;
            break;
        case O_JSON:
            x->json = 1;
            break;
        case O_VERBOSE:
            *verbose = 1;
            break;
        case O_CLIENT_DOMAIN:
            opts->domain = val;
            break;
        case O_TIMEOUT:
            if (cli_parse_uint(val, INT32_MAX, &v) != 0 || v == 0)
                return usage_error("--timeout: want milliseconds, 1 or more", k);
            opts->timeout_ms = (int)v;
            x->timeout_set = 1;
            break;
        case O_CORE:
        case O_FRINGE:
        case O_MIN_CORE:
            if (opt_u8(k, o->name, val,
                       o->id == O_CORE     ? &x->policy.core
                       : o->id == O_FRINGE ? &x->policy.fringe
                                           : &x->policy.min_core))
                return EXIT_USAGE;
            x->min_core_set |= o->id == O_MIN_CORE;
            break;
        case O_CHUNK:
            if (opt_size(k, o->name, val, UINT32_MAX, &v))
                return EXIT_USAGE;
            x->policy.chunk_size = (uint32_t)v;
            break;
        case O_OUTPUT:
            x->output = val;
            break;
        case O_OFFSET:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->offset))
                return EXIT_USAGE;
            break;
        case O_DATASET:
            x->dataset = val;
            break;
        case O_SHARD:
        case O_SHARDS:
            if (cli_parse_uint(val, UINT32_MAX, &x->shard) != 0) {
                snprintf(msg, sizeof(msg), "--shard: '%s' is not a shard number (0 to %u)", val,
                         UINT32_MAX);
                return usage_error(msg, k);
            }
            x->shard_set = 1;
            break;
        case O_NODE:
            x->node = val;
            break;
        case O_TLS_ADDR:
            x->tls_addr = val;
            break;
        case O_DOMAIN:
            x->domain = val;
            break;
        case O_WEIGHT:
            if (cli_parse_uint(val, 1000000, &x->weight) != 0 || x->weight == 0) {
                snprintf(msg, sizeof(msg), "--weight: '%s' is not a weight (1 to 1000000)", val);
                return usage_error(msg, k);
            }
            break;
        case O_DRY_RUN:
            x->dry_run = 1;
            break;
        case O_AUTO:
            x->auto_heal = 1;
            break;
        case O_SEAL:
            x->seal = 1;
            break;
        case O_ETCD:
            x->etcd = val;
            break;
        case O_ETCD_PREFIX:
            x->etcd_prefix = val;
            break;
        case O_FORMAT: {
            int f = strcmp(val, "none") ? tessera_record_format_parse(val) : 0;
            if (f < 0) {
                snprintf(msg, sizeof(msg),
                         "--format: '%s' is not a record format (tfrecord, tar, webdataset, "
                         "jsonl, len32, len64, none)",
                         val);
                return usage_error(msg, k);
            }
            x->policy.record_format = (uint8_t)f;
            break;
        }
        case O_HOT_FRINGE:
            if (cli_parse_uint(val[0] == '+' ? val + 1 : val, 255, &x->hot_fringe) != 0) {
                snprintf(msg, sizeof(msg), "--fringe: '%s' is not +K (extra replicas)", val);
                return usage_error(msg, k);
            }
            break;
        case O_PG:
            if (cli_parse_uint(val, UINT32_MAX, &x->hot_pg) != 0) {
                snprintf(msg, sizeof(msg), "--pg: '%s' is not a PG number", val);
                return usage_error(msg, k);
            }
            x->hot_pg_set = 1;
            break;
        case O_DURATION:
            if (cli_parse_uint(val, 3600, &x->duration) != 0 || x->duration < 2) {
                snprintf(msg, sizeof(msg), "--duration: '%s' is not 2 to 3600 seconds", val);
                return usage_error(msg, k);
            }
            break;
        case O_REPORT:
            x->report = val;
            break;
        case O_AGENT:
            x->agent = val;
            break;
        case O_RATE:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->rate))
                return EXIT_USAGE;
            break;
        case O_MAX_CONC:
            if (cli_parse_uint(val, 65536, &x->max_concurrent) != 0 || !x->max_concurrent) {
                snprintf(msg, sizeof(msg), "--max-concurrent: '%s' is not 1 to 65536", val);
                return usage_error(msg, k);
            }
            break;
        case O_DETACH:
            x->detach = 1;
            break;
        case O_RANGE:
            x->range = val;
            break;
        case O_SEED:
        case O_EPOCH:
        case O_WINDOW:
            if (cli_parse_uint(val, o->id == O_WINDOW ? UINT32_MAX : UINT64_MAX, &v) != 0) {
                snprintf(msg, sizeof(msg), "--%s: '%s' is not a number", o->name, val);
                return usage_error(msg, k);
            }
            if (o->id == O_SEED)
                x->plan.seed = v;
            else if (o->id == O_EPOCH)
                x->plan.epoch = v;
            else
                x->plan.window = (uint32_t)v;
            break;
        case O_ASSIGN:
        case O_REMAINDER:
        case O_SHUFFLE: {
            static const char *const words[3][3] = {{"contiguous", "strided", NULL},
                                                    {"uneven", "drop", "pad"},
                                                    {"none", "global", "window"}};
            int which = o->id == O_ASSIGN ? 0 : o->id == O_REMAINDER ? 1 : 2, got = -1;
            for (int w = 0; w < 3; w++)
                if (words[which][w] && !strcmp(val, words[which][w]))
                    got = w;
            if (got < 0) {
                snprintf(msg, sizeof(msg), "--%s: '%s' is not one of %s|%s%s%s", o->name, val,
                         words[which][0], words[which][1], words[which][2] ? "|" : "",
                         words[which][2] ? words[which][2] : "");
                return usage_error(msg, k);
            }
            if (o->id == O_ASSIGN)
                x->plan.assign = got;
            else if (o->id == O_REMAINDER)
                x->plan.remainder = got;
            else
                x->plan.shuffle = got;
            break;
        }
        case O_UNIT:
            if (strcmp(val, "shard") && strcmp(val, "record")) {
                snprintf(msg, sizeof(msg), "--unit: '%s' is not one of shard|record", val);
                return usage_error(msg, k);
            }
            x->rd.unit = !strcmp(val, "shard") ? TESSERA_UNIT_SHARD : TESSERA_UNIT_RECORD;
            break;
        case O_RECORD:
            if (strcmp(val, "auto") && strcmp(val, "framed") && strcmp(val, "payload")) {
                snprintf(msg, sizeof(msg), "--record: '%s' is not one of auto|framed|payload", val);
                return usage_error(msg, k);
            }
            x->rd.record = !strcmp(val, "auto")     ? TESSERA_RECORD_AUTO
                           : !strcmp(val, "framed") ? TESSERA_RECORD_FRAMED
                                                    : TESSERA_RECORD_PAYLOAD;
            break;
        case O_WINDOW_BYTES:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->rd.window_bytes))
                return EXIT_USAGE;
            break;
        case O_WINDOW_UNITS:
        case O_CONNECTIONS:
        case O_DEPTH:
        case O_COUNT:
            if (cli_parse_uint(val, o->id == O_COUNT ? UINT64_MAX : UINT32_MAX, &v) != 0 || !v) {
                snprintf(msg, sizeof(msg), "--%s: '%s' is not a number above 0", o->name, val);
                return usage_error(msg, k);
            }
            if (o->id == O_WINDOW_UNITS)
                x->rd.window_units = (uint32_t)v;
            else if (o->id == O_CONNECTIONS)
                x->rd.connections = (uint32_t)v;
            else if (o->id == O_DEPTH)
                x->rd.depth = (uint32_t)v;
            else
                x->count = v;
            break;
        case O_INTERVAL: {
            char *end = NULL;
            double d = strtod(val, &end);
            if (!end || end == val || *end || !(d >= 0.1 && d <= 3600)) {
                snprintf(msg, sizeof(msg), "--interval: '%s' is not 0.1 to 3600 seconds", val);
                return usage_error(msg, k);
            }
            x->top_interval = d;
            break;
        }
        case O_ONCE:
            x->top_once = 1;
            break;
        case O_ITERATIONS:
            if (cli_parse_uint(val, UINT32_MAX, &x->top_iterations) != 0 || !x->top_iterations) {
                snprintf(msg, sizeof(msg), "--iterations: '%s' is not a number above 0", val);
                return usage_error(msg, k);
            }
            break;
        case O_PROMETHEUS:
            if (strncmp(val, "http://", 7) != 0) {
                snprintf(msg, sizeof(msg), "--prometheus: '%s' is not http://HOST:PORT", val);
                return usage_error(msg, k);
            }
            x->prometheus = val;
            break;
        case O_LENGTH:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->length))
                return EXIT_USAGE;
            x->length_set = 1;
            break;
        }
    }
    if (help) {
        if (k)
            usage_cmd(stdout, k);
        else if (group)
            usage_group(stdout, group);
        else
            usage(stdout);
        return 0;
    }
    if (!k && !group)
        return usage_error("no command given", NULL);
    if (!k) {
        fprintf(stderr, "tessera: '%s' needs a subcommand (see 'tessera %s --help')\n", group,
                group);
        return EXIT_USAGE;
    }
    if (x->argc < k->min_args || x->argc > k->max_args)
        return usage_error(x->argc < k->min_args ? "missing arguments" : "too many arguments", k);
    /* A SHARD argument is checked before connecting: a typo is a usage error. */
    if (strstr(k->args, "NAME SHARD") == k->args &&
        cli_parse_uint(x->argv[1], UINT32_MAX, &v) != 0) {
        snprintf(msg, sizeof(msg), "'%s' is not a shard number (0 to %u)", x->argv[1], UINT32_MAX);
        return usage_error(msg, k);
    }
    /* PG arguments too; `pg` needs a PG or --dataset with --shard. */
    if ((k->run == cmd_failover || k->run == cmd_pg) && x->argc > 0 &&
        cli_parse_uint(x->argv[0], UINT32_MAX, &v) != 0) {
        snprintf(msg, sizeof(msg), "'%s' is not a PG number", x->argv[0]);
        return usage_error(msg, k);
    }
    if (k->run == cmd_pg && x->argc == 0 && !(x->dataset && x->shard_set))
        return usage_error("give a PG, or --dataset NAME --shard N", k);
    if (k->run == cmd_pg && x->shard_set && !x->dataset)
        return usage_error("--shard needs --dataset", k);
    if (ts_addr_parse_why(x->server, &addr, why, sizeof(why)) != 0) {
        snprintf(msg, sizeof(msg), "bad server address '%s': %s", x->server, why);
        return usage_error(msg, NULL);
    }
    /* TLS is chosen by --tls-ca: a certificate without it would silently go over plain TCP. */
    if ((opts->tls_cert || opts->tls_key) && !opts->tls_ca)
        return usage_error(TS_CERT_NEEDS_CA, NULL);
    if (opts->domain && opts->domain[0] && !ts_map_domain_valid(opts->domain)) {
        snprintf(msg, sizeof(msg),
                 "bad domain '%.80s' (--client-domain or $TESSERA_DOMAIN): 1 to 63 of "
                 "[A-Za-z0-9._:/-]",
                 opts->domain);
        return usage_error(msg, NULL);
    }
    *kout = k;
    return CLI_RUN;
}

int main(int argc, char **argv)
{
    const struct cmd *k = NULL;
    struct tessera_opts opts;
    const char *env;
    struct ctx x;
    char err[512];
    int verbose = 0, rc;

    memset(&x, 0, sizeof(x));
    tessera_opts_init(&opts);
    opts.client_name = "tessera-cli";
    x.policy.core = 1;
    x.hot_fringe = 1; /* hot add: +1 without --fringe */
    x.top_interval = 1;
    tessera_plan_opts_init(&x.plan);
    tessera_reader_opts_init(&x.rd);
    x.opts = &opts;
    env = getenv("TESSERA_SERVER");
    x.server = env && env[0] ? env : TS_DEFAULT_ADDRESS;
    x.server_set = env && env[0];
    env = getenv("TESSERA_DOMAIN");
    opts.domain = env && env[0] ? env : NULL;
    x.argv = calloc((size_t)argc + 1, sizeof(*x.argv));
    if (!x.argv)
        return EXIT_FAIL;
    rc = parse_args(argc, argv, &x, &opts, &k, &verbose);
    if (rc != CLI_RUN)
        goto out_free;
    if (verbose)
        ts_log_set(ts_log_stderr, NULL, TS_LOG_DEBUG);
    if (!x.etcd && (env = getenv("TESSERA_ETCD")) && env[0])
        x.etcd = env;
    if (!x.etcd_prefix)
        x.etcd_prefix = "/tessera/default";
    if (x.etcd && (k->run == cmd_map_show || k->run == cmd_map_push)) {
        /* The map in etcd: no node to connect to. */
        rc = k->run == cmd_map_show ? cli_etcd_map_show(&x) : cli_etcd_map_push(&x);
        if (rc)
            print_error(&x, k, rc);
        rc = rc ? EXIT_FAIL : 0;
        goto out_free;
    }
    if (k->run == cmd_map_push && !x.server_set)
        map_push_seed(&x, &opts); /* no -s: the first node of the map file */
    opts.address = x.server;
    /* plan needs no server; the agent connects only for the acts that need its node up */
    rc = k->run == cmd_plan || k->run == cmd_agent
             ? 0
             : ts_client_open_ex(&x.c, &opts, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tessera: cannot connect to %s: %s (%s)%s%s\n", x.server, ts_strerror(rc),
                ts_errname(rc), err[0] ? ": " : "", err);
        rc = EXIT_FAIL;
        goto out_free;
    }
    if (k->run == cmd_scrub && !x.timeout_set)
        ts_client_set_timeout(x.c, -1); /* a scrub takes as long as the data it reads */
    rc = k->run(&x);
    if (rc)
        print_error(&x, k, rc);
    tessera_client_close(x.c);
    if (fflush(stdout) != 0 && !rc) {
        fprintf(stderr, "tessera: cannot write to stdout: %s\n", strerror(errno));
        rc = EXIT_FAIL;
        goto out_free;
    }
    rc = rc ? EXIT_FAIL : 0;
out_free:
    free(x.argv);
    return rc;
}
