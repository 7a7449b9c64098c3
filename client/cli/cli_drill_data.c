/*
 * tessera CLI: the drills on data (tessera drill corrupt-chunk | fringe-lag; see cli_drill.c).
 *
 * corrupt-chunk: a core replica (not the primary) of the PG the load writes next is stopped
 * (SIGTERM: it flushes), bytes are flipped in every chunk file of the drill's dataset it wrote
 * since the drill began (and in the blob files of a store that keeps chunks in RocksDB), and
 * it is started again. Every
 * acknowledged shard it holds is then read from it alone: a flipped chunk must come back as a
 * checksum error (never as wrong bytes), the cluster's reads must not fail (they go to another
 * replica), and the node must repair what it reported from its PG's primary.
 *
 * disk-full: a node whose data directory is on a filesystem with at most DISK_FULL_MAX free
 * (the drill will not fill a big disk) is filled by a file beside its data (data_dir/drill-
 * balloon) until half of the node's reserve is left (below the reserve tesserad refuses
 * writes; the rest is the room it keeps for its engine's own metadata), for a third of the
 * drill, then the file goes. Writes of PGs the node
 * leads are refused with TS_ENOSPC (counted) and none is acknowledged unless stored; where it is
 * a replica the others carry the write; reads go on; writes come back once the space does,
 * without a restart.
 *
 * fringe-lag: the dataset has a fringe replica; the fringe replica of the PG the load writes
 * next is stopped (SIGSTOP) for a third of the drill, then resumed. From then on the load writes
 * only shards of PGs the node is no core replica of (where it is a core replica a stopped node
 * stalls writes as slow-node shows); there writes go on, a fringe being asynchronous. The
 * primary's STATUS shows the lag grow (the drill reports its largest value), and "recovered" is
 * the moment it is back to 0.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "cli_drill.h"
#include "ts_map.h"

#define DISK_FULL_MAX (8ull << 30) /* free bytes at most on a filesystem the drill fills */

static uint64_t now_ns(void)
{
    return ts_now_mono_ns();
}

/* Replica k of the PG the load writes next, or -1. */
static int replica_next(struct drill *d, size_t k)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    int order[8];

    if (!m || ts_map_pg_order(m, ts_map_pg_of(m, d->ds, d->next), order, k + 1) != k + 1)
        return -1;
    return order[k];
}

/* Reads every acknowledged shard that node i holds from it alone; *bad gets the ones that came
 * back as checksum errors, *wrong the ones whose bytes differed (must never happen). */
static void read_from_node(struct drill *d, int i, uint32_t upto, uint8_t *bad, uint64_t *nbad,
                           uint64_t *wrong)
{
    uint64_t deadline = now_ns() + 30ull * 1000000000; /* for the node to serve again */

    *nbad = *wrong = 0;
    for (uint32_t s = 0; s < upto; s++) {
        int rc;
        if (!d->acked[s] || (bad && bad[s] == 2) || !drill_core_of(d, s, i))
            continue;
        /* Restarted, the node serves a PG once its primary has compared its log: wait. */
        rc = drill_read_alone(d, i, s, deadline, 0);
        if (rc == TS_ECORRUPT) {
            (*nbad)++;
            if (bad)
                bad[s] = 1;
        } else if (rc == DRILL_OTHER_BYTES) {
            (*wrong)++;
        }
    }
}

