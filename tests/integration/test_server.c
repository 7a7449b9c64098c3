/*
 * tesserad over plain TCP, with the real client library and raw sockets: round trips,
 * pipelined reads, the CLI-facing operations, and bad input of every kind. After each bad
 * input the server keeps serving and nothing stored is lost.
 */
#include "harness.h"
#include "ts_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/tessera.h"
#include "ts_common.h"
#include "ts_proto.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (64u << 10)

static struct tsd_proc D;

static tessera_client *connect_c(void)
{
    tessera_client *c = tsd_connect(&D);

    assert_non_null(c);
    return c;
}

static void put_shard(tessera_client *c, const char *ds, uint32_t shard, size_t len, uint64_t seed)
{
    assert_int_equal(tsd_put_pattern(c, ds, shard, len, seed), 0);
}

static void check_shard(tessera_client *c, const char *ds, uint32_t shard, size_t len,
                        uint64_t seed)
{
    uint8_t *got = malloc(len + 16), *want = malloc(len + 16);
    size_t n = 0;

    assert_int_equal(tessera_read(c, ds, shard, 0, len + 16, got, &n), 0);
    assert_int_equal(n, len);
    ts_test_fill(want, len, seed, 0);
    assert_memory_equal(got, want, len);
    free(got);
    free(want);
}

static int group_setup(void **state)
{
    const char *const extra[] = {"--conn-output-kb", "1024", "--workers", "2", NULL};
    tessera_client *c;
    struct ts_dataset_policy p;

    if (tsd_start(&D, extra) != 0)
        return -1;
    /* A dataset that every bad-input test must leave intact. */
    c = connect_c();
    memset(&p, 0, sizeof(p));
    p.core = 1;
    p.min_core = 1;
    p.chunk_size = CHUNK;
    assert_int_equal(tessera_dataset_create(c, "keep", &p), 0);
    put_shard(c, "keep", 0, 5 * CHUNK + 7, 1);
    put_shard(c, "keep", 1, 100, 2);
    tessera_client_close(c);
    return 0;
}

static int group_teardown(void **state)
{
    int st = tsd_stop(&D);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "tesserad did not exit cleanly on SIGTERM (status %d)\n", st);
        tsd_dump_log(&D);
        tsd_cleanup(&D);
        return -1;
    }
    tsd_cleanup(&D);
    return 0;
}

/* Everything stored so far is still there, byte for byte, and the server answers. */
static void assert_intact(void)
{
    tessera_client *c = connect_c();
    check_shard(c, "keep", 0, 5 * CHUNK + 7, 1);
    check_shard(c, "keep", 1, 100, 2);
    tessera_client_close(c);
    assert_true(tsd_alive(&D));
}

static void mkds(tessera_client *c, const char *name)
{
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};
    assert_int_equal(tessera_dataset_create(c, name, &p), 0);
}

/* ---- functional ------------------------------------------------------------------------- */

static void test_roundtrip_sizes(void **state)
{
    tessera_client *c = connect_c();
    const size_t sizes[] = {0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 64u << 20};
    struct ts_dataset_info d;
    struct ts_shard_info si;

    mkds(c, "sizes");
    for (uint32_t i = 0; i < TS_ARRAY_SIZE(sizes); i++) {
        put_shard(c, "sizes", i, sizes[i], 10 + i);
        check_shard(c, "sizes", i, sizes[i], 10 + i);
        assert_int_equal(tessera_shard_stat(c, "sizes", i, &si), 0);
        assert_int_equal(si.state, TS_SHARD_COMPLETE);
        assert_true(si.size == sizes[i]);
    }
    assert_int_equal(tessera_dataset_seal(c, "sizes"), 0);
    assert_int_equal(tessera_dataset_stat(c, "sizes", &d), 0);
    assert_int_equal(d.state, TS_DS_SEALED);
    assert_int_equal(d.shards, TS_ARRAY_SIZE(sizes));
    tessera_client_close(c);
}

