/*
 * The node in etcd (the `etcd` setting; docs/operations.md "The control plane on etcd"): its
 * registration, and the cluster map. The registration is the key PREFIX/nodes/ID (the node's
 * addresses, pid and map epoch, as JSON) bound to a lease of etcd_lease_ttl_s, kept alive every
 * third of it: while the node runs the key is there, and it goes TTL after the node stopped
 * answering (kill -9, a power cut, cut off from etcd): what a monitor watches. A lease that
 * expired (etcd unreachable for longer) is granted again. A clean stop revokes it at once.
 * The map: a thread that installs the map etcd holds and follows every change of it. At start,
 * when etcd holds no map yet, the node's own (from map_file) is offered as the first one (created
 * only if absent: the first node to get there wins, the others install its map). Each round reads
 * the key, installs a newer map through tsd_map_install_why (persisted first, as a pushed map
 * is), then watches the key for up to WATCH_MS; the round's read says whether etcd answers
 * (STATUS "etcd"). With etcd unreachable the node goes on under the map it has and changes
 * nothing.
 */
#include "server_internal.h"

#include "etcd.h"
#include "mapstore.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#undef FAC
#define FAC "etcd"
#define WATCH_MS 2000

struct tsd_etcd_map {
    pthread_t thread;
    _Atomic int stop;
    pthread_mutex_t mu; /* guards what STATUS reads: */
    int reachable;
    int64_t rev;      /* the map key's revision last seen */
    uint64_t epoch;   /* of the map etcd held then */
    char err[400];    /* the last failure, "" after a good read */
    int64_t lease;    /* the registration's lease (0: none held) */
    uint64_t kept_ns; /* when it was last kept alive */
    char *dropped;    /* the registration's "dropped" as last put (NULL: none yet) */
};

static void note(struct tsd_etcd_map *x, int reachable, int64_t rev, uint64_t epoch,
                 const char *err)
{
    pthread_mutex_lock(&x->mu);
    x->reachable = reachable;
    if (reachable) {
        x->rev = rev;
        x->epoch = epoch;
    }
    snprintf(x->err, sizeof(x->err), "%s", err ? err : "");
    pthread_mutex_unlock(&x->mu);
}

/* Offers this node's map as the cluster's first (when it has one). */
static void bootstrap(struct tsd_server *s, ts_etcd *e)
{
    struct ts_map *m = NULL;
    int rc;

    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map)
        m = ts_map_dup(s->map);
    pthread_rwlock_unlock(&s->map_lock);
    if (!m)
        return;
    rc = ts_mapstore_init(e, s->cfg->etcd_prefix, m);
    if (!rc)
        TS_INFO(FAC, "etcd held no map under %s: stored this node's (epoch %llu)",
                s->cfg->etcd_prefix, (unsigned long long)m->epoch);
    ts_map_free(m);
}

static int dropped_cb(void *arg, const struct ts_dataset_info *d)
{
    struct evbuffer *b = arg;

    if (d->policy.ec_dropped)
        evbuffer_add_printf(b, "%s\"%s:%u+%u:%llu\"", evbuffer_get_length(b) > 1 ? ", " : "",
                            d->name, d->policy.ec_k, d->policy.ec_m,
                            (unsigned long long)d->created_ns);
    return 0;
}

/* The datasets this node holds replicas of with their bytes dropped (erasure-coded, issue 33),
 * as a JSON array of "NAME:K+M:INCARNATION" (malloc'ed; NULL when out of memory): the monitor
 * brings a node back up only when the cluster holds them the same way (etcd_monitor_tier.c). */
static char *dropped_list(struct tsd_server *s)
{
    struct evbuffer *b = evbuffer_new();
    char *out = NULL;
    size_t n;

    if (!b)
        return NULL;
    evbuffer_add(b, "[", 1);
    ts_store_dataset_list_records(s->store, dropped_cb, b);
    evbuffer_add(b, "]", 1);
    n = evbuffer_get_length(b);
    if ((out = malloc(n + 1)) != NULL) {
        evbuffer_remove(b, out, n);
        out[n] = '\0';
    }
    evbuffer_free(b);
    return out;
}

