/*
 * The monitor's repair of erasure-coded datasets (issue 33; docs/operations.md "Repair"): the
 * elected `tessera monitor` (cli_monitor.c) brings every erasure-coded dataset back to full
 * redundancy without an operator.
 *
 * - After a map change (and once when elected: a new monitor knows nothing of the past): every
 *   fragment of every erasure-coded dataset is checked to be on the node of its position; one
 *   that is not there (a node marked out moved its positions, a store was lost) is rebuilt from
 *   K others and put (ts_cl_dataset_repair, TS_REPAIR_PRESENCE: no chunk is read). Until every
 *   fragment is in place (a node that does not answer holds some) it checks again, 10 s after,
 *   doubling to 5 minutes, and at once on the next map change (passes at least 5 s apart: a
 *   flapping node; none while a rebalance moves positions).
 * - Every 2 s: the chunks each node found damaged (a read or a scrub failing a fragment chunk's
 *   CRC32C) or fragments it found missing on a read, from its STATUS ("ec_repair_wanted"): each
 *   rebuilt from the same bytes of K other fragments and written back (CHUNK_REPAIR, which the
 *   node checks against the chunk's stored CRC32C). One that fails is tried again 30 s later;
 *   one with nothing to repair (no such shard, in place, not that node's position) is not
 *   looked at again while the node may still list it (15 minutes).
 *
 * Each repair prints the time to full redundancy: from the map change, or from when the node
 * noted the damage.
 */
#include "cli.h"
#include "cli_util.h"

#include "ts_map.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WANTED_POLL_NS (2ull * 1000000000ull)
#define PASS_MIN_NS (5ull * 1000000000ull)
#define RETRY_FIRST_NS (10ull * 1000000000ull)
#define RETRY_MAX_NS (300ull * 1000000000ull)
#define WANTED_RETRY_NS (30ull * 1000000000ull)
#define WANTED_FORGET_NS (15ull * 60 * 1000000000ull) /* a node keeps an entry this long */
#define TRIED_MAX 256

static struct {
    uint64_t epoch;      /* the map epoch last checked for */
    int pending;         /* fragments may be out of place: a presence pass is due */
    uint64_t since_ns;   /* the map change that made it pending (monotonic) */
    uint64_t next_ns;    /* when the next presence pass may run */
    uint64_t backoff_ns; /* the wait after a pass that left fragments out of place */
    uint64_t polled_ns;  /* the last look at the nodes' wanted lists */
    uint64_t passed_ns;  /* the last presence pass */
    struct tried {       /* wanted entries a repair failed for, and when to try again */
        char key[TS_NAME_MAX + 48];
        uint64_t again_ns;
    } tried[TRIED_MAX];
    unsigned ntried;
} st;

/* The wait after a pass that left fragments out of place. */
static uint64_t next_backoff(void)
{
    return st.backoff_ns ? TS_MIN(st.backoff_ns * 2, RETRY_MAX_NS) : RETRY_FIRST_NS;
}

static void add_report(struct tessera_repair_report *sum, const struct tessera_repair_report *r)
{
    sum->shards += r->shards;
    sum->fragments_put += r->fragments_put;
    sum->chunks_repaired += r->chunks_repaired;
    sum->bytes_rebuilt += r->bytes_rebuilt;
    sum->unreachable += r->unreachable;
    sum->failed += r->failed;
}

