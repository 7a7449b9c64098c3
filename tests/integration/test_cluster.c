/*
 * A real 5-node cluster on loopback (three failure domains; every PG: 3 core + 2 fringe
 * replicas): replication to every replica, corruption repaired from a replica, fringe lag
 * under load and catch-up after a kill, fencing of a node left with an old map, kill -9 of a
 * primary mid-stream with failover, and min_core refusing writes it cannot place.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_map.h"
#include "ts_proto.h"

#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define SLEN (3 * CHUNK + 123)
#define PGS 16

static struct tsd_cluster CL;
static const char *const domains[] = {"rack-a", "rack-a", "rack-b", "rack-b", "rack-c"};

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(((i + seed * 7919) * 2654435761u) >> 11);
}

static const struct tsd_proc *any_node(void)
{
    for (int i = 0; i < CL.n; i++)
        if (tsd_alive(&CL.node[i]))
            return &CL.node[i];
    return NULL;
}

static const char *any_addr(void)
{
    for (int i = 0; i < CL.n; i++)
        if (tsd_alive(&CL.node[i]))
            return CL.node[i].addr;
    return NULL;
}

static tessera_client *cluster_client(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tsd_client_opts(&o, any_node(), "admin");
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_true(tessera_client_epoch(c) > 0);
    return c;
}

static void mkds(tessera_client *c, const char *name, uint8_t core, uint8_t fringe,
                 uint8_t min_core)
{
    struct ts_dataset_policy p = {core, fringe, min_core, CHUNK, 0, 0, 0, 0};
    assert_int_equal(tessera_dataset_create(c, name, &p), 0);
}

static int put_shard(tessera_client *c, const char *ds, uint32_t shard, uint64_t seed)
{
    uint8_t *buf = malloc(SLEN);
    int rc;
    fill(buf, SLEN, seed);
    rc = tessera_put(c, ds, shard, buf, SLEN, NULL, 0);
    free(buf);
    return rc;
}

/* The node's current map (MAP_GET over a raw connection). */
static struct ts_map *node_map(const char *addr)
{
    return raw_map_get(addr);
}

/* Reads [0, SLEN) of a shard from one node directly, verifying piece CRCs and bytes. */
static int raw_read_verify(const char *addr, const char *ds, uint32_t shard, uint64_t seed)
{
    uint8_t *got = malloc(SLEN), *want = malloc(SLEN);
    size_t n = 0;
    int rc = raw_read_shard(addr, ds, shard, SLEN, got, &n);

    fill(want, SLEN, seed);
    if (!rc && (n != SLEN || memcmp(got, want, SLEN) != 0))
        rc = TS_ECORRUPT;
    free(got);
    free(want);
    return rc;
}

/* The replica set of a shard in the map (node indexes into CL), count returned. */
static int replicas_of(const struct ts_map *m, const char *ds, uint32_t shard, int *out, int max)
{
    int order[8];
    size_t n = ts_map_pg_order(m, ts_map_pg_of(m, ds, shard), order, 8);
    int k = 0;

    for (size_t i = 0; i < n && k < max; i++)
        out[k++] = tsd_cluster_find(&CL, m->nodes[order[i]].id);
    return k;
}

/* Waits (bounded) until node i serves the shard verified. */
static int wait_on_node(int i, const char *ds, uint32_t shard, uint64_t seed, int ms)
{
    int rc = -1;
    for (int t = 0; t < ms / 50; t++) {
        rc = raw_read_verify(CL.node[i].addr, ds, shard, seed);
        if (rc == 0)
            return 0;
        msleep(50);
    }
    return rc;
}

static json_object *node_status(int i)
{
    int fd = raw_connect(CL.node[i].addr);
    uint8_t *p = NULL;
    size_t plen = 0;
    json_object *j = NULL;
    char *txt;
    struct ts_rd r;

    if (fd < 0)
        return NULL;
    if (raw_send_frame(fd, TS_OP_STATUS, 0, 1, NULL, 0) == 0 &&
        raw_recv_reply(fd, 5000, NULL, NULL, 0, &p, &plen) == 0) {
        txt = malloc(plen);
        ts_rd_init(&r, p + 4, plen - 4);
        ts_rd_str(&r, txt, plen);
        j = json_tokener_parse(txt);
        free(txt);
    }
    free(p);
    close(fd);
    return j;
}

