/*
 * Raw protocol frames for tests: hand-made requests on connections of their own, over plain TCP
 * or over TLS with a test certificate (raw_connect_as), to probe a node as an attacker or a
 * broken client would.
 */
#include "harness.h"

#include "ts_common.h"
#include "ts_map.h"
#include "ts_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The TLS session of each raw connection made by raw_connect_as, by descriptor. */
#define RAW_MAX_FD 4096
static SSL *raw_ssl[RAW_MAX_FD];

static SSL *ssl_of(int fd)
{
    return fd >= 0 && fd < RAW_MAX_FD ? raw_ssl[fd] : NULL;
}

/* Forgets a TLS session left from an earlier connection that was closed with close(). */
static void forget(int fd)
{
    if (ssl_of(fd)) {
        SSL_free(raw_ssl[fd]);
        raw_ssl[fd] = NULL;
    }
}

int raw_connect(const char *addr)
{
    struct sockaddr_in sa;
    char host[64];
    const char *colon = strrchr(addr, ':');
    int fd, one = 1;

    if (!colon)
        return -1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, host, &sa.sin_addr);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    forget(fd);
    return fd;
}

int raw_connect_as(const char *addr, const char *role)
{
    static SSL_CTX *ctx[8];
    static char ctx_role[8][64];
    SSL_CTX *x = NULL;
    SSL *ssl;
    int fd, slot;

    /* One client context per certificate, made once. */
    for (slot = 0; slot < 8 && ctx[slot]; slot++)
        if (!strcmp(ctx_role[slot], role ? role : ""))
            x = ctx[slot];
    if (!x) {
        if (slot == 8)
            return -1;
        x = SSL_CTX_new(TLS_client_method());
        if (!x || SSL_CTX_load_verify_locations(x, test_cert("ca", "pem"), NULL) != 1 ||
            (role &&
             (SSL_CTX_use_certificate_chain_file(x, test_cert(role, "pem")) != 1 ||
              SSL_CTX_use_PrivateKey_file(x, test_cert(role, "key"), SSL_FILETYPE_PEM) != 1))) {
            ERR_print_errors_fp(stderr);
            SSL_CTX_free(x);
            return -1;
        }
        SSL_CTX_set_verify(x, SSL_VERIFY_PEER, NULL);
        ctx[slot] = x;
        snprintf(ctx_role[slot], sizeof(ctx_role[slot]), "%s", role ? role : "");
    }
    fd = raw_connect(addr);
    if (fd < 0 || fd >= RAW_MAX_FD)
        goto fail_fd;
    ssl = SSL_new(x);
    if (!ssl)
        goto fail_fd;
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        ERR_clear_error();
        SSL_free(ssl);
        goto fail_fd;
    }
    raw_ssl[fd] = ssl;
    return fd;
fail_fd:
    if (fd >= 0)
        close(fd);
    return -1;
}

void raw_close(int fd)
{
    forget(fd);
    if (fd >= 0)
        close(fd);
}

