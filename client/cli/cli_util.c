/* Helpers of the tessera CLI: numbers, sizes, options, tables (see cli_util.h). */
#include "cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ts_common.h"

/* ---- numbers ------------------------------------------------------------------------------- */

/* The decimal digits at the start of s (at least one): *end after them. */
static int parse_digits(const char *s, const char **end, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;

    if (!p || *p < '0' || *p > '9')
        return TS_EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return TS_ERANGE;
        v = v * 10 + d;
    }
    *end = p;
    *out = v;
    return 0;
}

int cli_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    const char *end;
    uint64_t v;
    int rc;

    rc = parse_digits(s, &end, &v);
    if (rc)
        return rc;
    if (*end)
        return TS_EINVAL;
    if (v > max)
        return TS_ERANGE;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    static const char units[] = "BKMGTPE";
    const char *end, *u;
    uint64_t v;
    unsigned shift;
    int rc;

    rc = parse_digits(s, &end, &v);
    if (rc)
        return rc;
    if (*end == '\0') {
        *out = v;
        return 0;
    }
    u = strchr(units, end[0] >= 'a' && end[0] <= 'z' ? end[0] - 'a' + 'A' : end[0]);
    if (!u || !*u)
        return TS_EINVAL;
    shift = (unsigned)(u - units) * 10;
    end++;
    /* After the letter: nothing, "B", "iB" (K, KB, KiB); a bare "B" takes nothing more. */
    if (shift && (strcasecmp(end, "b") == 0 || strcasecmp(end, "ib") == 0))
        end += strlen(end);
    if (*end)
        return TS_EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return TS_ERANGE;
    *out = v << shift;
    return 0;
}

