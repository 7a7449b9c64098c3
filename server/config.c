/* tesserad settings table, config file (libconfig) and command line. */
#include "config.h"

#include "ts_store.h"

#include "ts_common.h"
#include "ts_proto.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum setting_type { S_STR, S_INT, S_BOOL };

struct setting {
    const char *name; /* path in the config file; flag is --name with '.'/'_' -> '-' */
    enum setting_type type;
    size_t off;
    long min, max;
    const char *def;
    const char *help;
};

#define STR(n, f, d, h)                                                                            \
    {                                                                                              \
        n, S_STR, offsetof(struct tsd_config, f), 0, 0, d, h                                       \
    }
#define INT(n, f, lo, hi, d, h)                                                                    \
    {                                                                                              \
        n, S_INT, offsetof(struct tsd_config, f), lo, hi, d, h                                     \
    }
#define BOOL(n, f, d, h)                                                                           \
    {                                                                                              \
        n, S_BOOL, offsetof(struct tsd_config, f), 0, 1, d, h                                      \
    }

static const struct setting settings[] = {
    STR("node_id", node_id, "", "node identity (default: the host name)"),
    STR("listen", listen, "127.0.0.1:7070",
        "plain TCP address HOST:PORT (\"\" disables; port 0 picks a free one)"),
    STR("tls_listen", tls_listen, "", "TLS 1.3 address HOST:PORT (\"\" disables)"),
    STR("rdma_listen", rdma_listen, "",
        "RDMA (rdma_cm) address HOST:PORT of an RDMA device's interface (\"\" disables; port 0 "
        "picks one); sessions are admitted by tokens from the TCP/TLS listeners"),
    STR("data_dir", data_dir, "./tessera-data", "directory of the chunk store (RocksDB)"),
    STR("log_level", log_level, "info", "error | warn | info | debug"),
    STR("sync", sync, "seal",
        "seal: a shard's file and the WAL are synced before its seal is acknowledged (a put is "
        "acknowledged at its seal); always: also before each chunk's acknowledgement; none: "
        "nothing synced (survives a process crash, not a power loss)"),
    STR("anonymous_role", anonymous_role, "auto",
        "role of clients without a certificate: none | reader | writer | admin, at most reader on "
        "a "
        "cluster node; auto: admin for a single node listening on loopback only, else reader"),
    STR("map_file", map_file, "",
        "cluster map to start with (libconfig; see conf/cluster5.map); a newer one pushed later is "
        "kept in data_dir/cluster.map"),
    STR("etcd", etcd, "",
        "etcd members holding the cluster map (\"https://h:2379,...\"; TLS with tls.cert, "
        "tls.key and tls.ca): the node installs the map etcd holds, follows its changes, and "
        "refuses map pushes from admins (they change it in etcd); \"\": no etcd"),
    STR("etcd_prefix", etcd_prefix, "/tessera/default", "the cluster's key prefix in etcd"),
    STR("metrics_listen", metrics_listen, "",
        "HTTP address HOST:PORT of /metrics (Prometheus), /healthz and /readyz (\"\" disables; "
        "port 0 picks a free one)"),
    BOOL("metrics_tls", metrics_tls, "false",
         "serve metrics_listen over TLS with tls.cert and tls.key (client certificates as "
         "tls.require_client_cert says)"),
    STR("tls.cert", tls_cert, "", "server certificate (PEM)"),
    STR("tls.key", tls_key, "", "server private key (PEM)"),
    STR("tls.ca", tls_ca, "", "CA bundle that client certificates must chain to (PEM)"),
    STR("tls.ciphersuites", tls_ciphersuites,
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
        "TLS 1.3 cipher suites, in preference order"),
    INT("tls.handshake_timeout_s", tls_handshake_timeout_s, 1, 3600, "10",
        "close a TLS connection that has not finished its handshake within this long"),
    BOOL("tls.require_client_cert", tls_require_client_cert, "false",
         "refuse TLS clients without a certificate signed by tls.ca"),
    INT("workers", workers, 1, 64, "2", "worker threads (each with its own event loop)"),
    BOOL("storage.chunk_files", chunk_files, "true",
         "keep each shard's chunk bytes in a file of its own, RocksDB holding the records"),
    INT("storage.inline_max_kb", inline_max_kb, 0, 1024, "0",
        "with chunk files: a shard declared at most this many KiB keeps its bytes in RocksDB "
        "(no file of its own: small writes skip a file's creation and deletion; 0: never)"),
    BOOL("storage.blob_files", blob_files, "true",
         "without chunk files: keep chunk bytes in BlobDB blob files"),
    BOOL("storage.verify_engine_checksums", verify_engine_checksums, "false",
         "also let RocksDB verify its own checksums on chunk reads (CRC32C always guards chunks)"),
    INT("storage.cache_mb", cache_mb, 0, 1 << 20, "1024",
        "cache of verified chunks and shard records, MiB (0: off): hot reads skip RocksDB and the "
        "CRC pass"),
    INT("storage.prefetch_mb", prefetch_mb, 0, 1 << 20, "256",
        "chunks hinted by readers (HINT) queued to be read ahead into the cache, MiB per node "
        "(0: hints are dropped; at most a quarter of the cache)"),
    INT("storage.prefetch_conn_mb", prefetch_conn_mb, 0, 1 << 20, "64",
        "the same per connection: one reader's hints past it are dropped"),
    BOOL("storage.cache_arena", cache_arena, "true",
         "keep cached chunks in a memfd and send them with sendfile() (plain TCP): no copy in the "
         "daemon"),
    INT("storage.scrub_interval_s", scrub_interval_s, 0, 315360000, "604800",
        "scrub every chunk this node holds at least this often (seconds; a week), in the "
        "background at storage.scrub_mb_s; the clock starts at the first start and runs on "
        "from the last whole-node scrub (data_dir/scrub.last); 0: only when asked"),
    INT("storage.scrub_mb_s", scrub_mb_s, 1, 1 << 20, "50",
        "a scheduled scrub reads at most this many MB a second"),
    INT("storage.block_cache_mb", block_cache_mb, 8, 1 << 20, "256", "RocksDB block cache, MiB"),
    INT("storage.reserve_mb", reserve_mb, -1, 1 << 24, "-1",
        "free space kept on the data filesystem: a write beyond it gets TS_ENOSPC (-1: 2 % of the "
        "filesystem, 8 MiB to 1 GiB)"),
    INT("max_connections", max_connections, 1, 100000, "4096",
        "open connections, all listeners together"),
    INT("conn_output_kb", conn_output_kb, 256, 1 << 20, "4096",
        "per-connection output budget: a READ reply is produced only while less than this is "
        "queued"),
    INT("input_budget_mb", input_budget_mb, 128, 1 << 20, "1024",
        "input buffered for large frames (uploads), all connections together, MiB; each "
        "connection may also hold one small frame (64 KiB) outside it"),
    INT("idle_timeout_s", idle_timeout_s, 1, 86400, "300",
        "close a connection that neither sends nor drains for this long"),
    INT("drain_timeout_s", drain_timeout_s, 1, 3600, "10",
        "on SIGTERM, wait this long for in-flight requests before exiting"),
    INT("pg_log_keep", pg_log_keep, 1, 1 << 30, "10000",
        "operation-log records kept per PG (a primary keeps up to 8x more for a replica in "
        "touch that still needs them); a replica further behind is backfilled"),
    INT("peer_timeout_ms", peer_timeout_ms, 100, 600000, "3000",
        "a peer node that owes replies and says nothing this long is unreachable"),
    INT("max_chunk_mb", max_chunk_mb, 1, 64, "64", "largest chunk size a dataset may use, MiB"),
    BOOL("monitor", monitor, "true",
         "with etcd: stand for the cluster's monitor (one, elected through etcd), which marks "
         "nodes down, out and up again by their registrations"),
    INT("monitor.down_after_ms", monitor_down_after_ms, 1000, 3600000, "8000",
        "the monitor marks a node down when its registration has been gone this long"),
    INT("monitor.up_after_ms", monitor_up_after_ms, 0, 3600000, "3000",
        "... and up again once it has been registered again this long"),
    INT("monitor.out_after_ms", monitor_out_after_ms, 1000, 2000000000, "600000",
        "... and out (its data re-replicated elsewhere) when it has been gone this long"),
    INT("monitor.max_down_pct", monitor_max_down_pct, 1, 100, "34",
        "the monitor marks a node down only while at most this share of the nodes is down"),
    INT("monitor.flap_max", monitor_flap_max, 1, 1000, "4",
        "a node whose state the monitor changed this many times within monitor.flap_window_ms "
        "is flapping: it is held down for monitor.damp_ms before it may come up again"),
    INT("monitor.flap_window_ms", monitor_flap_window_ms, 1000, 86400000, "300000",
        "... the window flaps are counted in"),
    INT("monitor.damp_ms", monitor_damp_ms, 0, 86400000, "600000",
        "... and how long a flapping node is held down"),
    INT("etcd_lease_ttl_s", etcd_lease_ttl_s, 2, 300, "5",
        "with etcd: the node's registration (etcd_prefix/nodes/ID, bound to a lease) is kept "
        "alive while the node runs and goes this long after it stops answering"),
};

