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

int ts_peering_decide(const struct ts_peering_in *in, struct ts_peering_out *out)
{
    const struct ts_peer_reply *self = find(in, in->self), *best = NULL, *last = NULL;
    unsigned have = 0, wq;
    char missing[256] = "";

    memset(out, 0, sizeof(*out));
    if (!self)
        return TS_EINVAL;
    /* The newest interval any replier joined. */
    for (size_t i = 0; i < in->nreplies; i++)
        if (!last || in->replies[i].st.les > last->st.les)
            last = &in->replies[i];
    out->last_interval = last->st.les;
    if (last->st.les == 0 || last->st.nacting == 0) {
        out->prev_is_map = 1;
        for (size_t i = 0; i < in->nmap && out->nprev < TS_PG_MAX_ACTING; i++)
            snprintf(out->prev[out->nprev++], sizeof(out->prev[0]), "%s", in->map_nodes[i]);
        out->prev_need = (unsigned)(in->nmap / 2 + 1);
        if (in->nmap > TS_PG_MAX_ACTING) /* a big map: a majority of the first ones listed */
            out->prev_need = TS_PG_MAX_ACTING / 2 + 1;
        wq = 1;
    } else {
        for (unsigned i = 0; i < last->st.nacting; i++)
            snprintf(out->prev[out->nprev++], sizeof(out->prev[0]), "%s", last->st.acting[i]);
        wq = last->st.wq;
        out->prev_need = ts_peering_quorum(out->nprev, wq);
    }
    for (unsigned i = 0; i < out->nprev; i++) {
        if (find(in, out->prev[i]))
            have++;
        else
            why_add(missing, sizeof(missing), out->prev[i]);
    }
    if (have < out->prev_need) {
        snprintf(out->why, sizeof(out->why),
                 "needs replies from %u of the %u nodes of interval %llu's acting set; has %u "
                 "(none from %s)",
                 out->prev_need, out->nprev, (unsigned long long)out->last_interval, have, missing);
        out->verdict = TS_PEERING_WAIT;
        return 0;
    }
    /* Raft's up-to-date rule: the newest (epoch, seq) among the replies. */
    for (size_t i = 0; i < in->nreplies; i++) {
        const struct ts_pg_state *st = &in->replies[i].st;
        if (!best || ts_peering_head_cmp(st->head_epoch, st->applied, best->st.head_epoch,
                                         best->st.applied) > 0)
            best = &in->replies[i];
    }
    if (ts_peering_head_cmp(best->st.head_epoch, best->st.applied, self->st.head_epoch,
                            self->st.applied) == 0)
        best = self; /* prefer ourselves on a tie */
    out->head_seq = best->st.applied;
    out->head_epoch = best->st.head_epoch;
    if (best != self) {
        snprintf(out->pull_from, sizeof(out->pull_from), "%s", best->id);
        snprintf(
            out->why, sizeof(out->why), "head (%llu, %llu) is on %s; ours is (%llu, %llu): pulling",
            (unsigned long long)best->st.head_epoch, (unsigned long long)best->st.applied, best->id,
            (unsigned long long)self->st.head_epoch, (unsigned long long)self->st.applied);
        out->verdict = TS_PEERING_PULL;
        return 0;
    }
    snprintf(out->why, sizeof(out->why), "%u of %u from interval %llu replied; head (%llu, %llu)",
             have, out->nprev, (unsigned long long)out->last_interval,
             (unsigned long long)out->head_epoch, (unsigned long long)out->head_seq);
    out->verdict = TS_PEERING_ACTIVATE;
    return 0;
}
