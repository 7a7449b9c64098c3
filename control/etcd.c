/*
 * The etcd v3 client (control/etcd.h): JSON gateway calls over libevent's HTTP client.
 *
 * Each call opens a connection to the current member, posts one JSON body and runs the handle's
 * event base until the reply (or, for a watch, the first event) arrives or a timer fires. A
 * member that cannot be reached is skipped for the next one; the first that answers stays the
 * current member. Control-plane calls are few (map changes, lease keepalives every few
 * seconds), so a connection per call costs nothing that matters and keeps the state small.
 */
#include "etcd.h"

#include "tessera/errno.h"
#include "ts_common.h"

#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <json-c/json.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MEMBERS 16
/* Streaming replies (a stream of JSON objects): a watch ends at the first that carries events
 * (the first one only says the watch was created), a lease keepalive at its first answer. */
#define STREAM_EVENTS 1
#define STREAM_FIRST 2
#define DEFAULT_TIMEOUT_MS 3000

struct member {
    char host[256];
    int port;
    int tls;
};

struct ts_etcd {
    struct event_base *base;
    SSL_CTX *ssl;
    struct member m[MAX_MEMBERS];
    int n, cur;
    int timeout_ms;
    char err[512];
};

static void say(ts_etcd *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(ts_etcd *e, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
}

const char *ts_etcd_error(const ts_etcd *e)
{
    return e ? e->err : "";
}

void ts_etcd_kv_free(struct ts_etcd_kv *kv)
{
    if (kv) {
        free(kv->value);
        memset(kv, 0, sizeof(*kv));
    }
}

/* ---- opening ---------------------------------------------------------------------------- */

/* "http://host:port" or "https://host:port" (or "host:port": http) into m; 0 or TS_EINVAL. */
static int parse_member(const char *s, size_t n, struct member *m)
{
    const char *colon;
    char port[8];

    memset(m, 0, sizeof(*m));
    if (n > 8 && !strncmp(s, "https://", 8)) {
        m->tls = 1;
        s += 8, n -= 8;
    } else if (n > 7 && !strncmp(s, "http://", 7)) {
        s += 7, n -= 7;
    }
    colon = memrchr(s, ':', n);
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof(m->host) ||
        (size_t)(s + n - colon - 1) >= sizeof(port) || s + n - colon - 1 == 0)
        return TS_EINVAL;
    memcpy(m->host, s, (size_t)(colon - s));
    memcpy(port, colon + 1, (size_t)(s + n - colon - 1));
    port[s + n - colon - 1] = '\0';
    m->port = atoi(port);
    return m->port > 0 && m->port < 65536 ? 0 : TS_EINVAL;
}

static int tls_setup(ts_etcd *e, const struct ts_etcd_opts *o)
{
    e->ssl = SSL_CTX_new(TLS_client_method());
    if (!e->ssl)
        return TS_ENOMEM;
    SSL_CTX_set_min_proto_version(e->ssl, TLS1_2_VERSION);
    SSL_CTX_set_verify(e->ssl, SSL_VERIFY_PEER, NULL);
    if (!o->ca || SSL_CTX_load_verify_locations(e->ssl, o->ca, NULL) != 1) {
        say(e, "etcd: https needs the CA that signed the members (%s)", o->ca ? o->ca : "none");
        return TS_ECONFIG;
    }
    if (o->cert &&
        (SSL_CTX_use_certificate_chain_file(e->ssl, o->cert) != 1 ||
         SSL_CTX_use_PrivateKey_file(e->ssl, o->key ? o->key : o->cert, SSL_FILETYPE_PEM) != 1 ||
         SSL_CTX_check_private_key(e->ssl) != 1)) {
        say(e, "etcd: cannot use the client certificate %s and key %s", o->cert,
            o->key ? o->key : o->cert);
        return TS_ECONFIG;
    }
    return 0;
}

