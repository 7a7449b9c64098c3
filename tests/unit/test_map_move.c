/* Unit tests for a rebalance's state in the map (common/map_move.c) and what placement and
 * the replication ranks make of it: PGs pending or moving keep the old table's placement (with
 * the nodes down now left out), settled ones take the target's, a moving PG's incoming nodes
 * rank where they will; the file and the wire carry it; bad states are refused. */
#include "ts_test.h"

#include "ts_map.h"
#include "ts_proto.h"
#include "ts_repl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPG 64

/* n nodes n0..n{n-1}, equal weights, each its own domain. */
static struct ts_map *make_map(size_t n)
{
    struct ts_map *m = calloc(1, sizeof(*m));

    assert_non_null(m);
    m->nodes = calloc(n, sizeof(*m->nodes));
    assert_non_null(m->nodes);
    m->n = n;
    m->epoch = 5;
    m->pg_count = NPG;
    for (size_t i = 0; i < n; i++) {
        snprintf(m->nodes[i].id, sizeof(m->nodes[i].id), "n%zu", i);
        snprintf(m->nodes[i].addr, sizeof(m->nodes[i].addr), "127.0.0.1:%zu", 7000 + i);
        m->nodes[i].weight = 100;
        m->nodes[i].state = TS_NODE_UP;
    }
    return m;
}

/* The ids of PG pg's first k replicas under m, joined by spaces. */
static void ids(const struct ts_map *m, uint32_t pg, size_t k, int target, char *out, size_t cap)
{
    int order[16];
    size_t n = target ? ts_map_pg_target_order(m, pg, order, k) : ts_map_pg_order(m, pg, order, k);

    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", m->nodes[order[i]].id);
}

/* Target: the 4-node table plus n4; the rebalance from the 4-node table, PG states given. */
static struct ts_map *moving_map(const struct ts_map *old, const uint8_t *st)
{
    struct ts_map *t = make_map(5);

    assert_int_equal(ts_map_move_set(t, old->nodes, old->n, st, 0, 0), 0);
    return t;
}

static void test_placement(void **state)
{
    struct ts_map *old = make_map(4), *plain = make_map(5), *t;
    uint8_t st[NPG];
    char a[256], b[256];
    unsigned moved = 0;

    (void)state;
    for (uint32_t pg = 0; pg < NPG; pg++)
        st[pg] = pg % 3 == 0 ? TS_PG_SETTLED : pg % 3 == 1 ? TS_PG_PENDING : TS_PG_MOVING;
    t = moving_map(old, st);
    for (uint32_t pg = 0; pg < NPG; pg++) {
        int order[8];
        size_t n = ts_map_pg_order(t, pg, order, 8);

        assert_int_equal(ts_map_pg_move_state(t, pg), st[pg]);
        assert_int_equal(n, 5); /* every node that is up, the added one too */
        ids(t, pg, 5, 1, a, sizeof(a));
        ids(plain, pg, 5, 0, b, sizeof(b));
        assert_string_equal(a, b); /* the target order is the table's */
        if (st[pg] == TS_PG_SETTLED) {
            ids(t, pg, 5, 0, a, sizeof(a));
            assert_string_equal(a, b);
            continue;
        }
        /* Kept: the old order first, the added node last. */
        ids(t, pg, 4, 0, a, sizeof(a));
        ids(old, pg, 4, 0, b, sizeof(b));
        assert_string_equal(a, b);
        assert_string_equal(t->nodes[order[4]].id, "n4");
        ids(plain, pg, 3, 0, b, sizeof(b));
        moved += strstr(b, "n4") != NULL;
    }
    assert_true(moved > 0); /* the test covers PGs that n4 joins */
    ts_map_free(old);
    ts_map_free(plain);
    ts_map_free(t);
}

