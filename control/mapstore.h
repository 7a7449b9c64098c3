/*
 * The cluster map in etcd (control/mapstore.c): one key, PREFIX/map, holding the map's wire form
 * (docs/protocol.md "cluster map"). Every change is one compare-and-swap on the key's mod
 * revision, so the map has one history: each epoch is written once, by one writer, and grows by
 * one. A writer that lost the race gets the map that won and may build its change again on it.
 */
#ifndef TS_MAPSTORE_H
#define TS_MAPSTORE_H

#include "etcd.h"
#include "ts_map.h"

/* The key of a cluster's map: "<prefix>/map" into buf. */
const char *ts_mapstore_key(const char *prefix, char *buf, size_t cap);

/* The map etcd holds: 0 with *m (ts_map_free) and its mod revision, TS_ENOENT when none was
 * stored yet, TS_EPROTO for a value that is not a map. */
int ts_mapstore_get(ts_etcd *e, const char *prefix, struct ts_map **m, int64_t *rev);

/* Stores the first map of a cluster (epoch >= 1) unless one is there: TS_EEXIST then. */
int ts_mapstore_init(ts_etcd *e, const char *prefix, const struct ts_map *m);

/*
 * One change: change(arg, cur, &next, why, cap) builds the next map from the current one (0), or
 * refuses (a TS_E*, why says why: nothing is written). The next map must have epoch cur + 1.
 * Stored by compare-and-swap; when another change came first, change is called again on the new
 * map, up to tries times in all. 0 with the stored map's epoch in *epoch, the refusal, or
 * TS_ESTALE ("the map changed under you" in why) when every try lost.
 */
typedef int (*ts_mapstore_change_fn)(void *arg, const struct ts_map *cur, struct ts_map **next,
                                     char *why, size_t cap);
int ts_mapstore_change(ts_etcd *e, const char *prefix, ts_mapstore_change_fn change, void *arg,
                       int tries, uint64_t *epoch, char *why, size_t cap);

#endif
