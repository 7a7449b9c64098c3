/*
 * Issue 32, locality: a client that names its failure domain (tessera_opts.domain) reads from
 * the replicas there first and falls back in order. A 3-node cluster, n1 in dc-a, n2 in dc-b,
 * n3 in dc-c, on addresses of their own (127.0.1.1-3) in a network namespace of the test's
 * own, with a delay between the domains: every packet to or from n1 and n3 waits DELAY_MS
 * (netdelay.h: tc netem where the kernel has it, else an NFQUEUE delay line), so the client
 * (in dc-b, on 127.0.0.1) reaches n2 at once and the others 2 x DELAY_MS later per round trip.
 * A dataset of 3 core replicas: every node holds every shard.
 *
 *  - The delay is in effect: a TCP connect to n1 and n3 takes at least the round trip, to n2
 *    well under it.
 *  - (a) n2 up: >= 99 % of the bytes read (random ranges, and a plan reader's shards) are
 *    served by n2, by the nodes' own counters (STATUS read_bytes), and the median read takes
 *    well under the delay. A client without a domain, for contrast, does not read 99 % from
 *    n2 (about a third): the assertion measures the ordering, not the setup.
 *  - (b) n2 killed (-9): reads go on, every byte checked against what was written, for longer
 *    than the client keeps a failed node last (5 s: its log shows it tried n2 again, refused,
 *    and the reads survived that too), served by n1 and n3 and paying the round trip; the same
 *    after `node down n2`.
 *  - (c) n2 restarted and `node up n2`: reads go back to n2 (>= 99 %, median well under the
 *    delay), every byte checked.
 *
 * Needs root and a network namespace of its own; skips (77) saying so without them.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netdelay.h"
#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"
#include "ts_test.h"

#define DELAY_MS 10u /* each way: a round trip to dc-a or dc-c takes 20 ms more */
#define RTT_MS (2.0 * DELAY_MS)
#define SHARDS 48u
#define SHARD_LEN (512u << 10)
#define READ_LEN (64u << 10)
#define LOCAL 1 /* n2, dc-b: the client's domain */

static struct tsd_cluster CL;
static char out[1 << 15];

/* When the library failed to connect to n2 (127.0.1.2), from its log lines (only the test's
 * thread reads through the library while they are counted). */
static struct {
    int on;
    int n;
    uint64_t t[64];
} refused;

static void log_hook(void *arg, int level, const char *facility, int rc, const char *msg)
{
    ts_log_stderr(arg, level, facility, rc, msg);
    if (refused.on && refused.n < 64 && strstr(msg, "cannot connect to 127.0.1.2:"))
        refused.t[refused.n++] = ts_now_mono_ns();
}

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

/* ---- what the nodes say --------------------------------------------------------------------- */

/* Node i's STATUS stats.read_bytes (data bytes its READs and READVs served since it started);
 * -1 when it does not answer. */
static int64_t read_bytes(int i)
{
    return raw_status_read_bytes(CL.node[i].addr);
}

/* The shortest of 5 TCP connects to addr ("IP:PORT"), ms: one round trip. */
static double connect_ms(const char *addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char ip[64];
    const char *colon = strrchr(addr, ':');
    double best = 1e9;

    assert_non_null(colon);
    snprintf(ip, sizeof(ip), "%.*s", (int)(colon - addr), addr);
    assert_int_equal(inet_pton(AF_INET, ip, &sa.sin_addr), 1);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    for (int k = 0; k < 5; k++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        uint64_t t0 = ts_now_mono_ns();
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        best = TS_MIN(best, (double)(ts_now_mono_ns() - t0) / 1e6);
        close(fd);
    }
    return best;
}

/* ---- reads ---------------------------------------------------------------------------------- */

