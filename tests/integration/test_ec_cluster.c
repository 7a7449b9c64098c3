/*
 * Erasure-coded shards on a real 6-node cluster (issue 33, client/cluster_ec.c and the nodes'
 * fragment stores NAME#f): every shard of a sealed dataset put as 4+2 fragments, one per node of
 * its PG's EC order, each durable on its node; read back byte for byte from the data fragments
 * alone; a byte flipped in a fragment's chunk file on disk caught by its CRC32C and the range
 * rebuilt from the others; two nodes killed (-9): every byte still read, rebuilt; a third:
 * a clear error naming the fragments it could not read, never bytes; the nodes back: read
 * straight again. And the nodes' rules: only an admin writes fragments, only of a sealed
 * dataset; fragment stores are in no listing and go with their dataset.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_internal.h"
#include "cluster_internal.h"
#include "conn.h"
#include "tessera/tessera.h"
#include "ts_ec.h"
#include "ts_map.h"
#include "ts_proto.h"

static struct tsd_cluster CL;
static char out[1 << 15];

#define cli(...) tsd_cli(&CL, TESSERA_CLI_PATH, out, sizeof(out), __VA_ARGS__)

#define K 4
#define M 2
#define NSHARDS 4
/* Shard lengths: one small stripe, one of a stripe's worth plus a little, one whose fragments
 * the test damages, and three stripes of 1 MiB cells, the last one short. */
static const size_t LENS[NSHARDS] = {10000, (1u << 20) + 123, (3u << 20) + 5, (9u << 20) + 77};
#define DAMAGED 2

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 11);
}

static tessera_client *admin(void)
{
    tessera_client *c = NULL;

    assert_int_equal(test_tls_open(&c, CL.tls_listen[0], "admin", NULL, NULL), 0);
    return c;
}

/* Shard s read through the router's EC path at [off, off+len) must be the pattern's bytes. */
static int ec_read(tessera_client *c, uint32_t s, uint64_t off, size_t len,
                   struct ts_ec_read_stats *st)
{
    uint8_t *want = malloc(LENS[s]), *got = malloc(len ? len : 1);
    int rc;

    fill(want, LENS[s], s);
    memset(got, 0xee, len ? len : 1);
    rc = ts_cl_ec_read(c, c->cl, "cold", s, LENS[s], K, M, off, len, got, st);
    if (rc == 0 && memcmp(got, want + off, len) != 0)
        rc = TS_ECORRUPT; /* wrong bytes: the one thing never allowed */
    if (rc)
        fprintf(stderr, "  shard %u [%llu, +%zu): %s: %s\n", s, (unsigned long long)off, len,
                ts_errname(rc), tessera_client_error(c));
    free(want);
    free(got);
    return rc;
}

/* Shard s of ds (len bytes of pattern seed) read whole through its fragments, byte for byte. */
static int ec_read_any(tessera_client *c, const char *ds, uint32_t s, size_t len, uint32_t seed,
                       struct ts_ec_read_stats *st)
{
    uint8_t *want = malloc(len + 1), *got = malloc(len + 1);
    int rc;

    fill(want, len, seed);
    rc = ts_cl_ec_read(c, c->cl, ds, s, len, K, M, 0, len, got, st);
    if (rc == 0 && memcmp(got, want, len) != 0)
        rc = TS_ECORRUPT;
    if (rc)
        fprintf(stderr, "  %s/%u: %s: %s\n", ds, s, ts_errname(rc), tessera_client_error(c));
    free(want);
    free(got);
    return rc;
}

/* The map node index at each EC position of shard s. */
static void ec_order(uint32_t s, int *ord)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);

    assert_non_null(m);
    assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "cold", s), ord, K + M), K + M);
    ts_map_free(m);
}

static uint64_t raw_map_get_epoch(void)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    uint64_t e = m ? m->epoch : 0;

    ts_map_free(m);
    return e;
}

static int node_index(const struct ts_map *m, int idx)
{
    return tsd_cluster_find(&CL, m->nodes[idx].id);
}

static int cluster_index_at(uint32_t s, unsigned f)
{
    struct ts_map *m = raw_map_get(CL.node[0].addr);
    int ord[K + M], i;

    assert_non_null(m);
    assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "cold", s), ord, K + M), K + M);
    i = node_index(m, ord[f]);
    ts_map_free(m);
    return i;
}

