/* Unit tests for hot datasets in the map (common/map_hot.c): the file and wire forms, their
 * checks, the extra replicas a dataset gets per PG, and editing. */
#include "ts_test.h"

#include "ts_map.h"
#include "ts_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char base_text[] = "epoch = 3; pg_count = 16;\n"
                                "nodes = (\n"
                                "  { id = \"n1\"; addr = \"127.0.0.1:7101\"; weight = 100; },\n"
                                "  { id = \"n2\"; addr = \"127.0.0.1:7102\"; weight = 100; },\n"
                                "  { id = \"n3\"; addr = \"127.0.0.1:7103\"; weight = 100; }\n"
                                ");\n";

static struct ts_map *parse_with(const char *hot, char *err, size_t cap)
{
    char text[2048];
    struct ts_map *m = NULL;

    snprintf(text, sizeof(text), "%s%s", base_text, hot);
    if (ts_map_parse_string(text, &m, err, cap) != 0)
        return NULL;
    return m;
}

static void test_parse_and_extra(void **state)
{
    char err[256];
    struct ts_map *m = parse_with("hot = ( { dataset = \"img\"; fringe = 2; },\n"
                                  "        { dataset = \"img\"; pg = 5; fringe = 4; },\n"
                                  "        { dataset = \"txt\"; pg = 1; fringe = 1; } );\n",
                                  err, sizeof(err));

    assert_non_null(m);
    assert_int_equal(m->nhot, 3);
    assert_int_equal(ts_map_hot_extra(m, "img", 0), 2);
    assert_int_equal(ts_map_hot_extra(m, "img", 5), 4); /* the larger entry wins */
    assert_int_equal(ts_map_hot_extra(m, "txt", 1), 1);
    assert_int_equal(ts_map_hot_extra(m, "txt", 2), 0);
    assert_int_equal(ts_map_hot_extra(m, "other", 5), 0);
    assert_int_equal(ts_map_hot_extra_max(m, 5), 4);
    assert_int_equal(ts_map_hot_extra_max(m, 1), 2);
    assert_int_equal(ts_map_hot_extra(NULL, "img", 0), 0);
    ts_map_free(m);
    /* No hot list: nothing extra. */
    m = parse_with("", err, sizeof(err));
    assert_non_null(m);
    assert_int_equal(m->nhot, 0);
    assert_int_equal(ts_map_hot_extra(m, "img", 0), 0);
    ts_map_free(m);
}

static void test_parse_errors(void **state)
{
    static const struct {
        const char *hot, *why;
    } bad[] = {
        {"hot = ( { dataset = \"img\"; } );\n", "fringe"},
        {"hot = ( { fringe = 1; } );\n", "dataset"},
        {"hot = ( { dataset = \"img\"; fringe = 0; } );\n", "fringe"},
        {"hot = ( { dataset = \"img\"; fringe = 9; } );\n", "fringe"},
        {"hot = ( { dataset = \"img\"; pg = 16; fringe = 1; } );\n", "pg"},
        {"hot = ( { dataset = \".bad\"; fringe = 1; } );\n", "dataset name"},
        {"hot = ( { dataset = \"img\"; fringe = 1; color = 2; } );\n", "color"},
        {"hot = ( { dataset = \"img\"; fringe = 1; }, { dataset = \"img\"; fringe = 2; } );\n",
         "twice"},
        {"hot = { dataset = \"img\"; fringe = 1; };\n", "list"},
    };
    char err[256];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ts_map *m = parse_with(bad[i].hot, err, sizeof(err));
        if (m || !strstr(err, bad[i].why))
            fprintf(stderr, "case %zu: %s -> %s\n", i, bad[i].hot, m ? "accepted" : err);
        assert_null(m);
        assert_non_null(strstr(err, bad[i].why));
    }
}

