/*
 * tsload: one load generator for tessera and the systems it is compared with.
 *
 * Every system is driven with the same shape: N connections, one thread and one blocking
 * connection each, one request in flight per connection (or D with --depth, where the protocol
 * allows pipelining), random keys from the same key space, a warm-up and then a fixed
 * measurement window (or a fixed count). Latency is measured per request, from the moment it
 * is sent to the moment its last byte is in the caller's buffer.
 *
 *   tessera    libtessera (tessera_read, or tessera_read_submit/tessera_wait_any with --depth);
 *              the library verifies every piece's CRC32C. TCP, or TLS with --tls.
 *   http       HTTP/1.1 keep-alive GET /PREFIX/KEY, Content-Length checked. HTTPS with --tls.
 *   redis      RESP GET PREFIX:KEY. TLS with --tls.
 *   memcache   text protocol "get PREFIX:KEY". TLS with --tls.
 *
 * Peers' values are checked by length and by their first 8 bytes (the data set is generated
 * by this tool: `tsload load`). TLS is 1.3 with TLS_AES_128_GCM_SHA256 only, the server
 * certificate verified against --ca for 127.0.0.1.
 *
 * Commands:
 *   tsload read  [options]   the load test; prints one JSON object on stdout
 *   tsload load  [options]   writes the data set into the system (http: files under --dir)
 *   tsload write [options]   small writes, timed like read: --conns connections, each writing
 *                            --size objects one at a time (redis SET, memcache set; tessera: a
 *                            sealed shard of --size bytes per write, a new shard each time)
 *   tsload put   [options]   upload throughput: --count shards of --size bytes (--proto http:
 *                            the same bytes as --chunk-sized WebDAV PUTs, /PREFIX/SHARD-I)
 *   tsload tfrecord [options] writes --count TFRecord files of about --size bytes each into
 *                            --dir, records of --record bytes (the input of `tessera ingest`)
 *   tsload ports N           prints N free loopback TCP ports
 *   tsload wait  --addr A    waits until A accepts TCP connections (--timeout seconds)
 *
 * With --server-pid PID[,PID...] the server's CPU time (utime+stime from /proc/PID/stat) is
 * sampled at the edges of the measurement window, and its peak RSS (VmHWM, reset at the start
 * with --reset-hwm through /proc/PID/clear_refs) is read at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tessera/tessera.h>

#define BENCH_TOOL "tsload"
#include "bench_util.h"

#define MAX_PIDS 8
#define MAX_DEPTH 256
#define RBUF_SIZE (64u << 10)
#define CIPHER "TLS_AES_128_GCM_SHA256"

enum proto { P_TESSERA, P_HTTP, P_REDIS, P_MEMCACHE };
static const char *const proto_names[] = {"tessera", "http", "redis", "memcache"};

struct cfg {
    const char *cmd;
    enum proto proto;
    int tls;
    const char *addr;
    char host[64];
    int port;
    const char *ca;
    const char *cert, *key;  /* tessera: a client certificate (a cluster's writer role) */
    unsigned core, min_core; /* tessera: the dataset's replicas (a cluster; 1 1) */
    size_t record;           /* tfrecord: payload bytes per record */
    unsigned conns;
    unsigned depth;
    double duration;
    double warmup;
    uint64_t count;
    size_t size;
    uint32_t nkeys;
    const char *prefix;
    uint32_t per_shard;
    uint32_t chunk;
    int pids[MAX_PIDS];
    int npids;
    int reset_hwm;
    int cleanup;
    const char *label;
    const char *dir;
    uint64_t seed;
    double timeout;
    SSL_CTX *ssl_ctx;
    int write; /* tsload write: the workers write instead of reading */
    /* measurement window, CLOCK_MONOTONIC ns; set by main after every worker connected */
    int64_t t0, t1;
};

struct worker {
    pthread_t thr;
    struct cfg *c;
    unsigned idx;
    uint64_t ops;
    uint64_t bytes;
    uint32_t *lat; /* ns, one per measured request */
    size_t nlat, caplat;
    int64_t last_end;
    int failed;
    char err[256];
    char cipher[64];
};

static atomic_int g_stop;
static pthread_barrier_t g_ready;

/* ---- small helpers -------------------------------------------------------------------- */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static int fail(struct worker *w, const char *fmt, ...)
{
    va_list ap;
    if (!w->failed) {
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof(w->err), fmt, ap);
        va_end(ap);
    }
    w->failed = 1;
    atomic_store(&g_stop, 1);
    return -1;
}

/* The data set: object KEY of PREFIX is SIZE bytes of a splitmix64 stream seeded by both, so
 * every system holds the same bytes and a reader can check the first word cheaply (mix64 in
 * bench_util.h). */
static uint64_t obj_seed(const struct cfg *c, uint32_t key)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = c->prefix; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return mix64(c->seed ^ h ^ ((uint64_t)key << 20));
}

static void obj_fill(const struct cfg *c, uint32_t key, uint8_t *p, size_t n)
{
    uint64_t s = obj_seed(c, key);
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v = mix64(s + i);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = mix64(s + i);
        memcpy(p + i, &v, n - i);
    }
}

static int obj_check(const struct cfg *c, uint32_t key, const uint8_t *p, size_t n)
{
    uint64_t v = mix64(obj_seed(c, key));
    return memcmp(p, &v, n < 8 ? n : 8) == 0;
}

