/*
 * The plan reader's connections: one thread per connection (a libtessera handle of its own,
 * a router on a cluster). Each thread takes the next plan position while the window has room,
 * finds where the unit lies (its shard, or its record through the record index), waits until
 * the byte window admits it (the unit the caller waits for always is), and submits its reads
 * (pieces of at most TESSERA_MAX_READ) straight into the unit's buffer, keeping up to `depth`
 * reads in flight. A failed piece is sent again (over a new connection when the old one broke)
 * up to `retries` times per unit; then the unit fails, naming its dataset, shard and record.
 */
#include "reader_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BACKOFF_MS 50 /* before a piece is sent again over a new connection, doubling */

/* A read of part of a unit. */
struct piece {
    uint64_t op;
    uint64_t k;
    uint64_t off;
    size_t len;
    uint8_t *dst;
};

/*
 * Small units are read many to a request (READV): the units admitted in a burst are gathered
 * per lane (the node that serves them first), and a lane's READV leaves when it is full or the
 * thread is about to wait. A range that fails is read again on its own (a READ, which fails
 * over to another replica and reports the final error), without using up an attempt.
 */
#define RV_UNIT_MAX (32u << 10) /* units up to this size go by READV */
#define RV_RANGES 64            /* ranges per READV */
#define RV_LANES 8              /* READVs being gathered at once */

struct rvb {
    struct rvb *next; /* on the worker's dead list */
    size_t lane;
    uint64_t op;
    size_t n, bytes;
    uint64_t k[RV_RANGES]; /* the units */
    struct ts_readv v[RV_RANGES];
};

struct ts_worker {
    struct tessera_reader *r;
    tessera_client *c;
    int readv; /* small units go by READV */
    struct rvb *gather[RV_LANES];
    size_t ngather;   /* ranges gathered, not sent */
    struct rvb **rvs; /* READVs in flight */
    size_t nrvs, caprvs;
    size_t rv_ranges; /* their ranges */
    struct rvb *dead; /* READVs given up on that the handle may still answer: freed with it */
    pthread_t th;
    int started;
    struct piece *inf; /* in flight */
    size_t ninf, capinf;
    struct piece *redo; /* to send again */
    size_t nredo, capredo;
    int has_pend; /* a unit claimed and placed, waiting for the byte window */
    int filling;  /* claiming a burst of units: their reads leave in one send */
    uint64_t pend_k;
    uint64_t resubmits_seen; /* of the handle's router */
    int wake_due;            /* the caller waits for a unit this thread finished */
    uint32_t since_due;      /* reads collected since then */
};

/* Reads collected after the caller's unit before it is woken anyway. */
#define WAKE_AFTER 16

/* ---- bookkeeping under the lock ------------------------------------------------------------ */

static int retryable(int rc)
{
    switch (rc) {
    case TS_ECONNRESET:
    case TS_ECONNREFUSED:
    case TS_ETIMEDOUT:
    case TS_ECORRUPT:
    case TS_EUNAVAIL:
    case TS_EBUSY:
    case TS_ESTALE:
    case TS_EIO:
    case TS_ESHUTDOWN:
    case TS_EPROTO:
    case TS_ETLS:
        return 1;
    default:
        return 0;
    }
}

/* Unit k failed for good (lock held): the caller gets rc and what says which unit it was. */
static void slot_fail(struct tessera_reader *r, struct slot *s, int rc, const char *why)
{
    if (s->state == SLOT_FAILED)
        return;
    s->state = SLOT_FAILED;
    s->rc = rc;
    if (r->o.unit == TESSERA_UNIT_RECORD)
        snprintf(s->msg, sizeof(s->msg), "%s shard %u record %llu (unit %llu): %s: %s", r->dataset,
                 s->shard, (unsigned long long)s->record, (unsigned long long)s->unit,
                 ts_errname(rc), why && why[0] ? why : ts_strerror(rc));
    else
        snprintf(s->msg, sizeof(s->msg), "%s shard %u (unit %llu): %s: %s", r->dataset, s->shard,
                 (unsigned long long)s->unit, ts_errname(rc),
                 why && why[0] ? why : ts_strerror(rc));
    if (s->k < r->fail_k)
        r->fail_k = s->k;
    ts_reader_wake_caller(r, s);
}

