/*
 * Free space (docs/operations.md "Disk full"): RocksDB must never reach the edge of its
 * filesystem — Debian's build asserts on some failed writes, and a flush or a recovery needs
 * room for what the WAL holds. So:
 *   - the memtables and the WAL are sized for the filesystem (an eighth of it at most), so a
 *     flush, and a restart's replay of the WAL, fit in what admission keeps free;
 *   - every chunk write is admitted only if, after it, the filesystem keeps the reserve
 *     (storage.reserve_mb; default 2 % of the filesystem, 8 MiB to 1 GiB) plus room to flush
 *     every memtable (this write included); otherwise TS_ENOSPC, nothing written.
 * Free space is read with statvfs at most every 20 ms; writes admitted since are subtracted.
 */
#include "store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define FAC "storage"
#define MIB (1ull << 20)
#define RECHECK_NS (20ull * 1000000)

static int fs_stat(const char *path, uint64_t *total, uint64_t *avail)
{
    struct statvfs v;

    if (statvfs(path, &v) != 0)
        return ts_from_errno(errno);
    *total = (uint64_t)v.f_blocks * v.f_frsize;
    *avail = (uint64_t)v.f_bavail * v.f_frsize;
    return 0;
}

void ts_space_plan(ts_store *s, uint64_t *write_buffer, uint64_t *max_wal)
{
    uint64_t total = 0, avail = 0;

    (void)mkdir(s->path, 0755); /* RocksDB would create it; statvfs needs it now */
    *write_buffer = 128 * MIB;
    *max_wal = 512 * MIB;
    s->space_reserve = s->o.reserve_bytes;
    if (fs_stat(s->path, &total, &avail) != 0 || total == 0) {
        if (s->space_reserve == UINT64_MAX)
            s->space_reserve = 64 * MIB;
        return;
    }
    if (*write_buffer > total / 8)
        *write_buffer = TS_MAX(total / 8, 1 * MIB);
    if (s->o.write_buffer_bytes)
        *write_buffer = s->o.write_buffer_bytes;
    if (*max_wal > total / 8)
        *max_wal = TS_MAX(total / 8, 1 * MIB);
    if (s->space_reserve == UINT64_MAX)
        s->space_reserve = TS_MIN(TS_MAX(total / 50, 8 * MIB), 1024 * MIB);
    s->space_total = total;
    TS_INFO(FAC, "filesystem of %s: %llu MiB, %llu MiB free; reserve %llu MiB, memtables %llu MiB",
            s->path, (unsigned long long)(total / MIB), (unsigned long long)(avail / MIB),
            (unsigned long long)(s->space_reserve / MIB),
            (unsigned long long)(*write_buffer / MIB));
}

/* Bytes in memtables (to be flushed: each needs as much free space once more). */
static uint64_t memtable_bytes(ts_store *s)
{
    uint64_t sum = 0, v;

    for (int i = 0; i < CF_COUNT; i++)
        if (s->cf[i] &&
            rocksdb_property_int_cf(s->db, s->cf[i], "rocksdb.cur-size-all-mem-tables", &v) == 0)
            sum += v;
    return sum;
}

int ts_space_admit(ts_store *s, uint64_t len, char *why, size_t cap)
{
    uint64_t now = ts_now_mono_ns(), total = 0, avail = 0, need;
    int rc = 0;

    pthread_mutex_lock(&s->space_lock);
    if (!s->space_checked_ns || now - s->space_checked_ns > RECHECK_NS ||
        s->space_avail < s->space_admitted + len + s->space_reserve) {
        if (fs_stat(s->path, &total, &avail) == 0) {
            s->space_avail = avail;
            s->space_admitted = 0;
            s->space_checked_ns = now;
        }
    }
    /* This write goes to the WAL now and into a flushed file later; so does what the
     * memtables hold already. */
    need = s->space_reserve + 2 * len + memtable_bytes(s) + s->space_admitted;
    if (s->space_avail < need) {
        rc = TS_ENOSPC;
        if (why)
            snprintf(why, cap,
                     "no space left for %llu bytes: %llu MiB free on the filesystem of %s, which "
                     "keeps %llu MiB in reserve (storage.reserve_mb) and room to flush %llu MiB "
                     "of memtables",
                     (unsigned long long)len, (unsigned long long)(s->space_avail / MIB), s->path,
                     (unsigned long long)(s->space_reserve / MIB),
                     (unsigned long long)(memtable_bytes(s) / MIB));
        if (now - s->space_warned_ns > 10ull * 1000000000) {
            s->space_warned_ns = now;
            TS_WARN(FAC, TS_ENOSPC, "refusing writes: %llu MiB free on %s, reserve %llu MiB",
                    (unsigned long long)(s->space_avail / MIB), s->path,
                    (unsigned long long)(s->space_reserve / MIB));
        }
    } else {
        s->space_admitted += len;
    }
    pthread_mutex_unlock(&s->space_lock);
    return rc;
}

void ts_store_space(ts_store *s, struct ts_store_space *out)
{
    uint64_t total = 0, avail = 0;

    memset(out, 0, sizeof(*out));
    if (fs_stat(s->path, &total, &avail) == 0) {
        out->total = total;
        out->avail = avail;
    }
    out->reserve = s->space_reserve;
    out->memtables = memtable_bytes(s);
    pthread_mutex_lock(&s->space_lock);
    /* Before the first write was admitted nothing was measured yet: what statfs says now. */
    out->full = (s->space_checked_ns ? s->space_avail : avail) < s->space_reserve + out->memtables;
    pthread_mutex_unlock(&s->space_lock);
}
