/*
 * tessera ingest FORMAT PATH... --dataset NAME [--shards N] [--core/--fringe/--min-core]
 *
 * Every file is scanned first (tessera/records.h): a malformed file is refused with the file,
 * offset and reason before anything of it is uploaded. Without --shards each file becomes one
 * shard (in argument order) with its record index. With --shards N the records of all files,
 * in order, are split into N shards of contiguous records, shard i getting floor(R/N) + (i <
 * R mod N) of them: each a valid file of its format (a tar shard ends with one end-of-archive,
 * the input files' own left out; every JSON line ends with a newline). A shard already sealed with
 * the same bytes is skipped, so an interrupted ingest resumes where it stopped; one sealed with
 * other bytes is an error. On a terminal a progress line shows records, bytes, rate and ETA.
 */
#include "cli.h"

#include "tessera/records.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct in_file {
    const char *path;
    const uint8_t *map; /* the whole file, mapped read-only */
    size_t size;
    uint64_t data_end; /* where its last record ends (before a tar's end-of-archive blocks) */
    uint64_t *rec;     /* record starts */
    uint64_t nrec, cap;
};

static int rec_add(void *arg, uint64_t off)
{
    struct in_file *f = arg;

    if (f->nrec == f->cap) {
        uint64_t cap = f->cap ? 2 * f->cap : 1024;
        uint64_t *n = realloc(f->rec, cap * sizeof(*n));
        if (!n)
            return TS_ENOMEM;
        f->rec = n;
        f->cap = cap;
    }
    f->rec[f->nrec++] = off;
    return 0;
}

/* Every record of a JSON lines file must be one JSON value (json-c); TS_EINVAL naming the
 * first that is not. */
static int check_json_lines(struct ctx *x, const struct in_file *f)
{
    json_tokener *tok = json_tokener_new();
    int rc = 0;

    if (!tok)
        return TS_ENOMEM;
    for (uint64_t r = 0; r < f->nrec && !rc; r++) {
        uint64_t a = f->rec[r], b = r + 1 < f->nrec ? f->rec[r + 1] : f->size;
        json_object *o;
        enum json_tokener_error e;
        while (b > a && f->map[b - 1] && strchr(" \t\r\n", f->map[b - 1]))
            b--;
        json_tokener_reset(tok);
        o = json_tokener_parse_ex(tok, (const char *)f->map + a, (int)(b - a));
        e = json_tokener_get_error(tok);
        if (!o && e == json_tokener_continue)
            e = json_tokener_error_parse_eof;
        if (e != json_tokener_success || (o && (uint64_t)tok->char_offset != b - a)) {
            snprintf(x->local, sizeof(x->local),
                     "%s is not valid jsonl: record %llu at offset %llu is not one JSON value "
                     "(%s); nothing of it was uploaded",
                     f->path, (unsigned long long)r, (unsigned long long)a,
                     e != json_tokener_success ? json_tokener_error_desc(e)
                                               : "more follows the value");
            rc = TS_EINVAL;
        }
        json_object_put(o);
    }
    json_tokener_free(tok);
    return rc;
}

/* Maps and scans one file; 0, or an error explained in x->local. */
static int scan_file(struct ctx *x, int fmt, struct in_file *f)
{
    tessera_recscan *s = NULL;
    struct stat st;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC), rc;

    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(x->local, sizeof(x->local), "%s: %s", f->path,
                 fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return TS_EIO;
    }
    f->size = (size_t)st.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->size && f->map == MAP_FAILED) {
        f->map = NULL;
        snprintf(x->local, sizeof(x->local), "%s: cannot map it: %s", f->path, strerror(errno));
        return TS_EIO;
    }
    rc = tessera_recscan_new(&s, fmt);
    if (!rc)
        rc = tessera_recscan_feed(s, f->map, f->size, rec_add, f);
    if (!rc)
        rc = tessera_recscan_end(s, rec_add, f);
    f->data_end = tessera_recscan_data_end(s);
    if (rc == TS_EPROTO) {
        uint64_t off = 0, rec = 0;
        const char *why = tessera_recscan_error(s, &off, &rec);
        (void)off;
        (void)rec;
        snprintf(x->local, sizeof(x->local), "%s is not valid %s: %s; nothing of it was uploaded",
                 f->path, tessera_record_format_name(fmt), why ? why : "malformed");
        rc = TS_EINVAL;
    }
    tessera_recscan_free(s);
    if (!rc && fmt == TESSERA_FMT_JSONL)
        rc = check_json_lines(x, f);
    return rc;
}

/* The end of record r of file f: the next record's start, or where the file's records end
 * (a tar's end-of-archive blocks and a JSON lines file's trailing blank lines stay out of a
 * merged shard). */
