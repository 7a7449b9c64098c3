/* tesserad: the tessera storage daemon. */
#include "server_internal.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

static void log_line(void *arg, const char *line)
{
    TS_DEBUG(FAC, "config: %s", line);
}

/*
 * Connections and RocksDB share the descriptor limit: raise the soft limit to the hard one
 * and keep max_connections within what is left after RocksDB's budget and a margin.
 */
static void fit_descriptors(struct tsd_config *cfg)
{
    struct rlimit rl;
    long avail;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    cfg->max_open_files = (int)TS_MIN((rlim_t)4096, rl.rlim_cur / 4);
    avail = (long)rl.rlim_cur - cfg->max_open_files - 128;
    if (avail < 16)
        avail = 16;
    if (cfg->max_connections > avail) {
        TS_WARN(FAC, 0,
                "max_connections %d exceeds what %llu file descriptors allow next to RocksDB's "
                "%d: using %ld",
                cfg->max_connections, (unsigned long long)rl.rlim_cur, cfg->max_open_files, avail);
        cfg->max_connections = (int)avail;
    }
}

/*
 * Keep freed frame buffers in the heap. A TLS connection gathers each frame (up to
 * max_chunk_mb, 64 MiB, plus its header) from 16 KiB records and evbuffer_pullup copies it into
 * one buffer, so every chunk allocates and frees about twice its size. By default glibc maps
 * such buffers on their own or trims them off the arena's top once freed, and the next chunk
 * faults and zeroes fresh pages (11-23 % of a node's CPU in a replicated put). 32 MiB is the
 * largest mmap threshold glibc accepts (larger chunks still get their own mapping); a 64 MiB
 * trim threshold covers both copies of a 32 MiB frame and bounds what each arena keeps free at
 * its top (8 MiB lost the gain at 16 MiB chunks, 256 MiB gained nothing; docs/benchmarks.md).
 */
static void keep_frame_buffers(void)
{
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, 64 << 20))
        /* Another allocator (a sanitizer's, a preloaded one): it keeps its own ways. */
        TS_INFO(FAC, "the allocator takes no mallopt thresholds: freed frame buffers are its "
                     "to keep or return");
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
    keep_frame_buffers();
    fit_descriptors(&cfg);
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
