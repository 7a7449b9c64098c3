/*
 * Test tool: flips one byte of a stored chunk directly in a (stopped) node's chunk file, or in
 * its RocksDB for a shard without one, bypassing the store, to simulate on-disk corruption; or
 * drops a shard's record, as a store that lost data behind its log's back would (its PG log still
 * has the shard).
 *
 *   corrupt_chunk DATA_DIR DATASET SHARD CHUNK [BYTE_OFFSET]
 *   corrupt_chunk DATA_DIR DATASET SHARD drop
 *
 * A DATASET ending in '*' names the last dataset, in name order, whose name starts with the rest
 * (the newest of a drill's, drill-SCENARIO-TIME); SHARD may be FIRST-LAST (each one's record).
 */
#include <fcntl.h>
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t get_le32(const char *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* The last dataset record (meta "D" + name), in name order, whose name starts with prefix
 * (len bytes): its name into out; 0, or -1 when there is none. */
static int newest_dataset(rocksdb_t *db, rocksdb_column_family_handle_t *meta,
                          rocksdb_readoptions_t *ro, const char *prefix, size_t len, char *out,
                          size_t cap)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(db, ro, meta);
    char seek[200];
    int found = -1;

    snprintf(seek, sizeof(seek), "D%.*s", (int)len, prefix);
    for (rocksdb_iter_seek(it, seek, strlen(seek)); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const char *k = rocksdb_iter_key(it, &klen);
        if (klen < strlen(seek) || memcmp(k, seek, strlen(seek)) != 0 || klen - 1 >= cap)
            break;
        snprintf(out, cap, "%.*s", (int)(klen - 1), k + 1);
        found = 0;
    }
    rocksdb_iter_destroy(it);
    return found;
}

/* Drops the records of shards first..last of dataset id (those it has); how many it dropped, or
 * -1 on an error. */
static long drop(rocksdb_t *db, rocksdb_column_family_handle_t *meta, rocksdb_readoptions_t *ro,
                 rocksdb_writeoptions_t *wo, uint64_t id, unsigned long first, unsigned long last)
{
    long dropped = 0;

    for (unsigned long s = first; s <= last; s++) {
        uint8_t sk[13] = {'S'};
        char *err = NULL, *v;
        size_t vlen;
        put_be(sk + 1, id, 8);
        put_be(sk + 9, s, 4);
        v = rocksdb_get_cf(db, ro, meta, (const char *)sk, sizeof(sk), &vlen, &err);
        if (!err && !v)
            continue; /* not held here */
        rocksdb_free(v);
        if (!err)
            rocksdb_delete_cf(db, wo, meta, (const char *)sk, sizeof(sk), &err);
        if (err) {
            fprintf(stderr, "corrupt_chunk: shard %lu: %s\n", s, err);
            return -1;
        }
        printf("dropped the record of shard %lu\n", s);
        dropped++;
    }
    return dropped;
}