static uint64_t rnd_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void lat_add(struct worker *w, int64_t ns)
{
    if (w->nlat == w->caplat) {
        size_t cap = w->caplat ? w->caplat * 2 : 65536;
        uint32_t *p = realloc(w->lat, cap * sizeof(*p));
        if (!p)
            die("out of memory");
        w->lat = p;
        w->caplat = cap;
    }
    w->lat[w->nlat++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

/* Accounts one request sent at ts and complete at te, if it lies inside the window. */
static void account(struct worker *w, int64_t ts, int64_t te, size_t bytes)
{
    struct cfg *c = w->c;
    if (ts >= c->t0 && te <= c->t1) {
        w->ops++;
        w->bytes += bytes;
        lat_add(w, te - ts);
        if (te > w->last_end)
            w->last_end = te;
    }
}

/* Whether a new request may start at time t. */
static int keep_going(struct worker *w, int64_t t)
{
    struct cfg *c = w->c;
    if (atomic_load(&g_stop))
        return 0;
    if (c->count)
        return w->ops < (c->count + c->conns - 1 - w->idx) / c->conns;
    return t < c->t1;
}

/* ---- connections to the peers (blocking socket, optional TLS) ------------------------- */

struct conn {
    int fd;
    SSL *ssl;
    char *rb;
    size_t head, tail;
};

static int tcp_connect(const struct cfg *c)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    int fd, one = 1;

    if (inet_pton(AF_INET, c->host, &sa.sin_addr) != 1)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static const char *ssl_errstr(void)
{
    static _Thread_local char buf[200];
    unsigned long e = ERR_get_error();
    if (!e)
        return "connection closed or I/O error";
    ERR_error_string_n(e, buf, sizeof(buf));
    return buf;
}

static int conn_open(struct worker *w, struct conn *k)
{
    struct cfg *c = w->c;

    memset(k, 0, sizeof(*k));
    k->rb = malloc(RBUF_SIZE);
    if (!k->rb)
        return fail(w, "out of memory");
    k->fd = tcp_connect(c);
    if (k->fd < 0)
        return fail(w, "connect %s: %s", c->addr, strerror(errno));
    if (!c->tls)
        return 0;
    k->ssl = SSL_new(c->ssl_ctx);
    if (!k->ssl)
        return fail(w, "SSL_new: %s", ssl_errstr());
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(k->ssl), c->host);
    SSL_set_fd(k->ssl, k->fd);
    if (SSL_connect(k->ssl) != 1)
        return fail(w, "TLS handshake with %s: %s", c->addr, ssl_errstr());
    snprintf(w->cipher, sizeof(w->cipher), "%s", SSL_get_cipher_name(k->ssl));
    return 0;
}

static void conn_close(struct conn *k)
{
    if (k->ssl) {
        SSL_free(k->ssl);
        k->ssl = NULL;
    }
    if (k->fd > 0)
        close(k->fd);
    k->fd = -1;
    free(k->rb);
    k->rb = NULL;
}

/* Reads at most n bytes; > 0 on success, -1 on EOF or error. */
static ssize_t conn_read(struct conn *k, void *buf, size_t n)
{
    if (k->ssl) {
        int r = SSL_read(k->ssl, buf, n > INT32_MAX ? INT32_MAX : (int)n);
        return r > 0 ? r : -1;
    }
    for (;;) {
        ssize_t r = recv(k->fd, buf, n, 0);
        if (r > 0)
            return r;
        if (r < 0 && errno == EINTR)
            continue;
        return -1;
    }
}

static int conn_write(struct conn *k, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t r;
        if (k->ssl) {
            int s = SSL_write(k->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);
            r = s > 0 ? s : -1;
        } else {
            r = send(k->fd, p, n, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR)
                continue;
        }
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int conn_fill(struct conn *k)
{
    ssize_t r;
    if (k->head == k->tail) {
        k->head = k->tail = 0;
    } else if (k->tail == RBUF_SIZE) {
        if (k->head == 0)
            return -1; /* a line longer than the buffer */
        memmove(k->rb, k->rb + k->head, k->tail - k->head);
        k->tail -= k->head;
        k->head = 0;
    }
    r = conn_read(k, k->rb + k->tail, RBUF_SIZE - k->tail);
    if (r < 0)
        return -1;
    k->tail += (size_t)r;
    return 0;
}

/* The next CRLF-terminated line, NUL-terminated in place (valid until the next read). */
static char *conn_line(struct conn *k)
{
    size_t scan = k->head;
    for (;;) {
        char *p = k->tail > scan ? memchr(k->rb + scan, '\n', k->tail - scan) : NULL;
        if (p) {
            char *line = k->rb + k->head;
            size_t len = (size_t)(p - line);
            if (len && line[len - 1] == '\r')
                len--;
            line[len] = '\0';
            k->head = (size_t)(p - k->rb) + 1;
            return line;
        }
        scan = k->tail;
        size_t before = k->head;
        if (conn_fill(k) < 0)
            return NULL;
        scan -= before - k->head; /* the buffer may have been compacted */
    }
}

/* n bytes of body into dst: what is buffered is copied, the rest is received in place. */
static int conn_body(struct conn *k, void *dst, size_t n)
{
    size_t have = k->tail - k->head, take = have < n ? have : n;
    char *d = dst;
    memcpy(d, k->rb + k->head, take);
    k->head += take;
    for (size_t got = take; got < n;) {
        ssize_t r = conn_read(k, d + got, n - got);
        if (r < 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int conn_crlf(struct conn *k)
{
    char *l = conn_line(k);
    return l && l[0] == '\0' ? 0 : -1;
}

/* ---- the peers' requests and replies ------------------------------------------------- */

static size_t build_get(const struct cfg *c, uint32_t key, char *buf, size_t cap)
{
    char k[160];
    int kl = snprintf(k, sizeof(k), "%s:%" PRIu32, c->prefix, key);
    switch (c->proto) {
    case P_HTTP:
        return (size_t)snprintf(buf, cap, "GET /%s/%" PRIu32 " HTTP/1.1\r\nHost: %s\r\n\r\n",
                                c->prefix, key, c->host);
    case P_REDIS:
        return (size_t)snprintf(buf, cap, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, k);
    case P_MEMCACHE:
        return (size_t)snprintf(buf, cap, "get %s\r\n", k);
    default:
        return 0;
    }
}

/* Receives one GET reply into dst and checks it is the object asked for. */
static int recv_get(struct worker *w, struct conn *k, uint32_t key, uint8_t *dst)
{
    const struct cfg *c = w->c;
    long long len = -1;
    char *l;

    switch (c->proto) {
    case P_HTTP: {
        int status = 0, close_after = 0;
        l = conn_line(k);
        if (!l || sscanf(l, "HTTP/1.%*d %d", &status) != 1)
            return fail(w, "bad HTTP status line");
        while ((l = conn_line(k)) && l[0]) {
            if (!strncasecmp(l, "content-length:", 15))
                len = strtoll(l + 15, NULL, 10);
            else if (!strncasecmp(l, "connection:", 11) && strcasestr(l + 11, "close"))
                close_after = 1;
        }
        if (!l)
            return fail(w, "connection lost in HTTP headers");
        if (status != 200)
            return fail(w, "HTTP status %d for /%s/%" PRIu32, status, c->prefix, key);
        if (close_after)
            return fail(w, "server closes the connection (no keep-alive)");
        break;
    }
    case P_REDIS:
        l = conn_line(k);
        if (!l)
            return fail(w, "connection lost");
        if (l[0] != '$')
            return fail(w, "redis replied '%.80s'", l);
        len = strtoll(l + 1, NULL, 10);
        if (len < 0)
            return fail(w, "redis: no key %s:%" PRIu32, c->prefix, key);
        break;
    case P_MEMCACHE: {
        char *sp;
        l = conn_line(k);
        if (!l)
            return fail(w, "connection lost");
        if (strncmp(l, "VALUE ", 6) || !(sp = strrchr(l, ' ')))
            return fail(w, "memcached replied '%.80s' for %s:%" PRIu32, l, c->prefix, key);
        len = strtoll(sp + 1, NULL, 10);
        break;
    }
    default:
        return -1;
    }
    if (len != (long long)c->size)
        return fail(w, "%s:%" PRIu32 ": %lld bytes, expected %zu", c->prefix, key, len, c->size);
    if (conn_body(k, dst, c->size) < 0)
        return fail(w, "connection lost in a value");
    if (c->proto == P_REDIS || c->proto == P_MEMCACHE) {
        if (conn_crlf(k) < 0)
            return fail(w, "missing CRLF after a value");
    }
    if (c->proto == P_MEMCACHE) {
        l = conn_line(k);
        if (!l || strcmp(l, "END"))
            return fail(w, "memcached: no END after a value");
    }
    if (!obj_check(c, key, dst, c->size))
        return fail(w, "%s:%" PRIu32 ": wrong content", c->prefix, key);
    return 0;
}

static void run_peer(struct worker *w)
{
    struct cfg *c = w->c;
    struct conn k;
    uint64_t rs = mix64(c->seed + 7919 * (w->idx + 1));
    uint8_t *dst = malloc(c->size ? c->size : 1);
    struct {
        uint32_t key;
        int64_t ts;
    } ring[MAX_DEPTH];
    unsigned head = 0, inflight = 0;
    char req[512 * 4];

    if (!dst) {
        fail(w, "out of memory");
        pthread_barrier_wait(&g_ready);
        return;
    }
    conn_open(w, &k);
    pthread_barrier_wait(&g_ready);
    if (w->failed)
        goto out;
    sleep_until(c->t0 - (int64_t)(c->warmup * 1e9));

    /* D requests in flight (1 unless pipelined); replies come back in order. */
    while (inflight < c->depth && keep_going(w, now_ns())) {
        unsigned slot = (head + inflight) % MAX_DEPTH;
        uint32_t key = (uint32_t)(rnd_next(&rs) % c->nkeys);
        size_t n = build_get(c, key, req, sizeof(req));
        ring[slot].key = key;
        ring[slot].ts = now_ns();
        if (conn_write(&k, req, n) < 0) {
            fail(w, "send failed");
            goto out;
        }
        inflight++;
    }
    while (inflight) {
        int64_t te;
        if (recv_get(w, &k, ring[head].key, dst) < 0)
            goto out;
        te = now_ns();
        account(w, ring[head].ts, te, c->size);
        head = (head + 1) % MAX_DEPTH;
        inflight--;
        if (keep_going(w, te)) {
            unsigned slot = (head + inflight) % MAX_DEPTH;
            uint32_t key = (uint32_t)(rnd_next(&rs) % c->nkeys);
            size_t n = build_get(c, key, req, sizeof(req));
            ring[slot].key = key;
            ring[slot].ts = now_ns();
            if (conn_write(&k, req, n) < 0) {
                fail(w, "send failed");
                goto out;
            }
            inflight++;
        }
    }
out:
    conn_close(&k);
    free(dst);
}

/* ---- tessera through libtessera ----------------------------------------------------- */

static int ts_open(struct worker *w, tessera_client **out)
{
    struct cfg *c = w->c;
    struct tessera_opts o;
    int rc;

    tessera_opts_init(&o);
    o.address = c->addr;
    o.client_name = "tsload";
    o.max_inflight = c->depth > 64 ? c->depth : 64;
    if (c->tls) {
        o.tls_ca = c->ca;
        o.tls_cert = c->cert;
        o.tls_key = c->key;
    }
    rc = tessera_client_open(out, &o);
    if (rc)
        return fail(w, "tessera_client_open %s: %s (%s)", c->addr, ts_strerror(rc), ts_errname(rc));
    if (c->tls)
        snprintf(w->cipher, sizeof(w->cipher), "(server-forced)");
    return 0;
}

static void ts_locate(const struct cfg *c, uint32_t key, uint32_t *shard, uint64_t *off)
{
    *shard = key / c->per_shard;
    *off = (uint64_t)(key % c->per_shard) * c->size;
}

static void run_tessera(struct worker *w)
{
    struct cfg *c = w->c;
    tessera_client *tc = NULL;
    uint64_t rs = mix64(c->seed + 7919 * (w->idx + 1));
    struct {
        uint64_t op;
        uint32_t key;
        int64_t ts;
        uint8_t *buf;
        int busy;
    } slot[MAX_DEPTH];
    unsigned inflight = 0;
    int rc;

    memset(slot, 0, sizeof(slot));
    for (unsigned i = 0; i < c->depth; i++) {
        slot[i].buf = malloc(c->size ? c->size : 1);
        if (!slot[i].buf)
            fail(w, "out of memory");
    }
    if (!w->failed)
        ts_open(w, &tc);
    pthread_barrier_wait(&g_ready);
    if (w->failed)
        goto out;
    sleep_until(c->t0 - (int64_t)(c->warmup * 1e9));

    for (;;) {
        /* fill every free slot, then collect one */
        for (unsigned i = 0; i < c->depth && keep_going(w, now_ns()); i++) {
            uint32_t shard;
            uint64_t off;
            if (slot[i].busy)
                continue;
            slot[i].key = (uint32_t)(rnd_next(&rs) % c->nkeys);
            ts_locate(c, slot[i].key, &shard, &off);
            slot[i].ts = now_ns();
            if (c->depth == 1) {
                size_t n = 0;
                int64_t te;
                rc = tessera_read(tc, c->prefix, shard, off, c->size, slot[i].buf, &n);
                te = now_ns();
                if (rc) {
                    fail(w, "read %s/%u@%" PRIu64 ": %s (%s) %s", c->prefix, shard, off,
                         ts_strerror(rc), ts_errname(rc), tessera_client_error(tc));
                    goto out;
                }
                if (n != c->size || !obj_check(c, slot[i].key, slot[i].buf, n)) {
                    fail(w, "read %s/%u@%" PRIu64 ": %zu bytes or wrong content", c->prefix, shard,
                         off, n);
                    goto out;
                }
                account(w, slot[i].ts, te, n);
                i--; /* same slot again */
                continue;
            }
            rc = tessera_read_submit(tc, c->prefix, shard, off, c->size, slot[i].buf, &slot[i].op);
            if (rc) {
                fail(w, "submit %s/%u: %s (%s) %s", c->prefix, shard, ts_strerror(rc),
                     ts_errname(rc), tessera_client_error(tc));
                goto out;
            }
            slot[i].busy = 1;
            inflight++;
        }
        if (!inflight)
            break;
        {
            uint64_t op;
            size_t n = 0;
            int64_t te;
            unsigned i;
            rc = tessera_wait_any(tc, &op, &n);
            te = now_ns();
            for (i = 0; i < c->depth; i++)
                if (slot[i].busy && slot[i].op == op)
                    break;
            if (i == c->depth) {
                fail(w, "wait_any returned an unknown op %" PRIu64 " (rc %d)", op, rc);
                goto out;
            }
            slot[i].busy = 0;
            inflight--;
            if (rc) {
                fail(w, "read: %s (%s) %s", ts_strerror(rc), ts_errname(rc),
                     tessera_client_error(tc));
                goto out;
            }
            if (n != c->size || !obj_check(c, slot[i].key, slot[i].buf, n)) {
                fail(w, "read key %u: %zu bytes or wrong content", slot[i].key, n);
                goto out;
            }
            account(w, slot[i].ts, te, n);
        }
    }
out:
    tessera_client_close(tc);
    for (unsigned i = 0; i < c->depth; i++)
        free(slot[i].buf);
}

/* tsload write: one object at a time per connection; keys cycle through --keys per worker
 * (peers overwrite them), tessera writes shard (worker << 20) + n, each a new sealed shard. */
static void run_write(struct worker *w)
{
    struct cfg *c = w->c;
    uint8_t *buf = malloc(c->size);
    tessera_client *tc = NULL;
    struct conn k = {0};
    char hdr[512], key[160];

    if (!buf)
        fail(w, "out of memory");
    else if (c->proto == P_TESSERA)
        ts_open(w, &tc);
    else
        conn_open(w, &k);
    pthread_barrier_wait(&g_ready);
    if (w->failed)
        goto out;
    sleep_until(c->t0 - (int64_t)(c->warmup * 1e9));
    for (uint32_t n = 0; keep_going(w, now_ns()); n++) {
        uint32_t id = (w->idx << 20) | (n & 0xfffff);
        int64_t ts;
        obj_fill(c, id, buf, c->size);
        ts = now_ns();
        if (c->proto == P_TESSERA) {
            int rc = tessera_put(tc, c->prefix, id, buf, c->size, NULL, 0);
            if (rc) {
                fail(w, "put %s/%u: %s (%s) %s", c->prefix, id, ts_strerror(rc), ts_errname(rc),
                     tessera_client_error(tc));
                goto out;
            }
        } else {
            int kl = snprintf(key, sizeof(key), "%s:w%u:%u", c->prefix, w->idx, n % c->nkeys);
            size_t hn =
                c->proto == P_REDIS
                    ? (size_t)snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n",
                                       kl, key, c->size)
                    : (size_t)snprintf(hdr, sizeof(hdr), "set %s 0 0 %zu\r\n", key, c->size);
            char *l;
            if (conn_write(&k, hdr, hn) < 0 || conn_write(&k, buf, c->size) < 0 ||
                conn_write(&k, "\r\n", 2) < 0 || !(l = conn_line(&k))) {
                fail(w, "set %s: connection lost", key);
                goto out;
            }
            if (strcmp(l, c->proto == P_REDIS ? "+OK" : "STORED")) {
                fail(w, "set %s: '%.100s'", key, l);
                goto out;
            }
        }
        account(w, ts, now_ns(), c->size);
    }
out:
    if (c->proto == P_TESSERA)
        tessera_client_close(tc);
    else if (buf)
        conn_close(&k);
    free(buf);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (w->c->write)
        run_write(w);
    else if (w->c->proto == P_TESSERA)
        run_tessera(w);
    else
        run_peer(w);
    return NULL;
}

/* ---- the server's CPU time and memory ------------------------------------------------ */

static double proc_cpu_s(const struct cfg *c)
{
    double ticks = 0;
    for (int i = 0; i < c->npids; i++) {
        char path[64], buf[1024], *p;
        unsigned long ut = 0, st = 0;
        FILE *f;
        snprintf(path, sizeof(path), "/proc/%d/stat", c->pids[i]);
        f = fopen(path, "r");
        if (!f)
            return -1;
        if (!fgets(buf, sizeof(buf), f)) {
            fclose(f);
            return -1;
        }
        fclose(f);
        p = strrchr(buf, ')');
        if (!p ||
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
            return -1;
        ticks += (double)(ut + st);
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

static long proc_status_kb(const struct cfg *c, const char *field)
{
    long total = 0;
    size_t fl = strlen(field);
    for (int i = 0; i < c->npids; i++) {
        char path[64], line[256];
        FILE *f;
        snprintf(path, sizeof(path), "/proc/%d/status", c->pids[i]);
        f = fopen(path, "r");
        if (!f)
            return -1;
        while (fgets(line, sizeof(line), f))
            if (!strncmp(line, field, fl) && line[fl] == ':')
                total += strtol(line + fl + 1, NULL, 10);
        fclose(f);
    }
    return total;
}

/* Bytes held by the server's memfd files (a cache kept in a memfd and sent with sendfile()
 * is not mapped, so it does not show in VmRSS): allocated blocks of every /proc/PID/fd/N
 * that is a memfd, in KiB. */
static long proc_memfd_kb(const struct cfg *c)
{
    long total = 0;
    for (int i = 0; i < c->npids; i++) {
        char dir[64], path[384], target[256];
        DIR *d;
        struct dirent *e;
        snprintf(dir, sizeof(dir), "/proc/%d/fd", c->pids[i]);
        d = opendir(dir);
        if (!d)
            return -1;
        while ((e = readdir(d))) {
            struct stat st;
            ssize_t n;
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            n = readlink(path, target, sizeof(target) - 1);
            if (n <= 0)
                continue;
            target[n] = '\0';
            if (strncmp(target, "/memfd:", 7) || stat(path, &st) < 0)
                continue;
            total += (long)(st.st_blocks / 2);
        }
        closedir(d);
    }
    return total;
}

struct mem {
    long hwm_kb, rss_kb, shmem_kb, memfd_kb;
};

static struct mem mem_sample(const struct cfg *c)
{
    struct mem m = {-1, -1, -1, -1};
    if (c->npids) {
        m.hwm_kb = proc_status_kb(c, "VmHWM");
        m.rss_kb = proc_status_kb(c, "VmRSS");
        m.shmem_kb = proc_status_kb(c, "RssShmem");
        m.memfd_kb = proc_memfd_kb(c);
    }
    return m;
}

static void proc_reset_hwm(const struct cfg *c)
{
    for (int i = 0; i < c->npids; i++) {
        char path[64];
        FILE *f;
        snprintf(path, sizeof(path), "/proc/%d/clear_refs", c->pids[i]);
        f = fopen(path, "w");
        if (!f || fputs("5", f) < 0)
            fprintf(stderr, "tsload: cannot reset VmHWM of %d: %s\n", c->pids[i], strerror(errno));
        if (f)
            fclose(f);
    }
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* ---- results ---------------------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double pct(const uint32_t *v, size_t n, double p)
{
    size_t i;
    if (!n)
        return 0;
    i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i] / 1e3;
}

/* Busy seconds of each core from /proc/stat (user, nice, system, irq, softirq, steal): with
 * the server's and the load generator's own CPU time it shows what else ran meanwhile. */
#define MAX_CORES 64
struct sample {
    double cpu_s, self_s;
    double core[MAX_CORES];
    int ncores;
};

static void cores_busy(struct sample *s)
{
    char line[512];
    FILE *f = fopen("/proc/stat", "r");
    double hz = (double)sysconf(_SC_CLK_TCK);

    s->ncores = 0;
    if (!f)
        return;
    while (fgets(line, sizeof(line), f) && s->ncores < MAX_CORES) {
        unsigned long long v[8] = {0};
        int id;
        if (strncmp(line, "cpu", 3) || line[3] < '0' || line[3] > '9')
            continue;
        if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &id, &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]) != 9 ||
            id != s->ncores)
            break;
        s->core[s->ncores++] = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
    }
    fclose(f);
}

static void report(struct cfg *c, struct worker *ws, double secs, struct sample a, struct sample b,
                   struct mem mem)
{
    uint64_t ops = 0, bytes = 0;
    size_t n = 0, k = 0;
    uint32_t *all;
    double sum = 0, server_cpu = -1;
    const char *cipher = "";

    for (unsigned i = 0; i < c->conns; i++) {
        ops += ws[i].ops;
        bytes += ws[i].bytes;
        n += ws[i].nlat;
        if (ws[i].cipher[0])
            cipher = ws[i].cipher;
    }
    all = malloc((n ? n : 1) * sizeof(*all));
    if (!all)
        die("out of memory");
    for (unsigned i = 0; i < c->conns; i++) {
        memcpy(all + k, ws[i].lat, ws[i].nlat * sizeof(*all));
        k += ws[i].nlat;
    }
    qsort(all, n, sizeof(*all), cmp_u32);
    for (size_t i = 0; i < n; i++)
        sum += all[i];
    if (c->npids && a.cpu_s >= 0 && b.cpu_s >= 0)
        server_cpu = b.cpu_s - a.cpu_s;

    printf("{\"label\":\"%s\",\"cmd\":\"%s\",\"proto\":\"%s\",\"tls\":%d,\"cipher\":\"%s\","
           "\"conns\":%u,\"depth\":%u,\"size\":%zu,\"ops\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"seconds\":%.4f,\"ops_per_s\":%.1f,\"gb_per_s\":%.4f,\"mean_us\":%.1f,"
           "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,"
           "\"client_cpu\":%.3f",
           c->label ? c->label : "", c->cmd, proto_names[c->proto], c->tls, cipher, c->conns,
           c->depth, c->size, ops, bytes, secs, secs > 0 ? ops / secs : 0,
           secs > 0 ? bytes / secs / 1e9 : 0, n ? sum / n / 1e3 : 0, pct(all, n, 0.50),
           pct(all, n, 0.99), pct(all, n, 0.999), n ? all[n - 1] / 1e3 : 0,
           secs > 0 ? (b.self_s - a.self_s) / secs : 0);
    if (server_cpu >= 0)
        printf(",\"server_cpu_s\":%.3f,\"server_cpu_util\":%.3f,\"server_cpu_s_per_gb\":%.4f",
               server_cpu, secs > 0 ? server_cpu / secs : 0,
               bytes ? server_cpu / (bytes / 1e9) : 0);
    if (secs > 0 && a.ncores && a.ncores == b.ncores) {
        double busy = 0;
        printf(",\"core_busy\":[");
        for (int i = 0; i < a.ncores; i++) {
            busy += b.core[i] - a.core[i];
            printf("%s%.3f", i ? "," : "", (b.core[i] - a.core[i]) / secs);
        }
        busy -= b.self_s - a.self_s;
        if (server_cpu >= 0)
            busy -= server_cpu;
        printf("],\"other_cpu\":%.3f", busy > 0 ? busy / secs : 0);
    }
    if (mem.hwm_kb >= 0)
        printf(",\"server_hwm_kb\":%ld,\"server_rss_kb\":%ld,\"server_shmem_kb\":%ld,"
               "\"server_memfd_kb\":%ld",
               mem.hwm_kb, mem.rss_kb, mem.shmem_kb, mem.memfd_kb);
    printf("}\n");
    fflush(stdout);
    fprintf(stderr,
            "tsload %s %s%s c=%u d=%u size=%zu: %.0f ops/s %.3f GB/s p50 %.1f us p99 %.1f us"
            " (client cpu %.0f%%)\n",
            c->label ? c->label : "", proto_names[c->proto], c->tls ? "+tls" : "", c->conns,
            c->depth, c->size, secs > 0 ? ops / secs : 0, secs > 0 ? bytes / secs / 1e9 : 0,
            pct(all, n, 0.50), pct(all, n, 0.99),
            secs > 0 ? 100 * (b.self_s - a.self_s) / secs : 0);
    free(all);
}

static struct sample take_sample(const struct cfg *c)
{
    struct sample s = {.cpu_s = c->npids ? proc_cpu_s(c) : -1, .self_s = self_cpu_s()};
    cores_busy(&s);
    return s;
}

/* ---- commands ---------------------------------------------------------------------------- */

static int cmd_read(struct cfg *c)
{
    struct worker *ws = calloc(c->conns, sizeof(*ws));
    struct sample a, b;
    struct mem mem;
    double secs;
    int failed = 0;
    int64_t start;

    if (!ws)
        die("out of memory");
    if (c->npids && c->reset_hwm)
        proc_reset_hwm(c);
    pthread_barrier_init(&g_ready, NULL, c->conns + 1);
    c->t0 = INT64_MAX; /* workers wait at the barrier; the window is set once all connected */
    for (unsigned i = 0; i < c->conns; i++) {
        ws[i].c = c;
        ws[i].idx = i;
        if (pthread_create(&ws[i].thr, NULL, worker_main, &ws[i]))
            die("pthread_create failed");
    }
    start = now_ns();
    if (c->count) {
        c->t0 = start;
        c->t1 = INT64_MAX;
        c->warmup = 0;
    } else {
        c->t0 = start + (int64_t)(c->warmup * 1e9);
        c->t1 = c->t0 + (int64_t)(c->duration * 1e9);
    }
    atomic_thread_fence(memory_order_seq_cst);
    pthread_barrier_wait(&g_ready);
    sleep_until(c->t0);
    a = take_sample(c);
    if (!c->count) {
        sleep_until(c->t1);
        b = take_sample(c);
    }
    for (unsigned i = 0; i < c->conns; i++)
        pthread_join(ws[i].thr, NULL);
    if (c->count) {
        int64_t end = c->t0;
        b = take_sample(c);
        for (unsigned i = 0; i < c->conns; i++)
            if (ws[i].last_end > end)
                end = ws[i].last_end;
        secs = (end - c->t0) / 1e9;
    } else {
        secs = c->duration;
    }
    mem = mem_sample(c);
    for (unsigned i = 0; i < c->conns; i++) {
        if (ws[i].failed) {
            fprintf(stderr, "tsload: connection %u: %s\n", i, ws[i].err);
            failed = 1;
        }
    }
    if (!failed)
        report(c, ws, secs, a, b, mem);
    for (unsigned i = 0; i < c->conns; i++)
        free(ws[i].lat);
    free(ws);
    pthread_barrier_destroy(&g_ready);
    return failed ? 1 : 0;
}

static int mkdirs(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static int load_http(struct cfg *c, uint8_t *buf)
{
    char path[4096];
    if (!c->dir)
        die("load --proto http needs --dir (the web root)");
    snprintf(path, sizeof(path), "%s/%s", c->dir, c->prefix);
    if (mkdirs(path) < 0)
        die("mkdir %s: %s", path, strerror(errno));
    for (uint32_t i = 0; i < c->nkeys; i++) {
        int fd;
        snprintf(path, sizeof(path), "%s/%s/%" PRIu32, c->dir, c->prefix, i);
        obj_fill(c, i, buf, c->size);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, buf, c->size) != (ssize_t)c->size || close(fd) < 0)
            die("write %s: %s", path, strerror(errno));
    }
    return 0;
}

static int load_kv(struct cfg *c, uint8_t *buf)
{
    struct worker w = {.c = c};
    struct conn k;
    char hdr[512], *l;

    if (conn_open(&w, &k) < 0)
        die("%s", w.err);
    for (uint32_t i = 0; i < c->nkeys; i++) {
        char key[160];
        int kl = snprintf(key, sizeof(key), "%s:%" PRIu32, c->prefix, i);
        size_t n;
        obj_fill(c, i, buf, c->size);
        if (c->proto == P_REDIS)
            n = (size_t)snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n", kl,
                                 key, c->size);
        else
            n = (size_t)snprintf(hdr, sizeof(hdr), "set %s 0 0 %zu\r\n", key, c->size);
        if (conn_write(&k, hdr, n) < 0 || conn_write(&k, buf, c->size) < 0 ||
            conn_write(&k, "\r\n", 2) < 0)
            die("%s: send failed", c->addr);
        l = conn_line(&k);
        if (!l)
            die("%s: connection lost", c->addr);
        if (strcmp(l, c->proto == P_REDIS ? "+OK" : "STORED"))
            die("%s: set %s: '%.100s'", c->addr, key, l);
    }
    conn_close(&k);
    return 0;
}

static tessera_client *ts_open_main(struct cfg *c)
{
    struct worker w = {.c = c};
    tessera_client *tc = NULL;
    if (ts_open(&w, &tc) < 0)
        die("%s", w.err);
    return tc;
}

static void ts_create(struct cfg *c, tessera_client *tc)
{
    struct ts_dataset_policy p = {.core = c->core ? c->core : 1,
                                  .fringe = 0,
                                  .min_core = c->min_core ? c->min_core : 1,
                                  .chunk_size = c->chunk};
    int rc = tessera_dataset_create(tc, c->prefix, &p);
    if (rc)
        die("dataset create %s: %s (%s) %s", c->prefix, ts_strerror(rc), ts_errname(rc),
            tessera_client_error(tc));
}

static int load_tessera(struct cfg *c)
{
    tessera_client *tc = ts_open_main(c);
    size_t shard_bytes = (size_t)c->per_shard * c->size;
    uint8_t *buf = malloc(shard_bytes);
    uint32_t nshards = c->nkeys / c->per_shard;
    int rc;

    if (!buf)
        die("out of memory");
    if (c->nkeys % c->per_shard)
        die("--keys %u is not a multiple of --per-shard %u", c->nkeys, c->per_shard);
    ts_create(c, tc);
    for (uint32_t s = 0; s < nshards; s++) {
        for (uint32_t j = 0; j < c->per_shard; j++)
            obj_fill(c, s * c->per_shard + j, buf + (size_t)j * c->size, c->size);
        rc = tessera_put(tc, c->prefix, s, buf, shard_bytes, NULL, 0);
        if (rc)
            die("put %s/%u: %s (%s) %s", c->prefix, s, ts_strerror(rc), ts_errname(rc),
                tessera_client_error(tc));
    }
    rc = tessera_dataset_seal(tc, c->prefix);
    if (rc)
        die("seal %s: %s (%s) %s", c->prefix, ts_strerror(rc), ts_errname(rc),
            tessera_client_error(tc));
    tessera_client_close(tc);
    free(buf);
    return 0;
}

static int cmd_load(struct cfg *c)
{
    uint8_t *buf;
    int rc;

    if (c->proto == P_TESSERA)
        return load_tessera(c);
    buf = malloc(c->size ? c->size : 1);
    if (!buf)
        die("out of memory");
    rc = c->proto == P_HTTP ? load_http(c, buf) : load_kv(c, buf);
    free(buf);
    return rc;
}

/* One HTTP/1.1 PUT of len bytes to path on a keep-alive connection: the status, or -1. */
static int http_put_one(int fd, const char *host, const char *path, const uint8_t *buf, size_t len)
{
    char head[512], resp[4096];
    struct iovec iov[2];
    size_t have = 0, body = 0, sent = 0, total;
    int status = -1, hl;
    char *end, *cl;

    hl = snprintf(head, sizeof(head), "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %zu\r\n\r\n",
                  path, host, len);
    total = (size_t)hl + len;
    while (sent < total) {
        int n = 0;
        ssize_t k;
        if (sent < (size_t)hl)
            iov[n++] = (struct iovec){head + sent, (size_t)hl - sent};
        iov[n] = (struct iovec){(uint8_t *)buf + (sent > (size_t)hl ? sent - (size_t)hl : 0),
                                len - (sent > (size_t)hl ? sent - (size_t)hl : 0)};
        n++;
        k = writev(fd, iov, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        sent += (size_t)k;
    }
    for (;;) { /* the reply's head, then its body (if any) */
        ssize_t k = read(fd, resp + have, sizeof(resp) - 1 - have);
        if (k <= 0)
            return -1;
        have += (size_t)k;
        resp[have] = '\0';
        end = strstr(resp, "\r\n\r\n");
        if (end)
            break;
        if (have == sizeof(resp) - 1)
            return -1;
    }
    if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1)
        return -1;
    cl = strcasestr(resp, "Content-Length:");
    if (cl && cl < end)
        body = strtoul(cl + 15, NULL, 10);
    have -= (size_t)(end + 4 - resp);
    while (have < body) {
        ssize_t k = read(fd, resp, (body - have < sizeof(resp) ? body - have : sizeof(resp)));
        if (k <= 0)
            return -1;
        have += (size_t)k;
    }
    return status;
}

/* The same bytes as cmd_put, as objects of --chunk bytes PUT over HTTP (WebDAV): /PREFIX/S-I. */
static void put_http(struct cfg *c, struct worker *w, const uint8_t *buf, uint64_t n)
{
    int fd = tcp_connect(c);
    char path[300];

    if (fd < 0)
        die("connect %s:%d: %s", c->host, c->port, strerror(errno));
    for (uint64_t i = 0; i < n; i++) {
        int64_t ts = now_ns();
        for (size_t off = 0, k = 0; off < c->size; off += c->chunk, k++) {
            size_t len = c->size - off < c->chunk ? c->size - off : c->chunk;
            int st;
            snprintf(path, sizeof(path), "/%s/%" PRIu64 "-%zu", c->prefix, i, k);
            st = http_put_one(fd, c->host, path, buf + off, len);
            if (st < 0) { /* the server closed the keep-alive connection: once more on a new one */
                close(fd);
                fd = tcp_connect(c);
                st = fd < 0 ? -1 : http_put_one(fd, c->host, path, buf + off, len);
            }
            if (st != 201 && st != 204)
                die("PUT %s: status %d", path, st);
        }
        account(w, ts, now_ns(), c->size);
    }
    close(fd);
}

/* Upload throughput: --count shards of --size bytes, one tessera_put each, on one connection
 * (--proto http: the same bytes as --chunk-sized objects PUT to a WebDAV server). */
static int cmd_put(struct cfg *c)
{
    struct worker w = {.c = c};
    tessera_client *tc;
    uint8_t *buf = malloc(c->size);
    struct sample a, b;
    int64_t start, end;
    uint64_t n = c->count ? c->count : 1;
    int rc;

    if (c->proto != P_TESSERA && c->proto != P_HTTP)
        die("put is for --proto tessera or http");
    if (!buf)
        die("out of memory");
    obj_fill(c, 0, buf, c->size);
    if (c->proto == P_HTTP) {
        c->conns = 1;
        c->t0 = 0;
        c->t1 = INT64_MAX;
        a = take_sample(c);
        start = now_ns();
        put_http(c, &w, buf, n);
        end = now_ns();
        b = take_sample(c);
        report(c, &w, (end - start) / 1e9, a, b, mem_sample(c));
        free(w.lat);
        free(buf);
        return 0;
    }
    tc = ts_open_main(c);
    ts_create(c, tc);
    c->conns = 1;
    c->t0 = 0;
    c->t1 = INT64_MAX;
    a = take_sample(c);
    start = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        int64_t ts = now_ns();
        rc = tessera_put(tc, c->prefix, (uint32_t)i, buf, c->size, NULL, 0);
        if (rc)
            die("put %s/%" PRIu64 ": %s (%s) %s", c->prefix, i, ts_strerror(rc), ts_errname(rc),
                tessera_client_error(tc));
        account(&w, ts, now_ns(), c->size);
    }
    end = now_ns();
    b = take_sample(c);
    if (c->cleanup) {
        rc = tessera_dataset_delete(tc, c->prefix);
        if (rc)
            die("delete %s: %s (%s) %s", c->prefix, ts_strerror(rc), ts_errname(rc),
                tessera_client_error(tc));
    }
    tessera_client_close(tc);
    report(c, &w, (end - start) / 1e9, a, b, mem_sample(c));
    free(w.lat);
    free(buf);
    return 0;
}

/* ---- TFRecord files for `tessera ingest` ------------------------------------------------------
 */

static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    static uint32_t t[256];
    if (!t[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t v = i;
            for (int k = 0; k < 8; k++)
                v = v & 1 ? (v >> 1) ^ 0x82f63b78u : v >> 1;
            t[i] = v;
        }
    crc = ~crc;
    while (n--)
        crc = t[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t tf_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* --count files DIR/fNNN.tfrecord, each of whole records of --record payload bytes, up to
 * --size bytes; every payload the data set's object bytes. */
static int cmd_tfrecord(struct cfg *c)
{
    size_t rec = c->record ? c->record : 100 << 10, per = c->size / (rec + 16);
    uint8_t *buf = malloc(rec + 16);
    char path[4096];

    if (!c->dir || !buf || per == 0)
        die("tfrecord needs --dir, and --size of at least one --record");
    for (uint64_t f = 0; f < (c->count ? c->count : 1); f++) {
        snprintf(path, sizeof(path), "%s/f%03" PRIu64 ".tfrecord", c->dir, f);
        FILE *o = fopen(path, "wb");
        if (!o)
            die("%s: %s", path, strerror(errno));
        for (size_t r = 0; r < per; r++) {
            uint64_t len = rec;
            memcpy(buf, &len, 8); /* little-endian hosts only, as the rest of this tool */
            uint32_t m = tf_mask(crc32c_sw(0, buf, 8));
            memcpy(buf + 8, &m, 4);
            obj_fill(c, (uint32_t)(f * per + r), buf + 12, rec);
            m = tf_mask(crc32c_sw(0, buf + 12, rec));
            memcpy(buf + 12 + rec, &m, 4);
            if (fwrite(buf, 1, rec + 16, o) != rec + 16)
                die("%s: %s", path, strerror(errno));
        }
        if (fclose(o) != 0)
            die("%s: %s", path, strerror(errno));
    }
    free(buf);
    return 0;
}

/*
 * N free loopback ports, each bound until all are chosen. Below the ephemeral range when there
 * is room: a port from bind(0) is an ephemeral one, which a cluster node's outgoing link,
 * started before the next node binds, may take in the meantime.
 */
static int cmd_ports(int n)
{
    int fds[64], lo = 32768;
    FILE *pr = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (n < 1 || n > 64)
        die("ports: 1..64");
    if (pr) {
        if (fscanf(pr, "%d", &lo) != 1)
            lo = 32768;
        fclose(pr);
    }
    srandom((unsigned)getpid() ^ (unsigned)time(NULL));
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof(sa);
        int bound = -1;
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        for (int tries = 0; fds[i] >= 0 && bound < 0 && tries < 200; tries++) {
            sa.sin_port =
                lo > 12000 && tries < 199
                    ? htons((uint16_t)(10000 + (unsigned)random() % (unsigned)(lo - 10000)))
                    : 0; /* the kernel's choice as the last resort */
            bound = bind(fds[i], (struct sockaddr *)&sa, sizeof(sa));
        }
        if (fds[i] < 0 || bound < 0 || getsockname(fds[i], (struct sockaddr *)&sa, &sl) < 0)
            die("ports: %s", strerror(errno));
        printf("%s%u", i ? " " : "", ntohs(sa.sin_port));
    }
    printf("\n");
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}

static int cmd_wait(struct cfg *c)
{
    int64_t deadline = now_ns() + (int64_t)(c->timeout * 1e9);
    for (;;) {
        int fd = tcp_connect(c);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "tsload: %s does not accept connections after %.0f s\n", c->addr,
                    c->timeout);
            return 1;
        }
        usleep(10000);
    }
}