static void test_put_every_shard_as_fragments(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 1u << 20, 0, 0, 0, 0};
    tessera_client *c = admin();

    (void)state;
    assert_int_equal(tessera_dataset_create(c, "cold", &p), 0);
    for (uint32_t s = 0; s < NSHARDS; s++) {
        uint8_t *buf = malloc(LENS[s]);
        fill(buf, LENS[s], s);
        assert_int_equal(tessera_put(c, "cold", s, buf, LENS[s], NULL, 0), 0);
        /* Not sealed yet: no fragment may be written. */
        if (s == 0) {
            assert_int_equal(ts_cl_ec_put(c, c->cl, "cold", s, buf, LENS[s], K, M), TS_EINVAL);
            assert_non_null(strstr(tessera_client_error(c), "not sealed"));
        }
        free(buf);
    }
    assert_int_equal(tessera_dataset_seal(c, "cold"), 0);
    for (uint32_t s = 0; s < NSHARDS; s++) {
        uint8_t *buf = malloc(LENS[s]);
        fill(buf, LENS[s], s);
        assert_int_equal(ts_cl_ec_put(c, c->cl, "cold", s, buf, LENS[s], K, M), 0);
        /* Again (a retried conversion): the same fragments are confirmed, nothing changes. */
        if (s == 1)
            assert_int_equal(ts_cl_ec_put(c, c->cl, "cold", s, buf, LENS[s], K, M), 0);
        free(buf);
    }
    /* Each position's node holds that fragment, and only that one, as ts_ec_frag_len says. */
    for (uint32_t s = 0; s < NSHARDS; s++) {
        struct ts_ec_layout l;
        assert_int_equal(ts_ec_layout_for(&l, K, M, LENS[s]), 0);
        for (unsigned f = 0; f < K + M; f++) {
            int i = cluster_index_at(s, f);
            char name[TS_NAME_MAX + 1];
            size_t flen = (size_t)ts_ec_frag_len(&l, f), got = 0;
            uint8_t *b = malloc(flen + 1);
            assert_true(i >= 0);
            assert_int_equal(ts_frag_name(name, "cold", f), 0);
            assert_int_equal(raw_read_shard(CL.node[i].addr, name, s, flen, b, &got), 0);
            assert_int_equal(got, flen);
            for (unsigned g = 0; g < K + M; g++) {
                int j = cluster_index_at(s, g);
                if (g == f || j == i)
                    continue;
                assert_int_equal(ts_frag_name(name, "cold", f), 0);
                assert_int_not_equal(raw_read_shard(CL.node[j].addr, name, s, flen, b, &got), 0);
            }
            free(b);
        }
    }
    tessera_client_close(c);
}

static void test_nodes_rules(void **state)
{
    tessera_client *c = NULL;
    struct ts_dataset_info *v = NULL;
    size_t n = 0;
    uint8_t b[16] = {0};

    (void)state;
    /* A writer may write the dataset, not its fragments. */
    assert_int_equal(test_tls_open(&c, CL.tls_listen[1], "writer", NULL, NULL), 0);
    assert_int_equal(ts_cl_ec_put(c, c->cl, "cold", 0, b, sizeof(b), K, M), TS_EPERM);
    assert_non_null(strstr(tessera_client_error(c), "only an admin"));
    /* Fragment stores are no datasets of their own: not listed, not made by name. */
    assert_int_equal(tessera_dataset_list(c, &v, &n), 0);
    for (size_t i = 0; i < n; i++)
        assert_null(strchr(v[i].name, '#'));
    tessera_buffer_free(v);
    tessera_client_close(c);
    c = admin();
    assert_int_equal(tessera_dataset_create(c, "cold#1", NULL), TS_ENAME);
    tessera_client_close(c);
}

