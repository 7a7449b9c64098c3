/*
 * The monitor's policy (control/policy.c), pure, on simulated time: a node whose lease is gone is
 * marked down after down_after and out after out_after, back up once registered and caught up
 * for up_after; three of five nodes losing their leases together leave two up (the guard rail);
 * a node that stops and continues (SIGSTOP/SIGCONT) every few seconds makes a bounded number of
 * map changes; and over random schedules a registered node is never marked down, the nodes the
 * policy keeps away never pass the guard, and every change is one epoch.
 */
#include "ts_test.h"

#include "policy.h"
#include "tessera/errno.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MAP5[] = "epoch = 1; pg_count = 16; nodes = ("
                           "{ id = \"n1\"; addr = \"127.0.0.1:1\"; weight = 100; },"
                           "{ id = \"n2\"; addr = \"127.0.0.1:2\"; weight = 100; },"
                           "{ id = \"n3\"; addr = \"127.0.0.1:3\"; weight = 100; },"
                           "{ id = \"n4\"; addr = \"127.0.0.1:4\"; weight = 100; },"
                           "{ id = \"n5\"; addr = \"127.0.0.1:5\"; weight = 100; });";

struct sim {
    struct ts_policy p;
    struct ts_policy_cfg c;
    struct ts_map *m;
    uint64_t now;
    int reg[5], caught[5];
    unsigned changes;
};

static void sim_init(struct sim *s)
{
    char err[256];

    memset(s, 0, sizeof(*s));
    ts_policy_init(&s->p);
    ts_policy_cfg_defaults(&s->c);
    assert_int_equal(ts_map_parse_string(MAP5, &s->m, err, sizeof(err)), 0);
    for (int i = 0; i < 5; i++)
        s->reg[i] = s->caught[i] = 1;
}

static void sim_fini(struct sim *s)
{
    ts_policy_fini(&s->p);
    ts_map_free(s->m);
}

/* One monitor round at s->now: observe every node, decide, install what it returns. Checks the
 * invariants of every decision. */
static void sim_round(struct sim *s)
{
    struct ts_map *next = NULL;
    char why[512];

    for (int i = 0; i < 5; i++)
        ts_policy_observe(&s->p, s->m->nodes[i].id, s->reg[i], s->caught[i], s->now);
    assert_int_equal(ts_policy_decide(&s->p, s->m, &s->c, s->now, &next, why, sizeof(why)), 0);
    if (!next)
        return;
    assert_true(next->epoch == s->m->epoch + 1);
    for (int i = 0; i < 5; i++) {
        if (s->m->nodes[i].state == TS_NODE_UP && next->nodes[i].state != TS_NODE_UP)
            assert_false(s->reg[i]); /* a registered node is never marked down */
    }
    ts_map_free(s->m);
    s->m = next;
    s->changes++;
}

static void sim_for(struct sim *s, uint64_t ms)
{
    for (uint64_t end = s->now + ms; s->now < end; s->now += 500)
        sim_round(s);
}

static int state_of(const struct sim *s, int i)
{
    return s->m->nodes[i].state;
}

static void test_down_out_and_back(void **state)
{
    struct sim s;

    (void)state;
    sim_init(&s);
    sim_for(&s, 10000);
    assert_int_equal(s.changes, 0);
    s.reg[2] = 0; /* n3's lease is gone */
    sim_for(&s, s.c.down_after_ms - 500);
    assert_int_equal(state_of(&s, 2), TS_NODE_UP); /* not before down_after */
    sim_for(&s, 1000);
    assert_int_equal(state_of(&s, 2), TS_NODE_DOWN);
    assert_int_equal(s.changes, 1);
    /* Back but not caught up: stays down; caught up for up_after: up. */
    s.reg[2] = 1, s.caught[2] = 0;
    sim_for(&s, 20000);
    assert_int_equal(state_of(&s, 2), TS_NODE_DOWN);
    s.caught[2] = 1;
    sim_for(&s, s.c.up_after_ms + 1000);
    assert_int_equal(state_of(&s, 2), TS_NODE_UP);
    /* Gone for out_after: out; back: up again (the policy put it out). */
    s.reg[4] = 0;
    sim_for(&s, s.c.out_after_ms + s.c.down_after_ms + 1000);
    assert_int_equal(state_of(&s, 4), TS_NODE_OUT);
    s.reg[4] = 1;
    sim_for(&s, s.c.up_after_ms + 1000);
    assert_int_equal(state_of(&s, 4), TS_NODE_UP);
    /* An operator's out is not undone. */
    s.m->nodes[1].state = TS_NODE_OUT;
    sim_for(&s, 60000);
    assert_int_equal(state_of(&s, 1), TS_NODE_OUT);
    sim_fini(&s);
}

