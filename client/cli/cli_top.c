/*
 * tessera CLI: `tessera top`: polls every node's STATUS, measures rates between polls and draws
 * the cluster on the terminal in place (plain ANSI: cursor home, clear to end), sized to the
 * terminal. The frame itself is cli_top_draw.c, the anomalies cli_anomaly.c. The terminal is
 * put in non-canonical, no-echo mode only while it runs (to read 'q' key by key) and given back
 * as it was on 'q', Ctrl-C, SIGTERM or SIGHUP.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_top.h"
#include "ts_map.h"

#define TOP_NODES_MAX 256
#define TOP_ANOMALIES 64
#define TOP_STALLS 64
#define TOP_TIMEOUT_MS 2000 /* a node that takes longer is shown as not answering */

static volatile sig_atomic_t top_stop;

static void on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One node's counters at the last poll, to measure rates from. */
struct top_prev {
    char id[64];
    int valid;
    double t, read_bytes, bytes_in, requests, hits, misses;
    double silent_since; /* when it stopped answering (0: it answers) */
    char error[160];
};

struct top {
    struct ctx *x;
    size_t n;
    struct top_prev prev[TOP_NODES_MAX];
    struct json_object *doc[TOP_NODES_MAX];
    struct cli_node_obs obs[TOP_NODES_MAX];
    double hit[TOP_NODES_MAX];
    char state[TOP_NODES_MAX][8];
    struct cli_anomaly an[TOP_ANOMALIES];
    struct cli_top_stall stalls[TOP_STALLS];
    size_t nstalls;
    char prom_err[256];
    int prom_failed;
    int rates;
};

static struct top_prev *prev_of(struct top *t, const char *id, size_t i)
{
    if (strcmp(t->prev[i].id, id) != 0) { /* the map changed under it: start over */
        memset(&t->prev[i], 0, sizeof(t->prev[i]));
        snprintf(t->prev[i].id, sizeof(t->prev[i].id), "%s", id);
    }
    return &t->prev[i];
}

static double rate_of(double now, double before, double dt)
{
    return now >= before && dt > 0 ? (now - before) / dt : -1;
}

/* Asks every node for its STATUS and measures what changed since the last poll. */
static void top_poll(struct top *t)
{
    const struct ts_map *m = ts_client_map(t->x->c);
    int measured = 0;

    for (size_t i = 0; i < t->n; i++)
        json_object_put(t->doc[i]);
    memset(t->doc, 0, sizeof(t->doc));
    t->n = m ? (m->n < TOP_NODES_MAX ? m->n : TOP_NODES_MAX) : 1;
    for (size_t i = 0; i < t->n; i++) {
        const char *id = m ? m->nodes[i].id : tessera_client_node(t->x->c);
        struct top_prev *p = prev_of(t, id && id[0] ? id : t->x->server, i);
        struct cli_node_obs *o = &t->obs[i];
        char *json = NULL;
        double now;
        int rc;

        rc = m ? ts_client_node_status(t->x->c, i, &json) : tessera_status(t->x->c, &json);
        now = mono_s();
        memset(o, 0, sizeof(*o));
        o->id = p->id;
        o->read_bps = o->write_bps = o->req_ps = -1;
        t->hit[i] = -1;
        if (m) {
            snprintf(t->state[i], sizeof(t->state[i]), "%s", ts_node_state_name(m->nodes[i].state));
            o->map_state = t->state[i];
        }
        if (!rc && !(t->doc[i] = json_tokener_parse(json)))
            rc = TS_EPROTO;
        free(json);
        if (rc) {
            snprintf(p->error, sizeof(p->error), "%s (%s)", ts_strerror(rc), ts_errname(rc));
            if (!p->silent_since)
                p->silent_since = now;
            o->error = p->error;
            o->silent_s = now - p->silent_since;
            p->valid = 0;
            continue;
        }
        o->status = t->doc[i];
        p->silent_since = 0;
        {
            double rb = cli_json_num(o->status, "stats.read_bytes", 0),
                   bi = cli_json_num(o->status, "stats.bytes_in", 0),
                   rq = cli_json_num(o->status, "stats.requests", 0),
                   h = cli_json_num(o->status, "cache.hits", 0),
                   ms = cli_json_num(o->status, "cache.misses", 0), dt = now - p->t;
            if (p->valid) {
                o->read_bps = rate_of(rb, p->read_bytes, dt);
                o->write_bps = rate_of(bi, p->bytes_in, dt);
                o->req_ps = rate_of(rq, p->requests, dt);
                if (h >= p->hits && ms >= p->misses && h + ms > p->hits + p->misses)
                    t->hit[i] = 100.0 * (h - p->hits) / (h + ms - p->hits - p->misses);
                measured = 1;
            }
            p->valid = 1;
            p->t = now;
            p->read_bytes = rb;
            p->bytes_in = bi;
            p->requests = rq;
            p->hits = h;
            p->misses = ms;
        }
    }
    t->rates = measured;
}

