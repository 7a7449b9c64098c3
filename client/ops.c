/*
 * libtessera, the connection layer: the small request-reply operations of one connection:
 * datasets (create, list, stat, seal, delete), shards (records, stat, list), MAP_GET and
 * MAP_PUSH, SCRUB and STATUS. Each ts_conn_* call checks its arguments as the public call of
 * the same name does on a single node: the public calls (api.c) on a single-node handle and
 * the router (cluster*.c) on its sub-connections call them. Nothing here knows the router.
 */
#include "conn.h"

#include <stdlib.h>

#include "ts_map.h"

#define FAC "client"

/* ---- maps ----------------------------------------------------------------------------------- */

int ts_conn_map_get(tessera_client *c, struct ts_map **out, uint64_t *epoch)
{
    struct ts_req *r;
    struct ts_rd body, peek;
    uint32_t n;
    int rc;

    *out = NULL;
    *epoch = 0;
    rc = ts_enter_conn(c);
    if (rc)
        return rc;
    r = ts_req_new(c, TS_OP_MAP_GET);
    if (!r)
        return TS_ENOMEM;
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    peek = body;
    *epoch = ts_rd_u64(&peek);
    (void)ts_rd_u32(&peek);
    n = ts_rd_u32(&peek);
    if (peek.err)
        rc = ts_proto_err(c, "MAP_GET");
    else if (n > 0 && (ts_map_decode(&body, out) != 0 || ts_rd_done(&body) != 0))
        rc = ts_proto_err(c, "MAP_GET map");
    if (rc) {
        ts_map_free(*out);
        *out = NULL;
        *epoch = 0;
    }
    ts_req_free(c, r);
    return rc;
}

int ts_conn_map_push(tessera_client *c, const struct ts_map *m, uint64_t *epoch)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    *epoch = 0;
    rc = ts_enter_conn(c);
    if (rc)
        return rc;
    r = ts_req_new(c, TS_OP_MAP_PUSH);
    if (!r)
        return TS_ENOMEM;
    ts_map_encode(&r->w, m);
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    *epoch = ts_rd_u64(&body);
    if (body.err)
        rc = ts_proto_err(c, "MAP_PUSH");
    ts_req_free(c, r);
    return rc;
}

int ts_conn_pg_drop(tessera_client *c, uint32_t pg, const char *dataset, uint32_t *shards,
                    uint64_t *bytes)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    *shards = 0;
    *bytes = 0;
    rc = ts_enter_conn(c);
    if (rc)
        return rc;
    r = ts_req_new(c, TS_OP_PG_DROP);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, pg);
    if (dataset && dataset[0])
        ts_wr_str(&r->w, dataset);
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    *shards = ts_rd_u32(&body);
    *bytes = ts_rd_u64(&body);
    if (body.err)
        rc = ts_proto_err(c, "PG_DROP");
    ts_req_free(c, r);
    return rc;
}

/* ---- datasets ------------------------------------------------------------------------------- */

const struct ts_dataset_policy ts_policy_default = {1, 0, 1, 0, 0, 0, 0, 0};

int ts_conn_dataset_create(tessera_client *c, const char *name, const struct ts_dataset_policy *p)
{
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!p)
        p = &ts_policy_default;
    return ts_conn_dataset_create_inc(c, name, p, 0);
}

int ts_conn_dataset_create_inc(tessera_client *c, const char *name,
                               const struct ts_dataset_policy *p, uint64_t incarnation)
{
    struct ts_req *r = ts_req_name(c, TS_OP_DATASET_CREATE, name);

    if (!r)
        return TS_ENOMEM;
    ts_wr_u8(&r->w, p->core ? p->core : 1); /* the API's 0: one core replica (the wire's 0 is
                                               refused: a dataset with no core replica) */
    ts_wr_u8(&r->w, p->fringe);
    ts_wr_u8(&r->w, p->min_core);
    ts_wr_u32(&r->w, p->chunk_size);
    if (incarnation || p->record_format)
        ts_wr_u64(&r->w, incarnation); /* 0: the node's clock */
    if (p->record_format)
        ts_wr_u8(&r->w, p->record_format);
    return ts_call_status(c, r);
}

