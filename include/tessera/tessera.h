/*
 * libtessera: the client library of tessera, a shard-serving storage service for ML training.
 *
 * Threads: a tessera_client handle is used by one thread at a time (it holds one connection
 * and the state of the requests in flight on it); use one handle per thread. Different
 * handles are independent. ts_log_set() (tessera/log.h) is process-wide: set it once.
 *
 * Errors: every function returning int returns 0 or a negative TS_E* code (tessera/errno.h).
 * When the server refused a request, tessera_client_error() holds its one-line message.
 *
 * Ownership: strings and buffers passed in stay the caller's; the library keeps no pointer to
 * them after the call returns, except the destination buffers of submitted reads, which must
 * stay valid until the read completes (tessera_wait*) or the handle is closed. Arrays returned
 * through out-parameters are malloc'ed and the caller free()s them. On failure out-parameters
 * are left empty (NULL / 0) and the caller still owns its arguments.
 *
 * Clusters: the address given to tessera_client_open may be any node of a cluster (a seed).
 * When that node has a cluster map, the handle keeps it and routes every call to the nodes
 * that hold the data (writes to the placement group's primary, reads to any of its replicas,
 * with failover to the next replica), over one connection per node opened when first needed
 * (docs/client.md, "Cluster mode").
 *
 * Integrity: every byte received is checked against the CRC32C the server sent for its piece
 * before the call reports success; a mismatch is TS_ECORRUPT. Uploads send each chunk's CRC32C
 * and the whole shard's CRC32C, which the server verifies before acknowledging.
 */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/errno.h"
#include "tessera/log.h"
#include "tessera/plan.h"
#include "tessera/records.h"
#include "tessera/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessera_client tessera_client;

struct tessera_opts {
    const char *address;         /* "host:port"; default "127.0.0.1:7070" */
    const char *tls_ca;          /* CA bundle (PEM). Set: connect with TLS 1.3 and verify */
    const char *tls_cert;        /* client certificate (PEM) for mutual TLS, optional; needs
                                    tls_ca (TS_EINVAL otherwise: no TLS without verifying) */
    const char *tls_key;         /* its private key (PEM) */
    const char *tls_server_name; /* name expected in the server certificate; default: host */
    const char *client_name;     /* sent in HELLO, shows up in server logs */
    int timeout_ms;              /* per request, from send to complete reply; default 30000 */
    unsigned max_inflight;       /* requests in flight per handle; default 64 */
    /* The client's failure domain in the cluster map: a node whose domain is this (a node
     * without a domain: whose id is this) is local. Set: reads go to the replicas here first,
     * spread among them, and fall back to the others in their usual order (docs/client.md,
     * "Locality"). NULL or "": no preference. At most 63 of [A-Za-z0-9._:/-] (TS_EINVAL). */
    const char *domain;
};

void tessera_opts_init(struct tessera_opts *o);

/* Connects, handshakes (TLS when tls_ca is set) and says HELLO. */
int tessera_client_open(tessera_client **out, const struct tessera_opts *o);
/* Closes the connection; requests still in flight are abandoned. NULL is a no-op. */
void tessera_client_close(tessera_client *c);
/* The role the server granted (0 none, 1 reader, 2 writer, 3 admin). */
int tessera_client_role(const tessera_client *c);
/* The server's message for the last refused request on this handle ("" if none). */
const char *tessera_client_error(const tessera_client *c);
/* The server's node id, as sent in its HELLO reply. */
const char *tessera_client_node(const tessera_client *c);
/* The cluster map epoch the handle routes by; 0 on a single node (no cluster map). */
uint64_t tessera_client_epoch(const tessera_client *c);

/* ---- datasets ----------------------------------------------------------------------------- */

