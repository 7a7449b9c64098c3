/*
 * Records: the record formats a shard may hold and the scanner that finds their boundaries,
 * for a shard's record index (docs/client.md "Records").
 *
 * Formats:
 *   TFRECORD  u64 length, u32 masked CRC32C of the length, data, u32 masked CRC32C of the data
 *             (both CRCs verified)
 *   TAR       a WebDataset tar shard: a record is a *sample*, the consecutive members whose names
 *             share a key (the path up to the first '.' of its last component); the index keeps
 *             sample boundaries (the offset of a sample's first header). Header checksums are
 *             verified; the end-of-archive blocks end the scan.
 *   JSONL     one record per line; an empty line is no record
 *   LEN32 / LEN64  little-endian u32 / u64 length, then that many bytes
 *
 * The scanner is streaming: feed a file in pieces of any size; memory does not grow with the
 * file. A malformed input stops it with the offset of the bad record, its number and a reason.
 */
#ifndef TESSERA_RECORDS_H
#define TESSERA_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tessera_record_format {
    TESSERA_FMT_TFRECORD = 1,
    TESSERA_FMT_TAR = 2,
    TESSERA_FMT_JSONL = 3,
    TESSERA_FMT_LEN32 = 4,
    TESSERA_FMT_LEN64 = 5,
};

/*
 * What a record is to its reader (tessera_reader_opts.record, and the Python adapters' record=):
 *   FRAMED   its bytes as stored: a TFRecord with its length and CRCs, a tar sample with its
 *            member headers (the shard's last one with the archive's end blocks), a JSON line
 *            with its newline (and blank lines after it), a LEN32/LEN64 record with its length
 *   PAYLOAD  what the framing carries (tessera_record_payload): the TFRecord's data (e.g. a
 *            serialized tf.train.Example), the tar sample's members without the end-of-archive
 *            blocks, the JSON text of the line, the LEN32/LEN64 record's bytes
 *   AUTO     PAYLOAD for record units of a dataset that says its format (datasets made by
 *            `tessera ingest`, or created with one), FRAMED otherwise (the default)
 */
enum tessera_record_form {
    TESSERA_RECORD_AUTO = 0,
    TESSERA_RECORD_FRAMED = 1,
    TESSERA_RECORD_PAYLOAD = 2,
};

/* The payload of one record of format fmt (0: raw bytes, all of it): *off and *plen within
 * rec[0..len). TS_EPROTO when the bytes are not one framed record of that format (a TFRecord
 * or LEN32/LEN64 length that does not match, a tar header that is not one). CRCs are not
 * checked again: every read is checked end to end by the chunks' CRC32C. */
int tessera_record_payload(int fmt, const void *rec, size_t len, size_t *off, size_t *plen);

/* "tfrecord", "tar" (or "webdataset"), "jsonl", "len32", "len64": the format, or TS_EINVAL. */
int tessera_record_format_parse(const char *name);
const char *tessera_record_format_name(int fmt);

typedef struct tessera_recscan tessera_recscan;

/* Called with the byte offset (in the whole input) where each record starts, in order.
 * A non-zero return stops the scan and is returned by tessera_recscan_feed. */
typedef int (*tessera_record_cb)(void *arg, uint64_t offset);

int tessera_recscan_new(tessera_recscan **out, int fmt);
void tessera_recscan_free(tessera_recscan *s);
/* Feeds the next len bytes. 0, the callback's non-zero return, or TS_EPROTO for a malformed
 * input (tessera_recscan_error says where and why; the scan is over). */
int tessera_recscan_feed(tessera_recscan *s, const void *buf, size_t len, tessera_record_cb cb,
                         void *arg);
/* The input ended: TS_EPROTO if it ended inside a record (a truncated file). */
int tessera_recscan_end(tessera_recscan *s, tessera_record_cb cb, void *arg);
/* Records found so far. */
uint64_t tessera_recscan_count(const tessera_recscan *s);
/* Where the records' bytes end in the input so far: the end of the last record, before a tar's
 * end-of-archive blocks (and whatever follows them) or the blank lines after the last JSON line.
 * After tessera_recscan_end it is the offset to cut a file at to append more records. */
uint64_t tessera_recscan_data_end(const tessera_recscan *s);
/* After TS_EPROTO: the offset of the bad record's start, its number (0-based) and why. */
const char *tessera_recscan_error(const tessera_recscan *s, uint64_t *offset, uint64_t *record);

#ifdef __cplusplus
}
#endif
#endif