/* A list request, and the entries of its reply: how one is decoded, and what a malformed list
 * is called. */
struct list_kind {
    uint8_t op;
    size_t size; /* of a decoded entry */
    size_t min;  /* bytes of an entry on the wire, at least (bounds the count) */
    int (*decode)(struct ts_rd *r, void *entry);
    const char *bad_count, *bad_entry;
};

static int dataset_entry(struct ts_rd *r, void *entry)
{
    return ts_rd_dataset_info(r, entry);
}

static int shard_entry(struct ts_rd *r, void *entry)
{
    return ts_rd_shard_info(r, entry);
}

static const struct list_kind dataset_list = {TS_OP_DATASET_LIST,   sizeof(struct ts_dataset_info),
                                              TS_DATASET_INFO_MIN,  dataset_entry,
                                              "DATASET_LIST count", "DATASET_LIST entry"};
static const struct list_kind shard_list = {TS_OP_SHARD_LIST,   sizeof(struct ts_shard_info),
                                            TS_SHARD_INFO_LEN,  shard_entry,
                                            "SHARD_LIST count", "SHARD_LIST entry"};

/*
 * A list request (with name: its body is the dataset name) and its reply (a u32 count, then
 * the entries) decoded into *out, a calloc'ed array of *n entries (NULL when there are none).
 */
static int list_call(tessera_client *c, const struct list_kind *kind, const char *name, void **out,
                     size_t *n)
{
    struct ts_rd body;
    struct ts_req *r;
    uint8_t *v = NULL;
    uint32_t k;
    int rc;

    if (name) {
        rc = ts_call_name(c, kind->op, name, &r, &body);
    } else {
        r = ts_req_new(c, kind->op);
        if (!r)
            return TS_ENOMEM;
        rc = ts_call(c, r, &body);
    }
    if (rc)
        return rc;
    k = ts_rd_u32(&body);
    if (body.err || k > (body.len - body.off) / kind->min) {
        rc = ts_proto_err(c, kind->bad_count);
        goto out_free;
    }
    if (k) {
        v = calloc(k, kind->size);
        if (!v) {
            rc = TS_ENOMEM;
            goto out_free;
        }
    }
    for (uint32_t i = 0; i < k; i++) {
        if (kind->decode(&body, v + i * kind->size)) {
            rc = ts_proto_err(c, kind->bad_entry);
            goto out_free_list;
        }
    }
    ts_req_free(c, r);
    *out = v;
    *n = k;
    return 0;

out_free_list:
    free(v);
out_free:
    ts_req_free(c, r);
    return rc;
}

int ts_list_begin(tessera_client *c, int have_out, size_t *n)
{
    int rc;

    if (n)
        *n = 0;
    rc = ts_enter(c);
    if (rc)
        return rc;
    return have_out && n ? 0 : TS_EINVAL;
}

/* A public list call: out cleared, the arguments checked, then the list into *out. */
static int list_out(tessera_client *c, const struct list_kind *kind, const char *name, void **out,
                    size_t *n)
{
    void *v = NULL;
    int rc;

    if (out)
        *out = NULL;
    rc = ts_list_begin(c, out != NULL, n);
    if (rc)
        return rc;
    rc = list_call(c, kind, name, &v, n);
    if (!rc)
        *out = v;
    return rc;
}

int ts_conn_dataset_list(tessera_client *c, struct ts_dataset_info **out, size_t *n)
{
    return list_out(c, &dataset_list, NULL, (void **)out, n);
}

static int dataset_stat(tessera_client *c, const char *name, uint16_t flags,
                        struct ts_dataset_info *out)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    rc = ts_enter(c);
    if (rc)
        return rc;
    if (!out)
        return TS_EINVAL;
    rc = ts_call_name_flags(c, TS_OP_DATASET_STAT, name, flags, &r, &body);
    if (rc)
        return rc;
    if (ts_rd_dataset_info(&body, out))
        rc = ts_proto_err(c, "DATASET_STAT");
    ts_req_free(c, r);
    return rc;
}

