/*
 * Tiering to ec:4+2 drops the replicas' bytes (issue 33; client/cluster_tier.c, storage/tier.c)
 * on a real 7-node cluster: the disks hold (K+M)/K of the data instead of 3 copies; every node's
 * replica answers TS_EFRAGMENTED and keeps its records; reads — single, submitted, and the plan
 * reader's records over READV — go through the fragments byte for byte, also with M nodes
 * killed (-9); a node marked out: its PGs' new replicas get the records (no bytes) and the
 * dataset's tier, no PG differs; refused tier changes change nothing; kill -9 of the CLI mid-way
 * back leaves the dataset erasure-coded and readable; run again, the bytes are put back on every
 * replica (checked by each node) and only then the fragments go; a node out that did not answer
 * then keeps its replicas dropped, is refused when brought up, and gets its bytes back from the
 * replicas when the tier is run again.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_internal.h"
#include "cluster_internal.h"
#include "conn.h"
#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_test.h"
#include "ts_map.h"
#include "ts_proto.h"

static struct tsd_cluster CL;
static char out[1 << 15];

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

#define NS 8
#define REC 6000 /* record length: the plan reader's units go by READV */
static const size_t LENS[NS] = {1, 5000, 300000, (2u << 20) + 3, 777777, 0, (3u << 20) + 1, 100000};

static tessera_client *admin(void)
{
    tessera_client *c = NULL;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "admin", NULL, NULL), 0);
    return c;
}

static uint64_t data_bytes(void)
{
    uint64_t n = 0;
    for (int s = 0; s < NS; s++)
        n += LENS[s];
    return n;
}

/* Every shard read whole through c, single reads and submitted ones, byte for byte. */
static void read_all(tessera_client *c)
{
    for (uint32_t s = 0; s < NS; s++) {
        uint8_t *want = malloc(LENS[s] + 1), *got = malloc(LENS[s] + 1);
        size_t n = 0;
        uint64_t op;
        ts_test_fill(want, LENS[s], 900 + s, 0);
        assert_int_equal(tessera_read(c, "tier", s, 0, LENS[s], got, &n), 0);
        assert_int_equal(n, LENS[s]);
        assert_memory_equal(got, want, LENS[s]);
        memset(got, 0, LENS[s] + 1);
        n = 0;
        assert_int_equal(tessera_read_submit(c, "tier", s, 0, LENS[s], got, &op), 0);
        assert_int_equal(tessera_wait(c, op, &n), 0);
        assert_int_equal(n, LENS[s]);
        assert_memory_equal(got, want, LENS[s]);
        free(want);
        free(got);
    }
}

/* A reader that goes on throughout a tiering: a handle of its own reading every shard in turn,
 * byte for byte, until told to stop; reads and failures counted. */
struct bystander {
    pthread_t th;
    atomic_int stop;
    uint64_t reads, failed;
};

static void *bystander_run(void *arg)
{
    struct bystander *b = arg;
    tessera_client *c = NULL;

    if (test_tls_open(&c, CL.tls_listen[1], "reader", NULL, NULL) != 0) {
        b->failed++;
        return NULL;
    }
    while (!atomic_load(&b->stop))
        for (uint32_t s = 0; s < NS && !atomic_load(&b->stop); s++) {
            uint8_t *want = malloc(LENS[s] + 1), *got = malloc(LENS[s] + 1);
            size_t n = 0;
            int rc = tessera_read(c, "tier", s, 0, LENS[s], got, &n);
            ts_test_fill(want, LENS[s], 900 + s, 0);
            if (rc || n != LENS[s] || memcmp(got, want, LENS[s]) != 0) {
                fprintf(stderr, "  bystander: %u: %s %s\n", s, ts_errname(rc),
                        tessera_client_error(c));
                b->failed++;
            }
            b->reads++;
            free(want);
            free(got);
        }
    tessera_client_close(c);
    return NULL;
}

