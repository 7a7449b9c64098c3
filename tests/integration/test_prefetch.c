/*
 * Plan-driven prefetch against a real tesserad (issue 32): hinted chunks are read ahead into the
 * cache and the reads that follow are cache hits; a connection flooding hints gets no more than
 * its bound (another connection still gets its own); a chunk damaged on disk is never cached by
 * a prefetch (its read still fails) and one damaged after its prefetch is served from the
 * verified copy and still found by scrub; hints of nothing cost nothing; the plan reader hints
 * on its own and reads every byte right.
 */
#include "harness.h"
#include "ts_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "client_internal.h"
#include "tessera/reader.h"
#include "tessera/tessera.h"
#include "ts_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (1u << 20)
#define SHARD (4 * CHUNK)
#define NSHARDS 8
#define CONN_MB 4 /* storage.prefetch_conn_mb: 4 chunks per connection */

static struct tsd_proc D;
static const char *const ARGS[] = {"--metrics-listen",
                                   "127.0.0.1:0",
                                   "--storage-cache-mb",
                                   "128",
                                   "--storage-prefetch-mb",
                                   "16",
                                   "--storage-prefetch-conn-mb",
                                   "4",
                                   NULL};

static int group_setup(void **state)
{
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};
    tessera_client *c;
    int rc = 0;

    if (tsd_start(&D, ARGS) != 0)
        return -1;
    c = tsd_connect(&D);
    if (!c || tessera_dataset_create(c, "pf", &p) != 0)
        return -1;
    for (uint32_t s = 0; s < NSHARDS && !rc; s++)
        rc = tsd_put_pattern(c, "pf", s, SHARD, 100 + s);
    tessera_client_close(c);
    return rc ? -1 : 0;
}

static int group_teardown(void **state)
{
    int rc = tsd_stop(&D);

    tsd_cleanup(&D);
    return rc == 0 ? 0 : -1;
}

static double metric(const char *name)
{
    double v = tsd_metric(&D, name);
    assert_true(v >= 0);
    return v;
}

/* Waits until the prefetch queue is empty (every queued chunk read, skipped or failed). */
static void wait_queue_empty(void)
{
    for (int t = 0; t < 200; t++) {
        if (metric("tessera_prefetch_queued_bytes") == 0)
            return;
        usleep(50000);
    }
    fail_msg("the prefetch queue did not empty");
}

static struct ts_hint_result hint(tessera_client *c, const struct ts_readv *v, size_t n, int want)
{
    struct ts_hint_result res = {0, 0, 0, n};
    assert_int_equal(ts_client_hint(c, "pf", v, n, &res), want);
    return res;
}

/* Reads [off, off+len) of a shard and checks every byte. */
static void read_check(tessera_client *c, uint32_t shard, uint64_t off, size_t len)
{
    uint8_t *got = malloc(len), *want = malloc(len);
    size_t n = 0;

    assert_int_equal(tessera_read(c, "pf", shard, off, len, got, &n), 0);
    assert_int_equal(n, len);
    ts_test_fill(want, len, 100 + shard, off);
    assert_memory_equal(got, want, len);
    free(got);
    free(want);
}

/* Four chunks hinted are read ahead; 100 KiB records in them are then cache hits: no chunk and
 * no piece read from the store. */
static void test_hints_obeyed(void **state)
{
    tessera_client *c = tsd_connect(&D);
    struct ts_readv v[4];
    struct ts_hint_result res;
    double rd0, chunks0, pieces0, hits0;

    for (int i = 0; i < 4; i++)
        v[i] = (struct ts_readv){0, (uint64_t)i * CHUNK + 5000, 100 << 10, NULL, 0, 0};
    rd0 = metric("tessera_prefetch_read_total");
    res = hint(c, v, 4, 0);
    assert_int_equal(res.queued, 4);
    assert_int_equal(res.dropped, 0);
    wait_queue_empty();
    assert_int_equal(metric("tessera_prefetch_read_total") - rd0, 4);
    chunks0 = metric("tessera_store_chunk_reads_total");
    pieces0 = metric("tessera_store_piece_reads_total");
    hits0 = metric("tessera_cache_hits_total");
    for (int i = 0; i < 4; i++)
        read_check(c, 0, v[i].off, v[i].len);
    assert_int_equal(metric("tessera_store_chunk_reads_total"), chunks0);
    assert_int_equal(metric("tessera_store_piece_reads_total"), pieces0);
    assert_true(metric("tessera_cache_hits_total") >= hits0 + 4);
    /* Without a hint, a 100 KiB record of a chunk not cached is read by sub-blocks. */
    read_check(c, 3, 2 * CHUNK + 7, 100 << 10);
    assert_int_equal(metric("tessera_store_piece_reads_total"), pieces0 + 1);
    assert_int_equal(metric("tessera_store_chunk_reads_total"), chunks0);
    tessera_client_close(c);
}

