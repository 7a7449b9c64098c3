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

/* One "NAME:K+M:INCARNATION" entry against this node's record of NAME: 1 when it is held so here
 * too, or that incarnation is gone here (deleted, or replaced: peering sorts the node's copy out
 * once it is up). */
static int held_alike(struct tsd_server *s, const char *entry, char *why, size_t cap)
{
    char name[TS_NAME_MAX + 1];
    unsigned k, m;
    unsigned long long inc;
    uint64_t gone = 0;
    struct ts_dataset_info d;
    const char *colon = strchr(entry, ':'); /* names have none */

    if (!colon || (size_t)(colon - entry) > TS_NAME_MAX ||
        sscanf(colon + 1, "%u+%u:%llu", &k, &m, &inc) != 3) {
        snprintf(why, cap,
                 "its registration lists a dataset held dropped as '%.150s', which "
                 "this node cannot read: bring it up with 'tessera node up'",
                 entry);
        return 0;
    }
    snprintf(name, sizeof(name), "%.*s", (int)(colon - entry), entry);
    if (ts_store_dataset_record(s->store, name, &d) == 0) {
        if (d.created_ns != inc ||
            (d.policy.ec_dropped && d.policy.ec_k == k && d.policy.ec_m == m))
            return 1;
        snprintf(why, cap,
                 "it holds dataset %s's replicas dropped (ec:%u+%u) and the cluster holds it %s: "
                 "run 'tessera dataset tier %s replicated' to put its bytes back",
                 name, k, m, !d.policy.ec_k ? "replicated" : "under another code or kept", name);
        return 0;
    }
    if (ts_store_tombstone(s->store, name, &gone) == 0 && gone >= inc)
        return 1; /* deleted while it was away */
    snprintf(why, cap,
             "it holds dataset %s's replicas dropped (ec:%u+%u) and this node holds no record of "
             "it to compare: bring it up with 'tessera node up', which asks every node",
             name, k, m);
    return 0;
}

int tsd_monitor_tier_agrees(struct tsd_server *s, ts_etcd *e, const char *key, char *why,
                            size_t cap)
{
    struct ts_etcd_kv kv = {0};
    struct json_object *root = NULL, *list = NULL;
    const char *slash = strrchr(key, '/');
    int ok = 0;

    snprintf(why, cap, "its registration could not be read");
    if (ts_etcd_get(e, key, &kv, NULL) != 0)
        return 0; /* held this round: the next reads it again */
    root = json_tokener_parse((const char *)kv.value);
    if (!root || !json_object_is_type(root, json_type_object)) {
        snprintf(why, cap, "its registration is not a JSON object");
    } else if (!json_object_object_get_ex(root, "dropped", &list)) {
        ok = 1; /* a node from before issue 33: it holds nothing dropped */
    } else if (!json_object_is_type(list, json_type_array)) {
        snprintf(why, cap, "its registration's \"dropped\" is not a list");
    } else if (json_object_array_length(list) && slash && !strcmp(slash + 1, s->cfg->node_id)) {
        /* The monitor's own node coming back: its records cannot vouch for themselves. */
        snprintf(why, cap,
                 "it holds datasets dropped and is the monitor itself, which cannot "
                 "compare them with its own: bring it up with 'tessera node up'");
    } else {
        ok = 1;
        for (size_t i = 0; ok && i < json_object_array_length(list); i++) {
            const char *entry = json_object_get_string(json_object_array_get_idx(list, i));
            ok = held_alike(s, entry ? entry : "", why, cap);
        }
    }
    if (ok)
        why[0] = '\0';
    json_object_put(root);
    ts_etcd_kv_free(&kv);
    return ok;
}
