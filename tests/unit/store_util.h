/* Store test helpers: shards of derived bytes, damage done behind a (closed) store's back. */
#ifndef TS_STORE_UTIL_H
#define TS_STORE_UTIL_H

#include "ts_store.h"

#include <stddef.h>
#include <stdint.h>

/* Flips byte `at` of the value of key k in column family cfi (1 meta, 2 chunks) of the
 * closed store at path. */
void ts_test_flip_value(const char *path, int cfi, const uint8_t *k, size_t klen, size_t at);
/* The path of dataset dsid's shard's chunk file in the store at dir into out: 0, or -1 when
 * the shard has none (its chunks are in RocksDB). */
int ts_test_chunk_file(const char *dir, uint64_t dsid, uint32_t shard, char *out, size_t cap);

/* Writes shard `shard` of dataset ds: len bytes of ts_test_fill(seed, offset), in chunks of
 * `chunk`, sealed with its CRC. */
void ts_test_put_shard(ts_store *s, const char *ds, uint32_t shard, size_t len, uint32_t chunk,
                       uint64_t seed);

#endif
