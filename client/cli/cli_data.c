/*
 * tessera CLI: the data commands: dataset create/ls/stat/seal/rm, shard ls/stat, put and get.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "ts_ec.h"
#include "ts_map.h"

#define GET_WINDOW 4

/* ---- dataset commands ------------------------------------------------------------------------ */

/* Shows dataset NAME (also once it is created). */
int cmd_dataset_stat(struct ctx *x)
{
    struct ts_dataset_info d;
    int rc;

    rc = tessera_dataset_stat(x->c, x->argv[0], &d);
    if (rc)
        return rc;
    if (x->json)
        json_print(dataset_json(&d));
    else
        dataset_print(&d);
    return 0;
}

int cmd_dataset_create(struct ctx *x)
{
    int rc;

    if (!x->min_core_set)
        x->policy.min_core = 0; /* the server's default: a majority of the core replicas */
    rc = tessera_dataset_create(x->c, x->argv[0], &x->policy);
    if (rc)
        return rc;
    return cmd_dataset_stat(x);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct ts_dataset_info *)a)->name,
                  ((const struct ts_dataset_info *)b)->name);
}

int cmd_dataset_ls(struct ctx *x)
{
    static const char *const hdr[] = {"NAME",  "STATE", "SHARDS", "WRITING", "SIZE",
                                      "CHUNK", "CORE",  "FRINGE", "MIN",     "CREATED"};
    struct ts_dataset_info *v;
    struct cli_table t;
    size_t n;
    int rc;

    rc = tessera_dataset_list(x->c, &v, &n);
    if (rc)
        return rc;
    if (n)
        qsort(v, n, sizeof(*v), by_name);
    if (x->json) {
        struct json_object *a = json_object_new_array();
        for (size_t i = 0; i < n; i++)
            json_object_array_add(a, dataset_json(&v[i]));
        json_print(a);
        goto out_free;
    }
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x1fc, hdr);
    for (size_t i = 0; i < n && !rc; i++) {
        char shards[16], writing[16], size[32], chunk[32], core[8], fringe[8], minc[8], when[40];
        const char *row[] = {v[i].name, pick(v[i].state, "open", "sealed"),
                             shards,    writing,
                             size,      cli_human_size(v[i].policy.chunk_size, chunk, 32),
                             core,      fringe,
                             minc,      cli_time(v[i].created_ns, when, sizeof(when))};
        snprintf(shards, sizeof(shards), "%u", v[i].shards);
        snprintf(writing, sizeof(writing), "%u", v[i].shards_writing);
        cli_human_size(v[i].bytes, size, sizeof(size));
        snprintf(core, sizeof(core), "%u", v[i].policy.core);
        snprintf(fringe, sizeof(fringe), "%u", v[i].policy.fringe);
        snprintf(minc, sizeof(minc), "%u", v[i].policy.min_core);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
out_free:
    free(v);
    return rc;
}

int cmd_dataset_seal(struct ctx *x)
{
    struct ts_dataset_info d;
    int rc;

    rc = tessera_dataset_seal(x->c, x->argv[0]);
    if (rc)
        return rc;
    rc = tessera_dataset_stat(x->c, x->argv[0], &d);
    if (rc)
        return rc;
    if (x->json) {
        json_print(dataset_json(&d));
    } else {
        char size[32];
        printf("sealed dataset %s: %u shards, %s\n", d.name, d.shards,
               cli_human_size(d.bytes, size, sizeof(size)));
    }
    return 0;
}

/* Progress of a tiering: shards and bytes done, rate and time left, on one line (stderr). */
struct tier_progress {
    uint64_t t0;
    int tty;
};

static void tier_progress_cb(void *arg, uint32_t done, uint32_t n, uint64_t bytes, uint64_t total)
{
    struct tier_progress *p = arg;
    double s = (double)(ts_now_mono_ns() - p->t0) / 1e9, rate = s > 0 ? (double)bytes / s : 0;
    /* The share done: by bytes, or by shards while the bytes are too few to say. */
    double frac =
        total && bytes * 100 >= total ? (double)bytes / (double)total : (n ? (double)done / n : 1);
    char a[32], b[32];

    fprintf(stderr, "%s  %u/%u shards, %s of %s, %.1f MB/s, ETA %.0f s%s", p->tty ? "\r" : "", done,
            n, cli_human_size(bytes, a, sizeof(a)), cli_human_size(total, b, sizeof(b)), rate / 1e6,
            frac > 0 ? s * (1 - frac) / frac : 0.0, p->tty ? "" : "\n");
    fflush(stderr);
}

