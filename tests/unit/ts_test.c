#include "ts_test.h"

#include "ts_common.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

char *ts_test_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *path;

    if (!base || !*base)
        base = "/tmp";
    if (asprintf(&path, "%s/tessera-%s-XXXXXX", base, tag) < 0)
        return NULL;
    if (!mkdtemp(path)) {
        free(path);
        return NULL;
    }
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    remove(p);
    return 0;
}

void ts_test_rmtree(char *path)
{
    if (!path)
        return;
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(path);
}

void ts_test_fill(void *buf, size_t len, uint64_t seed, uint64_t offset)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        uint64_t x = (offset + i) * 0x9E3779B97F4A7C15ull ^ seed * 0xC2B2AE3D27D4EB4Full;
        x ^= x >> 29;
        p[i] = (uint8_t)(x ^ (x >> 17));
    }
}

void ts_test_log_init(void)
{
    const char *lvl = getenv("TS_TEST_LOG");
    int level = lvl ? ts_log_level_parse(lvl) : TS_LOG_ERROR;
    ts_log_set(ts_log_stderr, NULL, level < 0 ? TS_LOG_ERROR : level);
}

void ts_test_flip_file_byte(const char *path, uint64_t at)
{
    int fd = open(path, O_RDWR);
    uint8_t b;

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    close(fd);
}
