/*
 * tessera: the admin CLI of tessera.
 *
 *   tessera [-s HOST:PORT] [--tls-ca F --tls-cert F --tls-key F] [--tls-server-name N]
 *           [--json] [--timeout MS] [-v] COMMAND ...
 *
 * Global options may come anywhere on the line; command options after the command. Output is
 * human-readable (aligned tables, sizes in KiB/MiB/GiB) or, with --json, one JSON document.
 * Errors: one line on stderr, exit 1 (server or I/O) or 2 (usage).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cli_util.h"
#include "client_internal.h"
#include "ts_map.h"

#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define GET_WINDOW 4

enum opt_id {
    O_HELP = 1,
    O_SERVER,
    O_TLS_CA,
    O_TLS_CERT,
    O_TLS_KEY,
    O_TLS_NAME,
    O_JSON,
    O_TIMEOUT,
    O_VERBOSE,
    O_CORE,
    O_FRINGE,
    O_MIN_CORE,
    O_CHUNK,
    O_OUTPUT,
    O_OFFSET,
    O_LENGTH,
    O_DATASET,
    O_SHARD,
    O_NODE,
};

static const struct cli_opt global_opts[] = {
    {"help", 'h', 0, O_HELP},       {"server", 's', 1, O_SERVER},
    {"tls-ca", 0, 1, O_TLS_CA},     {"tls-cert", 0, 1, O_TLS_CERT},
    {"tls-key", 0, 1, O_TLS_KEY},   {"tls-server-name", 0, 1, O_TLS_NAME},
    {"json", 0, 0, O_JSON},         {"timeout", 0, 1, O_TIMEOUT},
    {"verbose", 'v', 0, O_VERBOSE}, {NULL, 0, 0, 0},
};

static const struct cli_opt create_opts[] = {
    {"core", 0, 1, O_CORE},
    {"fringe", 0, 1, O_FRINGE},
    {"min-core", 0, 1, O_MIN_CORE},
    {"chunk-size", 0, 1, O_CHUNK},
    {NULL, 0, 0, 0},
};

static const struct cli_opt get_opts[] = {
    {"output", 'o', 1, O_OUTPUT},
    {"offset", 0, 1, O_OFFSET},
    {"length", 0, 1, O_LENGTH},
    {NULL, 0, 0, 0},
};

static const struct cli_opt pg_opts[] = {
    {"dataset", 0, 1, O_DATASET},
    {"shard", 0, 1, O_SHARD},
    {NULL, 0, 0, 0},
};

static const struct cli_opt status_opts[] = {
    {"node", 0, 1, O_NODE},
    {NULL, 0, 0, 0},
};

static const struct cli_opt no_opts[] = {{NULL, 0, 0, 0}};

/* What a command works with. */
struct ctx {
    tessera_client *c;
    const char *server;
    int json;
    int timeout_set;
    int argc;
    char **argv;
    /* dataset create */
    struct ts_dataset_policy policy;
    int min_core_set;
    /* get */
    const char *output;
    uint64_t offset, length;
    int length_set;
    /* pg, status */
    const char *dataset;
    uint64_t shard;
    int shard_set;
    const char *node;
    int server_set; /* -s or $TESSERA_SERVER */
    /* a local failure, in words (instead of a TS_E* line) */
    char local[512];
};

struct cmd {
    const char *group; /* "dataset", "shard" or NULL */
    const char *name;
    int min_args, max_args;
    int ctx_args; /* positional arguments named in error lines */
    const struct cli_opt *opts;
    int (*run)(struct ctx *x);
    const char *args;
    const char *help;
    int cluster; /* listed under "Cluster commands" */
};

/* ---- output helpers ------------------------------------------------------------------------- */

static void json_print(struct json_object *o)
{
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                               JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}

static struct json_object *json_u64(uint64_t v)
{
    return json_object_new_uint64(v);
}

static struct json_object *json_secs(double secs)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%.3f", secs);
    return json_object_new_double_s(secs, buf);
}

static const char *pick(int v, const char *a, const char *b)
{
    return v ? b : a;
}

static struct json_object *dataset_json(const struct ts_dataset_info *d)
{
    struct json_object *o = json_object_new_object();

    json_object_object_add(o, "name", json_object_new_string(d->name));
    json_object_object_add(o, "id", json_u64(d->id));
    json_object_object_add(o, "state", json_object_new_string(pick(d->state, "open", "sealed")));
    json_object_object_add(o, "core", json_object_new_int(d->policy.core));
    json_object_object_add(o, "fringe", json_object_new_int(d->policy.fringe));
    json_object_object_add(o, "min_core", json_object_new_int(d->policy.min_core));
    json_object_object_add(o, "chunk_size", json_u64(d->policy.chunk_size));
    json_object_object_add(o, "created_ns", json_u64(d->created_ns));
    json_object_object_add(o, "shards", json_u64(d->shards));
    json_object_object_add(o, "shards_writing", json_u64(d->shards_writing));
    json_object_object_add(o, "bytes", json_u64(d->bytes));
    return o;
}

static struct json_object *shard_json(const struct ts_shard_info *s)
{
    struct json_object *o = json_object_new_object();
    char crc[16];

    snprintf(crc, sizeof(crc), "%08x", s->crc);
    json_object_object_add(o, "shard", json_u64(s->shard));
    json_object_object_add(o, "state",
                           json_object_new_string(pick(s->state, "writing", "complete")));
    json_object_object_add(o, "size", json_u64(s->size));
    json_object_object_add(o, "declared_size",
                           s->expect_size == TS_SIZE_UNKNOWN ? NULL : json_u64(s->expect_size));
    json_object_object_add(o, "chunk_size", json_u64(s->chunk_size));
    json_object_object_add(o, "chunks", json_u64(s->nchunks));
    json_object_object_add(o, "crc32c", json_object_new_string(crc));
    json_object_object_add(o, "records", json_u64(s->nrecords));
    return o;
}

/* "key:  value" lines with the values lined up. */
static void kv_print(const char *const *kv, size_t n)
{
    size_t w = 0;

    for (size_t i = 0; i < n; i += 2)
        w = TS_MAX(w, strlen(kv[i]));
    for (size_t i = 0; i < n; i += 2)
        printf("%s:%*s %s\n", kv[i], (int)(w - strlen(kv[i])), "", kv[i + 1]);
}

