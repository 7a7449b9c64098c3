/* tesserad request handlers: one per opcode, each sending exactly one reply. */
#include "ops_internal.h"
#include "prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SCRUB_REPORT 1000
#define MAX_UPLOADS_PER_CONN 64
#define MAX_UPLOADS_PER_NODE_CONN 4096 /* a peer node replicates many clients' uploads */

void ops_reply_ok(struct tsd_conn *c, const struct ts_frame_hdr *h)
{
    struct ts_wr w;
    tsd_reply_begin(&w);
    tsd_reply_send(c, h, &w);
}

void ops_reply_store_error(struct tsd_conn *c, const struct ts_frame_hdr *h, int rc,
                           const char *name, long shard)
{
    const char *what = ts_op_desc(h->opcode)->name;
    struct ts_dataset_info d;

    /* Say which is missing: the dataset or the shard. */
    if (rc == TS_ENOENT && name[0] && name[0] != '(') {
        if (ts_store_dataset_get(c->w->srv->store, name, &d) == TS_ENOENT)
            tsd_reply_error(c, h, rc, "%s: no dataset named '%s'", what, name);
        else if (shard >= 0)
            tsd_reply_error(c, h, rc, "%s: dataset '%s' has no shard %ld%s", what, name, shard,
                            atomic_load(&c->w->srv->epoch) ? " on this node" : "");
        else
            tsd_reply_error(c, h, rc, "%s %s: %s", what, name, ts_strerror(rc));
        return;
    }
    if (shard >= 0)
        tsd_reply_error(c, h, rc, "%s %s/%ld: %s", what, name, shard, ts_strerror(rc));
    else
        tsd_reply_error(c, h, rc, "%s %s: %s", what, name, ts_strerror(rc));
}

/* ---- HELLO ------------------------------------------------------------------------------ */

static void op_hello(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    struct ts_wr w;
    uint16_t ver = q->u.hello.version;
    const char *name = q->u.hello.name;

    snprintf(c->client_name, sizeof(c->client_name), "%.63s", name); /* kept short */
    if (c->role == TS_ROLE_NODE && (strncmp(name, "node:", 5) || strcmp(name + 5, c->node_id))) {
        tsd_reply_error(c, h, TS_EPERM,
                        "HELLO as '%.64s' refused: this connection's certificate is node '%s'",
                        name, c->node_id);
        return;
    }
    if (ver != TS_PROTO_VERSION) {
        tsd_reply_error(c, h, TS_ENOTSUP, "protocol version %u not supported (server speaks %d)",
                        ver, TS_PROTO_VERSION);
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, s->cfg->node_id);
    ts_wr_u8(&w, (uint8_t)tsd_conn_role(s, c));
    ts_wr_u32(&w, TS_MAX_CHUNK + 4096);
    ts_wr_u64(&w, s->epoch);
    tsd_reply_send(c, h, &w);
}

/* ---- datasets --------------------------------------------------------------------------- */

