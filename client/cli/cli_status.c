/*
 * tessera CLI: the `status` command: one node's STATUS document as "key: value" lines and
 * tables, and on a cluster one section per node of the map with its replication state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_anomaly.h"
#include "ts_map.h"

/* ---- status -------------------------------------------------------------------------------- */

static int humanized_key(const char *key)
{
    size_t n = strlen(key);

    return strcmp(key, "bytes") == 0 || strcmp(key, "size") == 0 ||
           (n > 6 && strcmp(key + n - 6, "_bytes") == 0) ||
           (n > 5 && strcmp(key + n - 5, "_size") == 0);
}

/* Prints a JSON document as "a.b.c: value" lines; arrays of objects as tables. */
static void status_flatten(struct json_object *o, const char *prefix, struct cli_table *kv,
                           int *tables)
{
    char key[256], val[128], hs[32];

    if (json_object_is_type(o, json_type_object)) {
        json_object_object_foreach(o, k, v)
        {
            snprintf(key, sizeof(key), "%s%s%s", prefix, prefix[0] ? "." : "", k);
            if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
                json_object_is_type(json_object_array_get_idx(v, 0), json_type_object)) {
                (*tables)++;
                continue; /* printed after the scalars */
            }
            if (json_object_is_type(v, json_type_object) ||
                json_object_is_type(v, json_type_array)) {
                status_flatten(v, key, kv, tables);
                continue;
            }
            if (humanized_key(k) && json_object_is_type(v, json_type_int))
                snprintf(val, sizeof(val), "%s",
                         cli_human_size(json_object_get_uint64(v), hs, sizeof(hs)));
            else if (json_object_is_type(v, json_type_double))
                snprintf(val, sizeof(val), "%.1f", json_object_get_double(v));
            else
                snprintf(val, sizeof(val), "%s", json_object_get_string(v));
            if (!val[0])
                snprintf(val, sizeof(val), "-");
            const char *row[] = {key, val};
            cli_table_add(kv, row);
        }
    } else if (json_object_is_type(o, json_type_array)) {
        size_t n = json_object_array_length(o), off = 0;
        val[0] = '\0';
        for (size_t i = 0; i < n && off < sizeof(val); i++)
            off += (size_t)snprintf(val + off, sizeof(val) - off, "%s%s", i ? ", " : "",
                                    json_object_get_string(json_object_array_get_idx(o, i)));
        const char *row[] = {prefix, n ? val : "-"};
        cli_table_add(kv, row);
    }
}

/* Arrays of objects at the top level, one table each. */
static void status_tables(struct json_object *o)
{
    json_object_object_foreach(o, k, v)
    {
        struct json_object *first;
        const char *hdr[CLI_TABLE_MAXCOLS], *row[CLI_TABLE_MAXCOLS];
        char cells[CLI_TABLE_MAXCOLS][64], names[CLI_TABLE_MAXCOLS][64], hs[32];
        struct cli_table t;
        size_t ncols = 0;

        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
            continue;
        first = json_object_array_get_idx(v, 0);
        if (!json_object_is_type(first, json_type_object))
            continue;
        json_object_object_foreach(first, ck, cv)
        {
            (void)cv;
            if (ncols < CLI_TABLE_MAXCOLS)
                hdr[ncols++] = ck;
        }
        for (size_t i = 0; i < ncols; i++) { /* headers in capitals, like the other tables */
            size_t j = 0;
            for (; hdr[i][j] && j + 1 < sizeof(names[i]); j++)
                names[i][j] =
                    (char)(hdr[i][j] >= 'a' && hdr[i][j] <= 'z' ? hdr[i][j] - 32 : hdr[i][j]);
            names[i][j] = '\0';
            row[i] = names[i];
        }
        if (!ncols || cli_table_init(&t, ncols, 0, row))
            continue;
        for (size_t r = 0; r < json_object_array_length(v); r++) {
            struct json_object *e = json_object_array_get_idx(v, r), *ev;
            for (size_t i = 0; i < ncols; i++) {
                if (!json_object_object_get_ex(e, hdr[i], &ev))
                    snprintf(cells[i], sizeof(cells[i]), "-");
                else if (humanized_key(hdr[i]) && json_object_is_type(ev, json_type_int))
                    snprintf(cells[i], sizeof(cells[i]), "%s",
                             cli_human_size(json_object_get_uint64(ev), hs, sizeof(hs)));
                else
                    snprintf(cells[i], sizeof(cells[i]), "%s", json_object_get_string(ev));
                row[i] = cells[i];
            }
            cli_table_add(&t, row);
        }
        printf("\n%s:\n", k);
        cli_table_done(&t, 0, stdout);
    }
}