static void dataset_print(const struct ts_dataset_info *d)
{
    char size[32], chunk[32], when[40], shards[64], repl[64], id[24], bytes[64];
    const char *kv[] = {
        "name",     d->name,
        "id",       id,
        "state",    pick(d->state, "open", "sealed"),
        "shards",   shards,
        "size",     bytes,
        "chunk",    cli_human_size(d->policy.chunk_size, chunk, sizeof(chunk)),
        "replicas", repl,
        "created",  cli_time(d->created_ns, when, sizeof(when)),
    };

    snprintf(id, sizeof(id), "%llu", (unsigned long long)d->id);
    snprintf(shards, sizeof(shards), "%u complete, %u being written", d->shards, d->shards_writing);
    snprintf(bytes, sizeof(bytes), "%s (%llu bytes)", cli_human_size(d->bytes, size, sizeof(size)),
             (unsigned long long)d->bytes);
    snprintf(repl, sizeof(repl), "core %u, fringe %u, min_core %u", d->policy.core,
             d->policy.fringe, d->policy.min_core);
    kv_print(kv, TS_ARRAY_SIZE(kv));
}

/* ---- dataset commands ------------------------------------------------------------------------ */

/* Shows dataset NAME (also once it is created). */
static int cmd_dataset_stat(struct ctx *x)
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

static int cmd_dataset_create(struct ctx *x)
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

static int cmd_dataset_ls(struct ctx *x)
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

static int cmd_dataset_seal(struct ctx *x)
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

static int cmd_dataset_rm(struct ctx *x)
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

static int cmd_shard_ls(struct ctx *x)
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

static int cmd_shard_stat(struct ctx *x)
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
static int cmd_put(struct ctx *x)
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

static int cmd_get(struct ctx *x)
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
    rc = get_stream(x, id, x->offset, end, buflen, out.fd, &written);
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

/* ---- scrub / status ----------------------------------------------------------------------------
 */

struct scrub_seen {
    struct json_object *list; /* --json */
    uint64_t n;
};

static void scrub_cb(void *arg, const char *dataset, uint32_t shard, uint32_t chunk, int code)
{
    struct scrub_seen *s = arg;

    s->n++;
    if (s->list) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "dataset", json_object_new_string(dataset));
        json_object_object_add(o, "shard", json_u64(shard));
        json_object_object_add(o, "chunk", json_u64(chunk));
        json_object_object_add(o, "code", json_object_new_string(ts_errname(code)));
        json_object_array_add(s->list, o);
    } else {
        printf("corrupt: dataset %s shard %u chunk %u: %s (%s)\n", dataset, shard, chunk,
               ts_strerror(code), ts_errname(code));
    }
}

static int cmd_scrub(struct ctx *x)
{
    struct scrub_seen seen = {NULL, 0};
    struct ts_scrub_report rep;
    const char *name = x->argc > 0 ? x->argv[0] : NULL;
    int rc;

    if (x->json)
        seen.list = json_object_new_array();
    rc = tessera_scrub(x->c, name, &rep, scrub_cb, &seen);
    if (rc) {
        json_object_put(seen.list);
        return rc;
    }
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "shards", json_u64(rep.shards));
        json_object_object_add(o, "chunks", json_u64(rep.chunks));
        json_object_object_add(o, "bytes", json_u64(rep.bytes));
        json_object_object_add(o, "corrupt", json_u64(rep.corrupt));
        json_object_object_add(o, "corrupt_chunks", seen.list);
        json_object_object_add(o, "pgs_compared", json_u64(rep.pgs_compared));
        json_object_object_add(o, "pgs_differing", json_u64(rep.pgs_differing));
        json_object_object_add(o, "pgs_unchecked", json_u64(rep.pgs_unchecked));
        json_object_object_add(o, "missing_shards", json_u64(rep.missing));
        json_print(o);
    } else {
        char hs[32];
        printf("scrubbed %s: %llu shards, %llu chunks, %s: %llu corrupt%s\n",
               name ? name : "every dataset", (unsigned long long)rep.shards,
               (unsigned long long)rep.chunks, cli_human_size(rep.bytes, hs, sizeof(hs)),
               (unsigned long long)rep.corrupt, rep.corrupt > seen.n ? " (more than listed)" : "");
        if (rep.pgs_compared || rep.pgs_unchecked)
            printf("replicas against their primaries: %u PGs compared, %u short of their primary "
                   "(%llu shards missing, backfill started), %u not comparable now\n",
                   rep.pgs_compared, rep.pgs_differing, (unsigned long long)rep.missing,
                   rep.pgs_unchecked);
    }
    if (rep.corrupt) {
        snprintf(x->local, sizeof(x->local), "%llu corrupt chunk%s found",
                 (unsigned long long)rep.corrupt, rep.corrupt == 1 ? "" : "s");
        return TS_ECORRUPT;
    }
    if (rep.pgs_differing) {
        snprintf(x->local, sizeof(x->local),
                 "%u PG replica%s short of the primary (%llu shards missing; backfill started)",
                 rep.pgs_differing, rep.pgs_differing == 1 ? "" : "s",
                 (unsigned long long)rep.missing);
        return TS_ECORRUPT;
    }
    return 0;
}

static int humanized_key(const char *key)
{
    size_t n = strlen(key);

    return strcmp(key, "bytes") == 0 || strcmp(key, "size") == 0 ||
           (n > 6 && strcmp(key + n - 6, "_bytes") == 0) ||
           (n > 5 && strcmp(key + n - 5, "_size") == 0);
}

/* Prints a JSON document as "a.b.c: value" lines; arrays of objects as tables. */
static void status_flatten(struct json_object *o, const char *prefix, struct cli_table *kv,
                           int *tables)
{
    char key[256], val[128], hs[32];

    if (json_object_is_type(o, json_type_object)) {
        json_object_object_foreach(o, k, v)
        {
            snprintf(key, sizeof(key), "%s%s%s", prefix, prefix[0] ? "." : "", k);
            if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
                json_object_is_type(json_object_array_get_idx(v, 0), json_type_object)) {
                (*tables)++;
                continue; /* printed after the scalars */
            }
            if (json_object_is_type(v, json_type_object) ||
                json_object_is_type(v, json_type_array)) {
                status_flatten(v, key, kv, tables);
                continue;
            }
            if (humanized_key(k) && json_object_is_type(v, json_type_int))
                snprintf(val, sizeof(val), "%s",
                         cli_human_size(json_object_get_uint64(v), hs, sizeof(hs)));
            else if (json_object_is_type(v, json_type_double))
                snprintf(val, sizeof(val), "%.1f", json_object_get_double(v));
            else
                snprintf(val, sizeof(val), "%s", json_object_get_string(v));
            if (!val[0])
                snprintf(val, sizeof(val), "-");
            const char *row[] = {key, val};
            cli_table_add(kv, row);
        }
    } else if (json_object_is_type(o, json_type_array)) {
        size_t n = json_object_array_length(o), off = 0;
        val[0] = '\0';
        for (size_t i = 0; i < n && off < sizeof(val); i++)
            off += (size_t)snprintf(val + off, sizeof(val) - off, "%s%s", i ? ", " : "",
                                    json_object_get_string(json_object_array_get_idx(o, i)));
        const char *row[] = {prefix, n ? val : "-"};
        cli_table_add(kv, row);
    }
}

