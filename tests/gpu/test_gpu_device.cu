/*
 * On a GPU: the CRC32C kernel (client/gpu/crc32c.cu) against ISA-L on the CPU, and
 * tessera_read_device into device memory from a real tesserad, checked on the GPU and byte for
 * byte after copying back. Without a GPU (or a CUDA driver) it exits 77 and says why.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_gpu_device: skipped: no GPU (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 77;
    }
    /* The kernel against ISA-L. */
    static const size_t lens[] = {1, 7, 4095, 4096, 4097, 1000000, 9u << 20};
    uint8_t *host = (uint8_t *)malloc(9u << 20), *dev = NULL;
    for (size_t i = 0; i < (9u << 20); i++)
        host[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK(cudaMalloc(&dev, 9u << 20) == cudaSuccess);
    CHECK(cudaMemcpy(dev, host, 9u << 20, cudaMemcpyHostToDevice) == cudaSuccess);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint32_t g = 0;
        CHECK(ts_gpu_crc32c(dev, lens[i], &g) == 0);
        CHECK(g == ts_crc32c(0, host, lens[i]));
    }
    /* tessera_read_device from a real daemon. */
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
    CHECK(cudaMemset(dev, 0, 9u << 20) == cudaSuccess);
    size_t got = 0;
    struct tessera_device_stats st;
    CHECK(tessera_read_device(c, "gpu", 0, 0, 9u << 20, dev, &got, &st) == 0);
    CHECK(got == (9u << 20) && !strcmp(st.path, "staging"));
    uint32_t g = 0;
    CHECK(ts_gpu_crc32c(dev, got, &g) == 0 && g == ts_crc32c(0, host, got));
    uint8_t *back = (uint8_t *)malloc(got);
    CHECK(cudaMemcpy(back, dev, got, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, got) == 0);
    printf("test_gpu_device: kernel and tessera_read_device (%s, %llu pieces) ok\n", st.path,
           (unsigned long long)st.pieces);
    tessera_client_close(c);
    tsd_stop(&d);
    tsd_cleanup(&d);
    return 0;
}
