/*
 * The RDMA transport against a real tesserad over real RDMA (Soft-RoCE in the qemu guest of
 * tests/rdma-vm/, or any RDMA host): TESSERA_RDMA_ADDR names the address of an RDMA device's
 * interface; without it the test is skipped (77). Every read is checked byte for byte, and the
 * node's STATUS proves the data came by RDMA WRITE (rdma_placed_bytes), not in-band.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "client_internal.h"
#include "gpu/placed.h"
#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (256u << 10)
#define DS "rdma-ds"

static struct tsd_proc D;
static char rdma_url[128]; /* rdma://CONTROL: a session admitted through the TCP listener */

/* Shard sizes: empty, one byte, one chunk and a bit, more than the server's placement memory
 * (4 MiB: the stream waits for WRITE completions), and more than one READ's worth of pieces. */
static const size_t sizes[] = {0, 1, CHUNK + 17, (5u << 20) + 3, (9u << 20) + 1};

static void fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        uint64_t x = i * 0x9E3779B97F4A7C15ull ^ seed * 0xC2B2AE3D27D4EB4Full;
        x ^= x >> 29;
        p[i] = (uint8_t)(x ^ (x >> 17));
    }
}

static tessera_client *open_url(const char *url)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    int rc;

    tessera_opts_init(&o);
    o.address = url;
    o.timeout_ms = 60000;
    rc = tessera_client_open(&c, &o);
    if (rc)
        fprintf(stderr, "open %s: %s\n", url, ts_strerror(rc));
    assert_int_equal(rc, 0);
    return c;
}

/* A number from the node's STATUS document ("key": N). */
static long long status_num(const char *key)
{
    tessera_client *c = open_url(D.addr);
    char *json = NULL, pat[64];
    const char *p;
    long long v = -1;

    assert_int_equal(tessera_status(c, &json), 0);
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(json, pat);
    if (p)
        v = strtoll(p + strlen(pat), NULL, 10);
    free(json);
    tessera_client_close(c);
    return v;
}

static int group_setup(void **state)
{
    const char *host = getenv("TESSERA_RDMA_ADDR");
    char listen[96];
    tessera_client *c;
    struct ts_dataset_policy p;

    if (!host || !*host) {
        fprintf(stderr, "test_rdma: skipped: no RDMA here (set TESSERA_RDMA_ADDR to the address "
                        "of an RDMA device's interface; tests/rdma-vm/run does)\n");
        exit(77);
    }
    snprintf(listen, sizeof(listen), "%s:0", host);
    {
        const char *const extra[] = {"--rdma-listen", listen, "--workers", "2", NULL};
        if (tsd_start(&D, extra) != 0 || !D.rdma_addr[0]) {
            tsd_dump_log(&D);
            return -1;
        }
    }
    snprintf(rdma_url, sizeof(rdma_url), "rdma://%s", D.addr);
    c = open_url(D.addr);
    memset(&p, 0, sizeof(p));
    p.core = 1;
    p.min_core = 1;
    p.chunk_size = CHUNK;
    assert_int_equal(tessera_dataset_create(c, DS, &p), 0);
    for (uint32_t i = 0; i < TS_ARRAY_SIZE(sizes); i++) {
        uint8_t *buf = malloc(sizes[i] + 1);
        fill(buf, sizes[i], i + 1);
        assert_int_equal(tessera_put(c, DS, i, buf, sizes[i], NULL, 0), 0);
        free(buf);
    }
    tessera_client_close(c);
    return 0;
}

static int group_teardown(void **state)
{
    tsd_stop(&D);
    tsd_cleanup(&D);
    return 0;
}

/* Reads [off, off + len) of shard i into a fresh buffer and checks every byte against what was
 * put (and that nothing past the shard's end was touched). */
static void check_range(tessera_client *c, uint32_t i, uint64_t off, size_t len)
{
    size_t size = sizes[i], n = 99, want = off >= size ? 0 : TS_MIN(len, size - (size_t)off);
    uint8_t *got = malloc(len + 64), *ref = malloc(size + 1);

    memset(got, 0xEE, len + 64);
    fill(ref, size, i + 1);
    assert_int_equal(tessera_read(c, DS, i, off, len, got, &n), 0);
    assert_int_equal(n, want);
    if (want)
        assert_memory_equal(got, ref + off, want);
    for (size_t k = want; k < len + 64; k++)
        assert_int_equal(got[k], 0xEE);
    free(got);
    free(ref);
}