/* Chunks the prefetch thread has finished with: read, skipped or failed. */
static double prefetch_done(void)
{
    return metric("tessera_prefetch_read_total") + metric("tessera_prefetch_skipped_total") +
           metric("tessera_prefetch_failed_total");
}

/* One connection hints every chunk of shards 1-4 and 7 (20 MiB, none cached; 5 and 6 are left
 * uncached for test_prefetch_never_serves_unverified) in one HINT: its bound
 * (4 MiB in the queue at once) takes 4, plus one for each chunk the prefetch thread finished
 * while the HINT was taken; from the first chunk dropped on, the rest are dropped. Another
 * connection's hint is still taken. */
static void test_flood_bounded(void **state)
{
    static const uint32_t shards[] = {1, 2, 3, 4, 7};
    enum { N = 5 * 4 };
    tessera_client *a = tsd_connect(&D), *b = tsd_connect(&D);
    struct ts_readv v[N];
    struct ts_hint_result res;
    double dropped0 = metric("tessera_prefetch_dropped_total"), done0 = prefetch_done(), done;

    for (uint32_t i = 0; i < N; i++)
        v[i] = (struct ts_readv){shards[i / 4], (uint64_t)(i % 4) * CHUNK, CHUNK, NULL, 0, 0};
    res = hint(a, v, N, 0);
    /* Finished by now is at least what finished before the reply: the bound's allowance. */
    done = prefetch_done() - done0;
    print_message("flood: %u queued, %.0f finished meanwhile\n", (unsigned)res.queued, done);
    assert_true(res.queued >= CONN_MB);
    assert_true(res.queued <= CONN_MB + done);
    assert_int_equal(res.queued + res.dropped, N);
    assert_int_equal(res.first_dropped, res.queued); /* one chunk a range: where it filled */
    assert_true(metric("tessera_prefetch_dropped_total") >= dropped0 + res.dropped);
    res = hint(b, &v[N - 1], 1, 0);
    assert_int_equal(res.queued, 1);
    wait_queue_empty();
    tessera_client_close(a);
    tessera_client_close(b);
}

/* Hints of nothing: an unknown dataset is refused (the connection goes on), a shard that does
 * not exist and a range past a shard's end are queued and skipped: nothing read, nothing
 * failed. */
static void test_hints_of_nothing(void **state)
{
    tessera_client *c = tsd_connect(&D);
    struct ts_readv v[2] = {{99, 0, 100, NULL, 0, 0}, {1, 40 * CHUNK, 100, NULL, 0, 0}};
    struct ts_hint_result res = {0, 0, 0, 1};
    double skipped0 = metric("tessera_prefetch_skipped_total");
    double failed0 = metric("tessera_prefetch_failed_total");
    double rd0 = metric("tessera_prefetch_read_total");

    assert_int_equal(ts_client_hint(c, "no-such-dataset", v, 1, &res), TS_ENOENT);
    res = hint(c, v, 2, 0);
    assert_int_equal(res.queued, 2);
    wait_queue_empty();
    assert_int_equal(metric("tessera_prefetch_skipped_total"), skipped0 + 2);
    assert_int_equal(metric("tessera_prefetch_failed_total"), failed0);
    assert_int_equal(metric("tessera_prefetch_read_total"), rd0);
    read_check(c, 1, 0, 1000); /* the connection is fine */
    tessera_client_close(c);
}