static void op_dataset_create(struct tsd_conn *c, const struct ts_frame_hdr *h,
                              const struct tsd_req *q)
{
    const char *name = q->u.dataset_create.name;
    struct ts_dataset_policy p = q->u.dataset_create.policy;
    uint64_t inc = q->u.dataset_create.inc; /* a cluster client's: the same on every node */
    struct tsd_server *s = c->w->srv;
    size_t nodes = TS_REPL_MAX_REPLICAS; /* a single node keeps one copy, whatever the policy */
    int rc;

    /* Policies the cluster cannot honour are refused before anything is created (issue 28):
     * no core replica, more replicas than placement orders (TS_REPL_MAX_REPLICAS), or than
     * the map has nodes. */
    pthread_rwlock_rdlock(&s->map_lock);
    if (s->map)
        nodes = s->map->n;
    pthread_rwlock_unlock(&s->map_lock);
    if (p.core == 0 || (unsigned)p.core + p.fringe > TS_REPL_MAX_REPLICAS ||
        (unsigned)p.core + p.fringe > nodes) {
        char most[64] = "";
        if (nodes < TS_REPL_MAX_REPLICAS)
            snprintf(most, sizeof(most), ", and no more than the map's %zu nodes", nodes);
        tsd_reply_error(c, h, TS_EINVAL,
                        "dataset-create %s: invalid policy: core %u + fringe %u%s (a dataset "
                        "needs at least one core replica, at most %u replicas in all%s)",
                        name, p.core, p.fringe, p.core == 0 ? ": no core replica" : "",
                        (unsigned)TS_REPL_MAX_REPLICAS, most);
        return;
    }
    if (p.record_format > TS_RECORD_FORMAT_MAX) {
        tsd_reply_error(c, h, TS_EINVAL, "dataset-create %s: unknown record format %u", name,
                        p.record_format);
        return;
    }
    if (p.min_core == 0)
        p.min_core = (uint8_t)(p.core / 2 + 1); /* default: a majority of the core replicas */
    rc = ts_store_dataset_create_inc(c->w->srv->store, name, &p, inc);
    if (rc == TS_EINVAL)
        tsd_reply_error(c, h, rc,
                        "dataset-create %s: invalid policy (chunk size %u must be %u..%u; "
                        "1 <= min_core %u <= core %u)",
                        name, p.chunk_size ? p.chunk_size : TS_DEFAULT_CHUNK_SIZE,
                        TS_MIN_CHUNK_SIZE, (unsigned)c->w->srv->cfg->max_chunk_mb << 20, p.min_core,
                        p.core);
    else if (rc)
        ops_reply_store_error(c, h, rc, name, -1);
    else
        ops_reply_ok(c, h);
}

static int list_cb(void *arg, const struct ts_dataset_info *d)
{
    struct ts_wr *w = arg;
    ts_wr_dataset_info(w, d);
    return 0;
}

static int count_cb(void *arg, const struct ts_dataset_info *d)
{
    (*(uint32_t *)arg)++;
    return 0;
}

static void op_dataset_list(struct tsd_conn *c, const struct ts_frame_hdr *h,
                            const struct tsd_req *q)
{
    struct ts_wr w;
    uint32_t n = 0;
    size_t at;
    int rc;

    tsd_reply_begin(&w);
    at = w.len;
    ts_wr_u32(&w, 0);
    rc = ts_store_dataset_list(c->w->srv->store, list_cb, &w);
    if (rc == 0)
        rc = ts_store_dataset_list(c->w->srv->store, count_cb, &n);
    if (rc) {
        ts_wr_fini(&w);
        tsd_reply_error(c, h, rc, "dataset-list: %s", ts_strerror(rc));
        return;
    }
    if (!w.err)
        ts_put_le32(w.buf + at, n);
    tsd_reply_send(c, h, &w);
}

