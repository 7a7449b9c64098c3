/*
 * Cluster map: libconfig file, wire codec, and placement.
 *
 * Placement is weighted rendezvous (highest random weight) hashing. Every (pg, node) pair gets
 * an independent pseudo-random u in (0,1) from a 64-bit hash, and the score -weight/ln(u).
 * -ln(u)/weight is exponentially distributed with rate weight, so the node with the highest
 * score (the smallest of those exponentials) is node i with probability weight_i / sum(weight):
 * each node is primary, and (approximately) replica, for its weight's share of PGs.
 *
 * Movement. A PG's ranking of the old nodes does not depend on any other node, so adding node Z
 * only inserts Z somewhere into each PG's ranking. The top-3 set of a PG changes iff Z lands in
 * the top 3, and then by exactly one slot (Z in, the old third out). With N equal-weight nodes Z
 * is equally likely to land at each of the N+1 ranks, so a PG changes with probability 3/(N+1):
 * 3*pg_count/(N+1) of the 3*pg_count replica slots move, a fraction of 1/(N+1). That is the
 * minimum, since Z must end up holding its fair share of slots and each of them had to move.
 * The count is binomial; for pg_count = 1024 its standard deviation is 4..8% of the mean for
 * N = 5..20, so the unit test's [0.5x, 1.6x] band is many deviations wide. Removing a node is the
 * reverse: only PGs that had it in their top 3 change, each by that one slot, refilled by the
 * next node in the ranking.
 *
 * Failure domains reorder the ranking: the first node of each domain, in ranking order, then
 * everything else in ranking order. Adding Z to domain d changes at most d's first node, so a
 * PG's top 3 still changes by at most one slot (Z in); removing a node, when the PG's top 3 are
 * all firsts of their domains (at least 3 domains), changes only that node's slot.
 *
 * Determinism across machines: the hash is integer arithmetic, and ln() is computed here with
 * IEEE-754 +, -, *, / only (each correctly rounded, no libm), so every platform gets the same
 * bits; contraction into fused multiply-adds is switched off for this reason.
 */
#include "ts_map.h"
#include "map_internal.h"

#include "ts_common.h"
#include "ts_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define MIN_NODE_WIRE 13 /* four empty strings (2 bytes each), a u32 and a u8 */

const char *ts_node_state_name(int state)
{
    switch (state) {
    case TS_NODE_UP:
        return "up";
    case TS_NODE_DOWN:
        return "down";
    case TS_NODE_OUT:
        return "out";
    }
    return "?";
}

static int state_parse(const char *s)
{
    if (!strcmp(s, "up"))
        return TS_NODE_UP;
    if (!strcmp(s, "down"))
        return TS_NODE_DOWN;
    if (!strcmp(s, "out"))
        return TS_NODE_OUT;
    return -1;
}

/* ---- validation, shared by the parser, the writer and the decoder ---------------------- */

void map_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

static int id_valid(const char *s)
{
    if (!s[0])
        return 0;
    for (; *s; s++)
        if (!id_char(*s))
            return 0;
    return 1;
}

/* Domains may also name paths such as "zone-1/rack-4" or "dc:row". */
static int domain_valid(const char *s)
{
    for (; *s; s++)
        if (!id_char(*s) && *s != '/' && *s != ':')
            return 0;
    return 1;
}

int ts_map_domain_valid(const char *s)
{
    return s && s[0] && strlen(s) < sizeof(((struct ts_map_node *)0)->domain) && domain_valid(s);
}

/* "host:port" or "[v6]:port"; host of [A-Za-z0-9.-], port 1..65535. */
static int addr_valid(const char *s)
{
    const char *colon, *p;
    unsigned long port = 0;

    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close == s + 1 || close[1] != ':')
            return 0;
        for (p = s + 1; p < close; p++)
            if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
                  (*p >= 'A' && *p <= 'F') || *p == ':' || *p == '.'))
                return 0;
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s)
            return 0;
        for (p = s; p < colon; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
                return 0;
    }
    if (!colon[1])
        return 0;
    for (p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        port = port * 10 + (unsigned long)(*p - '0');
        if (port > 65535)
            return 0;
    }
    return port > 0;
}