static void test_file_and_wire_round_trip(void **state)
{
    char err[256], path[512];
    struct ts_map *m = parse_with("hot = ( { dataset = \"img\"; fringe = 2; },\n"
                                  "        { dataset = \"txt\"; pg = 7; fringe = 1; } );\n",
                                  err, sizeof(err));
    struct ts_map *back = NULL, *dup;
    char *dir = ts_test_tmpdir("map-hot");
    struct ts_wr w;
    struct ts_rd r;

    assert_non_null(m);
    snprintf(path, sizeof(path), "%s/cluster.map", dir);
    assert_int_equal(ts_map_write_file(m, path), 0);
    assert_int_equal(ts_map_parse_file(path, &back, err, sizeof(err)), 0);
    assert_int_equal(back->nhot, 2);
    assert_int_equal(ts_map_hot_extra(back, "img", 3), 2);
    assert_int_equal(ts_map_hot_extra(back, "txt", 7), 1);
    assert_int_equal(ts_map_hot_extra(back, "txt", 6), 0);
    ts_map_free(back);
    back = NULL;
    ts_wr_init(&w);
    ts_map_encode(&w, m);
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_map_decode(&r, &back), 0);
    assert_int_equal(ts_rd_done(&r), 0);
    assert_int_equal(back->nhot, 2);
    assert_true(ts_map_hot_same(m, back, 7) && ts_map_hot_same(m, back, 0));
    /* A bad entry on the wire is refused like in a file. */
    back->hot[0].fringe = 0;
    {
        struct ts_wr w2;
        struct ts_map *bad = NULL;
        ts_wr_init(&w2);
        ts_map_encode(&w2, back);
        ts_rd_init(&r, w2.buf, w2.len);
        assert_int_equal(ts_map_decode(&r, &bad), TS_EPROTO);
        assert_null(bad);
        ts_wr_fini(&w2);
    }
    dup = ts_map_dup(m);
    assert_non_null(dup);
    assert_int_equal(dup->nhot, 2);
    assert_true(dup->hot != m->hot);
    ts_map_free(dup);
    ts_map_free(back);
    ts_map_free(m);
    ts_wr_fini(&w);
    unlink(path);
    ts_test_rmtree(dir);
}

static void test_set_and_same(void **state)
{
    char err[256];
    struct ts_map *a = parse_with("", err, sizeof(err)), *b;

    assert_non_null(a);
    b = ts_map_dup(a);
    assert_true(ts_map_hot_same(a, b, 3));
    assert_int_equal(ts_map_hot_set(b, "img", -1, 2), 0);
    assert_false(ts_map_hot_same(a, b, 3));
    assert_true(ts_map_hot_grew(a, b, 3));                /* added: grew */
    assert_false(ts_map_hot_grew(b, a, 3));               /* removed: nobody gains */
    assert_int_equal(ts_map_hot_set(b, "img", -1, 3), 0); /* replaces */
    assert_int_equal(b->nhot, 1);
    assert_int_equal(ts_map_hot_extra(b, "img", 9), 3);
    assert_int_equal(ts_map_hot_set(b, "img", 4, 1), 0); /* one PG: a second entry */
    assert_int_equal(b->nhot, 2);
    assert_int_equal(ts_map_hot_set(b, "img", 16, 1), TS_EINVAL); /* no such PG */
    assert_int_equal(ts_map_hot_set(b, ".x", -1, 1), TS_EINVAL);
    assert_int_equal(ts_map_hot_set(b, "img", -1, TS_MAP_MAX_HOT_FRINGE + 1), TS_EINVAL);
    assert_int_equal(ts_map_hot_set(b, "txt", -1, 0), TS_ENOENT); /* nothing to remove */
    assert_int_equal(ts_map_hot_set(b, "img", -1, 0), 0);
    assert_int_equal(ts_map_hot_set(b, "img", 4, 0), 0);
    assert_int_equal(b->nhot, 0);
    assert_true(ts_map_hot_same(a, b, 4));
    ts_map_free(a);
    ts_map_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_extra),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_file_and_wire_round_trip),
        cmocka_unit_test(test_set_and_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
