/*
 * Durability of acknowledged writes across failover and the return of a failed primary, with
 * real daemons on loopback and the default sync policy (sync = seal: a put is acknowledged after
 * its shard's file and the WAL were fsynced at its seal).
 *
 *   test_return_then_second_failover: a primary fails, its PG fails over, the node returns and
 *     is marked up (it leads the PG again), then it fails once more. Every write acknowledged
 *     on the way must survive, byte for byte.
 *   test_partial_map_push: a new epoch (old primary down) has reached one replica only; the
 *     old primary must not get a write acknowledged at the old epoch with the one replica that
 *     still has the old map.
 *   test_partial_map_push_mid_upload: the same, with the chunks already on every replica when
 *     the new epoch arrives, and the seal sent at the old epoch afterwards.
 *   test_seeded_rounds: randomized (seeded, reproducible) rounds of kill -9 / failover /
 *     return / mark up / delete and re-create, with a ledger of every acknowledged write: none
 *     lost, none served with other bytes (e.g. of a deleted incarnation), and, with every node
 *     up at the end, each held complete by at least min_core nodes.
 *   test_backfill_of_victims_pgs: a primary is away while its PG takes more writes than the
 *     others keep in their logs (--pg-log-keep 4); on its return it pulls and is backfilled.
 *   test_replica_ahead_of_new_primary: the new primary after a failover is behind the other
 *     replica (it was down, never marked down): it pulls before it serves or takes writes.
 *   test_divergent_log_rolled_back: a seal that reached only the old primary's log (not
 *     acknowledged) is rolled back on its return, replaced by the newer interval's entries.
 *
 * Environment: TESSERA_TEST_SEED (test_seeded_rounds' seed; default: the time),
 * TESSERA_TEST_ROUNDS (default 4), TESSERA_TEST_FULL_LOGS=1 (dump whole daemon logs on
 * failure instead of their last lines), TESSERA_TEST_SAVE_LOGS=DIR (keep a copy of every
 * daemon log there, also of tests that pass), TESSERA_TEST_FILTER (run only the tests whose
 * names match this cmocka pattern, e.g. "test_divergent*"), TESSERA_TEST_SYNC (the durable
 * policy the nodes run: seal, the default, or always; ctest runs the file under both).
 *
 * The harness starts every daemon with "--sync none"; the "--sync POLICY" passed here comes
 * later on the command line and wins (the last flag counts).
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

#include <errno.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define SLEN (3 * CHUNK + 123)
#define PUT_TRIES 5
#define PUT_PAUSE_MS 200
#define PUT_TIMEOUT_MS 5000 /* per request of a put's handle */
#define PUT_BUDGET_MS 3000  /* no new try of a put after this long */

static struct tsd_cluster CL;
static int test_passed; /* set at the very end of a test body; the teardown dumps logs if not */

/* Durability on (overrides the harness's "--sync none"): the default policy, seal, or the one
 * TESSERA_TEST_SYNC names; never none, which promises nothing across a power loss. */
static const char *durable_sync(void)
{
    const char *v = getenv("TESSERA_TEST_SYNC");
    return v && !strcmp(v, "always") ? "always" : "seal";
}

/* ---- small helpers ------------------------------------------------------------------------ */

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

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Prints the last `lines` lines of every daemon's log (all of it with TESSERA_TEST_FULL_LOGS). */
static void dump_logs(int lines)
{
    const char *full = getenv("TESSERA_TEST_FULL_LOGS");

    if (full && *full && strcmp(full, "0")) {
        tsd_cluster_dump_logs(&CL);
        return;
    }
    for (int i = 0; i < CL.n; i++) {
        FILE *f = fopen(CL.node[i].log, "r");
        char **ring = calloc((size_t)lines, sizeof(*ring)), buf[1024];
        long total = 0;

        if (!f || !ring) {
            if (f)
                fclose(f);
            free(ring);
            continue;
        }
        while (fgets(buf, sizeof(buf), f)) {
            free(ring[total % lines]);
            ring[total % lines] = strdup(buf);
            total++;
        }
        fclose(f);
        fprintf(stderr, "---- %s (%s): last %ld of %ld lines of %s ----\n", CL.id[i],
                tsd_alive(&CL.node[i]) ? "running" : "not running",
                total < lines ? total : (long)lines, total, CL.node[i].log);
        for (long k = total < lines ? 0 : total - lines; k < total; k++)
            fputs(ring[k % lines] ? ring[k % lines] : "", stderr);
        fprintf(stderr, "---- end of %s ----\n", CL.id[i]);
        for (int k = 0; k < lines; k++)
            free(ring[k]);
        free(ring);
    }
}

/* The "sync" setting node i reports in STATUS ("" if it does not answer). */
static void node_sync_setting(int i, char *out, size_t cap)
{
    int fd = raw_connect(CL.node[i].addr);
    uint8_t *p = NULL;
    size_t plen = 0;

    out[0] = '\0';
    if (fd < 0)
        return;
    if (raw_send_frame(fd, TS_OP_STATUS, 0, 1, NULL, 0) == 0 &&
        raw_recv_reply(fd, 5000, NULL, NULL, 0, &p, &plen) == 0) {
        char *txt = malloc(plen), *k, *q;
        struct ts_rd r;
        ts_rd_init(&r, p + 4, plen - 4);
        ts_rd_str(&r, txt, plen);
        if ((k = strstr(txt, "\"sync\"")) && (k = strchr(k + 6, '"')) && (q = strchr(k + 1, '"')))
            snprintf(out, cap, "%.*s", (int)(q - k - 1), k + 1);
        free(txt);
    }
    free(p);
    close(fd);
}

/* Whether node i's STATUS text contains needle (0 if it does not answer). */
static int status_has(int i, const char *needle)
{
    return raw_status_has(CL.node[i].addr, needle);
}

/* Waits (at most 30 s) until every live node leads only active PGs and reports no replica
 * behind or unconfirmed ("lag":[]). Returns 0 when settled. */
static int wait_settled(void)
{
    for (int t = 0; t < 300; t++) {
        int settled = 1;
        for (int i = 0; i < CL.n && settled; i++)
            if (tsd_alive(&CL.node[i]))
                settled = status_has(i, "\"pgs_peering\":0") && status_has(i, "\"lag\":[]");
        if (settled)
            return 0;
        poll(NULL, 0, 100);
    }
    return -1;
}

/* Starts the cluster with the durable sync policy and the extra daemon arguments (NULL: none;
 * they come after "--sync POLICY", so e.g. a "--peer-timeout-ms" there overrides the
 * harness's). */
static int start_cluster_with(int n, const char *const *domains, uint32_t pgs,
                              const char *const *extra)
{
    const char *args[32];
    int k = 0;

    args[k++] = "--sync";
    args[k++] = durable_sync();
    for (int j = 0; extra && extra[j] && k < 31; j++)
        args[k++] = extra[j];
    args[k] = NULL;
    test_passed = 0;
    if (tsd_cluster_start(&CL, n, domains, pgs, args) != 0) {
        tsd_cluster_dump_logs(&CL);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char sync[32];
        node_sync_setting(i, sync, sizeof(sync));
        if (strcmp(sync, durable_sync()) != 0) {
            fprintf(stderr, "%s runs with sync '%s', not '%s'\n", CL.id[i], sync, durable_sync());
            return -1;
        }
    }
    return 0;
}

static int start_cluster(int n, const char *const *domains, uint32_t pgs)
{
    return start_cluster_with(n, domains, pgs, NULL);
}

/* With TESSERA_TEST_SAVE_LOGS=DIR: copies every node's log (up to now) to
 * DIR/durability-PID-K-NODE.log, K counting the tests run. */
static void save_logs(void)
{
    static int k;
    const char *dir = getenv("TESSERA_TEST_SAVE_LOGS");

    if (!dir || !*dir)
        return;
    k++;
    for (int i = 0; i < CL.n; i++) {
        char path[1024], buf[8192];
        FILE *in = fopen(CL.node[i].log, "r"), *out;
        size_t n;
        if (!in)
            continue;
        snprintf(path, sizeof(path), "%s/durability-%d-%d-%s.log", dir, (int)getpid(), k, CL.id[i]);
        out = fopen(path, "w");
        while (out && (n = fread(buf, 1, sizeof(buf), in)) > 0)
            fwrite(buf, 1, n, out);
        if (out)
            fclose(out);
        fclose(in);
    }
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < CL.n; i++) /* in case a test left a node paused */
        if (CL.node[i].pid > 0)
            kill(CL.node[i].pid, SIGCONT);
    if (!test_passed) {
        fprintf(stderr, "test failed: daemon logs follow\n");
        dump_logs(80);
    }
    save_logs();
    return tsd_cluster_stop(&CL);
}

/* The node's current map (MAP_GET over a raw connection); NULL if it does not answer. */
static struct ts_map *node_map(const char *addr)
{
    return raw_map_get(addr);
}

static uint64_t node_epoch(int i)
{
    struct ts_map *m = tsd_alive(&CL.node[i]) ? node_map(CL.node[i].addr) : NULL;
    uint64_t e = m ? m->epoch : 0;
    ts_map_free(m);
    return e;
}

/* The newest map among the running nodes (and which node has it, in *from). */
static struct ts_map *newest_map(int *from)
{
    struct ts_map *best = NULL;

    if (from)
        *from = -1;
    for (int i = 0; i < CL.n; i++) {
        struct ts_map *m;
        if (!tsd_alive(&CL.node[i]) || !(m = node_map(CL.node[i].addr)))
            continue;
        if (!best || m->epoch > best->epoch) {
            ts_map_free(best);
            best = m;
            if (from)
                *from = i;
        } else {
            ts_map_free(m);
        }
    }
    return best;
}

/* A cluster-mode handle seeded with the running node that has the newest map; NULL on failure. */
static tessera_client *open_client_timeout(int timeout_ms)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    struct ts_map *m;
    int from;

    m = newest_map(&from);
    ts_map_free(m);
    if (from < 0)
        return NULL;
    tsd_client_opts(&o, &CL.node[from], "admin");
    o.timeout_ms = timeout_ms;
    if (tessera_client_open(&c, &o) != 0) {
        tessera_client_close(c);
        return NULL;
    }
    return c;
}

static tessera_client *open_client(void)
{
    return open_client_timeout(10000);
}