int ts_conn_dataset_stat(tessera_client *c, const char *name, struct ts_dataset_info *out)
{
    return dataset_stat(c, name, 0, out);
}

int ts_conn_dataset_policy(tessera_client *c, const char *name, struct ts_dataset_info *out)
{
    return dataset_stat(c, name, TS_F_BRIEF, out);
}

static int simple_name_op(tessera_client *c, uint8_t op, const char *name)
{
    struct ts_req *r;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    r = ts_req_name(c, op, name);
    if (!r)
        return TS_ENOMEM;
    return ts_call_status(c, r);
}

int ts_conn_dataset_seal(tessera_client *c, const char *name)
{
    return simple_name_op(c, TS_OP_DATASET_SEAL, name);
}

int ts_conn_dataset_delete(tessera_client *c, const char *name)
{
    return simple_name_op(c, TS_OP_DATASET_DELETE, name);
}

int ts_conn_dataset_seal_flags(tessera_client *c, const char *name, uint8_t flags)
{
    struct ts_req *r;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!c->t) /* a handle with no connection of its own (a router's) */
        return TS_EINVAL;
    r = ts_req_name(c, TS_OP_DATASET_SEAL, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u8(&r->w, flags);
    return ts_call_status(c, r);
}

int ts_conn_dataset_tier(tessera_client *c, const char *name, unsigned k, unsigned m, int dropped)
{
    struct ts_req *r;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!c->t || k > 255 || m > 255)
        return TS_EINVAL;
    r = ts_req_name(c, TS_OP_DATASET_TIER, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u8(&r->w, (uint8_t)k);
    ts_wr_u8(&r->w, (uint8_t)m);
    ts_wr_u8(&r->w, dropped ? 1 : 0);
    return ts_call_status(c, r);
}

int ts_conn_chunk_repair(tessera_client *c, const char *name, uint32_t shard, uint32_t idx,
                         const void *data, uint32_t len)
{
    struct ts_req *r;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (!c->t || (!data && len))
        return TS_EINVAL;
    r = ts_req_name(c, TS_OP_CHUNK_REPAIR, name);
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    ts_wr_u32(&r->w, idx);
    ts_wr_u32(&r->w, len);
    ts_wr_bytes(&r->w, data, len);
    return ts_call_status(c, r);
}

/* ---- shards --------------------------------------------------------------------------------- */

/* A request of op naming (name, shard) on this connection; its reply's body in *body (free *r
 * with ts_req_free once read). */
static int shard_call(tessera_client *c, uint8_t op, const char *name, uint32_t shard,
                      struct ts_req **r, struct ts_rd *body)
{
    *r = ts_req_name(c, op, name);
    if (!*r)
        return TS_ENOMEM;
    ts_wr_u32(&(*r)->w, shard);
    return ts_call(c, *r, body);
}

int ts_conn_shard_records(tessera_client *c, const char *name, uint32_t shard, uint64_t **offsets,
                          uint32_t *n)
{
    struct ts_req *r;
    struct ts_rd body;
    uint32_t count;
    int rc;

    if (offsets)
        *offsets = NULL;
    if (n)
        *n = 0;
    rc = ts_enter_out_name(c, offsets && n, name);
    if (rc)
        return rc;
    rc = shard_call(c, TS_OP_SHARD_RECORDS, name, shard, &r, &body);
    if (rc)
        return rc;
    count = ts_rd_u32(&body);
    if (!body.err && (size_t)count * 8 != body.len - body.off)
        body.err = TS_EPROTO;
    if (!body.err && count) {
        *offsets = malloc((size_t)count * sizeof(uint64_t));
        if (!*offsets)
            rc = TS_ENOMEM;
        for (uint32_t i = 0; *offsets && i < count; i++)
            (*offsets)[i] = ts_rd_u64(&body);
        if (*offsets)
            *n = count;
    }
    if (body.err)
        rc = ts_proto_err(c, "SHARD_RECORDS");
    ts_req_free(c, r);
    return rc;
}

