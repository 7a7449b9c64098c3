/*
 * tessera records NAME [--range A:B] [-o FILE]
 *
 * Record k of a dataset is counted over its complete shards in shard order, by their record
 * indexes (SHARD_RECORDS). Without -o: one line per record of [A, B): its number, shard, offset
 * and length (with --json: one document, the dataset's record format and the records). With -o
 * FILE (or -): the records' bytes as stored (framed), read and CRC-verified, back to back.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int by_shard(const void *a, const void *b)
{
    uint32_t x = ((const struct ts_shard_info *)a)->shard,
             y = ((const struct ts_shard_info *)b)->shard;
    return x < y ? -1 : x > y;
}

/* "A:B", "A:" or ":B" into [*a, *b); 0 or TS_EINVAL. */
static int parse_range(const char *s, uint64_t *a, uint64_t *b)
{
    const char *colon = s ? strchr(s, ':') : NULL;
    char left[32];

    *a = 0;
    *b = UINT64_MAX;
    if (!s)
        return 0;
    if (!colon || (size_t)(colon - s) >= sizeof(left))
        return TS_EINVAL;
    snprintf(left, sizeof(left), "%.*s", (int)(colon - s), s);
    if ((left[0] && cli_parse_uint(left, UINT64_MAX, a) != 0) ||
        (colon[1] && cli_parse_uint(colon + 1, UINT64_MAX, b) != 0) || *a > *b)
        return TS_EINVAL;
    return 0;
}

int cmd_records(struct ctx *x)
{
    const char *name = x->argv[0];
    struct ts_shard_info *v = NULL;
    uint64_t a, b, first = 0, shown = 0;
    size_t n = 0;
    int out = -1, rc;
    struct json_object *doc = NULL, *arr = NULL;

    if (parse_range(x->range, &a, &b)) {
        snprintf(x->local, sizeof(x->local),
                 "--range: '%s' is not A:B (record numbers, B not "
                 "included; either may be left out)",
                 x->range);
        return TS_EINVAL;
    }
    rc = tessera_shard_list(x->c, name, &v, &n);
    if (rc)
        return rc;
    qsort(v, n, sizeof(*v), by_shard);
    if (x->output) {
        out = strcmp(x->output, "-")
                  ? open(x->output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                  : STDOUT_FILENO;
        if (out < 0) {
            snprintf(x->local, sizeof(x->local), "cannot create %s: %s", x->output,
                     strerror(errno));
            free(v);
            return TS_EIO;
        }
    } else if (x->json) {
        struct ts_dataset_info di;
        rc = tessera_dataset_stat(x->c, name, &di);
        if (rc) {
            free(v);
            return rc;
        }
        doc = json_object_new_object();
        arr = json_object_new_array();
        json_object_object_add(doc, "dataset", json_object_new_string(name));
        json_object_object_add(
            doc, "record_format",
            json_object_new_string(ts_record_format_name(di.policy.record_format)));
        json_object_object_add(doc, "records", arr);
    } else {
        printf("%10s %7s %12s %10s\n", "RECORD", "SHARD", "OFFSET", "LENGTH");
    }
    for (size_t i = 0; i < n && !rc && first < b; i++) {
        uint64_t *recs = NULL;
        uint32_t nr = 0;
        if (v[i].state != TS_SHARD_COMPLETE || first + v[i].nrecords <= a) {
            first += v[i].state == TS_SHARD_COMPLETE ? v[i].nrecords : 0;
            continue;
        }
        rc = tessera_shard_records(x->c, name, v[i].shard, &recs, &nr);
        for (uint32_t k = 0; !rc && k < nr && first + k < b; k++) {
            uint64_t off = recs[k], end = k + 1 < nr ? recs[k + 1] : v[i].size;
            if (first + k < a)
                continue;
            shown++;
            if (arr) {
                struct json_object *o = json_object_new_object();
                json_object_object_add(o, "record", json_u64(first + k));
                json_object_object_add(o, "shard", json_u64(v[i].shard));
                json_object_object_add(o, "offset", json_u64(off));
                json_object_object_add(o, "length", json_u64(end - off));
                json_object_array_add(arr, o);
                continue;
            }
            if (out < 0) {
                printf("%10llu %7u %12llu %10llu\n", (unsigned long long)(first + k), v[i].shard,
                       (unsigned long long)off, (unsigned long long)(end - off));
                continue;
            }
            for (uint64_t at = off; at < end && !rc;) {
                static uint8_t buf[1 << 20];
                size_t want = (size_t)TS_MIN((uint64_t)sizeof(buf), end - at), got = 0;
                rc = tessera_read(x->c, name, v[i].shard, at, want, buf, &got);
                if (!rc && (got != want || write(out, buf, got) != (ssize_t)got)) {
                    snprintf(x->local, sizeof(x->local), "cannot write %s", x->output);
                    rc = TS_EIO;
                }
                at += got;
            }
        }
        first += nr;
        free(recs);
    }
    if (out >= 0 && out != STDOUT_FILENO)
        close(out);
    if (doc && !rc)
        json_print(doc);
    else if (doc)
        json_object_put(doc);
    if (!rc && x->output && strcmp(x->output, "-"))
        fprintf(stderr, "records %s: %llu records to %s\n", name, (unsigned long long)shown,
                x->output);
    free(v);
    return rc;
}
