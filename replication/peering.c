/* Peering decisions: see peering.h. Pure: no I/O, no clock. */
#include "peering.h"

#include <stdio.h>
#include <string.h>

unsigned ts_peering_quorum(unsigned n, unsigned wq)
{
    unsigned a, b;

    if (n == 0)
        return 0;
    if (wq == 0)
        wq = 1;
    a = wq > n ? 1 : n - wq + 1;
    b = n / 2 + 1;
    return a > b ? a : b;
}

int ts_peering_head_cmp(uint64_t e1, uint64_t s1, uint64_t e2, uint64_t s2)
{
    if (e1 != e2)
        return e1 < e2 ? -1 : 1;
    if (s1 != s2)
        return s1 < s2 ? -1 : 1;
    return 0;
}

static const struct ts_peer_reply *find(const struct ts_peering_in *in, const char *id)
{
    for (size_t i = 0; i < in->nreplies; i++)
        if (!strcmp(in->replies[i].id, id))
            return &in->replies[i];
    return NULL;
}

static void why_add(char *why, size_t cap, const char *s)
{
    size_t len = strlen(why);
    if (len + 2 < cap)
        snprintf(why + len, cap - len, "%s%s", len ? ", " : "", s);
}

static struct ts_peering_set *set_add(struct ts_peering_out *out, uint64_t epoch, int pending,
                                      const char (*ids)[64], unsigned n, unsigned wq)
{
    struct ts_peering_set *s;

    for (unsigned i = 0; i < out->nsets; i++)
        if (out->sets[i].epoch == epoch && out->sets[i].pending == pending)
            return &out->sets[i];
    if (out->nsets == TS_PEERING_MAX_SETS)
        return NULL;
    s = &out->sets[out->nsets++];
    memset(s, 0, sizeof(*s));
    s->epoch = epoch;
    s->pending = pending;
    for (unsigned i = 0; i < n && s->n < TS_PG_MAX_ACTING; i++)
        snprintf(s->ids[s->n++], sizeof(s->ids[0]), "%s", ids[i]);
    s->need = ts_peering_quorum(s->n, wq);
    return s;
}

/*
 * How fit a replier is to be the source of the head: 0 when it is in none of the sets peering
 * needed (what it holds beyond their head was never acknowledged, and it may hold a log without
 * the data: a rebalance drops a moved PG's old copies and keeps their log); else higher for a
 * newer set, and within a set for an earlier place in its acting order — the first is that
 * interval's primary, which holds every dataset's shards, where a member past a narrow
 * dataset's width holds its log entries as no-ops.
 */
static uint64_t source_fitness(const struct ts_peering_out *out, const struct ts_peer_reply *r)
{
    const char *id = r->id;
    uint64_t fit = 0;

    for (unsigned k = 0; k < out->nsets; k++)
        for (unsigned i = 0; i < out->sets[k].n; i++) {
            uint64_t f = (out->sets[k].epoch + 1) * (TS_PG_MAX_ACTING + 1) + (TS_PG_MAX_ACTING - i);
            if (!strcmp(out->sets[k].ids[i], id) && f > fit)
                fit = f;
        }
    /* One that awaits a backfill is a source only when no other holds its head (what it got
     * after joining it holds with the data): below every member that holds the shards. */
    if (fit && !r->lacks_shards)
        fit |= 1ull << 62;
    return fit;
}