/* Arrays of objects at the top level, one table each. */
static void status_tables(struct json_object *o)
{
    json_object_object_foreach(o, k, v)
    {
        struct json_object *first;
        const char *hdr[CLI_TABLE_MAXCOLS], *row[CLI_TABLE_MAXCOLS];
        char cells[CLI_TABLE_MAXCOLS][64], names[CLI_TABLE_MAXCOLS][64], hs[32];
        struct cli_table t;
        size_t ncols = 0;

        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
            continue;
        first = json_object_array_get_idx(v, 0);
        if (!json_object_is_type(first, json_type_object))
            continue;
        json_object_object_foreach(first, ck, cv)
        {
            (void)cv;
            if (ncols < CLI_TABLE_MAXCOLS)
                hdr[ncols++] = ck;
        }
        for (size_t i = 0; i < ncols; i++) { /* headers in capitals, like the other tables */
            size_t j = 0;
            for (; hdr[i][j] && j + 1 < sizeof(names[i]); j++)
                names[i][j] =
                    (char)(hdr[i][j] >= 'a' && hdr[i][j] <= 'z' ? hdr[i][j] - 32 : hdr[i][j]);
            names[i][j] = '\0';
            row[i] = names[i];
        }
        if (!ncols || cli_table_init(&t, ncols, 0, row))
            continue;
        for (size_t r = 0; r < json_object_array_length(v); r++) {
            struct json_object *e = json_object_array_get_idx(v, r), *ev;
            for (size_t i = 0; i < ncols; i++) {
                if (!json_object_object_get_ex(e, hdr[i], &ev))
                    snprintf(cells[i], sizeof(cells[i]), "-");
                else if (humanized_key(hdr[i]) && json_object_is_type(ev, json_type_int))
                    snprintf(cells[i], sizeof(cells[i]), "%s",
                             cli_human_size(json_object_get_uint64(ev), hs, sizeof(hs)));
                else
                    snprintf(cells[i], sizeof(cells[i]), "%s", json_object_get_string(ev));
                row[i] = cells[i];
            }
            cli_table_add(&t, row);
        }
        printf("\n%s:\n", k);
        cli_table_done(&t, 0, stdout);
    }
}

static int status_cluster(struct ctx *x, const struct ts_map *m);

static int cmd_status(struct ctx *x)
{
    static const char *const hdr[] = {"KEY", "VALUE"};
    const struct ts_map *m = ts_client_map(x->c);
    const char *where = x->server;
    struct json_object *doc;
    struct cli_table kv;
    char *json = NULL;
    int rc, tables = 0, i = -1;

    if (m && !x->node)
        return status_cluster(x, m);
    if (x->node && (!m || (i = ts_map_find(m, x->node)) < 0)) {
        snprintf(x->local, sizeof(x->local), "no node '%s' in the cluster map%s", x->node,
                 m ? "" : " (there is none: a single node)");
        return TS_EINVAL;
    }
    if (i >= 0) {
        where = m->nodes[i].addr;
        rc = ts_client_node_status(x->c, (size_t)i, &json);
    } else {
        rc = tessera_status(x->c, &json);
    }
    if (rc)
        return rc;
    doc = json_tokener_parse(json);
    if (!doc) {
        /* Not JSON after all: show it as it came. */
        puts(json);
        free(json);
        return 0;
    }
    free(json);
    if (x->json || !json_object_is_type(doc, json_type_object)) {
        json_print(doc);
        return 0;
    }
    printf("server: %s (node %s, role %s)\n", where, i >= 0 ? x->node : tessera_client_node(x->c),
           ts_role_name(tessera_client_role(x->c)));
    if (cli_table_init(&kv, 2, 0, hdr) == 0) {
        status_flatten(doc, "", &kv, &tables);
        /* Without the header row: a "key: value" listing. */
        size_t w = 0;
        for (size_t r = 1; r < kv.nrows; r++)
            w = TS_MAX(w, strlen(kv.cells[r * 2]));
        for (size_t r = 1; r < kv.nrows; r++)
            printf("%s:%*s %s\n", kv.cells[r * 2], (int)(w - strlen(kv.cells[r * 2])), "",
                   kv.cells[r * 2 + 1]);
        cli_table_fini(&kv);
    }
    if (tables)
        status_tables(doc);
    json_object_put(doc);
    return 0;
}

/* ---- cluster commands ---------------------------------------------------------------------- */

/* The handle's cluster map, or a local error on a single node. */
static const struct ts_map *need_map(struct ctx *x)
{
    const struct ts_map *m = ts_client_map(x->c);

    if (!m)
        snprintf(x->local, sizeof(x->local),
                 "%s (node %s) has no cluster map: it runs as a single node", x->server,
                 tessera_client_node(x->c));
    return m;
}

static struct json_object *map_node_json(const struct ts_map_node *nd, unsigned primary_pgs)
{
    struct json_object *o = json_object_new_object();

    json_object_object_add(o, "id", json_object_new_string(nd->id));
    json_object_object_add(o, "addr", json_object_new_string(nd->addr));
    json_object_object_add(o, "tls_addr", json_object_new_string(nd->tls_addr));
    json_object_object_add(o, "domain", json_object_new_string(nd->domain));
    json_object_object_add(o, "weight", json_u64(nd->weight));
    json_object_object_add(o, "state", json_object_new_string(ts_node_state_name(nd->state)));
    json_object_object_add(o, "primary_pgs", json_u64(primary_pgs));
    return o;
}