/* Sum of lag_ops over every primary's replicas (and the largest lag_s); -1 if none answer. */
static long total_lag(double *max_s, const char *only_node)
{
    long ops = -1;
    if (max_s)
        *max_s = 0;
    for (int i = 0; i < CL.n; i++) {
        json_object *j, *rep, *per;
        if (!tsd_alive(&CL.node[i]) || !(j = node_status(i)))
            continue;
        if (ops < 0)
            ops = 0;
        if (json_object_object_get_ex(j, "replication", &rep) &&
            json_object_object_get_ex(rep, "replicas", &per)) {
            json_object_object_foreach(per, node, o)
            {
                json_object *x;
                if (only_node && strcmp(node, only_node))
                    continue;
                if (json_object_object_get_ex(o, "lag_ops", &x))
                    ops += (long)json_object_get_int64(x);
                /* A replica not yet confirmed to hold a PG's log counts as behind. */
                if (json_object_object_get_ex(o, "recovering_pgs", &x))
                    ops += (long)json_object_get_int64(x);
                if (max_s && json_object_object_get_ex(o, "max_lag_s", &x) &&
                    json_object_get_double(x) > *max_s)
                    *max_s = json_object_get_double(x);
            }
        }
        json_object_put(j);
    }
    return ops;
}

static int group_setup(void **state)
{
    /* A short PG log, so that a node down for a while is backfilled rather than replayed. */
    const char *const extra[] = {"--pg-log-keep", "4", NULL};

    if (tsd_cluster_start(&CL, 5, domains, PGS, extra) != 0) {
        tsd_cluster_dump_logs(&CL);
        return -1;
    }
    return 0;
}

/* The same, with a peer timeout far longer than any stall a test makes. */
static int group_setup_patient(void **state)
{
    const char *const extra[] = {"--pg-log-keep", "4", "--peer-timeout-ms", "30000", NULL};

    memset(&CL, 0, sizeof(CL));
    if (tsd_cluster_start(&CL, 5, domains, PGS, extra) != 0) {
        tsd_cluster_dump_logs(&CL);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    return tsd_cluster_stop(&CL);
}

static void test_replicas_everywhere(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    uint8_t *back = malloc(SLEN), *want = malloc(SLEN);

    assert_non_null(m);
    mkds(c, "rep", 3, 2, 2);
    for (uint32_t s = 0; s < 8; s++)
        assert_int_equal(put_shard(c, "rep", s, s), 0);
    for (uint32_t s = 0; s < 8; s++) {
        int rep[5], n = replicas_of(m, "rep", s, rep, 5);
        size_t got;
        assert_int_equal(n, 5);
        /* Through the client (any replica), then from every replica directly: the core
         * ones at once (acknowledged), the fringe ones once they have caught up. */
        assert_int_equal(tessera_read(c, "rep", s, 0, SLEN, back, &got), 0);
        fill(want, SLEN, s);
        assert_int_equal(got, SLEN);
        assert_memory_equal(back, want, SLEN);
        for (int k = 0; k < 3; k++)
            assert_int_equal(raw_read_verify(CL.node[rep[k]].addr, "rep", s, s), 0);
        for (int k = 3; k < 5; k++)
            assert_int_equal(wait_on_node(rep[k], "rep", s, s, 10000), 0);
    }
    free(back);
    free(want);
    ts_map_free(m);
    tessera_client_close(c);
}

static void test_corrupt_chunk_repaired(void **state)
{
    struct ts_map *m = node_map(any_addr());
    tessera_client *c;
    int rep[5], victim;
    char cmd[1024];
    uint8_t *buf = malloc(SLEN), *want = malloc(SLEN);

    replicas_of(m, "rep", 0, rep, 5);
    victim = rep[1]; /* a core replica, not the primary */
    assert_int_equal(tsd_stop(&CL.node[victim]), 0);
    snprintf(cmd, sizeof(cmd), "%s %s rep 0 1 >/dev/null", CORRUPT_CHUNK_PATH,
             CL.node[victim].data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&CL.node[victim], NULL), 0);
    /* Clients still get correct data, whichever replica they hit. */
    c = cluster_client();
    fill(want, SLEN, 0);
    for (int i = 0; i < 20; i++) {
        size_t got;
        assert_int_equal(tessera_read(c, "rep", 0, 0, SLEN, buf, &got), 0);
        assert_memory_equal(buf, want, SLEN);
    }
    /* The bad replica repairs itself from a good one; then every replica scrubs clean. */
    assert_int_equal(wait_on_node(victim, "rep", 0, 0, 10000), 0);
    for (int i = 0; i < CL.n; i++) {
        tessera_client *one;
        struct tessera_opts o;
        struct ts_scrub_report rr;
        int clean = 0;
        tsd_client_opts(&o, &CL.node[i], "writer");
        assert_int_equal(tessera_client_open(&one, &o), 0);
        for (int t = 0; t < 50 && !clean; t++) {
            /* A scrub finding damage triggers its repair; the next one is clean. */
            int fd = raw_connect_as(CL.node[i].tls_addr, "writer"); /* SCRUB: a writer's */
            struct ts_wr w;
            uint8_t *p = NULL;
            size_t plen;
            ts_wr_init(&w);
            ts_wr_str(&w, "rep");
            raw_send_frame(fd, TS_OP_SCRUB, 0, 1, w.buf, w.len);
            ts_wr_fini(&w);
            if (raw_recv_reply(fd, 10000, NULL, NULL, 0, &p, &plen) == 0)
                clean = ts_get_le64(p + 4 + 24) == 0;
            free(p);
            raw_close(fd);
            if (!clean)
                msleep(100);
        }
        (void)rr;
        tessera_client_close(one);
        assert_true(clean);
    }
    free(buf);
    free(want);
    ts_map_free(m);
    tessera_client_close(c);
}