/* In a moving PG the incoming node ranks where it will; pending: after the old nodes. */
static void test_ranks(void **state)
{
    struct ts_map *old = make_map(4), *plain = make_map(5), *t;
    uint8_t st[NPG];
    unsigned seen = 0;

    (void)state;
    memset(st, TS_PG_MOVING, sizeof(st));
    t = moving_map(old, st);
    for (uint32_t pg = 0; pg < NPG; pg++) {
        int want = ts_repl_rank_of(plain, pg, "n4");
        int got = ts_repl_rank_of(t, pg, "n4");

        if (want >= 3)
            continue;
        seen++;
        assert_int_equal(got, want);
        /* The primary stays where it was; nodes already there keep their rank. */
        for (int i = 0; i < 4; i++) {
            char id[8];
            snprintf(id, sizeof(id), "n%d", i);
            if (ts_repl_rank_of(old, pg, id) == 0)
                assert_int_equal(ts_repl_rank_of(t, pg, id), 0);
        }
        ts_map_move_pg(t, pg, TS_PG_PENDING);
        assert_int_equal(ts_repl_rank_of(t, pg, "n4"), 4);
        ts_map_move_pg(t, pg, TS_PG_MOVING);
    }
    assert_true(seen > 0);
    ts_map_free(old);
    ts_map_free(plain);
    ts_map_free(t);
}

/* A node down now is left out of the kept placement too; one out now is not (it drains). */
static void test_states_now(void **state)
{
    struct ts_map *old = make_map(4), *t;
    uint8_t st[NPG];

    (void)state;
    memset(st, TS_PG_PENDING, sizeof(st));
    t = moving_map(old, st);
    t->nodes[1].state = TS_NODE_DOWN; /* changed in place, as the CLI does before a push */
    t->nodes[2].state = TS_NODE_OUT;
    for (uint32_t pg = 0; pg < NPG; pg++) {
        int order[8];
        size_t n = ts_map_pg_order(t, pg, order, 8);
        int has2 = 0;
        for (size_t i = 0; i < n; i++) {
            assert_string_not_equal(t->nodes[order[i]].id, "n1");
            has2 |= !strcmp(t->nodes[order[i]].id, "n2");
        }
        assert_true(has2);
    }
    ts_map_free(old);
    ts_map_free(t);
}

static void assert_same(const struct ts_map *a, const struct ts_map *b)
{
    char x[256], y[256];

    assert_int_equal(a->n, b->n);
    assert_non_null(b->move);
    assert_int_equal(a->move->nfrom, b->move->nfrom);
    assert_int_equal(a->move->paused, b->move->paused);
    assert_true(a->move->rate == b->move->rate);
    assert_true(a->move->driver == b->move->driver);
    assert_int_equal(a->move->concurrent, b->move->concurrent);
    assert_memory_equal(a->move->pg, b->move->pg, a->pg_count);
    for (uint32_t pg = 0; pg < a->pg_count; pg++) {
        ids(a, pg, 5, 0, x, sizeof(x));
        ids(b, pg, 5, 0, y, sizeof(y));
        assert_string_equal(x, y);
    }
}

static void test_file_and_wire(void **state)
{
    struct ts_map *old = make_map(4), *t, *back = NULL, *dup;
    char path[] = "/tmp/test_map_move.XXXXXX", err[512];
    uint8_t st[NPG];
    struct ts_wr w;
    struct ts_rd r;
    int fd;

    (void)state;
    for (uint32_t pg = 0; pg < NPG; pg++)
        st[pg] = (uint8_t)(pg % 3);
    t = moving_map(old, st);
    t->move->paused = 1;
    t->move->rate = 5000000000ull;
    t->move->driver = 0x123456789abcull;
    t->move->concurrent = 7; /* --max-concurrent, kept for the next resume */
    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ts_map_write_file(t, path), 0);
    assert_int_equal(ts_map_parse_file(path, &back, err, sizeof(err)), 0);
    assert_same(t, back);
    ts_map_free(back);
    back = NULL;

    ts_wr_init(&w);
    ts_map_encode(&w, t);
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_map_decode(&r, &back), 0);
    assert_int_equal(ts_rd_done(&r), 0);
    assert_same(t, back);
    ts_map_free(back);
    /* Cut anywhere in the rebalance: refused. */
    for (size_t cut = w.len - 1; cut > w.len - NPG - 40; cut--) {
        struct ts_map *bad = NULL;
        ts_rd_init(&r, w.buf, cut);
        assert_int_equal(ts_map_decode(&r, &bad), TS_EPROTO);
        assert_null(bad);
    }
    ts_wr_fini(&w);

    dup = ts_map_dup(t);
    assert_non_null(dup);
    assert_same(t, dup);
    ts_map_move_clear(dup);
    assert_null(dup->move);
    assert_int_equal(ts_map_pg_move_state(dup, 1), TS_PG_SETTLED);
    ts_map_free(dup);
    unlink(path);
    ts_map_free(old);
    ts_map_free(t);
}

