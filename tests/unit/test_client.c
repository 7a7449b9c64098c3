/*
 * Unit tests for client/: the CLI helpers, the pure reply decoders, and the request engine of
 * libtessera against a fake server on the other end of a socketpair. The fake server is either
 * scripted (replies written before the call that reads them) or a thread that answers frames,
 * so a lying server, out-of-order replies, timeouts and uploads are all tested without
 * tesserad.
 */
#include "ts_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_util.h"
#include "client_internal.h"
#include "fake_server.h"

/* ---- CLI helpers ------------------------------------------------------------------------------
 */

static void test_parse_size(void **state)
{
    static const struct {
        const char *s;
        int rc;
        uint64_t v;
    } cases[] = {
        {"0", 0, 0},
        {"4096", 0, 4096},
        {"64K", 0, 64u << 10},
        {"64k", 0, 64u << 10},
        {"1M", 0, 1u << 20},
        {"1MiB", 0, 1u << 20},
        {"1mb", 0, 1u << 20},
        {"3G", 0, 3ull << 30},
        {"2T", 0, 2ull << 40},
        {"512B", 0, 512},
        {"18446744073709551615", 0, UINT64_MAX},
        {"16777215T", 0, 16777215ull << 40},
        {"", TS_EINVAL, 0},
        {"M", TS_EINVAL, 0},
        {"-1", TS_EINVAL, 0},
        {"1.5M", TS_EINVAL, 0},
        {"12Q", TS_EINVAL, 0},
        {"1 M", TS_EINVAL, 0},
        {"1MM", TS_EINVAL, 0},
        {"1BB", TS_EINVAL, 0},
        {"1Bi", TS_EINVAL, 0},
        {NULL, TS_EINVAL, 0},
        {"18446744073709551616", TS_ERANGE, 0},
        {"16777216T", TS_ERANGE, 0},
    };

    for (size_t i = 0; i < TS_ARRAY_SIZE(cases); i++) {
        uint64_t v = 0;
        int rc = cli_parse_size(cases[i].s, &v);
        if (rc != cases[i].rc || (rc == 0 && v != cases[i].v))
            fail_msg("cli_parse_size(\"%s\"): %d, %llu", cases[i].s ? cases[i].s : "(null)", rc,
                     (unsigned long long)v);
    }
}

static void test_parse_uint(void **state)
{
    uint64_t v;

    assert_int_equal(cli_parse_uint("255", 255, &v), 0);
    assert_int_equal(v, 255);
    assert_int_equal(cli_parse_uint("256", 255, &v), TS_ERANGE);
    assert_int_equal(cli_parse_uint("4294967295", UINT32_MAX, &v), 0);
    assert_int_equal(cli_parse_uint("4294967296", UINT32_MAX, &v), TS_ERANGE);
    assert_int_equal(cli_parse_uint("1K", UINT32_MAX, &v), TS_EINVAL);
    assert_int_equal(cli_parse_uint("x", UINT32_MAX, &v), TS_EINVAL);
    assert_int_equal(cli_parse_uint("", UINT32_MAX, &v), TS_EINVAL);
    assert_int_equal(cli_parse_uint(" 1", UINT32_MAX, &v), TS_EINVAL);
}

static void test_human_size(void **state)
{
    char b[32];

    assert_string_equal(cli_human_size(0, b, sizeof(b)), "0 B");
    assert_string_equal(cli_human_size(1023, b, sizeof(b)), "1023 B");
    assert_string_equal(cli_human_size(1024, b, sizeof(b)), "1 KiB");
    assert_string_equal(cli_human_size(1536, b, sizeof(b)), "1.50 KiB");
    assert_string_equal(cli_human_size(64u << 20, b, sizeof(b)), "64 MiB");
    assert_string_equal(cli_human_size((3u << 20) + 12345, b, sizeof(b)), "3.01 MiB");
    assert_string_equal(cli_human_size(150ull << 30, b, sizeof(b)), "150 GiB");
    assert_string_equal(cli_human_size((150ull << 30) + 1, b, sizeof(b)), "150 GiB");
    assert_string_equal(cli_human_size(UINT64_MAX, b, sizeof(b)), "16.0 EiB");
    assert_string_equal(cli_time(0, b, sizeof(b)), "-");
    assert_string_equal(cli_time(1000000000ull * 86400, b, sizeof(b)), "1970-01-02T00:00:00Z");
}

enum { T_HELP = 1, T_SERVER, T_JSON, T_OUT, T_CORE };

static void test_cli_next(void **state)
{
    static const struct cli_opt g[] = {{"help", 'h', 0, T_HELP},
                                       {"server", 's', 1, T_SERVER},
                                       {"json", 0, 0, T_JSON},
                                       {NULL, 0, 0, 0}};
    static const struct cli_opt c[] = {{"output", 'o', 1, T_OUT}, {"core", 0, 1, T_CORE}, {0}};
    const struct cli_opt *tables[] = {g, c};
    char *argv[] = {"-s",       "h:1", "--json", "get", "--core=3", "-ofile",
                    "--output", "f2",  "-",      "--",  "-s",       NULL};
    const struct cli_opt *o;
    const char *v;
    struct cli_iter it;

    cli_iter_init(&it, 11, argv);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_OPT);
    assert_int_equal(o->id, T_SERVER);
    assert_string_equal(v, "h:1");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_OPT);
    assert_int_equal(o->id, T_JSON);
    assert_null(v);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_POS);
    assert_string_equal(v, "get");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_OPT);
    assert_int_equal(o->id, T_CORE);
    assert_string_equal(v, "3");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_OPT);
    assert_int_equal(o->id, T_OUT);
    assert_string_equal(v, "file");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_OPT);
    assert_string_equal(v, "f2");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_POS);
    assert_string_equal(v, "-");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_POS); /* after "--" */
    assert_string_equal(v, "-s");
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_END);

    /* Errors: unknown, missing value, value to a flag; command options need their table. */
    char *bad1[] = {"--nope"}, *bad2[] = {"--server"}, *bad3[] = {"--json=1"}, *bad4[] = {"-x"};
    char *bad5[] = {"--core", "1"};
    cli_iter_init(&it, 1, bad1);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_ERR);
    assert_non_null(strstr(it.err, "--nope"));
    cli_iter_init(&it, 1, bad2);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_ERR);
    assert_non_null(strstr(it.err, "needs a value"));
    cli_iter_init(&it, 1, bad3);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_ERR);
    cli_iter_init(&it, 1, bad4);
    assert_int_equal(cli_next(&it, tables, 2, &o, &v), CLI_ERR);
    cli_iter_init(&it, 2, bad5);
    assert_int_equal(cli_next(&it, tables, 1, &o, &v), CLI_ERR);
}

static void test_table(void **state)
{
    static const char *const hdr[] = {"NAME", "SIZE", "STATE"};
    static const char *const r1[] = {"imagenet", "1.5 GiB", "sealed"};
    static const char *const r2[] = {"a", "12 B", "open"};
    struct cli_table t;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);

    assert_non_null(f);
    assert_int_equal(cli_table_init(&t, 3, 0x2, hdr), 0);
    assert_int_equal(cli_table_add(&t, r1), 0);
    assert_int_equal(cli_table_add(&t, r2), 0);
    cli_table_print(&t, f);
    fclose(f);
    assert_string_equal(out, "NAME         SIZE  STATE\n"
                             "imagenet  1.5 GiB  sealed\n"
                             "a            12 B  open\n");
    free(out);
    cli_table_fini(&t);
    assert_int_equal(cli_table_init(&t, 0, 0, hdr), TS_EINVAL);
}

