/*
 * tessera error space.
 *
 * Every tessera function that can fail returns 0 on success or one negative TS_E* code from
 * the table below. The same table generates ts_strerror() and ts_errname(); codes are stable
 * and travel on the wire (reply status), so new codes are only ever appended.
 */
#ifndef TESSERA_ERRNO_H
#define TESSERA_ERRNO_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define TS_ERRNO_TABLE(X)                                                                          \
    X(TS_EINVAL, 1, "invalid argument")                                                            \
    X(TS_ENOMEM, 2, "out of memory")                                                               \
    X(TS_EIO, 3, "I/O error")                                                                      \
    X(TS_ENOENT, 4, "no such dataset or shard")                                                    \
    X(TS_EEXIST, 5, "already exists")                                                              \
    X(TS_ECORRUPT, 6, "checksum mismatch: stored or received data is corrupt")                     \
    X(TS_EINCOMPLETE, 7, "shard or dataset is incomplete")                                         \
    X(TS_ESEALED, 8, "dataset or shard is sealed and cannot be modified")                          \
    X(TS_ENOTSUP, 9, "operation not supported by this build or peer")                              \
    X(TS_EPROTO, 10, "protocol error: malformed frame")                                            \
    X(TS_ETOOBIG, 11, "size exceeds the configured limit")                                         \
    X(TS_ETIMEDOUT, 12, "operation timed out")                                                     \
    X(TS_ECONNREFUSED, 13, "connection refused")                                                   \
    X(TS_ECONNRESET, 14, "connection lost")                                                        \
    X(TS_EPERM, 15, "permission denied for this role")                                             \
    X(TS_ESTALE, 16, "stale cluster map epoch")                                                    \
    X(TS_EBUSY, 17, "resource busy, try again")                                                    \
    X(TS_ENOSPC, 18, "no space left on device")                                                    \
    X(TS_ETLS, 19, "TLS error")                                                                    \
    X(TS_EAUTH, 20, "authentication required or failed")                                           \
    X(TS_ECANCELED, 21, "operation canceled")                                                      \
    X(TS_EUNAVAIL, 22, "not enough replicas available")                                            \
    X(TS_EDB, 23, "storage engine error")                                                          \
    X(TS_ECONFIG, 24, "invalid configuration")                                                     \
    X(TS_ERANGE, 25, "offset or length out of range")                                              \
    X(TS_ENAME, 26, "invalid name")                                                                \
    X(TS_EINTERNAL, 27, "internal error")                                                          \
    X(TS_ESHUTDOWN, 28, "server is shutting down")                                                 \
    X(TS_EFRAGMENTED, 29, "erasure-coded: the replicas hold no bytes; read the fragments")

enum ts_errno {
    TS_OK = 0,
#define TS_ERRNO_ENUM(name, value, msg) name = -(value),
    TS_ERRNO_TABLE(TS_ERRNO_ENUM)
#undef TS_ERRNO_ENUM
};

/* Human-readable message for a TS_E* code (or 0); never NULL, also for unknown codes. */
const char *ts_strerror(int rc);
/* Symbolic name of a TS_E* code ("TS_ECORRUPT"); "TS_OK" for 0, "TS_E?" if unknown. */
const char *ts_errname(int rc);

#ifdef __cplusplus
}
#endif
#endif
