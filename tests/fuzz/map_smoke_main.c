/* fuzz_map_smoke: seeds (a map, a PG's peering facts) and deterministic mutations for the
 * decoders of fuzz_map.c, with no libFuzzer: `fuzz_map_smoke [MUTATIONS]`. */
#include "ts_map.h"
#include "ts_proto.h"
#include "ts_repl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    static const char text[] =
        "epoch = 7;\npg_count = 64;\nnodes = (\n"
        "{ id = \"n1\"; addr = \"127.0.0.1:7101\"; tls_addr = "
        "\"127.0.0.1:7201\"; weight = 100; domain = \"rack-a\"; },\n"
        "{ id = \"n2\"; addr = \"127.0.0.1:7102\"; weight = 100; "
        "domain = \"rack-b\"; state = \"down\"; },\n"
        "{ id = \"n3\"; addr = \"[::1]:7103\"; weight = 5; state = \"out\"; }\n);\n";
    struct ts_map *m = NULL;
    struct ts_pg_state st;
    struct ts_wr seeds[2];
    uint8_t buf[4096];
    long n = argc > 1 ? atol(argv[1]) : 200000;
    char err[256];

    if (ts_map_parse_string(text, &m, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_map_smoke: seed map: %s\n", err);
        return 1;
    }
    ts_wr_init(&seeds[0]);
    ts_map_encode(&seeds[0], m);
    memset(&st, 0, sizeof(st));
    st.applied = 12;
    st.head_epoch = 3;
    st.promised = 5;
    st.les = 3;
    st.wq = 2;
    st.nacting = 3;
    for (int i = 0; i < 3; i++)
        snprintf(st.acting[i], sizeof(st.acting[i]), "n%d", i + 1);
    st.npending = 2;
    for (int k = 0; k < 2; k++) {
        st.pending[k].epoch = 4 + (uint64_t)k;
        st.pending[k].wq = 2;
        st.pending[k].n = 2;
        snprintf(st.pending[k].acting[0], 64, "n%d", k + 2);
        snprintf(st.pending[k].acting[1], 64, "n%d", k + 3);
    }
    ts_wr_init(&seeds[1]);
    ts_repl_wr_pg_state(&seeds[1], &st);
    for (int s = 0; s < 2; s++)
        LLVMFuzzerTestOneInput(seeds[s].buf, seeds[s].len); /* the seeds decode cleanly */
    for (long i = 0; i < n; i++) {
        const struct ts_wr *sd = &seeds[next() % 2];
        size_t len = sd->len < sizeof(buf) ? sd->len : sizeof(buf);
        memcpy(buf, sd->buf, len);
        for (int e = 0, edits = 1 + (int)(next() % 4); e < edits; e++) {
            switch (next() % 4) {
            case 0: /* bit flip */
                buf[next() % len] ^= (uint8_t)(1u << (next() % 8));
                break;
            case 1: /* an interesting byte: a count or a length gone wild */
                buf[next() % len] = (uint8_t[]){0, 1, 0x7f, 0x80, 0xff}[next() % 5];
                break;
            case 2: /* truncation */
                len = 1 + next() % len;
                break;
            default: /* a random byte */
                buf[next() % len] = (uint8_t)next();
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("fuzz_map_smoke: 2 seeds, %ld mutations: no crash\n", n);
    ts_wr_fini(&seeds[0]);
    ts_wr_fini(&seeds[1]);
    ts_map_free(m);
    return 0;
}