static void test_placed_reads(void **state)
{
    tessera_client *c = open_url(rdma_url);
    long long before = status_num("rdma_placed_bytes"), after;
    struct ts_dataset_info info;

    /* Frames in-band: the dataset's description comes over SEND/RECV. */
    assert_int_equal(tessera_dataset_stat(c, DS, &info), 0);
    assert_int_equal(info.policy.chunk_size, CHUNK);
    for (uint32_t i = 0; i < TS_ARRAY_SIZE(sizes); i++) {
        check_range(c, i, 0, sizes[i] + 10);
        if (sizes[i] > CHUNK) {
            check_range(c, i, CHUNK - 5, 10);     /* across a chunk boundary */
            check_range(c, i, 3, sizes[i] - 100); /* partial first and last pieces */
        }
    }
    after = status_num("rdma_placed_bytes");
    if (after - before < (long long)(sizes[3] + sizes[4]))
        fprintf(stderr, "rdma_placed_bytes %lld -> %lld\n", before, after);
    assert_true(after - before >= (long long)(sizes[3] + sizes[4]));
    assert_true(status_num("rdma_sessions") >= 1);
    tessera_client_close(c);
}

/* Many reads in flight on one session, and several sessions at once. */
struct reader_arg {
    int id;
    int rc;
    char msg[300];
};

static void *reader_main(void *arg)
{
    struct reader_arg *a = arg;
    struct tessera_opts o;
    tessera_client *c = NULL;
    enum { N = 24 };
    uint8_t *bufs[N], *ref = malloc(sizes[3]);
    uint64_t ops[N];
    size_t len = 300000;

    tessera_opts_init(&o);
    o.address = rdma_url;
    o.timeout_ms = 60000;
    a->rc = ts_client_open_ex(&c, &o, a->msg, sizeof(a->msg));
    if (a->rc)
        return NULL;
    fill(ref, sizes[3], 4);
    for (int k = 0; k < N; k++) {
        uint64_t off = ((uint64_t)(k * 7 + a->id) * 131071) % (sizes[3] - len);
        bufs[k] = malloc(len);
        a->rc = tessera_read_submit(c, DS, 3, off, len, bufs[k], &ops[k]);
        if (a->rc)
            return NULL;
    }
    for (int k = 0; k < N && !a->rc; k++) {
        uint64_t off = ((uint64_t)(k * 7 + a->id) * 131071) % (sizes[3] - len);
        size_t n = 0;
        a->rc = tessera_wait(c, ops[k], &n);
        if (a->rc)
            snprintf(a->msg, sizeof(a->msg), "read %d: %s", k, tessera_client_error(c));
        if (!a->rc && (n != len || memcmp(bufs[k], ref + off, len) != 0))
            a->rc = TS_ECORRUPT;
        free(bufs[k]);
    }
    tessera_client_close(c);
    free(ref);
    return NULL;
}

