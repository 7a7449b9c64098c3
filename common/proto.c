/* Frame header codec and bounds-checked payload reader/writer (see ts_proto.h). */
#include "ts_proto.h"

#include <stdlib.h>
#include <strings.h>

static const struct ts_op_desc op_table[TS_OP_MAX] = {
#define TS_OPCODE_DESC(name, value, wire, role, max) [value] = {wire, role, max},
    TS_OPCODE_TABLE(TS_OPCODE_DESC)
#undef TS_OPCODE_DESC
};

const struct ts_op_desc *ts_op_desc(unsigned opcode)
{
    if (opcode >= TS_OP_MAX || !op_table[opcode].name)
        return NULL;
    return &op_table[opcode];
}

static const char *const role_names[] = {"none",  "reader", "writer",
                                         "admin", "node",   "admin or node"};

const char *ts_role_name(int role)
{
    return role >= 0 && role <= TS_ROLE_ADMIN_OR_NODE ? role_names[role] : "?";
}

int ts_role_parse(const char *name)
{
    for (int i = 0; i <= TS_ROLE_NODE; i++)
        if (name && strcasecmp(name, role_names[i]) == 0)
            return i;
    return TS_EINVAL;
}

int ts_role_may(int role, int need)
{
    if (need == TS_ROLE_NODE)
        return role == TS_ROLE_NODE;
    if (need == TS_ROLE_ADMIN_OR_NODE)
        return role == TS_ROLE_ADMIN || role == TS_ROLE_NODE;
    if (role == TS_ROLE_NODE)
        return need <= TS_ROLE_READER;
    return role >= need && role <= TS_ROLE_ADMIN;
}

int ts_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, struct ts_frame_hdr *h)
{
    /* Reject a wrong magic as soon as its bytes arrive: no need to wait for a whole header. */
    static const uint8_t magic[4] = {'T', 'S', 'R', 'A'};
    size_t n = len < 4 ? len : 4;

    if (len == 0) /* buf may be NULL (an empty buffer): memcmp must not see it */
        return 0;
    if (memcmp(buf, magic, n) != 0)
        return TS_EPROTO;
    if (len < TS_HDR_LEN)
        return 0;
    if (ts_crc32c(0, buf, 28) != ts_get_le32(buf + 28))
        return TS_EPROTO;
    h->version = buf[4];
    h->opcode = buf[5];
    h->flags = ts_get_le16(buf + 6);
    h->req_id = ts_get_le64(buf + 8);
    h->epoch = ts_get_le64(buf + 16);
    h->length = ts_get_le32(buf + 24);
    if (h->version != TS_PROTO_VERSION || (h->flags & ~TS_F_KNOWN))
        return TS_EPROTO;
    if (h->length > max_payload)
        return TS_ETOOBIG;
    return TS_HDR_LEN;
}

void ts_frame_encode(uint8_t *out, const struct ts_frame_hdr *h)
{
    ts_put_le32(out, TS_MAGIC);
    out[4] = h->version ? h->version : TS_PROTO_VERSION;
    out[5] = h->opcode;
    ts_put_le16(out + 6, h->flags);
    ts_put_le64(out + 8, h->req_id);
    ts_put_le64(out + 16, h->epoch);
    ts_put_le32(out + 24, h->length);
    ts_put_le32(out + 28, ts_crc32c(0, out, 28));
}

/* ---- reader ------------------------------------------------------------------------ */

static const uint8_t *rd_take(struct ts_rd *r, size_t n)
{
    const uint8_t *p;

    if (r->err || r->len - r->off < n) {
        r->err = TS_EPROTO;
        return NULL;
    }
    p = r->p + r->off;
    r->off += n;
    return p;
}

uint8_t ts_rd_u8(struct ts_rd *r)
{
    const uint8_t *p = rd_take(r, 1);
    return p ? p[0] : 0;
}