static void test_addr_parse(void **state)
{
    static const char *const bad[] = {
        ":7070", "h:", "h:0", "h:65536", "h:7x", "[::1", "[::1]x", "udp://h:1",
        /* More than one ':' without brackets is refused, not taken for an IPv6 host. */
        "::1", "bad:host:1", "fe80::1:7070", "tcp://a:b:1", "[]:1"};
    struct ts_addr a;

    assert_int_equal(ts_addr_parse("10.0.0.1:7070", &a), 0);
    assert_string_equal(a.host, "10.0.0.1");
    assert_string_equal(a.port, "7070");
    assert_null(a.ops);
    assert_int_equal(ts_addr_parse("node-1", &a), 0);
    assert_string_equal(a.host, "node-1");
    assert_string_equal(a.port, TS_DEFAULT_PORT);
    assert_int_equal(ts_addr_parse("[::1]:9", &a), 0);
    assert_string_equal(a.host, "::1");
    assert_string_equal(a.port, "9");
    assert_int_equal(ts_addr_parse("[::1]", &a), 0);
    assert_string_equal(a.host, "::1");
    assert_string_equal(a.port, TS_DEFAULT_PORT);
    assert_int_equal(ts_addr_parse("tcp://h:1", &a), 0);
    assert_null(a.ops);
    assert_int_equal(ts_addr_parse("rdma://h:1", &a), 0);
    assert_ptr_equal(a.ops, &ts_transport_rdma);
    assert_int_equal(ts_addr_parse(NULL, &a), 0);
    assert_string_equal(a.host, "127.0.0.1");

    for (size_t i = 0; i < TS_ARRAY_SIZE(bad); i++)
        if (ts_addr_parse(bad[i], &a) != TS_EINVAL)
            fail_msg("'%s' was not refused", bad[i]);
}

static void test_addr_parse_why(void **state)
{
    struct ts_addr a;
    char why[160];

    assert_int_equal(ts_addr_parse_why("bad:host:1", &a, why, sizeof(why)), TS_EINVAL);
    assert_non_null(strstr(why, "more than one ':'"));
    assert_non_null(strstr(why, "[::1]:7070"));
    assert_int_equal(ts_addr_parse_why("h:70000", &a, why, sizeof(why)), TS_EINVAL);
    assert_string_equal(why, "port '70000' is not a number from 1 to 65535");
    assert_int_equal(ts_addr_parse_why("h:", &a, why, sizeof(why)), TS_EINVAL);
    assert_non_null(strstr(why, "port ''"));
    assert_int_equal(ts_addr_parse_why(":1", &a, why, sizeof(why)), TS_EINVAL);
    assert_string_equal(why, "no host");
    assert_int_equal(ts_addr_parse_why("[::1", &a, why, sizeof(why)), TS_EINVAL);
    assert_non_null(strstr(why, "']'"));
    assert_int_equal(ts_addr_parse_why("[::1]x", &a, why, sizeof(why)), TS_EINVAL);
    assert_int_equal(ts_addr_parse_why("udp://h:1", &a, why, sizeof(why)), TS_EINVAL);
    assert_non_null(strstr(why, "udp://"));
    assert_int_equal(ts_addr_parse_why("h:1", &a, why, sizeof(why)), 0);
    assert_string_equal(why, "");
    assert_int_equal(ts_addr_parse_why("x:y:z", &a, NULL, 0), TS_EINVAL); /* no room: fine */
}

/* A client certificate without a CA would mean plain TCP: refused before connecting. */
static void test_cert_needs_ca(void **state)
{
    struct tessera_opts o;
    tessera_client *c = (tessera_client *)&o;
    char err[200];

    tessera_opts_init(&o);
    o.address = "127.0.0.1:1"; /* never reached */
    o.tls_cert = "client.pem";
    o.tls_key = "client.key";
    assert_int_equal(ts_client_open_ex(&c, &o, err, sizeof(err)), TS_EINVAL);
    assert_null(c);
    assert_string_equal(err, TS_CERT_NEEDS_CA);
    assert_string_equal(err, "a client certificate needs --tls-ca (TLS is used only with a CA to "
                             "verify the server)");
    o.tls_cert = NULL; /* a key alone too */
    assert_int_equal(tessera_client_open(&c, &o), TS_EINVAL);
    assert_null(c);
    o.tls_cert = "client.pem";
    o.tls_key = NULL;
    assert_int_equal(tessera_client_open(&c, &o), TS_EINVAL);
}

/* rdma:// with nobody at the control address: refused (or, in a build without rdma-core,
 * not supported), with the reason; nothing is left open. */
static void test_rdma_unreachable(void **state)
{
    struct tessera_opts o;
    tessera_client *c = (tessera_client *)&o;
    char err[256];
    int rc;

    tessera_opts_init(&o);
    o.address = "rdma://127.0.0.1:1";
    rc = ts_client_open_ex(&c, &o, err, sizeof(err));
    assert_true(rc == TS_ECONNREFUSED || rc == TS_ENOTSUP);
    assert_null(c);
    assert_true(strlen(err) > 0);
    o.address = "bad:address:x";
    assert_int_equal(tessera_client_open(&c, &o), TS_EINVAL);
    assert_null(c);
}

/* ---- pure decoders ----------------------------------------------------------------------------
 */

static void test_reply_status(void **state)
{
    struct ts_wr w;
    struct ts_rd r;
    char msg[16];

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u8(&w, 7);
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_reply_status(&r, msg, sizeof(msg)), 0);
    assert_int_equal(ts_rd_u8(&r), 7); /* left at the body */
    ts_wr_fini(&w);

    ts_wr_init(&w);
    ts_wr_u32(&w, (uint32_t)TS_ENOENT);
    ts_wr_str(&w, "no such\x1b[31m dataset, long message");
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_reply_status(&r, msg, sizeof(msg)), TS_ENOENT);
    assert_string_equal(msg, "no such?[31m da"); /* cut, no escape sequences */
    ts_wr_fini(&w);

    ts_wr_init(&w); /* a refusal without its message still counts */
    ts_wr_u32(&w, (uint32_t)TS_EPERM);
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_reply_status(&r, msg, sizeof(msg)), TS_EPERM);
    assert_string_equal(msg, "");
    ts_wr_fini(&w);

    ts_wr_init(&w);
    ts_wr_u32(&w, 5); /* not a TS_E* code */
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_reply_status(&r, msg, sizeof(msg)), TS_EPROTO);
    ts_rd_init(&r, w.buf, 3); /* too short for a status */
    assert_int_equal(ts_reply_status(&r, msg, sizeof(msg)), TS_EPROTO);
    ts_wr_fini(&w);
}

static void test_hello_decode(void **state)
{
    struct ts_hello_reply h;
    struct ts_wr w;
    struct ts_rd r;

    ts_wr_init(&w);
    ts_wr_u16(&w, 1);
    ts_wr_str(&w, "node-7");
    ts_wr_u8(&w, TS_ROLE_WRITER);
    ts_wr_u32(&w, 1u << 26);
    ts_wr_u64(&w, 42);
    ts_wr_u32(&w, 99); /* a newer server's trailing field */
    ts_rd_init(&r, w.buf, w.len);
    assert_int_equal(ts_hello_decode(&r, &h), 0);
    assert_string_equal(h.node, "node-7");
    assert_int_equal(h.role, TS_ROLE_WRITER);
    assert_int_equal(h.max_frame, 1u << 26);
    assert_int_equal(h.epoch, 42);
    ts_rd_init(&r, w.buf, 10); /* cut short */
    assert_int_equal(ts_hello_decode(&r, &h), TS_EPROTO);
    ts_wr_fini(&w);
}

static void put_head(uint8_t *h, uint64_t size, uint32_t n)
{
    ts_put_le32(h, 0);
    ts_put_le64(h + 4, size);
    ts_put_le32(h + 12, n);
}