/* Scrub through node i (its handle scrubs every node): the summed report. */
static int scrub_all(int i, struct ts_scrub_report *rep)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    int rc;

    tsd_client_opts(&o, &CL.node[i], "writer");
    o.timeout_ms = 30000;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    rc = tessera_scrub(c, NULL, rep, NULL, NULL);
    tessera_client_close(c);
    return rc;
}

/*
 * A replica whose store lost a shard behind its log's back (its record dropped while it was
 * down; the PG log still has the shard, so log comparison finds nothing): scrub compares the
 * replica's PG inventories with the primaries', counts the missing shard, and the backfill it
 * asks for brings it back; the next scrub finds every PG in agreement.
 */
static void test_missing_shard_found_by_scrub(void **state)
{
    struct ts_map *m = node_map(any_addr());
    struct ts_scrub_report rep;
    int reps[5], victim, found = 0;
    char cmd[1024];

    replicas_of(m, "rep", 2, reps, 5);
    victim = reps[2]; /* the third core replica */
    assert_int_equal(tsd_stop(&CL.node[victim]), 0);
    snprintf(cmd, sizeof(cmd), "%s %s rep 2 drop >/dev/null", CORRUPT_CHUNK_PATH,
             CL.node[victim].data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(tsd_start(&CL.node[victim], NULL), 0);
    /* Scrub until the victim's PG can be compared (its primary has confirmed it again). */
    for (int t = 0; t < 100 && !found; t++) {
        memset(&rep, 0, sizeof(rep));
        scrub_all(victim, &rep);
        if (rep.pgs_differing) {
            fprintf(stderr,
                    "  scrub: %u PGs compared, %u short (%llu shards missing), %u not "
                    "comparable\n",
                    rep.pgs_compared, rep.pgs_differing, (unsigned long long)rep.missing,
                    rep.pgs_unchecked);
            found = 1;
        } else {
            msleep(100);
        }
    }
    assert_true(found);
    assert_true(rep.missing >= 1);
    /* The backfill brings the shard back to the victim, verified... */
    assert_int_equal(wait_on_node(victim, "rep", 2, 2, 15000), 0);
    /* ...and every PG agrees with its primary again. */
    found = 0;
    for (int t = 0; t < 100 && !found; t++) {
        memset(&rep, 0, sizeof(rep));
        if (scrub_all(victim, &rep) == 0 && rep.pgs_compared > 0 && rep.pgs_differing == 0 &&
            rep.pgs_unchecked == 0)
            found = 1;
        else
            msleep(100);
    }
    fprintf(stderr, "  after the backfill: %u PGs compared, %u short, %u not comparable\n",
            rep.pgs_compared, rep.pgs_differing, rep.pgs_unchecked);
    assert_true(found);
    ts_map_free(m);
}

/* Child: writes shards of "lag" until `until` (monotonic ns). */
static void lag_writer(const struct tsd_proc *seed, uint64_t until, uint32_t first)
{
    struct tessera_opts o;
    tessera_client *c;

    tsd_client_opts(&o, seed, "writer"); /* seed found by the parent: a child cannot waitpid() */
    if (tessera_client_open(&c, &o))
        _exit(2);
    for (uint32_t s = first; ts_now_mono_ns() < until; s++)
        if (put_shard(c, "lag", s, s))
            _exit(3);
    tessera_client_close(c);
    _exit(0);
}

static void test_fringe_lag_and_catch_up(void **state)
{
    tessera_client *c = cluster_client();
    double max_s = 0, s_now;
    long max_ops = 0, ops;
    pid_t child;
    int st, fringe_idx;
    struct ts_map *m;
    int rep[5];

    mkds(c, "lag", 3, 2, 2);
    {
        const struct tsd_proc *seed = any_node();
        child = fork();
        if (child == 0)
            lag_writer(seed, ts_now_mono_ns() + 3000000000ull, 0);
    }
    while (waitpid(child, &st, WNOHANG) == 0) {
        ops = total_lag(&s_now, NULL);
        if (ops > max_ops)
            max_ops = ops;
        if (s_now > max_s)
            max_s = s_now;
        msleep(100);
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    fprintf(stderr, "  under load: max lag %ld ops, %.2f s\n", max_ops, max_s);
    assert_true(max_s < 5.0);
    assert_true(max_ops < 500);
    /* The load stopped: the lag drains to zero. */
    for (int t = 0; t < 100 && (ops = total_lag(NULL, NULL)) != 0; t++)
        msleep(100);
    assert_int_equal(ops, 0);

    /* Kill a node; write; it shows as lagging; restart it; it catches up. */
    m = node_map(any_addr());
    replicas_of(m, "lag", 1000, rep, 5);
    fringe_idx = rep[4];
    tsd_kill9(&CL.node[fringe_idx]);
    for (uint32_t s = 1000; s < 1010; s++)
        assert_int_equal(put_shard(c, "lag", s, s), 0);
    msleep(400);
    ops = total_lag(NULL, CL.id[fringe_idx]);
    fprintf(stderr, "  %s down: lag %ld ops\n", CL.id[fringe_idx], ops);
    assert_true(ops > 0);
    assert_int_equal(tsd_start(&CL.node[fringe_idx], NULL), 0);
    for (int t = 0; t < 150 && (ops = total_lag(NULL, NULL)) != 0; t++)
        msleep(100);
    assert_int_equal(ops, 0);
    assert_int_equal(wait_on_node(fringe_idx, "lag", 1000, 1000, 5000), 0);
    ts_map_free(m);
    tessera_client_close(c);
}

/* The record format a node's STATUS gives for dataset ds ("" when it does not hold it). */
static const char *node_record_format(int i, const char *ds, char *out, size_t cap)
{
    json_object *j = node_status(i), *arr, *x;

    snprintf(out, cap, "%s", "");
    if (j && json_object_object_get_ex(j, "datasets", &arr))
        for (size_t k = 0; k < json_object_array_length(arr); k++) {
            json_object *d = json_object_array_get_idx(arr, k);
            if (json_object_object_get_ex(d, "name", &x) &&
                !strcmp(json_object_get_string(x), ds) &&
                json_object_object_get_ex(d, "record_format", &x))
                snprintf(out, cap, "%s", json_object_get_string(x));
        }
    json_object_put(j);
    return out;
}

/* A dataset's record format (issue 28: readers hand out payloads by it) reaches a replica that
 * was down when the dataset was created: the replication stream's dataset fields carry it. */
static void test_record_format_reaches_a_late_replica(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_dataset_policy p = {3, 2, 2, CHUNK, 1 /* TESSERA_FMT_TFRECORD */, 0, 0, 0};
    int v = CL.n - 1;
    char f[32];

    (void)state;
    tsd_kill9(&CL.node[v]);
    /* v is still up in the map: the create is refused by it alone (the others made it). */
    assert_int_equal(tessera_dataset_create(c, "fmt", &p), TS_ECONNREFUSED);
    assert_string_equal(node_record_format(v == 0 ? 1 : 0, "fmt", f, sizeof(f)), "tfrecord");
    assert_int_equal(put_shard(c, "fmt", 0, 77), 0);
    assert_int_equal(tsd_start(&CL.node[v], NULL), 0);
    assert_int_equal(wait_on_node(v, "fmt", 0, 77, 10000), 0);
    assert_string_equal(node_record_format(v, "fmt", f, sizeof(f)), "tfrecord");
    tessera_client_close(c);
}

static void test_min_core_refuses(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    int rep[5];

    /* min_core 3 of core 3: one core replica down and the write cannot be acknowledged. */
    mkds(c, "strict", 3, 0, 3);
    assert_int_equal(put_shard(c, "strict", 0, 1), 0);
    replicas_of(m, "strict", 1, rep, 5);
    assert_int_equal(tsd_stop(&CL.node[rep[2]]), 0);
    assert_int_equal(put_shard(c, "strict", 1, 2), TS_EUNAVAIL);
    assert_non_null(strstr(tessera_client_error(c), "min_core"));
    /* Nothing was acknowledged, so nothing is visible. */
    uint8_t b[8];
    size_t got;
    assert_int_not_equal(tessera_read(c, "strict", 1, 0, 8, b, &got), 0);
    assert_int_equal(tsd_start(&CL.node[rep[2]], NULL), 0);
    ts_map_free(m);
    tessera_client_close(c);
}

/* A SHARD_WRITE of chunk 0 carrying `epoch`, straight to node i. */
static int raw_write_epoch(int i, const char *ds, uint32_t shard, uint64_t epoch, char *msg,
                           size_t cap)
{
    int fd = raw_connect_as(CL.node[i].tls_addr, "writer"), rc;
    uint8_t data[100] = {1}, h[TS_HDR_LEN];
    struct ts_wr w;

    ts_wr_init(&w);
    ts_wr_str(&w, ds);
    ts_wr_u32(&w, shard);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, sizeof(data));
    ts_wr_u32(&w, ts_crc32c(0, data, sizeof(data)));
    ts_wr_u32(&w, sizeof(data));
    ts_wr_bytes(&w, data, sizeof(data));
    {
        struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_SHARD_WRITE, 0, 7, epoch,
                                  (uint32_t)w.len};
        ts_frame_encode(h, &fh);
    }
    rc = raw_send_all(fd, h, sizeof(h));
    if (!rc)
        rc = raw_send_all(fd, w.buf, w.len);
    if (!rc)
        rc = raw_recv_reply(fd, 10000, NULL, msg, cap, NULL, NULL);
    ts_wr_fini(&w);
    raw_close(fd);
    return rc;
}

