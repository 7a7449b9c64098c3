/*
 * SHARD_SEAL (docs/protocol.md): a shard's upload ends in its seal, answered once the seal is
 * as durable as the sync policy says and, in a cluster, on min_core core replicas.
 *
 * Where seals are synced (sync = seal or always) the seal goes to the store's group commit
 * (storage/commit.c): the reply is parked, the commit thread writes the seal and syncs the WAL
 * once for every seal queued with it, and hands the job back to the worker (its `sealed` list
 * and sealed_ev), whose loop answers, or, in a cluster, waits for the replicas as before. The
 * worker's loop never waits on a sync, and concurrent seals share one.
 */
#include "ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A seal on its way through the group commit. */
struct tsd_seal_job {
    struct tsd_seal_job *next;
    struct tsd_worker *w;
    struct parked *pk; /* the connection, held until the reply */
    int cluster;
    unsigned need;
    struct ts_repl_targets to;
    struct ts_log_rec log; /* the PG log entry (cluster): its seq is set by the seal */
    int rc;
};

static void seal_replicated(void *arg, int rc, unsigned acked, const char *msg)
{
    struct parked *pk = arg;

    if (ops_unpark(pk)) {
        if (!ops_still_leading(pk)) {
            tsd_reply_stale(pk->c, &pk->h,
                            "shard-seal %s/%u: not acknowledged: PG %u has a newer primary than "
                            "this node's epoch %llu",
                            pk->name, pk->shard, pk->pg, (unsigned long long)pk->epoch);
        } else if (acked >= pk->min_acks) {
            if (acked < pk->targets)
                TS_WARN(FAC, 0,
                        "%s/%u sealed on %u of %u other core replicas (%s): the rest "
                        "catch up from the PG log",
                        pk->name, pk->shard, acked, pk->targets, msg);
            ops_reply_shard_info(pk->c, &pk->h, pk->name, pk->shard);
        } else {
            tsd_reply_error(pk->c, &pk->h, TS_EUNAVAIL,
                            "shard-seal %s/%u: sealed here but only %u of %u other core replicas "
                            "acknowledged, %u needed (min_core %u with this one): %s",
                            pk->name, pk->shard, acked, pk->targets, pk->min_acks, pk->min_acks + 1,
                            msg);
        }
        ops_unpark_done(pk);
        return;
    }
    free(pk);
}

/* The shard is sealed here already, with the contents the sender has: reply as a seal would,
 * once the PG's log up to its current head (which holds the shard's entry) is on `need`
 * replicas. */
