/*
 * RDMA transport of a libtessera built without rdma-core: "rdma://" addresses are parsed, and
 * connecting reports TS_ENOTSUP with the reason.
 */
#include "client_internal.h"

static int rdma_connect(struct ts_transport **out, const struct ts_conn_params *p)
{
    *out = NULL;
    ts_conn_err(p, "this libtessera was built without rdma-core: no RDMA transport");
    return TS_ENOTSUP;
}

static long rdma_send(struct ts_transport *t, const struct iovec *iov, int iovcnt)
{
    return TS_ENOTSUP;
}

static long rdma_recv(struct ts_transport *t, const struct iovec *iov, int iovcnt)
{
    return TS_ENOTSUP;
}

static int rdma_wait(struct ts_transport *t, int events, int timeout_ms)
{
    return TS_ENOTSUP;
}

static int rdma_pollfd(struct ts_transport *t, int events, int *fd, short *pevents)
{
    return TS_ENOTSUP;
}

static void rdma_close(struct ts_transport *t) {}

const struct ts_transport_ops ts_transport_rdma = {
    .name = "rdma",
    .connect = rdma_connect,
    .send = rdma_send,
    .recv = rdma_recv,
    .wait = rdma_wait,
    .pollfd = rdma_pollfd,
    .close = rdma_close,
};