static void test_concurrent(void **state)
{
    enum { T = 4 };
    pthread_t th[T];
    struct reader_arg a[T];

    for (int t = 0; t < T; t++) {
        a[t] = (struct reader_arg){t, -1, ""};
        assert_int_equal(pthread_create(&th[t], NULL, reader_main, &a[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        if (a[t].rc)
            fprintf(stderr, "reader %d: %s: %s\n", t, ts_strerror(a[t].rc), a[t].msg);
        assert_int_equal(a[t].rc, 0);
    }
}

/* A token from the control connection, by hand (what open.c does). */
static void get_token(uint8_t tok[TS_RDMA_TOKEN_LEN], char *host, size_t hcap, char *port,
                      size_t pcap)
{
    int fd = raw_connect(D.addr);
    uint8_t *payload = NULL;
    size_t plen = 0;
    uint64_t id;
    uint16_t n;
    char addr[128];

    assert_true(fd >= 0);
    assert_int_equal(raw_send_frame(fd, TS_OP_RDMA_TOKEN, 0, 9, NULL, 0), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, &id, NULL, 0, &payload, &plen), 0);
    assert_true(plen >= 4 + TS_RDMA_TOKEN_LEN + 4 + 2);
    memcpy(tok, payload + 4, TS_RDMA_TOKEN_LEN);
    n = ts_get_le16(payload + 4 + TS_RDMA_TOKEN_LEN + 4);
    assert_true(n < sizeof(addr));
    memcpy(addr, payload + 4 + TS_RDMA_TOKEN_LEN + 4 + 2, n);
    addr[n] = '\0';
    *strrchr(addr, ':') = '\0';
    snprintf(host, hcap, "%.95s", addr);
    snprintf(port, pcap, "%s", addr + strlen(addr) + 1);
    free(payload);
    raw_close(fd);
}

static int connect_with(const uint8_t *tok, const char *host, const char *port, char *err,
                        size_t cap, struct ts_transport **t)
{
    struct ts_conn_params p = {.host = host,
                               .port = port,
                               .timeout_ms = 20000,
                               .rdma_token = tok,
                               .err = err,
                               .errlen = cap};

    err[0] = '\0';
    return ts_transport_rdma.connect(t, &p);
}

/* A made-up token is refused, a real one admits once, and its replay is refused. */
static void test_tokens(void **state)
{
    uint8_t tok[TS_RDMA_TOKEN_LEN], bogus[TS_RDMA_TOKEN_LEN];
    char host[96], port[16], err[256];
    struct ts_transport *t = NULL;

    get_token(tok, host, sizeof(host), port, sizeof(port));
    memcpy(bogus, tok, sizeof(bogus));
    bogus[0] ^= 0x5a;
    assert_int_equal(connect_with(bogus, host, port, err, sizeof(err), &t), TS_EPERM);
    assert_non_null(strstr(err, "unknown token"));
    assert_int_equal(connect_with(tok, host, port, err, sizeof(err), &t), 0);
    t->ops->close(t);
    t = NULL;
    assert_int_equal(connect_with(tok, host, port, err, sizeof(err), &t), TS_EPERM);
    assert_non_null(strstr(err, "unknown token"));
    /* The node still serves. */
    {
        tessera_client *c = open_url(rdma_url);
        check_range(c, 2, 0, sizes[2]);
        tessera_client_close(c);
    }
}

/* A client (the CLI, reading over RDMA) killed mid-read: its session goes, the node serves the
 * others. A forked child may not use the parent's RDMA state: it runs the CLI anew. */
static void test_killed_client(void **state)
{
    long long base = status_num("rdma_sessions");
    pid_t pid = fork();
    int st;

    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execl(TESSERA_CLI_PATH, "tessera", "-s", rdma_url, "get", DS, "4", "-o", "/dev/null",
              (char *)NULL);
        _exit(127);
    }
    /* Until its session is up and reading (or at most 10 s), then kill -9. */
    for (int i = 0; i < 200 && status_num("rdma_sessions") <= base; i++)
        usleep(50000);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    {
        tessera_client *c = open_url(rdma_url);
        check_range(c, 4, 0, sizes[4]);
        tessera_client_close(c);
    }
    /* The dead client's session is gone (the kernel disconnected it). */
    for (int i = 0; i < 200 && status_num("rdma_sessions") > base; i++)
        usleep(50000);
    assert_true(status_num("rdma_sessions") <= base);
}

/* The server killed mid-read: the read ends with an error, it does not hang. */
static void test_server_killed(void **state)
{
    struct tsd_proc E = {0};
    char listen[96], url[128];
    const char *const extra[] = {"--rdma-listen", listen, NULL};
    tessera_client *c, *w;
    struct ts_dataset_policy p = {.core = 1, .min_core = 1, .chunk_size = CHUNK};
    uint8_t *buf = malloc(sizes[4]);
    uint64_t op, t0;
    size_t n;
    int rc;

    snprintf(listen, sizeof(listen), "%s:0", getenv("TESSERA_RDMA_ADDR"));
    assert_int_equal(tsd_start(&E, extra), 0);
    w = open_url(E.addr);
    fill(buf, sizes[4], 5);
    assert_int_equal(tessera_dataset_create(w, DS, &p), 0);
    assert_int_equal(tessera_put(w, DS, 0, buf, sizes[4], NULL, 0), 0);
    tessera_client_close(w);
    snprintf(url, sizeof(url), "rdma://%s", E.addr);
    c = open_url(url);
    assert_int_equal(tessera_read_submit(c, DS, 0, 0, sizes[4], buf, &op), 0);
    tsd_kill9(&E);
    t0 = ts_now_mono_ns();
    rc = tessera_wait(c, op, &n);
    /* Either it finished before the kill, or it fails: never a hang, never bad bytes. */
    if (rc == 0) {
        uint8_t *ref = malloc(sizes[4]);
        fill(ref, sizes[4], 5);
        assert_memory_equal(buf, ref, sizes[4]);
        free(ref);
    } else {
        assert_true(rc == TS_ECONNRESET || rc == TS_ETIMEDOUT || rc == TS_EIO);
    }
    assert_true(ts_now_mono_ns() - t0 < 65ull * 1000000000u);
    tessera_client_close(c);
    tsd_cleanup(&E);
    free(buf);
}

/* The plan reader over RDMA: every shard of the dataset, in plan order, byte for byte, over two
 * connections (two sessions) with several reads in flight each. */
static void test_plan_reader(void **state)
{
    struct tessera_reader_opts ro;
    struct tessera_opts co;
    struct tessera_unit u;
    tessera_reader *r = NULL;
    char err[512] = "";
    uint64_t k = 0;
    long long before = status_num("rdma_placed_bytes");
    int rc;

    tessera_opts_init(&co);
    co.address = rdma_url;
    co.timeout_ms = 60000;
    tessera_reader_opts_init(&ro);
    ro.dataset = DS;
    ro.unit = TESSERA_UNIT_SHARD;
    ro.connections = 2;
    ro.depth = 4;
    rc = tessera_reader_open(&r, &co, &ro, err, sizeof(err));
    if (rc)
        fprintf(stderr, "reader: %s\n", err);
    assert_int_equal(rc, 0);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        uint8_t *ref = malloc(u.len + 1);
        assert_int_equal(u.k, k);
        assert_int_equal(u.len, sizes[u.shard]);
        fill(ref, u.len, u.shard + 1);
        assert_memory_equal(u.data, ref, u.len);
        free(ref);
        k++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, TS_ARRAY_SIZE(sizes));
    tessera_reader_close(r);
    assert_true(status_num("rdma_placed_bytes") - before >= (long long)sizes[4]);
}