/* A JSON member as text ("-" when absent). */
static const char *jstr(struct json_object *o, const char *key, char *buf, size_t cap)
{
    struct json_object *v;

    if (!o || !json_object_object_get_ex(o, key, &v) || !v)
        return "-";
    if (json_object_is_type(v, json_type_double))
        snprintf(buf, cap, "%.3f", json_object_get_double(v));
    else
        snprintf(buf, cap, "%s", json_object_get_string(v));
    return buf;
}

/* A JSON member holding bytes, as a human-readable size ("-" when absent). */
static const char *jsize(struct json_object *o, const char *key, char *buf, size_t cap)
{
    struct json_object *v;

    if (json_object_object_get_ex(o, key, &v))
        return cli_human_size(json_object_get_uint64(v), buf, cap);
    snprintf(buf, cap, "-");
    return buf;
}

/* The "replication" object of a node's STATUS: replicas of the PGs it leads, and lagging ones. */
static void status_replication(struct json_object *rep)
{
    static const char *const rhdr[] = {"REPLICA",   "PGS",       "CORE_PGS",  "LAG_OPS",
                                       "LAG_BYTES", "MAX_LAG_S", "RECOVERING"};
    static const char *const lhdr[] = {"PG",      "REPLICA",   "ROLE",  "APPLIED",   "PRIMARY",
                                       "LAG_OPS", "LAG_BYTES", "LAG_S", "RECOVERING"};
    static const char *const phdr[] = {"PG", "STATE", "EPOCH", "SINCE_S", "WHY"};
    struct json_object *per, *lag, *peering;
    struct cli_table t;
    char b[9][64];

    printf("primary of %s PGs (%s active, %s peering), %s repairs; recovering %s replica PGs "
           "(not served from this node until confirmed)\n",
           jstr(rep, "primary_pgs", b[0], 64), jstr(rep, "pgs_active", b[2], 64),
           jstr(rep, "pgs_peering", b[3], 64), jstr(rep, "repairs", b[1], 64),
           jstr(rep, "pgs_not_confirmed", b[4], 64));
    if (json_object_object_get_ex(rep, "peering", &peering) &&
        json_object_is_type(peering, json_type_array) && json_object_array_length(peering) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(phdr), 0x0c, phdr) == 0) {
        for (size_t i = 0; i < json_object_array_length(peering); i++) {
            struct json_object *o = json_object_array_get_idx(peering, i);
            const char *row[] = {jstr(o, "pg", b[0], 64), jstr(o, "state", b[1], 64),
                                 jstr(o, "epoch", b[2], 64), jstr(o, "since_s", b[3], 64),
                                 json_object_get_string(json_object_object_get(o, "why"))};
            cli_table_add(&t, row);
        }
        printf("PGs it leads that do not take writes yet:\n");
        cli_table_done(&t, 0, stdout);
    }
    if (json_object_object_get_ex(rep, "replicas", &per) &&
        json_object_is_type(per, json_type_object) && json_object_object_length(per) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(rhdr), 0x7e, rhdr) == 0) {
        json_object_object_foreach(per, node, o)
        {
            const char *row[] = {node,
                                 jstr(o, "pgs", b[1], 64),
                                 jstr(o, "core_pgs", b[2], 64),
                                 jstr(o, "lag_ops", b[3], 64),
                                 jsize(o, "lag_bytes", b[4], 64),
                                 jstr(o, "max_lag_s", b[5], 64),
                                 jstr(o, "recovering_pgs", b[6], 64)};
            cli_table_add(&t, row);
        }
        printf("replicas of the PGs it leads:\n");
        cli_table_done(&t, 0, stdout);
    }
    if (json_object_object_get_ex(rep, "lag", &lag) && json_object_is_type(lag, json_type_array) &&
        json_object_array_length(lag) > 0 &&
        cli_table_init(&t, TS_ARRAY_SIZE(lhdr), 0xf9, lhdr) == 0) {
        for (size_t i = 0; i < json_object_array_length(lag); i++) {
            struct json_object *o = json_object_array_get_idx(lag, i);
            const char *row[] = {jstr(o, "pg", b[0], 64),
                                 jstr(o, "node", b[1], 64),
                                 jstr(o, "role", b[2], 64),
                                 jstr(o, "applied", b[3], 64),
                                 jstr(o, "primary_applied", b[4], 64),
                                 jstr(o, "lag_ops", b[5], 64),
                                 jsize(o, "lag_bytes", b[6], 64),
                                 jstr(o, "lag_s", b[7], 64),
                                 jstr(o, "recovering", b[8], 64)};
            cli_table_add(&t, row);
        }
        printf("lagging or recovering (PG, replica) pairs:\n");
        cli_table_done(&t, 0, stdout);
    } else {
        printf("no replica lags\n");
    }
}