static int cmd_map_show(struct ctx *x)
{
    static const char *const hdr[] = {"ID",     "ADDR",  "TLS_ADDR",   "DOMAIN",
                                      "WEIGHT", "STATE", "PRIMARY_PGS"};
    const struct ts_map *m = ts_client_map(x->c);
    unsigned *leads, count[3] = {0, 0, 0};
    struct cli_table t;
    int rc;

    if (!m) {
        if (x->json) {
            struct json_object *o = json_object_new_object();
            json_object_object_add(o, "epoch", json_u64(0));
            json_object_object_add(o, "pg_count", json_u64(0));
            json_object_object_add(o, "nodes", json_object_new_array());
            json_print(o);
        } else {
            printf("node %s has no cluster map (a single node, epoch 0)\n",
                   tessera_client_node(x->c));
        }
        return 0;
    }
    leads = calloc(m->n, sizeof(*leads));
    if (!leads)
        return TS_ENOMEM;
    for (uint32_t pg = 0; pg < m->pg_count; pg++) {
        int first[1];
        if (ts_map_pg_order(m, pg, first, 1) == 1)
            leads[first[0]]++;
    }
    if (x->json) {
        struct json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "epoch", json_u64(m->epoch));
        json_object_object_add(o, "pg_count", json_u64(m->pg_count));
        for (size_t i = 0; i < m->n; i++)
            json_object_array_add(a, map_node_json(&m->nodes[i], leads[i]));
        json_object_object_add(o, "nodes", a);
        json_print(o);
        free(leads);
        return 0;
    }
    for (size_t i = 0; i < m->n; i++)
        if (m->nodes[i].state >= 0 && m->nodes[i].state <= 2)
            count[m->nodes[i].state]++;
    printf("epoch:    %llu\npg_count: %u\nnodes:    %zu (%u up, %u down, %u out)\n\n",
           (unsigned long long)m->epoch, m->pg_count, m->n, count[0], count[1], count[2]);
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x50, hdr);
    for (size_t i = 0; i < m->n && !rc; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        char weight[16], lead[16];
        const char *row[] = {nd->id,
                             nd->addr,
                             nd->tls_addr[0] ? nd->tls_addr : "-",
                             nd->domain[0] ? nd->domain : "-",
                             weight,
                             ts_node_state_name(nd->state),
                             lead};
        snprintf(weight, sizeof(weight), "%u", nd->weight);
        snprintf(lead, sizeof(lead), "%u", leads[i]);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
    free(leads);
    return rc;
}

/* `map push FILE` without -s: connect to the first node of the file that is up. */
static void map_push_seed(struct ctx *x, const struct tessera_opts *o)
{
    static char addr[sizeof(((struct ts_map_node *)0)->addr)];
    struct ts_map *m = NULL;

    if (x->argc < 1 || ts_map_parse_file(x->argv[0], &m, NULL, 0) != 0)
        return; /* the push itself says what is wrong with the file */
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        if (nd->state != TS_NODE_UP)
            continue;
        snprintf(addr, sizeof(addr), "%s", o->tls_ca && nd->tls_addr[0] ? nd->tls_addr : nd->addr);
        x->server = addr;
        break;
    }
    ts_map_free(m);
}

static int cmd_map_push(struct ctx *x)
{
    const char *file = x->argv[0];
    uint64_t epoch = 0;
    int rc;

    rc = tessera_map_push_file(x->c, file, &epoch);
    if (rc)
        return rc;
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "file", json_object_new_string(file));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "note",
                               tessera_client_error(x->c)[0]
                                   ? json_object_new_string(tessera_client_error(x->c))
                                   : NULL);
        json_print(o);
    } else {
        printf("pushed map %s at epoch %llu\n", file, (unsigned long long)epoch);
        if (tessera_client_error(x->c)[0]) /* nodes that are not up and did not take it */
            fprintf(stderr, "tessera: map push: note: %s\n", tessera_client_error(x->c));
    }
    return 0;
}

static int cmd_failover(struct ctx *x)
{
    const struct ts_map *m = need_map(x);
    char old[64] = "?", now[64] = "?";
    uint64_t pg, epoch = 0;
    int first[1], rc;

    if (!m)
        return TS_EINVAL;
    (void)cli_parse_uint(x->argv[0], UINT32_MAX, &pg); /* checked with the arguments */
    if (ts_map_pg_order(m, (uint32_t)pg, first, 1) == 1)
        snprintf(old, sizeof(old), "%s", m->nodes[first[0]].id);
    rc = tessera_failover(x->c, (uint32_t)pg, &epoch);
    if (rc)
        return rc;
    m = ts_client_map(x->c);
    if (ts_map_pg_order(m, (uint32_t)pg, first, 1) == 1)
        snprintf(now, sizeof(now), "%s", m->nodes[first[0]].id);
    if (x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "pg", json_u64(pg));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "old_primary", json_object_new_string(old));
        json_object_object_add(o, "new_primary", json_object_new_string(now));
        json_print(o);
    } else {
        printf("PG %llu: primary %s -> %s (%s marked down), map epoch %llu\n",
               (unsigned long long)pg, old, now, old, (unsigned long long)epoch);
    }
    return 0;
}

static int cmd_pg(struct ctx *x)
{
    static const char *const hdr[] = {"RANK", "NODE", "ADDR", "DOMAIN", "ROLE"};
    const struct ts_map *m = need_map(x);
    struct ts_dataset_info d;
    struct cli_table t;
    int order[256], rc;
    unsigned core = 0, fringe = 0;
    uint64_t pg = 0;
    size_t n;

    if (!m)
        return TS_EINVAL;
    if (x->dataset) {
        rc = tessera_dataset_stat(x->c, x->dataset, &d);
        if (rc)
            return rc;
        core = d.policy.core;
        fringe = d.policy.fringe;
        m = ts_client_map(x->c); /* may have been refreshed */
    }
    if (x->argc > 0)
        (void)cli_parse_uint(x->argv[0], UINT32_MAX, &pg);
    else
        pg = ts_map_pg_of(m, x->dataset, (uint32_t)x->shard);
    if (pg >= m->pg_count) {
        snprintf(x->local, sizeof(x->local), "the cluster has PGs 0 to %u", m->pg_count - 1);
        return TS_EINVAL;
    }
    n = ts_map_pg_order(m, (uint32_t)pg, order, TS_ARRAY_SIZE(order));
    if (x->json) {
        struct json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "pg", json_u64(pg));
        json_object_object_add(o, "epoch", json_u64(m->epoch));
        json_object_object_add(o, "dataset",
                               x->dataset ? json_object_new_string(x->dataset) : NULL);
        if (x->shard_set)
            json_object_object_add(o, "shard", json_u64(x->shard));
        for (size_t i = 0; i < n; i++) {
            struct json_object *e = json_object_new_object();
            const char *role = i == 0                      ? "primary"
                               : !x->dataset               ? NULL
                               : i < core                  ? "core"
                               : i < (size_t)core + fringe ? "fringe"
                                                           : NULL;
            json_object_object_add(e, "rank", json_u64(i));
            json_object_object_add(e, "node", json_object_new_string(m->nodes[order[i]].id));
            json_object_object_add(e, "addr", json_object_new_string(m->nodes[order[i]].addr));
            json_object_object_add(e, "role", role ? json_object_new_string(role) : NULL);
            json_object_array_add(a, e);
        }
        json_object_object_add(o, "order", a);
        json_print(o);
        return 0;
    }
    printf("PG %llu, map epoch %llu", (unsigned long long)pg, (unsigned long long)m->epoch);
    if (x->dataset)
        printf(", dataset %s (core %u, fringe %u)", x->dataset, core, fringe);
    if (x->shard_set)
        printf(" shard %llu", (unsigned long long)x->shard);
    printf(": %zu node%s up\n", n, n == 1 ? "" : "s");
    rc = cli_table_init(&t, TS_ARRAY_SIZE(hdr), 0x1, hdr);
    for (size_t i = 0; i < n && !rc; i++) {
        const struct ts_map_node *nd = &m->nodes[order[i]];
        char rank[24];
        const char *role = i == 0                      ? "primary"
                           : !x->dataset               ? "-"
                           : i < core                  ? "core"
                           : i < (size_t)core + fringe ? "fringe"
                                                       : "-";
        const char *row[] = {rank, nd->id, nd->addr, nd->domain[0] ? nd->domain : "-", role};
        snprintf(rank, sizeof(rank), "%zu", i);
        rc = cli_table_add(&t, row);
    }
    rc = cli_table_done(&t, rc, stdout);
    if (!x->dataset)
        printf("(--dataset NAME shows which ranks are its core and fringe replicas)\n");
    return rc;
}

