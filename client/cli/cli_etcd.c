/*
 * tessera --etcd ENDPOINTS [--etcd-prefix P] map show | map push FILE: the cluster map in etcd
 * (control/mapstore.h), for a cluster whose nodes follow it (tesserad's `etcd` setting). A push
 * is one compare-and-swap: the file's map at the epoch after the one etcd holds; when another
 * change came first it is built again on that one. TLS to etcd with --tls-ca/--tls-cert/--tls-key.
 */
#include "cli.h"

#include "etcd.h"
#include "mapstore.h"
#include "ts_map.h"

#include <stdio.h>
#include <string.h>

static int open_etcd(struct ctx *x, ts_etcd **e)
{
    struct ts_etcd_opts o = {.endpoints = x->etcd,
                             .ca = x->opts->tls_ca,
                             .cert = x->opts->tls_cert,
                             .key = x->opts->tls_key,
                             .timeout_ms = x->opts->timeout_ms > 0 ? x->opts->timeout_ms : 5000};
    int rc = ts_etcd_open(e, &o);

    if (rc)
        snprintf(x->local, sizeof(x->local),
                 "--etcd %s: not a list of etcd members (or the TLS "
                 "files do not load)",
                 x->etcd);
    return rc;
}

int cli_etcd_map_show(struct ctx *x)
{
    struct ts_map *m = NULL;
    ts_etcd *e = NULL;
    int64_t rev = 0;
    int rc = open_etcd(x, &e);

    if (rc)
        return rc;
    rc = ts_mapstore_get(e, x->etcd_prefix, &m, &rev);
    if (rc == TS_ENOENT)
        snprintf(x->local, sizeof(x->local),
                 "etcd holds no map under %s (tessera --etcd ... map "
                 "push FILE stores the first)",
                 x->etcd_prefix);
    else if (rc)
        snprintf(x->local, sizeof(x->local), "%s", ts_etcd_error(e));
    if (!rc) {
        if (!x->json)
            printf("etcd %s, %s/map at revision %lld\n", x->etcd, x->etcd_prefix, (long long)rev);
        rc = map_print(x, m);
    }
    ts_map_free(m);
    ts_etcd_close(e);
    return rc;
}

/* The change a push makes: the file's map at the epoch after the current one. */
static int from_file(void *arg, const struct ts_map *cur, struct ts_map **next, char *why,
                     size_t cap)
{
    const struct ts_map *f = arg;

    if (f->pg_count != cur->pg_count) {
        snprintf(why, cap, "pg_count %u differs from the cluster's %u (fixed for its life)",
                 f->pg_count, cur->pg_count);
        return TS_EINVAL;
    }
    *next = ts_map_dup(f);
    if (!*next)
        return TS_ENOMEM;
    (*next)->epoch = cur->epoch + 1;
    return 0;
}

int cli_etcd_map_push(struct ctx *x)
{
    struct ts_map *f = NULL;
    ts_etcd *e = NULL;
    uint64_t epoch = 0;
    int rc = ts_map_parse_file(x->argv[0], &f, x->local, sizeof(x->local));

    if (rc)
        return rc;
    rc = open_etcd(x, &e);
    if (!rc) {
        rc = ts_mapstore_change(e, x->etcd_prefix, from_file, f, 10, &epoch, x->local,
                                sizeof(x->local));
        if (rc == TS_ENOENT) { /* the cluster's first map: as the file says */
            x->local[0] = '\0';
            rc = ts_mapstore_init(e, x->etcd_prefix, f);
            epoch = f->epoch;
            if (rc == TS_EEXIST) /* another came first: push over it */
                rc = ts_mapstore_change(e, x->etcd_prefix, from_file, f, 10, &epoch, x->local,
                                        sizeof(x->local));
            else if (rc)
                snprintf(x->local, sizeof(x->local), "%s", ts_etcd_error(e));
        }
    }
    if (!rc && x->json) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "file", json_object_new_string(x->argv[0]));
        json_object_object_add(o, "epoch", json_u64(epoch));
        json_object_object_add(o, "etcd", json_object_new_string(x->etcd));
        json_print(o);
    } else if (!rc) {
        printf("pushed map %s to etcd (%s/map) at epoch %llu\n", x->argv[0], x->etcd_prefix,
               (unsigned long long)epoch);
    }
    ts_map_free(f);
    ts_etcd_close(e);
    return rc;
}

/* ---- map changes through etcd (every command that changes the map, with --etcd) ---------- */

struct ts_map *cli_etcd_map_get(struct ctx *x)
{
    struct ts_map *m = NULL;
    ts_etcd *e = NULL;
    int rc = open_etcd(x, &e);

    if (!rc) {
        rc = ts_mapstore_get(e, x->etcd_prefix, &m, NULL);
        if (rc == TS_ENOENT)
            snprintf(x->local, sizeof(x->local), "etcd holds no map under %s", x->etcd_prefix);
        else if (rc)
            snprintf(x->local, sizeof(x->local), "cannot read the map from etcd: %s",
                     ts_etcd_error(e));
    }
    ts_etcd_close(e);
    return m;
}

struct commit {
    const struct ts_map *next;
    uint64_t base;
};

/* The change as the command made it, only over the map it was made on. */
static int over_base(void *arg, const struct ts_map *cur, struct ts_map **next, char *why,
                     size_t cap)
{
    const struct commit *c = arg;

    if (cur->epoch != c->base) {
        snprintf(why, cap,
                 "the map changed under you: etcd holds epoch %llu, this change was made on "
                 "epoch %llu (nothing written; run the command again on the new map)",
                 (unsigned long long)cur->epoch, (unsigned long long)c->base);
        return TS_ESTALE;
    }
    *next = ts_map_dup(c->next);
    if (!*next)
        return TS_ENOMEM;
    (*next)->epoch = cur->epoch + 1;
    return 0;
}

int cli_etcd_map_commit(struct ctx *x, const struct ts_map *next, uint64_t base, uint64_t *epoch)
{
    struct commit c = {next, base};
    ts_etcd *e = NULL;
    int rc = open_etcd(x, &e);

    if (!rc)
        rc = ts_mapstore_change(e, x->etcd_prefix, over_base, &c, 1, epoch, x->local,
                                sizeof(x->local));
    ts_etcd_close(e);
    return rc;
}

int cli_etcd_monitor_elected(struct ctx *x)
{
    char key[512];
    struct ts_etcd_kv kv = {0};
    ts_etcd *e = NULL;
    int yes = 0;

    snprintf(key, sizeof(key), "%s/rebalancer", x->etcd_prefix);
    if (open_etcd(x, &e) == 0 && ts_etcd_get(e, key, &kv, NULL) == 0)
        yes = 1;
    ts_etcd_kv_free(&kv);
    ts_etcd_close(e);
    return yes;
}