static void bystander_start(struct bystander *b)
{
    memset(b, 0, sizeof(*b));
    assert_int_equal(pthread_create(&b->th, NULL, bystander_run, b), 0);
    while (b->reads < NS) /* a whole pass before the tiering starts */
        usleep(10000);
}

/* Stops it: every one of its reads was whole and right. */
static void bystander_stop(struct bystander *b)
{
    atomic_store(&b->stop, 1);
    pthread_join(b->th, NULL);
    fprintf(stderr, "  a reader throughout: %llu reads, %llu failed\n",
            (unsigned long long)b->reads, (unsigned long long)b->failed);
    assert_true(b->reads > 2 * NS);
    assert_int_equal(b->failed, 0);
}

/* Every record through the plan reader (a reader's connection, records by READV), in plan
 * order, byte for byte; the number of records. */
static uint64_t read_plan(void)
{
    struct tessera_opts co;
    struct tessera_reader_opts ro;
    struct tessera_unit u;
    tessera_reader *r = NULL;
    char err[256];
    uint64_t n = 0;
    int rc;

    tsd_client_opts(&co, &CL.node[0], "reader");
    tessera_reader_opts_init(&ro);
    ro.dataset = "tier";
    ro.unit = TESSERA_UNIT_RECORD;
    assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), 0);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        uint8_t want[REC];
        size_t len = (size_t)TS_MIN((uint64_t)REC, LENS[u.shard] - u.offset);
        uint8_t *all = malloc(LENS[u.shard]);
        ts_test_fill(all, LENS[u.shard], 900 + u.shard, 0);
        memcpy(want, all + u.offset, len);
        free(all);
        assert_int_equal(u.len, len);
        assert_memory_equal(u.data, want, len);
        n++;
    }
    assert_int_equal(rc, 0);
    tessera_reader_close(r);
    return n;
}

static int out_node = -1; /* marked out: no longer one of the replicas counted */

/* Raw READ of replica shard s on every node (but out_node): how many answered TS_EFRAGMENTED, how
 * many read it (the bytes checked), how many have no such shard. */
static void replica_census(uint32_t s, int *fragmented, int *whole, int *absent)
{
    uint8_t *want = malloc(LENS[s] + 1), *got = malloc(LENS[s] + 1);
    size_t n;

    *fragmented = *whole = *absent = 0;
    ts_test_fill(want, LENS[s], 900 + s, 0);
    for (int i = 0; i < CL.n; i++) {
        int rc;
        if (i == out_node)
            continue;
        for (int t = 0;
             (rc = raw_read_shard(CL.node[i].addr, "tier", s, LENS[s], got, &n)) == TS_EBUSY &&
             t < 300;
             t++)
            usleep(100000); /* a node just restarted: its PGs peering */
        if (rc == TS_EFRAGMENTED)
            (*fragmented)++;
        else if (rc == TS_ENOENT)
            (*absent)++;
        else {
            assert_int_equal(rc, 0);
            assert_int_equal(n, LENS[s]);
            assert_memory_equal(got, want, LENS[s]);
            (*whole)++;
        }
    }
    free(want);
    free(got);
}

/* DATASET_TIER (k, m, dropped) sent raw to node i as an admin: the node's answer. */
static int raw_tier(int i, unsigned k, unsigned m, unsigned dropped, char *msg, size_t cap)
{
    struct ts_wr w;
    int fd = raw_connect_as(CL.tls_listen[i], "admin"), rc;

    assert_true(fd >= 0);
    ts_wr_init(&w);
    ts_wr_str(&w, "tier");
    ts_wr_u8(&w, (uint8_t)k);
    ts_wr_u8(&w, (uint8_t)m);
    ts_wr_u8(&w, (uint8_t)dropped);
    assert_int_equal(raw_send_frame(fd, TS_OP_DATASET_TIER, 0, 1, w.buf, w.len), 0);
    rc = raw_recv_reply(fd, 10000, NULL, msg, cap, NULL, NULL);
    ts_wr_fini(&w);
    raw_close(fd);
    return rc;
}