static void test_healthy_reads_are_direct(void **state)
{
    tessera_client *c = admin();
    struct ts_ec_read_stats st;

    (void)state;
    for (uint32_t s = 0; s < NSHARDS; s++) {
        if (s == DAMAGED)
            continue; /* its fragments are read first by the next test */
        assert_int_equal(ec_read(c, s, 0, LENS[s], &st), 0);
        assert_int_equal(st.rebuilt, 0);
        assert_true(st.direct >= 1);
        assert_int_equal(st.bad, 0);
        /* Ranges across cells and stripes, and the last byte. */
        assert_int_equal(ec_read(c, s, LENS[s] / 3, LENS[s] / 2, &st), 0);
        assert_int_equal(ec_read(c, s, LENS[s] - 1, 1, &st), 0);
        assert_int_equal(st.rebuilt, 0);
    }
    /* Scrub verifies the fragments' chunks too, and no PG inventory counts them: each node
     * holds other fragments, so counted, every PG would differ and start a backfill. */
    {
        struct ts_scrub_report rep;
        uint64_t chunks_before_frags = 0;
        assert_int_equal(tessera_scrub(c, NULL, &rep, NULL, NULL), 0);
        fprintf(stderr,
                "  scrub: %llu shards, %llu chunks, %llu corrupt, %u PGs compared, %u "
                "differing, %llu missing\n",
                (unsigned long long)rep.shards, (unsigned long long)rep.chunks,
                (unsigned long long)rep.corrupt, rep.pgs_compared, rep.pgs_differing,
                (unsigned long long)rep.missing);
        for (uint32_t s = 0; s < NSHARDS; s++) /* 3 core copies of each shard's chunks */
            chunks_before_frags += 3 * ((LENS[s] + (1u << 20) - 1) >> 20);
        assert_true(rep.chunks > chunks_before_frags); /* and the fragments' */
        assert_int_equal(rep.corrupt, 0);
        assert_true(rep.pgs_compared > 0);
        assert_int_equal(rep.pgs_differing, 0);
        assert_int_equal(rep.missing, 0);
    }
    tessera_client_close(c);
}

/* Flips one byte at off of node i's only chunk file of `size` bytes (a fragment), then restarts
 * the node so that its cache (which may hold the chunk) is gone and the next read is the file's. */
static void flip_on_disk(int i, uint64_t size, off_t off)
{
    char path[1600];
    uint8_t x;
    int fd;

    assert_int_equal(tsd_chunk_files_of_size(CL.node[i].data, (off_t)size, path, sizeof(path)), 1);
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &x, 1, off), 1);
    x ^= 0x40;
    assert_int_equal(pwrite(fd, &x, 1, off), 1);
    close(fd);
    fprintf(stderr, "  flipped byte %lld of %s on %s\n", (long long)off, path, CL.id[i]);
    assert_int_equal(tsd_stop(&CL.node[i]), 0);
    assert_int_equal(tsd_start(&CL.node[i], NULL), 0);
}

static void test_flipped_byte_is_caught_and_rebuilt(void **state)
{
    tessera_client *c = admin();
    struct ts_ec_read_stats st;
    struct ts_ec_layout l;
    int i = cluster_index_at(DAMAGED, 0);

    (void)state;
    assert_int_equal(ts_ec_layout_for(&l, K, M, LENS[DAMAGED]), 0);
    /* Data fragment 0 of the damaged shard: the only file of its length on its node. */
    flip_on_disk(i, ts_ec_frag_len(&l, 0), 4097);
    /* Bytes 4097.. of fragment 0 are shard bytes 4097.. (stripe 0, cell 0). */
    assert_int_equal(ec_read(c, DAMAGED, 4000, 200, &st), 0);
    assert_int_equal(st.rebuilt, 1);
    assert_int_equal(st.bad, 1); /* fragment 0, and only it, failed */
    assert_int_equal(ec_read(c, DAMAGED, 0, LENS[DAMAGED], &st), 0);
    assert_true(st.rebuilt >= 1);
    /* A range of fragment 0 outside the damaged sub-block still reads straight. */
    assert_int_equal(ec_read(c, DAMAGED, 3 * 4096 + 10, 1000, &st), 0);
    assert_int_equal(st.rebuilt, 0);
    tessera_client_close(c);
}

