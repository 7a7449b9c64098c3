/*
 * tessera logging hooks.
 *
 * The library never prints. Programs that want its log lines install a callback; the
 * callback may be called from any thread of the library and must be thread-safe.
 */
#ifndef TESSERA_LOG_H
#define TESSERA_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum ts_log_level {
    TS_LOG_ERROR = 0,
    TS_LOG_WARN = 1,
    TS_LOG_INFO = 2,
    TS_LOG_DEBUG = 3,
};

/*
 * level: a ts_log_level; facility: the module ("storage", "server", "client", ...);
 * rc: the TS_E* code the line is about, or 0; msg: the formatted line, no newline.
 * The strings are only valid during the call.
 */
typedef void (*ts_log_fn)(void *arg, int level, const char *facility, int rc, const char *msg);

/* Install (or with fn == NULL remove) the process-wide log callback; lines above level are
 * dropped before they are formatted. Not thread-safe against concurrent log calls: set it once
 * at start-up. */
void ts_log_set(ts_log_fn fn, void *arg, int level);

/* A ready-made callback that writes "time level facility: msg [TS_E...]" to stderr. */
void ts_log_stderr(void *arg, int level, const char *facility, int rc, const char *msg);

/* Parse "error", "warn", "info", "debug"; returns the level or TS_EINVAL. */
int ts_log_level_parse(const char *name);

#ifdef __cplusplus
}
#endif
#endif