static void stat_is(const char *what)
{
    assert_int_equal(cli("dataset stat tier"), 0);
    assert_non_null(strstr(out, what));
}

static uint64_t map_epoch(void)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    uint64_t e = m ? m->epoch : 0;

    ts_map_free(m);
    return e;
}

/* The node marked out, which did not answer while the dataset went back to replicated, answers
 * again: its replicas are still dropped (it refuses to be told replicated: the fault), so
 * bringing it up is refused and the map stays as it is; the tier run again puts its bytes back
 * from the replicas (the node checks every chunk) and removes its fragment stores; then it is
 * brought up, and no replica anywhere answers TS_EFRAGMENTED. */
static void out_node_returns(void)
{
    char msg[512];
    uint64_t e0;
    tessera_client *c;
    int fr, wh, ab;

    assert_int_equal(tsd_start(&CL.node[out_node], NULL), 0);
    assert_int_equal(raw_tier(out_node, 0, 0, 0, msg, sizeof(msg)), TS_EBUSY);
    e0 = map_epoch();
    assert_int_not_equal(cli("node up %s", CL.id[out_node]), 0);
    fprintf(stderr, "  node up refused: %s", out);
    assert_non_null(strstr(out, "tessera dataset tier tier replicated"));
    assert_int_equal(map_epoch(), e0);

    assert_int_equal(cli("dataset tier tier replicated"), 0);
    assert_int_equal(raw_tier(out_node, 0, 0, 0, msg, sizeof(msg)), 0); /* replicated there */
    for (uint32_t s = 0; s < NS; s++)
        for (int f = 0; f < 6; f++) {
            char frag[TS_NAME_MAX + 1];
            uint8_t b[10];
            size_t n;
            snprintf(frag, sizeof(frag), "tier#%d", f);
            assert_int_equal(raw_read_shard(CL.node[out_node].addr, frag, s, sizeof(b), b, &n),
                             TS_ENOENT);
        }

    assert_int_equal(cli("node up %s", CL.id[out_node]), 0);
    out_node = -1;
    c = admin();
    read_all(c);
    assert_int_equal(c->cl->ec_reads, 0);
    tessera_client_close(c);
    for (uint32_t s = 0; s < NS; s++) {
        replica_census(s, &fr, &wh, &ab);
        assert_int_equal(fr, 0);
        assert_true(wh >= 3);
    }
}

