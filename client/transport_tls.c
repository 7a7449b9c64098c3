/*
 * TLS transport: OpenSSL directly, TLS 1.3 only, over the TCP transport's non-blocking socket.
 *
 * The server is verified against tls_ca and its certificate must name tls_server_name (or the
 * host we connected to; SSL_set1_host takes DNS names and IP literals alike). An optional
 * client certificate and key give mutual TLS. The socket is driven through a small BIO of our
 * own so that writes use MSG_NOSIGNAL (a library must not raise SIGPIPE in its host program).
 * OpenSSL's error queue is converted to TS_E* here and nowhere else.
 */
#include "client_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

struct tls_transport {
    struct ts_transport base;
    int fd;
    int rd_want;    /* what SSL_read needs to go on (TS_IO_*) when it would block */
    int wr_want;    /* what SSL_write needs */
    int last_errno; /* of the socket call that failed under OpenSSL */
    int rd_err;     /* a read failure after bytes were returned: the next recv reports it */
    SSL_CTX *ctx;
    SSL *ssl;
    BIO_METHOD *meth;
    char why[256];
};

/* ---- the socket BIO ------------------------------------------------------------------------- */

static int bio_write(BIO *b, const char *buf, int len)
{
    struct tls_transport *t = BIO_get_data(b);
    ssize_t n;

    BIO_clear_retry_flags(b);
    do {
        n = send(t->fd, buf, (size_t)len, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n >= 0)
        return (int)n;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_write(b);
    else
        t->last_errno = errno;
    return -1;
}

static int bio_read(BIO *b, char *buf, int len)
{
    struct tls_transport *t = BIO_get_data(b);
    ssize_t n;

    BIO_clear_retry_flags(b);
    do {
        n = recv(t->fd, buf, (size_t)len, 0);
    } while (n < 0 && errno == EINTR);
    if (n >= 0)
        return (int)n;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_read(b);
    else
        t->last_errno = errno;
    return -1;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

/* ---- errors -----------------------------------------------------------------------------------
 */

/* Refuses to prompt for a key's passphrase: a library has no terminal to ask on. */
static int no_passphrase(char *buf, int size, int rwflag, void *arg)
{
    return 0;
}

/* The first queued OpenSSL error, in words, into why; the queue is emptied. */
static void take_ssl_error(char *why, size_t cap, const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[200];

    if (e) {
        ERR_error_string_n(e, buf, sizeof(buf));
        snprintf(why, cap, "%s: %s", what, buf);
    } else {
        snprintf(why, cap, "%s", what);
    }
    ERR_clear_error();
}

/*
 * After a failed SSL_read/SSL_write/SSL_connect: 0 when it only would block (t->*_want says
 * on what), else the TS_E* code, with the reason in t->why.
 */
static int ssl_fail(struct tls_transport *t, int ret, int *want)
{
    int err = SSL_get_error(t->ssl, ret);
    unsigned long e;

    switch (err) {
    case SSL_ERROR_WANT_READ:
        *want = TS_IO_READ;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        *want = TS_IO_WRITE;
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        snprintf(t->why, sizeof(t->why), "the server closed the TLS session");
        return TS_ECONNRESET;
    case SSL_ERROR_SYSCALL:
        ERR_clear_error();
        if (t->last_errno) {
            snprintf(t->why, sizeof(t->why), "%s", strerror(t->last_errno));
            return ts_from_errno(t->last_errno);
        }
        snprintf(t->why, sizeof(t->why), "the server closed the connection");
        return TS_ECONNRESET;
    default:
        e = ERR_peek_error();
        if (ERR_GET_LIB(e) == ERR_LIB_SSL &&
            ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            ERR_clear_error();
            snprintf(t->why, sizeof(t->why), "the server closed the connection");
            return TS_ECONNRESET;
        }
        take_ssl_error(t->why, sizeof(t->why), "TLS");
        return TS_ETLS;
    }
}

/* ---- connect ------------------------------------------------------------------------------- */

static int is_ip_literal(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];

    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

static int make_ctx(struct tls_transport *t, const struct ts_conn_params *p)
{
    if ((p->tls_cert == NULL) != (p->tls_key == NULL)) {
        ts_conn_err(p, "a TLS client certificate needs its key and the other way round");
        return TS_EINVAL;
    }
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->ctx)
        goto out_ssl;
    if (!SSL_CTX_set_min_proto_version(t->ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_max_proto_version(t->ctx, TLS1_3_VERSION))
        goto out_ssl;
    SSL_CTX_set_default_passwd_cb(t->ctx, no_passphrase);
    SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (!SSL_CTX_load_verify_locations(t->ctx, p->tls_ca, NULL)) {
        take_ssl_error(t->why, sizeof(t->why), "cannot load the CA bundle");
        ts_conn_err(p, "%s (%s)", t->why, p->tls_ca);
        return TS_ETLS;
    }
    if (p->tls_cert && !SSL_CTX_use_certificate_chain_file(t->ctx, p->tls_cert)) {
        take_ssl_error(t->why, sizeof(t->why), "cannot load the client certificate");
        ts_conn_err(p, "%s (%s)", t->why, p->tls_cert);
        return TS_ETLS;
    }
    if (p->tls_key && (!SSL_CTX_use_PrivateKey_file(t->ctx, p->tls_key, SSL_FILETYPE_PEM) ||
                       !SSL_CTX_check_private_key(t->ctx))) {
        take_ssl_error(t->why, sizeof(t->why), "cannot use the client key");
        ts_conn_err(p, "%s (%s)", t->why, p->tls_key);
        return TS_ETLS;
    }
    return 0;

out_ssl:
    take_ssl_error(t->why, sizeof(t->why), "cannot set up TLS");
    ts_conn_err(p, "%s", t->why);
    return TS_ETLS;
}

static int make_ssl(struct tls_transport *t, const struct ts_conn_params *p)
{
    const char *name = p->tls_server_name && p->tls_server_name[0] ? p->tls_server_name : p->host;
    BIO *bio;

    t->meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tessera-socket");
    if (!t->meth || !BIO_meth_set_write(t->meth, bio_write) ||
        !BIO_meth_set_read(t->meth, bio_read) || !BIO_meth_set_ctrl(t->meth, bio_ctrl))
        goto out_ssl;
    t->ssl = SSL_new(t->ctx);
    if (!t->ssl)
        goto out_ssl;
    bio = BIO_new(t->meth);
    if (!bio)
        goto out_ssl;
    BIO_set_data(bio, t);
    BIO_set_init(bio, 1);
    SSL_set_bio(t->ssl, bio, bio);
    /* Hostname (or IP) check as part of verification; SNI only for names. */
    if (!SSL_set1_host(t->ssl, name))
        goto out_ssl;
    if (!is_ip_literal(name) && !SSL_set_tlsext_host_name(t->ssl, name))
        goto out_ssl;
    return 0;

out_ssl:
    take_ssl_error(t->why, sizeof(t->why), "cannot set up TLS");
    ts_conn_err(p, "%s", t->why);
    return TS_ETLS;
}

static int handshake(struct tls_transport *t, const struct ts_conn_params *p)
{
    uint64_t deadline = p->timeout_ms >= 0 ? ts_now_mono_ns() + p->timeout_ms * 1000000ull : 0;
    int ret, rc, want = 0, left;
    long verify;

    for (;;) {
        ERR_clear_error();
        t->last_errno = 0;
        ret = SSL_connect(t->ssl);
        if (ret == 1)
            return 0;
        rc = ssl_fail(t, ret, &want);
        if (rc)
            break;
        left = -1;
        if (deadline) {
            uint64_t now = ts_now_mono_ns();
            left = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
        }
        rc = ts_fd_wait(t->fd, want, left);
        if (rc < 0)
            break;
        if (rc == 0) {
            ts_conn_err(p, "TLS handshake with %s:%s timed out", p->host, p->port);
            return TS_ETIMEDOUT;
        }
    }
    verify = SSL_get_verify_result(t->ssl);
    if (verify != X509_V_OK) {
        ts_conn_err(p, "TLS handshake with %s:%s: certificate verify failed: %s", p->host, p->port,
                    X509_verify_cert_error_string(verify));
        return TS_ETLS;
    }
    ts_conn_err(p, "TLS handshake with %s:%s failed: %s", p->host, p->port, t->why);
    /* Whatever broke the handshake, the session could not be set up. */
    return rc == TS_ETIMEDOUT ? rc : TS_ETLS;
}

static void tls_close(struct ts_transport *tt)
{
    struct tls_transport *t = (struct tls_transport *)tt;

    if (!t)
        return;
    if (t->ssl) {
        ERR_clear_error();
        if (SSL_is_init_finished(t->ssl))
            (void)SSL_shutdown(t->ssl); /* best effort close_notify; never blocks */
        SSL_free(t->ssl);
    }
    SSL_CTX_free(t->ctx);
    BIO_meth_free(t->meth);
    if (t->fd >= 0)
        close(t->fd);
    ERR_clear_error();
    free(t);
}

static int tls_connect(struct ts_transport **out, const struct ts_conn_params *p)
{
    struct tls_transport *t;
    int rc;

    *out = NULL;
    if (!p->tls_ca) {
        ts_conn_err(p, "TLS needs a CA bundle to verify the server");
        return TS_EINVAL;
    }
    t = calloc(1, sizeof(*t));
    if (!t)
        return TS_ENOMEM;
    t->base.ops = &ts_transport_tls;
    t->fd = -1;
    t->rd_want = TS_IO_READ;
    t->wr_want = TS_IO_WRITE;
    rc = make_ctx(t, p);
    if (rc)
        goto out_free;
    rc = ts_tcp_connect_fd(p, &t->fd);
    if (rc)
        goto out_free;
    rc = make_ssl(t, p);
    if (rc)
        goto out_free;
    rc = handshake(t, p);
    if (rc)
        goto out_free;
    *out = &t->base;
    return 0;

out_free:
    tls_close(&t->base);
    return rc;
}

/* ---- data ----------------------------------------------------------------------------------- */

static long tls_send(struct ts_transport *tt, const struct iovec *iov, int iovcnt)
{
    struct tls_transport *t = (struct tls_transport *)tt;
    long total = 0;
    size_t n;
    int ret, rc;

    /* TLS has no writev: one SSL_write per element, each possibly partial. */
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len == 0)
            continue;
        ERR_clear_error();
        t->last_errno = 0;
        ret = SSL_write_ex(t->ssl, iov[i].iov_base, iov[i].iov_len, &n);
        if (ret <= 0) {
            rc = ssl_fail(t, ret, &t->wr_want);
            if (rc)
                return total ? total : rc;
            return total;
        }
        t->wr_want = TS_IO_WRITE;
        total += (long)n;
        if (n < iov[i].iov_len)
            break;
    }
    return total;
}

