/*
 * libtessera, the connection layer: uploads to one connection. ts_conn_put and ts_conn_put_fd
 * send a shard as SHARD_WRITE chunks, a window of them in flight, then seal it (SHARD_SEAL
 * with the shard's CRC32C and record index); a put whose shard exists already with the same
 * bytes is confirmed. The public calls (api.c) on a single-node handle and the router
 * (cluster_put.c) on the primary's sub-connection call them; nothing here knows the router.
 */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define FAC "client"
#define PUT_WINDOW_BYTES (32u << 20) /* upload bytes in flight */

/* ---- uploads -------------------------------------------------------------------------------- */

struct put {
    const char *name;
    uint32_t shard;
    uint32_t chunk;    /* the dataset's chunk size */
    uint64_t declared; /* shard size, or TS_SIZE_UNKNOWN */
    uint32_t index;    /* next chunk index */
    uint64_t bytes;    /* bytes queued so far */
    uint32_t crc;      /* of all of them */
    struct ts_req **win;
    uint32_t nwin;  /* ring size */
    uint32_t head;  /* oldest request in flight */
    uint32_t count; /* requests in flight */
    int rc;         /* first failure */
    int memo;       /* the chunk size came from c->chunk_memo */
};

/* The remembered chunk size of dataset name on c (0: none). */
static uint32_t memo_get(tessera_client *c, const char *name)
{
    for (unsigned i = 0; i < (sizeof(c->chunk_memo) / sizeof(c->chunk_memo[0])); i++)
        if (c->chunk_memo[i].chunk && !strcmp(c->chunk_memo[i].name, name))
            return c->chunk_memo[i].chunk;
    return 0;
}

static void memo_set(tessera_client *c, const char *name, uint32_t chunk)
{
    unsigned i = c->chunk_memo_next++ % (sizeof(c->chunk_memo) / sizeof(c->chunk_memo[0]));

    snprintf(c->chunk_memo[i].name, sizeof(c->chunk_memo[i].name), "%s", name);
    c->chunk_memo[i].chunk = chunk;
}

static void memo_forget(tessera_client *c, const char *name)
{
    for (unsigned i = 0; i < (sizeof(c->chunk_memo) / sizeof(c->chunk_memo[0])); i++)
        if (!strcmp(c->chunk_memo[i].name, name))
            c->chunk_memo[i].chunk = 0;
}

/* use_memo: the chunk size may come from c->chunk_memo (a caller that can put again when the
 * dataset turns out to have another one). */
static int put_begin(tessera_client *c, struct put *p, const char *name, uint32_t shard,
                     uint64_t declared, int use_memo)
{
    struct ts_dataset_info d;
    int rc;

    memset(p, 0, sizeof(*p));
    p->name = name;
    p->shard = shard;
    p->declared = declared;
    p->chunk = use_memo ? memo_get(c, name) : 0;
    p->memo = p->chunk != 0;
    if (!p->chunk) {
        char base[TS_NAME_MAX + 1];
        /* the chunk size: O(1), no shard count; a fragment store NAME#f has NAME's */
        rc = ts_conn_dataset_policy(c, ts_frag_split(name, base, NULL) ? base : name, &d);
        if (rc)
            return rc;
        p->chunk = d.policy.chunk_size ? d.policy.chunk_size : TS_DEFAULT_CHUNK_SIZE;
        memo_set(c, name, p->chunk);
    }
    if (declared != TS_SIZE_UNKNOWN && declared && (declared - 1) / p->chunk >= (1u << 30)) {
        /* Refused before a byte is sent: the server stores at most 2^30 chunks a shard. */
        ts_conn_set_error(c, "%s/%u: %llu bytes make more than 2^30 chunks of %u bytes", name,
                          shard, (unsigned long long)declared, p->chunk);
        return TS_ETOOBIG;
    }
    p->nwin = TS_MAX(2u, PUT_WINDOW_BYTES / p->chunk);
    p->nwin = TS_MIN(p->nwin, c->max_inflight);
    p->win = calloc(p->nwin, sizeof(*p->win));
    return p->win ? 0 : TS_ENOMEM;
}