static void test_guard_three_of_five(void **state)
{
    struct sim s;
    int down = 0;

    (void)state;
    sim_init(&s);
    s.reg[0] = s.reg[2] = s.reg[3] = 0; /* an etcd partition, or a rack's power */
    sim_for(&s, 60000);
    for (int i = 0; i < 5; i++)
        down += state_of(&s, i) != TS_NODE_UP;
    assert_int_equal(down, 1); /* 34 % of 5: one node away, the others wait */
    /* The one marked down comes back: the next may go. */
    for (int i = 0; i < 5; i++)
        if (state_of(&s, i) != TS_NODE_UP)
            s.reg[i] = 1;
    sim_for(&s, 60000);
    down = 0;
    for (int i = 0; i < 5; i++)
        down += state_of(&s, i) != TS_NODE_UP;
    assert_int_equal(down, 1);
    sim_fini(&s);
}

/* Two nodes lose their leases but still answer their peers (cut off from etcd alone), core 3 /
 * min_core 2, no max_down_pct limit: the first goes down (every PG keeps two reachable copies),
 * the second stays up while marking it down would leave PGs with one; once it stops answering
 * too, it goes down (its copy is unreachable either way). Without the guard both go at once. */
static void test_min_core_guard(void **state)
{
    struct sim s;
    int down = 0;

    (void)state;
    sim_init(&s);
    s.c.max_down_pct = 100;
    s.c.core = 3;
    s.c.min_core = 2;
    s.reg[0] = s.reg[1] = 0;
    for (int i = 0; i < 5; i++)
        ts_policy_observe(&s.p, s.m->nodes[i].id, s.reg[i], s.caught[i], s.now);
    ts_policy_reachable(&s.p, "n1", 1);
    ts_policy_reachable(&s.p, "n2", 1);
    sim_for(&s, 60000);
    for (int i = 0; i < 5; i++)
        down += state_of(&s, i) == TS_NODE_DOWN;
    assert_int_equal(down, 1);
    assert_int_equal(state_of(&s, 0), TS_NODE_DOWN);
    assert_int_equal(state_of(&s, 1), TS_NODE_UP);
    ts_policy_reachable(&s.p, "n2", 0);
    sim_for(&s, 1000);
    assert_int_equal(state_of(&s, 1), TS_NODE_DOWN);
    sim_fini(&s);
}

/* SIGSTOP/SIGCONT of one node: its lease comes and goes every ~10 s for 30 minutes. */
static void test_flapping_is_damped(void **state)
{
    struct sim s;

    (void)state;
    sim_init(&s);
    for (int cycle = 0; cycle < 138; cycle++) { /* 13 s each: 30 min */
        s.reg[1] = 0;
        sim_for(&s, 9000); /* longer than down_after */
        s.reg[1] = 1;
        sim_for(&s, 4000); /* longer than up_after */
    }
    fprintf(stderr, "  30 min of stop/continue cycles: %u map changes\n", s.changes);
    /* Per damping period at most flap_max changes, plus the last state's. */
    assert_true(s.changes <= (30 * 60000 / s.c.damp_ms + 1) * s.c.flap_max + 1);
    sim_fini(&s);
}

static void test_random_schedules(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 200; seed++) {
        struct sim s;
        srandom(seed);
        sim_init(&s);
        s.c.out_after_ms = 120000;
        for (int step = 0; step < 400; step++) {
            int i = (int)(random() % 5);
            if (random() % 3 == 0)
                s.reg[i] = !s.reg[i];
            s.caught[i] = random() % 4 != 0;
            sim_for(&s, 500 + (uint64_t)(random() % 8000));
            {
                int kept_away = 0;
                for (int k = 0; k < 5; k++)
                    kept_away += state_of(&s, k) == TS_NODE_DOWN;
                assert_true(kept_away <= 1); /* the guard: one of five */
            }
        }
        sim_fini(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_down_out_and_back),  cmocka_unit_test(test_guard_three_of_five),
        cmocka_unit_test(test_flapping_is_damped), cmocka_unit_test(test_min_core_guard),
        cmocka_unit_test(test_random_schedules),
    };
    return cmocka_run_group_tests_name("policy", tests, NULL, NULL);
}
