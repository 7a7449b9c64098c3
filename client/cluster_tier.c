/*
 * Tiering a sealed dataset over the router (issue 33; docs/operations.md "Tiering"). To ec:K+M:
 * shard by shard, its bytes read (verified against the shard's CRC32C), its K+M fragments put
 * durably (cluster_ec.c), and read back through them and checked again; once every shard is,
 * each node is told the code and drops its replicas' bytes (DATASET_TIER, dropped: the shard
 * records stay, storage/tier.c). Back to replicated: each shard rebuilt from its fragments,
 * checked, and its chunks put back on every node that keeps a record of it (CHUNK_REPAIR: the
 * node takes only bytes matching the chunk's stored CRC32C); then each node is told to keep
 * its bytes again, which it does only once all of them read back whole; only after every node
 * did are the fragments removed.
 */
#include "cluster_internal.h"
#include "ts_ec.h"
#include "ts_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DATASET_TIER (k, m, dropped) on every node that is not out (a node down fails it: run it
 * again), and, keeping the bytes, on the nodes marked out that answer. */
static int tier_all(tessera_client *c, struct ts_cluster *cl, const char *name, unsigned k,
                    unsigned m, int dropped)
{
    struct fan f;
    size_t ok = 0;
    int rc = ts_cl_fan_begin(cl, &f, 1, 0);

    if (rc)
        return rc;
    for (size_t i = 0; i < f.n; i++) {
        tessera_client *sub;
        char msg[512] = "";
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub,
                                 ts_conn_dataset_tier(sub, name, k, m, dropped), msg, sizeof(msg));
        else
            snprintf(msg, sizeof(msg), "%s", ts_conn_error(cl->c));
        if (!rc) {
            ok++;
            continue;
        }
        if (!f.first)
            f.first = rc;
        ts_cl_why_add(f.why, "%s: %s", cl->peers[f.peers[i]].id, msg[0] ? msg : ts_strerror(rc));
    }
    ts_cl_fan_end(&f);
    /* Keeping the bytes (back to replicated): the nodes marked out that answer too, as their
     * bytes were put back (dropped_nodes); one that does not answer is left as it is. */
    for (size_t i = 0; !dropped && i < cl->map->n; i++) {
        tessera_client *sub;
        char msg[512] = "";
        size_t p;
        if (cl->map->nodes[i].state != TS_NODE_OUT || ts_cl_node_peer(cl, cl->map, i, &p) ||
            ts_cl_peer_conn(cl, p, 1, &sub))
            continue;
        rc = ts_cl_peer_done(cl, p, sub, ts_conn_dataset_tier(sub, name, k, m, dropped), msg,
                             sizeof(msg));
        if (rc && rc != TS_ENOENT && !ts_cl_lost(rc)) {
            if (!f.first)
                f.first = rc;
            ts_cl_why_add(f.why, "%s (out): %s", cl->peers[p].id, msg[0] ? msg : ts_strerror(rc));
        }
    }
    ts_cl_policy_forget(cl, name); /* the next read asks for the policy again */
    if (f.first)
        ts_conn_set_error(c, "dataset %s: tier set on %zu of %zu nodes: %s", name, ok, f.n, f.why);
    return f.first;
}

/* Shard si of the dataset: read (verified), its fragments put, read back through them and
 * checked against the shard's CRC32C. */
static int tier_shard(tessera_client *c, struct ts_cluster *cl, const char *name,
                      const struct ts_shard_info *si, unsigned k, unsigned m, uint8_t *a,
                      uint8_t *b)
{
    size_t got = 0, len = (size_t)si->size;
    int rc = len ? ts_cl_read(c, cl, name, si->shard, 0, len, a, &got) : 0;

    if (!rc && got != len)
        rc = TS_EIO;
    if (!rc && ts_crc32c(0, a, len) != si->crc) {
        ts_conn_set_error(c, "%s/%u: the bytes read do not match the shard's CRC32C %08x", name,
                          si->shard, si->crc);
        rc = TS_ECORRUPT;
    }
    if (!rc)
        rc = ts_cl_ec_put(c, cl, name, si->shard, a, len, k, m);
    if (!rc)
        rc = ts_cl_ec_read(c, cl, name, si->shard, len, k, m, 0, len, b, NULL);
    if (!rc && ts_crc32c(0, b, len) != si->crc) {
        ts_conn_set_error(c,
                          "%s/%u: read back through its fragments, the bytes do not match "
                          "the shard's CRC32C %08x",
                          name, si->shard, si->crc);
        rc = TS_ECORRUPT;
    }
    return rc;
}

