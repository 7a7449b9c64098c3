/*
 * The CUDA driver as libtessera uses it (gpu/crc32c_gpu.h): loaded at first use (dlopen of
 * libcuda.so.1), so a libtessera built with CUDA loads and works on hosts without a GPU. It
 * runs the check of bytes placed in device memory (the kernels of crc32c.cu, loaded from the
 * fatbin the library carries, once per CUDA context) and exports device memory as DMA-BUF for
 * the RDMA transport. Every call works in the context that owns the pointer (cudaMalloc's:
 * the device's primary context). The GPU backend's own file.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/crc32c_dev.h"
#include "gpu/crc32c_gpu.h"
#include "ts_common.h"

#define MODULES 8            /* CUDA contexts whose module is kept */
#define MAX_PIECE (1u << 20) /* bytes per piece of ts_cu_crc32c (joined on the host) */

/* The driver's entry points this file uses (the versioned names cuda.h maps them to). */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*ptr_attr)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*module_fn)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*range_handle)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
    CUresult (*error_name)(CUresult, const char **);
    CUresult (*ctx_id)(CUcontext, unsigned long long *); /* CUDA 12+: may be absent */
    CUresult (*module_unload)(CUmodule);
    int loaded;
    char why[160];
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* Loaded modules by context: its unique id where the driver gives one (a new context may get
 * a destroyed one's handle), else its handle. */
static struct {
    unsigned long long key;
    CUmodule mod;
    CUfunction blocks, join;
} modules[MODULES];
static unsigned nmodules, next_evict;
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;

static void drv_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult rc;

    if (!h) {
        snprintf(drv.why, sizeof(drv.why), "no CUDA driver (libcuda.so.1) on this host");
        return;
    }
    *(void **)&drv.init = dlsym(h, "cuInit");
    *(void **)&drv.ptr_attr = dlsym(h, "cuPointerGetAttribute");
    *(void **)&drv.ctx_push = dlsym(h, "cuCtxPushCurrent_v2");
    *(void **)&drv.ctx_pop = dlsym(h, "cuCtxPopCurrent_v2");
    *(void **)&drv.module_load = dlsym(h, "cuModuleLoadData");
    *(void **)&drv.module_fn = dlsym(h, "cuModuleGetFunction");
    *(void **)&drv.launch = dlsym(h, "cuLaunchKernel");
    *(void **)&drv.mem_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&drv.mem_free = dlsym(h, "cuMemFree_v2");
    *(void **)&drv.htod = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&drv.dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    *(void **)&drv.range_handle = dlsym(h, "cuMemGetHandleForAddressRange"); /* may be absent */
    *(void **)&drv.error_name = dlsym(h, "cuGetErrorName");
    *(void **)&drv.ctx_id = dlsym(h, "cuCtxGetId");
    *(void **)&drv.module_unload = dlsym(h, "cuModuleUnload");
    if (!drv.init || !drv.ptr_attr || !drv.ctx_push || !drv.ctx_pop || !drv.module_load ||
        !drv.module_fn || !drv.launch || !drv.mem_alloc || !drv.mem_free || !drv.htod ||
        !drv.dtoh || !drv.error_name || !drv.module_unload) {
        snprintf(drv.why, sizeof(drv.why), "the CUDA driver lacks an entry point libtessera uses");
        return;
    }
    rc = drv.init(0);
    if (rc != CUDA_SUCCESS) {
        const char *s = "?";
        drv.error_name(rc, &s);
        snprintf(drv.why, sizeof(drv.why), "cuInit: %s (no usable GPU)", s);
        return;
    }
    drv.loaded = 1;
}

static void why_set(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;

    if (!why || !whylen)
        return;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

/* 0 for CUDA_SUCCESS; else TS_EIO with what failed and the driver's name for it in why. */
static int cu_rc(CUresult rc, const char *what, char *why, size_t whylen)
{
    const char *s = "?";

    if (rc == CUDA_SUCCESS)
        return 0;
    drv.error_name(rc, &s);
    why_set(why, whylen, "%s: %s", what, s);
    return TS_EIO;
}

/* Makes the context that owns dev current (pushed: leave with ctx_leave). */
static int ctx_enter(const void *dev, char *why, size_t whylen)
{
    CUcontext ctx = NULL;
    unsigned type = 0;
    CUresult rc;

    pthread_once(&drv_once, drv_load);
    if (!drv.loaded) {
        why_set(why, whylen, "%s", drv.why);
        return TS_ENOTSUP;
    }
    rc = drv.ptr_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)dev);
    if (rc != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE) {
        why_set(why, whylen, "not device memory");
        return TS_ENOTSUP;
    }
    rc = drv.ptr_attr(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)dev);
    if (rc == CUDA_SUCCESS)
        rc = drv.ctx_push(ctx);
    return cu_rc(rc, "the context of device memory", why, whylen);
}