int ts_peering_decide(const struct ts_peering_in *in, struct ts_peering_out *out)
{
    const struct ts_peer_reply *self = find(in, in->self), *best = NULL, *last = NULL;
    char missing[320] = "";
    int short_of = 0;

    memset(out, 0, sizeof(*out));
    if (!self)
        return TS_EINVAL;
    /* The newest interval any replier knows to have started. */
    for (size_t i = 0; i < in->nreplies; i++)
        if (!last || in->replies[i].st.les > last->st.les)
            last = &in->replies[i];
    out->last_interval = last->st.les;
    if (last->st.les == 0 || last->st.nacting == 0) {
        /* Before any interval: a majority of the whole map (of its first nodes when large). */
        struct ts_peering_set *s =
            set_add(out, 0, 0, in->map_nodes,
                    in->nmap < TS_PG_MAX_ACTING ? (unsigned)in->nmap : TS_PG_MAX_ACTING, 1);
        s->need = s->n / 2 + 1;
    } else {
        set_add(out, last->st.les, 0, (const char(*)[64])last->st.acting, last->st.nacting,
                last->st.wq);
    }
    /* Every newer interval being started that a replier reports: it may have started. */
    for (size_t i = 0; i < in->nreplies; i++) {
        const struct ts_pg_state *st = &in->replies[i].st;
        for (unsigned k = 0; k < st->npending; k++) {
            const struct ts_pg_interval *iv = &st->pending[k];
            if (iv->epoch <= out->last_interval || !iv->n)
                continue;
            if (!set_add(out, iv->epoch, 1, (const char(*)[64])iv->acting, iv->n, iv->wq)) {
                snprintf(out->why, sizeof(out->why), "more than %d intervals being started at once",
                         TS_PEERING_MAX_SETS - 1);
                out->verdict = TS_PEERING_WAIT;
                return 0;
            }
        }
    }
    for (unsigned k = 0; k < out->nsets; k++) {
        struct ts_peering_set *s = &out->sets[k];
        for (unsigned i = 0; i < s->n; i++) {
            if (find(in, s->ids[i]))
                s->have++;
            else if (!strstr(missing, s->ids[i]))
                why_add(missing, sizeof(missing), s->ids[i]);
        }
        if (s->have < s->need && !short_of) {
            short_of = 1;
            snprintf(out->why, sizeof(out->why),
                     "needs replies from %u of the %u nodes of %s interval %llu's acting set; "
                     "has %u (none from %.200s)",
                     s->need, s->n, s->pending ? "pending" : "started",
                     (unsigned long long)s->epoch, s->have, missing);
        }
    }
    if (short_of) {
        out->verdict = TS_PEERING_WAIT;
        return 0;
    }
    /* Raft's up-to-date rule: the newest (epoch, seq) among ourselves and the members of the
     * sets; on a tie ourselves, then a member of the newest set. */
    best = self;
    for (size_t i = 0; i < in->nreplies; i++) {
        const struct ts_peer_reply *r = &in->replies[i];
        int c = ts_peering_head_cmp(r->st.head_epoch, r->st.applied, best->st.head_epoch,
                                    best->st.applied);
        uint64_t fit = source_fitness(out, r);
        if (r == self || !fit)
            continue;
        if (c > 0 || (c == 0 && best != self && fit > source_fitness(out, best)))
            best = r;
    }
    out->head_seq = best->st.applied;
    out->head_epoch = best->st.head_epoch;
    if (best == self && in->self_needs_backfill) {
        /* Our log is the newest, our shards are not here: the fittest other member at that
         * head backfills us first. */
        const struct ts_peer_reply *src = NULL;
        for (size_t i = 0; i < in->nreplies; i++) {
            const struct ts_peer_reply *r = &in->replies[i];
            uint64_t fit = source_fitness(out, r);
            if (r == self || !fit || r->lacks_shards ||
                ts_peering_head_cmp(r->st.head_epoch, r->st.applied, self->st.head_epoch,
                                    self->st.applied) != 0)
                continue;
            if (!src || fit > source_fitness(out, src))
                src = r;
        }
        if (!src) {
            snprintf(out->why, sizeof(out->why),
                     "this node holds the PG's log up to (%llu, %llu) but not its shards (it "
                     "joined its replicas): waiting for a member of the last interval's acting "
                     "set that holds that head to backfill it",
                     (unsigned long long)self->st.head_epoch, (unsigned long long)self->st.applied);
            out->verdict = TS_PEERING_WAIT;
            return 0;
        }
        best = src;
    }
    if (best != self) {
        snprintf(out->pull_from, sizeof(out->pull_from), "%s", best->id);
        snprintf(out->why, sizeof(out->why), "head (%llu, %llu) is on %s; ours is (%llu, %llu)%s",
                 (unsigned long long)best->st.head_epoch, (unsigned long long)best->st.applied,
                 best->id, (unsigned long long)self->st.head_epoch,
                 (unsigned long long)self->st.applied,
                 in->self_needs_backfill ? " without the PG's shards: pulling with a backfill"
                                         : ": pulling");
        out->verdict = TS_PEERING_PULL;
        return 0;
    }
    snprintf(out->why, sizeof(out->why), "quorums met (%u interval%s from %llu); head (%llu, %llu)",
             out->nsets, out->nsets > 1 ? "s" : "", (unsigned long long)out->last_interval,
             (unsigned long long)out->head_epoch, (unsigned long long)out->head_seq);
    out->verdict = TS_PEERING_ACTIVATE;
    return 0;
}