/*
 * Wakes the caller for the unit it waits for (lock held). Not at once when this thread
 * finishes it: the replies already received are collected first and the caller is woken
 * when the thread is about to sleep (the connection's on_block hook), or
 * WAKE_AFTER reads later. One wake-up then hands over a run of units; waking the caller per
 * reply costs two context switches per unit where both threads share a core.
 */
static void wake_flush_locked(struct ts_worker *w)
{
    struct slot *s = ts_reader_slot(w->r, w->r->consumed);

    if (w->wake_due && s->state == SLOT_DONE)
        ts_reader_wake_caller(w->r, s);
    w->wake_due = 0;
    w->since_due = 0;
}

static void wake_flush(struct ts_worker *w)
{
    if (!w->wake_due) /* set and cleared by this thread only */
        return;
    pthread_mutex_lock(&w->r->m);
    wake_flush_locked(w);
    pthread_mutex_unlock(&w->r->m);
}

/*
 * The connection is about to sleep (its on_block hook): the caller is woken if due, and the
 * connection may sleep until half the bytes the caller has in hand arrive (done units from the
 * one it takes next on), received then in one go. A thread woken per socket segment costs two
 * context switches each time where it shares a core with a busy caller; a caller that has
 * units to take does not wait for the next ones, and one that waits (or is about to, its next
 * unit not done) lets the connection wake at the first byte.
 */
static size_t on_block(void *arg)
{
    struct ts_worker *w = arg;
    struct tessera_reader *r = w->r;
    const struct slot *s;
    size_t want = 0;

    pthread_mutex_lock(&r->m);
    if (w->wake_due)
        wake_flush_locked(w);
    s = ts_reader_slot(r, r->consumed);
    if (r->rx_batch && !r->caller_waits && s->k == r->consumed && s->state == SLOT_DONE)
        want = (size_t)(r->done_ahead / 2 / r->nworkers); /* shared by the connections */
    pthread_mutex_unlock(&r->m);
    return want;
}

static void batch_on(struct ts_worker *w)
{
    struct ts_batch b = {1, on_block, w};

    ts_client_batch(w->c, &b);
}

static int push(struct piece **v, size_t *n, size_t *cap, const struct piece *p)
{
    struct piece *g = ts_grow(*v, *n, cap, sizeof(**v), 16);

    if (!g)
        return TS_ENOMEM;
    *v = g;
    g[(*n)++] = *p;
    return 0;
}

/* What the router resubmitted since we last looked counts as retries (lock held). */
static void note_resubmits(struct ts_worker *w)
{
    uint64_t n = ts_client_resubmits(w->c);

    if (n > w->resubmits_seen)
        w->r->st.retries += n - w->resubmits_seen;
    w->resubmits_seen = n;
}

/* ---- placing a unit -------------------------------------------------------------------------- */