static void test_stale_epoch_fenced(void **state)
{
    struct ts_map *old = node_map(any_addr()), *next, *now;
    int n5 = tsd_cluster_find(&CL, "n5"), rc;
    uint32_t shard;
    char msg[512];

    /* A new epoch reaches every node but n5, which is up and keeps the old map. */
    next = ts_map_dup(old);
    next->epoch = old->epoch + 1;
    for (int i = 0; i < CL.n; i++)
        if (i != n5)
            assert_int_equal(raw_map_push(CL.node[i].tls_addr, next), 0);
    now = node_map(CL.node[n5].addr);
    fprintf(stderr, "  n5 at epoch %llu, the others at %llu\n", (unsigned long long)now->epoch,
            (unsigned long long)next->epoch);
    ts_map_free(now);

    /* A writer with the old map sends a write to n5, primary of the shard in that map: n5's
     * core replicas refuse the stale epoch, so n5 refuses the write. */
    for (shard = 10000; shard < 100000; shard++) { /* unused shard numbers */
        int rep[1];
        replicas_of(old, "rep", shard, rep, 1);
        if (rep[0] == n5)
            break;
    }
    rc = raw_write_epoch(n5, "rep", shard, old->epoch, msg, sizeof(msg));
    fprintf(stderr, "  stale write to n5: %s: %s\n", ts_errname(rc), msg);
    assert_int_equal(rc, TS_ESTALE);
    /* n5 learns the new map from its peers (they push it when they see its older epoch; a
     * node never takes a map from a reply); the old epoch stays refused everywhere. */
    for (int t = 0;; t++) {
        now = node_map(CL.node[n5].addr);
        assert_non_null(now);
        if (now->epoch == next->epoch || t == 100)
            break;
        ts_map_free(now);
        msleep(50);
    }
    assert_true(now->epoch == next->epoch);
    ts_map_free(now);
    for (int i = 0; i < CL.n; i++) {
        int rep[1];
        uint32_t sh;
        for (sh = 20000; sh < 100000; sh++) {
            replicas_of(next, "rep", sh, rep, 1);
            if (rep[0] == i)
                break;
        }
        assert_int_equal(raw_write_epoch(i, "rep", sh, old->epoch, msg, sizeof(msg)), TS_ESTALE);
    }
    /* Up-to-date clients write as before. */
    {
        tessera_client *c = cluster_client();
        assert_int_equal(put_shard(c, "rep", 5000, 5000), 0);
        tessera_client_close(c);
    }
    ts_map_free(next);
    ts_map_free(old);
}