/*
 * The registration cache: reads into the same buffer register it once. Memory unmapped and
 * mapped again at the same address keeps a stale registration (the old pages): the node's
 * WRITE lands there, the CRC check catches it, the entry is dropped and the read done again
 * into a fresh registration: the caller gets the right bytes.
 */
static void test_registration_cache(void **state)
{
    tessera_client *c = open_url(rdma_url);
    size_t len = sizes[4], n = 0;
    uint64_t h0, m0, h1, m1;
    uint8_t *ref = malloc(len), *buf;

    fill(ref, len, 5);
    buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    ts_conn_reg_stats(c, &h0, &m0);
    for (int i = 0; i < 3; i++) {
        memset(buf, 0, len);
        assert_int_equal(tessera_read(c, DS, 4, 0, len, buf, &n), 0);
        assert_memory_equal(buf, ref, len);
    }
    ts_conn_reg_stats(c, &h1, &m1);
    assert_int_equal(m1 - m0, 1); /* registered once */
    assert_int_equal(h1 - h0, 2);
    /* The same address, other pages. */
    assert_int_equal(munmap(buf, len), 0);
    assert_true(mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                     0) == buf);
    assert_int_equal(tessera_read(c, DS, 4, 0, len, buf, &n), 0);
    assert_int_equal(n, len);
    assert_memory_equal(buf, ref, len);
    ts_conn_reg_stats(c, &h0, &m0);
    assert_int_equal(m0 - m1, 1); /* the stale one dropped, registered afresh */
    munmap(buf, len);
    free(ref);
    tessera_client_close(c);
}

/*
 * The pipeline of reads placed into device memory (client/gpu/placed.c: tessera_read_device's
 * GPUDirect path), with host memory standing in for GPU memory: the CUDA backend differs only
 * in the registration source (a DMA-BUF of the range, or the device address) and in where the
 * check of the piece table runs (on the GPU; tests/gpu/test_gpu_device checks that part).
 */
