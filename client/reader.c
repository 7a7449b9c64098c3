/*
 * The plan reader, the caller's side (include/tessera/reader.h): opening (the dataset's units,
 * the plan, the connections), handing units over in plan order, stats, closing. The threads
 * that read are in reader_worker.c, record indexes in reader_index.c.
 */
#include "reader_internal.h"

#include "tessera/records.h"

#include <stdarg.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEF_WINDOW_UNITS 64
#define DEF_WINDOW_BYTES (256ull << 20)
#define DEF_CONNECTIONS 2
#define DEF_DEPTH 32
#define DEF_RETRIES 3
#define DEF_INDEX_SHARDS 64
#define MAX_CONNECTIONS 64
#define DEF_HINT_BYTES (64ull << 20) /* what a node queues per connection by default */

void tessera_reader_opts_init(struct tessera_reader_opts *o)
{
    memset(o, 0, sizeof(*o));
    tessera_plan_opts_init(&o->plan);
    o->window_units = DEF_WINDOW_UNITS;
    o->window_bytes = DEF_WINDOW_BYTES;
    o->connections = DEF_CONNECTIONS;
    o->depth = DEF_DEPTH;
    o->retries = DEF_RETRIES;
    o->index_shards = DEF_INDEX_SHARDS;
    o->split_block = 1;
    o->split_n = 1;
    o->hint_bytes = DEF_HINT_BYTES;
}

static void say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The connection options, with their strings copied (the reader reconnects later). */
static int copy_opts(struct tessera_reader *r, const struct tessera_opts *o)
{
    const char *const src[] = {o->address,         o->tls_ca,      o->tls_cert, o->tls_key,
                               o->tls_server_name, o->client_name, o->domain};
    const char **dst[] = {&r->copts.address, &r->copts.tls_ca,          &r->copts.tls_cert,
                          &r->copts.tls_key, &r->copts.tls_server_name, &r->copts.client_name,
                          &r->copts.domain};
    size_t len = 0, off = 0;

    r->copts = *o;
    for (size_t i = 0; i < sizeof(src) / sizeof(src[0]); i++)
        len += src[i] ? strlen(src[i]) + 1 : 0;
    r->copt_strings = malloc(len ? len : 1);
    if (!r->copt_strings)
        return TS_ENOMEM;
    for (size_t i = 0; i < sizeof(src) / sizeof(src[0]); i++) {
        if (!src[i])
            continue;
        memcpy(r->copt_strings + off, src[i], strlen(src[i]) + 1);
        *dst[i] = r->copt_strings + off;
        off += strlen(src[i]) + 1;
    }
    return 0;
}

static int check_opts(const struct tessera_reader_opts *o, char *err, size_t errlen)
{
    if (!o->dataset || !o->dataset[0] || strlen(o->dataset) > TS_NAME_MAX) {
        say(err, errlen, "a reader needs a dataset name");
        return TS_EINVAL;
    }
    if (o->unit != TESSERA_UNIT_SHARD && o->unit != TESSERA_UNIT_RECORD) {
        say(err, errlen, "unknown unit kind %d (shard or record)", o->unit);
        return TS_EINVAL;
    }
    if (!o->window_units || !o->window_bytes || !o->connections ||
        o->connections > MAX_CONNECTIONS || !o->depth || !o->index_shards) {
        say(err, errlen,
            "window_units, window_bytes, depth and index_shards must be > 0, connections 1 to %d",
            MAX_CONNECTIONS);
        return TS_EINVAL;
    }
    if (!o->split_block || !o->split_n || o->split_i >= o->split_n) {
        say(err, errlen, "a split needs split_block >= 1 and split_i < split_n");
        return TS_EINVAL;
    }
    if (o->record < TESSERA_RECORD_AUTO || o->record > TESSERA_RECORD_PAYLOAD) {
        say(err, errlen, "unknown record form %d (auto, framed or payload)", o->record);
        return TS_EINVAL;
    }
    if (o->alloc && !o->free_fn) {
        say(err, errlen, "caller-owned buffers need free_fn as well as alloc");
        return TS_EINVAL;
    }
    return 0;
}

/* How many of a plan's len positions a split reader reads. */
static uint64_t split_len(uint64_t len, const struct tessera_reader_opts *o)
{
    uint64_t b = o->split_block, cycle = b * o->split_n, rest = len % cycle, at = o->split_i * b;

    return len / cycle * b + (rest > at ? TS_MIN(rest - at, b) : 0);
}