/* Where this reader's unit s->k lies (unlocked: the slot is this thread's while CLAIMED). */
static int place(struct ts_worker *w, struct slot *s)
{
    struct ts_unit_loc l;
    int rc = ts_reader_locate(w->r, w->c, s->k, &l, s->msg, sizeof(s->msg));

    if (rc)
        return rc;
    s->unit = l.unit;
    s->shard = l.shard;
    s->record = l.record;
    s->offset = l.offset;
    s->len = l.len;
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

static void piece_failed(struct ts_worker *w, const struct piece *p, int rc, const char *why);
static int readv_add(struct ts_worker *w, struct slot *s, uint8_t *buf);

static void piece_send(struct ts_worker *w, struct piece *p)
{
    struct tessera_reader *r = w->r;
    uint32_t shard = ts_reader_slot(r, p->k)->shard; /* fixed while the slot is READING */
    int rc;

    rc = tessera_read_submit(w->c, r->dataset, shard, p->off, p->len, p->dst, &p->op);
    if (!rc)
        rc = push(&w->inf, &w->ninf, &w->capinf, p);
    if (rc)
        piece_failed(w, p, rc, tessera_client_error(w->c));
}

/* Unit k was admitted: its buffer, then its pieces on their way (unlocked). */
static void unit_start(struct ts_worker *w, uint64_t k)
{
    struct tessera_reader *r = w->r;
    struct slot *s = ts_reader_slot(r, k);
    size_t npieces = s->len ? (s->len - 1) / TESSERA_MAX_READ + 1 : 0;
    uint8_t *buf;
    size_t cap = 0;

    if (r->o.alloc) {
        wake_flush(w); /* the caller's allocator may wait for the caller */
        buf = r->o.alloc(r->o.alloc_arg, s->len);
        pthread_mutex_lock(&r->m);
    } else {
        pthread_mutex_lock(&r->m);
        buf = ts_reader_buf_get(r, s->len, &cap);
    }
    s->buf = buf;
    s->cap = cap;
    s->pieces_left = (uint32_t)npieces;
    if (!buf)
        slot_fail(r, s, TS_ENOMEM, "no buffer for it");
    else if (npieces == 0) {
        s->state = SLOT_DONE;
        ts_reader_wake_caller(r, s);
    }
    pthread_mutex_unlock(&r->m);
    if (!buf)
        return;
    if (w->readv && npieces == 1 && s->len <= RV_UNIT_MAX && readv_add(w, s, buf) == 0)
        return;
    for (size_t i = 0; i < npieces; i++) {
        struct piece p = {0};
        p.k = k;
        p.off = s->offset + i * (uint64_t)TESSERA_MAX_READ;
        p.len = TS_MIN(s->len - i * (size_t)TESSERA_MAX_READ, (size_t)TESSERA_MAX_READ);
        p.dst = buf + i * (size_t)TESSERA_MAX_READ;
        piece_send(w, &p);
    }
}

/* Piece p failed with rc (unlocked): sent again while its unit has attempts left. */
static void piece_failed(struct ts_worker *w, const struct piece *p, int rc, const char *why)
{
    struct tessera_reader *r = w->r;
    struct slot *s = ts_reader_slot(r, p->k);

    pthread_mutex_lock(&r->m);
    note_resubmits(w);
    if (s->state == SLOT_READING && retryable(rc) && s->attempts < r->o.retries && !r->stop &&
        push(&w->redo, &w->nredo, &w->capredo, p) == 0) {
        s->attempts++;
        r->st.retries++;
    } else {
        slot_fail(r, s, rc, why);
    }
    pthread_mutex_unlock(&r->m);
}

/* Piece p of unit k came back whole (lock held). */
static void piece_done_locked(struct ts_worker *w, uint64_t k)
{
    struct tessera_reader *r = w->r;
    struct slot *s = ts_reader_slot(r, k);

    if (s->state == SLOT_READING) {
        const char *node = ts_client_served(w->c); /* a copy per reply: no printf here */
        size_t n = strnlen(node, sizeof(s->node) - 1);
        memcpy(s->node, node, n);
        s->node[n] = '\0';
        if (--s->pieces_left == 0) {
            s->state = SLOT_DONE;
            r->done_ahead += s->len;
            if (r->caller_waits && s->k == r->consumed)
                w->wake_due = 1;
        }
    }
    if (w->wake_due && ++w->since_due >= WAKE_AFTER)
        wake_flush_locked(w);
}

/* A range of a READV that failed (or whose READV did): read again on its own (unlocked). */
static void range_redo(struct ts_worker *w, const struct rvb *b, size_t i, int rc)
{
    struct tessera_reader *r = w->r;
    struct slot *s = ts_reader_slot(r, b->k[i]);
    struct piece p = {0, b->k[i], b->v[i].off, b->v[i].len, b->v[i].dst};

    pthread_mutex_lock(&r->m);
    if (s->state == SLOT_READING && !r->stop && push(&w->redo, &w->nredo, &w->capredo, &p) == 0)
        r->st.retries++;
    else
        slot_fail(r, s, rc, "READV failed and the range could not be read again");
    pthread_mutex_unlock(&r->m);
}

static void rvb_free_dead(struct ts_worker *w)
{
    while (w->dead) {
        struct rvb *b = w->dead;
        w->dead = b->next;
        free(b);
    }
}

/* A collected READV (rc: its own outcome): its units done or read again one by one. With
 * live set the handle may still answer it (it gave up without naming it): b is kept, for the
 * reply to land in, until the handle is closed. */
static void readv_settle(struct ts_worker *w, size_t at, int rc, int live)
{
    struct tessera_reader *r = w->r;
    struct rvb *b = w->rvs[at];

    w->rvs[at] = w->rvs[--w->nrvs];
    w->rv_ranges -= b->n;
    if (rc == TS_ENOTSUP)
        w->readv = 0; /* a node without READV: single reads from now on */
    pthread_mutex_lock(&r->m);
    note_resubmits(w);
    for (size_t i = 0; i < b->n; i++)
        if (!rc && b->v[i].rc == 0 && b->v[i].got == b->v[i].len)
            piece_done_locked(w, b->k[i]);
    pthread_mutex_unlock(&r->m);
    for (size_t i = 0; i < b->n; i++)
        if (rc || b->v[i].rc != 0 || b->v[i].got != b->v[i].len)
            range_redo(w, b, i, rc ? rc : b->v[i].rc ? b->v[i].rc : TS_EPROTO);
    if (live) {
        b->next = w->dead;
        w->dead = b;
    } else {
        free(b);
    }
}

/* Sends gathered READV b (unlocked). */
static void readv_send(struct ts_worker *w, struct rvb *b)
{
    struct rvb **v;
    int rc;

    w->ngather -= b->n;
    v = ts_grow(w->rvs, w->nrvs, &w->caprvs, sizeof(*v), 8);
    if (!v) {
        rc = TS_ENOMEM;
    } else {
        w->rvs = v;
        rc = ts_client_readv_submit(w->c, w->r->dataset, b->v, b->n, &b->op);
    }
    if (!rc) {
        w->rvs[w->nrvs++] = b;
        w->rv_ranges += b->n;
        return;
    }
    for (size_t i = 0; i < b->n; i++)
        range_redo(w, b, i, rc);
    free(b);
}

/* Sends every READV being gathered (unlocked). */
static void readv_flush(struct ts_worker *w)
{
    for (size_t i = 0; i < RV_LANES; i++) {
        struct rvb *b = w->gather[i];
        w->gather[i] = NULL;
        if (b)
            readv_send(w, b);
    }
}

/* Adds admitted unit s (one piece, small) to its lane's READV; 0, or -1 to read it alone. */
static int readv_add(struct ts_worker *w, struct slot *s, uint8_t *buf)
{
    size_t lane = ts_client_read_lane(w->c, w->r->dataset, s->shard, s->offset), at = RV_LANES;
    struct rvb *b;

    if (lane == SIZE_MAX)
        return -1; /* the single read finds out why */
    for (size_t i = 0; i < RV_LANES; i++) {
        if (w->gather[i] && w->gather[i]->lane == lane) {
            at = i;
            break;
        }
        if (!w->gather[i] && at == RV_LANES)
            at = i;
    }
    if (at == RV_LANES) { /* more lanes than slots: the first one leaves now */
        at = 0;
        readv_send(w, w->gather[0]);
        w->gather[0] = NULL;
    }
    b = w->gather[at];
    if (b && b->bytes + s->len > TS_READV_BYTES) {
        readv_send(w, b);
        b = w->gather[at] = NULL;
    }
    if (!b) {
        b = malloc(sizeof(*b));
        if (!b)
            return -1;
        b->lane = lane;
        b->n = b->bytes = 0;
        w->gather[at] = b;
    }
    b->k[b->n] = s->k;
    b->v[b->n] = (struct ts_readv){s->shard, s->offset, s->len, buf, 0, 0};
    b->n++;
    b->bytes += s->len;
    w->ngather++;
    if (b->n == RV_RANGES) {
        w->gather[at] = NULL;
        readv_send(w, b);
    }
    return 0;
}

/* Collects one finished read of the connection (unlocked). */
static void collect(struct ts_worker *w)
{
    struct tessera_reader *r = w->r;
    struct piece p;
    uint64_t op = 0;
    size_t got = 0, i;
    char why[512];
    int rc;

    rc = tessera_wait_any(w->c, &op, &got);
    for (i = 0; i < w->ninf && w->inf[i].op != op; i++)
        ;
    if (i == w->ninf) {
        for (size_t j = 0; op && j < w->nrvs; j++)
            if (w->rvs[j]->op == op) {
                readv_settle(w, j, rc, 0);
                return;
            }
        /* Nothing the connection knows of: every read in flight failed. */
        snprintf(why, sizeof(why), "%s", tessera_client_error(w->c));
        while (w->ninf) {
            p = w->inf[--w->ninf];
            piece_failed(w, &p, rc ? rc : TS_EINTERNAL, why);
        }
        while (w->nrvs)
            readv_settle(w, w->nrvs - 1, rc ? rc : TS_EINTERNAL, !ts_conn_broken(w->c));
        return;
    }
    p = w->inf[i];
    w->inf[i] = w->inf[--w->ninf];
    if (!rc && got != p.len) {
        snprintf(why, sizeof(why), "%zu bytes came back of the %zu at offset %llu", got, p.len,
                 (unsigned long long)p.off);
        rc = TS_EPROTO;
    } else if (rc) {
        snprintf(why, sizeof(why), "%s", tessera_client_error(w->c));
    }
    if (rc) {
        piece_failed(w, &p, rc, why);
        return;
    }
    pthread_mutex_lock(&r->m);
    note_resubmits(w);
    piece_done_locked(w, p.k);
    pthread_mutex_unlock(&r->m);
}

/* Sends the pieces waiting to go again (unlocked); a new connection first if this one broke. */
static void redo(struct ts_worker *w)
{
    struct tessera_reader *r = w->r;
    struct piece *v = w->redo;
    size_t n = w->nredo;
    char err[512] = "";
    int rc = 0;

    wake_flush(w);
    if (ts_conn_broken(w->c)) {
        uint32_t a = ts_reader_slot(r, v[0].k)->attempts;
        struct timespec ts = {0, (long)BACKOFF_MS * 1000000L << TS_MIN(a, 4u)};
        tessera_client *c = NULL;

        nanosleep(&ts, NULL);
        rc = ts_client_open_ex(&c, &r->copts, err, sizeof(err));
        if (!rc) {
            tessera_client_close(w->c);
            rvb_free_dead(w);
            w->c = c;
            batch_on(w);
            w->resubmits_seen = 0;
            pthread_mutex_lock(&r->m);
            r->st.reconnects++;
            pthread_mutex_unlock(&r->m);
        }
    }
    w->redo = NULL;
    w->nredo = w->capredo = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc)
            piece_failed(w, &v[i], rc, err);
        else
            piece_send(w, &v[i]);
    }
    free(v);
}