int cmd_dataset_tier(struct ctx *x)
{
    struct tier_progress p = {ts_now_mono_ns(), isatty(2)};
    struct ts_dataset_info d;
    unsigned k = 0, m = 0;
    char err[128];
    int rc;

    if (strcmp(x->argv[1], "replicated") != 0 &&
        ts_ec_parse(x->argv[1], &k, &m, err, sizeof(err))) {
        snprintf(x->local, sizeof(x->local), "%s (ec:K+M or replicated)", err);
        return TS_EINVAL;
    }
    rc = tessera_dataset_tier(x->c, x->argv[0], k, m, x->json ? NULL : tier_progress_cb, &p);
    if (p.tty && !x->json)
        fputc('\n', stderr);
    if (rc)
        return rc;
    rc = tessera_dataset_stat(x->c, x->argv[0], &d);
    if (rc)
        return rc;
    if (x->json)
        json_print(dataset_json(&d));
    else if (k)
        printf("dataset %s is erasure-coded, ec:%u+%u: every shard's fragments durable and read "
               "back, the replicas' bytes dropped (%.1f s)\n",
               d.name, k, m, (double)(ts_now_mono_ns() - p.t0) / 1e9);
    else
        printf("dataset %s is replicated only: its replicas hold every byte (each node checked "
               "its own); its fragments were removed\n",
               d.name);
    return 0;
}

int cmd_dataset_repair(struct ctx *x)
{
    struct tessera_repair_report r;
    uint64_t t0 = ts_now_mono_ns();
    double s;
    char b[32];
    int rc = tessera_dataset_repair(x->c, x->argv[0], &r);

    if (rc && rc != TS_EIO)
        return rc;
    s = (double)(ts_now_mono_ns() - t0) / 1e9;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "shards", json_object_new_int64(r.shards));
        json_object_object_add(o, "fragments_put", json_object_new_int64((int64_t)r.fragments_put));
        json_object_object_add(o, "chunks_repaired",
                               json_object_new_int64((int64_t)r.chunks_repaired));
        json_object_object_add(o, "bytes_rebuilt", json_object_new_int64((int64_t)r.bytes_rebuilt));
        json_object_object_add(o, "unreachable", json_object_new_int64((int64_t)r.unreachable));
        json_object_object_add(o, "failed", json_object_new_int64((int64_t)r.failed));
        json_object_object_add(o, "seconds", json_object_new_double(s));
        json_print(o);
    } else {
        printf("dataset %s: %u shards checked; %llu fragments rebuilt and put, %llu chunks "
               "repaired (%s) in %.2f s%s\n",
               x->argv[0], r.shards, (unsigned long long)r.fragments_put,
               (unsigned long long)r.chunks_repaired, cli_human_size(r.bytes_rebuilt, b, sizeof(b)),
               s, r.failed || r.unreachable ? "" : ": every fragment in place (full redundancy)");
        if (r.unreachable)
            printf("%llu fragments on nodes that could not be reached: not at full redundancy\n",
                   (unsigned long long)r.unreachable);
    }
    if (rc)
        return rc;
    return r.unreachable ? TS_EUNAVAIL : 0;
}

int cmd_dataset_rm(struct ctx *x)
{
    int rc;

    rc = tessera_dataset_delete(x->c, x->argv[0]);
    if (rc)
        return rc;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "deleted", json_object_new_boolean(1));
        json_print(o);
    } else {
        printf("deleted dataset %s\n", x->argv[0]);
    }
    return 0;
}

/* ---- shard commands ------------------------------------------------------------------------- */

static int parse_shard(struct ctx *x, const char *s, uint32_t *out)
{
    uint64_t v;

    if (cli_parse_uint(s, UINT32_MAX, &v) != 0) {
        snprintf(x->local, sizeof(x->local), "'%s' is not a shard number (0 to %u)", s, UINT32_MAX);
        return TS_EINVAL;
    }
    *out = (uint32_t)v;
    return 0;
}

/* The shard the arguments NAME SHARD name: its number and its info. */
static int stat_shard_arg(struct ctx *x, uint32_t *id, struct ts_shard_info *s)
{
    int rc;

    rc = parse_shard(x, x->argv[1], id);
    if (rc)
        return rc;
    return tessera_shard_stat(x->c, x->argv[0], *id, s);
}

