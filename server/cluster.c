/* tesserad in a cluster: the map (file, persistence, pushes), fencing by epoch, placement. */
#include "server_internal.h"

#include <errno.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void persisted_path(const struct tsd_server *s, char *out, size_t cap)
{
    snprintf(out, cap, "%s/cluster.map", s->cfg->data_dir);
}

/*
 * PGs this node joined the replicas of (a map change) and holds none of the shards of yet:
 * not served here and not to be told clean until the primary's backfill is done. Kept in
 * data_dir/pg-backfill (one PG per line) so that a restart does not forget them.
 */
static void backfill_path(const struct tsd_server *s, char *out, size_t cap)
{
    snprintf(out, cap, "%s/pg-backfill", s->cfg->data_dir);
}

static void backfill_save(struct tsd_server *s)
{
    char path[600], tmp[640];
    FILE *f;
    int ok;

    backfill_path(s, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) {
        TS_ERROR(FAC, TS_EIO, "cannot write %s", tmp);
        return;
    }
    for (uint32_t pg = 0; pg < s->npg; pg++)
        if (atomic_load(&s->pg_backfill[pg]))
            fprintf(f, "%u\n", pg);
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0)
        TS_ERROR(FAC, TS_EIO, "cannot write %s", path);
}

static void backfill_load(struct tsd_server *s)
{
    char path[600];
    unsigned pg;
    FILE *f;

    backfill_path(s, path, sizeof(path));
    f = fopen(path, "r");
    if (!f)
        return;
    while (fscanf(f, "%u", &pg) == 1)
        if (pg < s->npg) {
            atomic_store(&s->pg_backfill[pg], 1);
            TS_INFO(FAC, "PG %u: waits for a backfill here (from before the restart)", pg);
        }
    fclose(f);
}

/* The new map m moves this node into PGs' replicas whose shards it does not hold: mark them
 * (map_lock held for writing, s->map the old map). */
static void backfill_mark(struct tsd_server *s, const struct ts_map *m)
{
    struct ts_repl_widths w;
    int changed = 0;

    if (!s->map || !s->pg_backfill)
        return;
    ts_repl_widths(s->store, &w);
    for (uint32_t pg = 0; pg < s->npg; pg++) {
        if (!ts_repl_gains_data(s->map, m, pg, s->cfg->node_id, &w))
            continue;
        atomic_store(&s->pg_clean[pg], 0);
        if (!atomic_exchange(&s->pg_backfill[pg], 1))
            changed = 1;
        TS_INFO(FAC,
                "PG %u: this node joins its replicas at epoch %llu: not served here until "
                "its primary backfilled it",
                pg, (unsigned long long)m->epoch);
    }
    if (changed)
        backfill_save(s);
}

/* A split (map_lock held for writing): each child PG starts as its parent is here, clean or
 * waiting for a backfill (the child's shards are a part of the parent's). The old map places
 * every child as its parent (PG pg % its pg_count), so backfill_mark then compares like for
 * like. */
static void split_pgs(struct tsd_server *s, uint32_t count)
{
    uint32_t before = s->npg;

    for (uint32_t pg = before; pg < count; pg++) {
        atomic_store(&s->pg_clean[pg], atomic_load(&s->pg_clean[pg % before]));
        atomic_store(&s->pg_asked[pg], 0);
        atomic_store(&s->pg_backfill[pg], atomic_load(&s->pg_backfill[pg % before]));
    }
    s->npg = count;
    backfill_save(s);
    TS_INFO(FAC, "split: %u PGs become %u (PG p's children are p + k * %u)", before, count, before);
}

int tsd_pg_needs_backfill(struct tsd_server *s, uint32_t pg)
{
    return s->pg_backfill && pg < s->npg && atomic_load(&s->pg_backfill[pg]);
}

void tsd_pg_backfilled(struct tsd_server *s, uint32_t pg)
{
    if (!s->pg_backfill || pg >= s->npg || !atomic_exchange(&s->pg_backfill[pg], 0))
        return;
    TS_INFO(FAC, "PG %u: backfilled here", pg);
    pthread_rwlock_wrlock(&s->map_lock);
    backfill_save(s);
    pthread_rwlock_unlock(&s->map_lock);
}