/* Collects the oldest chunk's acknowledgement. */
static void put_collect(tessera_client *c, struct put *p)
{
    struct ts_req *r = p->win[p->head];
    char scratch[sizeof(c->err)];
    uint32_t expect = p->index - p->count;
    struct ts_rd body;
    int rc;

    rc = ts_pump(c, ts_cond_done, r);
    rc = rc ? rc : r->rc;
    if (!rc) {
        ts_rd_init(&body, r->reply, r->reply_len);
        /* Keep the first refusal's message: later ones are usually its echo. */
        rc = ts_reply_status(&body, p->rc ? scratch : c->err, sizeof(scratch));
        ts_note_stale(c, &body, rc);
        if (!rc) {
            uint32_t idx = ts_rd_u32(&body);
            (void)ts_rd_u64(&body);
            if (body.err || idx != expect)
                rc = p->rc ? TS_EPROTO : ts_proto_err(c, "SHARD_WRITE acknowledges another chunk");
        }
    }
    if (rc && !p->rc) {
        p->rc = rc;
        TS_WARN(FAC, rc, "upload of %s/%u: chunk %u failed", p->name, p->shard, expect);
    }
    ts_req_free(c, r);
    p->win[p->head] = NULL;
    p->head = (p->head + 1) % p->nwin;
    p->count--;
}

/* Waits until the window has room for another chunk; the first failure so far. */
static int put_room(tessera_client *c, struct put *p)
{
    while (p->count == p->nwin)
        put_collect(c, p);
    return p->rc;
}

/* Queues one chunk whose CRC32C is crc (data borrowed until it is acknowledged). The shard's
 * CRC grows by combination: one pass over the bytes per chunk, not two. */
static int put_chunk(tessera_client *c, struct put *p, const void *data, uint32_t len, uint32_t crc)
{
    struct ts_req *r;
    int rc;

    r = ts_req_name(c, TS_OP_SHARD_WRITE, p->name);
    if (!r)
        return p->rc = TS_ENOMEM;
    ts_wr_u32(&r->w, p->shard);
    ts_wr_u32(&r->w, p->index);
    ts_wr_u64(&r->w, p->declared);
    ts_wr_u32(&r->w, crc);
    ts_wr_u32(&r->w, len);
    rc = ts_req_send(c, r, data, len);
    if (rc) {
        ts_req_free(c, r);
        return p->rc = rc;
    }
    p->win[(p->head + p->count) % p->nwin] = r;
    p->count++;
    p->index++;
    p->bytes += len;
    p->crc = ts_crc32c_combine(p->crc, crc, len);
    return 0;
}

/* Sends SHARD_SEAL with the shard's CRC32C and record index; *out is the request (NULL and
 * an error if it could not be sent). */
static int seal_send(tessera_client *c, const char *name, uint32_t shard, uint32_t crc,
                     const uint64_t *records, uint32_t nrecords, struct ts_req **out)
{
    struct ts_req *r = ts_req_name(c, TS_OP_SHARD_SEAL, name);
    int rc;

    *out = NULL;
    if (!r)
        return TS_ENOMEM;
    ts_wr_u32(&r->w, shard);
    ts_wr_u8(&r->w, 1);
    ts_wr_u32(&r->w, crc);
    ts_wr_u32(&r->w, nrecords);
    for (uint32_t i = 0; i < nrecords; i++)
        ts_wr_u64(&r->w, records[i]);
    rc = ts_req_send(c, r, NULL, 0);
    if (rc)
        ts_req_free(c, r);
    else
        *out = r;
    return rc;
}

/* The answer to a seal sent; *info from it. err: where its refusal's message goes. r is freed. */
static int seal_wait(tessera_client *c, struct ts_req *r, struct ts_shard_info *info, char *err,
                     size_t errlen)
{
    struct ts_rd body;
    int rc = ts_pump(c, ts_cond_done, r);

    rc = rc ? rc : r->rc;
    if (!rc) {
        ts_rd_init(&body, r->reply, r->reply_len);
        rc = ts_reply_status(&body, err, errlen);
        ts_note_stale(c, &body, rc);
        if (!rc && ts_rd_shard_info(&body, info))
            rc = ts_proto_err(c, "SHARD_SEAL");
    }
    ts_req_free(c, r);
    return rc;
}