/* A JSON member as text ("-" when absent). */
static const char *jstr(struct json_object *o, const char *key, char *buf, size_t cap)
{
    struct json_object *v;

    if (!o || !json_object_object_get_ex(o, key, &v) || !v)
        return "-";
    if (json_object_is_type(v, json_type_double))
        snprintf(buf, cap, "%.3f", json_object_get_double(v));
    else
        snprintf(buf, cap, "%s", json_object_get_string(v));
    return buf;
}

/* A JSON member holding bytes, as a human-readable size ("-" when absent). */
static const char *jsize(struct json_object *o, const char *key, char *buf, size_t cap)
{
    struct json_object *v;

    if (json_object_object_get_ex(o, key, &v))
        return cli_human_size(json_object_get_uint64(v), buf, cap);
    snprintf(buf, cap, "-");
    return buf;
}

/* The "replication" object of a node's STATUS: replicas of the PGs it leads, and lagging ones. */
static void status_replication(struct json_object *rep)
{
    static const char *const rhdr[] = {"REPLICA",   "PGS",       "CORE_PGS",  "LAG_OPS",
                                       "LAG_BYTES", "MAX_LAG_S", "RECOVERING"};
    static const char *const lhdr[] = {"PG",      "REPLICA",   "ROLE",  "APPLIED",   "PRIMARY",
                                       "LAG_OPS", "LAG_BYTES", "LAG_S", "RECOVERING"};
    static const char *const phdr[] = {"PG", "STATE", "EPOCH", "SINCE_S", "WHY"};
    struct json_object *per, *lag, *peering;
    struct cli_table t;
    char b[9][64];

    printf("primary of %s PGs (%s active, %s peering), %s repairs; recovering %s replica PGs "
           "(not served from this node until confirmed)\n",
           jstr(rep, "primary_pgs", b[0], 64), jstr(rep, "pgs_active", b[2], 64),
           jstr(rep, "pgs_peering", b[3], 64), jstr(rep, "repairs", b[1], 64),
           jstr(rep, "pgs_not_confirmed", b[4], 64));
    if (json_object_object_get_ex(rep, "peering", &peering) &&
        json_object_is_type(peering, json_type_array) && json_object_array_length(peering) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(phdr), 0x0c, phdr) == 0) {
        for (size_t i = 0; i < json_object_array_length(peering); i++) {
            struct json_object *o = json_object_array_get_idx(peering, i);
            const char *row[] = {jstr(o, "pg", b[0], 64), jstr(o, "state", b[1], 64),
                                 jstr(o, "epoch", b[2], 64), jstr(o, "since_s", b[3], 64),
                                 json_object_get_string(json_object_object_get(o, "why"))};
            cli_table_add(&t, row);
        }
        printf("PGs it leads that do not take writes yet:\n");
        cli_table_done(&t, 0, stdout);
    }
    if (json_object_object_get_ex(rep, "replicas", &per) &&
        json_object_is_type(per, json_type_object) && json_object_object_length(per) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(rhdr), 0x7e, rhdr) == 0) {
        json_object_object_foreach(per, node, o)
        {
            const char *row[] = {node,
                                 jstr(o, "pgs", b[1], 64),
                                 jstr(o, "core_pgs", b[2], 64),
                                 jstr(o, "lag_ops", b[3], 64),
                                 jsize(o, "lag_bytes", b[4], 64),
                                 jstr(o, "max_lag_s", b[5], 64),
                                 jstr(o, "recovering_pgs", b[6], 64)};
            cli_table_add(&t, row);
        }
        printf("replicas of the PGs it leads:\n");
        cli_table_done(&t, 0, stdout);
    }
    if (json_object_object_get_ex(rep, "lag", &lag) && json_object_is_type(lag, json_type_array) &&
        json_object_array_length(lag) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(lhdr), 0xf9, lhdr) == 0) {
        for (size_t i = 0; i < json_object_array_length(lag); i++) {
            struct json_object *o = json_object_array_get_idx(lag, i);
            const char *row[] = {jstr(o, "pg", b[0], 64),
                                 jstr(o, "node", b[1], 64),
                                 jstr(o, "role", b[2], 64),
                                 jstr(o, "applied", b[3], 64),
                                 jstr(o, "primary_applied", b[4], 64),
                                 jstr(o, "lag_ops", b[5], 64),
                                 jsize(o, "lag_bytes", b[6], 64),
                                 jstr(o, "lag_s", b[7], 64),
                                 jstr(o, "recovering", b[8], 64)};
            cli_table_add(&t, row);
        }
        printf("lagging or recovering (PG, replica) pairs:\n");
        cli_table_done(&t, 0, stdout);
    } else {
        printf("no replica lags\n");
    }
}

/*
 * `status` on a cluster: every node of the map, one section each (or with --json, an array of
 * {node, addr, state, status | error}). 1 when a node that is up in the map did not answer.
 */
