/*
 * tessera CLI: what every drill checks at its end, and its report (see cli_drill.c).
 *
 * Every acknowledged shard is read back twice. Through the cluster, as a client would (the
 * router's choice of replica, another one when that one lacks it): a shard no replica serves
 * is lost. And from each of its core replicas alone (the first three of its PG under the map
 * at the end, every UP node): a replica may lack a shard the others still serve — a write left
 * on one replica reads back through the cluster and is one failure from being lost — so each
 * replica's figures (shards checked, missing, served with other bytes) are in the report, and
 * the drill fails when any replica lacks an acknowledged shard or serves other bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_drill.h"
#include "client_internal.h"
#include "ts_map.h"

#define REPLICA_WAIT_NS (30ull * 1000000000) /* for the replicas to catch up, in all */
#define NOTES_PER_REPLICA 3                  /* missing shards named in the log, per replica */

int drill_read_alone(struct drill *d, int i, uint32_t s, uint64_t deadline, int any)
{
    static uint8_t buf[SHARD_BYTES], got[SHARD_BYTES];
    size_t n = 0;
    int rc;

    for (;;) {
        rc = ts_client_node_read(d->x->c, (size_t)i, d->ds, s, 0, SHARD_BYTES, got, &n);
        if (rc == 0 || ts_now_mono_ns() > deadline || (!any && rc != TS_EBUSY && rc != TS_ESTALE))
            break;
        usleep(100000);
    }
    if (rc)
        return rc;
    drill_shard_bytes(buf, s);
    return n == SHARD_BYTES && memcmp(buf, got, SHARD_BYTES) == 0 ? 0 : DRILL_OTHER_BYTES;
}

/* Node i's figures as a core replica into r. */
static void check_replica(struct drill *d, int i, uint64_t deadline, struct drill_replica *r)
{
    for (uint32_t s = 0; s < d->next; s++) {
        int rc;
        if (!d->acked[s] || !drill_core_of(d, s, i))
            continue;
        r->checked++;
        rc = drill_read_alone(d, i, s, deadline, 1);
        if (rc == 0)
            continue;
        if (rc == DRILL_OTHER_BYTES)
            r->mismatched++;
        else
            r->missing++;
        if (r->missing + r->mismatched <= NOTES_PER_REPLICA)
            drill_note(d, "core replica %s: acknowledged shard %u: %s", r->id, s,
                       rc == DRILL_OTHER_BYTES ? "served with other bytes" : ts_strerror(rc));
    }
    drill_note(d,
               "read from %s alone: %llu acknowledged shards it is a core replica of, %llu "
               "missing, %llu with other bytes",
               r->id, (unsigned long long)r->checked, (unsigned long long)r->missing,
               (unsigned long long)r->mismatched);
}

uint64_t drill_check_replicas(struct drill *d)
{
    const struct ts_map *m;
    uint64_t deadline = ts_now_mono_ns() + REPLICA_WAIT_NS;

    ts_client_map_refresh(d->x->c); /* the newest map any node has */
    m = ts_client_map(d->x->c);
    free(d->rep);
    d->nrep = 0;
    d->core_missing = 0;
    d->rep = m ? calloc(m->n ? m->n : 1, sizeof(*d->rep)) : NULL;
    for (size_t j = 0; d->rep && j < m->n; j++) {
        struct drill_replica *r = &d->rep[d->nrep];
        if (m->nodes[j].state != TS_NODE_UP) {
            drill_note(d, "%s is %s in the final map: not a core replica, not read", m->nodes[j].id,
                       ts_node_state_name(m->nodes[j].state));
            continue;
        }
        snprintf(r->id, sizeof(r->id), "%s", m->nodes[j].id);
        check_replica(d, (int)j, deadline, r);
        d->core_missing += r->missing + r->mismatched;
        d->nrep++;
    }
    return d->core_missing;
}

/* Every acknowledged shard read through the cluster (any replica), byte for byte: how many are
 * lost. */
static uint64_t verify_all(struct drill *d)
{
    static uint8_t buf[SHARD_BYTES], got[SHARD_BYTES];
    uint64_t lost = 0;

    for (uint32_t i = 0; i < d->next; i++) {
        size_t n = 0;
        int rc = TS_EIO;
        if (!d->acked[i])
            continue;
        drill_shard_bytes(buf, i);
        for (int t = 0; t < 3 && rc; t++) { /* a replica may still be catching up */
            rc = tessera_read(d->x->c, d->ds, i, 0, SHARD_BYTES, got, &n);
            if (!rc && (n != SHARD_BYTES || memcmp(got, buf, SHARD_BYTES) != 0))
                rc = TS_ECORRUPT;
            if (rc)
                usleep(200000);
        }
        if (rc) {
            lost++;
            drill_note(d, "LOST: acknowledged shard %u: %s", i, ts_strerror(rc));
        }
    }
    return lost;
}

