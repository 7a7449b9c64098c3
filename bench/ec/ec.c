/*
 * bench/ec: erasure-coded reads beside replicated reads of the same data on one cluster, in one
 * run (issue 33; docs/benchmarks.md "Erasure-coded shards"). Six real nodes on loopback (core 0),
 * this process on core 1. A dataset of SHARDS shards of SLEN bytes, put with core 3 and then as
 * 4+2 fragments (client/cluster_ec.c). Measured, rounds alternating the two systems:
 *   encode    ISA-L's encode of 4+2 and 8+3 over 64 MiB, one core (GB/s of data)
 *   shard     whole shards read: replicated (tessera_read) and EC (ts_cl_ec_read, healthy)
 *   record    100 KiB ranges at random offsets, the same ranges for both
 *   degraded  the EC reads again with M = 2 nodes killed (-9; the map still says up)
 *   convert   tessera_dataset_tier of a copy of the data, end to end (the replicas' bytes
 *             dropped at its end), and the disk its chunk files take before and after
 * Every byte read is compared with what was put. Prints medians and ratios, and the bytes the
 * fragments take against the data's.
 *
 *   bench_ec [ROUNDS (5)] [SHARDS (16)] [SLEN MiB (8)]
 */
#include "harness.h"

#include "client_internal.h"
#include "conn.h"
#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_ec.h"
#include "ts_map.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define K 4
#define M 2
#define RECORD (100u << 10)
#define NREC 256
#define MAXR 32

static struct tsd_cluster CL;
static unsigned shards = 16;
static size_t slen = 8u << 20;
static const char *sync_args[] = {"--sync", NULL, NULL}; /* bench/ec/run --sync */

static void pin(int cpu)
{
    cpu_set_t s;

    CPU_ZERO(&s);
    CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
    sched_setaffinity(0, sizeof(s), &s);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = ((uint64_t)seed << 32) + i;
        v = (v ^ (v >> 31)) * 0x9e3779b97f4a7c15ull;
        v ^= v >> 29;
        memcpy(p + i, &v, TS_MIN((size_t)8, n - i));
    }
}

static void die(const char *what, int rc, tessera_client *c)
{
    fprintf(stderr, "bench_ec: %s: %s: %s\n", what, ts_errname(rc),
            c ? tessera_client_error(c) : "");
    tsd_cluster_dump_logs(&CL);
    exit(1);
}

