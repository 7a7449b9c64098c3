/*
 * The plan reader's hints: a thread with a connection of its own walks the plan ahead of the
 * reader's connections and tells the nodes (HINT) the ranges of the next hint_bytes past the
 * positions already claimed (those are being read), so the nodes read those chunks from disk
 * into their caches before the reads come (docs/client.md "Hints"). It keeps a ring of the
 * lengths it hinted past the claimed position; as units are claimed the ring drains and more is
 * hinted. A node over its bounds says where it dropped hints: those positions are hinted again
 * once a quarter of what is hinted has been claimed (the node's queue is the flow control). A
 * unit it cannot place (a record index that will not load) is passed over: the read reports it.
 * Hints never wait for the reads and never fail them.
 */
#include "reader_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define HINT_UNITS_MAX 65536u /* units hinted past the claimed position at most (the ring) */

/* Positions claimed leave the ring (lock held). */
static void ring_drain(struct tessera_reader *r)
{
    while (r->hint_tail < r->next_hint && r->hint_tail < r->next_claim) {
        r->hint_ahead -= r->hint_len[r->hint_tail % r->hint_cap];
        r->hint_tail++;
    }
    if (r->next_hint < r->next_claim) { /* claimed before they were hinted: go on from there */
        r->next_hint = r->next_claim;
        r->hint_tail = r->next_claim;
        r->hint_ahead = 0;
    }
}

/* Whether position k may be hinted now (lock held). */
static int room(const struct tessera_reader *r, uint64_t k)
{
    return !r->hint_full && k < r->len && k - r->hint_tail < r->hint_cap &&
           r->hint_ahead < r->o.hint_bytes;
}

/* Sleeps until a quarter of what is hinted ahead has been claimed, or the reader stops. */
static void hint_wait(struct tessera_reader *r)
{
    r->hint_wake_at = r->next_claim + TS_MAX(1, (r->next_hint - r->next_claim) / 4);
    r->hint_waits = 1;
    pthread_cond_wait(&r->hint_cv, &r->m);
    r->hint_waits = 0;
    r->hint_full = 0;
}

static void *hint_main(void *arg)
{
    struct tessera_reader *r = arg;
    struct ts_readv v[TS_HINT_MAX];
    uint64_t at[TS_HINT_MAX]; /* the position of each range */
    size_t len[TS_HINT_MAX];
    char msg[512];

    pthread_mutex_lock(&r->m);
    while (!r->stop) {
        uint64_t k0, k, n = 0, bytes = 0, budget, stop_at;
        struct ts_hint_result res = {0, 0, 0, TS_HINT_MAX};

        ring_drain(r);
        if (!room(r, r->next_hint)) {
            hint_wait(r);
            continue;
        }
        /* A batch of positions, at most the budget left (at least one), located outside the
         * lock (record indexes may be fetched). */
        k0 = r->next_hint;
        budget = r->o.hint_bytes - r->hint_ahead;
        pthread_mutex_unlock(&r->m);
        for (k = k0; k - k0 < TS_HINT_MAX && k < r->len && (k == k0 || bytes < budget); k++) {
            struct ts_unit_loc l;
            if (ts_reader_locate(r, r->hint_c, k, &l, msg, sizeof(msg)) != 0)
                l.len = 0; /* not hinted: its read will say what is wrong */
            len[k - k0] = l.len;
            bytes += l.len;
            if (l.len) {
                at[n] = k;
                v[n++] = (struct ts_readv){l.shard, l.offset, l.len, NULL, 0, 0};
            }
        }
        if (n && ts_client_hint(r->hint_c, r->dataset, v, n, &res) == TS_ENOTSUP) {
            pthread_mutex_lock(&r->m);
            break; /* a node without HINT: the reads go on without hints */
        }
        stop_at = res.first_dropped < n ? at[res.first_dropped] : k;
        pthread_mutex_lock(&r->m);
        for (uint64_t p = k0; p < stop_at && r->next_hint == p; p++) {
            r->hint_len[p % r->hint_cap] = len[p - k0];
            r->hint_ahead += len[p - k0];
            r->next_hint++;
            r->st.hinted_units += len[p - k0] != 0;
        }
        r->st.hint_queued += res.queued;
        r->st.hint_dropped += res.dropped;
        if (stop_at < k)
            r->hint_full = 1; /* a node is full: wait for the reads before hinting again */
    }
    pthread_mutex_unlock(&r->m);
    return NULL;
}

int ts_reader_hints_start(struct tessera_reader *r, char *err, size_t errlen)
{
    int rc;

    if (r->o.hint_bytes == TESSERA_READER_NO_HINTS || r->o.hint_bytes == 0)
        return 0;
    r->hint_cap = (uint32_t)TS_MIN((uint64_t)HINT_UNITS_MAX, TS_MAX(r->len, 1));
    r->hint_len = calloc(r->hint_cap, sizeof(*r->hint_len));
    if (!r->hint_len)
        return TS_ENOMEM;
    rc = ts_client_open_ex(&r->hint_c, &r->copts, err, errlen);
    if (rc)
        return rc;
    ts_client_route_salt(r->hint_c, TS_READER_SALT);
    if (pthread_create(&r->hint_th, NULL, hint_main, r) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "cannot start the reader's hint thread");
        return TS_ENOMEM;
    }
    r->hint_started = 1;
    return 0;
}

void ts_reader_hints_stop(struct tessera_reader *r)
{
    if (r->hint_started)
        pthread_join(r->hint_th, NULL);
    r->hint_started = 0;
    tessera_client_close(r->hint_c);
    r->hint_c = NULL;
    free(r->hint_len);
    r->hint_len = NULL;
}
