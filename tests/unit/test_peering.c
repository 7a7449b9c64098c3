/* Unit tests for the peering decisions (replication/peering.c): quorums, the newest interval,
 * Raft's up-to-date rule, and the cases that lost acknowledged writes before peering existed
 * (a returning node leading before it caught up; a replica ahead of the new primary; an old
 * primary's divergent entries). */
#include "ts_test.h"

#include "peering.h"

#include <stdio.h>
#include <string.h>

static const char map5[][64] = {"n1", "n2", "n3", "n4", "n5"};

/* A reply: id, head (epoch, seq), last interval les with its acting set ("" ends it). */
static struct ts_peer_reply reply(const char *id, uint64_t he, uint64_t hs, uint64_t les,
                                  uint8_t wq, const char *a0, const char *a1, const char *a2)
{
    struct ts_peer_reply r;
    const char *acting[3] = {a0, a1, a2};

    memset(&r, 0, sizeof(r));
    snprintf(r.id, sizeof(r.id), "%s", id);
    r.st.head_epoch = he;
    r.st.applied = hs;
    r.st.les = les;
    r.st.promised = les;
    r.st.wq = wq;
    for (int i = 0; i < 3; i++)
        if (acting[i] && acting[i][0])
            snprintf(r.st.acting[r.st.nacting++], 64, "%s", acting[i]);
    return r;
}

static int decide(const char *self, const struct ts_peer_reply *rs, size_t n,
                  struct ts_peering_out *out)
{
    struct ts_peering_in in = {10, self, map5, 5, rs, n, 0};
    return ts_peering_decide(&in, out);
}

static void test_quorum(void **state)
{
    assert_int_equal(ts_peering_quorum(3, 2), 2);
    assert_int_equal(ts_peering_quorum(3, 3), 2); /* a majority still: two peerings meet */
    assert_int_equal(ts_peering_quorum(3, 1), 3); /* every write quorum of 1 must be seen */
    assert_int_equal(ts_peering_quorum(5, 3), 3);
    assert_int_equal(ts_peering_quorum(5, 2), 4);
    assert_int_equal(ts_peering_quorum(2, 2), 2);
    assert_int_equal(ts_peering_quorum(1, 1), 1);
    assert_int_equal(ts_peering_quorum(0, 2), 0);
    assert_int_equal(ts_peering_quorum(3, 0), 3); /* wq 0 counts as 1 */
    /* Write quorum + peering quorum > acting set; two peering quorums meet. */
    for (unsigned n = 1; n <= 8; n++)
        for (unsigned wq = 1; wq <= n; wq++) {
            unsigned q = ts_peering_quorum(n, wq);
            assert_true(q + wq > n);
            assert_true(2 * q > n);
            assert_true(q <= n);
        }
}

static void test_head_order(void **state)
{
    assert_int_equal(ts_peering_head_cmp(1, 9, 2, 1), -1); /* a newer epoch wins */
    assert_int_equal(ts_peering_head_cmp(2, 1, 1, 9), 1);
    assert_int_equal(ts_peering_head_cmp(2, 3, 2, 4), -1);
    assert_int_equal(ts_peering_head_cmp(2, 4, 2, 4), 0);
}