/* A node whose replicas of the dataset dropped their bytes, and the code it holds them under. */
struct dropped {
    size_t peer;
    unsigned k, m;
};

/* The nodes (into *out, count *n) whose replicas of the dataset dropped their bytes; every node
 * that is not out must answer. */
static int dropped_nodes(tessera_client *c, struct ts_cluster *cl, const char *name,
                         struct dropped **out, size_t *n)
{
    struct fan f;
    int rc = ts_cl_fan_begin(cl, &f, 1, 0);

    *n = 0;
    *out = NULL;
    if (rc)
        return rc;
    if (!(*out = calloc(cl->map->n ? cl->map->n : 1, sizeof(**out))))
        rc = TS_ENOMEM;
    for (size_t i = 0; !rc && i < f.n; i++) {
        struct ts_dataset_info d;
        tessera_client *sub;
        char msg[512] = "";
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub, ts_conn_dataset_policy(sub, name, &d), msg,
                                 sizeof(msg));
        if (rc == TS_ENOENT) { /* a node without the dataset holds none of it */
            rc = 0;
            continue;
        }
        if (rc)
            ts_conn_set_error(c, "dataset %s: node %s: %s", name, cl->peers[f.peers[i]].id,
                              msg[0] ? msg : ts_conn_error(cl->c));
        else if (d.policy.ec_dropped)
            (*out)[(*n)++] = (struct dropped){f.peers[i], d.policy.ec_k, d.policy.ec_m};
    }
    ts_cl_fan_end(&f);
    /* A node marked out that still answers and dropped its bytes gets them back too (it would
     * keep saying so to the replicas it pushes to, were it brought in again). */
    for (size_t i = 0; !rc && i < cl->map->n; i++) {
        struct ts_dataset_info d;
        tessera_client *sub;
        size_t p;
        if (cl->map->nodes[i].state == TS_NODE_OUT && ts_cl_node_peer(cl, cl->map, i, &p) == 0 &&
            ts_cl_peer_conn(cl, p, 1, &sub) == 0 &&
            ts_cl_peer_done(cl, p, sub, ts_conn_dataset_policy(sub, name, &d), NULL, 0) == 0 &&
            d.policy.ec_dropped)
            (*out)[(*n)++] = (struct dropped){p, d.policy.ec_k, d.policy.ec_m};
    }
    return rc;
}

/* Before any node drops its bytes: every node that is not out answers with its shards of the
 * dataset, and each complete one is among v[0..n) (converted: its fragments durable and read
 * back), same size and CRC32C. A node that cannot say fails it: nothing is dropped. */
static int nodes_hold_converted(tessera_client *c, struct ts_cluster *cl, const char *name,
                                const struct ts_shard_info *v, size_t n)
{
    struct fan f;
    int rc = ts_cl_fan_begin(cl, &f, 1, 0);

    for (size_t i = 0; !rc && i < f.n; i++) {
        struct ts_shard_info *h = NULL;
        tessera_client *sub;
        char msg[512] = "";
        size_t hn = 0;
        rc = ts_cl_peer_conn(cl, f.peers[i], 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, f.peers[i], sub, ts_conn_shard_list(sub, name, &h, &hn), msg,
                                 sizeof(msg));
        if (rc == TS_ENOENT)
            rc = 0; /* no dataset there: nothing to drop */
        else if (rc)
            ts_conn_set_error(c, "dataset %s: node %s cannot list its shards (%s): nothing dropped",
                              name, cl->peers[f.peers[i]].id, msg[0] ? msg : ts_conn_error(cl->c));
        for (size_t j = 0; !rc && j < hn; j++) {
            size_t x = 0;
            if (h[j].state != TS_SHARD_COMPLETE)
                continue;
            while (x < n && v[x].shard != h[j].shard)
                x++;
            if (x == n || v[x].size != h[j].size || v[x].crc != h[j].crc) {
                ts_conn_set_error(c,
                                  "dataset %s: node %s holds shard %u that was not converted: "
                                  "nothing dropped (run it again)",
                                  name, cl->peers[f.peers[i]].id, h[j].shard);
                rc = TS_EINCOMPLETE;
            }
        }
        free(h);
    }
    ts_cl_fan_end(&f);
    return rc;
}