/* Child: uploads shards of "fo" in order, reporting each acknowledged one on fd. */
static void fo_writer(const struct tsd_proc *seed, int fd, uint32_t count)
{
    struct tessera_opts o;
    tessera_client *c;

    tsd_client_opts(&o, seed, "writer");
    o.timeout_ms = 5000;
    if (tessera_client_open(&c, &o))
        _exit(2);
    for (uint32_t s = 0; s < count; s++) {
        int rc = put_shard(c, "fo", s, s + 500);
        if (rc == 0 && write(fd, &s, sizeof(s)) != sizeof(s))
            _exit(3);
        if (rc)
            msleep(50);
    }
    _exit(0);
}

/*
 * Each of shards[0..n) of ds (bytes fill(shard + seed_add)) read from each of its core
 * replicas under the nodes' map at `epoch` or later alone, verified byte for byte: a write
 * left on one replica reads back through the client (which tries another replica) but not
 * here. A replica catching up gets 15 s for the first shard it lacks, then one try per shard.
 * Prints each node's figures; returns how many (shard, replica) reads failed.
 */
static int core_replicas_verify(const char *ds, const uint32_t *shards, uint32_t n,
                                uint64_t seed_add, uint64_t epoch)
{
    int checked[TSD_CLUSTER_MAX] = {0}, missing[TSD_CLUSTER_MAX] = {0}, ms = 15000, bad = 0;
    struct ts_map *m = NULL;

    for (int t = 0; t < 200 && (!m || m->epoch < epoch); t++) {
        ts_map_free(m);
        m = node_map(any_addr());
        if (!m || m->epoch < epoch)
            msleep(50);
    }
    assert_non_null(m);
    assert_true(m->epoch >= epoch);
    for (uint32_t k = 0; k < n; k++) {
        int reps[3], nrep = replicas_of(m, ds, shards[k], reps, 3);
        assert_int_equal(nrep, 3);
        for (int r = 0; r < nrep; r++) {
            int rc = wait_on_node(reps[r], ds, shards[k], shards[k] + seed_add, ms);
            checked[reps[r]]++;
            if (rc) {
                missing[reps[r]]++;
                ms = 50;
                fprintf(stderr, "  %s/%u: core replica %s alone: %s\n", ds, shards[k],
                        CL.id[reps[r]], ts_errname(rc));
            }
        }
    }
    for (int i = 0; i < CL.n; i++) {
        if (checked[i])
            fprintf(stderr, "  core replica %s alone: %d shards read, %d missing or other bytes\n",
                    CL.id[i], checked[i], missing[i]);
        else
            fprintf(stderr, "  %s: a core replica of none of them (under epoch %llu)\n", CL.id[i],
                    (unsigned long long)m->epoch);
        bad += missing[i];
    }
    ts_map_free(m);
    return bad;
}