int cmd_shard_ls(struct ctx *x)
{
    static const char *const hdr[] = {"SHARD",  "STATE",  "SIZE",   "DECLARED",
                                      "CHUNKS", "CRC32C", "RECORDS"};
    struct ts_shard_info *v;
    struct cli_table t;
    size_t n;
    int rc;

    rc = tessera_shard_list(x->c, x->argv[0], &v, &n);
    if (rc)
        return rc;
    if (x->json) {
        struct json_object *a = json_object_new_array();
        for (size_t i = 0; i < n; i++)
            json_object_array_add(a, shard_json(&v[i]));
        json_print(a);
        goto out_free;
    }
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x5d, hdr);
    for (size_t i = 0; i < n && !rc; i++) {
        char shard[16], size[32], decl[32], chunks[16], crc[16], recs[16];
        const char *row[] = {
            shard, pick(v[i].state, "writing", "complete"), size, decl, chunks, crc, recs};
        snprintf(shard, sizeof(shard), "%u", v[i].shard);
        cli_human_size(v[i].size, size, sizeof(size));
        if (v[i].expect_size == TS_SIZE_UNKNOWN)
            snprintf(decl, sizeof(decl), "-");
        else
            cli_human_size(v[i].expect_size, decl, sizeof(decl));
        snprintf(chunks, sizeof(chunks), "%u", v[i].nchunks);
        snprintf(crc, sizeof(crc), "%08x", v[i].crc);
        snprintf(recs, sizeof(recs), "%u", v[i].nrecords);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
out_free:
    free(v);
    return rc;
}

int cmd_shard_stat(struct ctx *x)
{
    char shard[16], size[64], hs[32], decl[64], chunk[32], chunks[16], crc[16], recs[16];
    struct ts_shard_info s;
    uint32_t id;
    int rc;

    rc = stat_shard_arg(x, &id, &s);
    if (rc)
        return rc;
    if (x->json) {
        json_print(shard_json(&s));
        return 0;
    }
    snprintf(shard, sizeof(shard), "%u", s.shard);
    snprintf(size, sizeof(size), "%s (%llu bytes)", cli_human_size(s.size, hs, sizeof(hs)),
             (unsigned long long)s.size);
    if (s.expect_size == TS_SIZE_UNKNOWN)
        snprintf(decl, sizeof(decl), "unknown");
    else
        snprintf(decl, sizeof(decl), "%llu bytes", (unsigned long long)s.expect_size);
    snprintf(chunks, sizeof(chunks), "%u", s.nchunks);
    snprintf(crc, sizeof(crc), "%08x", s.crc);
    snprintf(recs, sizeof(recs), "%u", s.nrecords);
    const char *kv[] = {
        "dataset", x->argv[0], "shard",
        shard,     "state",    pick(s.state, "writing", "complete"),
        "size",    size,       "declared",
        decl,      "chunk",    cli_human_size(s.chunk_size, chunk, sizeof(chunk)),
        "chunks",  chunks,     "crc32c",
        crc,       "records",  recs,
    };
    kv_print(kv, TS_ARRAY_SIZE(kv));
    return 0;
}

/* ---- put / get ---------------------------------------------------------------------------------
 */

/*
 * Uploads FILE ('-': standard input) as the shard. Everything is read with read() into the
 * library's chunk buffers (tessera_put_fd): never mapped, so a file that shrinks during the
 * upload ends it with an error (the shard stays incomplete and invisible) rather than SIGBUS.
 */
