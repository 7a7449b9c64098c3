/*
 * tessera CLI: failover drills (tessera drill SCENARIO). A drill runs a built-in load against
 * the running cluster (writes of 64 KiB shards to a dataset of its own, core 3 / min_core 2,
 * and reads of acknowledged ones, every byte checked), acts on a node, does what an operator
 * would (fail the node's PGs over, bring it back), and reports: time to detect (the first
 * failed operation after the act), time to recover (the first write and read that succeed after
 * the failover), acknowledged writes lost (every acknowledged shard read back at the end
 * through the cluster, byte for byte: must be 0), each core replica's figures (every
 * acknowledged shard read from each of its core replicas alone: none may be missing or differ;
 * cli_drill_check.c), reads that failed, checksum errors, throughput before, during and after,
 * and the final map.
 *
 * The acts on nodes are agent acts (cli_agent.c): done here in the embedded mode (the nodes
 * run on this host, found by process id), or on each node's host through --agent TEMPLATE
 * (e.g. ssh). A killed node is started again with its own command line and working directory,
 * its output appended to DIR/drill-NODE.log (docs/operations.md "Failover drills").
 *
 * Scenarios: kill-primary (SIGKILL the primary of the PG the load writes next), kill-node
 * (SIGKILL a node that leads no PG the load uses first), node-return (kill a primary, fail
 * over, write, bring it back and mark it up, then kill it again and fail over again: the
 * sequence that once lost writes), slow-node (SIGSTOP a node for a while: its replies stall),
 * partition (cli_drill_net.c: cut a primary off from its peers, not from its clients).
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_drill.h"
#include "ts_map.h"

static uint64_t now_ns(void)
{
    return ts_now_mono_ns();
}

void drill_shard_bytes(uint8_t *p, uint32_t i)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);

    for (size_t k = 0; k < SHARD_BYTES; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[k] = (uint8_t)x;
    }
}

void drill_note(struct drill *d, const char *fmt, ...)
{
    char line[300];
    size_t n, have = strlen(d->log);
    va_list ap;

    n = (size_t)snprintf(line, sizeof(line), "[%6.2f s] ", (double)(now_ns() - d->t0) / 1e9);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (!d->x->json)
        fprintf(stderr, "drill: %s\n", line);
    snprintf(d->log + have, sizeof(d->log) - have, "%s\n", line);
}

int drill_core_of(struct drill *d, uint32_t s, int i)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    int order[3];
    size_t n = m ? ts_map_pg_order(m, ts_map_pg_of(m, d->ds, s), order, 3) : 0;

    for (size_t k = 0; k < n; k++)
        if (order[k] == i)
            return 1;
    return 0;
}

int drill_begin(struct drill *d, int i, const char *why_none)
{
    const struct ts_map *m = ts_client_map(d->x->c);

    if (i < 0 || !m || (size_t)i >= m->n) {
        snprintf(d->x->local, sizeof(d->x->local), "%s", why_none);
        return TS_EINVAL;
    }
    snprintf(d->node, sizeof(d->node), "%s", m->nodes[i].id);
    d->phase = 1;
    d->act_ns = now_ns();
    return 0;
}

struct json_object *drill_status_of(struct drill *d, size_t i)
{
    struct json_object *doc;
    char *json = NULL;

    if (ts_client_node_status(d->x->c, i, &json) != 0)
        return NULL;
    doc = json_tokener_parse(json);
    tessera_buffer_free(json);
    return doc;
}

void drill_rolled_back(struct drill *d, uint64_t *acked, uint64_t *all, uint64_t *unseen)
{
    const struct ts_map *m = ts_client_map(d->x->c);

    *acked = *all = *unseen = 0;
    for (size_t i = 0; m && i < m->n; i++) {
        struct json_object *doc = drill_status_of(d, i), *arr = NULL, *e, *v;
        size_t listed = 0;
        if (!doc) {
            drill_note(d, "%s did not answer STATUS: its rollbacks were not inspected",
                       m->nodes[i].id);
            (*unseen)++;
            continue;
        }
        if (json_object_object_get_ex(doc, "rolled_back", &arr))
            listed = json_object_array_length(arr);
        if (json_object_object_get_ex(doc, "rolled_back_sealing", &v) &&
            (uint64_t)json_object_get_int64(v) > listed)
            *unseen += (uint64_t)json_object_get_int64(v) - listed;
        if (arr)
            for (size_t k = 0; k < json_object_array_length(arr); k++) {
                uint64_t shard, epoch;
                e = json_object_array_get_idx(arr, k);
                if (!json_object_object_get_ex(e, "dataset", &v) ||
                    strcmp(json_object_get_string(v), d->ds))
                    continue;
                (*all)++;
                json_object_object_get_ex(e, "shard", &v);
                shard = (uint64_t)json_object_get_int64(v);
                json_object_object_get_ex(e, "epoch", &v);
                epoch = (uint64_t)json_object_get_int64(v);
                if (shard < MAX_SHARDS && d->acked[shard] && epoch >= d->acked_epoch[shard]) {
                    (*acked)++;
                    drill_note(d,
                               "ROLLED BACK on %s: acknowledged shard %llu (entry of epoch %llu; "
                               "acknowledged at epoch %llu)",
                               m->nodes[i].id, (unsigned long long)shard, (unsigned long long)epoch,
                               (unsigned long long)d->acked_epoch[shard]);
                }
            }
        json_object_put(doc);
    }
}

/* One write and one read of the load; 1 when both succeeded. */
int drill_load_step(struct drill *d)
{
    static uint8_t buf[SHARD_BYTES], got[SHARD_BYTES];
    uint64_t t = now_ns();
    int ok_w, ok_r = 1, rc;

    while (d->avoid >= 0 && d->next < MAX_SHARDS && drill_core_of(d, d->next, d->avoid))
        d->next++; /* a shard number the load skips: never written, never read */
    if (d->next < MAX_SHARDS) {
        drill_shard_bytes(buf, d->next);
        rc = tessera_put(d->x->c, d->ds, d->next, buf, SHARD_BYTES, NULL, 0);
        ok_w = rc == 0;
        if (rc == TS_ENOSPC)
            d->enospc++;
        if (rc && d->phase == 1 && !d->first_err[0])
            snprintf(d->first_err, sizeof(d->first_err), "%s: %s", ts_errname(rc),
                     tessera_client_error(d->x->c));
        if (ok_w) {
            const struct ts_map *m = ts_client_map(d->x->c);
            d->acked[d->next] = 1;
            d->acked_epoch[d->next] = m ? m->epoch : 0;
            d->writes_ok++;
            if (d->led)
                drill_auto_acked(d, d->next, now_ns());
        } else {
            d->writes_failed++;
        }
        d->next++; /* a failed shard number is not reused (its upload may be half there) */
    } else {
        ok_w = 1;
    }
    if (d->next > 1) {
        uint32_t i = (uint32_t)(((uint64_t)d->next * 2654435761u) % d->next);
        size_t n = 0;
        if (d->acked[i]) {
            rc = tessera_read(d->x->c, d->ds, i, 0, SHARD_BYTES, got, &n);
            drill_shard_bytes(buf, i);
            if (rc == TS_ECORRUPT)
                d->checksum_errors++;
            ok_r = rc == 0 && n == SHARD_BYTES && memcmp(got, buf, SHARD_BYTES) == 0;
            if (ok_r)
                d->reads_ok++;
            else
                d->reads_failed++;
        }
    }
    if ((!ok_w || !ok_r) && d->phase == 1 && !d->detect_ns)
        d->detect_ns = t;
    if (ok_w && ok_r && d->phase == 1 && d->failover_ns && !d->recover_ns) {
        d->recover_ns = now_ns();
        d->phase = 2;
    }
    if (ok_w && ok_r) { /* throughput counts steps whose write and read both succeeded */
        if (d->phase == 0)
            d->ops_before++;
        else if (d->phase == 1)
            d->ops_during++;
        else
            d->ops_after++;
    }
    return ok_w && ok_r;
}