int main(int argc, char **argv)
{
    const char *names[] = {"default", "meta", "chunks", "oplog"};
    rocksdb_column_family_handle_t *cf[4];
    rocksdb_options_t *o;
    rocksdb_readoptions_t *ro;
    rocksdb_writeoptions_t *wo;
    const rocksdb_options_t *opts[4];
    char *err = NULL, *v, ds[200], dkey[sizeof(ds) + 1];
    size_t vlen, at;
    uint8_t key[16];
    uint64_t id = 0;
    rocksdb_t *db;

    if (argc < 5) {
        fprintf(stderr, "usage: corrupt_chunk DATA_DIR DATASET SHARD CHUNK [BYTE_OFFSET]\n");
        return 2;
    }
    at = argc > 5 ? strtoul(argv[5], NULL, 0) : 100;
    o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    for (int i = 0; i < 4; i++)
        opts[i] = o;
    db = rocksdb_open_column_families(o, argv[1], 4, names, opts, cf, &err);
    if (err) {
        fprintf(stderr, "corrupt_chunk: open %s: %s\n", argv[1], err);
        return 1;
    }
    ro = rocksdb_readoptions_create();
    wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(wo, 1);
    snprintf(ds, sizeof(ds), "%s", argv[2]);
    if (ds[0] && ds[strlen(ds) - 1] == '*' &&
        newest_dataset(db, cf[1], ro, argv[2], strlen(ds) - 1, ds, sizeof(ds)) != 0) {
        fprintf(stderr, "corrupt_chunk: no dataset %s\n", argv[2]);
        return 1;
    }
    snprintf(dkey, sizeof(dkey), "D%s", ds);
    v = rocksdb_get_cf(db, ro, cf[1], dkey, strlen(dkey), &vlen, &err);
    if (err || !v || vlen < 24) {
        fprintf(stderr, "corrupt_chunk: no dataset %s\n", ds);
        return 1;
    }
    for (int i = 7; i >= 0; i--) /* dataset record: little-endian id at offset 16 */
        id = (id << 8) | (uint8_t)v[16 + i];
    rocksdb_free(v);
    if (!strcmp(argv[4], "drop")) {
        char *dash;
        unsigned long first = strtoul(argv[3], &dash, 0);
        long n =
            drop(db, cf[1], ro, wo, id, first, *dash == '-' ? strtoul(dash + 1, NULL, 0) : first);
        if (n <= 0) {
            fprintf(stderr, "corrupt_chunk: %s holds no record of shard %s\n", ds, argv[3]);
            return 1;
        }
        printf("dropped %ld shard records of %s\n", n, ds);
        goto out;
    }
    {
        /* A shard with a chunk file (storage/chunkfile.c): its record names the file (bytes
         * 36..39) and gives the chunk size (bytes 4..7); chunk i is at i * chunk_size. */
        uint8_t sk[13] = {'S'};
        put_be(sk + 1, id, 8);
        put_be(sk + 9, strtoul(argv[3], NULL, 0), 4);
        v = rocksdb_get_cf(db, ro, cf[1], (const char *)sk, sizeof(sk), &vlen, &err);
        if (!err && v && vlen >= 40 && get_le32(v + 36)) {
            char path[1400];
            uint64_t pos = (uint64_t)strtoul(argv[4], NULL, 0) * get_le32(v + 4) + at;
            int fd;
            uint8_t b;
            snprintf(path, sizeof(path), "%s/chunks/%016llx/%08lx.%08x", argv[1],
                     (unsigned long long)id, strtoul(argv[3], NULL, 0), get_le32(v + 36));
            rocksdb_free(v);
            fd = open(path, O_RDWR);
            if (fd < 0 || pread(fd, &b, 1, (off_t)pos) != 1) {
                fprintf(stderr, "corrupt_chunk: no chunk %s/%s/%s in %s\n", argv[2], argv[3],
                        argv[4], path);
                return 1;
            }
            b ^= 0x5a;
            if (pwrite(fd, &b, 1, (off_t)pos) != 1 || fsync(fd) != 0) {
                fprintf(stderr, "corrupt_chunk: %s: write failed\n", path);
                return 1;
            }
            close(fd);
            printf("flipped byte %zu of chunk %s of %s/%s (chunk file)\n", at, argv[4], argv[2],
                   argv[3]);
            goto out;
        }
        if (v)
            rocksdb_free(v);
        err = NULL;
    }
    put_be(key, id, 8);
    put_be(key + 8, strtoul(argv[3], NULL, 0), 4);
    put_be(key + 12, strtoul(argv[4], NULL, 0), 4);
    v = rocksdb_get_cf(db, ro, cf[2], (const char *)key, 16, &vlen, &err);
    if (err || !v || at >= vlen) {
        fprintf(stderr, "corrupt_chunk: no chunk %s/%s/%s (or offset past its end)\n", argv[2],
                argv[3], argv[4]);
        return 1;
    }
    v[at] ^= 0x5a;
    rocksdb_put_cf(db, wo, cf[2], (const char *)key, 16, v, vlen, &err);
    if (err) {
        fprintf(stderr, "corrupt_chunk: put: %s\n", err);
        return 1;
    }
    rocksdb_free(v);
    printf("flipped byte %zu of chunk %s of %s/%s\n", at, argv[4], argv[2], argv[3]);
out:
    for (int i = 0; i < 4; i++)
        rocksdb_column_family_handle_destroy(cf[i]);
    rocksdb_close(db);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_options_destroy(o);
    return 0;
}
