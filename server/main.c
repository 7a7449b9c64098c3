/* tesserad: the tessera storage daemon. */
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>

static void log_line(void *arg, const char *line)
{
    TS_DEBUG(FAC, "config: %s", line);
}

int main(int argc, char **argv)
{
    struct tsd_config cfg;
    struct tsd_server srv;
    int rc;

    tsd_config_defaults(&cfg);
    rc = tsd_config_load(&cfg, argc, argv);
    if (rc) {
        tsd_config_free(&cfg);
        return rc > 0 ? 0 : 2;
    }
    if (tsd_config_validate(&cfg)) {
        tsd_config_free(&cfg);
        return 2;
    }
    ts_log_set(ts_log_stderr, NULL, ts_log_level_parse(cfg.log_level));
    TS_INFO(FAC, "tesserad %s starting (node %s)", TESSERA_VERSION, cfg.node_id);
    tsd_config_dump(&cfg, log_line, NULL);
    rc = tsd_server_init(&srv, &cfg);
    if (rc) {
        fprintf(stderr, "tesserad: cannot start: %s (%s)\n", ts_strerror(rc), ts_errname(rc));
        tsd_config_free(&cfg);
        return 1;
    }
    rc = tsd_server_run(&srv);
    tsd_server_fini(&srv);
    tsd_config_free(&cfg);
    return rc ? 1 : 0;
}
