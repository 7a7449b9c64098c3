/*
 * A full disk, for real: tesserad's data directory on a small tmpfs this test mounts, with the
 * default durable `sync seal` (and once more with `sync always`). Puts go on until the filesystem
 * is full; the one that does not fit gets TS_ENOSPC with a message, the daemon stays up and serves
 * every acknowledged shard, a restart (SIGTERM and kill -9) on the nearly full disk works, and
 * writes work again once space returns, without a restart; `tessera drill disk-full` on a cluster
 * node so placed. Skips (77) where mounting is refused (not root).
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"

#include <errno.h>
#include <json-c/json.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define FS_MB 64
#define FILLER_MB 12
#define SHARD (3u << 20)

static char mnt[256], datadir[300], filler[300];
static struct tsd_proc P;
static const char *extra[] = {"--data", datadir, "--sync", "seal", NULL}; /* [3]: the policy */

static void fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(((i + seed * 131) * 2654435761u) >> 17);
}

static tessera_client *client(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tessera_opts_init(&o);
    o.address = P.addr;
    o.timeout_ms = 20000;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

static int put(tessera_client *c, uint32_t shard)
{
    uint8_t *buf = malloc(SHARD);
    int rc;

    fill(buf, SHARD, shard);
    rc = tessera_put(c, "full", shard, buf, SHARD, NULL, 0);
    free(buf);
    return rc;
}

static void verify(tessera_client *c, uint32_t shard)
{
    uint8_t *buf = malloc(SHARD), *want = malloc(SHARD);
    size_t got = 0;

    fill(want, SHARD, shard);
    assert_int_equal(tessera_read(c, "full", shard, 0, SHARD, buf, &got), 0);
    assert_int_equal(got, SHARD);
    assert_memory_equal(buf, want, SHARD);
    free(buf);
    free(want);
}

static int setup(void **state)
{
    char opts[64];
    int fd;

    snprintf(mnt, sizeof(mnt), "%s/tessera-full-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(mnt))
        return -1;
    snprintf(opts, sizeof(opts), "size=%dm", FS_MB);
    if (mount("tmpfs", mnt, "tmpfs", 0, opts) != 0) {
        fprintf(stderr,
                "SKIP: cannot mount a %d MiB tmpfs at %s (%s): this test needs root "
                "(CAP_SYS_ADMIN)\n",
                FS_MB, mnt, strerror(errno));
        rmdir(mnt);
        exit(77);
    }
    snprintf(datadir, sizeof(datadir), "%s/data", mnt);
    /* Another process's file on the same filesystem: removed later to give space back. */
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    fd = open(filler, O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || posix_fallocate(fd, 0, (off_t)FILLER_MB << 20) != 0)
        return -1;
    close(fd);
    return tsd_start(&P, extra);
}

/* The same with an fdatasync before every chunk's acknowledgement (restarts too; teardown
 * goes back to the default). */
static int setup_always(void **state)
{
    extra[3] = "always";
    return setup(state);
}

static int teardown(void **state)
{
    extra[3] = "seal";
    if (P.pid > 0)
        tsd_stop(&P);
    if (mnt[0]) {
        umount2(mnt, MNT_DETACH);
        rmdir(mnt);
    }
    tsd_cleanup(&P);
    return 0;
}

static void verify_all(tessera_client *c, const uint32_t *acked, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        verify(c, acked[i]);
}

static void test_full_disk(void **state)
{
    tessera_client *c = client();
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    uint32_t acked[128], n = 0, s = 0;
    int rc = 0, refusals = 0;

    assert_int_equal(tessera_dataset_create(c, "full", &p), 0);
    /* Fill it: puts are acknowledged until they do not fit. Flushes may give some room back
     * (a WAL goes once its memtable is in a file): keep putting until refused three times. */
    for (; s < 100 && refusals < 3; s++) {
        rc = put(c, s);
        if (rc == 0) {
            acked[n++] = s;
            continue;
        }
        if (!refusals)
            fprintf(stderr, "  %u shards of %u MiB acknowledged, then: %s: %s\n", n, SHARD >> 20,
                    ts_errname(rc), tessera_client_error(c));
        assert_int_equal(rc, TS_ENOSPC);
        assert_non_null(strstr(tessera_client_error(c), "no space"));
        refusals++;
        assert_true(tsd_alive(&P));
    }
    assert_int_equal(refusals, 3);
    assert_true(n >= 3);
    /* Still up and serving every acknowledged shard. */
    assert_true(tsd_alive(&P));
    verify_all(c, acked, n);
    tessera_client_close(c);

    /* A restart on the nearly full disk: clean stop, then kill -9. */
    assert_int_equal(tsd_stop(&P), 0);
    assert_int_equal(tsd_start(&P, extra), 0);
    c = client();
    verify_all(c, acked, n);
    tessera_client_close(c);
    tsd_kill9(&P);
    assert_int_equal(tsd_start(&P, extra), 0);
    c = client();
    verify_all(c, acked, n);

    /* Space returns (the other process's file goes): writes work again, no restart. */
    assert_int_equal(unlink(filler), 0);
    rc = TS_ENOSPC;
    for (int t = 0; t < 50 && rc == TS_ENOSPC; t++) {
        rc = put(c, 1000);
        if (rc == TS_ENOSPC)
            usleep(100 * 1000);
    }
    fprintf(stderr, "  after freeing %d MiB: %s\n", FILLER_MB, rc ? ts_errname(rc) : "put ok");
    assert_int_equal(rc, 0);
    verify(c, 1000);
    verify_all(c, acked, n);
    tessera_client_close(c);
    assert_true(tsd_alive(&P));
}

/*
 * A cluster with one full node: 3 nodes, core 3, min_core 2; n3's data directory is a small
 * tmpfs. Once n3 refuses chunks, puts of PGs where n3 is a replica keep being acknowledged by the
 * other two, those of PGs n3 leads fail cleanly with TS_ENOSPC, each within the client timeout
 * (never a hang), and every acknowledged shard reads back.
 */
static struct tsd_cluster cl;
static int cl_n3 = -1;

static int teardown_cluster(void **state)
{
    if (cl.n)
        tsd_cluster_stop(&cl);
    if (cl_n3 >= 0)
        umount2(cl.node[cl_n3].data, MNT_DETACH);
    return 0;
}

static void test_full_replica(void **state)
{
    static const char *const cx[] = {"--sync", "always", NULL};
    struct tessera_opts o;
    struct ts_dataset_policy p = {3, 0, 2, 1u << 20, 0, 0, 0, 0};
    tessera_client *c = NULL;
    uint32_t acked[128], n = 0;
    char opts[64];
    int n3, refused = 0;

    memset(&cl, 0, sizeof(cl));
    assert_int_equal(tsd_cluster_start(&cl, 3, NULL, 8, cx), 0);
    n3 = cl_n3 = tsd_cluster_find(&cl, "n3");
    /* n3 starts over on a 24 MiB filesystem (it holds nothing yet). */
    assert_int_equal(tsd_stop(&cl.node[n3]), 0);
    snprintf(opts, sizeof(opts), "size=24m");
    {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'/*", cl.node[n3].data);
        assert_int_equal(system(cmd), 0);
    }
    assert_int_equal(mount("tmpfs", cl.node[n3].data, "tmpfs", 0, opts), 0);
    assert_int_equal(tsd_start(&cl.node[n3], NULL), 0);
    tsd_client_opts(&o, &cl.node[0], "writer");
    o.timeout_ms = 20000;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    assert_int_equal(tessera_dataset_create(c, "rep", &p), 0);
    for (uint32_t s = 0; s < 24; s++) {
        uint8_t *buf = malloc(SHARD);
        uint64_t t0 = ts_now_mono_ns();
        int rc;
        fill(buf, SHARD, s + 77);
        rc = tessera_put(c, "rep", s, buf, SHARD, NULL, 0);
        free(buf);
        assert_true(ts_now_mono_ns() - t0 < 15ull * 1000000000); /* never a hang */
        if (rc == 0) {
            acked[n++] = s;
            continue;
        }
        /* Only where the full node itself leads the shard's PG (it cannot store the write it
         * was sent): a clean TS_ENOSPC from n3; where n3 is a replica, the others carry it. */
        fprintf(stderr, "  put rep/%u: %s: %.90s...\n", s, ts_errname(rc), tessera_client_error(c));
        assert_int_equal(rc, TS_ENOSPC);
        assert_true(strncmp(tessera_client_error(c), "n3:", 3) == 0);
    }
    {
        FILE *f = fopen(cl.node[n3].log, "r");
        char line[1024];
        while (f && fgets(line, sizeof(line), f))
            refused += strstr(line, "refusing writes") != NULL;
        if (f)
            fclose(f);
    }
    fprintf(stderr, "  %u of 24 puts acknowledged; n3 refused writes (%s)\n", n,
            refused ? "yes" : "no");
    assert_true(refused > 0); /* the full replica was exercised */
    assert_true(n >= 6);      /* the other two carried on where n3 is a replica */
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *buf = malloc(SHARD), *want = malloc(SHARD);
        size_t got = 0;
        fill(want, SHARD, acked[i] + 77);
        assert_int_equal(tessera_read(c, "rep", acked[i], 0, SHARD, buf, &got), 0);
        assert_memory_equal(buf, want, SHARD);
        free(buf);
        free(want);
    }
    tessera_client_close(c);
    assert_true(tsd_alive(&cl.node[n3]));
}

/*
 * `tessera drill disk-full` against a 3-node cluster whose n3 has its data on a 128 MiB tmpfs:
 * the drill refuses nodes on big filesystems and picks n3; it fills n3's filesystem below its
 * reserve while its load runs; nothing acknowledged is lost (nor missing from any core replica,
 * n3 included, read alone), reads never fail, writes come back.
 */
static void test_drill_full_node(void **state)
{
    static const char *const cx[] = {"--sync", "always", NULL};
    struct json_object *rep, *v;
    char cmd[2048], report[600];
    int n3, st;

    memset(&cl, 0, sizeof(cl));
    assert_int_equal(tsd_cluster_start(&cl, 3, NULL, 8, cx), 0);
    n3 = cl_n3 = tsd_cluster_find(&cl, "n3");
    assert_int_equal(tsd_stop(&cl.node[n3]), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'/*", cl.node[n3].data);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mount("tmpfs", cl.node[n3].data, "tmpfs", 0, "size=128m"), 0);
    assert_int_equal(tsd_start(&cl.node[n3], NULL), 0);
    snprintf(report, sizeof(report), "%s/drill-disk-full.json", cl.dir);
    snprintf(cmd, sizeof(cmd),
             "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s --timeout 20000 drill disk-full "
             "--duration 6 --report %s >&2",
             TESSERA_CLI_PATH, cl.tls_listen[0], test_cert("ca", "pem"), test_cert("admin", "pem"),
             test_cert("admin", "key"), report);
    st = system(cmd);
    rep = json_object_from_file(report);
    assert_non_null(rep);
    fprintf(stderr, "%s\n", json_object_to_json_string_ext(rep, JSON_C_TO_STRING_PRETTY));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_string_equal(json_object_get_string(json_object_object_get(rep, "node")), "n3");
#define NUM(k) (json_object_object_get_ex(rep, k, &v) ? json_object_get_double(v) : -1)
    assert_true(NUM("balloon_bytes") > 0);
    assert_true(NUM("acknowledged_writes") > 5);
    assert_true(NUM("acknowledged_writes_lost") == 0);
    assert_true(NUM("core_replica_shards_missing") == 0); /* n3 too holds every one, read alone */
    assert_true(NUM("reads_failed") == 0);
    assert_true(NUM("time_to_recover_s") >= 0 && NUM("time_to_recover_s") < 30);
#undef NUM
    json_object_put(rep);
    assert_true(tsd_alive(&cl.node[n3]));
}

static int setup_cluster(void **state)
{
    char probe[256];

    snprintf(probe, sizeof(probe), "%s/tessera-mnt-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(probe))
        return -1;
    if (mount("tmpfs", probe, "tmpfs", 0, "size=1m") != 0) {
        fprintf(stderr, "SKIP: cannot mount a tmpfs (%s): needs root (CAP_SYS_ADMIN)\n",
                strerror(errno));
        rmdir(probe);
        exit(77);
    }
    umount2(probe, MNT_DETACH);
    rmdir(probe);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup_always, teardown),
        cmocka_unit_test_setup_teardown(test_full_replica, setup_cluster, teardown_cluster),
        cmocka_unit_test_setup_teardown(test_drill_full_node, setup_cluster, teardown_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
