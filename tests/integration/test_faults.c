/*
 * Faults against a real tesserad: kill -9 in the middle of an upload stream, restart on the
 * same data, and prove that every acknowledged write is there, verified. SIGTERM while a large
 * read is in flight: the read completes, the daemon exits 0.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"

#include <signal.h>
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
    struct ts_dataset_policy p = {1, 0, 1, CHUNK};
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
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_mid_stream),
        cmocka_unit_test(test_sigterm_drains),
    };
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