struct fake_dev {
    int dmabuf_tries, verifies, corrupt;
    uint32_t pieces;
};

static int fake_dmabuf(void *ctx, void *buf, size_t len, int *fd, uint64_t *off)
{
    /* An export that fails (a driver without DMA-BUF says TS_ENOTSUP; others fail otherwise):
     * either way the next path is tried. */
    return ((struct fake_dev *)ctx)->dmabuf_tries++ % 2 ? TS_ENOTSUP : TS_EIO;
}

static int fake_verify(void *ctx, const uint8_t *table, uint32_t n, const void *dst, size_t len)
{
    struct fake_dev *f = ctx;
    size_t at = 0;

    f->verifies++;
    f->pieces += n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t plen = ts_get_le32(table + (size_t)i * 8);
        if (f->corrupt ||
            ts_crc32c(0, (const uint8_t *)dst + at, plen) != ts_get_le32(table + (size_t)i * 8 + 4))
            return TS_ECORRUPT;
        at += plen;
    }
    return at == len ? 0 : TS_EPROTO;
}

static void test_placed_into_device_memory(void **state)
{
    tessera_client *c = open_url(rdma_url);
    struct fake_dev f = {0, 0, 0, 0};
    const struct ts_place_path paths[] = {{"dmabuf", {fake_dmabuf, &f}}, {"peermem", {NULL, NULL}}};
    struct ts_place_ops ops = {paths, 2, fake_verify, &f};
    struct tessera_device_stats st;
    size_t size = sizes[4], n = 0;
    uint8_t *ref = malloc(size), *buf = malloc(size + 64);
    long long before = status_num("rdma_placed_bytes");
    uint64_t h0, m0, h1, m1;

    fill(ref, size, 5);
    memset(buf, 0xEE, size + 64);
    /* DMA-BUF refused, so the device address is registered (the peermem path); the node
     * writes every byte, the backend checks every piece, nothing lands past the shard's end. */
    assert_int_equal(ts_read_placed(c, DS, 4, 0, size + 64, buf, &n, &ops, &st), 0);
    assert_int_equal(n, size);
    assert_memory_equal(buf, ref, size);
    for (size_t k = size; k < size + 64; k++)
        assert_int_equal(buf[k], 0xEE);
    assert_string_equal(st.path, "peermem");
    assert_int_equal(st.bytes, size);
    assert_int_equal(f.dmabuf_tries, 1);
    assert_int_equal(f.verifies, 1);
    assert_true(f.pieces >= size / CHUNK); /* one per chunk at least */
    assert_true(status_num("rdma_placed_bytes") - before >= (long long)size);
    /* An offset range across chunks. */
    memset(buf, 0, size);
    assert_int_equal(ts_read_placed(c, DS, 4, CHUNK - 7, 3 * CHUNK, buf, &n, &ops, &st), 0);
    assert_int_equal(n, 3 * CHUNK);
    assert_memory_equal(buf, ref + CHUNK - 7, 3 * CHUNK);
    /* Placed bytes that fail their check: TS_ECORRUPT, not retried in-band into the "device";
     * the registration is dropped, and the connection goes on. */
    ts_conn_reg_stats(c, &h0, &m0);
    f.corrupt = 1;
    assert_int_equal(ts_read_placed(c, DS, 4, 0, size, buf, &n, &ops, &st), TS_ECORRUPT);
    assert_int_equal(n, 0);
    f.corrupt = 0;
    memset(buf, 0, size);
    assert_int_equal(ts_read_placed(c, DS, 4, 0, size, buf, &n, &ops, &st), 0);
    assert_memory_equal(buf, ref, size);
    ts_conn_reg_stats(c, &h1, &m1);
    assert_int_equal(m1 - m0, 1); /* registered afresh after the bad read */
    /* No path that registers: nothing is read, and the caller is told why. */
    ops.npaths = 1;
    assert_int_equal(ts_read_placed(c, DS, 4, 0, size, buf, &n, &ops, &st), TS_ENOTSUP);
    assert_non_null(strstr(tessera_client_error(c), "dmabuf"));
    /* Refusals come back as for tessera_read. */
    ops.npaths = 2;
    assert_int_equal(ts_read_placed(c, "no-such-ds", 0, 0, 4096, buf, &n, &ops, &st), TS_ENOENT);
    assert_int_equal(ts_read_placed(c, DS, 4, 0, size, buf, &n, &ops, &st), 0);
    free(ref);
    free(buf);
    tessera_client_close(c);
}