/* The registration: granted (again) when there is none, else kept alive every third of the TTL;
 * written again (same lease) when the datasets it holds dropped change. */
static void register_tick(struct tsd_server *s, struct tsd_etcd_map *x, ts_etcd *e)
{
    int64_t ttl_s = s->cfg->etcd_lease_ttl_s, lease = x->lease, left = 0;
    uint64_t now = ts_now_mono_ns();
    char key[600], *val, *dropped = dropped_list(s);
    size_t cap;
    int rc, changed;

    if (!dropped)
        return; /* out of memory: the next round tries again */
    changed = !x->dropped || strcmp(dropped, x->dropped) != 0;
    if (lease && !changed && now - x->kept_ns < (uint64_t)ttl_s * 1000000000ull / 3) {
        free(dropped);
        return;
    }
    if (lease && (rc = ts_etcd_lease_keepalive(e, lease, &left)) != TS_ENOENT) {
        if (!rc)
            x->kept_ns = now;
        if (rc || !changed) {
            free(dropped);
            return; /* kept, or etcd does not answer: the next round tries again */
        }
    } else {
        if (ts_etcd_lease_grant(e, ttl_s, &lease) != 0) {
            free(dropped);
            return;
        }
        changed = 0; /* a new registration */
    }
    cap = strlen(dropped) + 1024;
    if (!(val = malloc(cap))) {
        if (lease != x->lease)
            ts_etcd_lease_revoke(e, lease);
        free(dropped);
        return;
    }
    snprintf(key, sizeof(key), "%s/nodes/%s", s->cfg->etcd_prefix, s->cfg->node_id);
    snprintf(val, cap,
             "{\"node\": \"%s\", \"addr\": \"%s\", \"tls_addr\": \"%s\", \"pid\": %d, "
             "\"epoch\": %llu, \"dropped\": %s}",
             s->cfg->node_id, s->addr[0], s->addr[1], (int)getpid(),
             (unsigned long long)atomic_load(&s->epoch), dropped);
    rc = ts_etcd_put(e, key, val, strlen(val), lease, NULL);
    free(val);
    if (rc && !changed)
        ts_etcd_lease_revoke(e, lease); /* a new lease with nothing on it */
    if (rc) {
        free(dropped);
        return;
    }
    free(x->dropped);
    x->dropped = dropped;
    if (changed) {
        TS_INFO(FAC, "registration: datasets held with their replicas' bytes dropped now %s",
                dropped);
        return;
    }
    if (x->lease)
        TS_WARN(FAC, TS_ENOENT, "registration lease %llx had expired: registered again",
                (unsigned long long)x->lease);
    TS_INFO(FAC, "registered as %s (lease %llx, %lld s)", key, (unsigned long long)lease,
            (long long)ttl_s);
    pthread_mutex_lock(&x->mu);
    x->lease = lease;
    pthread_mutex_unlock(&x->mu);
    x->kept_ns = now;
}

/* One round: read, install what is newer, wait for a change. */
static void round_once(struct tsd_server *s, struct tsd_etcd_map *x, ts_etcd *e)
{
    struct ts_map *m = NULL;
    struct ts_etcd_kv kv;
    char key[512], why[300];
    int64_t rev = 0;
    int rc = ts_mapstore_get(e, s->cfg->etcd_prefix, &m, &rev), deleted;

    if (rc == TS_ENOENT) {
        bootstrap(s, e);
        rc = ts_mapstore_get(e, s->cfg->etcd_prefix, &m, &rev);
    }
    if (rc != TS_ETIMEDOUT && rc != TS_EUNAVAIL)
        register_tick(s, x, e);
    if (rc) {
        char err[400];
        snprintf(err, sizeof(err), "%s", rc == TS_ENOENT ? "etcd holds no map" : ts_etcd_error(e));
        note(x, rc == TS_ENOENT || rc == TS_EPROTO, 0, 0, err);
        if (rc != TS_ENOENT)
            TS_WARN(FAC, rc, "cannot read the map from etcd: %s", err);
        sleep(1);
        return;
    }
    note(x, 1, rev, m->epoch, NULL);
    if (m->epoch > atomic_load(&s->epoch)) {
        rc = tsd_map_install_why(s, m, why, sizeof(why));
        if (!rc)
            TS_INFO(FAC, "installed the map etcd holds: epoch %llu (revision %lld)",
                    (unsigned long long)m->epoch, (long long)rev);
    }
    ts_map_free(m);
    rc = ts_etcd_watch(e, ts_mapstore_key(s->cfg->etcd_prefix, key, sizeof(key)), rev + 1,
                       TS_MIN(WATCH_MS, s->cfg->etcd_lease_ttl_s * 1000 / 3), &kv, &deleted);
    ts_etcd_kv_free(&kv);
    if (rc && rc != TS_ETIMEDOUT)
        sleep(1); /* the next round's read says why */
}

