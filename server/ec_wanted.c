/*
 * Fragment chunks wanting repair (issue 33; docs/operations.md "Repair"). A fragment (NAME#f)
 * has no replica to repair it from: its good bytes are rebuilt from K other fragments on other
 * nodes, which the elected `tessera monitor` does (client/cli/cli_monitor_ec.c). This node only
 * notes what it found: a chunk that failed its CRC32C on a read or a scrub, or a fragment a
 * reader asked for that is not here while NAME is erasure-coded here. STATUS lists the entries
 * ("ec_repair_wanted") and /metrics counts them; the monitor reads them and repairs.
 *
 * The table is bounded (TSD_EC_WANTED_MAX): a reader asking for fragments that do not exist can
 * only push older entries out, and whatever is still damaged is noted again by the next read or
 * scrub. An entry goes when its chunk is repaired (CHUNK_REPAIR taken), when the fragment is
 * sealed here again (put whole), or after EC_WANTED_TTL_NS.
 */
#include "server_internal.h"

#include <string.h>

#undef FAC
#define FAC "ec"
#define EC_WANTED_TTL_NS (15ull * 60 * 1000000000ull)

void tsd_ec_wanted_init(struct tsd_ec_wanted *w)
{
    pthread_mutex_init(&w->mu, NULL);
    w->n = 0;
}

void tsd_ec_wanted_fini(struct tsd_ec_wanted *w)
{
    pthread_mutex_destroy(&w->mu);
}

static void drop_at(struct tsd_ec_wanted *w, unsigned i)
{
    memmove(&w->e[i], &w->e[i + 1], (w->n - i - 1) * sizeof(w->e[0]));
    w->n--;
}

/* Under mu: entries older than the TTL go. */
static void expire(struct tsd_ec_wanted *w, uint64_t now)
{
    for (unsigned i = 0; i < w->n;)
        if (now - w->e[i].mono_ns > EC_WANTED_TTL_NS)
            drop_at(w, i);
        else
            i++;
}

void tsd_ec_wanted_note(struct tsd_server *s, const char *frag, uint32_t shard, uint32_t idx)
{
    struct tsd_ec_wanted *w = &s->ec_wanted;
    uint64_t now = ts_now_mono_ns();
    int fresh = 1;

    if (!ts_frag_split(frag, NULL, NULL))
        return;
    pthread_mutex_lock(&w->mu);
    expire(w, now);
    for (unsigned i = 0; i < w->n && fresh; i++)
        if (w->e[i].shard == shard && !strcmp(w->e[i].frag, frag) &&
            (w->e[i].idx == idx || w->e[i].idx == UINT32_MAX))
            fresh = 0;
    if (fresh) {
        struct tsd_ec_wanted_ent *e;
        if (w->n == TSD_EC_WANTED_MAX)
            drop_at(w, 0); /* the oldest: noted again by the next read or scrub */
        e = &w->e[w->n++];
        snprintf(e->frag, sizeof(e->frag), "%s", frag);
        e->shard = shard;
        e->idx = idx;
        e->at_ns = ts_now_wall_ns();
        e->mono_ns = now;
        atomic_fetch_add(&w->noted, 1);
    }
    pthread_mutex_unlock(&w->mu);
    if (!fresh)
        return;
    if (idx == UINT32_MAX)
        TS_WARN(FAC, TS_ENOENT,
                "fragment %s/%u is not here: noted for repair (the elected tessera monitor "
                "rebuilds it from the other fragments)",
                frag, shard);
    else
        TS_WARN(FAC, TS_ECORRUPT,
                "chunk %u of fragment %s/%u failed its CRC32C: noted for repair (the elected "
                "tessera monitor rebuilds it from the other fragments)",
                idx, frag, shard);
}

void tsd_ec_wanted_note_missing(struct tsd_server *s, const char *frag, uint32_t shard)
{
    char base[TS_NAME_MAX + 1];
    struct ts_dataset_info d;
    unsigned f;

    /* Only for a dataset erasure-coded here, and a position its code has. */
    if (!ts_frag_split(frag, base, &f) || ts_store_dataset_get(s->store, base, &d) != 0 ||
        !d.policy.ec_k || f >= (unsigned)d.policy.ec_k + d.policy.ec_m)
        return;
    tsd_ec_wanted_note(s, frag, shard, UINT32_MAX);
}

void tsd_ec_wanted_done(struct tsd_server *s, const char *frag, uint32_t shard, uint32_t idx)
{
    struct tsd_ec_wanted *w = &s->ec_wanted;

    pthread_mutex_lock(&w->mu);
    for (unsigned i = 0; i < w->n;)
        if (w->e[i].shard == shard && !strcmp(w->e[i].frag, frag) &&
            (idx == UINT32_MAX || w->e[i].idx == idx)) {
            drop_at(w, i);
            atomic_fetch_add(&w->done, 1);
        } else {
            i++;
        }
    pthread_mutex_unlock(&w->mu);
}

size_t tsd_ec_wanted_copy(struct tsd_server *s, struct tsd_ec_wanted_ent *out, size_t cap)
{
    struct tsd_ec_wanted *w = &s->ec_wanted;
    size_t n;

    pthread_mutex_lock(&w->mu);
    expire(w, ts_now_mono_ns());
    n = TS_MIN((size_t)w->n, cap);
    if (out && n)
        memcpy(out, w->e, n * sizeof(*out));
    n = out ? n : w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}
