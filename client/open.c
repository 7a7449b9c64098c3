/*
 * libtessera, the connection layer: opening and closing a connection. Connecting (address,
 * transport), HELLO, keeping the options of a top-level handle and asking its node for the
 * cluster map (whether that makes a router is decided above, in api.c); closing; a handle
 * with no connection of its own for the router to live in; and the accessors of a connection
 * (role, node, message, epochs, timeout, options) that the public calls and the router use.
 * Nothing here knows the router.
 */
#include "conn.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>

#include "ts_map.h"

#define FAC "client"
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_MAX_INFLIGHT 64u

/* ---- open / close ---------------------------------------------------------------------------- */

void tessera_opts_init(struct tessera_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->address = TS_DEFAULT_ADDRESS;
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->max_inflight = DEFAULT_MAX_INFLIGHT;
}

static int hello(struct tessera_client *c, const char *client_name)
{
    struct ts_hello_reply h;
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    r = ts_req_new(c, TS_OP_HELLO);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u16(&r->w, TS_PROTO_VERSION);
    ts_wr_str(&r->w, client_name && client_name[0] ? client_name : "libtessera");
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    rc = ts_hello_decode(&body, &h);
    ts_req_free(c, r);
    if (rc)
        return ts_proto_err(c, "HELLO");
    if (h.version != TS_PROTO_VERSION) {
        ts_conn_set_error(c, "the server speaks protocol version %u, this library %u", h.version,
                          TS_PROTO_VERSION);
        return TS_ENOTSUP;
    }
    snprintf(c->node, sizeof(c->node), "%s", h.node);
    c->role = h.role;
    c->max_frame = h.max_frame ? h.max_frame : TS_MAX_CHUNK + 4096;
    if (h.epoch > c->epoch)
        c->epoch = h.epoch;
    TS_DEBUG(FAC, "connected to node %s as %s (max frame %u, epoch %llu)", c->node,
             ts_role_name(c->role), c->max_frame, (unsigned long long)c->epoch);
    return 0;
}

/* Keeps a copy of the options (and their strings) in a top-level handle. */
static int opts_keep(struct tessera_client *c, const struct tessera_opts *o)
{
    const char *src[] = {o->address,         o->tls_ca,      o->tls_cert, o->tls_key,
                         o->tls_server_name, o->client_name, o->domain};
    const char **dst[] = {&c->opts.address, &c->opts.tls_ca,          &c->opts.tls_cert,
                          &c->opts.tls_key, &c->opts.tls_server_name, &c->opts.client_name,
                          &c->opts.domain};
    size_t len = 0, off = 0;

    c->opts = *o;
    for (size_t i = 0; i < TS_ARRAY_SIZE(src); i++)
        len += src[i] ? strlen(src[i]) + 1 : 0;
    c->optbuf = malloc(len ? len : 1);
    if (!c->optbuf)
        return TS_ENOMEM;
    for (size_t i = 0; i < TS_ARRAY_SIZE(src); i++) {
        if (!src[i])
            continue;
        memcpy(c->optbuf + off, src[i], strlen(src[i]) + 1);
        *dst[i] = c->optbuf + off;
        off += strlen(src[i]) + 1;
    }
    return 0;
}

/*
 * Asks the node for its cluster map. None (epoch 0, or a server without MAP_GET, or a role
 * that may not ask): a single node, *map NULL.
 */
static int seed_map(struct tessera_client *c, struct ts_map **map)
{
    uint64_t epoch;
    int rc;

    *map = NULL;
    rc = ts_conn_map_get(c, map, &epoch);
    if (rc == TS_ENOTSUP || rc == TS_EPERM) {
        TS_DEBUG(FAC, "node %s gives no cluster map (%s): single-node mode", c->node,
                 ts_errname(rc));
        c->err[0] = '\0';
        return 0;
    }
    return rc;
}

/* HELLO on a connected transport (taken on success and failure alike); then, for a
 * top-level handle (map not NULL), its options are kept and its node's cluster map is asked
 * for (*map, NULL on a single node). */
