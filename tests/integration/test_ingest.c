/*
 * `tessera ingest` as a user runs it, against a real tesserad: TFRecord files split into N
 * shards of contiguous records (floor(R/N) + (i < R mod N) each, none lost, none twice, byte for
 * byte, with their record index); run again, every shard is found sealed and skipped (resume);
 * a damaged file is refused with its name and reason and nothing of it is uploaded; JSON lines
 * one shard per file.
 */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tessera/reader.h"
#include "tessera/records.h"
#include "tessera/tessera.h"
#include "ts_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifndef TESSERA_CLI_PATH
#error "TESSERA_CLI_PATH must be defined by the build"
#endif

static struct tsd_proc D;
static char dir[600];

static uint32_t tf_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* Writes a TFRecord file of n records (record k holds k+base repeated) and appends every
 * record's framed bytes to all (*alen). */
static void write_tfrecords(const char *path, int n, int base, uint8_t *all, size_t *alen)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int k = 0; k < n; k++) {
        uint8_t data[300], h[12], t[4];
        size_t len = 20 + (size_t)((k + base) * 37 % 250);
        memset(data, 'a' + (k + base) % 26, len);
        ts_put_le64(h, len);
        ts_put_le32(h + 8, tf_mask(ts_crc32c(0, h, 8)));
        ts_put_le32(t, tf_mask(ts_crc32c(0, data, len)));
        fwrite(h, 1, 12, f);
        fwrite(data, 1, len, f);
        fwrite(t, 1, 4, f);
        memcpy(all + *alen, h, 12);
        memcpy(all + *alen + 12, data, len);
        memcpy(all + *alen + 12 + len, t, 4);
        *alen += 16 + len;
    }
    fclose(f);
}

/* Runs the CLI with args against D; its exit status; its stderr into err (cap bytes). */
static int cli(const char *args, char *err, size_t cap)
{
    char cmd[4096], errpath[700];
    FILE *f;
    int st;

    snprintf(errpath, sizeof(errpath), "%s/cli.err", dir);
    snprintf(cmd, sizeof(cmd), "cd %s && %s -s %s %s >/dev/null 2>%s", dir, TESSERA_CLI_PATH,
             D.addr, args, errpath);
    st = system(cmd);
    if (err) {
        size_t n = 0;
        f = fopen(errpath, "r");
        if (f) {
            n = fread(err, 1, cap - 1, f);
            fclose(f);
        }
        err[n] = '\0';
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `tessera plan` (no server needed) prints what the library's plan says. */
static void test_plan_command(void **state)
{
    char cmd[1024], out[512] = "";
    FILE *f;

    (void)state;
    snprintf(cmd, sizeof(cmd), "%s plan 10 3 4 --assign strided --remainder pad", TESSERA_CLI_PATH);
    f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, sizeof(out), f));
    assert_int_equal(pclose(f), 0);
    assert_string_equal(out, "rank 3 of 4 reads 3 of 10 units: 3 7 1\n");
}