void drill_load_for(struct drill *d, double secs)
{
    uint64_t end = now_ns() + (uint64_t)(secs * 1e9);

    while (now_ns() < end)
        drill_load_step(d);
}

/* One act on node i (cli_agent.c): here in the embedded mode, else by running the --agent
 * template with the act appended (each word quoted). */
static void shell_quote(char *out, size_t cap, const char *w)
{
    size_t n = 0;

    if (n + 1 < cap)
        out[n++] = ' ';
    if (n + 1 < cap)
        out[n++] = '\'';
    for (; *w && n + 5 < cap; w++) {
        if (*w == '\'') {
            memcpy(out + n, "'\\''", 4);
            n += 4;
        } else {
            out[n++] = *w;
        }
    }
    if (n + 1 < cap)
        out[n++] = '\'';
    out[n] = '\0';
}

static void host_of(const char *addr, char *out, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    size_t n = colon ? (size_t)(colon - addr) : strlen(addr);

    if (addr[0] == '[' && n >= 2)
        snprintf(out, cap, "%.*s", (int)(n - 2), addr + 1);
    else
        snprintf(out, cap, "%.*s", (int)n, addr);
}

int drill_act(struct drill *d, int i, const char *act, const char *arg, const char *arg2, char *out,
              size_t cap)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    const struct ts_map_node *nd;
    char cmd[8192], host[128], q[4200], line[1024];
    size_t n = 0, len;
    FILE *p;
    int st;

    if (!d->x->agent)
        return agent_do(d->x, m->nodes[i].id, act, arg, arg2, out, cap);
    nd = &m->nodes[i];
    host_of(nd->addr, host, sizeof(host));
    for (const char *t = d->x->agent; *t && n + 200 < sizeof(cmd);) {
        const char *val = NULL;
        size_t skip = 0;
        if (!strncmp(t, "{node}", 6))
            val = nd->id, skip = 6;
        else if (!strncmp(t, "{host}", 6))
            val = host, skip = 6;
        else if (!strncmp(t, "{addr}", 6))
            val = nd->addr, skip = 6;
        else if (!strncmp(t, "{tls_addr}", 10))
            val = nd->tls_addr[0] ? nd->tls_addr : nd->addr, skip = 10;
        if (val) {
            n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, "%s", val);
            t += skip;
        } else {
            cmd[n++] = *t++;
        }
    }
    cmd[n] = '\0';
    shell_quote(q, sizeof(q), act);
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), "%s", q);
    if (arg) {
        shell_quote(q, sizeof(q), arg);
        snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), "%s", q);
    }
    if (arg2) {
        shell_quote(q, sizeof(q), arg2);
        snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), "%s", q);
    }
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " 2>&1");
    p = popen(cmd, "r");
    if (!p) {
        snprintf(d->x->local, sizeof(d->x->local), "cannot run the agent: %s", strerror(errno));
        return TS_EIO;
    }
    out[0] = '\0';
    len = 0;
    while (fgets(line, sizeof(line), p)) {
        size_t k = strlen(line);
        if (len + k < cap) {
            memcpy(out + len, line, k + 1);
            len += k;
        }
    }
    st = pclose(p);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (!strcmp(act, "gone"))
        return TS_EBUSY; /* still running (or the agent failed: ask again) */
    out[strcspn(out, "\n")] = '\0';
    snprintf(d->x->local, sizeof(d->x->local), "agent on %s: %s: %.400s", nd->id, act,
             out[0] ? out : "failed");
    return TS_EIO;
}

