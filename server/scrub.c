/*
 * Scrubs: the one a client asks for (SCRUB, ops.c, on the maintenance thread) and the
 * scheduled ones (storage.scrub_interval_s), on a thread of their own, paced at
 * storage.scrub_mb_s so that a serving node keeps serving. Both read every chunk back from disk
 * against its CRC32C, ask for each damaged one's repair (a replica's copy, or the monitor's
 * rebuild of a fragment: tsd_repair_chunk), compare this node's PG replicas with their
 * primaries (scrub_pgs.c), and count alike in the metrics.
 *
 * The schedule survives restarts: when the last whole-node scrub ended is kept in
 * DATA_DIR/scrub.last (seconds since the epoch). A node without that file (new, or upgraded)
 * starts its clock at its first start, so no scrub falls on a node the moment it comes up.
 */
#include "ops_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#undef FAC
#define FAC "scrub"
#define RETRY_S 3600 /* a scheduled scrub that failed is tried again this much later */

struct repair_cb {
    struct tsd_server *s;
    void (*cb)(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc);
    void *arg;
};

static void repair_then_cb(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc)
{
    struct repair_cb *r = arg;

    tsd_repair_chunk(r->s, ds, shard, idx, rc);
    if (r->cb)
        r->cb(r->arg, ds, shard, idx, rc);
}

static void last_path(const struct tsd_server *s, char *path, size_t cap)
{
    snprintf(path, cap, "%s/scrub.last", s->cfg->data_dir);
}

/* When the last whole-node scrub ended (wall seconds), 0 if never recorded. */
static int64_t last_read(const struct tsd_server *s)
{
    char path[4096];
    long long t = 0;
    FILE *f;

    last_path(s, path, sizeof(path));
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%lld", &t) != 1 || t < 0)
        t = 0;
    fclose(f);
    return t;
}

/* Recorded through a rename: a crash leaves the old time or the new one. Not synced: a power
 * cut may lose it, which only starts the clock again. */
static void last_write(struct tsd_server *s, int64_t t)
{
    char path[4096], tmp[4200];
    FILE *f;

    last_path(s, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f || fprintf(f, "%lld\n", (long long)t) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
        TS_WARN(FAC, ts_from_errno(errno), "cannot record the scrub's time in %s", path);
}

/* A whole-node scrub ended at t: recorded (under the lock: a client's scrub and a scheduled
 * one may end together), and the next scheduled one is an interval later. */
static void schedule_from(struct tsd_server *s, int64_t t)
{
    struct tsd_scrub_patrol *p = &s->patrol;
    int64_t every = s->cfg->scrub_interval_s;

    pthread_mutex_lock(&p->m);
    last_write(s, t);
    p->last = t;
    atomic_store(&s->scrub.next_s, every > 0 ? t + every : 0);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->m);
}

int tsd_scrub_run(struct tsd_server *s, const char *name, uint64_t bytes_per_s,
                  const _Atomic int *cancel,
                  void (*cb)(void *arg, const char *ds, uint32_t shard, uint32_t idx, int rc),
                  void *arg, struct ts_scrub_report *rep, struct tsd_scrub_pgs *pgs)
{
    struct tsd_scrub_stats *sc = &s->scrub;
    struct repair_cb r = {s, cb, arg};
    int rc;

    memset(pgs, 0, sizeof(*pgs));
    atomic_fetch_add(&sc->running, 1);
    rc = ts_store_scrub_paced(s->store, name, repair_then_cb, &r, rep, cancel, bytes_per_s);
    if (rep->corrupt)
        STAT_ADD(&s->workers[0].stats, corrupt_chunks, rep->corrupt);
    if (!rc)
        tsd_scrub_pgs(s, pgs, cancel); /* in a cluster: shards lost behind the log's back */
    atomic_fetch_add(&sc->corrupt, rep->corrupt);
    atomic_fetch_add(&sc->pg_differing, pgs->differing);
    atomic_fetch_add(&sc->runs, 1);
    atomic_store(&sc->last_end_ns, ts_now_wall_ns());
    atomic_fetch_sub(&sc->running, 1);
    if (!rc && !name)
        schedule_from(s, (int64_t)(ts_now_wall_ns() / 1000000000ull));
    return rc;
}

static void *patrol_main(void *arg)
{
    struct tsd_server *s = arg;
    struct tsd_scrub_patrol *p = &s->patrol;
    uint64_t pace = (uint64_t)s->cfg->scrub_mb_s * 1000000ull;

    pthread_setname_np(pthread_self(), "tsd-scrub");
    pthread_mutex_lock(&p->m);
    while (!p->stop) {
        int64_t now = (int64_t)(ts_now_wall_ns() / 1000000000ull);
        int64_t due = p->last + s->cfg->scrub_interval_s;
        struct ts_scrub_report rep = {0};
        struct tsd_scrub_pgs pgs;
        int rc;

        if (now < due) {
            struct timespec at = {(time_t)due, 0};
            pthread_cond_timedwait(&p->cv, &p->m, &at);
            continue;
        }
        pthread_mutex_unlock(&p->m);
        TS_INFO(FAC, "scheduled scrub: every chunk, at most %d MB/s (storage.scrub_mb_s)",
                s->cfg->scrub_mb_s);
        rc = tsd_scrub_run(s, NULL, pace, &p->cancel, NULL, NULL, &rep, &pgs);
        pthread_mutex_lock(&p->m);
        if (rc == 0) {
            TS_INFO(FAC,
                    "scheduled scrub done: %llu shards, %llu chunks, %llu bytes, %llu damaged "
                    "(repairs asked for), %u PGs short of their primary",
                    (unsigned long long)rep.shards, (unsigned long long)rep.chunks,
                    (unsigned long long)rep.bytes, (unsigned long long)rep.corrupt, pgs.differing);
        } else if (!p->stop) {
            now = (int64_t)(ts_now_wall_ns() / 1000000000ull); /* it may have run for days */
            TS_WARN(FAC, rc, "scheduled scrub failed; trying again in %d s", RETRY_S);
            p->last = now - s->cfg->scrub_interval_s + RETRY_S;
            atomic_store(&s->scrub.next_s, now + RETRY_S);
        }
    }
    pthread_mutex_unlock(&p->m);
    return NULL;
}

int tsd_scrub_patrol_start(struct tsd_server *s)
{
    struct tsd_scrub_patrol *p = &s->patrol;
    int64_t last, now;

    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (s->cfg->scrub_interval_s <= 0)
        return 0;
    last = last_read(s);
    now = (int64_t)(ts_now_wall_ns() / 1000000000ull);
    if (!last || last > now) { /* the clock starts now (a time ahead: a clock set wrong once) */
        last = now;
        last_write(s, last);
    }
    p->last = last;
    atomic_store(&s->scrub.next_s, last + s->cfg->scrub_interval_s);
    if (pthread_create(&p->th, NULL, patrol_main, s) != 0)
        return TS_ENOMEM;
    p->started = 1;
    return 0;
}

void tsd_scrub_patrol_stop(struct tsd_server *s)
{
    struct tsd_scrub_patrol *p = &s->patrol;

    /* The lock stays: a client's scrub on the maintenance thread may still end after this. */
    if (!p->started)
        return;
    pthread_mutex_lock(&p->m);
    p->stop = 1;
    atomic_store(&p->cancel, 1); /* a running scrub stops before its next chunk */
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->m);
    pthread_join(p->th, NULL);
    p->started = 0;
}