int cmd_put(struct ctx *x)
{
    const char *file = x->argv[2];
    int from_stdin = strcmp(file, "-") == 0;
    struct ts_shard_info s;
    struct stat st, now;
    uint64_t t0, bytes, size = TS_SIZE_UNKNOWN;
    off_t start = 0;
    double secs;
    uint32_t id;
    int fd = STDIN_FILENO, rc;

    rc = parse_shard(x, x->argv[1], &id);
    if (rc)
        return rc;
    if (!from_stdin) {
        fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(x->local, sizeof(x->local), "cannot open %s: %s", file, strerror(errno));
            return TS_EIO;
        }
    }
    if (fstat(fd, &st) < 0) {
        snprintf(x->local, sizeof(x->local), "cannot stat %s: %s", file, strerror(errno));
        rc = TS_EIO;
        goto out_close;
    }
    if (S_ISREG(st.st_mode)) {
        /* A regular file declares its size: what is left of it from where it is read. */
        start = lseek(fd, 0, SEEK_CUR);
        if (start < 0 || start > st.st_size)
            start = 0;
        size = (uint64_t)(st.st_size - start);
    }
    t0 = ts_now_mono_ns();
    rc = tessera_put_fd(x->c, x->argv[0], id, fd, size);
    if (S_ISREG(st.st_mode) && fstat(fd, &now) == 0 && now.st_size != st.st_size) {
        if (rc == TS_EIO) {
            snprintf(x->local, sizeof(x->local),
                     "%s changed size during upload (%lld bytes when it began, %lld now): %s", file,
                     (long long)st.st_size, (long long)now.st_size, tessera_client_error(x->c));
        } else if (!rc) {
            fprintf(stderr,
                    "tessera: put %s %u: note: %s changed size during upload (%lld bytes when "
                    "it began, %lld now); the shard holds the first %llu bytes\n",
                    x->argv[0], id, file, (long long)st.st_size, (long long)now.st_size,
                    (unsigned long long)size);
        }
    }
    if (rc)
        goto out_close;
    secs = (double)(ts_now_mono_ns() - t0) / 1e9;
    rc = tessera_shard_stat(x->c, x->argv[0], id, &s);
    if (rc)
        goto out_close;
    bytes = s.size;
    if (x->json) {
        struct json_object *o = shard_json(&s);
        json_object_object_add(o, "dataset", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "seconds", json_secs(secs));
        json_print(o);
    } else {
        char hs[32], rate[32];
        cli_human_size(secs > 0 ? (uint64_t)((double)bytes / secs) : 0, rate, sizeof(rate));
        printf("put %s %u: %s in %.2f s (%s/s), %u chunk%s, crc32c %08x\n", x->argv[0], id,
               cli_human_size(bytes, hs, sizeof(hs)), secs, rate, s.nchunks,
               s.nchunks == 1 ? "" : "s", s.crc);
    }
out_close:
    if (!from_stdin)
        close(fd);
    return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/*
 * Streams [off, end) of a shard to out in pieces of buflen, with GET_WINDOW reads in flight;
 * each buffer is received into straight from the socket and written out from there.
 */
static int get_stream(struct ctx *x, uint32_t id, uint64_t off, uint64_t end, size_t buflen,
                      int out, uint64_t *written)
{
    uint8_t *bufs[GET_WINDOW] = {NULL};
    uint64_t ops[GET_WINDOW], next = off, lens[GET_WINDOW];
    size_t head = 0, count = 0, got;
    int rc = 0, wrc;

    *written = 0;
    for (size_t i = 0; i < GET_WINDOW; i++) {
        bufs[i] = malloc(buflen);
        if (!bufs[i]) {
            rc = TS_ENOMEM;
            goto out_free;
        }
    }
    while (next < end || count) {
        while (!rc && next < end && count < GET_WINDOW) {
            size_t slot = (head + count) % GET_WINDOW;
            lens[slot] = TS_MIN((uint64_t)buflen, end - next);
            rc = tessera_read_submit(x->c, x->argv[0], id, next, (size_t)lens[slot], bufs[slot],
                                     &ops[slot]);
            if (rc)
                break;
            next += lens[slot];
            count++;
        }
        if (!count)
            break;
        wrc = tessera_wait(x->c, ops[head], &got);
        if (!rc && wrc)
            rc = wrc;
        if (!rc && got != lens[head]) {
            snprintf(x->local, sizeof(x->local), "the shard ended early, at byte %llu",
                     (unsigned long long)(*written + off + got));
            rc = TS_EPROTO;
        }
        if (!rc) {
            wrc = write_all(out, bufs[head], got);
            if (wrc) {
                snprintf(x->local, sizeof(x->local), "cannot write %s: %s",
                         x->output ? x->output : "stdout", strerror(-wrc));
                rc = TS_EIO;
            }
            *written += got;
        }
        head = (head + 1) % GET_WINDOW;
        count--;
        if (rc)
            next = end; /* stop submitting; collect what is in flight */
    }
out_free:
    for (size_t i = 0; i < GET_WINDOW; i++)
        free(bufs[i]);
    return rc;
}

/* The temporary file of a `get -o FILE` in progress, removed if a signal ends the CLI. */
static char *volatile get_tmp;