static char **str_at(struct tsd_config *c, const struct setting *s)
{
    return (char **)((char *)c + s->off);
}

static int *int_at(struct tsd_config *c, const struct setting *s)
{
    return (int *)((char *)c + s->off);
}

static int parse_bool(const char *v, int *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1") || !strcmp(v, "on"))
        *out = 1;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0") || !strcmp(v, "off"))
        *out = 0;
    else
        return TS_ECONFIG;
    return 0;
}

static int set_value(struct tsd_config *c, const struct setting *s, const char *v, const char *from)
{
    char *end;
    long n;
    int b;

    switch (s->type) {
    case S_STR: {
        char *dup = strdup(v);
        if (!dup)
            return TS_ENOMEM;
        free(*str_at(c, s));
        *str_at(c, s) = dup;
        return 0;
    }
    case S_INT:
        errno = 0;
        n = strtol(v, &end, 10);
        if (errno || end == v || *end || n < s->min || n > s->max) {
            fprintf(stderr, "tesserad: %s: %s must be an integer in [%ld, %ld], got '%s'\n", from,
                    s->name, s->min, s->max, v);
            return TS_ECONFIG;
        }
        *int_at(c, s) = (int)n;
        return 0;
    case S_BOOL:
        if (parse_bool(v, &b)) {
            fprintf(stderr, "tesserad: %s: %s must be true or false, got '%s'\n", from, s->name, v);
            return TS_ECONFIG;
        }
        *int_at(c, s) = b;
        return 0;
    }
    return TS_ECONFIG;
}

