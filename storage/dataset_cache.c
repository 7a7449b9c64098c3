/*
 * Finding a dataset: its record by name through the dataset-record cache (s->dstab; dropped
 * on seal and delete), and its name by id through the reverse index ('I').
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define DS_MAX_ENTS 4096

struct ds_ent {
    struct ds_ent *next;
    struct ts_dataset_info d;
};

static size_t ds_bucket(const char *name)
{
    return ts_crc32c(0, name, strlen(name)) & (DS_BUCKETS - 1);
}

/* Forgets a cached dataset record (after seal or delete). */
void ds_invalidate(ts_store *s, const char *name)
{
    struct ds_ent **pp;

    pthread_mutex_lock(&s->dslock);
    s->ds_gen++;
    for (pp = &s->dstab[ds_bucket(name)]; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->d.name, name)) {
            struct ds_ent *e = *pp;
            *pp = e->next;
            free(e);
            s->ndsents--;
            break;
        }
    }
    pthread_mutex_unlock(&s->dslock);
}

void ds_clear_locked(ts_store *s)
{
    for (size_t i = 0; i < DS_BUCKETS; i++) {
        while (s->dstab[i]) {
            struct ds_ent *e = s->dstab[i];
            s->dstab[i] = e->next;
            free(e);
        }
    }
    s->ndsents = 0;
}

int dataset_get(ts_store *s, const char *name, struct ts_dataset_info *d)
{
    uint8_t k[1 + TS_NAME_MAX];
    struct ds_ent *e;
    uint64_t gen;
    char *v;
    size_t vlen;
    int rc;

    if (!ts_name_valid_store(name))
        return TS_ENAME;
    pthread_mutex_lock(&s->dslock);
    for (e = s->dstab[ds_bucket(name)]; e; e = e->next)
        if (!strcmp(e->d.name, name))
            break;
    if (e)
        *d = e->d;
    gen = s->ds_gen;
    pthread_mutex_unlock(&s->dslock);
    if (e)
        return 0;

    rc = meta_get(s, k, key_ds(k, name), &v, &vlen);
    if (rc)
        return rc;
    rc = ds_decode(v, vlen, name, d);
    rocksdb_free(v);
    if (rc)
        return rc;
    e = malloc(sizeof(*e));
    if (!e)
        return 0;
    e->d = *d;
    pthread_mutex_lock(&s->dslock);
    if (gen != s->ds_gen) {
        free(e); /* invalidated meanwhile: what we read may be stale */
    } else {
        if (s->ndsents >= DS_MAX_ENTS)
            ds_clear_locked(s);
        e->next = s->dstab[ds_bucket(name)];
        s->dstab[ds_bucket(name)] = e;
        s->ndsents++;
    }
    pthread_mutex_unlock(&s->dslock);
    return 0;
}

int id_name(ts_store *s, uint64_t dsid, char *name)
{
    uint8_t k[9];
    char *v;
    size_t vlen;
    int rc = meta_get(s, k, key_id(k, 'I', dsid), &v, &vlen);

    if (rc)
        return rc;
    if (vlen == 0 || vlen > TS_NAME_MAX) {
        rocksdb_free(v);
        return TS_ECORRUPT;
    }
    memcpy(name, v, vlen);
    name[vlen] = '\0';
    rocksdb_free(v);
    return 0;
}
