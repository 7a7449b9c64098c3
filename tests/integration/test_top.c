/*
 * `tessera top` as a person sees it: a real 3-node cluster, `tessera top --interval 0.5` typed
 * into a shell in a detached tmux session of 120x40, the pane read back with capture-pane:
 * the node rows, reads showing up as a rate (and the read dataset named hottest when the nodes'
 * STATUS has a "hot" object), a node killed with -9 shown DOWN with an anomaly line, then 'q':
 * top exits 0, the alternate screen is left and the terminal's settings are as before.
 * Skipped (77) without tmux.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/wait.h>

#include "tessera/tessera.h"
#include "ts_test.h"

static struct tsd_cluster CL;
static char sock[64];      /* tmux -L: a server of this test's own */
static char pane[1 << 16]; /* the last capture */
static char dir[512];      /* files the shell in the pane writes */

#define LEN (1u << 20)
#define SHARDS 8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs a shell command line; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    int st;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The pane as text into pane[]; 0 or -1. */
static int capture(void)
{
    char cmd[256];
    size_t n;
    FILE *p;

    snprintf(cmd, sizeof(cmd), "tmux -L %s capture-pane -p -t top", sock);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    n = fread(pane, 1, sizeof(pane) - 1, p);
    pane[n] = '\0';
    return pclose(p) == 0 ? 0 : -1;
}

