/*
 * The writer table (s->writers, under s->lock): whether a dataset or a shard has a writer, and
 * writers giving way to a newer upload of their shard or to their dataset's forced delete.
 * Writers register and unregister themselves in shard_write.c.
 */
#include "store_internal.h"

#include <stdatomic.h>

int writer_active(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard)
{
    for (size_t i = 0; i < s->nwriters; i++)
        if (s->writers[i].dsid == dsid && (any_shard || s->writers[i].shard == shard))
            return 1;
    return 0;
}

/* Under s->lock: the writers of dataset dsid (any_shard) or of its shard give way: each is
 * marked superseded (its next put or seal fails with TS_ESTALE, its abort only frees it) and
 * leaves the table; once this returns, none of its batches can land. Returns how many. */
size_t writers_supersede(ts_store *s, uint64_t dsid, int any_shard, uint32_t shard)
{
    size_t n = 0;

    for (size_t i = 0; i < s->nwriters;) {
        if (s->writers[i].dsid == dsid && (any_shard || s->writers[i].shard == shard)) {
            ts_shard_writer *w = s->writers[i].w;
            pthread_mutex_lock(&w->lock); /* a batch of it in flight lands first */
            atomic_store(&w->superseded, 1);
            pthread_mutex_unlock(&w->lock);
            s->writers[i] = s->writers[--s->nwriters];
            n++;
        } else {
            i++;
        }
    }
    return n;
}