/* p NULL: 1 core replica, no fringe, min_core 1, 1 MiB chunks. */
int tessera_dataset_create(tessera_client *c, const char *name, const struct ts_dataset_policy *p);
int tessera_dataset_list(tessera_client *c, struct ts_dataset_info **out, size_t *n);
int tessera_dataset_stat(tessera_client *c, const char *name, struct ts_dataset_info *out);
int tessera_dataset_seal(tessera_client *c, const char *name);
/*
 * Tiers a sealed dataset (issue 33; docs/operations.md "Tiering"): k data and m parity
 * fragments of every shard, each on its own node (k + m nodes that are not out; 1 <= k <= 32,
 * 1 <= m <= 8), or back to replicated only (k = m = 0). Each shard is read (verified), encoded,
 * its fragments put durably, then read back through them and checked against the shard's
 * CRC32C; only then is the dataset marked erasure-coded on every node, and each node drops its
 * replicas' bytes (keeping the shards' records): every read of the dataset then goes through its
 * fragments. Back to replicated, each shard is rebuilt from its fragments and put back on its
 * replicas, which each node checks chunk by chunk before the fragments are removed. Run again
 * after a failure, it finds the work done already and goes on. progress (may be NULL) is called
 * after each shard. A cluster handle with admin rights;
 * TS_ENOTSUP on a single node.
 */
/*
 * Repairs an erasure-coded dataset's fragments (issue 33): every fragment of every shard is
 * checked on its node (read, so each chunk is verified); one missing there (a new node in its
 * position, a lost store) is rebuilt from K others and put, and a chunk that fails its CRC32C
 * is rebuilt and written back (the node checks it against the chunk's stored CRC32C). A node
 * that cannot be reached is counted, not waited for. TS_EIO when any fragment could not be
 * repaired (the message says which). Admin role, a cluster handle.
 */
struct tessera_repair_report {
    uint32_t shards;
    uint64_t fragments_put;   /* whole fragments rebuilt and put */
    uint64_t chunks_repaired; /* damaged chunks rebuilt and written back */
    uint64_t bytes_rebuilt;
    uint64_t unreachable; /* fragments whose node could not be reached */
    uint64_t failed;      /* fragments that could not be repaired */
};
int tessera_dataset_repair(tessera_client *c, const char *name, struct tessera_repair_report *rep);
typedef void (*tessera_tier_progress)(void *arg, uint32_t shards_done, uint32_t shards,
                                      uint64_t bytes_done, uint64_t bytes);
int tessera_dataset_tier(tessera_client *c, const char *name, unsigned k, unsigned m,
                         tessera_tier_progress progress, void *arg);
int tessera_dataset_delete(tessera_client *c, const char *name);

/* ---- shards ------------------------------------------------------------------------------- */

int tessera_shard_stat(tessera_client *c, const char *name, uint32_t shard,
                       struct ts_shard_info *out);
int tessera_shard_list(tessera_client *c, const char *name, struct ts_shard_info **out, size_t *n);
/* The record index of a complete shard: *n ascending byte offsets where its records start
 * (malloc'ed in *offsets; none: NULL and 0). TS_EINCOMPLETE while it is being written. */
int tessera_shard_records(tessera_client *c, const char *name, uint32_t shard, uint64_t **offsets,
                          uint32_t *n);

/*
 * A dataset's records as plan units (tessera/plan.h): its complete shards in shard order, each
 * with its record count. Record u of the dataset is record u - first[i] of shard[i]. For a plan
 * over records, set units = total, group_sizes = count, ngroups = nshards (the WINDOW shuffle
 * then keeps a window of shards open at a time).
 */
struct tessera_dataset_records {
    uint32_t nshards;
    uint32_t *shard; /* shard numbers, ascending */
    uint64_t *count; /* records of each */
    uint64_t *first; /* dataset record number of each one's first record */
    uint64_t total;  /* records in the dataset */
    uint64_t *bytes; /* bytes of each shard */
    int format;      /* the dataset's record format (enum tessera_record_format; 0: not said) */
};
int tessera_dataset_records(tessera_client *c, const char *name,
                            struct tessera_dataset_records **out);