/* The plan over the dataset's units (resumed when a state was given). */
static int make_plan(struct tessera_reader *r, char *err, size_t errlen)
{
    struct tessera_plan_opts po = r->o.plan;
    int rc;

    po.units = r->o.unit == TESSERA_UNIT_SHARD ? r->recs->nshards : r->recs->total;
    if (po.shuffle == TESSERA_SHUFFLE_GIVEN && r->o.plan.units != po.units) {
        say(err, errlen, "the given order has %llu units (plan.units), %s has %llu",
            (unsigned long long)r->o.plan.units, r->dataset, (unsigned long long)po.units);
        return TS_EINVAL;
    }
    po.group_sizes = NULL;
    po.ngroups = 0;
    if (r->o.unit == TESSERA_UNIT_RECORD && po.shuffle == TESSERA_SHUFFLE_WINDOW) {
        po.group_sizes = r->recs->count;
        po.ngroups = r->recs->nshards;
    }
    if (r->o.resume)
        rc = tessera_plan_resume(&r->plan, &po, r->o.resume, r->o.resume_len);
    else
        rc = tessera_plan_new(&r->plan, &po);
    if (rc)
        say(err, errlen, "%s: %s",
            r->o.resume ? "the saved position does not fit this plan"
                        : "these options make no plan",
            ts_strerror(rc));
    else
        r->len = split_len(tessera_plan_len(r->plan), &r->o);
    return rc;
}

