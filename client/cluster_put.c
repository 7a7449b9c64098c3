/*
 * libtessera in cluster mode: writes. An upload goes to its PG's primary (ts_conn_put or
 * ts_conn_put_fd on its sub-connection), retried under a newer map (TS_ESTALE), while the
 * primary is peering (TS_EBUSY), and once with the primary a refreshed map names when it is
 * unreachable.
 */
#include "cluster_internal.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "ts_map.h"

#define FAC "client"

/* ---- writes --------------------------------------------------------------------------------- */

int ts_cl_put(tessera_client *c, struct ts_cluster *cl, const char *name, uint32_t shard,
              const void *buf, size_t len, const uint64_t *records, uint32_t nrecords, int fd,
              uint64_t size)
{
    off_t start = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : 0;
    int order[1], rc, adopted, unreachable, refreshed = 0, stale = 0;
    uint64_t busy_ns = 0;
    char msg[512];
    tessera_client *sub;
    uint32_t pg;
    size_t p;

    for (;;) {
        pg = ts_map_pg_of(cl->map, name, shard);
        if (ts_map_pg_order(cl->map, pg, order, 1) == 0) {
            ts_cl_err(cl, "PG %u of %s/%u has no primary: no node is up (map epoch %llu)", pg, name,
                      shard, (unsigned long long)cl->epoch);
            return TS_EUNAVAIL;
        }
        rc = ts_cl_node_peer(cl, cl->map, (size_t)order[0], &p);
        if (rc)
            return rc;
        adopted = 0;
        unreachable = 0;
        rc = ts_cl_peer_conn(cl, p, 0, &sub);
        if (rc) {
            snprintf(msg, sizeof(msg), "%s", ts_conn_error(c));
            unreachable = 1;
        } else {
            rc = fd < 0 ? ts_conn_put(sub, name, shard, buf, len, records, nrecords)
                        : ts_conn_put_fd(sub, name, shard, fd, size);
            snprintf(msg, sizeof(msg), "%s", ts_conn_error(sub));
            adopted = ts_cl_check(cl, p);
            if (!rc)
                return 0;
            if (ts_cl_lost(rc)) {
                cl->peers[p].failed_ns = ts_now_mono_ns();
                unreachable = 1;
            }
        }
        if (rc == TS_ESTALE && adopted && ++stale < MAX_TRIES) {
            TS_INFO(FAC, "write of %s/%u: retrying under map epoch %llu", name, shard,
                    (unsigned long long)cl->epoch);
        } else if (rc == TS_EBUSY && busy_ns < (uint64_t)cl->timeout_ms * 1000000u) {
            /* The primary is peering (catching up before it takes writes): wait and retry. */
            struct timespec ts = {0, 100 * 1000000};
            if (busy_ns == 0)
                TS_INFO(FAC, "write of %s/%u: %s; retrying", name, shard, msg);
            nanosleep(&ts, NULL);
            busy_ns += 100ull * 1000000;
            if (busy_ns % (1000ull * 1000000) == 0)
                ts_cl_refresh(cl, NO_PEER); /* a newer map may name another primary */
        } else if (unreachable && !refreshed) {
            refreshed = 1;
            TS_WARN(FAC, rc,
                    "primary %s (%s) of PG %u is unreachable: %s; asking the other nodes "
                    "for a newer map",
                    cl->peers[p].id, cl->peers[p].addr, pg, msg);
            ts_cl_refresh(cl, p);
        } else {
            break;
        }
        if (fd >= 0 && (start < 0 || lseek(fd, start, SEEK_SET) < 0)) {
            ts_cl_err(cl, "primary %s of PG %u: %s (the input cannot be read again to retry)",
                      cl->peers[p].id, pg, msg);
            return rc;
        }
    }
    if (unreachable)
        ts_cl_err(cl,
                  "primary %s (%s) of PG %u for %s/%u is unreachable: %s (map epoch %llu; "
                  "'tessera failover %u' promotes another replica)",
                  cl->peers[p].id, cl->peers[p].addr, pg, name, shard, msg,
                  (unsigned long long)cl->epoch, pg);
    else if (rc == TS_ESTALE)
        ts_cl_err(cl, "primary %s of PG %u refused the write as stale under map epoch %llu: %s",
                  cl->peers[p].id, pg, (unsigned long long)cl->epoch, msg);
    else
        ts_cl_err(cl, "%s: %s", cl->peers[p].id, msg);
    return rc;
}