static void op_dataset_stat(struct tsd_conn *c, const struct ts_frame_hdr *h,
                            const struct tsd_req *q)
{
    const char *name = q->u.dataset_stat.name;
    struct ts_dataset_info d;
    struct ts_wr w;
    int rc;

    if (h->flags & TS_F_BRIEF)
        rc = ts_store_dataset_record(c->w->srv->store, name, &d);
    else
        rc = ts_store_dataset_stat(c->w->srv->store, name, &d);
    if (rc) {
        ops_reply_store_error(c, h, rc, name, -1);
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_dataset_info(&w, &d);
    tsd_reply_send(c, h, &w);
}

static void op_dataset_seal(struct tsd_conn *c, const struct ts_frame_hdr *h,
                            const struct tsd_req *q)
{
    const char *name = q->u.dataset_seal.name;
    uint8_t flags = q->u.dataset_seal.flags; /* optional: 0 when not sent */
    int rc;

    rc = ts_store_dataset_seal_ex(c->w->srv->store, name, flags & TS_SEAL_LOCAL_ONLY);
    if (rc == TS_EINCOMPLETE)
        tsd_reply_error(
            c, h, rc, "dataset-seal %s: shards must be 0..N-1, all complete, none uploading", name);
    else if (rc)
        ops_reply_store_error(c, h, rc, name, -1);
    else
        ops_reply_ok(c, h);
}

static void op_dataset_delete(struct tsd_conn *c, const struct ts_frame_hdr *h,
                              const struct tsd_req *q)
{
    const char *name = q->u.dataset_delete.name;
    struct ts_dataset_info d;
    int rc, have;

    have = ts_store_dataset_get(c->w->srv->store, name, &d) == 0;
    rc = ts_store_dataset_delete(c->w->srv->store, name);
    /* In a cluster the delete also goes into the log of every PG this node leads, so a
     * replica that was away applies it before it serves that PG again. */
    if (rc == 0 && have && c->w->srv->repl)
        ts_repl_log_delete(c->w->srv->repl, name, d.created_ns);
    if (rc == TS_EBUSY)
        tsd_reply_error(c, h, rc, "dataset-delete %s: an upload to it is in progress", name);
    else if (rc)
        ops_reply_store_error(c, h, rc, name, -1);
    else
        ops_reply_ok(c, h);
}

/* ---- uploads ---------------------------------------------------------------------------- */

struct tsd_upload *ops_upload_find(struct tsd_conn *c, const char *name, uint32_t shard)
{
    for (size_t i = 0; i < c->nuploads; i++)
        if (c->uploads[i].shard == shard && !strcmp(c->uploads[i].name, name))
            return &c->uploads[i];
    return NULL;
}

void ops_upload_remove(struct tsd_conn *c, struct tsd_upload *u)
{
    *u = c->uploads[--c->nuploads];
}

static int is_node(const struct tsd_conn *c)
{
    return c->role == TS_ROLE_NODE;
}

/* Ends an upload here and, where this node forwarded its chunks (a primary), on the replicas
 * too: their upload slots are not left to expire. u is invalid afterwards. */
static void upload_end(struct tsd_conn *c, struct tsd_upload *u, const char *why)
{
    if (u->to.n && c->w->srv->repl)
        ts_repl_abort_upload(c->w->srv->repl, u->name, u->shard, &u->to);
    TS_DEBUG(FAC, "%s: upload of %s/%u ended (%s)", c->peer, u->name, u->shard, why);
    ts_shard_writer_abort(u->w);
    ops_upload_remove(c, u);
}

void tsd_uploads_abort(struct tsd_conn *c)
{
    while (c->nuploads) {
        struct tsd_upload *u = &c->uploads[c->nuploads - 1];
        TS_INFO(FAC, "connection %s closed during upload of %s/%u: shard left incomplete", c->peer,
                u->name, u->shard);
        upload_end(c, u, "connection closed");
    }
}

/* A connection closes: its uploads end, its hints still queued are forgotten. */
static void conn_closing(struct tsd_conn *c)
{
    tsd_uploads_abort(c);
    tsd_prefetch_account_close(c->pf);
    c->pf = NULL;
}

void tsd_uploads_expire(struct tsd_conn *c, uint64_t before)
{
    for (size_t i = 0; i < c->nuploads;) {
        struct tsd_upload *u = &c->uploads[i];
        if (u->last_ns && u->last_ns < before) {
            TS_WARN(FAC, 0, "%s: upload of %s/%u idle too long: ended, shard left incomplete",
                    c->peer, u->name, u->shard);
            upload_end(c, u, "idle");
            continue; /* the last one moved into slot i */
        }
        i++;
    }
}

/*
 * Stores one chunk of an upload on this connection (chunk 0 starts it). Returns 0, or the
 * error after replying it. *u_out is the upload.
 */
int ops_local_write(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                    uint32_t shard, uint32_t idx, uint64_t size, uint32_t crc, uint32_t len,
                    const uint8_t *data, struct tsd_upload **u_out)
{
    struct tsd_server *s = c->w->srv;
    struct tsd_upload *u = ops_upload_find(c, name, shard);
    int rc;

    if (idx == 0) {
        ts_shard_writer *wr;
        if (u) { /* the sender restarts this upload */
            ts_shard_writer_abort(u->w);
            ops_upload_remove(c, u);
        }
        if (c->nuploads >= (is_node(c) ? MAX_UPLOADS_PER_NODE_CONN : MAX_UPLOADS_PER_CONN)) {
            tsd_reply_error(c, h, TS_EBUSY,
                            "shard-write %s/%u: %zu uploads already in progress on this connection",
                            name, shard, c->nuploads);
            return TS_EBUSY;
        }
        if (c->nuploads == c->capuploads) {
            size_t cap = c->capuploads ? 2 * c->capuploads : 4;
            struct tsd_upload *nu = realloc(c->uploads, cap * sizeof(*nu));
            if (!nu) {
                tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
                return TS_ENOMEM;
            }
            c->uploads = nu;
            c->capuploads = cap;
        }
        /* A PG primary's stream (REPL_WRITE, fenced by epoch already) takes over an upload of
         * the shard an older primary left open here; a client's waits (TS_EBUSY). */
        rc = ts_store_shard_begin_ex(s->store, name, shard, size, is_node(c), &wr);
        if (rc) {
            if (rc == TS_EEXIST)
                tsd_reply_error(c, h, rc, "shard-write %s/%u: shard already complete", name, shard);
            else if (rc == TS_EBUSY)
                tsd_reply_error(c, h, rc, "shard-write %s/%u: another upload of it is in progress",
                                name, shard);
            else if (rc == TS_ETOOBIG)
                tsd_reply_error(c, h, rc,
                                "shard-write %s/%u: a declared size of %llu bytes needs more than "
                                "2^30 chunks of the dataset's chunk size",
                                name, shard, (unsigned long long)size);
            else
                ops_reply_store_error(c, h, rc, name, shard);
            return rc;
        }
        u = &c->uploads[c->nuploads++];
        memset(u, 0, sizeof(*u));
        snprintf(u->name, sizeof(u->name), "%s", name);
        u->shard = shard;
        u->w = wr;
    } else if (!u) {
        tsd_reply_error(c, h, TS_EINVAL,
                        "shard-write %s/%u chunk %u: no upload of this shard in progress on this "
                        "connection (chunk 0 starts one)",
                        name, shard, idx);
        return TS_EINVAL;
    }
    /* An empty shard is uploaded as chunk 0 with no data: it only starts the upload. */
    u->last_ns = ts_now_mono_ns();
    rc = (idx == 0 && len == 0) ? 0 : ts_shard_writer_put(u->w, idx, data, len, crc);
    if (rc) {
        /* A failed chunk ends the upload: the shard stays incomplete and unlocked, and the
         * sender (or anyone) starts over with chunk 0. */
        upload_end(c, u, "a chunk failed");
        if (rc == TS_ECORRUPT)
            STAT_ADD(&c->w->stats, corrupt_chunks, 1);
        if (rc == TS_ENOSPC) {
            struct ts_store_space sp;
            ts_store_space(s->store, &sp);
            tsd_reply_error(
                c, h, rc,
                "shard-write %s/%u chunk %u (%u bytes): no space left on %s's data "
                "filesystem: %llu MiB free, %llu MiB kept in reserve "
                "(storage.reserve_mb) plus room to flush %llu MiB; nothing was "
                "written",
                name, shard, idx, len, s->cfg->node_id, (unsigned long long)(sp.avail >> 20),
                (unsigned long long)(sp.reserve >> 20), (unsigned long long)(sp.memtables >> 20));
            return rc;
        }
        tsd_reply_error(c, h, rc, "shard-write %s/%u chunk %u (%u bytes): %s%s", name, shard, idx,
                        len, ts_strerror(rc),
                        rc == TS_EINVAL ? " (chunks go in order, each the dataset's chunk size "
                                          "but the last)"
                                        : "");
        return rc;
    }
    if (len) {
        STAT_ADD(&c->w->stats, chunks_written, 1);
        if (c->role != TS_ROLE_NODE) /* a client's write (not a replica's copy) */
            tsd_m_written(c, name, len);
    }
    *u_out = u;
    return 0;
}

void ops_reply_write_ok(struct tsd_conn *c, const struct ts_frame_hdr *h, uint32_t idx,
                        uint64_t bytes)
{
    struct ts_wr w;
    tsd_reply_begin(&w);
    ts_wr_u32(&w, idx);
    ts_wr_u64(&w, bytes);
    tsd_reply_send(c, h, &w);
}

struct parked *ops_park(struct tsd_conn *c, const struct ts_frame_hdr *h, unsigned need,
                        unsigned targets)
{
    struct parked *pk = calloc(1, sizeof(*pk));

    if (!pk)
        return NULL;
    pk->c = c;
    pk->h = *h;
    pk->t0_ns = c->t0_ns;
    pk->targets = targets;
    pk->min_acks = need > 1 ? need - 1 : 0;
    c->refs++;
    c->parked++;
    return pk;
}

int ops_unpark(struct parked *pk)
{
    struct tsd_conn *c = pk->c;
    int alive = !c->dead;

    c->parked--;
    if (!alive)
        tsd_conn_unref(c);
    else
        c->t0_ns = pk->t0_ns; /* the reply about to go is this request's */
    return alive;
}

/* After the reply of a live parked connection: drop the parked reference. */
void ops_unpark_done(struct parked *pk)
{
    struct tsd_conn *c = pk->c;

    /* The connection holds its own reference while alive, so this never frees it. */
    tsd_conn_unref(c);
    free(pk);
    tsd_conn_maybe_finish(c);
}

/*
 * Whether this node still leads pk's PG in the interval the write was accepted in: a newer
 * primary's peering may have reached it meanwhile (it then promised a newer epoch). Checked
 * again before acknowledging: what a newer primary read here before this point included the
 * write; anything acknowledged after would be unknown to it.
 */
int ops_still_leading(struct parked *pk)
{
    struct ts_pg_state st;

    if (!pk->epoch)
        return 1;
    return ts_store_pg_state(pk->c->w->srv->store, pk->pg, &st) == 0 && st.promised <= pk->epoch;
}

static void write_replicated(void *arg, int rc, unsigned acked, const char *msg)
{
    struct parked *pk = arg;

    if (ops_unpark(pk)) {
        if (rc == TS_ESTALE || !ops_still_leading(pk)) {
            /* A replica knows a newer map: this node may no longer lead the PG. */
            tsd_reply_stale(pk->c, &pk->h, "shard-write %s/%u chunk %u refused: %s", pk->name,
                            pk->shard, pk->idx, msg);
        } else if (acked >= pk->min_acks) {
            if (acked < pk->targets)
                TS_WARN(FAC, 0, "%s/%u chunk %u: %u of %u other core replicas hold it (%s)",
                        pk->name, pk->shard, pk->idx, acked, pk->targets, msg);
            ops_reply_write_ok(pk->c, &pk->h, pk->idx, pk->bytes);
        } else {
            tsd_reply_error(pk->c, &pk->h, TS_EUNAVAIL,
                            "shard-write %s/%u chunk %u: only %u of %u other core replicas "
                            "stored it, %u needed (min_core %u with this one): %s",
                            pk->name, pk->shard, pk->idx, acked, pk->targets, pk->min_acks,
                            pk->min_acks + 1, msg);
        }
        ops_unpark_done(pk);
        return;
    }
    free(pk);
}

int ops_placement(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                  uint32_t shard, const struct ts_dataset_policy *p, uint32_t *pg,
                  struct ts_repl_targets *to, uint64_t *epoch, unsigned *need)
{
    struct tsd_placement pl;
    char why[512];
    int rc = tsd_primary_check(c->w->srv, name, shard, p, &pl, why, sizeof(why));

    if (rc == TS_ESTALE) {
        tsd_reply_stale(c, h, "%s", why);
        return 0;
    }
    if (rc) {
        tsd_reply_error(c, h, rc, "%s", why);
        return 0;
    }
    *pg = pl.pg;
    *to = pl.to;
    *epoch = pl.epoch;
    *need = pl.need;
    return 1;
}

int ops_enough_replicas(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                        uint32_t shard, unsigned need, const struct ts_repl_targets *to)
{
    unsigned reach = to->n ? ts_repl_reachable(c->w->srv->repl, to) : 0;

    if (reach + 1 >= need)
        return 1;
    tsd_reply_error(c, h, TS_EUNAVAIL,
                    "%s/%u: %u of %u core replicas reachable, %u must hold each write (min_core)",
                    name, shard, reach + 1, to->n + 1, need);
    return 0;
}

static void op_shard_write(struct tsd_conn *c, const struct ts_frame_hdr *h,
                           const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const char *name = q->u.shard_write.name;
    const struct tsd_chunk *k = &q->u.shard_write.chunk;
    struct tsd_upload *u;
    struct ts_dataset_info d;
    struct ts_repl_targets to;
    struct ts_repl_chunk *ch;
    struct parked *pk;
    uint32_t shard = k->shard, idx = k->idx, crc = k->crc, len = k->len, pg = 0;
    uint64_t size = k->size, act_epoch = 0;
    unsigned need = 1;
    const uint8_t *data = k->data;
    int frag = ts_frag_split(name, NULL, NULL);

    if (frag && !ops_frag_write_ok(c, h, name, shard))
        return;
    if (atomic_load(&s->epoch) && !frag) {
        int rc = ts_store_dataset_get(s->store, name, &d);
        if (rc) {
            ops_reply_store_error(c, h, rc, name, shard);
            return;
        }
        /* No reachability pre-check here: forwarding the chunk is the check (a replica that
         * cannot take it makes the write fail with TS_EUNAVAIL below min_core). */
        if (!ops_placement(c, h, name, shard, &d.policy, &pg, &to, &act_epoch, &need))
            return;
    } else {
        memset(&to, 0, sizeof(to));
    }
    if (ops_local_write(c, h, name, shard, idx, size, crc, len, data, &u))
        return;
    if (to.n == 0) {
        ops_reply_write_ok(c, h, idx, ts_shard_writer_bytes(u->w));
        return;
    }
    /* Synchronous replication: the other core replicas store the chunk before the ack. */
    ch = calloc(1, sizeof(*ch));
    pk = ch ? ops_park(c, h, need, to.n) : NULL;
    if (!pk || (len && !(ch->data = malloc(len)))) {
        if (pk) {
            ops_unpark(pk);
            tsd_conn_unref(c);
            free(pk);
        }
        free(ch);
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    pk->idx = idx;
    pk->pg = pg;
    pk->epoch = act_epoch;
    u->to = to; /* an ended upload is ended on these too */
    pk->bytes = ts_shard_writer_bytes(u->w);
    snprintf(pk->name, sizeof(pk->name), "%s", name);
    pk->shard = shard;
    snprintf(ch->dataset, sizeof(ch->dataset), "%s", name);
    ch->policy = d.policy;
    ch->shard = shard;
    ch->idx = idx;
    ch->size = size;
    ch->crc = crc;
    ch->inc = d.created_ns;
    if (len)
        memcpy(ch->data, data, len);
    ch->len = len;
    ch->to = to;
    ts_repl_forward_chunk(s->repl, ch, c->w->base, write_replicated, pk);
}

int ops_records(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_u64s *v,
                uint64_t **recs)
{
    *recs = NULL;
    if (!v->n)
        return 0;
    *recs = malloc(8 * (size_t)v->n);
    if (!*recs) {
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return TS_ENOMEM;
    }
    for (uint32_t i = 0; i < v->n; i++)
        (*recs)[i] = tsd_u64s_at(v, i);
    return 0;
}

/* ---- shard metadata --------------------------------------------------------------------- */

void ops_reply_shard_info(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                          uint32_t shard)
{
    struct ts_shard_info si;
    struct ts_wr w;
    int rc = ts_store_shard_stat(c->w->srv->store, name, shard, &si);

    if (rc) {
        ops_reply_store_error(c, h, rc, name, shard);
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_shard_info(&w, &si);
    tsd_reply_send(c, h, &w);
}

static void op_shard_stat(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    ops_reply_shard_info(c, h, q->u.shard_stat.name, q->u.shard_stat.shard);
}

/*
 * RDMA_TOKEN: admission to this node's RDMA listener for the asking connection's identity and
 * role (a node certificate gets reader: node-to-node traffic does not use RDMA). RDMA has no
 * authentication of its own, so this authenticated connection vouches for the session.
 */
static void op_rdma_token(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const char *addr = tsd_rdma_addr(s);
    int role = tsd_conn_role(s, c);
    uint8_t tok[TS_RDMA_TOKEN_LEN];
    char who[96];
    struct ts_wr w;
    int rc;

    if (!addr) {
        tsd_reply_error(c, h, TS_ENOTSUP, "this node serves no RDMA (rdma_listen is not set)");
        return;
    }
    if (role == TS_ROLE_NODE)
        role = TS_ROLE_READER;
    snprintf(who, sizeof(who), "%.95s", c->subject[0] ? c->subject : c->peer);
    rc = tsd_rdma_token_issue(&s->rdma_tokens, role, who, ts_now_mono_ns(), tok);
    if (rc) {
        tsd_reply_error(c, h, rc, "cannot make an RDMA token");
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_bytes(&w, tok, sizeof(tok));
    ts_wr_u32(&w, TSD_RDMA_TOKEN_TTL_MS);
    ts_wr_str(&w, addr);
    tsd_reply_send(c, h, &w);
}

/* SHARD_RECORDS: a complete shard's record index (ascending offsets; checked by its CRC). */
static void op_shard_records(struct tsd_conn *c, const struct ts_frame_hdr *h,
                             const struct tsd_req *q)
{
    const char *name = q->u.shard_records.name;
    uint32_t shard = q->u.shard_records.shard, n = 0;
    uint64_t *recs = NULL;
    struct ts_wr w;
    int rc;

    rc = ts_store_shard_records(c->w->srv->store, name, shard, &recs, &n);
    if (rc) {
        ops_reply_store_error(c, h, rc, name, shard);
        return;
    }
    tsd_reply_begin(&w);
    ts_wr_u32(&w, n);
    for (uint32_t i = 0; i < n; i++)
        ts_wr_u64(&w, recs[i]);
    free(recs);
    tsd_reply_send(c, h, &w);
}

struct shard_list_arg {
    struct ts_wr *w;
    uint32_t n;
};

static int shard_list_cb(void *arg, const struct ts_shard_info *si)
{
    struct shard_list_arg *a = arg;
    ts_wr_shard_info(a->w, si);
    a->n++;
    return 0;
}

static void op_shard_list(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const char *name = q->u.shard_list.name;
    struct ts_wr w;
    struct shard_list_arg a = {&w, 0};
    size_t at;
    int rc;

    tsd_reply_begin(&w);
    at = w.len;
    ts_wr_u32(&w, 0);
    rc = ts_store_shard_list(c->w->srv->store, name, shard_list_cb, &a);
    if (rc) {
        ts_wr_fini(&w);
        ops_reply_store_error(c, h, rc, name, -1);
        return;
    }
    if (!w.err)
        ts_put_le32(w.buf + at, a.n);
    tsd_reply_send(c, h, &w);
}

/* ---- maintenance ------------------------------------------------------------------------ */

struct scrub_arg {
    struct ts_wr *w;
    uint32_t n;
};

static void scrub_cb(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc)
{
    struct scrub_arg *a = arg;

    if (a->n >= MAX_SCRUB_REPORT)
        return;
    ts_wr_str(a->w, ds);
    ts_wr_u32(a->w, shard);
    ts_wr_u32(a->w, idx);
    ts_wr_u32(a->w, (uint32_t)rc);
    a->n++;
}

/* A scrub runs on the maintenance thread; its reply is sent from the worker afterwards. */
struct scrub_job {
    struct parked *pk;
    struct tsd_server *s;
    struct event_base *worker_base;
    char name[TS_NAME_MAX + 1];
    struct ts_scrub_report rep;
    struct ts_wr list;
    struct scrub_arg a;
    struct tsd_scrub_pgs pgs;
    int rc;
};

static void scrub_done(evutil_socket_t fd, short what, void *arg)
{
    struct scrub_job *j = arg;
    struct parked *pk = j->pk;
    struct ts_wr w;

    if (ops_unpark(pk)) {
        if (j->rc) {
            ops_reply_store_error(pk->c, &pk->h, j->rc, j->name[0] ? j->name : "(all)", -1);
        } else {
            tsd_reply_begin(&w);
            ts_wr_u64(&w, j->rep.shards);
            ts_wr_u64(&w, j->rep.chunks);
            ts_wr_u64(&w, j->rep.bytes);
            ts_wr_u64(&w, j->rep.corrupt);
            ts_wr_u32(&w, j->a.n);
            ts_wr_bytes(&w, j->list.buf, j->list.len);
            ts_wr_u32(&w, j->pgs.compared);
            ts_wr_u32(&w, j->pgs.differing);
            ts_wr_u64(&w, j->pgs.missing);
            ts_wr_u32(&w, j->pgs.unchecked);
            tsd_reply_send(pk->c, &pk->h, &w);
        }
        ops_unpark_done(pk);
    } else {
        free(pk);
    }
    ts_wr_fini(&j->list);
    free(j);
}

static void scrub_run(evutil_socket_t fd, short what, void *arg)
{
    struct scrub_job *j = arg;

    j->rc = tsd_scrub_run(j->s, j->name[0] ? j->name : NULL, 0, &j->s->stopping, scrub_cb, &j->a,
                          &j->rep, &j->pgs);
    event_base_once(j->worker_base, -1, EV_TIMEOUT, scrub_done, j, NULL);
}

static void op_scrub(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    struct scrub_job *j;
    const char *name = q->u.scrub.name; /* "": every dataset */

    j = calloc(1, sizeof(*j));
    if (!j || !(j->pk = ops_park(c, h, 1, 0))) {
        free(j);
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    /* Off the worker: scrubbing reads every chunk and must not stall other clients. */
    j->s = s;
    j->worker_base = c->w->base;
    snprintf(j->name, sizeof(j->name), "%s", name);
    ts_wr_init(&j->list);
    j->a.w = &j->list;
    event_base_once(s->maint_base, -1, EV_TIMEOUT, scrub_run, j, NULL);
}

static const tsd_handler handlers[TS_OP_MAX] = {
    [TS_OP_HELLO] = op_hello,
    [TS_OP_DATASET_CREATE] = op_dataset_create,
    [TS_OP_DATASET_LIST] = op_dataset_list,
    [TS_OP_DATASET_STAT] = op_dataset_stat,
    [TS_OP_DATASET_SEAL] = op_dataset_seal,
    [TS_OP_DATASET_DELETE] = op_dataset_delete,
    [TS_OP_SHARD_WRITE] = op_shard_write,
    [TS_OP_SHARD_SEAL] = tsd_op_shard_seal,
    [TS_OP_READ] = tsd_op_read,
    [TS_OP_SHARD_STAT] = op_shard_stat,
    [TS_OP_SHARD_LIST] = op_shard_list,
    [TS_OP_SCRUB] = op_scrub,
    [TS_OP_STATUS] = tsd_op_status,
    [TS_OP_MAP_GET] = tsd_op_map_get,
    [TS_OP_MAP_PUSH] = tsd_op_map_push,
    [TS_OP_REPL_WRITE] = tsd_op_repl_write,
    [TS_OP_REPL_SEAL] = tsd_op_repl_seal,
    [TS_OP_PG_INFO] = tsd_op_pg_info,
    [TS_OP_PG_QUERY] = tsd_op_pg_query,
    [TS_OP_PG_ACTIVATE] = tsd_op_pg_activate,
    [TS_OP_PG_PULL] = tsd_op_pg_pull,
    [TS_OP_PG_INVENTORY] = tsd_op_pg_inventory,
    [TS_OP_SHARD_RECORDS] = op_shard_records,
    [TS_OP_RDMA_TOKEN] = op_rdma_token,
    [TS_OP_PG_DROP] = tsd_op_pg_drop,
    [TS_OP_READV] = tsd_op_readv,
    [TS_OP_HINT] = tsd_op_hint,
    [TS_OP_DATASET_TIER] = tsd_op_dataset_tier,
    [TS_OP_CHUNK_REPAIR] = tsd_op_chunk_repair,
};

static tsd_handler handler_for(unsigned opcode)
{
    return handlers[opcode];
}

const struct tsd_ops *tsd_ops_table(void)
{
    static const struct tsd_ops ops = {handler_for,     conn_closing,       tsd_stream_continue,
                                       tsd_stream_free, tsd_uploads_expire, tsd_seals_durable,
                                       tsd_seals_forget};
    return &ops;
}