/* Every erasure-coded dataset's fragments checked to be in place; 1 when all are. */
static int presence_pass(struct ctx *x, const char *me, uint64_t epoch)
{
    struct tessera_repair_report sum = {0};
    struct ts_dataset_info *ds = NULL;
    char why[512] = "", b[32];
    size_t n = 0;
    unsigned ec = 0;
    uint64_t t0 = ts_now_mono_ns();
    int rc = tessera_dataset_list(x->c, &ds, &n);

    if (rc) {
        printf("monitor %s: EC repair: listing the datasets: %s\n", me, tessera_client_error(x->c));
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        struct tessera_repair_report r;
        if (!ds[i].policy.ec_k)
            continue;
        ec++;
        rc = ts_client_ec_repair(x->c, ds[i].name, TS_REPAIR_PRESENCE, &r);
        add_report(&sum, &r);
        if (rc && !why[0])
            snprintf(why, sizeof(why), "%s: %s", ds[i].name,
                     tessera_client_error(x->c)[0] ? tessera_client_error(x->c) : ts_strerror(rc));
        if (rc && !r.failed && !r.unreachable)
            sum.failed++; /* the dataset itself could not be checked */
    }
    free(ds);
    if (!ec)
        return 1;
    if (!sum.failed && !sum.unreachable) {
        printf("monitor %s: EC repair: full redundancy at map epoch %llu, %.1f s after the "
               "map changed: %u erasure-coded datasets, %u shards, %llu fragments rebuilt and "
               "put (%s) in %.1f s\n",
               me, (unsigned long long)epoch, (double)(ts_now_mono_ns() - st.since_ns) / 1e9, ec,
               sum.shards, (unsigned long long)sum.fragments_put,
               cli_human_size(sum.bytes_rebuilt, b, sizeof(b)),
               (double)(ts_now_mono_ns() - t0) / 1e9);
        return 1;
    }
    printf("monitor %s: EC repair at map epoch %llu: %llu fragments rebuilt and put, %llu on nodes "
           "that do not answer, %llu failed%s%s: checking again in %llu s\n",
           me, (unsigned long long)epoch, (unsigned long long)sum.fragments_put,
           (unsigned long long)sum.unreachable, (unsigned long long)sum.failed, why[0] ? ": " : "",
           why, (unsigned long long)(next_backoff() / 1000000000ull));
    return 0;
}

/* Whether the entry `key` failed lately (and is not due again); with fail, note its failure:
 * due again after `again` ns. */
static int tried_lately(const char *key, uint64_t fail, uint64_t now)
{
    unsigned i;

    for (i = 0; i < st.ntried && strcmp(st.tried[i].key, key); i++)
        ;
    if (!fail)
        return i < st.ntried && now < st.tried[i].again_ns;
    if (i == st.ntried) {
        if (st.ntried == TRIED_MAX)
            i = (unsigned)(now % TRIED_MAX); /* full: forget one */
        else
            st.ntried++;
        snprintf(st.tried[i].key, sizeof(st.tried[i].key), "%s", key);
    }
    st.tried[i].again_ns = now + fail;
    return 1;
}

/* One entry of a node's ec_repair_wanted list, repaired. */
static void repair_wanted(struct ctx *x, const char *me, const char *node, json_object *o)
{
    json_object *f, *s, *k, *at;
    struct tessera_repair_report r;
    char key[TS_NAME_MAX + 48], b[32];
    const char *frag;
    uint32_t shard, chunk;
    uint64_t now = ts_now_mono_ns();
    double age;
    int rc;

    if (!json_object_object_get_ex(o, "fragment", &f) ||
        !json_object_object_get_ex(o, "shard", &s) || !json_object_object_get_ex(o, "chunk", &k) ||
        !json_object_object_get_ex(o, "at_ns", &at))
        return;
    frag = json_object_get_string(f);
    if (!frag)
        return;
    shard = (uint32_t)json_object_get_int64(s);
    chunk = json_object_get_int64(k) < 0 ? UINT32_MAX : (uint32_t)json_object_get_int64(k);
    snprintf(key, sizeof(key), "%s/%u/%d", frag, shard, (int)json_object_get_int64(k));
    if (tried_lately(key, 0, now))
        return;
    rc = ts_client_ec_chunk_repair(x->c, frag, shard, chunk, &r);
    age = (double)(ts_now_wall_ns() - (uint64_t)json_object_get_int64(at)) / 1e9;
    if (rc == TS_ENOENT) {
        /* No such shard (or dataset): a reader asked for a fragment that never was. The node
         * forgets the entry within 15 minutes; not tried again before. */
        tried_lately(key, WANTED_FORGET_NS, now);
        printf("monitor %s: EC repair: %s/%u on %s: no such shard of the dataset (%s): ignored\n",
               me, frag, shard, node, tessera_client_error(x->c));
        return;
    }
    if (rc || r.failed) {
        tried_lately(key, WANTED_RETRY_NS, now);
        printf("monitor %s: EC repair of %s %s/%u on %s (noted %.1f s ago) failed: %s: again in "
               "30 s\n",
               me, chunk == UINT32_MAX ? "fragment" : "a chunk of", frag, shard, node, age,
               tessera_client_error(x->c)[0] ? tessera_client_error(x->c) : ts_strerror(rc));
        return;
    }
    if (!r.fragments_put && !r.chunks_repaired) {
        /* Nothing to do: the fragment is in place, the node that noted it does not hold that
         * position (now), or the chunk is past the fragment's end. Not looked at again while
         * the node may still list it. */
        tried_lately(key, WANTED_FORGET_NS, now);
        printf("monitor %s: EC repair: %s %s/%u noted on %s: in place at its position's node, "
               "nothing to repair\n",
               me, chunk == UINT32_MAX ? "fragment" : "a chunk of", frag, shard, node);
        return;
    }
    /* Repaired. The node that noted it forgets it once the repair lands there; where the
     * position moved since (repaired at its new node), not again before 30 s. */
    tried_lately(key, WANTED_RETRY_NS, now);
    if (chunk == UINT32_MAX)
        printf("monitor %s: EC repair: fragment %s/%u, found missing on %s: rebuilt from the other "
               "fragments and put; full redundancy %.1f s after it was noted\n",
               me, frag, shard, node, age);
    else
        printf("monitor %s: EC repair: chunk %u of fragment %s/%u, found damaged on %s: rebuilt "
               "from the other fragments and written back (%s); full redundancy %.1f s after it "
               "was noted\n",
               me, chunk, frag, shard, node, cli_human_size(r.bytes_rebuilt, b, sizeof(b)), age);
}

