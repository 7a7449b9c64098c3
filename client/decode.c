/*
 * Pure decoders for the client: addresses, reply status, HELLO and READ reply heads.
 * Each looks at nothing but its arguments (style rule 8), so the unit tests can feed them
 * hand-built bytes, including those of a server that lies.
 */
#include "client_internal.h"

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

int ts_addr_parse(const char *s, struct ts_addr *a)
{
    const char *host, *port = NULL, *sep, *end;
    size_t hlen;
    unsigned long pnum;

    memset(a, 0, sizeof(*a));
    if (!s || !*s)
        s = TS_DEFAULT_ADDRESS;
    sep = strstr(s, "://");
    if (sep) {
        if ((size_t)(sep - s) == 3 && strncmp(s, "tcp", 3) == 0)
            a->ops = NULL;
        else if ((size_t)(sep - s) == 4 && strncmp(s, "rdma", 4) == 0)
            a->ops = &ts_transport_rdma;
        else
            return TS_EINVAL;
        s = sep + 3;
    }
    if (*s == '[') { /* [v6]:port or [v6] */
        end = strchr(s, ']');
        if (!end)
            return TS_EINVAL;
        host = s + 1;
        hlen = (size_t)(end - host);
        if (end[1] == ':')
            port = end + 2;
        else if (end[1] != '\0')
            return TS_EINVAL;
    } else {
        host = s;
        sep = strrchr(s, ':');
        if (sep && strchr(s, ':') == sep) { /* exactly one colon: host:port */
            hlen = (size_t)(sep - s);
            port = sep + 1;
        } else { /* no colon, or a bare IPv6 literal */
            hlen = strlen(s);
        }
    }
    if (copy_part(a->host, sizeof(a->host), host, hlen))
        return TS_EINVAL;
    if (!port)
        port = TS_DEFAULT_PORT;
    if (!all_digits(port, strlen(port)) || strlen(port) > 5)
        return TS_EINVAL;
    pnum = strtoul(port, NULL, 10);
    if (pnum == 0 || pnum > 65535)
        return TS_EINVAL;
    return copy_part(a->port, sizeof(a->port), port, strlen(port));
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
