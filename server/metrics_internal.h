/* The metrics thread (http.c) and the rendering (metrics_text.c): what they share. */
#ifndef TSD_METRICS_INTERNAL_H
#define TSD_METRICS_INTERNAL_H

#include <event2/buffer.h>

#include "hotness.h"
#include "metrics.h"
#include "server_internal.h"

/* http.c: the metrics thread: drains the workers' hotness rings into the window every
 * TSD_METRICS_TICK_MS, checks that the workers' loops turn, and serves metrics_listen. */
#define TSD_METRICS_TICK_MS 100
int tsd_metrics_start(struct tsd_server *s);
void tsd_metrics_stop(struct tsd_server *s); /* joins the thread; NULL-safe on s->metrics */
/* The hotness window (lock it around any use from another thread). */
void tsd_metrics_hot_lock(struct tsd_server *s);
void tsd_metrics_hot_unlock(struct tsd_server *s);
struct tsd_hot *tsd_metrics_hot(struct tsd_server *s);
/* The metrics listener's bound address ("" when off). */
const char *tsd_metrics_addr(struct tsd_server *s);

/* metrics_text.c: every series; RocksDB's figures. */
int tsd_metrics_render(struct tsd_server *s, struct evbuffer *o);
void tsd_metrics_render_engine(struct tsd_server *s, struct evbuffer *o);

#endif