/* The nodes' lists of fragment chunks they found damaged or missing. */
static void wanted_pass(struct ctx *x, const char *me)
{
    const struct ts_map *m = ts_client_map(x->c);

    for (size_t i = 0; m && i < m->n; i++) {
        json_object *doc, *arr;
        char *json = NULL, node[sizeof(m->nodes[i].id)];
        if (m->nodes[i].state != TS_NODE_UP || ts_client_node_status(x->c, i, &json) != 0) {
            free(json);
            continue;
        }
        snprintf(node, sizeof(node), "%s", m->nodes[i].id);
        doc = json_tokener_parse(json);
        free(json);
        if (doc && json_object_object_get_ex(doc, "ec_repair_wanted", &arr) &&
            json_object_is_type(arr, json_type_array))
            for (size_t k = 0; k < json_object_array_length(arr); k++)
                repair_wanted(x, me, node, json_object_array_get_idx(arr, k));
        json_object_put(doc);
        m = ts_client_map(x->c); /* a repair may have refreshed it */
    }
}

void cli_monitor_ec_elected(void)
{
    st.epoch = 0; /* a new term knows nothing of the past: a presence pass first */
}

void cli_monitor_ec_round(struct ctx *x, const char *me)
{
    const struct ts_map *m = ts_client_map(x->c);
    uint64_t now = ts_now_mono_ns();

    if (!m)
        return;
    if (m->epoch != st.epoch) {
        if (!st.pending)
            st.since_ns = now;
        st.pending = 1;
        st.epoch = m->epoch;
        /* At once, but not more often than every PASS_MIN_NS (a flapping node). */
        st.next_ns = TS_MAX(now, st.passed_ns + PASS_MIN_NS);
        st.backoff_ns = 0;
    }
    /* A rebalance moves positions: the presence pass waits for its end (a new epoch). */
    if (st.pending && !m->move && now >= st.next_ns) {
        st.passed_ns = now;
        uint64_t epoch = m->epoch;
        if (presence_pass(x, me, epoch)) {
            st.pending = 0;
            st.backoff_ns = 0;
        } else {
            st.backoff_ns = next_backoff();
            st.next_ns = ts_now_mono_ns() + st.backoff_ns;
        }
        fflush(stdout);
    }
    if (now - st.polled_ns >= WANTED_POLL_NS) {
        st.polled_ns = now;
        wanted_pass(x, me);
        fflush(stdout);
    }
}