static int needs_backfill_cb(void *arg, uint32_t pg)
{
    return tsd_pg_needs_backfill(arg, pg);
}

/* Runs on the replication thread when a peer has a newer map. */
static void adopt_map(void *arg, const struct ts_map *m)
{
    tsd_map_install(arg, m);
}

/* Whether this node can take part in map m: with other nodes, it needs its node certificate
 * and every other node a TLS address. 0, or TS_EINVAL with why. */
static int map_reachable(struct tsd_server *s, const struct ts_map *m, char *why, size_t cap)
{
    if (m->n < 2)
        return 0;
    if (!s->peer_ssl) {
        snprintf(why, cap, "%s", s->peer_why);
        return TS_EINVAL;
    }
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->nodes[i].id, s->cfg->node_id) && !m->nodes[i].tls_addr[0]) {
            snprintf(why, cap, "node %s has no tls_addr: node-to-node traffic goes over mutual TLS",
                     m->nodes[i].id);
            return TS_EINVAL;
        }
    return 0;
}

/* Whether two maps say the same (their wire forms are equal). */
static int same_map(const struct ts_map *a, const struct ts_map *b)
{
    struct ts_wr x, y;
    int same;

    ts_wr_init(&x);
    ts_wr_init(&y);
    ts_map_encode(&x, a);
    ts_map_encode(&y, b);
    same = !x.err && !y.err && x.len == y.len && memcmp(x.buf, y.buf, x.len) == 0;
    ts_wr_fini(&x);
    ts_wr_fini(&y);
    return same;
}

int tsd_map_install_why(struct tsd_server *s, const struct ts_map *m, char *why, size_t cap)
{
    struct ts_map *copy;
    char path[600];
    int self, rc;

    why[0] = '\0';
    if (!m || m->n == 0)
        return TS_EINVAL;
    self = ts_map_find(m, s->cfg->node_id);
    if (self < 0) {
        snprintf(why, cap, "the map (epoch %llu) does not list this node (%s)",
                 (unsigned long long)m->epoch, s->cfg->node_id);
        return TS_EINVAL;
    }
    rc = map_reachable(s, m, why, cap);
    if (rc)
        return rc;
    copy = ts_map_dup(m);
    if (!copy)
        return TS_ENOMEM;
    pthread_rwlock_wrlock(&s->map_lock);
    if (s->map && copy->epoch <= s->map->epoch) {
        rc = TS_ESTALE;
        if (copy->epoch == s->map->epoch && same_map(copy, s->map))
            rc = 0; /* the same map again (a retried push) */
        else if (copy->epoch == s->map->epoch)
            /* Two changes raced to the same epoch (two admins, two rebalance drivers): the
             * first one here stays; the other learns it lost and changes nothing here. */
            snprintf(why, cap,
                     "another map with epoch %llu is installed here: two changes raced (read "
                     "the map again and push: the change gets the next epoch)",
                     (unsigned long long)copy->epoch);
        goto out_unlock;
    }
    if (s->map && copy->pg_count != s->map->pg_count &&
        !ts_map_pg_count_splits(s->map->pg_count, copy->pg_count)) {
        snprintf(why, cap,
                 "pg_count %u is not a split of the cluster's %u (PGs only split: the count "
                 "doubles, and never shrinks)",
                 copy->pg_count, s->map->pg_count);
        rc = TS_EINVAL;
        goto out_unlock;
    }
    /* A split's children are marked (and saved) before the map that makes them is persisted:
     * a restart in between finds the old map and ignores them. */
    if (s->npg && copy->pg_count > s->npg)
        split_pgs(s, copy->pg_count);
    /* Installed only once persisted: a node never runs on a map it would not restart with. */
    persisted_path(s, path, sizeof(path));
    rc = ts_map_write_file(copy, path);
    if (rc) {
        snprintf(why, cap, "cannot persist it to %s: %s", path, ts_strerror(rc));
        goto out_unlock;
    }
    if (!s->pg_clean) {
        /* Nothing is served from a PG until its primary says this node holds its log (or this
         * node leads it). Room for the most PGs a split can make: workers read these without
         * the map lock, so they are never moved. */
        s->pg_clean = calloc(TS_MAP_MAX_PGS, sizeof(*s->pg_clean));
        s->pg_asked = calloc(TS_MAP_MAX_PGS, sizeof(*s->pg_asked));
        s->pg_backfill = calloc(TS_MAP_MAX_PGS, sizeof(*s->pg_backfill));
        s->npg = s->pg_clean && s->pg_asked && s->pg_backfill ? copy->pg_count : 0;
        if (s->npg)
            backfill_load(s);
    }
    backfill_mark(s, copy);
    ts_map_free(s->map);
    s->map = copy;
    copy = NULL;
    s->self = self;
    atomic_store(&s->epoch, s->map->epoch);
    if (s->repl)
        ts_repl_set_map(s->repl, s->map);
    TS_INFO(FAC, "map epoch %llu installed: %zu nodes, %u PGs; this node is %s (%s)",
            (unsigned long long)s->map->epoch, s->map->n, s->map->pg_count, s->cfg->node_id,
            ts_node_state_name(s->map->nodes[self].state));
out_unlock:
    pthread_rwlock_unlock(&s->map_lock);
    ts_map_free(copy);
    if (rc && why[0])
        TS_WARN(FAC, rc, "map epoch %llu refused: %s", (unsigned long long)m->epoch, why);
    return rc;
}