static void ctx_leave(void)
{
    CUcontext ctx;

    drv.ctx_pop(&ctx);
}

/* The kernels of crc32c.cu in the current context (loaded at its first use). */
static int kernels(CUfunction *blocks, CUfunction *join, char *why, size_t whylen)
{
    CUcontext ctx = NULL;
    unsigned long long key;
    CUmodule mod = NULL;
    int rc = 0;

    drv.ctx_pop(&ctx); /* which one: pop it and push it back */
    drv.ctx_push(ctx);
    key = (unsigned long long)(uintptr_t)ctx;
    if (drv.ctx_id)
        drv.ctx_id(ctx, &key);
    pthread_mutex_lock(&modules_lock);
    for (unsigned i = 0; i < nmodules; i++)
        if (modules[i].key == key) {
            *blocks = modules[i].blocks;
            *join = modules[i].join;
            goto out;
        }
    rc = cu_rc(drv.module_load(&mod, ts_gpu_fatbin), "loading the CRC32C kernels", why, whylen);
    if (!rc)
        rc = cu_rc(drv.module_fn(blocks, mod, "ts_crc_blocks"), "ts_crc_blocks", why, whylen);
    if (!rc)
        rc = cu_rc(drv.module_fn(join, mod, "ts_crc_join"), "ts_crc_join", why, whylen);
    if (!rc) {
        unsigned i;
        if (nmodules < MODULES) {
            i = nmodules++;
        } else { /* the oldest goes (its unload fails harmlessly if its context is gone) */
            i = next_evict++ % MODULES;
            drv.module_unload(modules[i].mod);
        }
        modules[i].key = key;
        modules[i].mod = mod;
        modules[i].blocks = *blocks;
        modules[i].join = *join;
    } else if (mod) {
        drv.module_unload(mod);
    }
out:
    pthread_mutex_unlock(&modules_lock);
    return rc;
}

/* The join kernel's operators: append TS_GPU_CRC_BLOCK zero bytes, and a segment's worth. */
static uint32_t zeros_op[64];
static pthread_once_t op_once = PTHREAD_ONCE_INIT;

static void zeros_op_make(void)
{
    ts_crc32c_dev_zeros_op(zeros_op, TS_GPU_CRC_BLOCK);
    ts_crc32c_dev_zeros_op(zeros_op + 32, (uint64_t)TS_GPU_CRC_SEG * TS_GPU_CRC_BLOCK);
}

/* The CRC32C of each of n pieces (plen[i] bytes each, back to back from dev) into crcs[i],
 * computed on the GPU; the context is current. */
static int crc_pieces(const void *dev, const uint32_t *plen, uint32_t n, uint32_t *crcs, char *why,
                      size_t whylen)
{
    size_t head = 64 * 4 + (size_t)n * 8 + (size_t)n * 4 + ((size_t)n + 1) * 4, nblocks = 0, bytes;
    unsigned long long *poff;
    uint32_t *len, *pblk;
    CUfunction fb, fj;
    CUdeviceptr d = 0, base = (CUdeviceptr)(uintptr_t)dev;
    uint8_t *h;
    int rc;

    if (n == 0)
        return 0;
    rc = kernels(&fb, &fj, why, whylen);
    if (rc)
        return rc;
    h = malloc(head);
    if (!h)
        return TS_ENOMEM;
    pthread_once(&op_once, zeros_op_make);
    memcpy(h, zeros_op, sizeof(zeros_op));
    poff = (unsigned long long *)(h + 64 * 4);
    len = (uint32_t *)(h + 64 * 4 + (size_t)n * 8);
    pblk = len + n;
    for (uint32_t i = 0; i < n; i++) {
        poff[i] = i ? poff[i - 1] + plen[i - 1] : 0;
        len[i] = plen[i];
        pblk[i] = (uint32_t)nblocks;
        nblocks += ((size_t)plen[i] + TS_GPU_CRC_BLOCK - 1) / TS_GPU_CRC_BLOCK;
    }
    pblk[n] = (uint32_t)nblocks;
    bytes = head + (nblocks + n) * 4;
    rc = cu_rc(drv.mem_alloc(&d, bytes), "cuMemAlloc", why, whylen);
    if (!rc)
        rc = cu_rc(drv.htod(d, h, head), "cuMemcpyHtoD", why, whylen);
    if (!rc && nblocks) {
        CUdeviceptr d_op = d, d_poff = d + 64 * 4, d_plen = d_poff + (size_t)n * 8;
        CUdeviceptr d_pblk = d_plen + (size_t)n * 4, d_blk = d + head, d_out = d_blk + nblocks * 4;
        void *a1[] = {&base, &d_poff, &d_plen, &d_pblk, &n, &d_blk};
        void *a2[] = {&d_plen, &d_pblk, &n, &d_blk, &d_op, &d_out};
        rc = cu_rc(drv.launch(fb,
                              (unsigned)((nblocks + TS_GPU_CRC_THREADS - 1) / TS_GPU_CRC_THREADS),
                              1, 1, TS_GPU_CRC_THREADS, 1, 1, 0, NULL, a1, NULL),
                   "launching ts_crc_blocks", why, whylen);
        if (!rc)
            rc = cu_rc(drv.launch(fj, (n + 3) / 4, 1, 1, 128, 1, 1, 0, NULL, a2, NULL), /* warps */
                       "launching ts_crc_join", why, whylen);
        if (!rc) /* waits for both kernels */
            rc = cu_rc(drv.dtoh(crcs, d_out, (size_t)n * 4), "the CRCs back (cuMemcpyDtoH)", why,
                       whylen);
    } else if (!rc) {
        memset(crcs, 0, (size_t)n * 4); /* only empty pieces */
    }
    if (d)
        drv.mem_free(d);
    free(h);
    return rc;
}

