/*
 * Unit tests for libtessera in cluster mode (client/cluster.c): fake nodes, each a thread
 * listening on a loopback port that answers the frames of the protocol from a small scripted
 * state (its map, its shards, how it misbehaves), and the router routing over them: map
 * adoption on TS_ESTALE and on a higher reply epoch, writes to the primary, read failover on
 * TS_ECORRUPT and on a closed connection (also for submitted reads), dataset broadcasts, the
 * cluster-wide seal, map push and failover. Real multi-daemon tests live in
 * tests/integration/.
 */
#include "ts_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"
#include "fake_server.h"
#include "ts_map.h"

#define NMAX 6
#define SHARD_SIZE 10000u
#define CHUNK 4096u

/* ---- wire helpers ----------------------------------------------------------------------------
 */

static int recv_frame(int fd, struct ts_frame_hdr *h, uint8_t **payload)
{
    uint8_t hdr[TS_HDR_LEN];

    if (read_exact(fd, hdr, sizeof(hdr)))
        return -1;
    if (ts_frame_parse(hdr, sizeof(hdr), UINT32_MAX, h) != TS_HDR_LEN)
        return -1;
    *payload = malloc(h->length + 1);
    if (!*payload || read_exact(fd, *payload, h->length)) {
        free(*payload);
        return -1;
    }
    return 0;
}

static void send_frame(int fd, uint8_t op, uint64_t id, uint64_t epoch, const struct ts_wr *w,
                       const void *tail, size_t tail_len)
{
    struct ts_frame_hdr h = {TS_PROTO_VERSION, op, TS_F_REPLY, id, epoch, 0};
    uint8_t hdr[TS_HDR_LEN];

    h.length = (uint32_t)(w->len + tail_len);
    ts_frame_encode(hdr, &h);
    /* The client may have gone: a failed write is the end of this connection, not of the test. */
    if (write_exact(fd, hdr, sizeof(hdr)) || write_exact(fd, w->buf, w->len))
        return;
    if (tail_len)
        (void)write_exact(fd, tail, tail_len);
}

/* Shard contents are a function of the shard number. */
static void shard_bytes(uint32_t shard, uint64_t off, uint8_t *out, size_t len)
{
    ts_test_fill(out, len, 1000 + shard, off);
}

/* ---- a fake node ------------------------------------------------------------------------------
 */

enum read_mode { RD_OK, RD_CORRUPT_STATUS, RD_CORRUPT_WIRE, RD_CLOSE };

struct fnode {
    char id[16];
    char addr[128];
    int lfd;
    pthread_t acceptor;
    pthread_t handlers[32];
    int nhandlers;
    pthread_mutex_t mu;
    /* behaviour (under mu) */
    struct ts_map *map;   /* what MAP_GET answers; NULL: epoch 0, no nodes */
    uint64_t epoch;       /* in every reply header */
    struct ts_map *stale; /* set: SHARD_WRITE/SHARD_SEAL refused with TS_ESTALE and this map */
    enum read_mode rd;
    int create_rc;  /* DATASET_CREATE answered with this */
    int no_map_get; /* MAP_GET answered TS_ENOTSUP (an old server) */
    struct ts_dataset_policy pol;
    uint32_t shards[8]; /* SHARD_LIST */
    int shard_state[8];
    int nshards;
    /* what it saw (under mu) */
    int n_hello, n_read, n_write, n_seal, n_create, n_delete, n_dseal, n_push, n_get, n_stat;
    int n_list;
    uint8_t dseal_flags;
    uint64_t last_epoch;
    uint64_t write_epoch;
    struct ts_map *pushed;
};

struct conn_arg {
    struct fnode *n;
    int fd;
};

static void reply_error(struct fnode *n, int fd, const struct ts_frame_hdr *h, int rc,
                        const char *msg, const struct ts_map *m)
{
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_u32(&w, (uint32_t)rc);
    ts_wr_str(&w, msg);
    if (m)
        ts_map_encode(&w, m);
    send_frame(fd, h->opcode, h->req_id, n->epoch, &w, NULL, 0);
    ts_wr_fini(&w);
}

static void reply_ok(struct fnode *n, int fd, const struct ts_frame_hdr *h, struct ts_wr *w)
{
    send_frame(fd, h->opcode, h->req_id, n->epoch, w, NULL, 0);
}

static void on_read(struct fnode *n, int fd, const struct ts_frame_hdr *h, struct ts_rd *r)
{
    char name[TS_NAME_MAX + 1];
    uint32_t shard, len, np = 0;
    uint64_t off, end, p;
    uint8_t data[SHARD_SIZE];
    struct ts_wr w;

    ts_rd_name(r, name);
    shard = ts_rd_u32(r);
    off = ts_rd_u64(r);
    len = ts_rd_u32(r);
    if (n->rd == RD_CORRUPT_STATUS) {
        reply_error(n, fd, h, TS_ECORRUPT, "read: chunk 0 fails its CRC32C on disk", NULL);
        return;
    }
    if (off > SHARD_SIZE) {
        reply_error(n, fd, h, TS_ERANGE, "read: offset past the end", NULL);
        return;
    }
    end = TS_MIN((uint64_t)SHARD_SIZE, off + len);
    shard_bytes(shard, off, data, (size_t)(end - off));
    for (p = off; p < end; p = (p / CHUNK + 1) * CHUNK)
        np++;
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, SHARD_SIZE);
    ts_wr_u32(&w, np);
    for (p = off; p < end;) {
        uint64_t q = TS_MIN((p / CHUNK + 1) * CHUNK, end);
        uint32_t crc = ts_crc32c(0, data + (p - off), (size_t)(q - p));
        ts_wr_u32(&w, (uint32_t)(q - p));
        ts_wr_u32(&w, n->rd == RD_CORRUPT_WIRE ? crc ^ 1 : crc);
        p = q;
    }
    send_frame(fd, TS_OP_READ, h->req_id, n->epoch, &w, data, (size_t)(end - off));
    ts_wr_fini(&w);
}

