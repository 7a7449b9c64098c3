/*
 * The record scanner (include/tessera/records.h): a streaming state machine per format that
 * finds where records start and checks what each format can check (TFRecord CRCs, tar header
 * checksums and sizes). Bytes a record's framing does not need are skipped, never copied; only
 * headers (at most 512 bytes, or a tar extended header of at most PAX_MAX) are buffered.
 */
#include "tessera/errno.h"
#include "tessera/records.h"

#include "ts_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TAR_BLOCK 512
#define PAX_MAX (64u << 10)
#define KEY_MAX 1024

enum phase { P_HEAD, P_BODY, P_TAIL, P_PAX, P_DONE };

struct tessera_recscan {
    int fmt;
    enum phase ph;
    uint64_t pos;       /* offset of the next input byte */
    uint64_t rec_start; /* offset where the current record began */
    uint64_t count;     /* records started */
    uint64_t left;      /* P_BODY: bytes of the body still to come */
    uint32_t crc;       /* TFRECORD: CRC32C of the body so far */
    uint32_t want_crc;
    size_t have, need; /* bytes of head[] collected / needed */
    uint8_t head[TAR_BLOCK];
    int in_line;       /* JSONL */
    uint64_t line_end; /* JSONL: just past the newline of the last non-empty line */
    int failed;
    uint64_t err_off, err_rec;
    char why[200];
    /* TAR */
    uint64_t member_start; /* first header of the member being read (its pax header, if any) */
    int zero_blocks;
    uint64_t archive_end; /* the first end-of-archive block (once zero_blocks) */
    char key[KEY_MAX];    /* the current sample's key */
    int have_key;
    char longname[KEY_MAX]; /* from a pax or GNU long-name header, for the next member */
    uint8_t *pax;
    size_t pax_len, pax_cap;
    char pax_type;
};

int tessera_record_format_parse(const char *name)
{
    if (!name)
        return TS_EINVAL;
    if (!strcasecmp(name, "webdataset"))
        return TESSERA_FMT_TAR;
    for (int f = TESSERA_FMT_TFRECORD; f <= TESSERA_FMT_LEN64; f++)
        if (!strcasecmp(name, ts_record_format_name(f)))
            return f;
    return TS_EINVAL;
}

const char *tessera_record_format_name(int fmt)
{
    return fmt >= TESSERA_FMT_TFRECORD && fmt <= TESSERA_FMT_LEN64 ? ts_record_format_name(fmt)
                                                                   : "?";
}

static void begin_head(tessera_recscan *s)
{
    s->ph = P_HEAD;
    s->have = 0;
    switch (s->fmt) {
    case TESSERA_FMT_TFRECORD:
        s->need = 12;
        break;
    case TESSERA_FMT_LEN32:
        s->need = 4;
        break;
    case TESSERA_FMT_LEN64:
        s->need = 8;
        break;
    default:
        s->need = TAR_BLOCK;
    }
}

int tessera_recscan_new(tessera_recscan **out, int fmt)
{
    tessera_recscan *s;

    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (fmt < TESSERA_FMT_TFRECORD || fmt > TESSERA_FMT_LEN64)
        return TS_EINVAL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return TS_ENOMEM;
    s->fmt = fmt;
    s->member_start = UINT64_MAX;
    begin_head(s);
    *out = s;
    return 0;
}

void tessera_recscan_free(tessera_recscan *s)
{
    if (s) {
        free(s->pax);
        free(s);
    }
}

uint64_t tessera_recscan_count(const tessera_recscan *s)
{
    return s ? s->count : 0;
}

uint64_t tessera_recscan_data_end(const tessera_recscan *s)
{
    if (!s)
        return 0;
    if (s->fmt == TESSERA_FMT_JSONL)
        return s->in_line ? s->pos : s->line_end;
    if (s->fmt == TESSERA_FMT_TAR && s->zero_blocks)
        return s->archive_end;
    return s->pos;
}

const char *tessera_recscan_error(const tessera_recscan *s, uint64_t *offset, uint64_t *record)
{
    if (!s || !s->failed)
        return NULL;
    if (offset)
        *offset = s->err_off;
    if (record)
        *record = s->err_rec;
    return s->why;
}

static int fail(tessera_recscan *s, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(s->why, sizeof(s->why), fmt, ap);
    va_end(ap);
    s->failed = 1;
    s->err_off = s->rec_start;
    s->err_rec = s->count ? s->count - 1 : 0;
    return TS_EPROTO;
}

