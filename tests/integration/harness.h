/*
 * Integration-test harness: real tesserad processes on loopback. Each daemon gets a fresh
 * data directory and a free port (port 0, read back from its readiness line); start waits
 * for readiness (never a fixed sleep); a failing test dumps the daemon's log.
 */
#ifndef TS_HARNESS_H
#define TS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct tsd_proc {
    pid_t pid;
    char *dir;      /* temp dir holding data/ and the log */
    char data[512]; /* data directory */
    char log[512];  /* stderr of the daemon */
    char addr[64];  /* plain TCP "127.0.0.1:PORT", "" if none */
    char tls_addr[64];
    char rdma_addr[80]; /* "HOST:PORT" of --rdma-listen, "" if none */
    long log_off;       /* where this run's lines start in the log */
    char *argv[64];
    int argc;
};

/* Starts tesserad with --listen 127.0.0.1:0 --data DIR/data and the extra NULL-terminated
 * arguments; waits up to 30 s for the ready line. Reuses p->dir if already set (restart). */
int tsd_start(struct tsd_proc *p, const char *const *extra);
/* SIGTERM, wait up to 15 s, then SIGKILL. Returns the exit status (as from waitpid). */
int tsd_stop(struct tsd_proc *p);
/* kill -9 and reap. */
void tsd_kill9(struct tsd_proc *p);
/* Removes the temp dir. A sanitizer report in the daemon's log (all of its runs) is printed
 * and makes the test process exit with 1 when it ends. */
void tsd_cleanup(struct tsd_proc *p);
/* Prints the daemon log to stderr (for failures). */
void tsd_dump_log(const struct tsd_proc *p);
/* Resident set size of the daemon, KiB. */
long tsd_rss_kb(const struct tsd_proc *p);
/* Whether the process is still running. */
int tsd_alive(struct tsd_proc *p);

/* Raw sockets for bad-input tests (raw.c). A plain connection is anonymous. */
int raw_connect(const char *addr);
/* A TLS connection to a TLS address, presenting role's test certificate ("admin", "writer",
 * "reader", "node-n2", ...; NULL: none); -1 if it cannot be made. The raw_* functions below
 * work on either kind; close one with raw_close. */
int raw_connect_as(const char *tls_addr, const char *role);
void raw_close(int fd);
/* Sends a frame built from (opcode, flags, req id, payload). */
int raw_send_frame(int fd, uint8_t op, uint16_t flags, uint64_t id, const void *payload,
                   size_t len);
/* Reads one reply frame; returns its status (first i32 of the payload) or a negative
 * TS_ECONNRESET/TS_ETIMEDOUT/TS_EPROTO for transport trouble; msg (optional) gets the error
 * text. payload (optional) receives the malloc'ed payload. */
int raw_recv_reply(int fd, int timeout_ms, uint64_t *id, char *msg, size_t cap, uint8_t **payload,
                   size_t *plen);
/* Sends all of buf (MSG_NOSIGNAL): 0 or TS_ECONNRESET. */
int raw_send_all(int fd, const void *buf, size_t len);
/*
 * READ of [0, len) of a shard from the node at addr, on a connection of its own: the piece CRCs
 * are verified and the bytes copied to out (len bytes at most), their count to *got. 0, or the
 * node's or the transport's error, TS_ECORRUPT for a piece whose CRC does not match, TS_EPROTO
 * for a malformed reply.
 */
int raw_read_shard(const char *addr, const char *ds, uint32_t shard, size_t len, uint8_t *out,
                   size_t *got);
/* The node's current map (MAP_GET on a connection of its own); NULL if it does not answer. */
struct ts_map;
struct ts_map *raw_map_get(const char *addr);
/* A PG's log as the node at addr reports it (PG_INFO): head (epoch, seq), oldest seq kept,
 * the epoch promised, the last epoch started. 0, or the failure. */
struct raw_pginfo {
    uint64_t applied, oldest, head_epoch, promised, les;
};
int raw_pg_info(const char *addr, uint32_t pg, struct raw_pginfo *pi);
/* The node at addr's STATUS (compact JSON, malloc'ed), or NULL when it does not answer. */
char *raw_status_json(const char *addr);
/* The node at addr's STATUS stats.read_bytes (data bytes its READs and READVs served since it
 * started); -1 when it does not answer. */
int64_t raw_status_read_bytes(const char *addr);
/* Whether the node at addr's STATUS (compact JSON) contains needle. */
int raw_status_has(const char *addr, const char *needle);
/* MAP_PUSH of m to the node at its TLS address as admin (header epoch 0, on a connection of its
 * own); the reply's status. */
int raw_map_push(const char *tls_addr, const struct ts_map *m);
/* 1 when the peer has closed the connection within timeout_ms (reads and drops bytes). */
int raw_wait_closed(int fd, int timeout_ms);

/* GET path from the HTTP server at addr ("HOST:PORT"): the status code (-1: no answer), the body
 * (NUL-terminated, at most cap - 1 bytes) in body. */