/* The "anomalies:" section: what `tessera top` flags too, in words. */
static void status_anomalies(const struct cli_node_obs *obs, size_t n)
{
    struct cli_anomaly an[64];
    size_t k = cli_anomalies(obs, n, NULL, an, TS_ARRAY_SIZE(an));

    printf("\nanomalies:%s\n", k ? "" : " no anomalies");
    for (size_t i = 0; i < k && i < TS_ARRAY_SIZE(an); i++)
        printf("  %-20s %s\n", cli_anomaly_kind_name(an[i].kind), an[i].text);
    if (k > TS_ARRAY_SIZE(an))
        printf("  ... and %zu more\n", k - TS_ARRAY_SIZE(an));
}

/*
 * `status` on a cluster: every node of the map, one section each (or with --json, an array of
 * {node, addr, state, status | error}). 1 when a node that is up in the map did not answer.
 */
static int status_cluster(struct ctx *x, const struct ts_map *m)
{
    struct json_object *all = x->json ? json_object_new_array() : NULL, **docs;
    struct cli_node_obs *obs;
    char b[4][64], (*errs)[160];
    int bad = 0;

    docs = calloc(m->n ? m->n : 1, sizeof(*docs));
    obs = calloc(m->n ? m->n : 1, sizeof(*obs));
    errs = calloc(m->n ? m->n : 1, sizeof(*errs));
    if (!docs || !obs || !errs) {
        free(docs);
        free(obs);
        free(errs);
        json_object_put(all);
        return TS_ENOMEM;
    }

    if (!x->json)
        printf("cluster: map epoch %llu, %u PGs, %zu nodes (asked via %s)\n",
               (unsigned long long)m->epoch, m->pg_count, m->n, x->server);
    for (size_t i = 0; i < m->n; i++) {
        const struct ts_map_node *nd = &m->nodes[i];
        struct json_object *doc = NULL, *cl = NULL, *rep = NULL;
        char *json = NULL;
        int rc;

        rc = ts_client_node_status(x->c, i, &json);
        if (!rc) {
            doc = json_tokener_parse(json);
            free(json);
            if (!doc)
                rc = TS_EPROTO;
        }
        if (rc && nd->state == TS_NODE_UP)
            bad = 1;
        obs[i].id = nd->id;
        obs[i].map_state = ts_node_state_name(nd->state);
        obs[i].read_bps = obs[i].write_bps = obs[i].req_ps = -1;
        if (rc) {
            snprintf(errs[i], sizeof(errs[i]), "%s (%s)", ts_strerror(rc), ts_errname(rc));
            obs[i].error = errs[i];
        }
        if (all) {
            struct json_object *e = json_object_new_object();
            json_object_object_add(e, "node", json_object_new_string(nd->id));
            json_object_object_add(e, "addr", json_object_new_string(nd->addr));
            json_object_object_add(e, "state",
                                   json_object_new_string(ts_node_state_name(nd->state)));
            json_object_object_add(e, "status", doc);
            json_object_object_add(e, "error",
                                   rc ? json_object_new_string(tessera_client_error(x->c)[0]
                                                                   ? tessera_client_error(x->c)
                                                                   : ts_strerror(rc))
                                      : NULL);
            json_object_array_add(all, e);
            continue;
        }
        printf("\n%s (%s%s%s, %s in the map): ", nd->id, nd->addr, nd->domain[0] ? ", " : "",
               nd->domain, ts_node_state_name(nd->state));
        if (rc) {
            printf("unreachable: %s (%s)%s%s\n", ts_strerror(rc), ts_errname(rc),
                   tessera_client_error(x->c)[0] ? ": " : "", tessera_client_error(x->c));
            continue;
        }
        json_object_object_get_ex(doc, "cluster", &cl);
        printf("up, epoch %s, pid %s, uptime %s s\n", jstr(cl, "epoch", b[0], 64),
               jstr(doc, "pid", b[1], 64), jstr(doc, "uptime_s", b[2], 64));
        if (cl && json_object_is_type(cl, json_type_object)) {
            struct json_object *e;
            if (json_object_object_get_ex(cl, "epoch", &e) && json_object_get_uint64(e) != m->epoch)
                printf("its map epoch differs from this client's (%llu)\n",
                       (unsigned long long)m->epoch);
        }
        if (json_object_object_get_ex(doc, "replication", &rep) &&
            json_object_is_type(rep, json_type_object))
            status_replication(rep);
        docs[i] = doc; /* kept for the anomalies */
        obs[i].status = doc;
    }
    if (all)
        json_print(all);
    else
        status_anomalies(obs, m->n);
    for (size_t i = 0; i < m->n; i++)
        json_object_put(docs[i]);
    free(docs);
    free(obs);
    free(errs);
    if (bad)
        snprintf(x->local, sizeof(x->local), "a node that is up in the map did not answer");
    return bad ? TS_EUNAVAIL : 0;
}

