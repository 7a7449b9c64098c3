/*
 * The cache arena (struct arena in store_internal.h): one sparse memfd holding the bytes of
 * cached chunks, so that the server can sendfile() them; slots by power-of-two size class.
 */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAC "storage"

static int arena_class(size_t len)
{
    int c = ARENA_MIN_SHIFT;
    while (c <= ARENA_MAX_SHIFT && ((size_t)1 << c) < len)
        c++;
    return c <= ARENA_MAX_SHIFT ? c - ARENA_MIN_SHIFT : -1;
}

int arena_init(struct arena *a)
{
    a->fd = memfd_create("tessera-cache", MFD_CLOEXEC);
    a->size = ARENA_CLASS_SPAN * ARENA_CLASSES;
    if (a->fd < 0 || ftruncate(a->fd, (off_t)a->size) != 0)
        goto out_fail;
    a->base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
    if (a->base == MAP_FAILED)
        goto out_fail;
    pthread_mutex_init(&a->lock, NULL);
    return 0;
out_fail:
    TS_WARN(FAC, ts_from_errno(errno), "no cache arena (%s): cached chunks stay in engine buffers",
            strerror(errno));
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    a->base = NULL;
    return ts_from_errno(errno);
}

void arena_fini(struct arena *a)
{
    if (a->fd < 0)
        return;
    munmap(a->base, a->size);
    close(a->fd);
    for (int i = 0; i < ARENA_CLASSES; i++)
        free(a->free[i]);
    pthread_mutex_destroy(&a->lock);
    a->fd = -1;
}

/* An offset for len bytes, or -1. */
int64_t arena_alloc(struct arena *a, size_t len)
{
    int c = arena_class(len);
    int64_t off = -1;

    if (a->fd < 0 || c < 0)
        return -1;
    pthread_mutex_lock(&a->lock);
    if (a->nfree[c]) {
        off = (int64_t)a->free[c][--a->nfree[c]];
    } else if (a->bump[c] + ((uint64_t)1 << (c + ARENA_MIN_SHIFT)) <= ARENA_CLASS_SPAN) {
        off = (int64_t)((uint64_t)c * ARENA_CLASS_SPAN + a->bump[c]);
        a->bump[c] += (uint64_t)1 << (c + ARENA_MIN_SHIFT);
    }
    pthread_mutex_unlock(&a->lock);
    return off;
}

void arena_release(struct arena *a, int64_t off, size_t len)
{
    int c = arena_class(len);
    size_t span = (len + 4095) & ~(size_t)4095;

    /* Give the pages back before the slot can be reused (see struct arena). If that fails,
     * the slot is never reused: a sendfile() still in flight may read its old pages. */
    if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)span) != 0) {
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            TS_WARN(FAC, ts_from_errno(errno),
                    "cache arena: cannot free a slot's pages (%s): slots are not reused",
                    strerror(errno));
        return;
    }
    pthread_mutex_lock(&a->lock);
    if (a->nfree[c] == a->capfree[c]) {
        size_t cap = a->capfree[c] ? 2 * a->capfree[c] : 64;
        uint64_t *nf = realloc(a->free[c], cap * sizeof(*nf));
        if (!nf) {
            pthread_mutex_unlock(&a->lock);
            return; /* the slot is lost to reuse; its pages are already free */
        }
        a->free[c] = nf;
        a->capfree[c] = cap;
    }
    a->free[c][a->nfree[c]++] = (uint64_t)off;
    pthread_mutex_unlock(&a->lock);
}