static void test_primary_killed_failover(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    int pfd[2], n1 = tsd_cluster_find(&CL, "n1"), st;
    uint32_t s, acked[400], nacked = 0, pg_n1 = UINT32_MAX;
    uint64_t epoch = 0;
    pid_t child;
    uint8_t *buf = malloc(SLEN), *want = malloc(SLEN);

    mkds(c, "fo", 3, 2, 2);
    tessera_client_close(c);
    for (uint32_t pg = 0; pg < m->pg_count && pg_n1 == UINT32_MAX; pg++) {
        int order[1];
        if (ts_map_pg_order(m, pg, order, 1) == 1 && !strcmp(m->nodes[order[0]].id, "n1"))
            pg_n1 = pg;
    }
    assert_true(pg_n1 != UINT32_MAX);
    assert_int_equal(pipe(pfd), 0);
    {
        /* Seed the writer with a node that survives (n1 is killed below). */
        const struct tsd_proc *seed = &CL.node[tsd_cluster_find(&CL, "n2")];
        child = fork();
        if (child == 0) {
            close(pfd[0]);
            fo_writer(seed, pfd[1], 120);
        }
    }
    close(pfd[1]);
    while (nacked < 30 && read(pfd[0], &s, sizeof(s)) == sizeof(s))
        acked[nacked++] = s;
    /* The primary of a PG dies in the middle of the write stream ... */
    tsd_kill9(&CL.node[n1]);
    /* ... and the operator promotes a core replica with a new map. */
    c = cluster_client();
    assert_int_equal(tessera_failover(c, pg_n1, &epoch), 0);
    tessera_client_close(c);
    while (nacked < 400 && read(pfd[0], &s, sizeof(s)) == sizeof(s))
        acked[nacked++] = s;
    close(pfd[0]);
    waitpid(child, &st, 0);
    fprintf(stderr, "  %u shards acknowledged, failover to epoch %llu\n", nacked,
            (unsigned long long)epoch);
    assert_true(nacked > 60); /* writing went on after the failover */
    /* Every acknowledged write is readable and verified... */
    c = cluster_client();
    for (uint32_t i = 0; i < nacked; i++) {
        size_t got;
        fill(want, SLEN, acked[i] + 500);
        assert_int_equal(tessera_read(c, "fo", acked[i], 0, SLEN, buf, &got), 0);
        assert_int_equal(got, SLEN);
        assert_memory_equal(buf, want, SLEN);
    }
    tessera_client_close(c);
    /* ...and held by each of its core replicas under the new map, read alone. */
    assert_int_equal(core_replicas_verify("fo", acked, nacked, 500, epoch), 0);
    free(buf);
    free(want);
    ts_map_free(m);
}

/* Backfills the nodes started, summed (STATUS). */
static long total_backfills(void)
{
    long backfills = 0;
    for (int i = 0; i < CL.n; i++) {
        json_object *j = node_status(i), *rep, *x;
        if (j && json_object_object_get_ex(j, "replication", &rep) &&
            json_object_object_get_ex(rep, "backfills", &x))
            backfills += (long)json_object_get_int64(x);
        json_object_put(j);
    }
    return backfills;
}