static uint64_t rec_end(const struct in_file *f, uint64_t r)
{
    return r + 1 < f->nrec ? f->rec[r + 1] : f->data_end;
}

struct progress {
    uint64_t records, total_records, bytes, total_bytes, t0;
    int tty;
};

static void progress_show(struct progress *p, int last)
{
    double secs = (double)(ts_now_mono_ns() - p->t0) / 1e9, rate;
    char hb[32], ht[32], hr[32];

    if (!p->tty && !last)
        return;
    rate = secs > 0 ? (double)p->bytes / secs : 0;
    fprintf(stderr, "%singest: %llu/%llu records, %s of %s, %s/s, ETA %.0f s%s", p->tty ? "\r" : "",
            (unsigned long long)p->records, (unsigned long long)p->total_records,
            cli_human_size(p->bytes, hb, sizeof(hb)),
            cli_human_size(p->total_bytes, ht, sizeof(ht)),
            cli_human_size((uint64_t)rate, hr, sizeof(hr)),
            rate > 0 ? (double)(p->total_bytes - p->bytes) / rate : 0.0, last ? "\n" : "");
}

/* Uploads one shard unless it is already sealed with these bytes. 1: skipped; 0: uploaded. */
static int put_shard(struct ctx *x, const char *ds, uint32_t shard, const uint8_t *buf, size_t len,
                     const uint64_t *recs, uint32_t nrecs)
{
    struct ts_shard_info si;
    int rc = tessera_shard_stat(x->c, ds, shard, &si);

    if (rc == 0 && si.state == TS_SHARD_COMPLETE) {
        if (si.size == len && si.crc == ts_crc32c(0, buf, len) && si.nrecords == nrecs)
            return 1;
        snprintf(x->local, sizeof(x->local),
                 "shard %u of %s is already sealed with other contents (%llu bytes); delete the "
                 "dataset or ingest into another",
                 shard, ds, (unsigned long long)si.size);
        return TS_EEXIST;
    }
    return tessera_put(x->c, ds, shard, buf, len, recs, nrecs);
}

