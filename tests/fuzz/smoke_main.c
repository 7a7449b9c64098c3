/*
 * fuzz_frame_smoke: a deterministic driver for LLVMFuzzerTestOneInput (fuzz_frame.c) that
 * needs no libFuzzer, so it runs in every build and in ctest.
 *
 *   fuzz_frame_smoke [-n MUTATIONS] [-s SEED]   seeds + MUTATIONS mutations (default 200000)
 *   fuzz_frame_smoke --corpus DIR               writes the seed frames to DIR (for libFuzzer)
 *   fuzz_frame_smoke FILE...                    replays inputs (e.g. a libFuzzer crash-* file)
 *
 * The seeds are valid frames built with the codec's writer: a request for every opcode (with
 * the optional trailing fields and every REPL_SEAL body layout), a success reply for every
 * client opcode, plus error replies. Each must decode cleanly (that checks the server's
 * decoders and the fuzz target's reply decoding against the codec); then each mutation
 * applies one to four edits chosen from bit
 * flips, interesting byte and integer values, truncations, insertions, deletions, splices
 * with another seed and random header lengths, from a fixed-seed PRNG.
 */
#include "ts_map.h"
#include "ts_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_frame_decode(const uint8_t *frame, size_t size);

#define MAX_INPUT 8192
#define MAX_SEEDS 96

struct seed {
    uint8_t *buf;
    size_t len;
    const char *what;
};

static struct seed seeds[MAX_SEEDS];
static size_t nseeds;

/* ---- seed frames ------------------------------------------------------------------------ */

static void add_seed(struct ts_wr *w, uint8_t op, uint16_t flags, const char *what)
{
    ts_wr_frame(w, op, flags, 0x1000 + nseeds, nseeds % 3);
    if (w->err || nseeds == MAX_SEEDS) {
        fprintf(stderr, "fuzz_frame_smoke: cannot build seed %s\n", what);
        exit(1);
    }
    seeds[nseeds].buf = malloc(w->len);
    if (!seeds[nseeds].buf)
        exit(1);
    memcpy(seeds[nseeds].buf, w->buf, w->len);
    seeds[nseeds].len = w->len;
    seeds[nseeds].what = what;
    nseeds++;
    ts_wr_begin_frame(w);
}

/* The dataset fields of REPL_WRITE and REPL_SEAL. */
static void wr_ds_fields(struct ts_wr *w)
{
    ts_wr_u8(w, 3);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 2);
    ts_wr_u32(w, 1u << 20);
    ts_wr_u8(w, 1); /* record format */
    ts_wr_u8(w, 0); /* replicated: no code, the replicas' bytes kept */
    ts_wr_u8(w, 0);
    ts_wr_u8(w, 0);
    ts_wr_u64(w, 1700000000000000000ull);
}

/* REPL_SEAL's fixed part: kind, PG, seq, epoch, name (or a zero u16), dataset fields, shard,
 * have CRC, CRC. */
static void wr_repl_seal_head(struct ts_wr *w, uint8_t kind, const char *name)
{
    ts_wr_u8(w, kind);
    ts_wr_u32(w, 17);
    ts_wr_u64(w, 42);
    ts_wr_u64(w, 3);
    ts_wr_str(w, name);
    wr_ds_fields(w);
    ts_wr_u32(w, 5);
    ts_wr_u8(w, 1);
    ts_wr_u32(w, 0xdeadbeefu);
}

/* The request variants beyond one per client opcode: optional trailing fields, maps and the
 * node-to-node requests. */
