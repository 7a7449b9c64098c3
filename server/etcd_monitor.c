/*
 * The cluster's monitor (the `monitor` setting, with `etcd`; docs/operations.md "The control
 * plane on etcd"): every node may stand, one is elected, and that one turns the nodes'
 * registrations into map changes with the policy of control/policy.c.
 *
 * Election: the key PREFIX/monitor, created only if absent, bound to this thread's own lease
 * (kept alive every third of etcd_lease_ttl_s): the node that created it is the monitor while
 * its lease lives; when it dies the key goes with the lease and the next node to try takes it.
 * The monitor checks each round that the key is still its own before it changes anything.
 *
 * A round (every ROUND_MS): list PREFIX/nodes/ (who is registered), observe every node of the
 * map (a registered node counts as caught up: a node registers once it runs, and peering keeps a
 * returning node out of its PGs' acting sets until it has caught up), and store the policy's
 * next map by compare-and-swap (built again on a map that changed meanwhile). A new monitor
 * knows nothing of the past: it waits down_after from its own first look before it marks a node
 * down. A node without a lease is probed (a TCP connection to its address): one that answers is
 * still a live copy for the policy's min_core guard, fed the datasets' widest core and largest
 * min_core each round.
 */
#include "server_internal.h"

#include "etcd.h"
#include "mapstore.h"
#include "policy.h"

#include <fcntl.h>
#include <json-c/json.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#undef FAC
#define FAC "monitor"
#define ROUND_MS 500

struct tsd_monitor {
    pthread_t thread;
    _Atomic int stop;
    struct ts_policy pol;
    struct ts_policy_cfg cfg;
    int64_t lease;
    uint64_t kept_ns;
    pthread_mutex_t mu; /* guards what STATUS reads: */
    int leader;
    uint64_t changes;
    char last[480];
    struct held_back { /* nodes kept from coming up by their tiers: the last reason logged */
        char id[64], why[512];
    } held[32];
};

struct round {
    struct tsd_monitor *x;
    uint64_t now_ms;
};

static int policy_change(void *arg, const struct ts_map *cur, struct ts_map **next, char *why,
                         size_t cap)
{
    struct round *r = arg;
    int rc = ts_policy_decide(&r->x->pol, cur, &r->x->cfg, r->now_ms, next, why, cap);

    return !rc && !*next ? TS_ENOENT : rc; /* TS_ENOENT: nothing to change */
}

/* What the datasets ask of a PG: the widest core, the largest min_core (the min_core guard). */
static int needs_cb(void *arg, const struct ts_dataset_info *d)
{
    struct ts_policy_cfg *c = arg;

    if (d->policy.core > c->core)
        c->core = d->policy.core;
    if (d->policy.min_core > c->min_core)
        c->min_core = d->policy.min_core;
    return 0;
}

/* Whether host:port accepts a TCP connection within 300 ms (a node without a lease that still
 * answers its peers: cut off from etcd alone). */
static int answers(const char *hostport)
{
    char host[256], *colon;
    struct addrinfo hints = {0}, *ai = NULL;
    struct pollfd pfd;
    int fd, ok = 0, err = 0;
    socklen_t len = sizeof(err);

    snprintf(host, sizeof(host), "%s", hostport);
    colon = strrchr(host, ':');
    if (!colon)
        return 0;
    *colon = '\0';
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return 0;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            ok = 1;
        } else {
            pfd.fd = fd;
            pfd.events = POLLOUT;
            ok = poll(&pfd, 1, 300) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                 err == 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return ok;
}

/* This thread's lease: granted when there is none (or it expired), else kept alive. */
static int keep_lease(struct tsd_server *s, struct tsd_monitor *x, ts_etcd *e)
{
    uint64_t now = ts_now_mono_ns();
    int64_t ttl = s->cfg->etcd_lease_ttl_s, left;

    if (x->lease && now - x->kept_ns < (uint64_t)ttl * 1000000000ull / 3)
        return 0;
    if (x->lease && ts_etcd_lease_keepalive(e, x->lease, &left) == 0) {
        x->kept_ns = now;
        return 0;
    }
    x->lease = 0;
    if (ts_etcd_lease_grant(e, ttl, &x->lease) != 0)
        return TS_EUNAVAIL;
    x->kept_ns = now;
    return 0;
}

