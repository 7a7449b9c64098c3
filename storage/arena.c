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
    memset(a, 0, sizeof(*a));
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
    for (int i = 0; i < ARENA_CLASSES; i++) {
        free(a->punched[i].off);
        free(a->kept[i].off);
    }
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
    if (a->kept[c].n) {
        off = (int64_t)a->kept[c].off[--a->kept[c].n];
        a->kept_bytes -= (uint64_t)1 << (c + ARENA_MIN_SHIFT);
        a->reused_kept++;
    } else if (a->punched[c].n) {
        off = (int64_t)a->punched[c].off[--a->punched[c].n];
    } else if (a->bump[c] + ((uint64_t)1 << (c + ARENA_MIN_SHIFT)) <= ARENA_CLASS_SPAN) {
        off = (int64_t)((uint64_t)c * ARENA_CLASS_SPAN + a->bump[c]);
        a->bump[c] += (uint64_t)1 << (c + ARENA_MIN_SHIFT);
    }
    pthread_mutex_unlock(&a->lock);
    return off;
}

/* Appends off to l (lock held): 0, or -1 out of memory. */
static int list_push(struct arena_list *l, uint64_t off)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        uint64_t *nl = realloc(l->off, cap * sizeof(*nl));
        if (!nl)
            return -1;
        l->off = nl;
        l->cap = cap;
    }
    l->off[l->n++] = off;
    return 0;
}

void arena_release(struct arena *a, int64_t off, size_t len, int lent)
{
    int c = arena_class(len);
    uint64_t slot = (uint64_t)1 << (c + ARENA_MIN_SHIFT);

    pthread_mutex_lock(&a->lock);
    if (!lent && a->kept_bytes + slot <= ARENA_KEEP_BYTES && list_push(&a->kept[c], off) == 0) {
        a->kept_bytes += slot; /* its pages stay: no one else holds them */
        pthread_mutex_unlock(&a->lock);
        return;
    }
    pthread_mutex_unlock(&a->lock);
    /* Give the pages back before the slot can be reused (see struct arena). If that fails,
     * the slot is never reused: a sendfile() still in flight may read its old pages. */
    if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)slot) != 0) {
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            TS_WARN(FAC, ts_from_errno(errno),
                    "cache arena: cannot free a slot's pages (%s): slots are not reused",
                    strerror(errno));
        return;
    }
    pthread_mutex_lock(&a->lock);
    a->punches++;
    list_push(&a->punched[c], (uint64_t)off); /* out of memory: lost to reuse, pages freed */
    pthread_mutex_unlock(&a->lock);
}
