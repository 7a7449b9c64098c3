/*
 * The table of fragment chunks waiting for the monitor's repair (server/ec_wanted.c): bounded,
 * damaged chunks never pushed out by missing fragments (which any reader can claim), missing
 * ones at most half of it, the same entry noted once, entries gone when repaired.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static struct tsd_server *server(void)
{
    struct tsd_server *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    tsd_ec_wanted_init(&s->ec_wanted);
    return s;
}

static void done_server(struct tsd_server *s)
{
    tsd_ec_wanted_fini(&s->ec_wanted);
    free(s);
}

static size_t missing(struct tsd_server *s)
{
    return tsd_ec_wanted_copy(s, NULL, 0) - tsd_ec_wanted_damaged(s);
}

static void test_kinds_and_bounds(void **state)
{
    struct tsd_server *s = server();
    uint32_t next = 0;

    (void)state;
    /* A reader naming 40 fragments that are not there: 32 kept. */
    for (int i = 0; i < 40; i++)
        tsd_ec_wanted_note(s, "d#1", 1000 + next++, UINT32_MAX);
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), TSD_EC_WANTED_MAX / 2);
    /* 40 damaged chunks: the table fills, then each pushes out the oldest missing one. */
    for (uint32_t i = 0; i < 40; i++)
        tsd_ec_wanted_note(s, "d#2", 7, i);
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), TSD_EC_WANTED_MAX);
    assert_int_equal(tsd_ec_wanted_damaged(s), 40);
    assert_int_equal(missing(s), 24);
    /* More missing ones replace only missing ones. */
    for (int i = 0; i < 10; i++)
        tsd_ec_wanted_note(s, "d#1", 1000 + next++, UINT32_MAX);
    assert_int_equal(tsd_ec_wanted_damaged(s), 40);
    assert_int_equal(missing(s), 24);
    /* 30 more damaged: the missing ones go first, then the oldest damaged. */
    for (uint32_t i = 40; i < 70; i++)
        tsd_ec_wanted_note(s, "d#2", 7, i);
    assert_int_equal(tsd_ec_wanted_damaged(s), TSD_EC_WANTED_MAX);
    assert_int_equal(missing(s), 0);
    /* Full of damaged chunks: a missing fragment is not kept. */
    tsd_ec_wanted_note(s, "d#1", 5000, UINT32_MAX);
    assert_int_equal(missing(s), 0);
    {
        struct tsd_ec_wanted_ent e[TSD_EC_WANTED_MAX];
        size_t n = tsd_ec_wanted_copy(s, e, TSD_EC_WANTED_MAX);
        assert_int_equal(n, TSD_EC_WANTED_MAX);
        assert_int_equal(e[0].idx, 6); /* chunks 0..5 were the oldest */
        assert_int_equal(e[n - 1].idx, 69);
    }
    done_server(s);
}

static void test_once_and_done(void **state)
{
    struct tsd_server *s = server();
    uint64_t noted;

    (void)state;
    tsd_ec_wanted_note(s, "d#0", 3, 1);
    tsd_ec_wanted_note(s, "d#0", 3, 2);
    tsd_ec_wanted_note(s, "d#0", 4, UINT32_MAX);
    noted = atomic_load(&s->ec_wanted.noted);
    tsd_ec_wanted_note(s, "d#0", 3, 1);          /* again: once */
    tsd_ec_wanted_note(s, "d#0", 4, 9);          /* a chunk of a fragment missing whole */
    tsd_ec_wanted_note(s, "notafragment", 3, 1); /* not a fragment's name: nothing */
    assert_int_equal(atomic_load(&s->ec_wanted.noted), noted);
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), 3);
    tsd_ec_wanted_done(s, "d#0", 3, 1); /* CHUNK_REPAIR of chunk 1 taken */
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), 2);
    tsd_ec_wanted_done(s, "d#1", 3, 2); /* another fragment: nothing */
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), 2);
    tsd_ec_wanted_done(s, "d#0", 4, UINT32_MAX); /* the fragment sealed whole */
    assert_int_equal(tsd_ec_wanted_copy(s, NULL, 0), 1);
    assert_int_equal(atomic_load(&s->ec_wanted.done), 2);
    done_server(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds_and_bounds),
        cmocka_unit_test(test_once_and_done),
    };
    return cmocka_run_group_tests_name("ec wanted", tests, NULL, NULL);
}