static double secs(uint64_t a, uint64_t b)
{
    return a && b && b >= a ? (double)(b - a) / 1e9 : -1;
}

static double rate(uint64_t ops, double s)
{
    return s > 0 ? (double)ops / s : 0;
}

static const struct drill_replica *replica_of(const struct drill *d, const char *id)
{
    for (size_t k = 0; k < d->nrep; k++)
        if (!strcmp(d->rep[k].id, id))
            return &d->rep[k];
    return NULL;
}

static struct json_object *replicas_json(const struct drill *d)
{
    struct json_object *arr = json_object_new_array();

    for (size_t k = 0; k < d->nrep; k++) {
        struct json_object *r = json_object_new_object();
        json_object_object_add(r, "node", json_object_new_string(d->rep[k].id));
        json_object_object_add(r, "shards_checked", json_u64(d->rep[k].checked));
        json_object_object_add(r, "shards_missing", json_u64(d->rep[k].missing));
        json_object_object_add(r, "shards_mismatched", json_u64(d->rep[k].mismatched));
        json_object_array_add(arr, r);
    }
    return arr;
}

static struct json_object *report_json(const struct drill *d, const char *scenario)
{
    struct json_object *o = json_object_new_object(), *nodes = json_object_new_array();
    const struct ts_map *fm = ts_client_map(d->x->c);

    json_object_object_add(o, "scenario", json_object_new_string(scenario));
    json_object_object_add(o, "node", json_object_new_string(d->node));
    json_object_object_add(o, "dataset", json_object_new_string(d->ds));
    json_object_object_add(o, "time_to_detect_s",
                           json_object_new_double(secs(d->act_ns, d->detect_ns)));
    json_object_object_add(o, "time_to_recover_s",
                           json_object_new_double(secs(d->act_ns, d->recover_ns)));
    json_object_object_add(o, "acknowledged_writes", json_u64(d->writes_ok));
    json_object_object_add(o, "acknowledged_writes_lost", json_u64(d->lost));
    json_object_object_add(o, "core_replica_shards_missing", json_u64(d->core_missing));
    json_object_object_add(o, "core_replicas", replicas_json(d));
    json_object_object_add(o, "acknowledged_entries_rolled_back", json_u64(d->rb_acked));
    json_object_object_add(o, "entries_rolled_back", json_u64(d->rb_all));
    json_object_object_add(o, "rolled_back_not_inspected", json_u64(d->rb_unseen));
    json_object_object_add(o, "writes_failed", json_u64(d->writes_failed));
    json_object_object_add(o, "reads_ok", json_u64(d->reads_ok));
    json_object_object_add(o, "reads_failed", json_u64(d->reads_failed));
    json_object_object_add(o, "checksum_errors", json_u64(d->checksum_errors));
    if (!strcmp(scenario, "corrupt-chunk")) {
        json_object_object_add(o, "bytes_flipped", json_u64(d->flipped));
        json_object_object_add(o, "node_checksum_errors", json_u64(d->node_corrupt));
        json_object_object_add(o, "node_shards_bad_after_repair", json_u64(d->node_still_bad));
    }
    if (!strcmp(scenario, "disk-full")) {
        json_object_object_add(o, "balloon_bytes", json_u64(d->balloon));
        json_object_object_add(o, "writes_refused_enospc", json_u64(d->enospc));
    }
    if (!strcmp(scenario, "partition"))
        json_object_object_add(o, "node_shards_missing_after_heal", json_u64(d->node_missing));
    if (!strcmp(scenario, "fringe-lag")) {
        json_object_object_add(o, "fringe_lag_max_ops", json_u64(d->lag_max_ops));
        json_object_object_add(o, "fringe_lag_max_s", json_object_new_double(d->lag_max_s));
    }
    json_object_object_add(o, "ops_per_s_before",
                           json_object_new_double(rate(d->ops_before, d->secs_before)));
    json_object_object_add(o, "ops_per_s_during",
                           json_object_new_double(rate(d->ops_during, d->secs_during)));
    json_object_object_add(o, "ops_per_s_after",
                           json_object_new_double(rate(d->ops_after, d->secs_after)));
    if (d->x->auto_heal)
        drill_auto_report(d, o);
    json_object_object_add(o, "map_epoch", json_u64(fm ? fm->epoch : 0));
    for (size_t k = 0; fm && k < fm->n; k++) {
        struct json_object *n = json_object_new_object();
        json_object_object_add(n, "id", json_object_new_string(fm->nodes[k].id));
        json_object_object_add(n, "state",
                               json_object_new_string(ts_node_state_name(fm->nodes[k].state)));
        json_object_array_add(nodes, n);
    }
    json_object_object_add(o, "nodes", nodes);
    json_object_object_add(o, "log", json_object_new_string(d->log));
    return o;
}