static void test_read_head_decode(void **state)
{
    struct ts_read_head rh;
    uint8_t h[TS_READ_HEAD_LEN];

    /* 100 bytes at 0 of a 1000-byte shard in 2 pieces. */
    put_head(h, 1000, 2);
    assert_int_equal(ts_read_head_decode(h, 16 + 16 + 100, 0, 100, &rh), 0);
    assert_int_equal(rh.data_len, 100);
    assert_int_equal(rh.npieces, 2);
    assert_int_equal(rh.shard_size, 1000);
    /* The range runs past the end: cut at the end. */
    assert_int_equal(ts_read_head_decode(h, 16 + 16 + 50, 950, 100, &rh), 0);
    assert_int_equal(rh.data_len, 50);
    /* A lying server: more data than asked for (would overflow the buffer). */
    assert_int_equal(ts_read_head_decode(h, 16 + 16 + 101, 0, 100, &rh), TS_EPROTO);
    /* Less than the shard holds, or more than it holds. */
    assert_int_equal(ts_read_head_decode(h, 16 + 16 + 99, 0, 100, &rh), TS_EPROTO);
    assert_int_equal(ts_read_head_decode(h, 16 + 16 + 60, 950, 100, &rh), TS_EPROTO);
    /* Data at or past the end of the shard. */
    put_head(h, 1000, 0);
    assert_int_equal(ts_read_head_decode(h, 16, 1000, 100, &rh), 0);
    assert_int_equal(rh.data_len, 0);
    assert_int_equal(ts_read_head_decode(h, 16 + 10, 1000, 100, &rh), TS_EPROTO);
    /* A piece table longer than the payload. */
    put_head(h, 1000, 0x20000000u);
    assert_int_equal(ts_read_head_decode(h, 16 + 100, 0, 100, &rh), TS_EPROTO);
    put_head(h, 1000, 3);
    assert_int_equal(ts_read_head_decode(h, 16 + 16, 0, 100, &rh), TS_EPROTO);
    /* Too short, or a status that is not 0. */
    assert_int_equal(ts_read_head_decode(h, 15, 0, 100, &rh), TS_EPROTO);
    ts_put_le32(h, (uint32_t)TS_EIO);
    assert_int_equal(ts_read_head_decode(h, 16 + 24, 0, 0, &rh), TS_EPROTO);
}

static void test_read_pieces(void **state)
{
    uint8_t data[300], table[24];
    uint32_t done = 0;
    size_t doff = 0;

    ts_test_fill(data, sizeof(data), 3, 0);
    ts_put_le32(table, 100);
    ts_put_le32(table + 4, ts_crc32c(0, data, 100));
    ts_put_le32(table + 8, 150);
    ts_put_le32(table + 12, ts_crc32c(0, data + 100, 150));
    ts_put_le32(table + 16, 50);
    ts_put_le32(table + 20, ts_crc32c(0, data + 250, 50));
    assert_int_equal(ts_read_pieces_check(table, 3, 300), 0);
    assert_int_equal(ts_read_pieces_check(table, 3, 299), TS_EPROTO);
    assert_int_equal(ts_read_pieces_check(table, 2, 300), TS_EPROTO);
    /* Verified piece by piece as the bytes arrive. */
    assert_int_equal(ts_read_pieces_verify(table, 3, data, 99, &done, &doff), 0);
    assert_int_equal(done, 0);
    assert_int_equal(ts_read_pieces_verify(table, 3, data, 260, &done, &doff), 0);
    assert_int_equal(done, 2);
    assert_int_equal(doff, 250);
    assert_int_equal(ts_read_pieces_verify(table, 3, data, 300, &done, &doff), 0);
    assert_int_equal(done, 3);
    /* One flipped bit in the middle piece. */
    data[170] ^= 0x10;
    done = 0;
    doff = 0;
    assert_int_equal(ts_read_pieces_verify(table, 3, data, 300, &done, &doff), TS_ECORRUPT);
    assert_int_equal(done, 1);
}

/* What a TLS port does with a plain HELLO. */
enum tls_port { TLS_CLOSES, TLS_ALERT, HELLO_THEN_CLOSES };

static void *fake_tls_port(void *arg)
{
    /* A TLS 1.2+ record: alert, fatal, unexpected_message. */
    static const uint8_t alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a};
    int *v = arg, fd = v[0];
    struct ts_frame_hdr h;
    uint8_t hdr[TS_HDR_LEN], *p;

    if (v[1] == HELLO_THEN_CLOSES) {
        if (fake_recv(fd, &h, &p) == 0) {
            free(p);
            fake_hello(fd, 1);
        }
    } else {
        (void)read_exact(fd, hdr, sizeof(hdr)); /* what a TLS server reads as a record header */
        if (v[1] == TLS_ALERT)
            (void)write_exact(fd, alert, sizeof(alert));
    }
    shutdown(fd, SHUT_RDWR);
    return NULL;
}

/* Opening over a socketpair whose other end behaves as in *how; the code, the reason in err. */
static int open_against(enum tls_port how, char *err, size_t cap)
{
    struct ts_transport *t;
    struct tessera_opts o;
    tessera_client *c = NULL;
    pthread_t th;
    int sv[2], arg[2], rc;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    arg[0] = sv[1];
    arg[1] = (int)how;
    assert_int_equal(pthread_create(&th, NULL, fake_tls_port, arg), 0);
    assert_int_equal(ts_tcp_from_fd(&t, sv[0]), 0);
    tessera_opts_init(&o);
    o.timeout_ms = 5000;
    rc = ts_client_open_transport(&c, &o, t, err, cap);
    assert_null(c);
    pthread_join(th, NULL);
    close(sv[1]);
    return rc;
}

/* Plain TCP to a TLS port: the error says so, whichever way the server refuses. */
static void test_tls_port_hint(void **state)
{
    char err[512];
    int rc;

    rc = open_against(TLS_CLOSES, err, sizeof(err));
    assert_true(rc == TS_ECONNRESET || rc == TS_EPROTO);
    assert_non_null(strstr(err, "HELLO: "));
    assert_non_null(strstr(err, "(is this a TLS port? use --tls-ca)"));
    rc = open_against(TLS_ALERT, err, sizeof(err));
    assert_true(rc == TS_EPROTO || rc == TS_ECONNRESET);
    assert_non_null(strstr(err, "(is this a TLS port? use --tls-ca)"));
    /* A tessera server that answered HELLO and then went away is no TLS port. */
    rc = open_against(HELLO_THEN_CLOSES, err, sizeof(err));
    assert_int_equal(rc, TS_ECONNRESET);
    assert_null(strstr(err, "TLS"));
    assert_non_null(strstr(err, "MAP_GET"));
}

/* ---- engine: scripted -------------------------------------------------------------------------
 */

static void test_stat_and_refusal(void **state)
{
    struct ts_dataset_info d;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    fake_dataset_info(fd, ID0, "imagenet", 4096);
    assert_int_equal(tessera_dataset_stat(c, "imagenet", &d), 0);
    assert_string_equal(d.name, "imagenet");
    assert_int_equal(d.policy.chunk_size, 4096);
    assert_int_equal(expect_req(fd, TS_OP_DATASET_STAT), ID0);

    fake_error(fd, TS_OP_DATASET_STAT, ID0 + 1, TS_ENOENT, "dataset-stat nope: no such dataset");
    assert_int_equal(tessera_dataset_stat(c, "nope", &d), TS_ENOENT);
    assert_string_equal(tessera_client_error(c), "dataset-stat nope: no such dataset");
    expect_req(fd, TS_OP_DATASET_STAT);

    /* Checked before anything is sent: no request id is used up. */
    assert_int_equal(tessera_dataset_stat(c, "bad name", &d), TS_ENAME);
    fake_dataset_info(fd, ID0 + 2, "x", 0);
    assert_int_equal(tessera_dataset_stat(c, "x", &d), 0);
    assert_string_equal(tessera_client_error(c), "");
    tessera_client_close(c);
    close(fd);
}