static int str_terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

/*
 * Checks what every map must satisfy. On failure returns the index of the offending node
 * (or -1 for the map itself) through *bad and writes a message; returns 0 when valid.
 */
int map_check(const struct ts_map *m, long *bad, char *err, size_t errlen)
{
    size_t up = 0;

    *bad = -1;
    if (m->pg_count == 0 || m->pg_count > TS_MAP_MAX_PGS) {
        map_errf(err, errlen, "pg_count must be 1..%d, not %u", TS_MAP_MAX_PGS, m->pg_count);
        return -1;
    }
    if (m->placement_pgs && m->pg_count % m->placement_pgs) {
        map_errf(err, errlen, "placement_pgs %u must divide pg_count %u", m->placement_pgs,
                 m->pg_count);
        return -1;
    }
    if (m->epoch > TS_MAP_MAX_EPOCH) {
        map_errf(err, errlen, "epoch %llu is past the largest allowed (%lld)",
                 (unsigned long long)m->epoch, (long long)TS_MAP_MAX_EPOCH);
        return -1;
    }
    if (m->n == 0 || m->n > TS_MAP_MAX_NODES) {
        map_errf(err, errlen, "a map has 1..%d nodes, not %zu", TS_MAP_MAX_NODES, m->n);
        return -1;
    }
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *a = &m->nodes[i];

        *bad = (long)i;
        if (!str_terminated(a->id, sizeof(a->id)) || !str_terminated(a->addr, sizeof(a->addr)) ||
            !str_terminated(a->tls_addr, sizeof(a->tls_addr)) ||
            !str_terminated(a->domain, sizeof(a->domain))) {
            map_errf(err, errlen, "node %zu: a string is not terminated", i);
            return -1;
        }
        if (!id_valid(a->id)) {
            map_errf(err, errlen, "node id '%s' must be 1..%zu characters of [A-Za-z0-9._-]", a->id,
                     sizeof(a->id) - 1);
            return -1;
        }
        if (!addr_valid(a->addr)) {
            map_errf(err, errlen, "node '%s': addr '%s' is not host:port", a->id, a->addr);
            return -1;
        }
        if (a->tls_addr[0] && !addr_valid(a->tls_addr)) {
            map_errf(err, errlen, "node '%s': tls_addr '%s' is not host:port (or \"\")", a->id,
                     a->tls_addr);
            return -1;
        }
        if (a->weight == 0) {
            map_errf(err, errlen, "node '%s': weight must be > 0", a->id);
            return -1;
        }
        if (!domain_valid(a->domain)) {
            map_errf(err, errlen, "node '%s': domain '%s' may hold only [A-Za-z0-9._:/-]", a->id,
                     a->domain);
            return -1;
        }
        if (a->state != TS_NODE_UP && a->state != TS_NODE_DOWN && a->state != TS_NODE_OUT) {
            map_errf(err, errlen, "node '%s': state %d is not up, down or out", a->id, a->state);
            return -1;
        }
        if (a->tls_addr[0] && !strcmp(a->addr, a->tls_addr)) {
            map_errf(err, errlen, "node '%s': addr and tls_addr are both %s", a->id, a->addr);
            return -1;
        }
        for (size_t j = 0; j < i; j++) {
            const struct ts_map_node *b = &m->nodes[j];
            const char *dup = NULL;

            if (!strcmp(a->id, b->id)) {
                map_errf(err, errlen, "duplicate node id '%s'", a->id);
                return -1;
            }
            if (!strcmp(a->addr, b->addr) || (b->tls_addr[0] && !strcmp(a->addr, b->tls_addr)))
                dup = a->addr;
            else if (a->tls_addr[0] &&
                     (!strcmp(a->tls_addr, b->addr) || !strcmp(a->tls_addr, b->tls_addr)))
                dup = a->tls_addr;
            if (dup) {
                map_errf(err, errlen, "nodes '%s' and '%s' both use address %s", b->id, a->id, dup);
                return -1;
            }
        }
        up += a->state == TS_NODE_UP;
    }
    *bad = -1;
    if (up == 0) {
        map_errf(err, errlen, "no node is up: every PG would be without a primary");
        return -1;
    }
    if (map_hot_check(m, err, errlen))
        return -1;
    return m->move ? map_move_check(m, err, errlen) : 0;
}