static void build_request_seeds(struct ts_wr *w, const char *name, const uint8_t *data, size_t len)
{
    struct ts_map_node nodes[2] = {
        {.id = "n1", .addr = "127.0.0.1:7101", .weight = 100, .domain = "rack-a"},
        {.id = "n2",
         .addr = "127.0.0.1:7102",
         .tls_addr = "127.0.0.1:7202",
         .weight = 50,
         .state = TS_NODE_DOWN},
    };
    struct ts_map map = {.epoch = 9, .pg_count = 64, .n = 2, .nodes = nodes};

    ts_wr_str(w, name);
    ts_wr_u8(w, 3);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 0);
    ts_wr_u32(w, 1u << 20);
    ts_wr_u64(w, 1700000000000000000ull);
    add_seed(w, TS_OP_DATASET_CREATE, 0, "dataset-create with incarnation");
    ts_wr_str(w, name);
    ts_wr_u8(w, 3);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 0);
    ts_wr_u32(w, 1u << 20);
    ts_wr_u64(w, 0);
    ts_wr_u8(w, 2);
    add_seed(w, TS_OP_DATASET_CREATE, 0, "dataset-create with record format");
    ts_wr_str(w, name);
    ts_wr_u8(w, TS_SEAL_LOCAL_ONLY);
    add_seed(w, TS_OP_DATASET_SEAL, 0, "dataset-seal local-only");
    add_seed(w, TS_OP_MAP_GET, 0, "map-get");
    ts_map_encode(w, &map);
    add_seed(w, TS_OP_MAP_PUSH, 0, "map-push");

    ts_wr_str(w, name);
    wr_ds_fields(w);
    ts_wr_u32(w, 5);
    ts_wr_u32(w, 0);
    ts_wr_u64(w, len);
    ts_wr_u32(w, ts_crc32c(0, data, len));
    ts_wr_u32(w, (uint32_t)len);
    ts_wr_bytes(w, data, len);
    add_seed(w, TS_OP_REPL_WRITE, 0, "repl-write");
    ts_wr_str(w, name); /* a dataset whose replicas' bytes are dropped: the chunk's record */
    ts_wr_u8(w, 3);
    ts_wr_u8(w, 0);
    ts_wr_u8(w, 2);
    ts_wr_u32(w, 1u << 20);
    ts_wr_u8(w, 0);
    ts_wr_u8(w, 4);
    ts_wr_u8(w, 2);
    ts_wr_u8(w, 1);
    ts_wr_u64(w, 1700000000000000000ull);
    ts_wr_u32(w, 5);
    ts_wr_u32(w, 0);
    ts_wr_u64(w, len);
    ts_wr_u32(w, ts_crc32c(0, data, len));
    ts_wr_u32(w, (uint32_t)len);
    add_seed(w, TS_OP_REPL_WRITE, 0, "repl-write of a chunk's record");
    ts_wr_str(w, name);
    ts_wr_u8(w, 4);
    ts_wr_u8(w, 2);
    ts_wr_u8(w, 1);
    add_seed(w, TS_OP_DATASET_TIER, 0, "dataset-tier ec 4+2, replica bytes dropped");
    wr_repl_seal_head(w, TS_REPL_SEAL, name);
    ts_wr_u32(w, 2);
    ts_wr_u64(w, 0);
    ts_wr_u64(w, 60);
    add_seed(w, TS_OP_REPL_SEAL, 0, "repl-seal seal");
    wr_repl_seal_head(w, TS_REPL_NOOP, "");
    ts_wr_u32(w, 0);
    add_seed(w, TS_OP_REPL_SEAL, 0, "repl-seal no-op");
    wr_repl_seal_head(w, TS_REPL_DELETE, name);
    ts_wr_u32(w, 0);
    add_seed(w, TS_OP_REPL_SEAL, 0, "repl-seal delete");
    wr_repl_seal_head(w, TS_REPL_PRUNE, "");
    ts_wr_u32(w, 3);
    ts_wr_str(w, name);
    ts_wr_u64(w, 1700000000000000000ull);
    ts_wr_u8(w, 0);
    ts_wr_str(w, "gone");
    ts_wr_u64(w, 1600000000000000000ull);
    ts_wr_u8(w, 1);
    ts_wr_str(w, "");
    ts_wr_u64(w, 0);
    ts_wr_u8(w, 1);
    add_seed(w, TS_OP_REPL_SEAL, 0, "repl-seal prune");
    wr_repl_seal_head(w, TS_REPL_ABORT, name);
    ts_wr_u32(w, 0);
    add_seed(w, TS_OP_REPL_SEAL, 0, "repl-seal abort");

    ts_wr_u32(w, 17);
    add_seed(w, TS_OP_PG_INFO, 0, "pg-info");
    ts_wr_u32(w, 17);
    ts_wr_u64(w, 9);
    ts_wr_str(w, "n1");
    add_seed(w, TS_OP_PG_QUERY, 0, "pg-query");
    ts_wr_u32(w, 17);
    ts_wr_u64(w, 9);
    ts_wr_u8(w, 0);
    ts_wr_u8(w, 2);
    ts_wr_u8(w, 3);
    ts_wr_str(w, "n1");
    ts_wr_str(w, "n2");
    ts_wr_str(w, "n3");
    ts_wr_u64(w, 8);
    ts_wr_u64(w, 41);
    ts_wr_u8(w, 1);
    add_seed(w, TS_OP_PG_ACTIVATE, 0, "pg-activate");
    ts_wr_u32(w, 17); /* commit, with the largest acting set (8: one more is refused) */
    ts_wr_u64(w, 9);
    ts_wr_u8(w, 1);
    ts_wr_u8(w, 5);
    ts_wr_u8(w, 8);
    for (int i = 0; i < 8; i++)
        ts_wr_str(w, i % 2 ? "node-b" : "n");
    ts_wr_u64(w, 0);
    ts_wr_u64(w, 0);
    ts_wr_u8(w, 0);
    add_seed(w, TS_OP_PG_ACTIVATE, 0, "pg-activate commit, 8 members");
    ts_wr_u32(w, 17);
    ts_wr_u64(w, 9);
    ts_wr_str(w, "n2");
    ts_wr_u8(w, 1);
    add_seed(w, TS_OP_PG_PULL, 0, "pg-pull");
    ts_wr_u32(w, 17);
    ts_wr_u8(w, 2);
    add_seed(w, TS_OP_PG_INVENTORY, 0, "pg-inventory");
}

