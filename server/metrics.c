/* The node's metrics on the hot path: per-worker counters without locks (metrics.h). */
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

const double tsd_lat_bounds_s[TSD_LAT_BUCKETS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                  0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                                  0.5,     1,      2.5,     5,      10,    30};
const char *const tsd_transport_names[TSD_TR_N] = {"tcp", "tls", "rdma"};
const char *const tsd_lat_kind_names[TSD_LAT_N] = {"read", "write", "replicate"};

#define ADD(a, n) atomic_fetch_add_explicit(&(a), (n), memory_order_relaxed)

struct tsd_wmetrics *tsd_wmetrics_create(void)
{
    struct tsd_wmetrics *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    for (uint64_t i = 0; i < TSD_HOT_RING; i++)
        atomic_init(&m->ring[i].seq, i);
    return m;
}

void tsd_wmetrics_destroy(struct tsd_wmetrics *m)
{
    free(m);
}

int tsd_conn_transport(const struct tsd_conn *c)
{
    return c->rdma ? TSD_TR_RDMA : c->tls ? TSD_TR_TLS : TSD_TR_TCP;
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* The slot of name in t, claimed if new; -1 when the table is full (counted as "_other"). */
static int mtab_slot(struct tsd_mtab *t, const char *name)
{
    uint32_t h = name_hash(name);

    for (uint32_t k = 0; k < TSD_MTAB_SLOTS; k++) {
        struct tsd_mslot *sl = &t->slot[(h + k) % TSD_MTAB_SLOTS];
        uint32_t st = atomic_load_explicit(&sl->state, memory_order_acquire), zero = 0;

        if (st == 2) {
            if (sl->hash == h && strcmp(sl->name, name) == 0)
                return (int)((h + k) % TSD_MTAB_SLOTS);
            continue;
        }
        if (st == 1)
            continue; /* being claimed by another thread: a duplicate slot is summed by name */
        if (atomic_compare_exchange_strong(&sl->state, &zero, 1)) {
            sl->hash = h;
            snprintf(sl->name, sizeof(sl->name), "%s", name);
            atomic_store_explicit(&sl->state, 2, memory_order_release);
            return (int)((h + k) % TSD_MTAB_SLOTS);
        }
    }
    return -1;
}

static _Atomic uint64_t *mtab_val(struct tsd_mtab *t, const char *name, int v, int *slot)
{
    int i = mtab_slot(t, name);

    if (slot)
        *slot = i;
    return i < 0 ? &t->other[v] : &t->slot[i].v[v];
}

static int is_node(const struct tsd_conn *c)
{
    return c->role == TS_ROLE_NODE && c->node_id[0];
}

void tsd_m_request(struct tsd_conn *c, const struct ts_frame_hdr *h)
{
    struct tsd_wmetrics *m = c->w->m;
    uint64_t n = TS_HDR_LEN + (uint64_t)h->length;

    if (h->opcode < TS_OP_MAX)
        ADD(m->rx[h->opcode][tsd_conn_transport(c)], n);
    if (is_node(c))
        ADD(*mtab_val(&m->peers, c->node_id, TSD_PEER_RX, NULL), n);
}

static int lat_kind(unsigned op)
{
    switch (op) {
    case TS_OP_READ:
    case TS_OP_READV:
        return TSD_LAT_READ;
    case TS_OP_SHARD_WRITE:
    case TS_OP_SHARD_SEAL:
        return TSD_LAT_WRITE;
    case TS_OP_REPL_WRITE:
    case TS_OP_REPL_SEAL:
        return TSD_LAT_REPL;
    default:
        return -1;
    }
}

void tsd_m_reply(struct tsd_conn *c, const struct ts_frame_hdr *h, int rc, uint64_t bytes)
{
    struct tsd_wmetrics *m = c->w->m;
    int tr = tsd_conn_transport(c), kind;

    if (h->opcode >= TS_OP_MAX)
        return;
    ADD(m->req[h->opcode][tr][rc != 0], 1);
    ADD(m->tx[h->opcode][tr], bytes);
    if (rc)
        ADD(m->err[-rc > 0 && -rc < TSD_NERR ? -rc : 0], 1);
    if (is_node(c))
        ADD(*mtab_val(&m->peers, c->node_id, TSD_PEER_TX, NULL), bytes);
    kind = lat_kind(h->opcode);
    if (kind >= 0 && c->t0_ns) {
        uint64_t ns = ts_now_mono_ns() - c->t0_ns;
        double s = (double)ns / 1e9;
        int b = 0;
        while (b < TSD_LAT_BUCKETS && s > tsd_lat_bounds_s[b])
            b++;
        ADD(m->lat[kind][tr][b], 1); /* the bucket it falls in; rendered cumulative */
        ADD(m->lat_sum_ns[kind][tr], ns);
    }
}

static void ring_put(struct tsd_wmetrics *m, uint32_t slot, uint32_t shard, uint64_t bytes)
{
    uint64_t pos = atomic_load_explicit(&m->ring_head, memory_order_relaxed);

    for (;;) {
        struct tsd_hot_cell *cell = &m->ring[pos % TSD_HOT_RING];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);

        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&m->ring_head, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                cell->slot = slot;
                cell->shard = shard;
                cell->bytes = bytes;
                atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
                return;
            }
        } else if (dif < 0) {
            ADD(m->ring_dropped, 1); /* the metrics thread is behind: hotness is a sample */
            return;
        } else {
            pos = atomic_load_explicit(&m->ring_head, memory_order_relaxed);
        }
    }
}

int tsd_m_ring_take(struct tsd_wmetrics *m, uint32_t *slot, uint32_t *shard, uint64_t *bytes)
{
    struct tsd_hot_cell *cell = &m->ring[m->ring_tail % TSD_HOT_RING];
    uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);

    if (seq != m->ring_tail + 1)
        return 0;
    *slot = cell->slot;
    *shard = cell->shard;
    *bytes = cell->bytes;
    atomic_store_explicit(&cell->seq, m->ring_tail + TSD_HOT_RING, memory_order_release);
    m->ring_tail++;
    return 1;
}

void tsd_m_read(struct tsd_conn *c, const char *dataset, uint32_t shard, uint64_t bytes)
{
    struct tsd_wmetrics *m = c->w->m;
    int slot;

    ADD(*mtab_val(&m->datasets, dataset, TSD_MV_READ_BYTES, &slot), bytes);
    if (slot < 0) {
        ADD(m->datasets.other[TSD_MV_READS], 1);
        return;
    }
    ADD(m->datasets.slot[slot].v[TSD_MV_READS], 1);
    ring_put(m, (uint32_t)slot, shard, bytes);
}

void tsd_m_written(struct tsd_conn *c, const char *dataset, uint64_t bytes)
{
    ADD(*mtab_val(&c->w->m->datasets, dataset, TSD_MV_WRITTEN_BYTES, NULL), bytes);
}

static int role_index(int role)
{
    return role >= 0 && role < TSD_NROLES ? role : 0;
}

void tsd_m_conn_open(struct tsd_conn *c)
{
    if (c->m_counted)
        return;
    c->m_counted = 1;
    c->m_role = role_index(c->role);
    c->m_tr = tsd_conn_transport(c);
    ADD(c->w->m->conns[c->m_role][c->m_tr], 1);
}

void tsd_m_conn_close(struct tsd_conn *c)
{
    if (!c->m_counted)
        return;
    c->m_counted = 0;
    atomic_fetch_sub_explicit(&c->w->m->conns[c->m_role][c->m_tr], 1, memory_order_relaxed);
}