/* The node that leads the PG of the shard the load writes next. */
int drill_primary_next(struct drill *d)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    int first[1];

    if (!m || ts_map_pg_order(m, ts_map_pg_of(m, d->ds, d->next), first, 1) != 1)
        return -1;
    return first[0];
}

/* Fails over the PGs node i leads (one failover marks it down in a new epoch). */
int drill_fail_over(struct drill *d, int i)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    uint64_t epoch = 0;
    int first[1], rc = TS_ENOENT;

    for (uint32_t pg = 0; m && pg < m->pg_count; pg++)
        if (ts_map_pg_order(m, pg, first, 1) == 1 && first[0] == i) {
            rc = tessera_failover(d->x->c, pg, &epoch);
            break;
        }
    if (rc == TS_ENOENT) /* it leads no PG: mark it down all the same */
        rc = 0;
    d->failover_ns = now_ns();
    drill_note(d, "failed over: %s marked down, map epoch %llu (%s)", d->node,
               (unsigned long long)epoch, rc ? tessera_client_error(d->x->c) : "ok");
    return rc;
}

/* Marks node `id` up again (a map change pushed like `tessera node up`). */
int drill_mark_up(struct drill *d, const char *id)
{
    const struct ts_map *cur;
    struct ts_map *m;
    uint64_t epoch = 0;
    int i, rc;

    ts_client_map_refresh(d->x->c); /* the newest map any node has */
    cur = ts_client_map(d->x->c);
    m = cur ? ts_map_dup(cur) : NULL;
    if (!m)
        return TS_ENOMEM;
    i = ts_map_find(m, id);
    if (i >= 0)
        m->nodes[i].state = TS_NODE_UP;
    rc = cli_map_push(d->x, m, &epoch);
    ts_map_free(m);
    drill_note(d, "%s marked up: map epoch %llu (%s)", id, (unsigned long long)epoch,
               rc ? ts_strerror(rc) : "ok");
    return rc;
}