static int status_cluster(struct ctx *x, const struct ts_map *m)
{
    struct json_object *all = x->json ? json_object_new_array() : NULL;
    char b[4][64];
    int bad = 0;

    if (!x->json)
        printf("cluster: map epoch %llu, %u PGs, %zu nodes (asked via %s)\n",
               (unsigned long long)m->epoch, m->pg_count, m->n, x->server);
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        struct json_object *doc = NULL, *cl = NULL, *rep = NULL;
        char *json = NULL;
        int rc;

        rc = ts_client_node_status(x->c, i, &json);
        if (!rc) {
            doc = json_tokener_parse(json);
            free(json);
            if (!doc)
                rc = TS_EPROTO;
        }
        if (rc && nd->state == TS_NODE_UP)
            bad = 1;
        if (all) {
            struct json_object *e = json_object_new_object();
            json_object_object_add(e, "node", json_object_new_string(nd->id));
            json_object_object_add(e, "addr", json_object_new_string(nd->addr));
            json_object_object_add(e, "state",
                                   json_object_new_string(ts_node_state_name(nd->state)));
            json_object_object_add(e, "status", doc);
            json_object_object_add(e, "error",
                                   rc ? json_object_new_string(tessera_client_error(x->c)[0]
                                                                   ? tessera_client_error(x->c)
                                                                   : ts_strerror(rc))
                                      : NULL);
            json_object_array_add(all, e);
            continue;
        }
        printf("\n%s (%s%s%s, %s in the map): ", nd->id, nd->addr, nd->domain[0] ? ", " : "",
               nd->domain, ts_node_state_name(nd->state));
        if (rc) {
            printf("unreachable: %s (%s)%s%s\n", ts_strerror(rc), ts_errname(rc),
                   tessera_client_error(x->c)[0] ? ": " : "", tessera_client_error(x->c));
            continue;
        }
        json_object_object_get_ex(doc, "cluster", &cl);
        printf("up, epoch %s, pid %s, uptime %s s\n", jstr(cl, "epoch", b[0], 64),
               jstr(doc, "pid", b[1], 64), jstr(doc, "uptime_s", b[2], 64));
        if (cl && json_object_is_type(cl, json_type_object)) {
            struct json_object *e;
            if (json_object_object_get_ex(cl, "epoch", &e) && json_object_get_uint64(e) != m->epoch)
                printf("its map epoch differs from this client's (%llu)\n",
                       (unsigned long long)m->epoch);
        }
        if (json_object_object_get_ex(doc, "replication", &rep) &&
            json_object_is_type(rep, json_type_object))
            status_replication(rep);
        json_object_put(doc);
    }
    if (all)
        json_print(all);
    if (bad)
        snprintf(x->local, sizeof(x->local), "a node that is up in the map did not answer");
    return bad ? TS_EUNAVAIL : 0;
}

/* ---- the command table ------------------------------------------------------------------------
 */

static const struct cmd cmds[] = {
    {"dataset", "create", 1, 1, 1, create_opts, cmd_dataset_create,
     "NAME [--core N] [--fringe N] [--min-core N] [--chunk-size B]",
     "Creates a dataset. --core: synchronous replicas (default 1), --fringe: asynchronous\n"
     "replicas (default 0), --min-core: core replicas that must hold a write (default: a\n"
     "majority of core, core/2+1; 0 means the same), --chunk-size: bytes per chunk, with\n"
     "K/M/G suffixes (default 1M, at least 4K).",
     0},
    {"dataset", "ls", 0, 0, 0, no_opts, cmd_dataset_ls, "", "Lists the datasets.", 0},
    {"dataset", "stat", 1, 1, 1, no_opts, cmd_dataset_stat, "NAME", "Shows one dataset.", 0},
    {"dataset", "seal", 1, 1, 1, no_opts, cmd_dataset_seal, "NAME",
     "Seals a dataset: no more shards can be added. Fails while an upload is incomplete.", 0},
    {"dataset", "rm", 1, 1, 1, no_opts, cmd_dataset_rm, "NAME",
     "Deletes a dataset and all its shards (admin role).", 0},
    {"shard", "ls", 1, 1, 1, no_opts, cmd_shard_ls, "NAME", "Lists the shards of a dataset.", 0},
    {"shard", "stat", 2, 2, 2, no_opts, cmd_shard_stat, "NAME SHARD", "Shows one shard.", 0},
    {NULL, "put", 3, 3, 2, no_opts, cmd_put, "NAME SHARD FILE",
     "Uploads FILE ('-': standard input, read to its end) as shard SHARD of dataset NAME and\n"
     "seals the shard. Every chunk carries its CRC32C; the server acknowledges each once it\n"
     "is durable. A FILE that changes size during the upload fails it (nothing is sealed).",
     0},
    {NULL, "get", 2, 2, 2, get_opts, cmd_get, "NAME SHARD [-o FILE] [--offset O] [--length L]",
     "Reads a shard (or the range from --offset, --length bytes; K/M/G suffixes) to FILE\n"
     "or standard output, verifying every piece's CRC32C. FILE is written as FILE.tmp.PID\n"
     "and renamed over FILE once complete: a failed get leaves FILE as it was.",
     0},
    {NULL, "scrub", 0, 1, 1, no_opts, cmd_scrub, "[NAME]",
     "Re-verifies every stored chunk of NAME (or of every dataset) on the server and lists\n"
     "corrupt ones; exits 1 when any is found. Waits without a timeout unless --timeout.",
     0},
    {NULL, "status", 0, 0, 0, status_opts, cmd_status, "[--node ID]",
     "Shows the server's status: node, listeners, connections, counters, datasets.\n"
     "On a cluster: one section per node of the map (reachable, epoch, the PGs it leads,\n"
     "its replicas' applied position and lag in operations, bytes and seconds); exits 1\n"
     "when a node that is up in the map does not answer. --node ID: that node's whole status.",
     0},
    {"map", "show", 0, 0, 0, no_opts, cmd_map_show, "",
     "Shows the cluster map the server has: epoch, PG count, and every node's id, addresses,\n"
     "failure domain, weight, state and how many PGs it leads.",
     1},
    {"map", "push", 1, 1, 1, no_opts, cmd_map_push, "FILE",
     "Pushes the map FILE to every node it lists (admin role): its epoch becomes one more\n"
     "than the highest epoch of the file and of every reachable node, and is written back\n"
     "into FILE first. Fails when a node that is up in the map does not take it. Without\n"
     "-s it connects to the first node of FILE that is up.",
     1},
    {NULL, "failover", 1, 1, 1, no_opts, cmd_failover, "PG",
     "Fails over placement group PG (admin role): its primary is marked down in a new map\n"
     "epoch, pushed to every other node that is up; the next core replica leads. Edit the\n"
     "map file to match before the next 'map push'.",
     1},
    {NULL, "pg", 0, 1, 1, pg_opts, cmd_pg, "[PG] [--dataset NAME [--shard N]]",
     "Shows a placement group's replica order (rank 0 is the primary). With --dataset, the\n"
     "roles of its core and fringe replicas; with --shard too, the PG of that shard.",
     1},
};