static int setup(void **state)
{
    const char *tmp = getenv("TMPDIR");

    (void)state;
    snprintf(dir, sizeof(dir), "%s/tessera-ingest-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return -1;
    return tsd_start(&D, NULL);
}

static int teardown(void **state)
{
    char cmd[700];
    (void)state;
    tsd_stop(&D);
    tsd_cleanup(&D);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static tessera_client *client(void)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tessera_opts_init(&o);
    o.address = D.addr;
    assert_int_equal(tessera_client_open(&c, &o), 0);
    return c;
}

static void test_tfrecord_split_and_resume(void **state)
{
    static uint8_t all[64 << 10], back[64 << 10];
    size_t alen = 0, at = 0;
    char path[700], err[4096], args[2048];
    const int per_file[] = {7, 8, 10}; /* R = 25 over N = 4 shards: 7, 6, 6, 6 */
    tessera_client *c;
    int base = 0;

    (void)state;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/f%d.tfrecord", dir, i);
        write_tfrecords(path, per_file[i], base, all, &alen);
        base += per_file[i];
    }
    snprintf(args, sizeof(args),
             "ingest tfrecord f0.tfrecord f1.tfrecord f2.tfrecord "
             "--dataset tf --shards 4");
    assert_int_equal(cli(args, err, sizeof(err)), 0);
    c = client();
    for (uint32_t s = 0; s < 4; s++) {
        struct ts_shard_info si;
        size_t n;
        assert_int_equal(tessera_shard_stat(c, "tf", s, &si), 0);
        assert_int_equal(si.nrecords, s == 0 ? 7 : 6);
        assert_int_equal(tessera_read(c, "tf", s, 0, si.size, back, &n), 0);
        assert_int_equal(n, si.size);
        assert_memory_equal(back, all + at, n); /* contiguous records, in order */
        at += n;
    }
    assert_int_equal(at, alen); /* none lost, none twice */
    /* Again: every shard is already sealed with these bytes. */
    assert_int_equal(cli(args, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "25/25 records"));
    /* Each shard's record index from the node: 7, 6, 6, 6 records, starting at 0. */
    {
        uint64_t *offs;
        uint32_t n;
        assert_int_equal(tessera_shard_records(c, "tf", 1, &offs, &n), 0);
        assert_int_equal(n, 6);
        assert_true(offs[0] == 0);
        free(offs);
    }
    /* `tessera records tf --range 5:9 -o FILE`: records 5..8 (across shards 0 and 1), byte
     * for byte as they were in the input files. */
    {
        uint8_t got[8192];
        size_t glen = 0, start = 0;
        int k = 0;
        FILE *f;
        assert_int_equal(cli("records tf --range 5:9 -o recs.bin", err, sizeof(err)), 0);
        snprintf(path, sizeof(path), "%s/recs.bin", dir);
        f = fopen(path, "rb");
        assert_non_null(f);
        glen = fread(got, 1, sizeof(got), f);
        fclose(f);
        /* Walk the input's records to the 5th; records 5..8 follow. */
        for (size_t off = 0; k <= 9 && off < alen; k++) {
            if (k == 5)
                start = off;
            if (k == 9) {
                assert_int_equal(glen, off - start);
                assert_memory_equal(got, all + start, glen);
            }
            off += 16 + ts_get_le64(all + off);
        }
        assert_int_equal(k, 10);
    }
    tessera_client_close(c);
}

static void *plain_alloc(void *arg, size_t len)
{
    (void)arg;
    return malloc(len ? len : 1);
}

static void plain_free(void *arg, void *p)
{
    (void)arg;
    free(p);
}

/* The ingested TFRecord dataset says its format, so a reader hands out each record's data (the
 * payload: what TFRecordDataset gives) unless asked for the framed bytes; with caller-owned
 * buffers the payload lies 12 bytes into u.buffer, which is what the caller frees. */
static void test_reader_hands_out_payloads(void **state)
{
    for (int form = TESSERA_RECORD_AUTO; form <= TESSERA_RECORD_PAYLOAD; form++) {
        struct tessera_opts co;
        struct tessera_reader_opts ro;
        struct tessera_unit u;
        tessera_reader *r = NULL;
        char err[256];
        uint64_t i = 0;

        (void)state;
        tessera_opts_init(&co);
        co.address = D.addr;
        tessera_reader_opts_init(&ro);
        ro.dataset = "tf";
        ro.unit = TESSERA_UNIT_RECORD;
        ro.record = form;
        if (form == TESSERA_RECORD_AUTO) {
            ro.alloc = plain_alloc;
            ro.free_fn = plain_free;
        }
        assert_int_equal(tessera_reader_open(&r, &co, &ro, err, sizeof(err)), 0);
        for (; tessera_reader_next(r, &u) == 1; i++) {
            size_t n = 20 + (size_t)(i * 37 % 250);
            const uint8_t *data = u.data;
            if (form == TESSERA_RECORD_FRAMED) {
                assert_int_equal(u.len, n + 16);
                assert_true(ts_get_le64(data) == n);
                data += 12;
            } else {
                assert_int_equal(u.len, n);
                assert_ptr_equal(u.data, (uint8_t *)u.buffer + 12);
            }
            for (size_t b = 0; b < n; b++)
                assert_int_equal(data[b], 'a' + i % 26);
            if (form == TESSERA_RECORD_AUTO)
                free(u.buffer);
        }
        assert_true(i == 25);
        tessera_reader_close(r);
    }
}

