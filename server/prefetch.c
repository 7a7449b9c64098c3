/* Plan-driven prefetch: the queue of hinted chunks and the thread that reads them (prefetch.h). */
#include "prefetch.h"

#include "ts_common.h"
#include "ts_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define FAC "prefetch"

struct tsd_pf_account {
    _Atomic uint64_t queued; /* bytes of this connection's chunks in the queue */
    _Atomic int refs;        /* the connection's and one per queued chunk */
    _Atomic int closed;
};

struct item {
    struct item *next;
    struct tsd_pf_account *a;
    uint64_t dsid;
    uint32_t shard, idx, bytes;
};

struct tsd_prefetch {
    ts_store *store;
    uint64_t node_bytes, conn_bytes;
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t cv;
    int stop;
    struct item *head, *tail;
    uint64_t queued; /* bytes in the queue */
    struct tsd_prefetch_stats st;
};

static void account_unref(struct tsd_pf_account *a)
{
    if (atomic_fetch_sub(&a->refs, 1) == 1)
        free(a);
}

static void *prefetch_main(void *arg)
{
    struct tsd_prefetch *p = arg;

    pthread_mutex_lock(&p->m);
    for (;;) {
        struct item *it;
        int rc = 0, skip;

        while (!p->stop && !p->head)
            pthread_cond_wait(&p->cv, &p->m);
        if (p->stop)
            break;
        it = p->head;
        p->head = it->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->m);
        skip = atomic_load(&it->a->closed);
        if (!skip) {
            rc = ts_store_prefetch(p->store, it->dsid, it->shard, it->idx);
            /* Cached already, or a hint of nothing (no such chunk, shard or dataset now). */
            skip = rc == TS_EEXIST || rc == TS_ERANGE || rc == TS_ENOENT || rc == TS_EINCOMPLETE;
        }
        ts_store_want(p->store, it->dsid, it->shard, it->idx, 0);
        pthread_mutex_lock(&p->m);
        p->queued -= it->bytes;
        atomic_fetch_sub(&it->a->queued, it->bytes);
        if (skip)
            p->st.skipped++;
        else if (rc)
            p->st.failed++;
        else {
            p->st.read++;
            p->st.read_bytes += it->bytes;
        }
        account_unref(it->a);
        free(it);
    }
    pthread_mutex_unlock(&p->m);
    return NULL;
}

int tsd_prefetch_start(struct tsd_prefetch **out, ts_store *store, uint64_t node_bytes,
                       uint64_t conn_bytes)
{
    struct tsd_prefetch *p = calloc(1, sizeof(*p));

    *out = NULL;
    if (!p)
        return TS_ENOMEM;
    p->store = store;
    p->node_bytes = node_bytes;
    p->conn_bytes = TS_MIN(conn_bytes, node_bytes);
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (node_bytes && pthread_create(&p->th, NULL, prefetch_main, p) != 0) {
        free(p);
        return TS_ENOMEM;
    }
    *out = p;
    return 0;
}

void tsd_prefetch_stop(struct tsd_prefetch *p)
{
    if (!p)
        return;
    if (p->node_bytes) {
        pthread_mutex_lock(&p->m);
        p->stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->m);
        pthread_join(p->th, NULL);
    }
    while (p->head) {
        struct item *it = p->head;
        p->head = it->next;
        ts_store_want(p->store, it->dsid, it->shard, it->idx, 0);
        account_unref(it->a);
        free(it);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->m);
    free(p);
}

struct tsd_pf_account *tsd_prefetch_account(struct tsd_prefetch *p)
{
    struct tsd_pf_account *a = calloc(1, sizeof(*a));

    (void)p;
    if (a)
        atomic_init(&a->refs, 1);
    return a;
}

void tsd_prefetch_account_close(struct tsd_pf_account *a)
{
    if (!a)
        return;
    atomic_store(&a->closed, 1);
    account_unref(a);
}

int tsd_prefetch_add(struct tsd_prefetch *p, struct tsd_pf_account *a, uint64_t dsid,
                     uint32_t shard, uint32_t idx, uint32_t bytes)
{
    struct item *it;
    int ok;

    pthread_mutex_lock(&p->m);
    p->st.hinted++;
    ok = p->node_bytes && p->queued + bytes <= p->node_bytes &&
         atomic_load(&a->queued) + bytes <= p->conn_bytes;
    it = ok ? malloc(sizeof(*it)) : NULL;
    if (!it) {
        p->st.dropped++;
        pthread_mutex_unlock(&p->m);
        return 0;
    }
    *it = (struct item){NULL, a, dsid, shard, idx, bytes};
    ts_store_want(p->store, dsid, shard, idx, 1); /* a miss on it meanwhile caches it whole */
    atomic_fetch_add(&a->refs, 1);
    atomic_fetch_add(&a->queued, bytes);
    p->queued += bytes;
    if (p->tail)
        p->tail->next = it;
    else
        p->head = it;
    p->tail = it;
    p->st.queued++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->m);
    return 1;
}

void tsd_prefetch_drop(struct tsd_prefetch *p, uint32_t n)
{
    pthread_mutex_lock(&p->m);
    p->st.hinted += n;
    p->st.dropped += n;
    pthread_mutex_unlock(&p->m);
}

void tsd_prefetch_stats(struct tsd_prefetch *p, struct tsd_prefetch_stats *out)
{
    pthread_mutex_lock(&p->m);
    *out = p->st;
    out->queued_bytes = p->queued;
    pthread_mutex_unlock(&p->m);
}