static int emit(tessera_recscan *s, uint64_t off, tessera_record_cb cb, void *arg)
{
    s->rec_start = off;
    s->count++;
    return cb ? cb(arg, off) : 0;
}

static uint32_t tf_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- tar ------------------------------------------------------------------------------------ */

/* An octal (or base-256) tar number field; -1 if malformed. */
static int64_t tar_num(const uint8_t *f, size_t n)
{
    uint64_t v = 0;
    size_t i = 0;

    if (f[0] & 0x80) { /* base-256 (GNU) for sizes past 8 GiB */
        v = f[0] & 0x7f;
        for (i = 1; i < n; i++) {
            if (v >> 55)
                return -1;
            v = (v << 8) | f[i];
        }
        return (int64_t)v;
    }
    while (i < n && f[i] == ' ')
        i++;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v >> 60)
            return -1;
        v = v * 8 + (uint64_t)(f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != '\0')
            return -1;
    return (int64_t)v;
}

/* A sample's key: the directory and the last component up to its first '.'. */
static void sample_key(const char *path, char *key, size_t cap)
{
    const char *base = strrchr(path, '/'), *dot;

    base = base ? base + 1 : path;
    dot = strchr(base, '.');
    snprintf(key, cap, "%.*s", (int)(dot ? dot - path : (ptrdiff_t)strlen(path)), path);
}