static void usage_cmd(FILE *f, const struct cmd *k)
{
    fprintf(f, "usage: tessera [OPTIONS] %s%s%s%s%s\n\n%s\n", k->group ? k->group : "",
            k->group ? " " : "", k->name, k->args[0] ? " " : "", k->args, k->help);
}

static void usage(FILE *f)
{
    fputs("usage: tessera [OPTIONS] COMMAND [ARGS]\n"
          "\n"
          "Options (anywhere on the line):\n"
          "  -s, --server HOST:PORT   server address (default $TESSERA_SERVER, else "
          "127.0.0.1:7070)\n"
          "      --tls-ca FILE        CA bundle (PEM): connect with TLS 1.3 and verify the "
          "server\n"
          "      --tls-cert FILE      client certificate (PEM) for mutual TLS (with --tls-ca)\n"
          "      --tls-key FILE       its private key (PEM)\n"
          "      --tls-server-name N  name expected in the server certificate (default: "
          "HOST)\n"
          "      --json               machine-readable output (JSON)\n"
          "      --timeout MS         per-request timeout in milliseconds (default 30000)\n"
          "  -v, --verbose            log what the library does to stderr\n"
          "  -h, --help               this help; 'tessera COMMAND --help' for a command's\n"
          "\n"
          "Commands:\n",
          f);
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++) {
        char line[128];
        if (cmds[i].cluster && (i == 0 || !cmds[i - 1].cluster))
            fputs("\nCluster commands:\n", f);
        snprintf(line, sizeof(line), "%s%s%s%s%s", cmds[i].group ? cmds[i].group : "",
                 cmds[i].group ? " " : "", cmds[i].name, cmds[i].args[0] ? " " : "", cmds[i].args);
        fprintf(f, "  %s\n", line);
    }
    fputs("\nSizes take K, M, G, T suffixes (powers of 1024). See docs/client.md.\n", f);
}

/* A usage error: one line on stderr, exit status 2. */
static int usage_error(const char *what, const struct cmd *k)
{
    if (k)
        fprintf(stderr, "tessera: %s%s%s: %s (see 'tessera %s%s%s --help')\n",
                k->group ? k->group : "", k->group ? " " : "", k->name, what,
                k->group ? k->group : "", k->group ? " " : "", k->name);
    else
        fprintf(stderr, "tessera: %s (see 'tessera --help')\n", what);
    return EXIT_USAGE;
}

static const struct cmd *find_cmd(const char *group, const char *name)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++) {
        const struct cmd *k = &cmds[i];
        if (k->group ? (group && strcmp(k->group, group) == 0 && name && strcmp(k->name, name) == 0)
                     : (!group && strcmp(k->name, name) == 0))
            return k;
    }
    return NULL;
}

static int is_group(const char *w)
{
    return strcmp(w, "dataset") == 0 || strcmp(w, "shard") == 0 || strcmp(w, "map") == 0;
}

static void usage_group(FILE *f, const char *group)
{
    fprintf(f, "usage: tessera [OPTIONS] %s SUBCOMMAND\n\n", group);
    for (size_t i = 0; i < TS_ARRAY_SIZE(cmds); i++)
        if (cmds[i].group && strcmp(cmds[i].group, group) == 0)
            fprintf(f, "  %s %s%s%s\n", group, cmds[i].name, cmds[i].args[0] ? " " : "",
                    cmds[i].args);
}

/* A size option's value, or a usage error. */
static int opt_size(const struct cmd *k, const char *opt, const char *val, uint64_t max,
                    uint64_t *out)
{
    char msg[200];
    int rc = cli_parse_size(val, out);

    if (!rc && *out > max)
        rc = TS_ERANGE;
    if (!rc)
        return 0;
    snprintf(msg, sizeof(msg), "--%s: '%s' is not a size%s (e.g. 4096, 64K, 1M, 2G)", opt, val,
             rc == TS_ERANGE ? " in range" : "");
    return usage_error(msg, k);
}

static int opt_u8(const struct cmd *k, const char *opt, const char *val, uint8_t *out)
{
    char msg[160];
    uint64_t v;

    if (cli_parse_uint(val, UINT8_MAX, &v) == 0) {
        *out = (uint8_t)v;
        return 0;
    }
    snprintf(msg, sizeof(msg), "--%s: '%s' is not a number from 0 to 255", opt, val);
    return usage_error(msg, k);
}

static void print_error(const struct ctx *x, const struct cmd *k, int rc)
{
    char where[512];
    const char *srv = x->c ? tessera_client_error(x->c) : "";
    size_t off;

    off = (size_t)snprintf(where, sizeof(where), "%s%s%s", k->group ? k->group : "",
                           k->group ? " " : "", k->name);
    for (int i = 0; i < x->argc && i < k->ctx_args && off < sizeof(where); i++)
        off += (size_t)snprintf(where + off, sizeof(where) - off, " %s", x->argv[i]);
    if (x->local[0])
        srv = x->local;
    if (srv[0])
        fprintf(stderr, "tessera: %s: %s (%s): %s\n", where, ts_strerror(rc), ts_errname(rc), srv);
    else
        fprintf(stderr, "tessera: %s: %s (%s)\n", where, ts_strerror(rc), ts_errname(rc));
}

/* Keep going after parsing. */
#define CLI_RUN (-1)

/*
 * Parses the command line into x, opts and *kout; positional arguments go into x->argv
 * (room for argc). CLI_RUN to go on, else the exit status (help printed, or a usage error).
 */