int tsd_http_get(const char *addr, const char *path, char *body, size_t cap);
/* The value of metric `name` (its first sample) on node p's /metrics (p started with
 * --metrics-listen 127.0.0.1:0); -1 when there is none. */
double tsd_metric(const struct tsd_proc *p, const char *name);
/* A free TCP port on 127.0.0.1 (bound and released: a tiny race, fine for tests). */
int tsd_free_port(void);
/* n distinct free loopback ports at once (0, or -1). */
int tsd_free_ports(int *ports, int n);

/* A cluster of real daemons on loopback with a generated map file. */
#define TSD_CLUSTER_MAX 8
struct tsd_cluster {
    int n;
    struct tsd_proc node[TSD_CLUSTER_MAX];
    char id[TSD_CLUSTER_MAX][16];
    char listen[TSD_CLUSTER_MAX][64];     /* plain TCP: clients without a certificate (reader) */
    char tls_listen[TSD_CLUSTER_MAX][64]; /* mutual TLS: writers, admins and the peer nodes */
    char cert[TSD_CLUSTER_MAX][600], key[TSD_CLUSTER_MAX][600], ca[600]; /* node certificates */
    char map_path[512];
    char *dir;
};
/* Set before tsd_cluster_start: node i listens on 127.0.1.(i+1) instead of 127.0.0.1 (its own
 * host, as on a real cluster: the partition drill cuts nodes apart by address). The test
 * certificates name those addresses too. */
extern int tsd_cluster_own_hosts;
/* Starts n nodes "n1".."nN" in the given failure domains (NULL: one domain per node), with a
 * map of pg_count PGs at epoch 1; extra arguments go to every node. Each node listens on plain
 * TCP (anonymous clients: reader) and on TLS with its node certificate node-nI (test_certs()),
 * which it also presents to its peers. */
int tsd_cluster_start(struct tsd_cluster *cl, int n, const char *const *domains, uint32_t pg_count,
                      const char *const *extra);
/* The same, with node i's own extra arguments node_extra[i] (NULL: none) after extra. */
int tsd_cluster_start_each(struct tsd_cluster *cl, int n, const char *const *domains,
                           uint32_t pg_count, const char *const *extra,
                           const char *const *const *node_extra);
/* Index of node id, or -1. */
int tsd_cluster_find(const struct tsd_cluster *cl, const char *id);
/* SIGTERM to every node; -1 if any did not exit 0 (its log is printed). */
int tsd_cluster_stop(struct tsd_cluster *cl);
/* For tests whose drills restart nodes (then not children of the harness): SIGKILL to every
 * tesserad of the cluster by the pid its STATUS gives, then tsd_cluster_stop. */
int tsd_cluster_stop_restarted(struct tsd_cluster *cl);
void tsd_cluster_dump_logs(const struct tsd_cluster *cl);

/* Runs `CLI -s <node 0's TLS address> <admin certificate options> ARGS` (the command's output
 * shown on stderr as it comes and kept in out[cap]); its exit status, or -1. */
int tsd_cli(const struct tsd_cluster *cl, const char *cli_path, char *out, size_t cap,
            const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same without showing the command or its output (for polls: the caller says what matters). */
int tsd_cli_quiet(const struct tsd_cluster *cl, const char *cli_path, char *out, size_t cap,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Path of certificate file NAME.EXT in test_certs() (a small ring of static buffers). */
const char *test_cert(const char *name, const char *ext);

/* Options for a client of node p over its TLS listener, verifying against the test CA and
 * presenting role's certificate (NULL: none); the strings stay valid for a few calls. */
struct tessera_opts;
void tsd_client_opts(struct tessera_opts *o, const struct tsd_proc *p, const char *role);

/* Opens a libtessera handle on TLS address addr, verifying against ca (NULL: the test CA)
 * and server_name (NULL: the host), presenting role's certificate (NULL: none). */
struct tessera_client;
int test_tls_open(struct tessera_client **c, const char *addr, const char *role, const char *ca,
                  const char *server_name);

/* A plain-TCP libtessera handle on node p (20 s timeout); NULL if it cannot be opened. */
struct tessera_client *tsd_connect(const struct tsd_proc *p);
/* Puts shard `shard` of ds: len bytes of ts_test_fill's pattern `seed` (from offset 0);
 * tessera_put's result. */
int tsd_put_pattern(struct tessera_client *c, const char *ds, uint32_t shard, size_t len,
                    uint64_t seed);

/* Bytes on disk (allocated blocks) in the chunk files of every node of cl: each shard's chunks,
 * a replica's or a fragment's, are in a file of its own (storage/chunkfile.c). */
uint64_t tsd_cluster_chunk_bytes(const struct tsd_cluster *cl);

/* How many chunk files of exactly `size` bytes are under node data directory DATA (a shard's or
 * fragment's chunks, storage/chunkfile.c); the last one found into path. */
int tsd_chunk_files_of_size(const char *data, off_t size, char *path, size_t cap);

/* The certificate directory made by conf/mkcerts for this test run. */
const char *test_certs(void);

#endif