/* A node down while its PGs' logs move past what is kept is backfilled from the PG. */
static void test_backfill_after_log_trim(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    int victim = tsd_cluster_find(&CL, "n4");
    uint8_t *buf = malloc(SLEN), *want = malloc(SLEN);
    uint32_t shards[100], n = 0;
    long ops;

    /* Shards that n4 holds a copy of but does not lead (its own PGs would need a failover). */
    for (uint32_t s = 0; n < 100; s++) {
        int rep[5], k = replicas_of(m, "bf", s, rep, 5), mine = 0;
        for (int j = 1; j < k; j++)
            mine |= rep[j] == victim;
        if (mine && rep[0] != victim)
            shards[n++] = s;
    }
    mkds(c, "bf", 3, 2, 2);
    tsd_kill9(&CL.node[victim]);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(put_shard(c, "bf", shards[i], shards[i] + 7000), 0);
    msleep(1500); /* primaries trim their logs once a second (pg_log_keep 4) */
    assert_int_equal(tsd_start(&CL.node[victim], NULL), 0);
    /* Reads keep being served while n4 catches up. */
    for (uint32_t i = 0; i < n; i++) {
        size_t got;
        fill(want, SLEN, shards[i] + 7000);
        assert_int_equal(tessera_read(c, "bf", shards[i], 0, SLEN, buf, &got), 0);
        assert_memory_equal(buf, want, SLEN);
    }
    for (int t = 0; t < 200 && (ops = total_lag(NULL, NULL)) != 0; t++)
        msleep(100);
    assert_int_equal(ops, 0);
    /* The primaries had trimmed past n4's position: they backfilled it. */
    {
        long backfills = total_backfills();
        fprintf(stderr, "  %ld PG backfills\n", backfills);
        assert_true(backfills > 0);
    }
    /* n4 holds every one of them, byte for byte. */
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(raw_read_verify(CL.node[victim].addr, "bf", shards[i], shards[i] + 7000),
                         0);
    free(buf);
    free(want);
    ts_map_free(m);
    tessera_client_close(c);
}

/*
 * Log trim keeps what a replica still in touch has to apply: n4, a fringe replica of one PG,
 * stalls (SIGSTOP; its connections stay open, for less than peer_timeout_ms) while 11 shards of
 * that PG are written (pg_log_keep 4, the primary trims once a second). Resumed, it catches up from
 * the log: no backfill, every shard on n4 byte for byte.
 */
static void test_trim_keeps_replica_position(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    int victim = tsd_cluster_find(&CL, "n4");
    uint32_t shards[12], n = 0, pg = UINT32_MAX;
    long before, after, ops;
    uint64_t t0;

    for (uint32_t s = 0; n < 12 && s < 100000; s++) {
        int rep[5], k = replicas_of(m, "tk", s, rep, 5), mine = 0;
        uint32_t spg = ts_map_pg_of(m, "tk", s);
        for (int j = 3; j < k; j++) /* a fringe replica: writes do not wait for it */
            mine |= rep[j] == victim;
        if (!mine || (pg != UINT32_MAX && spg != pg))
            continue;
        pg = spg;
        shards[n++] = s;
    }
    assert_int_equal(n, 12);
    mkds(c, "tk", 3, 2, 2);
    assert_int_equal(put_shard(c, "tk", shards[0], shards[0] + 9000), 0);
    assert_int_equal(wait_on_node(victim, "tk", shards[0], shards[0] + 9000, 10000), 0);
    /* Quiet first: n4 holds everything before it stalls. */
    for (int t = 0; t < 100 && total_lag(NULL, NULL) != 0; t++)
        msleep(100);
    msleep(500);
    before = total_backfills();
    kill(CL.node[victim].pid, SIGSTOP);
    t0 = ts_now_mono_ns();
    for (uint32_t i = 1; i < n; i++)
        assert_int_equal(put_shard(c, "tk", shards[i], shards[i] + 9000), 0);
    fprintf(stderr, "  puts took %.3f s\n", (ts_now_mono_ns() - t0) / 1e9);
    msleep(1500); /* more than one trim pass; well under peer_timeout_ms (30 s here) */
    kill(CL.node[victim].pid, SIGCONT);
    for (int t = 0; t < 200 && (ops = total_lag(NULL, "n4")) != 0; t++)
        msleep(100);
    assert_int_equal(ops, 0);
    after = total_backfills();
    fprintf(stderr, "  PG %u: 11 entries past n4's position, backfills %ld -> %ld\n", pg, before,
            after);
    assert_int_equal(after, before); /* replayed from the log, not backfilled */
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(raw_read_verify(CL.node[victim].addr, "tk", shards[i], shards[i] + 9000),
                         0);
    ts_map_free(m);
    tessera_client_close(c);
}

/*
 * Clients that vanish mid-upload: 80 connections each start an upload on one primary (its
 * chunk forwarded to the replicas) and close. The primary ends the replicas' uploads too:
 * puts keep working (no replica runs out of upload slots) and the dataset can be deleted (no
 * upload left open anywhere).
 */