/* A frame by hand over a transport (what the connection layer would send). */
static void send_frame(struct ts_transport *t, uint8_t op, uint16_t flags, uint64_t id,
                       const struct ts_wr *body)
{
    struct ts_frame_hdr h = {TS_PROTO_VERSION, op, flags, id, 0, (uint32_t)body->len};
    uint8_t hdr[TS_HDR_LEN];
    struct iovec iov[2] = {{hdr, TS_HDR_LEN}, {body->buf, body->len}};
    size_t left = TS_HDR_LEN + body->len;

    ts_frame_encode(hdr, &h);
    while (left) {
        long n = t->ops->send(t, iov, 2);
        assert_true(n >= 0);
        if (n == 0) {
            assert_true(t->ops->wait(t, TS_IO_WRITE, 5000) >= 0);
            continue;
        }
        left -= (size_t)n;
        for (int i = 0; i < 2 && n; i++) {
            size_t k = TS_MIN((size_t)n, iov[i].iov_len);
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + k;
            iov[i].iov_len -= k;
            n -= (long)k;
        }
    }
}

/* The client deregisters its memory while the node writes into it: the node's WRITE fails
 * with a remote access error, that session ends, and the node goes on serving others. */
static void test_deregistered_mid_read(void **state)
{
    uint8_t tok[TS_RDMA_TOKEN_LEN];
    char host[96], port[16], err[256];
    struct ts_transport *t = NULL;
    long long base = status_num("rdma_sessions");
    uint8_t *buf = malloc(sizes[4]);
    uint64_t addr;
    uint32_t key;
    void *h;
    struct ts_wr w;

    get_token(tok, host, sizeof(host), port, sizeof(port));
    assert_int_equal(connect_with(tok, host, port, err, sizeof(err), &t), 0);
    assert_int_equal(t->ops->reg(t, buf, sizes[4], NULL, &addr, &key, &h), 0);
    ts_wr_init(&w);
    ts_wr_str(&w, DS);
    ts_wr_u32(&w, 4);
    ts_wr_u64(&w, 0);
    ts_wr_u32(&w, (uint32_t)sizes[4]);
    ts_wr_u64(&w, addr);
    ts_wr_u32(&w, key);
    ts_wr_u32(&w, 0);
    send_frame(t, TS_OP_READ, TS_F_RDMA, 1, &w);
    ts_wr_fini(&w);
    t->ops->dereg(t, h, 1); /* dropped at once: the node's WRITEs find no region */
    /* The node ends the session: the transport breaks (or the reply never comes). */
    for (int i = 0; i < 200 && status_num("rdma_sessions") > base; i++)
        usleep(50000);
    assert_true(status_num("rdma_sessions") <= base);
    t->ops->close(t);
    free(buf);
    {
        tessera_client *c = open_url(rdma_url);
        check_range(c, 4, 0, sizes[4]);
        tessera_client_close(c);
    }
}

/* A peer that holds a session and says nothing (vanished without a disconnect): the node's
 * idle timeout ends the session and frees what it held. */
static void test_idle_session(void **state)
{
    struct tsd_proc E = {0};
    char listen[96], host[96], port[16], err[256];
    const char *const extra[] = {"--rdma-listen", listen, "--idle-timeout-s", "2", NULL};
    uint8_t tok[TS_RDMA_TOKEN_LEN];
    struct ts_transport *t = NULL;
    struct tsd_proc keep = D;
    int gone = 0;

    snprintf(listen, sizeof(listen), "%s:0", getenv("TESSERA_RDMA_ADDR"));
    assert_int_equal(tsd_start(&E, extra), 0);
    D = E; /* status_num and get_token ask D */
    get_token(tok, host, sizeof(host), port, sizeof(port));
    assert_int_equal(connect_with(tok, host, port, err, sizeof(err), &t), 0);
    assert_int_equal(status_num("rdma_sessions"), 1);
    for (int i = 0; i < 200 && !gone; i++) {
        usleep(50000);
        gone = status_num("rdma_sessions") == 0;
    }
    D = keep;
    assert_true(gone);
    /* The transport hears of it: a receive reports the end. */
    {
        uint8_t b[8];
        struct iovec iov = {b, sizeof(b)};
        long n = 0;
        for (int i = 0; i < 100 && n == 0; i++) {
            t->ops->wait(t, TS_IO_READ, 100);
            n = t->ops->recv(t, &iov, 1);
        }
        assert_true(n < 0);
    }
    t->ops->close(t);
    tsd_stop(&E);
    tsd_cleanup(&E);
}

