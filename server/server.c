/*
 * tesserad core: one acceptor (the main thread's event loop) hands connections to N workers,
 * each with its own event_base. Each connection is a small state machine:
 *   handshake (TLS only) -> serving (frames parsed and dispatched in order)
 *   -> streaming (a READ reply is produced as the peer drains it; input paused)
 *   -> closing (output flushed, then freed).
 */
#include "metrics_internal.h"
#include "prefetch.h"
#include "server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent_ssl.h>
#include <event2/thread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- workers ---------------------------------------------------------------------------- */

/*
 * Draining: connections keep being served; each is closed once it has been idle (no request
 * parsed, no stream, nothing queued) for a full tick. A request already on its way when the
 * signal came is thereby answered; a client that keeps sending is cut at drain_timeout_s.
 */
#define DRAIN_TICK_MS 50

static void worker_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_worker *w = arg;
    uint64_t now = ts_now_mono_ns();
    struct tsd_conn *c, *next;

    for (c = w->conns; c; c = next) {
        next = c->next;
        if (!c->rs && !c->parked && evbuffer_get_length(tsd_conn_out(c)) == 0 &&
            evbuffer_get_length(tsd_conn_in(c)) == 0 &&
            now - c->last_active_ns >= (uint64_t)DRAIN_TICK_MS * 1000000u)
            tsd_conn_free(c);
    }
    if (!w->conns)
        event_base_loopexit(w->base, NULL);
}

static void worker_drain(struct tsd_worker *w)
{
    struct timeval tick = {0, DRAIN_TICK_MS * 1000};
    uint64_t now = ts_now_mono_ns();

    w->draining = 1;
    for (struct tsd_conn *c = w->conns; c; c = c->next)
        c->last_active_ns = now;
    w->drain_tick = event_new(w->base, -1, EV_PERSIST, worker_drain_tick, w);
    if (w->drain_tick)
        evtimer_add(w->drain_tick, &tick);
}

/* Seals back from the store's group commit. */
static void worker_sealed_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_worker *w = arg;

    w->srv->ops->seals_durable(w);
}

static void worker_notify_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_worker *w = arg;
    struct tsd_pending *q, *next;

    pthread_mutex_lock(&w->lock);
    q = w->queue;
    w->queue = NULL;
    pthread_mutex_unlock(&w->lock);
    for (; q; q = next) {
        next = q->next;
        if (atomic_load(&w->srv->draining)) {
            evutil_closesocket(q->fd);
            atomic_fetch_sub(&w->srv->nconns, 1);
        } else {
            tsd_conn_start(w, q);
        }
        free(q);
    }
    if (atomic_load(&w->srv->draining) && !w->draining)
        worker_drain(w);
}

/*
 * Once a second: close connections that neither sent a request nor drained output for
 * idle_timeout_s (one timer per worker instead of re-arming timers on every read and write).
 */
static void worker_idle_sweep(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_worker *w = arg;
    uint64_t limit = (uint64_t)w->srv->cfg->idle_timeout_s * 1000000000ull;
    uint64_t now = ts_now_mono_ns();
    struct tsd_conn *c, *next;

    /* Uploads that have not moved for a minute (or idle_timeout_s, if shorter) are ended: their
     * sender is gone (a primary's client vanished, a replica was never told). */
    uint64_t upload_limit = TS_MIN(limit, 60ull * 1000000000);

    for (c = w->conns; c; c = next) {
        next = c->next;
        if (c->nuploads && now > upload_limit)
            w->srv->ops->uploads_expire(c, now - upload_limit);
        if (!c->ready && now - c->last_active_ns >
                             (uint64_t)w->srv->cfg->tls_handshake_timeout_s * 1000000000ull) {
            /* A TLS handshake that does not finish must not hold a connection slot. */
            TS_INFO(FAC, "connection %s did not finish its TLS handshake in %d s: closing", c->peer,
                    w->srv->cfg->tls_handshake_timeout_s);
            tsd_conn_free(c);
            continue;
        }
        if (!c->parked && now - c->last_active_ns > limit) {
            TS_INFO(FAC, "connection %s idle for %d s: closing", c->peer,
                    w->srv->cfg->idle_timeout_s);
            tsd_conn_free(c);
        }
    }
}

