/*
 * libtessera, the connection layer: what every call of a connection starts from: its messages
 * (set, a malformed reply, the map a TS_ESTALE reply carries), the argument checks at entry
 * (also used by the public calls in api.c before they go to the router), and the request
 * records (new, looked up by id, freed, finished).
 */
#include "conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ts_map.h"

#define FAC "client"

/* ---- small helpers ----------------------------------------------------------------------------
 */

void ts_conn_set_error(tessera_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* A malformed reply: the call fails with TS_EPROTO and says why. */
int ts_proto_err(struct tessera_client *c, const char *what)
{
    ts_conn_set_error(c, "malformed reply from the server: %s", what);
    TS_WARN(FAC, TS_EPROTO, "malformed reply: %s", what);
    return TS_EPROTO;
}

/*
 * A refusal with status rc was decoded from r (left after the message): a TS_ESTALE reply
 * carries the node's map there; keep the newest for the router (ts_conn_take_stale_map).
 */
void ts_note_stale(struct tessera_client *c, struct ts_rd *r, int rc)
{
    struct ts_map *m = NULL;

    if (rc != TS_ESTALE || r->err || r->off >= r->len)
        return;
    if (ts_map_decode(r, &m) != 0) {
        TS_WARN(FAC, TS_EPROTO, "a TS_ESTALE reply from %s carries a malformed map", c->node);
        return;
    }
    if (c->stale_map && c->stale_map->epoch >= m->epoch) {
        ts_map_free(m);
        return;
    }
    ts_map_free(c->stale_map);
    c->stale_map = m;
    if (m->epoch > c->seen_epoch)
        c->seen_epoch = m->epoch;
}

/* Checks common to every call: a usable handle, a clean message slot. */
int ts_enter(tessera_client *c)
{
    if (!c)
        return TS_EINVAL;
    c->err[0] = '\0';
    return c->broken ? TS_ECONNRESET : 0;
}

int ts_name_check(tessera_client *c, const char *name)
{
    if (!ts_name_valid_store(name)) { /* a dataset, or a fragment store NAME#f: the node judges */
        ts_conn_set_error(c, "'%s' is not a valid dataset name", name ? name : "(null)");
        return TS_ENAME;
    }
    return 0;
}

/* ts_enter() for a call on a dataset: a valid name too. */
int ts_enter_name(tessera_client *c, const char *name)
{
    int rc = ts_enter(c);

    return rc ? rc : ts_name_check(c, name);
}

int ts_enter_out_name(tessera_client *c, int have_out, const char *name)
{
    int rc = ts_enter(c);

    if (rc)
        return rc;
    return have_out ? ts_name_check(c, name) : TS_EINVAL;
}

/* ts_enter() for the calls that only a connection takes: never a handle with no connection
 * of its own (a router's). */
int ts_enter_conn(tessera_client *c)
{
    int rc = ts_enter(c);

    if (rc)
        return rc;
    return c->t ? 0 : TS_EINVAL;
}

void *ts_grow(void *v, size_t n, size_t *cap, size_t size, size_t first)
{
    size_t ncap;

    if (n < *cap)
        return v;
    ncap = *cap ? *cap * 2 : first;
    v = realloc(v, ncap * size);
    if (v)
        *cap = ncap;
    return v;
}

/* ---- request bookkeeping -------------------------------------------------------------------- */

struct ts_req *ts_req_new(struct tessera_client *c, uint8_t op)
{
    struct ts_req *r = c->free_reqs;
    struct ts_wr w;

    if (r) {
        c->free_reqs = r->next_tx;
        w = r->w;
    } else {
        r = malloc(sizeof(*r));
        if (!r)
            return NULL;
        ts_wr_init(&w);
    }
    memset(r, 0, sizeof(*r));
    r->w = w;
    r->w.err = 0;
    r->op = op;
    ts_wr_begin_frame(&r->w);
    return r;
}

/* A new request whose body starts with the dataset name. */
struct ts_req *ts_req_name(struct tessera_client *c, uint8_t op, const char *name)
{
    struct ts_req *r = ts_req_new(c, op);

    if (r)
        ts_wr_str(&r->w, name);
    return r;
}

size_t ts_live_find(const struct tessera_client *c, uint64_t id)
{
    size_t lo = 0, hi = c->nlive;

    while (lo < hi) { /* ids only grow: live[] is sorted */
        size_t mid = lo + (hi - lo) / 2;
        if (c->live[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->nlive && c->live[lo]->id == id ? lo : SIZE_MAX;
}

void ts_req_free(struct tessera_client *c, struct ts_req *r)
{
    size_t i;

    if (!r)
        return;
    if (r->queued) {
        i = ts_live_find(c, r->id);
        if (i != SIZE_MAX) {
            memmove(&c->live[i], &c->live[i + 1], (c->nlive - i - 1) * sizeof(c->live[0]));
            c->nlive--;
        }
    }
    free(r->reply);
    free(r->msg);
    r->reply = NULL;
    r->msg = NULL;
    r->next_tx = c->free_reqs;
    c->free_reqs = r;
}

void ts_req_destroy(struct ts_req *r)
{
    free(r->reply);
    free(r->msg);
    ts_wr_fini(&r->w);
    free(r);
}

/* Sent and answered: the request is the caller's again. */
void ts_req_finish(struct tessera_client *c, struct ts_req *r)
{
    if (r->done || !r->sent || !r->replied)
        return;
    r->done = 1;
    r->seq = ++c->done_seq;
    c->inflight--;
}