static void test_ranges_and_pipelining(void **state)
{
    tessera_client *c = connect_c();
    const size_t len = 8 * CHUNK + 123;
    uint8_t *want = malloc(len), *bufs[32];
    uint64_t ops[32], offs[32];
    size_t lens[32];

    mkds(c, "ranges");
    put_shard(c, "ranges", 0, len, 77);
    ts_test_fill(want, len, 77, 0);
    /* 32 reads in flight on one connection, completing in any order. */
    for (int i = 0; i < 32; i++) {
        offs[i] = (uint64_t)(i * 7919 * 13) % len;
        lens[i] = (size_t)(i * 4099) % (3 * CHUNK) + 1;
        bufs[i] = malloc(lens[i]);
        assert_int_equal(tessera_read_submit(c, "ranges", 0, offs[i], lens[i], bufs[i], &ops[i]),
                         0);
    }
    for (int done = 0; done < 32; done++) {
        uint64_t op;
        size_t n;
        int i;
        assert_int_equal(tessera_wait_any(c, &op, &n), 0);
        for (i = 0; i < 32 && ops[i] != op; i++)
            ;
        assert_true(i < 32);
        assert_int_equal(n, TS_MIN(lens[i], len - offs[i]));
        assert_memory_equal(bufs[i], want + offs[i], n);
        free(bufs[i]);
    }
    /* Past the end: cut; beyond the end: TS_ERANGE. */
    size_t n;
    uint8_t b[10];
    assert_int_equal(tessera_read(c, "ranges", 0, len - 3, 10, b, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(tessera_read(c, "ranges", 0, len + 1, 10, b, &n), TS_ERANGE);
    free(want);
    tessera_client_close(c);
}

/* Large pieces go out by sendfile(); replies queued behind one must still go out. */
static void test_pipelined_large_reads(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    const size_t len = 6u << 20;
    uint8_t *want = malloc(len), *bufs[6];
    uint64_t ops[6];

    assert_int_equal(tessera_dataset_create(c, "bigpieces", &p), 0);
    put_shard(c, "bigpieces", 0, len, 31);
    ts_test_fill(want, len, 31, 0);
    for (int round = 0; round < 2; round++) { /* cold (cache fills), then warm (arena) */
        for (int i = 0; i < 6; i++) {
            bufs[i] = malloc(1u << 20);
            assert_int_equal(tessera_read_submit(c, "bigpieces", 0, (uint64_t)i << 20, 1u << 20,
                                                 bufs[i], &ops[i]),
                             0);
        }
        for (int i = 0; i < 6; i++) {
            size_t n;
            assert_int_equal(tessera_wait(c, ops[i], &n), 0);
            assert_int_equal(n, 1u << 20);
            assert_memory_equal(bufs[i], want + ((size_t)i << 20), n);
            free(bufs[i]);
        }
    }
    free(want);
    tessera_client_close(c);
}

static void test_names_and_rules(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_info d;
    struct ts_dataset_info *list;
    size_t n;
    uint8_t b[4];

    assert_int_equal(tessera_dataset_stat(c, "nope", &d), TS_ENOENT);
    assert_true(strstr(tessera_client_error(c), "nope") != NULL);
    assert_int_equal(tessera_read(c, "nope", 0, 0, 1, b, &n), TS_ENOENT);
    assert_int_equal(tessera_read(c, "keep", 99, 0, 1, b, &n), TS_ENOENT);
    mkds(c, "rules");
    struct ts_dataset_policy p = {1, 0, 1, CHUNK, 0, 0, 0, 0};
    assert_int_equal(tessera_dataset_create(c, "rules", &p), TS_EEXIST);
    assert_int_equal(tessera_dataset_create(c, "bad name", &p), TS_ENAME);
    put_shard(c, "rules", 0, 10, 3);
    /* A retried put of the same bytes succeeds (its first answer may have been lost); other
     * bytes under the same shard are refused, saying so. */
    put_shard(c, "rules", 0, 10, 3);
    memset(b, 0x5a, sizeof(b));
    assert_int_equal(tessera_put(c, "rules", 0, b, 4, NULL, 0), TS_EEXIST);
    assert_non_null(strstr(tessera_client_error(c), "other contents"));
    /* The same from a file or a pipe (tessera_put_fd, the CLI's put): the same bytes again
     * succeed, read whole for their CRC32C; other bytes are refused (found by a fault hunt). */
    {
        uint8_t big[3 * CHUNK + 5];
        int pfd[2];
        FILE *f = tmpfile();
        for (size_t i = 0; i < sizeof(big); i++)
            big[i] = (uint8_t)(i * 7 + 1);
        assert_int_equal(tessera_put(c, "rules", 1, big, sizeof(big), NULL, 0), 0);
        assert_int_equal(fwrite(big, 1, sizeof(big), f), sizeof(big));
        fflush(f);
        rewind(f);
        assert_int_equal(tessera_put_fd(c, "rules", 1, fileno(f), sizeof(big)), 0);
        assert_int_equal(pipe(pfd), 0);
        assert_true(fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20) >= (int)sizeof(big)); /* no reader yet */
        assert_int_equal(write(pfd[1], big, sizeof(big)), (ssize_t)sizeof(big));
        close(pfd[1]);
        assert_int_equal(tessera_put_fd(c, "rules", 1, pfd[0], TS_SIZE_UNKNOWN), 0);
        close(pfd[0]);
        big[2 * CHUNK] ^= 1;
        rewind(f);
        assert_int_equal(fwrite(big, 1, sizeof(big), f), sizeof(big));
        fflush(f);
        rewind(f);
        assert_int_equal(tessera_put_fd(c, "rules", 1, fileno(f), sizeof(big)), TS_EEXIST);
        assert_non_null(strstr(tessera_client_error(c), "other contents"));
        fclose(f);
    }
    /* A shard that would need more chunks than the server keeps is refused before any byte. */
    {
        int zfd = open("/dev/zero", O_RDONLY);
        assert_true(zfd >= 0);
        assert_int_equal(tessera_put_fd(c, "rules", 7, zfd, ((uint64_t)CHUNK << 30) + 1),
                         TS_ETOOBIG);
        assert_non_null(strstr(tessera_client_error(c), "2^30 chunks"));
        close(zfd);
    }
    assert_int_equal(tessera_dataset_seal(c, "rules"), 0);
    /* A write to a sealed dataset. */
    assert_int_equal(tessera_put(c, "rules", 2, b, 4, NULL, 0), TS_ESEALED);
    assert_int_equal(tessera_dataset_list(c, &list, &n), 0);
    assert_true(n >= 2);
    free(list);
    assert_int_equal(tessera_dataset_delete(c, "rules"), 0);
    assert_int_equal(tessera_dataset_stat(c, "rules", &d), TS_ENOENT);
    tessera_client_close(c);
    assert_intact();
}

/* ---- bad input -------------------------------------------------------------------------- */

static void test_random_bytes(void **state)
{
    int fd = raw_connect(D.addr);
    uint8_t junk[4096];

    assert_true(fd >= 0);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(rand() & 0xff);
    junk[0] = 'X'; /* certainly not the magic */
    assert_int_equal(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    char msg[256];
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, msg, sizeof(msg), NULL, NULL), TS_EPROTO);
    assert_true(raw_wait_closed(fd, 5000));
    close(fd);
    assert_intact();
}