/* A new cluster: no interval anywhere; a majority of the map must answer. */
static void test_bootstrap(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n1", 0, 0, 0, 0, "", "", ""),
                                  reply("n2", 0, 0, 0, 0, "", "", ""),
                                  reply("n3", 0, 0, 0, 0, "", "", "")};
    struct ts_peering_out out;

    assert_int_equal(decide("n1", rs, 2, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_WAIT);
    assert_int_equal(out.nsets, 1);
    assert_int_equal(out.sets[0].epoch, 0); /* the whole map */
    assert_int_equal(out.sets[0].need, 3);
    assert_non_null(strstr(out.why, "n4"));
    assert_int_equal(decide("n1", rs, 3, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE);
    assert_int_equal(out.sets[0].n, 5);
}

/* The smallest form of issue 9, first failover: n1 (primary) is dead; n2 and n3 answer. */
static void test_failover_of_dead_primary(void **state)
{
    struct ts_peer_reply rs[2] = {reply("n2", 1, 5, 1, 2, "n1", "n2", "n3"),
                                  reply("n3", 1, 5, 1, 2, "n1", "n2", "n3")};
    struct ts_peering_out out;

    assert_int_equal(decide("n2", rs, 2, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE);
    assert_int_equal(out.last_interval, 1);
    assert_int_equal(out.sets[0].need, 2);
    assert_int_equal(out.head_seq, 5);
    /* With only itself it must wait: n3 may hold an acknowledged entry it lacks. */
    assert_int_equal(decide("n2", rs, 1, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_WAIT);
    assert_non_null(strstr(out.why, "n3"));
}

/* The node that returns is primary by placement but behind: it pulls first. Before peering it
 * led at once and lost what n2 and n3 acknowledged while it was away. */
static void test_returning_node_pulls(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n1", 1, 3, 1, 2, "n1", "n2", "n3"),
                                  reply("n2", 2, 5, 2, 2, "n2", "n3", ""),
                                  reply("n3", 2, 5, 2, 2, "n2", "n3", "")};
    struct ts_peering_out out;

    assert_int_equal(decide("n1", rs, 3, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_int_equal(out.last_interval, 2);
    assert_string_equal(out.pull_from, "n2");
    assert_int_equal(out.head_epoch, 2);
    assert_int_equal(out.head_seq, 5);
    /* The interval-2 set is {n2, n3} with wq 2: both must answer. */
    assert_int_equal(out.sets[0].need, 2);
    assert_int_equal(decide("n1", rs, 2, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_WAIT);
    /* Once caught up, it activates. */
    rs[0].st.head_epoch = 2;
    rs[0].st.applied = 5;
    assert_int_equal(decide("n1", rs, 3, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE);
}

/* An old primary's entries that never reached a write quorum are older than the new
 * interval's, however long: the newer epoch's head is authoritative (they get rolled back). */
static void test_divergent_old_primary(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n1", 1, 7, 1, 2, "n1", "n2", "n3"),
                                  reply("n2", 2, 5, 2, 2, "n2", "n3", "n4"),
                                  reply("n3", 2, 5, 2, 2, "n2", "n3", "n4")};
    struct ts_peering_out out;

    assert_int_equal(decide("n1", rs, 3, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_int_equal(out.head_epoch, 2);
    assert_int_equal(out.head_seq, 5);
}

/* A replica ahead of the new primary in the same epoch: the primary pulls, it never counts the
 * replica as caught up on its shorter log. */
static void test_replica_ahead(void **state)
{
    struct ts_peer_reply rs[2] = {reply("n2", 3, 4, 3, 2, "n1", "n2", "n3"),
                                  reply("n3", 3, 6, 3, 2, "n1", "n2", "n3")};
    struct ts_peering_out out;

    assert_int_equal(decide("n2", rs, 2, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n3");
    assert_int_equal(out.head_seq, 6);
}

/* A later interval that only one replier joined: its acting set must answer too. */
static void test_later_interval_needs_its_quorum(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n1", 1, 3, 1, 2, "n1", "n2", "n3"),
                                  reply("n3", 1, 3, 1, 2, "n1", "n2", "n3"),
                                  reply("n4", 3, 4, 3, 2, "n4", "n5", "n2")};
    struct ts_peering_out out;

    assert_int_equal(decide("n1", rs, 3, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_WAIT);
    assert_int_equal(out.last_interval, 3);
    assert_non_null(strstr(out.why, "n5"));
    assert_non_null(strstr(out.why, "n2"));
}

/* An interval being started (pending on some node) may have started: its acting set must
 * answer too (joint quorum). The simulation's counterexample B: without this, a retry that
 * found only its own pending interval certified itself. */
static void test_pending_interval_needs_its_quorum(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n1", 1, 3, 1, 2, "n1", "n2", "n3"),
                                  reply("n2", 1, 3, 1, 2, "n1", "n2", "n3"),
                                  reply("n4", 1, 3, 1, 2, "n1", "n2", "n3")};
    struct ts_peering_out out;

    /* n2 prepared interval 5 with acting {n2, n4, n5}; it is not known to have started. */
    rs[1].st.npending = 1;
    rs[1].st.pending[0].epoch = 5;
    rs[1].st.pending[0].wq = 2;
    rs[1].st.pending[0].n = 3;
    snprintf(rs[1].st.pending[0].acting[0], 64, "n2");
    snprintf(rs[1].st.pending[0].acting[1], 64, "n4");
    snprintf(rs[1].st.pending[0].acting[2], 64, "n5");
    assert_int_equal(decide("n1", rs, 2, &out), 0); /* n1, n2: interval 1 is met ... */
    assert_int_equal(out.verdict, TS_PEERING_WAIT); /* ... the pending one is not */
    assert_int_equal(out.nsets, 2);
    assert_int_equal(out.sets[1].epoch, 5);
    assert_true(out.sets[1].pending);
    assert_non_null(strstr(out.why, "pending"));
    assert_int_equal(decide("n1", rs, 3, &out), 0); /* n4 answers: 2 of {n2, n4, n5} */
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE);
    /* A pending interval older than the newest started one is history. */
    rs[0].st.les = 6;
    assert_int_equal(decide("n1", rs, 2, &out), 0);
    assert_int_equal(out.nsets, 1);
}

static void test_tie_prefers_self_and_self_required(void **state)
{
    struct ts_peer_reply rs[2] = {reply("n2", 2, 5, 2, 2, "n2", "n3", ""),
                                  reply("n3", 2, 5, 2, 2, "n2", "n3", "")};
    struct ts_peering_out out;

    assert_int_equal(decide("n3", rs, 2, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE);
    assert_int_equal(decide("n9", rs, 2, &out), TS_EINVAL);
}

/* A rebalance moved the PG from {n1, n2, n4} to {n1, n2, n3} while n1 was down (interval 2:
 * {n2, n4, n3}; interval 3, once settled: {n2, n3}), then dropped n4's copies; n4 keeps its log.
 * n1 returns and leads: it must pull from a member of the newest interval, never from n4,
 * whose log names shards it no longer holds (they would reach n1 as "gone": a copy short). */
static void test_pull_source_is_a_member(void **state)
{
    struct ts_peer_reply rs[4] = {
        reply("n1", 1, 3, 1, 2, "n1", "n2", "n4"), reply("n4", 2, 7, 2, 2, "n2", "n4", "n3"),
        reply("n2", 2, 7, 3, 2, "n2", "n3", ""), reply("n3", 2, 7, 3, 2, "n2", "n3", "")};
    struct ts_peering_out out;

    assert_int_equal(decide("n1", rs, 4, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n2");
    assert_int_equal(out.head_seq, 7);
    /* Between members at the head, the interval's primary (first in its acting order) is the
     * source, whoever answered first: a member past a narrow dataset's width holds that
     * dataset's entries as no-ops. */
    {
        struct ts_peer_reply sw[4] = {rs[0], rs[1], rs[3], rs[2]}; /* n3 before n2 */
        assert_int_equal(decide("n1", sw, 4, &out), 0);
        assert_string_equal(out.pull_from, "n2");
    }
    /* A node outside every set never leads the head, even when it reports a longer log: what
     * it holds beyond the sets' head was never acknowledged. */
    rs[1].st.applied = 9;
    assert_int_equal(decide("n1", rs, 4, &out), 0);
    assert_string_equal(out.pull_from, "n2");
    assert_int_equal(out.head_seq, 7);
    rs[1].st.applied = 7;
    /* Interval 3 only prepared (pending on n2 and n3): n4 is in interval 2's set, n2 in the
     * newer one; the newer set's member is the source. */
    for (int i = 2; i < 4; i++) {
        rs[i].st.les = 2;
        rs[i].st.npending = 1;
        rs[i].st.pending[0].epoch = 3;
        rs[i].st.pending[0].wq = 2;
        rs[i].st.pending[0].n = 2;
        snprintf(rs[i].st.pending[0].acting[0], 64, "n2");
        snprintf(rs[i].st.pending[0].acting[1], 64, "n3");
        snprintf(rs[i].st.acting[1], 64, "n4");
        snprintf(rs[i].st.acting[2], 64, "n3");
        rs[i].st.nacting = 3;
    }
    assert_int_equal(decide("n1", rs, 4, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n2");
}

/* Issue 27: a node that holds the log but not the shards (a weight change made it the primary
 * of a PG it applied as no-ops) never leads from its log alone: it pulls, with a backfill, from
 * the fittest member at the same head, or waits for one. */
static void test_primary_without_shards_is_backfilled(void **state)
{
    struct ts_peer_reply rs[3] = {reply("n4", 3, 9, 3, 2, "n1", "n2", "n3"),
                                  reply("n2", 3, 9, 3, 2, "n1", "n2", "n3"),
                                  reply("n3", 3, 9, 3, 2, "n1", "n2", "n3")};
    struct ts_peering_in in = {10, "n4", map5, 5, rs, 3, 0};
    struct ts_peering_out out;

    assert_int_equal(ts_peering_decide(&in, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_ACTIVATE); /* the log alone would do */
    in.self_needs_backfill = 1;
    assert_int_equal(ts_peering_decide(&in, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n2"); /* before n3 in interval 3's acting order */
    assert_int_equal(out.head_seq, 9);
    assert_non_null(strstr(out.why, "backfill"));
    /* n2 awaits a backfill itself: n3 (holding the shards) is the source. */
    rs[1].lacks_shards = 1;
    assert_int_equal(ts_peering_decide(&in, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n3");
    /* Not marked, pulling an ordinary log: a member holding the shards is the source too. */
    in.self_needs_backfill = 0;
    rs[0].st.applied = 8;
    assert_int_equal(ts_peering_decide(&in, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_PULL);
    assert_string_equal(out.pull_from, "n3");
    rs[1].lacks_shards = 0;
    rs[0].st.applied = 9;
    in.self_needs_backfill = 1;
    /* Only members behind it answered (n3 at 8): none can backfill it up to its head. */
    rs[1] = reply("n3", 3, 8, 3, 2, "n1", "n2", "n3");
    rs[2] = reply("n1", 3, 8, 3, 2, "n1", "n2", "n3");
    assert_int_equal(ts_peering_decide(&in, &out), 0);
    assert_int_equal(out.verdict, TS_PEERING_WAIT);
    assert_non_null(strstr(out.why, "not its shards"));
}

/* ---- ts_peering_rollback: the only decision that rolls a replica back ---------------------- */

/* Our log: entries (epoch, seq) 1..n with epochs from `ep` (ep[seq]); the replica's tail from
 * its head down, as PG_INFO sends it. */
struct rb_case {
    uint64_t ep[64];
    uint64_t my_applied;
    struct ts_log_pos tail[8];
    size_t ntail;
    uint64_t ours[8];
};

static int rollback(struct rb_case *c, int authoritative, uint64_t interval, uint64_t life,
                    uint64_t asked_interval, uint64_t asked_life, struct ts_rollback_out *out)
{
    struct ts_rollback_in in;

    memset(&in, 0, sizeof(in));
    for (size_t i = 0; i < c->ntail; i++)
        c->ours[i] = c->tail[i].seq <= c->my_applied ? c->ep[c->tail[i].seq] : 0;
    in.authoritative = authoritative;
    in.interval = interval;
    in.life = life;
    in.asked_interval = asked_interval;
    in.asked_life = asked_life;
    in.my_applied = c->my_applied;
    in.my_epoch = c->my_applied ? c->ep[c->my_applied] : 0;
    in.applied = c->ntail ? c->tail[0].seq : 0;
    in.head_epoch = c->ntail ? c->tail[0].epoch : 0;
    in.tail = c->tail;
    in.ntail = c->ntail;
    in.ours = c->ours;
    if (c->ntail && c->tail[c->ntail - 1].seq > 1 && c->tail[c->ntail - 1].seq - 1 <= c->my_applied)
        in.ours_before = c->ep[c->tail[c->ntail - 1].seq - 1];
    return ts_peering_rollback(&in, out);
}

/* The PG 18: n2 (head (7, 49)) came back as primary at epoch 9 and, still peering, got
 * n3's PG_INFO reply showing (8, 50)..(8, 54), acknowledged while n2 was cut off. */
static struct rb_case pg18(void)
{
    struct rb_case c;

    memset(&c, 0, sizeof(c));
    for (int s = 1; s <= 49; s++)
        c.ep[s] = 7;
    c.my_applied = 49;
    for (int i = 0; i < 6; i++) {
        c.tail[i].seq = 54 - (uint64_t)i;
        c.tail[i].epoch = i < 5 ? 8 : 7;
    }
    c.ntail = 6;
    return c;
}

static void test_rollback_stale_reply_after_map_change(void **state)
{
    struct rb_case c = pg18();
    struct ts_rollback_out out;

    /* Peering (not activating, not active): never, whatever the reply says. */
    assert_int_equal(rollback(&c, 0, 0, 0, 7, 3, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_REFUSE);
    assert_non_null(strstr(out.why, "not the PG's authoritative one"));
    /* A reply asked for in the earlier life (interval 7), read once the PG is active at 9. */
    assert_int_equal(rollback(&c, 1, 9, 5, 7, 3, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_REFUSE);
    assert_non_null(strstr(out.why, "earlier peering life"));
    /* Same interval, another life (peered again at the same epoch). */
    assert_int_equal(rollback(&c, 1, 9, 5, 9, 4, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_REFUSE);
    /* Authoritative under interval 7 only (a deposed primary whose map is old): the entries of
     * epoch 8 are newer than that interval: never divergent from where it stands. */
    assert_int_equal(rollback(&c, 1, 7, 3, 7, 3, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_REFUSE);
    assert_non_null(strstr(out.why, "newer than the interval"));
    /* Active at 9 in this life (peering saw a quorum of interval 8 without those entries: they
     * were never acknowledged): rolled back to the common entry 49. */
    assert_int_equal(rollback(&c, 1, 9, 5, 9, 5, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_TRUNCATE);
    assert_int_equal(out.to, 49);
    assert_int_equal(out.to_epoch, 7);
}

/* Authoritative under interval 5, life 1, asked in that life: the verdict and where to. */
static void expect_rollback(struct rb_case *c, int verdict, uint64_t to, uint64_t to_epoch)
{
    struct ts_rollback_out out;

    assert_int_equal(rollback(c, 1, 5, 1, 5, 1, &out), 0);
    assert_int_equal(out.verdict, verdict);
    assert_int_equal(out.to, to);
    if (verdict == TS_ROLLBACK_TRUNCATE)
        assert_int_equal(out.to_epoch, to_epoch);
}

static void test_rollback_prefix_and_divergent(void **state)
{
    struct rb_case c;
    struct ts_rollback_out out;

    memset(&c, 0, sizeof(c));
    for (int s = 1; s <= 20; s++)
        c.ep[s] = s <= 10 ? 2 : 4;
    c.my_applied = 20;
    /* A prefix: known at its head. */
    c.tail[0] = (struct ts_log_pos){12, 4};
    c.tail[1] = (struct ts_log_pos){11, 4};
    c.ntail = 2;
    expect_rollback(&c, TS_ROLLBACK_PREFIX, 12, 0);
    /* The same from an earlier life: nothing decided (its position may be another now). */
    assert_int_equal(rollback(&c, 1, 5, 2, 5, 1, &out), 0);
    assert_int_equal(out.verdict, TS_ROLLBACK_STALE);
    /* An empty replica: a prefix. */
    c.ntail = 0;
    expect_rollback(&c, TS_ROLLBACK_PREFIX, 0, 0);
    /* An old primary's entries of epoch 3 after our 10 (ours are of epoch 4): divergent. */
    c.tail[0] = (struct ts_log_pos){12, 3};
    c.tail[1] = (struct ts_log_pos){11, 3};
    c.tail[2] = (struct ts_log_pos){10, 2};
    c.ntail = 3;
    expect_rollback(&c, TS_ROLLBACK_TRUNCATE, 10, 2);
    /* Nothing in common among what it sent: back past all of it, to our entry before. */
    c.tail[0] = (struct ts_log_pos){13, 3};
    c.tail[1] = (struct ts_log_pos){12, 3};
    c.ntail = 2;
    expect_rollback(&c, TS_ROLLBACK_TRUNCATE, 11, 4);
    /* An entry of an epoch newer than the interval we are authoritative under (6 > 5): never
     * divergent from here, whatever else the replica holds. */
    c.tail[0] = (struct ts_log_pos){22, 6};
    c.tail[1] = (struct ts_log_pos){21, 4};
    c.ntail = 2;
    expect_rollback(&c, TS_ROLLBACK_REFUSE, 20, 0);
    /* A trimmed position counts as ours. */
    c.tail[0] = (struct ts_log_pos){3, 2};
    c.ntail = 1;
    c.ep[3] = 2;
    {
        struct ts_rollback_in in;
        uint64_t ours[1] = {TS_ROLLBACK_TRIMMED};
        memset(&in, 0, sizeof(in));
        in.authoritative = 1;
        in.interval = in.asked_interval = 5;
        in.life = in.asked_life = 1;
        in.my_applied = 20;
        in.my_epoch = 4;
        in.applied = 3;
        in.head_epoch = 2;
        in.tail = c.tail;
        in.ntail = 1;
        in.ours = ours;
        assert_int_equal(ts_peering_rollback(&in, &out), 0);
        assert_int_equal(out.verdict, TS_ROLLBACK_PREFIX);
        in.ours = NULL;
        assert_int_equal(ts_peering_rollback(&in, &out), TS_EINVAL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quorum),
        cmocka_unit_test(test_head_order),
        cmocka_unit_test(test_bootstrap),
        cmocka_unit_test(test_failover_of_dead_primary),
        cmocka_unit_test(test_returning_node_pulls),
        cmocka_unit_test(test_divergent_old_primary),
        cmocka_unit_test(test_replica_ahead),
        cmocka_unit_test(test_later_interval_needs_its_quorum),
        cmocka_unit_test(test_pending_interval_needs_its_quorum),
        cmocka_unit_test(test_tie_prefers_self_and_self_required),
        cmocka_unit_test(test_pull_source_is_a_member),
        cmocka_unit_test(test_primary_without_shards_is_backfilled),
        cmocka_unit_test(test_rollback_stale_reply_after_map_change),
        cmocka_unit_test(test_rollback_prefix_and_divergent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