/* One frame; 0 to go on, -1 to drop the connection. Called with n->mu held. */
static int on_frame(struct fnode *n, int fd, const struct ts_frame_hdr *h, struct ts_rd *r)
{
    struct ts_shard_info si;
    struct ts_dataset_info d;
    struct ts_wr w;
    uint32_t idx;

    n->last_epoch = h->epoch;
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    switch (h->opcode) {
    case TS_OP_HELLO:
        n->n_hello++;
        ts_wr_u16(&w, TS_PROTO_VERSION);
        ts_wr_str(&w, n->id);
        ts_wr_u8(&w, TS_ROLE_ADMIN);
        ts_wr_u32(&w, TS_MAX_CHUNK + 4096);
        ts_wr_u64(&w, n->epoch);
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_MAP_GET:
        n->n_get++;
        if (n->no_map_get) {
            reply_error(n, fd, h, TS_ENOTSUP, "unknown opcode", NULL);
            break;
        }
        if (n->map) {
            ts_map_encode(&w, n->map);
        } else {
            ts_wr_u64(&w, 0);
            ts_wr_u32(&w, 0);
            ts_wr_u32(&w, 0);
        }
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_MAP_PUSH: {
        struct ts_map *m = NULL;
        n->n_push++;
        assert_int_equal(ts_map_decode(r, &m), 0);
        ts_map_free(n->pushed);
        n->pushed = ts_map_dup(m);
        ts_map_free(n->map);
        n->map = m;
        n->epoch = m->epoch;
        ts_wr_u64(&w, m->epoch);
        reply_ok(n, fd, h, &w);
        break;
    }
    case TS_OP_DATASET_CREATE:
        n->n_create++;
        if (n->create_rc)
            reply_error(n, fd, h, n->create_rc, "dataset-create: disk full", NULL);
        else
            reply_ok(n, fd, h, &w);
        break;
    case TS_OP_DATASET_DELETE:
        n->n_delete++;
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_DATASET_SEAL:
        n->n_dseal++;
        ts_rd_name(r, d.name);
        n->dseal_flags = r->off < r->len ? ts_rd_u8(r) : 0;
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_DATASET_STAT:
        n->n_stat++;
        memset(&d, 0, sizeof(d));
        ts_rd_name(r, d.name);
        d.id = 9;
        d.policy = n->pol;
        d.shards = (uint32_t)n->nshards;
        ts_wr_dataset_info(&w, &d);
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_DATASET_LIST:
        n->n_list++;
        memset(&d, 0, sizeof(d));
        snprintf(d.name, sizeof(d.name), "ds");
        d.policy = n->pol;
        ts_wr_u32(&w, 1);
        ts_wr_dataset_info(&w, &d);
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_SHARD_LIST:
        ts_wr_u32(&w, (uint32_t)n->nshards);
        for (int i = 0; i < n->nshards; i++) {
            memset(&si, 0, sizeof(si));
            si.shard = n->shards[i];
            si.state = n->shard_state[i];
            si.size = SHARD_SIZE;
            si.expect_size = SHARD_SIZE;
            ts_wr_shard_info(&w, &si);
        }
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_SHARD_WRITE:
        n->n_write++;
        n->write_epoch = h->epoch;
        if (n->stale) {
            reply_error(n, fd, h, TS_ESTALE, "shard-write: stale map epoch", n->stale);
            break;
        }
        ts_rd_name(r, d.name);
        (void)ts_rd_u32(r);
        idx = ts_rd_u32(r);
        ts_wr_u32(&w, idx);
        ts_wr_u64(&w, 0);
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_SHARD_SEAL:
        n->n_seal++;
        if (n->stale) {
            reply_error(n, fd, h, TS_ESTALE, "shard-seal: stale map epoch", n->stale);
            break;
        }
        memset(&si, 0, sizeof(si));
        si.state = TS_SHARD_COMPLETE;
        ts_wr_shard_info(&w, &si);
        reply_ok(n, fd, h, &w);
        break;
    case TS_OP_READ:
        n->n_read++;
        if (n->rd == RD_CLOSE) {
            ts_wr_fini(&w);
            return -1;
        }
        on_read(n, fd, h, r);
        break;
    case TS_OP_STATUS: {
        char doc[128];
        snprintf(doc, sizeof(doc), "{\"node\": \"%s\", \"cluster\": {\"epoch\": %llu}}", n->id,
                 (unsigned long long)n->epoch);
        ts_wr_str(&w, doc);
        reply_ok(n, fd, h, &w);
        break;
    }
    default:
        reply_error(n, fd, h, TS_ENOTSUP, "not in this fake", NULL);
    }
    ts_wr_fini(&w);
    return 0;
}