/* A member's header is done: skip its data (padded to whole blocks), then the next header. */
static void member_body(tessera_recscan *s, uint64_t size)
{
    s->member_start = UINT64_MAX;
    s->longname[0] = '\0';
    s->left = (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    if (s->left)
        s->ph = P_BODY;
    else
        begin_head(s);
}

static int tar_header(tessera_recscan *s, tessera_record_cb cb, void *arg)
{
    const uint8_t *h = s->head;
    uint64_t sum = 0, hdr_off = s->pos - TAR_BLOCK;
    int64_t want, size;
    char path[KEY_MAX], key[KEY_MAX];
    int zero = 1;

    for (int i = 0; i < TAR_BLOCK; i++)
        zero &= h[i] == 0;
    if (zero) {
        if (!s->zero_blocks)
            s->archive_end = hdr_off;
        if (++s->zero_blocks == 2)
            s->ph = P_DONE; /* end of archive: what follows is padding */
        else
            begin_head(s);
        return 0;
    }
    if (s->zero_blocks) {
        s->rec_start = hdr_off;
        return fail(s, "a tar header after an end-of-archive block");
    }
    for (int i = 0; i < TAR_BLOCK; i++)
        sum += (i >= 148 && i < 156) ? ' ' : h[i];
    want = tar_num(h + 148, 8);
    if (want < 0 || (uint64_t)want != sum) {
        s->rec_start = hdr_off;
        return fail(s, "tar header checksum mismatch at offset %llu (not a tar file, or damaged)",
                    (unsigned long long)hdr_off);
    }
    size = tar_num(h + 124, 12);
    if (size < 0) {
        s->rec_start = hdr_off;
        return fail(s, "bad size field in the tar header at offset %llu",
                    (unsigned long long)hdr_off);
    }
    if (s->member_start == UINT64_MAX)
        s->member_start = hdr_off; /* a pax or long-name header before it set it already */
    switch (h[156]) {
    case 'x': /* pax extended header: its data names the next member */
    case 'L': /* GNU long name */
        if ((uint64_t)size > PAX_MAX) {
            s->rec_start = hdr_off;
            return fail(s, "tar extended header of %lld bytes (at most %u)", (long long)size,
                        PAX_MAX);
        }
        s->pax_type = (char)h[156];
        s->pax_len = 0;
        s->left = (uint64_t)size;
        s->need = (size_t)(((uint64_t)size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK);
        s->ph = size ? P_PAX : P_HEAD;
        if (!size)
            begin_head(s);
        return 0;
    case 'g': /* global pax header: applies to nothing we index */
    case '5': /* directory */
    case '2': /* symlink */
    case '1': /* hard link */
        member_body(s, (uint64_t)size);
        return 0;
    default:
        break;
    }
    if (s->longname[0]) {
        snprintf(path, sizeof(path), "%s", s->longname);
    } else if (!memcmp(h + 257, "ustar", 5) && h[345]) {
        snprintf(path, sizeof(path), "%.155s/%.100s", (const char *)h + 345, (const char *)h);
    } else {
        snprintf(path, sizeof(path), "%.100s", (const char *)h);
    }
    sample_key(path, key, sizeof(key));
    if (!s->have_key || strcmp(key, s->key)) {
        int rc;
        snprintf(s->key, sizeof(s->key), "%s", key);
        s->have_key = 1;
        rc = emit(s, s->member_start, cb, arg);
        if (rc)
            return rc;
    }
    member_body(s, (uint64_t)size);
    return 0;
}

/* The collected data of a pax or long-name header: the next member's path. */
static void pax_done(tessera_recscan *s)
{
    size_t n = s->pax_len;
    const char *p = (const char *)s->pax;

    s->longname[0] = '\0';
    if (s->pax_type == 'L') {
        snprintf(s->longname, sizeof(s->longname), "%.*s", (int)strnlen(p, n), p);
        return;
    }
    /* Records "LEN path=VALUE\n". */
    for (size_t i = 0; i < n;) {
        size_t len = 0, j = i;
        while (j < n && p[j] >= '0' && p[j] <= '9')
            len = len * 10 + (size_t)(p[j++] - '0');
        if (!len || i + len > n || j >= n || p[j] != ' ')
            return;
        if (len > (j + 1 - i) + 5 && !strncmp(p + j + 1, "path=", 5)) {
            size_t vs = j + 6, ve = i + len - 1; /* without the newline */
            snprintf(s->longname, sizeof(s->longname), "%.*s", (int)(ve - vs), p + vs);
        }
        i += len;
    }
}

/* ---- the loop ---------------------------------------------------------------------------------
 */

/* Collects up to s->need bytes of a header or footer into s->head; 1 once it is whole. */
static int take_head(tessera_recscan *s, const uint8_t **p, size_t *len)
{
    size_t n = TS_MIN(*len, s->need - s->have);

    memcpy(s->head + s->have, *p, n);
    s->have += n;
    s->pos += n;
    *p += n;
    *len -= n;
    return s->have == s->need;
}

static int head_done(tessera_recscan *s, tessera_record_cb cb, void *arg)
{
    const uint8_t *h = s->head;

    switch (s->fmt) {
    case TESSERA_FMT_TFRECORD:
        if (tf_mask(ts_crc32c(0, h, 8)) != ts_get_le32(h + 8))
            return fail(s,
                        "TFRecord %llu at offset %llu: the CRC of its length does not match "
                        "(not a TFRecord file, or damaged)",
                        (unsigned long long)(s->count - 1), (unsigned long long)s->rec_start);
        s->left = ts_get_le64(h);
        s->crc = 0;
        s->ph = P_BODY;
        return 0;
    case TESSERA_FMT_LEN32:
        s->left = ts_get_le32(h);
        s->ph = P_BODY;
        return 0;
    case TESSERA_FMT_LEN64:
        s->left = ts_get_le64(h);
        s->ph = P_BODY;
        return 0;
    default:
        return tar_header(s, cb, arg);
    }
}

static int body_done(tessera_recscan *s)
{
    if (s->fmt == TESSERA_FMT_TFRECORD) {
        s->ph = P_TAIL;
        s->have = 0;
        s->need = 4;
        return 0;
    }
    begin_head(s);
    return 0;
}

int tessera_recscan_feed(tessera_recscan *s, const void *buf, size_t len, tessera_record_cb cb,
                         void *arg)
{
    const uint8_t *p = buf;
    int rc;

    if (!s || (!buf && len))
        return TS_EINVAL;
    if (s->failed)
        return TS_EPROTO;
    if (s->fmt == TESSERA_FMT_JSONL) {
        for (size_t i = 0; i < len; i++) {
            if (p[i] == '\0') {
                if (!s->in_line) { /* the NUL starts a line of its own */
                    s->rec_start = s->pos + i;
                    s->count++;
                }
                return fail(s, "a NUL byte at offset %llu: not a text (JSON lines) file",
                            (unsigned long long)(s->pos + i));
            }
            if (!s->in_line && p[i] != '\n') {
                s->in_line = 1;
                if ((rc = emit(s, s->pos + i, cb, arg)) != 0) {
                    s->pos += i + 1;
                    return rc;
                }
            } else if (s->in_line && p[i] == '\n') {
                s->in_line = 0;
                s->line_end = s->pos + i + 1;
            }
        }
        s->pos += len;
        return 0;
    }
    while (len) {
        size_t n;
        switch (s->ph) {
        case P_HEAD:
            if (s->have == 0 && s->fmt != TESSERA_FMT_TAR && (rc = emit(s, s->pos, cb, arg)) != 0)
                return rc;
            if (take_head(s, &p, &len) && (rc = head_done(s, cb, arg)) != 0)
                return rc;
            break;
        case P_BODY:
            n = (size_t)TS_MIN((uint64_t)len, s->left);
            if (s->fmt == TESSERA_FMT_TFRECORD)
                s->crc = ts_crc32c(s->crc, p, n);
            s->left -= n;
            s->pos += n;
            p += n;
            len -= n;
            if (!s->left)
                body_done(s);
            break;
        case P_TAIL:
            if (take_head(s, &p, &len)) {
                if (tf_mask(s->crc) != ts_get_le32(s->head))
                    return fail(s,
                                "TFRecord %llu at offset %llu: the CRC of its data does not "
                                "match (damaged)",
                                (unsigned long long)(s->count - 1),
                                (unsigned long long)s->rec_start);
                begin_head(s);
            }
            break;
        case P_PAX:
            n = TS_MIN(len, s->need);
            if (s->left) {
                size_t take = (size_t)TS_MIN((uint64_t)n, s->left);
                if (s->pax_len + take > s->pax_cap) {
                    uint8_t *np = realloc(s->pax, PAX_MAX);
                    if (!np)
                        return TS_ENOMEM;
                    s->pax = np;
                    s->pax_cap = PAX_MAX;
                }
                memcpy(s->pax + s->pax_len, p, take);
                s->pax_len += take;
                s->left -= take;
            }
            s->need -= n;
            s->pos += n;
            p += n;
            len -= n;
            if (!s->need) {
                pax_done(s);
                s->pax_len = 0;
                begin_head(s);
            }
            break;
        case P_DONE:
            s->pos += len; /* padding after the end of the archive */
            return 0;
        }
    }
    return 0;
}

int tessera_recscan_end(tessera_recscan *s, tessera_record_cb cb, void *arg)
{
    (void)cb;
    (void)arg;
    if (!s)
        return TS_EINVAL;
    if (s->failed)
        return TS_EPROTO;
    if (s->fmt == TESSERA_FMT_JSONL || s->ph == P_DONE)
        return 0;
    if (s->ph == P_HEAD && s->have == 0 && s->member_start == UINT64_MAX)
        return 0; /* at a record boundary (a tar without end-of-archive blocks too) */
    if (s->ph == P_HEAD && s->have == 0 && s->fmt != TESSERA_FMT_TAR)
        return 0;
    return fail(s, "the input ends inside record %llu (offset %llu): truncated",
                (unsigned long long)(s->count ? s->count - 1 : 0),
                (unsigned long long)s->rec_start);
}

/* The tar members of rec[0..len) up to the first end-of-archive block: their length. */
static int tar_members(const uint8_t *rec, size_t len, size_t *plen)
{
    size_t pos = 0;

    while (pos + TAR_BLOCK <= len) {
        int64_t size;
        int zero = 1;
        for (int i = 0; i < TAR_BLOCK && zero; i++)
            zero = rec[pos + i] == 0;
        if (zero)
            break;
        size = tar_num(rec + pos + 124, 12);
        if (size < 0 || (uint64_t)size > len - pos - TAR_BLOCK)
            return TS_EPROTO;
        pos += TAR_BLOCK + ((size_t)size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    }
    if (pos == 0 || pos > len)
        return TS_EPROTO;
    *plen = pos;
    return 0;
}

int tessera_record_payload(int fmt, const void *rec, size_t len, size_t *off, size_t *plen)
{
    const uint8_t *b = rec;
    size_t head = fmt == TESSERA_FMT_LEN32 ? 4 : 8;

    if (!off || !plen || (!rec && len))
        return TS_EINVAL;
    *off = 0;
    *plen = len;
    switch (fmt) {
    case 0:
        return 0;
    case TESSERA_FMT_TFRECORD:
        if (len < 16 || ts_get_le64(b) != len - 16)
            return TS_EPROTO;
        *off = 12;
        *plen = len - 16;
        return 0;
    case TESSERA_FMT_LEN32:
    case TESSERA_FMT_LEN64:
        if (len < head || (head == 4 ? ts_get_le32(b) : ts_get_le64(b)) != len - head)
            return TS_EPROTO;
        *off = head;
        *plen = len - head;
        return 0;
    case TESSERA_FMT_JSONL:
        while (*plen && strchr(" \t\r\n", b[*plen - 1]))
            (*plen)--;
        return 0;
    case TESSERA_FMT_TAR:
        return tar_members(b, len, plen);
    default:
        return TS_EINVAL;
    }
}