static void test_truncated_header(void **state)
{
    int fd = raw_connect(D.addr);
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_STATUS, 0, 1, 0, 0};

    ts_frame_encode(h, &fh);
    assert_int_equal(send(fd, h, 20, MSG_NOSIGNAL), 20); /* then hang up */
    close(fd);
    assert_intact();
}

static void test_wrong_magic_and_crc(void **state)
{
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_STATUS, 0, 1, 0, 0};
    int fd;

    ts_frame_encode(h, &fh);
    h[0] = 'H'; /* "HTTP"-like */
    fd = raw_connect(D.addr);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), TS_EPROTO);
    assert_true(raw_wait_closed(fd, 5000));
    close(fd);

    ts_frame_encode(h, &fh);
    h[28] ^= 1; /* header CRC */
    fd = raw_connect(D.addr);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), TS_EPROTO);
    assert_true(raw_wait_closed(fd, 5000));
    close(fd);
    assert_intact();
}

static void test_oversize_length(void **state)
{
    uint8_t h[TS_HDR_LEN];
    struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_STATUS, 0, 4242, 0, 0x7fffffffu};
    int fd = raw_connect(D.addr);
    char msg[256];
    uint64_t id = 0;

    ts_frame_encode(h, &fh);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    assert_int_equal(raw_recv_reply(fd, 5000, &id, msg, sizeof(msg), NULL, NULL), TS_ETOOBIG);
    assert_true(id == 4242); /* the refusal answers the request it refuses */
    assert_true(raw_wait_closed(fd, 5000));
    close(fd);
    /* Within the global limit but over the opcode's own (STATUS: 64 KiB). */
    fh.length = 1u << 20;
    ts_frame_encode(h, &fh);
    fd = raw_connect(D.addr);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, msg, sizeof(msg), NULL, NULL), TS_ETOOBIG);
    close(fd);
    assert_intact();
}

static void test_unknown_opcode_keeps_connection(void **state)
{
    int fd = raw_connect(D.addr);
    uint64_t id;
    char msg[256];

    assert_int_equal(raw_send_frame(fd, 200, 0, 42, "xyz", 3), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, &id, msg, sizeof(msg), NULL, NULL), TS_ENOTSUP);
    assert_true(id == 42);
    /* The same rule for a large one (1 MiB, within the protocol limit): refused, its payload
     * skipped, the connection usable (issue 28: it was closed without a reply). */
    {
        uint8_t *big = calloc(1, 1u << 20);
        assert_non_null(big);
        assert_int_equal(raw_send_frame(fd, 201, 0, 45, big, 1u << 20), 0);
        assert_int_equal(raw_recv_reply(fd, 5000, &id, msg, sizeof(msg), NULL, NULL), TS_ENOTSUP);
        assert_true(id == 45);
        free(big);
    }
    /* A malformed body (trailing bytes) is refused but framing is intact. */
    assert_int_equal(raw_send_frame(fd, TS_OP_STATUS, 0, 43, "zz", 2), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, &id, msg, sizeof(msg), NULL, NULL), TS_EPROTO);
    /* The same connection still works. */
    assert_int_equal(raw_send_frame(fd, TS_OP_STATUS, 0, 44, NULL, 0), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, &id, NULL, 0, NULL, NULL), 0);
    assert_true(id == 44);
    close(fd);
}

static void shard_write_frame(struct ts_wr *w, const char *ds, uint32_t shard, uint32_t idx,
                              uint64_t size, uint32_t crc, const void *data, uint32_t len)
{
    ts_wr_init(w);
    ts_wr_str(w, ds);
    ts_wr_u32(w, shard);
    ts_wr_u32(w, idx);
    ts_wr_u64(w, size);
    ts_wr_u32(w, crc);
    ts_wr_u32(w, len);
    ts_wr_bytes(w, data, len);
}

static void test_bad_chunk_crc(void **state)
{
    tessera_client *c = connect_c();
    int fd = raw_connect(D.addr);
    uint8_t *data = malloc(CHUNK);
    struct ts_wr w;
    struct ts_shard_info si;
    char msg[256];

    mkds(c, "badcrc");
    ts_test_fill(data, CHUNK, 5, 0);
    shard_write_frame(&w, "badcrc", 0, 0, 2 * CHUNK, ts_crc32c(0, data, CHUNK) ^ 0x10, data, CHUNK);
    assert_int_equal(raw_send_frame(fd, TS_OP_SHARD_WRITE, 0, 1, w.buf, w.len), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, msg, sizeof(msg), NULL, NULL), TS_ECORRUPT);
    ts_wr_fini(&w);
    /* Nothing stored: the shard has no bytes. */
    assert_int_equal(tessera_shard_stat(c, "badcrc", 0, &si), 0);
    assert_true(si.size == 0 && si.state == TS_SHARD_WRITING);
    close(fd);
    free(data);
    tessera_client_close(c);
    assert_intact();
}

/* A shard whose declared size needs more than 2^30 chunks is refused at its first chunk,
 * before anything is stored (not after 2^30 chunks). */
static void test_impossible_shard_size_refused(void **state)
{
    tessera_client *c = connect_c();
    int fd = raw_connect(D.addr);
    uint8_t data[100] = {7};
    struct ts_wr w;
    struct ts_shard_info si;
    char msg[256];

    mkds(c, "huge");
    shard_write_frame(&w, "huge", 0, 0, (uint64_t)CHUNK << 31, ts_crc32c(0, data, sizeof(data)),
                      data, sizeof(data));
    assert_int_equal(raw_send_frame(fd, TS_OP_SHARD_WRITE, 0, 1, w.buf, w.len), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, msg, sizeof(msg), NULL, NULL), TS_ETOOBIG);
    fprintf(stderr, "  %s\n", msg);
    ts_wr_fini(&w);
    assert_int_equal(tessera_shard_stat(c, "huge", 0, &si), TS_ENOENT);
    close(fd);
    tessera_client_close(c);
    assert_intact();
}