static void build_seeds(void)
{
    static const struct ts_dataset_info ds = {
        .name = "imagenet-1k.train",
        .id = 42,
        .policy = {.core = 3, .fringe = 1, .min_core = 2, .chunk_size = 1u << 20},
        .state = TS_DS_OPEN,
        .created_ns = 1700000000000000000ull,
        .shards = 12,
        .shards_writing = 1,
        .bytes = 12u << 20,
    };
    static const struct ts_shard_info sh = {
        .shard = 5,
        .state = TS_SHARD_COMPLETE,
        .size = 100,
        .expect_size = 100,
        .chunk_size = 4096,
        .nchunks = 1,
        .crc = 0x12345678u,
        .nrecords = 3,
    };
    uint8_t data[100];
    struct ts_wr w;

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7 + 1);
    ts_wr_init(&w);
    ts_wr_begin_frame(&w);

    /* Requests. */
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, "fuzz-client/1.0");
    add_seed(&w, TS_OP_HELLO, 0, "hello");
    ts_wr_str(&w, ds.name);
    ts_wr_u8(&w, 3);
    ts_wr_u8(&w, 1);
    ts_wr_u8(&w, 2);
    ts_wr_u32(&w, 0);
    add_seed(&w, TS_OP_DATASET_CREATE, 0, "dataset-create");
    add_seed(&w, TS_OP_DATASET_LIST, 0, "dataset-list");
    ts_wr_str(&w, ds.name);
    add_seed(&w, TS_OP_DATASET_STAT, 0, "dataset-stat");
    ts_wr_str(&w, ds.name);
    add_seed(&w, TS_OP_DATASET_SEAL, 0, "dataset-seal");
    ts_wr_str(&w, ds.name);
    add_seed(&w, TS_OP_DATASET_DELETE, 0, "dataset-delete");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, sizeof(data));
    ts_wr_u32(&w, ts_crc32c(0, data, sizeof(data)));
    ts_wr_u32(&w, sizeof(data));
    ts_wr_bytes(&w, data, sizeof(data));
    add_seed(&w, TS_OP_SHARD_WRITE, 0, "shard-write");
    ts_wr_str(&w, ds.name); /* an empty shard: chunk 0 without data */
    ts_wr_u32(&w, 6);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, 0);
    ts_wr_u32(&w, ts_crc32c(0, NULL, 0));
    ts_wr_u32(&w, 0);
    add_seed(&w, TS_OP_SHARD_WRITE, 0, "shard-write empty");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    ts_wr_u8(&w, 1);
    ts_wr_u32(&w, ts_crc32c(0, data, sizeof(data)));
    ts_wr_u32(&w, 3);
    ts_wr_u64(&w, 0);
    ts_wr_u64(&w, 10);
    ts_wr_u64(&w, 60);
    add_seed(&w, TS_OP_SHARD_SEAL, 0, "shard-seal");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    ts_wr_u64(&w, 10);
    ts_wr_u32(&w, 4096);
    add_seed(&w, TS_OP_READ, 0, "read");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 2);
    for (uint32_t i = 0; i < 2; i++) {
        ts_wr_u32(&w, 5 + i);
        ts_wr_u64(&w, 10 + 4096 * i);
        ts_wr_u32(&w, 4096);
    }
    add_seed(&w, TS_OP_READV, 0, "readv");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 1);
    ts_wr_u32(&w, 5);
    ts_wr_u64(&w, 0);
    ts_wr_u32(&w, 1 << 20);
    add_seed(&w, TS_OP_HINT, 0, "hint");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    add_seed(&w, TS_OP_SHARD_STAT, 0, "shard-stat");
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    add_seed(&w, TS_OP_SHARD_RECORDS, 0, "shard-records");
    ts_wr_str(&w, ds.name);
    add_seed(&w, TS_OP_SHARD_LIST, 0, "shard-list");
    ts_wr_str(&w, "");
    add_seed(&w, TS_OP_SCRUB, 0, "scrub-all");
    ts_wr_str(&w, ds.name);
    add_seed(&w, TS_OP_SCRUB, 0, "scrub");
    add_seed(&w, TS_OP_STATUS, 0, "status");
    build_request_seeds(&w, ds.name, data, sizeof(data));

    /* Success replies. */
    ts_wr_u32(&w, 0);
    ts_wr_u16(&w, TS_PROTO_VERSION);
    ts_wr_str(&w, "node-a");
    ts_wr_u8(&w, TS_ROLE_WRITER);
    ts_wr_u32(&w, TS_MAX_CHUNK + 4096);
    ts_wr_u64(&w, 7);
    add_seed(&w, TS_OP_HELLO, TS_F_REPLY, "hello reply");
    ts_wr_u32(&w, 0);
    add_seed(&w, TS_OP_DATASET_CREATE, TS_F_REPLY, "dataset-create reply");
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 2);
    ts_wr_dataset_info(&w, &ds);
    ts_wr_dataset_info(&w, &ds);
    add_seed(&w, TS_OP_DATASET_LIST, TS_F_REPLY, "dataset-list reply");
    ts_wr_u32(&w, 0);
    ts_wr_dataset_info(&w, &ds);
    add_seed(&w, TS_OP_DATASET_STAT, TS_F_REPLY, "dataset-stat reply");
    ts_wr_u32(&w, 0);
    add_seed(&w, TS_OP_DATASET_SEAL, TS_F_REPLY, "dataset-seal reply");
    ts_wr_u32(&w, 0);
    add_seed(&w, TS_OP_DATASET_DELETE, TS_F_REPLY, "dataset-delete reply");
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, sizeof(data));
    add_seed(&w, TS_OP_SHARD_WRITE, TS_F_REPLY, "shard-write reply");
    ts_wr_u32(&w, 0);
    ts_wr_shard_info(&w, &sh);
    add_seed(&w, TS_OP_SHARD_SEAL, TS_F_REPLY, "shard-seal reply");
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, sizeof(data));
    ts_wr_u32(&w, 2);
    ts_wr_u32(&w, 60);
    ts_wr_u32(&w, ts_crc32c(0, data, 60));
    ts_wr_u32(&w, 30);
    ts_wr_u32(&w, ts_crc32c(0, data + 60, 30));
    ts_wr_bytes(&w, data, 90);
    add_seed(&w, TS_OP_READ, TS_F_REPLY, "read reply");
    ts_wr_u32(&w, 0);
    ts_wr_shard_info(&w, &sh);
    add_seed(&w, TS_OP_SHARD_STAT, TS_F_REPLY, "shard-stat reply");
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, 2);
    ts_wr_shard_info(&w, &sh);
    ts_wr_shard_info(&w, &sh);
    add_seed(&w, TS_OP_SHARD_LIST, TS_F_REPLY, "shard-list reply");
    ts_wr_u32(&w, 0);
    ts_wr_u64(&w, 12);
    ts_wr_u64(&w, 12);
    ts_wr_u64(&w, 12u << 20);
    ts_wr_u64(&w, 1);
    ts_wr_u32(&w, 1);
    ts_wr_str(&w, ds.name);
    ts_wr_u32(&w, 5);
    ts_wr_u32(&w, 0);
    ts_wr_u32(&w, (uint32_t)TS_ECORRUPT);
    add_seed(&w, TS_OP_SCRUB, TS_F_REPLY, "scrub reply");
    ts_wr_u32(&w, 0);
    ts_wr_str(&w, "{\"version\":\"0.1.0\",\"datasets\":1}");
    add_seed(&w, TS_OP_STATUS, TS_F_REPLY, "status reply");

    /* Error replies, among them the one sent for broken framing (request id 0). */
    ts_wr_u32(&w, (uint32_t)TS_ENOENT);
    ts_wr_str(&w, "no such dataset");
    add_seed(&w, TS_OP_DATASET_STAT, TS_F_REPLY, "error reply");
    ts_wr_u32(&w, (uint32_t)TS_EPROTO);
    ts_wr_str(&w, "bad header CRC");
    add_seed(&w, TS_OP_HELLO, TS_F_REPLY, "framing error reply");

    ts_wr_fini(&w);

    for (size_t i = 0; i < nseeds; i++) {
        int rc = fuzz_frame_decode(seeds[i].buf, seeds[i].len);
        if (rc != 0) {
            fprintf(stderr, "fuzz_frame_smoke: seed '%s' does not decode: %s (%d)\n", seeds[i].what,
                    ts_errname(rc), rc);
            exit(1);
        }
    }
}