static int open_on(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                   struct ts_transport *t, const uint64_t *epoch_ref, char *err, size_t errlen)
{
    /* Plain TCP to a TLS port: the server drops the connection or answers with a TLS alert. */
    int plain = t->ops == &ts_transport_tcp;
    struct tessera_client *c;
    int rc;

    *out = NULL;
    if (map)
        *map = NULL;
    c = calloc(1, sizeof(*c));
    if (!c) {
        t->ops->close(t);
        return TS_ENOMEM;
    }
    c->t = t;
    c->next_id = 1;
    c->timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms;
    c->max_inflight = o->max_inflight ? o->max_inflight : DEFAULT_MAX_INFLIGHT;
    c->max_frame = TS_SMALL_PAYLOAD;
    c->epoch_ref = epoch_ref;
    ts_rx_reset(c);
    rc = hello(c, o->client_name);
    if (rc)
        goto out_close;
    if (map) {
        rc = opts_keep(c, o);
        if (rc)
            goto out_close;
        rc = seed_map(c, map);
        if (rc)
            goto out_close;
    }
    *out = c;
    return 0;

out_close:
    if (err && errlen && plain && c->frames == 0 && (rc == TS_ECONNRESET || rc == TS_EPROTO))
        snprintf(err, errlen, "HELLO: %s (is this a TLS port? use --tls-ca)",
                 rc == TS_EPROTO ? "the server's reply is not a tessera frame"
                                 : "the server closed the connection without a reply");
    else if (err && errlen)
        snprintf(err, errlen, "%s: %s", c->role || c->node[0] ? "MAP_GET" : "HELLO",
                 c->err[0] ? c->err : ts_strerror(rc));
    ts_conn_close(c);
    return rc;
}

int ts_conn_open_transport(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                           struct ts_transport *t, char *err, size_t errlen)
{
    return open_on(out, map, o, t, NULL, err, errlen);
}

static int open_addr(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                     const uint64_t *epoch_ref, char *err, size_t errlen);

/*
 * RDMA admission: a control connection to the node's TCP/TLS listener at host:port (TLS when
 * o->tls_ca is set, authenticated like any connection) asks for a token (RDMA_TOKEN) and the
 * node's RDMA address, then closes. The token carries that connection's role to the session.
 */
static int rdma_admit(const struct tessera_opts *o, const struct ts_addr *a,
                      uint8_t tok[TS_RDMA_TOKEN_LEN], char *rhost, size_t hcap, char *rport,
                      size_t pcap, char *err, size_t errlen)
{
    struct tessera_opts co = *o;
    char addr[300];
    tessera_client *c = NULL;
    struct ts_req *r;
    struct ts_rd body;
    const uint8_t *p;
    const char *colon;
    uint16_t n;
    int rc;

    snprintf(addr, sizeof(addr), strchr(a->host, ':') ? "[%s]:%s" : "%s:%s", a->host, a->port);
    co.address = addr;
    rc = open_addr(&c, NULL, &co, NULL, err, errlen);
    if (rc) {
        if (err && errlen && !err[0])
            snprintf(err, errlen, "no RDMA session: cannot reach the control listener %s: %s", addr,
                     ts_strerror(rc));
        return rc;
    }
    r = ts_req_new(c, TS_OP_RDMA_TOKEN);
    if (!r) {
        rc = TS_ENOMEM;
        goto out_close;
    }
    rc = ts_call(c, r, &body); /* frees r when it fails */
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "no RDMA session from %s: %s", addr, c->err);
        goto out_close;
    }
    p = ts_rd_bytes(&body, TS_RDMA_TOKEN_LEN);
    (void)ts_rd_u32(&body); /* how long the token lasts */
    n = ts_rd_u16(&body);
    colon = (const char *)ts_rd_bytes(&body, n);
    if (!p || !colon || body.err || n == 0 || n >= 128) {
        rc = ts_proto_err(c, "RDMA_TOKEN");
        goto out_free;
    }
    memcpy(tok, p, TS_RDMA_TOKEN_LEN);
    {
        char ra[128];
        const char *sep;
        memcpy(ra, colon, n);
        ra[n] = '\0';
        sep = strrchr(ra, ':');
        if (!sep) {
            rc = ts_proto_err(c, "RDMA_TOKEN address");
            goto out_free;
        }
        snprintf(rhost, hcap, "%.*s", (int)(sep - ra), ra);
        snprintf(rport, pcap, "%s", sep + 1);
    }
out_free:
    ts_req_free(c, r);
out_close:
    ts_conn_close(c);
    return rc;
}