static void *worker_main(void *arg)
{
    struct tsd_worker *w = arg;

    event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
    /* Drain timeout or all closed: free what is left. */
    w->draining = 0;
    while (w->conns)
        tsd_conn_free(w->conns);
    if (w->drain_tick)
        event_free(w->drain_tick);
    atomic_store(&w->done, 1);
    return NULL;
}

/* ---- acceptor --------------------------------------------------------------------------- */

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int slen,
                      void *arg)
{
    struct tsd_server *s = arg;
    int tls = l == s->lis[1];
    struct tsd_pending *p;
    struct tsd_worker *w;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0, evict = 0;

    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    if (atomic_load(&s->nconns) >= s->cfg->max_connections) {
        /* Full. While some connections are still in their TLS handshake, the worker closes the
         * oldest of them for this one (tsd_conn_start); else it is refused. */
        evict = atomic_load(&s->nhandshakes) > 0;
        if (!evict) {
            TS_WARN(FAC, TS_EBUSY, "refusing %s:%d: %d connections open (max_connections)", host,
                    port, s->cfg->max_connections);
            STAT_ADD(&s->workers[0].stats, conns_refused, 1);
            evutil_closesocket(fd);
            return;
        }
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        evutil_closesocket(fd);
        return;
    }
    p->fd = fd;
    p->tls = tls;
    p->evict = evict;
    snprintf(p->peer, sizeof(p->peer), "%s:%d", host, port);
    atomic_fetch_add(&s->nconns, 1);
    w = &s->workers[s->next_worker++ % (unsigned)s->nworkers];
    pthread_mutex_lock(&w->lock);
    p->next = w->queue;
    w->queue = p;
    pthread_mutex_unlock(&w->lock);
    event_active(w->notify, EV_READ, 0);
}

static void listener_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct evconnlistener *l = arg;
    evconnlistener_enable(l);
}

/*
 * accept() failed. Out of descriptors (or memory), the pending connection stays queued and
 * the listener would fire again at once: pause it for a moment instead of spinning, and log
 * at most once a second.
 */
static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    struct tsd_server *s = arg;
    int err = EVUTIL_SOCKET_ERROR(), which = l == s->lis[1];
    uint64_t now = ts_now_mono_ns();

    if (now - s->last_accept_warn_ns > 1000000000ull) {
        s->last_accept_warn_ns = now;
        TS_WARN(FAC, ts_from_errno(err), "accept: %s%s", evutil_socket_error_to_string(err),
                err == EMFILE || err == ENFILE ? " (out of file descriptors: pausing accepts)"
                                               : "");
    }
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        struct timeval tv = {0, 100000};
        evconnlistener_disable(l);
        if (!s->lis_resume[which])
            s->lis_resume[which] = evtimer_new(s->base, listener_resume_cb, l);
        if (s->lis_resume[which] && !atomic_load(&s->draining))
            evtimer_add(s->lis_resume[which], &tv);
    }
}

static int listen_on(struct tsd_server *s, int which, const char *addr)
{
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    socklen_t blen = sizeof(ss);
    evutil_socket_t fd;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;

    memset(&ss, 0, sizeof(ss));
    if (ts_listen_addr_parse(addr, &ss, &sslen) != 0) {
        TS_ERROR(FAC, TS_ECONFIG, "cannot parse listen address '%s' (want HOST:PORT)", addr);
        return TS_ECONFIG;
    }
    s->lis[which] = evconnlistener_new_bind(
        s->base, accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, (struct sockaddr *)&ss, sslen);
    if (!s->lis[which]) {
        int err = errno;
        TS_ERROR(FAC, ts_from_errno(err), "cannot listen on %s: %s", addr, strerror(err));
        return ts_from_errno(err);
    }
    evconnlistener_set_error_cb(s->lis[which], accept_error_cb);
    fd = evconnlistener_get_fd(s->lis[which]);
    getsockname(fd, (struct sockaddr *)&ss, &blen);
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        snprintf(s->addr[which], sizeof(s->addr[which]), "%s:%d", host, port);
    } else {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
        port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        snprintf(s->addr[which], sizeof(s->addr[which]), "[%s]:%d", host, port);
    }
    return 0;
}