const char *cli_human_size(uint64_t n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    size_t u = 0;

    if (n < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)n);
        return buf;
    }
    while (v >= 1024.0 && u + 1 < TS_ARRAY_SIZE(units)) {
        v /= 1024.0;
        u++;
    }
    if (n % ((uint64_t)1 << (10 * u)) == 0)
        snprintf(buf, cap, "%llu %s", (unsigned long long)(n >> (10 * u)), units[u]);
    else
        snprintf(buf, cap, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

const char *cli_time(uint64_t ns, char *buf, size_t cap)
{
    time_t t = (time_t)(ns / 1000000000u);
    struct tm tm;

    if (ns == 0 || !gmtime_r(&t, &tm) || !strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, cap, "-");
    return buf;
}

/* ---- options ------------------------------------------------------------------------------- */

void cli_iter_init(struct cli_iter *it, int argc, char **argv)
{
    memset(it, 0, sizeof(*it));
    it->argc = argc;
    it->argv = argv;
}

static const struct cli_opt *find_long(const struct cli_opt *const *tables, size_t ntables,
                                       const char *name, size_t len)
{
    for (size_t t = 0; t < ntables; t++)
        for (const struct cli_opt *o = tables[t]; o && o->name; o++)
            if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
                return o;
    return NULL;
}

static const struct cli_opt *find_short(const struct cli_opt *const *tables, size_t ntables, char c)
{
    for (size_t t = 0; t < ntables; t++)
        for (const struct cli_opt *o = tables[t]; o && o->name; o++)
            if (o->short_name && o->short_name == c)
                return o;
    return NULL;
}

enum cli_token cli_next(struct cli_iter *it, const struct cli_opt *const *tables, size_t ntables,
                        const struct cli_opt **opt, const char **val)
{
    const struct cli_opt *o;
    const char *a, *eq;

    *opt = NULL;
    *val = NULL;
    if (it->i >= it->argc)
        return CLI_END;
    a = it->argv[it->i++];
    if (it->only_pos || a[0] != '-' || a[1] == '\0') {
        *val = a;
        return CLI_POS;
    }
    if (strcmp(a, "--") == 0) {
        it->only_pos = 1;
        return cli_next(it, tables, ntables, opt, val);
    }
    if (a[1] == '-') {
        eq = strchr(a + 2, '=');
        o = find_long(tables, ntables, a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
        if (!o) {
            snprintf(it->err, sizeof(it->err), "unknown option '%.*s'",
                     eq ? (int)(eq - a) : (int)strlen(a), a);
            return CLI_ERR;
        }
        if (!o->has_arg && eq) {
            snprintf(it->err, sizeof(it->err), "option '--%s' takes no value", o->name);
            return CLI_ERR;
        }
        if (o->has_arg)
            *val = eq ? eq + 1 : (it->i < it->argc ? it->argv[it->i++] : NULL);
    } else {
        o = find_short(tables, ntables, a[1]);
        if (!o) {
            snprintf(it->err, sizeof(it->err), "unknown option '-%c'", a[1]);
            return CLI_ERR;
        }
        if (!o->has_arg && a[2]) {
            snprintf(it->err, sizeof(it->err), "option '-%c' takes no value", a[1]);
            return CLI_ERR;
        }
        if (o->has_arg)
            *val = a[2] ? a + 2 : (it->i < it->argc ? it->argv[it->i++] : NULL);
    }
    if (o->has_arg && !*val) {
        snprintf(it->err, sizeof(it->err), "option '--%s' needs a value", o->name);
        return CLI_ERR;
    }
    *opt = o;
    return CLI_OPT;
}

/* ---- output files -------------------------------------------------------------------------- */

static void out_reset(struct cli_out *o)
{
    free(o->path);
    free(o->tmp);
    o->fd = -1;
    o->path = NULL;
    o->tmp = NULL;
}

int cli_out_open(struct cli_out *o, const char *file, char *err, size_t cap)
{
    struct stat st, lst;
    int exists, rc;
    size_t len;

    memset(o, 0, sizeof(*o));
    o->fd = -1;
    exists = stat(file, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        /* A device, FIFO or terminal: nothing to keep safe, nothing to remove. */
        o->fd = open(file, O_WRONLY | O_CLOEXEC);
        if (o->fd < 0) {
            snprintf(err, cap, "cannot open %s: %s", file, strerror(errno));
            return TS_EIO;
        }
        return 0;
    }
    /* Through a symbolic link: replace the file it points to, keep the link. */
    if (exists && lstat(file, &lst) == 0 && S_ISLNK(lst.st_mode))
        o->path = realpath(file, NULL);
    if (!o->path)
        o->path = strdup(file);
    len = o->path ? strlen(o->path) + 48 : 0;
    o->tmp = len ? malloc(len) : NULL;
    if (!o->tmp) {
        snprintf(err, cap, "out of memory");
        rc = TS_ENOMEM;
        goto out_reset;
    }
    for (unsigned i = 0; i < 100; i++) {
        if (i == 0)
            snprintf(o->tmp, len, "%s.tmp.%ld", o->path, (long)getpid());
        else
            snprintf(o->tmp, len, "%s.tmp.%ld.%u", o->path, (long)getpid(), i);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd >= 0 || errno != EEXIST)
            break;
    }
    if (o->fd < 0) {
        snprintf(err, cap, "cannot create %s (written first, then renamed to %s): %s", o->tmp, file,
                 strerror(errno));
        rc = TS_EIO;
        goto out_reset;
    }
    if (exists) /* the replacement keeps the file's permissions */
        (void)fchmod(o->fd, st.st_mode & 07777);
    return 0;

out_reset:
    out_reset(o);
    return rc;
}

int cli_out_commit(struct cli_out *o, char *err, size_t cap)
{
    int rc = 0;

    if (o->tmp && fsync(o->fd) < 0 && errno != EINVAL && errno != EROFS) {
        snprintf(err, cap, "cannot write %s: %s", o->tmp, strerror(errno));
        rc = TS_EIO;
    }
    if (close(o->fd) < 0 && !rc) {
        snprintf(err, cap, "cannot write %s: %s", o->tmp ? o->tmp : "the output", strerror(errno));
        rc = TS_EIO;
    }
    o->fd = -1;
    if (!rc && o->tmp && rename(o->tmp, o->path) < 0) {
        snprintf(err, cap, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        rc = TS_EIO;
    }
    if (rc)
        cli_out_abort(o);
    out_reset(o);
    return rc;
}

void cli_out_abort(struct cli_out *o)
{
    if (!o)
        return;
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp)
        unlink(o->tmp);
    out_reset(o);
}

/* ---- tables -------------------------------------------------------------------------------- */

int cli_table_init(struct cli_table *t, size_t ncols, unsigned right, const char *const *header)
{
    memset(t, 0, sizeof(*t));
    if (ncols == 0 || ncols > CLI_TABLE_MAXCOLS)
        return TS_EINVAL;
    t->ncols = ncols;
    t->right = right;
    return cli_table_add(t, header);
}

int cli_table_add(struct cli_table *t, const char *const *row)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **p = realloc(t->cells, cap * t->ncols * sizeof(*p));
        if (!p)
            return TS_ENOMEM;
        t->cells = p;
        t->cap = cap;
    }
    for (size_t i = 0; i < t->ncols; i++) {
        char *s = strdup(row[i] ? row[i] : "");
        if (!s) {
            for (size_t j = 0; j < i; j++)
                free(t->cells[t->nrows * t->ncols + j]);
            return TS_ENOMEM;
        }
        t->cells[t->nrows * t->ncols + i] = s;
    }
    t->nrows++;
    return 0;
}

void cli_table_print(const struct cli_table *t, FILE *f)
{
    size_t w[CLI_TABLE_MAXCOLS] = {0};

    for (size_t r = 0; r < t->nrows; r++)
        for (size_t i = 0; i < t->ncols; i++)
            w[i] = TS_MAX(w[i], strlen(t->cells[r * t->ncols + i]));
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t i = 0; i < t->ncols; i++) {
            const char *s = t->cells[r * t->ncols + i];
            int last = i + 1 == t->ncols;
            if (t->right & (1u << i))
                fprintf(f, "%*s%s", (int)w[i], s, last ? "" : "  ");
            else if (last)
                fputs(s, f);
            else
                fprintf(f, "%-*s  ", (int)w[i], s);
        }
        fputc('\n', f);
    }
}

void cli_table_fini(struct cli_table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof(*t));
}

int cli_table_done(struct cli_table *t, int rc, FILE *f)
{
    if (!rc)
        cli_table_print(t, f);
    cli_table_fini(t);
    return rc;
}
