/*
 * Group commit of seals (ts_store.h, "group commit"). Under sync = seal or always a seal's
 * record must be on disk before the seal is acknowledged. Done one by one, every seal pays a
 * WAL fdatasync on the caller's thread (an event loop's, in the daemon), and seals queue
 * behind each other's syncs. Here a thread of the store takes the seals queued since its last
 * turn, writes each one's batch unsynced (in queue order: a PG's log sequence is assigned in
 * that order), then syncs the WAL once for all of them (rocksdb_flush_wal with sync), and only
 * then reports each one done. While it syncs, the next group gathers.
 *
 * A shard with a chunk file still has its file synced before its record is written (by this
 * thread, off the caller's): the record never reaches the disk before the bytes it seals.
 */
#include "store_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define FAC "storage"

struct commit_job {
    struct commit_job *next;
    ts_shard_writer *w;
    uint64_t *records;
    uint32_t nrecords;
    struct ts_log_rec *log;
    ts_seal_done_fn done;
    void *arg;
    int rc;
};

struct ts_commit {
    ts_store *s;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct commit_job *head, **tail;
    int stop;
    int held; /* tests: the thread waits (ts_store_commit_hold) */
    int busy; /* a group is being written and synced */
    pthread_cond_t idle;
    rocksdb_writeoptions_t *wo_nosync;
    _Atomic uint64_t seals, syncs, groups_max;
};

/* Writes one group's seals, syncs the WAL once, reports each. */
static void commit_group(struct ts_commit *c, struct commit_job *list)
{
    struct commit_job *j, *next;
    uint64_t n = 0, written = 0;
    int sync_rc = 0;

    for (j = list; j; j = j->next, n++) {
        j->rc = shard_seal_write(j->w, j->records, j->nrecords, j->log, c->wo_nosync);
        if (j->rc == 0)
            written++;
        else
            ts_shard_writer_abort(j->w); /* the upload ends, as a failed chunk ends it */
    }
    if (written) {
        char *err = NULL;
        rocksdb_flush_wal(c->s->db, 1, &err);
        sync_rc = from_rocksdb(err, "group commit: WAL sync");
        atomic_fetch_add(&c->syncs, 1);
        atomic_fetch_add(&c->seals, written);
        if (written > atomic_load(&c->groups_max))
            atomic_store(&c->groups_max, written);
        if (sync_rc)
            /* Written but not known durable: never acknowledged. The records stay (the engine
             * refuses writes after a failed sync: see batch_write_wo). */
            TS_ERROR(FAC, sync_rc, "group commit: %llu seals not acknowledged",
                     (unsigned long long)written);
    }
    for (j = list; j; j = next) {
        next = j->next;
        j->done(j->arg, j->rc ? j->rc : sync_rc);
        free(j->records);
        free(j);
    }
}

static void *commit_main(void *arg)
{
    struct ts_commit *c = arg;

    pthread_setname_np(pthread_self(), "ts-commit");
    pthread_mutex_lock(&c->lock);
    for (;;) {
        struct commit_job *list;
        while ((!c->head || c->held) && !c->stop)
            pthread_cond_wait(&c->cond, &c->lock);
        if (!c->head && c->stop)
            break;
        list = c->head;
        c->head = NULL;
        c->tail = &c->head;
        c->busy = 1;
        pthread_mutex_unlock(&c->lock);
        commit_group(c, list);
        pthread_mutex_lock(&c->lock);
        c->busy = 0;
        if (!c->head)
            pthread_cond_broadcast(&c->idle);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int commit_start(ts_store *s)
{
    struct ts_commit *c = calloc(1, sizeof(*c));

    if (!c)
        return TS_ENOMEM;
    c->s = s;
    c->tail = &c->head;
    c->wo_nosync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(c->wo_nosync, 0);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_cond_init(&c->idle, NULL);
    if (pthread_create(&c->thread, NULL, commit_main, c) != 0) {
        rocksdb_writeoptions_destroy(c->wo_nosync);
        pthread_cond_destroy(&c->cond);
        pthread_cond_destroy(&c->idle);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return TS_ENOMEM;
    }
    s->commit = c;
    return 0;
}

void commit_stop(ts_store *s)
{
    struct ts_commit *c = s->commit;

    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    c->held = 0;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL); /* what was queued is written and reported first */
    rocksdb_writeoptions_destroy(c->wo_nosync);
    pthread_cond_destroy(&c->cond);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->lock);
    free(c);
    s->commit = NULL;
}

int ts_shard_writer_seal_async(ts_shard_writer *w, int have_crc, uint32_t expect_crc,
                               const uint64_t *records, uint32_t nrecords, struct ts_log_rec *log,
                               ts_seal_done_fn done, void *arg)
{
    struct ts_commit *c;
    struct commit_job *j;
    int rc;

    if (!done)
        return TS_EINVAL;
    rc = shard_seal_check(w, have_crc, expect_crc, records, nrecords);
    if (rc)
        return rc;
    c = w->s->commit;
    if (!c) { /* sync = none: nothing to wait for, written here */
        rc = shard_seal_write(w, records, nrecords, log, w->s->wo);
        if (rc)
            return rc;
        done(arg, 0);
        return 0;
    }
    j = calloc(1, sizeof(*j));
    if (!j || (nrecords && !(j->records = malloc(8 * (size_t)nrecords)))) {
        free(j);
        return TS_ENOMEM;
    }
    if (nrecords)
        memcpy(j->records, records, 8 * (size_t)nrecords);
    j->w = w;
    j->nrecords = nrecords;
    j->log = log;
    j->done = done;
    j->arg = arg;
    pthread_mutex_lock(&c->lock);
    *c->tail = j;
    c->tail = &j->next;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int ts_store_group_commit(const ts_store *s)
{
    return s && s->commit;
}

void ts_store_commit_stats(ts_store *s, struct ts_commit_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!s || !s->commit)
        return;
    out->seals = atomic_load(&s->commit->seals);
    out->syncs = atomic_load(&s->commit->syncs);
    out->largest_group = atomic_load(&s->commit->groups_max);
}

void ts_store_commit_hold(ts_store *s, int hold)
{
    struct ts_commit *c = s ? s->commit : NULL;

    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->held = hold;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void ts_store_commit_quiesce(ts_store *s)
{
    struct ts_commit *c = s ? s->commit : NULL;

    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->held = 0;
    pthread_cond_signal(&c->cond);
    while (c->head || c->busy)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
}