static void top_prometheus(struct top *t)
{
    char *body = NULL;
    int rc;

    t->nstalls = 0;
    t->prom_failed = 0;
    if (!t->x->prometheus)
        return;
    rc = cli_prom_query(t->x->prometheus, CLI_TOP_STALL_QUERY, 1000, &body, t->prom_err,
                        sizeof(t->prom_err));
    if (!rc)
        rc = cli_prom_parse_stalls(body, t->stalls, TOP_STALLS, &t->nstalls, t->prom_err,
                                   sizeof(t->prom_err));
    free(body);
    t->prom_failed = rc != 0;
}

static void screen_size(int *rows, int *cols)
{
    struct winsize ws;

    *rows = 24;
    *cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

/* Draws the frame: in ANSI mode over the last one (built first, written at once). */
static int top_draw(struct top *t, int ansi)
{
    const struct ts_map *m = ts_client_map(t->x->c);
    struct cli_top_view v;
    char clock[16], *buf = NULL;
    size_t len = 0, nan;
    time_t now = time(NULL);
    struct tm tm;
    FILE *f;

    localtime_r(&now, &tm);
    strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
    nan = cli_anomalies(t->obs, t->n, NULL, t->an, TOP_ANOMALIES);
    memset(&v, 0, sizeof(v));
    v.server = t->x->server;
    v.clock = clock;
    v.interval_s = t->x->top_interval;
    v.map_epoch = m ? m->epoch : 0;
    v.pg_count = m ? m->pg_count : 0;
    v.rates = t->rates;
    v.nodes = t->obs;
    v.hit_pct = t->hit;
    v.n = t->n;
    v.an = t->an;
    v.nan = nan;
    v.nan_kept = nan < TOP_ANOMALIES ? nan : TOP_ANOMALIES;
    v.prom_url = t->x->prometheus;
    v.prom_error = t->prom_failed ? t->prom_err : NULL;
    v.stalls = t->stalls;
    v.nstalls = t->nstalls;
    v.ansi = ansi;
    screen_size(&v.rows, &v.cols);
    if (!ansi)
        v.rows = 0; /* --once: every line, for scripts */
    if (!ansi && !isatty(STDOUT_FILENO))
        v.cols = 160;
    f = open_memstream(&buf, &len);
    if (!f)
        return TS_ENOMEM;
    if (ansi)
        fputs("\033[H", f);
    cli_top_render(&v, f);
    if (ansi)
        fputs("\033[J", f);
    if (fclose(f) != 0) {
        free(buf);
        return TS_ENOMEM;
    }
    fwrite(buf, 1, len, stdout);
    fflush(stdout);
    free(buf);
    return 0;
}

/* Waits up to secs for 'q' on the terminal (or a signal): 1 when it is time to quit. */
static int top_wait(double secs, int tty)
{
    double end = mono_s() + secs;

    while (!top_stop) {
        double left = end - mono_s();
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        char ch[16];
        ssize_t got;
        if (left <= 0)
            return 0;
        if (!tty) {
            struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
            nanosleep(&ts, NULL);
            continue;
        }
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        got = read(STDIN_FILENO, ch, sizeof(ch));
        if (got == 0)
            return 1; /* the terminal went away */
        for (ssize_t i = 0; i < got; i++)
            if (ch[i] == 'q' || ch[i] == 'Q' || ch[i] == 3 /* Ctrl-C without ISIG */)
                return 1;
    }
    return 1;
}

int cmd_top(struct ctx *x)
{
    struct sigaction sa, old_int, old_term, old_hup;
    struct termios saved, raw;
    struct top *t;
    int ansi = !x->top_once && isatty(STDOUT_FILENO), tty = 0, rc = 0;
    uint64_t iter = 0;

    t = calloc(1, sizeof(*t));
    if (!t)
        return TS_ENOMEM;
    t->x = x;
    if (!x->timeout_set)
        ts_client_set_timeout(x->c, TOP_TIMEOUT_MS);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    if (ansi && isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0) {
        raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tty = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    if (ansi) /* the alternate screen (given back on exit), cursor hidden */
        fputs("\033[?1049h\033[?25l\033[H\033[2J", stdout);
    if (x->top_once) { /* two polls an interval apart: one frame with its rates */
        top_poll(t);
        top_wait(x->top_interval, 0);
    }
    while (!top_stop) {
        top_poll(t);
        top_prometheus(t);
        rc = top_draw(t, ansi);
        if (rc || x->top_once || (x->top_iterations && ++iter >= x->top_iterations))
            break;
        if (top_wait(x->top_interval, tty))
            break;
    }
    if (ansi) {
        fputs("\033[?25h\033[?1049l", stdout);
        fflush(stdout);
    }
    if (tty)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    for (size_t i = 0; i < t->n; i++)
        json_object_put(t->doc[i]);
    free(t);
    return rc;
}