/* ---- allocation -------------------------------------------------------------------------- */

struct ts_map *map_alloc(size_t n)
{
    struct ts_map *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->nodes = calloc(n ? n : 1, sizeof(*m->nodes));
    if (!m->nodes) {
        free(m);
        return NULL;
    }
    m->n = n;
    return m;
}

void ts_map_free(struct ts_map *m)
{
    if (!m)
        return;
    map_move_free(m->move);
    free(m->hot);
    free(m->nodes);
    free(m);
}

struct ts_map *ts_map_dup(const struct ts_map *m)
{
    struct ts_map *d;

    if (!m)
        return NULL;
    d = map_alloc(m->n);
    if (!d)
        return NULL;
    d->epoch = m->epoch;
    d->pg_count = m->pg_count;
    d->placement_pgs = m->placement_pgs;
    if (m->n)
        memcpy(d->nodes, m->nodes, m->n * sizeof(*m->nodes));
    if (m->move && ts_map_move_set(d, m->move->from, m->move->nfrom, m->move->pg, m->move->paused,
                                   m->move->rate) != 0) {
        ts_map_free(d);
        return NULL;
    }
    if (m->move) {
        d->move->driver = m->move->driver;
        d->move->concurrent = m->move->concurrent;
        ts_map_move_set_from_placement(d, m->move->from_placement);
    }
    if (map_hot_copy(d, m) != 0) {
        ts_map_free(d);
        return NULL;
    }
    return d;
}

int ts_map_find(const struct ts_map *m, const char *id)
{
    if (!m || !id)
        return -1;
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->nodes[i].id, id))
            return (int)i;
    return -1;
}

/* ---- libconfig file ---------------------------------------------------------------------- */

static const char *const top_keys[] = {"epoch", "pg_count",  "placement_pgs",
                                       "nodes", "rebalance", "hot"};
static const char *const node_keys[] = {"id", "addr", "tls_addr", "weight", "domain", "state"};

int map_key_known(const char *name, const char *const *keys, size_t n)
{
    for (size_t i = 0; name && i < n; i++)
        if (!strcmp(name, keys[i]))
            return 1;
    return 0;
}

int map_cfg_fail(char *err, size_t errlen, const char *where, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (line > 0)
        map_errf(err, errlen, "%s:%d: %s", where, line, msg);
    else
        map_errf(err, errlen, "%s: %s", where, msg);
    return TS_ECONFIG;
}

int map_cfg_int(config_setting_t *parent, const char *name, int required, long long lo,
                unsigned long long hi, unsigned long long *out, const char *where, char *err,
                size_t errlen)
{
    config_setting_t *s = config_setting_get_member(parent, name);
    long long v;

    if (!s) {
        if (required)
            return map_cfg_fail(err, errlen, where, config_setting_source_line(parent),
                                "missing setting '%s'", name);
        return 1;
    }
    if (config_setting_type(s) != CONFIG_TYPE_INT && config_setting_type(s) != CONFIG_TYPE_INT64)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(s),
                            "'%s' must be an integer", name);
    v = config_setting_get_int64(s);
    if (v < lo || (unsigned long long)v > hi)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(s),
                            "'%s' must be in [%lld, %llu], got %lld", name, lo, hi, v);
    *out = (unsigned long long)v;
    return 0;
}

int map_cfg_str(config_setting_t *parent, const char *name, int required, char *out, size_t cap,
                const char *where, char *err, size_t errlen)
{
    config_setting_t *s = config_setting_get_member(parent, name);
    const char *v;

    if (!s) {
        if (required)
            return map_cfg_fail(err, errlen, where, config_setting_source_line(parent),
                                "missing setting '%s'", name);
        return 1;
    }
    if (config_setting_type(s) != CONFIG_TYPE_STRING)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(s),
                            "'%s' must be a string", name);
    v = config_setting_get_string(s);
    if (strlen(v) >= cap)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(s),
                            "'%s' is longer than %zu characters", name, cap - 1);
    memcpy(out, v, strlen(v) + 1);
    return 0;
}