int tessera_reader_open(tessera_reader **out, const struct tessera_opts *copts,
                        const struct tessera_reader_opts *o, char *err, size_t errlen)
{
    struct tessera_reader *r;
    tessera_client *c = NULL;
    int rc;

    if (!out || !copts || !o)
        return TS_EINVAL;
    *out = NULL;
    rc = check_opts(o, err, errlen);
    if (rc)
        return rc;
    r = calloc(1, sizeof(*r));
    if (!r)
        return TS_ENOMEM;
    r->o = *o;
    snprintf(r->dataset, sizeof(r->dataset), "%s", o->dataset);
    r->o.dataset = r->dataset;
    r->fail_k = UINT64_MAX;
    pthread_mutex_init(&r->m, NULL);
    pthread_cond_init(&r->ready, NULL);
    pthread_cond_init(&r->space, NULL);
    pthread_cond_init(&r->hint_cv, NULL);
    r->slots = calloc(o->window_units, sizeof(*r->slots));
    r->index = calloc(o->index_shards, sizeof(*r->index));
    r->pool_max = TS_MAX(TS_READER_POOL_MIN, TS_MIN(o->window_units, TS_READER_POOL_MAX));
    r->pool = calloc(r->pool_max, sizeof(*r->pool));
    rc = !r->slots || !r->index || !r->pool ? TS_ENOMEM : copy_opts(r, copts);
    for (uint32_t e = 0; !rc && e < o->index_shards; e++)
        r->index[e].i = UINT32_MAX;
    if (!rc)
        rc = ts_client_open_ex(&c, &r->copts, err, errlen);
    if (!rc) {
        rc = tessera_dataset_records(c, r->dataset, &r->recs);
        if (rc)
            say(err, errlen, "%s: %s", r->dataset,
                tessera_client_error(c)[0] ? tessera_client_error(c) : ts_strerror(rc));
    }
    if (!rc && o->unit == TESSERA_UNIT_RECORD && o->record != TESSERA_RECORD_FRAMED)
        r->payload_fmt = r->recs->format;
    if (!rc)
        rc = make_plan(r, err, errlen);
    if (!rc) {
        rc = ts_reader_workers_start(r, c, err, errlen);
        c = NULL;
    }
    if (!rc)
        rc = ts_reader_hints_start(r, err, errlen);
    if (rc) {
        tessera_client_close(c);
        tessera_reader_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

uint8_t *ts_reader_buf_get(struct tessera_reader *r, size_t len, size_t *cap)
{
    /* The most recently kept buffer that fits, if it is not more than twice too big: records
     * of one size hit on the first look, and the bytes are still in the cache. */
    for (uint32_t i = r->npool; i-- > 0;) {
        struct pool_buf *p = &r->pool[i];
        if (p->cap >= len && p->cap / 2 <= len + 4096) {
            uint8_t *b = p->buf;
            *cap = p->cap;
            r->pool_bytes -= p->cap;
            *p = r->pool[--r->npool];
            return b;
        }
    }
    *cap = len < 4096 ? (len + 63) / 64 * 64 + 64 : (len + 4095) / 4096 * 4096;
    return malloc(*cap);
}

void ts_reader_buf_put(struct tessera_reader *r, uint8_t *buf, size_t cap)
{
    if (!buf)
        return;
    if (r->npool == r->pool_max || r->pool_bytes + cap > r->o.window_bytes) {
        free(buf);
        return;
    }
    r->pool[r->npool].buf = buf;
    r->pool[r->npool++].cap = cap;
    r->pool_bytes += cap;
}

/* The caller is done with the unit it holds (lock held). */
static void release_held(struct tessera_reader *r)
{
    ts_reader_buf_put(r, r->held, r->held_cap);
    r->held = NULL;
}

/* Waits (lock held) until the caller's next unit is done or failed: its slot, or NULL when
 * the reader ended or failed (*rc says how: 0 at the end, TS_E*). */
/* What the caller gets of done slot s: the record's payload when the reader hands out
 * payloads, else all of it (lock held). 0, or TS_EPROTO, the reader's error from now on. */
static int unit_span(struct tessera_reader *r, struct slot *s)
{
    s->poff = 0;
    s->plen = s->len;
    if (!r->payload_fmt ||
        tessera_record_payload(r->payload_fmt, s->buf, s->len, &s->poff, &s->plen) == 0)
        return 0;
    r->err = TS_EPROTO;
    snprintf(r->errmsg, sizeof(r->errmsg),
             "%s shard %u record %llu (%zu bytes) is not one %s record: no payload to take "
             "(read it framed)",
             r->dataset, s->shard, (unsigned long long)s->record, s->len,
             tessera_record_format_name(r->payload_fmt));
    return TS_EPROTO;
}

static struct slot *wait_next(struct tessera_reader *r, int *rc)
{
    struct slot *s;

    if (r->err || r->consumed == r->len) {
        *rc = r->err;
        return NULL;
    }
    s = ts_reader_slot(r, r->consumed);
    if (s->k != r->consumed || (s->state != SLOT_DONE && s->state != SLOT_FAILED)) {
        uint64_t t0 = ts_now_mono_ns();
        r->st.stalls++;
        r->caller_waits = 1;
        while (s->k != r->consumed || (s->state != SLOT_DONE && s->state != SLOT_FAILED))
            pthread_cond_wait(&r->ready, &r->m);
        r->caller_waits = 0;
        r->st.stall_ns += ts_now_mono_ns() - t0;
    }
    if (s->state == SLOT_FAILED) {
        r->err = s->rc;
        snprintf(r->errmsg, sizeof(r->errmsg), "%s", s->msg);
        *rc = r->err;
        return NULL;
    }
    if (unit_span(r, s)) {
        *rc = r->err;
        return NULL;
    }
    return s;
}

/* Locks r, releases the unit the caller held, waits for the next: its slot (lock held), or
 * NULL with *rc (0 at the end, TS_E*) and the lock released. */
static struct slot *lock_next(struct tessera_reader *r, int *rc)
{
    struct slot *s;

    pthread_mutex_lock(&r->m);
    release_held(r);
    s = wait_next(r, rc);
    if (!s)
        pthread_mutex_unlock(&r->m);
    return s;
}

/* The caller takes the done unit in slot s (lock held): counted, its slot freed. */
static void take(struct tessera_reader *r, struct slot *s)
{
    r->ahead -= s->len;
    r->done_ahead -= s->len;
    r->st.units++;
    r->st.bytes += s->len;
    if (s->node[0])
        ts_reader_count_node(r, s->node, s->len);
    s->buf = NULL;
    s->state = SLOT_FREE;
    r->consumed++;
}

int tessera_reader_next(tessera_reader *r, struct tessera_unit *u)
{
    struct slot *s;
    int rc;

    if (!r || !u)
        return TS_EINVAL;
    memset(u, 0, sizeof(*u));
    s = lock_next(r, &rc);
    if (!s)
        return rc;
    u->k = ts_reader_plan_pos(r, s->k);
    u->unit = s->unit;
    u->shard = s->shard;
    u->record = s->record;
    u->offset = s->offset;
    u->buffer = s->buf;
    u->data = s->buf + s->poff;
    u->len = s->plen;
    snprintf(r->held_node, sizeof(r->held_node), "%s", s->node);
    u->node = r->held_node;
    if (!r->o.alloc) {
        r->held = s->buf;
        r->held_cap = s->cap;
    }
    take(r, s);
    ts_reader_wake_taken(r);
    pthread_mutex_unlock(&r->m);
    return 1;
}

#define MANY_MAX 1024 /* units one tessera_reader_next_many call takes at most */

int tessera_reader_next_many(tessera_reader *r, void *buf, size_t cap, size_t *lens, uint32_t max,
                             uint32_t *n)
{
    struct {
        uint8_t *buf;
        size_t cap, off, len;
    } got[MANY_MAX];
    uint32_t k = 0;
    size_t off = 0;
    struct slot *s;
    int rc;

    if (n)
        *n = 0;
    if (!r || !n || !lens || !max || (!buf && cap))
        return TS_EINVAL;
    if (r->o.alloc)
        return TS_EINVAL; /* caller-owned buffers go one by one (tessera_reader_next) */
    max = TS_MIN(max, (uint32_t)MANY_MAX);
    s = lock_next(r, &rc);
    if (!s)
        return rc;
    if (s->len > cap) {
        lens[0] = s->len; /* does not fit: the caller takes it with tessera_reader_next */
        pthread_mutex_unlock(&r->m);
        return 1;
    }
    /* The first unit, then those already done behind it that fit: never waits for more. */
    do {
        got[k].buf = s->buf;
        got[k].cap = s->cap;
        got[k].off = s->poff;
        got[k].len = lens[k] = s->plen;
        off += s->plen;
        k++;
        take(r, s);
        if (k == max || r->consumed == r->len)
            break;
        s = ts_reader_slot(r, r->consumed);
    } while (s->k == r->consumed && s->state == SLOT_DONE && off + s->len <= cap &&
             unit_span(r, s) == 0);
    ts_reader_wake_taken(r);
    pthread_mutex_unlock(&r->m);
    /* The copies outside the lock: a done slot's buffer is no thread's but ours now. */
    off = 0;
    for (uint32_t i = 0; i < k; i++) {
        memcpy((uint8_t *)buf + off, got[i].buf + got[i].off, got[i].len);
        off += got[i].len;
    }
    pthread_mutex_lock(&r->m);
    for (uint32_t i = 0; i < k; i++)
        ts_reader_buf_put(r, got[i].buf, got[i].cap);
    pthread_mutex_unlock(&r->m);
    *n = k;
    return 1;
}

int tessera_reader_keep(tessera_reader *r)
{
    int rc;

    if (!r)
        return TS_EINVAL;
    pthread_mutex_lock(&r->m);
    rc = r->held ? 0 : TS_ENOENT;
    r->held = NULL; /* the caller's now */
    pthread_mutex_unlock(&r->m);
    return rc;
}

void tessera_reader_give_back(tessera_reader *r, void *data)
{
    if (!data)
        return;
    if (!r) {
        free(data);
        return;
    }
    if (r->o.alloc) { /* the caller's own memory (not a kept buffer): back to its allocator */
        r->o.free_fn(r->o.alloc_arg, data);
        return;
    }
    pthread_mutex_lock(&r->m);
    ts_reader_buf_put(r, data, malloc_usable_size(data));
    pthread_mutex_unlock(&r->m);
}

uint64_t tessera_reader_len(const tessera_reader *r)
{
    return r ? r->len : 0;
}

uint64_t tessera_reader_consumed(const tessera_reader *r)
{
    uint64_t n;

    if (!r)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&r->m);
    n = r->consumed;
    pthread_mutex_unlock((pthread_mutex_t *)&r->m);
    return n;
}

const tessera_plan *tessera_reader_plan(const tessera_reader *r)
{
    return r ? r->plan : NULL;
}

void tessera_reader_stats(tessera_reader *r, struct tessera_reader_stats *st)
{
    if (!r || !st)
        return;
    pthread_mutex_lock(&r->m);
    *st = r->st;
    st->ahead_bytes = r->ahead;
    pthread_mutex_unlock(&r->m);
}

const char *tessera_reader_error(const tessera_reader *r)
{
    if (!r)
        return "";
    return r->err ? r->errmsg : "";
}

void tessera_reader_close(tessera_reader *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->m);
    r->stop = 1;
    pthread_cond_broadcast(&r->space);
    pthread_cond_signal(&r->hint_cv);
    pthread_mutex_unlock(&r->m);
    ts_reader_hints_stop(r);
    ts_reader_workers_stop(r);
    release_held(r);
    for (uint32_t i = 0; r->slots && i < r->o.window_units; i++) {
        struct slot *s = &r->slots[i];
        if (!s->buf)
            continue;
        if (r->o.alloc)
            r->o.free_fn(r->o.alloc_arg, s->buf);
        else
            free(s->buf);
    }
    for (uint32_t i = 0; i < r->npool; i++)
        free(r->pool[i].buf);
    free(r->pool);
    free(r->slots);
    ts_reader_index_free(r);
    tessera_dataset_records_free(r->recs);
    tessera_plan_free(r->plan);
    free(r->copt_strings);
    pthread_cond_destroy(&r->ready);
    pthread_cond_destroy(&r->space);
    pthread_cond_destroy(&r->hint_cv);
    pthread_mutex_destroy(&r->m);
    free(r);
}
