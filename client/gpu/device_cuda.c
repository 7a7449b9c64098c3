/*
 * tessera_read_device with CUDA (tessera/gpu.h). On one RDMA connection the node places the
 * bytes straight into GPU memory (gpu/placed.c): registered from a DMA-BUF of the range
 * (cuMemGetHandleForAddressRange, then ibv_reg_dmabuf_mr), else as a device address
 * (nvidia-peermem), and checked on the GPU (gpu/cuda_drv.c). Otherwise, or when neither
 * registration works, the staging pipeline (gpu/staging.c): pinned host buffers
 * (cudaHostAlloc) and cudaMemcpyAsync on a stream of its own, so the copy of one verified piece
 * to the device overlaps the receive of the next. TESSERA_GPU_PATH=staging|dmabuf|peermem
 * narrows the choice. The CUDA runtime and driver are loaded at the first call (dlopen), so a
 * libtessera built with CUDA still loads and works on a host without them; their errors become
 * TS_EIO here, with the CUDA error's name in the handle's message. Built only when the CUDA
 * toolkit is found (device_stub.c otherwise).
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "gpu/crc32c_gpu.h"
#include "gpu/placed.h"
#include "gpu/staging.h"

#include <stdlib.h>
#include <string.h>

/* The runtime's entry points this file uses. */
static struct {
    cudaError_t (*host_alloc)(void **, size_t, unsigned int);
    cudaError_t (*free_host)(void *);
    cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*stream_sync)(cudaStream_t);
    cudaError_t (*stream_create)(cudaStream_t *, unsigned int);
    cudaError_t (*stream_destroy)(cudaStream_t);
    const char *(*error_name)(cudaError_t);
    const char *(*error_string)(cudaError_t);
    int loaded;
} rt;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void rt_load(void)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
    void *h = NULL;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    *(void **)&rt.host_alloc = dlsym(h, "cudaHostAlloc");
    *(void **)&rt.free_host = dlsym(h, "cudaFreeHost");
    *(void **)&rt.memcpy_async = dlsym(h, "cudaMemcpyAsync");
    *(void **)&rt.stream_sync = dlsym(h, "cudaStreamSynchronize");
    *(void **)&rt.stream_create = dlsym(h, "cudaStreamCreateWithFlags");
    *(void **)&rt.stream_destroy = dlsym(h, "cudaStreamDestroy");
    *(void **)&rt.error_name = dlsym(h, "cudaGetErrorName");
    *(void **)&rt.error_string = dlsym(h, "cudaGetErrorString");
    rt.loaded = rt.host_alloc && rt.free_host && rt.memcpy_async && rt.stream_sync &&
                rt.stream_create && rt.stream_destroy && rt.error_name && rt.error_string;
}

struct cuda_ctx {
    cudaStream_t stream;
    tessera_client *c;
};

static int cuda_rc(struct cuda_ctx *x, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    ts_conn_set_error(x->c, "%s: %s (%s)", what, rt.error_name(e), rt.error_string(e));
    return TS_EIO;
}

static int cuda_alloc(void *ctx, void **p, size_t n)
{
    return cuda_rc(ctx, rt.host_alloc(p, n, cudaHostAllocDefault), "cudaHostAlloc");
}

static void cuda_free(void *ctx, void *p)
{
    rt.free_host(p);
}

static int cuda_copy(void *ctx, void *dst, const void *src, size_t n)
{
    struct cuda_ctx *x = ctx;
    return cuda_rc(x, rt.memcpy_async(dst, src, n, cudaMemcpyHostToDevice, x->stream),
                   "cudaMemcpyAsync");
}

static int cuda_sync(void *ctx)
{
    struct cuda_ctx *x = ctx;
    return cuda_rc(x, rt.stream_sync(x->stream), "cudaStreamSynchronize");
}

/* ---- placed by the node (GPUDirect RDMA) ------------------------------------------------ */

static int cuda_dmabuf(void *ctx, void *buf, size_t len, int *fd, uint64_t *off)
{
    return ts_cu_dmabuf(buf, len, fd, off, NULL, 0);
}

static int cuda_verify(void *ctx, const uint8_t *table, uint32_t n, const void *dst, size_t len)
{
    uint32_t bad;
    char why[160];
    int rc = ts_cu_verify_pieces(dst, table, n, &bad, why, sizeof(why));

    if (rc && rc != TS_ECORRUPT)
        TS_WARN("gpu", rc, "the GPU check of placed bytes failed: %s", why);
    return rc;
}

static const struct ts_place_path cuda_paths[] = {
    {"dmabuf", {cuda_dmabuf, NULL}},
    {"peermem", {NULL, NULL}},
};

/* The placed read on the paths TESSERA_GPU_PATH allows: TS_ENOTSUP when none is allowed. */
static int read_placed(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                       size_t len, void *dev, size_t *out_len, struct tessera_device_stats *st)
{
    const char *want = getenv("TESSERA_GPU_PATH");
    struct ts_place_ops ops = {cuda_paths, 2, cuda_verify, NULL};

    if (want && !strcmp(want, "staging"))
        return TS_ENOTSUP;
    if (want && !strcmp(want, "peermem")) {
        ops.paths = &cuda_paths[1];
        ops.npaths = 1;
    } else if (want && !strcmp(want, "dmabuf")) {
        ops.npaths = 1;
    }
    return ts_read_placed(c, name, shard, off, len, dev, out_len, &ops, st);
}

int tessera_read_device(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *dev, size_t *out_len, struct tessera_device_stats *st)
{
    struct cuda_ctx x = {NULL, c};
    struct ts_stage_ops ops = {"cuda", cuda_alloc, cuda_free, cuda_copy, cuda_sync, &x};
    char why[200];
    int rc;

    if (out_len)
        *out_len = 0;
    if (!c)
        return TS_EINVAL;
    pthread_once(&rt_once, rt_load);
    if (!rt.loaded) {
        ts_conn_set_error(c, "no CUDA runtime (libcudart) on this host: no reads into GPU memory");
        return TS_ENOTSUP;
    }
    if (len && ts_cu_device_ptr(dev, why, sizeof(why)) == 0) {
        rc = read_placed(c, name, shard, off, len, dev, out_len, st);
        if (rc != TS_ENOTSUP && rc != TS_ECORRUPT && rc != TS_EIO && rc != TS_EFRAGMENTED)
            return rc;
        /* Not placed, placed bytes that failed their check, a check that could not run (the
         * GPU out of memory), or an erasure-coded dataset whose replicas hold no bytes (placed
         * reads go to one node; its bytes are in fragments on K): read through staging, which
         * reads a bad range again from the node's store and an erasure-coded dataset through
         * its fragments. */
        TS_INFO("gpu", "%s/%u: through staging: %s", name, shard, tessera_client_error(c));
    }
    rc = cuda_rc(&x, rt.stream_create(&x.stream, cudaStreamNonBlocking),
                 "no CUDA device to read into (cudaStreamCreate)");
    if (rc)
        return rc;
    rc = ts_read_staged(c, name, shard, off, len, dev, out_len, &ops, TS_STAGE_PIECE, st);
    rt.stream_destroy(x.stream);
    return rc;
}