/* Shard si's bytes (in a, checked) put back, chunk by chunk, on each node in nodes[0..nn) that
 * keeps its record: rebuilt from its fragments (k > 0), or, the dataset replicated again
 * already (k 0: a node that did not answer then), read from its replicas. */
static int restore_shard(tessera_client *c, struct ts_cluster *cl, const char *name,
                         const struct ts_shard_info *si, unsigned k, unsigned m,
                         const struct dropped *nodes, size_t nn, uint8_t *a)
{
    size_t len = (size_t)si->size, got = len;
    int rc = !len ? 0
             : k  ? ts_cl_ec_read(c, cl, name, si->shard, len, k, m, 0, len, a, NULL)
                  : ts_cl_read(c, cl, name, si->shard, 0, len, a, &got);

    if (!rc && (got != len || ts_crc32c(0, a, len) != si->crc)) {
        ts_conn_set_error(c, "%s/%u: %s, the bytes do not match the shard's CRC32C %08x", name,
                          si->shard, k ? "rebuilt from its fragments" : "read from its replicas",
                          si->crc);
        rc = TS_ECORRUPT;
    }
    for (size_t j = 0; !rc && j < nn; j++) {
        size_t p = nodes[j].peer;
        struct ts_shard_info here;
        tessera_client *sub;
        char msg[512] = "";
        rc = ts_cl_peer_conn(cl, p, 0, &sub);
        if (!rc)
            rc = ts_cl_peer_done(cl, p, sub, ts_conn_shard_stat(sub, name, si->shard, &here), msg,
                                 sizeof(msg));
        if (rc == TS_ENOENT) { /* not one of its replicas */
            rc = 0;
            continue;
        }
        if (!rc && (here.state != TS_SHARD_COMPLETE || here.size != si->size ||
                    here.crc != si->crc || !here.chunk_size)) {
            ts_conn_set_error(c,
                              "%s/%u on %s: its record (%llu bytes, CRC32C %08x) is not the "
                              "shard's (%llu bytes, %08x)",
                              name, si->shard, cl->peers[p].id, (unsigned long long)here.size,
                              here.crc, (unsigned long long)si->size, si->crc);
            rc = TS_ECORRUPT;
        }
        for (uint32_t idx = 0; !rc && idx < here.nchunks; idx++) {
            uint64_t at = (uint64_t)idx * here.chunk_size;
            size_t n = (size_t)TS_MIN((uint64_t)here.chunk_size, here.size - at);
            rc = ts_cl_peer_done(
                cl, p, sub, ts_conn_chunk_repair(sub, name, si->shard, idx, a + at, (uint32_t)n),
                msg, sizeof(msg));
        }
        if (rc)
            ts_conn_set_error(c, "%s/%u: putting its bytes back on %s: %s", name, si->shard,
                              cl->peers[p].id, msg[0] ? msg : ts_conn_error(cl->c));
    }
    return rc;
}

/* DATASET_TIER (k, m, 0) on the node of d, under the code it holds its replicas dropped by: its
 * bytes, put back, kept again (the node reads them all back first). */
