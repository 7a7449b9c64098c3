/*
 * Helpers of the tessera CLI that do not talk to a server: option scanning, number and size
 * parsing, human-readable formatting, aligned tables. Pure where they can be, so the unit
 * tests reach them (tests/unit/test_client.c).
 */
#ifndef TS_CLI_UTIL_H
#define TS_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- numbers ------------------------------------------------------------------------------- */

/*
 * A byte count: decimal digits with an optional binary suffix K, M, G, T (also k, KiB, KB,
 * ...; all powers of 1024) or B. 0, or TS_EINVAL for anything else, TS_ERANGE on overflow.
 */
int cli_parse_size(const char *s, uint64_t *out);
/* A plain decimal number in [0, max]: 0, TS_EINVAL, or TS_ERANGE. */
int cli_parse_uint(const char *s, uint64_t max, uint64_t *out);

/* "512 B", "1.5 KiB", "64 MiB", "1.07 GiB" into buf[cap]; returns buf. */
const char *cli_human_size(uint64_t n, char *buf, size_t cap);
/* ns since the epoch as "2026-11-22T01:04:49Z" (UTC) into buf[cap]; "-" for 0. */
const char *cli_time(uint64_t ns, char *buf, size_t cap);

/* ---- options ------------------------------------------------------------------------------- */

struct cli_opt {
    const char *name; /* long name, without the dashes */
    char short_name;  /* 0: none */
    int has_arg;
    int id;
};

enum cli_token {
    CLI_ERR = -1, /* it->err says what is wrong */
    CLI_END = 0,
    CLI_POS = 1, /* a positional argument in *val */
    CLI_OPT = 2, /* an option in *opt, its value (if it takes one) in *val */
};

struct cli_iter {
    int argc;
    char **argv;
    int i;
    int only_pos; /* after "--" */
    char err[160];
};

void cli_iter_init(struct cli_iter *it, int argc, char **argv);
/*
 * The next token of the command line. Options are looked up in tables[0..ntables), each a
 * list ended by an entry with a NULL name. Understands "--name value", "--name=value",
 * "-x value", "-xvalue", "--" (the rest is positional) and "-" (positional: stdin/stdout).
 */
enum cli_token cli_next(struct cli_iter *it, const struct cli_opt *const *tables, size_t ntables,
                        const struct cli_opt **opt, const char **val);

/* ---- output files -------------------------------------------------------------------------- */

/*
 * A file being written that replaces FILE only once it is complete. For a regular FILE (or
 * one that does not exist yet) the bytes go to a temporary "FILE.tmp.PID" in the same
 * directory (next to the target when FILE is a symbolic link), renamed over FILE by
 * cli_out_commit; cli_out_abort removes the temporary and leaves FILE as it was. Anything
 * else (/dev/null, a FIFO, a terminal) is written in place and never removed.
 */
struct cli_out {
    int fd;
    char *path; /* what is replaced: FILE, or the target of the link FILE */
    char *tmp;  /* the temporary being written; NULL when writing in place */
};

/* 0, or TS_EIO / TS_ENOMEM with the reason in err[cap]. */
int cli_out_open(struct cli_out *o, const char *file, char *err, size_t cap);
/* Makes the bytes durable and renames the temporary over the file; 0 or TS_EIO (the
 * temporary removed, the file untouched). o is finished either way. */
int cli_out_commit(struct cli_out *o, char *err, size_t cap);
/* Closes and removes the temporary; the file keeps what it held. NULL-safe, idempotent. */
void cli_out_abort(struct cli_out *o);

/* ---- tables -------------------------------------------------------------------------------- */

#define CLI_TABLE_MAXCOLS 12

/* Rows of strings printed with each column as wide as its widest cell. */
struct cli_table {
    size_t ncols, nrows, cap;
    unsigned right; /* bit i: column i is right-aligned (numbers) */
    char **cells;   /* nrows * ncols, row 0 the header */
};

/* The header names are copied; right has bit i set for right-aligned column i. */
int cli_table_init(struct cli_table *t, size_t ncols, unsigned right, const char *const *header);
/* One row of ncols strings (copied). 0 or TS_ENOMEM. */
int cli_table_add(struct cli_table *t, const char *const *row);
void cli_table_print(const struct cli_table *t, FILE *f);
void cli_table_fini(struct cli_table *t);
/* Prints t to f unless rc is set (a row could not be added), then finishes t; returns rc. */
int cli_table_done(struct cli_table *t, int rc, FILE *f);

#endif