/* ---- the thread ------------------------------------------------------------------------------ */

/*
 * The window has room for the next plan position (lock held). A connection claims in bursts:
 * once half its reads are back and half the window (units and bytes) is free, it claims until
 * `depth` are in flight or the window is full again, and the burst's reads leave together with
 * its next wait (ts_client_batch): one send, or one READV per node, for many. Refilling by
 * what the caller took would send a request for every few units it takes.
 */
static int may_claim(const struct tessera_reader *r, const struct ts_worker *w)
{
    size_t n = w->ninf + w->rv_ranges + w->ngather;
    uint64_t ahead = r->next_claim - r->consumed;

    return !w->has_pend && n < r->o.depth && ahead < r->o.window_units && r->next_claim < r->len &&
           r->next_claim < r->fail_k &&
           (w->filling || (n <= r->o.depth / 2 && ts_reader_half_free(r)));
}

/* Slot s starts over for unit k (lock held). Field by field: clearing its messages would
 * write ten cache lines per unit where the rest fits in two. */
static void slot_reset(struct slot *s, uint64_t k)
{
    s->state = SLOT_CLAIMED;
    s->k = k;
    s->unit = s->record = s->offset = 0;
    s->shard = 0;
    s->len = s->cap = 0;
    s->buf = NULL;
    s->pieces_left = s->attempts = 0;
    s->rc = 0;
    s->msg[0] = s->node[0] = '\0';
}