uint16_t ts_rd_u16(struct ts_rd *r)
{
    const uint8_t *p = rd_take(r, 2);
    return p ? ts_get_le16(p) : 0;
}

uint32_t ts_rd_u32(struct ts_rd *r)
{
    const uint8_t *p = rd_take(r, 4);
    return p ? ts_get_le32(p) : 0;
}

uint64_t ts_rd_u64(struct ts_rd *r)
{
    const uint8_t *p = rd_take(r, 8);
    return p ? ts_get_le64(p) : 0;
}

const uint8_t *ts_rd_bytes(struct ts_rd *r, size_t n)
{
    return rd_take(r, n);
}

void ts_rd_str(struct ts_rd *r, char *out, size_t cap)
{
    uint16_t n = ts_rd_u16(r);
    const uint8_t *p;

    out[0] = '\0';
    if (r->err)
        return;
    if ((size_t)n >= cap) {
        r->err = TS_EPROTO;
        return;
    }
    p = rd_take(r, n);
    if (!p)
        return;
    memcpy(out, p, n);
    out[n] = '\0';
}

static int rd_name(struct ts_rd *r, char out[TS_NAME_MAX + 1], int (*valid)(const char *))
{
    uint16_t n = ts_rd_u16(r);
    const uint8_t *p = rd_take(r, n);

    out[0] = '\0';
    if (!p)
        return TS_EPROTO;
    if (n == 0 || n > TS_NAME_MAX)
        return TS_ENAME;
    memcpy(out, p, n);
    out[n] = '\0';
    return valid(out) && strlen(out) == n ? 0 : TS_ENAME;
}

int ts_rd_name(struct ts_rd *r, char out[TS_NAME_MAX + 1])
{
    return rd_name(r, out, ts_name_valid);
}

int ts_rd_name_store(struct ts_rd *r, char out[TS_NAME_MAX + 1])
{
    return rd_name(r, out, ts_name_valid_store);
}

int ts_rd_done(const struct ts_rd *r)
{
    return r->err ? r->err : (r->off == r->len ? 0 : TS_EPROTO);
}

/* ---- writer ------------------------------------------------------------------------ */

void ts_wr_init(struct ts_wr *w)
{
    memset(w, 0, sizeof(*w));
}

void ts_wr_fini(struct ts_wr *w)
{
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

static uint8_t *wr_room(struct ts_wr *w, size_t n)
{
    uint8_t *p;

    if (w->err)
        return NULL;
    if (w->cap - w->len < n) {
        size_t cap = w->cap ? w->cap : 256;
        if (n > SIZE_MAX / 2 - w->len) { /* doubling past this would wrap cap */
            w->err = TS_ENOMEM;
            return NULL;
        }
        while (cap - w->len < n)
            cap *= 2;
        p = realloc(w->buf, cap);
        if (!p) {
            w->err = TS_ENOMEM;
            return NULL;
        }
        w->buf = p;
        w->cap = cap;
    }
    p = w->buf + w->len;
    w->len += n;
    return p;
}

void ts_wr_u8(struct ts_wr *w, uint8_t v)
{
    uint8_t *p = wr_room(w, 1);
    if (p)
        *p = v;
}

void ts_wr_u16(struct ts_wr *w, uint16_t v)
{
    uint8_t *p = wr_room(w, 2);
    if (p)
        ts_put_le16(p, v);
}

void ts_wr_u32(struct ts_wr *w, uint32_t v)
{
    uint8_t *p = wr_room(w, 4);
    if (p)
        ts_put_le32(p, v);
}

void ts_wr_u64(struct ts_wr *w, uint64_t v)
{
    uint8_t *p = wr_room(w, 8);
    if (p)
        ts_put_le64(p, v);
}

void ts_wr_bytes(struct ts_wr *w, const void *src, size_t n)
{
    uint8_t *p = wr_room(w, n);
    if (p && n)
        memcpy(p, src, n);
}

void ts_wr_str(struct ts_wr *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n > UINT16_MAX)
        n = UINT16_MAX;
    ts_wr_u16(w, (uint16_t)n);
    ts_wr_bytes(w, s, n);
}

