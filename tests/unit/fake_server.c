/*
 * A fake tessera server for the client's unit tests (fake_server.h): frames read and written
 * on the far end of a socketpair, scripted replies, a client opened against it.
 */
#include "fake_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Reads exactly n bytes (blocking); 0 or -1 on EOF/error. */
int read_exact(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;

    while (n) {
        ssize_t k = read(fd, p, n);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int write_exact(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;

    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One request frame from the client; *payload is malloc'ed. */
int fake_recv(int fd, struct ts_frame_hdr *h, uint8_t **payload)
{
    uint8_t hdr[TS_HDR_LEN];

    if (read_exact(fd, hdr, sizeof(hdr)))
        return -1;
    if (ts_frame_parse(hdr, sizeof(hdr), UINT32_MAX, h) != TS_HDR_LEN)
        return -1;
    *payload = malloc(h->length + 1);
    if (!*payload || read_exact(fd, *payload, h->length))
        return -1;
    return 0;
}

/* A reply frame with body w (which starts with the status), optional raw tail. */
void fake_send(int fd, uint8_t op, uint64_t id, const struct ts_wr *w, const void *tail,
               size_t tail_len)
{
    struct ts_frame_hdr h = {TS_PROTO_VERSION, op, TS_F_REPLY, id, 0, 0};
    uint8_t hdr[TS_HDR_LEN];

    h.length = (uint32_t)(w->len + tail_len);
    ts_frame_encode(hdr, &h);
    assert_int_equal(write_exact(fd, hdr, sizeof(hdr)), 0);
    assert_int_equal(write_exact(fd, w->buf, w->len), 0);
    if (tail_len)
        assert_int_equal(write_exact(fd, tail, tail_len), 0);
}

void fake_error(int fd, uint8_t op, uint64_t id, int rc, const char *msg)
{
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_u32(&w, (uint32_t)rc);
    ts_wr_str(&w, msg);
    fake_send(fd, op, id, &w, NULL, 0);
    ts_wr_fini(&w);
}

void fake_hello(int fd, uint64_t id)
{
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, "fake-node");
    ts_wr_u8(&w, TS_ROLE_ADMIN);
    ts_wr_u32(&w, TS_MAX_CHUNK + 4096);
    ts_wr_u64(&w, 3);
    fake_send(fd, TS_OP_HELLO, id, &w, NULL, 0);
    ts_wr_fini(&w);
}

void fake_dataset_info(int fd, uint64_t id, const char *name, uint32_t chunk)
{
    struct ts_dataset_info d = {.id = 9, .policy = {1, 0, 1, chunk}};
    struct ts_wr w;

    snprintf(d.name, sizeof(d.name), "%s", name);
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_dataset_info(&w, &d);
    fake_send(fd, TS_OP_DATASET_STAT, id, &w, NULL, 0);
    ts_wr_fini(&w);
}

/* A READ reply for [off, off+len) of shard (size bytes), pieces of chunk bytes. */
void fake_read_reply(int fd, uint64_t id, const uint8_t *shard, uint64_t size, uint32_t chunk,
                     uint64_t off, uint32_t len, enum lie lie)
{
    uint64_t end = off >= size ? off : TS_MIN(size, off + len), p;
    uint32_t n = 0;
    struct ts_wr w;
    uint8_t *data;
    size_t dlen;

    if (lie == LIE_LONG)
        end += 7;
    dlen = (size_t)(end - off);
    data = malloc(dlen + 1);
    memcpy(data, shard + off, (size_t)(TS_MIN(end, size) - off));
    if (end > size)
        memset(data + (size - off), 0xAA, (size_t)(end - size));
    for (p = off; p < end; p = (p / chunk + 1) * chunk)
        n++;
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, lie == LIE_SIZE ? off + len / 2 : size); /* says the shard ends early */
    ts_wr_u32(&w, n);
    for (p = off; p < end;) {
        uint64_t q = TS_MIN((p / chunk + 1) * chunk, end);
        uint32_t crc = ts_crc32c(0, data + (p - off), (size_t)(q - p));
        ts_wr_u32(&w, (uint32_t)(q - p) + (lie == LIE_SUM && p == off ? 1 : 0));
        ts_wr_u32(&w, lie == LIE_CRC && q == end ? crc ^ 1 : crc);
        p = q;
    }
    fake_send(fd, TS_OP_READ, id, &w, data, dlen);
    ts_wr_fini(&w);
    free(data);
}

static void *verify_reply_main(void *arg)
{
    struct verify_reply *v = arg;
    struct ts_frame_hdr h;
    uint8_t *payload;

    do {
        if (fake_recv(v->fd, &h, &payload) != 0)
            return (void *)1;
        free(payload);
    } while (!(h.flags & TS_F_VERIFY));
    return write_exact(v->fd, v->buf, v->len) ? (void *)1 : NULL;
}

/* Starts a thread that answers the next VERIFY read on fd with fake_read_reply(args). */
void verify_reply_start(struct verify_reply *v, int fd, uint64_t id, const uint8_t *shard,
                        uint64_t size, uint32_t chunk, uint64_t off, uint32_t len, enum lie lie)
{
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fake_read_reply(sv[0], id, shard, size, chunk, off, len, lie);
    close(sv[0]);
    v->buf = malloc(1u << 16);
    assert_non_null(v->buf);
    v->len = 0;
    for (ssize_t k; (k = read(sv[1], v->buf + v->len, (1u << 16) - v->len)) > 0;)
        v->len += (size_t)k;
    close(sv[1]);
    v->fd = fd;
    assert_int_equal(pthread_create(&v->th, NULL, verify_reply_main, v), 0);
}

void verify_reply_join(struct verify_reply *v)
{
    void *bad;

    assert_int_equal(pthread_join(v->th, &bad), 0);
    assert_null(bad);
    free(v->buf);
}

/* A MAP_GET reply of a single node: epoch 0, no nodes. */
void fake_no_map(int fd, uint64_t id)
{
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, 0);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 0);
    fake_send(fd, TS_OP_MAP_GET, id, &w, NULL, 0);
    ts_wr_fini(&w);
}