static void test_read_verified(void **state)
{
    uint8_t shard[10000], buf[5000 + 16];
    size_t n = 0;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    ts_test_fill(shard, sizeof(shard), 1, 0);
    memset(buf, 0x55, sizeof(buf));
    fake_read_reply(fd, ID0, shard, sizeof(shard), 4096, 1000, 5000, HONEST);
    assert_int_equal(tessera_read(c, "ds", 0, 1000, 5000, buf, &n), 0);
    assert_int_equal(n, 5000);
    assert_memory_equal(buf, shard + 1000, 5000);
    /* Past the end: cut there. */
    fake_read_reply(fd, ID0 + 1, shard, sizeof(shard), 4096, 9000, 5000, HONEST);
    assert_int_equal(tessera_read(c, "ds", 0, 9000, 5000, buf, &n), 0);
    assert_int_equal(n, 1000);
    assert_memory_equal(buf, shard + 9000, 1000);
    /* A refused read carries the server's message. */
    fake_error(fd, TS_OP_READ, ID0 + 2, TS_ERANGE, "read ds/0: offset past the end");
    assert_int_equal(tessera_read(c, "ds", 0, 20000, 10, buf, &n), TS_ERANGE);
    assert_int_equal(n, 0);
    assert_string_equal(tessera_client_error(c), "read ds/0: offset past the end");
    tessera_client_close(c);
    close(fd);
}

/* A lying server never writes past the caller's buffer, and framing stays intact. */
static void test_read_lying_server(void **state)
{
    static const enum lie lies[] = {LIE_LONG, LIE_SUM, LIE_CRC, LIE_SIZE};
    static const int want[] = {TS_EPROTO, TS_EPROTO, TS_ECORRUPT, TS_EPROTO};
    uint8_t shard[10000], buf[2000];
    struct ts_dataset_info d;
    struct verify_reply v;
    uint64_t id = ID0;
    size_t n;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    ts_test_fill(shard, sizeof(shard), 2, 0);
    for (size_t i = 0; i < TS_ARRAY_SIZE(lies); i++) {
        memset(buf, 0x77, sizeof(buf));
        fake_read_reply(fd, id++, shard, sizeof(shard), 1024, 8000, 1000, lies[i]);
        if (lies[i] == LIE_CRC) /* the client reads once more (flag VERIFY): a lie again */
            verify_reply_start(&v, fd, id++, shard, sizeof(shard), 1024, 8000, 1000, lies[i]);
        assert_int_equal(tessera_read(c, "ds", 0, 8000, 1000, buf, &n), want[i]);
        if (lies[i] == LIE_CRC)
            verify_reply_join(&v);
        assert_int_equal(n, 0);
        for (size_t k = 1000; k < sizeof(buf); k++) /* nothing past what was asked for */
            assert_int_equal(buf[k], 0x77);
        assert_true(strlen(tessera_client_error(c)) > 0);
        /* The connection is still in step: the next reply is matched correctly. */
        fake_dataset_info(fd, id++, "ds", 1024);
        assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    }
    /* Bytes failing their CRC once, then right: the read once more gets them. */
    fake_read_reply(fd, id++, shard, sizeof(shard), 1024, 8000, 1000, LIE_CRC);
    verify_reply_start(&v, fd, id++, shard, sizeof(shard), 1024, 8000, 1000, HONEST);
    assert_int_equal(tessera_read(c, "ds", 0, 8000, 1000, buf, &n), 0);
    verify_reply_join(&v);
    assert_int_equal(n, 1000);
    assert_memory_equal(buf, shard + 8000, 1000);
    /* The same for a submitted read (tessera_wait; what `tessera get` uses)... */
    {
        uint64_t op;
        memset(buf, 0x77, sizeof(buf));
        assert_int_equal(tessera_read_submit(c, "ds", 0, 7000, 1000, buf, &op), 0);
        fake_read_reply(fd, id++, shard, sizeof(shard), 1024, 7000, 1000, LIE_CRC);
        verify_reply_start(&v, fd, id++, shard, sizeof(shard), 1024, 7000, 1000, HONEST);
        assert_int_equal(tessera_wait(c, op, &n), 0);
        verify_reply_join(&v);
        assert_int_equal(n, 1000);
        assert_memory_equal(buf, shard + 7000, 1000);
        /* ...and one that lies twice fails, with nothing unverified reported as read. */
        assert_int_equal(tessera_read_submit(c, "ds", 0, 7000, 1000, buf, &op), 0);
        fake_read_reply(fd, id++, shard, sizeof(shard), 1024, 7000, 1000, LIE_CRC);
        verify_reply_start(&v, fd, id++, shard, sizeof(shard), 1024, 7000, 1000, LIE_CRC);
        assert_int_equal(tessera_wait(c, op, &n), TS_ECORRUPT);
        verify_reply_join(&v);
        assert_int_equal(n, 0);
    }
    tessera_client_close(c);
    close(fd);
}

static void test_submit_out_of_order(void **state)
{
    uint8_t shard[4096], b[3][100];
    uint64_t ops[3], op;
    size_t n;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    ts_test_fill(shard, sizeof(shard), 3, 0);
    assert_int_equal(tessera_wait_any(c, &op, &n), TS_ENOENT);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tessera_read_submit(c, "ds", 0, (uint64_t)i * 100, 100, b[i], &ops[i]), 0);
    assert_int_equal(ops[0], ID0);
    assert_int_equal(ops[2], ID0 + 2);
    assert_int_equal(tessera_read_submit(c, "ds", 0, 0, TESSERA_MAX_READ + 1, b[0], &op),
                     TS_EINVAL);
    /* Answered last first. */
    fake_read_reply(fd, ID0 + 2, shard, sizeof(shard), 1024, 200, 100, HONEST);
    fake_read_reply(fd, ID0, shard, sizeof(shard), 1024, 0, 100, HONEST);
    fake_read_reply(fd, ID0 + 1, shard, sizeof(shard), 1024, 100, 100, HONEST);
    assert_int_equal(tessera_wait_any(c, &op, &n), 0);
    assert_int_equal(op, ID0 + 2);
    assert_int_equal(n, 100);
    assert_memory_equal(b[2], shard + 200, 100);
    assert_int_equal(tessera_wait(c, ops[1], &n), 0);
    assert_memory_equal(b[1], shard + 100, 100);
    assert_int_equal(tessera_wait(c, ops[1], &n), TS_ENOENT); /* already collected */
    assert_int_equal(tessera_wait_any(c, &op, &n), 0);
    assert_int_equal(op, ID0);
    assert_memory_equal(b[0], shard, 100);
    assert_int_equal(tessera_wait_any(c, &op, &n), TS_ENOENT);
    tessera_client_close(c);
    close(fd);
}

/* The TCP transport, counting receives and those that found nothing. */
static unsigned counted_recvs, counted_empty;

static long counting_recv(struct ts_transport *t, const struct iovec *iov, int iovcnt)
{
    long n = ts_transport_tcp.recv(t, iov, iovcnt);

    counted_recvs++;
    counted_empty += n == 0;
    return n;
}

static struct ts_transport_ops counting_ops;

/*
 * A READ reply that is all there takes one receive (into the stage, copied out): the header,
 * the READ head, the piece table and the data; so do several small replies back to back.
 * None finds nothing, as the replies were the only ones expected.
 */
