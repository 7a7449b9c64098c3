/* tessera_read_device in a libtessera built without CUDA (tessera/gpu.h): TS_ENOTSUP. */
#include "gpu/staging.h"

int tessera_read_device(tessera_client *c, const char *name, uint32_t shard, uint64_t off,
                        size_t len, void *dev, size_t *out_len, struct tessera_device_stats *st)
{
    if (out_len)
        *out_len = 0;
    if (c)
        ts_conn_set_error(c, "this libtessera was built without CUDA: no reads into GPU memory");
    return TS_ENOTSUP;
}