int map_cfg_node(config_setting_t *g, struct ts_map_node *nd, const char *where, char *err,
                 size_t errlen)
{
    unsigned long long w = 0;
    char state[16];
    int rc;

    if (!config_setting_is_group(g))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(g),
                            "each entry of 'nodes' must be a group { id = ...; addr = ...; }");
    for (int i = 0; i < config_setting_length(g); i++) {
        config_setting_t *e = config_setting_get_elem(g, (unsigned)i);
        if (!map_key_known(config_setting_name(e), node_keys, TS_ARRAY_SIZE(node_keys)))
            return map_cfg_fail(err, errlen, where, config_setting_source_line(e),
                                "unknown node setting '%s'", config_setting_name(e));
    }
    if ((rc = map_cfg_str(g, "id", 1, nd->id, sizeof(nd->id), where, err, errlen)) < 0 ||
        (rc = map_cfg_str(g, "addr", 1, nd->addr, sizeof(nd->addr), where, err, errlen)) < 0 ||
        (rc = map_cfg_str(g, "tls_addr", 0, nd->tls_addr, sizeof(nd->tls_addr), where, err,
                          errlen)) < 0 ||
        (rc = map_cfg_str(g, "domain", 0, nd->domain, sizeof(nd->domain), where, err, errlen)) <
            0 ||
        (rc = map_cfg_int(g, "weight", 1, 0, UINT32_MAX, &w, where, err, errlen)) < 0)
        return rc;
    nd->weight = (uint32_t)w;
    nd->state = TS_NODE_UP;
    rc = map_cfg_str(g, "state", 0, state, sizeof(state), where, err, errlen);
    if (rc < 0)
        return map_cfg_fail(err, errlen, where,
                            config_setting_source_line(config_setting_get_member(g, "state")),
                            "node state must be \"up\", \"down\" or \"out\"");
    if (rc == 0) {
        nd->state = state_parse(state);
        if (nd->state < 0)
            return map_cfg_fail(err, errlen, where,
                                config_setting_source_line(config_setting_get_member(g, "state")),
                                "node state must be \"up\", \"down\" or \"out\", not \"%s\"",
                                state);
    }
    return 0;
}