struct phase {
    const char *name;
    int reads;
    uint64_t bytes;       /* read and checked */
    int64_t served[3];    /* by each node's counter (-1: it did not answer before and after) */
    int64_t served_total; /* by the nodes that answered */
    double median_ms;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void counters(int64_t *v)
{
    for (int i = 0; i < CL.n; i++)
        v[i] = read_bytes(i);
}

static void served_since(struct phase *ph, const int64_t *before)
{
    int64_t now[3];

    counters(now);
    ph->served_total = 0;
    for (int i = 0; i < CL.n; i++) {
        ph->served[i] = before[i] >= 0 && now[i] >= before[i] ? now[i] - before[i] : -1;
        ph->served_total += ph->served[i] > 0 ? ph->served[i] : 0;
    }
}

static void say(const struct phase *ph)
{
    char mib[3][16], med[16] = "-";

    for (int i = 0; i < 3; i++)
        if (ph->served[i] < 0)
            snprintf(mib[i], sizeof(mib[i]), "%s", "down");
        else
            snprintf(mib[i], sizeof(mib[i]), "%.1f", (double)ph->served[i] / (1 << 20));
    if (ph->median_ms >= 0)
        snprintf(med, sizeof(med), "%.2f ms", ph->median_ms);
    fprintf(stderr,
            "%-32s %4d reads, %5.1f MiB checked; served (MiB) n1 %5s n2 %5s n3 %5s (n2 %5.1f %%); "
            "median read %s\n",
            ph->name, ph->reads, (double)ph->bytes / (1 << 20), mib[0], mib[1], mib[2],
            ph->served_total
                ? 100.0 * (double)TS_MAX(ph->served[LOCAL], 0) / (double)ph->served_total
                : 0.0,
            med);
}

/* n2's share of the bytes the nodes served. */
static double local_share(const struct phase *ph)
{
    return ph->served_total ? (double)TS_MAX(ph->served[LOCAL], 0) / (double)ph->served_total : 0;
}

/*
 * Random READ_LEN ranges of the dataset through c: `reads` of them and for at least min_s
 * seconds. Every read must succeed with exactly the bytes written; the nodes' counters before
 * and after say who served them.
 */
static void read_phase(tessera_client *c, const char *name, int reads, double min_s,
                       struct phase *ph)
{
    static uint8_t got[READ_LEN], want[READ_LEN];
    static uint64_t rng = 0x9e3779b97f4a7c15ull;
    size_t cap = 4096, n = 0;
    double *lat = malloc(cap * sizeof(*lat));
    int64_t before[3];
    uint64_t t_end = ts_now_mono_ns() + (uint64_t)(min_s * 1e9);