int raw_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    SSL *ssl = ssl_of(fd);
    while (len) {
        ssize_t n = ssl ? SSL_write(ssl, p, (int)(len > INT32_MAX ? INT32_MAX : len))
                        : send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return TS_ECONNRESET;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_send_frame(int fd, uint8_t op, uint16_t flags, uint64_t id, const void *payload, size_t len)
{
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh = {TS_PROTO_VERSION, op, flags, id, 0, (uint32_t)len};
    int rc;

    ts_frame_encode(h, &fh);
    rc = raw_send_all(fd, h, sizeof(h));
    return rc ? rc : raw_send_all(fd, payload, len);
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    SSL *ssl = ssl_of(fd);
    while (len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = ssl && SSL_pending(ssl) ? 1 : poll(&pfd, 1, timeout_ms);
        ssize_t n;
        if (r == 0)
            return TS_ETIMEDOUT;
        if (r < 0 && errno == EINTR)
            continue;
        n = ssl ? SSL_read(ssl, p, (int)(len > INT32_MAX ? INT32_MAX : len)) : recv(fd, p, len, 0);
        if (ssl && n <= 0 && SSL_get_error(ssl, (int)n) == SSL_ERROR_WANT_READ)
            continue; /* only TLS records without data (session tickets) arrived */
        if (n <= 0)
            return TS_ECONNRESET;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_recv_reply(int fd, int timeout_ms, uint64_t *id, char *msg, size_t cap, uint8_t **payload,
                   size_t *plen)
{
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh;
    uint8_t *p;
    int rc, status;

    if (msg && cap)
        msg[0] = '\0';
    rc = read_full(fd, h, sizeof(h), timeout_ms);
    if (rc)
        return rc;
    if (ts_frame_parse(h, sizeof(h), UINT32_MAX, &fh) != TS_HDR_LEN || !(fh.flags & TS_F_REPLY) ||
        fh.length < 4)
        return TS_EPROTO;
    p = malloc(fh.length);
    if (!p)
        return TS_ENOMEM;
    rc = read_full(fd, p, fh.length, timeout_ms);
    if (rc) {
        free(p);
        return rc;
    }
    status = (int)ts_get_le32(p);
    if (id)
        *id = fh.req_id;
    if (status && msg && cap && fh.length >= 6) {
        struct ts_rd r;
        ts_rd_init(&r, p + 4, fh.length - 4);
        ts_rd_str(&r, msg, cap);
    }
    if (payload) {
        *payload = p;
        *plen = fh.length;
    } else {
        free(p);
    }
    return status;
}

int raw_wait_closed(int fd, int timeout_ms)
{
    char buf[4096];
    SSL *ssl = ssl_of(fd);
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = ssl && SSL_pending(ssl) ? 1 : poll(&pfd, 1, timeout_ms);
        if (r <= 0)
            return 0;
        ssize_t n = ssl ? SSL_read(ssl, buf, sizeof(buf)) : recv(fd, buf, sizeof(buf), 0);
        if (ssl && n <= 0 && SSL_get_error(ssl, (int)n) == SSL_ERROR_WANT_READ)
            continue;
        if (n <= 0)
            return 1;
    }
}

int raw_read_shard(const char *addr, const char *ds, uint32_t shard, size_t len, uint8_t *out,
                   size_t *got)
{
    int fd = raw_connect(addr), rc;
    struct ts_wr w;
    uint8_t *p = NULL;
    size_t plen = 0, off = 0;
    struct ts_rd r;
    uint32_t npieces;
    const uint8_t *table;

    *got = 0;
    if (fd < 0)
        return TS_ECONNREFUSED;
    ts_wr_init(&w);
    ts_wr_str(&w, ds);
    ts_wr_u32(&w, shard);
    ts_wr_u64(&w, 0);
    ts_wr_u32(&w, (uint32_t)len);
    rc = raw_send_frame(fd, TS_OP_READ, 0, 1, w.buf, w.len);
    ts_wr_fini(&w);
    if (rc == 0)
        rc = raw_recv_reply(fd, 10000, NULL, NULL, 0, &p, &plen);
    close(fd);
    if (rc) {
        free(p);
        return rc;
    }
    ts_rd_init(&r, p + 4, plen - 4);
    ts_rd_u64(&r);
    npieces = ts_rd_u32(&r);
    table = ts_rd_bytes(&r, 8 * (size_t)npieces);
    if (!table)
        rc = TS_EPROTO;
    for (uint32_t i = 0; table && i < npieces && !rc; i++) {
        uint32_t plen32 = ts_get_le32(table + 8 * i), crc = ts_get_le32(table + 8 * i + 4);
        const uint8_t *data = ts_rd_bytes(&r, plen32);
        if (!data || off + plen32 > len)
            rc = TS_EPROTO;
        else if (ts_crc32c(0, data, plen32) != crc)
            rc = TS_ECORRUPT;
        else
            memcpy(out + off, data, plen32);
        off += plen32;
    }
    free(p);
    *got = off;
    return rc;
}

int raw_map_push(const char *tls_addr, const struct ts_map *m)
{
    int fd = raw_connect_as(tls_addr, "admin"), rc;
    struct ts_wr w;

    if (fd < 0)
        return TS_ECONNREFUSED;
    ts_wr_init(&w);
    ts_map_encode(&w, m);
    rc = raw_send_frame(fd, TS_OP_MAP_PUSH, 0, 1, w.buf, w.len);
    ts_wr_fini(&w);
    if (rc == 0)
        rc = raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL);
    raw_close(fd);
    return rc;
}

struct ts_map *raw_map_get(const char *addr)
{
    int fd = raw_connect(addr);
    uint8_t *p = NULL;
    size_t plen = 0;
    struct ts_map *m = NULL;
    struct ts_rd r;

    if (fd < 0)
        return NULL;
    if (raw_send_frame(fd, TS_OP_MAP_GET, 0, 1, NULL, 0) == 0 &&
        raw_recv_reply(fd, 5000, NULL, NULL, 0, &p, &plen) == 0 && plen >= 4) {
        ts_rd_init(&r, p + 4, plen - 4);
        ts_map_decode(&r, &m);
    }
    free(p);
    close(fd);
    return m;
}

int raw_pg_info(const char *addr, uint32_t pg, struct raw_pginfo *pi)
{
    int fd = raw_connect(addr), rc;
    struct ts_wr w;
    uint8_t *p = NULL;
    size_t plen = 0;
    struct ts_rd r;

    memset(pi, 0, sizeof(*pi));
    if (fd < 0)
        return TS_ECONNREFUSED;
    ts_wr_init(&w);
    ts_wr_u32(&w, pg);
    rc = raw_send_frame(fd, TS_OP_PG_INFO, 0, 1, w.buf, w.len);
    ts_wr_fini(&w);
    if (rc == 0)
        rc = raw_recv_reply(fd, 5000, NULL, NULL, 0, &p, &plen);
    close(fd);
    if (rc == 0) {
        ts_rd_init(&r, p + 4, plen - 4);
        pi->applied = ts_rd_u64(&r);
        pi->oldest = ts_rd_u64(&r);
        pi->head_epoch = ts_rd_u64(&r);
        pi->promised = ts_rd_u64(&r);
        pi->les = ts_rd_u64(&r);
        if (r.err)
            rc = TS_EPROTO;
    }
    free(p);
    return rc;
}

char *raw_status_json(const char *addr)
{
    int fd = raw_connect(addr);
    uint8_t *p = NULL;
    size_t plen = 0;
    char *txt = NULL;

    if (fd < 0)
        return NULL;
    if (raw_send_frame(fd, TS_OP_STATUS, 0, 1, NULL, 0) == 0 &&
        raw_recv_reply(fd, 5000, NULL, NULL, 0, &p, &plen) == 0 && plen > 4 &&
        (txt = malloc(plen)) != NULL) {
        struct ts_rd r;
        ts_rd_init(&r, p + 4, plen - 4);
        ts_rd_str(&r, txt, plen);
    }
    free(p);
    close(fd);
    return txt;
}

int64_t raw_status_read_bytes(const char *addr)
{
    char *txt = raw_status_json(addr), *st = txt ? strstr(txt, "\"stats\":{") : NULL;
    char *rb = st ? strstr(st, "\"read_bytes\":") : NULL;
    int64_t v = rb ? strtoll(rb + strlen("\"read_bytes\":"), NULL, 10) : -1;

    free(txt);
    return v;
}

int raw_status_has(const char *addr, const char *needle)
{
    char *txt = raw_status_json(addr);
    int found = txt && strstr(txt, needle) != NULL;

    free(txt);
    return found;
}

int tsd_http_get(const char *addr, const char *path, char *body, size_t cap)
{
    char host[64], req[4096];
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    size_t got = 0;
    int fd, code = -1;
    ssize_t k;

    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, host, &sa.sin_addr);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr);
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    while (got + 1 < cap && (k = read(fd, body + got, cap - 1 - got)) > 0)
        got += (size_t)k;
    close(fd);
    body[got] = 0;
    if (sscanf(body, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    {
        char *p = strstr(body, "\r\n\r\n");
        if (p)
            memmove(body, p + 4, strlen(p + 4) + 1);
    }
    return code;
}

double tsd_metric(const struct tsd_proc *p, const char *name)
{
    FILE *f = fopen(p->log, "r");
    char line[1024], addr[64] = "", *body = malloc(1 << 20), *at;
    size_t nl = strlen(name);
    double v = -1;

    while (f && fgets(line, sizeof(line), f)) {
        char *m = strstr(line, "tesserad ready");
        if (m && (m = strstr(m, " metrics=")))
            sscanf(m + 9, "%63s", addr);
    }
    if (f)
        fclose(f);
    if (!body || !addr[0] || !strcmp(addr, "-") ||
        tsd_http_get(addr, "/metrics", body, 1 << 20) != 200) {
        free(body);
        return -1;
    }
    for (at = body; (at = strstr(at, name)) != NULL; at += nl)
        if ((at == body || at[-1] == '\n') && (at[nl] == ' ' || at[nl] == '{')) {
            char *sp = strchr(at, ' ');
            if (sp)
                v = strtod(sp + 1, NULL);
            break;
        }
    free(body);
    return v;
}