/* Connects to o->address and opens a handle on it (map NULL: a sub-connection). */
static int open_addr(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                     const uint64_t *epoch_ref, char *err, size_t errlen)
{
    struct tessera_opts defaults;
    const struct ts_transport_ops *ops;
    struct ts_conn_params p;
    struct ts_transport *t;
    struct ts_addr a;
    char why[160], rhost[128], rport[16];
    uint8_t tok[TS_RDMA_TOKEN_LEN] = {0};
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (map)
        *map = NULL;
    if (!o) {
        tessera_opts_init(&defaults);
        o = &defaults;
    }
    if (ts_addr_parse_why(o->address, &a, why, sizeof(why)) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "bad address '%s': %s", o->address, why);
        TS_WARN(FAC, TS_EINVAL, "bad address '%s': %s", o->address, why);
        return TS_EINVAL;
    }
    if (o->domain && o->domain[0] && !ts_map_domain_valid(o->domain)) {
        if (err && errlen)
            snprintf(err, errlen, "bad domain '%.80s': 1 to 63 of [A-Za-z0-9._:/-]", o->domain);
        TS_WARN(FAC, TS_EINVAL, "bad domain '%.80s': 1 to 63 of [A-Za-z0-9._:/-]", o->domain);
        return TS_EINVAL;
    }
    /* TLS is chosen by tls_ca alone: a certificate without it must not mean plain TCP. */
    if ((o->tls_cert || o->tls_key) && !o->tls_ca) {
        if (err && errlen)
            snprintf(err, errlen, "%s", TS_CERT_NEEDS_CA);
        TS_WARN(FAC, TS_EINVAL, "%s", TS_CERT_NEEDS_CA);
        return TS_EINVAL;
    }
    ops = a.ops ? a.ops : o->tls_ca ? &ts_transport_tls : &ts_transport_tcp;
    p = (struct ts_conn_params){
        .host = a.host,
        .port = a.port,
        .tls_ca = o->tls_ca,
        .tls_cert = o->tls_cert,
        .tls_key = o->tls_key,
        .tls_server_name = o->tls_server_name,
        .timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms,
        .err = err,
        .errlen = errlen,
    };
    if (ops == &ts_transport_rdma) {
        /* The address is the node's control listener; the session goes to its RDMA one. */
        rc = rdma_admit(o, &a, tok, rhost, sizeof(rhost), rport, sizeof(rport), err, errlen);
        if (rc)
            return rc;
        p.host = rhost;
        p.port = rport;
        p.rdma_token = tok;
    }
    rc = ops->connect(&t, &p);
    OPENSSL_cleanse(tok, sizeof(tok));
    if (rc) {
        TS_WARN(FAC, rc, "cannot connect to %s:%s over %s%s%s", a.host, a.port, ops->name,
                err && err[0] ? ": " : "", err && err[0] ? err : "");
        return rc;
    }
    return open_on(out, map, o, t, epoch_ref, err, errlen);
}

int ts_conn_open_seed(tessera_client **out, struct ts_map **map, const struct tessera_opts *o,
                      char *err, size_t errlen)
{
    return open_addr(out, map, o, NULL, err, errlen);
}

int ts_conn_open(tessera_client **out, const struct tessera_opts *o, const uint64_t *epoch_ref,
                 char *err, size_t errlen)
{
    return open_addr(out, NULL, o, epoch_ref, err, errlen);
}

int ts_conn_shell(tessera_client **out, tessera_client *seed, uint64_t epoch)
{
    struct tessera_client *r;

    *out = NULL;
    r = calloc(1, sizeof(*r));
    if (!r)
        return TS_ENOMEM;
    r->role = seed->role;
    r->max_frame = seed->max_frame;
    r->timeout_ms = seed->timeout_ms;
    r->max_inflight = seed->max_inflight;
    r->epoch = epoch;
    snprintf(r->node, sizeof(r->node), "%s", seed->node);
    r->opts = seed->opts; /* the strings stay in seed->optbuf: move them */
    r->optbuf = seed->optbuf;
    seed->optbuf = NULL;
    ts_rx_reset(r);
    *out = r;
    return 0;
}

void ts_conn_close(tessera_client *c)
{
    struct ts_req *r;

    if (!c)
        return;
    if (c->t)
        c->t->ops->close(c->t);
    for (size_t i = 0; i < c->nlive; i++)
        ts_req_destroy(c->live[i]);
    while ((r = c->free_reqs)) {
        c->free_reqs = r->next_tx;
        ts_req_destroy(r);
    }
    free(c->live);
    free(c->rx.body);
    free(c->rx.table);
    free(c->rx.stage);
    free(c->scratch);
    ts_map_free(c->stale_map);
    free(c->optbuf);
    free(c);
}

/* ---- accessors ------------------------------------------------------------------------------ */

void ts_conn_attach(tessera_client *c, const uint64_t *epoch_ref)
{
    c->epoch_ref = epoch_ref;
}

int ts_conn_broken(const tessera_client *c)
{
    return c->broken;
}

uint64_t ts_conn_seen_epoch(const tessera_client *c)
{
    return c->seen_epoch;
}

struct ts_map *ts_conn_take_stale_map(tessera_client *c)
{
    struct ts_map *m = c->stale_map;

    c->stale_map = NULL;
    return m;
}

const struct tessera_opts *ts_conn_opts(const tessera_client *c)
{
    return &c->opts;
}

int ts_conn_timeout(const tessera_client *c)
{
    return c->timeout_ms;
}

void ts_conn_set_timeout(tessera_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : timeout_ms;
}

int ts_conn_role(const tessera_client *c)
{
    return c ? c->role : 0;
}

const char *ts_conn_error(const tessera_client *c)
{
    return c ? c->err : "";
}

const char *ts_conn_node(const tessera_client *c)
{
    return c ? c->node : "";
}