int ts_conn_shard_stat(tessera_client *c, const char *name, uint32_t shard,
                       struct ts_shard_info *out)
{
    struct ts_req *r;
    struct ts_rd body;
    int rc;

    rc = ts_enter_out_name(c, out != NULL, name);
    if (rc)
        return rc;
    rc = shard_call(c, TS_OP_SHARD_STAT, name, shard, &r, &body);
    if (rc)
        return rc;
    if (ts_rd_shard_info(&body, out))
        rc = ts_proto_err(c, "SHARD_STAT");
    ts_req_free(c, r);
    return rc;
}

int ts_conn_shard_list(tessera_client *c, const char *name, struct ts_shard_info **out, size_t *n)
{
    return list_out(c, &shard_list, name, (void **)out, n);
}

/* ---- maintenance ------------------------------------------------------------------------------
 */

int ts_scrub_args(tessera_client *c, const char *name, struct ts_scrub_report **rep,
                  struct ts_scrub_report *tmp)
{
    int rc = ts_enter(c);

    if (rc)
        return rc;
    if (name) {
        rc = ts_name_check(c, name);
        if (rc)
            return rc;
    }
    if (!*rep)
        *rep = tmp;
    memset(*rep, 0, sizeof(**rep));
    return 0;
}

int ts_conn_scrub(tessera_client *c, const char *name, struct ts_scrub_report *rep,
                  void (*cb)(void *arg, const char *dataset, uint32_t shard, uint32_t chunk,
                             int rc),
                  void *arg)
{
    struct ts_scrub_report tmp;
    char ds[TS_NAME_MAX + 1];
    struct ts_req *r;
    struct ts_rd body;
    uint32_t n;
    int rc;

    rc = ts_scrub_args(c, name, &rep, &tmp);
    if (rc)
        return rc;
    r = ts_req_new(c, TS_OP_SCRUB);
    if (!r)
        return TS_ENOMEM;
    ts_wr_str(&r->w, name ? name : "");
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    rep->shards = ts_rd_u64(&body);
    rep->chunks = ts_rd_u64(&body);
    rep->bytes = ts_rd_u64(&body);
    rep->corrupt = ts_rd_u64(&body);
    n = ts_rd_u32(&body);
    for (uint32_t i = 0; i < n && !body.err; i++) {
        uint32_t shard, chunk;
        int code;
        ts_rd_str(&body, ds, sizeof(ds));
        shard = ts_rd_u32(&body);
        chunk = ts_rd_u32(&body);
        code = (int32_t)ts_rd_u32(&body);
        if (!body.err && cb)
            cb(arg, ds, shard, chunk, code);
    }
    if (!body.err && body.off < body.len) { /* a cluster node's comparison with primaries */
        rep->pgs_compared = ts_rd_u32(&body);
        rep->pgs_differing = ts_rd_u32(&body);
        rep->missing = ts_rd_u64(&body);
        rep->pgs_unchecked = ts_rd_u32(&body);
    }
    if (body.err)
        rc = ts_proto_err(c, "SCRUB");
    ts_req_free(c, r);
    return rc;
}

int ts_conn_status(tessera_client *c, char **json)
{
    struct ts_req *r;
    struct ts_rd body;
    const uint8_t *p;
    uint16_t n;
    int rc;

    if (json)
        *json = NULL;
    rc = ts_enter(c);
    if (rc)
        return rc;
    if (!json)
        return TS_EINVAL;
    r = ts_req_new(c, TS_OP_STATUS);
    if (!r)
        return TS_ENOMEM;
    rc = ts_call(c, r, &body);
    if (rc)
        return rc;
    n = ts_rd_u16(&body);
    p = ts_rd_bytes(&body, n);
    if (!p) {
        rc = ts_proto_err(c, "STATUS");
        goto out_free;
    }
    *json = malloc((size_t)n + 1);
    if (!*json) {
        rc = TS_ENOMEM;
        goto out_free;
    }
    memcpy(*json, p, n);
    (*json)[n] = '\0';
out_free:
    ts_req_free(c, r);
    return rc;
}
