/* tesserad built without rdma-core: no RDMA listener (server/rdma.h). */
#include <stdio.h>

#include "rdma.h"
#include "ts_common.h"

int tsd_rdma_start(struct tsd_server *s, const char *addr, const struct tsd_rdma_hooks *hooks,
                   char *why, size_t cap)
{
    snprintf(why, cap, "rdma_listen '%s': this tesserad was built without rdma-core", addr);
    return TS_ENOTSUP;
}

void tsd_rdma_stop(struct tsd_server *s) {}

const char *tsd_rdma_addr(const struct tsd_server *s)
{
    return NULL;
}

unsigned tsd_rdma_sessions(const struct tsd_server *s)
{
    return 0;
}

long tsd_rdma_place(struct tsd_rdma_sess *r, const void *src, size_t len, uint64_t raddr,
                    uint32_t rkey)
{
    return TS_ENOTSUP;
}

void tsd_rdma_close(struct tsd_rdma_sess *r) {}
