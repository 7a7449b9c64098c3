/* Small shared helpers: CRC32C through ISA-L, names, clocks. */
#include "ts_common.h"

#include <isa-l/crc.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <limits.h>
#include <time.h>

uint32_t ts_crc32c(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    unsigned int state = ~crc;

    /* ISA-L takes an int length; feed huge buffers in slices. */
    while (len > 0) {
        int n = len > (size_t)INT_MAX ? (INT_MAX & ~63) : (int)len;
        state = crc32_iscsi((unsigned char *)p, n, state);
        p += n;
        len -= (size_t)n;
    }
    return ~state;
}

int ts_frag_name(char out[TS_NAME_MAX + 1], const char *base, unsigned f)
{
    int n;

    out[0] = '\0';
    if (!ts_name_valid(base) || f >= TS_FRAG_MAX)
        return TS_ENAME;
    n = snprintf(out, TS_NAME_MAX + 1, "%s#%u", base, f);
    if (n < 0 || n > TS_NAME_MAX) {
        out[0] = '\0';
        return TS_ENAME;
    }
    return 0;
}

int ts_frag_split(const char *name, char base[TS_NAME_MAX + 1], unsigned *f)
{
    const char *hash = name ? strchr(name, '#') : NULL;
    char b[TS_NAME_MAX + 1];
    unsigned v = 0;
    size_t n;

    if (!hash || hash == name || (size_t)(hash - name) > TS_NAME_MAX || !hash[1] ||
        (hash[1] == '0' && hash[2]) || strlen(name) > TS_NAME_MAX)
        return 0;
    for (const char *p = hash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || p - hash > 2)
            return 0;
        v = v * 10 + (unsigned)(*p - '0');
    }
    n = (size_t)(hash - name);
    memcpy(b, name, n);
    b[n] = '\0';
    if (v >= TS_FRAG_MAX || !ts_name_valid(b))
        return 0;
    if (base)
        memcpy(base, b, n + 1);
    if (f)
        *f = v;
    return 1;
}

int ts_name_valid_store(const char *name)
{
    return ts_name_valid(name) || ts_frag_split(name, NULL, NULL);
}

const char *ts_record_format_name(int fmt)
{
    static const char *const names[] = {"none", "tfrecord", "tar", "jsonl", "len32", "len64"};

    return fmt >= 0 && fmt <= TS_RECORD_FORMAT_MAX ? names[fmt] : "?";
}

int ts_name_valid(const char *name)
{
    size_t n;

    if (!name || !name[0] || name[0] == '.')
        return 0;
    for (n = 0; name[n]; n++) {
        char c = name[n];
        if (n >= TS_NAME_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ts_now_mono_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

uint64_t ts_now_wall_ns(void)
{
    return clock_ns(CLOCK_REALTIME);
}

/* "HOST:PORT" or "[V6]:PORT" (port 0: any free port) -> socket address. */
int ts_listen_addr_parse(const char *addr, struct sockaddr_storage *ss, int *sslen)
{
    char host[256];
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hl;
    struct addrinfo hints, *res = NULL;

    if (!colon || !colon[1])
        return TS_ECONFIG;
    hl = (size_t)(colon - addr);
    if (addr[0] == '[' && hl >= 2 && addr[hl - 1] == ']') {
        h = addr + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host))
        return TS_ECONFIG;
    memcpy(host, h, hl);
    host[hl] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 0 || port > 65535)
            return TS_ECONFIG;
    }
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
        return TS_ECONFIG;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = (int)res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}