static void test_disconnect_mid_upload(void **state)
{
    tessera_client *c = connect_c();
    int fd = raw_connect(D.addr);
    uint8_t *data = malloc(CHUNK);
    struct ts_wr w;
    struct ts_shard_info si;
    struct ts_dataset_info d;
    size_t n;

    mkds(c, "cut");
    ts_test_fill(data, CHUNK, 6, 0);
    shard_write_frame(&w, "cut", 0, 0, 3 * CHUNK, ts_crc32c(0, data, CHUNK), data, CHUNK);
    assert_int_equal(raw_send_frame(fd, TS_OP_SHARD_WRITE, 0, 1, w.buf, w.len), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), 0);
    ts_wr_fini(&w);
    /* Half a second frame, then gone. */
    shard_write_frame(&w, "cut", 0, 1, 3 * CHUNK, ts_crc32c(0, data, CHUNK), data, CHUNK);
    assert_int_equal(raw_send_frame(fd, TS_OP_SHARD_WRITE, 0, 2, w.buf, w.len / 2), 0);
    ts_wr_fini(&w);
    close(fd);

    /* The shard stays incomplete and invisible; the dataset cannot be sealed with it. */
    assert_int_equal(tessera_shard_stat(c, "cut", 0, &si), 0);
    assert_int_equal(si.state, TS_SHARD_WRITING);
    assert_true(si.size == CHUNK);
    assert_int_equal(tessera_read(c, "cut", 0, 0, 10, data, &n), TS_EINCOMPLETE);
    assert_int_equal(tessera_dataset_stat(c, "cut", &d), 0);
    assert_int_equal(d.shards_writing, 1);
    assert_int_equal(tessera_dataset_seal(c, "cut"), TS_EINCOMPLETE);
    /* Uploading it again starts over and completes. */
    for (int i = 0; i < 500 && tessera_put(c, "cut", 0, data, CHUNK, NULL, 0) == TS_EBUSY; i++)
        usleep(10000);
    assert_int_equal(tessera_shard_stat(c, "cut", 0, &si), 0);
    assert_int_equal(si.state, TS_SHARD_COMPLETE);
    free(data);
    tessera_client_close(c);
    assert_intact();
}

static void test_reply_flag_and_short_body(void **state)
{
    int fd = raw_connect(D.addr);
    uint8_t body[3] = {5, 0, 'k'}; /* name length 5, only 1 byte */

    assert_int_equal(raw_send_frame(fd, TS_OP_STATUS, TS_F_REPLY, 1, NULL, 0), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), TS_EPROTO);
    assert_int_equal(raw_send_frame(fd, TS_OP_DATASET_STAT, 0, 2, body, sizeof(body)), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, NULL, NULL, 0, NULL, NULL), TS_EPROTO);
    close(fd);
    assert_intact();
}

/* A client asks for far more than it reads: the daemon's memory stays within its bound. */
static void test_slow_reader_bounded_memory(void **state)
{
    tessera_client *c = connect_c();
    const size_t big = 64u << 20;
    struct ts_wr w;
    int fd;
    long base, peak = 0;

    mkds(c, "hog");
    put_shard(c, "hog", 0, big, 9);
    tessera_client_close(c);
    base = tsd_rss_kb(&D);

    fd = raw_connect(D.addr);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    /* 16 reads of 64 MiB = 1 GiB asked for, never read. */
    for (uint64_t i = 0; i < 16; i++) {
        ts_wr_init(&w);
        ts_wr_str(&w, "hog");
        ts_wr_u32(&w, 0);
        ts_wr_u64(&w, 0);
        ts_wr_u32(&w, (uint32_t)big);
        assert_int_equal(raw_send_frame(fd, TS_OP_READ, 0, i + 1, w.buf, w.len), 0);
        ts_wr_fini(&w);
    }
    /* Give the server time to fill what it may; watch its RSS. */
    for (int i = 0; i < 100; i++) {
        long rss = tsd_rss_kb(&D);
        if (rss > peak)
            peak = rss;
        usleep(10000);
    }
    /* Bound: output budget (1 MiB here) + two pinned chunks + allocator slack. */
    fprintf(stderr, "  rss before %ld KiB, peak while hogged %ld KiB\n", base, peak);
    assert_true(peak - base < 48 * 1024);
    /* Others are served meanwhile. */
    assert_intact();
    close(fd);
}

/* ---- fairness between connections (issue 31) ------------------------------------------- */

#define FLOOD_READS 16384u     /* 16 KiB reads pipelined on one connection: 256 MiB asked for */
#define FLOOD_SHARD (4u << 20) /* the reads cycle over one cached 4 MiB shard */
#define PROBES 60
/* A small read's wait beside the flood, counted in the flood's replies that arrived meanwhile
 * (a measure of the server's work, not of time, so other load on the machine does not move
 * it): a fair server answers the probe within a loop turn or a few (16 requests each), a
 * starving one after much of its buffered input. Measured here on 2 cores with CI's other
 * tests running: medians of 32-64 fair; 192-894 with the per-turn bound lifted. */
#define PROBE_BESIDE_MAX 128

struct flood {
    int fd;
    pthread_t tx, rx;
    uint8_t *reqs; /* every request frame, back to back */
    size_t reqs_len;
    atomic_uint replies; /* read back so far */
};