static void test_read_one_receive(void **state)
{
    static uint8_t shard[3u << 20], buf[(1u << 20) + 8], b[4][4096];
    uint64_t ops[4];
    size_t n = 0;
    int fd;
    tessera_client *c;

    counting_ops = ts_transport_tcp;
    counting_ops.recv = counting_recv;
    c = open_pair_ops(&fd, 5000, &counting_ops);
    ts_test_fill(shard, sizeof(shard), 4, 0);
    counted_recvs = counted_empty = 0;
    fake_read_reply(fd, ID0, shard, sizeof(shard), 1u << 20, 4096, 16384, HONEST);
    assert_int_equal(tessera_read(c, "ds", 0, 4096, 16384, buf, &n), 0);
    assert_int_equal(n, 16384);
    assert_memory_equal(buf, shard + 4096, 16384);
    assert_int_equal(counted_recvs, 1);
    assert_int_equal(counted_empty, 0);
    /* Two pieces (across a chunk boundary). */
    counted_recvs = counted_empty = 0;
    fake_read_reply(fd, ID0 + 1, shard, sizeof(shard), 1u << 20, (1u << 20) - 100, 1000, HONEST);
    assert_int_equal(tessera_read(c, "ds", 0, (1u << 20) - 100, 1000, buf, &n), 0);
    assert_int_equal(n, 1000);
    assert_memory_equal(buf, shard + (1u << 20) - 100, 1000);
    assert_int_equal(counted_recvs, 1);
    assert_int_equal(counted_empty, 0);
    /* Four 4 KiB reads answered back to back. */
    for (int i = 0; i < 4; i++)
        assert_int_equal(tessera_read_submit(c, "ds", 0, (uint64_t)i * 8192, 4096, b[i], &ops[i]),
                         0);
    for (int i = 0; i < 4; i++)
        expect_req(fd, TS_OP_READ);
    counted_recvs = counted_empty = 0;
    for (int i = 0; i < 4; i++)
        fake_read_reply(fd, ops[i], shard, sizeof(shard), 1u << 20, (uint64_t)i * 8192, 4096,
                        HONEST);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tessera_wait(c, ops[i], &n), 0);
        assert_int_equal(n, 4096);
        assert_memory_equal(b[i], shard + (uint64_t)i * 8192, 4096);
    }
    assert_int_equal(counted_recvs, 1);
    assert_int_equal(counted_empty, 0);
    /* A reply larger than the stage (its data partly copied from the stage, the rest received
     * straight into the buffer) and a small one after it. */
    assert_int_equal(tessera_read_submit(c, "ds", 0, 100, 200000, buf, &ops[0]), 0);
    assert_int_equal(tessera_read_submit(c, "ds", 0, 5, 4096, b[0], &ops[1]), 0);
    expect_req(fd, TS_OP_READ);
    expect_req(fd, TS_OP_READ);
    counted_recvs = 0;
    fake_read_reply(fd, ops[0], shard, sizeof(shard), 1u << 20, 100, 200000, HONEST);
    fake_read_reply(fd, ops[1], shard, sizeof(shard), 1u << 20, 5, 4096, HONEST);
    assert_int_equal(tessera_wait(c, ops[1], &n), 0);
    assert_memory_equal(b[0], shard + 5, 4096);
    assert_int_equal(tessera_wait(c, ops[0], &n), 0);
    assert_int_equal(n, 200000);
    assert_memory_equal(buf, shard + 100, 200000);
    assert_in_range(counted_recvs, 2, 3);
    tessera_client_close(c);
    close(fd);
}

/* The TCP transport, recording the largest receive low-water mark it was given. */
static size_t lowat_max;

static int recording_rx_lowat(struct ts_transport *t, size_t bytes)
{
    if (bytes > lowat_max)
        lowat_max = bytes;
    return ts_transport_tcp.rx_lowat(t, bytes);
}

static size_t batch_1mib(void *arg)
{
    return 1u << 20;
}

/*
 * Receive batching (ts_batch.on_block): a caller with units in hand lets a wait sleep until
 * the reads it sent have brought their bytes. A refusal brings far fewer: the wait still wakes
 * (after RX_BATCH_WAIT_MS), the refusal is reported at once, not at the handle's timeout, and
 * the other read's bytes come through right.
 */
static void test_batched_wait_wakes_for_a_refusal(void **state)
{
    static uint8_t shard[1u << 20], b[2][256u << 10];
    static struct ts_transport_ops ops;
    struct ts_batch batch = {0, batch_1mib, NULL};
    uint64_t op[2], got_op = 0, t0;
    size_t n = 0;
    int fd;
    tessera_client *c;

    ops = ts_transport_tcp;
    ops.rx_lowat = recording_rx_lowat;
    c = open_tcp_pair_ops(&fd, 10000, &ops);
    ts_client_batch(c, &batch);
    ts_test_fill(shard, sizeof(shard), 9, 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(
            tessera_read_submit(c, "ds", 0, (uint64_t)i * sizeof(b[0]), sizeof(b[0]), b[i], &op[i]),
            0);
    lowat_max = 0;
    t0 = ts_now_mono_ns();
    fake_error(fd, TS_OP_READ, op[0], TS_ENOENT, "read ds: no such dataset");
    assert_int_equal(tessera_wait_any(c, &got_op, &n), TS_ENOENT);
    assert_int_equal(got_op, op[0]);
    assert_true(ts_now_mono_ns() - t0 < 2000000000ull); /* the handle's timeout is 10 s */
    assert_int_equal(lowat_max, 2 * sizeof(b[0]));      /* the wait was batched: both reads due */
    expect_req(fd, TS_OP_READ);
    expect_req(fd, TS_OP_READ);
    fake_read_reply(fd, op[1], shard, sizeof(shard), 1u << 20, sizeof(b[0]), sizeof(b[0]), HONEST);
    assert_int_equal(tessera_wait(c, op[1], &n), 0);
    assert_int_equal(n, sizeof(b[1]));
    assert_memory_equal(b[1], shard + sizeof(b[0]), sizeof(b[1]));
    tessera_client_close(c);
    close(fd);
}

/* Writes buf to fd a byte at a time, pausing between them: every partial state is seen. */
struct dribble {
    int fd;
    const uint8_t *buf;
    size_t len;
};

static void *dribble_main(void *arg)
{
    struct dribble *d = arg;

    for (size_t i = 0; i < d->len; i++) {
        if (write_exact(d->fd, d->buf + i, 1) != 0)
            return (void *)1;
        usleep(20);
    }
    return NULL;
}

/*
 * Frames shorter than a header with a READ head leave the start of the next frame in the
 * client's stage: replies of every shape, back to back, out of order, whole or a byte at a
 * time, are matched and checked correctly.
 */
static void test_read_mixed_frames(void **state)
{
    uint8_t shard[8192], b[4][600];
    struct ts_wr w;
    uint64_t ops[4];
    size_t n;
    int sv[2];

    ts_test_fill(shard, sizeof(shard), 5, 0);
    for (int dribble = 0; dribble < 2; dribble++) {
        struct verify_reply v;
        struct dribble d;
        uint8_t *all;
        pthread_t th;
        void *bad;
        int fd;
        tessera_client *c = open_pair(&fd, 5000);

        memset(b, 0x33, sizeof(b));
        for (int i = 0; i < 4; i++)
            assert_int_equal(
                tessera_read_submit(c, "ds", 0, (uint64_t)i * 1000, 500, b[i], &ops[i]), 0);
        for (int i = 0; i < 4; i++)
            expect_req(fd, TS_OP_READ);
        /* The replies go through a socketpair first, to be sent whole or dribbled. */
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        fake_error(sv[0], TS_OP_READ, ID0 + 2, TS_ENOENT, ""); /* shorter than a READ head */
        ts_wr_init(&w);
        ts_wr_u32(&w, 0); /* status 0 with no head: malformed */
        fake_send(sv[0], TS_OP_READ, ID0 + 3, &w, NULL, 0);
        ts_wr_fini(&w);
        fake_read_reply(sv[0], ID0 + 1, shard, sizeof(shard), 256, 1000, 500, HONEST);
        fake_read_reply(sv[0], ID0, shard, sizeof(shard), 4096, 0, 500, LIE_CRC);
        close(sv[0]);
        /* The piece that failed its CRC is asked for once more (VERIFY): a lie again. */
        verify_reply_start(&v, fd, ID0 + 4, shard, sizeof(shard), 4096, 0, 500, LIE_CRC);
        all = malloc(1 << 16);
        d.len = 0;
        for (ssize_t k; (k = read(sv[1], all + d.len, (1 << 16) - d.len)) > 0;)
            d.len += (size_t)k;
        close(sv[1]);
        d.fd = fd;
        d.buf = all;
        if (dribble) {
            assert_int_equal(pthread_create(&th, NULL, dribble_main, &d), 0);
        } else {
            assert_int_equal(write_exact(fd, all, d.len), 0);
        }
        assert_int_equal(tessera_wait(c, ops[2], &n), TS_ENOENT);
        assert_int_equal(tessera_wait(c, ops[3], &n), TS_EPROTO);
        assert_int_equal(tessera_wait(c, ops[1], &n), 0);
        assert_int_equal(n, 500);
        assert_memory_equal(b[1], shard + 1000, 500);
        assert_int_equal(b[1][500], 0x33);
        assert_int_equal(tessera_wait(c, ops[0], &n), TS_ECORRUPT);
        verify_reply_join(&v);
        if (dribble) {
            pthread_join(th, &bad);
            assert_null(bad);
        }
        free(all);
        /* Still in step. */
        fake_dataset_info(fd, ID0 + 5, "ds", 1024);
        assert_int_equal(tessera_dataset_stat(c, "ds", &(struct ts_dataset_info){0}), 0);
        tessera_client_close(c);
        close(fd);
    }
}

static void test_timeout_breaks_connection(void **state)
{
    struct ts_dataset_info d;
    uint64_t t0, ms;
    int fd;
    tessera_client *c = open_pair(&fd, 200);

    t0 = ts_now_mono_ns();
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ETIMEDOUT);
    ms = (ts_now_mono_ns() - t0) / 1000000;
    assert_true(ms >= 190 && ms < 3000);
    /* The connection is gone for good. */
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ECONNRESET);
    tessera_client_close(c);
    close(fd);
}