static void report_text(const struct drill *d, const char *scenario)
{
    const struct ts_map *fm = ts_client_map(d->x->c);

    printf("drill %s on %s (dataset %s)\n", scenario, d->node, d->ds);
    printf("  time to detect:            %.3f s\n", secs(d->act_ns, d->detect_ns));
    printf("  time to recover:           %.3f s (reads and writes served again)\n",
           secs(d->act_ns, d->recover_ns));
    if (d->x->auto_heal)
        drill_auto_print(d);
    printf("  acknowledged writes:       %llu\n", (unsigned long long)d->writes_ok);
    printf("  acknowledged writes lost:  %llu\n", (unsigned long long)d->lost);
    printf("  each core replica alone:   shards checked / missing / other bytes\n");
    for (size_t k = 0; k < d->nrep; k++)
        printf("    %-22s   %llu / %llu / %llu\n", d->rep[k].id,
               (unsigned long long)d->rep[k].checked, (unsigned long long)d->rep[k].missing,
               (unsigned long long)d->rep[k].mismatched);
    printf("  acknowledged entries rolled back on any replica: %llu (entries rolled "
           "back: %llu)\n",
           (unsigned long long)d->rb_acked, (unsigned long long)d->rb_all);
    printf("  writes failed (not acked): %llu\n", (unsigned long long)d->writes_failed);
    printf("  reads ok / failed:         %llu / %llu\n", (unsigned long long)d->reads_ok,
           (unsigned long long)d->reads_failed);
    printf("  checksum errors caught:    %llu\n", (unsigned long long)d->checksum_errors);
    if (!strcmp(scenario, "corrupt-chunk"))
        printf("  bytes flipped on %s:      %llu; its shards bad after repair: %llu\n", d->node,
               (unsigned long long)d->flipped, (unsigned long long)d->node_still_bad);
    if (!strcmp(scenario, "disk-full"))
        printf("  filled on %s:              %llu bytes; writes refused (TS_ENOSPC): %llu\n",
               d->node, (unsigned long long)d->balloon, (unsigned long long)d->enospc);
    if (!strcmp(scenario, "fringe-lag"))
        printf("  fringe lag, largest:       %llu ops, %.2f s\n",
               (unsigned long long)d->lag_max_ops, d->lag_max_s);
    printf("  good steps/s (write+read): before %.0f, during %.0f, after %.0f\n",
           rate(d->ops_before, d->secs_before), rate(d->ops_during, d->secs_during),
           rate(d->ops_after, d->secs_after));
    printf("  final map epoch:           %llu\n", (unsigned long long)(fm ? fm->epoch : 0));
}

/* What failed, into d->x->local: TS_EIO, or 0. */
static int verdict(struct drill *d)
{
    char who[200] = "";

    if (d->lost) {
        snprintf(d->x->local, sizeof(d->x->local), "%llu acknowledged writes lost",
                 (unsigned long long)d->lost);
        return TS_EIO;
    }
    if (d->rb_acked) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "%llu acknowledged entries rolled back on replicas (read back whole, but a "
                 "replica lost them for a while)",
                 (unsigned long long)d->rb_acked);
        return TS_EIO;
    }
    if (!d->core_missing)
        return 0;
    for (size_t k = 0; k < d->nrep; k++)
        if (d->rep[k].missing || d->rep[k].mismatched)
            snprintf(who + strlen(who), sizeof(who) - strlen(who), "%s%s %llu missing, %llu other",
                     who[0] ? "; " : "", d->rep[k].id, (unsigned long long)d->rep[k].missing,
                     (unsigned long long)d->rep[k].mismatched);
    snprintf(d->x->local, sizeof(d->x->local),
             "core replicas read alone lack %llu acknowledged shards or serve other bytes (%s), "
             "though the cluster's reads found every one on some replica",
             (unsigned long long)d->core_missing, who);
    return TS_EIO;
}

int drill_finish(struct drill *d, const char *scenario)
{
    const struct drill_replica *r;
    struct json_object *o;

    d->lost = verify_all(d);
    drill_check_replicas(d);
    r = replica_of(d, d->node);
    d->node_missing = r ? r->missing + r->mismatched : 0;
    drill_rolled_back(d, &d->rb_acked, &d->rb_all, &d->rb_unseen);
    drill_note(d,
               "log entries of the drill's dataset rolled back on the nodes: %llu (%llu of "
               "acknowledged shards; %llu rolled-back entries not inspected)",
               (unsigned long long)d->rb_all, (unsigned long long)d->rb_acked,
               (unsigned long long)d->rb_unseen);
    o = report_json(d, scenario);
    if (d->x->report) {
        FILE *f = fopen(d->x->report, "w");
        if (f) {
            fputs(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY), f);
            fputc('\n', f);
            fclose(f);
        }
    }
    if (d->x->json) {
        json_print(o);
    } else {
        report_text(d, scenario);
        json_object_put(o);
    }
    return verdict(d);
}
