/*
 * tsplanread: a plan reader's throughput (include/tessera/reader.h) beside reading the same
 * records, in the same order, from local files in the page cache (docs/benchmarks.md,
 * "Plan reader").
 *
 *   tsplanread load    --addr A --name DS --dir DIR --size B [--total B] [--shards S]
 *       a dataset DS of fixed-size records (each shard with its record index), and the same
 *       bytes as local shard files DIR/shard-NNNNN (DIR/meta says the layout)
 *   tsplanread tessera --addr A --name DS --dir DIR [read options]
 *       rank 0 of 1 reads the plan with tessera_reader (record units), default options
 *       unless --connections/--depth/--window-units/--window-bytes say otherwise
 *   tsplanread local   --dir DIR [read options]
 *       the same plan (tessera_plan_new over the same units and options), record u read with
 *       pread from shard file u / per_shard at (u % per_shard) * size, one thread
 *
 * Read options: --shuffle none|global|window (none) --seed N (1) --epoch E (0, the first one)
 * --min-seconds S (0: one epoch) --warmup N (1) --verify --server-pid PID --label TEXT.
 * Both modes read whole epochs E, E+1, ... until at least --min-seconds passed, after --warmup
 * unmeasured epochs (which warm the page cache, or tesserad's caches), and touch every byte
 * they get (a 64-bit sum, printed). An epoch's time runs from the reader's open (tessera) or
 * the plan's creation (local) to its last record. stall_ns is the time the caller was blocked
 * waiting for data: in tessera_reader_next (the reader's stats), or in pread (local).
 *
 * --verify checks the warm-up epochs: tessera's records against the local files' bytes, byte
 * for byte, and its plan order against the local plan; the local files against the generator.
 *
 * Prints one JSON line on stdout, a summary on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tessera/reader.h>
#include <tessera/tessera.h>

#define BENCH_TOOL "tsplanread"
#include "bench_util.h"

#define MAX_SHARDS 4096
#define MAX_CORES 64

struct cfg {
    const char *mode;
    const char *addr;
    const char *name;
    const char *dir;
    const char *label;
    uint64_t size, total;
    uint32_t shards;
    int shuffle;
    uint64_t seed, epoch;
    double min_seconds;
    unsigned warmup;
    int verify;
    int server_pid;
    uint32_t connections, depth, window_units;
    uint64_t window_bytes;
    const char *tls_ca, *tls_cert, *tls_key; /* load into a cluster: a writer's certificate */
    unsigned core, min_core;                 /* load: the dataset's policy (1, 1) */
};

/* The layout of DIR (DIR/meta): nrec records of size bytes, per_shard in each of nshards. */
struct layout {
    uint64_t size, nrec;
    uint32_t nshards, per_shard;
    int fds[MAX_SHARDS];
};

/* What the measured epochs added up to. */
struct result {
    uint64_t records, bytes, epochs, sum;
    uint64_t ns, stall_ns, stalls, open_ns;
    uint64_t retries, reconnects, index_loads, ahead_max;
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the records: record r is `size` bytes of a splitmix64 stream seeded by r ---------------- */

static void rec_fill(uint64_t r, uint8_t *p, size_t n)
{
    uint64_t s = mix64(r * 0x2545f4914f6cdd1dull + 12345);
    size_t i;

    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v = mix64(s + i);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)mix64(s + i);
}

/* Touches every byte: the sum of its 64-bit words (the tail bytes one by one). */
static uint64_t touch(const uint8_t *p, size_t n)
{
    uint64_t a = 0, b = 0;
    size_t i;

    for (i = 0; i + 16 <= n; i += 16) {
        uint64_t x, y;
        memcpy(&x, p + i, 8);
        memcpy(&y, p + i + 8, 8);
        a += x;
        b += y;
    }
    for (; i < n; i++)
        a += p[i];
    return a + b;
}

/* ---- CPU accounting, as tsload does it ------------------------------------------------------ */

struct sample {
    double server_s, self_s, busy_s;
};