static void test_m_nodes_down_then_m_plus_one(void **state)
{
    tessera_client *c = admin();
    struct ts_ec_read_stats st;
    int ord[K + M], killed[M + 1];
    struct ts_map *m = raw_map_get(CL.node[0].addr);

    (void)state;
    assert_non_null(m);
    ec_order(3, ord);
    /* Shard 3's first two data fragments' nodes, then one more data fragment's: never node 0,
     * through which the admin handle came (the map still says up: a kill -9, not a drain). */
    for (int f = 0, n = 0; f < K + M && n < M + 1; f++) {
        int i = node_index(m, ord[f]);
        if (i > 0)
            killed[n++] = i;
    }
    ts_map_free(m);
    for (int j = 0; j < M; j++) {
        fprintf(stderr, "  kill -9 %s\n", CL.id[killed[j]]);
        tsd_kill9(&CL.node[killed[j]]);
        assert_false(tsd_alive(&CL.node[killed[j]]));
    }
    for (uint32_t s = 0; s < NSHARDS; s++)
        if (s != DAMAGED) /* its damaged fragment would be a third loss (repair: not yet) */
            assert_int_equal(ec_read(c, s, 0, LENS[s], &st), 0);
    assert_int_equal(ec_read(c, 3, 0, LENS[3], &st), 0);
    assert_true(st.rebuilt >= 1); /* the fault happened: data fragments were missing */
    assert_true(st.bad != 0);
    fprintf(stderr, "  kill -9 %s\n", CL.id[killed[M]]);
    tsd_kill9(&CL.node[killed[M]]);
    assert_int_equal(ec_read(c, 3, 0, LENS[3], &st), TS_EUNAVAIL);
    fprintf(stderr, "  M+1 down: %s\n", tessera_client_error(c));
    assert_non_null(strstr(tessera_client_error(c), "fragments readable"));
    for (int j = 0; j <= M; j++)
        assert_non_null(strstr(tessera_client_error(c), CL.id[killed[j]]));
    tessera_client_close(c);
    /* Back: every fragment was durable on its node; reads go straight again. */
    for (int j = 0; j <= M; j++)
        assert_int_equal(tsd_start(&CL.node[killed[j]], NULL), 0);
    c = admin();
    for (uint32_t s = 0; s < NSHARDS; s++) {
        if (s == DAMAGED)
            continue; /* its damaged fragment is rebuilt by repair, not yet built */
        assert_int_equal(ec_read(c, s, 0, LENS[s], &st), 0);
        assert_int_equal(st.rebuilt, 0);
    }
    tessera_client_close(c);
}

/* The number after "key": in out (a --json line), or -1. */
static long json_num(const char *key)
{
    char k[64];
    const char *p;

    snprintf(k, sizeof(k), "\"%s\":", key);
    p = strstr(out, k);
    return p ? strtol(p + strlen(k), NULL, 10) : -1;
}

/* `tessera dataset tier`: refused changes change nothing; ec:4+2 puts every shard's fragments,
 * after which reads go through them; again, it goes on; replicated takes the fragments away. */