static int parse_args(int argc, char **argv, struct ctx *x, struct tessera_opts *opts,
                      const struct cmd **kout, int *verbose)
{
    const struct cli_opt *tables[2] = {global_opts, NULL}, *o;
    const struct cmd *k = NULL;
    const char *group = NULL, *val;
    struct cli_iter it;
    struct ts_addr addr;
    enum cli_token tok;
    char msg[512], why[160];
    int help = 0;
    uint64_t v;

    cli_iter_init(&it, argc - 1, argv + 1);
    while ((tok = cli_next(&it, tables, 2, &o, &val)) != CLI_END) {
        if (tok == CLI_ERR)
            return usage_error(it.err, k);
        if (tok == CLI_POS) {
            if (k) {
                x->argv[x->argc++] = (char *)val;
            } else if (!group && is_group(val)) {
                group = val;
            } else {
                k = find_cmd(group, val);
                if (!k) {
                    snprintf(msg, sizeof(msg), "unknown command '%s%s%s'", group ? group : "",
                             group ? " " : "", val);
                    return usage_error(msg, NULL);
                }
                tables[1] = k->opts;
            }
            continue;
        }
        switch (o->id) {
        case O_HELP:
            help = 1;
            break;
        case O_SERVER:
            x->server = val;
            x->server_set = 1;
            break;
        case O_TLS_CA:
            opts->tls_ca = val;
            break;
        case O_TLS_CERT:
            opts->tls_cert = val;
            break;
        case O_TLS_KEY:
            opts->tls_key = val;
            break;
        case O_TLS_NAME:
            opts->tls_server_name = val;
            break;
        case O_JSON:
            x->json = 1;
            break;
        case O_VERBOSE:
            *verbose = 1;
            break;
        case O_TIMEOUT:
            if (cli_parse_uint(val, INT32_MAX, &v) != 0 || v == 0)
                return usage_error("--timeout: want milliseconds, 1 or more", k);
            opts->timeout_ms = (int)v;
            x->timeout_set = 1;
            break;
        case O_CORE:
        case O_FRINGE:
        case O_MIN_CORE:
            if (opt_u8(k, o->name, val,
                       o->id == O_CORE     ? &x->policy.core
                       : o->id == O_FRINGE ? &x->policy.fringe
                                           : &x->policy.min_core))
                return EXIT_USAGE;
            x->min_core_set |= o->id == O_MIN_CORE;
            break;
        case O_CHUNK:
            if (opt_size(k, o->name, val, UINT32_MAX, &v))
                return EXIT_USAGE;
            x->policy.chunk_size = (uint32_t)v;
            break;
        case O_OUTPUT:
            x->output = val;
            break;
        case O_OFFSET:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->offset))
                return EXIT_USAGE;
            break;
        case O_DATASET:
            x->dataset = val;
            break;
        case O_SHARD:
            if (cli_parse_uint(val, UINT32_MAX, &x->shard) != 0) {
                snprintf(msg, sizeof(msg), "--shard: '%s' is not a shard number (0 to %u)", val,
                         UINT32_MAX);
                return usage_error(msg, k);
            }
            x->shard_set = 1;
            break;
        case O_NODE:
            x->node = val;
            break;
        case O_LENGTH:
            if (opt_size(k, o->name, val, UINT64_MAX, &x->length))
                return EXIT_USAGE;
            x->length_set = 1;
            break;
        }
    }
    if (help) {
        if (k)
            usage_cmd(stdout, k);
        else if (group)
            usage_group(stdout, group);
        else
            usage(stdout);
        return 0;
    }
    if (!k && !group)
        return usage_error("no command given", NULL);
    if (!k) {
        fprintf(stderr, "tessera: '%s' needs a subcommand (see 'tessera %s --help')\n", group,
                group);
        return EXIT_USAGE;
    }
    if (x->argc < k->min_args || x->argc > k->max_args)
        return usage_error(x->argc < k->min_args ? "missing arguments" : "too many arguments", k);
    /* A SHARD argument is checked before connecting: a typo is a usage error. */
    if (strstr(k->args, "NAME SHARD") == k->args &&
        cli_parse_uint(x->argv[1], UINT32_MAX, &v) != 0) {
        snprintf(msg, sizeof(msg), "'%s' is not a shard number (0 to %u)", x->argv[1], UINT32_MAX);
        return usage_error(msg, k);
    }
    /* PG arguments too; `pg` needs a PG or --dataset with --shard. */
    if ((k->run == cmd_failover || k->run == cmd_pg) && x->argc > 0 &&
        cli_parse_uint(x->argv[0], UINT32_MAX, &v) != 0) {
        snprintf(msg, sizeof(msg), "'%s' is not a PG number", x->argv[0]);
        return usage_error(msg, k);
    }
    if (k->run == cmd_pg && x->argc == 0 && !(x->dataset && x->shard_set))
        return usage_error("give a PG, or --dataset NAME --shard N", k);
    if (k->run == cmd_pg && x->shard_set && !x->dataset)
        return usage_error("--shard needs --dataset", k);
    if (ts_addr_parse_why(x->server, &addr, why, sizeof(why)) != 0) {
        snprintf(msg, sizeof(msg), "bad server address '%s': %s", x->server, why);
        return usage_error(msg, NULL);
    }
    /* TLS is chosen by --tls-ca: a certificate without it would silently go over plain TCP. */
    if ((opts->tls_cert || opts->tls_key) && !opts->tls_ca)
        return usage_error(TS_CERT_NEEDS_CA, NULL);
    *kout = k;
    return CLI_RUN;
}

int main(int argc, char **argv)
{
    const struct cmd *k = NULL;
    struct tessera_opts opts;
    const char *env;
    struct ctx x;
    char err[512];
    int verbose = 0, rc;

    memset(&x, 0, sizeof(x));
    tessera_opts_init(&opts);
    opts.client_name = "tessera-cli";
    x.policy.core = 1;
    env = getenv("TESSERA_SERVER");
    x.server = env && env[0] ? env : TS_DEFAULT_ADDRESS;
    x.server_set = env && env[0];
    x.argv = calloc((size_t)argc + 1, sizeof(*x.argv));
    if (!x.argv)
        return EXIT_FAIL;
    rc = parse_args(argc, argv, &x, &opts, &k, &verbose);
    if (rc != CLI_RUN)
        goto out_free;
    if (verbose)
        ts_log_set(ts_log_stderr, NULL, TS_LOG_DEBUG);
    if (k->run == cmd_map_push && !x.server_set)
        map_push_seed(&x, &opts); /* no -s: the first node of the map file */
    opts.address = x.server;
    rc = ts_client_open_ex(&x.c, &opts, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tessera: cannot connect to %s: %s (%s)%s%s\n", x.server, ts_strerror(rc),
                ts_errname(rc), err[0] ? ": " : "", err);
        rc = EXIT_FAIL;
        goto out_free;
    }
    if (k->run == cmd_scrub && !x.timeout_set)
        ts_client_set_timeout(x.c, -1); /* a scrub takes as long as the data it reads */
    rc = k->run(&x);
    if (rc)
        print_error(&x, k, rc);
    tessera_client_close(x.c);
    if (fflush(stdout) != 0 && !rc) {
        fprintf(stderr, "tessera: cannot write to stdout: %s\n", strerror(errno));
        rc = EXIT_FAIL;
        goto out_free;
    }
    rc = rc ? EXIT_FAIL : 0;
out_free:
    free(x.argv);
    return rc;
}