static double proc_cpu_s(int pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
    fclose(f);
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Busy seconds of all cores (user, nice, system, irq, softirq, steal). */
static double cores_busy_s(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    int n;

    if (!f)
        return -1;
    n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8)
        return -1;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static struct sample take_sample(const struct cfg *c)
{
    struct sample s;
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    s.self_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
               (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    s.server_s = c->server_pid > 0 ? proc_cpu_s(c->server_pid) : -1;
    s.busy_s = cores_busy_s();
    return s;
}

/* ---- the local files ------------------------------------------------------------------------- */

static void shard_path(const char *dir, uint32_t s, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/shard-%05u", dir, s);
}

static void layout_open(struct layout *l, const char *dir)
{
    char path[4096];
    unsigned long long size, nrec;
    unsigned nshards, per;
    FILE *f;

    snprintf(path, sizeof(path), "%s/meta", dir);
    f = fopen(path, "r");
    if (!f)
        die("%s: %s (run load first)", path, strerror(errno));
    if (fscanf(f, "size %llu records %llu shards %u per_shard %u", &size, &nrec, &nshards, &per) !=
            4 ||
        !nshards || nshards > MAX_SHARDS || (uint64_t)nshards * per != nrec || !size)
        die("%s: not a layout this tool wrote", path);
    fclose(f);
    l->size = size;
    l->nrec = nrec;
    l->nshards = nshards;
    l->per_shard = per;
    for (uint32_t s = 0; s < nshards; s++) {
        shard_path(dir, s, path, sizeof(path));
        l->fds[s] = open(path, O_RDONLY | O_CLOEXEC);
        if (l->fds[s] < 0)
            die("%s: %s", path, strerror(errno));
    }
}

static void layout_close(struct layout *l)
{
    for (uint32_t s = 0; s < l->nshards; s++)
        close(l->fds[s]);
}

/* Record u's bytes from its shard file into buf; the time spent in pread is added to *stall. */
static void local_read(const struct layout *l, uint64_t u, uint8_t *buf, uint64_t *stall)
{
    uint32_t s = (uint32_t)(u / l->per_shard);
    off_t off = (off_t)((u % l->per_shard) * l->size);
    size_t got = 0;
    uint64_t t0 = now_ns();

    while (got < l->size) {
        ssize_t n = pread(l->fds[s], buf + got, l->size - got, off + (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("shard %u at %lld: %s", s, (long long)off, n ? strerror(errno) : "short file");
        got += (size_t)n;
    }
    if (stall)
        *stall += now_ns() - t0;
}

static void write_all(int fd, const void *p, size_t n, const char *what)
{
    const uint8_t *b = p;

    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write %s: %s", what, strerror(errno));
        b += w;
        n -= (size_t)w;
    }
}

/* ---- load ------------------------------------------------------------------------------------ */

static tessera_client *ts_connect(const struct cfg *c)
{
    struct tessera_opts o;
    tessera_client *tc = NULL;
    int rc;

    tessera_opts_init(&o);
    o.address = c->addr;
    o.client_name = "tsplanread";
    o.tls_ca = c->tls_ca;
    o.tls_cert = c->tls_cert;
    o.tls_key = c->tls_key;
    rc = tessera_client_open(&tc, &o);
    if (rc)
        die("connect %s: %s (%s)", c->addr, ts_strerror(rc), ts_errname(rc));
    return tc;
}

static int cmd_load(const struct cfg *c)
{
    uint64_t per = c->total / c->size / c->shards, nrec = per * c->shards;
    size_t shard_bytes = (size_t)(per * c->size);
    char path[4096];
    struct ts_dataset_policy pol = {.core = (uint8_t)(c->core ? c->core : 1),
                                    .min_core = (uint8_t)(c->min_core ? c->min_core : 1)};
    uint64_t *offs;
    uint8_t *buf;
    tessera_client *tc;
    FILE *f;
    int rc;

    if (!per)
        die("--total %" PRIu64 " holds no record of %" PRIu64 " bytes in each of %u shards",
            c->total, c->size, c->shards);
    if (per > UINT32_MAX)
        die("too many records per shard");
    buf = malloc(shard_bytes);
    offs = malloc(per * sizeof(*offs));
    if (!buf || !offs)
        die("out of memory");
    if (mkdir(c->dir, 0755) < 0 && errno != EEXIST)
        die("mkdir %s: %s", c->dir, strerror(errno));
    tc = ts_connect(c);
    rc = tessera_dataset_create(tc, c->name, &pol);
    if (rc)
        die("dataset create %s: %s (%s) %s", c->name, ts_strerror(rc), ts_errname(rc),
            tessera_client_error(tc));
    for (uint32_t s = 0; s < c->shards; s++) {
        int fd;
        for (uint64_t j = 0; j < per; j++) {
            offs[j] = j * c->size;
            rec_fill(s * per + j, buf + offs[j], c->size);
        }
        rc = tessera_put(tc, c->name, s, buf, shard_bytes, offs, (uint32_t)per);
        if (rc)
            die("put %s/%u: %s (%s) %s", c->name, s, ts_strerror(rc), ts_errname(rc),
                tessera_client_error(tc));
        shard_path(c->dir, s, path, sizeof(path));
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            die("%s: %s", path, strerror(errno));
        write_all(fd, buf, shard_bytes, path);
        close(fd);
    }
    rc = tessera_dataset_seal(tc, c->name);
    if (rc)
        die("seal %s: %s (%s) %s", c->name, ts_strerror(rc), ts_errname(rc),
            tessera_client_error(tc));
    tessera_client_close(tc);
    snprintf(path, sizeof(path), "%s/meta", c->dir);
    f = fopen(path, "w");
    if (!f ||
        fprintf(f, "size %" PRIu64 " records %" PRIu64 " shards %u per_shard %" PRIu64 "\n",
                c->size, nrec, c->shards, per) < 0 ||
        fclose(f) != 0)
        die("cannot write %s", path);
    fprintf(stderr,
            "tsplanread: loaded %s: %" PRIu64 " records of %" PRIu64 " bytes in %u shards "
            "(%.0f MiB), files in %s\n",
            c->name, nrec, c->size, c->shards, (double)nrec * (double)c->size / 1048576.0, c->dir);
    free(offs);
    free(buf);
    return 0;
}

/* ---- the plans ------------------------------------------------------------------------------- */

static void plan_opts(const struct cfg *c, const struct layout *l, uint64_t epoch, uint64_t *groups,
                      struct tessera_plan_opts *po)
{
    tessera_plan_opts_init(po);
    po->units = l->nrec;
    po->seed = c->seed;
    po->epoch = epoch;
    po->rank = 0;
    po->world = 1;
    po->shuffle = c->shuffle;
    if (c->shuffle == TESSERA_SHUFFLE_WINDOW) { /* the reader's groups: the shards */
        for (uint32_t s = 0; s < l->nshards; s++)
            groups[s] = l->per_shard;
        po->group_sizes = groups;
        po->ngroups = l->nshards;
    }
}

static tessera_plan *plan_make(const struct cfg *c, const struct layout *l, uint64_t epoch,
                               uint64_t *groups)
{
    struct tessera_plan_opts po;
    tessera_plan *p = NULL;
    int rc;

    plan_opts(c, l, epoch, groups, &po);
    rc = tessera_plan_new(&p, &po);
    if (rc)
        die("tessera_plan_new: %s (%s)", ts_strerror(rc), ts_errname(rc));
    return p;
}

/* ---- tessera: the plan reader ------------------------------------------------------------------
 */

/* One epoch through tessera_reader; in a verify epoch every record is checked against the local
 * files and the local plan. */
static void ts_epoch(const struct cfg *c, const struct layout *l, uint64_t epoch, int verify,
                     uint64_t *groups, uint8_t *scratch, struct result *res)
{
    struct tessera_reader_opts ro;
    struct tessera_reader_stats st;
    struct tessera_opts co;
    struct tessera_unit u;
    tessera_reader *r = NULL;
    tessera_plan *lp = NULL;
    char err[512] = "";
    uint64_t t0, t1, n = 0, sum = 0;
    int rc;

    tessera_opts_init(&co);
    co.address = c->addr;
    co.client_name = "tsplanread";
    tessera_reader_opts_init(&ro);
    ro.dataset = c->name;
    ro.unit = TESSERA_UNIT_RECORD;
    plan_opts(c, l, epoch, groups, &ro.plan);
    ro.plan.units = 0; /* the reader fills them in */
    ro.plan.group_sizes = NULL;
    ro.plan.ngroups = 0;
    if (c->connections)
        ro.connections = c->connections;
    if (c->depth)
        ro.depth = c->depth;
    if (c->window_units)
        ro.window_units = c->window_units;
    if (c->window_bytes)
        ro.window_bytes = c->window_bytes;
    if (verify)
        lp = plan_make(c, l, epoch, groups);

    t0 = now_ns();
    rc = tessera_reader_open(&r, &co, &ro, err, sizeof(err));
    if (rc)
        die("tessera_reader_open %s: %s (%s) %s", c->name, ts_strerror(rc), ts_errname(rc), err);
    t1 = now_ns();
    if (tessera_reader_len(r) != l->nrec)
        die("the reader's plan has %" PRIu64 " records, the files %" PRIu64, tessera_reader_len(r),
            l->nrec);
    while ((rc = tessera_reader_next(r, &u)) == 1) {
        sum += touch(u.data, u.len);
        n++;
        if (verify) {
            uint64_t want;
            if (tessera_plan_unit(lp, u.k, &want) != 0 || want != u.unit)
                die("position %" PRIu64 ": the reader gave record %" PRIu64 ", the plan says "
                    "%" PRIu64,
                    u.k, u.unit, want);
            if (u.len != l->size || u.shard != u.unit / l->per_shard ||
                u.record != u.unit % l->per_shard)
                die("record %" PRIu64 ": shard %u record %" PRIu64 ", %zu bytes; the files "
                    "have it in shard %" PRIu64 " as record %" PRIu64 ", %" PRIu64 " bytes",
                    u.unit, u.shard, u.record, u.len, u.unit / l->per_shard, u.unit % l->per_shard,
                    l->size);
            local_read(l, u.unit, scratch, NULL);
            if (memcmp(u.data, scratch, l->size) != 0)
                die("record %" PRIu64 " (shard %u record %" PRIu64 "): tessera's bytes differ "
                    "from the local file's",
                    u.unit, u.shard, u.record);
        }
    }
    if (rc < 0)
        die("tessera_reader_next: %s (%s) %s", ts_strerror(rc), ts_errname(rc),
            tessera_reader_error(r));
    if (n != l->nrec)
        die("the reader ended after %" PRIu64 " of %" PRIu64 " records", n, l->nrec);
    tessera_reader_stats(r, &st);
    res->ns += now_ns() - t0;
    res->open_ns += t1 - t0;
    tessera_reader_close(r);
    tessera_plan_free(lp);
    res->records += st.units;
    res->bytes += st.bytes;
    res->stall_ns += st.stall_ns;
    res->stalls += st.stalls;
    res->retries += st.retries;
    res->reconnects += st.reconnects;
    res->index_loads += st.index_loads;
    if (st.ahead_bytes_max > res->ahead_max)
        res->ahead_max = st.ahead_bytes_max;
    res->sum += sum;
    res->epochs++;
}

/* ---- local: pread in the plan's order
 * ------------------------------------------------------------ */

static void local_epoch(const struct cfg *c, const struct layout *l, uint64_t epoch, int verify,
                        uint64_t *groups, uint8_t *buf, uint8_t *scratch, struct result *res)
{
    uint64_t t0 = now_ns(), t1, stall = 0, sum = 0, len;
    tessera_plan *p = plan_make(c, l, epoch, groups);

    t1 = now_ns();
    len = tessera_plan_len(p);
    if (len != l->nrec)
        die("the plan has %" PRIu64 " records, the files %" PRIu64, len, l->nrec);
    for (uint64_t k = 0; k < len; k++) {
        uint64_t u;
        if (tessera_plan_unit(p, k, &u) != 0)
            die("the plan has no position %" PRIu64, k);
        local_read(l, u, buf, &stall);
        sum += touch(buf, l->size);
        if (verify) {
            rec_fill(u, scratch, l->size);
            if (memcmp(buf, scratch, l->size) != 0)
                die("record %" PRIu64 ": the local file's bytes are not the generator's", u);
        }
    }
    res->ns += now_ns() - t0;
    res->open_ns += t1 - t0;
    tessera_plan_free(p);
    res->records += len;
    res->bytes += len * l->size;
    res->stall_ns += stall;
    res->stalls += len;
    res->sum += sum;
    res->epochs++;
}

/* Reads every shard file once, so that the page cache holds them. */
static void local_warm(const struct layout *l)
{
    size_t cap = 8u << 20;
    uint8_t *buf = malloc(cap);

    if (!buf)
        die("out of memory");
    for (uint32_t s = 0; s < l->nshards; s++) {
        off_t off = 0;
        ssize_t n;
        while ((n = pread(l->fds[s], buf, cap, off)) > 0)
            off += n;
    }
    free(buf);
}

/* ---- the reads --------------------------------------------------------------------------------
 */

static const char *shuffle_name(int s)
{
    return s == TESSERA_SHUFFLE_GLOBAL ? "global" : s == TESSERA_SHUFFLE_WINDOW ? "window" : "none";
}

static int cmd_read(const struct cfg *c)
{
    int ts = !strcmp(c->mode, "tessera");
    struct layout *l = calloc(1, sizeof(*l));
    struct result res = {0}, warm = {0};
    struct sample a, b;
    uint64_t *groups;
    uint8_t *buf, *scratch;
    uint64_t e = c->epoch;
    double secs, server = -1, self, other = -1;

    if (!l)
        die("out of memory");
    layout_open(l, c->dir);
    groups = calloc(l->nshards, sizeof(*groups));
    buf = malloc(l->size);
    scratch = malloc(l->size);
    if (!groups || !buf || !scratch)
        die("out of memory");
    if (!ts)
        local_warm(l);
    for (unsigned i = 0; i < c->warmup; i++, e++) {
        if (ts)
            ts_epoch(c, l, e, c->verify, groups, scratch, &warm);
        else
            local_epoch(c, l, e, c->verify, groups, buf, scratch, &warm);
    }
    a = take_sample(c);
    do {
        if (ts)
            ts_epoch(c, l, e++, 0, groups, scratch, &res);
        else
            local_epoch(c, l, e++, 0, groups, buf, scratch, &res);
    } while ((double)res.ns / 1e9 < c->min_seconds);
    b = take_sample(c);

    secs = (double)res.ns / 1e9;
    self = b.self_s - a.self_s;
    if (a.server_s >= 0 && b.server_s >= 0)
        server = b.server_s - a.server_s;
    if (a.busy_s >= 0 && b.busy_s >= 0) {
        other = b.busy_s - a.busy_s - self - (server > 0 ? server : 0);
        other = other > 0 ? other / secs : 0;
    }
    printf("{\"label\":\"%s\",\"mode\":\"%s\",\"size\":%" PRIu64 ",\"shuffle\":\"%s\","
           "\"dataset_records\":%" PRIu64 ",\"epochs\":%" PRIu64 ",\"records\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"seconds\":%.4f,\"records_per_s\":%.1f,\"gb_per_s\":%.4f,"
           "\"stall_ns\":%" PRIu64 ",\"stall_frac\":%.4f,\"stalls\":%" PRIu64
           ",\"open_ns\":%" PRIu64 ",\"retries\":%" PRIu64 ",\"reconnects\":%" PRIu64
           ",\"index_loads\":%" PRIu64 ",\"ahead_bytes_max\":%" PRIu64
           ",\"verified\":%d,\"checksum\":\"%016" PRIx64 "\",\"client_cpu\":%.3f",
           c->label ? c->label : "", c->mode, l->size, shuffle_name(c->shuffle), l->nrec,
           res.epochs, res.records, res.bytes, secs, secs > 0 ? (double)res.records / secs : 0,
           secs > 0 ? (double)res.bytes / secs / 1e9 : 0, res.stall_ns,
           res.ns ? (double)res.stall_ns / (double)res.ns : 0, res.stalls, res.open_ns, res.retries,
           res.reconnects, res.index_loads, res.ahead_max, c->verify && c->warmup ? 1 : 0, res.sum,
           secs > 0 ? self / secs : 0);
    if (ts) {
        struct tessera_reader_opts d;
        tessera_reader_opts_init(&d);
        printf(",\"connections\":%u,\"depth\":%u,\"window_units\":%u,\"window_bytes\":%" PRIu64,
               c->connections ? c->connections : d.connections, c->depth ? c->depth : d.depth,
               c->window_units ? c->window_units : d.window_units,
               c->window_bytes ? c->window_bytes : d.window_bytes);
    }
    if (server >= 0)
        printf(",\"server_cpu_s\":%.3f,\"server_cpu_util\":%.3f", server,
               secs > 0 ? server / secs : 0);
    if (other >= 0)
        printf(",\"other_cpu\":%.3f", other);
    printf("}\n");
    fflush(stdout);
    fprintf(stderr,
            "tsplanread %s %s %" PRIu64 " B %s: %" PRIu64 " epochs, %.0f records/s %.3f GB/s, "
            "stall %.1f%%%s\n",
            c->label ? c->label : "", c->mode, l->size, shuffle_name(c->shuffle), res.epochs,
            secs > 0 ? (double)res.records / secs : 0,
            secs > 0 ? (double)res.bytes / secs / 1e9 : 0,
            res.ns ? 100.0 * (double)res.stall_ns / (double)res.ns : 0,
            c->verify && c->warmup ? " (verified)" : "");
    layout_close(l);
    free(scratch);
    free(buf);
    free(groups);
    free(l);
    return 0;
}

/* ---- command line -------------------------------------------------------------------------------
 */

static void usage(void)
{
    fprintf(
        stderr,
        "usage: tsplanread load|tessera|local [options]\n"
        "  load:    --addr A --name DS --dir DIR --size B [--total B (128M)] [--shards S (16)]\n"
        "           [--core N --min-core N (1 1)] [--tls-ca F --tls-cert F --tls-key F]\n"
        "  tessera: --addr A --name DS --dir DIR   local: --dir DIR\n"
        "  reads:   --shuffle none|global|window (none) --seed N (1) --epoch E (0)\n"
        "           --min-seconds S (0: one epoch) --warmup N (1 epoch) --verify\n"
        "           --server-pid PID --label TEXT\n"
        "  tessera: --connections N --depth D --window-units N --window-bytes B (reader's\n"
        "           defaults when not given)\n");
    exit(2);
}

static uint64_t parse_uint(const char *s, uint64_t max)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > max)
        die("bad number '%s'", s);
    return v;
}

static void parse(struct cfg *c, int argc, char **argv)
{
    static const struct option lo[] = {{"addr", 1, 0, 'a'},
                                       {"name", 1, 0, 'n'},
                                       {"dir", 1, 0, 'D'},
                                       {"size", 1, 0, 's'},
                                       {"total", 1, 0, 'T'},
                                       {"shards", 1, 0, 'S'},
                                       {"shuffle", 1, 0, 'x'},
                                       {"seed", 1, 0, 'e'},
                                       {"epoch", 1, 0, 'E'},
                                       {"min-seconds", 1, 0, 't'},
                                       {"warmup", 1, 0, 'w'},
                                       {"verify", 0, 0, 'V'},
                                       {"server-pid", 1, 0, 'p'},
                                       {"label", 1, 0, 'l'},
                                       {"connections", 1, 0, 'c'},
                                       {"depth", 1, 0, 'd'},
                                       {"window-units", 1, 0, 'u'},
                                       {"window-bytes", 1, 0, 'b'},
                                       {"tls-ca", 1, 0, 'A'},
                                       {"tls-cert", 1, 0, 'C'},
                                       {"tls-key", 1, 0, 'K'},
                                       {"core", 1, 0, 'r'},
                                       {"min-core", 1, 0, 'm'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int ch;

    c->total = 128u << 20;
    c->shards = 16;
    c->seed = 1;
    c->warmup = 1;
    c->shuffle = TESSERA_SHUFFLE_NONE;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'a':
            c->addr = optarg;
            break;
        case 'n':
            c->name = optarg;
            break;
        case 'D':
            c->dir = optarg;
            break;
        case 's':
            c->size = parse_size(optarg);
            break;
        case 'T':
            c->total = parse_size(optarg);
            break;
        case 'S':
            c->shards = (uint32_t)parse_uint(optarg, MAX_SHARDS);
            break;
        case 'x':
            if (!strcmp(optarg, "none"))
                c->shuffle = TESSERA_SHUFFLE_NONE;
            else if (!strcmp(optarg, "global"))
                c->shuffle = TESSERA_SHUFFLE_GLOBAL;
            else if (!strcmp(optarg, "window"))
                c->shuffle = TESSERA_SHUFFLE_WINDOW;
            else
                die("--shuffle none|global|window, not '%s'", optarg);
            break;
        case 'e':
            c->seed = parse_uint(optarg, UINT64_MAX);
            break;
        case 'E':
            c->epoch = parse_uint(optarg, UINT64_MAX);
            break;
        case 't':
            c->min_seconds = strtod(optarg, NULL);
            break;
        case 'w':
            c->warmup = (unsigned)parse_uint(optarg, 1000);
            break;
        case 'V':
            c->verify = 1;
            break;
        case 'p':
            c->server_pid = (int)parse_uint(optarg, INT32_MAX);
            break;
        case 'l':
            c->label = optarg;
            break;
        case 'c':
            c->connections = (uint32_t)parse_uint(optarg, 64);
            break;
        case 'd':
            c->depth = (uint32_t)parse_uint(optarg, UINT32_MAX);
            break;
        case 'u':
            c->window_units = (uint32_t)parse_uint(optarg, UINT32_MAX);
            break;
        case 'b':
            c->window_bytes = parse_size(optarg);
            break;
        case 'A':
            c->tls_ca = optarg;
            break;
        case 'C':
            c->tls_cert = optarg;
            break;
        case 'K':
            c->tls_key = optarg;
            break;
        case 'r':
            c->core = (unsigned)parse_uint(optarg, 16);
            break;
        case 'm':
            c->min_core = (unsigned)parse_uint(optarg, 16);
            break;
        default:
            usage();
        }
    }
    if (!c->dir)
        die("--dir is needed");
    if (strcmp(c->mode, "local") && (!c->addr || !c->name))
        die("%s needs --addr and --name", c->mode);
    if (!strcmp(c->mode, "load") && (!c->size || !c->shards))
        die("load needs --size (and --shards > 0)");
    if (c->verify && !c->warmup)
        die("--verify checks the warm-up epochs: give --warmup 1 or more");
}

int main(int argc, char **argv)
{
    struct cfg c = {0};

    if (argc < 2)
        usage();
    c.mode = argv[1];
    if (strcmp(c.mode, "load") && strcmp(c.mode, "tessera") && strcmp(c.mode, "local"))
        usage();
    parse(&c, argc - 1, argv + 1);
    return !strcmp(c.mode, "load") ? cmd_load(&c) : cmd_read(&c);
}