static void test_tier_cli(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 256u << 10, 0, 0, 0, 0};
    static const size_t lens[] = {1, 5000, 300000, (2u << 20) + 3, 777777, 0};
    const size_t ns = sizeof(lens) / sizeof(lens[0]);
    tessera_client *c = admin();
    struct ts_dataset_info d;
    uint64_t before;
    uint8_t b[64];
    size_t got = 0;
    int i0;

    (void)state;
    assert_int_equal(tessera_dataset_create(c, "warm", &p), 0);
    for (uint32_t s = 0; s < ns; s++) {
        uint8_t *buf = malloc(lens[s] + 1);
        fill(buf, lens[s], 100 + s);
        assert_int_equal(tessera_put(c, "warm", s, buf, lens[s], NULL, 0), 0);
        free(buf);
    }
    assert_int_not_equal(cli("dataset tier warm ec:4+2"), 0); /* open */
    assert_non_null(strstr(out, "sealed"));
    assert_int_equal(tessera_dataset_seal(c, "warm"), 0);
    assert_int_not_equal(cli("dataset tier warm ec:0+2"), 0);
    assert_int_not_equal(cli("dataset tier warm ec:4"), 0);
    assert_int_not_equal(cli("dataset tier nosuch ec:4+2"), 0);
    assert_int_not_equal(cli("dataset tier warm ec:6+2"), 0); /* 8 nodes needed, 7 there */
    assert_non_null(strstr(out, "needs 8 nodes"));
    assert_int_equal(tessera_dataset_stat(c, "warm", &d), 0);
    assert_int_equal(d.policy.ec_k, 0); /* refused: nothing changed */
    assert_int_equal(cli("dataset tier warm ec:4+2"), 0);
    assert_non_null(strstr(out, "ETA"));
    assert_non_null(strstr(out, "6/6 shards"));
    assert_non_null(strstr(out, "erasure-coded"));
    assert_int_equal(cli("dataset stat warm"), 0);
    assert_non_null(strstr(out, "ec:4+2"));
    tessera_client_close(c);
    /* Reads of it now go through the fragments, byte for byte. */
    c = admin();
    before = c->cl->ec_reads;
    for (uint32_t s = 0; s < ns; s++) {
        uint8_t *want = malloc(lens[s] + 1), *buf = malloc(lens[s] + 1);
        size_t n = 0;
        fill(want, lens[s], 100 + s);
        assert_int_equal(tessera_read(c, "warm", s, 0, lens[s], buf, &n), 0);
        assert_int_equal(n, lens[s]);
        assert_memory_equal(buf, want, lens[s]);
        free(want);
        free(buf);
    }
    assert_int_equal(c->cl->ec_reads - before, ns);
    assert_int_equal(c->cl->ec_fallbacks, 0);
    {
        char name[TS_NAME_MAX + 1];
        assert_int_equal(ts_frag_name(name, "warm", 0), 0);
        i0 = -1;
        for (int i = 0; i < CL.n && i0 < 0; i++)
            if (raw_read_shard(CL.node[i].addr, name, 2, sizeof(b), b, &got) == 0)
                i0 = i;
        assert_true(i0 >= 0);
    }
    /* Again: the fragments are there already; it goes through and changes nothing. */
    assert_int_equal(cli("dataset tier warm ec:4+2"), 0);
    assert_int_not_equal(cli("dataset tier warm ec:3+3"), 0); /* another code: back first */
    assert_non_null(strstr(out, "replicated first"));
    /* Back to replicated: the fragments go, the replicas serve. */
    assert_int_equal(cli("dataset tier warm replicated"), 0);
    assert_int_equal(cli("dataset stat warm"), 0);
    assert_non_null(strstr(out, "replicated"));
    assert_int_equal(raw_read_shard(CL.node[i0].addr, "warm#0", 2, sizeof(b), b, &got), TS_ENOENT);
    tessera_client_close(c);
    c = admin();
    for (uint32_t s = 0; s < ns; s++) {
        uint8_t *want = malloc(lens[s] + 1), *buf = malloc(lens[s] + 1);
        size_t n = 0;
        fill(want, lens[s], 100 + s);
        assert_int_equal(tessera_read(c, "warm", s, 0, lens[s], buf, &n), 0);
        assert_memory_equal(buf, want, lens[s]);
        free(want);
        free(buf);
    }
    assert_int_equal(c->cl->ec_reads, 0);
    tessera_client_close(c);
}

static void test_fragments_go_with_their_dataset(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 1u << 20, 0, 0, 0, 0};
    tessera_client *c = admin();
    int i = cluster_index_at(1, 0);
    uint8_t b[64];
    size_t got = 0;

    (void)state;
    assert_int_equal(raw_read_shard(CL.node[i].addr, "cold#0", 1, sizeof(b), b, &got), 0);
    assert_int_equal(tessera_dataset_delete(c, "cold"), 0);
    assert_int_equal(tessera_dataset_create(c, "cold", &p), 0);
    assert_int_equal(raw_read_shard(CL.node[i].addr, "cold#0", 1, sizeof(b), b, &got), TS_ENOENT);
    tessera_client_close(c);
}

/*
 * `tessera dataset repair`: a chunk flipped on disk in one fragment and a node marked out
 * (its positions move to the node that was spare): one run rebuilds the damaged chunk in place
 * and puts the moved fragments on their new nodes; every read is then direct again, and a
 * second run finds nothing to do.
 */
/* SHARD_STAT requests the nodes answered (over TLS: the admin's), ok or not. */
static double stat_requests(void)
{
    double sum = 0;

    for (int n = 0; n < CL.n; n++) {
        /* Every node's metrics are readable: a missing page would read as 0 stats. */
        assert_true(tsd_metric(&CL.node[n], "tessera_requests_total") >= 0);
        for (int r = 0; r < 2; r++) {
            double v = tsd_metric(&CL.node[n], r ? "tessera_requests_total{op=\"shard-stat\","
                                                   "transport=\"tls\",result=\"error\"}"
                                                 : "tessera_requests_total{op=\"shard-stat\","
                                                   "transport=\"tls\",result=\"ok\"}");
            sum += v > 0 ? v : 0;
        }
    }
    return sum;
}

