/* Unit tests for the RDMA admission tokens (server/rdma_token.c): one use each, bound to the
 * role and identity that asked, refused once expired, and never confused with each other. */
#include "ts_test.h"

#include "rdma.h"
#include "ts_proto.h"

#include <string.h>

#define SEC 1000000000ull

static void test_issue_redeem_once(void **state)
{
    struct tsd_rdma_tokens tt;
    uint8_t a[16], b[16], wrong[16];
    char who[96];
    const char *why;
    int role = -1;

    assert_int_equal(tsd_rdma_tokens_init(&tt), 0);
    assert_int_equal(tsd_rdma_token_issue(&tt, TS_ROLE_WRITER, "CN=writer", 100 * SEC, a), 0);
    assert_int_equal(tsd_rdma_token_issue(&tt, TS_ROLE_READER, "127.0.0.1:5555", 100 * SEC, b), 0);
    assert_memory_not_equal(a, b, 16);
    /* A token nobody issued. */
    memcpy(wrong, a, 16);
    wrong[7] ^= 1;
    assert_int_equal(tsd_rdma_token_redeem(&tt, wrong, 101 * SEC, &role, who, sizeof(who), &why),
                     TS_EPERM);
    assert_non_null(strstr(why, "unknown"));
    /* Each redeems to its own role and identity, once. */
    assert_int_equal(tsd_rdma_token_redeem(&tt, b, 101 * SEC, &role, who, sizeof(who), &why), 0);
    assert_int_equal(role, TS_ROLE_READER);
    assert_string_equal(who, "127.0.0.1:5555");
    assert_int_equal(tsd_rdma_token_redeem(&tt, a, 101 * SEC, &role, who, sizeof(who), &why), 0);
    assert_int_equal(role, TS_ROLE_WRITER);
    assert_string_equal(who, "CN=writer");
    /* A replay finds nothing. */
    assert_int_equal(tsd_rdma_token_redeem(&tt, a, 101 * SEC, &role, who, sizeof(who), &why),
                     TS_EPERM);
    tsd_rdma_tokens_fini(&tt);
}

static void test_expiry(void **state)
{
    struct tsd_rdma_tokens tt;
    uint8_t a[16];
    char who[96];
    const char *why;
    int role;
    uint64_t t0 = 50 * SEC, ttl = (uint64_t)TSD_RDMA_TOKEN_TTL_MS * 1000000u;

    assert_int_equal(tsd_rdma_tokens_init(&tt), 0);
    assert_int_equal(tsd_rdma_token_issue(&tt, TS_ROLE_ADMIN, "CN=admin", t0, a), 0);
    assert_int_equal(tsd_rdma_token_redeem(&tt, a, t0 + ttl, &role, who, sizeof(who), &why),
                     TS_EPERM);
    assert_non_null(strstr(why, "expired"));
    /* And it is gone: asking again says unknown, not expired. */
    assert_int_equal(tsd_rdma_token_redeem(&tt, a, t0 + ttl, &role, who, sizeof(who), &why),
                     TS_EPERM);
    assert_non_null(strstr(why, "unknown"));
    assert_int_equal(tsd_rdma_token_issue(&tt, TS_ROLE_ADMIN, "CN=admin", t0, a), 0);
    assert_int_equal(tsd_rdma_token_redeem(&tt, a, t0 + ttl - 1, &role, who, sizeof(who), &why), 0);
    tsd_rdma_tokens_fini(&tt);
}

/* More tokens than the table holds: the oldest are dropped, the newest still redeem. */
static void test_table_full(void **state)
{
    struct tsd_rdma_tokens tt;
    uint8_t tok[TSD_RDMA_TOKENS + 8][16];
    char who[96];
    const char *why;
    int role;

    assert_int_equal(tsd_rdma_tokens_init(&tt), 0);
    for (int i = 0; i < TSD_RDMA_TOKENS + 8; i++)
        assert_int_equal(
            tsd_rdma_token_issue(&tt, TS_ROLE_READER, "x", (uint64_t)(i + 1) * 1000, tok[i]), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(tsd_rdma_token_redeem(&tt, tok[i], 2 * SEC, &role, who, sizeof(who), &why),
                         TS_EPERM);
    for (int i = 8; i < TSD_RDMA_TOKENS + 8; i++)
        assert_int_equal(tsd_rdma_token_redeem(&tt, tok[i], 2 * SEC, &role, who, sizeof(who), &why),
                         0);
    tsd_rdma_tokens_fini(&tt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issue_redeem_once),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_table_full),
    };
    return cmocka_run_group_tests_name("rdma_token", tests, NULL, NULL);
}