static void *worker_main(void *arg)
{
    struct ts_worker *w = arg;
    struct tessera_reader *r = w->r;

    pthread_setname_np(pthread_self(), "tessera-reader"); /* in top -H, perf, gdb */
    pthread_mutex_lock(&r->m);
    while (!r->stop) {
        struct slot *s;
        if (w->nredo && !(ts_conn_broken(w->c) && (w->ninf || w->nrvs))) {
            pthread_mutex_unlock(&r->m);
            redo(w);
        } else if (w->has_pend &&
                   ts_reader_admits(r, w->pend_k, ts_reader_slot(r, w->pend_k)->len)) {
            s = ts_reader_slot(r, w->pend_k);
            s->state = SLOT_READING;
            r->next_admit++;
            ts_reader_wake_threads(r); /* the next one may be another thread's */
            r->ahead += s->len;
            if (r->ahead > r->st.ahead_bytes_max)
                r->st.ahead_bytes_max = r->ahead;
            w->has_pend = 0;
            r->npend--;
            pthread_mutex_unlock(&r->m);
            unit_start(w, s->k);
        } else if (may_claim(r, w)) {
            uint64_t k = r->next_claim++;
            if (r->hint_waits && r->next_claim >= r->hint_wake_at)
                pthread_cond_signal(&r->hint_cv); /* the hint thread: hint further */
            w->filling = 1;
            s = ts_reader_slot(r, k);
            slot_reset(s, k);
            pthread_mutex_unlock(&r->m);
            int rc = place(w, s);
            pthread_mutex_lock(&r->m);
            if (rc) {
                char why[sizeof(s->msg)];
                snprintf(why, sizeof(why), "%s", s->msg);
                slot_fail(r, s, rc, why);
            } else {
                s->state = SLOT_WAITING;
                w->has_pend = 1;
                r->npend++;
                w->pend_k = k;
            }
            continue;
        } else if (w->ngather) { /* about to wait: the gathered READVs leave first */
            pthread_mutex_unlock(&r->m);
            readv_flush(w);
        } else if (w->ninf || w->nrvs) {
            w->filling = 0;
            pthread_mutex_unlock(&r->m);
            collect(w);
        } else {
            wake_flush_locked(w);
            w->filling = 0; /* the burst is over: the next waits for half the window */
            r->idle++;
            pthread_cond_wait(&r->space, &r->m);
            r->idle--;
            continue;
        }
        pthread_mutex_lock(&r->m);
    }
    wake_flush_locked(w);
    pthread_mutex_unlock(&r->m);
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------ */

void ts_reader_count_node(struct tessera_reader *r, const char *node, size_t len)
{
    struct tessera_reader_stats *st = &r->st;
    size_t i;

    for (i = 0; i < st->nnodes && strcmp(st->nodes[i].node, node) != 0; i++)
        ;
    if (i == st->nnodes) {
        if (st->nnodes == TESSERA_READER_MAX_NODES)
            return;
        snprintf(st->nodes[i].node, sizeof(st->nodes[i].node), "%s", node);
        st->nnodes++;
    }
    st->nodes[i].units++;
    st->nodes[i].bytes += len;
}

int ts_reader_workers_start(struct tessera_reader *r, tessera_client *first, char *err,
                            size_t errlen)
{
    const char *e;
    int rc = 0;

    r->workers = calloc(r->o.connections, sizeof(*r->workers));
    if (!r->workers) {
        tessera_client_close(first);
        return TS_ENOMEM;
    }
    r->nworkers = r->o.connections;
    for (uint32_t i = 0; i < r->nworkers; i++) {
        struct ts_worker *w = &r->workers[i];
        w->r = r;
        if (i == 0)
            w->c = first;
        else if (!rc)
            rc = ts_client_open_ex(&w->c, &r->copts, err, errlen);
    }
    for (uint32_t i = 0; i < r->nworkers && !rc; i++)
        ts_client_route_salt(r->workers[i].c, TS_READER_SALT);
    e = getenv("TESSERA_READER_RX_BATCH"); /* "0": wake at every reply's first bytes (A/B) */
    r->rx_batch = !(e && !strcmp(e, "0"));
    for (uint32_t i = 0; i < r->nworkers && !rc; i++) {
        e = getenv("TESSERA_READER_READV"); /* "0": one READ per unit (A/B runs) */
        r->workers[i].readv = ts_client_readv_useful(r->workers[i].c) && !(e && !strcmp(e, "0"));
        batch_on(&r->workers[i]);
        if (pthread_create(&r->workers[i].th, NULL, worker_main, &r->workers[i]) != 0) {
            if (err && errlen)
                snprintf(err, errlen, "cannot start a reader thread");
            rc = TS_ENOMEM;
            break;
        }
        r->workers[i].started = 1;
    }
    return rc;
}

void ts_reader_workers_stop(struct tessera_reader *r)
{
    for (uint32_t i = 0; i < r->nworkers; i++) {
        struct ts_worker *w = &r->workers[i];
        if (w->started)
            pthread_join(w->th, NULL);
        /* Reads still in flight are abandoned with the connection, before their buffers go. */
        tessera_client_close(w->c);
        free(w->inf);
        free(w->redo);
        for (size_t j = 0; j < w->nrvs; j++)
            free(w->rvs[j]);
        rvb_free_dead(w);
        free(w->rvs);
        for (size_t j = 0; j < RV_LANES; j++)
            free(w->gather[j]);
    }
    free(r->workers);
    r->workers = NULL;
    r->nworkers = 0;
}