static void confirm_sealed(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                           uint32_t shard, uint32_t pg, uint64_t act_epoch, unsigned need,
                           const struct ts_repl_targets *to)
{
    struct tsd_server *s = c->w->srv;
    uint64_t head = 0;
    struct parked *pk;

    if (!act_epoch || !to->n || ts_store_pg_applied(s->store, pg, &head, NULL) != 0 || !head) {
        ops_reply_shard_info(c, h, name, shard);
        return;
    }
    pk = ops_park(c, h, need, to->n);
    if (!pk) {
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    snprintf(pk->name, sizeof(pk->name), "%s", name);
    pk->shard = shard;
    pk->pg = pg;
    pk->epoch = act_epoch;
    ts_repl_wait_applied(s->repl, pg, head, to, c->w->base, seal_replicated, pk);
}

/* Answers a seal written here (j->rc its result); c is alive. */
static void seal_answer(struct tsd_conn *c, const struct ts_frame_hdr *h, struct tsd_seal_job *j,
                        const char *name, uint32_t shard)
{
    struct tsd_server *s = c->w->srv;
    struct parked *pk;

    if (j->rc) {
        ops_reply_store_error(c, h, j->rc, name, shard);
        return;
    }
    if (ts_frag_split(name, NULL, NULL)) /* a fragment put whole here: nothing left to repair */
        tsd_ec_wanted_done(s, name, shard, UINT32_MAX);
    if (!j->cluster) {
        ops_reply_shard_info(c, h, name, shard);
        return;
    }
    /* Wait for the other core replicas to apply the seal (fringe ones get it later). */
    pk = ops_park(c, h, j->need, j->to.n);
    if (!pk) {
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    snprintf(pk->name, sizeof(pk->name), "%s", name);
    pk->shard = shard;
    pk->pg = j->log.pg;
    pk->epoch = j->log.epoch;
    ts_repl_wait_applied(s->repl, j->log.pg, j->log.seq, &j->to, c->w->base, seal_replicated, pk);
}

/* The commit thread's end of a seal: back to the worker's loop. */
static void seal_committed(void *arg, int rc)
{
    struct tsd_seal_job *j = arg;
    struct tsd_worker *w = j->w;

    j->rc = rc;
    pthread_mutex_lock(&w->lock);
    j->next = w->sealed;
    w->sealed = j;
    pthread_mutex_unlock(&w->lock);
    event_active(w->sealed_ev, EV_TIMEOUT, 0);
}

void tsd_seals_durable(struct tsd_worker *w)
{
    struct tsd_seal_job *list, *rev = NULL;

    pthread_mutex_lock(&w->lock);
    list = w->sealed;
    w->sealed = NULL;
    pthread_mutex_unlock(&w->lock);
    while (list) { /* oldest first */
        struct tsd_seal_job *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    while (rev) {
        struct tsd_seal_job *j = rev;
        struct parked *pk = j->pk;
        rev = j->next;
        if (ops_unpark(pk)) {
            /* The parked reference is dropped after the answer, which may park anew. */
            seal_answer(pk->c, &pk->h, j, pk->name, pk->shard);
            ops_unpark_done(pk);
        } else {
            free(pk);
        }
        free(j);
    }
}

void tsd_seals_forget(struct tsd_worker *w)
{
    while (w->sealed) {
        struct tsd_seal_job *j = w->sealed;
        w->sealed = j->next;
        free(j->pk);
        free(j);
    }
}

/* Seals upload u: at once where seals are not synced, else through the group commit. */
static void seal_upload(struct tsd_conn *c, const struct ts_frame_hdr *h, struct tsd_upload *u,
                        struct tsd_seal_job *j, const struct tsd_req_shard_seal *a,
                        const uint64_t *recs)
{
    struct tsd_server *s = c->w->srv;
    const char *name = a->name;
    uint32_t shard = a->shard;
    int rc;

    if (ts_store_group_commit(s->store)) {
        j->w = c->w;
        j->pk = ops_park(c, h, 1, 0);
        if (!j->pk) {
            tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
            free(j);
            return;
        }
        snprintf(j->pk->name, sizeof(j->pk->name), "%s", name);
        j->pk->shard = shard;
        rc = ts_shard_writer_seal_async(u->w, a->have_crc, a->crc, recs, a->records.n,
                                        j->cluster ? &j->log : NULL, seal_committed, j);
        if (rc == 0) {
            ops_upload_remove(c, u); /* the writer is the store's now */
            return;
        }
        ops_unpark(j->pk); /* c is alive: this handler runs on its loop */
        tsd_conn_unref(c);
        free(j->pk);
    } else {
        rc = ts_shard_writer_seal_log(u->w, a->have_crc, a->crc, recs, a->records.n,
                                      j->cluster ? &j->log : NULL);
        if (rc == 0) {
            ops_upload_remove(c, u);
            seal_answer(c, h, j, name, shard);
            free(j);
            return;
        }
    }
    /* Refused before anything was written: the upload stays, as it was. */
    if (rc == TS_EINCOMPLETE)
        tsd_reply_error(c, h, rc, "shard-seal %s/%u: only %llu of the declared bytes arrived", name,
                        shard, (unsigned long long)ts_shard_writer_bytes(u->w));
    else if (rc == TS_ECORRUPT)
        tsd_reply_error(c, h, rc, "shard-seal %s/%u: whole-shard CRC32C does not match", name,
                        shard);
    else
        ops_reply_store_error(c, h, rc, name, shard);
    free(j);
}

void tsd_op_shard_seal(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    struct tsd_server *s = c->w->srv;
    const struct tsd_req_shard_seal *a = &q->u.shard_seal;
    const char *name = a->name;
    struct tsd_upload *u;
    struct ts_shard_info si;
    struct ts_dataset_info d;
    struct tsd_seal_job *j;
    uint64_t *recs = NULL;
    uint32_t shard = a->shard;
    int frag = ts_frag_split(name, NULL, NULL);
    int cluster = atomic_load(&s->epoch) != 0 && !frag; /* a fragment is this node's alone */
    int rc;

    if (frag && !ops_frag_write_ok(c, h, name, shard))
        return;
    j = calloc(1, sizeof(*j));
    if (!j) {
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    j->need = 1;
    j->cluster = cluster;
    if (ops_records(c, h, &a->records, &recs))
        goto out_free;
    if (cluster) {
        rc = ts_store_dataset_get(s->store, name, &d);
        if (rc) {
            ops_reply_store_error(c, h, rc, name, shard);
            goto out_free;
        }
        if (!ops_placement(c, h, name, shard, &d.policy, &j->log.pg, &j->to, &j->log.epoch,
                           &j->need))
            goto out_free;
        if (!ops_enough_replicas(c, h, name, shard, j->need, &j->to))
            goto out_free;
    }
    u = ops_upload_find(c, name, shard);
    if (!u) {
        rc = ts_store_shard_stat(s->store, name, shard, &si);
        if (rc == 0 && si.state == TS_SHARD_COMPLETE && a->have_crc && si.crc == a->crc) {
            /* A retried put of the same shard (the first attempt's answer was lost, or it
             * failed after sealing here): answer once it is as durable as a new seal. */
            confirm_sealed(c, h, name, shard, j->log.pg, j->log.epoch, j->need, &j->to);
        } else if (rc == 0 && si.state == TS_SHARD_COMPLETE)
            tsd_reply_error(c, h, TS_EEXIST,
                            "shard-seal %s/%u: already sealed with other contents (%llu bytes, "
                            "CRC32C %08x)",
                            name, shard, (unsigned long long)si.size, si.crc);
        else if (rc && rc != TS_ENOENT)
            ops_reply_store_error(c, h, rc, name, shard);
        else
            tsd_reply_error(c, h, TS_EINVAL,
                            "shard-seal %s/%u: no upload of this shard in progress on this "
                            "connection",
                            name, shard);
        goto out_free;
    }
    if (cluster) {
        j->log.fence = j->log.epoch; /* refused if a newer primary's peering reached us */
        snprintf(j->log.dataset, sizeof(j->log.dataset), "%s", name);
        j->log.policy = d.policy;
        j->log.inc = d.created_ns;
        j->log.shard = shard;
    }
    seal_upload(c, h, u, j, a, recs); /* j is its */
    free(recs);
    return;
out_free:
    free(recs);
    free(j);
}
