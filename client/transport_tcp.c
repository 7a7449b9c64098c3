/*
 * Plain TCP transport: a non-blocking socket with TCP_NODELAY; poll() gives the timeouts.
 * errno is converted to TS_E* here, once.
 */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

struct tcp_transport {
    struct ts_transport base;
    int fd;
};

void ts_conn_err(const struct ts_conn_params *p, const char *fmt, ...)
{
    va_list ap;

    if (!p->err || !p->errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(p->err, p->errlen, fmt, ap);
    va_end(ap);
}

/* errno of a failed connect -> TS_E*. */
static int connect_errno(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case EADDRNOTAVAIL:
        return TS_ECONNREFUSED;
    case ETIMEDOUT:
        return TS_ETIMEDOUT;
    default:
        return ts_from_errno(err);
    }
}

short ts_poll_events(int events)
{
    short ev = 0;

    if (events & TS_IO_READ)
        ev |= POLLIN;
    if (events & TS_IO_WRITE)
        ev |= POLLOUT;
    return ev;
}

int ts_fd_wait(int fd, int events, int timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = ts_poll_events(events)};
    int n, ready = 0;

    do {
        n = poll(&pfd, 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return ts_from_errno(errno);
    if (n == 0)
        return 0;
    /* Errors and hang-ups count as ready: the next send or recv reports them. */
    if (pfd.revents & (POLLIN | POLLERR | POLLHUP))
        ready |= TS_IO_READ;
    if (pfd.revents & (POLLOUT | POLLERR | POLLHUP))
        ready |= TS_IO_WRITE;
    return ready ? ready : events;
}

static int set_socket_opts(int fd)
{
    int one = 1, fl, rcvbuf = 4 << 20;

    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return ts_from_errno(errno);
    /* Not every stream socket is TCP (tests use socketpairs): NODELAY may fail there. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    /* Room for a whole 1 MiB chunk reply and more in flight (set before connect so the
     * window scale allows it). */
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    return 0;
}

/* Connects fd to ai within timeout_ms; 0 or TS_E*, the errno behind it in *err. */
static int connect_one(int fd, const struct addrinfo *ai, int timeout_ms, int *err)
{
    socklen_t elen = sizeof(*err);
    int rc;

    *err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR) {
        *err = errno;
        return connect_errno(errno);
    }
    rc = ts_fd_wait(fd, TS_IO_WRITE, timeout_ms);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return TS_ETIMEDOUT;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, err, &elen) < 0) {
        *err = errno;
        return ts_from_errno(errno);
    }
    return *err ? connect_errno(*err) : 0;
}

int ts_tcp_connect_fd(const struct ts_conn_params *p, int *out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    uint64_t deadline = p->timeout_ms >= 0 ? ts_now_mono_ns() + p->timeout_ms * 1000000ull : 0;
    int rc = TS_ECONNREFUSED, grc, fd = -1, left, err = 0;

    *out = -1;
    grc = getaddrinfo(p->host, p->port, &hints, &res);
    if (grc != 0) {
        ts_conn_err(p, "cannot resolve %s:%s: %s", p->host, p->port,
                    grc == EAI_SYSTEM ? strerror(errno) : gai_strerror(grc));
        return grc == EAI_MEMORY ? TS_ENOMEM : TS_EINVAL;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = ts_from_errno(errno);
            continue;
        }
        rc = set_socket_opts(fd);
        if (rc == 0) {
            left = -1;
            if (deadline) {
                uint64_t now = ts_now_mono_ns();
                left = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
            }
            rc = connect_one(fd, ai, left, &err);
        }
        if (rc == 0)
            break;
        /* Words only where they add to the code's own message. */
        if (rc == TS_ETIMEDOUT)
            ts_conn_err(p, "no answer within %d ms", p->timeout_ms);
        else if (err && err != ECONNREFUSED)
            ts_conn_err(p, "%s", strerror(err));
        close(fd);
        fd = -1;
        if (rc == TS_ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    *out = fd;
    return 0;
}

int ts_tcp_from_fd(struct ts_transport **out, int fd)
{
    struct tcp_transport *t;
    int rc;

    *out = NULL;
    rc = set_socket_opts(fd);
    if (rc)
        return rc;
    t = calloc(1, sizeof(*t));
    if (!t)
        return TS_ENOMEM;
    t->base.ops = &ts_transport_tcp;
    t->fd = fd;
    *out = &t->base;
    return 0;
}

static int tcp_connect(struct ts_transport **out, const struct ts_conn_params *p)
{
    int fd, rc;

    rc = ts_tcp_connect_fd(p, &fd);
    if (rc)
        return rc;
    rc = ts_tcp_from_fd(out, fd);
    if (rc)
        goto out_close;
    return 0;

out_close:
    close(fd);
    return rc;
}

static long tcp_send(struct ts_transport *tt, const struct iovec *iov, int iovcnt)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
    ssize_t n;

    do {
        n = sendmsg(t->fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n >= 0)
        return (long)n;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    return ts_from_errno(errno);
}

static long tcp_recv(struct ts_transport *tt, const struct iovec *iov, int iovcnt)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
    size_t len = 0;
    ssize_t n;

    for (int i = 0; i < iovcnt; i++)
        len += iov[i].iov_len;
    do {
        n = recvmsg(t->fd, &msg, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0)
        return (long)n;
    if (n == 0)
        return len ? TS_ECONNRESET : 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    return ts_from_errno(errno);
}

static int tcp_wait(struct ts_transport *tt, int events, int timeout_ms)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;

    return ts_fd_wait(t->fd, events, timeout_ms);
}

static int tcp_pollfd(struct ts_transport *tt, int events, int *fd, short *pevents)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;

    *fd = t->fd;
    *pevents = ts_poll_events(events);
    return 0;
}

/* SO_RCVLOWAT: poll() on the socket says readable only once that many bytes are queued (the
 * kernel caps it at half the receive buffer, and wakes anyway when the window closes). */
static int tcp_rx_lowat(struct ts_transport *tt, size_t bytes)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;
    int v = (int)TS_MIN(TS_MAX(bytes, (size_t)1), (size_t)INT32_MAX);

    if (setsockopt(t->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) < 0)
        return ts_from_errno(errno);
    return 0;
}

static void tcp_close(struct ts_transport *tt)
{
    struct tcp_transport *t = (struct tcp_transport *)tt;

    if (!t)
        return;
    close(t->fd);
    free(t);
}

const struct ts_transport_ops ts_transport_tcp = {
    .name = "tcp",
    .connect = tcp_connect,
    .send = tcp_send,
    .recv = tcp_recv,
    .wait = tcp_wait,
    .pollfd = tcp_pollfd,
    .close = tcp_close,
    .rx_lowat = tcp_rx_lowat,
};
