/* Store test helpers (store_util.h): shards of derived bytes, damage behind the store's back. */
#include "store_util.h"

#include <dirent.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <string.h>

#include "ts_common.h"
#include "ts_test.h"

#include <stdlib.h>

/* Flips byte `at` of the value of key k in column family cfi (1 meta, 2 chunks) of the
 * (closed) store at path, behind the store's back. */
void ts_test_flip_value(const char *path, int cfi, const uint8_t *k, size_t klen, size_t at)
{
    const char *names[] = {"default", "meta", "chunks", "oplog"};
    rocksdb_options_t *o = rocksdb_options_create();
    const rocksdb_options_t *opts[4] = {o, o, o, o};
    rocksdb_column_family_handle_t *cf[4];
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    char *err = NULL, *v;
    size_t vlen;
    rocksdb_t *db;

    rocksdb_options_set_enable_blob_files(o, 1);
    db = rocksdb_open_column_families(o, path, 4, names, opts, cf, &err);
    assert_null(err);
    v = rocksdb_get_cf(db, ro, cf[cfi], (const char *)k, klen, &vlen, &err);
    assert_null(err);
    assert_non_null(v);
    assert_true(at < vlen);
    v[at] ^= 0x40;
    rocksdb_put_cf(db, wo, cf[cfi], (const char *)k, klen, v, vlen, &err);
    assert_null(err);
    rocksdb_free(v);
    for (int i = 0; i < 4; i++)
        rocksdb_column_family_handle_destroy(cf[i]);
    rocksdb_close(db);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_options_destroy(o);
}

/* The path of dataset dsid's shard's chunk file in the store at dir into out: 0, or -1 when
 * the shard has none (its chunks are in RocksDB). */
int ts_test_chunk_file(const char *dir, uint64_t dsid, uint32_t shard, char *out, size_t cap)
{
    char d[1100], prefix[16];
    struct dirent *e;
    DIR *dp;
    int rc = -1;

    snprintf(d, sizeof(d), "%s/chunks/%016llx", dir, (unsigned long long)dsid);
    snprintf(prefix, sizeof(prefix), "%08x.", shard);
    dp = opendir(d);
    while (dp && (e = readdir(dp)) != NULL)
        if (!strncmp(e->d_name, prefix, 9)) {
            snprintf(out, cap, "%s/%s", d, e->d_name);
            rc = 0;
        }
    if (dp)
        closedir(dp);
    return rc;
}

/* Writes shard `shard` of ds: len bytes of ts_test_fill(seed), in chunks of `chunk`, sealed. */
void ts_test_put_shard(ts_store *s, const char *ds, uint32_t shard, size_t len, uint32_t chunk,
                       uint64_t seed)
{
    ts_shard_writer *w;
    uint8_t *buf = malloc(chunk);
    uint32_t idx = 0, crc = 0;

    assert_int_equal(ts_store_shard_begin(s, ds, shard, len, &w), 0);
    for (size_t off = 0; off < len; off += chunk, idx++) {
        size_t n = TS_MIN((size_t)chunk, len - off);
        ts_test_fill(buf, n, seed, off);
        crc = ts_crc32c(crc, buf, n);
        assert_int_equal(ts_shard_writer_put(w, idx, buf, n, ts_crc32c(0, buf, n)), 0);
    }
    assert_int_equal(ts_shard_writer_seal(w, 1, crc, NULL, 0), 0);
    free(buf);
}
