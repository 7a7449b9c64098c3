/*
 * The RocksDB edge: RocksDB's errors as TS_E* codes, and the small engine helpers the storage
 * files share (a meta value, a batch write, a meta prefix scan).
 */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

#define FAC "storage"

/* ---- error conversion (the RocksDB edge) ------------------------------------------------- */

int from_rocksdb(char *err, const char *what)
{
    int rc = TS_EDB;

    if (!err)
        return 0;
    /* RocksDB's Status::ToString(): "<code>: [<subcode>]<message>". Map by code (and the
     * no-space subcode), never by words that a path in the message may contain. */
    static const struct {
        const char *prefix;
        int rc;
    } codes[] = {
        {"IO error: No space left on device", TS_ENOSPC},
        {"IO error: ", TS_EIO},
        {"Corruption: ", TS_ECORRUPT},
        {"Invalid argument: ", TS_EINVAL},
        {"Resource busy: ", TS_EBUSY},
        {"Operation timed out: ", TS_EBUSY},
        {"Result incomplete: ", TS_EBUSY},
        {"Not implemented: ", TS_ENOTSUP},
    };
    for (size_t i = 0; i < TS_ARRAY_SIZE(codes); i++)
        if (!strncmp(err, codes[i].prefix, strlen(codes[i].prefix))) {
            rc = codes[i].rc;
            break;
        }
    TS_ERROR(FAC, rc, "%s: %s", what, err);
    rocksdb_free(err);
    return rc;
}

/* ---- small engine helpers ---------------------------------------------------------------- */

/* Gets a meta value into a malloc'ed buffer; TS_ENOENT if absent. */
int meta_get(ts_store *s, const uint8_t *k, size_t klen, char **val, size_t *vlen)
{
    char *err = NULL;
    *val = rocksdb_get_cf(s->db, s->ro_meta, s->cf[CF_META], (const char *)k, klen, vlen, &err);
    if (err)
        return from_rocksdb(err, "metadata read");
    return *val ? 0 : TS_ENOENT;
}

int batch_write(ts_store *s, rocksdb_writebatch_t *b, const char *what)
{
    return batch_write_wo(s, s->wo, b, what);
}

int batch_write_wo(ts_store *s, rocksdb_writeoptions_t *wo, rocksdb_writebatch_t *b,
                   const char *what)
{
    char *err = NULL;
    rocksdb_write(s->db, wo, b, &err);
    if (err && !strncmp(err, "Corruption: ", 12)) {
        /* A write finds no corruption itself: RocksDB stopped writes after a background error
         * (a flush or compaction that read damaged data). Not the client's data: TS_EIO. */
        TS_ERROR(FAC, TS_EIO,
                 "%s refused: the storage engine stopped taking writes after a background "
                 "error (%s); reads go on; restart the node once the damage is dealt with",
                 what, err);
        rocksdb_free(err);
        return TS_EIO;
    }
    return from_rocksdb(err, what);
}

/* Iterates meta keys starting with prefix; cb gets key and value. */
int meta_scan(ts_store *s, const uint8_t *prefix, size_t plen,
              int (*cb)(void *arg, const uint8_t *k, size_t klen, const char *v, size_t vlen),
              void *arg)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, s->ro_meta, s->cf[CF_META]);
    char *err = NULL;
    int rc = 0;

    for (rocksdb_iter_seek(it, (const char *)prefix, plen); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        if (klen < plen || memcmp(k, prefix, plen) != 0)
            break;
        rc = cb(arg, (const uint8_t *)k, klen, v, vlen);
        if (rc)
            break;
    }
    rocksdb_iter_get_error(it, &err);
    if (err && rc == 0)
        rc = from_rocksdb(err, "metadata scan");
    else if (err)
        rocksdb_free(err);
    rocksdb_iter_destroy(it);
    return rc;
}
