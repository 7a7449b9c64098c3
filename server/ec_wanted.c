/*
 * Fragment chunks wanting repair (issue 33; docs/operations.md "Repair"). A fragment (NAME#f)
 * has no replica to repair it from: its good bytes are rebuilt from K other fragments on other
 * nodes, which the elected `tessera monitor` does (client/cli/cli_monitor_ec.c). This node only
 * notes what it found: a chunk that failed its CRC32C on a read or a scrub, or a fragment a
 * reader asked for that is not here while NAME is erasure-coded here. STATUS lists the entries
 * ("ec_repair_wanted") and /metrics counts them; the monitor reads them and repairs.
 *
 * The table is bounded (TSD_EC_WANTED_MAX). A missing fragment is noted only where this node
 * holds that position in its map, but any reader can name a shard number that does not exist:
 * such notes hold at most half the table, push out only each other, and their warnings are
 * limited to one a second; a damaged chunk (bytes this node holds failing their CRC32C) is
 * never pushed out by one (the oldest damaged chunk goes when 64 are). Whatever is still
 * damaged or missing is noted again by the next read or scrub. An entry goes when its chunk is
 * repaired (CHUNK_REPAIR taken), when the fragment is sealed here again (put whole), or after
 * EC_WANTED_TTL_NS.
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

/* Under mu: entries older than the TTL go (now read under mu: never before an entry's). */
static void expire(struct tsd_ec_wanted *w, uint64_t now)
{
    for (unsigned i = 0; i < w->n;)
        if (now > w->e[i].mono_ns && now - w->e[i].mono_ns > EC_WANTED_TTL_NS)
            drop_at(w, i);
        else
            i++;
}

/* Under mu: the index of the entry to replace for a new one of kind missing (1: a whole
 * fragment), -1 when there is room, -2 when the new one is not kept. Missing fragments, which
 * any reader can claim, hold at most half the table and never push out a damaged chunk. */
static int victim(struct tsd_ec_wanted *w, int missing)
{
    unsigned nmiss = 0;
    int oldest_miss = -1;

    for (unsigned i = 0; i < w->n; i++)
        if (w->e[i].idx == UINT32_MAX) {
            nmiss++;
            if (oldest_miss < 0)
                oldest_miss = (int)i;
        }
    if (missing && nmiss >= TSD_EC_WANTED_MAX / 2)
        return oldest_miss;
    if (w->n < TSD_EC_WANTED_MAX)
        return -1;
    if (oldest_miss >= 0)
        return oldest_miss;
    return missing ? -2 : 0; /* full of damaged chunks: a missing one waits, a chunk replaces */
}

void tsd_ec_wanted_note(struct tsd_server *s, const char *frag, uint32_t shard, uint32_t idx)
{
    struct tsd_ec_wanted *w = &s->ec_wanted;
    uint64_t now;
    int fresh = 1, quiet = 0;

    if (!ts_frag_split(frag, NULL, NULL))
        return;
    pthread_mutex_lock(&w->mu);
    now = ts_now_mono_ns();
    expire(w, now);
    for (unsigned i = 0; i < w->n && fresh; i++)
        if (w->e[i].shard == shard && !strcmp(w->e[i].frag, frag) &&
            (w->e[i].idx == idx || w->e[i].idx == UINT32_MAX))
            fresh = 0;
    if (fresh && victim(w, idx == UINT32_MAX) == -2)
        fresh = 0;
    if (fresh) {
        struct tsd_ec_wanted_ent *e;
        int v = victim(w, idx == UINT32_MAX);
        if (v >= 0)
            drop_at(w, (unsigned)v); /* the oldest of its kind: noted again when read again */
        e = &w->e[w->n++];
        snprintf(e->frag, sizeof(e->frag), "%s", frag);
        e->shard = shard;
        e->idx = idx;
        e->at_ns = ts_now_wall_ns();
        e->mono_ns = now;
        atomic_fetch_add(&w->noted, 1);
        if (idx == UINT32_MAX) { /* at most one warning a second: readers may ask for many */
            quiet = now - w->warned_ns < 1000000000ull;
            if (!quiet)
                w->warned_ns = now;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (!fresh || quiet)
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

    /* Only for a dataset erasure-coded here, and a position its code has that this node
     * holds for that shard in its map (a reader with an old map asks the wrong node). */
    if (!ts_frag_split(frag, base, &f) || ts_store_dataset_get(s->store, base, &d) != 0 ||
        !d.policy.ec_k || f >= (unsigned)d.policy.ec_k + d.policy.ec_m ||
        !tsd_ec_position_here(s, base, shard, f, (unsigned)d.policy.ec_k + d.policy.ec_m))
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

size_t tsd_ec_wanted_damaged(struct tsd_server *s)
{
    struct tsd_ec_wanted *w = &s->ec_wanted;
    size_t n = 0;

    pthread_mutex_lock(&w->mu);
    expire(w, ts_now_mono_ns());
    for (unsigned i = 0; i < w->n; i++)
        n += w->e[i].idx != UINT32_MAX;
    pthread_mutex_unlock(&w->mu);
    return n;
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