int tsd_etcd_open(struct tsd_server *s, ts_etcd **e)
{
    struct ts_etcd_opts o = {.endpoints = s->cfg->etcd, .timeout_ms = 3000};

    if (s->cfg->tls_ca[0])
        o.ca = s->cfg->tls_ca;
    if (s->cfg->tls_cert[0])
        o.cert = s->cfg->tls_cert, o.key = s->cfg->tls_key;
    return ts_etcd_open(e, &o);
}

static void *etcd_map_main(void *arg)
{
    struct tsd_server *s = arg;
    struct tsd_etcd_map *x = s->etcd_map;
    ts_etcd *e = NULL;
    int rc = tsd_etcd_open(s, &e);

    if (rc) {
        note(x, 0, 0, 0, "cannot use the etcd setting (members, TLS files)");
        TS_WARN(FAC, rc, "etcd %s: cannot open a client", s->cfg->etcd);
        return NULL;
    }
    while (!atomic_load(&x->stop))
        round_once(s, x, e);
    if (x->lease) /* a clean stop: the registration goes at once */
        ts_etcd_lease_revoke(e, x->lease);
    ts_etcd_close(e);
    return NULL;
}

int tsd_etcd_map_start(struct tsd_server *s)
{
    struct tsd_etcd_map *x;

    if (!s->cfg->etcd[0])
        return 0;
    x = calloc(1, sizeof(*x));
    if (!x)
        return TS_ENOMEM;
    pthread_mutex_init(&x->mu, NULL);
    snprintf(x->err, sizeof(x->err), "not read yet");
    s->etcd_map = x;
    if (pthread_create(&x->thread, NULL, etcd_map_main, s) != 0) {
        s->etcd_map = NULL;
        free(x);
        return TS_ENOMEM;
    }
    return 0;
}

void tsd_etcd_map_stop(struct tsd_server *s)
{
    struct tsd_etcd_map *x = s->etcd_map;

    if (!x)
        return;
    atomic_store(&x->stop, 1);
    pthread_join(x->thread, NULL); /* at most one call's timeout */
    pthread_mutex_destroy(&x->mu);
    free(x->dropped);
    free(x);
    s->etcd_map = NULL;
}

void tsd_etcd_map_status(struct tsd_server *s, struct json_object *root)
{
    struct tsd_etcd_map *x = s->etcd_map;
    struct json_object *o;

    if (!x)
        return;
    o = json_object_new_object();
    pthread_mutex_lock(&x->mu);
    json_object_object_add(o, "endpoints", json_object_new_string(s->cfg->etcd));
    json_object_object_add(o, "prefix", json_object_new_string(s->cfg->etcd_prefix));
    json_object_object_add(o, "reachable", json_object_new_boolean(x->reachable));
    json_object_object_add(o, "map_epoch", json_object_new_int64((int64_t)x->epoch));
    json_object_object_add(o, "map_revision", json_object_new_int64(x->rev));
    json_object_object_add(o, "error", x->err[0] ? json_object_new_string(x->err) : NULL);
    json_object_object_add(o, "lease", json_object_new_int64(x->lease));
    json_object_object_add(o, "lease_ttl_s", json_object_new_int64(s->cfg->etcd_lease_ttl_s));
    pthread_mutex_unlock(&x->mu);
    json_object_object_add(root, "etcd", o);
}