/* Kills node i (-9) and fails it over (the agent keeps what a restart needs). */
static int kill_and_fail_over(struct drill *d, int i, double secs)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    char out[256];
    int rc;

    snprintf(d->node, sizeof(d->node), "%s", m->nodes[i].id);
    if (d->recover_ns) /* a second act (node-return): the report times the last one */
        drill_note(d, "recovered from the previous act %.3f s after it",
                   (double)(d->recover_ns - d->act_ns) / 1e9);
    d->detect_ns = d->failover_ns = d->recover_ns = 0;
    d->phase = 1;
    d->act_ns = now_ns();
    if (d->x->auto_heal && (rc = drill_auto_pgs(d, i)) != 0)
        return rc;
    rc = drill_act(d, i, "kill", NULL, NULL, out, sizeof(out));
    if (rc)
        return rc;
    out[strcspn(out, "\n")] = '\0';
    drill_note(d, "kill -9 %s (%s)", d->node, out);
    if (d->x->auto_heal) {
        /* No operator: the monitor marks it down (its lease gone), peering moves its PGs. */
        rc = drill_auto_wait(d, d->node, TS_NODE_DOWN, 120, &d->down_ns);
        d->failover_ns = d->down_ns ? d->down_ns : now_ns();
        if (rc)
            drill_note(d, "%s not marked down by the monitor within 120 s", d->node);
        else
            drill_note(d, "%s marked down by the monitor %.3f s after the kill (no command)",
                       d->node, (double)(d->down_ns - d->act_ns) / 1e9);
        return rc;
    }
    drill_load_for(d, secs); /* the load meets the dead node: detection */
    return drill_fail_over(d, i);
}

int drill_restart(struct drill *d, const char *logdir)
{
    char out[1400];
    int i = ts_map_find(ts_client_map(d->x->c), d->node);
    int rc = i < 0 ? TS_ENOENT : drill_act(d, i, "start", logdir, NULL, out, sizeof(out));

    if (rc) {
        drill_note(d, "%s did not start again: %s", d->node, d->x->local);
        return rc;
    }
    out[strcspn(out, "\n")] = '\0';
    drill_note(d, "%s started again (%s)", d->node, out);
    if (d->x->auto_heal) {
        d->back_ns = now_ns();
        rc = drill_auto_wait(d, d->node, TS_NODE_UP, 120, &d->up_ns);
        if (rc)
            drill_note(d, "%s not marked up by the monitor within 120 s", d->node);
        else
            drill_note(d, "%s marked up by the monitor %.3f s after its start", d->node,
                       (double)(d->up_ns - d->back_ns) / 1e9);
        return rc;
    }
    return drill_mark_up(d, d->node);
}

/* Where restarted nodes' output goes: beside the report, else $TMPDIR, else /tmp. */
static void log_dir(const struct ctx *x, char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    const char *slash = x->report ? strrchr(x->report, '/') : NULL;

    if (slash)
        snprintf(out, cap, "%.*s", (int)(slash - x->report), x->report);
    else if (x->report)
        snprintf(out, cap, ".");
    else
        snprintf(out, cap, "%s", tmp && *tmp ? tmp : "/tmp");
}