static void test_server_closes(void **state)
{
    struct ts_dataset_info d;
    uint8_t buf[10];
    uint64_t op;
    size_t n;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    assert_int_equal(tessera_read_submit(c, "ds", 0, 0, 10, buf, &op), 0);
    shutdown(fd, SHUT_RDWR);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ECONNRESET);
    assert_int_equal(tessera_wait(c, op, &n), TS_ECONNRESET); /* the submitted read fails too */
    assert_int_equal(tessera_read(c, "ds", 0, 0, 10, buf, &n), TS_ECONNRESET);
    tessera_client_close(c);
    close(fd);
}

/* Request id 0: the server gave up on the connection and says why. */
static void test_connection_error_reply(void **state)
{
    struct ts_dataset_info d;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    fake_error(fd, TS_OP_DATASET_STAT, 0, TS_ETOOBIG, "frame of 99999999 bytes is too big");
    close(fd);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ETOOBIG);
    assert_string_equal(tessera_client_error(c), "frame of 99999999 bytes is too big");
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ECONNRESET);
    tessera_client_close(c);
}

static void test_framing_violations(void **state)
{
    struct ts_dataset_info d;
    uint8_t junk[TS_HDR_LEN] = "HTTP/1.1 400 Bad Request\r\n";
    struct ts_wr w;
    int fd;
    tessera_client *c;

    /* A reply to a request never sent. */
    c = open_pair(&fd, 5000);
    fake_dataset_info(fd, 77, "ds", 0);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_EPROTO);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_ECONNRESET);
    tessera_client_close(c);
    close(fd);
    /* Not a tessera frame at all. */
    c = open_pair(&fd, 5000);
    assert_int_equal(write_exact(fd, junk, sizeof(junk)), 0);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_EPROTO);
    tessera_client_close(c);
    close(fd);
    /* The right id with another opcode. */
    c = open_pair(&fd, 5000);
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    fake_send(fd, TS_OP_STATUS, ID0, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_EPROTO);
    tessera_client_close(c);
    close(fd);
    /* A truncated body is a malformed reply, not a crash; the connection stays usable. */
    c = open_pair(&fd, 5000);
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_str(&w, "ds");
    fake_send(fd, TS_OP_DATASET_STAT, ID0, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), TS_EPROTO);
    fake_dataset_info(fd, ID0 + 1, "ds", 0);
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    tessera_client_close(c);
    close(fd);
}

static void test_lists(void **state)
{
    struct ts_dataset_info a = {.name = "a", .id = 1}, b = {.name = "b", .id = 2}, *dl;
    struct ts_shard_info s = {.shard = 5, .state = 1, .size = 99, .expect_size = TS_SIZE_UNKNOWN},
                         *sl;
    struct ts_scrub_report rep;
    struct ts_wr w;
    char *json;
    size_t n;
    int fd;
    tessera_client *c = open_pair(&fd, 5000);

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 2);
    ts_wr_dataset_info(&w, &a);
    ts_wr_dataset_info(&w, &b);
    fake_send(fd, TS_OP_DATASET_LIST, ID0, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_dataset_list(c, &dl, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(dl[1].name, "b");
    assert_int_equal(dl[1].id, 2);
    free(dl);

    /* A count the payload cannot hold: refused before allocating for it. */
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 0xffffffffu);
    ts_wr_dataset_info(&w, &a);
    fake_send(fd, TS_OP_DATASET_LIST, ID0 + 1, &w, NULL, 0);
    ts_wr_fini(&w);
    dl = (void *)&w;
    assert_int_equal(tessera_dataset_list(c, &dl, &n), TS_EPROTO);
    assert_null(dl);
    assert_int_equal(n, 0);

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 1);
    ts_wr_shard_info(&w, &s);
    fake_send(fd, TS_OP_SHARD_LIST, ID0 + 2, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_shard_list(c, "ds", &sl, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(sl[0].shard, 5);
    assert_true(sl[0].expect_size == TS_SIZE_UNKNOWN);
    free(sl);

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, 3);
    ts_wr_u64(&w, 30);
    ts_wr_u64(&w, 3000);
    ts_wr_u64(&w, 1);
    ts_wr_u32(&w, 1);
    ts_wr_str(&w, "ds");
    ts_wr_u32(&w, 2);
    ts_wr_u32(&w, 7);
    ts_wr_u32(&w, (uint32_t)TS_ECORRUPT);
    fake_send(fd, TS_OP_SCRUB, ID0 + 3, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_scrub(c, NULL, &rep, NULL, NULL), 0);
    assert_int_equal(rep.corrupt, 1);
    assert_int_equal(rep.bytes, 3000);

    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_str(&w, "{\"node\": \"fake\"}");
    fake_send(fd, TS_OP_STATUS, ID0 + 4, &w, NULL, 0);
    ts_wr_fini(&w);
    assert_int_equal(tessera_status(c, &json), 0);
    assert_string_equal(json, "{\"node\": \"fake\"}");
    free(json);
    tessera_client_close(c);
    close(fd);
}

/* ---- engine: a threaded fake server -------------------------------------------------------------
 */

struct fake {
    int fd;
    pthread_t th;
    uint32_t chunk;
    /* READ */
    const uint8_t *shard;
    uint64_t size;
    /* uploads */
    uint8_t *got;
    size_t got_len, got_cap;
    uint32_t next_idx;
    uint64_t declared;
    uint32_t fail_idx; /* refuse this chunk index (UINT32_MAX: none) */
    int bad_crc;       /* chunks whose CRC did not match */
    int out_of_order;  /* chunks not in index order */
    uint32_t seal_crc, nrecords, writes;
    uint64_t records[4];
    int sealed;
    int erange_at_end; /* READ at offset == size: TS_ERANGE rather than no bytes */
    int shrink_fd;     /* >= 0: when chunk shrink_at arrives, cut this file to shrink_to */
    uint32_t shrink_at;
    off_t shrink_to;
};