static tessera_client *cluster_client(void)
{
    tessera_client *c = open_client();
    assert_non_null(c);
    assert_true(tessera_client_epoch(c) > 0);
    return c;
}

static void mkds(tessera_client *c, const char *name, uint8_t core, uint8_t fringe,
                 uint8_t min_core)
{
    struct ts_dataset_policy p = {core, fringe, min_core, CHUNK, 0, 0, 0, 0};
    int rc = tessera_dataset_create(c, name, &p);
    if (rc)
        fprintf(stderr, "dataset create %s: %s: %s\n", name, ts_errname(rc),
                tessera_client_error(c));
    assert_int_equal(rc, 0);
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

/*
 * A put with a few retries (a fresh handle each time, seeded with the newest map; no new try
 * after PUT_BUDGET_MS). 0 only when a put returned 0: that shard is acknowledged. A shard that
 * a failed try left complete somewhere (TS_EEXIST) is not retried: it was never acknowledged.
 */
static int put_retry(const char *ds, uint32_t shard, uint64_t seed, char *why, size_t cap)
{
    uint64_t t0 = ts_now_mono_ns();
    int rc = TS_EUNAVAIL;

    why[0] = '\0';
    for (int t = 0; t < PUT_TRIES && ts_now_mono_ns() - t0 < PUT_BUDGET_MS * 1000000ull; t++) {
        tessera_client *c = open_client_timeout(PUT_TIMEOUT_MS);
        if (!c) {
            snprintf(why, cap, "no node to connect to");
            msleep(PUT_PAUSE_MS);
            continue;
        }
        rc = put_shard(c, ds, shard, seed);
        if (rc)
            snprintf(why, cap, "try %d: %s: %s", t + 1, ts_errname(rc), tessera_client_error(c));
        tessera_client_close(c);
        if (rc == 0 || rc == TS_EEXIST)
            break;
        msleep(PUT_PAUSE_MS);
    }
    return rc;
}

/* Waits (bounded) until every running node reports an epoch >= e. */
static int wait_epoch_all(uint64_t e, int ms)
{
    for (int waited = 0;; waited += 20) {
        int behind = -1;
        for (int i = 0; i < CL.n && behind < 0; i++)
            if (tsd_alive(&CL.node[i]) && node_epoch(i) < e)
                behind = i;
        if (behind < 0)
            return 0;
        if (waited >= ms) {
            fprintf(stderr, "  %s still at epoch %llu after %d ms (want %llu)\n", CL.id[behind],
                    (unsigned long long)node_epoch(behind), ms, (unsigned long long)e);
            return -1;
        }
        msleep(20);
    }
}

/* Fails over pg from a handle on a running node; returns the rc, *epoch the new epoch. */
static int failover(uint32_t pg, uint64_t *epoch)
{
    tessera_client *c = cluster_client();
    int rc = tessera_failover(c, pg, epoch);

    if (rc)
        fprintf(stderr, "  failover of PG %u: %s: %s\n", pg, ts_errname(rc),
                tessera_client_error(c));
    tessera_client_close(c);
    return rc;
}

/* Marks node i up: the newest map with its state UP, written to a file and pushed with
 * tessera_map_push_file (which sets the epoch); waits until every running node has it. */
static uint64_t mark_up(int i)
{
    struct ts_map *m = newest_map(NULL);
    tessera_client *c;
    char path[600];
    uint64_t e = 0;
    int k, rc;

    assert_non_null(m);
    k = ts_map_find(m, CL.id[i]);
    assert_true(k >= 0);
    m->nodes[k].state = TS_NODE_UP;
    snprintf(path, sizeof(path), "%s/markup.map", CL.dir);
    assert_int_equal(ts_map_write_file(m, path), 0);
    ts_map_free(m);
    c = cluster_client();
    rc = tessera_map_push_file(c, path, &e);
    if (rc)
        fprintf(stderr, "  map push (%s up): %s: %s\n", CL.id[i], ts_errname(rc),
                tessera_client_error(c));
    tessera_client_close(c);
    assert_int_equal(rc, 0);
    assert_int_equal(wait_epoch_all(e, 10000), 0);
    return e;
}

/* A request frame carrying a map epoch in its header (raw_send_frame sends epoch 0). */
static int send_frame_epoch(int fd, uint8_t op, uint64_t id, uint64_t epoch, const struct ts_wr *w)
{
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh = {TS_PROTO_VERSION, op, 0, id, epoch, (uint32_t)w->len};
    int rc;

    ts_frame_encode(h, &fh);
    rc = raw_send_all(fd, h, sizeof(h));
    return rc ? rc : raw_send_all(fd, w->buf, w->len);
}

/*
 * READ of [0, SLEN) of a shard from one node directly: the piece CRCs are verified; the bytes
 * go to out (SLEN bytes), their count to *got. 0, or the node's / transport's error, or
 * TS_ECORRUPT for a piece whose CRC does not match.
 */
static int raw_read(const char *addr, const char *ds, uint32_t shard, uint8_t *out, size_t *got)
{
    return raw_read_shard(addr, ds, shard, SLEN, out, got);
}

/* Verified shard bytes from node i compared with fill(seed): 0 exact, TS_ECORRUPT different,
 * else the read's error. *other_seed (optional) is set to 1 when the bytes are those of
 * fill(other) instead. */
static int node_verify(int i, const char *ds, uint32_t shard, uint64_t seed, const uint64_t *other,
                       size_t nother, int *which)
{
    uint8_t *buf = malloc(SLEN), *want = malloc(SLEN);
    size_t got;
    int rc = raw_read(CL.node[i].addr, ds, shard, buf, &got);

    if (which)
        *which = -1;
    if (rc == 0) {
        fill(want, SLEN, seed);
        if (got != SLEN || memcmp(buf, want, SLEN) != 0) {
            rc = TS_ECORRUPT;
            for (size_t k = 0; which && k < nother && got == SLEN; k++) {
                fill(want, SLEN, other[k]);
                if (!memcmp(buf, want, SLEN))
                    *which = (int)k;
            }
        }
    }
    free(buf);
    free(want);
    return rc;
}

/* Reads the shard through the client and compares with fill(seed): 0, TS_ECORRUPT, or rc. */
static int client_verify(tessera_client *c, const char *ds, uint32_t shard, uint64_t seed)
{
    uint8_t *buf = malloc(SLEN), *want = malloc(SLEN);
    size_t got = 0;
    int rc = tessera_read(c, ds, shard, 0, SLEN, buf, &got);

    if (rc == 0) {
        fill(want, SLEN, seed);
        if (got != SLEN || memcmp(buf, want, SLEN) != 0)
            rc = TS_ECORRUPT;
    }
    free(buf);
    free(want);
    return rc;
}

/* A node that does not hold the shard complete, or declines to serve it (TS_EBUSY: it is
 * recovering that PG and serves nothing of it until its primary confirms it): not a claim. */
static int not_claimed(int rc)
{
    return rc == TS_ENOENT || rc == TS_EINCOMPLETE || rc == TS_EBUSY;
}

/* The first PG (in order) whose primary is node index `node` in m, or UINT32_MAX. */
static uint32_t pg_led_by(const struct ts_map *m, int node, uint32_t from)
{
    for (uint32_t pg = from; pg < m->pg_count; pg++) {
        int order[1];
        if (ts_map_pg_order(m, pg, order, 1) == 1 &&
            tsd_cluster_find(&CL, m->nodes[order[0]].id) == node)
            return pg;
    }
    return UINT32_MAX;
}

static int primary_of(const struct ts_map *m, uint32_t pg)
{
    int order[1];
    if (ts_map_pg_order(m, pg, order, 1) != 1)
        return -1;
    return tsd_cluster_find(&CL, m->nodes[order[0]].id);
}

/* Shard numbers >= *next of ds that map to pg (n of them into out). */
static void shards_in_pg(const struct ts_map *m, const char *ds, uint32_t pg, uint32_t *next,
                         uint32_t *out, int n)
{
    for (int k = 0; k < n; (*next)++)
        if (ts_map_pg_of(m, ds, *next) == pg)
            out[k++] = *next;
}

/* ---- 1: a returning primary, then a second failover ---------------------------------------- */

struct acked {
    uint32_t shard;
    uint64_t seed;
    const char *phase;
};

static void test_return_then_second_failover(void **state)
{
    const char *ds = "dur";
    struct acked ack[8];
    int nack = 0, lost = 0, bad = 0, P, order[3], n_before, n_down, n_back;
    uint32_t pg = 0, next = 0, sh[2];
    uint64_t e1, e2, e3;
    struct ts_map *m;
    tessera_client *c;
    char why[600];

    (void)state;
    assert_int_equal(start_cluster(3, NULL, 8), 0);
    c = cluster_client();
    mkds(c, ds, 3, 0, 2);
    tessera_client_close(c);
    m = newest_map(NULL);
    assert_non_null(m);
    assert_int_equal(ts_map_pg_order(m, pg, order, 3), 3);
    P = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    fprintf(stderr, "  PG %u: primary %s, core replicas %s %s (epoch %llu)\n", pg, CL.id[P],
            m->nodes[order[1]].id, m->nodes[order[2]].id, (unsigned long long)m->epoch);

#define PUT_PHASE(phase_name, must)                                                                \
    do {                                                                                           \
        shards_in_pg(m, ds, pg, &next, sh, 2);                                                     \
        for (int k_ = 0; k_ < 2; k_++) {                                                           \
            uint64_t seed_ = 1000 + sh[k_];                                                        \
            int rc_ = put_retry(ds, sh[k_], seed_, why, sizeof(why));                              \
            fprintf(stderr, "  %-28s put %s/%u: %s%s%s\n", phase_name, ds, sh[k_],                 \
                    rc_ ? "NOT acknowledged" : "acknowledged", rc_ ? " -- " : "", rc_ ? why : ""); \
            if (rc_ == 0)                                                                          \
                ack[nack++] = (struct acked){sh[k_], seed_, phase_name};                           \
            else if (must)                                                                         \
                fail_msg("setup put %s/%u failed: %s", ds, sh[k_], why);                           \
        }                                                                                          \
    } while (0)

    /* 1. Two shards with every node up. */
    PUT_PHASE("all up (epoch 1)", 1);
    /* 2. The primary dies; the PG fails over to the next core replica. */
    tsd_kill9(&CL.node[P]);
    assert_int_equal(failover(pg, &e1), 0);
    assert_int_equal(wait_epoch_all(e1, 10000), 0);
    fprintf(stderr, "  %s killed, PG %u failed over: epoch %llu\n", CL.id[P], pg,
            (unsigned long long)e1);
    n_before = nack;
    PUT_PHASE("after failover", 0);
    n_down = nack - n_before;
    /* 3. It comes back (same data directory) and is marked up: it leads the PG again. */
    assert_int_equal(tsd_start(&CL.node[P], NULL), 0);
    e2 = mark_up(P);
    {
        struct ts_map *now = newest_map(NULL);
        int pr = now ? primary_of(now, pg) : -1;
        fprintf(stderr, "  %s restarted and marked up: epoch %llu, PG %u primary %s\n", CL.id[P],
                (unsigned long long)e2, pg, pr >= 0 ? CL.id[pr] : "none");
        ts_map_free(now);
    }
    n_before = nack;
    PUT_PHASE("after return + mark up", 0);
    n_back = nack - n_before;
    /* 4. It dies again; the PG fails over again. */
    tsd_kill9(&CL.node[P]);
    assert_int_equal(failover(pg, &e3), 0);
    assert_int_equal(wait_epoch_all(e3, 10000), 0);
    fprintf(stderr, "  %s killed again, PG %u failed over: epoch %llu\n", CL.id[P], pg,
            (unsigned long long)e3);
#undef PUT_PHASE

    /* Every acknowledged shard reads back byte-exact through the client, and every running
     * node that holds it complete has exactly its bytes. */
    c = cluster_client();
    for (int k = 0; k < nack; k++) {
        int rc = client_verify(c, ds, ack[k].shard, ack[k].seed);
        char nodes[256] = "";
        for (int i = 0; i < CL.n; i++) {
            int nrc;
            if (!tsd_alive(&CL.node[i]))
                continue;
            nrc = node_verify(i, ds, ack[k].shard, ack[k].seed, NULL, 0, NULL);
            snprintf(nodes + strlen(nodes), sizeof(nodes) - strlen(nodes), " %s:%s", CL.id[i],
                     nrc ? ts_errname(nrc) : "ok");
            if (nrc && !not_claimed(nrc))
                bad++;
        }
        if (rc)
            lost++;
        fprintf(stderr, "  %s/%u (acknowledged %s): client read %s; on the nodes:%s\n", ds,
                ack[k].shard, ack[k].phase, rc ? ts_errname(rc) : "ok", nodes);
        if (rc)
            fprintf(stderr, "    LOST: %s/%u was acknowledged (%s) and cannot be read back: %s\n",
                    ds, ack[k].shard, ack[k].phase, tessera_client_error(c));
    }
    tessera_client_close(c);
    fprintf(stderr, "  %d shards acknowledged, %d lost, %d wrong copies on running nodes\n", nack,
            lost, bad);
    ts_map_free(m);
    if (lost || bad)
        fail_msg("%d of %d acknowledged shards lost, %d nodes claim a shard with wrong bytes", lost,
                 nack, bad);
    /* Nothing lost, but only a run that wrote in both phases tested anything. */
    if (!n_down || !n_back)
        fail_msg("NOT EXERCISED: no put into PG %u was acknowledged %s (min_core 2 with 2 of "
                 "the 3 core replicas up must take writes): the scenario was not tested",
                 pg, !n_down ? "while its primary was down" : "after its primary returned");
    test_passed = 1;
}

/* ---- 2: a new epoch that reached one replica only --------------------------------------- */

/* A 3-node cluster with dataset ds (core 3, min_core 2): PG pg's primary P and core replicas
 * R1, R2 (indexes into CL); the map. */
static struct ts_map *pg_cluster(const char *ds, uint32_t pg, int *P, int *R1, int *R2)
{
    tessera_client *c;
    struct ts_map *m;
    int order[3];

    assert_int_equal(start_cluster(3, NULL, 8), 0);
    c = cluster_client();
    mkds(c, ds, 3, 0, 2);
    tessera_client_close(c);
    m = newest_map(NULL);
    assert_non_null(m);
    assert_int_equal(ts_map_pg_order(m, pg, order, 3), 3);
    *P = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    *R1 = tsd_cluster_find(&CL, m->nodes[order[1]].id);
    *R2 = tsd_cluster_find(&CL, m->nodes[order[2]].id);
    fprintf(stderr, "  PG %u at epoch %llu: primary %s, core replicas %s (R1) %s (R2)\n", pg,
            (unsigned long long)m->epoch, CL.id[*P], CL.id[*R1], CL.id[*R2]);
    return m;
}

#define T2_LEN 1000u /* one chunk */

static int raw_shard_write(int fd, uint64_t epoch, const char *ds, uint32_t shard,
                           const uint8_t *data, char *msg, size_t cap)
{
    struct ts_wr w;
    int rc;

    ts_wr_init(&w);
    ts_wr_str(&w, ds);
    ts_wr_u32(&w, shard);
    ts_wr_u32(&w, 0);      /* chunk 0 */
    ts_wr_u64(&w, T2_LEN); /* declared size */
    ts_wr_u32(&w, ts_crc32c(0, data, T2_LEN));
    ts_wr_u32(&w, T2_LEN);
    ts_wr_bytes(&w, data, T2_LEN);
    rc = send_frame_epoch(fd, TS_OP_SHARD_WRITE, 11, epoch, &w);
    ts_wr_fini(&w);
    return rc ? rc : raw_recv_reply(fd, 15000, NULL, msg, cap, NULL, NULL);
}

static int raw_shard_seal(int fd, uint64_t epoch, const char *ds, uint32_t shard,
                          const uint8_t *data, char *msg, size_t cap)
{
    struct ts_wr w;
    int rc;

    ts_wr_init(&w);
    ts_wr_str(&w, ds);
    ts_wr_u32(&w, shard);
    ts_wr_u8(&w, 1); /* have the whole-shard CRC */
    ts_wr_u32(&w, ts_crc32c(0, data, T2_LEN));
    ts_wr_u32(&w, 0); /* no records */
    rc = send_frame_epoch(fd, TS_OP_SHARD_SEAL, 12, epoch, &w);
    ts_wr_fini(&w);
    return rc ? rc : raw_recv_reply(fd, 15000, NULL, msg, cap, NULL, NULL);
}

static void test_partial_map_push(void **state)
{
    const char *ds = "pmp";
    struct ts_map *m, *next;
    int P, R1, R2, fd, rc_w, rc_s;
    uint32_t pg = 0, shard = 0, sh[1];
    uint8_t data[T2_LEN];
    char why[600], msg_w[512], msg_s[512];

    (void)state;
    m = pg_cluster(ds, pg, &P, &R1, &R2);
    /* The PG works at the old epoch: one shard through the client. */
    shards_in_pg(m, ds, pg, &shard, sh, 1);
    assert_int_equal(put_retry(ds, sh[0], 77, why, sizeof(why)), 0);
    shard++;

    /* Epoch E+1 (P down, R1 leads) reaches R1 only; P and R2 keep epoch E. */
    next = ts_map_dup(m);
    next->nodes[ts_map_find(next, CL.id[P])].state = TS_NODE_DOWN;
    next->epoch = m->epoch + 1;
    assert_int_equal(raw_map_push(CL.node[R1].tls_addr, next), 0);
    fprintf(stderr, "  epochs now: %s (P) %llu, %s (R1) %llu, %s (R2) %llu\n", CL.id[P],
            (unsigned long long)node_epoch(P), CL.id[R1], (unsigned long long)node_epoch(R1),
            CL.id[R2], (unsigned long long)node_epoch(R2));
    assert_true(node_epoch(R1) == next->epoch);

    /* A writer with the old map uploads a new shard of the PG to P at epoch E. */
    shards_in_pg(m, ds, pg, &shard, sh, 1);
    fill(data, sizeof(data), 4242);
    fd = raw_connect_as(CL.node[P].tls_addr, "writer");
    assert_true(fd >= 0);
    rc_w = raw_shard_write(fd, m->epoch, ds, sh[0], data, msg_w, sizeof(msg_w));
    fprintf(stderr, "  SHARD_WRITE %s/%u chunk 0 to %s at epoch %llu: %s%s%s\n", ds, sh[0],
            CL.id[P], (unsigned long long)m->epoch, rc_w ? ts_errname(rc_w) : "ok",
            rc_w ? ": " : "", rc_w ? msg_w : "");
    rc_s = raw_shard_seal(fd, m->epoch, ds, sh[0], data, msg_s, sizeof(msg_s));
    fprintf(stderr, "  SHARD_SEAL  %s/%u to %s at epoch %llu: %s%s%s\n", ds, sh[0], CL.id[P],
            (unsigned long long)m->epoch, rc_s ? ts_errname(rc_s) : "ok (ACKNOWLEDGED)",
            rc_s ? ": " : "", rc_s ? msg_s : "");
    raw_close(fd);
    fprintf(stderr, "  epochs after: %s (P) %llu, %s (R1) %llu, %s (R2) %llu\n", CL.id[P],
            (unsigned long long)node_epoch(P), CL.id[R1], (unsigned long long)node_epoch(R1),
            CL.id[R2], (unsigned long long)node_epoch(R2));
    ts_map_free(next);
    ts_map_free(m);
    if (rc_s == 0)
        fail_msg("old primary %s acknowledged %s/%u at the old epoch although %s follows a newer "
                 "epoch in which %s is down (only %s still had the old map)",
                 CL.id[P], ds, sh[0], CL.id[R1], CL.id[P], CL.id[R2]);
    test_passed = 1;
}

/*
 * 2b. The same split, with the upload already under way when the new epoch reaches R1: the
 * chunk went to P, R1 and R2 at epoch E; then E+1 (P down) reaches R1 only; then the writer
 * seals at epoch E. R1 refuses the seal (stale epoch) and P adopts E+1 from R1's reply, but
 * R2 -- paused for a moment (SIGSTOP, a slow disk or a GC pause would do) -- still applies it
 * at epoch E afterwards. The seal must not be acknowledged: only P and R2 hold it, at an epoch
 * that R1 (the primary of E+1) has left behind.
 */
static void test_partial_map_push_mid_upload(void **state)
{
    const char *ds = "pmu";
    struct ts_map *m, *next;
    int P, R1, R2, fd, rc_w, rc_s, waited;
    uint32_t pg = 0, shard = 0, sh[1];
    uint8_t data[T2_LEN];
    char why[600], msg_w[512], msg_s[512];
    struct ts_wr w;

    (void)state;
    m = pg_cluster(ds, pg, &P, &R1, &R2);
    shards_in_pg(m, ds, pg, &shard, sh, 1);
    assert_int_equal(put_retry(ds, sh[0], 77, why, sizeof(why)), 0);
    shard++;

    /* The upload starts at epoch E: its chunk is on P, R1 and R2. */
    shards_in_pg(m, ds, pg, &shard, sh, 1);
    fill(data, sizeof(data), 4343);
    fd = raw_connect_as(CL.node[P].tls_addr, "writer");
    assert_true(fd >= 0);
    rc_w = raw_shard_write(fd, m->epoch, ds, sh[0], data, msg_w, sizeof(msg_w));
    fprintf(stderr, "  SHARD_WRITE %s/%u chunk 0 to %s at epoch %llu: %s%s%s\n", ds, sh[0],
            CL.id[P], (unsigned long long)m->epoch, rc_w ? ts_errname(rc_w) : "ok",
            rc_w ? ": " : "", rc_w ? msg_w : "");
    assert_int_equal(rc_w, 0);

    /* Epoch E+1 (P down, R1 leads) reaches R1 only. */
    next = ts_map_dup(m);
    next->nodes[ts_map_find(next, CL.id[P])].state = TS_NODE_DOWN;
    next->epoch = m->epoch + 1;
    assert_int_equal(raw_map_push(CL.node[R1].tls_addr, next), 0);

    /* The seal at epoch E, with R2 paused until P has heard of E+1 from R1. */
    assert_int_equal(kill(CL.node[R2].pid, SIGSTOP), 0);
    ts_wr_init(&w);
    ts_wr_str(&w, ds);
    ts_wr_u32(&w, sh[0]);
    ts_wr_u8(&w, 1);
    ts_wr_u32(&w, ts_crc32c(0, data, T2_LEN));
    ts_wr_u32(&w, 0);
    rc_s = send_frame_epoch(fd, TS_OP_SHARD_SEAL, 12, m->epoch, &w);
    ts_wr_fini(&w);
    for (waited = 0; waited < 2000 && node_epoch(P) < next->epoch; waited += 5)
        msleep(5);
    msleep(100); /* let P act on the new map (its replication thread) */
    fprintf(stderr, "  %s paused; %s at epoch %llu after %d ms; resuming %s\n", CL.id[R2], CL.id[P],
            (unsigned long long)node_epoch(P), waited, CL.id[R2]);
    kill(CL.node[R2].pid, SIGCONT);
    if (rc_s == 0)
        rc_s = raw_recv_reply(fd, 15000, NULL, msg_s, sizeof(msg_s), NULL, NULL);
    raw_close(fd);
    fprintf(stderr, "  SHARD_SEAL  %s/%u to %s at epoch %llu: %s%s%s\n", ds, sh[0], CL.id[P],
            (unsigned long long)m->epoch, rc_s ? ts_errname(rc_s) : "ok (ACKNOWLEDGED)",
            rc_s ? ": " : "", rc_s ? msg_s : "");
    fprintf(stderr, "  epochs after: %s (P) %llu, %s (R1) %llu, %s (R2) %llu\n", CL.id[P],
            (unsigned long long)node_epoch(P), CL.id[R1], (unsigned long long)node_epoch(R1),
            CL.id[R2], (unsigned long long)node_epoch(R2));
    for (int i = 0; i < CL.n; i++) {
        int nrc;
        uint8_t *buf = malloc(SLEN);
        size_t got;
        nrc = raw_read(CL.node[i].addr, ds, sh[0], buf, &got);
        fprintf(stderr, "  %s/%u on %s: %s\n", ds, sh[0], CL.id[i],
                nrc ? ts_errname(nrc) : "complete");
        free(buf);
    }
    ts_map_free(next);
    ts_map_free(m);
    if (rc_s == 0)
        fail_msg("old primary %s acknowledged the seal of %s/%u at the old epoch although %s "
                 "had refused it under a newer epoch in which %s is down (only %s, with the old "
                 "map, applied it)",
                 CL.id[P], ds, sh[0], CL.id[R1], CL.id[P], CL.id[R2]);
    test_passed = 1;
}

/* ---- 3: seeded rounds --------------------------------------------------------------------- */

#define T3_NODES 5
#define T3_PGS 16
#define T3_NDS 2
#define T3_MAXSHARD 512
#define T3_MAXLED 4096
#define T3_MIN_CORE 2

struct led {
    int ds, gen, inc; /* dataset slot, its name's generation, incarnation under that name */
    uint32_t shard;
    uint64_t seed;
    int lost;  /* seen unreadable (or wrong) through the client at some check */
    int stale; /* a node or the client served bytes not of this write */
    int under; /* with every node up, fewer than min_core nodes hold it complete */
};

static struct {
    uint64_t rng, seed;
    struct led led[T3_MAXLED];
    int nled;
    int inc[T3_NDS];
    uint8_t used[T3_NDS][T3_MAXSHARD]; /* shard numbers tried in the current incarnation */
    int gen[T3_NDS]; /* a refused delete retires the slot's name: the next one is used */
    int writes, tries, stale_deleted, deletes_refused;
    int unsettled; /* the cluster did not become all active and confirmed once every node was up */
    int acked_down, acked_back; /* acknowledged while the victim was down / after it returned */
} T3;

static const char *t3_name(int ds)
{
    static char names[T3_NDS][32];
    if (T3.gen[ds])
        snprintf(names[ds], sizeof(names[ds]), "seed%d-%d", ds, T3.gen[ds]);
    else
        snprintf(names[ds], sizeof(names[ds]), "seed%d", ds);
    return names[ds];
}

static uint64_t rnd(void)
{
    T3.rng ^= T3.rng >> 12;
    T3.rng ^= T3.rng << 25;
    T3.rng ^= T3.rng >> 27;
    return T3.rng * 2685821657736338717ull;
}

static int chance(int percent)
{
    return (int)(rnd() % 100) < percent;
}

static uint64_t t3_seed(int ds, int inc, uint32_t shard)
{
    return mix64(T3.seed ^ mix64(((uint64_t)ds << 48) ^ ((uint64_t)inc << 32) ^ shard)) >> 8;
}

/*
 * Writes n shards: the first, and about half of the others, into the PGs in `target` (the PGs
 * the round's victim led when the round began: before its failure, while another node leads
 * them, and after it leads them again), the rest anywhere.
 */
static int t3_write(int n, const uint8_t *target, const char *phase)
{
    struct ts_map *m = newest_map(NULL);
    int acked = 0;
    char why[600];

    assert_non_null(m);
    for (int k = 0; k < n; k++) {
        int ds = (int)(rnd() % T3_NDS), targeted = target && (k == 0 || chance(50)), rc;
        uint32_t s, start = (uint32_t)(rnd() % T3_MAXSHARD);
        uint64_t seed;

        for (s = 0; s < T3_MAXSHARD; s++) {
            uint32_t cand = (start + s) % T3_MAXSHARD;
            if (T3.used[ds][cand])
                continue;
            if (targeted && !target[ts_map_pg_of(m, t3_name(ds), cand)])
                continue;
            s = cand;
            break;
        }
        if (s >= T3_MAXSHARD)
            continue;
        T3.used[ds][s] = 1;
        seed = t3_seed(ds, T3.inc[ds], s);
        T3.tries++;
        rc = put_retry(t3_name(ds), s, seed, why, sizeof(why));
        if (rc == 0) {
            assert_true(T3.nled < T3_MAXLED);
            T3.led[T3.nled++] = (struct led){ds, T3.gen[ds], T3.inc[ds], s, seed, 0, 0, 0};
            T3.writes++;
            acked++;
        } else {
            fprintf(stderr, "    %s: put %s#%d/%u (PG %u) not acknowledged: %s\n", phase,
                    t3_name(ds), T3.inc[ds], s, ts_map_pg_of(m, t3_name(ds), s), why);
        }
    }
    ts_map_free(m);
    return acked;
}

/* Fails over every PG that `victim` leads in the newest map (one at a time, re-reading the map
 * after each: the first failover marks the node down, which moves all its PGs). */
static void t3_failover_all(int victim)
{
    for (uint32_t tries = 0; tries < T3_PGS; tries++) {
        struct ts_map *m = newest_map(NULL);
        uint32_t pg;
        uint64_t e = 0;
        int rc;

        assert_non_null(m);
        pg = pg_led_by(m, victim, 0);
        ts_map_free(m);
        if (pg == UINT32_MAX)
            return;
        rc = failover(pg, &e);
        if (rc == TS_EUNAVAIL)
            continue;
        assert_int_equal(rc, 0);
        assert_int_equal(wait_epoch_all(e, 10000), 0);
        fprintf(stderr, "    failover of PG %u (led by %s): epoch %llu\n", pg, CL.id[victim],
                (unsigned long long)e);
    }
}

static void t3_restart(int i)
{
    uint64_t e;
    assert_int_equal(tsd_start(&CL.node[i], NULL), 0);
    e = mark_up(i);
    fprintf(stderr, "    %s restarted and marked up: epoch %llu\n", CL.id[i],
            (unsigned long long)e);
}

static void t3_kill(int i)
{
    tsd_kill9(&CL.node[i]);
    fprintf(stderr, "    kill -9 %s\n", CL.id[i]);
}

/*
 * Deletes a dataset and creates it again under the same name (the same policy; new contents
 * from then on). A delete that keeps being refused (e.g. TS_EBUSY: an upload of it left open
 * on some node) may have happened on some nodes only: that dataset is left out of the ledger
 * from then on (its entries keep what earlier checks found), reported, and the slot goes on
 * under a new name.
 */
static void t3_delete_recreate(void)
{
    int ds = (int)(rnd() % T3_NDS), rc = 0;
    struct ts_dataset_policy p = {3, 1, 2, CHUNK, 0, 0, 0, 0};
    char msg[600] = "";

    for (int t = 0; t < 10; t++) {
        tessera_client *c = cluster_client();
        rc = tessera_dataset_delete(c, t3_name(ds));
        if (rc)
            snprintf(msg, sizeof(msg), "%s: %s", ts_errname(rc), tessera_client_error(c));
        tessera_client_close(c);
        if (rc == 0)
            break;
        msleep(200);
    }
    if (rc) {
        fprintf(stderr, "    delete %s refused for 2 s (%s): %s is left out from now on",
                t3_name(ds), msg, t3_name(ds));
        T3.gen[ds]++;
        T3.deletes_refused++;
        fprintf(stderr, "; writing to %s instead\n", t3_name(ds));
        T3.inc[ds] = 0;
    } else {
        T3.inc[ds]++;
    }
    {
        tessera_client *c = cluster_client();
        rc = tessera_dataset_create(c, t3_name(ds), &p);
        if (rc)
            fprintf(stderr, "    re-create %s: %s: %s\n", t3_name(ds), ts_errname(rc),
                    tessera_client_error(c));
        tessera_client_close(c);
    }
    assert_int_equal(rc, 0);
    memset(T3.used[ds], 0, sizeof(T3.used[ds]));
    if (T3.inc[ds])
        fprintf(stderr, "    %s deleted and re-created (incarnation %d)\n", t3_name(ds),
                T3.inc[ds]);
}

/* The current write of (ds, shard) in the ledger, or NULL. */
static struct led *t3_current(int ds, uint32_t shard)
{
    for (int k = T3.nled - 1; k >= 0; k--)
        if (T3.led[k].ds == ds && T3.led[k].gen == T3.gen[ds] && T3.led[k].shard == shard &&
            T3.led[k].inc == T3.inc[ds])
            return &T3.led[k];
    return NULL;
}

/* Checks the ledger against the cluster as it is now; prints and flags what is wrong. */
static void t3_check(const char *when, int all_up)
{
    tessera_client *c = cluster_client();
    int lost = 0, stale = 0, under = 0;

    for (int k = 0; k < T3.nled; k++) {
        struct led *l = &T3.led[k];
        const char *ds = t3_name(l->ds);
        int current = l->inc == T3.inc[l->ds];

        if (l->gen != T3.gen[l->ds])
            continue; /* a name retired after a refused delete */

        if (current) {
            int rc = client_verify(c, ds, l->shard, l->seed), copies = 0;
            char held[128] = "";
            if (rc) {
                if (!l->lost)
                    fprintf(stderr, "    %s: LOST %s#%d/%u: client read %s: %s\n", when, ds, l->inc,
                            l->shard, ts_errname(rc), tessera_client_error(c));
                l->lost = 1;
                lost++;
            }
            for (int i = 0; i < CL.n; i++) {
                int which, nrc;
                uint64_t olds[16];
                size_t nold = 0;
                if (!tsd_alive(&CL.node[i]))
                    continue;
                for (int j = 0; j < T3.nled && nold < 16; j++)
                    if (T3.led[j].ds == l->ds && T3.led[j].gen == l->gen &&
                        T3.led[j].shard == l->shard && T3.led[j].inc != l->inc)
                        olds[nold++] = T3.led[j].seed;
                nrc = node_verify(i, ds, l->shard, l->seed, olds, nold, &which);
                if (nrc == 0) {
                    copies++;
                    snprintf(held + strlen(held), sizeof(held) - strlen(held), " %s", CL.id[i]);
                }
                if (nrc && !not_claimed(nrc)) {
                    if (!l->stale)
                        fprintf(stderr, "    %s: STALE %s#%d/%u on %s: %s%s\n", when, ds, l->inc,
                                l->shard, CL.id[i], ts_errname(nrc),
                                which >= 0 ? " (the bytes of a deleted incarnation)" : "");
                    l->stale = 1;
                    stale++;
                }
            }
            /* Acknowledged with min_core 2: with every node up, at least 2 hold it. */
            if (all_up && copies < T3_MIN_CORE) {
                fprintf(stderr, "    %s: UNDER-REPLICATED %s#%d/%u: complete on %d node(s):%s\n",
                        when, ds, l->inc, l->shard, copies, copies ? held : " none");
                l->under = 1;
                under++;
            }
        } else if (!t3_current(l->ds, l->shard) && !T3.used[l->ds][l->shard]) {
            /* Deleted and not tried again since: nobody may serve it as complete. */
            int rc = client_verify(c, ds, l->shard, l->seed), flagged = 0;
            if (rc == 0 || rc == TS_ECORRUPT) {
                fprintf(stderr,
                        "    %s: STALE %s/%u (deleted incarnation %d) served through the "
                        "client: %s\n",
                        when, ds, l->shard, l->inc, rc ? "other bytes" : "its old bytes");
                flagged = 1;
            }
            for (int i = 0; i < CL.n; i++) {
                int nrc;
                if (!tsd_alive(&CL.node[i]))
                    continue;
                nrc = node_verify(i, ds, l->shard, l->seed, NULL, 0, NULL);
                if (!not_claimed(nrc)) {
                    fprintf(stderr, "    %s: STALE %s/%u (deleted incarnation %d) on %s: %s\n",
                            when, ds, l->shard, l->inc, CL.id[i],
                            nrc ? ts_errname(nrc) : "its old bytes, complete");
                    flagged = 1;
                }
            }
            if (flagged && !l->stale) {
                l->stale = 1;
                T3.stale_deleted++;
            }
            stale += flagged;
        }
    }
    tessera_client_close(c);
    fprintf(stderr, "  check %s: %d unreadable, %d stale", when, lost, stale);
    if (all_up)
        fprintf(stderr, ", %d under-replicated", under);
    fprintf(stderr, "\n");
}

static void test_seeded_rounds(void **state)
{
    static const char *const domains[] = {"rack-a", "rack-a", "rack-b", "rack-b", "rack-c"};
    const char *env_seed = getenv("TESSERA_TEST_SEED"), *env_rounds = getenv("TESSERA_TEST_ROUNDS");
    int rounds = env_rounds && *env_rounds ? atoi(env_rounds) : 4, L = 0, S = 0, U = 0;
    uint64_t t0 = ts_now_mono_ns();
    tessera_client *c;

    (void)state;
    memset(&T3, 0, sizeof(T3));
    T3.seed = env_seed && *env_seed ? strtoull(env_seed, NULL, 0)
                                    : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
    T3.rng = mix64(T3.seed) | 1;
    if (rounds < 1)
        rounds = 1;
    fprintf(stderr, "  TESSERA_TEST_SEED=%llu TESSERA_TEST_ROUNDS=%d\n",
            (unsigned long long)T3.seed, rounds);
    assert_int_equal(start_cluster(T3_NODES, domains, T3_PGS), 0);
    c = cluster_client();
    for (int ds = 0; ds < T3_NDS; ds++)
        mkds(c, t3_name(ds), 3, 1, 2);
    tessera_client_close(c);

    for (int round = 1; round <= rounds; round++) {
        struct ts_map *m = newest_map(NULL);
        int cand[T3_NODES], ncand = 0, victim, deleted = 0;
        uint8_t led[T3_PGS] = {0};
        char when[64], pgs[128] = "";

        assert_non_null(m);
        for (int i = 0; i < CL.n; i++)
            if (tsd_alive(&CL.node[i]) && pg_led_by(m, i, 0) != UINT32_MAX)
                cand[ncand++] = i;
        assert_true(ncand > 0);
        victim = cand[rnd() % (uint64_t)ncand];
        for (uint32_t pg = 0; pg < T3_PGS; pg++)
            if (primary_of(m, pg) == victim) {
                led[pg] = 1;
                snprintf(pgs + strlen(pgs), sizeof(pgs) - strlen(pgs), " %u", pg);
            }
        ts_map_free(m);
        fprintf(stderr, "  round %d: victim %s (leads PGs%s)\n", round, CL.id[victim], pgs);

        t3_write(4, led, "before the kill");
        t3_kill(victim);
        t3_failover_all(victim);
        if (chance(40)) {
            t3_delete_recreate(); /* while the victim is down */
            deleted = 1;
        }
        T3.acked_down += t3_write(4, led, "victim down");
        t3_restart(victim);
        T3.acked_back += t3_write(4, led, "victim back");
        if (chance(60)) {
            t3_kill(victim);
            t3_failover_all(victim);
            T3.acked_down += t3_write(2, led, "victim down again");
        }
        if (!deleted && chance(25))
            t3_delete_recreate();
        /* The ledger against the cluster as the round left it (a node may be down). */
        snprintf(when, sizeof(when), "end of round %d", round);
        t3_check(when, 0);
        for (int i = 0; i < CL.n; i++)
            if (!tsd_alive(&CL.node[i]))
                t3_restart(i);
    }
    /* Recovery finishes by itself once every node is back: then every copy is checked. */
    if (wait_settled() != 0) {
        /* Liveness: with every node back, every PG must become active and every replica
         * confirmed by itself. */
        fprintf(stderr, "  the cluster did not settle within 30 s (peering or replicas behind)\n");
        T3.unsettled = 1;
    }
    t3_check("final, every node up", 1);
    for (int k = 0; k < T3.nled; k++) {
        L += T3.led[k].lost;
        S += T3.led[k].stale;
        U += T3.led[k].under;
    }
    fprintf(stderr,
            "rounds %d writes %d lost %d stale %d under-replicated %d (seed %llu, %d puts tried, "
            "%d deletes refused, %.1f s)\n",
            rounds, T3.writes, L, S, U, (unsigned long long)T3.seed, T3.tries, T3.deletes_refused,
            (double)(ts_now_mono_ns() - t0) / 1e9);
    if (L || S || U)
        fail_msg("lost %d, stale %d, under-replicated %d of %d acknowledged writes (reproduce "
                 "with TESSERA_TEST_SEED=%llu TESSERA_TEST_ROUNDS=%d)",
                 L, S, U, T3.writes, (unsigned long long)T3.seed, rounds);
    if (T3.unsettled)
        fail_msg("every node was up again, but some PG did not become active or some replica "
                 "was not confirmed within 30 s (reproduce with TESSERA_TEST_SEED=%llu "
                 "TESSERA_TEST_ROUNDS=%d)",
                 (unsigned long long)T3.seed, rounds);
    if (!T3.acked_down || !T3.acked_back)
        fail_msg("NOT EXERCISED: no put was acknowledged %s in any round (min_core 2 with 4 of 5 "
                 "nodes up must take writes): the scenario was not tested",
                 !T3.acked_down ? "while a victim was down" : "after a victim returned");
    test_passed = 1;
}

/* ---- 4: recovery of a returning or lagging node: backfill, pull, roll back ---------------- */

/* A PG's log as node i reports it (PG_INFO). */
#define pginfo raw_pginfo

static int node_pg_info(int i, uint32_t pg, struct pginfo *pi)
{
    return raw_pg_info(CL.node[i].addr, pg, pi);
}

static void print_pg_info(const char *when, int i, uint32_t pg)
{
    struct pginfo pi;
    int rc = node_pg_info(i, pg, &pi);

    if (rc)
        fprintf(stderr, "  %s: %s PG %u: pg-info %s\n", when, CL.id[i], pg, ts_errname(rc));
    else
        fprintf(stderr,
                "  %s: %s PG %u: head (epoch %llu, seq %llu), oldest kept %llu, promised %llu, "
                "les %llu\n",
                when, CL.id[i], pg, (unsigned long long)pi.head_epoch,
                (unsigned long long)pi.applied, (unsigned long long)pi.oldest,
                (unsigned long long)pi.promised, (unsigned long long)pi.les);
}

/* node_verify, waiting (at most ms) while node i answers TS_EBUSY (it is still recovering the
 * PG and serves nothing of it yet). *waited gets the milliseconds waited. */
static int node_verify_wait(int i, const char *ds, uint32_t shard, uint64_t seed, int ms,
                            int *waited)
{
    int rc;

    for (*waited = 0;; *waited += 50) {
        rc = node_verify(i, ds, shard, seed, NULL, 0, NULL);
        if (rc != TS_EBUSY || *waited >= ms)
            return rc;
        msleep(50);
    }
}

/* Waits (at most 2 s) until process pid is stopped (state T in /proc/PID/stat). */
static int wait_stopped(pid_t pid)
{
    for (int waited = 0; waited < 2000; waited += 5) {
        char path[64], buf[512], *rp;
        FILE *f;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            if ((rp = strrchr(buf, ')')) && (rp[2] == 'T' || rp[2] == 't'))
                return 0;
        }
        msleep(5);
    }
    return -1;
}