static void test_repair(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 256u << 10, 0, 0, 0, 0};
    static const size_t lens[] = {700000, (3u << 20) + 40000, 10, 2u << 20, 123457};
    const uint32_t ns = sizeof(lens) / sizeof(lens[0]);
    tessera_client *c = admin();
    struct ts_ec_read_stats st;
    struct ts_ec_layout l;
    struct ts_map *m;
    int i, gone = -1, rc;

    (void)state;
    assert_int_equal(tessera_dataset_create(c, "rep", &p), 0);
    for (uint32_t s = 0; s < ns; s++) {
        uint8_t *buf = malloc(lens[s]);
        fill(buf, lens[s], 300 + s);
        assert_int_equal(tessera_put(c, "rep", s, buf, lens[s], NULL, 0), 0);
        free(buf);
    }
    assert_int_equal(tessera_dataset_seal(c, "rep"), 0);
    tessera_client_close(c);
    assert_int_equal(cli("dataset tier rep ec:4+2"), 0);
    assert_int_equal(cli("--json dataset repair rep"), 0); /* healthy: nothing to do */
    assert_int_equal(json_num("fragments_put"), 0);
    assert_int_equal(json_num("chunks_repaired"), 0);

    /* Damage: byte 300000 of shard 1's fragment 1 (its second 256 KiB chunk) on disk. */
    m = raw_map_get(CL.node[0].addr);
    assert_non_null(m);
    {
        int ord[K + M];
        assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "rep", 1), ord, K + M), K + M);
        i = node_index(m, ord[1]);
    }
    assert_int_equal(ts_ec_layout_for(&l, K, M, lens[1]), 0);
    flip_on_disk(i, ts_ec_frag_len(&l, 1), 300000);

    /* A node out: the one holding shard 3's fragment 2 or the next (never node 0, the CLI's,
     * nor the damaged one). */
    {
        int ord[K + M];
        assert_int_equal(ts_map_ec_order(m, ts_map_pg_of(m, "rep", 3), ord, K + M), K + M);
        for (int f = 2; gone <= 0 || gone == i; f = (f + 1) % (K + M))
            gone = node_index(m, ord[f]);
    }
    ts_map_free(m);
    /* The cluster may still be recovering from the previous test's kill: node out waits. */
    for (int t = 0; t < 60 && cli("node out %s", CL.id[gone]) != 0; t++)
        sleep(1);
    assert_int_equal(raw_map_get_epoch(), 2);
    c = admin();
    assert_int_equal(ec_read_any(c, "rep", 3, lens[3], 300 + 3, &st), 0);
    assert_true(st.rebuilt > 0); /* the fault happened: shard 3's moved fragment is missing */
    tessera_client_close(c);
    {
        /* The node now at the moved position noted the fragment it was asked for missing (for
         * the monitor's repair: its STATUS lists it, chunk -1: the whole fragment). */
        int noted = 0;
        for (int n = 0; n < CL.n; n++)
            noted += n != gone && raw_status_has(CL.node[n].addr, "\"shard\":3,\"chunk\":-1");
        assert_true(noted >= 1);
    }

    /* The monitor's repair (presence only): the fragment missing since the node went out is
     * rebuilt and put; the ones in place are seen in their nodes' listings (one a node and
     * fragment), not asked for one by one: a stat only for each one missing. */
    {
        struct tessera_repair_report r;
        double stats0 = stat_requests();
        c = admin();
        assert_int_equal(ts_client_ec_repair(c, "rep", TS_REPAIR_PRESENCE, &r), 0);
        tessera_client_close(c);
        fprintf(stderr, "  presence repair: %llu fragments put, %.0f shard stats for %u shards\n",
                (unsigned long long)r.fragments_put, stat_requests() - stats0, ns);
        assert_true(r.fragments_put >= 1);
        assert_int_equal(r.chunks_repaired, 0); /* the damaged chunk is not read in this mode */
        assert_int_equal(r.failed, 0);
        assert_int_equal(r.unreachable, 0);
        assert_true(stat_requests() - stats0 <= (double)r.fragments_put);
    }

    assert_int_equal(cli("--json dataset repair rep"), 0);
    fprintf(stderr, "  damaged on %s, out %s\n", CL.id[i], CL.id[gone]);
    fprintf(stderr, "  repair: %ld fragments put, %ld chunks repaired\n", json_num("fragments_put"),
            json_num("chunks_repaired"));
    assert_int_equal(json_num("chunks_repaired"), 1);
    assert_int_equal(json_num("fragments_put"), 0); /* put by the presence repair above */
    assert_int_equal(json_num("failed"), 0);
    assert_int_equal(json_num("unreachable"), 0);
    /* What the nodes had noted is repaired: none lists a fragment of rep any more. */
    for (int n = 0; n < CL.n; n++) {
        if (n == gone)
            continue;
        assert_true(raw_status_has(CL.node[n].addr, "\"ec_repair_wanted\":[")); /* it answers */
        assert_false(raw_status_has(CL.node[n].addr, "\"fragment\":\"rep#"));
    }
    c = admin();
    for (uint32_t s = 0; s < ns; s++) {
        assert_int_equal(ec_read_any(c, "rep", s, lens[s], 300 + s, &st), 0);
        assert_int_equal(st.rebuilt, 0);
        assert_int_equal(st.bad, 0);
    }
    tessera_client_close(c);
    assert_int_equal(cli("--json dataset repair rep"), 0);
    assert_int_equal(json_num("fragments_put"), 0);
    assert_int_equal(json_num("chunks_repaired"), 0);

    /* CHUNK_REPAIR with bytes that are not the chunk's: refused, nothing written (the next
     * read is still direct); of a replicated shard, or by a writer: refused. */
    {
        static uint8_t junk[256u << 10];
        char msg[512];
        struct ts_wr w;
        int rfd = raw_connect_as(CL.tls_listen[i], "admin");
        assert_true(rfd >= 0);
        ts_wr_init(&w);
        ts_wr_str(&w, "rep#1");
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, sizeof(junk));
        ts_wr_bytes(&w, junk, sizeof(junk));
        assert_int_equal(raw_send_frame(rfd, TS_OP_CHUNK_REPAIR, 0, 1, w.buf, w.len), 0);
        assert_int_equal(raw_recv_reply(rfd, 10000, NULL, msg, sizeof(msg), NULL, NULL),
                         TS_ECORRUPT);
        assert_non_null(strstr(msg, "nothing written"));
        w.len = 0;
        ts_wr_str(&w, "warm"); /* replicated, its replicas' bytes kept */
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, 0);
        ts_wr_u32(&w, 0);
        assert_int_equal(raw_send_frame(rfd, TS_OP_CHUNK_REPAIR, 0, 2, w.buf, w.len), 0);
        assert_int_equal(raw_recv_reply(rfd, 10000, NULL, NULL, 0, NULL, NULL), TS_EINVAL);
        w.len = 0;
        ts_wr_str(&w, "rep"); /* its replicas' bytes dropped: taken, if they are the chunk's */
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, 0);
        ts_wr_u32(&w, 0);
        assert_int_equal(raw_send_frame(rfd, TS_OP_CHUNK_REPAIR, 0, 4, w.buf, w.len), 0);
        rc = raw_recv_reply(rfd, 10000, NULL, NULL, 0, NULL, NULL);
        assert_true(rc == TS_ECORRUPT || rc == TS_ENOENT); /* not the chunk's, or no such shard */
        raw_close(rfd);
        rfd = raw_connect_as(CL.tls_listen[i], "writer");
        assert_true(rfd >= 0);
        w.len = 0;
        ts_wr_str(&w, "rep#1");
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, 1);
        ts_wr_u32(&w, 0);
        assert_int_equal(raw_send_frame(rfd, TS_OP_CHUNK_REPAIR, 0, 3, w.buf, w.len), 0);
        assert_int_equal(raw_recv_reply(rfd, 10000, NULL, NULL, 0, NULL, NULL), TS_EPERM);
        raw_close(rfd);
        ts_wr_fini(&w);
        c = admin();
        assert_int_equal(ec_read_any(c, "rep", 1, lens[1], 300 + 1, &st), 0);
        assert_int_equal(st.rebuilt, 0);
        tessera_client_close(c);
    }
}