static int seal_call(tessera_client *c, const char *name, uint32_t shard, uint32_t crc,
                     const uint64_t *records, uint32_t nrecords, struct ts_shard_info *info)
{
    struct ts_req *r;
    int rc = seal_send(c, name, shard, crc, records, nrecords, &r);

    return rc ? rc : seal_wait(c, r, info, c->err, sizeof(c->err));
}

/* Seals, and collects the chunks' answers and the seal's; frees the window. On a single node
 * the seal goes right behind the chunks, before their acknowledgements (one round trip for a
 * small put: the node takes a connection's frames in order, and a seal succeeds only when
 * every chunk before it was stored and the shard's CRC32C matches). A node of a cluster (its
 * replies carry a map epoch) acknowledges a chunk once the other core replicas hold it too,
 * and its seal must not overtake those copies: there the seal waits for every chunk's answer.
 * A chunk's refusal is the put's failure (a seal refused because of it is not reported over
 * it). */
static int put_end(tessera_client *c, struct put *p, const uint64_t *records, uint32_t nrecords)
{
    struct ts_shard_info info;
    struct ts_req *seal = NULL;
    char scratch[sizeof(c->err)];
    int rc = 0, early = c->seen_epoch == 0 && !c->epoch_ref;

    if (early && !p->rc)
        rc = seal_send(c, p->name, p->shard, p->crc, records, nrecords, &seal);
    while (p->count)
        put_collect(c, p);
    if (!early && !p->rc)
        rc = seal_send(c, p->name, p->shard, p->crc, records, nrecords, &seal);
    free(p->win);
    p->win = NULL;
    if (seal)
        rc = seal_wait(c, seal, &info, p->rc ? scratch : c->err, sizeof(scratch));
    if (p->rc)
        return p->rc;
    if (!rc)
        TS_DEBUG(FAC, "sealed %s/%u: %llu bytes, %u chunks, crc %08x", p->name, p->shard,
                 (unsigned long long)info.size, info.nchunks, info.crc);
    return rc;
}

/*
 * The shard exists already (TS_EEXIST at chunk 0): a retry of a put whose answer was lost, or
 * another shard. The same bytes: SHARD_SEAL with their CRC, answered once the shard is as
 * durable as a fresh seal; other bytes: TS_EEXIST saying so.
 */
static int put_exists_crc(tessera_client *c, const char *name, uint32_t shard, uint64_t len,
                          uint32_t crc, const uint64_t *records, uint32_t nrecords)
{
    struct ts_shard_info si;
    int rc;

    rc = ts_conn_shard_stat(c, name, shard, &si);
    if (rc)
        return rc == TS_ENOENT ? TS_EEXIST : rc;
    if (si.state != TS_SHARD_COMPLETE || si.size != len || si.crc != crc) {
        ts_conn_set_error(
            c,
            "%s/%u already exists with other contents (%llu bytes, CRC32C %08x; this put: "
            "%llu bytes, %08x)",
            name, shard, (unsigned long long)si.size, si.crc, (unsigned long long)len, crc);
        return TS_EEXIST;
    }
    rc = seal_call(c, name, shard, crc, records, nrecords, &si);
    if (!rc)
        TS_INFO(FAC, "%s/%u was sealed already with these bytes: put confirmed", name, shard);
    return rc;
}

static int put_exists(tessera_client *c, const char *name, uint32_t shard, const void *buf,
                      size_t len, const uint64_t *records, uint32_t nrecords)
{
    return put_exists_crc(c, name, shard, len, ts_crc32c(0, buf, len), records, nrecords);
}

/* One try of ts_conn_put. */
static int put_buf(tessera_client *c, struct put *p_out, const char *name, uint32_t shard,
                   const void *buf, size_t len, const uint64_t *records, uint32_t nrecords,
                   int use_memo)
{
    const uint8_t *src = buf;
    struct put p;
    size_t off = 0;
    int rc;

    rc = put_begin(c, &p, name, shard, len, use_memo);
    *p_out = p;
    if (rc)
        goto out_end;
    do { /* an empty shard is one empty chunk */
        uint32_t n = (uint32_t)TS_MIN((size_t)p.chunk, len - off);
        if (put_room(c, &p) || put_chunk(c, &p, src + off, n, ts_crc32c(0, src + off, n)))
            break;
        off += n;
    } while (off < len);
out_end:
    p_out->memo = p.memo;
    if (!p.win)
        return rc ? rc : p.rc;
    return put_end(c, &p, records, nrecords);
}

