/*
 * The metrics thread: an event loop of its own that
 *   - drains the workers' hotness rings into the sliding window every TSD_METRICS_TICK_MS,
 *   - checks that every worker's loop (and the acceptor's) still turns (a heartbeat event
 *     activated on each, answered with a timestamp),
 *   - serves metrics_listen with libevent's HTTP server (evhttp; TLS with the node's
 *     certificate when metrics_tls is set): GET /metrics (Prometheus text format), /healthz
 *     (200 while every loop turns) and /readyz (200 when the node serves requests).
 * Scrapes never run on a worker: a slow scraper costs the workers nothing.
 */
#include "metrics_internal.h"

#include <arpa/inet.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#undef FAC
#define FAC "metrics"

#define HEALTH_STALE_NS (5ull * 1000000000ull) /* a loop silent this long is stuck */

struct tsd_metrics {
    struct tsd_server *s;
    pthread_t thread;
    int started;
    struct event_base *base;
    struct event *tick;
    struct evhttp *http;
    char addr[64];
    pthread_mutex_t hot_lock;
    struct tsd_hot *hot;
    int nloops;              /* the workers, then the acceptor */
    struct event **hb;       /* per loop: activated each tick, answered on that loop */
    _Atomic uint64_t *hb_ns; /* per loop: when it last answered (monotonic) */
};

void tsd_metrics_hot_lock(struct tsd_server *s)
{
    pthread_mutex_lock(&s->metrics->hot_lock);
}

void tsd_metrics_hot_unlock(struct tsd_server *s)
{
    pthread_mutex_unlock(&s->metrics->hot_lock);
}

struct tsd_hot *tsd_metrics_hot(struct tsd_server *s)
{
    return s->metrics->hot;
}

const char *tsd_metrics_addr(struct tsd_server *s)
{
    return s->metrics ? s->metrics->addr : "";
}

static void hb_cb(evutil_socket_t fd, short what, void *arg)
{
    _Atomic uint64_t *at = arg;
    atomic_store(at, ts_now_mono_ns());
}

static uint32_t map_pg_count(struct tsd_server *s)
{
    uint32_t n = 0;

    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map)
        n = s->map->pg_count;
    pthread_rwlock_unlock(&s->map_lock);
    return n;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct tsd_metrics *m = arg;
    struct tsd_server *s = m->s;
    uint32_t npg = map_pg_count(s), slot, shard;
    uint64_t bytes;

    pthread_mutex_lock(&m->hot_lock);
    if (npg != tsd_hot_npg(m->hot) && tsd_hot_set_npg(m->hot, npg) != 0)
        TS_WARN(FAC, TS_ENOMEM, "no memory for the hotness of %u PGs", npg);
    tsd_hot_advance(m->hot, ts_now_mono_ns());
    for (int i = 0; i < s->nworkers; i++) {
        struct tsd_wmetrics *wm = s->workers[i].m;
        while (wm && tsd_m_ring_take(wm, &slot, &shard, &bytes)) {
            const char *name = wm->datasets.slot[slot].name; /* published before the read */
            uint32_t pg = npg ? ts_pg_of(name, shard, npg) : UINT32_MAX;
            tsd_hot_add(m->hot, name, shard, pg, bytes);
        }
    }
    pthread_mutex_unlock(&m->hot_lock);
    for (int i = 0; i < m->nloops; i++)
        event_active(m->hb[i], EV_TIMEOUT, 0);
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
    struct evbuffer *b = evbuffer_new();

    if (!b) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; charset=utf-8");
    evbuffer_add_printf(b, "%s\n", text);
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

static int get_only(struct evhttp_request *req)
{
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET ||
        evhttp_request_get_command(req) == EVHTTP_REQ_HEAD)
        return 1;
    reply_text(req, 405, "Method Not Allowed", "only GET");
    return 0;
}

static void metrics_cb(struct evhttp_request *req, void *arg)
{
    struct tsd_metrics *m = arg;
    struct evbuffer *b;

    if (!get_only(req))
        return;
    b = evbuffer_new();
    if (!b || tsd_metrics_render(m->s, b) != 0) {
        evbuffer_free(b);
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}

/* Every loop answered its heartbeat lately: 0; else which one did not (why). */
static int loops_turn(struct tsd_metrics *m, char *why, size_t cap)
{
    uint64_t now = ts_now_mono_ns();

    for (int i = 0; i < m->nloops; i++) {
        uint64_t at = atomic_load(&m->hb_ns[i]);
        if (at && now - at > HEALTH_STALE_NS) {
            if (i < m->s->nworkers)
                snprintf(why, cap, "worker %d's loop has not turned for %.1f s", i,
                         (double)(now - at) / 1e9);
            else
                snprintf(why, cap, "the acceptor's loop has not turned for %.1f s",
                         (double)(now - at) / 1e9);
            return -1;
        }
    }
    return 0;
}

static void healthz_cb(struct evhttp_request *req, void *arg)
{
    struct tsd_metrics *m = arg;
    char why[128];

    if (!get_only(req))
        return;
    if (loops_turn(m, why, sizeof(why)) != 0)
        reply_text(req, 503, "Service Unavailable", why);
    else
        reply_text(req, HTTP_OK, "OK", "ok");
}

static void readyz_cb(struct evhttp_request *req, void *arg)
{
    struct tsd_metrics *m = arg;
    struct tsd_server *s = m->s;
    char why[160];

    if (!get_only(req))
        return;
    if (loops_turn(m, why, sizeof(why)) != 0)
        ;
    else if (atomic_load(&s->draining) || atomic_load(&s->stopping))
        snprintf(why, sizeof(why), "draining: the node is shutting down");
    else if ((s->cfg->map_file[0] || s->cfg->etcd[0]) && !atomic_load(&s->epoch))
        snprintf(why, sizeof(why), "no cluster map yet");
    else
        why[0] = 0;
    if (why[0])
        reply_text(req, 503, "Service Unavailable", why);
    else
        reply_text(req, HTTP_OK, "OK", "ready");
}

static void other_cb(struct evhttp_request *req, void *arg)
{
    reply_text(req, HTTP_NOTFOUND, "Not Found", "not found: /metrics, /healthz, /readyz");
}

static struct bufferevent *tls_bev_cb(struct event_base *base, void *arg)
{
    SSL *ssl = SSL_new(arg);

    if (!ssl)
        return NULL;
    return bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                          BEV_OPT_CLOSE_ON_FREE);
}