/* Runs `tessera dataset tier mid ec:4+2` and calls act() once its first shard is done; the
 * command's exit status (-1: killed). */
static int tier_mid_with(void (*act)(void))
{
    char cmd[2048], line[1024];
    int acted = 0, st;
    FILE *p;

    snprintf(cmd, sizeof(cmd),
             "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s dataset tier mid ec:4+2 2>&1",
             TESSERA_CLI_PATH, CL.tls_listen[0], test_cert("ca", "pem"), test_cert("admin", "pem"),
             test_cert("admin", "key"));
    p = popen(cmd, "r");
    assert_non_null(p);
    while (fgets(line, sizeof(line), p)) {
        fprintf(stderr, "  | %s", line);
        if (!acted && strstr(line, "1/40 shards")) {
            act();
            acted = 1;
        }
    }
    st = pclose(p);
    assert_true(acted); /* the fault happened mid-conversion */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int mid_victim;

static void kill_cli(void)
{
    fprintf(stderr, "  kill -9 the converting CLI\n");
    /* "mi[d]": the shell running pkill does not match itself; "." for the "+". */
    assert_int_equal(system("pkill -9 -f 'dataset tier mi[d] ec:4.2'"), 0);
}

static void kill_node(void)
{
    fprintf(stderr, "  kill -9 %s\n", CL.id[mid_victim]);
    tsd_kill9(&CL.node[mid_victim]);
}

/* Every shard of mid, byte for byte through c (its fragments or its replicas). */
static void mid_reads(tessera_client *c)
{
    static uint8_t want[200000], got[200000];
    for (uint32_t s = 0; s < 40; s++) {
        size_t n = 0;
        fill(want, sizeof(want), 500 + s);
        assert_int_equal(tessera_read(c, "mid", s, 0, sizeof(got), got, &n), 0);
        assert_int_equal(n, sizeof(got));
        assert_memory_equal(got, want, sizeof(got));
    }
}

/* kill -9 of the converting CLI and of a node mid-conversion: the dataset stays replicated
 * (nothing marked before every shard is durable), every byte reads; run again, it completes;
 * the fragments the interrupted runs wrote are whole (repair finds nothing). */
static void test_tier_killed_midway(void **state)
{
    struct ts_dataset_policy p = {3, 0, 2, 64u << 10, 0, 0, 0, 0};
    static uint8_t buf[200000];
    tessera_client *c = admin();
    struct ts_dataset_info d;

    (void)state;
    assert_int_equal(tessera_dataset_create(c, "mid", &p), 0);
    for (uint32_t s = 0; s < 40; s++) {
        fill(buf, sizeof(buf), 500 + s);
        assert_int_equal(tessera_put(c, "mid", s, buf, sizeof(buf), NULL, 0), 0);
    }
    assert_int_equal(tessera_dataset_seal(c, "mid"), 0);
    tessera_client_close(c);

    assert_int_not_equal(tier_mid_with(kill_cli), 0);
    mid_victim = CL.n - 1;
    assert_int_not_equal(tier_mid_with(kill_node), 0);
    c = admin();
    assert_int_equal(tessera_dataset_stat(c, "mid", &d), 0);
    assert_int_equal(d.policy.ec_k, 0); /* not marked: not every shard was durable */
    mid_reads(c);
    assert_int_equal(c->cl->ec_reads, 0);
    tessera_client_close(c);

    assert_int_equal(tsd_start(&CL.node[mid_victim], NULL), 0);
    assert_int_equal(cli("dataset tier mid ec:4+2"), 0);
    c = admin();
    mid_reads(c);
    assert_int_equal(c->cl->ec_reads, 40);
    assert_int_equal(c->cl->ec_fallbacks, 0);
    tessera_client_close(c);
    assert_int_equal(cli("--json dataset repair mid"), 0);
    assert_int_equal(json_num("fragments_put"), 0);
    assert_int_equal(json_num("chunks_repaired"), 0);
}

static int setup(void **state)
{
    (void)state;
    /* One node more than a shard's fragments: the repair test marks one out. */
    static const char *const extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
    return tsd_cluster_start(&CL, K + M + 1, NULL, 8, extra);
}

static int teardown(void **state)
{
    (void)state;
    return tsd_cluster_stop(&CL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_every_shard_as_fragments),
        cmocka_unit_test(test_nodes_rules),
        cmocka_unit_test(test_healthy_reads_are_direct),
        cmocka_unit_test(test_flipped_byte_is_caught_and_rebuilt),
        cmocka_unit_test(test_m_nodes_down_then_m_plus_one),
        cmocka_unit_test(test_tier_cli),
        cmocka_unit_test(test_tier_killed_midway),
        cmocka_unit_test(test_fragments_go_with_their_dataset),
        cmocka_unit_test(test_repair),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