void tsd_config_defaults(struct tsd_config *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++)
        set_value(c, &settings[i], settings[i].def, "default");
}

void tsd_config_free(struct tsd_config *c)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++)
        if (settings[i].type == S_STR) {
            free(*str_at(c, &settings[i]));
            *str_at(c, &settings[i]) = NULL;
        }
    free(c->config_file);
    c->config_file = NULL;
}

static void flag_name(const char *name, char *out, size_t cap)
{
    size_t i;
    for (i = 0; name[i] && i + 1 < cap; i++)
        out[i] = (name[i] == '.' || name[i] == '_') ? '-' : name[i];
    out[i] = '\0';
}

void tsd_config_usage(FILE *f)
{
    char flag[64];

    fprintf(f, "usage: tesserad [--config FILE] [--FLAG VALUE ...]\n\n"
               "With no arguments: a single-node daemon on 127.0.0.1:7070 with data in "
               "./tessera-data.\n\nFlags (each also a setting of the config file):\n");
    fprintf(f, "  --config FILE\n      read settings from FILE (libconfig syntax; see "
               "conf/tesserad.conf)\n");
    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++) {
        flag_name(settings[i].name, flag, sizeof(flag));
        fprintf(f, "  --%s %s (default: %s)\n      %s\n", flag,
                settings[i].type == S_INT    ? "N"
                : settings[i].type == S_BOOL ? "[true|false]"
                                             : "VALUE",
                settings[i].def[0] ? settings[i].def : "\"\"", settings[i].help);
    }
    fprintf(f, "  --data DIR       alias of --data-dir\n  --version\n  --help\n");
}

static const struct setting *find_setting(const char *name)
{
    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++)
        if (!strcmp(settings[i].name, name))
            return &settings[i];
    return NULL;
}

static const struct setting *find_flag(const char *flag)
{
    char f[64];

    if (!strcmp(flag, "data"))
        return find_setting("data_dir");
    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++) {
        flag_name(settings[i].name, f, sizeof(f));
        if (!strcmp(f, flag))
            return &settings[i];
    }
    return NULL;
}

/* Walks the file's settings; any name not in the table is an error (catches typos). */
static int check_unknown(config_setting_t *group, const char *prefix, const char *file)
{
    int n = config_setting_length(group);

    for (int i = 0; i < n; i++) {
        config_setting_t *e = config_setting_get_elem(group, (unsigned)i);
        const char *nm = config_setting_name(e);
        char path[128];

        snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "", nm ? nm : "?");
        if (config_setting_is_group(e)) {
            if (check_unknown(e, path, file))
                return TS_ECONFIG;
        } else if (!find_setting(path)) {
            fprintf(stderr, "tesserad: %s:%d: unknown setting '%s'\n", file,
                    config_setting_source_line(e), path);
            return TS_ECONFIG;
        }
    }
    return 0;
}