static int read_payload(struct ts_wr *w, const char *ds, uint32_t shard, uint32_t len, uint64_t off)
{
    ts_wr_init(w);
    ts_wr_str(w, ds);
    ts_wr_u32(w, shard);
    ts_wr_u64(w, off);
    ts_wr_u32(w, len);
    return w->err;
}

/* Every read in one send: the server holds as many as its input limit lets it. */
static void *flood_tx(void *arg)
{
    struct flood *f = arg;

    raw_send_all(f->fd, f->reqs, f->reqs_len);
    return NULL;
}

/* Takes the replies as fast as they come (large recv()s, no parsing past the first header),
 * so that this peer never holds the server back: the socket always has room. */
static void *flood_rx(void *arg)
{
    struct flood *f = arg;
    const size_t cap = 1u << 20;
    uint8_t *buf = malloc(cap);
    uint64_t got = 0, reply = 0;

    while (buf && atomic_load(&f->replies) < FLOOD_READS) {
        ssize_t n = recv(f->fd, buf, cap, 0);
        struct ts_frame_hdr h;
        if (n <= 0)
            break;
        if (!reply) {
            if (n < TS_HDR_LEN || ts_frame_parse(buf, TS_HDR_LEN, 1u << 30, &h) <= 0)
                break;
            reply = TS_HDR_LEN + (uint64_t)h.length; /* every reply has the same size */
        }
        got += (uint64_t)n;
        atomic_store(&f->replies, (unsigned)(got / reply));
    }
    free(buf);
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* One flood of f's requests and probes beside it on the same worker; the median of the flood
 * replies that arrived while a probe waited. */
static int64_t flood_probe_beside(struct flood *f)
{
    int64_t lat[PROBES], beside[PROBES];
    int n = 0, fd, spacer;
    uint8_t got[100];
    struct ts_wr w;

    atomic_store(&f->replies, 0);
    /* Connections go to the 2 workers in turn: the spacer puts the probe on the flood's. */
    f->fd = raw_connect(D.addr);
    spacer = raw_connect(D.addr);
    fd = raw_connect(D.addr);
    assert_true(f->fd >= 0 && spacer >= 0 && fd >= 0);
    assert_int_equal(pthread_create(&f->rx, NULL, flood_rx, f), 0);
    assert_int_equal(pthread_create(&f->tx, NULL, flood_tx, f), 0);
    /* The probe starts once the flood flows, and counts only while it still does. */
    for (int i = 0; i < 5000 && atomic_load(&f->replies) < 256; i++)
        usleep(1000);
    while (n < PROBES && atomic_load(&f->replies) < FLOOD_READS - 512) {
        uint64_t id;
        uint8_t *payload = NULL;
        size_t plen;
        int64_t t0 = (int64_t)ts_now_mono_ns();
        unsigned r0 = atomic_load(&f->replies);

        assert_int_equal(read_payload(&w, "fair", 0, sizeof(got), 0), 0);
        assert_int_equal(raw_send_frame(fd, TS_OP_READ, 0, (uint64_t)n + 1, w.buf, w.len), 0);
        ts_wr_fini(&w);
        assert_int_equal(raw_recv_reply(fd, 10000, &id, NULL, 0, &payload, &plen), 0);
        lat[n] = (int64_t)ts_now_mono_ns() - t0;
        beside[n++] = (int64_t)atomic_load(&f->replies) - r0;
        free(payload);
        assert_int_equal(id, (uint64_t)n);
        usleep(1000);
    }
    shutdown(f->fd, SHUT_RDWR); /* ends the flood early: the server sees a reset peer */
    pthread_join(f->tx, NULL);
    pthread_join(f->rx, NULL);
    raw_close(f->fd);
    raw_close(spacer);
    raw_close(fd);
    assert_true(n >= 10); /* the flood lasted long enough to measure */
    qsort(lat, (size_t)n, sizeof(lat[0]), cmp_i64);
    qsort(beside, (size_t)n, sizeof(beside[0]), cmp_i64);
    fprintf(stderr,
            "  small read beside a flood: %d probes, median %.0f us, p90 %.0f us; flood replies "
            "while one waited: median %lld, p90 %lld\n",
            n, (double)lat[n / 2] / 1e3, (double)lat[n * 9 / 10] / 1e3, (long long)beside[n / 2],
            (long long)beside[n * 9 / 10]);
    return beside[n / 2];
}

/*
 * One connection with thousands of reads pipelined (a peer reading its replies as fast as they
 * come) must not hold its worker while another connection waits: a small read on a second
 * connection of the same worker is answered within a loop turn or two, not after all of the
 * flood's buffered input (issue 31: pipe16k-c16-d16's p99). In time, on a 2-vCPU VM shared
 * with other builds: median 3.0-8.6 ms before the per-turn bound, 0.7-1.0 ms after, but 2-3.6 ms
 * with CI's other tests on the same cores; so the wait is counted in flood replies
 * (PROBE_BESIDE_MAX). Up to three floods: a starving server misses the bound every time.
 */
static void test_pipelined_flood_does_not_starve(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    struct flood f;
    int64_t beside = INT64_MAX;
    uint8_t got[100];
    struct ts_wr w;

    (void)state;
    assert_int_equal(tessera_dataset_create(c, "fair", &p), 0);
    put_shard(c, "fair", 0, FLOOD_SHARD, 41);
    /* Warm the chunk cache: the flood is served from memory. */
    for (uint64_t off = 0; off < FLOOD_SHARD; off += 1u << 20)
        assert_int_equal(tessera_read(c, "fair", 0, off, sizeof(got), got, &(size_t){0}), 0);
    tessera_client_close(c);

    memset(&f, 0, sizeof(f));
    atomic_init(&f.replies, 0);
    for (uint32_t i = 0; i < FLOOD_READS; i++) {
        uint8_t h[TS_HDR_LEN];
        struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_READ, 0, i + 1, 0, 0};
        assert_int_equal(read_payload(&w, "fair", 0, 16u << 10, ((uint64_t)i << 14) % FLOOD_SHARD),
                         0);
        fh.length = (uint32_t)w.len;
        if (!f.reqs)
            f.reqs = malloc((size_t)FLOOD_READS * (TS_HDR_LEN + w.len));
        assert_non_null(f.reqs);
        ts_frame_encode(h, &fh);
        memcpy(f.reqs + f.reqs_len, h, TS_HDR_LEN);
        memcpy(f.reqs + f.reqs_len + TS_HDR_LEN, w.buf, w.len);
        f.reqs_len += TS_HDR_LEN + w.len;
        ts_wr_fini(&w);
    }
    for (int t = 0; t < 3 && beside > PROBE_BESIDE_MAX; t++)
        beside = flood_probe_beside(&f);
    free(f.reqs);
    assert_true(beside <= PROBE_BESIDE_MAX);
    assert_intact();
}