/* Whether this node holds the election key (taking it when nobody does). */
static int elected(struct tsd_server *s, struct tsd_monitor *x, ts_etcd *e)
{
    char key[600];
    struct ts_etcd_kv kv;
    int rc, mine;

    snprintf(key, sizeof(key), "%s/monitor", s->cfg->etcd_prefix);
    rc = ts_etcd_cas(e, key, 0, s->cfg->node_id, strlen(s->cfg->node_id), x->lease, NULL, &kv);
    if (rc == 0)
        return 1;
    mine = rc == TS_ESTALE && kv.lease == x->lease && kv.len == strlen(s->cfg->node_id) &&
           !memcmp(kv.value, s->cfg->node_id, kv.len);
    ts_etcd_kv_free(&kv);
    return mine;
}

static void held_forget(struct tsd_monitor *x, const char *id)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(x->held); i++)
        if (!strcmp(x->held[i].id, id))
            memset(&x->held[i], 0, sizeof(x->held[i]));
}

/* tsd_monitor_tier_agrees for node id registered at key, its reason logged once per change. */
static int tier_agrees(struct tsd_server *s, struct tsd_monitor *x, ts_etcd *e, const char *key,
                       const char *id)
{
    char why[512];
    int ok = tsd_monitor_tier_agrees(s, e, key, why, sizeof(why));
    struct held_back *h = NULL;

    for (size_t i = 0; i < TS_ARRAY_SIZE(x->held) && !h; i++)
        if (!strcmp(x->held[i].id, id))
            h = &x->held[i];
    if (ok) {
        if (h) {
            TS_INFO(FAC, "node %s: its tiers agree with the cluster's now: it may come up", id);
            memset(h, 0, sizeof(*h));
        }
        return 1;
    }
    for (size_t i = 0; i < TS_ARRAY_SIZE(x->held) && !h; i++)
        if (!x->held[i].id[0])
            h = &x->held[i];
    if (!h || strcmp(h->why, why)) {
        TS_WARN(FAC, TS_EBUSY, "node %s stays where it is: %s", id, why);
        if (h) {
            snprintf(h->id, sizeof(h->id), "%s", id);
            snprintf(h->why, sizeof(h->why), "%s", why);
        }
    }
    return 0;
}

static void monitor_round(struct tsd_server *s, struct tsd_monitor *x, ts_etcd *e)
{
    struct round r = {x, ts_now_mono_ns() / 1000000};
    struct ts_map *m = NULL;
    char prefix[600], why[400];
    char **keys = NULL;
    size_t nkeys = 0;
    uint64_t epoch = 0;
    int leader = keep_lease(s, x, e) == 0 && elected(s, x, e), rc;

    pthread_mutex_lock(&x->mu);
    if (leader != x->leader)
        TS_INFO(FAC, "%s the cluster's monitor", leader ? "this node is now" : "no longer");
    x->leader = leader;
    pthread_mutex_unlock(&x->mu);
    if (!leader)
        return;
    snprintf(prefix, sizeof(prefix), "%s/nodes/", s->cfg->etcd_prefix);
    if (ts_etcd_list(e, prefix, &keys, &nkeys) != 0 ||
        ts_mapstore_get(e, s->cfg->etcd_prefix, &m, NULL) != 0)
        goto out;
    for (size_t i = 0; i < m->n; i++) {
        int reg = 0, back;
        size_t k;
        for (k = 0; k < nkeys && !reg; k++)
            reg = !strcmp(keys[k] + strlen(prefix), m->nodes[i].id);
        /* Registered counts as caught up (peering does the rest); a node the policy put out,
         * which it may bring back, not while it holds a dataset dropped that this node holds
         * otherwise (etcd_monitor_tier.c). */
        back = reg;
        if (reg && m->nodes[i].state == TS_NODE_OUT && ts_policy_auto_out(&x->pol, m->nodes[i].id))
            back = tier_agrees(s, x, e, keys[k - 1], m->nodes[i].id);
        else
            held_forget(x, m->nodes[i].id); /* up, gone, or an operator's: not held by tiers */
        ts_policy_observe(&x->pol, m->nodes[i].id, reg, back, r.now_ms);
        /* A node without a lease that still answers its peers holds a live copy: the min_core
         * guard keeps it up while the PGs need it. */
        if (!reg && m->nodes[i].state == TS_NODE_UP)
            ts_policy_reachable(
                &x->pol, m->nodes[i].id,
                answers(m->nodes[i].tls_addr[0] ? m->nodes[i].tls_addr : m->nodes[i].addr));
    }
    x->cfg.core = x->cfg.min_core = 0;
    ts_store_dataset_list(s->store, needs_cb, &x->cfg);
    rc = ts_mapstore_change(e, s->cfg->etcd_prefix, policy_change, &r, 3, &epoch, why, sizeof(why));
    if (!rc) {
        TS_INFO(FAC, "map epoch %llu: %s", (unsigned long long)epoch, why);
        pthread_mutex_lock(&x->mu);
        x->changes++;
        snprintf(x->last, sizeof(x->last), "epoch %llu: %s", (unsigned long long)epoch, why);
        pthread_mutex_unlock(&x->mu);
    } else if (rc != TS_ENOENT && why[0]) {
        TS_WARN(FAC, rc, "no map change made: %s", why);
    }
out:
    for (size_t k = 0; k < nkeys; k++)
        free(keys[k]);
    free(keys);
    ts_map_free(m);
}

