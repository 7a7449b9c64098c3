/* Small shared helpers: CRC32C through ISA-L, names, clocks. */
#include "ts_common.h"

#include <isa-l/crc.h>
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