static int parse_cfg(config_t *cf, const char *where, struct ts_map **out, char *err, size_t errlen)
{
    config_setting_t *root = config_root_setting(cf), *list;
    unsigned long long epoch = 0, pg_count = 0, placement = 0;
    struct ts_map *m;
    long bad;
    char msg[384];
    int rc, n;

    for (int i = 0; i < config_setting_length(root); i++) {
        config_setting_t *e = config_setting_get_elem(root, (unsigned)i);
        if (!map_key_known(config_setting_name(e), top_keys, TS_ARRAY_SIZE(top_keys)))
            return map_cfg_fail(err, errlen, where, config_setting_source_line(e),
                                "unknown setting '%s'", config_setting_name(e));
    }
    if ((rc = map_cfg_int(root, "epoch", 1, 0, INT64_MAX, &epoch, where, err, errlen)) < 0 ||
        (rc = map_cfg_int(root, "pg_count", 1, 1, UINT32_MAX, &pg_count, where, err, errlen)) < 0 ||
        (rc = map_cfg_int(root, "placement_pgs", 0, 1, UINT32_MAX, &placement, where, err,
                          errlen)) < 0)
        return rc;
    if (placement && pg_count % placement)
        return map_cfg_fail(
            err, errlen, where,
            config_setting_source_line(config_setting_get_member(root, "placement_pgs")),
            "placement_pgs %llu must divide pg_count %llu", placement, pg_count);
    list = config_setting_get_member(root, "nodes");
    if (!list)
        return map_cfg_fail(err, errlen, where, 0, "missing setting 'nodes'");
    if (!config_setting_is_list(list))
        return map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                            "'nodes' must be a list: nodes = ( { ... }, { ... } );");
    n = config_setting_length(list);
    if (n < 1 || n > TS_MAP_MAX_NODES)
        return map_cfg_fail(err, errlen, where, config_setting_source_line(list),
                            "'nodes' must list 1..%d nodes, not %d", TS_MAP_MAX_NODES, n);

    m = map_alloc((size_t)n);
    if (!m)
        return map_cfg_fail(err, errlen, where, 0, "out of memory");
    m->epoch = epoch;
    m->pg_count = (uint32_t)pg_count;
    m->placement_pgs = placement == pg_count ? 0 : (uint32_t)placement;
    for (int i = 0; i < n; i++) {
        rc = map_cfg_node(config_setting_get_elem(list, (unsigned)i), &m->nodes[i], where, err,
                          errlen);
        if (rc < 0)
            goto out_free_map;
    }
    rc = map_move_parse(config_setting_get_member(root, "rebalance"), m, where, err, errlen);
    if (rc < 0)
        goto out_free_map;
    rc = map_hot_parse(config_setting_get_member(root, "hot"), m, where, err, errlen);
    if (rc < 0)
        goto out_free_map;
    if (map_check(m, &bad, msg, sizeof(msg))) {
        int line = config_setting_source_line(list);
        if (bad >= 0)
            line = config_setting_source_line(config_setting_get_elem(list, (unsigned)bad));
        rc = map_cfg_fail(err, errlen, where, line, "%s", msg);
        goto out_free_map;
    }
    *out = m;
    return 0;

out_free_map:
    ts_map_free(m);
    return rc;
}

int ts_map_parse_string(const char *text, struct ts_map **out, char *err, size_t errlen)
{
    config_t cf;
    int rc;

    if (!text || !out)
        return TS_EINVAL;
    config_init(&cf);
    if (config_read_string(&cf, text) != CONFIG_TRUE) {
        rc = map_cfg_fail(err, errlen, "map", config_error_line(&cf), "%s", config_error_text(&cf));
        goto out_destroy;
    }
    rc = parse_cfg(&cf, "map", out, err, errlen);
out_destroy:
    config_destroy(&cf);
    return rc;
}

int ts_map_parse_file(const char *path, struct ts_map **out, char *err, size_t errlen)
{
    config_t cf;
    FILE *f;
    int rc;

    if (!path || !out)
        return TS_EINVAL;
    f = fopen(path, "re");
    if (!f) {
        map_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return TS_ECONFIG;
    }
    config_init(&cf);
    if (config_read(&cf, f) != CONFIG_TRUE) {
        rc = map_cfg_fail(err, errlen, path, config_error_line(&cf), "%s", config_error_text(&cf));
        goto out_destroy;
    }
    rc = parse_cfg(&cf, path, out, err, errlen);
out_destroy:
    config_destroy(&cf);
    fclose(f);
    return rc;
}

void map_emit_node(FILE *f, const struct ts_map_node *nd, int last)
{
    fprintf(f,
            "  { id = \"%s\"; addr = \"%s\"; tls_addr = \"%s\"; weight = %lu%s; "
            "domain = \"%s\"; state = \"%s\"; }%s\n",
            nd->id, nd->addr, nd->tls_addr, (unsigned long)nd->weight,
            nd->weight > INT32_MAX ? "L" : "", nd->domain, ts_node_state_name(nd->state),
            last ? "" : ",");
}