/* Lines of node i's log (every run of it) that contain needle. */
static int log_count(int i, const char *needle)
{
    FILE *f = fopen(CL.node[i].log, "r");
    char line[2048];
    int n = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* The first PG (from 0) whose primary, once marked down, is followed by the second node of its
 * order: order[0..2] get the PG's order in m. UINT32_MAX if none. */
static uint32_t pg_with_successor(const struct ts_map *m, int order[3])
{
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        struct ts_map *down = ts_map_dup(m);
        int after[3], ok;
        if (ts_map_pg_order(m, pg, order, 3) != 3) {
            ts_map_free(down);
            continue;
        }
        down->nodes[order[0]].state = TS_NODE_DOWN;
        ok = ts_map_pg_order(down, pg, after, 3) == 2 && after[0] == order[1] &&
             after[1] == order[2];
        ts_map_free(down);
        if (ok)
            return pg;
    }
    return UINT32_MAX;
}

/* Puts n shards of ds into pg (the shard numbers from *next on, seeds base + shard), each of
 * which must be acknowledged; they are appended to ack[]. */
static void put_n_in_pg(const struct ts_map *m, const char *ds, uint32_t pg, uint32_t *next, int n,
                        uint64_t base, struct acked *ack, int *nack, const char *phase)
{
    char why[600];

    for (int k = 0; k < n; k++) {
        uint32_t sh[1];
        uint64_t seed;
        int rc;
        shards_in_pg(m, ds, pg, next, sh, 1);
        seed = base + sh[0];
        rc = put_retry(ds, sh[0], seed, why, sizeof(why));
        if (rc)
            fail_msg("%s: put %s/%u (PG %u) not acknowledged: %s", phase, ds, sh[0], pg, why);
        ack[(*nack)++] = (struct acked){sh[0], seed, phase};
    }
    fprintf(stderr, "  %s: %d shards put into PG %u, all acknowledged\n", phase, n, pg);
}