int drill_corrupt_chunk(struct drill *d, double dur, const char *logdir)
{
    uint64_t nbad = 0, wrong = 0, still = 0, wrong2 = 0;
    uint8_t *bad = NULL;
    time_t since = time(NULL) - (time_t)(dur + 2);
    char out[8192], arg[32], *line, *save = NULL;
    uint32_t upto;
    int i = replica_next(d, 1), rc, gone = 0, flip_rc;

    rc = drill_begin(d, i, "the next PG has no second replica");
    if (!rc)
        rc = drill_act(d, i, "term", NULL, NULL, out, sizeof(out));
    if (rc)
        return rc;
    for (int t = 0; t < 300 && !gone; t++) {
        drill_load_for(d, 0.05); /* it drains its connections (drain_timeout_s), then exits */
        gone = drill_act(d, i, "gone", NULL, NULL, out, sizeof(out)) == 0;
    }
    if (!gone) {
        drill_act(d, i, "kill", NULL, NULL, out, sizeof(out));
        usleep(200000);
    }
    drill_note(d, "stopped %s (SIGTERM: its memtables flushed)", d->node);
    snprintf(arg, sizeof(arg), "%lld", (long long)since);
    rc = drill_act(d, i, "flip", arg, NULL, out, sizeof(out));
    flip_rc = rc;
    if (rc)
        drill_note(d, "flip failed: %s", d->x->local);
    for (line = strtok_r(out, "\n", &save); !rc && line; line = strtok_r(NULL, "\n", &save)) {
        int k = 0;
        if (sscanf(line, "flipped %d", &k) == 1)
            d->flipped += (uint64_t)k;
        drill_note(d, "%s", line);
    }
    if (!d->flipped)
        drill_note(d, "no chunk or blob file of %s changed during the drill: nothing flipped",
                   d->node);
    rc = drill_restart(d, logdir);
    d->failover_ns = now_ns(); /* the operator's answer: the node is back */
    if (rc)
        return rc;
    if (flip_rc || !d->flipped) {
        /* Nothing damaged: the drill would test nothing. The node is back; say so and fail. */
        snprintf(d->x->local, sizeof(d->x->local), "corrupt-chunk flipped nothing on %s%s%s",
                 d->node, flip_rc ? ": " : " (no chunk or blob file held the drill's chunks)",
                 flip_rc ? ts_strerror(flip_rc) : "");
        return flip_rc ? flip_rc : TS_EIO;
    }
    drill_load_for(d, dur / 4);
    upto = d->next;
    bad = calloc(upto ? upto : 1, 1);
    if (!bad)
        return TS_ENOMEM;
    read_from_node(d, i, upto, bad, &nbad, &wrong);
    if (nbad)
        d->detect_ns = now_ns(); /* its reads found the flipped bytes */
    d->node_corrupt = nbad;
    d->checksum_errors += nbad;
    drill_note(d, "read every acknowledged shard from %s alone: %llu checksum errors, %llu wrong",
               d->node, (unsigned long long)nbad, (unsigned long long)wrong);
    /* The reads reported them; the node asks its primaries for the chunks. Read those again. */
    for (int t = 0; t < 20 && nbad; t++) {
        drill_load_for(d, 0.5);
        for (uint32_t s = 0; s < upto; s++)
            if (bad[s] == 0)
                bad[s] = 2; /* only the bad ones again */
            else if (bad[s] == 1)
                bad[s] = 0;
        read_from_node(d, i, upto, bad, &still, &wrong2);
        wrong += wrong2;
        if (!still)
            break;
    }
    d->node_still_bad = still;
    if (!still)
        d->recover_ns = now_ns(); /* the node holds good copies again */
    drill_note(d, "after repair: %llu shards still bad on %s", (unsigned long long)still, d->node);
    free(bad);
    if (wrong) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "%s handed out %llu shards with wrong bytes instead of a checksum error", d->node,
                 (unsigned long long)wrong);
        return TS_ECORRUPT;
    }
    return 0;
}

/* The lag (ops, seconds) the PG's primary reports for node `id`, summed over PGs. */
static void lag_of(struct drill *d, int primary, const char *id, uint64_t *ops, double *secs)
{
    struct json_object *doc = drill_status_of(d, (size_t)primary), *rep, *arr, *v;

    *ops = 0;
    *secs = 0;
    if (!doc)
        return;
    if (json_object_object_get_ex(doc, "replication", &rep) &&
        json_object_object_get_ex(rep, "lag", &arr) && json_object_is_type(arr, json_type_array))
        for (size_t k = 0; k < json_object_array_length(arr); k++) {
            struct json_object *o = json_object_array_get_idx(arr, k);
            if (!json_object_object_get_ex(o, "node", &v) || strcmp(json_object_get_string(v), id))
                continue;
            if (json_object_object_get_ex(o, "lag_ops", &v))
                *ops += (uint64_t)json_object_get_int64(v);
            if (json_object_object_get_ex(o, "lag_s", &v) && json_object_get_double(v) > *secs)
                *secs = json_object_get_double(v);
        }
    json_object_put(doc);
}