/* Writes the map; every string was validated, so none needs escaping. */
static int emit(FILE *f, const struct ts_map *m)
{
    fprintf(f, "# tessera cluster map (libconfig). The epoch grows with every change.\n");
    fprintf(f, "epoch = %llu%s;\n", (unsigned long long)m->epoch, m->epoch > INT32_MAX ? "L" : "");
    fprintf(f, "pg_count = %lu%s;\n", (unsigned long)m->pg_count,
            m->pg_count > INT32_MAX ? "L" : "");
    if (m->placement_pgs && m->placement_pgs != m->pg_count)
        fprintf(f,
                "# Split: PG pg is placed as PG pg %% placement_pgs (each child with its parent).\n"
                "placement_pgs = %lu%s;\n",
                (unsigned long)m->placement_pgs, m->placement_pgs > INT32_MAX ? "L" : "");
    fprintf(f, "nodes = (\n");
    for (size_t i = 0; i < m->n; i++)
        map_emit_node(f, &m->nodes[i], i + 1 == m->n);
    fprintf(f, ");\n");
    map_hot_emit(f, m);
    if (m->move)
        map_move_emit(f, m);
    return ferror(f) ? TS_EIO : 0;
}

static int fsync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    int fd, rc = 0;

    if (!slash)
        dir = strdup(".");
    else if (slash == path)
        dir = strdup("/");
    else
        dir = strndup(path, (size_t)(slash - path));
    if (!dir)
        return TS_ENOMEM;
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc = ts_from_errno(errno);
        goto out_free_dir;
    }
    if (fsync(fd) != 0)
        rc = ts_from_errno(errno);
    close(fd);
out_free_dir:
    free(dir);
    return rc;
}

int ts_map_write_file(const struct ts_map *m, const char *path)
{
    char *tmp = NULL;
    FILE *f;
    long bad;
    int fd, rc;

    if (!m || !path || !m->nodes || map_check(m, &bad, NULL, 0) || m->epoch > (uint64_t)INT64_MAX)
        return TS_EINVAL;
    if (asprintf(&tmp, "%s.tmp", path) < 0)
        return TS_ENOMEM;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = ts_from_errno(errno);
        goto out_free_tmp;
    }
    f = fdopen(fd, "w");
    if (!f) {
        rc = ts_from_errno(errno);
        close(fd);
        goto out_unlink;
    }
    rc = emit(f, m);
    if (rc == 0 && fflush(f) != 0)
        rc = ts_from_errno(errno);
    if (rc == 0 && fsync(fd) != 0)
        rc = ts_from_errno(errno);
    if (fclose(f) != 0 && rc == 0)
        rc = ts_from_errno(errno);
    if (rc)
        goto out_unlink;
    if (rename(tmp, path) != 0) {
        rc = ts_from_errno(errno);
        goto out_unlink;
    }
    rc = fsync_dir_of(path);
    goto out_free_tmp;

out_unlink:
    unlink(tmp);
out_free_tmp:
    free(tmp);
    return rc;
}

/* ---- wire --------------------------------------------------------------------------------- */

void ts_map_encode(struct ts_wr *w, const struct ts_map *m)
{
    ts_wr_u64(w, m->epoch);
    ts_wr_u32(w, m->pg_count);
    ts_wr_u32(w, (uint32_t)m->n);
    for (size_t i = 0; i < m->n; i++)
        map_node_encode(w, &m->nodes[i]);
    map_move_encode(w, m);
    map_hot_encode(w, m);
    ts_wr_u32(w, m->placement_pgs == m->pg_count ? 0 : m->placement_pgs);
}

void map_node_encode(struct ts_wr *w, const struct ts_map_node *nd)
{
    ts_wr_str(w, nd->id);
    ts_wr_str(w, nd->addr);
    ts_wr_str(w, nd->tls_addr);
    ts_wr_u32(w, nd->weight);
    ts_wr_str(w, nd->domain);
    ts_wr_u8(w, (uint8_t)nd->state);
}

void map_node_decode(struct ts_rd *r, struct ts_map_node *nd)
{
    ts_rd_str(r, nd->id, sizeof(nd->id));
    ts_rd_str(r, nd->addr, sizeof(nd->addr));
    ts_rd_str(r, nd->tls_addr, sizeof(nd->tls_addr));
    nd->weight = ts_rd_u32(r);
    ts_rd_str(r, nd->domain, sizeof(nd->domain));
    nd->state = ts_rd_u8(r);
}

