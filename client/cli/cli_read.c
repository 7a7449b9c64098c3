/*
 * `tessera read NAME [RANK WORLD]`: one rank's plan read as a training job reads it, with
 * libtessera's reader; prints what it read, how fast, the data stall and who served what
 * (--json: the same as a document), or writes the units' bytes in plan order (-o).
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int write_all(int fd, const void *p, size_t len)
{
    const uint8_t *b = p;

    while (len) {
        ssize_t n = write(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A duration: "812 us", "3.4 ms", "2.51 s". */
static const char *span(uint64_t ns, char *buf, size_t cap)
{
    if (ns < 1000000)
        snprintf(buf, cap, "%llu us", (unsigned long long)(ns / 1000));
    else if (ns < 1000000000)
        snprintf(buf, cap, "%.1f ms", (double)ns / 1e6);
    else
        snprintf(buf, cap, "%.2f s", (double)ns / 1e9);
    return buf;
}

static void print_summary(const struct ctx *x, const struct tessera_reader_stats *st,
                          uint64_t planned, uint64_t ns)
{
    double secs = (double)ns / 1e9;
    char b1[32], b2[32], b3[32];

    if (x->json) {
        struct json_object *o = json_object_new_object(), *nodes = json_object_new_array();
        json_object_object_add(o, "dataset", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "rank", json_u64(x->plan.rank));
        json_object_object_add(o, "world", json_u64(x->plan.world));
        json_object_object_add(o, "units_planned", json_u64(planned));
        json_object_object_add(o, "units", json_u64(st->units));
        json_object_object_add(o, "bytes", json_u64(st->bytes));
        json_object_object_add(o, "seconds", json_secs(secs));
        json_object_object_add(o, "stall_seconds", json_secs((double)st->stall_ns / 1e9));
        json_object_object_add(o, "stalls", json_u64(st->stalls));
        json_object_object_add(o, "retries", json_u64(st->retries));
        json_object_object_add(o, "reconnects", json_u64(st->reconnects));
        json_object_object_add(o, "index_loads", json_u64(st->index_loads));
        json_object_object_add(o, "ahead_bytes_max", json_u64(st->ahead_bytes_max));
        for (size_t i = 0; i < st->nnodes; i++) {
            struct json_object *n = json_object_new_object();
            json_object_object_add(n, "node", json_object_new_string(st->nodes[i].node));
            json_object_object_add(n, "units", json_u64(st->nodes[i].units));
            json_object_object_add(n, "bytes", json_u64(st->nodes[i].bytes));
            json_object_array_add(nodes, n);
        }
        json_object_object_add(o, "served", nodes);
        json_print(o);
        return;
    }
    printf("rank %u of %u read %llu of %llu %ss (%s) of %s in %s: %.0f units/s, %s/s\n",
           x->plan.rank, x->plan.world, (unsigned long long)st->units, (unsigned long long)planned,
           x->rd.unit == TESSERA_UNIT_SHARD ? "shard" : "record",
           cli_human_size(st->bytes, b1, sizeof(b1)), x->argv[0], span(ns, b2, sizeof(b2)),
           secs > 0 ? (double)st->units / secs : 0.0,
           cli_human_size(secs > 0 ? (uint64_t)((double)st->bytes / secs) : 0, b3, sizeof(b3)));
    printf("data stall %s in %llu waits (%.1f%% of the time); retries %llu, reconnects %llu\n",
           span(st->stall_ns, b1, sizeof(b1)), (unsigned long long)st->stalls,
           ns ? 100.0 * (double)st->stall_ns / (double)ns : 0.0, (unsigned long long)st->retries,
           (unsigned long long)st->reconnects);
    printf("served by:");
    for (size_t i = 0; i < st->nnodes; i++)
        printf(" %s %llu units (%s)%s", st->nodes[i].node, (unsigned long long)st->nodes[i].units,
               cli_human_size(st->nodes[i].bytes, b1, sizeof(b1)), i + 1 < st->nnodes ? "," : "");
    printf("%s\n", st->nnodes ? "" : " none");
}

int cmd_read(struct ctx *x)
{
    struct tessera_reader_stats st;
    struct tessera_reader_opts ro = x->rd;
    struct tessera_opts co = *x->opts;
    struct tessera_unit u;
    tessera_reader *r = NULL;
    uint64_t v[2] = {0, 1}, t0;
    int out = -1, rc;

    if (x->argc == 2) {
        snprintf(x->local, sizeof(x->local), "give both RANK and WORLD, or neither");
        return TS_EINVAL;
    }
    for (int i = 1; i < x->argc; i++)
        if (cli_parse_uint(x->argv[i], UINT32_MAX, &v[i - 1]) != 0) {
            snprintf(x->local, sizeof(x->local), "'%s' is not a number", x->argv[i]);
            return TS_EINVAL;
        }
    x->plan.rank = (uint32_t)v[0];
    x->plan.world = (uint32_t)v[1];
    ro.dataset = x->argv[0];
    ro.plan = x->plan;
    co.address = x->server;
    if (x->output) {
        out = strcmp(x->output, "-")
                  ? open(x->output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                  : STDOUT_FILENO;
        if (out < 0) {
            snprintf(x->local, sizeof(x->local), "cannot create %s: %s", x->output,
                     strerror(errno));
            return TS_EIO;
        }
    }
    t0 = ts_now_mono_ns();
    rc = tessera_reader_open(&r, &co, &ro, x->local, sizeof(x->local));
    while (!rc && (!x->count || tessera_reader_consumed(r) < x->count)) {
        int n = tessera_reader_next(r, &u);
        if (n == 0)
            break;
        if (n < 0) {
            snprintf(x->local, sizeof(x->local), "%s", tessera_reader_error(r));
            rc = n;
        } else if (out >= 0 && write_all(out, u.data, u.len) != 0) {
            snprintf(x->local, sizeof(x->local), "cannot write %s: %s", x->output, strerror(errno));
            rc = TS_EIO;
        }
    }
    if (r) {
        tessera_reader_stats(r, &st);
        if (!x->output || strcmp(x->output, "-"))
            print_summary(x, &st, tessera_reader_len(r), ts_now_mono_ns() - t0);
        tessera_reader_close(r);
    }
    if (out >= 0 && out != STDOUT_FILENO)
        close(out);
    return rc;
}