static long tls_recv(struct ts_transport *tt, const struct iovec *iov, int iovcnt)
{
    struct tls_transport *t = (struct tls_transport *)tt;
    long total = 0;
    size_t n;
    int ret, rc;

    if (t->rd_err)
        return t->rd_err;
    /*
     * TLS has no readv, and SSL_read returns one record at most: read until the buffers are
     * full or OpenSSL would block, so that a short count means there is nothing more now.
     */
    for (int i = 0; i < iovcnt; i++) {
        uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            ERR_clear_error();
            t->last_errno = 0;
            ret = SSL_read_ex(t->ssl, p, left, &n);
            if (ret <= 0) {
                rc = ssl_fail(t, ret, &t->rd_want);
                if (rc && total)
                    t->rd_err = rc; /* the bytes first; tls_wait reports readiness for it */
                return total ? total : rc;
            }
            t->rd_want = TS_IO_READ;
            total += (long)n;
            p += n;
            left -= n;
        }
    }
    return total;
}

static int tls_wait(struct ts_transport *tt, int events, int timeout_ms)
{
    struct tls_transport *t = (struct tls_transport *)tt;
    int ev = 0, rc;

    /* Bytes already decrypted inside OpenSSL (or a failure to report) do not show up on the
     * socket. */
    if ((events & TS_IO_READ) && (SSL_pending(t->ssl) > 0 || t->rd_err))
        return TS_IO_READ;
    if (events & TS_IO_READ)
        ev |= t->rd_want;
    if (events & TS_IO_WRITE)
        ev |= t->wr_want;
    rc = ts_fd_wait(t->fd, ev, timeout_ms);
    return rc > 0 ? events : rc;
}

static int tls_pollfd(struct ts_transport *tt, int events, int *fd, short *pevents)
{
    struct tls_transport *t = (struct tls_transport *)tt;
    int ev = 0;

    if ((events & TS_IO_READ) && (SSL_pending(t->ssl) > 0 || t->rd_err))
        return 1;
    if (events & TS_IO_READ)
        ev |= t->rd_want;
    if (events & TS_IO_WRITE)
        ev |= t->wr_want;
    *fd = t->fd;
    *pevents = ts_poll_events(ev);
    return 0;
}

static const char *tls_error(struct ts_transport *tt)
{
    struct tls_transport *t = (struct tls_transport *)tt;

    return t->why[0] ? t->why : NULL;
}

const struct ts_transport_ops ts_transport_tls = {
    .name = "tls",
    .connect = tls_connect,
    .send = tls_send,
    .recv = tls_recv,
    .wait = tls_wait,
    .error = tls_error,
    .pollfd = tls_pollfd,
    .close = tls_close,
};