/* ---- rolling a replica back ----------------------------------------------------------------- */

int ts_peering_rollback(const struct ts_rollback_in *in, struct ts_rollback_out *out)
{
    uint64_t common = 0, common_epoch = 0, lowest = 0, newest = in->head_epoch;
    int found = 0;
    const char *stale = NULL;

    memset(out, 0, sizeof(*out));
    if (in->ntail && (!in->tail || !in->ours))
        return TS_EINVAL;
    if (!in->authoritative || !in->life)
        stale = "our log is not the PG's authoritative one now (not activating or active here)";
    else if (in->life != in->asked_life || in->interval != in->asked_interval)
        stale = "the reply was asked for in an earlier peering life or interval";
    /* The newest of the replica's entries we compared that is ours (same seq and epoch; a seq
     * trimmed here counts as ours: it is older than anything a peering could have replaced). */
    for (size_t i = 0; i < in->ntail; i++) {
        lowest = in->tail[i].seq;
        if (in->tail[i].epoch > newest)
            newest = in->tail[i].epoch;
        if (found || in->tail[i].seq > in->my_applied)
            continue; /* beyond our head: not ours */
        if (in->ours[i] == TS_ROLLBACK_TRIMMED || in->ours[i] == in->tail[i].epoch) {
            common = in->tail[i].seq;
            common_epoch = in->tail[i].epoch;
            found = 1;
        }
    }
    if (in->applied == 0 || (found && common == in->applied)) {
        if (stale) {
            snprintf(out->why, sizeof(out->why), "%s", stale);
            out->verdict = TS_ROLLBACK_STALE;
            return 0;
        }
        out->verdict = TS_ROLLBACK_PREFIX;
        out->to = in->applied;
        out->to_epoch = in->head_epoch;
        return 0;
    }
    if (!found) {
        /* Nothing in common among what it sent: roll back past all of it, compare again. */
        common = lowest ? lowest - 1 : 0;
        common_epoch = common ? in->ours_before : 0;
    }
    out->to = common;
    out->to_epoch = common_epoch;
    if (stale) {
        snprintf(out->why, sizeof(out->why),
                 "refused to roll back entries past %llu up to (%llu, %llu): %s",
                 (unsigned long long)common, (unsigned long long)in->head_epoch,
                 (unsigned long long)in->applied, stale);
        out->verdict = TS_ROLLBACK_REFUSE;
        return 0;
    }
    if (newest > in->interval) {
        snprintf(out->why, sizeof(out->why),
                 "refused to roll back entries up to (%llu, %llu): epoch %llu is newer than the "
                 "interval %llu our log is authoritative under (they are what we lack, not what "
                 "diverged)",
                 (unsigned long long)in->head_epoch, (unsigned long long)in->applied,
                 (unsigned long long)newest, (unsigned long long)in->interval);
        out->verdict = TS_ROLLBACK_REFUSE;
        return 0;
    }
    snprintf(out->why, sizeof(out->why),
             "entries past %llu up to (%llu, %llu) are not in our log (head %llu, %llu; "
             "authoritative under interval %llu): rolling them back",
             (unsigned long long)common, (unsigned long long)in->head_epoch,
             (unsigned long long)in->applied, (unsigned long long)in->my_epoch,
             (unsigned long long)in->my_applied, (unsigned long long)in->interval);
    out->verdict = TS_ROLLBACK_TRUNCATE;
    return 0;
}