/* A plan over the records of the ingested dataset (WINDOW shuffle over its shards, 3 ranks):
 * every record is read exactly once, located through the dataset's record map and its shard's
 * index, and holds the input's bytes. */
static void test_plan_over_records(void **state)
{
    static uint8_t all[64 << 10], got[4096];
    size_t alen = 0, at = 0;
    uint64_t offs_in[64];
    int seen[25] = {0}, nin = 0;
    struct tessera_dataset_records *dr;
    tessera_client *c = client();
    char path[700];

    (void)state;
    /* The same records test_tfrecord_split_and_resume wrote, in the same order. */
    for (int i = 0, base = 0; i < 3; i++) {
        const int per_file[] = {7, 8, 10};
        snprintf(path, sizeof(path), "%s/again%d.tfrecord", dir, i);
        write_tfrecords(path, per_file[i], base, all, &alen);
        base += per_file[i];
    }
    while (at < alen) {
        offs_in[nin++] = at;
        at += 16 + ts_get_le64(all + at);
    }
    offs_in[nin] = alen;
    assert_int_equal(nin, 25);
    assert_int_equal(tessera_dataset_records(c, "tf", &dr), 0);
    assert_true(dr->total == 25 && dr->nshards == 4);
    for (uint32_t rank = 0; rank < 3; rank++) {
        struct tessera_plan_opts o;
        tessera_plan *p;
        tessera_plan_opts_init(&o);
        o.units = dr->total;
        o.group_sizes = dr->count;
        o.ngroups = dr->nshards;
        o.shuffle = TESSERA_SHUFFLE_WINDOW;
        o.window = 2;
        o.seed = 5;
        o.rank = rank;
        o.world = 3;
        assert_int_equal(tessera_plan_new(&p, &o), 0);
        for (uint64_t k = 0; k < tessera_plan_len(p); k++) {
            uint64_t u, idx, *recs, end;
            uint32_t shard, nr;
            struct ts_shard_info si;
            size_t n;
            assert_int_equal(tessera_plan_unit(p, k, &u), 0);
            assert_int_equal(tessera_dataset_record_at(dr, u, &shard, &idx), 0);
            assert_int_equal(tessera_shard_records(c, "tf", shard, &recs, &nr), 0);
            assert_int_equal(tessera_shard_stat(c, "tf", shard, &si), 0);
            end = idx + 1 < nr ? recs[idx + 1] : si.size;
            assert_int_equal(tessera_read(c, "tf", shard, recs[idx], end - recs[idx], got, &n), 0);
            assert_int_equal(n, offs_in[u + 1] - offs_in[u]);
            assert_memory_equal(got, all + offs_in[u], n);
            seen[u]++;
            free(recs);
        }
        tessera_plan_free(p);
    }
    for (int u = 0; u < 25; u++)
        assert_int_equal(seen[u], 1);
    tessera_dataset_records_free(dr);
    tessera_client_close(c);
}

