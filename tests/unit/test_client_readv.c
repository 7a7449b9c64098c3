/*
 * libtessera's READV against a fake server on a socketpair: a reply's ranges land in their own
 * buffers whichever way the bytes arrive, and a server that lies is caught without a byte of a
 * bad range counted: a range failing its CRC32C, a table that does not fit the ranges asked for
 * or the data sent, another count of ranges, a refusal with a message. After each, the
 * connection is still in step (the next reply is matched to its request).
 */
#include "fake_server.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum rv_lie { RV_HONEST, RV_CRC, RV_TOO_LONG, RV_SUM, RV_COUNT, RV_REFUSE };

struct range {
    uint32_t shard;
    uint64_t off;
    uint32_t len;
    int32_t st; /* what the server says of it */
};

/* The fake server's reply to a READV of v[n] over `shard` (the same bytes for every shard). */
static void fake_readv_reply(int fd, uint64_t id, const uint8_t *shard, const struct range *v,
                             size_t n, enum rv_lie lie)
{
    struct ts_wr w, data;

    if (lie == RV_REFUSE) {
        fake_error(fd, TS_OP_READV, id, TS_EBUSY, "readv ds: come back later");
        return;
    }
    ts_wr_init(&w);
    ts_wr_init(&data);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, (uint32_t)(lie == RV_COUNT ? n + 1 : n));
    for (size_t i = 0; i < n; i++) {
        uint32_t len = v[i].st ? 0 : v[i].len;
        uint32_t crc = ts_crc32c(0, shard + v[i].off, len);
        if (lie == RV_CRC && i == 1)
            crc ^= 1;
        ts_wr_u32(&w, (uint32_t)v[i].st);
        ts_wr_u32(&w, len + (lie == RV_TOO_LONG && i == 0));
        ts_wr_u32(&w, crc);
        ts_wr_bytes(&data, shard + v[i].off, len + (lie == RV_TOO_LONG && i == 0));
    }
    if (lie == RV_SUM)
        ts_wr_bytes(&data, shard, 7); /* data the table does not account for */
    fake_send(fd, TS_OP_READV, id, &w, data.buf, data.len);
    ts_wr_fini(&w);
    ts_wr_fini(&data);
}

static void test_readv_reply_parsing(void **state)
{
    static const struct range rg[] = {
        {0, 100, 3000, 0}, {1, 9000, 2000, 0}, {2, 0, 50, TS_ERANGE}, {0, 40000, 30000, 0}};
    static const enum rv_lie lies[] = {RV_HONEST, RV_CRC, RV_TOO_LONG, RV_SUM, RV_COUNT, RV_REFUSE};
    static const int want[] = {0, 0, TS_EPROTO, TS_EPROTO, TS_EPROTO, TS_EBUSY};
    const size_t n = TS_ARRAY_SIZE(rg);
    uint8_t *shard = malloc(1u << 17), *bufs[TS_ARRAY_SIZE(rg)];
    struct ts_readv v[TS_ARRAY_SIZE(rg)];
    struct ts_dataset_info d;
    uint64_t id = ID0, op = 0, op2 = 0;
    size_t got = 0;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    ts_test_fill(shard, 1u << 17, 5, 0);
    for (size_t i = 0; i < n; i++)
        bufs[i] = malloc(rg[i].len);
    for (size_t k = 0; k < TS_ARRAY_SIZE(lies); k++) {
        for (size_t i = 0; i < n; i++) {
            memset(bufs[i], 0x77, rg[i].len);
            v[i] = (struct ts_readv){rg[i].shard, rg[i].off, rg[i].len, bufs[i], 0, 0};
        }
        assert_int_equal(ts_client_readv_submit(c, "ds", v, n, &op), 0);
        fake_readv_reply(fd, id++, shard, rg, n, lies[k]);
        assert_int_equal(tessera_wait_any(c, &op2, &got), want[k]);
        assert_true(op2 == op);
        if (want[k] == 0) {
            size_t total = 0;
            for (size_t i = 0; i < n; i++) {
                int bad = lies[k] == RV_CRC && i == 1;
                assert_int_equal(v[i].rc, bad ? TS_ECORRUPT : rg[i].st);
                if (v[i].rc) {
                    assert_int_equal(v[i].got, 0);
                    continue;
                }
                assert_int_equal(v[i].got, rg[i].len);
                assert_memory_equal(bufs[i], shard + rg[i].off, rg[i].len);
                total += v[i].got;
            }
            assert_int_equal(got, total);
        } else {
            assert_int_equal(got, 0);
            for (size_t i = 0; i < n; i++) { /* no range says it was read */
                assert_int_not_equal(v[i].rc, 0);
                assert_int_equal(v[i].got, 0);
            }
            assert_true(strlen(tessera_client_error(c)) > 0);
            if (lies[k] == RV_REFUSE)
                assert_non_null(strstr(tessera_client_error(c), "come back later"));
        }
        /* In step: the next reply is matched to its request. */
        fake_dataset_info(fd, id++, "ds", 1024);
        assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    }
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(shard);
    tessera_client_close(c);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readv_reply_parsing),
    };
    ts_test_log_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
