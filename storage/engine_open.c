/*
 * Opening the RocksDB engine, and what a damaged write-ahead log means.
 *
 * The engine is opened first in kTolerateCorruptedTailRecords mode: a torn last record (a crash
 * mid-write; never an acknowledged write with sync always) is dropped quietly. Damage anywhere
 * else makes that open fail with Corruption: the node then reopens in point-in-time mode, which
 * keeps everything before the damage and drops the rest, says so loudly, and records the time
 * (meta key 'W') so STATUS reports it across restarts. Writes after the damage are gone from
 * this node; in a cluster, its PGs serve nothing until their primaries have compared logs and
 * pushed what it lacks (the restart rule), which brings them back.
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

static const uint8_t wal_key[1] = {'W'};

static rocksdb_t *open_mode(ts_store *s, int mode, char **err)
{
    rocksdb_options_set_wal_recovery_mode(s->opts, mode);
    return rocksdb_open_column_families(s->opts, s->path, CF_COUNT, ts_store_cf_names,
                                        (const rocksdb_options_t *const *)s->cf_opts, s->cf, err);
}

/* Whether a RocksDB error text is a Corruption status (its message starts with it). */
static int is_corruption(const char *err)
{
    return err && !strncmp(err, "Corruption", 10);
}

int engine_open(ts_store *s)
{
    char *err = NULL, *v = NULL;
    size_t vlen = 0;
    uint8_t now[8];

    s->db = open_mode(s, rocksdb_tolerate_corrupted_tail_records_recovery, &err);
    if (!s->db && is_corruption(err)) {
        TS_ERROR(FAC, TS_ECORRUPT,
                 "%s: the write-ahead log is damaged before its end (%s): reopening at the last "
                 "consistent point; writes logged after the damage are LOST on this node (in a "
                 "cluster it serves none of its PGs until their primaries have pushed them back)",
                 s->path, err);
        free(err);
        err = NULL;
        s->db = open_mode(s, rocksdb_point_in_time_recovery, &err);
        if (s->db) {
            rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
            s->wal_damage_ns = ts_now_wall_ns();
            ts_put_le64(now, s->wal_damage_ns);
            rocksdb_writeoptions_set_sync(wo, 1);
            rocksdb_put_cf(s->db, wo, s->cf[CF_META], (const char *)wal_key, sizeof(wal_key),
                           (const char *)now, sizeof(now), &err);
            rocksdb_writeoptions_destroy(wo);
            if (err)
                return from_rocksdb(err, "recording the WAL damage");
        }
    }
    if (!s->db)
        return from_rocksdb(err, "open");
    if (!s->wal_damage_ns && meta_get(s, wal_key, sizeof(wal_key), &v, &vlen) == 0) {
        if (vlen == 8)
            s->wal_damage_ns = ts_get_le64((const uint8_t *)v);
        rocksdb_free(v);
    }
    return 0;
}

uint64_t ts_store_wal_damage_ns(ts_store *s)
{
    return s->wal_damage_ns;
}