/* ---- options ------------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr,
            "usage: tsload read|write|load|put|tfrecord [options]   tsload ports N   tsload wait "
            "--addr A\n"
            "  --proto tessera|http|redis|memcache   --tls  --ca FILE (TLS 1.3, " CIPHER ")\n"
            "  --cert FILE --key FILE (tessera: a client certificate)   --core N --min-core N\n"
            "  --addr 127.0.0.1:PORT   --conns N (1)   --depth D (1, pipelined when > 1)\n"
            "  --duration S (3)   --warmup S (1)   --count N (instead of a duration)\n"
            "  --size B (object size, K/M suffixes)   --keys N   --prefix NAME\n"
            "  --per-shard K (tessera: objects per shard)   --chunk B (tessera chunk size)\n"
            "  --server-pid PID[,PID]   --reset-hwm   --label TEXT   --dir DIR (http load)\n"
            "  --seed N   --cleanup (put: delete the dataset)   --timeout S (wait)\n"
            "  --record B (tfrecord: payload bytes per record, 100K)\n");
    exit(2);
}

static void parse(struct cfg *c, int argc, char **argv)
{
    static const struct option lo[] = {{"proto", 1, 0, 'P'},      {"tls", 0, 0, 'T'},
                                       {"ca", 1, 0, 'C'},         {"cert", 1, 0, 1001},
                                       {"key", 1, 0, 1002},       {"core", 1, 0, 1003},
                                       {"min-core", 1, 0, 1004},  {"addr", 1, 0, 'a'},
                                       {"conns", 1, 0, 'c'},      {"depth", 1, 0, 'd'},
                                       {"duration", 1, 0, 't'},   {"warmup", 1, 0, 'w'},
                                       {"count", 1, 0, 'n'},      {"size", 1, 0, 's'},
                                       {"keys", 1, 0, 'k'},       {"prefix", 1, 0, 'p'},
                                       {"per-shard", 1, 0, 'S'},  {"chunk", 1, 0, 'K'},
                                       {"server-pid", 1, 0, 'i'}, {"reset-hwm", 0, 0, 'R'},
                                       {"label", 1, 0, 'l'},      {"dir", 1, 0, 'D'},
                                       {"seed", 1, 0, 'e'},       {"cleanup", 0, 0, 'X'},
                                       {"timeout", 1, 0, 'o'},    {"help", 0, 0, 'h'},
                                       {"record", 1, 0, 1005},    {0, 0, 0, 0}};
    int ch;

    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'P': {
            int found = 0;
            for (int i = 0; i < 4; i++)
                if (!strcmp(optarg, proto_names[i])) {
                    c->proto = (enum proto)i;
                    found = 1;
                }
            if (!found)
                die("unknown --proto '%s'", optarg);
            break;
        }
        case 'T':
            c->tls = 1;
            break;
        case 'C':
            c->ca = optarg;
            break;
        case 1001:
            c->cert = optarg;
            break;
        case 1002:
            c->key = optarg;
            break;
        case 1003:
            c->core = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 1004:
            c->min_core = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 1005:
            c->record = (size_t)parse_size(optarg);
            break;
        case 'a':
            c->addr = optarg;
            break;
        case 'c':
            c->conns = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'd':
            c->depth = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 't':
            c->duration = strtod(optarg, NULL);
            break;
        case 'w':
            c->warmup = strtod(optarg, NULL);
            break;
        case 'n':
            c->count = strtoull(optarg, NULL, 10);
            break;
        case 's':
            c->size = (size_t)parse_size(optarg);
            break;
        case 'k':
            c->nkeys = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'p':
            c->prefix = optarg;
            break;
        case 'S':
            c->per_shard = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'K':
            c->chunk = (uint32_t)parse_size(optarg);
            break;
        case 'i': {
            char *s = optarg, *end;
            while (*s && c->npids < MAX_PIDS) {
                long v = strtol(s, &end, 10);
                if (end == s || v <= 0)
                    die("bad --server-pid '%s'", optarg);
                c->pids[c->npids++] = (int)v;
                s = *end == ',' ? end + 1 : end;
            }
            break;
        }
        case 'R':
            c->reset_hwm = 1;
            break;
        case 'l':
            c->label = optarg;
            break;
        case 'D':
            c->dir = optarg;
            break;
        case 'e':
            c->seed = strtoull(optarg, NULL, 10);
            break;
        case 'X':
            c->cleanup = 1;
            break;
        case 'o':
            c->timeout = strtod(optarg, NULL);
            break;
        default:
            usage();
        }
    }
    if (c->conns < 1 || c->conns > 1024)
        die("--conns must be 1..1024");
    if (c->depth < 1 || c->depth > MAX_DEPTH)
        die("--depth must be 1..%d", MAX_DEPTH);
    if (c->depth > 1 && c->proto == P_HTTP)
        die("--depth > 1 is not offered for http (no pipelining in the comparison)");
    if (c->addr) {
        const char *colon = strrchr(c->addr, ':');
        if (!colon || (size_t)(colon - c->addr) >= sizeof(c->host))
            die("--addr wants HOST:PORT");
        memcpy(c->host, c->addr, (size_t)(colon - c->addr));
        c->host[colon - c->addr] = '\0';
        c->port = atoi(colon + 1);
    }
}

static SSL_CTX *client_ctx(const char *ca)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(ctx, CIPHER))
        die("TLS setup: %s", ssl_errstr());
    if (!ca || SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
        die("--tls needs --ca FILE: %s", ca ? ssl_errstr() : "not given");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    return ctx;
}

int main(int argc, char **argv)
{
    struct cfg c = {.proto = P_TESSERA,
                    .conns = 1,
                    .depth = 1,
                    .duration = 3,
                    .warmup = 1,
                    .size = 1u << 20,
                    .nkeys = 256,
                    .prefix = "o1m",
                    .per_shard = 16,
                    .chunk = 1u << 20,
                    .seed = 42,
                    .timeout = 10};

    if (argc < 2)
        usage();
    c.cmd = argv[1];
    if (!strcmp(c.cmd, "ports"))
        return cmd_ports(argc > 2 ? atoi(argv[2]) : 1);
    parse(&c, argc - 1, argv + 1);
    if (!strcmp(c.cmd, "tfrecord"))
        return cmd_tfrecord(&c);
    if (!c.addr)
        die("--addr HOST:PORT is needed");
    if (!strcmp(c.cmd, "wait"))
        return cmd_wait(&c);
    if (c.tls && c.proto != P_TESSERA)
        c.ssl_ctx = client_ctx(c.ca);
    if (c.tls && c.proto == P_TESSERA && !c.ca)
        die("--tls needs --ca FILE");
    if (c.nkeys < 1 || c.size < 1)
        die("--keys and --size must be positive");
    if (!strcmp(c.cmd, "read"))
        return cmd_read(&c);
    if (!strcmp(c.cmd, "write")) {
        int rc;
        tessera_client *tc = NULL;
        if (c.proto == P_HTTP)
            die("write is for --proto tessera, redis or memcache");
        c.write = 1;
        c.depth = 1;
        if (c.proto == P_TESSERA) { /* a fresh dataset of --chunk chunks */
            tc = ts_open_main(&c);
            ts_create(&c, tc);
        }
        rc = cmd_read(&c);
        if (tc && c.cleanup)
            tessera_dataset_delete(tc, c.prefix);
        tessera_client_close(tc);
        return rc;
    }
    if (!strcmp(c.cmd, "load"))
        return cmd_load(&c);
    if (!strcmp(c.cmd, "put"))
        return cmd_put(&c);
    usage();
    return 2;
}
