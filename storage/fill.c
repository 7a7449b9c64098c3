/*
 * One fill of a chunk at a time: when two readers miss the same chunk together (two jobs
 * reading one dataset in step, or a read meeting the prefetch of its chunk), the second waits
 * for the first to put it in the cache instead of reading it from disk again. A bounded table
 * of the fills in progress (FILL_SLOTS); when it is full a reader just reads.
 */
#include "store_internal.h"

#include <string.h>

/* 1 when the caller fills (and must call fill_end), 0 when it waited for another's fill (look
 * in the cache again) or the table is full (read without it: *mine 0 too). */
int fill_begin(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    struct fill_slot *free_slot = NULL;
    int waited = 0;

    pthread_mutex_lock(&s->fill_lock);
    for (;;) {
        struct fill_slot *hit = NULL;
        free_slot = NULL;
        for (int i = 0; i < FILL_SLOTS; i++) {
            struct fill_slot *f = &s->fills[i];
            if (f->busy && f->dsid == dsid && f->shard == shard && f->idx == idx)
                hit = f;
            else if (!f->busy && !free_slot)
                free_slot = f;
        }
        if (!hit)
            break;
        waited = 1;
        pthread_cond_wait(&s->fill_cv, &s->fill_lock);
    }
    if (waited || !free_slot) {
        pthread_mutex_unlock(&s->fill_lock);
        return 0;
    }
    *free_slot = (struct fill_slot){1, dsid, shard, idx};
    pthread_mutex_unlock(&s->fill_lock);
    return 1;
}

void fill_end(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t idx)
{
    pthread_mutex_lock(&s->fill_lock);
    for (int i = 0; i < FILL_SLOTS; i++) {
        struct fill_slot *f = &s->fills[i];
        if (f->busy && f->dsid == dsid && f->shard == shard && f->idx == idx)
            memset(f, 0, sizeof(*f));
    }
    pthread_cond_broadcast(&s->fill_cv);
    pthread_mutex_unlock(&s->fill_lock);
}