static void fake_on_write(struct fake *f, const struct ts_frame_hdr *h, struct ts_rd *r)
{
    char name[TS_NAME_MAX + 1];
    uint32_t idx, crc, len;
    const uint8_t *data;
    struct ts_wr w;

    ts_rd_name(r, name);
    (void)ts_rd_u32(r);
    idx = ts_rd_u32(r);
    if (idx == 0)
        f->declared = ts_rd_u64(r);
    else
        (void)ts_rd_u64(r);
    crc = ts_rd_u32(r);
    len = ts_rd_u32(r);
    data = ts_rd_bytes(r, len);
    assert_int_equal(ts_rd_done(r), 0);
    f->writes++;
    if (f->shrink_fd >= 0 && idx == f->shrink_at)
        assert_int_equal(ftruncate(f->shrink_fd, f->shrink_to), 0);
    if (idx != f->next_idx)
        f->out_of_order++;
    f->next_idx = idx + 1;
    if (ts_crc32c(0, data, len) != crc)
        f->bad_crc++;
    if (idx == f->fail_idx) {
        fake_error(f->fd, TS_OP_SHARD_WRITE, h->req_id, TS_ENOSPC, "disk full");
        return;
    }
    if (f->got_len + len > f->got_cap) {
        f->got_cap = (f->got_len + len) * 2;
        f->got = realloc(f->got, f->got_cap);
    }
    memcpy(f->got + f->got_len, data, len);
    f->got_len += len;
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, idx);
    ts_wr_u64(&w, f->got_len);
    fake_send(f->fd, TS_OP_SHARD_WRITE, h->req_id, &w, NULL, 0);
    ts_wr_fini(&w);
}

static void fake_on_seal(struct fake *f, const struct ts_frame_hdr *h, struct ts_rd *r)
{
    struct ts_shard_info si = {.state = 1};
    char name[TS_NAME_MAX + 1];
    struct ts_wr w;

    ts_rd_name(r, name);
    si.shard = ts_rd_u32(r);
    assert_int_equal(ts_rd_u8(r), 1);
    f->seal_crc = ts_rd_u32(r);
    f->nrecords = ts_rd_u32(r);
    for (uint32_t i = 0; i < f->nrecords && i < 4; i++)
        f->records[i] = ts_rd_u64(r);
    assert_int_equal(ts_rd_done(r), 0);
    f->sealed = 1;
    si.size = f->got_len;
    si.crc = f->seal_crc;
    ts_wr_init(&w);
    ts_wr_u32(&w, 0);
    ts_wr_shard_info(&w, &si);
    fake_send(f->fd, TS_OP_SHARD_SEAL, h->req_id, &w, NULL, 0);
    ts_wr_fini(&w);
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    struct ts_frame_hdr h;
    struct ts_rd r;
    uint8_t *p;

    while (fake_recv(f->fd, &h, &p) == 0) {
        char name[TS_NAME_MAX + 1];
        ts_rd_init(&r, p, h.length);
        switch (h.opcode) {
        case TS_OP_DATASET_STAT:
            fake_dataset_info(f->fd, h.req_id, "ds", f->chunk);
            break;
        case TS_OP_SHARD_WRITE:
            fake_on_write(f, &h, &r);
            break;
        case TS_OP_SHARD_SEAL:
            fake_on_seal(f, &h, &r);
            break;
        case TS_OP_READ: {
            uint64_t off;
            uint32_t len;
            ts_rd_name(&r, name);
            (void)ts_rd_u32(&r);
            off = ts_rd_u64(&r);
            len = ts_rd_u32(&r);
            if (off > f->size || (off == f->size && f->erange_at_end))
                fake_error(f->fd, TS_OP_READ, h.req_id, TS_ERANGE, "past the end");
            else
                fake_read_reply(f->fd, h.req_id, f->shard, f->size, f->chunk, off, len, HONEST);
            break;
        }
        default:
            fake_error(f->fd, h.opcode, h.req_id, TS_ENOTSUP, "not in this fake");
        }
        free(p);
    }
    return NULL;
}

static tessera_client *fake_start(struct fake *f, uint32_t chunk)
{
    tessera_client *c;

    memset(f, 0, sizeof(*f));
    f->chunk = chunk;
    f->fail_idx = UINT32_MAX;
    f->shrink_fd = -1;
    c = open_pair(&f->fd, 10000);
    assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
    return c;
}

static void fake_stop(struct fake *f, tessera_client *c)
{
    tessera_client_close(c); /* the fake sees EOF and ends */
    pthread_join(f->th, NULL);
    close(f->fd);
    free(f->got);
}

static void test_put_pipelined(void **state)
{
    const size_t len = 100 * 4096 + 123;
    const uint64_t recs[] = {0, 4096, 9000};
    uint8_t *buf = malloc(len);
    struct fake f;
    tessera_client *c = fake_start(&f, 4096);

    ts_test_fill(buf, len, 4, 0);
    assert_int_equal(tessera_put(c, "ds", 3, buf, len, recs, 3), 0);
    assert_int_equal(f.writes, 101);
    assert_int_equal(f.out_of_order, 0);
    assert_int_equal(f.bad_crc, 0);
    assert_true(f.declared == len);
    assert_int_equal(f.got_len, len);
    assert_memory_equal(f.got, buf, len);
    assert_true(f.sealed);
    assert_int_equal(f.seal_crc, ts_crc32c(0, buf, len));
    assert_int_equal(f.nrecords, 3);
    assert_true(f.records[2] == 9000);
    fake_stop(&f, c);
    free(buf);
}

static void test_put_refused_chunk(void **state)
{
    const size_t len = 64 * 4096;
    uint8_t *buf = malloc(len);
    struct ts_dataset_info d;
    struct fake f;
    tessera_client *c = fake_start(&f, 4096);

    ts_test_fill(buf, len, 5, 0);
    f.fail_idx = 5;
    assert_int_equal(tessera_put(c, "ds", 0, buf, len, NULL, 0), TS_ENOSPC);
    assert_string_equal(tessera_client_error(c), "disk full");
    assert_false(f.sealed);
    /* Every chunk in flight was collected: the connection is in step. */
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    fake_stop(&f, c);
    free(buf);
}

/* A new file dir/name holding buf[0..len), open for reading and writing at its start. */
static int file_with(const char *dir, const char *name, const void *buf, size_t len)
{
    char path[512];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write_exact(fd, buf, len), 0);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static void test_put_fd(void **state)
{
    const size_t len = 10 * 4096 + 1;
    uint8_t *buf = malloc(len);
    char *dir = ts_test_tmpdir("client");
    struct fake f;
    int fd, pfd[2];
    tessera_client *c = fake_start(&f, 4096);

    ts_test_fill(buf, len, 6, 0);
    fd = file_with(dir, "shard", buf, len);
    /* A known size. */
    assert_int_equal(tessera_put_fd(c, "ds", 1, fd, len), 0);
    assert_true(f.declared == len);
    assert_int_equal(f.got_len, len);
    assert_memory_equal(f.got, buf, len);
    assert_int_equal(f.seal_crc, ts_crc32c(0, buf, len));
    /* Fewer bytes than declared: refused locally, nothing sealed. */
    lseek(fd, 0, SEEK_SET);
    f.got_len = 0;
    f.sealed = 0;
    f.next_idx = 0;
    assert_int_equal(tessera_put_fd(c, "ds", 2, fd, len + 1), TS_EIO);
    assert_false(f.sealed);
    close(fd);
    /* A pipe, size unknown, ending on a chunk boundary. */
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(write_exact(pfd[1], buf, 8192), 0);
    close(pfd[1]);
    f.got_len = 0;
    f.next_idx = 0;
    f.writes = 0;
    assert_int_equal(tessera_put_fd(c, "ds", 3, pfd[0], TS_SIZE_UNKNOWN), 0);
    close(pfd[0]);
    assert_true(f.declared == TS_SIZE_UNKNOWN);
    assert_int_equal(f.writes, 2);
    assert_int_equal(f.got_len, 8192);
    assert_int_equal(f.seal_crc, ts_crc32c(0, buf, 8192));
    assert_int_equal(f.out_of_order, 0);
    fake_stop(&f, c);
    ts_test_rmtree(dir);
    free(buf);
}

