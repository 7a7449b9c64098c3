/*
 * Chunk files: a shard's bytes in a file of their own, chunk i at i * chunk_size, while
 * RocksDB keeps only the records (the shard record names the file, the CRC32C list checks
 * every chunk read back). Chunk bytes so pass through no engine: no WAL copy, no blob-file
 * copy, no engine checksum; the CRC32C computed when the chunk arrived is the only one.
 *
 * Layout: PATH/chunks/DSID/SHARD.FILE, DSID the dataset id and FILE the shard record's file id
 * (random, never 0, both in hex): a shard written again gets a new file, and the one its
 * record no longer names is garbage. Files are removed after the records that named them are
 * gone (shard and dataset deletes, a new upload of the shard), and at open anything no record
 * names is removed (a crash between the two): chunkfile_sweep.
 */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAC "storage"

static void dir_path(ts_store *s, uint64_t dsid, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/chunks/%016" PRIx64, s->path, dsid);
}

static void file_path(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file, char *buf,
                      size_t cap)
{
    snprintf(buf, cap, "%s/chunks/%016" PRIx64 "/%08" PRIx32 ".%08" PRIx32, s->path, dsid, shard,
             file);
}

/* fsync of a directory: a file created in it survives a power loss. */
static int dir_sync(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

    if (fd < 0)
        return ts_from_errno(errno);
    if (fsync(fd) != 0)
        rc = ts_from_errno(errno);
    close(fd);
    return rc;
}

/* mkdir of path in parent; a folder made is synced into its parent (sync always). */
static int dir_make(ts_store *s, const char *parent, const char *path)
{
    if (mkdir(path, 0750) != 0)
        return errno == EEXIST ? 0 : ts_from_errno(errno);
    return sync_seals(s) ? dir_sync(parent) : 0;
}

/* The folders of dataset dsid's chunk files, made where missing. */
static int dirs_make(ts_store *s, uint64_t dsid)
{
    char top[PATH_MAX], path[PATH_MAX];
    int rc;

    snprintf(top, sizeof(top), "%s/chunks", s->path);
    rc = dir_make(s, s->path, top);
    if (rc)
        return rc;
    dir_path(s, dsid, path, sizeof(path));
    return dir_make(s, top, path);
}

int chunkfile_create(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t *file, int *fd)
{
    char path[PATH_MAX];
    int rc;

    *fd = -1;
    rc = dirs_make(s, dsid);
    if (rc)
        return rc;
    for (int tries = 0; tries < 16; tries++) {
        uint32_t id = 0;
        if (getrandom(&id, sizeof(id), 0) != sizeof(id) || id == 0)
            continue;
        file_path(s, dsid, shard, id, path, sizeof(path));
        *fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (*fd >= 0) {
            *file = id;
            if (sync_seals(s)) {
                dir_path(s, dsid, path, sizeof(path));
                rc = dir_sync(path);
                if (rc) {
                    chunkfile_close(fd);
                    chunkfile_unlink(s, dsid, shard, id);
                    return rc;
                }
            }
            return 0;
        }
        if (errno != EEXIST)
            break;
    }
    rc = errno == EEXIST ? TS_EIO : ts_from_errno(errno); /* not "the shard exists" */
    TS_ERROR(FAC, rc, "cannot create a chunk file in %s: %s", path, strerror(errno));
    return rc;
}

int chunkfile_write(int fd, const void *data, size_t len, uint64_t off)
{
    const uint8_t *p = data;

    while (len) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? ts_from_errno(errno) : TS_EIO;
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

int chunkfile_sync(int fd)
{
    return fdatasync(fd) == 0 ? 0 : ts_from_errno(errno);
}

void chunkfile_start_writeback(int fd, uint64_t off, size_t len)
{
    /* Best effort: a failure only leaves more for the seal's fdatasync, which reports it. */
    (void)sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
}

void chunkfile_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int chunkfile_read(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file, uint64_t off,
                   void *buf, size_t len)
{
    char path[PATH_MAX];
    uint8_t *p = buf;
    int fd, rc = 0;

    file_path(s, dsid, shard, file, path, sizeof(path));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? TS_ENOENT : ts_from_errno(errno);
    while (len && !rc) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = ts_from_errno(errno);
        else if (n == 0)
            rc = TS_ECORRUPT; /* shorter than its records say */
        else {
            p += n;
            off += (uint64_t)n;
            len -= (size_t)n;
        }
    }
    close(fd);
    return rc;
}