/* A half-close with more requests buffered than one loop turn serves: every one is answered, in
 * order, before the server closes (the close waits for the turn that answers the last). */
static void test_half_close_after_many_requests(void **state)
{
    const unsigned nreq = 200;
    uint8_t *frames = NULL;
    size_t len = 0;
    struct ts_wr w;
    int fd = raw_connect(D.addr);

    assert_true(fd >= 0);
    for (unsigned i = 0; i < nreq; i++) {
        struct ts_frame_hdr fh = {TS_PROTO_VERSION, TS_OP_READ, 0, i + 1, 0, 0};
        assert_int_equal(read_payload(&w, "keep", 1, 100, 0), 0);
        fh.length = (uint32_t)w.len;
        if (!frames)
            frames = malloc((size_t)nreq * (TS_HDR_LEN + w.len));
        assert_non_null(frames);
        ts_frame_encode(frames + len, &fh);
        memcpy(frames + len + TS_HDR_LEN, w.buf, w.len);
        len += TS_HDR_LEN + w.len;
        ts_wr_fini(&w);
    }
    assert_int_equal(raw_send_all(fd, frames, len), 0);
    free(frames);
    shutdown(fd, SHUT_WR);
    for (unsigned i = 0; i < nreq; i++) {
        uint64_t id;
        uint8_t *payload = NULL;
        size_t plen;
        assert_int_equal(raw_recv_reply(fd, 10000, &id, NULL, 0, &payload, &plen), 0);
        free(payload);
        assert_int_equal(id, (uint64_t)i + 1);
    }
    assert_int_equal(raw_wait_closed(fd, 10000), 1); /* closed, not timed out */
    raw_close(fd);
}

static void test_status(void **state)
{
    tessera_client *c = connect_c();
    char *json = NULL;

    assert_int_equal(tessera_status(c, &json), 0);
    assert_non_null(strstr(json, "\"node\""));
    assert_non_null(strstr(json, "\"keep\""));
    free(json);
    tessera_client_close(c);
}

/*
 * DATASET_STAT with TS_F_BRIEF (what a writer asks before each put, for the chunk size): the
 * dataset's record alone, its policy and state, shards and bytes 0; without the flag, the
 * shards counted. A brief stat costs no scan of the dataset's shard records, so a put does not
 * slow down as its dataset grows (846 small writes/s became 2,300 on the same run: docs).
 */
/*
 * A connection remembers the chunk size of the datasets it put to (client/put.c: a small put
 * is then one round trip, chunk and seal together). The dataset deleted and made again, by
 * another connection, with a smaller and then a larger chunk size: the next puts still
 * succeed, byte for byte (refused as the wrong shape, the put asks again and is redone).
 */
static void test_put_chunk_memo(void **state)
{
    tessera_client *c = connect_c(), *admin = connect_c();
    struct ts_dataset_policy big = {1, 0, 1, 65536, 0, 0, 0, 0},
                             small = {1, 0, 1, 4096, 0, 0, 0, 0};

    (void)state;
    assert_int_equal(tessera_dataset_create(admin, "memo", &big), 0);
    put_shard(c, "memo", 0, 10000, 1);
    assert_int_equal(tessera_dataset_delete(admin, "memo"), 0);
    assert_int_equal(tessera_dataset_create(admin, "memo", &small), 0);
    put_shard(c, "memo", 0, 10000, 2); /* remembered 64 KiB: one chunk, too big for 4 KiB */
    check_shard(admin, "memo", 0, 10000, 2);
    put_shard(c, "memo", 1, 3000, 3);
    assert_int_equal(tessera_dataset_delete(admin, "memo"), 0);
    assert_int_equal(tessera_dataset_create(admin, "memo", &big), 0);
    put_shard(c, "memo", 0, 10000, 4); /* remembered 4 KiB: a short chunk, then another */
    check_shard(admin, "memo", 0, 10000, 4);
    check_shard(c, "memo", 0, 10000, 4);
    assert_int_equal(tessera_dataset_delete(admin, "memo"), 0);
    tessera_client_close(c);
    tessera_client_close(admin);
}