/* Answers the handshake of tessera_client_open: HELLO, then MAP_GET (no map). */
static void *fake_handshake(void *arg)
{
    int fd = *(int *)arg;
    struct ts_frame_hdr h;
    uint8_t *p;

    if (fake_recv(fd, &h, &p) != 0 || h.opcode != TS_OP_HELLO || h.req_id != 1)
        return (void *)1;
    free(p);
    fake_hello(fd, 1);
    if (fake_recv(fd, &h, &p) != 0 || h.opcode != TS_OP_MAP_GET || h.req_id != 2)
        return (void *)1;
    free(p);
    fake_no_map(fd, 2);
    return NULL;
}

/* A client over sv[0] (the handshake answered on sv[1]), with the TCP transport's table or
 * ops. */
static tessera_client *open_on(int sv[2], int *peer, int timeout_ms,
                               const struct ts_transport_ops *ops)
{
    struct ts_transport *t;
    struct tessera_opts o;
    tessera_client *c = NULL;
    pthread_t th;
    void *bad;
    char err[128];

    assert_int_equal(pthread_create(&th, NULL, fake_handshake, &sv[1]), 0);
    assert_int_equal(ts_tcp_from_fd(&t, sv[0]), 0);
    if (ops)
        t->ops = ops;
    tessera_opts_init(&o);
    o.timeout_ms = timeout_ms;
    o.max_inflight = 8;
    assert_int_equal(ts_client_open_transport(&c, &o, t, err, sizeof(err)), 0);
    pthread_join(th, &bad);
    assert_null(bad);
    assert_int_equal(tessera_client_epoch(c), 0); /* a single node */
    assert_string_equal(tessera_client_node(c), "fake-node");
    assert_int_equal(tessera_client_role(c), TS_ROLE_ADMIN);
    *peer = sv[1];
    return c;
}

/*
 * A client over one end of a socketpair; the other end is *peer. HELLO and MAP_GET (no map:
 * a single node) are answered first. ops, when not NULL, replaces the TCP transport's table
 * (a wrapper around it).
 */
tessera_client *open_pair_ops(int *peer, int timeout_ms, const struct ts_transport_ops *ops)
{
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    return open_on(sv, peer, timeout_ms, ops);
}

tessera_client *open_tcp_pair_ops(int *peer, int timeout_ms, const struct ts_transport_ops *ops)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), sv[2];

    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &alen), 0);
    sv[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(sv[0], (struct sockaddr *)&a, sizeof(a)), 0);
    sv[1] = accept(l, NULL, NULL);
    assert_true(sv[1] >= 0);
    close(l);
    return open_on(sv, peer, timeout_ms, ops);
}

tessera_client *open_pair(int *peer, int timeout_ms)
{
    return open_pair_ops(peer, timeout_ms, NULL);
}

/* Reads one request frame the client sent and checks its opcode; returns its id. */
uint64_t expect_req(int fd, uint8_t op)
{
    struct ts_frame_hdr h;
    uint8_t *p = NULL;

    assert_int_equal(fake_recv(fd, &h, &p), 0);
    assert_int_equal(h.opcode, op);
    assert_int_equal(h.flags, 0);
    assert_int_equal(h.epoch, 3); /* the epoch from HELLO travels with every request */
    free(p);
    return h.req_id;
}