int cmd_status(struct ctx *x)
{
    static const char *const hdr[] = {"KEY", "VALUE"};
    const struct ts_map *m = ts_client_map(x->c);
    const char *where = x->server;
    struct json_object *doc;
    struct cli_table kv;
    char *json = NULL;
    int rc, tables = 0, i = -1;

    if (m && !x->node)
        return status_cluster(x, m);
    if (x->node && (!m || (i = ts_map_find(m, x->node)) < 0)) {
        snprintf(x->local, sizeof(x->local), "no node '%s' in the cluster map%s", x->node,
                 m ? "" : " (there is none: a single node)");
        return TS_EINVAL;
    }
    if (i >= 0) {
        where = m->nodes[i].addr;
        rc = ts_client_node_status(x->c, (size_t)i, &json);
    } else {
        rc = tessera_status(x->c, &json);
    }
    if (rc)
        return rc;
    doc = json_tokener_parse(json);
    if (!doc) {
        /* Not JSON after all: show it as it came. */
        puts(json);
        free(json);
        return 0;
    }
    free(json);
    if (x->json || !json_object_is_type(doc, json_type_object)) {
        json_print(doc);
        return 0;
    }
    printf("server: %s (node %s, role %s)\n", where, i >= 0 ? x->node : tessera_client_node(x->c),
           ts_role_name(tessera_client_role(x->c)));
    if (cli_table_init(&kv, 2, 0, hdr) == 0) {
        status_flatten(doc, "", &kv, &tables);
        /* Without the header row: a "key: value" listing. */
        size_t w = 0;
        for (size_t r = 1; r < kv.nrows; r++)
            w = TS_MAX(w, strlen(kv.cells[r * 2]));
        for (size_t r = 1; r < kv.nrows; r++)
            printf("%s:%*s %s\n", kv.cells[r * 2], (int)(w - strlen(kv.cells[r * 2])), "",
                   kv.cells[r * 2 + 1]);
        cli_table_fini(&kv);
    }
    if (tables)
        status_tables(doc);
    {
        struct cli_node_obs o = {0};
        o.id = i >= 0 ? x->node : tessera_client_node(x->c);
        o.status = doc;
        o.read_bps = o.write_bps = o.req_ps = -1;
        status_anomalies(&o, 1);
    }
    json_object_put(doc);
    return 0;
}