/* ---- signals and drain ------------------------------------------------------------------ */

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_server *s = arg;
    TS_WARN(FAC, TS_ETIMEDOUT, "drain timeout (%d s): closing the remaining connections",
            s->cfg->drain_timeout_s);
    for (int i = 0; i < s->nworkers; i++)
        event_base_loopbreak(s->workers[i].base);
    event_base_loopbreak(s->base);
}

static void drain_check_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_server *s = arg;
    for (int i = 0; i < s->nworkers; i++)
        if (!atomic_load(&s->workers[i].done))
            return;
    event_base_loopexit(s->base, NULL);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct tsd_server *s = arg;
    struct timeval tv = {s->cfg->drain_timeout_s, 0};
    struct timeval check = {0, 20000};

    if (atomic_exchange(&s->draining, 1)) {
        TS_WARN(FAC, 0, "second signal: exiting now");
        drain_timeout_cb(-1, 0, s);
        return;
    }
    TS_INFO(FAC, "signal %d: draining (no new connections; in-flight requests finish)", (int)sig);
    for (int i = 0; i < 2; i++)
        if (s->lis[i])
            evconnlistener_disable(s->lis[i]);
    for (int i = 0; i < s->nworkers; i++)
        event_active(s->workers[i].notify, EV_READ, 0);
    s->drain_timer = evtimer_new(s->base, drain_timeout_cb, s);
    evtimer_add(s->drain_timer, &tv);
    /* The acceptor loop ends once every worker's loop has ended. */
    s->drain_check = event_new(s->base, -1, EV_PERSIST, drain_check_cb, s);
    evtimer_add(s->drain_check, &check);
}

/* ---- lifecycle -------------------------------------------------------------------------- */