int tsd_map_install(struct tsd_server *s, const struct ts_map *m)
{
    char why[300];
    return tsd_map_install_why(s, m, why, sizeof(why));
}

/*
 * The client context towards peers' TLS listeners, with this node's certificate. Only a node
 * certificate for this node id (OU=node, CN and a DNS subjectAltName = node_id) and a CA to
 * verify peers with make one; without, s->peer_ssl stays NULL and s->peer_why says why (a map
 * with other nodes is then refused: node-to-node traffic is authenticated by certificates).
 */
static int peer_ssl_init(struct tsd_server *s)
{
    const struct tsd_config *c = s->cfg;
    SSL_CTX *ctx;

    if (!c->tls_cert[0] || !c->tls_key[0] || !c->tls_ca[0]) {
        snprintf(s->peer_why, sizeof(s->peer_why),
                 "this node has no node certificate: set tls.cert/tls.key (OU=node, CN=%s; "
                 "conf/mkcerts DIR %s makes one) and tls.ca",
                 c->node_id, c->node_id);
        return 0;
    }
    if (tsd_tls_node_cert_check(c->tls_cert, c->node_id, s->peer_why, sizeof(s->peer_why)))
        return 0;
    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return TS_ETLS;
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    if (SSL_CTX_use_certificate_chain_file(ctx, c->tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, c->tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_load_verify_locations(ctx, c->tls_ca, NULL) != 1) {
        TS_ERROR(FAC, TS_ETLS, "cannot set up TLS towards peers (node certificate %s)",
                 c->tls_cert);
        SSL_CTX_free(ctx);
        ERR_clear_error();
        return TS_ETLS;
    }
    /* Each connection also checks the peer's name against its node id (repl.c). */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    s->peer_ssl = ctx;
    return 0;
}

int tsd_cluster_init(struct tsd_server *s)
{
    struct ts_map *from_file = NULL, *persisted = NULL, *use;
    struct ts_repl_opts ro;
    char path[600], err[512];
    struct stat st;
    int rc;

    pthread_rwlock_init(&s->map_lock, NULL);
    s->self = -1;
    if (s->cfg->map_file[0]) {
        rc = ts_map_parse_file(s->cfg->map_file, &from_file, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "tesserad: map_file: %s\n", err);
            return rc;
        }
    }
    persisted_path(s, path, sizeof(path));
    if (stat(path, &st) == 0) {
        rc = ts_map_parse_file(path, &persisted, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "tesserad: %s: %s\n", path, err);
            ts_map_free(from_file);
            return rc;
        }
    }
    use = from_file;
    if (persisted && (!use || persisted->epoch > use->epoch))
        use = persisted;
    rc = peer_ssl_init(s);
    if (rc)
        goto out_free;
    if (use) {
        if (ts_map_find(use, s->cfg->node_id) < 0) {
            fprintf(stderr, "tesserad: node_id '%s' is not in the cluster map (epoch %llu)\n",
                    s->cfg->node_id, (unsigned long long)use->epoch);
            rc = TS_ECONFIG;
            goto out_free;
        }
        rc = tsd_map_install_why(s, use, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "tesserad: cannot take part in the cluster map (epoch %llu): %s\n",
                    (unsigned long long)use->epoch, err[0] ? err : ts_strerror(rc));
            rc = TS_ECONFIG;
            goto out_free;
        }
    }
    memset(&ro, 0, sizeof(ro));
    ro.store = s->store;
    ro.node_id = s->cfg->node_id;
    ro.peer_timeout_ms = s->cfg->peer_timeout_ms;
    ro.log_keep = (uint64_t)s->cfg->pg_log_keep;
    ro.ssl = s->peer_ssl;
    ro.adopt_map = adopt_map;
    ro.needs_backfill = needs_backfill_cb;
    ro.no_map_push = s->cfg->etcd[0] != '\0';
    ro.arg = s;
    pthread_rwlock_rdlock(&s->map_lock);
    rc = ts_repl_start(&s->repl, &ro, s->map);
    pthread_rwlock_unlock(&s->map_lock);