/* A 3-node cluster where n1 serves RDMA and n2, n3 do not: an rdma:// handle reads n1 by RDMA
 * and the others over TCP, every byte right; with n1 killed (-9) mid-job, the same handle reads
 * everything from the TCP replicas. */
static void test_cluster_mixed(void **state)
{
    struct tsd_cluster cl;
    char listen[96], url[128];
    const char *const n1[] = {"--rdma-listen", listen, NULL};
    const char *const *const each[] = {n1, NULL, NULL};
    struct ts_dataset_policy p = {3, 0, 2, CHUNK, 0, 0, 0, 0};
    tessera_client *w = NULL, *c;
    enum { NS = 12 };
    size_t len = 300000;
    uint8_t *buf = malloc(len), *got = malloc(len);
    long long placed, tcp_bytes = 0;

    snprintf(listen, sizeof(listen), "%s:0", getenv("TESSERA_RDMA_ADDR"));
    assert_int_equal(tsd_cluster_start_each(&cl, 3, NULL, 16, NULL, each), 0);
    assert_int_equal(test_tls_open(&w, cl.tls_listen[0], "writer", NULL, NULL), 0);
    assert_int_equal(tessera_dataset_create(w, "mixed", &p), 0);
    for (uint32_t i = 0; i < NS; i++) {
        fill(buf, len, 100 + i);
        assert_int_equal(tessera_put(w, "mixed", i, buf, len, NULL, 0), 0);
    }
    tessera_client_close(w);
    snprintf(url, sizeof(url), "rdma://%s", cl.listen[0]);
    c = open_url(url);
    for (uint32_t i = 0; i < NS; i++) {
        size_t n = 0;
        fill(buf, len, 100 + i);
        assert_int_equal(tessera_read(c, "mixed", i, 0, len, got, &n), 0);
        assert_int_equal(n, len);
        assert_memory_equal(got, buf, len);
    }
    {
        /* The RDMA node killed: the same handle reads everything from the TCP replicas. */
        struct tsd_proc keep = D;
        D = cl.node[0];
        placed = status_num("rdma_placed_bytes");
        D = keep;
        tsd_kill9(&cl.node[0]);
        for (uint32_t i = 0; i < NS; i++) {
            size_t n = 0;
            fill(buf, len, 100 + i);
            memset(got, 0, len);
            assert_int_equal(tessera_read(c, "mixed", i, 0, len, got, &n), 0);
            assert_int_equal(n, len);
            assert_memory_equal(got, buf, len);
        }
    }
    tessera_client_close(c);
    {
        struct tsd_proc keep = D;
        for (int i = 1; i < 3; i++) {
            D = cl.node[i];
            tcp_bytes += status_num("read_bytes");
            assert_int_equal(status_num("rdma_placed_bytes"), 0);
        }
        D = keep;
    }
    /* The PGs' primaries are spread over the nodes: both transports served reads. */
    assert_true(placed > 0);
    assert_true(tcp_bytes > 0);
    tsd_cluster_stop(&cl); /* n1 was killed: its exit status is not 0 */
    free(buf);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placed_reads),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_killed_client),
        cmocka_unit_test(test_server_killed),
        cmocka_unit_test(test_plan_reader),
        cmocka_unit_test(test_deregistered_mid_read),
        cmocka_unit_test(test_idle_session),
        cmocka_unit_test(test_registration_cache),
        cmocka_unit_test(test_placed_into_device_memory),
        cmocka_unit_test(test_cluster_mixed),
    };
    return cmocka_run_group_tests_name("rdma", tests, group_setup, group_teardown);
}