static void test_drop_and_restore(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 256u << 10, 0, 0, 0, 0};
    tessera_client *c = admin();
    uint64_t base, replicated, tiered, back, records = 0;
    int fr, wh, ab, victims[2] = {3, 5}, holder = 0;
    struct bystander by;
    char msg[512];

    (void)state;
    base = tsd_cluster_chunk_bytes(&CL);
    assert_int_equal(tessera_dataset_create(c, "tier", &p), 0);
    for (uint32_t s = 0; s < NS; s++) {
        uint8_t *buf = malloc(LENS[s] + 1);
        uint64_t offs[1024];
        uint32_t nr = 0;
        for (uint64_t o = 0; o < LENS[s]; o += REC)
            offs[nr++] = o;
        ts_test_fill(buf, LENS[s], 900 + s, 0);
        assert_int_equal(tessera_put(c, "tier", s, buf, LENS[s], offs, nr), 0);
        records += nr;
        free(buf);
    }
    assert_int_equal(tessera_dataset_seal(c, "tier"), 0);
    tessera_client_close(c);
    replicated = tsd_cluster_chunk_bytes(&CL) - base;

    /* To ec:4+2: the replicas' bytes go, their records stay; a reader goes on throughout. */
    bystander_start(&by);
    assert_int_equal(cli("dataset tier tier ec:4+2"), 0);
    bystander_stop(&by);
    stat_is("replica bytes dropped");
    tiered = tsd_cluster_chunk_bytes(&CL) - base;
    fprintf(stderr, "  %llu bytes of data: %llu on disk replicated (%.2fx), %llu tiered (%.2fx)\n",
            (unsigned long long)data_bytes(), (unsigned long long)replicated,
            (double)replicated / (double)data_bytes(), (unsigned long long)tiered,
            (double)tiered / (double)data_bytes());
    assert_true(replicated >= 3 * data_bytes());
    assert_true(tiered <= data_bytes() * 16 / 10); /* 1.5x and the records */
    for (uint32_t s = 0; s < NS; s++) {
        replica_census(s, &fr, &wh, &ab);
        assert_int_equal(fr, 3); /* each of its 3 replicas: fragmented, none holds bytes */
        assert_int_equal(wh, 0);
    }
    {
        uint8_t b[10];
        size_t n;
        while (raw_read_shard(CL.node[holder].addr, "tier", 3, sizeof(b), b, &n) == TS_ENOENT)
            holder++; /* a node that holds shard 3's record */
        assert_int_equal(raw_read_shard(CL.node[holder].addr, "tier", 3, sizeof(b), b, &n),
                         TS_EFRAGMENTED);
    }

    /* Reads go through the fragments: single, submitted, the plan reader's records. */
    c = admin();
    read_all(c);
    assert_true(c->cl->ec_reads >= 2 * (NS - 1));
    tessera_client_close(c);
    assert_true(read_plan() == records);

    /* Scrub skips the bytes that are not there: nothing corrupt, no PG differs. */
    {
        struct ts_scrub_report rep;
        c = admin();
        assert_int_equal(tessera_scrub(c, NULL, &rep, NULL, NULL), 0);
        assert_int_equal(rep.corrupt, 0);
        assert_int_equal(rep.pgs_differing, 0);
        assert_int_equal(rep.missing, 0);
        tessera_client_close(c);
    }

    /* M nodes killed: every byte still reads, from the fragments left. */
    for (int v = 0; v < 2; v++)
        tsd_kill9(&CL.node[victims[v]]);
    c = admin();
    read_all(c);
    tessera_client_close(c);
    assert_true(read_plan() == records);
    for (int v = 0; v < 2; v++)
        assert_int_equal(tsd_start(&CL.node[victims[v]], NULL), 0);

    /* A node marked out: its PGs' new replicas are backfilled with the shards' records (no
     * bytes: the fragments hold them) and take on the dataset's tier; no PG differs, no shard
     * is missing; repair puts the fragments the node held on their new positions. */
    for (int t = 0; t < 60 && cli("node out %s", CL.id[6]) != 0; t++)
        sleep(1); /* the two restarted nodes may still be catching up */
    out_node = 6;
    {
        struct ts_scrub_report rep = {0};
        int t;
        c = admin();
        for (t = 0; t < 120; t++) {
            assert_int_equal(tessera_scrub(c, NULL, &rep, NULL, NULL), 0);
            if (rep.missing == 0 && rep.pgs_differing == 0 && rep.corrupt == 0)
                break;
            usleep(500000);
        }
        fprintf(stderr,
                "  after node out: %u PGs compared, %u differing, %llu missing (%d polls)\n",
                rep.pgs_compared, rep.pgs_differing, (unsigned long long)rep.missing, t + 1);
        assert_int_equal(rep.missing, 0);
        assert_int_equal(rep.pgs_differing, 0);
        assert_int_equal(rep.corrupt, 0);
        tessera_client_close(c);
    }
    for (uint32_t s = 0; s < NS; s++) {
        replica_census(s, &fr, &wh, &ab);
        assert_int_equal(fr, 3); /* the new replicas hold its records, not its bytes */
        assert_int_equal(wh, 0);
    }
    assert_int_equal(cli("--json dataset repair tier"), 0);
    assert_non_null(strstr(out, "\"failed\": 0"));
    c = admin();
    read_all(c);
    tessera_client_close(c);
    assert_true(read_plan() == records);

    /* Refused changes change nothing: replicated only while the bytes are dropped, keeping them
     * while they are not back, dropped without a code. */
    assert_int_equal(raw_tier(holder, 0, 0, 0, msg, sizeof(msg)), TS_EBUSY);
    assert_non_null(strstr(msg, "put them back"));
    assert_int_equal(raw_tier(holder, 4, 2, 0, msg, sizeof(msg)), TS_EINCOMPLETE);
    assert_non_null(strstr(msg, "not restored"));
    assert_int_equal(raw_tier(holder, 0, 0, 1, msg, sizeof(msg)), TS_EINVAL);
    assert_int_equal(raw_tier(holder, 4, 2, 2, msg, sizeof(msg)), TS_EPROTO);
    stat_is("replica bytes dropped");
    replica_census(3, &fr, &wh, &ab);
    assert_int_equal(fr, 3);

    /* kill -9 of the CLI putting the bytes back: still erasure-coded, every byte reads. */
    {
        char cmd[2048], line[1024];
        int killed = 0;
        FILE *pp;
        snprintf(cmd, sizeof(cmd),
                 "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s dataset tier tier replicated "
                 "2>&1",
                 TESSERA_CLI_PATH, CL.tls_listen[0], test_cert("ca", "pem"),
                 test_cert("admin", "pem"), test_cert("admin", "key"));
        pp = popen(cmd, "r");
        assert_non_null(pp);
        while (fgets(line, sizeof(line), pp)) {
            fprintf(stderr, "  | %s", line);
            if (!killed && strstr(line, "4/8 shards")) {
                assert_int_equal(system("pkill -9 -f 'dataset tier tie[r] replicated'"), 0);
                killed = 1;
            }
        }
        pclose(pp);
        assert_true(killed); /* the fault happened mid-way */
    }
    stat_is("replica bytes dropped");
    c = admin();
    read_all(c);
    tessera_client_close(c);

    /* Run again: the bytes back on every replica, checked by its node; then the fragments go;
     * a reader goes on throughout. The node marked out does not answer this time (stopped): it
     * is left as it is, its replicas dropped (below). */
    assert_int_equal(tsd_stop(&CL.node[out_node]), 0);
    bystander_start(&by);
    assert_int_equal(cli("dataset tier tier replicated"), 0);
    bystander_stop(&by);
    stat_is("replicated");
    assert_null(strstr(out, "erasure-coded"));
    for (uint32_t s = 0; s < NS; s++) {
        replica_census(s, &fr, &wh, &ab);
        assert_int_equal(fr, 0);
        assert_int_equal(wh, 3);
    }
    for (int i = 0; i < CL.n; i++) {
        uint8_t b[10];
        size_t n;
        for (int f = 0; f < 6 && i != out_node; f++) {
            char frag[TS_NAME_MAX + 1];
            snprintf(frag, sizeof(frag), "tier#%d", f);
            assert_int_equal(raw_read_shard(CL.node[i].addr, frag, 3, sizeof(b), b, &n), TS_ENOENT);
        }
    }
    c = admin();
    read_all(c);
    assert_int_equal(c->cl->ec_reads, 0);
    tessera_client_close(c);
    back = tsd_cluster_chunk_bytes(&CL) - base;
    fprintf(stderr, "  back to replicated: %llu on disk (%.2fx)\n", (unsigned long long)back,
            (double)back / (double)data_bytes());
    assert_true(back >= 3 * data_bytes());
    out_node_returns();
}

static int setup(void **state)
{
    (void)state;
    return tsd_cluster_start(&CL, 7, NULL, 8, NULL);
}

static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drop_and_restore),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