int ts_map_decode(struct ts_rd *r, struct ts_map **out)
{
    uint64_t epoch;
    uint32_t pg_count, placement, n;
    struct ts_map *m;
    long bad;

    epoch = ts_rd_u64(r);
    pg_count = ts_rd_u32(r);
    n = ts_rd_u32(r);
    if (r->err)
        return TS_EPROTO;
    /* Sizes are checked before anything is allocated. */
    if (n == 0 || n > TS_MAP_MAX_NODES || (size_t)n * MIN_NODE_WIRE > r->len - r->off) {
        r->err = TS_EPROTO;
        return TS_EPROTO;
    }
    m = map_alloc(n);
    if (!m)
        return TS_ENOMEM;
    m->epoch = epoch;
    m->pg_count = pg_count;
    for (uint32_t i = 0; i < n && !r->err; i++)
        map_node_decode(r, &m->nodes[i]);
    if (!r->err && map_move_decode(r, m) != 0)
        r->err = TS_EPROTO;
    if (!r->err && map_hot_decode(r, m) != 0)
        r->err = TS_EPROTO;
    placement = ts_rd_u32(r); /* last: it came with splits, after the rest */
    if (placement == pg_count)
        r->err = TS_EPROTO; /* every PG on its own is 0 on the wire: one encoding per map */
    m->placement_pgs = placement;
    if (!r->err && m->move &&
        ts_map_move_set_from_placement(m, m->move->from_placement) != 0) /* re-derived */
        r->err = TS_EPROTO;
    if (r->err || map_check(m, &bad, NULL, 0)) {
        r->err = TS_EPROTO;
        goto out_free_map;
    }
    *out = m;
    return 0;

out_free_map:
    ts_map_free(m);
    return TS_EPROTO;
}

/* ---- placement ---------------------------------------------------------------------------- */

uint32_t ts_pg_of_hashed(uint32_t dataset_crc, uint32_t shard, uint32_t pg_count)
{
    uint8_t b[4];

    if (!pg_count)
        return 0;
    ts_put_be32(b, shard);
    return ts_crc32c(dataset_crc, b, 4) % pg_count;
}

uint32_t ts_pg_of(const char *dataset, uint32_t shard, uint32_t pg_count)
{
    if (!pg_count || !dataset)
        return 0;
    return ts_pg_of_hashed(ts_crc32c(0, dataset, strlen(dataset)), shard, pg_count);
}

uint32_t ts_map_pg_of(const struct ts_map *m, const char *dataset, uint32_t shard)
{
    return m ? ts_pg_of(dataset, shard, m->pg_count) : 0;
}

uint32_t ts_map_placement_pgs(const struct ts_map *m)
{
    if (!m)
        return 0;
    return m->placement_pgs && m->placement_pgs < m->pg_count ? m->placement_pgs : m->pg_count;
}

int ts_map_pg_count_splits(uint32_t old_count, uint32_t new_count)
{
    if (!old_count || new_count <= old_count || new_count > TS_MAP_MAX_PGS || new_count % old_count)
        return 0;
    new_count /= old_count;
    return (new_count & (new_count - 1)) == 0;
}

/* The SplitMix64 finalizer: a bijection with full avalanche. Note map_mix64(0) == 0. */
uint64_t map_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* 64-bit FNV-1a of a string, then mixed: a node's key, independent of the PG. */
uint64_t map_str_key(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ull;
    }
    return map_mix64(h);
}

/* The hash of (pg, node): both inputs go through a full mix, so no structure survives. */
static uint64_t pg_node_hash(uint32_t pg, uint64_t node_key)
{
    return map_mix64(node_key ^ map_mix64((uint64_t)pg + 0x9e3779b97f4a7c15ull));
}

/*
 * ln(x) for x in (0,1) with IEEE +, -, *, / only, so the bits are the same everywhere.
 * x = m * 2^e with m in [sqrt(1/2), 1); ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172,
 * by its series to s^25 (error below 1e-19 relative). Strictly negative for x < 1.
 */