static void test_refused(void **state)
{
    static const char head[] = "epoch = 3; pg_count = 8;\n"
                               "nodes = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; },\n"
                               "          { id = \"b\"; addr = \"127.0.0.1:2\"; weight = 1; } );\n";
    static const struct {
        const char *move, *why;
    } bad[] = {
        {"rebalance = { from = ( { id = \"c\"; addr = \"127.0.0.1:3\"; weight = 1; } ); };",
         "every node must be in nodes"},
        {"rebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } ); "
         "pending = [ 8 ]; };",
         "PG numbers are 0..7"},
        {"rebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } ); "
         "pending = [ 1 ]; moving = [ 1 ]; };",
         "listed twice"},
        {"rebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } ); "
         "speed = 1; };",
         "unknown rebalance setting"},
        {"rebalance = { pending = [ 1 ]; };", "rebalance.from must list"},
        {"rebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } ); "
         "paused = 1; };",
         "true or false"},
        {"rebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } ); "
         "from_placement_pgs = 3; };",
         "from_placement_pgs 3 must divide pg_count 8"},
        {"placement_pgs = 3;", "placement_pgs 3 must divide pg_count 8"},
        {"placement_pgs = 16;", "placement_pgs 16 must divide pg_count 8"},
    };
    char text[1024], err[512];

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ts_map *m = NULL;
        snprintf(text, sizeof(text), "%s%s\n", head, bad[i].move);
        assert_int_equal(ts_map_parse_string(text, &m, err, sizeof(err)), TS_ECONFIG);
        assert_null(m);
        if (!strstr(err, bad[i].why))
            fail_msg("case %zu: '%s' does not say '%s'", i, err, bad[i].why);
    }
    /* The good one parses. */
    {
        struct ts_map *m = NULL;
        snprintf(text, sizeof(text),
                 "%srebalance = { from = ( { id = \"a\"; addr = \"127.0.0.1:1\"; weight = 1; } "
                 "); pending = [ 1, 2 ]; moving = [ 3 ]; paused = true; rate = 100; };\n",
                 head);
        assert_int_equal(ts_map_parse_string(text, &m, err, sizeof(err)), 0);
        assert_int_equal(ts_map_pg_move_state(m, 2), TS_PG_PENDING);
        assert_int_equal(ts_map_pg_move_state(m, 3), TS_PG_MOVING);
        assert_int_equal(ts_map_pg_move_state(m, 4), TS_PG_SETTLED);
        ts_map_free(m);
    }
}

/* A split: pg_count doubles with placement_pgs the count before, so every child PG (pg + NPG)
 * is placed as its parent and nothing moves; the split's rebalance then spreads the children
 * (placement_pgs back to pg_count, from_placement the count before): pending children keep
 * their parent's nodes, settled ones take their own. File, wire and copy carry both counts. */
