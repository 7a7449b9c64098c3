/*
 * Faults against a real tesserad: kill -9 in the middle of an upload stream, restart on the
 * same data, and prove that every acknowledged write is there, verified. SIGTERM while a large
 * read is in flight: the read completes, the daemon exits 0. Clients that announce huge frames
 * and stall cannot make the daemon buffer more than its input budget, and others keep working.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"

#include "ts_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define SHARD_LEN (3 * CHUNK + 1000)

static void fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed * 97);
}

static tessera_client *connect_to(const char *addr)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    tessera_opts_init(&o);
    o.address = addr;
    o.timeout_ms = 20000;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

/* Child: uploads shards forever, reporting each acknowledged (sealed) shard on fd. */
static void uploader(const char *addr, int fd)
{
    struct tessera_opts o;
    tessera_client *c;
    uint8_t *buf = malloc(SHARD_LEN);

    tessera_opts_init(&o);
    o.address = addr;
    if (tessera_client_open(&c, &o))
        _exit(2);
    for (uint32_t shard = 0;; shard++) {
        fill(buf, SHARD_LEN, shard);
        if (tessera_put(c, "durable", shard, buf, SHARD_LEN, NULL, 0) != 0)
            _exit(0); /* the daemon died under us: expected */
        if (write(fd, &shard, sizeof(shard)) != sizeof(shard))
            _exit(3);
    }
}

static void test_kill9_mid_stream(void **state)
{
    struct tsd_proc d = {0};
    const char *const extra[] = {"--sync", "always", NULL};
    (void)extra;
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};
    tessera_client *c;
    int pfd[2];
    pid_t child;
    uint32_t shard, acked = 0;
    uint8_t *want = malloc(SHARD_LEN), *got = malloc(SHARD_LEN);
    int st;

    assert_int_equal(tsd_start(&d, extra), 0);
    c = connect_to(d.addr);
    assert_int_equal(tessera_dataset_create(c, "durable", &p), 0);
    tessera_client_close(c);

    assert_int_equal(pipe(pfd), 0);
    child = fork();
    if (child == 0) {
        close(pfd[0]);
        uploader(d.addr, pfd[1]);
    }
    close(pfd[1]);
    while (acked < 20 && read(pfd[0], &shard, sizeof(shard)) == sizeof(shard))
        acked = shard + 1;
    tsd_kill9(&d); /* mid-stream: the uploader is in the middle of the next shard */
    while (read(pfd[0], &shard, sizeof(shard)) == sizeof(shard))
        acked = shard + 1;
    close(pfd[0]);
    waitpid(child, NULL, 0);
    assert_true(acked >= 20);

    /* Restart on the same data: every acknowledged shard is there, byte for byte. */
    assert_int_equal(tsd_start(&d, NULL), 0);
    c = connect_to(d.addr);
    for (uint32_t s = 0; s < acked; s++) {
        size_t n;
        fill(want, SHARD_LEN, s);
        assert_int_equal(tessera_read(c, "durable", s, 0, SHARD_LEN, got, &n), 0);
        assert_int_equal(n, SHARD_LEN);
        assert_memory_equal(got, want, SHARD_LEN);
    }
    /* The shard that was cut off is not visible as complete. */
    struct ts_shard_info si;
    int rc = tessera_shard_stat(c, "durable", acked, &si);
    assert_true(rc == TS_ENOENT || (rc == 0 && si.state == TS_SHARD_WRITING));
    struct ts_scrub_report rep;
    assert_int_equal(tessera_scrub(c, "durable", &rep, NULL, NULL), 0);
    assert_true(rep.corrupt == 0);
    tessera_client_close(c);
    st = tsd_stop(&d);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tsd_cleanup(&d);
    free(want);
    free(got);
}

static void test_sigterm_drains(void **state)
{
    struct tsd_proc d = {0};
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    tessera_client *c;
    const size_t len = 48u << 20;
    uint8_t *buf = malloc(len), *back = malloc(len);
    uint64_t op;
    size_t n;
    int st;

    const char *const dbg[] = {"--log-level", "debug", NULL};
    assert_int_equal(tsd_start(&d, dbg), 0);
    c = connect_to(d.addr);
    fill(buf, len, 5);
    assert_int_equal(tessera_dataset_create(c, "drain", &p), 0);
    assert_int_equal(tessera_put(c, "drain", 0, buf, len, NULL, 0), 0);
    /* A large read in flight when SIGTERM arrives completes in full. */
    assert_int_equal(tessera_read_submit(c, "drain", 0, 0, len, back, &op), 0);
    kill(d.pid, SIGTERM);
    int rc = tessera_wait(c, op, &n);
    if (rc) {
        fprintf(stderr, "read during drain: %s (%s)\n", ts_strerror(rc), tessera_client_error(c));
        tsd_dump_log(&d);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, len);
    assert_memory_equal(back, buf, len);
    tessera_client_close(c);
    st = tsd_stop(&d);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "tesserad exit status %d (signal %d)\n", st,
                WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        tsd_dump_log(&d);
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tsd_cleanup(&d);
    free(buf);
    free(back);
}