static void test_damaged_file_refused(void **state)
{
    char path[700], err[4096];
    FILE *f;
    struct ts_dataset_info di;
    tessera_client *c;
    size_t alen = 0;
    static uint8_t all[64 << 10];

    (void)state;
    snprintf(path, sizeof(path), "%s/bad.tfrecord", dir);
    write_tfrecords(path, 5, 100, all, &alen);
    f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 12 + 5, SEEK_SET); /* a data byte of record 0 */
    fputc('#', f);
    fclose(f);
    assert_true(cli("ingest tfrecord f0.tfrecord bad.tfrecord --dataset tf2", err, sizeof(err)) !=
                0);
    fprintf(stderr, "  %s", err);
    assert_non_null(strstr(err, "bad.tfrecord"));
    assert_non_null(strstr(err, "CRC of its data"));
    assert_non_null(strstr(err, "nothing of it was uploaded"));
    c = client();
    assert_int_equal(tessera_dataset_stat(c, "tf2", &di), TS_ENOENT); /* nothing at all */
    tessera_client_close(c);
}

static void test_jsonl_one_shard_per_file(void **state)
{
    char path[700], err[4096];
    struct ts_shard_info si;
    tessera_client *c;
    FILE *f;

    (void)state;
    snprintf(path, sizeof(path), "%s/a.jsonl", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"x\": 1}\n{\"x\": 2}\n\n{\"x\": 3}\n", f);
    fclose(f);
    assert_int_equal(cli("ingest jsonl a.jsonl --dataset js", err, sizeof(err)), 0);
    c = client();
    assert_int_equal(tessera_shard_stat(c, "js", 0, &si), 0);
    assert_int_equal(si.nrecords, 3);
    /* A line that is not JSON: refused, naming the record, nothing uploaded. */
    snprintf(path, sizeof(path), "%s/b.jsonl", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"x\": 1}\n{\"x\": 2,\n{\"x\": 3}\n", f);
    fclose(f);
    assert_true(cli("ingest jsonl b.jsonl --dataset js2", err, sizeof(err)) != 0);
    fprintf(stderr, "  %s", err);
    assert_non_null(strstr(err, "record 1 at offset 9"));
    assert_int_equal(tessera_shard_stat(c, "js2", 0, &si), TS_ENOENT);
    tessera_client_close(c);
}

/* Runs sh -c cmd in dir; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "cd %s && ", dir), st;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cmd + n, sizeof(cmd) - (size_t)n, fmt, ap);
    va_end(ap);
    st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Issue 28, part 3: shards that span input files are valid on their own. Two GNU tar files of
 * 20 samples (2 members each) into 1 and into 3 shards: every shard lists with `tar t` and
 * Python's tarfile, and together they hold all 80 members (before, a merged shard kept the
 * first file's end-of-archive blocks in its middle: `tar t` saw 20 of 40 samples). A JSON lines
 * file without a final newline merged with another: every line is one JSON value. */
