/*
 * Fuzzing of the decoders of what nodes accept from each other outside the frame codec: the
 * cluster map (MAP_PUSH, MAP_GET replies, ts_map_decode) and a PG's peering facts (PG_QUERY
 * replies, ts_repl_rd_pg_state). Each input is tried as both. A decoded map must be valid and
 * survive an encode/decode round trip unchanged; nothing may crash, hang or read out of bounds.
 *
 * LLVMFuzzerTestOneInput is the libFuzzer entry (TESSERA_FUZZ=ON); without libFuzzer,
 * map_smoke_main.c (built with it as fuzz_map_smoke, ctest fuzz.map_smoke) runs seed inputs and
 * 200,000 deterministic mutations of them.
 */
#include "ts_map.h"
#include "ts_proto.h"
#include "ts_repl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_map(const uint8_t *data, size_t size)
{
    struct ts_map *m = NULL, *back = NULL;
    struct ts_rd r;
    struct ts_wr w;

    ts_rd_init(&r, data, size);
    if (ts_map_decode(&r, &m) != 0) {
        if (m)
            abort(); /* a failed decode hands nothing out */
        return;
    }
    /* What decodes is valid: it has a node up, a bounded pg_count, and round-trips. */
    if (!m || m->n == 0 || m->pg_count == 0 || m->pg_count > TS_MAP_MAX_PGS)
        abort();
    ts_wr_init(&w);
    ts_map_encode(&w, m);
    ts_rd_init(&r, w.buf, w.len);
    if (w.err || ts_map_decode(&r, &back) != 0 || ts_rd_done(&r) != 0 || back->n != m->n ||
        back->epoch != m->epoch || back->pg_count != m->pg_count)
        abort();
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->nodes[i].id, back->nodes[i].id) || m->nodes[i].state != back->nodes[i].state)
            abort();
    ts_wr_fini(&w);
    ts_map_free(back);
    ts_map_free(m);
}

static void check_pg_state(const uint8_t *data, size_t size)
{
    struct ts_pg_state st;
    struct ts_rd r;

    ts_rd_init(&r, data, size);
    if (ts_repl_rd_pg_state(&r, &st) != 0)
        return;
    if (st.nacting > TS_PG_MAX_ACTING || st.npending > TS_PG_MAX_PENDING)
        abort();
    for (unsigned k = 0; k < st.npending; k++)
        if (st.pending[k].n > TS_PG_MAX_ACTING)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_map(data, size);
    check_pg_state(data, size);
    return 0;
}
