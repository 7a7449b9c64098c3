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
    struct ts_peering_in in = {10, self, map5, 5, rs, n};
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