/* Sends as much of len bytes as the connection takes within ms (non-blocking); bytes sent. */
static size_t send_for(int fd, size_t len, int ms)
{
    static uint8_t junk[1 << 20];
    size_t sent = 0;
    int idle = 0;

    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (sent < len && idle < ms) {
        ssize_t n = send(fd, junk, TS_MIN(sizeof(junk), len - sent), MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            idle = 0;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            idle += 10;
        } else {
            break;
        }
    }
    return sent;
}

/* STATUS field stats.NAME of the node at addr, -1 if absent. */
static long long status_stat(const char *addr, const char *name)
{
    tessera_client *c = connect_to(addr);
    char *json = NULL, key[96], *at;
    long long v = -1;

    assert_int_equal(tessera_status(c, &json), 0);
    snprintf(key, sizeof(key), "\"%s\":", name);
    at = strstr(json, key);
    if (at)
        v = atoll(at + strlen(key) + strspn(at + strlen(key), " "));
    free(json);
    tessera_client_close(c);
    return v;
}

static void test_input_budget(void **state)
{
    enum { ATTACKERS = 6 };
    const uint32_t frame = 60u << 20;
    const char *const extra[] = {"--input-budget-mb", "128", NULL};
    struct tsd_proc d = {0};
    struct ts_dataset_policy small = {1, 0, 1, CHUNK, 0, 0, 0, 0},
                             big = {1, 0, 1, 4u << 20, 0, 0, 0, 0};
    int fds[ATTACKERS];
    long rss0, rss1;
    size_t total = 0, n;
    uint8_t *buf = malloc(8u << 20), *back = malloc(8u << 20);
    tessera_client *c;

    assert_int_equal(tsd_start(&d, extra), 0);
    c = connect_to(d.addr);
    assert_int_equal(tessera_dataset_create(c, "small", &small), 0);
    assert_int_equal(tessera_dataset_create(c, "big", &big), 0);
    tessera_client_close(c);
    rss0 = tsd_rss_kb(&d);
    /* Each announces a 60 MiB SHARD_WRITE and sends 56 MiB of it, then stalls. */
    for (int i = 0; i < ATTACKERS; i++) {
        uint8_t h[TS_HDR_LEN];
        struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_SHARD_WRITE, 0, 1, 0, frame};
        fds[i] = raw_connect(d.addr);
        assert_true(fds[i] >= 0);
        ts_frame_encode(h, &fh);
        assert_int_equal(raw_send_all(fds[i], h, sizeof(h)), 0);
    }
    for (int i = 0; i < ATTACKERS; i++)
        total += send_for(fds[i], 56u << 20, 300);
    rss1 = tsd_rss_kb(&d);
    fprintf(stderr, "  %d stalled 60 MiB frames: clients sent %zu MiB, daemon RSS +%ld MiB\n",
            ATTACKERS, total >> 20, (rss1 - rss0) >> 10);
    /* Without the budget the daemon would hold all of it (336 MiB); with it, 2 frames. */
    assert_true(rss1 - rss0 < 190L * 1024);
    assert_true(status_stat(d.addr, "input_budget_waits") > 0);
    assert_true(status_stat(d.addr, "input_reserved_bytes") <= 128LL << 20);

    /* Small frames still pass: a put in 64 KiB chunks and reads work meanwhile. */
    c = connect_to(d.addr);
    fill(buf, SHARD_LEN, 9);
    assert_int_equal(tessera_put(c, "small", 0, buf, SHARD_LEN, NULL, 0), 0);
    assert_int_equal(tessera_read(c, "small", 0, 0, SHARD_LEN, back, &n), 0);
    assert_int_equal(n, SHARD_LEN);
    assert_memory_equal(back, buf, SHARD_LEN);
    /* Once the stalled clients are gone their reservations return: large chunks work again. */
    for (int i = 0; i < ATTACKERS; i++)
        raw_close(fds[i]);
    fill(buf, 8u << 20, 10);
    assert_int_equal(tessera_put(c, "big", 0, buf, 8u << 20, NULL, 0), 0);
    assert_int_equal(tessera_read(c, "big", 0, 0, 8u << 20, back, &n), 0);
    assert_int_equal(n, 8u << 20);
    assert_memory_equal(back, buf, 8u << 20);
    tessera_client_close(c);
    assert_true(status_stat(d.addr, "input_reserved_bytes") == 0);
    assert_true(WIFEXITED(tsd_stop(&d)));
    tsd_cleanup(&d);
    free(buf);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_mid_stream),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_input_budget),
    };
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