static void test_brief_dataset_stat(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_policy p = {1, 0, 1, 4096, 0, 0, 0, 0};
    struct ts_dataset_info full, brief;
    uint8_t *payload = NULL;
    size_t plen = 0;
    struct ts_wr name;
    struct ts_rd rd;
    uint64_t id;
    int fd;

    assert_int_equal(tessera_dataset_create(c, "brief", &p), 0);
    for (uint32_t s = 0; s < 5; s++)
        assert_int_equal(tsd_put_pattern(c, "brief", s, 10000, s), 0);
    tessera_client_close(c);
    ts_wr_init(&name);
    ts_wr_str(&name, "brief");
    assert_int_equal(name.err, 0);
    fd = raw_connect(D.addr);
    assert_true(fd >= 0);
    for (int brief_flag = 0; brief_flag < 2; brief_flag++) {
        struct ts_dataset_info *d = brief_flag ? &brief : &full;
        assert_int_equal(raw_send_frame(fd, TS_OP_DATASET_STAT, brief_flag ? TS_F_BRIEF : 0, 9,
                                        name.buf, name.len),
                         0);
        assert_int_equal(raw_recv_reply(fd, 5000, &id, NULL, 0, &payload, &plen), 0);
        ts_rd_init(&rd, payload + 4, plen - 4);
        assert_int_equal(ts_rd_dataset_info(&rd, d), 0);
        free(payload);
        payload = NULL;
    }
    raw_close(fd);
    ts_wr_fini(&name);
    assert_int_equal(full.shards, 5);
    assert_int_equal(full.bytes, 50000);
    assert_int_equal(brief.shards, 0);
    assert_int_equal(brief.bytes, 0);
    assert_int_equal(brief.id, full.id);
    assert_int_equal(brief.policy.chunk_size, 4096);
    assert_int_equal(brief.state, full.state);
}

/*
 * A node without an RDMA listener: RDMA_TOKEN is refused with the reason, an rdma:// client
 * says why it cannot have a session, and a tesserad asked to listen for RDMA where there is no
 * RDMA device refuses to start and says so (on an RDMA host it starts: then that part is moot).
 */
static void test_rdma_absent(void **state)
{
    struct tessera_opts o;
    tessera_client *c = NULL;
    char addr[96], msg[256];
    uint64_t id;
    int fd;

    fd = raw_connect(D.addr);
    assert_true(fd >= 0);
    assert_int_equal(raw_send_frame(fd, TS_OP_RDMA_TOKEN, 0, 7, NULL, 0), 0);
    assert_int_equal(raw_recv_reply(fd, 5000, &id, msg, sizeof(msg), NULL, NULL), TS_ENOTSUP);
    assert_non_null(strstr(msg, "rdma_listen"));
    raw_close(fd);

    snprintf(addr, sizeof(addr), "rdma://%s", D.addr);
    tessera_opts_init(&o);
    o.address = addr;
    o.timeout_ms = 5000;
    assert_int_equal(tessera_client_open(&c, &o), TS_ENOTSUP);
    assert_null(c);

    {
        struct tsd_proc p = {0};
        const char *const extra[] = {"--rdma-listen", "127.0.0.1:0", NULL};
        if (tsd_start(&p, extra) == 0) {
            /* This host has RDMA on loopback's interface: nothing to refuse. */
            tsd_stop(&p);
        } else {
            FILE *f = fopen(p.log, "r");
            char line[512];
            int said = 0;
            assert_non_null(f);
            while (fgets(line, sizeof(line), f))
                said |= strstr(line, "RDMA") != NULL && strstr(line, "127.0.0.1:0") != NULL;
            fclose(f);
            assert_true(said);
        }
        tsd_cleanup(&p);
    }
}

/* Flips one byte at `at` within every data extent of the daemon's cache arena (a memfd, reached
 * through /proc): memory gone bad under a cached chunk. Returns how many extents it hit. */