int ts_conn_put(tessera_client *c, const char *name, uint32_t shard, const void *buf, size_t len,
                const uint64_t *records, uint32_t nrecords)
{
    struct put p;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if ((!buf && len) || (!records && nrecords))
        return TS_EINVAL;
    for (int tries = 0;; tries++) {
        rc = put_buf(c, &p, name, shard, buf, len, records, nrecords, tries == 0);
        if (rc != TS_EINVAL || !p.memo)
            break;
        /* Refused as the wrong shape with a remembered chunk size: the dataset may have been
         * made again with another one. Nothing was sealed: ask, and put again. */
        memo_forget(c, name);
    }
    if (rc == TS_EEXIST)
        rc = put_exists(c, name, shard, buf, len, records, nrecords);
    return rc;
}

/*
 * n puts at once, each on a connection of its own (an erasure-coded shard's fragments to their
 * nodes): every put's chunks are sent before any is waited for, then each is sealed once its
 * chunks are acknowledged, and only then are the seals waited for, so the nodes store and
 * make durable their fragments at the same time rather than one after another. A put that
 * fails in a way ts_conn_put would try again (its shard there already, a remembered chunk size
 * refused) is done again alone by ts_conn_put.
 */
void ts_conn_put_many(tessera_client *const *cs, const char *const *names, uint32_t shard,
                      const void *const *bufs, const size_t *lens, int *rcs, unsigned n)
{
    struct put ps[TS_PUT_MANY_MAX];
    struct ts_req *seal[TS_PUT_MANY_MAX] = {0};
    size_t off[TS_PUT_MANY_MAX] = {0};

    n = TS_MIN(n, (unsigned)TS_PUT_MANY_MAX);
    memset(ps, 0, sizeof(ps));
    /* Chunks sent, as far as each window goes without a wait. */
    for (unsigned i = 0; i < n; i++) {
        rcs[i] = ts_enter_name(cs[i], names[i]);
        if (!rcs[i] && !bufs[i] && lens[i])
            rcs[i] = TS_EINVAL;
        if (!rcs[i])
            rcs[i] = put_begin(cs[i], &ps[i], names[i], shard, lens[i], 1);
        while (!rcs[i] && ps[i].count < ps[i].nwin && (off[i] < lens[i] || !ps[i].index)) {
            uint32_t k = (uint32_t)TS_MIN((size_t)ps[i].chunk, lens[i] - off[i]);
            const uint8_t *at = (const uint8_t *)bufs[i] + off[i];
            if (put_chunk(cs[i], &ps[i], at, k, ts_crc32c(0, at, k)))
                break;
            off[i] += k;
        }
    }
    /* The rest of each (a put larger than its window), then its acknowledgements, then its
     * seal sent. */
    for (unsigned i = 0; i < n; i++) {
        if (rcs[i] || !ps[i].win)
            continue;
        while (!ps[i].rc && (off[i] < lens[i] || !ps[i].index)) {
            uint32_t k = (uint32_t)TS_MIN((size_t)ps[i].chunk, lens[i] - off[i]);
            const uint8_t *at = (const uint8_t *)bufs[i] + off[i];
            if (put_room(cs[i], &ps[i]) || put_chunk(cs[i], &ps[i], at, k, ts_crc32c(0, at, k)))
                break;
            off[i] += k;
        }
        while (ps[i].count)
            put_collect(cs[i], &ps[i]);
        if (!ps[i].rc)
            rcs[i] = seal_send(cs[i], names[i], shard, ps[i].crc, NULL, 0, &seal[i]);
    }
    /* The seals' answers. */
    for (unsigned i = 0; i < n; i++) {
        struct ts_shard_info info;
        int memo = ps[i].memo;
        free(ps[i].win);
        if (seal[i])
            rcs[i] = seal_wait(cs[i], seal[i], &info, cs[i]->err, sizeof(cs[i]->err));
        if (ps[i].rc)
            rcs[i] = ps[i].rc;
        if (rcs[i] == TS_EEXIST || (rcs[i] == TS_EINVAL && memo)) {
            if (memo)
                memo_forget(cs[i], names[i]);
            rcs[i] = ts_conn_put(cs[i], names[i], shard, bufs[i], lens[i], NULL, 0);
        }
    }
}