static int http_listen(struct tsd_metrics *m, const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t blen = sizeof(ss);
    int sslen = sizeof(ss), one = 1;
    char host[INET6_ADDRSTRLEN] = "?";
    evutil_socket_t fd;

    memset(&ss, 0, sizeof(ss));
    if (ts_listen_addr_parse(addr, &ss, &sslen) != 0) {
        TS_ERROR(FAC, TS_ECONFIG, "cannot parse metrics_listen '%s' (want HOST:PORT)", addr);
        return TS_ECONFIG;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ts_from_errno(errno);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, (socklen_t)sslen) != 0 || listen(fd, 128) != 0) {
        int err = errno;
        TS_ERROR(FAC, ts_from_errno(err), "cannot listen on metrics_listen %s: %s", addr,
                 strerror(err));
        close(fd);
        return ts_from_errno(err);
    }
    if (evhttp_accept_socket(m->http, fd) != 0) {
        close(fd);
        return TS_ENOMEM;
    }
    getsockname(fd, (struct sockaddr *)&ss, &blen);
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
        snprintf(m->addr, sizeof(m->addr), "%s:%d", host,
                 ntohs(((struct sockaddr_in *)&ss)->sin_port));
    } else {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
        snprintf(m->addr, sizeof(m->addr), "[%s]:%d", host,
                 ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    }
    return 0;
}

static int http_start(struct tsd_metrics *m)
{
    struct tsd_server *s = m->s;
    int rc;

    m->http = evhttp_new(m->base);
    if (!m->http)
        return TS_ENOMEM;
    if (s->cfg->metrics_tls) {
        if (!s->ssl_ctx) {
            TS_ERROR(FAC, TS_ECONFIG, "metrics_tls needs the node's TLS (tls_listen, tls.cert)");
            return TS_ECONFIG;
        }
        evhttp_set_bevcb(m->http, tls_bev_cb, s->ssl_ctx);
    }
    evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(m->http, 30);
    evhttp_set_cb(m->http, "/metrics", metrics_cb, m);
    evhttp_set_cb(m->http, "/healthz", healthz_cb, m);
    evhttp_set_cb(m->http, "/readyz", readyz_cb, m);
    evhttp_set_gencb(m->http, other_cb, m);
    rc = http_listen(m, s->cfg->metrics_listen);
    if (rc)
        return rc;
    TS_INFO(FAC, "metrics on %s://%s/metrics", s->cfg->metrics_tls ? "https" : "http", m->addr);
    return 0;
}

static void *metrics_main(void *arg)
{
    struct tsd_metrics *m = arg;
    event_base_loop(m->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void metrics_free(struct tsd_metrics *m)
{
    if (m->http)
        evhttp_free(m->http);
    if (m->tick)
        event_free(m->tick);
    for (int i = 0; m->hb && i < m->nloops; i++)
        if (m->hb[i])
            event_free(m->hb[i]);
    free(m->hb);
    free((void *)m->hb_ns);
    if (m->base)
        event_base_free(m->base);
    tsd_hot_destroy(m->hot);
    pthread_mutex_destroy(&m->hot_lock);
    free(m);
}

int tsd_metrics_start(struct tsd_server *s)
{
    struct tsd_metrics *m = calloc(1, sizeof(*m));
    struct timeval tv = {0, TSD_METRICS_TICK_MS * 1000};
    int rc = TS_ENOMEM;

    if (!m)
        return TS_ENOMEM;
    m->s = s;
    pthread_mutex_init(&m->hot_lock, NULL);
    m->nloops = s->nworkers + 1;
    m->hb = calloc((size_t)m->nloops, sizeof(*m->hb));
    m->hb_ns = calloc((size_t)m->nloops, sizeof(*m->hb_ns));
    m->base = event_base_new();
    if (!m->hb || !m->hb_ns || !m->base || tsd_hot_create(&m->hot, 0) != 0)
        goto out_free;
    for (int i = 0; i < m->nloops; i++) {
        struct event_base *b = i < s->nworkers ? s->workers[i].base : s->base;
        m->hb[i] = event_new(b, -1, 0, hb_cb, (void *)&m->hb_ns[i]);
        if (!m->hb[i])
            goto out_free;
    }
    m->tick = event_new(m->base, -1, EV_PERSIST, tick_cb, m);
    if (!m->tick || event_add(m->tick, &tv) != 0)
        goto out_free;
    if (s->cfg->metrics_listen[0] && (rc = http_start(m)) != 0)
        goto out_free;
    if (pthread_create(&m->thread, NULL, metrics_main, m) != 0) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    m->started = 1;
    s->metrics = m;
    return 0;

out_free:
    metrics_free(m);
    return rc;
}

void tsd_metrics_stop(struct tsd_server *s)
{
    struct tsd_metrics *m = s->metrics;

    if (!m)
        return;
    if (m->started) {
        event_base_loopbreak(m->base);
        pthread_join(m->thread, NULL);
    }
    s->metrics = NULL;
    metrics_free(m);
}