int cmd_ingest(struct ctx *x)
{
    int fmt = tessera_record_format_parse(x->argv[0]), rc = 0, skipped = 0;
    size_t nf = (size_t)x->argc - 1;
    struct in_file *f = calloc(nf, sizeof(*f));
    struct ts_dataset_info di;
    struct progress pg = {0};
    uint64_t total = 0, nshards;

    if (!f)
        return TS_ENOMEM;
    if (fmt < 0) {
        snprintf(x->local, sizeof(x->local),
                 "unknown format '%s' (tfrecord, tar, webdataset, jsonl, len32, len64)",
                 x->argv[0]);
        rc = TS_EINVAL;
        goto out;
    }
    if (!x->dataset) {
        snprintf(x->local, sizeof(x->local), "--dataset NAME is required");
        rc = TS_EINVAL;
        goto out;
    }
    for (size_t i = 0; i < nf && !rc; i++) {
        f[i].path = x->argv[i + 1];
        rc = scan_file(x, fmt, &f[i]);
        total += f[i].nrec;
        pg.total_bytes += f[i].size;
    }
    if (rc)
        goto out;
    nshards = x->shard_set ? x->shard : nf;
    if (nshards == 0 || nshards > UINT32_MAX) {
        snprintf(x->local, sizeof(x->local), "--shards must be 1 or more");
        rc = TS_EINVAL;
        goto out;
    }
    rc = tessera_dataset_stat(x->c, x->dataset, &di);
    if (rc == TS_ENOENT) {
        if (!x->min_core_set)
            x->policy.min_core = 0;
        x->policy.record_format = (uint8_t)fmt;
        rc = tessera_dataset_create(x->c, x->dataset, &x->policy);
    } else if (!rc && di.policy.record_format && di.policy.record_format != fmt) {
        snprintf(x->local, sizeof(x->local),
                 "dataset %s holds %s records, not %s; ingest into another dataset", x->dataset,
                 ts_record_format_name(di.policy.record_format), tessera_record_format_name(fmt));
        rc = TS_EINVAL;
    } else if (!rc && !di.policy.record_format) {
        fprintf(stderr,
                "ingest: dataset %s was created without a record format: readers hand out its "
                "records framed (tessera dataset create --format)\n",
                x->dataset);
    }
    if (rc)
        goto out;
    pg.total_records = total;
    pg.t0 = ts_now_mono_ns();
    pg.tty = isatty(STDERR_FILENO);
    if (!x->shard_set) {
        /* One shard per file, with its own record index. */
        for (size_t i = 0; i < nf && rc >= 0; i++) {
            rc = put_shard(x, x->dataset, (uint32_t)i, f[i].map ? f[i].map : (const uint8_t *)"",
                           f[i].size, f[i].rec, (uint32_t)f[i].nrec);
            skipped += rc == 1;
            pg.records += f[i].nrec;
            pg.bytes += f[i].size;
            progress_show(&pg, 0);
        }
    } else {
        /* Records of all files, in order, in contiguous runs: shard i gets floor(R/N) + (i <
         * R mod N) of them. */
        size_t fi = 0;
        uint64_t ri = 0;
        for (uint64_t sh = 0; sh < nshards && rc >= 0; sh++) {
            uint64_t want = total / nshards + (sh < total % nshards), len = 0, n = 0;
            uint64_t *recs = malloc((want ? want : 1) * sizeof(uint64_t));
            uint8_t *buf = NULL;
            size_t cap = 0;
            for (; n < want; n++) {
                uint64_t a, b;
                while (ri >= f[fi].nrec) {
                    fi++;
                    ri = 0;
                }
                a = f[fi].rec[ri];
                b = rec_end(&f[fi], ri);
                if (len + (b - a) + 1024 > cap) {
                    cap = (size_t)(2 * (len + (b - a)) + 1024);
                    buf = realloc(buf, cap);
                }
                if (!buf || !recs) {
                    rc = TS_ENOMEM;
                    break;
                }
                recs[n] = len;
                memcpy(buf + len, f[fi].map + a, b - a);
                len += b - a;
                if (fmt == TESSERA_FMT_JSONL && buf[len - 1] != '\n')
                    buf[len++] = '\n'; /* a file's last line had none: lines stay lines */
                ri++;
            }
            if (rc >= 0 && fmt == TESSERA_FMT_TAR) {
                if (!buf && !(buf = malloc(1024)))
                    rc = TS_ENOMEM;
                else
                    memset(buf + len, 0, 1024); /* end of archive */
                len += 1024;
            }
            if (rc >= 0) {
                rc = put_shard(x, x->dataset, (uint32_t)sh, buf ? buf : (const uint8_t *)"", len,
                               recs, (uint32_t)n);
                skipped += rc == 1;
                pg.records += n;
                pg.bytes += len;
                progress_show(&pg, 0);
            }
            free(buf);
            free(recs);
        }
    }
    if (rc >= 0 && x->seal) {
        rc = tessera_dataset_seal(x->c, x->dataset);
        if (rc)
            snprintf(x->local, sizeof(x->local),
                     "every shard is uploaded, but dataset %s could not be sealed: %s", x->dataset,
                     ts_strerror(rc));
    }
    if (rc >= 0) {
        rc = 0;
        progress_show(&pg, 1);
        printf("ingested %llu records of %zu file%s into %s: %llu shard%s (%d already sealed); "
               "%s\n",
               (unsigned long long)total, nf, nf == 1 ? "" : "s", x->dataset,
               (unsigned long long)nshards, nshards == 1 ? "" : "s", skipped,
               x->seal ? "the dataset is sealed"
                       : "the dataset stays open (seal it with ingest --seal or tessera dataset "
                         "seal)");
    }
out:
    for (size_t i = 0; i < nf; i++) {
        if (f[i].map)
            munmap((void *)f[i].map, f[i].size);
        free(f[i].rec);
    }
    free(f);
    return rc;
}

int cmd_plan(struct ctx *x)
{
    struct tessera_plan_opts *o = &x->plan;
    tessera_plan *p = NULL;
    uint64_t v[4] = {0, 0, 0, 20}, len, unit;
    int rc;

    for (int i = 0; i < x->argc; i++)
        if (cli_parse_uint(x->argv[i], i == 1 || i == 2 ? UINT32_MAX : UINT64_MAX, &v[i]) != 0) {
            snprintf(x->local, sizeof(x->local), "'%s' is not a number", x->argv[i]);
            return TS_EINVAL;
        }
    o->units = v[0];
    o->rank = (uint32_t)v[1];
    o->world = (uint32_t)v[2];
    rc = tessera_plan_new(&p, o);
    if (rc) {
        snprintf(x->local, sizeof(x->local),
                 "not a plan (rank must be below world, world 1 or more, window 1 or more)");
        return rc;
    }
    len = tessera_plan_len(p);
    printf("rank %u of %u reads %llu of %llu units:", o->rank, o->world, (unsigned long long)len,
           (unsigned long long)o->units);
    for (uint64_t k = 0; k < len && k < v[3]; k++)
        if (tessera_plan_unit(p, k, &unit) == 0)
            printf(" %llu", (unsigned long long)unit);
    printf("%s\n", len > v[3] ? " ..." : "");
    tessera_plan_free(p);
    return 0;
}