static void test_abandoned_uploads_end_on_replicas(void **state)
{
    tessera_client *c = cluster_client();
    struct ts_map *m = node_map(any_addr());
    int p = -1;
    uint32_t shard = 0;
    char msg[512];

    mkds(c, "gone", 3, 0, 2);
    /* A primary that is up (earlier tests killed some nodes). */
    {
        int rep[1];
        replicas_of(m, "gone", 0, rep, 1);
        p = rep[0];
    }
    assert_true(p >= 0 && tsd_alive(&CL.node[p]));
    for (uint32_t s = 0, n = 0; n < 80 && s < 100000; s++) { /* shards p leads */
        int rep[1];
        replicas_of(m, "gone", s, rep, 1);
        if (rep[0] != p)
            continue;
        assert_int_equal(raw_write_epoch(p, "gone", s, m->epoch, msg, sizeof(msg)), 0);
        shard = s;
        n++;
    }
    /* A complete put to the same primary, and then the delete, work. */
    assert_int_equal(put_shard(c, "gone", shard + 1000000, 5), 0);
    {
        int rc = TS_EBUSY, busy = 0;
        for (int t = 0; t < 50 && rc == TS_EBUSY; t++) {
            rc = tessera_dataset_delete(c, "gone");
            if (rc == TS_EBUSY)
                msleep(100); /* the ends are on their way */
            busy |= rc == TS_EBUSY;
        }
        if (busy && rc == TS_ENOENT)
            rc = 0; /* the busy try deleted it everywhere but on the node that was busy */
        if (rc)
            fprintf(stderr, "  delete: %s\n", tessera_client_error(c));
        assert_int_equal(rc, 0);
    }
    ts_map_free(m);
    tessera_client_close(c);
}

/* Maps a node must refuse, changing nothing (in memory or in data_dir/cluster.map): one that
 * does not list it, one with a pg_count that is no split of its own, one where no node is up. */
static void test_bad_maps_refused(void **state)
{
    int n2 = tsd_cluster_find(&CL, "n2");
    struct ts_map *now = node_map(CL.node[n2].addr), *bad;
    uint64_t before = now->epoch;
    struct ts_map *after;

    bad = ts_map_dup(now); /* without n2 */
    bad->epoch = before + 10;
    bad->nodes[n2] = bad->nodes[bad->n - 1];
    bad->n--;
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, bad), TS_EINVAL);
    ts_map_free(bad);
    bad = ts_map_dup(now); /* another pg_count, no split: 3x, and half */
    bad->epoch = before + 10;
    bad->pg_count *= 3;
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, bad), TS_EINVAL);
    bad->pg_count = now->pg_count / 2;
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, bad), TS_EINVAL);
    ts_map_free(bad);
    bad = ts_map_dup(now); /* nobody up: malformed on the wire */
    bad->epoch = before + 10;
    for (size_t i = 0; i < bad->n; i++)
        bad->nodes[i].state = TS_NODE_DOWN;
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, bad), TS_EPROTO);
    ts_map_free(bad);
    /* Another map at the epoch it has (two changes raced): refused, the first one stays; the
     * same map again (a retried push) is accepted. */
    bad = ts_map_dup(now);
    bad->nodes[0].weight += 7;
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, bad), TS_ESTALE);
    ts_map_free(bad);
    assert_int_equal(raw_map_push(CL.node[n2].tls_addr, now), 0);
    after = node_map(CL.node[n2].addr);
    assert_int_equal(after->epoch, before);
    assert_int_equal(after->nodes[0].weight, now->nodes[0].weight);
    ts_map_free(after);
    /* What it would restart with is unchanged too. */
    {
        char path[600], err[256];
        struct ts_map *disk = NULL;
        snprintf(path, sizeof(path), "%s/cluster.map", CL.node[n2].data);
        assert_int_equal(ts_map_parse_file(path, &disk, err, sizeof(err)), 0);
        assert_int_equal(disk->epoch, before);
        ts_map_free(disk);
    }
    ts_map_free(now);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replicas_everywhere),
        cmocka_unit_test(test_corrupt_chunk_repaired),
        cmocka_unit_test(test_missing_shard_found_by_scrub),
        cmocka_unit_test(test_fringe_lag_and_catch_up),
        cmocka_unit_test(test_backfill_after_log_trim),
        cmocka_unit_test(test_record_format_reaches_a_late_replica),
        cmocka_unit_test(test_min_core_refuses),
        cmocka_unit_test(test_stale_epoch_fenced),
        cmocka_unit_test(test_primary_killed_failover),
        cmocka_unit_test(test_abandoned_uploads_end_on_replicas),
        cmocka_unit_test(test_bad_maps_refused),
    };
    /* A cluster of its own: replicas answer late here without being taken for gone. */
    const struct CMUnitTest slow[] = {
        cmocka_unit_test(test_trim_keeps_replica_position),
    };
    int rc = cmocka_run_group_tests_name("cluster", tests, group_setup, NULL);
    if (rc)
        tsd_cluster_dump_logs(&CL);
    if (group_teardown(NULL) != 0)
        rc = 1;
    if (!rc) {
        rc = cmocka_run_group_tests_name("cluster-patient", slow, group_setup_patient, NULL);
        if (rc)
            tsd_cluster_dump_logs(&CL);
        if (group_teardown(NULL) != 0)
            rc = 1;
    }
    return rc;
}