static void test_split(void **state)
{
    struct ts_map *m = make_map(5), *s, *t, *back = NULL, *dup;
    uint8_t st[2 * NPG] = {0};
    char x[128], y[128], path[] = "/tmp/test_map_split.XXXXXX", err[512];
    unsigned moved = 0;
    struct ts_wr w;
    struct ts_rd r;
    int fd;

    (void)state;
    assert_true(ts_map_pg_count_splits(NPG, 2 * NPG));
    assert_true(ts_map_pg_count_splits(NPG, 8 * NPG));
    assert_false(ts_map_pg_count_splits(NPG, 3 * NPG));
    assert_false(ts_map_pg_count_splits(NPG, NPG));
    assert_false(ts_map_pg_count_splits(NPG, NPG / 2));
    assert_false(ts_map_pg_count_splits(NPG, 2 * TS_MAP_MAX_PGS));

    s = ts_map_dup(m);
    assert_non_null(s);
    s->pg_count = 2 * NPG;
    s->placement_pgs = NPG;
    assert_int_equal(ts_map_placement_pgs(s), NPG);
    for (uint32_t pg = 0; pg < 2 * NPG; pg++) {
        ids(m, pg % NPG, 5, 0, x, sizeof(x));
        ids(s, pg, 5, 0, y, sizeof(y));
        assert_string_equal(x, y); /* the child with its parent */
    }
    /* A shard of a parent's goes to it or to its child (pg + NPG). */
    for (uint32_t shard = 0; shard < 1000; shard++) {
        uint32_t a = ts_pg_of("d", shard, NPG), b = ts_pg_of("d", shard, 2 * NPG);
        assert_true(b == a || b == a + NPG);
    }

    /* The spreading: children whose own placement differs pending. */
    t = ts_map_dup(s);
    assert_non_null(t);
    t->placement_pgs = 0;
    for (uint32_t pg = NPG; pg < 2 * NPG; pg++) {
        ids(s, pg, 3, 0, x, sizeof(x));
        ids(t, pg, 3, 1, y, sizeof(y));
        st[pg] = strcmp(x, y) ? TS_PG_PENDING : TS_PG_SETTLED;
        moved += st[pg] == TS_PG_PENDING;
    }
    assert_true(moved > NPG / 2);
    assert_int_equal(ts_map_move_set(t, s->nodes, s->n, st, 0, 0), 0);
    assert_int_equal(ts_map_move_set_from_placement(t, NPG), 0);
    for (uint32_t pg = 0; pg < 2 * NPG; pg++) {
        ids(st[pg] ? s : t, pg, 3, st[pg] ? 0 : 1, x, sizeof(x));
        ids(t, pg, 3, 0, y, sizeof(y));
        assert_string_equal(x, y);
    }
    ts_map_move_pg(t, NPG + 1, TS_PG_SETTLED);
    ids(t, NPG + 1, 3, 1, x, sizeof(x));
    ids(t, NPG + 1, 3, 0, y, sizeof(y));
    assert_string_equal(x, y);

    /* The file, the wire and a copy keep both counts. */
    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (int k = 0; k < 2; k++) {
        const struct ts_map *a = k ? t : s;
        assert_int_equal(ts_map_write_file(a, path), 0);
        if (ts_map_parse_file(path, &back, err, sizeof(err)) != 0)
            fail_msg("%s", err);
        assert_int_equal(back->placement_pgs, a->placement_pgs);
        assert_int_equal(back->move ? back->move->from_placement : 0,
                         a->move ? a->move->from_placement : 0);
        for (uint32_t pg = 0; pg < 2 * NPG; pg++) {
            ids(a, pg, 5, 0, x, sizeof(x));
            ids(back, pg, 5, 0, y, sizeof(y));
            assert_string_equal(x, y);
        }
        ts_map_free(back);
        back = NULL;
        ts_wr_init(&w);
        ts_map_encode(&w, a);
        ts_rd_init(&r, w.buf, w.len);
        assert_int_equal(ts_map_decode(&r, &back), 0);
        assert_int_equal(ts_rd_done(&r), 0);
        dup = ts_map_dup(back);
        assert_non_null(dup);
        for (uint32_t pg = 0; pg < 2 * NPG; pg++) {
            ids(a, pg, 5, 0, x, sizeof(x));
            ids(dup, pg, 5, 0, y, sizeof(y));
            assert_string_equal(x, y);
        }
        ts_map_free(dup);
        ts_map_free(back);
        back = NULL;
        /* A placement count that does not divide pg_count is refused on the wire. */
        w.buf[w.len - 1] = 3;
        ts_rd_init(&r, w.buf, w.len);
        assert_int_equal(ts_map_decode(&r, &back), TS_EPROTO);
        assert_null(back);
        ts_wr_fini(&w);
    }
    unlink(path);
    assert_int_equal(ts_map_move_set_from_placement(t, 3), TS_EINVAL);
    ts_map_free(m);
    ts_map_free(s);
    ts_map_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement),  cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_states_now), cmocka_unit_test(test_file_and_wire),
        cmocka_unit_test(test_refused),    cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