static void *conn_main(void *arg)
{
    struct conn_arg *a = arg;
    struct ts_frame_hdr h;
    struct ts_rd r;
    uint8_t *p;

    while (recv_frame(a->fd, &h, &p) == 0) {
        int rc;
        ts_rd_init(&r, p, h.length);
        pthread_mutex_lock(&a->n->mu);
        rc = on_frame(a->n, a->fd, &h, &r);
        pthread_mutex_unlock(&a->n->mu);
        free(p);
        if (rc)
            break;
    }
    shutdown(a->fd, SHUT_RDWR);
    close(a->fd);
    free(a);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct fnode *n = arg;
    int one = 1;

    for (;;) {
        int fd = accept(n->lfd, NULL, NULL);
        struct conn_arg *a;
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* no 40 ms stalls */
        a = malloc(sizeof(*a));
        a->n = n;
        a->fd = fd;
        pthread_mutex_lock(&n->mu);
        assert_true(n->nhandlers < (int)TS_ARRAY_SIZE(n->handlers));
        assert_int_equal(pthread_create(&n->handlers[n->nhandlers++], NULL, conn_main, a), 0);
        pthread_mutex_unlock(&n->mu);
    }
}

/* A port on 127.0.0.1 that nobody listens on (connecting is refused). */
static void dead_addr(char *out, size_t cap)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    snprintf(out, cap, "127.0.0.1:%u", ntohs(sa.sin_port));
}

/* Starts node n (dead: an address nobody listens on). */
static void node_start(struct fnode *n, int i, int dead)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);

    memset(n, 0, sizeof(*n));
    snprintf(n->id, sizeof(n->id), "n%d", i + 1);
    pthread_mutex_init(&n->mu, NULL);
    n->pol = (struct ts_dataset_policy){3, 0, 1, CHUNK, 0, 0, 0, 0};
    n->lfd = -1;
    if (dead) {
        dead_addr(n->addr, sizeof(n->addr));
        return;
    }
    n->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(n->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(n->lfd, 16), 0);
    assert_int_equal(getsockname(n->lfd, (struct sockaddr *)&sa, &len), 0);
    snprintf(n->addr, sizeof(n->addr), "127.0.0.1:%u", ntohs(sa.sin_port));
    assert_int_equal(pthread_create(&n->acceptor, NULL, accept_main, n), 0);
}

/* Stops node n once every client of it is closed. */
static void node_stop(struct fnode *n)
{
    if (n->lfd >= 0) {
        shutdown(n->lfd, SHUT_RDWR);
        pthread_join(n->acceptor, NULL);
        close(n->lfd);
    }
    for (int i = 0; i < n->nhandlers; i++)
        pthread_join(n->handlers[i], NULL);
    ts_map_free(n->map);
    ts_map_free(n->stale);
    ts_map_free(n->pushed);
    pthread_mutex_destroy(&n->mu);
}

/* A map of pg_count PGs over nodes v[0..n) at epoch, with states ("u", "d", "o" per node;
 * NULL: all up). */
static struct ts_map *make_map_pgs(struct fnode *v, int n, uint64_t epoch, const char *states,
                                   unsigned pg_count)
{
    static const char *const names[] = {"up", "down", "out"};
    char text[4096], err[256];
    struct ts_map *m = NULL;
    size_t off;

    off = (size_t)snprintf(text, sizeof(text), "epoch = %llu;\npg_count = %u;\nnodes = (\n",
                           (unsigned long long)epoch, pg_count);
    for (int i = 0; i < n; i++) {
        int st = !states ? 0 : states[i] == 'd' ? 1 : states[i] == 'o' ? 2 : 0;
        off += (size_t)snprintf(text + off, sizeof(text) - off,
                                "{ id = \"%s\"; addr = \"%s\"; weight = 100; state = \"%s\"; }%s\n",
                                v[i].id, v[i].addr, names[st], i + 1 < n ? "," : "");
    }
    snprintf(text + off, sizeof(text) - off, ");\n");
    assert_int_equal(ts_map_parse_string(text, &m, err, sizeof(err)), 0);
    return m;
}

static struct ts_map *make_map(struct fnode *v, int n, uint64_t epoch, const char *states)
{
    return make_map_pgs(v, n, epoch, states, 16);
}

/* A map of 16 PGs over nodes v[0..n), all up, node i in failure domain domains[i] ("": none). */
static struct ts_map *make_map_domains(struct fnode *v, int n, uint64_t epoch,
                                       const char *const *domains)
{
    struct ts_map *m = make_map(v, n, epoch, NULL);

    for (int i = 0; i < n; i++)
        snprintf(m->nodes[i].domain, sizeof(m->nodes[i].domain), "%s", domains[i]);
    return m;
}

/* Gives every live node of v[0..n) map m (a copy each) and its epoch. */
static void give_map(struct fnode *v, int n, const struct ts_map *m)
{
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&v[i].mu);
        ts_map_free(v[i].map);
        v[i].map = m ? ts_map_dup(m) : NULL;
        v[i].epoch = m ? m->epoch : 0;
        pthread_mutex_unlock(&v[i].mu);
    }
}

/* A handle on node n whose client is in failure domain domain (NULL: none). */
static tessera_client *open_in(struct fnode *n, const char *domain)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    char err[256];

    tessera_opts_init(&o);
    o.address = n->addr;
    o.timeout_ms = 5000;
    o.max_inflight = 8;
    o.domain = domain;
    assert_int_equal(ts_client_open_ex(&c, &o, err, sizeof(err)), 0);
    return c;
}

static tessera_client *open_on(struct fnode *n)
{
    return open_in(n, NULL);
}