    memset(ph, 0, sizeof(*ph));
    ph->name = name;
    counters(before);
    while (n < (size_t)reads || ts_now_mono_ns() < t_end) {
        uint32_t shard;
        uint64_t off, t0;
        size_t len = 0;
        int rc;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        shard = (uint32_t)(rng % SHARDS);
        off = (rng >> 20) % (SHARD_LEN - READ_LEN + 1);
        t0 = ts_now_mono_ns();
        rc = tessera_read(c, "near", shard, off, READ_LEN, got, &len);
        if (rc)
            fprintf(stderr, "%s: read %zu (shard %u at %llu) failed: %s: %s\n", name, n, shard,
                    (unsigned long long)off, ts_errname(rc), tessera_client_error(c));
        assert_int_equal(rc, 0);
        if (n == cap)
            assert_non_null(lat = realloc(lat, (cap *= 2) * sizeof(*lat)));
        lat[n++] = (double)(ts_now_mono_ns() - t0) / 1e6;
        assert_int_equal(len, READ_LEN);
        ts_test_fill(want, READ_LEN, shard, off);
        assert_memory_equal(got, want, READ_LEN);
        ph->bytes += len;
    }
    qsort(lat, n, sizeof(*lat), cmp_double);
    ph->reads = (int)n;
    ph->median_ms = lat[n / 2];
    free(lat);
    served_since(ph, before);
    say(ph);
}

static tessera_client *open_client(const char *domain, struct tessera_opts *o)
{
    tessera_client *c = NULL;

    tessera_opts_init(o);
    o->address = CL.listen[0]; /* the seed is in dc-a: the domain steers, not the seed */
    o->timeout_ms = 5000;
    o->domain = domain;
    assert_int_equal(tessera_client_open(&c, o), 0);
    return c;
}

/* Every shard once, through a plan reader in dc-b (READVs over 2 connections): each unit is
 * checked and says n2 served it; the nodes' counters agree. */
static void reader_phase(void)
{
    struct tessera_opts co;
    struct tessera_reader_opts ro;
    struct tessera_unit u;
    struct phase ph = {.name = "(a) plan reader, domain dc-b", .median_ms = -1};
    tessera_reader *r = NULL;
    tessera_client *c = open_client("dc-b", &co);
    uint8_t *want = malloc(SHARD_LEN);
    char err[512] = "";
    int64_t before[3];
    int rc, seen = 0;

    tessera_client_close(c); /* the reader opens its own, with co */
    tessera_reader_opts_init(&ro);
    ro.dataset = "near";
    ro.unit = TESSERA_UNIT_SHARD;
    ro.plan.shuffle = TESSERA_SHUFFLE_GLOBAL;
    ro.plan.seed = 3;
    counters(before);
    rc = tessera_reader_open(&r, &co, &ro, err, sizeof(err));
    if (rc)
        fprintf(stderr, "reader: %s: %s\n", ts_errname(rc), err);
    assert_int_equal(rc, 0);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        ts_test_fill(want, SHARD_LEN, u.shard, 0);
        assert_int_equal(u.len, SHARD_LEN);
        assert_memory_equal(u.data, want, SHARD_LEN);
        assert_string_equal(u.node, "n2");
        ph.bytes += u.len;
        seen++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(seen, SHARDS);
    ph.reads = seen;
    tessera_reader_close(r);
    served_since(&ph, before);
    say(&ph);
    assert_true(ph.served_total >= (int64_t)ph.bytes);
    assert_true(local_share(&ph) >= 0.99);
    free(want);
}

/* ---- the test ------------------------------------------------------------------------------- */

static void test_reads_stay_local_and_move_on_failure(void **state)
{
    struct tessera_opts o, o_none;
    tessera_client *c, *none;
    struct phase ph;
    double ms[3];
    uint64_t t_kill;
    int retried = 0;

    (void)state;
    /* The delay is in effect: one round trip to dc-a and dc-c, none to dc-b. */
    for (int i = 0; i < CL.n; i++)
        ms[i] = connect_ms(CL.listen[i]);
    fprintf(stderr, "TCP connect from the client: n1 %.2f ms, n2 %.2f ms, n3 %.2f ms\n", ms[0],
            ms[1], ms[2]);
    assert_true(ms[0] >= 0.9 * RTT_MS && ms[2] >= 0.9 * RTT_MS);
    assert_true(ms[1] < DELAY_MS / 2.0);

    /* (a) n2 healthy: reads stay in dc-b. */
    c = open_client("dc-b", &o);
    read_phase(c, "warm-up (connections, policy)", 20, 0, &ph);
    read_phase(c, "(a) domain dc-b, n2 up", 400, 0, &ph);
    assert_true(ph.served_total >= (int64_t)ph.bytes); /* the counters saw every read */
    assert_true(local_share(&ph) >= 0.99);
    assert_true(ph.median_ms < RTT_MS / 4);
    reader_phase();
    /* For contrast, no domain: the usual spread over the three (about a third from n2). */
    none = open_client(NULL, &o_none);
    read_phase(none, "(control) no domain", 400, 0, &ph);
    assert_true(ph.served_total >= (int64_t)ph.bytes);
    assert_true(local_share(&ph) < 0.9);
    tessera_client_close(none);

    /* (b) n2 killed: the same handle reads on from n1 and n3, longer than a failed node is
     * kept last (5 s), so its retry of n2 is survived too. */
    tsd_kill9(&CL.node[LOCAL]);
    t_kill = ts_now_mono_ns();
    refused.on = 1;
    read_phase(c, "(b) n2 killed (-9), map: up", 50, 7.0, &ph);
    refused.on = 0;
    assert_int_equal(ph.served[LOCAL], -1); /* dead, its counter gone */
    assert_true(ph.served[0] + ph.served[2] >= (int64_t)ph.bytes);
    assert_true(ph.median_ms >= 0.9 * RTT_MS);
    /* The handle tried n2 again once it was no longer kept last, and read on elsewhere. */
    for (int i = 0; i < refused.n; i++)
        retried |= refused.t[i] >= t_kill + 4500000000ull;
    fprintf(stderr, "connections to n2 refused during (b): %d, the last %.1f s after the kill\n",
            refused.n, refused.n ? (double)(refused.t[refused.n - 1] - t_kill) / 1e9 : -1.0);
    assert_true(retried);
    assert_int_equal(cli("node down n2"), 0);
    read_phase(c, "(b) n2 killed, map: down", 100, 0, &ph);
    assert_true(ph.served[0] + ph.served[2] >= (int64_t)ph.bytes);
    assert_true(ph.median_ms >= 0.9 * RTT_MS);

    /* (c) n2 back and marked up: reads return to it once the handle has the map that says so
     * (a reply's higher epoch) and the node serves (recovered: it missed nothing). */
    assert_int_equal(tsd_start(&CL.node[LOCAL], NULL), 0);
    assert_int_equal(cli("node up n2"), 0);
    for (int t = 0;; t++) {
        read_phase(c, "(c) n2 back: until it serves", 20, 0, &ph);
        if (ph.served[LOCAL] > 0)
            break;
        assert_true(t < 100);
    }
    read_phase(c, "(c) n2 restarted, map: up", 400, 0, &ph);
    assert_true(ph.served_total >= (int64_t)ph.bytes);
    assert_true(local_share(&ph) >= 0.99);
    assert_true(ph.median_ms < RTT_MS / 4);
    tessera_client_close(c);
    fprintf(stderr, "delay line held %llu packets\n", (unsigned long long)netdelay_packets());
}

static int setup(void **state)
{
    static const char *const domains[] = {"dc-a", "dc-b", "dc-c"};
    static const char *const remote[] = {"127.0.1.1", "127.0.1.3"};
    struct ts_dataset_policy p = {3, 0, 2, 256u << 10, 0, 0, 0, 0};
    tessera_client *c = NULL;
    char how[200];

    (void)state;
    if (tsd_cluster_start(&CL, 3, domains, 16, NULL) != 0)
        return -1;
    /* Written before the delay goes on: 3 x 24 MiB to replicate. */
    if (test_tls_open(&c, CL.tls_listen[0], "writer", NULL, NULL) != 0 ||
        tessera_dataset_create(c, "near", &p) != 0)
        return -1;
    for (uint32_t s = 0; s < SHARDS; s++)
        if (tsd_put_pattern(c, "near", s, SHARD_LEN, s) != 0)
            return -1;
    if (tessera_dataset_seal(c, "near") != 0)
        return -1;
    tessera_client_close(c);
    if (netdelay_start(remote, 2, DELAY_MS, how, sizeof(how)) != 0)
        return -1;
    fprintf(stderr,
            "delay between domains: %s each way on packets to or from n1 (dc-a, "
            "127.0.1.1) and n3 (dc-c, 127.0.1.3)\n",
            how);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    netdelay_stop();
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_stay_local_and_move_on_failure),
    };
    if (geteuid() != 0 || unshare(CLONE_NEWNET) != 0) {
        fprintf(stderr, "test_locality: SKIP: needs root and a network namespace of its own "
                        "(the delay between domains is set on its loopback)\n");
        return 77;
    }
    if (system("ip link set lo up") != 0) {
        fprintf(stderr, "test_locality: cannot bring up the namespace's loopback (iproute2: "
                        "scripts/deps installs it)\n");
        return 1;
    }
    tsd_cluster_own_hosts = 1;
    ts_log_set(log_hook, NULL, TS_LOG_WARN);
    return cmocka_run_group_tests_name("locality", tests, setup, teardown);
}