static int keep_on_node(tessera_client *c, struct ts_cluster *cl, const char *name,
                        const struct dropped *d)
{
    tessera_client *sub;
    char msg[512] = "";
    int rc = ts_cl_peer_conn(cl, d->peer, 0, &sub);

    if (!rc)
        rc = ts_cl_peer_done(cl, d->peer, sub, ts_conn_dataset_tier(sub, name, d->k, d->m, 0), msg,
                             sizeof(msg));
    if (rc)
        ts_conn_set_error(c, "dataset %s: node %s: %s", name, cl->peers[d->peer].id,
                          msg[0] ? msg : ts_conn_error(cl->c));
    return rc;
}

/* Back to replicated: the bytes put back where they were dropped, kept again on every node,
 * and only then the fragments removed. Run on a dataset that is replicated already, it does
 * the same for the nodes that still hold their replicas dropped (a node marked out that did
 * not answer then, and answers now), from the replicas' bytes. */
static int tier_back(tessera_client *c, struct ts_cluster *cl, const char *name,
                     const struct ts_dataset_policy *pol, tessera_tier_progress progress, void *arg)
{
    struct ts_shard_info *v = NULL;
    uint64_t total = 0, done = 0, big = 0;
    size_t n = 0, nn = 0;
    struct dropped *nodes = NULL;
    uint8_t *a = NULL;
    int rc = dropped_nodes(c, cl, name, &nodes, &nn);

    if (!rc && nn)
        rc = ts_cl_shard_list(c, cl, name, &v, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        total += v[i].size;
        big = TS_MAX(big, v[i].size);
    }
    if (!rc && nn && !(a = malloc(big ? big : 1)))
        rc = TS_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = restore_shard(c, cl, name, &v[i], pol->ec_k, pol->ec_m, nodes, nn, a);
        done += v[i].size;
        if (!rc && progress)
            progress(arg, (uint32_t)(i + 1), (uint32_t)n, done, total);
    }
    /* Each node checks its bytes: a node holding them dropped under another code than the
     * cluster's (it missed a tier back, and a later conversion) under its own, then the rest;
     * only then is any fragment store removed (0, 0, 0). */
    for (size_t j = 0; !rc && j < nn; j++)
        if (nodes[j].k != pol->ec_k || nodes[j].m != pol->ec_m)
            rc = keep_on_node(c, cl, name, &nodes[j]);
    if (!rc && nn && pol->ec_k)
        rc = tier_all(c, cl, name, pol->ec_k, pol->ec_m, 0);
    if (!rc)
        rc = tier_all(c, cl, name, 0, 0, 0);
    free(a);
    free(v);
    free(nodes);
    return rc;
}

int ts_cl_dataset_tier(tessera_client *c, struct ts_cluster *cl, const char *name, unsigned k,
                       unsigned m, tessera_tier_progress progress, void *arg)
{
    struct ts_shard_info *v = NULL;
    struct ts_dataset_info d;
    uint64_t total = 0, done = 0, big = 0;
    uint8_t *a = NULL, *b = NULL;
    size_t n = 0;
    int rc;

    if ((k || m) && (k < 1 || k > TS_EC_MAX_K || m < 1 || m > TS_EC_MAX_M)) {
        ts_conn_set_error(c, "ec:%u+%u: K must be 1 to %d and M 1 to %d", k, m, TS_EC_MAX_K,
                          TS_EC_MAX_M);
        return TS_EINVAL;
    }
    rc = ts_cl_dataset_stat(c, cl, name, &d);
    if (rc)
        return rc;
    if (d.state != TS_DS_SEALED) {
        ts_conn_set_error(c, "dataset %s is open: only sealed datasets are tiered", name);
        return TS_EINVAL;
    }
    if (k && d.policy.ec_k && (d.policy.ec_k != k || d.policy.ec_m != m)) {
        ts_conn_set_error(c, "dataset %s is ec:%u+%u already: tier it back to replicated first",
                          name, d.policy.ec_k, d.policy.ec_m);
        return TS_EINVAL;
    }
    if (!k)
        return tier_back(c, cl, name, &d.policy, progress, arg);
    /* Every shard converted (again, on a second run: the fragments already put are confirmed,
     * and a dropped shard is read through them), then checked against what each node holds. */
    rc = ts_cl_shard_list(c, cl, name, &v, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        total += v[i].size;
        big = TS_MAX(big, v[i].size);
    }
    if (!rc && n && (!(a = malloc(big ? big : 1)) || !(b = malloc(big ? big : 1))))
        rc = TS_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = tier_shard(c, cl, name, &v[i], k, m, a, b);
        done += v[i].size;
        if (!rc && progress)
            progress(arg, (uint32_t)(i + 1), (uint32_t)n, done, total);
    }
    if (!rc)
        rc = nodes_hold_converted(c, cl, name, v, n);
    if (!rc)
        rc = tier_all(c, cl, name, k, m, 1);
    free(a);
    free(b);
    free(v);
    return rc;
}