/* Every acknowledged shard through the client, and directly from each node in nodes[] (a
 * bounded wait while one answers TS_EBUSY): byte-exact. Returns the number of failures. */
static int verify_acked(const char *ds, const struct acked *ack, int nack, const int *nodes,
                        int nnodes)
{
    tessera_client *c = cluster_client();
    int bad = 0;

    for (int k = 0; k < nack; k++) {
        int rc = client_verify(c, ds, ack[k].shard, ack[k].seed);
        char line[512];
        snprintf(line, sizeof(line), "  %s/%u (acknowledged %s): client %s", ds, ack[k].shard,
                 ack[k].phase, rc ? ts_errname(rc) : "ok");
        if (rc) {
            bad++;
            fprintf(stderr, "    LOST through the client: %s\n", tessera_client_error(c));
        }
        for (int j = 0; j < nnodes; j++) {
            int waited,
                nrc = node_verify_wait(nodes[j], ds, ack[k].shard, ack[k].seed, 10000, &waited);
            snprintf(line + strlen(line), sizeof(line) - strlen(line), ", %s %s", CL.id[nodes[j]],
                     nrc ? ts_errname(nrc) : "ok");
            if (waited)
                snprintf(line + strlen(line), sizeof(line) - strlen(line), " (after %d ms busy)",
                         waited);
            bad += nrc != 0;
        }
        fprintf(stderr, "%s\n", line);
    }
    tessera_client_close(c);
    return bad;
}