/* ---- deterministic mutations ------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(size_t n) /* 0..n-1; 0 when n is 0 */
{
    return n ? (size_t)(rnd() % n) : 0;
}

static uint64_t interesting(size_t len)
{
    /* Counts (8 and 9: PG_ACTIVATE's acting set) and name lengths, u16 edges, 64 KiB + 1;
     * 64 MiB (+1), u32 and u64 edges. */
    static const uint64_t small[] = {0,      1,      2,      7,       8,      9,    127,
                                     128,    129,    255,    256,     1000,   1001, 4096,
                                     0x7fff, 0x8000, 0xffff, 0x10000, 0x10001};
    static const uint64_t large[] = {0x4000000,  0x4000001,   0x7fffffff, 0x80000000,
                                     0xffffffff, 0x100000000, INT64_MAX,  UINT64_MAX};
    size_t ns = sizeof(small) / sizeof(small[0]), nl = sizeof(large) / sizeof(large[0]);
    size_t i = below(ns + nl + 3);

    if (i < ns)
        return small[i];
    if (i < ns + nl)
        return large[i - ns];
    if (i == ns + nl)
        return len; /* lengths near the real ones */
    if (i == ns + nl + 1)
        return len > 0 ? len - 1 : 0;
    return rnd();
}

/* One random edit of buf[0..*len) in place (capacity MAX_INPUT). */
static void mutate_once(uint8_t *buf, size_t *len)
{
    size_t n = *len, at, k;
    uint64_t v;

    switch (below(10)) {
    case 0: /* bit flip */
        if (n)
            buf[below(n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* interesting or random byte */
        if (n)
            buf[below(n)] = (uint8_t)(below(2) ? interesting(n) : rnd());
        break;
    case 2: /* truncation */
        *len = below(n + 1);
        break;
    case 3: { /* splice: our prefix, another seed's suffix */
        const struct seed *o = &seeds[below(nseeds)];
        size_t cut = below(n + 1), from = below(o->len + 1);
        k = TS_MIN(o->len - from, (size_t)MAX_INPUT - cut);
        memcpy(buf + cut, o->buf + from, k);
        *len = cut + k;
        break;
    }
    case 4: /* insert random bytes */
        k = 1 + below(16);
        if (n + k > MAX_INPUT)
            break;
        at = below(n + 1);
        memmove(buf + at + k, buf + at, n - at);
        for (size_t i = 0; i < k; i++)
            buf[at + i] = (uint8_t)rnd();
        *len = n + k;
        break;
    case 5: /* delete a range */
        if (!n)
            break;
        at = below(n);
        k = 1 + below(TS_MIN(n - at, (size_t)32));
        memmove(buf + at, buf + at + k, n - at - k);
        *len = n - k;
        break;
    case 6: { /* an integer of 2, 4 or 8 bytes at any offset: string lengths, counts */
        size_t width = (size_t)1 << (1 + below(3));
        if (n < width)
            break;
        at = below(n - width + 1);
        v = interesting(n - at);
        for (size_t i = 0; i < width; i++)
            buf[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 7: /* grow to a random length with random bytes */
        k = below(MAX_INPUT + 1);
        for (size_t i = n; i < k; i++)
            buf[i] = (uint8_t)rnd();
        if (k > n)
            *len = k;
        break;
    case 8: /* random header length field */
        if (n >= TS_HDR_LEN)
            ts_put_le32(buf + 24, (uint32_t)interesting(n - TS_HDR_LEN));
        break;
    case 9: /* a different opcode or flags in an otherwise valid header */
        if (n >= TS_HDR_LEN) {
            if (below(2))
                buf[5] = (uint8_t)(below(4) ? below(TS_OP_MAX + 1) : rnd());
            else
                ts_put_le16(buf + 6, (uint16_t)(below(2) ? TS_F_REPLY : rnd()));
            ts_put_le32(buf + 28, ts_crc32c(0, buf, 28));
        }
        break;
    }
}

/* ---- modes ------------------------------------------------------------------------------ */

static int write_corpus(const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_frame_smoke: mkdir %s: %s\n", dir, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < nseeds; i++) {
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s/seed-%02zu", dir, i);
        f = fopen(path, "wb");
        if (!f || fwrite(seeds[i].buf, 1, seeds[i].len, f) != seeds[i].len || fclose(f) != 0) {
            fprintf(stderr, "fuzz_frame_smoke: cannot write %s\n", path);
            return 1;
        }
    }
    printf("fuzz_frame_smoke: wrote %zu seed frames to %s\n", nseeds, dir);
    return 0;
}

static int replay(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        struct stat st;
        uint8_t *buf;
        size_t n;

        if (!f || fstat(fileno(f), &st) != 0) {
            fprintf(stderr, "fuzz_frame_smoke: %s: %s\n", argv[i], strerror(errno));
            if (f)
                fclose(f);
            return 1;
        }
        /* Exactly the file's size, as libFuzzer hands it over. */
        buf = malloc(st.st_size ? (size_t)st.st_size : 1);
        if (!buf) {
            fclose(f);
            return 1;
        }
        n = fread(buf, 1, (size_t)st.st_size, f);
        fclose(f);
        printf("fuzz_frame_smoke: %s: %zu bytes, decode: %s\n", argv[i], n,
               ts_errname(fuzz_frame_decode(buf, n)));
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: fuzz_frame_smoke [-n MUTATIONS] [-s SEED] | --corpus DIR | FILE...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static uint8_t buf[MAX_INPUT];
    unsigned long long iterations = 200000, rng_seed = 0x7e55e7a5eedull;
    unsigned long long decoded = 0, by_rc[64] = {0};
    int i;

    build_seeds();
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            iterations = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            rng_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc)
            return write_corpus(argv[i + 1]);
        else
            usage();
    }
    if (i < argc)
        return replay(argc - i, argv + i);

    for (size_t s = 0; s < nseeds; s++)
        LLVMFuzzerTestOneInput(seeds[s].buf, seeds[s].len);

    rng_state = rng_seed;
    for (unsigned long long it = 0; it < iterations; it++) {
        const struct seed *s = &seeds[below(nseeds)];
        size_t len = s->len, edits = 1 + below(4);
        int rc;

        memcpy(buf, s->buf, len);
        for (size_t e = 0; e < edits; e++)
            mutate_once(buf, &len);
        LLVMFuzzerTestOneInput(buf, len);

        /* How far mutations get: results of decoding the input with its CRC repaired. */
        if (len >= TS_HDR_LEN)
            ts_put_le32(buf + 28, ts_crc32c(0, buf, 28));
        rc = fuzz_frame_decode(buf, len);
        decoded += rc == 0;
        by_rc[-rc < 64 ? -rc : 0]++;
    }

    printf("fuzz_frame_smoke: %zu seeds and %llu mutations (seed %#llx): no invariant failed\n",
           nseeds, iterations, rng_seed);
    printf("  with the CRC repaired: %llu decoded cleanly", decoded);
    for (int e = 1; e < 64; e++)
        if (by_rc[e])
            printf(", %llu %s", by_rc[e], ts_errname(-e));
    printf("\n");
    return 0;
}