/* The dataset's policy as a node that is up, other than node `skip`, holds it: the first of
 * them that has the dataset answers (TS_ENOENT: none has it). */
static int policy_without(struct ts_cluster *cl, const char *name, size_t skip,
                          struct ts_dataset_info *out)
{
    int rc = TS_ENOENT;

    for (size_t i = 0; i < cl->map->n; i++) {
        tessera_client *sub;
        char msg[256];
        size_t p;
        int r;
        if (i == skip || cl->map->nodes[i].state != TS_NODE_UP ||
            ts_cl_node_peer(cl, cl->map, i, &p) || ts_cl_peer_conn(cl, p, 1, &sub))
            continue;
        r = ts_cl_peer_done(cl, p, sub, ts_conn_dataset_policy(sub, name, out), msg, sizeof(msg));
        if (r == 0)
            return 0;
        if (r != TS_ENOENT)
            rc = r;
    }
    return rc;
}

int ts_cl_node_tier_check(tessera_client *c, struct ts_cluster *cl, const char *id)
{
    struct ts_dataset_info *ds = NULL;
    tessera_client *sub;
    char msg[256];
    size_t p, n = 0;
    int node = cl->map ? ts_map_find(cl->map, id) : -1, rc = 0;

    if (node < 0 || ts_cl_node_peer(cl, cl->map, (size_t)node, &p) ||
        ts_cl_peer_conn(cl, p, 1, &sub) ||
        ts_cl_peer_done(cl, p, sub, ts_conn_dataset_list(sub, &ds, &n), msg, sizeof(msg)))
        return 0; /* it does not answer: nothing to check (docs/operations.md "Tiering") */
    for (size_t i = 0; !rc && i < n; i++) {
        const struct ts_dataset_policy *mine = &ds[i].policy;
        struct ts_dataset_info d;
        char theirs[64];
        int r;
        if (!mine->ec_dropped)
            continue;
        r = policy_without(cl, ds[i].name, (size_t)node, &d);
        if (r == TS_ENOENT)
            continue; /* no other node has it (deleted meanwhile): nothing to disagree with */
        if (r) {
            ts_conn_set_error(c,
                              "node %s holds dataset %s's replicas without their bytes, and no "
                              "other node says how the dataset is tiered (%s): not brought up",
                              id, ds[i].name, ts_strerror(r));
            rc = r;
            break;
        }
        if (d.policy.ec_dropped && d.policy.ec_k == mine->ec_k && d.policy.ec_m == mine->ec_m)
            continue;
        if (!d.policy.ec_k)
            snprintf(theirs, sizeof(theirs), "replicated");
        else if (!d.policy.ec_dropped)
            snprintf(theirs, sizeof(theirs), "ec:%u+%u with the replicas' bytes kept",
                     d.policy.ec_k, d.policy.ec_m);
        else
            snprintf(theirs, sizeof(theirs), "ec:%u+%u", d.policy.ec_k, d.policy.ec_m);
        ts_conn_set_error(c,
                          "node %s holds dataset %s's replicas without their bytes under "
                          "ec:%u+%u, but the other nodes hold it %s: it was tiered again while "
                          "the node was away. Run 'tessera dataset tier %s replicated' (it puts "
                          "the bytes back on the node), then bring it up",
                          id, ds[i].name, mine->ec_k, mine->ec_m, theirs, ds[i].name);
        rc = TS_EBUSY;
    }
    free(ds);
    return rc;
}