/*
 * 4a. A primary is away while its PG takes more writes than the others keep in their logs
 * (--pg-log-keep 4): on its return (marked up, primary again by placement) it peers, pulls from
 * a node with the newest head, and that node finds its position trimmed: it backfills it from
 * the PG's shards. Every acknowledged shard must then be on it, and it must take writes.
 */
static void test_backfill_of_victims_pgs(void **state)
{
    static const char *const extra[] = {"--pg-log-keep", "4", NULL};
    const char *ds = "bf";
    struct acked ack[32];
    int nack = 0, P, NP, order[3], bad, others[2], nothers = 0, backfilled = 0;
    uint32_t pg = 0, next = 0;
    uint64_t e1, e2;
    struct pginfo pinfo, pi;
    struct ts_map *m, *m1;
    tessera_client *c;
    char needle[128];

    (void)state;
    assert_int_equal(start_cluster_with(3, NULL, 8, extra), 0);
    c = cluster_client();
    mkds(c, ds, 3, 0, 2);
    tessera_client_close(c);
    m = newest_map(NULL);
    assert_non_null(m);
    assert_int_equal(ts_map_pg_order(m, pg, order, 3), 3);
    P = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    for (int i = 0; i < CL.n; i++)
        if (i != P)
            others[nothers++] = i;
    fprintf(stderr, "  PG %u: primary %s, core replicas %s %s (epoch %llu), pg_log_keep 4\n", pg,
            CL.id[P], m->nodes[order[1]].id, m->nodes[order[2]].id, (unsigned long long)m->epoch);

    put_n_in_pg(m, ds, pg, &next, 3, 500, ack, &nack, "all up");
    assert_int_equal(node_pg_info(P, pg, &pinfo), 0);
    fprintf(stderr, "  %s's log of PG %u ends at (epoch %llu, seq %llu)\n", CL.id[P], pg,
            (unsigned long long)pinfo.head_epoch, (unsigned long long)pinfo.applied);

    tsd_kill9(&CL.node[P]);
    assert_int_equal(failover(pg, &e1), 0);
    assert_int_equal(wait_epoch_all(e1, 10000), 0);
    m1 = newest_map(NULL);
    assert_non_null(m1);
    NP = primary_of(m1, pg);
    fprintf(stderr, "  kill -9 %s; PG %u failed over: epoch %llu, primary %s\n", CL.id[P], pg,
            (unsigned long long)e1, NP >= 0 ? CL.id[NP] : "none");
    assert_true(NP >= 0 && NP != P);
    put_n_in_pg(m1, ds, pg, &next, 12, 500, ack, &nack, "primary down");

    /* Logs are trimmed once a second: wait until both remaining nodes dropped the entry after
     * P's position (then whichever P pulls from must backfill it). */
    for (int waited = 0;; waited += 50) {
        int trimmed = 0;
        for (int j = 0; j < nothers; j++)
            trimmed += node_pg_info(others[j], pg, &pi) == 0 && pi.oldest > pinfo.applied + 1;
        if (trimmed == nothers)
            break;
        if (waited >= 5000)
            fail_msg("the logs of PG %u were not trimmed past seq %llu within 5 s", pg,
                     (unsigned long long)pinfo.applied + 1);
        msleep(50);
    }
    for (int j = 0; j < nothers; j++)
        print_pg_info("trimmed", others[j], pg);

    assert_int_equal(tsd_start(&CL.node[P], NULL), 0);
    e2 = mark_up(P);
    ts_map_free(m1);
    m1 = newest_map(NULL);
    assert_non_null(m1);
    fprintf(stderr, "  %s restarted and marked up: epoch %llu, PG %u primary %s\n", CL.id[P],
            (unsigned long long)e2, pg, primary_of(m1, pg) >= 0 ? CL.id[primary_of(m1, pg)] : "-");
    assert_int_equal(primary_of(m1, pg), P);

    {
        int nodes[1] = {P};
        bad = verify_acked(ds, ack, nack, nodes, 1);
    }
    print_pg_info("after the return", P, pg);
    /* Evidence of the backfill: the node P pulled from logs it. */
    snprintf(needle, sizeof(needle), "PG %u: backfill of %s done", pg, CL.id[P]);
    for (int j = 0; j < nothers; j++) {
        int n = log_count(others[j], needle);
        if (n)
            fprintf(stderr, "  %s's log: \"%s\" (%d times)\n", CL.id[others[j]], needle, n);
        backfilled += n;
    }
    if (bad)
        fail_msg("%d reads of acknowledged shards failed or differed (client or %s directly)", bad,
                 CL.id[P]);
    if (!backfilled)
        fail_msg("NOT EXERCISED: no node logged \"%s\": %s was not backfilled", needle, CL.id[P]);

    /* P leads the PG again and takes writes. */
    {
        char why[600];
        uint32_t sh[1];
        int rc, waited;
        shards_in_pg(m1, ds, pg, &next, sh, 1);
        rc = put_retry(ds, sh[0], 900 + sh[0], why, sizeof(why));
        fprintf(stderr, "  put %s/%u with %s primary again: %s%s\n", ds, sh[0], CL.id[P],
                rc ? "NOT acknowledged: " : "acknowledged", rc ? why : "");
        assert_int_equal(rc, 0);
        rc = node_verify_wait(P, ds, sh[0], 900 + sh[0], 10000, &waited);
        fprintf(stderr, "  %s/%u on %s: %s\n", ds, sh[0], CL.id[P], rc ? ts_errname(rc) : "ok");
        assert_int_equal(rc, 0);
    }
    ts_map_free(m1);
    ts_map_free(m);
    test_passed = 1;
}