int tsd_server_init(struct tsd_server *s, struct tsd_config *cfg)
{
    struct ts_store_opts so;
    int rc;

    memset(s, 0, sizeof(*s));
    s->ops = tsd_ops_table(); /* the handlers, as the connection layer reaches them */
    s->cfg = cfg;
    s->start_ns = ts_now_mono_ns();
    tsd_ec_wanted_init(&s->ec_wanted);
    sem_init(&s->tier_slots, 0, TSD_TIER_SLOTS);
    s->anon_role = tsd_config_anon_role(cfg);
    TS_INFO(FAC, "clients without a certificate get role '%s' (anonymous_role %s%s)",
            ts_role_name(s->anon_role), cfg->anonymous_role,
            !strcmp(cfg->anonymous_role, "auto")
                ? (s->anon_role == TS_ROLE_ADMIN ? ": one node on loopback, the quickstart default"
                                                 : ": cluster node or reachable beyond loopback")
                : "");
    s->out_budget = (size_t)cfg->conn_output_kb << 10;
    s->in_budget = (size_t)cfg->input_budget_mb << 20;
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN);

    ts_store_opts_init(&so);
    so.path = cfg->data_dir;
    so.sync = ts_store_sync_parse(cfg->sync); /* checked by tsd_config_check */
    so.chunk_files = cfg->chunk_files;
    so.inline_max = (uint32_t)cfg->inline_max_kb << 10;
    so.blob_files = cfg->blob_files;
    so.verify_engine_checksums = cfg->verify_engine_checksums;
    so.block_cache_bytes = (uint64_t)cfg->block_cache_mb << 20;
    so.cache_bytes = (uint64_t)cfg->cache_mb << 20;
    if (cfg->reserve_mb >= 0)
        so.reserve_bytes = (uint64_t)cfg->reserve_mb << 20;
    so.cache_arena = cfg->cache_arena;
    so.max_open_files = cfg->max_open_files;
    so.max_chunk_size = (uint32_t)cfg->max_chunk_mb << 20;
    rc = ts_store_open(&s->store, &so);
    if (rc)
        return rc;
    /* Read-ahead of hinted chunks: at most a quarter of the cache queued. */
    rc = tsd_prefetch_start(&s->prefetch, s->store,
                            TS_MIN((uint64_t)cfg->prefetch_mb, (uint64_t)cfg->cache_mb / 4) << 20,
                            (uint64_t)cfg->prefetch_conn_mb << 20);
    if (rc)
        goto out_close_store;
    rc = tsd_cluster_init(s);
    if (rc)
        goto out_close_store;
    if (cfg->tls_listen[0]) {
        rc = tsd_tls_init(s);
        if (rc)
            goto out_cluster;
    }
    s->base = event_base_new();
    if (!s->base) {
        rc = TS_ENOMEM;
        goto out_tls;
    }
    if (cfg->listen[0] && (rc = listen_on(s, 0, cfg->listen)) != 0)
        goto out_base;
    if (cfg->tls_listen[0] && (rc = listen_on(s, 1, cfg->tls_listen)) != 0)
        goto out_listeners;

    s->nworkers = cfg->workers;
    s->workers = calloc((size_t)s->nworkers, sizeof(*s->workers));
    if (!s->workers) {
        rc = TS_ENOMEM;
        goto out_listeners;
    }
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_worker *w = &s->workers[i];
        w->srv = s;
        w->id = i;
        pthread_mutex_init(&w->lock, NULL);
        w->base = event_base_new();
        w->m = tsd_wmetrics_create();
        w->notify =
            w->base ? event_new(w->base, -1, EV_PERSIST | EV_READ, worker_notify_cb, w) : NULL;
        w->idle_sweep = w->notify ? event_new(w->base, -1, EV_PERSIST, worker_idle_sweep, w) : NULL;
        w->sealed_ev = w->base ? event_new(w->base, -1, 0, worker_sealed_cb, w) : NULL;
        if (w->idle_sweep) {
            struct timeval sec = {1, 0};
            evtimer_add(w->idle_sweep, &sec);
        }
        if (!w->notify || !w->idle_sweep || !w->sealed_ev || !w->m) {
            rc = TS_ENOMEM;
            goto out_workers;
        }
    }
    rc = tsd_rdma_tokens_init(&s->rdma_tokens);
    if (rc)
        goto out_workers;
    if (cfg->rdma_listen[0]) {
        static const struct tsd_rdma_hooks hooks = {tsd_conn_start_rdma, tsd_conn_rdma_room,
                                                    tsd_conn_rdma_gone};
        char why[300];
        rc = tsd_rdma_start(s, cfg->rdma_listen, &hooks, why, sizeof(why));
        if (rc) {
            TS_ERROR(FAC, rc, "%s", why);
            fprintf(stderr, "tesserad: %s\n", why);
            tsd_rdma_tokens_fini(&s->rdma_tokens);
            goto out_workers;
        }
    }
    s->sig_term = evsignal_new(s->base, SIGTERM, signal_cb, s);
    s->sig_int = evsignal_new(s->base, SIGINT, signal_cb, s);
    evsignal_add(s->sig_term, NULL);
    evsignal_add(s->sig_int, NULL);
    return 0;

out_workers:
    for (int i = 0; i < s->nworkers; i++) {
        if (s->workers[i].notify)
            event_free(s->workers[i].notify);
        if (s->workers[i].idle_sweep)
            event_free(s->workers[i].idle_sweep);
        if (s->workers[i].sealed_ev)
            event_free(s->workers[i].sealed_ev);
        if (s->workers[i].base)
            event_base_free(s->workers[i].base);
        tsd_wmetrics_destroy(s->workers[i].m);
        pthread_mutex_destroy(&s->workers[i].lock);
    }
    free(s->workers);
    s->workers = NULL;
out_listeners:
    for (int i = 0; i < 2; i++)
        if (s->lis[i])
            evconnlistener_free(s->lis[i]);
out_base:
    event_base_free(s->base);
out_tls:
    tsd_tls_fini(s);
out_cluster:
    tsd_cluster_fini(s);
out_close_store:
    tsd_prefetch_stop(s->prefetch);
    s->prefetch = NULL;
    ts_store_close(s->store);
    s->store = NULL;
    return rc;
}

