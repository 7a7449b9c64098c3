/*
 * `tessera top`'s pieces that do not need a server, reachable by the unit tests: the frame drawn
 * from what a poll found (cli_top_draw.c, pure) and the Prometheus query for job stalls
 * (cli_top_prom.c). The command itself (polling, the terminal) is cli_top.c.
 */
#ifndef TS_CLI_TOP_H
#define TS_CLI_TOP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli_anomaly.h"

/* One rank's data stall: seconds stalled per second (0.25: a quarter of its time waiting). */
struct cli_top_stall {
    char rank[32];
    double stall_per_s;
};

/* Everything one frame shows; the caller owns every pointer. */
struct cli_top_view {
    const char *server; /* the address asked */
    const char *clock;  /* the local time of the poll, "14:03:22" */
    double interval_s;  /* between polls */
    uint64_t map_epoch; /* 0: no map (a single node) */
    uint32_t pg_count;  /* of the map */
    int rates;          /* whether the nodes' rates are measured (a second poll) */
    const struct cli_node_obs *nodes;
    const double *hit_pct; /* per node: cache hits between the polls, %; < 0 unknown */
    size_t n;
    const struct cli_anomaly *an; /* the first nan_kept of nan anomalies */
    size_t nan, nan_kept;
    const char *prom_url;   /* NULL: no --prometheus */
    const char *prom_error; /* the query failed: why */
    const struct cli_top_stall *stalls;
    size_t nstalls;
    int rows, cols; /* the screen; rows 0: as many lines as it takes */
    int ansi;       /* clear each line's end (a frame drawn over the last one) */
};

/* Draws one frame to out: lines of at most v->cols bytes, at most v->rows of them (the lists
 * shortened to fit, anomalies first). In ANSI mode no newline follows the last line. */
void cli_top_render(const struct cli_top_view *v, FILE *out);

/* ---- Prometheus (cli_top_prom.c) ----------------------------------------------------------- */

/* The query `top` asks: each rank's stall seconds per second over the last minute. */
#define CLI_TOP_STALL_QUERY "sum by (rank) (rate(tessera_job_data_stall_seconds_total[1m]))"

/*
 * GET URL/api/v1/query?query=Q over HTTP/1.0 on a plain TCP socket (URL "http://HOST:PORT",
 * optionally with a path prefix; no TLS), within timeout_ms. 0 and the body in *body (malloc'ed,
 * the caller frees it), or TS_EINVAL (a URL it cannot use), TS_EUNAVAIL (no connection),
 * TS_ETIMEDOUT, TS_EPROTO (not HTTP 200); err[cap] says why.
 */
int cli_prom_query(const char *url, const char *q, int timeout_ms, char **body, char *err,
                   size_t cap);
/* Parses a Prometheus instant-vector reply ({"status":"success","data":{"result":[{"metric":
 * {"rank":"0"},"value":[T,"0.12"]}]}}) into out[cap] (sorted by stall, largest first), the
 * count in *n. 0, or TS_EPROTO with err[cap] saying why. Pure. */
int cli_prom_parse_stalls(const char *body, struct cli_top_stall *out, size_t cap, size_t *n,
                          char *err, size_t errcap);

#endif