static void get_signal(int sig)
{
    char *tmp = get_tmp;

    if (tmp)
        unlink(tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Blocks (or unblocks) the signals that get_signal handles. */
static void get_signals_block(int block, sigset_t *old)
{
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (block)
        sigprocmask(SIG_BLOCK, &set, old);
    else
        sigprocmask(SIG_SETMASK, old, NULL);
}

/* --node ID: the bytes from that node of the map alone (no failover to another replica), piece
 * by piece: what an operator (or a test) reads to check one replica's copy. */
static int get_from_node(struct ctx *x, uint32_t id, uint64_t off, uint64_t end, size_t buflen,
                         int out, uint64_t *written)
{
    const struct ts_map *m = ts_client_map(x->c);
    int i = m ? ts_map_find(m, x->node) : -1, rc = 0;
    uint8_t *buf;

    *written = 0;
    if (i < 0) {
        snprintf(x->local, sizeof(x->local), "--node %s: %s", x->node,
                 m ? "no such node in the map" : "not a cluster (one node holds everything)");
        return TS_ENOENT;
    }
    buf = malloc(buflen);
    if (!buf)
        return TS_ENOMEM;
    while (!rc && off < end) {
        size_t got = 0;
        rc = ts_client_node_read(x->c, (size_t)i, x->argv[0], id, off,
                                 (size_t)TS_MIN((uint64_t)buflen, end - off), buf, &got);
        if (!rc && (got == 0 || write_all(out, buf, got) != 0))
            rc = TS_EIO;
        off += got;
        *written += got;
    }
    free(buf);
    return rc;
}

int cmd_get(struct ctx *x)
{
    int to_file = x->output && strcmp(x->output, "-") != 0;
    struct ts_shard_info s;
    struct cli_out out = {.fd = STDOUT_FILENO};
    uint64_t end, written = 0, t0;
    size_t buflen;
    uint32_t id;
    sigset_t old;
    int rc;

    rc = stat_shard_arg(x, &id, &s);
    if (rc)
        return rc;
    if (s.state != TS_SHARD_COMPLETE) {
        snprintf(x->local, sizeof(x->local), "shard %u is still being written", id);
        return TS_EINCOMPLETE;
    }
    if (x->offset > s.size) {
        snprintf(x->local, sizeof(x->local),
                 "offset %llu is past the end of the shard (%llu bytes)",
                 (unsigned long long)x->offset, (unsigned long long)s.size);
        return TS_ERANGE;
    }
    end = x->length_set && x->length < s.size - x->offset ? x->offset + x->length : s.size;
    /* Pieces of whole chunks, at least 1 MiB, at most one request. */
    buflen = s.chunk_size ? s.chunk_size : TS_DEFAULT_CHUNK_SIZE;
    buflen *= ((1u << 20) + buflen - 1) / buflen;
    buflen = TS_MIN(buflen, (size_t)TESSERA_MAX_READ);
    if (to_file) {
        /* Into a temporary renamed over FILE at the end: a failed get leaves FILE as it was. */
        rc = cli_out_open(&out, x->output, x->local, sizeof(x->local));
        if (rc)
            return rc;
        if (out.tmp) {
            get_tmp = out.tmp;
            signal(SIGINT, get_signal);
            signal(SIGTERM, get_signal);
            signal(SIGHUP, get_signal);
        }
    }
    t0 = ts_now_mono_ns();
    rc = x->node ? get_from_node(x, id, x->offset, end, buflen, out.fd, &written)
                 : get_stream(x, id, x->offset, end, buflen, out.fd, &written);
    if (to_file) {
        get_signals_block(1, &old);
        get_tmp = NULL;
        if (rc) {
            cli_out_abort(&out);
        } else {
            rc = cli_out_commit(&out, x->local, sizeof(x->local));
        }
        get_signals_block(0, &old);
    }
    if (rc || !to_file)
        return rc;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "shard", json_u64(id));
        json_object_object_add(o, "offset", json_u64(x->offset));
        json_object_object_add(o, "bytes", json_u64(written));
        json_object_object_add(o, "output", json_object_new_string(x->output));
        json_object_object_add(o, "seconds", json_secs((double)(ts_now_mono_ns() - t0) / 1e9));
        json_print(o);
    } else {
        char hs[32];
        printf("get %s %u: %s to %s\n", x->argv[0], id, cli_human_size(written, hs, sizeof(hs)),
               x->output);
    }
    return 0;
}
