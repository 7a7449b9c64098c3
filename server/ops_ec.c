/*
 * Erasure-coded datasets on a node (issue 33; docs/architecture.md "Erasure-coded shards"):
 * writes to a fragment store NAME#f, and DATASET_TIER, which records a sealed dataset's code.
 */
#include "ops_internal.h"
#include "ts_ec.h"

#include <stdio.h>

/*
 * A write to a fragment store NAME#f (issue 33): only an admin writes fragments (the tiering
 * CLI); NAME must be a sealed dataset here, and its fragment store is made on first use with
 * NAME's policy and incarnation. Fragments are not PG-replicated: the write is this node's
 * alone. 1 to go on, 0 after replying an error.
 */
int ops_frag_write_ok(struct tsd_conn *c, const struct ts_frame_hdr *h, const char *name,
                      uint32_t shard)
{
    struct tsd_server *s = c->w->srv;
    char base[TS_NAME_MAX + 1];
    struct ts_dataset_info d, fd;
    unsigned f;
    int rc;

    if (!ts_frag_split(name, base, &f))
        return 1;
    if (tsd_conn_role(s, c) != TS_ROLE_ADMIN) {
        tsd_reply_error(c, h, TS_EPERM,
                        "%s %s/%u: only an admin writes the fragments of an erasure-coded "
                        "dataset (role '%s')",
                        ts_op_desc(h->opcode)->name, name, shard,
                        ts_role_name(tsd_conn_role(s, c)));
        return 0;
    }
    rc = ts_store_dataset_get(s->store, base, &d);
    if (rc == 0 && d.state != TS_DS_SEALED)
        rc = TS_EINVAL;
    if (rc == 0 && h->opcode == TS_OP_SHARD_WRITE &&
        ts_store_dataset_get(s->store, name, &fd) == TS_ENOENT) {
        struct ts_dataset_policy p = d.policy;
        p.ec_k = p.ec_m = p.ec_dropped = 0; /* a fragment store holds its own bytes */
        rc = ts_store_dataset_create_inc(s->store, name, &p, d.created_ns);
        rc = rc == TS_EEXIST ? 0 : rc;
    }
    if (rc == TS_EINVAL)
        tsd_reply_error(c, h, rc,
                        "%s %s/%u: dataset '%s' is not sealed (only sealed datasets "
                        "are erasure-coded)",
                        ts_op_desc(h->opcode)->name, name, shard, base);
    else if (rc)
        ops_reply_store_error(c, h, rc, base, -1);
    return rc == 0;
}

/*
 * DATASET_TIER: NAME's erasure code (k, m), or replicated only (0, 0), and whether its
 * replicas' bytes are dropped, on this node; a sealed dataset only (storage/tier.c). Back to
 * replicated, the node's fragment stores of NAME go: the client converts back only once the
 * replicas hold every byte again, which the node checked when it was told to keep them.
 *
 * The store work runs on a thread of its own, not the worker: keeping the bytes again reads
 * every chunk of the dataset here, and dropping them deletes its chunk files. At most
 * TSD_TIER_SLOTS run at once per node (more wait for a slot: an admin's requests, each
 * answered in turn); the reply is sent from the worker once it is done.
 */

struct tier_job {
    struct parked *pk;
    struct tsd_server *s;
    struct event_base *worker_base;
    struct tsd_req_dataset_tier a;
    uint64_t missing;
    int rc;
};

static void tier_done(evutil_socket_t fd, short what, void *arg)
{
    struct tier_job *j = arg;
    struct parked *pk = j->pk;
    const struct tsd_req_dataset_tier *a = &j->a;
    int rc = j->rc;

    (void)fd;
    (void)what;
    if (!ops_unpark(pk)) {
        free(pk);
        free(j);
        return;
    }
    if (rc == TS_EINVAL)
        tsd_reply_error(pk->c, &pk->h, rc,
                        "dataset-tier %s: not sealed (only sealed datasets are tiered)", a->name);
    else if (rc == TS_EINCOMPLETE)
        tsd_reply_error(pk->c, &pk->h, rc,
                        "dataset-tier %s: %llu chunks of its replicas here are not restored yet "
                        "(their bytes are only in the fragments): nothing changed",
                        a->name, (unsigned long long)j->missing);
    else if (rc == TS_EBUSY)
        tsd_reply_error(pk->c, &pk->h, rc,
                        "dataset-tier %s: its replicas' bytes are dropped here, its fragments "
                        "of its code hold them: put them back first (tier NAME replicated)",
                        a->name);
    else if (rc)
        ops_reply_store_error(pk->c, &pk->h, rc, a->name, -1);
    else
        ops_reply_ok(pk->c, &pk->h);
    ops_unpark_done(pk);
    free(j);
}