/*
 * 4b. A replica (R1) misses writes while it is down but is never marked down; it returns, then
 * the primary P dies and the PG fails over: R1, next in placement order, is the new primary
 * but is behind R2. It must pull from R2 before it takes writes (or serves reads).
 */
static void test_replica_ahead_of_new_primary(void **state)
{
    const char *ds = "ahead";
    struct acked ack[16];
    int nack = 0, P, R1, R2, order[3], bad, nodes[2];
    uint32_t pg, next = 0;
    uint64_t e1;
    struct pginfo i1, i2;
    struct ts_map *m, *m1;
    tessera_client *c;

    (void)state;
    assert_int_equal(start_cluster(3, NULL, 8), 0);
    c = cluster_client();
    mkds(c, ds, 3, 0, 2);
    tessera_client_close(c);
    m = newest_map(NULL);
    assert_non_null(m);
    pg = pg_with_successor(m, order);
    assert_true(pg != UINT32_MAX);
    P = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    R1 = tsd_cluster_find(&CL, m->nodes[order[1]].id);
    R2 = tsd_cluster_find(&CL, m->nodes[order[2]].id);
    fprintf(stderr, "  PG %u at epoch %llu: order %s (P) %s (R1) %s (R2)\n", pg,
            (unsigned long long)m->epoch, CL.id[P], CL.id[R1], CL.id[R2]);

    put_n_in_pg(m, ds, pg, &next, 2, 700, ack, &nack, "all up");
    tsd_kill9(&CL.node[R1]);
    fprintf(stderr, "  kill -9 %s (R1; not marked down)\n", CL.id[R1]);
    put_n_in_pg(m, ds, pg, &next, 4, 700, ack, &nack, "R1 down");
    tsd_kill9(&CL.node[P]);
    fprintf(stderr, "  kill -9 %s (P)\n", CL.id[P]);
    assert_int_equal(tsd_start(&CL.node[R1], NULL), 0);
    fprintf(stderr, "  %s (R1) restarted\n", CL.id[R1]);
    assert_int_equal(node_pg_info(R1, pg, &i1), 0);
    assert_int_equal(node_pg_info(R2, pg, &i2), 0);
    fprintf(stderr, "  heads before the failover: %s (R1) (%llu, %llu), %s (R2) (%llu, %llu)\n",
            CL.id[R1], (unsigned long long)i1.head_epoch, (unsigned long long)i1.applied, CL.id[R2],
            (unsigned long long)i2.head_epoch, (unsigned long long)i2.applied);
    if (i1.applied >= i2.applied)
        fail_msg("NOT EXERCISED: %s (R1) is not behind %s (R2) before the failover", CL.id[R1],
                 CL.id[R2]);

    assert_int_equal(failover(pg, &e1), 0);
    assert_int_equal(wait_epoch_all(e1, 10000), 0);
    m1 = newest_map(NULL);
    assert_non_null(m1);
    fprintf(stderr, "  PG %u failed over: epoch %llu, primary %s\n", pg, (unsigned long long)e1,
            primary_of(m1, pg) >= 0 ? CL.id[primary_of(m1, pg)] : "none");
    assert_int_equal(primary_of(m1, pg), R1);

    nodes[0] = R1;
    nodes[1] = R2;
    bad = verify_acked(ds, ack, nack, nodes, 2);
    print_pg_info("after the failover", R1, pg);
    {
        char needle[128];
        snprintf(needle, sizeof(needle), "PG %u: %s pulls our log", pg, CL.id[R1]);
        fprintf(stderr, "  %s's log: \"%s\" %d times\n", CL.id[R2], needle, log_count(R2, needle));
    }
    if (bad)
        fail_msg("%d reads of acknowledged shards failed or differed (client, %s or %s)", bad,
                 CL.id[R1], CL.id[R2]);

    /* The new primary takes writes; they land on both. */
    {
        char why[600];
        uint32_t sh[1];
        int rc, rc1, rc2, w1, w2;
        shards_in_pg(m1, ds, pg, &next, sh, 1);
        rc = put_retry(ds, sh[0], 700 + sh[0], why, sizeof(why));
        fprintf(stderr, "  put %s/%u with %s primary: %s%s\n", ds, sh[0], CL.id[R1],
                rc ? "NOT acknowledged: " : "acknowledged", rc ? why : "");
        assert_int_equal(rc, 0);
        rc1 = node_verify_wait(R1, ds, sh[0], 700 + sh[0], 10000, &w1);
        rc2 = node_verify_wait(R2, ds, sh[0], 700 + sh[0], 10000, &w2);
        fprintf(stderr, "  %s/%u on %s: %s, on %s: %s\n", ds, sh[0], CL.id[R1],
                rc1 ? ts_errname(rc1) : "ok", CL.id[R2], rc2 ? ts_errname(rc2) : "ok");
        assert_int_equal(rc1, 0);
        assert_int_equal(rc2, 0);
    }
    ts_map_free(m1);
    ts_map_free(m);
    test_passed = 1;
}

