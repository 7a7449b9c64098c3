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
 */
void tsd_op_dataset_tier(struct tsd_conn *c, const struct ts_frame_hdr *h, const struct tsd_req *q)
{
    const struct tsd_req_dataset_tier *a = &q->u.dataset_tier;
    struct tsd_server *s = c->w->srv;
    char frag[TS_NAME_MAX + 1];
    uint64_t missing = 0;
    int rc;

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
    rc = ts_store_dataset_set_tier(s->store, a->name, a->k, a->m, a->dropped, &missing);
    if (rc == TS_EINVAL)
        tsd_reply_error(c, h, rc, "dataset-tier %s: not sealed (only sealed datasets are tiered)",
                        a->name);
    else if (rc == TS_EINCOMPLETE)
        tsd_reply_error(c, h, rc,
                        "dataset-tier %s: %llu chunks of its replicas here are not restored yet "
                        "(their bytes are only in the fragments): nothing changed",
                        a->name, (unsigned long long)missing);
    else if (rc == TS_EBUSY)
        tsd_reply_error(c, h, rc,
                        "dataset-tier %s: its replicas' bytes are dropped here, its fragments "
                        "of its code hold them: put them back first (tier NAME replicated)",
                        a->name);
    else if (rc)
        ops_reply_store_error(c, h, rc, a->name, -1);
    if (rc)
        return;
    for (unsigned f = 0; !a->k && f < TS_FRAG_MAX && ts_frag_name(frag, a->name, f) == 0; f++) {
        int fr = ts_store_dataset_delete_ex(s->store, frag, 1);
        if (fr && fr != TS_ENOENT)
            TS_WARN(FAC, fr, "dataset %s replicated again; its fragment store %s not removed",
                    a->name, frag);
    }
    ops_reply_ok(c, h);
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
}