int cmd_drill(struct ctx *x)
{
    const char *scenario = x->argv[0];
    const struct ts_map *m = ts_client_map(x->c);
    struct ts_dataset_policy p = {3, 0, 2, SHARD_BYTES, 0, 0, 0, 0};
    struct drill d;
    double dur = x->duration ? (double)x->duration : 6;
    uint64_t t_act_end;
    char logs[512];
    int rc = 0, i;

    log_dir(x, logs, sizeof(logs));
    if (!m) {
        snprintf(x->local, sizeof(x->local), "drills need a cluster (this node has no map)");
        return TS_EINVAL;
    }
    if (strcmp(scenario, "kill-primary") && strcmp(scenario, "kill-node") &&
        strcmp(scenario, "node-return") && strcmp(scenario, "slow-node") &&
        strcmp(scenario, "corrupt-chunk") && strcmp(scenario, "fringe-lag") &&
        strcmp(scenario, "disk-full") && strcmp(scenario, "partition")) {
        snprintf(x->local, sizeof(x->local),
                 "unknown scenario '%s' (kill-primary, kill-node, node-return, partition, "
                 "slow-node, corrupt-chunk, fringe-lag, disk-full)",
                 scenario);
        return TS_EINVAL;
    }
    if (!strcmp(scenario, "fringe-lag"))
        p.fringe = 1; /* a fringe replica to stop */
    memset(&d, 0, sizeof(d));
    d.x = x;
    d.avoid = -1;
    d.t0 = now_ns();
    snprintf(d.ds, sizeof(d.ds), "drill-%s-%ld", scenario, (long)time(NULL));
    if (x->dry_run) {
        printf("drill %s (dry run): would create dataset %s (core 3, min_core 2), write and read "
               "64 KiB shards for %.0f s, act on a node, fail over, and verify every "
               "acknowledged write\n",
               scenario, d.ds, dur);
        return 0;
    }
    if (x->auto_heal && drill_auto_check(&d, scenario) != 0)
        return TS_EINVAL;
    if (!strcmp(scenario, "disk-full") && drill_disk_full_pick(&d) < 0)
        return TS_EINVAL; /* refused before anything is created */
    if (!strcmp(scenario, "partition") && drill_partition_check(&d) < 0)
        return TS_EINVAL;
    d.acked = calloc(MAX_SHARDS, 1);
    d.acked_epoch = calloc(MAX_SHARDS, sizeof(*d.acked_epoch));
    if (!d.acked || !d.acked_epoch) {
        free(d.acked);
        free(d.acked_epoch);
        return TS_ENOMEM;
    }
    rc = tessera_dataset_create(x->c, d.ds, &p);
    if (rc)
        goto out;
    if (!strcmp(scenario, "corrupt-chunk")) /* flips only hit what the drill writes */
        for (size_t k = 0; k < m->n && !rc; k++) {
            char out[64];
            if (m->nodes[k].state == TS_NODE_UP)
                rc = drill_act(&d, (int)k, "mark", d.ds, NULL, out, sizeof(out));
        }
    if (rc)
        goto out;
    drill_note(&d, "dataset %s created; load running", d.ds);
    drill_load_for(&d, dur / 4);
    d.secs_before = (double)(now_ns() - d.t0) / 1e9;
    t_act_end = now_ns();
    if (!strcmp(scenario, "corrupt-chunk") || !strcmp(scenario, "fringe-lag") ||
        !strcmp(scenario, "disk-full") || !strcmp(scenario, "partition")) {
        rc = !strcmp(scenario, "fringe-lag")  ? drill_fringe_lag(&d, dur)
             : !strcmp(scenario, "disk-full") ? drill_disk_full(&d, dur)
             : !strcmp(scenario, "partition") ? drill_partition(&d, dur)
                                              : drill_corrupt_chunk(&d, dur, logs);
        if (rc)
            goto out;
    } else if (!strcmp(scenario, "slow-node")) {
        char out[256];
        i = drill_primary_next(&d);
        rc = drill_begin(&d, i, "no node leads the next PG");
        if (!rc)
            rc = drill_act(&d, i, "stop", NULL, NULL, out, sizeof(out));
        if (rc)
            goto out;
        out[strcspn(out, "\n")] = '\0';
        drill_note(&d, "SIGSTOP %s (%s) for %.1f s", d.node, out, dur / 3);
        drill_load_for(&d, dur / 3);
        rc = drill_act(&d, i, "cont", NULL, NULL, out, sizeof(out));
        if (rc)
            goto out;
        d.failover_ns = now_ns(); /* no failover: it resumes */
        drill_note(&d, "SIGCONT %s", d.node);
    } else {
        i = !strcmp(scenario, "kill-node") ? (drill_primary_next(&d) + 1) % (int)m->n
                                           : drill_primary_next(&d);
        if (i < 0) {
            rc = TS_EINVAL;
            goto out;
        }
        rc = kill_and_fail_over(&d, i, 1.0);
        if (rc)
            goto out;
        drill_load_for(&d, dur / 4);
        if (!strcmp(scenario, "node-return")) {
            rc = drill_restart(&d, logs);
            if (rc)
                goto out;
            drill_load_for(&d, dur / 4);
            i = ts_map_find(ts_client_map(x->c), d.node);
            rc = kill_and_fail_over(&d, i, 1.0);
            if (rc)
                goto out;
        }
    }
    drill_load_for(&d, dur / 4);
    if (d.phase == 1 && !d.recover_ns)
        drill_note(&d, "the load did not recover within the drill");
    d.secs_during = (double)((d.recover_ns ? d.recover_ns : now_ns()) - t_act_end) / 1e9;
    d.secs_after = d.recover_ns ? (double)(now_ns() - d.recover_ns) / 1e9 : 0;
    if (strcmp(scenario, "slow-node") && strcmp(scenario, "corrupt-chunk") &&
        strcmp(scenario, "fringe-lag") && strcmp(scenario, "disk-full") &&
        strcmp(scenario, "partition"))
        drill_restart(&d, logs); /* leave the cluster whole: the killed node back and up */
    if (x->auto_heal)
        drill_auto_replicated(&d, 120);
    rc = drill_finish(&d, scenario);
out:
    free(d.led);
    free(d.pg_writable_ns);
    free(d.pg_replicated_ns);
    free(d.acked);
    free(d.acked_epoch);
    free(d.rep);
    return rc;
}
