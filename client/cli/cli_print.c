/*
 * tessera CLI: output helpers shared by the commands: JSON documents (printed, numbers,
 * seconds), datasets and shards as JSON objects, and "key: value" listings.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* ---- output helpers ------------------------------------------------------------------------- */

void json_print(struct json_object *o)
{
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                               JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}

struct json_object *json_u64(uint64_t v)
{
    return json_object_new_uint64(v);
}

struct json_object *json_secs(double secs)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%.3f", secs);
    return json_object_new_double_s(secs, buf);
}

const char *pick(int v, const char *a, const char *b)
{
    return v ? b : a;
}

struct json_object *dataset_json(const struct ts_dataset_info *d)
{
    struct json_object *o = json_object_new_object();

    json_object_object_add(o, "name", json_object_new_string(d->name));
    json_object_object_add(o, "id", json_u64(d->id));
    json_object_object_add(o, "state", json_object_new_string(pick(d->state, "open", "sealed")));
    json_object_object_add(o, "core", json_object_new_int(d->policy.core));
    json_object_object_add(o, "fringe", json_object_new_int(d->policy.fringe));
    json_object_object_add(o, "min_core", json_object_new_int(d->policy.min_core));
    json_object_object_add(o, "chunk_size", json_u64(d->policy.chunk_size));
    json_object_object_add(o, "record_format",
                           json_object_new_string(ts_record_format_name(d->policy.record_format)));
    json_object_object_add(o, "created_ns", json_u64(d->created_ns));
    json_object_object_add(o, "shards", json_u64(d->shards));
    json_object_object_add(o, "shards_writing", json_u64(d->shards_writing));
    json_object_object_add(o, "bytes", json_u64(d->bytes));
    if (d->policy.ec_k) {
        char ec[16];
        snprintf(ec, sizeof(ec), "%u+%u", d->policy.ec_k, d->policy.ec_m);
        json_object_object_add(o, "ec", json_object_new_string(ec));
        json_object_object_add(o, "replica_bytes",
                               json_object_new_string(d->policy.ec_dropped ? "dropped" : "kept"));
    } else {
        json_object_object_add(o, "ec", NULL);
    }
    return o;
}

struct json_object *shard_json(const struct ts_shard_info *s)
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
void kv_print(const char *const *kv, size_t n)
{
    size_t w = 0;

    for (size_t i = 0; i < n; i += 2)
        w = TS_MAX(w, strlen(kv[i]));
    for (size_t i = 0; i < n; i += 2)
        printf("%s:%*s %s\n", kv[i], (int)(w - strlen(kv[i])), "", kv[i + 1]);
}

void dataset_print(const struct ts_dataset_info *d)
{
    char size[32], chunk[32], when[40], shards[64], repl[64], id[24], bytes[64], tier[80];
    const char *kv[] = {
        "name",     d->name,
        "id",       id,
        "state",    pick(d->state, "open", "sealed"),
        "shards",   shards,
        "size",     bytes,
        "chunk",    cli_human_size(d->policy.chunk_size, chunk, sizeof(chunk)),
        "records",  ts_record_format_name(d->policy.record_format),
        "replicas", repl,
        "tier",     tier,
        "created",  cli_time(d->created_ns, when, sizeof(when)),
    };

    snprintf(id, sizeof(id), "%llu", (unsigned long long)d->id);
    snprintf(shards, sizeof(shards), "%u complete, %u being written", d->shards, d->shards_writing);
    snprintf(bytes, sizeof(bytes), "%s (%llu bytes)", cli_human_size(d->bytes, size, sizeof(size)),
             (unsigned long long)d->bytes);
    snprintf(repl, sizeof(repl), "core %u, fringe %u, min_core %u", d->policy.core,
             d->policy.fringe, d->policy.min_core);
    if (d->policy.ec_k)
        snprintf(tier, sizeof(tier), "erasure-coded, ec:%u+%u, replica bytes %s", d->policy.ec_k,
                 d->policy.ec_m, d->policy.ec_dropped ? "dropped" : "kept");
    else
        snprintf(tier, sizeof(tier), "replicated");
    kv_print(kv, TS_ARRAY_SIZE(kv));
}