static void *tier_run(void *arg)
{
    struct tier_job *j = arg;
    const struct tsd_req_dataset_tier *a = &j->a;
    struct tsd_server *s = j->s;
    char frag[TS_NAME_MAX + 1];

    while (sem_wait(&s->tier_slots) != 0)
        ; /* EINTR */
    j->rc = ts_store_dataset_set_tier(s->store, a->name, a->k, a->m, a->dropped, &j->missing);
    for (unsigned f = 0; !j->rc && !a->k && f < TS_FRAG_MAX && ts_frag_name(frag, a->name, f) == 0;
         f++) {
        int fr = ts_store_dataset_delete_ex(s->store, frag, 1);
        if (fr && fr != TS_ENOENT)
            TS_WARN(FAC, fr, "dataset %s replicated again; its fragment store %s not removed",
                    a->name, frag);
    }
    sem_post(&s->tier_slots);
    event_base_once(j->worker_base, -1, EV_TIMEOUT, tier_done, j, NULL);
    atomic_fetch_sub(&s->tier_jobs, 1); /* after the last use of s */
    return NULL;
}

void tsd_op_dataset_tier(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_dataset_tier *a = &q->u.dataset_tier;
    struct tsd_server *s = c->w->srv;
    struct tier_job *j;
    pthread_attr_t at;
    pthread_t t;

    if ((a->k || a->m) && (a->k < 1 || a->k > TS_EC_MAX_K || a->m < 1 || a->m > TS_EC_MAX_M)) {
        tsd_reply_error(c, h, TS_EINVAL,
                        "dataset-tier %s: ec %u+%u: K must be 1 to %d and M 1 to %d", a->name, a->k,
                        a->m, TS_EC_MAX_K, TS_EC_MAX_M);
        return;
    }
    if (a->dropped && !a->k) {
        tsd_reply_error(c, h, TS_EINVAL,
                        "dataset-tier %s: replica bytes dropped needs an erasure code", a->name);
        return;
    }
    atomic_fetch_add(&s->tier_jobs, 1);
    j = calloc(1, sizeof(*j));
    if (!j || !(j->pk = ops_park(c, h, 1, 0))) {
        free(j);
        atomic_fetch_sub(&s->tier_jobs, 1);
        tsd_reply_error(c, h, TS_ENOMEM, "out of memory");
        return;
    }
    j->s = s;
    j->worker_base = c->w->base;
    j->a = *a;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, tier_run, j) != 0)
        tier_run(j); /* no thread: done here, on the worker */
    pthread_attr_destroy(&at);
}

/*
 * CHUNK_REPAIR: good bytes for a damaged or lost chunk of a fragment, or of a replica whose
 * bytes were dropped (being restored), rebuilt by the client from fragments. They must match
 * the chunk's CRC32C and length as stored when the shard was sealed (TS_ECORRUPT otherwise,
 * nothing written): the record, not the sender, says what the bytes are. Replicas that hold
 * their bytes repair themselves from a replica; they are not taken here.
 */
void tsd_op_chunk_repair(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_chunk_repair *a = &q->u.chunk_repair;
    struct ts_dataset_info d;
    int rc;

    if (!ts_frag_split(a->name, NULL, NULL) &&
        (ts_store_dataset_get(c->w->srv->store, a->name, &d) || !d.policy.ec_dropped)) {
        tsd_reply_error(c, h, TS_EINVAL,
                        "chunk-repair %s/%u: only fragments (NAME#f) and replicas whose bytes "
                        "were dropped are repaired this way; replicas repair from each other",
                        a->name, a->shard);
        return;
    }
    rc = ts_store_chunk_repair(c->w->srv->store, a->name, a->shard, a->idx, a->data, a->len);
    if (rc == TS_ECORRUPT)
        tsd_reply_error(c, h, rc,
                        "chunk-repair %s/%u chunk %u: %u bytes that do not match its stored "
                        "CRC32C and length; nothing written",
                        a->name, a->shard, a->idx, a->len);
    else if (rc)
        ops_reply_store_error(c, h, rc, a->name, a->shard);
    else
        ops_reply_ok(c, h);
    if (rc == 0)
        tsd_ec_wanted_done(c->w->srv, a->name, a->shard, a->idx);
}