static void *monitor_main(void *arg)
{
    struct tsd_server *s = arg;
    struct tsd_monitor *x = s->monitor;
    ts_etcd *e = NULL;

    if (tsd_etcd_open(s, &e) != 0)
        return NULL;
    while (!atomic_load(&x->stop)) {
        monitor_round(s, x, e);
        for (int t = 0; t < ROUND_MS / 50 && !atomic_load(&x->stop); t++)
            usleep(50 * 1000);
    }
    if (x->lease) /* a clean stop: the election key goes at once */
        ts_etcd_lease_revoke(e, x->lease);
    ts_etcd_close(e);
    return NULL;
}

int tsd_monitor_start(struct tsd_server *s)
{
    struct tsd_monitor *x;

    if (!s->cfg->etcd[0] || !s->cfg->monitor)
        return 0;
    x = calloc(1, sizeof(*x));
    if (!x)
        return TS_ENOMEM;
    ts_policy_init(&x->pol);
    ts_policy_cfg_defaults(&x->cfg);
    x->cfg.down_after_ms = (uint64_t)s->cfg->monitor_down_after_ms;
    x->cfg.up_after_ms = (uint64_t)s->cfg->monitor_up_after_ms;
    x->cfg.out_after_ms = (uint64_t)s->cfg->monitor_out_after_ms;
    x->cfg.max_down_pct = (unsigned)s->cfg->monitor_max_down_pct;
    x->cfg.flap_max = (unsigned)s->cfg->monitor_flap_max;
    x->cfg.flap_window_ms = (uint64_t)s->cfg->monitor_flap_window_ms;
    x->cfg.damp_ms = (uint64_t)s->cfg->monitor_damp_ms;
    pthread_mutex_init(&x->mu, NULL);
    s->monitor = x;
    if (pthread_create(&x->thread, NULL, monitor_main, s) != 0) {
        s->monitor = NULL;
        ts_policy_fini(&x->pol);
        free(x);
        return TS_ENOMEM;
    }
    return 0;
}

void tsd_monitor_stop(struct tsd_server *s)
{
    struct tsd_monitor *x = s->monitor;

    if (!x)
        return;
    atomic_store(&x->stop, 1);
    pthread_join(x->thread, NULL);
    pthread_mutex_destroy(&x->mu);
    ts_policy_fini(&x->pol);
    free(x);
    s->monitor = NULL;
}

void tsd_monitor_status(struct tsd_server *s, struct json_object *root)
{
    struct tsd_monitor *x = s->monitor;
    struct json_object *o;

    if (!x)
        return;
    o = json_object_new_object();
    pthread_mutex_lock(&x->mu);
    json_object_object_add(o, "leader", json_object_new_boolean(x->leader));
    json_object_object_add(o, "map_changes", json_object_new_int64((int64_t)x->changes));
    json_object_object_add(o, "last", x->last[0] ? json_object_new_string(x->last) : NULL);
    pthread_mutex_unlock(&x->mu);
    json_object_object_add(root, "monitor", o);
}