/*
 * 4c. The primary P seals a shard X while both other replicas are paused: the seal is in P's
 * log only and is not acknowledged. P dies, the paused replicas are killed and restarted (see
 * below why not resumed); the PG fails over to R1, whose new entries reuse X's sequence number
 * at a newer epoch. When P returns and is marked up it peers, finds R1's
 * head newer and pulls: R1 rolls P back past X's divergent entry (X deleted on P) and pushes
 * the real entries. Nothing acknowledged may be lost, X must not be served anywhere, and a put
 * of X again succeeds.
 */
static void test_divergent_log_rolled_back(void **state)
{
    static const char *const extra[] = {"--peer-timeout-ms", "500", NULL};
    const char *ds = "div";
    struct acked ack[16];
    int nack = 0, P, R1, R2, order[3], bad, fd, rc_w, rc_s, served = 0, nodes[3];
    uint32_t pg, next = 0, X;
    uint64_t e1, e2, t0;
    uint8_t data[T2_LEN];
    struct pginfo ip, i1;
    struct ts_map *m, *m1;
    tessera_client *c;
    char msg[512], needle[128];

    (void)state;
    assert_int_equal(start_cluster_with(3, NULL, 8, extra), 0);
    c = cluster_client();
    mkds(c, ds, 3, 0, 2);
    tessera_client_close(c);
    m = newest_map(NULL);
    assert_non_null(m);
    pg = pg_with_successor(m, order);
    assert_true(pg != UINT32_MAX);
    P = tsd_cluster_find(&CL, m->nodes[order[0]].id);
    R1 = tsd_cluster_find(&CL, m->nodes[order[1]].id);
    R2 = tsd_cluster_find(&CL, m->nodes[order[2]].id);
    fprintf(stderr, "  PG %u at epoch %llu: order %s (P) %s (R1) %s (R2), peer timeout 500 ms\n",
            pg, (unsigned long long)m->epoch, CL.id[P], CL.id[R1], CL.id[R2]);
    put_n_in_pg(m, ds, pg, &next, 2, 800, ack, &nack, "all up");

    /* X's one chunk reaches all three; its seal only P's log. */
    {
        uint32_t sh[1];
        shards_in_pg(m, ds, pg, &next, sh, 1);
        X = sh[0];
    }
    fill(data, sizeof(data), 4545);
    fd = raw_connect_as(CL.node[P].tls_addr, "writer");
    assert_true(fd >= 0);
    rc_w = raw_shard_write(fd, m->epoch, ds, X, data, msg, sizeof(msg));
    fprintf(stderr, "  SHARD_WRITE %s/%u (X) chunk 0 to %s: %s%s%s\n", ds, X, CL.id[P],
            rc_w ? ts_errname(rc_w) : "ok", rc_w ? ": " : "", rc_w ? msg : "");
    assert_int_equal(rc_w, 0);
    assert_int_equal(kill(CL.node[R1].pid, SIGSTOP), 0);
    assert_int_equal(kill(CL.node[R2].pid, SIGSTOP), 0);
    assert_int_equal(wait_stopped(CL.node[R1].pid), 0);
    assert_int_equal(wait_stopped(CL.node[R2].pid), 0);
    t0 = ts_now_mono_ns();
    rc_s = raw_shard_seal(fd, m->epoch, ds, X, data, msg, sizeof(msg));
    raw_close(fd);
    fprintf(stderr, "  %s and %s paused; SHARD_SEAL %s/%u (X) to %s: %s%s%s (%.1f s)\n", CL.id[R1],
            CL.id[R2], ds, X, CL.id[P], rc_s ? ts_errname(rc_s) : "ok (ACKNOWLEDGED)",
            rc_s ? ": " : "", rc_s ? msg : "", (double)(ts_now_mono_ns() - t0) / 1e9);
    print_pg_info("X sealed on P only", P, pg);
    assert_int_equal(node_pg_info(P, pg, &ip), 0);
    tsd_kill9(&CL.node[P]);
    fprintf(stderr, "  kill -9 %s (P)\n", CL.id[P]);
    if (rc_s == 0) {
        kill(CL.node[R1].pid, SIGCONT);
        kill(CL.node[R2].pid, SIGCONT);
        fail_msg("%s acknowledged the seal of %s/%u while both other core replicas were paused "
                 "(min_core 2)",
                 CL.id[P], ds, X);
    }
    /* Not SIGCONT: P's REPL_SEAL of X waits in their sockets' receive buffers, and resumed they
     * would apply it (at epoch E, before any newer primary fenced it) -- X would then be on all
     * three, a legitimate end of a failed seal, but no divergence. Killed while paused, they
     * lose those bytes (as in a power loss of both); restarted, they hold X's chunk but not its
     * seal. */
    tsd_kill9(&CL.node[R1]);
    tsd_kill9(&CL.node[R2]);
    assert_int_equal(tsd_start(&CL.node[R1], NULL), 0);
    assert_int_equal(tsd_start(&CL.node[R2], NULL), 0);
    fprintf(stderr, "  kill -9 %s and %s (paused), restarted\n", CL.id[R1], CL.id[R2]);
    print_pg_info("before the failover", R1, pg);
    print_pg_info("before the failover", R2, pg);
    for (int j = 0; j < 2; j++) {
        struct pginfo pi;
        int r = j ? R2 : R1;
        assert_int_equal(node_pg_info(r, pg, &pi), 0);
        if (pi.applied >= ip.applied)
            fail_msg("NOT EXERCISED: %s holds PG %u up to seq %llu: X's entry (seq %llu) is not "
                     "on P only",
                     CL.id[r], pg, (unsigned long long)pi.applied, (unsigned long long)ip.applied);
    }

    assert_int_equal(failover(pg, &e1), 0);
    assert_int_equal(wait_epoch_all(e1, 10000), 0);
    m1 = newest_map(NULL);
    assert_non_null(m1);
    fprintf(stderr, "  PG %u failed over: epoch %llu, primary %s\n", pg, (unsigned long long)e1,
            primary_of(m1, pg) >= 0 ? CL.id[primary_of(m1, pg)] : "none");
    assert_int_equal(primary_of(m1, pg), R1);
    put_n_in_pg(m1, ds, pg, &next, 3, 800, ack, &nack, "P down");
    assert_int_equal(node_pg_info(R1, pg, &i1), 0);
    print_pg_info("after the puts", R1, pg);
    if (i1.head_epoch <= ip.head_epoch || i1.applied < ip.applied)
        fail_msg("NOT EXERCISED: %s's head (%llu, %llu) does not replace X's entry (%llu, %llu) "
                 "on %s",
                 CL.id[R1], (unsigned long long)i1.head_epoch, (unsigned long long)i1.applied,
                 (unsigned long long)ip.head_epoch, (unsigned long long)ip.applied, CL.id[P]);

    assert_int_equal(tsd_start(&CL.node[P], NULL), 0);
    e2 = mark_up(P);
    ts_map_free(m1);
    m1 = newest_map(NULL);
    assert_non_null(m1);
    fprintf(stderr, "  %s restarted and marked up: epoch %llu, PG %u primary %s\n", CL.id[P],
            (unsigned long long)e2, pg, primary_of(m1, pg) >= 0 ? CL.id[primary_of(m1, pg)] : "-");
    assert_int_equal(primary_of(m1, pg), P);

    nodes[0] = P;
    bad = verify_acked(ds, ack, nack, nodes, 1);
    print_pg_info("after the return", P, pg);

    /* X was never acknowledged: nobody serves it (after P confirmed itself, so that P's
     * answer is about its log, not "still recovering"). */
    c = cluster_client();
    {
        uint8_t buf[T2_LEN];
        size_t got = 0;
        int rc = tessera_read(c, ds, X, 0, T2_LEN, buf, &got);
        fprintf(stderr, "  %s/%u (X) through the client: %s\n", ds, X,
                rc ? ts_errname(rc) : "SERVED");
        served += rc == 0;
    }
    tessera_client_close(c);
    nodes[1] = R1;
    nodes[2] = R2;
    for (int j = 0; j < 3; j++) {
        uint8_t *buf = malloc(SLEN);
        size_t got;
        int rc = raw_read(CL.node[nodes[j]].addr, ds, X, buf, &got);
        fprintf(stderr, "  %s/%u (X) on %s: %s\n", ds, X, CL.id[nodes[j]],
                rc ? ts_errname(rc) : "SERVED as complete");
        served += !not_claimed(rc);
        free(buf);
    }
    snprintf(needle, sizeof(needle), "PG %u: log rolled back to", pg);
    fprintf(stderr, "  %s's log: \"%s\" %d times\n", CL.id[P], needle, log_count(P, needle));
    if (bad)
        fail_msg("%d reads of acknowledged shards failed or differed (client or %s directly)", bad,
                 CL.id[P]);
    if (served)
        fail_msg("%s/%u (X, never acknowledged) is served by %d of client/nodes", ds, X, served);
    if (!log_count(P, needle))
        fail_msg("NOT EXERCISED: %s did not log \"%s\"", CL.id[P], needle);

    /* X can be written again. */
    {
        uint8_t back[T2_LEN];
        size_t got = 0;
        int rc = TS_EUNAVAIL;
        for (int t = 0; t < PUT_TRIES && rc; t++) {
            c = open_client_timeout(PUT_TIMEOUT_MS);
            assert_non_null(c);
            rc = tessera_put(c, ds, X, data, T2_LEN, NULL, 0);
            if (rc)
                snprintf(msg, sizeof(msg), "%s: %s", ts_errname(rc), tessera_client_error(c));
            if (rc == 0) {
                rc = tessera_read(c, ds, X, 0, T2_LEN, back, &got);
                if (rc == 0 && (got != T2_LEN || memcmp(back, data, T2_LEN)))
                    rc = TS_ECORRUPT;
                if (rc)
                    fail_msg("%s/%u (X) put again, then read back: %s", ds, X, ts_errname(rc));
            }
            tessera_client_close(c);
            if (rc)
                msleep(PUT_PAUSE_MS);
        }
        fprintf(stderr, "  put %s/%u (X) again: %s%s\n", ds, X,
                rc ? "NOT acknowledged: " : "acknowledged, reads back", rc ? msg : "");
        assert_int_equal(rc, 0);
    }
    ts_map_free(m1);
    ts_map_free(m);
    test_passed = 1;
}