int ts_cu_device_ptr(const void *dev, char *why, size_t whylen)
{
    int rc = ctx_enter(dev, why, whylen);

    if (rc == 0)
        ctx_leave();
    return rc;
}

int ts_cu_crc32c(const void *dev, size_t len, uint32_t *crc, char *why, size_t whylen)
{
    uint32_t n = (uint32_t)((len + MAX_PIECE - 1) / MAX_PIECE), *plen, *crcs;
    int rc;

    *crc = 0;
    if (len == 0)
        return 0;
    rc = ctx_enter(dev, why, whylen);
    if (rc)
        return rc;
    plen = calloc(n, 4);
    crcs = calloc(n, 4);
    rc = plen && crcs ? 0 : TS_ENOMEM;
    for (uint32_t i = 0; !rc && i < n; i++)
        plen[i] = (uint32_t)TS_MIN((size_t)MAX_PIECE, len - (size_t)i * MAX_PIECE);
    if (!rc)
        rc = crc_pieces(dev, plen, n, crcs, why, whylen);
    for (uint32_t i = 0; !rc && i < n; i++)
        *crc = ts_crc32c_dev_combine(*crc, crcs[i], plen[i]);
    free(plen);
    free(crcs);
    ctx_leave();
    return rc;
}

int ts_cu_verify_pieces(const void *dev, const uint8_t *table, uint32_t n, uint32_t *bad, char *why,
                        size_t whylen)
{
    uint32_t *plen, *crcs;
    int rc;

    *bad = 0;
    rc = ctx_enter(dev, why, whylen);
    if (rc)
        return rc;
    plen = calloc((size_t)n + 1, 4);
    crcs = calloc((size_t)n + 1, 4);
    rc = plen && crcs ? 0 : TS_ENOMEM;
    for (uint32_t i = 0; !rc && i < n; i++)
        plen[i] = ts_get_le32(table + (size_t)i * 8);
    if (!rc)
        rc = crc_pieces(dev, plen, n, crcs, why, whylen);
    for (uint32_t i = 0; !rc && i < n; i++)
        if (crcs[i] != ts_get_le32(table + (size_t)i * 8 + 4)) {
            *bad = i;
            why_set(why, whylen, "piece %u fails its CRC32C (checked on the GPU)", i);
            rc = TS_ECORRUPT;
        }
    free(plen);
    free(crcs);
    ctx_leave();
    return rc;
}

int ts_cu_dmabuf(const void *dev, size_t len, int *fd, uint64_t *off, char *why, size_t whylen)
{
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)dev;
    uintptr_t base = p & ~(ps - 1), end = (p + len + ps - 1) & ~(ps - 1);
    int rc;

    *fd = -1;
    *off = 0;
    rc = ctx_enter(dev, why, whylen);
    if (rc)
        return rc;
    if (!drv.range_handle) {
        why_set(why, whylen, "this CUDA driver has no cuMemGetHandleForAddressRange");
        rc = TS_ENOTSUP;
    } else {
        rc = cu_rc(drv.range_handle(fd, (CUdeviceptr)base, end - base,
                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                   "cuMemGetHandleForAddressRange (DMA-BUF)", why, whylen);
        if (rc)
            rc = TS_ENOTSUP;
        else
            *off = p - base;
    }
    ctx_leave();
    return rc;
}