static double now_s(void)
{
    return (double)ts_now_mono_ns() / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double encode_gbs(unsigned k, unsigned m)
{
    size_t cell = 1u << 20, stripes = (64u << 20) / (k * cell);
    uint8_t *d[TS_EC_MAX_K], *p[TS_EC_MAX_M];
    ts_ec *ec = NULL;
    double t0, best = 0;

    if (ts_ec_create(&ec, k, m))
        die("ts_ec_create", TS_EINVAL, NULL);
    for (unsigned i = 0; i < k; i++)
        fill(d[i] = malloc(cell), cell, i);
    for (unsigned j = 0; j < m; j++)
        p[j] = malloc(cell);
    for (int r = 0; r < 5; r++) {
        t0 = now_s();
        for (size_t s = 0; s < stripes; s++)
            ts_ec_encode(ec, cell, d, p);
        best = TS_MAX(best, (double)(stripes * k * cell) / (now_s() - t0) / 1e9);
    }
    for (unsigned i = 0; i < k; i++)
        free(d[i]);
    for (unsigned j = 0; j < m; j++)
        free(p[j]);
    ts_ec_destroy(ec);
    return best;
}

/* One pass of a read kind; returns MB/s. ec: through the EC path; rec: 100 KiB ranges. */
static double pass(tessera_client *c, int ec, int rec, uint8_t *buf, uint8_t **want,
                   const uint64_t *roff, const uint32_t *rsh)
{
    double t0 = now_s();
    size_t bytes = 0, n = rec ? NREC : shards;

    for (size_t i = 0; i < n; i++) {
        uint32_t s = rec ? rsh[i] : (uint32_t)i;
        uint64_t off = rec ? roff[i] : 0;
        size_t len = rec ? RECORD : slen, got = len;
        int rc = ec ? ts_cl_ec_read(c, c->cl, "ec", s, slen, K, M, off, len, buf, NULL)
                    : tessera_read(c, "ec", s, off, len, buf, &got);
        if (rc)
            die(ec ? "ec read" : "read", rc, c);
        if (got != len || memcmp(buf, want[s] + off, len) != 0)
            die("the bytes read differ from those put", TS_ECORRUPT, NULL);
        bytes += len;
    }
    return (double)bytes / (now_s() - t0) / 1e6;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    struct ts_dataset_policy pol = {3, 0, 2, 1u << 20, 0, 0, 0, 0};
    double v[4][MAXR], g[2][MAXR], e42, e83, fbytes = 0, convert_mbs = 0, du0, du_rep, du_ec;
    uint8_t **want, *buf;
    uint64_t roff[NREC];
    uint32_t rsh[NREC];
    tessera_client *c = NULL;
    int rc;

    if (argc > 2)
        shards = (unsigned)atoi(argv[2]);
    if (argc > 3)
        slen = (size_t)atoi(argv[3]) << 20;
    if (rounds < 1 || rounds > MAXR || shards < 1 || slen < RECORD) {
        fprintf(stderr, "usage: bench_ec [ROUNDS 1..%d] [SHARDS] [SLEN MiB]\n", MAXR);
        return 2;
    }
    pin(1);
    e42 = encode_gbs(4, 2);
    e83 = encode_gbs(8, 3);
    pin(0);                           /* the nodes inherit core 0 */
    if (getenv("TESSERA_BENCH_SYNC")) /* bench/ec/run --sync MODE: after the harness's none */
        sync_args[1] = getenv("TESSERA_BENCH_SYNC");
    if (tsd_cluster_start(&CL, K + M, NULL, 16, sync_args[1] ? sync_args : NULL) != 0)
        die("starting 6 nodes", TS_EIO, NULL);
    pin(1);
    if ((rc = test_tls_open(&c, CL.tls_listen[0], "admin", NULL, NULL)) != 0)
        die("connecting", rc, NULL);
    if ((rc = tessera_dataset_create(c, "ec", &pol)) != 0)
        die("dataset create", rc, c);
    want = calloc(shards, sizeof(*want));
    buf = malloc(slen);
    for (unsigned s = 0; s < shards; s++) {
        fill(want[s] = malloc(slen), slen, s);
        if ((rc = tessera_put(c, "ec", s, want[s], slen, NULL, 0)) != 0)
            die("put", rc, c);
    }
    if ((rc = tessera_dataset_seal(c, "ec")) != 0)
        die("seal", rc, c);
    {
        struct ts_ec_layout l;
        double t0 = now_s();
        for (unsigned s = 0; s < shards; s++)
            if ((rc = ts_cl_ec_put(c, c->cl, "ec", s, want[s], slen, K, M)) != 0)
                die("ec put", rc, c);
        fprintf(stderr, "ec put of %u x %zu MiB: %.2f s (encode and 6 durable puts each)\n", shards,
                slen >> 20, now_s() - t0);
        ts_ec_layout_for(&l, K, M, slen);
        for (unsigned f = 0; f < K + M; f++)
            fbytes += (double)ts_ec_frag_len(&l, f) * shards;
    }
    {
        /* The conversion as a user runs it, on a copy of the data ("ec" stays unmarked, so
         * tessera_read of it reads the replicas): each shard read and CRC-checked, encoded, its
         * six fragments put durably, read back through them and CRC-checked; then the replicas'
         * bytes dropped on every node. The disks' chunk files measured before and after. */
        double t0;
        du0 = (double)tsd_cluster_chunk_bytes(&CL);
        if ((rc = tessera_dataset_create(c, "conv", &pol)) != 0)
            die("dataset create", rc, c);
        for (unsigned s = 0; s < shards; s++)
            if ((rc = tessera_put(c, "conv", s, want[s], slen, NULL, 0)) != 0)
                die("put", rc, c);
        if ((rc = tessera_dataset_seal(c, "conv")) != 0)
            die("seal", rc, c);
        du_rep = (double)tsd_cluster_chunk_bytes(&CL) - du0;
        t0 = now_s();
        if ((rc = tessera_dataset_tier(c, "conv", K, M, NULL, NULL)) != 0)
            die("tier", rc, c);
        convert_mbs = (double)shards * (double)slen / (now_s() - t0) / 1e6;
        du_ec = (double)tsd_cluster_chunk_bytes(&CL) - du0;
        if ((rc = tessera_dataset_delete(c, "conv")) != 0)
            die("delete", rc, c);
    }
    srand(7);
    for (int i = 0; i < NREC; i++) {
        rsh[i] = (uint32_t)rand() % shards;
        roff[i] = (uint64_t)rand() % (slen - RECORD);
    }
    /* One unmeasured pass of each, so both are in the nodes' caches alike. */
    pass(c, 0, 0, buf, want, roff, rsh);
    pass(c, 1, 0, buf, want, roff, rsh);
    for (int r = 0; r < rounds; r++) {
        int first = r % 2;
        for (int k = 0; k < 2; k++) {
            int ec = k ^ first;
            v[ec][r] = pass(c, ec, 0, buf, want, roff, rsh);
            v[2 + ec][r] = pass(c, ec, 1, buf, want, roff, rsh);
        }
    }
    /* M nodes killed (never node 0, the handle's): EC reads rebuild what they held. */
    for (int i = 1; i <= M; i++)
        tsd_kill9(&CL.node[K + M - i]);
    for (int r = 0; r < rounds; r++) {
        g[0][r] = pass(c, 1, 0, buf, want, roff, rsh);
        g[1][r] = pass(c, 1, 1, buf, want, roff, rsh);
    }
    {
        double rs = median(v[0], rounds), es = median(v[1], rounds);
        double rr = median(v[2], rounds), er = median(v[3], rounds);
        double ds = median(g[0], rounds), dr = median(g[1], rounds);
        double data = (double)shards * (double)slen;
        printf("bench_ec: 6 nodes on core 0, the client on core 1; %u shards of %zu MiB, "
               "4+2; medians of %d rounds (MB/s)\n",
               shards, slen >> 20, rounds);
        printf("| measure | replicated (core 3) | ec 4+2 | ec / replicated | target |\n");
        printf("|---|---:|---:|---:|---|\n");
        printf("| encode, one core (GB/s of data) | | 4+2: %.2f, 8+3: %.2f | | >= 1 GB/s |\n", e42,
               e83);
        printf("| whole shards, healthy | %.0f | %.0f | %.2fx | >= 0.8x |\n", rs, es, es / rs);
        printf("| 100 KiB ranges, healthy | %.0f | %.0f | %.2fx | >= 0.8x |\n", rr, er, er / rr);
        printf("| whole shards, 2 nodes down | (%.0f healthy) | %.0f | %.2fx | >= 0.5x |\n", rs, ds,
               ds / rs);
        printf("| 100 KiB ranges, 2 nodes down | (%.0f healthy) | %.0f | %.2fx | >= 0.5x |\n", rr,
               dr, dr / rr);
        printf("| fragments' bytes / data | 3.00 | %.4f | | within 2%% of %.4f |\n", fbytes / data,
               (double)(K + M) / K);
        printf("| disk used / data, measured (chunk files, before and after tier) | %.4f | %.4f "
               "| %.3fx | within 2%% of %.4f |\n",
               du_rep / data, du_ec / data, du_ec / du_rep, (double)(K + M) / K);
        printf("| conversion (tessera_dataset_tier: read, check, encode, 6 durable puts, read "
               "back), MB/s of data | | %.0f | | encode >= 1 GB/s |\n",
               convert_mbs);
    }
    tessera_client_close(c);
    for (int i = 1; i <= M; i++)
        tsd_start(&CL.node[K + M - i], NULL);
    tsd_cluster_stop(&CL);
    return 0;
}