out_free:
    ts_map_free(from_file);
    ts_map_free(persisted);
    return rc;
}

void tsd_cluster_fini(struct tsd_server *s)
{
    ts_repl_stop(s->repl);
    s->repl = NULL;
    ts_map_free(s->map);
    s->map = NULL;
    free((void *)s->pg_clean);
    free((void *)s->pg_asked);
    free((void *)s->pg_backfill);
    SSL_CTX_free(s->peer_ssl);
    pthread_rwlock_destroy(&s->map_lock);
}

static int width_cb(void *arg, const struct ts_dataset_info *d)
{
    unsigned *w = arg;
    if ((unsigned)d->policy.core + d->policy.fringe > *w)
        *w = (unsigned)d->policy.core + d->policy.fringe;
    return 0;
}

/* By placement, for the widest dataset policy and the map's hot datasets. */
uint64_t tsd_pgs_not_confirmed(struct tsd_server *s)
{
    unsigned width = 0;
    uint64_t unclean = 0;

    ts_store_dataset_list_records(s->store, width_cb, &width); /* policies only */
    pthread_rwlock_rdlock(&s->map_lock);
    for (uint32_t pg = 0; s->map && s->pg_clean && pg < s->npg; pg++) {
        int order[TS_REPL_MAX_REPLICAS];
        size_t no = ts_map_pg_order(s->map, pg, order, TS_REPL_MAX_REPLICAS);
        size_t w = width + ts_map_hot_extra_max(s->map, pg); /* hot datasets' extras */
        for (size_t k = 1; k < no && k < w; k++)
            if (order[k] == s->self && !atomic_load(&s->pg_clean[pg]))
                unclean++;
    }
    pthread_rwlock_unlock(&s->map_lock);
    return unclean;
}

uint32_t tsd_pg_of(struct tsd_server *s, const char *dataset, uint32_t shard)
{
    uint32_t pg = 0;

    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map)
        pg = ts_map_pg_of(s->map, dataset, shard);
    pthread_rwlock_unlock(&s->map_lock);
    return pg;
}

int tsd_ec_position_here(struct tsd_server *s, const char *base, uint32_t shard, unsigned f,
                         unsigned n)
{
    int ord[TS_FRAG_MAX], here = 0;

    if (f >= n || n > TS_FRAG_MAX)
        return 0;
    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map && ts_map_ec_order(s->map, ts_map_pg_of(s->map, base, shard), ord, n) == n)
        here = ord[f] == s->self;
    pthread_rwlock_unlock(&s->map_lock);
    return here;
}