static void *maint_main(void *arg)
{
    struct tsd_server *s = arg;
    event_base_loop(s->maint_base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

int tsd_server_run(struct tsd_server *s)
{
    int rc;

    s->maint_base = event_base_new();
    if (!s->maint_base || pthread_create(&s->maint_thread, NULL, maint_main, s) != 0)
        return TS_ENOMEM;
    if (tsd_scrub_patrol_start(s) != 0)
        return TS_ENOMEM;
    for (int i = 0; i < s->nworkers; i++)
        if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]) != 0)
            return TS_ENOMEM;
    if (tsd_etcd_map_start(s) != 0 || tsd_monitor_start(s) != 0)
        return TS_ENOMEM;
    rc = tsd_metrics_start(s);
    if (rc) {
        fprintf(stderr, "tesserad: cannot start the metrics listener %s: %s\n",
                s->cfg->metrics_listen, ts_strerror(rc));
        return rc;
    }
    /* The readiness line: tests and scripts wait for it. */
    fprintf(stderr,
            "tesserad ready node=%s listen=%s tls_listen=%s data=%s workers=%d pid=%d "
            "rdma_listen=%s metrics=%s\n",
            s->cfg->node_id, s->addr[0][0] ? s->addr[0] : "-", s->addr[1][0] ? s->addr[1] : "-",
            s->cfg->data_dir, s->nworkers, (int)getpid(), tsd_rdma_addr(s) ? tsd_rdma_addr(s) : "-",
            tsd_metrics_addr(s)[0] ? tsd_metrics_addr(s) : "-");
    fflush(stderr);
    event_base_dispatch(s->base);
    /* Draining: wait for the workers; the drain timer may still break them. */
    for (int i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i].thread, NULL);
    TS_INFO(FAC, "drained; exiting");
    return 0;
}

void tsd_server_fini(struct tsd_server *s)
{
    /* Shutting down already: a late SIGTERM must not kill the process half way. Freeing the
     * signal events restores the default action, so ignore the signals right after. */
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->sig_int)
        event_free(s->sig_int);
    s->sig_term = s->sig_int = NULL;
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    tsd_metrics_stop(s); /* its heartbeat events live on the workers' loops */
    tsd_monitor_stop(s);
    tsd_etcd_map_stop(s); /* it installs maps: before replication stops */
    /* Scrubs repair through replication: the scheduled one is stopped, a client's stops at its
     * next shard (or PG), and replication waits for both. */
    atomic_store(&s->stopping, 1);
    tsd_scrub_patrol_stop(s);
    while (atomic_load(&s->scrub.running) > 0)
        usleep(10 * 1000);
    /* Replication and maintenance post completions to the workers' loops: stop them first. */
    ts_repl_stop(s->repl);
    s->repl = NULL;
    if (s->maint_base) {
        event_base_loopbreak(s->maint_base);
        pthread_join(s->maint_thread, NULL);
        event_base_free(s->maint_base);
        s->maint_base = NULL;
    }
    tsd_rdma_stop(s); /* its events live on worker 0's loop */
    tsd_rdma_tokens_fini(&s->rdma_tokens);
    while (atomic_load(&s->tier_jobs) > 0) /* a DATASET_TIER's thread still uses the store */
        usleep(10 * 1000);
    /* The loops have ended: no seal is queued after this, and none reaches a freed event. */
    ts_store_commit_quiesce(s->store);
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_worker *w = &s->workers[i];
        s->ops->seals_forget(w);
        event_free(w->sealed_ev);
        while (w->queue) {
            struct tsd_pending *p = w->queue;
            w->queue = p->next;
            evutil_closesocket(p->fd);
            free(p);
        }
        event_free(w->notify);
        if (w->idle_sweep)
            event_free(w->idle_sweep);
        event_base_free(w->base);
        tsd_wmetrics_destroy(w->m);
        pthread_mutex_destroy(&w->lock);
    }
    free(s->workers);
    for (int i = 0; i < 2; i++) {
        if (s->lis_resume[i])
            event_free(s->lis_resume[i]);
        if (s->lis[i])
            evconnlistener_free(s->lis[i]);
    }
    if (s->drain_timer)
        event_free(s->drain_timer);
    if (s->drain_check)
        event_free(s->drain_check);
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->base)
        event_base_free(s->base);
    tsd_tls_fini(s);
    tsd_cluster_fini(s); /* replication uses the store: stop it first */
    tsd_prefetch_stop(s->prefetch);
    s->prefetch = NULL;
    ts_store_close(s->store);
    tsd_ec_wanted_fini(&s->ec_wanted);
    sem_destroy(&s->tier_slots);
}