/* The pane's line that starts with prefix (copied into line[cap]), or NULL. */
static const char *pane_line(const char *prefix, char *line, size_t cap)
{
    for (const char *p = pane; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!strncmp(p, prefix, strlen(prefix))) {
            snprintf(line, cap, "%.*s", (int)n, p);
            return line;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

/* Captures until every needle is in the pane (1), or secs pass (0; the last pane printed). */
static int wait_pane(double secs, const char *const *needles)
{
    double end = now_s() + secs;

    do {
        int all = capture() == 0;
        for (const char *const *n = needles; all && *n; n++)
            all = strstr(pane, *n) != NULL;
        if (all)
            return 1;
        usleep(100000);
    } while (now_s() < end);
    fprintf(stderr, "pane after %.0f s, still without one of:", secs);
    for (const char *const *n = needles; *n; n++)
        fprintf(stderr, " '%s'", *n);
    fprintf(stderr, "\n%s\n", pane);
    return 0;
}

static void keys(const char *k)
{
    assert_int_equal(sh("tmux -L %s send-keys -t top %s", sock, k), 0);
}

/* Reads every shard once through the cluster: the reads top is to see. */
static void read_all(tessera_client *c)
{
    uint8_t *buf = malloc(LEN);
    size_t got;

    for (uint32_t s = 0; s < SHARDS; s++)
        assert_int_equal(tessera_read(c, "imagenet", s, 0, LEN, buf, &got), 0);
    free(buf);
}

static void test_top_in_tmux(void **state)
{
    tessera_client *c = NULL;
    struct ts_dataset_policy p = {2, 0, 2, 65536, 0, 0, 0, 0};
    char line[512], cmd[2048];
    int hot;
    (void)state;

    /* a dataset to read */
    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "writer", NULL, NULL), 0);
    assert_int_equal(tessera_dataset_create(c, "imagenet", &p), 0);
    for (uint32_t s = 0; s < SHARDS; s++)
        assert_int_equal(tsd_put_pattern(c, "imagenet", s, LEN, s), 0);
    hot = raw_status_has(CL.node[0].addr, "\"hot\":");

    /* a shell in a 120x40 terminal; the terminal's settings noted before top runs */
    assert_int_equal(sh("tmux -L %s new-session -d -s top -x 120 -y 40 'env PS1=\"$ \" sh'", sock),
                     0);
    snprintf(cmd, sizeof(cmd),
             "'stty -g > %s/before; %s -s %s --tls-ca %s --tls-cert %s --tls-key %s top "
             "--interval 0.5; echo top-exit=$?; stty -g > %s/after' Enter",
             dir, TESSERA_CLI_PATH, CL.tls_listen[0], test_cert("ca", "pem"),
             test_cert("admin", "pem"), test_cert("admin", "key"), dir);
    keys(cmd);
    assert_true(wait_pane(
        20, (const char *const[]){"tessera top", "NODE", "n1 ", "n2 ", "n3 ", "ANOMALIES", NULL}));
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d ", i + 1);
        assert_non_null(pane_line(id, line, sizeof(line)));
        assert_non_null(strstr(line, " up "));
    }
    assert_non_null(strstr(pane, "nodes 3 up, 0 down of 3"));
    /* reads: the read rate of the nodes goes above 0, the dataset named hottest */
    {
        double end = now_s() + 20;
        int seen = 0;
        while (!seen && now_s() < end) {
            read_all(c);
            assert_int_equal(capture(), 0);
            const char *r = strstr(pane, "; read ");
            seen = r && strncmp(r, "; read 0.0 ", 11) != 0 && strncmp(r, "; read - ", 9) != 0;
        }
        if (!seen)
            fprintf(stderr, "%s\n", pane);
        assert_true(seen);
    }
    fprintf(stderr, "--- the pane while reading ---\n%s\n", pane);
    if (hot) {
        const char *h = strstr(pane, "HOTTEST DATASETS");
        assert_non_null(h);
        assert_non_null(strstr(h, "imagenet"));
    } else {
        fprintf(stderr, "NOTE: the nodes' STATUS has no \"hot\" object yet: the hottest-datasets "
                        "panel shows '-' (checked), the dataset's name is not asserted\n");
        assert_non_null(strstr(pane, "has no \"hot\" object"));
    }
    tessera_client_close(c);

    /* a node dies */
    tsd_kill9(&CL.node[2]);
    assert_true(
        wait_pane(20, (const char *const[]){"nodes 2 up, 1 down of 3",
                                            "! n3: up in the map but not answering", NULL}));
    assert_non_null(pane_line("n3 ", line, sizeof(line)));
    assert_non_null(strstr(line, "DOWN"));
    fprintf(stderr, "--- the pane with n3 killed ---\n%s\n", pane);

    /* q: top exits 0, the shell's screen is back, the terminal as it was */
    keys("q");
    assert_true(wait_pane(10, (const char *const[]){"top-exit=0", NULL}));
    assert_null(strstr(pane, "HOTTEST DATASETS")); /* the alternate screen is gone */
    assert_int_equal(sh("tmux -L %s display -p -t top '#{alternate_on}' | grep -qx 0", sock), 0);
    {
        double end = now_s() + 10;
        char after[600];
        snprintf(after, sizeof(after), "%s/after", dir);
        while (access(after, F_OK) != 0 && now_s() < end)
            usleep(100000);
    }
    assert_int_equal(sh("cmp -s %s/before %s/after", dir, dir), 0);
    /* typing shows again (echo back on) */
    keys("'echo typed-$((40+2))' Enter");
    assert_true(wait_pane(10, (const char *const[]){"echo typed-$((40+2))", "typed-42", NULL}));
}

static int setup(void **state)
{
    char *d;
    (void)state;
    if (sh("command -v tmux >/dev/null") != 0) {
        fprintf(stderr, "SKIP: tmux is not installed\n");
        exit(77);
    }
    snprintf(sock, sizeof(sock), "tessera-top-%d", (int)getpid());
    d = ts_test_tmpdir("top");
    snprintf(dir, sizeof(dir), "%s", d);
    free(d);
    return tsd_cluster_start(&CL, 3, NULL, 8, NULL);
}

static int teardown(void **state)
{
    (void)state;
    sh("tmux -L %s kill-server 2>/dev/null", sock);
    sh("rm -rf '%s'", dir);
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_in_tmux),
    };
    return cmocka_run_group_tests_name("top", tests, setup, teardown);
}