/* Starts nodes v[0..n) and gives each a map of them all, up, at epoch: the map. */
static struct ts_map *cluster_start(struct fnode *v, int n, uint64_t epoch)
{
    struct ts_map *m;

    for (int i = 0; i < n; i++)
        node_start(&v[i], i, 0);
    m = make_map(v, n, epoch, NULL);
    give_map(v, n, m);
    return m;
}

/* Closes c, then stops nodes v[0..n). */
static void cluster_stop(tessera_client *c, struct fnode *v, int n)
{
    tessera_client_close(c);
    for (int i = 0; i < n; i++)
        node_stop(&v[i]);
}

/* The index in v of map node i (by id). */
static int fidx(struct fnode *v, int n, const struct ts_map *m, int i)
{
    for (int k = 0; k < n; k++)
        if (strcmp(v[k].id, m->nodes[i].id) == 0)
            return k;
    fail();
    return -1;
}

static int count(struct fnode *n, const int *field)
{
    int v;

    pthread_mutex_lock(&n->mu);
    v = *field;
    pthread_mutex_unlock(&n->mu);
    return v;
}

/* ---- tests ------------------------------------------------------------------------------------
 */

/* A node with a map makes the handle a router; without one (or an old server) it stays a
 * single-node handle. */
static void test_open_modes(void **state)
{
    struct fnode v[3];
    struct ts_dataset_info d;
    struct ts_map *m;
    tessera_client *c;

    for (int i = 0; i < 3; i++)
        node_start(&v[i], i, 0);
    /* No map: single node, no connection to anyone else. */
    c = open_on(&v[0]);
    assert_int_equal(tessera_client_epoch(c), 0);
    assert_null(ts_client_map(c));
    tessera_client_close(c);
    /* An old server without MAP_GET. */
    v[0].no_map_get = 1;
    c = open_on(&v[0]);
    assert_int_equal(tessera_client_epoch(c), 0);
    tessera_client_close(c);
    v[0].no_map_get = 0;
    /* A map: every request carries its epoch. */
    m = make_map(v, 3, 5, NULL);
    give_map(v, 3, m);
    c = open_on(&v[1]);
    assert_int_equal(tessera_client_epoch(c), 5);
    assert_non_null(ts_client_map(c));
    assert_int_equal(ts_client_map(c)->n, 3);
    assert_string_equal(tessera_client_node(c), "n2");
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(count(&v[i], &v[i].n_stat), 1); /* aggregated over every node */
        assert_int_equal(v[i].last_epoch, 5);
    }
    assert_int_equal(count(&v[1], &v[1].n_hello), 1); /* the seed connection is reused */
    cluster_stop(c, v, 3);
    ts_map_free(m);
}