void ts_wr_begin_frame(struct ts_wr *w)
{
    w->len = 0;
    wr_room(w, TS_HDR_LEN);
}

void ts_wr_frame(struct ts_wr *w, uint8_t opcode, uint16_t flags, uint64_t req_id, uint64_t epoch)
{
    struct ts_frame_hdr h = {TS_PROTO_VERSION, opcode, flags, req_id, epoch, 0};

    if (w->err || w->len < TS_HDR_LEN)
        return;
    if (w->len - TS_HDR_LEN > UINT32_MAX) {
        w->err = TS_ETOOBIG;
        return;
    }
    h.length = (uint32_t)(w->len - TS_HDR_LEN);
    ts_frame_encode(w->buf, &h);
}

/* ---- shared bodies ----------------------------------------------------------------- */

void ts_wr_dataset_info(struct ts_wr *w, const struct ts_dataset_info *d)
{
    ts_wr_str(w, d->name);
    ts_wr_u64(w, d->id);
    ts_wr_u8(w, d->policy.core);
    ts_wr_u8(w, d->policy.fringe);
    ts_wr_u8(w, d->policy.min_core);
    ts_wr_u8(w, (uint8_t)d->state);
    ts_wr_u32(w, d->policy.chunk_size);
    ts_wr_u64(w, d->created_ns);
    ts_wr_u32(w, d->shards);
    ts_wr_u32(w, d->shards_writing);
    ts_wr_u64(w, d->bytes);
    ts_wr_u8(w, d->policy.record_format);
    ts_wr_u8(w, d->policy.ec_k);
    ts_wr_u8(w, d->policy.ec_m);
    ts_wr_u8(w, d->policy.ec_dropped);
}

int ts_rd_dataset_info(struct ts_rd *r, struct ts_dataset_info *d)
{
    memset(d, 0, sizeof(*d));
    ts_rd_str(r, d->name, sizeof(d->name));
    d->id = ts_rd_u64(r);
    d->policy.core = ts_rd_u8(r);
    d->policy.fringe = ts_rd_u8(r);
    d->policy.min_core = ts_rd_u8(r);
    d->state = ts_rd_u8(r);
    d->policy.chunk_size = ts_rd_u32(r);
    d->created_ns = ts_rd_u64(r);
    d->shards = ts_rd_u32(r);
    d->shards_writing = ts_rd_u32(r);
    d->bytes = ts_rd_u64(r);
    d->policy.record_format = ts_rd_u8(r);
    d->policy.ec_k = ts_rd_u8(r);
    d->policy.ec_m = ts_rd_u8(r);
    d->policy.ec_dropped = ts_rd_u8(r);
    return r->err;
}

void ts_wr_shard_info(struct ts_wr *w, const struct ts_shard_info *s)
{
    ts_wr_u32(w, s->shard);
    ts_wr_u8(w, (uint8_t)s->state);
    ts_wr_u64(w, s->size);
    ts_wr_u64(w, s->expect_size);
    ts_wr_u32(w, s->chunk_size);
    ts_wr_u32(w, s->nchunks);
    ts_wr_u32(w, s->crc);
    ts_wr_u32(w, s->nrecords);
}

int ts_rd_shard_info(struct ts_rd *r, struct ts_shard_info *s)
{
    memset(s, 0, sizeof(*s));
    s->shard = ts_rd_u32(r);
    s->state = ts_rd_u8(r);
    s->size = ts_rd_u64(r);
    s->expect_size = ts_rd_u64(r);
    s->chunk_size = ts_rd_u32(r);
    s->nchunks = ts_rd_u32(r);
    s->crc = ts_rd_u32(r);
    s->nrecords = ts_rd_u32(r);
    return r->err;
}