static int corrupt_arena(pid_t pid, off_t at)
{
    char dir[64], path[600], link[256];
    int hits = 0;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    for (int fdn = 0; fdn < 4096; fdn++) {
        ssize_t n;
        int fd;
        off_t pos = 0;
        snprintf(path, sizeof(path), "%s/%d", dir, fdn);
        n = readlink(path, link, sizeof(link) - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (!strstr(link, "memfd:"))
            continue;
        fd = open(path, O_RDWR);
        if (fd < 0)
            continue;
        while ((pos = lseek(fd, pos, SEEK_DATA)) >= 0) {
            off_t hole = lseek(fd, pos, SEEK_HOLE);
            uint8_t b;
            if (hole < 0)
                break;
            /* Inside this extent only: a write into a hole would make a new one. */
            if (pos + at < hole && pread(fd, &b, 1, pos + at) == 1) {
                b ^= 0x5a;
                if (pwrite(fd, &b, 1, pos + at) == 1)
                    hits++;
            }
            pos = hole;
        }
        close(fd);
    }
    return hits;
}

static int corrupt_arena_copy(pid_t pid, const uint8_t *needle, size_t n);

/* A cached chunk whose memory went bad: a partial read over the bad byte never returns it with
 * success (the sub-block check catches it; the chunk is read again from the store), and whole
 * pieces carry the stored CRC, which the client checks. */
static void test_cache_memory_corruption(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    uint8_t *got = malloc(1u << 20), *want = malloc(1u << 20);
    size_t n = 0;
    int hits;

    assert_int_equal(tessera_dataset_create(c, "cachebad", &p), 0);
    put_shard(c, "cachebad", 0, 1u << 20, 99);
    check_shard(c, "cachebad", 0, 1u << 20, 99); /* now cached (in the arena) */
    hits = corrupt_arena(D.pid, 300000);
    fprintf(stderr, "  flipped a byte in %d cached extent(s)\n", hits);
    if (hits == 0) {
        fprintf(stderr, "  (no cache arena found: nothing to test)\n");
    } else {
        /* 16 KiB around the flipped byte: right bytes, or a refusal; never wrong bytes. */
        int rc = tessera_read(c, "cachebad", 0, 300000 - 8000, 16384, got, &n);
        ts_test_fill(want, 16384, 99, 300000 - 8000);
        fprintf(stderr, "  partial read over it: %s\n", rc ? ts_errname(rc) : "ok");
        assert_int_equal(rc, 0);
        assert_int_equal(n, 16384);
        assert_memory_equal(got, want, 16384);
        /* A 4 KiB-aligned piece over a byte flipped again: checked by combining the cached
         * sub-blocks' CRCs against the one pass that makes the reply's CRC (read.c,
         * ts_chunk_ref_check_crc): right bytes again, never the flipped ones. */
        uint8_t needle[64];
        ts_test_fill(needle, sizeof(needle), 99, 300000);
        if (corrupt_arena_copy(D.pid, needle, sizeof(needle)) > 0) {
            rc = tessera_read(c, "cachebad", 0, 72 * 4096, 16384, got, &n);
            ts_test_fill(want, 16384, 99, 72 * 4096);
            fprintf(stderr, "  aligned partial read over it: %s\n", rc ? ts_errname(rc) : "ok");
            assert_int_equal(rc, 0);
            assert_int_equal(n, 16384);
            assert_memory_equal(got, want, 16384);
        }
        /* And the whole chunk, again from a good copy. */
        check_shard(c, "cachebad", 0, 1u << 20, 99);
    }
    free(got);
    free(want);
    tessera_client_close(c);
}

/* Flips the first byte of every copy of needle[0, n) in the daemon's cache arena (found by
 * content: a cached chunk's bytes sit wherever the arena put them). Returns how many. */
static int corrupt_arena_copy(pid_t pid, const uint8_t *needle, size_t n)
{
    char dir[64], path[600], link[256];
    size_t blk = 4u << 20;
    uint8_t *buf = malloc(blk + n);
    int hits = 0;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    for (int fdn = 0; buf && fdn < 4096; fdn++) {
        ssize_t got, l;
        int fd;
        off_t pos;
        snprintf(path, sizeof(path), "%s/%d", dir, fdn);
        l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = '\0';
        if (!strstr(link, "memfd:") || (fd = open(path, O_RDWR)) < 0)
            continue;
        /* Data extents only (the arena is sparse). */
        for (pos = 0; (pos = lseek(fd, pos, SEEK_DATA)) >= 0;) {
            off_t hole = lseek(fd, pos, SEEK_HOLE);
            if (hole < 0)
                break;
            for (; pos < hole; pos += (off_t)blk) {
                const uint8_t *at;
                got = pread(fd, buf, (size_t)TS_MIN((off_t)(blk + n), hole - pos), pos);
                if (got < (ssize_t)n)
                    break;
                at = memmem(buf, (size_t)got, needle, n);
                if (at && at - buf < (ptrdiff_t)blk) {
                    uint8_t b = (uint8_t)(*at ^ 0x5a);
                    if (pwrite(fd, &b, 1, pos + (at - buf)) == 1)
                        hits++;
                }
            }
            pos = hole;
        }
        close(fd);
    }
    free(buf);
    return hits;
}

/* A cached chunk whose memory went bad, read whole: the piece carries the stored CRC, the client
 * finds the bytes fail it and asks the node once more to read from the store (TS_F_VERIFY): the
 * node evicts its cached copy and the read returns the right bytes; so do later reads. */
static void test_cache_corruption_whole_piece(void **state)
{
    tessera_client *c = connect_c();
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20, 0, 0, 0, 0};
    uint8_t want[64];
    int hits;

    assert_int_equal(tessera_dataset_create(c, "cachebad2", &p), 0);
    put_shard(c, "cachebad2", 0, 1u << 20, 77);
    check_shard(c, "cachebad2", 0, 1u << 20, 77); /* now cached (in the arena) */
    ts_test_fill(want, 64, 77, 500000);
    hits = corrupt_arena_copy(D.pid, want, 64);
    fprintf(stderr, "  flipped a byte in %d cached copies\n", hits);
    if (hits == 0) {
        fprintf(stderr, "  (no cache arena found: nothing to test)\n");
    } else {
        check_shard(c, "cachebad2", 0, 1u << 20, 77); /* whole piece over the bad byte */
        check_shard(c, "cachebad2", 0, 1u << 20, 77); /* and from the fresh copy */
    }
    tessera_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_sizes),
        cmocka_unit_test(test_ranges_and_pipelining),
        cmocka_unit_test(test_pipelined_large_reads),
        cmocka_unit_test(test_names_and_rules),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_truncated_header),
        cmocka_unit_test(test_wrong_magic_and_crc),
        cmocka_unit_test(test_oversize_length),
        cmocka_unit_test(test_unknown_opcode_keeps_connection),
        cmocka_unit_test(test_bad_chunk_crc),
        cmocka_unit_test(test_impossible_shard_size_refused),
        cmocka_unit_test(test_disconnect_mid_upload),
        cmocka_unit_test(test_reply_flag_and_short_body),
        cmocka_unit_test(test_slow_reader_bounded_memory),
        cmocka_unit_test(test_pipelined_flood_does_not_starve),
        cmocka_unit_test(test_half_close_after_many_requests),
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_brief_dataset_stat),
        cmocka_unit_test(test_put_chunk_memo),
        cmocka_unit_test(test_rdma_absent),
        cmocka_unit_test(test_cache_memory_corruption),
        cmocka_unit_test(test_cache_corruption_whole_piece),
    };
    const char *filter = getenv("TESSERA_TEST_FILTER"); /* e.g. "test_pipelined_*" */
    int rc;

    if (filter && *filter)
        cmocka_set_test_filter(filter);
    rc = cmocka_run_group_tests_name("server-tcp", tests, group_setup, group_teardown);
    if (rc)
        tsd_dump_log(&D);
    return rc;
}