static void test_merged_shards_are_valid_archives(void **state)
{
    char err[4096];
    tessera_client *c;
    struct ts_shard_info si;
    uint8_t back[256];
    size_t n;

    (void)state;
    assert_int_equal(sh("mkdir -p t1 t2 && for i in $(seq 100 119); do echo a$i >t1/$i.txt; "
                        "echo $i >t1/$i.cls; echo b$i >t2/$i.txt; echo $i >t2/$i.cls; done && "
                        "(cd t1 && tar cf ../t1.tar --sort=name *) && "
                        "(cd t2 && tar cf ../t2.tar --sort=name *)"),
                     0);
    assert_int_equal(cli("ingest tar t1.tar t2.tar --dataset tar1 --shards 1", err, sizeof(err)),
                     0);
    assert_int_equal(cli("ingest tar t1.tar t2.tar --dataset tar3 --shards 3", err, sizeof(err)),
                     0);
    assert_int_equal(cli("get tar1 0 -o m.tar", err, sizeof(err)), 0);
    assert_int_equal(sh("test $(tar tf m.tar | wc -l) -eq 80"), 0);
    assert_int_equal(sh("/usr/bin/python3 -c 'import tarfile,sys; "
                        "sys.exit(len(tarfile.open(\"m.tar\").getnames()) != 80)'"),
                     0);
    for (int s = 0; s < 3; s++)
        assert_int_equal(cli(s == 0   ? "get tar3 0 -o s0.tar"
                             : s == 1 ? "get tar3 1 -o s1.tar"
                                      : "get tar3 2 -o s2.tar",
                             err, sizeof(err)),
                         0);
    assert_int_equal(sh("test $(cat s0.tar s1.tar s2.tar | tar tif - | wc -l) -eq 80 && "
                        "for s in s0 s1 s2; do test $(tar tf $s.tar | wc -l) -gt 20 || exit 1; "
                        "done"),
                     0);

    assert_int_equal(sh("printf '{\"x\": 1}\\n{\"x\": 2}' >n1.jsonl && "
                        "printf '{\"x\": 3}\\n\\n' >n2.jsonl"),
                     0);
    assert_int_equal(
        cli("ingest jsonl n1.jsonl n2.jsonl --dataset js3 --shards 1", err, sizeof(err)), 0);
    c = client();
    assert_int_equal(tessera_shard_stat(c, "js3", 0, &si), 0);
    assert_int_equal(si.nrecords, 3);
    assert_int_equal(tessera_read(c, "js3", 0, 0, si.size, back, &n), 0);
    back[n] = '\0';
    assert_string_equal((char *)back, "{\"x\": 1}\n{\"x\": 2}\n{\"x\": 3}\n");
    tessera_client_close(c);
}

/* `tessera --json records` prints one JSON document (issue 28: it printed the table); the
 * dataset says the format ingest gave it, and ingest --seal seals it. */
static void test_records_json_and_format(void **state)
{
    char err[4096];

    (void)state;
    assert_int_equal(sh("printf '{\"x\": 1}\\n{\"x\": 22}\\n' >j.jsonl"), 0);
    assert_int_equal(cli("ingest jsonl j.jsonl --dataset jsj --seal", err, sizeof(err)), 0);
    assert_int_equal(sh("%s -s %s --json records jsj >rec.json && /usr/bin/python3 -c '"
                        "import json; d = json.load(open(\"rec.json\")); "
                        "assert d[\"record_format\"] == \"jsonl\", d; "
                        "assert [(r[\"record\"], r[\"shard\"], r[\"offset\"], r[\"length\"]) "
                        "for r in d[\"records\"]] == [(0, 0, 0, 9), (1, 0, 9, 10)], d'",
                        TESSERA_CLI_PATH, D.addr),
                     0);
    assert_int_equal(sh("%s -s %s --json dataset stat jsj | /usr/bin/python3 -c '"
                        "import json, sys; d = json.load(sys.stdin); "
                        "assert d[\"record_format\"] == \"jsonl\" and d[\"state\"] == "
                        "\"sealed\", d'",
                        TESSERA_CLI_PATH, D.addr),
                     0);
    /* Another format into it is refused, and nothing is uploaded. */
    assert_int_equal(sh("printf '\\002\\000\\000\\000hi' "
                        ">l.len32"),
                     0);
    assert_true(cli("ingest len32 l.len32 --dataset jsj", err, sizeof(err)) != 0);
    assert_non_null(strstr(err, "holds jsonl records, not len32"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tfrecord_split_and_resume),
        cmocka_unit_test(test_plan_over_records),
        cmocka_unit_test(test_reader_hands_out_payloads),
        cmocka_unit_test(test_damaged_file_refused),
        cmocka_unit_test(test_jsonl_one_shard_per_file),
        cmocka_unit_test(test_merged_shards_are_valid_archives),
        cmocka_unit_test(test_records_json_and_format),
        cmocka_unit_test(test_plan_command),
    };
    int rc = cmocka_run_group_tests_name("ingest", tests, setup, teardown);
    if (rc)
        tsd_dump_log(&D);
    return rc;
}