static int load_file(struct tsd_config *c, const char *file)
{
    config_t cf;
    int rc = 0;

    config_init(&cf);
    if (config_read_file(&cf, file) != CONFIG_TRUE) {
        if (config_error_type(&cf) == CONFIG_ERR_FILE_IO)
            fprintf(stderr, "tesserad: cannot read config file %s: %s\n", file, strerror(errno));
        else
            fprintf(stderr, "tesserad: %s:%d: %s\n", file, config_error_line(&cf),
                    config_error_text(&cf));
        rc = TS_ECONFIG;
        goto out;
    }
    rc = check_unknown(config_root_setting(&cf), "", file);
    for (size_t i = 0; rc == 0 && i < TS_ARRAY_SIZE(settings); i++) {
        const struct setting *s = &settings[i];
        config_setting_t *e = config_lookup(&cf, s->name);
        char buf[64];

        if (!e)
            continue;
        if (s->type == S_STR && config_setting_type(e) == CONFIG_TYPE_STRING) {
            rc = set_value(c, s, config_setting_get_string(e), file);
        } else if (s->type == S_INT && (config_setting_type(e) == CONFIG_TYPE_INT ||
                                        config_setting_type(e) == CONFIG_TYPE_INT64)) {
            snprintf(buf, sizeof(buf), "%lld", config_setting_get_int64(e));
            rc = set_value(c, s, buf, file);
        } else if (s->type == S_BOOL && config_setting_type(e) == CONFIG_TYPE_BOOL) {
            rc = set_value(c, s, config_setting_get_bool(e) ? "true" : "false", file);
        } else {
            fprintf(stderr, "tesserad: %s:%d: %s has the wrong type (want %s)\n", file,
                    config_setting_source_line(e), s->name,
                    s->type == S_STR   ? "a string"
                    : s->type == S_INT ? "an integer"
                                       : "true/false");
            rc = TS_ECONFIG;
        }
    }
out:
    config_destroy(&cf);
    return rc;
}

int tsd_config_load(struct tsd_config *c, int argc, char **argv)
{
    int rc;

    /* The config file first, so that flags override it wherever they appear. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tesserad: --config needs a file\n");
                return TS_ECONFIG;
            }
            free(c->config_file);
            c->config_file = strdup(argv[i + 1]);
            rc = load_file(c, argv[i + 1]);
            if (rc)
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct setting *s;
        char flag[64];
        const char *eq, *val;

        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tsd_config_usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--version")) {
            printf("tesserad %s (protocol %d)\n", TESSERA_VERSION, TS_PROTO_VERSION);
            return 1;
        }
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "tesserad: unexpected argument '%s' (see --help)\n", a);
            return TS_ECONFIG;
        }
        eq = strchr(a + 2, '=');
        snprintf(flag, sizeof(flag), "%.*s", eq ? (int)(eq - a - 2) : (int)strlen(a + 2), a + 2);
        s = find_flag(flag);
        if (!s) {
            fprintf(stderr, "tesserad: unknown flag '--%s' (see --help)\n", flag);
            return TS_ECONFIG;
        }
        if (eq) {
            val = eq + 1;
        } else if (s->type == S_BOOL) {
            int b;
            /* "--flag" alone means true; "--flag false" takes the next word if it is a bool. */
            if (i + 1 < argc && parse_bool(argv[i + 1], &b) == 0)
                val = argv[++i];
            else
                val = "true";
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "tesserad: --%s needs a value\n", flag);
                return TS_ECONFIG;
            }
            val = argv[++i];
        }
        rc = set_value(c, s, val, "command line");
        if (rc)
            return rc;
    }
    if (!c->node_id[0]) {
        char host[256] = "node";
        gethostname(host, sizeof(host) - 1);
        free(c->node_id);
        c->node_id = strdup(host);
    }
    return 0;
}

static int file_readable(const char *what, const char *path)
{
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "tesserad: %s '%s' is not readable: %s\n", what, path, strerror(errno));
        return 0;
    }
    return 1;
}

static int is_loopback(const char *addr)
{
    return !strncmp(addr, "127.", 4) || !strncmp(addr, "[::1]", 5) ||
           !strncmp(addr, "localhost:", 10);
}

int tsd_config_anon_role(const struct tsd_config *c)
{
    if (strcmp(c->anonymous_role, "auto"))
        return ts_role_parse(c->anonymous_role);
    /* The embedded quickstart (one node on loopback) keeps the convenient default. */
    return !c->map_file[0] && (!c->listen[0] || is_loopback(c->listen)) ? TS_ROLE_ADMIN
                                                                        : TS_ROLE_READER;
}

