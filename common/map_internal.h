/* Shared inside the map module: map.c (file, wire, placement), map_move.c (a rebalance's
 * state in the map) and map_hot.c (hot datasets). */
#ifndef TS_MAP_INTERNAL_H
#define TS_MAP_INTERNAL_H

#include "ts_map.h"

#include <libconfig.h>
#include <stdio.h>

struct ts_rd;
struct ts_wr;

void map_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reports "where:line: msg" and returns TS_ECONFIG. */
int map_cfg_fail(char *err, size_t errlen, const char *where, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A setting: 0 read, 1 absent and not required, TS_ECONFIG with the message otherwise. */
int map_cfg_int(config_setting_t *parent, const char *name, int required, long long lo,
                unsigned long long hi, unsigned long long *out, const char *where, char *err,
                size_t errlen);
int map_cfg_str(config_setting_t *parent, const char *name, int required, char *out, size_t cap,
                const char *where, char *err, size_t errlen);
int map_cfg_node(config_setting_t *g, struct ts_map_node *nd, const char *where, char *err,
                 size_t errlen);
int map_key_known(const char *name, const char *const *keys, size_t n);

struct ts_map *map_alloc(size_t n);
/* Every check of a map (its move included); *bad the offending node or -1. */
int map_check(const struct ts_map *m, long *bad, char *err, size_t errlen);
void map_emit_node(FILE *f, const struct ts_map_node *nd, int last);
void map_node_encode(struct ts_wr *w, const struct ts_map_node *nd);
void map_node_decode(struct ts_rd *r, struct ts_map_node *nd);

/* map.c: the hashing under placement, shared with map_ec.c. */
uint64_t map_mix64(uint64_t x);
uint64_t map_str_key(const char *s); /* a node id's or domain's 64-bit key */
double map_det_ln(double x);         /* ln(x) for x in (0,1), the same bits on every machine */

/* map_move.c */
int map_move_parse(config_setting_t *g, struct ts_map *m, const char *where, char *err,
                   size_t errlen); /* g NULL: no rebalance */
void map_move_emit(FILE *f, const struct ts_map *m);
void map_move_encode(struct ts_wr *w, const struct ts_map *m);
int map_move_decode(struct ts_rd *r, struct ts_map *m);
int map_move_check(const struct ts_map *m, char *err, size_t errlen);
void map_move_free(struct ts_map_move *mv);
/* The placement a PENDING or MOVING PG keeps: its order under the table before the rebalance. */
size_t map_move_old_order(const struct ts_map *m, uint32_t pg, int *out, size_t max);

/* map_hot.c */
int map_hot_parse(config_setting_t *list, struct ts_map *m, const char *where, char *err,
                  size_t errlen); /* list NULL: none */
void map_hot_emit(FILE *f, const struct ts_map *m);
void map_hot_encode(struct ts_wr *w, const struct ts_map *m);
int map_hot_decode(struct ts_rd *r, struct ts_map *m);
int map_hot_check(const struct ts_map *m, char *err, size_t errlen);
int map_hot_copy(struct ts_map *d, const struct ts_map *m);

#endif