/*
 * A file that shrinks while it is uploaded (what once killed `tessera put` with SIGBUS from a
 * mapping): the read comes up short, the upload fails with TS_EIO and nothing is sealed.
 */
static void test_put_fd_shrinking(void **state)
{
    const size_t len = 64 * 4096;
    uint8_t *buf = malloc(len);
    char *dir = ts_test_tmpdir("client");
    struct ts_dataset_info d;
    struct fake f;
    int fd;
    tessera_client *c = fake_start(&f, 4096);

    ts_test_fill(buf, len, 8, 0);
    fd = file_with(dir, "shrinking", buf, len);
    /* Cut to a chunk and a bit when chunk 2 arrives: the client has read 3 chunks by then. */
    f.shrink_fd = fd;
    f.shrink_at = 2;
    f.shrink_to = 4096 + 100;
    assert_int_equal(tessera_put_fd(c, "ds", 1, fd, len), TS_EIO);
    assert_non_null(strstr(tessera_client_error(c), "the input ended after"));
    assert_false(f.sealed);
    assert_true(f.declared == len);
    assert_true(f.got_len < len);
    /* Every chunk in flight was collected: the connection is in step. */
    assert_int_equal(tessera_dataset_stat(c, "ds", &d), 0);
    close(fd);
    fake_stop(&f, c);
    ts_test_rmtree(dir);
    free(buf);
}

/* ---- the CLI's output file ------------------------------------------------------------------- */

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

    assert_true(fd >= 0);
    assert_int_equal(write_exact(fd, text, strlen(text)), 0);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

static void assert_file(const char *path, const char *text)
{
    char buf[256] = {0};
    int fd = open(path, O_RDONLY);
    ssize_t n;

    assert_true(fd >= 0);
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    assert_true(n >= 0);
    assert_string_equal(buf, text);
}

/* Files in dir other than . and .. */
static int count_files(const char *dir)
{
    struct dirent *e;
    DIR *d = opendir(dir);
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void test_cli_out(void **state)
{
    char *dir = ts_test_tmpdir("cliout"), file[512], link[512], err[256];
    struct cli_out o;
    struct stat st;

    snprintf(file, sizeof(file), "%s/shard.bin", dir);
    /* A new file appears only on commit. */
    assert_int_equal(cli_out_open(&o, file, err, sizeof(err)), 0);
    assert_non_null(o.tmp);
    assert_non_null(strstr(o.tmp, "shard.bin.tmp."));
    assert_int_equal(write_exact(o.fd, "new", 3), 0);
    assert_int_equal(access(file, F_OK), -1);
    assert_int_equal(cli_out_commit(&o, err, sizeof(err)), 0);
    assert_file(file, "new");
    assert_int_equal(count_files(dir), 1);
    /* A failure leaves an existing file as it was, and no temporary. */
    write_file(file, "precious", 0640);
    assert_int_equal(cli_out_open(&o, file, err, sizeof(err)), 0);
    assert_int_equal(write_exact(o.fd, "half", 4), 0);
    cli_out_abort(&o);
    cli_out_abort(&o); /* idempotent */
    assert_file(file, "precious");
    assert_int_equal(count_files(dir), 1);
    /* Success replaces it, keeping its permissions. */
    assert_int_equal(cli_out_open(&o, file, err, sizeof(err)), 0);
    assert_int_equal(write_exact(o.fd, "replaced", 8), 0);
    assert_int_equal(cli_out_commit(&o, err, sizeof(err)), 0);
    assert_file(file, "replaced");
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    assert_int_equal(count_files(dir), 1);
    /* Through a symbolic link: the target is replaced, the link stays a link. */
    snprintf(link, sizeof(link), "%s/link", dir);
    assert_int_equal(symlink("shard.bin", link), 0);
    assert_int_equal(cli_out_open(&o, link, err, sizeof(err)), 0);
    assert_int_equal(write_exact(o.fd, "via link", 8), 0);
    assert_int_equal(cli_out_commit(&o, err, sizeof(err)), 0);
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_file(file, "via link");
    assert_int_equal(count_files(dir), 2);
    /* Not a regular file: written in place, never removed. */
    assert_int_equal(cli_out_open(&o, "/dev/null", err, sizeof(err)), 0);
    assert_null(o.tmp);
    assert_int_equal(write_exact(o.fd, "x", 1), 0);
    cli_out_abort(&o);
    assert_int_equal(stat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    /* A directory that does not exist: the reason names the temporary. */
    snprintf(file, sizeof(file), "%s/nodir/f", dir);
    assert_int_equal(cli_out_open(&o, file, err, sizeof(err)), TS_EIO);
    assert_non_null(strstr(err, "cannot create"));
    assert_int_equal(o.fd, -1);
    ts_test_rmtree(dir);
}

/* A range larger than one request: split, pipelined, reassembled in place. */
static void test_read_split(void **state)
{
    const size_t size = TESSERA_MAX_READ + (3u << 20) + 5;
    uint8_t *shard = malloc(size), *buf = malloc(size + 100);
    size_t n = 0;
    struct fake f;
    tessera_client *c = fake_start(&f, 1u << 20);

    ts_test_fill(shard, size, 7, 0);
    f.shard = shard;
    f.size = size;
    assert_int_equal(tessera_read(c, "ds", 0, 0, size + 100, buf, &n), 0);
    assert_int_equal(n, size);
    assert_memory_equal(buf, shard, size);
    /* Starting inside, ending past the end. */
    assert_int_equal(tessera_read(c, "ds", 0, 1000, size, buf, &n), 0);
    assert_int_equal(n, size - 1000);
    assert_memory_equal(buf, shard + 1000, size - 1000);
    /* The shard ends exactly where a piece begins: no bytes, or TS_ERANGE, for that piece. */
    f.size = TESSERA_MAX_READ;
    assert_int_equal(tessera_read(c, "ds", 0, 0, TESSERA_MAX_READ + 10, buf, &n), 0);
    assert_int_equal(n, TESSERA_MAX_READ);
    f.erange_at_end = 1;
    assert_int_equal(tessera_read(c, "ds", 0, 0, TESSERA_MAX_READ + 10, buf, &n), 0);
    assert_int_equal(n, TESSERA_MAX_READ);
    assert_string_equal(tessera_client_error(c), "");
    assert_memory_equal(buf, shard, TESSERA_MAX_READ);
    fake_stop(&f, c);
    free(shard);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_uint),
        cmocka_unit_test(test_human_size),
        cmocka_unit_test(test_cli_next),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_addr_parse),
        cmocka_unit_test(test_addr_parse_why),
        cmocka_unit_test(test_cert_needs_ca),
        cmocka_unit_test(test_tls_port_hint),
        cmocka_unit_test(test_rdma_unreachable),
        cmocka_unit_test(test_reply_status),
        cmocka_unit_test(test_hello_decode),
        cmocka_unit_test(test_read_head_decode),
        cmocka_unit_test(test_read_pieces),
        cmocka_unit_test(test_stat_and_refusal),
        cmocka_unit_test(test_read_verified),
        cmocka_unit_test(test_read_lying_server),
        cmocka_unit_test(test_submit_out_of_order),
        cmocka_unit_test(test_batched_wait_wakes_for_a_refusal),
        cmocka_unit_test(test_read_one_receive),
        cmocka_unit_test(test_read_mixed_frames),
        cmocka_unit_test(test_timeout_breaks_connection),
        cmocka_unit_test(test_server_closes),
        cmocka_unit_test(test_connection_error_reply),
        cmocka_unit_test(test_framing_violations),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_put_pipelined),
        cmocka_unit_test(test_put_refused_chunk),
        cmocka_unit_test(test_put_fd),
        cmocka_unit_test(test_put_fd_shrinking),
        cmocka_unit_test(test_cli_out),
        cmocka_unit_test(test_read_split),
    };

    signal(SIGPIPE, SIG_IGN); /* the fake server writes to clients that have given up */
    ts_test_log_init();
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