/* Fills buf with up to len bytes from fd (a file or a pipe); the count, or TS_E*. */
static long read_full(int fd, uint8_t *buf, size_t len)
{
    size_t got = 0;
    ssize_t n;

    while (got < len) {
        n = read(fd, buf + got, len - got);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                (void)poll(&pfd, 1, -1);
                continue;
            }
            return ts_from_errno(errno);
        }
        got += (size_t)n;
    }
    return (long)got;
}

/* ts_conn_put_fd found the shard complete already (an earlier try landed): the same bytes
 * confirm it, as ts_conn_put does. The rest of the input (after got bytes whose CRC32C is crc)
 * is read for its CRC32C. */
static int put_fd_exists(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size,
                         uint64_t got, uint32_t crc)
{
    uint64_t total = size == TS_SIZE_UNKNOWN ? UINT64_MAX : size;
    uint8_t *buf = malloc(1u << 20);
    long n = 0;

    if (!buf)
        return TS_ENOMEM;
    while (got < total) {
        n = read_full(fd, buf, (size_t)TS_MIN((uint64_t)1u << 20, total - got));
        if (n <= 0)
            break;
        crc = ts_crc32c(crc, buf, (size_t)n);
        got += (uint64_t)n;
    }
    free(buf);
    if (n < 0 || (size != TS_SIZE_UNKNOWN && got != size))
        return TS_EEXIST; /* cannot tell: the shard exists */
    return put_exists_crc(c, name, shard, got, crc, NULL, 0);
}

int ts_conn_put_fd(tessera_client *c, const char *name, uint32_t shard, int fd, uint64_t size)
{
    uint8_t **bufs = NULL;
    struct put p;
    uint32_t slot, crc = 0, ccrc; /* of the input read so far; of the chunk just read */
    uint64_t got = 0;
    long n;
    int rc;

    rc = ts_enter_name(c, name);
    if (rc)
        return rc;
    if (fd < 0)
        return TS_EINVAL;
    rc = put_begin(c, &p, name, shard, size, 0); /* the input cannot be read twice */
    if (rc)
        goto out_free;
    /* One buffer per window slot: a buffer is reused once its chunk is acknowledged. */
    bufs = calloc(p.nwin, sizeof(*bufs));
    if (!bufs) {
        p.rc = TS_ENOMEM;
        goto out_end;
    }
    for (;;) {
        uint64_t left = size == TS_SIZE_UNKNOWN ? p.chunk : size - p.bytes;
        size_t want = (size_t)TS_MIN((uint64_t)p.chunk, left);
        if (put_room(c, &p))
            break;
        slot = (p.head + p.count) % p.nwin;
        if (!bufs[slot] && !(bufs[slot] = malloc(p.chunk))) {
            p.rc = TS_ENOMEM;
            break;
        }
        n = read_full(fd, bufs[slot], want);
        if (n < 0) {
            ts_conn_set_error(c, "cannot read the input: %s", ts_strerror((int)n));
            p.rc = (int)n;
            break;
        }
        ccrc = ts_crc32c(0, bufs[slot], (size_t)n);
        crc = ts_crc32c_combine(crc, ccrc, (uint64_t)n);
        got += (uint64_t)n;
        if (size != TS_SIZE_UNKNOWN && (size_t)n < want) {
            ts_conn_set_error(c, "the input ended after %llu of %llu bytes",
                              (unsigned long long)(p.bytes + (uint64_t)n),
                              (unsigned long long)size);
            p.rc = TS_EIO;
            break;
        }
        if (n == 0 && p.index > 0)
            break;
        if (p.index == UINT32_MAX) {
            ts_conn_set_error(c, "a shard has at most 2^32 chunks");
            p.rc = TS_ETOOBIG;
            break;
        }
        if (put_chunk(c, &p, bufs[slot], (uint32_t)n, ccrc))
            break;
        if ((size_t)n < want || (size != TS_SIZE_UNKNOWN && p.bytes == size))
            break;
    }
out_end:
    rc = put_end(c, &p, NULL, 0);
out_free:
    if (bufs)
        for (uint32_t i = 0; i < p.nwin; i++)
            free(bufs[i]);
    free(bufs);
    if (rc == TS_EEXIST)
        rc = put_fd_exists(c, name, shard, fd, size, got, crc);
    return rc;
}
