/* The tessera error space: strings generated from TS_ERRNO_TABLE, conversions at the edges. */
#include "ts_common.h"

#include <errno.h>

const char *ts_strerror(int rc)
{
    switch (rc) {
    case 0:
        return "success";
#define TS_ERRNO_MSG(name, value, msg)                                                             \
    case name:                                                                                     \
        return msg;
        TS_ERRNO_TABLE(TS_ERRNO_MSG)
#undef TS_ERRNO_MSG
    default:
        return "unknown error";
    }
}

const char *ts_errname(int rc)
{
    switch (rc) {
    case 0:
        return "TS_OK";
#define TS_ERRNO_NAME(name, value, msg)                                                            \
    case name:                                                                                     \
        return #name;
        TS_ERRNO_TABLE(TS_ERRNO_NAME)
#undef TS_ERRNO_NAME
    default:
        return "TS_E?";
    }
}

int ts_from_errno(int err)
{
    switch (err) {
    case 0:
        return TS_OK;
    case EINVAL:
        return TS_EINVAL;
    case ENOMEM:
        return TS_ENOMEM;
    case ENOENT:
        return TS_ENOENT;
    case EEXIST:
        return TS_EEXIST;
    case ENOSPC:
    case EDQUOT:
        return TS_ENOSPC;
    case ETIMEDOUT:
        return TS_ETIMEDOUT;
    case ECONNREFUSED:
        return TS_ECONNREFUSED;
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
        return TS_ECONNRESET;
    case EACCES:
    case EPERM:
        return TS_EPERM;
    case EAGAIN:
    case EBUSY:
        return TS_EBUSY;
    case ENOTSUP:
        return TS_ENOTSUP;
    case ECANCELED:
        return TS_ECANCELED;
    case ERANGE:
        return TS_ERANGE;
    case EFBIG:
    case EMSGSIZE:
        return TS_ETOOBIG;
    default:
        return TS_EIO;
    }
}
