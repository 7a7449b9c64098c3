/*
 * An etcd v3 client (control/etcd.c): etcd's JSON gateway (/v3/kv/range, put, txn, deleterange,
 * /v3/lease/grant, keepalive, revoke, /v3/watch) over HTTP/1.1 through libevent's HTTP client,
 * bodies with json-c, keys and values base64 as the gateway wants them. http:// endpoints, or
 * https:// with mutual TLS (OpenSSL: the client's certificate and key, the CA that signed etcd's).
 *
 * Calls are synchronous: each runs the handle's own event base until its reply, the timeout, or
 * a failure. A call that cannot reach an endpoint tries the next one (an etcd cluster answers on
 * any member). One handle per thread.
 *
 * Errors: TS_EUNAVAIL no endpoint answered (ts_etcd_error says who and why), TS_ETIMEDOUT no
 * answer within the timeout (e.g. the cluster lost its majority), TS_EPROTO a reply that is not
 * what etcd sends, TS_ENOENT no such key (or lease), TS_ESTALE a compare-and-swap that lost.
 */
#ifndef TS_ETCD_H
#define TS_ETCD_H

#include <stddef.h>
#include <stdint.h>

struct ts_etcd_opts {
    const char *endpoints;  /* "http://127.0.0.1:2379,http://...": members, tried in turn */
    const char *ca;         /* https: the CA that signed the members' certificates */
    const char *cert, *key; /* https: this client's certificate and key (mutual TLS) */
    int timeout_ms;         /* per call; 0: 3000 */
};

typedef struct ts_etcd ts_etcd;

/* One key's value and revisions. */
struct ts_etcd_kv {
    uint8_t *value; /* malloc'ed (NUL-terminated for convenience, not counted in len) */
    size_t len;
    int64_t create_rev, mod_rev, version, lease;
};

int ts_etcd_open(ts_etcd **out, const struct ts_etcd_opts *o);
void ts_etcd_close(ts_etcd *e);
/* The last failure in words (which member, what went wrong). */
const char *ts_etcd_error(const ts_etcd *e);
void ts_etcd_kv_free(struct ts_etcd_kv *kv);

/* The key's value: 0, or TS_ENOENT. *rev (optional): the store's revision at the read. */
int ts_etcd_get(ts_etcd *e, const char *key, struct ts_etcd_kv *kv, int64_t *rev);
/* Writes key = value (bound to lease unless 0); *rev (optional): the revision it made. */
int ts_etcd_put(ts_etcd *e, const char *key, const void *v, size_t len, int64_t lease,
                int64_t *rev);
/* Writes key = value only if the key's mod revision is still expect (0: only if the key does not
 * exist): one transaction. TS_ESTALE when another write came first (kv, when given, gets what
 * is there now: the winner). */
int ts_etcd_cas(ts_etcd *e, const char *key, int64_t expect, const void *v, size_t len,
                int64_t lease, int64_t *rev, struct ts_etcd_kv *now);
int ts_etcd_delete(ts_etcd *e, const char *key);
/* The keys that start with prefix (at most max), malloc'ed strings in keys[0..*n) (free each and
 * the array). */
int ts_etcd_list(ts_etcd *e, const char *prefix, char ***keys, size_t *n);

/* Leases: granted for ttl_s seconds; kept alive once per call (*ttl: what is left); TS_ENOENT
 * for a lease that expired or was revoked (its keys are gone). */
int ts_etcd_lease_grant(ts_etcd *e, int64_t ttl_s, int64_t *id);
int ts_etcd_lease_keepalive(ts_etcd *e, int64_t id, int64_t *ttl);
int ts_etcd_lease_revoke(ts_etcd *e, int64_t id);

/* Waits up to timeout_ms for the first change of key at revision from_rev or later: 0 with kv
 * (value NULL, len 0 and *deleted 1 for a delete), TS_ETIMEDOUT when none came. */
int ts_etcd_watch(ts_etcd *e, const char *key, int64_t from_rev, int timeout_ms,
                  struct ts_etcd_kv *kv, int *deleted);

#endif