/* Flips bytes in the middle of the largest WAL file (*.log) of a stopped node's store. Returns
 * the bytes flipped (0 if no WAL file was found). */
static int damage_wal(const char *datadir)
{
    char path[700], best[700] = "";
    off_t best_size = 0;
    struct dirent *e;
    DIR *d = opendir(datadir);
    int fd, flipped = 0;

    if (!d)
        return 0;
    while ((e = readdir(d))) {
        struct stat st;
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".log"))
            continue;
        snprintf(path, sizeof(path), "%s/%s", datadir, e->d_name);
        if (stat(path, &st) == 0 && st.st_size > best_size) {
            best_size = st.st_size;
            snprintf(best, sizeof(best), "%s", path);
        }
    }
    closedir(d);
    if (!best[0] || best_size < 4096 || (fd = open(best, O_RDWR)) < 0)
        return 0;
    for (off_t at = best_size / 4; at < best_size / 4 + 64; at += 8) {
        uint8_t b;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= 0xff;
            flipped += pwrite(fd, &b, 1, at) == 1;
        }
    }
    fsync(fd);
    close(fd);
    fprintf(stderr, "  flipped %d bytes a quarter into %s (%lld bytes)\n", flipped, best,
            (long long)best_size);
    return flipped;
}

/*
 * A replica whose WAL was damaged while it was stopped: RocksDB brings it back short of writes
 * it had acknowledged. It must not serve what it lost, and must get every acknowledged shard
 * back from its peers (its primary compares logs and pushes what is missing).
 */
static void test_damaged_wal_recovers_from_peers(void **state)
{
    const char *ds = "wal";
    uint32_t pg = 0, shard = 0, sh[8];
    int P, R1, R2, waited;
    struct ts_map *m;
    struct pginfo before, after;
    char why[600];

    (void)state;
    m = pg_cluster(ds, pg, &P, &R1, &R2);
    shards_in_pg(m, ds, pg, &shard, sh, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(put_retry(ds, sh[i], 300 + (uint64_t)i, why, sizeof(why)), 0);
    assert_int_equal(wait_settled(), 0);
    assert_int_equal(node_pg_info(R1, pg, &before), 0);
    /* kill -9, not a clean stop: a clean stop flushes the memtables and empties the WAL, and
     * the test would have nothing to damage (it passed that way, testing nothing, after the
     * store's close began to flush). */
    tsd_kill9(&CL.node[R1]);
    {
        int flipped = damage_wal(CL.node[R1].data);
        if (!flipped)
            fail_msg("no WAL file of %s to damage: the test would test nothing", CL.id[R1]);
    }
    {
        int rc = tsd_start(&CL.node[R1], NULL);
        fprintf(stderr, "  %s restarted on the damaged WAL: %s\n", CL.id[R1],
                rc ? "it did not start" : "up");
        assert_int_equal(rc, 0);
        /* It says so: in its log and in STATUS (disk.wal_damage_found_ns). */
        assert_true(status_has(R1, "wal_damage_found_ns"));
        assert_false(status_has(R1, "\"wal_damage_found_ns\": 0,"));
        assert_false(status_has(R1, "\"wal_damage_found_ns\": 0 "));
        if (node_pg_info(R1, pg, &after) == 0)
            fprintf(stderr, "  PG %u on %s: head seq %llu before, %llu after the restart\n", pg,
                    CL.id[R1], (unsigned long long)before.applied,
                    (unsigned long long)after.applied);
        /* Whatever it lost comes back from its peers before it serves the PG. */
        for (int i = 0; i < 8; i++) {
            rc = node_verify_wait(R1, ds, sh[i], 300 + (uint64_t)i, 20000, &waited);
            if (rc)
                fprintf(stderr, "  %s/%u on %s: %s\n", ds, sh[i], CL.id[R1], ts_errname(rc));
            assert_int_equal(rc, 0);
        }
        assert_int_equal(wait_settled(), 0);
    }
    ts_map_free(m);
    test_passed = 1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_return_then_second_failover, teardown),
        cmocka_unit_test_teardown(test_partial_map_push, teardown),
        cmocka_unit_test_teardown(test_partial_map_push_mid_upload, teardown),
        cmocka_unit_test_teardown(test_seeded_rounds, teardown),
        cmocka_unit_test_teardown(test_backfill_of_victims_pgs, teardown),
        cmocka_unit_test_teardown(test_replica_ahead_of_new_primary, teardown),
        cmocka_unit_test_teardown(test_divergent_log_rolled_back, teardown),
        cmocka_unit_test_teardown(test_damaged_wal_recovers_from_peers, teardown),
    };
    const char *filter = getenv("TESSERA_TEST_FILTER");

    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("durability", tests, NULL, NULL);
}