void tessera_dataset_records_free(struct tessera_dataset_records *r); /* NULL ok */
/* Record u of the dataset: its shard and its number within the shard. TS_ERANGE past total. */
int tessera_dataset_record_at(const struct tessera_dataset_records *r, uint64_t u, uint32_t *shard,
                              uint64_t *index);

/*
 * Uploads a whole shard from memory and seals it: chunks are pipelined (no copy of buf),
 * each acknowledged once durable; then SHARD_SEAL with the whole-shard CRC32C. records is an
 * optional record index (ascending byte offsets), nrecords 0 for none.
 */
int tessera_put(tessera_client *c, const char *name, uint32_t shard, const void *buf, size_t len,
                const uint64_t *records, uint32_t nrecords);
/* Same, reading the shard from fd until EOF (size TS_SIZE_UNKNOWN) or for size bytes. */
int tessera_put_fd(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size);

/*
 * Reads [off, off+len) of a complete shard into buf (the bytes land in buf; no staging copy).
 * *out_len is the number of bytes read: less than len when the range runs past the end.
 * Ranges larger than one request allows are split and pipelined.
 */
int tessera_read(tessera_client *c, const char *name, uint32_t shard, uint64_t off, size_t len,
                 void *buf, size_t *out_len);

/*
 * Asynchronous reads: submit many, then wait. *op identifies the read on this handle.
 * len must be at most TESSERA_MAX_READ. buf must stay valid until the read completes.
 */
#define TESSERA_MAX_READ (64u << 20)
int tessera_read_submit(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *buf, uint64_t *op);
/* Waits for read op; returns its status, *out_len its length. */
int tessera_wait(tessera_client *c, uint64_t op, size_t *out_len);
/* Waits for whichever submitted read completes first. TS_ENOENT if none is in flight. */
int tessera_wait_any(tessera_client *c, uint64_t *op, size_t *out_len);

/* ---- maintenance -------------------------------------------------------------------------- */

/* Scrubs one dataset (or all with name NULL); corrupt chunks are reported through cb. */
int tessera_scrub(tessera_client *c, const char *name, struct ts_scrub_report *rep,
                  void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk,
                             int rc),
                  void *arg);
/* The server's status as a JSON document; *json is malloc'ed. */
int tessera_status(tessera_client *c, char **json);

/* ---- cluster administration (admin role) ------------------------------------------------ */

/*
 * Pushes the cluster map in the map file at path (format: conf/cluster5.map) to every node
 * it lists: the epoch becomes one more than the highest of the file's epoch and the epochs
 * that the reachable nodes of the file report, and is written back into the file before the
 * push. *new_epoch is that epoch (also on failure, once the file was written). 0 when every
 * node that is up in the map accepted it; otherwise the first failure, with every node that
 * failed named in tessera_client_error().
 */
int tessera_map_push_file(tessera_client *c, const char *path, uint64_t *new_epoch);
/*
 * Fails over placement group pg: takes the newest map the nodes have, marks the PG's current
 * primary down (its next core replica becomes primary), bumps the epoch and pushes that map
 * to every other node that is up. The map file is not changed: edit it before the next
 * tessera_map_push_file. 0 when every node pushed to accepted; TS_EINVAL on a single node.
 */
int tessera_failover(tessera_client *c, uint32_t pg, uint64_t *new_epoch);

/* ---- for language bindings -------------------------------------------------------------- */

/* Releases memory the library returned to the caller (lists, status documents, record
 * offsets, kept reader units): free() of the library's own C library. NULL ok. */
void tessera_buffer_free(void *data);
/* sizeof a public struct named without its "struct " ("tessera_opts", "ts_shard_info", ...),
 * so that a binding that mirrors the structs (Python's ctypes) can check its layout; 0 for a
 * name it does not know. */
size_t tessera_abi_size(const char *type);

#ifdef __cplusplus
}
#endif
#endif