int chunkfile_repair(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file, uint64_t off,
                     const void *data, size_t len)
{
    char path[PATH_MAX];
    int fd, rc;

    /* The file may be gone (lost with its folder, removed by hand): made again, it holds the
     * repaired chunks, and reads of the others fail their CRC32C until they are repaired too. */
    rc = dirs_make(s, dsid);
    if (rc)
        return rc;
    file_path(s, dsid, shard, file, path, sizeof(path));
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
        if (fd >= 0 && sync_seals(s)) {
            char dir[PATH_MAX];
            dir_path(s, dsid, dir, sizeof(dir));
            dir_sync(dir);
        }
    }
    if (fd < 0)
        return ts_from_errno(errno);
    rc = chunkfile_write(fd, data, len, off);
    if (rc == 0)
        rc = chunkfile_sync(fd);
    close(fd);
    return rc;
}

void chunkfile_unlink(ts_store *s, uint64_t dsid, uint32_t shard, uint32_t file)
{
    char path[PATH_MAX];

    if (!file)
        return;
    file_path(s, dsid, shard, file, path, sizeof(path));
    if (unlink(path) != 0 && errno != ENOENT)
        TS_WARN(FAC, ts_from_errno(errno), "cannot remove chunk file %s: %s", path,
                strerror(errno));
}

void chunkfile_drop_dataset(ts_store *s, uint64_t dsid)
{
    char path[PATH_MAX];
    struct dirent *e;
    DIR *d;

    dir_path(s, dsid, path, sizeof(path));
    d = opendir(path);
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0)
            TS_WARN(FAC, ts_from_errno(errno), "cannot remove chunk file %s/%s: %s", path,
                    e->d_name, strerror(errno));
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT)
        TS_WARN(FAC, ts_from_errno(errno), "cannot remove %s: %s", path, strerror(errno));
}

/* The files of dataset dsid's directory that no shard record names. */
static void sweep_dataset(ts_store *s, uint64_t dsid, const char *path, size_t *removed)
{
    struct dirent *e;
    DIR *d = opendir(path);

    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        struct ts_shard_info si;
        uint32_t shard, file, named = 0;
        char *end;
        int rc;

        if (e->d_name[0] == '.')
            continue;
        shard = (uint32_t)strtoul(e->d_name, &end, 16);
        if (*end != '.')
            continue; /* not ours: left alone */
        file = (uint32_t)strtoul(end + 1, &end, 16);
        if (*end != '\0')
            continue;
        rc = shard_get(s, dsid, shard, &si, NULL, &named);
        if (rc != 0 && rc != TS_ENOENT)
            continue; /* cannot tell: keep it */
        if (rc == 0 && named == file)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            (*removed)++;
    }
    closedir(d);
}

void chunkfile_sweep(ts_store *s)
{
    char path[PATH_MAX], sub[PATH_MAX + 512];
    struct dirent *e;
    size_t removed = 0, datasets = 0;
    DIR *d;

    snprintf(path, sizeof(path), "%s/chunks", s->path);
    d = opendir(path);
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        char name[TS_NAME_MAX + 1], *end;
        uint64_t dsid;
        int rc;

        if (e->d_name[0] == '.')
            continue;
        dsid = strtoull(e->d_name, &end, 16);
        if (*end != '\0' || strlen(e->d_name) != 16)
            continue;
        rc = id_name(s, dsid, name);
        if (rc == TS_ENOENT) { /* the dataset was deleted */
            chunkfile_drop_dataset(s, dsid);
            datasets++;
            continue;
        }
        if (rc == 0) {
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            sweep_dataset(s, dsid, sub, &removed);
        }
    }
    closedir(d);
    if (removed || datasets)
        TS_INFO(FAC, "removed %zu chunk files and %zu dataset folders no record names", removed,
                datasets);
}
