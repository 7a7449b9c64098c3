/*
 * For language bindings (tessera/tessera.h): releasing what the library returned, and the
 * sizes of the public structs, so that a binding that mirrors them checks its layout at load.
 */
#include "tessera/plan.h"
#include "tessera/reader.h"
#include "tessera/tessera.h"

#include <stdlib.h>
#include <string.h>

void tessera_buffer_free(void *data)
{
    free(data);
}

size_t tessera_abi_size(const char *type)
{
    static const struct {
        const char *name;
        size_t size;
    } v[] = {
#define T(t) {#t, sizeof(struct t)}
        T(tessera_opts),
        T(ts_dataset_policy),
        T(ts_dataset_info),
        T(ts_shard_info),
        T(ts_scrub_report),
        T(tessera_plan_opts),
        T(tessera_reader_opts),
        T(tessera_unit),
        T(tessera_reader_stats),
        T(tessera_reader_node),
        T(tessera_dataset_records),
#undef T
    };

    for (size_t i = 0; type && i < sizeof(v) / sizeof(v[0]); i++)
        if (strcmp(type, v[i].name) == 0)
            return v[i].size;
    return 0;
}