double map_det_ln(double x)
{
    static const double ln2 = 0.69314718055994530942;
    double m, s, s2, p;
    int e;

    /* Scaling by 2 is exact: m * 2^e == x throughout. */
    m = x;
    e = 0;
    while (m < 0.70710678118654752440) {
        m = m * 2.0; /* exact */
        e--;
    }
    s = (m - 1.0) / (m + 1.0);
    s2 = s * s;
    p = 1.0 / 25.0;
    for (int k = 23; k >= 1; k -= 2) {
        p = p * s2;
        p = p + 1.0 / (double)k;
    }
    p = p * s;
    p = 2.0 * p;
    return (double)e * ln2 + p;
}

struct rank {
    double score;
    uint64_t dom; /* key of the failure domain */
    const char *id;
    int idx;
    int taken;
};

static int rank_cmp(const void *a, const void *b)
{
    const struct rank *x = a, *y = b;

    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return strcmp(x->id, y->id); /* ids are unique: a total order */
}

const char *ts_map_node_domain(const struct ts_map_node *nd)
{
    return nd->domain[0] ? nd->domain : nd->id;
}

size_t ts_map_pg_order(const struct ts_map *m, uint32_t pg, int *out, size_t max)
{
    int local[64], *t = local;
    size_t n, k;

    if (!m || !m->move || pg >= m->pg_count || m->move->pg[pg] == TS_PG_SETTLED)
        return ts_map_pg_target_order(m, pg, out, max);
    /* A PG a rebalance has not moved yet: the old table's order, then the target's other
     * nodes (the ones it brings in among them: they get the PG's log). */
    n = map_move_old_order(m, pg, out, max);
    if (n == max)
        return n;
    if (max > TS_ARRAY_SIZE(local) && !(t = malloc(max * sizeof(*t))))
        return n;
    k = ts_map_pg_target_order(m, pg, t, max);
    for (size_t i = 0; i < k && n < max; i++) {
        size_t j = 0;
        while (j < n && out[j] != t[i])
            j++;
        if (j == n)
            out[n++] = t[i];
    }
    if (t != local)
        free(t);
    return n;
}

size_t ts_map_pg_target_order(const struct ts_map *m, uint32_t pg, int *out, size_t max)
{
    struct rank local[64], *r = local;
    size_t nr = 0, cnt = 0;
    uint32_t place = ts_map_placement_pgs(m); /* a child PG is placed as its parent */

    if (!m || !out || !max || !m->n)
        return 0;
    if (m->n > TS_ARRAY_SIZE(local)) {
        r = malloc(m->n * sizeof(*r));
        if (!r)
            return 0;
    }
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        uint64_t h;
        double u;

        if (nd->state != TS_NODE_UP || nd->weight == 0)
            continue;
        h = pg_node_hash(place ? pg % place : pg, map_str_key(nd->id));
        /* u = (k + 1/2) / 2^52 for the top 52 bits k: exact, and strictly inside (0,1). */
        u = ((double)(h >> 12) + 0.5) * (1.0 / 4503599627370496.0);
        r[nr].score = (double)nd->weight / -map_det_ln(u);
        r[nr].dom = map_str_key(ts_map_node_domain(nd));
        r[nr].id = nd->id;
        r[nr].idx = (int)i;
        r[nr].taken = 0;
        nr++;
    }
    qsort(r, nr, sizeof(*r), rank_cmp);

    /* First pass: the first node of each failure domain, in ranking order. */
    for (size_t i = 0; i < nr && cnt < max; i++) {
        int used = 0;
        for (size_t j = 0; j < cnt && !used; j++) {
            const struct rank *t = &r[out[j] /* rank position, see below */];
            used = t->dom == r[i].dom && !strcmp(ts_map_node_domain(&m->nodes[t->idx]),
                                                 ts_map_node_domain(&m->nodes[r[i].idx]));
        }
        if (used)
            continue;
        r[i].taken = 1;
        out[cnt++] = (int)i; /* rank positions for now; turned into node indexes below */
    }
    /* Then everything skipped, in ranking order. */
    for (size_t i = 0; i < nr && cnt < max; i++)
        if (!r[i].taken)
            out[cnt++] = (int)i;
    for (size_t i = 0; i < cnt; i++)
        out[i] = r[out[i]].idx;

    if (r != local)
        free(r);
    return cnt;
}