int tsd_config_validate(const struct tsd_config *c)
{
    if (!ts_name_valid(c->node_id) || strlen(c->node_id) > 63) {
        fprintf(stderr, "tesserad: node_id '%s' must be 1-63 of [A-Za-z0-9._-]\n", c->node_id);
        return TS_ECONFIG;
    }
    if (strcmp(c->anonymous_role, "auto") && (ts_role_parse(c->anonymous_role) < 0 ||
                                              ts_role_parse(c->anonymous_role) > TS_ROLE_ADMIN)) {
        fprintf(stderr, "tesserad: anonymous_role must be auto, none, reader, writer or admin\n");
        return TS_ECONFIG;
    }
    if (c->map_file[0] && tsd_config_anon_role(c) > TS_ROLE_READER) {
        fprintf(stderr,
                "tesserad: anonymous_role '%s' refused on a cluster node (map_file is set): "
                "clients without a certificate may at most read; writers and admins present "
                "a certificate over tls_listen\n",
                c->anonymous_role);
        return TS_ECONFIG;
    }
    if (c->listen[0] && !is_loopback(c->listen) && tsd_config_anon_role(c) >= TS_ROLE_WRITER)
        fprintf(stderr,
                "tesserad: warning: %s is reachable beyond this host and clients without a "
                "certificate get role '%s' (anonymous_role): anyone who can connect may write%s\n",
                c->listen, ts_role_name(tsd_config_anon_role(c)),
                tsd_config_anon_role(c) == TS_ROLE_ADMIN ? " and delete" : "");
    if (c->metrics_tls && (!c->tls_listen[0] || !c->metrics_listen[0])) {
        fprintf(stderr, "tesserad: metrics_tls needs metrics_listen and the node's TLS "
                        "(tls_listen, tls.cert, tls.key)\n");
        return TS_ECONFIG;
    }
    if (ts_log_level_parse(c->log_level) < 0) {
        fprintf(stderr, "tesserad: log_level must be error, warn, info or debug\n");
        return TS_ECONFIG;
    }
    if (ts_store_sync_parse(c->sync) < 0) {
        fprintf(stderr, "tesserad: sync must be 'seal', 'always' or 'none'\n");
        return TS_ECONFIG;
    }
    if (!c->listen[0] && !c->tls_listen[0]) {
        fprintf(stderr, "tesserad: nothing to serve: both listen and tls_listen are empty\n");
        return TS_ECONFIG;
    }
    if (c->tls_listen[0]) {
        if (!c->tls_cert[0] || !c->tls_key[0]) {
            fprintf(stderr, "tesserad: tls_listen needs tls.cert and tls.key\n");
            return TS_ECONFIG;
        }
        if (!file_readable("tls.cert", c->tls_cert) || !file_readable("tls.key", c->tls_key))
            return TS_ECONFIG;
        if (c->tls_ca[0] && !file_readable("tls.ca", c->tls_ca))
            return TS_ECONFIG;
    }
    if (c->tls_require_client_cert) {
        if (!c->tls_ca[0]) {
            fprintf(stderr, "tesserad: tls.require_client_cert needs tls.ca\n");
            return TS_ECONFIG;
        }
        if (c->listen[0] && tsd_config_anon_role(c) != TS_ROLE_NONE) {
            fprintf(stderr,
                    "tesserad: tls.require_client_cert is set but the plain listener %s would "
                    "admit unauthenticated clients as '%s': set anonymous_role = \"none\" or "
                    "listen = \"\"\n",
                    c->listen, c->anonymous_role);
            return TS_ECONFIG;
        }
    }
    return 0;
}

void tsd_config_dump(const struct tsd_config *c, void (*emit)(void *arg, const char *line),
                     void *arg)
{
    char line[512];

    for (size_t i = 0; i < TS_ARRAY_SIZE(settings); i++) {
        const struct setting *s = &settings[i];
        if (s->type == S_STR)
            snprintf(line, sizeof(line), "%s = \"%s\"", s->name,
                     *str_at((struct tsd_config *)c, s));
        else if (s->type == S_INT)
            snprintf(line, sizeof(line), "%s = %d", s->name, *int_at((struct tsd_config *)c, s));
        else
            snprintf(line, sizeof(line), "%s = %s", s->name,
                     *int_at((struct tsd_config *)c, s) ? "true" : "false");
        emit(arg, line);
    }
}