static void test_write_to_primary(void **state)
{
    uint8_t buf[3 * CHUNK + 100];
    struct fnode v[4];
    struct ts_map *m;
    tessera_client *c;
    int order[4], prim;
    uint32_t pg;

    m = cluster_start(v, 4, 5);
    c = open_on(&v[0]);
    ts_test_fill(buf, sizeof(buf), 3, 0);
    for (uint32_t shard = 0; shard < 8; shard++) {
        int before[4];
        pg = ts_map_pg_of(m, "ds", shard);
        assert_int_equal(ts_map_pg_order(m, pg, order, 4), 4);
        prim = fidx(v, 4, m, order[0]);
        for (int i = 0; i < 4; i++)
            before[i] = count(&v[i], &v[i].n_write);
        assert_int_equal(tessera_put(c, "ds", shard, buf, sizeof(buf), NULL, 0), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(count(&v[i], &v[i].n_write) - before[i], i == prim ? 4 : 0);
        assert_int_equal(v[prim].write_epoch, 5);
    }
    cluster_stop(c, v, 4);
    ts_map_free(m);
}

/* The primary refuses with TS_ESTALE and its newer map: the router adopts it and writes to the
 * primary of the new map. A reply with a higher epoch makes it ask for the map. */
static void test_stale_adoption(void **state)
{
    uint8_t buf[CHUNK];
    char states[4] = "uuu";
    struct fnode v[3];
    struct ts_dataset_info d;
    struct ts_map *m5, *m6, *m7;
    tessera_client *c;
    int order[3], old, now;
    uint32_t pg;

    m5 = cluster_start(v, 3, 5);
    pg = ts_map_pg_of(m5, "ds", 1);
    ts_map_pg_order(m5, pg, order, 3);
    old = fidx(v, 3, m5, order[0]);
    states[old] = 'd';
    m6 = make_map(v, 3, 6, states);
    ts_map_pg_order(m6, pg, order, 3);
    now = fidx(v, 3, m6, order[0]);
    assert_int_not_equal(old, now);
    c = open_on(&v[(old + 1) % 3]);
    assert_int_equal(tessera_client_epoch(c), 5);
    v[old].stale = ts_map_dup(m6);
    give_map(&v[now], 1, m6);
    ts_test_fill(buf, sizeof(buf), 4, 0);
    assert_int_equal(tessera_put(c, "ds", 1, buf, sizeof(buf), NULL, 0), 0);
    assert_int_equal(tessera_client_epoch(c), 6);
    assert_true(count(&v[old], &v[old].n_write) >= 1);
    assert_int_equal(count(&v[now], &v[now].n_write), 1);
    assert_int_equal(count(&v[now], &v[now].n_seal), 1);
    assert_int_equal(v[now].write_epoch, 6);

    /* A reply header with epoch 7: the router asks that node for its map. */
    m7 = make_map(v, 3, 7, states);
    give_map(v, 3, m7);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    assert_int_equal(tessera_client_epoch(c), 7);
    cluster_stop(c, v, 3);
    ts_map_free(m5);
    ts_map_free(m6);
    ts_map_free(m7);
}

/* A shard read from every start: one replica corrupt on disk, one corrupt in transit, one
 * closing the connection, one good. Every read succeeds with the right bytes. */
static void read_failover(enum read_mode bad1, enum read_mode bad2, int submit)
{
    uint8_t want[SHARD_SIZE], got[16][SHARD_SIZE];
    struct fnode v[3];
    struct ts_map *m;
    tessera_client *c;
    uint64_t ops[16], op;
    int reads_bad = 0, seen[16] = {0};
    size_t n;

    m = cluster_start(v, 3, 5);
    v[0].rd = bad1;
    v[1].rd = bad2;
    c = open_on(&v[2]);
    /* 16 shards: their reads start at different replicas. */
    for (uint32_t s = 0; s < 16; s++) {
        if (submit) {
            assert_int_equal(tessera_read_submit(c, "ds", s, 0, SHARD_SIZE, got[s], &ops[s]), 0);
            continue;
        }
        memset(got[s], 0, SHARD_SIZE);
        assert_int_equal(tessera_read(c, "ds", s, 0, SHARD_SIZE, got[s], &n), 0);
        assert_int_equal(n, SHARD_SIZE);
        shard_bytes(s, 0, want, SHARD_SIZE);
        assert_memory_equal(got[s], want, SHARD_SIZE);
    }
    if (submit) {
        /* One by id, the rest as they come. */
        assert_int_equal(tessera_wait(c, ops[5], &n), 0);
        assert_int_equal(n, SHARD_SIZE);
        seen[5] = 1;
        for (int i = 0; i < 15; i++) {
            uint32_t s = 16;
            assert_int_equal(tessera_wait_any(c, &op, &n), 0);
            assert_int_equal(n, SHARD_SIZE);
            for (uint32_t k = 0; k < 16; k++)
                if (ops[k] == op)
                    s = k;
            assert_true(s < 16);
            assert_false(seen[s]);
            seen[s] = 1;
        }
        assert_int_equal(tessera_wait_any(c, &op, &n), TS_ENOENT);
        for (uint32_t s = 0; s < 16; s++) {
            shard_bytes(s, 0, want, SHARD_SIZE);
            assert_memory_equal(got[s], want, SHARD_SIZE);
        }
    }
    reads_bad = count(&v[0], &v[0].n_read) + count(&v[1], &v[1].n_read);
    assert_true(reads_bad > 0); /* some reads went to a bad replica first */
    assert_true(count(&v[2], &v[2].n_read) == 16);
    cluster_stop(c, v, 3);
    ts_map_free(m);
}

static void test_read_failover_corrupt(void **state)
{
    read_failover(RD_CORRUPT_STATUS, RD_CORRUPT_WIRE, 0);
}

static void test_read_failover_closed(void **state)
{
    read_failover(RD_CLOSE, RD_CLOSE, 0);
}

static void test_submit_failover(void **state)
{
    read_failover(RD_CORRUPT_WIRE, RD_CLOSE, 1);
}

/* Every replica bad: the error names each of them. */
static void test_read_all_bad(void **state)
{
    uint8_t buf[SHARD_SIZE];
    struct fnode v[2];
    struct ts_map *m;
    tessera_client *c;
    size_t n;

    m = cluster_start(v, 2, 5);
    for (int i = 0; i < 2; i++) {
        v[i].rd = RD_CORRUPT_STATUS;
        v[i].pol.core = 2;
    }
    c = open_on(&v[0]);
    assert_int_equal(tessera_read(c, "ds", 0, 0, sizeof(buf), buf, &n), TS_ECORRUPT);
    assert_int_equal(n, 0);
    assert_non_null(strstr(tessera_client_error(c), "n1"));
    assert_non_null(strstr(tessera_client_error(c), "n2"));
    cluster_stop(c, v, 2);
    ts_map_free(m);
}

/* Create and delete go to every node that is not out; a down node that cannot be reached does
 * not fail them, an up node that refuses does. */
static void test_dataset_broadcast(void **state)
{
    struct ts_dataset_policy p = {3, 0, 1, 0, 0, 0, 0, 0};
    struct fnode v[5];
    struct ts_map *m;
    tessera_client *c;

    for (int i = 0; i < 5; i++)
        node_start(&v[i], i, i >= 3); /* n4 (down) and n5 (out) do not listen */
    m = make_map(v, 5, 5, "uuudo");
    give_map(v, 3, m);
    c = open_on(&v[0]);
    assert_int_equal(tessera_dataset_create(c, "ds", &p), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(count(&v[i], &v[i].n_create), 1);
    assert_int_equal(tessera_dataset_delete(c, "ds"), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(count(&v[i], &v[i].n_delete), 1);
    v[1].create_rc = TS_ENOSPC;
    assert_int_equal(tessera_dataset_create(c, "ds", &p), TS_ENOSPC);
    assert_non_null(strstr(tessera_client_error(c), "n2"));
    for (int i = 0; i < 3; i++) /* still sent to every node */
        assert_int_equal(count(&v[i], &v[i].n_create), 2);
    cluster_stop(c, v, 5);
    ts_map_free(m);
}

/* The seal checks completeness over the union of the nodes' shards, then seals each node
 * with TS_SEAL_LOCAL_ONLY; stat counts the union. */
static void test_seal_union(void **state)
{
    struct ts_dataset_info d;
    struct ts_shard_info *sl;
    struct fnode v[3];
    struct ts_map *m;
    tessera_client *c;
    size_t n;

    m = cluster_start(v, 3, 5);
    v[0].nshards = 2; /* 0, 2 on n1; 1 and 2 on n2; nothing on n3 */
    v[0].shards[0] = 0;
    v[0].shards[1] = 2;
    v[0].shard_state[0] = v[0].shard_state[1] = TS_SHARD_COMPLETE;
    v[1].nshards = 2;
    v[1].shards[0] = 1;
    v[1].shards[1] = 2;
    v[1].shard_state[0] = TS_SHARD_WRITING;
    v[1].shard_state[1] = TS_SHARD_COMPLETE;
    c = open_on(&v[0]);
    /* Shard 1 is being written and complete nowhere. */
    assert_int_equal(tessera_dataset_seal(c, "ds"), TS_EINCOMPLETE);
    assert_non_null(strstr(tessera_client_error(c), "shard 1"));
    for (int i = 0; i < 3; i++)
        assert_int_equal(count(&v[i], &v[i].n_dseal), 0);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    assert_int_equal(d.shards, 2);
    assert_int_equal(d.shards_writing, 1);
    assert_int_equal(d.bytes, 2 * SHARD_SIZE);
    assert_int_equal(tessera_shard_list(c, "ds", &sl, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(sl[2].shard, 2);
    assert_int_equal(sl[2].state, TS_SHARD_COMPLETE);
    free(sl);
    v[1].shard_state[0] = TS_SHARD_COMPLETE;
    assert_int_equal(tessera_dataset_seal(c, "ds"), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(count(&v[i], &v[i].n_dseal), 1);
        assert_int_equal(v[i].dseal_flags, TS_SEAL_LOCAL_ONLY);
    }
    /* A missing shard number. */
    v[1].shards[0] = 3;
    assert_int_equal(tessera_dataset_seal(c, "ds"), TS_EINCOMPLETE);
    assert_non_null(strstr(tessera_client_error(c), "shard 1 is missing"));
    cluster_stop(c, v, 3);
    ts_map_free(m);
}

/* map push from a single-node handle: epoch above every node's, written back, pushed to all;
 * a down node that cannot be reached does not fail it. */
static void test_map_push_file(void **state)
{
    char *dir = ts_test_tmpdir("cluster"), path[512], err[256];
    struct ts_map *m, *m4, *back = NULL;
    struct fnode v[4];
    tessera_client *c;
    uint64_t e;

    for (int i = 0; i < 4; i++)
        node_start(&v[i], i, i == 3);
    m = make_map(v, 4, 1, "uuud");
    m4 = make_map(v, 4, 4, "uuud");
    give_map(&v[2], 1, m4); /* n3 already runs at epoch 4 */
    snprintf(path, sizeof(path), "%s/cluster.map", dir);
    assert_int_equal(ts_map_write_file(m, path), 0);
    c = open_on(&v[0]);
    assert_int_equal(tessera_client_epoch(c), 0);
    assert_int_equal(tessera_map_push_file(c, path, &e), 0);
    assert_int_equal(e, 5);
    /* The operator's file is never rewritten: it keeps its own epoch. */
    assert_int_equal(ts_map_parse_file(path, &back, err, sizeof(err)), 0);
    assert_int_equal(back->epoch, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(count(&v[i], &v[i].n_push), 1);
        assert_int_equal(v[i].pushed->epoch, 5);
    }
    assert_non_null(strstr(tessera_client_error(c), "n4"));
    /* An up node that cannot be reached fails it. */
    ts_map_free(back);
    back = make_map(v, 4, 5, NULL);
    assert_int_equal(ts_map_write_file(back, path), 0);
    assert_int_equal(tessera_map_push_file(c, path, &e), TS_ECONNREFUSED);
    assert_int_equal(e, 6);
    assert_non_null(strstr(tessera_client_error(c), "n4"));
    cluster_stop(c, v, 4);
    ts_map_free(m);
    ts_map_free(m4);
    ts_map_free(back);
    ts_test_rmtree(dir);
}

static void test_failover(void **state)
{
    struct fnode v[4];
    struct ts_map *m;
    tessera_client *c;
    int order[4], old, now;
    uint64_t e;

    m = cluster_start(v, 4, 5);
    ts_map_pg_order(m, 3, order, 4);
    old = fidx(v, 4, m, order[0]);
    now = fidx(v, 4, m, order[1]);
    c = open_on(&v[(old + 1) % 4]);
    assert_int_equal(tessera_failover(c, 99, &e), TS_EINVAL);
    assert_int_equal(tessera_failover(c, 3, &e), 0);
    assert_int_equal(e, 6);
    assert_int_equal(tessera_client_epoch(c), 6);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(count(&v[i], &v[i].n_push), i == old ? 0 : 1);
        if (i != old) {
            assert_int_equal(v[i].pushed->epoch, 6);
            assert_int_equal(v[i].pushed->nodes[ts_map_find(v[i].pushed, v[old].id)].state,
                             TS_NODE_DOWN);
        }
    }
    ts_map_pg_order(ts_client_map(c), 3, order, 1);
    assert_string_equal(ts_client_map(c)->nodes[order[0]].id, v[now].id);
    cluster_stop(c, v, 4);
    ts_map_free(m);
}

/* Reads shards 0..15 of name through c, one replica per PG: each goes to the first node of
 * its PG under map m, and two shards share a READV lane exactly when they share that node. */
static void reads_follow(tessera_client *c, struct fnode *v, int n, const struct ts_map *m,
                         const char *name)
{
    uint8_t buf[64];
    size_t got, lane[16];
    int order[1], want[16];

    for (uint32_t s = 0; s < 16; s++) {
        int before[NMAX];
        ts_map_pg_order(m, ts_map_pg_of(m, name, s), order, 1);
        want[s] = fidx(v, n, m, order[0]);
        for (int i = 0; i < n; i++)
            before[i] = count(&v[i], &v[i].n_read);
        assert_int_equal(tessera_read(c, name, s, 0, sizeof(buf), buf, &got), 0);
        for (int i = 0; i < n; i++)
            assert_int_equal(count(&v[i], &v[i].n_read) - before[i], i == want[s]);
        lane[s] = ts_client_read_lane(c, name, s, 0);
        assert_int_not_equal(lane[s], SIZE_MAX);
        assert_int_equal(ts_client_read_lane(c, name, s, 0), lane[s]); /* kept, the same */
    }
    for (uint32_t a = 0; a < 16; a++)
        for (uint32_t b = 0; b < 16; b++)
            assert_int_equal(lane[a] == lane[b], want[a] == want[b]);
}

/* Reads go to their PG's replicas under the map the router holds now: after another dataset
 * (other PGs for the same shard numbers) and after a map with another PG count (the router
 * keeps each shard's PG while the name and the map stay). */
static void test_placement_follows_map(void **state)
{
    struct fnode v[4];
    struct ts_map *m5, *m6;
    struct ts_dataset_info d;
    tessera_client *c;
    int moved = 0;

    m5 = cluster_start(v, 4, 5);
    for (int i = 0; i < 4; i++)
        v[i].pol.core = 1; /* one replica: the read has one place to go */
    c = open_on(&v[0]);
    reads_follow(c, v, 4, m5, "ds");
    reads_follow(c, v, 4, m5, "other");
    reads_follow(c, v, 4, m5, "ds");

    m6 = make_map_pgs(v, 4, 6, NULL, 5);
    for (uint32_t s = 0; s < 16; s++) {
        int a[1], b[1];
        ts_map_pg_order(m5, ts_map_pg_of(m5, "ds", s), a, 1);
        ts_map_pg_order(m6, ts_map_pg_of(m6, "ds", s), b, 1);
        moved += strcmp(m5->nodes[a[0]].id, m6->nodes[b[0]].id) != 0;
    }
    assert_true(moved > 0); /* the new map sends some shards elsewhere */
    give_map(v, 4, m6);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0); /* a reply at epoch 6: adopted */
    assert_int_equal(tessera_client_epoch(c), 6);
    reads_follow(c, v, 4, m6, "ds");
    cluster_stop(c, v, 4);
    ts_map_free(m5);
    ts_map_free(m6);
}

/* The primary is gone: the router asks the others for a newer map and writes to its primary;
 * without one it fails naming the primary and the failover to run. */
static void test_primary_unreachable(void **state)
{
    uint8_t buf[100];
    char states[4] = "uuu";
    struct fnode v[3];
    struct ts_map *m5, *m6;
    tessera_client *c;
    int order[3], old, now, seed;
    uint32_t pg;

    m5 = cluster_start(v, 3, 5);
    pg = ts_map_pg_of(m5, "ds", 2);
    ts_map_pg_order(m5, pg, order, 3);
    old = fidx(v, 3, m5, order[0]);
    seed = (old + 1) % 3;
    c = open_on(&v[seed]);
    node_stop(&v[old]); /* the primary dies */
    node_start(&v[old], old, 1);
    snprintf(v[old].addr, sizeof(v[old].addr), "%s", m5->nodes[order[0]].addr);
    ts_test_fill(buf, sizeof(buf), 5, 0);
    assert_int_equal(tessera_put(c, "ds", 2, buf, sizeof(buf), NULL, 0), TS_ECONNREFUSED);
    assert_non_null(strstr(tessera_client_error(c), "tessera failover"));
    /* An operator fails the PG over; the others know the new map. */
    states[old] = 'd';
    m6 = make_map(v, 3, 6, states);
    for (int i = 0; i < 3; i++)
        if (i != old)
            give_map(&v[i], 1, m6);
    ts_map_pg_order(m6, pg, order, 3);
    now = fidx(v, 3, m6, order[0]);
    assert_int_equal(tessera_put(c, "ds", 2, buf, sizeof(buf), NULL, 0), 0);
    assert_int_equal(tessera_client_epoch(c), 6);
    assert_int_equal(count(&v[now], &v[now].n_seal), 1);
    cluster_stop(c, v, 3);
    ts_map_free(m5);
    ts_map_free(m6);
}

/* Reads of 16 shards (3 regions each) through c, half of them submitted; every byte checked.
 * The reads each node of v[0..n) served to got[]. */
static void read_all(tessera_client *c, struct fnode *v, int n, int *got)
{
    static uint8_t buf[16][3][64], want[64];
    uint64_t ops[16][3];
    size_t len;

    for (int i = 0; i < n; i++)
        got[i] = -count(&v[i], &v[i].n_read);
    for (uint32_t s = 0; s < 16; s++)
        for (int r = 0; r < 3; r++) {
            uint64_t off = (uint64_t)r * 4000; /* the fake shard is 10000 bytes */
            if (s % 2) {
                assert_int_equal(tessera_read_submit(c, "ds", s, off, 64, buf[s][r], &ops[s][r]),
                                 0);
                continue;
            }
            assert_int_equal(tessera_read(c, "ds", s, off, 64, buf[s][r], &len), 0);
            assert_int_equal(len, 64);
        }
    for (uint32_t s = 1; s < 16; s += 2)
        for (int r = 0; r < 3; r++) {
            assert_int_equal(tessera_wait(c, ops[s][r], &len), 0);
            assert_int_equal(len, 64);
        }
    for (uint32_t s = 0; s < 16; s++)
        for (int r = 0; r < 3; r++) {
            shard_bytes(s, (uint64_t)r * 4000, want, sizeof(want));
            assert_memory_equal(buf[s][r], want, sizeof(want));
        }
    for (int i = 0; i < n; i++)
        got[i] += count(&v[i], &v[i].n_read);
}

/*
 * tessera_opts.domain: a client in dc-b reads from the replicas in dc-b (n2, n3), spread over
 * both, opened on a node elsewhere or not; a domain that names a node without a domain (n4)
 * reads from it; without a domain reads spread over every replica; with both of dc-b's
 * replicas failing, reads fall back to the others. A malformed domain is refused at open.
 */
static void test_reads_local_first(void **state)
{
    static const char *const domains[] = {"dc-a", "dc-b", "dc-b", ""};
    struct tessera_opts o;
    struct fnode v[4];
    struct ts_map *m;
    tessera_client *c = NULL;
    char err[256], longer[80];
    int got[4];

    for (int i = 0; i < 4; i++)
        node_start(&v[i], i, 0);
    m = make_map_domains(v, 4, 5, domains);
    give_map(v, 4, m);
    for (int i = 0; i < 4; i++)
        v[i].pol.core = 4; /* every node is a replica of every PG */
    /* dc-b: n2 and n3 serve every read, both some of them (16 shards x 3 regions). */
    for (int seed = 0; seed < 2; seed++) {
        c = open_in(&v[seed], "dc-b");
        read_all(c, v, 4, got);
        fprintf(stderr, "dc-b, opened on %s: n1..n4 served %d %d %d %d reads\n", v[seed].id, got[0],
                got[1], got[2], got[3]);
        assert_int_equal(got[0] + got[3], 0);
        assert_int_equal(got[1] + got[2], 48);
        assert_true(got[1] > 0 && got[2] > 0);
        tessera_client_close(c);
    }
    /* n4 has no domain: its id is its domain. */
    c = open_in(&v[0], "n4");
    read_all(c, v, 4, got);
    assert_int_equal(got[3], 48);
    tessera_client_close(c);
    /* A domain no node is in, and none: the usual spread over all four. */
    for (int k = 0; k < 2; k++) {
        c = open_in(&v[1], k ? NULL : "dc-z");
        read_all(c, v, 4, got);
        fprintf(stderr, "%s: n1..n4 served %d %d %d %d reads\n", k ? "no domain" : "dc-z", got[0],
                got[1], got[2], got[3]);
        assert_int_equal(got[0] + got[1] + got[2] + got[3], 48);
        assert_true(got[0] > 0 && got[3] > 0);
        tessera_client_close(c);
    }
    /* dc-b's replicas fail (one closes the connection, one says its chunk is corrupt): every
     * read falls back to n1 or n4 and returns the right bytes. */
    v[1].rd = RD_CLOSE;
    v[2].rd = RD_CORRUPT_STATUS;
    c = open_in(&v[0], "dc-b");
    read_all(c, v, 4, got);
    fprintf(stderr, "dc-b failing: n1..n4 served %d %d %d %d reads\n", got[0], got[1], got[2],
            got[3]);
    assert_true(got[1] + got[2] > 0); /* they were tried */
    assert_true(got[0] + got[3] >= 48);
    tessera_client_close(c);
    /* Malformed domains: refused before connecting. */
    memset(longer, 'x', 64);
    longer[64] = '\0';
    tessera_opts_init(&o);
    o.address = v[0].addr;
    for (int k = 0; k < 2; k++) {
        o.domain = k ? longer : "dc b";
        c = NULL;
        err[0] = '\0';
        assert_int_equal(ts_client_open_ex(&c, &o, err, sizeof(err)), TS_EINVAL);
        assert_null(c);
        assert_non_null(strstr(err, "domain"));
    }
    for (int i = 0; i < 4; i++)
        node_stop(&v[i]);
    ts_map_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_modes),
        cmocka_unit_test(test_write_to_primary),
        cmocka_unit_test(test_stale_adoption),
        cmocka_unit_test(test_read_failover_corrupt),
        cmocka_unit_test(test_read_failover_closed),
        cmocka_unit_test(test_submit_failover),
        cmocka_unit_test(test_read_all_bad),
        cmocka_unit_test(test_dataset_broadcast),
        cmocka_unit_test(test_seal_union),
        cmocka_unit_test(test_map_push_file),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_placement_follows_map),
        cmocka_unit_test(test_primary_unreachable),
        cmocka_unit_test(test_reads_local_first),
    };

    signal(SIGPIPE, SIG_IGN);
    ts_test_log_init();
    return cmocka_run_group_tests_name("client_cluster", tests, NULL, NULL);
}
