/* Process-wide logging: a level, a callback, and a stderr sink for the programs. */
#include "ts_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <time.h>

int ts_log_level_cur = -1; /* nothing is formatted until a callback is installed */
static ts_log_fn log_fn;
static void *log_arg;

void ts_log_set(ts_log_fn fn, void *arg, int level)
{
    log_fn = fn;
    log_arg = arg;
    ts_log_level_cur = fn ? level : -1;
}

void ts_log_write(int level, const char *facility, int rc, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (!log_fn)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_fn(log_arg, level, facility, rc, msg);
}

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void ts_log_stderr(void *arg, int level, const char *facility, int rc, const char *msg)
{
    struct timespec ts;
    struct tm tm;
    char when[32];

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    if (level < 0 || level > TS_LOG_DEBUG)
        level = TS_LOG_ERROR;
    if (rc)
        fprintf(stderr, "%s.%03ldZ %-5s %s: %s [%s: %s]\n", when, ts.tv_nsec / 1000000,
                level_names[level], facility, msg, ts_errname(rc), ts_strerror(rc));
    else
        fprintf(stderr, "%s.%03ldZ %-5s %s: %s\n", when, ts.tv_nsec / 1000000, level_names[level],
                facility, msg);
}

int ts_log_level_parse(const char *name)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(level_names); i++)
        if (name && strcasecmp(name, level_names[i]) == 0)
            return (int)i;
    return TS_EINVAL;
}