/* The chunk file of a shard of "pf" in the running node's data directory. */
static void chunk_file(uint32_t shard, char *out, size_t cap)
{
    char dir[700], prefix[16];
    DIR *top, *d;
    struct dirent *e, *f;

    snprintf(dir, sizeof(dir), "%s/chunks", D.data);
    snprintf(prefix, sizeof(prefix), "%08x.", shard);
    out[0] = 0;
    top = opendir(dir);
    assert_non_null(top);
    while ((e = readdir(top)) != NULL) {
        char sub[1000];
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        d = opendir(sub);
        while (d && (f = readdir(d)) != NULL)
            if (!strncmp(f->d_name, prefix, 9))
                snprintf(out, cap, "%s/%s", sub, f->d_name);
        if (d)
            closedir(d);
    }
    closedir(top);
    assert_true(out[0] != 0);
}

static void flip(uint32_t shard, uint64_t at)
{
    char path[1400];

    chunk_file(shard, path, sizeof(path));
    ts_test_flip_file_byte(path, at);
}

/* A chunk damaged on disk before its prefetch: the prefetch fails its CRC and caches nothing;
 * the read fails (TS_ECORRUPT), never the bytes. One damaged after its prefetch: the verified
 * copy serves right bytes, and scrub (which reads the disk) still finds the damage. */
static void test_prefetch_never_serves_unverified(void **state)
{
    tessera_client *c = tsd_connect(&D);
    struct ts_readv v = {5, 2 * CHUNK + 10, 1000, NULL, 0, 0};
    struct ts_scrub_report rep;
    double failed0 = metric("tessera_prefetch_failed_total");
    uint8_t buf[1000];
    size_t n;

    flip(5, 2 * CHUNK + 500);
    assert_int_equal(hint(c, &v, 1, 0).queued, 1);
    wait_queue_empty();
    assert_int_equal(metric("tessera_prefetch_failed_total"), failed0 + 1);
    assert_int_equal(tessera_read(c, "pf", 5, 2 * CHUNK + 10, 1000, buf, &n), TS_ECORRUPT);
    flip(5, 2 * CHUNK + 500); /* back, for scrub below */

    v.shard = 6;
    v.off = CHUNK;
    assert_int_equal(hint(c, &v, 1, 0).queued, 1);
    wait_queue_empty();
    flip(6, CHUNK + 300);
    read_check(c, 6, CHUNK, CHUNK); /* the copy verified before the damage */
    memset(&rep, 0, sizeof(rep));
    assert_int_equal(tessera_scrub(c, "pf", &rep, NULL, 0), 0);
    assert_int_equal(rep.corrupt, 1);
    flip(6, CHUNK + 300);
    tessera_client_close(c);
}

/* The plan reader hints by itself: shard units, every byte right, hints sent and taken. */
static void test_reader_hints(void **state)
{
    struct tessera_opts co;
    struct tessera_reader_opts o;
    struct tessera_reader_stats st;
    struct tessera_unit u;
    tessera_reader *r;
    char err[512];
    uint8_t *want = malloc(SHARD);
    double queued0 = metric("tessera_prefetch_queued_total");
    int n = 0, rc;

    tessera_opts_init(&co);
    co.address = D.addr;
    tessera_reader_opts_init(&o);
    o.dataset = "pf";
    o.unit = TESSERA_UNIT_SHARD;
    o.window_units = 2;
    o.hint_bytes = 16 * CHUNK;
    assert_int_equal(tessera_reader_open(&r, &co, &o, err, sizeof(err)), 0);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        assert_int_equal(u.len, SHARD);
        ts_test_fill(want, SHARD, 100 + u.shard, 0);
        assert_memory_equal(u.data, want, SHARD);
        n++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, NSHARDS);
    tessera_reader_stats(r, &st);
    assert_true(st.hinted_units > 0);
    assert_true(st.hint_queued > 0);
    tessera_reader_close(r);
    assert_true(metric("tessera_prefetch_queued_total") > queued0);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hints_obeyed),
        cmocka_unit_test(test_flood_bounded),
        cmocka_unit_test(test_hints_of_nothing),
        cmocka_unit_test(test_prefetch_never_serves_unverified),
        cmocka_unit_test(test_reader_hints),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
