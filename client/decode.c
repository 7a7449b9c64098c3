/*
 * Pure decoders for the client: addresses, reply status, HELLO and READ reply heads.
 * Each looks at nothing but its arguments (style rule 8), so the unit tests can feed them
 * hand-built bytes, including those of a server that lies.
 */
#include "client_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int all_digits(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int copy_part(char *out, size_t cap, const char *s, size_t n)
{
    if (n == 0 || n >= cap)
        return TS_EINVAL;
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

/* Formats why an address is refused into why[cap] (when given); TS_EINVAL. */
static int addr_bad(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int addr_bad(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (why && cap) {
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return TS_EINVAL;
}

int ts_addr_parse_why(const char *s, struct ts_addr *a, char *why, size_t cap)
{
    const char *host, *port = NULL, *sep, *end;
    size_t hlen;
    unsigned long pnum;

    memset(a, 0, sizeof(*a));
    if (why && cap)
        why[0] = '\0';
    if (!s || !*s)
        s = TS_DEFAULT_ADDRESS;
    sep = strstr(s, "://");
    if (sep) {
        if ((size_t)(sep - s) == 3 && strncmp(s, "tcp", 3) == 0)
            a->ops = NULL;
        else if ((size_t)(sep - s) == 4 && strncmp(s, "rdma", 4) == 0)
            a->ops = &ts_transport_rdma;
        else
            return addr_bad(why, cap, "unknown scheme '%.*s://' (tcp:// or rdma://)",
                            (int)TS_MIN((size_t)(sep - s), (size_t)32), s);
        s = sep + 3;
    }
    if (*s == '[') { /* [v6]:port or [v6] */
        end = strchr(s, ']');
        if (!end)
            return addr_bad(why, cap, "no ']' after the IPv6 address");
        host = s + 1;
        hlen = (size_t)(end - host);
        if (end[1] == ':')
            port = end + 2;
        else if (end[1] != '\0')
            return addr_bad(why, cap, "want ':PORT' or nothing after ']'");
    } else {
        host = s;
        sep = strchr(s, ':');
        if (sep && strchr(sep + 1, ':'))
            return addr_bad(why, cap,
                            "more than one ':' (want HOST:PORT, [IPv6]:PORT or HOST; an IPv6 "
                            "address goes in brackets, e.g. [::1]:7070)");
        hlen = sep ? (size_t)(sep - s) : strlen(s);
        port = sep ? sep + 1 : NULL;
    }
    if (hlen == 0)
        return addr_bad(why, cap, "no host");
    if (copy_part(a->host, sizeof(a->host), host, hlen))
        return addr_bad(why, cap, "the host is longer than %zu bytes", sizeof(a->host) - 1);
    if (!port)
        port = TS_DEFAULT_PORT;
    pnum = all_digits(port, strlen(port)) && strlen(port) <= 5 ? strtoul(port, NULL, 10) : 0;
    if (pnum == 0 || pnum > 65535)
        return addr_bad(why, cap, "port '%s' is not a number from 1 to 65535", port);
    return copy_part(a->port, sizeof(a->port), port, strlen(port));
}

int ts_addr_parse(const char *s, struct ts_addr *a)
{
    return ts_addr_parse_why(s, a, NULL, 0);
}

int ts_reply_status(struct ts_rd *r, char *msg, size_t cap)
{
    int32_t status = (int32_t)ts_rd_u32(r);
    const uint8_t *p;
    uint16_t n;
    size_t k;

    if (msg && cap)
        msg[0] = '\0';
    if (r->err)
        return TS_EPROTO;
    if (status == 0)
        return 0;
    if (status > 0)
        return TS_EPROTO;
    /* The message is for humans: a missing one does not hide the status. */
    n = ts_rd_u16(r);
    p = ts_rd_bytes(r, n);
    if (p && msg && cap) {
        k = TS_MIN((size_t)n, cap - 1);
        for (size_t i = 0; i < k; i++) /* a terminal gets no control characters from a server */
            msg[i] = (p[i] < 0x20 || p[i] == 0x7f) ? '?' : (char)p[i];
        msg[k] = '\0';
    }
    return status;
}

int ts_hello_decode(struct ts_rd *r, struct ts_hello_reply *h)
{
    memset(h, 0, sizeof(*h));
    h->version = ts_rd_u16(r);
    ts_rd_str(r, h->node, sizeof(h->node));
    h->role = ts_rd_u8(r);
    h->max_frame = ts_rd_u32(r);
    h->epoch = ts_rd_u64(r);
    return r->err ? TS_EPROTO : 0;
}

int ts_read_head_decode(const uint8_t head[TS_READ_HEAD_LEN], size_t payload_len, uint64_t off,
                        size_t len, struct ts_read_head *out)
{
    uint64_t table, expect;

    memset(out, 0, sizeof(*out));
    if (payload_len < TS_READ_HEAD_LEN || ts_get_le32(head) != 0)
        return TS_EPROTO;
    out->shard_size = ts_get_le64(head + 4);
    out->npieces = ts_get_le32(head + 12);
    table = (uint64_t)out->npieces * 8;
    if (table > payload_len - TS_READ_HEAD_LEN)
        return TS_EPROTO;
    out->data_len = payload_len - TS_READ_HEAD_LEN - (size_t)table;
    /* Never more than was asked for: the data lands in a buffer of len bytes. */
    if (out->data_len > len)
        return TS_EPROTO;
    expect = off >= out->shard_size ? 0 : TS_MIN((uint64_t)len, out->shard_size - off);
    if (out->data_len != expect)
        return TS_EPROTO;
    return 0;
}

int ts_read_head_decode_placed(const uint8_t head[TS_READ_HEAD_LEN], size_t payload_len,
                               uint64_t off, size_t len, struct ts_read_head *out)
{
    memset(out, 0, sizeof(*out));
    if (payload_len < TS_READ_HEAD_LEN || ts_get_le32(head) != 0)
        return TS_EPROTO;
    out->shard_size = ts_get_le64(head + 4);
    out->npieces = ts_get_le32(head + 12);
    if ((uint64_t)out->npieces * 8 != payload_len - TS_READ_HEAD_LEN)
        return TS_EPROTO;
    out->data_len =
        off >= out->shard_size ? 0 : (size_t)TS_MIN((uint64_t)len, out->shard_size - off);
    return 0;
}

int ts_read_pieces_check(const uint8_t *table, uint32_t n, size_t data_len)
{
    uint64_t sum = 0;

    for (uint32_t i = 0; i < n; i++)
        sum += ts_get_le32(table + (size_t)i * 8);
    return sum == data_len ? 0 : TS_EPROTO;
}

int ts_read_pieces_verify(const uint8_t *table, uint32_t n, const uint8_t *data, size_t have,
                          uint32_t *done, size_t *doff)
{
    while (*done < n) {
        const uint8_t *e = table + (size_t)*done * 8;
        uint32_t plen = ts_get_le32(e);

        if (have - *doff < plen)
            break;
        if (ts_crc32c(0, data + *doff, plen) != ts_get_le32(e + 4))
            return TS_ECORRUPT;
        *doff += plen;
        (*done)++;
    }
    return 0;
}
