/*
 * `tessera top --prometheus URL`: one instant query to Prometheus's HTTP API over a plain TCP
 * socket (HTTP/1.0, so the reply is never chunked), and its parse (cli_top.h).
 */
#include "cli_top.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tessera/errno.h"

#define REPLY_MAX (4u << 20)

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "http://HOST[:PORT][/PREFIX]" into its parts; 0 or TS_EINVAL. */
static int url_split(const char *url, char *host, size_t hcap, char *port, size_t pcap,
                     char *prefix, size_t xcap)
{
    const char *h, *slash, *colon, *end;

    if (strncmp(url, "http://", 7) != 0)
        return TS_EINVAL;
    h = url + 7;
    slash = strchr(h, '/');
    end = slash ? slash : h + strlen(h);
    colon = memchr(h, ':', (size_t)(end - h));
    if (h[0] == '[') /* [v6]:port */
        colon = memchr(h, ']', (size_t)(end - h)) ? strchr(memchr(h, ']', (size_t)(end - h)), ':')
                                                  : NULL;
    if ((size_t)((colon ? colon : end) - h) >= hcap || (colon ? colon : end) == h)
        return TS_EINVAL;
    snprintf(host, hcap, "%.*s", (int)((colon ? colon : end) - h), h);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    snprintf(port, pcap, "%.*s", colon ? (int)(end - colon - 1) : 2, colon ? colon + 1 : "80");
    snprintf(prefix, xcap, "%s", slash ? slash : "");
    if (prefix[0] && prefix[strlen(prefix) - 1] == '/')
        prefix[strlen(prefix) - 1] = '\0';
    return port[0] ? 0 : TS_EINVAL;
}

static void url_encode(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;

    for (; *s && o + 4 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-_.~", c)) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
}

/* Connects to host:port within the deadline; the socket, or a negative TS_E*. */
static int dial(const char *host, const char *port, long long deadline, char *err, size_t cap)
{
    struct addrinfo hints = {0}, *ai = NULL, *a;
    int fd = -1, rc, gai;

    hints.ai_socktype = SOCK_STREAM;
    gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) {
        snprintf(err, cap, "%s:%s: %s", host, port, gai_strerror(gai));
        return TS_EUNAVAIL;
    }
    rc = TS_EUNAVAIL;
    for (a = ai; a; a = a->ai_next) {
        struct timeval tv;
        long long left = deadline - now_ms();
        if (left <= 0) {
            rc = TS_ETIMEDOUT;
            break;
        }
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        tv.tv_sec = left / 1000;
        tv.tv_usec = (left % 1000) * 1000;
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* bounds connect() too */
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            rc = fd;
            break;
        }
        snprintf(err, cap, "%s:%s: %s", host, port, strerror(errno));
        rc = errno == EINPROGRESS || errno == EAGAIN ? TS_ETIMEDOUT : TS_EUNAVAIL;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return rc;
}

int cli_prom_query(const char *url, const char *q, int timeout_ms, char **body, char *err,
                   size_t cap)
{
    char host[256], port[16], prefix[256], eq[1024], req[2048];
    long long deadline = now_ms() + timeout_ms;
    size_t n = 0, rcap = 8192;
    char *buf = NULL, *p;
    int fd, rc, len;

    *body = NULL;
    err[0] = '\0';
    if (url_split(url, host, sizeof(host), port, sizeof(port), prefix, sizeof(prefix))) {
        snprintf(err, cap, "'%s' is not http://HOST:PORT", url);
        return TS_EINVAL;
    }
    url_encode(q, eq, sizeof(eq));
    len = snprintf(req, sizeof(req),
                   "GET %s/api/v1/query?query=%s HTTP/1.0\r\nHost: %s:%s\r\n"
                   "Accept: application/json\r\nUser-Agent: tessera-top\r\n\r\n",
                   prefix, eq, host, port);
    fd = dial(host, port, deadline, err, cap);
    if (fd < 0)
        return fd;
    if (send(fd, req, (size_t)len, MSG_NOSIGNAL) != len) {
        snprintf(err, cap, "send: %s", strerror(errno));
        rc = TS_EUNAVAIL;
        goto out_close;
    }
    buf = malloc(rcap);
    if (!buf) {
        rc = TS_ENOMEM;
        goto out_close;
    }
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        long long left = deadline - now_ms();
        ssize_t got;
        if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
            snprintf(err, cap, "no complete reply within %d ms", timeout_ms);
            rc = TS_ETIMEDOUT;
            goto out_free;
        }
        if (n + 1 == rcap) {
            char *nb = rcap < REPLY_MAX ? realloc(buf, rcap * 2) : NULL;
            if (!nb) {
                snprintf(err, cap, "reply larger than %u bytes", REPLY_MAX);
                rc = TS_EPROTO;
                goto out_free;
            }
            buf = nb;
            rcap *= 2;
        }
        got = recv(fd, buf + n, rcap - n - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(err, cap, "recv: %s", strerror(errno));
            rc = TS_EUNAVAIL;
            goto out_free;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    p = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || !p || strncmp(buf + 8, " 200", 4) != 0) {
        snprintf(err, cap, "HTTP reply: %.*s", (int)strcspn(buf, "\r\n"), buf);
        rc = TS_EPROTO;
        goto out_free;
    }
    memmove(buf, p + 4, strlen(p + 4) + 1);
    *body = buf;
    buf = NULL;
    rc = 0;
out_free:
    free(buf);
out_close:
    close(fd);
    return rc;
}

static int stall_cmp(const void *a, const void *b)
{
    const struct cli_top_stall *x = a, *y = b;
    return x->stall_per_s < y->stall_per_s ? 1 : x->stall_per_s > y->stall_per_s ? -1 : 0;
}

int cli_prom_parse_stalls(const char *body, struct cli_top_stall *out, size_t cap, size_t *n,
                          char *err, size_t errcap)
{
    struct json_object *doc = json_tokener_parse(body), *st, *res;
    int rc = TS_EPROTO;

    *n = 0;
    if (!doc) {
        snprintf(err, errcap, "the reply is not JSON");
        return TS_EPROTO;
    }
    st = cli_json_get(doc, "status");
    if (!st || strcmp(json_object_get_string(st), "success") != 0) {
        struct json_object *e = cli_json_get(doc, "error");
        snprintf(err, errcap, "query failed: %s", e ? json_object_get_string(e) : "no status");
        goto out_put;
    }
    res = cli_json_get(doc, "data.result");
    if (!res || !json_object_is_type(res, json_type_array)) {
        snprintf(err, errcap, "no data.result in the reply");
        goto out_put;
    }
    for (size_t i = 0; i < json_object_array_length(res) && *n < cap; i++) {
        struct json_object *e = json_object_array_get_idx(res, i), *rank, *val, *v;
        rank = cli_json_get(e, "metric.rank");
        val = cli_json_get(e, "value");
        if (!val || !json_object_is_type(val, json_type_array) || json_object_array_length(val) < 2)
            continue;
        v = json_object_array_get_idx(val, 1);
        snprintf(out[*n].rank, sizeof(out[*n].rank), "%s",
                 rank ? json_object_get_string(rank) : "?");
        out[*n].stall_per_s = strtod(json_object_get_string(v), NULL);
        (*n)++;
    }
    qsort(out, *n, sizeof(*out), stall_cmp);
    rc = 0;
out_put:
    json_object_put(doc);
    return rc;
}
