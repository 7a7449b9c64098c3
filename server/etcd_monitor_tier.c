/*
 * Before the monitor brings a node back up (etcd_monitor.c): the datasets the node holds with
 * their replicas' bytes dropped (erasure-coded, issue 33; the "dropped" list of its registration,
 * etcd_map.c) must be held the same way here: a node that was away while a dataset was tiered
 * back to replicated (or to another code) would come back answering TS_EFRAGMENTED for bytes
 * whose fragments are gone. Such a node stays where it is until `tessera dataset tier NAME
 * replicated` has put its bytes back (its registration then lists nothing), and the monitor's
 * log says so. Where this node does not hold the dataset it cannot tell: the node stays out,
 * and `tessera node up`, which asks every node, is the way back.
 */
#include "server_internal.h"

#include "etcd.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

/* One "NAME:K+M" entry against this node's record of NAME: 1 when it is held so here too. */
static int held_alike(struct tsd_server *s, const char *entry, char *why, size_t cap)
{
    char name[TS_NAME_MAX + 1];
    unsigned k, m;
    struct ts_dataset_info d;
    const char *colon = strrchr(entry, ':');

    if (!colon || (size_t)(colon - entry) > TS_NAME_MAX ||
        sscanf(colon + 1, "%u+%u", &k, &m) != 2) {
        snprintf(why, cap,
                 "its registration lists datasets held dropped this node cannot read "
                 "(%.100s)",
                 entry);
        return 0;
    }
    snprintf(name, sizeof(name), "%.*s", (int)(colon - entry), entry);
    if (ts_store_dataset_record(s->store, name, &d) != 0) {
        snprintf(why, cap,
                 "it holds dataset %s's replicas dropped (ec:%u+%u) and this node holds no "
                 "record of it to compare: bring it up with 'tessera node up'",
                 name, k, m);
        return 0;
    }
    if (d.policy.ec_dropped && d.policy.ec_k == k && d.policy.ec_m == m)
        return 1;
    snprintf(why, cap,
             "it holds dataset %s's replicas dropped (ec:%u+%u) and the cluster holds it %s: "
             "run 'tessera dataset tier %s replicated' to put its bytes back",
             name, k, m, !d.policy.ec_k ? "replicated" : "under another code or kept", name);
    return 0;
}

int tsd_monitor_tier_agrees(struct tsd_server *s, ts_etcd *e, const char *key, char *why,
                            size_t cap)
{
    struct ts_etcd_kv kv = {0};
    struct json_object *root = NULL, *list;
    int ok = 1;

    why[0] = '\0';
    if (ts_etcd_get(e, key, &kv, NULL) != 0)
        return 1; /* gone meanwhile: not registered, nothing to hold back */
    root = json_tokener_parse((const char *)kv.value);
    if (root && json_object_object_get_ex(root, "dropped", &list) &&
        json_object_is_type(list, json_type_array)) {
        const char *slash = strrchr(key, '/');
        if (json_object_array_length(list) && slash && !strcmp(slash + 1, s->cfg->node_id)) {
            /* The monitor's own node coming back: its records cannot vouch for themselves. */
            snprintf(why, cap,
                     "it holds datasets dropped and is the monitor itself, which "
                     "cannot compare them with its own: bring it up with 'tessera "
                     "node up'");
            ok = 0;
        }
        for (size_t i = 0; ok && i < json_object_array_length(list); i++) {
            const char *entry = json_object_get_string(json_object_array_get_idx(list, i));
            if (!entry || !strcmp(entry, "...")) {
                snprintf(why, cap,
                         "it holds more datasets dropped than its registration lists: "
                         "bring it up with 'tessera node up'");
                ok = 0;
            } else {
                ok = held_alike(s, entry, why, cap);
            }
        }
    } /* no list: a node from before issue 33 holds nothing dropped */
    json_object_put(root);
    ts_etcd_kv_free(&kv);
    return ok;
}