int tsd_primary_check(struct tsd_server *s, const char *dataset, uint32_t shard,
                      const struct ts_dataset_policy *p, struct tsd_placement *pl, char *why,
                      size_t cap)
{
    int order[TS_REPL_MAX_REPLICAS];
    struct ts_pg_state st;
    char state[400];
    uint8_t wq = 0;
    size_t n;
    int rc;

    memset(pl, 0, sizeof(*pl));
    pl->need = p && p->min_core ? p->min_core : 1;
    why[0] = '\0';
    pthread_rwlock_rdlock(&s->map_lock);
    if (!s->map) {
        pthread_rwlock_unlock(&s->map_lock);
        return 0;
    }
    pl->pg = ts_map_pg_of(s->map, dataset, shard);
    n = ts_map_pg_order(s->map, pl->pg, order, TS_REPL_MAX_REPLICAS);
    if (n == 0 || order[0] != s->self) {
        snprintf(why, cap, "%s/%u is in PG %u, whose primary in epoch %llu is %s, not %s", dataset,
                 shard, pl->pg, (unsigned long long)s->map->epoch,
                 n ? s->map->nodes[order[0]].id : "none", s->cfg->node_id);
        pthread_rwlock_unlock(&s->map_lock);
        return TS_ESTALE;
    }
    for (size_t i = 1; i < n && i < (p ? p->core : 1); i++)
        snprintf(pl->to.id[pl->to.n++], sizeof(pl->to.id[0]), "%s", s->map->nodes[order[i]].id);
    pthread_rwlock_unlock(&s->map_lock);
    /* Placement names the primary; peering decides when it may take writes: once it holds
     * every acknowledged entry of the PG and has started its interval. */
    if (ts_repl_pg_ready(s->repl, pl->pg, &pl->epoch, &wq, state, sizeof(state)) != 0) {
        snprintf(why, cap, "%s/%u: PG %u is not ready for writes on %s (%s); retry", dataset, shard,
                 pl->pg, s->cfg->node_id, state);
        return TS_EBUSY;
    }
    /* A newer primary's peering reached this node: it must not acknowledge anything more. */
    rc = ts_store_pg_state(s->store, pl->pg, &st);
    if (rc == 0 && st.promised > pl->epoch) {
        snprintf(why, cap,
                 "%s/%u: PG %u has a newer primary (epoch %llu was promised here; this node "
                 "leads epoch %llu)",
                 dataset, shard, pl->pg, (unsigned long long)st.promised,
                 (unsigned long long)pl->epoch);
        return TS_ESTALE;
    }
    /* Writes need the interval's write quorum too (peering relies on it), except where the
     * dataset has fewer core replicas than that (core 1: no failover guarantee to keep). */
    if (p && wq > p->core)
        wq = p->core;
    if (wq > pl->need)
        pl->need = wq;
    return 0;
}

/* ---- which PGs this node may serve reads of ------------------------------------------------ */

int tsd_pg_mark_clean(struct tsd_server *s, uint32_t pg, int clean)
{
    if (s->pg_clean && pg < s->npg)
        atomic_store(&s->pg_clean[pg], (uint8_t)(clean ? 1 : 0));
    return 0;
}

int tsd_pg_serves(struct tsd_server *s, const char *dataset, uint32_t shard)
{
    uint32_t pg = tsd_pg_of(s, dataset, shard);
    uint64_t now, last;

    if (ts_frag_split(dataset, NULL, NULL))
        return 1; /* a fragment (issue 33): served where it is, by no PG's peering */
    if (!s->pg_clean || pg >= s->npg || atomic_load(&s->pg_clean[pg]))
        return 1;
    if (ts_repl_pg_ready(s->repl, pg, NULL, NULL, NULL, 0) == 0)
        return 1; /* its activated primary */
    /* Ask the PG's primary to compare our log (at most every 500 ms per PG). */
    now = ts_now_mono_ns();
    last = atomic_load(&s->pg_asked[pg]);
    if (now - last > 500ull * 1000000 &&
        atomic_compare_exchange_strong(&s->pg_asked[pg], &last, now))
        ts_repl_ask_primary(s->repl, pg);
    return 0;
}
