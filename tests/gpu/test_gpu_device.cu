/*
 * On a GPU: libtessera's GPU check (the kernels of client/gpu/crc32c.cu, loaded from the
 * library's fatbin through the driver) against ISA-L on the CPU, for whole ranges and for the
 * piece tables of READ replies, a flipped byte in device memory found; the DMA-BUF export of
 * device memory that GPUDirect RDMA registers; and tessera_read_device into device memory from
 * a real tesserad, checked on the GPU and byte for byte after copying back. Prints the read and
 * check rates (docs/client.md "GPU memory"). Without a GPU (or a CUDA driver) it exits 77 and
 * says why.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "harness.h"
#include "tessera/gpu.h"
#include "tessera/tessera.h"
#include "ts_common.h"
}
#include "gpu/crc32c_gpu.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #x);                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define BIG (256u << 20) /* the shard read for the rates */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The GPU check: whole ranges (aligned and not) and piece tables, against ISA-L. */
static void check_kernels(const uint8_t *host, uint8_t *dev)
{
    static const size_t lens[] = {0, 1, 7, 4095, 4096, 4097, 1000000, 9u << 20};
    char why[200];
    uint32_t g, bad;

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        for (size_t start = 0; start < 4; start += 3) {
            CHECK(ts_cu_crc32c(dev + start, lens[i], &g, why, sizeof(why)) == 0);
            CHECK(g == ts_crc32c(0, host + start, lens[i]));
        }
    /* A READ reply's pieces, back to back: empty, short, whole blocks, a chunk, odd sizes. */
    static const uint32_t plens[] = {0, 1, 4096, 1u << 20, 65537, 3, 0, 8191, 2u << 20};
    uint8_t table[sizeof(plens) / sizeof(plens[0]) * 8];
    uint32_t n = sizeof(plens) / sizeof(plens[0]);
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        ts_put_le32(table + i * 8, plens[i]);
        ts_put_le32(table + i * 8 + 4, ts_crc32c(0, host + at, plens[i]));
        at += plens[i];
    }
    CHECK(ts_cu_verify_pieces(dev, table, n, &bad, why, sizeof(why)) == 0);
    /* One byte flipped in device memory, inside piece 4: found, and which piece. */
    size_t flip = 1 + 4096 + (1u << 20) + 1 + 4096 + 100;
    uint8_t b = (uint8_t)(host[flip] ^ 0x20);
    CHECK(cudaMemcpy(dev + flip, &b, 1, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(ts_cu_verify_pieces(dev, table, n, &bad, why, sizeof(why)) == TS_ECORRUPT);
    CHECK(bad == 4);
    printf("test_gpu_device: corrupt piece found: %s\n", why);
    CHECK(cudaMemcpy(dev + flip, host + flip, 1, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(ts_cu_verify_pieces(dev, table, n, &bad, why, sizeof(why)) == 0);
    /* Host memory is not device memory. */
    CHECK(ts_cu_device_ptr(host, why, sizeof(why)) == TS_ENOTSUP);
    CHECK(ts_cu_device_ptr(dev + 5, why, sizeof(why)) == 0);
}

/* The DMA-BUF export GPUDirect RDMA registers: reported (it depends on the driver and kernel). */
static void report_dmabuf(uint8_t *dev)
{
    char why[200] = "";
    uint64_t off = 0;
    int fd = -1, rc = ts_cu_dmabuf(dev + 4096 + 17, 1u << 20, &fd, &off, why, sizeof(why));

    if (rc == 0) {
        CHECK(fd >= 0 && off == 17);
        close(fd);
        printf("test_gpu_device: DMA-BUF export of device memory: works (fd %d, offset %llu)\n", fd,
               (unsigned long long)off);
    } else {
        CHECK(rc == TS_ENOTSUP && fd == -1);
        printf("test_gpu_device: DMA-BUF export of device memory: not here (%s)\n", why);
    }
}

/*
 * GPUDirect RDMA end to end, where this host has an RDMA device: TESSERA_RDMA_ADDR names the
 * address of its interface (as for test_rdma). A node with an RDMA listener places a shard in
 * device memory; the bytes are checked on the GPU and after copying back. The path taken is
 * printed; TESSERA_GPU_EXPECT_PATH (dmabuf, peermem) makes any other path a failure.
 */
static void gpudirect(const uint8_t *host, uint8_t *dev, uint8_t *back)
{
    const char *ip = getenv("TESSERA_RDMA_ADDR"), *expect = getenv("TESSERA_GPU_EXPECT_PATH");
    char listen[96], url[128], why[200];
    struct tsd_proc d;
    struct tessera_opts o;
    tessera_client *c = NULL;
    struct tessera_device_stats st;
    size_t got = 0, len = (9u << 20) + 5;
    uint32_t g = 0;

    if (!ip || !*ip) {
        printf("test_gpu_device: GPUDirect RDMA not tried: no RDMA device named "
               "(TESSERA_RDMA_ADDR)\n");
        CHECK(!expect);
        return;
    }
    snprintf(listen, sizeof(listen), "%s:0", ip);
    const char *const extra[] = {"--rdma-listen", listen, NULL};
    memset(&d, 0, sizeof(d));
    CHECK(tsd_start(&d, extra) == 0 && d.rdma_addr[0]);
    tessera_opts_init(&o);
    o.address = d.addr;
    CHECK(tessera_client_open(&c, &o) == 0);
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20};
    CHECK(tessera_dataset_create(c, "gpudirect", &p) == 0);
    CHECK(tessera_put(c, "gpudirect", 0, host, len, NULL, 0) == 0);
    tessera_client_close(c);
    snprintf(url, sizeof(url), "rdma://%s", d.addr);
    o.address = url;
    CHECK(tessera_client_open(&c, &o) == 0);
    CHECK(cudaMemset(dev, 0, len) == cudaSuccess);
    CHECK(tessera_read_device(c, "gpudirect", 0, 0, len + 100, dev, &got, &st) == 0);
    CHECK(got == len);
    CHECK(ts_cu_crc32c(dev, got, &g, why, sizeof(why)) == 0 && g == ts_crc32c(0, host, got));
    CHECK(cudaMemcpy(back, dev, got, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, got) == 0);
    printf("test_gpu_device: GPUDirect RDMA read over %s: path %s, %llu bytes\n", url, st.path,
           (unsigned long long)st.bytes);
    CHECK(!expect || !strcmp(expect, st.path));
    tessera_client_close(c);
    tsd_stop(&d);
    tsd_cleanup(&d);
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_gpu_device: skipped: no GPU (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 77;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    printf("test_gpu_device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    uint8_t *host = (uint8_t *)malloc(BIG), *dev = NULL, *back = (uint8_t *)malloc(BIG);
    CHECK(host && back);
    for (size_t i = 0; i < BIG; i++)
        host[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK(cudaMalloc(&dev, BIG) == cudaSuccess);
    CHECK(cudaMemcpy(dev, host, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    check_kernels(host, dev);
    report_dmabuf(dev);

    /* The check's rate: 256 MiB as a reply's table of 1 MiB pieces (best of 3). */
    char why[200];
    uint32_t g = 0, bad = 0, np = BIG >> 20;
    uint8_t *table = (uint8_t *)malloc(np * 8);
    for (uint32_t i = 0; i < np; i++) {
        ts_put_le32(table + i * 8, 1u << 20);
        ts_put_le32(table + i * 8 + 4, ts_crc32c(0, host + ((size_t)i << 20), 1u << 20));
    }
    double t0, t_check = 1e9;
    for (int r = 0; r < 3; r++) {
        t0 = now();
        CHECK(ts_cu_verify_pieces(dev, table, np, &bad, why, sizeof(why)) == 0);
        t_check = TS_MIN(t_check, now() - t0);
    }
    free(table);

    /* tessera_read_device from a real daemon (TCP: the staging path). */
    struct tsd_proc d;
    memset(&d, 0, sizeof(d));
    CHECK(tsd_start(&d, NULL) == 0);
    struct tessera_opts o;
    tessera_client *c = NULL;
    tessera_opts_init(&o);
    o.address = d.addr;
    CHECK(tessera_client_open(&c, &o) == 0);
    struct ts_dataset_policy p = {1, 0, 1, 1u << 20};
    CHECK(tessera_dataset_create(c, "gpu", &p) == 0);
    CHECK(tessera_put(c, "gpu", 0, host, 9u << 20, NULL, 0) == 0);
    CHECK(tessera_put(c, "gpu", 1, host, BIG, NULL, 0) == 0);
    CHECK(cudaMemset(dev, 0, BIG) == cudaSuccess);
    size_t got = 0;
    struct tessera_device_stats st;
    CHECK(tessera_read_device(c, "gpu", 0, 0, 9u << 20, dev, &got, &st) == 0);
    CHECK(got == (9u << 20) && !strcmp(st.path, "staging") && st.bytes == got);
    CHECK(ts_cu_crc32c(dev, got, &g, why, sizeof(why)) == 0 && g == ts_crc32c(0, host, got));
    CHECK(cudaMemcpy(back, dev, got, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, got) == 0);
    /* An offset read past the shard's end: the rest of the shard, the device beyond untouched. */
    CHECK(cudaMemset(dev, 0xAB, 8u << 20) == cudaSuccess);
    CHECK(tessera_read_device(c, "gpu", 0, (9u << 20) - 12345, 8u << 20, dev, &got, &st) == 0);
    CHECK(got == 12345);
    CHECK(cudaMemcpy(back, dev, got + 16, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host + (9u << 20) - 12345, got) == 0 && back[got] == 0xAB);
    /* A placed path asked for over TCP: it cannot place, so staging reads it. */
    setenv("TESSERA_GPU_PATH", "dmabuf", 1);
    CHECK(tessera_read_device(c, "gpu", 0, 0, 4096, dev, &got, &st) == 0);
    CHECK(got == 4096 && !strcmp(st.path, "staging"));
    unsetenv("TESSERA_GPU_PATH");
    /* An unknown dataset. */
    CHECK(tessera_read_device(c, "nope", 0, 0, 4096, dev, &got, &st) == TS_ENOENT);

    /* The rates: 256 MiB into device memory, and into host memory, best of 3 each. */
    double best_dev = 1e9, best_host = 1e9;
    for (int r = 0; r < 3; r++) {
        t0 = now();
        CHECK(tessera_read_device(c, "gpu", 1, 0, BIG, dev, &got, &st) == 0 && got == BIG);
        best_dev = TS_MIN(best_dev, now() - t0);
        t0 = now();
        CHECK(tessera_read(c, "gpu", 1, 0, BIG, back, &got) == 0 && got == BIG);
        best_host = TS_MIN(best_host, now() - t0);
    }
    CHECK(ts_cu_crc32c(dev, BIG, &g, why, sizeof(why)) == 0 && g == ts_crc32c(0, host, BIG));
    printf("test_gpu_device: 256 MiB over TCP loopback: into GPU memory (staging, %llu pieces) "
           "%.2f GB/s, into host memory %.2f GB/s; GPU CRC32C check %.1f GB/s\n",
           (unsigned long long)st.pieces, BIG / best_dev / 1e9, BIG / best_host / 1e9,
           BIG / t_check / 1e9);
    gpudirect(host, dev, back);
    printf("test_gpu_device: ok\n");
    tessera_client_close(c);
    tsd_stop(&d);
    tsd_cleanup(&d);
    cudaFree(dev);
    free(host);
    free(back);
    return 0;
}
