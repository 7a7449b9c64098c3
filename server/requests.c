/* Request payload decoders (requests.h): one per opcode, in the field order of
 * docs/protocol.md, with the bounds-checked reader of common/proto.c. */
#include "requests.h"
#include "ts_ec.h"

#include <stdarg.h>
#include <stdio.h>

#include "ts_map.h"

/* A decode in progress: the reader, the opcode's wire name, where the message goes. */
struct dec {
    struct ts_rd r;
    const char *what;
    char *msg;
    size_t msglen;
};

__attribute__((format(printf, 3, 4))) static int fail(struct dec *d, int rc, const char *fmt, ...)
{
    va_list ap;

    if (d->msglen) {
        va_start(ap, fmt);
        vsnprintf(d->msg, d->msglen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int malformed(struct dec *d)
{
    return fail(d, TS_EPROTO, "malformed %s request", d->what);
}

/* 0 when everything was read and nothing is left over. */
static int done(struct dec *d)
{
    return ts_rd_done(&d->r) ? malformed(d) : 0;
}

/* A dataset name: TS_ENAME for an invalid one, TS_EPROTO when its bytes are missing. */
static int name(struct dec *d, char out[TS_NAME_MAX + 1])
{
    int rc = ts_rd_name(&d->r, out);

    if (rc == TS_ENAME)
        return fail(d, rc, "invalid dataset name (1-128 of [A-Za-z0-9._-])");
    return rc ? malformed(d) : 0;
}

/* The same, or a fragment name (NAME#f): the shard operations, which may address the fragments
 * of an erasure-coded dataset (issue 33); the handlers say who may. */
static int store_name(struct dec *d, char out[TS_NAME_MAX + 1])
{
    int rc = ts_rd_name_store(&d->r, out);

    if (rc == TS_ENAME)
        return fail(d, rc, "invalid dataset name (1-128 of [A-Za-z0-9._-], or NAME#fragment)");
    return rc ? malformed(d) : 0;
}

/* A str into out[cap] (at most cap-1 bytes), with its length on the wire (it may hold NULs). */
static void str(struct dec *d, char *out, size_t cap, uint16_t *len)
{
    size_t before = d->r.off;

    ts_rd_str(&d->r, out, cap);
    *len = d->r.err ? 0 : (uint16_t)(d->r.off - before - 2);
}

static void chunk(struct dec *d, struct tsd_chunk *c, int with_data)
{
    c->shard = ts_rd_u32(&d->r);
    c->idx = ts_rd_u32(&d->r);
    c->size = ts_rd_u64(&d->r);
    c->crc = ts_rd_u32(&d->r);
    c->len = ts_rd_u32(&d->r);
    c->data = with_data ? ts_rd_bytes(&d->r, c->len) : NULL;
}

/* The dataset fields of REPL_WRITE and REPL_SEAL: policy and incarnation. */
static void ds_fields(struct dec *d, struct ts_dataset_policy *p, uint64_t *inc)
{
    p->core = ts_rd_u8(&d->r);
    p->fringe = ts_rd_u8(&d->r);
    p->min_core = ts_rd_u8(&d->r);
    p->chunk_size = ts_rd_u32(&d->r);
    p->record_format = ts_rd_u8(&d->r);
    p->ec_k = ts_rd_u8(&d->r);
    p->ec_m = ts_rd_u8(&d->r);
    p->ec_dropped = ts_rd_u8(&d->r);
    *inc = ts_rd_u64(&d->r);
}

/* A u32 count of u64 record offsets that fill the rest of the payload. */
static int records(struct dec *d, struct tsd_u64s *v)
{
    v->n = ts_rd_u32(&d->r);
    if (!d->r.err && (uint64_t)v->n * 8 != d->r.len - d->r.off)
        return fail(d, TS_EPROTO, "record count does not match the payload");
    v->p = ts_rd_bytes(&d->r, d->r.err ? 0 : 8 * (size_t)v->n);
    if (d->r.err)
        v->n = 0;
    return done(d);
}

/* ---- opcodes ----------------------------------------------------------------------------- */

static int dec_hello(struct dec *d, struct tsd_req_hello *q)
{
    q->version = ts_rd_u16(&d->r);
    str(d, q->name, sizeof(q->name), &q->name_len);
    return done(d);
}

static int dec_dataset_create(struct dec *d, struct tsd_req_dataset_create *q)
{
    int rc = name(d, q->name);

    if (rc)
        return rc;
    q->policy.core = ts_rd_u8(&d->r);
    q->policy.fringe = ts_rd_u8(&d->r);
    q->policy.min_core = ts_rd_u8(&d->r);
    q->policy.chunk_size = ts_rd_u32(&d->r);
    if (d->r.len - d->r.off >= 8) { /* the cluster client's incarnation (0: none) */
        q->has_inc = 1;
        q->inc = ts_rd_u64(&d->r);
        if (d->r.len - d->r.off == 1) { /* then the record format */
            q->has_format = 1;
            q->policy.record_format = ts_rd_u8(&d->r);
        }
    }
    return done(d);
}

/* A name and nothing else. */
static int dec_dataset(struct dec *d, struct tsd_req_dataset *q)
{
    int rc = name(d, q->name);
    return rc ? rc : done(d);
}

/* A dataset's or a fragment store's name and nothing else (SHARD_LIST). */
static int dec_store_dataset(struct dec *d, struct tsd_req_dataset *q)
{
    int rc = store_name(d, q->name);
    return rc ? rc : done(d);
}

static int dec_dataset_seal(struct dec *d, struct tsd_req_dataset_seal *q)
{
    int rc = name(d, q->name);

    if (rc)
        return rc;
    if (d->r.off < d->r.len) { /* optional trailing flags */
        q->has_flags = 1;
        q->flags = ts_rd_u8(&d->r);
    }
    return done(d);
}

static int dec_dataset_tier(struct dec *d, struct tsd_req_dataset_tier *q)
{
    int rc = name(d, q->name);

    if (rc)
        return rc;
    q->k = ts_rd_u8(&d->r);
    q->m = ts_rd_u8(&d->r);
    q->dropped = ts_rd_u8(&d->r);
    if (!d->r.err && q->dropped > 1)
        return fail(d, TS_EPROTO, "dataset-tier: replicas flag %u (0 kept, 1 dropped)", q->dropped);
    return done(d);
}

static int dec_chunk_repair(struct dec *d, struct tsd_req_chunk_repair *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    q->shard = ts_rd_u32(&d->r);
    q->idx = ts_rd_u32(&d->r);
    q->len = ts_rd_u32(&d->r);
    q->data = ts_rd_bytes(&d->r, d->r.err ? 0 : q->len);
    return done(d);
}

static int dec_shard_write(struct dec *d, struct tsd_req_shard_write *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    chunk(d, &q->chunk, 1);
    return done(d);
}

static int dec_shard_seal(struct dec *d, struct tsd_req_shard_seal *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    q->shard = ts_rd_u32(&d->r);
    q->have_crc = ts_rd_u8(&d->r);
    q->crc = ts_rd_u32(&d->r);
    return records(d, &q->records);
}

static int dec_read(struct dec *d, struct tsd_req_read *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    q->shard = ts_rd_u32(&d->r);
    q->off = ts_rd_u64(&d->r);
    q->len = ts_rd_u32(&d->r);
    if (d->r.off < d->r.len) { /* an RDMA placement (the handler checks the flag) */
        q->placed = 1;
        q->raddr = ts_rd_u64(&d->r);
        q->rkey = ts_rd_u32(&d->r);
        if (ts_rd_u32(&d->r) != 0 && !d->r.err)
            return fail(d, TS_EPROTO, "read: the reserved field after the placement must be 0");
    }
    return done(d);
}

static int dec_readv(struct dec *d, struct tsd_req_readv *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    q->n = ts_rd_u32(&d->r);
    if (d->r.err || q->n > (d->r.len - d->r.off) / TS_READV_ENTRY)
        return malformed(d);
    q->p = ts_rd_bytes(&d->r, (size_t)q->n * TS_READV_ENTRY);
    return done(d);
}

static int dec_shard_stat(struct dec *d, struct tsd_req_shard_stat *q)
{
    int rc = store_name(d, q->name);

    if (rc)
        return rc;
    q->shard = ts_rd_u32(&d->r);
    return done(d);
}

/* An empty name means every dataset; anything else must be a valid name. */
static int dec_scrub(struct dec *d, struct tsd_req_dataset *q)
{
    if (d->r.len - d->r.off >= 2 && ts_get_le16(d->r.p + d->r.off) != 0)
        return dec_dataset(d, q);
    ts_rd_u16(&d->r); /* the empty name (missing: TS_EPROTO) */
    q->name[0] = '\0';
    return done(d);
}

static int dec_map_push(struct dec *d, struct tsd_req_map_push *q)
{
    struct ts_map *m = NULL;
    int rc = ts_map_decode(&d->r, &m);

    if (rc == TS_ENOMEM)
        return fail(d, rc, "out of memory");
    if (rc || ts_rd_done(&d->r)) {
        ts_map_free(m);
        return fail(d, TS_EPROTO, "map-push: malformed or invalid map (%s)",
                    d->r.err ? ts_strerror(d->r.err) : "trailing bytes");
    }
    q->map = m;
    return 0;
}

static int dec_repl_write(struct dec *d, struct tsd_req_repl_write *q)
{
    int rc = name(d, q->name);

    if (rc)
        return rc;
    ds_fields(d, &q->policy, &q->inc);
    /* A dataset whose replicas' bytes are dropped: its chunks travel as records (CRC32C and
     * length), without bytes. */
    chunk(d, &q->chunk, !q->policy.ec_dropped);
    if (!d->r.err &&
        (q->policy.ec_dropped > 1 ||
         (q->policy.ec_dropped && (q->policy.ec_k < 1 || q->policy.ec_k > TS_EC_MAX_K ||
                                   q->policy.ec_m < 1 || q->policy.ec_m > TS_EC_MAX_M))))
        return fail(d, TS_EPROTO, "repl-write %s: ec %u+%u, replicas flag %u", q->name,
                    q->policy.ec_k, q->policy.ec_m, q->policy.ec_dropped);
    return done(d);
}

/* PRUNE's list: u32 n, n x (str name, u64 incarnation, u8 deleted), to the payload's end. */
static int prune_list(struct dec *d, struct tsd_prune_list *l)
{
    const char *bad = "repl-seal prune: malformed dataset list";
    struct tsd_prune_entry e;
    size_t start;

    l->n = ts_rd_u32(&d->r);
    if (d->r.err || l->n > (d->r.len - d->r.off) / TSD_PRUNE_ENTRY_MIN)
        return fail(d, TS_EPROTO, "%s", bad);
    start = d->r.off;
    for (uint32_t i = 0; i < l->n && !d->r.err; i++) {
        str(d, e.name, sizeof(e.name), &e.name_len);
        ts_rd_u64(&d->r);
        ts_rd_u8(&d->r);
    }
    if (done(d))
        return TS_EPROTO;
    l->p = d->r.p + start;
    l->len = d->r.off - start;
    return 0;
}

static int repl_kind_named(uint8_t kind)
{
    return kind == TS_REPL_SEAL || kind == TS_REPL_BACKFILL || kind == TS_REPL_DELETE ||
           kind == TS_REPL_ABORT;
}

static int dec_repl_seal(struct dec *d, struct tsd_req_repl_seal *q)
{
    int rc;

    q->kind = ts_rd_u8(&d->r);
    q->pg = ts_rd_u32(&d->r);
    q->seq = ts_rd_u64(&d->r);
    q->epoch = ts_rd_u64(&d->r);
    if (!repl_kind_named(q->kind)) {
        q->unnamed = ts_rd_u16(&d->r);
        q->name[0] = '\0';
    } else if ((rc = name(d, q->name)) != 0) {
        return rc;
    }
    ds_fields(d, &q->policy, &q->inc);
    q->shard = ts_rd_u32(&d->r);
    q->have_crc = ts_rd_u8(&d->r);
    q->crc = ts_rd_u32(&d->r);
    if (q->kind == TS_REPL_PRUNE)
        return prune_list(d, &q->prune);
    return records(d, &q->records);
}

static int dec_pg_info(struct dec *d, struct tsd_req_pg_info *q)
{
    q->pg = ts_rd_u32(&d->r);
    return done(d);
}

static int dec_pg_drop(struct dec *d, struct tsd_req_pg_drop *q)
{
    q->pg = ts_rd_u32(&d->r);
    q->dataset[0] = '\0';
    q->dataset_len = 0;
    q->has_dataset = d->r.off < d->r.len;
    if (q->has_dataset) /* the dataset filter (tessera hot rm) */
        str(d, q->dataset, sizeof(q->dataset), &q->dataset_len);
    return done(d);
}

static int dec_pg_query(struct dec *d, struct tsd_req_pg_query *q)
{
    q->pg = ts_rd_u32(&d->r);
    q->epoch = ts_rd_u64(&d->r);
    str(d, q->from, sizeof(q->from), &q->from_len);
    return done(d);
}

static int dec_pg_activate(struct dec *d, struct tsd_req_pg_activate *q)
{
    q->pg = ts_rd_u32(&d->r);
    q->epoch = ts_rd_u64(&d->r);
    q->phase = ts_rd_u8(&d->r);
    q->wq = ts_rd_u8(&d->r);
    q->n = ts_rd_u8(&d->r);
    if (q->n > TSD_PG_MAX_ACTING)
        return fail(d, TS_EPROTO, "pg-activate: %u members (at most %d)", q->n, TSD_PG_MAX_ACTING);
    for (unsigned i = 0; i < q->n; i++)
        str(d, q->acting[i], sizeof(q->acting[i]), &q->acting_len[i]);
    q->head_epoch = ts_rd_u64(&d->r);
    q->head_seq = ts_rd_u64(&d->r);
    q->member = ts_rd_u8(&d->r);
    return done(d);
}

static int dec_pg_pull(struct dec *d, struct tsd_req_pg_pull *q)
{
    q->pg = ts_rd_u32(&d->r);
    q->epoch = ts_rd_u64(&d->r);
    str(d, q->node, sizeof(q->node), &q->node_len);
    q->recheck = ts_rd_u8(&d->r);
    return done(d);
}

static int dec_pg_inventory(struct dec *d, struct tsd_req_pg_inventory *q)
{
    q->pg = ts_rd_u32(&d->r);
    q->rank = ts_rd_u8(&d->r);
    return done(d);
}

int tsd_req_decode(unsigned op, const uint8_t *p, size_t len, struct tsd_req *q, char *msg,
                   size_t msglen)
{
    const struct ts_op_desc *desc = ts_op_desc(op);
    struct dec d = {.what = desc ? desc->name : "?", .msg = msg, .msglen = msglen};
    int rc;

    memset(q, 0, sizeof(*q));
    q->op = (uint8_t)op;
    ts_rd_init(&d.r, p, len);
    switch (op) {
    case TS_OP_HELLO:
        rc = dec_hello(&d, &q->u.hello);
        break;
    case TS_OP_DATASET_CREATE:
        rc = dec_dataset_create(&d, &q->u.dataset_create);
        break;
    case TS_OP_DATASET_LIST:
    case TS_OP_STATUS:
    case TS_OP_MAP_GET:
    case TS_OP_RDMA_TOKEN:
        rc = done(&d);
        break;
    case TS_OP_DATASET_STAT:
        rc = dec_dataset(&d, &q->u.dataset_stat);
        break;
    case TS_OP_DATASET_SEAL:
        rc = dec_dataset_seal(&d, &q->u.dataset_seal);
        break;
    case TS_OP_DATASET_DELETE:
        rc = dec_dataset(&d, &q->u.dataset_delete);
        break;
    case TS_OP_DATASET_TIER:
        rc = dec_dataset_tier(&d, &q->u.dataset_tier);
        break;
    case TS_OP_CHUNK_REPAIR:
        rc = dec_chunk_repair(&d, &q->u.chunk_repair);
        break;
    case TS_OP_SHARD_WRITE:
        rc = dec_shard_write(&d, &q->u.shard_write);
        break;
    case TS_OP_SHARD_SEAL:
        rc = dec_shard_seal(&d, &q->u.shard_seal);
        break;
    case TS_OP_READ:
        rc = dec_read(&d, &q->u.read);
        break;
    case TS_OP_READV:
        rc = dec_readv(&d, &q->u.readv);
        break;
    case TS_OP_HINT:
        rc = dec_readv(&d, &q->u.hint);
        break;
    case TS_OP_SHARD_STAT:
        rc = dec_shard_stat(&d, &q->u.shard_stat);
        break;
    case TS_OP_SHARD_RECORDS:
        rc = dec_shard_stat(&d, &q->u.shard_records);
        break;
    case TS_OP_SHARD_LIST:
        rc = dec_store_dataset(&d, &q->u.shard_list);
        break;
    case TS_OP_SCRUB:
        rc = dec_scrub(&d, &q->u.scrub);
        break;
    case TS_OP_MAP_PUSH:
        rc = dec_map_push(&d, &q->u.map_push);
        break;
    case TS_OP_REPL_WRITE:
        rc = dec_repl_write(&d, &q->u.repl_write);
        break;
    case TS_OP_REPL_SEAL:
        rc = dec_repl_seal(&d, &q->u.repl_seal);
        break;
    case TS_OP_PG_INFO:
        rc = dec_pg_info(&d, &q->u.pg_info);
        break;
    case TS_OP_PG_DROP:
        rc = dec_pg_drop(&d, &q->u.pg_drop);
        break;
    case TS_OP_PG_QUERY:
        rc = dec_pg_query(&d, &q->u.pg_query);
        break;
    case TS_OP_PG_ACTIVATE:
        rc = dec_pg_activate(&d, &q->u.pg_activate);
        break;
    case TS_OP_PG_PULL:
        rc = dec_pg_pull(&d, &q->u.pg_pull);
        break;
    case TS_OP_PG_INVENTORY:
        rc = dec_pg_inventory(&d, &q->u.pg_inventory);
        break;
    default:
        rc = fail(&d, TS_ENOTSUP, "unknown opcode %u", op);
    }
    return rc;
}

void tsd_req_free(struct tsd_req *q)
{
    if (q->op == TS_OP_MAP_PUSH) {
        ts_map_free(q->u.map_push.map);
        q->u.map_push.map = NULL;
    }
}

size_t tsd_prune_entry_at(const struct tsd_prune_list *l, size_t off, struct tsd_prune_entry *e)
{
    struct dec d = {0};

    ts_rd_init(&d.r, l->p, l->len);
    d.r.off = off;
    str(&d, e->name, sizeof(e->name), &e->name_len);
    e->inc = ts_rd_u64(&d.r);
    e->deleted = ts_rd_u8(&d.r);
    return d.r.off;
}