int ts_etcd_open(ts_etcd **out, const struct ts_etcd_opts *o)
{
    ts_etcd *e;
    const char *s;
    int rc = 0, tls = 0;

    if (!out || !o || !o->endpoints)
        return TS_EINVAL;
    *out = NULL;
    e = calloc(1, sizeof(*e));
    if (!e)
        return TS_ENOMEM;
    e->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    for (s = o->endpoints; *s && !rc;) {
        size_t n = strcspn(s, ",");
        if (e->n == MAX_MEMBERS || parse_member(s, n, &e->m[e->n]) != 0)
            rc = TS_EINVAL;
        else
            tls |= e->m[e->n++].tls;
        s += n + (s[n] == ',');
    }
    if (rc || !e->n) {
        ts_etcd_close(e);
        return TS_EINVAL;
    }
    e->base = event_base_new();
    if (!e->base)
        rc = TS_ENOMEM;
    else if (tls)
        rc = tls_setup(e, o);
    if (rc) {
        ts_etcd_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

void ts_etcd_close(ts_etcd *e)
{
    if (!e)
        return;
    if (e->ssl)
        SSL_CTX_free(e->ssl);
    if (e->base)
        event_base_free(e->base);
    free(e);
}

/* ---- one call ----------------------------------------------------------------------------- */

struct call {
    ts_etcd *e;
    struct evhttp_request *req;
    int done, timed_out, status;
    struct evbuffer *body;
    int stream;         /* a streaming reply: STREAM_EVENTS or STREAM_FIRST */
    json_object *event; /* streams: the object that ended the call */
    char why[200];      /* no reply: what the connection said */
};

static void call_end(struct call *c)
{
    c->done = 1;
    event_base_loopbreak(c->e->base);
}

static void on_reply(struct evhttp_request *req, void *arg)
{
    struct call *c = arg;

    c->req = NULL; /* libevent frees it after this callback */
    if (req) {
        c->status = evhttp_request_get_response_code(req);
        evbuffer_add_buffer(c->body, evhttp_request_get_input_buffer(req));
    }
    call_end(c);
}

/* A streaming reply, object by object: the one the call waits for ends it. */
static void on_chunk(struct evhttp_request *req, void *arg)
{
    struct call *c = arg;
    json_tokener *tok;
    size_t len;
    const char *p;

    evbuffer_add_buffer(c->body, evhttp_request_get_input_buffer(req));
    len = evbuffer_get_length(c->body);
    p = (const char *)evbuffer_pullup(c->body, -1);
    tok = json_tokener_new();
    while (tok && len && !c->event) {
        json_object *o = json_tokener_parse_ex(tok, p, (int)len), *res, *ev;
        size_t used = (size_t)json_tokener_get_parse_end(tok);
        if (!o)
            break; /* the rest of this object has not arrived yet */
        if (json_object_object_get_ex(o, "result", &res) &&
            (c->stream == STREAM_FIRST ||
             (json_object_object_get_ex(res, "events", &ev) && json_object_array_length(ev) > 0)))
            c->event = json_object_get(o);
        json_object_put(o);
        json_tokener_reset(tok);
        evbuffer_drain(c->body, used);
        len = evbuffer_get_length(c->body);
        p = (const char *)evbuffer_pullup(c->body, -1);
    }
    json_tokener_free(tok);
    if (c->event)
        call_end(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct call *c = arg;

    (void)fd, (void)what;
    c->timed_out = 1;
    call_end(c);
}

static struct bufferevent *member_bev(ts_etcd *e, const struct member *m)
{
    SSL *ssl;
    struct in6_addr a6;
    struct in_addr a4;

    if (!m->tls)
        return bufferevent_socket_new(e->base, -1, BEV_OPT_CLOSE_ON_FREE);
    ssl = SSL_new(e->ssl);
    if (!ssl)
        return NULL;
    if (inet_pton(AF_INET, m->host, &a4) == 1 || inet_pton(AF_INET6, m->host, &a6) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), m->host);
    } else {
        SSL_set_tlsext_host_name(ssl, m->host);
        SSL_set1_host(ssl, m->host);
    }
    return bufferevent_openssl_socket_new(e->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                          BEV_OPT_CLOSE_ON_FREE);
}

/* POSTs body to path on member m; status 0 when nothing came back. */
static int post_once(ts_etcd *e, const struct member *m, const char *path, const char *body,
                     struct call *c, int timeout_ms)
{
    struct bufferevent *bev = member_bev(e, m);
    struct evhttp_connection *con;
    struct event *timer;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    char hostport[300];

    if (!bev)
        return TS_ENOMEM;
    con = evhttp_connection_base_bufferevent_new(e->base, NULL, bev, m->host, (uint16_t)m->port);
    if (!con) {
        bufferevent_free(bev);
        return TS_ENOMEM;
    }
    evhttp_connection_set_retries(con, 0);
    {
        struct timeval ctv = tv;
        ctv.tv_sec += 1; /* the call's timer ends it first */
        evhttp_connection_set_timeout_tv(con, &ctv);
    }
    c->req = evhttp_request_new(on_reply, c);
    timer = evtimer_new(e->base, on_timer, c);
    if (!c->req || !timer) {
        if (c->req)
            evhttp_request_free(c->req);
        if (timer)
            event_free(timer);
        evhttp_connection_free(con);
        return TS_ENOMEM;
    }
    if (c->stream)
        evhttp_request_set_chunked_cb(c->req, on_chunk);
    snprintf(hostport, sizeof(hostport), "%s:%d", m->host, m->port);
    evhttp_add_header(evhttp_request_get_output_headers(c->req), "Host", hostport);
    evhttp_add_header(evhttp_request_get_output_headers(c->req), "Content-Type",
                      "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(c->req), body, strlen(body));
    if (evhttp_make_request(con, c->req, EVHTTP_REQ_POST, path) != 0) {
        c->req = NULL; /* freed by libevent on failure */
        event_free(timer);
        evhttp_connection_free(con);
        return TS_EUNAVAIL;
    }
    evtimer_add(timer, &tv);
    while (!c->done)
        event_base_dispatch(e->base);
    event_free(timer);
    if (!c->status && !c->event && !c->timed_out) {
        unsigned long tls_err = m->tls ? bufferevent_get_openssl_error(bev) : 0;
        if (tls_err)
            ERR_error_string_n(tls_err, c->why, sizeof(c->why));
        else
            snprintf(c->why, sizeof(c->why), "%s",
                     m->tls ? "TLS handshake or connection failed"
                            : "connection refused or closed");
    }
    if (c->req)
        evhttp_cancel_request(c->req); /* a watch that ended, or a timeout */
    evhttp_connection_free(con);
    return 0;
}

/* etcd's gRPC codes in an error body, as TS_E*. */
static int grpc_rc(int code)
{
    switch (code) {
    case 4:
        return TS_ETIMEDOUT; /* DeadlineExceeded */
    case 5:
        return TS_ENOENT; /* NotFound */
    case 9:
        return TS_ESTALE; /* FailedPrecondition */
    case 14:
        return TS_EUNAVAIL; /* Unavailable (no leader) */
    default:
        return TS_EIO;
    }
}

static int post_members(ts_etcd *e, const char *path, const char *body, int stream, int timeout_ms,
                        json_object **out);

/* Posts body to path, member after member until one answers: the reply's JSON in *out (also
 * for an error reply, which gives its TS_E* code). A read that meets etcd without a leader for a
 * moment ("leader changed", "no leader": a member died, the others elect) is asked again every
 * 100 ms within the call's time; a write is not (its outcome is unknown: the caller decides). */
static int post(ts_etcd *e, const char *path, const char *body, int stream, int timeout_ms,
                json_object **out)
{
    uint64_t end = ts_now_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    int rc;

    for (;;) {
        rc = post_members(e, path, body, stream, timeout_ms, out);
        if (rc != TS_EUNAVAIL || strcmp(path, "/v3/kv/range") ||
            ts_now_mono_ns() + 100000000ull > end || !strstr(e->err, "etcdserver:"))
            return rc;
        usleep(100 * 1000);
    }
}

static int post_members(ts_etcd *e, const char *path, const char *body, int stream, int timeout_ms,
                        json_object **out)
{
    char tried[400] = "";

    *out = NULL;
    for (int k = 0; k < e->n; k++) {
        const struct member *m = &e->m[(e->cur + k) % e->n];
        struct call c = {.e = e, .stream = stream, .body = evbuffer_new()};
        int rc;
        if (!c.body)
            return TS_ENOMEM;
        rc = post_once(e, m, path, body, &c, timeout_ms);
        if (!rc && c.timed_out && !c.event) {
            evbuffer_free(c.body);
            say(e, "etcd %s:%d: no answer to %s within %d ms", m->host, m->port, path, timeout_ms);
            return TS_ETIMEDOUT;
        }
        if (!rc && (c.status || c.event)) {
            json_object *j = c.event;
            e->cur = (e->cur + k) % e->n;
            if (!j) { /* the body is not NUL-terminated: parsed by its length */
                size_t n = evbuffer_get_length(c.body);
                json_tokener *tok = json_tokener_new();
                j = tok && n ? json_tokener_parse_ex(tok, (const char *)evbuffer_pullup(c.body, -1),
                                                     (int)n)
                             : NULL;
                json_tokener_free(tok);
            }
            evbuffer_free(c.body);
            if (!j) {
                say(e, "etcd %s:%d: %s: a reply that is not JSON (HTTP %d)", m->host, m->port, path,
                    c.status);
                return TS_EPROTO;
            }
            if (!c.event && c.status != 200) {
                json_object *msg = NULL, *code = NULL;
                json_object_object_get_ex(j, "message", &msg);
                json_object_object_get_ex(j, "code", &code);
                say(e, "etcd %s:%d: %s: %s", m->host, m->port, path,
                    msg ? json_object_get_string(msg) : json_object_get_string(j));
                rc = grpc_rc(code ? json_object_get_int(code) : 0);
                json_object_put(j);
                return rc;
            }
            *out = j;
            return 0;
        }
        evbuffer_free(c.body);
        if (rc)
            return rc;
        snprintf(tried + strlen(tried), sizeof(tried) - strlen(tried), "%s%s:%d: %s", k ? "; " : "",
                 m->host, m->port, c.why);
    }
    say(e, "etcd: no member answered (%s)", tried);
    return TS_EUNAVAIL;
}

/* ---- JSON and base64 ---------------------------------------------------------------------- */

static char *b64(const void *p, size_t n)
{
    char *s = malloc(4 * ((n + 2) / 3) + 1);

    if (s)
        EVP_EncodeBlock((unsigned char *)s, p, (int)n);
    return s;
}

/* Decodes s (base64) into a malloc'ed, NUL-terminated buffer; -1 when it is not base64. */
static long unb64(const char *s, uint8_t **out)
{
    size_t n = strlen(s);
    uint8_t *p = malloc(n / 4 * 3 + 1);
    int k;

    *out = NULL;
    if (!p || n % 4) {
        free(p);
        return -1;
    }
    k = n ? EVP_DecodeBlock(p, (const unsigned char *)s, (int)n) : 0;
    if (k < 0) {
        free(p);
        return -1;
    }
    k -= (n && s[n - 1] == '=') + (n > 1 && s[n - 2] == '=');
    p[k] = '\0';
    *out = p;
    return k;
}

static int64_t field_i64(json_object *o, const char *name)
{
    json_object *v;

    return o && json_object_object_get_ex(o, name, &v) ? json_object_get_int64(v) : 0;
}

static void add_b64(json_object *o, const char *name, const void *p, size_t n)
{
    char *s = b64(p, n);

    json_object_object_add(o, name, json_object_new_string(s ? s : ""));
    free(s);
}

static void add_i64(json_object *o, const char *name, int64_t v)
{
    char s[24];

    snprintf(s, sizeof(s), "%lld", (long long)v);
    json_object_object_add(o, name, json_object_new_string(s));
}

/* A kv object of a reply into kv. */
static int kv_take(ts_etcd *e, json_object *o, struct ts_etcd_kv *kv)
{
    json_object *v;
    long n = 0;

    memset(kv, 0, sizeof(*kv));
    kv->create_rev = field_i64(o, "create_revision");
    kv->mod_rev = field_i64(o, "mod_revision");
    kv->version = field_i64(o, "version");
    kv->lease = field_i64(o, "lease");
    if (json_object_object_get_ex(o, "value", &v))
        n = unb64(json_object_get_string(v), &kv->value);
    else
        n = unb64("", &kv->value);
    if (n < 0) {
        say(e, "etcd: a value that is not base64");
        return TS_EPROTO;
    }
    kv->len = (size_t)n;
    return 0;
}

/* Posts o (consumed) and returns the reply. */
static int call_json(ts_etcd *e, const char *path, json_object *o, json_object **reply)
{
    int rc = post(e, path, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN), 0,
                  e->timeout_ms, reply);
    json_object_put(o);
    return rc;
}

/* ---- the calls ---------------------------------------------------------------------------- */

static json_object *key_req(const char *key)
{
    json_object *o = json_object_new_object();

    add_b64(o, "key", key, strlen(key));
    return o;
}

int ts_etcd_get(ts_etcd *e, const char *key, struct ts_etcd_kv *kv, int64_t *rev)
{
    json_object *r, *kvs, *h;
    int rc;

    if (!e || !key || !kv)
        return TS_EINVAL;
    memset(kv, 0, sizeof(*kv));
    rc = call_json(e, "/v3/kv/range", key_req(key), &r);
    if (rc)
        return rc;
    if (rev)
        *rev = json_object_object_get_ex(r, "header", &h) ? field_i64(h, "revision") : 0;
    if (!json_object_object_get_ex(r, "kvs", &kvs) || json_object_array_length(kvs) == 0)
        rc = TS_ENOENT;
    else
        rc = kv_take(e, json_object_array_get_idx(kvs, 0), kv);
    json_object_put(r);
    return rc;
}

static json_object *put_req(const char *key, const void *v, size_t len, int64_t lease)
{
    json_object *o = key_req(key);

    add_b64(o, "value", v, len);
    if (lease)
        add_i64(o, "lease", lease);
    return o;
}

static int64_t header_rev(json_object *r)
{
    json_object *h;

    return json_object_object_get_ex(r, "header", &h) ? field_i64(h, "revision") : 0;
}

int ts_etcd_put(ts_etcd *e, const char *key, const void *v, size_t len, int64_t lease, int64_t *rev)
{
    json_object *r;
    int rc;

    if (!e || !key || (!v && len))
        return TS_EINVAL;
    rc = call_json(e, "/v3/kv/put", put_req(key, v, len, lease), &r);
    if (!rc && rev)
        *rev = header_rev(r);
    json_object_put(r);
    return rc;
}

int ts_etcd_cas(ts_etcd *e, const char *key, int64_t expect, const void *v, size_t len,
                int64_t lease, int64_t *rev, struct ts_etcd_kv *now)
{
    json_object *o = json_object_new_object(), *cmp = key_req(key), *cmps, *ok, *put, *fail, *get,
                *r, *succ;
    int rc;

    if (!e || !key || (!v && len)) {
        json_object_put(o);
        json_object_put(cmp);
        return TS_EINVAL;
    }
    if (now)
        memset(now, 0, sizeof(*now));
    /* compare: the key's mod revision (a key that does not exist has 0) */
    json_object_object_add(cmp, "target", json_object_new_string("MOD"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    add_i64(cmp, "mod_revision", expect);
    cmps = json_object_new_array();
    json_object_array_add(cmps, cmp);
    json_object_object_add(o, "compare", cmps);
    put = json_object_new_object();
    json_object_object_add(put, "request_put", put_req(key, v, len, lease));
    ok = json_object_new_array();
    json_object_array_add(ok, put);
    json_object_object_add(o, "success", ok);
    get = json_object_new_object();
    json_object_object_add(get, "request_range", key_req(key));
    fail = json_object_new_array();
    json_object_array_add(fail, get);
    json_object_object_add(o, "failure", fail);
    rc = call_json(e, "/v3/kv/txn", o, &r);
    if (rc)
        return rc;
    if (json_object_object_get_ex(r, "succeeded", &succ) && json_object_get_boolean(succ)) {
        if (rev)
            *rev = header_rev(r);
    } else {
        json_object *resps, *rr, *kvs;
        rc = TS_ESTALE;
        say(e, "etcd: %s changed under us (it is no longer at revision %lld)", key,
            (long long)expect);
        if (now && json_object_object_get_ex(r, "responses", &resps) &&
            json_object_array_length(resps) > 0 &&
            json_object_object_get_ex(json_object_array_get_idx(resps, 0), "response_range", &rr) &&
            json_object_object_get_ex(rr, "kvs", &kvs) && json_object_array_length(kvs) > 0 &&
            kv_take(e, json_object_array_get_idx(kvs, 0), now) != 0)
            rc = TS_EPROTO;
    }
    json_object_put(r);
    return rc;
}

int ts_etcd_list(ts_etcd *e, const char *prefix, char ***keys, size_t *n)
{
    json_object *o, *r, *kvs, *k;
    size_t len = prefix ? strlen(prefix) : 0, cnt;
    char *end;
    int rc;

    if (!e || !len || !keys || !n)
        return TS_EINVAL;
    *keys = NULL;
    *n = 0;
    end = strdup(prefix); /* the range's end: the prefix with its last byte one more */
    if (!end)
        return TS_ENOMEM;
    end[len - 1]++;
    o = key_req(prefix);
    add_b64(o, "range_end", end, len);
    free(end);
    json_object_object_add(o, "keys_only", json_object_new_boolean(1));
    rc = call_json(e, "/v3/kv/range", o, &r);
    if (rc)
        return rc;
    cnt = json_object_object_get_ex(r, "kvs", &kvs) ? json_object_array_length(kvs) : 0;
    *keys = calloc(cnt ? cnt : 1, sizeof(char *));
    for (size_t i = 0; *keys && i < cnt; i++) {
        uint8_t *key = NULL;
        if (json_object_object_get_ex(json_object_array_get_idx(kvs, i), "key", &k) &&
            unb64(json_object_get_string(k), &key) >= 0)
            (*keys)[(*n)++] = (char *)key;
    }
    json_object_put(r);
    return *keys ? 0 : TS_ENOMEM;
}

int ts_etcd_delete(ts_etcd *e, const char *key)
{
    json_object *r;
    int rc;

    if (!e || !key)
        return TS_EINVAL;
    rc = call_json(e, "/v3/kv/deleterange", key_req(key), &r);
    if (!rc && field_i64(r, "deleted") == 0)
        rc = TS_ENOENT;
    json_object_put(r);
    return rc;
}

int ts_etcd_lease_grant(ts_etcd *e, int64_t ttl_s, int64_t *id)
{
    json_object *o = json_object_new_object(), *r;
    int rc;

    if (!e || !id || ttl_s <= 0) {
        json_object_put(o);
        return TS_EINVAL;
    }
    add_i64(o, "TTL", ttl_s);
    rc = call_json(e, "/v3/lease/grant", o, &r);
    if (!rc) {
        *id = field_i64(r, "ID");
        if (!*id) {
            say(e, "etcd: a lease grant without an ID");
            rc = TS_EPROTO;
        }
    }
    json_object_put(r);
    return rc;
}

int ts_etcd_lease_keepalive(ts_etcd *e, int64_t id, int64_t *ttl)
{
    json_object *o = json_object_new_object(), *r, *res;
    int64_t left = 0;
    int rc;

    if (!e || !id) {
        json_object_put(o);
        return TS_EINVAL;
    }
    add_i64(o, "ID", id);
    rc = post(e, "/v3/lease/keepalive", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN),
              STREAM_FIRST, e->timeout_ms, &r);
    json_object_put(o);
    if (rc)
        return rc;
    /* The keepalive stream answers once: {"result": {"ID", "TTL"}}; TTL 0 or none: expired. */
    if (json_object_object_get_ex(r, "result", &res))
        left = field_i64(res, "TTL");
    json_object_put(r);
    if (ttl)
        *ttl = left;
    if (left <= 0) {
        say(e, "etcd: lease %llx expired", (unsigned long long)id);
        return TS_ENOENT;
    }
    return 0;
}

int ts_etcd_lease_revoke(ts_etcd *e, int64_t id)
{
    json_object *o = json_object_new_object(), *r;
    int rc;

    add_i64(o, "ID", id);
    rc = call_json(e, "/v3/lease/revoke", o, &r);
    json_object_put(r);
    return rc;
}

int ts_etcd_watch(ts_etcd *e, const char *key, int64_t from_rev, int timeout_ms,
                  struct ts_etcd_kv *kv, int *deleted)
{
    json_object *o = json_object_new_object(), *c = key_req(key), *r, *res, *ev, *first, *x;
    int rc;

    if (!e || !key || !kv) {
        json_object_put(o);
        json_object_put(c);
        return TS_EINVAL;
    }
    memset(kv, 0, sizeof(*kv));
    if (deleted)
        *deleted = 0;
    if (from_rev > 0)
        add_i64(c, "start_revision", from_rev);
    json_object_object_add(o, "create_request", c);
    rc = post(e, "/v3/watch", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN),
              STREAM_EVENTS, timeout_ms, &r);
    json_object_put(o);
    if (rc)
        return rc;
    json_object_object_get_ex(r, "result", &res);
    json_object_object_get_ex(res, "events", &ev);
    first = json_object_array_get_idx(ev, 0);
    if (json_object_object_get_ex(first, "type", &x) &&
        !strcmp(json_object_get_string(x), "DELETE")) {
        if (deleted)
            *deleted = 1;
        if (json_object_object_get_ex(first, "kv", &x))
            kv->mod_rev = field_i64(x, "mod_revision");
    } else if (!json_object_object_get_ex(first, "kv", &x) || (rc = kv_take(e, x, kv)) != 0) {
        rc = rc ? rc : TS_EPROTO;
    }
    json_object_put(r);
    return rc;
}