int drill_fringe_lag(struct drill *d, double dur)
{
    int primary = replica_next(d, 0), i = replica_next(d, 3), rc;
    uint64_t end, ops;
    char out[256];
    double s;

    rc = drill_begin(d, primary < 0 ? -1 : i,
                     "the next PG has no fringe replica (the 4th): fringe-lag needs 4 nodes up");
    d->avoid = i;
    if (!rc)
        rc = drill_act(d, i, "stop", NULL, NULL, out, sizeof(out));
    if (rc)
        return rc;
    out[strcspn(out, "\n")] = '\0';
    drill_note(d, "SIGSTOP fringe replica %s (%s) for %.1f s", d->node, out, dur / 3);
    end = now_ns() + (uint64_t)(dur / 3 * 1e9);
    while (now_ns() < end) {
        drill_load_for(d, 0.25);
        lag_of(d, primary, d->node, &ops, &s);
        if (ops && !d->detect_ns)
            d->detect_ns = now_ns(); /* the lag shows */
        if (ops > d->lag_max_ops)
            d->lag_max_ops = ops;
        if (s > d->lag_max_s)
            d->lag_max_s = s;
    }
    rc = drill_act(d, i, "cont", NULL, NULL, out, sizeof(out));
    if (rc)
        return rc;
    d->failover_ns = now_ns();
    drill_note(d, "SIGCONT %s: lag was up to %llu ops, %.2f s", d->node,
               (unsigned long long)d->lag_max_ops, d->lag_max_s);
    for (int t = 0; t < 200; t++) {
        drill_load_for(d, 0.1);
        lag_of(d, primary, d->node, &ops, &s);
        if (!ops)
            break;
    }
    d->recover_ns = now_ns(); /* caught up (the load's own recovery is not at stake) */
    d->phase = 2;
    drill_note(d, "%s caught up (lag %llu ops)", d->node, (unsigned long long)ops);
    return ops ? TS_ETIMEDOUT : 0;
}

/* The node disk-full may fill: a local one whose data dir's filesystem has at most
 * DISK_FULL_MAX free; -1 (d->x->local says why) when there is none. */
int drill_disk_full_pick(struct drill *d)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    char out[1400], dir[1100], seen[1024] = "";
    int i = -1;

    /* The node the drill may fill: one on a small enough filesystem. */
    for (size_t k = 0; k < m->n && i < 0; k++) {
        unsigned long long avail = 0;
        if (m->nodes[k].state != TS_NODE_UP ||
            drill_act(d, (int)k, "datadir", NULL, NULL, out, sizeof(out)) != 0 ||
            sscanf(out, "%1099s %llu", dir, &avail) != 2)
            continue;
        if (avail <= DISK_FULL_MAX)
            i = (int)k;
        else
            snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), "%s%s %llu GiB",
                     seen[0] ? ", " : "", m->nodes[k].id, (unsigned long long)(avail >> 30));
    }
    if (i < 0) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "no local node's data dir is on a filesystem with at most %llu GiB free (%.300s): "
                 "disk-full fills only such a one; put a node's data dir on a small filesystem "
                 "(e.g. a tmpfs or a loop device) to drill it",
                 (unsigned long long)(DISK_FULL_MAX >> 30), seen[0] ? seen : "none is local");
        return -1;
    }
    return i;
}

int drill_disk_full(struct drill *d, double dur)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    char out[1400], dir[1100] = "", arg[32];
    struct json_object *doc, *dj, *v;
    unsigned long long bytes = 0, left = 0;
    uint64_t end, reserve = 0;
    int i = drill_disk_full_pick(d), rc;

    if (i < 0)
        return TS_EINVAL;
    snprintf(d->node, sizeof(d->node), "%s", m->nodes[i].id);
    doc = drill_status_of(d, (size_t)i);
    if (doc && json_object_object_get_ex(doc, "disk", &dj) &&
        json_object_object_get_ex(dj, "reserve_bytes", &v))
        reserve = (uint64_t)json_object_get_int64(v);
    json_object_put(doc);
    snprintf(arg, sizeof(arg), "%llu", (unsigned long long)(reserve / 2));
    d->phase = 1;
    d->act_ns = now_ns();
    rc = drill_act(d, i, "fill", arg, NULL, out, sizeof(out)); /* down to half the reserve */
    if (rc)
        return rc;
    sscanf(out, "%llu %1099s %llu", &bytes, dir, &left);
    d->balloon = bytes;
    drill_note(d, "filled %s's filesystem (%s): %llu bytes, %llu left", d->node, dir, bytes, left);
    end = now_ns() + (uint64_t)(dur / 3 * 1e9);
    while (now_ns() < end)
        drill_load_for(d, 0.1);
    rc = drill_act(d, i, "unfill", NULL, NULL, out, sizeof(out));
    d->failover_ns = now_ns(); /* the operator's answer: space again */
    drill_note(d,
               "removed the balloon: %llu writes were refused with TS_ENOSPC meanwhile (the first "
               "write that failed: %s)",
               (unsigned long long)d->enospc, d->first_err[0] ? d->first_err : "none");
    return rc;
}
