/*
 * libtessera in cluster mode: administration. Pushing a map file to every node it lists
 * (tessera_map_push_file, also from a single-node handle: a bare router of its own) and
 * failing over a PG's primary (tessera_failover). The public calls (api.c) check their
 * arguments and come here; the nodes are reached over sub-connections (ts_conn_*).
 */
#include "cluster_internal.h"

#include "ts_map.h"

#define FAC "client"

/* ---- administration -------------------------------------------------------------------------- */

/*
 * Pushes m to every node of m but skip_node (up_only: to those that are up; nodes that are not
 * up get a short connect timeout, and their failures do not count). *pushed: how many accepted. The
 * first failure of a node that is up, with every failure in why.
 */
static int push_all(struct ts_cluster *cl, const struct ts_map *m, size_t skip_node, int up_only,
                    size_t *pushed, char *why)
{
    int rc, first = 0;

    *pushed = 0;
    for (size_t i = 0; i < m->n; i++) {
        tessera_client *sub;
        uint64_t e = 0;
        const char *msg;
        size_t p;
        int up = m->nodes[i].state == TS_NODE_UP;
        if (i == skip_node || (up_only && !up))
            continue;
        rc = ts_cl_node_peer(cl, m, i, &p);
        if (rc)
            return rc;
        rc = ts_cl_peer_conn(cl, p, !up, &sub);
        if (!rc) {
            rc = ts_conn_map_push(sub, m, &e);
            msg = ts_conn_error(sub);
            if (!rc && e != m->epoch) {
                rc = TS_ESTALE;
                msg = "it keeps a newer epoch";
            }
        } else {
            msg = ts_conn_error(cl->c);
        }
        if (!rc) {
            (*pushed)++;
            continue;
        }
        ts_cl_why_add(why, "%s (%s)%s: %s: %s", cl->peers[p].id, cl->peers[p].addr,
                      up ? "" : ", not up in the map", ts_errname(rc),
                      msg[0] ? msg : ts_strerror(rc));
        if (up && !first)
            first = rc;
    }
    return first;
}

int ts_cl_map_push_file(tessera_client *c, struct ts_cluster *cl, const char *path,
                        uint64_t *new_epoch)
{
    struct ts_cluster *bare = NULL;
    struct ts_map *m = NULL, *got;
    char err[512], why[WHY_LEN] = "";
    uint64_t hi, e;
    size_t pushed;
    int rc;

    if (!cl) {
        /* A single-node handle: connections to the file's nodes of its own. */
        rc = ts_cl_create(&bare, c, NULL, NULL, ts_conn_opts(c));
        if (rc)
            return rc;
        cl = bare;
    }
    err[0] = '\0';
    rc = ts_map_parse_file(path, &m, err, sizeof(err));
    if (rc) {
        ts_cl_err(cl, "%s", err[0] ? err : ts_strerror(rc));
        goto out_free;
    }
    /* Higher than any epoch in sight: the file's, ours, every reachable node's. */
    hi = TS_MAX(m->epoch, cl->epoch);
    if (bare && ts_conn_map_get(c, &got, &e) == 0) {
        hi = TS_MAX(hi, e);
        ts_map_free(got);
    }
    for (size_t i = 0; i < m->n; i++) {
        tessera_client *sub;
        size_t p;
        if (ts_cl_node_peer(cl, m, i, &p) != 0 ||
            ts_cl_peer_conn(cl, p, m->nodes[i].state != TS_NODE_UP, &sub) != 0)
            continue;
        if (ts_conn_map_get(sub, &got, &e) == 0) {
            hi = TS_MAX(hi, e);
            ts_map_free(got);
        }
    }
    if (hi >= TS_MAP_MAX_EPOCH) {
        ts_cl_err(cl, "the epoch in sight (%llu) leaves no newer one", (unsigned long long)hi);
        rc = TS_EINVAL;
        goto out_free;
    }
    /* The operator's file is theirs: it is never rewritten (the nodes keep the map they run). */
    m->epoch = hi + 1;
    if (new_epoch)
        *new_epoch = m->epoch;
    rc = push_all(cl, m, SIZE_MAX, 0, &pushed, why);
    TS_INFO(FAC, "map epoch %llu from %s pushed to %zu of %zu nodes", (unsigned long long)m->epoch,
            path, pushed, m->n);
    if (why[0])
        ts_cl_err(cl, "epoch %llu reached %zu of %zu nodes; %s", (unsigned long long)m->epoch,
                  pushed, m->n, why);
    if (!bare) {
        ts_cl_adopt(cl, m);
        m = NULL;
    }
out_free:
    ts_map_free(m);
    ts_cl_free(bare);
    return rc;
}

int ts_cl_failover(tessera_client *c, struct ts_cluster *cl, uint32_t pg, uint64_t *new_epoch)
{
    char why[WHY_LEN] = "";
    struct ts_map *m;
    int order[1], rc;
    size_t old, pushed;

    ts_cl_refresh(cl, NO_PEER); /* the newest map any node has */
    if (pg >= cl->map->pg_count) {
        ts_cl_err(cl, "PG %u does not exist: the cluster has PGs 0 to %u", pg,
                  cl->map->pg_count - 1);
        return TS_EINVAL;
    }
    if (ts_map_pg_order(cl->map, pg, order, 1) == 0) {
        ts_cl_err(cl, "PG %u has no primary: no node is up (map epoch %llu)", pg,
                  (unsigned long long)cl->epoch);
        return TS_EUNAVAIL;
    }
    m = ts_map_dup(cl->map);
    if (!m)
        return TS_ENOMEM;
    old = (size_t)order[0];
    m->nodes[old].state = TS_NODE_DOWN;
    m->epoch++;
    if (ts_map_pg_order(m, pg, order, 1) == 0) {
        ts_cl_err(cl, "PG %u: %s is its last node that is up; nothing to promote", pg,
                  m->nodes[old].id);
        ts_map_free(m);
        return TS_EUNAVAIL;
    }
    TS_INFO(FAC, "failover of PG %u: %s down, %s primary, map epoch %llu", pg, m->nodes[old].id,
            m->nodes[order[0]].id, (unsigned long long)m->epoch);
    rc = push_all(cl, m, old, 1, &pushed, why);
    if (new_epoch)
        *new_epoch = m->epoch;
    if (why[0])
        ts_cl_err(cl, "epoch %llu reached %zu nodes; %s", (unsigned long long)m->epoch, pushed,
                  why);
    ts_cl_adopt(cl, m);
    return rc;
}
